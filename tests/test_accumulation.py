"""Tests of :mod:`mpt_lab.accumulation` against an exact rational oracle written here.

The oracle (``Oracle``) uses :class:`fractions.Fraction` for every finite value and its own rounding to a
format's parameters (``round_fraction``: round-to-nearest-even or toward zero, subnormals, overflow as the
format has it), with IEEE 754-2019's rules for NaN, infinities and signed zeros (§6.2, §6.3).  It shares no
code with the module or with :mod:`mpt_lab.formats` (only the field widths of the formats).  Results are
compared bit for bit: the same value, the same sign of zero, NaN at the same places.
"""

from __future__ import annotations

import math
import zlib
from fractions import Fraction

import ml_dtypes as md
import numpy as np
import pytest
import torch

from mpt_lab import accumulation as acc
from mpt_lab.formats import BF16, FP8_E4M3, FP8_E5M2, FP16, FP32, FP64, TF32, FloatFormat, get_format, round_to

torch.set_num_threads(1)

NARROW = FloatFormat("FP22", 8, 13, 127, source="a 14-bit-precision accumulator (tests)")
P26 = FloatFormat("P26", 8, 25, 127, source="26-bit precision (tests)")


# ----------------------------------------------------------------------------------------------------------
# The oracle
# ----------------------------------------------------------------------------------------------------------
def _params(fmt: FloatFormat):
    m = fmt.mantissa_bits
    emin = 1 - fmt.bias
    top = (1 << fmt.exponent_bits) - 1
    emax_field = top - 1 if fmt.nan == "ieee" else top
    max_mant = (1 << m) - 1 - (1 if fmt.nan == "single" else 0)
    largest = Fraction((1 << m) + max_mant, 1 << m) * Fraction(2) ** (emax_field - fmt.bias)
    return m, emin, largest


def _floor_log2(x: Fraction) -> int:
    e = x.numerator.bit_length() - x.denominator.bit_length()
    if Fraction(2) ** e > x:
        e -= 1
    return e


def round_fraction(x: Fraction, fmt: FloatFormat, rounding: str) -> float:
    """x (non-zero) rounded to fmt: a Python float (every value of the formats here is a float64)."""
    m, emin, largest = _params(fmt)
    sign = -1 if x < 0 else 1
    ax = abs(x)
    e = max(_floor_log2(ax), emin)
    quantum = Fraction(2) ** (e - m)
    n = ax / quantum
    whole = n.numerator // n.denominator
    rest = n - whole
    if rounding == "nearest_even" and (rest > Fraction(1, 2) or (rest == Fraction(1, 2) and whole % 2 == 1)):
        whole += 1
    r = whole * quantum
    if r > largest:
        if rounding == "toward_zero" or (not fmt.infinities and fmt.nan == "none"):
            r = largest
        elif fmt.infinities:
            return sign * math.inf
        else:
            return math.nan
    if r == 0:
        return math.copysign(0.0, sign)
    return sign * float(r)


class Oracle:
    """IEEE 754 arithmetic on Python floats, each operation exact (Fraction) and then rounded once."""

    def __init__(self, fmt: FloatFormat, rounding: str = "nearest_even"):
        self.fmt, self.rounding = fmt, rounding

    def round(self, x) -> float:
        if isinstance(x, float):  # ±inf or NaN
            if math.isnan(x) or self.fmt.infinities:
                return x
            return math.nan if self.fmt.nan != "none" else math.copysign(float(_params(self.fmt)[2]), x)
        return round_fraction(x, self.fmt, self.rounding)

    def add(self, u: float, v: float) -> float:
        if math.isnan(u) or math.isnan(v):
            return math.nan
        if math.isinf(u) or math.isinf(v):
            if math.isinf(u) and math.isinf(v) and (u > 0) != (v > 0):
                return math.nan
            return u if math.isinf(u) else v
        exact = Fraction(u) + Fraction(v)
        if exact == 0:  # IEEE 754 §6.3: x + (−x) = +0 (nearest, toward zero); −0 + −0 = −0
            both_negative_zero = u == 0 and v == 0 and math.copysign(1, u) < 0 and math.copysign(1, v) < 0
            return -0.0 if both_negative_zero else 0.0
        return self.round(exact)

    def mul(self, a: float, b: float) -> float:
        if math.isnan(a) or math.isnan(b):
            return math.nan
        negative = (math.copysign(1, a) < 0) != (math.copysign(1, b) < 0)
        if math.isinf(a) or math.isinf(b):
            if a == 0 or b == 0:
                return math.nan
            return self.round(-math.inf if negative else math.inf)
        exact = Fraction(a) * Fraction(b)
        if exact == 0:
            return -0.0 if negative else 0.0
        return self.round(exact)


def oracle_dot(
    a, b, accumulator, products=None, order="sequential", block_size=None, compensated=False, rounding="nearest_even"
) -> float:
    """One dot product of two 1-D float64 arrays, written from the docstring's definitions."""
    A = Oracle(accumulator, rounding)
    P = Oracle(products or accumulator)
    p = [P.mul(float(x), float(y)) for x, y in zip(a, b)]
    if order == "pairwise":
        level = list(p) or [0.0]
        while len(level) > 1:
            nxt = [A.add(level[i], level[i + 1]) for i in range(0, len(level) - 1, 2)]
            if len(level) % 2:
                nxt.append(level[-1])
            level = nxt
        return level[0]
    if order == "blocked":
        total, T = 0.0, Oracle(FP32)
        for k0 in range(0, len(p), block_size):
            s = 0.0
            for x in p[k0 : k0 + block_size]:
                s = A.add(s, x)
            total = T.add(total, s)
        return total
    s, c = 0.0, 0.0
    for x in p:
        if compensated:
            y = A.add(x, -c)
            t = A.add(s, y)
            c = A.add(A.add(t, -s), -y)
            s = t
        else:
            s = A.add(s, x)
    return s


