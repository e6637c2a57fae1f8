"""Figures and tables of gradient histograms and of the detector they come from.

The histogram is the one of Multibox SSD's activation gradients that NVIDIA's 2017 blog post "Mixed-Precision
Training of Deep Neural Networks" shows as its Figure 2 (66.8% zeros, 4% in [2⁻³², 2⁻³⁰)) and the paper,
Micikevicius et al. (ICLR 2018), as its Figure 3 (67% zeros, 2% in [2⁻³⁴, 2⁻³²)): the share of values per power
of two, with a bin for zeros, and FP16's representable range; §3.2 of the paper: a loss scale S shifts every
value by log2 S binades.
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence

import numpy as np
import torch
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Rectangle
from matplotlib.ticker import MaxNLocator

from .. import formats as F
from ..data import DigitsDetection
from ..experiments.gradient_factors import GradientFactorsResult
from ..experiments.ssd_histogram import PAPER, SSDHistogramResult
from ..formats import FormatLike
from ..harness.runner import ExperimentResult
from ..histogram import Log2Histogram, quantile_binade
from ..scaling import max_gradient_scale
from ._base import HTML, as_formats, binade, format_color, new_figure, pct, pow2, power_text, running_mean, table_html
from .formats import draw_format_ranges

__all__ = [
    "plot_gradient_histogram",
    "plot_kept_vs_scale",
    "plot_detection_samples",
    "plot_training",
    "histogram_table",
    "phases_table",
    "sweep_table",
    "plot_gradient_factors",
    "gradient_factors_table",
]


def _shade_format(ax, fmt: F.FloatFormat, lo: float) -> None:
    """Shade fmt's normal and subnormal ranges and its underflow zone on a log2 |x| axis starting at ``lo``."""
    m = fmt.mantissa_bits
    ax.axvspan(
        fmt.emin,
        np.log2(fmt.max) + 1e-9,
        color=format_color(fmt),
        alpha=0.12,
        label=f"{fmt.name} normal range [2^{fmt.emin}, max]",
    )
    if fmt.subnormals and m:
        # bin emin-m-1 holds [2^(emin-m-1), 2^(emin-m)): all of it rounds up to the smallest subnormal but the tie
        ax.axvspan(
            fmt.emin - m - 1,
            fmt.emin,
            color=format_color(fmt),
            alpha=0.05,
            label=f"{fmt.name} subnormals (values > 2^{fmt.emin - m - 1} round to ≥ 2^{fmt.emin - m})",
        )
        ax.axvspan(
            lo,
            fmt.emin - m - 1,
            color="0.5",
            alpha=0.12,
            label=f"lost: rounds to 0 in {fmt.name} (|x| ≤ 2^{fmt.emin - m - 1})",
        )


