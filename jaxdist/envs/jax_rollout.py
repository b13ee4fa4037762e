"""The actors' JAX env backend (``EnvSpec(env_id, n, backend="jax")``): ``n`` envs of an env
written in JAX (:mod:`jaxdist.envs.jax_envs`) and the actor's policy play a whole trajectory of ``T``
steps in one jitted ``lax.scan`` (env ``vmap``-ed, policy on the batch): one dispatch per
trajectory instead of one per step.

    env = EnvSpec("CartPole-v1", 16, backend="jax").make(seed=0)
    env.start(policy, params, T)           # reset, choose the first actions, compile
    columns = env.trajectory(params)       # (envs, T + 1, ...) host arrays, T steps played
    returns, lengths = env.pop_episodes()

The trajectory is the actor's (:mod:`jaxdist.nodes.actor`), row for row: ``obs``, ``reward``,
``terminated``, ``truncated`` (arriving at ``obs``, the autoreset convention of
:mod:`jaxdist.envs.vector`: after a row that ended an episode comes the next episode's first row with
reward 0, the action chosen on the ending row ignored), then ``action`` and the policy's extras
(chosen on ``obs``). The scan steps the env with each row's action and then chooses the next
row's, so the last row's action is already chosen and carried into the next trajectory as its
first row: consecutive trajectories share that row whole, as the actor's do. Continuous
actions are clipped to the env's bounds for the env only (the row keeps the policy's sample).

Episode returns and lengths are accumulated inside the scan; the rows where episodes ended are
picked on the host when the trajectory is fetched.

**Recurrent policies** (:func:`recurrent`: the policy has ``initial_state(num_envs)``, and is
called ``policy(params, obs, key, state, first) -> (action, extras, state)``, resetting the
state where ``first``) have their state carried through the scan, an env's reset where its row
begins an episode, and their trajectories gain ``first`` (``(envs, T + 1)``) and ``core_state``
(the state fed to each env's row 0, before its reset: ``(envs, ...)``), what the learner unrolls
from. A feed-forward policy's carry and trajectories are as they were.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from jaxdist.envs.jax_envs import GymnaxEnv, JaxEnv

PyTree = Any


class JaxVectorEnv:
    """``num_envs`` envs of ``env`` played with a policy a trajectory at a time; the state (envs,
    current row and its chosen action, running episode totals, the key) stays on the device."""

    backend = "jax"

    def __init__(self, env: JaxEnv | GymnaxEnv, num_envs: int, seed: int) -> None:
        self.env, self.num_envs, self.seed = env, num_envs, seed
        self._play: Callable | None = None
        self._carry: dict[str, PyTree] = {}
        self._episodes: list[tuple[np.ndarray, np.ndarray]] = []

    def start(self, policy: Callable, params: PyTree, length: int, rng_impl: str | None = "unsafe_rbg") -> None:
        """Reset every env (the key from ``seed``, ``rng_impl``'s stream: it also samples the
        policy's actions), choose the first actions with ``params``, and compile trajectories of
        ``length`` steps of ``policy`` (ahead of time: nothing is played yet)."""
        self.compile(policy, params, length, rng_impl)  # found compiled when compile() came first
        self._carry = _starter(policy, self.env, self.num_envs, rng_impl)(params, self._first_key(rng_impl))
        self._play = _player(policy, self.env, length, rng_impl)
        self._episodes = []

    def compile(self, policy: Callable, params_like: PyTree, length: int, rng_impl: str | None = "unsafe_rbg") -> None:
        """Compile what ``start`` and trajectories run for parameters shaped as ``params_like``
        (``jax.ShapeDtypeStruct`` leaves will do), before any parameters exist: ``start`` then
        finds it compiled."""
        key = self._first_key(rng_impl)
        starter = _starter(policy, self.env, self.num_envs, rng_impl)
        carry = jax.eval_shape(starter, params_like, key)
        starter.lower(params_like, key).compile()
        _player(policy, self.env, length, rng_impl).lower(params_like, carry).compile()

    def _first_key(self, rng_impl: str | None) -> jax.Array:
        return jax.random.key_data(jax.random.key(self.seed, impl=rng_impl))

    def trajectory(self, params: PyTree) -> dict[str, np.ndarray]:
        """Play a trajectory with ``params``: its rows as host arrays ``(envs, length + 1, ...)``."""
        if self._play is None:
            raise RuntimeError("call start(policy, params, length) before playing a trajectory")
        self._carry, columns, episodes = self._play(params, self._carry)
        columns, (returns, lengths, ended) = jax.device_get((columns, episodes))
        if ended.any():
            self._episodes.append((returns[ended], lengths[ended]))  # (steps, envs) row-major: in time order
        return columns

    def pop_episodes(self) -> tuple[np.ndarray, np.ndarray]:
        """(returns, lengths) of the episodes that ended since the last call, in order."""
        if not self._episodes:
            return np.zeros(0, np.float64), np.zeros(0, np.int64)
        episodes, self._episodes = self._episodes, []
        return (np.concatenate([r for r, _ in episodes]).astype(np.float64),
                np.concatenate([n for _, n in episodes]).astype(np.int64))

    def close(self) -> None:
        self._play, self._carry = None, {}

    def __repr__(self) -> str:
        return f"JaxVectorEnv({self.env.env_id}, num_envs={self.num_envs}, seed={self.seed})"


def _cached_jit(build: Callable) -> Callable:
    """``build(*args)`` jitted once per hashable ``args`` (actors of one process share a compile)."""
    cached = functools.lru_cache(maxsize=None)(build)

    def get(*args: Any) -> Callable:
        try:
            return cached(*args)
        except TypeError:  # an unhashable policy: jitted for this caller alone
            return build(*args)

    return get


@_cached_jit
def _starter(policy: Callable, env: Any, num_envs: int, rng_impl: str | None) -> Callable:
    return jax.jit(functools.partial(_start, policy, env, num_envs, rng_impl))


@_cached_jit
def _player(policy: Callable, env: Any, length: int, rng_impl: str | None) -> Callable:
    return jax.jit(functools.partial(_play, policy, env, length, rng_impl))


def _start(policy: Callable, env: Any, num_envs: int, rng_impl: str | None, params: PyTree,
           key_data: jax.Array) -> dict[str, PyTree]:
    key, envs_key = jax.random.split(jax.random.wrap_key_data(key_data, impl=rng_impl))
    return {"key": jax.random.key_data(key), **start(policy, env, params, num_envs, envs_key)}


def _play(policy: Callable, env: Any, length: int, rng_impl: str | None, params: PyTree,
          carry: dict[str, PyTree]) -> tuple[dict[str, PyTree], dict[str, jax.Array], tuple]:
    key, scan_key = jax.random.split(jax.random.wrap_key_data(carry["key"], impl=rng_impl))
    envs = {name: value for name, value in carry.items() if name != "key"}
    envs, columns, episodes = play(policy, env, params, envs, scan_key, length)
    return {"key": jax.random.key_data(key), **envs}, columns, episodes


def recurrent(policy: Callable) -> bool:
    """Whether ``policy`` carries a state from step to step (see the module docstring)."""
    return callable(getattr(policy, "initial_state", None))


def act(policy: Callable, params: PyTree, row: dict[str, jax.Array], key: jax.Array,
        core: PyTree) -> tuple[jax.Array, dict[str, jax.Array], PyTree]:
    """``policy``'s action on ``row``: ``(action, extras, state after)``; a feed-forward policy's
    state is None."""
    if core is None:
        return (*policy(params, row["obs"], key), None)
    return policy(params, row["obs"], key, core, row["first"])


def start(policy: Callable, env: Any, params: PyTree, num_envs: int, key: jax.Array) -> dict[str, PyTree]:
    """``num_envs`` envs just reset, and the actions ``policy`` chose on their first rows: what
    ``play`` carries from one trajectory to the next (a recurrent policy's state too: ``core``,
    fed to the current row, and ``after``, its state after it)."""
    reset_key, act_key = jax.random.split(key)
    state, obs = jax.vmap(env.reset)(jax.random.split(reset_key, num_envs))
    row = {"obs": obs, "reward": jnp.zeros(num_envs, jnp.float32), "terminated": jnp.zeros(num_envs, bool),
           "truncated": jnp.zeros(num_envs, bool)}
    core = policy.initial_state(num_envs) if recurrent(policy) else None
    if core is not None:
        row["first"] = jnp.ones(num_envs, bool)
    action, extras, after = act(policy, params, row, act_key, core)
    carry = {"state": state, "row": row, "action": action, "extras": extras,
             "return": jnp.zeros(num_envs, jnp.float32), "length": jnp.zeros(num_envs, jnp.int32)}
    if core is not None:
        carry.update(core=core, after=after)
    return carry


def play(policy: Callable, env: Any, params: PyTree, envs: dict[str, PyTree], key: jax.Array,
         length: int) -> tuple[dict[str, PyTree], dict[str, jax.Array], tuple[jax.Array, jax.Array, jax.Array]]:
    """``length`` steps of every env of ``envs`` (as ``start`` made them) with ``policy``:
    ``(envs after, trajectories (envs, length + 1, ...), (returns, lengths, ended))``, the last
    row with its action chosen (the next trajectory's first, shared whole, as the actors'
    trajectories share it: see the module docstring). ``returns[t, i]`` is the return of the
    episode env ``i`` ended at step ``t`` where ``ended[t, i]``. The actors' JAX backend and
    Anakin play this."""

    def step(carry: dict[str, PyTree], key: jax.Array) -> tuple[dict[str, PyTree], tuple]:
        env_key, act_key = jax.random.split(key)
        row, action, extras = carry["row"], carry["action"], carry["extras"]
        state, next_row, restart = autoreset_step(env, carry["state"], row, action, env_key)
        episode_return = jnp.where(restart, 0.0, carry["return"] + next_row["reward"])
        episode_length = jnp.where(restart, 0, carry["length"] + 1)
        if "core" in carry:
            next_row["first"] = restart
        next_action, next_extras, after = act(policy, params, next_row, act_key, carry.get("after"))
        ended = next_row["terminated"] | next_row["truncated"]
        next_carry = {"state": state, "row": next_row, "action": next_action, "extras": next_extras,
                      "return": episode_return, "length": episode_length}
        if "core" in carry:
            next_carry.update(core=carry["after"], after=after)
        return next_carry, ({**row, "action": action, **extras}, (episode_return, episode_length, ended))

    start_core = envs.get("core")
    envs, (rows, episodes) = jax.lax.scan(step, envs, jax.random.split(key, length))
    last = {**envs["row"], "action": envs["action"], **envs["extras"]}
    columns = jax.tree.map(lambda xs, x: jnp.swapaxes(jnp.concatenate([xs, x[None]]), 0, 1), rows, last)
    if start_core is not None:
        columns["core_state"] = start_core
    return envs, columns, episodes


def autoreset_step(env: Any, state: PyTree, row: dict[str, jax.Array], action: jax.Array,
                   key: jax.Array) -> tuple[PyTree, dict[str, jax.Array], jax.Array]:
    """Every env one step on from ``row`` with the ``action`` chosen on it: ``(state, next row,
    restart)``. An env whose ``row`` ended an episode is reset instead (gymnasium's NEXT_STEP
    autoreset: ``restart``, the action ignored), and its next row is the new episode's first,
    reward 0 and not ended. Continuous actions are clipped to the env's bounds for the env only.
    The step of the actors' trajectories and of Anakin's."""
    num_envs = row["reward"].shape[0]
    step_key, reset_key = jax.random.split(key)
    restart = row["terminated"] | row["truncated"]
    stepped = _step_envs(env, state, action, step_key)
    fresh_state, fresh_obs = jax.vmap(env.reset)(jax.random.split(reset_key, num_envs))
    pick = lambda fresh, stepped: jnp.where(per_row(restart, fresh), fresh, stepped)  # noqa: E731
    next_row = {"obs": pick(fresh_obs, stepped.obs),
                "reward": jnp.where(restart, 0.0, stepped.reward).astype(row["reward"].dtype),
                "terminated": ~restart & stepped.terminated, "truncated": ~restart & stepped.truncated}
    return jax.tree.map(pick, fresh_state, stepped.state), next_row, restart


def episodes(policy: Callable, env: Any, params: PyTree, reset_keys: jax.Array,
             key: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Returns and lengths of whole episodes of ``policy``, one from ``env.reset(k)`` for each
    ``k`` of ``reset_keys`` (so every policy compared on the same keys meets the same start
    states): all step for the env's ``max_steps``, masked once ended, as one program. The
    evaluations of the evaluator (JAX backend) and of Anakin, and ES's fitness, are these."""
    count = reset_keys.shape[0]
    state, obs = jax.vmap(env.reset)(reset_keys)
    core = policy.initial_state(count) if recurrent(policy) else None

    def step(carry: tuple, key: jax.Array) -> tuple[tuple, None]:
        state, obs, done, total, length, core = carry
        act_key, step_key = jax.random.split(key)
        action, _, core = act(policy, params, {"obs": obs, "first": length == 0}, act_key, core)
        out = _step_envs(env, state, action, step_key)
        total = total + jnp.where(done, 0.0, out.reward)
        length = length + (~done).astype(jnp.int32)
        return (out.state, out.obs, done | out.terminated | out.truncated, total, length, core), None

    start = (state, obs, jnp.zeros(count, bool), jnp.zeros(count, jnp.result_type(float)), jnp.zeros(count, jnp.int32),
             core)
    (_, _, _, total, length, _), _ = jax.lax.scan(step, start, jax.random.split(key, env.max_steps))
    return total, length


def _step_envs(env: Any, state: PyTree, action: jax.Array, key: jax.Array) -> Any:
    """Every env one step (no reset), a key each; continuous actions clipped to the env's bounds."""
    bounds = env.action_bounds
    env_action = action if bounds is None else jnp.clip(action, *bounds)
    return jax.vmap(env.step)(state, env_action, jax.random.split(key, action.shape[0]))


def per_row(flag: jax.Array, like: jax.Array) -> jax.Array:
    """``flag`` (rows,) shaped to broadcast against ``like`` (rows, ...): one flag per env, or per seed."""
    return flag.reshape(flag.shape + (1,) * (jnp.ndim(like) - 1))


__all__ = ["JaxVectorEnv", "act", "autoreset_step", "episodes", "per_row", "play", "recurrent", "start"]
