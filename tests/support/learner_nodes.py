"""A tiny MLP regression learner and batch sources for learner tests and the benchmark.

Module-level functions and dataclasses, so they pickle into spawned node processes.
"""

from __future__ import annotations

import dataclasses
import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxdist.learning import parallel
from jaxdist.nodes.learner import Learner, LearnerLogic

FEATURES, HIDDEN = 4, 16
_TX = optax.adam(1e-2)


def init(rng: jax.Array) -> dict:
    k1, k2 = jax.random.split(rng)
    params = {"w1": jax.random.normal(k1, (FEATURES, HIDDEN)) / FEATURES ** 0.5,
              "b1": jnp.zeros(HIDDEN),
              "w2": jax.random.normal(k2, (HIDDEN, 1)) / HIDDEN ** 0.5,
              "b2": jnp.zeros(1)}
    return {"params": params, "opt": _TX.init(params)}


def predict(params: dict, x: jax.Array) -> jax.Array:
    return (jnp.tanh(x @ params["w1"] + params["b1"]) @ params["w2"] + params["b2"])[:, 0]


def update(state: dict, batch: dict, rng: jax.Array, noise: float = 0.01) -> tuple[dict, dict]:
    x = batch["x"] + noise * jax.random.normal(rng, batch["x"].shape)  # uses the step's key

    def loss_fn(params):
        return jnp.mean((predict(params, x) - batch["y"]) ** 2)

    loss, grads = jax.value_and_grad(loss_fn)(state["params"])
    grads = parallel.pmean(grads)
    updates, opt = _TX.update(grads, state["opt"], state["params"])
    return {"params": optax.apply_updates(state["params"], updates), "opt": opt}, {"loss": loss}


def clean_update(state: dict, batch: dict, rng: jax.Array) -> tuple[dict, dict]:
    """Without input noise: under pmap every device would draw its own."""
    return update(state, batch, rng, noise=0.0)


LOGIC = LearnerLogic(init=init, update=update)
CLEAN_LOGIC = LearnerLogic(init=init, update=clean_update)


def make_batch(index: int, batch_size: int, seed: int = 0) -> dict:
    rng = np.random.default_rng((seed, index))
    x = rng.normal(size=(batch_size, FEATURES)).astype(np.float32)
    return {"x": x, "y": np.sin(x.sum(-1)).astype(np.float32)}


class SlowCommitLearner(Learner):
    """A learner whose saves take `COMMIT_DELAY` seconds longer to commit, as on a loaded
    machine: longer than the stop's grace of the tests that launch it."""

    COMMIT_DELAY = 3.0

    def _checkpoints(self, options):
        checkpointing = super()._checkpoints(options)
        commit = checkpointing.wait

        def slow_commit() -> None:
            time.sleep(self.COMMIT_DELAY)
            commit()

        checkpointing.wait = slow_commit
        return checkpointing


@dataclasses.dataclass
class RegressionBatches:
    """Batch ``i`` is ``make_batch(i, ...)``, for step ``i``. After batch ``limit - 1`` it blocks
    forever, so a learner fed by it sits at step ``limit`` (waiting for data) until it is
    stopped; a restored learner seeks it to its step, so it resumes with the next batch."""

    batch_size: int = 32
    limit: int | None = None
    seed: int = 0
    delay: float = 0.0

    def __post_init__(self) -> None:
        self._index = 0

    def seek(self, step: int) -> None:
        self._index = step

    def __call__(self) -> dict:
        if self.limit is not None and self._index >= self.limit:
            threading.Event().wait()
        if self.delay:
            time.sleep(self.delay)
        self._index += 1
        return make_batch(self._index - 1, self.batch_size, self.seed)


def produce_transitions(queue, count: int, chunk: int = 16) -> None:
    """Insert ``count`` single transitions {"x": (FEATURES,), "y": ()} into a replay node."""
    from jaxdist.nodes.replay import ReplayClient

    replay = ReplayClient(queue)
    for start in range(0, count, chunk):
        batch = make_batch(start, chunk, seed=1)
        replay.insert_many([{"x": batch["x"][i], "y": batch["y"][i]} for i in range(chunk)], timeout=60)


def launch_learner_script(run_dir: str, support_dir: str) -> str:
    """A user script that trains a learner until it is stopped (for preemption tests)."""
    return (
        "import sys; sys.path.insert(0, %r)\n"
        "import jaxdist as jd, learner_nodes as ln\n"
        "from jaxdist.nodes.learner import Learner, PublishOptions\n"
        "if __name__ == '__main__':\n"
        "    p = jd.Program('preempted')\n"
        "    with p.group('learner'):\n"
        "        p.add_node(jd.CourierNode(Learner, ln.LOGIC, ln.RegressionBatches(delay=0.02),\n"
        "                                  publishing=PublishOptions(log_every=1),\n"
        "                                  checkpointing=jd.CheckpointOptions()))\n"
        "    running = jd.launch(p, launcher='processes', run_dir=%r, echo=False,\n"
        "                        resources={'learner': {'env': {'JAX_PLATFORMS': 'cpu'}}})\n"
        "    print('launched', flush=True)\n"
        "    running.wait()\n"
        "    print('stopped:', running.stop_reason, flush=True)\n"
    ) % (support_dir, run_dir)
