"""The ray launcher: every unit of the program (a node, or a threads colocation) in its own Ray
actor on an existing Ray cluster; Ray only schedules, nodes talk through courier.

    jd.launch(program, launcher="ray", address="auto",
              resources={"learner": {"num_gpus": 1}}, placement={"learner": jd.on_host(0)})

Inside its actor a unit runs exactly as under `processes`: that launcher's supervisor starts it
as a child process of the actor, restarts it on its address by the program's restart policy (a
learner restores its checkpoint), and stops its whole tree. This launcher adds the cluster:

- Placement: Ray places the actors through one placement group. Without `placement`, each
  top-level node is a bundle (its colocated parts together), spread over the cluster; with it,
  each host is a bundle (``STRICT_SPREAD``: one Ray node each) and groups go to hosts as under
  `multihost` (`jd.per_host()`, `jd.spread()`, `jd.on_host(k)`; unplaced groups on host 0).
  Actors that `running.scale` adds join the same placement group (it cannot grow): on their
  host's bundle with `placement`, else on a bundle with room for what they ask Ray for.
- Resources per group: Ray's ``num_cpus``, ``num_gpus``, ``memory`` and ``resources`` (custom
  ones, ``{"TPU": 4}``) for each node's actor, plus ``env`` as under `processes`.
- The two-phase start across actors: every actor's node binds and reports its addresses and
  waits; once the table is complete every node is constructed with it, then all run.
- A per_host group joins one `jax.distributed` group as under `multihost` (coordinator on the
  Ray node of host 0).
- `jd.stop()` in a node, a unit that fails past its policy, or the end of the work stops the
  program from here, in order: nodes that stop first (learners), then the rest; then the actors
  and the placement group go. A unit whose actor dies (killed, out of memory) is, by its restart
  policy, given a new actor on its bundle, where it binds its old addresses again.
- Servers bind 127.0.0.1 when the cluster is this machine, else their Ray node's IP, with mutual
  TLS when given `tls_dir` (a certificate per Ray node's IP).

What travels through Ray: each actor's constructor arguments, which Ray pickles: the program
(pickled by this launcher as `processes` pickles a node for its child: classes by reference,
found by importing the launching script on the Ray node), the launch's token and options.
"""

from __future__ import annotations

import dataclasses
import functools
import multiprocessing
import multiprocessing.spawn
import os
import pickle
import socket
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from jaxdist.courier import tls
from jaxdist.launch import placement as placement_module
from jaxdist.launch import preflight, sigterm, worker
from jaxdist.launch.launchers import processes
from jaxdist.launch.launchers.multihost import AUTO, _distributed_group, _use_tls, _with_distributed_env
from jaxdist.launch.placement import Placement
from jaxdist.launch.restart import NEVER, Restart
from jaxdist.launch.restart import policies as restart_policies
from jaxdist.launch.run_lock import RunLock
from jaxdist.launch.running import FAILED, FINISHED, RUNNING, STARTING, STOPPED, WORK_DONE, NodeStatus, Running
from jaxdist.program import AddressTable, Node, Program

RAY_OPTIONS = {
    "num_cpus": "CPUs Ray reserves for each node of the group (0)",
    "num_gpus": "GPUs for each node (Ray sets CUDA_VISIBLE_DEVICES)",
    "memory": "bytes of memory Ray reserves for each node",
    "resources": "other Ray resources for each node, e.g. {'TPU': 4} or a custom one",
}
SUPPORTED_RESOURCES = {**processes.SUPPORTED_RESOURCES, **RAY_OPTIONS}
POLL_INTERVAL = 0.2
"""Seconds between the launcher's looks at its actors (their nodes' states, stops they ask for)."""
BUNDLE_FLOOR = {"CPU": 0.01}
"""A placement group bundle may not be empty: what a bundle of nodes that ask for nothing holds."""
PLACEMENT_PATIENCE = 10.0
"""Seconds of waiting for the placement group before the launcher says what it waits for."""
LOOPBACK = "127.0.0.1"
NODE_IP = "node"
CONNECT_TIMEOUT = 10.0
"""Seconds the cluster's address has to accept a connection before ray.init is called: ray.init
retries an address where no cluster is (any more) for minutes, without a word to the user."""
CURRENT_CLUSTER = "/tmp/ray/ray_current_cluster"  # where `ray start` writes the address "auto" finds


