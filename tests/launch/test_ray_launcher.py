"""The ray launcher on a real local Ray cluster of two nodes (`ray.cluster_utils.Cluster`, both on
this machine), started once for the module: the two-phase start, jd.stop(), placement, restarts
by the program's policy, scaling, and a stop that leaves no actor behind. Every Ray test is here,
so that a test run starts one cluster (a start costs 7-30 s here)."""

from __future__ import annotations

import importlib
import json
import os
import signal
import subprocess
import sys

import numpy as np
import psutil
import pytest

import jaxdist as jd
import launch_nodes as nodes
import learner_nodes as ln
import ray_nodes
from ray_cluster import cluster, live_actors  # noqa: F401 - cluster is a fixture
from jaxdist import courier
from jaxdist.learning.layout import checkpoint_dir
from jaxdist.courier import tls
from jaxdist.nodes.learner import Learner, PublishOptions
from jaxdist.nodes.replay import Fifo, ReplayClient, ReplayNode
from jaxdist.launch.running import WORK_DONE
from jaxdist.agents import load_policy
from jaxdist.records.metrics import read_metrics
from run_checks import check_solved_and_final_policy_evaluated
from waiting import wait_until

pytestmark = pytest.mark.slow

ray = pytest.importorskip("ray", reason="launcher='ray' needs Ray: pip install -e '.[ray]' in the jaxdist clone")

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXPERIMENTS = os.path.join(REPO, "experiments")


def example(name: str):
    """One of experiments/' paper examples, imported by name: the actors find it on the sys.path
    the launcher hands them, as spawned node processes do."""
    if EXPERIMENTS not in sys.path:
        sys.path.insert(0, EXPERIMENTS)
    return importlib.import_module(name)


def test_a_paper_example_runs_as_ray_actors_and_its_stop_leaves_none(cluster, tmp_path):
    """ES with futures: five nodes calling each other as Ray actors, ended by jd.stop() in one of
    them. (Every paper example runs on threads and processes in test_launchers.py; the programs
    are the same under Ray, and one shows the launcher's part.)"""
    module = example("es_futures")
    running = jd.launch(module.make_program(4, 20, 100, 8), launcher="ray", run_dir=str(tmp_path), echo=False)
    assert running.wait(timeout=120)
    assert running.stop_reason.startswith("jd.stop() was called in node")
    assert "final fitness -0.0" in (tmp_path / "logs" / "learner-0.log").read_text()
    assert {status["state"] for status in running.status().values()} <= {"finished", "stopped"}
    wait_until(lambda: not live_actors(), "every unit actor dead", timeout=30)


def test_the_program_ends_once_its_nodes_with_work_finish_and_its_services_are_stopped(cluster, tmp_path):
    program = jd.Program("work")
    with program.group("counter"):
        counters = [program.add_node(jd.CourierNode(nodes.Counter)) for _ in range(2)]
    with program.group("caller"):
        for counter in counters:
            program.add_node(jd.PyNode(nodes.call_counter, counter, 3))
    running = jd.launch(program, launcher="ray", run_dir=str(tmp_path), echo=False)
    assert running.wait(timeout=120)
    assert running.stop_reason == WORK_DONE
    statuses = running.status()
    assert [statuses[f"caller/{index}"]["state"] for index in range(2)] == ["finished"] * 2
    assert [statuses[f"counter/{index}"]["state"] for index in range(2)] == ["stopped"] * 2
    for index in range(2):
        assert "counter at 4" in (tmp_path / "logs" / f"caller-{index}.log").read_text()


def test_a_failing_node_is_reported_with_its_name_and_traceback(cluster, tmp_path):
    program = jd.Program("failing")
    with program.group("service"):
        program.add_node(jd.CourierNode(nodes.Counter))
    with program.group("bad"):
        program.add_node(jd.CourierNode(nodes.Failing))
    running = jd.launch(program, launcher="ray", run_dir=str(tmp_path), echo=False)
    with pytest.raises(jd.NodeFailedError, match="node 'bad/0' failed") as raised:
        running.wait(timeout=60)
    assert "ValueError: deliberate failure in run" in raised.value.details
    assert running.status()["service/0"]["state"] == "stopped"
    wait_until(lambda: not live_actors(), "every unit actor dead", timeout=30)


