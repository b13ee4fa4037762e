"""Which JAX platform each of an agent's processes gets: the learners the accelerator, the rest
the CPU. Before, every process got ``JAX_PLATFORMS``: with ``tpu`` the actors could not open the
TPU the learner held, and on a GPU each process took most of its memory."""

from __future__ import annotations

import pytest

from jaxdist.agents import experiment, ppo


def platforms(monkeypatch: pytest.MonkeyPatch, value: str | None, **config) -> dict[str, str]:
    if value is None:
        monkeypatch.delenv("JAX_PLATFORMS", raising=False)
    else:
        monkeypatch.setenv("JAX_PLATFORMS", value)
    program = ppo.agent(ppo.PPOConfig(**config)).topology().program
    return {group: spec["env"]["JAX_PLATFORMS"] for group, spec in experiment.resources(program).items()}


def test_jax_platforms_puts_the_learners_on_the_accelerator_and_every_other_process_on_cpu(monkeypatch):
    assert platforms(monkeypatch, "tpu") == {"learner": "tpu", "actor": "cpu"}
    assert platforms(monkeypatch, "cuda", learner_hosts=2, num_actors=4) == {"learner": "cuda", "actor": "cpu",
                                                                             "evaluator": "cpu"}


def test_without_jax_platforms_the_learners_take_what_jax_finds_and_the_actors_stay_on_cpu(monkeypatch):
    assert platforms(monkeypatch, None) == {"learner": "", "actor": "cpu"}  # empty: JAX picks, as unset


def test_an_anakin_learner_acts_on_the_accelerator_it_learns_on(monkeypatch):
    assert platforms(monkeypatch, "cuda", architecture="anakin", env_backend="jax") == {"learner": "cuda"}
