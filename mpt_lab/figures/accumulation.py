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

__all__ = ["plot_error_vs_k", "plot_running_sum", "plot_tensor_core_model", "reductions_table",
           "weights_table", "plot_gpu_accumulation"]

_ORDER_STYLE = {"sequential": "-", "pairwise": "--"}


def _check(result, *fields):
    missing = [f for f in fields if not hasattr(result, f)]
    if missing:
        raise TypeError(f"result must be an experiment result with {', '.join(fields)}; "
                        f"{type(result).__name__} lacks {', '.join(missing)}")


def plot_error_vs_k(result: ExperimentResult) -> Figure:
    """Median relative error of a dot product against K, per accumulator and order, log-log, with the √K
    guide u·√K of each format and its swamping point K = 2ᵖ marked.

    Parameters
    ----------
    result : :class:`~mpt_lab.experiments.accumulation_error.AccumulationErrorResult`
    """
    _check(result, "ks", "error", "unit_roundoff")
    fig = new_figure((9, 5))
    ax = fig.add_subplot()
    ks = np.asarray(result.ks, dtype=float)
    for arm, stats in result.error.items():
        fmt, order = arm.split(" ", 1)
        e = np.asarray(stats["median"], dtype=float)
        keep = e > 0
        ax.loglog(ks[keep], e[keep], _ORDER_STYLE.get(order, "-"), color=FORMAT_COLORS.get(fmt, "#333"), lw=1.8,
                  marker="o", ms=3, label=f"{fmt} accumulator, {order}")
    for fmt, u in result.unit_roundoff.items():
        ax.loglog(ks, u * np.sqrt(ks), ":", color=FORMAT_COLORS.get(fmt, "#333"), lw=1,
                  label=f"{fmt}: u·√K (u = 2⁻{F.get_format(fmt).precision})")
        p = F.get_format(fmt).precision
        if 2 ** p <= ks.max():
            ax.axvline(2 ** p, color=FORMAT_COLORS.get(fmt, "#333"), lw=0.8, alpha=0.5)
            ax.text(2 ** p, 0.98, f" K = 2^{p}", color=FORMAT_COLORS.get(fmt, "#333"), fontsize="small", va="top",
                    transform=ax.get_xaxis_transform())
    ax.set_xlabel("K, products in the dot product")
    ax.set_ylabel("relative error of the dot product (median of trials)")
    ax.set_title("Dot products of K uniform [0, 1) FP16 values: error against K")
    ax.legend(fontsize="x-small", ncol=2)
    ax.grid(alpha=0.3, which="both")
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
    ax.axhline(2 ** 11, color="#888", lw=0.8)
    ax.text(ks[-1], 2 ** 11 * 1.15, "2¹¹ = 2048: half an ulp of the sum is 1, above every product ", va="bottom",
            ha="right", fontsize="small")
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
    fig = new_figure((10, 4.2))
    axes = fig.subplots(1, 2, sharey=True)
    colors = ["#1f77b4", "#ff7f0e", "#d62728", "#2ca02c"]
    for ax, stat, what in ((axes[0], "median_relative", "median"), (axes[1], "max_relative", "largest")):
        for c, (name, m) in zip(colors, tc["models"].items()):
            e = np.asarray(m[stat], dtype=float)
            keep = e > 0
            ax.loglog(ks[keep], e[keep], "-o", ms=3, color=c, label=name)
        ax.plot([4096], [0.02], "k*", ms=12, label="DeepSeek-V3: “nearly 2%” at K = 4096")
        _k_ticks(ax, ks)
        ax.set_xlabel("K, products per output")
        ax.set_title(f"{what} relative error over the outputs")
        ax.grid(alpha=0.3, which="both")
    axes[0].set_ylabel("relative error |ĉ − c| / |c|")
    axes[1].legend(fontsize="x-small")
    fig.suptitle("FP8 E4M3 products of uniform [0, 1) values: accumulator models against K")
    return fig


def reductions_table(result: ExperimentResult) -> HTML:
    """Each reduction computed with an FP16 accumulator (sequential, pairwise) and an FP32 one: the value of
    the first draw, the largest relative error over the draws, and the dtype CUDA float16 autocast gives the
    matching op.

    Parameters
    ----------
    result : :class:`~mpt_lab.experiments.accumulation_error.AccumulationErrorResult`
    """
    _check(result, "reductions", "autocast")
    arms = ("FP32", "FP16 sequential", "FP16 pairwise")
    rows = []
    for name, r in result.reductions.items():
        cells = [html.escape(f"{name} ({r['size']:,} values)"), f"{r['exact']:.6g}"]
        for a in arms:
            err = r["errors"][a]
            e = "overflow (inf)" if not np.isfinite(err) else f"{100 * err:.2g}%"
            cells.append(f"{r[a]:.6g}<br><small>error {e}</small>")
        cells.append(html.escape(result.autocast.get(name, "–")))
        rows.append(cells)
    return table_html(["reduction", "exact", "FP32 accumulator", "FP16 accumulator, sequential",
                       "FP16 accumulator, pairwise", "autocast (CUDA, FP16) runs it in"], rows,
                      caption="A reduction's sum in an FP16 accumulator against FP32 (first draw; largest error "
                              "over the draws)")


def weights_table(result: ExperimentResult) -> HTML:
    """Training loss at the end and test loss and accuracy per weight-storage arm (the BF16-weight comparison).

    Parameters
    ----------
    result : :class:`~mpt_lab.experiments.accumulation_training.AccumulationTrainingResult`
    """
    _check(result, "weights")
    rows = [[html.escape(arm), f"{result.final('weights', arm):.4f}", f"{t['loss']:.4f}", f"{100 * t['accuracy']:.1f}%"]
            for arm, t in result.weights["test"].items()]
    return table_html(["weights kept as", "training loss, last 20 steps (nats)", "test loss (nats)",
                       "test accuracy"], rows)


def plot_gpu_accumulation(result: ExperimentResult) -> Figure:
    """Median relative error against K of a GPU's FP16 and FP8 products beside the models' predictions.

    Parameters
    ----------
    result : :class:`~mpt_lab.experiments.tensor_core_accumulation.TensorCoreResult`
    """
    _check(result, "ks", "fp16", "fp8")
    ks = np.asarray(result.ks, dtype=float)
    panels = [("FP16 inputs: torch.matmul", result.fp16)] + ([("FP8 E4M3 inputs: torch._scaled_mm", result.fp8)]
                                                              if result.fp8 else [])
    fig = new_figure((10 if len(panels) == 2 else 6, 4.4))
    axes = np.atleast_1d(fig.subplots(1, len(panels), sharey=True))
    for ax, (title, runs) in zip(axes, panels):
        for name, v in runs.items():
            e = np.asarray(v["median"], dtype=float)
            keep = e > 0
            device = name.startswith("device")
            ax.loglog(ks[keep], e[keep], "-o" if device else "--", ms=4 if device else 0, lw=2 if device else 1.4,
                      label=name)
        _k_ticks(ax, ks)
        ax.set_xlabel("K, products per output")
        ax.set_title(title)
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize="x-small")
    axes[0].set_ylabel("relative error, median over outputs")
    fig.suptitle(f"Uniform [0, 1) matrices on {result.device_name}: measured against each accumulator model")
    return fig
