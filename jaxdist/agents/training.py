"""Run an actor/learner program and watch it: ``run(program, spec, launcher=..., run_dir=...)
-> summary``. Every agent with ``Actor`` nodes (``actor/i``) and a ``Learner`` shares it.

The launching process polls the actors (``stats``, ``episodes``) and the learner (``status``)
a few times a second, and from that

- prints a progress line: elapsed time, env steps, env steps/s, mean return of the last
  ``window`` episodes across actors, learner version, lag, restarts;
- writes ``<run_dir>/progress.csv`` (one row every half second, by env steps) and TensorBoard
  scalars: ``tensorboard/progress`` (the same) and ``tensorboard/learner`` (the learner's own
  ``<run_dir>/metrics.csv``, by update: losses, measured policy lag, ..., mirrored as it grows);
- stops the program when the learner has done its ``total_updates`` (or, with
  ``stop_at_target``, as soon as the mean return reaches ``target_return``), and draws the learning curve
  to ``<run_dir>/learning_curve.png``.

Env steps count from the learner's restored version on a resumed run (each update consumes
``steps_per_update`` env steps), so a resumed run's curve continues where it left off.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time
from concurrent import futures
from typing import Any, TextIO

import numpy as np

import jaxdist as jd
from jaxdist import courier
from jaxdist.metrics import MetricsWriter, metrics_path, read_metrics
from jaxdist.metrics_tensorboard import TensorBoardWriter
from jaxdist.plotting import line_plot


@dataclasses.dataclass(frozen=True)
class RunSpec:
    """What the monitor needs to know of an agent's program.

    ``agent`` labels the progress line and the plot (``"ppo"``); ``learner`` is the node name
    of the learner (its ``status()`` gives ``step`` and ``restored_step``); the run ends after
    ``total_updates`` learner steps; each consumes about ``steps_per_update`` env steps (for
    the env-step count of a resumed run). ``resources`` and ``restart`` go to the launcher
    (not for threads). ``return_actors``: the indices of the actors whose episodes make the
    monitored return (None: every actor), e.g. the greediest when actors explore unequally.
    """

    agent: str
    env_id: str
    seed: int
    learner: str
    total_updates: int
    steps_per_update: float
    resources: dict[str, dict[str, Any]] | None = None
    restart: dict[str, Any] | None = None
    return_actors: tuple[int, ...] | None = None


def run(program: jd.Program, spec: RunSpec, *, launcher: str = "processes", run_dir: str | None = None,
        target_return: float = 475.0, stop_at_target: bool = False, window: int = 20,
        start_time: float | None = None, poll_interval: float = 0.1, progress_interval: float = 1.0,
        echo: bool = True, out: TextIO | None = None, launch_options: dict[str, Any] | None = None) -> dict[str, Any]:
    """Launch ``program``, watch it until it ends, and return a summary dict:
    ``wall_time_to_target`` / ``steps_to_target`` (None if the mean return of the last
    ``window`` episodes never reached ``target_return``), ``env_steps``, ``steps_per_second``
    (steady: from the first learner update to the end), ``wall_time``, ``final_return``.

    ``start_time`` (a ``time.time()``) is when the clock started, e.g. at the top of a script,
    so that imports and start-up count; default: now. ``launch_options`` go to ``jd.launch``
    (the multihost launcher's hosts, host_index, placement, ...); under it, host 0 watches the
    whole program and the other hosts only run their share (their summary: the stop reason).
    """
    start_time = time.time() if start_time is None else start_time
    run_dir = os.path.abspath(run_dir or os.path.join("runs", program.name))
    options: dict[str, Any] = {"run_dir": run_dir, "echo": echo}
    if launcher != "threads":
        options.update(resources=spec.resources or {}, restart=spec.restart or {})
    out = out or sys.stdout
    running = jd.launch(program, launcher=launcher, **options, **(launch_options or {}))
    if running.host_index:
        return _serve_share(running, spec, out)
    try:
        monitor = Monitor(running, spec, run_dir, start_time, target_return=target_return, window=window,
                          progress_interval=progress_interval, out=out)
    except BaseException:
        running.stop()
        raise
    if monitor.restored_step >= spec.total_updates:
        running.stop()
        monitor.close()
        print(f"[{spec.agent}] {run_dir} holds a run that finished its {monitor.restored_step} updates; pass "
              f"--fresh to start over, or a larger --total-steps to train on", file=out, flush=True)
        return dict(monitor.summary(), stop_reason="the run had already finished")
    if monitor.restored_step:
        print(f"[{spec.agent}] resuming from the learner's checkpoint at update {monitor.restored_step} "
              f"({monitor.env_steps:,} env steps)", file=out, flush=True)
    reason, over = "the program ended", False
    try:
        while not (over := running.wait(timeout=poll_interval)):
            monitor.poll()
            if monitor.learner_done:
                reason = (f"the learner finished its {spec.total_updates} updates"
                          if monitor.version >= spec.total_updates
                          else f"the learner stopped: {running.stop_reason or 'see its log'}")
                break
            if stop_at_target and monitor.solved_at is not None:
                reason = f"the mean return reached {target_return}"
                break
        if not over:
            monitor.poll(final=True)
    finally:
        running.stop()
        monitor.close()
    summary = monitor.summary()
    summary["stop_reason"] = reason
    with open(os.path.join(run_dir, "summary.json"), "w") as f:
        json.dump(summary, f, indent=2)
    return summary


def _serve_share(running: jd.Running, spec: RunSpec, out: TextIO) -> dict[str, Any]:
    """A host other than 0: run this host's nodes until the program stops (host 0 reports)."""
    print(f"[{spec.agent}] host {running.host_index} runs its share of the program; host 0 reports progress",
          file=out, flush=True)
    try:
        running.wait()
    finally:
        running.stop()
    return {"stop_reason": running.stop_reason, "host_index": running.host_index}


@dataclasses.dataclass
class _Sample:
    elapsed: float
    env_steps: int
    mean_return: float | None
    version: int


class Monitor:
    """Polls a running actor/learner program from outside it; see the module docstring."""

    def __init__(self, running: jd.Running, spec: RunSpec, run_dir: str, start_time: float, *,
                 target_return: float = 475.0, window: int = 20, progress_interval: float = 1.0,
                 out: TextIO = sys.stdout) -> None:
        self.spec, self.run_dir, self.start_time = spec, run_dir, start_time
        self.target_return, self.window = target_return, window
        token = getattr(running, "token", None)
        names = sorted((n for n in running.addresses if n.startswith("actor/")), key=lambda n: int(n.split("/")[1]))
        self._running = running
        self._actors = [courier.Client(running.addresses[n], token=token, timeout=2.0) for n in names]
        self._learner = courier.Client(running.addresses[spec.learner], token=token, timeout=2.0)
        self._pool = futures.ThreadPoolExecutor(len(self._actors) + 1, thread_name_prefix="monitor")
        self._since = [0] * len(self._actors)
        self._episode_steps: list[tuple[float, float]] = []  # (end time, return), all actors
        self._actor_steps = [0] * len(self._actors)  # as last reported
        self._actor_offsets = [0] * len(self._actors)  # steps of earlier lives of restarted actors
        status = None
        deadline = time.monotonic() + 30.0
        while status is None and time.monotonic() < deadline and not self._learner_exited():
            status = _call(self._learner, "status")  # up once launch() returned, unless already done
        self.restored_step = int((status or {}).get("restored_step") or 0)
        if status is None and self._learner_exited():  # it had nothing left to do
            self.restored_step = spec.total_updates
        self._base_steps = round(self.restored_step * spec.steps_per_update)
        self.version = 0
        self.lag: float | None = None
        self.learner_done = False
        self.solved_at: tuple[float, int] | None = None  # (seconds since start, env steps)
        self._first_update: tuple[float, int] | None = None
        self.samples: list[_Sample] = []
        self._rate: tuple[float, int, float] = (time.monotonic(), 0, 0.0)
        self._out, self._progress_interval, self._next_progress = out, progress_interval, 0.0
        self._tty = hasattr(out, "isatty") and out.isatty()
        # Rows past where this run resumes (or all, on a fresh start) belong to a run that was cut
        # short: the CSV drops them, TensorBoard purges them.
        self._csv = MetricsWriter(metrics_path(run_dir, "progress"), purge_after_step=self._base_steps)
        self._tb = TensorBoardWriter(os.path.join(run_dir, "tensorboard", "progress"), purge_step=self._base_steps)
        self._learner_tb = TensorBoardWriter(os.path.join(run_dir, "tensorboard", "learner"),
                                             purge_step=self.restored_step)
        self._mirrored_step = self.restored_step
        self._last_row = self._last_mirror = 0.0

    @property
    def env_steps(self) -> int:
        return self._base_steps + sum(self._actor_steps) + sum(self._actor_offsets)

    def mean_return(self) -> float | None:
        if not self._episode_steps:
            return None
        return float(np.mean([ret for _, ret in self._episode_steps[-self.window:]]))

    def returns_since(self, wall_time: float) -> list[float]:
        """Returns of the episodes that ended after ``wall_time`` (a ``time.time()``), oldest first."""
        return [ret for end, ret in self._episode_steps if end > wall_time]

    def poll(self, final: bool = False) -> None:
        calls = [(i, self._pool.submit(_call, actor, "stats"), self._pool.submit(_call, actor, "episodes",
                                                                                     self._since[i]))
                 for i, actor in enumerate(self._actors)]
        status = _call(self._learner, "status")
        now = time.time()
        new: list[tuple[float, float]] = []
        versions = []
        for i, stats_call, episodes_call in calls:
            stats, episodes = stats_call.result(), episodes_call.result()
            if stats is not None:
                steps = int(stats["env_steps"])
                if steps < self._actor_steps[i]:  # the actor was restarted and counts afresh
                    self._actor_offsets[i] += self._actor_steps[i]
                self._actor_steps[i] = steps
                versions.append(stats["version"])
            if episodes is not None:
                if episodes["next"] < self._since[i]:  # restarted: ask from its first episode next time
                    self._since[i] = 0
                    continue
                self._since[i] = episodes["next"]
                if self.spec.return_actors is None or i in self.spec.return_actors:
                    new.extend(zip(episodes["times"], episodes["returns"]))
        if status is not None:
            self.version = int(status["step"])
            learner_lag = (status.get("metrics") or {}).get("policy_lag_mean")
            acting = [self.version - v for v in versions if v is not None and v >= 0]
            self.lag = learner_lag if learner_lag is not None else (float(np.mean(acting)) if acting else None)
            restored = status.get("restored_step") or 0
            if self._first_update is None and self.version > restored:
                self._first_update = (now, self.env_steps)
            self.learner_done = self.version >= self.spec.total_updates
        if self._learner_exited():  # finished (or out of restarts): nothing more will be learned
            self.learner_done = True
        if new:
            self._episode_steps.extend(sorted(new))
            self._episode_steps.sort()
        mean = self.mean_return()
        elapsed = now - self.start_time
        if self.solved_at is None and mean is not None and len(self._episode_steps) >= self.window \
                and mean >= self.target_return:
            self.solved_at = (elapsed, self.env_steps)
        self._update_rate()
        self.samples.append(_Sample(elapsed, self.env_steps, mean, self.version))
        if final or now - self._last_row >= 0.5:
            self._last_row = now
            row = {"elapsed": elapsed, "env_steps_per_second": self._rate[2], "episode_return": mean,
                   "episodes": len(self._episode_steps), "learner_version": self.version, "lag": self.lag,
                   "restarts": self.restarts()}
            self._csv.write(self.env_steps, {k: v for k, v in row.items() if v is not None})
            self._tb.write(self.env_steps, {f"progress/{k}": v for k, v in row.items()})
        if final or now - self._last_mirror >= 2.0:
            self._last_mirror = now
            self._mirror_learner_metrics()
        if final or time.monotonic() >= self._next_progress:
            self._next_progress = time.monotonic() + self._progress_interval
            self._print_progress(elapsed, mean, final)

    def _mirror_learner_metrics(self) -> None:
        """The learner's new rows of ``metrics.csv`` as TensorBoard scalars (``learner/...``)."""
        try:
            rows = read_metrics(metrics_path(self.run_dir))
        except (OSError, ValueError):
            return  # not written yet, or caught mid-rewrite: next time
        for row in rows:
            step = row.get("step")
            if step is not None and step > self._mirrored_step:
                values = {f"learner/{k}": v for k, v in row.items()
                          if k not in ("step", "wall_time") and not k.startswith("learner/") and v is not None}
                values.update({k: v for k, v in row.items() if k.startswith("learner/") and v is not None})
                self._learner_tb.write(step, values)
                self._mirrored_step = step

    def _learner_exited(self) -> bool:
        state = self._learner_unit_status().get("state")
        return state in ("finished", "failed", "stopped")

    def _learner_unit_status(self) -> dict[str, Any]:
        """The status of the launched unit that holds the learner (itself, or its colocation)."""
        status = self._running.status()
        name = self.spec.learner
        while name and name not in status:
            name = name.rpartition("/")[0]
        return status.get(name, {})

    def restarts(self) -> int:
        """Node restarts the launcher reports (none until it supervises restarts)."""
        return sum(int(s.get("restarts", 0) or 0) for s in self._running.status().values())

    def summary(self) -> dict[str, Any]:
        end = self.samples[-1] if self.samples else _Sample(0.0, 0, None, 0)
        steady = None
        if self._first_update is not None:
            t0, s0 = self._first_update
            duration = (self.start_time + end.elapsed) - t0
            steady = (end.env_steps - s0) / duration if duration > 0 else None
        return {
            "seed": self.spec.seed, "target_return": self.target_return,
            "wall_time_to_target": None if self.solved_at is None else round(self.solved_at[0], 2),
            "steps_to_target": None if self.solved_at is None else self.solved_at[1],
            "env_steps": end.env_steps, "wall_time": round(end.elapsed, 2),
            "steps_per_second": None if steady is None else round(steady),
            "first_update_at": None if self._first_update is None else round(self._first_update[0] - self.start_time, 2),
            "final_return": end.mean_return, "episodes": len(self._episode_steps), "learner_version": self.version,
        }

    def close(self) -> None:
        self._pool.shutdown(wait=False)
        for client in [*self._actors, self._learner]:
            client.close()
        self._mirror_learner_metrics()
        self._csv.close()
        self._tb.close()
        self._learner_tb.close()
        if self._tty:
            self._out.write("\n")
        points = [(s.env_steps, s.mean_return) for s in self.samples if s.mean_return is not None]
        if len(points) >= 2:
            xs, ys = zip(*points)
            line_plot(os.path.join(self.run_dir, "learning_curve.png"),
                      {f"mean return, last {self.window}": (list(xs), list(ys))},
                      title=f"{self.spec.agent.upper()} {self.spec.env_id}", xlabel="env steps", ylabel="episode return",
                      log2_x=False)

    def _update_rate(self) -> None:
        now, steps = time.monotonic(), self.env_steps
        then, then_steps, rate = self._rate
        if now - then >= 1.0:
            self._rate = (now, steps, (steps - then_steps) / (now - then))

    def _print_progress(self, elapsed: float, mean: float | None, final: bool) -> None:
        ret = "   -  " if mean is None else f"{mean:6.1f}"
        lag = "-" if self.lag is None else f"{self.lag:.1f}"
        line = (f"[{self.spec.agent}] {elapsed:6.1f}s  env steps {self.env_steps:>9,}  {self._rate[2]:>7,.0f}/s  "
                f"return {ret} (last {self.window})  version {self.version:>5}  lag {lag}  "
                f"restarts {self.restarts()}")
        if self._tty and not final:
            self._out.write("\r" + line)
        else:
            self._out.write(line + "\n")
        self._out.flush()


def _call(client: courier.Client, method: str, *args: Any) -> Any:
    """A monitor's call: None when the node is away (starting, restarting or stopping)."""
    try:
        return client.call(method, *args)
    except Exception:  # noqa: BLE001 - a monitor must not take the run down
        return None
