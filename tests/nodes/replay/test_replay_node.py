"""ReplayNode over real RPC: concurrent writers, thread-pool safety, several nodes, checkpoints."""

from __future__ import annotations

import contextlib
import os
import pickle
import signal
import threading
import time

import ml_dtypes
import numpy as np
import pytest

import jaxdist as jd
import replay_nodes as rn
from waiting import run_threads, wait_until
from jaxdist import courier
from jaxdist.nodes.replay import (Fifo, MinSize, Prioritized, ReplayClient, ReplayNode, SampleToInsertRatio,
                                  SampleTimeoutError, Uniform, sample_many, try_again_kind, update_priorities_many)
from jaxdist.learning.layout import checkpoint_dir
from jaxdist.nodes.replay.checkpointing import TableCheckpointer, from_checkpoint, to_checkpoint
from jaxdist.nodes.replay.client import MAX_SERVER_WAIT


@contextlib.contextmanager
def launched(program: jd.Program, run_dir, launcher: str = "threads"):
    running = jd.launch(program, launcher=launcher, run_dir=str(run_dir), echo=False)
    try:
        yield running
    finally:
        running.stop()


def courier_client(running, node_name: str = "replay/0") -> courier.Client:
    return courier.Client(running.addresses[node_name], token=running.token)


def restore_latest(run_dir, node_name: str, tables: dict) -> int | None:
    checkpointer = TableCheckpointer(checkpoint_dir(run_dir, node_name))
    try:
        return checkpointer.restore(tables)
    finally:
        checkpointer.close()


# --- Many writers through the node ----------------------------------------------------------------

def test_concurrent_writers_over_rpc_lose_nothing_and_a_fifo_delivers_each_item_once(tmp_path):
    tables = {"fifo": lambda: Fifo(16), "uniform": lambda: Uniform(40, seed=0),
              "prio": lambda: Prioritized(1000, seed=0)}
    program = jd.Program("writers")
    handle = program.add_node(ReplayNode({name: make() for name, make in tables.items()}, checkpoint=True,
                                         thread_pool_size=8, max_wait=0.2))
    writers, per_writer = 4, 24
    acked: dict[str, dict[int, tuple]] = {name: {} for name in tables}  # key -> [writer, seq] it was given for
    sampled_fifo: list[tuple[int, tuple]] = []
    last_priority: dict[int, float] = {}
    lock = threading.Lock()
    writing = threading.Event()
    writing.set()

    with launched(program, tmp_path) as running:
        replay = ReplayClient(courier_client(running, handle.node_name))

        def writer(w: int) -> None:
            seq = 0
            while seq < per_writer:
                for name in tables:  # singles and batches of 3, interleaved over the tables
                    batch = [rn.chunk(w, s) for s in range(seq, seq + (1 if seq % 2 == 0 else 3))]
                    if len(batch) == 1:
                        keys = [replay.insert(batch[0], table=name, timeout=20)]
                    else:
                        keys = replay.insert_many(batch, table=name, timeout=20)
                    with lock:
                        acked[name].update({k: (w, s) for k, s in zip(keys, range(seq, seq + len(batch)))})
                seq += len(batch)

        def drain_fifo() -> None:
            # The writers fill the queue and wait before anything is taken out.
            wait_until(lambda: replay.stats()["fifo"]["insert_waits"] > 0, "a writer to wait for room")
            while writing.is_set() or replay.size("fifo"):
                try:
                    batch = replay.sample(4, table="fifo", timeout=0.5)
                except TimeoutError:
                    continue
                sampled_fifo.extend(zip(batch["keys"].tolist(), rn.ids(batch["data"])))

        def reprioritize() -> None:
            while writing.is_set():
                batch = replay.sample(8, table="prio", timeout=10)
                priorities = (batch["keys"] % 5 + 1).astype(np.float64)
                replay.update_priorities(batch["keys"], priorities, table="prio")
                last_priority.update(zip(batch["keys"].tolist(), priorities.tolist()))

        def writers_then_stop() -> None:
            try:
                run_threads(*[lambda w=w: writer(w) for w in range(writers)], join_timeout=30)
            finally:
                writing.clear()

        run_threads(writers_then_stop, drain_fifo, reprioritize, join_timeout=60)
        step = replay.checkpoint()
        stats = replay.stats()

    total = writers * per_writer
    for name in tables:
        assert sorted(acked[name]) == list(range(total)), name  # consecutive keys, none handed out twice
        assert stats[name]["inserts"] == total
    # Fifo: every acknowledged item was delivered exactly once, with the key it was acknowledged under.
    assert len(sampled_fifo) == total and dict(sampled_fifo) == acked["fifo"]
    assert stats["fifo"]["insert_waits"] > 0  # writers really were held back by the full queue
    # The others: what the node holds after shutdown is exactly what it acknowledged, minus evictions.
    restored = {name: make() for name, make in tables.items()}
    assert restore_latest(tmp_path, handle.node_name, restored) == step + 1  # shutdown saved once more
    assert restored["fifo"].size() == 0
    uniform = restored["uniform"].state()
    assert uniform["keys"].tolist() == list(range(total - 40, total))
    assert rn.ids(uniform["groups"][0]["items"]) == [acked["uniform"][k] for k in range(total - 40, total)]
    prio = restored["prio"].state()
    assert rn.ids(prio["groups"][0]["items"]) == [acked["prio"][k] for k in range(total)]
    assert isinstance(prio["groups"][0]["items"]["step"], rn.Step)
    for key, priority in last_priority.items():
        assert prio["priorities"][key] == priority


