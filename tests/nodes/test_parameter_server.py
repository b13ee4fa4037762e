"""VersionedParams (an owner's, served with push as a learner stands in a test), ParameterServer
and VariableClient, over real courier servers."""

from __future__ import annotations

import logging
import threading
import time
from concurrent import futures

import numpy as np
import pytest

from jaxdist import courier
from jaxdist.nodes import parameter_server
from jaxdist.nodes.parameter_server import MAX_WAIT, ParameterServer, VariableClient, VersionedParams
import parameter_server_nodes as nodes
from waiting import returns, wait_until


def params_at(version: int) -> dict:
    return {"w": np.full(4, float(version), np.float32), "b": np.arange(3) + version}


@pytest.fixture
def served():
    """An owner's parameters behind a courier server, and a client of it."""
    server = courier.Server(nodes.GatedParams()).start()
    client = courier.Client(server.address, timeout=5.0)
    yield server, client
    client.close()
    server.stop(grace=0)


def test_get_sends_params_only_when_the_server_holds_a_newer_version(served):
    _, client = served
    assert client.get() == {"version": -1, "params": None}
    assert client.push(params_at(3), 3) is True
    reply = client.get(-1)
    assert reply["version"] == 3 and np.array_equal(reply["params"]["w"], params_at(3)["w"])
    assert client.get(2)["params"] is not None
    assert client.get(3) == {"version": 3, "params": None}
    assert client.get(7) == {"version": 3, "params": None}
    stats = client.stats()
    assert (stats["gets"], stats["transfers"]) == (5, 2)


def test_a_push_that_is_not_newer_is_ignored(served):
    _, client = served
    assert client.push(params_at(5), 5)
    assert client.push(params_at(5), 5) is False
    assert client.push(params_at(4), 4) is False
    assert client.version() == 5
    assert np.array_equal(client.get()["params"]["w"], params_at(5)["w"])
    with pytest.raises(TypeError, match="version is an int"):
        client.push(params_at(6), 6.0)
    with pytest.raises(ValueError, match="None"):
        client.push(None, 6)


