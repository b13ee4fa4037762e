"""The ray launcher on a real local Ray cluster of two nodes (`ray.cluster_utils.Cluster`, both on
this machine), started once for the module: the two-phase start, jd.stop(), placement, restarts
by the program's policy, and a stop that leaves no actor behind."""

from __future__ import annotations

import os
import signal

import pytest

import jaxdist as jd
import launch_nodes as nodes
from jaxdist.launch.running import WORK_DONE
from waiting import wait_until

pytestmark = pytest.mark.slow

ray = pytest.importorskip("ray", reason="launcher='ray' needs Ray: pip install 'jaxdist[ray]'")

NODE_CPUS = 2
OBJECT_STORE = 100 * 2**20


@pytest.fixture(scope="module")
def cluster():
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": NODE_CPUS, "object_store_memory": OBJECT_STORE, "include_dashboard": False,
        "resources": {"head": 1}})
    cluster.add_node(num_cpus=NODE_CPUS, object_store_memory=OBJECT_STORE, resources={"second": 1})
    ray.init(address=cluster.address, log_to_driver=False)
    cluster.wait_for_nodes()
    try:
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()


def live_actors() -> list[str]:
    """Names of the unit actors Ray still holds alive (the state API needs the dashboard)."""
    from ray._private import state

    return [actor["ActorClassName"] for actor in state.actors().values()
            if actor["State"] != "DEAD" and actor["ActorClassName"] == "UnitActor"]


class Where:
    """Serves the Ray node it runs on."""

    def node_id(self) -> str:
        return ray.get_runtime_context().get_node_id() if ray.is_initialized() else os.environ.get("RAY_NODE_ID", "")


def producer_consumer(num_producers: int) -> jd.Program:
    program = jd.Program("producer_consumer")
    with program.group("producer"):
        producers = [program.add_node(jd.CourierNode(nodes.Counter)) for _ in range(num_producers)]
    with program.group("consumer"):
        for producer in producers:
            program.add_node(jd.PyNode(nodes.call_counter, producer, 3))
    return program


def test_a_program_runs_as_ray_actors_and_its_stop_leaves_none(cluster, tmp_path):
    running = jd.launch(producer_consumer(2), launcher="ray", run_dir=str(tmp_path), echo=False)
    assert running.wait(timeout=120)
    assert running.stop_reason == WORK_DONE
    statuses = running.status()
    assert {statuses[f"consumer/{index}"]["state"] for index in range(2)} == {"finished"}
    assert {statuses[f"producer/{index}"]["state"] for index in range(2)} == {"stopped"}
    for index in range(2):
        log = (tmp_path / "logs" / f"consumer-{index}.log").read_text()
        assert "counter at 4" in log
    wait_until(lambda: not live_actors(), "every unit actor dead", timeout=30)


def test_jd_stop_in_a_node_stops_the_program_and_its_callers_reach_its_server(cluster, tmp_path):
    program = jd.Program("stops")
    with program.group("counter"):
        counter = program.add_node(jd.CourierNode(nodes.Counter))
    with program.group("stopper"):
        program.add_node(jd.PyNode(nodes.stop_after, 0.5))
    running = jd.launch(program, launcher="ray", run_dir=str(tmp_path), echo=False)
    assert running.client(counter, timeout=30).increment() == 1  # from outside, with the launch's token
    assert running.wait(timeout=60)
    assert "jd.stop() was called in node 'stopper/0'" in running.stop_reason
    wait_until(lambda: not live_actors(), "every unit actor dead", timeout=30)
