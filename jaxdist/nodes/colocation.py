"""ColocationNode: several nodes kept together, in one process or on one machine.

`mode="threads"` runs the nodes as threads of one process (one unit for the launcher: cheap
calls between them, one Python heap). `mode="processes"` gives each its own process but keeps
them on the same host: launchers on one machine run them like any other nodes, and a
multi-host launcher places them together.

Colocations nest: a threads colocation inside a processes one is one of its processes (Launchpad's
multi-threading colocation inside a multi-processing one), a threads colocation inside another
threads one adds its threads to that process. A processes colocation cannot run inside a threads
one: its parts would need processes of their own.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Sequence
from typing import Any

from jaxdist.launch.interrupt import raise_in_thread
from jaxdist.program import AddressTable, Executable, Node, NodeContext

MODES = ("threads", "processes")


class ColocationNode(Node):
    """`ColocationNode([node, ...], mode="threads"|"processes")`; `add_node` returns their handles
    (a nested colocation's as a list of its own), its parts are named `<label>/<i>/<part>`.
    `return_on_first_completed` (threads): the colocation's run is over when any part's is, as
    when one part drives the others (theirs are then interrupted with the rest of the unit)."""

    def __init__(self, nodes: Sequence[Node], mode: str = "threads", return_on_first_completed: bool = False) -> None:
        if mode not in MODES:
            raise ValueError(f"ColocationNode mode must be one of {MODES}, got {mode!r}")
        if return_on_first_completed and mode != "threads":
            raise ValueError("return_on_first_completed is for a threads colocation: the parts of a processes one "
                             "are nodes of their own, each ending by itself")
        if not nodes:
            raise ValueError("ColocationNode needs at least one node")
        for node in nodes:
            if not isinstance(node, Node):
                raise TypeError(f"ColocationNode takes nodes (CourierNode, PyNode, ColocationNode, ...), got {node!r}")
            if mode == "threads" and isinstance(node, ColocationNode) and node.mode == "processes":
                raise ValueError("a processes colocation cannot run inside a threads one (its parts need processes "
                                 "of their own): put the threads colocation inside the processes one instead")
            if node.name:
                raise ValueError(f"node '{node.name}' was already added to a program; colocate it instead")
        self.nodes = list(nodes)
        self.mode = mode
        self.return_on_first_completed = return_on_first_completed

    def default_label(self) -> str:
        return "colocation"

    def assign_name(self, name: str) -> None:
        self.name = name
        for index, node in enumerate(self.nodes):
            node.assign_name(f"{name}/{index}")

    def create_handle(self) -> list[Any]:
        return [node.create_handle() for node in self.nodes]

    def stops_first(self) -> bool:
        return any(node.stops_first() for node in self.nodes)

    def default_restart(self) -> Any:
        """The most patient of its parts' policies: they restart together, as one unit."""
        policies = [policy for policy in (node.default_restart() for node in self.nodes) if policy is not None]
        return max(policies, key=lambda policy: policy.max_restarts, default=None)

    def units(self) -> list[Node]:
        return [unit for node in self.nodes for unit in node.units()] if self.mode == "processes" else [self]

    def executable(self, context: NodeContext) -> Executable:
        return _ThreadsExecutable(
            [node.executable(dataclasses.replace(context, node_name=node.name)) for node in self.nodes],
            self.return_on_first_completed,
        )

    def shipped_arguments(self) -> dict[str, Any]:
        return {
            f"{node.name}: {name}": value for node in self.nodes for name, value in node.shipped_arguments().items()
        }


class _ThreadsExecutable(Executable):
    """The colocated nodes' executables driven together, each in a thread of this process."""

    def __init__(self, parts: list[Executable], return_on_first_completed: bool = False) -> None:
        self._parts = parts
        self._return_on_first_completed = return_on_first_completed

    @property
    def has_run(self) -> bool:
        return any(part.has_run for part in self._parts)

    def bind(self) -> AddressTable:
        addresses: AddressTable = {}
        for part in self._parts:
            addresses.update(part.bind())
        return addresses

    def construct(self, addresses: AddressTable, make_client: Callable[[str], Any]) -> None:
        # Together, not in turn: one part's constructor may call another part.
        _all_in_threads([lambda part=part: part.construct(addresses, make_client) for part in self._parts])

    def run(self) -> None:
        _all_in_threads([part.run for part in self._parts if part.has_run], self._return_on_first_completed)

    def shutdown(self) -> None:
        for part in self._parts:
            part.shutdown()


def _all_in_threads(calls: list[Callable[[], None]], first_only: bool = False) -> None:
    """Run the calls in threads until all have returned (the first, with `first_only`) or one
    raises, whose error is raised at once: a sibling that waits for the stop would otherwise
    hide the failure, and the program, never told, would wait for ever. An interrupt of this
    thread (a stop) is passed on."""
    errors: list[BaseException] = []
    finished = threading.Semaphore(0)

    def guarded(call: Callable[[], None]) -> None:
        try:
            call()
        except BaseException as exc:
            errors.append(exc)
        finally:
            finished.release()

    threads = [threading.Thread(target=guarded, args=(call,), daemon=True) for call in calls]
    for thread in threads:
        thread.start()
    try:
        for _ in threads[:1] if first_only else threads:
            while not finished.acquire(timeout=0.1):
                pass
            if errors:
                raise errors[0]
    except KeyboardInterrupt:
        for thread in threads:
            if thread.is_alive():
                raise_in_thread(thread, KeyboardInterrupt)
        raise
