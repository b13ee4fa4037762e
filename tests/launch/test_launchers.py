"""Both local launchers, with real servers, threads and processes."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
import uuid

import pytest

import jaxdist as jd
import launch_nodes as nodes
from orphans import alive, processes_with_marker
from waiting import returns, wait_until
from jaxdist import courier
from jaxdist.nodes.cacher import CacherNode
from jaxdist.nodes.replay import Fifo, ReplayNode

LAUNCHERS = ["threads", "processes"]
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def wait_for_text(path, text: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not (path.exists() and path.read_text() == text):
        assert time.monotonic() < deadline, f"{path} did not say {text!r} within {timeout} s"
        time.sleep(0.02)


@pytest.mark.slow
@pytest.mark.parametrize("launcher", LAUNCHERS)
@pytest.mark.parametrize(
    "script, expected",
    [
        ("producer_consumer.py", "Results: [0, 1, 4, 9]"),
        ("mapreduce_wordcount.py", "matches a single-process count: True"),
        ("es_futures.py", "final fitness -0.0"),
    ],
)
def test_examples_run_and_leave_no_process_behind(tmp_path, launcher, script, expected):
    marker = f"JAXDIST_TEST_MARKER={uuid.uuid4().hex}"
    env = dict(os.environ, JAXDIST_TEST_MARKER=marker.split("=", 1)[1])
    out = subprocess.run(
        [sys.executable, os.path.join(REPO, "experiments", script), "--launcher", launcher, "--run-dir", str(tmp_path)],
        capture_output=True, text=True, timeout=120, env=env,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert expected in out.stdout
    wait_until(lambda: not processes_with_marker(marker), "the nodes to exit")


@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_node_failure_is_reported_with_name_and_traceback(tmp_path, launcher):
    program = jd.Program("failing")
    with program.group("service"):
        program.add_node(jd.CourierNode(nodes.Counter))
    with program.group("bad"):
        program.add_node(jd.CourierNode(nodes.Failing))
    running = jd.launch(program, launcher=launcher, run_dir=str(tmp_path), echo=False)
    with pytest.raises(jd.NodeFailedError, match="node 'bad/0' failed") as raised:
        running.wait(timeout=60)
    assert "ValueError: deliberate failure in run" in raised.value.details
    assert "launch_nodes.py" in raised.value.details
    status = running.status()
    assert status["bad/0"]["state"] == "failed"
    assert status["service/0"]["state"] == "stopped"


@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_constructor_failure_is_reported_and_nothing_runs(tmp_path, launcher):
    program = jd.Program("bad-init")
    program.add_node(jd.CourierNode(nodes.FailingConstructor), label="bad")
    program.add_node(jd.CourierNode(nodes.UntilStopped), label="worker")
    running = jd.launch(program, launcher=launcher, run_dir=str(tmp_path), echo=False)
    with pytest.raises(jd.NodeFailedError, match="RuntimeError: deliberate failure in __init__"):
        running.wait(timeout=60)


def test_under_threads_a_node_that_fails_while_later_nodes_start_stops_the_whole_program(tmp_path, monkeypatch):
    """The stop joined the threads start() had yet to start: it died of a RuntimeError, leaving
    the nodes' servers bound and this process's output routed to their logs."""
    start = threading.Thread.start

    def late_worker(thread: threading.Thread) -> None:
        if thread.name == "worker/0":
            time.sleep(0.5)  # the failing node's stop begins meanwhile
        start(thread)

    crashed: list = []
    monkeypatch.setattr(threading.Thread, "start", late_worker)
    monkeypatch.setattr(threading, "excepthook", crashed.append)
    stdout = sys.stdout
    program = jd.Program("fails-while-starting")
    program.add_node(jd.CourierNode(nodes.FailingConstructor), label="bad")
    program.add_node(jd.CourierNode(nodes.UntilStopped), label="worker")
    running = jd.launch(program, launcher="threads", run_dir=str(tmp_path), echo=False)
    with pytest.raises(jd.NodeFailedError, match="deliberate failure in __init__"):
        running.wait(timeout=60)
    assert crashed == [] and sys.stdout is stdout
    # Its server shut down: no answer (up, it would refuse the method: UnknownMethodError).
    with pytest.raises((courier.UnavailableError, courier.DeadlineExceededError)):
        courier.Client(running.addresses["worker/0"], token=running.token, timeout=2).ping()


@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_constructors_may_call_nodes_added_later(tmp_path, launcher, capfd):
    program = jd.Program("two-phase")
    peer = jd.Handle("counter/0")  # refers to the node added below
    program.add_node(jd.CourierNode(nodes.CallsPeerInConstructor, peer), label="caller")
    assert program.add_node(jd.CourierNode(nodes.Counter)).node_name == "counter/0"
    running = jd.launch(program, launcher=launcher, run_dir=str(tmp_path))
    assert running.wait(timeout=60)
    assert "[caller/0] peer replied pong" in capfd.readouterr().out
    assert running.stop_reason == "jd.stop() was called in node 'caller/0'"


@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_program_ends_when_every_node_with_run_returns(tmp_path, launcher, capfd):
    program = jd.Program("counting")
    counter = program.add_node(jd.CourierNode(nodes.Counter))
    with program.group("caller"):
        program.add_node(jd.PyNode(nodes.call_counter, counter, 5))
    running = jd.launch(program, launcher=launcher, run_dir=str(tmp_path))
    assert running.wait(timeout=60)
    assert "[caller/0] counter at 6" in capfd.readouterr().out
    status = running.status()
    assert status["caller/0"]["state"] == "finished"
    assert status["counter/0"]["state"] == "stopped"
    assert running.stop_reason == "every node with work of its own has finished"


@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_a_function_node_knows_its_name_and_its_stop_names_it(tmp_path, launcher):
    """Before, a PyNode ran outside its node context: ``current_node()`` was None in it, and
    under the threads launcher its ``jd.stop()`` named the thread, not the node."""
    program = jd.Program("naming")
    program.add_node(jd.PyNode(nodes.names_itself_and_stops), label="namer")
    running = jd.launch(program, launcher=launcher, run_dir=str(tmp_path), echo=False)
    assert running.wait(timeout=60)
    assert (tmp_path / "node_name").read_text() == "namer/0"
    assert running.stop_reason == "jd.stop() was called in node 'namer/0'"


@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_a_node_that_ends_the_program_can_say_why(tmp_path, launcher):
    """Before, a program that ended itself could only be reported as ``jd.stop() was called in
    node ...``: the agents' closing line told a user nothing of why training had ended."""
    program = jd.Program("saying")
    program.add_node(jd.PyNode(nodes.stops_saying_why, "the work is done"), label="sayer")
    running = jd.launch(program, launcher=launcher, run_dir=str(tmp_path), echo=False)
    assert running.wait(timeout=60)
    assert running.stop_reason == "the work is done (node 'sayer/0')"


