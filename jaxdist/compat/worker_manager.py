"""Launchpad's worker manager over a `jd.Running`: what `jaxdist.compat.launchpad.launch` returns.

Launchpad's semantics: `wait(labels_to_wait_for, raise_error, return_on_first_completed)` waits
for some groups, or all, or the first of them to end; a node's failure is raised by one `wait`
only (a `wait(raise_error=False)` keeps it for the next); `stop_and_wait()` stops the program
and waits without raising. The rest of `jd.Running` (`status()`, `client(handle)`, `stop()`,
`stop_reason`, ...) is reached through the manager as well, or as `manager.running`.
"""

from __future__ import annotations

import os
import sys
import threading
import traceback
from collections.abc import Sequence
from typing import Any

from jaxdist.launch.running import FAILED, FINISHED, STOPPED, Running
from jaxdist.program import group_of

_POLL = 0.05  # seconds between looks at the nodes' states while waiting for some groups
_ENDED = (FINISHED, FAILED, STOPPED)


class WorkerManager:
    """A launched program as Launchpad's `lp.launch` returns it."""

    def __init__(self, running: Running) -> None:
        self.running = running
        self._failure_raised = False
        self._lock = threading.Lock()

    def wait(self, labels_to_wait_for: Sequence[str] | None = None, raise_error: bool = True,
             return_on_first_completed: bool = False) -> None:
        """Block until every node of the groups `labels_to_wait_for` (all groups when None) has
        ended, or with `return_on_first_completed` the first of them. A node's failure stops the
        program; the first `wait` with `raise_error` after it raises it, once the program is over."""
        labels = self._known_labels(labels_to_wait_for)
        while True:
            try:
                over = self.running.wait(_POLL)
            except Exception:
                if raise_error and self._take_failure():
                    raise
                return
            if over:
                return
            statuses = self.running.status()
            if raise_error and not self._failure_raised and any(s["state"] == FAILED for s in statuses.values()):
                continue  # the stop is under way: the failure is raised once the program is over
            if labels is None and not return_on_first_completed:
                continue  # every group: the program is over only once its launch let go of everything
            ended = [s["state"] in _ENDED for name, s in statuses.items() if labels is None or group_of(name) in labels]
            if ended and (any(ended) if return_on_first_completed else all(ended)):
                return

    def stop_and_wait(self) -> None:
        """Stop every node and wait for the program to be over; a failure is kept for `wait`."""
        self.running.stop()

    def cleanup_after_test(self) -> None:
        """What a test launch adds to its test's cleanups: stop, and raise a failure that no
        `wait` raised, so that a node's crash fails the test."""
        self.running.stop()
        self.wait()

    def wait_at_exit(self) -> None:
        """Registered by a local launch: the interpreter exits once the program is over (before
        Python stops its thread pools), with status 1 when a node failed and no `wait` said so."""
        try:
            self.wait()
        except Exception:  # noqa: BLE001 - reported here: nothing is left to raise it to
            traceback.print_exc()
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(1)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self.running, name)

    def __repr__(self) -> str:
        return f"WorkerManager({self.running.program_name!r})"

    def _take_failure(self) -> bool:
        """True the first time only: Launchpad raises a failure from one `wait`."""
        with self._lock:
            first, self._failure_raised = not self._failure_raised, True
            return first

    def _known_labels(self, labels: Sequence[str] | None) -> set[str] | None:
        if not labels:
            return None
        if isinstance(labels, str):
            raise TypeError(f"labels_to_wait_for is a list of group labels, got the string {labels!r}: "
                            f"pass [{labels!r}]")
        groups = {group_of(name) for name in self.running.status()}
        unknown = sorted(set(labels) - groups)
        if unknown:
            raise ValueError(f"wait(labels_to_wait_for=...): program '{self.running.program_name}' has no group "
                             f"{', '.join(map(repr, unknown))} (Launchpad waits on it as on an ended group; jaxdist "
                             f"refuses the likely typo); groups: {', '.join(sorted(groups))}")
        return set(labels)
