"""The dependency-free TensorBoard writer: CRCs, framing, and events that real protobuf parses."""

from __future__ import annotations

import os
import struct

import numpy as np
import pytest

from jaxdist.metrics_tensorboard import (TensorBoardWriter, crc32c, encode_event, masked_crc32c, read_events,
                                         read_records, read_scalars)


def test_crc32c_known_answers():
    assert crc32c(b"123456789") == 0xE3069283  # the standard CRC-32C check value
    assert crc32c(b"") == 0
    assert crc32c(bytes(32)) == 0x8A9136AA  # RFC 3720 (iSCSI) test vector: 32 zero bytes


def test_scalars_round_trip_through_the_file(tmp_path):
    with TensorBoardWriter(tmp_path) as tb:
        tb.write(1, {"loss": 0.5, "actors": {"return": np.float32(21.0)}, "skipped": None, "text": "x"})
        tb.write(2, {"loss": np.array([0.25]), "ok": True})
    files = os.listdir(tmp_path)
    assert len(files) == 1 and files[0].startswith("events.out.tfevents.")
    events = read_events(tmp_path / files[0])
    assert events[0]["file_version"] == "brain.Event:2"
    assert [e["step"] for e in events[1:]] == [1, 2]
    assert events[1]["scalars"] == {"loss": 0.5, "actors/return": 21.0}
    assert read_scalars(tmp_path) == {"loss": [(1, 0.5), (2, 0.25)], "actors/return": [(1, 21.0)], "ok": [(2, 1.0)]}


def test_a_resumed_writer_purges_the_steps_it_will_redo(tmp_path):
    with TensorBoardWriter(tmp_path) as tb:
        for step in range(1, 6):
            tb.write(step, {"x": float(step)})
    with TensorBoardWriter(tmp_path, purge_step=3) as tb:  # resumed from a checkpoint at step 3
        tb.write(3, {"x": 30.0})
    assert read_scalars(tmp_path)["x"] == [(1, 1.0), (2, 2.0), (3, 30.0)]


def test_corruption_is_detected_and_a_torn_tail_is_ignored(tmp_path):
    with TensorBoardWriter(tmp_path) as tb:
        tb.write(1, {"x": 1.0})
        tb.write(2, {"x": 2.0})
    path = tmp_path / os.listdir(tmp_path)[0]
    data = path.read_bytes()
    path.write_bytes(data[:-3])  # a crash mid-write
    assert len(list(read_records(path))) == 2
    flipped = bytearray(data)
    flipped[-6] ^= 0xFF
    path.write_bytes(bytes(flipped))
    with pytest.raises(ValueError, match="corrupt record"):
        list(read_records(path))


def test_framing_is_tfrecord():
    record = encode_event(7, 1.5, scalars={"a": 2.0})
    from jaxdist.metrics_tensorboard import frame_record

    framed = frame_record(record)
    (length,) = struct.unpack("<Q", framed[:8])
    assert length == len(record)
    assert struct.unpack("<I", framed[8:12])[0] == masked_crc32c(framed[:8])
    assert struct.unpack("<I", framed[-4:])[0] == masked_crc32c(record)


def event_message_class():
    """tensorflow.Event / Summary built at run time from their field numbers (no .proto files)."""
    descriptor_pb2 = pytest.importorskip("google.protobuf.descriptor_pb2")
    from google.protobuf import descriptor_pool, message_factory

    F = descriptor_pb2.FieldDescriptorProto
    file = descriptor_pb2.FileDescriptorProto(name="jaxdist_test_event.proto", package="tensorflow")

    def message(name, fields):
        m = file.message_type.add(name=name)
        for field_name, number, kind, label, type_name in fields:
            f = m.field.add(name=field_name, number=number, type=kind, label=label)
            if type_name:
                f.type_name = type_name

    optional, repeated = F.LABEL_OPTIONAL, F.LABEL_REPEATED
    message("SummaryValue", [("tag", 1, F.TYPE_STRING, optional, None),
                             ("simple_value", 2, F.TYPE_FLOAT, optional, None)])
    message("Summary", [("value", 1, F.TYPE_MESSAGE, repeated, ".tensorflow.SummaryValue")])
    message("SessionLog", [("status", 1, F.TYPE_INT32, optional, None)])
    message("Event", [("wall_time", 1, F.TYPE_DOUBLE, optional, None), ("step", 2, F.TYPE_INT64, optional, None),
                      ("file_version", 3, F.TYPE_STRING, optional, None),
                      ("summary", 5, F.TYPE_MESSAGE, optional, ".tensorflow.Summary"),
                      ("session_log", 6, F.TYPE_MESSAGE, optional, ".tensorflow.SessionLog")])
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("tensorflow.Event"))


def test_events_parse_with_the_protobuf_runtime():
    Event = event_message_class()
    event = Event.FromString(encode_event(123456789012, 1700000000.25, scalars={"a/b": 0.5, "c": -3.0}))
    assert event.step == 123456789012 and event.wall_time == 1700000000.25
    assert [(v.tag, v.simple_value) for v in event.summary.value] == [("a/b", 0.5), ("c", -3.0)]
    assert Event.FromString(encode_event(4, 0.0, session_start=True)).session_log.status == 1
    assert Event.FromString(encode_event(-1, 0.0, file_version="brain.Event:2")).step == -1