def plot_gradient_histogram(
    hists: Log2Histogram | dict[str, Log2Histogram],
    fmt: FormatLike = "FP16",
    *,
    scale: float | None = None,
    extra_formats: Sequence = (),
    title: str | None = None,
    xlim: tuple | None = None,
) -> Figure:
    """Percentage of values (log scale) per binade of |g|, with a zero bin: the SSD histogram of NVIDIA's blog post
    (its Figure 2) and of the paper (its Figure 3), for any histogram.

    Parameters
    ----------
    hists : Log2Histogram, or dict label → Log2Histogram (one set of bars per histogram, in its own colour)
    fmt : the format whose ranges are shaded (FP16 as in the paper)
    scale : optional loss scale S (a power of two): the first histogram is drawn again shifted by log2 S
    extra_formats : formats whose ranges are drawn as rows above the histogram (e.g. BF16, FP8_E5M2)
    title : the figure's title
    xlim : (lo, hi) in log2 units; default spans the data

    Returns
    -------
    Figure; x = log2 |g| (bin k holds 2ᵏ ≤ |g| < 2ᵏ⁺¹; the bars labelled "zeros" at the left are exact zeros),
    y = percentage of all values.  The legend sits below the axes, so it never covers a bar.

    Raises
    ------
    TypeError
        ``hists`` is not a histogram or a non-empty dict of them.
    ValueError
        ``scale`` is not a positive power of two.
    """
    if isinstance(hists, Log2Histogram):
        hists = {"gradients": hists}
    if not isinstance(hists, dict) or not hists or not all(isinstance(h, Log2Histogram) for h in hists.values()):
        raise TypeError("hists must be a Log2Histogram or a non-empty dict of label → Log2Histogram")
    fmt = F.get_format(fmt)
    extras = as_formats(extra_formats, "extra_formats") if extra_formats else []
    j = 0
    if scale is not None:
        mant, ex = math.frexp(float(scale)) if isinstance(scale, (int, float)) else (0.0, 0)
        if mant != 0.5:
            raise ValueError(f"scale must be a positive power of two, got {scale!r}")
        j = ex - 1
    first_label, first = next(iter(hists.items()))
    if xlim is None:
        ks = [h.exponents[h.counts > 0] for h in hists.values()]
        ks = np.concatenate([k for k in ks if k.size] or [np.array([-30, 0])])
        lo = min(int(ks.min()), fmt.emin - fmt.mantissa_bits - 2) - 3
        hi = max(int(ks.max()) + j, int(np.log2(fmt.max))) + 3
        xlim = (lo, hi)
    lo, hi = xlim
    n = len(hists)
    zero_w = 1.6 / n
    zero_x0 = lo - 2 - 1.6  # the zero bars sit left of a break at lo - 1
    range_fmts = [fmt] + [f for f in extras if f != fmt]
    fig = new_figure((10, 6.2 + 0.25 * len(range_fmts) + 0.2 * n))
    top, ax = fig.subplots(2, 1, sharex=True, height_ratios=[0.6 + 0.35 * len(range_fmts), 4])
    ax.set_xlim(zero_x0 - 1, hi)
    draw_format_ranges(top, range_fmts, 0, legend=False)  # the figure's legend explains the shades
    top.set_title(title or f"Gradient values by magnitude, with {fmt.name}'s ranges")
    top.set_ylim(-0.6, len(range_fmts) - 0.4)
    top.tick_params(axis="x", labelbottom=False)
    _shade_format(ax, fmt, lo - 1)
    for i, (label, h) in enumerate(hists.items()):
        share = 100.0 * h.counts / max(h.total, 1)
        keep = share > 0
        color = f"C{i}"
        ax.bar(
            h.exponents[keep] + 0.5,
            share[keep],
            width=1.0,
            facecolor=color,
            alpha=0.5 if n == 1 else 0.35,
            edgecolor=color,
            lw=1.0,
            label=f"{label}: non-zero values",
        )
        ax.bar(
            [zero_x0 + (i + 0.5) * zero_w],
            [100.0 * h.zeros / max(h.total, 1)],
            width=zero_w,
            color=color,
            alpha=0.85,
            label=f"{label}: zeros ({100.0 * h.fraction_zero():.1f}%)",
        )
    if j:
        share = 100.0 * first.counts / max(first.total, 1)
        keep = share > 0
        ax.step(
            first.exponents[keep] + j + 0.5,
            share[keep],
            where="mid",
            color="black",
            lw=1.2,
            label=f"{first_label} × S = 2^{j} (shifted by {j} binades)",
        )
    ax.axvline(lo - 1, color="black", lw=0.6)
    ax.set_yscale("log")
    ticks = list(range(int(np.ceil(lo / 8) * 8), hi + 1, 8))
    ax.set_xticks([zero_x0 + 0.8] + ticks, ["zeros"] + [str(t) for t in ticks])
    ax.set_xlabel("log₂ |gradient value|   (bin k holds 2ᵏ ≤ |g| < 2ᵏ⁺¹)")
    ax.set_ylabel("percentage of all values (%)")
    ax.set_title(f"Histogram; shaded: what {fmt.name} keeps, and what it loses", fontsize="medium")
    ax.grid(axis="y", alpha=0.3)
    fig.legend(*ax.get_legend_handles_labels(), loc="outside lower center", ncol=2, fontsize="small")
    return fig


