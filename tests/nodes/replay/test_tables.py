import collections
import threading

import numpy as np
import pytest

from jaxdist.nodes.replay import (Fifo, MinSize, Prioritized, SampleToInsertRatio, TableClosedError,
                                  Uniform)
from jaxdist.nodes.replay.tables import MAX_SIGNATURES
from waiting import run_threads, wait_until

Step = collections.namedtuple("Step", "obs reward")


def item(writer: int, seq: int) -> dict:
    """A small trajectory-like pytree whose contents identify it."""
    return {"id": np.array([writer, seq]), "step": Step(np.full((2, 3), seq, np.float32), float(writer))}


def once(condition, fn) -> None:
    """Calls ``fn()`` on another thread once ``condition()`` holds (a waiter is waiting, say)."""
    threading.Thread(target=lambda: (wait_until(condition), fn()), daemon=True).start()


# --- Fifo ---------------------------------------------------------------------------------------

def test_fifo_delivers_each_item_once_in_insertion_order_stacked():
    queue = Fifo(max_size=8)
    keys = [queue.insert(item(0, i)) for i in range(5)]
    assert keys == list(range(5))
    first, second = queue.sample(3), queue.sample(2)
    np.testing.assert_array_equal(first.keys, [0, 1, 2])
    assert first.keys.dtype == np.int64 and first.probabilities is None
    np.testing.assert_array_equal(first.data["id"], [[0, 0], [0, 1], [0, 2]])
    assert isinstance(first.data["step"], Step) and first.data["step"].obs.shape == (3, 2, 3)
    np.testing.assert_array_equal(second.data["step"].reward, [0.0, 0.0])
    assert queue.size() == 0 and queue.stats()["samples"] == 5


def test_fifo_insert_blocks_while_full_until_a_sample_frees_space():
    queue = Fifo(max_size=2)
    queue.insert(item(0, 0))
    queue.insert(item(0, 1))
    with pytest.raises(TimeoutError, match=r"Fifo is full \(2 items\).*sample faster"):
        queue.insert(item(0, 2), timeout=0.05)
    once(lambda: queue.stats()["insert_waits"] == 2, lambda: queue.sample(1))
    assert queue.insert(item(0, 2), timeout=60) == 2
    assert queue.stats()["insert_waits"] == 2 and queue.stats()["timeouts"] == 1


def test_fifo_sample_waits_for_exactly_batch_size_items():
    queue = Fifo(max_size=4)
    queue.insert(item(0, 0))
    with pytest.raises(TimeoutError, match="Fifo holds 1 of the 2 items"):
        queue.sample(2, timeout=0.05)
    once(lambda: queue.stats()["sample_waits"] == 2, lambda: queue.insert(item(0, 1)))
    np.testing.assert_array_equal(queue.sample(2, timeout=60).keys, [0, 1])


def test_fifo_refuses_a_batch_it_could_never_fill_instead_of_hanging():
    queue = Fifo(max_size=64)
    with pytest.raises(ValueError, match=r"batch_size 100 can never be sampled at once under Queue\(64\), and "
                                         r"Fifo\(max_size=64\) removes what it samples"):
        queue.sample(100)


def test_fifo_under_concurrent_writers_and_samplers_loses_and_repeats_nothing():
    writers, per_writer, batch = 4, 150, 5
    queue = Fifo(max_size=16)
    acknowledged, delivered = {}, []  # key -> (writer, seq); batches of keys
    done = threading.Event()

    def writer(w):
        for seq in range(per_writer):
            acknowledged[queue.insert(item(w, seq), timeout=10)] = (w, seq)

    def sampler():
        while not (done.is_set() and queue.size() < batch):
            try:
                sample = queue.sample(batch, timeout=0.05)
            except TimeoutError:
                continue
            delivered.append(sample)

    def writers_then_done():
        run_threads(*[lambda w=w: writer(w) for w in range(writers)])
        done.set()

    run_threads(writers_then_done, sampler, sampler)
    remaining = queue.sample(queue.size()) if queue.size() else None
    keys = np.concatenate([s.keys for s in delivered] + ([remaining.keys] if remaining else []))
    assert sorted(keys.tolist()) == sorted(acknowledged) == list(range(writers * per_writer))
    for sample in delivered:  # a batch is a contiguous run of the queue, its data that of its keys
        np.testing.assert_array_equal(np.diff(sample.keys), 1)
        np.testing.assert_array_equal(sample.data["id"], [acknowledged[k] for k in sample.keys.tolist()])
    for w in range(writers):  # each writer's items come out in the order it wrote them
        seqs = [acknowledged[k][1] for k in sorted(acknowledged) if acknowledged[k][0] == w]
        assert seqs == list(range(per_writer))


