"""Figures and tables of mixed precision across processes (chapter 10): the loss of each DDP and FSDP2 recipe,
the memory each rank holds, the error of an all-reduce in FP32, BF16 and FP16 as the number of ranks grows,
and what happens to the loss scale when the ranks do not agree on overflow.

Every function takes a :class:`mpt_lab.experiments.distributed.DistributedResult`.  Li et al. (VLDB 2020) for
DDP, Zhao et al. (VLDB 2023) for FSDP.
"""

from __future__ import annotations

import html
import math

import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from ..collectives import ring_order, tree_children
from ..harness.runner import ExperimentResult
from ._base import HTML, new_figure, recipe_style, running_mean, table_html

__all__ = [
    "plot_recipe_losses",
    "plot_memory_per_rank",
    "plot_reduction_error",
    "plot_flag_agreement",
    "plot_reduction_orders",
    "memory_table",
    "reduction_table",
]

#: Colour of the dtype that does the work in each recipe: its gradients' sum (DDP hooks, FSDP2's reduce_dtype)
#: or its compute (autocast, FSDP2's param_dtype): FP32 blue, BF16 green, FP16 red, as in every chapter.
_FORMAT_KEY = {"FP32": "fp32", "BF16": "bf16", "FP16": "fp16"}


def _check(result) -> None:
    if not all(hasattr(result, a) for a in ("recipes", "reduction", "flag_agreement", "world_size")):
        raise TypeError(f"result must be a DistributedResult, got {type(result).__name__}")


def _recipe_color(name: str) -> str:
    """A recipe's colour (:data:`mpt_lab.recipes.RECIPES`: coloured by the 16-bit format involved)."""
    return recipe_style(name)[1]


def plot_recipe_losses(result: ExperimentResult, *, smooth: int = 5, title: str | None = None) -> Figure:
    """The training loss of every recipe (left) and how far each recipe ended from DDP in FP32 (right).

    Left: the loss of the global batch per step (the ranks' mean), running mean over ``smooth`` steps; DDP solid
    or dash-dotted, FSDP2 dashed or dotted (each recipe its own style), coloured by the 16-bit format involved
    (blue FP32 only, green BF16, red FP16).  Right: the
    relative difference ‖θ − θ_DDP FP32‖₂ / ‖θ_DDP FP32‖₂ of the final parameters, per recipe; "bit-identical"
    where it is exactly 0.

    Returns a Figure; x = step (left) and relative difference (right, log scale).
    """
    _check(result)
    fig = new_figure((12.5, 4.8))
    ax, bx = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
    names = list(result.recipes)
    styles = {"ddp": ["-", "-.", (0, (6, 2, 1, 2, 1, 2))], "fsdp": ["--", ":", (0, (3, 1, 1, 1))]}
    used: dict = {}
    for name in names:
        r = result.recipes[name]
        x, mean = running_mean(r["losses"], smooth)
        color = _recipe_color(name)
        k = used[r["wrapper"], color] = used.get((r["wrapper"], color), -1) + 1  # no two lines share a style
        ax.plot(
            x,
            mean,
            ls=styles[r["wrapper"]][k % 3],
            color=color,
            lw=2.0 if r["wrapper"] == "ddp" else 1.4,
            label=r["label"],
        )
    ax.set_xlabel("step")
    ax.set_ylabel(f"training loss (cross-entropy, nats)\nrunning mean of {smooth} steps")
    ax.set_title(f"Loss per recipe, {result.world_size} ranks ({result.backend})")
    ax.grid(alpha=0.3)
    diffs = [result.recipes[n]["param_diff"] for n in names]
    floor = min([d for d in diffs if d > 0], default=1e-6) / 10
    y = np.arange(len(names))[::-1]
    nonzero = [i for i, d in enumerate(diffs) if d > 0]
    bx.barh(y[nonzero], [diffs[i] for i in nonzero], color=[_recipe_color(names[i]) for i in nonzero], alpha=0.85)
    for yi, d in zip(y, diffs):
        if d > 0:
            bx.text(d, yi, f"  {d:.2g}", va="center", fontsize="small")
        else:  # 0 has no place on a log axis: said in words
            bx.text(0.02, yi, "bit-identical (0)", va="center", fontsize="small", transform=bx.get_yaxis_transform())
    bx.set_xscale("log")
    bx.set_yticks(y, [result.recipes[n]["label"] for n in names], fontsize="small")
    bx.set_ylim(-0.6, len(names) - 0.4)
    bx.set_ylabel("recipe")
    bx.set_xlabel("‖θ − θ_DDP FP32‖₂ / ‖θ_DDP FP32‖₂ (log scale)")
    bx.set_title("Final parameters against DDP in FP32")
    bx.set_xlim(floor / 3, max(max(diffs), floor) * 20)
    bx.grid(alpha=0.3, axis="x")
    fig.legend(*ax.get_legend_handles_labels(), loc="outside lower center", ncol=4, fontsize="small")
    fig.suptitle(title or f"The same model and data under DDP and FSDP2 ({result.profile} profile)")
    return fig


