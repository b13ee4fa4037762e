"""A local Ray cluster of two nodes (`ray.cluster_utils.Cluster`, both on this machine) as a
module-scoped fixture, for the test modules of the ray launcher: ``from ray_cluster import cluster``."""

from __future__ import annotations

import pytest

NODE_CPUS = 2
OBJECT_STORE = 100 * 2**20


@pytest.fixture(scope="module")
def cluster():
    ray = pytest.importorskip("ray", reason="launcher='ray' needs Ray: pip install 'jaxdist[ray]'")
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
