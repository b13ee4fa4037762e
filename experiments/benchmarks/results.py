"""The benchmarks page's agent tables, measured: run an agent's experiment script over several
seeds, as a user would (processes launcher, the env's preset, ``--stop-at-target``), and write the
table of env steps and wall time to the target from each run's ``summary.json``, with the commit,
the date and the machine it was measured on, and a picture of the learning curves (each seed's
evaluation return against env steps, their mean and spread).

    python experiments/benchmarks/results.py --agent ppo --env-id Pendulum-v1 --seeds 0 1 2 3 4
    python experiments/benchmarks/results.py --agent ppo --env-id CartPole-v1 --write

With ``--write`` the table and its picture replace the block between
``<!-- results: AGENT ENV -->`` and ``<!-- /results -->`` of ``docs/benchmarks.md`` (added at
the end of its agents' section when there is none), the picture under ``docs/images/results/``.
Extra arguments after ``--`` go to the agent's script (for example ``-- --total-steps 200000``);
a table measured with them is a block of its own, ``<!-- results: AGENT ENV ARGS -->``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPTS = {"ppo": "ppo.py", "impala": "impala.py", "apex": "apex_dqn.py", "es": "es.py", "sac": "sac.py", "td3": "td3.py",
           "r2d2": "r2d2.py"}
PAGE = os.path.join(REPO, "docs", "benchmarks.md")
PICTURES = os.path.join("images", "results")  # relative to the page


def machine() -> str:
    """This machine in a few words: its CPU model and core count."""
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            model = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return f"{os.cpu_count()} cores of {model}"


def commit() -> str:
    """The short hash of the checkout measured, ``+changes`` when its code differs from it."""
    git = ["git", "-C", REPO]
    head = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run([*git, "status", "--porcelain", "--untracked-files=no", "--", ".", ":!docs"],
                           capture_output=True, text=True).stdout.strip()  # docs/: this script's own output
    return (head or "unknown") + ("+changes" if dirty else "")


def run_seed(agent: str, env_id: str, seed: int, run_root: str, extra: list[str]) -> dict:
    """One seed's run from a fresh run directory; its summary, with ``run_dir`` added."""
    run_dir = os.path.join(run_root, f"{agent}-{env_id.replace(':', '_')}-seed{seed}")
    command = [sys.executable, os.path.join(REPO, "experiments", SCRIPTS[agent]), "--env-id", env_id, "--seed", str(seed),
               "--run-dir", run_dir, "--fresh", "--quiet", "--stop-at-target", *extra]
    started = time.monotonic()
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"seed {seed} failed ({' '.join(command)}):\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}")
    with open(os.path.join(run_dir, "summary.json")) as f:
        summary = json.load(f)
    summary["run_dir"] = run_dir
    print(f"seed {seed}: {done.stdout.strip().splitlines()[-2] if done.stdout.strip() else ''} "
          f"({time.monotonic() - started:.0f} s)", flush=True)
    return summary


def table(agent: str, env_id: str, extra: list[str], summaries: list[dict], picture: str | None = None) -> str:
    target = summaries[0].get("target_return")
    reached = sum(s.get("steps_to_target") is not None for s in summaries)
    flags = " -- " + " ".join(extra) if extra else ""
    lines = [f"Measured by `experiments/benchmarks/results.py --agent {agent} --env-id {env_id}{flags}` at commit "
             f"`{commit()}` on {datetime.date.today()} ({machine()}; processes launcher, the env's preset, "
             f"`--stop-at-target`; wall time includes start-up). {reached} of {len(summaries)} seeds reached the "
             f"evaluation return {target:g}.", "",
             "| seed | env steps to target | wall time to target (s) | env steps/s | last evaluation return | env steps |",
             "| --- | --- | --- | --- | --- | --- |"]
    for s in summaries:
        show = lambda value, fmt="{:,}": "-" if value is None else fmt.format(value)  # noqa: E731
        lines.append(f"| {s['seed']} | {show(s.get('steps_to_target'))} | {show(s.get('wall_time_to_target'), '{:.1f}')} "
                     f"| {show(s.get('steps_per_second'))} | {show(s.get('final_return'), '{:.1f}')} "
                     f"| {s['env_steps']:,} |")
    if picture:
        lines += ["", f"![{agent} on {env_id}: evaluation return over seeds]({picture})"]
    return "\n".join(lines)


