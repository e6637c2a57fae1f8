"""Figures and tables of four-bit training (chapter 13): NVIDIA's NVFP4 recipe ingredient by ingredient.

Every function takes a :class:`mpt_lab.experiments.fourbit_ablation.FourbitAblationResult` (the diagnostics
functions also take the dict of the matching function of that module, e.g. :func:`plot_sr_bias` the output of
:func:`~mpt_lab.experiments.fourbit_ablation.sr_bias`).  Gaps are in per cent of BF16's final validation loss,
each seed against the BF16 run with the same seed; spreads are the minimum and maximum over the seeds.  Source: NVIDIA,
"Pretraining Large Language Models with NVFP4" (arXiv:2509.25149).
"""

from __future__ import annotations

import html
import math

import numpy as np
from matplotlib.figure import Figure

from ..harness.runner import ExperimentResult
from ._base import HTML, new_figure, running_mean, table_html

__all__ = [
    "ARM_STYLE",
    "ablation_table",
    "plot_fourbit_training",
    "plot_sr_bias",
    "plot_hadamard_outliers",
    "plot_outliers",
    "outlier_table",
    "mismatch_table",
    "plot_layer_sensitivity",
]

#: Colour and line style of each arm of the ablation: BF16 green and FP8 purple as in chapter 11, MXFP4 orange,
#: the NVFP4 recipe black, its ablations in colours of their own, NVFP4 without any ingredient grey.
ARM_STYLE = {
    "bf16": ("#2ca02c", ":"),
    "fp8": ("#9467bd", "-"),
    "mxfp4": ("#ff7f0e", "-"),
    "nvfp4": ("#000000", "-"),
    "nvfp4_no_rht": ("#d62728", "--"),
    "nvfp4_1d_weights": ("#1f77b4", "--"),
    "nvfp4_rtn_gradients": ("#8c564b", "--"),
    "nvfp4_no_bf16_layers": ("#e377c2", "--"),
    "nvfp4_plain": ("#7f7f7f", "-."),
}


def _style(arm: str) -> tuple:
    return ARM_STYLE.get(arm, ("#333333", "-"))


def _check(result, *attrs) -> None:
    if not all(hasattr(result, a) for a in ("runs", "arms", "diagnostics", *attrs)):
        raise TypeError(f"result must be a FourbitAblationResult, got {type(result).__name__}")


def _diag(result_or_dict, key: str, required: str) -> dict:
    """The diagnostics ``key`` of a result, or the dict itself (which must hold ``required``)."""
    if hasattr(result_or_dict, "diagnostics"):
        return result_or_dict.diagnostics[key]
    if isinstance(result_or_dict, dict) and required in result_or_dict:
        return result_or_dict
    raise TypeError(f"expected a FourbitAblationResult or the dict of fourbit_ablation's {key} measurement")


def _pm(s: dict, digits: int = 2) -> str:
    """ "+1.23% [+0.90, +1.50]": the mean gap and its range over the seeds."""
    if not math.isfinite(s["mean"]):
        return "diverged"
    return f"{s['mean']:+.{digits}f}% [{s['min']:+.{digits}f}, {s['max']:+.{digits}f}]"


# ------------------------------------------------------------------------------------------------ training
def ablation_table(result: ExperimentResult, *, reference: str = "bf16", against: str = "nvfp4") -> HTML:
    """Per arm: what it changes, its final validation loss (mean ± standard deviation over the seeds), its gap to
    ``reference`` in per cent (mean [min, max] over the seeds), and whether it differs from ``against`` (the
    full recipe) by more than the seed spread (:meth:`FourbitAblationResult.separated`) (an HTML table)."""
    _check(result)
    rows = []
    for arm in result.runs:
        finals = [f for f in result.finals(arm) if math.isfinite(f)]
        mean = np.mean(finals) if finals else math.nan
        std = np.std(finals, ddof=1) if len(finals) > 1 else 0.0
        gap = "–" if arm == reference else _pm(result.gap(arm, reference))
        if arm in (reference, against) or against not in result.runs:
            verdict = "–"
        else:
            sep = result.separated(arm, against, reference)
            worse = result.gap(arm, reference)["mean"] > result.gap(against, reference)["mean"]
            verdict = ("worse" if worse else "better") + " than the recipe" if sep else "within the seed spread"
        rows.append(
            [
                html.escape(result.label(arm)),
                html.escape(result.arms.get(arm, {}).get("change", "")),
                f"{mean:.4f} ± {std:.4f}",
                gap,
                verdict,
            ]
        )
    n = len(result.seeds)
    return table_html(
        [
            "arm",
            "what it changes",
            "validation loss (nats/char)",
            f"gap to {result.label(reference)}",
            f"against {result.label(against)}",
        ],
        rows,
        f"{n} seeds; loss: mean ± standard deviation; gap: mean [min, max] over the seeds, each seed "
        f"against its own {result.label(reference)} run",
        align=["left", "left", "right", "right", "left"],
    )


