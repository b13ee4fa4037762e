"""Anakin: the rollout in JAX (the actor's row convention, autoreset, episode returns), PPO's
update on it, the topology, eight devices under pmap, and the script as a user runs it."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import xla_flags

import jaxdist as jd
from jaxdist.envs import jax_envs
from jaxdist.agents import load_policy, ppo
from jaxdist.learning import anakin
from jaxdist.agents.experiment import with_preset
from jaxdist.records.metrics import read_metrics
from jaxdist.nodes.evaluator import EvaluationRecorder
from jaxdist.nodes.learner import Learner, PublishOptions

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CARTPOLE = jax_envs.jax_env("CartPole-v1")
CONFIG = with_preset(ppo.PPOConfig, "CartPole-v1", ppo.PRESETS, architecture="anakin", num_actors=1,
                     envs_per_actor=16)
UNPUBLISHED = PublishOptions(every=None, log_every=None, metrics=None)  # the tests read the updates' metrics


def cartpole_logic(num_envs: int = 16, **options):
    agent = ppo.agent(CONFIG)
    return anakin.logic(agent.part("learner_logic", CONFIG, agent.env), agent.part("policy", CONFIG, agent.env, 0),
                        agent.part("policy", CONFIG, agent.env, None), CONFIG.env_id, num_envs, CONFIG.trajectory_length,
                        **options)


def test_ppo_improves_on_the_learner_alone_with_a_lag_on_the_shared_row_only_and_evaluates_in_the_update():
    """Reaching CartPole's target is the script's test (slow): here the rows' lags, the
    evaluations' updates and a policy that has begun to learn."""
    learner = Learner(cartpole_logic(eval_every=25), anakin.no_batch, publishing=UNPUBLISHED)
    returns, evaluations = [], {}
    for update in range(50):
        metrics = jax.device_get(learner._advance(learner._feed.place({})))
        # Row 0's action was chosen an update ago, as the previous trajectory ended; every other row's now.
        assert metrics["policy_lag_max"] == min(update, 1) and metrics["stale_fraction"] == 0
        assert metrics["version"] == update + 1
        if metrics["episodes"]:
            returns.append(float(metrics["episode_return"]))
        evaluated = metrics["eval_returns"]
        assert evaluated.shape == (1, 10) and np.isnan(evaluated).all() == ((update + 1) % 25 != 0)
        if not np.isnan(evaluated).any():
            evaluations[update + 1] = evaluated.mean()
    assert np.mean(returns[:5]) < 60 and np.mean(returns[-10:]) > 2 * np.mean(returns[:5]), returns
    assert sorted(evaluations) == [25, 50] and evaluations[50] > np.mean(returns[:5]), evaluations


@pytest.mark.slow  # three learners, each compiling the whole Anakin update: ~35 s of CPU
def test_a_restored_anakin_learner_goes_on_exactly_as_one_that_never_stopped(tmp_path):
    """Its checkpoint is its whole state: parameters, the optimizer's moments, the version, every
    env's state and running episode, the best evaluated policy and the step that the update's
    keys are folded from."""
    from resume_checks import assert_resumes_exactly  # here: a fresh process imports this module from the repository

    resumed = assert_resumes_exactly(cartpole_logic(num_envs=4, eval_every=2), lambda: anakin.no_batch, tmp_path)
    assert int(resumed["step"]) == 6 and int(resumed["state"]["agent"]["version"][0]) == 6


def test_the_last_update_is_evaluated_whatever_the_interval_and_its_row_written_before_the_program_ends(tmp_path):
    """Before, only multiples of ``eval_every`` were evaluated (the final policy, here update 7,
    evaluating every 5, was not), and the program could end before the evaluations handed to
    the writer thread were written."""
    config = dataclasses.replace(CONFIG, total_steps=16 * CONFIG.trajectory_length * 7, eval_every_updates=5)
    running = jd.launch(ppo.agent(config).topology().program, launcher="threads", run_dir=str(tmp_path), echo=False)
    assert running.wait(timeout=300), running.status()
    assert running.stop_reason == "training is over at update 7 (max_steps reached) (node 'learner/0')"
    assert [row["step"] for row in read_metrics(tmp_path / "evaluations.csv")] == [5, 7]
    assert load_policy(str(tmp_path)).step == 7
    logged = set().union(*read_metrics(tmp_path / "metrics.csv"))  # the evaluations are in their own file
    assert "loss" in logged and not logged & {"version", "eval_returns", "env_steps"}


