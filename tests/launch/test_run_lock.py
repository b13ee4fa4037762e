"""One launch at a time in a run directory: a second launch there wrote the same checkpoints,
logs and metrics as the first (each resumed from the other's checkpoints and read the other's
evaluations); now it is refused, naming the launch that holds the directory."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import textwrap

import pytest

import jaxdist as jd
from jaxdist.agents import ppo
from jaxdist.agents.run import RunOptions, prepare_run_dir
from jaxdist.launch import run_lock
from jaxdist.launch.run_lock import RunLock


class Service:
    def ping(self) -> str:
        return "pong"


def service_program() -> tuple[jd.Program, jd.Handle]:
    program = jd.Program("locked")
    handle = program.add_node(jd.CourierNode(Service))
    return program, handle


@pytest.mark.parametrize("launcher", ["threads", "processes"])
def test_a_second_launch_in_a_run_directory_in_use_is_refused_until_the_first_is_over(tmp_path, launcher):
    program, handle = service_program()
    first = jd.launch(program, launcher=launcher, run_dir=str(tmp_path), echo=False)
    try:
        with pytest.raises(jd.LaunchError, match=rf"{tmp_path} is in use by another launch \(pid {os.getpid()} on "):
            jd.launch(service_program()[0], launcher=launcher, run_dir=str(tmp_path), echo=False)
        assert first.client(handle).ping() == "pong"  # the refusal cost the first launch nothing
    finally:
        first.stop()
    again = jd.launch(service_program()[0], launcher=launcher, run_dir=str(tmp_path), echo=False)
    again.stop()


def test_each_hosts_share_holds_its_own_lock_and_a_holder_says_who_it_is(tmp_path):
    """Under multihost every host launches into the one shared directory."""
    host0, host1 = RunLock(str(tmp_path), 0), RunLock(str(tmp_path), 1)
    try:
        with pytest.raises(jd.LaunchError, match="in use by another launch"):
            RunLock(str(tmp_path), 1)
        assert run_lock.holder(str(tmp_path)).startswith(f"pid {os.getpid()} on ")
    finally:
        host0.release()
        host1.release()
    assert run_lock.holder(str(tmp_path)) is None
    RunLock(str(tmp_path), 1).release()


def test_a_killed_holder_leaves_no_stale_lock(tmp_path):
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import sys, time
        from jaxdist.launch.run_lock import RunLock
        RunLock({str(tmp_path)!r})
        print("held", flush=True)
        time.sleep(60)
        """)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        assert run_lock.holder(str(tmp_path)) == f"pid {holder.pid} on {os.uname().nodename}, since " \
            + run_lock.holder(str(tmp_path)).split(", since ")[1]
        with pytest.raises(jd.LaunchError, match=f"pid {holder.pid}"):
            RunLock(str(tmp_path))
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    RunLock(str(tmp_path)).release()


def test_the_command_line_leaves_a_run_directory_in_use_alone(tmp_path):
    """``--fresh`` deleted a running launch's files, and a resume with ``--allow-config-change``
    replaced its config.json, before the launch itself was refused."""
    prepare_run_dir(str(tmp_path), "jaxdist.agents.ppo:agent", ppo.PPOConfig(gamma=0.9), RunOptions())
    held = RunLock(str(tmp_path))
    try:
        for options in (RunOptions(fresh=True), RunOptions(allow_config_change=True)):
            with pytest.raises(SystemExit, match=rf"^error: {tmp_path} is in use by a launch that is running \(pid "):
                prepare_run_dir(str(tmp_path), "jaxdist.agents.ppo:agent", ppo.PPOConfig(gamma=0.5), options)
        assert (tmp_path / "config.json").exists() and '"gamma": 0.9' in (tmp_path / "config.json").read_text()
        # Under multihost every host's share holds its own lock in the one directory as the others start.
        prepare_run_dir(str(tmp_path), "jaxdist.agents.ppo:agent", ppo.PPOConfig(gamma=0.9), RunOptions(launcher="multihost"))
    finally:
        held.release()
    a_file = tmp_path / "notes.txt"
    a_file.write_text("mine")
    with pytest.raises(SystemExit, match="is a file, not a directory"):
        prepare_run_dir(str(a_file), "jaxdist.agents.ppo:agent", ppo.PPOConfig(), RunOptions(fresh=True))
    assert a_file.read_text() == "mine"


def test_a_filesystem_without_locks_is_told_not_refused(tmp_path, monkeypatch, caplog):
    """Some network and FUSE filesystems answer flock with ENOLCK: a launch there goes ahead."""
    def no_locks(fd, operation):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(run_lock.fcntl, "flock", no_locks)
    RunLock(str(tmp_path)).release()
    assert "this filesystem does not lock files" in caplog.text
