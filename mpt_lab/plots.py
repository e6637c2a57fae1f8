"""The book's figures.  Each function computes what it draws with :mod:`mpt_lab` and returns a
:class:`matplotlib.figure.Figure` (created without pyplot, so a notebook shows it once, where it is returned).

Every figure has a title, axis labels with units and a legend where it shows more than one series.
"""

from __future__ import annotations

import io
from typing import Iterable, Sequence

import numpy as np
from matplotlib.figure import Figure

from . import formats as F

__all__ = ["BookFigure", "plot_format_ranges", "plot_ulp", "plot_fixed_vs_float", "plot_accumulation",
           "plot_gradient_histogram", "plot_kept_vs_scale", "plot_detection_samples", "plot_training",
           "plot_scale_history", "plot_losses", "plot_tradeoffs", "FORMAT_COLORS"]

FORMAT_COLORS = {
    "FP64": "#4d4d4d", "FP32": "#1f77b4", "TF32": "#17becf", "FP16": "#d62728", "BF16": "#2ca02c",
    "FP8_E4M3": "#9467bd", "FP8_E5M2": "#8c564b", "FP6_E3M2": "#e377c2", "FP6_E2M3": "#bcbd22",
    "FP4_E2M1": "#ff7f0e", "E8M0": "#7f7f7f",
}


def _color(fmt: F.FloatFormat) -> str:
    return FORMAT_COLORS.get(fmt.name, "#333333")


def _formats(fmts, argname="formats") -> list:
    if isinstance(fmts, (str, F.FloatFormat)):
        fmts = [fmts]
    if not isinstance(fmts, Iterable):
        raise TypeError(f"{argname} must be a format or a sequence of formats, got {type(fmts).__name__}")
    out = [F.get_format(f, argname) for f in fmts]
    if not out:
        raise ValueError(f"{argname} must name at least one format")
    return out


class BookFigure(Figure):
    """A matplotlib Figure that Jupyter shows as a PNG wherever it is the value of a cell.

    The book's figures are created without pyplot, so they appear exactly once (where returned) and never
    leak into later cells; this repr makes them display even where no inline backend was set up.
    """

    def _repr_png_(self) -> bytes:
        buf = io.BytesIO()
        self.savefig(buf, format="png", dpi=110)
        return buf.getvalue()


def _figure(figsize=(9, 4.5)) -> Figure:
    return BookFigure(figsize=figsize, layout="constrained")


def _range_rows(ax, fmts, ticks_max_bits):
    from matplotlib.patches import Patch
    from matplotlib.lines import Line2D

    for i, f in enumerate(fmts):
        lo_n, hi = np.log2(f.smallest_normal), np.log2(f.max)
        if f.subnormals and f.mantissa_bits:
            lo_s = np.log2(f.smallest_subnormal)
            ax.barh(i, lo_n - lo_s, left=lo_s, height=0.5, color=_color(f), alpha=0.3)
        ax.barh(i, hi - lo_n, left=lo_n, height=0.5, color=_color(f), alpha=0.85 if f.bits > ticks_max_bits else 0.35)
        if f.bits <= ticks_max_bits:
            v = F.values(f, include_negative=False)
            v = v[v > 0]
            ax.vlines(np.log2(v), i - 0.32, i + 0.32, color="black", lw=0.6)
    ax.set_yticks(range(len(fmts)), [f"{f.name} ({f.bits} bits)" for f in fmts])
    ax.axvline(0, color="gray", lw=0.5, ls=":")
    ax.grid(axis="x", alpha=0.3)
    handles = [Patch(color="0.35", alpha=0.85, label="normal range"), Patch(color="0.35", alpha=0.3,
                                                                            label="subnormal range")]
    if any(f.bits <= ticks_max_bits for f in fmts):
        handles.append(Line2D([], [], color="black", lw=0.8, label="each representable value"))
    ax.legend(handles=handles, loc="lower right", fontsize="small")


def plot_format_ranges(formats: Sequence = ("FP4_E2M1", "FP6_E2M3", "FP6_E3M2", "FP8_E4M3", "FP8_E5M2", "FP16",
                                            "BF16", "TF32", "FP32"),
                       *, value_ticks_max_bits: int = 8) -> Figure:
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
    fmts = _formats(formats)
    small = [f for f in fmts if f.bits <= value_ticks_max_bits or f.name == "FP16"]
    fig = _figure((9, 0.45 * (len(fmts) + len(small)) + 2.4))
    top, bottom = fig.subplots(2, 1, height_ratios=[len(fmts), max(len(small), 1)])
    _range_rows(top, fmts, 0)
    top.set_title("Where each format's positive values lie: the whole range")
    top.set_xlabel("log₂ |x|   (x dimensionless)")
    if small:
        _range_rows(bottom, small, value_ticks_max_bits)
        lo = min(np.log2(f.smallest_subnormal) for f in small) - 1
        hi = max(np.log2(f.max) for f in small) + 1
        bottom.set_xlim(lo, hi)
        bottom.set_title(f"Zoom: every value of the formats of ≤ {value_ticks_max_bits} bits")
        bottom.set_xlabel("log₂ |x|   (x dimensionless)")
    else:
        bottom.set_visible(False)
    return fig