def _memory_rows(result, rank: int):
    for name, r in result.recipes.items():
        m = r["memory"][rank]
        yield name, r, m, m["params"] + m["grads"] + m["optimizer"]


def plot_memory_per_rank(result: ExperimentResult, *, rank: int = 0, title: str | None = None) -> Figure:
    """What one rank holds between steps, per recipe: parameters, gradients and optimizer state (stacked), and,
    hatched on top, FSDP2's largest all-gathered layer, held only while that layer computes.

    Returns a Figure; x = recipe, y = KiB (2¹⁰ bytes) on ``rank``.
    """
    _check(result)
    if not 0 <= rank < result.world_size:
        raise ValueError(f"rank must be in [0, {result.world_size}), got {rank!r}")
    fig = new_figure((11, 4.8))
    ax = fig.add_subplot()
    rows = list(_memory_rows(result, rank))
    x = np.arange(len(rows))
    bottom = np.zeros(len(rows))
    parts = [
        ("params", "parameters", "#1f77b4"),
        ("grads", "gradients", "#ff7f0e"),
        ("optimizer", "Adam state (two moments)", "#7f7f7f"),
    ]
    for key, label, color in parts:
        v = np.array([m[key] for _, _, m, _ in rows]) / 2**10
        ax.bar(x, v, bottom=bottom, color=color, label=label)
        bottom += v
    gathered = np.array([m["gathered"] for _, _, m, _ in rows]) / 2**10
    ax.bar(
        x,
        gathered,
        bottom=bottom,
        color="none",
        edgecolor="#333333",
        hatch="//",
        label="all-gathered layer in param_dtype (FSDP2, transient)",
    )
    top = float((bottom + gathered).max()) if len(rows) else 1.0
    ax.set_xticks(x, [r["label"] for _, r, _, _ in rows], rotation=25, ha="right", fontsize="small")
    ax.set_ylabel(f"bytes held by rank {rank} (KiB)")
    ax.set_xlabel("recipe")
    ax.set_title(title or f"Memory per rank: DDP replicates, FSDP2 shards over {result.world_size} ranks")
    ax.set_ylim(0, 1.45 * top)  # every bar whole, and room above them for the legend
    ax.legend(fontsize="small", loc="upper right", ncol=2)
    ax.grid(alpha=0.3, axis="y")
    return fig


