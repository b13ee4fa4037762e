"""TensorBoard scalars without TensorFlow or tensorboard: a tiny event-file writer (and reader).

    with TensorBoardWriter(os.path.join(run_dir, "tensorboard", "learner")) as tb:
        tb.write(step, {"loss": 0.5, "actors": {"return": 200.0}})   # tags "loss", "actors/return"

An event file is a sequence of TFRecords (``uint64 length``, ``masked crc32c(length)``,
``data``, ``masked crc32c(data)``), each an ``Event`` protobuf: ``wall_time`` (field 1, double),
``step`` (2, int64), ``file_version`` (3, string), ``summary`` (5: repeated ``Value`` (1):
``tag`` (1, string), ``simple_value`` (2, float)), ``session_log`` (6: ``status`` (1, enum)).
Those few fields are encoded here by hand. ``purge_step=S`` writes a ``SessionLog.START`` at
step S, which tells TensorBoard to drop the events at steps >= S that an earlier, interrupted
run wrote (a run resumed from a checkpoint at S redoes those steps), as ``tf.summary`` does.
"""

from __future__ import annotations

import os
import socket
import struct
import threading
import time
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

_CRC_TABLE = []
for _n in range(256):
    _c = _n
    for _ in range(8):
        _c = (_c >> 1) ^ 0x82F63B78 if _c & 1 else _c >> 1  # CRC-32C (Castagnoli), reflected
    _CRC_TABLE.append(_c)
_file_counter = 0
_counter_lock = threading.Lock()