def launch(
    program: Program,
    *,
    address: str | None = None,
    run_dir: str | None = None,
    resources: dict[str, dict[str, Any]] | None = None,
    placement: Mapping[str, Placement] | None = None,
    num_hosts: int | None = None,
    distributed: str | None = AUTO,
    restart: dict[str, Restart] | None = None,
    token: str | None = None,
    grace: float = 10.0,
    save_grace: float = 300.0,
    interrupt_after: float = 2.0,
    echo: bool = True,
    start_timeout: float = 300.0,
    bind_host: str | None = None,
    tls_dir: str | None = None,
) -> Running:
    """Start `program` on a Ray cluster; returns once every node runs (or one failed: see `wait`).

    `address`: the cluster, as `ray.init` takes it ("auto": the one this machine belongs to,
    "ray://head:10001": Ray Client); None: the connection this process already has, else
    `ray.init()`'s default ($RAY_ADDRESS, or a new local cluster). A connection this launcher
    made is closed at the stop. `num_hosts`: the hosts `placement` spreads over (default: the
    per_host group's size, else the cluster's node count). `bind_host`: what servers bind
    ("node": each Ray node's IP; default: 127.0.0.1 when the whole cluster is this machine, else "node").
    `tls_dir`: certificates from `python -m jaxdist.tools.certs DIR --hosts <each Ray node's IP>,...`
    where every Ray node reads them (default: $JAXDIST_TLS_DIR): every courier server and client
    of the run then uses mutual TLS, each under the name of its host's IP (127.0.0.1 on loopback).
    """
    ray = _import_ray()
    preflight.check_program(program)
    if not ray.is_initialized():
        _check_cluster_answers(address)
    resources = preflight.check_resources(program, resources, SUPPORTED_RESOURCES)
    restart_policies(program, restart)  # its mistakes said before Ray starts
    preflight.check_shippable(program)
    run_dir = preflight.prepare_run_dir(program, run_dir)
    run_lock = RunLock(run_dir)
    owns_connection = not ray.is_initialized()
    try:
        if owns_connection:
            ray.init(address=address, log_to_driver=echo)
        layout = _layout(program, placement, num_hosts or _default_hosts(program, placement, ray), resources)
        distributed = _distributed_group(layout.plan, distributed) if layout.plan else None
        tls_dir = tls_dir or os.environ.get(tls.TLS_DIR_ENV)
        host = _bind_host(ray, bind_host, tls_dir)
        if tls_dir:  # this process's own certificate, for its clients (the monitor's, `Running.client`)
            tls_dir = os.path.abspath(tls_dir)
            _use_tls(tls_dir, [host if host != NODE_IP else ray.util.get_node_ip_address()], 0)
        group = _placement_group(ray, layout, start_timeout)
    except BaseException:
        run_lock.release()
        if owns_connection and ray.is_initialized():
            ray.shutdown()
        raise
    running = _RayRunning(program, run_dir, token or preflight.new_token(), (grace, save_grace), ray, group,
                          owns_connection)
    running.hold_until_over(run_lock)
    try:
        running.start(layout, resources, restart, (host, tls_dir), distributed, (echo, interrupt_after, start_timeout))
    except BaseException:
        running.stop()  # the actors made so far, and the placement group
        raise
    return running


def _import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise ImportError("launcher='ray' needs Ray: pip install ray (in the jaxdist clone: pip install -e '.[ray]'), on this "
                          "machine and on every node of the Ray cluster") from None
    return ray


def _check_cluster_answers(address: str | None) -> None:
    """Refuse, in one line and within CONNECT_TIMEOUT, an address where no Ray cluster answers:
    "host:port", "ray://host:port", or what "auto" and None stand for ($RAY_ADDRESS, else for
    "auto" the cluster `ray start` last started on this machine; None without $RAY_ADDRESS
    starts a local cluster)."""
    target = address
    if address in (None, AUTO):
        target = os.environ.get("RAY_ADDRESS")
        if not target and address == AUTO and os.path.exists(CURRENT_CLUSTER):
            with open(CURRENT_CLUSTER) as f:
                target = f.read().strip()
    if not target or target in (AUTO, "local"):
        return  # Ray's own search (or a new local cluster): it says itself when it finds none
    host, _, port = target.removeprefix("ray://").rpartition(":")
    try:
        socket.create_connection((host, int(port)), timeout=CONNECT_TIMEOUT).close()
    except (OSError, ValueError) as error:
        raise ValueError(f"no Ray cluster answers at {target} ({error or type(error).__name__}): start one there "
                         f"(`ray start --head`) or give the address of one that runs (--ray-address; 'auto': "
                         f"the one this machine belongs to)") from None


# Where the units go ----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Layout:
    """Each unit's bundle in the placement group, and what each bundle holds."""

    bundle_of: dict[str, int]
    bundles: list[dict[str, float]]
    strategy: str
    plan: placement_module.Plan | None = None
    """The multihost plan when `placement` was given: hosts are bundles."""
    placement: Mapping[str, Placement] = dataclasses.field(default_factory=dict)