@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_each_node_has_a_log_file_and_prefixed_console(tmp_path, launcher, capfd):
    program = jd.Program("chatty")
    program.add_node(jd.CourierNode(nodes.Chatty))
    assert jd.launch(program, launcher=launcher, run_dir=str(tmp_path)).wait(timeout=60)
    log = (tmp_path / "logs" / "chatty-0.log").read_text()
    assert "hello from stdout" in log and "hello from stderr" in log
    captured = capfd.readouterr()
    assert "[chatty/0] hello from stdout" in captured.out + captured.err


def test_every_node_the_processes_launcher_starts_refuses_a_caller_without_the_programs_token(tmp_path):
    program = jd.Program("tokens")
    with program.group("service"):
        service = program.add_node(jd.CourierNode(nodes.Counter))
    with program.group("replay"):
        program.add_node(ReplayNode(Fifo(4)))
    with program.group("cacher"):
        program.add_node(CacherNode(service))
    calls = {"service/0": "increment", "replay/0": "size", "cacher/0": "ping"}
    running = jd.launch(program, launcher="processes", run_dir=str(tmp_path), echo=False)  # a token of its own
    try:
        assert set(running.addresses) == set(calls)
        for name, address in running.addresses.items():
            for token in (None, "not-the-token"):
                with courier.Client(address, token=token, timeout=30) as stranger:
                    with pytest.raises(courier.AuthenticationError, match="missing or wrong courier token"):
                        getattr(stranger, calls[name])()
            with courier.Client(address, token=running.token, timeout=30) as member:
                assert getattr(member, calls[name])() is not None  # still serving, to the token's holder
    finally:
        running.stop()