def plot_ulp(formats: Sequence = ("FP8_E4M3", "FP8_E5M2", "FP16", "BF16", "FP32"), *, lo_log2: float = -30,
             hi_log2: float = 20, relative: bool = True) -> Figure:
    """How the spacing of values (ulp) grows with magnitude, and the relative spacing ulp(x)/|x|.

    The ulp doubles at every power of two (a staircase on log-log axes) while the relative spacing stays
    between 2^−m and 2^−(m+1) in the normal range and grows in the subnormal range.  Each curve spans the
    format's range [smallest subnormal, max] within [2^lo_log2, 2^hi_log2].

    Returns
    -------
    Figure with one (``relative=False``) or two axes; x = |x| on a log2 axis.
    """
    fmts = _formats(formats)
    if not lo_log2 < hi_log2:
        raise ValueError(f"lo_log2 must be < hi_log2, got {lo_log2} and {hi_log2}")
    fig = _figure((10, 4.2))
    axes = fig.subplots(1, 2 if relative else 1, squeeze=False)[0]
    x = np.exp2(np.linspace(lo_log2, hi_log2, 4001))
    for f in fmts:
        keep = (x >= f.smallest_subnormal) & (x <= f.max)
        if not keep.any():
            continue
        xs = x[keep]
        u = F.ulp(xs, f)
        axes[0].step(xs, u, where="post", color=_color(f), label=f.name)
        if relative:
            axes[1].step(xs, u / xs, where="post", color=_color(f), label=f.name)
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


def plot_fixed_vs_float(int_bits: int = 7, frac_bits: int = 8, fmt="FP16", *, lo_log2: float = -20,
                        hi_log2: float = 16, n: int = 20001) -> Figure:
    """Relative rounding error of 16-bit fixed point against a 16-bit floating-point format, over magnitudes.

    Fixed point (step 2^−frac_bits) has a constant absolute error, so its relative error explodes for small
    values and it saturates above 2^int_bits; floating point keeps the relative error near 2^−(m+1) across
    its whole normal range.  Errors of exactly zero are drawn at the bottom of the axes.

    Returns
    -------
    Figure; x = |x| (log2 axis), y = relative error |round(x) − x| / |x| (log10 axis).
    """
    fmt = F.get_format(fmt)
    x = np.exp2(np.linspace(lo_log2, hi_log2, n))
    # irrational-looking significands so that values are generic, not exactly representable
    x = x * (1 + (np.sqrt(2) - 1) * np.modf(np.arange(n) * 0.6180339887)[0] / 8)
    fx = F.round_fixed(x, int_bits, frac_bits)
    fl = F.round_to(x, fmt)
    floor = 1e-7
    fig = _figure((9, 4.2))
    ax = fig.add_subplot()
    ax.plot(x, np.maximum(np.abs(fx - x) / x, floor), ".", ms=1.5, color="#ff7f0e",
            label=f"fixed point Q{int_bits}.{frac_bits} ({1 + int_bits + frac_bits} bits)")
    ax.plot(x, np.maximum(np.abs(fl - x) / x, floor), ".", ms=1.5, color=_color(fmt),
            label=f"{fmt.name} ({fmt.bits} bits), round to nearest even")
    ax.axhline(fmt.epsilon / 2, color=_color(fmt), ls="--", lw=1, label=f"{fmt.name} unit roundoff 2^-{fmt.precision}")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_ylim(floor * 0.8, 2)
    ax.set_xlabel("|x|   (log₂ scale)")
    ax.set_ylabel("relative rounding error   (dimensionless)")
    ax.set_title(f"Fixed point keeps absolute error, floating point keeps relative error ({fmt.bits} bits each)")
    ax.legend(fontsize="small", markerscale=6, loc="upper right")
    ax.grid(alpha=0.3)
    return fig


def plot_accumulation(trajectories: dict, *, exact=None, title: str | None = None) -> Figure:
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
    fig = _figure((9, 4.2))
    ax = fig.add_subplot()
    for label, tr in trajectories.items():
        tr = np.asarray(tr, dtype=np.float64)
        steps = np.arange(tr.shape[0])
        if tr.ndim == 2:
            (line,) = ax.plot(steps, tr.mean(axis=1), label=f"{label} (mean of {tr.shape[1]} runs)")
            ax.fill_between(steps, np.percentile(tr, 5, axis=1), np.percentile(tr, 95, axis=1), alpha=0.2,
                            color=line.get_color(), label=f"{label} (5th–95th percentile of runs)")
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