def _default_hosts(program: Program, placement: Mapping[str, Placement] | None, ray: Any) -> int:
    per_host = [label for label, spec in (placement or {}).items() if spec.kind == "per_host"]
    if per_host:
        return len(program.groups[per_host[0]])
    return sum(1 for node in ray.nodes() if node.get("Alive"))


def _layout(program: Program, placement: Mapping[str, Placement] | None, num_hosts: int,
            resources: dict[str, dict[str, Any]]) -> _Layout:
    labels = {unit.name: label for label, unit in program.units()}
    if placement:
        hosts = tuple(f"host{index}" for index in range(num_hosts))
        plan = placement_module.plan(program, hosts, placement, base_port=1)  # its ports are not used here
        bundle_of, strategy = dict(plan.host_of), "STRICT_SPREAD"
    else:
        plan, bundle_of, strategy = None, {}, "SPREAD"
        tops = [node for members in program.groups.values() for node in members]
        for index, node in enumerate(tops):
            bundle_of.update({unit.name: index for unit in node.units()})
    bundles: list[dict[str, float]] = [{} for _ in range(max(bundle_of.values()) + 1)]
    for name, index in bundle_of.items():
        for key, amount in _bundle_resources(resources.get(labels[name], {})).items():
            bundles[index][key] = bundles[index].get(key, 0) + amount
    return _Layout(bundle_of, [bundle or dict(BUNDLE_FLOOR) for bundle in bundles], strategy, plan, dict(placement or {}))


def _actor_options(spec: dict[str, Any]) -> dict[str, Any]:
    """Ray's actor options for one node of a group with resources `spec`."""
    options: dict[str, Any] = {"num_cpus": spec.get("num_cpus", 0)}
    for key in ("num_gpus", "memory", "resources"):
        if spec.get(key):
            options[key] = spec[key]
    return options


def _bundle_resources(spec: dict[str, Any]) -> dict[str, float]:
    amounts = {"CPU": spec.get("num_cpus", 0), "GPU": spec.get("num_gpus", 0), "memory": spec.get("memory", 0),
               **spec.get("resources", {})}
    return {key: amount for key, amount in amounts.items() if amount}


def _placement_group(ray: Any, layout: _Layout, timeout: float) -> Any:
    from ray.util import placement_group, remove_placement_group

    group = placement_group(layout.bundles, strategy=layout.strategy)
    ready, _ = ray.wait([group.ready()], timeout=min(timeout, PLACEMENT_PATIENCE))
    if not ready and timeout > PLACEMENT_PATIENCE:  # an autoscaler may be adding nodes: say what is awaited
        print(f"[launcher] waiting up to {timeout:g} s for Ray to place {len(layout.bundles)} bundles "
              f"({layout.strategy}): {layout.bundles}; the cluster has {ray.available_resources()} free", flush=True)
        ready, _ = ray.wait([group.ready()], timeout=timeout - PLACEMENT_PATIENCE)
    if not ready:
        remove_placement_group(group)
        raise RuntimeError(
            f"Ray could not place the program's {len(layout.bundles)} bundles ({layout.strategy}) within {timeout:g} s: "
            f"they ask for {layout.bundles}; the cluster has {ray.cluster_resources()} over "
            f"{sum(1 for node in ray.nodes() if node.get('Alive'))} nodes. Lower the groups' resources, or num_hosts "
            f"(STRICT_SPREAD puts each host on its own Ray node)")
    return group


def _bind_host(ray: Any, bind_host: str | None, tls_dir: str | None) -> str:
    """Loopback when every Ray node is this machine, else each node's own IP (said once, without TLS)."""
    if bind_host in ("0.0.0.0", "::", ""):
        raise ValueError(f"bind_host={bind_host!r}: under the ray launcher a server's bind address is also the one its "
                         f"peers dial; use 'node' (each Ray node's IP), 127.0.0.1, or leave it out")
    if bind_host is not None:
        return bind_host
    addresses = {node["NodeManagerAddress"] for node in ray.nodes() if node.get("Alive")}
    if addresses <= {ray.util.get_node_ip_address()}:  # not so through Ray Client from elsewhere
        return LOOPBACK
    if not tls_dir:
        print(f"[launcher] courier runs without TLS between the Ray cluster's {len(addresses)} machines: calls' "
              f"keys (whoever reads one may call its node), parameters and stops cross the network in cleartext. "
              f"For mutual TLS run `python -m jaxdist.tools.certs DIR --hosts {','.join(sorted(addresses))}` where every "
              f"node reads DIR and launch with tls_dir=DIR", flush=True)
    return NODE_IP


