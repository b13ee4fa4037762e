"""The multihost launcher: host detection, placement and the address table, and two "hosts" as
two process trees on 127.0.0.1 with their own port ranges (no network namespaces)."""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys

import pytest

import jaxdist as jd
import launch_nodes
from orphans import processes_with_marker
from waiting import wait_until
from ports import reserve_base_port
import multihost_nodes as nodes
from jaxdist import courier
from jaxdist.courier.tls import TLS
from jaxdist.launch import hosts, placement
from jaxdist.launch.launchers import multihost
from fake_metadata import FakeMetadataServer

SCRIPT = os.path.join(os.path.dirname(os.path.dirname(__file__)), "support", "multihost_script.py")
TWO_HOSTS = "127.0.0.1,127.0.0.1"


# Host lists -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "nodelist, expected",
    [
        ("node01", ["node01"]),
        ("a,b", ["a", "b"]),
        ("node[01-03,07]", ["node01", "node02", "node03", "node07"]),
        ("gpu[8-10],login1", ["gpu8", "gpu9", "gpu10", "login1"]),
        ("rack[1-2]-n[01-02]", ["rack1-n01", "rack1-n02", "rack2-n01", "rack2-n02"]),
        ("x[007]", ["x007"]),
    ],
)
def test_slurm_node_lists_expand_like_scontrol(nodelist, expected):
    assert hosts.expand_nodelist(nodelist) == expected


@pytest.mark.parametrize("nodelist, message", [("n[1-", "unbalanced"), ("n[a-b]", "cannot read range"),
                                               ("n[3-1]", "backwards"), ("a,,b", "empty host")])
def test_malformed_node_lists_are_refused_with_the_reason(nodelist, message):
    with pytest.raises(ValueError, match=message):
        hosts.expand_nodelist(nodelist)


def test_slurm_variables_give_the_hosts_and_this_hosts_index():
    environ = {"SLURM_JOB_NODELIST": "node[01-03]", "SLURM_NODEID": "2", "SLURM_PROCID": "2", "SLURM_NTASKS": "3"}
    cluster = hosts.detect(environ=environ)
    assert cluster == hosts.Cluster(("node01", "node02", "node03"), 2, "slurm")
    assert cluster.host == "node03"


def test_the_slurm_step_node_list_wins_over_the_jobs():
    environ = {"SLURM_JOB_NODELIST": "node[01-04]", "SLURM_STEP_NODELIST": "node[02-03]", "SLURM_NODEID": "0"}
    assert hosts.detect(environ=environ).hosts == ("node02", "node03")


def test_slurm_with_several_tasks_per_host_is_refused():
    environ = {"SLURM_JOB_NODELIST": "node[01-02]", "SLURM_NODEID": "0", "SLURM_NTASKS": "4"}
    with pytest.raises(ValueError, match="ntasks-per-node=1"):
        hosts.detect(environ=environ)


def test_tpu_vm_variables_give_the_hosts():
    environ = {"TPU_WORKER_HOSTNAMES": "10.0.0.2,10.0.0.3", "TPU_WORKER_ID": "1"}
    assert hosts.detect(environ=environ) == hosts.Cluster(("10.0.0.2", "10.0.0.3"), 1, "tpu")


def test_explicit_hosts_win_over_the_environment():
    environ = {"SLURM_JOB_NODELIST": "node[01-03]", "SLURM_NODEID": "2"}
    assert hosts.detect("a,b", 0, environ) == hosts.Cluster(("a", "b"), 0, "explicit")
    assert hosts.detect(["a", "b"], 1, environ).host == "b"


def test_detection_errors_say_what_to_pass():
    with pytest.raises(ValueError, match="--hosts h0,h1 --host-index i"):
        hosts.detect(environ={})
    with pytest.raises(ValueError, match="give both hosts and host_index"):
        hosts.detect(["a", "b"], None, {})
    with pytest.raises(ValueError, match="host index 2 is outside the 2 hosts"):
        hosts.detect(["a", "b"], 2, {})


