"""Writing a prioritized replay's new priorities back from a learner, off its step loop."""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from jaxdist.nodes.replay.client import ReplayClient


class PriorityWriter:
    """A learner's ``after_update`` over a prioritized replay source (``field=None``): the
    ``metrics["priorities"]`` its update returns for the sampled ``batch["keys"]`` go back to
    the replay node ``replay`` (a client) from a thread of its own, in order. Whatever piled up while a write was on the
    wire goes in the next one, as one call: the writer keeps up with any learner speed, and
    the learner waits only when ``max_pending`` dispatches are unwritten. A failed write is
    reported and skipped: priorities are a hint, and the replay (colocated with the learner)
    only fails when the program stops or crashes. A learner that finishes calls :meth:`flush`,
    so the replay it stops before saves the priorities of its last updates."""

    def __init__(self, replay: Any, max_pending: int = 64) -> None:
        self._replay = ReplayClient(replay)
        self._max_pending = max_pending
        self._pending: list[tuple[Any, Any]] = []
        self._cond = threading.Condition()
        self._writing = False
        self.errors = 0
        threading.Thread(target=self._loop, name="priority-writer", daemon=True).start()

    def __call__(self, batch: dict[str, Any], metrics: dict[str, Any]) -> dict[str, Any]:
        """Take the new priorities out of ``metrics`` (one per sampled item, not a metric to log)."""
        metrics = dict(metrics)
        priorities = metrics.pop("priorities")
        with self._cond:
            self._cond.wait_for(lambda: len(self._pending) < self._max_pending)
            self._pending.append((batch["keys"], priorities))
            self._cond.notify_all()
        return metrics

    def flush(self) -> None:
        """Return once the priorities handed so far are written (or their write failed)."""
        with self._cond:
            self._cond.wait_for(lambda: not self._pending and not self._writing)

    def _loop(self) -> None:
        import jax

        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._pending)
                pending, self._pending = self._pending, []
                self._writing = True
                self._cond.notify_all()
            try:
                pending = jax.device_get(pending)  # waits for the updates that computed them
                self._replay.update_priorities(np.concatenate([np.ravel(keys) for keys, _ in pending]),
                                               np.concatenate([np.ravel(new) for _, new in pending]))
            except Exception as exc:  # noqa: BLE001 - see the class docstring
                self.errors += 1
                if self.errors == 1:
                    print(f"priority writer: updating priorities failed (learning goes on): {type(exc).__name__}: "
                          f"{str(exc).splitlines()[0] if str(exc) else ''}", flush=True)
            finally:
                with self._cond:
                    self._writing = False
                    self._cond.notify_all()
