"""jaxdist: Launchpad's programming model for JAX reinforcement learning.

    p = jd.Program("name"); h = p.add_node(jd.CourierNode(Cls, ...)); jd.launch(p).wait()
"""

from jaxdist import courier
from jaxdist.nodes import replay
from jaxdist.launch import NodeFailedError, Running, launch, stop, stop_requested, wait_for_stop
from jaxdist.nodes.cacher import CacherNode
from jaxdist.nodes.colocation import ColocationNode
from jaxdist.nodes.courier_node import CourierNode
from jaxdist.nodes.parameter_server import ParameterServer, VariableClient
from jaxdist.nodes.py_node import PyNode
from jaxdist.nodes.replay import ReplayNode
from jaxdist.program import Handle, Node, Program

__all__ = [
    "CacherNode",
    "ColocationNode",
    "CourierNode",
    "Handle",
    "Node",
    "NodeFailedError",
    "ParameterServer",
    "Program",
    "PyNode",
    "ReplayNode",
    "Running",
    "VariableClient",
    "courier",
    "launch",
    "replay",
    "stop",
    "stop_requested",
    "wait_for_stop",
]
