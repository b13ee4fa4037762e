"""jaxdist: Launchpad's programming model for JAX reinforcement learning.

    p = jd.Program("name"); h = p.add_node(jd.CourierNode(Cls, ...)); jd.launch(p).wait()
"""

import importlib
import sys
from typing import Any


def _excepthook(kind: type[BaseException], value: BaseException, tb: Any, _previous: Any = sys.excepthook) -> None:
    """A Ctrl-C that lands while a script's modules load (its first seconds: JAX and the rest
    import) is one line: a traceback of nothing but imports tells nothing. Anything else, a
    Ctrl-C in a function included, goes on as before."""
    frames, walk = [], tb
    while walk is not None:
        frames.append(walk.tb_frame.f_code)
        walk = walk.tb_next
    importing = any(code.co_name == "<module>" or code.co_filename.startswith("<frozen importlib")
                    for code in frames[1:])  # frames[0]: the script's own body
    if issubclass(kind, KeyboardInterrupt) and importing:
        print("stopped by Ctrl-C while starting (importing)", file=sys.stderr)
    else:
        _previous(kind, value, tb)


sys.excepthook = _excepthook

__version__ = "0.2.0.dev0"
"""The release this tree will become; what each release changed for users is in CHANGELOG.md."""

from jaxdist import courier

from jaxdist.records import metrics
from jaxdist.nodes import replay
from jaxdist.launch import (LaunchError, NodeFailedError, Restart, Running, current_node, finish_on_stop, launch,
                            log_path, run_dir_holder, saving_checkpoint, stop, stop_requested, wait_for_stop)
from jaxdist.launch.placement import on_host, per_host, spread
from jaxdist.nodes.cacher import CacherNode
from jaxdist.nodes.colocation import ColocationNode
from jaxdist.nodes.courier_node import CourierNode
from jaxdist.nodes.parameter_server import ParameterServer, VariableClient
from jaxdist.nodes.py_node import PyNode
from jaxdist.nodes.replay import ReplayNode
from jaxdist.tools.pool import Pool
from jaxdist.program import Handle, Node, Program

# These import JAX; programs that do not use them (the non-RL examples) should not pay for it.
_LAZY = {**{name: "jaxdist.nodes.learner" for name in ("CheckpointOptions", "Learner", "PublishOptions", "ReplaySource")},
         "LearnerLogic": "jaxdist.learning.learner_logic"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'jaxdist' has no attribute {name!r}")


__all__ = [
    "__version__",
    "CacherNode",
    "CheckpointOptions",
    "ColocationNode",
    "CourierNode",
    "Handle",
    "LaunchError",
    "Learner",
    "LearnerLogic",
    "Node",
    "NodeFailedError",
    "ParameterServer",
    "PublishOptions",
    "Pool",
    "Program",
    "PyNode",
    "ReplayNode",
    "Restart",
    "ReplaySource",
    "Running",
    "VariableClient",
    "courier",
    "current_node",
    "finish_on_stop",
    "launch",
    "log_path",
    "metrics",
    "on_host",
    "per_host",
    "replay",
    "run_dir_holder",
    "saving_checkpoint",
    "spread",
    "stop",
    "stop_requested",
    "wait_for_stop",
]
