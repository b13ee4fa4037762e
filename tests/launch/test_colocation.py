"""ColocationNode under both launchers."""

from __future__ import annotations

import re

import pytest

import jaxdist as jd
import launch_nodes as nodes


def make_program(mode: str) -> tuple[jd.Program, list]:
    program = jd.Program("colocated")
    counter = jd.CourierNode(nodes.Counter)
    peer = jd.Handle("pair/0/0")
    handles = program.add_node(jd.ColocationNode([counter, jd.CourierNode(nodes.Pinger, peer)], mode=mode), label="pair")
    return program, handles


@pytest.mark.parametrize("launcher", ["threads", "processes"])
@pytest.mark.parametrize("mode", ["threads", "processes"])
def test_colocated_nodes_call_each_other_in_the_chosen_mode(tmp_path, capfd, launcher, mode):
    program, handles = make_program(mode)
    assert [handle.node_name for handle in handles] == ["pair/0/0", "pair/0/1"]
    running = jd.launch(program, launcher=launcher, run_dir=str(tmp_path))
    assert running.wait(timeout=60)
    output = capfd.readouterr().out
    match = re.search(r"pinger pid (\d+) peer pid (\d+) first 1", output)
    assert match, output
    same_process = match.group(1) == match.group(2)
    assert same_process == (launcher == "threads" or mode == "threads")
    expected_units = {"pair/0"} if mode == "threads" else {"pair/0/0", "pair/0/1"}
    assert set(running.status()) == expected_units


def test_colocation_rejects_bad_input():
    with pytest.raises(ValueError, match="mode must be one of"):
        jd.ColocationNode([jd.CourierNode(nodes.Counter)], mode="fibers")
    with pytest.raises(TypeError, match="takes nodes"):
        jd.ColocationNode([nodes.Counter])


@pytest.mark.parametrize("launcher", ["threads", "processes"])
def test_a_part_that_fails_while_its_sibling_waits_for_the_stop_fails_the_program(tmp_path, launcher):
    """The failure was held until every part had returned: the sibling waited for a stop that
    never came, and the program hung."""
    program = jd.Program("colocated-failure")
    program.add_node(jd.ColocationNode([jd.CourierNode(nodes.UntilStopped), jd.CourierNode(nodes.Failing)]),
                     label="pair")
    running = jd.launch(program, launcher=launcher, run_dir=str(tmp_path), echo=False)
    try:
        with pytest.raises(jd.NodeFailedError, match="deliberate failure in run"):
            running.wait(timeout=60)
    finally:
        running.stop()


@pytest.mark.parametrize("launcher", ["threads", "processes"])
def test_colocations_nest_threads_inside_processes_and_threads(tmp_path, launcher):
    program = jd.Program("nested")
    counter = jd.CourierNode(nodes.Counter)
    inner = jd.ColocationNode([counter, jd.ColocationNode([jd.CourierNode(nodes.Counter)])])  # threads in threads
    handles = program.add_node(jd.ColocationNode([inner, jd.CourierNode(nodes.Counter)], mode="processes"),
                               label="outer")
    assert [[h.node_name for h in handles[0][:1]], [h.node_name for h in handles[0][1]], handles[1].node_name] == \
        [["outer/0/0/0"], ["outer/0/0/1/0"], "outer/0/1"]
    running = jd.launch(program, launcher=launcher, run_dir=str(tmp_path), echo=False)
    try:
        pids = {name: running.client(name, timeout=30).pid() for name in ("outer/0/0/0", "outer/0/0/1/0", "outer/0/1")}
        assert pids["outer/0/0/0"] == pids["outer/0/0/1/0"]  # threads of one process
        assert (pids["outer/0/1"] == pids["outer/0/0/0"]) == (launcher == "threads")
        assert set(running.status()) == {"outer/0/0", "outer/0/1"}  # the threads colocation is one unit
        assert running.client(handles[1]).increment() == 1
    finally:
        running.stop()


def test_a_processes_colocation_cannot_run_inside_a_threads_one():
    with pytest.raises(ValueError, match="cannot run inside a threads one"):
        jd.ColocationNode([jd.ColocationNode([jd.CourierNode(nodes.Counter)], mode="processes")])


@pytest.mark.parametrize("launcher", ["threads", "processes"])
def test_configured_nodes_take_each_others_handles_and_a_test_drives_a_node_whose_run_is_disabled(tmp_path, launcher):
    """Launchpad's integration-test pattern: handles made before the nodes are added, arguments
    set after (`configure`), the node under test served without its `run()`, called from the
    test's body through `running.client`."""
    first, second = jd.CourierNode(nodes.Peer), jd.CourierNode(nodes.Peer)
    first.configure(second.create_handle())
    second.configure(peer=first.create_handle())
    program = jd.Program("configured")
    program.add_node(jd.ColocationNode([first, second], mode="processes"), label="peers")
    with program.group("driven"):
        driven = program.add_node(jd.CourierNode(nodes.RunFails).disable_run())
    running = jd.launch(program, launcher=launcher, run_dir=str(tmp_path), echo=False)
    try:
        one, two = running.client("peers/0/0", timeout=30), running.client("peers/0/1", timeout=30)
        assert one.peer_pid() == two.pid() and two.peer_pid() == one.pid()
        assert running.client(driven, timeout=30).answer() == 42
        with pytest.raises(KeyError, match="no node 'peers/9' serves.*driven/0"):
            running.client("peers/9")
        assert not running.wait(timeout=0.5)  # nothing has run: nothing fails, nothing ends
        assert all(status["error"] is None for status in running.status().values())
    finally:
        running.stop()
