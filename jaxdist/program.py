"""The program model: a graph of named nodes in labelled groups, linked by handles.

Building a program has no side effects and is deterministic, so every host of a multi-host run
can rebuild the same program and compute the same address table.
"""

from __future__ import annotations

import abc
import contextlib
import dataclasses
import functools
import hashlib
import inspect
import os
import re
import weakref
from collections.abc import Callable, Iterator
from typing import Any, Protocol

AddressTable = dict[str, str]
"""Node name -> "host:port" (or "unix:path") of its courier server, complete before any node runs."""


class Launched(Protocol):
    """A launched program as the launching process's handles see it (``jd.Running``)."""

    def serves(self, node_name: str) -> bool: ...

    def client(self, handle: "Handle") -> Any: ...


_LAUNCHED: "weakref.WeakSet[Launched]" = weakref.WeakSet()


def launched(program: Launched) -> None:
    """Let handles dereferenced in this process (a test's body) reach ``program``'s nodes while
    it runs: the launcher's ``Running`` registers itself here, below which it sits."""
    _LAUNCHED.add(program)


class Handle:
    """A placeholder for a node's client; it becomes a client inside the node that receives it.

    Made from a node (``node.create_handle()``) it takes the node's name when the node is added,
    so two nodes colocated in one process can be wired to each other before either is added
    (Launchpad's model: handles first, addresses at launch). `with_options` gives a handle
    whose client has other `courier.Client` options (a timeout for one caller's calls)."""

    def __init__(self, node: "str | Node", **client_options: Any) -> None:
        self._node = node
        self._client_options = client_options

    def with_options(self, **client_options: Any) -> "Handle":
        """This handle, its client made with these `courier.Client` options (timeout,
        wait_for_ready, max_message_bytes, inline_limit, shared_memory_bytes) on top of its own."""
        from jaxdist.courier import Client

        allowed = sorted(set(inspect.signature(Client).parameters) - _SET_BY_LAUNCHER)
        unknown = sorted(set(client_options) - set(allowed))
        if unknown:
            raise TypeError(f"unknown client options {unknown}; a handle's client takes: {', '.join(allowed)}")
        return Handle(self._node, **{**self._client_options, **client_options})

    @property
    def node_name(self) -> str:
        if isinstance(self._node, str):
            return self._node
        if not self._node.name:
            raise ValueError(f"a handle of {self._node!r}, which was never added to a program: add it with "
                             f"program.add_node (alone or inside a ColocationNode)")
        return self._node.name

    def dereference(self, make_client: Callable[..., Any] | None = None) -> Any:
        """The client the launcher makes for this handle's node, where the receiving node runs;
        without `make_client`, from the process that launched the program (a test's body, as
        Launchpad's ``handle.dereference()``): `Running.client(handle)` of that program."""
        if make_client is None:
            for program in list(_LAUNCHED):
                if program.serves(self.node_name):
                    return program.client(self)
            raise LookupError(f"no program launched from this process serves '{self.node_name}' now: a handle "
                              f"becomes a client inside the node that receives it, or, from the launching process, "
                              f"with running.client(handle) while the program runs")
        return make_client(self.node_name, **self._client_options)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        raise RuntimeError(
            f"handle of node '{self.node_name}' used before it was dereferenced (.{name}): a handle "
            f"becomes a client only inside a node; pass it to the constructor of a node that calls it"
        )

    def __repr__(self) -> str:
        return f"Handle({self.node_name!r})"

    def __reduce__(self) -> tuple:
        return (functools.partial(Handle, **self._client_options), (self.node_name,))


_SET_BY_LAUNCHER = frozenset({"address", "token", "tls", "local"})


def _check_label(label: str) -> None:
    """Labels name directories (checkpoints, logs) under the run directory: none may leave it."""
    if not isinstance(label, str) or not label or "/" in label or "\\" in label or label in (".", ".."):
        raise ValueError(f"a group label must be a non-empty name free of '/' and '\\', and not '.' or '..'; "
                         f"got {label!r}")


