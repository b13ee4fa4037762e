"""An environment of your own, registered with gymnasium when this module is imported, so that
``--env-id my_envs:Corridor-v0`` finds it in every actor's process (gymnasium imports the module
named before the colon).

Corridor: the agent stands on one of ``length`` cells and sees its position and the goal's as a
one-hot pair; moving toward the goal pays +1, away -1, and reaching it ends the episode.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np


class Corridor(gym.Env):
    metadata = {"render_modes": []}

    def __init__(self, length: int = 12) -> None:
        self.length = length
        self.observation_space = gym.spaces.Box(0.0, 1.0, (2 * length,), np.float32)
        self.action_space = gym.spaces.Discrete(2)  # 0: left, 1: right
        self._position = self._goal = 0

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        self._position, self._goal = (int(x) for x in self.np_random.choice(self.length, 2, replace=False))
        return self._observation(), {}

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict]:
        before = abs(self._goal - self._position)
        self._position = int(np.clip(self._position + (1 if action == 1 else -1), 0, self.length - 1))
        after = abs(self._goal - self._position)
        return self._observation(), float(before - after), after == 0, False, {}

    def _observation(self) -> np.ndarray:
        obs = np.zeros(2 * self.length, np.float32)
        obs[self._position] = obs[self.length + self._goal] = 1.0
        return obs


gym.register("Corridor-v0", entry_point=Corridor, max_episode_steps=50)
