"""An env whose episodes take seconds, for tests that stop a program mid-episode.

Importing this module registers ``SlowEpisodes-v0``: ``gymnasium.make("slow_envs:SlowEpisodes-v0")``.
``STEPPED`` is set at its first step, so a test in the same process (the threads launcher) knows
an episode is under way.
"""

from __future__ import annotations

import threading
import time

import gymnasium
import numpy as np

STEPPED = threading.Event()


class SlowEpisodes(gymnasium.Env):
    """CartPole's spaces; reward 1 a step, 20 ms a step, truncated after 1,000 steps (20 s)."""

    metadata = {"render_modes": []}

    def __init__(self) -> None:
        self.observation_space = gymnasium.spaces.Box(-1.0, 1.0, (4,), np.float32)
        self.action_space = gymnasium.spaces.Discrete(2)
        self._t = 0

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        self._t = 0
        return np.zeros(4, np.float32), {}

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict]:
        STEPPED.set()
        time.sleep(0.02)
        self._t += 1
        return np.zeros(4, np.float32), 1.0, False, self._t >= 1000, {}


gymnasium.register("SlowEpisodes-v0", entry_point=SlowEpisodes)
