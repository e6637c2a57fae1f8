"""Figures and tables of mixed precision training in practice: master weights, the PyTorch AMP recipe's speed,
a GPU's roofline beside the recipe's step, and autocast's op policy.

Micikevicius et al. (ICLR 2018), §3.1 (FP32 master weights); Carilli, "Automatic Mixed Precision" (PyTorch
recipe); Williams, Waterman and Patterson, "Roofline: an insightful visual performance model for multicore
architectures" (CACM 52(4), 2009); the ``torch.amp`` autocast op reference.
"""

from __future__ import annotations

import html

import numpy as np
import torch
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch, Patch

from ..bench import READBACK_OP, count_ops, datasheet_peaks
from ..experiments.amp_recipe import (
    COUNTED_FLOPS,
    AmpRecipeResult,
    counted_flops_per_step,
    flops_per_step,
    make_model,
    train_step,
)
from ..harness.runner import ExperimentResult
from ._base import FORMAT_COLORS, HTML, mib, new_figure, running_mean, table_html

__all__ = [
    "plot_losses",
    "plot_master_weight_loop",
    "speedup_table",
    "step_weight_traffic",
    "count_step_ops",
    "eager_step_summary",
    "DATASHEET_CLOCK_MHZ",
    "roofline_summary",
    "roofline_table",
    "plot_roofline",
    "autocast_table",
    "autocast_lists_table",
]

_STYLES = ["-", "--", ":", "-."]


