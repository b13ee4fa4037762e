"""Evaluator classes for pool tests; a module of its own so spawned processes can import it."""

from __future__ import annotations

import os
import threading
import time


class Squarer:
    """``square(x)`` after ``delay`` seconds; ``current()`` tells which task it is working on."""

    def __init__(self, delay: float = 0.0) -> None:
        self._delay = delay
        self._current: list[int] = []
        self._lock = threading.Lock()

    def square(self, x: int) -> dict:
        with self._lock:
            self._current.append(x)
        try:
            time.sleep(self._delay)
            return {"value": x * x, "pid": os.getpid()}
        finally:
            with self._lock:
                self._current.remove(x)

    def current(self) -> list[int]:
        with self._lock:
            return list(self._current)

    def pid(self) -> int:
        return os.getpid()


class Refuser:
    """Raises on some tasks: the caller's error, not a lost evaluator."""

    def square(self, x: int) -> int:
        if x == 3:
            raise ValueError(f"task {x} is bad")
        return x * x


class Hangs:
    """Takes far longer than any test's deadline."""

    def square(self, x: int) -> int:
        time.sleep(30)
        return x * x
