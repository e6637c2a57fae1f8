"""Figures and tables of the memory chapter: recomputation (activation checkpointing) against lower precision.

Memory is shown in MiB (2²⁰ bytes) everywhere; a source that reports MB (10⁶ bytes) is quoted in MB and
converted beside it.
"""

from __future__ import annotations

import html

from matplotlib.figure import Figure

from .. import formats as F
from ..experiments.memory_tradeoffs import (
    CIFAR10_RESNET50,
    LAYOUTS,
    RECOMPUTE_VS_PRECISION,
    WAYS,
    MemoryTradeoffsResult,
)
from ._base import HTML, mib, new_figure, power_text, table_html

__all__ = [
    "plot_tradeoffs",
    "tradeoff_table",
    "training_table",
    "breakdown_table",
    "layouts_table",
    "exactness_table",
    "memory_per_parameter_table",
    "backend_switches_table",
]


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


def _setting(result: MemoryTradeoffsResult) -> str:
    """The measured setting of a result in words: device, torch, the ResNet, batch and image size."""
    c = result.config
    torch_version = result.provenance.get("versions", {}).get("torch", "?")
    return (
        f"{result.device}, torch {torch_version}, {result.profile} profile: ResNet of width {c['width']}, "
        f"{c['stages']} stages of {c['depth']} blocks, batch {c['batch_size']} of {c['image_size']}×"
        f"{c['image_size']} px"
    )


def layouts_table(result: MemoryTradeoffsResult) -> HTML:
    """The step times of the FP32 and mixed ways in each variant of
    :data:`~mpt_lab.experiments.memory_tradeoffs.LAYOUTS` (channels-last memory format, ``cudnn.benchmark``, both,
    and for the FP32 way cuDNN's TF32 switched off), in ms per step: the median of the result's timed steps, their
    range, and the median as a multiple of the same way's default (contiguous, no ``cudnn.benchmark``, PyTorch's
    TF32 default for cuDNN).

    Parameters
    ----------
    result : :class:`~mpt_lab.experiments.memory_tradeoffs.MemoryTradeoffsResult` with ``layouts`` (the full
        profile times them; ``time_layouts`` in its config).

    Returns
    -------
    HTML table: one row per variant; for each way, ms per step (median, min–max) and × its default.

    Raises
    ------
    TypeError
        ``result`` is not a MemoryTradeoffsResult.
    ValueError
        ``result`` has no layout timings (made with ``time_layouts`` off, or before they were measured).
    """
    if not isinstance(result, MemoryTradeoffsResult):
        raise TypeError(f"result must be a MemoryTradeoffsResult, got {type(result).__name__}")
    if not result.layouts or "default" not in result.layouts.get("fp32", {}):
        raise ValueError("result has no layout timings (made with time_layouts off, or before they were measured)")
    ways = [w for w in ("fp32", "mixed") if w in result.layouts]

    def cell(way, variant):
        v = result.layouts[way].get(variant)
        if v is None:
            return ["–", "–"]
        t = [1e3 * x for x in v["step_times"]]
        base = result.layouts[way]["default"]["step_seconds"]
        return [f"{1e3 * v['step_seconds']:.2f} ({min(t):.2f}–{max(t):.2f})", f"{v['step_seconds'] / base:.2f}×"]

    rows = []
    for variant in LAYOUTS:
        if not any(variant in result.layouts[w] for w in ways):
            continue
        any_v = next(result.layouts[w][variant] for w in ways if variant in result.layouts[w])
        rows.append(
            [
                html.escape(variant),
                any_v["memory_format"],
                "on" if any_v["cudnn_benchmark"] else "off",
                "allowed" if any_v["cudnn_allow_tf32"] else "off",
            ]
            + [c for w in ways for c in cell(w, variant)]
        )
    labels = {"fp32": "FP32 way", "mixed": f"mixed ({result.mixed_dtype} autocast)"}
    header = ["variant", "memory format", "cudnn.benchmark", "cuDNN TF32"]
    for w in ways:
        header += [f"{labels[w]}: ms / step (min–max)", "× default"]
    c = result.config
    caption = (
        f"Step time of one training step (forward, backward, SGD step), {_setting(result)}: median of "
        f"{c['repeat']} timed steps after warm-up, each variant timed on its own with the switches restored after "
        f"it. The FP32 way: {result.baseline_label}. × default: against the same way in the contiguous format "
        "without cudnn.benchmark. The mixed way's convolutions are 16-bit, so it has no TF32 row."
    )
    return table_html(header, rows, caption=caption)