def test_flags_become_launcher_options():
    parser = argparse.ArgumentParser()
    hosts.add_arguments(parser)
    assert hosts.from_args(parser.parse_args([])) == {}
    args = parser.parse_args(["--hosts", "n[1-2]", "--host-index", "1", "--coordinator", "n1:9000", "--base-port", "41000"])
    assert hosts.from_args(args) == {"hosts": "n[1-2]", "host_index": 1, "coordinator": "n1:9000", "base_port": 41000}


# Placement and the address table ---------------------------------------------------------------


def rl_program(actors: int = 5, learners: int = 2) -> jd.Program:
    program = jd.Program("rl")
    with program.group("replay"):
        program.add_node(jd.CourierNode(nodes.Counter))
    with program.group("learner"):
        for _ in range(learners):
            program.add_node(jd.CourierNode(nodes.Counter))
    with program.group("actor"):
        for _ in range(actors):
            program.add_node(jd.CourierNode(nodes.Counter))
    with program.group("evaluator"):
        program.add_node(jd.CourierNode(nodes.Counter))
    return program


RL_PLACEMENT = {"learner": placement.per_host(), "actor": placement.spread(), "replay": placement.on_host(1)}


def test_groups_are_placed_per_host_spread_on_a_host_or_on_host_0():
    plan = placement.plan(rl_program(), ("h0", "h1"), RL_PLACEMENT, base_port=41000)
    assert plan.host_of == {
        "replay/0": 1,
        "learner/0": 0, "learner/1": 1,
        "actor/0": 0, "actor/1": 1, "actor/2": 0, "actor/3": 1, "actor/4": 0,
        "evaluator/0": 0,
    }
    assert plan.units_on(1) == ["replay/0", "learner/1", "actor/1", "actor/3"]
    assert plan.distributed_groups == ("learner",)


def test_every_host_computes_the_same_table_with_ports_in_its_own_range():
    plan = placement.plan(rl_program(), ("h0", "h1"), RL_PLACEMENT, base_port=41000)
    again = placement.plan(rl_program(), ("h0", "h1"), RL_PLACEMENT, base_port=41000)
    assert plan == again
    per_host_ports = 7  # host 0 serves 5 nodes, plus the control and coordinator ports
    for name, address in plan.addresses.items():
        host, port = address.rsplit(":", 1)
        index = plan.host_of[name]
        assert host == f"h{index}"
        assert 41000 + index * per_host_ports <= int(port) < 41000 + (index + 1) * per_host_ports - 2
    assert len(set(plan.addresses.values())) == len(plan.addresses)
    assert plan.controls == ("h0:41005", "h1:41012")
    assert plan.coordinator == "h0:41006"


def test_fixed_port_ranges_and_an_explicit_coordinator():
    plan = placement.plan(rl_program(), ("h0", "h1"), RL_PLACEMENT, base_port=41000, ports_per_host=100,
                          coordinator="h1:9999")
    assert plan.addresses["replay/0"] == "h1:41100"
    assert plan.addresses["actor/4"] == "h0:41003"
    assert plan.coordinator == "h1:9999"
    assert plan.controls == ("h0:41098", "h1:41198")


def test_threads_colocations_get_a_port_for_each_part():
    program = jd.Program("colocated")
    program.add_node(jd.ColocationNode([jd.CourierNode(nodes.Counter), jd.CourierNode(nodes.Counter)]), label="pair")
    plan = placement.plan(program, ("h0",), None, base_port=41000)
    assert plan.host_of == {"pair/0": 0}
    assert plan.addresses == {"pair/0/0": "h0:41000", "pair/0/1": "h0:41001"}


