"""The rendered book's JavaScript: the bit explorer against mpt_lab.formats, and pages that render offline.

In headless Chromium (tests/browser.py: Debian's chromium driven by Playwright, every request that would
leave the machine blocked and recorded):

* the format table of ``book/_static/bit_explorer.js`` is ``mpt_lab.formats.FORMATS``, field by field;
* ``MPTBitExplorer.decode`` gives the kind, fields and exact decimal value of every code of every format of at
  most 8 bits, and of 10,000 random codes of each wider format (FP16, BF16, FP32, TF32, FP64), as
  ``mpt_lab.formats`` (exact values compared as decimal strings of Python's ``Decimal``);
* ``MPTBitExplorer.round`` rounds typed values (exact decimals, fractions and hex floats) at every value,
  tie, boundary, subnormal and overflow of the small formats and around sampled values of the wide ones, as
  ``mpt_lab.formats.encode`` with round-to-nearest-even, toward zero, and saturation; FP64 against Python's
  correctly rounded ``float(str)``;
* neighbours and ulp as NumPy's ``nextafter`` and ``mpt_lab.formats.ulp``;
* a throwaway book (this repository's ``_config.yml``, no execution) renders its formulas with the vendored
  MathJax from file:// with no request off the machine, and its explorer works when clicked and typed into.

``python tests/test_bit_explorer_js.py`` prints the JavaScript format table generated from mpt_lab.formats
(paste it between the BEGIN/END FORMATS markers of bit_explorer.js).
"""

from __future__ import annotations

import json
import math
import re
import shutil
import subprocess
import sys
import time
from decimal import Decimal
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
from browser import ROOT, offline_browser, skip_reason
from conftest import subprocess_env

from mpt_lab import formats as F
from mpt_lab import widgets

STATIC = ROOT / "book" / "_static"
SCRIPT = STATIC / "bit_explorer.js"
SMALL = [n for n, f in F.FORMATS.items() if f.bits <= 8]
WIDE = [n for n, f in F.FORMATS.items() if f.bits > 8]
CASES = [("nearest_even", False), ("toward_zero", False), ("nearest_even", True), ("toward_zero", True)]

needs_browser = pytest.mark.skipif(skip_reason() is not None, reason=str(skip_reason()))


# ----------------------------------------------------------------------------------------------------------
# The format table, generated from mpt_lab.formats
# ----------------------------------------------------------------------------------------------------------
def format_table_js() -> str:
    """The JavaScript format table (the lines between BEGIN/END FORMATS in bit_explorer.js)."""
    rows = []
    for f in F.FORMATS.values():
        rows.append(
            "    {"
            + ", ".join(
                [
                    f"name: {json.dumps(f.name)}",
                    f"exponentBits: {f.exponent_bits}",
                    f"mantissaBits: {f.mantissa_bits}",
                    f"bias: {f.bias}",
                    f"signed: {json.dumps(f.signed)}",
                    f"infinities: {json.dumps(f.infinities)}",
                    f"nan: {json.dumps(f.nan)}",
                    f"subnormals: {json.dumps(f.subnormals)}",
                    f"source: {json.dumps(f.source)}",
                ]
            )
            + "}"
        )
    return "  var FORMAT_TABLE = [\n" + ",\n".join(rows) + "\n  ];"


def test_js_format_table_is_generated_from_the_catalogue():
    text = SCRIPT.read_text(encoding="utf-8")
    block = re.search(r"// BEGIN FORMATS\n(.*?)\n\s*// END FORMATS", text, re.S)
    assert block, "bit_explorer.js lost its BEGIN/END FORMATS markers"
    assert block.group(1) == format_table_js(), (
        "bit_explorer.js's format table differs from mpt_lab.formats: run python tests/test_bit_explorer_js.py"
    )


def test_css_uses_the_widget_field_colours():
    css = (STATIC / "bit_explorer.css").read_text(encoding="utf-8")
    for field, colour in widgets.FIELD_COLORS.items():
        assert re.search(rf"button\.mpt-be-bit\.mpt-be-{field}[^{{]*{{\s*background-color:\s*{colour};", css), field