# --- Uniform and Prioritized ----------------------------------------------------------------------

@pytest.mark.parametrize("max_size", [1000, 64], ids=["no-eviction", "eviction"])
@pytest.mark.parametrize("kind", [Uniform, Prioritized])
def test_concurrent_inserts_samples_and_updates_keep_every_item_intact(kind, max_size):
    table, writers, per_writer = kind(max_size, seed=0), 3, 150
    acknowledged = {}
    done = threading.Event()

    def writer(w):
        for seq in range(per_writer):
            acknowledged[table.insert(item(w, seq), timeout=10)] = (w, seq)

    def sampler():
        while not done.is_set():
            sample = table.sample(8, timeout=10)
            for key, ident in zip(sample.keys.tolist(), sample.data["id"].tolist()):
                assert tuple(ident) == acknowledged.get(key, tuple(ident))  # a key being acked may race
            if kind is Prioritized:
                table.update_priorities(sample.keys, sample.data["step"].obs[:, 0, 0] + 0.5)

    def writers_then_done():
        run_threads(*[lambda w=w: writer(w) for w in range(writers)])
        done.set()

    run_threads(writers_then_done, sampler, sampler)
    total = writers * per_writer
    assert sorted(acknowledged) == list(range(total))
    state, stats = table.state(), table.stats()
    np.testing.assert_array_equal(state["keys"], np.arange(max(0, total - max_size), total))  # the newest survive
    np.testing.assert_array_equal(state["groups"][0]["items"]["id"], [acknowledged[k] for k in state["keys"].tolist()])
    assert stats["evictions"] == max(0, total - max_size) and stats["samples"] > 0


def test_full_tables_evict_the_oldest_items_first():
    table = Uniform(max_size=3, seed=0)
    for seq in range(5):
        table.insert(item(0, seq))
    sample = table.sample(200)
    assert set(sample.keys.tolist()) == {2, 3, 4}
    np.testing.assert_array_equal(sample.data["id"][:, 1], sample.keys)
    np.testing.assert_allclose(sample.probabilities, 1 / 3)
    assert table.stats()["evictions"] == 2 and table.size() == 3


def test_prioritized_samples_in_proportion_to_priority_to_the_exponent():
    table = Prioritized(max_size=4, priority_exponent=0.5, seed=1)
    priorities = np.array([1.0, 4.0, 9.0, 16.0])
    for seq, p in enumerate(priorities):
        table.insert(item(0, seq), priority=p)
    expected = np.sqrt(priorities) / np.sqrt(priorities).sum()
    draws = 20_000
    sample = table.sample(draws)
    counts = np.bincount(sample.keys, minlength=4)
    assert ((counts - draws * expected) ** 2 / (draws * expected)).sum() < 3 + 5 * np.sqrt(6)
    np.testing.assert_allclose(sample.probabilities, expected[sample.keys])


def test_update_priorities_by_key_skips_evicted_keys_and_last_duplicate_wins():
    table = Prioritized(max_size=2, priority_exponent=1.0, seed=0)
    for seq in range(3):  # key 0 is evicted
        table.insert(item(0, seq), priority=1.0)
    table.update_priorities(np.array([0, 1, 2, 2]), np.array([50.0, 0.0, 7.0, 3.0]))
    assert table.stats()["stale_priority_updates"] == 1
    np.testing.assert_array_equal(table.state()["priorities"], [0.0, 3.0])
    assert set(table.sample(50).keys.tolist()) == {2}


def test_prioritized_insert_without_priority_takes_the_largest_so_far():
    table = Prioritized(max_size=4, priority_exponent=1.0, seed=0)
    table.insert(item(0, 0))
    table.insert(item(0, 1), priority=5.0)
    table.insert(item(0, 2))
    np.testing.assert_array_equal(table.state()["priorities"], [1.0, 5.0, 5.0])


