"""Figures and tables of loss scaling: the dynamic scale over a run, and FP32 against FP16 mixed precision
without and with loss scaling (bigLSTM's result and Table 2's SSD row), and where a language model's activation
gradients lie against its vocabulary and batch (why chapter 8 shifts them).

Micikevicius et al. (ICLR 2018), §3.2 (loss scaling, dynamic scaling), §4.2 (Table 2), and its bigLSTM result (NVIDIA's
blog post on the paper, Micikevicius et al. 2017, draws its training-loss curves as its Figure 1).
"""

from __future__ import annotations

import numpy as np
from matplotlib.figure import Figure
from matplotlib.patches import Patch
from matplotlib.ticker import MaxNLocator

from ..harness.runner import ExperimentResult
from ..histogram import Log2Histogram, log2_histogram, lost_mass, lost_share
from ._base import FORMAT_COLORS, HTML, new_figure, pct, power_text, recipe_style, running_mean, table_html

__all__ = [
    "plot_scale_history",
    "plot_divergence",
    "plot_shift_sweep",
    "divergence_table",
    "plot_gradient_scale",
    "gradient_scale_table",
    "plot_gradient_shift",
    "plot_sampled_softmax",
]

_STYLES = ["-", "--", ":", "-."]


def plot_scale_history(result: ExperimentResult | dict, *, title: str | None = None) -> Figure:
    """Loss scale S against step (log2 axis), with overflow steps marked.

    Parameters
    ----------
    result : :class:`mpt_lab.experiments.loss_scaling.LossScalingResult` (both scalers are drawn: ours solid,
        torch's dashed on top; identical trajectories overlap exactly), or a dict label → list of
        (step, scale, found_inf) as in ``GradScaler.history``.

    Returns
    -------
    Figure; x = step, y = log2 S.
    """
    histories = (
        result
        if isinstance(result, dict)
        else {"mpt_lab.scaling.GradScaler": result.history["mpt_lab"], "torch.amp.GradScaler": result.history["torch"]}
    )
    if not histories:
        raise TypeError("result must be a LossScalingResult or a non-empty dict of label → history")
    fig = new_figure((9, 4))
    ax = fig.add_subplot()
    for i, (label, h) in enumerate(histories.items()):
        if not h:
            continue
        steps = np.array([s for s, _, _ in h])
        scales = np.log2(np.array([v for _, v, _ in h], dtype=float))
        ax.step(steps, scales, where="post", lw=2.2 if i == 0 else 1.2, ls="-" if i == 0 else "--", label=f"S, {label}")
        inf = np.array([bool(f) for _, _, f in h])
        if inf.any() and i == 0:
            ax.plot(steps[inf], scales[inf], "v", color="#d62728", ms=7, label="overflow: step skipped, S halved")
    ax.set_xlabel("step")
    ax.set_ylabel("log₂ S   (loss scale)")
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))  # S is a power of two: whole exponents only
    ax.set_title(title or "Dynamic loss scaling: grow after N clean steps, back off on overflow")
    ax.legend(fontsize="small", loc="lower right")
    ax.grid(alpha=0.3)
    return fig


