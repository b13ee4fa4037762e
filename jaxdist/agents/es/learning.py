"""OpenAI-ES (Salimans et al. 2017, "Evolution Strategies as a Scalable Alternative to
Reinforcement Learning"), the math in one place.

- Noise is shared by seed: ``eps_i = N(0, I)`` drawn from ``key(seed_i)``, so master and
  evaluators regenerate the same vectors and only integer seeds cross the wire.
- Antithetic (mirrored) sampling: each ``eps_i`` is evaluated at ``theta + sigma eps_i`` and
  ``theta - sigma eps_i``.
- Fitness shaping: the 2n fitnesses are replaced by their centered ranks in [-0.5, 0.5].
- The search-gradient estimate (the paper's Algorithm 1 with mirrored pairs)
  ``g = 1 / (2 n sigma) * sum_i (F(theta + sigma eps_i) - F(theta - sigma eps_i)) eps_i``
  is ascended with Adam or SGD (optax, on ``-g``), with optional L2 weight decay added to the
  update as in the paper's implementation.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax


def noise(seeds: jax.Array, dimension: int) -> jax.Array:
    """``[len(seeds), dimension]`` standard normal rows, row i a function of ``seeds[i]`` alone."""
    return jax.vmap(lambda seed: jax.random.normal(jax.random.key(seed), (dimension,)))(seeds)


def centered_ranks(values: jax.Array) -> jax.Array:
    """Each value's rank over all of ``values`` (0 for the smallest), mapped to [-0.5, 0.5]:
    the update then ignores the scale of returns and is robust to outliers."""
    flat = values.ravel()
    ranks = jnp.argsort(jnp.argsort(flat)).astype(jnp.float32)
    return (ranks / (flat.size - 1) - 0.5).reshape(values.shape)


def gradient_estimate(eps: jax.Array, fitness: jax.Array, sigma: float) -> jax.Array:
    """The ES gradient from ``eps`` (``[n, D]``) and the shaped fitness of each pair (``[n, 2]``:
    plus, minus)."""
    return (fitness[:, 0] - fitness[:, 1]) @ eps / (2 * eps.shape[0] * sigma)


def optimizer(name: str, learning_rate: float, weight_decay: float = 0.0, momentum: float = 0.9
              ) -> optax.GradientTransformation:
    """Adam or SGD with momentum; ``weight_decay`` adds ``weight_decay * theta`` to the update
    before the optimizer sees it (L2, as in the paper's code)."""
    if name == "adam":
        base = optax.adam(learning_rate)
    elif name == "sgd":
        base = optax.sgd(learning_rate, momentum=momentum or None)
    else:
        raise ValueError(f"optimizer must be 'adam' or 'sgd', got {name!r}")
    return optax.chain(optax.add_decayed_weights(weight_decay), base) if weight_decay else base


@functools.partial(jax.jit, static_argnums=(0,))
def update(tx: optax.GradientTransformation, theta: jax.Array, opt_state: optax.OptState, seeds: jax.Array,
           fitness: jax.Array, sigma: float) -> tuple[jax.Array, optax.OptState, jax.Array]:
    """One generation's step from the raw fitness of the pairs of ``seeds``; also the gradient norm."""
    grad = gradient_estimate(noise(seeds, theta.shape[0]), centered_ranks(fitness), sigma)
    updates, opt_state = tx.update(-grad, opt_state, theta)
    return optax.apply_updates(theta, updates), opt_state, jnp.linalg.norm(grad)


def generation_seeds(seed: int, generation: int, pairs: int) -> np.ndarray:
    """The noise seeds of one generation: fixed by (run seed, generation), so a resumed run
    draws what the interrupted one would have drawn."""
    return np.random.default_rng([seed, generation]).integers(0, 2**31 - 1, size=pairs, dtype=np.int32)


def episode_keys(seed: int, generation: int, count: int, purpose: int) -> jax.Array:
    """Env start states of one generation, the same for the whole population (common random
    numbers: members are ranked on equal terms); ``purpose`` 0 for training, 1 for evaluation."""
    key = jax.random.fold_in(jax.random.fold_in(jax.random.key(seed), generation), purpose)
    return jax.random.split(key, count)
