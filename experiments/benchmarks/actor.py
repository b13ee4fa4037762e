"""Env steps/s of the jaxdist actor against hand-written loops with the same vector env and the
same jitted policy (target: the actor at >= 0.9x).

    python experiments/benchmarks/actor.py                       # vector, sync, async, jax x 8, 16, 64 envs
    python experiments/benchmarks/actor.py --backends vector jax --envs 16 --sink replay

Two hand-written loops, both calling PPO's policy (``ActorCriticPolicy``, jitted, the key split
inside the call) once per step on the raw gymnasium vector env:

- *bare*: the least a program can do per step: policy, action to the host, ``env.step``.
  Nothing is recorded; no learner could use it.
- *rollout*: what one writes by hand to collect PPO data (CleanRL style): the same, plus each
  step's observation, action, log-probability, reward and done flags written into preallocated
  ``(T, envs)`` buffers and running episode returns.

The actor does the rollout loop's work plus what makes it an actor: boundary flags, per-env
episode statistics, parameter versions and stop checks, and every ``--trajectory-length``
steps one item per env (its ``T + 1`` rows) handed to a sender thread. ``--sink none`` drops
the items once made; ``--sink replay`` sends each trajectory (one ``insert_batch``) to a
``ReplayNode`` in another process whose queue a consumer drains 8 items a call (the network
path too, on the same two cores).

With ``--backends jax`` (the actor's JAX env backend: policy and env play a whole trajectory
per jitted dispatch) the two loops are PureJaxRL-style instead, hand-written on the JAX port of
CartPole with the same policy: ``T`` steps of policy, env (``vmap``) and autoreset in one jitted
``lax.scan``, the rows stacked; *bare* keeps them on the device (blocking once per trial: the
limit of one process), *rollout* fetches each trajectory to the host (what an actor must do
before it can send it).

All three run the same env object in turn, ``--repeats`` trials each of about ``--seconds``,
the order rotating between trials; the table shows medians of wall-clock env steps/s and the
actor's ratio to each loop, and the same ratios from this process's CPU time (which other load
on a shared machine disturbs less).
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import sys
import time

import numpy as np

BACKENDS = ("vector", "sync", "async", "jax")


class _Prebuilt:
    """An env spec that hands out one already-built env (so loop and actor share it)."""

    def __init__(self, env) -> None:
        self.env = env

    def make(self, seed: int):
        return self.env


def _policy_and_params(num_actions: int = 2):
    """PPO's CartPole policy (64x64) and its published parameters, ``{"network": ...}``."""
    import jax

    from jaxdist.agents.actor_critic import ActorCritic
    from jaxdist.agents.actor_critic import ActorCriticPolicy
    from jaxdist.envs.spaces import ActionSpace, EnvInfo

    env = EnvInfo((4,), "float32", ActionSpace(num_actions=num_actions))
    params = ActorCritic(action=env.action).init(jax.random.key(0), np.zeros((1, 4), np.float32))
    return ActorCriticPolicy(env, "mlp", (64, 64)), {"network": jax.tree.map(np.asarray, params)}


def hand_loop(env, policy, params, steps: int) -> tuple[float, float]:
    """(wall s, CPU s) for `steps` steps of the bare loop."""
    import jax

    from jaxdist.nodes.actor import jitted_step

    step = jitted_step(policy, "unsafe_rbg")  # the actor's default sampling stream
    key = jax.random.key_data(jax.random.key(0, impl="unsafe_rbg"))
    params = jax.device_put(params)
    raw = env.env
    obs, _ = raw.reset(seed=0)
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(steps):
        key, action, _ = step(params, obs, key)
        obs, _, _, _, _ = raw.step(np.asarray(action))
    return time.perf_counter() - wall, time.process_time() - cpu


def rollout_loop(env, policy, params, steps: int, trajectory_length: int) -> tuple[float, float]:
    """The bare loop plus CleanRL-style recording into preallocated buffers."""
    import jax

    from jaxdist.nodes.actor import jitted_step

    step = jitted_step(policy, "unsafe_rbg")
    key = jax.random.key_data(jax.random.key(0, impl="unsafe_rbg"))
    params = jax.device_put(params)
    raw, n, T = env.env, env.num_envs, trajectory_length
    obs, _ = raw.reset(seed=0)
    buffers = {"obs": np.zeros((T, *obs.shape), obs.dtype), "action": np.zeros((T, n), np.int32),
               "logp": np.zeros((T, n), np.float32), "reward": np.zeros((T, n), np.float32),
               "terminated": np.zeros((T, n), bool), "truncated": np.zeros((T, n), bool)}
    episode_return, returns = np.zeros(n), []
    wall, cpu = time.perf_counter(), time.process_time()
    for i in range(steps):
        t = i % T
        key, action, extras = step(params, obs, key)
        action = np.asarray(action)
        buffers["obs"][t] = obs
        buffers["action"][t] = action
        buffers["logp"][t] = np.asarray(extras["logp"])
        obs, reward, terminated, truncated, _ = raw.step(action)
        buffers["reward"][t], buffers["terminated"][t], buffers["truncated"][t] = reward, terminated, truncated
        episode_return += reward
        done = terminated | truncated
        if done.any():
            returns.extend(episode_return[done].tolist())
            episode_return[done] = 0.0
    return time.perf_counter() - wall, time.process_time() - cpu


