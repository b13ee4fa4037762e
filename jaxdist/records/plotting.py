"""Line plots to PNG with matplotlib: learning curves and benchmark sweeps.

    line_plot("out.png", {"one server": ([1, 2, 4], [1.0, 1.4, 1.5])}, title=..., xlabel=..., ylabel=...)
    line_plot("curve.png", {"return": (env_steps, returns)}, log2_x=False, hlines={"target 475": 475.0})

With ``log2_x`` (the default) x is log2-scaled and each x value gets a tick, for sweeps over
1, 2, 4, ...; without it x is linear, for curves of many points. matplotlib is imported on the
first plot (not when a training script imports this module), and the figure is drawn on its own
Agg canvas, never through pyplot, so no backend or global state changes for other users.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

_MAX_MARKED_POINTS = 40  # beyond this, markers hide the line
_MAX_LOG2_TICKS = 16  # beyond this, one tick per x value overlaps


def line_plot(path: str | os.PathLike, series: Mapping[str, tuple[Sequence[float], Sequence[float]]], *,
              title: str = "", xlabel: str = "", ylabel: str = "", log2_x: bool = True,
              hlines: Mapping[str, float] | None = None, width: int = 720, height: int = 440) -> None:
    """One line per series (``name -> (xs, ys)``) and one dashed line per ``hlines`` entry
    (``label -> y``, e.g. a target return), written as a ``width`` x ``height`` PNG."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import FuncFormatter, MaxNLocator

    for name, (xs, ys) in series.items():
        if len(xs) != len(ys):
            raise ValueError(f"series {name!r} has {len(xs)} x values and {len(ys)} y values; give one y per x")
        if log2_x and any(x <= 0 for x in xs):
            raise ValueError(f"series {name!r} has x <= 0 ({min(xs):g}), which log2_x cannot place; "
                             "pass log2_x=False")
    dpi = 100
    figure = Figure(figsize=(width / dpi, height / dpi), dpi=dpi, layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    for n, (name, (xs, ys)) in enumerate(series.items()):
        axes.plot(xs, ys, color=f"C{n % 10}", linewidth=2, label=name,
                  marker="o" if len(xs) <= _MAX_MARKED_POINTS else None, markersize=4)
    for n, (label, y) in enumerate((hlines or {}).items(), start=len(series)):
        axes.axhline(y, color=f"C{n % 10}", linestyle="--", linewidth=1.5, label=label)
    if log2_x:
        axes.set_xscale("log", base=2)
        ticks = sorted({x for xs, _ in series.values() for x in xs})
        if 0 < len(ticks) <= _MAX_LOG2_TICKS:
            axes.set_xticks(ticks)
    else:
        axes.xaxis.set_major_locator(MaxNLocator(nbins=6))  # room for "1,500,000"
    axes.xaxis.set_major_formatter(FuncFormatter(lambda x, _: f"{x:,.10g}"))  # 1,000,000 env steps
    axes.set_title(title)
    axes.set_xlabel(xlabel)
    axes.set_ylabel(ylabel)
    axes.grid(True, alpha=0.3)
    if series or hlines:
        axes.legend(loc="best")
    figure.savefig(path, dpi=dpi)