@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_wait_with_a_timeout_returns_false_while_the_program_runs(tmp_path, launcher):
    program = jd.Program("still-running")
    program.add_node(jd.CourierNode(nodes.UntilStopped), label="loop")
    running = jd.launch(program, launcher=launcher, run_dir=str(tmp_path), echo=False)
    try:
        assert running.wait(timeout=0) is False
        assert running.wait(timeout=0.5) is False
        assert running.status()["loop/0"]["state"] == "running"
    finally:
        running.stop()
    assert running.wait(timeout=0) is True


@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_stop_ends_cooperative_and_services_and_reports_status(tmp_path, launcher):
    program = jd.Program("stoppable")
    program.add_node(jd.CourierNode(nodes.UntilStopped), label="loop")
    counter = program.add_node(jd.CourierNode(nodes.Counter))
    # No interrupt and no kill within the test: a node that did not end by itself would hold the stop.
    running = jd.launch(program, launcher=launcher, run_dir=str(tmp_path), echo=False, grace=600, interrupt_after=600)
    assert set(running.addresses) == {"counter/0", "loop/0"}  # a node with run() serves too
    assert running.status()["loop/0"]["state"] == "running"
    assert courier.Client(running.addresses["counter/0"], token=running.token).increment() == 1
    returns(running.stop, "a stop of cooperative nodes")
    assert running.wait(timeout=0)
    assert {s["state"] for s in running.status().values()} == {"stopped"}
    assert counter.node_name == "counter/0"


def test_threads_stop_interrupts_a_node_that_ignores_the_stop_event(tmp_path):
    program = jd.Program("stubborn-thread")
    program.add_node(jd.PyNode(nodes.call_counter_forever_uncooperative), label="loop")
    # The stop would wait the whole grace for a thread it could not interrupt.
    running = jd.launch(program, launcher="threads", run_dir=str(tmp_path), echo=False, interrupt_after=0.2, grace=600)
    returns(running.stop, "a stop of a node that ignores the stop event")


def test_processes_stop_kills_stubborn_nodes_and_grandchildren(tmp_path):
    program = jd.Program("stubborn")
    program.add_node(jd.CourierNode(nodes.Stubborn))
    tree = program.add_node(jd.CourierNode(nodes.WithGrandchild))
    running = jd.launch(program, launcher="processes", run_dir=str(tmp_path), echo=False, grace=1.0)
    grandchild = courier.Client(running.addresses[tree.node_name], token=running.token).grandchild_pid()
    assert alive(grandchild)
    running.stop()
    wait_until(lambda: not alive(grandchild), "the grandchild to die")
    for status in running.status().values():
        assert not alive(status["pid"])


@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_a_stop_waits_past_its_grace_for_a_checkpoint_save_under_way(tmp_path, launcher):
    program = jd.Program("saves-at-stop")
    marker = tmp_path / "save"
    # Its grace covers the start of the save, even on a loaded machine, not the save.
    program.add_node(jd.CourierNode(nodes.SavesAtStop, str(marker), 4.0), label="learner")
    running = jd.launch(program, launcher=launcher, run_dir=str(tmp_path / "run"), echo=False, grace=1.5,
                        interrupt_after=0.1)
    running.stop()
    assert marker.read_text() == "saved"
    assert [status["exitcode"] for status in running.status().values()] == [0 if launcher == "processes" else None]


def test_a_node_whose_save_ended_past_its_grace_gets_its_grace_again_to_exit(tmp_path):
    """Killed as its save ended, a node that had saved its checkpoint died by SIGKILL on its way
    out (a loaded machine's teardown outlasts no deadline that has passed)."""
    program = jd.Program("saves-then-exits")
    marker = tmp_path / "save"
    program.add_node(jd.CourierNode(nodes.SavesAtStop, str(marker), 3.0, 0.5), label="learner")
    running = jd.launch(program, launcher="processes", run_dir=str(tmp_path / "run"), echo=False, grace=1.5)
    running.stop()
    assert marker.read_text() == "saved"
    assert [status["exitcode"] for status in running.status().values()] == [0]


