"""A learner's publishing: what it tells the rest of the program about its training. Its
parameters, served by ``get`` (the ParameterServer's contract, so actors' ``VariableClient``
reads the learner directly or through a ``CacherNode``); a row of metrics every so many
steps in ``<run_dir>/metrics.csv``; and the env steps its updates played (Anakin's updates
play their envs), a counter summed over a dispatch's scanned updates, as an actor counts its own.

A part of its own because all three leave the devices the same way: a background thread
copies the parameters and metrics to the host and publishes them (latest version wins) or
writes them (in order), so the step loop never waits on a device-to-host copy. Only the
primary process of a learner spanning processes publishes and writes.
"""

from __future__ import annotations

import dataclasses
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxdist.learning import parallel
from jaxdist.learning.learner_logic import PyTree
from jaxdist.nodes.learner.steps import check_every, crossed
from jaxdist.nodes.parameter_server import VersionedParams
from jaxdist.records.metrics import MetricsWriter, metrics_path


@dataclasses.dataclass(frozen=True)
class PublishOptions:
    """How often a learner publishes its parameters (``every`` steps; None: only at its start
    and end) and logs its metrics (``log_every`` steps, into ``<run_dir>/<metrics>.csv``; a
    learner without a run directory, or with ``metrics=None``, writes no file). Rows past a
    restored step are dropped, and the first row after a restore carries
    ``learner/restored_step``: restarts are auditable from the metrics file alone."""

    every: int | None = 1
    log_every: int | None = 100
    metrics: str | None = "metrics"

    def __post_init__(self) -> None:
        check_every(every=self.every, log_every=self.log_every)


class Publishing:
    """Publishes the parameters ``params(train["state"])`` of the step ``dp`` runs, writes its
    metrics and counts its env steps, as ``options`` say; the version at ``step`` is published
    at once. ``restored_step``: where the learner resumed (None: a fresh start)."""

    def __init__(self, options: PublishOptions, dp: parallel.DataParallel, params: Callable[[PyTree], PyTree],
                 train: PyTree, step: int, *, name: str, run_dir: str | None = None,
                 restored_step: int | None = None) -> None:
        self._dp, self._params = dp, params
        self._every, self._log_every = options.every, options.log_every
        self._restored_step = restored_step
        self._published = VersionedParams()  # what get() serves, long polls capped
        primary = parallel.is_primary()
        self._writer = (MetricsWriter(metrics_path(run_dir, options.metrics), purge_after_step=step)
                        if primary and run_dir is not None and options.metrics is not None else None)
        self._io = _HostIO(self._writer, name) if primary else None
        self._rate = _Rate()
        self._last_metrics: PyTree = None
        self._logged_step = self._last_publish = step
        if primary:  # synchronously: get serves it at once
            self._published.push(jax.device_get(self._device_copy_of_params(train)), step)

    def get(self, min_version: int = -1, wait: float = 0.0) -> dict[str, Any]:
        """``{"version": step, "params": host arrays, or None unless newer than min_version}``;
        ``wait`` > 0 long-polls (see ``VersionedParams.get``)."""
        return self._published.get(min_version, wait)

    def version(self) -> int:
        """The version published last (-1 on a process that does not publish)."""
        return self._published.version()

    @property
    def env_steps(self) -> int:
        """The env steps counted so far (this life of the learner)."""
        return self._io.env_steps if self._io is not None else 0

    def count(self, env_steps: PyTree) -> None:
        """Add a dispatch's env steps (replicated device values, one per scanned update)."""
        if self._io is not None:  # metrics are one replicated value under pmap too (not stacked per device)
            self._io.count(jax.tree.map(lambda x: x.addressable_data(0), env_steps))

    def after_step(self, before: int, step: int, train: PyTree, metrics: PyTree) -> None:
        """Publish and log what the intervals crossed between ``before`` and ``step`` ask."""
        self._last_metrics = metrics
        self._rate.tick(step)
        if self._io is not None:
            if crossed(before, step, self._every):
                self._publish(step, train)
            if crossed(before, step, self._log_every):
                self._log(step, metrics)

    def flush(self) -> None:
        """Flush the metrics file once the rows logged so far are written (after a checkpoint,
        so that rows up to it survive a SIGKILL)."""
        if self._io is not None:
            self._io.flush()

    def finish(self, step: int, train: PyTree) -> None:
        """Log and publish the final step, if its interval did not, and flush."""
        if self._io is not None:
            if self._last_metrics is not None and self._logged_step != step:
                self._log(step, self._last_metrics)
            if self._last_publish != step:
                self._publish(step, train)
            self._io.flush()

    def drain(self) -> None:
        """Return once what was handed to the thread is published and written."""
        if self._io is not None:
            self._io.drain()

    def close(self) -> None:
        """Publish and write what is pending, then close the metrics file."""
        if self._io is not None:
            self._io.close()
        if self._writer is not None:
            self._writer.close()

    def _device_copy_of_params(self, train: PyTree) -> PyTree:
        """A fresh device-0 copy of the params: the state itself is donated to the next call."""
        copy = _copy_tree(self._dp.unreplicate(self._params(train["state"])))
        for leaf in jax.tree.leaves(copy):
            leaf.copy_to_host_async()
        return copy

    def _publish(self, step: int, train: PyTree) -> None:
        self._last_publish = step
        self._io.publish(step, self._device_copy_of_params(train), self._published.push)  # older: ignored

    def _log(self, step: int, metrics: PyTree) -> None:
        self._logged_step = step
        if self._writer is not None:
            rate = self._rate.value
            extra = {"learner/steps_per_second": rate} if rate else {}
            if self._restored_step is not None:  # the first row of a resumed life says where it resumed
                extra["learner/restored_step"] = self._restored_step
                self._restored_step = None
            self._io.log(step, metrics, self._dp.steps_per_call, extra)


