"""The actor node: a vector env, one jitted policy call per step for the whole batch of envs,
trajectories sent with futures, parameters refreshed in the background.

    with p.group("actor"):
        for i in range(2):
            p.add_node(jd.CourierNode(Actor, policy, EnvSpec("CartPole-v1", 8), learner, queue,
                                      trajectory_length=32, seed=i))

- ``policy(params, obs, key) -> (action, extras)``: a pure, picklable function of the whole batch
  (``extras``: a dict of arrays with the env axis first, e.g. ``{"logp", "value"}``); the actor
  jits it once. It runs on every step with the newest parameters the actor holds. A recurrent
  policy (``jaxdist.envs.jax_rollout.recurrent``: it has ``initial_state(num_envs)``) is called
  ``policy(params, obs, key, state, first) -> (action, extras, state)``: the actor carries each
  env's state across steps and trajectories, the policy resets it where ``first``.
- ``env``: anything with ``make(seed)`` (an ``EnvSpec``) giving a ``jaxdist.envs.vector.VectorEnv``,
  stepped from Python with one policy call per step, or, with ``EnvSpec(..., backend="jax")``, a
  ``jaxdist.envs.jax_rollout.JaxVectorEnv``: policy and envs play a whole trajectory in one jitted
  ``lax.scan`` per dispatch (``max_steps`` then counts whole trajectories). ``seed``
  seeds the env and the policy's key (``rng_impl``: JAX's ``unsafe_rbg`` by default, a
  single XLA op, measurably cheaper per step on CPU than threefry's; an actor's samples need
  no cross-device reproducibility). ``params_like`` (JAX backend): a function giving the
  parameters' shapes and dtypes; the actor compiles its trajectory for them while the parameter
  source is still starting, not once they arrive (the 0.6-0.9 s compile leaves the path to the
  first trajectory; on two cores it then competes with the learner's start instead).
- ``params``: the parameter source, a client (or object) with ``get(min_version)``: a
  ``ParameterServer``, a ``CacherNode`` in front of one, or a learner. A ``VariableClient`` refreshes it in a background thread; while the source is away
  (a learner or server restarting) the actor keeps acting with the parameters it holds.
- ``sink``: where trajectories go: a replay node's client (each env's trajectory one item,
  all of a send in one atomic ``insert_batch``: one array per field on the wire, not one per
  env; the actor asks it for room, ``can_insert``, before it plays a trajectory), any callable ``sink(items)``, or None (dropped: for benchmarks). Sends run on background threads; at most ``max_in_flight`` are pending. A
  send the receiver cannot take now (it is restarting: ``ConnectionError``, or a replay node's
  closed table as it shuts down; a full queue past ``insert_timeout``: ``TimeoutError``) is
  retried with jittered exponential backoff (0.05 s doubling to 2 s) for up to ``send_retry_for``
  seconds, holding its slot: those slots are the bounded buffer that rides out a restart. When
  every slot is taken, the actor waits for the oldest (back-pressure) at most ``max_send_wait`` seconds, then drops the new trajectory
  (counted in ``stats()["dropped"]`` and reported in the log when sends recover) and keeps
  acting. A send cut by a crash may have been stored: a retry can duplicate it (at least once).
  An outage is reported once it has lasted ``OUTAGE_REPORT_AFTER`` seconds: a program's ordered
  stop takes the learner's process, with its queue, a moment before the actors.

**Trajectories.** Every ``trajectory_length`` (T) steps each env's last ``T + 1`` rows go out as
one item, a dict of arrays with a leading ``T + 1`` axis: the ``jaxdist.envs.vector.TimeStep`` fields
``obs``, ``reward``, ``terminated``, ``truncated`` (``first`` is left out: a row is first when
the row before it ended an episode), ``action``, the policy's extras, and ``version`` (the
parameter version that chose each action); a recurrent policy's also ``first`` and
``core_state``, the state fed to row 0 (before its reset), from which the learner unrolls. The
last row of one trajectory is the first row of the next, so a learner can bootstrap from it and
no transition is lost. The acting thread writes
each row into env-major buffers (one set per trajectory) and, per trajectory, moves the
policy's extras to the host in one jitted call; a background thread sends the per-env items
(views of those buffers).

Served: ``stats()`` (env steps, steps/s, episodes, mean return, version, send counters) and
``episodes(since)`` (returns, lengths and end times of recent episodes, for monitors).
"""