def plot_kept_vs_scale(
    hist: Log2Histogram,
    fmt: FormatLike = "FP16",
    *,
    log2_scales: Sequence[int] = tuple(range(0, 41)),
    title: str | None = None,
) -> Figure:
    """Share of non-zero values kept (normal or subnormal), lost to zero and overflowed, against log2 S.

    Computed exactly from the histogram with :meth:`Log2Histogram.fractions`; the largest S without overflow
    (:meth:`Log2Histogram.max_scale`) is marked.  A second panel draws the lost and overflowed shares on a log
    axis, where a first overflow of a few values, invisible on the linear axis, shows.

    Returns
    -------
    Figure; x = log2 S (whole exponents), y = percentage of the non-zero finite values (linear above, log below).
    """
    if not isinstance(hist, Log2Histogram):
        raise TypeError(f"hist must be a Log2Histogram, got {type(hist).__name__}")
    fmt = F.get_format(fmt)
    js = np.asarray(list(log2_scales), dtype=int)
    if js.size == 0:
        raise ValueError("log2_scales must not be empty")
    rows = [hist.fractions(fmt, float(2.0**j)) for j in js]
    nz = np.array([r["normal"] + r["subnormal"] + r["underflow"] + r["overflow"] for r in rows])
    nz = np.where(nz > 0, nz, np.nan)
    kept = np.array([r["normal"] + r["subnormal"] for r in rows]) / nz * 100
    under = np.array([r["underflow"] for r in rows]) / nz * 100
    over = np.array([r["overflow"] for r in rows]) / nz * 100
    fig = new_figure((9, 6.4))
    ax, lx = fig.subplots(2, 1, sharex=True, height_ratios=[1.4, 1])
    ax.plot(js, kept, "o-", ms=3, color="#2ca02c", label="kept (normal or subnormal)")
    for a in (ax, lx):
        a.plot(js, under, "s-", ms=3, color="0.4", label="lost: rounds to zero")
        a.plot(js, over, "^-", ms=3, color="#d62728", label="overflow")
    smax = hist.max_scale(fmt)
    if np.isfinite(smax):
        for a in (ax, lx):
            a.axvline(
                np.log2(smax), color="black", ls="--", lw=1, label=f"largest S without overflow: 2^{int(np.log2(smax))}"
            )
    lx.set_yscale("log")
    lx.set_xlabel("log₂ S   (loss scale S)")
    lx.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylabel(f"share of non-zero values in {fmt.name} (%)")
    lx.set_ylabel("lost or overflowed (%, log)")
    ax.set_title(title or f"What a loss scale S keeps in {fmt.name}")
    ax.set_ylim(-2, 102)
    ax.legend(fontsize="small", loc="center left")
    ax.grid(alpha=0.3)
    lx.grid(alpha=0.3, which="both")
    return fig


def plot_detection_samples(
    dataset: DigitsDetection,
    n: int = 8,
    *,
    detections: Sequence[dict[str, torch.Tensor]] | None = None,
    title: str | None = None,
) -> Figure:
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

    if not isinstance(n, int) or not 1 <= n <= 32:
        raise ValueError(f"n must be an int in [1, 32], got {n!r}")
    n = min(n, len(dataset))
    cols = min(n, 8)
    rows = (n + cols - 1) // cols
    fig = new_figure((1.6 * cols, 1.75 * rows + 0.8))
    axes = np.atleast_1d(fig.subplots(rows, cols, squeeze=False).ravel())
    size = 0
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
    fig.legend(handles=handles, loc="outside lower center", ncol=2, fontsize="small")
    fig.suptitle(title or f"{n} images of the detection data set, with their boxes ({size} × {size} pixels)")
    return fig


