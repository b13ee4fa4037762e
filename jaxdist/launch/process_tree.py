"""Finding and signalling a process's whole tree, so a stop leaves no orphan behind."""

from __future__ import annotations

import os
import signal


def descendants(pid: int) -> list[int]:
    """Every live process below `pid`, read from /proc (children first found, then theirs)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as stat:
                fields = stat.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(entry))
    found, frontier = [], [pid]
    while frontier:
        below = children.get(frontier.pop(), [])
        found.extend(below)
        frontier.extend(below)
    return found


def signal_tree(pid: int, sig: int) -> None:
    """Signal `pid`, its process group (it leads one) and every descendant; the gone are skipped."""
    targets = [pid, *descendants(pid)]
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass
    for target in targets:
        try:
            os.kill(target, sig)
        except (ProcessLookupError, PermissionError):
            pass


def describe_exit(exitcode: int | None) -> str:
    if exitcode is None:
        return "is still running"
    if exitcode < 0:
        try:
            return f"was killed by {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"was killed by signal {-exitcode}"
    return f"exited with code {exitcode}"