from __future__ import annotations

import collections
import functools
import itertools
import random
import threading
import time
from concurrent import futures
from typing import Any, Callable

import numpy as np

from jaxdist import courier
from jaxdist.launch import context
from jaxdist.nodes.parameter_server import VariableClient

Policy = Callable[[Any, Any, Any], tuple[Any, dict[str, Any]]]
Room = Callable[[int, float], "futures.Future[bool]"]
"""``room(items, wait)``: a future of whether the sink takes ``items`` more now, or within
``wait`` seconds (a future, so that the acting thread never blocks on a sink that went away)."""

ROOM_HOLD = 2.0
"""How long a replay node keeps the room a JAX-backend actor was told of for that actor's insert
(playing a trajectory takes milliseconds; an actor that dies in between costs the table this):
without it, actors that ask together all see the same free slot and the queue fills ahead."""

OUTAGE_REPORT_AFTER = 1.0
"""How long sends fail before the log says so (and, later, that they recovered)."""

PARAMS_BEFORE_PLAY_TIMEOUT = 0.25
"""How long an actor waits for its fetch of the newest parameters before a trajectory
(a fetch takes about a millisecond; a source that is away or gone costs this, then the actor
plays with what it holds)."""


class Actor:
    """A served actor; see the module docstring. Call ``run()`` (a node does) to act."""

    def __init__(self, policy: Policy, env: Any, params: Any, sink: Any = None, *,
                 trajectory_length: int = 32, seed: int = 0,
                 refresh_every_seconds: float = 0.05, first_fetch_timeout: float = 300.0,
                 max_in_flight: int = 2, max_send_wait: float = 5.0, insert_timeout: float = 30.0,
                 send_retry_for: float = 60.0,
                 table: str = "default", max_steps: int | None = None, episode_window: int = 20,
                 keep_episodes: int = 10_000, log_every_seconds: float | None = None,
                 rng_impl: str | None = "unsafe_rbg", params_like: Callable[[], Any] | None = None,
                 inference: Any = None, name: str | None = None) -> None:
        if trajectory_length < 1:
            raise ValueError(f"trajectory_length must be >= 1, got {trajectory_length}")
        if max_in_flight < 1:
            raise ValueError(f"max_in_flight must be >= 1, got {max_in_flight}")
        import jax  # here, not at import: a module that only names Actor needs no JAX

        node = context.current_node()
        self.name = name or (node.node_name if node else "actor")
        self._T = trajectory_length
        self._max_steps = max_steps
        self._in_program = node is not None
        self._env = env.make(seed)
        if (inference is None) == (policy is None):
            raise ValueError("an actor runs its own policy (policy and params) or asks an inference node "
                             "(inference=, with policy and params None): give one of them")
        if inference is not None and self._env.backend == "jax":
            raise ValueError("a JAX-backend actor plays its policy inside each trajectory's jitted scan, so it cannot "
                             "ask an inference node: use a gymnasium backend, or per-actor inference")
        # Raw key data in and out of the jitted step: a typed key would be rewrapped in Python
        # on every return (~25 us a step here).
        self._key = jax.random.key_data(jax.random.key(seed, impl=rng_impl))
        from jaxdist.envs.jax_rollout import recurrent

        self._recurrent = recurrent(policy)
        self._owns_variables = not isinstance(params, VariableClient)
        if inference is not None:
            self._variables: Any = InferenceClient(inference, send_retry_for, first_fetch_timeout)
            self._choose = self._choose_remotely
        else:
            self._step_fn = jitted_step(policy, rng_impl)
            self._variables = params if not self._owns_variables else VariableClient(
                params, refresh_every_seconds=refresh_every_seconds, first_fetch_timeout=first_fetch_timeout)
            self._choose = self._choose_here
        send, room = _make_send(sink, table, insert_timeout)
        self._sender = _Sender(send, max_in_flight, max_send_wait, self.name, room=room,
                              retry_for=send_retry_for, stopping=self._should_stop)
        self._episode_window = episode_window
        self._episodes: collections.deque = collections.deque(maxlen=keep_episodes)
        self._episode_count = 0
        self._lock = threading.Lock()
        self._env_steps = 0
        self._rate = (time.monotonic(), 0, 0.0)  # (time, steps) at the last rate reading, the rate
        self._log_every = log_every_seconds
        self._next_log = time.monotonic() + (log_every_seconds or float("inf"))
        self._next_book = 0.0
        self._policy, self._rng_impl = policy, rng_impl
        self._first_timestep: Any = None  # gymnasium's envs: the reset row
        self._start_version = -1  # the JAX backend: the version that chose the first actions
        self._params_like = params_like
        # Reset the env and compile the policy while the rest of the program starts.
        self._warm_up_error: BaseException | None = None
        self._warm_up = threading.Thread(target=self._warm_up_policy, name="actor-warm-up", daemon=True)
        self._warm_up.start()

    # Served -------------------------------------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        """Counters for monitors: env_steps, steps_per_second (since the last call, or the last
        second), episodes, mean_return (last ``episode_window`` episodes; None before one ended),
        version (parameters held), param_errors, and the sends: ``trajectories`` made (once a
        send slot is found or not), of which ``sent``, ``dropped``, ``send_errors`` (gave up) and
        ``in_flight``, whenever read; ``send_retries``, ``send_wait_seconds``."""
        with self._lock:
            recent = [ret for _, ret, _ in itertools.islice(reversed(self._episodes), self._episode_window)]
            episodes = self._episode_count
        steps = self._env_steps
        now = time.monotonic()
        then, then_steps, rate = self._rate
        if now - then >= 0.2:
            rate = (steps - then_steps) / (now - then)
            self._rate = (now, steps, rate)
        return {"env_steps": steps, "steps_per_second": rate, "episodes": episodes,
                "mean_return": float(np.mean(recent)) if recent else None,
                "version": self._variables.version, "param_errors": self._variables.stats["errors"],
                **self._sender.counts()}

    def episodes(self, since: int = 0) -> dict[str, Any]:
        """Episodes numbered ``since`` onwards that are still kept: ``{"next": the number to ask
        for next time, "returns", "lengths", "times" (wall clock at each end)}``."""
        with self._lock:
            count = self._episode_count
            kept = list(itertools.islice(reversed(self._episodes), max(0, count - since)))[::-1]
        return {"next": count, "times": [t for t, _, _ in kept], "returns": [r for _, r, _ in kept],
                "lengths": [n for _, _, n in kept]}

    # The node's own work ------------------------------------------------------------------------

    def run(self) -> None:
        """Act until ``max_steps`` env steps (all envs together), or the program stops. After
        ``max_steps`` the sends in flight get up to ``max_send_wait`` seconds to finish; after
        a stop they are abandoned (their receiver may be gone already)."""
        self._warm_up.join()
        if self._warm_up_error is not None:
            raise self._warm_up_error
        if self._env.backend == "jax":
            self._act_a_trajectory_per_dispatch()
        else:
            self._act_step_by_step()
        self._book_episodes()
        if self._owns_variables:
            self._variables.close()  # no more fetches from a program that may be going away
        if not (self._in_program and context.stop_requested()):
            self._sender.drain()  # what is in flight gets its chance (at most max_send_wait)

    def _act_step_by_step(self) -> None:
        """A gymnasium vector env: a policy call and an env step per step, rows written into
        the trajectory's buffers."""
        env, T, num_envs = self._env, self._T, self._env.num_envs
        choose = self._choose
        key = self._key
        timestep = self._first_timestep
        rows, extras, versions, t = None, [], [], 0
        core = self._policy.initial_state(num_envs) if self._recurrent else None
        start_core = core  # the state fed to the trajectory's row 0
        while not self._should_stop():
            fed = core
            key, action, extra, core, version = choose(timestep.obs, key, fed, timestep.first)
            action = np.asarray(action)
            if rows is None:
                rows = _new_rows(timestep, action, T + 1, core is not None)
            if core is not None:
                rows["first"][:, t] = timestep.first
            rows["obs"][:, t] = timestep.obs
            rows["reward"][:, t] = timestep.reward
            rows["terminated"][:, t] = timestep.terminated
            rows["truncated"][:, t] = timestep.truncated
            rows["action"][:, t] = action
            extras.append(extra)
            versions.append(version)
            if t < T:
                t += 1
            else:  # a trajectory is complete; its last row is the next one's first
                self._send(rows, extras, versions, start_core)
                start_core = fed if core is not None else None
                following = _new_rows(timestep, action, T + 1, core is not None)
                for name, column in rows.items():
                    following[name][:, 0] = column[:, T]
                rows, extras, versions, t = following, extras[-1:], versions[-1:], 1
                self._after_trajectory()
                self._wait_to_play(num_envs)
            timestep = env.step(action)
            self._env_steps += num_envs

    def _act_a_trajectory_per_dispatch(self) -> None:
        """The JAX backend (``jaxdist.envs.jax_rollout``): policy and envs play a whole trajectory in
        one jitted call. Its first row was acted by the previous trajectory's parameters."""
        env, steps = self._env, self._T * self._env.num_envs
        version = self._start_version
        while not self._should_stop():
            self._wait_to_play(env.num_envs)
            previous, (version, params) = version, self._variables.latest_on_device()
            columns = env.trajectory(params)
            columns["version"] = np.full(columns["reward"].shape, version, np.int32)  # (envs, T + 1)
            columns["version"][:, 0] = previous
            self._sender.send(columns)
            self._env_steps += steps
            self._after_trajectory()

    def _wait_to_play(self, num_envs: int) -> None:
        """A trajectory is played once the sink has room for it (a queue: once the learner has
        taken what came before), with the parameters fetched then: played ahead and held in a
        blocked send while the learner moves on, it would reach the learner past its lag bound
        and be discarded as stale. Actors slower than their learner never wait."""
        self._sender.wait_for_room(items=num_envs)
        if isinstance(self._variables, VariableClient):  # an inference node holds its own
            self._variables.refresh(timeout=PARAMS_BEFORE_PLAY_TIMEOUT)

    def _after_trajectory(self) -> None:
        """Episode statistics a few times a second, and the progress line when it is due."""
        now = time.monotonic()
        if now >= self._next_book:
            self._next_book = now + 0.25
            self._book_episodes()
        if now >= self._next_log:
            self._next_log = now + (self._log_every or float("inf"))
            self._log_progress()

    def close(self) -> None:
        self._sender.close()
        if self._owns_variables:
            self._variables.close()
        self._env.close()

    # Internals ----------------------------------------------------------------------------------

    def _should_stop(self) -> bool:
        if self._max_steps is not None and self._env_steps >= self._max_steps:
            return True
        return self._in_program and context.stop_requested()

    def _warm_up_policy(self) -> None:
        try:
            start = time.monotonic()
            if self._env.backend == "jax":  # reset and first actions need the parameters
                if self._params_like is not None:  # compile while the parameters' source starts
                    self._env.compile(self._policy, self._params_like(), self._T, self._rng_impl)
                version, params = self._variables.latest_on_device()
                fetched = time.monotonic()
                self._env.start(self._policy, params, self._T, self._rng_impl)  # compiles the trajectory
                self._start_version = version
            else:
                self._first_timestep = self._env.reset()
                version = self._variables.latest()[0]  # waits for the first parameters (or an inference node)
                fetched = time.monotonic()
                memory = ((self._policy.initial_state(self._env.num_envs), self._first_timestep.first)
                          if self._recurrent else (None, None))
                _block(self._choose(self._first_timestep.obs, self._key, *memory))  # compiles; result unused
            if self._in_program:  # a line for the node's log
                print(f"{self.name}: {self._env!r}; parameters v{version} after {fetched - start:.2f} s, policy "
                      f"compiled in {time.monotonic() - fetched:.2f} s", flush=True)
        except BaseException as exc:  # noqa: BLE001 - re-raised by run()
            self._warm_up_error = exc

    def _choose_here(self, obs: Any, key: Any, core: Any, first: Any) -> tuple[Any, Any, dict, Any, int]:
        """``(key, action, extras, core after, version)``: the policy's choice with the newest
        parameters held; ``core`` is a recurrent policy's state (None for a feed-forward one)."""
        version, params = self._variables.latest_on_device()
        if core is None:
            return (*self._step_fn(params, obs, key), None, version)
        return (*self._step_fn(params, obs, key, core, first), version)

    def _choose_remotely(self, obs: Any, key: Any, core: None, first: Any) -> tuple[Any, Any, dict, None, int]:
        """The inference node's choice, in one round trip (the key stays unused: the node samples;
        its policies are feed-forward)."""
        action, extras, version = self._variables.act(obs)
        return key, action, extras, None, version

    def _send(self, rows: dict[str, np.ndarray], extras: list, versions: list, core: Any = None) -> None:
        """Hand a complete trajectory to the sender. The policy's extras are device arrays: they
        are stacked and fetched here, in one jitted call, so that no device array leaves this
        thread; the sender makes the per-env items (views of the columns) and sends them."""
        import jax

        columns = dict(rows, **jax.device_get(_stack_env_major(extras)))
        if core is not None:
            columns["core_state"] = jax.device_get(core)
        columns["version"] = np.broadcast_to(np.asarray(versions, np.int32), rows["action"].shape[:2]).copy()  # (envs, T + 1)
        self._sender.send(columns)

    def _book_episodes(self) -> None:
        returns, lengths = self._env.pop_episodes()
        if len(returns):
            now = time.time()
            with self._lock:
                for ret, length in zip(returns.tolist(), lengths.tolist()):
                    self._episodes.append((now, ret, length))
                self._episode_count += len(returns)

    def _log_progress(self) -> None:
        stats = self.stats()
        ret = "-" if stats["mean_return"] is None else f"{stats['mean_return']:.1f}"
        print(f"{self.name}: {stats['env_steps']} env steps, {stats['steps_per_second']:.0f}/s, "
              f"{stats['episodes']} episodes, mean return {ret}, params v{stats['version']}, "
              f"sent {stats['sent']} dropped {stats['dropped']} errors {stats['send_errors']}", flush=True)


