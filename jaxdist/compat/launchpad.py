"""Launchpad's public API over jaxdist: ``import jaxdist.compat.launchpad as lp`` and a program
written for Launchpad runs on jaxdist's launchers.

What maps: `Program`, `PyNode`, `CourierNode` and handles are jaxdist's own (Launchpad's model
is jaxdist's); `PyClassNode` constructs its class and calls `run()`; `MultiThreadingColocation`
is a threads `ColocationNode`; `ReverbNode` serves jaxdist replay tables (its handle becomes a
courier client of that replay node, to wrap in `jd.replay.ReplayClient`, not a `reverb.Client`:
Reverb needs TensorFlow); `batched_handler` is courier's; `launch` runs LOCAL_MULTI_THREADING on
the ``threads`` launcher and LOCAL_MULTI_PROCESSING on ``processes``, and the TEST_* types the
same way, stopped with the test. The stop functions are jaxdist's. A `CourierNode`'s handles
call without a deadline, as Launchpad's do, and its `courier_kwargs` are its server's options.

What does not: a *function* given to `CourierNode` is run as the node's body (Launchpad builds
the node by calling it, which for the functions in its examples is the same thing), so a
factory whose result should be served must be given as a class; there is no XManager, Vertex
AI or Docker launch; `terminal` choices print through jaxdist's prefixed output. See
docs/guides/from-launchpad-and-reverb.md.
"""

from __future__ import annotations

import dataclasses
import datetime
import enum
import inspect
import tempfile
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jaxdist as jd
from jaxdist import courier
from jaxdist.launch import context
from jaxdist.nodes.replay.node import ReplayNode

Program = jd.Program
PyNode = jd.PyNode
CourierClient = courier.Client
stop_event = context.stop_event


class LaunchType(enum.Enum):
    """Launchpad's local launch types (also accepted as their flag values, ``"local_mt"``, ...)."""

    LOCAL_MULTI_THREADING = "local_mt"
    LOCAL_MULTI_PROCESSING = "local_mp"
    TEST_MULTI_THREADING = "test_mt"
    TEST_MULTI_PROCESSING = "test_mp"


_LAUNCHERS = {
    LaunchType.LOCAL_MULTI_THREADING: "threads",
    LaunchType.LOCAL_MULTI_PROCESSING: "processes",
    LaunchType.TEST_MULTI_THREADING: "threads",
    LaunchType.TEST_MULTI_PROCESSING: "processes",
}
_launched: list[jd.Running] = []


@dataclasses.dataclass
class PythonProcess:
    """`local_resources` of a LOCAL_MULTI_PROCESSING group: environment variables for its processes."""

    env: dict[str, str] = dataclasses.field(default_factory=dict)


class CourierNode(jd.CourierNode):
    """Launchpad's CourierNode: a class (or a function, run as the node's body) and its
    arguments; `courier_kwargs` are its server's options. Its handles' calls have no deadline,
    as Launchpad's (jaxdist's handles default to courier's 30 s)."""

    def __init__(self, constructor: Callable[..., Any], *args: Any, courier_kwargs: dict | None = None,
                 **kwargs: Any) -> None:
        if inspect.isfunction(constructor):
            super().__init__(_FunctionBody, constructor, args, kwargs)
            self.function_name = constructor.__name__
        else:
            super().__init__(constructor, *args, **kwargs)
            self.function_name = None
        self.with_server(**(courier_kwargs or {}))

    def default_label(self) -> str:
        return self.function_name or super().default_label()

    def create_handle(self) -> jd.Handle:
        return super().create_handle().with_options(timeout=None)


class _FunctionBody:
    def __init__(self, function: Callable[..., Any], args: tuple, kwargs: dict) -> None:
        self._function, self._args, self._kwargs = function, args, kwargs

    def run(self) -> None:
        self._function(*self._args, **self._kwargs)


class PyClassNode(jd.PyNode):
    """A node that constructs `cls(*args, **kwargs)` and calls its `run()`; it serves nothing."""

    def __init__(self, cls: type, *args: Any, **kwargs: Any) -> None:
        super().__init__(_construct_and_run, cls, *args, **kwargs)
        self.cls = cls

    def default_label(self) -> str:
        return self.cls.__name__.lower()


def _construct_and_run(cls: type, *args: Any, **kwargs: Any) -> None:
    instance = cls(*args, **kwargs)
    if hasattr(instance, "run"):
        instance.run()


class MultiThreadingColocation(jd.ColocationNode):
    """Nodes run as threads of one process (a threads `jd.ColocationNode`)."""

    def __init__(self, nodes: Sequence[jd.Node], return_on_first_completed: bool = False) -> None:
        super().__init__(nodes, mode="threads", return_on_first_completed=return_on_first_completed)


