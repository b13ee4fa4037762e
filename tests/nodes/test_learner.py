"""The learner node: direct updates over RPC, and real processes that train, publish, write
metrics, save on SIGTERM, resume after SIGKILL, and agree on 1 and 8 devices."""

from __future__ import annotations

import os
import re
import signal
import time
from concurrent import futures

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxdist as jd
import learner_nodes as ln
import xla_flags
from jaxdist import courier
from jaxdist.learning.checkpoint import Checkpointer
from jaxdist.learning.layout import checkpoint_dir
from jaxdist.learning.learner_logic import LearnerLogic
from jaxdist.records.metrics import read_metrics
from jaxdist.nodes.learner import CheckpointOptions, Learner, PublishOptions, ReplaySource
from jaxdist.nodes.parameter_server import MAX_WAIT
from waiting import returns

NO_METRICS = PublishOptions(metrics=None)

def env(devices: int = 1) -> dict:
    return {"JAX_PLATFORMS": "cpu",
            "XLA_FLAGS": xla_flags.flags(devices)}


def client_of(running, name: str = "learner/0") -> courier.Client:
    return courier.Client(running.addresses[name], token=running.token)


def wait_until(condition, timeout: float = 60.0, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"{what} not reached within {timeout} s")


def launch_learner(run_dir, source, restart: jd.Restart | None = None, **options) -> jd.Running:
    program = jd.Program("learn")
    with program.group("learner"):
        program.add_node(jd.CourierNode(Learner, ln.LOGIC, source, **options))
    return jd.launch(program, launcher="processes", run_dir=str(run_dir), echo=False,
                     resources={"learner": {"env": env()}},
                     restart={"learner": restart} if restart else None)


def logged_steps(run_dir) -> list[int]:
    return [row["step"] for row in read_metrics(os.path.join(run_dir, "metrics.csv"))]


def saved_steps(run_dir, node: str = "learner/0") -> list[int]:
    directory = checkpoint_dir(run_dir, node)
    return sorted(int(name) for name in os.listdir(directory) if name.isdigit())


def node_log(run_dir, node: str = "learner/0") -> str:
    with open(os.path.join(run_dir, "logs", node.replace("/", "-") + ".log")) as log:
        return log.read()


def test_direct_updates_step_and_get_sends_params_only_when_newer(tmp_path):
    program = jd.Program("direct")
    with program.group("learner"):
        learner_handle = program.add_node(jd.CourierNode(Learner, ln.LOGIC,
                                                         publishing=PublishOptions(every=2, log_every=1)))
    with program.group("ps"):
        program.add_node(jd.CourierNode(jd.ParameterServer, source=learner_handle, follow_wait=1.0))
    running = jd.launch(program, launcher="threads", run_dir=str(tmp_path), echo=False)
    try:
        learner = client_of(running)
        initial = learner.get()
        assert initial["version"] == 0 and set(initial["params"]) == {"w1", "b1", "w2", "b2"}
        assert learner.get(min_version=0) == {"version": 0, "params": None}

        losses = [learner.update(ln.make_batch(i, 32))["metrics"]["loss"] for i in range(3)]
        assert learner.status()["step"] == 3
        assert all(np.isfinite(losses))
        newer = wait_until(lambda: learner.get(min_version=0)["params"] and learner.get(0),
                           what="version 2 published")
        assert newer["version"] == 2  # every=2: step 3 is not published
        assert not np.allclose(newer["params"]["w1"], initial["params"]["w1"])
        began = time.monotonic()
        assert learner.get(min_version=2, wait=0.3)["params"] is None  # a long poll
        assert time.monotonic() - began >= 0.25
        actor_view = jd.VariableClient(learner, refresh_every_seconds=0.05)  # reads `get`
        wait_until(lambda: actor_view.version == 2, what="the VariableClient at version 2")
        np.testing.assert_array_equal(actor_view.params["w1"], newer["params"]["w1"])
        actor_view.close()
        followed = wait_until(lambda: client_of(running, "ps/0").get(0)["params"],
                              what="the parameter server following the learner to version 2")
        np.testing.assert_array_equal(followed["w1"], newer["params"]["w1"])
        with pytest.raises(ValueError, match="multiple of"):
            learner.update({"x": np.zeros((32,), np.float32), "y": np.zeros((), np.float32)})
    finally:
        running.stop()
    assert logged_steps(tmp_path) == [1, 2, 3]


