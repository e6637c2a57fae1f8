"""Figures and tables of the graph chapter: the DGL User Guide's float16 message passing and its GAT trained in
FP32, FP16 (autocast + GradScaler) and BF16, and where FP16 is fragile in graph attention."""

from __future__ import annotations

import html

import numpy as np
from matplotlib.figure import Figure

from .. import formats as F
from ..experiments.gat_amp import DGL_GUIDE, GatAmpResult
from ..harness.runner import ExperimentResult
from ._base import FORMAT_COLORS, HTML, mib, new_figure, recipe_style, table_html

__all__ = [
    "plot_gat_training",
    "plot_gat_memory",
    "plot_attention_overflow",
    "plot_gat_memory_fit",
    "gat_memory_table",
    "gat_budget_table",
    "message_passing_table",
    "code_table",
]


def _check_gat(result):
    if not isinstance(result, GatAmpResult):
        raise TypeError(f"result must be a GatAmpResult, got {type(result).__name__}")


def plot_gat_training(result: GatAmpResult, *, title: str | None = None) -> Figure:
    """Training loss per epoch of the GAT, one panel per head setting, one line per precision.

    Parameters
    ----------
    result : :class:`~mpt_lab.experiments.gat_amp.GatAmpResult` (runs that ran out of memory are named in the
        legend and not drawn)
    """
    _check_gat(result)
    runs = result.runs
    fig = new_figure((10, 4.2))
    axes = fig.subplots(1, len(runs), sharey=True, squeeze=False)[0]
    for ax, (hk, by_p) in zip(axes, runs.items()):
        for p, r in by_p.items():
            label, color, ls = recipe_style(p)
            if r.get("oom"):
                ax.plot([], [], color=color, ls=ls, label=f"{label}: out of memory")
                continue
            ax.plot(np.arange(1, len(r["losses"]) + 1), r["losses"], color=color, ls=ls, lw=1.8, label=label)
        ax.set_title(f"heads {hk}")
        ax.set_xlabel("epoch (one full-batch step)")
        ax.set_yscale("log")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("training loss (cross-entropy, nats)")
    fig.legend(*axes[0].get_legend_handles_labels(), loc="outside lower center", ncol=3, fontsize="small")
    fig.suptitle(
        title
        or f"The DGL User Guide's GAT: training loss in FP32, FP16 and BF16 ({result.device}, {result.profile} profile)"
    )
    return fig


def plot_gat_memory(result: GatAmpResult, *, title: str | None = None) -> Figure:
    """Total peak memory per (heads, precision) and its ratio to FP32, with the DGL User Guide's V100 ratio.

    Parameters
    ----------
    result : :class:`~mpt_lab.experiments.gat_amp.GatAmpResult`
    """
    _check_gat(result)
    runs = result.runs
    fig = new_figure((10, 4.4))
    ax1, ax2 = fig.subplots(1, 2)
    heads = list(runs)
    precs = [p for p in ("fp32", "fp16", "bf16") if any(p in runs[h] for h in heads)]
    width = 0.8 / len(precs)
    for i, p in enumerate(precs):
        label, color, _ = recipe_style(p)
        xs, sizes, ratio = [], [], []
        for j, h in enumerate(heads):
            r, base = runs[h].get(p), runs[h].get("fp32")
            if not r or r.get("oom"):
                continue
            xs.append(j + (i - (len(precs) - 1) / 2) * width)
            sizes.append(r["total_bytes"] / 2**20)
            ratio.append(r["total_bytes"] / base["total_bytes"] if base and not base.get("oom") else np.nan)
        ax1.bar(xs, sizes, width, color=color, label=label)
        ax2.bar(xs, ratio, width, color=color)
    for ax in (ax1, ax2):
        ax.set_xticks(range(len(heads)), [f"heads {h}" for h in heads])
        ax.set_xlabel("attention heads per layer")
        ax.grid(axis="y", alpha=0.3)
    g = DGL_GUIDE["runs"]["[1, 1, 1]"]
    ref = g["fp16"]["memory_gb"] / g["fp32"]["memory_gb"]
    ax2.axhline(ref, color="black", ls="--", lw=1, label=f"DGL User Guide, {DGL_GUIDE['device']}: {ref:.2f}")
    ax1.set_ylabel("peak memory: step + graph, weights, Adam (MiB)")
    ax1.set_title("Total peak memory")
    ax2.set_ylabel("total peak memory ÷ FP32 (ratio)")
    ax2.set_title("Relative to FP32")
    ax2.set_ylim(0, 1.2)
    h1, l1 = ax1.get_legend_handles_labels()
    h2, l2 = ax2.get_legend_handles_labels()
    fig.legend(h1 + h2, l1 + l2, loc="outside lower center", ncol=4, fontsize="small")
    fig.suptitle(title or f"The GAT's memory by precision ({result.device}, {result.profile} profile)")
    return fig