def test_jd_stop_in_a_node_stops_the_program_and_its_callers_reach_its_server(cluster, tmp_path):
    program = jd.Program("stops")
    with program.group("counter"):
        counter = program.add_node(jd.CourierNode(nodes.Counter))
    with program.group("stopper"):
        program.add_node(jd.PyNode(nodes.stop_after, 0.5))
    running = jd.launch(program, launcher="ray", run_dir=str(tmp_path), echo=False, bind_host="node")
    assert running.addresses[counter.node_name].startswith(ray.util.get_node_ip_address() + ":")  # the Ray node's IP
    assert running.client(counter, timeout=30).increment() == 1  # from outside, with the launch's token
    assert running.wait(timeout=60)
    assert "jd.stop() was called in node 'stopper/0'" in running.stop_reason
    wait_until(lambda: not live_actors(), "every unit actor dead", timeout=30)


def ray_node_of(pid: int) -> str:
    """The Ray node whose actor is the parent of the node process `pid`."""
    from ray._private import state

    actor_pid = psutil.Process(pid).ppid()
    return next(actor["Address"]["NodeID"] for actor in state.actors().values()
                if actor["Pid"] == actor_pid and actor["State"] == "ALIVE")


def test_placement_puts_groups_on_hosts_and_a_per_host_group_joins_jax_distributed(cluster, tmp_path):
    program = jd.Program("placed")
    groups = {"learner": 2, "actor": 4, "replay": 1}
    handles = {}
    for label, count in groups.items():
        with program.group(label):
            handles[label] = [program.add_node(jd.CourierNode(ray_nodes.Reporter)) for _ in range(count)]
    placement = {"learner": jd.per_host(), "actor": jd.spread(), "replay": jd.on_host(1)}
    running = jd.launch(program, launcher="ray", run_dir=str(tmp_path), echo=False, placement=placement)
    try:
        clients = {label: [running.client(handle, timeout=30) for handle in members]
                   for label, members in handles.items()}
        host = {label: [ray_node_of(client.pid()) for client in members] for label, members in clients.items()}
        assert host["learner"][0] != host["learner"][1]  # STRICT_SPREAD: a host is a Ray node
        assert host["actor"] == [host["learner"][0], host["learner"][1]] * 2
        assert host["replay"] == [host["learner"][1]]
        learners = clients["learner"]
        assert [client.env("JAXDIST_PROCESS_ID") for client in learners] == ["0", "1"]
        assert {client.env("JAXDIST_NUM_PROCESSES") for client in learners} == {"2"}
        coordinator = learners[0].env("JAXDIST_COORDINATOR_ADDRESS")
        assert coordinator == learners[1].env("JAXDIST_COORDINATOR_ADDRESS") and coordinator.startswith("127.0.0.1:")
        assert clients["actor"][0].env("JAXDIST_PROCESS_ID") is None  # actors stay out of the group
    finally:
        running.stop()
    wait_until(lambda: not live_actors(), "every unit actor dead", timeout=30)


def test_resources_are_ray_resources_and_an_impossible_request_says_what_the_cluster_has(cluster, tmp_path):
    program = jd.Program("resources")
    with program.group("second"):
        second = program.add_node(jd.CourierNode(ray_nodes.Reporter))
    with program.group("head"):
        head = program.add_node(jd.CourierNode(ray_nodes.Reporter))
    running = jd.launch(program, launcher="ray", run_dir=str(tmp_path), echo=False, resources={
        "second": {"resources": {"second": 0.5}, "env": {"WHERE": "second"}},
        "head": {"resources": {"head": 0.5}, "num_cpus": 1}})
    try:
        nodes_by_resource = {resource: node["NodeID"] for node in ray.nodes() for resource in ("head", "second")
                             if resource in node["Resources"]}
        assert ray_node_of(running.client(second, timeout=30).pid()) == nodes_by_resource["second"]
        assert ray_node_of(running.client(head, timeout=30).pid()) == nodes_by_resource["head"]
        assert running.client(second).env("WHERE") == "second"
    finally:
        running.stop()
    with pytest.raises(RuntimeError, match="could not place"):
        jd.launch(program, launcher="ray", run_dir=str(tmp_path), echo=False, start_timeout=3,
                  resources={"head": {"num_gpus": 1}})
    with pytest.raises(ValueError, match="unknown keys"):
        jd.launch(program, launcher="ray", run_dir=str(tmp_path), resources={"head": {"num_cpu": 1}})


