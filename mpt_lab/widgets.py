"""The interactive bit explorer, and the static HTML tables that stand in for it in the rendered book.

* :func:`bits_html` draws one value's bits coloured by field (sign | exponent | mantissa) with its formula;
* :func:`format_table_html` is the table of every format in the catalogue;
* :func:`value_table_html` shows chosen values stored in several formats;
* :class:`BitExplorer` (ipywidgets): toggle bits and see the value; type a value and see its bits, its
  neighbours, its ulp and how it rounds (to nearest even, toward zero, to nearest even with saturation, and
  stochastically), as the rendered book's JavaScript explorer (``book/_static/bit_explorer.js``) shows them,
  and the value in other formats.  Its state changes through :meth:`BitExplorer.set_value` and
  :meth:`BitExplorer.toggle`, which the widgets call and tests can call directly; what it shows is also
  available as data (:attr:`BitExplorer.neighbours`, :attr:`BitExplorer.ulp`, :attr:`BitExplorer.roundings`).
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence
from decimal import Decimal
from fractions import Fraction

import numpy as np

from . import formats as F
from .figures import HTML, table_html  # the book's one table builder (re-exported here)

__all__ = [
    "HTML",
    "table_html",
    "bits_html",
    "format_table_html",
    "value_table_html",
    "BitExplorer",
    "bit_explorer",
    "FIELD_COLORS",
    "ROUNDINGS",
    "neighbours",
    "rounding_table",
]

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


# ---- exact numbers, shown as bit_explorer.js shows them ----------------------------------------------------
def _exact_str(q) -> str:
    """An exact value as text, as bit_explorer.js's ``exactString``: the decimal expansion when the denominator
    is 2ᵃ5ᵇ (every stored value), else ``n/d``; a float: ``-0`` for negative zero, ``inf``, ``-inf``, ``nan``,
    ``-nan`` (a NaN with its sign bit set, as decoded from a negative NaN code)."""
    if isinstance(q, float):
        if math.isnan(q):
            return "-nan" if math.copysign(1.0, q) < 0 else "nan"
        if math.isinf(q):
            return "inf" if q > 0 else "-inf"
        if q == 0:
            return "-0" if math.copysign(1.0, q) < 0 else "0"
        q = Fraction(q)
    sign = "-" if q < 0 else ""
    n, d = abs(q.numerator), q.denominator
    a = (d & -d).bit_length() - 1
    rest, b = d >> a, 0
    while rest % 5 == 0:
        rest //= 5
        b += 1
    if rest != 1:
        return f"{sign}{n}/{d}"
    k = max(a, b)
    digits = str(n * 2 ** (k - a) * 5 ** (k - b))
    if k == 0:
        return sign + digits
    digits = digits.rjust(k + 1, "0")
    out = (digits[:-k] + "." + digits[-k:]).rstrip("0").rstrip(".")
    return sign + out


def _approx_str(q, digits: int = 9) -> str:
    """≈ q with ``digits`` significant digits (display only)."""
    if isinstance(q, float) and not math.isfinite(q):
        return _exact_str(q)
    try:
        return f"{float(q):.{digits}g}"
    except OverflowError:  # beyond float64 (a typed 1e400)
        e = len(str(abs(q.numerator))) - len(str(q.denominator))
        return f"{'-' if q < 0 else ''}≈10^{e}"


def _exact_html(q) -> str:
    """The exact value as HTML, as bit_explorer.js's ``exactHtml``: long expansions fold behind ≈."""
    s = _exact_str(q)
    if isinstance(q, float) and not math.isfinite(q):
        return html.escape({"inf": "+∞", "-inf": "−∞"}.get(s, "NaN"))
    code = f'<code class="mpt-be-exact">{html.escape(s)}</code>'
    approx = f'<span class="mpt-be-approx">≈ {html.escape(_approx_str(q))}</span>'
    if len(s) > 60:
        digits = len("".join(ch for ch in s.lstrip("-").lstrip("0.") if ch.isdigit()))
        return f"<details><summary>{approx} (exactly: {digits} significant digits)</summary>{code}</details>"
    return f"{code} {approx}" if len(s) > 24 or "/" in s else code


