"""Evaluator classes for pool tests; a module of its own so spawned processes can import it."""

from __future__ import annotations

import os
import threading
import time


class Squarer:
    """``square(x)`` after ``delay`` seconds; ``current()`` tells which task it is working on.

    Squarers in one process given the same ``barrier`` answer only when every one of them is in a
    task at once: a pool that let any of them idle would break the barrier (after 30 s).
    """

    def __init__(self, delay: float = 0.0, barrier: threading.Barrier | None = None) -> None:
        self._delay = delay
        self._barrier = barrier
        self._current: list[int] = []
        self._lock = threading.Lock()

    def square(self, x: int) -> dict:
        with self._lock:
            self._current.append(x)
        try:
            if self._barrier is not None:
                self._barrier.wait(timeout=30)
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
    """Answers nothing until ``release()``: an evaluator that hung."""

    def __init__(self) -> None:
        self._released = threading.Event()
        self.calls = 0

    def square(self, x: int) -> int:
        self.calls += 1
        self._released.wait()
        return x * x

    def release(self) -> None:
        self._released.set()
