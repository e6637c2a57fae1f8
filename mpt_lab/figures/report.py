"""The precision report's figure (chapter 12): every module's values by magnitude, with each format's window.

A heat map per kind of value (module outputs, and the gradients of the loss with respect to them): one row per
module in execution order, one column per binade [2ᵏ, 2ᵏ⁺¹) of |x|, the colour the share of the module's
values in that binade (exact counts of :class:`mpt_lab.histogram.Log2Histogram`).  Each format's window is drawn
over it: values left of its dashed line round to zero (|x| ≤ half its smallest subnormal), values right of its
solid line overflow (beyond its max).  A loss scale S shifts the gradient map by log2 S columns
(Micikevicius et al. 2018 §3.2).
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence

import numpy as np
from matplotlib.colors import LogNorm
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import MaxNLocator

from .. import formats as F
from ..report import PrecisionReport
from ..report_monitor import PrecisionMonitor
from ._base import HTML, format_color, new_figure, pow2, table_html

__all__ = ["plot_precision_report", "format_window", "report_table", "plot_loss_scales"]

#: Formats whose window reaches beyond this many binades from 2⁰ (BF16, FP32) are listed, not drawn: the map
#: would otherwise stretch to ±130 binades.
_DRAW_LIMIT = 80


def format_window(fmt: str | F.FloatFormat) -> tuple[int, float]:
    """(lost, over) on the log2 |x| axis of a format: |x| below 2^lost rounds to zero (the binade lost − 1 …
    i.e. x ≤ half the smallest subnormal), |x| beyond 2^over = fmt.max overflows.  Plain numbers (int, float)."""
    f = F.get_format(fmt)
    return f.emin - f.mantissa_bits - 1, math.log2(f.max)


def _matrix(hists, shift: int, lo: int, hi: int) -> np.ndarray:
    """Rows: share of each histogram's values per binade lo … hi (after shifting by ``shift``), then zeros."""
    out = np.full((len(hists), hi - lo + 2), np.nan)
    for i, h in enumerate(hists):
        if h is None or h.total == 0:
            continue
        k = h.exponents + shift
        sel = (k >= lo) & (k <= hi)
        row = np.zeros(hi - lo + 1)
        row[k[sel] - lo] = h.counts[sel]
        out[i, 1:] = row / h.total
        out[i, 0] = h.zeros / h.total
    out[out == 0] = np.nan
    return out


