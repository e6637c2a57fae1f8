"""The bit explorer's state changes and the static tables."""

import json
import math
import shutil
import subprocess
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

from mpt_lab import formats as F
from mpt_lab import widgets


def test_bits_html_shows_the_worked_example():
    h = widgets.bits_html(-314.625, "FP32")
    assert h._repr_html_() == str(h)
    cells = [c.split(">")[1][0] for c in str(h).split("<td")[1:]]
    assert "".join(cells) == "11000011100111010101000000000000"
    assert "normal" in h and "135" in h
    with pytest.raises(TypeError):
        widgets.bits_html("1.0", "FP32")


def test_tables():
    t = widgets.format_table_html()
    assert t.count("<tr>") == 1 + len(F.FORMATS)
    assert "65504" in t and "448" in t and "57344" in t
    assert "2^-24 (5.96e-08)" in t and "2^-10 (0.000977)" in t and "0.0009765625" not in t  # one notation
    v = widgets.value_table_html([0.1, 65520.0], ["FP16", "FP8_E4M3"])
    assert v.count('<td style="text-align:left') == 4  # one row per (value, format): its first cell
    assert "inf" in v and "nan" in v


def test_bit_explorer_state():
    ex = widgets.BitExplorer("FP16", value=1.0)
    assert ex.code == 0x3C00 and ex.value == 1.0
    assert ex.bits.count(1) == 4 and [b.description for b in ex.buttons].count("1") == 4
    ex.toggle(0)  # sign bit
    assert ex.value == -1.0 and ex.buttons[0].description == "1"
    ex.buttons[15].click()  # a click on the last mantissa bit
    assert ex.value == -(1 + 2**-10)
    ex.value_box.value = "65520"  # typing a value: it overflows FP16
    assert math.isinf(ex.value) and ex.decomposition.kind == "infinity"
    ex.value_box.value = "not a number"  # bad text is reported, state unchanged
    assert "not a number" in ex.out.value and math.isinf(ex.value)
    ex.format_box.value = "FP8_E4M3"  # switching format keeps the typed value
    assert len(ex.buttons) == 8 and math.isnan(ex.value)
    ex.set_value(0.3)
    assert ex.value == 0.3125 and ex.decomposition.bits == "0 0101 010"
    assert "0.3" in ex.table.value
    with pytest.raises(ValueError):
        ex.toggle(8)
    with pytest.raises(TypeError):
        ex.set_value("0.3")
    w = widgets.bit_explorer("BF16", 2.5)
    assert w.children and "mpt-bit-explorer-widget" in w._dom_classes


def test_bit_explorer_bits_are_coloured_by_field():
    # ipywidgets 8's ToggleButton ignores style.button_color (the bits were all grey); Button honours it
    for fmt in ("FP16", "FP8_E4M3", "E8M0", "FP4_E2M1"):
        ex = widgets.BitExplorer(fmt, value=1.0)
        f = F.get_format(fmt)
        fields = ["sign"] * f.signed + ["exponent"] * f.exponent_bits + ["mantissa"] * f.mantissa_bits
        assert len(ex.buttons) == f.bits
        for i, (b, field) in enumerate(zip(ex.buttons, fields)):
            assert "button_color" in b.style.keys and b.style.button_color == widgets.FIELD_COLORS[field]
            assert f"mpt-bit-{i}" in b._dom_classes and f"mpt-bit-{field}" in b._dom_classes
        assert [int(b.description) for b in ex.buttons] == ex.bits
        assert [b.style.font_weight for b in ex.buttons] == ["bold" if x else "normal" for x in ex.bits]


