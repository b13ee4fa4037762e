"""Reverb's table semantics, from its documented behaviour: sample info, deletes and reset,
can_sample/can_insert, max_times_sampled, the ordered and heap selectors, queues and stacks,
inserts into several tables at once, samples larger than the limiter's window, checkpoints."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

import jaxdist as jd
from jaxdist.nodes.replay import (Fifo, Lifo, MaxHeap, MinHeap, MinSize, Prioritized, ReplayClient, ReplayNode,
                                  SampleToInsertRatio, Table, Uniform, insert_into)
from jaxdist.nodes.replay.checkpointing import TableCheckpointer
from waiting import wait_until


def value(i: int) -> dict:
    return {"i": np.int64(i)}


def ids(sample) -> list[int]:
    return np.asarray(sample.data["i"]).tolist()


def test_a_sample_carries_priority_probability_table_size_and_times_sampled():
    table = Prioritized(8, priority_exponent=1.0, seed=0)
    table.insert_many([value(0), value(1)], priorities=[1.0, 3.0])
    uncounted = table.sample(1)  # info only when asked for; the draw still counts
    assert uncounted.info is None
    sample = table.sample(400, info=True)
    info = sample.info
    assert info.table_size == 2 and info.times_sampled.dtype == np.int32
    np.testing.assert_array_equal(info.priorities, np.where(sample.keys == 1, 3.0, 1.0))
    np.testing.assert_allclose(sample.probabilities, np.where(sample.keys == 1, 0.75, 0.25))
    for key in (0, 1):  # each draw counts itself: 1, 2, 3, ... per item
        np.testing.assert_array_equal(info.times_sampled[sample.keys == key],
                                      1 + np.arange((sample.keys == key).sum()) + (uncounted.keys[0] == key))
    assert table.sample(1, info=True).info.times_sampled[0] > 100  # and the count goes on across calls


def test_deleted_items_are_gone_and_their_keys_are_never_given_again():
    table = Uniform(4, seed=0)
    keys = table.insert_many([value(i) for i in range(4)])
    assert table.delete([keys[1], keys[2], 99]) == 2  # an unknown key is skipped
    assert table.delete([keys[1]]) == 0 and table.size() == 2
    assert set(ids(table.sample(50))) == {0, 3}
    new = table.insert_many([value(4), value(5)])
    assert not set(new.tolist()) & set(keys.tolist())  # the freed slots got fresh keys
    table.update_priorities([keys[1]], [5.0])  # a deleted key is stale, not someone else's item
    assert table.stats()["stale_priority_updates"] == 1 and table.stats()["deletes"] == 2
    assert table.insert(value(6)) not in keys  # the full table evicts its oldest (key 0) ...
    assert set(ids(table.sample(100))) == {3, 4, 5, 6}  # ... and keeps the rest


def test_reset_empties_the_table_and_zeroes_the_rate_limiter():
    limiter = SampleToInsertRatio(samples_per_insert=1.0, min_size=2, error_buffer=2.0)  # window [0, 4]
    table = Uniform(10, rate_limiter=limiter, seed=0)
    table.insert_many([value(0), value(1)])  # free up to min_size
    table.insert_many([value(2), value(3)])
    assert not table.can_insert(1)  # samplers are behind
    table.reset()
    assert table.size() == 0 and not table.can_sample(1)  # below min_size again
    assert table.can_insert(2) and table.stats()["inserts"] == 4  # the lifetime counters stay
    table.insert_many([value(7), value(8)])
    assert set(ids(table.sample(2))) <= {7, 8}


def test_can_sample_and_can_insert_answer_for_the_limiter_and_the_contents():
    queue = Table.queue(2)
    assert queue.can_insert(2) and not queue.can_insert(3) and not queue.can_sample(1)
    queue.insert(value(0))
    assert queue.can_sample(1) and not queue.can_sample(2) and queue.can_insert(1) and not queue.can_insert(2)
    table = Uniform(10, rate_limiter=MinSize(3))
    table.insert_many([value(0), value(1)])
    assert not table.can_sample(1)
    table.insert(value(2))
    assert table.can_sample(1000)


def test_room_held_for_one_producer_is_out_of_the_others_reach_until_its_insert_uses_it():
    queue = Table.queue(4)
    assert queue.can_insert(2, hold=30.0) and queue.can_insert(2, hold=30.0)
    assert not queue.can_insert(1) and queue.info()["held_room"] == 4  # two actors, one free batch each
    assert not queue.can_sample(1)  # held room is not data
    queue.insert_many([value(0), value(1)])  # the first producer's insert uses its room
    assert queue.info()["held_room"] == 2 and not queue.can_insert(1)
    queue.insert_many([value(2), value(3)])
    assert queue.info()["held_room"] == 0 and queue.size() == 4
    assert ids(queue.sample(4)) == [0, 1, 2, 3]
    assert queue.can_insert(2, hold=30.0)
    queue.reset()
    assert queue.info()["held_room"] == 0 and queue.can_insert(4)
    with pytest.raises(ValueError, match="hold must be a finite number of seconds"):
        queue.can_insert(1, hold=float("inf"))


def test_held_room_lapses_and_a_producer_waiting_for_it_is_woken_then():
    queue = Table.queue(2)
    assert queue.can_insert(2, hold=0.3)  # its producer never inserts (it died)
    start = time.monotonic()
    assert queue.can_insert(2, wait=10.0)  # nothing notifies the lapse: the wait wakes for it
    assert 0.25 <= time.monotonic() - start < 5.0
    assert queue.can_insert(2, hold=0.3)
    queue.insert_many([value(0), value(1)], timeout=10.0)  # an insert waits for nothing held for it


def test_an_item_is_removed_once_sampled_max_times_sampled_times():
    table = Uniform(10, max_times_sampled=3, seed=0)
    table.insert_many([value(0), value(1)])
    sample = table.sample(6)  # every allowed draw, no more: random draws past an item's limit are redrawn
    assert sorted(ids(sample)) == [0, 0, 0, 1, 1, 1] and table.size() == 0
    assert table.stats()["expirations"] == 2
    assert not table.can_sample(1)
    table.insert(value(2))
    with pytest.raises(TimeoutError, match=r"may be sampled 3 more times in all \(max_times_sampled=3\), fewer than "
                                           r"the 4 asked for"):
        table.sample(4, timeout=0.01)

    ordered = Fifo(10, MinSize(1), max_times_sampled=2)  # Reverb's Fifo selector in a sampled table
    ordered.insert_many([value(i) for i in range(3)])
    first = ordered.sample(3, info=True)
    assert ids(first) == [0, 0, 1] and first.info.times_sampled.tolist() == [1, 2, 1]
    assert ids(ordered.sample(3)) == [1, 2, 2] and ordered.size() == 0


def test_lifo_samples_the_newest_and_a_stack_pops_it():
    table = Lifo(5, seed=0)
    table.insert_many([value(i) for i in range(3)])
    assert ids(table.sample(4)) == [2, 2, 2, 2] and table.size() == 3  # no limit: the newest every time
    stack = Table.stack(3)
    stack.insert_many([value(i) for i in range(3)])
    with pytest.raises(TimeoutError, match=r"Lifo is full \(3 items\)"):
        stack.insert(value(3), timeout=0.01)  # a stack blocks inserts when full, evicts nothing
    assert ids(stack.sample(2)) == [2, 1]
    stack.insert(value(3))
    assert ids(stack.sample(2)) == [3, 0] and stack.size() == 0
    with pytest.raises(TimeoutError, match="Lifo holds 0 of the 1 items asked for"):
        stack.sample(1, timeout=0.01)  # and samples when empty


def test_heaps_sample_the_extreme_priority_ties_going_to_the_least_recently_touched():
    heap = MaxHeap(8)
    keys = heap.insert_many([value(i) for i in range(4)], priorities=[1.0, 5.0, 5.0, 2.0])
    assert ids(heap.sample(3)) == [1, 1, 1]  # 1 and 2 tie at 5.0; 1 was inserted first
    assert heap.sample(1).probabilities is None
    heap.update_priorities([keys[1]], [5.0])  # now 2 is the least recently touched of the tie
    assert ids(heap.sample(1)) == [2]
    low = MinHeap(8, max_times_sampled=1)
    low.insert_many([value(i) for i in range(4)], priorities=[3.0, 0.5, 2.0, 0.5])
    assert ids(low.sample(4)) == [1, 3, 2, 0] and low.size() == 0  # a min-priority queue


def shared(*tables):
    tables[0].share_lock(*tables[1:])
    return tables


def test_one_insert_goes_into_several_tables_atomically():
    queue, uniform = shared(Fifo(1), Uniform(8, seed=0))
    assert insert_into([queue, uniform], value(0), priorities=[None, 2.0]) == [0, 0]
    with pytest.raises(TimeoutError, match=r"Fifo is full \(1 items\)"):
        insert_into([queue, uniform], value(1), timeout=0.01)
    assert uniform.size() == 1  # the full queue held the insert back from both
    threading.Timer(0.05, lambda: queue.sample(1)).start()
    assert insert_into([queue, uniform], value(1), timeout=10) == [1, 1]
    assert (queue.size(), uniform.size()) == (1, 2)
    with pytest.raises(ValueError, match="share a lock"):
        insert_into([Fifo(2), Fifo(2)], value(0))
    with pytest.raises(ValueError, match="got 1 priorities for 2 tables"):
        insert_into([queue, uniform], value(2), priorities=[1.0])


def test_a_sample_larger_than_the_window_is_served_as_inserts_arrive():
    limiter = SampleToInsertRatio(samples_per_insert=1.0, min_size=1, error_buffer=2.0)  # window [-1, 3]
    table = Uniform(100, rate_limiter=limiter, seed=0)
    table.insert(value(0))
    got = []
    sampler = threading.Thread(target=lambda: got.append(table.sample(20, timeout=30)))
    sampler.start()
    inserted = 1
    while sampler.is_alive() and inserted < 100:  # inserts keep going while the sampler waits
        table.insert(value(inserted), timeout=5)
        inserted += 1
    sampler.join(30)
    assert got and len(got[0].keys) == 20 and inserted < 100
    stats = table.stats()
    assert -1 <= stats["inserts"] - stats["samples"] <= 3  # the ratio held throughout

    with pytest.raises(TimeoutError, match="of the 20 had been granted"):
        table.sample(20, timeout=0.05)
    assert table.can_insert(1) == limiter.can_insert(1, size=table.size(), inserts=stats["inserts"],
                                                     samples=stats["samples"])  # the grant was given back
    with pytest.raises(ValueError, match="removes what it samples"):
        Uniform(100, rate_limiter=limiter, max_times_sampled=1).sample(20)


def test_a_checkpoint_keeps_times_sampled_deletes_resets_and_selector_state(tmp_path):
    def build():
        return {"heap": MaxHeap(6, max_times_sampled=4), "uniform": Uniform(6, max_times_sampled=3, seed=2),
                "stack": Table.stack(4)}

    tables = build()
    for name, table in tables.items():
        keys = table.insert_many([value(i) for i in range(4)], priorities=[2.0, 2.0, 1.0, 2.0])
        table.sample(2)
        table.delete([keys[3]])
    tables["heap"].update_priorities([0], [2.0])  # 1 is now the least recently touched of the tie
    tables["uniform"].reset()
    tables["uniform"].insert(value(9))
    checkpointer = TableCheckpointer(tmp_path)
    checkpointer.save(tables)
    restored = build()
    checkpointer.restore(restored)
    checkpointer.close()
    for name in tables:
        assert restored[name].stats() == tables[name].stats(), name
        assert restored[name].info() == tables[name].info(), name
        a, b = tables[name].state(), restored[name].state()
        np.testing.assert_array_equal(a["keys"], b["keys"])
        np.testing.assert_array_equal(a["times_sampled"], b["times_sampled"])
        assert tables[name].insert(value(7)) == restored[name].insert(value(7))  # no deleted key comes back
        first, second = tables[name].sample(2, info=True), restored[name].sample(2, info=True)
        np.testing.assert_array_equal(first.keys, second.keys)
        np.testing.assert_array_equal(first.info.times_sampled, second.info.times_sampled)


def test_the_node_serves_sample_info_deletes_resets_queries_and_multi_table_inserts(tmp_path):
    program = jd.Program("reverb")
    handle = program.add_node(ReplayNode({"queue": Table.queue(2), "heap": MaxHeap(8)}))
    running = jd.launch(program, launcher="threads", run_dir=str(tmp_path), echo=False)
    try:
        replay = ReplayClient(jd.courier.Client(running.addresses[handle.node_name], token=running.token))
        keys = replay.insert(value(0), priority={"heap": 4.0}, table=["queue", "heap"])
        assert keys == {"queue": 0, "heap": 0}
        assert replay.insert_many([value(1)], priorities=[1.0], table=["queue", "heap"]) == {"queue": [1], "heap": [1]}
        late = replay.futures.insert(value(2), table=["queue", "heap"], timeout=30)
        wait_until(lambda: replay.stats()["queue"]["insert_waits"] > 0, "the insert to wait for the full queue")
        assert replay.size("heap") == 2  # nothing went into the heap while the queue was full
        assert not replay.can_insert(1, table="queue") and replay.can_sample(2, table="queue")
        sample = replay.sample(1, table="heap", info=True)
        assert sample["info"]["priorities"].tolist() == [4.0] and sample["info"]["table_size"] == 2
        assert sample["info"]["times_sampled"].tolist() == [1] and "info" not in replay.sample(1, table="heap")
        assert replay.sample(1, table="queue")["keys"].tolist() == [0]
        assert late.result(10) == {"queue": 2, "heap": 2}
        assert replay.delete([0, 5], table="heap") == 1 and replay.size("heap") == 2
        assert replay.info("heap")["deletes"] == 1
        replay.reset("queue")
        assert replay.size("queue") == 0 and not replay.can_sample(1, table="queue")
        with pytest.raises(ValueError, match=r"priorities name tables \['nope'\]"):
            replay.insert(value(3), priority={"nope": 1.0}, table=["queue", "heap"])
        replay.close()
    finally:
        running.stop()


def test_a_checkpoint_written_before_deletes_existed_still_restores():
    """Format 1 (keys [first, next), key k in slot k % max_size) is read and upgraded, so a run
    resumed with this version keeps its replay."""
    from jaxdist.nodes.replay.checkpointing import _save_items, _upgraded, from_checkpoint

    tree = {"keys": np.array([2, 6]), "priorities": np.arange(3.0, 7.0)}  # Prioritized(4) after 6 inserts
    items = _save_items({"i": np.arange(2, 6)}, tree, "")
    counters = dict(inserts=6, samples=0, evictions=2, insert_waits=0, sample_waits=0, timeouts=0,
                    stale_priority_updates=0)
    meta = {"format": 1, "tables": {"p": {
        "group": "t0", "kind": "Prioritized", "items": items, "values": {"counters": counters, "max_priority": 6.0},
        "arrays": {"priorities": {"name": "priorities", "shape": [4], "dtype": "<f8"}}}}}
    state = from_checkpoint({"t0": tree}, meta)[0]["p"]
    table = Prioritized(4, priority_exponent=1.0, seed=0)
    table.load_state(_upgraded(state, table))
    assert table.state()["keys"].tolist() == [2, 3, 4, 5] and table.stats()["evictions"] == 2
    np.testing.assert_allclose(table.sample(1000, info=True).info.priorities.mean(), (9 + 16 + 25 + 36) / 18, rtol=0.05)
    assert table.insert(value(6)) == 6  # keys go on where they were, evicting key 2
    assert 2 not in table.sample(200).keys
    with pytest.raises(ValueError, match="format 9 is not one this jaxdist reads"):
        from_checkpoint({}, {"format": 9, "tables": {}})


def test_the_node_serves_a_sample_larger_than_the_window_across_its_wait_slices(tmp_path):
    limiter = SampleToInsertRatio(samples_per_insert=1.0, min_size=1, error_buffer=2.0)  # window [-1, 3]
    program = jd.Program("oversized")
    handle = program.add_node(ReplayNode(Uniform(100, rate_limiter=limiter, seed=0), max_wait=0.1))
    running = jd.launch(program, launcher="threads", run_dir=str(tmp_path), echo=False)
    try:
        replay = ReplayClient(jd.courier.Client(running.addresses[handle.node_name], token=running.token))
        replay.insert(value(0))
        sample = replay.futures.sample(30, timeout=60)
        inserted = 1
        while not sample.done() and inserted < 100:  # paced: the sample spans many 0.1 s slices
            replay.insert(value(inserted), timeout=30)
            inserted += 1
            time.sleep(0.01)
        assert len(sample.result(30)["keys"]) == 30 and inserted < 100
        stats = replay.stats()["default"]
        assert stats["not_ready_answers"] > 0 and -1 <= stats["inserts"] - stats["samples"] <= 3
        replay.close()
    finally:
        running.stop()


def test_a_drained_queue_keeps_its_storage_and_a_replaced_signature_frees_it():
    queue = Fifo(4)
    queue.insert_many([value(0), value(1)])
    storage = queue._items.groups[0].arrays[0]
    queue.sample(2)  # empty: a learner drains an on-policy queue at every batch
    queue.insert(value(2))
    assert queue._items.groups[0].arrays[0] is storage  # refilled in place, no fresh allocation
    table = Uniform(2)
    table.insert(value(0))
    table.insert_many([{"j": np.zeros(3)}, {"j": np.ones(3)}])  # evicts the last item of the first signature
    assert len(table._items.groups) == 1  # the first signature's columns went with its last item
