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
from decimal import Decimal
from fractions import Fraction
from typing import Sequence

import numpy as np

from . import formats as F
from .figures import HTML, table_html   # the book's one table builder (re-exported here)

__all__ = ["HTML", "table_html", "bits_html", "format_table_html", "value_table_html", "BitExplorer", "bit_explorer",
           "FIELD_COLORS"]

FIELD_COLORS = {"sign": "#f4a6a6", "exponent": "#a6c8f4", "mantissa": "#b9e4b0"}


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
        f'<td style="background:{FIELD_COLORS[k]};font-family:monospace;font-size:0.85em;padding:0 2px;text-align:center" '
        f'title="{k}">{b}</td>' for b, k in zip(bits, fields))
    return f'<table style="border-collapse:collapse;display:inline-table"><tr>{cells}</tr></table>'


def _formula(d: F.Decomposition) -> str:
    """The value's formula with the biased and the unbiased exponent (IEEE 754-2019 §3.4), as plain text."""
    f = d.fmt
    sign = "−" if d.sign else "+"
    if d.kind == "infinity":
        return f"{sign}∞ (exponent field all ones, mantissa 0)"
    if d.kind == "nan":
        return ("NaN (exponent field all ones, mantissa ≠ 0)" if f.nan == "ieee"
                else "NaN (exponent and mantissa fields all ones: the format's only NaN)")
    lead = "1" if d.kind == "normal" else "0"
    mant = format(d.mantissa, f"0{f.mantissa_bits}b") if f.mantissa_bits else ""
    sig = f"{lead}.{mant}₂" if mant else f"{lead}₂"
    signed = f"{'−' if d.sign else ''}{sig}" if f.signed else sig
    if d.kind == "normal":
        return f"{signed} × 2^({d.exponent} − {f.bias}) = {signed} × 2^{d.unbiased_exponent} = {_fmt_num(d.value)}"
    return (f"{signed} × 2^{f.emin} = {_fmt_num(d.value)} ({d.kind}: exponent = emin = 1 − bias = {f.emin})")


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
                     _nan_codes(f)])
    return table_html(header, rows)


