"""The actors' JAX env backend: trajectories in the gymnasium actor's layout and row convention,
autoreset and episode statistics inside the scan, clipped continuous actions, gymnax's envs."""

from __future__ import annotations

import time

import gymnasium as gym
import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxdist.envs import jax_envs, jax_rollout
from jaxdist.agents.actor_critic import ActorCritic
from jaxdist.agents.actor_critic import ActorCriticPolicy
from jaxdist.envs.vector import EnvSpec
from jaxdist.nodes.actor import Actor
from jaxdist.nodes.parameter_server import ParameterServer
from jaxdist.envs.spaces import ActionSpace, EnvInfo

CARTPOLE = EnvInfo((4,), "float32", ActionSpace(num_actions=2))
POLICY = ActorCriticPolicy(CARTPOLE, "mlp", (8,))


def params(seed: int = 0):
    network = ActorCritic(action=CARTPOLE.action, hidden=(8,))
    return {"network": jax.tree.map(np.asarray, network.init(jax.random.key(seed), np.zeros((1, 4), np.float32)))}


def act(policy, spec: EnvSpec, source, trajectory_length: int, max_steps: int) -> tuple[list[list[dict]], Actor]:
    """Every send of an actor run to ``max_steps``, in order (one list of per-env items each)."""
    sends: list[list[dict]] = []
    actor = Actor(policy, spec, source, sends.append, trajectory_length=trajectory_length, max_steps=max_steps,
                  max_in_flight=1, max_send_wait=30.0)
    try:
        actor.run()
    finally:
        actor.close()
    return sends, actor


def always_left(params, obs, key):
    return jnp.zeros(obs.shape[0], jnp.int32), {"logp": jnp.zeros(obs.shape[0])}


def test_jax_trajectories_have_the_gymnasium_actors_keys_shapes_dtypes_and_overlap():
    layouts = {}
    for backend, steps in (("vector", 51), ("jax", 50)):  # the step loop sends after row T's policy call
        sends, actor = act(POLICY, EnvSpec("CartPole-v1", 3, backend), ParameterServer(params(), version=7),
                           trajectory_length=10, max_steps=3 * steps)
        assert len(sends) == 5 and all(len(items) == 3 for items in sends)
        layouts[backend] = {name: (x.shape, x.dtype) for name, x in sends[0][0].items()}
        for before, after in zip(sends, sends[1:]):  # the last row of one trajectory is the next one's first
            chex.assert_trees_all_equal(jax.tree.map(lambda x: x[-1], before), jax.tree.map(lambda x: x[0], after))
        first = sends[0][0]
        assert first["reward"][0] == 0 and not first["terminated"][0] and first["version"].tolist() == [7] * 11
        assert actor.stats()["env_steps"] == 3 * steps
    assert layouts["jax"] == layouts["vector"]


def test_autoreset_rows_and_episode_statistics_agree_with_the_rows_and_with_gymnasium():
    """Always pushing left, a CartPole episode lasts 8-12 steps: the actor's episode returns and
    lengths are those written in its rows (an ended row, then a reset row earning 0), and their
    distribution is gymnasium's."""
    sends, actor = act(always_left, EnvSpec("CartPole-v1", 4, "jax"), ParameterServer({}, version=0),
                       trajectory_length=16, max_steps=4 * 16 * 40)
    from_rows = []
    for env in range(4):
        rows = {name: np.concatenate([items[env][name][(0 if i == 0 else 1):] for i, items in enumerate(sends)])
                for name in ("obs", "reward", "terminated", "truncated")}
        ended = rows["terminated"] | rows["truncated"]
        assert (rows["reward"][1:][ended[:-1]] == 0).all() and (rows["reward"][1:][~ended[:-1]] == 1).all()
        assert (np.abs(rows["obs"][1:][ended[:-1]]) <= 0.05).all()  # a fresh start state after each end
        steps = np.flatnonzero(ended)
        starts = np.concatenate([[0], steps[:-1] + 1])
        from_rows += list(steps - starts)
    episodes = actor.episodes()
    assert sorted(episodes["lengths"]) == sorted(from_rows) and episodes["returns"] == [float(n) for n in
                                                                                         episodes["lengths"]]
    env = gym.make("CartPole-v1")
    gymnasium_lengths = []
    for seed in range(200):
        env.reset(seed=seed)
        length, done = 0, False
        while not done:
            _, _, terminated, truncated, _ = env.step(0)
            length, done = length + 1, terminated or truncated
        gymnasium_lengths.append(length)
    assert len(from_rows) > 200 and set(from_rows) <= set(range(8, 13)) and set(gymnasium_lengths) <= set(range(8, 13))
    assert np.mean(from_rows) == pytest.approx(np.mean(gymnasium_lengths), abs=0.3)