# The launcher's side -----------------------------------------------------------------------------


@dataclasses.dataclass
class _Unit:
    name: str
    label: str
    node: Node
    policy: Restart
    actor: Any = None
    lost: bool = False
    make_actor: Callable[[], Any] | None = None
    bind_arguments: tuple = ()
    actor_restarts: int = 0
    """Its actor's deaths brought back so far (its node's own crashes are counted in the actor)."""
    leaving: bool = False
    """Removed by `scale`: no longer watched, restarted or reported."""
    bundle: int = 0
    """Its bundle in the launch's placement group."""


class _RayRunning(Running):
    def __init__(self, program: Program, run_dir: str, token: str, graces: tuple[float, float], ray: Any,
                 group: Any, owns_connection: bool) -> None:
        super().__init__(program.name, [unit.name for _, unit in program.units()], run_dir)
        self.token = token
        self._program = program
        self._graces = graces  # (grace, save_grace), as under `processes`
        self._ray = ray
        self._group = group
        self._owns_connection = owns_connection
        self._units = {unit.name: _Unit(unit.name, label, unit, NEVER) for label, unit in program.units()}
        self._watcher: threading.Thread | None = None
        self._actors_lock = threading.Lock()  # no actor is made once the stop took the list to kill
        self._layout: _Layout | None = None
        self._resources: dict[str, dict[str, Any]] = {}
        self._restart: dict[str, Restart] | None = None
        self._serving: tuple[str, str | None] = (LOOPBACK, None)
        self._spawn_options: tuple[bool, float, float] = (True, 2.0, 300.0)
        self._actor_class: Any = None
        self._main: dict[str, Any] = {}

    def start(self, layout: _Layout, resources: dict[str, dict[str, Any]], restart: dict[str, Restart] | None,
              serving: tuple[str, str | None], distributed: str | None, spawn_options: tuple[bool, float, float]) -> None:
        """`serving`: (the bind host, the TLS directory or None)."""
        sigterm.watch(self)
        self._layout, self._resources, self._restart = layout, resources, restart
        self._serving, self._spawn_options = serving, spawn_options
        self._actor_class, self._main = self._ray.remote(UnitActor), _main_preparation()
        payload, policies = self._ray.put(pickle.dumps(self._program)), restart_policies(self._program, restart)  # stored once, for all
        for unit in self._units.values():
            self._make_actor(unit, layout.bundle_of[unit.name], payload, policies)
        unit_resources = self._unit_resources(layout, resources, distributed)
        for unit in self._units.values():
            unit.bind_arguments = (unit_resources[unit.name], *spawn_options)
        if self._start_units(list(self._units.values())):
            self._look()
        self._watcher = threading.Thread(target=self._watch, name="jaxdist-ray-watch", daemon=True)
        self._watcher.start()

    def _make_actor(self, unit: _Unit, bundle: int, payload: Any, policies: dict[str, Restart]) -> None:
        """`unit`'s actor, on `bundle` of the launch's placement group; `payload`: the program it
        finds its unit in."""
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        unit.policy, unit.bundle = policies[unit.name], bundle
        strategy = PlacementGroupSchedulingStrategy(self._group, placement_group_bundle_index=bundle)
        unit.make_actor = functools.partial(self._actor_class.options(
            scheduling_strategy=strategy, max_concurrency=4, **_actor_options(self._resources.get(unit.label, {})),
        ).remote, payload, self._main, unit.name, self.run_dir, self.token, policies, self._graces,
                    *self._serving)
        unit.actor = unit.make_actor()

    def _start_units(self, units: list[_Unit]) -> bool:
        """The two-phase start of `units`: all bind, the table takes their addresses, all are
        constructed (and run) against it; False when one failed (the program then stops)."""
        timeout = self._spawn_options[2]
        bound = self._each(units, "bind", timeout, lambda unit: unit.bind_arguments)
        if bound is None:
            return False
        for report in bound.values():
            self.addresses.update(report["addresses"])
        return self._each(units, "construct", timeout, lambda unit: (dict(self.addresses),)) is not None

    def _unit_resources(self, layout: _Layout, resources: dict[str, dict[str, Any]],
                        distributed: str | None) -> dict[str, dict[str, Any]]:
        """Each unit's resources; a per_host group's nodes get the jax.distributed variables."""
        plain = {name: resources for name in self._units}
        if distributed is None:
            return plain
        first = next(unit for unit in self._units.values()
                     if unit.label == distributed and layout.bundle_of[unit.name] == 0)
        plan = dataclasses.replace(layout.plan, coordinator=self._ray.get(first.actor.free_address.remote()))
        return {name: _with_distributed_env(resources, plan, distributed, layout.bundle_of[name])
                if unit.label == distributed else resources for name, unit in self._units.items()}

    def _each(self, units: list[_Unit], method: str, timeout: float, arguments: Any) -> dict[str, Any] | None:
        """`method` called on every unit's actor at once: their answers by unit, or None when one
        failed or took longer than `timeout` (the program is then stopping, and `wait` says why)."""
        calls = {getattr(unit.actor, method).remote(*arguments(unit)): unit.name for unit in units}
        ready, late = self._ray.wait(list(calls), num_returns=len(calls), timeout=timeout)
        answers, failed = {}, False
        for call in ready:
            name = calls[call]
            try:
                answers[name] = self._ray.get(call)
            except self._ray.exceptions.RayError as error:
                self.node_failed(name, f"its Ray actor failed while the program started:\n{error}")
                failed = True
                continue
            if answers[name].get("error"):
                self.node_failed(name, answers[name]["error"], answers[name].get("exitcode"))
                failed = True
        if late and not failed:
            names = sorted(calls[call] for call in late)
            self.node_failed(names[0], f"nodes {names} did not {method} within the start timeout ({timeout:g} s)")
        return None if failed or late else answers

    # Watching ---------------------------------------------------------------------------------

    def _watch(self) -> None:
        while not self._stop_requested.wait(POLL_INTERVAL):
            self._look()

    def _look(self) -> None:
        """Bring each unit's state here from its actor; act on what changed."""
        calls = {unit.actor.report.remote(): unit for unit in self._units.values() if not (unit.lost or unit.leaving)}
        reports = {}
        for call, unit in calls.items():
            try:
                reports[unit.name] = self._ray.get(call)
            except self._ray.exceptions.RayError as error:
                self._actor_died(unit, error)
        with self._lock:  # every node's state first: whether all work is done depends on them all
            reports = {name: report for name, report in reports.items()
                       if not getattr(self._units.get(name), "leaving", True)}  # removed meanwhile: not reported
            unsettled = [name for name in reports if self._statuses[name].state not in (FINISHED, FAILED, STOPPED)]
            for name in unsettled:
                status, local = self._statuses[name], reports[name]["status"]
                status.has_run, status.pid, status.exitcode = local["has_run"], local["pid"], local["exitcode"]
                status.restarts = local["restarts"] + self._units[name].actor_restarts
                status.last_restart_cause = local["last_restart_cause"] or status.last_restart_cause
                if local["state"] in (STARTING, RUNNING):
                    status.state = local["state"]
        for name in unsettled:
            self._act_on(name, reports[name])

    def _actor_died(self, unit: _Unit, error: Exception) -> None:
        """A unit's actor died: made again on its bundle, by the unit's restart policy, where its
        node binds its old addresses again; past the policy, the program fails."""
        unit.lost = True
        cause = f"its Ray actor died (its Ray node lost, or the actor killed):\n{error}"
        if unit.actor_restarts >= unit.policy.max_restarts:
            if unit.actor_restarts:
                cause = f"its Ray actor died {unit.actor_restarts + 1} times, more than its restart limit allows; last: {cause}"
            self.node_failed(unit.name, cause)
            return
        delay = unit.policy.delay(unit.actor_restarts)
        unit.actor_restarts += 1
        self.node_restarting(unit.name, cause, None)
        print(f"[launcher] restarting {unit.name}'s Ray actor ({unit.actor_restarts} of {unit.policy.max_restarts}) "
              f"in {delay:.1f} s; {cause.splitlines()[0]}", flush=True)
        threading.Thread(target=self._restart_actor, args=(unit, delay), name=f"jaxdist-ray-restart-{unit.name}",
                         daemon=True).start()

    def _restart_actor(self, unit: _Unit, delay: float) -> None:
        if self._stop_requested.wait(delay):
            return
        with self._actors_lock:
            if self._stop_requested.is_set() or unit.leaving:
                return
            _quietly(self._ray.kill, unit.actor, no_restart=True)
            unit.actor, unit.lost = unit.make_actor(), False
        try:
            for method, arguments in (("bind", (*unit.bind_arguments, dict(self.addresses))),
                                      ("construct", (dict(self.addresses),))):
                answer = self._ray.get(getattr(unit.actor, method).remote(*arguments))
                if answer.get("error"):
                    self.node_failed(unit.name, answer["error"], answer.get("exitcode"))
                    return
        except self._ray.exceptions.RayError:
            pass  # died again: the watcher sees it, and the policy decides

    def _act_on(self, name: str, report: dict[str, Any]) -> None:
        local = report["status"]
        if report["asked_stop"] not in (None, WORK_DONE) and local["state"] != FAILED:
            self.request_stop(report["asked_stop"])  # jd.stop() or SIGTERM in the node, maybe just before it returned
        if local["state"] == FINISHED:
            self.node_finished(name, local["exitcode"])
        elif local["state"] == FAILED:
            self.node_failed(name, local["error"], local["exitcode"])

    # Scaling (`Running.scale`) ----------------------------------------------------------------

    def _scalable_program(self, group: str) -> Program:
        plan = self._layout.plan
        if plan is not None and group in self._program.factories:
            self._placement_of(group).host_of(group, 0, len(plan.hosts))  # a per_host group says it cannot scale
            if _bundle_resources(self._resources.get(group, {})):
                raise ValueError(
                    f"group '{group}' asks Ray for {_bundle_resources(self._resources[group])} a node, reserved in the "
                    f"placement group's host bundles, which were sized at launch: with placement=, a group that scales "
                    f"asks for none (no num_cpus, num_gpus, memory or resources), or launch it without placement")
        return self._program

    def _placement_of(self, group: str) -> Placement:
        return self._layout.placement.get(group, placement_module.DEFAULT)

    def _add_nodes(self, group: str, nodes: list[Node]) -> None:
        """New actors for `nodes` in the launch's placement group, started as the first were
        (bind, the table, construct): on their host's bundle with placement=, else on a bundle
        with room (see `_bundles_for`); each finds its unit in the program as it is now."""
        offset, plan = len(self._program.groups[group]) - len(nodes), self._layout.plan
        bundles = [self._placement_of(group).host_of(group, index, len(plan.hosts)) for index in
                   range(offset, offset + len(nodes))] if plan is not None else self._bundles_for(group, nodes, offset)
        payload = self._ray.put(pickle.dumps(self._program))
        policies = restart_policies(self._program, self._restart)
        units = []
        for node, bundle in zip(nodes, bundles):
            for part in node.units():
                unit = _Unit(part.name, group, part, NEVER, bind_arguments=(self._resources, *self._spawn_options))
                self._make_actor(unit, bundle, payload, policies)
                units.append(unit)
        self._track([unit.name for unit in units])
        self._units = {**self._units, **{unit.name: unit for unit in units}}  # a new dict: the watcher may iterate the old
        if not self._start_units(units):
            raise RuntimeError(f"nodes added to group '{group}' failed to start; the program stops: {self.stop_reason}")
        self._look()

    def _bundles_for(self, group: str, nodes: list[Node], offset: int) -> list[int]:
        """Without placement=, the bundle each new node goes to: a placement group cannot grow,
        so one whose bundles still hold what the node asks Ray for (nothing: any bundle, taken
        in turn from the node's index, as the group's first nodes were spread; else the room
        that removed nodes left); a ValueError saying what to do when none has it."""
        each = _bundle_resources(self._resources.get(group, {}))  # what one unit of the group asks for
        free = [dict(bundle) for bundle in self._layout.bundles]
        for unit in self._units.values():
            if not unit.leaving:
                for key, amount in _bundle_resources(self._resources.get(unit.label, {})).items():
                    free[unit.bundle][key] = free[unit.bundle].get(key, 0) - amount
        chosen = []
        for index, node in enumerate(nodes, offset):
            demand = {key: amount * len(node.units()) for key, amount in each.items()}  # its colocated parts together
            turn = [(index + step) % len(free) for step in range(len(free))]
            room = [bundle for bundle in turn
                    if all(free[bundle].get(key, 0) >= amount - 1e-9 for key, amount in demand.items())]
            if not room:
                left = [{key: round(amount, 6) for key, amount in bundle.items()} for bundle in free]
                raise ValueError(
                    f"group '{group}' cannot grow to {node.name}: a node of it asks Ray for {demand}, and no bundle of "
                    f"the launch's placement group has that free (a placement group cannot grow: its bundles were "
                    f"sized for the nodes at launch, and hold {left} free now). Launch the group at its largest size "
                    f"and scale it down at the start (a removed node's room is taken by the next one added), or "
                    f"have the group ask for no resources")
            for key, amount in demand.items():
                free[room[0]][key] -= amount
            chosen.append(room[0])
        return chosen

    def _remove_nodes(self, nodes: list[Node]) -> None:
        """Each removed unit's stop as under `processes`, its actor killed, then forgotten."""
        units = [self._units[part.name] for node in nodes for part in node.units()]
        for unit in units:
            unit.leaving = True
        calls = [call for call in (_quietly(unit.actor.stop.remote) for unit in units if not unit.lost) if call is not None]
        self._ray.wait(calls, num_returns=len(calls), timeout=self._stop_timeout())
        for unit in units:
            _quietly(self._ray.kill, unit.actor, no_restart=True)
        _wait_until_dead(self._ray, [unit.actor for unit in units])
        self._units = {name: unit for name, unit in self._units.items() if unit not in units}
        self._forget([unit.name for unit in units])

    # Stopping ---------------------------------------------------------------------------------

    def _stop_timeout(self) -> float:
        """How long a unit's stop may take in its actor: two phases' grace, a save's, a margin."""
        grace, save_grace = self._graces
        return 2 * grace + save_grace + 10

    def _shut_down(self) -> None:
        """Nodes that stop first (learners), then the rest, each unit's stop as under `processes`
        (stop, SIGTERM, grace, SIGKILL of its tree); then the actors and the placement group."""
        from ray.util import remove_placement_group

        with self._actors_lock:
            units = [unit for unit in self._units.values() if unit.actor is not None]
        if not self._ray.is_initialized():  # Ray was shut down under the program: nothing to reach
            units = []  # (and a call now would start a new local Ray instance)
        first = [unit for unit in units if unit.node.stops_first()]
        for phase in (first, [unit for unit in units if unit not in first]):
            calls = [_quietly(unit.actor.stop.remote) for unit in phase if not unit.lost]
            calls = [call for call in calls if call is not None]
            self._ray.wait(calls, num_returns=len(calls), timeout=self._stop_timeout())
        for unit in units:
            _quietly(self._ray.kill, unit.actor, no_restart=True)
        _wait_until_dead(self._ray, [unit.actor for unit in units])
        if units:
            _quietly(remove_placement_group, self._group)
        if self._watcher is not None and self._watcher is not threading.current_thread():
            self._watcher.join()
        if self._owns_connection:
            self._ray.shutdown()