def plot_divergence(
    result: ExperimentResult, *, smooth: int = 20, title: str | None = None, ylabel: str | None = None
) -> Figure:
    """Training loss per arm beside the share of activation-gradient values that are zero, over training.

    bigLSTM's training-loss curves (left) and their explanation (right): a run whose gradients underflow in FP16 loses them
    (they become zeros) and its loss falls behind.

    Parameters
    ----------
    result : a :class:`~mpt_lab.experiments.biglstm.BigLSTMResult` or
        :class:`~mpt_lab.experiments.ssd_table2.SSDTable2Result` (per arm: "losses" and "evals" with "step" and
        "zero_share")
    smooth : window of the running mean of the losses (steps; non-finite losses leave gaps)
    ylabel : the loss axis label (default: nats per token for the language model, SSD eq. 1 for the detector)

    Returns
    -------
    Figure with two axes: x = step; left y = loss, right y = zero share in percent.
    """
    arms = getattr(result, "arms", None)
    if not isinstance(arms, dict) or not arms:
        raise TypeError("result must be a BigLSTMResult or SSDTable2Result with at least one arm")
    if ylabel is None:
        ylabel = (
            "training loss (SSD eq. 1)" if "map50" in next(iter(arms.values())) else "training loss (nats per token)"
        )
    fig = new_figure((12, 4.6))
    ax, bx = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
    for i, (arm, d) in enumerate(arms.items()):
        label = result.labels.get(arm, arm)
        x, mean = running_mean(d["losses"], smooth)
        ax.plot(x, mean, ls=_STYLES[i % 4], lw=2.2 if i == 0 else 1.6, label=label)
        if d["evals"]:
            bx.plot(
                [e["step"] for e in d["evals"]],
                [100 * e["zero_share"] for e in d["evals"]],
                "o" + _STYLES[i % 4],
                lw=2.2 if i == 0 else 1.6,
                label=label,
            )
    ax.set_xlabel("step")
    ax.set_ylabel(f"{ylabel}\n(running mean of {smooth} steps)")
    ax.set_title("Training loss")
    ax.grid(alpha=0.3)
    bx.set_xlabel("step")
    bx.set_ylabel("activation-gradient values = 0 (%)")
    bx.set_ylim(-2, 102)
    bx.set_title("Zeros: FP32's own, plus underflow in the FP16 runs")
    bx.grid(alpha=0.3)
    fig.legend(*ax.get_legend_handles_labels(), loc="outside lower center", ncol=min(4, len(arms)), fontsize="small")
    shift = getattr(result, "grad_shift", result.config.get("grad_shift"))
    fp16 = "real" if result.real_fp16 else "simulated"
    fig.suptitle(
        title
        or f"FP32 against FP16 mixed precision ({fp16} FP16, gradient shift k = {shift}, {result.profile} profile)"
    )
    return fig


def plot_shift_sweep(result: ExperimentResult, *, title: str | None = None) -> Figure:
    """Final training loss of FP16 without loss scaling against the gradient shift k, beside FP32's.

    Parameters
    ----------
    result : a :class:`~mpt_lab.experiments.biglstm.BigLSTMResult` whose ``sweep`` holds "fp32", "fp16_unscaled"
        {k: loss}, "zero_share" {k: share} and "equivalent_shift"

    Returns
    -------
    Figure; x = k (gradients multiplied by 2⁻ᵏ), left y = loss (nats per token), right y = zero share (%).
    """
    sweep = getattr(result, "sweep", None)
    if not isinstance(sweep, dict) or "fp16_unscaled" not in sweep or "fp32" not in sweep:
        raise TypeError("result must be a BigLSTMResult that ran a shift sweep (config sweep_shifts)")
    ks = sorted(int(k) for k in sweep["fp16_unscaled"])
    loss = [float(sweep["fp16_unscaled"][str(k)]) for k in ks]
    zeros = [100 * float(sweep["zero_share"][str(k)]) for k in ks]
    fig = new_figure((9, 4.4))
    ax = fig.add_subplot()
    runs = [[ks[0]]]  # lines join neighbouring shifts only: none across an unmeasured k
    for a in ks[1:]:
        runs[-1].append(a) if a == runs[-1][-1] + 1 else runs.append([a])
    for i, run in enumerate(runs):
        ax.plot(
            run,
            [loss[ks.index(a)] for a in run],
            "o-",
            color="#d62728",
            lw=2,
            label=f"{recipe_style('fp16_unscaled')[0]}: final loss (lines join neighbouring k)" if i == 0 else None,
        )
    ax.axhline(float(sweep["fp32"]), color="#1f77b4", lw=2, label="FP32 (identical for every k)")
    if sweep.get("equivalent_shift") is not None:
        ax.axvline(
            sweep["equivalent_shift"],
            color="0.4",
            ls=":",
            label=f"bigLSTM's median sampled-logit gradient (simulated): k = {sweep['equivalent_shift']}",
        )
    ax.set_xlabel("gradient shift k (every gradient × 2⁻ᵏ)")
    ax.set_ylabel("final training loss (nats per token)")
    ax.grid(alpha=0.3)
    bx = ax.twinx()
    for i, run in enumerate(runs):
        bx.plot(
            run,
            [zeros[ks.index(a)] for a in run],
            "s--",
            color="0.5",
            label="FP16 run: activation-gradient values = 0 (%)" if i == 0 else None,
        )
    bx.set_ylabel("activation-gradient values = 0 (%)")
    bx.set_ylim(0, 100)
    h1, l1 = ax.get_legend_handles_labels()
    h2, l2 = bx.get_legend_handles_labels()
    fig.legend(h1 + h2, l1 + l2, loc="outside lower center", ncol=2, fontsize="small")
    ax.set_title(title or f"Where FP16 without loss scaling starts to fall behind ({sweep.get('steps', '?')} steps)")
    return fig


