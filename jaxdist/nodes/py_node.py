"""PyNode: a function run in its own thread or process; it serves nothing."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from jaxdist.launch.context import node_context
from jaxdist.program import AddressTable, Executable, Handle, Node, NodeContext, named_arguments, replace_handles


class PyNode(Node):
    """`PyNode(fn, *args, **kwargs)` runs `fn(*args, **kwargs)` with its handles made clients;
    inside it, `jaxdist.launch.context.current_node()` gives the node's name and run directory."""

    def __init__(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        if not callable(fn):
            raise TypeError(f"PyNode takes a function first, got {fn!r}")
        self.fn, self.args, self.kwargs = fn, args, kwargs

    def default_label(self) -> str:
        return getattr(self.fn, "__name__", "python")

    def create_handle(self) -> Handle | None:
        return None

    def executable(self, context: NodeContext) -> Executable:
        return _PyExecutable(self, context)

    def shipped_arguments(self) -> dict[str, Any]:
        return {"function": self.fn, **named_arguments(self.args, self.kwargs)}


class _PyExecutable(Executable):
    has_run = True

    def __init__(self, node: PyNode, context: NodeContext) -> None:
        self._node = node
        self._context = context
        self._call: Callable[[], Any] | None = None

    def bind(self) -> AddressTable:
        return {}

    def construct(self, addresses: AddressTable, make_client: Callable[[str], Any]) -> None:
        node = self._node
        args = replace_handles(node.args, make_client)
        kwargs = replace_handles(node.kwargs, make_client)
        self._call = lambda: node.fn(*args, **kwargs)

    def run(self) -> None:
        with node_context(self._context):
            self._call()

    def shutdown(self) -> None:
        pass
