"""What code inside a launched node can ask of its program: `jd.stop()` and stop checks."""

from __future__ import annotations

import threading
from collections.abc import Callable

_stop_event = threading.Event()
_request_stop: Callable[[], None] | None = None


def install(request_stop: Callable[[], None]) -> threading.Event:
    """Called by a launcher in each process it runs nodes in."""
    global _request_stop
    _request_stop = request_stop
    _stop_event.clear()
    return _stop_event


def uninstall() -> None:
    global _request_stop
    _request_stop = None


def stop() -> None:
    """Stop the whole program this node belongs to (returns at once; teardown follows)."""
    if _request_stop is None:
        raise RuntimeError("jd.stop() was called outside a launched program; use Running.stop() instead")
    _request_stop()


def stop_requested() -> bool:
    """Whether the program is stopping: long `run()` loops should check it and return."""
    return _stop_event.is_set()


def wait_for_stop(timeout: float | None = None) -> bool:
    """Block until the program is stopping (True) or `timeout` passes (False)."""
    return _stop_event.wait(timeout)