def test_each_step_is_the_ports_dynamics_and_the_policys_action():
    port = jax_envs.jax_env("CartPole-v1")
    sends, _ = act(POLICY, EnvSpec("CartPole-v1", 2, "jax"), ParameterServer(params(1), version=0),
                   trajectory_length=32, max_steps=2 * 64)
    for item in (items[env] for items in sends for env in range(2)):
        for t in range(32):
            if item["terminated"][t] or item["truncated"][t]:
                continue  # the next row is a reset
            out = port.step(jax_envs.State(jnp.asarray(item["obs"][t]), jnp.zeros((), jnp.int32)), item["action"][t])
            np.testing.assert_allclose(np.asarray(out.obs), item["obs"][t + 1], rtol=1e-6, atol=1e-6)
        network = ActorCritic(action=CARTPOLE.action, hidden=(8,))
        logits = network.apply(params(1)["network"], item["obs"], method="policy")
        np.testing.assert_allclose(item["logp"], jax.nn.log_softmax(logits)[np.arange(33), item["action"]],
                                   rtol=1e-5, atol=1e-6)


def out_of_bounds_policy(params, obs, key):
    return jnp.full((obs.shape[0], 1), 5.0, jnp.float32), {"logp": jnp.zeros(obs.shape[0])}


class Fixed:
    """A parameter source that always has version 3 of no parameters."""

    def get(self, min_version=-1, wait=0.0):
        return {"version": 3, "params": {} if min_version < 3 else None}


def test_continuous_actions_are_sent_whole_and_reach_the_env_clipped():
    sends, _ = act(out_of_bounds_policy, EnvSpec("Pendulum-v1", 2, "jax"), Fixed(), trajectory_length=5,
                   max_steps=2 * 5 * 3)
    port = jax_envs.jax_env("Pendulum-v1")
    for item in (items[env] for items in sends for env in range(2)):
        assert item["action"].shape == (6, 1) and (item["action"] == 5.0).all() and (item["version"] == 3).all()
        cos, sin, thdot = item["obs"].T
        for t in range(5):  # the reward is the cost of the clipped torque (2.0), not of 5.0
            physics = jnp.asarray([np.arctan2(sin[t], cos[t]), thdot[t]])
            _, reward, _ = port.physics_step(physics, jnp.asarray([2.0], jnp.float32))
            assert item["reward"][t + 1] == pytest.approx(float(reward), rel=1e-4, abs=1e-4)


def test_an_env_without_a_jax_version_is_refused_naming_those_that_have_one():
    with pytest.raises(ValueError, match=r"no JAX version of 'Ant-v5': jaxdist.envs.jax_envs ports CartPole-v1, "
                                         r"Pendulum-v1; gymnax's Acrobot-v1"):
        EnvSpec("Ant-v5", 2, "jax").make(seed=0)
    with pytest.raises(ValueError, match="backend 'jax' takes none"):
        EnvSpec("CartPole-v1", 2, "jax", kwargs={"max_episode_steps": 5})