def test_processes_stop_kills_a_save_past_its_save_grace_and_says_so(tmp_path, capfd):
    program = jd.Program("endless-save")
    marker = tmp_path / "save"
    program.add_node(jd.CourierNode(nodes.SavesAtStop, str(marker), 600.0), label="learner")
    running = jd.launch(program, launcher="processes", run_dir=str(tmp_path / "run"), echo=False, grace=1.5,
                        save_grace=1.0)
    returns(running.stop, "a stop of a node saving for longer than its save_grace")
    assert marker.read_text() == "saving"
    assert not alive(running.status()["learner/0"]["pid"])
    assert re.search(r"\[launcher\] learner/0 was killed \d+ s into saving its checkpoint \(save_grace=1 s\): a "
                     r"relaunch restores its last complete one", capfd.readouterr().out)


def test_processes_stop_nodes_that_stop_first_while_the_others_still_serve(tmp_path):
    program = jd.Program("phased-stop")
    counter = program.add_node(jd.CourierNode(nodes.Counter))
    report = tmp_path / "calls-after-stop"
    program.add_node(jd.CourierNode(nodes.FinishesWithItsPeer, counter, str(report), 1.0), label="learner")
    running = jd.launch(program, launcher="processes", run_dir=str(tmp_path / "run"), echo=False,
                        interrupt_after=0.2)
    wait_for_text(report, "running")
    running.stop()
    # The learner called the counter for a second after the stop, uninterrupted, before the
    # counter was told to stop.
    assert float(report.read_text()) >= 1.0
    assert [status["exitcode"] for status in running.status().values()] == [0, 0]
    assert jd.ColocationNode([jd.CourierNode(nodes.Counter),
                              jd.CourierNode(nodes.FinishesWithItsPeer, None, "", 0.0)]).stops_first()
    assert not jd.ColocationNode([jd.CourierNode(nodes.Counter)]).stops_first()


def test_the_stops_interrupt_never_cuts_a_nodes_cleanup_short(tmp_path):
    # run() ended with an error at the stop while the interrupt was on its way (closing the
    # clients first was slow, as under load): it landed in close(), escaped the worker, and
    # the process exited 120 (seen in CI).
    closed = tmp_path / "closed"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.join(REPO, "tests", "support"), REPO]))
    result = subprocess.run([sys.executable, os.path.join(REPO, "tests", "helpers", "interrupted_worker.py"),
                             str(tmp_path), str(closed)], capture_output=True, text=True, env=env, timeout=60)
    assert result.stdout.strip().endswith("exit 0 closed"), result.stdout + result.stderr


def test_processes_report_a_node_killed_by_a_signal(tmp_path):
    program = jd.Program("killed")
    program.add_node(jd.CourierNode(nodes.SelfKilling))
    program.add_node(jd.CourierNode(nodes.Counter))
    running = jd.launch(program, launcher="processes", run_dir=str(tmp_path), echo=False)
    with pytest.raises(jd.NodeFailedError, match="node 'selfkilling/0' failed:\nprocess was killed by SIGKILL"):
        running.wait(timeout=60)


def test_processes_set_group_environment(tmp_path, capfd):
    program = jd.Program("env")
    with program.group("reader"):
        program.add_node(jd.PyNode(nodes.print_env, "JAXDIST_GROUP_VALUE"))
    running = jd.launch(
        program, launcher="processes", run_dir=str(tmp_path), resources={"reader": {"env": {"JAXDIST_GROUP_VALUE": 42}}}
    )
    assert running.wait(timeout=60)
    assert "[reader/0] JAXDIST_GROUP_VALUE=42" in capfd.readouterr().out
    assert "JAXDIST_GROUP_VALUE" not in os.environ


@pytest.mark.slow
def test_nodes_exit_when_the_launcher_is_killed(tmp_path):
    marker = uuid.uuid4().hex
    script = (
        "import sys, time; sys.path.insert(0, %r)\n"
        "import jaxdist as jd, launch_nodes as nodes\n"
        "if __name__ == '__main__':\n"
        "    p = jd.Program('orphans'); p.add_node(jd.CourierNode(nodes.UntilStopped)); p.add_node(jd.CourierNode(nodes.Counter))\n"
        "    jd.launch(p, launcher='processes', run_dir=%r, echo=False); print('started', flush=True); time.sleep(600)\n"
    ) % (os.path.join(REPO, "tests", "support"), str(tmp_path))
    launcher = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, env=dict(os.environ, JAXDIST_TEST_MARKER=marker)
    )
    assert launcher.stdout.readline().strip() == "started"
    assert len(processes_with_marker(marker)) >= 3  # the launcher, two nodes (and a resource tracker)
    launcher.send_signal(signal.SIGKILL)
    launcher.wait()
    wait_until(lambda: not processes_with_marker(marker), "the orphaned nodes to exit")


