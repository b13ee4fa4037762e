"""Running an agent: its command line (``main``, ``parse``), launching and watching its program
(``train``), and the report.

**The command line** of every agent's script is generated from its config dataclass with tyro
(CleanRL's choice): every config field is a flag with its default and its help text, beside the
run's own options (launcher, run directory, ...). Defaults come in three layers: the config
class's, then the preset of the env named by ``--env-id`` (tuned defaults per env, as
rl-baselines3-zoo keeps them, and what differs for the ``--env-backend`` named), then the flags.
The resolved config is saved in the run directory; relaunching on a directory with checkpoints
resumes, and refuses (naming the fields) if the config differs, unless told
``--allow-config-change``.

**The monitor.** The program ends itself (the learner after its last update, the evaluator at
the target with ``stop_at_target``); the launching process only watches. A few times a second it
polls the nodes that make env steps (the topology's ``acting``: their ``stats()`` counts, summed,
and training episodes), the evaluator's ``evaluations.csv`` (the deterministic policy's return:
the reported and target metric) and the learner (its version and policy lag), and from that

- prints a progress line: elapsed time, env steps, env steps/s, evaluation return, training
  return, learner version, lag, restarts;
- appends to ``<run_dir>/progress.csv`` (a row every half second, by env steps) and TensorBoard
  (``tensorboard/progress``; the learner's ``metrics.csv`` is mirrored to
  ``tensorboard/learner``; the config as hparams), and optionally Weights & Biases;
- writes ``summary.json`` and draws ``learning_curve.png`` from the whole ``progress.csv``.

**A run in segments.** A run stopped (Ctrl-C, SIGTERM, a crash) and relaunched on the same
directory resumes from the learner's checkpoint, and its accounting goes on from the last row
of ``progress.csv``: env steps and the ``run_seconds`` column (the whole run's wall time) count
every segment's effort, including what a crash lost since the last checkpoint, so steps and wall
time to the target are those of the whole run (each segment's wall time, summed), and the
target, once reached, stays reached with its steps and time. A run that is over (its learner
saved its last update, or, with ``stop_at_target``, training stopped at the target) is not
launched again: ``train`` returns its summary, with a ``stop_reason`` that says how to go on.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import json
import os
import shutil
import sys
import time
from collections.abc import Callable, Sequence
from concurrent import futures
from typing import Annotated, Any, Literal, Protocol, TextIO

import numpy as np

import jaxdist as jd
from jaxdist import courier
from jaxdist.agents import experiment, sweep
from jaxdist.agents.experiment import AgentConfig, Presets, Topology, env_slug, qualified_name, resources
from jaxdist.learning.layout import LINEAGE, saved_update
from jaxdist.nodes.evaluator import EVALUATIONS, recorded_evaluations
from jaxdist.program import group_of
from jaxdist.records.metrics import MetricsWriter, metrics_path, read_metrics
from jaxdist.records.metrics_tensorboard import TensorBoardWriter
from jaxdist.records.plotting import line_plot


@dataclasses.dataclass(frozen=True)
class RunOptions:
    """How to run, not what: none of these is saved with the config."""

    launcher: Literal["threads", "processes", "multihost", "ray"] = "processes"
    """multihost: run this same command on every host (docs: the several-hosts guide); ray: on a Ray cluster."""
    run_dir: str | None = None
    """Default: runs/<agent>-<env>-seed<seed>, e.g. runs/ppo-cartpole-seed0, with a non-default
    architecture or env backend named before the seed: runs/ppo-cartpole-anakin-seed0."""
    fresh: bool = False
    """Delete the run directory first and start over (default: resume from its checkpoints); not
    under multihost, whose hosts share the directory: delete it once before launching."""
    allow_config_change: bool = False
    """Resume even though the config differs from the one the run was started with."""
    compilation_cache: str = os.path.join("~", ".cache", "jaxdist", "jax")
    """JAX's persistent compilation cache, shared by the run's processes ('': JAX's own settings
    decide, off unless JAX_COMPILATION_CACHE_DIR is set)."""
    quiet: bool = False
    """Do not echo the nodes' output."""
    track: str | None = None
    """Log to this Weights & Biases project (pip install -e '.[wandb]' in the jaxdist clone)."""
    hosts: str | None = None
    """multihost: comma-separated hosts, or a SLURM node list like node[01-04] (default: detected)."""
    host_index: int | None = None
    """multihost: this host's index in --hosts (default: detected)."""
    coordinator: str | None = None
    """multihost: host:port of the jax.distributed coordinator."""
    base_port: int | None = None
    """multihost: first port of host 0's range."""
    tls_dir: str | None = None
    """multihost, ray: certificates from python -m jaxdist.tools.certs DIR --hosts ... for mutual TLS between hosts."""
    ray_address: str | None = None
    """ray: the cluster ('auto', 'ray://head:10001'; default: $RAY_ADDRESS, else a new local one)."""
    start_timeout: float | None = None
    """processes, multihost, ray: seconds every node may take to start, its constructor included
    (default 300); past it the run fails naming the late nodes."""

    def __post_init__(self) -> None:
        for name, (launchers, _) in _LAUNCHER_OPTIONS.items():
            if getattr(self, name) is not None and self.launcher not in launchers:
                raise ValueError(f"--{name.replace('_', '-')} is an option of --launcher {' or '.join(launchers)}, "
                                 f"not of {self.launcher}: drop it, or name that launcher")
        if self.fresh and self.launcher == "multihost":
            raise ValueError("--fresh is not for --launcher multihost: every host would delete the shared run "
                             "directory while the others start in it. Delete it once before launching (rm -rf the "
                             "--run-dir), or choose a new --run-dir")

    def launch_options(self) -> dict[str, Any] | None:
        """What ``jd.launch`` takes from these flags under this launcher."""
        return {option: getattr(self, name) for name, (launchers, option) in _LAUNCHER_OPTIONS.items()
                if self.launcher in launchers and getattr(self, name) is not None} or None


