"""`launch(program, launcher=...)`: a launcher is a module `jaxdist.launch.launchers.<name>` with a
`launch(program, **options) -> Running` function, so a new launcher is a new file there."""

from __future__ import annotations

import importlib
import pkgutil
import sys
from typing import Any

from jaxdist.launch.context import current_node, stop, stop_requested, wait_for_stop
from jaxdist.launch.restart import Restart
from jaxdist.launch.running import RUNNING, NodeFailedError, Running
from jaxdist.launch import launchers
from jaxdist.program import Program


def available_launchers() -> list[str]:
    return sorted(module.name for module in pkgutil.iter_modules(launchers.__path__))


NO_MAIN_GUARD = (
    "error: jd.launch() ran again while a node's process was importing your script: node processes "
    "import the script that launched them, so put the launch under `if __name__ == \"__main__\":` "
    "(build the program in a function and call it there)")


def _importing_main_for_a_node() -> bool:
    """Whether this is a spawned child still importing the parent's main module: a script without
    the main guard launches again there (multiprocessing then fails with a long traceback)."""
    import multiprocessing

    return bool(getattr(multiprocessing.current_process(), "_inheriting", False))


def launch(program: Program, launcher: str = "processes", **options: Any) -> Running:
    """Start `program` with the named launcher; options go to that launcher's `launch`."""
    if _importing_main_for_a_node():
        raise SystemExit(NO_MAIN_GUARD)
    if launcher not in available_launchers():
        raise ValueError(f"unknown launcher {launcher!r}; available: {', '.join(available_launchers())}")
    module = importlib.import_module(f"jaxdist.launch.launchers.{launcher}")
    running = module.launch(program, **options)
    if launcher != "multihost" and "units" not in options:  # the whole program is here
        _say_if_nothing_runs(running)
    return running


def _say_if_nothing_runs(running: Running) -> None:
    """A program of services alone never ends by itself: `wait()` would block without a word."""
    statuses = running.status().values()
    if statuses and not any(status["has_run"] or status["state"] != RUNNING for status in statuses):
        print(f"note: no node of program '{running.program_name}' has a run() method, so it serves until "
              f"stopped: jd.stop() from a served method, Running.stop(), or Ctrl-C", file=sys.stderr, flush=True)


__all__ = [
    "NodeFailedError",
    "Restart",
    "Running",
    "available_launchers",
    "current_node",
    "launch",
    "stop",
    "stop_requested",
    "wait_for_stop",
]
