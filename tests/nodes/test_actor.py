"""The actor: trajectory layout, parameter versions, episode reports, and acting on through a
parameter source or a sink that goes away."""

from __future__ import annotations

import threading
import time

import chex
import jax
import numpy as np
import pytest

import jaxdist as jd
from jaxdist import courier
from jaxdist.agents.actor_critic import ActorCritic
from jaxdist.agents.actor_critic import ActorCriticPolicy
from jaxdist.envs.spaces import ActionSpace, EnvInfo
from jaxdist.envs.vector import EnvSpec
from jaxdist.nodes import actor as actor_module
from jaxdist.nodes.actor import OUTAGE_REPORT_AFTER, Actor
from jaxdist.nodes.replay import Fifo
from jaxdist.nodes.parameter_server import ParameterServer
from waiting import returns, wait_until

CARTPOLE = EnvInfo((4,), "float32", ActionSpace(num_actions=2))
NETWORK = ActorCritic(action=CARTPOLE.action, hidden=(8,))
POLICY = ActorCriticPolicy(CARTPOLE, "mlp", (8,))


def params(seed: int = 0):
    """What a learner publishes: ``{"network": ...}``."""
    return {"network": jax.tree.map(np.asarray, NETWORK.init(jax.random.key(seed), np.zeros((1, 4), np.float32)))}


class ListSink:
    def __init__(self) -> None:
        self.sends: list[list[dict]] = []

    def __call__(self, items: list[dict]) -> None:
        self.sends.append(items)


def test_trajectories_overlap_by_one_row_and_carry_versions_and_boundaries():
    sink = ListSink()
    actor = Actor(POLICY, EnvSpec("CartPole-v1", 3), ParameterServer(params(), version=7), sink,
                  trajectory_length=10, max_steps=3 * 51)  # 51 policy steps: 5 sends
    try:
        actor.run()
    finally:
        actor.close()
    wait_until(lambda: len(sink.sends) == 5)
    first, second = sink.sends[0], sink.sends[1]
    assert len(first) == 3  # one item per env
    item = first[0]
    assert set(item) == {"obs", "reward", "terminated", "truncated", "action", "logp", "version"}
    assert item["obs"].shape == (11, 4) and item["action"].shape == (11,) and item["version"].tolist() == [7] * 11
    assert item["reward"][0] == 0  # the reset row
    # The last row of a trajectory is the first row of the next.
    chex.assert_trees_all_equal(jax.tree.map(lambda x: x[-1], first), jax.tree.map(lambda x: x[0], second))
    for items in sink.sends:  # the autoreset boundary: a row after an ending row earns nothing
        for it in items:
            ended = it["terminated"] | it["truncated"]
            assert (it["reward"][1:][ended[:-1]] == 0).all() and (it["reward"][1:][~ended[:-1]] == 1).all()
    stats = actor.stats()
    assert stats["env_steps"] == 153 and stats["version"] == 7 and stats["sent"] == 5
    episodes = actor.episodes()
    assert episodes["next"] == stats["episodes"] > 0 and len(episodes["returns"]) == stats["episodes"]
    assert actor.episodes(since=episodes["next"])["returns"] == []
    assert stats["mean_return"] == pytest.approx(np.mean(episodes["returns"][-20:]))


def test_logp_is_the_acting_policys_log_probability_of_the_action():
    sink = ListSink()
    p = params(1)
    actor = Actor(POLICY, EnvSpec("CartPole-v1", 2), ParameterServer(p, version=1), sink, trajectory_length=8,
                  max_steps=2 * 9)
    actor.run()
    actor.close()
    item = sink.sends[0][0]
    logits = NETWORK.apply(p["network"], item["obs"], method="policy")
    expected = jax.nn.log_softmax(logits)[np.arange(9), item["action"]]
    np.testing.assert_allclose(item["logp"], expected, rtol=1e-5, atol=1e-6)


