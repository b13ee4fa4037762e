"""``train(config, launcher=..., run_dir=...) -> summary``: launch ES's program and follow it.

The master node writes the run directory's outputs (see :mod:`jaxdist.agents.es.master`) and
ends the program after its last generation; the launching process saves the config, prints a
progress line from the master's ``status()`` now and then and returns the master's
``summary.json`` (the keys ``jaxdist.agents.cli.report`` reads) once the program is over.
Under the multihost launcher that is host 0 (the master's); the other hosts run their
evaluators until the program stops.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any, TextIO

import jaxdist as jd
from jaxdist import courier
from jaxdist.agents import config as configs
from jaxdist.agents.distributed import env_slug
from jaxdist.agents.es import builder
from jaxdist.agents.es.config import ESConfig
from jaxdist.agents.es.master import ALREADY_FINISHED, SUMMARY
from jaxdist.agents.monitor import serve_share

AGENT = "es"


def train(config: ESConfig, *, launcher: str = "processes", run_dir: str | None = None,
          start_time: float | None = None, compilation_cache: str | None = None, echo: bool = True,
          progress_interval: float = 2.0, out: TextIO | None = None,
          launch_options: dict[str, Any] | None = None) -> dict[str, Any]:
    """Run ES's program to its end; returns the summary (see ``Master``) and saves the config
    in ``run_dir`` (default ``runs/es-<env>-seed<seed>``).

    ``start_time`` (a ``time.time()``) is when the clock started, e.g. at the top of a script,
    so that imports and start-up count; default: now. ``launch_options`` go to ``jd.launch``
    (the multihost launcher's hosts, host_index, ...); a host other than 0 returns only its
    stop reason and index. Ctrl-C stops the program in order (the master checkpoints) and
    returns the summary with the stop reason saying so.
    """
    start_time = time.time() if start_time is None else start_time
    out = out or sys.stdout
    run_dir = os.path.abspath(run_dir or os.path.join("runs", f"{AGENT}-{env_slug(config.env_id)}-seed{config.seed}"))
    configs.save(run_dir, AGENT, config)
    topology = builder.build(config, start_time)
    options: dict[str, Any] = {"run_dir": run_dir, "echo": echo}
    if launcher != "threads":
        options["resources"] = builder.resources(compilation_cache)
    if launcher == "multihost":
        options["placement"] = builder.placement()
    launched = time.time()
    running = jd.launch(topology.program, launcher=launcher, **options, **(launch_options or {}))
    if running.host_index:
        return serve_share(running, AGENT, out)
    master = courier.Client(running.addresses[topology.master.node_name], token=running.token, timeout=2.0)
    status: dict[str, Any] = {}
    interrupted = False
    try:
        while not running.wait(timeout=progress_interval):
            status = _print_progress(out, master, running, start_time, status) or status
    except KeyboardInterrupt:  # Ctrl-C: wait() has already stopped the program in order
        interrupted = True
    finally:
        running.stop()
        master.close()
    summary = _read_summary(run_dir, launched)
    if interrupted:
        summary = _interrupted(run_dir, summary or _unknown_summary(config, status, time.time() - start_time),
                               saved=summary is not None)
    elif summary is None:
        raise RuntimeError(f"the program ended ({running.stop_reason}) without the master's summary: see "
                           f"{os.path.join(run_dir, 'logs')}")
    elif summary["stop_reason"] == ALREADY_FINISHED:
        print(f"[{AGENT}] {run_dir} holds a run that trained for its {summary['env_steps']:,} env steps; pass --fresh "
              f"to start over, or a larger --total-steps with --allow-config-change to train on",
              file=out, flush=True)
    return summary


def _read_summary(run_dir: str, written_after: float) -> dict[str, Any] | None:
    """The summary the master wrote during this launch, if it did."""
    path = os.path.join(run_dir, SUMMARY)
    if not os.path.exists(path) or os.path.getmtime(path) < written_after:
        return None
    with open(path) as f:
        return json.load(f)


def _interrupted(run_dir: str, summary: dict[str, Any], saved: bool) -> dict[str, Any]:
    """The summary of a run stopped by Ctrl-C, with a stop reason that says how to go on."""
    generation = summary.get("generations")
    if not generation:
        reason = "stopped by Ctrl-C before the first generation"
    elif saved:  # the master wrote its summary after its checkpoint
        reason = f"stopped by Ctrl-C at generation {generation} (checkpoint saved); run the same command to resume"
    else:
        reason = (f"stopped by Ctrl-C at generation {generation}; run the same command to resume from the latest "
                  f"checkpoint")
    summary = dict(summary, stop_reason=reason)
    with open(os.path.join(run_dir, SUMMARY), "w") as f:
        json.dump(summary, f, indent=2)
    return summary


def _unknown_summary(config: ESConfig, status: dict[str, Any], wall_time: float) -> dict[str, Any]:
    """When a stop cut the master short of its summary: what the last progress line knew, in the
    keys ``cli.report`` reads (this segment only: earlier segments' wall time is not known here)."""
    return {"seed": config.seed, "env_id": config.env_id, "target_return": config.target_return,
            "wall_time_to_target": None, "steps_to_target": None, "env_steps": status.get("env_steps", 0),
            "wall_time": round(wall_time, 2), "steps_per_second": None, "final_return": status.get("episode_return"),
            "generations": status.get("generation")}


def _print_progress(out: TextIO, master: courier.Client, running: jd.Running, start_time: float,
                    last: dict[str, Any]) -> dict[str, Any] | None:
    """Prints the master's status after a generation newer than ``last``'s; returns that status."""
    try:
        status = master.status()
    except courier.CourierError:
        return None  # starting, restarting or done
    if "episode_return" not in status or status["generation"] == last.get("generation"):
        return None  # no generation finished yet, or none since the last line
    restarts = sum(int(node.get("restarts") or 0) for node in running.status().values())
    print(f"[{AGENT}] {time.time() - start_time:6.1f}s  generation {status['generation']:>4}  env steps "
          f"{status['env_steps']:>11,}  return {status['episode_return']:8.1f} (mean policy)  population "
          f"{status['population_return']:8.1f}  requeued {status['requeued']}  restarts {restarts}",
          file=out, flush=True)
    return status