def test_each_seed_keeps_the_parameters_of_its_best_evaluation_and_not_evaluating_changes_nothing():
    best = {"return": jnp.full(2, -jnp.inf, jnp.float32), "version": jnp.full(2, -1, jnp.int32),
            "params": {"w": jnp.zeros((2, 3))}}
    offers = [(1, [[1.0, 3.0], [5.0, 5.0]]), (2, [[np.nan] * 2] * 2), (3, [[4.0, 4.0], [1.0, 1.0]]),
              (4, [[0.0, 0.0], [9.0, 7.0]])]
    for version, returns in offers:
        best = anakin.keep_best(best, jnp.asarray(returns, jnp.float32), jnp.int32(version),
                                {"w": jnp.full((2, 3), float(version))})
    np.testing.assert_array_equal(best["return"], [4.0, 8.0])
    np.testing.assert_array_equal(best["version"], [3, 4])
    np.testing.assert_array_equal(best["params"]["w"], [[3.0] * 3, [4.0] * 3])


def test_load_policy_best_plays_the_best_evaluated_version_of_an_anakin_run(tmp_path):
    """Before, an Anakin run had no best policy: ``best=True`` refused it."""
    config = dataclasses.replace(CONFIG, total_steps=16 * CONFIG.trajectory_length * 30, eval_every_updates=3)
    running = jd.launch(ppo.agent(config).topology().program, launcher="threads", run_dir=str(tmp_path), echo=False)
    assert running.wait(timeout=300), running.status()
    rows = read_metrics(tmp_path / "evaluations.csv")
    best_row = max(rows, key=lambda row: row["mean_return"])  # the first of equals, as the state keeps
    best, final = load_policy(str(tmp_path), best=True), load_policy(str(tmp_path))
    assert best.step == best_row["step"] and final.step == 30
    observations = np.random.default_rng(0).normal(size=(256, 4)).astype(np.float32)
    assert np.array_equal(best.act(observations), final.act(observations)) == (best.step == final.step)


def test_the_evaluation_recorder_has_written_all_it_was_handed_when_flush_returns(tmp_path):
    recorder = EvaluationRecorder(str(tmp_path), target_return=None, stop_at_target=False)
    for version in range(1, 41):
        recorder(None, {"version": jnp.int32(version), "eval_returns": jnp.full((1, 3), float(version)),
                        "env_steps": jnp.int32(512)})
    recorder.flush()
    rows = read_metrics(tmp_path / "evaluations.csv")
    assert [row["step"] for row in rows] == list(range(1, 41))
    assert [row["env_steps"] for row in rows] == [512 * version for version in range(1, 41)]  # exact, from the learner


def test_seeds_learn_independently_and_are_logged_each():
    learner = Learner(cartpole_logic(num_envs=8, num_seeds=3, eval_every=1000), anakin.no_batch,
                      publishing=UNPUBLISHED)
    params = learner.get()["params"]
    assert jax.tree.leaves(params)[0].shape[0] == 3  # published with the seed axis
    kernel = max(jax.tree.leaves(params["network"]), key=np.size)
    assert not np.array_equal(kernel[0], kernel[1])  # each seed its own initialisation
    metrics = jax.device_get(learner._advance(learner._feed.place({})))
    assert {"seed/0/loss", "seed/2/episode_return", "loss"} <= set(metrics)
    np.testing.assert_allclose(metrics["loss"], np.mean([metrics[f"seed/{i}/loss"] for i in range(3)]), rtol=1e-5)


def test_initialising_many_seeds_never_deadlocks_the_cpu_thread_pool():
    """jaxlib's CPU QR splits a batch of matrices over the intra-op pool and blocks the calling
    pool thread until its pieces are done: two vmapped orthogonal initialisations running at once
    on a two-thread pool waited on each other for ever (1 Anakin run of 4 with 8 seeds hung)."""
    script = textwrap.dedent("""
        import os
        os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[:2])  # the pool of a 2-core machine
        import jax
        from tests.agents.test_anakin import cartpole_logic
        init = cartpole_logic(num_envs=8, num_seeds=8).init
        for seed in range(20):
            jax.block_until_ready(init(jax.random.key(seed)))
    """)
    subprocess.run([sys.executable, "-c", script], cwd=REPO, check=True, timeout=120,
                   env={**os.environ, "PYTHONPATH": os.path.join(REPO, "tests", "support")})


def test_the_anakin_topology_is_one_learner_and_refuses_replay_agents_and_seeds_without_it():
    topology = ppo.agent(CONFIG).topology()
    assert topology.acting == [topology.learner] and [node.name for node in topology.program.nodes()] == ["learner/0"]
    with pytest.raises(ValueError, match="on-policy agents.*architecture='sebulba'"):  # Ape-X's config says it first
        dataclasses.replace(ppo.agent(CONFIG), prioritized=True).topology()
    with pytest.raises(ValueError, match="num_seeds=4 .* needs --architecture anakin"):
        ppo.PPOConfig(num_seeds=4)


