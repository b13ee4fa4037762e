"""Anakin (Hessel et al., 2021, "Podracer architectures"): acting, learning and evaluation in one
jitted function, for environments written in JAX (:mod:`jaxdist.envs.jax_envs`).

An on-policy agent's update already takes a batch of ``B`` trajectories of ``T + 1`` rows. Here
the batch is not sent by actors: every update first plays ``T`` steps of ``B`` envs with the
current parameters, the rollout the actors' JAX backend plays (``jax_rollout.play``: policy on
the batch, env ``vmap``-ed, the steps under ``lax.scan``, autoreset inside), then runs the
agent's own update on it. So the agent's math is shared by both architectures, and the generic
:class:`~jaxdist.nodes.learner.Learner` runs the loop: its checkpoints (which hold the envs
too), metrics, publishing and stops are the distributed mode's. As an actor's, a trajectory's
first row is the previous one's last, its action chosen then, by the parameters one update
older: that row's policy lag is 1, every other row's 0.

**Devices.** Under the learner's ``pmap`` each device plays its own ``B / devices`` of the envs
and gradients are averaged. Every device keeps the state of all ``B`` envs but advances only its
slice, so a checkpoint (one device's copy) restores on any number of devices.

**Seeds.** ``num_seeds`` independent runs (PureJaxRL's many seeds at once): the whole state and
update are ``vmap``-ed over a leading seed axis; metrics are logged per seed
(``seed/<i>/<name>``) beside their mean over seeds, and the published parameters carry the
seed axis.

**Evaluation** happens inside the update: every ``eval_every`` updates each seed's
deterministic policy plays ``eval_episodes`` whole episodes from fresh start states (one
``lax.scan`` of the env's ``max_steps``), and the returns come out as the metric
``eval_returns``; so does the learner's last update, whatever the interval (the policy training
ends with is always evaluated). Each seed's best evaluated parameters stay in the state
(``best``), so its checkpoints hold them for ``load_policy(run_dir, best=True)``.
:class:`~jaxdist.nodes.evaluator.EvaluationRecorder`, the learner's ``after_update``, writes the
returns to ``evaluations.csv`` as the evaluator node does for the distributed mode, and stops the
program at the target.

**Sweeps** (:mod:`jaxdist.agents.sweep`): with ``swept``, runs differ in hyperparameters as
well. The state's ``hyperparams`` hold each run's values (field -> one per run), and each run
learns by ``swept.logic(its values)``: traced values, so every configuration shares one compiled
update. Run ``r`` takes seed ``r % num_seeds``'s keys. With ``swept.pbt`` the runs are a
population: every ``pbt.interval`` updates all are evaluated and the PBT step
(:mod:`jaxdist.learning.pbt`) copies and explores; its parents and values come out as the metrics
``pbt/parent`` and ``pbt/<field>``.

**Env steps** are counted where they are made: every update reports the ``env_steps`` it
played (all hosts', per seed) as a metric, which the learner sums.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxdist.envs import jax_envs, jax_rollout

from jaxdist.learning import parallel
from jaxdist.launch import context
from jaxdist.records.metrics import MetricsWriter, metrics_path
from jaxdist.nodes.evaluator import EVALUATIONS, record
from jaxdist.learning import pbt as pbt_step
from jaxdist.learning.learner_logic import LearnerLogic

PyTree = Any


@dataclasses.dataclass(frozen=True)
class PBT:
    """Population-based training over the swept fields: every ``interval`` updates."""

    interval: int
    fraction: float
    explore: str
    ranges: Mapping[str, pbt_step.Range]
    exploit: bool = True


@dataclasses.dataclass(frozen=True)
class Swept:
    """Hyperparameters that differ between runs: ``values`` (field -> a value per run) and
    ``logic(values)``, the agent's logic with (traced) values in place; ``pbt``, if the runs are
    a population."""

    values: Mapping[str, Sequence[float]]
    logic: Callable[[dict[str, jax.Array]], LearnerLogic]
    pbt: PBT | None = None


def logic(agent_logic: LearnerLogic, policy: Any, evaluation_policy: Any, env_id: str, num_envs: int, length: int,
          *, num_seeds: int = 1, eval_every: int = 10, eval_episodes: int = 10,
          final_version: int | None = None, swept: Swept | None = None) -> LearnerLogic:
    """The ``LearnerLogic`` of Anakin over ``agent_logic``: ``num_envs`` envs of ``env_id``'s JAX
    port acted by ``policy`` (``(params, obs, key) -> (action, {"logp": ...})`` on
    ``agent_logic.params``), ``length`` steps a trajectory, ``num_seeds`` runs at once, and
    ``evaluation_policy`` (deterministic) evaluated every ``eval_every`` updates and from
    ``final_version`` (the learner's ``max_steps``) on, so that the last is; ``swept``: runs of
    other hyperparameters too (the module docstring)."""
    env = jax_envs.jax_env(env_id)
    return LearnerLogic(
        init=jax.jit(functools.partial(_init, agent_logic, policy, env, num_envs, num_seeds, swept)),  # one compile
        update=functools.partial(_update, agent_logic, policy, evaluation_policy, env, length, eval_every,
                                 eval_episodes, final_version, num_seeds, swept),
        params=lambda state: jax.vmap(agent_logic.params)(state["agent"]))


def no_batch() -> dict:
    """The learner's batch source under Anakin: the batch is made inside the update."""
    return {}


def _init(agent_logic: LearnerLogic, policy: Any, env: jax_envs.JaxEnv, num_envs: int, num_seeds: int,
          swept: Swept | None, rng: jax.Array) -> dict[str, PyTree]:
    def one_seed(key: jax.Array) -> dict[str, PyTree]:
        agent_key, env_key = jax.random.split(key)
        agent = agent_logic.init(agent_key)
        best = {"return": jnp.float32(-jnp.inf), "version": jnp.int32(-1), "params": agent_logic.params(agent)}
        envs = jax_rollout.start(policy, env, agent_logic.params(agent), num_envs, env_key)
        return {"agent": agent, "envs": envs, "best": best}

    # One seed after another, not vmapped: jaxlib's CPU QR (the orthogonal initialiser) splits a
    # batch of matrices over the intra-op thread pool and blocks its pool thread until they are
    # done, so two batched ones at once on a two-core machine waited on each other for ever.
    state = jax.lax.map(one_seed, jax.random.split(rng, num_seeds))
    if swept is None:
        return state
    runs = _runs(swept)
    state = jax.tree.map(lambda leaf: leaf[np.arange(runs) % num_seeds], state)  # run r: seed r % num_seeds's
    return {**state, "hyperparams": {name: jnp.asarray(values, jnp.float32) for name, values in swept.values.items()}}


def _runs(swept: Swept) -> int:
    return len(next(iter(swept.values.values())))


def _update(agent_logic: LearnerLogic, policy: Any, evaluation_policy: Any, env: jax_envs.JaxEnv, length: int,
            eval_every: int, eval_episodes: int, final_version: int | None, num_seeds: int, swept: Swept | None,
            state: dict[str, PyTree], batch: dict, rng: jax.Array) -> tuple[dict[str, PyTree], dict[str, jax.Array]]:
    del batch  # made here
    runs = jax.tree.leaves(state["agent"])[0].shape[0]
    learn_keys = jax.random.split(rng, num_seeds)[np.arange(runs) % num_seeds]
    eval_key, pbt_key = jax.random.fold_in(rng, num_seeds), jax.random.fold_in(rng, num_seeds + 1)
    hyperparams = state.get("hyperparams", {})
    logic_of = (lambda _: agent_logic) if swept is None else swept.logic  # noqa: E731

    def learn(agent: PyTree, envs: PyTree, values: dict[str, jax.Array], key: jax.Array) -> tuple:
        return _learn_one_seed(logic_of(values), policy, env, length, agent, envs, key)

    agent, envs, metrics = jax.vmap(learn)(state["agent"], state["envs"], hyperparams, learn_keys)
    version = agent["version"][0]  # every seed's: they update together
    population = None if swept is None else swept.pbt

    def evaluate_all() -> jax.Array:
        reset_key, act_key = jax.random.split(eval_key)
        play = lambda params: jax_rollout.episodes(evaluation_policy, env, params,  # noqa: E731
                                                   jax.random.split(reset_key, eval_episodes), act_key)[0]
        return jax.vmap(play)(jax.vmap(agent_logic.params)(agent)).astype(jnp.float32)

    nothing = jnp.full((runs, eval_episodes), jnp.nan, jnp.float32)
    due = version % eval_every == 0
    if final_version is not None:
        due |= version >= final_version
    if population is not None:
        due |= version % population.interval == 0
    eval_returns = jax.lax.cond(due, evaluate_all, lambda: nothing)
    best = keep_best(state["best"], eval_returns, version, jax.vmap(agent_logic.params)(agent))
    pbt_metrics = {}
    if population is not None and population.exploit:
        step = functools.partial(pbt_step.exploit_and_explore, pbt_key, jnp.mean(eval_returns, axis=1),
                                 fraction=population.fraction, rule=population.explore, ranges=population.ranges)
        agent, hyperparams, parents = jax.lax.cond(version % population.interval == 0, step,
                                                   lambda a, h: (a, h, jnp.arange(runs)), agent, hyperparams)
        pbt_metrics["pbt/parent"] = parents
    if population is not None:
        pbt_metrics.update({f"pbt/{name}": values for name, values in hyperparams.items()})
        pbt_metrics.setdefault("pbt/parent", jnp.arange(runs))
    logged = {name: jnp.nanmean(value) if name == "episode_return" else jnp.mean(value)
              for name, value in metrics.items()}
    num_envs = jax.tree.leaves(state["envs"])[0].shape[1]  # this host's, of each seed
    logged["env_steps"] = jnp.int32(num_envs * length * jax.process_count())
    if runs > 1:
        logged.update({f"seed/{i}/{name}": value[i] for name, value in metrics.items() for i in range(runs)})
    new_state = {"agent": agent, "envs": envs, "best": best}
    if swept is not None:
        new_state["hyperparams"] = hyperparams
    return new_state, dict(logged, **pbt_metrics, version=version, eval_returns=eval_returns)


def keep_best(best: dict[str, PyTree], eval_returns: jax.Array, version: jax.Array,
              params: PyTree) -> dict[str, PyTree]:
    """Each seed's best evaluated policy so far (``return``, ``version``, ``params``), kept in the
    state: the evaluated parameters never leave the device, and the learner's checkpoints hold
    them for ``load_policy(run_dir, best=True)``. ``eval_returns`` is NaN where nothing was
    evaluated, which is never better."""
    mean = jnp.mean(eval_returns, axis=1)
    better = mean > best["return"]
    return {"return": jnp.where(better, mean, best["return"]), "version": jnp.where(better, version, best["version"]),
            "params": jax.tree.map(lambda new, old: jnp.where(jax_rollout.per_row(better, new), new, old),
                                   params, best["params"])}


def _learn_one_seed(agent_logic: LearnerLogic, policy: Any, env: jax_envs.JaxEnv, length: int,
                    agent: dict[str, PyTree], envs: dict[str, PyTree],
                    rng: jax.Array) -> tuple[dict[str, PyTree], dict[str, PyTree], dict[str, jax.Array]]:
    """One seed's update: this device plays its slice of the envs, then the agent learns."""
    act_key, learn_key = jax.random.split(jax.random.fold_in(rng, parallel.shard_index()))
    num_envs, devices = jax.tree.leaves(envs)[0].shape[0], parallel.shard_count()
    if num_envs % devices:
        raise ValueError(f"architecture='anakin' plays {num_envs} envs per learner host, which do not split over "
                         f"its {devices} devices: make num_actors x envs_per_actor a multiple of {devices} per host")
    per_device = num_envs // devices
    start = parallel.shard_index() * per_device
    mine = jax.tree.map(lambda x: jax.lax.dynamic_slice_in_dim(x, start, per_device), envs)
    mine, trajectories, (returns, _, ended) = jax_rollout.play(policy, env, agent_logic.params(agent), mine, act_key,
                                                               length)
    envs = jax.tree.map(lambda full, part: jax.lax.dynamic_update_slice_in_dim(full, part, start, 0), envs, mine)
    # Row 0's action was chosen as the previous trajectory ended, by the parameters of an update ago.
    versions = jnp.full(trajectories["reward"].shape, agent["version"], jnp.int32)
    trajectories["version"] = versions.at[:, 0].set(jnp.maximum(agent["version"] - 1, 0))
    agent, metrics = agent_logic.update(agent, trajectories, learn_key)
    total, count = parallel.pmean((jnp.sum(jnp.where(ended, returns, 0.0)), jnp.sum(ended).astype(jnp.float32)))
    metrics = dict(metrics, episodes=count * parallel.shard_count(),
                   episode_return=jnp.where(count > 0, total / jnp.where(count > 0, count, 1.0), jnp.nan))
    return agent, envs, metrics