def memory_table(result: ExperimentResult, *, rank: int = 0) -> HTML:
    """HTML table of :func:`plot_memory_per_rank`'s numbers, in KiB (2¹⁰ bytes) as the figure, and each total against
    DDP FP32's."""
    _check(result)
    rows = list(_memory_rows(result, rank))
    ref = next((t for n, _, _, t in rows if n == "ddp_fp32"), rows[0][3])

    def kib(b):
        return f"{b / 2**10:,.1f}"

    body = [
        [
            html.escape(r["label"]),
            kib(m["params"]),
            kib(m["grads"]),
            kib(m["optimizer"]),
            kib(t),
            f"{t / ref:.2f}",
            kib(m["gathered"]) if m["gathered"] else "–",
        ]
        for _, r, m, t in rows
    ]
    return table_html(
        ["recipe", "parameters", "gradients", "optimizer state", "total", "÷ DDP FP32", "all-gathered layer"],
        body,
        caption=f"KiB held by rank {rank} of {result.world_size} between steps "
        f"({result.recipes[rows[0][0]]['parameters']:,} parameters)",
    )


def plot_reduction_error(result: ExperimentResult, *, title: str | None = None) -> Figure:
    """The error of summing the ranks' gradients, against the number of ranks N.

    Left: the relative error ‖ĝ − g‖₂/‖g‖₂ of the averaged gradient (each rank's gradient rounded to the format
    and divided by N first, as DDP's compression hooks do) in FP32, BF16 and FP16, summed in the order of a ring
    (solid) and of a binary tree (dashed); the real all-reduce of the run's ranks as open circles.  Right: the
    share of the gradient elements an FP16 ring sum loses: inf when loss-scaled gradients are summed before
    dividing by N, 0 (where the exact mean is not) when they are divided first, with FSDP2's ≈√N split, and
    for unscaled gradients divided first (FP32 training with ``fp16_compress_hook``); shares of 0 are not drawn.

    Returns a Figure; x = N (log₂ axis), y = relative error (left) and share lost in % (right), log axes.
    """
    _check(result)
    sweep, fp16, measured = result.reduction["sweep"], result.reduction["fp16"], result.reduction["measured"]
    ns = np.array(sweep["n"])
    fig = new_figure((12.5, 4.8))
    ax, bx = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
    for fmt in sweep["ring"]:
        label, color, _ = recipe_style(_FORMAT_KEY[fmt])
        ax.plot(ns, sweep["ring"][fmt], "-o", ms=3, color=color, label=f"{fmt} ring")
        ax.plot(ns, sweep["tree"][fmt], "--", color=color, label=f"{fmt} tree")
        ax.plot(
            [measured["n"]],
            [max(measured[fmt]["rel_error"], 1e-12)],
            "o",
            ms=10,
            mfc="none",
            mew=2,
            color=color,
            label=f"{fmt} real, N = {measured['n']}",
        )
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("ranks N (log₂ scale)")
    ax.set_ylabel("relative error of the averaged gradient\n‖ĝ − g‖₂ / ‖g‖₂ (log scale)")
    ax.set_title("Summing N ranks' gradients in FP32, BF16, FP16")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize="x-small", ncol=3, loc="upper left")
    ymax = max(max(v) for v in sweep["ring"].values())
    ax.set_ylim(top=ymax * 1e3)  # room for the legend above the curves
    s = f"2^{int(math.log2(fp16['scale']))}"
    lost = [
        (f"sum, then ÷ N (S = {s}): inf", fp16["sum_then_divide"]["overflow_share"], "#d62728", "-"),
        (f"÷ N first, the hook (S = {s}): 0", fp16["predivide"]["underflow_share"], "#9467bd", "--"),
        (
            f"÷ ≈√N before and after, FSDP2 (S = {s}): inf or 0",
            np.add(fp16["fsdp_split"]["overflow_share"], fp16["fsdp_split"]["underflow_share"]),
            "#8c564b",
            ":",
        ),
        (
            "÷ N first, unscaled gradients (FP32 training + hook): 0",
            sweep["underflow"]["ring"]["FP16"],
            "#ff7f0e",
            "-.",
        ),
    ]
    none_lost = []
    for label, share, color, ls in lost:
        share = 100 * np.asarray(share, dtype=float)
        shown = share > 0
        if shown.any():  # a series with no share above 0 has nothing to draw on a log axis ...
            bx.plot(ns[shown], share[shown], ls, marker="o", ms=4, color=color, label=label)
        else:  # ... and is named in a note instead of the legend
            none_lost.append(label.rsplit(":", 1)[0])

    over = fp16["first_overflow_n"]
    if over is not None:
        bx.axvline(over, color="#d62728", lw=0.8, alpha=0.5)
    bx.set_xscale("log", base=2)
    bx.set_yscale("log")
    bx.set_xlim(ax.get_xlim())
    bx.set_xlabel("ranks N (log₂ scale)")
    bx.set_ylabel("gradient elements lost (%, log scale)\n(inf, or 0 where the exact mean is not)")
    bx.set_title("FP16 sums: overflow without pre-division, underflow with it")
    bx.grid(alpha=0.3, which="both")
    note = ("no element lost at any N:\n" + "\n".join(none_lost)) if none_lost else None
    legend = bx.legend(fontsize="x-small", loc="upper left", title=note, title_fontsize="x-small")
    if note:
        legend.get_title().set_ha("left")
    fig.suptitle(
        title
        or f"The reduction error as the cluster grows ({sweep['elements']:,} gradient elements, "
        f"{result.profile} profile)"
    )
    return fig


