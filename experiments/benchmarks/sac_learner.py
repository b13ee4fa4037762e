"""SAC's learner fed by its replay node against SAC's bare jitted update loop (updates/s, ratio),
as ``learner.py`` measures Ape-X's.

    python experiments/benchmarks/sac_learner.py [--steps 1000] [--rounds 5] [--steps-per-call 1 8]

Both run SAC's update (Pendulum-v1's preset: batch 256, 2x64 MLPs) on transitions of a uniform
table of 20,000 Pendulum-shaped transitions:
* baseline: ``jax.jit(update, donate_argnums=0)`` in a plain Python loop over 16 samples drawn
  once (cycled): the loop no learner can beat, with no replay in it;
* jaxdist: ``Learner.run()`` whose source is a ``ReplayNode`` serving the ``Uniform`` table as a
  thread of this process (as the Sebulba topology colocates it), for each ``--steps-per-call``:
  every dispatch's batches sampled in one request and fetched ahead (``prefetch=2``),
  parameters published every 8 updates and metrics written every 200, as the preset does.
Rounds alternate the two after a warm-up that compiles each; each side's figure is its best
round (this shared machine only ever slows a round down).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import io
import os
import platform
import subprocess
import tempfile
import time

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def transitions(size: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"obs": rng.normal(size=(size, 3)).astype(np.float32),
            "action": rng.uniform(-2, 2, size=(size, 1)).astype(np.float32),
            "reward": rng.normal(size=size).astype(np.float32), "discount": np.full(size, 0.99, np.float32),
            "next_obs": rng.normal(size=(size, 3)).astype(np.float32)}


def measure(args: argparse.Namespace) -> list[tuple[str, float, float]]:
    import jax

    import jaxdist as jd
    from jaxdist import courier
    from jaxdist.agents import sac
    from jaxdist.agents.experiment import with_preset
    from jaxdist.agents.sac import learning
    from jaxdist.envs.spaces import env_info
    from jaxdist.nodes.learner import Learner, PublishOptions, ReplaySource

    config = with_preset(sac.SACConfig, "Pendulum-v1", sac.PRESETS, update_batch=args.batch)
    logic = learning.logic(config, env_info("Pendulum-v1"))
    size = 20_000
    program = jd.Program("bench-sac-replay")
    program.add_node(jd.ReplayNode(jd.replay.Uniform(size, seed=0)), label="replay")
    running = jd.launch(program, launcher="threads", run_dir=tempfile.mkdtemp(prefix="jaxdist-bench-sac-"), echo=False)
    try:
        replay = courier.Client(running.addresses["replay/0"], token=running.token)
        jd.replay.ReplayClient(replay).insert_batch(transitions(size))
        samples = [jd.replay.ReplayClient(replay).sample(config.update_batch)["data"] for _ in range(16)]
        bare = jax.jit(logic.update, donate_argnums=0)
        state = logic.init(jax.random.key(0))
        key = jax.random.key(1)

        def baseline(steps: int) -> float:
            nonlocal state
            began = time.perf_counter()
            for i in range(steps):
                state, _ = bare(state, samples[i % len(samples)], key)
            jax.block_until_ready(state)
            return steps / (time.perf_counter() - began)

        learners = {k: Learner(logic, ReplaySource(replay, config.update_batch), steps_per_call=k, max_steps=k,
                               prefetch=2, run_dir=tempfile.mkdtemp(prefix="jaxdist-bench-sac-learner-"),
                               publishing=PublishOptions(every=config.publish_every_updates,
                                                         log_every=config.log_every_updates), name="learner")
                    for k in args.steps_per_call}

        def jaxdist_run(learner: Learner, steps: int) -> float:
            learner._max_steps += steps  # the benchmark's only reach inside: train `steps` more
            began = time.perf_counter()
            with contextlib.redirect_stdout(io.StringIO()):
                learner.run()
            jax.block_until_ready(learner._train)
            return steps / (time.perf_counter() - began)

        baseline(args.steps)  # warm-up: compiles each
        for learner in learners.values():
            with contextlib.redirect_stdout(io.StringIO()):
                learner.run()
        best = {"bare": 0.0, **{k: 0.0 for k in learners}}
        for _ in range(args.rounds):
            best["bare"] = max(best["bare"], baseline(args.steps))
            for k, learner in learners.items():
                best[k] = max(best[k], jaxdist_run(learner, args.steps))
        for learner in learners.values():
            learner.close()
    finally:
        running.stop()
    return [(f"SAC updates/s, replay node, steps_per_call {k}", best["bare"], best[k]) for k in learners]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=1_000, help="updates per timed round")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--steps-per-call", type=int, nargs="+", default=[1, 8])
    args = ap.parse_args()
    rows = measure(args)
    commit = subprocess.run(["git", "-C", REPO, "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip() or "unknown"
    print(f"`python experiments/benchmarks/sac_learner.py --steps {args.steps} --rounds {args.rounds} --batch "
          f"{args.batch}` at commit `{commit}` on {datetime.date.today()} ({platform.machine()}, {os.cpu_count()} "
          f"cores); baseline = SAC's jitted update in a Python loop on pre-drawn samples")
    print(f"{'metric':44} {'baseline':>10} {'jaxdist':>10} {'ratio':>6}  target")
    for name, base, ours in rows:
        print(f"{name:44} {base:10.1f} {ours:10.1f} {ours / base:6.2f}  >= 0.80")


if __name__ == "__main__":
    main()
