"""PBT across learners: the coordinator's rounds (ranked by the members' recorded evaluations,
decided once every member has asked, the same answer again after a restart) and a member's
logic, whose hyperparameters are values of its state."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxdist.learning import pbt
from jaxdist.learning.learner_logic import LearnerLogic
from jaxdist.learning.population import Coordinator, member_logic
from jaxdist.nodes.evaluator import EVALUATIONS
from jaxdist.records.metrics import MetricsWriter, metrics_path, read_metrics

INITIAL = [{"learning_rate": rate, "clip_eps": 0.2} for rate in (1e-3, 2e-3, 3e-3, 4e-3)]
RANGES = {"learning_rate": pbt.Range(1e-4, 1e-2, log=True), "clip_eps": pbt.Range(0.1, 0.3)}


def coordinator(tmp_path, **rules) -> Coordinator:
    dirs = [str(tmp_path / f"config-{member}") for member in range(4)]
    return Coordinator(str(tmp_path), dirs, INITIAL, final_step=20,
                       **{"fraction": 0.25, "rule": "perturb", "ranges": RANGES, "exploit": True, "seed": 0, **rules})


def evaluate(tmp_path, step: int, returns: list[float]) -> None:
    for member, value in enumerate(returns):
        with MetricsWriter(metrics_path(tmp_path / f"config-{member}", EVALUATIONS)) as writer:
            writer.write(step, {"mean_return": value})


def test_a_round_is_decided_once_every_member_asked_and_was_evaluated_the_worst_copying_the_best(tmp_path):
    rounds = coordinator(tmp_path)
    evaluate(tmp_path, 5, [10.0, 40.0, 30.0])  # member 3 not evaluated yet
    assert [rounds.decision(member, 5) for member in range(4)] == [None] * 4
    evaluate(tmp_path, 5, [10.0, 40.0, 30.0, 5.0])
    decided = [rounds.decision(member, 5) for member in range(4)]
    assert [d["parent"] for d in decided] == [0, 1, 2, 1]  # the worst (3) copies the best (1)
    assert decided[:3] == [{"parent": m, "hyperparams": INITIAL[m]} for m in range(3)]
    for field, value in INITIAL[1].items():  # perturbed from the parent's, inside the range
        explored = np.clip(value * np.array(pbt.PERTURB_FACTORS), RANGES[field].low, RANGES[field].high)
        assert np.isclose(decided[3]["hyperparams"][field], explored, rtol=1e-5).any()
    lineage = read_metrics(tmp_path / "lineage.csv")
    assert [(row["step"], row["member"], row["parent"]) for row in lineage] == [
        *((0, m, m) for m in range(4)), (5, 0, 0), (5, 1, 1), (5, 2, 2), (5, 3, 1)]
    population = read_metrics(tmp_path / "evaluations.csv")[-1]
    assert population["step"] == 5 and population["seed/3/mean_return"] == 5.0 and population["mean_return"] == 21.25
    rounds.close()
    # A restarted coordinator reads its rounds back: a member that asks again is told the same.
    again = coordinator(tmp_path)
    assert [again.decision(member, 5) for member in range(4)] == decided
    assert len(read_metrics(tmp_path / "lineage.csv")) == len(lineage)
    evaluate(tmp_path, 10, [1.0, 2.0, 3.0, 4.0])  # the next round starts from the explored values
    assert [again.decision(member, 10) for member in range(4)][:3] == [None] * 3  # the last to ask decides it
    after = [again.decision(member, 10) for member in range(4)]
    assert after[3] == {"parent": 3, "hyperparams": decided[3]["hyperparams"]} and after[0]["parent"] == 3


def test_without_exploitation_every_member_keeps_its_state_and_values(tmp_path):
    rounds = coordinator(tmp_path, exploit=False)
    evaluate(tmp_path, 5, [10.0, 40.0, 30.0, 5.0])
    assert [rounds.decision(member, 5) for member in range(4)][:3] == [None] * 3  # the last to ask decides it
    assert [rounds.decision(member, 5) for member in range(4)] == [
        {"parent": m, "hyperparams": INITIAL[m]} for m in range(4)]


@pytest.mark.parametrize("rate", [0.1, 0.5])
def test_a_members_logic_keeps_its_hyperparameters_in_its_state_and_learns_by_them(rate):
    def logic_of(values):  # one SGD step on x**2, at the (traced) learning rate
        return LearnerLogic(init=lambda rng: {"x": jnp.float32(1.0)},
                            update=lambda state, batch, rng: ({"x": state["x"] * (1 - 2 * values["rate"])}, {}),
                            params=lambda state: state["x"])

    logic = member_logic(logic_of, {"rate": rate})
    state = logic.init(jax.random.key(0))
    assert state["hyperparams"] == {"rate": np.float32(rate)}
    update = jax.jit(logic.update)
    state, _ = update(state, {}, jax.random.key(1))
    assert np.isclose(logic.params(state), 1 - 2 * rate)
    state = {**state, "hyperparams": {"rate": jnp.float32(0.25)}}  # a copy's explored value: no new compilation
    state, _ = update(state, {}, jax.random.key(1))
    assert np.isclose(logic.params(state), (1 - 2 * rate) * 0.5) and update._cache_size() == 1
