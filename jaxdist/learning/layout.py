"""Where a node's checkpoints live in a run directory, in a module free of JAX and Orbax: the
launching process finds a run's saved state with it (is the run over, where is its best
policy) without importing either; and PBT's lineage, which it plots."""

from __future__ import annotations

import os


def checkpoint_dir(run_dir: str | os.PathLike, node_name: str) -> str:
    """``<run_dir>/checkpoints/<node_name>`` as an absolute path (Orbax wants one)."""
    return os.path.abspath(os.path.join(run_dir, "checkpoints", node_name))


LINEAGE = "lineage"
"""``<run_dir>/lineage.csv``: a PBT learner's members, their parents and hyperparameters by update."""


def saved_update(checkpoints: str) -> int | None:
    """The newest complete learner checkpoint's update in ``checkpoints`` (after a stop, the one it saved)."""
    try:
        steps = [int(name) for name in os.listdir(checkpoints) if name.isdigit()]
    except OSError:
        return None
    return max(steps, default=None)
