"""CacherNode in launched programs, with real servers."""

from __future__ import annotations

import threading
import time
from concurrent import futures

import numpy as np
import pytest

import jaxdist as jd
from jaxdist import courier
from jaxdist.nodes.cacher import Cache, CacherNode, cache_key
from jaxdist.nodes.parameter_server import ParameterServer, VariableClient
import parameter_server_nodes as nodes

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


def test_sixteen_concurrent_callers_cost_one_upstream_call_per_refresh(tmp_path):
    running, cacher = launch_cached(tmp_path, jd.CourierNode(nodes.CountingTarget, delay=0.5), refresh_interval=0.5)
    target = courier.Client(running.addresses["target/0"], token=TOKEN)
    try:
        replies = burst(lambda: cacher.value(7))
        assert replies == [{"call": 1, "x": 7}] * 16  # one call, shared by all sixteen
        assert target.calls() == 1
        time.sleep(0.6)  # the entry is due for a refresh: served at once, refreshed once behind
        began = time.monotonic()
        assert burst(lambda: cacher.value(7)) == [{"call": 1, "x": 7}] * 16
        assert time.monotonic() - began < 0.4  # nobody waited for the 0.5 s refresh
        time.sleep(0.7)
        assert target.calls() == 2
        assert cacher.value(7) == {"call": 2, "x": 7}
        assert cacher.value(8) == {"call": 3, "x": 8}  # another key, another call
    finally:
        running.stop()


def test_an_entry_older_than_stale_after_is_never_served(tmp_path):
    running, cacher = launch_cached(
        tmp_path, jd.CourierNode(nodes.CountingTarget), refresh_interval=0.1, stale_after=0.4, upstream_timeout=1.0
    )
    target = courier.Client(running.addresses["target/0"], token=TOKEN)
    try:
        assert cacher.value() == {"call": 1, "x": None}
        target.set_delay(0.7)  # the target turns slow: refreshes take longer than stale_after
        assert cacher.value()["call"] == 1  # young enough: served (a slow refresh may start behind)
        time.sleep(0.5)  # now stale, and the refresh is still running
        began = time.monotonic()
        reply = cacher.value()
        assert reply["call"] == 2  # the caller waited for the fresh answer instead of the stale one
        assert time.monotonic() - began > 0.1
        target.set_delay(3.0)  # now slower than upstream_timeout: effectively down
        time.sleep(0.5)
        with pytest.raises(TimeoutError, match="DeadlineExceededError"):
            cacher.value()
    finally:
        target.set_delay(0.0)
        running.stop()


def test_keeps_serving_while_the_target_is_away_and_follows_it_after_a_restart(tmp_path):
    first = courier.Server(nodes.CountingTarget(), token=TOKEN).start()
    address = first.address
    running, cacher = launch_cached(
        tmp_path, nodes.ExternalNode(address), refresh_interval=0.05, stale_after=0.6, upstream_timeout=0.5
    )
    try:
        assert cacher.value() == {"call": 1, "x": None}
        first.stop(grace=0)
        assert cacher.value()["call"] == 1  # within stale_after: the last good value
        time.sleep(0.7)
        with pytest.raises(TimeoutError):  # stale, and the target is down: an error, not stale data
            cacher.value()
        restarted = courier.Server(nodes.CountingTarget(), address=address, token=TOKEN).start()
        try:
            deadline = time.monotonic() + 5
            while True:
                try:
                    reply = cacher.value()
                    break
                except TimeoutError:
                    assert time.monotonic() < deadline
            assert reply == {"call": 1, "x": None}  # the restarted target's first call
            assert cacher.value(x=2) == {"call": 2, "x": 2}
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
    with program.group("params"):
        server = program.add_node(jd.CourierNode(ParameterServer))
    with program.group("cacher"):
        cached = program.add_node(CacherNode(server, refresh_interval=0.05, uncached=["push"]))
    with program.group("actor"):
        for _ in range(2):
            program.add_node(jd.PyNode(nodes.follow_params, cached, until_version=3))
    running = jd.launch(program, launcher="processes", run_dir=str(tmp_path), echo=True, token=TOKEN)
    try:
        through_cacher = courier.Client(running.addresses["cacher/0"], token=TOKEN)
        for version in range(1, 4):
            assert through_cacher.push({"w": np.full(2, float(version))}, version)  # uncached: reaches it
            time.sleep(0.2)
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


def test_bad_timing_is_refused():
    with pytest.raises(ValueError, match="stale_after"):
        CacherNode(jd.Handle("x/0"), refresh_interval=2.0, stale_after=1.0)
    with pytest.raises(TypeError, match="handle"):
        CacherNode("x/0")
