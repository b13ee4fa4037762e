"""Items and programs for replay node tests; a module of its own so spawned processes can import it."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

import jaxdist as jd
from jaxdist import courier
from jaxdist.nodes.replay import Fifo, Prioritized, ReplayNode, Uniform


class Step(NamedTuple):
    obs: np.ndarray
    reward: np.ndarray


STEP_NAME = "tests.replay_nodes.Step"
courier.register(Step, STEP_NAME)


def chunk(writer: int, seq: int) -> dict:
    """A small trajectory chunk whose contents name who wrote it: ``id`` is [writer, seq]."""
    return {
        "id": np.array([writer, seq], np.int64),
        "step": Step(np.full((2, 3), seq, np.float32), np.array([writer, seq], np.float32)),
    }


def ids(data: dict) -> list[tuple[int, int]]:
    """The [writer, seq] pairs of a stacked batch, as tuples."""
    return [tuple(int(v) for v in row) for row in np.asarray(data["id"])]


def restart_program(run_dir_name: str = "replay-restart") -> jd.Program:
    """The same program each time it is built, so a relaunch finds the first launch's checkpoints."""
    program = jd.Program(run_dir_name)
    with program.group("replay"):
        program.add_node(ReplayNode({"queue": Fifo(64), "prio": Prioritized(100, priority_exponent=1.0, seed=0),
                                     "recent": Uniform(8, seed=1)},
                                    checkpoint=True, registered_types=((Step, STEP_NAME),)))
    return program