class ReverbNode(ReplayNode):
    """Replay tables served by a jaxdist `ReplayNode`. `priority_tables_fn` returns jaxdist
    tables, as a ``{name: table}`` dict (Reverb's tables carry their names; jaxdist's are named
    by the node); checkpoints are Orbax's, every `checkpoint_time_delta_minutes`."""

    def __init__(self, priority_tables_fn: Callable[[], Any], checkpoint_ctor: Any = None,
                 checkpoint_time_delta_minutes: float | None = None) -> None:
        if checkpoint_ctor is not None:
            raise ValueError("ReverbNode(checkpoint_ctor=...) makes a Reverb checkpointer, which needs TensorFlow; "
                             "jaxdist's replay checkpoints itself with Orbax: pass checkpoint_time_delta_minutes")
        tables = priority_tables_fn()
        if not isinstance(tables, Mapping):
            raise TypeError(f"priority_tables_fn must return a {{name: table}} dict of jaxdist replay tables "
                            f"(jd.replay.Uniform(...), ...), got {type(tables).__name__}")
        every = None if checkpoint_time_delta_minutes is None else 60.0 * checkpoint_time_delta_minutes
        super().__init__(dict(tables), checkpoint_every_seconds=every)


def batched_handler(batch_size: int, max_parallelism: int = 1,
                    timeout: datetime.timedelta = datetime.timedelta(milliseconds=200),
                    pad_batch: bool = False) -> Callable[[Callable[..., Any]], Any]:
    """courier.batched_handler, its timeout a timedelta as Launchpad's."""
    seconds = timeout.total_seconds() if isinstance(timeout, datetime.timedelta) else float(timeout)
    return courier.batched_handler(batch_size, max_parallelism, seconds, pad_batch)


def launch(program: jd.Program, launch_type: LaunchType | str | None = None, xm_resources: Any = None,
           local_resources: Mapping[str, PythonProcess] | None = None, test_case: Any = None,
           terminal: str | None = None, serialize_py_nodes: bool | None = None) -> jd.Running:
    """Launch `program` (LOCAL_MULTI_THREADING by default, as Launchpad's flag does). A local
    launch returns once the program is over: Launchpad's returns at once and waits for it at
    exit, but Python stops its thread pools before exit handlers run. A test launch returns at
    once and is stopped with `test_case` (its ``addCleanup``); it runs in a fresh directory, so
    no checkpoint of an earlier test is restored."""
    launch_type = LaunchType(launch_type) if launch_type is not None else LaunchType.LOCAL_MULTI_THREADING
    if xm_resources is not None:
        raise ValueError("xm_resources is for XManager, which jaxdist does not launch on; see jd.launch's "
                         "launchers (processes, multihost, ray)")
    testing = launch_type in (LaunchType.TEST_MULTI_THREADING, LaunchType.TEST_MULTI_PROCESSING)
    options: dict[str, Any] = {"run_dir": tempfile.mkdtemp(prefix=f"lp-test-{program.name}-")} if testing else {}
    if local_resources:
        if _LAUNCHERS[launch_type] != "processes":
            raise ValueError(f"local_resources set processes' environments: they need a *_MULTI_PROCESSING launch, "
                             f"not {launch_type.name}")
        options["resources"] = {label: {"env": dict(resource.env)} for label, resource in local_resources.items()}
    running = jd.launch(program, launcher=_LAUNCHERS[launch_type], **options)
    _launched.append(running)
    if testing:
        if test_case is not None:
            test_case.addCleanup(running.stop)
    else:
        running.wait()
    return running


def stop() -> None:
    """Stop the program: from inside a node, its own; from the process that launched it, every
    program launched here."""
    try:
        jd.stop()
    except RuntimeError:  # not inside a node: the launching process
        for running in _launched:
            running.request_stop("lp.stop()")


def make_program_stopper(launch_type: LaunchType | str | None = None) -> Callable[[], None]:
    """A function that stops the program, to hand to code that should be able to end it (the
    same for every launch type here)."""
    return stop


def wait_for_stop(timeout_secs: float | None = None) -> bool:
    """Block until the program is stopping (True) or `timeout_secs` pass (False)."""
    return jd.wait_for_stop(timeout_secs)


def register_stop_handler(handler: Callable[[], None]) -> None:
    """Call `handler()` (in a thread of its own) once the program is stopping."""

    def call_at_stop() -> None:
        stop_event().wait()
        handler()

    threading.Thread(target=call_at_stop, name="lp-stop-handler", daemon=True).start()


__all__ = [
    "CourierClient",
    "CourierNode",
    "LaunchType",
    "MultiThreadingColocation",
    "Program",
    "PyClassNode",
    "PyNode",
    "PythonProcess",
    "ReverbNode",
    "batched_handler",
    "launch",
    "make_program_stopper",
    "register_stop_handler",
    "stop",
    "stop_event",
    "wait_for_stop",
]
