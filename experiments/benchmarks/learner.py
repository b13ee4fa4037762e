"""The learner node's step against a bare jitted update loop, and checkpoint throughput.

    python experiments/benchmarks/learner.py [--steps 500] [--rounds 12] [--ckpt-mb 200]

Updates/s: the same MLP update on the same host batches (cycled), fed to
* baseline: ``jax.jit(update, donate_argnums=0)`` with the state replicated and the batch split
  over the devices, called in a plain Python loop (on a multi-device CPU mesh it waits every 8
  calls for the call 8 back, as it must not to deadlock);
* jaxdist: the learner node's own loop, ``Learner.run()``, in this process (no RPC is on its
  path): a batch source read by a feeder thread (on CPU the host arrays go straight to the
  jitted step), parameters published every ``--publish-every`` steps, metrics written every
  ``--log-every`` steps to a CSV (checkpoints off: they are measured on their own). Each
  round is one ``run()`` of ``--steps`` steps, ending with its final publish and flush.
Rounds alternate the two, after a warm-up that compiles both; each side's figure is its best
round (as ``timeit`` takes the best: this shared 2-core VM only ever slows a round down, by up
to ~20%), and the median of the per-round ratios is printed beside. 8 devices run in a subprocess with
``--xla_force_host_platform_device_count=8``: on this 2-core machine eight virtual devices are
much slower per step than one, so those figures check overhead, not speed.

Ape-X updates/s (``--apex-steps``; batch 128 of CartPole transitions, the 2x128 dueling MLP,
double DQN with importance weights), the learner fed by replay against the loop it cannot beat:
* baseline: Ape-X's update under ``jax.jit(donate_argnums=0)`` on one prioritized sample
  (cycled), its new priorities fetched to the host after every update, as writing them back
  needs;
* jaxdist: ``Learner.run()`` whose source is a ``ReplayNode`` serving a ``Prioritized`` table
  of 20,000 transitions as a thread of this process (as the Ape-X topology colocates it), with
  ``PriorityWriter`` sending each dispatch's priorities back, for each ``--apex-steps-per-call``:
  every dispatch's batches sampled in one request and fetched ahead, priorities written behind.

Checkpoint MB/s: a ``--ckpt-mb`` state saved (and committed) and restored by the learner's
``Checkpointer`` against Orbax's ``StandardCheckpointer`` alone, best of ``--ckpt-reps``.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import itertools
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

import numpy as np

FEATURES, HIDDEN, BATCH = 64, 256, 256


def init(rng):
    import jax
    import jax.numpy as jnp

    keys = jax.random.split(rng, 3)
    params = {"w1": jax.random.normal(keys[0], (FEATURES, HIDDEN)) / FEATURES ** 0.5,
              "b1": jnp.zeros(HIDDEN),
              "w2": jax.random.normal(keys[1], (HIDDEN, HIDDEN)) / HIDDEN ** 0.5,
              "b2": jnp.zeros(HIDDEN),
              "w3": jax.random.normal(keys[2], (HIDDEN, 1)) / HIDDEN ** 0.5,
              "b3": jnp.zeros(1)}
    return {"params": params, "opt": _tx().init(params)}


def _tx():
    import optax

    return optax.adam(1e-3)


def update(state, batch, rng):
    import jax
    import jax.numpy as jnp
    import optax

    from jaxdist.learning import parallel

    def loss_fn(params):
        h = jnp.tanh(batch["x"] @ params["w1"] + params["b1"])
        h = jnp.tanh(h @ params["w2"] + params["b2"])
        return jnp.mean(((h @ params["w3"] + params["b3"])[:, 0] - batch["y"]) ** 2)

    loss, grads = jax.value_and_grad(loss_fn)(state["params"])
    grads = parallel.pmean(grads)
    updates, opt = _tx().update(grads, state["opt"], state["params"])
    return {"params": optax.apply_updates(state["params"], updates), "opt": opt}, {"loss": loss}


def make_batches(count: int) -> list[dict]:
    rng = np.random.default_rng(0)
    batches = []
    for _ in range(count):
        x = rng.normal(size=(BATCH, FEATURES)).astype(np.float32)
        batches.append({"x": x, "y": np.sin(x.sum(-1)).astype(np.float32)})
    return batches


class Cycle:
    """A batch source over a fixed list of host batches."""

    def __init__(self, batches: list[dict]) -> None:
        self._it = itertools.cycle(batches)

    def __call__(self) -> dict:
        return next(self._it)


def updates_per_second(args: argparse.Namespace) -> dict:
    """Paired rounds of the bare loop and the learner on this process's devices."""
    import jax
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    from jaxdist.learning import parallel
    from jaxdist.nodes.learner import Learner, LearnerLogic, PublishOptions

    devices = jax.device_count()
    batches = make_batches(16)
    mesh = parallel.make_mesh()
    replicated, split = NamedSharding(mesh, P()), NamedSharding(mesh, P("data"))
    bare = jax.jit(update, donate_argnums=0, in_shardings=(replicated, split, replicated),
                   out_shardings=(replicated, replicated))
    key = jax.device_put(jax.random.key(1), replicated)
    state = jax.device_put(init(jax.random.key(0)), replicated)
    block_every = 8 if devices > 1 else 0

    def baseline(steps: int) -> float:
        nonlocal state
        pending = None
        began = time.perf_counter()
        for i in range(steps):
            state, metrics = bare(state, batches[i % len(batches)], key)
            if block_every and (i + 1) % block_every == 0:
                jax.block_until_ready(pending)
                pending = metrics
        jax.block_until_ready(state)
        return steps / (time.perf_counter() - began)

    learner = Learner(LearnerLogic(init, update), Cycle(batches), max_steps=args.steps,
                      publishing=PublishOptions(every=args.publish_every, log_every=args.log_every),
                      run_dir=tempfile.mkdtemp(prefix="jaxdist-bench-learner-"), name="learner", prefetch=2)
    return {"devices": devices, **paired_rounds(baseline, learner, args.steps, args.rounds)}