def _code_hex(fmt: F.FloatFormat, code: int) -> str:
    return f"0x{code:0{(fmt.bits + 3) // 4}X}"


def _finite_code(fmt: F.FloatFormat, code: int):
    """``code`` when it is a code of ``fmt`` holding a finite value, else None."""
    if not 0 <= code < (1 << fmt.bits):
        return None
    kind = F.Decomposition(code, fmt, scalar=True).kind
    return None if kind in ("nan", "infinity") else code


def neighbours(fmt: F.FormatLike, code: int) -> tuple:
    """The codes of the next finite value below and above the value of ``code`` (None where there is none),
    as the JavaScript explorer's neighbours: ±0's neighbours are ∓ the smallest subnormal; NaN and ±∞ have
    none.

    Parameters
    ----------
    fmt : FloatFormat or str
    code : int, a bit pattern of fmt

    Returns
    -------
    (below, above) : int or None each

    Raises
    ------
    TypeError, ValueError
        Unknown format; ``code`` not an int in [0, 2**fmt.bits).
    """
    fmt = F.get_format(fmt)
    if not isinstance(code, (int, np.integer)) or isinstance(code, bool) or not 0 <= int(code) < (1 << fmt.bits):
        raise ValueError(f"code must be an int in [0, 2**{fmt.bits}) for {fmt.name}, got {code!r}")
    code = int(code)
    d = F.Decomposition(code, fmt, scalar=True)
    if d.kind in ("nan", "infinity"):
        return None, None
    if not fmt.signed:
        return _finite_code(fmt, code - 1), _finite_code(fmt, code + 1)
    sign_mask = 1 << (fmt.bits - 1)
    mag, sign = code & (sign_mask - 1), code & sign_mask
    if mag == 0:
        return sign_mask | 1, 1
    larger = _finite_code(fmt, sign | (mag + 1)) if mag + 1 < sign_mask else None
    smaller = sign | (mag - 1)
    return (larger, smaller) if d.sign else (smaller, larger)


#: The explorer's rounding rows, in bit_explorer.js's order: (label, rounding, saturate).
ROUNDINGS = (
    ("round to nearest, ties to even", "nearest_even", False),
    ("round toward zero", "toward_zero", False),
    ("nearest even, saturating", "nearest_even", True),
)


def rounding_table(x: float, fmt: F.FormatLike) -> list:
    """How ``x`` rounds to ``fmt``, exactly: one dict per row of :data:`ROUNDINGS` (the JavaScript explorer's
    rows) and one for stochastic rounding.

    Parameters
    ----------
    x : int, float or Fraction (exact: a typed ``1/3`` is the rational 1/3)
    fmt : FloatFormat or str

    Returns
    -------
    list of dicts.  Deterministic rows: {"label", "rounding", "saturate", "code" (int), "value" (float, the
    stored value), "error" (Fraction stored − x, None when x or the stored value is not finite), "relative"
    (Fraction |error|/|x|, None also for x = 0)}; or {"label", "rounding", "saturate", "message"} when x cannot
    be stored (NaN in FP6/FP4).  The stochastic row (:func:`mpt_lab.formats.round_to` with
    ``rounding="stochastic"``): {"label", "rounding": "stochastic", "down", "up" (codes: the value toward zero
    and the next one away from zero, which may be ±∞ or NaN where the format overflows so), "p_up" (Fraction,
    the probability of ``up``: the share of the gap from ``down`` to the next value already covered, 0 when x
    is stored exactly; at most 1)}, or None in place of the dict when x is not finite.

    Raises
    ------
    TypeError, ValueError
        ``x`` not a real number; unknown format.
    """
    fmt = F.get_format(fmt)
    if not isinstance(x, (int, float, Fraction, np.floating, np.integer)) or isinstance(x, bool):
        raise TypeError(f"x must be a real number, got {type(x).__name__}")
    finite = not (isinstance(x, (float, np.floating)) and not math.isfinite(x))
    xq = Fraction(x) if finite else None
    rows = []
    for label, rounding, saturate in ROUNDINGS:
        try:
            code = int(F.encode(x, fmt, rounding=rounding, saturate=saturate))
        except ValueError as err:
            rows.append({"label": label, "rounding": rounding, "saturate": saturate, "message": str(err)})
            continue
        value = float(F.decode(code, fmt))
        error = relative = None
        if finite and math.isfinite(value):
            error = Fraction(value) - xq
            relative = abs(error) / abs(xq) if xq != 0 else None
        rows.append(
            {
                "label": label,
                "rounding": rounding,
                "saturate": saturate,
                "code": code,
                "value": value,
                "error": error,
                "relative": relative,
            }
        )
    rows.append(_stochastic_row(x, xq, fmt) if finite else None)
    return rows