def divergence_table(result: ExperimentResult, paper: dict | None = None) -> HTML:
    """Per arm: the final training loss and its difference from FP32's, the quality measure (validation
    perplexity for the language model, mAP@0.5 for the detector, beside ``paper``'s row when given), the share of
    activation-gradient values that are zero in the run, the share of FP32's values that FP16 would round to zero,
    and the skipped steps (an HTML table); the caption gives the gradient shift of the runs and what each share is.

    Parameters
    ----------
    result : :class:`~mpt_lab.experiments.biglstm.BigLSTMResult` or
        :class:`~mpt_lab.experiments.ssd_table2.SSDTable2Result`
    paper : the source's row, arm → its number or word (e.g. ``ssd_table2.PAPER["Multibox SSD"]``), or None
    """
    arms = getattr(result, "arms", None)
    if not isinstance(arms, dict) or not arms or "fp32" not in arms:
        raise TypeError("result must be a BigLSTMResult or SSDTable2Result with an FP32 arm")
    rows = []
    detector = hasattr(result, "final_map")
    loss = result.final_loss if detector else result.final
    base = loss("fp32")
    for arm, d in arms.items():
        e = d["evals"][-1] if d["evals"] else {}
        if detector:
            quality = f"{100 * result.final_map(arm):.1f}" + (" (diverged)" if result.diverged(arm) else "")
        else:
            quality = f"{result.final(arm, 'ppl'):.1f}"
        row = [
            result.labels.get(arm, arm),
            f"{loss(arm):.3f}",
            "–" if arm == "fp32" else f"{loss(arm) - base:+.3f}",
            quality,
        ]
        if paper is not None:
            row.append(str(paper.get(arm, "—")))
        small = [
            ("< 0.0001%" if v and 0 < v < 1e-6 else pct(v, 3)) for v in (e.get("zero_share"), e.get("fp16_underflow"))
        ]
        flush = small[1] if arm == "fp32" else "– (its values are FP16)"
        rows.append(row + [small[0], flush, str(len(d["skipped"]))])
    header = ["run", "final loss", "vs FP32", "mAP@0.5 (%)" if detector else "validation perplexity"]
    if paper is not None:
        header.append("the paper's run (%)")
    shift = getattr(result, "grad_shift", None)
    shift = result.config.get("grad_shift") if shift is None else shift
    evaluator = f"mAP@0.5 by {result.map_evaluator}. " if detector else ""
    caption = (
        evaluator + f"Gradient shift k = {shift}{' (none)' if shift == 0 else ''}. Final loss: mean of the last 50 "
        "steps. = 0: activation-gradient values exactly zero in the run's own arithmetic (in the FP16 runs, "
        "their own zeros, with what FP16 flushed among them; each run has its own weights, so its zeros need not "
        "be the FP32 row's plus what FP16 would flush). FP16 would flush: "
        "the share of the FP32 run's values that FP16 would round to zero "
        "(|x| ≤ 2⁻²⁵)." + (" Paper: Micikevicius et al. 2018, Table 2, its own runs." if paper else "")
    )
    return table_html(header + ["= 0", "FP16 would flush", "skipped steps"], rows, caption=caption)


# ------------------------------------------------------------------- the language model's gradient scale
def _gradient_scale_points(result, which: str) -> list:
    points = getattr(result, "points", None)
    if not isinstance(points, list) or not points or not hasattr(result, "summary"):
        raise TypeError("result must be an LMGradientScaleResult with at least one point")
    return result.summary(which)