def test_bad_placements_are_refused_with_the_fix():
    with pytest.raises(ValueError, match="per_host\\(\\) over 3 hosts but has 2 nodes"):
        placement.plan(rl_program(), ("a", "b", "c"), RL_PLACEMENT)
    with pytest.raises(ValueError, match="does not have; groups: actor, evaluator, learner, replay"):
        placement.plan(rl_program(), ("a", "b"), {"learners": placement.per_host()})
    with pytest.raises(ValueError, match="on_host\\(1\\) but there are only 1 hosts"):
        placement.plan(rl_program(learners=1), ("a",), {"replay": placement.on_host(1)})
    with pytest.raises(TypeError, match="must be jd.per_host"):
        placement.plan(rl_program(), ("a", "b"), {"actor": "spread"})
    with pytest.raises(ValueError, match="raise ports_per_host"):
        placement.plan(rl_program(), ("a", "b"), RL_PLACEMENT, ports_per_host=6)
    with pytest.raises(ValueError, match="do not fit in 1..65535"):
        placement.plan(rl_program(), ("a", "b"), RL_PLACEMENT, base_port=65530)


# Launching -----------------------------------------------------------------------------------


def test_a_multi_host_launch_needs_a_shared_token(tmp_path, monkeypatch):
    monkeypatch.delenv(multihost.TOKEN_ENV, raising=False)
    with pytest.raises(ValueError, match="JAXDIST_TOKEN"):
        jd.launch(rl_program(), launcher="multihost", hosts=["a", "b"], host_index=0, run_dir=str(tmp_path))


def test_an_empty_token_is_no_token_for_a_multi_host_launch(tmp_path, monkeypatch):
    monkeypatch.setenv(multihost.TOKEN_ENV, "")
    with pytest.raises(ValueError, match="JAXDIST_TOKEN"):
        jd.launch(rl_program(), launcher="multihost", hosts=["a", "b"], host_index=0, run_dir=str(tmp_path))


def test_a_tls_dir_without_this_hosts_certificate_is_refused_saying_how_to_make_it(tmp_path, monkeypatch):
    """Before, the missing file came out of launch() as a FileNotFoundError, and the agents'
    scripts printed its traceback instead of one line."""
    monkeypatch.setenv(multihost.TOKEN_ENV, "shared-secret")
    with pytest.raises(jd.LaunchError, match="jaxdist.tools.certs .* --hosts 127.0.0.1"):
        jd.launch(rl_program(), launcher="multihost", hosts=["127.0.0.1"], host_index=0, run_dir=str(tmp_path / "run"),
                  tls_dir=str(tmp_path / "no-certs"))


def test_only_the_per_host_group_gets_the_distributed_environment(tmp_path, capfd):
    program = jd.Program("distributed-env")
    with program.group("learner"):
        program.add_node(jd.PyNode(launch_nodes.print_env, "JAXDIST_COORDINATOR_ADDRESS"))
    with program.group("actor"):
        program.add_node(jd.PyNode(launch_nodes.print_env, "JAXDIST_COORDINATOR_ADDRESS"))
    base = reserve_base_port()
    running = jd.launch(program, launcher="multihost", hosts=["127.0.0.1"], host_index=0, base_port=base,
                        placement={"learner": placement.per_host()}, run_dir=str(tmp_path))
    assert running.wait(timeout=60)
    out = capfd.readouterr().out
    assert f"[learner/0] JAXDIST_COORDINATOR_ADDRESS=127.0.0.1:{base + 3}" in out  # 2 nodes', the control port
    assert "[actor/0] JAXDIST_COORDINATOR_ADDRESS=None" in out


def test_one_host_runs_only_its_share_on_the_planned_addresses_bound_on_every_interface(tmp_path):
    program = jd.Program("share")
    with program.group("service"):
        program.add_node(jd.CourierNode(nodes.Counter))
    with program.group("other"):
        program.add_node(jd.CourierNode(nodes.Counter))
    base = reserve_base_port()
    options = dict(hosts=["127.0.0.1", "127.0.0.1"], host_index=1, base_port=base, token="t",
                   placement={"service": placement.on_host(1)})
    running = jd.launch(program, launcher="multihost", run_dir=str(tmp_path), bind_host="0.0.0.0", **options)
    try:
        assert set(running.status()) == {"service/0"}
        plan = multihost.plan_for(program, **options)
        # it bound 0.0.0.0, yet the table keeps the address other hosts reach it on
        assert running.addresses["service/0"] == plan.addresses["service/0"] == f"127.0.0.1:{base + 3}"
        assert running.addresses["other/0"] == f"127.0.0.1:{base}"  # known, though host 0 runs it
        with courier.Client(plan.addresses["service/0"], token="t") as client:
            assert client.increment() == 1
    finally:
        running.stop()


