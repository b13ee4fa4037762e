"""Learner recovery after a SIGKILL: time to the first update after the restore, and steps lost.

    python experiments/benchmarks/recovery.py [--kills 3] [--save-every 100] [--step-delay 0.01]

One learner node (an MLP regression, adam; batches made in its process, paced by
``--step-delay`` so that steps are a measure of lost work) runs under the processes launcher,
checkpointing every ``--save-every`` steps (Orbax, async). The benchmark SIGKILLs it
``--kills`` times, each at a random point of a checkpoint interval; the supervisor restarts it
at once (``jd.Restart(backoff=0)``) and it restores its latest checkpoint. Measured for each kill:

* kill -> serving: until the restarted node answers ``status()`` (process start, imports,
  building the state, Orbax restore);
* serving -> first update: until its step passes the restored step (compiling the update,
  unless JAX's persistent compilation cache already holds it, and running it);
* steps lost: the step read just before the kill minus the restored step (so at least what was
  lost).

Twice: with JAX's persistent compilation cache off, and on (``JAX_COMPILATION_CACHE_DIR`` in the
learner group's environment, with ``JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=0`` so that
every compilation is stored, however quick), each against a baseline measured in the same run:
the cold start of a fresh launch (launch -> first update; median of ``--cold-starts`` with the
cache off; with it on, the launch that fills the cache, then fresh launches that find it
filled). Restart figures are medians over the kills. A first, untimed launch warms the OS file
cache. On a shared 2-core machine single runs vary by a second or more: read the medians.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import os
import random
import shutil
import signal
import statistics
import sys
import tempfile
import time

import numpy as np

import jaxdist as jd
from jaxdist import courier
from results import commit, machine

FEATURES, HIDDEN = 32, 256
NODE = "learner/0"


# --- The learner's model: module-level, so it pickles into the node's process --------------------

def _tx():
    import optax

    return optax.adam(1e-3)


def init(rng):
    import jax
    import jax.numpy as jnp

    keys = jax.random.split(rng, 3)
    params = {"w1": jax.random.normal(keys[0], (FEATURES, HIDDEN)) / FEATURES ** 0.5, "b1": jnp.zeros(HIDDEN),
              "w2": jax.random.normal(keys[1], (HIDDEN, HIDDEN)) / HIDDEN ** 0.5, "b2": jnp.zeros(HIDDEN),
              "w3": jax.random.normal(keys[2], (HIDDEN, 1)) / HIDDEN ** 0.5, "b3": jnp.zeros(1)}
    return {"params": params, "opt": _tx().init(params)}


def update(state, batch, rng):
    import jax
    import jax.numpy as jnp
    import optax

    def loss_fn(params):
        h = jnp.tanh(batch["x"] @ params["w1"] + params["b1"])
        h = jnp.tanh(h @ params["w2"] + params["b2"])
        return jnp.mean(((h @ params["w3"] + params["b3"])[:, 0] - batch["y"]) ** 2)

    loss, grads = jax.value_and_grad(loss_fn)(state["params"])
    updates, opt = _tx().update(grads, state["opt"], state["params"])
    return {"params": optax.apply_updates(state["params"], updates), "opt": opt}, {"loss": loss}


@dataclasses.dataclass
class Batches:
    """Cycles through a few fixed batches, sleeping `delay` s per batch to pace the learner."""

    batch_size: int
    delay: float

    def __post_init__(self) -> None:
        rng = np.random.default_rng(0)
        x = rng.normal(size=(8, self.batch_size, FEATURES)).astype(np.float32)
        self._batches = [{"x": x[i], "y": np.sin(x[i].sum(-1)).astype(np.float32)} for i in range(8)]
        self._index = 0

    def __call__(self) -> dict:
        if self.delay:
            time.sleep(self.delay)
        self._index += 1
        return self._batches[self._index % len(self._batches)]


# --- Measuring ------------------------------------------------------------------------------------

@dataclasses.dataclass
class Recovery:
    serving: float  # s from the kill (or the launch) until status() answers
    first_update: float  # s from the kill (or the launch) until the step passes the restored one
    restored_step: int | None
    step_before: int | None = None  # read just before the kill

    @property
    def lost(self) -> int | None:
        return None if self.step_before is None else self.step_before - (self.restored_step or 0)


def observe(address: str, token: str, since: float) -> tuple[courier.Client, Recovery]:
    """Polls a (re)starting learner: when it first answers, and when its step first passes the
    restored step. A fresh channel per attempt and no waiting for readiness, so a restarted
    server is seen at once rather than after gRPC's reconnect backoff."""
    while True:
        client = courier.Client(address, token=token, timeout=120, wait_for_ready=False)
        try:
            status = client.status()  # a bound server still being constructed holds the call
            break
        except courier.UnavailableError:
            client.close()
            time.sleep(0.005)
    serving = time.monotonic() - since
    restored = status["restored_step"]
    while status["step"] <= (restored or 0):
        time.sleep(0.002)
        status = client.status()
    return client, Recovery(serving, time.monotonic() - since, restored)


