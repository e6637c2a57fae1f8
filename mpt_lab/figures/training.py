"""Figures and tables of mixed precision training in practice: master weights, the PyTorch AMP recipe's speed,
and autocast's op policy.

Micikevicius et al. (ICLR 2018), §3.1 (FP32 master weights); Carilli, "Automatic Mixed Precision" (PyTorch
recipe); the ``torch.amp`` autocast op reference.
"""

from __future__ import annotations

import html

import numpy as np
from matplotlib.figure import Figure
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch, Patch

from ..experiments.amp_recipe import AmpRecipeResult
from ..harness.runner import ExperimentResult
from ._base import FORMAT_COLORS, HTML, mib, new_figure, running_mean, table_html

__all__ = ["plot_losses", "plot_master_weight_loop", "speedup_table", "autocast_table", "autocast_lists_table"]

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


def speedup_table(results: AmpRecipeResult | dict[str, AmpRecipeResult]) -> HTML:
    """Seconds per epoch and speed-up over FP32 per precision and batch size: one table per result, its caption
    naming the run (label, device, profile).

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
        rows = []
        sheet = r.datasheet is not None
        for row in r.rows:
            sp = r.speedup.get(row["recipe"], {}).get(str(row["batch"]), 1.0)
            rows.append(
                [
                    row["recipe"],
                    row["batch"],
                    f"{row['epoch_seconds']:.4g}",
                    f"{sp:.2f}×",
                    f"{row['tflops'] * 1e3:.3g}",
                    f"{100 * row['fraction_of_peak']:.0f}%",
                ]
                + ([f"{100 * row['fraction_of_datasheet_peak']:.0f}%"] if sheet else [])
                + [mib(row["peak_bytes"], 1)]
            )
        c = r.config
        caption = (
            f"{label}: {r.device}, {r.profile} profile, {c['num_layers']} × Linear({c['width']}, "
            f"{c['width']}); FLOPs: {r.flops_convention}"
        )
        tables.append(
            table_html(
                ["precision", "batch", "s / epoch", "speed-up vs FP32", "GFLOP/s", "of measured matmul peak"]
                + (["of datasheet peak"] if sheet else [])
                + ["peak MiB"],
                rows,
                caption=caption,
            )
        )
    return type(tables[0])("".join(tables))


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
