"""API tests for :mod:`mpt_lab.formats`: round trips, decompose/compose, types, shapes, devices, errors,
values/ulp and the catalogue's derived properties (against numpy.finfo, ml_dtypes.finfo and torch.finfo).

The value-by-value oracle comparisons of round_to/decode are in ``test_formats_oracle.py``.
"""

from __future__ import annotations

import math

import ml_dtypes as md
import numpy as np
import pytest
import torch

from mpt_lab import formats as F
from mpt_lab.formats import (
    BF16,
    E8M0,
    FORMATS,
    FP4_E2M1,
    FP6_E2M3,
    FP6_E3M2,
    FP8_E4M3,
    FP8_E5M2,
    FP16,
    FP32,
    FP64,
    TF32,
    FloatFormat,
    compose,
    decode,
    decompose,
    encode,
    get_format,
    round_to,
    ulp,
    values,
)

torch.set_num_threads(1)

pytestmark = pytest.mark.filterwarnings(
    r"ignore:(invalid value|overflow) encountered in (cast|nextafter)"
    ":RuntimeWarning"
)

ALL = list(FORMATS.values())
SMALL = [f for f in ALL if f.bits <= 19]  # enumerable: every code can be listed
NO_NAN = (FP6_E3M2, FP6_E2M3, FP4_E2M1)
NP_DTYPE = {
    FP64: np.float64,
    FP32: np.float32,
    FP16: np.float16,
    BF16: md.bfloat16,
    FP8_E4M3: md.float8_e4m3fn,
    FP8_E5M2: md.float8_e5m2,
    FP6_E3M2: md.float6_e3m2fn,
    FP6_E2M3: md.float6_e2m3fn,
    FP4_E2M1: md.float4_e2m1fn,
    E8M0: md.float8_e8m0fnu,
}
TORCH_DTYPE = {
    FP64: torch.float64,
    FP32: torch.float32,
    FP16: torch.float16,
    BF16: torch.bfloat16,
    FP8_E4M3: torch.float8_e4m3fn,
    FP8_E5M2: torch.float8_e5m2,
    E8M0: torch.float8_e8m0fnu,
}
CODE_NP = {8: np.uint8, 6: np.uint8, 4: np.uint8, 16: np.uint16, 19: np.uint32, 32: np.uint32, 64: np.uint64}
CODE_TORCH = {
    8: torch.uint8,
    6: torch.uint8,
    4: torch.uint8,
    16: torch.int32,
    19: torch.int32,
    32: torch.int64,
    64: torch.int64,
}


def same(a, b) -> bool:
    """Bit-equal as float64 values (NaN positions equal, zero signs equal)."""
    a = np.asarray(a.numpy() if isinstance(a, torch.Tensor) else a, dtype=np.float64)
    b = np.asarray(b.numpy() if isinstance(b, torch.Tensor) else b, dtype=np.float64)
    if a.shape != b.shape:
        return False
    na, nb = np.isnan(a), np.isnan(b)
    return bool(np.array_equal(na, nb) and np.array_equal(a.view(np.uint64)[~na], b.view(np.uint64)[~nb]))


def mixed_inputs(n=200_000, seed=0, dtype=np.float32):
    """Random values over the whole float32 range (binade-uniform), random bit patterns, and specials."""
    rng = np.random.default_rng(seed)
    e = rng.integers(-152, 128, n)
    x = np.ldexp(1.0 + rng.integers(0, 1 << 23, n) * 2.0**-23, e) * rng.choice([-1.0, 1.0], n)
    bits = rng.integers(0, 1 << 32, n // 4, dtype=np.uint64).astype(np.uint32).view(np.float32)
    sp = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1.0, -1.0, 1e-45, 448, 464, 480, 65504, 65520, 3e38])
    with np.errstate(over="ignore"):
        return np.concatenate([x.astype(np.float32), bits, sp.astype(np.float32)]).astype(dtype)


def all_codes(fmt):
    return np.arange(1 << fmt.bits, dtype=CODE_NP[fmt.bits])


def canonical_nan_codes(fmt):
    """The NaN codes encode produces (see its docstring), per sign."""
    e, m = fmt.exponent_bits, fmt.mantissa_bits
    if fmt.nan == "ieee":
        base = (((1 << e) - 1) << m) | (1 << (m - 1))
    elif fmt.nan == "single":
        base = (1 << (e + m)) - 1
    else:
        return []
    return [base, base | (1 << (e + m))] if fmt.signed else [base]


# ----------------------------------------------------------------------------------------------------------
# 5. encode / decode round trips and code dtypes
# ----------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("fmt", ALL, ids=str)
@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
def test_decode_encode_equals_round_to(fmt, dtype):
    x = mixed_inputs(dtype=dtype, seed=fmt.bits)
    if fmt in NO_NAN:
        x = x[~np.isnan(x)]
    for rounding in ("nearest_even", "toward_zero"):
        c = encode(x, fmt, rounding=rounding)
        assert c.dtype == CODE_NP[fmt.bits] and c.shape == x.shape
        assert same(decode(c, fmt), round_to(x, fmt, rounding=rounding)), (fmt, rounding)
    for sat in (False, True):
        assert same(decode(encode(x, fmt, saturate=sat), fmt), round_to(x, fmt, saturate=sat))
    # stochastic: the same generator seed gives the same draws in both
    assert same(
        decode(encode(x, fmt, rounding="stochastic", generator=7), fmt),
        round_to(x, fmt, rounding="stochastic", generator=7),
    )
    t = torch.from_numpy(x.copy())
    ct = encode(t, fmt)
    assert isinstance(ct, torch.Tensor) and ct.dtype == CODE_TORCH[fmt.bits] and ct.shape == t.shape
    assert same(decode(ct, fmt), round_to(x, fmt))
    if fmt.bits < 64:
        assert np.array_equal(ct.numpy().astype(np.uint64), encode(x, fmt).astype(np.uint64))


@pytest.mark.parametrize("fmt", SMALL, ids=str)
def test_encode_decode_every_code(fmt):
    codes = all_codes(fmt)
    v = decode(codes, fmt)
    keep = ~np.isnan(v) | np.isin(codes, canonical_nan_codes(fmt))
    assert np.array_equal(encode(v[keep], fmt), codes[keep])
    vt = torch.from_numpy(v[keep])
    assert np.array_equal(encode(vt, fmt).numpy().astype(np.int64), codes[keep].astype(np.int64))
    # the non-canonical NaNs all encode to a canonical NaN of the same sign
    if (~keep).any():
        c = encode(v[~keep], fmt).astype(np.int64)
        assert np.isin(c, canonical_nan_codes(fmt)).all()
        sign = 1 << (fmt.bits - 1)
        assert np.array_equal(c & sign, codes[~keep].astype(np.int64) & sign)
    # and every value round-trips through round_to unchanged
    assert same(round_to(v, fmt), v)


