"""jd.Pool: tasks spread over courier evaluators, re-queued when an evaluator dies, in order."""

from __future__ import annotations

import os
import signal
import threading

import pytest

import jaxdist as jd
import pool_nodes as nodes
from waiting import returns, wait_until
from jaxdist import courier
from jaxdist.tools.pool import EvaluatorsUnavailableError


@pytest.fixture
def servers():
    started: list[courier.Server] = []

    def start(obj, address: str = "127.0.0.1:0") -> courier.Server:
        server = courier.Server(obj, address).start()
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop(grace=0)


def clients_of(*servers: courier.Server, timeout: float = 30.0) -> list[courier.Client]:
    return [courier.Client(server.address, timeout=timeout) for server in servers]


@pytest.fixture
def hung():
    """An evaluator that answers nothing until the test ends."""
    evaluator = nodes.Hangs()
    yield evaluator
    evaluator.release()


def test_map_returns_every_result_in_task_order_and_keeps_every_evaluator_busy(servers):
    together = threading.Barrier(3)  # a task is answered only while all three evaluators run one
    evaluators = [nodes.Squarer(barrier=together) for _ in range(3)]
    with jd.Pool(clients_of(*(servers(ev) for ev in evaluators))) as pool:
        results = pool.map("square", range(12))
        assert [r["value"] for r in results] == [x * x for x in range(12)]
        assert sorted(r["value"] for r in pool.imap_unordered("square", range(6))) == [0, 1, 4, 9, 16, 25]
        stats = pool.stats()
    assert (stats.size, stats.live, stats.completed, stats.requeued, stats.lost, stats.backups) == (3, 3, 18, 0, 0, 0)


def test_the_task_of_a_stopped_server_is_requeued_and_the_map_completes_in_order(servers):
    slow = nodes.Squarer(delay=0.2)
    doomed_server = servers(nodes.Squarer(delay=5.0))
    pool = jd.Pool(clients_of(servers(slow), doomed_server), retry_interval=0.2)
    outcome: dict = {}
    mapping = threading.Thread(target=lambda: outcome.update(results=pool.map("square", range(6))))
    mapping.start()
    probe = courier.Client(doomed_server.address, timeout=5)
    wait_until(lambda: probe.current() != [], "the doomed server to start a task")
    doomed_task = probe.current()[0]
    doomed_server.stop(grace=0)
    mapping.join(timeout=30)
    assert [r["value"] for r in outcome["results"]] == [x * x for x in range(6)]
    stats = pool.stats()
    assert stats.requeued == 1 and stats.lost == 1 and stats.live == 1 and stats.completed == 6
    assert doomed_task in range(6)
    pool.close()


def test_an_evaluator_down_before_the_map_is_taken_out_at_once_not_waited_for(servers):
    down = servers(nodes.Squarer())
    down.stop(grace=0)
    # No deadline: a call that waited for the evaluator to come back would wait forever.
    pool = jd.Pool(clients_of(down, servers(nodes.Squarer())), task_timeout=None, retry_interval=60.0)
    results = returns(lambda: pool.map("square", range(4)), "a map with one evaluator down")
    assert [r["value"] for r in results] == [0, 1, 4, 9]
    stats = pool.stats()
    assert (stats.lost, stats.requeued, stats.live) == (1, 1, 1)
    pool.close()


def test_an_evaluator_that_misses_its_deadline_is_taken_out_and_its_task_done_elsewhere(servers, hung):
    pool = jd.Pool(clients_of(servers(hung), servers(nodes.Squarer())), task_timeout=5.0, retry_interval=60.0)
    results = returns(lambda: pool.map("square", range(4)), "a map with a hung evaluator")
    assert [r["value"] for r in results] == [0, 1, 4, 9]
    assert pool.stats().requeued == 1 and pool.stats().lost == 1
    pool.close()


def test_an_idle_evaluator_runs_a_backup_of_a_straggling_task_and_the_first_copy_counts(servers, hung):
    # No deadline: without a backup the map would wait for the hung evaluator forever.
    pool = jd.Pool(clients_of(servers(hung), servers(nodes.Squarer())), task_timeout=None, backup_after=0.3)
    results = returns(lambda: pool.map("square", range(4)), "a map with a hung evaluator")
    assert [r["value"] for r in results] == [0, 1, 4, 9]  # task 0's backup ran on the other one
    stats = pool.stats()
    assert stats.backups == 1 and stats.lost == 0 and stats.completed == 4
    pool.close()