def test_acting_goes_on_while_the_parameter_server_restarts_and_new_versions_are_picked_up():
    server = courier.Server(ParameterServer(params(), version=1)).start()
    address = server.address
    sink = ListSink()
    actor = Actor(POLICY, EnvSpec("CartPole-v1", 2), courier.Client(address, timeout=5), sink,
                  trajectory_length=4, refresh_every_seconds=0.05)
    thread = threading.Thread(target=actor.run, daemon=True)
    thread.start()
    try:
        wait_until(lambda: actor.stats()["env_steps"] > 100)
        server.stop(grace=0)  # the parameter server goes away
        steps = actor.stats()["env_steps"]
        wait_until(lambda: actor.stats()["env_steps"] > steps + 1000)  # still acting, with version 1
        assert actor.stats()["version"] == 1
        server = courier.Server(ParameterServer(params(2), version=5), address=address).start()  # back
        wait_until(lambda: actor.stats()["version"] == 5)
        wait_until(lambda: sink.sends and sink.sends[-1][0]["version"][-1] == 5)
    finally:
        actor._max_steps = 0  # ends run()
        thread.join(timeout=10)
        actor.close()
        server.stop(grace=0)


def test_a_sink_that_blocks_does_not_stop_acting_and_what_it_cannot_take_is_dropped_and_counted():
    release = threading.Event()
    calls = []

    def sink(items):
        calls.append(len(items))
        if len(calls) == 1:
            raise ConnectionError("replay is away")  # retried after a backoff
        release.wait(30)  # then the receiver hangs

    actor = Actor(POLICY, EnvSpec("CartPole-v1", 2), ParameterServer(params(), version=0), sink,
                  trajectory_length=4, max_in_flight=1, max_send_wait=0.05, max_steps=2 * 4 * 30)
    try:
        actor.run()  # returns: never stuck behind the hanging send
        stats = actor.stats()
        assert stats["env_steps"] == 240
        assert stats["send_retries"] == 1 and len(calls) == 2
        assert stats["dropped"] >= 20 and stats["send_wait_seconds"] > 0
        assert stats["trajectories"] == stats["sent"] + stats["dropped"] + stats["send_errors"] + stats["in_flight"]
    finally:
        release.set()
        actor.close()


def test_a_malformed_send_is_not_retried_and_is_counted_as_an_error():
    def sink(items):
        raise ValueError("cannot store this item")

    actor = Actor(POLICY, EnvSpec("CartPole-v1", 2), ParameterServer(params(), version=0), sink,
                  trajectory_length=4, max_in_flight=1, max_send_wait=1.0, max_steps=2 * 4 * 5)
    try:
        actor.run()
        stats = actor.stats()
        assert stats["send_retries"] == 0 and stats["sent"] == 0
        assert stats["send_errors"] == stats["trajectories"] - stats["in_flight"] >= 3
    finally:
        actor.close()


class Recorder:
    """A receiver served over real gRPC with the replay node's insert_batch signature; it stops
    answering (calls stay in flight) once it holds ``hang_after`` items."""

    def __init__(self, hang_after: int | None = None) -> None:
        self.items: list[dict] = []
        self._hang_after = hang_after
        self.released = threading.Event()

    def insert_batch(self, batch, priorities=None, table="default", timeout=None):
        if self._hang_after is not None and len(self.items) >= self._hang_after:
            self.released.wait(30)
            raise RuntimeError("this answer never reaches the client")
        count = len(batch["reward"])
        self.items.extend({name: column[i] for name, column in batch.items()} for i in range(count))
        return list(range(count))


def distinct(items: list[dict]) -> set[bytes]:
    return {b"".join(np.ascontiguousarray(item[name]).tobytes() for name in sorted(item)) for item in items}


