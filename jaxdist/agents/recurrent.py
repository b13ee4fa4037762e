"""Recurrent cores: the memory a network carries from one step of an episode to the next.

``core`` names one, as ``network`` names a torso: ``"lstm"`` (flax's ``OptimizedLSTMCell``),
``"gru"`` (``GRUCell``), each of ``core_size`` units, or ``"package.module:function"``
returning a fresh flax ``RNNCellBase`` (``cell(carry, x) -> (carry, y)`` and
``initialize_carry(rng, input_shape)``); ``"none"`` keeps the network feed-forward. The core sits
between the torso and the heads.

**One step, everywhere.** A core's step is ``(carry, x, first) -> (carry, y)``: where ``first``
(the row begins an episode) the carry is reset to the initial one (zeros), then the cell runs.
Acting (one step per call, a carry per env) and learning (:func:`unroll` over a trajectory from
the carry it started from, ``lax.scan`` over time) run this same step, so the learner sees the
states the actor had (the tests check the two agree to float precision). The carry a trajectory
starts from is the one its actor fed its first row, *before* that row's reset: the trajectory's
``first`` column says where to reset, row 0 included.
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from jaxdist.agents.experiment import import_factory

Carry = Any

BUILT_IN = ("lstm", "gru")


def cell(core: str, size: int) -> nn.RNNCellBase:
    """The recurrent cell ``core`` names (see the module docstring)."""
    if core == "lstm":
        return nn.OptimizedLSTMCell(size)
    if core == "gru":
        return nn.GRUCell(size)
    module = import_factory(core, "core")()
    if not isinstance(module, nn.RNNCellBase):
        raise TypeError(f"core {core!r} returned {type(module).__name__}, not a flax nn.RNNCellBase (a cell "
                        f"with initialize_carry): it must return a fresh recurrent cell")
    return module


def initial_carry(core: str, size: int, batch: int) -> Carry:
    """The carry a core starts an episode from, for ``batch`` envs (zeros for LSTM and GRU)."""
    return cell(core, size).initialize_carry(jax.random.key(0), (batch, size))


def reset(carry: Carry, first: jax.Array, initial: Carry) -> Carry:
    """``carry`` with the rows where ``first`` (``(batch,)``) replaced by ``initial``'s."""
    return jax.tree.map(lambda c, i: jnp.where(first.reshape(first.shape + (1,) * (c.ndim - 1)), i, c),
                        carry, initial)


class Step(nn.Module):
    """One step of a core over a batch: ``(carry, (x, first)) -> (carry, y)``, reset where first."""

    core: str
    size: int

    @nn.compact
    def __call__(self, carry: Carry, inputs: tuple[jax.Array, jax.Array]) -> tuple[Carry, jax.Array]:
        x, first = inputs
        recurrent = cell(self.core, self.size)
        initial = recurrent.initialize_carry(jax.random.key(0), (first.shape[0], self.size))
        return recurrent(reset(carry, first, initial), x)


class Unroll(nn.Module):
    """A core over sequences: ``(carry (B, ...), x (B, T, F), first (B, T)) -> (carry, y (B, T, size))``,
    its :class:`Step` scanned over time (the same parameters at every step)."""

    core: str
    size: int

    @nn.compact
    def __call__(self, carry: Carry, x: jax.Array, first: jax.Array) -> tuple[Carry, jax.Array]:
        scan = nn.scan(Step, variable_broadcast="params", split_rngs={"params": False}, in_axes=1, out_axes=1)
        return scan(self.core, self.size, name="step")(carry, (x, first))


__all__ = ["BUILT_IN", "Step", "Unroll", "cell", "initial_carry", "reset"]
