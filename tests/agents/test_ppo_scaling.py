"""PPO on CartPole while its actor group grows 2 -> 4 -> 1 (`running.scale`) under `processes`:
the new actors act and are counted by the monitor, the removed ones' in-flight sends harm
nothing, and the learner learns on throughout."""

from __future__ import annotations

import io
import time

import pytest

import jaxdist as jd
from jaxdist.agents import experiment, ppo
from jaxdist.agents.run import Monitor

pytestmark = pytest.mark.slow


@pytest.mark.timeout(600)
def test_ppo_learns_on_while_its_actor_group_grows_from_2_to_4_and_shrinks_to_1(tmp_path):
    # A small learning rate, so that learning spans the scaling (CartPole's preset solves in seconds).
    config = ppo.PPOConfig(num_actors=2, envs_per_actor=8, learning_rate=3e-4, anneal_lr=False, total_steps=10**8,
                           eval_every_updates=5, target_return=475.0, stop_at_target=False)
    agent = ppo.agent(config)
    topology = agent.topology()
    run_dir = str(tmp_path)
    running = jd.launch(topology.program, launcher="processes", run_dir=run_dir, echo=False,
                        resources=experiment.resources(topology.program))
    monitor = Monitor(running, agent, topology, run_dir, time.time(), out=io.StringIO())
    evaluations: list[tuple[float, float]] = []  # (learner version, evaluation return) as each appears

    def poll_until(condition, what: str, timeout: float = 180.0) -> None:
        deadline = time.monotonic() + timeout
        while not condition():
            assert not running.wait(timeout=0.1), f"the program ended: {running.stop_reason}"
            assert time.monotonic() < deadline, f"timed out waiting for {what}; status {running.status()}"
            monitor.poll()
            if monitor.eval_return is not None and (not evaluations or evaluations[-1][1] != monitor.eval_return):
                evaluations.append((monitor.version, monitor.eval_return))

    def actor_steps() -> dict[str, int]:
        return {name: running.client(name, timeout=5).stats()["env_steps"] for name in running.members("actor")}

    try:
        poll_until(lambda: monitor.version >= 5, "the first updates")
        assert list(actor_steps()) == ["actor/0", "actor/1"]

        grown_at = time.monotonic()
        assert running.scale("actor", 4) == ["actor/2", "actor/3"]
        print(f"grown to 4 actors in {time.monotonic() - grown_at:.1f} s")
        version = monitor.version
        poll_until(lambda: min(actor_steps().values()) > 2_000, "every actor, the new ones too, to act")
        counted = actor_steps()
        poll_until(lambda: monitor.env_steps >= sum(counted.values()), "the monitor to count the new actors")
        poll_until(lambda: monitor.version >= version + 10, "the learner to learn from four actors")

        steps, version = monitor.env_steps, monitor.version
        shrunk_at = time.monotonic()
        assert running.scale("actor", 1) == ["actor/3", "actor/2", "actor/1"]
        print(f"shrunk to 1 actor in {time.monotonic() - shrunk_at:.1f} s")
        assert running.members("actor") == ["actor/0"]
        assert {name for name in running.status() if name.startswith("actor/")} == {"actor/0"}
        monitor.poll()
        assert monitor.env_steps >= steps  # the removed actors' steps stay counted
        alone = actor_steps()["actor/0"]
        poll_until(lambda: monitor.version >= version + 20 and actor_steps()["actor/0"] > alone + 5_000,
                   "one actor and the learner to go on")
        poll_until(lambda: monitor.solved_at is not None or monitor.version >= version + 400,
                   "the target (475) or 400 more updates", timeout=300)
        assert running.status()["learner/0"]["restarts"] == 0  # the removed actors' sends harmed nothing
        print(f"evaluations (version, return): {evaluations}; solved at {monitor.solved_at}")
        first, best = evaluations[0][1], max(value for _, value in evaluations)
        assert monitor.solved_at is not None or best > first + 100, evaluations
    finally:
        running.stop()
        monitor.poll(final=True)
        monitor.close()
