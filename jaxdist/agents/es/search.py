"""The JAX side of ES, imported only where its nodes run (the launching process needs no JAX):
``Rollouts`` evaluates parameters (perturbed ones for workers, the mean policy for the
master) and ``Search`` is the master's state (mean parameters, optimizer state, generation,
env steps) with its update and its Orbax checkpoints.

Whole episodes for many parameter vectors run at once: one jitted ``lax.scan`` over the env's
``max_steps``, ``vmap``-ped over parameter vectors and over episodes. Episodes that end early
keep stepping, masked, so that every episode of the batch runs the same program."""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxdist.envs import jax_rollout
from jaxdist.agents import experiment
from jaxdist.agents.es import learning
from jaxdist.agents.es.policy import Policy
from jaxdist.learning.checkpoint import Checkpointer
from jaxdist.envs.jax_envs import JaxEnv, jax_env

if TYPE_CHECKING:
    from jaxdist.agents.es import ESConfig

TRAIN, EVAL = 0, 1  # the two streams of start states (learning.episode_keys' purpose)


@functools.partial(jax.jit, static_argnums=(0, 1))
def episodes(policy: Policy, dynamics: JaxEnv, params: jax.Array, keys: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Returns and lengths, both ``[P, E]``, of ``params[p]`` (``[P, D]``) in the episodes that
    start from ``reset(keys[e])``: every parameter vector meets the same start states."""
    return jax.vmap(lambda theta: jax_rollout.episodes(policy, dynamics, theta, keys, jax.random.key(0)))(params)


@functools.partial(jax.jit, static_argnums=(0, 1))
def antithetic_fitness(policy: Policy, dynamics: JaxEnv, theta: jax.Array, seeds: jax.Array, sigma: float,
                       keys: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Fitness ``[n, 2]`` of ``theta + sigma * eps_i`` and ``theta - sigma * eps_i`` (mean return
    over the episodes of ``keys``), ``eps_i`` regenerated from ``seeds[i]``; and env steps taken."""
    eps = learning.noise(seeds, theta.shape[0])
    params = jnp.concatenate([theta + sigma * eps, theta - sigma * eps])
    returns, lengths = episodes(policy, dynamics, params, keys)
    fitness = returns.mean(axis=1).reshape(2, -1).T
    return fitness, lengths.sum()


class Rollouts:
    """Episodes of the config's env and policy on the env's JAX port."""

    def __init__(self, config: ESConfig) -> None:
        self.config = config
        self.dynamics = jax_env(config.env_id)
        self.policy = Policy.for_env(self.dynamics, config.hidden)

    def antithetic(self, theta: Any, generation: int, seeds: Any) -> tuple[np.ndarray, int]:
        """Fitness ``[n, 2]`` of the generation's pairs of ``seeds`` around ``theta``, and env steps."""
        config = self.config
        keys = learning.episode_keys(config.seed, generation, config.episodes_per_member, TRAIN)
        fitness, steps = antithetic_fitness(self.policy, self.dynamics, jnp.asarray(theta),
                                            jnp.asarray(seeds, jnp.int32), config.sigma, keys)
        return np.asarray(fitness), int(steps)

    def evaluate(self, theta: jax.Array, generation: int) -> np.ndarray:
        """Returns of ``theta`` itself in ``eval_episodes`` episodes, from start states drawn
        afresh for each generation (never the training ones)."""
        keys = learning.episode_keys(self.config.seed, generation, self.config.eval_episodes, EVAL)
        returns, _ = episodes(self.policy, self.dynamics, theta[None], keys)
        return np.asarray(returns[0])


def initial_state(config: ESConfig, policy: Policy) -> dict[str, Any]:
    """What the master checkpoints, before the first generation: the mean parameters, the
    optimizer's state, the generation and the env steps (the template a checkpoint restores into)."""
    theta = policy.init(jax.random.key(config.seed))
    return {"theta": theta, "opt_state": _optimizer(config).init(theta), "generation": 0, "env_steps": 0}


def _optimizer(config: ESConfig) -> Any:
    return learning.optimizer(config.optimizer, config.learning_rate, config.weight_decay, config.momentum)


class Search:
    """Mean parameters and optimizer state, advanced one generation at a time; restored from
    ``checkpoint_directory`` when it holds a checkpoint (whose step is the generation)."""

    def __init__(self, config: ESConfig, policy: Policy, checkpoint_directory: str) -> None:
        self.config = config
        self._tx = _optimizer(config)
        self._checkpointer = Checkpointer(checkpoint_directory, save_every_steps=config.checkpoint_every_generations,
                                          keep=2)
        self.restored_generation = self._checkpointer.latest_step() or 0
        state = initial_state(config, policy)
        if self.restored_generation:
            state = self._checkpointer.restore(state)
        self.theta, self.opt_state = state["theta"], state["opt_state"]
        self.generation, self.env_steps = int(state["generation"]), int(state["env_steps"])

    def seeds(self) -> np.ndarray:
        return learning.generation_seeds(self.config.seed, self.generation, self.config.pairs)

    def step(self, seeds: np.ndarray, fitness: np.ndarray, env_steps: int) -> float:
        """Apply one generation's update; returns the norm of the ES gradient."""
        self.theta, self.opt_state, grad_norm = learning.update(
            self._tx, self.theta, self.opt_state, jnp.asarray(seeds), jnp.asarray(fitness), self.config.sigma)
        self.generation += 1
        self.env_steps += env_steps
        self._checkpointer.maybe_save(self.generation, self._state())
        return float(grad_norm)

    def save(self) -> None:
        """Save now (unless this generation is saved) and wait until it is on disk."""
        self._checkpointer.maybe_save(self.generation, self._state(), force=True)
        self._checkpointer.wait()

    def close(self) -> None:
        self._checkpointer.close()

    def _state(self) -> dict[str, Any]:
        return {"theta": self.theta, "opt_state": self.opt_state, "generation": self.generation,
                "env_steps": self.env_steps}


def trained(config: ESConfig, run_dir: str, directory: str, step: int | None) -> experiment.Policy:
    """The mean parameters the master saved in ``directory`` at generation ``step`` (default: the
    latest), played greedily by the flat-vector MLP (deterministic either way: ES explores in
    parameter space)."""
    rollouts = Rollouts(config)
    restored = experiment.restore_learner(run_dir, directory, initial_state(config, rollouts.policy), step,
                                          f"{config.checkpoint_every_generations} generations")
    policy: Any = rollouts.policy
    return experiment.Policy(restored["theta"], int(restored["generation"]), {True: policy, False: policy},
                             (rollouts.dynamics.obs_size,))
