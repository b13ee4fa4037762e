"""jaxdist's agents beside what a user would pick instead, on this machine, seeds interleaved in
one run. On CartPole-v1: Stable-Baselines3's PPO (PyTorch), a PureJaxRL-style single-file JAX
loop on gymnax, and a JAX + gymnasium single-process loop; on CartPoleNoVel-v1 (no velocities: a
policy needs memory) jaxdist's recurrent PPO beside SB3-contrib's RecurrentPPO; on Pendulum-v1
and HalfCheetah-v5 jaxdist's SAC and TD3 beside SB3's, with the same hyperparameters where both
have them (``peer_loops/``). Each peer runs in a venv of its own under ``--cache`` (made from the package
registry on first use; peers of one library share one), each seed as a process of its own;
jaxdist runs its agent's script (``experiments/ppo.py --env-id ENV --stop-at-target``, ...) as a
user would (the env's preset, and flags beyond it where a run's name says so: HalfCheetah's SAC
and TD3 also run at a replay ratio of 0.5, and each SB3 row's ratio over those is a line under
the table).

Every run stops at the first evaluation of the deterministic policy over 10 episodes at the
env's target mean return (jaxdist's evaluator runs beside training; the peers evaluate in their
training loop, as often as jaxdist's preset does; with ``--peer-timeout`` a peer still short of
it is stopped then, and reports how far it got). The table: wall time from launch to that
evaluation (start-up included), env steps then, steady env steps/s (from the first update on),
peak memory of the run's process tree (its processes' proportional set sizes summed), and each
run's wall time over that of the jaxdist run it stands beside: for a peer stopped short of the
target, its time until the stop, a lower bound (">").

    python experiments/benchmarks/peers.py --seeds 0 1 2 --write
    python experiments/benchmarks/peers.py --env-id CartPoleNoVel-v1 --seeds 0 1 --write
    python experiments/benchmarks/peers.py --env-id Pendulum-v1 --seeds 0 1 --write
    python experiments/benchmarks/peers.py --env-id HalfCheetah-v5 --seeds 0 1 2 3 4 --peer-timeout 2000 --write
"""

from __future__ import annotations

import argparse
import dataclasses
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
SB3 = ["torch", "stable-baselines3", "sb3-contrib", "gymnasium[mujoco]"]


@dataclasses.dataclass(frozen=True)
class Peer:
    home: str  # its venv under --cache
    packages: list[str]  # what that venv installs
    loop: list[str]  # its script in peer_loops/ and the arguments before the seed
    beside: str | None = None  # the jaxdist run its wall time is divided by; None: the comparison's one


@dataclasses.dataclass(frozen=True)
class Comparison:
    target: float  # the evaluation return every run stops at
    jaxdist: dict[str, list[str]]  # name: the agent whose script in experiments/ runs, and flags beyond its preset
    peers: dict[str, Peer]
    eval_every: int = 2048  # a peer's env steps (off-policy: updates) between evaluations, as jaxdist's preset

    def baseline(self, name: str) -> str:
        """The jaxdist run whose wall time run ``name``'s is divided by."""
        peer = self.peers.get(name)
        if peer is None:
            return name
        return peer.beside or next(iter(self.jaxdist))

    def variants(self, name: str) -> list[str]:
        """The jaxdist runs of the same agent as the one peer ``name`` stands beside, other flags
        set (a replay ratio of the distributed design's choosing), that its wall time is also
        divided by (none for a jaxdist run)."""
        if name not in self.peers:
            return []
        beside = self.baseline(name)
        return [other for other, command in self.jaxdist.items()
                if other != beside and command[0] == self.jaxdist[beside][0]]