def exactness_table(result: MemoryTradeoffsResult) -> HTML:
    """The exactness pass of a result: per way, the gradients of one batch against the FP32 way's (bit-identical,
    relative difference ‖g − g₃₂‖/‖g₃₂‖ also in units of the mixed dtype's unit roundoff u = 2⁻ᵖ, cosine), the
    loss difference, and the loss scale the mixed ways' backward ran through (``exactness_loss_scale``: float16
    runs through a scale to keep small gradients from underflowing; 1 for bfloat16).  The pass does not count
    elements flushed to zero.  The reference is the FP32 way as the run computed it: where its baseline is TF32
    convolutions, their inputs round to TF32's 11 significant bits, the same u = 2⁻¹¹ as float16, and the caption
    says that the difference is then between two 11-bit computations, not float16's error against FP32 arithmetic.

    Parameters
    ----------
    result : :class:`~mpt_lab.experiments.memory_tradeoffs.MemoryTradeoffsResult`

    Returns
    -------
    HTML table: one row per way of :data:`~mpt_lab.experiments.memory_tradeoffs.WAYS`.

    Raises
    ------
    TypeError
        ``result`` is not a MemoryTradeoffsResult.
    """
    if not isinstance(result, MemoryTradeoffsResult):
        raise TypeError(f"result must be a MemoryTradeoffsResult, got {type(result).__name__}")
    fmt = F.FP16 if result.mixed_dtype == "float16" else F.BF16
    u = fmt.epsilon / 2
    scale = result.exactness_loss_scale
    if scale is None:
        scaled = "not recorded (a result made before the pass was loss-scaled)"
    elif scale == 1.0:
        scaled = "none (loss scale 1)"
    else:
        k = int(round(float(scale))).bit_length() - 1
        scaled = f"through the loss scale {power_text(k)}, gradients divided by it in FP32"
    rows = []
    for way, (mixed, ckpt) in WAYS.items():
        w = result.ways[way]
        what = (f"{result.mixed_dtype} autocast, backward {scaled}" if mixed else "FP32 way") + (
            ", activation checkpointing" if ckpt else ""
        )
        rows.append(
            [
                html.escape(way),
                html.escape(what),
                "yes" if w["bit_identical"] else "no",
                f"{w['grad_rel_diff']:.3g}",
                f"{w['grad_rel_diff'] / u:.0f}",
                f"{w['grad_cosine']:.4f}",
                f"{w['loss_diff']:+.2g}",
            ]
        )
    tf32_reference = result.baseline_label.startswith("TF32")
    caption = (
        f"One batch, {_setting(result)}; cuDNN's deterministic algorithms for the pass. The reference is the FP32 "
        f"way's gradients; the FP32 way: {result.baseline_label}. u = 2^-{fmt.precision}, the unit roundoff of "
        f"{result.mixed_dtype}."
        + (
            " The reference's convolutions were allowed TF32 (cuDNN's default), which keeps "
            f"{F.TF32.precision} significant bits of their inputs; if they used it, which this pass did not check, a "
            "difference here is between two computations with short significands in their convolutions, not "
            f"{result.mixed_dtype}'s error against FP32 arithmetic."
            if tf32_reference
            else ""
        )
    )
    if scale is not None and scale != 1.0:
        caption += " The loss scale keeps small gradients from underflowing; elements flushed to zero were not counted."
    return table_html(
        [
            "way",
            "what the pass ran",
            "gradients bit-identical to FP32 way's",
            "relative difference",
            "in units of u",
            "cosine",
            "loss − FP32 way's loss",
        ],
        rows,
        caption=caption,
    )