_LAUNCHER_OPTIONS = {  # flag -> (the launchers that take it, its name among jd.launch's options)
    "hosts": (("multihost",), "hosts"),
    "host_index": (("multihost",), "host_index"),
    "coordinator": (("multihost",), "coordinator"),
    "base_port": (("multihost",), "base_port"),
    "tls_dir": (("multihost", "ray"), "tls_dir"),
    "ray_address": (("ray",), "address"),
    "start_timeout": (("processes", "multihost", "ray"), "start_timeout"),
}


def parse(config_type: type[AgentConfig], presets: Presets, description: str | None,
          args: Sequence[str] | None = None) -> tuple[AgentConfig, RunOptions]:
    """(config, run options) from the command line, over the preset of its ``--env-id``."""
    args = _gather_repeated(list(sys.argv[1:] if args is None else args), "--sweep")
    try:
        env_id = _flag_value(args, "--env-id") or config_type().env_id
        backend = _flag_value(args, "--env-backend")
        default = experiment.with_preset(config_type, env_id, presets, **({"env_backend": backend} if backend else {}))
    except ValueError as error:  # a preset the class refuses, e.g. an env the agent does not support
        raise SystemExit(f"error: {error}") from None

    import tyro  # here: every node's process imports its script, and only the launching one parses

    flat = tyro.conf.arg(name="")  # --learning-rate, not --config.learning-rate
    command_type = dataclasses.make_dataclass("Command", [
        ("config", Annotated[config_type, flat]),
        ("run", Annotated[RunOptions, flat], dataclasses.field(default=RunOptions()))], frozen=True)
    try:
        command = tyro.cli(command_type, default=command_type(default), args=args, description=description)
    except ValueError as error:  # the config's own checks (e.g. num_actors must be >= 1)
        raise SystemExit(f"error: {error}") from None
    return command.config, command.run


def prepare_run_dir(run_dir: str, factory: str, config: AgentConfig, run: RunOptions) -> None:
    """Start over on ``--fresh``; on a resume, refuse a config that differs from the saved one
    unless ``--allow-config-change``. Then save the config this launch runs (its learner saves
    it again as it starts), so that a launch that fails before then still leaves a run directory
    that resumes, and that ``--fresh`` recognises as a run. A directory a running launch holds
    is left alone: its launch would refuse this one anyway, after its config had been replaced
    or its files deleted (under multihost the other hosts' shares hold it as this one starts)."""
    if os.path.exists(run_dir) and not os.path.isdir(run_dir):
        raise SystemExit(f"error: --run-dir {run_dir} is a file, not a directory: choose another --run-dir")
    holder = jd.run_dir_holder(run_dir) if os.path.isdir(run_dir) and run.launcher != "multihost" else None
    if holder:
        raise SystemExit(f"error: {run_dir} is in use by a launch that is running ({holder}): wait for it to end "
                         f"or stop it, or choose another --run-dir")
    saved_file = os.path.join(run_dir, experiment.CONFIG_FILE)
    if run.fresh:
        if os.path.exists(run_dir) and not os.path.exists(saved_file) \
                and not os.path.isdir(os.path.join(run_dir, "checkpoints")):
            raise SystemExit(f"error: --fresh deletes the run directory, but {run_dir} holds no jaxdist run "
                             f"(no {experiment.CONFIG_FILE}): choose another --run-dir")
        shutil.rmtree(run_dir, ignore_errors=True)
    elif os.path.exists(saved_file) and not run.allow_config_change:
        _refuse_another_config(run_dir, factory, config)
    try:
        experiment.save(run_dir, factory, config)
    except OSError as error:  # a read-only place, a missing mount, no permission
        raise SystemExit(f"error: cannot write the run directory {run_dir} ({error.strerror}: {error.filename}): "
                         f"choose another --run-dir") from None


def _refuse_another_config(run_dir: str, factory: str, config: AgentConfig) -> None:
    saved = experiment.load(run_dir)
    changed = (experiment.differences(saved.fields, config) if saved.factory == factory
               else {"agent": (saved.factory, factory)})
    changed.pop("stop_at_target", None)  # when to stop is not what is learned
    if changed:
        lines = "\n".join(f"  {name}: {before!r} -> {after!r}" for name, (before, after) in changed.items())
        raise SystemExit(f"error: {run_dir} holds a run started with another config; these fields differ:\n{lines}\n"
                         f"Resume with the saved config (drop those flags), start over with --fresh, pass "
                         f"--allow-config-change to resume anyway, or choose another --run-dir.")


