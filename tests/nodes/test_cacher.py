"""CacherNode in launched programs, with real servers."""

from __future__ import annotations

import threading
from concurrent import futures

import numpy as np
import pytest

import jaxdist as jd
from jaxdist import courier
from jaxdist.nodes.cacher import Cache, CacherNode, cache_key
from jaxdist.nodes.parameter_server import ParameterServer, VersionedParams
import parameter_server_nodes as nodes
from waiting import wait_until

TOKEN = "cacher-test-token"


def launch_cached(tmp_path, target_node, launcher="threads", **cacher_options):
    program = jd.Program("cached")
    with program.group("target"):
        target = program.add_node(target_node)
    with program.group("cacher"):
        program.add_node(CacherNode(target, **cacher_options))
    running = jd.launch(program, launcher=launcher, run_dir=str(tmp_path), echo=False, token=TOKEN)
    cacher = courier.Client(running.addresses["cacher/0"], token=TOKEN, timeout=10.0)
    return running, cacher


def burst(call, count: int = 16) -> list:
    """`count` callers at once, released together."""
    gate = threading.Barrier(count)

    def caller(_):
        gate.wait()
        return call()

    with futures.ThreadPoolExecutor(count) as pool:
        return list(pool.map(caller, range(count)))


class Upstream:
    """A target the test answers by hand: every call is a future left pending until it is set."""

    def __init__(self) -> None:
        self.calls: list[futures.Future] = []

    def __call__(self, method: str, args: tuple, kwargs: dict) -> futures.Future:
        call: futures.Future = futures.Future()
        self.calls.append(call)
        return call


def test_sixteen_concurrent_callers_over_rpc_cost_the_target_one_call_per_key(tmp_path):
    # No entry is due for a refresh within the test: every caller after the first call is served by it.
    running, cacher = launch_cached(tmp_path, jd.CourierNode(nodes.CountingTarget, delay=0.5), refresh_interval=3600)
    target = courier.Client(running.addresses["target/0"], token=TOKEN)
    try:
        replies = burst(lambda: cacher.value(7))
        assert replies == [{"call": 1, "x": 7}] * 16  # one call, shared by all sixteen
        assert target.calls() == 1
        assert burst(lambda: cacher.value(7)) == [{"call": 1, "x": 7}] * 16
        assert cacher.value(8) == {"call": 2, "x": 8}  # another key, another call
        assert target.calls() == 2
    finally:
        running.stop()


def test_an_entry_due_for_a_refresh_is_served_at_once_while_one_refresh_for_all_callers_runs_behind():
    now = [0.0]
    upstream = Upstream()
    cache = Cache(upstream, refresh_interval=0.5, clock=lambda: now[0])
    with futures.ThreadPoolExecutor(1) as caller:
        first = caller.submit(cache.call, "value", (7,), {})
        wait_until(lambda: len(upstream.calls) == 1, "the first call to go upstream")
        upstream.calls[0].set_result("first")
        assert first.result(30) == "first"
    now[0] = 0.6  # due for a refresh
    assert burst(lambda: cache.call("value", (7,), {})) == ["first"] * 16  # nobody waited for the refresh:
    assert len(upstream.calls) == 2 and not upstream.calls[1].done()   # it is still running, one for all
    upstream.calls[1].set_result("refreshed")
    assert cache.call("value", (7,), {}) == "refreshed"
    assert len(upstream.calls) == 2
    assert cache.stats()["refreshes"] == 1


def test_an_entry_older_than_stale_after_is_never_served():
    now = [0.0]
    upstream = Upstream()
    cache = Cache(upstream, refresh_interval=0.1, stale_after=0.4, clock=lambda: now[0])
    upstream_answers = iter(["first", "fresh"])

    def waiting_call() -> futures.Future:
        """A caller's call, once it waits on an upstream call (its own, or one in flight it joined)."""
        calls, coalesced = len(upstream.calls), cache.stats()["coalesced"]
        waiting = caller.submit(cache.call, "value", (), {})
        wait_until(lambda: len(upstream.calls) > calls or cache.stats()["coalesced"] > coalesced,
                   "the call to wait upstream")
        return waiting

    with futures.ThreadPoolExecutor(1) as caller:
        pending = waiting_call()
        upstream.calls[-1].set_result(next(upstream_answers))
        assert pending.result(30) == "first"
        now[0] = 0.2  # due: served, and a refresh starts behind
        assert cache.call("value", (), {}) == "first" and len(upstream.calls) == 2
        now[0] = 0.5  # stale, and the refresh is still running: the caller waits for it
        pending = waiting_call()
        assert not pending.done()
        upstream.calls[-1].set_result(next(upstream_answers))
        assert pending.result(30) == "fresh"
        now[0] = 1.0  # stale again, and the target fails: the caller gets the error, never the stale value
        pending = waiting_call()
        upstream.calls[-1].set_exception(TimeoutError("the target is down"))
        with pytest.raises(TimeoutError, match="the target is down"):
            pending.result(30)
    assert len(upstream.calls) == 3


def test_with_stale_after_zero_every_call_reaches_the_target_and_a_slow_one_times_out(tmp_path):
    running, cacher = launch_cached(
        tmp_path, jd.CourierNode(nodes.CountingTarget), refresh_interval=0, stale_after=0, upstream_timeout=1.0
    )
    target = courier.Client(running.addresses["target/0"], token=TOKEN)
    try:
        assert [cacher.value()["call"] for _ in range(3)] == [1, 2, 3]
        target.set_delay(3.0)  # slower than upstream_timeout: effectively down
        with pytest.raises(TimeoutError, match="DeadlineExceededError"):
            cacher.value()
    finally:
        target.set_delay(0.0)
        running.stop()