def test_a_stop_lets_the_learners_save_commit_when_it_outlasts_the_grace(tmp_path):
    # A loaded machine's save outlasted the stop's grace: killed, it left a temporary directory
    # and no checkpoint of the step the run stopped at.
    program = jd.Program("learn")
    with program.group("learner"):
        program.add_node(jd.CourierNode(ln.SlowCommitLearner, ln.LOGIC, ln.RegressionBatches(limit=7),
                                        publishing=NO_METRICS, checkpointing=CheckpointOptions(save_every_steps=5)))
    # The grace covers the start of the save, even on a loaded machine, not its commit.
    running = jd.launch(program, launcher="processes", run_dir=str(tmp_path), echo=False, grace=1.5,
                        interrupt_after=0.2, resources={"learner": {"env": env()}})
    try:
        wait_until(lambda: client_of(running).status()["step"] == 7, what="step 7")
    finally:
        running.stop()
    assert saved_steps(tmp_path) == [5, 7]
    assert not [name for name in os.listdir(checkpoint_dir(tmp_path, "learner/0")) if "tmp" in name]
    assert "learner/0: stopped at step 7: the program is stopping (checkpoint saved)" in node_log(tmp_path)
    assert running.status()["learner/0"]["error"] is None


def test_sigterm_saves_off_interval_exits_zero_and_a_relaunch_resumes_there(tmp_path):
    # The source runs dry after 23 batches, so the node sits at step 23 when SIGTERM comes.
    running = launch_learner(tmp_path, ln.RegressionBatches(limit=23),
                             publishing=PublishOptions(every=5, log_every=5),
                             checkpointing=CheckpointOptions(save_every_steps=10))
    learner = client_of(running)
    wait_until(lambda: learner.status()["step"] == 23, what="step 23")
    assert learner.get()["version"] == 20
    os.kill(running.status()["learner/0"]["pid"], signal.SIGTERM)
    assert running.wait(timeout=120)
    status = running.status()["learner/0"]
    # None: the launcher's monitor and teardown threads both join the process, and the one that
    # loses the waitpid race reads no exit code (a launcher race, reported); never non-zero.
    assert status["exitcode"] == 0 and status["error"] is None
    assert saved_steps(tmp_path) == [10, 20, 23]
    assert logged_steps(tmp_path) == [5, 10, 15, 20, 23]
    # The worker's SIGTERM handler still ran (parallel's flag chains to it): the program stopped.
    # Which of the two the learner's loop sees first (its own flag or the launcher's stop) is a race.
    assert running.stop_reason == "node 'learner/0' got SIGTERM"
    assert re.search(r"stopped at step 23: (the program is stopping|preempted \(SIGTERM\)) "
                     r"\(checkpoint saved\)", node_log(tmp_path))

    running = launch_learner(tmp_path, ln.RegressionBatches(), max_steps=30,
                             publishing=PublishOptions(every=5, log_every=5),
                             checkpointing=CheckpointOptions(save_every_steps=10))
    assert running.wait(timeout=120)
    assert "learner/0: restored step 23" in node_log(tmp_path)
    assert logged_steps(tmp_path) == [5, 10, 15, 20, 23, 25, 30]
    assert saved_steps(tmp_path)[-1] == 30


def test_sigkill_mid_run_then_relaunch_resumes_at_the_latest_checkpoint(tmp_path):
    running = launch_learner(tmp_path, ln.RegressionBatches(limit=27), publishing=PublishOptions(log_every=1),
                             checkpointing=CheckpointOptions(save_every_steps=10), restart=jd.Restart(max_restarts=0))
    learner = client_of(running)
    wait_until(lambda: learner.status()["step"] == 27, what="step 27")
    wait_until(lambda: saved_steps(tmp_path) == [10, 20], what="checkpoint 20 committed")
    os.kill(running.status()["learner/0"]["pid"], signal.SIGKILL)
    with pytest.raises(jd.NodeFailedError, match="SIGKILL"):
        running.wait(timeout=120)

    running = launch_learner(tmp_path, ln.RegressionBatches(), max_steps=24, publishing=PublishOptions(log_every=1),
                             checkpointing=CheckpointOptions(save_every_steps=10))
    assert running.wait(timeout=120)
    assert "learner/0: restored step 20" in node_log(tmp_path)
    assert logged_steps(tmp_path) == list(range(1, 25))  # rows past 20 were redone, not doubled


