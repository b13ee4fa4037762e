"""jaxdist's PPO beside what a user would pick instead, on this machine, seeds interleaved in one
run. On CartPole-v1: Stable-Baselines3's PPO (PyTorch), a PureJaxRL-style single-file JAX loop
on gymnax, and a JAX + gymnasium single-process loop; on CartPoleNoVel-v1 (no velocities: a
policy needs memory) jaxdist's recurrent PPO beside SB3-contrib's RecurrentPPO (``peer_loops/``).
Each peer runs in a venv of its own under ``--cache`` (made from the package registry on first
use; peers of one library share one), each seed as a process of its own; jaxdist runs
``experiments/ppo.py --env-id ENV --stop-at-target`` as a user would (the env's preset).

Every run stops at the first evaluation of the deterministic policy over 10 episodes at a mean
return of 475 (jaxdist's evaluator runs beside training; the peers evaluate every 2,048 env
steps, in the training loop; with ``--peer-timeout`` a peer still short of it is stopped then,
and reports how far it got). The table: wall time from launch to that evaluation (start-up
included), env steps then, steady env steps/s (from the first update on), peak resident memory
of the run's process tree, and each peer's wall time over jaxdist's.

    python experiments/benchmarks/peers.py --seeds 0 1 2 --write
    python experiments/benchmarks/peers.py --env-id CartPoleNoVel-v1 --seeds 0 1 --write
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import statistics
import subprocess
import sys
import threading
import time

import psutil

from results import PAGE, REPO, commit, machine

LOOPS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "peer_loops")
README = os.path.join(REPO, "README.md")
SB3 = ["torch", "stable-baselines3", "sb3-contrib", "gymnasium"]
PEERS = {  # env id: {name: (its venv under --cache, what it installs, its script in peer_loops/)}
    "CartPole-v1": {
        "Stable-Baselines3 PPO (PyTorch, CPU)": ("sb3", SB3, "sb3_ppo.py"),
        # gymnax imports six without asking for it
        "PureJaxRL-style loop on gymnax": ("gymnax", ["jax", "optax", "gymnax", "six"], "gymnax_ppo.py"),
        "JAX + gymnasium loop": ("jax-gymnasium", ["jax", "optax", "gymnasium"], "gymnasium_ppo.py")},
    "CartPoleNoVel-v1": {"SB3-contrib RecurrentPPO (PyTorch, CPU)": ("sb3", SB3, "sb3_recurrent_ppo.py")},
}
JAXDIST = {"CartPole-v1": "jaxdist PPO (processes launcher)",
           "CartPoleNoVel-v1": "jaxdist recurrent PPO (processes launcher)"}


def venv(cache: str, name: str, packages: list[str]) -> str:
    """The python of the peer's venv, made (and its packages installed) on first use; a venv
    that lacks some of ``packages`` gains them (a new peer of a library already there)."""
    home = os.path.join(cache, name)
    python, done = os.path.join(home, "bin", "python"), os.path.join(home, "installed.json")
    installed = json.load(open(done)) if os.path.exists(done) else None
    if installed == packages:
        return python
    if installed is not None and set(installed) <= set(packages):
        print(f"installing {', '.join(sorted(set(packages) - set(installed)))} into {home}", flush=True)
        subprocess.run([python, "-m", "pip", "install", "-q", *packages], check=True)
        with open(done, "w") as f:
            json.dump(packages, f)
        return python
    print(f"installing {', '.join(packages)} into {home}", flush=True)
    subprocess.run([sys.executable, "-m", "venv", "--clear", home], check=True)
    if "torch" in packages:  # the CPU-only wheel where its index is reachable, else the registry's
        subprocess.run([python, "-m", "pip", "install", "-q", "torch", "--index-url",
                        "https://download.pytorch.org/whl/cpu", "--retries", "0", "--timeout", "10"])
    subprocess.run([python, "-m", "pip", "install", "-q", *packages], check=True)
    with open(done, "w") as f:
        json.dump(packages, f)
    return python


def tree_rss(process: psutil.Process) -> int:
    """The resident memory of ``process`` and its descendants now; 0 for those gone."""
    try:
        tree = [process, *process.children(recursive=True)]
    except psutil.Error:  # it exited between two samples
        return 0
    total = 0
    for one in tree:
        try:
            total += one.memory_info().rss
        except psutil.Error:
            pass
    return total


def measure(command: list[str], cwd: str, env: dict[str, str],
            timeout: float | None = None) -> tuple[subprocess.CompletedProcess, int, float]:
    """The finished process, the peak resident memory of its tree (sampled every 0.1 s) and
    the launch time (``PEERS_LAUNCHED`` in its environment); past ``timeout`` seconds it is sent
    SIGTERM (a peer loop then reports as far as it got)."""
    launched = time.time()
    process = subprocess.Popen(command, cwd=cwd, env={**env, "PEERS_LAUNCHED": repr(launched)},
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    peak, watched = [0], psutil.Process(process.pid)

    def sample() -> None:
        while process.poll() is None:
            peak[0] = max(peak[0], tree_rss(watched))
            time.sleep(0.1)
    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        out, err = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.terminate()
        out, err = process.communicate()
    sampler.join()
    done = subprocess.CompletedProcess(command, process.returncode, out, err)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed:\n{out[-2000:]}\n{err[-4000:]}")
    return done, peak[0], launched


def run_peer(python: str, script: str, seed: int, timeout: float | None) -> dict:
    done, peak, _ = measure([python, script, str(seed)], LOOPS, dict(os.environ, PYTHONPATH=LOOPS), timeout)
    line = next(line for line in done.stdout.splitlines() if line.startswith("PEER_RESULT "))
    return dict(json.loads(line.split(" ", 1)[1]), peak_rss=peak)


def run_jaxdist(env_id: str, seed: int, run_root: str) -> dict:
    run_dir = os.path.join(run_root, f"jaxdist-seed{seed}")
    command = [sys.executable, os.path.join(REPO, "experiments", "ppo.py"), "--env-id", env_id, "--seed", str(seed),
               "--run-dir", run_dir, "--fresh", "--quiet", "--stop-at-target"]
    _, peak, _ = measure(command, REPO, dict(os.environ))
    with open(os.path.join(run_dir, "summary.json")) as f:
        summary = json.load(f)
    keys = ("wall_time_to_target", "steps_to_target", "env_steps", "steps_per_second")
    return dict({key: summary.get(key) for key in keys}, peak_rss=peak)


def median(values: list) -> str:
    values = [v for v in values if v is not None]
    return "-" if not values else f"{statistics.median(values):,.0f}" if max(values) >= 100 else f"{statistics.median(values):.1f}"


def table(results: dict[str, dict[int, dict]], baseline: str, seeds: list[int], command: str) -> str:
    """One row a run kind, over the seeds it was measured for (``--no-run`` may find some not)."""
    base = {seed: row["wall_time_to_target"] for seed, row in results[baseline].items()}
    lines = [f"Measured by `{command}` at commit `{commit()}` on {datetime.date.today()} ({machine()}; seeds "
             f"{', '.join(map(str, seeds))}, one run at a time, the peers' in turn per seed). Medians over the seeds "
             f"that reached the target; wall time from the launch, start-up included; the steady rate is training's "
             f"alone (a peer's evaluations run in its loop, jaxdist's evaluator beside it).", "",
             "| run | reached 475 | wall time to target (s) | env steps to target | steady env steps/s | peak memory (MB) | wall time / jaxdist's |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for name, by_seed in results.items():
        if not by_seed:
            lines.append(f"| {name} | not measured | - | - | - | - | - |")
            continue
        rows = list(by_seed.values())
        times = [r["wall_time_to_target"] for r in rows]
        ratio = [row["wall_time_to_target"] / base[seed] for seed, row in by_seed.items()
                 if row["wall_time_to_target"] is not None and base.get(seed) is not None]
        lines.append(f"| {name} | {sum(t is not None for t in times)} of {len(rows)} | {median(times)} | "
                     f"{median([r['steps_to_target'] for r in rows])} | {median([r['steps_per_second'] for r in rows])} | "
                     f"{median([r['peak_rss'] / 2 ** 20 for r in rows])} | "
                     f"{'-' if not ratio else f'{statistics.median(ratio):.2f}x'} |")
    short = [f"{name}, seed {seed}: {row['env_steps']:,} env steps" for name, by_seed in results.items()
             for seed, row in by_seed.items() if row["wall_time_to_target"] is None]
    loads = [row["load"] for by_seed in results.values() for row in by_seed.values() if "load" in row]
    if loads:
        lines += ["", f"The machine's 1-minute load average at the runs' launches: {min(loads):.1f} to {max(loads):.1f}."]
    if short:
        lines += ["", "Runs that ended short of the target (their budget spent, or stopped at `--peer-timeout`): "
                  + "; ".join(short) + "."]
    return "\n".join(lines)


def write(path: str, env_id: str, text: str) -> None:
    """Replace the block between ``<!-- peers: ENV -->`` and ``<!-- /peers -->``, if the page has one."""
    with open(path) as f:
        content = f.read()
    start, end = f"<!-- peers: {env_id} -->", "<!-- /peers -->"
    pattern = re.compile(re.escape(start) + r".*?" + re.escape(end), re.S)
    with open(path, "w") as f:
        f.write(pattern.sub(lambda _: f"{start}\n{text}\n{end}", content))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env-id", choices=sorted(PEERS), default="CartPole-v1")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--cache", default=os.path.expanduser("~/.cache/jaxdist/peers"),
                        help="where the peers' venvs live (made on first use)")
    parser.add_argument("--run-root", default=None,
                        help="the runs, and peers.jsonl: the runs done (delete it to measure afresh); "
                             "default runs/peers/ENV")
    parser.add_argument("--skip", nargs="*", default=[],
                        choices=["jaxdist", *sorted({home for peers in PEERS.values() for home, _, _ in peers.values()})],
                        help="kinds not to run this time (by their venv's name)")
    parser.add_argument("--peer-timeout", type=float, default=None,
                        help="stop a peer's run after this many seconds (it counts as not reaching the target, "
                             "with its env steps and rate so far)")
    parser.add_argument("--no-run", action="store_true",
                        help="run nothing: the table of the runs in peers.jsonl (others: not measured)")
    parser.add_argument("--write", action="store_true",
                        help="write the table into docs/benchmarks.md (and the README, where it has the env's block)")
    args = parser.parse_args()
    peers, jaxdist = PEERS[args.env_id], JAXDIST[args.env_id]
    run_root = args.run_root or os.path.join("runs", "peers", args.env_id)
    pythons = {} if args.no_run else {name: venv(args.cache, home, packages) for name, (home, packages, _) in peers.items()
                                      if home not in args.skip}
    record = os.path.join(run_root, "peers.jsonl")  # one line a run: a stopped comparison resumes
    done = {}
    if os.path.exists(record):
        with open(record) as f:
            done = {(row["name"], row["seed"]): row for row in map(json.loads, f)}
    os.makedirs(run_root, exist_ok=True)
    for seed in [] if args.no_run else args.seeds:
        for name in [jaxdist, *peers]:
            if (name, seed) in done or peers.get(name, ("jaxdist",))[0] in args.skip:
                continue
            load = os.getloadavg()[0]  # the machine is shared: how busy it was, for the table
            if name == jaxdist:
                row = run_jaxdist(args.env_id, seed, run_root)
            else:
                row = run_peer(pythons[name], peers[name][2], seed, args.peer_timeout)
            done[name, seed] = row = dict(row, name=name, seed=seed, load=load)
            with open(record, "a") as f:
                f.write(json.dumps(row) + "\n")
            print(f"seed {seed}: {name}: {row}", flush=True)
    results = {name: {seed: done[name, seed] for seed in args.seeds if (name, seed) in done} for name in [jaxdist, *peers]}
    text = table(results, jaxdist, args.seeds, "python experiments/benchmarks/peers.py " + " ".join(sys.argv[1:]))
    print(text)
    if args.write:
        for path in (PAGE, README):
            write(path, args.env_id, text)


if __name__ == "__main__":
    main()