# ----------------------------------------------------------------------------------------------------------
# Gradient histograms (the paper's Figure 2)
# ----------------------------------------------------------------------------------------------------------
def _shade_format(ax, fmt: F.FloatFormat, *, label_prefix: str = "", alpha: float = 0.12, underflow=True):
    """Shade fmt's normal and subnormal ranges (and its underflow zone) on a log2 |x| axis."""
    m = fmt.mantissa_bits
    ax.axvspan(fmt.emin, np.log2(fmt.max) + 1e-9, color=_color(fmt), alpha=alpha,
               label=f"{label_prefix}{fmt.name} normal range [2^{fmt.emin}, max]")
    if fmt.subnormals and m:
        # values in [2^(emin-m-1), 2^(emin-m)) round up to the smallest subnormal (except the exact tie)
        ax.axvspan(fmt.emin - m - 1, fmt.emin, color=_color(fmt), alpha=alpha / 2.5,
                   label=f"{label_prefix}{fmt.name} subnormal range (rounds to ≥ 2^{fmt.emin - m})")
        if underflow:
            ax.axvspan(ax.get_xlim()[0] if ax.get_xlim()[0] < fmt.emin - m - 1 else fmt.emin - m - 30,
                       fmt.emin - m - 1, color="0.5", alpha=0.12,
                       label=f"underflow: rounds to 0 in {fmt.name} (|x| ≤ 2^{fmt.emin - m - 1})")


def plot_gradient_histogram(hists, fmt="FP16", *, scale: float | None = None, extra_formats: Sequence = (),
                            title: str | None = None, xlim: tuple | None = None) -> Figure:
    """Percentage of values (log scale) per binade of |g|, with a zero bin: the paper's Figure 2.

    Parameters
    ----------
    hists : Log2Histogram, or dict label → Log2Histogram (drawn as overlaid step outlines)
    fmt : the format whose ranges are shaded (FP16 as in the paper)
    scale : optional loss scale S (a power of two): the first histogram is drawn again shifted by log2 S
    extra_formats : formats whose ranges are drawn as bars above the histogram (e.g. BF16, FP8_E5M2)
    xlim : (lo, hi) in log2 units; default spans the data

    Returns
    -------
    Figure; x = log2 |g| (the zero bin is drawn left of the axis break), y = percentage of all values.
    """
    from .histogram import Log2Histogram

    if isinstance(hists, Log2Histogram):
        hists = {"gradients": hists}
    if not isinstance(hists, dict) or not hists or not all(isinstance(h, Log2Histogram) for h in hists.values()):
        raise TypeError("hists must be a Log2Histogram or a non-empty dict of label → Log2Histogram")
    fmt = F.get_format(fmt)
    extras = _formats(extra_formats, "extra_formats") if extra_formats else []
    j = 0
    if scale is not None:
        from .histogram import _log2_of_power_of_two

        j = _log2_of_power_of_two(scale, "scale")
    first = next(iter(hists.values()))
    if xlim is None:
        ks = [h.exponents[h.counts > 0] for h in hists.values()]
        ks = np.concatenate([k for k in ks if k.size] or [np.array([-30, 0])])
        lo = min(int(ks.min()), fmt.emin - fmt.mantissa_bits - 2) - 3
        hi = max(int(ks.max()) + j, int(np.log2(fmt.max))) + 3
        xlim = (lo, hi)
    lo, hi = xlim
    zero_x = lo - 3
    range_fmts = [fmt] + [f for f in extras if f != fmt]
    fig = _figure((10, 5.2 + 0.25 * len(range_fmts)))
    top, ax = fig.subplots(2, 1, sharex=True, height_ratios=[0.6 + 0.35 * len(range_fmts), 4])
    ax.set_xlim(zero_x - 2, hi)
    _range_rows(top, range_fmts, 0)
    top.set_title(title or f"Gradient values by magnitude, with {fmt.name}'s ranges")
    top.set_ylim(-0.6, len(range_fmts) - 0.4)
    top.tick_params(axis="x", labelbottom=False)
    _shade_format(ax, fmt)
    for i, (label, h) in enumerate(hists.items()):
        pct = 100.0 * h.counts / max(h.total, 1)
        keep = pct > 0
        color = f"C{i}"
        ax.bar(h.exponents[keep] + 0.5, pct[keep], width=1.0, color=color, alpha=0.55 if i == 0 else 0.0,
               edgecolor=color, lw=0.8, label=f"{label}: non-zero values")
        ax.bar([zero_x], [100.0 * h.zeros / max(h.total, 1)], width=1.6, color=color, alpha=0.8,
               label=f"{label}: zeros ({100.0 * h.fraction_zero():.1f}%)")
    if j:
        pct = 100.0 * first.counts / max(first.total, 1)
        keep = pct > 0
        ax.step(first.exponents[keep] + j + 0.5, pct[keep], where="mid", color="black", lw=1.2,
                label=f"{next(iter(hists))} × S = 2^{j} (shifted by {j} binades)")
    ax.axvline(zero_x + 1.6, color="black", lw=0.6)
    ax.set_yscale("log")
    ticks = [t for t in range(int(np.ceil(lo / 8) * 8), hi + 1, 8)]
    ax.set_xticks([zero_x] + ticks, ["0"] + [str(t) for t in ticks])
    ax.set_xlabel("log₂ |gradient value|   (bin k holds 2^k ≤ |g| < 2^(k+1); leftmost bar: exact zeros)")
    ax.set_ylabel("percentage of all values (%)")
    ax.set_title(f"Histogram; shaded: what {fmt.name} keeps, and the underflow zone", fontsize="medium")
    ax.legend(fontsize="x-small", loc="upper right", framealpha=0.9)
    ax.grid(axis="y", alpha=0.3)
    return fig