def test_bit_explorer_parts_agree_after_a_toggle():
    ex = widgets.BitExplorer("FP16", value=-314.625)
    assert ex.code == 0xDCEA and ex.value == -314.5 and ex.value_box.value == "-314.625"  # typed, then rounded
    assert "-314.625" in ex.table.value
    ex.toggle(15)  # last mantissa bit: -314.5 -> -314.75
    assert ex.value == -314.75 and ex.typed == -314.75
    assert ex.value_box.value == "-314.75"  # the value box follows the bits ...
    assert "0xDCEB" in ex.out.value and "2^(23 − 15) = −1.0011101011₂ × 2^8" in ex.out.value
    assert "exact <code>-314.75</code>" in ex.out.value
    assert "-314.75" in ex.table.value and "-314.625" not in ex.table.value  # ... and so does the table
    ex.toggle(2)  # exponent 10111 -> 11111: a NaN (mantissa ≠ 0)
    assert math.isnan(ex.value) and ex.decomposition.kind == "nan"
    assert ex.value_box.value == "nan" and "NaN (exponent field all ones" in ex.out.value
    assert "nan" in ex.table.value and "-314.75" not in ex.table.value
    ex.toggle(2)  # and back
    assert ex.value == -314.75 and ex.value_box.value == "-314.75" and ex.code == 0xDCEB
    ex.set_code(0x0001)  # smallest subnormal: exact decimal and emin in the formula
    assert ex.value == 2.0**-24 and "exact <code>0.000000059604644775390625</code>" in ex.out.value
    assert "subnormal: exponent = emin = 1 − bias = -14" in ex.out.value
    with pytest.raises(ValueError):
        ex.set_code(1 << 16)


def test_bit_explorer_text_syntax():
    ex = widgets.BitExplorer("FP16", value=0.0)
    ex.value_box.value = "0x3C00"  # a code: 0x without p
    assert ex.code == 0x3C00 and ex.value_box.value == "1.0"
    ex.value_box.value = "0x1.8p3"  # a hexadecimal float
    assert ex.value == 12.0 and ex.value_box.value == "0x1.8p3"
    ex.value_box.value = "1/3"  # a fraction
    assert ex.code == 0x3555
    ex.value_box.value = "0b1011110000000000"  # a code in binary
    assert ex.value == -1.0
    ex.value_box.value = "1/0"
    assert "not a number" in ex.out.value and ex.value == -1.0
    ex.value_box.value = "nan"
    ex.format_box.value = "FP4_E2M1"  # FP4 has no NaN: reported, and 0 shown
    assert ex.value == 0.0 and "no NaN" in ex.out.value and ex.value_box.value == "0.0"
    ex.set_format("FP32")
    assert ex.format_box.value == "FP32" and len(ex.buttons) == 32


def test_formula_shows_the_unbiased_exponent():
    assert "2^(135 − 127) = −1.00111010101000000000000₂ × 2^8 = -314.625" in widgets.bits_html(-314.625, "FP32")
    h = widgets.bits_html(2.0**-149, "FP32")
    assert "subnormal" in h and "emin = 1 − bias = -126" in h
    assert "∞" in widgets.bits_html(math.inf, "FP16") and "NaN" in widgets.bits_html(math.nan, "FP8_E4M3")


def test_format_table_counts_nan_codes():
    """The table's NaN column agrees with decoding every code (E4M3 has two NaNs, one per sign)."""
    import numpy as np

    for f in F.FORMATS.values():
        text = widgets._nan_codes(f)
        if f.bits <= 16:
            n = int(np.isnan(F.decode(np.arange(1 << f.bits), f)).sum())
            assert text == "none" if n == 0 else text.startswith(f"{n:,} "), (f.name, text, n)
    assert widgets._nan_codes(F.FP8_E4M3).startswith("2 ")


# ------------------------------------------------------------------------------------------------------
# Issue 26, item 24: the live explorer shows what the JavaScript one shows (neighbours, ulp, roundings)
# ------------------------------------------------------------------------------------------------------
SCRIPT = Path(__file__).resolve().parents[1] / "book" / "_static" / "bit_explorer.js"
TYPED = [
    "-314.625",
    "1/3",
    "-7/3",
    "2/3",
    "0.1",
    "1e-7",
    "6e-8",
    "3e-8",
    "2.9802322387695312e-8",
    "1e-9",
    "0.75",
    "2.5",
    "6.5",
    "7",
    "448",
    "464",
    "465",
    "480",
    "500",
    "57344",
    "61440",
    "65504",
    "65519.99",
    "65520",
    "-65536",
    "1e5",
    "0x1.8p3",
    "-0x1p-24",
    "0x1.ffcp15",
    "0",
    "-0",
    "inf",
    "-inf",
    "nan",
    "1e-40",
    "1.401298464324817e-45",
    "1e-46",
    "3.4e38",
    "3.4028235677973366e38",
    "1e39",
    "1e300",
    "-1e-310",
    "5e-324",
    "2e-324",
    "1e400",
    "1/1024",
]