def plot_gradient_scale(result: ExperimentResult, *, which: str = "trained", title: str | None = None) -> Figure:
    """Where a language model's activation gradients lie against its vocabulary V and batch N, and a gradient
    shift k beside a 2ᵏ times larger vocabulary or batch.

    Parameters
    ----------
    result : :class:`~mpt_lab.experiments.lm_gradient_scale.LMGradientScaleResult`
    which : "trained" (histograms of the last recorded steps) or "init" (the first step)

    Returns
    -------
    Figure with three axes.  Left: x = log₂(V·N), y = log₂ of the median |activation gradient| (one marker per
    point, one colour per vocabulary), with the line of slope −1 (the 1/(V·N) law) through their mean and FP16's
    underflow threshold.  Middle: the percentage of values per binade (x = log₂|g|) of the comparison with the
    largest k: the smaller point's histogram shifted down by k binades (dashed) beside the measured points with
    2ᵏ times the vocabulary or the batch (solid).  Right: what FP16 would lose (%) against log₂(V·N·2ᵏ), from
    the largest batch of each vocabulary shifted by k = 0, 1, …: the share of the values (dashed) and of their
    sum |g| (solid; :func:`~mpt_lab.histogram.lost_mass`), measured points marked.

    Raises TypeError for another result, ValueError for ``which``.
    """
    rows = _gradient_scale_points(result, which)
    fig = new_figure((16, 5.2))
    ax, bx, cx = fig.add_subplot(1, 3, 1), fig.add_subplot(1, 3, 2), fig.add_subplot(1, 3, 3)
    vocabs = sorted({r["vocab_size"] for r in rows})
    markers = "os^Dv<>p*h"
    tokens = sorted({r["tokens"] for r in rows})
    for r in rows:
        ci, mi = vocabs.index(r["vocab_size"]), tokens.index(r["tokens"])
        ax.plot(r["log2_vn"], r["median_log2"], markers[mi % len(markers)], color=f"C{ci}", ms=8)
    for ci, v in enumerate(vocabs):  # legend entries: colour = vocabulary, marker = batch
        ax.plot([], [], "o", color=f"C{ci}", label=f"V = {v:,} words")
    for mi, n in enumerate(tokens):
        ax.plot([], [], markers[mi % len(markers)], color="0.4", mfc="none", label=f"N = {n:,} tokens per batch")
    x = np.array([r["log2_vn"] for r in rows])
    y = np.array([r["median_log2"] for r in rows])
    xs = np.array([x.min() - 1, max(x.max() + 1, 26)])
    ax.plot(xs, (y + x).mean() - xs, "k--", lw=1.2, label="slope −1: median ∝ 1/(V·N)")
    ax.axhline(-25, color=FORMAT_COLORS["FP16"], ls=":", lw=1.5, label="FP16 rounds |x| ≤ 2⁻²⁵ to zero")
    ax.set_xlabel("log₂(V·N)   (vocabulary × tokens per batch)")
    ax.set_ylabel("log₂ median |activation gradient|")
    ax.set_title("The median gradient follows 1/(V·N)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="x-small", loc="lower left")
    comps = result.comparisons(which)
    if comps:
        k = max(c["k"] for c in comps)
        base = min(c["base"] for c in comps if c["k"] == k)
        pts = {(p["vocab_size"], p["tokens"]): p[which] for p in result.points}
        h = pts[base]
        share = 100.0 * h.counts / max(h.total, 1)
        keep = share > 0
        bx.plot(
            h.exponents[keep] - k,
            share[keep],
            "k--",
            lw=2,
            label=f"V = {base[0]:,}, N = {base[1]:,}, shifted by k = {k} (loss × 2⁻{_sup(k)})",
        )
        for i, c in enumerate(c for c in comps if c["k"] == k and c["base"] == base):
            t = pts[c["target"]]
            share = 100.0 * t.counts / max(t.total, 1)
            keep = share > 0
            bx.plot(
                t.exponents[keep],
                share[keep],
                _STYLES[i % 4],
                color=f"C{i + 2}",
                lw=1.6,
                label=f"measured: V = {c['target'][0]:,}, N = {c['target'][1]:,} "
                f"({'vocabulary' if c['axis'] == 'V' else 'batch'} × 2{_sup(k)})",
            )
    bx.axvline(-25, color=FORMAT_COLORS["FP16"], ls=":", lw=1.5, label="FP16: |x| ≤ 2⁻²⁵ → 0")
    bx.set_yscale("log")
    bx.set_xlabel("log₂|activation gradient|   (bin k: 2ᵏ ≤ |g| < 2ᵏ⁺¹)")
    bx.set_ylabel("share of values (%)")
    bx.set_title("A shift k against 2ᵏ times the vocabulary or batch")
    bx.grid(alpha=0.3)
    bx.legend(fontsize="x-small", loc="upper center", bbox_to_anchor=(0.5, -0.16))  # below: no data covered
    _plot_lost_against_shift(cx, result, which, vocabs)
    fig.suptitle(
        title or f"What sets a language model's gradient scale ({which} histograms, FP32, {result.profile} profile)"
    )
    return fig


def _plot_lost_against_shift(ax, result, which: str, vocabs: list, shifts: int = 14) -> None:

    for ci, v in enumerate(vocabs):
        p = max((p for p in result.points if p["vocab_size"] == v), key=lambda p: p["tokens"])
        h, x = p[which], p["log2_vn"] + np.arange(shifts + 1)
        label = f"V = {v:,}, N = {p['tokens']:,}"
        ax.plot(x, [100 * lost_share(h, k) for k in range(shifts + 1)], "--", color=f"C{ci}", lw=1.2)
        ax.plot(x, [100 * lost_mass(h, k) for k in range(shifts + 1)], "-", color=f"C{ci}", lw=2, label=label)
        ax.plot(x[0], 100 * lost_mass(h), "o", color=f"C{ci}", ms=7)
    ax.plot([], [], "k--", lw=1.2, label="share of the values")
    ax.plot([], [], "k-", lw=2, label="share of their sum |g|")
    ax.set_xlabel("log₂(V·N·2ᵏ)   (shifted by k = 0, 1, …; dots: measured)")
    ax.set_ylabel("lost in FP16: rounded to zero (%)")
    ax.set_ylim(-2, 102)
    ax.set_title("What FP16 would lose, shift by shift")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="x-small", loc="upper left")