def host_1_alone(name: str, run_dir: str) -> tuple[jd.Running, tuple[str, ...]]:
    """Host 1 of two on loopback, running a service; host 0 is not started. Its running share,
    and the hosts' control addresses."""
    program = jd.Program(name)
    with program.group("service"):
        program.add_node(jd.CourierNode(nodes.Counter))
    options = dict(hosts=["127.0.0.1", "127.0.0.1"], host_index=1, base_port=reserve_base_port(), token="shared",
                   placement={"service": placement.on_host(1)})
    running = jd.launch(program, launcher="multihost", run_dir=run_dir, echo=False, **options)
    return running, multihost.plan_for(program, **options).controls


def test_the_multihost_control_port_refuses_a_stop_without_the_token(tmp_path):
    running, controls = host_1_alone("control", str(tmp_path))
    control = controls[1]
    try:
        for token in (None, "not-the-token"):
            with courier.Client(control, token=token, timeout=30) as stranger:
                with pytest.raises(courier.AuthenticationError, match="missing or wrong courier token"):
                    stranger.stop("a stranger says stop", 0)
        assert running.wait(timeout=0) is False and running.status()["service/0"]["state"] == "running"
        with courier.Client(control, token="shared", timeout=30) as peer:
            assert peer.stop("host 0 is done", 0) == 1
        assert running.wait(timeout=60)
        assert running.stop_reason == "host 0 stopped the program: host 0 is done"
    finally:
        running.stop()


def test_a_host_waiting_for_a_peer_that_is_not_up_names_it(tmp_path, capfd, monkeypatch):
    monkeypatch.setattr(multihost, "PEER_WAIT_NOTICE", 0.5)
    running, controls = host_1_alone("waiting", str(tmp_path))
    control = controls[0]
    try:
        seen = []
        wait_until(lambda: seen.append(capfd.readouterr().out) or "waits for host 0" in "".join(seen),
                   "the line naming the missing host")
        assert f"host 1 waits for host 0 at {control}, not up yet" in "".join(seen)
    finally:
        running.stop()


def script(host_index: int, base: int, run_dir: str, *extra: str) -> list[str]:
    return [sys.executable, SCRIPT, "--hosts", TWO_HOSTS, "--host-index", str(host_index),
            "--base-port", str(base), "--run-dir", run_dir, *extra]


def host_env(token: str = "shared-secret") -> dict[str, str]:
    return dict(os.environ, JAXDIST_TOKEN=token, PYTHONUNBUFFERED="1")


def test_the_address_tables_of_two_hosts_agree(tmp_path):
    base = reserve_base_port()
    tables = [
        json.loads(subprocess.run(script(index, base, str(tmp_path), "--print-plan"), capture_output=True,
                                  text=True, check=True, timeout=60, env=host_env()).stdout)
        for index in (0, 1)
    ]
    assert tables[0] == tables[1]
    assert tables[0]["host_of"]["service/0"] == 0
    assert {tables[0]["host_of"][f"caller/{i}"] for i in range(4)} == {0, 1}


def slurm_host(host_index: int, base: int, run_dir: str) -> tuple[list[str], dict[str, str]]:
    """Host `host_index` of a faked two-node SLURM step: no --hosts, only SLURM's variables."""
    env = dict(host_env(), SLURM_JOB_NODELIST=TWO_HOSTS, SLURM_NODEID=str(host_index), SLURM_NTASKS="2")
    return [sys.executable, SCRIPT, "--base-port", str(base), "--run-dir", run_dir], env