# --- Thread-pool safety ------------------------------------------------------------------------

def test_many_blocked_samplers_never_take_the_threads_that_inserts_need(tmp_path):
    program = jd.Program("starvation")
    handle = program.add_node(ReplayNode({"fifo": Fifo(64), "uniform": Uniform(64, rate_limiter=MinSize(20))},
                                         thread_pool_size=4, max_waiting=2, max_wait=MAX_SERVER_WAIT))
    fifo_samplers, uniform_samplers = 16, 8  # 24 blocked callers for 4 server threads
    got: list[tuple] = []
    uniform_batches: list[int] = []
    with launched(program, tmp_path) as running:
        replay = ReplayClient(courier_client(running, handle.node_name))

        def fifo_sampler() -> None:
            got.extend(rn.ids(replay.sample(1, table="fifo", timeout=30)["data"]))

        def uniform_sampler() -> None:
            uniform_batches.append(len(replay.sample(2, table="uniform", timeout=30)["keys"]))

        samplers = [threading.Thread(target=fifo_sampler, daemon=True) for _ in range(fifo_samplers)]
        samplers += [threading.Thread(target=uniform_sampler, daemon=True) for _ in range(uniform_samplers)]
        for thread in samplers:
            thread.start()
        # Both waiting places taken, and callers of both tables told to come back.
        wait_until(lambda: all(t["busy_answers"] > 0 for t in replay.stats().values()), "the samplers to block")
        latencies = []
        for seq in range(20):
            for table in (["fifo", "uniform"] if seq < fifo_samplers else ["uniform"]):
                start = time.monotonic()
                replay.insert(rn.chunk(0, seq), table=table, timeout=10)
                latencies.append(time.monotonic() - start)
        for thread in samplers:
            thread.join(20)
        assert not any(thread.is_alive() for thread in samplers)
        stats = replay.stats()
    # An insert that had to wait for a server thread would wait out a sampler's whole slice.
    assert max(latencies) < MAX_SERVER_WAIT / 2, sorted(latencies)[-5:]
    assert sorted(got) == [(0, seq) for seq in range(fifo_samplers)]  # each sampler one item, none twice
    assert uniform_batches == [2] * uniform_samplers
    assert stats["fifo"]["busy_answers"] > 0 and stats["uniform"]["busy_answers"] > 0


