"""Finding a test's processes after it: every process it starts carries a marker in its
environment (children inherit it), so one left behind is found however deep it was started."""

from __future__ import annotations

import os

import psutil


def processes_with_marker(marker: str) -> list[int]:
    """Pids of live processes (zombies aside) whose environment carries `marker`, this one aside."""
    found = []
    for process in psutil.process_iter(["environ"]):
        environ = process.info["environ"] or {}  # None where it may not be read
        if process.pid != os.getpid() and alive(process.pid) and \
                any(marker in f"{name}={value}" for name, value in environ.items()):
            found.append(process.pid)
    return found


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
