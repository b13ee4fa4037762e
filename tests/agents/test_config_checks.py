"""What an agent's command line refuses before anything starts, and how it reports what fails
after: hyperparameters out of range (which trained nonsense silently, or crashed nodes over and
over), a backend whose library is missing, an architecture the agent cannot run, and a node
that fails as it starts (one line naming the node, its exception and its log, not the
launching process's stack)."""

from __future__ import annotations

import json
import math
import os
import stat
import subprocess
import sys

import pytest

import jaxdist as jd
from jaxdist.envs import ports, vector as envs
from jaxdist.agents import apex, es, impala, ppo
from jaxdist.agents import experiment
from jaxdist.agents.run import RunOptions, failure_summary, parse, prepare_run_dir
from jaxdist.agents.experiment import Bound, check_bounds, with_preset

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SUPPORT = os.path.join(REPO, "tests", "support")

OUT_OF_RANGE = [
    (ppo.PPOConfig, "gamma", 1.5, r"gamma must be in \[0, 1\], got 1.5"),
    (ppo.PPOConfig, "gae_lambda", -0.1, r"gae_lambda must be in \[0, 1\]"),
    (ppo.PPOConfig, "learning_rate", -1.0, "learning_rate must be > 0, got -1.0"),
    (ppo.PPOConfig, "learning_rate", math.nan, "learning_rate must be > 0, got nan"),
    (ppo.PPOConfig, "clip_eps", 0.0, "clip_eps must be > 0"),
    (ppo.PPOConfig, "max_grad_norm", 0.0, "max_grad_norm must be > 0"),
    (ppo.PPOConfig, "ent_coef", -0.01, "ent_coef must be >= 0"),
    (ppo.PPOConfig, "max_policy_lag", -1, "max_policy_lag must be >= 0"),
    (ppo.PPOConfig, "queue_trajectories", 0, "queue_trajectories must be >= 1"),
    (ppo.PPOConfig, "seed", -1, r"seed must be in \[0, 4294967295\], got -1"),
    (ppo.PPOConfig, "hidden", (64, 0), r"hidden must be >= 1 each, got \(64, 0\)"),
    (ppo.PPOConfig, "learner_prefetch", -1, "learner_prefetch must be >= 0"),
    (ppo.PPOConfig, "replay_checkpoint_seconds", 0.0, "replay_checkpoint_seconds must be > 0"),
    (impala.IMPALAConfig, "rho_bar", -1.0, "rho_bar must be > 0"),
    (impala.IMPALAConfig, "trace_lambda", 1.5, r"trace_lambda must be in \[0, 1\]"),
    (impala.IMPALAConfig, "baseline_cost", -0.5, "baseline_cost must be >= 0"),
    (apex.ApexConfig, "gamma", 0.0, r"gamma must be in \(0, 1\]"),
    (apex.ApexConfig, "base_epsilon", 2.0, r"base_epsilon must be in \[0, 1\]"),
    (apex.ApexConfig, "huber_delta", 0.0, "huber_delta must be > 0"),
    (apex.ApexConfig, "importance_exponent", -0.4, r"importance_exponent must be in \[0, 1\]"),
    (es.ESConfig, "hidden", (0,), "hidden must be >= 1 each"),
    (es.ESConfig, "momentum", 1.0, r"momentum must be in \[0, 1\), got 1.0"),
    (es.ESConfig, "sigma", 0.0, "sigma must be > 0"),
    (es.ESConfig, "seed", -3, "seed must be in"),
]

PPO = "jaxdist.agents.ppo:agent"


@pytest.mark.parametrize("config_type, name, value, message", OUT_OF_RANGE,
                         ids=[f"{c.__name__}-{n}-{v}" for c, n, v, _ in OUT_OF_RANGE])
def test_a_value_out_of_range_is_refused_by_name(config_type, name, value, message):
    with pytest.raises(ValueError, match=message):
        config_type(**{name: value})


@pytest.mark.parametrize("config_type", [ppo.PPOConfig, impala.IMPALAConfig])
def test_a_queue_that_cannot_take_an_actors_send_is_refused_with_what_to_change(config_type):
    with pytest.raises(ValueError, match=r"queue_trajectories \(8\) holds 8 trajectories per learner host, fewer than "
                                         r"an actor sends at once .*--envs-per-actor 16.*at least 16"):
        config_type(batch_trajectories=4, queue_trajectories=8, envs_per_actor=16)
    with pytest.raises(ValueError, match=r"holds 8 trajectories per learner host.*at least 32"):
        config_type(batch_trajectories=4, queue_trajectories=16, envs_per_actor=16, learner_hosts=2)
    assert config_type(batch_trajectories=4, envs_per_actor=16, learner_hosts=2).queue_size == 32  # the default fits


