"""The inference benchmark's policies (``experiments/benchmarks/inference.py``): each task's
parameters fit the policy its actors and inference node run."""

from __future__ import annotations

import os
import sys

import jax
import numpy as np
import pytest

from jaxdist.envs.spaces import env_info

sys.path[:0] = [os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "experiments",
                             "benchmarks")]

from inference import TASKS, policy_and_params  # noqa: E402


@pytest.mark.parametrize("env_id", list(TASKS))
def test_each_tasks_parameters_fit_the_policy_that_acts_with_them(env_id):
    """Pong's frames come channels-first: parameters made for channels-last images (MinAtar's
    torso, for a 4-pixel-high image) once fed the Nature CNN and killed every actor at its start."""
    policy, params = policy_and_params(env_id, TASKS[env_id][0])
    info = env_info(env_id)
    obs = np.zeros((3, *info.obs_shape), info.obs_dtype)
    action, extras = policy(params, obs, jax.random.key(0))
    assert action.shape == (3,) and extras["logp"].shape == (3,)
