"""The processes launcher's supervisor: restart policies, same-address restarts, crash loops."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

import jaxdist as jd
import launch_nodes as nodes
from waiting import wait_until
from jaxdist import courier
from jaxdist.nodes.cacher import CacherNode
from jaxdist.nodes.parameter_server import ParameterServer, VersionedParams
from jaxdist.nodes.replay import Fifo, ReplayClient, ReplayNode


def test_a_crashed_node_comes_back_on_its_address_and_its_callers_carry_on(tmp_path, capfd):
    program = jd.Program("supervised")
    with program.group("flaky"):
        flaky = program.add_node(jd.CourierNode(nodes.CrashesOnStarts, str(tmp_path / "starts"), []))
    with program.group("caller"):
        program.add_node(jd.PyNode(nodes.call_until, flaky, 3))
    running = jd.launch(
        program,
        launcher="processes",
        run_dir=str(tmp_path),
        restart={"flaky": jd.Restart(max_restarts=5, backoff=0.1)},
    )
    address = running.addresses["flaky/0"]
    client = courier.Client(address, token=running.token, timeout=30)
    for expected_restarts in (1, 2):
        os.kill(client.pid(), signal.SIGKILL)
        wait_until(lambda: running.status()["flaky/0"]["restarts"] == expected_restarts, "the supervisor's restart")
    assert running.wait(timeout=60)
    status = running.status()["flaky/0"]
    assert status["restarts"] == 2
    assert "killed by SIGKILL" in status["last_restart_cause"]
    assert running.addresses["flaky/0"] == address
    output = capfd.readouterr().out
    assert "[caller/0] reached start 3" in output
    assert "[launcher] restarting flaky/0 (1 of 5 in a row)" in output


SQUAT = """
import socket, sys
address = sys.argv[1]
try:
    if address.startswith("unix:"):
        path = address[len("unix:"):]
        try:
            __import__("os").unlink(path)  # a SIGKILLed node's socket file stays: a squatter removes it
        except FileNotFoundError:
            pass
        squat = socket.socket(socket.AF_UNIX)
        squat.bind(path)
    else:
        host, port = address.rsplit(":", 1)
        squat = socket.socket()
        squat.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        squat.bind((host, int(port)))
    print("bound", flush=True)
except OSError as error:
    print(type(error).__name__, flush=True)
"""


def test_another_local_user_cannot_take_the_address_of_a_node_while_it_restarts(tmp_path):
    """Whoever took a restarting node's port would be handed the token by its callers."""
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("acting as another local user needs root and setpriv(1)")
    program = jd.Program("squatted")
    with program.group("flaky"):
        flaky = program.add_node(jd.CourierNode(nodes.CrashesOnStarts, str(tmp_path / "starts"), []))
    running = jd.launch(program, launcher="processes", run_dir=str(tmp_path), echo=False,
                        restart={"flaky": jd.Restart(max_restarts=2, backoff=2.0)})
    try:
        address = running.addresses[flaky.node_name]
        client = courier.Client(address, token=running.token, timeout=30)
        pid = client.pid()
        os.kill(pid, signal.SIGKILL)
        wait_until(lambda: running.status()["flaky/0"]["restarts"] == 1, "the supervisor to see the death")
        squatter = subprocess.run(["setpriv", "--reuid=12345", "--regid=12345", "--clear-groups",
                                   sys.executable, "-I", "-c", SQUAT, address],
                                  capture_output=True, text=True, timeout=60)
        assert squatter.stdout.strip() == "PermissionError", squatter.stdout + squatter.stderr
        assert wait_until(lambda: client.pid() != pid, "the restarted node")
    finally:
        running.stop()


def test_a_restarted_node_that_crashes_while_starting_is_restarted_again(tmp_path):
    program = jd.Program("crash-at-start")
    with program.group("flaky"):
        flaky = program.add_node(jd.CourierNode(nodes.CrashesOnStarts, str(tmp_path / "starts"), [2, 3]))
    running = jd.launch(program, launcher="processes", run_dir=str(tmp_path), echo=False,
                        restart={"flaky": jd.Restart(max_restarts=3, backoff=0.05)})
    try:
        client = courier.Client(running.addresses[flaky.node_name], token=running.token, timeout=30)
        os.kill(client.pid(), signal.SIGKILL)
        wait_until(lambda: running.status()["flaky/0"]["restarts"] == 3, "three restarts")
        assert client.starts_seen() == 4  # starts 2 and 3 died while being built
        assert running.status()["flaky/0"]["state"] == "running"
    finally:
        running.stop()


def test_a_crash_loop_past_its_limit_stops_the_program_with_a_clear_message(tmp_path):
    program = jd.Program("crash-loop")
    with program.group("bad"):
        program.add_node(jd.CourierNode(nodes.AlwaysCrashes))
    with program.group("service"):
        program.add_node(jd.CourierNode(nodes.Counter))
    running = jd.launch(program, launcher="processes", run_dir=str(tmp_path), echo=False,
                        restart={"bad": jd.Restart(max_restarts=2, backoff=0.05)})
    with pytest.raises(jd.NodeFailedError, match="crashed 3 times, more than its restart limit allows") as raised:
        running.wait(timeout=60)
    assert "RuntimeError: crash loop" in raised.value.details
    assert running.status()["bad/0"]["restarts"] == 2