COMPARISONS = {
    "CartPole-v1": Comparison(475.0, {"jaxdist PPO (processes launcher)": ["ppo"]}, {
        "Stable-Baselines3 PPO (PyTorch, CPU)": Peer("sb3", SB3, ["sb3_ppo.py"]),
        # gymnax imports six without asking for it
        "PureJaxRL-style loop on gymnax": Peer("gymnax", ["jax", "optax", "gymnax", "six"], ["gymnax_ppo.py"]),
        "JAX + gymnasium loop": Peer("jax-gymnasium", ["jax", "optax", "gymnasium"], ["gymnasium_ppo.py"])}),
    "CartPoleNoVel-v1": Comparison(475.0, {"jaxdist recurrent PPO (processes launcher)": ["ppo"]}, {
        "SB3-contrib RecurrentPPO (PyTorch, CPU)": Peer("sb3", SB3, ["sb3_recurrent_ppo.py"])}),
    "Pendulum-v1": Comparison(-200.0, {"jaxdist SAC (processes launcher)": ["sac"],
                                       "jaxdist TD3 (processes launcher)": ["td3"]}, {
        "Stable-Baselines3 SAC (PyTorch, CPU)": Peer("sb3", SB3, ["sb3_off_policy.py", "sac", "Pendulum-v1"],
                                                     "jaxdist SAC (processes launcher)"),
        "Stable-Baselines3 TD3 (PyTorch, CPU)": Peer("sb3", SB3, ["sb3_off_policy.py", "td3", "Pendulum-v1"],
                                                     "jaxdist TD3 (processes launcher)")}, eval_every=500),
    # The distributed design's own lever beside them: half an update per env step, actors playing
    # ahead (evaluated every 10k env steps, as the others).
    "HalfCheetah-v5": Comparison(5_000.0, {
        "jaxdist SAC (processes launcher)": ["sac"],
        "jaxdist SAC, replay ratio 0.5 (processes launcher)": ["sac", "--replay-ratio", "0.5",
                                                               "--eval-every-updates", "5000"],
        "jaxdist TD3 (processes launcher)": ["td3"],
        "jaxdist TD3, replay ratio 0.5 (processes launcher)": ["td3", "--replay-ratio", "0.5",
                                                               "--eval-every-updates", "5000"]}, {
        "Stable-Baselines3 SAC (PyTorch, CPU)": Peer("sb3", SB3, ["sb3_off_policy.py", "sac", "HalfCheetah-v5"],
                                                     "jaxdist SAC (processes launcher)"),
        "Stable-Baselines3 TD3 (PyTorch, CPU)": Peer("sb3", SB3, ["sb3_off_policy.py", "td3", "HalfCheetah-v5"],
                                                     "jaxdist TD3 (processes launcher)")}, eval_every=10_000),
}


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


def tree_memory(process: psutil.Process) -> int:
    """The memory of ``process`` and its descendants now, as their proportional set sizes (a page
    shared by n of them counts 1/n in each: forked node processes share their forkserver's pages,
    which a sum of resident sizes would count once a process); their resident sizes where the
    system gives no PSS; 0 for those gone."""
    try:
        tree = [process, *process.children(recursive=True)]
    except psutil.Error:  # it exited between two samples
        return 0
    total = 0
    for one in tree:
        try:
            info = one.memory_full_info()
            total += getattr(info, "pss", info.rss)
        except psutil.Error:
            pass
    return total