def _items(columns: dict[str, Any]) -> list[dict[str, Any]]:
    """Env-major columns ``(envs, T + 1, ...)`` -> one item per env of ``(T + 1, ...)`` views (a
    column that is a pytree, a recurrent state, split leaf by leaf)."""
    names = list(columns)
    return [dict(zip(names, views)) for views in zip(*(_per_env(columns[name]) for name in names))]


def _per_env(column: Any) -> list:
    if isinstance(column, np.ndarray):
        return list(column)
    import jax

    leaves, treedef = jax.tree.flatten(column)
    return [jax.tree.unflatten(treedef, parts) for parts in zip(*leaves)]


def _new_rows(timestep: Any, action: np.ndarray, rows: int, first: bool = False) -> dict[str, np.ndarray]:
    """Env-major buffers ``(envs, rows, ...)`` for one trajectory (with ``first``: a column of
    whether each row begins an episode). Fresh for each: the items a sink receives are views of
    them, and a sink may keep what it is given."""
    like = {"obs": timestep.obs, "reward": timestep.reward, "terminated": timestep.terminated,
            "truncated": timestep.truncated, "action": action}
    if first:
        like["first"] = timestep.first
    return {name: np.empty((len(x), rows, *np.shape(x)[1:]), np.asarray(x).dtype) for name, x in like.items()}


