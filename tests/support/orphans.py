"""Finding a test's processes: a node's by the log it writes, and those left behind after the
test by a marker in their environment (children inherit it), however deep they were started."""

from __future__ import annotations

import contextlib
import os

import psutil

from jaxdist.launch.output import log_path


def node_process(root: int, run_dir: str, node: str) -> psutil.Process | None:
    """The process below `root` that runs `node`: the one writing the node's log (each node
    process opens its own), or None while none does."""
    log = log_path(run_dir, node)
    for child in psutil.Process(root).children(recursive=True):
        with contextlib.suppress(psutil.Error):
            if any(f.path == log for f in child.open_files()):
                return child
    return None


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
