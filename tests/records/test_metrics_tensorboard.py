"""The TensorBoard writer: scalars, purges, text and a run's configuration, read back from the files."""

from __future__ import annotations

import os

import numpy as np
import pytest
from tensorboardX.proto.plugin_hparams_pb2 import HParamsPluginData

from jaxdist.records.metrics_tensorboard import TensorBoardWriter, read_events, read_scalars


def texts(logdir) -> dict[str, list[tuple[int, str]]]:
    """tag -> [(step, markdown)] of the text summaries in `logdir`."""
    found: dict[str, list[tuple[int, str]]] = {}
    for event in read_events(logdir):
        for value in event.summary.value:
            if value.metadata.plugin_data.plugin_name == "text":
                found.setdefault(value.tag, []).append((event.step, value.tensor.string_val[0].decode()))
    return found


def test_a_written_scalar_reads_back_with_its_step_and_value(tmp_path):
    with TensorBoardWriter(tmp_path) as tb:
        tb.write(1, {"loss": 0.5, "actors": {"return": np.float32(21.0)}, "skipped": None, "text": "x"})
        tb.write(2, {"loss": np.array([0.25]), "ok": True, "vector": np.zeros(3)})
        tb.write(3, {"nothing": None})
    files = os.listdir(tmp_path)
    assert len(files) == 1 and files[0].startswith("events.out.tfevents.")
    assert read_events(tmp_path)[0].file_version == "brain.Event:2"
    assert read_scalars(tmp_path) == {"loss": [(1, 0.5), (2, 0.25)], "actors/return": [(1, 21.0)], "ok": [(2, 1.0)]}


def test_a_resumed_writer_hides_the_steps_the_cut_short_run_wrote_from_its_purge_step_on(tmp_path):
    with TensorBoardWriter(tmp_path) as tb:
        for step in range(1, 6):
            tb.write(step, {"x": float(step), "y": -float(step)})
    with TensorBoardWriter(tmp_path, purge_step=3) as tb:  # resumed from a checkpoint at step 3
        tb.write(3, {"x": 30.0})
        tb.write(4, {"x": 40.0})
    assert len(os.listdir(tmp_path)) == 2
    assert read_scalars(tmp_path) == {"x": [(1, 1.0), (2, 2.0), (3, 30.0), (4, 40.0)], "y": [(1, -1.0), (2, -2.0)]}


def test_without_a_purge_step_a_second_writer_keeps_the_first_ones_points(tmp_path):
    with TensorBoardWriter(tmp_path) as tb:
        tb.write(1, {"x": 1.0})
    with TensorBoardWriter(tmp_path) as tb:
        tb.write(1, {"x": 2.0})
    assert read_scalars(tmp_path) == {"x": [(1, 1.0), (1, 2.0)]}


def test_config_lands_as_hparams_and_as_a_text_table(tmp_path):
    with TensorBoardWriter(tmp_path) as tb:
        tb.config({"lr": 3e-4, "layers": (64, 64), "env": {"id": "CartPole-v1", "render": False},
                   "seed": np.int64(7), "note": "a|b", "unset": None})
    plugin = {value.tag: HParamsPluginData.FromString(value.metadata.plugin_data.content)
              for event in read_events(tmp_path) for value in event.summary.value
              if value.metadata.plugin_data.plugin_name == "hparams"}
    names = ["lr", "layers", "env/id", "env/render", "seed", "note"]
    assert [info.name for info in plugin["_hparams_/experiment"].experiment.hparam_infos] == names
    started = plugin["_hparams_/session_start_info"].session_start_info.hparams
    assert {name: getattr(value, value.WhichOneof("kind")) for name, value in started.items()} == {
        "lr": pytest.approx(3e-4), "layers": "(64, 64)", "env/id": "CartPole-v1", "env/render": False, "seed": 7.0,
        "note": "a|b"}
    [(step, table)] = texts(tmp_path)["config/text_summary"]
    assert step == 0
    assert table.splitlines() == ["| name | value |", "|---|---|", "| lr | 0.0003 |", "| layers | (64, 64) |",
                                  "| env/id | CartPole-v1 |", "| env/render | False |", "| seed | 7 |",
                                  "| note | a\\|b |", "| unset | None |"]


def test_text_reads_back_under_its_tag_and_step(tmp_path):
    with TensorBoardWriter(tmp_path) as tb:
        tb.text("notes", "resumed at **step 40**", step=40)
    assert texts(tmp_path) == {"notes/text_summary": [(40, "resumed at **step 40**")]}


def test_writing_after_close_says_the_writer_is_closed(tmp_path):
    tb = TensorBoardWriter(tmp_path)
    tb.close()
    tb.close()
    with pytest.raises(ValueError, match="is closed"):
        tb.write(1, {"x": 1.0})


def test_a_torn_tail_is_ignored_and_corruption_is_detected(tmp_path):
    with TensorBoardWriter(tmp_path) as tb:
        tb.write(1, {"x": 1.0})
        tb.write(2, {"x": 2.0})
    path = tmp_path / os.listdir(tmp_path)[0]
    data = path.read_bytes()
    path.write_bytes(data[:-3])  # a crash mid-write
    assert read_scalars(tmp_path) == {"x": [(1, 1.0)]}
    flipped = bytearray(data)
    flipped[-6] ^= 0xFF
    path.write_bytes(bytes(flipped))
    with pytest.raises(ValueError, match="corrupt record"):
        read_scalars(tmp_path)