def reduction_table(result: ExperimentResult, *more: ExperimentResult) -> HTML:
    """HTML table: the real all-reduce of each run's ranks in each format, its error, whether it equals the ring
    simulation bit for bit, how many elements another order (a binary tree's) would have changed, and whether
    DDP's compression hooks equal the simulation (measured on 2 ranks only).

    ``result`` and ``more``: :class:`~mpt_lab.experiments.distributed.DistributedResult` s, one row group each
    (e.g. the chapter's 2-rank run and a 3-rank :func:`~mpt_lab.experiments.distributed.reduction_config` run).
    On 2 ranks every element is a sum of two values, which has one order: there the "bit for bit" column tests
    the dtype and the division, and only runs on 3 or more ranks test the order.

    Raises TypeError for anything that is not a DistributedResult.
    """
    results = (result, *more)
    for r in results:
        _check(r)

    def yes(v):
        return "–" if v is None else ("yes" if v else "no")

    rows = []
    for r in results:
        m, hooks = r.reduction["measured"], r.reduction["hooks"]
        hook_of = {"BF16": hooks.get("bf16"), "FP16": hooks.get("fp16"), "FP32": None}
        for fmt in ("FP32", "BF16", "FP16"):
            rows.append(
                [
                    f"{m['n']} ({r.backend})",
                    fmt,
                    f"{m[fmt]['rel_error']:.3g}",
                    yes(m[fmt]["matches_ring"]),
                    f"{100 * m[fmt]['differs_from_tree']:.1f}%",
                    yes(hook_of[fmt]),
                ]
            )
    elements = " and ".join(dict.fromkeys(f"{r.reduction['measured']['elements']:,}" for r in results))
    return table_html(
        [
            "ranks",
            "format",
            "relative error",
            "= ring_allreduce, bit for bit",
            "elements a tree's order changes",
            "DDP's hook = ring_allreduce",
        ],
        rows,
        caption=f"The ranks' gradients ({elements} elements), each divided by the number of ranks, "
        "all-reduced by the process group and compared with the simulation",
    )