def test_the_node_answers_try_again_within_a_slice_and_helpers_wait_the_full_timeout(tmp_path):
    program = jd.Program("answers")
    handle = program.add_node(ReplayNode(Fifo(4), max_wait=0.3))
    with launched(program, tmp_path) as running:
        raw = courier_client(running, handle.node_name)
        start = time.monotonic()
        with pytest.raises(TimeoutError) as answer:
            raw.sample(2)  # timeout=None: one slice in the node, then "try again"
        assert try_again_kind(answer.value) == "not_ready" and time.monotonic() - start >= 0.3
        with pytest.raises(TimeoutError, match="Fifo holds 0 of the 2 items") as final:
            raw.sample(2, timeout=0.1)  # within one slice: the node's answer is final
        assert try_again_kind(final.value) is None

        replay = ReplayClient(raw)
        start = time.monotonic()
        with pytest.raises(TimeoutError, match=r"sample on replay node .* gave up after 1.0 s: Fifo holds 0 of the 2"):
            replay.sample(2, timeout=1.0)
        assert time.monotonic() - start >= 1.0
        asked = raw.stats()["default"]["not_ready_answers"]
        waiting = replay.futures.sample(2, timeout=60)
        wait_until(lambda: raw.stats()["default"]["not_ready_answers"] >= asked + 2, "two slices of the sample")
        raw.insert_many([rn.chunk(0, 0), rn.chunk(0, 1)])
        assert rn.ids(waiting.result(30)["data"]) == [(0, 0), (0, 1)]  # waited over several slices

        assert replay.futures.insert_many([rn.chunk(1, i) for i in range(4)]).result(10) == [2, 3, 4, 5]
        late = replay.futures.insert(rn.chunk(1, 4), timeout=60)  # the queue is full: waits for a sampler
        wait_until(lambda: raw.stats()["default"]["insert_waits"] > 0, "the insert to wait in the node")
        assert not late.done()
        replay.sample(1)
        assert late.result(10) == 6

        with pytest.raises(KeyError, match="nope.* in this replay node; its tables: default"):
            replay.size("nope")
        replay.update_priorities([0], [1.0])  # every table keeps priorities, as in Reverb; a gone key is skipped
        assert raw.stats()["default"]["stale_priority_updates"] == 1
        with pytest.raises(RuntimeError, match="does not checkpoint"):
            replay.checkpoint()
        with pytest.raises(ValueError, match="exceeds Fifo"):
            replay.insert_many([rn.chunk(0, i) for i in range(5)])
        replay.close()


def test_can_insert_waits_for_room_within_a_slice_answers_at_once_without_a_waiting_place_and_holds_room(tmp_path):
    program = jd.Program("room")
    handle = program.add_node(ReplayNode(Fifo(4), max_wait=2.0, thread_pool_size=4, max_waiting=1))
    with launched(program, tmp_path) as running:
        replay = ReplayClient(courier_client(running, handle.node_name))
        replay.insert_many([rn.chunk(0, i) for i in range(3)])
        assert replay.can_insert(1, wait=5.0) and not replay.can_insert(2)
        start = time.monotonic()
        assert not replay.can_insert(2, wait=5.0)  # no sampler comes: one slice (2 s), then no
        assert 2.0 <= time.monotonic() - start < 4.5
        waiting = courier_client(running, handle.node_name).futures.can_insert(4, wait=5.0)
        wait_until(lambda: replay.stats()["default"]["room_waits"] == 2, "the query to wait in the node")
        start = time.monotonic()
        assert not replay.can_insert(4, wait=5.0)  # its waiting place is taken: answered at once
        assert time.monotonic() - start < 4.0  # not the 5 s wait
        assert rn.ids(replay.sample(3)["data"]) == [(0, 0), (0, 1), (0, 2)]
        assert waiting.result(10) is True  # the queue emptied while it waited
        assert replay.can_insert(3, hold=30.0) and not replay.can_insert(2)  # held for the asker's insert
        assert replay.info()["held_room"] == 3
        replay.insert_many([rn.chunk(1, i) for i in range(3)])
        assert replay.info()["held_room"] == 0 and replay.can_insert(1)
        with pytest.raises(ValueError, match="wait must be a finite number of seconds"):
            Fifo(2).can_insert(1, wait=-1.0)
        with pytest.raises(ValueError, match="hold must be at most 60.0 s"):
            replay.can_insert(1, hold=3600.0)
        replay.close()


