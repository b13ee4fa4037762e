"""Acting with a trained policy: ``load_policy(run_dir)`` rebuilds an agent from the config saved
in its run directory and restores the latest learner checkpoint, outside any program.

    policy = jaxdist.agents.load_policy("runs/ppo-cartpole-seed0")
    actions = policy.act(observations)            # a batch in, a batch out (deterministic)
"""

from __future__ import annotations

import importlib
import os
from typing import Any

import numpy as np

from jaxdist.agents import config as configs
from jaxdist.agents import distributed

AGENTS = {"ppo": ("jaxdist.agents.ppo", "PPOConfig"), "impala": ("jaxdist.agents.impala", "IMPALAConfig"),
          "apex": ("jaxdist.agents.apex", "ApexConfig")}
"""Agent name (as saved in ``config.json``) -> (its package, its config class)."""


class TrainedPolicy:
    """A trained agent's policy at one checkpoint: ``act(observations)`` for a batch of
    observations (``(N, *obs_shape)``) returns ``N`` actions; ``deterministic=False`` samples
    (or explores) as actor 0 did."""

    def __init__(self, agent: Any, params: Any, step: int, seed: int = 0) -> None:
        import jax

        from jaxdist.nodes.actor import jitted_step

        self.agent, self.config, self.step = agent, agent.config, step
        self._params = jax.device_put(params)
        self._steps = {True: jitted_step(agent.policy(agent.config, agent.env, None)),
                       False: jitted_step(agent.policy(agent.config, agent.env, 0))}
        self._key = jax.random.key_data(jax.random.key(seed))

    @property
    def env_id(self) -> str:
        return self.config.env_id

    def act(self, observations: Any, deterministic: bool = True) -> np.ndarray:
        observations = np.asarray(observations)
        if observations.shape[1:] != tuple(self.agent.env.obs_shape):
            raise ValueError(f"act() takes a batch of observations shaped (N, {', '.join(map(str, self.agent.env.obs_shape))})"
                             f" for {self.env_id}; got {observations.shape} (add a leading axis for one observation)")
        self._key, action, _ = self._steps[deterministic](self._params, observations, self._key)
        return np.asarray(action)


def load_policy(run_dir: str, step: int | None = None, seed: int = 0, run_seed: int = 0) -> TrainedPolicy:
    """The policy of the run in ``run_dir``: its saved config, its learner's latest checkpoint
    (or ``step``); of a run of several seeds at once (``num_seeds``), seed ``run_seed``'s.
    ``seed`` seeds the sampling of ``act(..., deterministic=False)``."""
    import jax
    import jax.numpy as jnp

    from jaxdist.checkpoint import Checkpointer

    name, saved = configs.load(run_dir)
    if name not in AGENTS:
        raise ValueError(f"{run_dir} was trained by agent {name!r}; load_policy knows {', '.join(AGENTS)}")
    package, config_class = AGENTS[name]
    module = importlib.import_module(package)
    agent = module.agent(configs.from_dict(getattr(module, config_class), saved))
    anakin = agent.config.architecture == "anakin"
    seeds = agent.config.num_seeds
    if not 0 <= run_seed < seeds:
        raise ValueError(f"{run_dir} trained {seeds} seed(s) at once (num_seeds): run_seed must be "
                         f"{'0' if seeds == 1 else f'0 to {seeds - 1}'}, got {run_seed}")
    logic = distributed.anakin_logic(agent) if anakin else agent.learner_logic(agent.config, agent.env)
    template = {"state": logic.init(jax.random.key(0)), "step": jnp.zeros((), jnp.int32)}
    no_checkpoint = FileNotFoundError(f"{run_dir} has no complete learner checkpoint yet: train longer (the learner "
                                      f"saves every {agent.config.checkpoint_every_updates} updates and at a stop)")
    directory = _learner_checkpoints(run_dir, agent)
    if not os.path.isdir(directory):  # a Checkpointer would create it: reading a run must not change it
        raise no_checkpoint
    with Checkpointer(directory) as checkpointer:
        if checkpointer.latest_step() is None:
            raise no_checkpoint
        restored = checkpointer.restore(template, step)
    params = logic.params(restored["state"])
    if anakin:  # its parameters carry a leading seed axis
        params = jax.tree.map(lambda leaf: leaf[run_seed], params)
    return TrainedPolicy(agent, params, int(restored["step"]), seed)


def _learner_checkpoints(run_dir: str, agent: Any) -> str:
    """Where the learner saved: its node's directory, or, for a learner spanning hosts, its
    group's (shared by all its processes)."""
    from jaxdist.checkpoint import checkpoint_dir

    node = agent.topology().learner.node_name
    single = checkpoint_dir(run_dir, node)
    return single if os.path.isdir(single) else checkpoint_dir(run_dir, node.split("/")[0])