# ----------------------------------------------------------------------------------------------------------
# Python's answers
# ----------------------------------------------------------------------------------------------------------
def exact(v: float) -> str:
    """The exact decimal expansion of a float64 (the JS API's format)."""
    if math.isnan(v):
        return "nan"
    if math.isinf(v):
        return "inf" if v > 0 else "-inf"
    return format(Decimal(v), "f")


def value_forms(x: float, i: int) -> str:
    """x as typed text, exactly, in one of four forms (cycled by i): decimal, hex float, fraction, Decimal."""
    if math.isnan(x):
        return "-nan" if math.copysign(1.0, x) < 0 else "nan"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    if x == 0:
        return (
            ("-0", "-0x0p+0", "-0/7", "-0.000e5")[i % 4]
            if math.copysign(1.0, x) < 0
            else ("0", "0x0p+0", "0/3", "0E-9")[i % 4]
        )
    return (format(Decimal(x), "f"), x.hex(), str(Fraction(x)), str(Decimal(x)))[i % 4]


def hexcode(c) -> int:
    return int(c, 16)


# ----------------------------------------------------------------------------------------------------------
# The browser page with the script (file://, offline)
# ----------------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def session():
    if skip_reason():
        pytest.skip(skip_reason())
    with offline_browser() as b:
        print(f"\n[browser] Chromium launched in {b.launch_seconds:.1f} s")
        yield b
    assert not b.blocked, f"requests that would have left the machine: {b.blocked}"


@pytest.fixture(scope="module")
def api(session, tmp_path_factory):
    page_file = tmp_path_factory.mktemp("api") / "api.html"
    page_file.write_text(
        f'<!doctype html><meta charset="utf-8"><title>api</title><script src="{SCRIPT.as_uri()}"></script>',
        encoding="utf-8",
    )
    page = session.new_page()
    page.goto(page_file.as_uri())
    page.wait_for_function("window.MPTBitExplorer !== undefined")
    yield page
    page.close()


def js_map(page, fn: str, args: list, chunk: int = 20_000) -> list:
    """Call the API function ``fn`` (e.g. "MPTBitExplorer.round") on each argument list; errors → {"error"}."""
    out = []
    for k in range(0, len(args), chunk):  # JSON strings both ways: Playwright's own serializer is slow for bulk
        out += json.loads(
            page.evaluate(
                """([fn, args]) => { const f = fn.split(".").reduce((o, k) => o[k], window);
                 return JSON.stringify(JSON.parse(args).map(a => {
                   try { return f(...a); } catch (e) { return {error: String(e.message)}; } })); }""",
                [fn, json.dumps(args[k : k + chunk])],
            )
        )
    return out


# ----------------------------------------------------------------------------------------------------------
# decode
# ----------------------------------------------------------------------------------------------------------
@needs_browser
def test_js_formats_equal_the_python_catalogue(api):
    js = api.evaluate("[MPTBitExplorer.order, MPTBitExplorer.formats]")
    order, table = js
    assert order == list(F.FORMATS)
    for name, f in F.FORMATS.items():
        t = table[name]
        assert (t["bits"], t["exponentBits"], t["mantissaBits"], t["bias"]) == (
            f.bits,
            f.exponent_bits,
            f.mantissa_bits,
            f.bias,
        ), name
        assert (t["signed"], t["infinities"], t["nan"], t["subnormals"]) == (
            f.signed,
            f.infinities,
            f.nan,
            f.subnormals,
        ), name
        assert (t["emin"], t["emax"], t["max"], t["source"]) == (f.emin, f.emax, exact(f.max), f.source), name
        assert F.decode(hexcode(t["maxCode"]), f) == f.max, name