def same_bits(result, expected) -> None:
    r = np.asarray(result, dtype=np.float64).reshape(-1)
    e = np.asarray(expected, dtype=np.float64).reshape(-1)
    assert r.shape == e.shape
    nan = np.isnan(e)
    assert np.array_equal(np.isnan(r), nan), (r, e)
    assert np.array_equal(r[~nan], e[~nan]), (r[~nan], e[~nan])
    assert np.array_equal(np.signbit(r[~nan]), np.signbit(e[~nan])), "signs of zero differ"


def check(a, b, **kw):
    """dot on 2-D a, b (rows are dot products) equals the oracle row by row."""
    got = acc.dot(a, b, **kw)
    kw = {**kw, "accumulator": get_format(kw.get("accumulator", "FP32"))}
    if kw.get("products") is not None:
        kw["products"] = get_format(kw["products"])
    a64 = np.asarray(a, dtype=np.float64).reshape(-1, np.shape(a)[-1])
    b64 = np.broadcast_to(np.asarray(b, dtype=np.float64), np.shape(a)).reshape(-1, np.shape(a)[-1])
    expected = [oracle_dot(x, y, **kw) for x, y in zip(a64, b64)]
    same_bits(got, expected)
    return got


def _random(rng, shape, scale_bits=6, dtype=np.float32):
    """Random values of mixed signs whose magnitudes spread over 2**±scale_bits."""
    x = rng.standard_normal(shape) * np.exp2(rng.integers(-scale_bits, scale_bits + 1, shape))
    return x.astype(dtype)


# ----------------------------------------------------------------------------------------------------------
# The oracle checks itself on cases whose answers are known by hand
# ----------------------------------------------------------------------------------------------------------
def test_oracle_known_cases():
    h = Oracle(FP16)
    assert h.add(1.0, 2.0**-11) == 1.0  # tie to even
    assert h.add(1.0 + 2**-10, 2.0**-11) == 1.0 + 2**-9  # tie to even (up)
    assert h.add(65504.0, 15.0) == 65504.0  # below the overflow threshold 65520
    assert h.add(65504.0, 16.0) == math.inf  # at the threshold: a tie, to even 2**16: inf
    assert Oracle(FP16, "toward_zero").add(65504.0, 32.0) == 65504.0
    assert h.add(2.0**-24, 2.0**-25) == 2.0**-23  # subnormal tie to even
    assert math.copysign(1, h.add(-0.0, -0.0)) < 0 and math.copysign(1, h.add(1.0, -1.0)) > 0
    assert math.isnan(h.add(math.inf, -math.inf)) and math.isnan(h.mul(math.inf, 0.0))
    assert Oracle(BF16).add(256.0, 1.0) == 256.0
    assert math.isnan(Oracle(FP8_E4M3).mul(30.0, 30.0))  # E4M3: overflow is NaN


# ----------------------------------------------------------------------------------------------------------
# Exactness: every order, format, rounding and Kahan
# ----------------------------------------------------------------------------------------------------------
FORMATS = [FP32, FP16, BF16, TF32, NARROW, FP64]


@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.name)
@pytest.mark.parametrize("order", acc.ORDERS)
def test_every_order_and_format(fmt, order):
    rng = np.random.default_rng(zlib.crc32(f"{fmt.name}/{order}".encode()))
    kw = {"accumulator": fmt, "order": order}
    if order == "blocked":
        kw["block_size"] = 8
    for K in (1, 2, 3, 7, 8, 33, 64):
        a = _random(rng, (4, K))
        b = _random(rng, (4, K))
        check(a, b, **kw)


@pytest.mark.parametrize("fmt", [FP32, FP16, BF16, NARROW], ids=lambda f: f.name)
@pytest.mark.parametrize("rounding", acc.ROUNDINGS)
def test_kahan_and_rounding(fmt, rounding):
    rng = np.random.default_rng(7)
    a = _random(rng, (5, 50), scale_bits=3)
    b = _random(rng, (5, 50), scale_bits=3)
    check(a, b, accumulator=fmt, compensated=True, rounding=rounding)
    check(a, b, accumulator=fmt, rounding=rounding)
    check(a, b, accumulator=fmt, order="pairwise", rounding=rounding)
    check(a, b, accumulator=fmt, order="blocked", block_size=16, rounding=rounding, products="FP32")


@pytest.mark.parametrize("products", [FP32, FP16, BF16, FP8_E5M2, FP8_E4M3, P26, FP64], ids=lambda f: f.name)
def test_products_formats(products):
    rng = np.random.default_rng(3)
    a = _random(rng, (4, 40), scale_bits=4)
    b = _random(rng, (4, 40), scale_bits=4)
    for fmt in (FP16, FP32, NARROW):
        check(a, b, accumulator=fmt, products=products)
        check(a, b, accumulator=fmt, products=products, order="pairwise")


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64, md.bfloat16])
def test_input_dtypes_take_every_product_path(dtype):
    """FP16 inputs (products exact in float32), float32/bfloat16 (exact in float64) and float64 inputs
    (Dekker's TwoProduct) give the oracle's answer with native and generic accumulators alike."""
    rng = np.random.default_rng(11)
    a = (rng.standard_normal((3, 30)) / 3).astype(dtype)
    b = (rng.standard_normal((3, 30)) / 7).astype(dtype)
    for fmt in (FP16, BF16, FP32, NARROW, FP64):
        check(a, b, accumulator=fmt)
        check(a, b, accumulator=fmt, products="FP32")