def test_a_server_restarted_on_the_same_address_rejoins_the_pool(servers):
    first = servers(nodes.Squarer(delay=5.0))
    address = first.address
    pool = jd.Pool([courier.Client(address)], retry_interval=0.1, unavailable_timeout=30.0)
    outcome: dict = {}
    mapping = threading.Thread(target=lambda: outcome.update(results=pool.map("square", range(3))))
    mapping.start()
    probe = courier.Client(address, timeout=5)
    wait_until(lambda: probe.current() != [], "the server to start a task")
    first.stop(grace=0)
    wait_until(lambda: pool.stats().lost == 1, "the pool to notice the stopped server")
    servers(nodes.Squarer(), address)
    mapping.join(timeout=30)
    assert [r["value"] for r in outcome["results"]] == [0, 1, 4]
    stats = pool.stats()
    assert (stats.requeued, stats.rejoined, stats.live, stats.completed) == (1, 1, 1, 3)
    pool.close()


def test_a_remote_exception_is_raised_to_the_caller_not_treated_as_a_lost_evaluator(servers):
    pool = jd.Pool(clients_of(servers(nodes.Refuser())))
    with pytest.raises(ValueError, match="task 3 is bad"):
        pool.map("square", range(5))
    assert pool.stats().lost == 0 and pool.stats().requeued == 0
    assert pool.map("square", [4]) == [16]  # the pool is usable after a failed map
    pool.close()


def test_when_every_evaluator_is_gone_the_map_raises_a_clear_error_in_bounded_time(servers):
    dead = [servers(nodes.Squarer()) for _ in range(2)]
    for server in dead:
        server.stop(grace=0)
    pool = jd.Pool(clients_of(*dead), task_timeout=1.0, unavailable_timeout=1.5, retry_interval=0.2,
                   probe_timeout=0.3)
    message = r"none of the pool's 2 evaluators answered for 1.5 s"
    with pytest.raises(EvaluatorsUnavailableError, match=message) as raised:
        returns(lambda: pool.map("square", range(4)), "a map over dead evaluators")
    assert "0 of 4 tasks done" in str(raised.value)
    assert all(server.address in str(raised.value) for server in dead)
    assert isinstance(raised.value, courier.UnavailableError)
    pool.close()


def test_pool_rejects_what_is_not_a_client_and_concurrent_maps(servers):
    with pytest.raises(ValueError, match="at least one"):
        jd.Pool([])
    with pytest.raises(TypeError, match="courier clients"):
        jd.Pool([object()])
    busy = nodes.Hangs()
    pool = jd.Pool(clients_of(servers(busy)), task_timeout=None)
    running = threading.Thread(target=pool.map, args=("square", [1, 2]))
    running.start()
    wait_until(lambda: busy.calls == 1, "the first map to be running")
    with pytest.raises(RuntimeError, match="already running a map"):
        pool.map("square", [3])
    busy.release()
    running.join()
    pool.close()


def test_an_evaluator_process_killed_mid_task_under_the_processes_launcher_is_requeued_then_rejoins(tmp_path):
    program = jd.Program("pool")
    with program.group("evaluator"):
        handles = [program.add_node(jd.CourierNode(nodes.Squarer, 0.3)) for _ in range(3)]
    running = jd.launch(program, launcher="processes", run_dir=str(tmp_path), echo=False,
                        restart={"evaluator": jd.Restart(max_restarts=2, backoff=1.0)})
    try:
        clients = [courier.Client(running.addresses[h.node_name], token=running.token, timeout=60) for h in handles]
        pool = jd.Pool(clients, retry_interval=0.2, backup_after=1.0)
        victim = clients[1]
        victim_pid = victim.pid()
        outcome: dict = {}
        mapping = threading.Thread(target=lambda: outcome.update(results=pool.map("square", range(12))))
        mapping.start()
        wait_until(lambda: victim.current() != [], "the victim to start a task")
        killed_task = victim.current()[0]
        os.kill(victim_pid, signal.SIGKILL)
        mapping.join(timeout=60)
        results = outcome["results"]
        assert [r["value"] for r in results] == [x * x for x in range(12)]
        assert results[killed_task]["pid"] != victim_pid  # done again by another evaluator
        assert pool.stats().requeued >= 1 and pool.stats().lost >= 1
        wait_until(lambda: running.status()["evaluator/1"]["state"] == "running", "the supervisor's restart", 60)
        again = pool.map("square", range(9))
        assert [r["value"] for r in again] == [x * x for x in range(9)]
        new_pid = victim.pid()
        assert new_pid != victim_pid and new_pid in {r["pid"] for r in again}
        assert pool.stats().rejoined >= 1 and pool.stats().live == 3

        # Killed while idle: the next call to it fails at once (the pool's calls fail fast)
        # rather than waiting for its restart, 2 s away; its task goes to the others.
        os.kill(new_pid, signal.SIGKILL)
        wait_until(lambda: running.status()["evaluator/1"]["restarts"] == 2, "the supervisor to see the death")
        requeued = pool.stats().requeued
        assert [r["value"] for r in pool.map("square", range(6))] == [x * x for x in range(6)]
        assert pool.stats().requeued > requeued and pool.stats().backups == 0  # a waiting call never fails
        pool.close()
    finally:
        running.stop()
