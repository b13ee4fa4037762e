"""`running.scale(group, n)`: a group made by `Program.add_group` grows and shrinks while the
program runs, under processes and multihost (this host's share, and what the other hosts add and
remove); bad requests say what is wrong. The ray launcher's scaling is tested with its cluster in
test_ray_launcher.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import psutil
import pytest

import jaxdist as jd
import launch_nodes as nodes
from ports import reserve_base_port
from waiting import wait_until

SCALING_HOST = os.path.join(os.path.dirname(os.path.dirname(__file__)), "support", "scaling_host.py")


def launch(program: jd.Program, tmp_path, launcher: str = "processes", **options) -> jd.Running:
    return jd.launch(program, launcher=launcher, run_dir=str(tmp_path), echo=False, grace=3.0, **options)


def test_a_group_grows_with_nodes_made_for_their_index_and_shrinks_from_its_highest(tmp_path):
    with launch(nodes.scalable_program(), tmp_path) as running:
        assert running.scale("worker", 4) == ["worker/2", "worker/3"]
        status = running.status()
        assert {status[name]["state"] for name in running.members("worker")} == {"running"}
        assert running.members("worker") == ["worker/0", "worker/1", "worker/2", "worker/3"]
        assert [running.client(name).index() for name in running.members("worker")] == [0, 1, 2, 3]
        pids = {name: status[name]["pid"] for name in running.members("worker")}

        assert running.scale("worker", 1) == ["worker/3", "worker/2", "worker/1"]
        assert running.members("worker") == ["worker/0"] and "worker/1" not in running.status()
        assert "worker/1" not in running.addresses
        assert not any(psutil.pid_exists(pids[f"worker/{index}"]) for index in (1, 2, 3))
        assert running.client("worker/0").index() == 0  # the rest of the program never stopped
        assert running.client("counter/0").increment() == 1 and running.stop_reason == ""

        assert running.scale("worker", 2) == ["worker/1"]  # names continue the group again
        assert running.client("worker/1").index() == 1
    assert running.stop_reason == "stopped by the user"


def test_the_launching_process_holds_no_descriptor_of_a_removed_node(tmp_path):
    """A removed node's pipes (its output, its control) close with it: the launching process's
    descriptors come back to where they were after every grow-and-shrink cycle."""
    def open_fds() -> int:
        return len(os.listdir("/proc/self/fd"))

    with launch(nodes.scalable_program(workers=1), tmp_path) as running:
        running.scale("worker", 2)
        running.scale("worker", 1)  # the first cycle opens what the launcher keeps for good
        before = open_fds()
        for _ in range(4):
            running.scale("worker", 2)
            with running.client("worker/1") as client:
                assert client.index() == 1
            running.scale("worker", 1)
        wait_until(lambda: open_fds() <= before, f"the launcher's descriptors back to {before} (now {open_fds()})",
                   timeout=10)


def test_bad_scale_requests_say_what_is_wrong(tmp_path):
    program = nodes.scalable_program()
    # A factory whose later nodes cannot reach a process: the group stays as it was.
    program.add_group("unshippable", lambda index: jd.CourierNode(nodes.Indexed, index if index < 1 else lambda: index), 1)
    with launch(program, tmp_path) as running:
        with pytest.raises(TypeError, match=r"node 'unshippable/1': args\[0\] .* cannot be sent to a process"):
            running.scale("unshippable", 2)
        assert len(program.groups["unshippable"]) == 1 and running.members("unshippable") == ["unshippable/0"]
        with pytest.raises(ValueError, match="no group 'actor'; groups: counter, unshippable, worker"):
            running.scale("actor", 3)
        with pytest.raises(ValueError, match=r"n is the group's new number of nodes, an int >= 0"):
            running.scale("worker", -1)
        with pytest.raises(ValueError, match=r"group 'counter' cannot scale: .*program.add_group.*scale: unshippable, worker\)"):
            running.scale("counter", 2)
        assert running.members("worker") == ["worker/0", "worker/1"]
    with pytest.raises(RuntimeError, match="is stopping"):
        running.scale("worker", 3)


def test_threads_say_they_cannot_scale(tmp_path):
    with launch(nodes.scalable_program(), tmp_path, launcher="threads") as running:
        with pytest.raises(NotImplementedError, match="one node cannot be stopped alone; launch with 'processes'"):
            running.scale("worker", 3)


def test_under_multihost_a_host_starts_its_share_of_a_spread_group_and_a_per_host_group_cannot_scale(tmp_path):
    program = nodes.scalable_program()
    program.add_group("learner", nodes.indexed_node, 2)  # made from a factory, but one per host
    # Host 0 of two; host 1 never comes: this host's share runs alone.
    with launch(program, tmp_path, "multihost", hosts="127.0.0.1,127.0.0.1", host_index=0, token="shared",
                base_port=reserve_base_port(), distributed=None,
                placement={"worker": jd.spread(), "learner": jd.per_host()}) as running:
        assert sorted(running.status()) == ["counter/0", "learner/0", "worker/0"]
        assert running.scale("worker", 5) == ["worker/2", "worker/3", "worker/4"]
        assert sorted(running.status()) == ["counter/0", "learner/0", "worker/0", "worker/2", "worker/4"]
        assert running.client("worker/4").index() == 4
        assert running.scale("worker", 3) == ["worker/4", "worker/3"]
        assert sorted(running.status()) == ["counter/0", "learner/0", "worker/0", "worker/2"]
        assert "worker/3" not in running.members("worker")  # another host's, gone from the table too
        assert running.scale("worker", 1) == ["worker/2", "worker/1"]
        assert running.scale("worker", 2) == ["worker/1"]  # host 1's again: nothing starts here
        assert running.scale("worker", 3) == ["worker/2"] and running.client("worker/2").index() == 2
        running.scale("worker", 0)
        assert running.scale("worker", 1) == ["worker/0"]  # placed at launch, now bound anew
        assert running.client("worker/0").index() == 0
        with pytest.raises(ValueError, match=r"group 'learner' is placed per_host\(\): .* cannot grow or shrink"):
            running.scale("learner", 3)


@pytest.mark.slow
def test_under_multihost_host_0_follows_the_nodes_another_host_adds_and_removes(tmp_path):
    base = reserve_base_port()
    host1 = subprocess.Popen([sys.executable, SCALING_HOST, "--hosts", "127.0.0.1,127.0.0.1", "--host-index", "1",
                              "--base-port", str(base), "--run-dir", str(tmp_path / "h1")],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    def scale_host1(n: int) -> list[str]:
        host1.stdin.write(f"{n}\n")
        host1.stdin.flush()
        while not (line := host1.stdout.readline()).startswith("scaled "):
            assert line, "host 1 ended before it scaled"
        return json.loads(line.removeprefix("scaled "))

    try:
        with launch(nodes.scalable_program(), tmp_path / "h0", "multihost", hosts="127.0.0.1,127.0.0.1", host_index=0,
                    token="shared", base_port=base, distributed=None, placement={"worker": jd.spread()}) as running:
            # Host 1 grows first: host 0 learns where its new node serves, before growing itself.
            assert scale_host1(4) == ["worker/2", "worker/3"]
            wait_until(lambda: running.members("worker") == ["worker/0", "worker/1", "worker/3"],
                       "host 0 to follow the node host 1 added", timeout=20)
            assert running.scale("worker", 4) == ["worker/2", "worker/3"]
            assert [running.client(name, timeout=20).index() for name in running.members("worker")] == [0, 1, 2, 3]
            # Host 1 shrinks first: host 0 stops following host 1's removed nodes (the one placed at launch too).
            assert scale_host1(1) == ["worker/3", "worker/2", "worker/1"]
            wait_until(lambda: running.members("worker") == ["worker/0", "worker/2"],
                       "host 0 to drop the nodes host 1 removed", timeout=20)
            assert running.scale("worker", 1) == ["worker/3", "worker/2", "worker/1"]
            assert running.members("worker") == ["worker/0"]
        host1.stdin.close()
        assert host1.wait(timeout=60) == 0
    finally:
        if host1.poll() is None:
            host1.kill()