# ----------------------------------------------------------------------------------------------------------
# Edge cases
# ----------------------------------------------------------------------------------------------------------
def test_fp16_overflow_to_infinity_and_nan():
    a = np.array(
        [
            [60000.0, 6000.0, 1.0, -30000.0],  # 66000 → overflow, stays inf
            [60000.0, 5504.0, -2.0, 1.0],  # exactly 65504 = max: no overflow
            [60000.0, 6000.0, -60000.0, 1.0],
        ],
        dtype=np.float32,
    )
    b = np.ones((3, 4), dtype=np.float32)
    got = check(a, b, accumulator="FP16")
    assert got[0] == np.inf and got[1] == 65504.0 and got[2] == np.inf
    # the same sum in FP32 is finite; rounding toward zero saturates at max instead
    check(a, b, accumulator="FP32")
    got = check(a, b, accumulator="FP16", rounding="toward_zero")
    assert np.isfinite(got[0])
    # +inf then −inf (products beyond 65504 are already infinite in FP16): NaN
    inf = np.array([[60000.0, 6000.0, -70000.0]], dtype=np.float32)
    got = check(inf, np.ones_like(inf), accumulator="FP16")
    assert np.isnan(got[0])


def test_subnormal_partial_sums():
    # FP16 subnormals: multiples of 2**-24 below 2**-14; BF16 subnormals: multiples of 2**-133 below 2**-126
    rng = np.random.default_rng(5)
    a = (rng.integers(-40, 41, (6, 20)) * 2.0**-26).astype(np.float32)
    b = np.ones((6, 20), dtype=np.float32)
    got = check(a, b, accumulator="FP16")
    assert np.all(np.abs(got) < 2.0**-14)
    check(a, b, accumulator="FP16", order="pairwise")
    check(a, b, accumulator="FP16", compensated=True)
    tiny = (rng.integers(-40, 41, (6, 20)) * 2.0**-135).astype(np.float32)
    check(tiny, b, accumulator="BF16")
    check(tiny, b, accumulator="BF16", order="pairwise")
    check(tiny, b, accumulator="FP32", products="BF16")


def test_ties_round_to_even_and_the_double_rounding_traps():
    # FP16 accumulator, FP16 products: 1 + 2**-11 is halfway between 1 and 1 + 2**-10
    a = np.array([[1.0, 2.0**-11], [1.0 + 2**-10, 2.0**-11], [1.0, -(2.0**-12)]], dtype=np.float32)
    got = check(a, np.ones_like(a), accumulator="FP16")
    assert list(got) == [1.0, 1.0 + 2**-9, 1.0]
    # BF16 accumulator, FP32 products: a tiny partial sum breaks the tie of a later 1 + 2**-8
    # (float64 alone would lose it: 1 + 2**-8 + 2**-133 is not a float64)
    a = np.array([[2.0**-133, 1 + 2**-8], [-(2.0**-133), 1 + 2**-8]], dtype=np.float32)
    got = check(a, np.ones_like(a), accumulator="BF16", products="FP32")
    assert list(got) == [1 + 2**-7, 1.0]
    got = check(a, np.ones_like(a), accumulator="BF16", products="FP32", order="pairwise")
    assert list(got) == [1 + 2**-7, 1.0]
    # a float64 product whose float64 rounding lands exactly on an FP16 tie: 5·b = T + δ, 0 < δ < 2**-53
    T = Fraction(1) + Fraction(1, 2**11)
    b = float(T / 5)
    while not (0 < 5 * Fraction(b) - T < Fraction(1, 2**53)):
        b = math.nextafter(b, math.inf if 5 * Fraction(b) < T else -math.inf)
    assert 5.0 * b == float(T)  # float64 arithmetic sees the tie ...
    got = check(np.array([[5.0]]), np.array([[b]]), accumulator="FP16")
    assert got[0] == 1 + 2**-10  # ... the exact product is above it


def test_k_equal_one_and_zero():
    a = np.array([[3.0], [-0.0], [1e-30]], dtype=np.float32)
    got = check(a, np.ones_like(a), accumulator="FP16")
    assert got[0] == 3.0 and got[1] == 0 and not np.signbit(got[1])  # +0 + (−0) = +0
    assert got[2] == 0.0
    empty = acc.dot(np.zeros((2, 0), np.float32), np.zeros((2, 0), np.float32), accumulator="FP16")
    assert empty.shape == (2,) and np.all(empty == 0)


def test_signed_zeros_pairwise():
    a = np.array([[-0.0, -0.0, -0.0], [-0.0, 0.0, -0.0]], dtype=np.float32)
    got = check(a, np.ones_like(a), accumulator="FP16", order="pairwise")
    assert np.signbit(got[0]) and not np.signbit(got[1])


def test_nan_and_infinite_inputs():
    a = np.array([[1.0, np.nan, 2.0], [np.inf, 1.0, 2.0], [np.inf, 0.0, 1.0], [np.inf, -np.inf, 1.0]])
    b = np.array([[1.0, 1.0, 1.0], [1.0, 1.0, 1.0], [1.0, 5.0, 1.0], [1.0, 1.0, 1.0]])
    for order, extra in (("sequential", {}), ("pairwise", {}), ("blocked", {"block_size": 2})):
        got = check(a, b, accumulator="FP16", order=order, **extra)
        assert np.isnan(got[0]) and got[1] == np.inf and got[2] == np.inf and np.isnan(got[3])
    check(a.astype(np.float32), b.astype(np.float32), accumulator=NARROW, rounding="toward_zero")


def test_float64_products_beyond_dekkers_range():
    a = np.array([[2.0**1000 * (1 + 2**-30), 2.0**-1000 * (1 + 2**-40), 3.0]])
    b = np.array([[2.0**-1005 * (1 + 2**-20), 2.0**990 * (1 + 2**-45), 1 / 3]])
    check(a, b, accumulator="FP32")
    check(a, b, accumulator=FP64)
    tiny = np.array([[2.0**-500 * 1.5, 2.0**-140]]), np.array([[2.0**-600 * (1 + 2**-50), 2.0**-10]])
    check(*tiny, accumulator="FP32")


