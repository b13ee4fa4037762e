"""jaxdist.records.metrics: the CSV writer across restarts, new columns, torn lines and purges."""

import jax.numpy as jnp
import numpy as np
import pytest

from jaxdist.records.metrics import MetricsWriter, metrics_path, read_metrics


def test_rows_are_readable_and_nested_values_become_slash_columns(tmp_path):
    path = metrics_path(tmp_path)
    assert path == str(tmp_path / "metrics.csv")
    with MetricsWriter(path) as writer:
        writer.write(1, {"loss": np.float32(0.5), "optim": {"lr": 1e-3}, "n": jnp.int32(7)})
        writer.write(2, {"loss": jnp.array(0.25), "optim": {"lr": 2e-3}, "n": 8})
    rows = read_metrics(path)
    assert [(r["step"], r["loss"], r["optim/lr"], r["n"]) for r in rows] == [(1, 0.5, 1e-3, 7), (2, 0.25, 2e-3, 8)]
    assert all(isinstance(r["wall_time"], float) for r in rows)


def test_a_reopened_file_is_appended_to_with_one_header(tmp_path):
    path = metrics_path(tmp_path)
    with MetricsWriter(path) as writer:
        writer.write(1, {"loss": 1.0})
    with MetricsWriter(path) as writer:
        writer.write(2, {"loss": 2.0})
    text = (tmp_path / "metrics.csv").read_text()
    assert text.count("step,wall_time,loss") == 1
    assert [r["step"] for r in read_metrics(path)] == [1, 2]


def test_a_column_added_later_widens_the_file_and_missing_values_are_empty(tmp_path):
    path = metrics_path(tmp_path)
    with MetricsWriter(path) as writer:
        writer.write(1, {"loss": 1.0})
        writer.write(2, {"loss": 2.0, "return": 10.0})
        writer.write(3, {"return": 11.0})
    with MetricsWriter(path) as writer:  # the widened header is kept on reopen
        assert writer.columns == ["step", "wall_time", "loss", "return"]
        writer.write(4, {"loss": 4.0})
    rows = read_metrics(path)
    assert [(r["loss"], r["return"]) for r in rows] == [(1.0, None), (2.0, 10.0), (None, 11.0), (4.0, None)]


def test_a_torn_last_line_is_dropped_on_reopen(tmp_path):
    path = metrics_path(tmp_path)
    with MetricsWriter(path) as writer:
        writer.write(1, {"loss": 1.0})
    with open(path, "a") as f:
        f.write("2,123.4,0.")  # the process died mid-row
    with MetricsWriter(path) as writer:
        writer.write(2, {"loss": 2.0})
    assert [(r["step"], r["loss"]) for r in read_metrics(path)] == [(1, 1.0), (2, 2.0)]


def test_purge_after_step_drops_rows_a_resumed_run_will_redo(tmp_path):
    path = metrics_path(tmp_path)
    with MetricsWriter(path) as writer:
        for step in range(1, 8):
            writer.write(step, {"loss": float(step)})
    with MetricsWriter(path, purge_after_step=4) as writer:
        writer.write(5, {"loss": 50.0})
    assert [(r["step"], r["loss"]) for r in read_metrics(path)] == [(1, 1.0), (2, 2.0), (3, 3.0), (4, 4.0),
                                                                     (5, 50.0)]


def test_rows_reach_the_file_on_the_flush_interval_or_flush(tmp_path):
    path = metrics_path(tmp_path)
    writer = MetricsWriter(path, flush_every_seconds=3600)
    assert read_metrics(path) == []  # the header is there at once
    writer.write(1, {"loss": 1.0})
    assert read_metrics(path) == []
    writer.flush()
    assert len(read_metrics(path)) == 1
    writer.close()
    eager = MetricsWriter(path, flush_every_seconds=0)
    eager.write(2, {"loss": 2.0})
    assert len(read_metrics(path)) == 2
    eager.close()


def test_bad_values_and_reserved_names_are_refused_by_name(tmp_path):
    with MetricsWriter(metrics_path(tmp_path)) as writer:
        with pytest.raises(TypeError, match="'grads' must be a number"):
            writer.write(1, {"grads": np.zeros(3)})
        with pytest.raises(ValueError, match="reserved"):
            writer.write(1, {"step": 3})
    with pytest.raises(ValueError, match="closed"):
        writer.write(2, {"loss": 1.0})