@functools.lru_cache(maxsize=None)
def _stacker() -> Callable:
    import jax

    return jax.jit(lambda rows: jax.tree.map(lambda *xs: jax.numpy.stack(xs, axis=1), *rows))


def _stack_env_major(rows: list) -> Any:
    """Device pytrees of the T + 1 rows -> one pytree of ``(envs, T + 1, ...)``, in one dispatch."""
    return _stacker()(rows)


def _block(tree: Any) -> Any:
    import jax

    return jax.block_until_ready(tree)


def jitted_step(policy: Policy, rng_impl: str | None = None) -> Callable:
    """``(params, obs, key_data) -> (key_data, action, extras)``: the jitted step of ``policy``,
    shared by the actors of one process (one compile); of a recurrent policy
    ``(params, obs, key_data, state, first) -> (key_data, action, extras, state)``."""
    import jax

    try:
        return _STEPS[policy, rng_impl]
    except TypeError:  # an unhashable policy: jit it for this actor alone
        return jax.jit(functools.partial(_policy_step, policy, rng_impl))
    except KeyError:
        step = _STEPS[policy, rng_impl] = jax.jit(functools.partial(_policy_step, policy, rng_impl))
        return step


_STEPS: dict[Any, Callable] = {}


def _policy_step(policy: Policy, rng_impl: str | None, params: Any, obs: Any, key_data: Any,
                 *memory: Any) -> tuple[Any, ...]:
    import jax

    key, sample_key = jax.random.split(jax.random.wrap_key_data(key_data, impl=rng_impl))
    return jax.random.key_data(key), *policy(params, obs, sample_key, *memory)


