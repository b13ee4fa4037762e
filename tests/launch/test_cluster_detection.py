"""Host detection on Kubernetes and on TPU VMs (the metadata server), beside SLURM's in
test_multihost.py; two-host runs detected this way are there too."""

from __future__ import annotations

import socket
import time

import pytest

from fake_metadata import FakeMetadataServer
from jaxdist.launch import hosts


def test_an_indexed_jobs_pods_are_named_after_this_pods_dns_name():
    fqdn = "trainer-1.workers.default.svc.cluster.local"
    assert hosts.kubernetes_hosts(fqdn, 1, 3) == (
        "trainer-0.workers.default.svc.cluster.local",
        "trainer-1.workers.default.svc.cluster.local",
        "trainer-2.workers.default.svc.cluster.local",
    )
    # A JobSet's Job: <jobset>-<replicated job>-<job index>-<pod index>.
    assert hosts.kubernetes_hosts("rl-learners-0-0.rl.team.svc.cluster.local", 0, 2)[1] == \
        "rl-learners-0-1.rl.team.svc.cluster.local"


def test_kubernetes_detection_says_what_the_manifest_lacks():
    with pytest.raises(ValueError, match="set JAXDIST_NUM_HOSTS in the pod template"):
        hosts.detect(environ={"JOB_COMPLETION_INDEX": "0"})
    with pytest.raises(ValueError, match="completionMode: Indexed"):
        hosts.kubernetes_hosts("web-7f9c.workers.default.svc.cluster.local", 0, 2)
    with pytest.raises(ValueError, match="no DNS name its peers can reach.*set subdomain: <service>"):
        hosts.kubernetes_hosts("trainer-0", 0, 2)


@pytest.mark.parametrize("endpoints", ["10.0.0.2,10.0.0.3", "t1v-n-ab-w-0:0:10.0.0.2,t1v-n-ab-w-1:1:10.0.0.3"])
def test_a_tpu_vm_finds_its_workers_on_the_metadata_server_in_either_format(endpoints):
    attributes = {"agent-worker-number": "1", "worker-network-endpoints": endpoints}
    with FakeMetadataServer(attributes) as server:
        cluster = hosts.detect(environ={"GCE_METADATA_IP": server.address})
    assert cluster == hosts.Cluster(("10.0.0.2", "10.0.0.3"), 1, "tpu-metadata")
    assert server.requests == ["/computeMetadata/v1/instance/attributes/agent-worker-number",
                               "/computeMetadata/v1/instance/attributes/worker-network-endpoints"]


def test_the_tpu_variables_win_over_the_metadata_server():
    with FakeMetadataServer({"agent-worker-number": "0", "worker-network-endpoints": "a,b"}) as server:
        environ = {"GCE_METADATA_IP": server.address, "TPU_WORKER_HOSTNAMES": "x,y", "TPU_WORKER_ID": "1"}
        assert hosts.detect(environ=environ) == hosts.Cluster(("x", "y"), 1, "tpu")
    assert server.requests == []


def test_a_gce_machine_that_is_no_tpu_worker_gets_the_usual_error():
    with FakeMetadataServer({}) as server:  # every attribute: 404
        with pytest.raises(ValueError, match="no TPU VM's metadata server; pass hosts="):
            hosts.detect(environ={"GCE_METADATA_IP": server.address})


def test_bad_endpoints_and_a_silent_metadata_server_are_clear_errors(monkeypatch):
    with FakeMetadataServer({"agent-worker-number": "0", "worker-network-endpoints": "a:b,c"}) as server:
        with pytest.raises(ValueError, match="cannot read 'a:b'.*name:id:ip"):
            hosts.detect(environ={"GCE_METADATA_IP": server.address})
    monkeypatch.setattr(hosts, "METADATA_TIMEOUT", 0.5)
    with socket.socket() as silent:  # accepts connections (the backlog) and never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        address = "127.0.0.1:%d" % silent.getsockname()[1]
        began = time.monotonic()
        with pytest.raises(ValueError, match=f"http://{address}/computeMetadata/.*no answer within 0.5 s"):
            hosts.detect(environ={"GCE_METADATA_IP": address})
        assert time.monotonic() - began < 5