def plot_losses(
    result: ExperimentResult | dict, *, smooth: int = 50, title: str | None = None, reference: str | None = None
) -> Figure:
    """Running means of the loss curves of a run with several arms, against step (one line per arm).

    The first arm is drawn as a wide, pale band and the others as thinner lines on top of it (dotted ones with
    markers), so a curve that coincides with the first one stays visible.

    Parameters
    ----------
    result : a result with ``losses``: dict label → per-step losses (e.g.
        :class:`~mpt_lab.experiments.master_weights_stall.StallResult`), or such a dict itself
    smooth : window of the running mean (steps)
    reference : optional label of one arm: a second panel below shows every other arm's running mean minus the
        reference's (nats), where curves that overlap above separate

    Raises
    ------
    TypeError
        ``result`` has no non-empty dict of losses.
    ValueError
        ``reference`` is not one of its labels.
    """
    losses = result if isinstance(result, dict) else getattr(result, "losses", None)
    if not isinstance(losses, dict) or not losses:
        raise TypeError("result must have a non-empty dict of label → per-step losses")
    if reference is not None and reference not in losses:
        raise ValueError(f"reference must be one of {list(losses)}, got {reference!r}")
    fig = new_figure((9, 6.2) if reference is not None else (9, 4))
    if reference is not None:
        ax, dx = fig.subplots(2, 1, sharex=True, height_ratios=[2.2, 1])
    else:
        ax, dx = fig.add_subplot(), None
    curves = {label: running_mean(v, smooth) for label, v in losses.items()}
    for i, (label, (x, mean)) in enumerate(curves.items()):
        style = dict(ls=_STYLES[i % 4], color=f"C{i}", label=label)
        if i == 0:
            style.update(lw=5, alpha=0.35, solid_capstyle="butt")
        else:
            style.update(lw=1.8, zorder=3 + i)
            if _STYLES[i % 4] == ":":
                style.update(lw=2.2, marker="o", ms=3.5, markevery=max(1, len(x) // 25))
        ax.plot(x, mean, **style)
        if dx is not None and label != reference:
            xr, ref = curves[reference]
            n = min(len(ref), len(mean))
            dx.plot(x[:n], mean[:n] - ref[:n], **{k: v for k, v in style.items() if k != "label"})
    if dx is not None:
        dx.axhline(0, color=f"C{list(curves).index(reference)}", lw=5, alpha=0.35)
        dx.set_xlabel("step")
        dx.set_ylabel(f"minus {reference} (nats)")
        dx.set_title(f"Difference from {reference}", fontsize="medium")
        dx.grid(alpha=0.3)
        ax.tick_params(axis="x", labelbottom=False)
    ax.set_xlabel("" if dx is not None else "step")
    ax.set_ylabel(f"training loss, nats (running mean of {smooth} steps)")
    ax.set_title(title or "Training loss")
    ax.legend(fontsize="small")
    ax.grid(alpha=0.3)
    return fig


#: The boxes of the master-weight loop: (trace step, index of the record within the step, label, x, y).
_LOOP_BOXES = [
    (1, 0, "master weights", 0.0, 1.0),
    (1, 1, "weight copy", 1.0, 1.0),
    (2, 0, "prediction", 2.0, 1.0),
    (3, 0, "prediction", 3.0, 1.0),
    (4, 0, "loss × S", 4.0, 1.0),
    (6, 0, "gradients × S", 2.0, 0.0),
    (7, 0, "gradients ÷ S", 1.0, 0.0),
    (8, 0, "masters, updated", 0.0, 0.0),
]
#: The arrows between them: (from box, to box, operation).
_LOOP_ARROWS = [
    (0, 1, "(1) round to\nnearest even"),
    (1, 2, "(2) forward"),
    (2, 3, "(3) cast"),
    (3, 4, "(4) loss, × S"),
    (4, 5, "(5), (6) backward from the\nscaled loss; it enters {half}\nat the cast of (3)"),
    (5, 6, "(7) cast, ÷ S,\ninf/NaN check"),
    (6, 7, "(8) optimizer step\n(skipped on inf/NaN)"),
    (7, 0, "next\niteration"),
]


def plot_master_weight_loop(trace: dict, *, title: str | None = None) -> Figure:
    """The master-weight loop as a diagram: each tensor of one iteration as a box coloured by its dtype.

    The dtypes are read from a recorded iteration, not typed: ``trace`` is
    :attr:`mpt_lab.master_weights.MasterWeightTrainer.last_trace` of a trainer made with ``trace=True`` (a list
    of records ``{"step", "name", "dtype", ...}``, steps (1)–(8) of :mod:`mpt_lab.master_weights`).  The top row
    is the forward pass (left to right), the bottom row the backward pass and the update (right to left); step
    (5) is drawn as the trace recorded it: the scaled loss kept in FP32 (as frameworks run it) or cast to the
    half dtype (the naive variant, marked in the box).

    Returns
    -------
    Figure; the axes carry no data coordinates (a diagram): the x label names what the colours mean.

    Raises
    ------
    TypeError
        ``trace`` is not a list of trace records.
    ValueError
        A step of the loop is missing from ``trace``.
    """
    if not isinstance(trace, (list, tuple)) or not all(
        isinstance(r, dict) and "step" in r and "dtype" in r for r in trace
    ):
        raise TypeError(
            "trace must be MasterWeightTrainer.last_trace: a list of records with 'step' and 'dtype' "
            "(make the trainer with trace=True and call train_step once)"
        )
    by_step: dict = {}
    for r in trace:
        by_step.setdefault(r["step"], []).append(r)
    missing = sorted({1, 2, 3, 4, 5, 6, 7, 8} - set(by_step))
    if missing:
        raise ValueError(f"trace lacks steps {missing} of the loop")
    half = next(r["dtype"] for r in by_step[1][1:2])
    half_name = {"float16": "FP16", "bfloat16": "BF16"}.get(half, half)
    colors = {"float32": FORMAT_COLORS["FP32"], "float16": FORMAT_COLORS["FP16"], "bfloat16": FORMAT_COLORS["BF16"]}
    step5 = by_step[5][0]

    fig = new_figure((9, 4.9))
    ax = fig.add_subplot()
    w, h = 0.9, 0.46
    centers = []
    for step, idx, label, x, y in _LOOP_BOXES:
        r = by_step[step][idx]
        c = colors.get(r["dtype"], "0.5")
        ax.add_patch(
            FancyBboxPatch(
                (x - w / 2, y - h / 2),
                w,
                h,
                boxstyle="round,pad=0.02,rounding_size=0.05",
                facecolor=c,
                alpha=0.22,
                edgecolor=c,
                lw=2,
            )
        )
        ax.text(x, y + 0.09, label, ha="center", va="center", fontsize=10, weight="bold")
        ax.text(x, y - 0.11, r["dtype"], ha="center", va="center", fontsize=10, family="monospace")
        centers.append((x, y))
    # step (5): the scaled loss as the trace recorded it, beside the loss box
    c5 = colors.get(step5["dtype"], "0.5")
    naive = step5["dtype"] != "float32"
    ax.add_patch(
        FancyBboxPatch(
            (4.0 - w / 2, 0.0 - h / 2),
            w,
            h,
            boxstyle="round,pad=0.02,rounding_size=0.05",
            facecolor=c5,
            alpha=0.22,
            edgecolor=c5,
            lw=2,
            ls="--" if naive else "-",
        )
    )
    ax.text(
        4.0, 0.09, "scaled loss, cast" if naive else "scaled loss", ha="center", va="center", fontsize=10, weight="bold"
    )
    ax.text(
        4.0,
        -0.11,
        step5["dtype"] + (" (naive)" if naive else ""),
        ha="center",
        va="center",
        fontsize=10,
        family="monospace",
    )
    arrows = [(a, b, t.format(half=half_name)) for a, b, t in _LOOP_ARROWS]
    for a, b, text in arrows:
        (x0, y0), (x1, y1) = centers[a], centers[b]
        if a == 4 and b == 5:  # down from the loss to step 5, then left to the half-precision gradients
            ax.add_patch(
                FancyArrowPatch(
                    (4.0, 1.0 - h / 2), (4.0, h / 2), arrowstyle="-|>", mutation_scale=14, lw=1.4, color="0.2"
                )
            )
            ax.add_patch(
                FancyArrowPatch(
                    (4.0 - w / 2, 0.0), (x1 + w / 2, y1), arrowstyle="-|>", mutation_scale=14, lw=1.4, color="0.2"
                )
            )
            ax.text(3.0, 0.06, text, ha="center", va="bottom", fontsize=9)
            continue
        if y0 == y1:
            start, end = (x0 + np.sign(x1 - x0) * w / 2, y0), (x1 - np.sign(x1 - x0) * w / 2, y1)
            ax.add_patch(FancyArrowPatch(start, end, arrowstyle="-|>", mutation_scale=14, lw=1.4, color="0.2"))
            ax.text(
                (x0 + x1) / 2,
                y0 + (0.26 if y0 > 0.5 else -0.26),
                text,
                ha="center",
                va="bottom" if y0 > 0.5 else "top",
                fontsize=9,
            )
        else:  # the vertical arrow back to the masters
            ax.add_patch(
                FancyArrowPatch(
                    (x0, y0 + h / 2),
                    (x1, y1 - h / 2),
                    arrowstyle="-|>",
                    mutation_scale=14,
                    lw=1.4,
                    color="0.2",
                    ls="--",
                )
            )
            ax.text(x0 + 0.06, 0.5, text, ha="left", va="center", fontsize=9)
    ax.set_xlim(-0.5, 4.5)
    ax.set_ylim(-0.62, 1.62)
    ax.set_xticks([])
    ax.set_yticks([])
    for side in ax.spines.values():
        side.set_visible(False)
    ax.text(-0.45, 1.5, "forward →", fontsize=9, style="italic", color="0.35")
    ax.text(-0.45, -0.56, "← backward and update", fontsize=9, style="italic", color="0.35")
    ax.set_xlabel("box colour: the tensor's dtype, as one train_step recorded it; (n): step n of the loop")
    article = "an" if half_name == "FP16" else "a"
    ax.set_title(
        title or f"One iteration with FP32 master weights and {article} {half_name} copy:\nthe dtype of every tensor"
    )
    handles = [
        Patch(facecolor=colors[d], alpha=0.35, edgecolor=colors[d], label=d) for d in ("float32", half) if d in colors
    ]
    ax.legend(handles=handles, loc="upper right", fontsize="small", title="dtype", ncol=2)
    return fig


def _fp32_kind(result: AmpRecipeResult) -> str:
    """The GEMM arithmetic of the recipe's FP32 products: "tf32" where the run let float32 products use TF32
    (its provenance's backend flags, or, in results saved without them, its note), "fp32" otherwise."""
    flags = result.provenance.get("backends") or {}
    if "cuda_matmul_allow_tf32" in flags:
        return "tf32" if flags["cuda_matmul_allow_tf32"] else "fp32"
    return "tf32" if "TF32 allowed = True" in (result.note or "") else "fp32"


def _step_rates(result: AmpRecipeResult) -> tuple[list, bool]:
    """Each eager row's counted TFLOP/s and its two fractions of peak, and whether they were recounted.

    A result saved with the 6·B·W²-per-Linear convention (:func:`~mpt_lab.experiments.amp_recipe.flops_per_step`)
    is recounted from its step times with :func:`~mpt_lab.experiments.amp_recipe.counted_flops_per_step`; the
    datasheet is the result's own, or, for a result saved without one, :func:`mpt_lab.bench.datasheet_peaks` of
    its device.  Returns ([(row, tflops, fraction_of_peak, fraction_of_datasheet or None)], recounted)."""
    c = result.config
    recount = result.flops_convention != COUNTED_FLOPS
    sheet = result.datasheet or datasheet_peaks(str(result.provenance.get("device", "")))
    keys = {"float32": _fp32_kind(result), "float16": "fp16", "bfloat16": "bf16"}
    counted: dict = {}
    out = []
    for row in result.rows:
        tflops, frac = row["tflops"], row["fraction_of_peak"]
        if recount:
            b = row["batch"]
            if b not in counted:
                counted[b] = counted_flops_per_step(b, c["width"], c["num_layers"])
            step = row.get("step_seconds") or row["epoch_seconds"] / c["num_batches"]
            tflops = counted[b] / step / 1e12
            frac = tflops / result.matmul_tflops[row["dtype"]]
        key = keys.get(row["dtype"])
        of_sheet = tflops / sheet[key] if sheet and key in sheet else None
        out.append((row, tflops, frac, of_sheet))
    return out, recount


def speedup_table(results: AmpRecipeResult | dict[str, AmpRecipeResult]) -> HTML:
    """Seconds per epoch, speed-up over FP32, and the step's rate per precision and batch size: one table per
    result, its caption naming the run (label, device, profile) and how its FLOPs are counted.

    The rate is the step's: the FLOPs of one training step counted from the operators that run
    (:data:`~mpt_lab.experiments.amp_recipe.COUNTED_FLOPS`, (6L − 2)·B·W² for L layers) ÷ the time of a step, as a
    share of the measured matrix-product peak of its dtype (saved with the run) and, on a GPU of
    :data:`mpt_lab.bench.DATASHEET`, of the datasheet's dense peak.  A result saved with the older convention
    (6·B·W² per Linear, which counts the first layer's input gradient that autograd never computes) is recounted
    from its step times, and its caption says so.

    Parameters
    ----------
    results : dict label → :class:`~mpt_lab.experiments.amp_recipe.AmpRecipeResult`, or one such result
        (labelled "saved run", as :func:`mpt_lab.figures.show_saved` passes it)

    Raises
    ------
    TypeError
        ``results`` is neither such a result nor a non-empty dict of them.
    """
    if isinstance(results, AmpRecipeResult):
        results = {"saved run": results}
    if (
        not isinstance(results, dict)
        or not results
        or not all(isinstance(r, AmpRecipeResult) for r in results.values())
    ):
        raise TypeError("results must be an AmpRecipeResult or a non-empty dict of label → AmpRecipeResult")
    tables = []
    for label, r in results.items():
        rates, recount = _step_rates(r)
        sheet = any(s is not None for *_, s in rates)
        rows = []
        for row, tflops, frac, of_sheet in rates:
            sp = r.speedup.get(row["recipe"], {}).get(str(row["batch"]), 1.0)
            rows.append(
                [
                    row["recipe"],
                    row["batch"],
                    f"{row['epoch_seconds']:.4g}",
                    f"{sp:.2f}×",
                    f"{tflops * 1e3:.3g}",
                    f"{100 * frac:.0f}%",
                ]
                + ([f"{100 * of_sheet:.0f}%" if of_sheet is not None else "–"] if sheet else [])
                + [mib(row["peak_bytes"], 1)]
            )
        c = r.config
        flops = f"FLOPs {COUNTED_FLOPS}"
        if recount:
            b, w, n = c["batch_sizes"][0], c["width"], c["num_layers"]
            extra = flops_per_step(b, w, n) / counted_flops_per_step(b, w, n) - 1
            flops += (
                f"; recounted from the saved step times (the result was saved with {r.flops_convention}, "
                f"{extra:.1%} more at {n} layers)"
            )
        caption = (
            f"{label}: {r.device}, {r.profile} profile, {c['num_layers']} × Linear({c['width']}, {c['width']}); {flops}"
        )
        tables.append(
            table_html(
                ["precision", "batch", "s / epoch", "speed-up vs FP32", "step GFLOP/s", "of measured matmul peak"]
                + (["of datasheet dense peak"] if sheet else [])
                + ["peak MiB"],
                rows,
                caption=caption,
            )
        )
    return type(tables[0])("".join(tables))


#: The roofline's arithmetic (``benchmarks/roofline.py``, :data:`mpt_lab.bench.GEMM_KINDS`): label, colour and
#: line style of its roof.
_ROOF_KINDS = {
    "fp32": ("FP32 (TF32 off)", FORMAT_COLORS["FP32"], "-"),
    "tf32": ("TF32", FORMAT_COLORS["TF32"], "-"),
    "bf16": ("BF16", FORMAT_COLORS["BF16"], "-"),
    "fp16": ("FP16", FORMAT_COLORS["FP16"], "--"),
    "fp8": ("FP8 E4M3", FORMAT_COLORS["FP8_E4M3"], "-"),
    "fp8_fast": ("FP8 E4M3, use_fast_accum on", FORMAT_COLORS["FP8_E4M3"], ":"),
}


#: Bytes per parameter that each weight-sized elementwise kernel of the recipe's eager step moves (read + written),
#: by recipe: autocast's cast of each FP32 weight to 16 bits in the forward (read 4, write 2), the cast of its
#: 16-bit gradient back to FP32 in the backward (read 2, write 4), the FP32 SGD update ``p -= lr * g`` (read p and
#: g, write p: 12, unfused, foreach or fused alike) and, for FP16, GradScaler's unscale and inf check (read and
#: write each FP32 gradient: 8).
_TRAFFIC_BYTES_PER_PARAM = {
    "fp32": {"weight_casts": 0, "gradient_casts": 0, "update": 12, "unscale": 0},
    "bf16": {"weight_casts": 6, "gradient_casts": 6, "update": 12, "unscale": 0},
    "fp16": {"weight_casts": 6, "gradient_casts": 6, "update": 12, "unscale": 8},
}


def step_weight_traffic(width: int, num_layers: int, recipe: str) -> dict:
    """The bytes that one step of the recipe's eager loop moves in weight-sized elementwise kernels, modelled
    from the layer sizes: every parameter (``num_layers`` × (width² + width), weights and biases) cast to 16 bits
    by autocast in the forward, its 16-bit gradient cast back to FP32, the FP32 SGD update, and, for FP16,
    GradScaler's unscale (each kernel reading its inputs and writing its output once; the batch-sized
    activations' elementwise kernels are not counted).

    Parameters
    ----------
    width, num_layers : the network's Linear(width, width) layers (ints ≥ 1)
    recipe : "fp32", "bf16" or "fp16" (:data:`mpt_lab.experiments.amp_recipe.RECIPES`)

    Returns
    -------
    dict: "parameters" (count), "weight_casts", "gradient_casts", "update", "unscale" and "total" (bytes read +
    written per step, ints).

    Raises
    ------
    ValueError
        ``width`` or ``num_layers`` is not an int ≥ 1, or ``recipe`` is not one of the three.
    """
    for name, v in (("width", width), ("num_layers", num_layers)):
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise ValueError(f"{name} must be an int ≥ 1, got {v!r}")
    if recipe not in _TRAFFIC_BYTES_PER_PARAM:
        raise ValueError(f"recipe must be one of {sorted(_TRAFFIC_BYTES_PER_PARAM)}, got {recipe!r}")
    params = num_layers * (width * width + width)
    out = {"parameters": params, **{k: b * params for k, b in _TRAFFIC_BYTES_PER_PARAM[recipe].items()}}
    out["total"] = sum(b * params for b in _TRAFFIC_BYTES_PER_PARAM[recipe].values())
    return out


#: ATen operators of the recipe's step that only make a view, a transpose's view or a profiler range: on a GPU they
#: launch no kernel (the host still dispatches them).
NO_KERNEL_OPS = (
    "aten::t",
    "aten::detach",
    "aten::view",
    "aten::_record_function_enter_new",
    "aten::_record_function_exit",
)

#: The optimizer set-ups :func:`count_step_ops` counts: name → (recipe, keyword arguments of ``torch.optim.SGD``).
_COUNTED_STEPS = {
    "bf16": ("bf16", {}),
    "bf16 foreach": ("bf16", {"foreach": True}),
    "fp16": ("fp16", {}),
    "fp16 fused": ("fp16", {"fused": True}),
}


def count_step_ops(num_layers: int, *, width: int = 64, batch: int = 8) -> dict:
    """The ATen operators one step of the recipe's eager loop (:func:`mpt_lab.experiments.amp_recipe.train_step`)
    dispatches, counted on this machine's CPU (:func:`mpt_lab.bench.count_ops`) for four optimizer set-ups: BF16 with
    SGD's for-loop update ("bf16") and with its foreach update ("bf16 foreach", CUDA's default), FP16 with
    ``torch.amp.GradScaler`` and SGD ("fp16") or ``SGD(fused=True)`` ("fp16 fused").  The count depends on the
    number of layers, not on their width or the batch, so a small network stands for the recipe's.

    Parameters
    ----------
    num_layers : the network's Linear layers (int ≥ 1)
    width, batch : the small network's width and batch (ints ≥ 1; float32 inputs of shape (batch, width))

    Returns
    -------
    dict: "counts" (set-up → ``collections.Counter`` of operator name → calls a step), "ops" (BF16's operators a
    step, for-loop update), "ops_foreach" (with the foreach update), "no_kernel" (of those, the
    :data:`NO_KERNEL_OPS`: views and profiler ranges, no kernel on a GPU), "readbacks" (set-up → calls of
    :data:`mpt_lab.bench.READBACK_OP` a step: reads of a value back to the host).

    Raises
    ------
    ValueError
        ``num_layers``, ``width`` or ``batch`` is not an int ≥ 1.
    """
    for name, v in (("num_layers", num_layers), ("width", width), ("batch", batch)):
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise ValueError(f"{name} must be an int ≥ 1, got {v!r}")
    cpu = torch.device("cpu")
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(batch, width, generator=g), torch.randn(batch, width, generator=g)
    counts = {}
    for key, (recipe, opt_kw) in _COUNTED_STEPS.items():
        net = make_model(width, num_layers)
        opt = torch.optim.SGD(net.parameters(), lr=1e-3, **opt_kw)
        scaler = torch.amp.GradScaler("cpu") if recipe == "fp16" else None
        counts[key] = count_ops(lambda: train_step(net, opt, scaler, x, y, recipe, cpu))  # noqa: B023
    foreach = counts["bf16 foreach"]
    return {
        "counts": counts,
        "ops": sum(counts["bf16"].values()),
        "ops_foreach": sum(foreach.values()),
        "no_kernel": sum(foreach.get(op, 0) for op in NO_KERNEL_OPS),
        "readbacks": {key: c.get(READBACK_OP, 0) for key, c in counts.items()},
    }


def eager_step_summary(
    recipe: AmpRecipeResult,
    roofline: dict,
    *,
    batches: tuple = (128, 256, 512),
    odd_batch: int = 513,
    ops_per_step: int | None = None,
) -> dict:
    """What a saved eager run of the recipe says about its step: times, counted rates against the measured and
    datasheet peaks, the step's growth with the batch, and the 16-bit step's GPU work modelled with a saved roofline
    (:func:`roofline_summary`'s "step_model" at the largest of ``batches``).

    Parameters
    ----------
    recipe : :class:`~mpt_lab.experiments.amp_recipe.AmpRecipeResult` with eager rows at every batch of
        ``batches`` and ``odd_batch``
    roofline : the dict written by ``benchmarks/roofline.py`` (see :func:`roofline_summary`), which must have timed
        the recipe's product at the largest batch
    batches : increasing batch sizes (ints); the last is the one modelled
    odd_batch : a batch beside the last (513 beside 512) whose time per sample is compared with the last's
    ops_per_step : ATen operators the host issues a step (e.g. :func:`count_step_ops`'s "ops_foreach"), or None

    Returns
    -------
    dict: "step" (recipe → batch → median step seconds: epoch ÷ batches), "flops" (batch → counted FLOPs a step,
    (6L − 2)·B·W²), "rate" (recipe → batch → TFLOP/s), "measured" (recipe → its dtype's best measured 8192²
    product, TFLOP/s, saved with the run), "datasheet" (:func:`mpt_lab.bench.datasheet_peaks` of its device, or
    None), "of_measured" (recipe → batch → rate ÷ measured), "of_datasheet" (recipe → the last batch's rate ÷ the
    datasheet's dense peak, or None), "growth" (recipe → the last batch's step ÷ the first's), "flops_growth",
    "per_sample_odd" (recipe → time per sample at ``odd_batch`` ÷ at the last batch), "products_of_step" (recipe →
    the last batch's FLOPs at the measured peak ÷ its step), "fp16_minus_bf16" (batch → seconds, ``odd_batch``
    included), "model" (recipe → :func:`roofline_summary`'s "step_model" for the 16-bit recipes: products at their
    shape's forward rate, the backward's products assumed at that rate, and weight-sized traffic at the copy's
    bandwidth), and, with ``ops_per_step``, "host_per_op" (16-bit recipe → {"no_overlap": the rest not modelled ÷
    ops_per_step, "full_overlap": the whole step ÷ ops_per_step}, seconds: the host's cost per operator if it
    never overlapped the GPU's modelled work, and if that work hid entirely under the issuing).

    Raises
    ------
    TypeError
        ``recipe`` is not an AmpRecipeResult, or ``roofline`` not a roofline dict (:func:`roofline_summary`).
    ValueError
        ``batches`` is not increasing ints ≥ 1, a batch has no eager row, ``ops_per_step`` is not an int ≥ 1 or
        None, or the roofline did not time the recipe's product.
    """
    if not isinstance(recipe, AmpRecipeResult):
        raise TypeError(f"recipe must be an AmpRecipeResult, got {type(recipe).__name__}")
    every = (*batches, odd_batch)
    if (
        not batches
        or not all(isinstance(b, int) and not isinstance(b, bool) and b >= 1 for b in every)
        or list(batches) != sorted(set(batches))
    ):
        raise ValueError(
            f"batches must be increasing ints ≥ 1 (and odd_batch an int ≥ 1), got {batches!r}, {odd_batch!r}"
        )
    if ops_per_step is not None and (
        not isinstance(ops_per_step, int) or isinstance(ops_per_step, bool) or ops_per_step < 1
    ):
        raise ValueError(f"ops_per_step must be an int ≥ 1 or None, got {ops_per_step!r}")
    c = recipe.config
    have = {(r["recipe"], r["batch"]): r for r in recipe.rows}
    missing = [(p, b) for p in c["recipes"] for b in every if (p, b) not in have]
    if missing:
        raise ValueError(f"batches: the recipe has no eager row for {missing}")
    last = batches[-1]
    step = {p: {b: have[p, b]["epoch_seconds"] / c["num_batches"] for b in every} for p in c["recipes"]}
    flops = {b: counted_flops_per_step(b, c["width"], c["num_layers"]) for b in batches}
    sheet = datasheet_peaks(recipe.provenance.get("device", recipe.device))
    measured = {p: recipe.matmul_tflops[have[p, last]["dtype"]] for p in step}
    rate = {p: {b: flops[b] / step[p][b] / 1e12 for b in batches} for p in step}
    kinds = roofline_summary(roofline, recipe, batch=last)["kinds"]
    sixteen = [p for p in ("bf16", "fp16") if p in step]
    model = {p: kinds[p]["step_model"] for p in sixteen if p in kinds}
    out = {
        "step": step,
        "flops": flops,
        "rate": rate,
        "measured": measured,
        "datasheet": sheet,
        "of_measured": {p: {b: rate[p][b] / measured[p] for b in batches} for p in step},
        "of_datasheet": {p: rate[p][last] / sheet[p] if sheet and sheet.get(p) else None for p in step},
        "growth": {p: step[p][last] / step[p][batches[0]] for p in step},
        "flops_growth": flops[last] / flops[batches[0]],
        "per_sample_odd": {p: step[p][odd_batch] / odd_batch / (step[p][last] / last) for p in step},
        "products_of_step": {p: flops[last] / (measured[p] * 1e12) / step[p][last] for p in step},
        "fp16_minus_bf16": (
            {b: step["fp16"][b] - step["bf16"][b] for b in every} if {"fp16", "bf16"} <= set(step) else {}
        ),
        "model": model,
    }
    if ops_per_step is not None:
        out["host_per_op"] = {
            p: {"no_overlap": m["rest_seconds"] / ops_per_step, "full_overlap": step[p][last] / ops_per_step}
            for p, m in model.items()
            if m
        }
    return out


#: The SM clock (MHz) at which the H100 SXM's and H200 SXM's datasheet peaks hold, which NVIDIA's datasheet does
#: not state: 132 SMs × 4096 dense 16-bit tensor-core FLOP per clock per SM × 1.83 GHz = 989.4 TFLOP/s (TF32 half
#: as many FLOP per clock, FP8 twice) and 132 SMs × 256 FP32 FLOP per clock × 1.98 GHz = 66.9 TFLOP/s; a secondary
#: source's figures (Lockwood, "H100", glennklockwood.com/garden/processors/h100, 2026), not NVIDIA's.
DATASHEET_CLOCK_MHZ = {"fp32": 1980.0, "tensor_cores": 1830.0}
_CLOCKED_SHEETS = ("H100 SXM", "H200 SXM")
_RECIPE_OF_DTYPE = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}


def _sm_clock(row: dict) -> float | None:
    clocks = row.get("clocks") or {}
    return (clocks.get("sm_clock_mhz") or {}).get("mean") if clocks.get("source") else None


def roofline_summary(roofline: dict, recipe: AmpRecipeResult | None = None, *, batch: int = 512) -> dict:
    """What a saved roofline says per arithmetic, and, with ``recipe``, the recipe's eager step beside it.

    Parameters
    ----------
    roofline : the dict written by ``benchmarks/roofline.py`` (``book/results/roofline_full.json`` read with
        :func:`mpt_lab.experiments.load_json`): ``gemm`` rows (kind, m, n, k, tflops, intensity in FLOP per byte,
        clocks), ``peaks``, ``copy`` (gb_s), ``ridge``, ``datasheet`` (or None), ``provenance``
    recipe : optional :class:`~mpt_lab.experiments.amp_recipe.AmpRecipeResult` (the eager loop's rows); its
        product ``batch`` × ``width`` × ``width`` must be one the roofline timed
    batch : the recipe's batch size whose step is compared (int ≥ 1); the recipe's product is batch × width ×
        width (without ``recipe``: the roofline's first non-square shape)

    Returns
    -------
    dict: "device", "date", "torch" (the roofline's provenance), "repeat" (timed batches per product),
    "copy_gb_s" (GB/s, bytes read plus written), "datasheet" (:func:`mpt_lab.bench.datasheet_peaks`'s entry as
    saved, or None), "shape" ((m, n, k) of the recipe's product, or None), "kinds": kind → {"label",
    "best_tflops", "best_n" (the square size of the best), "best_sm_clock_mhz" (mean SM clock sampled while the
    best ran, or None), "datasheet_tflops" (dense, or None), "of_datasheet", "vs_fp32" (best ÷ FP32's best),
    "ridge" (FLOP/byte: the measured best ÷ the measured copy bandwidth), "datasheet_ridge" (the datasheet's
    dense peak ÷ its memory bandwidth, or None), "of_clock_scaled" (square size n → the product's rate ÷ the
    datasheet's dense peak scaled to the SM clock sampled while it ran, :data:`DATASHEET_CLOCK_MHZ`; None off the
    H100/H200 SXM), "shape_tflops", "shape_intensity" (FLOP/byte), "eager_tflops", "eager_step_seconds",
    "eager_of_shape" (the step's rate ÷ the product's at its shape), "step_model" (the eager step's GPU work,
    modelled: {"traffic" (:func:`step_weight_traffic`), "products_seconds" (the counted FLOPs at the product's
    rate at its shape), "traffic_seconds" (the traffic at the copy bandwidth), "gpu_seconds" (their sum),
    "of_step" (gpu_seconds ÷ the step), "rest_seconds" (the step − gpu_seconds), "intensity" (the step's FLOP
    per byte: counted FLOPs ÷ (its products' operand bytes + the traffic)), "gpu_tflops" (FLOPs ÷ gpu_seconds),
    "gpu_of_shape" (gpu_tflops ÷ shape_tflops), "fp32_step_over_gpu" (the FP32 step ÷ gpu_seconds)}); the last
    four None for arithmetic the recipe does not run)}, "ratios" (name such as "FP8 ÷ FP16" → the ratio of the
    two best square products), "fp8_vs_fp16" (n → {"ratio", "per_clock" (the ratio of rates per MHz of sampled
    SM clock)}), "clocks" ({"source", "sm_min_mhz", "sm_max_mhz", "power_max_w" (over the whole run),
    "by_product": (kind, n) → {"sm_clock_mhz", "power_w", "temperature_c" (means of the samples taken while
    that square product ran; the board's averaged power lags a short product), "order" (its place in the
    benchmark's run order, 0 first)}}),
    "datasheet_clock_mhz" (:data:`DATASHEET_CLOCK_MHZ` or None), and "recipe": None or {"device", "date", "batch",
    "width", "num_layers", "flops_per_step" (counted: (6L − 2)·B·W²,
    :func:`~mpt_lab.experiments.amp_recipe.counted_flops_per_step`), "intensity_16bit" ({"forward",
    "weight_gradient"}: FLOP per byte of the forward's product batch × width × width (the input gradient's is the
    same shape) and of the weight gradient's width × width with k = batch, 16-bit operands read and result written
    once)}.  The step model applies the forward's product rate to all of the step's products: the backward's
    products were not timed.
    TFLOP/s throughout; the eager step's rate is its counted FLOPs ÷ its median step time (epoch ÷ batches).

    Raises
    ------
    TypeError
        ``roofline`` is not such a dict, or ``recipe`` is not an AmpRecipeResult.
    ValueError
        ``batch`` is not an int ≥ 1, the recipe has no eager row at ``batch``, or the roofline did not time the
        recipe's product at ``batch``.
    """
    if not isinstance(roofline, dict) or not {"gemm", "peaks", "copy", "provenance"} <= set(roofline):
        raise TypeError(
            "roofline must be the dict written by benchmarks/roofline.py (with 'gemm', 'peaks', 'copy', 'provenance')"
        )
    if recipe is not None and not isinstance(recipe, AmpRecipeResult):
        raise TypeError(f"recipe must be an AmpRecipeResult or None, got {type(recipe).__name__}")
    if not isinstance(batch, int) or isinstance(batch, bool) or batch < 1:
        raise ValueError(f"batch must be an int ≥ 1, got {batch!r}")
    rows = [r for r in roofline["gemm"] if r.get("tflops")]
    if not rows:
        raise ValueError("roofline has no measured product (every gemm row lacks tflops)")
    if recipe is not None:
        shape = (batch, recipe.config["width"], recipe.config["width"])
    else:
        shapes = [(r["m"], r["n"], r["k"]) for r in rows if not r["m"] == r["n"] == r["k"]]
        shape = shapes[0] if shapes else None
    if shape is not None and not any((r["m"], r["n"], r["k"]) == shape for r in rows):
        raise ValueError(
            f"batch: the roofline did not time the recipe's product {shape[0]}x{shape[1]}x{shape[2]} "
            f"(its shapes: {roofline.get('config', {}).get('shapes')})"
        )
    prov = roofline["provenance"]
    sheet = roofline.get("datasheet")
    fp32_best = roofline["peaks"].get("fp32")
    kinds: dict = {}
    for kind, (label, _, _) in _ROOF_KINDS.items():
        mine = [r for r in rows if r["kind"] == kind]
        if not mine:
            continue
        squares = [r for r in mine if r["m"] == r["n"] == r["k"]] or mine
        best = max(squares, key=lambda r: r["tflops"])
        at_shape = next((r for r in mine if shape and (r["m"], r["n"], r["k"]) == shape), None)
        sheet_tflops = sheet.get("fp8" if kind == "fp8_fast" else kind) if sheet else None
        kinds[kind] = {
            "label": label,
            "best_tflops": best["tflops"],
            "best_n": best["n"],
            "best_sm_clock_mhz": _sm_clock(best),
            "datasheet_tflops": sheet_tflops,
            "of_datasheet": best["tflops"] / sheet_tflops if sheet_tflops else None,
            "vs_fp32": best["tflops"] / fp32_best if fp32_best else None,
            "ridge": roofline.get("ridge", {}).get(kind),
            "datasheet_ridge": sheet_tflops / sheet["hbm_tb_s"] if sheet_tflops and sheet.get("hbm_tb_s") else None,
            "shape_tflops": at_shape["tflops"] if at_shape else None,
            "shape_intensity": at_shape["intensity"] if at_shape else None,
            "eager_tflops": None,
            "eager_step_seconds": None,
            "eager_of_shape": None,
            "step_model": None,
        }
    squares = {(r["kind"], r["n"]): r for r in rows if r["m"] == r["n"] == r["k"]}
    sizes = sorted({n for _, n in squares})
    run_order = {id(r): i for i, r in enumerate(roofline["gemm"])}
    by_product = {
        key: {
            "sm_clock_mhz": _sm_clock(r),
            "power_w": ((r.get("clocks") or {}).get("power_w") or {}).get("mean"),
            "temperature_c": ((r.get("clocks") or {}).get("temperature_c") or {}).get("mean"),
            "order": run_order[id(r)],
        }
        for key, r in squares.items()
    }
    best = {kind: v["best_tflops"] for kind, v in kinds.items()}
    pairs = (
        ("TF32 ÷ FP32", "tf32", "fp32"),
        ("BF16 ÷ TF32", "bf16", "tf32"),
        ("FP16 ÷ BF16", "fp16", "bf16"),
        ("FP8 ÷ FP16", "fp8", "fp16"),
        ("FP8, use_fast_accum on ÷ off", "fp8_fast", "fp8"),
        ("BF16 ÷ FP32", "bf16", "fp32"),
    )
    fp8_vs_fp16 = {}
    for n in sizes:
        a, b = squares.get(("fp8", n)), squares.get(("fp16", n))
        if a and b:
            ca, cb = _sm_clock(a), _sm_clock(b)
            fp8_vs_fp16[n] = {
                "ratio": a["tflops"] / b["tflops"],
                "per_clock": (a["tflops"] / ca) / (b["tflops"] / cb) if ca and cb else None,
            }
    clocked = bool(sheet) and any(name in sheet.get("name", "") for name in _CLOCKED_SHEETS)
    for kind, v in kinds.items():
        ref = DATASHEET_CLOCK_MHZ["fp32" if kind == "fp32" else "tensor_cores"]
        v["of_clock_scaled"] = {
            n: squares[kind, n]["tflops"] / (v["datasheet_tflops"] * by_product[kind, n]["sm_clock_mhz"] / ref)
            for n in sizes
            if clocked and v["datasheet_tflops"] and (kind, n) in squares and by_product[kind, n]["sm_clock_mhz"]
        } or None
    sampler = roofline.get("sampler") or {}
    out = {
        "device": prov.get("device", ""),
        "date": str(prov.get("date", ""))[:10],
        "torch": prov.get("versions", {}).get("torch", ""),
        "repeat": roofline.get("config", {}).get("repeat"),
        "copy_gb_s": roofline["copy"].get("gb_s"),
        "datasheet": sheet,
        "shape": shape,
        "kinds": kinds,
        "ratios": {name: best[a] / best[b] for name, a, b in pairs if a in best and b in best},
        "fp8_vs_fp16": fp8_vs_fp16,
        "clocks": {
            "source": sampler.get("source"),
            "sm_min_mhz": (sampler.get("sm_clock_mhz") or {}).get("min"),
            "sm_max_mhz": (sampler.get("sm_clock_mhz") or {}).get("max"),
            "power_max_w": (sampler.get("power_w") or {}).get("max"),
            "by_product": by_product,
        },
        "datasheet_clock_mhz": dict(DATASHEET_CLOCK_MHZ) if clocked else None,
        "recipe": None,
    }
    if recipe is None:
        return out
    c = recipe.config
    flops = counted_flops_per_step(batch, c["width"], c["num_layers"])
    to_kind = {"float32": _fp32_kind(recipe), "float16": "fp16", "bfloat16": "bf16"}
    eager = [r for r in recipe.rows if r["batch"] == batch]
    if not eager:
        raise ValueError(f"batch: the recipe has no eager row at batch {batch} (its batches: {c['batch_sizes']})")
    for row in eager:
        k = kinds.get(to_kind.get(row["dtype"], ""))
        if k is None:
            continue
        step = row.get("step_seconds") or row["epoch_seconds"] / c["num_batches"]
        k["eager_step_seconds"] = step
        k["eager_tflops"] = flops / step / 1e12
        k["eager_of_shape"] = k["eager_tflops"] / k["shape_tflops"] if k["shape_tflops"] else None
        if k["shape_tflops"] and out["copy_gb_s"]:
            traffic = step_weight_traffic(c["width"], c["num_layers"], _RECIPE_OF_DTYPE[row["dtype"]])
            products = flops / (k["shape_tflops"] * 1e12)
            moved = traffic["total"] / (out["copy_gb_s"] * 1e9)
            k["step_model"] = {
                "traffic": traffic,
                "products_seconds": products,
                "traffic_seconds": moved,
                "gpu_seconds": products + moved,
                "of_step": (products + moved) / step,
                "rest_seconds": step - products - moved,
                "intensity": flops / (flops / k["shape_intensity"] + traffic["total"]),
                "gpu_tflops": flops / (products + moved) / 1e12,
                "gpu_of_shape": products / (products + moved),
            }
    fp32 = kinds.get(_fp32_kind(recipe), {})
    for k in kinds.values():
        if k.get("step_model") and fp32.get("eager_step_seconds"):
            k["step_model"]["fp32_step_over_gpu"] = fp32["eager_step_seconds"] / k["step_model"]["gpu_seconds"]
    out["recipe"] = {
        "device": recipe.device,
        "date": str(recipe.provenance.get("date", ""))[:10],
        "batch": batch,
        "width": c["width"],
        "num_layers": c["num_layers"],
        "flops_per_step": flops,
        "intensity_16bit": {
            name: 2 * m * n * k / (2 * (m * k + k * n + m * n))
            for name, (m, n, k) in (
                ("forward", (batch, c["width"], c["width"])),
                ("weight_gradient", (c["width"], c["width"], batch)),
            )
        },
    }
    return out


def _roofline_caption(s: dict) -> str:
    sheet = s["datasheet"]
    text = (
        f"Saved roofline: {s['device']}, torch {s['torch']}, {s['date']}; each product the fastest of "
        f"{s['repeat']} timed batches (CUDA events), 2·m·n·k FLOPs; device-to-device copy "
        f"{s['copy_gb_s']:.4g} GB/s (bytes read + written)"
    )
    if sheet:
        text += (
            f" ({s['copy_gb_s'] / 1e3 / sheet['hbm_tb_s']:.0%} of the datasheet's {sheet['hbm_tb_s']:g} TB/s); "
            f"datasheet: {sheet['name']}, dense peaks (the tensor cores' are half the datasheet's 'with sparsity' "
            "figures; FP32 runs on CUDA cores)"
        )
    if s["recipe"]:
        r = s["recipe"]
        text += (
            f". Eager step: the saved amp_recipe run ({r['device']}, {r['date']}), {r['num_layers']} × "
            f"Linear({r['width']}) at batch {r['batch']}: {r['flops_per_step']:.4g} FLOPs counted per step "
            f"((6L − 2)·B·W²: autograd never computes the first layer's input gradient) ÷ its median step time"
        )
    return text


def roofline_table(roofline: dict, recipe: AmpRecipeResult | None = None, *, batch: int = 512) -> HTML:
    """A saved roofline as a table (HTML), one row per arithmetic: its best square product (TFLOP/s, the size,
    the mean SM clock sampled while it ran), that best as a share of the datasheet's dense peak and as a multiple
    of FP32's, the product at the recipe's shape (batch × width × width), and, with ``recipe``, the recipe's
    eager step at ``batch`` (counted TFLOP/s, and its share of the product's rate at that shape).

    Parameters and errors as :func:`roofline_summary` (TypeError for a roofline or recipe of the wrong kind,
    ValueError for a ``batch`` without a row or a timed product).
    """
    s = roofline_summary(roofline, recipe, batch=batch)
    m, n, k = s["shape"] or (None, None, None)
    header = [
        "arithmetic",
        "best TFLOP/s (n × n × n)",
        "SM clock during it, MHz",
        "of datasheet dense peak",
        "× FP32's best",
        f"TFLOP/s at {m} × {n} × {k}" if s["shape"] else "TFLOP/s at the recipe's shape",
    ]
    if s["recipe"]:
        header.append(f"eager recipe step, batch {batch}: TFLOP/s (of the product at its shape)")
    rows = []
    for v in s["kinds"].values():
        row = [
            html.escape(v["label"]),
            f"{v['best_tflops']:.4g} (n = {v['best_n']})",
            f"{v['best_sm_clock_mhz']:.0f}" if v["best_sm_clock_mhz"] else "–",
            f"{v['of_datasheet']:.0%} of {v['datasheet_tflops']:g}" if v["of_datasheet"] else "–",
            f"{v['vs_fp32']:.3g}×" if v["vs_fp32"] else "–",
            f"{v['shape_tflops']:.4g}" if v["shape_tflops"] else "–",
        ]
        if s["recipe"]:
            row.append(f"{v['eager_tflops']:.3g} ({v['eager_of_shape']:.0%})" if v["eager_tflops"] else "–")
        rows.append(row)
    return table_html(header, rows, caption=_roofline_caption(s))


def plot_roofline(roofline: dict, recipe: AmpRecipeResult | None = None, *, batch: int = 512) -> Figure:
    """A saved roofline: achieved TFLOP/s against arithmetic intensity (FLOP per byte of operands and result), both
    axes logarithmic.  Each arithmetic's roof is the lower of its best measured product and the copy bandwidth ×
    intensity; its square products are circles, the recipe's product (batch × width × width) a diamond, and, with
    ``recipe``, the recipe's eager step at ``batch`` a star drawn at the intensity of its product, not the step's
    own (its counted FLOPs ÷ its median step time: a step's rate, not one product's; the step's own intensity,
    counting its weight-sized traffic, is :func:`roofline_summary`'s "step_model").

    Parameters and errors as :func:`roofline_summary`.
    """
    s = roofline_summary(roofline, recipe, batch=batch)
    rows = [r for r in roofline["gemm"] if r.get("tflops")]
    bw = s["copy_gb_s"] * 1e9 / 1e12  # TFLOP/s per FLOP/byte
    fig = new_figure((10.5, 5.4))
    ax = fig.add_subplot()
    x0 = 10 ** np.floor(np.log10(min(r["intensity"] for r in rows))) / 10  # a decade left of the leftmost
    xs = np.logspace(np.log10(x0), np.log10(max(r["intensity"] for r in rows) * 2.5), 200)
    ax.plot(xs, bw * xs, color="0.45", lw=1.2)
    handles = []
    for kind, v in s["kinds"].items():
        label, color, ls = _ROOF_KINDS[kind]
        peak = v["best_tflops"]
        ridge = peak / bw
        (line,) = ax.plot([ridge, xs[-1]], [peak, peak], color=color, ls=ls, lw=1.6, label=label)
        handles.append(line)
        mine = [r for r in rows if r["kind"] == kind]
        sq = [r for r in mine if r["m"] == r["n"] == r["k"]]
        hollow = kind == "fp8_fast"
        ax.scatter(
            [r["intensity"] for r in sq],
            [r["tflops"] for r in sq],
            marker="o",
            s=30,
            facecolors="none" if hollow else color,
            edgecolors=color,
            zorder=3,
        )
        if v["shape_tflops"]:
            ax.scatter(
                [v["shape_intensity"]],
                [v["shape_tflops"]],
                marker="D",
                s=90 if kind in ("bf16", "fp8") else 45,  # larger under FP16's and fast FP8's, which lie on them
                facecolors="none" if hollow else color,
                edgecolors="black",
                lw=0.8,
                zorder=4,
            )
        if v["eager_tflops"]:
            ax.scatter(
                [v["shape_intensity"]],
                [v["eager_tflops"]],
                marker="*",
                s=180,
                color=color,
                edgecolors="black",
                zorder=5,
            )
            ax.annotate(
                "",
                xy=(v["shape_intensity"], v["eager_tflops"] * 1.15),
                xytext=(v["shape_intensity"], v["shape_tflops"] / 1.15),
                arrowprops=dict(arrowstyle="-", color=color, lw=0.8, ls=":"),
            )
    m, n, k = s["shape"] or ("m", "n", "k")
    markers = [
        Line2D([], [], ls="", marker="o", color="0.3", label="square product n × n × n"),
        Line2D([], [], ls="", marker="D", color="0.3", mec="black", label=f"the recipe's product {m} × {n} × {k}"),
    ]
    if s["recipe"]:
        markers.append(
            Line2D(
                [],
                [],
                ls="",
                marker="*",
                ms=12,
                color="0.3",
                mec="black",
                label=f"the recipe's eager step, batch {batch}\n(counted FLOPs ÷ step time,\ndrawn at its products' intensity)",
            )
        )
    markers.append(Line2D([], [], color="0.45", label=f"memory roof: copy, {s['copy_gb_s'] / 1e3:.2g} TB/s"))
    ax.legend(handles=handles + markers, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small", frameon=False)
    ax.set_xscale("log")
    ax.set_yscale("log")
    top = max(v["best_tflops"] for v in s["kinds"].values())
    low = min([v["eager_tflops"] for v in s["kinds"].values() if v["eager_tflops"]] + [bw * xs[0]])
    ax.set_ylim(10 ** np.floor(np.log10(low)), top * 2)
    ax.set_xlim(xs[0], xs[-1])
    ax.set_xlabel("arithmetic intensity, FLOP per byte (operands read + result written once)")
    ax.set_ylabel("achieved TFLOP/s")
    name = s["device"].split(" (")[0]
    ax.set_title(f"Roofline of an {name}: matrix products per arithmetic\n(saved {s['date']}, torch {s['torch']})")
    ax.grid(alpha=0.3, which="both")
    return fig


def autocast_table(probes: dict) -> HTML:
    """Which dtype each op returns under autocast, one column per probe (an HTML table).

    Parameters
    ----------
    probes : dict column title → :class:`mpt_lab.autocast.AutocastProbe` (the ops of the first probe are the
        rows; an op missing from a later probe shows "–")
    """
    if not isinstance(probes, dict) or not probes:
        raise TypeError("probes must be a non-empty dict of column title → AutocastProbe")
    first = next(iter(probes.values()))
    rows = [[html.escape(op)] + [html.escape(p.ops.get(op, "–")) for p in probes.values()] for op in first.ops]
    return table_html(["op"] + list(probes), rows)


#: What each of autocast's groups does, as the lists table says it.
_POLICY_WORDS = {
    "lower_precision": "cast to the lower-precision dtype",
    "float32": "run in float32",
    "promote": "run in the widest dtype of their inputs",
    "banned": "refused (an error)",
    "undetermined": "listed; the probe could not tell the group",
}


def autocast_lists_table(lists: dict) -> HTML:
    """Autocast's op lists side by side (an HTML table): one row per group, one column per device.

    Parameters
    ----------
    lists : dict column title → :class:`mpt_lab.autocast.AutocastLists` (from
        :func:`mpt_lab.autocast.autocast_lists`)

    Raises
    ------
    TypeError
        ``lists`` is not a non-empty dict of AutocastLists.
    """
    if not isinstance(lists, dict) or not lists or not all(hasattr(v, "lists") for v in lists.values()):
        raise TypeError("lists must be a non-empty dict of column title → AutocastLists")
    groups = [g for g in _POLICY_WORDS if any(al.lists.get(g) for al in lists.values())]
    rows = []
    for g in groups:
        cells = [f"<b>{html.escape(g)}</b><br><small>{html.escape(_POLICY_WORDS[g])}</small>"]
        for al in lists.values():
            ops = al.lists.get(g, ())
            cells.append(
                f"<small>{html.escape(', '.join(ops)) if ops else '–'}</small><br><small>({len(ops)} op{'' if len(ops) == 1 else 's'})</small>"
            )
        rows.append(cells)
    rows.append(
        ["<b>not listed</b><br><small>left alone: the dtype of their inputs</small>"]
        + ["<small>every other op (relu, add, …)</small>"] * len(lists)
    )
    return table_html(
        ["group"] + list(lists),
        rows,
        align=["left"] * (1 + len(lists)),
        caption="Autocast's op lists (ATen op names), read from the installed PyTorch's dispatcher by "
        "mpt_lab.autocast.autocast_lists",
    )