def plot_attention_overflow(demo: dict, *, title: str | None = None) -> Figure:
    """exp of attention logits in FP16 against the overflow threshold ln(65504), and the softmax computed
    naively in FP16, with the maximum subtracted in FP16, and in FP32.

    Parameters
    ----------
    demo : dict from :func:`mpt_lab.models.gat.attention_overflow`

    Raises TypeError when ``demo`` lacks the keys of that function's result.
    """
    need = ("logits", "exp_fp16", "naive_fp16", "max_subtracted_fp16", "fp32", "limit")
    if not isinstance(demo, dict) or any(k not in demo for k in need):
        raise TypeError(f"demo must be a dict with keys {need}")
    e = np.asarray(demo["logits"], dtype=float)
    fig = new_figure((10, 3.8))
    ax1, ax2 = fig.subplots(1, 2)
    ex = np.asarray(demo["exp_fp16"], dtype=float)
    fin = np.isfinite(ex)
    ax1.semilogy(e[fin], ex[fin], "o-", color=FORMAT_COLORS["FP16"], label="exp(e) in FP16")
    if (~fin).any():
        ax1.plot(
            e[~fin],
            np.full((~fin).sum(), float(F.FP16.max)),
            "x",
            ms=10,
            color="black",
            label="exp(e) = inf in FP16 (overflow)",
        )
    ax1.axhline(float(F.FP16.max), color="gray", ls=":", label="FP16 max = 65504")
    ax1.axvline(demo["limit"], color="black", ls="--", lw=1, label=f"e = ln(65504) ≈ {demo['limit']:.2f}")
    ax1.set_xlabel("attention logit e")
    ax1.set_ylabel("exp(e) (log scale)")
    ax1.set_title("exp overflows FP16 above ln(65504)")
    ax1.legend(fontsize="small")
    x = np.arange(e.size)
    w = 0.27
    naive = np.asarray(demo["naive_fp16"], dtype=float)
    nan = np.isnan(naive)
    ax2.bar(x - w, np.where(nan, 0.0, naive), w, color=FORMAT_COLORS["FP16"], alpha=0.5, label="naive exp/Σexp in FP16")
    if nan.any():  # NaN is no probability: a marker on the axis, not a bar
        ax2.plot(
            x[nan] - w,
            np.zeros(nan.sum()),
            "X",
            ms=9,
            color="black",
            clip_on=False,
            zorder=5,
            label="naive in FP16: NaN (inf / inf)",
        )
    ax2.bar(x, demo["max_subtracted_fp16"], w, color=FORMAT_COLORS["FP16"], label="max subtracted, FP16 (PyG)")
    ax2.bar(x + w, demo["fp32"], w, color=FORMAT_COLORS["FP32"], label="FP32 reference")
    ax2.set_xticks(x, [f"{v:g}" for v in e])
    ax2.set_xlabel("attention logit e of each incoming edge")
    ax2.set_ylabel("attention weight α (softmax)")
    ax2.set_title("Softmax over one node's incoming edges")
    ax2.axhline(0, color="black", lw=0.5)
    ax2.legend(fontsize="small")
    ax2.grid(axis="y", alpha=0.3)
    fig.suptitle(title or "Where FP16 is fragile in graph attention")
    return fig


