"""V-trace (Espeholt et al., 2018, "IMPALA", section 4): off-policy value targets and
policy-gradient advantages for trajectories acted by a behaviour policy ``mu`` older than the
learner's ``pi``. A pure, jittable function of time-major arrays.

**Rows.** The row convention of :mod:`jaxdist.envs.vector` and PPO's ``gae``: ``T + 1`` rows, row ``t``
describes arriving at ``x_t`` (``reward[t]`` earned on the way, ``terminated[t]`` /
``truncated[t]`` when ``x_t`` ends its episode). Transition ``s`` goes from row ``s`` to row
``s + 1`` with reward ``r_s = reward[s + 1]``; it is *real* unless row ``s`` ended an episode (then
the env autoreset and ignored the action).

**Targets** (eq. 1), with ``rho_t = min(rho_bar, pi/mu)``, ``c_i = lam min(c_bar, pi/mu)``,
``gamma_t = gamma (1 - terminated[t + 1])`` and ``delta_t = rho_t (r_t + gamma_t V(x_{t+1}) - V(x_t))``::

    v_s = V(x_s) + sum_{t >= s} (prod_{i=s}^{t-1} gamma_i c_i) delta_t

the sum running over real transitions up to the end of the episode or of the trajectory
(beyond it, ``V(x_T)`` bootstraps). A terminated episode bootstraps with 0; a truncated one
from the value of its true last observation (a row of its own), as does a trajectory's end.
Computed backwards: ``v_s - V(x_s) = delta_s + gamma_s c_s (v_{s+1} - V(x_{s+1}))``.

**Policy-gradient advantage** (section 4.2): ``rho^pg_s (r_s + gamma_s v_{s+1} - V(x_s))`` with
``rho^pg_s = min(pg_rho_bar, pi/mu)`` and ``v_{s+1} = V(x_{s+1})`` when row ``s + 1`` ended.

Both outputs are constants for the gradient (``stop_gradient``): targets, not functions.
"""

from __future__ import annotations

from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp


class VTrace(NamedTuple):
    """``(T, ...)`` each: value targets ``v_s``, policy-gradient advantages, and ``real`` (the
    transitions to learn from; targets there equal ``V(x_s)`` and advantages are 0)."""

    targets: jax.Array
    pg_advantages: jax.Array
    real: jax.Array


def vtrace(value: jax.Array, reward: jax.Array, terminated: jax.Array, truncated: jax.Array,
           log_rho: jax.Array, gamma: float, *, rho_bar: float = 1.0, c_bar: float = 1.0,
           pg_rho_bar: float | None = None, lam: float = 1.0) -> VTrace:
    """V-trace along axis 0 (time): ``value``, ``reward`` (float), ``terminated``, ``truncated``
    (bool) are rows ``(T + 1, ...)``; ``log_rho = log pi(a_s|x_s) - log mu(a_s|x_s)`` is per
    transition ``(T, ...)``. ``pg_rho_bar`` defaults to ``rho_bar``; ``lam`` scales the traces
    (the paper's remark 2)."""
    chex.assert_equal_shape([value, reward, terminated, truncated])
    chex.assert_shape(log_rho, (value.shape[0] - 1, *value.shape[1:]))
    chex.assert_type([value, reward, terminated, truncated, log_rho], [float, float, bool, bool, float])
    value, log_rho = jax.lax.stop_gradient(value), jax.lax.stop_gradient(log_rho)
    pg_rho_bar = rho_bar if pg_rho_bar is None else pg_rho_bar
    real = ~(terminated | truncated)[:-1]
    real_f = real.astype(value.dtype)
    discount = gamma * (1.0 - terminated[1:].astype(value.dtype))
    rho = jnp.exp(log_rho)
    delta = real_f * jnp.minimum(rho_bar, rho) * (reward[1:] + discount * value[1:] - value[:-1])
    trace = real_f * discount * lam * jnp.minimum(c_bar, rho)

    def backward(correction: jax.Array, step: tuple[jax.Array, jax.Array]) -> tuple[jax.Array, jax.Array]:
        delta_s, trace_s = step
        correction = delta_s + trace_s * correction  # v_s - V(x_s)
        return correction, correction

    _, corrections = jax.lax.scan(backward, jnp.zeros_like(value[0]), (delta, trace), reverse=True)
    targets = value[:-1] + corrections
    next_targets = jnp.concatenate([targets[1:], value[-1:]])  # v_{s+1}; V(x_T) past the end
    # Where row s + 1 ended, transition s + 1 is not real: its target is V(x_{s+1}) already.
    pg_advantages = real_f * jnp.minimum(pg_rho_bar, rho) * (reward[1:] + discount * next_targets - value[:-1])
    return VTrace(targets, pg_advantages, real)
