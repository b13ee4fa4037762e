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
_report_saving: Callable[[bool], None] | None = None
_saves_lock = threading.Lock()
_saves_under_way = 0
_current_node: contextvars.ContextVar[NodeContext | None] = contextvars.ContextVar("current_node", default=None)


def install(request_stop: Callable[[str | None], None],
            report_saving: Callable[[bool], None] | None = None) -> threading.Event:
    """Called by a launcher in each process it runs nodes in; ``request_stop`` takes the reason
    a node gave ``stop()`` (see ``stop_reason``), ``report_saving`` whether a checkpoint save is
    under way here (see ``saving_checkpoint``)."""
    global _request_stop, _report_saving
    _request_stop, _report_saving = request_stop, report_saving
    _stop_event.clear()
    _interrupt_waived.clear()
    return _stop_event


def uninstall() -> None:
    """Called when a launch in this process is over: no stop is pending any more."""
    global _request_stop, _report_saving
    _request_stop, _report_saving = None, None
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
    return _interrupt_waived.is_set() or saves_under_way()


@contextlib.contextmanager
def saving_checkpoint() -> Iterator[None]:
    """Mark the save that the next life restores from (a learner's, a replay's at the stop):
    while one is under way a stop neither interrupts this process nor kills it when its `grace`
    is over, but waits up to the launcher's `save_grace` more. Cut, the save would leave no
    checkpoint of the step the run stopped at, and a relaunch would repeat what came after
    the last one."""
    global _saves_under_way
    with _saves_lock:
        _saves_under_way += 1
        if _saves_under_way == 1 and _report_saving is not None:
            _report_saving(True)
    try:
        yield
    finally:
        with _saves_lock:
            _saves_under_way -= 1
            if _saves_under_way == 0 and _report_saving is not None:
                _report_saving(False)


def saves_under_way() -> bool:
    """Whether a `saving_checkpoint` block runs in this process now."""
    return _saves_under_way > 0


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
