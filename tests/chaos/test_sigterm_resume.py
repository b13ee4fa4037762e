"""Chaos: SIGTERM to an agent's script while it trains on the processes launcher, then the same
command again on the same run directory: the relaunch carries on from exactly the state saved at
the stop, leaf for leaf.

Ape-X's relaunched learner and replay hold, once restored, exactly what the stop saved: the
learner's step, parameters, target parameters and optimizer state, and the replay's items,
priorities, times sampled, rate limiter's counts and sampler's RNG; the env steps the monitor
counts on from are those the stop counted. What the relaunched nodes hold is written down by
an observer the node processes import (``tests/support/restore_observer``).

ES is deterministic (its noise and start states are drawn from the seed and the generation), so
its relaunched run must end where a run that never stopped ends: the mean parameters, the
optimizer's moments, the generation and the env-step count, to the bit. Anything the stop left
unsaved, or the relaunch restored otherwise, makes them differ.
"""

from __future__ import annotations

import io
import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import chex
import numpy as np
import pytest

from jaxdist.agents import es
from jaxdist.agents.run import parse, train
from resume_checks import (assert_same_leaves, committed_steps, flat_leaves, observed_environment, rows_so_far,
                           saved_state, saved_tables)
from waiting import wait_until

pytestmark = pytest.mark.slow

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def script(name: str, run_dir: str, flags: list[str], observe: str | None = None) -> subprocess.Popen:
    """The agent's script, as a user runs it; with `observe`, its nodes write what they restore there."""
    env = dict(os.environ) if observe is None else observed_environment(observe)
    return subprocess.Popen([sys.executable, os.path.join(REPO, "experiments", name), "--run-dir", run_dir, "--quiet",
                             "--compilation-cache", "", *flags], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env=env)


def sigterm_once(name: str, run_dir: str, flags: list[str], condition: Callable[[], Any], what: str,
                 observe: str | None = None) -> str:
    """The script run until `condition()`, then SIGTERM, as a scheduler's preemption: the launch
    stops in order and exits 0. Its output."""
    launch = script(name, run_dir, flags, observe)
    try:
        wait_until(condition, what, timeout=240)
        launch.send_signal(signal.SIGTERM)
        output, _ = launch.communicate(timeout=180)
    finally:
        launch.kill()
    assert launch.returncode == 0, output[-3000:]
    return output


def logged(run_dir: str, rows: int) -> Callable[[], bool]:
    return lambda: len(rows_so_far(os.path.join(run_dir, "metrics.csv"))) >= rows


@pytest.mark.timeout(400)
def test_es_relaunched_after_a_sigterm_ends_exactly_where_a_run_that_never_stopped_does(tmp_path):
    # Stopped once its save of generation 25 is committed (metrics.csv, flushed every 5 s, would
    # say so only after a run this short has ended); the stop saves the generation it is at.
    flags = ["--total-steps", "1000000", "--seed", "3", "--num-workers", "1", "--population", "32", "--eval-episodes", "4",
             "--checkpoint-every-generations", "25"]
    run_dir, whole_dir = str(tmp_path / "stopped"), str(tmp_path / "whole")
    checkpoints = os.path.join(run_dir, "checkpoints", "master", "0")
    output = sigterm_once("es.py", run_dir, flags, lambda: 25 in committed_steps(checkpoints), "generation 25's save")
    stopped_at, state = saved_state(checkpoints)
    assert "the launcher got SIGTERM" in output, output[-3000:]
    assert state["generation"] == stopped_at >= 25 and state["env_steps"] < 1_000_000

    relaunch = script("es.py", run_dir, flags)
    output, _ = relaunch.communicate(timeout=300)
    assert relaunch.returncode == 0, output[-3000:]
    assert f"resuming from the learner's checkpoint at update {stopped_at} (" in output, output[-3000:]

    config, _ = parse(es.ESConfig, es.PRESETS, None, args=flags)
    train(es.agent(config), launcher="threads", run_dir=whole_dir, echo=False, out=io.StringIO())
    end, resumed = saved_state(checkpoints)
    assert end > stopped_at and resumed["env_steps"] >= 1_000_000
    chex.assert_trees_all_equal(resumed, saved_state(os.path.join(whole_dir, "checkpoints", "master", "0"))[1])
    # One metrics row per generation across both segments, as the run that never stopped wrote them.
    learned = ("step", "population_return", "population_best", "grad_norm", "env_steps")
    assert [[row[k] for k in learned] for row in rows_so_far(os.path.join(run_dir, "metrics.csv"))] == \
        [[row[k] for k in learned] for row in rows_so_far(os.path.join(whole_dir, "metrics.csv"))]


@pytest.mark.timeout(400)
def test_apex_relaunched_after_a_sigterm_restores_its_learner_and_replay_exactly_as_the_stop_saved_them(tmp_path):
    flags = ["--num-actors", "2", "--envs-per-actor", "4", "--total-steps", "1000000", "--min-replay", "500",
             "--seed", "2", "--log-every-updates", "20", "--checkpoint-every-updates", "100000",
             "--replay-checkpoint-seconds", "100000"]  # only the stop saves
    run_dir, restores = str(tmp_path / "run"), tmp_path / "restores"
    learner_dir, replay_dir = (os.path.join(run_dir, "checkpoints", "learner", "0", part) for part in ("1", "0"))
    sigterm_once("apex_dqn.py", run_dir, flags, logged(run_dir, 2), "40 learner updates")
    log = open(os.path.join(run_dir, "logs", "learner-0.log")).read()
    stopped_at = int(re.findall(r"learner/0/1: stopped at step (\d+): .* \(checkpoint saved\)", log)[-1])
    step, learner = saved_state(learner_dir)
    assert step == stopped_at >= 40 and committed_steps(learner_dir) == [stopped_at]  # the stop's own save
    (table_step,) = committed_steps(replay_dir)  # the stop's, after the learner's last priorities
    arrays, meta = saved_tables(replay_dir, table_step)
    counters = meta["tables"]["default"]["values"]["counters"]
    assert counters["inserts"] >= 500 and counters["samples"] >= stopped_at * 128, counters
    env_steps = json.loads(open(os.path.join(run_dir, "summary.json")).read())["env_steps"]

    restores.mkdir()
    output = sigterm_once("apex_dqn.py", run_dir, flags,
                          lambda: {"learner-0.npz", f"replay-{table_step}.json"} <= set(os.listdir(restores)),
                          "the relaunched learner and replay to restore", observe=str(restores))
    assert f"resuming from the learner's checkpoint at update {stopped_at} ({env_steps:,} env steps" in output, \
        output[-3000:]
    with np.load(restores / "learner-0.npz") as restored:
        assert_same_leaves(dict(restored), flat_leaves(learner), "the learner's state")
    with np.load(restores / f"replay-{table_step}.npz") as restored:
        assert_same_leaves(dict(restored), arrays, "the replay's arrays")
    assert json.loads((restores / f"replay-{table_step}.json").read_text()) == meta  # counters, items' structure