def _js_explorer(requests):
    """Run bit_explorer.js's public API (window.MPTBitExplorer) in Node on requests [fmt, typed text]:
    what the rendered book's explorer shows for them (its neighbours, ulp and rounding rows)."""
    node = shutil.which("node")
    if node is None:
        pytest.skip("Node.js is not installed (it runs the book's JavaScript explorer here)")
    program = """
const fs = require("fs");
globalThis.window = globalThis;
globalThis.document = {readyState: "complete", currentScript: null, getElementsByTagName: () => [],
                       querySelectorAll: () => [], head: {appendChild() {}}};
eval(fs.readFileSync(process.argv[1], "utf8"));
const E = window.MPTBitExplorer;
const out = JSON.parse(fs.readFileSync(0, "utf8")).map(([fmt, text]) => {
  try {
    const code = E.round(fmt, text, "nearest_even", false);
    const stored = E.decode(fmt, code);
    return {code, neighbours: E.neighbours(fmt, code),
            ulp: stored.kind === "nan" || stored.kind === "infinity" ? null : E.ulp(fmt, stored.exact),
            rows: [["nearest_even", false], ["toward_zero", false], ["nearest_even", true]].map(
              ([mode, sat]) => E.roundDetail(fmt, text, mode, sat))};
  } catch (err) { return {error: err.message}; }
});
console.log(JSON.stringify(out));
"""
    res = subprocess.run(
        [node, "-e", program, str(SCRIPT)], input=json.dumps(requests), capture_output=True, text=True, timeout=120
    )
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


def _hex(fmt, code):
    return widgets._code_hex(F.get_format(fmt), code)


def test_live_explorer_shows_what_the_javascript_explorer_shows():
    requests = [[name, t] for name in F.FORMATS for t in TYPED]
    js = _js_explorer(requests)
    explorers = {name: widgets.BitExplorer(name, value=1.0) for name in F.FORMATS}
    compared = 0
    for (name, text), want in zip(requests, js):
        ex = explorers[name]
        if "error" in want:  # e.g. NaN into FP6/FP4: the JS explorer refuses it too
            ex.value_box.value = text
            assert "not a number" in ex.out.value or text.endswith("nan"), (name, text, want)
            continue
        ex.value_box.value = text
        assert "not a number" not in ex.out.value, (name, text, ex.out.value)
        assert _hex(name, ex.code) == want["code"], (name, text)
        below, above = ex.neighbours
        for got, w in ((below, want["neighbours"]["down"]), (above, want["neighbours"]["up"])):
            if w is None:
                assert got is None, (name, text)
            else:
                assert _hex(name, got) == w["code"], (name, text)
                assert widgets._exact_str(float(F.decode(got, name))) == w["exact"], (name, text)
        assert (None if ex.ulp is None else widgets._exact_str(ex.ulp)) == want["ulp"], (name, text)
        rows = ex.roundings
        for row, w in zip(rows[:3], want["rows"]):
            assert _hex(name, row["code"]) == w["code"], (name, text, row["label"])
            assert widgets._exact_str(row["value"]) == w["exact"], (name, text, row["label"])
            assert (None if row["error"] is None else widgets._exact_str(row["error"])) == w["error"]
            assert (None if row["relative"] is None else widgets._exact_str(row["relative"])) == w["relative"]
            # and the widget shows them
            assert f"<code>{w['code']}</code>" in ex.rounding.value
        compared += 1
    assert compared > 400


