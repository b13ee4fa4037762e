"""TensorBoard event files, written by tensorboardX, and a small reader for the scalars in them.

    with TensorBoardWriter(os.path.join(run_dir, "tensorboard", "learner")) as tb:
        tb.config({"lr": 3e-4, "layers": [64, 64]})                  # the HParams tab and a text table
        tb.write(step, {"loss": 0.5, "actors": {"return": 200.0}})   # tags "loss", "actors/return"

``purge_step=S`` begins the file with a ``SessionLog.START`` at step S, as
``tensorboardX.SummaryWriter(purge_step=S)`` does: TensorBoard then hides the events at steps >= S
that an earlier, cut-short run wrote (a run resumed from a checkpoint at S redoes those steps).
"""

from __future__ import annotations

import os
import struct
import threading
import time
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
from tensorboardX import FileWriter, summary
from tensorboardX.proto.event_pb2 import Event, SessionLog
from tensorboardX.proto.summary_pb2 import Summary
from tensorboardX.record_writer import masked_crc32c


class TensorBoardWriter:
    """Scalars, text and a run's configuration to a new event file in ``logdir``.

    ``write(step, values)`` takes what ``MetricsWriter.write`` takes: numbers, bools or
    one-element arrays; nested dicts become ``a/b`` tags; None and non-numeric values are skipped.
    tensorboardX writes from a background thread, flushing every ``flush_every_seconds``; only
    ``close`` guarantees that everything written is on disk.
    """

    def __init__(self, logdir: str | os.PathLike, *, purge_step: int | None = None,
                 flush_every_seconds: float = 2.0) -> None:
        # TensorBoard reads a directory's event files in name order, and tensorboardX names them
        # by the second: the suffix keeps two writers' files apart and in the order they began.
        self._writer = FileWriter(logdir, flush_secs=flush_every_seconds,
                                  filename_suffix=f".{time.time_ns()}.{os.getpid()}")
        self._logdir = os.fspath(logdir)
        self._lock = threading.Lock()
        self._closed = False
        if purge_step is not None:
            self._add(Event(session_log=SessionLog(status=SessionLog.START)), purge_step)

    def write(self, step: int, values: Mapping[str, Any]) -> None:
        scalars = [Summary.Value(tag=tag, simple_value=value) for tag, value in _scalars(values).items()]
        if scalars:
            self._add(Event(summary=Summary(value=scalars)), step)

    def text(self, tag: str, text: str, step: int = 0) -> None:
        """Markdown for TensorBoard's Text tab, under ``<tag>/text_summary``."""
        self._add(Event(summary=summary.text(tag, text)), step)

    def config(self, config: Mapping[str, Any]) -> None:
        """A run's resolved configuration, as hparams (to compare runs) and as a table (to read one).

        Nested dicts become ``a/b`` names; None is left out of the hparams; values other than
        numbers, strings and bools (lists, tuples, paths) are recorded as their ``str``.
        """
        flat = _flatten(config)
        values = {name: _hparam(value) for name, value in flat.items() if value is not None}
        for part in summary.hparams(values, {}):  # what SummaryWriter.add_hparams writes, in this run
            self._add(Event(summary=part), 0)
        rows = "".join(f"| {name} | {_cell(value)} |\n" for name, value in flat.items())
        self.text("config", "| name | value |\n|---|---|\n" + rows)

    def flush(self) -> None:
        with self._lock:
            if not self._closed:
                self._writer.flush()

    def close(self) -> None:
        with self._lock:
            if not self._closed:
                self._closed = True
                self._writer.close()

    def __enter__(self) -> "TensorBoardWriter":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _add(self, event: Event, step: int) -> None:
        with self._lock:
            if self._closed:
                raise ValueError(f"TensorBoard writer for {self._logdir} is closed")
            self._writer.add_event(event, step)


def _flatten(values: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in values.items():
        if isinstance(value, Mapping):
            out.update(_flatten(value, f"{prefix}{key}/"))
        else:
            out[f"{prefix}{key}"] = value
    return out


def _scalars(values: Mapping[str, Any]) -> dict[str, float]:
    out: dict[str, float] = {}
    for tag, value in _flatten(values).items():
        if value is None or isinstance(value, str):
            continue
        array = np.asarray(value)
        if array.size == 1 and array.dtype.kind in "biuf":
            out[tag] = float(array.reshape(()))
    return out


def _hparam(value: Any) -> bool | int | float | str:
    if isinstance(value, np.generic):
        value = value.item()
    return value if isinstance(value, (bool, int, float, str)) else str(value)


def _cell(value: Any) -> str:
    return str(value).replace("|", "\\|").replace("\n", " ")


# Reading back (tests, and scripts that want the numbers without TensorBoard) ------------------


def _records(path: str | os.PathLike) -> Iterator[bytes]:
    """The records of a TFRecord file (``uint64 length``, ``masked crc32c``, data, ``masked
    crc32c``), each checked against both CRCs; a record cut short by a crash ends the file."""
    with open(path, "rb") as f:
        data = f.read()
    at = 0
    while at + 12 <= len(data):
        header = data[at:at + 8]
        (length,), (header_crc,) = struct.unpack("<Q", header), struct.unpack("<I", data[at + 8:at + 12])
        if masked_crc32c(header) != header_crc:
            raise ValueError(f"{path}: corrupt record header at byte {at}")
        if at + 16 + length > len(data):
            return
        body = data[at + 12:at + 12 + length]
        (body_crc,) = struct.unpack("<I", data[at + 12 + length:at + 16 + length])
        if masked_crc32c(body) != body_crc:
            raise ValueError(f"{path}: corrupt record at byte {at}")
        yield body
        at += 16 + length


def read_events(logdir: str | os.PathLike) -> list[Event]:
    """Every event of every event file directly in ``logdir``, in the order TensorBoard reads them
    (file names, then write order)."""
    names = sorted(name for name in os.listdir(logdir) if ".tfevents." in name)
    return [Event.FromString(record) for name in names for record in _records(os.path.join(logdir, name))]


def read_scalars(logdir: str | os.PathLike) -> dict[str, list[tuple[int, float]]]:
    """tag -> [(step, value)] in ``logdir``, with purges applied as TensorBoard applies them: a
    ``SessionLog.START`` at step S drops the points read so far at steps >= S, in every tag."""
    series: dict[str, list[tuple[int, float]]] = {}
    for event in read_events(logdir):
        if event.session_log.status == SessionLog.START:
            for tag in series:
                series[tag] = [(step, value) for step, value in series[tag] if step < event.step]
        for value in event.summary.value:
            if value.WhichOneof("value") == "simple_value":
                series.setdefault(value.tag, []).append((event.step, value.simple_value))
    return series


__all__ = ["TensorBoardWriter", "read_events", "read_scalars"]
