"""Line plots to PNG with matplotlib: learning curves and benchmark sweeps.

    line_plot("out.png", {"one server": ([1, 2, 4], [1.0, 1.4, 1.5])}, title=..., xlabel=..., ylabel=...)
    line_plot("curve.png", {"return": (env_steps, returns)}, log2_x=False, hlines={"target 475": 475.0})

With ``log2_x`` (the default) x is log2-scaled and each x value gets a tick, for sweeps over
1, 2, 4, ...; without it x is linear, for curves of many points. ``faint`` series (every seed of a
run) are drawn thin behind the others, in one colour and one legend entry. A legend of more
entries than fit beside the lines goes below the plot, which keeps its size; past ten series the
colours come from a 20-colour map, so a sweep's configurations stay apart. matplotlib is imported
on the first plot (not when a training script imports this module), and the figure is drawn on its
own Agg canvas, never through pyplot, so no backend or global state changes for other users.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

_MAX_MARKED_POINTS = 40  # beyond this, markers hide the line
_MAX_LOG2_TICKS = 16  # beyond this, one tick per x value overlaps
_MAX_LEGEND_INSIDE = 6  # beyond this, the legend would hide the lines it names
_LEGEND_ROW_PIXELS = 17  # one row of a small-font legend below the plot
_MAX_LABEL_IN_TWO_COLUMNS = 40  # characters of a small-font label that fit half the default width


Series = tuple[Sequence[float], Sequence[float]]


def line_plot(path: str | os.PathLike, series: Mapping[str, Series], *,
              title: str = "", xlabel: str = "", ylabel: str = "", log2_x: bool = True,
              hlines: Mapping[str, float] | None = None, faint: Mapping[str, Series] | None = None,
              faint_label: str = "each", width: int = 720, height: int = 440) -> None:
    """One line per series (``name -> (xs, ys)``), one dashed line per ``hlines`` entry (``label
    -> y``, e.g. a target return) and the ``faint`` series under ``faint_label``, written as a
    ``width`` x ``height`` PNG (taller by the rows of a legend that goes below the plot)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import FuncFormatter, MaxNLocator

    faint = {name: curve for name, curve in (faint or {}).items() if len(curve[0])}
    for name, (xs, ys) in {**series, **faint}.items():
        if len(xs) != len(ys):
            raise ValueError(f"series {name!r} has {len(xs)} x values and {len(ys)} y values; give one y per x")
        if log2_x and any(x <= 0 for x in xs):
            raise ValueError(f"series {name!r} has x <= 0 ({min(xs):g}), which log2_x cannot place; "
                             "pass log2_x=False")
    entries = len(series) + len(hlines or {}) + bool(faint)
    below = entries > _MAX_LEGEND_INSIDE
    labels = [*series, *(hlines or {})]
    columns = 2 if max(map(len, labels), default=0) <= _MAX_LABEL_IN_TWO_COLUMNS else 1
    legend_rows = -(-entries // columns) if below else 0
    dpi = 100
    figure = Figure(figsize=(width / dpi, (height + legend_rows * _LEGEND_ROW_PIXELS) / dpi), dpi=dpi,
                    layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    colour = _palette(len(series) + len(hlines or {}))
    for n, (xs, ys) in enumerate(faint.values()):
        axes.plot(xs, ys, color="0.55", alpha=0.45, linewidth=1, label=f"{faint_label} ({len(faint)})" if n == 0 else None)
    for n, (name, (xs, ys)) in enumerate(series.items()):
        axes.plot(xs, ys, color=colour(n), linewidth=2, label=name,
                  marker="o" if len(xs) <= _MAX_MARKED_POINTS else None, markersize=4)
    for n, (label, y) in enumerate((hlines or {}).items(), start=len(series)):
        axes.axhline(y, color=colour(n), linestyle="--", linewidth=1.5, label=label)
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
    if below:
        figure.legend(loc="outside lower center", ncols=columns, fontsize="small")
    elif entries:
        axes.legend(loc="best")
    figure.savefig(path, dpi=dpi)


def _palette(lines: int) -> Callable[[int], Any]:
    """The n-th line's colour: matplotlib's ten cycle colours, or tab20's twenty for more lines."""
    if lines <= 10:
        return lambda n: f"C{n}"
    from matplotlib import colormaps

    return lambda n: colormaps["tab20"](n % 20)
