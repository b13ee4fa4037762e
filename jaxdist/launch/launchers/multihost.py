"""The multihost launcher: the same script runs on every host; each host starts its share.

    jd.launch(program, launcher="multihost", placement={"learner": jd.per_host(),
              "actor": jd.spread(), "replay": jd.on_host(0)}, token=shared_secret)

Hosts and this host's index come from `hosts=`/`host_index=`, else SLURM, else TPU-VM (see
`jaxdist.launch.hosts`). Every host computes the same placement and address table from the
program and the host list (see `jaxdist.launch.placement`) and starts its own units with the
processes launcher, supervised as there (restarts on the same address, stop of whole trees).

The two-phase start holds per host: a host's nodes all bind before any of them is constructed.
Across hosts nothing is exchanged, so a node may be constructed before a server on another host
is bound; that is fine because every address is known in advance and courier clients wait for
a server to come up (gRPC `wait_for_ready`): a call to a peer not yet up waits, it does not fail.
Only the nodes `running.scale` adds later bind ports no plan fixed: their host tells the others
where they serve, and that they left when removed, over the control ports (`host_control`).

A host's program ends when its nodes with work finish, on `jd.stop()` in one of its nodes, on
SIGTERM (`srun`/`scancel` send it to every host), or on a failure; whichever host stops first
tells the others through their control ports (see `jaxdist.launch.host_control`), so the whole
program stops together. Each host also calls every other host's launcher once it is up: a peer
that refuses this host's token (the hosts were given different ones) ends the run on both hosts
with a `HostMismatchError` naming the fix, raised by `wait()`.

Nodes of the group that joins `jax.distributed` (the only per_host() group, or the one named by
`distributed=`) get JAXDIST_COORDINATOR_ADDRESS, JAXDIST_NUM_PROCESSES and JAXDIST_PROCESS_ID
(= host index) in their environment; actors and replay stay out of that group.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Mapping, Sequence
from concurrent import futures
from typing import Any

from jaxdist import courier
from jaxdist.courier import tls
from jaxdist.launch import host_control
from jaxdist.launch import hosts as hosts_module
from jaxdist.launch import placement as placement_module
from jaxdist.launch import preflight
from jaxdist.launch.launchers import processes
from jaxdist.launch.placement import Placement, Plan
from jaxdist.launch.running import Running
from jaxdist.program import Program

SUPPORTED_RESOURCES = processes.SUPPORTED_RESOURCES
TOKEN_ENV = "JAXDIST_TOKEN"
AUTO = "auto"
LOOPBACK = ("127.0.0.1", "localhost", "::1")
MISMATCH_LINGER = 5.0
"""How long a host that found a peer refusing its token keeps its own control port up (less once
the peer is gone): the peer's own check, waiting on that port, reconnects at least once a second
(courier's backoff ceiling), so it sees the refusal too and stops as well."""


PEER_PING_INTERVAL = 1.0
PEER_LOST_AFTER = 5.0
PEER_WAIT_NOTICE = 10.0
"""A peer not up this long after this host started gets one line naming it: until it is, this
host's calls to its nodes wait (a learner there, say: actors here hold no parameters)."""
"""A peer's control port silent this long, unannounced, means the peer is gone (see _check_peers)."""
PEER_START_TIMEOUT_ENV = "JAXDIST_PEER_START_TIMEOUT"
"""Seconds a host waits for each peer to answer once (default 300): hosts start in any order, but
a peer that never comes up, or dies before it is seen, must not keep this host running for ever."""


class HostLostError(RuntimeError):
    """Another host of the run vanished without a word (its launcher was killed, its machine lost)."""


class HostMismatchError(RuntimeError):
    """Hosts of one multi-host run that cannot work together: they were given different tokens."""


def launch(
    program: Program,
    *,
    placement: Mapping[str, Placement] | None = None,
    hosts: Sequence[str] | str | None = None,
    host_index: int | None = None,
    coordinator: str | None = None,
    base_port: int = 47000,
    ports_per_host: int | None = None,
    bind_host: str | None = None,
    distributed: str | None = AUTO,
    token: str | None = None,
    tls_dir: str | None = None,
    resources: dict[str, dict[str, Any]] | None = None,
    environ: Mapping[str, str] | None = None,
    **options: Any,
) -> Running:
    """Start this host's share of `program`; returns once its nodes run (see `processes.launch`).

    `token`: the courier secret, the same on every host (default: $JAXDIST_TOKEN); a random
    one per host would lock the hosts out of each other. `tls_dir`: certificates from
    `python -m jaxdist.tools.certs DIR --hosts ...` (default: $JAXDIST_TLS_DIR): every courier server
    and client of the run, the control ports included, then use mutual TLS (this process and
    the nodes' get $JAXDIST_TLS_DIR and $JAXDIST_TLS_NAME, see `jaxdist.courier.tls`).
    `bind_host`: what servers bind ("0.0.0.0" for every interface); default: the host's name in
    the host list. Other options (run_dir, restart, grace, echo, ...) go to the processes launcher.
    """
    preflight.check_program(program)
    environ = os.environ if environ is None else environ
    cluster = hosts_module.detect(hosts, host_index, environ)
    print(f"[launcher] this is host {cluster.host_index} of {', '.join(cluster.hosts)} ({cluster.source})", flush=True)
    _use_tls(tls_dir or environ.get(tls.TLS_DIR_ENV), cluster.hosts, cluster.host_index)
    the_plan = placement_module.plan(program, cluster.hosts, placement, base_port, ports_per_host, coordinator)
    token = token or environ.get(TOKEN_ENV)
    if not token and len(cluster.hosts) > 1:  # an empty secret is none
        raise ValueError(
            f"a multi-host run needs one courier token shared by every host: pass token=... or set "
            f"${TOKEN_ENV} to the same secret on all {len(cluster.hosts)} hosts"
        )
    resources = preflight.check_resources(program, resources, SUPPORTED_RESOURCES)
    resources = _with_distributed_env(resources, the_plan, _distributed_group(the_plan, distributed), cluster.host_index)
    running = processes.launch(
        program,
        resources=resources,
        token=token,
        units=the_plan.units_on(cluster.host_index),
        addresses=the_plan.addresses,
        bind_host=bind_host,
        host_index=cluster.host_index,
        **options,
    )
    running.runs_here = lambda label, index: (placement or {}).get(label, placement_module.DEFAULT).host_of(
        label, index, len(cluster.hosts)) == cluster.host_index  # what `scale` adds: this host's share
    running.node_host = cluster.host
    if len(cluster.hosts) > 1:
        try:
            control = host_control.serve(running, cluster.host_index, the_plan.controls, bind_host, token)
        except BaseException:
            running.stop()
            raise
        running.announce = control.announce
        _check_peers(running, the_plan.controls, cluster.host_index, token, control)
    return running


def _use_tls(directory: str | None, hosts: Sequence[str], host_index: int) -> None:
    """Mutual TLS from this host's certificate in `directory`, for this process and its nodes';
    without it, one line when courier traffic leaves this machine in cleartext."""
    if directory:
        directory = os.path.abspath(directory)
        try:
            tls.TLS.load(directory, hosts[host_index])
        except FileNotFoundError as missing:  # a launch option's mistake: launch() says it in one line
            raise ValueError(str(missing)) from None
        os.environ.update({tls.TLS_DIR_ENV: directory, tls.TLS_NAME_ENV: hosts[host_index]})
    elif any(host not in LOOPBACK for host in hosts):
        print(f"[launcher] courier runs without TLS between hosts {', '.join(dict.fromkeys(hosts))}: calls' keys "
              f"(whoever reads one may call its node), parameters and stops cross the network in cleartext. For "
              f"mutual TLS run `python -m jaxdist.tools.certs DIR --hosts {','.join(dict.fromkeys(hosts))}` and launch "
              f"with tls_dir=DIR (--tls-dir DIR)", flush=True)


def _check_peers(running: Running, controls: tuple[str, ...], host_index: int, token: str | None,
                 control: Any) -> None:
    """Call every other host's launcher, each call waiting for it to come up (hosts start in any
    order); a refusal of this host's token aborts the run. Meanwhile a watcher pings each peer
    every PEER_PING_INTERVAL s: a peer that was up (it answered, or it called this host) and whose
    control port then stays silent for PEER_LOST_AFTER s without having said it finished its
    share (or told this host to stop) lost its launcher or its machine, and this host stops too,
    with a ``HostLostError`` naming it. The calls end with this host's stop."""
    peers = {index: address for index, address in enumerate(controls) if index != host_index}
    clients = {index: courier.Client(address, token=token, timeout=None) for index, address in peers.items()}

    def close(reason: str) -> None:
        for client in clients.values():
            client.close()

    running.on_stop(close)

    def check(index: int) -> None:
        try:
            clients[index].ping(host_index)
        except courier.AuthenticationError:
            _until_gone(clients[index])
            running.abort(HostMismatchError(
                f"host {index} at {peers[index]} refused the courier token of host {host_index}: every host of a "
                f"multi-host run needs the same token (pass token=... or set ${TOKEN_ENV} to one secret on all hosts)"))
        except (courier.CourierError, futures.CancelledError, ValueError):
            pass  # the stop closed the client (ValueError: on a closed channel), or the peer went away

    start_timeout = float(os.environ.get(PEER_START_TIMEOUT_ENV, 300))

    def watch(index: int) -> None:
        prober, seen, silent_since = clients[index].with_timeout(1.0).failing_fast(), False, None
        started, noticed = time.monotonic(), False
        try:
            while True:
                try:
                    prober.ping(host_index)
                    seen, silent_since = True, None
                except (courier.UnavailableError, courier.DeadlineExceededError):
                    seen = seen or index in control.seen_hosts
                    if not seen and not noticed and time.monotonic() - started >= PEER_WAIT_NOTICE:
                        noticed = True
                        print(f"[launcher] host {host_index} waits for host {index} at {peers[index]}, not up yet: "
                              f"start the same command there (host index {index}); calls to its nodes wait for it",
                              flush=True)
                    if not seen and time.monotonic() - started >= start_timeout:
                        running.abort(HostLostError(
                            f"host {index} at {peers[index]} never answered in {start_timeout:g} s: start the same "
                            f"command there (host index {index}), or check the host list and that the ports are "
                            f"open (${PEER_START_TIMEOUT_ENV} sets how long to wait)"))
                        return
                    silent_since = (silent_since or time.monotonic()) if seen else None
                    if silent_since is not None and index not in control.finished_hosts \
                            and time.monotonic() - silent_since >= PEER_LOST_AFTER:
                        running.abort(HostLostError(
                            f"host {index} at {peers[index]} stopped answering without finishing or stopping the "
                            f"program: its launcher died or its machine went away; host {host_index} stops too"))
                        return
                time.sleep(PEER_PING_INTERVAL)
        except (courier.CourierError, futures.CancelledError, ValueError):
            return  # this host's stop closed the client, or the peer refuses the token (check reports it)

    for index in peers:
        threading.Thread(target=check, args=(index,), name=f"jaxdist-peer-{index}", daemon=True).start()
        threading.Thread(target=watch, args=(index,), name=f"jaxdist-watch-{index}", daemon=True).start()


def _until_gone(peer: courier.Client) -> None:
    """Returns once the peer's control port is gone (it stopped), or after MISMATCH_LINGER s."""
    prober, deadline = peer.with_timeout(1.0).failing_fast(), time.monotonic() + MISMATCH_LINGER
    while time.monotonic() < deadline:
        try:
            prober.ping()
        except courier.AuthenticationError:
            time.sleep(0.1)  # still up, and still refusing
        except (courier.CourierError, futures.CancelledError, ValueError):
            return


def plan_for(program: Program, **options: Any) -> Plan:
    """The plan `launch` would follow with these options, without starting anything."""
    cluster = hosts_module.detect(options.get("hosts"), options.get("host_index"), options.get("environ"))
    return placement_module.plan(
        program, cluster.hosts, options.get("placement"), options.get("base_port", 47000),
        options.get("ports_per_host"), options.get("coordinator"),
    )


def _distributed_group(plan: Plan, distributed: str | None) -> str | None:
    if distributed != AUTO:
        if distributed is not None and distributed not in plan.distributed_groups:
            raise ValueError(
                f"distributed={distributed!r} must name a group placed per_host(); "
                f"per_host groups: {list(plan.distributed_groups) or 'none'}"
            )
        return distributed
    if len(plan.distributed_groups) > 1:
        raise ValueError(
            f"several groups are placed per_host() {list(plan.distributed_groups)}; name the one whose "
            f"processes join jax.distributed with distributed='<group>' (or None for none)"
        )
    return plan.distributed_groups[0] if plan.distributed_groups else None


def _with_distributed_env(
    resources: dict[str, dict[str, Any]], plan: Plan, group: str | None, host_index: int
) -> dict[str, dict[str, Any]]:
    if group is None:
        return resources
    spec = dict(resources.get(group, {}))
    spec["env"] = {
        **spec.get("env", {}),
        "JAXDIST_COORDINATOR_ADDRESS": plan.coordinator,
        "JAXDIST_NUM_PROCESSES": str(len(plan.hosts)),
        "JAXDIST_PROCESS_ID": str(host_index),
    }
    return {**resources, group: spec}
