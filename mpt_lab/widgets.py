"""The interactive bit explorer, and the static HTML tables that stand in for it in the rendered book.

* :func:`bits_html` draws one value's bits coloured by field (sign | exponent | mantissa) with its formula;
* :func:`format_table_html` is the table of every format in the catalogue;
* :func:`value_table_html` shows chosen values stored in several formats;
* :class:`BitExplorer` (ipywidgets): toggle bits and see the value; type a value and see its bits in every
  format.  Its state changes through :meth:`BitExplorer.set_value` and :meth:`BitExplorer.toggle`, which the
  widgets call and tests can call directly.
"""

from __future__ import annotations

import html
import math
from typing import Sequence

import numpy as np

from . import formats as F

__all__ = ["HTML", "table_html", "bits_html", "format_table_html", "value_table_html", "BitExplorer", "bit_explorer",
           "FIELD_COLORS"]

FIELD_COLORS = {"sign": "#f4a6a6", "exponent": "#a6c8f4", "mantissa": "#b9e4b0"}


class HTML(str):
    """An HTML string that Jupyter displays as HTML (and prints as its source)."""

    def _repr_html_(self) -> str:
        return str(self)


def _fmt_num(v: float) -> str:
    if v is None:
        return "–"
    if isinstance(v, float) and (math.isnan(v) or math.isinf(v)):
        return str(v)
    if v == 0:
        return "0"
    a = abs(v)
    if 1e-4 <= a < 1e7 and float(v) == float(f"{v:.10g}"):
        return f"{v:.10g}"
    mant, e = math.frexp(a)
    if mant == 0.5:
        return f"{'−' if v < 0 else ''}2^{e - 1}"
    return f"{v:.6g}"


def _bit_cells(d: F.Decomposition) -> str:
    f = d.fmt
    bits = d.bits.replace(" ", "")
    fields = (["sign"] if f.signed else []) + ["exponent"] * f.exponent_bits + ["mantissa"] * f.mantissa_bits
    cells = "".join(
        f'<td style="background:{FIELD_COLORS[k]};font-family:monospace;padding:1px 3px;text-align:center" '
        f'title="{k}">{b}</td>' for b, k in zip(bits, fields))
    return f'<table style="border-collapse:collapse;display:inline-table"><tr>{cells}</tr></table>'


def _formula(d: F.Decomposition) -> str:
    f = d.fmt
    sign = "−" if d.sign else "+"
    if d.kind in ("infinity", "nan"):
        return f"{sign}{'∞' if d.kind == 'infinity' else 'NaN'} (exponent field all ones)"
    lead = "1" if d.kind == "normal" else "0"
    mant = format(d.mantissa, f"0{f.mantissa_bits}b") if f.mantissa_bits else ""
    sig = f"{lead}.{mant}₂" if mant else f"{lead}₂"
    exp_note = (f"2^({d.exponent} − {f.bias})" if d.kind == "normal" else f"2^{f.emin} (subnormal: 1 − bias)")
    return f"{sign}{sig} × {exp_note} = {_fmt_num(d.value)}"


def bits_html(x, fmt="FP32") -> HTML:
    """One value's stored bits in ``fmt``, coloured by field, with kind and formula (HTML).

    Parameters
    ----------
    x : float (rounded to fmt with round-to-nearest-even)
    fmt : FloatFormat or str

    Raises
    ------
    TypeError
        ``x`` is not a real number.
    """
    if not isinstance(x, (int, float, np.floating, np.integer)) or isinstance(x, bool):
        raise TypeError(f"x must be a real number, got {type(x).__name__}")
    fmt = F.get_format(fmt)
    d = F.decompose(float(x), fmt)
    return HTML(f'<div style="margin:4px 0"><b>{fmt.name}</b> {_bit_cells(d)} '
                f'<span style="margin-left:8px">{d.kind}: {html.escape(_formula(d))}</span></div>')


def table_html(header: Sequence[str], rows: Sequence[Sequence], caption: str = "") -> HTML:
    """A plain HTML table (cells are inserted as given: escape text yourself, or pass numbers)."""
    th = "".join(f'<th style="text-align:right;padding:2px 8px">{html.escape(str(h))}</th>' for h in header)
    body = "".join("<tr>" + "".join(f'<td style="text-align:right;padding:2px 8px">{c}</td>' for c in r) + "</tr>"
                   for r in rows)
    cap = f"<caption>{html.escape(caption)}</caption>" if caption else ""
    return HTML(f'<table class="mpt-table">{cap}<thead><tr>{th}</tr></thead><tbody>{body}</tbody></table>')


def format_table_html(formats: Sequence = tuple(F.FORMATS)) -> HTML:
    """The catalogue as a table: bits, fields, bias, max, smallest normal/subnormal, epsilon, decimal digits.

    Every number comes from :class:`mpt_lab.formats.FloatFormat`.
    """
    header = ["format", "bits", "exponent bits", "mantissa bits", "bias", "max", "smallest normal",
              "smallest subnormal", "epsilon", "decimal digits", "inf", "NaN"]
    rows = []
    for f in formats:
        f = F.get_format(f)
        s = f.summary()
        rows.append([f.name, s["bits"], s["exponent"], s["mantissa"], s["bias"], _fmt_num(s["max"]),
                     _fmt_num(s["smallest normal"]), _fmt_num(s["smallest subnormal"]),
                     _fmt_num(s["epsilon"]), f"{s['decimal digits']:.2f}", "yes" if f.infinities else "no",
                     {"ieee": "IEEE", "single": "one code", "none": "none"}[f.nan]])
    return table_html(header, rows)


