"""An actor over a continuous action space: its items carry (T + 1, action dims) actions and one
version per row, and the env gets the actions clipped to its bounds."""

from __future__ import annotations

import numpy as np

from jaxdist.envs.vector import EnvSpec
from jaxdist.nodes.actor import Actor


class Fixed:
    """A parameter source that always has version 3 of no parameters."""

    def get(self, min_version=-1, wait=0.0):
        return {"version": 3, "params": {} if min_version < 3 else None}


def out_of_bounds_policy(params, obs, key):
    import jax.numpy as jnp

    return jnp.full((obs.shape[0], 1), 5.0, jnp.float32), {"logp": jnp.zeros(obs.shape[0])}


def test_continuous_actions_travel_whole_and_reach_the_env_clipped():
    items = []
    actor = Actor(out_of_bounds_policy, EnvSpec("Pendulum-v1", 2, "sync"), Fixed(), items.extend,
                  trajectory_length=5, max_steps=2 * 5 * 3)
    clipped = []
    step = actor._env.env.step
    actor._env.env.step = lambda actions: (clipped.append(np.array(actions)), step(actions))[1]
    try:
        actor.run()
    finally:
        actor.close()
    assert items, "no trajectory was sent"
    for item in items:
        assert item["action"].shape == (6, 1) and item["version"].shape == (6,)
        assert (item["version"] == 3).all() and (item["action"] == 5.0).all()  # the raw sample is what is sent
    assert clipped and all((actions == 2.0).all() for actions in clipped)  # Pendulum's bound
