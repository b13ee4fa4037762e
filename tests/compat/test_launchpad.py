"""jaxdist.compat.launchpad: programs written against Launchpad's API run with the import as the
only change (the examples in experiments/launchpad/, in the shape of Launchpad's own: absl's
app.run, flags, --lp_launch_type, under both local launch types), and Launchpad's
integration-test pattern works (disable_run, a test launch, handle.dereference())."""

from __future__ import annotations

import os
import subprocess
import sys
import unittest

import numpy as np
import pytest

import jaxdist as jd
import jaxdist.compat.launchpad as lp

EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(__file__))), "experiments", "launchpad")


def run_example(name: str, launch_type: str, *flags: str, cwd=None) -> str:
    """The example's output (stdout and stderr: absl logs to stderr), launched as its flags say."""
    done = subprocess.run([sys.executable, os.path.join(EXAMPLES, f"{name}.py"), f"--lp_launch_type={launch_type}",
                           *flags], capture_output=True, text=True, timeout=240, cwd=cwd)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout + done.stderr


@pytest.mark.parametrize("launch_type", ["local_mt", "local_mp"])
def test_hello_world(launch_type, tmp_path):
    out = run_example("hello_world", launch_type, cwd=tmp_path)
    assert "[greeter/0] hello from a launchpad node" in out
    assert "hello from a launchpad node" in (tmp_path / "runs" / "hello_world" / "logs" / "greeter-0.log").read_text()


@pytest.mark.parametrize("launch_type", ["local_mt", "local_mp"])
def test_consumer_and_producers_read_their_flags_then_lp_stop(launch_type, tmp_path):
    out = run_example("consumer_producers", launch_type, "--num_producers=2", "--steps=2", cwd=tmp_path)
    assert "step 1 results [1, 4]" in out  # two producers, as the flag said
    assert "step 2 " not in out  # the flag read inside the consumer's node: two steps
    assert any(line.startswith("[consumer/0] I") and "step 0 results [0, 1]" in line for line in out.splitlines())
    log = (tmp_path / "runs" / "consumer_producers" / "logs" / "consumer-0.log").read_text()
    assert "step 0 results [0, 1]" in log  # absl's logging.info reached the node's log, and the console prefixed


@pytest.mark.parametrize("launch_type", ["local_mt", "local_mp"])
def test_batching(launch_type, tmp_path):
    out = run_example("batching", launch_type, cwd=tmp_path)
    assert out.count("batch of 3") == 3  # three rounds of the three clients, one call each
    assert all(f"client {i} done" in out for i in range(3))


@pytest.mark.parametrize(("launch_type", "launches"), [("local_mt", 2), ("local_mp", 1)])  # a relaunch once
def test_program_wait(launch_type, launches, tmp_path):
    out = run_example("program_wait", launch_type, f"--launches={launches}", cwd=tmp_path)
    for attempt in range(launches):
        assert f"program finished {attempt}" in out
    for clean in ("polls_for_stop: clean exit", "waits_for_stop: clean exit", "waits_on_event: clean exit",
                  "stop handler called", "has_stop_handler: clean exit"):
        assert out.count(clean) == launches, (clean, out)


class Accumulator:
    def __init__(self) -> None:
        self.total = 0

    def add(self, x: int) -> int:
        self.total += x
        return self.total

    def run(self) -> None:
        raise AssertionError("disable_run() was asked: run() must not be called")


class IntegrationTest(unittest.TestCase):
    """Launchpad's recommended integration test, as a Launchpad user writes it."""

    def _check(self, launch_type: lp.LaunchType) -> None:
        program = lp.Program("integration")
        node = lp.CourierNode(Accumulator)
        handle = program.add_node(node, label="accumulator")
        node.disable_run()
        lp.launch(program, launch_type=launch_type, test_case=self)
        client = handle.dereference()
        self.assertEqual(client.add(2), 2)
        self.assertEqual(client.futures.add(3).result(), 5)

    def test_multi_threading(self) -> None:
        self._check(lp.LaunchType.TEST_MULTI_THREADING)

    def test_multi_processing(self) -> None:
        self._check(lp.LaunchType.TEST_MULTI_PROCESSING)