def value_table_html(values: Sequence[float], formats: Sequence = ("FP32", "BF16", "FP16", "FP8_E4M3", "FP8_E5M2"),
                     ) -> HTML:
    """Each value stored in each format: bits (coloured), stored value and relative error (HTML).

    This is the static version of the bit explorer for readers of the rendered book.
    """
    fmts = [F.get_format(f) for f in formats]
    rows = []
    for v in values:
        for f in fmts:
            d = F.decompose(float(v), f)
            err = "–"
            if math.isfinite(d.value) and v != 0:
                err = f"{abs(d.value - v) / abs(v):.2e}"
            rows.append([_fmt_num(float(v)), f.name, _bit_cells(d), d.kind, _fmt_num(d.value), err])
    return table_html(["x", "format", "bits (sign | exponent | mantissa)", "kind", "stored value", "relative error"],
                  rows)


class BitExplorer:
    """Interactive bits of one format: toggle a bit to see the value, type a value to see the bits.

    Parameters
    ----------
    fmt : FloatFormat or str
        The format whose bits are shown as toggle buttons.
    value : float
        The initial value (rounded to fmt).
    compare : sequence of formats
        Formats in which the typed value is also shown.

    Attributes
    ----------
    code : int
        The current bit pattern; :attr:`value` its value; :attr:`widget` the ipywidgets box to display.
    """

    def __init__(self, fmt="FP16", value: float = -314.625, compare: Sequence = ("FP32", "BF16", "FP16",
                                                                                   "FP8_E4M3", "FP8_E5M2")):
        import ipywidgets as W

        self.fmt = F.get_format(fmt)
        self.compare = [F.get_format(f) for f in compare]
        self._updating = False
        self._W = W
        self.code = 0
        self.format_box = W.Dropdown(options=list(F.FORMATS), value=self.fmt.name, description="format")
        self.value_box = W.Text(value=repr(float(value)), description="value", continuous_update=False)
        self.out = W.HTML()
        self.table = W.HTML()
        self.bit_row = W.HBox()
        self.format_box.observe(self._on_format, names="value")
        self.value_box.observe(self._on_text, names="value")
        self._build_bits()
        self.set_value(float(value))
        self.widget = W.VBox([W.HBox([self.format_box, self.value_box]), self.bit_row, self.out, self.table])

    # --- state changes (called by the widgets, callable directly) -------------------------------------------
    def set_value(self, x: float) -> None:
        """Round ``x`` to the format and show its bits (and the value in the comparison formats)."""
        if not isinstance(x, (int, float, np.floating)) or isinstance(x, bool):
            raise TypeError(f"x must be a real number, got {type(x).__name__}")
        self.typed = float(x)
        self._set_code(int(F.encode(float(x), self.fmt)))
        self.table.value = str(value_table_html([self.typed], self.compare))

    def toggle(self, i: int) -> None:
        """Flip bit ``i`` (0 = most significant, the sign bit of signed formats)."""
        if not isinstance(i, int) or not 0 <= i < self.fmt.bits:
            raise ValueError(f"i must be an int in [0, {self.fmt.bits}), got {i!r}")
        self._set_code(self.code ^ (1 << (self.fmt.bits - 1 - i)))

    def set_format(self, fmt) -> None:
        """Show another format, keeping the typed value."""
        self.fmt = F.get_format(fmt)
        self._build_bits()
        self.set_value(self.typed)

    @property
    def value(self) -> float:
        return F.decode(self.code, self.fmt)

    @property
    def decomposition(self) -> F.Decomposition:
        return F.Decomposition(self.code, self.fmt, scalar=True)

    # --- widget plumbing ----------------------------------------------------------------------------------
    def _build_bits(self):
        W = self._W
        f = self.fmt
        kinds = (["sign"] if f.signed else []) + ["exponent"] * f.exponent_bits + ["mantissa"] * f.mantissa_bits
        self.buttons = []
        for i, k in enumerate(kinds):
            b = W.ToggleButton(value=False, description="0", tooltip=f"{k} bit",
                               layout=W.Layout(width="30px", padding="0"))
            b.style.button_color = FIELD_COLORS[k]
            b.observe(lambda change, i=i: self._on_bit(i, change), names="value")
            self.buttons.append(b)
        self.bit_row.children = self.buttons

    def _set_code(self, code: int) -> None:
        self.code = code
        self._updating = True
        try:
            for i, b in enumerate(self.buttons):
                bit = (code >> (self.fmt.bits - 1 - i)) & 1
                b.value = bool(bit)
                b.description = str(bit)
        finally:
            self._updating = False
        d = self.decomposition
        self.out.value = (f"<div>code 0x{code:0{(self.fmt.bits + 3) // 4}x} · {d.kind} · "
                          f"{html.escape(_formula(d))}</div>")

    def _on_bit(self, i, change):
        if not self._updating:
            self.toggle(i)

    def _on_text(self, change):
        try:
            x = float(change["new"])
        except ValueError:
            self.out.value = f"<div style='color:#b00'>not a number: {html.escape(change['new'])}</div>"
            return
        self.set_value(x)

    def _on_format(self, change):
        self.set_format(change["new"])


def bit_explorer(fmt="FP16", value: float = -314.625):
    """Build a :class:`BitExplorer` and return its widget for display in Jupyter."""
    return BitExplorer(fmt, value).widget
