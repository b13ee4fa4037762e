"""Which hosts a multi-host run spans and which one this is: from options, SLURM, Kubernetes or
a TPU VM.

Every host runs the same script; each must find the same host list (in the same order) and its
own index in it, without hearing from the others. Sources, first match wins:

- explicit: `hosts=[...]`, `host_index=...` (or the `--hosts/--host-index` flags, see
  `add_arguments`);
- SLURM (`srun --ntasks-per-node=1 python script.py`): the step's (else the job's) node list,
  expanded as `scontrol show hostnames` does, and `SLURM_NODEID` (else `SLURM_PROCID`);
- Kubernetes, an Indexed Job (or a JobSet's Job) under a headless Service: `JOB_COMPLETION_INDEX`
  (set by Kubernetes), the pod count in `JAXDIST_NUM_HOSTS` (set in the manifest), and the peers'
  names from this pod's own DNS name, `<job>-<index>.<service>.<namespace>.svc...`;
- TPU VM on GKE: `TPU_WORKER_HOSTNAMES` and `TPU_WORKER_ID`;
- TPU VM (`gcloud ... ssh --worker=all`, whose processes have no TPU variables): the GCE metadata
  server's `worker-network-endpoints` and `agent-worker-number`, as JAX's own cluster detection
  reads them. It is asked only on a Google Compute Engine machine or when `GCE_METADATA_IP`
  names a server, with a short timeout, so elsewhere nothing waits on a network that is not there.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import os
import re
import socket
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from typing import Any


@dataclasses.dataclass(frozen=True)
class Cluster:
    hosts: tuple[str, ...]
    host_index: int
    source: str  # "explicit", "slurm", "kubernetes", "tpu" or "tpu-metadata"

    def __post_init__(self) -> None:
        if not self.hosts:
            raise ValueError(f"a multi-host run needs at least one host ({self.source})")
        if not 0 <= self.host_index < len(self.hosts):
            raise ValueError(
                f"host index {self.host_index} is outside the {len(self.hosts)} hosts "
                f"{list(self.hosts)} ({self.source}); indices run from 0 to {len(self.hosts) - 1}"
            )

    @property
    def host(self) -> str:
        return self.hosts[self.host_index]


def detect(
    hosts: Sequence[str] | str | None = None,
    host_index: int | None = None,
    environ: Mapping[str, str] | None = None,
) -> Cluster:
    """The hosts and this host's index: explicit ones if given, else detected (see the module doc)."""
    environ = os.environ if environ is None else environ
    if hosts is not None or host_index is not None:
        if hosts is None or host_index is None:
            raise ValueError(
                f"give both hosts and host_index, or neither (to detect them from SLURM or TPU-VM); "
                f"got hosts={hosts!r}, host_index={host_index!r}"
            )
        host_list = parse_hosts(hosts) if isinstance(hosts, str) else [str(host) for host in hosts]
        return Cluster(tuple(host_list), int(host_index), "explicit")
    cluster = _from_slurm(environ) or _from_kubernetes(environ) or _from_tpu(environ) or _from_tpu_metadata(environ)
    if cluster is None:
        raise ValueError(
            "cannot tell which hosts this run spans: no hosts=/host_index= given, no SLURM step "
            "(SLURM_JOB_NODELIST and SLURM_NODEID), no Kubernetes Indexed Job (JOB_COMPLETION_INDEX), no TPU "
            "variables (TPU_WORKER_HOSTNAMES and TPU_WORKER_ID) and no TPU VM's metadata server; "
            "pass hosts=[...], host_index=i, or --hosts h0,h1 --host-index i"
        )
    return cluster


def parse_hosts(text: str) -> list[str]:
    """"h0,h1" or a SLURM node list ("node[01-03],gpu7") -> host names in order."""
    return expand_nodelist(text)


def expand_nodelist(nodelist: str) -> list[str]:
    """`node[01-03,07],login1` -> node01 node02 node03 node07 login1, like `scontrol show
    hostnames`: ranges keep their zero padding; several bracket groups in one name multiply."""
    return [host for item in _split_top_level(nodelist.strip()) for host in _expand_one(item)]


def _split_top_level(text: str) -> list[str]:
    items, depth, current = [], 0, ""
    for char in text:
        if char == "[":
            depth += 1
        elif char == "]":
            depth -= 1
            if depth < 0:
                raise ValueError(f"unbalanced ']' in node list {text!r}")
        if char == "," and depth == 0:
            items.append(current)
            current = ""
        else:
            current += char
    if depth != 0:
        raise ValueError(f"unbalanced '[' in node list {text!r}")
    items.append(current)
    items = [item.strip() for item in items]
    if any(not item for item in items):
        raise ValueError(f"empty host name in node list {text!r}")
    return items


