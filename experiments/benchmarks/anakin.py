"""Anakin PPO's env steps/s against a single-process PureJaxRL-style loop, in the same run.

    python experiments/benchmarks/anakin.py [--envs 16 64 256] [--updates 64] [--rounds 6]

Both sides run the same computation: PPO's CartPole preset (2x64 MLP, T = 32, 10 epochs of 2
minibatches, an evaluation of 10 episodes every 10 updates), the JAX CartPole of
``jaxdist.envs.jax_envs``, ``--envs`` envs (and ``--seeds`` runs vmapped), every update a rollout and
PPO's update (``jaxdist.learning.anakin``):
* baseline: PureJaxRL's shape, ``--updates`` updates as one ``lax.scan`` in one jitted call,
  nothing leaving the device between them;
* jaxdist: the learner node's own loop, ``Learner.run()`` in this process, as the Anakin
  topology runs it: ``--steps-per-call`` updates per dispatch, parameters published (copied to
  the host) every ``--publish-every`` updates, metrics written to a CSV every ``--log-every``.
Rounds alternate the two after a warm-up that compiles both; each side's figure is its best
round (this shared 2-core VM only ever slows a round down), the median of per-round ratios beside.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import shutil
import statistics
import tempfile
import time


def measure(envs: int, args: argparse.Namespace) -> tuple[float, float, float]:
    """(baseline, jaxdist, median ratio) env steps/s for ``envs`` envs."""
    import jax

    from jaxdist.agents import experiment, ppo

    from jaxdist.learning import anakin
    from jaxdist.agents.experiment import with_preset
    from jaxdist.nodes.learner import Learner, PublishOptions

    config = with_preset(ppo.PPOConfig, "CartPole-v1", ppo.PRESETS, architecture="anakin", num_actors=1,
                         envs_per_actor=envs, total_steps=10**9, num_seeds=args.seeds)
    logic = experiment.anakin_logic(ppo.agent(config))
    steps_per_round = args.updates * envs * config.trajectory_length * args.seeds

    @jax.jit
    def train(state, key):
        return jax.lax.scan(lambda s, k: logic.update(s, {}, k), state, jax.random.split(key, args.updates))

    state = logic.init(jax.random.key(0))

    def baseline() -> float:
        nonlocal state
        began = time.perf_counter()
        state, metrics = train(state, jax.random.key(1))
        jax.block_until_ready((state, metrics))
        return steps_per_round / (time.perf_counter() - began)

    run_dir = tempfile.mkdtemp(prefix="jaxdist-bench-anakin-")
    learner = Learner(logic, anakin.no_batch, steps_per_call=args.steps_per_call, max_steps=args.updates,
                      publishing=PublishOptions(every=args.publish_every, log_every=args.log_every),
                      run_dir=run_dir, name="learner", prefetch=0)

    def jaxdist() -> float:
        learner._max_steps += args.updates  # the benchmark's only reach inside: train that many more
        began = time.perf_counter()
        with contextlib.redirect_stdout(io.StringIO()):  # its "stopped at step N" lines
            learner.run()
        jax.block_until_ready(learner._train)
        return steps_per_round / (time.perf_counter() - began)

    baseline()  # warm-up: compiles both
    with contextlib.redirect_stdout(io.StringIO()):
        learner.run()
    rounds = []
    for i in range(args.rounds):  # alternate which goes first, so drifts hit both alike
        if i % 2:
            ours = jaxdist()
            rounds.append((baseline(), ours))
        else:
            rounds.append((baseline(), jaxdist()))
    learner.close()
    shutil.rmtree(run_dir, ignore_errors=True)
    return (max(b for b, _ in rounds), max(j for _, j in rounds),
            statistics.median(j / b for b, j in rounds))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--envs", type=int, nargs="+", default=[16, 64, 256])
    ap.add_argument("--updates", type=int, default=64, help="updates per timed round")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--seeds", type=int, default=1, help="num_seeds: runs vmapped in one learner")
    ap.add_argument("--steps-per-call", type=int, default=8)
    ap.add_argument("--publish-every", type=int, default=8)
    ap.add_argument("--log-every", type=int, default=8)
    args = ap.parse_args()
    import jax

    print(f"PPO CartPole-v1 (JAX port), T = 32, {args.seeds} seed(s); {jax.device_count()} "
          f"{jax.devices()[0].platform} device(s); env steps of all seeds; "
          f"jaxdist: {args.steps_per_call} updates a dispatch, publish and log every {args.publish_every} / "
          f"{args.log_every}; best of {args.rounds} rounds of {args.updates} updates")
    print(f"{'env steps/s':24} {'baseline':>12} {'jaxdist':>12} {'ratio':>6}  target")
    for envs in args.envs:
        base, ours, median = measure(envs, args)
        print(f"{f'{envs} envs':24} {base:12,.0f} {ours:12,.0f} {ours / base:6.2f}  >= 0.90 "
              f"(median of rounds {median:.2f})", flush=True)


if __name__ == "__main__":
    main()
