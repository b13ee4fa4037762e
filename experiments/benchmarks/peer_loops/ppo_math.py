"""PPO's math in plain JAX and optax, shared by the two single-process peer loops
(``gymnax_ppo.py``, ``gymnasium_ppo.py``): what a user writing PPO in one JAX file writes. It
runs in a venv of its own (jax, optax), so it imports nothing from jaxdist.

The hyperparameters are PureJaxRL's for CartPole-v1, but with 16 envs: a 64x64 tanh MLP, Adam
at 2.5e-4 with a global-norm clip of 0.5, 4 epochs of 4 minibatches over 128 steps, GAE(0.99,
0.95), clip 0.2, entropy 0.01, value 0.5.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

NUM_ENVS, NUM_STEPS, EPOCHS, MINIBATCHES = 16, 128, 4, 4
GAMMA, LAMBDA, CLIP, ENTROPY, VALUE, LEARNING_RATE, MAX_NORM = 0.99, 0.95, 0.2, 0.01, 0.5, 2.5e-4, 0.5


class Batch(NamedTuple):
    obs: jax.Array
    action: jax.Array
    log_prob: jax.Array
    value: jax.Array
    reward: jax.Array
    done: jax.Array


def init(key: jax.Array, obs_size: int, num_actions: int) -> Any:
    def dense(key: jax.Array, n_in: int, n_out: int, scale: float) -> dict:
        return {"w": jax.nn.initializers.orthogonal(scale)(key, (n_in, n_out)), "b": jnp.zeros(n_out)}
    keys = jax.random.split(key, 6)
    torso = lambda k1, k2: [dense(k1, obs_size, 64, 2 ** 0.5), dense(k2, 64, 64, 2 ** 0.5)]  # noqa: E731
    return {"pi": torso(keys[0], keys[1]) + [dense(keys[2], 64, num_actions, 0.01)],
            "v": torso(keys[3], keys[4]) + [dense(keys[5], 64, 1, 1.0)]}


def apply(params: Any, obs: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(logits, value) of a batch of observations."""
    def mlp(layers: list, x: jax.Array) -> jax.Array:
        for layer in layers[:-1]:
            x = jnp.tanh(x @ layer["w"] + layer["b"])
        return x @ layers[-1]["w"] + layers[-1]["b"]
    return mlp(params["pi"], obs), mlp(params["v"], obs)[..., 0]


optimizer = optax.chain(optax.clip_by_global_norm(MAX_NORM), optax.adam(LEARNING_RATE, eps=1e-5))


@jax.jit
def act(params: Any, obs: jax.Array, key: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    logits, value = apply(params, obs)
    action = jax.random.categorical(key, logits)
    return action, jax.nn.log_softmax(logits)[jnp.arange(action.shape[0]), action], value


@jax.jit
def greedy(params: Any, obs: jax.Array) -> jax.Array:
    return jnp.argmax(apply(params, obs)[0], axis=-1)


def advantages(batch: Batch, last_value: jax.Array) -> tuple[jax.Array, jax.Array]:
    def step(carry: tuple, t: tuple) -> tuple:
        gae, next_value = carry
        reward, value, done = t
        delta = reward + GAMMA * next_value * (1 - done) - value
        gae = delta + GAMMA * LAMBDA * (1 - done) * gae
        return (gae, value), gae
    _, adv = jax.lax.scan(step, (jnp.zeros_like(last_value), last_value),
                          (batch.reward, batch.value, batch.done), reverse=True)
    return adv, adv + batch.value


def loss(params: Any, batch: Batch, adv: jax.Array, returns: jax.Array) -> jax.Array:
    logits, value = apply(params, batch.obs)
    log_probs = jax.nn.log_softmax(logits)
    log_prob = jnp.take_along_axis(log_probs, batch.action[:, None], axis=-1)[:, 0]
    value_clipped = batch.value + jnp.clip(value - batch.value, -CLIP, CLIP)
    value_loss = 0.5 * jnp.maximum((value - returns) ** 2, (value_clipped - returns) ** 2).mean()
    adv = (adv - adv.mean()) / (adv.std() + 1e-8)
    ratio = jnp.exp(log_prob - batch.log_prob)
    policy_loss = -jnp.minimum(ratio * adv, jnp.clip(ratio, 1 - CLIP, 1 + CLIP) * adv).mean()
    entropy = -(jnp.exp(log_probs) * log_probs).sum(-1).mean()
    return policy_loss + VALUE * value_loss - ENTROPY * entropy


@jax.jit
def update(params: Any, opt_state: Any, batch: Batch, last_value: jax.Array, key: jax.Array) -> tuple[Any, Any]:
    """EPOCHS passes of MINIBATCHES minibatches over one rollout ([NUM_STEPS, NUM_ENVS, ...])."""
    adv, returns = advantages(batch, last_value)
    flat = jax.tree.map(lambda x: x.reshape(NUM_STEPS * NUM_ENVS, *x.shape[2:]), (batch, adv, returns))

    def epoch(carry: tuple, key: jax.Array) -> tuple:
        order = jax.random.permutation(key, NUM_STEPS * NUM_ENVS)
        shuffled = jax.tree.map(lambda x: x[order].reshape(MINIBATCHES, -1, *x.shape[1:]), flat)

        def minibatch(carry: tuple, part: tuple) -> tuple:
            params, opt_state = carry
            grads = jax.grad(loss)(params, *part)
            updates, opt_state = optimizer.update(grads, opt_state)
            return (optax.apply_updates(params, updates), opt_state), None
        return jax.lax.scan(minibatch, carry, shuffled)[0], None
    return jax.lax.scan(epoch, (params, opt_state), jax.random.split(key, EPOCHS))[0]