def test_keeps_serving_while_the_target_is_away_and_follows_it_after_a_restart(tmp_path):
    first = courier.Server(nodes.CountingTarget(), token=TOKEN).start()
    address = first.address
    running, cacher = launch_cached(tmp_path, nodes.ExternalNode(address), refresh_interval=0.05,
                                    upstream_timeout=0.5)
    try:
        assert cacher.value() == {"call": 1, "x": None}
        first.stop(grace=0)
        for _ in range(5):  # each call due for a refresh, which fails behind: the last good value
            assert cacher.value() == {"call": 1, "x": None}
        restarted = courier.Server(nodes.CountingTarget(), address=address, token=TOKEN).start()
        try:
            with courier.Client(address, token=TOKEN) as direct:
                for _ in range(5):
                    direct.value()  # the restarted target's answers count from 6 on: told apart from the first's
            wait_until(lambda: cacher.value()["call"] > 5, "the cacher to refresh from the restarted target")
            assert cacher.value(x=2)["x"] == 2
        finally:
            restarted.stop(grace=0)
    finally:
        running.stop()


def test_target_errors_reach_the_caller_with_their_type_and_are_not_cached(tmp_path):
    running, cacher = launch_cached(tmp_path, jd.CourierNode(nodes.CountingTarget), refresh_interval=10)
    target = courier.Client(running.addresses["target/0"], token=TOKEN)
    try:
        for _ in range(2):
            with pytest.raises(KeyError, match="missing"):
                cacher.fail("missing")
        assert target.calls() == 2
        with pytest.raises(courier.UnknownMethodError, match="serves: calls, fail, set_delay, value"):
            cacher.nope()
        assert sorted(cacher.methods()) == ["calls", "fail", "set_delay", "value"]
    finally:
        running.stop()


def test_a_variable_client_follows_a_parameter_server_through_a_cacher_across_processes(tmp_path, capfd):
    program = jd.Program("cached-params")
    with program.group("owner"):  # stands for the learner: its parameters, pushed in by the test
        owner = program.add_node(jd.CourierNode(VersionedParams))
    with program.group("params"):
        server = program.add_node(jd.CourierNode(ParameterServer, source=owner, follow_wait=1.0))
    with program.group("cacher"):
        cached = program.add_node(CacherNode(server, refresh_interval=0.05))
    with program.group("actor"):
        for _ in range(2):
            program.add_node(jd.PyNode(nodes.follow_params, cached, until_version=3))
    running = jd.launch(program, launcher="processes", run_dir=str(tmp_path), echo=True, token=TOKEN)
    try:
        to_owner = courier.Client(running.addresses["owner/0"], token=TOKEN)
        for version in range(1, 4):
            assert to_owner.push({"w": np.full(2, float(version))}, version)
        assert running.wait(timeout=30)
    finally:
        running.stop()
    out = capfd.readouterr().out
    assert out.count("actor holds version 3 with weights [3.0, 3.0]") == 2


def test_cache_keys_tell_types_apart_and_unsupported_arguments_bypass_the_cache():
    assert len({cache_key("m", (x,), {}) for x in (1, 1.0, True, "1", b"1", (1,), [1], None)}) == 8
    assert cache_key("m", (float("nan"),), {}) == cache_key("m", (float("nan"),), {})
    assert cache_key("m", (np.zeros(2, np.float32),), {}) != cache_key("m", (np.zeros(2, np.float64),), {})
    assert cache_key("m", (), {"a": 1, "b": 2}) != cache_key("m", (), {"b": 2, "a": 1})  # order kept: never wrong
    assert cache_key("m", (object(),), {}) is None

    calls = []

    def upstream(method, args, kwargs):
        calls.append(method)
        done = futures.Future()
        done.set_result(len(calls))
        return done

    cache = Cache(upstream, refresh_interval=10, uncached=["write"])
    assert [cache.call("read", (1,), {}) for _ in range(3)] == [1, 1, 1]
    assert [cache.call("read", (object(),), {}) for _ in range(2)] == [2, 3]
    assert [cache.call("write", (1,), {}) for _ in range(2)] == [4, 5]
    assert cache.stats()["bypassed"] == 4 and cache.stats()["hits"] == 2


def test_a_byte_budget_bounds_what_the_cache_holds():
    """The cache bounded entries, not bytes: 40 parameter versions of 16 MB held +654 MB."""
    megabyte = 1 << 20
    calls = []

    def upstream(method, args, kwargs):
        calls.append(args)
        done = futures.Future()
        done.set_result({"params": np.ones(args[0] * megabyte // 4, np.float32)})
        return done

    cache = Cache(upstream, refresh_interval=10, max_entries=64, max_bytes=4 * megabyte + 4096)
    for version in range(40):
        assert cache.call("get", (1, version), {})["params"].nbytes == megabyte
    stats = cache.stats()
    assert stats["entries"] == 4 and 4 * megabyte <= stats["bytes"] <= 4 * megabyte + 4096 and stats["evicted"] == 36
    assert cache.call("get", (1, 39), {}) is not None and len(calls) == 40  # the newest are kept
    assert cache.call("get", (8, 0), {})["params"].nbytes == 8 * megabyte  # larger than the budget: passed on
    assert cache.call("get", (8, 0), {})["params"].nbytes == 8 * megabyte and len(calls) == 42  # and not kept
    assert cache.stats()["too_large"] == 2 and cache.stats()["entries"] == 4


def test_bad_timing_is_refused():
    with pytest.raises(ValueError, match="stale_after"):
        CacherNode(jd.Handle("x/0"), refresh_interval=2.0, stale_after=1.0)
    with pytest.raises(TypeError, match="handle"):
        CacherNode("x/0")