def wait_for_step(client: courier.Client, step: int, timeout: float = 120) -> int:
    deadline = time.monotonic() + timeout
    while (now := client.status()["step"]) < step:
        if time.monotonic() > deadline:
            raise TimeoutError(f"the learner is at step {now}, waited for {step}")
        time.sleep(0.01)
    return now


def make_program(args: argparse.Namespace) -> jd.Program:
    from jaxdist.nodes.learner import CheckpointOptions, Learner, LearnerLogic, PublishOptions

    program = jd.Program("recovery")
    with program.group("learner"):
        program.add_node(jd.CourierNode(
            Learner, LearnerLogic(init=init, update=update), Batches(args.batch, args.step_delay),
            checkpointing=CheckpointOptions(save_every_steps=args.save_every, keep=2, async_save=True),
            publishing=PublishOptions(every=None, log_every=None, metrics=None)))
    return program


def cache_env(cache_dir: str | None) -> dict[str, str]:
    """The learner group's environment: JAX's persistent compilation cache on (in `cache_dir`) or off.

    The names are JAX's own flags upper-cased (jax/_src/config.py reads JAX_<FLAG> at import):
    jax_compilation_cache_dir, jax_persistent_cache_min_compile_time_secs (default 1 s, which
    would skip the small compilations that add up at start), jax_enable_compilation_cache.
    """
    env = {"JAX_PLATFORMS": "cpu"}
    if cache_dir is None:
        env["JAX_ENABLE_COMPILATION_CACHE"] = "false"
    else:
        env.update(JAX_ENABLE_COMPILATION_CACHE="true", JAX_COMPILATION_CACHE_DIR=cache_dir,
                   JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0", JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0")
    return env


def cold_start(args: argparse.Namespace, run_dir: str,
               env: dict[str, str]) -> tuple[jd.Running, courier.Client, Recovery]:
    began = time.monotonic()
    running = jd.launch(make_program(args), launcher="processes", run_dir=run_dir, echo=args.echo,
                        resources={"learner": {"env": env}},
                        restart={"learner": jd.Restart(max_restarts=args.kills + 1, backoff=0.0)})
    client, recovery = observe(running.addresses[NODE], running.token, began)
    return running, client, recovery