def gat_memory_table(result: GatAmpResult) -> HTML:
    """Peak memory per (heads, precision) beside the DGL User Guide's V100 numbers, and each precision ÷ FP32."""
    _check_gat(result)
    rows = []
    for hk, runs in result.runs.items():
        guide = DGL_GUIDE["runs"].get(hk, {})
        for p, r in runs.items():
            g = guide.get(p, {}) if p != "bf16" else {}
            g_txt = ("out of memory" if g.get("oom") else f"{g['memory_gb']} GB") if g else "–"
            if r.get("oom"):
                rows.append([hk, p, "out of memory", "–", "–", "–", g_txt])
                continue
            ratio = result.ratio(hk, p)
            rows.append(
                [
                    hk,
                    p,
                    mib(r["peak_bytes"], 1),
                    mib(r["total_bytes"], 1),
                    "–" if ratio is None else f"{ratio:.3f}",
                    f"{r['accuracy']['test']:.3f}",
                    g_txt,
                ]
            )
    g = DGL_GUIDE["runs"]["[1, 1, 1]"]
    rows.append(
        [
            "[1, 1, 1]",
            "fp16 ÷ fp32",
            "",
            "",
            f"{g['fp16']['memory_gb'] / g['fp32']['memory_gb']:.3f}",
            "",
            "the guide's ratio",
        ]
    )
    return table_html(
        [
            "heads",
            "precision",
            f"step peak MiB ({result.device})",
            "total MiB (+ graph, weights, Adam)",
            "total ÷ FP32",
            "test accuracy",
            f"DGL User Guide, {DGL_GUIDE['device']}",
        ],
        rows,
    )


def gat_budget_table(result: GatAmpResult) -> tuple[int, HTML]:
    """The guide's "fits in 16 GB" question, scaled to this run: a memory budget B that holds the FP32 [1, 1, 1]
    run at the same fill level as the guide's V100 (B = total(FP32, [1, 1, 1]) × 16 / 15.2), and for every run
    whether its total fits in B.  A thought experiment on measured numbers, not an out-of-memory error.

    Returns (budget in bytes, HTML table).  Raises ValueError without an FP32 [1, 1, 1] run.
    """
    _check_gat(result)
    base = result.runs.get("[1, 1, 1]", {}).get("fp32")
    if not base or base.get("oom"):
        raise ValueError("result needs an FP32 run with heads [1, 1, 1] to scale the budget")
    budget = base["total_bytes"] * DGL_GUIDE["gpu_memory_gb"] / DGL_GUIDE["runs"]["[1, 1, 1]"]["fp32"]["memory_gb"]
    rows = []
    for hk, runs in result.runs.items():
        for p, r in runs.items():
            if r.get("oom"):
                rows.append([hk, p, "out of memory on the device", "no"])
            else:
                rows.append([hk, p, f"{r['total_bytes'] / budget:.2f}", "yes" if r["total_bytes"] <= budget else "no"])
    return budget, table_html(["heads", "precision", "total ÷ budget", f"fits in {mib(budget, 1)} MiB?"], rows)


def message_passing_table(result: ExperimentResult) -> HTML:
    """The message-passing results: per library and example, the result's dtype and its error against FP32."""
    return table_html(
        ["library", "example", "result dtype", "shape", "max |error|", "‖error‖ / ‖FP32‖", "max error (FP16 ulps)"],
        [
            [
                r["library"],
                html.escape(r["example"]),
                r["dtype"],
                "×".join(map(str, r["shape"])),
                f"{r['max_abs']:.2e}",
                f"{r['rel_norm']:.2e}",
                f"{r['max_ulp']:.2f}",
            ]
            for r in result.rows
        ],
    )


def code_table(example: str, codes: dict) -> HTML:
    """The same computation written with each library, one row per library, as a syntax-plain HTML table.

    ``example``: the example's name (the caption); ``codes``: {library: source code}, e.g. from
    :func:`mpt_lab.experiments.message_passing.code_side_by_side`.  The code is HTML-escaped and kept in a
    ``<pre>`` block that scrolls inside its cell, so a long line never makes the page scroll sideways.

    Raises TypeError if ``codes`` is not a dict of strings.
    """
    if not isinstance(codes, dict) or not all(isinstance(v, str) for v in codes.values()):
        raise TypeError(f"codes must be a dict {{library: source code}}, got {type(codes).__name__}")
    pre = '<pre style="margin:0;padding:4px;overflow-x:auto;max-width:80ch;font-size:85%">{}</pre>'
    return table_html(
        ["library", "code"],
        [[html.escape(lib), pre.format(html.escape(code))] for lib, code in codes.items()],
        caption=example,
        align=("left", "left"),
    )