def test_a_gymnax_env_plays_in_the_actor_with_gymnasiums_spaces():
    pytest.importorskip("gymnax", reason="gymnax comes with jaxdist[jaxenv] (and [dev])")
    from jaxdist.envs.spaces import env_info

    info = env_info("Acrobot-v1")
    policy = ActorCriticPolicy(info, "mlp", (8,))
    network = ActorCritic(action=info.action, hidden=(8,))
    net_params = network.init(jax.random.key(0), np.zeros((1, *info.obs_shape), np.float32))
    sends, actor = act(policy, EnvSpec("Acrobot-v1", 2, "jax"), ParameterServer({"network": net_params}, version=0),
                       trajectory_length=100, max_steps=2 * 100 * 6)
    item = sends[0][0]
    assert item["obs"].shape == (101, *info.obs_shape) and item["obs"].dtype == np.dtype(info.obs_dtype)
    assert set(np.unique(item["action"])) <= {0, 1, 2}
    episodes = actor.episodes()  # a random policy rarely swings up: episodes are cut at gymnasium's 500 steps
    assert episodes["lengths"] and all(n <= 500 for n in episodes["lengths"]) and 500 in episodes["lengths"]
    ended = [(it["terminated"], it["truncated"]) for items in sends for it in items]
    assert any(truncated.any() for _, truncated in ended)


def test_gymnax_cartpole_steps_as_jaxdists_port_with_termination_apart_from_truncation():
    pytest.importorskip("gymnax", reason="gymnax comes with jaxdist[jaxenv] (and [dev])")
    from gymnax.environments.classic_control.cartpole import EnvState

    gymnax_cartpole, port = jax_envs.gymnax_env("CartPole-v1"), jax_envs.jax_env("CartPole-v1")
    assert (gymnax_cartpole.obs_size, gymnax_cartpole.action_size, gymnax_cartpole.discrete,
            gymnax_cartpole.max_steps) == (port.obs_size, port.action_size, port.discrete, port.max_steps)
    key = jax.random.key(0)
    rng = np.random.default_rng(0)
    for start in range(3):
        state, obs = gymnax_cartpole.reset(jax.random.fold_in(key, start))
        for t in range(200):
            action = jnp.asarray(int(rng.integers(2)))
            theirs = gymnax_cartpole.step(state, action, key)
            ours = port.step(jax_envs.State(obs, jnp.asarray(t, jnp.int32)), action)
            np.testing.assert_allclose(np.asarray(theirs.obs), np.asarray(ours.obs), rtol=1e-5, atol=1e-6)
            assert (float(theirs.reward), bool(theirs.terminated), bool(theirs.truncated)) == (
                float(ours.reward), bool(ours.terminated), bool(ours.truncated))
            if theirs.terminated:
                break
            state, obs = theirs.state, theirs.obs
        assert theirs.terminated
    at_limit = EnvState(x=0.0, x_dot=0.0, theta=0.0, theta_dot=0.0, time=499)  # upright at the last step: truncated, not terminated
    out = gymnax_cartpole.step(at_limit, jnp.asarray(1), key)
    assert (bool(out.terminated), bool(out.truncated)) == (False, True)


class Settable:
    """A parameter source whose version the test sets."""

    def __init__(self) -> None:
        self.version = 1

    def get(self, min_version=-1, wait=0.0):
        return {"version": self.version, "params": params() if min_version < self.version else None}


def test_a_trajectory_waits_for_room_to_send_before_it_is_played_so_it_acts_with_the_newest_parameters():
    """Back-pressure comes first: the trajectory after a blocked send is played with the version
    published while the actor waited (played first, it would carry the version before)."""
    import threading

    from waiting import wait_until

    source, release, sends = Settable(), threading.Event(), []

    def sink(items):
        sends.append(items)
        release.wait(30)

    actor = Actor(POLICY, EnvSpec("CartPole-v1", 2, "jax"), source, sink, trajectory_length=4, max_steps=2 * 4 * 2,
                  max_in_flight=1, max_send_wait=30.0, refresh_every_seconds=0.01)
    thread = threading.Thread(target=actor.run, daemon=True)
    thread.start()
    try:
        wait_until(lambda: len(sends) == 1)  # the first send hangs in the sink; the actor waits for room
        source.version = 2
        wait_until(lambda: actor.stats()["version"] == 2)
        release.set()
        thread.join(timeout=30)
    finally:
        release.set()
        actor.close()
    assert [items[0]["version"].tolist() for items in sends] == [[1] * 5, [1] + [2] * 4]


