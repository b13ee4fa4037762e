"""Acting with a trained policy: ``load_policy(run_dir)`` rebuilds an agent from the config saved
in its run directory and restores the latest learner checkpoint (ES: the master's mean
parameters), outside any program.

    policy = jaxdist.agents.load_policy("runs/ppo-cartpole-seed0")
    actions = policy.act(observations)            # a batch in, a batch out (deterministic)
"""

from __future__ import annotations

import functools
import importlib
import os
from typing import Any

import numpy as np

from jaxdist.agents import config as configs
from jaxdist.agents import distributed

AGENTS = {"ppo": ("jaxdist.agents.ppo", "PPOConfig"), "impala": ("jaxdist.agents.impala", "IMPALAConfig"),
          "apex": ("jaxdist.agents.apex", "ApexConfig"), "es": ("jaxdist.agents.es", "ESConfig")}
"""Agent name (as saved in ``config.json``) -> (its package, its config class)."""


class TrainedPolicy:
    """A trained agent's policy at one checkpoint: ``act(observations)`` for a batch of
    observations (``(N, *obs_shape)``) returns ``N`` actions; ``deterministic=False`` samples
    (or explores) as actor 0 did (ES's policy is deterministic either way: it explores in
    parameter space). ``policies`` are the actors' policy callables, by ``deterministic``."""

    def __init__(self, agent: Any, params: Any, step: int, policies: dict[bool, Any], obs_shape: tuple[int, ...],
                 seed: int = 0) -> None:
        import jax

        from jaxdist.nodes.actor import jitted_step

        self.agent, self.config, self.step = agent, agent.config, step
        self._params = jax.device_put(params)
        self._steps = {deterministic: jitted_step(policy) for deterministic, policy in policies.items()}
        self._obs_shape = tuple(obs_shape)
        self._key = jax.random.key_data(jax.random.key(seed))

    @property
    def env_id(self) -> str:
        return self.config.env_id

    def act(self, observations: Any, deterministic: bool = True) -> np.ndarray:
        observations = np.asarray(observations)
        if observations.shape[1:] != self._obs_shape:
            raise ValueError(f"act() takes a batch of observations shaped (N, {', '.join(map(str, self._obs_shape))})"
                             f" for {self.env_id}; got {observations.shape} (add a leading axis for one observation)")
        self._key, action, _ = self._steps[deterministic](self._params, observations, self._key)
        return np.asarray(action)


def load_policy(run_dir: str, step: int | None = None, seed: int = 0, run_seed: int = 0,
                best: bool = False) -> TrainedPolicy:
    """The policy of the run in ``run_dir``: its saved config, its learner's latest checkpoint
    (or ``step``); of a run of several seeds at once (``num_seeds``), seed ``run_seed``'s; with
    ``best``, that of the run's best evaluation (saved by the evaluator node of actor-learner
    runs; kept for each seed in an Anakin run's checkpoints).
    ``seed`` seeds the sampling of ``act(..., deterministic=False)``."""
    name, saved = configs.load(run_dir)
    if name not in AGENTS:
        raise ValueError(f"{run_dir} was trained by agent {name!r}; load_policy knows {', '.join(AGENTS)}")
    package, config_class = AGENTS[name]
    module = importlib.import_module(package)
    agent = module.agent(configs.from_dict(getattr(module, config_class), saved))
    seeds = getattr(agent.config, "num_seeds", 1)  # ES trains one
    if not 0 <= run_seed < seeds:
        raise ValueError(f"{run_dir} trained {seeds} seed(s) at once (num_seeds): run_seed must be "
                         f"{'0' if seeds == 1 else f'0 to {seeds - 1}'}, got {run_seed}")
    anakin = getattr(agent.config, "architecture", None) == "anakin"
    if best and not anakin:
        return _best_policy(run_dir, agent, seed)
    if name == "es":
        return _es_policy(run_dir, agent, step, seed)
    return _learner_policy(run_dir, agent, step, seed, run_seed, best)


