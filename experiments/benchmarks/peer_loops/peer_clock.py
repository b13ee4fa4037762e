"""What ``experiments/benchmarks/peers.py`` reads from a peer loop, the same for every loop (it
imports nothing but the standard library, so each peer's venv has it), and what it tells one
(the target return, ``PEERS_TARGET``, and how often to evaluate, ``PEERS_EVAL_EVERY``): wall time
from the launch (``PEERS_LAUNCHED``) to the first evaluation at the target, env steps then, and the
steady training rate from the first update on, printed as one ``PEER_RESULT`` line: at the end of
the run, or when it is stopped (SIGTERM: a peer past the benchmark's time limit), as far as it
got. A peer evaluates in its training loop (jaxdist's evaluator runs beside it): the time spent
in `evaluate` counts towards the wall time to the target, not against the training rate."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from typing import Callable

TARGET = float(os.environ.get("PEERS_TARGET", "475"))
EVAL_EVERY = int(os.environ.get("PEERS_EVAL_EVERY", "2048"))  # env steps (off-policy: updates) between evaluations
EVAL_EPISODES, MAX_ENV_STEPS = 10, 1_000_000


class Clock:
    def __init__(self) -> None:
        self.launched = float(os.environ.get("PEERS_LAUNCHED", time.time()))
        self.first_update: tuple[float, int] | None = None
        self.reached: tuple[float, int] | None = None
        self.env_steps = 0
        self.evaluating_seconds = 0.0  # since the first update
        signal.signal(signal.SIGTERM, self.stopped)

    def stopped(self, *_) -> None:
        self.report(self.env_steps)
        sys.exit(0)

    def updated(self, env_steps: int) -> None:
        """After each update, its results computed (JAX dispatches ahead: block on them first, or
        the evaluation after it waits for the update and counts its time)."""
        self.env_steps = env_steps
        if self.first_update is None:
            self.first_update = (time.time(), env_steps)

    def evaluate(self, evaluation: Callable[[], float], env_steps: int) -> bool:
        """Runs ``evaluation`` (the mean return of the deterministic policy) and says whether it
        is at the target (the run stops there)."""
        started = time.time()
        mean_return = evaluation()
        if self.first_update is not None:
            self.evaluating_seconds += time.time() - started
        if mean_return >= TARGET and self.reached is None:
            self.reached = (time.time() - self.launched, env_steps)
        return self.reached is not None

    def report(self, env_steps: int) -> None:
        t0, s0 = self.first_update or (time.time(), env_steps)
        training = time.time() - t0 - self.evaluating_seconds
        rate = (env_steps - s0) / training if training > 0 else None
        print("PEER_RESULT " + json.dumps({
            "wall_time_to_target": None if self.reached is None else round(self.reached[0], 2),
            "steps_to_target": None if self.reached is None else self.reached[1],
            "env_steps": env_steps, "steps_per_second": None if rate is None else round(rate)}), flush=True)