def _stochastic_row(x, xq: Fraction, fmt: F.FloatFormat) -> dict:
    """Stochastic rounding of the finite x (exactly xq): its two outcomes and the probability of the one
    away from zero."""
    down = int(F.encode(x, fmt, rounding="toward_zero"))
    dv = float(F.decode(down, fmt))
    row = {"label": "stochastic", "rounding": "stochastic", "down": down, "up": down, "p_up": Fraction(0)}
    if not math.isfinite(dv) or Fraction(dv) == xq:
        return row
    p = (abs(xq) - abs(Fraction(dv))) / Fraction(F.ulp(dv, fmt))  # the share of the gap covered
    if p <= 0:  # E8M0 below its smallest value: always that value
        return row
    top = 1 << (fmt.bits - 1 if fmt.signed else fmt.bits)
    mag = down & (top - 1)
    row["up"] = down + 1 if mag + 1 < top else down  # FP6/FP4: beyond max there is only max
    row["p_up"] = min(p, Fraction(1))
    return row


def _bit_cells(d: F.Decomposition) -> str:
    f = d.fmt
    bits = d.bits.replace(" ", "")
    fields = (["sign"] if f.signed else []) + ["exponent"] * f.exponent_bits + ["mantissa"] * f.mantissa_bits
    cells = "".join(
        f'<td style="background:{FIELD_COLORS[k]};font-family:monospace;font-size:0.85em;padding:0 2px;text-align:center" '
        f'title="{k}">{b}</td>'
        for b, k in zip(bits, fields)
    )
    return f'<table style="border-collapse:collapse;display:inline-table"><tr>{cells}</tr></table>'


def _formula(d: F.Decomposition) -> str:
    """The value's formula with the biased and the unbiased exponent (IEEE 754-2019 §3.4), as plain text."""
    f = d.fmt
    sign = "−" if d.sign else "+"
    if d.kind == "infinity":
        return f"{sign}∞ (exponent field all ones, mantissa 0)"
    if d.kind == "nan":
        return (
            "NaN (exponent field all ones, mantissa ≠ 0)"
            if f.nan == "ieee"
            else "NaN (exponent and mantissa fields all ones: the format's only NaN)"
        )
    lead = "1" if d.kind == "normal" else "0"
    mant = format(d.mantissa, f"0{f.mantissa_bits}b") if f.mantissa_bits else ""
    sig = f"{lead}.{mant}₂" if mant else f"{lead}₂"
    signed = f"{'−' if d.sign else ''}{sig}" if f.signed else sig
    if d.kind == "normal":
        return f"{signed} × 2^({d.exponent} − {f.bias}) = {signed} × 2^{d.unbiased_exponent} = {_fmt_num(d.value)}"
    return f"{signed} × 2^{f.emin} = {_fmt_num(d.value)} ({d.kind}: exponent = emin = 1 − bias = {f.emin})"


def bits_html(x: float, fmt: F.FormatLike = "FP32") -> HTML:
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
    return HTML(
        f'<div style="margin:4px 0"><b>{fmt.name}</b> {_bit_cells(d)} '
        f'<span style="margin-left:8px">{d.kind}: {html.escape(_formula(d))}</span></div>'
    )


