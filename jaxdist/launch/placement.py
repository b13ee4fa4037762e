"""Where each group's nodes run in a multi-host program, and the address table that follows.

Every host computes the same plan from the same program and host list, so no host needs to hear
from another to know every address: host `h` owns the ports `base_port + h * ports_per_host`
onwards; the serving nodes placed on it take them in program order; the second-to-last port of
every host's range is its launcher's control port (a stop travels between hosts through it); the
last port of host 0's range is the `jax.distributed` coordinator's.

Placements, per group (a group without one goes to host 0):
- `per_host()`: one node per host, node `i` on host `i`; the group must have exactly as many
  nodes as there are hosts (a data-parallel learner: one process per host).
- `spread()`: node `i` on host `i % hosts` (actors).
- `on_host(k)`: every node on host `k` (replay, a parameter server).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from jaxdist.program import AddressTable, Node, Program


@dataclasses.dataclass(frozen=True)
class Placement:
    kind: str  # "per_host", "spread" or "on_host"
    host: int = 0

    def hosts_for(self, label: str, count: int, num_hosts: int) -> list[int]:
        """The host of each of the group's `count` nodes, in order."""
        if self.kind == "per_host":
            if count != num_hosts:
                raise ValueError(
                    f"group '{label}' is placed per_host() over {num_hosts} hosts but has {count} nodes; "
                    f"add exactly one node per host (node i runs on host i), or use spread()"
                )
            return list(range(count))
        if self.kind == "spread":
            return [index % num_hosts for index in range(count)]
        if not 0 <= self.host < num_hosts:
            raise ValueError(f"group '{label}' is placed on_host({self.host}) but there are only {num_hosts} hosts")
        return [self.host] * count

    def host_of(self, label: str, index: int, num_hosts: int) -> int:
        """The host of node `index` of a group that `Running.scale` changes, as if it had been
        there at launch; a per_host group has one node per host, so it cannot scale."""
        if self.kind == "per_host":
            raise ValueError(f"group '{label}' is placed per_host(): exactly one node on each host (a learner spanning "
                             f"hosts), so it cannot grow or shrink; only spread() and on_host(k) groups scale")
        return self.hosts_for(label, index + 1, num_hosts)[index]


def per_host() -> Placement:
    """One node of the group on every host: node i on host i."""
    return Placement("per_host")


def spread() -> Placement:
    """The group's nodes round-robin over the hosts: node i on host i % hosts."""
    return Placement("spread")


def on_host(index: int) -> Placement:
    """Every node of the group on host `index`."""
    if not isinstance(index, int) or index < 0:
        raise ValueError(f"on_host takes a host index >= 0, got {index!r}")
    return Placement("on_host", index)


DEFAULT = on_host(0)


@dataclasses.dataclass(frozen=True)
class Plan:
    hosts: tuple[str, ...]
    host_of: dict[str, int]
    """Unit name -> index of the host that runs it."""
    addresses: AddressTable
    """Name of every node that may serve -> "host:port", on every host the same."""
    coordinator: str
    """host:port of the jax.distributed coordinator (host 0)."""
    distributed_groups: tuple[str, ...]
    """Groups placed per_host(): their processes form the jax.distributed group."""
    controls: tuple[str, ...] = ()
    """host:port of each host's launcher control server, by host index."""

    def units_on(self, host_index: int) -> list[str]:
        return [name for name, host in self.host_of.items() if host == host_index]


def plan(
    program: Program,
    hosts: tuple[str, ...],
    placement: Mapping[str, Placement] | None = None,
    base_port: int = 47000,
    ports_per_host: int | None = None,
    coordinator: str | None = None,
) -> Plan:
    """The placement of every unit and the address table, the same on every host.

    `ports_per_host=None` sizes each host's range to the largest need of any host plus one (so
    it depends only on the program and host count); fix it to keep ranges stable for firewalls.
    """
    placement = dict(placement or {})
    unknown = sorted(set(placement) - set(program.groups))
    if unknown:
        raise ValueError(
            f"placement names groups {unknown} that program '{program.name}' does not have; "
            f"groups: {', '.join(sorted(program.groups))}"
        )
    for label, spec in placement.items():
        if not isinstance(spec, Placement):
            raise TypeError(f"placement['{label}'] must be jd.per_host(), jd.spread() or jd.on_host(k), got {spec!r}")
    host_of: dict[str, int] = {}
    serving: list[list[str]] = [[] for _ in hosts]
    for label, members in program.groups.items():
        for node, host in zip(members, placement.get(label, DEFAULT).hosts_for(label, len(members), len(hosts))):
            for unit in node.units():
                host_of[unit.name] = host
                serving[host].extend(serving_names(unit))
    needed = max(len(names) for names in serving) + 2  # + the control and coordinator ports
    if ports_per_host is None:
        ports_per_host = needed
    elif ports_per_host < needed:
        busiest = max(range(len(hosts)), key=lambda index: len(serving[index]))
        raise ValueError(
            f"host {busiest} runs {len(serving[busiest])} serving nodes, but ports_per_host={ports_per_host} "
            f"leaves room for {ports_per_host - 2} (two ports are the control server's and the coordinator's); "
            f"raise ports_per_host"
        )
    last_port = base_port + len(hosts) * ports_per_host - 1
    if base_port < 1 or last_port > 65535:
        raise ValueError(
            f"ports {base_port}..{last_port} ({len(hosts)} hosts x {ports_per_host}) do not fit in 1..65535; "
            f"lower base_port or ports_per_host"
        )
    addresses = {
        name: f"{hosts[host]}:{base_port + host * ports_per_host + offset}"
        for host, names in enumerate(serving)
        for offset, name in enumerate(names)
    }
    coordinator = coordinator or f"{hosts[0]}:{base_port + ports_per_host - 1}"
    distributed = tuple(label for label, spec in placement.items() if spec.kind == "per_host")
    controls = tuple(f"{host}:{base_port + index * ports_per_host + ports_per_host - 2}"
                     for index, host in enumerate(hosts))
    return Plan(tuple(hosts), host_of, addresses, coordinator, distributed, controls)


def serving_names(unit: Node) -> list[str]:
    """Names of the nodes in a unit that may bind a server: a unit of several nodes (a threads
    colocation, nested ones included) lists them in `nodes`; any other unit is one node."""
    parts = getattr(unit, "nodes", None)
    return [name for part in parts for name in serving_names(part)] if parts else [unit.name]
