"""Chaos: PPO on CartPole while its learner is SIGKILLed every 20-40 s for three minutes.

The learner process (which also holds the FIFO queue) is killed at random moments; the
supervisor restarts it from its latest checkpoint while the actors keep acting with the
parameters they hold and retry their sends. The run must still solve CartPole (mean return of
the last 20 episodes >= 475, all of them ended after the last restart), and every restart must
have resumed at the latest checkpoint committed before its kill: that is read from the
learner's own metrics (the first row of each life records ``learner/restored_step``), not
assumed from the launcher.
"""

from __future__ import annotations

import io
import os
import random
import signal
import time

import pytest

import jaxdist as jd
from jaxdist import courier
from jaxdist.agents import training
from jaxdist.agents.ppo import PPOConfig, builder
from jaxdist.checkpoint import checkpoint_dir
from jaxdist.metrics import metrics_path, read_metrics

pytestmark = pytest.mark.slow

CHAOS_SECONDS = 180
KILL_EVERY = (20.0, 40.0)
LEARNER_UNIT = "learner/0"


def committed_steps(run_dir: str) -> list[int]:
    directory = checkpoint_dir(run_dir, builder.LEARNER)
    return sorted(int(name) for name in os.listdir(directory) if name.isdigit()) if os.path.isdir(directory) else []


def learner_step(client: courier.Client) -> int | None:
    try:
        return int(client.status()["step"])
    except Exception:  # noqa: BLE001 - away while it restarts
        return None


@pytest.mark.timeout(600)
def test_ppo_still_solves_cartpole_while_its_learner_is_sigkilled_every_20_to_40_seconds(tmp_path):
    run_dir = str(tmp_path)
    # A constant learning rate: the run's length is set by the clock, not by a step budget.
    config = PPOConfig(total_steps=10**9, anneal_lr=False, seed=2, checkpoint_every_updates=20)
    spec = training.RunSpec(
        agent="ppo", env_id=config.env_id, seed=config.seed, learner=builder.LEARNER,
        total_updates=config.total_updates, steps_per_update=config.steps_per_update)
    running = jd.launch(
        builder.make_program(config), launcher="processes", run_dir=run_dir, echo=False,
        resources=builder.resources(config, compilation_cache=str(tmp_path / "jax-cache")),
        # Lives of 20-40 s are healthy ones (reset_after): every kill is a first crash, restarted at once.
        restart={"learner": jd.Restart(max_restarts=5, backoff=0.5, reset_after=5),
                 "actor": jd.Restart(max_restarts=0)})
    out = io.StringIO()
    monitor = training.Monitor(running, spec, run_dir, time.time(), out=out)
    learner = courier.Client(running.addresses[builder.LEARNER], token=running.token, timeout=2.0)
    rng = random.Random(7)
    kills: list[dict] = []
    try:
        chaos_ends = time.monotonic() + CHAOS_SECONDS
        next_kill = time.monotonic() + rng.uniform(*KILL_EVERY)
        while time.monotonic() < chaos_ends:
            monitor.poll()
            pid = running.status()[LEARNER_UNIT]["pid"]  # None while it restarts
            if time.monotonic() >= next_kill and pid is not None:
                step, committed = learner_step(learner), committed_steps(run_dir)
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:  # it exited just now: the supervisor will say why
                    continue
                kills.append({"at": time.time(), "step_before": step,
                              "committed_before": committed[-1] if committed else None})
                next_kill = time.monotonic() + rng.uniform(*KILL_EVERY)
            time.sleep(0.2)
        last_kill = kills[-1]["at"]
        recovered = time.monotonic() + 150
        while time.monotonic() < recovered:  # the return, from episodes that ended after the last kill
            monitor.poll()
            recent = monitor.returns_since(last_kill)
            if len(recent) >= 20 and sum(recent[-20:]) / 20 >= 475:
                break
            time.sleep(0.2)
        status = running.status()
    finally:
        running.stop()
        monitor.close()
        learner.close()
    assert len(kills) >= 4, kills
    assert status[LEARNER_UNIT]["restarts"] == len(kills), status
    assert all(s["restarts"] == 0 for name, s in status.items() if name.startswith("actor/")), status
    assert len(recent) >= 20 and sum(recent[-20:]) / 20 >= 475, (kills, out.getvalue()[-3000:])

    rows = read_metrics(metrics_path(run_dir))
    steps = [row["step"] for row in rows]
    assert steps == sorted(set(steps)), "a resumed life's rows are not doubled or out of order"
    restores = [int(row["learner/restored_step"]) for row in rows if row.get("learner/restored_step") is not None]
    assert len(restores) == len(kills), (restores, kills)
    for kill, restored in zip(kills, restores):
        # The newest checkpoint committed at the kill: at least the one on disk just before it,
        # and none the learner had not reached yet.
        assert kill["committed_before"] is not None and restored >= kill["committed_before"], (kill, restored)
        assert kill["step_before"] is None or restored <= kill["step_before"] + config.checkpoint_every_updates
    print(f"\n{len(kills)} kills; restored at {restores}; final return "
          f"{sum(recent[-20:]) / 20:.1f}; {monitor.env_steps:,} env steps")