def test_concurrent_pushes_and_gets_stay_consistent(served):
    _, client = served
    errors: list[str] = []

    def pusher(first: int) -> None:
        for version in range(first, 120, 4):
            client.push(params_at(version), version)

    def getter() -> None:
        last = -1
        for _ in range(60):
            reply = client.get(-1)
            version, params = reply["version"], reply["params"]
            if version < last:
                errors.append(f"version went back from {last} to {version}")
            if params is not None and params["w"][0] != version:
                errors.append(f"params of version {params['w'][0]} served as version {version}")
            last = version

    threads = [threading.Thread(target=pusher, args=(i,)) for i in range(4)]
    threads += [threading.Thread(target=getter) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert client.version() == 119


def test_long_poll_returns_as_soon_as_a_newer_version_arrives(served):
    _, client = served
    client.push(params_at(1), 1)
    begun = client.gets_begun()
    with futures.ThreadPoolExecutor(1) as poller:
        poll = poller.submit(client.with_timeout(MAX_WAIT + 30).get, 1, wait=MAX_WAIT)
        assert wait_until(lambda: client.gets_begun() > begun)
        client.push(params_at(2), 2)
        reply = returns(lambda: poll.result(), "a long poll of MAX_WAIT s given a newer version")
    assert reply["version"] == 2 and reply["params"] is not None
    assert client.get(2, wait=0.1)["params"] is None


def test_first_read_blocks_until_the_first_push_then_never_again(served):
    _, client = served
    variables = VariableClient(client, refresh_every_calls=1)
    with futures.ThreadPoolExecutor(1) as reader:
        first_read = reader.submit(lambda: variables.params)
        assert wait_until(lambda: variables.stats["fetches"] >= 1)  # the server answered: nothing yet
        assert not first_read.done()
        client.push(params_at(1), 1)
        assert returns(lambda: first_read.result(), "the first read after the first push")["w"][0] == 1.0
    assert variables.version == 1

    client.hold_gets()  # every later fetch hangs until released
    begun = client.gets_begun()

    def act() -> list:
        seen = []
        for _ in range(50):
            variables.update()
            seen.append(variables.params["w"][0])
        return seen

    try:
        assert returns(act, "50 steps while every fetch hangs") == [1.0] * 50
        wait_until(lambda: client.gets_begun() > begun, "a refresh to be asked for (it hangs)")
    finally:
        client.release_gets()
    variables.close()


def test_first_read_times_out_with_a_clear_error(served):
    _, client = served
    variables = VariableClient(client, first_fetch_timeout=0.3)
    with pytest.raises(TimeoutError, match="no parameters within 0.3 s.*no version yet"):
        variables.params
    variables.close()


def test_refreshes_on_its_own_clock(served):
    _, client = served
    client.push(params_at(1), 1)
    variables = VariableClient(client, refresh_every_seconds=0.1)
    assert variables.params["w"][0] == 1.0
    client.push(params_at(2), 2)
    assert wait_until(lambda: variables.version == 2)  # no update() calls needed
    assert variables.params["w"][0] == 2.0
    variables.close()


def test_refreshes_every_n_calls(served):
    _, client = served
    client.push(params_at(1), 1)
    variables = VariableClient(client, refresh_every_calls=5)
    assert variables.params["w"][0] == 1.0
    fetches, gets = variables.stats["fetches"], client.gets_begun()
    client.push(params_at(2), 2)
    for _ in range(4):
        variables.update()
    assert variables.version == 1 and variables.stats["fetches"] == fetches
    variables.update()  # the fifth
    assert wait_until(lambda: variables.version == 2)
    assert variables.stats["transfers"] == 2 and client.gets_begun() == gets + 1  # one fetch for five calls
    variables.close()


def test_keeps_its_params_while_the_server_is_away_and_follows_it_after_a_restart():
    first = courier.Server(ParameterServer(params_at(1), version=1)).start()
    address = first.address
    client = courier.Client(address, timeout=5.0)
    variables = VariableClient(client, refresh_every_seconds=0.05, call_timeout=0.3)
    assert variables.params["w"][0] == 1.0

    first.stop(grace=0)
    errors = variables.stats["errors"]
    assert wait_until(lambda: variables.stats["errors"] >= errors + 2)
    assert variables.version == 1 and variables.params["w"][0] == 1.0
    assert variables.stats["last_error"]

    restarted = courier.Server(ParameterServer(params_at(2), version=2), address=address).start()
    try:
        assert wait_until(lambda: variables.version == 2)
        assert variables.params["w"][0] == 2.0
    finally:
        variables.close()
        client.close()
        restarted.stop(grace=0)


def test_a_server_away_for_a_moment_is_not_worth_a_line_and_one_away_long_is(caplog, monkeypatch):
    """The ordered stop takes the learner first: the actors' fetches fail until they stop too,
    which is no news; a source that stays away is."""
    monkeypatch.setattr(parameter_server, "WARN_AFTER", 3600.0)  # a moment, however slow the machine
    server = courier.Server(ParameterServer(params_at(1), version=1)).start()
    client = courier.Client(server.address, timeout=5.0)
    variables = VariableClient(client, refresh_every_seconds=0.05, call_timeout=0.3)
    try:
        assert variables.params["w"][0] == 1.0
        server.stop(grace=0)
        with caplog.at_level(logging.INFO, logger=parameter_server.__name__):
            assert wait_until(lambda: variables.stats["errors"] >= 2)
            assert not [record for record in caplog.records if record.levelno >= logging.WARNING]
            monkeypatch.setattr(parameter_server, "WARN_AFTER", 0.0)  # now it has been away long
            warned = wait_until(lambda: [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING])
        assert len(warned) == 1 and warned[0].startswith("parameter fetch failing for ")
        assert "(keeping version 1): " in warned[0]
    finally:
        variables.close()
        client.close()


def test_follows_a_server_that_went_back_to_an_older_version():
    class Swappable:
        def __init__(self, server: ParameterServer) -> None:
            self.server = server

        def get(self, min_version: int = -1) -> dict:
            return self.server.get(min_version)

    source = Swappable(ParameterServer(params_at(10), version=10))
    variables = VariableClient(source, refresh_every_seconds=30)
    assert variables.latest()[0] == 10
    source.server = ParameterServer(params_at(7), version=7)  # restored from an older checkpoint
    assert variables.refresh(timeout=2.0)
    assert variables.version == 7 and variables.params["w"][0] == 7.0
    variables.close()


def test_close_does_not_wait_for_a_fetch_that_hangs():
    """An actor closes its variables when its run ends and again when its node shuts down: each
    close waited a second for a fetch hanging on a learner that had gone (later the first one
    still did): a second of every stop."""
    hanging, release = threading.Event(), threading.Event()

    class Hangs:
        def get(self, min_version: int = -1) -> dict:
            hanging.set()
            release.wait(60)
            raise ConnectionError("the learner is gone")

    variables = VariableClient(Hangs(), refresh_every_seconds=0.01)
    try:
        wait_until(hanging.is_set, "a fetch in flight")
        returns(variables.close, "close", timeout=0.2)
        returns(variables.close, "a second close", timeout=0.2)
    finally:
        release.set()


def test_a_follower_answers_while_more_long_polls_than_threads_wait(served):
    """16 long polls held all 16 server threads: a push waited behind them (7.5 s in the audit,
    up to MAX_WAIT). At most max_waiting of them wait now; the others answer at once, and the
    follower's own polls of its source run on a thread of their own."""
    _, owner = served
    owner.push(params_at(1), 1)
    follower = courier.Server(ParameterServer(source=owner, follow_wait=1.0), thread_pool_size=16).start()
    client = courier.Client(follower.address, timeout=MAX_WAIT + 30)
    try:
        wait_until(lambda: client.version() == 1, "the follower at version 1")
        with futures.ThreadPoolExecutor(16) as pollers:
            polls = [pollers.submit(client.get, 1, wait=MAX_WAIT) for _ in range(16)]
            assert returns(lambda: client.version(), "a call behind 16 long polls", timeout=10) in (1, 2)
            owner.push(params_at(2), 2)
            replies = [poll.result(timeout=30) for poll in polls]
        assert all(reply["version"] in (1, 2) for reply in replies)
        assert any(reply["params"] is not None for reply in replies)  # the waiting ones got version 2
    finally:
        client.close()
        follower.stop(grace=0)


@pytest.fixture
def follower(served):
    """A ParameterServer following the owner of `served`, behind a courier server of its own."""
    _, owner = served
    server = ParameterServer(source=owner, follow_wait=0.5)
    behind = courier.Server(server).start()
    client = courier.Client(behind.address, timeout=5.0)
    yield client
    client.close()
    behind.stop(grace=0)
    server.close()


def test_a_parameter_server_serves_no_push(follower):
    """Any token holder could push version 2**62 and freeze every actor's parameters: now the
    server follows its owner alone, and a push over the wire is refused."""
    with pytest.raises(courier.UnknownMethodError, match="push"):
        follower.push(params_at(2**62), 2**62)
    assert follower.version() == -1
    assert "push" not in follower.methods()


def test_a_follower_serves_each_new_version_of_its_owner_as_it_is_published(served, follower):
    _, owner = served
    assert follower.get() == {"version": -1, "params": None}  # the owner holds nothing yet
    owner.push(params_at(1), 1)
    first = follower.with_timeout(20).get(-1, wait=10)
    assert first["version"] == 1 and first["params"]["w"][0] == 1.0
    began = time.monotonic()
    owner.push(params_at(2), 2)
    second = follower.with_timeout(20).get(1, wait=10)
    assert second["version"] == 2 and second["params"]["w"][0] == 2.0
    assert time.monotonic() - began < 2.0  # a long poll of the owner, not a refresh clock
    stats = follower.stats()
    assert stats["version"] == 2 and stats["source"]["transfers"] == 2 and stats["source"]["errors"] == 0


def test_a_follower_keeps_its_version_while_the_owner_is_away_and_follows_it_back():
    owner = courier.Server(VersionedParams(params_at(10), version=10)).start()
    address = owner.address
    server = ParameterServer(source=courier.Client(address, timeout=5.0), follow_wait=0.3)
    try:
        wait_until(lambda: server.version() == 10, "the follower at version 10")
        owner.stop(grace=0)
        wait_until(lambda: server.stats()["source"]["errors"] >= 1, "a fetch failing while the owner is away")
        assert server.get(-1)["params"]["w"][0] == 10.0
        owner = courier.Server(VersionedParams(params_at(7), version=7), address=address).start()  # restored
        wait_until(lambda: server.version() == 7, "the follower back at the owner's version 7")
        assert server.get(-1)["params"]["w"][0] == 7.0
    finally:
        server.close()
        owner.stop(grace=0)


def test_a_parameter_server_takes_fixed_params_or_a_source_not_both():
    with pytest.raises(ValueError, match="fixed params or a source"):
        ParameterServer(params_at(1), source=VersionedParams())
    fixed = ParameterServer(params_at(3), version=3)
    assert fixed.get(2)["params"]["w"][0] == 3.0 and "source" not in fixed.stats()
