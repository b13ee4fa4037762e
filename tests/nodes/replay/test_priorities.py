"""PriorityWriter: the learner's after_update sends each sampled batch's new priorities back to
the replay node, from a thread of its own and in order, coalescing what piles up meanwhile."""

from __future__ import annotations

import threading

import numpy as np

from jaxdist.nodes.replay import PriorityWriter
from waiting import wait_until


class RecordingReplay:
    """Stands in for a replay node's courier client: records the calls it gets, and holds
    them while ``hold`` is clear (a slow node)."""

    def __init__(self):
        self.calls = []
        self.hold = threading.Event()
        self.hold.set()
        self.entered = threading.Event()

    def call(self, method, *args, **kwargs):
        self.entered.set()
        self.hold.wait()
        self.calls.append((method, args, kwargs))

    def with_timeout(self, seconds):
        return self


def sent_keys(replay) -> np.ndarray:
    return np.concatenate([keys for _, (keys, _), _ in replay.calls]) if replay.calls else np.empty(0)


def test_priority_writer_sends_each_batchs_new_priorities_home_in_order():
    replay = RecordingReplay()
    writer = PriorityWriter(replay)
    for step in range(5):
        keys = np.arange(4) + 10 * step
        logged = writer({"keys": keys, "data": {}, "probabilities": np.full(4, 0.25)},
                        {"priorities": keys / 10.0, "loss": 1.0})
        assert logged == {"loss": 1.0}  # the priorities are the writer's, not a metric of the learner's
    wait_until(lambda: len(sent_keys(replay)) == 20, what="all 20 priorities written")
    np.testing.assert_array_equal(sent_keys(replay), np.concatenate([np.arange(4) + 10 * s for s in range(5)]))
    for method, (keys, priorities), kwargs in replay.calls:
        assert method == "update_priorities" and kwargs == {"table": "default"}
        np.testing.assert_allclose(priorities, keys / 10.0)
    assert writer.errors == 0


def test_a_slow_replay_never_holds_the_learner_back_and_gets_the_backlog_in_one_write():
    replay = RecordingReplay()
    writer = PriorityWriter(replay, max_pending=64)
    replay.hold.clear()
    writer({"keys": np.arange(2)}, {"priorities": np.ones(2)})
    assert replay.entered.wait(10)  # its write now waits on the node
    finished = threading.Event()

    def learner():  # 40 dispatches of scanned steps, (steps, batch) keys each
        for step in range(1, 41):
            keys = np.arange(6).reshape(3, 2) + 100 * step
            writer({"keys": keys}, {"priorities": keys / 2.0})
        finished.set()

    threading.Thread(target=learner, daemon=True).start()
    assert finished.wait(10), "the learner waited on a replay that was slow to take priorities"
    replay.hold.set()
    wait_until(lambda: len(sent_keys(replay)) == 2 + 40 * 6, what="every priority written")
    assert len(replay.calls) == 2  # the first batch, then the backlog coalesced
    expected = np.concatenate([np.arange(2)] + [np.arange(6) + 100 * s for s in range(1, 41)])
    np.testing.assert_array_equal(sent_keys(replay), expected)


def test_a_finishing_learners_flush_returns_once_its_last_priorities_are_written():
    """A learner calls flush when it finishes, before the replay it stops ahead of saves: the
    priorities of its last updates must be in that save. Before, the writer had no flush and
    the learner returned with them still on their way (or not yet sent)."""
    replay = RecordingReplay()
    writer = PriorityWriter(replay)
    replay.hold.clear()
    writer({"keys": np.arange(2)}, {"priorities": np.ones(2)})
    assert replay.entered.wait(10)  # the first write is on the wire, held by the node
    writer({"keys": np.arange(2, 5)}, {"priorities": np.ones(3)})  # and the last update's is pending
    flushed = threading.Event()
    threading.Thread(target=lambda: (writer.flush(), flushed.set()), daemon=True).start()
    assert not flushed.wait(0.2)  # nothing written yet: flush waits
    replay.hold.set()
    assert flushed.wait(10), "flush did not return once the writes went through"
    np.testing.assert_array_equal(sent_keys(replay), np.arange(5))