def test_the_supervisor_restarts_a_killed_learner_from_its_latest_checkpoint(tmp_path):
    running = launch_learner(tmp_path, ln.RegressionBatches(limit=27), publishing=PublishOptions(log_every=1),
                             checkpointing=CheckpointOptions(save_every_steps=10))  # learners restart by default
    try:
        learner = client_of(running)
        wait_until(lambda: learner.status()["step"] == 27, what="step 27")
        wait_until(lambda: saved_steps(tmp_path) == [10, 20], what="checkpoint 20 committed")
        os.kill(running.status()["learner/0"]["pid"], signal.SIGKILL)
        wait_until(lambda: running.status()["learner/0"]["restarts"] == 1, what="a restart")
        restarted = wait_until(lambda: learner.status(), what="the restarted learner answering")
        assert restarted["restored_step"] == 20
        wait_until(lambda: learner.status()["step"] == 27, what="step 27 again")
        assert "killed by SIGKILL" in running.status()["learner/0"]["last_restart_cause"]
    finally:
        running.stop()
    rows = read_metrics(os.path.join(tmp_path, "metrics.csv"))
    assert [row["step"] for row in rows] == list(range(1, 28))  # rows past 20 were redone, not doubled
    # The first row of the restarted life records where it resumed.
    assert [(row["step"], row["learner/restored_step"]) for row in rows if row.get("learner/restored_step")] \
        == [(21, 20)]


def final_state(run_dir, node: str) -> dict:
    template = {"state": ln.init(jax.random.key(0)), "step": jnp.zeros((), jnp.int32)}
    return Checkpointer(checkpoint_dir(run_dir, node)).restore(template)


def assert_params_close(got: dict, want: dict, what: str) -> None:
    for name in want:
        g, w = np.asarray(got[name]), np.asarray(want[name])
        err = np.linalg.norm(g - w) / np.linalg.norm(w)
        assert err <= 1e-5, f"{what}/{name}: relative error {err:.2e}"


def test_eight_devices_train_the_same_as_one_through_the_node(tmp_path):
    # jit: the update's noise is drawn over the global batch, so it too must match. pmap draws
    # per device, so it trains the noise-free update against an in-process reference.
    program = jd.Program("devices")
    resources = {}
    for label, devices, mode, logic in (("one", 1, "jit", ln.LOGIC), ("eight", 8, "jit", ln.LOGIC),
                                        ("eightpmap", 8, "pmap", ln.CLEAN_LOGIC)):
        with program.group(label):
            program.add_node(jd.CourierNode(Learner, logic, ln.RegressionBatches(batch_size=64),
                                            mode=mode, max_steps=10, checkpointing=CheckpointOptions(),
                                            publishing=NO_METRICS))
        resources[label] = {"env": env(devices)}
    running = jd.launch(program, launcher="processes", run_dir=str(tmp_path), echo=False,
                        resources=resources)
    reference = Learner(ln.CLEAN_LOGIC, ln.RegressionBatches(batch_size=64), max_steps=10, publishing=NO_METRICS)
    reference.run()
    clean = reference.get()
    reference.close()
    assert running.wait(timeout=240)
    assert "on 8 cpu device(s), mode=pmap" in node_log(tmp_path, "eightpmap/0")

    one, eight, pmap = (final_state(tmp_path, f"{label}/0") for label in ("one", "eight", "eightpmap"))
    assert int(one["step"]) == int(eight["step"]) == int(pmap["step"]) == clean["version"] == 10
    assert_params_close(eight["state"]["params"], one["state"]["params"], "eight")
    assert_params_close(pmap["state"]["params"], clean["params"], "eightpmap")
    with pytest.raises(AssertionError):  # the noise matters: the comparison is not vacuous
        assert_params_close(one["state"]["params"], clean["params"], "one")


