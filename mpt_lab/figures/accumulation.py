"""Figures and tables of the accumulation chapter (ch. 5): error against K, the stalled running sum, the
tensor-core accumulator model, reductions, low-precision weights, a GPU's products against the models, and the
kernels each of those products launched."""

from __future__ import annotations

import html
import re
from collections.abc import Sequence

import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import NullFormatter

from .. import accumulation as acc
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
    "kernels_table",
    "product_kernels",
    "split_k_model",
]

_ORDER_STYLE = {"sequential": "-", "pairwise": "--"}

#: One name per accumulator model in every figure of the chapter: the experiments' own keys (kept in their saved
#: results) → the name the figures show.  "14 bits per product, toward zero" keeps its key's name.
_MODEL_NAMES = {
    "DeepSeek-V3 model (14 bits, groups of 32)": "DeepSeek-V3 model (14 bits, groups of 32)",
    "… + FP32 promotion every 128": "DeepSeek-V3 model + FP32 promotion every 128",
    "model, 14-bit tensor core (DeepSeek-V3)": "model, DeepSeek-V3 model (14 bits, groups of 32)",
    "model, 14-bit + FP32 promotion every 128": "model, DeepSeek-V3 model + FP32 promotion every 128",
}

_SUPERSCRIPTS = str.maketrans("0123456789-", "⁰¹²³⁴⁵⁶⁷⁸⁹⁻")


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
                    f" K = 2{str(p - 3).translate(_SUPERSCRIPTS)}",
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
    # long handles, so that the legend shows sequential (solid) apart from pairwise (dashed)
    fig.legend(
        *axes[0].get_legend_handles_labels(), loc="outside lower center", ncol=3, fontsize="small", handlelength=4
    )
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
            ax.loglog(ks[keep], e[keep], "-o", ms=3, color=c, label=_MODEL_NAMES.get(name, name))
        _k_ticks(ax, ks)
        ax.set_xlabel("K, products per output")
        ax.set_title(f"{what} relative error over the outputs")
        ax.grid(alpha=0.3, which="both")
    # the report's figure is a maximum: it belongs on the panel of largest errors only
    axes[1].plot([4096], [0.02], "k*", ms=12, label="DeepSeek-V3: “maximum relative error of nearly 2%” at K = 4096")
    axes[0].set_ylabel("relative error |ĉ − c| / |c|")
    handles, labels = axes[1].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncol=2, fontsize="small")  # 3 columns overflow the width
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


def product_kernels(result: ExperimentResult) -> dict:
    """The kernels each device product of a tensor-core accumulation result launched, in launch order (repeats
    removed), without the profiler's range marker: :func:`mpt_lab.bench.profile_calls` opens a range named
    "fmt|run|K" around each product, and on a GPU that name comes back among the device events.

    Parameters
    ----------
    result : :class:`~mpt_lab.experiments.tensor_core_accumulation.TensorCoreResult` with ``kernels``:
        {"MxN": {"fp16" | "fp8": {device run: {"K": [kernel names]}}}} (K as str)

    Returns
    -------
    dict "MxN" (e.g. "64x64") → "fp16" | "fp8" → device run → K (int, products per output) → list of str kernel
    names (on a CPU, the ATen operators the product ran).

    Raises
    ------
    TypeError
        ``result`` has no ``ks`` or no ``kernels``.
    ValueError
        ``result.kernels`` is empty (results saved before 2026-11-27 have none).

    Source: the experiment ``tensor_core_accumulation`` (``torch.profiler``, :func:`mpt_lab.bench.profile_calls`).
    """
    _check(result, "ks", "kernels")
    if not isinstance(result.kernels, dict) or not result.kernels:
        raise ValueError(
            "result.kernels is empty: this result has no kernel names (results saved before 2026-11-27 have none); "
            "run tensor_core_accumulation again"
        )
    return {
        shape: {
            fmt: {
                run: {int(k): [n for n in names if n != f"{fmt}|{run}|{k}"] for k, names in by_k.items()}
                for run, by_k in by_run.items()
            }
            for fmt, by_run in by_fmt.items()
        }
        for shape, by_fmt in result.kernels.items()
    }


def _split_k(names) -> bool:
    """Whether any of the kernel names contains "splitK" (any case), as the GEMM kernel ("..._splitK_...") and the
    kernel after it ("cublasLt::splitKreduce_kernel") of the saved H200 run's split-K products do."""
    return any("splitk" in n.lower() for n in names)


def _kernel_label(name: str) -> str:
    """A kernel's name as the table shows it: without "void ", its template arguments and its parameter list,
    keeping any ``...Functor`` among the template arguments (it says what an elementwise kernel computes)."""
    name = name.removeprefix("void ").strip()
    lt = name.find("<")
    if lt < 0:
        paren = name.find("(")
        return name if paren <= 0 else name[:paren]
    functors = list(dict.fromkeys(re.findall(r"\w+Functor", name[lt:])))
    return name[:lt] + "<…>" + (f" ({', '.join(functors)})" if functors else "")


