"""Central batched inference against per-actor inference: env steps/s of N actors on the
processes launcher, each stepping its envs and dropping its trajectories, with the same policy and
fixed parameters, measured in the same run.

    python experiments/benchmarks/inference.py                      # CartPole, Breakout-MinAtar, Pong
    python experiments/benchmarks/inference.py --actors 1 2 4 8 16 --seconds 20 --tasks Pong-v5

* per-actor (the baseline): every actor runs the jitted policy on its own envs, every step;
* central: one inference node (``jaxdist.nodes.inference``) answers all actors' observations of
  a step with one policy call, and each actor waits a round trip per step.

Every process is placed as ``--inference central`` places it (``experiment.resources``): actors
on the CPU, the inference node on the GPU where the host has one.

Vector observations with a small MLP (CartPole-v1, gymnasium's ``sync`` envs), small images with
MinAtar's CNN (Breakout-MinAtar's 10x10 grids) and Atari's 4 stacked 84x84 frames with the Nature CNN
(Pong-v5 through EnvPool, when it is installed), at each ``--actors`` count: the table shows where
central inference starts to pay on this machine (the ratio > 1).
"""

from __future__ import annotations

import argparse
import datetime
import tempfile
import time

import jax
import numpy as np

import jaxdist as jd
from jaxdist import courier
from jaxdist.agents import experiment
from jaxdist.agents.actor_critic import ActorCritic, ActorCriticPolicy
from jaxdist.envs.spaces import env_info
from jaxdist.envs.vector import EnvSpec, envpool_installed
from jaxdist.nodes.actor import Actor
from jaxdist.nodes.inference import InferenceServer
from jaxdist.nodes.parameter_server import ParameterServer
from results import add_commit_argument, commit, machine

TASKS = {"CartPole-v1": ("mlp", "sync"), "Breakout-MinAtar": ("cnn", "sync"), "Pong-v5": ("cnn", "envpool")}
"""env id -> (torso, env backend)"""


def policy_and_params(env_id: str, network: str) -> tuple[ActorCriticPolicy, dict]:
    info = env_info(env_id)
    net = ActorCritic(action=info.action, network=network, hidden=(64, 64), channels_first=info.channels_first)
    params = net.init(jax.random.key(0), np.zeros((1, *info.obs_shape), info.obs_dtype))
    return ActorCriticPolicy(info, network, (64, 64)), {"network": jax.tree.map(np.asarray, params)}


def steps_per_second(env_id: str, actors: int, envs: int, central: bool, seconds: float) -> float:
    """All actors' env steps/s over ``seconds``, once every actor is acting."""
    network, backend = TASKS[env_id]
    policy, params = policy_and_params(env_id, network)
    program = jd.Program("inference-benchmark")
    source = program.add_node(jd.CourierNode(ParameterServer, params, version=0), label="params")
    inference = program.add_node(jd.CourierNode(InferenceServer, policy, source, max_callers=actors),
                                 label="inference") if central else None
    with program.group("actor"):
        for index in range(actors):
            program.add_node(jd.CourierNode(Actor, None if central else policy, EnvSpec(env_id, envs, backend),
                                            None if central else source, None, seed=index, inference=inference))
    with tempfile.TemporaryDirectory() as run_dir:
        running = jd.launch(program, launcher="processes", run_dir=run_dir, echo=False,
                            resources=experiment.resources(program))
        try:
            clients = [courier.Client(running.addresses[f"actor/{i}"], token=running.token) for i in range(actors)]
            total = lambda: sum(client.stats()["env_steps"] for client in clients)  # noqa: E731
            while not all(client.stats()["env_steps"] > 0 for client in clients):
                time.sleep(0.2)
            start, steps = time.monotonic(), total()
            time.sleep(seconds)
            return (total() - steps) / (time.monotonic() - start)
        finally:
            running.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--actors", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--envs", type=int, default=8, help="envs per actor")
    ap.add_argument("--seconds", type=float, default=10.0, help="measured seconds per setting")
    ap.add_argument("--tasks", nargs="+", choices=list(TASKS),
                    default=[env_id for env_id, (_, backend) in TASKS.items() if backend != "envpool" or envpool_installed()])
    add_commit_argument(ap)
    args = ap.parse_args()
    print(f"experiments/benchmarks/inference.py --actors {' '.join(map(str, args.actors))} --envs {args.envs} "
          f"--seconds {args.seconds:g} at commit `{commit(args.commit)}` on {datetime.date.today()} ({machine()})\n")
    print("| env (torso) | actors x envs | per-actor env steps/s | central env steps/s | central / per-actor |")
    print("| --- | --- | ---: | ---: | ---: |")
    for env_id in args.tasks:
        for actors in args.actors:
            own, central = (steps_per_second(env_id, actors, args.envs, mode, args.seconds)
                            for mode in (False, True))
            print(f"| {env_id} ({TASKS[env_id][0]}) | {actors} x {args.envs} | {own:,.0f} | {central:,.0f} | "
                  f"{central / own:.2f}x |", flush=True)


if __name__ == "__main__":
    main()