def test_learner_samples_batches_from_a_replay_node(tmp_path):
    # 5 steps of 16 take 80 items; the feeder may take up to 3 batches more ahead of use.
    program = jd.Program("replay-learner")
    with program.group("replay"):
        queue = program.add_node(jd.ReplayNode(jd.replay.Fifo(max_size=64)))
    with program.group("actor"):
        program.add_node(jd.PyNode(ln.produce_transitions, queue, 128))
    with program.group("learner"):
        program.add_node(jd.CourierNode(Learner, ln.LOGIC, queue, batch_size=16, max_steps=5,
                                        publishing=PublishOptions(log_every=1)))
    running = jd.launch(program, launcher="threads", run_dir=str(tmp_path), echo=False)
    assert running.wait(timeout=120)
    assert running.status()["learner/0"]["state"] == "finished"
    assert logged_steps(tmp_path) == [1, 2, 3, 4, 5]


def test_a_replay_source_samples_every_scanned_steps_batch_in_one_request(tmp_path):
    # A Fifo hands out consecutive items per request: batch j holding items j, j+3, j+6, j+9
    # shows the three batches came from one request of 12 (three requests give 0-3, 4-7, 8-11).
    # From two nodes (6 items each), every batch holds both nodes' share.
    program = jd.Program("replay-source")
    with program.group("replay"):
        for _ in range(2):
            program.add_node(jd.ReplayNode(jd.replay.Fifo(max_size=64)))
    running = jd.launch(program, launcher="threads", run_dir=str(tmp_path), echo=False)
    try:
        one, two = client_of(running, "replay/0"), client_of(running, "replay/1")
        for client in (one, two, one):
            jd.replay.ReplayClient(client).insert_batch({"x": np.arange(12), "y": np.arange(24).reshape(12, 2)})
        batch = ReplaySource(one, batch_size=4, steps=3)()
        np.testing.assert_array_equal(batch["x"], np.arange(12).reshape(4, 3).T)
        np.testing.assert_array_equal(batch["y"], np.arange(24).reshape(4, 3, 2).swapaxes(0, 1))
        assert jd.replay.ReplayClient(one).size() == 12

        both = ReplaySource([one, two], batch_size=4, steps=3, field=None)()
        assert both["keys"].shape == (3, 4, 2)
        for j in range(3):  # rows j, j+3, j+6, j+9 of node 0's 6 items then node 1's
            np.testing.assert_array_equal(both["keys"][j], [[0, 12 + j], [0, 15 + j], [1, j], [1, 3 + j]])
            np.testing.assert_array_equal(both["data"]["x"][j], [j, 3 + j, j, 3 + j])
    finally:
        running.stop()


def test_a_replay_source_refuses_a_batch_of_items_of_different_structures(tmp_path):
    program = jd.Program("mixed")
    handle = program.add_node(jd.ReplayNode(jd.replay.Fifo(max_size=8)), label="replay")
    running = jd.launch(program, launcher="threads", run_dir=str(tmp_path), echo=False)
    try:
        replay = jd.replay.ReplayClient(running.client(handle))
        replay.insert({"x": np.zeros(2)})
        replay.insert({"y": np.zeros(3)})
        with pytest.raises(ValueError, match="different structures.*give the table a signature"):
            ReplaySource(running.client(handle), batch_size=2)()
    finally:
        running.stop()


def test_steps_per_call_counts_sgd_steps_and_intervals_fire_when_crossed(tmp_path):
    learner = Learner(ln.LOGIC, ln.RegressionBatches(), steps_per_call=3, max_steps=9,
                      publishing=PublishOptions(every=5, log_every=2),
                      checkpointing=CheckpointOptions(save_every_steps=4), run_dir=str(tmp_path),
                      name="learner/0")
    learner.run()
    assert learner.get()["version"] == 9
    learner.close()
    assert logged_steps(tmp_path) == [3, 6, 9]
    assert saved_steps(tmp_path) == [6, 9]  # 6 crossed 4, 9 crossed 8


