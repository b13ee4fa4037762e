"""What a learner's step is, for the loop and the parts that act on steps: the state the loop
trains and checkpoints (the algorithm's state and a step counter), the update that advances
the counter and draws the step's key from it, and when an interval of steps comes round.

Steps count SGD updates: a dispatch of ``steps_per_call`` scanned updates advances the step by
that many, so an interval fires when the step *crosses* one of its multiples, not only when it
lands on one.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from jaxdist.learning import parallel
from jaxdist.learning.learner_logic import LearnerLogic, PyTree


def initial_state(logic: LearnerLogic, init_key: jax.Array) -> PyTree:
    """What a learner checkpoints, before its first step: its state and step. A restore (the
    learner's, ``load_policy``'s) needs only its shapes: ``jax.eval_shape`` of this."""
    return {"state": logic.init(init_key), "step": jnp.zeros((), jnp.int32)}


@dataclasses.dataclass(frozen=True)
class CountedUpdate:
    """The user's update with the step counter kept in the state and the RNG folded by it, so
    a resumed run draws the keys an uninterrupted one would."""

    update: parallel.Update

    def __call__(self, train: PyTree, batch: PyTree, rng: jax.Array) -> tuple[PyTree, PyTree]:
        key = jax.random.wrap_key_data(jax.random.fold_in(rng, train["step"]))
        state, metrics = self.update(train["state"], batch, key)
        return {"state": state, "step": train["step"] + 1}, metrics


def crossed(before: int, after: int, every: int | None) -> bool:
    """Whether going from step ``before`` to ``after`` passed a multiple of ``every`` (None: never)."""
    return every is not None and after // every > before // every


def check_every(**intervals: int | None) -> None:
    """Refuse an interval below 1 by its name; None means never."""
    for name, every in intervals.items():
        if every is not None and every < 1:
            raise ValueError(f"{name} must be >= 1 or None, got {every}")
