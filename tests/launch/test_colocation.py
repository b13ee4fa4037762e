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
    with pytest.raises(TypeError, match="plain nodes"):
        jd.ColocationNode([jd.ColocationNode([jd.CourierNode(nodes.Counter)])])


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
