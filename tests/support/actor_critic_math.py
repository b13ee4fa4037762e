"""NumPy references and batches shared by the actor-critic agents' math tests (PPO, IMPALA):
the networks' forward pass in float64, normalisation's running moments, Pendulum-like rows,
and the checks every such update must pass whatever its loss."""

from __future__ import annotations

from collections.abc import Callable

import chex
import jax
import jax.numpy as jnp
import numpy as np
from eight_devices import flat_tree

from jaxdist.learning import parallel
from jaxdist.agents import actor_critic
from jaxdist.envs.spaces import ActionSpace, EnvInfo

CARTPOLE = EnvInfo((4,), "float32", ActionSpace(num_actions=2))
PENDULUM = EnvInfo((3,), "float32", ActionSpace(shape=(1,), low=(-2.0,), high=(2.0,)))


def mlp_reference(torso: dict, head: dict, x: np.ndarray) -> np.ndarray:
    """tanh(x W + b) per layer of the torso (Dense_0, Dense_1, ...), then the linear head."""
    dense = lambda layer, x: x @ np.asarray(layer["kernel"], np.float64) + np.asarray(layer["bias"], np.float64)  # noqa: E731
    for name in sorted(torso):
        x = np.tanh(dense(torso[name], x))
    return dense(head, x)


def moments(samples: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """NumPy mean and variance of ``samples`` (rows) plus the initial statistics' prior: weight
    1e-4 at mean 0 and variance 1 (negligible, except against a mean of 300 over a few hundred rows)."""
    samples = samples.astype(np.float64)
    n, prior = len(samples), 1e-4
    mean = samples.sum(0) / (n + prior)
    var = (((samples - mean) ** 2).sum(0) + prior * (1.0 + mean ** 2)) / (n + prior)
    return mean, var


def prob_of_action_one(config, params, obs) -> float:
    """The mean probability of action 1 of CartPole's two, over the observations `obs`."""
    logits = actor_critic.network(config, CARTPOLE).apply(params, obs, method="policy")
    return float(jnp.mean(jax.nn.softmax(logits)[:, 1]))


def pendulum_batch(rng: np.random.Generator, trajectories: int, rows: int) -> dict:
    """Pendulum-like rows: observations far from mean 0 / variance 1, raw (unclipped) Gaussian
    actions, rewards in [-16, 0], one truncated episode (then a reset row); no ``logp`` yet."""
    shape = (trajectories, rows)
    truncated = np.zeros(shape, bool)
    truncated[1, 10] = True
    reward = (-16 * rng.random(shape)).astype(np.float32)
    reward[1, 11] = 0.0
    obs = rng.normal(size=(*shape, 3)) * np.array([0.5, 2.0, 4.0]) + np.array([1.0, -1.0, 3.0])
    return {"obs": obs.astype(np.float32), "action": (1.5 * rng.normal(size=(*shape, 1))).astype(np.float32),
            "reward": reward, "terminated": np.zeros(shape, bool), "truncated": truncated,
            "version": np.zeros(shape, np.int32)}


def acting_logp(config, state: dict, batch: dict, normalize: bool = True) -> np.ndarray:
    """``log mu(a|x)`` of the learner's current policy acting as an actor does: on observations
    normalised with the statistics published with the parameters (those before the batch)."""
    obs = actor_critic.normalize(state["obs_norm"], batch["obs"]) if normalize else batch["obs"]
    dist = actor_critic.network(config, PENDULUM).apply(state["params"], obs, method="policy")
    return np.asarray(actor_critic.log_prob(PENDULUM.action, dist, batch["action"]))


def assert_data_parallel_matches_jit(update: Callable, state: dict, batch: dict) -> None:
    """The update through ``parallel.data_parallel`` gives jit's parameters and loss."""
    step = parallel.data_parallel(update)
    sharded_state, metrics = step(step.replicate(state), step.shard_batch(batch), jax.random.key(1))
    reference, expected = jax.jit(update)(state, batch, jax.random.key(1))
    chex.assert_trees_all_close(sharded_state["params"], reference["params"], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(float(metrics["loss"]), float(expected["loss"]), rtol=1e-5)


def assert_moved_and_merged_statistics(state: dict, new_state: dict, seen: list[np.ndarray]) -> None:
    """After a continuous update: every parameter moved, the observation statistics are those of
    every row `seen` so far, and rewards were scaled (the return statistics grew)."""
    for name, (old, new) in zip(flat_tree(state["params"]), zip(jax.tree.leaves(state["params"]),
                                                                jax.tree.leaves(new_state["params"]))):
        assert not np.array_equal(old, new), f"{name} did not move"
    rows = np.concatenate(seen)
    mean, var = moments(rows)
    np.testing.assert_allclose(new_state["obs_norm"].mean, mean, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(new_state["obs_norm"].var, var, rtol=1e-5)
    np.testing.assert_allclose(new_state["obs_norm"].count, len(rows) + 1e-4, rtol=1e-6)
    assert float(new_state["return_norm"].count) > float(state["return_norm"].count) + 1