def format_table_html(formats: Sequence = tuple(F.FORMATS)) -> HTML:
    """The catalogue as a table: bits, fields, bias, max, smallest normal/subnormal, epsilon, decimal digits.

    Every number comes from :class:`mpt_lab.formats.FloatFormat`.  The columns of powers of two (smallest normal,
    smallest subnormal, epsilon) are written one way throughout, 2^k with the decimal value in parentheses; the
    largest value in decimal (and as 2^k where it is one, E8M0).
    """
    header = [
        "format",
        "bits",
        "exponent bits",
        "mantissa bits",
        "bias",
        "max",
        "smallest normal",
        "smallest subnormal",
        "epsilon",
        "decimal digits",
        "inf",
        "NaN",
    ]
    rows = []
    for f in formats:
        f = F.get_format(f)
        s = f.summary()
        rows.append(
            [
                f.name,
                s["bits"],
                s["exponent"],
                s["mantissa"],
                s["bias"],
                _max_cell(s["max"]),
                _pow2_cell(s["smallest normal"]),
                _pow2_cell(s["smallest subnormal"]),
                _pow2_cell(s["epsilon"]),
                f"{s['decimal digits']:.2f}",
                "yes" if f.infinities else "no",
                _nan_codes(f),
            ]
        )
    return table_html(header, rows)


def _pow2_cell(v) -> str:
    """A power of two as "2^k (decimal)", the decimal with three significant digits; "–" for None."""
    if v is None:
        return "–"
    mant, e = math.frexp(v)
    if mant != 0.5:
        raise ValueError(f"expected a power of two, got {v!r}")
    return f"2^{e - 1} ({v:.3g})"


def _max_cell(v: float) -> str:
    """The largest value: its decimal digits when it has few, else three significant digits; a power of two
    also as 2^k."""
    text = f"{v:.10g}" if v < 1e7 and float(v) == float(f"{v:.10g}") else f"{v:.3g}"
    return f"2^{math.frexp(v)[1] - 1} ({text})" if math.frexp(v)[0] == 0.5 else text


def _nan_codes(f: F.FloatFormat) -> str:
    """How many codes are NaN, and which: counted from the format's fields, not typed in."""
    signs = 2 if f.signed else 1
    if f.nan == "none":
        return "none"
    if f.nan == "single":  # the all-ones code, once per sign
        return f"{signs} ({'±' if signs == 2 else ''}all ones)"
    n = signs * ((1 << f.mantissa_bits) - 1)  # IEEE: exponent all ones, mantissa ≠ 0
    return (
        f"{n:,} (IEEE: exponent all ones, mantissa ≠ 0)"
        if n < 1e6
        else f"2^{f.mantissa_bits + signs - 1} − {signs} (IEEE: exponent all ones, mantissa ≠ 0)"
    )


