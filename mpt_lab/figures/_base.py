"""What every figure and table of the book shares: the figure class, colours, a running mean, the HTML table."""

from __future__ import annotations

import html
import io
from collections.abc import Iterable, Sequence

import numpy as np
from matplotlib.figure import Figure

from .. import formats as F
from ..recipes import RECIPES

__all__ = [
    "BookFigure",
    "new_figure",
    "FORMAT_COLORS",
    "recipe_style",
    "format_color",
    "as_formats",
    "running_mean",
    "HTML",
    "table_html",
    "pct",
    "pow2",
    "binade",
    "power_text",
    "mib",
]

FORMAT_COLORS = {
    "FP64": "#4d4d4d",
    "FP32": "#1f77b4",
    "TF32": "#17becf",
    "FP16": "#d62728",
    "BF16": "#2ca02c",
    "FP8_E4M3": "#9467bd",
    "FP8_E5M2": "#8c564b",
    "FP6_E3M2": "#e377c2",
    "FP6_E2M3": "#bcbd22",
    "FP4_E2M1": "#ff7f0e",
    "E8M0": "#7f7f7f",
}


def recipe_style(name: str) -> tuple:
    """(label, colour, line style) of recipe ``name``, the same in every chapter: the recipe's own in
    :data:`mpt_lab.recipes.RECIPES` (FP32 blue, FP16 red, BF16 green; FP8 per tensor purple; MX and NVFP4 brown to
    orange; BF16 weights without FP32 masters light green and cyan).  A name ending in ``_hw`` (a recipe run on FP8
    tensor cores) is that recipe's colour, dotted; an unknown name is itself, dark grey, solid."""
    hardware = name.endswith("_hw")
    recipe = RECIPES.get(name[:-3] if hardware else name)
    if recipe is None:
        return name, "#333333", "-"
    return recipe.label, recipe.color, ":" if hardware else recipe.linestyle


class BookFigure(Figure):
    """A matplotlib Figure that Jupyter shows as a PNG wherever it is the value of a cell.

    The book's figures are created without pyplot, so they appear exactly once (where returned) and never
    leak into later cells; this repr makes them display even where no inline backend was set up.
    """

    def _repr_png_(self) -> bytes:
        buf = io.BytesIO()
        self.savefig(buf, format="png", dpi=110)
        return buf.getvalue()


def new_figure(figsize=(9, 4.5)) -> BookFigure:
    """A :class:`BookFigure` with constrained layout (inches)."""
    return BookFigure(figsize=figsize, layout="constrained")


def format_color(fmt: F.FloatFormat) -> str:
    """The book's colour of a format in every figure (a CSS colour string): :data:`FORMAT_COLORS`, dark grey for
    a format it does not list."""
    return FORMAT_COLORS.get(fmt.name, "#333333")


def as_formats(fmts, argname: str = "formats") -> list:
    """A list of FloatFormats from a format, a name, or a sequence of them.  Raises TypeError/ValueError."""
    if isinstance(fmts, (str, F.FloatFormat)):
        fmts = [fmts]
    if not isinstance(fmts, Iterable):
        raise TypeError(f"{argname} must be a format or a sequence of formats, got {type(fmts).__name__}")
    out = [F.get_format(f, argname) for f in fmts]
    if not out:
        raise ValueError(f"{argname} must name at least one format")
    return out


def running_mean(values, window: int) -> tuple[np.ndarray, np.ndarray]:
    """Running mean of a 1-D sequence over ``window`` values, skipping non-finite ones.

    Returns ``(x, mean)``: x holds the 1-based index of the last value of each window (so the curve of a
    per-step quantity lines up with the step axis); a window that contains a non-finite value gives NaN (a
    gap in the curve, not a misleading finite average).
    """
    v = np.asarray(values, dtype=float)
    if v.ndim != 1 or v.size == 0:
        raise ValueError("values must be a non-empty 1-D sequence")
    w = max(1, min(int(window), v.size))
    bad = ~np.isfinite(v)
    mean = np.convolve(np.where(bad, 0.0, v), np.ones(w) / w, mode="valid")
    mean[np.convolve(bad.astype(float), np.ones(w), mode="valid") > 0] = np.nan
    return np.arange(w, v.size + 1), mean


