"""Reverb's client as its users call it, through the compat ReverbNode and `ReplayClient`:
`info()`'s num_unique_samples, a sample that says whether it is a stacked batch or a list of
items, and clients that refuse to pickle with a sentence saying what to pass instead."""

from __future__ import annotations

import pickle
import unittest

import numpy as np

import jaxdist as jd
import jaxdist.compat.launchpad as lp
from jaxdist.nodes.replay.client import sample_many

TABLE_NAME = "table"
QUEUE_NAME = "queue"


def _tables() -> dict:
    return {TABLE_NAME: jd.replay.Uniform(1000), QUEUE_NAME: jd.replay.Table.queue(10)}


class ReverbClientTest(unittest.TestCase):

    def setUp(self):
        super().setUp()
        program = lp.Program("reverb")
        self.handle = program.add_node(lp.ReverbNode(_tables), label="replay")
        lp.launch(program, launch_type=lp.LaunchType.TEST_MULTI_THREADING, test_case=self)
        self.client = jd.replay.ReplayClient(self.handle.dereference())

    def test_server_info_counts_unique_samples(self):
        for _ in range(3):
            self.client.insert(np.int64(0), table=TABLE_NAME)
        self.client.sample(1, table=TABLE_NAME)
        table = self.client.info(TABLE_NAME)
        self.assertEqual(table["current_size"], 3)
        self.assertEqual(table["num_unique_samples"], 1)
        self.assertEqual(table["max_size"], 1000)
        self.assertEqual(self.client.info(QUEUE_NAME)["num_unique_samples"], 0)
        self.client.reset(TABLE_NAME)
        self.assertEqual(self.client.info(TABLE_NAME)["num_unique_samples"], 0)

    def test_a_sample_says_whether_it_is_stacked(self):
        self.client.insert([np.zeros(2), np.ones(2)], table=QUEUE_NAME)
        self.client.insert([np.zeros(2), np.ones(2)], table=QUEUE_NAME)
        batch = self.client.sample(2, table=QUEUE_NAME)
        self.assertTrue(batch["stacked"])  # list-shaped items, stacked: two leaves of (2, 2)
        self.assertEqual([leaf.shape for leaf in batch["data"]], [(2, 2), (2, 2)])
        self.client.insert([np.zeros(2), np.ones(2)], table=QUEUE_NAME)
        self.client.insert({"obs": np.zeros(3)}, table=QUEUE_NAME)
        batch = self.client.sample(2, table=QUEUE_NAME)
        self.assertFalse(batch["stacked"])  # two structures: a list of the two items
        self.assertEqual(batch["data"][0][1].shape, (2,))
        self.assertEqual(batch["data"][1]["obs"].shape, (3,))

    def test_clients_refuse_to_pickle_and_say_what_to_pass(self):
        with self.assertRaisesRegex(TypeError, "does not pickle.*pass the node's handle"):
            pickle.dumps(self.handle.dereference())
        with self.assertRaisesRegex(TypeError, "does not pickle.*pass the replay node's handle"):
            pickle.dumps(self.client)
        self.assertEqual(pickle.loads(pickle.dumps(self.handle)).node_name, "replay/0")  # handles travel


class TableTest(unittest.TestCase):

    def test_num_unique_samples_counts_items_once_and_survives_a_snapshot(self):
        table = jd.replay.Uniform(100, seed=0)
        for i in range(4):
            table.insert(np.float32(i))
        table.sample(50)  # with replacement: every item drawn, most of them many times
        self.assertEqual(table.info()["num_unique_samples"], 4)
        table.sample(8, info=True)  # the ranked path counts no item twice either
        self.assertEqual(table.info()["num_unique_samples"], 4)
        table.insert(np.float32(4))
        restored = jd.replay.Uniform(100)
        restored.load_state(table.state())
        self.assertEqual(restored.info()["num_unique_samples"], 4)

    def test_sample_many_lists_the_items_when_a_share_is_a_list(self):
        program = lp.Program("shards")
        with program.group("replay"):
            handles = [program.add_node(lp.ReverbNode(_tables)) for _ in range(2)]
        lp.launch(program, launch_type="test_mt", test_case=self)
        first, second = (jd.replay.ReplayClient(handle.dereference()) for handle in handles)
        for _ in range(2):
            first.insert({"obs": np.zeros(3)}, table=QUEUE_NAME)
        second.insert([np.ones(2)], table=QUEUE_NAME)
        batch = sample_many([first, second], 3, table=QUEUE_NAME)  # shares of 2 and 1, each stacked
        self.assertFalse(batch["stacked"])  # but of two structures: a list of the three items
        self.assertEqual([type(item) for item in batch["data"]], [dict, dict, list])
        self.assertEqual(batch["data"][0]["obs"].shape, (3,))
        self.assertEqual(batch["data"][2][0].shape, (2,))
        first.insert({"obs": np.ones(3)}, table=QUEUE_NAME)
        second.insert({"obs": np.ones(3)}, table=QUEUE_NAME)
        batch = sample_many([first, second], 2, table=QUEUE_NAME)
        self.assertTrue(batch["stacked"])
        self.assertEqual(batch["data"]["obs"].shape, (2, 3))