def _share(v: float) -> str:
    """A share (0 to 1) as a percentage for a figure title: three significant digits, "< 0.01%" below that."""
    return "< 0.01%" if 0 < v < 1e-4 else pct(v, 3)


def _sup(k: int) -> str:
    return power_text(k)[1:]


def gradient_scale_table(result: ExperimentResult, *, which: str = "trained") -> HTML:
    """Per point of an :class:`~mpt_lab.experiments.lm_gradient_scale.LMGradientScaleResult`: V, N, log₂(V·N),
    log₂ of the median (2 decimals, as the comparisons and the figure give it) and the share FP16 loses at the first step and over the recorded steps, the loss
    (an HTML table); below it, each comparison of a shifted point with a measured one."""
    init, trained = _gradient_scale_points(result, "init"), _gradient_scale_points(result, which)
    rows = [
        [
            f"{a['vocab_size']:,}",
            f"{a['tokens']:,}",
            f"{a['log2_vn']:.1f}",
            f"{a['median_log2']:.2f}",
            f"{b['median_log2']:.2f}",
            _share(a["lost"]),
            _share(b["lost"]),
            f"{b['loss']:.2f}",
        ]
        for a, b in zip(init, trained)
    ]
    points = table_html(
        [
            "V (words)",
            "N (tokens per batch)",
            "log₂(V·N)",
            "log₂ median, first step",
            "log₂ median, trained",
            "lost in FP16, first step",
            "lost in FP16, trained",
            "loss, trained (nats per token)",
        ],
        rows,
    )
    comps = [
        [
            ("vocabulary" if c["axis"] == "V" else "batch") + f" × 2<sup>{c['k']}</sup>",
            f"{c['base'][0]:,} × {c['base'][1]:,} → {c['target'][0]:,} × {c['target'][1]:,}",
            f"{c['shifted_median']:.2f}",
            f"{c['measured_median']:.2f}",
            _share(c["shifted_lost"]),
            _share(c["measured_lost"]),
        ]
        for c in result.comparisons(which)
    ]
    if not comps:
        return points
    shifts = table_html(
        [
            "larger by",
            "V × N → V × N",
            "log₂ median, shifted",
            "log₂ median, measured",
            "lost in FP16, shifted",
            "lost in FP16, measured",
        ],
        comps,
    )
    return type(points)(points + shifts)


