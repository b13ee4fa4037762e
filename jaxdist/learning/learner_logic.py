"""What a learner learns, apart from the node that runs it: the agents' learning modules build a
``LearnerLogic`` and the processes that only need its shapes (an actor compiling its trajectory
ahead of the first parameters) import this, not the learner node with its checkpointing."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import jax

from jaxdist.learning import parallel

PyTree = Any


def state_params(state: PyTree) -> PyTree:
    """The default ``LearnerLogic.params``: ``state["params"]`` or ``state.params``."""
    return state["params"] if isinstance(state, Mapping) else state.params


@dataclasses.dataclass(frozen=True)
class LearnerLogic:
    """What a learner learns: pure, jittable functions over a state pytree.

    ``init(rng) -> state``; ``update(state, batch, rng) -> (state, metrics)`` for the global
    batch (call ``parallel.pmean`` on gradients to also run under ``mode="pmap"``; metrics are
    scalars, or per-example arrays under jit, logged as their mean); ``params(state) -> pytree``
    is what gets published.
    """

    init: Callable[[jax.Array], PyTree]
    update: parallel.Update
    params: Callable[[PyTree], PyTree] = state_params