def test_pairwise_in_chunks_is_the_same_tree(monkeypatch):
    """Long sums are reduced by power-of-two chunks joined by a binary counter: the oracle's level-by-level
    tree, for every K (chunks of 4 products here)."""
    rng = np.random.default_rng(9)
    monkeypatch.setattr(acc, "_CHUNK_ELEMENTS", 4 * 3)
    for K in list(range(1, 20)) + [31, 32, 33, 45]:
        a = _random(rng, (3, K), scale_bits=8)
        b = _random(rng, (3, K), scale_bits=8)
        check(a, b, accumulator="FP16", order="pairwise")
        check(a, b, accumulator=NARROW, order="pairwise", products="FP32")
        check(a, b, accumulator="FP32", order="sequential")
        check(a, b, accumulator="BF16", order="blocked", block_size=3)


# ----------------------------------------------------------------------------------------------------------
# The fast paths against the general one, on many values
# ----------------------------------------------------------------------------------------------------------
def test_native_additions_are_correctly_rounded():
    """Figueroa's double-rounding argument as used: torch's float16/bfloat16 CPU additions of two FP16/BF16
    values equal the exact sum rounded once (the exact sum of two such values is a float64: the reference)."""
    rng = np.random.default_rng(1)
    bits = rng.integers(0, 2**16, (2, 1_000_000), dtype=np.uint16)
    for dtype, npview in ((torch.float16, np.float16), (torch.bfloat16, md.bfloat16)):
        with np.errstate(invalid="ignore"):  # NaN bit patterns
            x = bits.view(npview).astype(np.float64)
        x = x[:, np.isfinite(x).all(axis=0)]
        u, v = torch.from_numpy(x[0]).to(dtype), torch.from_numpy(x[1]).to(dtype)
        got = (u + v).to(torch.float64).numpy()
        fmt = FP16 if dtype is torch.float16 else BF16
        expected = round_to(x[0] + x[1], fmt)
        same_bits(got, expected)


def test_native_products_are_correctly_rounded():
    """The fast path's products: torch's CPU float16·float16 → float16 and float32·float32 → bfloat16 (out=)
    multiplications of FP16 values equal the exact product (a float64 here) rounded once."""
    rng = np.random.default_rng(12)
    bits = rng.integers(0, 2**16, (2, 1_000_000), dtype=np.uint16)
    with np.errstate(invalid="ignore"):
        x = bits.view(np.float16).astype(np.float64)
    x = x[:, np.isfinite(x).all(axis=0)]
    exact = x[0] * x[1]  # 22-bit products: exact in float64
    h = torch.from_numpy(x).to(torch.float16)
    out = torch.empty(x.shape[1], dtype=torch.float16)
    torch.mul(h[0], h[1], out=out)
    same_bits(out.double().numpy(), round_to(exact, FP16))
    f = h.float()
    out = torch.empty(x.shape[1], dtype=torch.bfloat16)
    torch.mul(f[0], f[1], out=out)
    same_bits(out.double().numpy(), round_to(exact, BF16))


def test_native_and_general_paths_agree(monkeypatch):
    rng = np.random.default_rng(2)
    a = _random(rng, (64, 300), scale_bits=10)
    b = _random(rng, (64, 300), scale_bits=10)
    cases = [
        dict(accumulator=f, order=o, **({"block_size": 32} if o == "blocked" else {}))
        for f in ("FP16", "BF16", "FP32")
        for o in acc.ORDERS
    ]
    cases += [
        dict(accumulator="FP16", compensated=True),
        dict(accumulator="FP32", products="FP16"),
        dict(accumulator="FP32", products="BF16", order="pairwise"),
    ]
    inputs = [(a, b), (a.astype(np.float16), b.astype(np.float16))]  # FP16 inputs take the fused fast path
    fast = [[acc.dot(x, y, **kw) for kw in cases] for x, y in inputs]
    monkeypatch.setattr(acc, "_NATIVE", {})  # every addition through TwoSum, rounding to odd and round_to
    for (x, y), want in zip(inputs, fast):
        for kw, w in zip(cases, want):
            same_bits(acc.dot(x, y, **kw), w)


# ----------------------------------------------------------------------------------------------------------
# Shapes, types, dtypes, matmul, partial sums
# ----------------------------------------------------------------------------------------------------------
def test_types_and_dtypes_returned():
    rng = np.random.default_rng(4)
    a, b = _random(rng, 16), _random(rng, 16)
    r = acc.dot(a, b, accumulator="FP16")
    assert isinstance(r, np.float32)  # 1-D NumPy inputs: a NumPy scalar
    assert acc.dot(a, b, accumulator=FP64).dtype == np.float64
    assert acc.dot(a, b, accumulator=FP64, order="blocked", block_size=4).dtype == np.float32  # FP32 total
    assert acc.dot(a, b, accumulator=NARROW).dtype == np.float32
    t = acc.dot(torch.from_numpy(a).requires_grad_(), torch.from_numpy(b), accumulator="BF16")
    assert isinstance(t, torch.Tensor) and t.dtype == torch.float32 and t.shape == () and not t.requires_grad
    assert float(t) == float(acc.dot(a, b, accumulator="BF16"))
    assert acc.dot(torch.from_numpy(a).double(), torch.from_numpy(b).double(), accumulator=FP64).dtype == torch.float64
    # bfloat16 and float8 tensors, ml_dtypes arrays: their values, exactly
    x8 = torch.from_numpy(a).to(torch.float8_e4m3fn)
    same_bits(acc.dot(x8, x8, accumulator="FP16"), acc.dot(x8.float(), x8.float(), accumulator="FP16"))
    same_bits(
        acc.dot(a.astype(md.bfloat16), b, accumulator="FP16"),
        acc.dot(a.astype(md.bfloat16).astype(np.float32), b, accumulator="FP16"),
    )