def test_explorer_shows_neighbours_ulp_and_four_roundings():
    ex = widgets.BitExplorer("FP16", value=-314.625)
    assert ex.neighbours == (0xDCEB, 0xDCE9) and ex.ulp == Fraction(1, 4)
    assert 'below: <code class="mpt-be-exact">-314.75</code> (<code>0xDCEB</code>)' in ex.details.value
    assert 'above: <code class="mpt-be-exact">-314.25</code> (<code>0xDCE9</code>)' in ex.details.value
    assert 'ulp: <code class="mpt-be-exact">0.25</code>' in ex.details.value
    labels = [r["label"] for r in ex.roundings]
    assert labels == ["round to nearest, ties to even", "round toward zero", "nearest even, saturating", "stochastic"]
    for label in labels:
        assert label in ex.rounding.value
    assert 'x = <code class="mpt-be-exact">-314.625</code> rounded to FP16' in ex.rounding.value
    # a tie: nearest even goes to the even mantissa, toward zero to the smaller magnitude, stochastic 50/50
    near, tz, sat, sr = ex.roundings
    assert near["value"] == tz["value"] == -314.5 and near["error"] == Fraction(1, 8)
    assert (sr["down"], sr["up"], sr["p_up"]) == (0xDCEA, 0xDCEB, Fraction(1, 2))
    ex.value_box.value = "65520"  # beyond max: inf, max, max; neighbours of inf: none
    assert [r["value"] for r in ex.roundings[:3]] == [math.inf, 65504.0, 65504.0]
    assert ex.neighbours == (None, None) and ex.ulp is None and "neighbours: –" in ex.details.value
    ex.value_box.value = "65504"  # the largest value: above it +∞
    assert ex.neighbours == (0x7BFE, None) and "above: +∞ (overflow)" in ex.details.value
    ex.format_box.value = "FP4_E2M1"  # no infinity: the largest value has no neighbour above
    assert ex.value == 6.0 and "above: none: this is the largest value" in ex.details.value
    ex.value_box.value = "1/3"  # typed fractions are exact, as in the JavaScript explorer
    assert ex.typed_exact == Fraction(1, 3) and ex.roundings[0]["error"] == Fraction(1, 2) - Fraction(1, 3)
    assert "1/6" in ex.rounding.value
    ex.set_code(0)  # +0: its neighbours are ∓ the smallest subnormal
    assert ex.neighbours == (0b1001, 0b0001)


@pytest.mark.parametrize(
    "fmt, x",
    [
        ("FP16", Fraction(1, 3)),
        ("FP16", -314.625),
        ("FP16", 65520.0),
        ("FP16", 70000.0),
        ("FP16", 1e-9),
        ("FP16", 2.0**-25),
        ("BF16", 0.1),
        ("FP8_E4M3", 460.0),
        ("FP8_E4M3", -0.3),
        ("FP8_E5M2", 1e-6),
        ("FP6_E2M3", 7.9),
        ("FP4_E2M1", 6.5),
        ("FP4_E2M1", -0.3),
        ("E8M0", 3.0),
        ("E8M0", 2.0**-130),
        ("E8M0", -1.0),
        ("FP32", 0.1),
        ("FP16", 2.0),
        ("FP16", 0.0),
    ],
)
def test_stochastic_row_is_what_round_to_draws(fmt, x):
    """The two outcomes and the probability the explorer shows, against 40,000 draws of round_to."""
    row = widgets.rounding_table(x, fmt)[3]
    f = F.get_format(fmt)
    down, up = float(F.decode(row["down"], f)), float(F.decode(row["up"], f))
    draws = F.round_to(np.full(40_000, float(x)), f, rounding="stochastic", generator=1)
    is_up = (draws == up) | (np.isnan(draws) & np.isnan(up)) if row["p_up"] > 0 else np.zeros(draws.size, bool)
    is_down = (draws == down) | (np.isnan(draws) & np.isnan(down))
    assert bool((is_up | is_down).all()), (fmt, x, np.unique(draws))
    p = float(row["p_up"])
    if down != up and not (math.isnan(down) and math.isnan(up)):
        share = is_up.mean()
        assert abs(share - p) <= 5 * math.sqrt(max(p * (1 - p), 1e-12) / draws.size) + 1e-9, (fmt, x, share, p)
