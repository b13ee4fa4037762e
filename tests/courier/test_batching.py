"""batched_handler over courier: calls from many clients served as one batched call, each caller
getting its row, and no deadlock when the callers outnumber the server's threads; a served
``__call__``."""

from __future__ import annotations

import threading
from concurrent import futures

import numpy as np
import pytest

from jaxdist import courier


class Policy:
    """Central inference: one evaluation for every caller's observation."""

    def __init__(self) -> None:
        self.batch_sizes: list[int] = []

    @courier.batched_handler(batch_size=4, timeout=5.0)
    def act(self, observation, step):
        self.batch_sizes.append(len(observation))
        return {"action": observation.sum(axis=1), "step": np.asarray(step) * 10}

    def sizes(self):
        return self.batch_sizes


def call_concurrently(call, count: int) -> list:
    with futures.ThreadPoolExecutor(count) as pool:
        return list(pool.map(call, range(count)))


def test_concurrent_calls_run_as_one_batch_and_each_caller_gets_its_row():
    server = courier.Server(Policy()).start()
    client = courier.Client(server.address, timeout=30)
    try:
        results = call_concurrently(lambda i: client.act(np.full(3, float(i), np.float32), step=i), 4)
        assert [float(r["action"]) for r in results] == [0.0, 3.0, 6.0, 9.0]
        assert [int(r["step"]) for r in results] == [0, 10, 20, 30]
        assert client.sizes() == [4]  # one call of the function for the four callers
    finally:
        server.stop(grace=0)


def test_callers_beyond_the_thread_pool_are_served_in_smaller_batches_after_the_timeout():
    class Doubler:
        def __init__(self) -> None:
            self.double = courier.batched_handler(batch_size=8, timeout=0.05)(self.double)  # Launchpad's way
            self.batch_sizes: list[int] = []

        def double(self, values):
            self.batch_sizes.append(len(values))
            return np.asarray(values) * 2

        def sizes(self):
            return self.batch_sizes

    server = courier.Server(Doubler(), thread_pool_size=2).start()
    client = courier.Client(server.address, timeout=30)
    try:
        assert call_concurrently(lambda i: int(client.double(i)), 16) == [2 * i for i in range(16)]
        sizes = client.sizes()
        assert sum(sizes) == 16 and max(sizes) <= 2  # two threads: batches of at most two, never stuck
    finally:
        server.stop(grace=0)


def test_a_timed_out_batch_is_padded_to_its_size_and_runs_at_most_max_parallelism_at_once():
    running, most = [0], [0]
    lock = threading.Lock()

    @courier.batched_handler(batch_size=4, max_parallelism=2, timeout=0.01, pad_batch=True)
    def square(x):
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        assert len(x) == 4  # padded
        threading.Event().wait(0.05)
        with lock:
            running[0] -= 1
        return np.asarray(x) ** 2

    assert call_concurrently(lambda i: int(square(i)), 10) == [i * i for i in range(10)]
    assert most[0] <= 2


def test_an_error_reaches_every_caller_of_the_batch_and_the_handler_goes_on():
    @courier.batched_handler(batch_size=2, timeout=5.0)
    def strict(x):
        if 3 in x:
            raise ValueError("no threes")
        return x

    with pytest.raises(ValueError, match="no threes"):
        call_concurrently(lambda i: strict(i + 2), 2)
    assert call_concurrently(lambda i: strict(i), 2) == [0, 1]

    @courier.batched_handler(batch_size=2, timeout=5.0)
    def short(x):
        return x[:1]

    with pytest.raises(ValueError, match="one row per call: got 1 rows for 2 calls"):
        call_concurrently(short, 2)


def test_a_caller_whose_arguments_differ_in_shape_or_structure_cannot_fail_the_others_batch():
    server = courier.Server(Policy()).start()
    client = courier.Client(server.address, timeout=30)
    odd = {3: np.ones(4, np.float32), 6: np.ones((2, 2), np.float32)}  # another shape, another rank

    def call(i: int):
        try:
            if i in odd:
                return client.act(odd[i], step=i)
            if i == 7:
                return client.act(np.ones(3, np.float32), i)  # the step by position, not by name
        except Exception as error:  # noqa: BLE001 - an odd caller may fail; it alone
            return error
        return client.act(np.full(3, float(i), np.float32), step=i)

    try:
        results = call_concurrently(call, 8)
        honest = [i for i in range(8) if i not in odd and i != 7]
        assert [float(results[i]["action"]) for i in honest] == [3.0 * i for i in honest]
        assert [int(results[i]["step"]) for i in honest] == [10 * i for i in honest]
    finally:
        server.stop(grace=0)


def test_instances_batch_separately():
    first, second = Policy(), Policy()
    assert first.act is not second.act
    assert first.act is first.act


def test_a_callable_object_is_served_as_itself():
    class Scale:
        def __init__(self, factor: float) -> None:
            self.factor = factor

        def __call__(self, x):
            return x * self.factor

    server = courier.Server(Scale(3.0)).start()
    client = courier.Client(server.address, timeout=10)
    try:
        assert client(2.0) == 6.0
        assert client.futures(4.0).result(timeout=10) == 12.0
        assert "__call__" in client.methods()
    finally:
        server.stop(grace=0)
    server = courier.Server(Policy()).start()
    try:
        with pytest.raises(courier.UnknownMethodError, match="not callable"):
            courier.Client(server.address, timeout=10)(1)
    finally:
        server.stop(grace=0)