# ------------------------------------------------------------------------------- the gradient shift, drawn
def plot_gradient_shift(
    hist: Log2Histogram, k: int, scale: float = 128.0, *, label: str = "", title: str | None = None
) -> Figure:
    """A diagram of the gradient shift drawn from a measured histogram: the activation gradients as the model
    computes them (FP32), after the gradient shift 2⁻ᵏ, and after the loss scale S on top of it, each against
    FP16's ranges (normal, subnormal, rounded to zero).

    Parameters
    ----------
    hist : :class:`~mpt_lab.histogram.Log2Histogram` of FP32 activation gradients (e.g. a point of
        :class:`~mpt_lab.experiments.lm_gradient_scale.LMGradientScaleResult`)
    k : int ≥ 0, the gradient shift (every gradient × 2⁻ᵏ)
    scale : the loss scale S, a power of two ≥ 1 (every gradient × S, log₂ S binades up)
    label : what the histogram is (shown in the first panel's title)

    Returns
    -------
    Figure with three panels sharing x = log₂|activation gradient| (bin e: 2ᵉ ≤ |g| < 2ᵉ⁺¹) and y = share of the
    values (%); the bars FP16 rounds to zero (|x| ≤ 2⁻²⁵, Micikevicius et al. 2018 §3.2) are red, and each
    panel's title gives the share of the values and of their sum |g| that FP16 would lose
    (:func:`~mpt_lab.histogram.lost_share`, :func:`~mpt_lab.histogram.lost_mass`).

    Raises TypeError for a non-histogram, ValueError for a negative or non-int ``k`` or a ``scale`` that is not a
    power of two ≥ 1.
    """

    if not isinstance(hist, Log2Histogram):
        raise TypeError(f"hist must be a Log2Histogram, got {type(hist).__name__}")
    if not isinstance(k, (int, np.integer)) or isinstance(k, bool) or k < 0:
        raise ValueError(f"k must be an int ≥ 0, got {k!r}")
    if not (isinstance(scale, (int, float)) and scale >= 1 and np.frexp(float(scale))[0] == 0.5):
        raise ValueError(f"scale must be a power of two ≥ 1, got {scale!r}")
    up = int(round(np.log2(scale)))
    share = 100.0 * hist.counts / max(hist.total, 1)
    keep = share > 0
    if not keep.any():
        raise ValueError("hist has no non-zero finite values to draw")
    e = hist.exponents[keep]
    share = share[keep]
    stages = [
        (0, f"1. FP32: the gradients as the model computes them{' (' + label + ')' if label else ''}"),
        (
            -k,
            f"2. × 2⁻ᵏ, k = {k}: the gradient shift, every value k binades lower (in FP32 Adagrad cancels it exactly)",
        ),
        (
            up - k,
            f"3. then × S = {scale:g} = {power_text(up)}: the loss scale, {up} binades back up "
            "(the FP32 update divides by S again)",
        ),
    ]
    lo, hi = min(e.min() - k, -27) - 1, max(e.max() + up, -12) + 2
    fig = new_figure((11, 7.6))
    axes = fig.subplots(3, 1, sharex=True)
    fp16 = FORMAT_COLORS["FP16"]
    for ax, (move, head) in zip(axes, stages):
        ax.axvspan(lo, -25, color=fp16, alpha=0.10, lw=0)
        ax.axvspan(-25, -14, color="#ffbf00", alpha=0.12, lw=0)
        ax.axvspan(-14, hi, color="#2ca02c", alpha=0.07, lw=0)
        x = e + move
        lost = x <= -26  # bins with |x| < 2⁻²⁵: rounded to zero
        ax.bar(x[~lost], share[~lost], width=1.0, align="edge", color="#1f77b4", edgecolor="white", lw=0.3)
        ax.bar(x[lost], share[lost], width=1.0, align="edge", color=fp16, edgecolor="white", lw=0.3)
        ax.set_yscale("log")
        ax.set_ylim(max(share.min() / 3, 1e-4), share.max() * 4)
        ax.set_ylabel("share of\nvalues (%)")
        ax.grid(axis="y", alpha=0.3)
        shift = -move
        ax.set_title(
            f"{head}\nFP16 would round to zero {_share(lost_share(hist, shift))} of the values, "
            f"{_share(lost_mass(hist, shift))} of their sum |g|",
            fontsize="medium",
            loc="left",
        )
    axes[-1].set_xlim(lo, hi)
    axes[-1].set_xlabel("log₂|activation gradient|   (bin e: 2ᵉ ≤ |g| < 2ᵉ⁺¹)")
    handles = [
        Patch(color="#1f77b4", label="kept by FP16"),
        Patch(color=fp16, label="rounded to zero by FP16"),
        Patch(color=fp16, alpha=0.10, label="FP16: |x| ≤ 2⁻²⁵ → 0"),
        Patch(color="#ffbf00", alpha=0.25, label="FP16 subnormal: 2⁻²⁵ < |x| < 2⁻¹⁴"),
        Patch(color="#2ca02c", alpha=0.15, label="FP16 normal: ≥ 2⁻¹⁴"),
    ]
    fig.legend(handles=handles, loc="outside lower center", ncol=5, fontsize="small")
    fig.suptitle(title or "The gradient shift and the loss scale move the whole histogram: what FP16 keeps")
    return fig


