"""A learner spanning hosts: the PPO demo on two "hosts", each its own process tree running the
same command, whose learner processes form one jax.distributed learner.

The hosts are two process trees on 127.0.0.1 with their own port ranges; the run to the target
puts them, where the test may (as root), in two network namespaces joined by a veth pair, each
with its own address (then nothing can take a shortcut through a shared loopback).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid

import numpy as np
import psutil
import pytest

from jaxdist.agents import load_policy
from jaxdist.records.metrics import read_metrics
from orphans import node_process
from ports import reserve_base_port
from resume_checks import (assert_same_leaves, committed_steps, flat_leaves, observed_environment, rows_so_far,
                           saved_state)
from waiting import wait_until

pytestmark = pytest.mark.slow

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEMO = os.path.join(REPO, "experiments", "ppo.py")


@contextlib.contextmanager
def loopback_hosts():
    yield ["127.0.0.1", "127.0.0.1"], [[], []]


class NoNamespaces(Exception):
    """Network namespaces cannot be made here; the message says why."""


@contextlib.contextmanager
def separate_hosts():
    """Two network namespaces where they can be made, else two port ranges on loopback."""
    try:
        with namespace_hosts() as hosts:
            yield hosts
    except NoNamespaces as why:
        print(f"two port ranges on loopback, not two network namespaces: {why}")
        with loopback_hosts() as hosts:
            yield hosts


@contextlib.contextmanager
def namespace_hosts():
    """Two network namespaces, 10.77.x.1 and 10.77.x.2, linked by a veth pair."""
    if os.geteuid() != 0:
        raise NoNamespaces("network namespaces need root (ip netns)")
    tag = uuid.uuid4().hex[:6]
    names, subnet = [f"jd{tag}a", f"jd{tag}b"], 77
    addresses = [f"10.{subnet}.0.1", f"10.{subnet}.0.2"]
    commands = [
        *[["ip", "netns", "add", name] for name in names],
        ["ip", "link", "add", f"v{tag}a", "type", "veth", "peer", "name", f"v{tag}b"],
        *[["ip", "link", "set", f"v{tag}{side}", "netns", name] for side, name in zip("ab", names)],
        *[["ip", "-n", name, "addr", "add", f"{address}/24", "dev", f"v{tag}{side}"]
          for side, name, address in zip("ab", names, addresses)],
        *[["ip", "-n", name, "link", "set", f"v{tag}{side}", "up"] for side, name in zip("ab", names)],
        *[["ip", "-n", name, "link", "set", "lo", "up"] for name in names],
    ]
    try:
        for command in commands:
            done = subprocess.run(command, capture_output=True, text=True)
            if done.returncode:
                raise NoNamespaces(f"{' '.join(command)}: {done.stderr.strip()}")
        for name, address in zip(names, addresses):
            # Gloo (JAX's CPU collectives) advertises what the hostname resolves to, as on a real
            # host; `ip netns exec` mounts /etc/netns/<name>/hosts over /etc/hosts.
            os.makedirs(f"/etc/netns/{name}", exist_ok=True)
            with open(f"/etc/netns/{name}/hosts", "w") as hosts_file:
                hosts_file.write(f"127.0.0.1 localhost\n{address} {socket.gethostname()}\n")
        yield addresses, [["ip", "netns", "exec", name] for name in names]
    finally:
        for name in names:
            subprocess.run(["ip", "netns", "del", name], capture_output=True)
            shutil.rmtree(f"/etc/netns/{name}", ignore_errors=True)


def start_hosts(hosts, prefixes, run_dir, base_port, *extra, environ=None):
    env = dict(os.environ if environ is None else environ, JAXDIST_TOKEN="shared-secret", PYTHONUNBUFFERED="1")
    processes = []
    for index, prefix in enumerate(prefixes):
        command = [*prefix, sys.executable, DEMO, "--launcher", "multihost", "--learner-hosts", "2", "--num-actors", "2",
                   "--hosts", ",".join(hosts), "--host-index", str(index), "--base-port", str(base_port),
                   "--run-dir", str(run_dir), "--compilation-cache", "", *extra]
        log = open(run_dir.parent / f"host{index}.out", "w")
        processes.append((subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env,
                                           start_new_session=True), log))
    return processes


def finish(processes, timeout: float) -> list[str]:
    outputs = []
    for process, log in processes:
        try:
            process.wait(timeout=timeout)
        finally:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
            log.close()
        outputs.append(open(log.name).read())
    return outputs


def sigterm_everyone(processes) -> None:
    """As `scancel` or a pod-wide preemption: every process of every host gets SIGTERM at once."""
    everyone = [psutil.Process(p.pid) for p, _ in processes]
    everyone += [child for host in list(everyone) for child in host.children(recursive=True)]
    for process in everyone:
        with contextlib.suppress(psutil.Error):
            process.send_signal(signal.SIGTERM)


def wait_for_rows(processes, metrics, what: str, condition) -> None:
    deadline = time.monotonic() + 300
    while not condition(rows_so_far(metrics)):
        assert time.monotonic() < deadline, f"the learner did not log {what}"
        assert all(p.poll() is None for p, _ in processes), "a host exited early"
        time.sleep(0.5)


LAST_UPDATE = 120


@pytest.mark.timeout(600)
def test_sigterm_to_every_process_of_both_hosts_saves_one_step_a_relaunch_restores_on_both_and_runs_to_its_end(tmp_path):
    """Each launcher stops its learner first, still fed by its actors, so both reach the step
    JAX's preemption sync point agrees on, and save it together. The same command again
    restores that step on both hosts, leaf for leaf as saved, and runs to its last update; it ends
    once host 0's evaluator has evaluated that update (before, every host's learner ended the
    program after its last update, unevaluated). The evaluator, in a process of its own, saves
    the best policy (before, beside the learner, it saved none)."""
    run_dir, restores, base_port = tmp_path / "run", tmp_path / "restores", reserve_base_port()
    # 120 updates of 2 actors x 16 envs x 32 steps: metrics rows reach the file every 5 s, when a quiet
    # machine has trained 40 updates or more; the SIGTERM must come well before the last one
    flags = ("--checkpoint-every-updates", "100000", "--total-steps", str(LAST_UPDATE * 1024))
    metrics = run_dir / "metrics.csv"
    with loopback_hosts() as (hosts, prefixes):
        processes = start_hosts(hosts, prefixes, run_dir, base_port, *flags)
        wait_for_rows(processes, metrics, "two rows", lambda rows: len(rows) >= 2)
        sigterm_everyone(processes)
        out0, out1 = finish(processes, timeout=120)
    assert processes[0][0].returncode == 0 and processes[1][0].returncode == 0, out0[-3000:] + out1[-3000:]
    logs = [(run_dir / "logs" / f"learner-{h}.log").read_text() for h in (0, 1)]
    # SIGTERM reached the launchers too, whose ordered stop the learners may see first
    stops = [re.findall(r"stopped at step (\d+): (?:preempted|the program is stopping) \(checkpoint saved\)", log)
             for log in logs]
    assert stops[0] and stops[0] == stops[1], (stops, logs[0][-2000:], logs[1][-2000:])
    # JAX's preemption service no longer catches SIGTERM itself, whose C++ line read as a crash
    assert not [text for text in [out0, out1, *logs] if "SIGTERM caught" in text], (out0[-2000:], logs[0][-2000:])
    stopped_at = int(stops[0][-1])
    checkpoints = str(run_dir / "checkpoints" / "learner")
    assert committed_steps(checkpoints) == [stopped_at]  # the stop's own save: the interval never came
    _, saved = saved_state(checkpoints)

    restores.mkdir()
    with loopback_hosts() as (hosts, prefixes):
        processes = start_hosts(hosts, prefixes, run_dir, base_port, *flags,
                                environ=observed_environment(str(restores)))
        out0, out1 = finish(processes, timeout=300)
    assert processes[0][0].returncode == 0 and processes[1][0].returncode == 0, out0[-3000:] + out1[-3000:]
    assert f"of learner version {LAST_UPDATE} (the final policy)" in out0, out0[-3000:]
    assert (f"host 1 stopped: host 0 stopped the program: training is over: its final policy, version {LAST_UPDATE}, "
            f"was evaluated (node 'evaluator/0')") in out1, out1[-3000:]
    evaluations = read_metrics(run_dir / "evaluations.csv")
    assert evaluations[-1]["step"] == LAST_UPDATE
    best = max(evaluations, key=lambda row: row["mean_return"])
    assert load_policy(str(run_dir), best=True).step == best["step"]
    for host in (0, 1):
        log = (run_dir / "logs" / f"learner-{host}.log").read_text()
        assert f"restored step {stopped_at} on 2 cpu device(s)" in log, log[-3000:]
        with np.load(restores / f"learner-{host}.npz") as restored:
            assert_same_leaves(dict(restored), flat_leaves(saved), f"host {host}'s restored learner state")


@pytest.mark.timeout(600)
def test_ppo_solves_cartpole_with_one_learner_spanning_two_hosts_through_the_kill_of_one_hosts_actor_and_learner(
        tmp_path):
    run_dir = tmp_path / "run"
    with separate_hosts() as (hosts, prefixes):
        processes = start_hosts(hosts, prefixes, run_dir, reserve_base_port(), "--stop-at-target",
                                "--checkpoint-every-updates", "10")
        checkpoints = run_dir / "checkpoints" / "learner"
        deadline = time.monotonic() + 300
        while not (checkpoints.is_dir() and any(name.isdigit() for name in os.listdir(checkpoints))):
            assert time.monotonic() < deadline, "no checkpoint was written"
            assert all(p.poll() is None for p, _ in processes), "a host exited early"
            time.sleep(0.5)
        host_1 = processes[1][0].pid
        actor = wait_until(lambda: node_process(host_1, str(run_dir), "actor/1"), "host 1's actor process", 60)
        actor.send_signal(signal.SIGKILL)  # restarted alone
        killed_at = time.monotonic()
        learner = wait_until(lambda: node_process(host_1, str(run_dir), "learner/1"), "host 1's learner process", 60)
        learner.send_signal(signal.SIGKILL)
        # Host 0's learner is stuck in a collective until the heartbeat aborts it; then both
        # supervisors restart their learner and the group restores the latest checkpoint.
        logs = [run_dir / "logs" / f"learner-{h}.log" for h in (0, 1)]
        while not all("restored step" in log.read_text() for log in logs):
            assert time.monotonic() < killed_at + 120, "the learner group did not come back"
            time.sleep(0.5)
        recovered_after = time.monotonic() - killed_at
        out0, out1 = finish(processes, timeout=420)
    assert processes[0][0].returncode == 0 and processes[1][0].returncode == 0, out0[-3000:] + out1[-3000:]
    assert "reached evaluation return 475" in out0, out0[-3000:]
    assert "host 1 stopped: host 0 stopped the program" in out1, out1[-3000:]  # the stop travelled
    texts = [log.read_text() for log in logs]
    for text in texts:
        assert "fresh start on 2 cpu device(s)" in text  # one SPMD learner over both hosts' devices
    # The monitor's stop ended both learners at one step (JAX's preemption sync point, reached
    # while the actors still fed them) and they saved it together. On host 0, where the stop
    # began, it is named a stop, not a preemption (host 1's learner may meet the sync point
    # before its launcher hears of the stop).
    stops = [re.findall(r"stopped at step (\d+): (?:preempted|the program is stopping) \(checkpoint saved\)", text)
             for text in texts]
    assert stops[0] and stops[0][-1] == stops[1][-1], stops
    assert "the program is stopping (checkpoint saved)" in texts[0] and ": preempted" not in texts[0].split(
        "restored step")[-1]
    saved = sorted(int(name) for name in os.listdir(checkpoints) if name.isdigit())
    assert saved[-1] == int(stops[0][-1])
    assert re.search(r"restarting actor/1 \(1 of \d+ in a row\) .* killed by SIGKILL", out1), out1[-3000:]
    assert re.search(r"restarting learner/1 \(1 of \d+ in a row\) .* killed by SIGKILL", out1), out1[-3000:]
    assert re.search(r"restarting learner/0 \(1 of \d+ in a row\)", out0), out0[-3000:]  # the heartbeat's abort
    restored = [re.findall(r"restored step (\d+)", log.read_text()) for log in logs]
    assert restored[0][0] == restored[1][0] and int(restored[0][0]) >= 10, restored
    print(f"\nlearner group back {recovered_after:.1f} s after the SIGKILL, at step {restored[0][0]}")