def plot_reduction_orders(n_ranks: int = 6, *, chunk: int = 0, title: str | None = None) -> Figure:
    """The order in which a ring and a binary tree add N ranks' values, from :mod:`mpt_lab.collectives`.

    Left: the ranks on a ring; the arrows follow :func:`~mpt_lab.collectives.ring_order` (N, ``chunk``), gloo's
    order for the elements of one chunk, numbered by hop, each hop one addition rounded to the buffer's format;
    below, the sum as it is formed.  Right: the binary tree of :func:`~mpt_lab.collectives.tree_children`, each
    arrow a partial sum passed to the parent (numbered in the order the parent adds them), and the root's sum.

    Returns a Figure (a diagram: no data axes).  Raises ValueError for ``n_ranks`` < 2 or a bad ``chunk``.
    """
    if not isinstance(n_ranks, int) or isinstance(n_ranks, bool) or n_ranks < 2:
        raise ValueError(f"n_ranks must be an int ≥ 2, got {n_ranks!r}")
    order = ring_order(n_ranks, chunk)
    children = tree_children(n_ranks)
    fig = new_figure((9.6, 4.6))
    ax, bx = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
    node = dict(boxstyle="circle,pad=0.35", facecolor="#dbe9f6", edgecolor="#1f77b4", lw=1.5)
    start = dict(node, facecolor="#fde0c5", edgecolor="#ff7f0e")
    end = dict(node, facecolor="#d5f0d5", edgecolor="#2ca02c")

    # the ring: rank r at angle 90° − 360°·r/N (rank 0 on top, clockwise)
    angle = {r: np.pi / 2 - 2 * np.pi * r / n_ranks for r in range(n_ranks)}
    pos = {r: (np.cos(a), np.sin(a)) for r, a in angle.items()}
    for r in range(n_ranks):
        style = start if r == order[0] else end if r == order[-1] else node
        ax.text(*pos[r], f"{r}", ha="center", va="center", fontsize=13, bbox=style, zorder=3)
    for hop, (a, b) in enumerate(zip(order[:-1], order[1:]), 1):
        ax.annotate(
            "",
            xy=pos[b],
            xytext=pos[a],
            zorder=2,
            arrowprops=dict(
                arrowstyle="-|>", color="#333333", lw=1.6, shrinkA=17, shrinkB=17, connectionstyle="arc3,rad=-0.25"
            ),
        )
        mid = (np.add(pos[a], pos[b])) / 2
        ax.text(*(mid * 1.3), f"hop {hop}", ha="center", va="center", fontsize="medium", color="#333333")
    ring_sum = f"x{order[0]}"
    for r in order[1:]:
        ring_sum = f"({ring_sum} + x{r})" if r != order[-1] else f"{ring_sum} + x{r}"
    ax.text(0, -1.55, f"chunk {chunk}: {ring_sum}", ha="center", va="center", fontsize="medium", family="monospace")
    ax.text(
        0,
        -1.9,
        f"every + rounds to the buffer's format;\n{n_ranks} chunks, each a chain of {n_ranks - 1} hops",
        ha="center",
        va="center",
        fontsize="small",
        color="#555555",
    )
    ax.set_xlim(-1.6, 1.6)
    ax.set_ylim(-2.15, 1.35)
    ax.set_aspect("equal")
    ax.axis("off")
    ax.set_title(f"Ring (gloo): ring_order({n_ranks}, {chunk}) = {order}", fontsize="medium")

    # the tree: level of rank r is floor(log2(r + 1)); ranks of one level spread evenly
    depth = {r: int(np.floor(np.log2(r + 1))) for r in range(n_ranks)}
    levels = max(depth.values()) + 1
    tpos = {}
    for r in range(n_ranks):
        first = 2 ** depth[r] - 1
        slots = 2 ** depth[r]
        tpos[r] = ((r - first + 0.5) / slots * 2 - 1, 1.1 - depth[r] * (2.2 / max(1, levels - 1)) * 0.8)
    for r, kids in enumerate(children):
        for i, c in enumerate(kids, 1):
            bx.annotate(
                "",
                xy=tpos[r],
                xytext=tpos[c],
                zorder=2,
                arrowprops=dict(arrowstyle="-|>", color="#333333", lw=1.6, shrinkA=17, shrinkB=17),
            )
            mid = np.add(tpos[r], tpos[c]) / 2
            bx.text(
                mid[0] + (0.1 if c % 2 == 0 else -0.1),
                mid[1],
                f"{i}",
                ha="center",
                va="center",
                fontsize="medium",
                color="#333333",
            )
    for r in range(n_ranks):
        style = end if r == 0 else start if not children[r] else node
        bx.text(*tpos[r], f"{r}", ha="center", va="center", fontsize=13, bbox=style, zorder=3)

    def expr(r):
        out = f"x{r}"
        for c in children[r]:
            sub = expr(c)
            out = f"({out} + {sub})" if c != children[r][-1] or r != 0 else f"{out} + {sub}"
        return out

    bx.text(0, -1.55, f"root: {expr(0)}", ha="center", va="center", fontsize="medium", family="monospace")
    bx.text(
        0,
        -1.9,
        f"each rank adds its children's partial sums\nin turn (1, then 2): {levels} levels",
        ha="center",
        va="center",
        fontsize="small",
        color="#555555",
    )
    bx.set_xlim(-1.25, 1.25)
    bx.set_ylim(-2.15, 1.35)
    bx.axis("off")
    bx.set_title(f"This book's binary tree, not NCCL's:\ntree_children({n_ranks}) = {children}", fontsize="medium")
    fig.suptitle(
        title or f"In which order {n_ranks} ranks' values are added\n(orange: where a sum starts, green: where it ends)"
    )
    return fig