EIGHT_DEVICES = textwrap.dedent("""
    import json, jax, numpy as np
    from jaxdist.agents import ppo
    from jaxdist.learning import anakin
    from jaxdist.agents.experiment import with_preset
    from jaxdist.nodes.learner import Learner, PublishOptions
    config = with_preset(ppo.PPOConfig, "CartPole-v1", ppo.PRESETS, architecture="anakin", num_actors=1,
                         envs_per_actor=32)
    from jaxdist.agents import experiment
    logic = experiment.anakin_logic(ppo.agent(config))
    learner = Learner(logic, anakin.no_batch, mode="pmap",
                      publishing=PublishOptions(every=None, log_every=None, metrics=None))
    returns = []
    for _ in range(120):
        metrics = jax.device_get(learner._advance(learner._feed.place({})))
        returns.append(float(metrics["episode_return"]))
    obs = jax.device_get(learner._train["state"]["envs"]["row"]["obs"])  # (devices, seeds, envs, 4)
    own = np.concatenate([obs[device, 0, device * 4:(device + 1) * 4] for device in range(8)])  # each plays 4
    print(json.dumps({"devices": jax.device_count(), "shape": list(obs.shape), "returns": returns,
                      "distinct_envs": len({row.tobytes() for row in own})}))
""")


@pytest.mark.slow
def test_on_eight_devices_each_plays_its_own_envs_under_pmap():
    done = subprocess.run([sys.executable, "-c", EIGHT_DEVICES], capture_output=True, text=True, timeout=600,
                          env=xla_flags.environ(8, optimised=True))  # it trains
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout.splitlines()[-1])
    assert got["devices"] == 8 and got["shape"] == [8, 1, 32, 4]  # every device holds all 32 envs' state
    assert got["distinct_envs"] == 32  # and plays its own 4, none a copy of another's
    learned = [value for value in got["returns"][-20:] if value == value]  # NaN: no episode ended
    assert learned and max(learned) >= 400, got["returns"]


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_script_trains_several_seeds_to_the_target_keeps_each_ones_best_and_resumes_from_its_checkpoint(tmp_path):
    """With ``--fresh`` over an earlier run's directory, whose checkpoints must go (a kept one
    would be resumed, or sit beside the new run's); ``load_policy(best=True, run_seed=i)`` then
    gives seed i's best evaluated policy. The same command again has nothing to do, and more
    steps resume the run from its checkpoint (one Anakin run to the target serves both)."""
    stale = tmp_path / "checkpoints" / "learner" / "0" / "99999999"
    stale.mkdir(parents=True)
    (stale / "commit_success.txt").write_text("an earlier run's")
    command = [sys.executable, os.path.join(REPO, "experiments", "ppo.py"), "--quiet",
               "--compilation-cache", "", "--architecture", "anakin", "--num-seeds", "3",
               "--run-dir", str(tmp_path), "--stop-at-target", "--fresh"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["num_seeds"] == 3 and [seed["seed"] for seed in summary["seeds"]] == [0, 1, 2]
    for seed in range(3):
        assert f"  seed {seed}: " in done.stdout, done.stdout
    rows = read_metrics(tmp_path / "evaluations.csv")
    assert {"seed/0/mean_return", "seed/2/mean_return"} <= set(rows[-1])
    np.testing.assert_allclose(rows[-1]["mean_return"], np.mean([rows[-1][f"seed/{i}/mean_return"] for i in range(3)]),
                               rtol=1e-5)
    # The mean over seeds is the target metric; updates played between the stop and the learner's
    # end are evaluated and written too (the state keeps their best for load_policy).
    assert any(row["mean_return"] >= 475 for row in rows)
    first, last = (load_policy(str(tmp_path), run_seed=i) for i in (0, 2))
    observations = np.random.default_rng(0).normal(size=(64, 4)).astype(np.float32)
    assert not np.array_equal(first.act(observations), last.act(observations))  # two seeds, two policies
    assert not stale.exists()
    saved = [row for row in rows if row["step"] <= summary["learner_version"]]
    for seed in range(3):
        best = load_policy(str(tmp_path), best=True, run_seed=seed)
        returns = {row["step"]: row[f"seed/{seed}/mean_return"] for row in saved}
        assert returns[best.step] == max(returns.values()), (seed, best.step, returns)
    again = subprocess.run(command[:-1], capture_output=True, text=True, timeout=300)
    assert again.returncode == 0 and "nothing launched: the run reached its target" in again.stdout, again.stdout
    config = json.loads((tmp_path / "config.json").read_text())["config"]
    assert config["architecture"] == "anakin"
    per_update = config["num_actors"] * config["envs_per_actor"] * config["trajectory_length"]
    more = command[:-2] + ["--total-steps", str((summary["learner_version"] + 8) * per_update), "--allow-config-change"]
    resumed = subprocess.run(more, capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert "resuming from the learner's checkpoint" in resumed.stdout, resumed.stdout
    assert json.loads((tmp_path / "summary.json").read_text())["learner_version"] > summary["learner_version"]
    assert load_policy(str(tmp_path), run_seed=1).act(np.zeros((2, 4), np.float32)).shape == (2,)
