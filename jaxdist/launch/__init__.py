"""`launch(program, launcher=...)`: a launcher is a module `jaxdist.launch.launchers.<name>` with a
`launch(program, **options) -> Running` function, so a new launcher is a new file there."""

from __future__ import annotations

import importlib
import pkgutil
import sys
from typing import Any

from jaxdist.launch.context import (current_node, finish_on_stop, saving_checkpoint, stop, stop_requested,
                                   wait_for_stop)
from jaxdist.launch.output import log_path
from jaxdist.launch.restart import Restart
from jaxdist.launch.run_lock import holder as run_dir_holder
from jaxdist.launch.errors import LaunchError, NodeFailedError
from jaxdist.launch.running import RUNNING, Running
from jaxdist.launch import launchers
from jaxdist.program import Program


def available_launchers() -> list[str]:
    return sorted(module.name for module in pkgutil.iter_modules(launchers.__path__))


NO_MAIN_GUARD = (
    "error: jd.launch() ran again while a node's process was importing your script: node processes "
    "import the script that launched them, so put the launch under `if __name__ == \"__main__\":` "
    "(build the program in a function and call it there)")


def _importing_main_for_a_node() -> bool:
    """Whether this is a node's process still importing the launcher's main module: a script
    without the main guard launches again there."""
    import multiprocessing

    return bool(getattr(multiprocessing.current_process(), "_inheriting", False))


def launch(program: Program, launcher: str = "processes", **options: Any) -> Running:
    """Start `program` with the named launcher and return its `Running` once every node runs.

    The same program runs under every launcher; only where its nodes live changes:

    ``"threads"``: every node a thread of this process (tests, debugging, a laptop).
        run_dir: logs, checkpoints and metrics (default: ``runs/<program name>`` under the
        current directory, so that launching the same program again resumes from its checkpoints).
        token: the courier secret every node's server requires (default: a random one).
        grace: seconds a stop gives nodes to return from run() (10).
        save_grace: seconds more a stop gives a node saving the checkpoint its next life restores
        (``jd.saving_checkpoint()``: learners, replay, ES), from the save's start (300).
        interrupt_after: seconds after which a node still running at the stop is interrupted (2).
        echo: print each node's output, prefixed with its name (True).
        resources: refused: threads share one process.

    ``"processes"`` (default): every node (or threads colocation) a process, supervised.
        run_dir, token, grace, interrupt_after, echo: as above; after `grace` a process still
        alive is killed (SIGKILL) with its children.
        resources: per group, ``{"env": {...}}``: environment variables of the group's processes,
        set (and read by JAX) before their node is built (e.g. JAX_PLATFORMS, XLA_FLAGS).
        restart: per group, a ``jd.Restart`` policy; groups without one get their node type's
        (learners, replay, parameter servers and cachers come back; plain nodes do not).
        start_timeout: seconds to wait for the nodes to bind and be built (300).

    ``"multihost"``: the same script on every host; each host starts its share (see the docs' guide
    "Several hosts"). Everything of ``"processes"``, and:
        hosts, host_index: the host list and this host's place in it (default: from SLURM or
        TPU-VM variables). placement: per group, ``jd.on_host(i)``, ``jd.per_host()`` or
        ``jd.spread()``. base_port (47000), ports_per_host: the port ranges. coordinator:
        host:port of jax.distributed (default: host 0). distributed: the per_host group that
        joins jax.distributed. bind_host: what servers bind ("0.0.0.0" for every interface).
        token: required, the same on every host (or $JAXDIST_TOKEN). tls_dir: certificates from
        ``python -m jaxdist.tools.certs`` for mutual TLS between hosts (or $JAXDIST_TLS_DIR).

    ``"ray"``: every node (or threads colocation) a Ray actor on a Ray cluster, run inside it as
    under ``"processes"`` (``pip install -e '.[ray]' in the jaxdist clone``). Everything of ``"processes"``, and:
        address: the cluster, as ``ray.init`` takes it ("auto", "ray://head:10001"; default: the
        connection this process has, else ``ray.init()``'s default). resources: per group, also
        ``num_cpus`` (0), ``num_gpus``, ``memory`` and ``resources`` ({"TPU": 4}, custom ones)
        for each node's actor. placement, distributed: as under ``"multihost"``, a host being a
        bundle of one placement group on its own Ray node; num_hosts: how many (default: the
        per_host group's size, else the cluster's nodes). bind_host: what servers bind (default
        127.0.0.1 when the cluster is this machine, else "node": each Ray node's IP). tls_dir:
        as under ``"multihost"``, with a certificate per Ray node's IP.

    A script that launches `processes`, `multihost` or `ray` needs the ``if __name__ == "__main__":``
    guard: node processes import the script's main module again. Arguments that make no launch
    (or hosts that cannot be detected) raise ``LaunchError`` before the program runs.
    """
    if _importing_main_for_a_node():  # said here: a forked node process exits without a word
        print(NO_MAIN_GUARD, file=sys.stderr, flush=True)
        raise SystemExit(1)
    if launcher not in available_launchers():
        raise LaunchError(f"unknown launcher {launcher!r}; available: {', '.join(available_launchers())}")
    module = importlib.import_module(f"jaxdist.launch.launchers.{launcher}")
    try:
        running = module.launch(program, **options)
    except LaunchError:
        raise
    except ValueError as error:  # the launchers' checks of what they were given, made before starting
        raise LaunchError(str(error)) from error
    if launcher != "multihost" and "units" not in options:  # the whole program is here
        _say_if_nothing_runs(running)
    return running


def _say_if_nothing_runs(running: Running) -> None:
    """A program of services alone never ends by itself: `wait()` would block without a word."""
    statuses = running.status().values()
    if statuses and not any(status["has_run"] or status["state"] != RUNNING for status in statuses):
        print(f"note: no node of program '{running.program_name}' has a run() method, so it serves until "
              f"stopped: jd.stop() from a served method, Running.stop(), or Ctrl-C", file=sys.stderr, flush=True)


__all__ = [
    "LaunchError",
    "NodeFailedError",
    "Restart",
    "Running",
    "available_launchers",
    "current_node",
    "finish_on_stop",
    "launch",
    "log_path",
    "run_dir_holder",
    "saving_checkpoint",
    "stop",
    "stop_requested",
    "wait_for_stop",
]