def test_processes_stop_reports_every_exit_code(tmp_path):
    """The monitor alone reaps children: a second join used to lose exit codes (None)."""
    for attempt in range(3):
        program = jd.Program("exit-codes")
        with program.group("loop"):
            for _ in range(3):
                program.add_node(jd.CourierNode(nodes.UntilStopped))
        running = jd.launch(program, launcher="processes", run_dir=str(tmp_path / str(attempt)), echo=False)
        running.stop()
        assert [status["exitcode"] for status in running.status().values()] == [0, 0, 0]


def test_sigterm_to_every_node_stops_the_program_in_order_through_the_launcher(tmp_path):
    # As `scancel` or a VM's shutdown would: every process gets SIGTERM at once. The counter
    # must not just exit: the learner still calls it while it stops.
    program = jd.Program("preempted")
    counter = program.add_node(jd.CourierNode(nodes.Counter))
    report = tmp_path / "calls-after-stop"
    program.add_node(jd.CourierNode(nodes.FinishesWithItsPeer, counter, str(report), 1.0), label="learner")
    running = jd.launch(program, launcher="processes", run_dir=str(tmp_path / "run"), echo=False)
    wait_for_text(report, "running")
    for status in running.status().values():
        os.kill(status["pid"], signal.SIGTERM)
    assert running.wait(timeout=30)
    assert running.stop_reason == "node 'counter/0' got SIGTERM" or \
        running.stop_reason == "node 'learner/0' got SIGTERM", running.stop_reason
    assert float(report.read_text()) >= 1.0
    assert [status["exitcode"] for status in running.status().values()] == [0, 0]


def test_a_script_without_the_main_guard_is_told_what_to_add(tmp_path):
    script = tmp_path / "no_guard.py"
    script.write_text(
        "import jaxdist as jd\n"
        "class Hello:\n"
        "    def run(self):\n"
        "        print('hello')\n"
        "program = jd.Program('no-guard')\n"
        "program.add_node(jd.CourierNode(Hello), label='hello')\n"
        f"jd.launch(program, launcher='processes', run_dir={str(tmp_path / 'run')!r}).wait()\n")
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode != 0
    assert 'if __name__ == "__main__":' in done.stderr, done.stderr
    assert "bootstrapping phase" not in done.stderr  # multiprocessing's own traceback is not reached


@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_a_program_of_services_alone_says_at_launch_what_ends_it(tmp_path, capfd, launcher):
    program = jd.Program("services")
    program.add_node(jd.CourierNode(nodes.Counter), label="counter")
    running = jd.launch(program, launcher=launcher, run_dir=str(tmp_path), echo=False)
    try:
        assert "no node of program 'services' has a run() method" in capfd.readouterr().err
    finally:
        running.stop()
    program = jd.Program("worker")
    program.add_node(jd.CourierNode(nodes.UntilStopped), label="loop")
    with jd.launch(program, launcher=launcher, run_dir=str(tmp_path / "worker"), echo=False):
        assert "has a run() method" not in capfd.readouterr().err


def test_served_calls_run_concurrently_unless_the_node_serves_one_at_a_time(tmp_path):
    program = jd.Program("overlap")
    program.add_node(jd.CourierNode(nodes.CountsOverlap), label="pool")
    program.add_node(jd.CourierNode(nodes.CountsOverlap).with_server(thread_pool_size=1), label="single")
    with jd.launch(program, launcher="threads", run_dir=str(tmp_path), echo=False) as running:
        overlap = {}
        for name in ("pool/0", "single/0"):
            client = courier.Client(running.addresses[name], token=running.token)
            for future in [client.futures.slow() for _ in range(4)]:
                future.result(timeout=30)
            overlap[name] = client.overlap()
    assert overlap["pool/0"] >= 2 and overlap["single/0"] == 1, overlap


@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_a_stop_right_after_launch_still_runs_every_run_and_its_cleanup(tmp_path, launcher):
    for trial in range(5 if launcher == "processes" else 20):  # the race was in the threads launcher
        program = jd.Program("quick-stop")
        paths = [tmp_path / f"{trial}-{i}" for i in range(3)]
        with program.group("node"):
            for path in paths:
                program.add_node(jd.CourierNode(nodes.CleansUp, str(path)))
        jd.launch(program, launcher=launcher, run_dir=str(tmp_path / f"run{trial}"), echo=False).stop()
        assert all(path.exists() for path in paths), (trial, [path.exists() for path in paths])


