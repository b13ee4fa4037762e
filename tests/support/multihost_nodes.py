"""Nodes for the multihost launcher tests; a module of its own so spawned processes import it."""

from __future__ import annotations

import os
import time

import jaxdist as jd


class Counter:
    def __init__(self) -> None:
        self.value = 0

    def increment(self) -> int:
        self.value += 1
        return self.value

    def peek(self) -> int:
        return self.value

    def pid(self) -> int:
        return os.getpid()


class Caller:
    """Calls the counter `calls` times, then waits until every caller's calls arrived.

    It lingers a moment before returning, so callers on other hosts, which poll the counter
    until they see the total, finish before this host's program (and the counter) stops.
    """

    def __init__(self, counter, calls: int, total: int, linger: float = 1.0) -> None:
        self._counter, self._calls, self._total, self._linger = counter, calls, total, linger

    def run(self) -> None:
        value = 0
        for _ in range(self._calls):
            value = self._counter.with_timeout(60).increment()
        while value < self._total:
            time.sleep(0.05)
            value = self._counter.with_timeout(60).peek()
        print(f"{jd.current_node().node_name} saw total {value} from pid {os.getpid()}", flush=True)
        time.sleep(self._linger)


class ForeverCaller:
    """Calls the counter until the program stops."""

    def __init__(self, counter) -> None:
        self._counter = counter

    def run(self) -> None:
        while not jd.wait_for_stop(0.05):
            self._counter.with_timeout(60).increment()


def idle() -> None:
    """Work that lasts until the program stops, calling nobody."""
    jd.wait_for_stop()
