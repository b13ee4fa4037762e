"""The processes launcher: every node its own process on this machine, under a supervisor.

Children are forked from a forkserver that has imported what nodes import (`node_processes`),
which hands each its node pickled over an inherited pipe; the same pipe then carries the
two-phase start (bind, construct, run) and stop.
Each child leads a process group, so a stop reaches its whole tree: the stop message and
SIGTERM, a grace period, then SIGKILL of every process below it. Nodes that stop first
(`Node.stops_first()`: learners) are stopped, and waited for, before the rest, so a learner
saving at a step agreed across hosts still has its actors and queues feeding it.
A node saving the checkpoint its next life restores (`context.saving_checkpoint`, over the same
pipe) is not killed when its grace is over but given up to `save_grace` from the save's start:
cut, the save leaves no checkpoint of the step the run stopped at. A save that ends past the
grace leaves its node the grace again to exit.

Nodes serve on Unix sockets in a private directory (0700, made for the launch and removed after
it), not on ports of 127.0.0.1: a port is free for any local user to take while its node
restarts, and whoever took it would be handed the token by the node's callers. Under the
multihost launcher, which fixes every address, nodes serve on their host's ports.

A monitor thread watches every child. A node that crashes (raises, or dies by a signal or a
non-zero exit) is started again if its group's `jd.Restart` policy allows: after a backoff, on
the same address (its peers' clients reconnect), constructed against the current address table;
stateful nodes restore their latest checkpoint as they start. Past its limit, the program stops.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import multiprocessing.connection
import os
import pickle
import shutil
import signal
import tempfile
import threading
import time
from typing import Any, Callable, Collection

from jaxdist.launch import node_processes, preflight, sigterm, worker
from jaxdist.launch.output import log_path
from jaxdist.launch.placement import serving_names
from jaxdist.launch.process_tree import describe_exit, signal_tree
from jaxdist.launch.restart import Restart
from jaxdist.launch.restart import policies as restart_policies
from jaxdist.launch.run_lock import RunLock
from jaxdist.launch.running import RUNNING, NodeStatus, Running
from jaxdist.program import AddressTable, Node, NodeContext, Program

SUPPORTED_RESOURCES = {"env": "environment variables of the group's processes, set (and read by JAX) before "
                                      "their node is built"}


def launch(
    program: Program,
    *,
    run_dir: str | None = None,
    resources: dict[str, dict[str, Any]] | None = None,
    restart: dict[str, Restart] | None = None,
    token: str | None = None,
    grace: float = 10.0,
    save_grace: float = 300.0,
    interrupt_after: float = 2.0,
    echo: bool = True,
    start_timeout: float = 300.0,
    units: Collection[str] | None = None,
    addresses: AddressTable | None = None,
    bind_host: str | None = None,
    host_index: int = 0,
) -> Running:
    """Start `program` as processes; returns once every node runs (or one failed: see `wait`).

    `restart={"learner": jd.Restart(max_restarts=5)}` sets a group's restart policy; groups
    without one get their node type's default (learners, replay, parameter servers and cachers
    restart; plain nodes do not).

    For the multihost launcher, which runs a share of a program on each host: `units` names the
    units to start here (default: all); `addresses` is a fixed address table (nodes started
    elsewhere included) that nodes are constructed against and that local nodes bind, on
    `bind_host` instead of the table's host when given (e.g. "0.0.0.0"); `host_index` is this
    host's (its share locks the run directory apart from the other hosts', see `run_lock`).
    """
    preflight.check_program(program)
    resources = preflight.check_resources(program, resources, SUPPORTED_RESOURCES)
    policies = restart_policies(program, restart)
    preflight.check_shippable(program)
    run_dir = preflight.prepare_run_dir(program, run_dir)
    running = _ProcessesRunning(program, run_dir, token or preflight.new_token(), resources, policies, grace,
                                save_grace, restart,
                                socket_dir=None if addresses else tempfile.mkdtemp(prefix="jaxdist-"))
    running.fix_addresses(units, addresses or {}, bind_host)
    running.host_index = host_index
    run_lock = RunLock(run_dir, host_index)
    running.hold_until_over(run_lock)
    try:
        running.start(echo, interrupt_after, start_timeout)
    except KeyboardInterrupt:  # Ctrl-C while the nodes start: those started stop in order
        running.stop()
        raise
    except BaseException:
        run_lock.release()
        running.remove_sockets()
        raise
    return running


_STARTING = {"spawned": "had not bound its server", "bound": "was waiting for the others to bind",
             "constructing": "was still being constructed", "constructed": "was waiting for the others to be built"}


class _Child:
    """One node's process, and what the supervisor knows of it across restarts."""

    def __init__(self, name: str, label: str, node: Node, policy: Restart) -> None:
        self.name, self.label, self.node, self.policy = name, label, node, policy
        self.process: multiprocessing.Process | None = None
        self.conn: multiprocessing.connection.Connection | None = None
        self.stage = "waiting"  # waiting -> spawned -> bound -> constructing -> constructed -> running -> exited
        self.restarts = 0  # in a row: since it last stayed up for the policy's reset_after
        self.restart_at = 0.0
        self.running_since: float | None = None
        self.failure: str | None = None  # the traceback a child reported before dying
        self.leaving = False  # removed by `scale`: its exit is neither a finish nor a crash
        self.saving_since: float | None = None  # when the checkpoint save under way began
        self.saved_at: float | None = None  # when its last save ended


