"""A network of your own: ``--network my_networks:torso`` calls ``torso()``, which returns a flax
module mapping observations to features; the agent adds its heads (policy and value, or Q)."""

from __future__ import annotations

import flax.linen as nn
import jax


class GatedTorso(nn.Module):
    """Two ReLU layers whose second is gated by a sigmoid of the first (any flax module works)."""

    width: int = 64

    @nn.compact
    def __call__(self, obs: jax.Array) -> jax.Array:
        x = nn.relu(nn.Dense(self.width)(obs.astype("float32")))
        return nn.relu(nn.Dense(self.width)(x)) * nn.sigmoid(nn.Dense(self.width)(x))


def torso() -> nn.Module:
    return GatedTorso()
