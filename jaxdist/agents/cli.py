"""The command line of every agent's script, generated from its config dataclass with tyro
(CleanRL's choice): every config field is a flag with its default and its help text, beside
the run's own options (launcher, run directory, ...).

Defaults come in three layers: the config class's, then the preset of the env named by
``--env-id`` (tuned defaults per env, as rl-baselines3-zoo keeps them, and what differs for the
``--env-backend`` named), then the flags. The
resolved config is saved in the run directory; relaunching on a directory with checkpoints
resumes, and refuses (naming the fields) if the config differs, unless told
``--allow-config-change``.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import sys
from collections.abc import Callable, Sequence
from typing import Annotated, Any, Literal

from jaxdist.agents import config as configs
from jaxdist.agents.config import AgentConfig, Presets
from jaxdist.launch import run_lock
from jaxdist.launch.output import log_path
from jaxdist.launch.running import LaunchError, NodeFailedError
from jaxdist.nodes.evaluator import BEST_POLICY


@dataclasses.dataclass(frozen=True)
class RunOptions:
    """How to run, not what: none of these is saved with the config."""

    launcher: Literal["threads", "processes", "multihost", "ray"] = "processes"
    """multihost: run this same command on every host (see the README's runbook); ray: on a Ray cluster."""
    run_dir: str | None = None
    """Default: runs/<agent>-<env>-seed<seed>, e.g. runs/ppo-cartpole-seed0."""
    fresh: bool = False
    """Delete the run directory first and start over (default: resume from its checkpoints); not
    under multihost, whose hosts share the directory: delete it once before launching."""
    allow_config_change: bool = False
    """Resume even though the config differs from the one the run was started with."""
    compilation_cache: str = os.path.join("~", ".cache", "jaxdist", "jax")
    """JAX's persistent compilation cache ('' to turn it off)."""
    quiet: bool = False
    """Do not echo the nodes' output."""
    track: str | None = None
    """Log to this Weights & Biases project (pip install 'jaxdist[wandb]')."""
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
    args = list(sys.argv[1:] if args is None else args)
    try:
        env_id = _flag_value(args, "--env-id") or config_type().env_id
        backend = _flag_value(args, "--env-backend")
        default = configs.with_preset(config_type, env_id, presets, **({"env_backend": backend} if backend else {}))
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


def prepare_run_dir(run_dir: str, agent: str, config: AgentConfig, run: RunOptions) -> None:
    """Start over on ``--fresh``; on a resume, refuse a config that differs from the saved one
    unless ``--allow-config-change``. Then save the config this launch runs (its learner saves
    it again as it starts), so that a launch that fails before then still leaves a run directory
    that resumes, and that ``--fresh`` recognises as a run. A directory a running launch holds
    is left alone: its launch would refuse this one anyway, after its config had been replaced
    or its files deleted (under multihost the other hosts' shares hold it as this one starts)."""
    if os.path.exists(run_dir) and not os.path.isdir(run_dir):
        raise SystemExit(f"error: --run-dir {run_dir} is a file, not a directory: choose another --run-dir")
    holder = run_lock.holder(run_dir) if os.path.isdir(run_dir) and run.launcher != "multihost" else None
    if holder:
        raise SystemExit(f"error: {run_dir} is in use by a launch that is running ({holder}): wait for it to end "
                         f"or stop it, or choose another --run-dir")
    saved_file = os.path.join(run_dir, configs.CONFIG_FILE)
    if run.fresh:
        if os.path.exists(run_dir) and not os.path.exists(saved_file) \
                and not os.path.isdir(os.path.join(run_dir, "checkpoints")):
            raise SystemExit(f"error: --fresh deletes the run directory, but {run_dir} holds no jaxdist run "
                             f"(no {configs.CONFIG_FILE}): choose another --run-dir")
        shutil.rmtree(run_dir, ignore_errors=True)
    elif os.path.exists(saved_file) and not run.allow_config_change:
        _refuse_another_config(run_dir, agent, config)
    try:
        configs.save(run_dir, agent, config)
    except OSError as error:  # a read-only place, a missing mount, no permission
        raise SystemExit(f"error: cannot write the run directory {run_dir} ({error.strerror}: {error.filename}): "
                         f"choose another --run-dir") from None


def _refuse_another_config(run_dir: str, agent: str, config: AgentConfig) -> None:
    saved_agent, saved = configs.load(run_dir)
    changed = configs.differences(saved, config) if saved_agent == agent else {"agent": (saved_agent, agent)}
    changed.pop("stop_at_target", None)  # when to stop is not what is learned
    if changed:
        lines = "\n".join(f"  {name}: {before!r} -> {after!r}" for name, (before, after) in changed.items())
        raise SystemExit(f"error: {run_dir} holds a run started with another config; these fields differ:\n{lines}\n"
                         f"Resume with the saved config (drop those flags), start over with --fresh, pass "
                         f"--allow-config-change to resume anyway, or choose another --run-dir.")


def main(agent: str, config_type: type[AgentConfig], presets: Presets, make_agent: Callable[[Any], Any],
         description: str | None, start_time: float) -> dict[str, Any]:
    """An agent script's whole body: parse, prepare the run directory, train (``monitor.train``
    of ``make_agent(config)``), report."""
    from jaxdist.agents.monitor import default_run_dir, train

    config, run = parse(config_type, presets, description)
    try:
        built = make_agent(config)
    except ValueError as error:  # an env this agent cannot act in, an unknown env id
        raise SystemExit(f"error: {error}") from None
    run_dir = run.run_dir or default_run_dir(built)
    prepare_run_dir(run_dir, agent, config, run)
    launch_options = run.launch_options()
    if run.launcher == "ray":  # groups go to hosts as under multihost, a host being a Ray node
        launch_options = {**(launch_options or {}), "placement": built.topology().placement}
    try:
        summary = train(built, launcher=run.launcher, run_dir=run_dir, start_time=start_time,
                        compilation_cache=os.path.expanduser(run.compilation_cache) or None, echo=not run.quiet,
                        track=run.track, launch_options=launch_options)
    except LaunchError as refused:  # e.g. multihost without the hosts it needs
        raise SystemExit(f"error: {refused}") from None
    except NodeFailedError as failure:
        raise SystemExit(f"error: {failure_summary(failure, run_dir)}") from None
    report(summary, run_dir)
    return summary


def failure_summary(failure: NodeFailedError, run_dir: str) -> str:
    """One line for a node that failed past its restarts, and where its whole traceback is (the
    nodes' output above has it too, unless --quiet): the launching process's own stack would
    only bury it."""
    return f"node '{failure.node_name}' failed: {failure.headline} (its log: {log_path(run_dir, failure.node_name)})"


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
    # Anakin keeps each seed's best in its checkpoints; with several, --best would play seed 0's.
    anakin_best = summary.get("architecture") == "anakin" and "num_seeds" not in summary
    saved = anakin_best or os.path.isdir(os.path.join(run_dir, "checkpoints", BEST_POLICY))
    if saved and best is not None and (final is None or best > final):  # final None: no evaluation this segment
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


def _flag_value(args: list[str], flag: str) -> str | None:
    for i, arg in enumerate(args):
        if arg == flag and i + 1 < len(args):
            return args[i + 1]
        if arg.startswith(flag + "="):
            return arg.split("=", 1)[1]
    return None