def _make_send(sink: Any, table: str, timeout: float) -> tuple[Callable[[dict], Any] | None, Room | None]:
    """How to send a trajectory to ``sink``, and, for a replay node, how to wait for its room."""
    if sink is None:
        return None, None
    from jaxdist.nodes.replay import ReplayClient

    if isinstance(sink, courier.Client):
        sink = ReplayClient(sink)
    if isinstance(sink, ReplayClient):
        return functools.partial(_insert, sink, table, timeout), functools.partial(_room, sink, table)
    if callable(sink):
        return functools.partial(_send_items, sink), None
    raise TypeError(f"an actor's sink is a replay node client, a callable sink(items), or None; got "
                    f"{type(sink).__name__}")


def _insert(replay: Any, table: str, timeout: float, columns: dict[str, np.ndarray]) -> None:
    replay.insert_batch(columns, table=table, timeout=timeout)  # a node shutting down: ConnectionError


def _room(replay: Any, table: str, items: int, wait: float) -> "futures.Future[bool]":
    return replay.futures.can_insert(items, table=table, wait=wait, hold=ROOM_HOLD)


def _send_items(sink: Callable[[list], Any], columns: dict[str, np.ndarray]) -> Any:
    return sink(_items(columns))


class _Sender:
    """Sends trajectories (env-major columns) on background threads, at most
    ``max_in_flight`` pending; see the module doc. A send that fails because the receiver is
    away (``ConnectionError``, ``TimeoutError``, a call cancelled by a server shutting down: a
    restarting replay node, a full queue) is
    retried with jittered exponential backoff for up to ``retry_for`` seconds, holding its slot;
    other errors (a malformed item) fail at once. Without a sink the trajectories are made and
    dropped (benchmarks)."""

    def __init__(self, send: Callable[[dict], Any] | None, max_in_flight: int, max_wait: float, name: str,
                 room: Room | None = None, retry_for: float = 60.0, backoff: tuple[float, float] = (0.05, 2.0),
                 stopping: Callable[[], bool] = lambda: False) -> None:
        self._send, self._max_in_flight, self._max_wait, self._name = send, max_in_flight, max_wait, name
        self._room = room
        self._stopping = stopping
        self._retry_for, self._backoff = retry_for, backoff
        self._executor = futures.ThreadPoolExecutor(max_in_flight, thread_name_prefix="actor-send")
        self._pending: collections.deque[futures.Future] = collections.deque()
        self._counts = {"trajectories": 0, "sent": 0, "dropped": 0, "send_errors": 0, "send_retries": 0}
        self._wait_seconds = 0.0
        self._closed = threading.Event()
        self._lock = threading.Lock()
        self._outage: dict[str, Any] | None = None  # since when sends fail, and what was lost meanwhile
        self._failing = False

    def send(self, columns: dict[str, np.ndarray]) -> None:
        has_slot = self.wait_for_room()
        # Counted with its fate, under the lock `counts` reads: made = sent + dropped + errors +
        # in flight whenever another thread asks.
        with self._lock:
            self._counts["trajectories"] += 1
            if has_slot:
                self._pending.append(self._executor.submit(self._send_columns, columns))
            else:
                self._counts["dropped"] += 1

    def wait_for_room(self, items: int = 0) -> bool:
        """Wait, at most ``max_wait`` seconds, until fewer than ``max_in_flight`` sends are
        pending and, given ``items``, until the sink would take that many more (when it can
        tell); True if there is a free send slot."""
        self._reap()
        start = time.monotonic()
        deadline = start + self._max_wait
        # In slices, so that a stop does not wait out max_wait behind a receiver that is gone.
        while len(self._pending) >= self._max_in_flight and not self._stopping():
            left = deadline - time.monotonic()
            if left <= 0:
                break
            futures.wait(list(self._pending), timeout=min(left, 0.05), return_when=futures.FIRST_COMPLETED)
            self._reap()
        has_slot = len(self._pending) < self._max_in_flight
        if has_slot and items and self._room is not None:
            self._wait_for_sink(items, deadline)
        self._wait_seconds += time.monotonic() - start
        return has_slot

    def _wait_for_sink(self, items: int, deadline: float) -> None:
        """Until the sink has room for ``items`` or ``deadline``; a sink that is away or refuses
        ends the wait (the send then rides out the outage, or counts the error)."""
        while not self._stopping():
            asked, wait = time.monotonic(), min(deadline - time.monotonic(), 0.25)
            if wait <= 0:
                return
            answer = self._room(items, wait)
            while not answer.done():  # in slices: a stop does not wait on a sink that is gone
                if self._stopping():
                    return  # the call is left to its deadline
                futures.wait([answer], timeout=0.05)
            try:
                if answer.result():
                    return
            except Exception:  # noqa: BLE001 - a sink away or refusing: the send reports it
                return
            if time.monotonic() - asked < wait / 2:  # a busy sink answered without waiting
                time.sleep(0.01)

    def _send_columns(self, columns: dict[str, np.ndarray]) -> None:
        if self._send is None:
            return
        delay, give_up_at = self._backoff[0], time.monotonic() + self._retry_for
        while True:
            try:
                self._send(columns)
                return
            # The receiver is away and may come back (a server shutting down cancels the calls in flight).
            except (ConnectionError, TimeoutError, futures.CancelledError) as exc:
                wait = delay * (0.5 + random.random())
                if time.monotonic() + wait > give_up_at or self._closed.is_set():
                    raise
                self._in_outage(exc)
                if self._closed.wait(wait):
                    raise
                delay = min(2 * delay, self._backoff[1])

    def drain(self) -> None:
        """Wait, at most ``max_wait`` seconds, for the sends in flight."""
        if self._pending:
            futures.wait(list(self._pending), timeout=self._max_wait)
            self._reap()

    def counts(self) -> dict[str, Any]:
        with self._lock:
            return dict(self._counts, in_flight=len(self._pending), send_wait_seconds=round(self._wait_seconds, 3))

    def close(self) -> None:
        self._closed.set()  # sends waiting to retry give up
        self._executor.shutdown(wait=False, cancel_futures=True)

    def _in_outage(self, error: BaseException) -> None:
        """Counts a retry, and when sends began to fail (reported by ``_reap`` if it lasts)."""
        with self._lock:
            self._counts["send_retries"] += 1
            if self._outage is None:
                self._outage = {"since": time.monotonic(), "dropped": self._counts["dropped"], "reported": False,
                                "error": _first_line(error)}

    def _report_outage(self) -> None:
        """Says in the log that sends fail, once they have for OUTAGE_REPORT_AFTER seconds."""
        with self._lock:
            outage = self._outage
            if outage is None or outage["reported"] or time.monotonic() - outage["since"] < OUTAGE_REPORT_AFTER:
                return
            outage["reported"] = True
        print(f"{self._name}: sending trajectories has failed for {time.monotonic() - outage['since']:.1f} s, "
              f"retrying with backoff (acting goes on): {outage['error']}", flush=True)

    def _reap(self) -> None:
        self._report_outage()  # first: an outage that lasted is reported even if it ends now
        for future in [f for f in self._pending if f.done()]:
            error = future.exception() if not future.cancelled() else None
            with self._lock:
                self._pending.remove(future)
                self._counts["sent" if error is None else "send_errors"] += 1
                outage = self._outage
                if error is None and outage is not None:
                    self._outage = None
            if error is None:
                self._failing = False
                if outage is not None and outage["reported"]:
                    print(f"{self._name}: sends succeed again after {time.monotonic() - outage['since']:.1f} s; "
                          f"{self._counts['dropped'] - outage['dropped']} trajectories dropped meanwhile "
                          f"(at most {self._max_in_flight} held for retry)", flush=True)
            elif not self._failing:  # once until a send succeeds again
                self._failing = True
                print(f"{self._name}: a trajectory was not sent (acting goes on): {type(error).__name__}: "
                      f"{_first_line(error)}", flush=True)


