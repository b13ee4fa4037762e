"""Central batched inference (SEED RL, Espeholt et al. 2020; Sebulba): one node holds the policy's
parameters and answers every actor's ``act(obs)`` with one jitted policy call for all the
observations waiting, so actors only step envs and send trajectories.

    inference = p.add_node(jd.CourierNode(InferenceServer, policy, learner, max_callers=4))
    p.add_node(jd.CourierNode(Actor, None, env, None, replay, inference=inference))

Calls from up to ``max_callers`` actors are batched by ``courier.batched_handler``: a batch runs
when every caller of one observation shape is waiting, or after ``batch_timeout`` seconds with
those that are (padded to ``max_callers`` rows, so the policy compiles once per shape). The
observations of a batch, ``(callers, envs, ...)``, are flattened into one ``(callers * envs,
...)`` policy call: what per-actor inference does ``callers`` times, done once, on the
inference node's device. Each answer carries the parameter version that chose it.

Where it pays: one policy call per step for all actors instead of one per actor, which counts
most for large networks (pixels) on an accelerator; the cost is a round trip per step, during
which the actor's envs wait. ``experiments/benchmarks/inference.py`` measures both here.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from jaxdist.courier.batching import batched_handler
from jaxdist.nodes.actor import Policy, jitted_step
from jaxdist.nodes.parameter_server import VariableClient


class InferenceServer:
    """Serves ``act(obs) -> (action, extras, version)`` for a batch of one actor's envs (see the
    module docstring) and ``stats()``; ``params`` is the parameter source, as an actor's."""

    def __init__(self, policy: Policy, params: Any, *, max_callers: int, batch_timeout: float = 0.005,
                 seed: int = 0, refresh_every_seconds: float = 0.02, first_fetch_timeout: float = 300.0,
                 rng_impl: str | None = "unsafe_rbg") -> None:
        if max_callers < 1:
            raise ValueError(f"max_callers must be >= 1 (the actors served), got {max_callers}")
        from jaxdist.envs.jax_rollout import recurrent

        if recurrent(policy):
            raise ValueError("an inference node keeps no recurrent state per actor's env: recurrent policies act "
                             "in their actors")
        import jax

        self._step = jitted_step(policy, rng_impl)
        self._key = jax.random.key_data(jax.random.key(seed, impl=rng_impl))
        self._variables = VariableClient(params, refresh_every_seconds=refresh_every_seconds,
                                         first_fetch_timeout=first_fetch_timeout)
        self._batches = 0
        print(f"inference: up to {max_callers} actors' calls batched on {jax.devices()[0].platform}", flush=True)
        # One batch at a time: each draws the next key (a batch runs in well under a step's time).
        self.act = batched_handler(max_callers, timeout=batch_timeout, pad_batch=True)(self._act)

    def _act(self, obs: np.ndarray) -> tuple[np.ndarray, dict[str, np.ndarray], np.ndarray]:
        """``obs`` of ``callers`` actors, ``(callers, envs, ...)``: one policy call for them all."""
        import jax

        callers, envs = obs.shape[:2]
        version, params = self._variables.latest_on_device()
        self._key, action, extras = self._step(params, obs.reshape(callers * envs, *obs.shape[2:]), self._key)
        self._batches += 1
        action, extras = jax.device_get((action, extras))
        by_caller = lambda x: np.asarray(x).reshape(callers, envs, *np.shape(x)[1:])  # noqa: E731
        return by_caller(action), {name: by_caller(x) for name, x in extras.items()}, np.full(callers, version)

    def stats(self) -> dict[str, Any]:
        """``batches`` of policy calls run, and the parameter ``version`` held."""
        return {"batches": self._batches, "version": self._variables.version}

    def close(self) -> None:
        self._variables.close()