def kubernetes_pod(host_index: int, base: int, run_dir: str, hosts_file: str) -> tuple[list[str], dict[str, str]]:
    """Pod `host_index` of a faked two-pod Indexed Job under the headless Service `workers`: what
    Kubernetes gives a pod (its hostname, an /etc/hosts line for its DNS name, JOB_COMPLETION_INDEX)
    and the manifest's JAXDIST_NUM_HOSTS, in a mount and UTS namespace of its own; the two pods'
    names resolve to 127.0.0.2 and 127.0.0.3."""
    command = ["unshare", "--mount", "--uts", "--", "sh", "-c",
               f'mount --bind {hosts_file} /etc/hosts && hostname trainer-{host_index} && exec "$@"', "pod",
               sys.executable, SCRIPT, "--base-port", str(base), "--run-dir", run_dir]
    return command, dict(host_env(), JOB_COMPLETION_INDEX=str(host_index), JAXDIST_NUM_HOSTS="2")


def namespaces_unavailable() -> str | None:
    """Why this machine cannot fake a pod (unshare needs root or user namespaces), or None."""
    try:
        done = subprocess.run(["unshare", "--mount", "--uts", "--", "true"], capture_output=True, text=True, timeout=30)
    except FileNotFoundError:
        return "no unshare command (util-linux) to make a pod's mount and UTS namespaces"
    return None if done.returncode == 0 else f"unshare --mount --uts fails here: {done.stderr.strip()}"


@pytest.mark.parametrize("detection", ["flags", "slurm", "kubernetes", "tpu-metadata"])
def test_callers_on_host_1_reach_the_service_on_host_0(tmp_path, detection):
    if detection == "kubernetes" and namespaces_unavailable():
        pytest.skip(namespaces_unavailable())
    base = reserve_base_port()
    hosts_file = tmp_path / "hosts"
    hosts_file.write_text("127.0.0.1 localhost\n" + "".join(
        f"127.0.0.{2 + i} trainer-{i}.workers.default.svc.cluster.local trainer-{i}\n" for i in range(2)))
    # Each TPU VM asks its own metadata server (the old name:id:ip format on one, hosts on the other).
    metadata = [FakeMetadataServer({"agent-worker-number": str(i), "worker-network-endpoints": endpoints})
                for i, endpoints in enumerate(["w-0:0:127.0.0.2,w-1:1:127.0.0.3", "127.0.0.2,127.0.0.3"])]

    def start(index: int) -> subprocess.Popen:
        run_dir = str(tmp_path / f"h{index}")
        if detection == "flags":
            command, env = script(index, base, run_dir), host_env()
        elif detection == "slurm":
            command, env = slurm_host(index, base, run_dir)
        elif detection == "kubernetes":
            command, env = kubernetes_pod(index, base, run_dir, str(hosts_file))
        else:
            command = [sys.executable, SCRIPT, "--base-port", str(base), "--run-dir", run_dir]
            env = dict(host_env(), GCE_METADATA_IP=metadata[index].address)
        return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)

    with metadata[0], metadata[1]:
        out1, _ = run_two_hosts(start)
    found = {"flags": "127.0.0.1, 127.0.0.1 (explicit)", "slurm": "127.0.0.1, 127.0.0.1 (slurm)",
             "kubernetes": "trainer-0.workers.default.svc.cluster.local, trainer-1.workers.default.svc.cluster.local "
                           "(kubernetes)", "tpu-metadata": "127.0.0.2, 127.0.0.3 (tpu-metadata)"}[detection]
    assert f"this is host 1 of {found}" in out1, out1