@pytest.mark.timeout(600)  # 230-320 s with both cores kept busy by burners
def test_a_sigkilled_learner_and_replay_come_back_from_their_checkpoints_on_their_addresses(cluster, tmp_path):
    program = jd.Program("learn")
    with program.group("learner"):
        program.add_node(jd.CourierNode(Learner, ln.LOGIC, ln.RegressionBatches(limit=27),
                                        publishing=PublishOptions(log_every=1),
                                        checkpointing=jd.CheckpointOptions(save_every_steps=10)))
    with program.group("replay"):
        program.add_node(ReplayNode(Fifo(16), checkpoint=True))
    # No restart=: learners and replay come back by their node type's policy.
    running = jd.launch(program, launcher="ray", run_dir=str(tmp_path), echo=False,
                        resources={"learner": {"env": {"JAX_PLATFORMS": "cpu"}}})
    try:
        addresses = dict(running.addresses)
        learner, replay = running.client("learner/0", timeout=60), ReplayClient(running.client("replay/0", timeout=60))
        replay.insert_many([{"x": np.full(2, seq)} for seq in range(3)])
        step = replay.checkpoint()
        replay.insert({"x": np.full(2, 3)})  # after the checkpoint: dies with the node
        wait_until(lambda: learner.status()["step"] == 27, "step 27", timeout=120)
        wait_until(lambda: saved_steps(tmp_path) == [10, 20], "checkpoint 20 committed")
        for name in ("learner/0", "replay/0"):
            os.kill(running.status()[name]["pid"], signal.SIGKILL)
            wait_until(lambda: running.status()[name]["restarts"] == 1, f"{name}'s restart")
            wait_until(lambda: running.status()[name]["state"] == "running", f"{name} to run again")
            assert "killed by SIGKILL" in running.status()[name]["last_restart_cause"]
        assert running.addresses == addresses
        assert wait_until(lambda: learner.status(), "the restarted learner answering")["restored_step"] == 20
        wait_until(lambda: learner.status()["step"] == 27, "step 27 again")
        assert replay.size() == 3 and replay.sample(3, timeout=10)["data"]["x"][:, 0].tolist() == [0, 1, 2]
    finally:
        running.stop()
    assert f"restored checkpoint step {step}" in (tmp_path / "logs" / "replay-0.log").read_text()
    wait_until(lambda: not live_actors(), "every unit actor dead", timeout=30)


def saved_steps(run_dir) -> list[int]:
    directory = checkpoint_dir(str(run_dir), "learner/0")
    return sorted(int(name) for name in os.listdir(directory) if name.isdigit()) if os.path.isdir(directory) else []


def solve_cartpole_with_ppo(cluster, run_dir, *flags: str) -> None:
    """experiments/ppo.py --launcher ray on the cluster, to an evaluation return of 475."""
    done = subprocess.run(
        [sys.executable, os.path.join(EXPERIMENTS, "ppo.py"), "--launcher", "ray", "--ray-address", cluster.address,
         *flags, "--quiet", "--compilation-cache", "", "--run-dir", str(run_dir), "--stop-at-target"],
        capture_output=True, text=True, timeout=400, env=dict(os.environ, PYTHONPATH=os.path.join(REPO, "tests", "support")))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "reached evaluation return 475" in done.stdout, done.stdout
    wait_until(lambda: not live_actors(), "every unit actor dead", timeout=30)


@pytest.mark.timeout(600)  # 230-320 s with both cores kept busy by burners
def test_a_sebulba_sweep_trains_its_configurations_side_by_side_on_the_cluster_and_ranks_them(cluster, tmp_path):
    done = subprocess.run(
        [sys.executable, os.path.join(EXPERIMENTS, "ppo.py"), "--launcher", "ray", "--ray-address", cluster.address,
         "--quiet", "--compilation-cache", "", "--run-dir", str(tmp_path), "--num-actors", "1", "--envs-per-actor",
         "8", "--total-steps", str(8 * 32 * 10), "--eval-every-updates", "5", "--log-every-updates", "1",
         "--sweep", "learning_rate=1e-3,3e-3"],
        capture_output=True, text=True, timeout=400,
        env=dict(os.environ, PYTHONPATH=os.pathsep.join([REPO, os.path.join(REPO, "tests", "support")])))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "2 configurations x 1 seed(s)" in done.stdout, done.stdout
    assert sorted(row["config_index"] for row in read_metrics(tmp_path / "sweep.csv")) == [0, 1]
    # One program of both runs, each in its configuration's directory, ended once both were done.
    assert "every run's final policy (version 10) was evaluated (node 'sweep/0')" in done.stdout, done.stdout
    assert {"learner-0.log", "learner-1.log", "actor-0.log", "actor-1.log"} <= set(os.listdir(tmp_path / "logs"))
    policies = [load_policy(str(tmp_path), config_index=index) for index in (0, 1)]
    assert [policy.step for policy in policies] == [10, 10] and policies[1].config.learning_rate == 3e-3
    wait_until(lambda: not live_actors(), "every unit actor dead", timeout=30)


