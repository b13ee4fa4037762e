"""The benchmarks page's agent tables, measured: run an agent's experiment script over several
seeds, as a user would (processes launcher, the env's preset, ``--stop-at-target``), and write the
table of env steps and wall time to the target from each run's ``summary.json``, with the commit,
the date and the machine it was measured on, and a picture of the learning curves (each seed's
evaluation return against env steps, their mean and spread).

    python experiments/benchmarks/results.py --agent ppo --env-id Pendulum-v1 --seeds 0 1 2 3 4
    python experiments/benchmarks/results.py --agent ppo --env-id CartPole-v1 --write
    python experiments/benchmarks/results.py --agent ppo --env-id Breakout-MinAtar --time-limit 600 \
        -- --architecture anakin --num-seeds 4

Each seed is a launch of its own, unless the script's arguments ask for ``--num-seeds N``
(Anakin's seeds, vmapped in one learner): then one launch trains the N seeds and the table has a
row for each, from its ``summary.json``'s ``seeds``, and one for their mean (what
``--stop-at-target`` stops on). ``--time-limit`` stops a launch still short of its target after
that many seconds, in order (SIGTERM), and the table shows what it had reached; so does SIGTERM to
this process (``timeout``'s, say), at once. Each launch's
output is in ``RUN_ROOT/<run>.log``.

With ``--write`` the table and its picture replace the block between
``<!-- results: AGENT ENV -->`` and ``<!-- /results -->`` of ``docs/benchmarks.md`` (added at
the end of its agents' section when there is none), the picture under ``docs/images/results/``;
several of these processes may write the page at once. Extra arguments after ``--`` go to the
agent's script (for example ``-- --total-steps 200000``); a table measured with them is a block
of its own, ``<!-- results: AGENT ENV ARGS -->``. ``--whole-budget`` runs each launch to its total
env steps instead of stopping at the target (a 1M-step run's final return); its table still says
when the target was first reached, and is a block of its own too. ``--commit`` names the commit
measured where the tree is a copy without its git directory.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import datetime
import fcntl
import json
import os
import platform
import re
import signal
import subprocess
import sys
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from matplotlib.figure import Figure

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPTS = {"ppo": "ppo.py", "impala": "impala.py", "apex": "apex_dqn.py", "es": "es.py", "sac": "sac.py", "td3": "td3.py",
           "r2d2": "r2d2.py"}
PAGE = os.path.join(REPO, "docs", "benchmarks.md")
PICTURES = os.path.join("images", "results")  # relative to the page
DEFAULT_SEEDS = [0, 1, 2, 3, 4]
STOP_GRACE = 120.0  # seconds a launch stopped at the time limit has to save, report and exit


def machine() -> str:
    """This machine in a few words: its accelerators, if any, and its CPU model and core count."""
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            model = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    cpus = f"{os.cpu_count()} cores of {model}"
    gpus = accelerators()
    return f"{gpus} and {cpus}" if gpus else cpus


def accelerators() -> str | None:
    """The GPUs nvidia-smi lists (``NVIDIA H200``, ``2 x NVIDIA H100 80GB HBM3``), read without
    starting JAX in this process: the runs it launches need the device's memory."""
    try:
        listed = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                                text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    names = collections.Counter(line.strip() for line in listed.stdout.splitlines() if line.strip())
    if listed.returncode != 0 or not names:
        return None
    return ", ".join(name if count == 1 else f"{count} x {name}" for name, count in names.items())


def commit(given: str | None = None) -> str:
    """The short hash of the checkout measured, ``+changes`` when its code differs from it; or
    ``given``, the commit a copy of the tree without its git directory is."""
    if given:
        return given
    git = ["git", "-C", REPO]
    top = subprocess.run([*git, "rev-parse", "--show-toplevel"], capture_output=True, text=True).stdout.strip()
    if not top or os.path.realpath(top) != os.path.realpath(REPO):
        raise SystemExit(f"error: {REPO} is not a git checkout, so the commit measured is unknown: pass --commit HASH, "
                         f"the commit this tree is a copy of")
    head = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run([*git, "status", "--porcelain", "--untracked-files=no", "--", ".", ":!docs", ":!*.md"],
                           capture_output=True, text=True).stdout.strip()  # their own output, and text
    return head + ("+changes" if dirty else "")