def test_finish_ends_training_at_the_current_step_saved_published_and_said(tmp_path, capsys):
    learner = Learner(ln.LOGIC, ln.RegressionBatches(), checkpointing=CheckpointOptions(), publishing=NO_METRICS,
                      run_dir=str(tmp_path), name="learner/0")
    running = futures.ThreadPoolExecutor(1).submit(learner.run)  # no max_steps: it would train on
    wait_until(lambda: learner.get()["version"] >= 5, what="five updates")
    final = learner.finish("the evaluation of version 3 reached the target")
    running.result(timeout=60)
    assert learner.finish("again") == final  # once finished, the same step
    assert learner.get()["version"] == final and saved_steps(tmp_path) == [final]
    with pytest.raises(RuntimeError, match="reached max_steps"):
        learner.update(ln.RegressionBatches()())
    learner.close()
    said = capsys.readouterr().out
    assert f"learner/0: stopped at step {final}: the evaluation of version 3 reached the target" in said


def test_a_resumed_run_seeks_its_source_and_ends_where_an_uninterrupted_one_does(tmp_path):
    def train(run_dir, max_steps: int) -> dict:
        learner = Learner(ln.CLEAN_LOGIC, ln.RegressionBatches(), max_steps=max_steps, publishing=NO_METRICS,
                          checkpointing=CheckpointOptions(save_every_steps=5, async_save=False),
                          run_dir=str(run_dir), name="learner/0")
        learner.run()
        params = learner.get()
        learner.close()
        return params

    train(tmp_path / "interrupted", 10)
    resumed = train(tmp_path / "interrupted", 15)  # restores step 10; the source seeks batch 10
    uninterrupted = train(tmp_path / "whole", 15)
    assert resumed["version"] == uninterrupted["version"] == 15
    chex.assert_trees_all_equal(resumed["params"], uninterrupted["params"])


def test_a_restoring_learner_never_runs_init_its_checkpoint_is_the_state(tmp_path):
    """A fresh state is only the restore's template: traced for its shapes, never compiled or
    run (a restart serves sooner by that much)."""
    runs = []

    def counted_init(rng: jax.Array) -> dict:
        jax.debug.callback(lambda: runs.append(1))
        return ln.init(rng)

    def make(max_steps: int) -> Learner:
        return Learner(LearnerLogic(init=counted_init, update=ln.clean_update), ln.RegressionBatches(),
                       max_steps=max_steps, publishing=NO_METRICS, run_dir=str(tmp_path), name="learner/0",
                       checkpointing=CheckpointOptions(save_every_steps=5, async_save=False))

    first = make(5)
    first.run()
    saved = first.get()
    first.close()
    assert len(runs) == 1
    restored = make(10)
    assert restored.restored_step == 5 and len(runs) == 1
    chex.assert_trees_all_equal(restored.get()["params"], saved["params"])
    restored.close()


def test_learner_logic_and_options_are_checked_with_clear_messages(tmp_path):
    with pytest.raises(TypeError, match=r"LearnerLogic.*got function"):
        Learner(ln.update)
    with pytest.raises(ValueError, match="run directory"):
        Learner(ln.LOGIC, checkpointing=CheckpointOptions(), publishing=NO_METRICS)
    with pytest.raises(ValueError, match="every must be >= 1"):
        PublishOptions(every=0)
    with pytest.raises(TypeError, match="source must be"):
        Learner(ln.LOGIC, 42, publishing=NO_METRICS)


def test_a_call_is_served_while_more_long_polls_than_threads_wait():
    """16 long polls of get() held all 16 server threads of a served learner: its status and
    updates waited behind them for up to MAX_WAIT. At most max_waiting of them wait now (as on
    a parameter server); the others answer at once."""
    learner = Learner(ln.LOGIC, publishing=NO_METRICS)
    server = courier.Server(learner, thread_pool_size=16).start()
    client = courier.Client(server.address, timeout=MAX_WAIT + 30)
    try:
        with futures.ThreadPoolExecutor(16) as pollers:
            polls = [pollers.submit(client.get, 0, wait=MAX_WAIT) for _ in range(16)]
            assert returns(lambda: client.update(ln.make_batch(0, 32)), "an update behind 16 long polls",
                           timeout=10)["step"] == 1
            replies = [poll.result(timeout=30) for poll in polls]  # version 1 ends the waiting ones
        assert {reply["version"] for reply in replies} <= {0, 1} and any(reply["params"] for reply in replies)
    finally:
        client.close()
        server.stop(grace=0)
        learner.close()
