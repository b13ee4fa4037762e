"""SIGTERM to a launching script: every stateful node saves, everything exits 0, and a new launch
on the same run directory carries on from the saved step."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

import learner_nodes as ln
from interruptible import popen_interruptible
from orphans import processes_with_marker
from waiting import wait_until
from jaxdist.records.metrics import read_metrics

SUPPORT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "support")


def latest_logged_step(run_dir: str) -> int:
    try:
        return max((row["step"] for row in read_metrics(os.path.join(run_dir, "metrics.csv"))), default=0)
    except FileNotFoundError:
        return 0


def run_until_steps(run_dir: str, steps: int) -> subprocess.Popen:
    script = subprocess.Popen([sys.executable, "-c", ln.launch_learner_script(run_dir, SUPPORT)],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert script.stdout.readline().strip() == "launched"
    wait_until(lambda: latest_logged_step(run_dir) >= steps, f"the learner to log step {steps}", timeout=120)
    return script


@pytest.mark.timeout(300)
def test_sigterm_to_the_launcher_checkpoints_exits_zero_and_a_relaunch_continues(tmp_path):
    run_dir = str(tmp_path)
    script = run_until_steps(run_dir, 15)
    script.send_signal(signal.SIGTERM)
    output, _ = script.communicate(timeout=60)
    assert script.returncode == 0, output
    assert "stopped: the launcher got SIGTERM" in output
    saved = sorted(int(n) for n in os.listdir(os.path.join(run_dir, "checkpoints", "learner", "0")) if n.isdigit())
    assert saved and saved[-1] >= 15  # saved where it stopped, not on the 1000-step interval

    script = run_until_steps(run_dir, saved[-1] + 5)
    script.send_signal(signal.SIGTERM)
    script.communicate(timeout=60)
    with open(os.path.join(run_dir, "logs", "learner-0.log")) as log:
        assert f"restored step {saved[-1]}" in log.read()


def test_ctrl_c_while_the_nodes_start_is_the_launchers_alone_and_leaves_no_node(tmp_path):
    """A terminal's Ctrl-C reaches its whole process group: nodes still starting in it (before
    they lead groups of their own) must not each die with a traceback of their own."""
    starting, marker = tmp_path / "starting", f"JAXDIST_TEST_MARKER=interrupted-{os.getpid()}"
    support = os.path.join(os.path.dirname(os.path.dirname(__file__)), "support")
    env = dict(os.environ, JAXDIST_TEST_STARTING=str(starting), JAXDIST_TEST_MARKER=marker.split("=", 1)[1],
               PYTHONPATH=os.pathsep.join([support, os.environ.get("PYTHONPATH", "")]), PYTHONUNBUFFERED="1")
    launcher = popen_interruptible([sys.executable, os.path.join(support, "interrupted_start.py"), str(tmp_path / "run")],
                                   env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                   start_new_session=True)  # a terminal's foreground group of its own
    try:
        wait_until(lambda: starting.exists(), "a node to begin starting")
        os.killpg(launcher.pid, signal.SIGINT)  # what the terminal does on Ctrl-C
        output, _ = launcher.communicate(timeout=60)
    finally:
        launcher.kill()
    assert "Traceback" not in output and "Fatal Python error" not in output, output
    assert output.strip().splitlines()[-1] == "interrupted while starting", output
    assert processes_with_marker(marker.split("=", 1)[1]) == []


@pytest.mark.parametrize("where, one_line", [("import slow_module", True), ("slow_module_function()", False)])
def test_ctrl_c_while_a_script_imports_is_one_line_and_elsewhere_a_traceback(tmp_path, where, one_line):
    (tmp_path / "slow_module.py").write_text(
        "import pathlib, time\n"
        "def slow_module_function():\n"
        "    pathlib.Path('started').touch()\n"
        "    time.sleep(60)\n"
        + ("slow_module_function()\n" if one_line else ""))
    (tmp_path / "script.py").write_text(f"import jaxdist\n{'' if one_line else 'from slow_module import *'}\n{where}\n")
    script = popen_interruptible([sys.executable, "script.py"], cwd=tmp_path, stderr=subprocess.PIPE, text=True,
                                 env=dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])))
    try:
        wait_until(lambda: (tmp_path / "started").exists(), "the script to be in its slow part")
        script.send_signal(signal.SIGINT)
        _, errors = script.communicate(timeout=60)
    finally:
        script.kill()
    if one_line:
        assert errors == "stopped by Ctrl-C while starting (importing)\n"
    else:
        assert "Traceback" in errors and "slow_module_function" in errors


def test_a_sigterm_handled_after_the_program_ended_but_before_the_script_saw_it_is_not_the_scripts_death(tmp_path):
    """Every process of a pod gets SIGTERM at once: a launching script's handler may run late (its
    main thread inside a blocking call) when its program, stopped meanwhile by another host, has
    ended. Before, the launch forgot its program as its teardown ended, and the late handler,
    finding no program, gave the signal its old behaviour: the script died of it (-SIGTERM)
    instead of exiting 0 after the ordered stop. A program is the script's until it has seen it end."""
    script = (
        "import os, signal\n"
        "import jaxdist as jd\n"
        "program = jd.Program('ends')\n"
        "program.add_node(jd.PyNode(print, 'node ran'))\n"
        f"running = jd.launch(program, launcher='threads', run_dir={str(tmp_path)!r}, echo=False)\n"
        "running._done.wait()  # the launch's end, which the script has not seen through wait() or stop()\n"
        "os.kill(os.getpid(), signal.SIGTERM)  # its handler runs now\n"
        "assert running.wait(timeout=60)\n"
        "print('the script carried on')\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "the script carried on" in done.stdout, (done.returncode, done.stdout, done.stderr)
