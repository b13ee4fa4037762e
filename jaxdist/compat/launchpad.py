"""Launchpad's public API over jaxdist: ``import jaxdist.compat.launchpad as lp`` and a program
written for Launchpad runs on jaxdist's launchers.

What maps: `Program` (with `get_all_nodes`), `PyNode`, `PyClassNode`, `CourierNode` (its
`courier_kwargs` go to its server, its `courier_client_kwargs` to its handles' clients, and a
class with `set_courier_server` starts and stops the node's server itself) and handles;
`MultiThreadingColocation` is a threads `ColocationNode`; `ReverbNode` serves jaxdist replay
tables (its handle becomes a courier client of that replay node, to wrap in
`jd.replay.ReplayClient`, not a `reverb.Client`: Reverb needs TensorFlow); `batched_handler`
is courier's; `launch` runs LOCAL_MULTI_THREADING on the ``threads`` launcher and
LOCAL_MULTI_PROCESSING on ``processes``, the TEST_* types the same way, stopped with the test,
and reads ``--lp_launch_type`` when given no type. It returns Launchpad's worker manager
(`jaxdist.compat.worker_manager`). The stop functions are jaxdist's. A `CourierNode`'s handles
call without a deadline, as Launchpad's do. Nodes see the launcher's absl flags and log through
absl's handler as it had it (`jaxdist.compat.absl_support`).

What does not is refused with an error that names the difference; see
docs/guides/from-launchpad-and-reverb.md.
"""

from __future__ import annotations

import datetime
import enum
import inspect
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from absl import flags

import jaxdist as jd
from jaxdist import courier
from jaxdist.compat import absl_support
from jaxdist.compat.worker_manager import WorkerManager
from jaxdist.courier.server import public_methods
from jaxdist.launch import context
from jaxdist.nodes.replay.node import ReplayNode
from jaxdist.program import Handle

CourierClient = courier.Client
stop_event = context.stop_event


class LaunchType(enum.Enum):
    """Launchpad's launch types (also accepted as their flag values, ``"local_mt"``, ...); jaxdist
    runs the local and test ones."""

    LOCAL_MULTI_THREADING = "local_mt"
    LOCAL_MULTI_PROCESSING = "local_mp"
    TEST_MULTI_PROCESSING = "test_mp"
    TEST_MULTI_THREADING = "test_mt"
    LOCAL_DOCKER = "local_docker"
    VERTEX_AI = "vertex_ai"


LAUNCH_TYPE = flags.DEFINE_enum(
    "lp_launch_type", LaunchType.LOCAL_MULTI_THREADING.value, [t.value for t in LaunchType],
    "How lp.launch() launches a program when it is given no launch_type.", allow_override=True)

_LAUNCHERS = {
    LaunchType.LOCAL_MULTI_THREADING: "threads",
    LaunchType.LOCAL_MULTI_PROCESSING: "processes",
    LaunchType.TEST_MULTI_THREADING: "threads",
    LaunchType.TEST_MULTI_PROCESSING: "processes",
}
_launched: list[jd.Running] = []


class PythonProcess:
    """`local_resources` of a LOCAL_MULTI_PROCESSING group: environment variables for its processes."""

    def __init__(self, args: Mapping[str, Any] | None = None, env: Mapping[str, str] | None = None) -> None:
        if args:
            raise ValueError(f"PythonProcess(args={dict(args)!r}): jaxdist gives a node's process no command-line "
                             "arguments of its own (every node sees the launcher's flags); pass env=... or set "
                             "the flags on the launcher's command line")
        self.env = dict(env or {})


class Program(jd.Program):
    """`jd.Program`, with Launchpad's `get_all_nodes`."""

    def get_all_nodes(self) -> list[jd.Node]:
        """Every node added, group by group (a colocation is one node)."""
        return self.nodes()

    def add_node(self, node: jd.Node, label: str | None = None) -> Any:
        if isinstance(node, jd.Node) and node.name:
            raise ValueError(f"node '{node.name}' was already added: a node object is added once in jaxdist "
                             f"(Launchpad lets one object be added twice, to run it twice); make a second node")
        return super().add_node(node, label)


class _AbslNode:
    """A node that carries the launching process's absl flags and logging to where it runs."""

    absl_state: absl_support.AbslState | None = None

    def executable(self, node_context: Any) -> Any:
        absl_support.enter_node(self.absl_state)
        return super().executable(node_context)  # type: ignore[misc]