def plot_sampled_softmax(
    sim: dict, *, ours_log2: float | None = None, ours_label: str = "", title: str | None = None
) -> Figure:
    """bigLSTM's sampled-logit gradients at initialisation, as simulated, against FP16's ranges.

    Parameters
    ----------
    sim : the dict of :func:`mpt_lab.experiments.biglstm.sampled_softmax_gradients` ("gradients", "median_log2",
        "lost", "lost_128")
    ours_log2 : log₂ of another model's logit gradient to mark (e.g. 1/(V·N) of the book's model), or None
    ours_label : what that line is

    Returns
    -------
    Figure; x = log₂|logit gradient| (bin e: 2ᵉ ≤ |g| < 2ᵉ⁺¹), y = share of the sampled-logit gradients (%);
    the bars FP16 rounds to zero (|g| < 2⁻²⁵) are red.

    Raises TypeError for a ``sim`` without "gradients".
    """
    if not isinstance(sim, dict) or "gradients" not in sim:
        raise TypeError("sim must be the dict of mpt_lab.experiments.biglstm.sampled_softmax_gradients()")
    h = log2_histogram(np.asarray(sim["gradients"], dtype=np.float64))
    keep = h.counts > 0
    e, share = h.exponents[keep], 100.0 * h.counts[keep] / max(h.total, 1)
    lo, hi = min(int(e.min()), -27) - 1, max(int(e.max()), -14) + 2
    fig = new_figure((9.5, 4.4))
    ax = fig.add_subplot()
    fp16 = FORMAT_COLORS["FP16"]
    ax.axvspan(lo, -25, color=fp16, alpha=0.10, lw=0)
    ax.axvspan(-25, -14, color="#ffbf00", alpha=0.12, lw=0)
    ax.axvspan(-14, hi, color="#2ca02c", alpha=0.07, lw=0)
    lost = e <= -26
    ax.bar(e[~lost], share[~lost], width=1.0, align="edge", color="#1f77b4", edgecolor="white", lw=0.3)
    ax.bar(e[lost], share[lost], width=1.0, align="edge", color=fp16, edgecolor="white", lw=0.3)
    lines = [ax.axvline(sim["median_log2"], color="k", ls="--", lw=1.5, label=f"median: 2^{sim['median_log2']:.1f}")]
    if ours_log2 is not None:
        lines.append(
            ax.axvline(ours_log2, color="#9467bd", ls=":", lw=2, label=ours_label or f"ours: 2^{ours_log2:.1f}")
        )
    ax.set_xlim(lo, hi)
    ax.set_ylim(0, share.max() * 1.25)
    ax.set_xlabel("log₂|logit gradient|   (bin e: 2ᵉ ≤ |g| < 2ᵉ⁺¹)")
    ax.set_ylabel("share of sampled-logit gradients (%)")
    ax.grid(axis="y", alpha=0.3)
    handles = [
        Patch(color="#1f77b4", label="kept by FP16"),
        Patch(color=fp16, label=f"rounded to zero by FP16 ({_share(sim['lost'])})"),
        Patch(color="#ffbf00", alpha=0.25, label="FP16 subnormal"),
        Patch(color="#2ca02c", alpha=0.15, label="FP16 normal"),
        *lines,
    ]
    fig.legend(handles=handles, loc="outside lower center", ncol=3, fontsize="small")
    c = sim.get("config", {})
    ax.set_title(
        title
        or (
            f"bigLSTM's sampled-logit gradients at its first step, simulated "
            f"({c.get('num_sampled', '?'):,} of {c.get('vocab_size', '?'):,} words sampled, "
            f"log-Q correction, loss ÷ {c.get('loss_divisor', '?')})"
        ),
        fontsize="medium",
    )
    return fig