@dataclasses.dataclass(frozen=True)
class NodeContext:
    """What a launcher tells a node about where it runs."""

    node_name: str
    run_dir: str
    token: str | None = dataclasses.field(default=None, repr=False)  # a secret: never in logs
    previous_addresses: AddressTable = dataclasses.field(default_factory=dict)
    """Where the nodes served before a restart: a restarted node binds the same address again."""
    socket_dir: str | None = None
    """A directory of this user's alone (0700) where servers bind Unix sockets instead of ports
    on 127.0.0.1: a port is free for any local user to take while its node restarts, and whoever
    takes it is handed the token by the node's callers; a socket in this directory no one else
    can create."""

    def address_for(self, node_name: str) -> str:
        """The address a server of `node_name` should bind: its old one on a restart."""
        if node_name in self.previous_addresses:
            return self.previous_addresses[node_name]
        if self.socket_dir is not None:
            return f"unix:{os.path.join(self.socket_dir, _socket_name(node_name))}"
        return "127.0.0.1:0"


def _socket_name(node_name: str) -> str:
    """A short file name for a node's socket (a Unix socket's path holds at most 107 bytes)."""
    readable = re.sub(r"[^A-Za-z0-9_.-]", "_", node_name)[:24]
    return f"{readable}-{hashlib.sha256(node_name.encode()).hexdigest()[:8]}.sock"


class Executable(abc.ABC):
    """A node made ready to run in the thread or process a launcher gives it."""

    has_run: bool = False
    """Whether the node does work of its own: the program ends when every such node returned.
    Read once the node is constructed (a factory's product decides)."""

    @abc.abstractmethod
    def bind(self) -> AddressTable:
        """Bind servers and return the addresses they serve; nothing is constructed yet."""

    @abc.abstractmethod
    def construct(self, addresses: AddressTable, make_client: Callable[[str], Any]) -> None:
        """Build the node's objects, its handles made clients through `make_client(node_name)`."""

    def run(self) -> None:
        """Do the node's own work, if any; services only serve."""

    @abc.abstractmethod
    def shutdown(self) -> None:
        """Release servers and resources; called once, after run or on stop."""


class Node(abc.ABC):
    """A deferred node: a description that a launcher turns into an `Executable`."""

    name: str = ""

    @abc.abstractmethod
    def default_label(self) -> str:
        """The group label for a node added outside any `with program.group(...)`."""

    @abc.abstractmethod
    def create_handle(self) -> Any:
        """The handle `add_node` returns, or None for nodes that serve nothing."""

    @abc.abstractmethod
    def executable(self, context: NodeContext) -> Executable:
        """Called where the node will run, after it got there."""

    def shipped_arguments(self) -> dict[str, Any]:
        """What must travel to a process to build this node there, by argument name."""
        return {}

    def assign_name(self, name: str) -> None:
        """Called once by `Program.add_node`; composite nodes name their parts here too."""
        self.name = name

    def units(self) -> list["Node"]:
        """The pieces a launcher runs separately, each in its own thread or process."""
        return [self]

    def default_restart(self) -> Any:
        """The `jd.Restart` policy this kind of node gets when its group is given none."""
        return None

    def stops_first(self) -> bool:
        """Whether a launcher stops this node, and waits for it, before the others: a learner
        that saves at a step agreed with its other processes needs its inputs still running."""
        return False


