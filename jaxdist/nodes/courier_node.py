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
    """

    def __init__(self, cls: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        if not callable(cls):
            raise TypeError(f"CourierNode takes a class or factory first, got {cls!r}")
        self.cls, self.args, self.kwargs = cls, args, kwargs
        self.server_options: dict[str, Any] = {}

    def with_server(self, **options: Any) -> "CourierNode":
        """Options for this node's `courier.Server`, e.g. `thread_pool_size=64`."""
        self.server_options.update(options)
        return self

    def default_label(self) -> str:
        return getattr(self.cls, "__name__", "courier").lower()

    def create_handle(self) -> Handle:
        return Handle(self.name)

    def default_restart(self) -> Any:
        """A served class may declare `default_restart = jd.Restart(...)` (learners do)."""
        return getattr(self.cls, "default_restart", None)

    def stops_first(self) -> bool:
        """A served class may declare `stops_first = True` (learners do)."""
        return bool(getattr(self.cls, "stops_first", False))

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
        self.has_run = callable(getattr(node.cls, "run", None))

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
        self._server.attach(self._object)

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
