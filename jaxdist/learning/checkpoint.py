"""Orbax checkpoints for a learner-state pytree, with resume and save-on-preemption.

The directory is fixed by the run (:func:`checkpoint_dir`), never by a timestamp, so a
restarted process finds its checkpoints. Orbax writes each step into
``<step>.orbax-checkpoint-tmp-<n>`` and renames it when complete: a save cut short by SIGKILL
leaves only that temporary directory, which is never restored (and is removed on the next
start). Typed PRNG keys (``jax.random.key``) are saved and restored natively by Orbax.

The saves of one process take turns (:data:`SAVES`), whichever checkpointer makes them: Orbax
keeps a save's bookkeeping in process-wide state, and two saves at once corrupt each other.

Under ``jax.distributed`` every process must make the same calls with the same steps: saves are
collective. A loop that saves on SIGTERM looks like::

    for step in range(start + 1, num_steps + 1):
        state, metrics = train_step(state, next(batches), rng)
        if parallel.preemption_requested(step):
            ckpt.save_and_exit(step, state)
        ckpt.maybe_save(step, state)
"""

from __future__ import annotations

import os
import sys
import threading
import time
import weakref
from typing import Any, NoReturn

import jax
import numpy as np
import orbax.checkpoint as ocp
from jax.experimental import multihost_utils

PyTree = Any


class SaveTurns:
    """One Orbax save in flight per process, whichever manager makes it.

    Orbax keys the signal that lets a save's writers start (its directory exists) by a
    process-wide operation id. Two managers saving at once in one process -- a learner's
    checkpoints and the best policy its colocated evaluator saves -- cross those signals: one
    save's writers fill a directory that its own set-up then deletes under them (``OSError:
    Directory not empty``), or a save waits for ever on a signal the other removed. So a save
    starts only once the previous one, of any manager, has committed.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._previous: weakref.ref[ocp.CheckpointManager] | None = None

    def save(self, manager: ocp.CheckpointManager, step: int, **kwargs: Any) -> None:
        """``manager.save(step, **kwargs)`` once every other save of this process has committed."""
        with self._lock:
            previous = self._previous() if self._previous is not None else None
            if previous is not None and previous is not manager:
                previous.wait_until_finished()
            manager.save(step, **kwargs)
            self._previous = weakref.ref(manager)


SAVES = SaveTurns()
"""This process's turns, shared by every checkpointer (the replay's tables' too)."""


