"""A local Ray cluster of two nodes (`ray.cluster_utils.Cluster`, both on this machine) as a
module-scoped fixture, for the test modules of the ray launcher: ``from ray_cluster import cluster``."""

from __future__ import annotations

import pytest

NODE_CPUS = 2
OBJECT_STORE = 100 * 2**20


STARTS = 3


@pytest.fixture(scope="module")
def cluster():
    ray = pytest.importorskip("ray", reason="launcher='ray' needs Ray: pip install -e '.[ray]' in the jaxdist clone")
    cluster = _started_cluster(ray)
    try:
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()


def _started_cluster(ray):
    """Ray's second raylet can fail to register with the GCS within Ray's fixed 30 s on a loaded
    machine ("The current node timed out during startup") where a second try of the same start
    succeeds, so a failed start is torn down and tried again, up to STARTS times."""
    from ray.cluster_utils import Cluster

    for attempt in range(1, STARTS + 1):
        cluster = Cluster()
        try:
            cluster.add_node(num_cpus=NODE_CPUS, object_store_memory=OBJECT_STORE, include_dashboard=False,
                             resources={"head": 1})
            cluster.add_node(num_cpus=NODE_CPUS, object_store_memory=OBJECT_STORE, resources={"second": 1})
            ray.init(address=cluster.address, log_to_driver=False)
            cluster.wait_for_nodes()
            return cluster
        except Exception as exc:  # noqa: BLE001 - Ray raises a bare Exception for a node that did not start
            ray.shutdown()
            cluster.shutdown()
            if attempt == STARTS:
                raise
            print(f"the Ray cluster did not start ({exc}); starting it again ({attempt + 1} of {STARTS})")


def live_actors() -> list[str]:
    """Names of the unit actors Ray still holds alive (the state API needs the dashboard)."""
    from ray._private import state

    return [actor["ActorClassName"] for actor in state.actors().values()
            if actor["State"] != "DEAD" and actor["ActorClassName"] == "UnitActor"]