def test_trajectories_made_while_the_receiver_restarts_are_retried_into_a_bounded_buffer(capfd):
    first = Recorder(hang_after=10)
    server = courier.Server(first).start()
    address = server.address
    actor = Actor(POLICY, EnvSpec("CartPole-v1", 2), ParameterServer(params(), version=0),
                  courier.Client(address, timeout=2), trajectory_length=4, max_in_flight=3, max_send_wait=0.01,
                  name="actor-under-test")
    thread = threading.Thread(target=actor.run, daemon=True)
    thread.start()
    second = Recorder()
    try:
        wait_until(lambda: actor.stats()["in_flight"] == 3)  # three sends hang in the receiver
        server.stop(grace=0)  # which goes away (a replay node crashing) with the three in flight
        went_away = time.monotonic()
        first.released.set()
        # Cut calls are retried with backoff; retried calls wait for the server to come back.
        wait_until(lambda: actor.stats()["send_retries"] >= 3 and actor.stats()["dropped"] >= 5)
        # Until the outage is reported (OUTAGE_REPORT_AFTER at the least): on a loaded machine the
        # actor's thread may not look for a while, and a receiver back before then is never reported.
        log: list[str] = []
        wait_until(lambda: log.append(capfd.readouterr().out) or "sending trajectories has failed for" in "".join(log),
                   "the outage reported")
        assert time.monotonic() - went_away >= OUTAGE_REPORT_AFTER
        held = actor.stats()["in_flight"]
        assert held == 3  # the bounded buffer: every slot holds a trajectory being retried
        server = courier.Server(second, address=address).start()  # back at the same address
        # Each item once at least: a call that outlived its timeout on a loaded machine was stored
        # and is stored again by its retry (at least once, as the actor's docstring says).
        wait_until(lambda: actor.stats()["sent"] * 2 == len(distinct(first.items + second.items)) and
                   len(second.items) >= 2 * (held + 2))
        stats = actor.stats()
    finally:
        actor._max_steps = 0  # ends run()
        thread.join(timeout=10)
        actor.close()
        server.stop(grace=0)
    assert stats["send_errors"] == 0  # nothing given up: what was held got through
    # Every trajectory made is accounted for: sent, dropped (counted) or still in flight.
    assert stats["trajectories"] == stats["sent"] + stats["dropped"] + stats["in_flight"]
    log = "".join(log) + capfd.readouterr().out
    assert "actor-under-test: sending trajectories has failed for" in log and "retrying with backoff" in log
    assert "actor-under-test: sends succeed again after" in log and "trajectories dropped meanwhile" in log


def test_the_counts_add_up_whenever_they_are_read_even_while_a_trajectory_waits_for_a_slot():
    """Another thread reads stats() (a status call) while the actor runs. A trajectory was counted
    as made before it waited for a send slot, and a finished send left the slots before it was
    counted as sent: a read in between saw one trajectory more than it accounted for."""
    release = threading.Event()
    actor = Actor(POLICY, EnvSpec("CartPole-v1", 2), ParameterServer(params(), version=0),
                  lambda items: release.wait(30), trajectory_length=4, max_in_flight=1, max_send_wait=0.2)
    thread = threading.Thread(target=actor.run, daemon=True)
    thread.start()
    unbalanced = []
    try:
        wait_until(lambda: actor.stats()["dropped"] >= 1)  # the one slot held; the next ones wait, then drop
        for _ in range(100):
            stats = actor.stats()
            if stats["trajectories"] != stats["sent"] + stats["dropped"] + stats["send_errors"] + stats["in_flight"]:
                unbalanced.append(stats)
            time.sleep(0.01)
    finally:
        release.set()
        actor._max_steps = 0  # ends run()
        thread.join(timeout=10)
        actor.close()
    assert unbalanced == []