def test_colocation_ends_with_its_first_node_when_asked():
    def quick() -> None:
        print("quick done", flush=True)

    program = lp.Program("colocated")
    program.add_node(lp.MultiThreadingColocation([lp.PyNode(quick), lp.PyNode(lp.wait_for_stop)],
                                                 return_on_first_completed=True), label="pair")
    manager = lp.launch(program, launch_type=lp.LaunchType.LOCAL_MULTI_THREADING)
    manager.wait()
    assert manager.status()["pair/0"]["state"] == "finished"
    with pytest.raises(ValueError, match="threads colocation"):
        jd.ColocationNode([jd.PyNode(quick)], mode="processes", return_on_first_completed=True)


def test_reverb_node_serves_jaxdist_tables_and_refuses_what_needs_tensorflow(tmp_path):
    def tables():
        return {"priority_table": jd.replay.Uniform(100)}

    program = lp.Program("reverb")
    handle = program.add_node(lp.ReverbNode(tables, checkpoint_time_delta_minutes=10), label="replay")
    running = lp.launch(program, launch_type=lp.LaunchType.TEST_MULTI_THREADING)
    try:
        replay = jd.replay.ReplayClient(handle.dereference())
        replay.insert({"obs": np.ones(3, np.float32)}, table="priority_table")
        assert replay.size("priority_table") == 1
    finally:
        running.stop()
    with pytest.raises(ValueError, match="TensorFlow"):
        lp.ReverbNode(tables, checkpoint_ctor=object)
    with pytest.raises(TypeError, match="name: table"):
        lp.ReverbNode(lambda: [jd.replay.Uniform(10)])


def test_dereferencing_a_handle_outside_any_launch_says_how():
    program = lp.Program("never-launched")
    handle = program.add_node(lp.CourierNode(Accumulator), label="accumulator")
    with pytest.raises(LookupError, match="running.client"):
        handle.dereference()


def test_local_resources_need_processes_and_xmanager_is_refused():
    program = lp.Program("resources")
    program.add_node(lp.PyClassNode(Accumulator), label="accumulator")
    with pytest.raises(ValueError, match="MULTI_PROCESSING"):
        lp.launch(program, launch_type="local_mt", local_resources={"accumulator": lp.PythonProcess(env={"A": "1"})})
    with pytest.raises(ValueError, match="XManager"):
        lp.launch(program, xm_resources={})


def test_courier_node_handles_have_no_deadline_and_courier_kwargs_reach_the_server():
    node = lp.CourierNode(Accumulator, courier_kwargs={"thread_pool_size": 2})
    assert node.server_options == {"thread_pool_size": 2}
    handle = lp.Program("deadlines").add_node(node, label="accumulator")
    assert handle.dereference(lambda name, **options: options) == {"timeout": None}


def test_what_jaxdist_does_not_map_is_refused_naming_the_difference():
    with pytest.raises(AttributeError, match=r"no MultiProcessingColocation.*ColocationNode\(nodes, mode='processes'\)"):
        lp.MultiProcessingColocation  # noqa: B018 - the attribute lookup is what is tested
    with pytest.raises(AttributeError, match="no CacherNode.*seconds"):
        lp.CacherNode  # noqa: B018
    program = lp.Program("remote")
    program.add_node(lp.PyNode(lp.wait_for_stop), label="waiter")
    with pytest.raises(ValueError, match="VERTEX_AI needs Vertex AI, which jaxdist does not launch on"):
        lp.launch(program, launch_type=lp.LaunchType.VERTEX_AI)
    with pytest.raises(ValueError, match="LOCAL_DOCKER needs Docker"):
        lp.launch(program, launch_type="local_docker")
    with pytest.raises(ValueError, match="no command-line arguments of its own"):
        lp.PythonProcess(args={"seed": 1})