def _shape_text(shape: str) -> str:
    return shape.replace("x", " × ")


def plot_gpu_accumulation(result: ExperimentResult) -> Figure:
    """Median relative error against K of a GPU's FP16 and FP8 products beside the models' predictions: one
    panel per input format, the device runs (solid) and the models (dashed) at the config's m × n outputs, the
    device runs again at ``large`` m × n outputs where the result has them (dotted, squares, same colour), and a
    ring around every device point whose product launched a kernel named "splitK" (``kernels``).

    Parameters
    ----------
    result : :class:`~mpt_lab.experiments.tensor_core_accumulation.TensorCoreResult` (errors are relative,
        |ĉ − c| / |c|, medians over the outputs; K in products per output)

    Raises
    ------
    TypeError
        ``result`` is not a result with ``ks``, ``fp16`` and ``fp8``.
    """
    _check(result, "ks", "fp16", "fp8")
    ks = np.asarray(result.ks, dtype=float)
    large = getattr(result, "large", None) or {}
    kernels = product_kernels(result) if getattr(result, "kernels", None) else {}
    config = getattr(result, "config", None) or {}
    small = f"{config['m']}x{config['n']}" if "m" in config and "n" in config else ""
    big = f"{large['m']}x{large['n']}" if large else ""
    panels = [("fp16", "FP16 inputs: torch.matmul", result.fp16)] + (
        [("fp8", "FP8 E4M3 inputs: torch._scaled_mm", result.fp8)] if result.fp8 else []
    )
    fig = new_figure((12 if len(panels) == 2 else 6.5, 6.6 if large else 5.6))
    axes = np.atleast_1d(fig.subplots(1, len(panels), sharey=True))
    for ax, (fmt, title, runs) in zip(axes, panels):
        rings = []  # (K, error) of every device point whose product launched a kernel named splitK
        for i, (name, v) in enumerate(runs.items()):
            device = name.startswith("device")
            where = f", {_shape_text(small)}" if device and big and small else ""
            e = np.asarray(v["median"], dtype=float)
            keep = e > 0
            ax.loglog(
                ks[keep],
                e[keep],
                "-o" if device else "--",
                color=f"C{i}",
                ms=4 if device else 0,
                lw=2 if device else 1.4,
                label=_MODEL_NAMES.get(name, name) + where,
            )
            shapes = [(small, e)]
            if device and large.get(fmt, {}).get(name):
                el = np.asarray(large[fmt][name]["median"], dtype=float)
                kl = el > 0
                ax.loglog(ks[kl], el[kl], ":s", color=f"C{i}", ms=4, lw=2, label=f"{name}, {_shape_text(big)}")
                shapes.append((big, el))
            for shape, err in shapes if device and kernels else ():
                for j, k in enumerate(result.ks):
                    if _split_k(kernels.get(shape, {}).get(fmt, {}).get(name, {}).get(k, [])):
                        rings.append((ks[j], err[j]))
        if rings:
            x, y = np.asarray(rings).T
            ax.loglog(x, y, "o", ms=11, mfc="none", mec="black", mew=1.2, label="a kernel named splitK ran (profiler)")
        _k_ticks(ax, ks)
        ax.set_xlabel("K, products per output")
        ax.set_title(title)
        ax.grid(alpha=0.3, which="both")
        # each panel's own legend, below it: inside, it would cover the curves
        ax.legend(fontsize="x-small", loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=2)
    axes[0].set_ylabel("relative error, median over outputs")
    outputs = f"{_shape_text(small)} outputs" if small else "the outputs"
    also = f"; device runs also at {_shape_text(big)}" if big else ""
    fig.suptitle(
        f"Uniform [0, 1) matrices on {result.device_name}, {outputs}{also}:\n"
        "relative error against the exact product, device runs beside the accumulator models"
    )
    return fig


#: How the table names each format's product.
_PRODUCT_WORDS = {"fp16": "FP16, torch.matmul", "fp8": "FP8 E4M3, torch._scaled_mm"}