def check_decode(api, fmt_name: str, codes: np.ndarray) -> int:
    """Compare MPTBitExplorer.decode with mpt_lab.formats for the codes; returns the number compared."""
    f = F.get_format(fmt_name)
    codes = np.asarray(codes, dtype=np.uint64 if f.bits == 64 else np.int64)
    d = F.Decomposition(codes, f, scalar=False)
    kinds, bits = d.kind, d.bits
    res = js_map(api, "MPTBitExplorer.decode", [[fmt_name, hex(int(c))] for c in codes])
    bad = []
    for i, (c, r) in enumerate(zip(codes.tolist(), res)):
        want = {
            "code": c,
            "kind": str(kinds[i]),
            "sign": int(d.sign[i]),
            "exponentField": int(d.exponent[i]),
            "mantissaField": int(d.mantissa[i]),
            "unbiasedExponent": int(d.unbiased_exponent[i]),
            "bits": str(bits[i]),
        }
        got = {
            "code": hexcode(r["code"]),
            "kind": r["kind"],
            "sign": r["sign"],
            "exponentField": r["exponentField"],
            "mantissaField": r["mantissaField"],
            "unbiasedExponent": r["unbiasedExponent"],
            "bits": r["bits"],
        }
        v = float(d.value[i])
        ok_value = (r["exact"] in ("nan", "-nan")) if math.isnan(v) else r["exact"] == exact(v)
        if got != want or not ok_value:
            bad.append((hex(c), want, got, exact(v), r["exact"]))
    assert not bad, f"{len(bad)} of {len(codes)} {fmt_name} codes differ, e.g. {bad[:3]}"
    return len(codes)


@needs_browser
def test_decode_every_code_of_the_small_formats(api):
    t0, n = time.perf_counter(), 0
    for name in SMALL:
        n += check_decode(api, name, np.arange(1 << F.FORMATS[name].bits))
    print(f"\n[decode] {n} codes of {', '.join(SMALL)}: 0 mismatches in {time.perf_counter() - t0:.2f} s")


@needs_browser
def test_decode_random_codes_of_the_wide_formats(api):
    rng = np.random.default_rng(20260)
    t0, n = time.perf_counter(), 0
    for name in WIDE:
        f = F.FORMATS[name]
        codes = rng.integers(0, 1 << f.bits, size=10_000, dtype=np.uint64)
        top = (1 << f.exponent_bits) - 1
        edges = [
            0,
            1,
            (1 << f.mantissa_bits) - 1,
            1 << f.mantissa_bits,
            top << f.mantissa_bits,
            (top << f.mantissa_bits) + 1,
            (1 << f.bits) - 1,
            1 << (f.bits - 1),
        ]
        n += check_decode(api, name, np.concatenate([codes, np.array(edges, dtype=np.uint64)]))
    print(
        f"\n[decode] {n} codes of {', '.join(WIDE)} (10,000 random each + edges): 0 mismatches "
        f"in {time.perf_counter() - t0:.2f} s"
    )


# ----------------------------------------------------------------------------------------------------------
# rounding
# ----------------------------------------------------------------------------------------------------------
def _with_neighbours(xs) -> list:
    out = []
    for x in xs:
        out += [x, math.nextafter(x, -math.inf), math.nextafter(x, math.inf)]
    return out


def probe_values(fmt: F.FloatFormat, rng) -> list[float]:
    """float64 values where rounding to fmt is delicate: every value (small formats) or sampled values (wide
    ones), the midpoints between neighbours (ties) and the float64 numbers either side of them, the overflow
    threshold, the underflow threshold, subnormals; both signs; ±0, ±inf and NaN."""
    if fmt.bits <= 8:
        grid = F.values(fmt, include_negative=False)
        ups = grid[1:]
        grid = grid[:-1]
    else:
        codes = rng.integers(0, (1 << (fmt.bits - 1)) - 1, size=1500, dtype=np.int64)
        codes = np.concatenate([codes, [0, 1, 2, (1 << fmt.mantissa_bits) - 1, 1 << fmt.mantissa_bits]])
        v = F.decode(codes, fmt)
        u = F.decode(codes + 1, fmt)
        keep = np.isfinite(v) & np.isfinite(u)
        grid, ups = v[keep], u[keep]
    mids = (grid + ups) / 2  # exact in float64 for every format up to FP32
    assert np.all((mids > grid) & (mids < ups))
    big, top_ulp = fmt.max, F.ulp(fmt.max, fmt)
    tiny = fmt.smallest_subnormal
    special = [
        big,
        big + top_ulp / 2,
        big + top_ulp,
        2 * big,
        1e300,
        tiny,
        tiny / 2,
        tiny / 4,
        tiny * 1.5,
        fmt.smallest_normal,
        fmt.smallest_normal * (1 - 2**-30),
        5e-324,
        1.0,
        1 / 3,
        0.1,
    ]
    xs = [float(x) for x in grid] + _with_neighbours([float(x) for x in mids]) + _with_neighbours(special)
    xs = [x for x in xs if math.isfinite(x)]
    xs = sorted(set(xs)) + [-x for x in xs] + [0.0, -0.0, math.inf, -math.inf]
    return xs


