"""Figures and tables of FP8 and block scaling (chapter 11): training in every recipe, what each recipe does to
the activations, weights and gradients of every layer, delayed scaling's amax history, and the error of block
scaling against block size.

Most functions take a :class:`mpt_lab.experiments.fp8_recipes.FP8RecipesResult`;
:func:`plot_block_size_error` also takes the output of :func:`mpt_lab.microscaling.block_size_sweep`, and
:func:`one_scale_table` that of :func:`mpt_lab.microscaling.one_scale_vs_per_tensor`.  Sources:
Micikevicius et al. (2022) for FP8; OCP MX v1.0 and Rouhani et al. (2023) for MX; Transformer Engine's
documentation for delayed scaling.
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence

import numpy as np
import torch
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from .. import formats as F
from ..formats import FormatLike
from ..harness.runner import ExperimentResult
from ..microscaling import mean_over_layers, quantize_mx
from ._base import FORMAT_COLORS, HTML, as_formats, new_figure, pct, power_text, recipe_style, running_mean, table_html

__all__ = [
    "plot_fp8_training",
    "fp8_results_table",
    "plot_layer_quantization",
    "plot_recipe_snr",
    "plot_amax_history",
    "plot_block_size_error",
    "block_scale_table",
    "one_scale_table",
    "hardware_table",
    "fp8_recipe_table",
    "plot_mx_block",
]

_ROLE_LABELS = {"x": "activations (inputs)", "w": "weights", "g": "output gradients"}
_SCALING_WORDS = {
    "none": "none",
    "current": "per tensor, current amax",
    "delayed": "per tensor, amax history",
    "mx": "E8M0 per {n} values",
    "nvfp4": "E4M3 per {n} values, FP32 per tensor",
}
_WEIGHT_WORDS = {"bf16_sr": "; BF16 weights, stochastic rounding", "bf16_rne": "; BF16 weights, round to nearest"}
_ROLE_COLORS = {"x": "#1f77b4", "w": "#2ca02c", "g": "#d62728"}


def _check(result, *attrs) -> None:
    if not all(hasattr(result, a) for a in ("runs", "recipes", *attrs)):
        raise TypeError(f"result must be an FP8RecipesResult, got {type(result).__name__}")


def _model(result, model: str) -> dict:
    if model not in result.runs:
        raise ValueError(f"model must be one of {tuple(result.runs)}, got {model!r}")
    return result.runs[model]


def _style(name: str) -> tuple:
    """(colour, line style) of a recipe: its plot style in :data:`mpt_lab.recipes.RECIPES` (:func:`recipe_style`)."""
    return recipe_style(name)[1:]


def _signed(v: float, digits: int = 3) -> str:
    """+0.012, −0.004, and 0.000 for what rounds to zero (no "−0.000")."""
    text = f"{v:+.{digits}f}"
    return f"{0:.{digits}f}" if float(text) == 0 else text


# ----------------------------------------------------------------------------------------------- training
def plot_fp8_training(
    result: ExperimentResult,
    model: str = "lm",
    *,
    smooth: int = 10,
    tolerance: float | None = None,
    reference: str = "bf16",
    title: str | None = None,
) -> Figure:
    """The training loss of every recipe (left) and how far each ended from ``reference`` (right).

    Left: training loss per step, running mean over ``smooth`` steps (gaps where it was not finite).  Right:
    final validation loss minus the reference's, in nats (bars; hatched when beyond ``tolerance``, which is
    drawn as a dashed line when given).

    Parameters
    ----------
    result : FP8RecipesResult
    model : "lm" or "mlp"
    smooth : int, steps in the running mean
    tolerance : float or None, nats
    reference : the run the gaps are measured from (BF16 by default)

    Returns
    -------
    Figure; left x = step, y = loss (nats per character or per image); right x = Δ validation loss (nats).
    """
    _check(result)
    runs = _model(result, model)
    if reference not in runs:
        raise ValueError(f"reference must be one of {tuple(runs)}, got {reference!r}")
    unit = result.models.get(model, {}).get("loss_unit", "nats")
    fig = new_figure((13, 5.2))
    ax, bx = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
    for name, r in runs.items():
        color, ls = _style(name)
        x, mean = running_mean(r["losses"], smooth)
        ax.plot(x, mean, color=color, ls=ls, lw=2.2 if name in ("fp32", reference) else 1.4, label=result.label(name))
    ax.set_xlabel("step")
    ax.set_ylabel(f"training loss ({unit})\nrunning mean of {smooth} steps")
    ax.set_title("Training loss")
    ax.grid(alpha=0.3)
    names = list(runs)
    ref = result.final(model, reference)
    gaps = [result.final(model, n) - ref for n in names]
    y = np.arange(len(names))[::-1]
    for yi, n, gap in zip(y, names, gaps):
        beyond = tolerance is not None and (not math.isfinite(gap) or abs(gap) > tolerance)
        bx.barh(
            yi, gap if math.isfinite(gap) else 0.0, color=_style(n)[0], hatch="//" if beyond else None, edgecolor="0.3"
        )
        bx.text(
            gap if math.isfinite(gap) else 0.0,
            yi,
            f" {_signed(gap)}" if math.isfinite(gap) else " diverged",
            va="center",
            ha="left" if not math.isfinite(gap) or gap >= 0 else "right",
            fontsize="small",
        )
    bx.set_yticks(y, [result.label(n) for n in names], fontsize="small")
    bx.axvline(0, color="0.2", lw=1)
    if tolerance is not None:
        for t in (-tolerance, tolerance):
            bx.axvline(t, color="0.4", ls="--", lw=1)
    bx.set_xlabel(f"final validation loss − {result.label(reference)}'s (nats)")
    bx.set_title(
        f"Where each recipe ends, against {result.label(reference)}"
        + (f" (dashed: ±{tolerance:g})" if tolerance is not None else "")
    )
    bx.grid(alpha=0.3, axis="x")
    lo, hi = min([0.0] + [g for g in gaps if math.isfinite(g)]), max([0.0] + [g for g in gaps if math.isfinite(g)])
    pad = 0.25 * (hi - lo or 0.01)
    bx.set_xlim(lo - pad, hi + 2 * pad)
    fig.legend(*ax.get_legend_handles_labels(), loc="outside lower center", ncol=min(6, len(names)), fontsize="small")
    what = result.models.get(model, {}).get("what", model)
    fig.suptitle(title or f"{what}: every recipe from the same weights and batches ({result.profile} profile)")
    return fig


def _scaling_words(d: dict) -> str:
    """How a recipe scales, in words, from its description in ``result.recipes``."""
    scaling = "–" if d.get("forward") == "FP32" else _SCALING_WORDS.get(d.get("scaling"), d.get("scaling", "–"))
    if d.get("block_size"):
        scaling = scaling.format(n=d["block_size"])
    if d.get("loss_scaling") == "dynamic":
        scaling += "; dynamic loss scale"
    return scaling + _WEIGHT_WORDS.get(d.get("weights"), "")


def _recipe_names(result) -> list:
    return list(dict.fromkeys(n for m in result.runs for n in result.runs[m]))


def fp8_recipe_table(result: ExperimentResult) -> HTML:
    """Per recipe: the formats of the forward and backward operands, how they are scaled, and the bits stored per
    value (scales included) (an HTML table, four columns)."""
    _check(result)
    rows = []
    for name in _recipe_names(result):
        d = result.recipes.get(name, {})
        rows.append(
            [
                html.escape(result.label(name)),
                f"{d.get('forward', '–')} / {d.get('backward', '–')}",
                html.escape(_scaling_words(d)),
                f"{d.get('bits', math.nan):g}",
            ]
        )
    return table_html(
        ["recipe", "forward / backward", "scaling", "bits per value"], rows, align=["left", "left", "left", "right"]
    )


def _steady_steps(result, pairs) -> str:
    """ "after_first" when every (model, recipe) of ``pairs`` kept step 1's statistics apart, else "all" (a result
    saved before runs did): which recorded steps the FP8 figures and tables sum."""
    ok = all(result.has_first(m, n) for m, n in pairs) if hasattr(result, "has_first") else False
    return "after_first" if ok else "all"


#: What the statistics of the FP8 tables and figures cover, by :func:`_steady_steps`.
STEPS_NOTE = {
    "after_first": "statistics of the recorded steps after the first (at step 1 delayed scaling has no amax "
    "history yet and casts with scale 1; that step is left out)",
    "all": "statistics of every recorded step, step 1 included: there delayed scaling has no amax history yet and "
    "casts with scale 1, so its shares include that step (this result was saved before step 1 was kept "
    "apart; a GPU run saved again will separate them)",
}


def fp8_results_table(result: ExperimentResult, *, tolerance: float | None = None, reference: str = "bf16") -> HTML:
    """Per recipe and model: the final validation loss and its gap to ``reference`` in one column (✓ within
    ``tolerance``), the share of output-gradient values lost to underflow (and the steps FP16's scaler skipped),
    and the MLP's test accuracy (an HTML table narrow enough for the page; :func:`fp8_recipe_table` describes the
    recipes)."""
    _check(result)
    models = list(result.runs)
    header = ["recipe"]
    for m in models:
        short = "LM" if m == "lm" else "MLP"
        header += [f"{short}: validation loss (− {result.label(reference)})", f"{short}: gradients lost"]
    if "mlp" in models:
        header.append("MLP: accuracy")
    steps = _steady_steps(result, [(m, n) for m in models for n, r in result.runs[m].items() if r["stats"]])

    def near(gap):  # a gap that rounds to the tolerance shows a fourth digit, so that its ✓ (or none) reads
        return 4 if tolerance is not None and abs(round(abs(gap), 3) - tolerance) < 1e-9 else 3

    rows = []
    for name in _recipe_names(result):
        row = [html.escape(result.label(name))]
        for m in models:
            if name not in result.runs[m]:
                row += ["–", "–"]
                continue
            loss, gap = (
                result.final(m, name),
                result.gap(m, name, reference) if reference in result.runs[m] else math.nan,
            )
            ok = "" if tolerance is None or not math.isfinite(gap) else (" ✓" if abs(gap) <= tolerance else "")
            stats = result.runs[m][name]["stats"]
            lost = result.underflow(m, name, "g", steps) if stats else None
            skipped = len(result.runs[m][name]["skipped"])
            row += [
                f"{loss:.3f}"
                + (" (diverged)" if result.runs[m][name]["diverged"] else "")
                + (f" ({_signed(gap, near(gap))}){ok}" if math.isfinite(gap) else ""),
                pct(lost, 3) + (f"; {skipped} steps skipped" if skipped else ""),
            ]
        if "mlp" in models:
            ev = result.runs["mlp"].get(name, {}).get("evals", [{}])
            acc = ev[-1].get("accuracy") if ev else None
            row.append(pct(acc, 3))
        rows.append(row)
    cap = (
        f"✓: within {tolerance:g} nats of {result.label(reference)}. " if tolerance is not None else ""
    ) + f"Gradients lost: the share of non-zero output-gradient values rounded to zero, {STEPS_NOTE[steps]}."
    return table_html(header, rows, cap)


def plot_layer_quantization(
    result: ExperimentResult, recipe: str = "fp8_unscaled", model: str = "lm", *, title: str | None = None
) -> Figure:
    """What one recipe did to each Linear layer: the share of non-zero values that became zero (left) and the
    signal-to-noise ratio (right), for the layer's inputs, weights and output gradients.

    Returns
    -------
    Figure; y = layer (in model order), left x = values lost to underflow (% of the non-zero values, with the
    share that saturated printed where there was any), right x = SNR (dB).
    """
    _check(result)
    runs = _model(result, model)
    if recipe not in runs:
        raise ValueError(f"recipe must be one of {tuple(runs)}, got {recipe!r}")
    stats = result.stats(model, recipe)
    layers = [n for n in result.models.get(model, {}).get("linears", []) if n in stats] or [
        n for n in stats if n != "all"
    ]
    if not layers:
        raise ValueError(f"the {recipe} run of {model} recorded no statistics")
    fig = new_figure((12.5, 0.45 * len(layers) + 2.4))
    ax, bx = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
    y = np.arange(len(layers))[::-1]
    h = 0.26
    for j, role in enumerate(("x", "w", "g")):
        lost = [100 * stats[n].get(role, {}).get("underflow", 0.0) for n in layers]
        snr = [stats[n].get(role, {}).get("snr_db", math.nan) for n in layers]
        snr = [s if math.isfinite(s) else np.nan for s in snr]
        off = (1 - j) * h
        ax.barh(y + off, lost, h, color=_ROLE_COLORS[role], label=_ROLE_LABELS[role])
        bx.barh(y + off, snr, h, color=_ROLE_COLORS[role], label=_ROLE_LABELS[role])
        for yi, n in zip(y, layers):
            sat = stats[n].get(role, {}).get("saturated", 0.0)
            if sat > 0:
                ax.text(
                    100 * stats[n][role]["underflow"], yi + off, f" sat. {pct(sat, 2)}", va="center", fontsize="x-small"
                )
    for a in (ax, bx):
        a.set_yticks(y, layers, fontsize="small")
        a.grid(alpha=0.3, axis="x")
    ax.set_xlabel("non-zero values that became zero (%)")
    ax.set_xlim(0, 105)
    ax.set_title("Lost to underflow")
    bx.set_xlabel("signal-to-noise ratio 10·log₁₀(Σx² / Σ(Q(x) − x)²)  (dB)")
    bx.set_title("Quantisation noise")
    fig.legend(*ax.get_legend_handles_labels(), loc="outside lower center", ncol=3, fontsize="small")
    fig.suptitle(
        title
        or f"{result.label(recipe)}: every Linear layer of the {model.upper()} "
        f"(steps with statistics, {result.profile} profile)"
    )
    return fig


def plot_recipe_snr(
    result: ExperimentResult, model: str = "lm", *, recipes: Sequence[str] | None = None, title: str | None = None
) -> Figure:
    """Signal-to-noise ratio of the activations, weights and output gradients (over all Linear layers) per
    recipe, and the share of gradient values lost to underflow.

    Returns
    -------
    Figure; x = recipe, left y = SNR (dB, grouped bars per operand), right y = gradients lost (%, markers).
    """
    _check(result)
    runs = _model(result, model)
    names = [n for n in (recipes or runs) if n in runs and runs[n]["stats"]]
    if not names:
        raise ValueError("no recipe with statistics (FP32 has none)")
    steps = _steady_steps(result, [(model, n) for n in names])
    fig = new_figure((12.5, 4.8))
    ax = fig.add_subplot()
    x = np.arange(len(names))
    w = 0.26
    for j, role in enumerate(("x", "w", "g")):
        snr = [result.snr(model, n, role, steps) for n in names]
        ax.bar(
            x + (j - 1) * w,
            [s if math.isfinite(s) else np.nan for s in snr],
            w,
            color=_ROLE_COLORS[role],
            label=f"SNR of {_ROLE_LABELS[role]}",
        )
        for xi, s in zip(x, snr):
            if s == math.inf:  # stored exactly (e.g. weights that are BF16 already)
                ax.text(xi + (j - 1) * w, 6, "exact", rotation=90, ha="center", va="bottom", fontsize="x-small")
    ax.set_xticks(x, [result.label(n) for n in names], rotation=25, ha="right", fontsize="small")
    ax.set_ylabel("signal-to-noise ratio (dB)")
    ax.grid(alpha=0.3, axis="y")
    bx = ax.twinx()
    bx.plot(
        x,
        [100 * result.underflow(model, n, "g", steps) for n in names],
        "kD",
        ms=6,
        label="output-gradient values lost to underflow (%)",
    )
    bx.set_ylabel("gradient values lost (%)")
    bx.set_ylim(0, 100)
    h1, l1 = ax.get_legend_handles_labels()
    h2, l2 = bx.get_legend_handles_labels()
    fig.legend(h1 + h2, l1 + l2, loc="outside lower center", ncol=4, fontsize="small")
    ax.set_title(
        title
        or f"What each recipe keeps of the {model.upper()}'s operands (all Linear layers; 6 dB per bit of precision; "
        + ("recorded steps after the first)" if steps == "after_first" else "every recorded step, step 1 included)")
    )
    return fig


# ------------------------------------------------------------------------------------------ delayed scaling
def plot_amax_history(result: ExperimentResult, *, title: str | None = None) -> Figure:
    """Delayed scaling over training, for the traced tensors: each step's amax, and the largest magnitude the
    scale in use could represent (fmt.max / scale, from the amax history of the steps before); the steps
    where values exceeded it (and saturated) are marked.

    Returns
    -------
    Figure with one axis per traced tensor; x = step, y = magnitude (log₂ scale).
    """
    _check(result, "delayed")
    d = result.delayed
    traces = d.get("traces", {}) if isinstance(d, dict) else {}
    if not traces:
        raise ValueError("the result holds no delayed-scaling traces (run the fp8_delayed recipe on the lm)")
    n = len(traces)
    fig = new_figure((12.5, 3.2 * n + 0.8))
    for i, (name, t) in enumerate(traces.items()):
        ax = fig.add_subplot(n, 1, i + 1)
        fmt = F.get_format(t["format"])
        steps = np.array(t["step"])
        amax = np.array(t["amax"], dtype=float)
        limit = fmt.max / np.array(t["scale"], dtype=float)
        ax.semilogy(
            steps, amax, "o-", ms=2.5, lw=1.2, color=FORMAT_COLORS.get(fmt.name, "#333"), label="amax of the step"
        )
        ax.semilogy(
            steps,
            limit,
            "-",
            lw=2,
            color="0.35",
            drawstyle="steps-mid",
            label=f"largest value the scale in use keeps ({fmt.name} max / scale)",
        )
        over = np.array(t["exceeded"]) > 0
        if over.any():
            ax.semilogy(
                steps[over], amax[over], "v", color="#d62728", ms=7, label="values beyond it: saturated to ±max"
            )
        ax.set_yscale("log", base=2)
        later = slice(1, None) if len(steps) > 1 else slice(None)  # step 1 casts with scale 1: off the chart
        seen = np.concatenate([amax[later], limit[later]])
        seen = seen[np.isfinite(seen) & (seen > 0)]
        if seen.size:
            ax.set_ylim(seen.min() / 2, seen.max() * 2)
            if len(steps) > 1 and limit[0] > seen.max() * 2:
                ax.annotate(
                    f"step {steps[0]}: no history yet, scale 1 (limit {fmt.max:g})",
                    (steps[0], seen.max() * 2),
                    xytext=(8, -14),
                    textcoords="offset points",
                    fontsize="x-small",
                    color="0.35",
                )
        ax.set_ylabel("|value|")
        ax.set_title(
            f"{name}: {fmt.name}, history of {d.get('history_len')} steps, margin {d.get('margin')}", fontsize="medium"
        )
        ax.grid(alpha=0.3)
        if i == 0:
            ax.legend(fontsize="small", loc="best")
    ax.set_xlabel("step")
    fig.suptitle(title or "Delayed scaling: each cast uses a scale computed from the amax of earlier steps")
    return fig


# ------------------------------------------------------------------------------------------- block scaling
def _sweep_of(result_or_sweep) -> dict:
    if hasattr(result_or_sweep, "block_sweep"):
        return result_or_sweep.block_sweep
    if isinstance(result_or_sweep, dict) and result_or_sweep:
        return result_or_sweep
    raise TypeError("expected an FP8RecipesResult or the dict of block_size_sweep (per role)")


def plot_block_size_error(result_or_sweep: ExperimentResult | dict, *, title: str | None = None) -> Figure:
    """Signal-to-noise ratio of MX quantisation against block size, per element format, for the activations,
    weights and output gradients of a trained model (mean over its Linear layers); the point at the right is
    one E8M0 scale for the whole tensor.

    Parameters
    ----------
    result_or_sweep : FP8RecipesResult, or a dict role → (the output of
        :func:`mpt_lab.microscaling.block_size_sweep`: layer → format → {block size: SNR, "tensor": SNR})

    Returns
    -------
    Figure with one axis per role; x = values per scale (log₂ axis; "tensor" at the right), y = SNR (dB).
    """
    sweep = _sweep_of(result_or_sweep)
    roles = [r for r in ("x", "w", "g") if r in sweep] or list(sweep)
    fig = new_figure((13, 4.6))
    axes = [fig.add_subplot(1, len(roles), i + 1) for i in range(len(roles))]
    for ax, role in zip(axes, roles):
        means = mean_over_layers(sweep[role])
        sizes = sorted({int(k) for row in means.values() for k in row if k != "tensor"})
        xt = np.log2(sizes)
        x_tensor = (xt.max() if len(xt) else 0) + 1.5
        for fmt, row in means.items():
            c = FORMAT_COLORS.get(fmt, "#333")
            ax.plot(xt, [row[str(s)] for s in sizes], "o-", color=c, label=fmt)
            if "tensor" in row:
                ax.plot([xt[-1], x_tensor], [row[str(sizes[-1])], row["tensor"]], ":", color=c)
                ax.plot([x_tensor], [row["tensor"]], "s", color=c)
        ax.set_xticks(list(xt) + [x_tensor], [str(s) for s in sizes] + ["tensor"])
        ax.set_xlabel("values sharing one E8M0 scale")
        ax.set_title(_ROLE_LABELS.get(role, role))
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("signal-to-noise ratio (dB)")
    fig.legend(*axes[0].get_legend_handles_labels(), loc="outside lower center", ncol=6, fontsize="small")
    fig.suptitle(
        title or "MX block scaling: error against block size (mean over the Linear layers; 32 is the OCP MX block)"
    )
    return fig


def block_scale_table(result: ExperimentResult) -> HTML:
    """Per operand and element format: SNR with E8M0 (power-of-two) block scales against exact FP32 block
    scales, blocks of 32 (and NVFP4's E4M3 scales on blocks of 16 for FP4), mean over the Linear layers (an
    HTML table)."""
    _check(result, "block_scales")
    rows = []
    for role, per_layer in result.block_scales.items():
        for fmt, row in mean_over_layers(per_layer).items():
            nv = f"{row['nvfp4']:.1f}" if "nvfp4" in row else "–"
            rows.append(
                [
                    f"{_ROLE_LABELS.get(role, role)}, {fmt}",
                    f"{row['e8m0']:.1f}",
                    f"{row['fp32']:.1f}",
                    f"{row['fp32'] - row['e8m0']:.1f}",
                    nv,
                ]
            )
    return table_html(
        [
            "operand, element format",
            "E8M0 scale (dB)",
            "FP32 scale (dB)",
            "FP32 − E8M0 (dB)",
            "NVFP4: E4M3 scale, 16 values (dB)",
        ],
        rows,
        "SNR of block quantisation, blocks of 32 along the reduction axis",
    )


def one_scale_table(comparison: dict, *, limit: int | None = None) -> HTML:
    """Per tensor: the binade of its amax, its own power-of-two scale, and the share of its non-zero values that
    underflow with one scale for all tensors against its own (an HTML table), from
    :func:`mpt_lab.microscaling.one_scale_vs_per_tensor`."""
    if not isinstance(comparison, dict) or "tensors" not in comparison:
        raise TypeError("comparison must be the dict of mpt_lab.microscaling.one_scale_vs_per_tensor")
    rows = []
    items = list(comparison["tensors"].items())[:limit]
    one = comparison.get("one_scale")
    for name, t in items:
        k = t["amax_log2"]
        rows.append(
            [
                html.escape(name),
                "–" if k is None else power_text(k),
                "–" if t["per_tensor_log2"] is None else power_text(t["per_tensor_log2"]),
                pct(t["lost_one_scale"], 3),
                pct(t["lost_per_tensor"], 3),
            ]
        )
    s = "–" if one is None else power_text(one)
    return table_html(
        ["tensor", "amax in binade", "its own scale", f"lost with one scale ({s})", "lost with its own scale"],
        rows,
        f"{comparison.get('format', '')}: non-zero values that underflow to zero",
    )


# ------------------------------------------------------------------------------------------------ hardware
def hardware_table(result: ExperimentResult) -> HTML:
    """The FP8 per-tensor runs emulated and on FP8 tensor cores (``torch._scaled_mm``) side by side, and one
    product computed both ways (an HTML table); a sentence where no tensor cores ran."""
    _check(result, "hardware")
    hw = result.hardware or {}
    rows = []
    for model, runs in result.runs.items():
        for name in runs:
            if not name.endswith("_hw"):
                continue
            base = name[:-3]
            g = runs[name].get("gemms", {})
            rows.append(
                [
                    html.escape(f"{model}: {result.label(base)}"),
                    f"{result.final(model, base):.4f}",
                    f"{result.final(model, name):.4f}",
                    f"{result.final(model, name) - result.final(model, base):+.4f}",
                    f"{g.get('hardware', 0)} / {g.get('hardware', 0) + g.get('emulated', 0)}",
                ]
            )
    if not rows:
        reason = hw.get("reason") or "no FP8 tensor cores"
        return HTML(
            f"<p>No tensor-core runs in this result ({html.escape(str(hw.get('device', '?')))}: "
            f"{html.escape(reason)}).</p>"
        )
    chk = hw.get("gemm_check", {})
    cap = ""
    if chk:
        cap = (
            f"One product ({chk.get('layer')}, x {chk.get('shape', ['?'])[0]} by w {chk.get('shape', ['', '?'])[1]})"
            f" both ways: largest difference {chk.get('max_rel_diff', math.nan):.2e} of the largest |result|"
        )
    return table_html(
        ["run", "emulated: validation loss", "tensor cores: validation loss", "difference", "products on tensor cores"],
        rows,
        cap,
    )


# ----------------------------------------------------------------------------------------------- one block
def plot_mx_block(
    values: Sequence[float] | torch.Tensor,
    formats: Sequence[FormatLike] = ("FP8_E4M3", "FP4_E2M1"),
    *,
    title: str | None = None,
) -> Figure:
    """One OCP MX block quantised by :func:`mpt_lab.microscaling.quantize_mx`: what is stored, and what it keeps.

    Top: the stored block for the first format, its E8M0 scale byte (code c, bits, X = 2^(c − 127)) and one code
    per element (hex), elements stored as 0 hatched, the largest element outlined; the bits per value.  Below, one
    panel per format: log₂ |v| of every value of the block (dots) and of what the block stores for it (crosses;
    values stored as 0 drawn at the bottom edge, as triangles), with the range the shared scale gives the block:
    the top binade [2^(k+emax), 2^(k+emax+1)), the largest value max·X, and the smallest normal and subnormal
    values times X.

    Parameters
    ----------
    values : 1-D float tensor or sequence, one block (e.g. 32 values, the MX block size)
    formats : MX element formats (names or FloatFormats), at least one

    Returns a Figure; x = position in the block, y = log₂ |value|.
    Raises TypeError/ValueError as :func:`~mpt_lab.microscaling.quantize_mx` does, and ValueError for values
    that are not 1-D or hold no non-zero finite value.
    """

    x = torch.as_tensor(values, dtype=torch.float64)
    if x.dim() != 1 or not bool((torch.isfinite(x) & (x != 0)).any()):
        raise ValueError("values must be one 1-D block with at least one non-zero finite value")
    fmts = as_formats(formats, "formats")
    qs = [quantize_mx(x, f, block_size=x.numel()) for f in fmts]
    n = x.numel()
    fig = new_figure((9.6, 2.0 + 2.7 * len(fmts)))
    grid = fig.add_gridspec(1 + len(fmts), 2, height_ratios=[1.0] + [1.7] * len(fmts), width_ratios=[1.25, 4])
    q0, f0 = qs[0], fmts[0]
    code = int(q0.scale_codes.reshape(-1)[0])
    k = code - 127
    box = fig.add_subplot(grid[0, 0])
    box.add_patch(Rectangle((0.05, 0.05), 0.9, 0.9, facecolor="#f0f0f0", edgecolor="#7f7f7f", lw=1.5))
    box.text(
        0.5,
        0.5,
        f"E8M0 scale\ncode {code}\n= 0b{code:08b}\nX = 2^({code} − 127)\n= 2^{k}",
        ha="center",
        va="center",
        fontsize="medium",
    )
    box.set_xlim(0, 1)
    box.set_ylim(0, 1)
    box.axis("off")
    top = fig.add_subplot(grid[0, 1])
    codes = q0.element_codes.reshape(-1).tolist()
    stored0 = q0.dequantize(torch.float64)
    biggest = int(x.abs().argmax())
    width = max(1, len(f"{(1 << f0.bits) - 1:X}"))
    for i, c in enumerate(codes):
        zero = bool(stored0[i] == 0) and bool(x[i] != 0)
        top.add_patch(
            Rectangle(
                (i, 0),
                1,
                1,
                facecolor="#fde0c5" if zero else "white",
                hatch="//" if zero else None,
                edgecolor="#d62728" if i == biggest else FORMAT_COLORS.get(f0.name, "#333333"),
                lw=2.2 if i == biggest else 0.8,
            )
        )
        top.text(
            i + 0.5, 0.5, f"{c:0{width}X}", ha="center", va="center", fontsize=8.5, rotation=90, family="monospace"
        )
    top.set_xlim(-0.2, n + 0.2)
    top.set_ylim(-0.1, 1.1)
    top.set_yticks([])
    top.set_xticks([i + 0.5 for i in range(0, n, 4)], [str(i) for i in range(0, n, 4)])
    top.set_xlabel("element codes (hex); red: the largest value; hatched: stored as 0", fontsize="small")
    top.set_title(
        f"MX{f0.name.replace('FP8_', 'FP8 ').replace('_', ' ')}: one E8M0 byte + {n} × {f0.bits} bits "
        f"= {8 + f0.bits * n} bits, {(f0.bits * n + 8) / n:g} bits per value",
        fontsize="medium",
    )
    for side in ("top", "right", "left"):
        top.spines[side].set_visible(False)

    mags = np.log2(np.where(x.abs().numpy() > 0, x.abs().numpy(), np.nan))
    finite = mags[np.isfinite(mags)]
    pos = np.arange(n) + 0.5
    axes = []
    for j, (f, q) in enumerate(zip(fmts, qs)):
        ax = fig.add_subplot(grid[1 + j, 1], sharex=top)
        axes.append(ax)
        kk = int(q.scale_codes.reshape(-1)[0]) - 127
        stored = q.dequantize(torch.float64).abs().numpy()
        bottom = min(math.log2(f.smallest_subnormal) + kk - 1.5, float(np.nanmin(finite)) - 1)
        ax.axhspan(
            f.emax + kk,
            f.emax + kk + 1,
            color=FORMAT_COLORS.get(f.name, "#999999"),
            alpha=0.15,
            label=f"top binade 2^{f.emax + kk}…2^{f.emax + kk + 1}",
        )
        ax.axhline(math.log2(f.max) + kk, color="#d62728", ls="--", lw=1, label=f"max·X = {f.max:g}·2^{kk}")
        ax.axhline(
            math.log2(f.smallest_normal) + kk, color="0.4", ls=":", lw=1, label=f"smallest normal·X = 2^{f.emin + kk}"
        )
        if f.subnormals and f.smallest_subnormal < f.smallest_normal:
            ax.axhline(
                math.log2(f.smallest_subnormal) + kk,
                color="0.4",
                ls="-.",
                lw=1,
                label=f"smallest subnormal·X = 2^{round(math.log2(f.smallest_subnormal)) + kk}",
            )
        ax.plot(pos, mags, "o", color="#1f77b4", ms=5, label="|value|")
        kept = stored > 0
        ax.plot(pos[kept], np.log2(stored[kept]), "x", color="#d62728", ms=7, mew=1.5, label="|stored value|")
        lost = (~kept) & np.isfinite(mags)
        if lost.any():
            ax.plot(
                pos[lost],
                np.full(int(lost.sum()), bottom + 0.4),
                "v",
                color="#ff7f0e",
                ms=7,
                label=f"stored as 0 ({int(lost.sum())} of {n})",
            )
        ax.set_ylim(bottom, math.log2(f.max) + kk + 1.5)
        ax.set_ylabel("log₂ |value|")
        ax.set_title(
            f"{f.name}: X = 2^(⌊log₂ amax⌋ − emax) = 2^({int(math.floor(np.nanmax(finite)))} − {f.emax}) = 2^{kk}",
            fontsize="medium",
        )
        ax.set_xlabel("position in the block", fontsize="small")
        ax.grid(alpha=0.3)
        ax.tick_params(labelbottom=True)
        leg = fig.add_subplot(grid[1 + j, 0])
        leg.axis("off")
        leg.legend(*ax.get_legend_handles_labels(), fontsize="small", loc="center", borderaxespad=0, handlelength=1.5)
    fig.suptitle(title or f"One MX block of {n} values and its shared E8M0 scale")
    return fig