@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_sigterm_to_the_launching_script_is_the_ordered_stop(tmp_path, launcher):
    """As a preempted VM or `kill` would: every node sees the stop, the script exits 0 (under
    threads it was killed, exit -15, and no node saw it)."""
    cleaned = tmp_path / "cleaned"
    script = tmp_path / "script.py"
    script.write_text(
        "import sys\n"
        "import jaxdist as jd\n"
        "import launch_nodes as nodes\n"
        "if __name__ == '__main__':\n"
        "    program = jd.Program('terminated')\n"
        f"    program.add_node(jd.CourierNode(nodes.CleansUp, {str(cleaned)!r}), label='loop')\n"
        f"    running = jd.launch(program, launcher={launcher!r}, run_dir={str(tmp_path / 'run')!r}, echo=False)\n"
        "    print('launched', flush=True)\n"
        "    running.wait()\n"
        "    print('stopped:', running.stop_reason, flush=True)\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.join(os.path.dirname(os.path.dirname(
        os.path.abspath(__file__))), "support"), os.environ.get("PYTHONPATH", "")]))
    process = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, env=env)
    try:
        assert process.stdout.readline().strip() == "launched"
        process.send_signal(signal.SIGTERM)
        out, err = process.communicate(timeout=120)
    finally:
        process.kill()
    assert process.returncode == 0, err
    assert "stopped: the launcher got SIGTERM" in out, out + err
    assert cleaned.read_text() == "cleaned up"


def test_a_node_interrupted_in_its_constructor_by_the_stop_is_stopped_not_failed(tmp_path):
    program = jd.Program("built-until-stopped")
    program.add_node(jd.CourierNode(nodes.BuiltUntilStopped, 5.0), label="slow")
    program.add_node(jd.CourierNode(nodes.StopsInConstructor), label="stopper")
    running = jd.launch(program, launcher="threads", run_dir=str(tmp_path), echo=False, interrupt_after=0.2)
    assert running.wait(timeout=60)  # no NodeFailedError: the stop interrupted it
    assert running.status()["slow/0"]["state"] == "stopped", running.status()


def test_a_node_stuck_in_its_constructor_fails_the_start_at_the_start_timeout_saying_so(tmp_path):
    """Before, the start timeout covered binding only: a node whose constructor never returned (a
    learner deadlocked inside XLA) kept launch() waiting for ever, without a word."""
    program = jd.Program("stuck-start")
    program.add_node(jd.CourierNode(nodes.UntilStopped), label="early")  # named first, yet waiting on the other
    program.add_node(jd.CourierNode(nodes.HangsInConstructor), label="stuck")
    began = time.monotonic()
    running = jd.launch(program, launcher="processes", run_dir=str(tmp_path), echo=False, start_timeout=8, grace=1)
    with pytest.raises(jd.NodeFailedError, match=r"node 'stuck/0' failed:\nthe start timeout \(8 s\) ran out: stuck/0 "
                                                 r"was still being constructed"):
        running.wait(timeout=60)
    assert time.monotonic() - began < 40


@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_the_run_directory_and_logs_are_the_owners_and_a_planted_log_symlink_is_refused(tmp_path, launcher):
    run_dir = tmp_path / "run"
    jd.launch(chatty_program(), launcher=launcher, run_dir=str(run_dir), echo=False).wait(timeout=60)
    assert run_dir.stat().st_mode & 0o777 == 0o700
    assert (run_dir / "logs" / "chatty-0.log").stat().st_mode & 0o777 == 0o600
    # A symlink where a log goes (another user's trap, or a stale link) is not followed.
    target = tmp_path / "target"
    (run_dir / "logs" / "chatty-0.log").unlink()
    (run_dir / "logs" / "chatty-0.log").symlink_to(target)
    with pytest.raises(jd.NodeFailedError):
        jd.launch(chatty_program(), launcher=launcher, run_dir=str(run_dir), echo=False).wait(timeout=60)
    assert not target.exists()


def chatty_program() -> jd.Program:
    program = jd.Program("private")
    program.add_node(jd.CourierNode(nodes.Chatty), label="chatty")
    return program