def check_round(api, fmt_name: str, xs: list[float]) -> int:
    f = F.get_format(fmt_name)
    texts = [value_forms(x, i) for i, x in enumerate(xs)]
    n = 0
    for mode, sat in CASES:
        want = F.encode(np.array(xs, dtype=np.float64), f, rounding=mode, saturate=sat)
        got = js_map(api, "MPTBitExplorer.round", [[fmt_name, t, mode, sat] for t in texts])
        bad = [
            (t, mode, sat, hex(int(w)), g)
            for t, w, g in zip(texts, want.tolist(), got)
            if not isinstance(g, str) or hexcode(g) != int(w)
        ]
        assert not bad, f"{len(bad)} of {len(xs)} {fmt_name} roundings differ, e.g. {bad[:4]}"
        n += len(xs)
    # NaN: the canonical NaN of the format, or an error where the format has none (as round_to's ValueError)
    for text in ("nan", "-nan"):
        x = float(text)
        for mode, sat in CASES:
            got = js_map(api, "MPTBitExplorer.round", [[fmt_name, text, mode, sat]])[0]
            if f.nan == "none":
                with pytest.raises(ValueError):
                    F.encode(x, f, rounding=mode, saturate=sat)
                assert isinstance(got, dict) and "NaN" in got["error"], (fmt_name, got)
            else:
                assert hexcode(got) == F.encode(x, f, rounding=mode, saturate=sat), (fmt_name, text, mode, sat, got)
            n += 1
    return n


@needs_browser
def test_round_small_formats_everywhere(api):
    rng = np.random.default_rng(1)
    t0, n = time.perf_counter(), 0
    for name in SMALL:
        n += check_round(api, name, probe_values(F.FORMATS[name], rng))
    print(
        f"\n[round] {n} roundings (nearest-even / toward-zero × saturate) in {', '.join(SMALL)}: "
        f"0 mismatches in {time.perf_counter() - t0:.2f} s"
    )


@needs_browser
def test_round_wide_formats_around_sampled_values(api):
    rng = np.random.default_rng(2)
    t0, n = time.perf_counter(), 0
    for name in ("FP16", "BF16", "TF32", "FP32"):
        n += check_round(api, name, probe_values(F.FORMATS[name], rng))
    print(
        f"\n[round] {n} roundings in FP16, BF16, TF32, FP32 (ties, boundaries, subnormals, overflow): "
        f"0 mismatches in {time.perf_counter() - t0:.2f} s"
    )


def fp64_oracle(s: str, mode: str, sat: bool) -> int:
    """The FP64 code of the decimal string (or fraction) s: Python's float() rounds correctly to nearest-even."""
    q = Fraction(s)
    x = float(s) if "/" not in s else float(q)  # both correctly rounded (CPython's int / int is)
    if mode == "toward_zero":
        if math.isinf(x):
            x = math.copysign(F.FP64.max, x)
        elif abs(Fraction(x)) > abs(q):
            x = math.nextafter(x, 0.0)
    if sat and math.isinf(x):
        x = math.copysign(F.FP64.max, x)
    return int(np.float64(x).view(np.uint64))


