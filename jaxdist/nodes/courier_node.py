"""CourierNode: an object built in its own thread or process whose public methods are served."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from jaxdist import courier
from jaxdist.launch.context import node_context
from jaxdist.program import AddressTable, Executable, Handle, Node, NodeContext, named_arguments, replace_handles


class CourierNode(Node):
    """`CourierNode(cls, *args, **kwargs)`: a deferred `cls(*args, **kwargs)`, served over courier.

    Handles among the arguments become clients when the node starts. If the object has `run()`,
    the node runs it; the program may end when it returns. Its constructor and `run()` can ask
    `jaxdist.launch.context.current_node()` for the node's name and run directory.

    Served methods run concurrently, on the server's pool of threads (16), while `run()` runs in
    a thread of its own: guard shared state with a lock, or serve one call at a time with
    `CourierNode(cls).with_server(thread_pool_size=1)`.
    """

    def __init__(self, cls: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        if not callable(cls):
            raise TypeError(f"CourierNode takes a class or factory first, got {cls!r}")
        self.cls, self.args, self.kwargs = cls, args, kwargs
        self.server_options: dict[str, Any] = {}
        self.run_enabled = True
        self._restart: Any = getattr(cls, "default_restart", None)
        self._stops_first = bool(getattr(cls, "stops_first", False))

    def configure(self, *args: Any, **kwargs: Any) -> "CourierNode":
        """Set the constructor's arguments after the node was made (before launch): two nodes
        can then take each other's handles, made with `create_handle()` before either is added."""
        self.args, self.kwargs = args, kwargs
        return self

    def disable_run(self) -> "CourierNode":
        """Construct and serve the object but never call its `run()`: a test drives it through
        `running.client(handle)` instead (Launchpad's integration-test pattern)."""
        self.run_enabled = False
        return self

    def with_server(self, **options: Any) -> "CourierNode":
        """Options for this node's `courier.Server`, e.g. `thread_pool_size=64`."""
        self.server_options.update(options)
        return self

    def with_options(self, *, restart: Any = None, stops_first: bool | None = None) -> "CourierNode":
        """Node options that a factory function cannot declare as class attributes: the restart
        policy its group gets when the launch names none, and whether launchers stop it first
        (a learner built by a factory). A served class may declare both itself
        (`default_restart = jd.Restart(...)`, `stops_first = True`), as `Learner` does."""
        if restart is not None:
            self._restart = restart
        if stops_first is not None:
            self._stops_first = stops_first
        return self

    def default_label(self) -> str:
        return getattr(self.cls, "__name__", "courier").lower()

    def __repr__(self) -> str:
        return f"CourierNode({getattr(self.cls, '__qualname__', self.cls)!r}{', ' + repr(self.name) if self.name else ''})"

    def create_handle(self) -> Handle:
        return Handle(self)

    def default_restart(self) -> Any:
        return self._restart

    def stops_first(self) -> bool:
        return self._stops_first

    def serve(self, server: courier.Server, obj: Any) -> None:
        """Serve the constructed object on the node's bound server (a subclass may hand the
        server to the object instead, as Launchpad's `set_courier_server` protocol does)."""
        server.attach(obj)

    def executable(self, context: NodeContext) -> Executable:
        return _CourierExecutable(self, context)

    def shipped_arguments(self) -> dict[str, Any]:
        return {"class": self.cls, **named_arguments(self.args, self.kwargs)}


class _CourierExecutable(Executable):
    def __init__(self, node: CourierNode, context: NodeContext) -> None:
        self._node = node
        self._context = context
        self._server: courier.Server | None = None
        self._object: Any = None

    def bind(self) -> AddressTable:
        self._server = courier.Server(
            None, self._context.address_for(self._node.name), token=self._context.token, **self._node.server_options
        ).start()
        return {self._node.name: self._server.address}

    def construct(self, addresses: AddressTable, make_client: Callable[[str], Any]) -> None:
        node = self._node
        args = replace_handles(node.args, make_client)
        kwargs = replace_handles(node.kwargs, make_client)
        with node_context(self._context):
            self._object = node.cls(*args, **kwargs)
        node.serve(self._server, self._object)
        self.has_run = node.run_enabled and callable(getattr(self._object, "run", None))  # a factory's product decides

    def run(self) -> None:
        if self.has_run:
            with node_context(self._context):
                self._object.run()

    def shutdown(self) -> None:
        if self._server is not None:
            self._server.stop(grace=0.5)
        close = getattr(self._object, "close", None)
        if inspect.ismethod(close):
            close()
