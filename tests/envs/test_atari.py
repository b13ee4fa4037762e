"""Atari through EnvPool: its games' spaces channels-first, as EnvPool makes them, EnvPool's preprocessing for training
and whole games for evaluation, and real Atari envs stepped through an actor."""

from __future__ import annotations

import numpy as np
import pytest

from jaxdist.agents import apex, impala
from jaxdist.agents.actor_critic import ActorCriticPolicy
from jaxdist.agents.experiment import env_spec, with_preset
from jaxdist.agents.run import parse
from jaxdist.envs import atari
from jaxdist.envs.spaces import env_info
from jaxdist.envs.vector import EnvSpec, resolve_backend
from jaxdist.nodes.actor import Actor
from jaxdist.nodes.parameter_server import ParameterServer


def test_a_game_is_known_by_envpools_id_with_stacked_grayscale_frames_channels_first():
    assert atari.is_atari("Pong-v5") and not atari.is_atari("CartPole-v1") and not atari.is_atari("HalfCheetah-v5")
    info = env_info("Breakout-v5")
    assert info.obs_shape == (4, 84, 84) and info.channels_first
    assert info.obs_dtype == "uint8" and info.action.num_actions == 4
    assert resolve_backend("Pong-v5") == "envpool"
    with pytest.raises(ValueError, match="Pong-v5 is EnvPool's Atari game: use env backend 'envpool'"):
        resolve_backend("Pong-v5", "sync")


def test_actors_train_on_lives_and_clipped_rewards_and_the_evaluator_plays_whole_games():
    config = with_preset(impala.IMPALAConfig, "Pong-v5", impala.PRESETS)
    assert config.network == "cnn" and config.env_backend == "envpool"
    assert env_spec(config, 4).kwargs == {}  # TRAINING, added where EnvPool makes the envs
    assert env_spec(config, 4, evaluation=True).kwargs == atari.EVALUATION
    assert env_spec(impala.IMPALAConfig(), 4, evaluation=True).kwargs == {}


def test_an_evaluation_game_of_a_policy_that_never_presses_fire_ends_at_game_over_well_before_the_cap():
    """Whole games were EnvPool's without its life-by-life resets: after Breakout's first lost life
    nothing served the ball, and a policy that never pressed FIRE (trained on lives that EnvPool
    always served) sat until the 27,000-step cap."""
    config = with_preset(impala.IMPALAConfig, "Breakout-v5", impala.PRESETS)
    env = env_spec(config, 1, evaluation=True).make(seed=3)
    noop, steps = np.zeros(1, np.int64), 0
    try:
        step = env.reset()
        while not (step.terminated | step.truncated).any():
            step, steps = env.step(noop), steps + 1
    finally:
        env.close()
    assert step.terminated[0] and not step.truncated[0] and steps < 27_000 // 10, steps


def test_a_reset_in_the_middle_of_a_whole_game_begins_a_new_game():
    """Where a lost life ends no episode, EnvPool's own step after it begins the next life; a
    reset (the next evaluation's, or an episode the evaluate tool cut short) begins a new game."""
    env = atari.make("Breakout-v5", 1, seed=3, **atari.EVALUATION)
    noop = np.zeros(1, np.int64)
    try:
        _, info = env.reset()
        while info["lives"][0] == 5:
            *_, info = env.step(noop)
        _, info = env.reset()
    finally:
        env.close()
    assert info["lives"][0] == 5 and info["elapsed_step"][0] == 0


def _frames(spec, action: int, steps: int = 40) -> np.ndarray:
    """The observations of one env of ``spec`` pressing ``action`` from a seeded reset."""
    env = spec.make(seed=3)
    try:
        return np.stack([env.reset().obs] + [env.step(np.array([action])).obs for _ in range(steps)])
    finally:
        env.close()