def test_rate_limited_inserters_and_samplers_never_deadlock():
    limiter = SampleToInsertRatio(samples_per_insert=2.0, min_size=8, error_buffer=6.0)
    table = Uniform(max_size=32, rate_limiter=limiter, seed=0)
    progress = collections.Counter()

    def loop(name, call):
        while True:
            try:
                call()
            except TimeoutError:
                continue
            except TableClosedError:
                return
            progress[name] += 1

    inserters = [lambda i=i: loop(f"insert{i}", lambda: table.insert(item(i, 0), timeout=0.02)) for i in range(3)]
    samplers = [lambda i=i: loop(f"sample{i}", lambda: table.sample(4, timeout=0.02)) for i in range(2)]
    def progressed() -> bool:
        stats = table.stats()
        return (all(progress[name] > 0 for name in [*(f"insert{i}" for i in range(3)), "sample0", "sample1"])
                and stats["inserts"] > 50 and stats["insert_waits"] > 0 and stats["sample_waits"] > 0)

    once(progressed, table.close)  # a deadlock would keep the threads from progressing, and closing
    run_threads(*inserters, *samplers, join_timeout=90)
    stats = table.stats()
    assert all(progress[f"insert{i}"] > 0 for i in range(3)) and all(progress[f"sample{i}"] > 0 for i in range(2))
    assert stats["inserts"] > 50 and stats["insert_waits"] > 0 and stats["sample_waits"] > 0
    diff = stats["inserts"] * 2.0 - stats["samples"]
    assert limiter.min_diff <= diff <= limiter.max_diff


def test_rate_limiter_refuses_sizes_that_could_only_hang():
    with pytest.raises(ValueError, match=r"MinSize\(10\) waits for 10 items but max_size is 5"):
        Prioritized(5, rate_limiter=MinSize(10))


def test_min_size_limiter_holds_samplers_with_a_clear_timeout():
    table = Uniform(10, rate_limiter=MinSize(2))
    table.insert(item(0, 0))
    with pytest.raises(TimeoutError, match=r"Uniform holds 1 items and MinSize\(2\) waits for 2"):
        table.sample(1, timeout=0.02)


# --- all tables -----------------------------------------------------------------------------------

TABLES = {
    "fifo": lambda: Fifo(max_size=6),
    "uniform": lambda: Uniform(max_size=6, seed=3),
    "prioritized": lambda: Prioritized(max_size=6, priority_exponent=0.7, seed=3),
}


@pytest.mark.parametrize("kind", TABLES)
def test_state_round_trip_gives_an_identical_table(kind):
    table = TABLES[kind]()
    priority = (lambda seq: {"priority": seq + 1.0}) if kind == "prioritized" else (lambda seq: {})
    for seq in range(9 if kind != "fifo" else 6):  # the sampled tables evict 3
        table.insert(item(1, seq), **priority(seq))
    table.sample(2)
    state = table.state()
    restored = TABLES[kind]()
    restored.load_state(state)
    assert restored.stats() == table.stats()
    next_key = 9 if kind != "fifo" else 6
    assert table.insert(item(2, 0)) == restored.insert(item(2, 0)) == next_key
    for _ in range(2):
        a, b = table.sample(2), restored.sample(2)
        np.testing.assert_array_equal(a.keys, b.keys)
        np.testing.assert_array_equal(a.data["step"].obs, b.data["step"].obs)
        np.testing.assert_array_equal(a.probabilities, b.probabilities)
    assert state["keys"][-1] == next_key - 1  # the snapshot did not move with the table


@pytest.mark.parametrize("kind", TABLES)
def test_close_wakes_blocked_waiters_and_keeps_state_readable(kind):
    table = TABLES[kind]()
    outcomes = []

    def wait_for_sample():
        try:
            table.sample(2)
        except TableClosedError as e:
            outcomes.append(str(e))

    once(lambda: table.stats()["sample_waits"] == 2, table.close)
    run_threads(wait_for_sample, wait_for_sample, join_timeout=60)
    assert len(outcomes) == 2 and "is closed" in outcomes[0]
    with pytest.raises(TableClosedError):
        table.insert(item(0, 0))
    assert table.stats()["closed"] and len(table.state()["keys"]) == 0


def test_close_wakes_a_blocked_inserter():
    queue = Fifo(max_size=1)
    queue.insert(item(0, 0))
    once(lambda: queue.stats()["insert_waits"] == 1, queue.close)
    with pytest.raises(TableClosedError):
        queue.insert(item(0, 1))


