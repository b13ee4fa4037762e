"""Writing a prioritized replay's new priorities back from the learner, off its step loop."""

from __future__ import annotations

import collections
from concurrent import futures
from typing import Any

import numpy as np


class PriorityWriter:
    """The learner's ``after_update``: the new priorities of each sampled batch go back to the
    replay node from a thread of their own, in order, at most ``max_pending`` behind the
    learner. A failed write is reported and skipped: priorities are a hint, and the replay
    (colocated with the learner) only fails when the program stops or crashes."""

    def __init__(self, replay: Any, max_pending: int = 4) -> None:
        from jaxdist.nodes.replay import ReplayClient

        self._replay = ReplayClient(replay)
        self._executor = futures.ThreadPoolExecutor(1, thread_name_prefix="priority-writer")
        self._pending: collections.deque[futures.Future] = collections.deque()
        self._max_pending = max_pending
        self.errors = 0

    def __call__(self, batch: dict[str, Any], metrics: dict[str, Any]) -> None:
        while len(self._pending) >= self._max_pending:
            self._pending.popleft().result()
        self._pending.append(self._executor.submit(self._write, batch["keys"], metrics["priorities"]))

    def _write(self, keys: Any, priorities: Any) -> None:
        import jax

        try:
            self._replay.update_priorities(np.asarray(jax.device_get(keys)).ravel(),
                                           np.asarray(jax.device_get(priorities)).ravel())
        except Exception as exc:  # noqa: BLE001 - see the class docstring
            self.errors += 1
            if self.errors == 1:
                print(f"priority writer: updating priorities failed (learning goes on): {type(exc).__name__}: "
                      f"{str(exc).splitlines()[0] if str(exc) else ''}", flush=True)