def test_sticky_actions_set_on_the_command_line_reach_envpool_for_actors_and_evaluator():
    up, down = 2, 3  # Pong's paddle
    free = with_preset(impala.IMPALAConfig, "Pong-v5", impala.PRESETS)
    assert (_frames(env_spec(free, 1), up) != _frames(env_spec(free, 1), down)).any()
    stuck, _ = parse(impala.IMPALAConfig, impala.PRESETS, None, ["--env-id", "Pong-v5",
                                                                 "--repeat-action-probability", "1"])
    # Every frame repeats the previous action (the no-op of a reset): the agent's never reach the game.
    np.testing.assert_array_equal(_frames(env_spec(stuck, 1), up), _frames(env_spec(stuck, 1), down))
    assert env_spec(stuck, 4, evaluation=True).kwargs == {**atari.EVALUATION, "repeat_action_probability": 1.0}


@pytest.mark.parametrize("probability", [-0.25, 1.25])
def test_a_sticky_action_probability_outside_the_unit_interval_is_refused(probability):
    with pytest.raises(SystemExit, match=rf"repeat_action_probability must be in \[0, 1\], got {probability}"):
        parse(impala.IMPALAConfig, impala.PRESETS, None, ["--env-id", "Pong-v5", "--repeat-action-probability",
                                                          str(probability)])


def test_sticky_actions_are_refused_for_an_env_that_is_no_atari_game():
    with pytest.raises(ValueError, match="CartPole-v1 is not one of them: drop --repeat-action-probability"):
        impala.IMPALAConfig(env_id="CartPole-v1", repeat_action_probability=0.25)


def test_an_actor_steps_real_atari_envs_into_trajectories_of_frames():
    config = with_preset(impala.IMPALAConfig, "Pong-v5", impala.PRESETS)
    agent = impala.agent(config)
    import jax

    logic = agent.part("learner_logic", config, agent.env)
    params = jax.tree.map(np.asarray, logic.params(logic.init(jax.random.key(0))))
    sent: list = []
    actor = Actor(ActorCriticPolicy(agent.env, "cnn", (64, 64)), EnvSpec("Pong-v5", 2, "envpool"),
                  ParameterServer(params, version=1), sent.append, trajectory_length=16, max_steps=2 * 33)
    try:
        actor.run()
    finally:
        actor.close()
    assert len(sent) == 2 and len(sent[0]) == 2  # two trajectories of two envs
    item = sent[0][0]
    assert item["obs"].shape == (17, 4, 84, 84) and item["obs"].dtype == np.uint8
    assert item["obs"].max() > 0 and set(np.unique(item["reward"])) <= {-1.0, 0.0, 1.0}
    assert item["action"].shape == (17,) and 0 <= item["action"].min() and item["action"].max() < 6


@pytest.mark.slow
def test_apexs_actor_steps_real_atari_envs_and_inserts_their_n_step_transitions_into_its_replay(tmp_path):
    from replay_actors import act_into_replay

    config = with_preset(apex.ApexConfig, "Pong-v5", apex.PRESETS, envs_per_actor=2, trajectory_length=16,
                         batch_size=8, min_replay=16)
    assert (config.network, config.env_backend, config.n_step, config.total_steps * atari.FRAME_SKIP) == \
        ("cnn", "envpool", 3, 50_000_000)
    played = act_into_replay(apex.agent(config), str(tmp_path), max_steps=2 * 33, learn=False)
    assert 2 * 2 * 16 - 2 * 4 <= played["stored"] <= 2 * 2 * 16  # 2 trajectories of 2 envs, but not across lost lives
    sample = played["sample"]
    assert sample["obs"].shape == sample["next_obs"].shape == (8, 4, 84, 84) and sample["obs"].dtype == np.uint8
    assert sum(leaf[0].nbytes for leaf in sample.values()) == 56_460  # a transition's bytes, as the preset says
    assert ((0 <= sample["action"]) & (sample["action"] < 6)).all() and (np.abs(sample["reward"]) <= 3).all()
    full = sample["discount"] == np.float32(config.gamma ** 3)  # 3 steps ahead: the stack moved 3 frames on
    np.testing.assert_array_equal(sample["next_obs"][full][:, 0], sample["obs"][full][:, 3])