@needs_browser
def test_round_decimal_strings_to_fp64(api):
    rng = np.random.default_rng(3)
    texts = [
        "9007199254740993",
        "9007199254740995",
        "0.1",
        "1e23",
        "2.4703282292062327e-324",
        "2.4703282292062328e-324",
        "1.7976931348623157e308",
        "1.7976931348623158e308",
        "1.797693134862315807e308",
        "1e309",
        "-1e-400",
        "4.9406564584124654e-324",
        "2.2250738585072011e-308",
        "2.2250738585072014e-308",
        "123456789012345678901234567890",
        "1/3",
        "-2/3",
        "1e-7",
        "65504.5",
    ]
    for _ in range(3000):
        digits = "".join(rng.choice(list("0123456789"), size=int(rng.integers(1, 30))))
        e = int(rng.integers(-340, 320))
        texts.append(f"{'-' if rng.random() < 0.5 else ''}{digits[0]}.{digits[1:] or '0'}e{e}")
    t0, n = time.perf_counter(), 0
    for mode, sat in CASES:
        got = js_map(api, "MPTBitExplorer.round", [["FP64", t, mode, sat] for t in texts])
        bad = [
            (t, mode, sat, hex(fp64_oracle(t, mode, sat)), g)
            for t, g in zip(texts, got)
            if hexcode(g) != fp64_oracle(t, mode, sat)
        ]
        assert not bad, f"{len(bad)} of {len(texts)} FP64 roundings differ, e.g. {bad[:4]}"
        n += len(texts)
    print(
        f"\n[round] {n} decimal strings to FP64 against Python's float(): 0 mismatches "
        f"in {time.perf_counter() - t0:.2f} s"
    )


# ----------------------------------------------------------------------------------------------------------
# neighbours, ulp, parsing, exact errors
# ----------------------------------------------------------------------------------------------------------
def neighbour_values(r: dict) -> tuple:
    """(down, up) exact strings of a neighbours() answer, with −0 read as 0 (the same value)."""
    return tuple(None if r[k] is None else ("0" if r[k]["exact"] == "-0" else r[k]["exact"]) for k in ("down", "up"))


@needs_browser
def test_neighbours_as_nextafter(api):
    n = 0
    for name in SMALL:  # against the sorted list of all values
        f = F.FORMATS[name]
        vals = F.values(f)
        codes = list(range(1 << f.bits))
        res = js_map(api, "MPTBitExplorer.neighbours", [[name, c] for c in codes])
        for c, r in zip(codes, res):
            v = F.decode(c, f)
            if not math.isfinite(v):
                assert r == {"down": None, "up": None}
                continue
            below, above = vals[vals < v], vals[vals > v]
            want = (exact(float(below[-1])) if len(below) else None, exact(float(above[0])) if len(above) else None)
            assert neighbour_values(r) == want, (name, hex(c), r)
            n += 1
    rng = np.random.default_rng(4)
    for name, dt, it in (("FP16", np.float16, np.uint16), ("FP32", np.float32, np.uint32)):
        codes = rng.integers(0, 1 << (8 * np.dtype(dt).itemsize), size=3000, dtype=np.uint64).astype(it)
        vals = codes.view(dt)
        fin = np.isfinite(vals)
        codes, vals = codes[fin], vals[fin]
        res = js_map(api, "MPTBitExplorer.neighbours", [[name, hex(int(c))] for c in codes])
        with np.errstate(over="ignore"):
            down, up = np.nextafter(vals, dt(-np.inf)), np.nextafter(vals, dt(np.inf))
        for v, d, u, r in zip(vals, down, up, res):
            want = tuple(
                exact(float(w)).replace("-0", "0") if w == 0 else exact(float(w)) if np.isfinite(w) else None
                for w in (d, u)
            )
            assert neighbour_values(r) == want, (name, float(v), r)
            n += 1
    print(f"\n[neighbours] {n} codes: 0 mismatches")


@needs_browser
def test_ulp_as_mpt_lab(api):
    rng = np.random.default_rng(5)
    n = 0
    for name, f in F.FORMATS.items():
        xs = np.concatenate(
            [
                [0.0, f.smallest_subnormal, f.smallest_normal, f.max, 1.0, 3.0, 1e-30, 1e30],
                np.exp2(rng.uniform(-150, 150, size=300)) * rng.choice([-1, 1], size=300),
            ]
        )
        want = F.ulp(xs, f)
        got = js_map(api, "MPTBitExplorer.ulp", [[name, value_forms(float(x), i)] for i, x in enumerate(xs)])
        assert got == [exact(float(w)) for w in want], name
        n += len(xs)
    print(f"\n[ulp] {n} values: 0 mismatches")


