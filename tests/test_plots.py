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


def test_gradient_histogram_figures():
    import torch

    from mpt_lab.histogram import log2_histogram

    rng = np.random.default_rng(0)
    g = rng.standard_normal(20_000) * np.exp2(rng.normal(-30, 6, 20_000))
    g[:5000] = 0
    h = log2_histogram(torch.from_numpy(g.astype(np.float32)))
    fig = plots.plot_gradient_histogram(h, "FP16", scale=2.0**15, extra_formats=["BF16", "FP8_E5M2"])
    top, ax = fig.axes
    assert top.get_title() and ax.get_xlabel() and ax.get_ylabel() and ax.get_legend() is not None
    assert [t.get_text() for t in top.get_yticklabels()] == ["FP16 (16 bits)", "BF16 (16 bits)", "FP8_E5M2 (8 bits)"]
    # the zero bar shows the share of zeros
    heights = [p.get_height() for p in ax.patches if hasattr(p, "get_height")]
    assert any(abs(hh - 25.0) < 1e-9 for hh in heights)
    fig = plots.plot_kept_vs_scale(h, "FP16", log2_scales=range(0, 30))
    (ax,) = _check_axes(fig)
    kept = ax.get_lines()[0].get_ydata()
    assert kept[8] > kept[0]                                # S = 2^8 keeps more than S = 1
    with pytest.raises(TypeError):
        plots.plot_gradient_histogram([h])
    with pytest.raises(ValueError):
        plots.plot_gradient_histogram(h, scale=3.0)


def test_scale_history_plot():
    h = [(0, 2.0**16, False), (1, 2.0**17, True), (2, 2.0**16, False)]
    fig = plots.plot_scale_history({"ours": h, "torch": h})
    (ax,) = _check_axes(fig)
    assert len(ax.get_legend().get_texts()) == 3
    with pytest.raises(TypeError):
        plots.plot_scale_history([])


def test_losses_plot():
    fig = plots.plot_losses({"a": np.linspace(2, 1, 300), "b": np.linspace(2, 1.5, 300)}, smooth=20)
    (ax,) = _check_axes(fig)
    assert len(ax.get_lines()) == 2
    with pytest.raises(TypeError):
        plots.plot_losses([1, 2])