def _quietly(call: Any, *args: Any, **kwargs: Any) -> Any:
    """`call(...)`, or None when it fails: an actor already gone refuses even to take a call."""
    try:
        return call(*args, **kwargs)
    except Exception:  # noqa: BLE001 - Ray raises a bare Exception for a vanished actor
        return None


def _wait_until_dead(ray: Any, actors: list[Any], timeout: float = 30.0) -> None:
    """Returns once every killed actor answers as dead (`ray.kill` only asks)."""
    deadline = time.monotonic() + timeout
    for actor in actors:
        while time.monotonic() < deadline:
            try:
                ray.get(actor.report.remote(), timeout=max(0.1, deadline - time.monotonic()))
            except ray.exceptions.GetTimeoutError:
                return
            except Exception:  # noqa: BLE001 - dead: RayActorError, or refused at submission
                break
            time.sleep(0.05)


def _main_preparation() -> dict[str, Any]:
    """What a spawned child learns of its parent to import the launching script (its path, and
    this sys.path and sys.argv), for the actors to do the same; no secret (no authkey)."""
    data = multiprocessing.spawn.get_preparation_data("jaxdist-ray")
    keep = ("sys_path", "sys_argv", "dir", "init_main_from_path", "init_main_from_name")
    return {key: value for key, value in data.items() if key in keep}