class PyNode(_AbslNode, jd.PyNode):
    """`jd.PyNode`: runs a function; it serves nothing."""


class CourierNode(_AbslNode, jd.CourierNode):
    """Launchpad's CourierNode: a class (or a function, run as the node's body) and its
    arguments; `courier_kwargs` are its server's options, `courier_client_kwargs` its handles'
    clients' (Launchpad's `call_timeout` and `wait_for_ready`). Its handles' calls have no
    deadline unless given one, as Launchpad's (jaxdist's handles default to courier's 30 s). An
    object with `set_courier_server(server)` gets the node's server, not yet serving it: its
    `server.Start()` serves the object, `server.Stop()` stops the server."""

    def __init__(self, constructor: Callable[..., Any], *args: Any, courier_kwargs: Mapping[str, Any] | None = None,
                 courier_client_kwargs: Mapping[str, Any] | None = None, **kwargs: Any) -> None:
        if inspect.isfunction(constructor):
            super().__init__(_FunctionBody, constructor, args, kwargs)
            self.function_name = constructor.__name__
        else:
            super().__init__(constructor, *args, **kwargs)
            self.function_name = None
        self.client_options = client_options(courier_client_kwargs or {})
        self.with_server(**server_options(courier_kwargs or {}))

    def default_label(self) -> str:
        return self.function_name or super().default_label()

    def create_handle(self) -> "CourierHandle":
        return CourierHandle(self, **self.client_options)

    def serve(self, server: courier.Server, obj: Any) -> None:
        if callable(getattr(obj, "set_courier_server", None)):
            obj.set_courier_server(CourierServer(server, obj))
        else:
            server.attach(obj)


class CourierHandle(Handle):
    """A CourierNode's handle, with Launchpad's `set_client_kwargs`."""

    def set_client_kwargs(self, **kwargs: Any) -> None:
        """Replace the options of the clients this handle becomes (Launchpad's client keywords)."""
        self._client_options = client_options(kwargs)