def plot_kept_vs_scale(hist, fmt="FP16", *, log2_scales: Sequence[int] = tuple(range(0, 41)),
                       title: str | None = None) -> Figure:
    """Share of non-zero values kept (normal or subnormal), flushed to zero and overflowed, against log2 S.

    Computed exactly from the histogram with :meth:`Log2Histogram.fractions`; the largest S without
    overflow (:meth:`Log2Histogram.max_scale`) is marked.

    Returns
    -------
    Figure; x = log2 S, y = percentage of the non-zero finite values.
    """
    fmt = F.get_format(fmt)
    js = np.asarray(list(log2_scales), dtype=int)
    if js.size == 0:
        raise ValueError("log2_scales must not be empty")
    rows = [hist.fractions(fmt, float(2.0 ** j)) for j in js]
    nz = np.array([r["normal"] + r["subnormal"] + r["underflow"] + r["overflow"] for r in rows])
    nz = np.where(nz > 0, nz, np.nan)
    kept = np.array([r["normal"] + r["subnormal"] for r in rows]) / nz * 100
    under = np.array([r["underflow"] for r in rows]) / nz * 100
    over = np.array([r["overflow"] for r in rows]) / nz * 100
    fig = _figure((9, 4.2))
    ax = fig.add_subplot()
    ax.plot(js, kept, "o-", ms=3, color="#2ca02c", label="kept (normal or subnormal)")
    ax.plot(js, under, "s-", ms=3, color="0.4", label="flushed to zero (underflow)")
    ax.plot(js, over, "^-", ms=3, color="#d62728", label="overflow")
    smax = hist.max_scale(fmt)
    if np.isfinite(smax):
        ax.axvline(np.log2(smax), color="black", ls="--", lw=1,
                   label=f"largest S without overflow: 2^{int(np.log2(smax))}")
    ax.set_xlabel("log₂ S   (loss scale S)")
    ax.set_ylabel(f"share of non-zero values in {fmt.name} (%)")
    ax.set_title(title or f"What a loss scale S keeps in {fmt.name}")
    ax.set_ylim(-2, 102)
    ax.legend(fontsize="small")
    ax.grid(alpha=0.3)
    return fig


# ----------------------------------------------------------------------------------------------------------
# Detection data and training curves
# ----------------------------------------------------------------------------------------------------------
def plot_detection_samples(dataset, n: int = 8, *, detections=None, title: str | None = None) -> Figure:
    """The first ``n`` images of a detection data set with their ground-truth boxes (and detections).

    Parameters
    ----------
    dataset : a :class:`mpt_lab.data.DigitsDetection` (items: image [C, H, W] in [0, 1], target with normalised
        xyxy "boxes" and "labels" 1–10 for the digits 0–9)
    n : number of images (1–32)
    detections : optional list of per-image dicts ("boxes", "scores", "labels") drawn dashed with scores

    Returns
    -------
    Figure with one panel per image; axes in pixels.
    """
    from matplotlib.lines import Line2D
    from matplotlib.patches import Rectangle

    if not isinstance(n, int) or not 1 <= n <= 32:
        raise ValueError(f"n must be an int in [1, 32], got {n!r}")
    n = min(n, len(dataset))
    cols = min(n, 8)
    rows = (n + cols - 1) // cols
    fig = _figure((1.6 * cols, 1.75 * rows + 0.6))
    axes = np.atleast_1d(fig.subplots(rows, cols, squeeze=False).ravel())
    for i, ax in enumerate(axes):
        ax.set_xticks([])
        ax.set_yticks([])
        if i >= n:
            ax.set_visible(False)
            continue
        img, tgt = dataset[i]
        size = img.shape[-1]
        ax.imshow(img.permute(1, 2, 0).squeeze(-1).numpy(), cmap="gray", vmin=0, vmax=1)
        for b, lab in zip(tgt["boxes"].tolist(), tgt["labels"].tolist()):
            x0, y0, x1, y1 = (v * size for v in b)
            ax.add_patch(Rectangle((x0, y0), x1 - x0, y1 - y0, fill=False, ec="#2ca02c", lw=1.2))
            ax.text(x0, y0, str(lab - 1), color="#2ca02c", fontsize=7, va="bottom")
        if detections is not None:
            d = detections[i]
            for b, s, lab in zip(d["boxes"].tolist(), d["scores"].tolist(), d["labels"].tolist()):
                x0, y0, x1, y1 = (v * size for v in b)
                ax.add_patch(Rectangle((x0, y0), x1 - x0, y1 - y0, fill=False, ec="#d62728", lw=1, ls="--"))
                ax.text(x1, y1, f"{lab - 1}:{s:.2f}", color="#d62728", fontsize=6, ha="right", va="top")
    handles = [Line2D([], [], color="#2ca02c", lw=1.2, label="ground truth (digit)")]
    if detections is not None:
        handles.append(Line2D([], [], color="#d62728", lw=1, ls="--", label="detection (digit:score)"))
    fig.legend(handles=handles, loc="lower center", ncol=2, fontsize="small")
    fig.suptitle(title or f"{n} images of the detection data set, with their boxes (64 × 64 pixels)")
    return fig