def plot_fourbit_training(
    result: ExperimentResult, *, smooth: int = 20, reference: str = "bf16", title: str | None = None
) -> Figure:
    """Three panels: the training loss of every arm (mean over the seeds, running mean over ``smooth`` steps);
    the validation-loss gap to ``reference`` at every evaluation (mean over the seeds, the band from the smallest
    to the largest seed); and the final gap per arm (bars at the mean, whiskers from the smallest to the largest
    seed).

    Returns a Figure; x = step / gap (%), y = loss (nats per character) / gap (%) / arm.
    """
    _check(result)
    fig = new_figure((14, 5.4))
    ax, bx, cx = (fig.add_subplot(1, 3, i) for i in (1, 2, 3))
    arms = list(result.runs)
    for arm in arms:
        color, ls = _style(arm)
        runs = [r["losses"] for r in result.runs[arm] if len(r["losses"])]
        n = min(len(r) for r in runs)
        mean = np.mean([r[:n] for r in runs], axis=0)
        x, m = running_mean(mean, smooth)
        ax.plot(x, m, color=color, ls=ls, lw=2.2 if arm in ("bf16", "nvfp4") else 1.3, label=result.label(arm))
        if arm == reference:
            continue
        c = result.gap_curve(arm, reference)
        bx.plot(c["steps"], c["mean"], color=color, ls=ls, marker="o", ms=3, lw=2.2 if arm == "nvfp4" else 1.3)
        if arm == "nvfp4":
            bx.fill_between(c["steps"], c["min"], c["max"], color=color, alpha=0.15, lw=0)
    ax.set_xlabel("step")
    ax.set_ylabel(f"training loss (nats per character)\nmean over seeds, running mean of {smooth} steps")
    ax.set_title("Training loss")
    ax.grid(alpha=0.3)
    lo = min(np.nanmin([np.mean([r["losses"][-1] for r in result.runs[a]]) for a in arms]), 10)
    ax.set_ylim(lo - 0.1, lo + 1.2)
    bx.axhline(0, color="0.2", lw=1)
    bx.set_xlabel("step")
    bx.set_ylabel(f"validation loss − {result.label(reference)}'s (% of it)")
    bx.set_title("Gap during training\n(band: the NVFP4 recipe's seed range)")
    bx.grid(alpha=0.3)
    others = [a for a in arms if a != reference]
    y = np.arange(len(others))[::-1]
    for yi, arm in zip(y, others):
        g = result.gap(arm, reference)
        mean = g["mean"] if math.isfinite(g["mean"]) else 0.0
        cx.barh(yi, mean, color=_style(arm)[0], alpha=0.8, edgecolor="0.3")
        if math.isfinite(g["min"]):
            cx.errorbar(mean, yi, xerr=[[mean - g["min"]], [g["max"] - mean]], color="0.1", capsize=3, lw=1)
    cx.set_yticks(y, [result.label(a) for a in others], fontsize="small")
    cx.axvline(0, color="0.2", lw=1)
    cx.set_xlabel(f"final validation loss − {result.label(reference)}'s (% of it)\nbar: mean; whiskers: seed range")
    cx.set_title("Where each arm ends")
    cx.grid(alpha=0.3, axis="x")
    fig.legend(*ax.get_legend_handles_labels(), loc="outside lower center", ncol=5, fontsize="small")
    m = result.model
    fig.suptitle(
        title
        or f"{m.get('parameters', 0):,}-parameter character transformer, {m.get('tokens', 0):,} "
        f"characters, {len(result.seeds)} seeds per arm ({result.profile} profile)"
    )
    return fig


