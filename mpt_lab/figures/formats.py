"""Figures of chapter 1: where each format's values lie, how their spacing grows, fixed against floating point,
what repeated small updates do to a stored weight, and how fast round_to simulates a format."""

from __future__ import annotations

import html
import re
from collections.abc import Sequence

import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from .. import formats as F
from ..formats import FormatLike
from ._base import HTML, as_formats, format_color, new_figure, table_html

__all__ = [
    "draw_format_ranges",
    "plot_format_ranges",
    "plot_ulp",
    "plot_fixed_vs_float",
    "plot_accumulation",
    "round_to_speed_table",
]


def draw_format_ranges(ax: Axes, fmts: Sequence[FormatLike], ticks_max_bits: int, *, legend: bool = True) -> None:
    """Draw one row per format on ``ax``: its subnormal and normal ranges on a log2 axis, and every value as a
    tick for formats of at most ``ticks_max_bits`` bits; with ``legend``, a key to the shades."""

    for i, f in enumerate(fmts):
        lo_n, hi = np.log2(f.smallest_normal), np.log2(f.max)
        if f.subnormals and f.mantissa_bits:
            lo_s = np.log2(f.smallest_subnormal)
            ax.barh(i, lo_n - lo_s, left=lo_s, height=0.5, color=format_color(f), alpha=0.3)
        ax.barh(
            i, hi - lo_n, left=lo_n, height=0.5, color=format_color(f), alpha=0.85 if f.bits > ticks_max_bits else 0.35
        )
        if f.bits <= ticks_max_bits:
            v = F.values(f, include_negative=False)
            v = v[v > 0]
            ax.vlines(np.log2(v), i - 0.32, i + 0.32, color="black", lw=0.6)
    ax.set_yticks(range(len(fmts)), [f"{f.name} ({f.bits} bits)" for f in fmts])
    ax.axvline(0, color="gray", lw=0.5, ls=":")
    ax.grid(axis="x", alpha=0.3)
    handles = [
        Patch(color="0.35", alpha=0.85, label="normal range"),
        Patch(color="0.35", alpha=0.3, label="subnormal range"),
    ]
    if any(f.bits <= ticks_max_bits for f in fmts):
        handles.append(Line2D([], [], color="black", lw=0.8, label="each representable value"))
    if legend:
        ax.legend(handles=handles, loc="lower right", fontsize="small")


def plot_format_ranges(
    formats: Sequence = ("FP4_E2M1", "FP6_E2M3", "FP6_E3M2", "FP8_E4M3", "FP8_E5M2", "FP16", "BF16", "TF32", "FP32"),
    *,
    value_ticks_max_bits: int = 8,
) -> Figure:
    """Where each format's positive values lie: subnormal and normal ranges on a log2 axis.

    Top: every format over its whole range.  Bottom: a zoom on the formats of at most
    ``value_ticks_max_bits`` bits (and FP16 for scale), with every positive value drawn as a tick, so the
    reader sees the values thin out binade by binade.

    Parameters
    ----------
    formats : sequence of FloatFormat or names (drawn bottom to top)
    value_ticks_max_bits : int

    Returns
    -------
    matplotlib.figure.Figure with two axes; x = log2 of the magnitude, one row per format.
    """
    fmts = as_formats(formats)
    small = [f for f in fmts if f.bits <= value_ticks_max_bits or f.name == "FP16"]
    fig = new_figure((9, 0.45 * (len(fmts) + len(small)) + 2.4))
    top, bottom = fig.subplots(2, 1, height_ratios=[len(fmts), max(len(small), 1)])
    draw_format_ranges(top, fmts, 0)
    top.set_title("Where each format's positive values lie: the whole range")
    top.set_xlabel("log₂ |x|   (x dimensionless)")
    if small:
        draw_format_ranges(bottom, small, value_ticks_max_bits)
        lo = min(np.log2(f.smallest_subnormal) for f in small) - 1
        hi = max(np.log2(f.max) for f in small) + 1
        bottom.set_xlim(lo, hi)
        bottom.set_title(f"Zoom: every value of the formats of ≤ {value_ticks_max_bits} bits")
        bottom.set_xlabel("log₂ |x|   (x dimensionless)")
    else:
        bottom.set_visible(False)
    return fig