def service_and_other(name: str):
    """A program of two counters, groups "service" and "other", and the service's handle."""
    program = jd.Program(name)
    with program.group("service"):
        service = program.add_node(jd.CourierNode(nodes.Counter))
    with program.group("other"):
        program.add_node(jd.CourierNode(nodes.Counter))
    return program, service


def test_a_units_actor_that_dies_fails_the_program_naming_it_and_its_node_process_follows(cluster, tmp_path):
    program, service = service_and_other("lost")
    running = jd.launch(program, launcher="ray", run_dir=str(tmp_path), echo=False)
    node_process = psutil.Process(running.client(service, timeout=30).pid())
    os.kill(node_process.ppid(), signal.SIGKILL)  # the unit's actor, as when its Ray node is lost
    with pytest.raises(jd.NodeFailedError, match="node 'service/0' failed") as raised:
        running.wait(timeout=60)
    assert "its Ray actor died" in raised.value.details
    node_process.wait(timeout=30)  # the node's process, its supervisor gone, stops by itself
    wait_until(lambda: not live_actors(), "every unit actor dead", timeout=30)


def test_the_stop_stops_nodes_that_stop_first_while_the_others_still_serve(cluster, tmp_path):
    program = jd.Program("phased-stop")
    with program.group("counter"):
        counter = program.add_node(jd.CourierNode(nodes.Counter))
    report = tmp_path / "calls-after-stop"
    with program.group("learner"):
        program.add_node(jd.CourierNode(nodes.FinishesWithItsPeer, counter, str(report), 1.0))
    running = jd.launch(program, launcher="ray", run_dir=str(tmp_path / "run"), echo=False, interrupt_after=0.2)
    wait_until(lambda: report.exists() and report.read_text() == "running", "the learner running")
    running.stop()
    # The learner called the counter for a second after the stop, uninterrupted, before the
    # counter was told to stop.
    assert float(report.read_text()) >= 1.0
    assert {status["state"] for status in running.status().values()} == {"stopped"}
    wait_until(lambda: not live_actors(), "every unit actor dead", timeout=30)


def test_a_threads_colocation_is_one_actor_and_a_processes_colocation_one_bundle(cluster, tmp_path):
    program = jd.Program("colocated")
    with program.group("threads"):
        in_threads = program.add_node(jd.ColocationNode([
            jd.CourierNode(ray_nodes.Reporter), jd.CourierNode(ray_nodes.Reporter)], mode="threads"))
    with program.group("processes"):
        in_processes = program.add_node(jd.ColocationNode([
            jd.CourierNode(ray_nodes.Reporter), jd.CourierNode(ray_nodes.Reporter)], mode="processes"))
    running = jd.launch(program, launcher="ray", run_dir=str(tmp_path), echo=False)
    try:
        threads_pids = [running.client(handle, timeout=30).pid() for handle in in_threads]
        processes_pids = [running.client(handle, timeout=30).pid() for handle in in_processes]
        assert threads_pids[0] == threads_pids[1]  # one process, one actor
        assert processes_pids[0] != processes_pids[1]
        assert ray_node_of(processes_pids[0]) == ray_node_of(processes_pids[1])  # one bundle: one Ray node
        assert sorted(running.status()) == ["processes/0/0", "processes/0/1", "threads/0"]
    finally:
        running.stop()
    wait_until(lambda: not live_actors(), "every unit actor dead", timeout=30)


