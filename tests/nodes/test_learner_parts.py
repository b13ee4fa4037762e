"""The learner's parts, each alone: its feed, its checkpointing, its publishing, and joining
its hosts; the learner itself composes them (tests/nodes/test_learner.py)."""

from __future__ import annotations

import functools
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import learner_nodes as ln
from jaxdist.learning import parallel
from jaxdist.learning.layout import checkpoint_dir
from jaxdist.nodes.learner import (CheckpointOptions, Checkpointing, Feed, PublishOptions, Publishing, ReplaySource,
                                   initial_state, join_hosts)
from jaxdist.nodes.learner.feed import END
from jaxdist.nodes.learner.steps import CountedUpdate
from jaxdist.records.metrics import read_metrics


def step_of(steps_per_call: int = 1) -> parallel.DataParallel:
    return parallel.data_parallel(CountedUpdate(ln.update), steps_per_call=steps_per_call)


def trained(dp: parallel.DataParallel, steps: int) -> dict:
    train = dp.replicate(initial_state(ln.LOGIC, jax.random.key(0)))
    rng = dp.replicate(jax.random.key_data(jax.random.key(1)))
    for i in range(steps):
        train, _ = dp(train, ln.make_batch(i, 8), rng)
    return train


class Counted:
    """Batch i is make_batch(i); told where to start by seek; ends after batch `limit - 1`."""

    def __init__(self, limit: int) -> None:
        self.index, self.limit = 0, limit

    def seek(self, step: int) -> None:
        self.index = step

    def __call__(self) -> dict:
        if self.index >= self.limit:
            raise StopIteration
        self.index += 1
        return ln.make_batch(self.index - 1, 8)


@pytest.mark.parametrize("prefetch", [0, 2])
def test_a_feed_starts_its_source_at_the_step_stacks_a_dispatchs_batches_and_ends_with_it(prefetch):
    feed = Feed(step_of(steps_per_call=2), Counted(limit=9), prefetch=prefetch, step=5)
    try:
        batch = feed.next(timeout=10)
        assert batch["x"].shape == (2, 8, ln.FEATURES)
        np.testing.assert_array_equal(batch["x"][1], ln.make_batch(6, 8)["x"])  # seeked to step 5
        assert feed.next(timeout=10)["x"].shape == (2, 8, ln.FEATURES)
        assert feed.next(timeout=10) is END and feed.next(timeout=10) is END  # batch 9 was never made
    finally:
        feed.close()


def test_a_feed_refuses_batches_and_sources_it_cannot_step_on():
    feed = Feed(step_of(steps_per_call=2), None, name="learner/0")
    assert not feed.has_source
    with pytest.raises(ValueError, match=r"learner learner/0: batch leaf of shape \(8, 4\) must be \(2, batch"):
        feed.place(ln.make_batch(0, 8))
    with pytest.raises(TypeError, match="source must be a callable"):
        Feed(step_of(), 42)
    replay = ReplaySource("a client", batch_size=4)
    assert Feed(step_of(steps_per_call=3), replay, prefetch=0)._feeder._source.steps == 3  # one request a dispatch
    assert replay.steps == 1  # the caller's source is not changed


def test_checkpointing_saves_when_an_interval_is_crossed_and_restores_in_the_steps_layout(tmp_path):
    dp = step_of()
    directory = checkpoint_dir(str(tmp_path), "learner/0")
    part = Checkpointing(directory, CheckpointOptions(save_every_steps=4, async_save=False), dp)
    assert part.restored_step is None
    train = trained(dp, 3)
    assert not part.after_step(0, 3, train)
    assert part.after_step(3, 6, train)  # 6 crossed 4
    part.save(7, train)  # off the interval: a stop
    part.wait()
    part.close()
    assert sorted(int(name) for name in os.listdir(directory) if name.isdigit()) == [6, 7]

    again = Checkpointing(directory, CheckpointOptions(), dp)
    assert again.restored_step == 7
    restored = again.restore(jax.eval_shape(functools.partial(initial_state, ln.LOGIC), jax.random.key(0)))
    assert int(restored["step"]) == 3
    np.testing.assert_array_equal(restored["state"]["params"]["w1"], train["state"]["params"]["w1"])
    again.close()