class Checkpointer:
    """Save every N steps and/or every T seconds, keep the latest ``keep``, restore the latest.

    ``save_every_steps=N`` saves at steps that are multiples of N (as Orbax does).
    ``save_every_seconds=T`` saves once T seconds have passed since the last save; with several
    processes, process 0's clock decides and a tiny collective tells the others each call.
    With ``async_save`` a save returns once the arrays are copied off the devices and the
    files are written in the background; :meth:`wait` blocks until they are committed.

    ``read_only``: a reader beside a live writer (loading a policy while its learner trains). It
    creates nothing and removes nothing: the temporary directory a writer's start removes (a save
    cut short) is, to a reader, the learner's save in progress. It cannot save.
    """

    def __init__(self, directory: str | os.PathLike, *, save_every_steps: int | None = None,
                 save_every_seconds: float | None = None, keep: int = 3,
                 async_save: bool = True, read_only: bool = False) -> None:
        if save_every_steps is not None and save_every_steps < 1:
            raise ValueError(f"save_every_steps must be >= 1, got {save_every_steps}")
        self.directory = os.path.abspath(directory)
        self._every_steps = save_every_steps
        self._every_seconds = save_every_seconds
        self._last_save = time.monotonic()
        options = ocp.CheckpointManagerOptions(
            preservation_policy=ocp.checkpoint_managers.LatestN(n=keep),
            enable_async_checkpointing=async_save,
            cleanup_tmp_directories=not read_only,
            create=not read_only,
            read_only=read_only,
        )
        # The handler named up front: reading a step's metadata in a new process then warns of nothing.
        self._manager = ocp.CheckpointManager(self.directory, options=options,
                                              item_handlers=ocp.StandardCheckpointHandler())

    def latest_step(self) -> int | None:
        """The newest complete checkpoint's step, or None."""
        return self._manager.latest_step()

    def maybe_save(self, step: int, state: PyTree, force: bool = False) -> bool:
        """Save if ``force`` or the step/time interval says so; True if a save started."""
        latest = self.latest_step()
        if latest is not None and step <= latest:
            return False
        if force or self._due(step):
            return self.save(step, state)
        return False

    def _due(self, step: int) -> bool:
        if self._every_steps is not None and step % self._every_steps == 0:
            return True
        if self._every_seconds is None:
            return False
        due = (time.monotonic() - self._last_save >= self._every_seconds
               and not self._manager.is_saving_in_progress())
        if jax.process_count() > 1:  # clocks differ; every process must take the same decision
            due = bool(multihost_utils.broadcast_one_to_all(np.bool_(due)))
        return due

    def save(self, step: int, state: PyTree, metadata: dict[str, Any] | None = None,
             replace: bool = False) -> bool:
        """Save now (regardless of intervals); False if ``step`` is already saved, unless
        ``replace``: then that checkpoint is deleted first (a kill in between leaves neither).
        ``metadata`` (JSON) is committed with the state: :meth:`metadata` reads it back."""
        if step in self._manager.all_steps():
            if not replace:
                return False
            self._manager.wait_until_finished()
            self._manager.delete(step)
        SAVES.save(self._manager, step, args=ocp.args.StandardSave(state), force=True,
                   custom_metadata=metadata)
        self._last_save = time.monotonic()
        return True

    def metadata(self, step: int) -> dict[str, Any]:
        """The ``metadata`` that the checkpoint of ``step`` was saved with ({} if none)."""
        return dict(self._manager.metadata(step).custom_metadata or {})

    def wait(self) -> None:
        """Block until every started save is committed."""
        self._manager.wait_until_finished()

    def restore(self, template: PyTree, step: int | None = None) -> PyTree:
        """Restore ``step`` (default: the latest) into arrays shaped and sharded as ``template``."""
        step = self.latest_step() if step is None else step
        if step is None:
            raise FileNotFoundError(f"no complete checkpoint in {self.directory}; check "
                                    "latest_step() before restoring")
        saved = sorted(self._manager.all_steps())
        if step not in saved:
            raise FileNotFoundError(f"no checkpoint of step {step} in {self.directory}; the saved steps are "
                                    f"{', '.join(map(str, saved))}")
        abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, template)
        try:
            return self._manager.restore(step, args=ocp.args.StandardRestore(abstract))
        except ValueError as error:
            if not any(sign in str(error) for sign in ("tree structures do not match", "Structure mismatch")):
                raise  # Orbax's two words for it: restoring into a template, or reading a checkpoint's metadata
            raise ValueError(f"the checkpoint of step {step} in {self.directory} holds a state of another structure "
                             f"than the one to restore (it was saved by another version of jaxdist, or for another "
                             f"agent, network or architecture): train afresh in a new run directory (or with "
                             f"--fresh)") from error

    def save_and_exit(self, step: int, state: PyTree, grace_seconds: float = 10.0) -> NoReturn:
        """Save ``step`` synchronously and exit 0; for SIGTERM / preemption.

        Raises SystemExit so ``finally`` blocks and atexit hooks run. A watchdog ends the
        process at 90% of ``grace_seconds`` (status 0 if the save committed, else 1), so a slow
        save or a hanging shutdown still exits before the supervisor's SIGKILL.
        """
        saved = threading.Event()
        watchdog = threading.Timer(0.9 * grace_seconds,
                                   lambda: os._exit(0 if saved.is_set() else 1))
        watchdog.daemon = True
        watchdog.start()
        self.save(step, state)
        self.close()
        saved.set()
        sys.exit(0)

    def close(self) -> None:
        """Wait for pending saves and release the manager."""
        self._manager.close()

    def __enter__(self) -> Checkpointer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def restore_saved(directory: str, template: Any, step: int | None, missing: Exception) -> tuple[int, Any]:
    """(step, the checkpoint of ``step`` in ``directory``, default the latest), shaped as
    ``template``, for a reader outside the run (``load_policy``); ``missing`` is raised when there
    is none. Reading a run changes nothing in it: no directory is created."""
    if not os.path.isdir(directory):
        raise missing
    with Checkpointer(directory, read_only=True) as checkpointer:
        latest = checkpointer.latest_step()
        if latest is None:
            raise missing
        step = latest if step is None else step
        return step, checkpointer.restore(template, step)
