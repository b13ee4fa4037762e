"""``--inference central``: the agents' topology with an inference node that acts for every
actor, and the settings it cannot serve, refused before launch."""

from __future__ import annotations

import io

import pytest

from jaxdist.agents import apex, impala, ppo
from jaxdist.agents.experiment import with_preset
from jaxdist.agents.run import parse, train
from jaxdist.records.metrics import read_metrics


def test_settings_whose_policy_an_inference_node_cannot_play_are_refused_before_launch():
    with pytest.raises(ValueError, match="under --architecture anakin or --env-backend jax the policy plays inside"):
        ppo.PPOConfig(inference="central", architecture="anakin")
    with pytest.raises(ValueError, match="drop --inference central"):
        impala.IMPALAConfig(inference="central", env_backend="jax")
    with pytest.raises(ValueError, match="Ape-X's actors explore each with its own epsilon"):
        apex.ApexConfig(inference="central")
    with pytest.raises(ValueError, match="--core lstm needs --inference actor"):
        ppo.PPOConfig(inference="central", core="lstm")
    with pytest.raises(SystemExit, match="^error: .*drop --inference central"):
        parse(ppo.PPOConfig, ppo.PRESETS, None, ["--inference", "central", "--architecture", "anakin"])


def test_the_topology_adds_one_inference_node_on_the_learners_host_that_every_actor_asks():
    topology = ppo.agent(ppo.PPOConfig(inference="central", num_actors=3)).topology()
    groups = topology.program.groups
    assert len(groups["inference"]) == 1 and len(groups["actor"]) == 3
    assert topology.placement["inference"] == topology.placement["learner"]
    plain = ppo.agent(ppo.PPOConfig()).topology()
    assert "inference" not in plain.program.groups


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_ppo_solves_cartpole_with_its_actors_acting_through_the_inference_node(tmp_path):
    config = with_preset(ppo.PPOConfig, "CartPole-v1", ppo.PRESETS, inference="central", num_actors=2,
                         envs_per_actor=8, stop_at_target=True)
    summary = train(ppo.agent(config), launcher="processes", run_dir=str(tmp_path), echo=False, out=io.StringIO())
    evaluations = [row["mean_return"] for row in read_metrics(tmp_path / "evaluations.csv")]
    assert summary["wall_time_to_target"] is not None and max(evaluations) >= 475, evaluations
