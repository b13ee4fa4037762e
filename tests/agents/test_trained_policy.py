"""``load_policy`` and ``python -m jaxdist.tools.evaluate`` on a run directory whose learner checkpoints
are real Orbax saves of an (untrained) PPO state, at updates 2 and 4: a step, a seed or a
directory with no policy is a clear error (a line, from the command), and reading a run
changes nothing in it."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxdist.tools import evaluate
from jaxdist.agents import experiment
from jaxdist.agents import load_policy, ppo
from jaxdist.learning.checkpoint import Checkpointer
from jaxdist.learning.layout import checkpoint_dir
from jaxdist.nodes.learner import initial_state

SAVED_STEPS = (2, 4)
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def untrained_run(run_dir: str, saved_steps: tuple[int, ...], config: ppo.PPOConfig = ppo.PPOConfig()) -> str:
    experiment.save(run_dir, "jaxdist.agents.ppo:agent", config)
    agent = ppo.agent(config)
    if saved_steps:
        fresh = initial_state(agent.part("learner_logic", config, agent.env), jax.random.key(0))
        directory = checkpoint_dir(run_dir, agent.topology().learner.node_name)
        with Checkpointer(directory, async_save=False) as checkpointer:
            for step in saved_steps:
                checkpointer.save(step, {**fresh, "step": jnp.asarray(step, jnp.int32)})
    return run_dir


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    return untrained_run(str(tmp_path_factory.mktemp("run")), SAVED_STEPS)


def run_cli(monkeypatch: pytest.MonkeyPatch, *arguments: str) -> None:
    monkeypatch.setattr(sys, "argv", ["python -m jaxdist.tools.evaluate", *arguments])
    evaluate.main()


def test_the_policy_of_any_saved_step_is_loaded_and_acts(run_dir):
    for step in SAVED_STEPS:
        policy = load_policy(run_dir, step=step)
        assert policy.step == step
        assert policy.act(np.zeros((3, 4), np.float32)).shape == (3,)
    assert load_policy(run_dir).step == max(SAVED_STEPS)


def test_a_run_saved_by_the_first_release_still_loads_by_its_agents_short_name(tmp_path):
    """That release saved ``{"agent": "ppo", "config": ...}``; the factory and the config's class
    are saved since (``module:name``), so that an agent of one's own needs no registry."""
    run = untrained_run(str(tmp_path), (3,))
    saved = json.loads((tmp_path / "config.json").read_text())
    assert (saved["agent"], saved["config_type"]) == ("jaxdist.agents.ppo:agent", "jaxdist.agents.ppo:PPOConfig")
    (tmp_path / "config.json").write_text(json.dumps({"agent": "ppo", "config": saved["config"]}))
    assert load_policy(run).step == 3
    (tmp_path / "config.json").write_text(json.dumps({"agent": "sac", "config": saved["config"]}))
    with pytest.raises(ValueError, match="names agent 'sac', which is neither a 'module:function' factory nor one "
                                         "of ppo, impala, apex, es"):
        load_policy(run)


def test_a_step_that_was_not_saved_names_the_saved_ones(run_dir):
    with pytest.raises(FileNotFoundError, match="no checkpoint of step 3 in .*; the saved steps are 2, 4"):
        load_policy(run_dir, step=3)


def test_a_run_seed_the_run_did_not_train_is_refused_rather_than_answered_by_seed_0(run_dir):
    with pytest.raises(ValueError, match="trained 1 seed.*run_seed must be 0, got 1"):
        load_policy(run_dir, run_seed=1)


def test_reading_a_run_without_checkpoints_says_so_and_creates_nothing(tmp_path):
    run = untrained_run(str(tmp_path / "run"), saved_steps=())
    with pytest.raises(FileNotFoundError, match="has no complete learner checkpoint yet: train longer"):
        load_policy(run)
    assert os.listdir(run) == [experiment.CONFIG_FILE]


def test_the_command_plays_the_step_it_is_given(run_dir, monkeypatch, capsys):
    run_cli(monkeypatch, run_dir, "--step", "2", "--episodes", "2")
    out = capsys.readouterr().out
    assert out.count("episode ") == 2 and "ppo on CartPole-v1 at update 2: mean return" in out, out