def server_options(kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """Launchpad's `courier_kwargs` as `courier.Server` options: its `thread_pool_size` and
    courier's own; not `port` or `name` (the launcher gives every server its address)."""
    allowed = sorted(set(inspect.signature(courier.Server).parameters) - {"obj", "address", "token", "tls"})
    unknown = sorted(set(kwargs) - set(allowed))
    if unknown:
        raise TypeError(f"courier_kwargs {unknown} are not options of jaxdist's courier server (the launcher gives "
                        f"every node's server its address, so no port or name); its options: {', '.join(allowed)}")
    return dict(kwargs)


def client_options(kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """Launchpad's courier client keywords as `courier.Client` options; no deadline unless
    `call_timeout` (seconds or a timedelta; None or 0: none) says one."""
    options: dict[str, Any] = {"timeout": None}
    for key, value in kwargs.items():
        if key == "call_timeout":
            seconds = value.total_seconds() if isinstance(value, datetime.timedelta) else value
            options["timeout"] = float(seconds) if seconds else None
        elif key == "wait_for_ready":
            options["wait_for_ready"] = bool(value)
        elif key == "compress" and not value:
            pass
        else:
            raise TypeError(f"courier client option {key}={value!r} is not one jaxdist's courier has (it does not "
                            f"compress, chunk or balance load); the options it maps: call_timeout, wait_for_ready")
    return options


class CourierServer:
    """The node's server as a `set_courier_server` object sees it: `Start()` serves the object
    (callers wait for it until then, as for a server that is not up yet), `Stop()` stops the
    server, `Join()` waits for that."""

    def __init__(self, server: courier.Server, obj: Any) -> None:
        self._server, self._object = server, obj
        self._started, self._stopped = False, threading.Event()

    @property
    def address(self) -> str:
        return self._server.address

    @property
    def has_started(self) -> bool:
        return self._started

    def Start(self) -> None:  # noqa: N802 - Launchpad's name
        """Serve the object's methods (once)."""
        if self._started:
            raise ValueError("Server already started")
        self._started = True
        self._server.attach(_served(self._object))

    def Stop(self) -> None:  # noqa: N802 - Launchpad's name
        """Stop the server: calls in flight get a second to finish."""
        if not self._started:
            raise ValueError("Server not started yet")
        self._server.stop(grace=1.0)
        self._stopped.set()

    def Join(self) -> None:  # noqa: N802 - Launchpad's name
        """Wait until the server is stopped."""
        if not self._started:
            raise ValueError("Server not started")
        self._stopped.wait()


def _served(obj: Any) -> Any:
    """An object serving `obj`'s methods less `set_courier_server`, which Launchpad does not serve."""
    methods = public_methods(obj)
    namespace = {"__call__": lambda self, *args, **kwargs: obj(*args, **kwargs)} if "__call__" in methods else {}
    served = type(type(obj).__name__, (), namespace)()
    served.__dict__.update((name, method) for name, method in methods.items()
                           if name not in ("set_courier_server", "__call__"))
    return served


class _FunctionBody:
    def __init__(self, function: Callable[..., Any], args: tuple, kwargs: dict) -> None:
        self._function, self._args, self._kwargs = function, args, kwargs

    def run(self) -> None:
        self._function(*self._args, **self._kwargs)


class PyClassNode(PyNode):
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


class MultiThreadingColocation(_AbslNode, jd.ColocationNode):
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
           terminal: str | None = None, *, serialize_py_nodes: bool | None = None) -> WorkerManager:
    """Launch `program` as `launch_type` says, or ``--lp_launch_type`` (LOCAL_MULTI_THREADING by
    default), and return its worker manager at once, as Launchpad's does. A local launch keeps
    the interpreter from exiting until the program is over; a test launch is stopped with
    `test_case` (its ``addCleanup``), raising a failure no `wait` raised, and runs in a fresh
    directory, so no checkpoint of an earlier test is restored."""
    if launch_type is None:
        if not flags.FLAGS.is_parsed():
            flags.FLAGS(sys.argv, known_only=True)
        launch_type = LAUNCH_TYPE.value
    launch_type = LaunchType(launch_type)
    if launch_type not in _LAUNCHERS:
        service = "Docker" if launch_type is LaunchType.LOCAL_DOCKER else "Vertex AI"
        raise ValueError(f"launch type {launch_type.name} needs {service}, which jaxdist does not launch on: use "
                         f"local_mt or local_mp here, or jd.launch(program, launcher='multihost' or 'ray') for "
                         f"several hosts")
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
    state = absl_support.capture()
    for node in _every_node(program.nodes()):
        if isinstance(node, _AbslNode):
            node.absl_state = state
    manager = WorkerManager(jd.launch(program, launcher=_LAUNCHERS[launch_type], **options))
    _launched.append(manager.running)
    if testing:
        if test_case is not None:
            test_case.addCleanup(manager.cleanup_after_test)
    else:
        threading._register_atexit(manager.wait_at_exit)  # before Python stops its thread pools, as Launchpad
    return manager


def _every_node(nodes: Sequence[jd.Node]) -> Iterator[jd.Node]:
    for node in nodes:
        yield node
        if isinstance(node, jd.ColocationNode):
            yield from _every_node(node.nodes)


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


_NOT_HERE = {
    "MultiProcessingColocation": "jd.ColocationNode(nodes, mode='processes')",
    "CacherNode": "jd.CacherNode(handle, refresh_interval=seconds, stale_after=seconds)",
    "make_program": "lp.Program(name) and add_node",
    "Address": "a node's handle (jaxdist allocates every address itself)",
    "get_port_from_address": "a node's handle (jaxdist allocates every address itself)",
    "unregister_stop_handler": "a handler that checks lp.stop_event() itself",
    "DockerConfig": "jd.launch(program, launcher='processes'|'multihost'|'ray')",
}


def __getattr__(name: str) -> Any:
    if name in _NOT_HERE:
        raise AttributeError(f"jaxdist.compat.launchpad has no {name} (a Launchpad name jaxdist does not "
                             f"map); use {_NOT_HERE[name]}")
    raise AttributeError(f"module 'jaxdist.compat.launchpad' has no attribute {name!r}")


__all__ = [
    "LAUNCH_TYPE",
    "CourierClient",
    "CourierHandle",
    "CourierNode",
    "CourierServer",
    "LaunchType",
    "MultiThreadingColocation",
    "Program",
    "PyClassNode",
    "PyNode",
    "PythonProcess",
    "ReverbNode",
    "WorkerManager",
    "batched_handler",
    "launch",
    "make_program_stopper",
    "register_stop_handler",
    "stop",
    "stop_event",
    "wait_for_stop",
]
