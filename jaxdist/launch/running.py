"""`Running`: the handle on a launched program that every launcher returns.

It owns the lifecycle every launcher shares: per-node states, the first failure, and when the
program is over (every node with work of its own returned, a node failed, or a stop was asked).
Launchers supply only how to tear their nodes down.
"""

from __future__ import annotations

import abc
import dataclasses
import threading
from typing import TYPE_CHECKING, Any, Callable

from jaxdist.launch import preflight, sigterm
from jaxdist.launch.errors import NodeFailedError
from jaxdist.program import Handle, Node, Program, group_of, launched

if TYPE_CHECKING:
    from jaxdist.launch.run_lock import RunLock

STARTING, RUNNING, FINISHED, FAILED, STOPPED = "starting", "running", "finished", "failed", "stopped"


@dataclasses.dataclass
class NodeStatus:
    state: str = STARTING
    has_run: bool = False
    pid: int | None = None
    exitcode: int | None = None
    error: str | None = None
    restarts: int = 0
    last_restart_cause: str | None = None


WORK_DONE = "every node with work of its own has finished"


class Running(abc.ABC):
    """A launched program: `wait(timeout)`, `stop()`, `status()`, `scale(group, n)` and
    `members(group)`; `host_index`: which host's share of the program this is (0 but under the
    multihost launcher)."""

    token: str | None = None
    """The launch's courier secret, which every node's server asks of its callers."""

    def __init__(self, program_name: str, node_names: list[str], run_dir: str) -> None:
        self.program_name = program_name
        self.run_dir = run_dir
        self.addresses: dict[str, str] = {}
        self.host_index = 0
        self._statuses = {name: NodeStatus() for name in node_names}
        self._lock = threading.Lock()
        self._stop_requested = threading.Event()
        self._done = threading.Event()
        self._failure: Exception | None = None
        self._stop_reason = ""
        self._stop_listeners: list[Callable[[str], None]] = []
        self._scale_lock = threading.Lock()  # one scale at a time, and none across the teardown
        self._run_lock: RunLock | None = None
        launched(self)

    # Called by launchers --------------------------------------------------------------------

    def hold_until_over(self, run_lock: "RunLock") -> None:
        """For launchers, before starting any node: keep the run directory's lock (taken for
        this launch, see `jaxdist.launch.run_lock`) until the program is over."""
        self._run_lock = run_lock

    def node_started(self, name: str, has_run: bool, pid: int | None = None) -> None:
        """For launchers: the node runs (``has_run``: it has work of its own)."""
        with self._lock:
            status = self._statuses[name]
            status.state, status.has_run, status.pid = RUNNING, has_run, pid

    def node_finished(self, name: str, exitcode: int | None = None) -> None:
        """For launchers: the node returned; once every node with work has, the program stops."""
        with self._lock:
            status = self._statuses[name]
            if status.state in (STARTING, RUNNING):
                status.state = FINISHED if not self._stop_requested.is_set() else STOPPED
            status.exitcode = exitcode
            all_work_done = any(s.has_run for s in self._statuses.values()) and all(
                s.state in (FINISHED, STOPPED) for s in self._statuses.values() if s.has_run
            )
        if all_work_done:
            self.request_stop(WORK_DONE)

    def node_restarting(self, name: str, cause: str, exitcode: int | None) -> None:
        """A crashed node is being brought back; it is not a program failure."""
        with self._lock:
            status = self._statuses[name]
            status.state, status.exitcode, status.pid = STARTING, exitcode, None
            status.restarts += 1
            status.last_restart_cause = cause

    def restarts(self) -> int:
        """Restarts of all nodes so far."""
        with self._lock:
            return sum(status.restarts for status in self._statuses.values())

    def node_failed(self, name: str, details: str, exitcode: int | None = None) -> None:
        """For launchers: the node failed past its restart policy; the program stops, and
        ``wait()`` raises ``NodeFailedError`` with ``details``."""
        with self._lock:
            status = self._statuses[name]
            if self._stop_requested.is_set() and (status.state != STARTING or status.restarts):
                # Death during teardown is not a failure, nor is a restart the stop cut short;
                # a node that never got through its first start still is.
                status.state, status.exitcode = STOPPED, exitcode
                return
            status.state, status.error, status.exitcode = FAILED, details, exitcode
            if self._failure is None:
                self._failure = NodeFailedError(name, details)
        self.request_stop(f"node '{name}' failed")

    def abort(self, error: Exception) -> None:
        """Stop the program for a failure of the launch itself (hosts of one run that refuse each
        other, say), which `wait` raises; ignored once a stop has begun."""
        with self._lock:
            if self._stop_requested.is_set():
                return
            self._failure = self._failure or error
        self.request_stop(str(error))

    def request_stop(self, reason: str) -> None:
        """Begin tearing the program down, once, without blocking the caller."""
        with self._lock:
            if self._stop_requested.is_set():
                return
            self._stop_requested.set()
            self._stop_reason = reason
        threading.Thread(target=self._teardown, name="jaxdist-stop", daemon=True).start()

    def on_stop(self, listener: Callable[[str], None]) -> None:
        """Call ``listener(reason)`` once the stop begins, before the nodes are stopped (the
        multihost launcher tells the other hosts this way)."""
        self._stop_listeners.append(listener)

    @abc.abstractmethod
    def _shut_down(self) -> None:
        """Stop every node and release everything; returns when nothing is left running."""

    def _scalable_program(self, group: str) -> Program:
        """The program whose `group` `scale` changes, once the launcher checked that the group
        may change here (a per_host group may not); launchers that can start and stop a node
        alone override this, `_add_nodes` and `_remove_nodes`."""
        raise NotImplementedError(
            f"program '{self.program_name}' runs under a launcher that cannot scale a group: under 'threads' every "
            f"node shares one process and one stop event, and one node cannot be stopped alone; launch with "
            f"'processes', 'multihost' or 'ray' to use running.scale")

    def _add_nodes(self, group: str, nodes: list[Node]) -> None:
        """Start `nodes`, just added to `group`, and return once they run (see `scale`); a
        ValueError only before any of them started (they cannot be placed)."""
        raise NotImplementedError

    def _remove_nodes(self, nodes: list[Node]) -> None:
        """Stop `nodes`, just taken out of their group (highest index first), and forget them."""
        raise NotImplementedError

    def _track(self, names: list[str]) -> None:
        """For launchers: nodes added by `scale` that run in this launch join the status table."""
        with self._lock:
            self._statuses.update({name: NodeStatus() for name in names})

    def _forget(self, names: list[str]) -> None:
        """For launchers: nodes removed by `scale` leave the status and address tables."""
        with self._lock:
            for name in names:
                self._statuses.pop(name, None)
                self.addresses.pop(name, None)

    def peer_nodes_changed(self, joined: dict[str, str], left: list[str]) -> None:
        """For the multihost launcher: nodes that `scale` started on another host (where they
        serve) or removed there, which `members` and `client` follow from then on."""
        with self._lock:
            for name in left:
                self.addresses.pop(name, None)
            self.addresses.update(joined)

    # The user's view ------------------------------------------------------------------------

    def wait(self, timeout: float | None = None) -> bool:
        """True once the program is over (False on timeout); raises the first failure (a node's,
        or the launch's own)."""
        try:
            over = self._done.wait(timeout)
        except KeyboardInterrupt:
            self.stop()
            raise
        if over:
            sigterm.forget(self)  # seen to end: a later SIGTERM is the script's own
        if over and self._failure is not None:
            raise self._failure
        return over

    def stop(self) -> None:
        """Stop every node (SIGTERM, a grace period, then SIGKILL for processes) and wait."""
        self.request_stop("stopped by the user")
        self._done.wait()
        sigterm.forget(self)

    def scale(self, group: str, n: int) -> list[str]:
        """Grow or shrink `group` to `n` nodes while the program runs (Fiber's dynamic scaling);
        returns the names added or removed. New nodes continue the group's names (``actor/2``,
        ``actor/3``, ...), are made by the group's factory for their index (so the group must
        have been added with `Program.add_group`), bind, join the address table and are
        supervised as the others; scale returns once they run. Removed nodes, the highest index
        first, get the ordered stop (stop, SIGTERM, grace, SIGKILL of their tree) and leave
        `status()`. A watcher follows the group through `members(group)`."""
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ValueError(f"scale({group!r}, {n!r}): n is the group's new number of nodes, an int >= 0")
        program = self._scalable_program(group)
        if group not in program.groups:
            raise ValueError(f"program '{self.program_name}' has no group '{group}'; groups: "
                             f"{', '.join(sorted(program.groups))}")
        if group not in program.factories:
            raise ValueError(
                f"group '{group}' cannot scale: its nodes were added one by one, not made from one factory; a group "
                f"that grows and shrinks is added with program.add_group(label, factory, count) (groups that can "
                f"scale: {', '.join(sorted(program.factories)) or 'none'})")
        with self._scale_lock:
            if self._stop_requested.is_set():
                raise RuntimeError(f"program '{self.program_name}' is stopping ({self._stop_reason}): it no longer scales")
            size = len(program.groups[group])
            if n >= size:
                added = [program.grow(group) for _ in range(n - size)]
                try:
                    preflight.check_shippable(program)  # every launcher that scales ships nodes
                    self._add_nodes(group, added)
                except (TypeError, ValueError):  # refused before any node started: the group stays as it was
                    for _ in added:
                        program.shrink(group)
                    raise
                return [node.name for node in added]
            removed = [program.shrink(group) for _ in range(size - n)]
            self._remove_nodes(removed)
            return [node.name for node in removed]

    def members(self, group: str) -> list[str]:
        """The names of `group`'s nodes now, in index order: those this launch runs (status())
        and those it can call (under multihost, the other hosts' as placed at launch). What a
        watcher of a group that `scale` changes (the agents' monitor) polls."""
        with self._lock:
            names = {name for name in [*self._statuses, *self.addresses] if group_of(name) == group}
        return sorted(names, key=lambda name: [int(part) if part.isdigit() else 0 for part in name.split("/")[1:]])

    def serves(self, node_name: str) -> bool:
        """Whether `node_name` is a node of this program that serves, while the program runs."""
        return node_name in self.addresses and not self._done.is_set()

    def client(self, handle: Any, **options: Any) -> Any:
        """A courier client of a serving node from outside the program (a test's body, a
        notebook): its handle (what `add_node` returned) or its name, with the launch's token;
        `options` go to `courier.Client` (``timeout=...``), over the handle's own."""
        if isinstance(handle, str):
            handle = Handle(handle)
        return handle.dereference(lambda name, **own: self._client_of(name, **{**own, **options}))

    def _client_of(self, name: str, **options: Any) -> Any:
        from jaxdist import courier

        if name not in self.addresses:
            raise KeyError(f"no node '{name}' serves in program '{self.program_name}'; serving nodes: "
                           f"{', '.join(sorted(self.addresses)) or '(none)'}")
        return courier.Client(self.addresses[name], token=self.token, **options)

    def status(self) -> dict[str, dict[str, Any]]:
        """Per node: state, has_run, pid, exitcode, error, restarts, last_restart_cause."""
        with self._lock:
            return {name: dataclasses.asdict(status) for name, status in self._statuses.items()}

    @property
    def stop_reason(self) -> str:
        return self._stop_reason

    def __enter__(self) -> "Running":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def _teardown(self) -> None:
        try:
            for listener in self._stop_listeners:
                try:
                    listener(self._stop_reason)
                except Exception as exc:  # noqa: BLE001 - a listener must not keep the nodes running
                    print(f"[launcher] a stop listener failed: {exc!r}", flush=True)
            with self._scale_lock:  # a scale under way ends first (it sees the stop): none starts after
                self._shut_down()
        finally:
            with self._lock:
                for status in self._statuses.values():
                    if status.state in (STARTING, RUNNING):
                        status.state = STOPPED
            if self._run_lock is not None:
                self._run_lock.release()
            self._done.set()