class ShuttingDownReplay(Recorder):
    """A replay node whose tables are closed (it is shutting down) until `reopen` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.reopen = threading.Event()
        self.refused = 0

    def insert_batch(self, batch, priorities=None, table="default", timeout=None):
        if not self.reopen.is_set():
            self.refused += 1
            closed = Fifo(4)
            closed.close()
            closed.insert_batch({"reward": np.zeros(1)})  # the table's own TableClosedError
        return super().insert_batch(batch, priorities, table, timeout)


def test_a_replay_node_shutting_down_is_an_outage_ridden_out_and_a_short_one_is_not_reported(capfd, monkeypatch):
    """A program's ordered stop takes the learner's process, with its queue, a moment before the
    actors: sends then met a closed table, each counted as lost and reported ("a trajectory was
    not sent ... TableClosedError") at the end of every successful demo run."""
    monkeypatch.setattr(actor_module, "OUTAGE_REPORT_AFTER", 10.0)  # "short" however loaded the machine
    replay = ShuttingDownReplay()
    server = courier.Server(replay).start()
    actor = Actor(POLICY, EnvSpec("CartPole-v1", 2), ParameterServer(params(), version=0),
                  courier.Client(server.address, timeout=5), trajectory_length=4, max_in_flight=2,
                  max_send_wait=0.01, name="actor-under-test")
    thread = threading.Thread(target=actor.run, daemon=True)
    thread.start()
    try:
        wait_until(lambda: replay.refused >= 2)
        replay.reopen.set()  # back within the time an outage goes unreported
        wait_until(lambda: actor.stats()["sent"] >= 4)
        stats = actor.stats()
    finally:
        actor._max_steps = 0
        thread.join(timeout=10)
        actor.close()
        server.stop(grace=0)
    assert stats["send_errors"] == 0 and stats["send_retries"] >= 2  # retried, not given up
    log = capfd.readouterr().out
    assert "was not sent" not in log and "failed" not in log and "succeed again" not in log, log


def test_a_stop_does_not_wait_out_max_send_wait_behind_a_receiver_that_is_gone(tmp_path):
    """A program's stop reaches an actor blocked on a full send slot at once: before, it waited
    ``max_send_wait`` (the demo's ordered stop took 2 s more, until the launcher interrupted it)."""
    release = threading.Event()
    program = jd.Program("blocked-actor")
    program.add_node(jd.CourierNode(Actor, POLICY, EnvSpec("CartPole-v1", 2), ParameterServer(params(), version=0),
                                    lambda items: release.wait(600), trajectory_length=4, max_in_flight=1,
                                    max_send_wait=600.0, send_retry_for=600.0), label="actor")
    running = jd.launch(program, launcher="threads", run_dir=str(tmp_path), echo=False, interrupt_after=600, grace=600)
    try:
        actor = courier.Client(running.addresses["actor/0"], token=running.token)
        wait_until(lambda: actor.stats()["in_flight"] == 1, "the actor's one send slot held")
        time.sleep(0.5)  # the next trajectory, made in milliseconds, waits for the slot
        returns(running.stop, "a stop of an actor blocked on a send", timeout=30)
    finally:
        release.set()
        running.stop()


class HungReplay:
    """A replay node that went away mid-call: its room query never answers (the exact fault)."""

    def __init__(self) -> None:
        self.asked, self.release = threading.Event(), threading.Event()

    def can_insert(self, n=1, table="default", wait=0.0, hold=0.0):
        self.asked.set()
        self.release.wait(600)
        return True

    def insert_batch(self, batch, priorities=None, table="default", timeout=None):
        return list(range(len(batch["reward"])))


def test_a_stop_does_not_wait_on_a_room_query_to_a_replay_that_hangs(tmp_path):
    """A JAX-backend actor asks the queue for room before it plays; that query once ran on the
    acting thread, so a replay node dying mid-call held the actor's stop until the launcher
    interrupted it (2 s in every agent run's ordered stop: the learner's process goes first)."""
    hung = HungReplay()
    server = courier.Server(hung, token="t").start()
    program = jd.Program("room-hangs")
    program.add_node(jd.CourierNode(Actor, POLICY, EnvSpec("CartPole-v1", 2, "jax"), ParameterServer(params(), version=0),
                                    courier.Client(server.address, token="t"), trajectory_length=4,
                                    max_send_wait=600.0), label="actor")
    running = jd.launch(program, launcher="threads", run_dir=str(tmp_path), echo=False, interrupt_after=600, grace=600)
    try:
        assert hung.asked.wait(60), "the actor never asked the queue for room"
        returns(running.stop, "a stop of an actor waiting on a hung room query", timeout=30)
    finally:
        hung.release.set()
        running.stop()
        server.stop(0)
