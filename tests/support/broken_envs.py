"""An env the launching process makes without trouble (it reads the spaces) but that no node
can make: for tests of a node that fails as it starts.

Importing this module registers ``BrokenInNodes-v0`` (``broken_envs:BrokenInNodes-v0``)."""

from __future__ import annotations

import gymnasium
import numpy as np

import jaxdist as jd


class BrokenInNodes(gymnasium.Env):
    metadata = {"render_modes": []}

    def __init__(self) -> None:
        if jd.current_node() is not None:
            raise ValueError("BrokenInNodes-v0 cannot be made in a node: its simulator is missing")
        self.observation_space = gymnasium.spaces.Box(-1.0, 1.0, (4,), np.float32)
        self.action_space = gymnasium.spaces.Discrete(2)


gymnasium.register("BrokenInNodes-v0", entry_point=BrokenInNodes)
