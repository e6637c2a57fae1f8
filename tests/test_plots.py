"""Every figure has a title, labelled axes (with units) and a legend where it shows several series."""

import numpy as np
import pytest
from matplotlib.figure import Figure

from mpt_lab import formats as F
from mpt_lab import plots


def _check_axes(fig: Figure, legend=True):
    axes = [ax for ax in fig.axes if ax.get_visible()]
    assert axes
    for ax in axes:
        assert ax.get_title(), "every axes has a title"
        assert ax.get_xlabel(), "x axis labelled"
        if legend:
            assert ax.get_legend() is not None and ax.get_legend().get_texts()
    return axes


def test_format_ranges():
    fig = plots.plot_format_ranges()
    top, bottom = _check_axes(fig)
    assert len(top.get_yticklabels()) == 9
    # the zoomed panel shows a tick per positive value of each ≤ 8-bit format: E4M3 has 126 positive values
    n_ticks = sum(len(c.get_segments()) for c in bottom.collections if hasattr(c, "get_segments"))
    positives = sum(int((F.values(f) > 0).sum()) for f in (F.FP4_E2M1, F.FP6_E2M3, F.FP6_E3M2, F.FP8_E4M3, F.FP8_E5M2))
    assert n_ticks == positives
    assert fig._repr_png_()[:8] == b"\x89PNG\r\n\x1a\n"


def test_ulp_plot_draws_the_staircase():
    fig = plots.plot_ulp(["FP16", "BF16"])
    axes = _check_axes(fig)
    assert len(axes) == 2 and all(ax.get_ylabel() for ax in axes)
    line = axes[0].get_lines()[0]
    x, y = line.get_data()
    assert np.array_equal(y, F.ulp(x, F.FP16))
    with pytest.raises(ValueError):
        plots.plot_ulp(["FP16"], lo_log2=3, hi_log2=1)
    with pytest.raises(ValueError, match="unknown format"):
        plots.plot_ulp(["FP17"])


def test_fixed_vs_float_and_accumulation():
    fig = plots.plot_fixed_vs_float()
    (ax,) = _check_axes(fig)
    assert ax.get_ylabel()
    traj = {"FP16": F.accumulate(1.0, 1e-4, 10, F.FP16),
            "FP16 SR": F.accumulate(np.ones(8), 1e-4, 10, F.FP16, rounding="stochastic", generator=1)}
    fig = plots.plot_accumulation(traj, exact=1 + 1e-4 * np.arange(11))
    (ax,) = _check_axes(fig)
    assert len(ax.get_legend().get_texts()) == 4
    with pytest.raises(TypeError):
        plots.plot_accumulation([1, 2])