def kill_and_recover(args: argparse.Namespace, running: jd.Running, client: courier.Client,
                     rng: random.Random) -> tuple[courier.Client, Recovery]:
    status = client.status()
    base = status["restored_step"] or 0
    # Past one checkpoint of this run, then to a random point of the next interval.
    target = (max(status["step"], base) // args.save_every + 1) * args.save_every
    wait_for_step(client, target + int(rng.uniform(0.05, 0.95) * args.save_every))
    pid = running.status()[NODE]["pid"]
    step_before = client.status()["step"]
    killed = time.monotonic()
    os.kill(pid, signal.SIGKILL)
    client.close()
    client, recovery = observe(running.addresses[NODE], running.token, killed)
    recovery.step_before = step_before
    return client, recovery


def run_config(args: argparse.Namespace, name: str, cache_dir: str | None, work: str,
               rng: random.Random) -> dict:
    """Cold starts and kills with the cache off (`cache_dir` None) or on.

    Cache off: ``--cold-starts`` fresh launches (the last one goes on to the kills). Cache on: the
    first fresh launch fills the cache and goes on to the kills; ``--cold-starts`` - 1 more fresh
    launches then show a cold start with the cache already filled.
    """
    env = cache_env(cache_dir)
    colds = []

    def launch_and_stop(tag: str) -> Recovery:
        running, client, recovery = cold_start(args, os.path.join(work, f"{name}-{tag}"), env)
        client.close()
        running.stop()
        return recovery

    if cache_dir is None:
        colds += [launch_and_stop(f"cold{i}") for i in range(args.cold_starts - 1)]
    running, client, cold = cold_start(args, os.path.join(work, name), env)
    colds.append(cold)
    kills = []
    try:
        for _ in range(args.kills):
            client, recovery = kill_and_recover(args, running, client, rng)
            kills.append(recovery)
            print(f"  {name}: kill at step {recovery.step_before}, restored {recovery.restored_step}, "
                  f"first update {recovery.first_update:.2f} s after the kill", flush=True)
        assert running.status()[NODE]["restarts"] == args.kills
    finally:
        client.close()
        running.stop()
    result = {"colds": colds, "kills": kills}
    if cache_dir is not None:
        result["warm_colds"] = [launch_and_stop(f"warm{i}") for i in range(max(1, args.cold_starts - 1))]
        result["cache_files"] = sum(len(files) for _, _, files in os.walk(cache_dir))
    return result


# --- Reporting ------------------------------------------------------------------------------------

def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def report(args: argparse.Namespace, results: dict[str, dict]) -> None:
    off, on = results["cache off"], results["cache on"]

    def med(recoveries: list[Recovery], field: str) -> float:
        return median([getattr(r, field) for r in recoveries])

    def serving_to_update(recoveries: list[Recovery]) -> float:
        return median([r.first_update - r.serving for r in recoveries])

    rows = [  # label, cache off, cache on
        ("cold start: launch -> serving (s)", med(off["colds"], "serving"), med(on["colds"], "serving")),
        ("cold start: launch -> first update (s)", med(off["colds"], "first_update"),
         med(on["colds"], "first_update")),
        ("restart: kill -> serving (s)", med(off["kills"], "serving"), med(on["kills"], "serving")),
        ("restart: serving -> first update (s)", serving_to_update(off["kills"]), serving_to_update(on["kills"])),
        ("restart: kill -> first update (s)", med(off["kills"], "first_update"), med(on["kills"], "first_update")),
    ]
    # Neither of these has a meaningful on/off ratio (lost steps depend on where each kill fell).
    derived = [("restart / cold start", rows[4][1] / rows[1][1], rows[4][2] / rows[1][2]),
               ("steps lost per crash", median([k.lost for k in off["kills"]]), median([k.lost for k in on["kills"]]))]
    print(f"\nexperiments/benchmarks/recovery.py --kills {args.kills} at commit `{commit()}` on {datetime.date.today()} "
          f"({machine()})")
    print(f"Learner recovery after SIGKILL: processes launcher, jd.Restart(backoff=0), 1 CPU device; MLP "
          f"{FEATURES}-{HIDDEN}-{HIDDEN}-1 adam, batch {args.batch}, a step every >= {args.step_delay * 1000:.0f} ms; "
          f"async checkpoint every {args.save_every} steps.\nMedians: restarts of {args.kills} kills; cold starts "
          f"of {len(off['colds'])} fresh launches (cache off) and the launch that filled the cache (cache on).\n")
    print(f"{'':42} {'cache off':>10} {'cache on':>10} {'on/off':>7}")
    for label, a, b in rows:
        print(f"{label:42} {a:10.2f} {b:10.2f} {b / a if a else float('nan'):7.2f}")
    for label, a, b in derived:
        print(f"{label:42} {a:10.2f} {b:10.2f}")
    warm = on["warm_colds"]
    warm_first = med(warm, "first_update")
    print(f"{'cold start, cache already filled (s)':42} {'':>10} {warm_first:10.2f} "
          f"{warm_first / rows[1][1]:7.2f}   (median of {len(warm)}; launch -> serving "
          f"{med(warm, 'serving'):.2f} s; {on['cache_files']} files in the cache)")
    print(f"{'restart / cold start with a filled cache':42} {'':>10} {rows[4][2] / warm_first:10.2f}")
    print(f"\nper run (s from the launch or the kill):\n{'':10} {'run':>10} {'step':>6} {'restored':>8} {'lost':>5} "
          f"{'->serving':>10} {'->update':>9} {'serving->update':>15}")
    for name, result in results.items():
        runs = [("cold", r) for r in result["colds"]] + [(f"kill {i}", k) for i, k in enumerate(result["kills"], 1)]
        runs += [("warm cold", r) for r in result.get("warm_colds", [])]
        for label, r in runs:
            step = "" if r.step_before is None else r.step_before
            restored = "" if r.restored_step is None else r.restored_step
            lost = "" if r.lost is None else r.lost
            print(f"{name:10} {label:>10} {step:>6} {restored:>8} {lost:>5} {r.serving:9.2f}s "
                  f"{r.first_update:8.2f}s {r.first_update - r.serving:14.2f}s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kills", type=int, default=3, help="SIGKILLs per configuration (median taken)")
    ap.add_argument("--save-every", type=int, default=100, help="checkpoint interval in steps")
    ap.add_argument("--step-delay", type=float, default=0.01, help="seconds the batch source sleeps per batch")
    ap.add_argument("--cold-starts", type=int, default=3, help="fresh launches timed per configuration")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--echo", action="store_true", help="show the learner's output")
    args = ap.parse_args()
    rng = random.Random(args.seed)
    work = tempfile.mkdtemp(prefix="jaxdist-recovery-")
    try:
        print("warming up (an untimed launch) ...", flush=True)
        running, client, _ = cold_start(args, os.path.join(work, "warmup"), cache_env(None))
        client.close()
        running.stop()
        results = {}
        results["cache off"] = run_config(args, "cache off", None, work, rng)
        results["cache on"] = run_config(args, "cache on", os.path.join(work, "jax-cache"), work, rng)
        report(args, results)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