def crc32c(data: bytes) -> int:
    crc = 0xFFFFFFFF
    for byte in data:
        crc = _CRC_TABLE[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def masked_crc32c(data: bytes) -> int:
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def _varint(value: int) -> bytes:
    value &= (1 << 64) - 1  # int64 negatives as two's complement
    out = bytearray()
    while True:
        bits = value & 0x7F
        value >>= 7
        if value:
            out.append(bits | 0x80)
        else:
            out.append(bits)
            return bytes(out)


def _field(number: int, wire_type: int, payload: bytes) -> bytes:
    return _varint(number << 3 | wire_type) + payload


def _length_delimited(number: int, payload: bytes) -> bytes:
    return _field(number, 2, _varint(len(payload)) + payload)


def encode_event(step: int, wall_time: float, *, scalars: Mapping[str, float] | None = None,
                 file_version: str | None = None, session_start: bool = False) -> bytes:
    """One serialized ``Event`` holding scalars, a file version, or a ``SessionLog.START``."""
    event = _field(1, 1, struct.pack("<d", wall_time)) + _field(2, 0, _varint(int(step)))
    if file_version is not None:
        event += _length_delimited(3, file_version.encode())
    if scalars:
        values = b"".join(_length_delimited(1, _length_delimited(1, tag.encode()) +
                                            _field(2, 5, struct.pack("<f", float(value))))
                          for tag, value in scalars.items())
        event += _length_delimited(5, values)
    if session_start:
        event += _length_delimited(6, _field(1, 0, _varint(1)))
    return event


def frame_record(data: bytes) -> bytes:
    """TFRecord framing of one serialized record."""
    header = struct.pack("<Q", len(data))
    return header + struct.pack("<I", masked_crc32c(header)) + data + struct.pack("<I", masked_crc32c(data))


class TensorBoardWriter:
    """Scalars to a new event file in ``logdir``; ``write(step, values)`` like ``MetricsWriter``.

    Values are numbers, bools or one-element arrays; nested dicts become ``a/b`` tags; values
    that are None or not finite-castable are skipped. Thread-safe; flushed every
    ``flush_every_seconds`` and on ``flush``/``close``.
    """

    def __init__(self, logdir: str | os.PathLike, *, purge_step: int | None = None,
                 flush_every_seconds: float = 2.0) -> None:
        global _file_counter
        os.makedirs(logdir, exist_ok=True)
        with _counter_lock:
            _file_counter += 1
            counter = _file_counter
        name = f"events.out.tfevents.{int(time.time()):010d}.{socket.gethostname()}.{os.getpid()}.{counter}"
        self.path = os.path.join(os.path.abspath(logdir), name)
        self._lock = threading.Lock()
        self._file = open(self.path, "wb")
        self._flush_every = flush_every_seconds
        self._last_flush = time.monotonic()
        self._file.write(frame_record(encode_event(0, time.time(), file_version="brain.Event:2")))
        if purge_step is not None:
            self._file.write(frame_record(encode_event(purge_step, time.time(), session_start=True)))
        self._file.flush()

    def write(self, step: int, values: Mapping[str, Any]) -> None:
        scalars = {tag: value for tag, value in _scalars(values).items()}
        if not scalars:
            return
        record = frame_record(encode_event(step, time.time(), scalars=scalars))
        with self._lock:
            if self._file is None:
                raise ValueError(f"TensorBoard writer for {self.path} is closed")
            self._file.write(record)
            if time.monotonic() - self._last_flush >= self._flush_every:
                self._file.flush()
                self._last_flush = time.monotonic()

    def flush(self) -> None:
        with self._lock:
            if self._file is not None:
                self._file.flush()

    def close(self) -> None:
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None

    def __enter__(self) -> "TensorBoardWriter":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def _scalars(values: Mapping[str, Any], prefix: str = "") -> dict[str, float]:
    out: dict[str, float] = {}
    for key, value in values.items():
        tag = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(_scalars(value, f"{tag}/"))
            continue
        if value is None or isinstance(value, str):
            continue
        array = np.asarray(value)
        if array.size == 1 and array.dtype.kind in "biuf":
            out[tag] = float(array.reshape(()))
    return out


# Reading back (tests, and scripts that want the numbers without TensorBoard) ------------------


def read_records(path: str | os.PathLike) -> Iterator[bytes]:
    """The records of a TFRecord file, each checked against both of its CRCs."""
    with open(path, "rb") as f:
        data = f.read()
    at = 0
    while at + 12 <= len(data):
        header = data[at:at + 8]
        (length,), (header_crc,) = struct.unpack("<Q", header), struct.unpack("<I", data[at + 8:at + 12])
        if masked_crc32c(header) != header_crc:
            raise ValueError(f"{path}: corrupt record header at byte {at}")
        body = data[at + 12:at + 12 + length]
        if len(body) < length or at + 16 + length > len(data):
            return  # a record cut short by a crash: the end of the readable file
        (body_crc,) = struct.unpack("<I", data[at + 12 + length:at + 16 + length])
        if masked_crc32c(body) != body_crc:
            raise ValueError(f"{path}: corrupt record at byte {at}")
        yield body
        at += 16 + length


def _fields(message: bytes) -> Iterator[tuple[int, int, Any]]:
    at = 0
    while at < len(message):
        key, at = _read_varint(message, at)
        number, wire_type = key >> 3, key & 7
        if wire_type == 0:
            value, at = _read_varint(message, at)
        elif wire_type == 1:
            value, at = message[at:at + 8], at + 8
        elif wire_type == 5:
            value, at = message[at:at + 4], at + 4
        elif wire_type == 2:
            length, at = _read_varint(message, at)
            value, at = message[at:at + length], at + length
        else:
            raise ValueError(f"unsupported protobuf wire type {wire_type}")
        yield number, wire_type, value


def _read_varint(data: bytes, at: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, at


def read_events(path: str | os.PathLike) -> list[dict[str, Any]]:
    """Events as dicts: ``{"wall_time", "step", "file_version"?, "scalars"?, "session_start"?}``."""
    events = []
    for record in read_records(path):
        event: dict[str, Any] = {"step": 0}
        for number, _, value in _fields(record):
            if number == 1:
                event["wall_time"] = struct.unpack("<d", value)[0]
            elif number == 2:
                event["step"] = value - (1 << 64) if value >= 1 << 63 else value
            elif number == 3:
                event["file_version"] = value.decode()
            elif number == 5:
                scalars = event.setdefault("scalars", {})
                for _, _, summary_value in _fields(value):
                    fields = {n: v for n, _, v in _fields(summary_value)}
                    scalars[fields[1].decode()] = struct.unpack("<f", fields[2])[0]
            elif number == 6:
                event["session_start"] = dict((n, v) for n, _, v in _fields(value)).get(1) == 1
        events.append(event)
    return events


def read_scalars(logdir: str | os.PathLike) -> dict[str, list[tuple[int, float]]]:
    """tag -> [(step, value)] over every event file in ``logdir`` (file order, then write
    order), with the purges that ``SessionLog.START`` events ask for applied."""
    series: dict[str, list[tuple[int, float]]] = {}
    for name in sorted(os.listdir(logdir)):
        if ".tfevents." not in name:
            continue
        for event in read_events(os.path.join(logdir, name)):
            if event.get("session_start"):
                for tag in series:
                    series[tag] = [(s, v) for s, v in series[tag] if s < event["step"]]
            for tag, value in event.get("scalars", {}).items():
                series.setdefault(tag, []).append((event["step"], value))
    return series


__all__ = ["TensorBoardWriter", "crc32c", "encode_event", "frame_record", "masked_crc32c", "read_events",
           "read_records", "read_scalars"]