def measure(command: list[str], cwd: str, env: dict[str, str],
            timeout: float | None = None) -> tuple[subprocess.CompletedProcess, int, float]:
    """The finished process, the peak memory of its tree (`tree_memory`, sampled every 0.1 s) and
    the launch time (``PEERS_LAUNCHED`` in its environment); past ``timeout`` seconds it is sent
    SIGTERM (a peer loop then reports as far as it got)."""
    launched = time.time()
    process = subprocess.Popen(command, cwd=cwd, env={**env, "PEERS_LAUNCHED": repr(launched)},
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    peak, watched = [0], psutil.Process(process.pid)

    def sample() -> None:
        while process.poll() is None:
            peak[0] = max(peak[0], tree_memory(watched))
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


def run_peer(python: str, peer: Peer, comparison: Comparison, seed: int, timeout: float | None) -> dict:
    env = dict(os.environ, PYTHONPATH=LOOPS, PEERS_TARGET=repr(comparison.target),
               PEERS_EVAL_EVERY=str(comparison.eval_every))
    done, peak, launched = measure([python, *peer.loop, str(seed)], LOOPS, env, timeout)
    wall_time = time.time() - launched
    line = next(line for line in done.stdout.splitlines() if line.startswith("PEER_RESULT "))
    return dict(json.loads(line.split(" ", 1)[1]), peak_memory=peak, wall_time=wall_time)


def run_jaxdist(agent_and_flags: list[str], env_id: str, seed: int, run_root: str) -> dict:
    agent, *flags = agent_and_flags
    run_name = "-".join(["jaxdist", *(word.strip("-") for word in agent_and_flags), f"seed{seed}"])
    run_dir = os.path.join(run_root, run_name)
    command = [sys.executable, os.path.join(REPO, "experiments", f"{agent}.py"), "--env-id", env_id, "--seed", str(seed),
               "--run-dir", run_dir, "--fresh", "--quiet", "--stop-at-target", *flags]
    _, peak, _ = measure(command, REPO, dict(os.environ))
    with open(os.path.join(run_dir, "summary.json")) as f:
        summary = json.load(f)
    keys = ("wall_time_to_target", "steps_to_target", "env_steps", "steps_per_second")
    return dict({key: summary.get(key) for key in keys}, peak_memory=peak)


def median(values: list) -> str:
    values = [v for v in values if v is not None]
    return "-" if not values else f"{statistics.median(values):,.0f}" if max(values) >= 100 else f"{statistics.median(values):.1f}"


def ratio(by_seed: dict[int, dict], base: dict[int, float | None]) -> str:
    """The median over the seeds of a run's wall time to the target over its jaxdist run's; where
    some seed of a peer was stopped short, that seed counts at its time until the stop and the
    median is a lower bound (">"), the peer's true time being longer still."""
    pairs = [(row["wall_time_to_target"] or row.get("wall_time"), row["wall_time_to_target"] is None, base[seed])
             for seed, row in by_seed.items() if base.get(seed) is not None]
    pairs = [(seconds / jaxdist, short) for seconds, short, jaxdist in pairs if seconds is not None]
    if not pairs:
        return "-"
    bound = ">" if any(short for _, short in pairs) else ""
    return f"{bound}{statistics.median(value for value, _ in pairs):.2f}x"


def table(results: dict[str, dict[int, dict]], comparison: Comparison, seeds: list[int], command: str) -> str:
    """One row a run kind, over the seeds it was measured for (``--no-run`` may find some not)."""
    walls = {name: {seed: row["wall_time_to_target"] for seed, row in by_seed.items()} for name, by_seed in results.items()}
    lines = [f"Measured by `{command}` at commit `{commit()}` on {datetime.date.today()} ({machine()}; seeds "
             f"{', '.join(map(str, seeds))}, one run at a time, the peers' in turn per seed). Medians over the seeds "
             f"that reached the target; wall time from the launch, start-up included; the steady rate is training's "
             f"alone (a peer's evaluations run in its loop, jaxdist's evaluator beside it).", "",
             f"| run | reached {comparison.target:g} | wall time to target (s) | env steps to target | steady env steps/s "
             f"| peak memory, PSS (MB) | wall time / jaxdist's |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for name, by_seed in results.items():
        if not by_seed:
            lines.append(f"| {name} | not measured | - | - | - | - | - |")
            continue
        rows = list(by_seed.values())
        times = [r["wall_time_to_target"] for r in rows]
        base = walls[comparison.baseline(name)]
        lines.append(f"| {name} | {sum(t is not None for t in times)} of {len(rows)} | {median(times)} | "
                     f"{median([r['steps_to_target'] for r in rows])} | {median([r['steps_per_second'] for r in rows])} | "
                     f"{median([r['peak_memory'] / 2 ** 20 for r in rows])} | {ratio(by_seed, base)} |")
    short = [f"{name}, seed {seed}: {row['env_steps']:,} env steps" for name, by_seed in results.items()
             for seed, row in by_seed.items() if row["wall_time_to_target"] is None]
    for name, by_seed in results.items():
        for other in comparison.variants(name):
            if results.get(other):
                lines += ["", f"{name}'s wall time over {other}'s: {ratio(by_seed, walls[other])} (median over the seeds)."]
    loads = [row["load"] for by_seed in results.values() for row in by_seed.values() if "load" in row]
    if loads:
        lines += ["", f"The machine's 1-minute load average at the runs' launches: {min(loads):.1f} to {max(loads):.1f}."]
    if short:
        lines += ["", "Runs that ended short of the target (their budget spent, or stopped at `--peer-timeout`): "
                  + "; ".join(short) + "."]
    return "\n".join(lines)


def write(path: str, env_id: str, text: str) -> bool:
    """Replace the block between ``<!-- peers: ENV -->`` and ``<!-- /peers -->``, if the page has
    one: whether it had."""
    with open(path) as f:
        content = f.read()
    start, end = f"<!-- peers: {env_id} -->", "<!-- /peers -->"
    pattern = re.compile(re.escape(start) + r".*?" + re.escape(end), re.S)
    content, found = pattern.subn(lambda _: f"{start}\n{text}\n{end}", content)
    with open(path, "w") as f:
        f.write(content)
    return bool(found)


def chosen(name: str, only: list[str] | None) -> bool:
    """Whether run ``name`` is one ``--only`` asks for (every run, without it)."""
    return only is None or any(word.lower() in re.findall(r"[\w.]+", name.lower()) for word in only)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env-id", choices=sorted(COMPARISONS), default="CartPole-v1")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--cache", default=os.path.expanduser("~/.cache/jaxdist/peers"),
                        help="where the peers' venvs live (made on first use)")
    parser.add_argument("--run-root", default=None,
                        help="the runs, and peers.jsonl: the runs done (delete it to measure afresh); "
                             "default runs/peers/ENV")
    parser.add_argument("--skip", nargs="*", default=[],
                        choices=["jaxdist", *sorted({peer.home for c in COMPARISONS.values() for peer in c.peers.values()})],
                        help="kinds not to run this time (by their venv's name)")
    parser.add_argument("--only", nargs="+", metavar="WORD",
                        help="run only the runs whose names hold one of these words (SAC: jaxdist's and SB3's SAC)")
    parser.add_argument("--peer-timeout", type=float, default=None,
                        help="stop a peer's run after this many seconds (it counts as not reaching the target, "
                             "with its env steps and rate so far)")
    parser.add_argument("--no-run", action="store_true",
                        help="run nothing: the table of the runs in peers.jsonl (others: not measured)")
    parser.add_argument("--write", action="store_true",
                        help="write the table into docs/benchmarks.md (and the README, where it has the env's block)")
    args = parser.parse_args()
    comparison = COMPARISONS[args.env_id]
    names = [*comparison.jaxdist, *comparison.peers]
    run_root = args.run_root or os.path.join("runs", "peers", args.env_id)
    pythons = {} if args.no_run else {name: venv(args.cache, peer.home, peer.packages)
                                      for name, peer in comparison.peers.items() if peer.home not in args.skip}
    record = os.path.join(run_root, "peers.jsonl")  # one line a run: a stopped comparison resumes
    done = {}
    if os.path.exists(record):
        with open(record) as f:
            done = {(row["name"], row["seed"]): row for row in map(json.loads, f)}
    os.makedirs(run_root, exist_ok=True)
    for seed in [] if args.no_run else args.seeds:
        for name in names:
            kind = comparison.peers[name].home if name in comparison.peers else "jaxdist"
            if (name, seed) in done or kind in args.skip or not chosen(name, args.only):
                continue
            load = os.getloadavg()[0]  # the machine is shared: how busy it was, for the table
            if name in comparison.jaxdist:
                row = run_jaxdist(comparison.jaxdist[name], args.env_id, seed, run_root)
            else:
                row = run_peer(pythons[name], comparison.peers[name], comparison, seed, args.peer_timeout)
            done[name, seed] = row = dict(row, name=name, seed=seed, load=load)
            with open(record, "a") as f:
                f.write(json.dumps(row) + "\n")
            print(f"seed {seed}: {name}: {row}", flush=True)
    results = {name: {seed: done[name, seed] for seed in args.seeds if (name, seed) in done} for name in names}
    text = table(results, comparison, args.seeds, "python experiments/benchmarks/peers.py " + " ".join(sys.argv[1:]))
    print(text)
    if args.write:
        if not write(PAGE, args.env_id, text):
            print(f"{PAGE} has no <!-- peers: {args.env_id} --> ... <!-- /peers --> block: add one under a heading "
                  f"of its own in 'Against the peers' and write again with --no-run", flush=True)
        write(README, args.env_id, text)  # the front page has the blocks it shows, if any


if __name__ == "__main__":
    main()