def plot_precision_report(
    report: PrecisionReport, formats: Sequence[str] | None = None, *, loss_scale: float = 1.0, max_modules: int = 80
) -> Figure:
    """Modules × log2 magnitude heat maps of a :class:`~mpt_lab.report.PrecisionReport`, with format windows.

    Parameters
    ----------
    report : PrecisionReport
    formats : format names (default: the report's formats); each gets a dashed line (|x| left of it rounds to
        zero) and a solid line (|x| right of it overflows) in its colour; formats whose window spans more than
        ±80 binades (BF16) are named in the legend as covering the whole axis
    loss_scale : a power of two S; the gradient map shows |gradient × S|
    max_modules : at most this many module names label the rows (every n-th name beyond that; all rows are drawn)

    Returns
    -------
    Figure: left, module outputs (activations); right, their gradients; x = log2 |value| (column k holds
    2ᵏ ≤ |x| < 2ᵏ⁺¹; the column "zeros" at the left holds exact zeros), y = modules in execution order, colour = share of the
    module's values (log scale).

    Raises
    ------
    TypeError
        ``report`` is not a PrecisionReport.
    ValueError
        ``loss_scale`` is not a positive power of two; an unknown format.
    """

    if not isinstance(report, PrecisionReport):
        raise TypeError(f"report must be a PrecisionReport, got {type(report).__name__}")
    if not isinstance(loss_scale, (int, float)) or not loss_scale > 0 or math.frexp(loss_scale)[0] != 0.5:
        raise ValueError(f"loss_scale must be a positive power of two, got {loss_scale!r}")
    shift = math.frexp(loss_scale)[1] - 1
    fmts = [F.get_format(f, "formats") for f in (formats if formats is not None else report.formats)]
    mods = report.modules
    acts = [m.activation for m in mods]
    grads = [m.activation_gradient for m in mods]

    def data_range(hists, s):
        ks = [h.exponents[h.counts > 0] + s for h in hists if h is not None and h.total]
        ks = np.concatenate(ks) if ks else np.array([0])
        return int(ks.min()), int(ks.max()) if ks.size else 0

    a_lo, a_hi = data_range(acts, 0)
    g_lo, g_hi = data_range(grads, shift)
    drawn = [f for f in fmts if all(abs(v) <= _DRAW_LIMIT for v in format_window(f))]
    marks = [v for f in drawn for v in format_window(f)]
    lo = min(a_lo, g_lo, *(int(math.floor(v)) for v in marks)) - 2
    hi = max(a_hi, g_hi, *(int(math.ceil(v)) for v in marks)) + 2

    n = len(mods)
    fig = new_figure((12, min(3.0 + 0.16 * n, 16)))
    axes = fig.subplots(1, 2, sharey=True)
    norm = LogNorm(vmin=1e-6, vmax=1.0)
    x_edges = np.concatenate([[lo - 3.5, lo - 2.5], np.arange(lo, hi + 2)])  # the zero column, a gap, binades
    y_edges = np.arange(n + 1)
    mesh = None
    for ax, hists, s, what in (
        (axes[0], acts, 0, "module outputs (activations)"),
        (
            axes[1],
            grads,
            shift,
            "gradients of the outputs" + (f" × loss scale 2^{shift}" if shift else " (loss scale 1)"),
        ),
    ):
        m = _matrix(hists, s, lo, hi)
        # pcolormesh wants one edge more than cells: zero column [lo-3.5, lo-2.5], a blank gap, then binades
        cells = np.concatenate([m[:, :1], np.full((n, 1), np.nan), m[:, 1:]], axis=1)
        mesh = ax.pcolormesh(x_edges, y_edges, cells, norm=norm, cmap="viridis", shading="flat")
        for f in drawn:
            lost, over = format_window(f)
            ax.axvline(lost, color=format_color(f), ls="--", lw=1.4)
            ax.axvline(over, color=format_color(f), ls="-", lw=1.4)
        ax.set_title(what, fontsize="medium")
        ticks = [t for t in range(int(math.ceil((lo + 2) / 8) * 8), hi + 1, 8)]  # clear of the zeros' label
        ax.set_xticks([lo - 3] + ticks, ["zeros"] + [str(t) for t in ticks])
        ax.set_xlim(lo - 3.5, hi + 1)
        ax.set_xlabel("log₂ |value|   (column k holds 2ᵏ ≤ |x| < 2ᵏ⁺¹)")
        ax.grid(axis="x", alpha=0.25)
    step = max(1, math.ceil(n / max_modules))
    axes[0].set_yticks(
        np.arange(0, n, step) + 0.5,
        [mods[i].label for i in range(0, n, step)],
        fontsize="x-small" if n > 30 else "small",
    )
    axes[0].set_ylim(n, 0)
    axes[0].set_ylabel("module, in execution order")
    fig.colorbar(mesh, ax=list(axes), label="share of the module's values (log scale)", shrink=0.8)
    handles = []
    for f in fmts:
        lost, over = format_window(f)
        if f in drawn:
            handles.append(
                Line2D(
                    [], [], color=format_color(f), ls="--", label=f"{f.name}: rounds to 0 left of this (|x| ≤ 2^{lost})"
                )
            )
            handles.append(
                Line2D(
                    [],
                    [],
                    color=format_color(f),
                    ls="-",
                    label=f"{f.name}: max {f.max:g}; |x| {_overflow_from(f)} overflows",
                )
            )
        else:
            handles.append(
                Line2D(
                    [],
                    [],
                    color=format_color(f),
                    ls=":",
                    label=f"{f.name}: window 2^{lost} … {f.max:.3g}, wider than the axis",
                )
            )
    fig.legend(handles=handles, loc="outside lower center", ncol=2, fontsize="small")
    fig.suptitle(f"{report.model_type}: where each module's values lie, and each format's window")
    return fig


