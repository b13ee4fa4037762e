"""Chaos: PPO's learner is SIGKILLed again and again while it learns, from its first updates on,
and the run still reaches its target -- with parameters that a restarted learner published.

Kills come by learner progress (every ``KILL_EVERY`` updates, from the first ones), long before
the task is solved, so the updates that get the policy to the target are made by learners that
restored a checkpoint. The evaluator's ``evaluations.csv`` says which parameter version reached
the target; that version must be newer than the last restore. The restore accounting (every
restart resumes from the newest committed checkpoint) is checked from the learner's metrics.
"""

from __future__ import annotations

import os
import signal
import time

import pytest

import jaxdist as jd
from jaxdist import courier
from jaxdist.agents import experiment, ppo
from jaxdist.learning.layout import checkpoint_dir
from jaxdist.records.metrics import metrics_path, read_metrics
from resume_checks import committed_steps

pytestmark = pytest.mark.slow

KILLS = 4
KILL_EVERY = 4  # learner updates between kills (a checkpoint every 4)
TARGET = 475.0


def learner_log_tail(run_dir: str, lines: int = 30) -> str:
    with open(jd.log_path(run_dir, "learner/0")) as log:
        return "".join(log.readlines()[-lines:])


def learner_step(client: courier.Client) -> int | None:
    try:
        return int(client.status()["step"])
    except Exception:  # noqa: BLE001 - away while it restarts
        return None


@pytest.mark.timeout(600)
def test_ppo_reaches_its_target_through_learners_restarted_from_sigkills_during_learning(tmp_path):
    run_dir = str(tmp_path)
    # A slower learning rate than the preset's: the task takes ~250 updates, the kills end by ~25.
    # (At 5e-4, with kills every 8, version 16 once reached the target before the fourth kill.)
    config = ppo.PPOConfig(total_steps=3_000_000, learning_rate=2e-4, anneal_lr=False, seed=2,
                           checkpoint_every_updates=4, eval_every_updates=4, target_return=TARGET,
                           stop_at_target=True)
    topology = ppo.agent(config).topology()
    running = jd.launch(topology.program, launcher="processes", run_dir=run_dir, echo=False,
                        resources=experiment.resources(topology.program, str(tmp_path / "jax-cache")),
                        restart={"learner": jd.Restart(max_restarts=KILLS, backoff=0.5),
                                 "actor": jd.Restart(max_restarts=0)})
    learner = courier.Client(running.addresses[topology.learner.node_name], token=running.token, timeout=2.0)
    checkpoints = checkpoint_dir(run_dir, topology.learner.node_name)
    kills: list[dict] = []
    try:
        next_kill_at = KILL_EVERY
        deadline = time.monotonic() + 300
        # A program that ended (a node failed: `wait` raises its failure) ends the kills too.
        while len(kills) < KILLS and time.monotonic() < deadline and not running.wait(timeout=0):
            step, pid = learner_step(learner), running.status()["learner/0"]["pid"]
            committed = committed_steps(checkpoints)
            # Each kill after a checkpoint of this life committed (saves are asynchronous), so every
            # restart restores one.
            if step is not None and pid is not None and step >= next_kill_at and committed \
                    and committed[-1] > (kills[-1]["committed_before"] if kills else -1):
                os.kill(pid, signal.SIGKILL)
                kills.append({"at": time.time(), "step_before": step,
                              "committed_before": committed[-1] if committed else None})
                next_kill_at = step + KILL_EVERY
            time.sleep(0.05)
        assert len(kills) == KILLS, (kills, running.status(), learner_log_tail(run_dir))
        assert running.wait(timeout=400), "the run did not reach its target"  # the evaluator stops it there
        status = running.status()
    finally:
        running.stop()
        learner.close()
    assert status["learner/0"]["restarts"] == KILLS, status
    assert all(s["restarts"] == 0 for name, s in status.items() if name.startswith("actor/")), status

    evaluations = read_metrics(metrics_path(run_dir, "evaluations"))
    solved = [row for row in evaluations if row["mean_return"] >= TARGET]
    assert solved, evaluations
    before_last_kill = [row["mean_return"] for row in evaluations if row["wall_time"] < kills[-1]["at"]]
    assert max(before_last_kill, default=0.0) < TARGET, ("solved before the kills ended", evaluations, kills)

    rows = read_metrics(metrics_path(run_dir))
    steps = [row["step"] for row in rows]
    assert steps == sorted(set(steps)), "a resumed life's rows are not doubled or out of order"
    restores = [int(row["learner/restored_step"]) for row in rows if row.get("learner/restored_step") is not None]
    assert len(restores) == KILLS, (restores, kills)
    for kill, restored in zip(kills, restores):
        # The newest checkpoint committed at the kill: at least the one on disk just before it,
        # and none the learner had not reached yet.
        assert kill["committed_before"] is not None and restored >= kill["committed_before"], (kill, restored)
        assert restored <= kill["step_before"] + config.checkpoint_every_updates
    # The target was reached by parameters the last restarted learner published after its restore.
    assert solved[0]["step"] > restores[-1], (solved[0], restores)
    print(f"\n{KILLS} kills at learner steps {[k['step_before'] for k in kills]}; restored at {restores}; "
          f"target reached by version {solved[0]['step']} ({solved[0]['mean_return']:.1f})")