def test_items_may_differ_unless_a_signature_is_given_which_they_must_match():
    table = Uniform(4, seed=0)  # Reverb: without a signature, every item has its own structure
    table.insert(item(0, 0))
    table.insert({"id": np.array([0, 1])})
    table.insert_many([{"id": np.array([0, 2, 2])}, item(0, 3)])
    assert table.size() == 4
    mixed = table.sample(64)
    assert isinstance(mixed.data, list) and len(mixed.data) == 64  # signatures differ: one item each
    for key, drawn in zip(mixed.keys.tolist(), mixed.data):
        assert drawn["id"][-1] == key or (key == 2 and drawn["id"].shape == (3,))

    signature = {"id": np.zeros(2, np.int64), "step": Step(np.zeros((2, 3), np.float32), np.zeros((), np.float64))}
    table = Uniform(4, signature=signature)
    table.insert(item(0, 0))
    with pytest.raises(ValueError, match=r"item structure \{'id': \*\} differs from the table's signature "
                                         r"\{'id': \*, 'step': Step\(\*, \*\)\}"):
        table.insert({"id": np.array([0, 0])})
    with pytest.raises(ValueError, match=r"item\['step'\]\[0\] has shape \(2, 4\) float32 but the table's signature "
                                         r"says \(2, 3\) float32"):
        table.insert({"id": np.array([0, 0]), "step": Step(np.zeros((2, 4), np.float32), 0.0)})
    with pytest.raises(TypeError, match=r"item\['id'\] is a NoneType, not a numeric array"):
        table.insert({"id": None, "step": Step(np.zeros((2, 3), np.float32), 0.0)})
    with pytest.raises(TypeError, match=r"signature item\['a'\] is a object, not a numeric array"):
        Uniform(4, signature={"a": object()})
    assert Uniform(4, signature=item(0, 0)).insert(item(0, 1)) == 0  # an example item is a signature too
    assert table.size() == 1 and table.info()["signature"] == "{'id': *, 'step': Step(*, *)}"


def test_bad_arguments_are_refused_with_clear_errors():
    with pytest.raises(ValueError, match=r"priority must be finite and >= 0, got -1.0"):
        Prioritized(4).insert(item(0, 0), priority=-1.0)
    with pytest.raises(ValueError, match="batch_size must be an int >= 1"):
        Fifo(4).sample(0)
    with pytest.raises(ValueError, match="timeout must be None or >= 0"):
        Fifo(4).insert(item(0, 0), timeout=-1)
    with pytest.raises(ValueError, match="max_size must be an int >= 1"):
        Uniform(0)
    with pytest.raises(ValueError, match="1-D and the same length"):
        Prioritized(4).update_priorities(np.array([0, 1]), np.array([1.0]))
    table = Prioritized(4)
    table.insert(item(0, 0), priority=0.0)
    with pytest.raises(ValueError, match="every priority is 0"):
        table.sample(1)


@pytest.mark.parametrize("kind", [Uniform, Prioritized])
def test_an_oversized_sample_is_refused_before_anything_is_allocated(kind):
    # Sampling with replacement is bounded by nothing else: one 13-byte item once made a
    # sample(2_000_000) allocate ~150 MB.
    import tracemalloc

    table = kind(10)
    table.insert({"obs": np.zeros(3, np.float32), "done": np.zeros((), bool)})  # 13 bytes
    big = kind(10)
    big.insert(np.zeros(2 << 20, np.uint8))  # 2 MiB
    tracemalloc.start()
    try:
        with pytest.raises(ValueError, match=r"sample of 2000000 items is more than one call may take \(1048576\)"):
            table.sample(2_000_000)
        with pytest.raises(ValueError, match=r"sample of 600 items of 2097152 bytes .* more than one call may "
                                             r"return \(1073741824 bytes\); sample fewer items per call"):
            big.sample(600)
        assert tracemalloc.get_traced_memory()[1] < 1 << 20
    finally:
        tracemalloc.stop()
    assert table.sample(1000).keys.shape == (1000,)  # smaller samples go on as before


def test_a_table_without_a_signature_refuses_items_of_one_signature_too_many_naming_signature():
    """Each new structure used to get full-size columns of its own, found by a scan of them all."""
    table = Uniform(1 << 16, seed=0)
    for i in range(MAX_SIGNATURES):
        table.insert({f"field{i}": np.float32(i)})
    with pytest.raises(ValueError, match=r"takes at most 16; .* Give the table a signature="):
        table.insert({"one too many": np.float32(0)})
    with pytest.raises(ValueError, match="signature="):
        table.insert_many([{"field0": np.float32(1)}, {"another": np.float32(1)}])
    assert table.size() == MAX_SIGNATURES  # the refused batch stored nothing
    table.insert({"field3": np.float32(3)})  # a signature it holds is welcome
    table.delete([1])  # the only item of its signature: its room is free again
    table.insert({"now welcome": np.float32(0)})