def main(make_agent: Callable[[Any], Any], config_type: type[AgentConfig], presets: Presets,
         description: str | None, start_time: float) -> dict[str, Any]:
    """An agent script's whole body: parse, prepare the run directory, train (``train`` of
    ``make_agent(config)``), report."""
    config, run = parse(config_type, presets, description)
    try:
        built = make_agent(config)
    except ValueError as error:  # an env this agent cannot act in, an unknown env id
        raise SystemExit(f"error: {error}") from None
    run_dir = run.run_dir or default_run_dir(built)
    prepare_run_dir(run_dir, built.factory, config, run)
    # A sweep whose configurations cannot share a learner runs each in a run directory of its own:
    # side by side in one program where the launcher has hosts to spread them over, else one
    # program after another (one that is over is not launched again).
    apart = sweep.apart(config, run_dir)
    if apart and run.launcher in SIDE_BY_SIDE:
        from jaxdist.agents.population import SideBySide

        runs = [(SideBySide(built), run_dir)]
    else:
        runs = [(make_agent(child), child_dir) for child, child_dir in apart] or [(built, run_dir)]
    for agent, agent_dir in runs:
        launch_options = run.launch_options()
        if run.launcher == "ray":  # groups go to hosts as under multihost, a host being a Ray node
            launch_options = {**(launch_options or {}), "placement": agent.topology().placement}
        try:
            summary = train(agent, launcher=run.launcher, run_dir=agent_dir, start_time=start_time,
                            compilation_cache=os.path.expanduser(run.compilation_cache) or None, echo=not run.quiet,
                            track=run.track, launch_options=launch_options)
        except KeyboardInterrupt:  # while starting (train's own Ctrl-C ends in a summary): what started has stopped
            raise SystemExit("stopped by Ctrl-C while starting; nothing was trained") from None
        except jd.LaunchError as refused:  # e.g. multihost without the hosts it needs
            raise SystemExit(f"error: {refused}") from None
        except jd.NodeFailedError as failure:
            raise SystemExit(f"error: {failure_summary(failure, agent_dir)}") from None
        report(summary, agent_dir)
        if finished_summary(agent_dir, agent.topology(), agent.config) is None:
            return summary  # stopped before its end (Ctrl-C, SIGTERM): the same command resumes it here
    if sweep.searches(config) and "host_index" not in summary:
        report_search(config, run_dir)
    return summary


def report_search(config: Any, run_dir: str) -> None:
    """A sweep's ranking of its configurations, and a PBT run's copies and lineage."""
    if len(configurations := sweep.configurations(config)) > 1:
        print(f"{len(configurations)} configurations x {config.num_seeds} seed(s), by their last evaluation's mean "
              f"over seeds (also {os.path.join(run_dir, sweep.SWEEP_FILE)}, {sweep.SWEEP_PLOT}):")
        print(sweep.format_table(sweep.summarize(run_dir, config), config.num_seeds))
    if config.pbt:
        copies = sweep.plot_lineage(run_dir)
        print(f"PBT: {len(copies)} copies ({'; '.join(copies[-8:])}{' ...' if len(copies) > 8 else ''}); every "
              f"member's hyperparameters by update in {metrics_path(run_dir, LINEAGE)}, lineage_<field>.png")


SIDE_BY_SIDE = ("ray", "multihost")
"""The launchers that run a Sebulba sweep's configurations side by side, spread over their hosts."""


def failure_summary(failure: jd.NodeFailedError, run_dir: str) -> str:
    """One line for a node that failed past its restarts, and where its whole traceback is (the
    nodes' output above has it too, unless --quiet): the launching process's own stack would
    only bury it."""
    return f"node '{failure.node_name}' failed: {failure.headline} (its log: {jd.log_path(run_dir, failure.node_name)})"


def report(summary: dict[str, Any], run_dir: str) -> None:
    """The closing lines: when the target was reached, the last evaluation (and a better saved one),
    throughput, why the run stopped."""
    if "host_index" in summary:  # a multihost share: host 0 reports the run
        print(f"host {summary['host_index']} stopped: {summary['stop_reason']}")
        return
    target = summary.get("target_return")
    if summary.get("wall_time_to_target") is not None:
        print(f"reached evaluation return {target:g} after {summary['wall_time_to_target']:.1f} s (the whole run, "
              f"start-up included) and {summary['steps_to_target']:,} env steps")
    elif target is not None:
        print(f"did not reach evaluation return {target:g}")
    print(last_evaluation(summary))
    best, final = summary.get("best_return"), summary.get("final_return")
    if summary.get("keeps_best") and best is not None and (final is None or best > final):  # final None: no evaluation this segment
        print(f"best evaluation return {best:.1f}, of learner version {summary['best_return_version']}: "
              f"python -m jaxdist.tools.evaluate {run_dir} --best plays it")
    for seed in summary.get("seeds", []):  # num_seeds > 1: each seed's own evaluations
        reached = (f"reached {target:g} after {seed['steps_to_target']:,} env steps" if seed["steps_to_target"]
                   is not None else "did not reach the target")
        print(f"  seed {seed['seed']}: {reached}; last evaluation return {seed['final_return']:.1f}")
    rate = summary.get("steps_per_second")
    seeds = f" per seed ({summary['num_seeds']} seeds)" if "num_seeds" in summary else ""
    print(f"{summary['env_steps']:,} env steps{seeds} in {summary['wall_time']:.1f} s; steady throughput "
          f"{'-' if rate is None else f'{rate:,}'} env steps/s{seeds}; {summary['stop_reason']}; results in {run_dir}")


def last_evaluation(summary: dict[str, Any]) -> str:
    """Which policy the last evaluation scored: the final one (what ``load_policy`` restores) or,
    when the run stopped early (at the target, Ctrl-C), an earlier one."""
    if summary.get("final_return") is None:
        return "no evaluation finished"
    version, last = summary["final_return_version"], summary["learner_version"]
    which = "the final policy" if version >= last else f"the learner went on to version {last}"
    return f"last evaluation return {summary['final_return']:.1f}, of learner version {version} ({which})"