@pytest.mark.parametrize("arguments, error", [
    (("--step", "3"), "error: no checkpoint of step 3 in .*; the saved steps are 2, 4"),
    (("--run-seed", "1"), "error: .* trained 1 seed.*run_seed must be 0, got 1"),
    (("--episodes", "0"), "error: --episodes must be at least 1, got 0"),
    (("--max-episode-steps", "0"), "error: --max-episode-steps must be at least 1, got 0"),
    (("--best", "--step", "2"), "error: --best and --step name two policies: pass one"),
    (("--best",), "error: .* has no best policy: the evaluator node saves one at each better evaluation"),
])
def test_the_command_answers_arguments_that_name_no_policy_with_one_line(run_dir, monkeypatch, arguments, error):
    with pytest.raises(SystemExit, match=error):
        run_cli(monkeypatch, run_dir, *arguments)


def test_the_command_plays_an_env_of_ones_own_that_takes_no_render_mode(tmp_path, monkeypatch, capsys):
    """Before, it passed ``render_mode=None`` to every env, and the README's own env (whose
    constructor takes no ``render_mode``) failed with a TypeError's traceback."""
    monkeypatch.syspath_prepend(os.path.join(REPO, "experiments", "custom"))
    run = untrained_run(str(tmp_path / "run"), (2,), ppo.PPOConfig(env_id="my_envs:Corridor-v0"))
    run_cli(monkeypatch, run, "--episodes", "2")
    assert "ppo on my_envs:Corridor-v0 at update 2: mean return" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="error: --video records the frames an env renders, and "
                                         "my_envs:Corridor-v0 takes no render_mode"):
        run_cli(monkeypatch, run, "--episodes", "1", "--video", str(tmp_path / "video"))


@pytest.mark.slow
def test_the_command_plays_an_atari_run_on_its_evaluators_env_and_records_it(tmp_path, monkeypatch, capsys):
    """Before, it made the env with ``gymnasium.make("Pong-v5")``, an id gymnasium does not know."""
    config = ppo.PPOConfig(env_id="Pong-v5", network="cnn", repeat_action_probability=0.25)
    run = untrained_run(str(tmp_path / "run"), (2,), config)
    env = evaluate.make_env(load_policy(run), evaluate.Arguments(run))
    try:  # EnvPool's: whole games (each life begun as in training), the game's scores, the run's sticky actions
        options = env.env.env.config
        assert env.single_observation_space.shape == (4, 84, 84)
        assert (options["episodic_life"], options["reward_clip"], options["repeat_action_probability"]) == \
            (True, False, 0.25)
    finally:
        env.close()
    video = tmp_path / "video"
    run_cli(monkeypatch, run, "--episodes", "1", "--max-episode-steps", "20", "--video", str(video))
    out = capsys.readouterr().out
    assert "episode 0: return" in out and "(cut at 20 steps)" in out, out
    assert "ppo on Pong-v5 at update 2: mean return" in out and os.listdir(video) == ["ppo-update2-episode-0.mp4"]


@pytest.mark.slow
@pytest.mark.parametrize("env_id, network, renders", [("Breakout-MinAtar", "cnn", False),
                                                      ("CartPoleNoVel-v1", "mlp", True)])
def test_the_command_plays_minatar_and_masked_runs_and_records_where_the_env_renders(
        tmp_path, monkeypatch, capsys, env_id, network, renders):
    run = untrained_run(str(tmp_path / "run"), (2,), ppo.PPOConfig(env_id=env_id, network=network))
    run_cli(monkeypatch, run, "--episodes", "1", "--max-episode-steps", "50")
    assert f"ppo on {env_id} at update 2: mean return" in capsys.readouterr().out
    video = tmp_path / "video"
    if renders:
        run_cli(monkeypatch, run, "--episodes", "1", "--max-episode-steps", "50", "--video", str(video))
        assert os.listdir(video) == ["ppo-update2-episode-0.mp4"]
    else:
        with pytest.raises(SystemExit, match=f"error: --video records the frames an env renders, and {env_id} takes "
                                             "no render_mode"):
            run_cli(monkeypatch, run, "--episodes", "1", "--video", str(video))


def test_the_command_answers_a_directory_that_is_no_run_with_one_line(tmp_path, monkeypatch):
    with pytest.raises(SystemExit, match=f"error: {tmp_path} has no config.json: is it the run directory"):
        run_cli(monkeypatch, str(tmp_path))