# --- Several nodes -------------------------------------------------------------------------------

class ShuttingDownNode:
    """A replay node as it shuts down: every insert and sample meets its closed table."""

    def insert_batch(self, batch, priorities=None, table="default", timeout=None):
        self._closed_table()

    def sample(self, batch_size, table="default", timeout=None, info=False):
        self._closed_table()

    @staticmethod
    def _closed_table():
        closed = Fifo(4)
        closed.close()
        closed.insert_batch({"reward": np.zeros(1)})  # the table's own TableClosedError


def test_a_node_shutting_down_is_away_to_its_clients_a_connection_error():
    """Actors ride out a ConnectionError as an outage; a closed table was a RemoteError, which
    lost the trajectory, at the end of every agent run (the learner's process stops first)."""
    server = courier.Server(ShuttingDownNode()).start()
    replay = ReplayClient(courier.Client(server.address, timeout=10))
    try:
        with pytest.raises(ConnectionError, match="insert_batch on .*: the replay node is shutting down"):
            replay.insert_batch({"reward": np.zeros(2)})
        with pytest.raises(ConnectionError, match="sample on .*: the replay node is shutting down"):
            replay.futures.sample(1).result()
    finally:
        server.stop(grace=0)


def test_sample_many_splits_one_batch_over_nodes_and_priorities_go_home(tmp_path):
    program = jd.Program("mempool")
    with program.group("replay"):
        handles = [program.add_node(ReplayNode(Prioritized(16, priority_exponent=1.0, seed=i))) for i in range(3)]
    with launched(program, tmp_path) as running:
        clients = [ReplayClient(courier_client(running, h.node_name)) for h in handles]
        for node, client in enumerate(clients):
            client.insert_many([rn.chunk(node, seq) for seq in range(4)], priorities=[1.0] * 4)
        batch = sample_many(clients, 10, timeout=10)
        assert batch["keys"].shape == (10, 2) and batch["keys"].dtype == np.int64
        assert batch["keys"][:, 0].tolist() == [0] * 4 + [1] * 3 + [2] * 3  # shares 4, 3, 3 in node order
        assert [writer for writer, _ in rn.ids(batch["data"])] == batch["keys"][:, 0].tolist()
        assert isinstance(batch["data"]["step"], rn.Step) and batch["data"]["step"].obs.shape == (10, 2, 3)
        np.testing.assert_allclose(batch["probabilities"], [0.4 / 4] * 4 + [0.3 / 4] * 6)

        # Only the key 2 of each node keeps a priority: every later draw must be that item.
        keys = np.array([[node, key] for node in range(3) for key in range(4)])
        update_priorities_many(clients, keys, [1.0 if key == 2 else 0.0 for _, key in keys])
        again = sample_many(clients, 9, timeout=10)
        assert rn.ids(again["data"]) == [(node, 2) for node in range(3) for _ in range(3)]

    program = jd.Program("mempool-fifo")
    with program.group("replay"):
        handles = [program.add_node(ReplayNode(Fifo(8), max_wait=0.2)) for _ in range(2)]
    with launched(program, tmp_path) as running:
        clients = [ReplayClient(courier_client(running, h.node_name)) for h in handles]
        clients[0].insert_many([rn.chunk(0, seq) for seq in range(3)])
        with pytest.raises(SampleTimeoutError) as failure:
            sample_many(clients, 6, timeout=0.6)  # node 1 never gets its 3
        assert rn.ids(failure.value.partial["data"]) == [(0, 0), (0, 1), (0, 2)]  # what was taken is handed back
        assert failure.value.partial["probabilities"] is None


# --- Checkpoints ---------------------------------------------------------------------------------