def add_commit_argument(parser: argparse.ArgumentParser) -> None:
    """``--commit``, for ``commit(args.commit)``: a benchmark run on a copy of the tree (a lent
    machine's) names the commit it measures."""
    parser.add_argument("--commit", help="the commit measured, where this tree is a copy without its git directory "
                        "(default: the checkout's HEAD, +changes where its code differs)")


class Stop(Exception):
    """SIGTERM to this process: stop the launch now, as at the time limit."""


def _stop(signum: int, frame: Any) -> None:
    global terminated
    terminated = True
    raise Stop


terminated = False  # SIGTERM came: no further launch


@dataclasses.dataclass(frozen=True)
class Measurement:
    """What one table measures: an agent's script on an env, with ``extra`` arguments for the
    script, each launch stopped at the target or, with ``whole_budget``, run to its total env
    steps. Each measurement is a block of the page and a picture of its own."""

    agent: str
    env_id: str
    extra: tuple[str, ...] = ()
    whole_budget: bool = False

    @property
    def key(self) -> str:
        """What its block on the page is marked with."""
        return " ".join([self.agent, self.env_id, *(["whole-budget"] if self.whole_budget else []), *self.extra])

    @property
    def picture_name(self) -> str:
        return re.sub(r"[^A-Za-z0-9.]+", "-", self.key).strip("-").lower() + ".png"

    @property
    def heading(self) -> str:
        """The page's heading over a new block."""
        details = ["to the end of its env steps"] * self.whole_budget + [" ".join(self.extra)] * bool(self.extra)
        return f"### {self.agent.upper()} on {self.env_id}" + (f" ({', '.join(details)})" if details else "")


def launch(measurement: Measurement, name: str, run_root: str, args: list[str], time_limit: float | None) -> dict:
    """One launch of the agent's script from a fresh run directory, with ``args`` (the
    measurement's own after them); its summary, with ``run_dir`` added, and ``stopped``: the
    seconds after which the time limit (or SIGTERM to this process) stopped it, None where it
    ended by itself. Its output goes to ``<run_dir>.log``."""
    run_dir = os.path.join(run_root, name)
    stop = [] if measurement.whole_budget else ["--stop-at-target"]
    command = [sys.executable, os.path.join(REPO, "experiments", SCRIPTS[measurement.agent]), "--env-id",
               measurement.env_id, "--run-dir", run_dir, "--fresh", "--quiet", *stop, *args, *measurement.extra]
    os.makedirs(run_root, exist_ok=True)
    started, stopped = time.monotonic(), None
    previous = signal.signal(signal.SIGTERM, _stop)
    with open(run_dir + ".log", "w") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, text=True)
        try:
            process.wait(timeout=time_limit)
        except (subprocess.TimeoutExpired, Stop):  # the ordered stop: the run saves and writes its summary
            signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second SIGTERM (to the process group) changes nothing
            stopped = round(time.monotonic() - started)
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=STOP_GRACE)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        finally:
            signal.signal(signal.SIGTERM, previous)
    with open(run_dir + ".log") as log:
        output = log.read()
    summary_file = os.path.join(run_dir, "summary.json")
    how = "" if stopped is None else f" (stopped after {stopped} s)"
    if process.returncode != 0 or not os.path.exists(summary_file):
        raise SystemExit(f"{name} failed{how} ({' '.join(command)}, exit status {process.returncode}); the end of "
                         f"{run_dir}.log:\n{output[-4000:]}")
    with open(summary_file) as f:
        summary = json.load(f)
    report = [line for line in output.splitlines() if line and not line.startswith("[")]  # not the nodes' or progress
    print(f"{name}{how}: {time.monotonic() - started:.0f} s\n  " + "\n  ".join(report[-8:]), flush=True)
    return dict(summary, run_dir=run_dir, stopped=stopped)


def measure(measurement: Measurement, seeds: list[int] | None, run_root: str, time_limit: float | None) -> list[dict]:
    """The table's rows: one launch per seed, each its row; or, where the script's arguments ask
    for ``--num-seeds N``, one launch and a row for each of its N seeds and one for their mean.
    A row's ``curve`` names its series in the run's ``learning_curves``."""
    num_seeds = vmapped_seeds(list(measurement.extra))
    slug = f"{measurement.agent}-{measurement.env_id.replace(':', '_')}"
    if num_seeds == 1:
        rows = []
        for seed in seeds or DEFAULT_SEEDS:
            if not terminated:
                rows.append(dict(launch(measurement, f"{slug}-seed{seed}", run_root, ["--seed", str(seed)], time_limit),
                                 curve="evaluation return"))
        return rows
    if seeds:
        raise SystemExit(f"error: --seeds launches once per seed, and the script's --num-seeds {num_seeds} trains "
                         f"{num_seeds} seeds in one launch: drop one of them")
    return vmapped_rows(launch(measurement, f"{slug}-{num_seeds}seeds", run_root, [], time_limit))