def kernels_table(result: ExperimentResult) -> HTML:
    """The kernels each device product of a tensor-core accumulation result launched, per input format, device
    run, output block m × n and K, as ``torch.profiler`` saw them (launch order, repeats removed, the profiler's
    own range marker left out); device runs whose kernels were the same at every K share a row, and so do
    consecutive K with the same kernels.  A column says whether a kernel's name contains "splitK" (any case).
    Names are shortened (no "void", template arguments or parameter list; an elementwise kernel's ``...Functor``
    kept), the full name in each name's tooltip.  On a CPU the "kernels" are the ATen operators the product ran.

    Parameters
    ----------
    result : :class:`~mpt_lab.experiments.tensor_core_accumulation.TensorCoreResult` with ``kernels``:
        {"MxN": {"fp16" | "fp8": {device run: {"K": [kernel names]}}}} (str names; K as str, the values of ``ks``)

    Returns
    -------
    HTML: the table (:func:`~mpt_lab.figures._base.table_html`).

    Raises
    ------
    TypeError
        ``result`` has no ``ks`` or no ``kernels``.
    ValueError
        ``result.kernels`` is empty (results saved before 2026-11-27 have none).

    Source: the experiment ``tensor_core_accumulation`` (:func:`mpt_lab.bench.profile_calls`).
    """
    kernels = product_kernels(result)
    ks = [int(k) for k in result.ks]
    rows = []
    for fmt, words in _PRODUCT_WORDS.items():
        for shape, by_fmt in kernels.items():
            by_run = by_fmt.get(fmt) or {}
            groups: dict = {}  # the kernels at every K → the device runs that launched them
            for run, by_k in by_run.items():
                seq = tuple(tuple(by_k.get(k, [])) for k in ks)
                groups.setdefault(seq, []).append(run)
            for seq, runs in groups.items():
                start = 0
                for i in range(1, len(ks) + 1):
                    if i < len(ks) and seq[i] == seq[start]:
                        continue
                    names = seq[start]
                    rows.append(
                        [
                            html.escape(words),
                            "<br>".join(html.escape(r.removeprefix("device, ")) for r in runs),
                            _shape_text(shape),
                            ", ".join(f"{k:,}" for k in ks[start:i]),
                            "<br>".join(
                                f'<code title="{html.escape(n)}">{html.escape(_kernel_label(n))}</code>' for n in names
                            )
                            or "–",
                            "yes" if _split_k(names) else "no",
                        ]
                    )
                    start = i
    return table_html(
        ["inputs, product", "device run", "outputs m × n", "K", "kernels launched, in order", "a name has splitK"],
        rows,
        caption=f"The kernels each product launched on {result.device_name}, as torch.profiler saw them (in "
        "launch order, repeats removed); names shortened, the full name on hover. A FillFunctor kernel writes a "
        "constant: the experiment makes the FP8 product's unit scales with torch.ones on the device",
        align=["left"] * 6,
    )