def plot_gat_memory_fit(result: GatAmpResult, *, title: str | None = None) -> Figure:
    """The GAT's FP32 step peak measured on graphs of several sizes and head counts, and the model it tests
    (:func:`mpt_lab.experiments.gat_amp.memory_model`).

    Left: peak memory of one step against the number of edges E, one straight line (least squares) per graph size
    N and head count H, points as measured.  Right: the slope of each line, the bytes a step adds per edge, against
    H, one marker per graph size, with the model per_edge_head·H + per_edge.

    Parameters
    ----------
    result : :class:`~mpt_lab.experiments.gat_amp.GatAmpResult` with a ``memory_fit``

    Raises
    ------
    TypeError
        ``result`` is not a GatAmpResult.
    ValueError
        The result has no memory fit (its config had no ``fit_degrees``), or one of the older form.
    """
    _check_gat(result)
    fit = result.memory_fit
    if not fit:
        raise ValueError("result has no memory_fit (config.fit_degrees was empty)")
    if "lines" not in fit:
        raise ValueError("result has a memory_fit of an older form (no lines); rerun the experiment")
    pts = np.asarray(fit["points"], dtype=float)  # N, E, H, bytes
    heads = fit["head_counts"]
    sizes = fit["graph_sizes"]
    colors = {h: c for h, c in zip(heads, ("#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2"))}
    markers = dict(zip(sizes, ("o", "s", "^", "D", "v")))
    fig = new_figure((12, 4.6))
    ax, bx = fig.subplots(1, 2)
    for line in fit["lines"]:
        n, h = line["nodes"], line["heads"]
        sel = (pts[:, 0] == n) & (pts[:, 2] == h)
        e = pts[sel, 1]
        ax.plot(e, pts[sel, 3] / 2**20, markers[n], color=colors[h], ms=6, mfc="none" if n != sizes[0] else None)
        ee = np.linspace(0, e.max() * 1.05, 20)
        ax.plot(ee, (line["slope"] * ee + line["intercept"]) / 2**20, "-", color=colors[h], lw=1, alpha=0.7)
    for h in heads:
        ax.plot([], [], "-", color=colors[h], label=f"heads [{h}, {h}, {h}]")
    for n in sizes:
        ax.plot([], [], markers[n], color="0.3", mfc="none" if n != sizes[0] else None, label=f"{n:,} nodes")
    ax.set_xlabel("edges E (with self loops)")
    ax.set_ylabel("peak memory of one FP32 step (MiB)")
    ax.set_title("One straight line per graph size and head count")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small", loc="upper left", ncol=2)
    for line in fit["lines"]:
        n = line["nodes"]
        bx.plot(
            line["heads"],
            line["slope"],
            markers[n],
            color=colors[line["heads"]],
            ms=7 if n == sizes[0] else 14,
            mfc="none" if n != sizes[0] else None,
            mew=1.5,
        )
    hh = np.linspace(0, max(heads) + 0.3, 20)
    bx.plot(
        hh,
        fit["per_edge_head"] * hh + fit["per_edge"],
        "--",
        color="0.3",
        lw=1,
        label=f"{fit['per_edge_head']:,.0f} · H + {fit['per_edge']:,.0f} bytes",
    )
    for n in sizes:
        bx.plot([], [], markers[n], color="0.3", mfc="none" if n != sizes[0] else None, label=f"slope, {n:,} nodes")
    bx.set_xlabel("heads per layer H")
    bx.set_ylabel("slope of the line: bytes per edge")
    bx.set_xticks(heads)
    bx.set_xlim(0, max(heads) + 0.3)
    bx.set_ylim(0, None)
    bx.set_title("The slope grows by the same bytes with every head")
    bx.grid(alpha=0.3)
    bx.legend(fontsize="small", loc="upper left")
    fig.suptitle(
        title
        or f"What PyG's GAT keeps per edge during a step (hidden size {result.config['hidden']}, "
        f"{result.device}, {result.profile} profile)"
    )
    return fig