@functools.lru_cache(maxsize=None)  # one compile per configuration, not per trial
def _scan_trajectory(policy, num_envs: int, trajectory_length: int):
    """PureJaxRL's env loop on jaxdist's CartPole port: ``(params, carry) -> (carry, rows)``,
    rows ``(T, envs, ...)`` of obs, action, log-probability, reward and done, jitted."""
    import jax
    import jax.numpy as jnp

    from jaxdist.envs.jax_envs import jax_env

    env = jax_env("CartPole-v1")

    def step(params, carry, _):
        state, obs, key = carry
        key, act_key, reset_key = jax.random.split(key, 3)
        action, extras = policy(params, obs, act_key)
        out = jax.vmap(env.step)(state, action)
        done = out.terminated | out.truncated
        fresh_state, fresh_obs = jax.vmap(env.reset)(jax.random.split(reset_key, num_envs))
        pick = lambda fresh, stepped: jnp.where(done.reshape(done.shape + (1,) * (stepped.ndim - 1)), fresh, stepped)  # noqa: E731
        carry = (jax.tree.map(pick, fresh_state, out.state), pick(fresh_obs, out.obs), key)
        return carry, {"obs": obs, "action": action, "logp": extras["logp"], "reward": out.reward, "done": done}

    def trajectory(params, carry):
        return jax.lax.scan(lambda c, x: step(params, c, x), carry, None, length=trajectory_length)

    def start(key):
        state, obs = jax.vmap(env.reset)(jax.random.split(key, num_envs))
        return state, obs, key

    return jax.jit(trajectory), jax.jit(start)