#: Tables with at least this many columns are set in a smaller font in the book (class ``mpt-table-wide``).
WIDE_TABLE_COLUMNS = 9


class HTML(str):
    """An HTML string that Jupyter displays as HTML (and prints as its source)."""

    def _repr_html_(self) -> str:
        return str(self)


def table_html(
    header: Sequence[str], rows: Sequence[Sequence], caption: str = "", align: Sequence[str] | None = None
) -> HTML:
    """The book's one HTML table builder.

    ``header``: column titles (escaped); ``rows``: cells inserted as given (numbers, or text that is already
    HTML: escape your own strings with ``html.escape``); ``caption``: escaped; ``align``: "left" or "right" per
    column, header and cells alike (default: the first column, which names the row, left; the others, which hold
    numbers, right).  Cells wrap; a table of :data:`WIDE_TABLE_COLUMNS` or more columns gets the class
    ``mpt-table-wide``, which the book's stylesheet (``book/_static/book.css``) sets in a smaller font, so that at
    1280 px every table fits the text column.  On narrower screens the table scrolls inside its own box, so a wide
    table never makes the page scroll sideways.

    Raises ValueError if ``align`` does not give "left" or "right" for each column of ``header``.
    """
    if align is None:
        align = ["left"] + ["right"] * (len(header) - 1)
    elif len(align) != len(header) or any(a not in ("left", "right") for a in align):
        raise ValueError(f"align must give 'left' or 'right' for each of the {len(header)} columns, got {align!r}")

    def cell(tag, i, c):
        return f'<{tag} style="text-align:{align[i]};padding:2px 5px">{c}</{tag}>'

    th = "".join(cell("th", i, html.escape(str(h))) for i, h in enumerate(header))
    body = "".join("<tr>" + "".join(cell("td", i, c) for i, c in enumerate(r)) + "</tr>" for r in rows)
    cap = f"<caption>{html.escape(caption)}</caption>" if caption else ""
    classes = "mpt-table mpt-table-wide" if len(header) >= WIDE_TABLE_COLUMNS else "mpt-table"
    return HTML(
        f'<div style="overflow-x:auto;max-width:100%"><table class="{classes}">{cap}<thead><tr>{th}</tr>'
        f"</thead><tbody>{body}</tbody></table></div>"
    )


def pct(v, digits: int = 3) -> str:
    """A share (0 to 1) as a percentage with ``digits`` significant digits; "–" for None or NaN."""
    if v is None or (isinstance(v, float) and not np.isfinite(v)):
        return "–"
    return f"{100 * v:.{digits}g}%"


def pow2(v) -> str:
    """A power of two as HTML 2<sup>k</sup>; "∞" for inf, "–" for None."""
    if v is None:
        return "–"
    if not np.isfinite(v):
        return "∞"
    return binade(int(np.frexp(v)[1]) - 1)


_SUPERSCRIPT = str.maketrans("-0123456789", "⁻⁰¹²³⁴⁵⁶⁷⁸⁹")


def power_text(k: int) -> str:
    """2ᵏ as plain text with Unicode superscripts (e.g. "2⁻²⁴"), for headers and labels."""
    return "2" + str(int(k)).translate(_SUPERSCRIPT)


def binade(k) -> str:
    """The binade 2ᵏ as HTML (2<sup>k</sup>); "–" for None."""
    return "–" if k is None else f"2<sup>{int(k)}</sup>"


def mib(b, digits: int = 2) -> str:
    """Bytes in MiB (2²⁰ bytes); "–" for None."""
    return "–" if b is None else f"{b / 2**20:,.{digits}f}"
