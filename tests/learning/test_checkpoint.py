"""jaxdist.learning.checkpoint: round trips, intervals, retention, SIGKILL/SIGTERM of real processes."""

import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
import types
from pathlib import Path

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxdist.learning import checkpoint
from jaxdist.learning.checkpoint import Checkpointer
from jaxdist.learning.layout import checkpoint_dir

WORKER = Path(__file__).parents[1] / "helpers" / "checkpoint_worker.py"


def make_state(seed: int) -> dict:
    tx = optax.adam(1e-2)
    params = {"w": jax.random.normal(jax.random.key(seed), (4, 3)),
              "b": jnp.full(3, seed, jnp.float32)}
    grads = jax.tree.map(jnp.ones_like, params)
    _, opt = tx.update(grads, tx.init(params), params)  # non-trivial adam moments
    return {"params": params, "opt": opt, "step": jnp.int32(seed), "key": jax.random.key(seed)}


def step_dirs(directory) -> list[int]:
    return sorted(int(n) for n in os.listdir(directory) if n.isdigit())


def orbax_tmp_dirs(directory) -> list[str]:
    return [n for n in os.listdir(directory) if "orbax-checkpoint-tmp" in n]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Worker:
    """A checkpoint_worker subprocess whose stdout lines arrive on a queue."""

    def __init__(self, directory, *args: str, log: Path):
        self.log = open(log, "a")
        self.proc = subprocess.Popen(
            [sys.executable, str(WORKER), "--dir", str(directory), *args],
            env={**os.environ, "JAX_PLATFORMS": "cpu"}, stdout=subprocess.PIPE,
            stderr=self.log, text=True)
        self.lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.put(line.strip())

    def expect(self, prefix: str, timeout: float = 60) -> list[str]:
        """The words of the next line starting with ``prefix``."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"no line starting {prefix!r} within {timeout} s; "
                                     f"stderr is in {self.log.name}") from None
            if line.startswith(prefix):
                return line.split()

    def wait(self, timeout: float = 30) -> int:
        return self.proc.wait(timeout=timeout)

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()
        self.log.close()


@pytest.fixture
def workers():
    started = []

    def start(*args, **kwargs):
        started.append(Worker(*args, **kwargs))
        return started[-1]

    yield start
    for w in started:
        w.kill()


def test_checkpoint_dir_is_fixed_by_run_and_node(tmp_path):
    expected = tmp_path / "run" / "checkpoints" / "learner"
    assert checkpoint_dir(tmp_path / "run", "learner") == str(expected)


def test_round_trip_restores_identical_state_with_opt_state_and_key(tmp_path):
    state = make_state(1)
    with Checkpointer(tmp_path) as ckpt:
        assert ckpt.save(7, state)
        ckpt.wait()
    with Checkpointer(tmp_path) as ckpt:
        assert ckpt.latest_step() == 7
        restored = ckpt.restore(make_state(2))
    chex.assert_trees_all_equal(restored, state, strict=True)
    assert type(restored["opt"][0]) is type(state["opt"][0])  # optax NamedTuples come back


def test_maybe_save_saves_only_on_multiples_of_save_every_steps(tmp_path):
    with Checkpointer(tmp_path, save_every_steps=5, keep=10) as ckpt:
        saved = [step for step in range(1, 24) if ckpt.maybe_save(step, make_state(0))]
        assert not ckpt.maybe_save(20, make_state(0), force=True)  # already saved
        assert ckpt.maybe_save(23, make_state(0), force=True)
    assert saved == [5, 10, 15, 20]
    assert step_dirs(tmp_path) == [5, 10, 15, 20, 23]


def test_maybe_save_with_save_every_seconds_waits_for_the_interval(tmp_path, monkeypatch):
    now = [100.0]
    monkeypatch.setattr(checkpoint, "time", types.SimpleNamespace(monotonic=lambda: now[0]))  # its clock
    with Checkpointer(tmp_path, save_every_seconds=0.5, async_save=False) as ckpt:
        assert not ckpt.maybe_save(1, make_state(0))
        now[0] += 0.6
        assert ckpt.maybe_save(2, make_state(0))
        now[0] += 0.4
        assert not ckpt.maybe_save(3, make_state(0))
        now[0] += 0.1
        assert ckpt.maybe_save(4, make_state(0))
    assert step_dirs(tmp_path) == [2, 4]


def test_keep_retains_only_the_latest_k(tmp_path):
    with Checkpointer(tmp_path, keep=2) as ckpt:
        for step in range(1, 6):
            ckpt.save(step, make_state(step))
    assert step_dirs(tmp_path) == [4, 5]


def test_restore_without_checkpoint_raises(tmp_path):
    with Checkpointer(tmp_path) as ckpt, pytest.raises(FileNotFoundError):
        ckpt.restore(make_state(0))


@pytest.mark.parametrize("abstract", [False, True], ids=["arrays", "shapes"])
def test_a_checkpoint_of_another_structure_is_refused_saying_why_and_what_to_do(tmp_path, abstract):
    """Before, Orbax's 'tree structures do not match' or 'Structure mismatch' (a template of
    arrays, as a resuming learner's, or of shapes, as load_policy's) and its key lists: a resumed
    Anakin run saved before its state kept the best policy."""
    with Checkpointer(tmp_path) as ckpt:
        ckpt.save(3, make_state(3))
        grown = dict(make_state(0), best={"return": jnp.zeros(())})
        with pytest.raises(ValueError, match=r"checkpoint of step 3 in .* holds a state of another structure .* "
                                             r"train afresh in a new run directory \(or with --fresh\)"):
            ckpt.restore(jax.eval_shape(lambda: grown) if abstract else grown)


@pytest.mark.timeout(60)
def test_sigkill_mid_run_resumes_at_latest_checkpoint(tmp_path, workers):
    run = workers(tmp_path / "ckpt", "--save-every", "5", "--sleep", "0.01",
                  log=tmp_path / "log")
    run.expect("saved 20")
    run.kill()
    latest = step_dirs(tmp_path / "ckpt")[-1]
    assert latest >= 15
    again = workers(tmp_path / "ckpt", "--save-every", "5", "--steps", str(latest + 2),
                    log=tmp_path / "log")
    # Every step adds 1 to each parameter, so the restored values tell the restored step.
    assert again.expect("resumed") == ["resumed", str(latest), f"{latest:.1f}", f"{latest:.1f}"]
    assert again.wait() == 0


@pytest.mark.timeout(60)
def test_sigterm_saves_off_interval_and_exits_zero(tmp_path, workers):
    run = workers(tmp_path / "ckpt", "--save-every", "1000", "--sleep", "0.01",
                  log=tmp_path / "log")
    run.expect("stepped")
    run.proc.send_signal(signal.SIGTERM)
    assert run.wait(timeout=60) == 0
    step = int(run.expect("preempted")[1])
    assert step % 1000 != 0 and step_dirs(tmp_path / "ckpt") == [step]
    again = workers(tmp_path / "ckpt", "--save-every", "1000", "--steps", str(step + 1),
                    log=tmp_path / "log")
    assert again.expect("resumed")[1:3] == [str(step), f"{step:.1f}"]


@pytest.mark.timeout(90)
def test_save_cut_short_by_sigkill_is_never_restored(tmp_path, workers):
    directory = tmp_path / "ckpt"
    # Synchronous saves of ~60 MB (params + two Adam moments) take long enough to kill into.
    run = workers(directory, "--save-every", "2", "--sleep", "0", "--sync", "--size", "5000000",
                  log=tmp_path / "log")
    run.expect("saved 2")
    tmp_dirs: list[str] = []
    while not tmp_dirs:  # kill inside the first save whose temporary directory we catch
        run.expect("saving")
        deadline = time.monotonic() + 2
        while not tmp_dirs and time.monotonic() < deadline:
            tmp_dirs = orbax_tmp_dirs(directory)
    run.kill()
    assert orbax_tmp_dirs(directory), "the save finished before the kill"
    complete = step_dirs(directory)[-1]
    again = workers(directory, "--save-every", "2", "--steps", str(complete + 1), "--size",
                    "5000000", log=tmp_path / "log")
    assert again.expect("resumed")[1] == str(complete)
    assert again.wait() == 0
    assert not orbax_tmp_dirs(directory)  # removed by the next manager


@pytest.mark.timeout(90)
def test_sigterm_under_jax_distributed_saves_the_same_step_on_every_process(tmp_path, workers):
    def start(i, port, *extra):
        return workers(tmp_path / "ckpt", "--save-every", "1000", "--sleep", "0.01",
                       "--coordinator", f"127.0.0.1:{port}", "--num-processes", "2",
                       "--process-id", str(i), *extra, log=tmp_path / f"log{i}")

    port = free_port()
    procs = [start(i, port) for i in range(2)]
    for p in procs:
        p.expect("stepped")
    procs[1].proc.send_signal(signal.SIGTERM)  # JAX propagates the notice to process 0
    assert [p.wait(timeout=60) for p in procs] == [0, 0]
    steps = {int(p.expect("preempted")[1]) for p in procs}
    assert len(steps) == 1 and step_dirs(tmp_path / "ckpt") == list(steps)
    (step,) = steps
    port = free_port()
    again = [start(i, port, "--steps", str(step + 1)) for i in range(2)]
    assert [p.expect("resumed")[1] for p in again] == [str(step)] * 2
    assert [p.wait() for p in again] == [0, 0]


def test_a_reader_beside_a_live_learner_leaves_its_save_in_progress_alone(tmp_path):
    """A writer starting up removes a save cut short; a reader must not: to it, the temporary
    directory is the learner's save in progress."""
    with Checkpointer(tmp_path, async_save=False) as writer:
        writer.save(1, {"w": jnp.ones(3)})
    in_progress = tmp_path / "2.orbax-checkpoint-tmp-1234"
    in_progress.mkdir()
    with Checkpointer(tmp_path, read_only=True) as reader:
        assert reader.latest_step() == 1
        chex.assert_trees_all_equal(reader.restore({"w": jnp.zeros(3)}), {"w": jnp.ones(3)})
    assert in_progress.is_dir()
    with Checkpointer(tmp_path / "elsewhere", read_only=True) as reader:
        assert reader.latest_step() is None
    assert not (tmp_path / "elsewhere").exists()


@pytest.mark.timeout(120)
def test_two_checkpointers_saving_at_once_in_one_process_commit_every_save(tmp_path):
    """A learner's checkpoints and its colocated evaluator's best policy: two managers saving
    from two threads of one process. Orbax keys the signal that lets a save's writers start
    (its directory exists) by a process-wide operation id, so two saves at once crossed their
    signals: one's writers filled a directory that its set-up then deleted under them
    (``OSError: Directory not empty``, or ``File exists``)."""
    leaves = {f"w{i}": np.full((64, 256), i, np.float32) for i in range(20)}
    errors: list[BaseException] = []

    def saves(name: str) -> None:
        with Checkpointer(tmp_path / name, keep=1) as saver:
            for step in range(1, 26):
                try:
                    saver.save(step, leaves)
                except Exception as error:  # noqa: BLE001 - each failed save is the finding
                    errors.append(error)

    threads = [threading.Thread(target=saves, args=(name,)) for name in ("learner", "best_policy")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors
    for name in ("learner", "best_policy"):
        assert step_dirs(tmp_path / name) == [25] and not orbax_tmp_dirs(tmp_path / name)