def test_replay_contents_survive_sigkill_after_a_checkpoint_and_a_restart(tmp_path):
    # No supervisor restart here: this test relaunches by hand (test_supervisor covers restarts).
    running = jd.launch(rn.restart_program(), launcher="processes", run_dir=str(tmp_path), echo=False,
                        restart={"replay": jd.Restart(max_restarts=0)})
    try:
        replay = ReplayClient(courier_client(running))
        assert replay.insert_many([rn.chunk(0, seq) for seq in range(10)], table="queue") == list(range(10))
        assert rn.ids(replay.sample(3, table="queue")["data"]) == [(0, 0), (0, 1), (0, 2)]
        prio_keys = replay.insert_many([rn.chunk(1, seq) for seq in range(5)], priorities=[1, 2, 3, 4, 5],
                                       table="prio")
        replay.update_priorities(prio_keys[:1], [0.0], table="prio")
        for first in (0, 6):
            replay.insert_many([rn.chunk(2, seq) for seq in range(first, first + 6)], table="recent")  # evicts 4
        step = replay.checkpoint()
        replay.insert_many([rn.chunk(0, seq) for seq in range(10, 14)], table="queue")  # after the checkpoint
        os.kill(running.status()["replay/0"]["pid"], signal.SIGKILL)
        with pytest.raises(jd.NodeFailedError, match="replay/0"):
            running.wait(timeout=30)
    finally:
        running.stop()

    with launched(rn.restart_program(), tmp_path, launcher="processes") as running:
        replay = ReplayClient(courier_client(running))
        assert [replay.size(t) for t in ("queue", "prio", "recent")] == [7, 5, 8]
        batch = replay.sample(7, table="queue", timeout=5)
        assert batch["keys"].tolist() == list(range(3, 10))
        assert rn.ids(batch["data"]) == [(0, seq) for seq in range(3, 10)]
        assert isinstance(batch["data"]["step"], rn.Step)
        np.testing.assert_array_equal(batch["data"]["step"].obs[0], np.full((2, 3), 3, np.float32))
        assert replay.insert(rn.chunk(0, 99), table="queue") == 10  # keys go on from the checkpoint
        drawn = replay.sample(100, table="prio")
        assert 0 not in drawn["keys"]  # its priority 0 survived
        np.testing.assert_allclose(drawn["probabilities"], (drawn["keys"] + 1) / 14.0)  # p = priority / (2+3+4+5)
        recent = replay.sample(50, table="recent")
        assert set(rn.ids(recent["data"])) <= {(2, seq) for seq in range(4, 12)}
        assert replay.stats()["prio"]["inserts"] == 5
    assert TableCheckpointer(checkpoint_dir(tmp_path, "replay/0")).latest_step() == step + 1  # saved at stop


def test_checkpoint_intervals_save_in_the_background(tmp_path):
    program = jd.Program("intervals")
    handle = program.add_node(ReplayNode(Uniform(100), checkpoint_every_inserts=5))
    directory = checkpoint_dir(tmp_path, handle.node_name)
    with launched(program, tmp_path) as running:
        replay = ReplayClient(courier_client(running, handle.node_name))
        for steps in (1, 2):
            replay.insert_many([rn.chunk(0, seq) for seq in range(5)])
            wait_until(lambda: os.path.isdir(directory) and len([d for d in os.listdir(directory) if d.isdigit()]) >= steps,
                       f"checkpoint {steps} with checkpoint_every_inserts=5")
        replay.insert(rn.chunk(0, 5))
    table = Uniform(100)
    assert restore_latest(tmp_path, handle.node_name, {"default": table}) == 3  # and one at shutdown
    assert table.size() == 11