def test_encode_decode_scalar_types():
    c = encode(1.0, FP16)
    assert type(c) is int and c == 0x3C00
    assert type(decode(0x3C00, FP16)) is float and decode(0x3C00, FP16) == 1.0
    c = encode(np.float32(1.0), FP16)
    assert isinstance(c, np.uint16) and c == 0x3C00
    assert isinstance(decode(np.uint16(0x3C00), FP16), np.float64)
    assert encode(-0.0, FP8_E4M3) == 0x80 and encode(float("nan"), FP8_E4M3) == 0x7F
    assert encode(-math.inf, FP8_E4M3, saturate=True) == 0xFE
    assert encode(math.nan, FP16) == 0x7E00 and encode(math.inf, BF16) == 0x7F80
    assert encode(1.0, E8M0) == 127 and encode(math.nan, E8M0) == 0xFF and encode(2.0**-127, E8M0) == 0
    assert encode(1.0, TF32) == 127 << 10 and encode(-2.0, TF32) == (1 << 18) | (128 << 10)
    assert encode(6.0, FP4_E2M1) == 0b0111 and encode(-0.5, FP4_E2M1) == 0b1001
    assert encode(7.5, FP6_E2M3) == 0b011111 and encode(28.0, FP6_E3M2) == 0b011111
    assert encode(-1.5, FP64) == 0xBFF8000000000000 and decode(0xBFF8000000000000, FP64) == -1.5
    assert encode(1.0, FP32) == 0x3F800000 and decode(0x3F800000, FP32) == 1.0
    # 0-d arrays stay 0-d arrays
    c = encode(np.array(2.0), FP16)
    assert isinstance(c, np.ndarray) and c.shape == () and c.dtype == np.uint16 and c == 0x4000
    d = decode(np.array(0x4000, dtype=np.uint16), FP16)
    assert isinstance(d, np.ndarray) and d.shape == () and d == 2.0
    # FP16 codes of float16 keep NaN payloads (NumPy and torch)
    h = np.array([0x7C01, 0xFE01, 0x7E00, 0x3C00], dtype=np.uint16)
    assert np.array_equal(encode(h.view(np.float16), FP16), h)
    t = torch.from_numpy(h.view(np.int16).copy()).view(torch.float16)
    assert np.array_equal(encode(t, FP16).numpy(), h.astype(np.int32))


def test_decode_shapes_and_torch():
    codes = np.arange(24, dtype=np.uint8).reshape(2, 3, 4)
    v = decode(codes, FP8_E4M3)
    assert v.shape == (2, 3, 4) and v.dtype == np.float64
    vt = decode(torch.from_numpy(codes), FP8_E4M3)
    assert vt.shape == (2, 3, 4) and vt.dtype == torch.float64 and same(vt, v)
    ct = encode(torch.from_numpy(v), FP8_E4M3)
    assert ct.shape == (2, 3, 4) and ct.dtype == torch.uint8 and torch.equal(ct, torch.from_numpy(codes))
    # FP64 torch codes are the signed int64 reading of the bits
    x = torch.tensor([-1.5, 2.0, float("inf")], dtype=torch.float64)
    c = encode(x, FP64)
    assert c.dtype == torch.int64 and c[0].item() == np.uint64(0xBFF8000000000000).view(np.int64)
    assert torch.equal(decode(c, FP64), x)
    with pytest.raises(TypeError):
        decode(c.to(torch.int32), FP64)
    assert decode(np.array([], dtype=np.uint8), FP8_E5M2).shape == (0,)


@pytest.mark.parametrize("fmt", ALL, ids=str)
def test_saturate_clamps_infinities_in_every_format_and_input_type(fmt):
    """saturate=True: ±inf → ±max also where no rounding is needed (FP32 from float32, FP64 from float64),
    and encode agrees with round_to, including the exact-bits path of FP16/FP32/FP64 in their own dtype."""
    m = fmt.max
    xs = [math.inf, -math.inf] + ([] if fmt in NO_NAN else [math.nan])
    sat = ([m, -m] if fmt.signed else [m, math.nan]) + ([] if fmt in NO_NAN else [math.nan])
    for dt in (np.float64, np.float32, np.float16, md.bfloat16):
        x = np.array(xs, dtype=dt)
        want = np.array(sat, dtype=np.float64)
        with np.errstate(over="ignore"):
            want_stored = want.astype(dt)  # what x's dtype can hold of ±max (inf where it cannot)
        r = round_to(x, fmt, saturate=True)
        assert r.dtype == x.dtype and same(r, want_stored), (fmt, dt, r)
        c = encode(x, fmt, saturate=True)
        if float(np.float64(want_stored[0])) == m:  # max representable in dt: codes are those of ±max
            assert same(decode(c, fmt), want), (fmt, dt, c)
        with np.errstate(over="ignore"):
            assert same(decode(c, fmt).astype(dt), r)
    for tdt in (torch.float64, torch.float32):
        t = torch.tensor(xs, dtype=tdt)
        r = round_to(t, fmt, saturate=True)
        want = torch.tensor(sat, dtype=torch.float64).to(tdt)
        assert same(r, want), (fmt, tdt, r)
        assert same(decode(encode(t, fmt, saturate=True), fmt).to(tdt), r)
    assert round_to(math.inf, fmt, saturate=True) == m
    assert decode(encode(math.inf, fmt, saturate=True), fmt) == m
    # and nothing beyond ±max ever comes out
    x = mixed_inputs(20_000, seed=11, dtype=np.float64)
    if fmt in NO_NAN:
        x = x[~np.isnan(x)]
    for rounding in ("nearest_even", "toward_zero", "stochastic"):
        r = round_to(x, fmt, rounding=rounding, saturate=True, generator=1)
        assert np.nanmax(np.abs(r)) <= m
        assert same(decode(encode(x, fmt, rounding=rounding, saturate=True, generator=1), fmt), r)


def test_encode_own_format_saturated_codes():
    assert encode(np.array([np.inf, -np.inf], dtype=np.float16), FP16, saturate=True).tolist() == [0x7BFF, 0xFBFF]
    assert encode(np.array([np.inf], dtype=np.float32), FP32, saturate=True).tolist() == [0x7F7FFFFF]
    assert encode(np.array([-np.inf]), FP64, saturate=True).tolist() == [0xFFEFFFFFFFFFFFFF]
    assert encode(-math.inf, FP64, saturate=True) == 0xFFEFFFFFFFFFFFFF
    t = encode(torch.tensor([math.inf, -math.inf], dtype=torch.float64), FP64, saturate=True)
    assert t.tolist() == [0x7FEFFFFFFFFFFFFF, np.uint64(0xFFEFFFFFFFFFFFFF).view(np.int64)]
    # without saturate the exact bits, NaN payloads included
    h = np.array([0x7C00, 0x7C01], dtype=np.uint16)
    assert encode(h.view(np.float16), FP16).tolist() == [0x7C00, 0x7C01]


# ----------------------------------------------------------------------------------------------------------
# 6. decompose / compose
# ----------------------------------------------------------------------------------------------------------
def test_decompose_worked_example():
    d = decompose(-314.625, FP32)
    assert d.bits == "1 10000111 00111010101000000000000"
    assert d.sign == 1 and d.exponent == 135 and d.unbiased_exponent == 8 and d.kind == "normal"
    assert d.mantissa == 0b00111010101000000000000
    assert d.significand == 314.625 / 256 and d.value == -314.625 and d.code == 0xC39D5000
    for name in ("sign", "exponent", "unbiased_exponent", "mantissa", "code"):
        assert type(getattr(d, name)) is int, name
    assert type(d.value) is float and type(d.significand) is float and type(d.kind) is str
    assert type(d.bits) is str
    assert d.as_dict()["bits"] == d.bits and "-314.625" in repr(d)
    assert d.value == (-1) ** d.sign * d.significand * 2.0**d.unbiased_exponent
    # same through every input type
    for x in (np.float32(-314.625), np.float64(-314.625), np.array(-314.625, dtype=np.float32), torch.tensor(-314.625)):
        assert str(decompose(x, FP32).bits) == d.bits
    # and in another format: -314.625 rounds to -320 in FP8 E4M3 (spacing 32 in [256, 448])
    d8 = decompose(-314.625, "e4m3")
    assert d8.bits == "1 1111 010" and d8.value == -320.0 and d8.unbiased_exponent == 8