#: What each mode of :func:`mpt_lab.bench.memory_per_parameter` keeps, in the table's words.
_MEMORY_MODE_WORDS = {
    "fp32": "FP32: FP32 weights, gradients and Adam",
    "amp": "AMP: FP32 weights and Adam, float16 autocast, GradScaler",
    "bf16_master": "BF16 weights and gradients, FP32 master weights for Adam",
}


def memory_per_parameter_table(result: dict) -> HTML:
    """Bytes per parameter of training with Adam, by mode, beside ZeRO's accounting of mixed precision Adam
    (Rajbhandari et al. 2020, §3.1: 2 + 2 + 4 + 4 + 4 = 16).

    Per mode: the bytes per parameter of the tensors it keeps (parameters, gradients, FP32 master parameters,
    optimizer state) and their sum, then what the allocator counted: resident (after the last step) and peak (since
    a reset before the model was built), in bytes per parameter.

    Parameters
    ----------
    result : the dict ``benchmarks/memory_per_parameter.py`` writes
        (``book/results/memory_per_parameter_full.json``, loaded with :func:`mpt_lab.experiments.load_json`):
        ``modes`` (mode → :func:`mpt_lab.bench.memory_per_parameter`'s dict) and ``zero``.

    Returns
    -------
    HTML table: one row per mode and a last row for ZeRO's accounting.

    Raises
    ------
    TypeError
        ``result`` is not such a dict.
    ValueError
        ``result`` holds no modes.
    """
    if not isinstance(result, dict) or not isinstance(result.get("modes"), dict) or "zero" not in result:
        raise TypeError("result must be the dict written by benchmarks/memory_per_parameter.py (with 'modes', 'zero')")
    if not result["modes"]:
        raise ValueError("result holds no modes")
    parts = ("parameters", "gradients", "master parameters", "optimizer state")
    rows = []
    for mode, d in result["modes"].items():
        b = d["breakdown_per_parameter"]
        rows.append(
            [html.escape(_MEMORY_MODE_WORDS.get(mode, mode))]
            + [f"{b[k]:g}" for k in parts]
            + [f"{sum(b[k] for k in parts):g}", f"{d['resident_per_parameter']:.2f}", f"{d['peak_per_parameter']:.2f}"]
        )
    z = result["zero"]
    zero_items = (
        z.get("16-bit parameters"),
        z.get("16-bit gradients"),
        z.get("FP32 master parameters"),
        (z.get("momentum") or 0) + (z.get("variance") or 0),
    )
    rows.append(
        ["ZeRO's accounting of mixed precision Adam (FP16 weights and gradients)"]
        + [f"{v:g}" if v is not None else "–" for v in zero_items]
        + [f"{z.get('total', '–')}", "–", "–"]
    )
    first = next(iter(result["modes"].values()))
    prov = result.get("provenance", {})
    c = result.get("config", {})
    caption = (
        f"{first['parameters']:,} parameters ({c.get('layers', '?')} × Linear({c.get('width', '?')}, "
        f"{c.get('width', '?')})), {c.get('steps', '?')} steps of {first.get('optimizer', 'Adam')} on a batch of "
        f"{c.get('batch', '?')}; {prov.get('device', '?')}, torch {prov.get('versions', {}).get('torch', '?')}, "
        f"{str(prov.get('date', '?'))[:10]}. The tensors' bytes per parameter from their dtypes; resident and peak: "
        f"{first.get('method', '?')}. ZeRO counts its FP32 master parameters in the optimizer state (K = 12 bytes); "
        "here they have a column of their own."
    )
    return table_html(
        [
            "training (every column in bytes per parameter)",
            "parameters",
            "gradients",
            "FP32 master parameters",
            "optimizer state",
            "sum of these tensors",
            "resident",
            "peak",
        ],
        rows,
        caption=caption,
    )