def _gather_repeated(args: list[str], flag: str) -> list[str]:
    """``--sweep A --sweep B`` as ``--sweep A B``: a repeatable flag, where tyro's tuple flag
    takes its values after one occurrence."""
    values, rest, i = [], [], 0
    while i < len(args):
        if args[i] == flag:
            i += 1
            while i < len(args) and not args[i].startswith("--"):
                values.append(args[i])
                i += 1
        elif args[i].startswith(flag + "="):
            values.append(args[i].split("=", 1)[1])
            i += 1
        else:
            rest.append(args[i])
            i += 1
    return [*rest, flag, *values] if values else rest


def _flag_value(args: list[str], flag: str) -> str | None:
    for i, arg in enumerate(args):
        if arg == flag and i + 1 < len(args):
            return args[i + 1]
        if arg.startswith(flag + "="):
            return arg.split("=", 1)[1]
    return None


# Launching and watching -----------------------------------------------------------------------


TRAIN_WINDOW = 20  # the training return is the mean of the last this many episodes
SUMMARY = "summary.json"  # in the run directory: what train() returned, for a relaunch that has nothing to do
SEED_CURVE = "seed "  # a learning curve of one seed of several: "seed 3"
RATE_WINDOW = 5.0  # the progress line's env steps/s: over the polls of the latest this many seconds
READINGS_KEPT = 600  # (time, env steps) of the latest polls: a minute of them, at 10 a second
POLL_THREADS = 16  # a poll's calls in flight at once (two an actor); more actors wait for a thread