def value_table_html(
    values: Sequence[float],
    formats: Sequence = ("FP32", "BF16", "FP16", "FP8_E4M3", "FP8_E5M2"),
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
    return table_html(
        ["x", "format", "bits (sign | exponent | mantissa)", "kind", "stored value", "relative error"], rows
    )


class BitExplorer:
    """Interactive bits of one format: click a bit to flip it, type a value to see its bits.

    The bits are buttons coloured by field (:data:`FIELD_COLORS`: sign, exponent, mantissa; a set bit is
    bold); below them the code, kind, formula and exact stored value; the neighbours (the next finite values
    below and above, with their codes) and the ulp; a table of how the current value x rounds: to nearest
    (ties to even), toward zero and to nearest with saturation, each with its code, stored value and exact
    error (stored − x), as the rendered book's JavaScript explorer shows them (``book/_static/bit_explorer.js``),
    and stochastic rounding (its two outcomes and their probabilities); and a table of x stored in the
    comparison formats.  Typing a value rounds it to the format (round-to-nearest-even); typed decimals,
    fractions and hexadecimal floats are kept exactly (``1/3`` is the rational 1/3, as in the JavaScript
    explorer); flipping a bit makes the stored value the current value, so the value box, the bits, the
    formula and the tables always show the same number.

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
        (a float; ±inf beyond float64), :attr:`typed_exact` the same exactly (a Fraction, or a float inf/NaN);
        :attr:`neighbours`, :attr:`ulp`, :attr:`roundings` what the explorer shows, as data;
        :attr:`widget` the ipywidgets box to display (CSS class ``mpt-bit-explorer-widget``; bit ``i`` has
        class ``mpt-bit-{i}``).

    The value box accepts a decimal (``-314.625``, ``1e-7``), a fraction (``1/3``), a hexadecimal float
    (``0x1.8p3``), ``inf``/``nan``, or a raw code: ``0x`` without ``p`` (``0x3C00``) or ``0b…``, as the
    rendered book's JavaScript explorer (``book/_static/bit_explorer.js``).
    """

    def __init__(
        self, fmt="FP16", value: float = -314.625, compare: Sequence = ("FP32", "BF16", "FP16", "FP8_E4M3", "FP8_E5M2")
    ):
        import ipywidgets as W

        self.fmt = F.get_format(fmt)
        self.compare = [F.get_format(f) for f in compare]
        self._updating = False
        self._W = W
        self.code = 0
        self.typed = 0.0
        self.typed_exact: Fraction | float = Fraction(0)
        self.format_box = W.Dropdown(options=list(F.FORMATS), value=self.fmt.name, description="format")
        self.value_box = W.Text(
            value=repr(float(value)),
            description="value",
            continuous_update=False,
            tooltip="a value (-314.625, 1e-7, 1/3, 0x1.8p3, inf, nan) or a code (0x3C00, 0b…)",
        )
        self.out = W.HTML()
        self.details = W.HTML()  # neighbours and ulp
        self.rounding = W.HTML()  # how the typed value rounds
        self.table = W.HTML()
        self.bit_row = W.HBox(layout=W.Layout(flex_flow="row wrap"))
        self.format_box.observe(self._on_format, names="value")
        self.value_box.observe(self._on_text, names="value")
        self._build_bits()
        self.set_value(float(value))
        self.widget = W.VBox(
            [W.HBox([self.format_box, self.value_box]), self.bit_row, self.out, self.details, self.rounding, self.table]
        )
        self.widget.add_class("mpt-bit-explorer-widget")

    # --- state changes (called by the widgets, callable directly) -------------------------------------------
    def set_value(self, x: float) -> None:
        """Round ``x`` to the format (round-to-nearest-even) and show its bits, and x in the other formats.

        ``x``: an int, a float or a Fraction (used exactly).  Raises ``TypeError`` for a non-number and
        ``ValueError`` for NaN in a format without NaN (FP6, FP4).
        """
        if not isinstance(x, (int, float, Fraction, np.floating, np.integer)) or isinstance(x, bool):
            raise TypeError(f"x must be a real number, got {type(x).__name__}")
        # floats that a Fraction cannot hold: ±inf, NaN and −0 (whose sign the explorer shows)
        keep = isinstance(x, (float, np.floating)) and (not math.isfinite(x) or x == 0)
        exact = float(x) if keep else Fraction(x)
        code = int(F.encode(exact, self.fmt))
        self.typed_exact = exact
        self.typed = _to_float(exact)
        self._show(code, text=None)

    def set_code(self, code: int) -> None:
        """Store the bit pattern ``code``; its value becomes the current value (value box and table follow)."""
        if not isinstance(code, (int, np.integer)) or isinstance(code, bool):
            raise TypeError(f"code must be an int, got {type(code).__name__}")
        if not 0 <= int(code) < (1 << self.fmt.bits):
            raise ValueError(f"code must lie in [0, 2**{self.fmt.bits}) for {self.fmt.name}, got {code}")
        code = int(code)
        self.typed = float(F.decode(code, self.fmt))
        self.typed_exact = Fraction(self.typed) if math.isfinite(self.typed) else self.typed
        self._show(code, text=repr(self.typed))

    def toggle(self, i: int) -> None:
        """Flip bit ``i`` (0 = most significant, the sign bit of signed formats)."""
        if not isinstance(i, (int, np.integer)) or isinstance(i, bool) or not 0 <= i < self.fmt.bits:
            raise ValueError(f"i must be an int in [0, {self.fmt.bits}), got {i!r}")
        self.set_code(self.code ^ (1 << (self.fmt.bits - 1 - int(i))))

    def set_format(self, fmt: F.FormatLike) -> None:
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
            self.set_value(self.typed_exact)
        except ValueError as e:  # NaN into FP6/FP4, which have none
            self.typed, self.typed_exact = 0.0, Fraction(0)
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
        """The fields of the value shown (:class:`~mpt_lab.formats.Decomposition` of its code)."""
        return F.Decomposition(self.code, self.fmt, scalar=True)

    @property
    def neighbours(self) -> tuple:
        """(below, above): the codes of the next finite values below and above the stored value, None where
        there is none (see :func:`neighbours`)."""
        return neighbours(self.fmt, self.code)

    @property
    def ulp(self) -> Fraction | None:
        """The ulp of the stored value (:func:`mpt_lab.formats.ulp`, exact), None for ±∞ and NaN."""
        v = self.value
        return Fraction(F.ulp(v, self.fmt)) if math.isfinite(v) else None

    @property
    def roundings(self) -> list:
        """How the typed value rounds: :func:`rounding_table` of :attr:`typed_exact` in this format."""
        return rounding_table(self.typed_exact, self.fmt)

    # --- widget plumbing ----------------------------------------------------------------------------------
    def _build_bits(self):
        W = self._W
        f = self.fmt
        kinds = (["sign"] if f.signed else []) + ["exponent"] * f.exponent_bits + ["mantissa"] * f.mantissa_bits
        self.buttons = []
        for i, k in enumerate(kinds):
            # Button honours style.button_color in ipywidgets 8 (ToggleButton does not: its bits were grey)
            b = W.Button(
                description="0",
                tooltip=f"bit {f.bits - 1 - i}: {k} (click to flip)",
                layout=W.Layout(width="30px", padding="0", margin="0 1px 1px 0"),
            )
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
        self.out.value = (
            f"<div>code <code>0x{code:0{(self.fmt.bits + 3) // 4}X}</code> · {d.kind} · "
            f"{html.escape(_formula(d))}{exact}</div>"
        )
        self.details.value = self._details_html()
        self.rounding.value = self._rounding_html()
        comparable = [f for f in self.compare if not (math.isnan(self.typed) and f.nan == "none")]
        self.table.value = str(value_table_html([self.typed], comparable))

    def _details_html(self) -> str:
        """Neighbours and ulp, worded as in bit_explorer.js."""
        f = self.fmt
        below, above = self.neighbours

        def shown(code):
            return f"{_exact_html(float(F.decode(code, f)))} (<code>{_code_hex(f, code)}</code>)"

        if self.decomposition.kind in ("nan", "infinity"):
            nb = "–"
        else:
            top = "+∞ (overflow)" if f.infinities else "none: this is the largest value"
            nb = f"below: {'none' if below is None else shown(below)} · above: {top if above is None else shown(above)}"
        ulp = self.ulp
        return f"<div>neighbours: {nb}</div><div>ulp: {'–' if ulp is None else _exact_html(ulp)}</div>"

    def _rounding_html(self) -> str:
        """The rounding table: the JavaScript explorer's three rows, then stochastic rounding."""
        f, rows = self.fmt, []
        for r in self.roundings:
            if r is None:
                rows.append(["stochastic", "–", "–", "x is not finite: as round to nearest"])
            elif "message" in r:
                rows.append([r["label"], "–", "–", html.escape(r["message"])])
            elif r["rounding"] == "stochastic":
                down, up, p = r["down"], r["up"], r["p_up"]
                dv, uv = float(F.decode(down, f)), float(F.decode(up, f))
                if p == 0 or down == up:
                    rows.append(
                        [r["label"], f"<code>{_code_hex(f, down)}</code>", _exact_html(dv), "always this value"]
                    )
                else:
                    rows.append(
                        [
                            r["label"],
                            f"<code>{_code_hex(f, down)}</code> or <code>{_code_hex(f, up)}</code>",
                            f"{_exact_html(dv)} or {_exact_html(uv)}",
                            f"with probability {_approx_str(1 - p, 6)} or {_approx_str(p, 6)}: the second "
                            f"with the share of the gap already covered, {html.escape(_exact_str(p))} "
                            "(unbiased on average)",
                        ]
                    )
            else:
                err = "–" if r["error"] is None else _exact_html(r["error"])
                if r["error"] and r["relative"] is not None:
                    err += f' <span class="mpt-be-approx">(relative ≈ {_approx_str(r["relative"], 3)})</span>'
                rows.append([r["label"], f"<code>{_code_hex(f, r['code'])}</code>", _exact_html(r["value"]), err])
        return f"<div>x = {_exact_html(self.typed_exact)} rounded to {f.name}:</div>" + str(
            table_html(
                ["rounding", "code", "stored value", "error (stored − x)"],
                rows,
                align=["left", "left", "right", "left"],
            )
        )

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
            self.out.value = f"<div style='color:#b00'>not a number: {html.escape(text)} ({html.escape(str(e))})</div>"

    def _on_format(self, change):
        if not self._updating:
            self.set_format(change["new"])


_MAX_DECIMAL_EXPONENT = 5000  # |e| of a typed 1e±N, as bit_explorer.js (beyond it the input is refused)


def _parse_text(text: str):
    """("code", int) for ``0x…`` without ``p`` or ``0b…``; otherwise ("value", x) with x exact: a Fraction for a
    decimal, a fraction of two decimals or a hexadecimal float, a float for ``inf``/``nan``.

    Raises ``ValueError`` for anything else (``ZeroDivisionError`` for a zero denominator).
    """
    t = text.strip().replace("_", "").replace(" ", "").replace("−", "-").replace("∞", "inf").lower()
    if t.startswith(("0x", "0b")) and "p" not in t:
        return "code", int(t, 0)
    if t.lstrip("+-") in ("inf", "infinity", "nan"):
        return "value", float(t)
    if t.lstrip("+-").startswith("0x"):
        return "value", _hex_float(t)
    if "/" in t:
        num, den = t.split("/", 1)
        x = _decimal(num) / _decimal(den)
    else:
        x = _decimal(t)
    if x == 0 and t.count("-") % 2:  # −0 (and −0/5): a negative zero, as the JS explorer
        return "value", -0.0
    return "value", x


def _decimal(t: str) -> Fraction:
    """A decimal (``-314.625``, ``1e-7``, ``.5``) as an exact Fraction."""
    if "e" in t and abs(int(t.split("e", 1)[1] or "0")) > _MAX_DECIMAL_EXPONENT:
        raise ValueError(f"decimal exponent out of range (|e| ≤ {_MAX_DECIMAL_EXPONENT}): {t}")
    if t.lstrip("+-") in ("inf", "infinity", "nan"):
        raise ValueError(f"not a finite decimal: {t}")
    return Fraction(t)


def _hex_float(t: str) -> Fraction:
    """A hexadecimal float (``0x1.8p3``, ``-0x1p-24``) as an exact Fraction (float.fromhex would round)."""
    sign = -1 if t.startswith("-") else 1
    body = t.lstrip("+-")[2:]
    if "p" not in body:
        raise ValueError(f"a hexadecimal float needs a 'p' exponent: {t}")
    mant, exp = body.split("p", 1)
    if abs(int(exp)) > 20000:
        raise ValueError(f"binary exponent out of range (|p| ≤ 20000): {t}")
    whole, _, frac = mant.partition(".")
    if not (whole + frac):
        raise ValueError(f"not a hexadecimal float: {t}")
    return sign * Fraction(int(whole + frac, 16), 16 ** len(frac)) * Fraction(2) ** int(exp)


def _to_float(x) -> float:
    """The float nearest to x (a Fraction or float), ±inf beyond float64's range."""
    try:
        return float(x)
    except OverflowError:
        return math.inf if x > 0 else -math.inf


def bit_explorer(fmt: F.FormatLike = "FP16", value: float = -314.625) -> object:
    """Build a :class:`BitExplorer` and return its widget for display in Jupyter."""
    return BitExplorer(fmt, value).widget
