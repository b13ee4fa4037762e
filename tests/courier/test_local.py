"""Calls to a server in the caller's own process (``Client(address, local=True)``, what the
launchers give colocated nodes): no RPC, and the wire's semantics -- copies, the token, errors,
deadlines, the server's thread pool, a stopped server, a closed client."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from jaxdist import courier
from jaxdist.courier.local import LocalConnection


class Keeper:
    def __init__(self) -> None:
        self.kept = None
        self.release = threading.Event()
        self.active = 0
        self.most_active = 0
        self._lock = threading.Lock()

    def keep(self, array):
        self.kept = array
        return array

    def fail(self, kind):
        raise {"key": KeyError("missing"), "custom": type("Custom", (Exception,), {})("custom")}[kind]

    def block(self):
        self.release.wait(30)
        return "released"

    def busy(self):
        with self._lock:
            self.active += 1
            self.most_active = max(self.most_active, self.active)
        self.release.wait(0.05)
        with self._lock:
            self.active -= 1


@pytest.fixture
def served():
    keeper = Keeper()
    server = courier.Server(keeper, token="secret").start()
    yield keeper, server
    keeper.release.set()
    server.stop(grace=0)


def test_a_local_client_calls_the_object_without_rpc_and_copies_both_ways(served):
    keeper, server = served
    client = courier.Client(server.address, token="secret", local=True)
    assert isinstance(client._connection, LocalConnection)  # no channel at all
    assert not isinstance(courier.Client(server.address, token="secret")._connection, LocalConnection)  # opt-in
    sent = np.arange(4.0)
    returned = client.keep(sent)
    sent[0] = 99.0  # the callee keeps its own copy, as over the wire
    np.testing.assert_array_equal(keeper.kept, [0.0, 1.0, 2.0, 3.0])
    np.testing.assert_array_equal(returned, [0.0, 1.0, 2.0, 3.0])
    assert client.futures.keep([1, (2, 3)]).result(5) == [1, (2, 3)]
    assert client.methods() == ["block", "busy", "fail", "keep"]


def test_errors_and_deadlines_are_the_wires(served):
    _, server = served
    client = courier.Client(server.address, token="secret", local=True)
    with pytest.raises(KeyError, match="missing"):
        client.fail("key")
    with pytest.raises(courier.RemoteError, match="custom"):
        client.fail("custom")
    with pytest.raises(courier.UnknownMethodError, match="keep"):
        client.kep(1)
    with pytest.raises(courier.AuthenticationError):
        courier.Client(server.address, token="wrong", local=True).keep(1)
    with pytest.raises(courier.DeadlineExceededError):
        client.with_timeout(0.2).block()
    with pytest.raises(TypeError):
        client.keep(object())  # only wire types pass


def test_calls_run_on_the_servers_thread_pool():
    keeper = Keeper()
    server = courier.Server(keeper, thread_pool_size=1).start()
    try:
        client = courier.Client(server.address, local=True)
        calls = [client.futures.busy() for _ in range(6)]
        for call in calls:
            call.result(10)
        assert keeper.most_active == 1  # thread_pool_size=1 still serialises the object's calls
    finally:
        server.stop(grace=0)


def test_closing_the_client_frees_its_waiting_callers_and_a_stopped_server_is_unavailable(served):
    keeper, server = served
    client = courier.Client(server.address, token="secret", local=True, timeout=None)
    waiting = client.futures.block()
    client.close()  # as a stop closes a node's clients
    with pytest.raises(courier.UnavailableError):
        waiting.result(5)
    keeper.release.set()
    other = courier.Client(server.address, token="secret", local=True)
    server.stop(grace=0)
    with pytest.raises(courier.UnavailableError):
        other.failing_fast().keep(1)  # (a waiting call waits for a server restarted on the address)