def run_two_hosts(start) -> tuple[str, str]:
    """Host 1's and host 0's output once both ran the script's callers to the end."""
    # Host 1 starts first: its callers run, and wait for the service that host 0 has not bound yet.
    host1 = start(1)
    lines1: list[str] = []
    read_pids(host1, lines1)
    host0 = start(0)
    outputs = []
    for host, before in ((host1, "".join(lines1)), (host0, "")):
        out, _ = host.communicate(timeout=120)
        outputs.append(before + out)
        assert host.returncode == 0, before + out
    out1, out0 = outputs
    assert "caller/1 saw total 100" in out1 and "caller/3 saw total 100" in out1, out1
    assert "caller/0 saw total 100" in out0 and "caller/2 saw total 100" in out0, out0
    assert "service/0" not in out1.split("running pids")[1].splitlines()[0]
    assert "every node with work of its own has finished" in out1
    return out1, out0


def read_pids(process: subprocess.Popen, lines: list[str]) -> dict[str, int]:
    for line in process.stdout:
        lines.append(line)
        match = re.search(r"running pids (\{.*\})", line)
        if match:
            return json.loads(match.group(1))
    raise AssertionError("host exited before its nodes ran:\n" + "".join(lines))


@pytest.mark.slow
def test_a_killed_caller_on_one_host_is_restarted_and_a_stop_on_the_other_host_travels_to_it(tmp_path):
    base = reserve_base_port()
    extra = ("--mode", "forever", "--callers", "2")
    host0 = subprocess.Popen(script(0, base, str(tmp_path / "h0"), *extra), stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True, env=host_env())
    host1 = subprocess.Popen(script(1, base, str(tmp_path / "h1"), *extra), stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True, env=host_env())
    lines0, lines1 = [], []
    try:
        read_pids(host0, lines0)
        pids1 = read_pids(host1, lines1)
        assert set(pids1) == {"caller/1"}
        os.kill(pids1["caller/1"], signal.SIGKILL)  # host 1's supervisor brings it back
        with courier.Client(f"127.0.0.1:{base}", token="shared-secret") as service:
            first = service.with_timeout(10).peek()
            wait_until(lambda: service.with_timeout(10).peek() > first, "host 0's caller to keep calling")
        assert host0.poll() is None and host1.poll() is None
        host0.send_signal(signal.SIGTERM)  # as scancel would: a graceful stop, exit 0
        out0, _ = host0.communicate(timeout=60)
        out1, _ = host1.communicate(timeout=60)  # the stop reached host 1 through its control port
        assert host0.returncode == 0, "".join(lines0) + out0
        assert host1.returncode == 0, "".join(lines1) + out1
        assert "host 0 finished: the launcher got SIGTERM" in out0
        assert "host 1 finished: host 0 stopped the program: the launcher got SIGTERM" in out1
        assert "restarting caller/1 (1 of 3 in a row)" in "".join(lines1) + out1
    finally:
        for host in (host0, host1):
            if host.poll() is None:
                host.kill()
                host.wait()


@pytest.mark.slow
def test_with_tls_dir_the_hosts_talk_mutual_tls_and_refuse_plaintext(tmp_path):
    """Certificates from the certs command, the same flag on both hosts: the service on host 0
    answers a TLS client with the run's certificate and refuses a plaintext one; the stop
    travels between the hosts' control ports, which use TLS too."""
    base, tls_dir = reserve_base_port(), str(tmp_path / "certs")
    subprocess.run([sys.executable, "-m", "jaxdist.tools.certs", tls_dir, "--hosts", "127.0.0.1"], check=True, timeout=60,
                   capture_output=True)
    extra = ("--mode", "forever", "--callers", "2", "--tls-dir", tls_dir)
    hosts = [subprocess.Popen(script(index, base, str(tmp_path / f"h{index}"), *extra), stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, env=host_env()) for index in (0, 1)]
    lines = [[], []]
    try:
        for host, seen in zip(hosts, lines):
            read_pids(host, seen)
        with courier.Client(f"127.0.0.1:{base}", token="shared-secret", tls=TLS.load(tls_dir, "127.0.0.1")) as service:
            first = service.with_timeout(10).peek()
            wait_until(lambda: service.with_timeout(10).peek() > first, "the callers of both hosts to call over TLS")
        with courier.Client(f"127.0.0.1:{base}", token="shared-secret", timeout=3, wait_for_ready=False) as plain:
            with pytest.raises(courier.UnavailableError):
                plain.peek()
        hosts[0].send_signal(signal.SIGTERM)
        outputs = [host.communicate(timeout=60)[0] for host in hosts]
        for host, seen, out in zip(hosts, lines, outputs):
            assert host.returncode == 0, "".join(seen) + out
        assert "host 1 finished: host 0 stopped the program: the launcher got SIGTERM" in outputs[1]
        assert "without TLS" not in "".join(lines[0] + lines[1]) + "".join(outputs)
    finally:
        for host in hosts:
            if host.poll() is None:
                host.kill()
                host.wait()


