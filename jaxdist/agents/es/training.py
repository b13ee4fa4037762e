"""``train(config, launcher=..., run_dir=...) -> summary``: launch ES's program and follow it.

The master node writes the run directory's outputs (see :mod:`jaxdist.agents.es.master`); the
launching process only prints a progress line from the master's ``status()`` now and then and
returns the master's ``summary.json`` once the program is over. Under the multihost launcher
that is host 0 (the master's); the other hosts run their evaluators until the program stops.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any, TextIO

import jaxdist as jd
from jaxdist import courier
from jaxdist.agents.es import builder
from jaxdist.agents.es.config import ESConfig
from jaxdist.agents.es.master import ALREADY_FINISHED


def train(config: ESConfig, *, launcher: str = "processes", run_dir: str | None = None,
          start_time: float | None = None, compilation_cache: str | None = None, echo: bool = True,
          progress_interval: float = 2.0, out: TextIO | None = None,
          launch_options: dict[str, Any] | None = None) -> dict[str, Any]:
    """Run ``make_program(config)`` to its end; returns the summary (see ``Master``).

    ``start_time`` (a ``time.time()``) is when the clock started, e.g. at the top of a script,
    so that imports and start-up count; default: now. ``launch_options`` go to ``jd.launch``
    (the multihost launcher's hosts, host_index, placement, ...); a host other than 0 returns
    only its stop reason and index.
    """
    start_time = time.time() if start_time is None else start_time
    out = out or sys.stdout
    env_name = config.env_id.lower().rsplit("-v", 1)[0]
    run_dir = os.path.abspath(run_dir or os.path.join("runs", f"es-{env_name}-seed{config.seed}"))
    options: dict[str, Any] = {"run_dir": run_dir, "echo": echo}
    if launcher != "threads":
        options.update(resources=builder.resources(compilation_cache), restart=builder.restarts())
    running = jd.launch(builder.make_program(config, start_time), launcher=launcher, **options,
                        **(launch_options or {}))
    if running.host_index:
        return _serve_share(running, out)
    master = courier.Client(running.addresses[builder.MASTER], token=running.token, timeout=2.0)
    try:
        while not running.wait(timeout=progress_interval):
            _print_progress(out, master, running, start_time)
    finally:
        running.stop()
        master.close()
    with open(os.path.join(run_dir, "summary.json")) as f:
        summary = json.load(f)
    if summary["stop_reason"] == ALREADY_FINISHED:
        print(f"[es] {run_dir} holds a run that trained for its {summary['env_steps']:,} env steps; pass --fresh "
              f"to start over, or a larger --total-steps to train on", file=out, flush=True)
    return summary


def _serve_share(running: jd.Running, out: TextIO) -> dict[str, Any]:
    print(f"[es] host {running.host_index} runs its evaluators; host 0 reports progress", file=out, flush=True)
    try:
        running.wait()
    finally:
        running.stop()
    return {"stop_reason": running.stop_reason, "host_index": running.host_index}


def _print_progress(out: TextIO, master: courier.Client, running: jd.Running, start_time: float) -> None:
    try:
        status = master.status()
    except courier.CourierError:
        return  # starting, restarting or done
    if "episode_return" not in status:
        return  # no generation finished yet
    restarts = sum(int(node.get("restarts") or 0) for node in running.status().values())
    print(f"[es] {time.time() - start_time:6.1f}s  generation {status['generation']:>4}  env steps "
          f"{status['env_steps']:>11,}  return {status['episode_return']:8.1f} (mean policy)  population "
          f"{status['population_return']:8.1f}  requeued {status['requeued']}  restarts {restarts}",
          file=out, flush=True)