def test_checkpoint_options_refuse_an_interval_below_one():
    with pytest.raises(ValueError, match="save_every_steps must be >= 1 or None, got 0"):
        CheckpointOptions(save_every_steps=0)


def test_publishing_serves_its_start_publishes_and_logs_on_intervals_counts_env_steps_and_ends_published(tmp_path):
    dp = step_of()
    start = trained(dp, 0)
    part = Publishing(PublishOptions(every=2, log_every=2), dp, ln.LOGIC.params, start, 10, name="learner/0",
                      run_dir=str(tmp_path), restored_step=10)
    try:
        assert part.get()["version"] == 10  # at once, before any step
        later = trained(dp, 3)
        part.count(dp.replicate(np.array(5)))
        part.after_step(10, 11, later, {"loss": np.float32(1.0)})  # neither interval crossed
        part.count(dp.replicate(np.array(7)))
        part.after_step(11, 12, later, {"loss": np.float32(2.0)})
        part.after_step(12, 13, later, {"loss": np.float32(3.0)})
        part.drain()
        assert part.get(min_version=10)["version"] == 12 and part.env_steps == 12
        np.testing.assert_array_equal(part.get()["params"]["w1"], later["state"]["params"]["w1"])
        part.finish(13, later)  # the final step, which no interval published nor logged
        part.drain()
        assert part.version() == 13
    finally:
        part.close()
    rows = read_metrics(os.path.join(tmp_path, "metrics.csv"))
    assert [(row["step"], row["loss"]) for row in rows] == [(12, 2.0), (13, 3.0)]
    assert rows[0]["learner/restored_step"] == 10 and not rows[1].get("learner/restored_step")


def playing_update(state: dict, batch: dict, rng: jax.Array) -> tuple[dict, dict]:
    """An update whose metrics count the env steps it played, as Anakin's do."""
    state, metrics = ln.update(state, batch, rng)
    return state, {**metrics, "env_steps": jnp.int32(len(batch["x"]))}


@pytest.mark.parametrize("mode", ["jit", "pmap"])
def test_env_steps_are_counted_from_the_metrics_of_either_modes_dispatch(mode):
    dp = parallel.data_parallel(CountedUpdate(playing_update), mode=mode)
    train = dp.replicate(initial_state(ln.LOGIC, jax.random.key(0)))
    key = jax.random.key_data(jax.random.key(1))
    part = Publishing(PublishOptions(), dp, ln.LOGIC.params, train, 0, name="learner")
    for i in range(3):
        train, metrics = dp(train, dp.shard_batch(ln.make_batch(i, 8)), dp.replicate(key) if mode == "jit" else key)
        part.count(metrics["env_steps"])
    part.drain()
    assert part.env_steps == 24
    part.close()


def test_publishing_without_a_run_directory_or_a_metrics_file_writes_none(tmp_path):
    dp = step_of()
    for run_dir, metrics in ((None, "metrics"), (str(tmp_path), None)):
        part = Publishing(PublishOptions(log_every=1, metrics=metrics), dp, ln.LOGIC.params, trained(dp, 0), 0,
                          name="learner", run_dir=run_dir)
        part.after_step(0, 1, trained(dp, 1), {"loss": np.float32(1.0)})
        part.finish(1, trained(dp, 1))
        part.close()
        assert part.version() == 1
    assert os.listdir(tmp_path) == []
    with pytest.raises(ValueError, match="log_every must be >= 1 or None, got 0"):
        PublishOptions(log_every=0)


def test_one_host_joins_no_group_and_several_need_the_launchers(monkeypatch):
    monkeypatch.delenv("JAXDIST_COORDINATOR_ADDRESS", raising=False)
    join_hosts(1)
    with pytest.raises(ValueError, match="launcher='multihost'"):
        join_hosts(2)