def plot_training(result: ExperimentResult, *, title: str | None = None, smooth: int = 25) -> Figure:
    """Training loss of an SSD histogram run against step (raw and a running mean), with mAP@0.5 on a second
    axis.

    Parameters
    ----------
    result : :class:`mpt_lab.experiments.ssd_histogram.SSDHistogramResult`
    smooth : window of the running mean (steps)
    """
    steps, losses = np.asarray(result.steps, dtype=float), np.asarray(result.losses, dtype=float)
    if steps.shape != losses.shape or steps.ndim != 1 or steps.size == 0:
        raise ValueError("result must hold non-empty steps and losses of equal length")
    fig = new_figure((9, 4))
    ax = fig.add_subplot()
    ax.plot(steps, losses, color="#1f77b4", alpha=0.3, lw=0.8, label="training loss (per step)")
    x, mean = running_mean(losses, smooth)
    ax.plot(steps[x - 1], mean, color="#1f77b4", lw=1.8, label=f"running mean ({min(smooth, steps.size)} steps)")
    ax.set_xlabel("step")
    ax.set_ylabel("loss (SSD eq. 1, dimensionless)")
    ax.set_title(title or f"SSD in FP32: training loss and test mAP@0.5 ({result.profile} profile)")
    ax.grid(alpha=0.3)
    handles, labels = ax.get_legend_handles_labels()
    if result.map50:
        ax2 = ax.twinx()
        s, m = zip(*result.map50)
        by = result.map_evaluator.split(" (")[0]  # "pycocotools 2.0.11 COCOeval", or the old evaluator
        # measured only at these steps: markers, joined by a dotted line that is not a measurement
        ax2.plot(s, m, "o:", ms=6, color="#d62728", label=f"mAP@0.5 at the {len(s)} steps evaluated (test split; {by})")
        ax2.set_ylabel("mAP@0.5 (0–1)")
        ax2.set_ylim(0, 1)
        h2, l2 = ax2.get_legend_handles_labels()
        handles, labels = handles + h2, labels + l2
    # below the axes, as in the chapter's other figures: inside them it would cover the mAP curve
    fig.legend(handles, labels, loc="outside lower center", ncol=2, fontsize="small")
    return fig


def _arithmetic(result) -> str:
    """ "FP32", or "FP32 (TF32 convolutions)" for a run on a GPU whose provenance records cuDNN's TF32 switch on."""
    backends = result.provenance.get("backends", {})
    on_gpu = not str(result.provenance.get("device", "")).startswith("CPU")
    return "FP32 (TF32 convolutions)" if on_gpu and backends.get("cudnn_allow_tf32") else "FP32"


