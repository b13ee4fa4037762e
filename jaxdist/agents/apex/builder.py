"""Ape-X DQN as a jaxdist program: ``make_program(config)``.

    learner/0   one process: the prioritized replay node and the generic Learner, colocated as
                threads (learner/0/0 the replay, learner/0/1 the learner, which also serves
                parameters). The learner samples ``{"keys", "data", "probabilities"}`` and after
                every update sends the sampled keys' new priorities back (``PriorityWriter``).
    actor/i     Actor nodes with epsilon_i, each a vector env of ``envs_per_actor`` envs; their
                sink (``acting.TransitionSink``) inserts n-step transitions with initial
                priorities; parameters come from the learner's ``get_params``.

Building the program has no side effects and imports no JAX (see the PPO builder). The actor
and learner classes here are factories, built where their node runs: that is where the replay
handle has become a client, which the sink and the priority writer need.
"""

from __future__ import annotations

import collections
import functools
import math
from concurrent import futures
from typing import Any

import numpy as np

import jaxdist as jd
from jaxdist.agents.apex.acting import EpsilonGreedy, TransitionSink
from jaxdist.agents.apex.config import ApexConfig, ApexHyperparams
from jaxdist.agents.common import actor_seed, cpu_resources
from jaxdist.envs import EnvSpec

REPLAY, LEARNER = "learner/0/0", "learner/0/1"


class ApexActor:
    """``ApexActor(policy, env, params, replay, gamma=..., n_step=..., **options)`` is the
    generic ``Actor`` whose sink inserts n-step transitions with priorities into ``replay``."""

    def __new__(cls, policy: Any, env: Any, params: Any, replay: Any, *, gamma: float, n_step: int,
                **options: Any) -> Any:
        from jaxdist.nodes.actor import Actor

        return Actor(policy, env, params, TransitionSink(replay, gamma, n_step), **options)

    def run(self) -> None:  # pragma: no cover - marks a node with work; the Actor's run() runs
        raise NotImplementedError


class ApexLearner:
    """``ApexLearner(hp, replay, batch_size, **options)`` is the generic ``Learner`` with Ape-X's
    ``learning.init`` / ``learning.update``, sampling ``batch_size`` transitions (with keys and
    probabilities) from ``replay`` per update and writing their new priorities back."""

    def __new__(cls, hp: ApexHyperparams, replay: Any, batch_size: int, **options: Any) -> Any:
        from jaxdist.nodes.learner import Learner

        return Learner(learner_logic(hp), replay, batch_size=batch_size, replay_options={"field": None},
                       after_update=PriorityWriter(replay), **options)

    def run(self) -> None:  # pragma: no cover - marks a node with work; the Learner's run() runs
        raise NotImplementedError


def learner_logic(hp: ApexHyperparams) -> Any:
    """Ape-X's ``LearnerLogic`` for the generic ``jaxdist.nodes.learner.Learner``."""
    from jaxdist.agents.apex import learning
    from jaxdist.nodes.learner import LearnerLogic

    return LearnerLogic(init=functools.partial(learning.init, hp), update=functools.partial(learning.update, hp))


class PriorityWriter:
    """The learner's ``after_update``: the new priorities of each sampled batch go back to the
    replay node from a thread of their own, in order, at most ``max_pending`` behind the
    learner. A failed write is reported and skipped: priorities are a hint, and the replay
    (colocated with the learner) only fails when the program stops or crashes."""

    def __init__(self, replay: Any, max_pending: int = 4) -> None:
        from jaxdist.nodes.replay import ReplayClient

        self._replay = ReplayClient(replay)
        self._executor = futures.ThreadPoolExecutor(1, thread_name_prefix="priority-writer")
        self._pending: collections.deque[futures.Future] = collections.deque()
        self._max_pending = max_pending
        self.errors = 0

    def __call__(self, batch: dict[str, Any], metrics: dict[str, Any]) -> None:
        while len(self._pending) >= self._max_pending:
            self._pending.popleft().result()
        self._pending.append(self._executor.submit(self._write, batch["keys"], metrics["priorities"]))

    def _write(self, keys: Any, priorities: Any) -> None:
        import jax

        try:
            self._replay.update_priorities(np.asarray(jax.device_get(keys)).ravel(),
                                           np.asarray(jax.device_get(priorities)).ravel())
        except Exception as exc:  # noqa: BLE001 - see the class docstring
            self.errors += 1
            if self.errors == 1:
                print(f"priority writer: updating priorities failed (learning goes on): {type(exc).__name__}: "
                      f"{str(exc).splitlines()[0] if str(exc) else ''}", flush=True)


def replay_table(config: ApexConfig) -> jd.replay.Prioritized:
    """The prioritized table, rate-limited to ``samples_per_insert``. Its window leaves room for
    every actor's largest insert (and one batch) on either side of the target ratio."""
    spi = config.samples_per_insert
    error_buffer = math.ceil(spi * config.num_actors * config.transitions_per_send + config.batch_size + spi)
    limiter = jd.replay.SampleToInsertRatio(spi, config.min_replay, error_buffer)
    return jd.replay.Prioritized(config.replay_size, config.priority_exponent, limiter, seed=config.seed)


def make_program(config: ApexConfig) -> jd.Program:
    hp = config.hyperparams()
    program = jd.Program(f"apex-{config.env_id.lower()}")
    replay, learner = jd.Handle(REPLAY), jd.Handle(LEARNER)
    learner_node = jd.CourierNode(
        ApexLearner, hp, replay, config.batch_size, publish_every=config.publish_every_updates, seed=config.seed,
        max_steps=config.total_updates, log_every=config.log_every_updates,
        checkpoint={"save_every_steps": config.checkpoint_every_updates, "keep": 2},
        prefetch=config.learner_prefetch)
    replay_node = jd.ReplayNode(replay_table(config), checkpoint=config.replay_checkpoint_seconds is not None,
                                checkpoint_every_seconds=config.replay_checkpoint_seconds)
    handles = program.add_node(jd.ColocationNode([replay_node, learner_node], mode="threads"), label="learner")
    assert [h.node_name for h in handles] == [REPLAY, LEARNER], handles
    env = EnvSpec(config.env_id, config.envs_per_actor, config.env_backend)
    with program.group("actor"):
        for i, epsilon in enumerate(config.epsilons()):
            program.add_node(jd.CourierNode(
                ApexActor, EpsilonGreedy(hp, epsilon), env, learner, replay, gamma=config.gamma,
                n_step=config.n_step, trajectory_length=config.trajectory_length, seed=actor_seed(config.seed, i),
                params_method="get_params", refresh_every_seconds=config.param_refresh_seconds,
                max_in_flight=config.max_in_flight, max_send_wait=60.0))
    return program


def restarts() -> dict[str, jd.Restart]:
    """Crashed nodes come back: the learner (with its replay, refilled by the actors) from its
    latest checkpoint, actors afresh; meanwhile the other actors keep acting."""
    return {"learner": jd.Restart(max_restarts=10, backoff=1.0), "actor": jd.Restart(max_restarts=10, backoff=0.5)}


def resources(config: ApexConfig, compilation_cache: str | None = None) -> dict[str, dict[str, Any]]:
    """Per-group environment for the processes launcher (see ``common.cpu_resources``)."""
    return cpu_resources(("learner", "actor"), compilation_cache)
