"""Node processes forked from the preloaded forkserver: they have the environment, JAX
configuration and streams a spawned process would have, and the forkserver is never mistaken
for its nodes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import psutil

import jaxdist as jd
import launch_nodes as nodes

SUPPORT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "support")


def launch_reporter(run_dir: str, env: dict[str, str]) -> jd.Running:
    program = jd.Program("jax-report")
    with program.group("reporter"):
        program.add_node(jd.CourierNode(nodes.JaxReport))
    return jd.launch(program, launcher="processes", run_dir=run_dir, echo=False, resources={"reporter": {"env": env}})


def test_a_node_process_reads_the_environment_of_its_launch_not_the_one_its_forkserver_started_with(
        tmp_path, monkeypatch):
    with launch_reporter(str(tmp_path / "first"), {}) as running:  # the forkserver runs from here on
        assert running.client("reporter/0").report()["x64"] is False
    monkeypatch.setenv("JAX_ENABLE_X64", "true")
    monkeypatch.setenv("JAXDIST_LATE", "set after the forkserver started")
    env = {"JAX_DEFAULT_MATMUL_PRECISION": "highest", "XLA_FLAGS": "--xla_force_host_platform_device_count=3"}
    with launch_reporter(str(tmp_path / "second"), env) as running:
        assert running.client("reporter/0").report() == {
            "x64": True, "precision": "highest", "devices": 3, "late": "set after the forkserver started"}


def test_the_launcher_that_starts_the_forkserver_keeps_its_jax_variables_and_its_nodes_read_them(tmp_path):
    script = (
        "import json, os, sys; sys.path.insert(0, %r)\n"
        "import jaxdist as jd, launch_nodes as nodes\n"
        "if __name__ == '__main__':\n"
        "    p = jd.Program('first'); p.add_node(jd.CourierNode(nodes.JaxReport), label='reporter')\n"
        "    with jd.launch(p, launcher='processes', run_dir=%r, echo=False) as running:\n"
        "        print(json.dumps([running.client('reporter/0').report(), os.environ.get('JAX_ENABLE_X64')]))\n"
    ) % (SUPPORT, str(tmp_path))
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, JAX_ENABLE_X64="1"))
    assert done.returncode == 0, done.stderr
    report, kept = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["x64"] is True and kept == "1"


def test_a_sigterm_to_the_forkserver_leaves_the_program_running(tmp_path):
    """Every node process is the forkserver's child and learns of its exit through it: had a
    SIGTERM to every process of the job (a cluster's cancel) ended it, the launcher would have
    taken every node for dead while they ran on."""
    program = jd.Program("forkserver-sigterm")
    program.add_node(jd.CourierNode(nodes.Counter), label="counter")
    with jd.launch(program, launcher="processes", run_dir=str(tmp_path), echo=False) as running:
        counter = running.client("counter/0")
        forkserver = psutil.Process(counter.pid()).parent()
        assert forkserver.pid != os.getpid()
        forkserver.send_signal(signal.SIGTERM)
        time.sleep(1.0)
        assert forkserver.is_running() and forkserver.status() != psutil.STATUS_ZOMBIE
        assert running.status()["counter/0"]["state"] == "running"
        assert counter.increment() == 1


FORKSERVER_LIVES = """
import json, os, signal, sys, threading, time
import psutil
sys.path.insert(0, %r)
import jaxdist as jd, launch_nodes as nodes
from jaxdist.envs.vector import EnvSpec

def launch(run_dir):
    program = jd.Program("forkserver-lives")
    program.add_node(jd.CourierNode(nodes.JaxReport), label="reporter")
    return jd.launch(program, launcher="processes", run_dir=os.path.join(%r, run_dir), echo=False)

def outlives_a_sigterm(running):
    reporter = running.client("reporter/0")
    forkserver = psutil.Process(reporter.pid()).parent()
    forkserver.send_signal(signal.SIGTERM)
    time.sleep(1.0)
    return forkserver.status() != psutil.STATUS_ZOMBIE and running.status()["reporter/0"]["state"] == "running"

if __name__ == "__main__":
    with EnvSpec("CartPole-v1", 2, "async").make(seed=0) as env:  # its workers' start method first
        env.reset()
    first = threading.Thread(target=lambda: launch("from-a-thread").stop())
    first.start(); first.join()
    with launch("after-the-thread") as running:
        started_in_a_thread = outlives_a_sigterm(running)
        forkserver = psutil.Process(running.client("reporter/0").pid()).parent()
    forkserver.kill()
    while forkserver.status() != psutil.STATUS_ZOMBIE:  # dead, not yet reaped: ensure_running reaps it
        time.sleep(0.05)
    os.environ["JAX_ENABLE_X64"] = "1"
    launch("restarted").stop()
    del os.environ["JAX_ENABLE_X64"]
    with launch("after-the-restart") as running:
        restarted = outlives_a_sigterm(running)
        x64 = running.client("reporter/0").report()["x64"]
    print(json.dumps([started_in_a_thread, restarted, x64]))
"""


def test_the_forkserver_ignores_sigterm_and_jax_variables_however_it_was_started(tmp_path):
    """The forkserver ignored SIGTERM only when a launch from the main thread had started it: one
    started by async vector envs' workers (multiprocessing has one forkserver a process), from
    another thread, or again after a kill, died of a cluster's cancel (the launcher then took
    every node for dead), and a restarted one kept the launcher's ``JAX_*`` variables of that
    moment for every node forked after."""
    done = subprocess.run([sys.executable, "-c", FORKSERVER_LIVES % (SUPPORT, str(tmp_path))],
                          capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr
    started_in_a_thread, restarted, x64 = json.loads(done.stdout.strip().splitlines()[-1])
    assert started_in_a_thread and restarted and x64 is False


def test_forked_node_processes_draw_their_own_random_numbers_and_log_as_fresh_ones(tmp_path):
    program = jd.Program("fresh-state")
    with program.group("reporter"):
        for _ in range(2):
            program.add_node(jd.CourierNode(nodes.JaxReport))
    with jd.launch(program, launcher="processes", run_dir=str(tmp_path), echo=False) as running:
        first, second = (running.client(f"reporter/{index}").fresh_state() for index in (0, 1))
    assert first["draw"] != second["draw"]  # numpy's global generator, seeded at import, reseeded
    assert first["root_handlers"] == second["root_handlers"] == 0


def test_a_node_process_holds_the_malloc_arenas_its_environment_asks_for_two_by_default(tmp_path):
    """glibc reads MALLOC_ARENA_MAX once per process, and a fork keeps its forkserver's: a group's
    value was ignored, and every node ran with glibc's eight arenas per core."""
    arenas = {}
    for setting in ("", "4", "0"):
        with launch_reporter(str(tmp_path / (setting or "default")),
                             {"MALLOC_ARENA_MAX": setting} if setting else {}) as running:
            arenas[setting] = running.client("reporter/0").malloc_arenas(threads=8)
    assert arenas[""] == 2 and arenas["4"] == 4 and arenas["0"] > 4, arenas
