"""The program model: groups, handles and the errors a user meets first."""

from __future__ import annotations

import collections

import pytest

import jaxdist as jd
from jaxdist.launch import preflight
from jaxdist.program import replace_handles


class Service:
    def ping(self) -> str:
        return "pong"


def work() -> None:
    pass


def test_add_node_names_nodes_by_group_and_index():
    program = jd.Program("p")
    with program.group("actor"):
        handles = [program.add_node(jd.CourierNode(Service)) for _ in range(3)]
    assert [h.node_name for h in handles] == ["actor/0", "actor/1", "actor/2"]
    assert program.add_node(jd.PyNode(work)) is None
    assert list(program.groups) == ["actor", "work"]


def test_group_rejects_mixed_node_types():
    program = jd.Program("p")
    with program.group("actor"):
        program.add_node(jd.CourierNode(Service))
        with pytest.raises(TypeError, match="group 'actor' mixes node types CourierNode and PyNode"):
            program.add_node(jd.PyNode(work))


def test_groups_do_not_nest_and_nodes_are_added_once():
    program = jd.Program("p")
    with program.group("a"):
        with pytest.raises(ValueError, match="groups do not nest"):
            with program.group("b"):
                pass
    node = jd.CourierNode(Service)
    program.add_node(node)
    with pytest.raises(ValueError, match="already added"):
        program.add_node(node)


def test_handle_used_before_dereference_says_what_to_do():
    program = jd.Program("p")
    handle = program.add_node(jd.CourierNode(Service))
    with pytest.raises(RuntimeError, match=r"handle of node 'service/0' used before it was dereferenced \(.ping\)"):
        handle.ping()


def test_handles_at_any_depth_become_clients():
    Pair = collections.namedtuple("Pair", "left right")
    handle = jd.Handle("learner/0")
    value = {"a": [handle, (1, handle)], "b": Pair(handle, 2), "c": "text"}
    replaced = replace_handles(value, lambda name: f"client of {name}")
    assert replaced == {
        "a": ["client of learner/0", (1, "client of learner/0")],
        "b": Pair("client of learner/0", 2),
        "c": "text",
    }
    assert isinstance(replaced["b"], Pair)


def test_unknown_group_in_resources_lists_the_groups():
    program = jd.Program("p")
    with program.group("learner"):
        program.add_node(jd.CourierNode(Service))
    with pytest.raises(ValueError, match="resources name group 'lerner'.*groups: learner"):
        jd.launch(program, launcher="processes", resources={"lerner": {}})
    with pytest.raises(ValueError, match=r"unknown keys \['cpus'\].*env"):
        jd.launch(program, launcher="processes", resources={"learner": {"cpus": 4}})


def test_unshippable_argument_is_named_before_anything_starts():
    program = jd.Program("p")
    with program.group("actor"):
        program.add_node(jd.CourierNode(Service))
        program.add_node(jd.CourierNode(Service, 1, env_fn=lambda: None))
    with pytest.raises(TypeError, match=r"node 'actor/1': env_fn= .* cannot be sent to a process"):
        preflight.check_shippable(program)


def test_unknown_launcher_lists_available_ones():
    program = jd.Program("p")
    program.add_node(jd.PyNode(work))
    with pytest.raises(jd.LaunchError, match="unknown launcher 'slurm'; available: multihost, processes, ray, threads"):
        jd.launch(program, launcher="slurm")


def test_a_launchers_refusal_of_its_arguments_is_a_launch_error():
    """A launcher's own checks (here of a host index) raise ``jd.LaunchError``, a ValueError a
    caller can tell from a failure inside the program; the scripts print it as one line."""
    program = jd.Program("p")
    program.add_node(jd.PyNode(work))
    with pytest.raises(jd.LaunchError, match=r"host index 3 is outside the 1 hosts \['127.0.0.1'\]"):
        jd.launch(program, launcher="multihost", hosts=["127.0.0.1"], host_index=3, token="secret", echo=False)


def test_empty_program_is_refused():
    with pytest.raises(ValueError, match="has no nodes"):
        jd.launch(jd.Program("empty"), launcher="threads")


def test_stop_outside_a_program_is_an_error():
    with pytest.raises(RuntimeError, match="outside a launched program"):
        jd.stop()


@pytest.mark.parametrize("label", ["../../escape", "..", ".", "", "a\\b", "a/b"])
def test_a_label_that_would_leave_the_run_directory_is_refused(label):
    """Labels name checkpoint and log directories: '../../escape/0' was accepted by add_node."""
    program = jd.Program("labels")
    with pytest.raises(ValueError, match="group label must be a non-empty name"):
        program.add_node(jd.PyNode(print), label=label)
    with pytest.raises(ValueError, match="group label must be a non-empty name"):
        with program.group(label):
            pass


def test_a_label_that_contradicts_the_open_group_is_refused():
    program = jd.Program("labels")
    with program.group("actor"):
        program.add_node(jd.PyNode(print), label="actor")  # the same: fine
        with pytest.raises(ValueError, match="inside group 'actor'"):
            program.add_node(jd.PyNode(print), label="learner")


def test_a_node_context_does_not_show_its_token():
    from jaxdist.program import NodeContext

    assert "s3cret" not in repr(NodeContext("learner/0", "/tmp/run", "s3cret"))
