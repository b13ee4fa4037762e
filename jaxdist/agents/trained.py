"""Acting with a trained policy: ``load_policy(run_dir)`` rebuilds an agent from the factory and
config saved in its run directory, and its topology restores the policy (the latest learner
checkpoint, another step's, or the best evaluation's), outside any program.

    policy = jaxdist.agents.load_policy("runs/ppo-cartpole-seed0")
    actions = policy.act(observations)            # a batch in, a batch out (deterministic)

A recurrent policy (``policy.recurrent``: trained with a ``core``) is played with its state, one
per env, handed back and forth: ``act`` is then a pure function of it::

    state = policy.initial_state(len(observations))            # every env at an episode's start
    actions, state = policy.act(observations, state=state)
    actions, state = policy.act(observations, state=state, first=starts)   # starts: (N,) bool, where
                                                                           # an env began a new episode
"""

from __future__ import annotations

from typing import Any

import numpy as np

from jaxdist.agents import experiment, sweep


class TrainedPolicy:
    """A trained agent's policy at one checkpoint: ``act(observations)`` for a batch of
    observations (``(N, *obs_shape)``) returns ``N`` actions; ``deterministic=False`` samples
    (or explores) as actor 0 did (ES's policy is deterministic either way: it explores in
    parameter space)."""

    def __init__(self, agent: Any, policy: experiment.Policy, seed: int = 0) -> None:
        import jax

        from jaxdist.nodes.actor import jitted_step

        self.agent, self.config, self.step = agent, agent.config, policy.version
        self._params = jax.device_put(policy.params)
        from jaxdist.envs.jax_rollout import recurrent

        self._steps = {deterministic: jitted_step(acting) for deterministic, acting in policy.policies.items()}
        self.recurrent = recurrent(policy.policies[True])
        self._initial_state = policy.policies[True].initial_state if self.recurrent else None
        self._obs_shape = tuple(policy.obs_shape)
        self._key = jax.random.key_data(jax.random.key(seed))

    @property
    def env_id(self) -> str:
        return self.config.env_id

    def initial_state(self, num_envs: int) -> Any:
        """A recurrent policy's state for ``num_envs`` envs at an episode's start."""
        if not self.recurrent:
            raise ValueError(f"this {self.agent.name} policy is feed-forward (no core): it has no state")
        return self._initial_state(num_envs)

    def act(self, observations: Any, deterministic: bool = True, state: Any = None,
            first: Any = None) -> Any:
        """Actions for a batch of observations; a recurrent policy's take its ``state`` and
        return ``(actions, state)``, reset first where ``first`` (``(N,)`` bool: the env began a
        new episode; default none)."""
        observations = np.asarray(observations)
        if observations.shape[1:] != self._obs_shape:
            raise ValueError(f"act() takes a batch of observations shaped (N, {', '.join(map(str, self._obs_shape))})"
                             f" for {self.env_id}; got {observations.shape} (add a leading axis for one observation)")
        if not self.recurrent:
            if state is not None or first is not None:
                raise ValueError(f"this {self.agent.name} policy is feed-forward (no core): act() takes no state")
            self._key, action, _ = self._steps[deterministic](self._params, observations, self._key)
            return np.asarray(action)
        if state is None:
            raise ValueError("this policy is recurrent: act(observations, state=state) with "
                             "state = policy.initial_state(N) at the episodes' start, and the state act returned after")
        first = np.zeros(len(observations), bool) if first is None else np.asarray(first, bool)
        self._key, action, _, state = self._steps[deterministic](self._params, observations, self._key, state, first)
        return np.asarray(action), state


def load_policy(run_dir: str, step: int | None = None, seed: int = 0, run_seed: int = 0,
                best: bool = False, trust_run_dir: bool = False, config_index: int = 0) -> TrainedPolicy:
    """The policy of the run in ``run_dir``: its saved config, its learner's latest checkpoint
    (or ``step``); of a run of several seeds at once (``num_seeds``), seed ``run_seed``'s; of a
    sweep's (``--sweep``), configuration ``config_index``'s (its row of ``sweep.csv``; PBT's
    member ``config_index``); with
    ``best``, that of the run's best evaluation (saved by the evaluator node of actor-learner
    runs; kept for each seed in an Anakin run's checkpoints).
    ``seed`` seeds the sampling of ``act(..., deterministic=False)``.

    ``config.json`` names the modules that rebuild the agent (its factory, config, network,
    env), which are imported; one whose code lies inside the run directory is refused unless
    ``trust_run_dir`` (a run directory from someone else is data, not code to run)."""
    saved = experiment.load(run_dir)
    if not trust_run_dir:
        experiment.refuse_code_in(run_dir, saved)
    agent = saved.agent()
    topology = agent.topology()
    configurations, seeds = sweep.layout(agent.config)
    if not 0 <= run_seed < seeds:
        raise ValueError(f"{run_dir} trained {seeds} seed(s) at once (num_seeds): run_seed must be "
                         f"{_choices(seeds)}, got {run_seed}")
    if not 0 <= config_index < configurations:
        raise ValueError(f"{run_dir} trained {configurations} configuration(s) (--sweep, --pbt): config_index must be "
                         f"{_choices(configurations)}, got {config_index}")
    for index, (_, config_dir) in enumerate(sweep.apart(agent.config, run_dir)):  # configurations run apart
        if index == config_index:
            return load_policy(config_dir, step, seed, run_seed, best, trust_run_dir)
    run = config_index * seeds + run_seed
    return TrainedPolicy(agent, topology.trained(run_dir, step, run, best), seed)


def _choices(count: int) -> str:
    return "0" if count == 1 else f"0 to {count - 1}"