def plot_flag_agreement(result: ExperimentResult, *, title: str | None = None) -> Figure:
    """The loss scale on every rank when one rank's gradient shard overflows (left), and how far the
    unsynchronised model drifts from the synchronised one (right).

    Left: log₂ S per step and rank for ``torch.amp.GradScaler``, ours, and ours with the found-inf flag left
    unreduced; the steps with an inf in one rank's shard as vertical lines.  Right: ‖θ_unsynchronised −
    θ_ours‖₂ / ‖θ_ours‖₂ per step.

    Returns a Figure; x = step.
    """
    _check(result)
    fa = result.flag_agreement
    if not fa:
        raise ValueError("this result has no overflow-agreement study (flag_steps = 0)")
    fig = new_figure((12.5, 4.6))
    ax, bx = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
    steps = np.arange(fa["steps"])
    look = {
        "torch": ("torch.amp.GradScaler", "#7f7f7f", "-", 5.0),
        "mpt_lab": ("mpt_lab GradScaler", "#1f77b4", "--", 2.5),
        "unsynchronised": ("unsynchronised", "#d62728", "-", 1.5),
    }
    for variant, (label, color, ls, lw) in look.items():
        for rank, scales in enumerate(fa["variants"][variant]["scales"]):
            ax.step(
                steps,
                np.log2(scales),
                where="post",
                color=color,
                ls=ls if rank == 0 else ":",
                lw=lw if variant != "unsynchronised" else lw + rank,
                alpha=0.6 if variant == "torch" else 1,
                label=f"{label}, rank {rank}",
            )
    for i, s in enumerate(fa["inject_steps"]):
        ax.axvline(s, color="#ff7f0e", lw=1, label=f"inf in rank {fa['inject_rank']}'s shard" if i == 0 else None)
        bx.axvline(s, color="#ff7f0e", lw=1, label=f"inf in rank {fa['inject_rank']}'s shard" if i == 0 else None)
    ax.set_xlabel("step")
    ax.set_ylabel("log₂ S   (loss scale)")
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_title("Loss scale per rank (FSDP2, FP16 params)")
    ax.grid(alpha=0.3)
    fig.legend(*ax.get_legend_handles_labels(), loc="outside lower center", ncol=4, fontsize="small")
    bx.plot(steps, fa["drift"], "-o", ms=3, color="#d62728", label="unsynchronised against ours")
    bx.set_xlabel("step")
    bx.set_ylabel("‖θ_unsync − θ_sync‖₂ / ‖θ_sync‖₂")
    bx.set_title("Parameters drift apart")
    bx.grid(alpha=0.3)
    bx.legend(fontsize="small")
    fig.suptitle(title or "When the ranks do not agree on overflow")
    return fig
