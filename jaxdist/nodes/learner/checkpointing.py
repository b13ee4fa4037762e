"""A learner's checkpointing: its state and step saved on intervals and at its end, and the
latest restored when it starts, so steps, RNG streams and the published version carry on.

A part of its own because it is the one thing a learner does for its restarts, and it does
not depend on how batches arrive or where parameters go: a learner without it (a benchmark,
a test) simply has none. It saves what the step loop trains, in the layout the loop needs it
back: one copy of a ``pmap`` state (stacked per device), so any device count restores it.
"""

from __future__ import annotations

import dataclasses

from jaxdist.learning import parallel
from jaxdist.learning.checkpoint import Checkpointer
from jaxdist.learning.learner_logic import PyTree
from jaxdist.nodes.learner.steps import check_every, crossed


@dataclasses.dataclass(frozen=True)
class CheckpointOptions:
    """When a learner saves (``Learner(..., checkpointing=CheckpointOptions())``) and how many
    saves it keeps; ``async_save`` commits them on a thread while training goes on."""

    save_every_steps: int | None = 1000
    save_every_seconds: float | None = None
    keep: int = 3
    async_save: bool = True

    def __post_init__(self) -> None:
        check_every(save_every_steps=self.save_every_steps)


class Checkpointing:
    """Saves a learner's ``{"state", "step"}`` into ``directory`` as ``options`` say, for the
    step ``dp`` runs; ``restored_step`` is the latest saved one (None: a fresh start)."""

    def __init__(self, directory: str, options: CheckpointOptions, dp: parallel.DataParallel) -> None:
        self._dp = dp
        self._every_steps, self._every_seconds = options.save_every_steps, options.save_every_seconds
        # Step intervals are decided here (crossings, for steps_per_call > 1); time by Orbax.
        self._ckpt = Checkpointer(directory, save_every_seconds=options.save_every_seconds, keep=options.keep,
                                  async_save=options.async_save)
        self.restored_step = self._ckpt.latest_step()

    def restore(self, template: PyTree) -> PyTree:
        """The latest checkpoint shaped as ``template`` (``jax.eval_shape`` of the initial
        state), in the step's layout."""
        restored = self._ckpt.restore(self._dp.restore_layout(template))
        return restored if self._dp.mode == "jit" else self._dp.replicate(restored)

    def after_step(self, before: int, step: int, train: PyTree) -> bool:
        """Save ``train`` at ``step`` if an interval came round since ``before``; whether it did."""
        due = crossed(before, step, self._every_steps)
        return (due or self._every_seconds is not None) and self._ckpt.maybe_save(step, self._saveable(train),
                                                                                   force=due)

    def save(self, step: int, train: PyTree) -> None:
        """Save now, off the interval if need be (a stop, the end of training)."""
        self._ckpt.maybe_save(step, self._saveable(train), force=True)

    def wait(self) -> None:
        """Return once the saves started so far are committed."""
        self._ckpt.wait()

    def close(self) -> None:
        """Wait for the saves started, then release the checkpointer."""
        self._ckpt.close()

    def _saveable(self, train: PyTree) -> PyTree:
        return train if self._dp.mode == "jit" else self._dp.unreplicate(train)