def test_a_run_beyond_loopback_without_tls_says_so(capsys):
    multihost._use_tls(None, ["m0", "m1"], 0)
    multihost._use_tls(None, ["127.0.0.1", "127.0.0.1"], 0)
    out = capsys.readouterr().out
    assert out.count("without TLS") == 1 and "python -m jaxdist.tools.certs DIR --hosts m0,m1" in out


@pytest.mark.slow
def test_hosts_given_different_tokens_refuse_each_other_and_both_stop_naming_the_fix(tmp_path):
    base = reserve_base_port()
    marker = f"tokens-{base}"
    hosts = [subprocess.Popen(script(index, base, str(tmp_path / f"h{index}"), "--mode", "idle"),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              env=dict(host_env(token), JAXDIST_TEST_MARKER=marker))
             for index, token in ((0, "token-of-host-0"), (1, "token-of-host-1"))]
    try:
        outputs = [host.communicate(timeout=120)[0] for host in hosts]
    finally:
        for host in hosts:
            if host.poll() is None:
                host.kill()
                host.wait()
    for index, (host, out) in enumerate(zip(hosts, outputs)):
        assert host.returncode != 0, out
        assert f"HostMismatchError: host {1 - index} at 127.0.0.1:" in out, out
        assert f"refused the courier token of host {index}: every host of a multi-host run needs the same token" \
            in out, out
    wait_until(lambda: not processes_with_marker(marker), "both hosts' nodes to exit")


@pytest.mark.slow
def test_when_one_hosts_launcher_dies_the_other_host_stops_naming_it_and_no_node_is_left(tmp_path):
    """The peer-loss watch, exercised: host 0 was up (host 1 has been told so), then its launcher
    dies. Host 1's wait for a peer never seen is beyond the test's time, so only the watch of a
    peer that went silent can stop it, naming host 0."""
    base = reserve_base_port()
    marker = f"dying-host-{base}"
    env = dict(host_env(), JAXDIST_TEST_MARKER=marker, JAXDIST_PEER_START_TIMEOUT="600")
    controls = json.loads(subprocess.run(script(0, base, str(tmp_path), "--print-plan"), capture_output=True,
                                         text=True, check=True, timeout=60, env=env).stdout)["controls"]
    hosts = [subprocess.Popen(script(index, base, str(tmp_path / f"h{index}"), "--mode", "idle"),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
             for index in (0, 1)]
    lines1: list[str] = []
    try:
        read_pids(hosts[0], [])
        read_pids(hosts[1], lines1)
        with courier.Client(controls[1], token=host_env()["JAXDIST_TOKEN"], timeout=30) as host1:
            host1.ping(0)  # host 0's hello, said for it at once: host 1 has now certainly seen host 0 up
        hosts[0].kill()  # the launcher alone: its nodes are orphaned
        hosts[0].wait()
        out1 = "".join(lines1) + hosts[1].communicate(timeout=90)[0]
    finally:
        for host in hosts:
            if host.poll() is None:
                host.kill()
                host.wait()
    assert hosts[1].returncode != 0, out1
    assert (f"HostLostError: host 0 at {controls[0]} stopped answering without finishing or stopping the "
            f"program") in out1, out1
    wait_until(lambda: not processes_with_marker(marker), "both hosts' nodes to exit")