def vmapped_rows(summary: dict) -> list[dict]:
    """The rows of a launch of vmapped seeds: each seed's (its ``summary["seeds"]`` entry; the env
    steps and env steps/s are every seed's), then their mean's (the summary's own)."""
    from jaxdist.agents.run import SEED_CURVE

    shared = {key: summary.get(key) for key in ("env_steps", "steps_per_second", "run_dir", "stopped", "target_return")}
    return ([dict(seed, **shared, curve=f"{SEED_CURVE}{seed['seed']}") for seed in summary["seeds"]]
            + [dict(summary, seed=f"mean of {summary['num_seeds']}", mean=True)])


def vmapped_seeds(extra: list[str]) -> int:
    """The ``--num-seeds`` the script's arguments ask for (1 where none)."""
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    parser.add_argument("--num-seeds", type=int, default=1)
    return parser.parse_known_args(extra)[0].num_seeds


def table(measurement: Measurement, rows: list[dict], measured: str, time_limit: float | None = None,
          picture: str | None = None) -> str:
    """The page's table of ``rows`` (``measure``'s), under the sentence that says how, where and
    when they were measured."""
    seeds = [row for row in rows if not row.get("mean")]
    count = rows[-1]["num_seeds"] if rows[-1].get("mean") else len(seeds)  # also where no seed was evaluated yet
    target = rows[0].get("target_return")
    reached = sum(row.get("steps_to_target") is not None for row in seeds)
    agent, env_id, extra = measurement.agent, measurement.env_id, measurement.extra
    vmapped = len(rows) > len(seeds)
    launched = [row["seed"] for row in seeds]
    flags = ((f" --seeds {' '.join(map(str, launched))}" if not vmapped and launched != DEFAULT_SEEDS else "")
             + (f" --time-limit {time_limit:g}" if time_limit else "")
             + (" --whole-budget" if measurement.whole_budget else "")
             + (" -- " + " ".join(extra) if extra else ""))
    ending = "each launch run to its total env steps" if measurement.whole_budget else "`--stop-at-target`"
    how = (f"one Anakin launch of {count} vmapped seeds, env steps and env steps/s per seed" if vmapped
           else "one launch per seed")
    stopped = [row for row in seeds if row.get("stopped") is not None]
    stops = ("" if not stopped else f" The launch was stopped after {stopped[0]['stopped']} s, short of the target."
             if vmapped else " Stopped short of the target: " + ", ".join(f"seed {row['seed']} after {row['stopped']} s"
                                                                         for row in stopped) + ".")
    lines = [f"Measured by `experiments/benchmarks/results.py --agent {agent} --env-id {env_id}{flags}` at commit "
             f"`{measured}` on {datetime.date.today()} ({machine()}; processes launcher, the env's preset, "
             f"{ending}, {how}; wall time includes start-up). {reached} of {count} seeds reached the "
             f"evaluation return {target:g}.{stops}", "",
             "| seed | env steps to target | wall time to target (s) | env steps/s | last evaluation return | env steps |",
             "| --- | --- | --- | --- | --- | --- |"]
    for row in rows:
        show = lambda value, fmt="{:,}": "-" if value is None else fmt.format(value)  # noqa: E731
        lines.append(f"| {row['seed']} | {show(row.get('steps_to_target'))} | {show(row.get('wall_time_to_target'), '{:.1f}')} "
                     f"| {show(row.get('steps_per_second'))} | {show(row.get('final_return'), '{:.1f}')} "
                     f"| {row['env_steps']:,} |")
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


