"""Soak: PPO on the processes launcher for a long run of kills, watched for anything that grows.

    python experiments/benchmarks/soak.py [--minutes 30] [--actor-kill-every 60] [--learner-kill-every 300]

PPO on CartPole (its preset; training never ends by itself) runs under the processes launcher
with the agents' monitor polling it, as ``experiments/ppo.py`` runs it. Meanwhile an actor is
SIGKILLed every ``--actor-kill-every`` seconds, the learner (with the replay queue and the
evaluator colocated in its process) every ``--learner-kill-every`` seconds, and every
``--scale-every`` seconds the actor group grows by one actor and shrinks back (``running.scale``).
The restart policies allow every kill (a node killed once a minute never stays up the default
policy's ``reset_after``, and would spend its budget).

Every ``--sample-every`` seconds (offset by half a period from the kills) it samples, per node
(its process and the processes under it) and for the launching process: resident memory, open
file descriptors and threads; and the run's shared-memory segments in ``/dev/shm`` (made by any
process of the run, living or dead) and the run directory's size. The threads and descriptors
counted are those there at the process's previous sample too (a descriptor on the same file,
pipe or socket), tensorstore's worker pool aside: a checkpoint save starts Orbax's threads and
opens files for its few seconds and fills tensorstore's pool, whose idle workers leave later,
and an actor killed or added between two samples opens and closes its connections, so these
follow the saves' and kills' timing, not a leak; a leaked thread or descriptor counts from its
second sample on. The pool's threads are a series of their own, with no bound on their slope
(the pool is bounded by its size), and their maximum is printed.

The nodes run with ``MALLOC_ARENA_MAX`` at ``--malloc-arena-max`` (2, every node process's
default; 0: glibc's default of 8 per core). glibc gives each thread that allocates while another holds an arena an arena of its
own, up to that default, and each arena keeps what is freed in it: a learner's server threads,
Orbax's save threads and tensorstore's pool spread its allocations over more arenas as the run
goes, and its resident memory climbs by steps of tens of MiB for as long as a new peak of some
arena can come, though what it holds stays the same. With two arenas it stays within a few MiB
from its first minute on; a leak of objects grows it the same.

At the end it prints, per series, the value at the end of the warm-up (the baseline,
``--warmup`` minutes in) and at the end, their ratio, and two least-squares slopes per minute
over the settled samples (those taken ``--warmup`` minutes or more after the first of their
process's life: a restarted node imports and compiles again): one spanning a killed node's lives
(what survives a restart, a segment or a file, counts), and one within lives (every life's
samples around their own life's mean, fitted together: growth that the restarts would hide, read
from all of them, since one life of a few minutes is too short to tell a slope from the noise).

It fails (exit 1) on a slope above its bound -- resident memory 1 MiB/min, descriptors and
threads 0.2/min per process, segments 0.1/min, the run directory 2 MiB/min (its logs and
metrics grow with the run, by a few KiB a minute) --, on a process of the run left without its
parent while the run goes on or alive after it stopped (an orphan), and on a segment left in
``/dev/shm`` after the stop. On this shared 2-core machine resident memory moves by a few MiB
between samples: read the slopes of a long run.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import io
import os
import random
import re
import secrets
import signal
import subprocess
import sys
import tempfile
import time

import numpy as np
import psutil

import jaxdist as jd
from jaxdist.agents import experiment, ppo
from jaxdist.agents.run import Monitor
from jaxdist.courier import shared_memory

MARKER = "JAXDIST_SOAK"  # in every process of the run's environment: an orphan is found by it
MIB = 1 << 20
BOUNDS = {"rss_mib": 1.0, "fds": 0.2, "threads": 0.2, "segments": 0.1, "run_dir_mib": 2.0}  # per minute
# Tensorstore (under Orbax) names its worker pool's threads so: each checkpoint save fills the pool
# up to its fixed size and idle workers leave, so its count follows the saves, not a leak.
TENSORSTORE_POOL = "ts_pool_worker"
SEGMENT = re.compile(rf"{re.escape(shared_memory.PREFIX)}\d+-(\d+)-")


@dataclasses.dataclass
class Series:
    """One sampled quantity: (minutes since the start, value) pairs, and the same split by the
    life (process id) of the node they were read from."""

    points: list[tuple[float, float]] = dataclasses.field(default_factory=list)
    lives: dict[int, list[tuple[float, float]]] = dataclasses.field(default_factory=dict)

    def add(self, minute: float, value: float, life: int = 0) -> None:
        self.points.append((minute, value))
        self.lives.setdefault(life, []).append((minute, value))

    def settled(self, warmup: float) -> dict[int, list[tuple[float, float]]]:
        """Each life's samples from `warmup` minutes after its first (a restarted process
        imports, compiles and fills its caches again)."""
        return {life: [point for point in points if point[0] >= points[0][0] + warmup]
                for life, points in self.lives.items()}

    def after(self, warmup: float) -> list[tuple[float, float]]:
        return sorted(point for points in self.settled(warmup).values() for point in points)

    def slope(self, warmup: float) -> float | None:
        """Least-squares slope per minute over every life's settled samples."""
        return fit(self.after(warmup))

    def life_slope(self, warmup: float) -> float | None:
        """One least-squares slope per minute within lives: every life's settled samples, each
        taken from its own life's mean (its own intercept), fitted together. Growth that a
        node's restarts would hide from the slope across lives, read from every life at once: a
        life of a few minutes alone is too short to tell a slope from the noise, and the
        steepest of several such fits is biased upward."""
        deviations = [(minute - mean_minute, value - mean_value)
                      for points in self.settled(warmup).values() if len(points) >= 2
                      for mean_minute, mean_value in [np.mean(points, axis=0)] for minute, value in points]
        if len(deviations) < 4:
            return None
        minutes, values = np.array(deviations).T
        spread = float(np.dot(minutes, minutes))
        return float(np.dot(minutes, values)) / spread if spread else None