def _learner_policy(run_dir: str, agent: Any, step: int | None, seed: int, run_seed: int,
                    best: bool = False) -> TrainedPolicy:
    """An actor-learner agent's: the learner's published parameters, the actors' policy; under
    Anakin, with ``best``, the best evaluated parameters its state keeps for each seed."""
    import jax

    from jaxdist.nodes.learner import initial_state

    anakin = agent.config.architecture == "anakin"
    logic = distributed.anakin_logic(agent) if anakin else agent.learner_logic(agent.config, agent.env)
    template = jax.eval_shape(functools.partial(initial_state, logic), jax.random.key(0))
    restored = _restore(run_dir, agent, template, step, f"{agent.config.checkpoint_every_updates} updates")
    params, version = logic.params(restored["state"]), int(restored["step"])
    if best:
        kept = restored["state"]["best"]
        params, version = kept["params"], int(kept["version"][run_seed])
        if version < 0:
            raise FileNotFoundError(f"{run_dir} has no best policy yet: seed {run_seed} of this Anakin run was not "
                                    f"evaluated before its latest checkpoint; load that checkpoint's (best=False)")
    if anakin:  # its parameters carry a leading seed axis
        params = jax.tree.map(lambda leaf: leaf[run_seed], params)
    return TrainedPolicy(agent, params, version, _policies(agent), agent.env.obs_shape, seed)


def _best_policy(run_dir: str, agent: Any, seed: int) -> TrainedPolicy:
    """The parameters the evaluator saved at the run's best evaluation."""
    from jaxdist.learning.checkpoint import checkpoint_dir
    from jaxdist.nodes.evaluator import BEST_POLICY

    no_best = FileNotFoundError(f"{run_dir} has no best policy: the evaluator node saves one at each better "
                                f"evaluation, in actor-learner runs (not ES; Anakin's checkpoints keep it); load the "
                                f"latest checkpoint's instead (best=False)")
    version, params = _restore_from(checkpoint_dir(run_dir, BEST_POLICY), distributed.published_shapes(agent), None,
                                    no_best)
    return TrainedPolicy(agent, params, version, _policies(agent), agent.env.obs_shape, seed)


def _policies(agent: Any) -> dict[bool, Any]:
    """The deterministic policy (evaluation's) and actor 0's, by ``deterministic``."""
    return {deterministic: agent.policy(agent.config, agent.env, None if deterministic else 0)
            for deterministic in (True, False)}


def _es_policy(run_dir: str, agent: Any, step: int | None, seed: int) -> TrainedPolicy:
    """ES's: the master's mean parameters, played greedily by its flat-vector MLP."""
    from jaxdist.agents.es import search

    rollouts = search.Rollouts(agent.config)
    restored = _restore(run_dir, agent, search.initial_state(agent.config, rollouts.policy), step,
                        f"{agent.config.checkpoint_every_generations} generations")
    policy = rollouts.policy
    return TrainedPolicy(agent, restored["theta"], int(restored["generation"]), {True: policy, False: policy},
                         (rollouts.dynamics.obs_size,), seed)


def _restore(run_dir: str, agent: Any, template: Any, step: int | None, every: str) -> Any:
    """The learner's checkpoint of ``step`` (default: the latest), shaped as ``template``; the
    learner saves every ``every`` ("10 updates")."""
    no_checkpoint = FileNotFoundError(f"{run_dir} has no complete learner checkpoint yet: train longer (the learner "
                                      f"saves every {every} and at a stop)")
    return _restore_from(_learner_checkpoints(run_dir, agent), template, step, no_checkpoint)[1]


def _restore_from(directory: str, template: Any, step: int | None, missing: Exception) -> tuple[int, Any]:
    """(step, the checkpoint of ``step`` in ``directory``, default the latest), shaped as
    ``template``; ``missing`` is raised when there is none."""
    from jaxdist.learning.checkpoint import Checkpointer

    if not os.path.isdir(directory):  # a Checkpointer would create it: reading a run must not change it
        raise missing
    with Checkpointer(directory) as checkpointer:
        latest = checkpointer.latest_step()
        if latest is None:
            raise missing
        step = latest if step is None else step
        return step, checkpointer.restore(template, step)


def _learner_checkpoints(run_dir: str, agent: Any) -> str:
    """Where the learner saved: its node's directory, or, for a learner spanning hosts, its
    group's (shared by all its processes)."""
    from jaxdist.learning.checkpoint import checkpoint_dir

    node = agent.topology().learner.node_name
    single = checkpoint_dir(run_dir, node)
    return single if os.path.isdir(single) else checkpoint_dir(run_dir, node.split("/")[0])