def test_a_node_that_stayed_up_long_enough_starts_a_fresh_count_and_backoff(tmp_path, capfd):
    program = jd.Program("healthy-between-crashes")
    with program.group("flaky"):
        flaky = program.add_node(jd.CourierNode(nodes.CrashesOnStarts, str(tmp_path / "starts"), []))
    # One restart in a row allowed; each life lasts longer than reset_after, so three kills are fine.
    running = jd.launch(program, launcher="processes", run_dir=str(tmp_path), echo=False,
                        restart={"flaky": jd.Restart(max_restarts=1, backoff=0.05, reset_after=0.5)})
    try:
        client = courier.Client(running.addresses[flaky.node_name], token=running.token, timeout=30)
        for kills in (1, 2, 3):
            wait_until(lambda: running.status()["flaky/0"]["state"] == "running", "the node to run")
            time.sleep(0.7)  # up for longer than reset_after (a span of time is what the policy measures)
            os.kill(client.pid(), signal.SIGKILL)
            wait_until(lambda: running.status()["flaky/0"]["restarts"] == kills, "the supervisor's restart")
        wait_until(lambda: running.status()["flaky/0"]["state"] == "running", "the node to run")
        assert running.status()["flaky/0"]["restarts"] == 3
    finally:
        running.stop()
    assert capfd.readouterr().out.count("restarting flaky/0 (1 of 1 in a row)") == 3  # the count started over


def test_nodes_without_a_policy_are_not_restarted(tmp_path):
    program = jd.Program("no-policy")
    program.add_node(jd.CourierNode(nodes.AlwaysCrashes))
    running = jd.launch(program, launcher="processes", run_dir=str(tmp_path), echo=False)
    with pytest.raises(jd.NodeFailedError, match="crash loop"):
        running.wait(timeout=60)
    assert running.status()["alwayscrashes/0"]["restarts"] == 0


def test_restart_policies_are_checked():
    program = jd.Program("p")
    program.add_node(jd.CourierNode(nodes.Counter))
    with pytest.raises(ValueError, match=r"restart names groups \['lerner'\].*groups: counter"):
        jd.launch(program, launcher="processes", restart={"lerner": jd.Restart()})
    with pytest.raises(TypeError, match="must be a jd.Restart"):
        jd.launch(program, launcher="processes", restart={"counter": 3})
    with pytest.raises(ValueError, match="invalid restart policy"):
        jd.Restart(max_restarts=-1)


def test_replay_cacher_and_parameter_server_come_back_by_default_on_their_addresses(tmp_path, capfd):
    program = jd.Program("default-restarts")
    with program.group("owner"):  # stands for the learner: its parameters, pushed in by the test
        owner = program.add_node(jd.CourierNode(VersionedParams))
    kinds = {"replay/0": ReplayNode(Fifo(16), checkpoint=True),
             "params/0": jd.CourierNode(ParameterServer, source=owner, follow_wait=1.0)}
    with program.group("replay"):
        program.add_node(kinds["replay/0"])
    with program.group("params"):
        params = program.add_node(kinds["params/0"])
    with program.group("cacher"):
        program.add_node(kinds.setdefault("cacher/0", CacherNode(params)))
    # No restart=: each group gets its node type's own policy.
    running = jd.launch(program, launcher="processes", run_dir=str(tmp_path), echo=False)
    try:
        addresses = dict(running.addresses)
        clients = {name: courier.Client(address, token=running.token, timeout=60) for name, address in addresses.items()}
        replay = ReplayClient(clients["replay/0"])
        replay.insert_many([{"x": np.full(2, seq)} for seq in range(3)])
        step = replay.checkpoint()
        replay.insert({"x": np.full(2, 3)})  # after the checkpoint: dies with the node
        clients["owner/0"].push({"w": np.ones(2)}, 7)
        wait_until(lambda: clients["params/0"].version() == 7, "the parameter server at version 7")
        for name in ("replay/0", "params/0", "cacher/0"):
            os.kill(running.status()[name]["pid"], signal.SIGKILL)
            wait_until(lambda: running.status()[name]["restarts"] == 1, f"{name}'s restart")
            wait_until(lambda: running.status()[name]["state"] == "running", f"{name} to run again")
        assert running.addresses == addresses
        # The clients made before the kills reach the restarted nodes on the same addresses.
        assert replay.size() == 3 and replay.sample(3, timeout=10)["data"]["x"][:, 0].tolist() == [0, 1, 2]
        wait_until(lambda: clients["params/0"].version() == 7, "the restarted server to follow its owner again")
        assert clients["owner/0"].push({"w": np.full(2, 2.0)}, 8)
        wait_until(lambda: clients["params/0"].version() == 8, "the restarted server to follow version 8")
        assert clients["cacher/0"].get()["version"] == 8  # through the restarted cacher to the restarted server
    finally:
        running.stop()
    out = capfd.readouterr().out
    for name, node in kinds.items():
        assert f"restarting {name} (1 of {node.default_restart().max_restarts} in a row)" in out, out
    with open(tmp_path / "logs" / "replay-0.log") as log:
        assert f"restored checkpoint step {step}" in log.read()