def _first_line(error: BaseException) -> str:
    text = str(error)
    return text.splitlines()[0] if text else type(error).__name__


class InferenceClient:
    """An actor's side of an inference node (``jaxdist.nodes.inference``), in the place of its
    ``VariableClient``: ``act`` retried with jittered backoff (0.05 s doubling to 1 s) while the
    node is away (starting, or restarted by the launcher), for up to ``retry_for`` seconds;
    ``version`` and ``stats`` (``errors``: calls that found it away) as a ``VariableClient`` has them."""

    def __init__(self, server: Any, retry_for: float = 60.0, first_fetch_timeout: float = 300.0) -> None:
        self._server, self._retry_for, self._first_fetch_timeout = server, retry_for, first_fetch_timeout
        self.version = -1
        self.stats = {"errors": 0}

    def latest(self) -> tuple[int, None]:
        """Wait until the node holds parameters: ``(version, None)`` (the parameters stay there)."""
        give_up_at = time.monotonic() + self._first_fetch_timeout
        while True:
            version = self._call(self._server.stats, give_up_at)["version"]
            if version >= 0:
                self.version = version
                return version, None
            if time.monotonic() > give_up_at:
                raise TimeoutError(f"the inference node held no parameters within {self._first_fetch_timeout} s; "
                                   f"is the learner publishing?")
            time.sleep(0.05)

    def act(self, obs: np.ndarray) -> tuple[np.ndarray, dict[str, np.ndarray], int]:
        """``(action, extras, version)`` for ``obs``, the observations of one actor's envs."""
        action, extras, version = self._call(lambda: self._server.act(obs), time.monotonic() + self._retry_for)
        self.version = int(version)
        return action, extras, self.version

    def _call(self, call: Any, give_up_at: float) -> Any:
        delay = 0.05
        while True:
            try:
                return call()
            except (ConnectionError, TimeoutError, futures.CancelledError):  # away: starting or restarting
                self.stats["errors"] += 1
                wait = delay * (0.5 + random.random())
                if time.monotonic() + wait > give_up_at:
                    raise
                time.sleep(wait)
                delay = min(2 * delay, 1.0)

    def close(self) -> None:
        """Nothing to release: the calls are the actor's own."""


__all__ = ["Actor", "InferenceClient", "Policy", "jitted_step"]