@needs_browser
def test_typed_syntax_and_exact_errors(api):
    ev = api.evaluate
    assert ev("MPTBitExplorer.parse('0x3C00')") == {"type": "code", "code": "0x3C00"}  # 0x without p: a code
    assert ev("MPTBitExplorer.parse('0b0011110000000000')") == {"type": "code", "code": "0x3C00"}
    assert ev("MPTBitExplorer.parse('0x1.8p3')") == {"type": "value", "exact": "12"}  # with p: a value
    assert ev("MPTBitExplorer.parse('−1/3')") == {"type": "value", "exact": "-1/3"}
    assert ev("MPTBitExplorer.parse(' 1_000.5e-1 ')") == {"type": "value", "exact": "100.05"}
    assert ev("MPTBitExplorer.round('FP32', '-314.625')") == "0xC39D5000"
    assert ev("MPTBitExplorer.decode('FP32', '0xC39D5000').bits") == "1 10000111 00111010101000000000000"
    assert ev("MPTBitExplorer.round('FP16', '1/3')") == hex(F.encode(1 / 3, F.FP16)).upper().replace("0X", "0x")
    for bad in ("abc", "1/0", "1/2/3", "0x", "", "1e99999", "0x1.8"):
        with pytest.raises(Exception):
            ev(f"MPTBitExplorer.parse({json.dumps(bad)})")
    with pytest.raises(Exception):
        ev("MPTBitExplorer.round('FP16', '0x3C00')")  # a code is not a value to round
    with pytest.raises(Exception):
        ev("MPTBitExplorer.round('FP17', '1')")
    # the exact rounding error: a decimal when it has one, else a fraction
    r = ev("MPTBitExplorer.roundDetail('FP16', '1/3')")
    assert Fraction(r["error"]) == Fraction(F.round_to(1 / 3, F.FP16)) - Fraction(1, 3)
    for x in ("0.1", "-0.1", "-314.625", "65519", "-1e-7"):
        for mode, sat in CASES:
            r = ev(f"MPTBitExplorer.roundDetail('FP16', '{x}', '{mode}', {json.dumps(sat)})")
            stored = F.round_to(float(x), F.FP16, rounding=mode, saturate=sat)
            assert Decimal(r["exact"]) == Decimal(stored), (x, mode, sat, r)
            assert Decimal(r["error"]) == Decimal(stored) - Decimal(x), (x, mode, sat, r)
            assert Fraction(r["relative"]) == abs(Fraction(r["error"]) / Fraction(x))
    r = ev("MPTBitExplorer.roundDetail('FP32', '1e-46', 'toward_zero')")
    assert r["code"] == "0x00000000" and r["error"] == "-0.0000000000000000000000000000000000000000000001"
    r = ev("MPTBitExplorer.decode('FP32', '0x00000001')")  # FP32's smallest subnormal, every digit
    assert r["exact"] == format(Decimal(2.0**-149), "f") and len(r["exact"]) == 151


# ----------------------------------------------------------------------------------------------------------
# A throwaway book: formulas offline, and the explorer on a page one folder down
# ----------------------------------------------------------------------------------------------------------
SNIPPET = """<div class="mpt-bit-explorer" data-format="FP16" data-value="-314.625">
<p>The interactive bit explorer runs in the rendered book. In JupyterLab, run the next cell: <code>widgets.bit_explorer()</code>.</p>
</div>
<script src="../_static/bit_explorer.js"></script>"""

MATH_PAGE = r"""# Formulas offline

Inline $x^2$ and the escaped \(a\) of CommonMark, and a display:

$$\int_0^1 x^2\,dx = \frac{1}{3}$$

\begin{align}
x &= (-1)^s \times 1.M_2 \times 2^{E - \text{bias}} \\
\epsilon &= 2^{-m}
\end{align}

With a role, {math}`\boldsymbol{u} \ll \tfrac{1}{2}\,\mathrm{ulp}(w)`.
"""


