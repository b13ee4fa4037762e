"""The full-state resume checks. In a process: every architecture's learner, stopped at a step
and restored from its checkpoint, goes on exactly as one that never stopped. Across a SIGTERM
and a relaunch: what a checkpoint holds on disk (a learner's, a replay node's), read as written,
against what the relaunched nodes restored (written down by ``restore_observer``), leaf for leaf."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import chex
import jax
import numpy as np

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


def saved_state(directory: str, step: int | None = None) -> tuple[int, Any]:
    """(step, the tree a learner's Orbax checkpoint in `directory` holds at `step`, default the
    latest), read from disk as it was written, as numpy arrays (typed PRNG keys as their key
    data), whatever devices wrote it: what a relaunch finds there."""
    import orbax.checkpoint as ocp

    step = committed_steps(directory)[-1] if step is None else step
    path, checkpointer = os.path.join(directory, str(step), "default"), ocp.PyTreeCheckpointer()
    as_numpy = jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray),
                            checkpointer.metadata(path).item_metadata.tree)
    return step, checkpointer.restore(path, args=ocp.args.PyTreeRestore(restore_args=as_numpy))


def saved_tables(directory: str, step: int) -> tuple[dict[str, np.ndarray], dict]:
    """A replay node's checkpoint of `step` in `directory`, as written: its arrays (leaves by path)
    and its JSON part (counters, kinds, the items' structure)."""
    import orbax.checkpoint as ocp

    options = ocp.CheckpointManagerOptions(read_only=True, create=False, cleanup_tmp_directories=False)
    with ocp.CheckpointManager(directory, options=options) as manager:
        saved = manager.restore(step, args=ocp.args.Composite(arrays=ocp.args.StandardRestore(),
                                                              meta=ocp.args.JsonRestore()))
    return flat_leaves(saved["arrays"]), saved["meta"]


def committed_steps(directory: str) -> list[int]:
    return sorted(int(name) for name in os.listdir(directory) if name.isdigit()) if os.path.isdir(directory) else []


def flat_leaves(tree: Any) -> dict[str, np.ndarray]:
    """`tree`'s leaves on the host by their path ("state/opt_state/1/0/count": a NamedTuple's field
    named as Orbax's checkpoint, a dict, names it): comparable leaf for leaf, and storable (npz)."""
    return {"/".join(str(getattr(key, "key", getattr(key, "name", getattr(key, "idx", key)))) for key in path):
            host_leaf(leaf) for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]}


def host_leaf(x: Any) -> np.ndarray:
    """A leaf on the host: typed PRNG keys as their key data; a replicated array of a learner
    spanning processes as this process's copy of it."""
    if isinstance(x, jax.Array):
        if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
            x = jax.random.key_data(x)
        return np.asarray(x.addressable_data(0))
    return np.asarray(x)


def assert_same_leaves(got: dict[str, np.ndarray], saved: dict[str, np.ndarray], what: str) -> None:
    """The same paths, and at each the same dtype, shape and bytes."""
    assert sorted(got) == sorted(saved), f"{what}: leaves {sorted(set(got) ^ set(saved))} are in only one of them"
    for path in saved:
        np.testing.assert_array_equal(got[path], saved[path], err_msg=f"{what}: {path}", strict=True)


def observed_environment(directory: str) -> dict[str, str]:
    """This environment, with which a launch's node processes write what they restore into
    `directory` (see ``restore_observer/sitecustomize.py``)."""
    support = os.path.dirname(os.path.abspath(__file__))
    return dict(os.environ, JAXDIST_TEST_RESTORES=directory, PYTHONPATH=os.pathsep.join(
        [os.path.join(support, "restore_observer"), support, os.environ.get("PYTHONPATH", "")]))


def rows_so_far(path: Any) -> list[dict]:
    """The rows of a metrics file a running launch writes: none yet, or none while caught mid-write."""
    from jaxdist.records.metrics import read_metrics

    try:
        return read_metrics(path)
    except (OSError, ValueError):
        return []
