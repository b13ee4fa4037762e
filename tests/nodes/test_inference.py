"""Central batched inference: an inference node answers many actors' observations with one
policy call per batch, with the parameters it follows; actors act through it as through their
own policy, and ride out its restarts."""

from __future__ import annotations

import threading

import jax
import numpy as np
import pytest

import jaxdist as jd
from jaxdist import courier
from jaxdist.courier.errors import UnavailableError
from jaxdist.agents.actor_critic import ActorCritic, ActorCriticPolicy, log_prob
from jaxdist.envs.spaces import ActionSpace, EnvInfo
from jaxdist.envs.vector import EnvSpec
from jaxdist.nodes.actor import Actor, InferenceClient
from jaxdist.nodes.inference import InferenceServer
from jaxdist.nodes.parameter_server import ParameterServer
from waiting import wait_until

CARTPOLE = EnvInfo((4,), "float32", ActionSpace(num_actions=2))
NETWORK = ActorCritic(action=CARTPOLE.action, hidden=(8,))
POLICY = ActorCriticPolicy(CARTPOLE, "mlp", (8,))


def params(seed: int = 0) -> dict:
    return {"network": jax.tree.map(np.asarray, NETWORK.init(jax.random.key(seed), np.zeros((1, 4), np.float32)))}


def test_concurrent_callers_are_answered_in_one_policy_call_each_with_its_own_rows():
    published = params(3)
    server = InferenceServer(POLICY, ParameterServer(published, version=5), max_callers=3, batch_timeout=5.0)
    rng = np.random.default_rng(0)
    observations = [rng.normal(size=(4, 4)).astype(np.float32) for _ in range(3)]
    answers: list = [None] * 3
    callers = [threading.Thread(target=lambda i=i: answers.__setitem__(i, server.act(observations[i])))
               for i in range(3)]
    for caller in callers:
        caller.start()
    for caller in callers:
        caller.join(60)
    assert server.stats() == {"batches": 1, "version": 5}  # three callers, one policy call
    for obs, (action, extras, version) in zip(observations, answers):
        assert action.shape == (4,) and version == 5
        dist = NETWORK.apply(published["network"], obs, method="policy")
        np.testing.assert_allclose(extras["logp"], log_prob(CARTPOLE.action, dist, action), rtol=1e-5, atol=1e-6)
    server.close()


def test_an_actor_takes_an_inference_node_or_its_own_policy_and_never_both():
    with pytest.raises(ValueError, match="runs its own policy .* or asks an inference node"):
        Actor(POLICY, EnvSpec("CartPole-v1", 2), ParameterServer(params(), version=0), inference=object())
    with pytest.raises(ValueError, match="JAX-backend actor plays its policy inside each trajectory's jitted scan"):
        Actor(None, EnvSpec("CartPole-v1", 2, "jax"), None, inference=object())


def test_actors_of_a_program_act_through_the_inference_node_with_its_versions(tmp_path):
    received: list[list[dict]] = []
    lock = threading.Lock()

    def sink(items: list[dict]) -> None:
        with lock:
            received.append(items)

    program = jd.Program("central-inference")
    source = program.add_node(jd.CourierNode(ParameterServer, params(), version=9), label="params")
    inference = program.add_node(jd.CourierNode(InferenceServer, POLICY, source, max_callers=2), label="inference")
    with program.group("actor"):
        for index in range(2):
            program.add_node(jd.CourierNode(Actor, None, EnvSpec("CartPole-v1", 3), None, sink, trajectory_length=8,
                                            seed=index, inference=inference))
    running = jd.launch(program, launcher="threads", run_dir=str(tmp_path), echo=False)
    try:
        wait_until(lambda: len(received) >= 10, "the actors' trajectories")
        actors = [courier.Client(running.addresses[f"actor/{i}"], token=running.token) for i in range(2)]
        choices = lambda: [stats["env_steps"] // 3 + 1 for stats in (actor.stats() for actor in actors)]  # noqa: E731
        before = choices()
        served = courier.Client(running.addresses["inference/0"], token=running.token).stats()
        after = choices()
    finally:
        running.stop()
    assert served["version"] == 9
    for items in received:
        assert len(items) == 3 and all(item["version"].tolist() == [9] * 9 for item in items)
        assert all(item["logp"].shape == (9,) and (item["logp"] <= 0).all() for item in items)
    # Every choice (a warm-up's, then one a step) came from the node, some in one call for both.
    assert max(before) <= served["batches"] <= sum(after)


class Restarting:
    """An inference node that is away for its first ``away`` calls (the exact fault: a restart)."""

    def __init__(self, away: int) -> None:
        self.away = away

    def act(self, obs):
        if self.away:
            self.away -= 1
            raise UnavailableError("restarting")
        return np.zeros(len(obs), np.int32), {}, 4


def test_an_actor_rides_out_an_inference_node_that_is_away_and_counts_the_misses():
    client = InferenceClient(Restarting(away=3), retry_for=30.0)
    action, extras, version = client.act(np.zeros((2, 4), np.float32))
    assert action.tolist() == [0, 0] and version == client.version == 4 and client.stats == {"errors": 3}
    with pytest.raises(ConnectionError):
        InferenceClient(Restarting(away=100), retry_for=0.3).act(np.zeros((2, 4), np.float32))