def test_checkpoint_round_trip_keeps_structure_dtypes_and_empty_tables(tmp_path):
    odd = {"bf": np.ones((2,), ml_dtypes.bfloat16), "empty": np.zeros((0, 3), np.int8),
           "pair": (np.int32(1), [np.float64(2.0)]), "step": rn.Step(np.zeros(3, np.float32), np.ones(1, np.float32))}
    tables = {"drained": Fifo(4), "fresh": Uniform(4), "odd": Prioritized(4, seed=5), "a.b/c": Fifo(2)}
    tables["drained"].insert(odd)
    tables["drained"].sample(1)
    for seq in range(6):
        tables["odd"].insert(odd, priority=seq + 1.0)
    tables["odd"].sample(3)
    checkpointer = TableCheckpointer(tmp_path / "ck")
    assert checkpointer.save(tables) == 1 and checkpointer.save(tables) == 2
    checkpointer.close()
    restored = {name: type(table)(*table.spec.args, **table.spec.kwargs) for name, table in tables.items()}
    assert restore_latest(tmp_path / "ck", "", restored) is None  # a directory without checkpoints
    checkpointer = TableCheckpointer(tmp_path / "ck")
    assert checkpointer.restore(restored) == 2
    checkpointer.close()
    for name in tables:
        assert restored[name].stats() == tables[name].stats(), name
    item = restored["odd"].state()["groups"][0]["items"]
    assert item["bf"].dtype == ml_dtypes.bfloat16 and item["empty"].shape == (4, 0, 3)
    assert isinstance(item["pair"], tuple) and isinstance(item["pair"][1], list) and isinstance(item["step"], rn.Step)
    a, b = tables["odd"].sample(5), restored["odd"].sample(5)  # the RNG and priorities came back too
    np.testing.assert_array_equal(a.keys, b.keys)
    np.testing.assert_array_equal(a.probabilities, b.probabilities)
    assert restored["drained"].insert(odd) == tables["drained"].insert(odd) == 1  # keys go on: none reused
    arrays, meta = to_checkpoint({"t": Fifo(2).state()}, {"t": "Fifo"})
    assert from_checkpoint(arrays, meta)[0]["t"]["groups"] == []


def test_a_changed_table_kind_is_refused_at_restore(tmp_path):
    checkpointer = TableCheckpointer(tmp_path)
    table = Fifo(4)
    table.insert(rn.chunk(0, 0))
    checkpointer.save({"default": table})
    with pytest.raises(ValueError, match="holds table 'default' as a Fifo, but the node now builds a Uniform"):
        checkpointer.restore({"default": Uniform(4)})
    checkpointer.close()


# --- Building nodes and tables --------------------------------------------------------------------

def test_fresh_tables_travel_as_their_arguments_and_used_ones_refuse():
    limiter = SampleToInsertRatio(2.0, 4, 10.0)
    table = pickle.loads(pickle.dumps(Prioritized(8, 0.5, rate_limiter=limiter, seed=3)))
    assert (table.max_size, table.priority_exponent, table.rate_limiter.samples_per_insert) == (8, 0.5, 2.0)
    used = Fifo(4)
    used.insert(rn.chunk(0, 0))
    with pytest.raises(TypeError, match="has been used .*only a fresh table pickles"):
        pickle.dumps(used)
    with pytest.raises(ValueError, match="table 'default' .* has been used"):
        ReplayNode(used)
    node = pickle.loads(pickle.dumps(ReplayNode({"a": Fifo(4), "b": Uniform(8, seed=1)})))
    assert {name: spec.build().__class__ for name, spec in node.specs.items()} == {"a": Fifo, "b": Uniform}
    with pytest.raises(ValueError, match="max_waiting must be in"):
        ReplayNode(Fifo(4), thread_pool_size=4, max_waiting=4)
    with pytest.raises(ValueError, match="checkpoint=False contradicts"):
        ReplayNode(Fifo(4), checkpoint=False, checkpoint_every_seconds=5)
    with pytest.raises(TypeError, match="must be a replay table"):
        ReplayNode({"x": object()})