KIND_CASES = [
    (FP16, 0.0, "zero", 0, 0, 0, -14),
    (FP16, -0.0, "zero", 1, 0, 0, -14),
    (FP16, 2.0**-24, "subnormal", 0, 0, 1, -14),
    (FP16, -(2.0**-15), "subnormal", 1, 0, 512, -14),
    (FP16, 1.0, "normal", 0, 15, 0, 0),
    (FP16, 65504.0, "normal", 0, 30, 1023, 15),
    (FP16, math.inf, "infinity", 0, 31, 0, 16),
    (FP16, -1e6, "infinity", 1, 31, 0, 16),
    (FP16, math.nan, "nan", 0, 31, 512, 16),
    (BF16, 1e-40, "subnormal", 0, 0, None, -126),
    (BF16, 3e38, "normal", 0, 254, None, 127),
    (FP8_E4M3, 448.0, "normal", 0, 15, 6, 8),
    (FP8_E4M3, math.nan, "nan", 0, 15, 7, 8),
    (FP8_E4M3, 2.0**-9, "subnormal", 0, 0, 1, -6),
    (FP8_E4M3, 1e6, "nan", 0, 15, 7, 8),
    (FP8_E5M2, math.inf, "infinity", 0, 31, 0, 16),
    (FP8_E5M2, math.nan, "nan", 0, 31, 2, 16),
    (FP6_E3M2, 28.0, "normal", 0, 7, 3, 4),
    (FP6_E2M3, 0.125, "subnormal", 0, 0, 1, 0),
    (FP4_E2M1, 0.5, "subnormal", 0, 0, 1, 0),
    (FP4_E2M1, -6.0, "normal", 1, 3, 1, 2),
    (FP4_E2M1, -0.0, "zero", 1, 0, 0, 0),
    (E8M0, 1.0, "normal", 0, 127, 0, 0),
    (E8M0, 2.0**-127, "normal", 0, 0, 0, -127),
    (E8M0, 2.0**127, "normal", 0, 254, 0, 127),
    (E8M0, math.nan, "nan", 0, 255, 0, 128),
    (E8M0, -1.0, "nan", 0, 255, 0, 128),
    (E8M0, 0.0, "nan", 0, 255, 0, 128),
    (TF32, 1 + 2.0**-10, "normal", 0, 127, 1, 0),
    (FP64, 5e-324, "subnormal", 0, 0, 1, -1022),
    (FP32, 1e-45, "subnormal", 0, 0, 1, -126),
    (FP32, math.inf, "infinity", 0, 255, 0, 128),
]


@pytest.mark.parametrize(
    "fmt, x, kind, sign, exponent, mantissa, ue", KIND_CASES, ids=[f"{c[0]}-{c[1]}" for c in KIND_CASES]
)
def test_decompose_kinds(fmt, x, kind, sign, exponent, mantissa, ue):
    d = decompose(x, fmt)
    assert d.kind == kind and d.sign == sign and d.exponent == exponent and d.unbiased_exponent == ue
    if mantissa is not None:
        assert d.mantissa == mantissa
    assert same(compose(d.sign, d.exponent, d.mantissa, fmt), d.value)
    assert same(d.value, round_to(x, fmt))
    if kind in ("zero", "subnormal", "normal"):
        assert d.value == (-1) ** d.sign * d.significand * 2.0**d.unbiased_exponent
        assert 0 <= d.significand < 2 and (d.significand >= 1) == (kind == "normal")
    elif kind == "infinity":
        assert d.significand == math.inf
    else:
        assert math.isnan(d.significand)


def _independent_kind(v, fmt):
    a = np.abs(v)
    k = np.where(a < fmt.smallest_normal, "subnormal", "normal")
    k = np.where(a == 0, "zero", k)
    k = np.where(np.isinf(a), "infinity", k)
    return np.where(np.isnan(a), "nan", k)


@pytest.mark.parametrize("fmt", SMALL, ids=str)
def test_decompose_every_code_and_compose_inverts(fmt):
    codes = all_codes(fmt)
    v = decode(codes, fmt)
    keep = ~np.isnan(v) | np.isin(codes, canonical_nan_codes(fmt))
    codes, v = codes[keep], v[keep]
    d = decompose(v, fmt)
    assert np.array_equal(d.code, codes)
    assert np.array_equal(
        d.kind, _independent_kind(v, fmt) if fmt.subnormals else np.where(np.isnan(v), "nan", "normal")
    )
    # fields are the bit fields of the code
    e, m = fmt.exponent_bits, fmt.mantissa_bits
    c = codes.astype(np.int64)
    assert np.array_equal(d.mantissa, c & ((1 << m) - 1))
    assert np.array_equal(d.exponent, (c >> m) & ((1 << e) - 1))
    assert np.array_equal(d.sign, (c >> (e + m)) & 1 if fmt.signed else np.zeros_like(c))
    # unbiased exponent: emin for zeros and subnormals, E - bias otherwise (IEEE inf/NaN: emax + 1)
    k = d.kind
    zs = (k == "zero") | (k == "subnormal")
    assert (d.unbiased_exponent[zs] == fmt.emin).all()
    assert np.array_equal(d.unbiased_exponent[~zs], d.exponent[~zs].astype(np.int64) - fmt.bias)
    if fmt.nan == "ieee":
        assert (d.unbiased_exponent[(k == "nan") | (k == "infinity")] == fmt.emax + 1).all()
    assert same(d.value, v)
    fin = np.isfinite(v)
    assert np.array_equal(v[fin], ((-1.0) ** d.sign * np.ldexp(d.significand, d.unbiased_exponent))[fin])
    # compose inverts decompose, with array and tensor fields
    assert same(compose(d.sign, d.exponent, d.mantissa, fmt), v)
    ct = compose(torch.from_numpy(d.sign), torch.from_numpy(d.exponent), torch.from_numpy(d.mantissa), fmt)
    assert isinstance(ct, torch.Tensor) and same(ct, v)
    # bits strings: sign | exponent | mantissa groups of the code
    if fmt.bits <= 8:
        b = d.bits
        assert b.shape == codes.shape
        for code, s in zip(codes.tolist(), b.tolist()):
            assert s.replace(" ", "") == format(code, f"0{fmt.bits}b")
            assert [len(p) for p in s.split(" ")] == [n for n in (int(fmt.signed), e, m) if n]


@pytest.mark.parametrize("fmt", [FP8_E4M3, FP8_E5M2, FP6_E3M2, FP6_E2M3, FP4_E2M1, E8M0], ids=str)
def test_compose_scalar_fields_every_code(fmt):
    """compose with Python-int fields returns a float, for every code (the scalar code path)."""
    e, m = fmt.exponent_bits, fmt.mantissa_bits
    want = decode(all_codes(fmt), fmt)
    for code in range(1 << fmt.bits):
        s, ex, ma = code >> (e + m), (code >> m) & ((1 << e) - 1), code & ((1 << m) - 1)
        v = compose(s, ex, ma, fmt)
        assert type(v) is float and same(v, want[code]), (fmt, code, v, want[code])
        assert same(compose(np.int64(s), np.uint8(ex), np.int32(ma), fmt), want[code])


