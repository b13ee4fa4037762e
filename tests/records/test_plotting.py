"""Line plots, read back as pixels: size, where the series and the horizontal lines land, log2 x,
and legends of many entries that leave the lines in sight."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from matplotlib import colormaps
from matplotlib.colors import to_rgb
from matplotlib.image import imread

from jaxdist.records.plotting import line_plot

SERIES, FIRST_HLINE = "C0", "C1"  # the colours of the first series and of the first hline after one series


def coloured(path, color, tolerance: float = 0.1) -> np.ndarray:
    """Where the PNG at `path` has `color`: a boolean (rows, columns) mask."""
    rgb = imread(path)[..., :3]
    return np.all(np.abs(rgb - np.array(to_rgb(color))) < tolerance, axis=-1)


def hline_row(mask: np.ndarray) -> float:
    """The row of a horizontal line in `mask`: the rows where it covers a third of the width or more
    (a dashed line that the legend may partly hide)."""
    rows = np.flatnonzero(mask.sum(axis=1) > mask.shape[1] / 3)
    assert rows.size and np.ptp(rows) <= 3, f"no single horizontal run of pixels: rows {rows}"
    return float(rows.mean())


def test_the_png_has_the_requested_size_and_the_series_spans_the_plot(tmp_path):
    path = tmp_path / "curve.png"
    line_plot(path, {"mean return": ([0.0, 5_000.0, 10_000.0], [1.0, 3.0, 2.0])}, title="t", xlabel="env steps",
              ylabel="return", log2_x=False, width=640, height=400)
    assert imread(path).shape[:2] == (400, 640)
    columns = coloured(path, SERIES).any(axis=0)
    assert columns.mean() > 0.6, "the series should run across most of the plot"


def test_hlines_are_dashed_horizontal_runs_at_their_y_values(tmp_path):
    path = tmp_path / "targets.png"
    line_plot(path, {"return": ([0.0, 10.0], [0.0, 500.0])}, log2_x=False,
              hlines={"zero": 0.0, "half": 250.0, "target 500": 500.0})
    zero, half, target = (coloured(path, f"C{n}") for n in (1, 2, 3))
    rows = [hline_row(zero), hline_row(half), hline_row(target)]
    assert rows[0] > rows[1] > rows[2], "a larger y is higher up the image"
    assert abs((rows[0] - rows[1]) - (rows[1] - rows[2])) <= 1.5, f"y maps linearly to rows: {rows}"
    run = np.flatnonzero(half[round(rows[1])])
    assert run[-1] - run[0] > 0.7 * half.shape[1], "the line spans the plot"
    assert run.size < 0.9 * (run[-1] - run[0]), "the line is dashed"


@pytest.mark.parametrize("returns, side", [([20.0, 200.0, 500.0], "above"), ([-500.0, -300.0, -95.0], "below"),
                                           ([-1.5, 0.0, 2.5], "both")])
def test_a_learning_curve_lies_on_the_side_of_zero_its_returns_are(tmp_path, returns, side):
    path = tmp_path / "curve.png"
    steps = [1000.0 * (i + 1) for i in range(len(returns))]
    line_plot(path, {"mean return": (steps, returns)}, xlabel="env steps", ylabel="return", log2_x=False,
              hlines={"zero": 0.0})
    zero_row = hline_row(coloured(path, FIRST_HLINE))
    series = coloured(path, SERIES)
    above = series[:round(zero_row) - 3].any(axis=0).mean()  # share of the columns the series reaches there
    below = series[round(zero_row) + 3:].any(axis=0).mean()
    legend = 0.1  # the legend's sample of the series line may sit on either side
    assert {"above": above > 0.5 and below < legend, "below": below > 0.5 and above < legend,
            "both": above > 0.2 and below > 0.2}[side], (above, below)


def test_log2_x_makes_a_log2_curve_a_straight_line(tmp_path):
    xs = list(2.0 ** np.linspace(0, 10, 50))
    curve = {"log2(x)": (xs, list(np.log2(xs)))}
    crossings = {}
    for log2_x in (True, False):
        path = tmp_path / f"log2_{log2_x}.png"
        line_plot(path, curve, log2_x=log2_x, hlines={"y = 5": 5.0}, width=800, height=400)
        row = round(hline_row(coloured(path, FIRST_HLINE)))
        near = coloured(path, SERIES)[row - 8:row + 9]  # just above and below the dashed line at y = 5
        crossings[log2_x] = np.flatnonzero(near.any(axis=0)).mean() / 800
    # The curve reaches 5 at x = 32: half way along a log2 axis from 1 to 1024, 3% along a linear one.
    assert 0.4 < crossings[True] < 0.65 and crossings[False] < 0.2, crossings


def test_an_empty_series_is_left_out_and_a_one_point_series_is_a_dot(tmp_path):
    path = tmp_path / "sparse.png"
    line_plot(path, {"nothing yet": ([], []), "one": ([5.0], [3.0])}, log2_x=False)
    dot = coloured(path, "C1")
    rows, columns = np.nonzero(dot[100:340, 200:520])  # the middle, away from the legend in a corner
    assert rows.size > 5 and np.ptp(rows) < 10 and np.ptp(columns) < 10, "one small dot in the middle"


def test_bad_series_say_what_is_wrong(tmp_path):
    with pytest.raises(ValueError, match="series 'a' has 3 x values and 2 y values"):
        line_plot(tmp_path / "a.png", {"a": ([1, 2, 3], [1.0, 2.0])})
    with pytest.raises(ValueError, match="series 'b' has x <= 0 .*log2_x=False"):
        line_plot(tmp_path / "b.png", {"b": ([0, 1, 2], [1.0, 2.0, 3.0])})
    assert not list(tmp_path.iterdir())


def test_a_sweeps_sixteen_configurations_get_sixteen_colours_and_a_legend_below_that_hides_no_line(tmp_path):
    """A 16-configuration sweep's plot had its legend over the lines (matplotlib then gave up
    on the layout with a warning), and configurations 1 and 11 shared a colour."""
    path = tmp_path / "sweep.png"
    grid = [(rate, clip, gae) for rate in (3e-4, 1e-3, 3e-3, 1e-2) for clip in (0.1, 0.2) for gae in (0.8, 0.95)]
    configurations = {f"learning_rate={rate:.4g} clip_eps={clip:.4g} gae_lambda={gae:.4g}": ([0.0, 10.0], [10.0 * n] * 2)
                      for n, (rate, clip, gae) in enumerate(grid)}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        line_plot(path, configurations, log2_x=False, hlines={"target 475": 475.0})
    height, width = imread(path).shape[:2]
    assert height > 440 + 16 * 15 and width == 720, "taller by the legend's rows, one a label: they are long"
    target = coloured(path, colormaps["tab20"](16)[:3])
    run = np.flatnonzero(target[round(hline_row(target))])
    assert run[-1] - run[0] > 0.7 * target.shape[1], "the target line spans the plot: no legend over it"
    rows = [hline_row(coloured(path, colormaps["tab20"](n)[:3], tolerance=0.05)[:440]) for n in range(16)]
    assert all(a > b for a, b in zip(rows, rows[1:])), f"each configuration its own colour, in order: {rows}"


def test_faint_series_are_one_legend_entry_drawn_behind_their_mean(tmp_path):
    path = tmp_path / "seeds.png"
    seeds = {f"seed {n}": ([0.0, 10.0], [n, 2.0 * n]) for n in range(32)}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        line_plot(path, {"mean over seeds": ([0.0, 10.0], [15.5, 31.0])}, faint=seeds, faint_label="each seed",
                  log2_x=False, hlines={"target 40": 40.0})
    assert imread(path).shape[:2] == (440, 720), "three legend entries fit beside the lines"
    assert coloured(path, "0.8", tolerance=0.06).sum() > 10_000, "the seeds are drawn, faint"
    assert coloured(path, SERIES).any(axis=0).mean() > 0.6, "the mean runs across the plot, over them"
