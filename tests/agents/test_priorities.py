"""PriorityWriter: the learner's after_update sends each sampled batch's new priorities back to
the replay node, from a thread of its own and in order."""

from __future__ import annotations

import time

import numpy as np

from jaxdist.agents.priorities import PriorityWriter


class RecordingReplay:
    """Stands in for a replay node's courier client: records the calls it gets."""

    def __init__(self):
        self.calls = []

    def call(self, method, *args, **kwargs):
        self.calls.append((method, args, kwargs))

    def with_timeout(self, seconds):
        return self


def test_priority_writer_sends_each_batchs_new_priorities_home_in_order():
    replay = RecordingReplay()
    writer = PriorityWriter(replay, max_pending=2)
    for step in range(5):
        keys = np.arange(4) + 10 * step
        writer({"keys": keys, "data": {}, "probabilities": np.full(4, 0.25)}, {"priorities": keys / 10.0, "loss": 1.0})
    deadline = time.monotonic() + 10
    while len(replay.calls) < 5 and time.monotonic() < deadline:  # the writes happen on the writer's thread
        time.sleep(0.01)
    assert [method for method, _, _ in replay.calls] == ["update_priorities"] * 5
    for step, (_, (keys, priorities), kwargs) in enumerate(replay.calls):
        np.testing.assert_array_equal(keys, np.arange(4) + 10 * step)
        np.testing.assert_allclose(priorities, keys / 10.0)
        assert kwargs == {"table": "default"}
    assert writer.errors == 0