def histogram_table(results: dict, fmt: FormatLike = "FP16") -> HTML:
    """The sources' numbers beside each result's, for the activation gradients in ``fmt`` (an HTML table).

    Two source columns, each holding only what that source says: NVIDIA's 2017 blog post (Figure 2: 66.8% zeros,
    4% in [2⁻³², 2⁻³⁰)) with NVIDIA's "Training with Mixed Precision" guide (a scale of 2¹⁵ recovers all but 0.1%
    of the values lost to zero), and the paper (Micikevicius et al. 2018: Figure 3, 67% zeros and 2% in
    [2⁻³⁴, 2⁻³²); §3.2).  The last two rows take every gradient of the run into account, activation *and* weight
    gradients: a loss scale multiplies both, so the largest S without overflow is set by the largest of either.

    Parameters
    ----------
    results : dict label → :class:`~mpt_lab.experiments.ssd_histogram.SSDHistogramResult` (e.g. {"this run": r,
        "saved GPU run": g}); each column's header names its device and profile.

    Raises
    ------
    TypeError
        ``results`` is not a non-empty dict of such results.
    """

    if (
        not isinstance(results, dict)
        or not results
        or not all(isinstance(r, SSDHistogramResult) for r in results.values())
    ):
        raise TypeError("results must be a non-empty dict of label → SSDHistogramResult")
    fmt = F.get_format(fmt)
    sums = {k: r.summary(fmt) for k, r in results.items()}
    every = {k: r.activation + r.weight for k, r in results.items()}

    def ours(fn):
        return [fn(k) for k in results]

    rows = [
        [
            "exactly zero (of all values)",
            pct(PAPER["zeros"]),
            pct(PAPER["paper_zeros"]),
            *ours(lambda k: pct(sums[k].zeros)),
        ],
        [
            "in [2⁻³², 2⁻³⁰) (of all values)",
            pct(PAPER["share_2^-32_to_2^-30"]),
            "–",
            *ours(lambda k: pct(sums[k].share_2_32_to_2_30)),
        ],
        [
            "in [2⁻³⁴, 2⁻³²) (of all values)",
            "–",
            pct(PAPER["paper_share_2^-34_to_2^-32"]),
            *ours(lambda k: pct(results[k].activation.fraction_between(2.0**-34, 2.0**-32))),
        ],
        [
            "non-zero, below the smallest subnormal 2⁻²⁴ (of all values)",
            "–",
            "“many values” (§3.2)",
            *ours(lambda k: pct(sums[k].below_smallest_subnormal)),
        ],
        [
            "lost in FP16 (rounds to 0: 0 < |x| ≤ 2⁻²⁵; of all values)",
            f"{pct(PAPER['guide_lost'])} (guide; its base not stated)",
            "–",
            *ours(lambda k: pct(sums[k].lost)),
        ],
        [
            "… of which ≥ 2⁻²⁷ (of all values)",
            "–",
            "these matter for training (§3.2)",
            *ours(lambda k: pct(sums[k].lost_that_matters)),
        ],
        [
            "lost with S = 8 (of all values)",
            f"S = {PAPER['guide_sufficient_scale']} was sufficient (guide)",
            f"S = {PAPER['sufficient_scale']} was enough to match FP32 (§3.2)",
            *ours(lambda k: pct(sums[k].lost_at_8)),
        ],
        ["kept by S = 8 (of the values lost at S = 1)", "–", "–", *ours(lambda k: pct(sums[k].recovered_by_8))],
        [
            "kept by S = 2¹⁵ (of the values lost at S = 1)",
            f"all but {pct(PAPER['lost_after_2^15'])} (guide)",
            "–",
            # the guide's 0.1% is for a scale that overflows nothing; say where 2^15 overflows a gradient of ours
            *ours(
                lambda k: (
                    # four digits: the guide's "all but 0.1%" is what this row is read against
                    pct(sums[k].recovered_by_2_15, 4)
                    + (" (but S = 2¹⁵ overflows here)" if every[k].max_scale(fmt) < 2.0**15 else "")
                )
            ),
        ],
        ["median binade of the non-zero values", "–", "–", *ours(lambda k: binade(sums[k].median_binade))],
        [
            "largest power-of-two S with no overflow, over every gradient (activation and weight)",
            "–",
            "–",
            *ours(lambda k: pow2(every[k].max_scale(fmt))),
        ],
        [
            "max-gradient rule over every gradient: largest 2ᵏ with amax·2ᵏ ≤ 65504",
            "–",
            "–",
            *ours(lambda k: pow2(max_gradient_scale(every[k].amax, fmt) if every[k].amax > 0 else math.inf)),
        ],
    ]
    header = [
        "activation gradients of Multibox SSD (VGG-16, 300×300) and of ours",
        "NVIDIA blog post, Fig. 2, and guide",
        "the paper, Fig. 3 and §3.2",
    ] + [f"{k} ({r.device}, {r.profile} profile)" for k, r in results.items()]
    return table_html(header, rows)