def paired_rounds(baseline: Any, learner: Any, steps: int, rounds: int) -> dict:
    """``rounds`` rounds of ``steps`` updates of the bare loop (``baseline(steps) -> updates/s``)
    and of ``learner`` (a ``Learner`` over the same update), the order alternating so that drifts
    hit both alike; the best of each, their ratio and the median of the rounds' ratios. Closes
    the learner and removes its run directory."""
    import jax

    def jaxdist_run(steps: int) -> float:
        learner._max_steps += steps  # the benchmark's only reach inside: train `steps` more
        began = time.perf_counter()
        with contextlib.redirect_stdout(io.StringIO()):  # its "stopped at step N" lines
            learner.run()
        jax.block_until_ready(learner._train)
        return steps / (time.perf_counter() - began)

    baseline(steps)  # warm-up: compiles both
    with contextlib.redirect_stdout(io.StringIO()):
        learner.run()
    rows = []
    for i in range(rounds):
        if i % 2:
            j = jaxdist_run(steps)
            rows.append((baseline(steps), j))
        else:
            rows.append((baseline(steps), jaxdist_run(steps)))
    learner.close()
    shutil.rmtree(learner.run_dir, ignore_errors=True)
    best_baseline, best_jaxdist = max(b for b, _ in rows), max(j for _, j in rows)
    return {"baseline": best_baseline, "jaxdist": best_jaxdist, "ratio": best_jaxdist / best_baseline,
            "median_ratio": statistics.median(j / b for b, j in rows)}


def apex_updates_per_second(args: argparse.Namespace) -> list[tuple[str, float, float]]:
    """Paired rounds of the bare Ape-X update loop and the learner sampling a replay node."""
    import jaxdist as jd
    from jaxdist.agents.apex import ApexConfig, learning
    from jaxdist.envs.spaces import env_info

    config, env = ApexConfig(), env_info("CartPole-v1")
    rng = np.random.default_rng(0)
    size = 20_000
    transitions = {"obs": rng.normal(size=(size, 4)).astype(np.float32),
                   "action": rng.integers(0, 2, size).astype(np.int32),
                   "reward": rng.normal(size=size).astype(np.float32), "discount": np.full(size, 0.95, np.float32),
                   "next_obs": rng.normal(size=(size, 4)).astype(np.float32)}
    rows = replay_fed_updates_per_second(
        learning.logic(config, env), jd.replay.Prioritized(size, config.priority_exponent, seed=0), transitions,
        config, args.apex_steps_per_call, args.apex_steps, args.rounds, priorities=rng.uniform(0.1, 2.0, size))
    return [(f"Ape-X updates/s, replay, steps_per_call {k}", bare, ours) for k, bare, ours in rows]