@pytest.mark.parametrize("agent", [ppo, impala, apex, es], ids=lambda module: module.__name__.rsplit(".", 1)[1])
def test_every_preset_is_in_range(agent):
    config_type = {ppo: ppo.PPOConfig, impala: impala.IMPALAConfig, apex: apex.ApexConfig, es: es.ESConfig}[agent]
    for key in agent.PRESETS:
        env_id, backend = key if isinstance(key, tuple) else (key, None)
        with_preset(config_type, env_id, agent.PRESETS, **({"env_backend": backend} if backend else {}))


def test_bounds_state_their_range_and_leave_none_to_the_field():
    assert [str(bound) for bound in (Bound(1), Bound(0, low_open=True), Bound(0, 1), Bound(0, 1, high_open=True),
                                     Bound(0.5, 2.5))] == [">= 1", "> 0", "in [0, 1]", "in [0, 1)", "in [0.5, 2.5]"]
    check_bounds(ppo.PPOConfig(), {"batch_trajectories": Bound(1)})  # None: one per env
    assert ppo.PPOConfig(gamma=0.0, hidden=()).hidden == ()  # the ends of a range, and a linear network


def test_the_command_line_says_which_flag_is_out_of_range():
    with pytest.raises(SystemExit, match=r"^error: gamma must be in \[0, 1\], got 1.5$"):
        parse(ppo.PPOConfig, ppo.PRESETS, None, ["--gamma", "1.5"])


def test_a_backend_whose_library_is_missing_is_refused_before_launching(monkeypatch):
    monkeypatch.setattr(envs, "envpool_installed", lambda: False)  # the machine without EnvPool
    with pytest.raises(SystemExit, match="env backend 'envpool' needs EnvPool, which is not installed: pip install"):
        parse(ppo.PPOConfig, ppo.PRESETS, None, ["--env-id", "Pendulum-v1", "--env-backend", "envpool"])


def test_an_env_without_a_jax_version_is_refused_before_launching_where_one_is_needed(monkeypatch):
    """Before, the run launched and its actor (or Anakin learner) failed some seconds later."""
    with pytest.raises(SystemExit, match="^error: --architecture anakin plays the env's JAX version, and there is no "
                                         "JAX version of 'HalfCheetah-v5': jaxdist.envs.jax_envs ports CartPole-v1"):
        parse(ppo.PPOConfig, ppo.PRESETS, None, ["--env-id", "HalfCheetah-v5", "--architecture", "anakin"])
    with pytest.raises(ValueError, match="--env-backend jax plays .* no JAX version of 'Corridor-v0'"):
        impala.IMPALAConfig(env_id="my_envs:Corridor-v0", env_backend="jax")
    monkeypatch.setattr(ports, "gymnax_installed", lambda: False)
    with pytest.raises(ValueError, match=r"gymnax's Acrobot-v1, MountainCar-v0, MountainCarContinuous-v0, Breakout-MinAtar, "
                                         r".*, Freeway-MinAtar with pip install -e '\.\[jaxenv\]' in the jaxdist clone"):
        ppo.PPOConfig(env_id="Acrobot-v1", env_backend="jax")
    assert ppo.PPOConfig(env_id="Pendulum-v1", env_backend="jax", architecture="anakin").env_id == "Pendulum-v1"