@jax.jit
def _copy_tree(tree: PyTree) -> PyTree:
    """New buffers for every leaf in one dispatch (a ``jnp.copy`` per leaf costs ~20 us each)."""
    return jax.tree.map(jnp.copy, tree)


def host_metrics(metrics: PyTree, steps_per_call: int) -> dict[str, float]:
    """Metrics as host floats named by their path; a call's scanned steps are averaged."""
    flat = {}
    for path, value in jax.tree_util.tree_flatten_with_path(jax.device_get(metrics))[0]:
        name = "/".join(str(getattr(k, "key", getattr(k, "name", getattr(k, "idx", k)))) for k in path)
        value = np.asarray(value)
        flat[name or "value"] = float(value.mean(axis=0).mean() if steps_per_call > 1 else value.mean())
    return flat


class _Rate:
    """Steps per second between reads of ``value``, timed from the end of the first call
    (which compiles); dispatch is asynchronous, so this is the rate of dispatching."""

    def __init__(self) -> None:
        self._mark: tuple[float, int] | None = None
        self._last = 0.0

    def tick(self, step: int) -> None:
        if self._mark is None:
            self._mark = (time.monotonic(), step)
        self._step = step

    @property
    def value(self) -> float:
        if self._mark is None:
            return 0.0
        now, (then, start) = time.monotonic(), self._mark
        if self._step > start and now > then:
            self._last = (self._step - start) / (now - then)
            self._mark = (now, self._step)
        return self._last


class _HostIO:
    """A thread that copies published params and logged metrics to the host, then publishes
    (latest version wins) and writes rows, in order, so the step loop never waits on them."""

    def __init__(self, writer: Any, name: str) -> None:
        self._writer, self._name = writer, name
        self._cond = threading.Condition()
        self._params: tuple | None = None
        self._rows: list[tuple] = []
        self._counts: list[Any] = []
        self.env_steps = 0  # counted from the updates' env_steps metric
        self._flush = False
        self._busy = False
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name="learner-io", daemon=True)
        self._thread.start()

    def publish(self, version: int, device_params: PyTree, done: Callable[[PyTree, int], Any]) -> None:
        with self._cond:
            self._params = (version, device_params, done)
            self._cond.notify_all()

    def count(self, env_steps: PyTree) -> None:
        """Add a dispatch's env steps (device values, one per scanned update) to ``env_steps``."""
        with self._cond:
            self._counts.append(env_steps)
            self._cond.notify_all()

    def log(self, step: int, metrics: PyTree, steps_per_call: int, extra: dict[str, float]) -> None:
        with self._cond:
            self._rows.append((step, metrics, steps_per_call, extra))
            self._cond.notify_all()

    def flush(self) -> None:
        """Flush the metrics file after the rows logged so far are written."""
        with self._cond:
            self._flush = True
            self._cond.notify_all()

    def drain(self) -> None:
        with self._cond:
            self._cond.wait_for(lambda: not (self._params or self._rows or self._counts or self._flush or self._busy)
                                or self._closed)

    def close(self) -> None:
        self.drain()
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join(timeout=5)

    def _loop(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._params or self._rows or self._counts or self._flush or self._closed)
                if self._closed:
                    return
                params, self._params = self._params, None
                rows, self._rows = self._rows, []
                counts, self._counts = self._counts, []
                flush, self._flush = self._flush, False
                self._busy = True
            try:
                self.env_steps += sum(int(np.sum(count)) for count in jax.device_get(counts))
                for step, metrics, k, extra in rows:
                    self._writer.write(step, {**host_metrics(metrics, k), **extra})
                if flush and self._writer is not None:
                    self._writer.flush()
                if params is not None:
                    version, device_params, done = params
                    done(jax.device_get(device_params), version)
            except Exception:
                print(f"{self._name}: publishing or logging failed (training goes on):\n"
                      f"{traceback.format_exc()}", flush=True)
            finally:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()
