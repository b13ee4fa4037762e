"""SAC and TD3 beside Stable-Baselines3's SAC and TD3 on this machine: same env, same seeds, the
same hyperparameters where both have them (Pendulum-v1's preset: 2x64 MLPs, Adam at 1e-3,
batch 256, 500 random steps first, one gradient update per env step, tau 0.005, gamma 0.99),
and the wall time (start-up and imports included) and env steps to the same evaluation return:
the mean of 10 deterministic episodes, evaluated every 500 updates.

    python experiments/benchmarks/offpolicy_vs_sb3.py [--seeds 0 1 2] [--agents sac td3] [--env-id Pendulum-v1]

SB3 (with torch) goes into a venv of its own (``--venv``, default /tmp/jaxdist-sb3-venv; created
with pip on the first run); nothing of it is committed or imported here. Ours run as a user runs them: the agent's script, processes
launcher, ``--stop-at-target``. The runs alternate, one at a time.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import textwrap

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

SB3_RUN = textwrap.dedent("""
    import time
    START = time.time()
    import json, sys
    import gymnasium as gym
    import numpy as np
    from stable_baselines3 import SAC, TD3
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.evaluation import evaluate_policy

    agent, env_id, seed, target, total, eval_every, eval_episodes = sys.argv[1:8]
    seed, target, total, eval_every, eval_episodes = int(seed), float(target), int(total), int(eval_every), int(eval_episodes)
    common = dict(learning_rate=1e-3, buffer_size=50_000, learning_starts=500, batch_size=256, tau=0.005, gamma=0.99,
                  train_freq=1, gradient_steps=1, policy_kwargs=dict(net_arch=[64, 64]), seed=seed, device="cpu")
    env = gym.make(env_id)
    model = SAC("MlpPolicy", env, **common) if agent == "sac" else TD3("MlpPolicy", env, **common)
    eval_env = gym.make(env_id)
    eval_env.reset(seed=seed + 10_000)

    class Target(BaseCallback):
        def __init__(self):
            super().__init__()
            self.result = None

        def _on_step(self):
            updates = self.num_timesteps - common["learning_starts"]
            if updates > 0 and updates % eval_every == 0:
                mean, _ = evaluate_policy(self.model, eval_env, n_eval_episodes=eval_episodes, deterministic=True)
                self.last = mean
                if mean >= target:
                    self.result = (self.num_timesteps, time.time() - START, mean)
                    return False
            return True

    callback = Target()
    model.learn(total_timesteps=total, callback=callback)
    steps, wall, last = callback.result or (None, None, getattr(callback, "last", None))
    print(json.dumps({"steps_to_target": steps, "wall_time_to_target": wall, "final_return": last,
                      "env_steps": model.num_timesteps, "wall_time": time.time() - START}))
""")


def ensure_venv(venv: str) -> str:
    """The SB3 venv's python, made on first use."""
    python = os.path.join(venv, "bin", "python")
    if os.path.exists(python):
        return python
    subprocess.run([sys.executable, "-m", "venv", venv], check=True)
    subprocess.run([python, "-m", "pip", "install", "-q", "stable-baselines3>=2.3", "gymnasium>=1.1"], check=True)
    return python


def run_sb3(python: str, agent: str, env_id: str, seed: int, target: float, total: int) -> dict:
    done = subprocess.run([python, "-c", SB3_RUN, agent, env_id, str(seed), str(target), str(total), "500", "10"],
                          capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    if done.returncode:
        raise SystemExit(f"SB3 {agent} seed {seed} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def run_ours(agent: str, env_id: str, seed: int, run_root: str, total: int) -> dict:
    run_dir = os.path.join(run_root, f"{agent}-{seed}")
    command = [sys.executable, os.path.join(REPO, "experiments", f"{agent}.py"), "--env-id", env_id, "--seed",
               str(seed), "--run-dir", run_dir, "--fresh", "--quiet", "--stop-at-target", "--total-steps", str(total)]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"jaxdist {agent} seed {seed} failed:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}")
    with open(os.path.join(run_dir, "summary.json")) as f:
        return json.load(f)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--agents", nargs="+", default=["sac", "td3"], choices=["sac", "td3"])
    ap.add_argument("--env-id", default="Pendulum-v1")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--target", type=float, default=-200.0)
    ap.add_argument("--total-steps", type=int, default=20_000)
    ap.add_argument("--venv", default="/tmp/jaxdist-sb3-venv")
    ap.add_argument("--run-root", default=os.path.join("runs", "vs-sb3"))
    args = ap.parse_args()
    python = ensure_venv(args.venv)
    rows = []
    for agent in args.agents:
        for seed in args.seeds:
            for side in ("jaxdist", "SB3"):
                result = (run_ours(agent, args.env_id, seed, args.run_root, args.total_steps) if side == "jaxdist"
                          else run_sb3(python, agent, args.env_id, seed, args.target, args.total_steps))
                rows.append((agent, seed, side, result))
                print(f"{agent} seed {seed} {side}: {result.get('steps_to_target')} env steps, "
                      f"{result.get('wall_time_to_target')} s to {args.target:g}", flush=True)
    commit = subprocess.run(["git", "-C", REPO, "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip() or "unknown"
    print(f"\n`python experiments/benchmarks/offpolicy_vs_sb3.py --env-id {args.env_id} --seeds "
          f"{' '.join(map(str, args.seeds))}` at commit `{commit}` on {datetime.date.today()} ({platform.machine()}, "
          f"{os.cpu_count()} cores); evaluation return {args.target:g} (mean of 10 deterministic episodes)\n")
    print("| agent | seed | jaxdist env steps | jaxdist wall (s) | SB3 env steps | SB3 wall (s) | SB3 / jaxdist wall |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    show = lambda value, fmt: "-" if value is None else fmt.format(value)  # noqa: E731
    for agent in args.agents:
        for seed in args.seeds:
            ours, theirs = (next(r for a, s, side, r in rows if a == agent and s == seed and side == name)
                            for name in ("jaxdist", "SB3"))
            a, b = ours.get("wall_time_to_target"), theirs.get("wall_time_to_target")
            print(f"| {agent} | {seed} | {show(ours.get('steps_to_target'), '{:,}')} | {show(a, '{:.1f}')} "
                  f"| {show(theirs.get('steps_to_target'), '{:,}')} | {show(b, '{:.1f}')} "
                  f"| {show(b / a if a and b else None, '{:.2f}')} |")


if __name__ == "__main__":
    main()