def phases_table(result: ExperimentResult, fmt: FormatLike = "FP16") -> HTML:
    """Per part of training: share of zeros, median binade, share lost in ``fmt`` (an HTML table)."""
    rows = []
    for p in result.phases:
        h = p["activation"]
        rows.append(
            [
                f"{p['from']}–{p['to']}",
                pct(h.fraction_zero()),
                binade(h.median_binade()),
                pct(h.fractions(fmt)["underflow"]),
            ]
        )
    return table_html(["steps", "zeros", "median non-zero |g|", f"lost in {F.get_format(fmt).name} (S = 1)"], rows)


def sweep_table(result: ExperimentResult, fmt: FormatLike = "FP16") -> HTML:
    """The size sweep: per detector, median binade and the share of values below the smallest subnormal."""
    fmt = F.get_format(fmt)
    rows = []
    for label, h in result.sweep.items():
        rows.append(
            [
                label,
                binade(h.median_binade()),
                pct(h.fraction_zero()),
                pct(h.fraction_below(fmt.smallest_subnormal, include_zeros=False)),
                pct(h.fractions(fmt)["underflow"]),
            ]
        )
    return table_html(
        [
            "detector, input size",
            "median non-zero |g|",
            "zeros",
            f"non-zero below {power_text(math.log2(fmt.smallest_subnormal))}",
            f"lost in {fmt.name}",
        ],
        rows,
    )


def plot_gradient_factors(
    result: GradientFactorsResult, fmt: FormatLike = "FP16", *, title: str | None = None
) -> Figure:
    """Where each variant of the gradient-factor experiment puts its activation gradients, against ``fmt``'s range.

    One row per variant (top: our detector): a dot at the median binade of the non-zero activation gradients, a
    thick bar over the middle half (25th to 75th percentile) and a thin line over the 10th to 90th percentile;
    shaded: what ``fmt`` keeps (normal, subnormal) and the zone it rounds to zero.  The last row marks the two bins
    the sources quote for Multibox SSD: 2% of all values in [2⁻³⁴, 2⁻³²) (the paper's Figure 3 caption) and 4% in
    [2⁻³², 2⁻³⁰) (Figure 2 caption of NVIDIA's 2017 blog post); neither source gives a median.

    Parameters
    ----------
    result : :class:`mpt_lab.experiments.gradient_factors.GradientFactorsResult`
    fmt : the format whose ranges are shaded (FP16)

    Returns
    -------
    Figure; x = log₂ |activation gradient| (binade k holds 2ᵏ ≤ |g| < 2ᵏ⁺¹), y = variants grouped by factor.

    Raises
    ------
    TypeError
        ``result`` is not a GradientFactorsResult.
    """
    if not isinstance(result, GradientFactorsResult):
        raise TypeError(f"result must be a GradientFactorsResult, got {type(result).__name__}")
    fmt = F.get_format(fmt)
    vids = list(result.variants)
    rows = len(vids) + 1
    fig = new_figure((10, 1.6 + 0.36 * rows))
    ax = fig.add_subplot()
    q = {v: [quantile_binade(result.variants[v]["activation"], p) for p in (0.1, 0.25, 0.5, 0.75, 0.9)] for v in vids}
    ks = [k for qs in q.values() for k in qs if k is not None]
    lo = min(ks + [-34]) - 2
    hi = max(ks + [0]) + 3
    _shade_format(ax, fmt, lo)
    ys = np.arange(rows)[::-1]
    factor_prev = None
    for y, v in zip(ys, vids):
        d = result.variants[v]
        if factor_prev is not None and d["factor"] != factor_prev:
            ax.axhline(y + 0.5, color="0.8", lw=0.6)
        factor_prev = d["factor"]
        k10, k25, k50, k75, k90 = q[v]
        if k50 is None:
            continue
        ax.plot(
            [k10, k90 + 1],
            [y, y],
            color="0.25",
            lw=1.2,
            label="10th–90th percentile of the non-zero values" if v == vids[0] else None,
        )
        ax.plot(
            [k25, k75 + 1],
            [y, y],
            color="#1f77b4",
            lw=6,
            alpha=0.6,
            solid_capstyle="butt",
            label="25th–75th percentile" if v == vids[0] else None,
        )
        ax.plot([k50 + 0.5], [y], "o", color="#d62728", ms=7, label="median binade" if v == vids[0] else None)
    ax.axvline(q[vids[0]][2] + 0.5, color="#d62728", lw=0.8, ls=":", label="median of our detector")
    ax.barh(
        ys[-1],
        2,
        left=-34,
        height=0.5,
        color="none",
        edgecolor="0.2",
        hatch="///",
        label="Multibox SSD: 2% of all values in [2⁻³⁴, 2⁻³²) (paper, Fig. 3)",
    )
    ax.barh(
        ys[-1],
        2,
        left=-32,
        height=0.5,
        color="0.6",
        edgecolor="0.2",
        hatch="..",
        label="Multibox SSD: 4% of all values in [2⁻³², 2⁻³⁰) (NVIDIA blog, Fig. 2)",
    )
    ax.set_yticks(
        ys,
        [f"{result.variants[v]['factor']}: {result.variants[v]['label']}" for v in vids]
        + ["Multibox SSD, VGG-16, 300 px: the sources' bins"],
        fontsize="small",
    )
    ax.set_ylim(-0.7, rows - 0.3)
    ax.set_xlim(lo, hi)
    ax.set_xlabel("log₂ |activation gradient|   (binade k holds 2ᵏ ≤ |g| < 2ᵏ⁺¹)")
    ax.set_ylabel("variant (one factor changed)")
    ax.set_title(
        title
        or f"What moves the activation gradients\n{result.config['steps']} {_arithmetic(result)} steps per variant, "
        f"{result.profile} profile"
    )
    ax.grid(axis="x", alpha=0.3)
    fig.legend(*ax.get_legend_handles_labels(), loc="outside lower center", ncol=2, fontsize="small")
    return fig


