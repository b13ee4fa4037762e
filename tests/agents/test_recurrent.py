"""Recurrent cores: the reset where an episode starts, the learner's unroll against the actors'
step-by-step acting (gymnasium and JAX backends), and the configs that take a core."""

from __future__ import annotations

import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxdist.envs  # noqa: F401 - registers CartPoleNoVel-v1
from jaxdist.agents import actor_critic, recurrent
from jaxdist.agents.ppo import PPOConfig
from jaxdist.envs.spaces import env_info
from jaxdist.envs.vector import EnvSpec
from jaxdist.nodes.actor import Actor
from jaxdist.nodes.parameter_server import ParameterServer
from waiting import wait_until

ENV = "CartPoleNoVel-v1"


def config(core: str = "lstm", **fields) -> PPOConfig:
    return PPOConfig(env_id=ENV, core=core, core_size=8, hidden=(8,), num_actors=1, envs_per_actor=4, **fields)


def published(cfg: PPOConfig, seed: int = 0):
    state = actor_critic.init(cfg, env_info(ENV), lambda c: actor_critic.clipped_adam(1e-3, 0.5, None),
                              jax.random.key(seed))
    return jax.tree.map(np.asarray, actor_critic.published(cfg, state))


@pytest.mark.parametrize("core", ["lstm", "gru"])
def test_a_row_that_begins_an_episode_starts_from_the_initial_state_whatever_came_before(core):
    cfg = config(core)
    net, params = actor_critic.network(cfg, env_info(ENV)), published(cfg)["network"]
    obs = jax.random.normal(jax.random.key(1), (2, 12, 4))
    first = jnp.zeros((2, 12), bool).at[:, 5].set(True)
    carry = jax.tree.map(lambda x: x + 3.0, recurrent.initial_carry(core, 8, 2))  # a state from long ago
    unroll = jax.jit(functools.partial(net.apply, method="unroll"))
    _, dist, value = unroll(params, carry, obs, first)
    fresh = recurrent.initial_carry(core, 8, 2)
    _, dist_after, value_after = unroll(params, fresh, obs[:, 5:], first[:, 5:])
    np.testing.assert_allclose(dist[:, 5:], dist_after, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(value[:, 5:], value_after, rtol=1e-5, atol=1e-6)
    _, dist_kept, _ = unroll(params, carry, obs, jnp.zeros((2, 12), bool))
    assert not np.allclose(dist_kept[:, 5:], dist[:, 5:], atol=1e-4)  # without the reset the past shows


def unrolled_logp(cfg: PPOConfig, params, item: dict) -> np.ndarray:
    """The learner's log-probabilities of an item's actions, unrolled from its start state."""
    batch = jax.tree.map(lambda x: jnp.asarray(x)[None], item)
    return np.asarray(_logp(cfg, params["network"], batch))[0]


@functools.partial(jax.jit, static_argnums=0)
def _logp(cfg: PPOConfig, params, batch: dict) -> jax.Array:
    dist, _ = actor_critic.apply(cfg, env_info(ENV), params, batch["obs"], batch)
    return actor_critic.log_prob(env_info(ENV).action, dist, batch["action"])


@pytest.mark.parametrize("backend", ["sync", "jax"])
def test_the_learners_unroll_from_a_trajectorys_start_state_equals_the_actors_step_by_step_acting(backend):
    cfg = config("lstm")
    params = published(cfg)
    sent: list = []
    policy = actor_critic.policy(cfg, env_info(ENV), 0)
    actor = Actor(policy, EnvSpec(ENV, 4, backend), ParameterServer(params), sent.extend, trajectory_length=24,
                  max_steps=4 * 24 * 4 + 4)
    try:
        actor.run()
        wait_until(lambda: len(sent) >= 12)
    finally:
        actor.close()
    starts = 0
    for item in sent:
        assert item["first"].shape == (25,) and jax.tree.leaves(item["core_state"])[0].shape == (8,)
        starts += int(item["first"][1:].sum())
        np.testing.assert_allclose(unrolled_logp(cfg, params, item), item["logp"], rtol=1e-4, atol=1e-5)
    assert starts >= 4  # random play ends episodes inside trajectories: the resets were exercised
    # Trajectories of one env follow on: the next starts from the state the actor fed its shared row.
    assert not np.allclose(jax.tree.leaves(sent[4]["core_state"])[0], 0.0)


def test_a_core_is_refused_by_name_where_it_cannot_be_carried():
    from jaxdist.agents.apex import ApexConfig

    with pytest.raises(ValueError, match="ApexConfig takes no recurrent core"):
        ApexConfig(core="lstm")
    with pytest.raises(ValueError, match="core must be 'none', 'lstm', 'gru' or 'package.module:function'; got 'rnn'"):
        PPOConfig(core="rnn")
    with pytest.raises(ValueError, match="minibatches split the trajectories: an update's 6 trajectories"):
        PPOConfig(core="gru", num_actors=1, envs_per_actor=6, minibatches=4, trajectory_length=32)


def test_a_custom_core_is_any_flax_cell_named_module_function():
    cfg = config("flax.linen:SimpleCell")
    with pytest.raises(TypeError, match="SimpleCell.__init__"):
        published(cfg)  # flax's SimpleCell needs its size: a factory must return a ready cell
    chex.assert_trees_all_equal_shapes(recurrent.initial_carry("tests.agents.test_recurrent:small_cell", 8, 3),
                                       jnp.zeros((3, 5)))


def small_cell():
    import flax.linen as nn

    return nn.SimpleCell(5)


# Learning to remember ---------------------------------------------------------------------------


def cue_batch(rng: np.random.Generator, trajectories: int = 8, episodes: int = 6, core: str = "gru", size: int = 8,
              pay: float = 0.0) -> dict:
    """Episodes of 3 rows: a cue (obs[0] = +-1) on the first, a blank observation on the second
    where the action counts, the reward on the third (1 where the action matched the cue), which
    terminates. Only a policy that remembers the cue beats a coin. ``pay`` is earned on every
    step besides (CartPole pays 1 a step: its returns run to tens)."""
    rows = 3 * episodes
    shape = (trajectories, rows)
    cue = rng.integers(0, 2, (trajectories, episodes))
    obs = np.zeros((*shape, 4), np.float32)
    obs[:, 0::3, 0] = 2.0 * cue - 1.0
    action = rng.integers(0, 2, shape).astype(np.int32)
    reward = np.zeros(shape, np.float32)
    reward[:, 2::3] = (action[:, 1::3] == cue).astype(np.float32)
    reward[:, 1::3] += pay
    reward[:, 2::3] += pay
    terminated = np.zeros(shape, bool)
    terminated[:, 2::3] = True
    first = np.zeros(shape, bool)
    first[:, 0::3] = True
    return {"obs": obs, "action": action, "reward": reward, "terminated": terminated, "truncated": np.zeros(shape, bool),
            "first": first, "logp": np.full(shape, np.log(0.5), np.float32), "version": np.zeros(shape, np.int32),
            "core_state": recurrent.initial_carry(core, size, trajectories), "cue": cue}


def remembered(cfg, params, batch: dict) -> float:
    """The policy's mean probability of the cued action on the blank rows."""
    dist, _ = actor_critic.apply(cfg, env_info(ENV), params, batch["obs"], batch)
    p_one = np.asarray(jax.nn.softmax(dist)[..., 1])[:, 1::3]
    return float(np.mean(np.where(batch["cue"] == 1, p_one, 1.0 - p_one)))


@pytest.mark.parametrize("agent", ["ppo", "impala"])
def test_the_update_unrolled_over_whole_trajectories_learns_to_remember_a_cue(agent):
    import importlib

    module = importlib.import_module(f"jaxdist.agents.{agent}")
    learning = importlib.import_module(f"jaxdist.agents.{agent}.learning")
    fields = dict(env_id=ENV, core="gru", core_size=8, hidden=(8,), learning_rate=1e-2, anneal_lr=False, gamma=0.9,
                  batch_trajectories=8, trajectory_length=17, num_actors=1, envs_per_actor=8)
    # Every batch is a coin's (logp log 0.5): PPO's clip would stop at pi/mu = 1.2, so it is wide.
    cfg = (module.PPOConfig(**fields, epochs=4, minibatches=4, clip_eps=10.0) if agent == "ppo"
           else module.IMPALAConfig(**fields, queue_trajectories=8, ent_coef=0.0))
    rng = np.random.default_rng(0)
    state = learning.logic(cfg, env_info(ENV)).init(jax.random.key(0))
    update = jax.jit(functools.partial(learning.update, cfg, env_info(ENV)))
    probe = cue_batch(rng)
    assert remembered(cfg, state["params"], probe) == pytest.approx(0.5, abs=0.02)
    for i in range(15 if agent == "ppo" else 40):
        batch = cue_batch(rng)
        del batch["cue"]
        state, _ = update(state, batch, jax.random.key(i))
    assert remembered(cfg, state["params"], probe) > 0.8


def test_impala_with_its_recurrent_preset_learns_to_remember_a_cue_on_returns_of_cartpoles_scale():
    """With a core the policy and value heads share the torso and the core. Weighed by
    baseline_cost 0.5, the value's gradient on returns of tens drove the core's outputs to +-1 and
    left the policy nothing: recurrent IMPALA's entropy stayed ln 2 for 1M env steps on
    CartPoleNoVel-v1; here the cue was still near a coin's (0.59) after 200 updates, where the
    preset's weight leaves the policy its share (0.74-0.99 over four seeds)."""
    from jaxdist.agents import impala
    from jaxdist.agents.impala import learning

    preset = impala.PRESETS[ENV]
    cfg = impala.IMPALAConfig(env_id=ENV, **preset, anneal_lr=False, ent_coef=0.0, batch_trajectories=8,
                              trajectory_length=17, queue_trajectories=8, num_actors=1, envs_per_actor=8)
    batch = functools.partial(cue_batch, core=cfg.core, size=cfg.core_size, pay=10.0)
    rng = np.random.default_rng(0)
    state = learning.logic(cfg, env_info(ENV)).init(jax.random.key(0))
    update = jax.jit(functools.partial(learning.update, cfg, env_info(ENV)))
    probe = batch(rng)
    for i in range(200):
        data = batch(rng)
        del data["cue"]
        state, _ = update(state, data, jax.random.key(i))
    assert remembered(cfg, state["params"], probe) > 0.7


# End to end ------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_recurrent_ppo_solves_cartpole_without_velocities_and_its_policy_plays_with_its_state(tmp_path):
    """The script under Anakin (the fastest here) to 475 on CartPoleNoVel-v1; the best policy,
    loaded, plays a batch of envs with a state each and scores what the run's evaluation did."""
    import json
    import os
    import subprocess
    import sys

    import gymnasium as gym

    from jaxdist.agents import load_policy

    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    command = [sys.executable, os.path.join(repo, "experiments", "ppo.py"), "--quiet", "--compilation-cache", "",
               "--env-id", ENV, "--architecture", "anakin", "--run-dir", str(tmp_path), "--stop-at-target"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["steps_to_target"] is not None and summary["steps_to_target"] <= 200_000, summary
    policy = load_policy(str(tmp_path), best=True)
    assert policy.recurrent
    envs = gym.make_vec(ENV, 8, vectorization_mode="sync", vector_kwargs={"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP})
    obs, _ = envs.reset(seed=123)
    state, first = policy.initial_state(8), np.ones(8, bool)
    totals, returns = np.zeros(8), []
    while len(returns) < 8:
        actions, state = policy.act(obs, state=state, first=first)
        obs, reward, terminated, truncated, _ = envs.step(actions)
        totals += reward
        first = terminated | truncated  # SAME_STEP: obs already begins the next episode
        returns.extend(totals[first].tolist())
        totals[first] = 0
    assert np.mean(returns) >= 0.9 * summary["best_return"], (returns, summary["best_return"])
    with pytest.raises(ValueError, match="this policy is recurrent: act"):
        policy.act(obs)