class Program:
    """Nodes in groups; a group holds nodes of one type, and resources are given per group."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.groups: dict[str, list[Node]] = {}
        self.factories: dict[str, Callable[[int], Node]] = {}
        """Groups that can grow and shrink while the program runs, and the node each index gets."""
        self._current_group: str | None = None

    @contextlib.contextmanager
    def group(self, label: str) -> Iterator[None]:
        """``with program.group("actor"):`` nodes added inside get this label (``actor/0``, ...):
        resources, restart policies and multihost placement are given per group."""
        if self._current_group is not None:
            raise ValueError(f"groups do not nest: group '{label}' opened inside '{self._current_group}'")
        _check_label(label)
        self._current_group = label
        try:
            yield
        finally:
            self._current_group = None

    def add_node(self, node: Node, label: str | None = None) -> Any:
        """Add `node`; returns its handle (None for nodes that serve nothing; a list for colocations)."""
        if not isinstance(node, Node):
            raise TypeError(f"add_node takes a node (CourierNode, PyNode, ...), got {type(node).__name__}")
        if node.name:
            raise ValueError(f"node '{node.name}' was already added to a program")
        if label is not None:
            _check_label(label)
            if self._current_group is not None and label != self._current_group:
                raise ValueError(f"add_node(label={label!r}) inside group '{self._current_group}': give one "
                                 f"label, the group's or this one")
        label = label or self._current_group or node.default_label()
        members = self.groups.setdefault(label, [])
        if members and type(members[0]) is not type(node):
            raise TypeError(
                f"group '{label}' mixes node types {type(members[0]).__name__} and {type(node).__name__}; "
                f"put each node type in its own group"
            )
        node.assign_name(f"{label}/{len(members)}")
        members.append(node)
        return node.create_handle()

    def add_group(self, label: str, factory: Callable[[int], Node], count: int) -> list[Any]:
        """`count` nodes ``factory(index)`` as group `label`; returns their handles. One template
        for every member is what lets the group grow and shrink while it runs
        (`Running.scale`): a new member is ``factory(its index)``, as the first were."""
        if label in self.groups:
            raise ValueError(f"group '{label}' already exists; add_group makes a whole group from its factory")
        self.factories[label] = factory
        with self.group(label):
            return [self.add_node(factory(index)) for index in range(count)]

    def grow(self, label: str) -> Node:
        """Add group `label`'s next node (``label/<size>``), made by its factory; for launchers."""
        self.add_node(self.factories[label](len(self.groups[label])), label)
        return self.groups[label][-1]

    def shrink(self, label: str) -> Node:
        """Take group `label`'s last node out of the program and return it; for launchers."""
        return self.groups[label].pop()

    def nodes(self) -> list[Node]:
        """Every node added, group by group."""
        return [node for members in self.groups.values() for node in members]

    def units(self) -> list[tuple[str, Node]]:
        """(group label, unit) for every piece a launcher runs separately."""
        return [(label, unit) for label, members in self.groups.items() for node in members for unit in node.units()]

    def __repr__(self) -> str:
        sizes = ", ".join(f"{label}: {len(members)}" for label, members in self.groups.items())
        return f"Program({self.name!r}; {sizes})"


def group_of(node_name: str) -> str:
    """The group label of a node or unit name: `add_node` names a group's nodes ``label/index``
    (a colocation's parts ``label/index/part``), and labels hold no '/'."""
    return node_name.partition("/")[0]


def replace_handles(value: Any, make_client: Callable[[str], Any]) -> Any:
    """`value` with every Handle, at any depth in lists, tuples and dicts, made a client."""
    if isinstance(value, Handle):
        return value.dereference(make_client)
    if isinstance(value, list):
        return [replace_handles(item, make_client) for item in value]
    if isinstance(value, tuple):
        items = [replace_handles(item, make_client) for item in value]
        return type(value)(*items) if hasattr(value, "_fields") else tuple(items)
    if isinstance(value, dict):
        return {key: replace_handles(item, make_client) for key, item in value.items()}
    return value


def named_arguments(args: tuple, kwargs: dict[str, Any]) -> dict[str, Any]:
    """Arguments keyed the way an error should name them: 'args[0]', 'seed='."""
    named = {f"args[{i}]": arg for i, arg in enumerate(args)}
    named.update({f"{key}=": value for key, value in kwargs.items()})
    return named