# The actor's side ------------------------------------------------------------------------------


class UnitActor:
    """One unit of the program in a Ray actor: run by the processes launcher's supervisor as a
    child process of the actor, held between bind and construct until every actor has bound."""

    def __init__(self, payload: bytes, main: dict[str, Any], name: str, run_dir: str, token: str,
                 policies: dict[str, Restart], graces: tuple[float, float], bind_host: str,
                 tls_dir: str | None) -> None:
        _import_main(main)
        program = pickle.loads(payload)
        self._name = name
        self._run_dir, self._token, self._policies, self._graces = run_dir, token, policies, graces
        self._program = program
        self._bind_host = _resolve_bind_host(bind_host)
        if tls_dir:  # this host's certificate, for the node's process (it inherits the environment)
            _use_tls(tls_dir, [self._bind_host], 0)
        self._running: _HeldRunning | None = None

    def free_address(self) -> str:
        """host:port free on this Ray node now (the jax.distributed coordinator's)."""
        with socket.socket() as probe:
            probe.bind((self._bind_host, 0))
            return f"{self._bind_host}:{probe.getsockname()[1]}"

    def bind(self, resources: dict[str, dict[str, Any]], echo: bool, interrupt_after: float,
             start_timeout: float, addresses: AddressTable | None = None) -> dict[str, Any]:
        """Start the unit's process; returns its servers' addresses once bound (or its failure).
        `addresses`: the program's table, when this actor stands in for one that died: the
        unit binds its old addresses again (once its old process let them go)."""
        running = self._running = _HeldRunning(self._program, self._run_dir, self._token, resources,
                                               self._policies, *self._graces)
        running.fix_addresses([self._name], {}, None)
        unit = next(unit for _, unit in self._program.units() if unit.name == self._name)
        placeholders = {name: f"{self._bind_host}:0" for name in placement_module.serving_names(unit)}
        if addresses:
            placeholders = {}
            _wait_until_free([addresses[name] for name in placement_module.serving_names(unit) if name in addresses])
        running.addresses.update(addresses or placeholders)  # what its servers bind: this host, any port
        threading.Thread(target=running.start, args=(echo, interrupt_after, start_timeout),
                         name="jaxdist-ray-unit", daemon=True).start()
        running.wait_held_or_started()
        if not running.held.is_set():
            return self._failure()
        return {"addresses": {name: address for name, address in running.addresses.items()
                              if address != placeholders.get(name)}}

    def construct(self, addresses: AddressTable) -> dict[str, Any]:
        """Construct and run the unit against the complete table; returns once it runs."""
        self._running.release(addresses)
        return self._failure() if self._running.status()[self._name]["state"] == FAILED else {}

    def report(self) -> dict[str, Any]:
        running = self._running
        if running is None:
            return {"status": dataclasses.asdict(NodeStatus()), "asked_stop": None}
        return {"status": running.status()[self._name], "asked_stop": running.asked_stop}

    def stop(self) -> None:
        if self._running is not None:
            self._running.allow_stop()
            self._running.stop()

    def _failure(self) -> dict[str, Any]:
        status = self._running.status()[self._name]
        return {"error": status["error"] or f"the node stopped while starting ({self._running.stop_reason})",
                "exitcode": status["exitcode"]}


