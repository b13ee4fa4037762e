"""The command line every agent's experiment script shares: the same flags, run directory
layout (``runs/<agent>-<env>-seed<seed>``) and final report."""

from __future__ import annotations

import argparse
import os
import shutil
from collections.abc import Callable
from typing import Any

from jaxdist.launch import hosts


def parser(doc: str | None, *, num_actors: int, total_steps: int, target_return: float) -> argparse.ArgumentParser:
    """A parser with the shared flags; a script adds its algorithm's own."""
    result = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    result.add_argument("--launcher", choices=["threads", "processes", "multihost"], default="processes",
                        help="multihost: run this same command on every host (see the README's runbook)")
    result.add_argument("--num-actors", type=int, default=num_actors)
    result.add_argument("--total-steps", type=int, default=total_steps,
                        help="env steps the learner learns from (sets its number of updates)")
    result.add_argument("--seed", type=int, default=0)
    result.add_argument("--run-dir", default=None, help="default: runs/<agent>-<env>-seed<seed>, e.g. runs/ppo-cartpole-seed0")
    result.add_argument("--fresh", action="store_true", help="delete the run directory's checkpoints first")
    result.add_argument("--target-return", type=float, default=target_return,
                        help="the mean return (last 20 episodes) whose first crossing is timed")
    result.add_argument("--stop-at-target", action="store_true", help="stop as soon as the target is reached")
    result.add_argument("--compilation-cache", default=os.path.expanduser("~/.cache/jaxdist/jax"),
                        help="JAX's persistent compilation cache ('' to turn it off)")
    result.add_argument("--quiet", action="store_true", help="do not echo the nodes' output")
    hosts.add_arguments(result)
    return result


def launch_options(args: argparse.Namespace, placement: dict[str, Any]) -> dict[str, Any] | None:
    """The multihost launcher's options from the flags (None for the other launchers)."""
    if args.launcher != "multihost":
        return None
    return dict(hosts.from_args(args), placement=placement)


def prepare_run_dir(args: argparse.Namespace, agent: str, env_id: str) -> str:
    """The run directory (``--run-dir`` or the default), its checkpoints deleted on ``--fresh``."""
    env_name = env_id.lower().rsplit("-v", 1)[0]  # CartPole-v1 -> cartpole
    run_dir = args.run_dir or os.path.join("runs", f"{agent}-{env_name}-seed{args.seed}")
    if args.fresh:
        shutil.rmtree(os.path.join(run_dir, "checkpoints"), ignore_errors=True)
    return run_dir


def train_and_report(args: argparse.Namespace, agent: str, config: Any, train: Callable[..., dict[str, Any]],
                     start_time: float, placement: dict[str, Any] | None = None) -> None:
    """What an agent's script ends with: its run directory, ``train(config, ...)`` with the
    shared flags, and the report. ``placement``: the agent's for the multihost launcher."""
    run_dir = prepare_run_dir(args, agent, config.env_id)
    summary = train(config, launcher=args.launcher, run_dir=run_dir, target_return=args.target_return,
                    stop_at_target=args.stop_at_target, start_time=start_time,
                    compilation_cache=args.compilation_cache or None, echo=not args.quiet,
                    launch_options=launch_options(args, placement) if placement is not None else None)
    report(summary, args.target_return, run_dir)


def report(summary: dict[str, Any], target_return: float, run_dir: str) -> None:
    """The closing lines: when the target was reached, throughput, why the run stopped."""
    if summary["stop_reason"] == "the run had already finished":
        return
    if "host_index" in summary:  # a multihost share: host 0 reports the run
        print(f"host {summary['host_index']} stopped: {summary['stop_reason']}")
        return
    if summary["wall_time_to_target"] is not None:
        print(f"reached mean return {target_return:g} after {summary['wall_time_to_target']:.1f} s "
              f"(start-up included) and {summary['steps_to_target']:,} env steps")
    else:
        print(f"did not reach mean return {target_return:g}; last mean return {summary['final_return']}")
    rate = summary["steps_per_second"]
    print(f"{summary['env_steps']:,} env steps in {summary['wall_time']:.1f} s; steady throughput "
          f"{'-' if rate is None else f'{rate:,}'} env steps/s; {summary['stop_reason']}; results in {run_dir}")
