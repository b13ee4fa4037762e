"""`launch(program, launcher=...)`: a launcher is a module `jaxdist.launch.launchers.<name>` with a
`launch(program, **options) -> Running` function, so a new launcher is a new file there."""

from __future__ import annotations

import importlib
import pkgutil
from typing import Any

from jaxdist.launch.context import current_node, stop, stop_requested, wait_for_stop
from jaxdist.launch.restart import Restart
from jaxdist.launch.running import NodeFailedError, Running
from jaxdist.launch import launchers
from jaxdist.program import Program


def available_launchers() -> list[str]:
    return sorted(module.name for module in pkgutil.iter_modules(launchers.__path__))


def launch(program: Program, launcher: str = "processes", **options: Any) -> Running:
    """Start `program` with the named launcher; options go to that launcher's `launch`."""
    if launcher not in available_launchers():
        raise ValueError(f"unknown launcher {launcher!r}; available: {', '.join(available_launchers())}")
    module = importlib.import_module(f"jaxdist.launch.launchers.{launcher}")
    return module.launch(program, **options)


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