def test_batched_leading_axes_broadcast():
    rng = np.random.default_rng(6)
    a = _random(rng, (2, 3, 20))
    b = _random(rng, (3, 20))
    got = acc.dot(a, b, accumulator="FP16", order="pairwise")
    assert got.shape == (2, 3)
    for i in range(2):
        same_bits(got[i], [oracle_dot(a[i, j], b[j], FP16, order="pairwise") for j in range(3)])
    col = _random(rng, (4, 1, 20))
    assert acc.dot(col, b, accumulator="FP16").shape == (4, 3)


@pytest.mark.parametrize(
    "kw",
    [
        dict(accumulator="FP16"),
        dict(accumulator="BF16", order="pairwise"),
        dict(accumulator=NARROW, products="FP32", order="blocked", block_size=5, rounding="toward_zero"),
        dict(accumulator="FP32", compensated=True),
    ],
    ids=str,
)
def test_matmul_is_dot_of_rows_and_columns(kw):
    rng = np.random.default_rng(8)
    A = torch.from_numpy(_random(rng, (2, 5, 23)))
    B = torch.from_numpy(_random(rng, (23, 4)))
    C = acc.matmul(A, B, **kw)
    assert C.shape == (2, 5, 4) and isinstance(C, torch.Tensor)
    for i in range(5):
        for j in range(4):
            same_bits(C[1, i, j], acc.dot(A[1, i], B[:, j], **kw))
    Cn = acc.matmul(A[0].numpy(), B.numpy(), **kw)
    assert isinstance(Cn, np.ndarray)
    same_bits(Cn, C[0])
    same_bits(
        C[0, 2],
        [
            oracle_dot(
                A[0, 2].numpy(),
                B[:, j].numpy(),
                **{
                    **kw,
                    "accumulator": get_format(kw["accumulator"]),
                    **({"products": get_format(kw["products"])} if "products" in kw else {}),
                },
            )
            for j in range(4)
        ],
    )


def test_fp32_accumulation_of_fp32_products_is_torch_float32_matmul_in_order():
    """Sequential FP32 accumulation of FP32 products is a plain float32 loop: s = s + a_k * b_k."""
    rng = np.random.default_rng(10)
    a, b = _random(rng, (3, 50)), _random(rng, (3, 50))
    s = np.zeros(3, dtype=np.float32)
    for k in range(50):
        s = (s + a[:, k] * b[:, k]).astype(np.float32)
    same_bits(acc.dot(a, b, accumulator="FP32"), s)


def test_partial_sums_show_swamping():
    """Adding 1 to an FP16 running sum stalls at 2048, where half an ulp (1) ties to the even 2048."""
    ones = np.ones(3000, dtype=np.float32)
    run = acc.partial_sums(ones, ones, accumulator="FP16")
    assert run.shape == (3000,) and run[2046] == 2047 and run[2047] == 2048 and np.all(run[2047:] == 2048)
    assert acc.partial_sums(ones, ones, accumulator="FP32")[-1] == 3000
    assert acc.partial_sums(ones, ones, accumulator="FP16", compensated=True)[-1] == 3000  # Kahan recovers
    same_bits(
        acc.partial_sums(ones[None], ones[None], accumulator="BF16")[:, -1],
        acc.dot(ones[None], ones[None], accumulator="BF16"),
    )
    assert acc.partial_sums(np.zeros((2, 0), np.float32), np.zeros(0, np.float32)).shape == (2, 0)


def test_unit_roundoff():
    assert acc.unit_roundoff("FP16") == 2.0**-11 and acc.unit_roundoff("FP32") == 2.0**-24
    assert acc.unit_roundoff(NARROW, "toward_zero") == 2.0**-13


# ----------------------------------------------------------------------------------------------------------
# Bad input
# ----------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "call, error, words",
    [
        (lambda x: acc.dot(x, x[:, :3]), ValueError, "b"),
        (lambda x: acc.dot(x, x, order="random"), ValueError, "order"),
        (lambda x: acc.dot(x, x, order=3), TypeError, "order"),
        (lambda x: acc.dot(x, x, order="blocked"), ValueError, "block_size"),
        (lambda x: acc.dot(x, x, order="blocked", block_size=0), ValueError, "block_size"),
        (lambda x: acc.dot(x, x, order="blocked", block_size=2.0), TypeError, "block_size"),
        (lambda x: acc.dot(x, x, block_size=4), ValueError, "block_size"),
        (lambda x: acc.dot(x, x, accumulator="FP17"), ValueError, "accumulator"),
        (lambda x: acc.dot(x, x, accumulator=16), TypeError, "accumulator"),
        (lambda x: acc.dot(x, x, products="nope"), ValueError, "products"),
        (lambda x: acc.dot(x, x, accumulator="E8M0"), ValueError, "accumulator"),
        (lambda x: acc.dot(x, x, accumulator=FloatFormat("W", 11, 52, 1000)), ValueError, "accumulator"),
        (lambda x: acc.dot(x, x, compensated=True, order="pairwise"), ValueError, "compensated"),
        (lambda x: acc.dot(x, x, compensated=1), TypeError, "compensated"),
        (lambda x: acc.dot(x, x, rounding="stochastic"), ValueError, "rounding"),
        (lambda x: acc.dot(x.tolist(), x), TypeError, "a"),
        (lambda x: acc.dot(x, x.astype(np.int64)), TypeError, "b"),
        (lambda x: acc.dot(x, torch.from_numpy(x)), TypeError, "NumPy"),
        (lambda x: acc.dot(np.float32(1.0), x), ValueError, "last axis"),
        (lambda x: acc.dot(x[:, None, :], np.zeros((4, 3, 5), np.float32)), ValueError, "broadcast"),
        (lambda x: acc.matmul(x, x), ValueError, "K"),
        (lambda x: acc.matmul(x[0], x.T), ValueError, "(..., M, K)"),
        (lambda x: acc.dot(torch.zeros(2, 5, device="meta"), torch.zeros(2, 5, device="meta")), ValueError, "meta"),
        # issue 29, item 8: a 0-d NumPy input has no axis K, as a 0-d tensor has none (it was taken as K = 1)
        (lambda x: acc.dot(np.array(3.0), np.array(2.0)), ValueError, "last axis K"),
        (lambda x: acc.dot(np.float32(3.0), np.float32(2.0)), ValueError, "last axis K"),
        (lambda x: acc.dot(torch.tensor(3.0), torch.tensor(2.0)), ValueError, "last axis K"),
        (lambda x: acc.partial_sums(np.array(3.0), np.array(2.0)), ValueError, "last axis K"),
        (lambda x: acc.tensor_core_dot(np.array(3.0, np.float32), np.array(2.0, np.float32)), ValueError, "K"),
    ],
)
def test_bad_input_names_the_argument(call, error, words):
    x = np.ones((2, 5), dtype=np.float32)
    with pytest.raises(error, match=words.replace("(", r"\(").replace(")", r"\)").replace(".", r"\.")):
        call(x)


