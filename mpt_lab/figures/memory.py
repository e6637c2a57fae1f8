"""Figures and tables of the memory chapter: recomputation (activation checkpointing) against lower precision.

Memory is shown in MiB (2²⁰ bytes) everywhere; a source that reports MB (10⁶ bytes) is quoted in MB and
converted beside it.
"""

from __future__ import annotations

from matplotlib.figure import Figure

from ..experiments.memory_tradeoffs import CIFAR10_RESNET50, RECOMPUTE_VS_PRECISION, MemoryTradeoffsResult
from ._base import HTML, mib, new_figure, table_html

__all__ = ["plot_tradeoffs", "tradeoff_table", "training_table", "breakdown_table"]


def plot_tradeoffs(result: MemoryTradeoffsResult, *, title: str | None = None) -> Figure:
    """Peak memory and step time per way of training (FP32, mixed precision, checkpointing, both).

    Parameters
    ----------
    result : :class:`~mpt_lab.experiments.memory_tradeoffs.MemoryTradeoffsResult`

    Returns
    -------
    Figure with two bar charts: peak memory of one step (MiB) and time per step (ms).
    """
    ways = getattr(result, "ways", None)
    if not isinstance(ways, dict) or not ways:
        raise TypeError("result must be a MemoryTradeoffsResult")
    names = list(ways)
    fig = new_figure((10, 3.8))
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
    fig.suptitle(
        title
        or f"Recomputation or lower precision: what each costs and saves ({result.device}, "
        f"mixed = {result.mixed_dtype})"
    )
    return fig


def tradeoff_table(result: MemoryTradeoffsResult) -> HTML:
    """Per way: peak memory, memory saved, step time and its overhead, the work of a step in FLOPs against
    FP32's (where the result has it), and whether the gradients are bit-identical to FP32's (else their relative
    difference and cosine); the usual qualitative verdict (:data:`RECOMPUTE_VS_PRECISION`) in the caption."""
    if not isinstance(result, MemoryTradeoffsResult):
        raise TypeError(f"result must be a MemoryTradeoffsResult, got {type(result).__name__}")

    def say(d):
        return ("lossless" if d["lossless"] else "lossy") + ", overhead " + d["overhead"]

    base = result.ways["fp32"]
    rows = []
    for way, w in result.ways.items():
        same = (
            "yes"
            if w["bit_identical"]
            else f"no: rel. diff. {w['grad_rel_diff']:.2g}, cos {w.get('grad_cosine', float('nan')):.3f}"
        )
        flops = (
            f"{w['step_flops'] / base['step_flops']:.2f}×" if w.get("step_flops") and base.get("step_flops") else "–"
        )
        name = way if way != "fp32" or result.baseline_label == "FP32" else f"fp32: {result.baseline_label}"
        rows.append(
            [
                name,
                mib(w["peak_bytes"]),
                f"{100 * w['memory_saved']:.0f}%",
                f"{1e3 * w['step_seconds']:.1f}",
                f"{100 * w['overhead']:+.0f}%",
                flops,
                same,
            ]
        )
    caption = (
        "The usual verdict: recomputation is "
        + say(RECOMPUTE_VS_PRECISION["recomputation"])
        + "; lower precision is "
        + say(RECOMPUTE_VS_PRECISION["lower precision"])
        + " (where 16-bit "
        "arithmetic is fast it even saves time). The time columns are measured on the machine that ran this table "
        "(median of interleaved rounds); whether lower precision saves time there depends on its 16-bit kernels."
    )
    return table_html(
        [
            "way",
            "peak MiB",
            "memory saved",
            "ms / step",
            "time overhead",
            "FLOPs / step vs FP32",
            "gradients = FP32's?",
        ],
        rows,
        caption=caption,
    )


def training_table(result: MemoryTradeoffsResult) -> HTML:
    """FP32 against mixed precision: test accuracy, time per epoch, checkpoint size (MiB; the mixed run's weights
    are FP32, as autocast keeps them, cast to the mixed dtype when saved) — beside the CIFAR-10 ResNet-50
    experiment's numbers (cited as reported: "MB", which may mean 10⁶ or 2²⁰ bytes)."""
    if not isinstance(result, MemoryTradeoffsResult):
        raise TypeError(f"result must be a MemoryTradeoffsResult, got {type(result).__name__}")
    t = result.training
    rows = []
    for k, label in (("fp32", result.baseline_label), ("mixed", f"mixed ({result.mixed_dtype})")):
        size = mib(t[k]["storage_bytes"], 3) + (
            f" (the FP32 weights cast to {result.mixed_dtype} at save)" if k == "mixed" else ""
        )
        rows.append(
            [
                f"this book: {label}, ResNet on digits ({result.device}, {result.profile} profile)",
                f"{100 * t[k]['accuracy']:.2f}%",
                f"{t[k]['epoch_seconds']:.3g}",
                size,
            ]
        )
    c = CIFAR10_RESNET50
    for k, label in (("fp32", "FP32"), ("mixed", "mixed")):
        mb = c[k]["storage_mb"]
        rows.append(
            [
                f"CIFAR-10 ResNet-50 ({c['device']}): {label}",
                f"{100 * c[k]['accuracy']:.2f}%",
                f"{c[k]['epoch_seconds']:.3g}",
                f"{mb:.0f} MB as reported (the source's unit)",
            ]
        )
    return table_html(["run", "test accuracy", "s / epoch", "checkpoint (ours in MiB)"], rows)


def breakdown_table(result: MemoryTradeoffsResult) -> HTML:
    """Where the memory of one training step goes, in FP32 and in mixed precision (MiB): weights, gradients,
    optimizer state and the tensors autograd saves for the backward pass."""
    if not isinstance(result, MemoryTradeoffsResult):
        raise TypeError(f"result must be a MemoryTradeoffsResult, got {type(result).__name__}")
    parts = (
        ("weights", "weights (FP32 in both: autocast casts per op)"),
        ("gradients", "gradients (FP32)"),
        ("optimizer_state", "optimizer state (SGD momentum, FP32)"),
        ("saved_for_backward", "saved for backward: activations (and autocast's weight copies)"),
    )
    b = result.breakdown
    rows = [
        [
            label,
            mib(b["fp32"][k], 3),
            mib(b["mixed"][k], 3),
            f"{b['mixed'][k] / b['fp32'][k]:.2f}" if b["fp32"][k] else "–",
        ]
        for k, label in parts
    ]
    total = {w: sum(b[w][k] for k, _ in parts) for w in ("fp32", "mixed")}
    rows.append(
        ["<b>total</b>", mib(total["fp32"], 3), mib(total["mixed"], 3), f"{total['mixed'] / total['fp32']:.2f}"]
    )
    return table_html(["part of one step", "FP32 (MiB)", f"mixed, {result.mixed_dtype} (MiB)", "mixed ÷ FP32"], rows)
