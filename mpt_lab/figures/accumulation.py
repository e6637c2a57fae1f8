"""Figures and tables of the accumulation chapter (ch. 5): error against K, the stalled running sum, the
tensor-core accumulator model, reductions, low-precision weights, and a GPU's products against the models."""

from __future__ import annotations

import html

import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import NullFormatter

from .. import formats as F
from ..harness.runner import ExperimentResult
from ._base import FORMAT_COLORS, HTML, new_figure, table_html

__all__ = [
    "plot_error_vs_k",
    "plot_running_sum",
    "plot_tensor_core_model",
    "reductions_table",
    "weights_table",
    "plot_gpu_accumulation",
]

_ORDER_STYLE = {"sequential": "-", "pairwise": "--"}


def _check(result, *fields):
    missing = [f for f in fields if not hasattr(result, f)]
    if missing:
        raise TypeError(
            f"result must be an experiment result with {', '.join(fields)}; "
            f"{type(result).__name__} lacks {', '.join(missing)}"
        )


def plot_error_vs_k(result: ExperimentResult) -> Figure:
    """Median error of a dot product against K, per accumulator and order, log-log, in two panels: one-signed
    products (uniform [0, 1) values; the error relative to the sum, with K = 2ᵖ⁻³ marked for each format of
    precision p: about where chapter 5 measures its sequential error's slope rising from about ½ to about 1) and zero-mean products (uniform [-1, 1) values; the error relative to the sum's typical size
    √Σ(a_k b_k)²), each with the guide u·√K of each format.  The legend sits below the panels.

    Parameters
    ----------
    result : :class:`~mpt_lab.experiments.accumulation_error.AccumulationErrorResult`
    """
    _check(result, "ks", "error", "zero_mean", "unit_roundoff")
    fig = new_figure((12, 5.6))
    axes = fig.subplots(1, 2, sharey=True)
    ks = np.asarray(result.ks, dtype=float)
    panels = (
        (
            axes[0],
            result.error,
            "one-signed products: a, b uniform in [0, 1)",
            "relative error |ŝ − s| / |s| (median of trials)",
        ),
        (
            axes[1],
            result.zero_mean,
            "zero-mean products: a, b uniform in [−1, 1)",
            "error relative to the sum's size, |ŝ − s| / √Σ(a·b)² (median)",
        ),
    )
    for i, (ax, arms, title, ylabel) in enumerate(panels):
        for arm, stats in arms.items():
            fmt, order = arm.split(" ", 1)
            e = np.asarray(stats["median"], dtype=float)
            keep = e > 0
            ax.loglog(
                ks[keep],
                e[keep],
                _ORDER_STYLE.get(order, "-"),
                color=FORMAT_COLORS.get(fmt, "#333"),
                lw=1.8,
                marker="o",
                ms=3,
                label=f"{fmt} accumulator, {order}" if i == 0 else None,
            )
        for fmt, u in result.unit_roundoff.items():
            ax.loglog(
                ks,
                u * np.sqrt(ks),
                ":",
                color=FORMAT_COLORS.get(fmt, "#333"),
                lw=1,
                label=f"{fmt}: u·√K (u = 2⁻{F.get_format(fmt).precision})" if i == 0 else None,
            )
            p = F.get_format(fmt).precision
            if i == 0 and 2 ** (p - 3) <= ks.max():
                ax.axvline(2 ** (p - 3), color=FORMAT_COLORS.get(fmt, "#333"), lw=0.8, alpha=0.5)
                ax.text(
                    2 ** (p - 3),
                    0.98,
                    f" K = 2^{p - 3}",
                    color=FORMAT_COLORS.get(fmt, "#333"),
                    fontsize="small",
                    va="top",
                    transform=ax.get_xaxis_transform(),
                )
        ax.set_xlabel("K, products in the dot product")
        ax.set_ylabel(ylabel)
        ax.set_title(title)
        ax.grid(alpha=0.3, which="both")
        ax.yaxis.set_tick_params(labelleft=True)
    fig.suptitle("Dot products of K FP16 values, accumulated sequentially or pairwise: error against K")
    fig.legend(*axes[0].get_legend_handles_labels(), loc="outside lower center", ncol=3, fontsize="small")
    return fig


