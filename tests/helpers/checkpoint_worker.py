"""A training loop that checkpoints, resumes, and saves on SIGTERM; driven by test_checkpoint.

Every step adds 1 to every parameter, so a restored state must hold w == step everywhere.
Prints one line per event, flushed: "fresh", "resumed <step> <w>", "stepped <step>" (after
this run's first step, once SIGTERM is handled), "saving <step>", "saved <step>", "preempted <step>", "done <step>".
With --coordinator it joins a jax.distributed group (then SIGTERM is JAX's to handle).
"""

import argparse
import time


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", required=True)
    ap.add_argument("--steps", type=int, default=10_000)
    ap.add_argument("--save-every", type=int, default=10)
    ap.add_argument("--sleep", type=float, default=0.01)
    ap.add_argument("--size", type=int, default=1000, help="float32 parameters")
    ap.add_argument("--sync", action="store_true", help="synchronous saves")
    ap.add_argument("--coordinator")
    ap.add_argument("--num-processes", type=int, default=1)
    ap.add_argument("--process-id", type=int, default=0)
    args = ap.parse_args()

    from jaxdist.learning import parallel
    if args.coordinator:
        parallel.initialize(args.coordinator, args.num_processes, args.process_id,
                            initialization_timeout=60, heartbeat_timeout_seconds=20)
    import jax
    import jax.numpy as jnp
    import optax
    from jax.sharding import NamedSharding, PartitionSpec

    from jaxdist.learning.checkpoint import Checkpointer

    tx = optax.adam(1e-3)
    replicated = NamedSharding(parallel.make_mesh(), PartitionSpec())

    @jax.jit(out_shardings=replicated)
    def init():
        params = {"w": jnp.zeros(args.size, jnp.float32)}
        return {"params": params, "opt": tx.init(params), "key": jax.random.key(0)}

    @jax.jit(out_shardings=replicated)
    def train_step(state):
        params = jax.tree.map(lambda w: w + 1, state["params"])
        return {"params": params, "opt": state["opt"], "key": jax.random.split(state["key"])[0]}

    state = init()
    ckpt = Checkpointer(args.dir, save_every_steps=args.save_every, async_save=not args.sync)
    start = ckpt.latest_step()
    if start is None:
        start = 0
        print("fresh", flush=True)
    else:
        state = ckpt.restore(state)
        print("resumed", start, float(state["params"]["w"][0]),
              float(state["params"]["w"][-1]), flush=True)
    for step in range(start + 1, args.steps + 1):
        state = train_step(state)
        if parallel.preemption_requested(step):
            print("preempted", step, flush=True)
            ckpt.save_and_exit(step, state)
        if step == start + 1:  # SIGTERM is handled from here on (the first check installs its handler)
            print("stepped", step, flush=True)
        if args.save_every and step % args.save_every == 0:
            print("saving", step, flush=True)
        if ckpt.maybe_save(step, state):
            print("saved", step, flush=True)
        time.sleep(args.sleep)
    ckpt.close()
    print("done", args.steps, flush=True)


if __name__ == "__main__":
    main()