def test_sigterm_to_the_script_is_the_ordered_stop_and_it_exits_0(cluster, tmp_path):
    script = subprocess.Popen(
        [sys.executable, os.path.join(REPO, "tests", "support", "ray_script.py"), cluster.address, str(tmp_path)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=dict(os.environ, PYTHONPATH=os.path.join(REPO, "tests", "support")))
    try:
        assert script.stdout.readline() == "running\n"
        script.send_signal(signal.SIGTERM)
        out, err = script.communicate(timeout=60)
    finally:
        script.kill()
    assert script.returncode == 0, err
    assert "stopped: the launcher got SIGTERM" in out
    wait_until(lambda: not live_actors(), "every unit actor dead", timeout=30)


def test_a_units_actor_that_dies_comes_back_by_its_restart_policy_on_its_addresses(cluster, tmp_path):
    program, service = service_and_other("actor-restarts")
    running = jd.launch(program, launcher="ray", run_dir=str(tmp_path), echo=False,
                        restart={"service": jd.Restart(max_restarts=1, backoff=0.1)})
    addresses = dict(running.addresses)
    client = running.client(service, timeout=60)
    assert client.increment() == 1
    os.kill(psutil.Process(client.pid()).ppid(), signal.SIGKILL)  # the unit's actor
    wait_until(lambda: running.status()["service/0"]["restarts"] == 1, "the actor's restart")
    wait_until(lambda: running.status()["service/0"]["state"] == "running", "the unit running again")
    assert "its Ray actor died" in running.status()["service/0"]["last_restart_cause"]
    assert running.addresses == addresses
    assert client.increment() == 1  # a new process, reached by the client made before, on the same address
    os.kill(psutil.Process(client.pid()).ppid(), signal.SIGKILL)  # past the policy: the program fails
    with pytest.raises(jd.NodeFailedError, match="more than its restart limit allows"):
        running.wait(timeout=60)
    wait_until(lambda: not live_actors(), "every unit actor dead", timeout=30)


def test_with_tls_dir_nodes_talk_mutual_tls_and_refuse_plaintext(cluster, tmp_path, monkeypatch):
    node_ip = ray.util.get_node_ip_address()
    tls_dir = str(tmp_path / "certs")
    subprocess.run([sys.executable, "-m", "jaxdist.tools.certs", tls_dir, "--hosts", node_ip], check=True, timeout=60,
                   capture_output=True)
    for variable in (tls.TLS_DIR_ENV, tls.TLS_NAME_ENV):  # the launcher sets them here, for its own clients
        monkeypatch.setenv(variable, "")
    program = jd.Program("tls")
    with program.group("counter"):
        counter = program.add_node(jd.CourierNode(nodes.Counter))
    with program.group("caller"):
        program.add_node(jd.PyNode(nodes.call_counter, counter, 3))
    with program.group("waiter"):  # keeps the program up once the caller is done
        program.add_node(jd.CourierNode(nodes.UntilStopped))
    running = jd.launch(program, launcher="ray", run_dir=str(tmp_path / "run"), echo=False, bind_host="node",
                        tls_dir=tls_dir)
    try:
        assert running.addresses[counter.node_name].startswith(node_ip + ":")
        wait_until(lambda: running.status()["caller/0"]["state"] == "finished", "the caller's calls over TLS")
        assert running.client(counter, timeout=30).increment() == 5  # this process's client: TLS too
        address = running.addresses[counter.node_name]
        monkeypatch.setenv(tls.TLS_DIR_ENV, "")  # a client without credentials
        with courier.Client(address, token=running.token, timeout=3, wait_for_ready=False) as plain:
            with pytest.raises(courier.UnavailableError):
                plain.increment()
    finally:
        running.stop()
    assert "counter at 4" in (tmp_path / "run" / "logs" / "caller-0.log").read_text()


@pytest.mark.timeout(600)  # 230-320 s with both cores kept busy by burners
def test_ppo_solves_cartpole_with_launcher_ray_through_its_script(cluster, tmp_path):
    solve_cartpole_with_ppo(cluster, tmp_path)
    summary = check_solved_and_final_policy_evaluated(tmp_path)
    assert summary["stop_reason"] == (f"training is over: its final policy, version {summary['learner_version']}, "
                                      f"was evaluated (node 'learner/0/2')")  # the colocated evaluator


@pytest.mark.timeout(600)  # 230-320 s with both cores kept busy by burners
def test_a_ppo_learner_spanning_two_ray_nodes_is_one_jax_distributed_learner_that_trains_to_its_last_update(cluster, tmp_path):
    """Learning itself is the single-node script's test above; here the two learner processes,
    one on each Ray node, form one gloo group and train together to the run's final update,
    which the evaluator scores before the program ends."""
    done = subprocess.run(
        [sys.executable, os.path.join(EXPERIMENTS, "ppo.py"), "--launcher", "ray", "--ray-address", cluster.address,
         "--learner-hosts", "2", "--num-actors", "2", "--envs-per-actor", "8", "--total-steps", str(2 * 8 * 32 * 12),
         "--eval-every-updates", "5", "--quiet", "--compilation-cache", "", "--run-dir", str(tmp_path)],
        capture_output=True, text=True, timeout=400, env=dict(os.environ, PYTHONPATH=os.path.join(REPO, "tests", "support")))
    assert done.returncode == 0, done.stdout + done.stderr
    second = (tmp_path / "logs" / "learner-1.log").read_text()
    assert "Rank 1 is connected to 1 peer ranks" in second  # the two learner processes' gloo group
    assert "fresh start on 2 cpu device(s)" in second  # one device per process, two in the group
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["learner_version"] == 12 and summary["final_return_version"] == 12, summary
    wait_until(lambda: not live_actors(), "every unit actor dead", timeout=30)


# running.scale under ray (its other launchers: test_scale.py) -------------------------------------


def test_under_ray_a_group_grows_with_new_actors_and_shrinks_leaving_none_behind(cluster, tmp_path):
    with jd.launch(nodes.scalable_program(), launcher="ray", run_dir=str(tmp_path), echo=False, grace=3.0) as running:
        assert len(live_actors()) == 3
        assert running.scale("worker", 4) == ["worker/2", "worker/3"]
        assert [running.client(name).index() for name in running.members("worker")] == [0, 1, 2, 3]
        assert {running.status()[name]["state"] for name in running.members("worker")} == {"running"}
        assert len(live_actors()) == 5
        assert running.scale("worker", 1) == ["worker/3", "worker/2", "worker/1"]
        assert running.members("worker") == ["worker/0"] and "worker/2" not in running.status()
        assert len(live_actors()) == 2 and running.client("worker/0").index() == 0
    assert not live_actors()


def test_under_ray_with_placement_a_group_grows_on_its_hosts_bundles_unless_it_cannot(cluster, tmp_path):
    program = nodes.scalable_program()
    program.add_group("learner", nodes.indexed_node, 2)
    program.add_group("heavy", nodes.indexed_node, 1)
    with jd.launch(program, launcher="ray", run_dir=str(tmp_path), echo=False, grace=3.0, distributed=None,
                   resources={"heavy": {"num_cpus": 0.5}},
                   placement={"worker": jd.spread(), "learner": jd.per_host(), "heavy": jd.on_host(1)}) as running:
        assert running.scale("worker", 3) == ["worker/2"] and running.client("worker/2").index() == 2
        with pytest.raises(ValueError, match=r"group 'learner' is placed per_host\(\)"):
            running.scale("learner", 3)
        with pytest.raises(ValueError, match=r"group 'heavy' asks Ray for \{'CPU': 0.5\} a node"):
            running.scale("heavy", 2)
        assert running.scale("worker", 0) == ["worker/2", "worker/1", "worker/0"]
        assert running.members("worker") == []



def cpus_free_in_the_placement_group() -> float:
    """CPUs the launch's placement group (the one placed now) still holds free: Ray names them
    CPU_group_<its id>, apart from the cluster's free CPUs."""
    (group,) = [group for group, info in ray.util.placement_group_table().items() if info["state"] == "CREATED"]
    return ray.available_resources().get(f"CPU_group_{group}", 0.0)


def test_under_ray_without_placement_new_actors_join_the_placement_group_and_say_when_it_has_no_room(cluster, tmp_path):
    program = nodes.scalable_program()
    with jd.launch(program, launcher="ray", run_dir=str(tmp_path), echo=False, grace=3.0,
                   resources={"worker": {"num_cpus": 1}}) as running:
        # Two CPUs of the cluster's four are reserved for the two workers: a third finds no room.
        with pytest.raises(ValueError, match=r"group 'worker' cannot grow to worker/2: a node of it asks Ray for "
                                             r"\{'CPU': 1\}, and no bundle of the launch's placement group has that "
                                             r"free .* Launch the group at its largest size and scale it down"):
            running.scale("worker", 3)
        assert running.members("worker") == ["worker/0", "worker/1"] and len(program.groups["worker"]) == 2
        assert running.scale("worker", 1) == ["worker/1"]
        wait_until(lambda: cpus_free_in_the_placement_group() >= 1, "the removed worker's CPU free in its bundle")
        assert running.scale("worker", 2) == ["worker/1"] and running.client("worker/1").index() == 1
        wait_until(lambda: cpus_free_in_the_placement_group() < 1, "the new worker to take its CPU in the group")
