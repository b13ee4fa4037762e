"""Waiting in tests: on a condition or a call, polled, with a generous timeout; never a bare sleep.

A timeout here only turns a hang into a failure with a message; it is never what a test checks,
so it can be far longer than the wait should take on a busy machine.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent import futures
from typing import Any, TypeVar

T = TypeVar("T")


def wait_until(condition: Callable[[], T], what: str = "the condition", timeout: float = 60.0) -> T:
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