def plot_running_sum(result: ExperimentResult) -> Figure:
    """The FP16 running sum of one positive dot product beside the exact one, against K, and the value 2¹¹ where
    half an ulp of the sum exceeds every addend (all are below 1).

    Parameters
    ----------
    result : :class:`~mpt_lab.experiments.accumulation_error.AccumulationErrorResult`
    """
    _check(result, "running_ks", "running")
    fig = new_figure((9, 4))
    ax = fig.add_subplot()
    ks = np.asarray(result.running_ks)
    ax.loglog(ks, result.running["exact"], "k--", lw=1.2, label="exact sum")
    ax.loglog(ks, result.running["FP16"], color=FORMAT_COLORS["FP16"], lw=2, label="FP16 accumulator, sequential")
    ax.axhline(2**11, color="#888", lw=0.8)
    ax.text(
        ks[-1],
        2**11 * 1.15,
        "2¹¹ = 2048: half an ulp of the sum is 1, above every product ",
        va="bottom",
        ha="right",
        fontsize="small",
    )
    ax.set_xlabel("K, products added so far")
    ax.set_ylabel("running sum (dimensionless)")
    ax.set_title("Swamping in a dot product: the FP16 running sum stops at 2048")
    ax.legend(fontsize="small", loc="lower right")
    ax.grid(alpha=0.3, which="both")
    return fig


def _k_ticks(ax, ks) -> None:
    """The measured K as the x ticks, written out (no crowded minor labels on a short log axis)."""
    ax.set_xticks(ks)
    ax.set_xticklabels([f"{int(k):,}" for k in ks])
    ax.xaxis.set_minor_formatter(NullFormatter())


def plot_tensor_core_model(result: ExperimentResult) -> Figure:
    """Median and largest relative error of FP8 products against K under each accumulator model, with
    DeepSeek-V3's reported "nearly 2%" at K = 4096 marked.

    Parameters
    ----------
    result : :class:`~mpt_lab.experiments.accumulation_error.AccumulationErrorResult`
    """
    _check(result, "tensor_core")
    tc = result.tensor_core
    ks = np.asarray(tc["ks"], dtype=float)
    fig = new_figure((10, 5))
    axes = fig.subplots(1, 2, sharey=True)
    colors = ["#1f77b4", "#ff7f0e", "#d62728", "#2ca02c"]
    for ax, stat, what in ((axes[0], "median_relative", "median"), (axes[1], "max_relative", "largest")):
        for c, (name, m) in zip(colors, tc["models"].items()):
            e = np.asarray(m[stat], dtype=float)
            keep = e > 0
            ax.loglog(ks[keep], e[keep], "-o", ms=3, color=c, label=name)
        _k_ticks(ax, ks)
        ax.set_xlabel("K, products per output")
        ax.set_title(f"{what} relative error over the outputs")
        ax.grid(alpha=0.3, which="both")
    # the report's figure is a maximum: it belongs on the panel of largest errors only
    axes[1].plot([4096], [0.02], "k*", ms=12, label="DeepSeek-V3: “maximum relative error of nearly 2%” at K = 4096")
    axes[0].set_ylabel("relative error |ĉ − c| / |c|")
    handles, labels = axes[1].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncol=3, fontsize="small")
    fig.suptitle("FP8 E4M3 products of uniform [0, 1) values: accumulator models against K")
    return fig


