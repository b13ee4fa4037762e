"""Train a small MLP with jaxdist.learning.parallel and save the final parameters of every variant.

Run as a subprocess: it sets its own CPU device count before JAX starts. With --coordinator
it joins a jax.distributed group and feeds only its share of every global batch.
Writes <out>.<process index>.npz with "<variant>/<param>" and "<variant>/loss" entries, and what
a reference needs to train the same model: "init/<param>", "data/x" and "data/y" (global batches).
"""

import argparse
import os
import sys

import numpy as np

STEPS, GLOBAL_BATCH, FEATURES = 10, 64, 4
VARIANTS = {  # name: (mode, steps_per_call, noisy)
    "jit": ("jit", 1, False), "pmap": ("pmap", 1, False),
    "jit_scan": ("jit", 5, False), "pmap_scan": ("pmap", 5, False),
    "jit_noisy": ("jit", 1, True),
}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--devices", type=int, required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--coordinator")
    ap.add_argument("--num-processes", type=int, default=1)
    ap.add_argument("--process-id", type=int, default=0)
    ap.add_argument("--unblocked-calls", type=int, default=0)
    ap.add_argument("--ckpt-dir")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    args = ap.parse_args()

    import jax
    jax.config.update("jax_num_cpu_devices", args.devices)
    from jaxdist.learning import parallel
    if args.coordinator:
        init = dict(coordinator_address=args.coordinator, num_processes=args.num_processes,
                    process_id=args.process_id, initialization_timeout=60,
                    heartbeat_timeout_seconds=20)
        parallel.initialize(**init)
        parallel.initialize(**init)  # idempotent
        try:
            parallel.initialize(**{**init, "num_processes": 3})
            sys.exit("initialize with different arguments did not raise")
        except RuntimeError:
            pass
    import jax.numpy as jnp
    import optax

    assert jax.device_count() == args.devices * args.num_processes
    assert parallel.is_primary() == (args.process_id == 0)
    tx = optax.adam(1e-2)

    def mlp(params, x):
        h = jnp.tanh(x @ params["w1"] + params["b1"])
        return (h @ params["w2"] + params["b2"])[:, 0]

    def make_update(noisy):
        def update(state, batch, rng):
            x = batch["x"]
            if noisy:
                x = x + 0.1 * jax.random.normal(rng, x.shape)

            def loss_fn(params):
                return jnp.mean((mlp(params, x) - batch["y"]) ** 2)

            loss, grads = jax.value_and_grad(loss_fn)(state["params"])
            grads = parallel.pmean(grads)
            updates, opt = tx.update(grads, state["opt"], state["params"])
            params = optax.apply_updates(state["params"], updates)
            return {"params": params, "opt": opt, "step": state["step"] + 1}, {"loss": loss}
        return update

    data_rng = np.random.default_rng(0)
    xs = data_rng.normal(size=(STEPS, GLOBAL_BATCH, FEATURES)).astype(np.float32)
    ys = np.sin(xs.sum(-1)).astype(np.float32)
    share = GLOBAL_BATCH // args.num_processes
    rows = slice(args.process_id * share, (args.process_id + 1) * share)
    local = [{"x": xs[i, rows], "y": ys[i, rows]} for i in range(STEPS)]

    k1, k2 = jax.random.split(jax.random.key(42))
    params = {"w1": jax.random.normal(k1, (FEATURES, 32)) * 0.5, "b1": jnp.zeros(32),
              "w2": jax.random.normal(k2, (32, 1)) * 0.5, "b2": jnp.zeros(1)}
    init_state = {"params": params, "opt": tx.init(params), "step": jnp.int32(0)}

    mesh = parallel.make_mesh()
    results = {f"init/{key}": np.asarray(value) for key, value in params.items()}
    results.update({"data/x": xs, "data/y": ys})
    for name in args.variants.split(","):
        mode, k, noisy = VARIANTS[name]
        step = parallel.data_parallel(make_update(noisy), mesh=mesh, mode=mode, steps_per_call=k)
        state = step.replicate(init_state)
        batches = [jax.tree.map(lambda *b: np.stack(b), *local[i:i + k]) if k > 1 else local[i]
                   for i in range(0, STEPS, k)]
        rng = jax.random.key(7)
        for batch in step.prefetch(batches):
            rng, sub = jax.random.split(rng)
            state, metrics = step(state, batch, sub)
        final = jax.device_get(step.unreplicate(state))
        assert int(final["step"]) == STEPS, final["step"]
        for key, value in final["params"].items():
            results[f"{name}/{key}"] = np.asarray(value)
        results[f"{name}/loss"] = np.asarray(jax.device_get(metrics["loss"])).reshape(-1)[-1]
        if name == "jit" and args.ckpt_dir:
            check_checkpoint_roundtrip(args.ckpt_dir, state)

    if args.unblocked_calls:
        step = parallel.data_parallel(make_update(False), mesh=mesh)
        state, batch = step.replicate(init_state), step.shard_batch(local[0])
        for _ in range(args.unblocked_calls):  # no blocking here: the step must guard itself
            state, metrics = step(state, batch, jax.random.key(0))
        jax.block_until_ready(state)
    np.savez(f"{args.out}.{jax.process_index()}.npz", **results)
    print("ok", flush=True)


def check_checkpoint_roundtrip(directory, state):
    """Collective save of a replicated state; restore lands with the template's sharding."""
    import jax
    from jaxdist.learning.checkpoint import Checkpointer

    with Checkpointer(directory) as ckpt:
        ckpt.save(10, state)
        ckpt.wait()
        template = jax.tree.map(lambda x: x * 0, state)
        restored = ckpt.restore(template)
    for a, b in zip(jax.tree.leaves(state), jax.tree.leaves(restored)):
        assert a.sharding == b.sharding, (a.sharding, b.sharding)
        np.testing.assert_array_equal(np.asarray(a.addressable_data(0)),
                                      np.asarray(b.addressable_data(0)))


if __name__ == "__main__":
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    main()
