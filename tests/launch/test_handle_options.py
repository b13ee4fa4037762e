"""Client options per handle: the node that receives a handle, and a test's body dereferencing
it, get a client with the handle's options (here a short deadline)."""

from __future__ import annotations

import pickle

import pytest

import jaxdist as jd
import launch_nodes as nodes


def test_unknown_options_are_refused_with_the_ones_there_are():
    handle = jd.Handle("sleeper/0")
    with pytest.raises(TypeError, match=r"unknown client options \['deadline'\].*timeout"):
        handle.with_options(deadline=1.0)
    with pytest.raises(TypeError, match="unknown client options"):
        handle.with_options(token="mine")  # the launcher's to set


def test_options_travel_with_the_handle_to_other_processes():
    handle = pickle.loads(pickle.dumps(jd.Handle("sleeper/0").with_options(timeout=0.5).with_options(wait_for_ready=False)))
    assert handle.dereference(lambda name, **options: (name, options)) == (
        "sleeper/0", {"timeout": 0.5, "wait_for_ready": False})


@pytest.mark.parametrize("launcher", ["threads", "processes"])
def test_a_handles_timeout_applies_where_it_is_dereferenced(tmp_path, launcher):
    program = jd.Program("handle-options")
    sleeper = program.add_node(jd.CourierNode(nodes.Sleeper), label="sleeper")
    caller = program.add_node(jd.CourierNode(nodes.CallsWithItsTimeout, sleeper.with_options(timeout=0.3)),
                              label="caller")
    with jd.launch(program, launcher=launcher, run_dir=str(tmp_path), echo=False) as running:
        outcome = running.client(caller, timeout=30)
        assert outcome.outcome(0.0) == "answered 0.0"
        assert outcome.outcome(2.0) == "DeadlineExceededError"
        with pytest.raises(jd.courier.DeadlineExceededError):
            running.client(sleeper.with_options(timeout=0.3)).sleep(2.0)
        assert running.client(sleeper.with_options(timeout=0.3), timeout=30).sleep(1.0) == 1.0  # the call's own wins