#: The switches :func:`mpt_lab.device.backends` records in a provenance: key → (PyTorch's name, what it decides).
BACKEND_SWITCHES = {
    "cudnn_allow_tf32": (
        "torch.backends.cudnn.allow_tf32",
        "cuDNN may run float32 convolutions on TF32 tensor cores (PyTorch's default: True)",
    ),
    "cudnn_conv_fp32_precision": (
        "torch.backends.cudnn.conv.fp32_precision",
        "the newer per-operator setting for cuDNN's float32 convolutions: 'tf32' allows TF32, 'ieee' forbids it",
    ),
    "cuda_matmul_allow_tf32": (
        "torch.backends.cuda.matmul.allow_tf32",
        "cuBLAS may run float32 matrix products on TF32 tensor cores (PyTorch's default: False)",
    ),
    "cuda_matmul_fp32_precision": (
        "torch.backends.cuda.matmul.fp32_precision",
        "the newer per-operator setting for float32 matrix products; 'none': not set here, so the settings above "
        "it and the older switches (allow_tf32, float32 matmul precision) decide",
    ),
    "float32_matmul_precision": (
        "torch.get_float32_matmul_precision()",
        "'highest': float32 matrix products compute in FP32; 'high' and 'medium' allow TF32 or bfloat16 inside",
    ),
    "cudnn_benchmark": (
        "torch.backends.cudnn.benchmark",
        "when True: cuDNN times its algorithms on the first call of each shape and keeps the fastest",
    ),
    "cudnn_deterministic": (
        "torch.backends.cudnn.deterministic",
        "when True: cuDNN is restricted to deterministic algorithms",
    ),
    "cuda_matmul_allow_fp16_reduced_precision_reduction": (
        "torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction",
        "float16 matrix products may sum partial results in float16 rather than FP32",
    ),
    "cuda_matmul_allow_bf16_reduced_precision_reduction": (
        "torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction",
        "bfloat16 matrix products may sum partial results in bfloat16 rather than FP32",
    ),
}


def backend_switches_table(provenance: dict) -> HTML:
    """The TF32 and cuDNN switches a run recorded as it started, under their PyTorch names, with what each
    decides (:data:`BACKEND_SWITCHES`; a key it does not know is shown as recorded).

    Parameters
    ----------
    provenance : dict
        A result's provenance (:func:`mpt_lab.device.provenance`), with ``backends`` (the dict of
        :func:`mpt_lab.device.backends`: key → bool or str) and, for the caption, ``device``, ``date`` and
        ``versions``.

    Returns
    -------
    HTML table: one row per switch (PyTorch's name, value as the run recorded it, what it decides); the caption
    names the run (device, torch, date) and says what ``'none'`` means in the ``fp32_precision`` API (PyTorch's
    design of it: pytorch/pytorch pull request 125888).

    Raises
    ------
    TypeError
        ``provenance`` is not a dict, or its ``backends`` is not a dict.
    ValueError
        ``provenance["backends"]`` is empty.
    """
    if not isinstance(provenance, dict):
        raise TypeError(f"provenance must be a dict (a result's provenance), got {type(provenance).__name__}")
    sw = provenance.get("backends")
    if not isinstance(sw, dict):
        raise TypeError("provenance must hold a dict 'backends' (the switches mpt_lab.device.backends records)")
    if not sw:
        raise ValueError("provenance['backends'] is empty: no switches were recorded")
    order = [k for k in BACKEND_SWITCHES if k in sw] + [k for k in sw if k not in BACKEND_SWITCHES]
    rows = []
    for k in order:
        name, what = BACKEND_SWITCHES.get(k, (k, "(not described here)"))
        rows.append([f"<code>{html.escape(name)}</code>", html.escape(repr(sw[k])), html.escape(what)])
    torch_version = provenance.get("versions", {}).get("torch", "?")
    caption = (
        f"The switches as the run started: {provenance.get('device', '?')}, torch {torch_version}, "
        f"{str(provenance.get('date', '?'))[:10]}. In the fp32_precision settings, 'none' means not set at that "
        "level: the levels above it and the older switches decide (PyTorch's design of that API, pull request "
        "125888)."
    )
    return table_html(["PyTorch setting", "value", "what it decides"], rows, caption=caption)