def curves(path: str, title: str, rows: list[dict]) -> Figure:
    """Each seed's evaluation return against env steps (thin; the run's ``learning_curves``, the
    row's ``curve`` of them), their mean and min-max spread on a common grid over the seeds still
    running there, and the target; a single seed's curve alone. The figure, once saved."""
    import numpy as np
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    from jaxdist.agents.run import learning_curves

    runs = []
    for row in rows:
        if "curve" in row and row["curve"] in (series := learning_curves(row["run_dir"])):
            xs, ys = series[row["curve"]]
            runs.append((np.array(xs, float), np.array(ys, float)))
    figure = Figure(figsize=(7.2, 4.0), dpi=100, layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    if len(runs) == 1:
        xs, ys = runs[0]
        axes.plot(xs, ys, color="C0", linewidth=2, drawstyle="steps-post", label=f"seed {rows[0]['seed']}")
    elif runs:
        import warnings

        warnings.simplefilter("ignore", RuntimeWarning)  # a point of the grid where no seed still ran
        grid = np.linspace(0, max(xs[-1] for xs, _ in runs), 200)
        on_grid = np.array([latest(grid, xs, ys) for xs, ys in runs])
        for xs, ys in runs:
            axes.plot(xs, ys, color="C0", alpha=0.3, linewidth=1, drawstyle="steps-post")
        axes.fill_between(grid, np.nanmin(on_grid, 0), np.nanmax(on_grid, 0), color="C0", alpha=0.15,
                          label=f"min-max over {len(runs)} seeds")
        axes.plot(grid, np.nanmean(on_grid, 0), color="C0", linewidth=2, label="mean of the seeds still running")
    target = rows[0].get("target_return")
    if target is not None:
        axes.axhline(target, color="C3", linestyle="--", linewidth=1.2, label=f"target {target:g}")
    axes.set_title(title)
    axes.set_xlabel("env steps")
    axes.set_ylabel("evaluation return")
    axes.grid(True, alpha=0.3)
    axes.legend(loc="lower right")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    figure.savefig(path)
    return figure


def write_page(measurement: Measurement, text: str, page: str = PAGE) -> None:
    """Replace the measurement's block (a new one goes at the end of the agents' section), under
    a lock on the page: several of these processes (one an env, say) may end at once, and each
    must change the page as the one before left it."""
    with open(page, "r+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)  # released as the file closes
        content = f.read()
        start, end = f"<!-- results: {measurement.key} -->", "<!-- /results -->"
        block = f"{start}\n{text}\n{end}"
        pattern = re.compile(re.escape(start) + r".*?" + re.escape(end), re.S)
        if pattern.search(content):
            content = pattern.sub(lambda _: block, content)
        else:
            anchor = content.index("## Micro-benchmarks")
            content = content[:anchor] + f"{measurement.heading}\n\n{block}\n\n" + content[anchor:]
        f.seek(0)
        f.write(content)
        f.truncate()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--agent", choices=sorted(SCRIPTS), required=True)
    parser.add_argument("--env-id", required=True)
    parser.add_argument("--seeds", type=int, nargs="+", help=f"one launch each (default: {DEFAULT_SEEDS}); "
                        f"not with the script's --num-seeds, whose seeds share one launch")
    parser.add_argument("--run-root", default=os.path.join("runs", "results"))
    parser.add_argument("--time-limit", type=float, help="seconds a launch may run before it is stopped "
                        "(in order: it saves and reports) and its table row shows what it had reached")
    add_commit_argument(parser)
    parser.add_argument("--whole-budget", action="store_true", help="run each launch to its total env steps, "
                        "not stopping at the target; the table still says when the target was first reached")
    parser.add_argument("--write", action="store_true", help="write the table and its curves into docs/benchmarks.md")
    parser.add_argument("extra", nargs="*", help="after --: arguments for the agent's script")
    args = parser.parse_args()
    measured = commit(args.commit)  # before the runs: a tree without its commit fails now, not after them
    measurement = Measurement(args.agent, args.env_id, tuple(args.extra), args.whole_budget)
    rows = measure(measurement, args.seeds, args.run_root, args.time_limit)
    picture = os.path.join(PICTURES, measurement.picture_name)
    curves(os.path.join(os.path.dirname(PAGE), picture) if args.write else os.path.join(args.run_root, os.path.basename(picture)),
           f"{args.agent} on {args.env_id} {' '.join(args.extra)}".strip(), rows)
    text = table(measurement, rows, measured, args.time_limit, picture if args.write else None)
    print(text, flush=True)
    if args.write:
        write_page(measurement, text)


if __name__ == "__main__":
    main()