def _import_main(preparation: dict[str, Any]) -> None:
    """Import the launching script here as a spawned child does (as __mp_main__, with the
    launcher's sys.path), so the program unpickles by reference as it does in a node's process,
    and the node's own process, spawned from here, imports it too. While it runs jd.launch()
    refuses (a script without the main guard), as in a spawned child."""
    preparation = dict(preparation)
    if not os.path.isdir(preparation.get("dir", "")):
        preparation.pop("dir", None)  # another machine: stay where Ray started the actor
    process = multiprocessing.current_process()
    process._inheriting = True  # type: ignore[attr-defined]
    try:
        multiprocessing.spawn.prepare(preparation)
    finally:
        process._inheriting = False  # type: ignore[attr-defined]


def _wait_until_free(addresses: list[str], timeout: float = worker.ORPHAN_GRACE + 5) -> None:
    """Returns once every address can be bound (as gRPC binds: SO_REUSEADDR), or after
    `timeout`: a dead actor's node process lets its ports go as it stops, by itself."""
    deadline = time.monotonic() + timeout
    for address in addresses:
        host, port = address.rsplit(":", 1)
        while time.monotonic() < deadline:
            with socket.socket() as probe:
                probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                try:
                    probe.bind((host, int(port)))
                    break
                except OSError:
                    time.sleep(0.1)


