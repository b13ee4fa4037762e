"""The paper examples' services under the concurrency courier really serves with: a server
answers calls on a pool of threads, so a service that keeps state must keep it safely."""

from __future__ import annotations

import collections
import os
import sys
from concurrent import futures

import pytest

from jaxdist import courier

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "experiments"))
import mapreduce_wordcount  # noqa: E402


@pytest.fixture
def frequent_thread_switches():
    """Switch threads every microsecond, so a read-modify-write race shows in a few calls."""
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(interval)


def test_a_reducer_served_on_many_threads_loses_no_count(frequent_thread_switches):
    partitions = [{f"w{i}": 1 for i in range(shard, shard + 2000)} for shard in range(0, 64, 4)]
    server = courier.Server(mapreduce_wordcount.Reducer(), thread_pool_size=8).start()
    client = courier.Client(server.address, timeout=60)
    try:
        with futures.ThreadPoolExecutor(8) as callers:
            list(callers.map(client.reduce, partitions * 4))
        expected = collections.Counter()
        for counts in partitions * 4:
            expected.update(counts)
        assert client.result() == dict(expected)
    finally:
        client.close()
        server.stop()
