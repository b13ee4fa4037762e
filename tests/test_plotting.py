"""Learning-curve plots: a PNG for positive, negative and mixed returns."""

from __future__ import annotations

import pytest

from jaxdist.plotting import line_plot


@pytest.mark.parametrize("returns", [[20.0, 200.0, 500.0], [-500.0, -300.0, -95.0], [-1.5, 0.0, 2.5], [0.0, 0.0]])
def test_a_learning_curve_is_drawn_whatever_the_sign_of_the_returns(tmp_path, returns):
    path = tmp_path / "curve.png"
    steps = [1000.0 * (i + 1) for i in range(len(returns))]
    line_plot(str(path), {"mean return": (steps, returns)}, title="t", xlabel="env steps", ylabel="return",
              log2_x=False)
    assert path.read_bytes().startswith(b"\x89PNG")
