"""One replay agent's actor, as its topology builds it, stepping real envs into its real replay
node (threads launcher), and one learner update on a sample of what it inserted."""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

import jaxdist as jd
from jaxdist import courier
from jaxdist.agents.experiment import env_spec
from jaxdist.nodes.actor import Actor
from jaxdist.nodes.learner.feed import ReplaySource
from jaxdist.nodes.parameter_server import ParameterServer
from jaxdist.nodes.replay import ReplayClient, ReplayNode


def act_into_replay(agent: Any, run_dir: str, max_steps: int, learn: bool = True) -> dict[str, Any]:
    """Actor 0 of ``agent`` plays ``max_steps`` env steps of ``config.envs_per_actor`` envs into
    the agent's replay table; then one batch of the learner's is sampled (and, with ``learn``,
    one update run on it). ``{"stored", "sample", "state", "metrics"}``."""
    config = agent.config
    logic = agent.part("learner_logic", config, agent.env)
    state = logic.init(jax.random.key(0))
    params = jax.tree.map(np.asarray, logic.params(state))
    program = jd.Program(f"{agent.name}-replay")
    handle = program.add_node(ReplayNode(agent.part("replay_table", config)))
    running = jd.launch(program, launcher="threads", run_dir=run_dir, echo=False)
    try:
        replay = courier.Client(running.addresses[handle.node_name], token=running.token)
        actor = Actor(agent.part("policy", config, agent.env, 0), env_spec(config, config.envs_per_actor),
                      ParameterServer(params, version=1), agent.part("sink", config, replay),
                      trajectory_length=config.trajectory_length, max_steps=max_steps)
        try:
            actor.run()
        finally:
            actor.close()
        stored = ReplayClient(replay).size()
        sample = ReplaySource(replay, config.batch_size, field=None)()
    finally:
        running.stop()
    metrics = None
    if learn:
        state, metrics = jax.jit(logic.update)(state, sample, jax.random.key(1))
    return {"stored": stored, "sample": sample["data"], "state": state, "metrics": metrics}