def build_throwaway_book(dest: Path) -> Path:
    """A book with this repository's _config.yml (execution off, static files and MathJax as configured):
    a markdown page of formulas, and a notebook one folder down whose markdown cell holds the explorer snippet
    and whose stored output holds LaTeX.  Returns the HTML folder."""
    import nbformat
    import yaml

    cfg = yaml.safe_load((ROOT / "_config.yml").read_text(encoding="utf-8"))
    cfg["execute"]["execute_notebooks"] = "off"
    cfg["only_build_toc_files"] = True
    (dest / "_config.yml").write_text(yaml.safe_dump(cfg), encoding="utf-8")
    (dest / "_toc.yml").write_text("format: jb-book\nroot: intro\nchapters:\n  - file: notebooks/explorer\n")
    shutil.copytree(STATIC, dest / "book" / "_static")
    for folder in (cfg.get("sphinx", {}).get("local_extensions") or {}).values():  # e.g. book/_ext
        shutil.copytree(ROOT / folder, dest / folder, dirs_exist_ok=True)
    shutil.copy(ROOT / "book" / "references.bib", dest / "book" / "references.bib")
    (dest / "intro.md").write_text(MATH_PAGE, encoding="utf-8")
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    code = nbformat.v4.new_code_cell("from IPython.display import Math\nMath(r'x = \\frac{1}{3}')")
    code.outputs = [
        nbformat.v4.new_output(
            "execute_result",
            execution_count=1,
            data={
                "text/latex": "$\\displaystyle x = \\frac{1}{3}$",
                "text/plain": "<IPython.core.display.Math object>",
            },
        )
    ]
    nb.cells = [
        nbformat.v4.new_markdown_cell("# The bit explorer\n\nThe value $-314.625$ in FP16:\n\n" + SNIPPET),
        code,
    ]
    (dest / "notebooks").mkdir()
    nbformat.write(nb, dest / "notebooks" / "explorer.ipynb")
    jb = Path(sys.executable).parent / "jupyter-book"
    res = subprocess.run(
        [str(jb), "build", str(dest), "--path-output", str(dest), "-W", "-n", "--keep-going"],
        capture_output=True,
        text=True,
        timeout=600,
        env=subprocess_env(),
    )
    assert res.returncode == 0, (res.stdout + res.stderr)[-5000:]
    return dest / "_build" / "html"


@pytest.fixture(scope="module")
def throwaway_book(tmp_path_factory):
    if skip_reason():
        pytest.skip(skip_reason())
    t0 = time.perf_counter()
    html = build_throwaway_book(tmp_path_factory.mktemp("book"))
    print(f"\n[book] throwaway book built in {time.perf_counter() - t0:.1f} s")
    return html


def wait_for_math(page) -> int:
    page.wait_for_function("window.MathJax && MathJax.startup && MathJax.startup.promise")
    page.evaluate("MathJax.startup.promise")
    return page.locator("mjx-container").count()


def local_failures(session) -> list:
    return [(u, e) for u, e in session.failed if u.startswith("file:")]


@pytest.mark.slow
@needs_browser
def test_book_formulas_render_offline(session, throwaway_book):
    mj = throwaway_book / "_static" / "mathjax" / "tex-svg-full.js"
    assert mj.is_file(), "MathJax is not in the built book"
    page = session.new_page()
    for rel, at_least in (("intro.html", 4), ("notebooks/explorer.html", 2)):
        html_text = (throwaway_book / rel).read_text(encoding="utf-8")
        assert "cdn.jsdelivr.net/npm/mathjax" not in html_text and "_static/mathjax/tex-svg-full.js" in html_text
        page.goto((throwaway_book / rel).as_uri())
        n = wait_for_math(page)
        text = page.evaluate("""() => { const m = document.querySelector('main, article, body').cloneNode(true);
                                          m.querySelectorAll('pre, .cell_input').forEach(e => e.remove());
                                          document.body.appendChild(m); const t = m.innerText; m.remove(); return t; }""")
        assert n >= at_least, (rel, n)
        assert "\\(" not in text and "\\[" not in text and "$x^2$" not in text and "\\frac" not in text, text[:2000]
        assert page.locator("mjx-container svg").count() == n  # SVG output: no web fonts needed
        session.screenshot(page, "book_" + rel.replace("/", "_").replace(".html", ""), full_page=True)
    print(
        f"\n[book] formulas rendered offline; blocked requests: {session.blocked}; failed file requests: "
        f"{local_failures(session)}"
    )
    assert not session.blocked, f"the book asked the network for: {session.blocked}"
    assert not local_failures(session), local_failures(session)
    page.close()


