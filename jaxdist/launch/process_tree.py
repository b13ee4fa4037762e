"""Finding and signalling a process's whole tree, so a stop leaves no orphan behind.

psutil walks the tree (from /proc on Linux, sysctl on macOS) and, unlike a bare pid, notices when
a pid was reused by another process between the walk and the signal.
"""

from __future__ import annotations

import contextlib
import os
import signal

import psutil


def _tree(pid: int) -> list[psutil.Process]:
    """`pid` and every live process below it, or [] when `pid` is gone."""
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return []


def descendants(pid: int) -> list[int]:
    """Every live process below `pid`: its children, theirs, and so on."""
    return [process.pid for process in _tree(pid)[1:]]


def signal_tree(pid: int, sig: int) -> None:
    """Signal `pid`, its process group (it leads one) and every descendant; the gone are skipped.

    The tree is walked before anything is signalled: once `pid` dies, its children are
    re-parented and no longer below it. The group reaches those that left the tree, the walk
    those that left the group.
    """
    tree = _tree(pid)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)
    for process in tree:
        with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
            process.send_signal(sig)


def describe_exit(exitcode: int | None) -> str:
    """A process's exit code in words, for error messages: "was killed by SIGKILL"."""
    if exitcode is None:
        return "is still running"
    if exitcode < 0:
        try:
            return f"was killed by {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"was killed by signal {-exitcode}"
    return f"exited with code {exitcode}"