class _ProcessesRunning(Running):
    start_method = "forkserver"  # see `node_processes`

    def __init__(
        self,
        program: Program,
        run_dir: str,
        token: str,
        resources: dict[str, dict[str, Any]],
        policies: dict[str, Restart],
        grace: float,
        save_grace: float,
        restart: dict[str, Restart] | None = None,
        socket_dir: str | None = None,
    ) -> None:
        super().__init__(program.name, [unit.name for _, unit in program.units()], run_dir)
        self.token = token
        self._socket_dir = socket_dir
        self._program, self._restart = program, restart
        self._resources = resources
        self._grace, self._save_grace = grace, save_grace
        self._children = {
            unit.name: _Child(unit.name, label, unit, policies[unit.name]) for label, unit in program.units()
        }
        self._has_run: dict[str, bool] = {}
        self._started = threading.Event()
        self._monitor: threading.Thread | None = None
        self._spawn_options: tuple[bool, float] = (True, 2.0)
        self._start_timeout = 300.0
        self._fixed: AddressTable = {}
        self._bind_host: str | None = None
        self.runs_here: Callable[[str, int], bool] = lambda label, index: True
        """Whether node `index` of group `label`, added by `scale`, runs in this launch (the
        multihost launcher's rule: this host's share); raises for a group that cannot scale."""
        self.node_host: str | None = None
        """Under multihost, this host's name in the host list: a node `scale` adds here binds a
        fresh port of it (on `bind_host` if given), which the other hosts can call."""
        self.announce: Callable[[AddressTable, list[str]], None] = lambda joined, left: None
        """Under multihost, tells the other hosts which nodes `scale` started here (where they
        serve) or removed: their tables hold only the nodes placed at launch."""

    def fix_addresses(self, units: Collection[str] | None, addresses: AddressTable, bind_host: str | None) -> None:
        """Start only `units`; keep `addresses` as given (see `launch`)."""
        if units is not None:
            unknown = sorted(set(units) - set(self._children))
            if unknown:
                raise ValueError(f"units {unknown} are not in program '{self.program_name}'; units: {sorted(self._children)}")
            self._children = {name: child for name, child in self._children.items() if name in units}
            self._statuses = {name: status for name, status in self._statuses.items() if name in units}
        self._fixed, self._bind_host = dict(addresses), bind_host
        self.addresses.update(addresses)

    def _bind_addresses(self) -> AddressTable:
        """What each node binds: its fixed address (on `bind_host` if given), else its last one."""
        if self._bind_host is None:
            return dict(self.addresses)
        rebound = {name: f"{self._bind_host}:{address.rsplit(':', 1)[1]}" for name, address in self._fixed.items()}
        return {**self.addresses, **rebound}

    def start(self, echo: bool, interrupt_after: float, start_timeout: float) -> None:
        self._spawn_options, self._start_timeout = (echo, interrupt_after), start_timeout
        for child in self._children.values():
            self._spawn(child)
        sigterm.watch(self)
        self._monitor = threading.Thread(target=self._watch, args=(start_timeout,), name="jaxdist-monitor", daemon=True)
        self._monitor.start()
        self._started.wait()

    def _spawn(self, child: _Child) -> None:
        processes = node_processes.context(self.start_method)
        echo, interrupt_after = self._spawn_options
        env = {key: str(value) for key, value in self._resources.get(child.label, {}).get("env", {}).items()}
        parent_end, child_end = processes.Pipe()
        bind = self._bind_addresses()
        if self.node_host is not None:  # added by `scale` under multihost: any port other hosts can reach
            bind.update({name: f"{self._bind_host or self.node_host}:0"
                         for name in serving_names(child.node) if name not in bind})
        node_context = NodeContext(child.name, self.run_dir, self.token, bind, self._socket_dir)
        process = processes.Process(
            target=worker.main,
            args=(pickle.dumps(child.node), node_context, child_end, echo, interrupt_after,
                  node_processes.Inheritance.now(env)),
            name=child.name,
        )
        process.start()
        child_end.close()
        child.process, child.conn, child.stage, child.failure = process, parent_end, "spawned", None
        child.saving_since = child.saved_at = None

    # The monitor ----------------------------------------------------------------------------

    def _watch(self, start_timeout: float) -> None:
        start_deadline = time.monotonic() + start_timeout
        while any(child.stage != "exited" for child in self._children.values()):
            waitables = {}
            for child in self._children.values():
                if child.stage not in ("exited", "waiting"):
                    waitables[child.conn] = child
                    waitables[child.process.sentinel] = child
            for ready in multiprocessing.connection.wait(list(waitables), timeout=0.2):
                child = waitables[ready]
                if ready is child.conn:
                    self._receive(child)
                elif child.stage not in ("exited", "waiting"):
                    self._reap(child)
            self._advance_start(start_deadline)
            self._restart_due()
        self._started.set()

    def _receive(self, child: _Child) -> bool:
        """Handle one message; False when the pipe is closed (its sentinel tells how it ended)."""
        try:
            kind, *body = child.conn.recv()
        except (EOFError, OSError):
            return False
        if kind == "bound":
            (addresses,) = body
            fresh = {name: address for name, address in addresses.items() if name not in self._fixed}
            if self.node_host is not None and fresh:  # a node `scale` added here: fixed from now on, and told
                fresh = {name: f"{self.node_host}:{address.rsplit(':', 1)[1]}" for name, address in fresh.items()}
                self._fixed.update(fresh)
                self.announce(fresh, [])
            self.addresses.update(fresh)
            child.stage = "bound"
            if self._started.is_set():  # a restarted node joins a program already running
                self._construct(child)
        elif kind == "constructed":
            (self._has_run[child.name],) = body
            child.stage = "constructed"
            if self._started.is_set():
                self._run_child(child)
        elif kind == "saving":
            if body[0]:
                child.saving_since = time.monotonic()
            else:
                child.saving_since, child.saved_at = None, time.monotonic()
        elif child.leaving:  # its end, however it comes, is the removal's
            return True
        elif kind == "finished":
            self.node_finished(child.name)
        elif kind == "failed":
            child.failure = body[0]
        elif kind == "stop_program":
            self.request_stop(body[0])
        return True

    def _reap(self, child: _Child) -> None:
        while child.conn.poll() and self._receive(child):  # messages sent just before exiting
            pass
        child.process.join()
        exitcode = child.process.exitcode
        child.stage = "exited"
        if child.leaving:
            return
        if exitcode == 0 and child.failure is None:
            self.node_finished(child.name, exitcode)
            return
        cause = child.failure or self._death_report(child.name, exitcode)
        reset_after = child.policy.reset_after
        if child.running_since is not None and reset_after is not None and \
                time.monotonic() - child.running_since >= reset_after:
            child.restarts = 0  # it had been healthy: not part of a crash loop
        child.running_since = None
        if self._may_restart(child):
            child.stage, child.restart_at = "waiting", time.monotonic() + child.policy.delay(child.restarts)
            child.restarts += 1
            self.node_restarting(child.name, cause, exitcode)
            print(
                f"[launcher] restarting {child.name} ({child.restarts} of {child.policy.max_restarts} in a row) "
                f"in {max(0.0, child.restart_at - time.monotonic()):.1f} s; it {describe_exit(exitcode)}",
                flush=True,
            )
            return
        if child.restarts and child.restarts >= child.policy.max_restarts:
            cause = f"crashed {child.restarts + 1} times, more than its restart limit allows; last:\n{cause}"
        self.node_failed(child.name, cause, exitcode)

    def _may_restart(self, child: _Child) -> bool:
        return (
            self._started.is_set()
            and not self._stop_requested.is_set()
            and child.restarts < child.policy.max_restarts
        )

    def _restart_due(self) -> None:
        now = time.monotonic()
        for child in self._children.values():
            if child.stage != "waiting":
                continue
            if self._stop_requested.is_set() or child.leaving:
                child.stage = "exited"
            elif now >= child.restart_at:
                self._spawn(child)

    def _run_child(self, child: _Child) -> None:
        self.node_started(child.name, self._has_run[child.name], child.process.pid)
        child.stage, child.running_since = "running", time.monotonic()
        self._send(child, "run")

    def _advance_start(self, deadline: float) -> None:
        """Move all children through bind -> construct -> run together (the two-phase start)."""
        if self._started.is_set():
            return
        stages = {child.stage for child in self._children.values()}
        if stages == {"bound"}:
            for child in self._children.values():
                self._construct(child)
        elif stages == {"constructed"}:
            for child in self._children.values():
                self._run_child(child)
            self._started.set()  # only now: launch() returns with every node marked running
        elif "exited" in stages or self._stop_requested.is_set():
            self._started.set()
        elif time.monotonic() > deadline:
            late = sorted((child for child in self._children.values() if child.stage in _STARTING),  # stuck first
                          key=lambda child: (child.stage not in ("spawned", "constructing"), child.name))
            states = "; ".join(f"{child.name} {_STARTING[child.stage]}" for child in late)
            self.node_failed(late[0].name, f"the start timeout ({self._start_timeout:g} s) ran out: {states} (a "
                                           f"slower start needs jd.launch(..., start_timeout=...), or the agents' "
                                           f"--start-timeout); {self._last_lines(late[0].name)}")
            self._started.set()

    def _construct(self, child: _Child) -> None:
        self._send(child, "construct", dict(self.addresses))
        child.stage = "constructing"

    def _send(self, child: _Child, *message: Any) -> None:
        if child.stage not in ("exited", "waiting"):
            with contextlib.suppress(OSError, ValueError):
                child.conn.send(message)

    def _death_report(self, name: str, exitcode: int | None) -> str:
        return f"process {describe_exit(exitcode)}; {self._last_lines(name)}"

    def _last_lines(self, name: str) -> str:
        log = log_path(self.run_dir, name)
        return f"last lines of {log}:\n{_tail(log, 20)}"

    # Scaling (`Running.scale`) ----------------------------------------------------------------

    def _scalable_program(self, group: str) -> Program:
        if group in self._program.factories:
            self.runs_here(group, len(self._program.groups[group]))  # a group that cannot scale here says so
        return self._program

    def _add_nodes(self, group: str, nodes: list[Node]) -> None:
        """Spawn the share of `nodes` that runs here; the monitor takes each through bind ->
        construct -> run as it does a restarted node, against the current address table."""
        policies = restart_policies(self._program, self._restart)
        offset = len(self._program.groups[group]) - len(nodes)
        mine = [node for index, node in enumerate(nodes, offset) if self.runs_here(group, index)]  # else another host's
        children = {unit.name: _Child(unit.name, group, unit, policies[unit.name]) for node in mine for unit in node.units()}
        self._track(list(children))
        for child in children.values():  # spawned before the monitor sees them: it would spawn a waiting child too
            self._spawn(child)
        self._children = {**self._children, **children}  # a new dict: the monitor may be iterating the old one
        deadline = time.monotonic() + self._start_timeout
        while not all(self._statuses.get(name, NodeStatus()).state == RUNNING for name in children):
            if self._stop_requested.wait(0.05):
                raise RuntimeError(f"program '{self.program_name}' stopped while group '{group}' grew: {self.stop_reason}")
            if time.monotonic() > deadline:
                slow = sorted(name for name, status in self.status().items() if name in children and status["state"] != RUNNING)
                raise TimeoutError(f"nodes {slow} added to group '{group}' did not start within the start timeout "
                                   f"({self._start_timeout:g} s); they are still supervised")

    def _remove_nodes(self, nodes: list[Node]) -> None:
        """The ordered stop of the removed nodes that run here, then they are forgotten."""
        names = [unit.name for node in nodes for unit in node.units()]
        leaving = [self._children[name] for name in names if name in self._children]
        for child in leaving:
            child.leaving = True
        self._stop_children([child for child in leaving if child.process is not None])
        while any(child.stage != "exited" for child in leaving):  # the monitor reaps them
            time.sleep(0.02)
        self._children = {name: child for name, child in self._children.items() if child not in leaving}
        served = [name for node in nodes for unit in node.units() for name in serving_names(unit)]
        for name in served:  # under multihost, one grown again binds anew, not its launch-time port
            self._fixed.pop(name, None)
        self._forget([*names, *served])
        self.announce({}, [name for child in leaving for name in serving_names(child.node)])

    # Stopping -------------------------------------------------------------------------------

    def _shut_down(self) -> None:
        self._stop_children([child for child in self._children.values() if child.process is not None])
        if self._monitor is not None and self._monitor is not threading.current_thread():
            self._monitor.join()
        self.remove_sockets()

    def remove_sockets(self) -> None:
        """Remove the nodes' socket directory, once no node serves in it."""
        if self._socket_dir is not None:
            shutil.rmtree(self._socket_dir, ignore_errors=True)

    def _stop_children(self, children: list[_Child]) -> None:
        """Stop message and SIGTERM, `grace` seconds (a save under way: up to `save_grace` from its
        start), then SIGKILL of every tree; nodes that stop first (learners) get their own `grace`
        before the others are told. Only the monitor reaps children (two threads joining one
        process lose its exit code)."""
        first = [child for child in children if child.node.stops_first()]
        for phase in (first, [child for child in children if child not in first]):
            for child in phase:
                self._send(child, "stop")
                if not _exited(child.process):
                    signal_tree(child.process.pid, signal.SIGTERM)
            self._wait_for_exits(phase, time.monotonic() + self._grace)
        for child in children:
            if not _exited(child.process):
                if child.saving_since is not None:
                    print(f"[launcher] {child.name} was killed {time.monotonic() - child.saving_since:.0f} s into "
                          f"saving its checkpoint (save_grace={self._save_grace:g} s): a relaunch restores its last "
                          f"complete one", flush=True)
                signal_tree(child.process.pid, signal.SIGKILL)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(child.process.pid, signal.SIGKILL)  # anything its tree left in its group
        self._wait_for_exits(children, None)

    def _wait_for_exits(self, children: list[_Child], deadline: float | None) -> None:
        """Until every child exited, or, with a `deadline`, until each still running is past it
        (a child saving its checkpoint: past `save_grace` from the save's start)."""
        pending = {child.process.sentinel: child for child in children}
        while pending:
            timeout = None
            if deadline is not None:
                until = max(self._stop_deadline(child, deadline) for child in pending.values())
                if time.monotonic() >= until:
                    return
                timeout = min(max(0.0, until - time.monotonic()), 0.2)  # a save may begin or end meanwhile
            for sentinel in multiprocessing.connection.wait(list(pending), timeout):
                del pending[sentinel]

    def _stop_deadline(self, child: _Child, deadline: float) -> float:
        """`deadline`, or later for a save: `save_grace` from its start while it runs, then the
        grace again from its end, to exit."""
        if child.saving_since is not None:
            return max(deadline, child.saving_since + self._save_grace)
        return deadline if child.saved_at is None else max(deadline, child.saved_at + self._grace)


def _exited(process: multiprocessing.Process) -> bool:
    """Whether `process` ended, without reaping it (the monitor alone reaps)."""
    return bool(multiprocessing.connection.wait([process.sentinel], 0))


def _tail(path: str, count: int) -> str:
    try:
        with open(path, "rb") as log:
            return b"".join(log.readlines()[-count:]).decode("utf-8", errors="replace")
    except OSError:
        return "(no log)"