def test_a_launchers_flag_given_to_another_launcher_is_refused():
    """``--hosts a,b`` without ``--launcher multihost`` was ignored: the run went on, on one host."""
    with pytest.raises(SystemExit, match="^error: --hosts is an option of --launcher multihost, not of processes"):
        parse(ppo.PPOConfig, ppo.PRESETS, None, ["--hosts", "a,b"])
    with pytest.raises(SystemExit, match="--tls-dir is an option of --launcher multihost or ray, not of threads"):
        parse(ppo.PPOConfig, ppo.PRESETS, None, ["--launcher", "threads", "--tls-dir", "certs"])
    assert RunOptions(launcher="ray", ray_address="auto", tls_dir="certs").launch_options() == {
        "address": "auto", "tls_dir": "certs"}
    assert RunOptions(launcher="multihost", hosts="h0,h1", host_index=1).launch_options() == {
        "hosts": "h0,h1", "host_index": 1}
    assert RunOptions().launch_options() is None
    _, run = parse(ppo.PPOConfig, ppo.PRESETS, None, ["--start-timeout", "900"])
    assert run.launch_options() == {"start_timeout": 900.0}
    with pytest.raises(SystemExit, match="--start-timeout is an option of --launcher processes or multihost or ray"):
        parse(ppo.PPOConfig, ppo.PRESETS, None, ["--launcher", "threads", "--start-timeout", "900"])


def test_fresh_under_multihost_is_refused_before_any_host_deletes_the_shared_run_directory():
    """Every host's script deleted the shared directory: a host starting a moment later deleted
    the logs, lock and config the first had just written."""
    with pytest.raises(SystemExit, match="^error: --fresh is not for --launcher multihost: every host would delete"):
        parse(ppo.PPOConfig, ppo.PRESETS, None, ["--launcher", "multihost", "--fresh"])


def test_a_network_is_refused_by_its_name_or_by_the_observations_it_cannot_take():
    """``--network bogus`` and ``--network cnn`` on CartPole failed in the learner, after the launch."""
    with pytest.raises(ValueError, match="network must be 'mlp', 'cnn' or 'package.module:function'; got 'bogus'"):
        ppo.PPOConfig(network="bogus")
    assert ppo.PPOConfig(network="my_package.nets:torso").network == "my_package.nets:torso"
    with pytest.raises(ValueError, match=r"takes images \(height, width, channels\); "
                                         r"CartPole-v1's observations are \(4,\)"):
        ppo.agent(ppo.PPOConfig(network="cnn"))
    with pytest.raises(ValueError, match=r"network 'mlp' takes flat observations; pixel_envs:PixelChase-v0's are "
                                         r"\(36, 36, 1\): use --network cnn"):
        ppo.agent(ppo.PPOConfig(env_id="pixel_envs:PixelChase-v0"))
    with pytest.raises(ValueError, match="network 'cnn'"):
        apex.agent(apex.ApexConfig(network="cnn"))
    assert ppo.agent(ppo.PPOConfig(env_id="pixel_envs:PixelChase-v0", network="cnn")).env.obs_shape == (36, 36, 1)


def test_apex_refuses_the_anakin_architecture_in_its_config():
    with pytest.raises(ValueError, match="Ape-X learns from a replay of transitions: use --architecture sebulba"):
        apex.ApexConfig(architecture="anakin")


def test_a_run_directory_that_cannot_be_written_is_one_error_line(tmp_path):
    """Before, makedirs' traceback (e.g. --run-dir under a file, or on a read-only mount)."""
    (tmp_path / "a_file").write_text("")
    with pytest.raises(SystemExit, match=r"^error: cannot write the run directory .*a_file/run \(Not a directory: "
                                         r".*\): choose another --run-dir$"):
        prepare_run_dir(str(tmp_path / "a_file" / "run"), PPO, ppo.PPOConfig(), RunOptions())


def test_a_new_run_directory_holds_its_config_before_launching_so_fresh_knows_it(tmp_path):
    """A launch that failed before its learner started left a run directory without its config;
    ``--fresh`` then refused it as not a run ("choose another --run-dir")."""
    run_dir = str(tmp_path / "run")
    config = ppo.PPOConfig(gamma=0.9)
    prepare_run_dir(run_dir, PPO, config, RunOptions())
    assert json.loads((tmp_path / "run" / experiment.CONFIG_FILE).read_text())["config"]["gamma"] == 0.9
    assert stat.S_IMODE(os.stat(run_dir).st_mode) == 0o700
    prepare_run_dir(run_dir, PPO, ppo.PPOConfig(gamma=0.95), RunOptions(fresh=True))
    assert experiment.load(run_dir).fields["gamma"] == 0.95
    with pytest.raises(SystemExit, match="gamma: 0.95 -> 0.99"):
        prepare_run_dir(run_dir, PPO, ppo.PPOConfig(gamma=0.99), RunOptions())
    prepare_run_dir(run_dir, PPO, ppo.PPOConfig(gamma=0.99), RunOptions(allow_config_change=True))
    assert experiment.load(run_dir).fields["gamma"] == 0.99  # the config the run now runs