# --------------------------------------------------------------------------------------------- ingredients
def plot_sr_bias(result_or_dict: ExperimentResult | dict, *, title: str | None = None) -> Figure:
    """The weight gradient gᵀx with g in NVFP4: relative error of the mean of K stochastically rounded draws
    against K (log-log), beside round-to-nearest's error (horizontal: it does not fall) and a 1/√K guide.

    Takes a result or the dict of :func:`mpt_lab.experiments.fourbit_ablation.sr_bias`.
    """
    d = _diag(result_or_dict, "sr_bias", "sr_mean")
    fig = new_figure((9, 5))
    ax = fig.add_subplot(1, 1, 1)
    k = np.asarray(d["draws"], dtype=float)
    ax.loglog(k, d["sr_mean"], "o-", color="#1f77b4", label="stochastic rounding: mean of K draws")
    ax.axhline(d["rtn"], color="#d62728", ls="--", label="round to nearest (the same every time)")
    ax.loglog(k, d["sr_mean"][0] / np.sqrt(k), ":", color="0.4", label="1/√K from the first draw")
    ax.set_xlabel("K: draws averaged (steps, or micro-batches, with the same gradient)")
    ax.set_ylabel("‖mean Q(g)ᵀx − gᵀx‖ / ‖gᵀx‖")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize="small", loc="lower left")
    layer = f" of {d['layer']}" if "layer" in d else ""
    ax.set_title(
        title
        or f"Weight gradient{layer}, its output gradient in NVFP4\n(1 × 16 blocks along the tokens; the input in FP32)"
    )
    return fig


def plot_hadamard_outliers(result_or_dict: ExperimentResult | dict, *, title: str | None = None) -> Figure:
    """Block error along the channels of a Gaussian matrix whose outlier channels are scaled by a factor: SNR of
    all values and of the other channels, NVFP4 (left) and MXFP4 (right), with and without the random Hadamard
    transform.  Takes a result or the dict of :func:`mpt_lab.experiments.fourbit_ablation.hadamard_outlier_error`.
    """
    d = _diag(result_or_dict, "hadamard", "factors")
    fig = new_figure((12, 4.8))
    f = np.asarray(d["factors"])
    for i, fmt in enumerate(("nvfp4", "mxfp4")):
        ax = fig.add_subplot(1, 2, i + 1)
        for k, color in (("plain", "#d62728"), ("rht", "#1f77b4")):
            what = "no transform" if k == "plain" else "random Hadamard"
            ax.semilogx(f, d[fmt][k]["all"], "o-", color=color, label=f"{what}: all values")
            ax.semilogx(f, d[fmt][k]["rest"], "s--", color=color, label=f"{what}: the other channels")
        ax.set_xlabel("factor on the outlier channels")
        ax.set_title(f"{fmt.upper()} ({16 if fmt == 'nvfp4' else 32} values per block and per transform)")
        ax.grid(alpha=0.3, which="both")
        if i == 0:
            ax.set_ylabel("signal-to-noise ratio (dB)")
            ax.legend(fontsize="small", loc="lower left")
    fig.suptitle(
        title
        or f"{d['rows']} × {d['cols']} Gaussian values, {len(d['outlier_channels'])} outlier channels, "
        "quantised along the channels"
    )
    return fig


def plot_outliers(result: ExperimentResult, *, title: str | None = None) -> Figure:
    """Left: each Linear layer's largest per-channel input amax over the median channel's.  Right: SNR of its input
    in FP4 with one scale per tensor, in NVFP4 blocks along the channels, and in NVFP4 after a random Hadamard
    transform along the channels (trained BF16 model, one batch, FP32)."""
    _check(result)
    o = result.diagnostics["outliers"]
    names = list(o)
    fig = new_figure((13, 5))
    ax, bx = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
    y = np.arange(len(names))[::-1]
    ax.barh(y, [o[n]["amax_ratio"] for n in names], color="#9467bd")
    ax.set_xscale("log")
    ax.set_yticks(y, names, fontsize="small")
    ax.set_xlabel("largest channel amax / median channel amax")
    ax.set_title("How far one input channel stands out")
    ax.grid(alpha=0.3, axis="x", which="both")
    for key, color, marker, label in (
        ("tensor", "#d62728", "o", "FP4, one scale per tensor"),
        ("block", "#000000", "s", "NVFP4, 16 along the channels"),
        ("block_rht", "#1f77b4", "^", "NVFP4 after a Hadamard transform"),
    ):
        bx.plot([o[n][key] for n in names], y, marker, color=color, label=label)
    bx.set_yticks(y, names, fontsize="small")
    bx.set_xlabel("signal-to-noise ratio of the layer's input (dB)")
    bx.set_title("What the outliers cost FP4")
    bx.grid(alpha=0.3)
    fig.legend(*bx.get_legend_handles_labels(), loc="outside lower center", ncol=3, fontsize="small")  # off the data
    fig.suptitle(title or f"Inputs of every Linear layer of the trained BF16 model ({result.profile} profile)")
    return fig