def _nan_codes(f: F.FloatFormat) -> str:
    """How many codes are NaN, and which: counted from the format's fields, not typed in."""
    signs = 2 if f.signed else 1
    if f.nan == "none":
        return "none"
    if f.nan == "single":   # the all-ones code, once per sign
        return f"{signs} ({'±' if signs == 2 else ''}all ones)"
    n = signs * ((1 << f.mantissa_bits) - 1)   # IEEE: exponent all ones, mantissa ≠ 0
    return f"{n:,} (IEEE: exponent all ones, mantissa ≠ 0)" if n < 1e6 else \
        f"2^{f.mantissa_bits + signs - 1} − {signs} (IEEE: exponent all ones, mantissa ≠ 0)"


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
    """Interactive bits of one format: click a bit to flip it, type a value to see its bits.

    The bits are buttons coloured by field (:data:`FIELD_COLORS`: sign, exponent, mantissa; a set bit is
    bold); below them the code, kind, formula and exact stored value, and a table of the current value
    stored in the comparison formats.  Typing a value rounds it to the format (round-to-nearest-even);
    flipping a bit makes the stored value the current value, so the value box, the bits, the formula and
    the table always show the same number.

    Parameters
    ----------
    fmt : FloatFormat or str
        The format whose bits are shown.
    value : float
        The initial value (rounded to fmt).
    compare : sequence of formats
        Formats in which the current value is also shown.

    Attributes
    ----------
    code : int
        The current bit pattern; :attr:`value` its value; :attr:`typed` the current value before rounding
        (a float); :attr:`widget` the ipywidgets box to display (CSS class ``mpt-bit-explorer-widget``; bit
        ``i`` has class ``mpt-bit-{i}``).

    The value box accepts a decimal (``-314.625``, ``1e-7``), a fraction (``1/3``), a hexadecimal float
    (``0x1.8p3``), ``inf``/``nan``, or a raw code: ``0x`` without ``p`` (``0x3C00``) or ``0b…``, as the
    rendered book's JavaScript explorer (``book/_static/bit_explorer.js``).
    """

    def __init__(self, fmt="FP16", value: float = -314.625, compare: Sequence = ("FP32", "BF16", "FP16",
                                                                                   "FP8_E4M3", "FP8_E5M2")):
        import ipywidgets as W

        self.fmt = F.get_format(fmt)
        self.compare = [F.get_format(f) for f in compare]
        self._updating = False
        self._W = W
        self.code = 0
        self.typed = 0.0
        self.format_box = W.Dropdown(options=list(F.FORMATS), value=self.fmt.name, description="format")
        self.value_box = W.Text(value=repr(float(value)), description="value", continuous_update=False,
                                tooltip="a value (-314.625, 1e-7, 1/3, 0x1.8p3, inf, nan) or a code (0x3C00, 0b…)")
        self.out = W.HTML()
        self.table = W.HTML()
        self.bit_row = W.HBox(layout=W.Layout(flex_flow="row wrap"))
        self.format_box.observe(self._on_format, names="value")
        self.value_box.observe(self._on_text, names="value")
        self._build_bits()
        self.set_value(float(value))
        self.widget = W.VBox([W.HBox([self.format_box, self.value_box]), self.bit_row, self.out, self.table])
        self.widget.add_class("mpt-bit-explorer-widget")

    # --- state changes (called by the widgets, callable directly) -------------------------------------------
    def set_value(self, x: float) -> None:
        """Round ``x`` to the format (round-to-nearest-even) and show its bits, and x in the other formats.

        Raises ``TypeError`` for a non-number and ``ValueError`` for NaN in a format without NaN (FP6, FP4).
        """
        if not isinstance(x, (int, float, np.floating)) or isinstance(x, bool):
            raise TypeError(f"x must be a real number, got {type(x).__name__}")
        code = int(F.encode(float(x), self.fmt))
        self.typed = float(x)
        self._show(code, text=None)

    def set_code(self, code: int) -> None:
        """Store the bit pattern ``code``; its value becomes the current value (value box and table follow)."""
        if not isinstance(code, (int, np.integer)) or isinstance(code, bool):
            raise TypeError(f"code must be an int, got {type(code).__name__}")
        if not 0 <= int(code) < (1 << self.fmt.bits):
            raise ValueError(f"code must lie in [0, 2**{self.fmt.bits}) for {self.fmt.name}, got {code}")
        code = int(code)
        self.typed = float(F.decode(code, self.fmt))
        self._show(code, text=repr(self.typed))

    def toggle(self, i: int) -> None:
        """Flip bit ``i`` (0 = most significant, the sign bit of signed formats)."""
        if not isinstance(i, (int, np.integer)) or isinstance(i, bool) or not 0 <= i < self.fmt.bits:
            raise ValueError(f"i must be an int in [0, {self.fmt.bits}), got {i!r}")
        self.set_code(self.code ^ (1 << (self.fmt.bits - 1 - int(i))))

    def set_format(self, fmt) -> None:
        """Show another format, keeping the current value (rounded to the new format)."""
        self.fmt = F.get_format(fmt)
        if self.format_box.value != self.fmt.name:
            self._updating = True
            try:
                self.format_box.value = self.fmt.name
            finally:
                self._updating = False
        self._build_bits()
        try:
            self.set_value(self.typed)
        except ValueError as e:  # NaN into FP6/FP4, which have none
            self.typed = 0.0
            self._show(int(F.encode(0.0, self.fmt)), text="0.0")
            self.out.value += f"<div style='color:#b00'>{html.escape(str(e))}; showing 0</div>"

    @property
    def value(self) -> float:
        """The stored value (float64; exact)."""
        return F.decode(self.code, self.fmt)

    @property
    def bits(self) -> list:
        """The bits of :attr:`code`, most significant first (what the buttons show)."""
        return [(self.code >> (self.fmt.bits - 1 - i)) & 1 for i in range(self.fmt.bits)]

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
            # Button honours style.button_color in ipywidgets 8 (ToggleButton does not: its bits were grey)
            b = W.Button(description="0", tooltip=f"bit {f.bits - 1 - i}: {k} (click to flip)",
                         layout=W.Layout(width="30px", padding="0", margin="0 1px 1px 0"))
            b.style.button_color = FIELD_COLORS[k]
            b.add_class(f"mpt-bit-{i}")
            b.add_class(f"mpt-bit-{k}")
            b.on_click(lambda _b, i=i: self.toggle(i))
            self.buttons.append(b)
        self.bit_row.children = self.buttons

    def _show(self, code: int, text) -> None:
        """Make every part show ``code`` (and :attr:`typed`); ``text`` replaces the value box if given."""
        self.code = code
        for b, bit in zip(self.buttons, self.bits):
            b.description = str(bit)
            b.style.font_weight = "bold" if bit else "normal"
        if text is not None and self.value_box.value != text:
            self._updating = True
            try:
                self.value_box.value = text
            finally:
                self._updating = False
        d = self.decomposition
        exact = "" if not math.isfinite(d.value) else f" · exact <code>{format(Decimal(d.value), 'f')}</code>"
        self.out.value = (f"<div>code <code>0x{code:0{(self.fmt.bits + 3) // 4}X}</code> · {d.kind} · "
                          f"{html.escape(_formula(d))}{exact}</div>")
        comparable = [f for f in self.compare if not (math.isnan(self.typed) and f.nan == "none")]
        self.table.value = str(value_table_html([self.typed], comparable))

    def _on_text(self, change):
        if self._updating:
            return
        text = change["new"]
        try:
            kind, v = _parse_text(text)
            if kind == "code":
                self.set_code(v)
            else:
                self.set_value(v)
        except (ValueError, ZeroDivisionError, OverflowError) as e:
            self.out.value = (f"<div style='color:#b00'>not a number: {html.escape(text)} "
                              f"({html.escape(str(e))})</div>")

    def _on_format(self, change):
        if not self._updating:
            self.set_format(change["new"])


def _parse_text(text: str):
    """("code", int) for ``0x…`` without ``p`` or ``0b…``; otherwise ("value", float) (decimal, a/b, hex float).

    Raises ``ValueError`` for anything else.
    """
    t = text.strip().replace("_", "").replace(" ", "").replace("−", "-").replace("∞", "inf").lower()
    if t.startswith(("0x", "0b")) and "p" not in t:
        return "code", int(t, 0)
    if t.lstrip("+-").startswith("0x"):
        return "value", float.fromhex(t)
    if "/" in t:
        return "value", float(Fraction(t))
    return "value", float(t)


def bit_explorer(fmt="FP16", value: float = -314.625):
    """Build a :class:`BitExplorer` and return its widget for display in Jupyter."""
    return BitExplorer(fmt, value).widget