def test_a_failed_node_is_summed_up_in_one_line_with_its_log(tmp_path):
    traceback = 'Traceback (most recent call last):\n  File "x.py", line 1, in f\nValueError: no JAX version\n'
    assert failure_summary(jd.NodeFailedError("actor/1", traceback), str(tmp_path)) == (
        f"node 'actor/1' failed: ValueError: no JAX version (its log: {tmp_path}/logs/actor-1.log)")
    loop = f"crashed 3 times, more than its restart limit allows; last:\n{traceback}"
    assert failure_summary(jd.NodeFailedError("learner/0", loop), str(tmp_path)).startswith(
        "node 'learner/0' failed: crashed 3 times, more than its restart limit allows; last: ValueError: no JAX")
    assert failure_summary(jd.NodeFailedError("actor/0", "killed by SIGKILL"), str(tmp_path)).startswith(
        "node 'actor/0' failed: killed by SIGKILL (its log:")
    jax_filtered = (traceback.replace("no JAX version", "network must be 'mlp'") + "--------------------\n"
                    "For simplicity, JAX has removed its internal frames from the traceback of the following exception.")
    assert failure_summary(jd.NodeFailedError("learner/0", jax_filtered), str(tmp_path)).startswith(
        "node 'learner/0' failed: ValueError: network must be 'mlp' (its log:")


def script(*args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, os.path.join(REPO, "experiments", "ppo.py"), "--quiet",
                           "--compilation-cache", "", *args], capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, PYTHONPATH=SUPPORT, **env))


def test_track_without_a_weights_and_biases_account_ends_the_script_with_one_error_line(tmp_path, monkeypatch):
    """Before, wandb's UsageError came out as a traceback."""
    for name in ("WANDB_API_KEY", "WANDB_MODE"):
        monkeypatch.delenv(name, raising=False)
    done = script("--track", "jaxdist-tests", "--run-dir", str(tmp_path / "run"), HOME=str(tmp_path))  # no ~/.netrc
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stderr.strip().splitlines()[-1].startswith("error: --track: Weights & Biases refused the run ("), \
        done.stderr
    assert "WANDB_MODE=offline" in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "run" / "logs").exists()  # nothing was launched


def test_a_launch_refused_ends_the_script_with_one_error_line(tmp_path):
    done = script("--launcher", "multihost", "--hosts", "127.0.0.1", "--host-index", "3", "--run-dir", str(tmp_path))
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stderr.strip().splitlines() == ["error: host index 3 is outside the 1 hosts ['127.0.0.1'] (explicit); "
                                                "indices run from 0 to 0"], done.stderr


def test_a_node_that_fails_as_it_starts_ends_the_script_with_one_error_line(tmp_path):
    """Before, the launching process's own traceback (monitor, running.wait) came out around
    the node's, and the script's last line was NodeFailedError's repr of it."""
    done = script("--env-id", "broken_envs:BrokenInNodes-v0", "--num-actors", "1", "--envs-per-actor", "2",
                  "--run-dir", str(tmp_path))
    assert done.returncode == 1, done.stdout + done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("error: node '"), done.stderr
    assert "ValueError: BrokenInNodes-v0 cannot be made in a node" in last, done.stderr
    assert f"(its log: {tmp_path}/logs/" in last
    assert "Traceback" not in done.stderr


def test_a_choice_outside_a_fields_choices_is_refused_before_launching_even_as_a_default():
    """``--env-backend foo`` is read before parsing (to pick the backend's preset) and became the
    parser's default, of which tyro only warns: the run launched and its actors failed."""
    with pytest.raises(SystemExit, match="^error: env_backend must be one of 'auto', 'vector', 'sync', 'async', "
                                         "'envpool', 'jax', got 'foo'$"):
        parse(ppo.PPOConfig, ppo.PRESETS, None, ["--env-backend", "foo"])
    with pytest.raises(ValueError, match="architecture must be one of 'sebulba', 'anakin', got 'podracer'"):
        impala.IMPALAConfig(architecture="podracer")
    with pytest.raises(ValueError, match="optimizer must be one of 'adam', 'sgd', got 'lamb'"):
        es.ESConfig(optimizer="lamb")