def outlier_table(result: ExperimentResult) -> HTML:
    """Per Linear layer: the input's largest channel amax over the median, and SNR (dB) of FP4 per tensor, NVFP4
    along the channels with and without a Hadamard transform, and the weight-gradient GEMM's inputs along the
    tokens with and without it (an HTML table)."""
    _check(result)
    rows = []
    for name, v in result.diagnostics["outliers"].items():
        rows.append(
            [
                html.escape(name),
                f"{v['amax_ratio']:.1f}",
                f"{v['tensor']:.1f}",
                f"{v['block']:.1f}",
                f"{v['block_rht']:.1f}",
                f"{v['wgrad_x']:.1f} / {v['wgrad_x_rht']:.1f}",
                f"{v['wgrad_g']:.1f} / {v['wgrad_g_rht']:.1f}",
            ]
        )
    return table_html(
        [
            "layer",
            "max / median channel amax",
            "FP4 per tensor",
            "NVFP4",
            "NVFP4 + RHT",
            "wgrad x: NVFP4 / + RHT",
            "wgrad g: NVFP4 / + RHT",
        ],
        rows,
        "SNR in dB; the forward GEMM's input in blocks along the channels, the weight-gradient GEMM's "
        "inputs in blocks along the tokens",
    )


def mismatch_table(result: ExperimentResult) -> HTML:
    """Per weight: how far the NVFP4 weight the backward pass reads (blocks along N) is from the forward pass's
    (blocks along K), with 1 × 16 blocks and with 16 × 16 tiles, and what that does to the input gradient (an
    HTML table)."""
    _check(result)
    rows = []
    for name, v in result.diagnostics["mismatch"].items():
        one, two = v["1d"], v["2d"]
        rows.append(
            [
                html.escape(name),
                f"{100 * one['differ']:.1f}%",
                f"{100 * one['relative']:.2f}%",
                f"{100 * one['dgrad']:.2f}%",
                f"{100 * two['differ']:.1f}%",
                f"{100 * two['relative']:.2f}%",
            ]
        )
    return table_html(
        [
            "weight",
            "1D: elements that differ",
            "1D: ‖Q_N(W) − Q_K(W)‖ / ‖W‖",
            "1D: effect on the input gradient",
            "2D: elements that differ",
            "2D: relative difference",
        ],
        rows,
        "forward reads Q_K(W) (blocks along the input features), backward Q_N(W) (along the output features)",
    )


def plot_layer_sensitivity(result: ExperimentResult, *, title: str | None = None) -> Figure:
    """Each Linear layer quantised alone with the full NVFP4 recipe (the others in FP32), on the trained BF16
    model: the validation loss it adds (left), the relative error it causes in the whole gradient (middle), and
    the relative error of its own weight gradient under the recipe's weight-gradient GEMM (right)."""
    _check(result)
    s = result.diagnostics["sensitivity"]
    names = list(s["layers"])
    y = np.arange(len(names))[::-1]
    fig = new_figure((14, 5))
    panels = (
        ([s["layers"][n]["delta_loss"] for n in names], "validation loss added (nats)", "Loss, forward only"),
        ([100 * s["layers"][n]["grad_error"] for n in names], "‖∇ − ∇_FP32‖ / ‖∇_FP32‖ (%)", "The whole gradient"),
        ([100 * s["wgrad_error"][n] for n in names], "‖gw − gᵀx‖ / ‖gᵀx‖ (%)", "The layer's weight gradient"),
    )
    for i, (vals, xlabel, head) in enumerate(panels):
        ax = fig.add_subplot(1, 3, i + 1)
        ax.barh(y, vals, color=["#d62728" if n == "head" else "#1f77b4" for n in names])
        ax.set_yticks(y, names if i == 0 else [""] * len(names), fontsize="small")
        ax.axvline(0, color="0.2", lw=1)
        ax.set_xlabel(xlabel)
        ax.set_title(head)
        ax.grid(alpha=0.3, axis="x")
    fig.suptitle(
        title
        or "One Linear layer at a time in the NVFP4 recipe, the others in FP32 (trained BF16 model; "
        "red: the output layer)"
    )
    return fig