def plot_training(steps, losses, map50=None, *, title: str | None = None, smooth: int = 25) -> Figure:
    """Training loss against step (raw and a running mean), with mAP@0.5 on a second axis if given.

    Parameters
    ----------
    steps, losses : sequences of equal length
    map50 : optional list of (step, mAP) pairs
    smooth : window of the running mean (steps)
    """
    steps, losses = np.asarray(steps, dtype=float), np.asarray(losses, dtype=float)
    if steps.shape != losses.shape or steps.ndim != 1 or steps.size == 0:
        raise ValueError("steps and losses must be non-empty 1-D sequences of equal length")
    fig = _figure((9, 4))
    ax = fig.add_subplot()
    ax.plot(steps, losses, color="#1f77b4", alpha=0.3, lw=0.8, label="training loss (per step)")
    w = max(1, min(int(smooth), steps.size))
    run = np.convolve(losses, np.ones(w) / w, mode="valid")
    ax.plot(steps[w - 1:], run, color="#1f77b4", lw=1.8, label=f"running mean ({w} steps)")
    ax.set_xlabel("step")
    ax.set_ylabel("loss (SSD eq. 1, dimensionless)")
    ax.set_title(title or "Training")
    ax.grid(alpha=0.3)
    handles, labels = ax.get_legend_handles_labels()
    if map50:
        ax2 = ax.twinx()
        s, m = zip(*map50)
        ax2.plot(s, m, "o-", color="#d62728", label="mAP@0.5 (test split)")
        ax2.set_ylabel("mAP@0.5 (0–1)")
        ax2.set_ylim(0, 1)
        h2, l2 = ax2.get_legend_handles_labels()
        handles, labels = handles + h2, labels + l2
    ax.legend(handles, labels, fontsize="small", loc="upper right")
    return fig


def plot_scale_history(histories: dict, *, title: str | None = None) -> Figure:
    """Loss scale S against step (log2 axis), with overflow steps marked.

    Parameters
    ----------
    histories : dict label → list of (step, scale, found_inf) as in ``GradScaler.history``; the first series
        is drawn solid, the others dashed on top (identical trajectories overlap exactly)

    Returns
    -------
    Figure; x = step, y = log2 S.
    """
    if not isinstance(histories, dict) or not histories:
        raise TypeError("histories must be a non-empty dict of label → [(step, scale, found_inf)]")
    fig = _figure((9, 4))
    ax = fig.add_subplot()
    for i, (label, h) in enumerate(histories.items()):
        if not h:
            continue
        steps = np.array([s for s, _, _ in h])
        scales = np.log2(np.array([v for _, v, _ in h], dtype=float))
        ax.step(steps, scales, where="post", lw=2.2 if i == 0 else 1.2, ls="-" if i == 0 else "--",
                label=f"S, {label}")
        inf = np.array([bool(f) for _, _, f in h])
        if inf.any() and i == 0:
            ax.plot(steps[inf], scales[inf], "v", color="#d62728", ms=7, label="overflow: step skipped, S halved")
    ax.set_xlabel("step")
    ax.set_ylabel("log₂ S   (loss scale)")
    ax.set_title(title or "Dynamic loss scaling: grow after N clean steps, back off on overflow")
    ax.legend(fontsize="small")
    ax.grid(alpha=0.3)
    return fig


