"""A small continuous-control env record and replay transitions for SAC's and TD3's math tests."""

from __future__ import annotations

import numpy as np

from jaxdist.envs.spaces import ActionSpace, EnvInfo

ENV = EnvInfo((3,), "float32", ActionSpace(shape=(2,), low=(-2.0, 0.0), high=(2.0, 1.0)))


def transitions(n: int = 8, seed: int = 0) -> dict[str, np.ndarray]:
    """``n`` random transitions as the replay stores them (env-scale actions, some terminal)."""
    rng = np.random.default_rng(seed)
    return {"obs": rng.normal(size=(n, 3)).astype(np.float32),
            "action": rng.uniform(ENV.action.low, ENV.action.high, size=(n, 2)).astype(np.float32),
            "reward": rng.normal(size=n).astype(np.float32),
            "discount": np.where(rng.random(n) < 0.2, 0.0, 0.99).astype(np.float32),
            "next_obs": rng.normal(size=(n, 3)).astype(np.float32)}
