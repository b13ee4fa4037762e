"""Which JAX platform each of an agent's processes gets: the learners the accelerator (and the
inference node, on a GPU), the rest the CPU. Before, every process got ``JAX_PLATFORMS``: with
``tpu`` the actors could not open the TPU the learner held, and on a GPU each process took most of
its memory."""

from __future__ import annotations

import os
import subprocess
import sys

import launch_nodes
import pytest
import xla_flags

import jaxdist as jd
from jaxdist import courier
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


@pytest.mark.parametrize("gpu", [True, False])
def test_the_inference_node_shares_the_learners_gpu_and_stays_on_cpu_without_one(monkeypatch, gpu):
    """Central inference on the accelerator is the point of it; on a GPU it takes memory as it
    needs it (the learner preallocates), and without one (a TPU opens in one process) the CPU."""
    monkeypatch.setattr(experiment, "gpu_present", lambda: gpu)
    monkeypatch.setenv("JAX_PLATFORMS", "cuda" if gpu else "tpu")
    program = ppo.agent(ppo.PPOConfig(inference="central", num_actors=2)).topology().program
    inference = experiment.resources(program)["inference"]["env"]
    if gpu:
        assert inference["JAX_PLATFORMS"] == "cuda" and inference["XLA_PYTHON_CLIENT_PREALLOCATE"] == "false"
    else:
        assert inference["JAX_PLATFORMS"] == "cpu" and "XLA_PYTHON_CLIENT_PREALLOCATE" not in inference
    assert experiment.resources(program)["actor"]["env"]["JAX_PLATFORMS"] == "cpu"


def test_an_anakin_learner_acts_on_the_accelerator_it_learns_on(monkeypatch):
    assert platforms(monkeypatch, "cuda", architecture="anakin", env_backend="jax") == {"learner": "cuda"}


def jax_choice_without_platforms() -> str:
    """The backend JAX takes in a fresh process told nothing: a GPU or TPU where there is one."""
    env = {key: value for key, value in os.environ.items() if key != "JAX_PLATFORMS"}
    return subprocess.run([sys.executable, "-c", "import jax; print(jax.default_backend())"], env=env,
                          capture_output=True, text=True, check=True, timeout=120).stdout.strip()


def test_in_launched_processes_the_learners_jax_runs_where_jax_chooses_and_the_actors_on_cpu(monkeypatch, tmp_path):
    """Not the launch's dictionary: each process's own JAX, asked where it runs (on a machine
    with a GPU or TPU, the learner's is there), and the caller's ``XLA_FLAGS`` reach it beside the
    single-threaded XLA the agents add (they once replaced the caller's)."""
    monkeypatch.delenv("JAX_PLATFORMS", raising=False)
    monkeypatch.setenv("XLA_FLAGS", xla_flags.flags(3))
    program = jd.Program("platforms")
    with program.group("learner"):
        learner = program.add_node(jd.CourierNode(launch_nodes.JaxPlatform))
    with program.group("actor"):
        actor = program.add_node(jd.CourierNode(launch_nodes.JaxPlatform))
    running = jd.launch(program, launcher="processes", run_dir=str(tmp_path), echo=False,
                        resources=experiment.resources(program))
    try:
        where = {}
        for handle in (learner, actor):
            with courier.Client(running.addresses[handle.node_name], token=running.token, timeout=120) as client:
                where[handle] = client.where()
    finally:
        running.stop()
    assert where[actor] == {"backend": "cpu", "told": "cpu", "cpu_devices": 3}
    assert where[learner] == {"backend": jax_choice_without_platforms(), "told": "", "cpu_devices": 3}