def plot_losses(losses: dict, *, smooth: int = 50, title: str | None = None, ylabel: str = "training loss") -> Figure:
    """Running means of several loss curves against step (one line per run).

    Parameters
    ----------
    losses : dict label → sequence of per-step losses
    smooth : window of the running mean (steps)
    """
    if not isinstance(losses, dict) or not losses:
        raise TypeError("losses must be a non-empty dict of label → sequence")
    fig = _figure((9, 4))
    ax = fig.add_subplot()
    styles = ["-", "--", ":", "-."]
    for i, (label, v) in enumerate(losses.items()):
        v = np.asarray(v, dtype=float)
        w = max(1, min(int(smooth), v.size))
        ax.plot(np.arange(w - 1, v.size), np.convolve(v, np.ones(w) / w, mode="valid"), ls=styles[i % 4],
                lw=2.2 if i == 0 else 1.6, label=label)
    ax.set_xlabel("step")
    ax.set_ylabel(f"{ylabel} (running mean of {smooth} steps)")
    ax.set_title(title or "Training loss")
    ax.legend(fontsize="small")
    ax.grid(alpha=0.3)
    return fig


def plot_tradeoffs(ways: dict, *, title: str | None = None) -> Figure:
    """Peak memory and step time per way of training (FP32, mixed precision, checkpointing, both).

    Parameters
    ----------
    ways : dict way → {"peak_bytes": int, "step_seconds": float, ...} (``MemoryTradeoffsResult.ways``)

    Returns
    -------
    Figure with two bar charts: peak memory (MiB) and time per step (ms).
    """
    if not isinstance(ways, dict) or not ways:
        raise TypeError("ways must be a non-empty dict of way → measurements")
    names = list(ways)
    fig = _figure((10, 3.8))
    ax1, ax2 = fig.subplots(1, 2)
    colors = [f"C{i}" for i in range(len(names))]
    ax1.bar(names, [ways[n]["peak_bytes"] / 2**20 for n in names], color=colors)
    ax1.set_ylabel("peak memory of one step (MiB)")
    ax1.set_title("Peak memory")
    ax2.bar(names, [1e3 * ways[n]["step_seconds"] for n in names], color=colors)
    ax2.set_ylabel("time per training step (ms)")
    ax2.set_title("Step time")
    for ax in (ax1, ax2):
        ax.set_xlabel("way of training")
        ax.tick_params(axis="x", labelrotation=15)
        ax.grid(axis="y", alpha=0.3)
    fig.suptitle(title or "Recomputation or lower precision: what each costs and saves")
    return fig


# ----------------------------------------------------------------------------------- graphs in half precision
_PRECISION_STYLE = {"fp32": ("FP32", "#1f77b4", "-"), "fp16": ("FP16 autocast + GradScaler", "#d62728", "--"),
                    "bf16": ("BF16 autocast", "#2ca02c", ":")}


def plot_gat_training(runs: dict, *, title: str | None = None) -> Figure:
    """Training loss per epoch of seed 001's GAT, one panel per head setting, one line per precision.

    Parameters
    ----------
    runs : dict "[h, h, h]" → precision ("fp32", "fp16", "bf16") → {"losses": [...], "oom": bool}
        (``GatAmpResult.runs``); runs that ran out of memory are named in the legend and not drawn.

    Raises TypeError when ``runs`` is not a non-empty dict.
    """
    if not isinstance(runs, dict) or not runs:
        raise TypeError("runs must be a non-empty dict of heads → precision → run")
    fig = _figure((10, 3.8))
    axes = fig.subplots(1, len(runs), sharey=True, squeeze=False)[0]
    for ax, (hk, by_p) in zip(axes, runs.items()):
        for p, r in by_p.items():
            label, color, ls = _PRECISION_STYLE.get(p, (p, None, "-"))
            if r.get("oom"):
                ax.plot([], [], color=color, ls=ls, label=f"{label}: out of memory")
                continue
            ax.plot(np.arange(1, len(r["losses"]) + 1), r["losses"], color=color, ls=ls, lw=1.8, label=label)
        ax.set_title(f"heads {hk}")
        ax.set_xlabel("epoch (one full-batch step)")
        ax.set_yscale("log")
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
    axes[0].set_ylabel("training loss (cross-entropy, nats)")
    fig.suptitle(title or "Seed 001's GAT: training loss in FP32, FP16 and BF16")
    return fig


