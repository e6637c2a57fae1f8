"""The bit explorer's state changes and the static tables."""

import math

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
    v = widgets.value_table_html([0.1, 65520.0], ["FP16", "FP8_E4M3"])
    assert v.count("<td style=\"text-align:left") == 4   # one row per (value, format): its first cell
    assert "inf" in v and "nan" in v


def test_bit_explorer_state():
    ex = widgets.BitExplorer("FP16", value=1.0)
    assert ex.code == 0x3C00 and ex.value == 1.0
    assert ex.bits.count(1) == 4 and [b.description for b in ex.buttons].count("1") == 4
    ex.toggle(0)                                   # sign bit
    assert ex.value == -1.0 and ex.buttons[0].description == "1"
    ex.buttons[15].click()                         # a click on the last mantissa bit
    assert ex.value == -(1 + 2**-10)
    ex.value_box.value = "65520"                  # typing a value: it overflows FP16
    assert math.isinf(ex.value) and ex.decomposition.kind == "infinity"
    ex.value_box.value = "not a number"           # bad text is reported, state unchanged
    assert "not a number" in ex.out.value and math.isinf(ex.value)
    ex.format_box.value = "FP8_E4M3"              # switching format keeps the typed value
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
    assert ex.code == 0xDCEA and ex.value == -314.5 and ex.value_box.value == "-314.625"   # typed, then rounded
    assert "-314.625" in ex.table.value
    ex.toggle(15)                                  # last mantissa bit: -314.5 -> -314.75
    assert ex.value == -314.75 and ex.typed == -314.75
    assert ex.value_box.value == "-314.75"        # the value box follows the bits ...
    assert "0xDCEB" in ex.out.value and "2^(23 − 15) = −1.0011101011₂ × 2^8" in ex.out.value
    assert "exact <code>-314.75</code>" in ex.out.value
    assert "-314.75" in ex.table.value and "-314.625" not in ex.table.value   # ... and so does the table
    ex.toggle(2)                                   # exponent 10111 -> 11111: a NaN (mantissa ≠ 0)
    assert math.isnan(ex.value) and ex.decomposition.kind == "nan"
    assert ex.value_box.value == "nan" and "NaN (exponent field all ones" in ex.out.value
    assert "nan" in ex.table.value and "-314.75" not in ex.table.value
    ex.toggle(2)                                   # and back
    assert ex.value == -314.75 and ex.value_box.value == "-314.75" and ex.code == 0xDCEB
    ex.set_code(0x0001)                            # smallest subnormal: exact decimal and emin in the formula
    assert ex.value == 2.0**-24 and "exact <code>0.000000059604644775390625</code>" in ex.out.value
    assert "subnormal: exponent = emin = 1 − bias = -14" in ex.out.value
    with pytest.raises(ValueError):
        ex.set_code(1 << 16)


def test_bit_explorer_text_syntax():
    ex = widgets.BitExplorer("FP16", value=0.0)
    ex.value_box.value = "0x3C00"                 # a code: 0x without p
    assert ex.code == 0x3C00 and ex.value_box.value == "1.0"
    ex.value_box.value = "0x1.8p3"                # a hexadecimal float
    assert ex.value == 12.0 and ex.value_box.value == "0x1.8p3"
    ex.value_box.value = "1/3"                    # a fraction
    assert ex.code == 0x3555
    ex.value_box.value = "0b1011110000000000"     # a code in binary
    assert ex.value == -1.0
    ex.value_box.value = "1/0"
    assert "not a number" in ex.out.value and ex.value == -1.0
    ex.value_box.value = "nan"
    ex.format_box.value = "FP4_E2M1"              # FP4 has no NaN: reported, and 0 shown
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
