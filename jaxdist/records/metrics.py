"""Metrics as CSV: one row per logged step in one file (``<run_dir>/metrics.csv``), readable
(by pandas, a spreadsheet, :func:`read_metrics`) while the run goes on.

    with MetricsWriter(metrics_path(run_dir)) as metrics:
        metrics.write(step, {"loss": 0.5, "optim": {"lr": 1e-3}})   # columns "loss", "optim/lr"

- A restarted run appends to the same file; the header is written once. A half-written last
  line (the process was killed mid-write) is dropped when the file is reopened.
- ``purge_after_step=S`` drops rows past step ``S`` when the file is opened: a run resumed from
  a checkpoint at step S redoes those steps, so the file keeps one row per step, as
  TensorBoard's purge does.
- A key first seen in a later row adds a column: the file is rewritten once with the wider
  header, and earlier rows get an empty cell. A row without some column gets an empty cell.
- Rows are flushed to the OS every ``flush_every_seconds`` and on :meth:`close`.

Values are numbers, bools, strings, or one-element arrays (NumPy or JAX); nested dicts are
flattened with ``/``. No JAX import here: arrays are read through ``np.asarray``.
"""

from __future__ import annotations

import csv
import io
import os
import threading
import time
from collections.abc import Mapping
from typing import Any

import numpy as np

RESERVED = ("step", "wall_time")


def metrics_path(run_dir: str | os.PathLike, name: str = "metrics") -> str:
    """``<run_dir>/<name>.csv`` as an absolute path."""
    return os.path.abspath(os.path.join(run_dir, f"{name}.csv"))


class MetricsWriter:
    """Append rows of ``{"step", "wall_time", <metric>...}`` to a CSV file; thread-safe."""

    def __init__(self, path: str | os.PathLike, *, flush_every_seconds: float = 5.0,
                 purge_after_step: int | None = None) -> None:
        self.path = os.path.abspath(path)
        self._flush_every = flush_every_seconds
        self._lock = threading.Lock()
        self._last_flush = time.monotonic()
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        self._columns = self._recover(purge_after_step)
        self._file = open(self.path, "a", newline="", encoding="utf-8")
        self._csv = csv.writer(self._file)
        if not self._columns:
            self._columns = list(RESERVED)
            self._csv.writerow(self._columns)
            self._file.flush()

    def write(self, step: int, values: Mapping[str, Any]) -> None:
        """One row for ``step``; ``values`` may nest dicts ("a": {"b": 1} is column "a/b")."""
        row = {"step": int(step), "wall_time": round(time.time(), 3)}
        for key, value in _flatten(values).items():
            if key in RESERVED:
                raise ValueError(f"metric name {key!r} is reserved for the writer's own column")
            row[key] = _cell(key, value)
        with self._lock:
            if self._file is None:
                raise ValueError(f"metrics writer for {self.path} is closed")
            new = [key for key in row if key not in self._columns]
            if new:
                self._widen(new)
            self._csv.writerow([row.get(column, "") for column in self._columns])
            if time.monotonic() - self._last_flush >= self._flush_every:
                self._flush_locked()

    @property
    def columns(self) -> list[str]:
        return list(self._columns)

    def flush(self) -> None:
        with self._lock:
            if self._file is not None:
                self._flush_locked()

    def close(self) -> None:
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None

    def __enter__(self) -> MetricsWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _flush_locked(self) -> None:
        self._file.flush()
        self._last_flush = time.monotonic()

    def _recover(self, purge_after_step: int | None) -> list[str]:
        """Columns of an existing file, after dropping a torn last line and purged rows."""
        try:
            with open(self.path, newline="", encoding="utf-8") as f:
                text = f.read()
        except FileNotFoundError:
            return []
        complete = text[:text.rfind("\n") + 1]  # a line without its newline was cut short
        rows = list(csv.reader(io.StringIO(complete)))
        if not rows:
            _rewrite(self.path, [])
            return []
        header, body = rows[0], rows[1:]
        if purge_after_step is not None and "step" in header:
            at = header.index("step")
            body = [row for row in body if row[at] == "" or int(row[at]) <= purge_after_step]
        if complete != text or len(body) != len(rows) - 1:
            _rewrite(self.path, [header, *body])
        return header

    def _widen(self, new: list[str]) -> None:
        """Rewrite the file with ``new`` columns appended to the header."""
        self._file.close()
        with open(self.path, newline="", encoding="utf-8") as f:
            rows = list(csv.reader(f))
        self._columns += new
        pad = [""] * len(new)
        _rewrite(self.path, [self._columns, *(row + pad for row in rows[1:])])
        self._file = open(self.path, "a", newline="", encoding="utf-8")
        self._csv = csv.writer(self._file)


def read_metrics(path: str | os.PathLike) -> list[dict[str, Any]]:
    """Rows of a metrics CSV as dicts: numbers as int or float, empty cells as None."""
    with open(path, newline="", encoding="utf-8") as f:
        return [{key: _parse(value) for key, value in row.items()} for row in csv.DictReader(f)]


def _rewrite(path: str, rows: list[list[str]]) -> None:
    """Replace the file atomically: a crash mid-rewrite leaves the old file intact."""
    tmp = f"{path}.tmp"
    with open(tmp, "w", newline="", encoding="utf-8") as f:
        csv.writer(f).writerows(rows)
    os.replace(tmp, path)


def _flatten(values: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in values.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(_flatten(value, f"{name}/"))
        else:
            flat[name] = value
    return flat


def _cell(key: str, value: Any) -> Any:
    if isinstance(value, (str, bool, int, float)):
        return value
    array = np.asarray(value)
    if array.size != 1 or array.dtype.kind not in "biuf":
        raise TypeError(f"metric {key!r} must be a number or a one-element array, got "
                        f"{type(value).__name__} of shape {array.shape} and dtype {array.dtype}")
    return array.item()


def _parse(value: str | None) -> Any:
    if value is None or value == "":
        return None
    for kind in (int, float):
        try:
            return kind(value)
        except ValueError:
            pass
    return value