def plot_gat_memory(runs: dict, *, reference_ratio: float | None = None, reference_label: str = "seed 001",
                    title: str | None = None) -> Figure:
    """Total peak memory per (heads, precision) and its ratio to FP32.

    Parameters
    ----------
    runs : ``GatAmpResult.runs`` (each run with "total_bytes" or "oom")
    reference_ratio : float, optional
        A ratio to mark on the right panel (seed 001's 12.8 GB / 15.2 GB on a V100).

    Raises TypeError when ``runs`` is not a non-empty dict.
    """
    if not isinstance(runs, dict) or not runs:
        raise TypeError("runs must be a non-empty dict of heads → precision → run")
    fig = _figure((10, 3.8))
    ax1, ax2 = fig.subplots(1, 2)
    heads = list(runs)
    precs = [p for p in ("fp32", "fp16", "bf16") if any(p in runs[h] for h in heads)]
    width = 0.8 / len(precs)
    for i, p in enumerate(precs):
        label, color, _ = _PRECISION_STYLE.get(p, (p, None, "-"))
        xs, mib, ratio = [], [], []
        for j, h in enumerate(heads):
            r, base = runs[h].get(p), runs[h].get("fp32")
            if not r or r.get("oom"):
                continue
            xs.append(j + (i - (len(precs) - 1) / 2) * width)
            mib.append(r["total_bytes"] / 2**20)
            ratio.append(r["total_bytes"] / base["total_bytes"] if base and not base.get("oom") else np.nan)
        ax1.bar(xs, mib, width, color=color, label=label)
        ax2.bar(xs, ratio, width, color=color, label=label)
    for ax in (ax1, ax2):
        ax.set_xticks(range(len(heads)), [f"heads {h}" for h in heads])
        ax.set_xlabel("attention heads per layer")
        ax.grid(axis="y", alpha=0.3)
    if reference_ratio is not None:
        ax2.axhline(reference_ratio, color="black", ls="--", lw=1, label=f"{reference_label}: {reference_ratio:.2f}")
    ax1.set_ylabel("peak memory: step + graph, weights, Adam (MiB)")
    ax1.set_title("Total peak memory")
    ax2.set_ylabel("total peak memory ÷ FP32 (ratio)")
    ax2.set_title("Relative to FP32")
    ax2.set_ylim(0, 1.4)
    ax1.legend(fontsize="small")
    ax2.legend(fontsize="small", loc="upper center", ncol=2)
    fig.suptitle(title or "Seed 001's GAT: memory of one training step by precision")
    return fig


def plot_attention_overflow(demo: dict, *, title: str | None = None) -> Figure:
    """exp of attention logits in FP16 against the overflow threshold ln(65504), and the softmax computed
    naively in FP16, with the maximum subtracted in FP16, and in FP32.

    Parameters
    ----------
    demo : dict from :func:`mpt_lab.experiments.gat_amp.attention_overflow`

    Raises TypeError when ``demo`` lacks the keys of that function's result.
    """
    need = ("logits", "exp_fp16", "naive_fp16", "max_subtracted_fp16", "fp32", "limit")
    if not isinstance(demo, dict) or any(k not in demo for k in need):
        raise TypeError(f"demo must be a dict with keys {need}")
    e = np.asarray(demo["logits"], dtype=float)
    fig = _figure((10, 3.8))
    ax1, ax2 = fig.subplots(1, 2)
    ex = np.asarray(demo["exp_fp16"], dtype=float)
    fin = np.isfinite(ex)
    ax1.semilogy(e[fin], ex[fin], "o-", color=FORMAT_COLORS["FP16"], label="exp(e) in FP16")
    if (~fin).any():
        ax1.plot(e[~fin], np.full((~fin).sum(), float(F.FP16.max)), "x", ms=10, color="black",
                 label="exp(e) = inf in FP16 (overflow)")
    ax1.axhline(float(F.FP16.max), color="gray", ls=":", label="FP16 max = 65504")
    ax1.axvline(demo["limit"], color="black", ls="--", lw=1, label=f"e = ln(65504) ≈ {demo['limit']:.2f}")
    ax1.set_xlabel("attention logit e")
    ax1.set_ylabel("exp(e) (log scale)")
    ax1.set_title("exp overflows FP16 above ln(65504)")
    ax1.legend(fontsize="small")
    x = np.arange(e.size)
    w = 0.27
    naive = np.nan_to_num(np.asarray(demo["naive_fp16"], dtype=float), nan=-0.05)
    ax2.bar(x - w, naive, w, color=FORMAT_COLORS["FP16"], alpha=0.5, label="naive exp/Σexp in FP16 (NaN drawn below 0)")
    ax2.bar(x, demo["max_subtracted_fp16"], w, color=FORMAT_COLORS["FP16"], label="max subtracted, FP16 (PyG)")
    ax2.bar(x + w, demo["fp32"], w, color=FORMAT_COLORS["FP32"], label="FP32 reference")
    ax2.set_xticks(x, [f"{v:g}" for v in e])
    ax2.set_xlabel("attention logit e of each incoming edge")
    ax2.set_ylabel("attention weight α (softmax)")
    ax2.set_title("Softmax over one node's incoming edges")
    ax2.axhline(0, color="black", lw=0.5)
    ax2.legend(fontsize="small")
    ax2.grid(axis="y", alpha=0.3)
    fig.suptitle(title or "Where FP16 is fragile in graph attention")
    return fig