def split_fp16_agreement(k: int = 4096, parts: Sequence[int] = (2, 4), rows: int = 2000, seed: int = 0) -> dict:
    """How often a split of K changes an FP16 product's result: the share of outputs whose FP16 rounding is the same
    when the K products are summed in FP32 in one sequential pass and when K is cut into parts, each summed
    sequentially in FP32, and the parts' sums added in FP32 (then rounded to FP16, nearest even).

    The products are those of FP16 operands uniform in [0, 1) (``rows`` dot products of length ``k``, NumPy's
    ``default_rng(seed)``); a product of two FP16 values is exact in FP32 (22 significant bits ≤ 24), and
    ``numpy.cumsum`` in float32 adds sequentially, so each sum is the FP32 accumulation of its order exactly.  A
    CPU model: what split and reduction order a GPU library chose, it does not tell.

    Parameters
    ----------
    k : int ≥ 2, the dot products' length
    parts : sequence of int, numbers of equal parts (each ≥ 2 and dividing ``k``)
    rows : int ≥ 1, how many dot products
    seed : int

    Returns
    -------
    dict n → share (0 to 1) of the outputs whose FP16 result is the same with n parts as with one pass.

    Raises
    ------
    TypeError
        ``k``, ``rows``, ``seed`` or a number of parts is not an int.
    ValueError
        ``k`` < 2, ``rows`` < 1, or a number of parts is below 2 or does not divide ``k``.

    Source: IEEE 754 binary16/binary32 rounding to nearest even; the chapter's split-K discussion.
    """
    for name, v in (("k", k), ("rows", rows), ("seed", seed)):
        if not isinstance(v, int) or isinstance(v, bool):
            raise TypeError(f"{name} must be an int, got {type(v).__name__}")
    if k < 2 or rows < 1:
        raise ValueError(f"k must be ≥ 2 and rows ≥ 1, got k={k}, rows={rows}")
    parts = tuple(parts)
    for n in parts:
        if not isinstance(n, int) or isinstance(n, bool):
            raise TypeError(f"each number of parts must be an int, got {type(n).__name__}")
        if n < 2 or k % n:
            raise ValueError(f"each number of parts must be ≥ 2 and divide k = {k}, got {n}")
    rng = np.random.default_rng(seed)
    a = rng.random((rows, k), dtype=np.float32).astype(np.float16).astype(np.float32)
    b = rng.random((rows, k), dtype=np.float32).astype(np.float16).astype(np.float32)
    prod = a * b  # exact in float32
    whole = np.cumsum(prod, axis=1, dtype=np.float32)[:, -1].astype(np.float16)
    out = {}
    for n in parts:
        sums = np.cumsum(prod.reshape(rows, n, k // n), axis=2, dtype=np.float32)[:, :, -1]
        split = np.cumsum(sums, axis=1, dtype=np.float32)[:, -1].astype(np.float16)
        out[n] = float(np.mean(split == whole))
    return out


def split_k_model(result: ExperimentResult, parts: dict) -> dict:
    """What a split of K into parts would give the model "14 bits per product, toward zero", on the very operands
    of a saved ``tensor_core_accumulation`` run's FP8 products: each part of ⌈K / n⌉ consecutive products is
    accumulated as that model does (:data:`mpt_lab.accumulation.TENSOR_CORE_ACCUMULATOR`, 14 bits: 13 stored and
    the implicit one, every addition rounded toward zero), and the parts' sums are added in FP32, rounded to
    nearest even (:func:`mpt_lab.accumulation.matmul` with ``order="blocked"``).  A model of split-K, not a
    measurement: which split a library chose, and how it adds the parts, no saved result records.

    The operands are drawn again as the experiment drew them (``numpy.random.default_rng(config["seed"])``, for
    each K of ``config["ks"]`` in turn A [m, K] then B [K, n] uniform in [0, 1) as float32, rounded to E4M3), so
    that ``n = 1`` (one part) gives exactly the run's own "model, 14 bits per product, toward zero" median.

    Parameters
    ----------
    result : :class:`~mpt_lab.experiments.tensor_core_accumulation.TensorCoreResult` with FP8 rows (a GPU's run)
    parts : dict K (int, one of ``result.ks``) → sequence of int n ≥ 1, the numbers of parts to try (n ≤ K)

    Returns
    -------
    dict K → n → {"part_length": ⌈K / n⌉ (products), "median": median relative error |ĉ − c| / |c| over the
    m × n outputs (float), against the exact product of the E4M3 operands}.  Costs about a second per million
    products accumulated (m · n · K) on one CPU core.

    Raises
    ------
    TypeError
        ``result`` lacks ``ks``, ``fp8`` or ``config``; ``parts`` is not a dict; a number of parts is not an int.
    ValueError
        ``result`` has no FP8 rows (a run without FP8 tensor cores) or its config no ``seed``, ``ks``, ``m`` or
        ``n``; a K of ``parts`` is not one of ``result.ks``; a number of parts is below 1 or above K.

    Source: the experiment ``tensor_core_accumulation`` (its operands) and :mod:`mpt_lab.accumulation`.
    """
    _check(result, "ks", "fp8", "config")
    if not isinstance(parts, dict):
        raise TypeError(f"parts must be a dict K → numbers of parts, got {type(parts).__name__}")
    if not result.fp8:
        raise ValueError("result has no FP8 rows (fp8 is empty: a run without FP8 tensor cores); nothing to model")
    config = result.config or {}
    missing = [k for k in ("seed", "ks", "m", "n") if k not in config]
    if missing:
        raise ValueError(f"result.config lacks {', '.join(missing)}: the operands cannot be drawn again")
    for K, ns in parts.items():
        if K not in result.ks:
            raise ValueError(f"parts names K = {K!r}, which is not one of result.ks {result.ks}")
        for n in ns:
            if isinstance(n, bool) or not isinstance(n, (int, np.integer)):
                raise TypeError(f"parts[{K}] must hold ints (numbers of parts), got {n!r}")
            if not 1 <= n <= K:
                raise ValueError(f"parts[{K}] holds {n}: a number of parts must lie in [1, K = {K}]")
    rng = np.random.default_rng(config["seed"])
    out = {}
    for K in config["ks"]:  # every K's operands in turn, as the experiment drew them
        A = rng.uniform(0.0, 1.0, (config["m"], K)).astype(np.float32)
        B = rng.uniform(0.0, 1.0, (K, config["n"])).astype(np.float32)
        if K not in parts:
            continue
        A8, B8 = F.round_to(A, F.FP8_E4M3), F.round_to(B, F.FP8_E4M3)
        exact = A8.astype(np.float64) @ B8.astype(np.float64)
        out[K] = {}
        for n in parts[K]:
            length = -(-K // int(n))
            got = acc.matmul(
                A8,
                B8,
                accumulator=acc.TENSOR_CORE_ACCUMULATOR,
                products="FP32",
                rounding="toward_zero",
                order="blocked",
                block_size=length,
            )
            rel = np.abs(np.asarray(got, dtype=np.float64) - exact) / np.abs(exact)
            out[K][int(n)] = {"part_length": length, "median": float(np.median(rel))}
    return out