@pytest.mark.parametrize("backend, max_steps", [("jax", 2 * 4 * 2), ("vector", (2 * 4 + 1) * 2)])
def test_a_trajectory_is_played_once_the_queue_has_room_for_it_with_the_parameters_published_by_then(
        tmp_path, backend, max_steps):
    """Into a queue the learner drains, a trajectory played ahead waited in a blocked send while
    the learner moved on, and carried parameters up to a refresh period older still: PPO learned
    from data 4-6 versions old, and discarded a third or more of it as stale. Now the actor,
    a trajectory a dispatch or a step at a time, plays once the queue would take the trajectory,
    with parameters fetched then (here the background refresh alone would take 60 s)."""
    import threading

    import jaxdist as jd
    from jaxdist import courier
    from jaxdist.nodes.replay import Fifo, ReplayClient, ReplayNode
    from waiting import wait_until

    program = jd.Program("room")
    handle = program.add_node(ReplayNode(Fifo(2), max_wait=0.2))
    running = jd.launch(program, launcher="threads", run_dir=str(tmp_path), echo=False)
    source = Settable()
    try:
        queue = ReplayClient(courier.Client(running.addresses[handle.node_name], token=running.token))
        actor = Actor(POLICY, EnvSpec("CartPole-v1", 2, backend), source, queue, trajectory_length=4,
                      max_steps=max_steps, max_in_flight=1, max_send_wait=30.0, refresh_every_seconds=60.0)
        thread = threading.Thread(target=actor.run, daemon=True)
        thread.start()
        wait_until(lambda: queue.size() == 2, "the first trajectory in the queue")
        time.sleep(0.5)
        assert actor.stats()["trajectories"] == 1  # the next one waits for room, unplayed
        source.version = 2
        first = queue.sample(2)["data"]
        wait_until(lambda: queue.size() == 2, "the second trajectory in the queue")
        second = queue.sample(2)["data"]
        thread.join(timeout=30)
        assert not thread.is_alive()
        actor.close()
    finally:
        running.stop()
    assert first["version"].tolist() == [[1, 1, 1, 1, 1]] * 2
    assert second["version"].tolist() == [[1, 2, 2, 2, 2]] * 2


def test_whole_episodes_in_one_scan_are_the_ports_episodes_played_step_by_step():
    """``jax_rollout.episodes`` (the evaluations of the evaluator, Anakin and ES): each episode's
    return and length are those of the port stepped from Python from the same start state, the
    steps after its end masked; a policy that always pushes one way ends in a few steps."""
    from jaxdist.envs.jax_rollout import episodes

    env = jax_envs.jax_env("CartPole-v1")
    greedy = ActorCriticPolicy(CARTPOLE, "mlp", (8,), deterministic=True)
    push_left = lambda p, obs, key: (jnp.zeros(obs.shape[0], jnp.int32), {})  # noqa: E731
    reset_keys = jax.random.split(jax.random.key(7), 5)
    for policy in (greedy, push_left):
        returns, lengths = jax.jit(lambda p, keys: episodes(policy, env, p, keys, jax.random.key(0)))(params(), reset_keys)
        for key, episode_return, length in zip(reset_keys, np.asarray(returns), np.asarray(lengths)):
            state, obs = env.reset(key)
            total, steps, done = 0.0, 0, False
            while not done:
                action, _ = policy(params(), obs[None], jax.random.key(0))
                out = env.step(state, action[0])
                state, obs, total, steps = out.state, out.obs, total + float(out.reward), steps + 1
                done = bool(out.terminated | out.truncated)
            assert (episode_return, length) == (total, steps)
    assert (np.asarray(lengths) < 20).all()  # push_left topples the pole at once