def rgb(hex_colour: str) -> str:
    h = hex_colour.lstrip("#")
    return "rgb({}, {}, {})".format(*(int(h[i : i + 2], 16) for i in (0, 2, 4)))


@pytest.mark.slow
@needs_browser
def test_book_explorer_clicks_and_typing(session, throwaway_book):
    page = session.new_page()
    page.goto((throwaway_book / "notebooks" / "explorer.html").as_uri())
    host = page.locator(".mpt-bit-explorer")
    host.locator("button.mpt-be-bit").first.wait_for()
    assert host.count() == 1 and "mpt-be-mounted" in host.get_attribute("class")
    assert "runs in the rendered book" not in host.inner_text()  # the fallback text was replaced
    # the stylesheet came along from the script's folder, and the field colours are the widget's
    for field, colour in widgets.FIELD_COLORS.items():
        bg = host.locator(f"button.mpt-be-bit.mpt-be-{field}").first.evaluate(
            "b => getComputedStyle(b).backgroundColor"
        )
        assert bg == rgb(colour), (field, bg)

    def out(name):
        return host.locator(f'table.mpt-be-info td[data-out="{name}"]').inner_text().strip()

    def rounding(mode):
        row = host.locator(f'table.mpt-be-rounding tr[data-mode="{mode}"]')
        return [row.locator(f'td[data-out="{k}"]').inner_text().strip() for k in ("code", "value", "error")]

    assert host.locator("button.mpt-be-bit").count() == 16
    assert out("code").startswith("0xDCEA") and out("kind") == "normal" and out("exact") == "-314.5"
    assert rounding("nearest_even")[:2] == ["0xDCEA", "-314.5"] and rounding("nearest_even")[2].startswith("0.125")

    host.locator('button.mpt-be-bit[data-bit="15"]').click()  # the last mantissa bit
    assert out("code").startswith("0xDCEB") and out("exact") == "-314.75"
    assert host.locator("input.mpt-be-value").input_value() == "-314.75"
    assert host.locator('button.mpt-be-bit[data-bit="15"]').get_attribute("aria-pressed") == "true"
    assert "2^(23 − 15)" in out("formula").replace("\n", "") or "23 − 15" in out("formula")

    host.locator("input.mpt-be-value").fill("1e-7")
    host.locator("input.mpt-be-value").press("Enter")
    code = F.encode(1e-7, F.FP16)
    assert out("kind") == "subnormal" and out("code").startswith(f"0x{code:04X}")
    assert out("exact").startswith(format(Decimal(F.decode(code, F.FP16)), "f"))
    assert "emin = 1 − bias = -14" in out("formula")
    assert rounding("toward_zero")[0] == f"0x{F.encode(1e-7, F.FP16, rounding='toward_zero'):04X}"

    host.locator("select.mpt-be-format").select_option("FP8_E4M3")
    host.locator("input.mpt-be-value").fill("500")
    host.locator("button.mpt-be-apply").click()
    assert host.locator("button.mpt-be-bit").count() == 8 and out("kind") == "NaN"
    assert rounding("nearest_even")[0] == "0x7F" and rounding("toward_zero")[:2] == ["0x7E", "448"]
    assert rounding("nearest_even-saturate")[:2] == ["0x7E", "448"] and rounding("nearest_even-saturate")[2].startswith(
        "-52"
    )

    host.locator("select.mpt-be-format").select_option("FP16")
    host.locator("input.mpt-be-value").fill("0x3C00")  # a code
    host.locator("input.mpt-be-value").press("Enter")
    assert out("exact") == "1" and host.locator("input.mpt-be-value").input_value() == "1"
    host.locator("input.mpt-be-value").fill("one")
    host.locator("input.mpt-be-value").press("Enter")
    assert "not a number" in host.locator(".mpt-be-message").inner_text() and out("exact") == "1"
    session.screenshot(page, "bit_explorer_book", full_page=True)
    assert not session.blocked and not local_failures(session), (session.blocked, local_failures(session))
    assert not [c for c in session.console if "bit_explorer" in c or "MPTBitExplorer" in c], session.console
    page.close()


if __name__ == "__main__":
    print(format_table_js())