def _expand_one(item: str) -> list[str]:
    parts = re.split(r"\[([^\]]*)\]", item)  # literal, ranges, literal, ranges, ..., literal
    choices = []
    for index, part in enumerate(parts):
        choices.append(_expand_ranges(part, item) if index % 2 else [part])
    return ["".join(combination) for combination in itertools.product(*choices)]


def _expand_ranges(ranges: str, item: str) -> list[str]:
    names = []
    for piece in ranges.split(","):
        match = re.fullmatch(r"\s*(\d+)(?:-(\d+))?\s*", piece)
        if match is None:
            raise ValueError(f"cannot read range {piece!r} in node list entry {item!r}; expected forms like node[01-03,07]")
        start, end = match.group(1), match.group(2) or match.group(1)
        if int(end) < int(start):
            raise ValueError(f"range {piece!r} in {item!r} runs backwards")
        width = len(start)
        names.extend(f"{number:0{width}d}" for number in range(int(start), int(end) + 1))
    return names


def _from_slurm(environ: Mapping[str, str]) -> Cluster | None:
    nodelist = environ.get("SLURM_STEP_NODELIST") or environ.get("SLURM_JOB_NODELIST") or environ.get("SLURM_NODELIST")
    index = environ.get("SLURM_NODEID", environ.get("SLURM_PROCID"))
    if not nodelist or index is None:
        return None
    hosts = expand_nodelist(nodelist)
    tasks = environ.get("SLURM_STEP_NUM_TASKS") or environ.get("SLURM_NTASKS")
    if tasks is not None and int(tasks) != len(hosts):
        raise ValueError(
            f"SLURM runs {tasks} tasks on {len(hosts)} hosts {hosts}; the multihost launcher needs "
            f"exactly one task per host: srun --ntasks-per-node=1 (it starts every node of a host itself)"
        )
    return Cluster(tuple(hosts), int(index), "slurm")


def _from_tpu(environ: Mapping[str, str]) -> Cluster | None:
    names, index = environ.get("TPU_WORKER_HOSTNAMES"), environ.get("TPU_WORKER_ID")
    if not names or index is None:
        return None
    return Cluster(tuple(name.strip() for name in names.split(",") if name.strip()), int(index), "tpu")


NUM_HOSTS_ENV = "JAXDIST_NUM_HOSTS"
"""Set in a Kubernetes manifest to the Job's pod count (`completions`): pods are not told it."""


def _from_kubernetes(environ: Mapping[str, str]) -> Cluster | None:
    index = environ.get("JOB_COMPLETION_INDEX")
    if index is None:
        return None
    count = environ.get(NUM_HOSTS_ENV)
    if not count:
        raise ValueError(
            f"a Kubernetes Indexed Job gives this pod JOB_COMPLETION_INDEX={index} but not how many pods "
            f"the run spans: set {NUM_HOSTS_ENV} in the pod template's env to the Job's completions"
        )
    return Cluster(kubernetes_hosts(socket.getfqdn(), int(index), int(count)), int(index), "kubernetes")


def kubernetes_hosts(fqdn: str, index: int, count: int) -> tuple[str, ...]:
    """Every pod's DNS name, from this pod's: an Indexed Job names its pods `<job>-<index>` (a
    JobSet's Job `<jobset>-<replicated job>-<job index>-<index>`), and a pod whose template sets
    `subdomain` is `<pod>.<subdomain>.<namespace>.svc.<cluster domain>` under that headless Service."""
    pod, _, domain = fqdn.partition(".")
    if not pod.endswith(f"-{index}"):
        raise ValueError(
            f"this pod is {pod!r}, which does not end in its completion index -{index}: the multihost "
            f"launcher expects an Indexed Job (completionMode: Indexed), whose pods are <job>-<index>"
        )
    if not domain:
        raise ValueError(
            f"pod {pod!r} has no DNS name its peers can reach: set subdomain: <service> in the pod "
            f"template and create that headless Service (clusterIP: None) selecting the Job's pods"
        )
    job = pod[: -len(f"-{index}")]
    return tuple(f"{job}-{i}.{domain}" for i in range(count))


METADATA_ENV = "GCE_METADATA_IP"
"""host[:port] of the GCE metadata server in place of metadata.google.internal (as JAX reads it)."""

