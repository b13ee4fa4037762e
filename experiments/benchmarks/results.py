"""The README's agent tables, measured: run an agent's experiment script over several seeds, as a
user would (processes launcher, the env's preset, ``--stop-at-target``), and write the table of
env steps and wall time to the target from each run's ``summary.json``, with the commit and the
date it was measured at.

    python experiments/benchmarks/results.py --agent ppo --env-id Pendulum-v1 --seeds 0 1 2 3 4
    python experiments/benchmarks/results.py --agent ppo --env-id CartPole-v1 --readme

With ``--readme`` the table replaces the README's block between
``<!-- results: AGENT ENV -->`` and ``<!-- /results -->`` (added at the end of the README's
"Agents" section when there is none). Extra arguments after ``--`` go to the agent's script
(for example ``-- --total-steps 200000``); a table measured with them is a block of its own,
``<!-- results: AGENT ENV ARGS -->``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPTS = {"ppo": "ppo.py", "impala": "impala.py", "apex": "apex_dqn.py", "es": "es.py", "r2d2": "r2d2.py"}


def run_seed(agent: str, env_id: str, seed: int, run_root: str, extra: list[str]) -> dict:
    """One seed's run from a fresh run directory; its summary."""
    run_dir = os.path.join(run_root, f"{agent}-{env_id.replace(':', '_')}-seed{seed}")
    command = [sys.executable, os.path.join(REPO, "experiments", SCRIPTS[agent]), "--env-id", env_id, "--seed", str(seed),
               "--run-dir", run_dir, "--fresh", "--quiet", "--stop-at-target", *extra]
    started = time.monotonic()
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"seed {seed} failed ({' '.join(command)}):\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}")
    with open(os.path.join(run_dir, "summary.json")) as f:
        summary = json.load(f)
    print(f"seed {seed}: {done.stdout.strip().splitlines()[-2] if done.stdout.strip() else ''} "
          f"({time.monotonic() - started:.0f} s)", flush=True)
    return summary


def table(agent: str, env_id: str, extra: list[str], summaries: list[dict]) -> str:
    commit = subprocess.run(["git", "-C", REPO, "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip() or "unknown"
    target = summaries[0].get("target_return")
    reached = sum(s.get("steps_to_target") is not None for s in summaries)
    flags = " -- " + " ".join(extra) if extra else ""
    lines = [f"Measured by `experiments/benchmarks/results.py --agent {agent} --env-id {env_id}{flags}` at commit "
             f"`{commit}` on {datetime.date.today()} ({os.cpu_count()} cores, processes launcher, the env's preset, "
             f"`--stop-at-target`; wall time includes start-up). {reached} of {len(summaries)} seeds reached the "
             f"evaluation return {target:g}.", "",
             "| seed | env steps to target | wall time to target (s) | env steps/s | last evaluation return | env steps |",
             "| --- | --- | --- | --- | --- | --- |"]
    for s in summaries:
        show = lambda value, fmt="{:,}": "-" if value is None else fmt.format(value)  # noqa: E731
        lines.append(f"| {s['seed']} | {show(s.get('steps_to_target'))} | {show(s.get('wall_time_to_target'), '{:.1f}')} "
                     f"| {show(s.get('steps_per_second'))} | {show(s.get('final_return'), '{:.1f}')} "
                     f"| {s['env_steps']:,} |")
    return "\n".join(lines)


def write_readme(agent: str, env_id: str, extra: list[str], text: str,
                 readme: str = os.path.join(REPO, "README.md")) -> None:
    """Replace the block of this agent, env and script arguments (each its own table)."""
    with open(readme) as f:
        content = f.read()
    key = " ".join([agent, env_id, *extra])
    start, end = f"<!-- results: {key} -->", "<!-- /results -->"
    block = f"{start}\n{text}\n{end}"
    pattern = re.compile(re.escape(start) + r".*?" + re.escape(end), re.S)
    if pattern.search(content):
        content = pattern.sub(lambda _: block, content)
    else:
        anchor = content.index("## Your own environment and network")
        title = f"**{agent.upper()} on {env_id}" + (f" ({' '.join(extra)})" if extra else "") + "**"
        content = content[:anchor] + f"{title}\n\n{block}\n\n" + content[anchor:]
    with open(readme, "w") as f:
        f.write(content)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--agent", choices=sorted(SCRIPTS), required=True)
    parser.add_argument("--env-id", required=True)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--run-root", default=os.path.join("runs", "results"))
    parser.add_argument("--readme", action="store_true", help="write the table into README.md")
    parser.add_argument("extra", nargs="*", help="after --: arguments for the agent's script")
    args = parser.parse_args()
    summaries = [run_seed(args.agent, args.env_id, seed, args.run_root, args.extra) for seed in args.seeds]
    text = table(args.agent, args.env_id, args.extra, summaries)
    print(text)
    if args.readme:
        write_readme(args.agent, args.env_id, args.extra, text)


if __name__ == "__main__":
    main()