def reductions_table(result: ExperimentResult) -> HTML:
    """Each reduction computed with an FP16 accumulator (sequential, pairwise) and an FP32 one: the value of
    the first draw with its relative error, the largest relative error over all the draws, and the dtype CUDA
    float16 autocast gives, from float16 inputs, the library op that performs it and the same reduction
    written by hand.

    Parameters
    ----------
    result : :class:`~mpt_lab.experiments.accumulation_error.AccumulationErrorResult`
    """
    _check(result, "reductions", "autocast")
    arms = ("FP32", "FP16 sequential", "FP16 pairwise")

    def err_text(e):
        return "inf (overflow)" if not np.isfinite(e) else f"{100 * e:.2g}%"

    def value_text(v):
        return "inf (overflow)" if not np.isfinite(v) else f"{v:.6g}"

    rows = []
    for name, r in result.reductions.items():
        cells = [html.escape(f"{name} ({r['size']:,} values)"), f"{r['exact']:.6g}"]
        for a in arms:
            first = f"error {err_text(r['first_errors'][a])}; " if np.isfinite(r[a]) else ""
            cells.append(
                f"{value_text(r[a])}<br><small>{first}largest error over the "
                f"{r['rows']} draws {err_text(r['errors'][a])}</small>"
            )
        ops = result.autocast.get(name, {})
        cells.append("<br>".join(f"<code>{html.escape(op)}</code>: {html.escape(dt)}" for op, dt in ops.items()) or "–")
        rows.append(cells)
    return table_html(
        [
            "reduction",
            "exact (first draw)",
            "FP32 accumulator",
            "FP16 accumulator, sequential",
            "FP16 accumulator, pairwise",
            "CUDA FP16 autocast, from FP16 inputs",
        ],
        rows,
        caption="A reduction's sum in an FP16 accumulator against FP32: the value of the first draw "
        "and its relative error, and the largest relative error over all the draws, "
        "against the exact value computed in float64 from the FP16 inputs (for the "
        "log-sum-exp, from the exponentials before their FP16 rounding); the "
        "last column names the library op and the hand-written one (mpt_lab.autocast.OPS)",
    )


def weights_table(result: ExperimentResult) -> HTML:
    """Training loss at the end and test loss and accuracy per weight-storage arm (the BF16-weight comparison).

    Parameters
    ----------
    result : :class:`~mpt_lab.experiments.accumulation_training.AccumulationTrainingResult`
    """
    _check(result, "weights")
    rows = [
        [html.escape(arm), f"{result.final('weights', arm):.4f}", f"{t['loss']:.4f}", f"{100 * t['accuracy']:.1f}%"]
        for arm, t in result.weights["test"].items()
    ]
    return table_html(
        ["weights kept as", "training loss, last 20 steps (nats)", "test loss (nats)", "test accuracy"], rows
    )


def plot_gpu_accumulation(result: ExperimentResult) -> Figure:
    """Median relative error against K of a GPU's FP16 and FP8 products beside the models' predictions.

    Parameters
    ----------
    result : :class:`~mpt_lab.experiments.tensor_core_accumulation.TensorCoreResult`
    """
    _check(result, "ks", "fp16", "fp8")
    ks = np.asarray(result.ks, dtype=float)
    panels = [("FP16 inputs: torch.matmul", result.fp16)] + (
        [("FP8 E4M3 inputs: torch._scaled_mm", result.fp8)] if result.fp8 else []
    )
    fig = new_figure((11 if len(panels) == 2 else 6, 5.6))
    axes = np.atleast_1d(fig.subplots(1, len(panels), sharey=True))
    for ax, (title, runs) in zip(axes, panels):
        for name, v in runs.items():
            e = np.asarray(v["median"], dtype=float)
            keep = e > 0
            device = name.startswith("device")
            ax.loglog(
                ks[keep], e[keep], "-o" if device else "--", ms=4 if device else 0, lw=2 if device else 1.4, label=name
            )
        _k_ticks(ax, ks)
        ax.set_xlabel("K, products per output")
        ax.set_title(title)
        ax.grid(alpha=0.3, which="both")
        # each panel's own legend, below it: inside, it would cover the curves
        ax.legend(fontsize="x-small", loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=2)
    axes[0].set_ylabel("relative error, median over outputs")
    fig.suptitle(f"Uniform [0, 1) matrices on {result.device_name}: measured against each accumulator model")
    return fig