def test_compiled_from_the_parameters_shapes_start_and_trajectories_compile_nothing_more(caplog):
    """An actor compiles its trajectory from the shapes of the parameters while the learner
    starts: once the parameters come, starting and playing reuse that compile."""
    env = EnvSpec("CartPole-v1", 5, backend="jax").make(seed=5)  # shapes no other test compiles
    shapes = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), params(1))
    with jax.log_compiles():
        env.compile(POLICY, shapes, 11)
        compiled = sum("Compiling" in record.getMessage() for record in caplog.records)
        env.start(POLICY, params(1), 11)
        columns = env.trajectory(params(1))
        env.trajectory(params(2))
    compiles = [record.getMessage() for record in caplog.records if "Compiling" in record.getMessage()]
    assert compiled >= 2 and len(compiles) == compiled, compiles[compiled:]
    assert columns["obs"].shape == (5, 12, 4)


CARTPOLE_PORT = jax_envs.jax_env("CartPole-v1")


def push_left(params, obs, key):
    """A fixed policy: CartPole falls over in about ten steps, so episodes end inside a rollout."""
    return jnp.zeros(obs.shape[0], jnp.int32), {"logp": jnp.zeros(obs.shape[0])}


def fresh_envs(num_envs: int) -> dict:
    return jax_rollout.start(push_left, CARTPOLE_PORT, None, num_envs, jax.random.key(0))


def test_a_rollout_has_the_actors_rows_and_resets_after_each_ended_row():
    envs = fresh_envs(3)
    after, rows, (returns, _, ended) = jax.jit(jax_rollout.play, static_argnums=(0, 1, 5))(
        push_left, CARTPOLE_PORT, None, envs, jax.random.key(1), 40)
    assert rows["obs"].shape == (3, 41, 4) and rows["action"].shape == (3, 41) and rows["logp"].shape == (3, 41)
    rows, returns, ended = jax.device_get((rows, returns, ended))
    np.testing.assert_array_equal(rows["obs"][:, 0], envs["row"]["obs"])  # starts where the envs were
    np.testing.assert_array_equal(rows["obs"][:, -1], after["row"]["obs"])  # and hands its last row on
    finished = rows["terminated"] | rows["truncated"]
    assert finished[:, 1:].sum() >= 3 * 3  # several episodes each
    # The row after an ended one is a reset: no reward, not ended (the action chosen on it is ignored).
    follows_end = np.zeros_like(finished)
    follows_end[:, 1:] = finished[:, :-1]
    assert (rows["reward"][follows_end] == 0).all() and not finished[follows_end].any()
    # CartPole pays 1 a step: an episode's return is the steps from its reset to its end.
    for env in range(3):
        ends = np.flatnonzero(finished[env, 1:]) + 1
        starts = np.concatenate([[0], ends[:-1] + 1])
        np.testing.assert_array_equal(returns[ends - 1, env], ends - starts)
        assert ended[ends - 1, env].all() and ended[:, env].sum() == len(ends)


def test_consecutive_rollouts_share_a_row_whole_as_actors_trajectories_do():
    """Anakin plays these rollouts too: one convention for the row two trajectories share, its
    action chosen once."""
    envs = fresh_envs(2)
    roll = jax.jit(jax_rollout.play, static_argnums=(0, 1, 5))
    envs, first, _ = roll(push_left, CARTPOLE_PORT, None, envs, jax.random.key(1), 8)
    _, second, _ = roll(push_left, CARTPOLE_PORT, None, envs, jax.random.key(2), 8)
    shared = lambda trajectories, row: {name: trajectories[name][:, row]  # noqa: E731
                                        for name in ("obs", "reward", "terminated", "truncated", "action", "logp")}
    chex.assert_trees_all_equal(shared(first, -1), shared(second, 0))
