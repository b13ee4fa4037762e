"""The processes launcher on a machine without /proc (macOS): jaxdist finds and signals process
trees through psutil (sysctl on macOS), never by reading Linux-only paths itself. Every process of
a launch -- the script, the node processes, their restarts -- runs under an audit hook that
records any /proc or /sys path jaxdist's code opens or lists."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

AUDIT = os.path.join(os.path.dirname(os.path.dirname(__file__)), "support", "linux_paths_audit")

SCRIPT = textwrap.dedent('''
    import os, signal, sys, time
    import jaxdist as jd

    class Sleeper:
        def run(self):
            while not jd.stop_requested():
                time.sleep(0.05)

    def wait_for(condition, what):
        deadline = time.monotonic() + 60
        while not condition():
            if time.monotonic() > deadline:
                sys.exit(f"timed out waiting for {what}")
            time.sleep(0.05)

    if __name__ == "__main__":
        program = jd.Program("portable")
        with program.group("sleeper"):
            program.add_node(jd.CourierNode(Sleeper))
        with program.group("worker"):
            program.add_node(jd.PyNode(time.sleep, 600))
        running = jd.launch(program, launcher="processes", run_dir=sys.argv[1], echo=False,
                            restart={"sleeper": jd.Restart(max_restarts=2, backoff=0.1)})
        os.kill(running.status()["sleeper/0"]["pid"], signal.SIGKILL)
        wait_for(lambda: running.status()["sleeper/0"]["restarts"] == 1
                 and running.status()["sleeper/0"]["state"] == "running", "the restart")
        running.stop()  # the PyNode sleeps on: its tree is signalled after the grace period
        print("stopped:", {name: status["state"] for name, status in running.status().items()})
''')


def test_a_launch_with_a_restart_and_a_stop_reads_no_linux_only_path(tmp_path):
    script = tmp_path / "portable.py"
    script.write_text(SCRIPT)
    out = tmp_path / "linux_paths.txt"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([AUDIT, os.environ.get("PYTHONPATH", "")]),
               JAXDIST_LINUX_PATHS_OUT=str(out))
    done = subprocess.run([sys.executable, str(script), str(tmp_path / "run")], env=env, capture_output=True,
                          text=True, timeout=180)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "stopped:" in done.stdout
    assert not out.exists(), out.read_text()


def test_the_audit_sees_a_linux_only_read_made_by_jaxdist(tmp_path):
    """The check itself: a /proc read from a jaxdist module is recorded (psutil's are not)."""
    out = tmp_path / "linux_paths.txt"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([AUDIT, os.environ.get("PYTHONPATH", "")]),
               JAXDIST_LINUX_PATHS_OUT=str(out))
    code = ("import psutil; from jaxdist.launch import process_tree; psutil.Process().children(); "
            "exec(compile('open(\"/proc/self/status\").close()', process_tree.__file__, 'exec'))")
    subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=60)
    lines = out.read_text().splitlines()
    assert len(lines) == 1 and "open /proc/self/status from" in lines[0] and "process_tree.py" in lines[0]
