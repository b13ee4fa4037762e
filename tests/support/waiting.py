"""Waiting in tests: on a condition or a call, polled, with a generous timeout; never a bare sleep.

A timeout here only turns a hang into a failure with a message; it is never what a test checks,
so it can be far longer than the wait should take on a busy machine.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent import futures
from typing import Any, TypeVar

T = TypeVar("T")


def wait_until(condition: Callable[[], T], what: str = "the condition", timeout: float = 180.0) -> T:
    """The first truthy value of ``condition()``, polled; fails after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not (value := condition()):
        assert time.monotonic() < deadline, f"timed out after {timeout} s waiting for {what}"
        time.sleep(0.02)
    return value


def returns(call: Callable[[], Any], what: str, timeout: float = 60.0) -> Any:
    """``call()``'s result (or its exception), run on another thread; fails if it has not returned
    within `timeout`: for calls whose wrong behaviour is a wait far longer, or unbounded."""
    worker = futures.ThreadPoolExecutor(1)
    try:
        return worker.submit(call).result(timeout)
    except futures.TimeoutError:
        raise AssertionError(f"{what} did not return within {timeout} s") from None
    finally:
        worker.shutdown(wait=False)


def run_threads(*targets: Callable[[], Any], join_timeout: float = 15.0) -> None:
    """Runs the targets concurrently; re-raises the first failure; fails if one is still
    blocked after `join_timeout` seconds."""
    errors: list[BaseException] = []

    def guarded(target: Callable[[], Any]) -> None:
        try:
            target()
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=guarded, args=(t,), daemon=True) for t in targets]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + join_timeout
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    assert not any(thread.is_alive() for thread in threads), "a thread is still blocked"
    if errors:
        raise errors[0]
