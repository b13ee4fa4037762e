"""Chaos: 25 launch/stop cycles of a small program under the processes launcher leave nothing behind.

Each cycle launches a service, a runner that calls it until stopped, and a colocation (a service
and a caller of it; in processes mode every fifth cycle), calls the service from here, and stops
the program. Right after every launch each node is running; after every cycle no process
carrying this test's environment marker is alive and this process has no zombie child; across
the cycles the launching process's open file descriptors and threads do not grow (20 cycles
after 5 to settle: a descriptor lost every fifth cycle, the processes-mode colocation's, still
shows as 4; the soak benchmark watches far longer runs).
"""

from __future__ import annotations

import multiprocessing
import os
import threading
import time
import uuid

import pytest

import chaos_nodes as cn
import jaxdist as jd
from jaxdist import courier

pytestmark = pytest.mark.slow

CYCLES = 25
MARKER_NAME = "JAXDIST_CHAOS_MARKER"


def make_program(cycle: int) -> jd.Program:
    program = jd.Program("cycles")
    with program.group("service"):
        service = program.add_node(jd.CourierNode(cn.Tally))
    with program.group("runner"):
        program.add_node(jd.PyNode(cn.call_until_stopped, service))
    mode = "processes" if cycle % 5 == 4 else "threads"
    pair = jd.ColocationNode([jd.CourierNode(cn.Tally), jd.PyNode(cn.call_until_stopped, jd.Handle("pair/0/0"))],
                             mode=mode)
    program.add_node(pair, label="pair")
    return program


def marked_processes(marker: str, exclude: set[int]) -> list[tuple[int, str]]:
    """(pid, command line) of live processes whose environment carries `marker`."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) in exclude:
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as environ:
                if marker.encode() not in environ.read():
                    continue
            with open(f"/proc/{entry}/cmdline", "rb") as cmdline:
                found.append((int(entry), cmdline.read().replace(b"\0", b" ").decode(errors="replace")[:200]))
        except OSError:
            continue
    return found


def zombie_children() -> list[int]:
    zombies = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] == "Z" and int(fields[1]) == os.getpid():
            zombies.append(int(entry))
    return zombies


def command_name(pid: int) -> str:
    """What a process (a zombie too) was: its command name, which outlives its command line."""
    try:
        with open(f"/proc/{pid}/comm") as comm:
            return comm.read().strip()
    except OSError:
        return "(gone)"


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def os_threads() -> int:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("Threads:"))


def resource_tracker_pid() -> int | None:
    """multiprocessing's resource tracker: one per launching process, started once, kept for good."""
    from multiprocessing import resource_tracker

    return getattr(resource_tracker._resource_tracker, "_pid", None)


def forkserver_pid() -> int | None:
    """The forkserver node processes are forked from: one per launching process, kept for good."""
    from multiprocessing import forkserver

    return getattr(forkserver._forkserver, "_forkserver_pid", None)


def wait_for_no_marked(marker: str, exclude: set[int], timeout: float = 30.0) -> list[tuple[int, str]]:
    deadline = time.monotonic() + timeout
    while (left := marked_processes(marker, exclude)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


def wait_for(condition, what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out after {timeout} s waiting for {what}"
        time.sleep(0.02)


@pytest.mark.timeout(600)  # ~12 s a cycle with both cores kept busy (--cpu-burners 2) under other load
def test_launch_stop_cycles_leave_no_process_fd_or_thread_behind(tmp_path, monkeypatch):
    marker = uuid.uuid4().hex
    monkeypatch.setenv(MARKER_NAME, marker)  # every node process inherits it, and their children
    fds, threads, py_threads, durations = [], [], [], []
    for cycle in range(CYCLES):
        began = time.monotonic()
        # A runner may be in a call to a peer that already stopped (it waits for the peer to come
        # back) when the stop reaches it: interrupt it after 0.5 s rather than the default 2 s.
        running = jd.launch(make_program(cycle), launcher="processes", run_dir=str(tmp_path / "run"), echo=False,
                            grace=5.0, interrupt_after=0.5)
        try:
            # launch() returns once every node runs: the processes launcher once set its started
            # event before marking the nodes running, and often returned with some "starting".
            states = {name: s["state"] for name, s in running.status().items()}
            assert set(states.values()) == {"running"}, f"cycle {cycle}: launch() returned with {states}"
            with courier.Client(running.addresses["service/0"], token=running.token, timeout=30) as client:
                assert client.increment() >= 1
        finally:
            running.stop()
        durations.append(time.monotonic() - began)
        status = running.status()
        assert {s["state"] for s in status.values()} == {"stopped"}, status
        assert all(s["exitcode"] == 0 for s in status.values()), status
        del running
        exclude = {os.getpid()} | ({resource_tracker_pid(), forkserver_pid()} - {None})
        left = wait_for_no_marked(marker, exclude)
        assert left == [], f"cycle {cycle}: processes left behind: {left}"
        zombies = zombie_children()
        assert zombies == [], f"cycle {cycle}: zombie children {[(pid, command_name(pid)) for pid in zombies]}"
        fds.append(open_fds())
        threads.append(os_threads())
        py_threads.append(threading.active_count())

    print(f"\n{CYCLES} launch/stop cycles: {sum(durations):.1f} s (median {sorted(durations)[CYCLES // 2]:.2f} s "
          f"a cycle); open fds {fds[0]} -> {fds[-1]} (max {max(fds)}), OS threads {threads[0]} -> {threads[-1]} "
          f"(max {max(threads)}), Python threads {py_threads[0]} -> {py_threads[-1]}, "
          f"live multiprocessing children {len(multiprocessing.active_children())}")
    # After a few cycles every pool and cache has its size: from there on nothing may grow.
    settled = 5
    assert max(fds[settled:]) <= fds[settled - 1] + 2, fds
    assert max(threads[settled:]) <= threads[settled - 1] + 4, threads
    assert max(py_threads[settled:]) <= py_threads[settled - 1], py_threads
    assert multiprocessing.active_children() == []


def test_a_node_blocked_in_a_call_when_the_program_stops_exits_cleanly(tmp_path):
    """A stop cuts the calls a node's run() is blocked in (its peer's server goes away, or the
    worker cancels them after ``interrupt_after``); the error that run() then raises is part of
    the stop, not a failure. The worker reports it as one (exit code 1, a traceback), and the
    KeyboardInterrupt it sends next can land inside its own error handler and escape ``serve``."""
    program = jd.Program("blocked")
    with program.group("service"):
        service = program.add_node(jd.CourierNode(cn.Tally))
    with program.group("caller"):
        program.add_node(jd.PyNode(cn.block_in_call, service))
    for attempt in range(2):
        running = jd.launch(program, launcher="processes", run_dir=str(tmp_path / str(attempt)), echo=False,
                            interrupt_after=0.5)
        with courier.Client(running.addresses["service/0"], token=running.token, timeout=30) as client:
            wait_for(lambda: client.sleepers() == 1, "the caller to be in its call")
        running.stop()
        status = running.status()
        assert {name: (s["state"], s["exitcode"]) for name, s in status.items()} == \
            {"service/0": ("stopped", 0), "caller/0": ("stopped", 0)}
        with open(tmp_path / str(attempt) / "logs" / "caller-0.log") as log:
            assert "Traceback" not in log.read()