def plot_ulp(
    formats: Sequence = ("FP8_E4M3", "FP8_E5M2", "FP16", "BF16", "FP32"),
    *,
    lo_log2: float = -30,
    hi_log2: float = 20,
    relative: bool = True,
) -> Figure:
    """How the spacing of values (ulp) grows with magnitude, and the relative spacing ulp(x)/|x|.

    The ulp doubles at every power of two (a staircase on log-log axes) while the relative spacing stays
    between 2^−m and 2^−(m+1) in the normal range and grows in the subnormal range.  Each curve spans the
    format's range [smallest subnormal, max] within [2^lo_log2, 2^hi_log2].

    Returns
    -------
    Figure with one (``relative=False``) or two axes; x = |x| on a log2 axis.
    """
    fmts = as_formats(formats)
    if not lo_log2 < hi_log2:
        raise ValueError(f"lo_log2 must be < hi_log2, got {lo_log2} and {hi_log2}")
    fig = new_figure((10, 4.2))
    axes = fig.subplots(1, 2 if relative else 1, squeeze=False)[0]
    x = np.exp2(np.linspace(lo_log2, hi_log2, 4001))
    for f in fmts:
        keep = (x >= f.smallest_subnormal) & (x <= f.max)
        if not keep.any():
            continue
        xs = x[keep]
        u = F.ulp(xs, f)
        axes[0].step(xs, u, where="post", color=format_color(f), label=f.name)
        if relative:
            axes[1].step(xs, u / xs, where="post", color=format_color(f), label=f.name)
    axes[0].set_title("ulp(x): the gap between neighbouring values")
    axes[0].set_ylabel("ulp(x)   (same units as x)")
    if relative:
        axes[1].set_title("Relative spacing ulp(x) / |x|")
        axes[1].set_ylabel("ulp(x) / |x|   (dimensionless)")
    for ax in axes:
        ax.set_xscale("log", base=2)
        ax.set_yscale("log", base=2)
        ax.set_xlabel("|x|   (log₂ scale)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
    return fig


def plot_fixed_vs_float(
    int_bits: int = 7,
    frac_bits: int = 8,
    fmt: FormatLike = "FP16",
    *,
    lo_log2: float = -20,
    hi_log2: float = 16,
    n: int = 20001,
) -> Figure:
    """Relative rounding error of 16-bit fixed point against a 16-bit floating-point format, over magnitudes.

    Fixed point (step 2^−frac_bits) has a constant absolute error, so its relative error explodes for small
    values and it saturates above 2^int_bits; floating point keeps the relative error near 2^−(m+1) across
    its whole normal range.  Errors of exactly zero are drawn at the bottom of the axes.  Beside the sampled
    errors (dots), each format's largest possible error at each |x|, half its spacing there relative to |x|, is
    drawn as a thin line: the floating-point one reaches 2^−(m+1) at every power of two of the normal range,
    where a sample just above the power of two would hit it.

    Returns
    -------
    Figure; x = |x| (log2 axis), y = relative error |round(x) − x| / |x| (log10 axis); the legend below the axes.
    """
    fmt = F.get_format(fmt)
    x = np.exp2(np.linspace(lo_log2, hi_log2, n))
    # irrational-looking significands so that values are generic, not exactly representable
    x = x * (1 + (np.sqrt(2) - 1) * np.modf(np.arange(n) * 0.6180339887)[0] / 8)
    fx = F.round_fixed(x, int_bits, frac_bits)
    fl = F.round_to(x, fmt)
    floor = 1e-7
    fig = new_figure((9, 4.2))
    ax = fig.add_subplot()
    ax.plot(
        x,
        np.maximum(np.abs(fx - x) / x, floor),
        ".",
        ms=1.5,
        color="#ff7f0e",
        label=f"fixed point Q{int_bits}.{frac_bits} ({1 + int_bits + frac_bits} bits)",
    )
    ax.plot(
        x,
        np.maximum(np.abs(fl - x) / x, floor),
        ".",
        ms=1.5,
        color=format_color(fmt),
        label=f"{fmt.name} ({fmt.bits} bits), round to nearest even",
    )
    # the largest error at each |x|: half the spacing there, over |x| (the sawtooth's tops), on a grid that holds
    # every power of two of the range and the value just below each
    k = np.arange(np.ceil(lo_log2), np.floor(hi_log2) + 1)
    grid = np.unique(np.concatenate([np.exp2(k), np.exp2(k) * (1 - 2.0**-20), x]))
    grid = grid[(grid >= 2.0**lo_log2) & (grid <= 2.0**hi_log2)]
    in_range = grid <= fmt.max
    ax.plot(
        grid[in_range],
        (F.ulp(grid[in_range], fmt) / 2 / grid[in_range]),
        "-",
        lw=0.7,
        color=format_color(fmt),
        alpha=0.8,
        label=f"{fmt.name}: largest error at |x|, half its ulp over |x|",
    )
    fixed_ok = grid < 2.0**int_bits
    ax.plot(
        grid[fixed_ok],
        2.0 ** -(frac_bits + 1) / grid[fixed_ok],
        "-",
        lw=0.7,
        color="#ff7f0e",
        alpha=0.8,
        label=f"Q{int_bits}.{frac_bits}: largest error, 2^-{frac_bits + 1} over |x|",
    )
    ax.axhline(
        fmt.epsilon / 2, color=format_color(fmt), ls="--", lw=1, label=f"{fmt.name} unit roundoff 2^-{fmt.precision}"
    )
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_ylim(floor * 0.8, 2)
    ax.set_xlabel("|x|   (log₂ scale)")
    ax.set_ylabel("relative rounding error   (dimensionless)")
    ax.set_title(f"Fixed point keeps absolute error, floating point keeps relative error ({fmt.bits} bits each)")
    # the legend sits below the axes: inside, it would cover the fixed-point saturation curve at the upper right
    fig.legend(*ax.get_legend_handles_labels(), loc="outside lower center", ncol=3, fontsize="small", markerscale=6)
    ax.grid(alpha=0.3)
    return fig


def plot_accumulation(trajectories: dict, *, exact: Sequence[float] | None = None, title: str | None = None) -> Figure:
    """Weight trajectories under repeated small updates (from :func:`mpt_lab.formats.accumulate`).

    Parameters
    ----------
    trajectories : dict label → 1-D array of weights (steps + 1 values), or 2-D (steps + 1, trials): the
        mean over trials is drawn with a band from the 5th to the 95th percentile.
    exact : optional 1-D array, the exact-arithmetic trajectory (drawn dashed)

    Returns
    -------
    Figure; x = step, y = weight value.
    """
    if not isinstance(trajectories, dict) or not trajectories:
        raise TypeError("trajectories must be a non-empty dict of label → array")
    fig = new_figure((9, 4.2))
    ax = fig.add_subplot()
    for label, tr in trajectories.items():
        tr = np.asarray(tr, dtype=np.float64)
        steps = np.arange(tr.shape[0])
        if tr.ndim == 2:
            (line,) = ax.plot(steps, tr.mean(axis=1), label=f"{label} (mean of {tr.shape[1]} runs)")
            ax.fill_between(
                steps,
                np.percentile(tr, 5, axis=1),
                np.percentile(tr, 95, axis=1),
                alpha=0.2,
                color=line.get_color(),
                label=f"{label} (5th–95th percentile of runs)",
            )
        else:
            ax.plot(steps, tr, label=label)
    if exact is not None:
        ax.plot(np.arange(len(exact)), exact, "k--", lw=1, label="exact arithmetic")
    ax.set_xlabel("step")
    ax.set_ylabel("weight value   (dimensionless)")
    ax.set_title(title or "A weight receiving the same small update every step")
    ax.legend(fontsize="small")
    ax.grid(alpha=0.3)
    return fig


def _cast_name(code: str) -> str:
    """The dtype a benchmark's native round trip casts through, e.g. "torch.float16", "ml_dtypes.float4_e2m1fn"."""
    m = re.search(r"(torch|ml_dtypes|np)\.(float\w*|bfloat16)", code)
    return f"{m.group(1)}.{m.group(2)}" if m else code


def round_to_speed_table(result: dict, data: str = "normal") -> HTML:
    """The round_to benchmark as a table: per input library and format, the native nearest-even cast and
    :func:`mpt_lab.formats.round_to` with round-to-nearest-even and with stochastic rounding, in milliseconds
    for the benchmark's ``n`` float32 values, with round_to's time as a multiple of the cast time the row shows.

    ``result``: the dict that ``benchmarks/round_to_speed.py`` writes (``book/results/round_to_speed_cpu.json``,
    loaded with :func:`mpt_lab.experiments.load_json`); ``data``: "normal" or "wide".  A nearest-even cell
    marked "≠" is one where the native cast is not the format's operation (torch's E4M3 cast saturates).

    Raises ValueError if ``result`` holds no rows for ``data``; TypeError if it is not such a dict.
    """
    if not isinstance(result, dict) or "rows" not in result:
        raise TypeError("result must be the dict written by benchmarks/round_to_speed.py (with 'rows')")
    rows = [r for r in result["rows"] if r["data"] == data]
    if not rows:
        raise ValueError(f"data must be one of {sorted({r['data'] for r in result['rows']})}, got {data!r}")
    by = {(r["input"], r["format"], r["rounding"]): r for r in rows}
    out = []
    for (inp, fmt, rnd), r in by.items():
        if rnd != "nearest_even":
            continue
        s = by.get((inp, fmt, "stochastic"))
        mark = "" if r["same_values"] else " ≠"
        out.append(
            [
                f"{inp} · {fmt}",
                f"<code>{html.escape(_cast_name(r['native']))}</code>",
                f"{1e3 * r['native_s']:.1f}",
                f"{1e3 * r['round_to_s']:.1f} ({r['ratio']:.2f}×){mark}",
                # against the cast time this row shows (the stochastic row timed its own cast beside it)
                "–" if s is None else f"{1e3 * s['round_to_s']:.1f} ({s['round_to_s'] / r['native_s']:.2f}×)",
            ]
        )
    n = result.get("provenance", {}).get("config", {}).get("n")
    what = {
        "normal": "normally distributed (Gaussian) data",
        "wide": "Gaussian data times 2ᵏ, k uniform in −30 … 11",
    }.get(data, f"{data} data")
    caption = f"{n:,} float32 values of {what}, one thread, median times" if n else what
    return table_html(
        ["input · format", "cast through", "cast (ms)", "round_to nearest-even (ms)", "round_to stochastic (ms)"],
        out,
        caption=caption,
    )