def test_compose_examples():
    assert compose(0, 15, 0, FP16) == 1.0 and compose(1, 0, 1, FP16) == -(2.0**-24)
    assert compose(0, 31, 0, FP16) == math.inf and math.isnan(compose(0, 31, 1, FP16))
    assert compose(0, 0, 0, E8M0) == 2.0**-127 and math.isnan(compose(0, 255, 0, E8M0))
    assert math.isnan(compose(1, 15, 7, FP8_E4M3)) and compose(0, 15, 6, FP8_E4M3) == 448.0
    assert compose(1, 1023, 1 << 51, FP64) == -1.5 and compose(0, 2047, 0, FP64) == math.inf
    assert compose(0, 2046, (1 << 52) - 1, FP64) == np.finfo(np.float64).max
    assert compose(0, 127, 1, TF32) == 1 + 2.0**-10
    v = compose(np.array([0, 1]), np.array([[15], [16]]), 0, FP16)  # broadcasting
    assert v.shape == (2, 2) and v.tolist() == [[1.0, -1.0], [2.0, -2.0]]
    v = compose(np.array([1], dtype=np.uint8), 1023, 0, FP64)
    assert isinstance(v, np.ndarray) and v.tolist() == [-1.0]
    t = compose(torch.tensor([0, 1]), 15, torch.tensor([0, 512]), "fp16")
    assert isinstance(t, torch.Tensor) and t.dtype == torch.float64 and t.tolist() == [1.0, -1.5]
    t = compose(torch.tensor([1]), torch.tensor([1023]), torch.tensor([0]), FP64)
    assert t.tolist() == [-1.0]


def test_decompose_arrays_and_tensors_keep_shape():
    x = np.linspace(-3, 3, 24, dtype=np.float32).reshape(2, 3, 4)
    d = decompose(x, FP16)
    for name in ("sign", "exponent", "mantissa", "unbiased_exponent", "significand", "value", "code", "kind", "bits"):
        a = getattr(d, name)
        assert isinstance(a, np.ndarray) and a.shape == (2, 3, 4), name
    assert same(d.value, round_to(x, FP16)) and d.kind.dtype.kind == "U"
    assert "shape=(2, 3, 4)" in repr(d)
    t = torch.from_numpy(x)
    dt = decompose(t, FP16)
    for name in ("sign", "exponent", "mantissa", "unbiased_exponent", "significand", "value", "code"):
        a = getattr(dt, name)
        assert isinstance(a, torch.Tensor) and a.shape == (2, 3, 4) and a.device == t.device, name
        assert np.array_equal(
            np.asarray(a.numpy(), dtype=np.float64), np.asarray(getattr(d, name), dtype=np.float64), equal_nan=True
        ), name
    assert np.array_equal(dt.kind, d.kind) and np.array_equal(dt.bits, d.bits)
    # FP64 and FP32 decompositions of tensors (signed int64 codes) and of NumPy arrays agree
    y = np.array([-1.5, 2.0**-1074, -np.inf, np.nan, -0.0])
    for fmt in (FP64, FP32):
        a, b = decompose(y, fmt), decompose(torch.from_numpy(y), fmt)
        assert np.array_equal(a.sign, b.sign.numpy()) and np.array_equal(a.exponent, b.exponent.numpy())
        assert np.array_equal(a.mantissa.astype(np.int64), b.mantissa.numpy())
        assert np.array_equal(a.kind, b.kind) and np.array_equal(a.bits, b.bits)
    assert decompose(-1.5, FP64).sign == 1 and decompose(-1.5, FP64).bits.startswith("1 01111111111 1000")
    # 0-d array: array fields of shape ()
    d0 = decompose(np.array(1.0), FP16)
    assert isinstance(d0.sign, np.ndarray) and d0.sign.shape == () and d0.kind.shape == ()
    # rounding and saturate are applied first
    assert decompose(1 + 2.0**-11 + 2.0**-20, FP16, rounding="toward_zero").mantissa == 0
    assert decompose(1e6, FP8_E4M3, saturate=True).value == 448.0


def test_decompose_fp32_fields_of_random_values():
    rng = np.random.default_rng(1)
    u = rng.integers(0, 1 << 32, 100_000, dtype=np.uint64).astype(np.uint32)
    x = u.view(np.float32)
    x = x[~np.isnan(x)]
    u = x.view(np.uint32).astype(np.int64)
    d = decompose(x, FP32)
    assert np.array_equal(d.code, x.view(np.uint32))
    assert np.array_equal(d.sign, u >> 31) and np.array_equal(d.exponent, (u >> 23) & 255)
    assert np.array_equal(d.mantissa, u & ((1 << 23) - 1))
    assert same(compose(d.sign, d.exponent, d.mantissa, FP32), x)


# ----------------------------------------------------------------------------------------------------------
# 10. types, shapes, devices
# ----------------------------------------------------------------------------------------------------------
def test_round_to_scalar_types():
    r = round_to(1.1, FP16)
    assert type(r) is float and r == float(np.float16(1.1))
    for t in (np.float16, np.float32, np.float64):
        r = round_to(t(1.1), FP8_E4M3)
        assert type(r) is t and r == 1.125
    r = round_to(md.bfloat16(1.1), FP8_E4M3)
    assert type(r) is md.bfloat16 and float(r) == 1.125
    r = round_to(md.float8_e5m2(1.25), FP4_E2M1)
    assert type(r) is md.float8_e5m2 and float(r) == 1.0
    assert type(round_to(2.5, FP64)) is float and round_to(0.1, FP64) == 0.1
    assert round_to(0.1, FP32) == float(np.float32(0.1))
    r = round_to(np.float16(1.1), FP32)  # identity: still float16
    assert type(r) is np.float16 and r == np.float16(1.1)
    assert type(ulp(1.0, FP16)) is float and type(ulp(np.float32(1.0), FP16)) is np.float64


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64, md.bfloat16, md.float8_e4m3fn, md.float8_e5m2])
def test_round_to_numpy_array_dtypes_preserved(dtype):
    x = np.linspace(-10, 10, 60, dtype=np.float32).reshape(3, 4, 5).astype(dtype)
    for fmt in (FP16, BF16, FP8_E4M3, FP8_E5M2, FP6_E3M2, FP4_E2M1, TF32, FP32):
        r = round_to(x, fmt)
        assert r.dtype == np.dtype(dtype) and r.shape == x.shape
        want = round_to(x.astype(np.float32), fmt)
        with np.errstate(all="ignore"):
            assert same(r, want.astype(dtype))
        if fmt in NP_DTYPE and np.dtype(dtype) in (np.dtype(np.float32), np.dtype(np.float64)):
            with np.errstate(all="ignore"):
                assert same(r, x.astype(NP_DTYPE[fmt]).astype(dtype))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_round_to_tensor_dtypes_preserved(dtype):
    x = mixed_inputs(50_000, seed=3)
    x = x[np.isfinite(x)]
    t = torch.from_numpy(x).to(dtype)
    ref = t.to(torch.float32).numpy()
    for fmt in (FP16, BF16, FP8_E4M3, FP8_E5M2, FP6_E2M3, FP4_E2M1, E8M0, TF32, FP32, FP64):
        r = round_to(t, fmt)
        assert isinstance(r, torch.Tensor) and r.dtype == dtype and r.shape == t.shape and r.device == t.device
        want = torch.from_numpy(round_to(ref if dtype != torch.float64 else t.numpy(), fmt)).to(dtype)
        assert same(r.to(torch.float64), want.to(torch.float64)), (fmt, dtype)