def plot_divergence(losses: dict, evals: dict, *, smooth: int = 20, title: str | None = None,
                    ylabel: str = "training loss (nats per token)") -> Figure:
    """Training loss per run beside the share of activation-gradient values that are zero, over training.

    The paper's Figure 1 (left) and its explanation (right): a run whose gradients underflow in FP16 loses them
    (they become zeros) and its loss falls behind.

    Parameters
    ----------
    losses : dict label → sequence of per-step losses (non-finite values are left out of the running mean)
    evals : dict label → list of dicts with "step" and "zero_share" (0–1), as the divergence experiments
        record them (:mod:`mpt_lab.experiments.biglstm`, :mod:`mpt_lab.experiments.ssd_table2`)
    smooth : window of the running mean of the losses (steps)

    Returns
    -------
    Figure with two axes: x = step; left y = loss, right y = zero share in percent.

    Raises
    ------
    TypeError
        ``losses`` or ``evals`` is not a non-empty dict.
    """
    if not isinstance(losses, dict) or not losses or not isinstance(evals, dict):
        raise TypeError("losses must be a non-empty dict label → per-step losses and evals a dict label → evals")
    fig = _figure((12, 4.2))
    ax, bx = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
    styles = ["-", "--", ":", "-."]
    for i, (label, v) in enumerate(losses.items()):
        v = np.asarray(v, dtype=float)
        v = np.where(np.isfinite(v), v, np.nan)
        w = max(1, min(int(smooth), v.size))
        run = np.convolve(np.nan_to_num(v, nan=0.0), np.ones(w) / w, mode="valid")
        bad = np.convolve(np.isnan(v).astype(float), np.ones(w), mode="valid") > 0
        run[bad] = np.nan
        ax.plot(np.arange(w, v.size + 1), run, ls=styles[i % 4], lw=2.2 if i == 0 else 1.6, label=label)
        ev = evals.get(label) or []
        if ev:
            bx.plot([e["step"] for e in ev], [100 * e["zero_share"] for e in ev], "o" + styles[i % 4],
                    lw=2.2 if i == 0 else 1.6, label=label)
    ax.set_xlabel("step")
    ax.set_ylabel(f"{ylabel}\n(running mean of {smooth} steps)")
    ax.set_title("Training loss")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    bx.set_xlabel("step")
    bx.set_ylabel("activation-gradient values = 0 (%)")
    bx.set_ylim(-2, 102)
    bx.set_title("Gradients lost to underflow show up as zeros")
    bx.grid(alpha=0.3)
    bx.legend(fontsize="small")
    fig.suptitle(title or "FP32 against FP16 mixed precision, without and with loss scaling")
    return fig


def plot_shift_sweep(sweep: dict, *, title: str | None = None) -> Figure:
    """Final training loss of FP16 without loss scaling against the gradient shift k, beside FP32's.

    Parameters
    ----------
    sweep : dict from :func:`mpt_lab.experiments.biglstm.shift_sweep` ("fp32", "fp16" {k: loss},
        "zero_share" {k: share}, optionally "equivalent_shift")

    Returns
    -------
    Figure; x = k (gradients multiplied by 2⁻ᵏ), left y = loss (nats per token), right y = zero share (%).
    """
    if not isinstance(sweep, dict) or "fp16" not in sweep or "fp32" not in sweep:
        raise TypeError("sweep must be the dict returned by mpt_lab.experiments.biglstm.shift_sweep")
    ks = sorted(int(k) for k in sweep["fp16"])
    loss = [float(sweep["fp16"][k] if k in sweep["fp16"] else sweep["fp16"][str(k)]) for k in ks]
    zeros = [100 * float(sweep["zero_share"].get(k, sweep["zero_share"].get(str(k), np.nan))) for k in ks]
    fig = _figure((9, 4))
    ax = fig.add_subplot()
    ax.plot(ks, loss, "o-", color="#d62728", lw=2, label="mixed FP16, no loss scaling")
    ax.axhline(float(sweep["fp32"]), color="#1f77b4", lw=2, label="FP32 (identical for every k)")
    if sweep.get("equivalent_shift") is not None:
        ax.axvline(sweep["equivalent_shift"], color="0.4", ls=":", label="bigLSTM-equivalent shift")
    ax.set_xlabel("gradient shift k (every gradient × 2⁻ᵏ)")
    ax.set_ylabel("final training loss (nats per token)")
    ax.grid(alpha=0.3)
    bx = ax.twinx()
    bx.plot(ks, zeros, "s--", color="0.5", label="FP16 run: activation-gradient values = 0")
    bx.set_ylabel("activation-gradient values = 0 (%)")
    bx.set_ylim(0, 100)
    h1, l1 = ax.get_legend_handles_labels()
    h2, l2 = bx.get_legend_handles_labels()
    ax.legend(h1 + h2, l1 + l2, fontsize="small", loc="upper left")
    ax.set_title(title or f"Where FP16 without loss scaling starts to fall behind ({sweep.get('steps', '?')} steps)")
    return fig