METADATA_TIMEOUT = 3.0
"""Seconds each metadata query may take: the server answers in milliseconds where it exists."""


def _from_tpu_metadata(environ: Mapping[str, str]) -> Cluster | None:
    server = environ.get(METADATA_ENV)
    if server is None and not _on_google_compute_engine():
        return None
    server = server or "metadata.google.internal"
    index = _metadata(server, "agent-worker-number")
    if index is None:  # a GCE machine, but not a TPU VM's worker
        return None
    endpoints = _metadata(server, "worker-network-endpoints")
    if endpoints is None:
        raise ValueError(f"the metadata server at {server} gives agent-worker-number={index} but no "
                         f"worker-network-endpoints; pass --hosts h0,h1 --host-index {index}")
    return Cluster(tpu_worker_addresses(endpoints), int(index), "tpu-metadata")


def tpu_worker_addresses(endpoints: str) -> tuple[str, ...]:
    """`worker-network-endpoints` -> addresses: entries are hosts, or (the older format)
    `name:id:ip` triples, whose ip is the address."""
    addresses = []
    for entry in endpoints.strip().split(","):
        parts = entry.strip().split(":")
        if len(parts) not in (1, 3) or not parts[-1]:
            raise ValueError(f"cannot read {entry!r} in the TPU VM's worker-network-endpoints {endpoints!r}: "
                             f"expected hosts or name:id:ip triples")
        addresses.append(parts[-1])
    return tuple(addresses)


def _on_google_compute_engine() -> bool:
    try:
        with open("/sys/class/dmi/id/product_name") as product:
            return product.read().strip() == "Google Compute Engine"
    except OSError:  # not Linux, or no DMI: not a GCE VM
        return False


def _metadata(server: str, key: str) -> str | None:
    """An instance attribute from the metadata server; None when the instance has no such key."""
    url = f"http://{server}/computeMetadata/v1/instance/attributes/{key}"
    request = urllib.request.Request(url, headers={"Metadata-Flavor": "Google"})
    try:
        with urllib.request.urlopen(request, timeout=METADATA_TIMEOUT) as response:
            return response.read().decode()
    except urllib.error.HTTPError as error:
        if error.code == 404:
            return None
        raise ValueError(f"asked the GCE metadata server for {key} ({url}): HTTP {error.code}; "
                         f"pass --hosts h0,h1 --host-index i instead") from None
    except (OSError, TimeoutError) as error:
        raise ValueError(f"asked the GCE metadata server for {key} ({url}) and got no answer within "
                         f"{METADATA_TIMEOUT} s ({error}); off a TPU VM unset {METADATA_ENV}, or pass "
                         f"--hosts h0,h1 --host-index i") from None


# Flags for scripts ----------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """`--hosts`, `--host-index`, `--coordinator`, `--base-port`, `--tls-dir`: all optional (SLURM,
    Kubernetes and TPU VMs are detected); pass `from_args(args)` to `jd.launch(program, launcher="multihost", ...)`."""
    group = parser.add_argument_group("multihost")
    group.add_argument("--hosts", default=None, help="comma-separated hosts, or a SLURM node list like node[01-04]")
    group.add_argument("--host-index", type=int, default=None, help="this host's index in --hosts")
    group.add_argument("--coordinator", default=None, help="host:port of the jax.distributed coordinator")
    group.add_argument("--base-port", type=int, default=None, help="first port of host 0's range")
    group.add_argument("--tls-dir", default=None,
                       help="certificates from python -m jaxdist.tools.certs DIR --hosts ... (mutual TLS between hosts)")


def from_args(args: argparse.Namespace) -> dict[str, Any]:
    """The multihost launcher options the flags of `add_arguments` set (unset flags left out)."""
    options = {
        "hosts": args.hosts,
        "host_index": args.host_index,
        "coordinator": args.coordinator,
        "base_port": args.base_port,
        "tls_dir": args.tls_dir,
    }
    return {key: value for key, value in options.items() if value is not None}


def distributed_from_env(environ: Mapping[str, str] | None = None) -> dict[str, Any] | None:
    """Arguments of `parallel.initialize` that the multihost launcher put in this process's
    environment (its jax.distributed group only), or None outside that group."""
    environ = os.environ if environ is None else environ
    if "JAXDIST_COORDINATOR_ADDRESS" not in environ:
        return None
    return {
        "coordinator_address": environ["JAXDIST_COORDINATOR_ADDRESS"],
        "num_processes": int(environ["JAXDIST_NUM_PROCESSES"]),
        "process_id": int(environ["JAXDIST_PROCESS_ID"]),
    }