def latest(grid, xs, ys):
    """The latest of ``ys`` (recorded at ``xs``) at each point of ``grid``; NaN before the first
    and after the last, where the run had not begun or had ended."""
    import numpy as np

    index = np.searchsorted(xs, grid, side="right") - 1
    values = ys[np.clip(index, 0, len(ys) - 1)].astype(float)
    values[(index < 0) | (grid > xs[-1])] = np.nan
    return values


def curves(path: str, title: str, summaries: list[dict]) -> None:
    """Each seed's latest evaluation return against env steps (thin), their mean and min-max spread on
    a common grid over the seeds still running there, and the target."""
    import numpy as np
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    from jaxdist.records.metrics import metrics_path, read_metrics

    runs = []
    for s in summaries:  # the monitor's progress.csv: env steps and the latest evaluation return
        rows = [row for row in read_metrics(metrics_path(s["run_dir"], "progress")) if row.get("eval_return") is not None]
        if rows:
            runs.append((np.array([row["step"] for row in rows], float),
                         np.array([row["eval_return"] for row in rows], float), s["seed"]))
    figure = Figure(figsize=(7.2, 4.0), dpi=100, layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    if runs:
        import warnings

        warnings.simplefilter("ignore", RuntimeWarning)  # a point of the grid where no seed still ran
        grid = np.linspace(0, max(xs[-1] for xs, _, _ in runs), 200)
        on_grid = np.array([latest(grid, xs, ys) for xs, ys, _ in runs])
        for xs, ys, _ in runs:
            axes.plot(xs, ys, color="C0", alpha=0.3, linewidth=1, drawstyle="steps-post")
        axes.fill_between(grid, np.nanmin(on_grid, 0), np.nanmax(on_grid, 0), color="C0", alpha=0.15,
                          label=f"min-max over {len(runs)} seeds")
        axes.plot(grid, np.nanmean(on_grid, 0), color="C0", linewidth=2, label="mean")
    target = summaries[0].get("target_return")
    if target is not None:
        axes.axhline(target, color="C3", linestyle="--", linewidth=1.2, label=f"target {target:g}")
    axes.set_title(title)
    axes.set_xlabel("env steps")
    axes.set_ylabel("evaluation return")
    axes.grid(True, alpha=0.3)
    axes.legend(loc="lower right")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    figure.savefig(path)


def block_key(agent: str, env_id: str, extra: list[str]) -> str:
    return " ".join([agent, env_id, *extra])


def picture_name(agent: str, env_id: str, extra: list[str]) -> str:
    return re.sub(r"[^A-Za-z0-9.]+", "-", block_key(agent, env_id, extra)).strip("-").lower() + ".png"


def write_page(agent: str, env_id: str, extra: list[str], text: str, page: str = PAGE) -> None:
    """Replace the block of this agent, env and script arguments (each its own table)."""
    with open(page) as f:
        content = f.read()
    key = block_key(agent, env_id, extra)
    start, end = f"<!-- results: {key} -->", "<!-- /results -->"
    block = f"{start}\n{text}\n{end}"
    pattern = re.compile(re.escape(start) + r".*?" + re.escape(end), re.S)
    if pattern.search(content):
        content = pattern.sub(lambda _: block, content)
    else:
        anchor = content.index("## Micro-benchmarks")
        title = f"### {agent.upper()} on {env_id}" + (f" ({' '.join(extra)})" if extra else "")
        content = content[:anchor] + f"{title}\n\n{block}\n\n" + content[anchor:]
    with open(page, "w") as f:
        f.write(content)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--agent", choices=sorted(SCRIPTS), required=True)
    parser.add_argument("--env-id", required=True)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--run-root", default=os.path.join("runs", "results"))
    parser.add_argument("--write", action="store_true", help="write the table and its curves into docs/benchmarks.md")
    parser.add_argument("extra", nargs="*", help="after --: arguments for the agent's script")
    args = parser.parse_args()
    summaries = [run_seed(args.agent, args.env_id, seed, args.run_root, args.extra) for seed in args.seeds]
    picture = os.path.join(PICTURES, picture_name(args.agent, args.env_id, args.extra))
    curves(os.path.join(os.path.dirname(PAGE), picture) if args.write else os.path.join(args.run_root, os.path.basename(picture)),
           f"{args.agent} on {args.env_id} {' '.join(args.extra)}".strip(), summaries)
    text = table(args.agent, args.env_id, args.extra, summaries, picture if args.write else None)
    print(text)
    if args.write:
        write_page(args.agent, args.env_id, args.extra, text)


if __name__ == "__main__":
    main()
