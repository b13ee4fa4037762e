"""process_tree on real processes: a child that starts a grandchild, found and ended together."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from jaxdist.launch.process_tree import describe_exit, descendants, signal_tree

# A child in a session (and process group) of its own starts a sleeping grandchild, prints its
# pid, and sleeps, or exits at once. The grandchild stays in the child's group, or leaves it.
CHILD = """
import subprocess, sys, time
grandchild = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session={leave_group})
print(grandchild.pid, flush=True)
time.sleep({child_lives})
"""


@contextlib.contextmanager
def child_and_grandchild(*, leave_group: bool = False, child_lives: float = 60.0):
    child = subprocess.Popen([sys.executable, "-c", CHILD.format(leave_group=leave_group, child_lives=child_lives)],
                             stdout=subprocess.PIPE, text=True, start_new_session=True)
    grandchild = int(child.stdout.readline())
    try:
        yield child, grandchild
    finally:
        for pid in (child.pid, grandchild):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        child.wait()
        child.stdout.close()


def ended(pid: int, timeout: float = 10.0) -> bool:
    """Whether `pid` is gone (or a zombie nobody has reaped yet) within `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.02)
    return False


def test_descendants_finds_a_child_and_its_grandchild():
    with child_and_grandchild() as (child, grandchild):
        assert descendants(child.pid) == [grandchild]
        assert {child.pid, grandchild} <= set(descendants(os.getpid()))


@pytest.mark.parametrize("leave_group", [False, True], ids=["same group", "grandchild in its own group"])
def test_signal_tree_ends_the_child_and_the_grandchild(leave_group):
    with child_and_grandchild(leave_group=leave_group) as (child, grandchild):
        signal_tree(child.pid, signal.SIGTERM)
        assert child.wait(timeout=10) == -signal.SIGTERM
        assert ended(grandchild)


def test_signal_tree_reaches_through_the_group_a_grandchild_its_dead_parent_left_behind():
    with child_and_grandchild(child_lives=0) as (child, grandchild):
        child.wait(timeout=10)
        assert descendants(child.pid) == []  # the child is gone: nothing is below it any more
        assert not ended(grandchild, timeout=0.1)
        signal_tree(child.pid, signal.SIGKILL)
        assert ended(grandchild)


def test_a_pid_that_is_gone_has_no_descendants_and_signalling_it_is_harmless():
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    assert descendants(process.pid) == []
    signal_tree(process.pid, signal.SIGTERM)


def test_describe_exit_says_how_a_process_ended():
    assert describe_exit(None) == "is still running"
    assert describe_exit(0) == "exited with code 0"
    assert describe_exit(-signal.SIGKILL) == "was killed by SIGKILL"
    assert describe_exit(-200) == "was killed by signal 200"