def replay_fed_updates_per_second(logic: Any, table: Any, transitions: dict[str, np.ndarray], config: Any,
                                  steps_per_call: list[int], steps: int, rounds: int,
                                  priorities: np.ndarray | None = None) -> list[tuple[int, float, float]]:
    """``(steps_per_call, bare updates/s, learner updates/s)``: paired rounds of ``logic``'s bare
    jitted update on samples drawn once (with ``priorities``, a prioritized table's: each
    update's new priorities fetched to the host, as writing them back needs) and of the
    learner whose source is a ``ReplayNode`` serving ``table`` (holding ``transitions``) as a
    thread of this process, for each ``steps_per_call``; ``config`` gives the batch size
    and the publishing and logging intervals."""
    import jax

    import jaxdist as jd
    from jaxdist import courier
    from jaxdist.nodes.learner import Learner, PublishOptions, ReplaySource
    from jaxdist.nodes.replay import PriorityWriter

    prioritized = priorities is not None
    batch = config.batch_size
    program = jd.Program("bench-replay")
    program.add_node(jd.ReplayNode(table), label="replay")
    running = jd.launch(program, launcher="threads", run_dir=tempfile.mkdtemp(prefix="jaxdist-bench-replay-"),
                        echo=False)
    try:
        replay = courier.Client(running.addresses["replay/0"], token=running.token)
        jd.replay.ReplayClient(replay).insert_batch(transitions, priorities=priorities)
        samples = [jd.replay.ReplayClient(replay).sample(batch) for _ in range(16)]
        samples = samples if prioritized else [sample["data"] for sample in samples]
        bare = jax.jit(logic.update, donate_argnums=0)
        state = logic.init(jax.random.key(0))
        key = jax.random.key(1)

        def baseline(count: int) -> float:
            nonlocal state
            began = time.perf_counter()
            for i in range(count):
                state, metrics = bare(state, samples[i % len(samples)], key)
                if prioritized:
                    np.asarray(metrics["priorities"])
            jax.block_until_ready(state)
            return count / (time.perf_counter() - began)

        learners = {}
        for k in steps_per_call:
            run_dir = tempfile.mkdtemp(prefix="jaxdist-bench-replay-learner-")
            learners[k] = Learner(logic, ReplaySource(replay, batch, field=None if prioritized else "data"),
                                  steps_per_call=k, max_steps=k,
                                  after_update=PriorityWriter(replay) if prioritized else None, prefetch=2,
                                  publishing=PublishOptions(every=config.publish_every_updates,
                                                            log_every=config.log_every_updates),
                                  run_dir=run_dir, name="learner")

        def jaxdist_run(learner: Any, count: int) -> float:
            learner._max_steps += count  # the benchmark's only reach inside: train `count` more
            began = time.perf_counter()
            with contextlib.redirect_stdout(io.StringIO()):
                learner.run()
            jax.block_until_ready(learner._train)
            return count / (time.perf_counter() - began)

        baseline(steps)  # warm-up: compiles each
        for learner in learners.values():
            with contextlib.redirect_stdout(io.StringIO()):
                learner.run()
        best = {"bare": 0.0, **{k: 0.0 for k in learners}}
        for _ in range(rounds):
            best["bare"] = max(best["bare"], baseline(steps))
            for k, learner in learners.items():
                best[k] = max(best[k], jaxdist_run(learner, steps))
        for learner in learners.values():
            learner.close()
    finally:
        running.stop()
    return [(k, best["bare"], best[k]) for k in learners]


