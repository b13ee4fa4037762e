"""Node classes for launcher tests; a module of its own so spawned processes can import it."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import jaxdist as jd


class Counter:
    def __init__(self) -> None:
        self.value = 0

    def increment(self) -> int:
        self.value += 1
        return self.value

    def ping(self) -> str:
        return "pong"

    def pid(self) -> int:
        return os.getpid()


class CallsPeerInConstructor:
    """Calls a node that may be added (and constructed) after it: the two-phase start allows it."""

    def __init__(self, peer) -> None:
        self.reply = peer.ping()

    def run(self) -> None:
        print(f"peer replied {self.reply}", flush=True)
        jd.stop()


class Failing:
    def run(self) -> None:
        print("about to fail", flush=True)
        raise ValueError("deliberate failure in run")


class FailingConstructor:
    def __init__(self) -> None:
        raise RuntimeError("deliberate failure in __init__")


class Chatty:
    def run(self) -> None:
        print("hello from stdout", flush=True)
        print("hello from stderr", file=sys.stderr, flush=True)


class UntilStopped:
    """Cooperative: checks jd.stop_requested()."""

    def run(self) -> None:
        while not jd.wait_for_stop(0.05):
            pass


class Stubborn:
    """Ignores the stop event and SIGTERM, swallowing KeyboardInterrupt: only SIGKILL ends it."""

    def run(self) -> None:
        import signal

        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        while True:
            try:
                time.sleep(0.05)
            except KeyboardInterrupt:
                pass


class SavesAtStop:
    """Saves for `seconds` once stopped (as a learner's checkpoint at the stop), then writes
    "saved" to `path`, and takes `exit_seconds` more to end (a loaded machine's teardown); it
    takes no other notice of the stop's SIGTERM or interrupt."""

    def __init__(self, path: str, seconds: float, exit_seconds: float = 0.0) -> None:
        self._path, self._seconds, self._exit_seconds = path, seconds, exit_seconds

    def run(self) -> None:
        jd.wait_for_stop()
        with jd.saving_checkpoint():
            with open(self._path, "w") as marker:
                marker.write("saving")
            time.sleep(self._seconds)
            with open(self._path, "w") as marker:
                marker.write("saved")
        time.sleep(self._exit_seconds)


class WithGrandchild:
    """Starts a long-lived subprocess of its own, so a stop must reach its whole tree."""

    def __init__(self) -> None:
        self._child = subprocess.Popen(["sleep", "600"])

    def grandchild_pid(self) -> int:
        return self._child.pid


class SelfKilling:
    def run(self) -> None:
        time.sleep(0.2)
        os.kill(os.getpid(), 9)


def stop_after(seconds: float) -> None:
    time.sleep(seconds)
    jd.stop()


def names_itself_and_stops() -> None:
    """Writes the node's name, as ``current_node()`` gives it, into its run directory, then ends the program."""
    node = jd.current_node()
    with open(os.path.join(node.run_dir, "node_name"), "w") as f:
        f.write(node.node_name)
    jd.stop()


def stops_saying_why(why: str) -> None:
    jd.stop(why)


def call_counter(counter, times: int) -> None:
    for _ in range(times):
        counter.increment()
    print(f"counter at {counter.increment()}", flush=True)


def call_counter_forever_uncooperative() -> None:
    while True:
        time.sleep(0.01)


def print_env(name: str) -> None:
    print(f"{name}={os.environ.get(name)}", flush=True)


class Pinger:
    """Calls its colocated peer from its constructor and in run()."""

    def __init__(self, peer) -> None:
        self._peer = peer
        self.first = peer.increment()

    def run(self) -> None:
        print(f"pinger pid {os.getpid()} peer pid {self._peer.pid()} first {self.first}", flush=True)


class CrashesOnStarts:
    """Counts its starts in a file and dies by SIGKILL while being built on the listed ones."""

    def __init__(self, counter_file: str, crash_on: list[int]) -> None:
        with open(counter_file, "a+") as starts:
            starts.write("start\n")
        with open(counter_file) as starts:
            self.starts = len(starts.readlines())
        if self.starts in crash_on:
            os.kill(os.getpid(), 9)

    def starts_seen(self) -> int:
        return self.starts

    def pid(self) -> int:
        return os.getpid()


class AlwaysCrashes:
    def run(self) -> None:
        raise RuntimeError("crash loop")


def call_until(target, expected_starts: int) -> None:
    """Keeps calling a node that restarts under it, until it answers from the expected start.

    A call in flight when the node dies fails (UnavailableError: it may or may not have run);
    calls made while it is down wait for it to come back.
    """
    from jaxdist import courier

    starts, failed_calls = 0, 0
    while starts < expected_starts:
        try:
            starts = target.with_timeout(30).starts_seen()
        except courier.UnavailableError:
            failed_calls += 1
        time.sleep(0.05)
    print(f"reached start {expected_starts} ({failed_calls} calls cut by a crash)", flush=True)


class FinishesWithItsPeer:
    """Like a learner spanning processes: stops before other nodes and asks not to be
    interrupted. `report` says "running" once run() runs (a stop that comes before never starts
    it); after the stop it keeps calling its peer until `linger` seconds have passed, then holds
    the seconds from the stop to its last answered call. A refused call raises and leaves
    "running": how many calls fit in the linger depends on the machine's load, the last one's
    time does not."""

    stops_first = True

    def __init__(self, peer, report: str, linger: float) -> None:
        from jaxdist.launch import context

        context.finish_on_stop()
        self._peer, self._report, self._linger = peer.with_timeout(2.0), report, linger

    def run(self) -> None:
        with open(self._report, "w") as report:
            report.write("running")
        jd.wait_for_stop()
        stopped = time.monotonic()
        while True:
            self._peer.increment()
            served_for = time.monotonic() - stopped
            if served_for >= self._linger:
                break
            time.sleep(0.05)
        with open(self._report, "w") as report:
            report.write(f"{served_for:.3f}")


class SlowToDescribe(ConnectionError):
    def __str__(self) -> str:
        time.sleep(0.3)  # the worker's handler formats it: run() has ended, the handler has not
        return "a peer went away with the stop"


class RaisesAtStopClosesSlowly:
    """run() raises when the stop comes, an error slow to format; close() takes
    `close_seconds`, then writes `closed`. The stop's interrupt must not cut close() short."""

    def __init__(self, closed: str, close_seconds: float) -> None:
        self._closed, self._close_seconds = closed, close_seconds

    def run(self) -> None:
        jd.wait_for_stop()
        raise SlowToDescribe()

    def close(self) -> None:
        time.sleep(self._close_seconds)
        with open(self._closed, "w") as marker:
            marker.write("closed")


class CountsOverlap:
    """Records how many of its calls ran at once."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._now = 0
        self.most = 0

    def slow(self) -> None:
        with self._lock:
            self._now += 1
            self.most = max(self.most, self._now)
        time.sleep(0.2)
        with self._lock:
            self._now -= 1

    def overlap(self) -> int:
        return self.most


class CleansUp:
    """Writes ``<path>`` when its run() ends: its cleanup ran."""

    def __init__(self, path: str) -> None:
        self._path = path

    def run(self) -> None:
        try:
            jd.wait_for_stop()
        finally:
            with open(self._path, "w") as f:
                f.write("cleaned up")


class StopsInConstructor:
    """Asks for the stop while being built (as a node finding nothing to do might)."""

    def __init__(self) -> None:
        jd.stop()


class BuiltUntilStopped:
    """Blocks in its constructor until the stop, then cleans up for `seconds`."""

    def __init__(self, seconds: float) -> None:
        jd.wait_for_stop()
        time.sleep(seconds)


class HangsInConstructor:
    """Never finishes being built, deaf to the stop (as a learner deadlocked inside XLA was)."""

    def __init__(self) -> None:
        time.sleep(3600)


class Peer:
    """`peer_pid()` asks its peer, through the handle it was configured with, for the peer's pid."""

    def __init__(self, peer) -> None:
        self._peer = peer

    def pid(self) -> int:
        return os.getpid()

    def peer_pid(self) -> int:
        return self._peer.pid()


class RunFails:
    """A served `answer()` and a `run()` that fails: with `disable_run()` only the first is used."""

    def answer(self) -> int:
        return 42

    def run(self) -> None:
        raise RuntimeError("run() was called although it was disabled")


class Sleeper:
    def sleep(self, seconds: float) -> float:
        time.sleep(seconds)
        return seconds


class CallsWithItsTimeout:
    """Reports how a call through its handle, which carries its own client options, ends."""

    def __init__(self, sleeper) -> None:
        self._sleeper = sleeper

    def outcome(self, seconds: float) -> str:
        try:
            return f"answered {self._sleeper.sleep(seconds)}"
        except Exception as exc:  # the deadline is the point
            return type(exc).__name__


class Indexed:
    """A node that knows its index in its group: what a group's factory gives each member."""

    def __init__(self, index: int) -> None:
        self._index = index

    def index(self) -> int:
        return self._index

    def pid(self) -> int:
        return os.getpid()


def scalable_program(workers: int = 2) -> jd.Program:
    """A counter and a group of ``workers`` that scales (the tests of ``running.scale``)."""
    program = jd.Program("scaling")
    with program.group("counter"):
        program.add_node(jd.CourierNode(Counter))
    program.add_group("worker", indexed_node, workers)
    return program


def indexed_node(index: int) -> jd.CourierNode:
    """The factory of a group that scales (`Program.add_group`)."""
    return jd.CourierNode(Indexed, index)


class JaxPlatform:
    """Where this process's JAX runs, the platforms it was told (``JAX_PLATFORMS``) and its CPU
    device count (``XLA_FLAGS``)."""

    def where(self) -> dict[str, str | int]:
        import jax

        return {"backend": jax.default_backend(), "told": jax.config.jax_platforms or "",
                "cpu_devices": len(jax.devices("cpu"))}


class JaxReport:
    """Says how JAX is configured in its process, as a fresh import there would have read it."""

    def report(self) -> dict:
        import jax

        return {"x64": jax.config.jax_enable_x64, "precision": jax.config.jax_default_matmul_precision,
                "devices": len(jax.devices()), "late": os.environ.get("JAXDIST_LATE")}

    def pid(self) -> int:
        return os.getpid()

    def fresh_state(self) -> dict:
        """What a fresh process starts with that a careless fork would share or add."""
        import logging

        import numpy as np

        return {"draw": int(np.random.randint(2**62)), "root_handlers": len(logging.root.handlers)}

    def malloc_arenas(self, threads: int = 8) -> int:
        """glibc's arenas once `threads` threads have allocated at once (each new thread that
        allocates gets an arena of its own until the process's limit is reached)."""
        import ctypes
        import ctypes.util
        import re
        import tempfile
        import threading

        libc = ctypes.CDLL(ctypes.util.find_library("c"))
        libc.fdopen.restype = ctypes.c_void_p
        together = threading.Barrier(threads)

        def allocate() -> None:
            together.wait()
            kept = [bytearray(1000) for _ in range(1000)]  # noqa: F841 - held while the others allocate
            together.wait()

        workers = [threading.Thread(target=allocate) for _ in range(threads)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
        with tempfile.TemporaryFile("w+") as report:
            stream = libc.fdopen(os.dup(report.fileno()), b"w")
            libc.malloc_info(0, ctypes.c_void_p(stream))
            libc.fclose(ctypes.c_void_p(stream))
            report.seek(0)
            return len(re.findall(r"<heap nr=", report.read()))