# ----------------------------------------------------------------------------------------------------------
# The tensor-core model and Kahan-compensated weights
# ----------------------------------------------------------------------------------------------------------
def _oracle_tensor_core(a, b, group, bits, promote_every=None) -> float:
    """DeepSeek-V3 §3.5.2's description, written with Fractions: groups of products truncated below the group's
    largest exponent, summed exactly, added to a ``bits``-bit accumulator that truncates; optional promotion."""
    acc_fmt = FloatFormat("T", 8, bits - 1, 127)
    A, T = Oracle(acc_fmt, "toward_zero"), Oracle(FP32)
    p = [Fraction(float(x)) * Fraction(float(y)) for x, y in zip(a, b)]
    s, total = 0.0, 0.0
    for g0 in range(0, len(p), group):
        g = p[g0 : g0 + group]
        big = max(abs(x) for x in g)
        if big == 0:
            gsum = Fraction(0)
        else:
            q = Fraction(2) ** (_floor_log2(big) - (bits - 1))
            gsum = sum((Fraction(int(x / q)) * q for x in g), Fraction(0))  # int() truncates toward zero
        s = A.add(s, float(gsum))
        if promote_every and ((g0 + group) % promote_every == 0 or g0 + group >= len(p)):
            total, s = T.add(total, s), 0.0
    return total if promote_every else s


@pytest.mark.parametrize(
    "kw", [dict(), dict(promote_every=64), dict(group=4, bits=8), dict(group=8, bits=10, promote_every=16)], ids=str
)
def test_tensor_core_dot_against_its_description(kw):
    rng = np.random.default_rng(13)
    a = round_to(rng.uniform(-1, 1, (6, 200)).astype(np.float32), FP8_E4M3)
    b = round_to(rng.uniform(0, 2, (6, 200)).astype(np.float32), FP8_E4M3)
    a[0, :40] = 0.0  # an all-zero group
    got = acc.tensor_core_dot(a, b, **kw)
    assert got.dtype == np.float32 and got.shape == (6,)
    want = [
        _oracle_tensor_core(x, y, kw.get("group", 32), kw.get("bits", 14), kw.get("promote_every"))
        for x, y in zip(a, b)
    ]
    same_bits(got, want)


