"""Nodes and servers for the chaos tests (tests/chaos); a module of its own so spawned processes
can import it.

Processes in a chaos test compare times with ``time.monotonic()``: on Linux it reads
CLOCK_MONOTONIC, one clock for every process on the machine.
"""

from __future__ import annotations

import gc
import json
import os
import time
from typing import Any

import numpy as np

import jaxdist as jd
from jaxdist import courier

# --- Replay accounting (test_replay_accounting.py) ----------------------------------------------

STOP_FILE = "stop"


def item(actor: int, seq: int) -> dict:
    """An item that names who wrote it: ``id`` is [actor, seq]."""
    return {"id": np.array([actor, seq], np.int64)}


def ids(data: dict) -> list[tuple[int, int]]:
    """The (actor, seq) pairs of a stacked batch."""
    return [(int(a), int(s)) for a, s in np.asarray(data["id"]).reshape(-1, 2)]


def _stopping(out_dir: str) -> bool:
    return os.path.exists(os.path.join(out_dir, STOP_FILE)) or jd.stop_requested()


def _write_json(out_dir: str, name: str, value: Any) -> None:
    path = os.path.join(out_dir, name)
    with open(path + ".tmp", "w") as out:
        json.dump(value, out)
    os.replace(path + ".tmp", path)  # a reader never sees half a file


def replay_writer(replay: Any, actor: int, out_dir: str, pause: float = 0.0) -> None:
    """Inserts (actor, 0), (actor, 1), ... one at a time until the stop file appears.

    An insert is acknowledged when the call returned a key; the writer notes when. A call cut by
    the node's crash (or timing out) may or may not have been stored: the writer inserts the same
    item again, which is where duplicates can come from. Writes ``writer-<actor>.json``.
    """
    from jaxdist.nodes.replay import ReplayClient

    client = ReplayClient(replay)
    acks: list[tuple[int, float, int]] = []  # seq, when acknowledged, its key
    retries: list[tuple[int, float, str]] = []  # seq, when the attempt failed, why
    seq = 0
    while not _stopping(out_dir):
        try:
            key = client.insert(item(actor, seq), timeout=30)
        except (courier.CourierError, TimeoutError, ConnectionError) as exc:
            retries.append((seq, time.monotonic(), type(exc).__name__))
            continue
        acks.append((seq, time.monotonic(), key))
        seq += 1
        if pause:
            time.sleep(pause)
    _write_json(out_dir, f"writer-{actor}.json", {"acks": acks, "retries": retries})


def replay_checkpointer(replay: Any, out_dir: str, interval: float) -> None:
    """Calls the node's ``checkpoint()`` every ``interval`` s; notes (start, end, step) of each
    that returned. Every insert acknowledged before ``start`` is in that step's snapshot."""
    from jaxdist.nodes.replay import ReplayClient

    client = ReplayClient(replay)
    done: list[tuple[float, float, int]] = []
    failed: list[tuple[float, str]] = []
    while not _stopping(out_dir):
        start = time.monotonic()
        try:
            step = client.checkpoint(timeout=30)
        except (courier.CourierError, TimeoutError, ConnectionError) as exc:
            failed.append((start, type(exc).__name__))
            continue
        done.append((start, time.monotonic(), step))
        time.sleep(interval)
    _write_json(out_dir, "checkpoints.json", {"done": done, "failed": failed})


def replay_consumer(replay: Any, out_dir: str, batch_size: int, interval: float) -> None:
    """Takes ``batch_size`` items out of the Fifo every ``interval`` s; notes what it got."""
    from jaxdist.nodes.replay import ReplayClient

    client = ReplayClient(replay)
    consumed: list[tuple[int, int, float]] = []
    failed: list[tuple[float, str]] = []
    while not _stopping(out_dir):
        try:
            batch = client.sample(batch_size, timeout=2)
        except (courier.CourierError, TimeoutError, ConnectionError) as exc:
            failed.append((time.monotonic(), type(exc).__name__))
            continue
        now = time.monotonic()
        consumed.extend((actor, seq, now) for actor, seq in ids(batch["data"]))
        time.sleep(interval)
    _write_json(out_dir, "consumer.json", {"consumed": consumed, "failed": failed})


def hold_until_stopped() -> None:
    """Keeps a program alive after its other nodes with run() returned."""
    jd.wait_for_stop()


# --- Courier under hostile input (test_courier_hostile.py) -------------------------------------

_PLAIN = (type(None), bool, int, float, str, bytes)


def _garbage_in(value: Any) -> bool:
    """Whether `value` holds anything but what courier's codec may build (iterative: values may
    nest as deep as msgpack allows, deeper than Python's recursion limit)."""
    pending = [value]
    while pending:
        value = pending.pop()
        if type(value) in (list, tuple):
            pending.extend(value)
        elif type(value) is dict:
            pending.extend(value.keys())
            pending.extend(value.values())
        elif not (type(value) in _PLAIN or type(value) is np.ndarray or isinstance(value, np.generic)):
            return True
    return False


class CountingService:
    """Counts the calls that reach ``record`` and checks what they carry."""

    def __init__(self) -> None:
        self._calls = 0
        self._garbage = 0
        self._nonces: list[int] = []

    def record(self, /, *args: Any, **kwargs: Any) -> int:  # positional-only: any keyword is accepted
        self._calls += 1
        if _garbage_in(list(args)) or _garbage_in(kwargs):
            self._garbage += 1
        if len(args) == 2 and args[0] == "valid" and type(args[1]) is int:
            self._nonces.append(args[1])
        return self._calls

    def stats(self) -> dict:
        return {"calls": self._calls, "garbage": self._garbage, "nonces": self._nonces}

    def sleep(self, seconds: float) -> float:
        time.sleep(seconds)
        return seconds

    def big(self, nbytes: int) -> np.ndarray:
        return np.ones(nbytes, np.uint8)

    def collect(self) -> int:
        return gc.collect()


def serve_counting(conn: Any, options: dict) -> None:
    """A courier server of a CountingService in this process; reports (address, pid), serves
    until the parent sends anything or goes away."""
    server = courier.Server(CountingService(), **options).start()
    conn.send((server.address, os.getpid()))
    try:
        conn.recv()
    except EOFError:
        pass
    server.stop(grace=0)


# --- Launch cycles (test_launch_cycles.py) ------------------------------------------------------


class Tally:
    def __init__(self) -> None:
        self.value = 0
        self.sleeping = 0

    def increment(self) -> int:
        self.value += 1
        return self.value

    def sleep(self, seconds: float) -> float:
        self.sleeping += 1
        time.sleep(seconds)
        return seconds

    def sleepers(self) -> int:
        """How many calls of ``sleep`` have begun: a caller is in one once this counts it."""
        return self.sleeping


def call_until_stopped(service: Any) -> None:
    """Calls `service` until the program stops. Peers stop in no set order, so a call may be cut
    (UnavailableError, or CancelledError when the peer's server shut down gracefully) a moment
    before this node hears of the stop: that is not a failure."""
    while not jd.wait_for_stop(0.01):
        try:
            service.with_timeout(5).increment()
        except Exception:
            if not jd.wait_for_stop(2.0):
                raise


def block_in_call(service: Any) -> None:
    """Sits in one long call, as a node waiting on a slow peer does; catches nothing."""
    service.with_timeout(60).sleep(30)
