"""What code inside a launched node can ask of its program: `jd.stop()`, stop checks, and
`current_node()` (its name and run directory)."""

from __future__ import annotations

import contextlib
import contextvars
import threading
from collections.abc import Callable, Iterator

from jaxdist.program import NodeContext

_stop_event = threading.Event()
_interrupt_waived = threading.Event()
_request_stop: Callable[[str | None], None] | None = None
_current_node: contextvars.ContextVar[NodeContext | None] = contextvars.ContextVar("current_node", default=None)


def install(request_stop: Callable[[str | None], None]) -> threading.Event:
    """Called by a launcher in each process it runs nodes in; ``request_stop`` takes the reason
    a node gave ``stop()`` (see ``stop_reason``)."""
    global _request_stop
    _request_stop = request_stop
    _stop_event.clear()
    _interrupt_waived.clear()
    return _stop_event


def uninstall() -> None:
    """Called when a launch in this process is over: no stop is pending any more."""
    global _request_stop
    _request_stop = None
    _stop_event.clear()


def stop(reason: str | None = None) -> None:
    """Stop the whole program this node belongs to (returns at once; teardown follows). The
    launch reports ``reason`` as why the program stopped (``Running.stop_reason``), with the
    node that asked: a program that ends itself can say why in words its user reads."""
    if _request_stop is None:
        raise RuntimeError("jd.stop() was called outside a launched program; use Running.stop() instead")
    _request_stop(reason)


def stop_reason(reason: str | None, node_name: str) -> str:
    """How a launch reports a stop that node ``node_name`` asked for with ``reason``."""
    return f"jd.stop() was called in node '{node_name}'" if reason is None else f"{reason} (node '{node_name}')"


def stop_requested() -> bool:
    """Whether the program is stopping: long `run()` loops should check it and return."""
    return _stop_event.is_set()


def wait_for_stop(timeout: float | None = None) -> bool:
    """Block until the program is stopping (True) or `timeout` passes (False)."""
    return _stop_event.wait(timeout)


def stop_event() -> threading.Event:
    """The event set when the program is stopping, to wait on beside other events (set by the
    launcher only: to stop the program, call `stop()`)."""
    return _stop_event


def finish_on_stop() -> None:
    """Ask the launcher not to interrupt this process's `run()` after a stop: it returns by
    itself, within the grace period. A learner spanning processes must step on to the step they
    all stop at; cut short, it would leave the others waiting in a collective."""
    _interrupt_waived.set()


def interrupt_waived() -> bool:
    return _interrupt_waived.is_set()


def current_node() -> NodeContext | None:
    """The node being constructed or run in this thread (name, run_dir), or None outside one.

    Set by node executables around the node's constructor and `run()` (CourierNode, PyNode), so
    an object can find `<run_dir>/checkpoints/<node name>` without being told.
    """
    return _current_node.get()


@contextlib.contextmanager
def node_context(node: NodeContext) -> Iterator[None]:
    """`current_node()` is `node` inside this block, in this thread only."""
    token = _current_node.set(node)
    try:
        yield
    finally:
        _current_node.reset(token)