def test_insert_many_is_atomic_and_refuses_batches_that_could_never_fit():
    queue = Fifo(4)
    queue.insert_many([rn.chunk(0, 0), rn.chunk(0, 1), rn.chunk(0, 2)])
    with pytest.raises(TimeoutError, match=r"short of room \(1 free, 2 to insert\)"):
        queue.insert_many([rn.chunk(0, 3), rn.chunk(0, 4)], timeout=0.05)
    assert queue.size() == 3  # nothing of the refused batch got in
    threading.Timer(0.1, lambda: queue.sample(1)).start()
    np.testing.assert_array_equal(queue.insert_many([rn.chunk(0, 3), rn.chunk(0, 4)], timeout=5), [3, 4])
    with pytest.raises(ValueError, match="a batch of 5 items exceeds"):
        queue.insert_many([rn.chunk(0, 0)] * 5)
    with pytest.raises(ValueError, match=r"item\['step'\]\[0\] has shape \(3,\) float64 but the table's signature"):
        Uniform(8, signature=rn.chunk(0, 0)).insert_many(
            [rn.chunk(0, 0), {"id": np.zeros(2, np.int64), "step": rn.Step(np.zeros(3), 0.0)}])
    with pytest.raises(ValueError, match="can never be admitted at once"):
        Uniform(100, rate_limiter=SampleToInsertRatio(1.0, 10, 5.0)).insert_many([rn.chunk(0, 0)] * 10)
    with pytest.raises(ValueError, match=r"got \(2,\) priorities for 3 items"):
        Prioritized(8).insert_many([rn.chunk(0, 0)] * 3, priorities=[1.0, 2.0])
    table = Prioritized(8)
    table.insert_many([rn.chunk(0, 0)] * 6, priorities=[0, 0, 0, 0, 0, 7.0])
    assert table.sample(4).keys.tolist() == [5] * 4


def stacked(chunks: list[dict]) -> dict:
    return {"id": np.stack([c["id"] for c in chunks]),
            "step": rn.Step(*(np.stack([c["step"][i] for c in chunks]) for i in range(2)))}


def test_insert_batch_stores_stacked_items_as_insert_many_stores_them(tmp_path):
    chunks = [rn.chunk(3, seq) for seq in range(5)]
    by_items, by_batch = Prioritized(8, seed=0), Prioritized(8, seed=0)
    by_items.insert_many(chunks, priorities=[1, 2, 3, 4, 5])
    np.testing.assert_array_equal(by_batch.insert_batch(stacked(chunks), priorities=[1, 2, 3, 4, 5]), range(5))
    expected, got = by_items.state(), by_batch.state()
    np.testing.assert_array_equal(got["priorities"], expected["priorities"])
    got_items, expected_items = got["groups"][0]["items"], expected["groups"][0]["items"]
    assert rn.ids(got_items) == rn.ids(expected_items) and isinstance(got_items["step"], rn.Step)
    with pytest.raises(ValueError, match="leading items axis of one length"):
        by_batch.insert_batch({"a": np.zeros(3), "b": np.zeros(4)})
    with pytest.raises(ValueError, match="a batch of 5 items exceeds"):
        Fifo(4).insert_batch(stacked(chunks))

    program = jd.Program("batch")
    handle = program.add_node(ReplayNode(Prioritized(16, priority_exponent=1.0, seed=0)))
    with launched(program, tmp_path) as running:
        replay = ReplayClient(courier_client(running, handle.node_name))
        assert replay.insert_batch(stacked(chunks), priorities=[0, 0, 0, 0, 1.0], timeout=5) == [0, 1, 2, 3, 4]
        assert rn.ids(replay.sample(3)["data"]) == [(3, 4)] * 3
        with pytest.raises(ValueError, match=r"a sample of 2000000 items is more than one call may take"):
            replay.sample(2_000_000)  # the node's refusal reaches the caller as it is
        replay.close()
    uniform = Uniform(4)
    uniform.insert_many([rn.chunk(0, s) for s in range(3)])
    uniform.insert_many([rn.chunk(0, s) for s in range(3, 6)])  # evicts the two oldest in one go
    assert (uniform.state()["keys"].tolist(), uniform.stats()["evictions"]) == ([2, 3, 4, 5], 2)
    assert rn.ids(uniform.state()["groups"][0]["items"]) == [(0, s) for s in range(2, 6)]