def test_tensor_core_dot_sums_each_group_exactly_then_rounds_toward_zero_once():
    """Issue 29, item 8: group sums wider than 24 bits (bits + log2(group) > 24) and products below FP32's normal
    range are added to the accumulator as they are, then rounded toward zero once: the rational oracle, over
    many cases (the float32 products path rounded them to nearest first)."""
    got = acc.tensor_core_dot(np.array([1, 1 + 3 * 2.0**-23], np.float32), np.ones(2, np.float32), group=32, bits=24)
    assert float(got) == 2 + 2.0**-22 == _oracle_tensor_core([1, 1 + 3 * 2.0**-23], [1, 1], 32, 24)
    rng = np.random.default_rng(29)
    cases = []
    for kw in (
        dict(group=32, bits=24),
        dict(group=64, bits=22),
        dict(group=4, bits=23),
        dict(group=16, bits=24, promote_every=32),
        dict(group=32, bits=14),
    ):
        for scale in (0, -70, 60):  # products near 1, below 2^-126, large
            a = _random(rng, (40, 96), scale_bits=3) * np.float32(2.0 ** (scale // 2))
            b = _random(rng, (40, 96), scale_bits=3) * np.float32(2.0 ** (scale - scale // 2))
            a[:5] = np.abs(a[:5])  # same-signed groups: the widest sums
            b[:5] = np.abs(b[:5])
            got = acc.tensor_core_dot(a, b, **kw)
            want = [_oracle_tensor_core(x, y, kw["group"], kw["bits"], kw.get("promote_every")) for x, y in zip(a, b)]
            same_bits(got, want)
            cases.append(len(want))
    assert sum(cases) == 600
    tiny = acc.tensor_core_dot(
        np.array([-(2.0**-70) * 1.75], np.float32), np.array([2.0**-74 * 1.375], np.float32), group=32, bits=14
    )
    assert float(tiny) == _oracle_tensor_core([-(2.0**-70) * 1.75], [2.0**-74 * 1.375], 32, 14)


def test_tensor_core_dot_bad_input():
    x = np.ones((2, 64), np.float32)
    with pytest.raises(ValueError, match="promote_every"):
        acc.tensor_core_dot(x, x, promote_every=48)
    with pytest.raises(ValueError, match="bits"):
        acc.tensor_core_dot(x, x, bits=30)
    with pytest.raises(TypeError, match="group"):
        acc.tensor_core_dot(x, x, group=2.0)
    with pytest.raises(ValueError, match="float32 values"):
        acc.tensor_core_dot(x.astype(np.float64) / 3, x)


def test_compensated_update_keeps_what_rounding_loses():
    """1000 updates of 1e-4 to a BF16 weight of 1 (half an ulp there is 2⁻⁸ ≈ 0.0039): rounding to nearest keeps
    1; with Kahan's compensation the weight reaches 1.1 to 1% (the BF16 compensation rounds too)."""
    w_rne = torch.ones(4)
    w = torch.ones(4)
    c = torch.zeros(4)
    u = torch.full((4,), 1e-4)
    for _ in range(1000):
        w_rne = round_to(w_rne + u, BF16)
        acc.compensated_update_(w, u, c, "BF16")
    assert torch.all(w_rne == 1)
    assert torch.all(round_to(w, BF16) == w) and torch.all(round_to(c, BF16) == c)
    assert torch.allclose(w, torch.full((4,), 1.1), rtol=0.01) and torch.all(c.abs() < 2**-7)
    with pytest.raises(ValueError, match="compensation"):
        acc.compensated_update_(w, u, torch.zeros(3))
    with pytest.raises(ValueError, match="fmt"):
        acc.compensated_update_(w, u, c, "E8M0")
    with pytest.raises(TypeError, match="update"):
        acc.compensated_update_(w, 1e-4, c)


# ----------------------------------------------------------------------------------------------------------
# Issue 29, item 7: products of float32 values rounded to FP16/BF16 through float32 (the proof in _Via32)
# ----------------------------------------------------------------------------------------------------------
def _midpoint_products(rng, fmt: FloatFormat, n: int):
    """float32 pairs (a, b) whose exact product lies within a float32 ulp of a midpoint of fmt (so that RN32 of the
    product may land on it), over fmt's normal and subnormal range, beside the overflow threshold, with both
    signs: the products a single float32 rounding gets wrong."""
    t = fmt.mantissa_bits
    top = fmt.emax if fmt is FP16 else 126
    e = rng.integers(fmt.emin - t - 1, top + 1, n)  # binades of the midpoints, subnormal ones too
    k = rng.integers(0, 1 << (t + 1), n)
    mid = np.where(
        e >= fmt.emin,
        (1 + (2 * k + 1) / 2.0 ** (t + 1)) * np.exp2(e),
        (2 * (k % (1 << t)) + 1) * 2.0 ** (fmt.emin - t - 1),
    )  # normal and subnormal midpoints
    b = (1 + rng.integers(1, 1 << 23, n) / 2.0**23).astype(np.float32)  # 24-bit factors
    a = (mid / b.astype(np.float64)).astype(np.float32)  # a·b within ~2⁻²⁴ of the midpoint
    a = a * rng.choice([-1, 1], n).astype(np.float32)
    away = np.copysign(np.float32(np.inf), a)
    a = np.concatenate([a, np.nextafter(a, np.float32(0)), np.nextafter(a, away)])  # and its two neighbours
    b = np.concatenate([b, b, b])
    return a.astype(np.float32), b.astype(np.float32)


@pytest.mark.parametrize("fmt, dtype", [(FP16, torch.float16), (BF16, torch.bfloat16)], ids=["FP16", "BF16"])
def test_products_through_float32_are_rounded_once(fmt, dtype):
    """_Via32 gives round_to(exact product) bit for bit: near every kind of midpoint of the format (where one
    float32 rounding first goes wrong), at random, at zeros, overflow, infinities and NaN."""
    rng = np.random.default_rng(29)
    a, b = _midpoint_products(rng, fmt, 20_000)
    r = _random(rng, 30_000, scale_bits=20)
    s = _random(rng, 30_000, scale_bits=20)
    special = np.array(
        [0.0, -0.0, 1.0, np.inf, -np.inf, np.nan, 3e38, 1e-45, 65504.0, 65520.0, 2.0**-25, 2.0**-134, 1 + 2.0**-12],
        dtype=np.float32,
    )
    a = np.concatenate([a, r, np.repeat(special, special.size), [1 + 2.0**-12]]).astype(np.float32)
    b = np.concatenate([b, s, np.tile(special, special.size), [1 + 2.0**-12]]).astype(np.float32)
    with np.errstate(invalid="ignore", over="ignore"):
        exact = a.astype(np.float64) * b  # 48-bit products: exact in float64
        want = round_to(exact, fmt)
        hi = a * b  # one float32 rounding first ...
    once = torch.from_numpy(hi).to(dtype).double().numpy()
    twice_wrong = np.count_nonzero((once != want) & ~np.isnan(want))
    assert twice_wrong > 1000  # ... is wrong on many of these cases
    # as the engine calls it: one chunk of rows (K, N) times a column (K, 1), and the same broadcast the other way
    n = a.size
    x, y = torch.from_numpy(a).reshape(n, 1), torch.from_numpy(b).reshape(n, 1)
    got = acc._Via32(dtype, x, y, (n, 1))(0, n).double().numpy().reshape(-1)
    same_bits(got, want)
    rows = a[:600].reshape(60, 10)
    x = torch.from_numpy(rows).reshape(60, 10, 1)
    y = torch.from_numpy(b[:600].reshape(60, 10)[:, :4]).reshape(60, 1, 4)
    via = acc._Via32(dtype, x, y, (60, 10, 4))
    for k0, k1 in ((0, 60), (7, 31)):  # whole and partial chunks
        got = via(k0, k1).double().numpy()
        exact = x[k0:k1].double().numpy() * y[k0:k1].double().numpy()
        same_bits(got, round_to(exact, fmt))
    # the case: 1 + 2⁻¹¹ + 2⁻²⁴ rounds to the midpoint 1 + 2⁻¹¹ in float32, then to 1 in FP16
    p = acc._Via32(torch.float16, torch.tensor([[1 + 2.0**-12]]), torch.tensor([[1 + 2.0**-12]]), (1, 1))(0, 1)
    assert float(p) == 1 + 2.0**-10 and float(torch.tensor(1 + 2.0**-12) ** 2) == 1 + 2.0**-11


def test_matmul_of_float32_values_with_fp16_products_against_the_oracle():
    """The float32 route inside matmul/dot: FP16 and BF16 products of float32 operands near midpoints, every
    order, the rational oracle."""
    rng = np.random.default_rng(30)
    a, b = _midpoint_products(rng, FP16, 80)
    a, b = a[:240].reshape(6, 40), b[:240].reshape(6, 40)
    for kw in (
        dict(accumulator="FP16"),
        dict(accumulator="FP32", products="FP16"),
        dict(accumulator="FP16", order="pairwise"),
        dict(accumulator=NARROW, products="FP16"),
        dict(accumulator="FP32", products="FP16", order="blocked", block_size=8),
    ):
        check(a, b, **kw)
    a, b = _midpoint_products(rng, BF16, 80)
    a, b = a[:240].reshape(6, 40), b[:240].reshape(6, 40)
    check(a, b, accumulator="BF16")
    check(a, b, accumulator="FP32", products="BF16", order="pairwise")
    C = acc.matmul(torch.from_numpy(a[:, :40]), torch.from_numpy(b.T.copy()), accumulator="FP16")
    same_bits(C[2, 3], acc.dot(a[2], b[3], accumulator="FP16"))


def _oracle_compensated(w: float, u: float, c: float, fmt: FloatFormat):
    """compensated_update_'s docstring, with Fractions: c ← fmt(c + u); old ← w; w ← fmt(w + c);
    c ← fmt(c + fmt(old − w)), each operation exact and rounded once."""
    o = Oracle(fmt)
    c = o.add(c, u)
    old, w = w, o.add(w, c)
    return w, o.add(c, o.add(old, -w))


@pytest.mark.parametrize("fmt", [BF16, FP16, FP8_E4M3, FP32], ids=lambda f: f.name)
def test_compensated_update_rounds_every_operation_once(fmt):
    """Issue 29, item 8: no float32 sum before the rounding to fmt (w = c = 1, u = 2⁻⁸ + 2⁻³¹ in BF16: c = 2⁻⁷);
    the exact oracle over many random steps, float32 and float64 updates."""
    w, c = torch.ones(1), torch.ones(1)
    acc.compensated_update_(w, torch.tensor([2.0**-8 + 2.0**-31], dtype=torch.float64), c, "BF16")
    assert float(c) == 0.0078125 == 2.0**-7 and float(w) == 2.0
    assert _oracle_compensated(1.0, 2.0**-8 + 2.0**-31, 1.0, BF16) == (2.0, 2.0**-7)
    rng = np.random.default_rng(31)
    n = 400
    w = torch.from_numpy(round_to(rng.uniform(-4, 4, n), fmt).astype(np.float32))
    c = torch.from_numpy(round_to(rng.uniform(-1, 1, n) * float(acc.unit_roundoff(fmt)), fmt).astype(np.float32))
    for step in range(6):
        ulp_scale = np.exp2(rng.integers(-14, 2, n)) * float(acc.unit_roundoff(fmt))
        u = rng.standard_normal(n) * ulp_scale  # float64 updates near half an ulp of w
        u[::3] = (u[::3] * 0 + 1) * (
            np.abs(w.numpy()[::3].astype(np.float64)) * float(acc.unit_roundoff(fmt)) * (1 + 2.0**-30)
        )  # a hair above half an ulp of |w| (|w| ≈ 1)
        u = torch.from_numpy(u if step % 2 else u.astype(np.float32).astype(np.float64))
        want = [_oracle_compensated(float(wi), float(ui), float(ci), fmt) for wi, ui, ci in zip(w, u, c)]
        acc.compensated_update_(w, u if step % 2 else u.float(), c, fmt)
        same_bits(w.numpy(), [x for x, _ in want])
        same_bits(c.numpy(), [x for _, x in want])


def test_any_order_bounds_hold_every_summation_order_and_are_not_vacuous():
    """Every order of an FP32 sum of 6 FP16 products (all 720), rounded once to FP16, lies in the interval; and
    the interval is narrow: one FP16 value wide for most sums, as the FP32 error is far below an FP16 ulp."""
    import itertools

    g = torch.Generator().manual_seed(3)
    widths = []
    for trial in range(40):
        a = torch.randn(6, generator=g).half().double()
        b = (torch.randn(6, generator=g) * (2.0**-trial if trial % 4 == 0 else 1.0)).half().double()
        p = (a * b).tolist()  # exact in float64 (and in FP32)
        exact, abs_sum = (
            torch.tensor(math.fsum(p), dtype=torch.float64),
            torch.tensor(math.fsum(map(abs, p)), dtype=torch.float64),
        )
        low, high = acc.any_order_bounds(exact, abs_sum, 6)
        for order in itertools.permutations(range(6)):
            s = torch.zeros((), dtype=torch.float32)
            for i in order:
                s = s + torch.tensor(p[i], dtype=torch.float32)  # FP32 round to nearest at each addition
            got = s.half().double()  # one rounding to FP16 (float32 → float16)
            assert low <= got <= high, (trial, order)
        widths.append(int((high != low).item()))
    assert sum(widths) < len(widths) / 2


def test_any_order_bounds_bad_arguments():
    t = torch.zeros(3, dtype=torch.float64)
    with pytest.raises(TypeError, match="tensors"):
        acc.any_order_bounds([0.0], t, 3)
    with pytest.raises(ValueError, match="shape"):
        acc.any_order_bounds(t, t[:2], 3)
    with pytest.raises(ValueError, match="terms"):
        acc.any_order_bounds(t, t, 0)
    with pytest.raises(TypeError, match="terms"):
        acc.any_order_bounds(t, t, 2.0)
