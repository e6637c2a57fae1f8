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
    assert v.count("<tr><td style=\"text-align:right") == 4   # one row per (value, format)
    assert "inf" in v and "nan" in v


def test_bit_explorer_state():
    ex = widgets.BitExplorer("FP16", value=1.0)
    assert ex.code == 0x3C00 and ex.value == 1.0
    assert [b.value for b in ex.buttons].count(True) == 4
    ex.toggle(0)                                   # sign bit
    assert ex.value == -1.0 and ex.buttons[0].value and ex.buttons[0].description == "1"
    ex.buttons[15].value = True                    # a click on the last mantissa bit
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
    assert w.children
