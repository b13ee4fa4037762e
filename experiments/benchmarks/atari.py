"""Atari frames/s through EnvPool: the jaxdist actor (IMPALA's CNN policy, trajectories made and
dropped) against EnvPool's bare loop and the same loop with the policy, in the same run.

    python experiments/benchmarks/atari.py [--env-id Pong-v5] [--envs 8 16 32] [--steps 400]

* envpool bare: EnvPool's own loop, random actions, nothing else (what EnvPool's figures count);
* envpool + policy: the bare loop choosing each step's actions with the jitted CNN policy;
* jaxdist actor: the actor node on the same envs and policy (rows recorded, trajectories made);
* jaxdist actor, central inference: the same actor asking an inference node
  (``jaxdist.nodes.inference``, its own process, as ``--inference central`` places it) for each
  step's actions, as SEED RL and Sebulba take the policy off the actor's cores.

Frames are env steps x 4 (EnvPool's frame skip), counted as the literature counts them. Each
count of envs per actor is one measurement: the central actor's round trip costs its core about
the same per step however many envs it carries, so more envs per actor spread it thinner. Per core:
frames per second of this process's CPU time (EnvPool's threads included), the figure that
decides how many actor cores a run needs; for the central row, the inference node's CPU per
frame is its own column (on a GPU it runs there, as ``--inference central`` places it; the
policy of the other rows runs on this process's CPU, as an actor's does).
"""

from __future__ import annotations

import argparse
import datetime
import tempfile
import time
from typing import Callable

import jax
import numpy as np
import psutil

import jaxdist as jd
from jaxdist import courier
from jaxdist.agents import experiment, impala
from jaxdist.agents.actor_critic import ActorCriticPolicy
from jaxdist.agents.experiment import with_preset
from jaxdist.envs.atari import FRAME_SKIP
from jaxdist.envs.vector import EnvSpec
from jaxdist.nodes.actor import Actor, jitted_step
from jaxdist.nodes.inference import InferenceServer
from jaxdist.nodes.parameter_server import ParameterServer
from results import add_commit_argument, commit, machine


def timed(loop: Callable[[], None]) -> tuple[float, float]:
    wall, cpu = time.perf_counter(), time.process_time()
    loop()
    return time.perf_counter() - wall, time.process_time() - cpu


def children_cpu() -> float:
    """CPU seconds of this process's children (the launched nodes), user and system."""
    total = 0.0
    for child in psutil.Process().children(recursive=True):
        try:
            times = child.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += times.user + times.system
    return total


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--env-id", default="Pong-v5")
    ap.add_argument("--envs", type=int, nargs="+", default=[8, 16, 32], help="envs per actor, one measurement each")
    ap.add_argument("--steps", type=int, default=400, help="steps of every env per measurement")
    add_commit_argument(ap)
    args = ap.parse_args()
    jax.config.update("jax_platforms", "cpu")
    config = with_preset(impala.IMPALAConfig, args.env_id, impala.PRESETS)
    agent = impala.agent(config)
    logic = agent.part("learner_logic", config, agent.env)
    params = jax.tree.map(np.asarray, logic.params(logic.init(jax.random.key(0))))
    policy = ActorCriticPolicy(agent.env, config.network, tuple(config.hidden))
    program = jd.Program("atari-central-inference")
    source = program.add_node(jd.CourierNode(ParameterServer, params, version=0), label="params")
    program.add_node(jd.CourierNode(InferenceServer, policy, source, max_callers=1), label="inference")
    with tempfile.TemporaryDirectory() as run_dir:
        running = jd.launch(program, launcher="processes", run_dir=run_dir, echo=False,
                            resources=experiment.resources(program))
        try:
            with courier.Client(running.addresses["inference/0"], token=running.token) as inference:
                tables = {envs: measure(args.env_id, envs, args.steps, config, policy, params, inference)
                          for envs in args.envs}
        finally:
            running.stop()
    print(f"experiments/benchmarks/atari.py --env-id {args.env_id} --envs {' '.join(map(str, args.envs))} --steps "
          f"{args.steps} at commit `{commit(args.commit)}` on {datetime.date.today()} ({machine()})\n")
    print("| envs | loop | frames/s | frames per actor CPU second | ratio to envpool bare (per CPU second) | "
          "inference node's frames per CPU second |")
    print("| ---: | --- | ---: | ---: | ---: | ---: |")
    for envs, rows in tables.items():
        frames, base_cpu = args.steps * envs * FRAME_SKIP, rows["envpool bare"][1]
        for name, (wall, cpu, *node_cpu) in rows.items():
            node = f"{frames / node_cpu[0]:,.0f}" if node_cpu else "-"
            print(f"| {envs} | {name} | {frames / wall:,.0f} | {frames / cpu:,.0f} | {base_cpu / cpu:.2f}x | {node} |")


def measure(env_id: str, num_envs: int, steps: int, config: impala.IMPALAConfig, policy: ActorCriticPolicy,
            params: dict, inference: courier.Client) -> dict[str, tuple[float, ...]]:
    """(wall s, CPU s[, the inference node's CPU s]) of each loop on ``num_envs`` envs; EnvPool's
    bare loop is timed before and after the others and counted at the mean of the two."""
    env = EnvSpec(env_id, num_envs, "envpool").make(seed=0)
    step = jitted_step(policy, "unsafe_rbg")
    device_params = jax.device_put(params)
    num_actions = policy.env.action.num_actions

    def bare() -> None:
        for action in np.random.default_rng(0).integers(0, num_actions, (steps, num_envs)):
            env.step(action)

    def with_policy() -> None:
        key, obs = jax.random.key_data(jax.random.key(0, impl="unsafe_rbg")), env.reset().obs
        for _ in range(steps):
            key, action, _ = step(device_params, obs, key)
            obs = env.step(np.asarray(action)).obs

    def actor(central: courier.Client | None = None) -> None:
        node = Actor(None if central else policy, _Prebuilt(env), None if central else ParameterServer(params, version=0),
                     None, trajectory_length=config.trajectory_length, max_steps=steps * num_envs, inference=central)
        try:
            node.run()
        finally:
            node.close()

    try:
        env.reset()
        with_policy()  # compiles the policy, warms EnvPool's threads
        actor(inference)  # compiles the node's policy for this many envs, warms the round trip
        before = timed(bare)
        rows = {"envpool + policy": timed(with_policy), "jaxdist actor": timed(actor)}
        nodes_cpu = children_cpu()
        rows["jaxdist actor, central inference"] = (*timed(lambda: actor(inference)), children_cpu() - nodes_cpu)
        after = timed(bare)
        return {"envpool bare": tuple((a + b) / 2 for a, b in zip(before, after)), **rows}
    finally:
        env.close()


class _Prebuilt:
    """An env spec that hands out the already-built env (the loops and the actor share it)."""

    def __init__(self, env) -> None:
        self.env = env

    def make(self, seed: int):
        return self.env


if __name__ == "__main__":
    main()
