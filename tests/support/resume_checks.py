"""The full-state resume check every architecture's learner gets: stopped at a step and restored
from its checkpoint, it goes on exactly as one that never stopped."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import chex
import jax

from jaxdist.nodes.learner import CheckpointOptions, Learner, PublishOptions


def train(logic: Any, source: Any, run_dir: str, max_steps: int) -> tuple[int | None, Any]:
    """A learner on `run_dir` (restoring what it holds) to `max_steps`, saved there at its end:
    the step it restored (None: a fresh start) and its state on the host."""
    learner = Learner(logic, source, max_steps=max_steps, name="learner/0", run_dir=run_dir,
                      publishing=PublishOptions(every=None, log_every=None, metrics=None),
                      checkpointing=CheckpointOptions(save_every_steps=10**6, async_save=False))
    learner.run()  # saves its last step
    restored, state = learner.restored_step, jax.device_get(learner._train)
    learner.close()
    return restored, state


def assert_resumes_exactly(logic: Any, make_source: Callable[[], Any], tmp_path: Any, stop: int = 3,
                           end: int = 6) -> Any:
    """Train to `stop`, restore and train on to `end`; and train to `end` uninterrupted: the two
    states are equal, leaf for leaf. Anything a checkpoint left out (started afresh on restore)
    makes them differ. Returns the resumed state."""
    assert train(logic, make_source(), str(tmp_path / "stopped"), stop)[0] is None
    restored, resumed = train(logic, make_source(), str(tmp_path / "stopped"), end)
    fresh, whole = train(logic, make_source(), str(tmp_path / "whole"), end)
    assert (restored, fresh) == (stop, None)
    chex.assert_trees_all_equal(resumed, whole)
    return resumed


def saved_state(directory: str, step: int | None = None, item: str = "default") -> tuple[int, Any]:
    """(step, the tree an Orbax checkpoint in `directory` holds at `step`, default the latest), read
    from disk as it was written, without a template (typed PRNG keys as their key data): what a
    relaunch finds there."""
    import os

    import orbax.checkpoint as ocp

    steps = sorted(int(name) for name in os.listdir(directory) if name.isdigit())
    step = steps[-1] if step is None else step
    tree = ocp.StandardCheckpointer().restore(os.path.join(directory, str(step), item))
    return step, host_tree(tree)


def host_tree(tree: Any) -> Any:
    """`tree` on the host, typed PRNG keys as their key data: comparable leaf for leaf."""
    return jax.device_get(jax.tree.map(
        lambda x: jax.random.key_data(x) if isinstance(x, jax.Array) and jax.dtypes.issubdtype(
            x.dtype, jax.dtypes.prng_key) else x, tree))