def gradient_factors_table(result: GradientFactorsResult) -> HTML:
    """Per variant of the gradient-factor experiment: median binade, its shift from our detector split into the
    part the loss's divisor predicts (1/N, the gradient shift k) and the rest, matched boxes, and the shares zero,
    below 2⁻²⁴ and lost in FP16 (an HTML table).

    Raises TypeError when ``result`` is not a GradientFactorsResult."""
    if not isinstance(result, GradientFactorsResult):
        raise TypeError(f"result must be a GradientFactorsResult, got {type(result).__name__}")

    def signed(v, digits=0):
        return "–" if v is None else f"{v:+.{digits}f}"

    rows = []
    for vid, d in result.variants.items():
        sh = result.shares(vid)
        shift, law = result.shift(vid), result.divisor_shift(vid)
        rows.append(
            [
                f"{html.escape(d['factor'])}: {html.escape(d['label'])}",
                binade(result.median(vid)),
                signed(shift),
                signed(law, 1),
                signed(None if shift is None else shift - law, 1),
                f"{d['matched']:,.0f}",
                pct(sh["zeros"]),
                pct(sh["below"]),
                pct(sh["lost"]),
            ]
        )
    return table_html(
        [
            "factor: variant",
            "median non-zero |g|",
            "shift from ours (binades)",
            "of which the loss's divisor: 1/N, 2⁻ᵏ (binades)",
            "the rest: the network (binades)",
            "matched boxes N per batch",
            "zeros (of all values)",
            "below 2⁻²⁴ (of non-zero)",
            "lost in FP16: 0 < |g| ≤ 2⁻²⁵ (of non-zero)",
        ],
        rows,
        caption=f"{result.config['steps']} {_arithmetic(result)} steps per variant, {result.profile} profile, {result.device}",
    )
