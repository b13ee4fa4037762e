"""A tiny image-observation env, and a small network for it, for tests of pixel agents.

Importing this module registers ``PixelChase-v0``, so ``gymnasium.make("pixel_envs:PixelChase-v0")``
works in any process that has tests/support on its path, and ``"pixel_envs:small_cnn"`` names
the network. JAX is imported only when the network is built: envs stay cheap to make.
"""

from __future__ import annotations

from typing import Any

import gymnasium
import numpy as np

SIZE, BLOCK = 36, 4  # 36 passes the Nature-DQN torso's VALID convs: 36 -> 8 -> 3 -> 1


class PixelChase(gymnasium.Env):
    """A bright 4x4 block on the left or right half of a dark 36x36 frame; action 0 or 1 guesses
    the side (0 left, 1 right) for reward 1, else 0. Every step shows a fresh random frame, so
    a random policy scores ``episode_steps / 2`` and a perfect one ``episode_steps``. Episodes
    are truncated (a time limit, not a terminal state) after ``episode_steps`` steps by the env
    itself, with no ``TimeLimit`` wrapper needed."""

    metadata = {"render_modes": []}

    def __init__(self, episode_steps: int = 16) -> None:
        self.episode_steps = episode_steps
        self.observation_space = gymnasium.spaces.Box(0, 255, (SIZE, SIZE, 1), np.uint8)
        self.action_space = gymnasium.spaces.Discrete(2)
        self._side = 0
        self._t = 0

    def _frame(self) -> np.ndarray:
        self._side = int(self.np_random.integers(2))
        half = SIZE // 2
        row = self.np_random.integers(SIZE - BLOCK + 1)
        col = self._side * half + self.np_random.integers(half - BLOCK + 1)
        frame = np.zeros((SIZE, SIZE, 1), np.uint8)
        frame[row:row + BLOCK, col:col + BLOCK] = 255
        return frame

    def reset(self, *, seed: int | None = None,
              options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        self._t = 0
        return self._frame(), {}

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        reward = float(int(action) == self._side)
        self._t += 1
        return self._frame(), reward, False, self._t >= self.episode_steps, {}


def small_cnn() -> Any:
    """A custom torso for ``network="pixel_envs:small_cnn"``: one strided conv on frames scaled to
    [0, 1], flattened, and a 32-unit layer. Flax convs accept any number of leading batch axes."""
    import flax.linen as nn
    import jax.numpy as jnp

    return nn.Sequential([
        lambda x: x.astype(jnp.float32) / 255.0,
        nn.Conv(8, (4, 4), strides=(4, 4), padding="VALID"), nn.relu,
        lambda x: x.reshape((*x.shape[:-3], -1)),
        nn.Dense(32), nn.relu,
    ])


gymnasium.register(id="PixelChase-v0", entry_point=PixelChase)