def train(agent: Trainable, *, launcher: str = "processes", run_dir: str | None = None,
          start_time: float | None = None, compilation_cache: str | None = None, echo: bool = True,
          track: str | None = None, out: TextIO | None = None, launch_options: dict[str, Any] | None = None,
          poll_interval: float = 0.1, progress_interval: float = 1.0) -> dict[str, Any]:
    """Launch ``agent``'s program, watch it until it ends, and return the summary (also
    ``<run_dir>/summary.json``): ``wall_time_to_target`` / ``steps_to_target`` over the whole
    run (None if no evaluation reached the target; the time when the first evaluation to reach
    it was written, the env steps when the version it scored was fetched), ``env_steps``,
    ``wall_time`` (all segments), ``steps_per_second`` (steady: this segment's, from the first
    update to the last env step), ``final_return`` (the last evaluation: of the final policy,
    ``learner_version``, when training ran to its end) and ``final_return_version`` (the
    learner version it evaluated), ``best_return`` / ``best_return_version`` (the run's best
    evaluation, every segment's), ...

    ``agent`` is an actor-learner ``Agent`` or any record with a ``name``, a ``config`` and a
    ``topology()`` whose learner and actors serve what the monitor polls (ES's master and
    workers); ``run_dir`` defaults to ``default_run_dir(agent)``.
    ``start_time`` (a ``time.time()``) is when this segment's clock started, e.g. at the top of
    a script, so that imports and start-up count; default: now. ``track``: a Weights & Biases
    project to log to. ``launch_options`` go to ``jd.launch`` (multihost: hosts, host_index);
    there host 0 watches and the other hosts only run their share.
    """
    start_time = time.time() if start_time is None else start_time
    run_dir = os.path.abspath(run_dir or default_run_dir(agent))
    topology = agent.topology()
    over = finished_summary(run_dir, topology, agent.config)
    if over is not None:
        return over
    options: dict[str, Any] = {"run_dir": run_dir, "echo": echo}
    if launcher != "threads":
        options["resources"] = resources(topology.program, compilation_cache)
    if launcher == "multihost":
        options["placement"] = topology.placement
    out = out or sys.stdout
    multihost_share = launcher == "multihost" and (launch_options or {}).get("host_index")
    # Imported before any node thread starts: CPython 3.11 can fail compiling a module's source
    # while other threads compile (an AST recursion-depth race seen with wandb's imports).
    tracker = _wandb(track, agent, run_dir) if track and not multihost_share else None
    running = jd.launch(topology.program, launcher=launcher, **options, **(launch_options or {}))
    if running.host_index:  # this host runs its share of the program; host 0 watches and reports
        print(f"[{agent.name}] host {running.host_index} runs its share of the program; host 0 reports progress",
              file=out, flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            running.wait()
        running.stop()
        return {"stop_reason": running.stop_reason, "host_index": running.host_index}
    try:
        monitor = Monitor(running, agent, topology, run_dir, start_time, out=out, tracker=tracker)
    except BaseException:
        running.stop()
        raise
    if monitor.restored_step:
        print(f"[{agent.name}] resuming from the learner's checkpoint at update {monitor.restored_step} "
              f"({monitor.env_steps:,} env steps, {monitor.base_wall_time:.1f} s of earlier segments)",
              file=out, flush=True)
    interrupted = False
    try:
        while not running.wait(timeout=poll_interval):
            monitor.poll()
    except KeyboardInterrupt:  # Ctrl-C: wait() has already stopped the program in order
        interrupted = True
    finally:
        running.stop()
        monitor.poll(final=True)
        monitor.close()
    reason = running.stop_reason
    if interrupted:
        step = monitor.saved_update()
        reason = (f"stopped by Ctrl-C at update {step} (checkpoint saved); run the same command to resume"
                  if step is not None else "stopped by Ctrl-C before the first checkpoint")
    summary = dict(monitor.summary(), stop_reason=reason)
    with open(os.path.join(run_dir, SUMMARY), "w") as f:
        json.dump(summary, f, indent=2)
    return summary


def finished_summary(run_dir: str, topology: Topology, config: Any) -> dict[str, Any] | None:
    """The summary of a run that is over, or None: its learner has saved its last update, or,
    with ``stop_at_target``, a version its evaluations found at the target. Relaunching such a
    run would only evaluate its final policy again (a second row for it in ``evaluations.csv``)
    and rewrite its record. None too where ``summary.json`` is not that of the saved update (the
    launching process was killed before writing it): the relaunch then writes it."""
    saved = saved_update(topology.checkpoints(run_dir))
    try:
        with open(os.path.join(run_dir, SUMMARY)) as f:
            summary = json.load(f)
    except (OSError, ValueError):
        return None
    if saved is None or summary.get("learner_version") != saved:
        return None
    if topology.last_update is not None and saved >= topology.last_update:
        return dict(summary, stop_reason=(
            f"nothing launched: the run has trained to its last update ({saved}): --fresh starts over, and a larger "
            f"--total-steps with --allow-config-change trains on"))
    target = config.target_return
    if config.stop_at_target and target is not None:
        reached = [int(row["step"]) for row in recorded_evaluations(run_dir)
                   if row["mean_return"] >= target and row["step"] <= saved]
        if reached:
            return dict(summary, stop_reason=(
                f"nothing launched: the run reached its target {target:g} at the evaluation of version {reached[0]} "
                f"and stopped at update {saved}: without --stop-at-target it trains on, --fresh starts over"))
    return None


def default_run_dir(agent: Trainable) -> str:
    """``runs/<agent>-<env>-seed<seed>``, e.g. ``runs/ppo-cartpole-seed0``, with an architecture or
    env backend that is not the default named before the seed (``runs/ppo-cartpole-anakin-seed0``),
    so that variants of one command do not collide in one directory."""
    config = agent.config
    variant = [value for field, default in (("architecture", "sebulba"), ("env_backend", "auto"))
               if (value := getattr(config, field, default)) != default]
    return os.path.join("runs", "-".join([agent.name, env_slug(config.env_id), *variant, f"seed{config.seed}"]))


class Trainable(Protocol):
    """What ``train`` launches and watches: an ``Agent``, or ES's record: a name, the factory
    that made it, its config, and its topology."""

    name: str
    factory: str
    config: Any

    def topology(self) -> Topology:
        """The program, and the handles the monitor polls."""


class Monitor:
    """Polls a running agent program from outside it; see the module docstring."""

    def __init__(self, running: jd.Running, agent: Trainable, topology: Topology, run_dir: str, start_time: float, *,
                 progress_interval: float = 1.0, out: TextIO = sys.stdout,
                 tracker: Any = None) -> None:
        self.agent, self.config, self.run_dir, self.start_time = agent, agent.config, run_dir, start_time
        token = getattr(running, "token", None)
        # Failing fast: a node that is away (restarting, or gone at the stop) costs a poll nothing.
        self._client = lambda address: courier.Client(address, token=token, timeout=2.0).failing_fast()  # noqa: E731
        self._running, self._topology = running, topology
        # The actors' groups, followed through running.members: running.scale adds and removes actors.
        self._acting_groups = sorted({group_of(node.node_name) for node in topology.acting})
        self._actors: dict[str, _Watched] = {}
        self._departed_steps = 0  # env steps of actors that running.scale removed
        self._recorded_steps = 0  # the newest evaluation's, where its recording node counted them
        self._learner = self._client(running.addresses[topology.learner.node_name])
        self._pool = futures.ThreadPoolExecutor(POLL_THREADS, thread_name_prefix="monitor")
        self._evaluations_read = 0
        self._evaluations_size = -1  # bytes of evaluations.csv when last parsed
        self._train_returns: collections.deque[float] = collections.deque(maxlen=TRAIN_WINDOW)  # the latest only
        self._episodes = 0
        self.restored_step = self._wait_for_learner()
        path = metrics_path(run_dir, "progress")
        try:
            earlier = read_metrics(path)  # the run's earlier segments
        except (OSError, ValueError):
            earlier = []
        self._base_steps = int(earlier[-1]["step"]) if earlier else 0
        self.version = self.restored_step
        self.lag: float | None = None
        self.eval_return: float | None = None
        self.eval_version: int | None = None  # the learner version eval_return is of
        self.best: tuple[float, int] | None = None  # the whole run's best evaluation: (mean return, version)
        self.seeds: dict[int, dict[str, Any]] = {}  # with num_seeds > 1: each seed's evaluations
        self._num_seeds = topology.seeds
        self._first_update: tuple[float, int] | None = None
        self._last_acting: tuple[float, int] = (time.time(), 0)  # when env steps last grew
        self._readings: collections.deque[tuple[float, int]] = collections.deque(maxlen=READINGS_KEPT)
        self._out, self._progress_interval, self._next_progress = out, progress_interval, 0.0
        self._tty = hasattr(out, "isatty") and out.isatty()
        self.base_wall_time = float(earlier[-1].get("run_seconds", 0.0)) if earlier else 0.0
        self.solved_at: tuple[float, int] | None = next(  # an earlier segment's crossing of the target
            ((float(row["target_seconds"]), int(row["target_steps"])) for row in earlier
             if row.get("target_steps") is not None), None)
        self._csv = MetricsWriter(path)
        self._tb = TensorBoardWriter(os.path.join(run_dir, "tensorboard", "progress"))
        self._tb.config(experiment.to_dict(self.config))
        self._learner_tb = TensorBoardWriter(os.path.join(run_dir, "tensorboard", "learner"),
                                             purge_step=self.restored_step)
        self._tracker = tracker  # a Weights & Biases run, or None
        self._mirrored_step = self.restored_step
        self._last_row = self._last_mirror = 0.0

    @property
    def env_steps(self) -> int:
        """Earlier segments' env steps and the sum of what the nodes that make them reported
        (every life of each, and of those ``running.scale`` removed), or, where more, the count an
        evaluation recorded (ES's master, an Anakin learner): the steps made after the last poll
        that reached the nodes are in it."""
        acted = self._departed_steps + sum(node.steps + node.earlier for node in self._actors.values())
        return max(self._base_steps + acted, self._recorded_steps)

    @property
    def wall_time(self) -> float:
        """Seconds of the whole run: earlier segments' and this one's (from ``start_time``)."""
        return self.base_wall_time + time.time() - self.start_time

    def poll(self, final: bool = False) -> None:
        asked = time.time()
        self._follow_actors()
        calls = [(actor, self._pool.submit(_call, actor.client, "stats"),
                  self._pool.submit(_call, actor.client, "episodes", actor.since)) for actor in self._actors.values()]
        status = _call(self._learner, "status")
        versions = []
        for actor, stats_call, episodes_call in calls:
            stats, episodes = stats_call.result(), episodes_call.result()
            if stats is not None:
                steps = int(stats["env_steps"])
                if steps < actor.steps:  # the actor was restarted and counts afresh
                    actor.earlier += actor.steps
                actor.steps = steps
                versions.append(stats["version"])
            if episodes is not None:
                if episodes["next"] < actor.since:  # restarted: ask from its first episode next time
                    actor.since = 0
                    continue
                actor.since = episodes["next"]
                self._train_returns.extend(episodes["returns"])
                self._episodes += len(episodes["returns"])
        self._readings.append((asked, self.env_steps))
        self._read_evaluations()
        if status is not None:
            self.version = int(status["step"])
            learner_lag = (status.get("metrics") or {}).get("policy_lag_mean")
            acting = [self.version - v for v in versions if v is not None and v >= 0]
            self.lag = learner_lag if learner_lag is not None else (float(np.mean(acting)) if acting else None)
            if self._first_update is None and self.version > self.restored_step:
                self._first_update = (time.time(), self.env_steps)
        if self.env_steps > self._last_acting[1]:
            self._last_acting = (time.time(), self.env_steps)
        now = time.time()
        if final or now - self._last_mirror >= 2.0:
            self._last_mirror = now
            self._mirror_learner_metrics()
        if final or now - self._last_row >= 0.5:
            self._last_row = now
            self._write_row()
        if final or time.monotonic() >= self._next_progress:
            self._next_progress = time.monotonic() + self._progress_interval
            self._print_progress(final)

    def _follow_actors(self) -> None:
        """The actors' groups as they are now: an actor running.scale added gets a client once
        it serves; one it removed keeps the steps it made counted."""
        names = [name for group in self._acting_groups for name in self._running.members(group)]
        for name in set(self._actors) - set(names):
            gone = self._actors.pop(name)
            self._departed_steps += gone.steps + gone.earlier
            gone.client.close()
        for name in names:
            address = self._running.addresses.get(name)
            if name not in self._actors and address is not None:
                self._actors[name] = _Watched(self._client(address))

    def _read_evaluations(self) -> None:
        """New rows of the evaluator's ``evaluations.csv``: the run's best and last evaluation,
        and this segment's crossings of the target. Parsed only when the file grew: it changes
        every few updates, and polls come ten a second."""
        path = metrics_path(self.run_dir, EVALUATIONS)
        try:
            size = os.path.getsize(path)
            if size == self._evaluations_size:
                return
            rows = read_metrics(path)
        except (OSError, ValueError):
            return  # none yet, or caught mid-write: next time
        self._evaluations_size = size
        target = self.config.target_return
        for row in rows[self._evaluations_read:]:
            if row.get("mean_return") is None:
                continue
            if self.best is None or row["mean_return"] > self.best[0]:
                self.best = (row["mean_return"], int(row["step"]))
            # The run's last evaluation, an earlier segment's until this one evaluates.
            self.eval_return, self.eval_version = row["mean_return"], int(row["step"])
            if row.get("wall_time", 0.0) < self.start_time:
                continue  # an earlier segment's crossing of the target is read from progress.csv
            # The env steps the recording node knew were behind the version (Anakin's learner, ES's
            # master); else the count when the evaluator fetched the version, between the polls
            # around then: the count when the row is read (after the evaluation, or after the
            # program has ended) had grown since.
            steps = (int(row["env_steps"]) if row.get("env_steps") is not None
                     else steps_at(self._readings, evaluated_at(row)))
            self._recorded_steps = max(self._recorded_steps, int(row.get("env_steps") or 0))
            reached = (self.base_wall_time + row["wall_time"] - self.start_time, steps)
            if self.solved_at is None and target is not None and self.eval_return >= target:
                self.solved_at = reached
            for seed in range(self._num_seeds if self._num_seeds > 1 else 0):  # each seed's own
                value = row.get(f"seed/{seed}/mean_return")
                if value is not None:
                    result = self.seeds.setdefault(seed, {"seed": seed, "steps_to_target": None,
                                                          "wall_time_to_target": None})
                    result["final_return"] = value
                    if result["steps_to_target"] is None and target is not None and value >= target:
                        result["wall_time_to_target"], result["steps_to_target"] = round(reached[0], 2), reached[1]
        self._evaluations_read = len(rows)

    def train_return(self) -> float | None:
        return float(np.mean(self._train_returns)) if self._train_returns else None

    def _write_row(self) -> None:
        row = {"run_seconds": self.wall_time, "env_steps_per_second": recent_rate(self._readings),
               "eval_return": self.eval_return, "train_return": self.train_return(),
               "episodes": self._episodes, "learner_version": self.version, "lag": self.lag,
               "restarts": self.restarts()}
        if self.solved_at is not None:  # carried in every later row, so a resumed run finds it
            row.update(target_seconds=self.solved_at[0], target_steps=self.solved_at[1])
        row = {k: v for k, v in row.items() if v is not None}
        self._csv.write(self.env_steps, row)
        self._tb.write(self.env_steps, {f"progress/{k}": v for k, v in row.items()})
        if self._tracker is not None:
            self._tracker.log({f"progress/{k}": v for k, v in row.items()}, step=self.env_steps)

    def _mirror_learner_metrics(self) -> None:
        """The learner's new rows of ``metrics.csv`` as TensorBoard scalars (``learner/...``)."""
        try:
            rows = read_metrics(metrics_path(self.run_dir))
        except (OSError, ValueError):
            return  # not written yet, or caught mid-rewrite: next time
        for row in rows:
            step = row.get("step")
            if step is not None and step > self._mirrored_step:
                values = {(k if k.startswith("learner/") else f"learner/{k}"): v for k, v in row.items()
                          if k not in ("step", "wall_time") and v is not None}
                self._learner_tb.write(step, values)
                self._mirrored_step = step

    def restarts(self) -> int:
        return sum(int(s.get("restarts", 0) or 0) for s in self._running.status().values())

    def saved_update(self) -> int | None:
        return saved_update(self._topology.checkpoints(self.run_dir))

    def summary(self) -> dict[str, Any]:
        steady = None if self._first_update is None else steady_rate(self._first_update, self._last_acting)
        return {
            "agent": self.agent.name, "env_id": self.config.env_id, "seed": self.config.seed,
            "target_return": self.config.target_return,
            "wall_time_to_target": None if self.solved_at is None else round(self.solved_at[0], 2),
            "steps_to_target": None if self.solved_at is None else self.solved_at[1],
            "env_steps": self.env_steps, "wall_time": round(self.wall_time, 2),
            "steps_per_second": None if steady is None else round(steady),
            "final_return": self.eval_return, "final_return_version": self.eval_version,
            "best_return": None if self.best is None else self.best[0],
            "best_return_version": None if self.best is None else self.best[1],
            "train_return": self.train_return(),
            # The learner's last version: the final poll comes after it has gone, its final save not.
            "learner_version": max(self.version, self.saved_update() or 0), "restored_step": self.restored_step,
            # With several seeds --best would play seed 0's best, not that of the mean reported.
            "keeps_best": self._num_seeds == 1 and self._topology.keeps_best(self.run_dir),
            **({"num_seeds": self._num_seeds, "seeds": [self.seeds[i] for i in sorted(self.seeds)]}
               if self._num_seeds > 1 else {}),
        }

    def close(self) -> None:
        self._pool.shutdown(wait=False)
        for client in [*(actor.client for actor in self._actors.values()), self._learner]:
            client.close()
        self._mirror_learner_metrics()
        self._csv.close()
        self._tb.close()
        self._learner_tb.close()
        if self._tracker is not None:
            self._tracker.finish()
        if self._tty:
            self._out.write("\n")
        plot_learning_curve(self.run_dir, f"{self.agent.name.upper()} {self.config.env_id}", self.config.target_return)

    def _wait_for_learner(self) -> int:
        """The learner's restored step, once it answers (it is up once launch() returned)."""
        deadline = time.monotonic() + 30.0
        while time.monotonic() < deadline:
            status = _call(self._learner, "status")
            if status is not None:
                return int(status.get("restored_step") or 0)
            if self._running.wait(timeout=0.1):  # it had nothing left to do
                break
        return 0

    def _print_progress(self, final: bool) -> None:
        show = lambda value: "   -  " if value is None else f"{value:6.1f}"  # noqa: E731
        lag = "-" if self.lag is None else f"{self.lag:.1f}"
        # The last line, the program stopped: the steady rate, not one diluted by the stop.
        rate = (steady_rate(self._first_update, self._last_acting) if final and self._first_update
                else recent_rate(self._readings)) or 0.0
        line = (f"[{self.agent.name}] {self.wall_time:6.1f}s  env steps {self.env_steps:>9,}  {rate:>7,.0f}/s  "
                f"eval return {show(self.eval_return)}  train {show(self.train_return())}  "
                f"version {self.version:>5}  lag {lag}  restarts {self.restarts()}")
        if self._tty and not final:
            self._out.write("\r" + line)
        else:
            self._out.write(line + "\n")
        self._out.flush()


@dataclasses.dataclass
class _Watched:
    """One actor as the monitor polls it: its client and its counts as last reported."""

    client: courier.Client
    since: int = 0  # the next of its episodes to fetch
    steps: int = 0  # its env steps as last reported
    earlier: int = 0  # env steps of its earlier lives (a restarted actor counts afresh)


def recent_rate(readings: Sequence[tuple[float, int]], window: float = RATE_WINDOW) -> float | None:
    """Env steps/s over the latest ``window`` s of (time, env steps) readings: what the run does
    now, not since some earlier reading; None before two readings."""
    if len(readings) < 2:
        return None
    now, steps = readings[-1]
    then, then_steps = next(reading for reading in readings if reading[0] >= now - window)
    return (steps - then_steps) / (now - then) if now > then else None


def steady_rate(first_update: tuple[float, int], last_acting: tuple[float, int]) -> float | None:
    """Env steps/s from the first update seen to the last env step, as (time, env steps) pairs
    (start-up and the stop are not acting time); None where no env step came after the first
    update was seen (a run shorter than a poll, or an Anakin run whose every update landed
    between two polls): there is no steady rate to report, which is not a rate of 0."""
    (t0, s0), (t1, s1) = first_update, last_acting
    return (s1 - s0) / (t1 - t0) if t1 > t0 and s1 > s0 else None


def plot_learning_curve(run_dir: str, title: str, target: float | None) -> None:
    """``<run_dir>/learning_curve.png``: the ``learning_curves`` of the run, each seed's faint
    behind their mean (a sweep's 32 runs would not fit a legend)."""
    series = learning_curves(run_dir)
    if series:
        seeds = {label: curve for label, curve in series.items() if label.startswith(SEED_CURVE)}
        line_plot(os.path.join(run_dir, "learning_curve.png"),
                  {label: curve for label, curve in series.items() if label not in seeds}, faint=seeds,
                  faint_label="each seed", title=title, xlabel="env steps", ylabel="episode return", log2_x=False,
                  hlines={f"target {target:g}": target} if target is not None else None)


def learning_curves(run_dir: str) -> dict[str, tuple[list, list]]:
    """The run's curves over the whole run (every segment), by env steps, each as (xs, ys):
    each evaluation of ``evaluations.csv`` (with ``--num-seeds N``, the mean over the seeds and
    each seed's own) and the training return of ``progress.csv``. None of fewer than two points."""
    try:
        rows = read_metrics(metrics_path(run_dir, "progress"))
    except (OSError, ValueError):
        return {}
    evaluations = recorded_evaluations(run_dir)
    seeds = sorted({int(key.split("/")[1]) for row in evaluations for key in row
                    if key.startswith("seed/") and key.endswith("/mean_return")})
    training = [(row["step"], row["train_return"]) for row in rows if row.get("train_return") is not None]
    curves = [("evaluation return" + (" (mean over seeds)" if seeds else ""), evaluation_curve(rows, evaluations)),
              *((f"{SEED_CURVE}{seed}", evaluation_curve(rows, evaluations, f"seed/{seed}/mean_return")) for seed in seeds),
              (f"training return (last {TRAIN_WINDOW})", training)]
    return {label: tuple(map(list, zip(*points))) for label, points in curves if len(points) >= 2}


def evaluation_curve(progress: list[dict[str, Any]], evaluations: list[dict[str, Any]],
                     column: str = "mean_return") -> list[tuple[float, float]]:
    """Every evaluation as (env steps of its version, mean return): the env steps of
    ``progress.csv``'s rows (written every half second) interpolated at the time the evaluated
    version was fetched (``evaluated_at``). The rows' own ``eval_return`` column would drop the
    evaluations between two rows and place the others at the next row's env steps."""
    polled = sorted((row["wall_time"], row["step"]) for row in progress)
    done = [(evaluated_at(row), row[column]) for row in evaluations if row.get(column) is not None]
    if not polled or not done:
        return []
    return [(steps_at(polled, when), value) for when, value in done]


def evaluated_at(row: dict[str, Any]) -> float:
    """When the version an ``evaluations.csv`` row scored was fetched: its env steps are those
    made by then (a row without it, Anakin's, is written as its version is made)."""
    return row.get("version_time") or row["wall_time"]


def steps_at(readings: Sequence[tuple[float, int]], when: float) -> int:
    """Env steps at time ``when``, interpolated between (time, env steps) readings in time order
    (the first or last reading's outside them)."""
    times, steps = zip(*readings)
    return round(float(np.interp(when, times, steps)))


def _wandb(project: str, agent: Trainable, run_dir: str) -> Any:
    """A Weights & Biases run for ``--track`` (resumed by the run directory's name)."""
    try:
        import wandb
    except ImportError:
        raise ImportError("--track logs to Weights & Biases: pip install -e '.[wandb]' in the jaxdist clone") from None
    name = os.path.basename(run_dir)
    os.makedirs(run_dir, mode=0o700, exist_ok=True)  # before the launcher would: for its owner alone
    try:
        return wandb.init(project=project, name=name, id=name, resume="allow", dir=run_dir,
                          config=experiment.to_dict(agent.config))
    except (wandb.errors.UsageError, wandb.errors.CommError) as error:  # no account here, or no network
        raise jd.LaunchError(f"--track: Weights & Biases refused the run ({error}); log in (wandb login, or "
                             f"WANDB_API_KEY), or set WANDB_MODE=offline to keep it in {run_dir}/wandb for "
                             f"wandb sync later. Nothing was launched") from None


def _call(client: courier.Client, method: str, *args: Any) -> Any:
    """A monitor's call: None when the node is away (starting, restarting or stopping)."""
    try:
        return client.call(method, *args)
    except Exception:  # noqa: BLE001 - a monitor must not take the run down
        return None


__all__ = ["Trainable", "default_run_dir", "plot_learning_curve", "train"]