def test_the_commands_help_shows_how_to_run_it(monkeypatch, capsys):
    """Before, its usage line read ``/.../jaxdist/tools/evaluate.py [-h] [OPTIONS] STR``."""
    monkeypatch.setattr(sys, "argv", ["evaluate.py", "--help"])
    with pytest.raises(SystemExit):
        evaluate.main()
    assert "usage: python -m jaxdist.tools.evaluate [-h] [OPTIONS] RUN_DIR" in capsys.readouterr().out


@pytest.fixture(scope="module")
def es_run_dir(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, np.ndarray]:
    """An ES run one generation in (a real update from made-up fitness), saved by the master's
    own Search: its run directory and its mean parameters."""
    from jaxdist.agents import es
    from jaxdist.agents.es.search import Rollouts, Search

    run = str(tmp_path_factory.mktemp("es-run"))
    config = es.ESConfig()
    experiment.save(run, "jaxdist.agents.es:agent", config)
    search = Search(config, Rollouts(config).policy, checkpoint_dir(run, es.agent(config).topology().learner.node_name))
    search.step(search.seeds(), np.random.default_rng(0).normal(size=(config.pairs, 2)), env_steps=1_000)
    search.save()
    search.close()
    return run, np.asarray(search.theta)


def test_an_es_run_gives_the_policy_of_its_mean_parameters(es_run_dir):
    from jaxdist.agents.es.policy import Policy
    from jaxdist.envs.jax_envs import jax_env

    run, theta = es_run_dir
    policy = load_policy(run)
    observations = np.random.default_rng(1).normal(size=(5, 4)).astype(np.float32)
    expected = np.asarray(jax.vmap(Policy.for_env(jax_env("CartPole-v1"), (32, 32)).act, (None, 0))(theta, observations))
    assert policy.step == 1 and policy.env_id == "CartPole-v1"
    np.testing.assert_array_equal(policy.act(observations), expected)
    np.testing.assert_array_equal(policy.act(observations, deterministic=False), expected)  # ES acts greedily


def test_the_command_plays_an_es_run(es_run_dir, monkeypatch, capsys):
    run_cli(monkeypatch, es_run_dir[0], "--episodes", "1")
    assert "es on CartPole-v1 at update 1: mean return" in capsys.readouterr().out


def test_a_run_directory_whose_config_names_code_inside_it_is_refused_before_that_code_runs(tmp_path):
    """A run directory handed over by someone else, under the working directory: config.json
    named a module of its own (``evil_run.evil:agent``), which loading the run imported."""
    run = tmp_path / "evil_run"
    run.mkdir()
    marker = tmp_path / "ran"
    (run / "evil.py").write_text(f"open({str(marker)!r}, 'w').close()\nagent = None\n")
    saved = ppo.PPOConfig()
    (run / "config.json").write_text(json.dumps({"agent": "evil_run.evil:agent", "config_type": "evil_run.evil:agent",
                                                 "config": experiment.to_dict(saved)}))
    command = [sys.executable, "-m", "jaxdist.tools.evaluate", "evil_run", "--episodes", "1"]
    refused = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert refused.returncode == 1 and not marker.exists()
    assert refused.stderr.strip().startswith("error: evil_run/config.json names module 'evil_run.evil', whose code is "
                                             "in the run directory itself"), refused.stderr
    assert "--trust-run-dir" in refused.stderr
    trusted = subprocess.run([*command, "--trust-run-dir"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert marker.exists() and trusted.returncode != 0  # its author's code ran, as asked


def test_loading_a_policy_beside_a_live_learner_leaves_its_save_in_progress_alone(tmp_path):
    """load_policy opened the learner's checkpoints as a writer does, whose start removes
    Orbax's temporary directories: to a reader, the learner's save in progress."""
    run = untrained_run(str(tmp_path), (2,))
    directory = checkpoint_dir(run, ppo.agent(ppo.PPOConfig()).topology().learner.node_name)
    in_progress = os.path.join(directory, "4.orbax-checkpoint-tmp-1234")
    os.makedirs(in_progress)
    assert load_policy(run).step == 2
    assert os.path.isdir(in_progress)