def test_round_to_shapes_and_non_contiguous_inputs():
    rng = np.random.default_rng(4)
    base = (rng.standard_normal((6, 8, 10)) * 100).astype(np.float32)
    views = [
        base,
        base[:, ::2, 1::3],
        base.transpose(2, 0, 1),
        np.asfortranarray(base),
        base[::-1],
        base[3, 4, 5:6],
        np.broadcast_to(base[0, 0], (3, 10)),
    ]
    for v in views:
        for fmt in (FP16, FP8_E4M3, E8M0, BF16):
            r = round_to(v, fmt)
            assert r.shape == v.shape and r.dtype == v.dtype
            with np.errstate(all="ignore"):
                assert same(
                    r,
                    np.ascontiguousarray(v).astype(NP_DTYPE[fmt]).astype(np.float32)
                    if fmt != E8M0
                    else round_to(np.ascontiguousarray(v), fmt),
                )
    tb = torch.from_numpy(base.copy())
    tviews = [
        tb,
        tb[:, ::2, 1::3],
        tb.permute(2, 0, 1),
        tb.flip(0),
        tb[0, 0].expand(3, 10),
        tb.transpose(0, 2),
        tb[2, 3, 4],
        tb[..., 3],
    ]
    for v in tviews:
        assert not v.is_contiguous() or v is tb or v.dim() in (0, 3)
        r = round_to(v, FP8_E5M2)
        assert r.shape == v.shape and r.dtype == v.dtype
        assert torch.equal(r, v.contiguous().to(torch.float8_e5m2).float())
    # 0-d arrays and tensors stay 0-d
    r = round_to(np.array(1.1, dtype=np.float32), FP16)
    assert isinstance(r, np.ndarray) and r.shape == () and r.dtype == np.float32
    r = round_to(torch.tensor(1.1), FP16)
    assert isinstance(r, torch.Tensor) and r.shape == ()
    # empty inputs
    assert round_to(np.zeros((0, 3), np.float32), FP16).shape == (0, 3)
    assert round_to(torch.zeros(0, 3), FP8_E4M3).shape == (0, 3)


def test_round_to_does_not_modify_its_input_and_ignores_autograd():
    x = mixed_inputs(10_000, seed=5)
    x = x[~np.isnan(x)]
    for dtype in (np.float32, np.float64):
        xi = x.astype(dtype)
        keep = xi.copy()
        for fmt in ALL:
            for rounding in ("nearest_even", "toward_zero", "stochastic"):
                round_to(xi, fmt, rounding=rounding, generator=0)
                encode(xi, fmt, rounding=rounding, generator=0)
                t = torch.from_numpy(xi)
                round_to(t, fmt, rounding=rounding, generator=0)
        assert np.array_equal(xi.view(np.uint8), keep.view(np.uint8))
    t = torch.tensor([1.1, 2.2], requires_grad=True)
    r = round_to(t, FP16)
    assert not r.requires_grad and r.tolist() == [float(np.float16(1.1)), float(np.float16(2.2))]
    assert ulp(t, FP16).shape == (2,)


def test_ulp_types():
    u = ulp(np.ones((2, 3), dtype=np.float16), FP16)
    assert isinstance(u, np.ndarray) and u.dtype == np.float64 and u.shape == (2, 3) and (u == 2.0**-10).all()
    ut = ulp(torch.ones(2, 3, dtype=torch.bfloat16), BF16)
    assert isinstance(ut, torch.Tensor) and ut.dtype == torch.float64 and ut.shape == (2, 3)
    assert (ut == 2.0**-7).all()
    assert ulp(np.array(1.0), FP16).shape == ()


# ----------------------------------------------------------------------------------------------------------
# 11. errors
# ----------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "bad",
    [
        [1.0],
        (1.0,),
        "1.0",
        np.array([1, 2]),
        np.array([1], dtype=np.uint8),
        True,
        np.bool_(True),
        np.array([True]),
        torch.tensor([1, 2]),
        torch.tensor([True]),
        None,
        1 + 2j,
        np.array([1j]),
        np.int64(3),
    ],
    ids=lambda b: type(b).__name__ + str(getattr(b, "dtype", "")),
)
def test_wrong_input_types_raise_type_error(bad):
    for fn in (
        lambda x: round_to(x, FP16),
        lambda x: encode(x, FP16),
        lambda x: decompose(x, FP16),
        lambda x: ulp(x, FP16),
    ):
        with pytest.raises(TypeError):
            fn(bad)


def test_meta_tensors_are_refused_before_anything_reads_them():
    meta = torch.empty(3, device="meta")
    codes = torch.zeros(3, dtype=torch.int64, device="meta")
    for fn, name in (
        (lambda: round_to(meta, FP16), "x"),
        (lambda: encode(meta, "e4m3"), "x"),
        (lambda: decompose(meta, BF16), "x"),
        (lambda: ulp(meta, FP32), "x"),
        (lambda: F.round_fixed(meta, 3, 4), "x"),
        (lambda: decode(codes, FP16), "codes"),
        (lambda: decode(codes, FP64), "codes"),
        (lambda: compose(codes, 1, 1, FP16), "sign"),
    ):
        with pytest.raises(ValueError, match=f"{name} is a meta tensor"):
            fn()


def test_python_ints_beyond_float64_round_like_a_cast():
    assert round_to(10**400, FP16) == math.inf and round_to(-(10**400), FP16) == -math.inf
    assert round_to(10**400, FP16, saturate=True) == 65504.0
    assert round_to(-(10**400), FP6_E3M2) == -28.0 and round_to(10**400, "FP4") == 6.0
    assert math.isnan(round_to(10**400, FP8_E4M3))
    assert encode(10**400, FP8_E5M2) == 0x7C and decompose(-(10**400), BF16).kind == "infinity"
    assert ulp(10**400, FP16) == 32.0 and F.round_fixed(-(10**400), 3, 2) == -8.0
    assert type(round_to(3, FP16)) is float and round_to(3, FP16) == 3.0


def test_exact_arithmetic_marker():
    assert not F.exact_arithmetic_active()
    with F.exact_arithmetic():
        assert F.exact_arithmetic_active()
        with F.exact_arithmetic():  # blocks nest
            assert F.exact_arithmetic_active()
        assert F.exact_arithmetic_active()
    assert not F.exact_arithmetic_active()

    @F.exact_arithmetic
    def inside(x):
        """doc"""
        return F.exact_arithmetic_active(), x

    assert inside(3) == (True, 3) and inside.__doc__ == "doc" and inside.__name__ == "inside"
    assert not F.exact_arithmetic_active()
    with pytest.raises(KeyError):  # reset also when the body raises
        with F.exact_arithmetic():
            raise KeyError
    assert not F.exact_arithmetic_active()
    with pytest.raises(TypeError, match="fn"):
        F.exact_arithmetic(3)
    # per thread: another thread does not see this one's marker
    import threading

    seen = []
    with F.exact_arithmetic():
        t = threading.Thread(target=lambda: seen.append(F.exact_arithmetic_active()))
        t.start()
        t.join()
    assert seen == [False]
    # the public functions are marked
    for fn in (round_to, encode, decode, decompose, compose, ulp, F.round_fixed):
        assert fn.__wrapped__ is not None