def checkpoint_throughput(args: argparse.Namespace) -> list[tuple[str, float, float]]:
    import jax
    import jax.numpy as jnp
    import orbax.checkpoint as ocp

    from jaxdist.learning.checkpoint import Checkpointer

    n = args.ckpt_mb * 2 ** 20 // 4
    state = {"params": {f"w{i}": jnp.full((n // 4,), i, jnp.float32) for i in range(4)},
             "step": jnp.int32(0)}
    jax.block_until_ready(state)
    megabytes = sum(x.nbytes for x in jax.tree.leaves(state)) / 2 ** 20
    abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, state)
    root = tempfile.mkdtemp(prefix="jaxdist-bench-ckpt-")
    best = {key: float("inf") for key in ("bare save", "bare restore", "jd save", "jd restore")}
    try:
        for rep in range(args.ckpt_reps):
            path = os.path.join(root, f"bare-{rep}")
            bare = ocp.StandardCheckpointer()
            began = time.perf_counter()
            bare.save(path, state)
            bare.wait_until_finished()
            best["bare save"] = min(best["bare save"], time.perf_counter() - began)
            began = time.perf_counter()
            jax.block_until_ready(bare.restore(path, abstract))
            best["bare restore"] = min(best["bare restore"], time.perf_counter() - began)
            bare.close()

            ckpt = Checkpointer(os.path.join(root, f"jd-{rep}"), keep=1)
            began = time.perf_counter()
            ckpt.save(rep + 1, state)
            ckpt.wait()
            best["jd save"] = min(best["jd save"], time.perf_counter() - began)
            began = time.perf_counter()
            jax.block_until_ready(ckpt.restore(state))
            best["jd restore"] = min(best["jd restore"], time.perf_counter() - began)
            ckpt.close()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return [(f"checkpoint save MB/s ({megabytes:.0f} MB)", megabytes / best["bare save"],
             megabytes / best["jd save"]),
            (f"checkpoint restore MB/s ({megabytes:.0f} MB)", megabytes / best["bare restore"],
             megabytes / best["jd restore"])]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=500, help="steps per timed round")
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--steps-8", type=int, default=40, help="steps per round on 8 devices")
    ap.add_argument("--publish-every", type=int, default=100)
    ap.add_argument("--log-every", type=int, default=100)
    ap.add_argument("--apex-steps", type=int, default=800, help="Ape-X updates per timed round")
    ap.add_argument("--apex-steps-per-call", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--only-apex", action="store_true", help="measure only the Ape-X rows")
    ap.add_argument("--ckpt-mb", type=int, default=200)
    ap.add_argument("--ckpt-reps", type=int, default=5)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()

    if args.worker:  # the 8-device subprocess: one JSON line
        print(json.dumps(updates_per_second(args)), flush=True)
        return

    apex = [(name, base, ours, ours / base, ">= 0.80") for name, base, ours in apex_updates_per_second(args)]
    if args.only_apex:
        print_table(args, apex)
        return
    env = {**os.environ, "JAX_PLATFORMS": "cpu",
           "XLA_FLAGS": (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()}
    worker = [sys.executable, os.path.abspath(__file__), "--worker", "--steps", str(args.steps_8),
              "--rounds", str(args.rounds), "--publish-every", str(args.publish_every),
              "--log-every", str(args.log_every)]
    one = updates_per_second(args)
    out = subprocess.run(worker, env=env, capture_output=True, text=True, timeout=1200)
    if out.returncode:
        sys.exit(f"8-device worker failed:\n{out.stdout}\n{out.stderr}")
    eight = json.loads(out.stdout.strip().splitlines()[-1])
    assert eight["devices"] == 8, eight

    rows = [(f"updates/s, {r['devices']} device(s), batch {BATCH}", r["baseline"], r["jaxdist"], r["ratio"],
             f">= 0.95 (median of rounds {r['median_ratio']:.2f})") for r in (one, eight)]
    rows += apex
    rows += [(name, base, ours, ours / base, ">= 0.90") for name, base, ours in checkpoint_throughput(args)]
    print_table(args, rows)


def print_table(args: argparse.Namespace, rows: list[tuple]) -> None:
    print(f"MLP {FEATURES}-{HIDDEN}-{HIDDEN}-1, adam; publish every {args.publish_every}, "
          f"metrics every {args.log_every} steps; baseline checkpoint = Orbax StandardCheckpointer; "
          "Ape-X baseline = its jitted update with the priorities fetched every update")
    print(f"{'metric':42} {'baseline':>10} {'jaxdist':>10} {'ratio':>6}  target")
    for name, base, ours, ratio, target in rows:
        print(f"{name:42} {base:10.1f} {ours:10.1f} {ratio:6.2f}  {target}")


if __name__ == "__main__":
    main()