def _resolve_bind_host(bind_host: str) -> str:
    if bind_host != NODE_IP:
        return bind_host
    import ray

    return ray.util.get_node_ip_address()


class _HeldRunning(processes._ProcessesRunning):
    """The processes supervisor of one unit, with two changes for a program spread over actors:
    its nodes wait after binding until `release` brings the whole address table, and a stop its
    nodes ask for (`jd.stop()`, SIGTERM, the end of their work) is recorded for the launcher,
    which stops the whole program in order, rather than carried out here (until `allow_stop`).
    Its one node process is spawned, the actor's own child: a forkserver would cost each actor
    the imports it saves, and Ray's watch over the actor's children would lose the node."""

    start_method = "spawn"

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.held = threading.Event()
        self.asked_stop: str | None = None
        self._released = threading.Event()
        self._stop_allowed = False

    def _advance_start(self, deadline: float) -> None:
        if not self._released.is_set() and not self._started.is_set() and \
                {child.stage for child in self._children.values()} == {"bound"}:
            self.held.set()
            return
        super()._advance_start(deadline)

    def wait_held_or_started(self) -> None:
        while not (self.held.wait(0.05) or self._started.is_set()):
            pass

    def release(self, addresses: AddressTable) -> None:
        self.addresses.clear()
        self.addresses.update(addresses)
        self._released.set()
        self._started.wait()

    def request_stop(self, reason: str) -> None:
        if self._stop_allowed:
            super().request_stop(reason)
        elif self.asked_stop is None:
            self.asked_stop = reason

    def allow_stop(self) -> None:
        self._stop_allowed = True