def scan_loop(policy, params, num_envs: int, steps: int, trajectory_length: int, fetch: bool) -> tuple[float, float]:
    """(wall s, CPU s) for ``steps`` steps of every env by the PureJaxRL-style scan, each
    trajectory fetched to the host (``fetch``) or left on the device."""
    import jax

    trajectory, start = _scan_trajectory(policy, num_envs, trajectory_length)
    params = jax.device_put(params)
    carry = jax.block_until_ready(start(jax.random.key(0)))
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(steps // trajectory_length):
        carry, rows = trajectory(params, carry)
        if fetch:
            jax.device_get(rows)
    jax.block_until_ready(carry)
    return time.perf_counter() - wall, time.process_time() - cpu


def actor_loop(env, policy, params, steps: int, trajectory_length: int, sink) -> tuple[float, float]:
    from jaxdist.nodes.actor import Actor
    from jaxdist.nodes.parameter_server import ParameterServer

    actor = Actor(policy, _Prebuilt(env), ParameterServer(params, version=0), sink,
                  trajectory_length=trajectory_length, max_steps=steps * env.num_envs)
    actor._warm_up.join()  # reset and compile outside the timed part, as the loop's warm-up trial does
    try:
        wall, cpu = time.perf_counter(), time.process_time()
        actor.run()
        return time.perf_counter() - wall, time.process_time() - cpu
    finally:
        actor._variables.close()
        actor._sender.close()


def measure(backend: str, num_envs: int, args, sink) -> dict:
    if backend == "jax":
        return measure_jax(num_envs, args, sink)
    from jaxdist.envs.vector import EnvSpec

    policy, params = _policy_and_params()
    env = EnvSpec("CartPole-v1", num_envs, backend).make(seed=0)
    try:
        # Size a trial to about --seconds, from a warm-up trial of the loop (which also compiles).
        hand_loop(env, policy, params, 50)
        wall, _ = hand_loop(env, policy, params, 200)
        steps = max(100, int(args.seconds * 200 / wall))
        actor_loop(env, policy, params, min(steps, 500), args.trajectory_length, sink)  # warm-ups
        rollout_loop(env, policy, params, min(steps, 500), args.trajectory_length)
        runs: dict[str, list] = {"bare": [], "rollout": [], "actor": []}
        trials = {"bare": lambda: hand_loop(env, policy, params, steps),
                  "rollout": lambda: rollout_loop(env, policy, params, steps, args.trajectory_length),
                  "actor": lambda: actor_loop(env, policy, params, steps, args.trajectory_length, sink)}
        order = list(trials)
        for trial in range(args.repeats):  # rotate who goes first: the machine's load drifts
            for name in order[trial % 3:] + order[:trial % 3]:
                runs[name].append(trials[name]())
    finally:
        env.close()
    return _result(backend, num_envs, steps, runs)


def measure_jax(num_envs: int, args, sink) -> dict:
    """The JAX backend's actor against the PureJaxRL-style scan, on the device and fetched."""
    from jaxdist.envs.vector import EnvSpec

    policy, params = _policy_and_params()
    T = args.trajectory_length
    env = EnvSpec("CartPole-v1", num_envs, "jax").make(seed=0)
    # Size a trial to about --seconds, from a warm-up trial of the scan (which also compiles).
    scan_loop(policy, params, num_envs, 4 * T, T, fetch=True)
    wall, _ = scan_loop(policy, params, num_envs, 32 * T, T, fetch=True)
    steps = T * max(4, int(args.seconds * 32 / wall))
    scan_loop(policy, params, num_envs, 4 * T, T, fetch=False)
    actor_loop(env, policy, params, 4 * T, T, sink)  # warm-up
    runs: dict[str, list] = {"bare": [], "rollout": [], "actor": []}
    trials = {"bare": lambda: scan_loop(policy, params, num_envs, steps, T, fetch=False),
              "rollout": lambda: scan_loop(policy, params, num_envs, steps, T, fetch=True),
              "actor": lambda: actor_loop(env, policy, params, steps, T, sink)}
    order = list(trials)
    for trial in range(args.repeats):
        for name in order[trial % 3:] + order[:trial % 3]:
            runs[name].append(trials[name]())
    return _result("jax", num_envs, steps, runs)


def _result(backend: str, num_envs: int, steps: int, runs: dict[str, list]) -> dict:
    rate = lambda name, i: statistics.median(steps * num_envs / r[i] for r in runs[name])  # noqa: E731
    result = {"backend": backend, "envs": num_envs}
    for name in runs:
        result[name], result[f"{name}_cpu"] = rate(name, 0), rate(name, 1)
    for base in ("bare", "rollout"):
        result[f"vs_{base}"] = result["actor"] / result[base]
        result[f"vs_{base}_cpu"] = result["actor_cpu"] / result[f"{base}_cpu"]
    return result


DRAIN_BATCH = 8
"""Items the consumer takes per call, as a learner takes a batch (the fewest envs measured)."""


class _ReplaySink:
    """Items to a ReplayNode (a Fifo) in another process, drained there by a consumer node."""

    def __init__(self) -> None:
        import jaxdist as jd
        from jaxdist import courier

        program = jd.Program("actor-benchmark-replay")
        with program.group("replay"):
            queue = program.add_node(jd.ReplayNode(jd.replay.Fifo(max_size=256)))
        with program.group("drain"):
            program.add_node(jd.PyNode(_drain, queue))
        self.running = jd.launch(program, launcher="processes", echo=False,
                                 run_dir=os.path.join("runs", "actor-benchmark"))
        self.client = courier.Client(self.running.addresses["replay/0"], token=self.running.token)

    def close(self) -> None:
        self.running.stop()


def _drain(queue) -> None:
    import jaxdist as jd
    from jaxdist.nodes.replay import ReplayClient

    replay = ReplayClient(queue)
    while not jd.stop_requested():
        try:
            replay.sample(DRAIN_BATCH, timeout=0.5)
        except TimeoutError:
            pass


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backends", nargs="+", choices=BACKENDS, default=list(BACKENDS))
    parser.add_argument("--envs", nargs="+", type=int, default=[8, 16, 64])
    parser.add_argument("--seconds", type=float, default=0.5, help="length of one trial")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--trajectory-length", type=int, default=32)
    parser.add_argument("--sink", choices=["none", "replay"], default="none")
    args = parser.parse_args()
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    replay = _ReplaySink() if args.sink == "replay" else None
    rows = []
    try:
        print(f"CartPole-v1, PPO policy 64x64, T={args.trajectory_length}, sink={args.sink}, "
              f"{args.repeats} trials of ~{args.seconds} s each; env steps/s, medians", flush=True)
        header = (f"{'backend':8s} {'envs':>4s} {'bare loop':>10s} {'rollout':>10s} {'actor':>10s}  "
                  f"{'vs bare':>7s} {'vs rollout':>10s}   {'CPU: vs bare':>12s} {'vs rollout':>10s}")
        print(header, flush=True)
        for backend in args.backends:
            for num_envs in args.envs:
                sink = replay.client if replay else None
                r = measure(backend, num_envs, args, sink)
                rows.append(r)
                print(f"{backend:8s} {num_envs:4d} {r['bare']:10,.0f} {r['rollout']:10,.0f} {r['actor']:10,.0f}  "
                      f"{r['vs_bare']:7.2f} {r['vs_rollout']:10.2f}   {r['vs_bare_cpu']:12.2f} "
                      f"{r['vs_rollout_cpu']:10.2f}", flush=True)
    finally:
        if replay is not None:
            replay.close()
    for base in ("bare", "rollout"):
        print(f"actor / {base} loop (wall): min {min(r[f'vs_{base}'] for r in rows):.2f}, "
              f"median {statistics.median(r[f'vs_{base}'] for r in rows):.2f} (target >= 0.9)")

if __name__ == "__main__":
    sys.exit(main())