def report_table(reports: dict, formats: Sequence[str] | None = None) -> HTML:
    """One row per model: its size and, per format, the verdict, the loss-scale window and the first inf/NaN.

    Parameters
    ----------
    reports : dict label → :class:`~mpt_lab.report.PrecisionReport`
    formats : format names (default: the first report's formats)

    Returns
    -------
    HTML table (:func:`~mpt_lab.figures._base.table_html`): model, parameters, modules, then per format the
    report's verdict (:meth:`~mpt_lab.report.PrecisionReport.verdict`), its loss-scale window [low, high] (powers
    of two) and where the format's step first turns inf/NaN: the module, the pass and, when the step was recorded op
    by op, the ATen op ("–": nowhere).  The
    full sentences are each report's :meth:`~mpt_lab.report.PrecisionReport.recommendation`.

    Raises
    ------
    TypeError
        ``reports`` is not a non-empty dict of PrecisionReports.
    """
    if (
        not isinstance(reports, dict)
        or not reports
        or not all(isinstance(r, PrecisionReport) for r in reports.values())
    ):
        raise TypeError("reports must be a non-empty dict of label → PrecisionReport")
    fmts = list(formats) if formats is not None else next(iter(reports.values())).formats
    head = ["model", "parameters", "modules"]
    for f in fmts:
        head += [f"{f}: verdict", f"{f}: window", f"{f}: first inf/NaN"]
    rows = []
    for label, r in reports.items():
        row = [html.escape(label), f"{r.n_parameters:,}", str(len(r.modules))]
        for f in fmts:
            low, high = r.loss_scale_window(f)
            first = r.first_nonfinite(f)
            op = getattr(first, "op", None)
            row += [
                html.escape(r.verdict(f)),
                f"empty ({pow2(low)} > {pow2(high)})"
                if low is not None and high is not None and low > high
                else f"[{pow2(low)}, {pow2(high)}]",
                "–"
                if first is None
                else f"<code>{html.escape(first[0] or '(model)')}</code> ({first[1]}"
                + (f", <code>{html.escape(op)}</code>" if op else "")
                + ")",
            ]
        rows.append(row)
    align = ["left", "right", "right"] + ["left"] * (len(head) - 3)
    return table_html(head, rows, align=align)


def _overflow_from(f: F.FloatFormat) -> str:
    """Where round-to-nearest-even overflows ``f``: at and above max + ½ ulp when the tie rounds away from max (its
    mantissa field odd: FP16's 65,520), strictly above it when the tie rounds back to max (E4M3's 464)."""
    half = f.max + float(F.ulp(f.max, f)) / 2
    return f"≥ {half:g}" if f.max_mantissa_field % 2 else f"> {half:g}"


def plot_loss_scales(monitors: dict, title: str | None = None) -> Figure:
    """The loss scale per step of each :class:`~mpt_lab.report_monitor.PrecisionMonitor` (log2 axis), skipped
    steps marked with crosses.

    Parameters
    ----------
    monitors : dict label → PrecisionMonitor (with a scaler: steps without a scale are not drawn)
    title : the figure's title (None: "The loss scale at each step of N training loops with a GradScaler", N the
        number of monitors)

    Returns
    -------
    Figure: x the step, y log2 of the loss scale the step ran at; a cross where the step was skipped (a gradient
    held inf/NaN); the dashed line is scale 1.

    Raises
    ------
    TypeError
        ``monitors`` is not a non-empty dict of PrecisionMonitors.
    """

    if (
        not isinstance(monitors, dict)
        or not monitors
        or not all(isinstance(m, PrecisionMonitor) for m in monitors.values())
    ):
        raise TypeError("monitors must be a non-empty dict of label → PrecisionMonitor")
    fig = new_figure((8, 3.8))
    ax = fig.add_subplot(1, 1, 1)
    for i, (label, mon) in enumerate(monitors.items()):
        steps = [r["step"] for r in mon.history if r["scale"] is not None]
        scales = [math.log2(r["scale"]) for r in mon.history if r["scale"] is not None]
        skipped = [(r["step"], math.log2(r["scale"])) for r in mon.history if r["scale"] is not None and r["skipped"]]
        color = f"C{i}"
        ax.plot(steps, scales, "-o", color=color, markersize=3, label=label)
        if skipped:
            ax.plot([s for s, _ in skipped], [v for _, v in skipped], "x", color=color, markersize=9)
    ax.axhline(0.0, color="0.5", linestyle="--", linewidth=1)
    ax.set_xlabel("training step")
    ax.set_ylabel("log2 of the loss scale")
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))  # the scales are powers of two
    if title is None:
        n = len(monitors)
        title = f"The loss scale at each step of {n} training loop{'s' if n > 1 else ''} with a GradScaler"
    ax.set_title(title)
    ax.legend(
        loc="upper center",
        bbox_to_anchor=(0.5, -0.2),
        ncol=2,
        fontsize=8,
        title="× a skipped step (a gradient held inf/NaN)",
        title_fontsize=8,
    )
    return fig