def fit(points: list[tuple[float, float]]) -> float | None:
    """Least-squares slope per minute; None under 4 samples."""
    if len(points) < 4:
        return None
    minutes, values = np.array(points).T
    return float(np.polyfit(minutes, values, 1)[0])


def node_processes(running: jd.Running) -> dict[str, list[psutil.Process]]:
    """Each running node's process and those under it, and the launching process's own."""
    found = {"launcher": [psutil.Process()]}
    for name, status in running.status().items():
        if status["pid"] is None or status["state"] != "running":
            continue
        try:
            root = psutil.Process(status["pid"])
            found[name] = [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            continue  # killed between the status and now
    return found


def lasting(key: tuple[str, int], now: set, seen: dict[tuple[str, int], set]) -> int:
    """How many of `now` were there at the previous sample of `key` too (all of them at its
    first); `seen` keeps each key's last set from one sample to the next."""
    count = len(now & seen.get(key, now))
    seen[key] = now
    return count


def lasting_threads(pid: int, seen: dict[tuple[str, int], set]) -> tuple[int, int]:
    """(threads of `pid` alive at its previous sample too, tensorstore's pool aside; that pool's
    threads now)."""
    kept, pool = set(), 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/comm") as comm:
                name = comm.read().strip()
        except OSError:
            continue  # ended while listed
        if name == TENSORSTORE_POOL:
            pool += 1
        else:
            kept.add(int(tid))
    return lasting(("threads", pid), kept, seen), pool


def lasting_fds(pid: int, seen: dict[tuple[str, int], set]) -> int:
    """Descriptors of `pid` open at its previous sample too, on the same file, pipe or socket: a
    connection of an actor killed or added between two samples, or a file a save opens for its
    few seconds, comes and goes with the kills' and saves' timing, while a leaked descriptor
    counts from its second sample on."""
    kept = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            kept.add((int(fd), os.readlink(f"/proc/{pid}/fd/{fd}")))
        except OSError:
            continue  # closed while listed
    return lasting(("fds", pid), kept, seen)


def measure(processes: list[psutil.Process], seen: dict[tuple[str, int], set]) -> dict[str, float] | None:
    totals = {"rss_mib": 0.0, "fds": 0.0, "threads": 0.0, "pool_threads": 0.0}
    try:
        for process in processes:
            if process.status() == psutil.STATUS_ZOMBIE:
                return None  # killed, not yet reaped: no reading this time
            totals["rss_mib"] += process.memory_info().rss / MIB
            totals["fds"] += lasting_fds(process.pid, seen)
            threads, pool = lasting_threads(process.pid, seen)
            totals["threads"] += threads
            totals["pool_threads"] += pool
    except (psutil.NoSuchProcess, FileNotFoundError):
        return None  # a node killed mid-sample: no reading this time
    return totals


def run_segments(pids: set[int]) -> list[str]:
    """Segments in /dev/shm made by a process of the run (their names carry the creator's pid)."""
    try:
        names = os.listdir(shared_memory.DIRECTORY)
    except OSError:
        return []
    return [name for name in names if (match := SEGMENT.match(name)) and int(match.group(1)) in pids]


def directory_mib(path: str) -> float:
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except OSError:
                pass  # removed while walking (an old checkpoint)
    return total / MIB


def marked(marker: str) -> list[psutil.Process]:
    """Live processes (zombies aside) whose environment carries the run's marker, this one aside."""
    found = []
    for process in psutil.process_iter(["environ", "status"]):
        environ = process.info["environ"] or {}
        if process.pid != os.getpid() and process.info["status"] != psutil.STATUS_ZOMBIE \
                and environ.get(MARKER) == marker:
            found.append(process)
    return found


def describe(process: psutil.Process) -> str:
    try:
        return " ".join(process.cmdline())[:160]
    except psutil.Error:
        return "(gone)"


class Soak:
    def __init__(self, args: argparse.Namespace, run_dir: str) -> None:
        self.args, self.run_dir = args, run_dir
        self.series: dict[tuple[str, str], Series] = {}
        self.pids: set[int] = {os.getpid()}
        self.seen: dict[tuple[str, int], set] = {}  # each process's threads and descriptors at its last sample
        self.orphans: dict[int, str] = {}
        self.strays: dict[int, str] = {}  # outside the launcher's tree at the last sample
        self.kills = {"actor": 0, "learner": 0}
        self.scalings = 0
        self.marker = secrets.token_hex(8)
        self.started = time.monotonic()

    def minutes(self) -> float:
        return (time.monotonic() - self.started) / 60

    def sample(self, running: jd.Running) -> None:
        now = self.minutes()
        tree = node_processes(running)
        for name, processes in tree.items():
            self.pids.update(process.pid for process in processes)
            reading = measure(processes, self.seen)
            for metric, value in (reading or {}).items():
                self.series.setdefault((name, metric), Series()).add(now, value, processes[0].pid)
        inside = {process.pid for processes in tree.values() for process in processes}
        launched = {child.pid for child in psutil.Process().children(recursive=True)}
        strays = {process.pid: describe(process) for process in marked(self.marker)
                  if process.pid not in inside and process.pid not in launched}
        # Seen at two samples in a row: not one on its way out
        self.orphans.update({pid: command for pid, command in strays.items() if pid in self.strays})
        self.strays = strays
        segments = len(run_segments(self.pids))
        self.series.setdefault(("run", "segments"), Series()).add(now, segments)
        size = directory_mib(self.run_dir)
        self.series.setdefault(("run", "run_dir_mib"), Series()).add(now, size)
        rss = {name: self.series[(name, "rss_mib")].points[-1][1] for name in tree if (name, "rss_mib") in self.series}
        print(f"[soak] {now:5.1f} min: kills {self.kills}, scalings {self.scalings}; segments {segments}; "
              f"run dir {size:.1f} MiB; RSS MiB " + ", ".join(f"{k} {v:.0f}" for k, v in sorted(rss.items())),
              flush=True)

    def resources(self, program: jd.Program) -> dict[str, dict]:
        """The agents' per-group environment, with glibc's arenas capped (see the module doc)."""
        resources = experiment.resources(program)
        for group in resources.values():
            group["env"]["MALLOC_ARENA_MAX"] = str(self.args.malloc_arena_max)
        return resources

    def kill(self, running: jd.Running, group: str, rng: random.Random) -> None:
        victims = [name for name, status in running.status().items()
                   if name.startswith(group + "/") and status["state"] == "running" and status["pid"]]
        if victims:
            with_pid = running.status()[rng.choice(victims)]["pid"]
            try:
                os.kill(with_pid, signal.SIGKILL)
                self.kills[group] += 1
            except ProcessLookupError:
                pass

    def scale(self, running: jd.Running, group: str) -> None:
        size = len(running.members(group))
        running.scale(group, size + 1)
        running.scale(group, size)
        self.scalings += 1

    def run(self) -> int:
        args = self.args
        os.environ[MARKER] = self.marker  # the nodes' processes inherit it
        config = experiment.with_preset(ppo.PPOConfig, args.env_id, ppo.PRESETS, total_steps=10**9, seed=args.seed)
        agent = ppo.agent(config)
        topology = agent.topology()
        patient = jd.Restart(max_restarts=1_000_000, backoff=0.5, max_backoff=2.0)
        running = jd.launch(topology.program, launcher="processes", run_dir=self.run_dir, echo=False,
                            resources=self.resources(topology.program),
                            restart={"actor": patient, "learner": patient})
        monitor = Monitor(running, agent, topology, self.run_dir, time.time(), out=io.StringIO())
        rng = random.Random(args.seed)
        end = self.started + args.minutes * 60
        period = args.sample_every
        next_sample = self.started + period / 2
        next_actor_kill = self.started + args.actor_kill_every
        next_learner_kill = self.started + args.learner_kill_every
        next_scale = self.started + args.scale_every if args.scale_every else float("inf")
        try:
            while time.monotonic() < end:
                if running.wait(timeout=args.poll_interval):
                    raise SystemExit(f"the run ended by itself: {running.stop_reason}")
                monitor.poll()
                now = time.monotonic()
                if now >= next_learner_kill:
                    self.kill(running, "learner", rng)
                    next_learner_kill += args.learner_kill_every
                    next_actor_kill = max(next_actor_kill, now + 5)  # one kill at a time
                elif now >= next_actor_kill:
                    self.kill(running, "actor", rng)
                    next_actor_kill += args.actor_kill_every
                if now >= next_scale:
                    self.scale(running, "actor")
                    next_scale += args.scale_every
                if now >= next_sample:
                    self.sample(running)
                    while next_sample <= time.monotonic():  # a scale may have taken longer than a period
                        next_sample += period
        finally:
            running.stop()
            monitor.poll(final=True)
            monitor.close()
        print(f"[soak] stopped: {running.stop_reason}; env steps {monitor.env_steps:,}, learner update "
              f"{monitor.version}, restarts {monitor.restarts()}", flush=True)
        return self.report()

    def report(self) -> int:
        args = self.args
        # multiprocessing's resource tracker, started by the launch, lives as long as this process.
        tracker = {child.pid for child in psutil.Process().children() if "resource_tracker" in describe(child)}
        deadline = time.monotonic() + 10  # the stop reaps every node; give stragglers a moment
        while (left := [p for p in marked(self.marker) if p.pid not in tracker]) and time.monotonic() < deadline:
            time.sleep(0.2)
        for process in left:
            self.orphans[process.pid] = describe(process)
        leftover = run_segments(self.pids)
        failures = []
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                cwd=os.path.dirname(os.path.abspath(__file__))).stdout.strip() or "unknown"
        print(f"\nMeasured by `python experiments/benchmarks/soak.py --minutes {args.minutes:g} --actor-kill-every "
              f"{args.actor_kill_every:g} --learner-kill-every {args.learner_kill_every:g} --scale-every "
              f"{args.scale_every:g} --malloc-arena-max {args.malloc_arena_max}` at commit `{commit}` on {datetime.date.today()} ({os.cpu_count()} cores, "
              f"{psutil.virtual_memory().total / (1 << 30):.0f} GiB); {self.kills['actor']} actor kills, "
              f"{self.kills['learner']} learner kills, {self.scalings} scalings up and down. Baseline: the "
              f"first settled sample ({args.warmup:g} min into its process's life).\n")
        print("| process | quantity | at warm-up | at end | ratio | slope per minute | within lives | bound | |")
        print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
        for (name, metric), series in sorted(self.series.items()):
            points = series.after(args.warmup)
            if not points:
                continue
            first, last = points[0][1], points[-1][1]
            slopes = {"across lives": series.slope(args.warmup), "within lives": series.life_slope(args.warmup)}
            bound = BOUNDS.get(metric)  # none for the tensorstore pool: its maximum is printed below
            grows = [f"{name} {metric} grows {slope:.3g}/min {how} (bound {bound:g})"
                     for how, slope in slopes.items() if slope is not None and bound is not None and slope > bound]
            failures += grows
            ratio = f"{last / first:.2f}" if first else "-"
            shown = ["-" if slope is None else f"{slope:+.3f}" for slope in slopes.values()]
            print(f"| {name} | {metric} | {first:.1f} | {last:.1f} | {ratio} | {' | '.join(shown)} | "
                  f"{'-' if bound is None else f'{bound:g}'} | {'GROWS' if grows else 'ok'} |")
        pools = {name: max(value for _, value in series.points)
                 for (name, metric), series in sorted(self.series.items()) if metric == "pool_threads"}
        print(f"\nmost threads seen in tensorstore's pool: "
              + ", ".join(f"{name} {count:.0f}" for name, count in pools.items() if count))
        print(f"orphaned processes: {len(self.orphans)}; segments left in {shared_memory.DIRECTORY}: {len(leftover)}")
        failures += [f"orphaned process {pid}: {command}" for pid, command in self.orphans.items()]
        failures += [f"segment left: {name}" for name in leftover]
        for failure in failures:
            print(f"FAIL: {failure}")
        return 1 if failures else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--actor-kill-every", type=float, default=60.0, help="seconds")
    parser.add_argument("--learner-kill-every", type=float, default=300.0, help="seconds")
    parser.add_argument("--scale-every", type=float, default=120.0, help="seconds (0: never scale)")
    parser.add_argument("--sample-every", type=float, default=30.0, help="seconds")
    parser.add_argument("--warmup", type=float, default=2.0, help="minutes before the slopes' first sample")
    parser.add_argument("--malloc-arena-max", type=int, default=2,
                        help="glibc's MALLOC_ARENA_MAX in the nodes (0: glibc's default)")
    parser.add_argument("--poll-interval", type=float, default=0.1, help="the monitor's, as the scripts poll")
    parser.add_argument("--env-id", default="CartPole-v1")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--run-dir", default=None, help="default: a temporary directory, removed after")
    args = parser.parse_args()
    if args.run_dir:
        return Soak(args, os.path.abspath(args.run_dir)).run()
    with tempfile.TemporaryDirectory(prefix="jaxdist-soak-") as run_dir:
        return Soak(args, run_dir).run()


if __name__ == "__main__":
    sys.exit(main())