def test_formats_imports_without_torch_and_without_torch_internals():
    """The bottom layer: importable with torch unavailable, and no use of torch's private dispatch APIs."""
    import inspect
    import subprocess
    import sys

    code = (
        "import sys; sys.modules['torch'] = None\n"
        "import mpt_lab.formats as F\n"
        "assert F.round_to(2**60 + 2**36 + 1, 'FP32') == 2**60 + 2**37\n"
        "with F.exact_arithmetic():\n    assert F.exact_arithmetic_active()\n"
        "print('ok')"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr
    src = inspect.getsource(F)
    for private in (
        "torch._C",
        "_python_dispatch",
        "_disable_current_modes",
        "_len_torch_dispatch_stack",
        "torch._subclasses",
        "torch.utils._pytree",
    ):
        assert private not in src, private


def test_unknown_format_and_rounding():
    for fn in (
        lambda: round_to(1.0, "fp12"),
        lambda: get_format("e9m9"),
        lambda: values("nope"),
        lambda: decode(1, "x"),
        lambda: ulp(1.0, "fp7"),
    ):
        with pytest.raises(ValueError) as err:
            fn()
        for name in FORMATS:
            assert name in str(err.value)
    with pytest.raises(TypeError):
        round_to(1.0, 16)
    with pytest.raises(TypeError):
        get_format(None)
    for bad in ("nearest", "RNE", "", "stochastic "):
        with pytest.raises(ValueError) as err:
            round_to(1.0, FP16, rounding=bad)
        for mode in ("nearest_even", "toward_zero", "stochastic"):
            assert mode in str(err.value)
        with pytest.raises(ValueError):
            encode(1.0, FP16, rounding=bad)
    with pytest.raises(TypeError):
        round_to(1.0, FP16, rounding=None)
    for fn in (round_to, encode, decompose):
        with pytest.raises(TypeError):
            fn(1.0, FP16, saturate="yes")
        with pytest.raises(TypeError):
            fn(np.ones(2, np.float32), FP32, saturate=1)


def test_get_format_names_and_aliases():
    for name, fmt in FORMATS.items():
        assert get_format(name) is fmt and get_format(name.lower()) is fmt and get_format(fmt) is fmt
        assert str(fmt) == name and name in repr(fmt)
    for alias, fmt in [
        ("half", FP16),
        ("float16", FP16),
        ("bfloat16", BF16),
        ("e4m3", FP8_E4M3),
        ("E4M3FN", FP8_E4M3),
        ("fp8-e4m3", FP8_E4M3),
        ("fp8_e4m3fn", FP8_E4M3),
        ("e5m2", FP8_E5M2),
        ("e3m2", FP6_E3M2),
        ("e2m3", FP6_E2M3),
        ("fp4", FP4_E2M1),
        ("e2m1", FP4_E2M1),
        ("fp8_e8m0", E8M0),
        ("float", FP32),
        ("double", FP64),
        (" tf32 ", TF32),
    ]:
        assert get_format(alias) is fmt, alias


def test_decode_errors():
    for codes, fmt in [
        (-1, FP16),
        (1 << 16, FP16),
        (np.array([-1]), FP16),
        (np.array([1 << 16]), FP16),
        (np.array([64], dtype=np.uint8), FP6_E3M2),
        (np.array([16]), FP4_E2M1),
        (np.array([0, 256]), FP8_E4M3),
        (torch.tensor([256]), FP8_E4M3),
        (torch.tensor([-1]), FP8_E5M2),
        (1 << 19, TF32),
        (1 << 32, FP32),
        (256, E8M0),
        (np.int8(-3), FP8_E4M3),
        (np.array([70000], dtype=np.int32), BF16),
    ]:
        with pytest.raises(ValueError):
            decode(codes, fmt)
    for codes in (1.0, np.array([1.0]), True, torch.tensor([1.0]), "3", [1, 2], torch.tensor([True]), None):
        with pytest.raises(TypeError):
            decode(codes, FP16)


def test_compose_errors():
    for args in [
        (2, 0, 0, FP16),
        (0, 32, 0, FP16),
        (0, 0, 1024, FP16),
        (-1, 0, 0, FP16),
        (0, -1, 0, FP16),
        (1, 0, 0, E8M0),
        (0, 0, 1, E8M0),
        (0, 16, 0, FP8_E4M3),
        (0, 0, 8, FP8_E4M3),
        (np.array([0, 2]), 0, 0, FP16),
        (0, np.array([3, 4]), 0, FP4_E2M1),
        (torch.tensor([0]), torch.tensor([40]), 0, FP16),
        (0, 0, torch.tensor([-1]), FP16),
        (0, 2048, 0, FP64),
        (0, 0, 1 << 52, FP64),
    ]:
        with pytest.raises(ValueError):
            compose(*args)
    for args in [
        (0.0, 0, 0, FP16),
        (True, 0, 0, FP16),
        (0, 1.5, 0, FP16),
        (0, 0, "1", FP16),
        (np.array([0.0]), 0, 0, FP16),
        (torch.tensor([0.0]), 0, 0, FP16),
        (0, [1], 0, FP16),
    ]:
        with pytest.raises(TypeError):
            compose(*args)


def test_values_rejects_wide_formats():
    for fmt in (FP32, FP64):
        with pytest.raises(ValueError):
            values(fmt)


def test_float_format_validation():
    with pytest.raises(TypeError):
        FloatFormat("X", 5.0, 10, 15)
    with pytest.raises(TypeError):
        FloatFormat("X", 5, True, 15)
    with pytest.raises(TypeError):
        FloatFormat("X", 5, 10, "15")
    for kw in [
        dict(exponent_bits=0),
        dict(exponent_bits=12),
        dict(mantissa_bits=-1),
        dict(mantissa_bits=53),
        dict(nan="maybe"),
        dict(nan="single"),
        dict(mantissa_bits=0),
    ]:
        args = dict(name="X", exponent_bits=5, mantissa_bits=10, bias=15)
        args.update(kw)
        with pytest.raises(ValueError):
            FloatFormat(**args)
    # a user-defined format equal in fields to FP16 behaves as FP16
    mine = FloatFormat("half-again", 5, 10, 15)
    x = np.linspace(-70000, 70000, 1001, dtype=np.float32)
    assert same(round_to(x, mine), round_to(x, FP16))


# ----------------------------------------------------------------------------------------------------------
# 12. values and ulp
# ----------------------------------------------------------------------------------------------------------
def _expected_count(fmt):
    """Finite values, ±0 merged: codes minus non-finite codes, minus one for −0 (formats with a zero)."""
    per_sign = 1 << (fmt.exponent_bits + fmt.mantissa_bits)
    nonfinite = {"ieee": 1 << fmt.mantissa_bits, "single": 1, "none": 0}[fmt.nan]
    if not fmt.signed:
        return per_sign - nonfinite  # E8M0: 256 codes, one NaN, no zero to merge
    return 2 * (per_sign - nonfinite) - 1


def test_values_counts_reasoned():
    assert {f.name: len(values(f)) for f in SMALL} == {
        "FP8_E4M3": 2 * (2**8 // 2 - 1) - 1,  # 253: 254 finite codes (0x7F, 0xFF are NaN), +0 = −0
        "FP8_E5M2": 2 * (128 - 4) - 1,  # 247: exponent 31 holds inf and 3 NaNs per sign
        "FP16": 2 * (2**15 - 2**10) - 1,  # 63487
        "BF16": 2 * (2**15 - 2**7) - 1,  # 65279
        "TF32": 2 * (2**18 - 2**10) - 1,  # 522239
        "FP6_E3M2": 63,
        "FP6_E2M3": 63,
        "FP4_E2M1": 15,  # every code finite, ±0 merged
        "E8M0": 255,  # 2^-127 … 2^127, code 0xFF is NaN, no zero
    }
    for f in SMALL:
        assert len(values(f)) == _expected_count(f)
        pos = values(f, include_negative=False)
        assert len(pos) == ((_expected_count(f) + 1) // 2 if f.signed else len(values(f)))
        assert (pos >= 0).all()


@pytest.mark.parametrize("fmt", SMALL, ids=str)
def test_values_sorted_exact_and_extreme(fmt):
    v = values(fmt)
    assert v.dtype == np.float64 and np.isfinite(v).all() and (np.diff(v) > 0).all()
    assert v[-1] == fmt.max and v[0] == (-fmt.max if fmt.signed else fmt.smallest_normal)
    assert (v == 0).sum() == (1 if fmt.subnormals else 0) and not np.signbit(v[v == 0]).any()
    pos = v[v > 0]
    assert pos[0] == fmt.smallest_subnormal
    if fmt in NP_DTYPE:  # the same set as the oracle dtype's finite values
        with np.errstate(all="ignore"):
            o = all_codes(fmt).view(NP_DTYPE[fmt]).astype(np.float64)
        o = o[np.isfinite(o)]
        o = np.unique(np.where(o == 0, 0.0, o))  # ±0 merged as +0
        assert np.array_equal(o, v)
        assert np.array_equal(round_to(v, fmt), v)
    if fmt == TF32:
        bits = np.arange(0, 0x7F800000, 1 << 13, dtype=np.uint32).view(np.float32).astype(np.float64)
        assert np.array_equal(values(fmt, include_negative=False), bits)


def test_ulp_values():
    assert ulp(1.0, FP16) == 2.0**-10 and ulp(0, FP16) == 2.0**-24 and ulp(0.0, FP16) == 2.0**-24
    assert ulp(65504, FP16) == 32.0 and ulp(-65504.0, FP16) == 32.0 and ulp(1e6, FP16) == 32.0
    assert ulp(2.0**-24, FP16) == 2.0**-24 and ulp(2.0**-14, FP16) == 2.0**-24
    assert ulp(2.0**-13, FP16) == 2.0**-23 and ulp(1.999, FP16) == 2.0**-10
    assert ulp(math.inf, FP16) == math.inf and math.isnan(ulp(math.nan, FP16))
    assert ulp(1.0, BF16) == 2.0**-7 and ulp(1.0, TF32) == 2.0**-10 and ulp(1.0, FP8_E4M3) == 0.125
    assert ulp(448.0, FP8_E4M3) == 32.0 and ulp(0.0, FP8_E4M3) == 2.0**-9 and ulp(1.0, FP4_E2M1) == 0.5
    assert ulp(0.0, FP4_E2M1) == 0.5 and ulp(6.0, FP4_E2M1) == 2.0
    # E8M0: no mantissa, the spacing above 2^e is 2^e itself
    assert ulp(1.0, E8M0) == 1.0 and ulp(3.0, E8M0) == 2.0 and ulp(2.0**-127, E8M0) == 2.0**-127
    assert ulp(0.0, E8M0) == 2.0**-127 and ulp(2.0**127, E8M0) == 2.0**127 and ulp(1e39, E8M0) == 2.0**127
    assert ulp(1.0, FP32) == 2.0**-23 and ulp(0.0, FP32) == 2.0**-149 and ulp(1.0, FP64) == 2.0**-52
    assert ulp(0.0, FP64) == 5e-324


@pytest.mark.parametrize("fmt", SMALL, ids=str)
def test_ulp_is_the_gap_to_the_next_value(fmt):
    v = values(fmt, include_negative=False)
    gaps = np.diff(v)
    u = ulp(v, fmt)
    assert np.array_equal(u[:-1], gaps)
    assert u[-1] == 2.0 ** (fmt.emax - fmt.mantissa_bits)  # spacing of the top binade
    assert np.array_equal(ulp(-v, fmt), u)
    # every x between two values has the spacing of the value below it
    mids = v[:-1] + gaps / 2
    assert np.array_equal(ulp(mids, fmt), gaps)
    ut = ulp(torch.from_numpy(v), fmt)
    assert isinstance(ut, torch.Tensor) and np.array_equal(ut.numpy(), u)


def test_ulp_fp32_fp64_match_numpy_spacing():
    rng = np.random.default_rng(9)
    x = rng.integers(0, 0x7F800000, 200_000, dtype=np.uint32).view(np.float32)
    x = x[x < np.finfo(np.float32).max]
    assert np.array_equal(ulp(x, FP32), np.spacing(x).astype(np.float64))
    assert np.array_equal(ulp(torch.from_numpy(x), FP32).numpy(), np.spacing(x).astype(np.float64))
    y = rng.integers(0, 0x7FF0000000000000, 200_000, dtype=np.uint64).view(np.float64)
    y = y[y < np.finfo(np.float64).max]
    assert np.array_equal(ulp(y, FP64), np.spacing(y))
    assert np.array_equal(ulp(-y, FP64), np.spacing(y))
    h = np.arange(0, 0x7BFF, dtype=np.uint16).view(np.float16)  # every finite FP16 below max
    assert np.array_equal(ulp(h, FP16), np.spacing(h).astype(np.float64))


# ----------------------------------------------------------------------------------------------------------
# 13. derived properties versus finfo
# ----------------------------------------------------------------------------------------------------------
def _finfos(fmt):
    out = []
    if fmt in (FP64, FP32, FP16):
        out.append(np.finfo(NP_DTYPE[fmt]))
    elif fmt in NP_DTYPE:
        out.append(md.finfo(NP_DTYPE[fmt]))
    if fmt in TORCH_DTYPE:
        out.append(torch.finfo(TORCH_DTYPE[fmt]))
    return out


@pytest.mark.parametrize("fmt", ALL, ids=str)
def test_properties_match_finfo(fmt):
    infos = _finfos(fmt)
    if fmt == TF32:
        assert fmt.bits == 19 and fmt.max == (2 - 2.0**-10) * 2.0**127
        assert fmt.smallest_normal == 2.0**-126 and fmt.smallest_subnormal == 2.0**-136
        assert fmt.epsilon == 2.0**-10 and fmt.emax == 127 and fmt.emin == -126
        # the range of FP32, the precision of FP16
        assert (fmt.emax, fmt.emin, fmt.smallest_normal) == (FP32.emax, FP32.emin, FP32.smallest_normal)
        assert fmt.max == float(np.array([0x7F7FE000], dtype=np.uint32).view(np.float32)[0])  # FP32 max, 10 bits
        assert fmt.epsilon == FP16.epsilon
        return
    assert infos, fmt
    for fi in infos:
        assert fmt.bits == fi.bits
        assert fmt.max == float(fi.max)
        assert fmt.smallest_normal == float(fi.smallest_normal) == float(fi.tiny)
        assert fmt.epsilon == float(fi.eps)
        if hasattr(fi, "smallest_subnormal"):
            assert fmt.smallest_subnormal == float(fi.smallest_subnormal)
        if hasattr(fi, "nmant"):
            assert fmt.mantissa_bits == fi.nmant and fmt.precision == fi.nmant + 1
            assert fmt.emax == fi.maxexp - 1 and fmt.emin == fi.minexp
            assert fmt.exponent_bits == fi.nexp
        assert -fmt.max == float(fi.min) if fmt.signed else True
    # decimal digits and the summary row
    assert fmt.decimal_digits == pytest.approx(fmt.precision * math.log10(2))
    s = fmt.summary()
    assert s["format"] == fmt.name and s["bits"] == fmt.bits and s["max"] == fmt.max
    assert s["exponent"] + s["mantissa"] + s["sign"] == fmt.bits


def test_catalogue():
    assert list(FORMATS) == [
        "FP64",
        "FP32",
        "TF32",
        "FP16",
        "BF16",
        "FP8_E4M3",
        "FP8_E5M2",
        "FP6_E3M2",
        "FP6_E2M3",
        "FP4_E2M1",
        "E8M0",
    ]
    assert FP8_E4M3.max == 448 and FP8_E5M2.max == 57344 and FP6_E3M2.max == 28 and FP6_E2M3.max == 7.5
    assert FP4_E2M1.max == 6 and E8M0.max == 2.0**127 and E8M0.smallest_normal == 2.0**-127
    twin = FloatFormat("FP16", 5, 10, 15, source="elsewhere")  # the source does not take part in equality
    assert FP16 == twin and hash(FP16) == hash(twin) and FP16 != FloatFormat("half", 5, 10, 15)
    assert FP16 != BF16 and F.ROUNDING_MODES == ("nearest_even", "toward_zero", "stochastic")
    for name in F.__all__:
        assert hasattr(F, name), name


# ----------------------------------------------------------------------------------------------------------
# fixed point and repeated addition
# ----------------------------------------------------------------------------------------------------------
def _ref_fixed(x, int_bits, frac_bits):
    """Round half to even on the grid 2^-frac_bits by floor and an explicit tie test; saturate."""
    step = 2.0**-frac_bits
    with np.errstate(over="ignore", invalid="ignore"):  # huge x: s = ±inf, r = NaN, then k = ±inf is clipped
        s = x / step  # exact: a power of two (or ±inf)
        k = np.floor(s)
        r = s - k  # exact: s and k are within 1 and share the binade (or k = 0)
        up = (r > 0.5) | ((r == 0.5) & (np.fmod(k, 2) != 0))
    y = (k + up) * step
    return np.clip(y, -(2.0**int_bits), 2.0**int_bits - step)


@pytest.mark.filterwarnings("ignore:overflow encountered in divide:RuntimeWarning")  # round_fixed(1e300, ..)
def test_round_fixed_matches_reference():
    rng = np.random.default_rng(21)
    for int_bits, frac_bits in [(3, 0), (0, 7), (7, 8), (15, 16), (1, 30), (20, 32)]:
        step = 2.0**-frac_bits
        k = rng.integers(-(2 ** (int_bits + frac_bits + 1)), 2 ** (int_bits + frac_bits + 1), 50_000)
        ties = (k + 0.5) * step  # exact ties, inside and beyond the range
        x = np.concatenate(
            [
                rng.standard_normal(50_000) * 2.0**int_bits,
                ties,
                np.nextafter(ties, np.inf),
                np.nextafter(ties, -np.inf),
                [0.0, -0.0, np.inf, -np.inf, 1e300],
            ]
        )
        want = _ref_fixed(x, int_bits, frac_bits)
        # values compared with == (fixed point has one zero; the sign of a float zero result is not specified)
        got = F.round_fixed(x, int_bits, frac_bits)
        assert np.array_equal(got, want, equal_nan=True), (int_bits, frac_bits)
        assert np.array_equal(F.round_fixed(torch.from_numpy(x), int_bits, frac_bits).numpy(), want, equal_nan=True)
    assert [F.round_fixed(v, 3, 0) for v in (0.5, 1.5, 2.5, -2.5, 7.5, 100.0, -8.5, -100.0)] == [
        0.0,
        2.0,
        2.0,
        -2.0,
        7.0,
        7.0,
        -8.0,
        -8.0,
    ]
    assert math.copysign(1.0, F.round_fixed(-1e-4, 7, 8)) == 1.0  # one zero: never −0
    with pytest.raises(ValueError, match="NaN"):  # fixed point has no NaN
        F.round_fixed(np.array([1.0, np.nan]), 7, 8)


def test_round_fixed_types_and_errors():
    assert type(F.round_fixed(1.3, 2, 2)) is float and F.round_fixed(1.3, 2, 2) == 1.25
    r = F.round_fixed(np.array([1.3, 2.6], dtype=np.float32), 2, 2)
    assert r.dtype == np.float32 and r.tolist() == [1.25, 2.5]
    t = F.round_fixed(torch.tensor([[1.3]], dtype=torch.float16), 2, 2)
    assert t.dtype == torch.float16 and t.shape == (1, 1) and t.item() == 1.25
    for args in [(1.0, 1.0, 2), (1.0, 2, True), (1.0, "2", 2)]:
        with pytest.raises(TypeError):
            F.round_fixed(*args)
    for args in [(1.0, -1, 2), (1.0, 2, -1), (1.0, 30, 23)]:
        with pytest.raises(ValueError):
            F.round_fixed(*args)
    with pytest.raises(TypeError):
        F.round_fixed([1.0], 2, 2)


@pytest.mark.parametrize(
    "fmt, dtype", [(FP32, np.float32), (FP16, np.float16), (BF16, md.bfloat16)], ids=["FP32", "FP16", "BF16"]
)
def test_accumulate_matches_native_arithmetic(fmt, dtype):
    """w ← fmt(w + u) step by step equals the dtype's own correctly rounded additions."""
    rng = np.random.default_rng(22)
    start = rng.standard_normal(2_000) * 10
    inc = rng.standard_normal(2_000) * 10.0 ** rng.integers(-6, 0, 2_000)
    out = F.accumulate(start, inc, 50, fmt)
    assert out.shape == (51, 2_000) and out.dtype == np.float64
    w, u = start.astype(np.float32).astype(dtype), inc.astype(np.float32).astype(dtype)
    if fmt == FP32:
        w, u = start.astype(np.float32), inc.astype(np.float32)
    assert same(out[0], round_to(start, fmt))
    for k in range(1, 51):
        w = (w + u).astype(dtype)
        assert same(out[k], w.astype(np.float64)), (fmt, k)


def test_accumulate_swamping_and_stochastic_mean():
    u = 2.0**-12  # a quarter of FP16's ulp at 1
    out = F.accumulate(1.0, u, 100, FP16)
    assert out.shape == (101,) and (out == 1.0).all()  # every update is lost
    assert (F.accumulate(1.0, u, 10, FP16, rounding="toward_zero") == 1.0).all()
    n, steps = 20_000, 20
    sr = F.accumulate(np.ones(n), u, steps, FP16, rounding="stochastic", generator=123)
    final = sr[-1]
    assert np.isin(final, 1.0 + np.arange(0, steps + 1) * 2.0**-10).all()
    # each step rounds up with probability 1/4 while w = 1 + j·2^-10 (u stays a quarter ulp): the mean grows
    # by u per step; the standard deviation of the final value is at most sqrt(steps/4·3/4)·ulp
    sd = math.sqrt(steps * 0.25 * 0.75) * 2.0**-10 / math.sqrt(n)
    assert abs(final.mean() - (1 + steps * u)) <= 6 * sd
    again = F.accumulate(np.ones(n), u, steps, FP16, rounding="stochastic", generator=123)
    assert np.array_equal(sr, again)
    with pytest.raises(ValueError):
        F.accumulate(1.0, u, -1, FP16)
    for bad in [(1.0, u, 2.0, FP16), (1.0, u, True, FP16), (torch.ones(2), u, 3, FP16), ("1", u, 3, FP16)]:
        with pytest.raises(TypeError):
            F.accumulate(*bad)
    with pytest.raises(ValueError):
        F.accumulate(1.0, u, 3, FP16, rounding="up")
