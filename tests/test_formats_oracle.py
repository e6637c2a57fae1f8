"""Oracle tests for :mod:`mpt_lab.formats`: every value-producing function against an independent oracle.

Oracles
-------
* NumPy's ``float16`` and ``float32`` casts (hardware IEEE conversions, correctly rounded from float32 and
  from float64);
* ml_dtypes' casts and views for bfloat16, float8_e4m3fn, float8_e5m2, float6_e3m2fn, float6_e2m3fn,
  float4_e2m1fn and float8_e8m0fnu (the 6- and 4-bit types keep their code in the low bits of a byte);
* torch's casts to float16, bfloat16, float8_e4m3fn and float8_e5m2;
* for what no library offers (TF32, round-toward-zero, stochastic rounding, float64 input to formats whose
  library casts go through float32), exact references written plainly below: an integer
  round-to-nearest-even on float32 bits, and a search in the sorted table of a format's values that the
  oracle dtype itself enumerates (``_Grid`` / ``ref_round``).

Results are compared bit for bit: float results by their float32 (or float64) bit patterns, except that
NaNs only have to be at the same positions (payloads and NaN signs are not part of any contract).

Inputs per format and per input type: one million random values whose binary exponents are uniform over
every binade of the format (from below half its smallest subnormal to beyond its overflow threshold) with
random mantissas, 100 000 random bit patterns of the input type (NaNs, infinities, subnormals of every
kind), and all special points of the format, both signs: every value, every exact midpoint between two
consecutive values (ties), the overflow threshold, one input-ulp either side of all of those, ±0, the
input type's smallest subnormal and largest finite value, ±inf and NaN.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from fractions import Fraction

import ml_dtypes as md
import numpy as np
import pytest
import torch

from mpt_lab.formats import (
    BF16,
    E8M0,
    FP4_E2M1,
    FP6_E2M3,
    FP6_E3M2,
    FP8_E4M3,
    FP8_E5M2,
    FP16,
    FP32,
    FP64,
    TF32,
    decode,
    encode,
    round_to,
)

torch.set_num_threads(1)

# NumPy warns when the tests cast NaNs, infinities or huge values between float types: expected here
pytestmark = pytest.mark.filterwarnings(
    r"ignore:(invalid value|overflow) encountered in (cast|nextafter)"
    ":RuntimeWarning"
)

N_RANDOM = 1_000_000  # binade-uniform random inputs per format and input type
N_BITS = 100_000  # random bit patterns of the input type, on top

NP_ORACLE = {
    FP16: np.float16,
    BF16: md.bfloat16,
    FP8_E4M3: md.float8_e4m3fn,
    FP8_E5M2: md.float8_e5m2,
    FP6_E3M2: md.float6_e3m2fn,
    FP6_E2M3: md.float6_e2m3fn,
    FP4_E2M1: md.float4_e2m1fn,
    E8M0: md.float8_e8m0fnu,
}
TORCH_ORACLE = {FP16: torch.float16, BF16: torch.bfloat16, FP8_E4M3: torch.float8_e4m3fn, FP8_E5M2: torch.float8_e5m2}
ORACLE_FORMATS = list(NP_ORACLE)
NO_NAN = (FP6_E3M2, FP6_E2M3, FP4_E2M1)  # no NaN encoding: round_to raises on NaN, ml_dtypes gives 0
GRID_FORMATS = ORACLE_FORMATS + [TF32]  # formats the exact table reference covers


def _seed(*parts) -> int:
    """A fixed seed per test and format (stable across runs and Python processes)."""
    return sum((i + 1) * sum(map(ord, str(p))) for i, p in enumerate(parts)) * 7919 + 12345


# ----------------------------------------------------------------------------------------------------------
# comparison helpers
# ----------------------------------------------------------------------------------------------------------
def _bits(a):
    a = np.ascontiguousarray(a)
    return a.view({4: np.uint32, 8: np.uint64, 2: np.uint16}[a.dtype.itemsize])


def assert_same(got, want, x=None, what=""):
    """Bit-identical float arrays (same dtype), NaNs only at the same positions."""
    got = got.numpy() if isinstance(got, torch.Tensor) else np.asarray(got)
    want = want.numpy() if isinstance(want, torch.Tensor) else np.asarray(want)
    assert got.dtype == want.dtype, (what, got.dtype, want.dtype)
    assert got.shape == want.shape, (what, got.shape, want.shape)
    gn, wn = np.isnan(got), np.isnan(want)
    bad = (gn != wn) | (~gn & ~wn & (_bits(got) != _bits(want)))
    if bad.any():
        idx = np.flatnonzero(bad.reshape(-1))[:8]
        xs = None if x is None else np.asarray(x.numpy() if isinstance(x, torch.Tensor) else x).reshape(-1)[idx]
        pytest.fail(
            f"{what}: {bad.sum()} of {bad.size} differ; inputs {None if xs is None else xs.tolist()}, "
            f"got {got.reshape(-1)[idx].tolist()}, want {want.reshape(-1)[idx].tolist()}"
        )


def assert_same_values(got, want, what=""):
    """float64 comparison of decoded values: NaN positions equal, finite values and zero signs equal."""
    with np.errstate(invalid="ignore"):  # signalling NaNs
        got, want = np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64)
    assert_same(got, want, what=what)


# ----------------------------------------------------------------------------------------------------------
# independent enumerations of the formats, and an exact rounding reference built on them
# ----------------------------------------------------------------------------------------------------------
def oracle_table(fmt):
    """(codes, float64 values) of every code of fmt, decoded by the oracle dtype's own view."""
    dt = NP_ORACLE[fmt]
    codes = np.arange(1 << fmt.bits, dtype=np.uint8 if fmt.bits <= 8 else np.uint16)
    with np.errstate(invalid="ignore"):  # signalling NaN codes
        return codes, codes.view(dt).astype(np.float64)


@dataclass(frozen=True)
class _Grid:
    """The non-negative finite values V of a format (ascending, zero once if it has one) and ``top``, the
    value one spacing above max that the format lacks (2^(emax+1) for IEEE-style formats, 480 for E4M3):
    rounding to it is overflow."""

    V: np.ndarray
    top: float
    overflow: float  # value of a (positive) overflow without saturation: inf, nan or max


@functools.cache
def grid(fmt) -> _Grid:
    if fmt == TF32:
        # TF32 = float32 bit patterns whose 13 low mantissa bits are zero (built here from bits, not values())
        v = np.arange(0, 0x7F800000, 1 << 13, dtype=np.uint32).view(np.float32).astype(np.float64)
        nmant, inf = 10, True
    else:
        _, v = oracle_table(fmt)
        nmant = md.finfo(NP_ORACLE[fmt]).nmant if fmt != FP16 else np.finfo(np.float16).nmant
        inf = bool(np.isinf(v).any())
    v = np.unique(np.abs(v[np.isfinite(v)]))  # ascending, ±0 merged
    vmax = v[-1]
    top = vmax + 2.0 ** (math.floor(math.log2(vmax)) - nmant)
    has_nan = fmt in (FP8_E4M3, E8M0, FP16, BF16, FP8_E5M2, TF32)
    overflow = math.inf if inf else (math.nan if has_nan else vmax)
    return _Grid(v, top, overflow)


def ref_round(x, fmt, rounding="nearest_even", saturate=False):
    """Exact rounding of x (any float dtype) to fmt, as float64, computed by search in ``grid(fmt)``.

    nearest_even: the nearer of the two neighbours lo ≤ |x| < hi (compared exactly as 2|x| vs lo + hi);
    a tie goes to the neighbour whose significand is even, i.e. to lo when lo / (hi − lo) is even (this is
    the code parity in every format; for E8M0, which has no mantissa, it sends ties up, as ml_dtypes does).
    Rounding to ``top`` is overflow: inf, NaN or max depending on the format (max with ``saturate``).
    toward_zero: lo; infinities overflow, finite values beyond max give max (IEEE 754 §7.4).
    E8M0 (unsigned, no zero): zeros, negatives and NaN give NaN, positive values below 2⁻¹²⁷ give 2⁻¹²⁷.
    """
    g = grid(fmt)
    with np.errstate(invalid="ignore"):  # signalling NaNs
        x = np.asarray(x).astype(np.float64)
    ax = np.abs(x)
    V = g.V
    Vx = np.append(V, g.top)
    with np.errstate(all="ignore"):
        i = np.searchsorted(Vx, ax, side="right") - 1  # Vx[i] <= ax < Vx[i+1]; NaN and inf: len(Vx) - 1
        below = i < 0  # only for a format without zero (E8M0)
        beyond = i >= len(V)  # ax >= top (or inf, NaN)
        ic = np.clip(i, 0, len(V) - 1)
        lo, hi = V[ic], Vx[ic + 1]
        if rounding == "nearest_even":
            d = 2.0 * ax - (lo + hi)  # exact: all operands have few significant bits
            odd = np.fmod(lo / (hi - lo), 2.0) == 1.0
            up = (d > 0) | ((d == 0) & odd)
            r = np.where(up, hi, lo)
            over = beyond | (up & (ic == len(V) - 1))
        elif rounding == "toward_zero":
            r = lo.copy()
            over = np.isinf(ax)
        else:  # pragma: no cover
            raise AssertionError(rounding)
        r = np.where(below, V[0], r)
        r = np.where(over, V[-1] if saturate else g.overflow, r)
        if fmt.signed:
            r = np.copysign(r, x)
        else:
            r = np.where((x <= 0) | np.signbit(x), np.nan, r)
        r = np.where(np.isnan(x), np.nan, r)
    return r


def ref_next_up(r, fmt):
    """The value after |r| in magnitude (r a value of fmt, |r| <= max), with r's sign; overflow at max."""
    g = grid(fmt)
    Vx = np.append(g.V, g.top)
    i = np.searchsorted(Vx, np.abs(r))
    assert np.array_equal(Vx[i], np.abs(r))
    nxt = Vx[np.minimum(i + 1, len(Vx) - 1)]
    nxt = np.where(i + 1 >= len(g.V), g.overflow, nxt)
    return np.copysign(nxt, r) if fmt.signed else nxt


# ----------------------------------------------------------------------------------------------------------
# inputs
# ----------------------------------------------------------------------------------------------------------
def binade_range(fmt, dtype):
    """Exponents from below half the smallest subnormal to beyond the overflow threshold, within dtype."""
    lo = math.floor(math.log2(fmt.smallest_subnormal)) - 4
    hi = math.floor(math.log2(fmt.max)) + 3
    if dtype == np.float32:
        lo, hi = max(lo, -152), min(hi, 127)
    return lo, hi


def random_binades(rng, n, lo, hi, dtype):
    """n values with exponent uniform in [lo, hi], uniformly random mantissa bits, random sign."""
    mbits = 23 if dtype == np.float32 else 52
    e = rng.integers(lo, hi + 1, n)
    m = rng.integers(0, 1 << mbits, n, dtype=np.int64)
    x = np.ldexp(1.0 + m * 2.0**-mbits, e)  # exact in float64
    x = np.where(rng.integers(0, 2, n) == 1, -x, x)
    with np.errstate(over="ignore"):
        return x.astype(dtype)  # exact unless a float32 subnormal (then a random subnormal, also fine)


def random_bits(rng, n, dtype):
    if dtype == np.float32:
        return rng.integers(0, 1 << 32, n, dtype=np.uint64).astype(np.uint32).view(np.float32)
    return rng.integers(0, np.iinfo(np.uint64).max, n, dtype=np.uint64, endpoint=True).view(np.float64)


def special_points(fmt, dtype):
    """Every value of fmt, every tie between consecutive values (and the overflow threshold), the top value,
    one dtype-ulp either side of each, extremes of dtype, zeros, infinities, NaN; both signs."""
    g = grid(fmt)
    Vx = np.append(g.V, g.top)
    mids = (Vx[:-1] + Vx[1:]) / 2  # exact in float64; the last is the overflow threshold
    pts = np.concatenate([Vx, mids, [2 * g.top]])
    if pts.size > 200_000:  # TF32 (2^18 values): the first and last 2000 values and ties, and 60 000 more
        keep = np.zeros(pts.size, bool)
        keep[np.random.default_rng(_seed("special", fmt.name)).integers(0, pts.size, 60_000)] = True
        n = Vx.size
        for s in (slice(0, 2000), slice(n - 2000, n + 2000), slice(2 * n - 2000, None)):
            keep[s] = True
        pts = pts[keep]
    with np.errstate(over="ignore"):
        p = pts.astype(dtype)
    ties_in_range = mids[mids <= np.finfo(dtype).max]
    assert np.array_equal(ties_in_range.astype(dtype).astype(np.float64), ties_in_range), "inexact ties"
    fi = np.finfo(dtype)
    extra = np.array([0.0, fi.smallest_subnormal, fi.smallest_normal, fi.max, np.inf], dtype=dtype)
    p = np.concatenate([p, np.nextafter(p, dtype(np.inf)), np.nextafter(p, dtype(0)), extra])
    return np.concatenate([p, -p, np.array([np.nan, -np.nan], dtype=dtype)])


@functools.cache
def inputs(fmt, dtype) -> np.ndarray:
    """The test inputs for fmt in dtype (read-only; see the module docstring)."""
    rng = np.random.default_rng(_seed("inputs", fmt.name, np.dtype(dtype).name))
    lo, hi = binade_range(fmt, dtype)
    x = np.concatenate(
        [random_binades(rng, N_RANDOM, lo, hi, dtype), random_bits(rng, N_BITS, dtype), special_points(fmt, dtype)]
    )
    x.setflags(write=False)
    return x


def np_oracle(x, fmt):
    """ml_dtypes / NumPy cast of x to fmt's dtype, back to x's dtype."""
    with np.errstate(all="ignore"):
        return x.astype(NP_ORACLE[fmt]).astype(x.dtype)


# ml_dtypes (0.6) and torch (2.13) convert to E8M0 with a bit trick on the float32 pattern (the E8M0 code is
# the float32 exponent field, incremented by a guard/round/sticky test that takes the implicit bit as the
# "LSB").  For float32 *subnormal* inputs in (2⁻¹²⁷, 2⁻¹²⁶) this rounds everything up to 2⁻¹²⁶, even
# 1.01·2⁻¹²⁷, whose nearest E8M0 value is 2⁻¹²⁷; elsewhere it is round-to-nearest.  round_to implements
# roundTiesToEven as documented, so on that interval (only) it is compared with the exact reference.
def e8m0_quirk(x):
    """Where the ml_dtypes/torch E8M0 cast is not round-to-nearest (see above)."""
    with np.errstate(invalid="ignore"):
        ax = np.abs(np.asarray(x, dtype=np.float64))
    return (ax > 2.0**-127) & (ax < 2.0**-126)


def oracle_or_ref(x, fmt):
    """The oracle cast, except on E8M0's quirk interval where the exact reference is used instead."""
    want = np_oracle(x, fmt)
    if fmt == E8M0:
        q = e8m0_quirk(x)
        want[q] = ref_round(x[q], fmt).astype(x.dtype)
    return want


# ----------------------------------------------------------------------------------------------------------
# 1. decode on every code
# ----------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("fmt", ORACLE_FORMATS, ids=str)
def test_decode_every_code_matches_oracle_view(fmt):
    codes, want = oracle_table(fmt)
    assert codes.size == 1 << fmt.bits
    got = decode(codes, fmt)
    assert isinstance(got, np.ndarray) and got.dtype == np.float64 and got.shape == codes.shape
    assert_same_values(got, want, f"decode {fmt}")
    # the same codes as int64, and as a 2-D array
    assert_same_values(decode(codes.astype(np.int64).reshape(-1, 2), fmt), want.reshape(-1, 2), "int64 codes")
    # and as a torch tensor
    gt = decode(torch.from_numpy(codes.astype(np.int32)), fmt)
    assert isinstance(gt, torch.Tensor) and gt.dtype == torch.float64
    assert_same_values(gt.numpy(), want, f"decode {fmt} (torch)")
    # every NaN code is a NaN of the oracle, every other code its exact value (checked above); spot-check ints
    for c in (0, 1, (1 << fmt.bits) - 1, 1 << (fmt.bits - 1)):
        v = decode(int(c), fmt)
        assert isinstance(v, float)
        assert_same_values(v, want[c])


@pytest.mark.parametrize("fmt", list(TORCH_ORACLE) + [E8M0], ids=str)
def test_decode_every_code_matches_torch_view(fmt):
    tdt = TORCH_ORACLE.get(fmt, torch.float8_e8m0fnu)
    codes = torch.arange(1 << fmt.bits, dtype=torch.int32)
    if fmt.bits == 8:
        want = codes.to(torch.uint8).view(tdt).to(torch.float64)
    else:
        want = codes.to(torch.int16).view(tdt).to(torch.float64)  # int32 → int16 wraps: the same 16 bits
    assert_same_values(decode(codes, fmt).numpy(), want.numpy(), f"decode {fmt} vs torch")


def test_decode_fp32_random_patterns():
    rng = np.random.default_rng(_seed("fp32 decode"))
    codes = rng.integers(0, 1 << 32, N_RANDOM, dtype=np.uint64).astype(np.uint32)
    codes[:16] = [
        0,
        0x80000000,
        1,
        0x80000001,
        0x007FFFFF,
        0x00800000,
        0x7F7FFFFF,
        0xFF7FFFFF,
        0x7F800000,
        0xFF800000,
        0x7FC00000,
        0x7F800001,
        0xFFFFFFFF,
        0x3F800000,
        0xC3274000,
        0x807FFFFF,
    ]
    assert_same_values(decode(codes, FP32), codes.view(np.float32), "decode FP32")
    t = torch.from_numpy(codes.astype(np.int64))
    assert_same_values(decode(t, FP32).numpy(), codes.view(np.float32), "decode FP32 (torch)")


def test_decode_fp64_random_patterns():
    rng = np.random.default_rng(_seed("fp64 decode"))
    codes = rng.integers(0, np.iinfo(np.uint64).max, 200_000, dtype=np.uint64, endpoint=True)
    assert_same(decode(codes, FP64), codes.view(np.float64), what="decode FP64")
    t = torch.from_numpy(codes.view(np.int64).copy())
    assert_same(decode(t, FP64).numpy(), codes.view(np.float64), what="decode FP64 (torch)")


def test_decode_tf32_every_code_from_bits():
    """TF32 code = the top 19 bits of a float32 pattern: decode must agree with the float32 view."""
    codes = np.arange(1 << 19, dtype=np.uint32)
    assert_same_values(decode(codes, TF32), (codes << 13).view(np.float32), "decode TF32")


# ----------------------------------------------------------------------------------------------------------
# 2. round_to (nearest_even) against the casts, float32 input (NumPy and torch)
# ----------------------------------------------------------------------------------------------------------
def _without_nan_if_needed(x, fmt):
    return x[~np.isnan(x)] if fmt in NO_NAN else x


@pytest.mark.parametrize("fmt", ORACLE_FORMATS, ids=str)
def test_round_to_float32_matches_ml_dtypes_and_numpy(fmt):
    x = _without_nan_if_needed(inputs(fmt, np.float32), fmt)
    want = oracle_or_ref(x, fmt)
    got = round_to(x, fmt)
    assert got.dtype == np.float32
    assert_same(got, want, x, f"round_to(float32, {fmt}) vs {NP_ORACLE[fmt].__name__}")
    # the exact table reference agrees with the oracle too (this validates ref_round, used elsewhere)
    assert_same(ref_round(x, fmt).astype(np.float32), want, x, f"ref_round {fmt} vs oracle")


@pytest.mark.parametrize("fmt", ORACLE_FORMATS, ids=str)
def test_round_to_float32_tensor_matches_oracles(fmt):
    x = _without_nan_if_needed(inputs(fmt, np.float32), fmt)
    t = torch.from_numpy(x.copy())
    got = round_to(t, fmt)
    assert isinstance(got, torch.Tensor) and got.dtype == torch.float32 and got.shape == t.shape
    assert_same(got, oracle_or_ref(x, fmt), x, f"round_to(tensor, {fmt}) vs ml_dtypes")
    if fmt in TORCH_ORACLE:
        if fmt == FP8_E4M3:
            # torch's float8_e4m3fn cast saturates (finite overflow and ±inf → ±448; NaN stays NaN) where
            # ml_dtypes gives NaN: it is round_to's saturating conversion
            want, got_t = t.to(TORCH_ORACLE[fmt]).float(), round_to(t, fmt, saturate=True)
        else:
            want, got_t = t.to(TORCH_ORACLE[fmt]).float(), got
        assert_same(got_t, want, x, f"round_to(tensor, {fmt}) vs torch cast")


def test_round_to_e8m0_matches_torch_cast_on_positive_values():
    """torch's float8_e8m0fnu agrees for positive inputs (it maps zeros and negatives differently)."""
    x = inputs(E8M0, np.float32)
    x = x[(x > 0) & ~np.isnan(x) & ~e8m0_quirk(x)]
    t = torch.from_numpy(x.copy())
    assert_same(round_to(t, E8M0), t.to(torch.float8_e8m0fnu).float(), x, "E8M0 vs torch")


def test_e8m0_just_above_smallest_value_rounds_to_nearest():
    """On (2⁻¹²⁷, 2⁻¹²⁶) round_to gives the nearest E8M0 value; the library casts round up (see e8m0_quirk)."""
    s = 2.0**-127
    x = np.array([1.01 * s, 1.25 * s, 1.49 * s, 1.5 * s, 1.51 * s, 1.99 * s], dtype=np.float32)
    want = np.array([s, s, s, 2 * s, 2 * s, 2 * s], dtype=np.float32)  # the tie 1.5·2⁻¹²⁷ goes up, as all ties
    assert_same(round_to(x, E8M0), want, x, "E8M0 near 2^-127")
    assert_same(round_to(x.astype(np.float64), E8M0), want.astype(np.float64), x, "E8M0 near 2^-127 (f64)")
    assert_same(round_to(torch.from_numpy(x), E8M0), want, x, "E8M0 near 2^-127 (torch)")
    assert e8m0_quirk(x).all()


@pytest.mark.parametrize("fmt", NO_NAN, ids=str)
def test_nan_input_to_formats_without_nan(fmt):
    """FP6/FP4 cannot encode NaN: round_to refuses it, whereas ml_dtypes silently maps NaN to (±)0."""
    x = np.array([1.0, np.nan], dtype=np.float32)
    with np.errstate(all="ignore"):
        assert x.astype(NP_ORACLE[fmt]).astype(np.float32)[1] == 0.0
    for arg in (x, torch.from_numpy(x), float("nan"), np.float32("nan"), x.astype(np.float64)):
        with pytest.raises(ValueError, match="NaN"):
            round_to(arg, fmt)
        with pytest.raises(ValueError, match="NaN"):
            encode(arg, fmt)
    for rounding in ("toward_zero", "stochastic"):
        with pytest.raises(ValueError, match="NaN"):
            round_to(x, fmt, rounding=rounding, generator=0)


# ----------------------------------------------------------------------------------------------------------
# 2b. float64 input
# ----------------------------------------------------------------------------------------------------------
# NumPy's float64 → float16 cast is a single, correct rounding.  ml_dtypes (0.6) and torch (2.13), however,
# convert float64 to bfloat16 / float8 / float6 / float4 / e8m0 (and torch even to float16) by way of
# float32, i.e. they round twice: e.g. 1 + 2⁻⁸ + 2⁻³⁰ first becomes the tie 1 + 2⁻⁸ in float32, which then
# rounds to even (1.0) in bfloat16 instead of up.  ``ML_DTYPES_FLOAT64_SINGLE_ROUNDING`` records whether the
# installed ml_dtypes still does; either way round_to on float64 is checked against ``ref_round`` (exact, and
# itself checked against ml_dtypes on float32 input above), and against ml_dtypes on every float64 input that
# is exactly a float32 (where the two roundings coincide), or on all inputs if ml_dtypes rounds once.
def _ml_dtypes_single_rounding(fmt) -> bool:
    x = np.nextafter(special_points(fmt, np.float64), np.inf)
    x = x[np.isfinite(x) & (np.abs(x) < 1e30)]
    return np.array_equal(np_oracle(x, fmt), ref_round(x, fmt), equal_nan=True)


def test_float64_oracles_numpy_rounds_once_ml_dtypes_is_checked():
    x = inputs(FP16, np.float64)
    assert_same(np_oracle(x, FP16), ref_round(x, FP16), x, "numpy float64→float16 is a single rounding")
    # the double rounding of ml_dtypes/torch is real for this input (documented above); whether or not the
    # installed ml_dtypes fixed it, the reference is the exact single rounding:
    x = np.array([1 + 2.0**-8 + 2.0**-30])
    assert ref_round(x, BF16)[0] == 1 + 2.0**-7
    assert round_to(x, BF16)[0] == 1 + 2.0**-7
    assert round_to(torch.from_numpy(x), BF16)[0].item() == 1 + 2.0**-7


@pytest.mark.parametrize("fmt", GRID_FORMATS, ids=str)
def test_round_to_float64_is_single_rounding(fmt):
    x = _without_nan_if_needed(inputs(fmt, np.float64), fmt)
    got = round_to(x, fmt)
    assert got.dtype == np.float64
    assert_same(got, ref_round(x, fmt), x, f"round_to(float64, {fmt}) vs exact reference")
    if fmt == FP16:
        assert_same(got, x.astype(np.float16).astype(np.float64), x, "round_to(float64, FP16) vs numpy")
    elif fmt != TF32:
        with np.errstate(over="ignore"):
            exact32 = x[(x.astype(np.float32).astype(np.float64) == x) | np.isnan(x)]
        assert_same(round_to(exact32, fmt), oracle_or_ref(exact32, fmt), exact32, f"{fmt} float64 vs ml_dtypes")
        if _ml_dtypes_single_rounding(fmt):
            assert_same(got, np_oracle(x, fmt), x, f"round_to(float64, {fmt}) vs ml_dtypes")
    # torch float64 tensors give the same bits
    t = torch.from_numpy(x.copy())
    gt = round_to(t, fmt)
    assert gt.dtype == torch.float64
    assert_same(gt, got, x, f"round_to(float64 tensor, {fmt})")


def test_float64_double_rounding_cases_are_single_rounded():
    """Inputs one float64-ulp beside every tie: exactly where rounding via float32 goes wrong."""
    for fmt in GRID_FORMATS:
        g = grid(fmt)
        Vx = np.append(g.V, g.top)
        mids = (Vx[:-1] + Vx[1:]) / 2
        mids = mids[mids > 0]
        x = np.concatenate([np.nextafter(mids, np.inf), np.nextafter(mids, 0)])
        x = np.concatenate([x, -x])
        got = round_to(x, fmt)
        want = ref_round(x, fmt)
        assert_same(got, want, x, f"{fmt}: ties ± one float64 ulp")
        # and these really are decided by the last bit: up above the tie, down below (overflow aside)
        n = mids.size
        inner = mids < fmt.max
        assert (np.abs(want[:n])[inner] > mids[inner]).all() and (np.abs(want[n : 2 * n]) < mids).all()


# ----------------------------------------------------------------------------------------------------------
# 3. FP32
# ----------------------------------------------------------------------------------------------------------
@functools.cache
def fp32_float64_inputs():
    rng = np.random.default_rng(_seed("fp32 from float64"))
    parts = [
        random_bits(rng, N_RANDOM, np.float64),
        random_binades(rng, 400_000, -160, -120, np.float64),  # float32 subnormals and around
        random_binades(rng, 200_000, 120, 130, np.float64),  # float32 overflow and around
        random_binades(rng, 400_000, -126, 127, np.float64),
    ]
    # float32 ties in the subnormal range and at the top, and one float64 ulp either side
    k = rng.integers(0, 1 << 24, 100_000)
    sub_ties = (k + 0.5) * 2.0**-149
    top = np.float64(np.finfo(np.float32).max)
    edges = np.array(
        [
            2.0**-150,
            2.0**-149,
            1.5 * 2.0**-149,
            2.0**-126 - 2.0**-150,
            2.0**-126,
            top,
            top + 2.0**103,
            2.0**128,
            0.0,
            np.inf,
            np.nan,
        ]
    )
    e = np.concatenate([sub_ties, edges])
    e = np.concatenate([e, np.nextafter(e, np.inf), np.nextafter(e, 0)])
    x = np.concatenate(parts + [e, -e])
    x.setflags(write=False)
    return x


def test_round_to_fp32_from_float64_matches_numpy():
    x = fp32_float64_inputs()
    with np.errstate(over="ignore"):
        want = x.astype(np.float32)
    got = round_to(x, FP32)
    assert got.dtype == np.float64
    assert_same(got.astype(np.float32), want, x, "round_to(float64, FP32)")
    assert np.array_equal(got.astype(np.float32).astype(np.float64), got, equal_nan=True)
    gt = round_to(torch.from_numpy(x.copy()), FP32)
    assert_same(
        gt.numpy().astype(np.float32),
        torch.from_numpy(x.copy()).to(torch.float32).numpy(),
        x,
        "round_to(float64 tensor, FP32) vs torch",
    )
    # codes of the rounded values are float32's bits
    finite = ~np.isnan(x)
    assert np.array_equal(encode(x[finite], FP32), want[finite].view(np.uint32))


def test_round_to_fp32_and_fp64_of_float32_is_identity():
    x = inputs(FP16, np.float32)
    assert_same(round_to(x, FP32), x, x, "FP32 identity")
    assert_same(round_to(x, FP64), x, x, "FP64 of float32")
    y = inputs(FP16, np.float64)
    assert_same(round_to(y, FP64), y, y, "FP64 identity")


def test_encode_fp32_and_fp64_give_exact_bits():
    rng = np.random.default_rng(_seed("fp32 encode"))
    x = random_bits(rng, N_RANDOM, np.float32)
    c = encode(x, FP32)
    assert c.dtype == np.uint32 and np.array_equal(c, x.view(np.uint32))  # NaN payloads included
    ct = encode(torch.from_numpy(x.copy()), FP32)
    assert ct.dtype == torch.int64 and np.array_equal(ct.numpy(), x.view(np.uint32).astype(np.int64))
    y = random_bits(rng, 200_000, np.float64)
    c = encode(y, FP64)
    assert c.dtype == np.uint64 and np.array_equal(c, y.view(np.uint64))
    ct = encode(torch.from_numpy(y.copy()), FP64)
    assert ct.dtype == torch.int64 and np.array_equal(ct.numpy(), y.view(np.int64))
    h = rng.integers(0, 1 << 16, 65536).astype(np.uint16)
    assert np.array_equal(encode(h.view(np.float16), FP16), h)


# ----------------------------------------------------------------------------------------------------------
# 4. TF32 against a plain integer reference
# ----------------------------------------------------------------------------------------------------------
def tf32_reference(x32, rounding="nearest_even"):
    """TF32 = float32 with 10 mantissa bits: drop the 13 low bits of the pattern, rounding to nearest even
    (or truncating); a carry out of the mantissa increments the exponent, up to infinity.  NaN stays NaN."""
    u = x32.view(np.uint32).astype(np.uint64)
    sign, a = u & 0x80000000, u & 0x7FFFFFFF
    if rounding == "nearest_even":
        r = ((a + 0xFFF + ((a >> 13) & 1)) >> 13) << 13
    else:
        r = (a >> 13) << 13
    r = np.where(a > 0x7F800000, 0x7FC00000, r)  # NaN
    return (r | sign).astype(np.uint32).view(np.float32)


@functools.cache
def tf32_inputs():
    rng = np.random.default_rng(_seed("tf32"))
    x = inputs(TF32, np.float32)
    u = rng.integers(0, 1 << 32, 200_000, dtype=np.uint64).astype(np.uint32)
    ties = (u & ~np.uint32(0x1FFF)) | np.uint32(0x1000)  # exactly halfway between two TF32 values
    t = ties.view(np.float32)
    x = np.concatenate([x, t, np.nextafter(t, np.float32(np.inf)), np.nextafter(t, np.float32(0))])
    x.setflags(write=False)
    return x


@pytest.mark.parametrize("rounding", ["nearest_even", "toward_zero"])
def test_round_to_tf32_matches_integer_reference(rounding):
    x = tf32_inputs()
    want = tf32_reference(x, rounding)
    assert_same(round_to(x, TF32, rounding=rounding), want, x, f"TF32 {rounding}")
    assert_same(round_to(torch.from_numpy(x.copy()), TF32, rounding=rounding), want, x, f"TF32 {rounding} torch")
    assert_same(ref_round(x, TF32, rounding).astype(np.float32), want, x, "TF32 table reference")


# ----------------------------------------------------------------------------------------------------------
# 7. toward_zero
# ----------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("fmt", GRID_FORMATS, ids=str)
@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
def test_toward_zero_matches_exact_reference(fmt, dtype):
    x = _without_nan_if_needed(inputs(fmt, dtype), fmt)
    want = ref_round(x, fmt, "toward_zero").astype(dtype)
    assert_same(round_to(x, fmt, rounding="toward_zero"), want, x, f"toward_zero {fmt}")
    assert_same(
        round_to(torch.from_numpy(x.copy()), fmt, rounding="toward_zero"), want, x, f"toward_zero {fmt} (torch)"
    )
    # never larger in magnitude than x (E8M0 below 2^-127 excepted: it has no zero)
    ok = ~np.isnan(want) & (np.abs(x) >= fmt.smallest_subnormal)
    assert (np.abs(want[ok]) <= np.abs(x[ok])).all()


def test_toward_zero_ieee_overflow_rule():
    x = np.array([65504, 65519, 65520, 1e6, 3e38, np.inf, -65520, -1e6, -np.inf], dtype=np.float32)
    got = round_to(x, FP16, rounding="toward_zero")
    assert got.tolist() == [65504, 65504, 65504, 65504, 65504, np.inf, -65504, -65504, -np.inf]
    assert round_to(1e300, FP16, rounding="toward_zero") == 65504.0
    assert round_to(-1e300, BF16, rounding="toward_zero") == -BF16.max
    assert round_to(np.float32(np.inf), BF16, rounding="toward_zero") == np.inf
    assert round_to(1e6, FP8_E5M2, rounding="toward_zero") == 57344.0
    assert round_to(470.0, FP8_E4M3, rounding="toward_zero") == 448.0
    assert round_to(-1e6, FP8_E4M3, rounding="toward_zero") == -448.0
    assert math.isnan(round_to(math.inf, FP8_E4M3, rounding="toward_zero"))  # no infinity: NaN, as the cast
    assert round_to(100.0, FP4_E2M1, rounding="toward_zero") == 6.0
    assert round_to(5.9, FP4_E2M1, rounding="toward_zero") == 4.0
    assert round_to(-0.4, FP4_E2M1, rounding="toward_zero") == 0.0
    assert math.copysign(1.0, round_to(-0.4, FP4_E2M1, rounding="toward_zero")) == -1.0


# ----------------------------------------------------------------------------------------------------------
# 8. stochastic rounding
# ----------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("fmt", GRID_FORMATS, ids=str)
def test_stochastic_gives_a_neighbour_and_is_reproducible(fmt):
    x = _without_nan_if_needed(inputs(fmt, np.float32), fmt)
    x = x[:400_000]
    down = ref_round(x, fmt, "toward_zero")
    fin = np.isfinite(down) & (np.abs(x) <= fmt.max) & (np.abs(x) >= fmt.smallest_subnormal)
    up = np.full_like(down, np.nan)
    up[fin] = ref_next_up(down[fin], fmt)
    exact = ref_round(x, fmt, "toward_zero") == x.astype(np.float64)
    for backend in ("numpy", "torch"):
        if backend == "numpy":
            r1 = round_to(x, fmt, rounding="stochastic", generator=np.random.default_rng(1))
            r2 = round_to(x, fmt, rounding="stochastic", generator=1)
            r3 = round_to(x, fmt, rounding="stochastic", generator=2)
        else:
            t = torch.from_numpy(x.copy())
            g = torch.Generator().manual_seed(1)
            r1 = round_to(t, fmt, rounding="stochastic", generator=g).numpy()
            r2 = round_to(t, fmt, rounding="stochastic", generator=1).numpy()
            r3 = round_to(t, fmt, rounding="stochastic", generator=2).numpy()
        assert_same(r1, r2, x, f"{fmt} stochastic {backend}: same seed, same result")
        assert not np.array_equal(r1, r3, equal_nan=True), "different seeds should differ somewhere"
        r = r1.astype(np.float64)
        is_down, is_up = r[fin] == down[fin], r[fin] == up[fin]
        assert (is_down | is_up).all(), (fmt, backend, x[fin][~(is_down | is_up)][:5])
        assert is_down.any() and is_up.any()
        assert (r[exact] == x[exact]).all(), "values of the format are not rounded"
        # zeros keep their sign
        assert (np.signbit(r[fin]) == np.signbit(x[fin])).all() or not fmt.signed
        # overflow region: one of max and the overflow value
        big = np.isfinite(x) & (np.abs(x) > fmt.max) & (np.abs(x) < grid(fmt).top)
        if big.any():
            rb = np.abs(r[big])
            ov = grid(fmt).overflow
            assert ((rb == fmt.max) | (rb == ov) | (np.isnan(rb) & np.isnan(ov))).all()


def _stochastic_cases(fmt):
    """Points x = lo + k/16 of the spacing at a few places of fmt (normal, subnormal, negative)."""
    V = grid(fmt).V
    cases = []
    for lo in (V[V >= 1][0], V[len(V) // 3], V[0], V[-2]):
        hi = V[np.searchsorted(V, lo) + 1]
        for k in (1, 5, 8, 15):
            cases.append((lo, hi, lo + k * (hi - lo) / 16))
    return cases


@pytest.mark.parametrize("fmt", GRID_FORMATS, ids=str)
@pytest.mark.parametrize("backend", ["numpy", "torch"])
def test_stochastic_is_unbiased(fmt, backend):
    """E[round(x)] = x: the count of rounds up is Binomial(n, p = (x − lo)/(hi − lo)); with a fixed seed the
    test is deterministic, and the bound of 6 standard deviations would fail a correct implementation with
    probability ~2e-9 per case for a fresh seed.  Also checks the mean is not that of a biased rounding."""
    n = 20_000
    for j, (lo, hi, x) in enumerate(_stochastic_cases(fmt)):
        sign = -1.0 if (j % 2 and fmt.signed) else 1.0
        xs = np.full(n, sign * x, dtype=np.float32)
        assert xs[0] == sign * x  # exact in float32
        if backend == "numpy":
            r = round_to(xs, fmt, rounding="stochastic", generator=_seed(fmt.name, j)).astype(np.float64)
        else:
            r = (
                round_to(torch.from_numpy(xs), fmt, rounding="stochastic", generator=_seed(fmt.name, j))
                .numpy()
                .astype(np.float64)
            )
        r = np.abs(r)
        assert np.isin(r, [lo, hi]).all()
        p = (x - lo) / (hi - lo)
        ups = int((r == hi).sum())
        sd = math.sqrt(n * p * (1 - p))
        assert abs(ups - n * p) <= 6 * sd, (fmt, backend, lo, hi, x, ups / n, p)
        mean = r.mean()
        assert abs(mean - x) <= 6 * sd / n * (hi - lo) + 1e-12 * x


def test_stochastic_exact_values_stay_exact():
    for fmt in ORACLE_FORMATS:
        v = grid(fmt).V
        if fmt.signed:
            v = np.concatenate([v, -v])
        x = np.repeat(v, 8).astype(np.float32)
        for gen in (np.random.default_rng(3), torch.Generator().manual_seed(3)):
            xi = x if isinstance(gen, np.random.Generator) else torch.from_numpy(x)
            r = round_to(xi, fmt, rounding="stochastic", generator=gen)
            r = r.numpy() if isinstance(r, torch.Tensor) else r
            assert_same(r, x, x, f"{fmt} stochastic on exact values")


def test_stochastic_default_generator_and_scalars():
    x = np.full(10_000, 1 + 2.0**-12, dtype=np.float32)  # a quarter of FP16's ulp above 1
    r = round_to(x, FP16, rounding="stochastic")  # fresh OS entropy: just the two neighbours
    assert np.isin(r, [1.0, 1 + 2.0**-10]).all()
    r = round_to(torch.from_numpy(x), FP16, rounding="stochastic")
    assert np.isin(r.numpy(), [1.0, 1 + 2.0**-10]).all()
    assert round_to(1 + 2.0**-12, FP16, rounding="stochastic", generator=5) in (1.0, 1 + 2.0**-10)
    with pytest.raises(TypeError):
        round_to(x, FP16, rounding="stochastic", generator=torch.Generator())
    with pytest.raises(TypeError):
        round_to(torch.from_numpy(x), FP16, rounding="stochastic", generator=np.random.default_rng(0))
    with pytest.raises(TypeError):
        round_to(x, FP16, rounding="stochastic", generator="seed")


# ----------------------------------------------------------------------------------------------------------
# 9. saturation and overflow
# ----------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("fmt", ORACLE_FORMATS, ids=str)
@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
def test_saturate_clamps_to_max(fmt, dtype):
    x = _without_nan_if_needed(inputs(fmt, dtype), fmt)
    plain = ref_round(x, fmt)
    beyond = (np.abs(plain) > fmt.max) | (np.isnan(plain) & ~np.isnan(x))
    if not fmt.signed:
        beyond &= x > 0
    want = np.where(beyond, np.copysign(fmt.max, x), plain).astype(dtype)
    assert_same(want, ref_round(x, fmt, saturate=True).astype(dtype), x, "reference self-check")
    assert_same(round_to(x, fmt, saturate=True), want, x, f"saturate {fmt}")
    assert_same(round_to(torch.from_numpy(x.copy()), fmt, saturate=True), want, x, f"saturate {fmt} torch")
    got = round_to(x, fmt, saturate=True)
    assert np.nanmax(np.abs(got)) == fmt.max
    assert_same(
        round_to(x, fmt, rounding="toward_zero", saturate=True),
        ref_round(x, fmt, "toward_zero", saturate=True).astype(dtype),
        x,
        f"saturate tz {fmt}",
    )


@pytest.mark.parametrize("fmt", ORACLE_FORMATS, ids=str)
def test_overflow_without_saturate_as_ml_dtypes(fmt):
    m = fmt.max
    g = grid(fmt)
    thr = np.float32((m + g.top) / 2)  # overflow threshold (exact in float32 for every format)
    assert np.float64(thr) == (m + g.top) / 2
    big = [np.nextafter(thr, np.float32(np.inf)), np.finfo(np.float32).max, np.inf]
    if g.top < 1e38:
        big += [g.top, 2 * g.top, 1e30]
    x = np.array(big, dtype=np.float32)
    x = np.concatenate([x, -x])
    got = round_to(x, fmt)
    assert_same(got, np_oracle(x, fmt), x, f"overflow {fmt}")
    if fmt in (FP16, BF16, FP8_E5M2):
        assert np.isinf(got).all() and (np.sign(got) == np.sign(x)).all()
    elif fmt in (FP8_E4M3, E8M0):
        assert np.isnan(got).all()
    else:
        assert (got == np.sign(x) * m).all()
    sat = np.sign(x).astype(np.float32) * np.float32(m)
    if not fmt.signed:
        sat[x < 0] = np.nan  # E8M0 has no negative values
    assert_same(round_to(x, fmt, saturate=True), sat, x, "saturate")
    # the tie at the overflow threshold goes the way of round-to-nearest-even (E4M3: down to 448)
    t = np.array([thr, -thr], dtype=np.float32)
    assert_same(round_to(t, fmt), np_oracle(t, fmt), t, "threshold")
    assert_same(
        round_to(np.nextafter(t, np.float32(0)), fmt),
        np.array([m, -m] if fmt.signed else [m, np.nan], dtype=np.float32),
        t,
        "below threshold",
    )


# ----------------------------------------------------------------------------------------------------------
# Python ints and Fractions: rounded exactly, once, against a brute force on exact rationals
# ----------------------------------------------------------------------------------------------------------
ALL_FORMATS = [FP64, FP32, TF32, FP16, BF16, FP8_E4M3, FP8_E5M2, FP6_E3M2, FP6_E2M3, FP4_E2M1, E8M0]


def _code_value(c: int, fmt) -> tuple[int, int]:
    """The exact value M · 2^E of the non-negative code c, from the IEEE 754 formula on its fields."""
    m = fmt.mantissa_bits
    e_field, mant = c >> m, c & ((1 << m) - 1)
    if e_field == 0 and fmt.subnormals:
        return mant, fmt.emin - m
    return (1 << m) + mant, e_field - fmt.bias - m


def _as_fraction(v: tuple[int, int]) -> Fraction:
    return Fraction(v[0]) * Fraction(2) ** v[1]


def _at_most(v: tuple[int, int], a: Fraction) -> bool:
    """M · 2^E ≤ a, exactly, in integers (a > 0)."""
    (mant, e), num, den = v, a.numerator, a.denominator
    return (den * mant) << max(e, 0) <= num << max(-e, 0)


def _max_code(fmt) -> int:
    """The code of max: below the all-ones exponent (IEEE), one below all ones (E4M3, E8M0), all ones (FP6/4)."""
    m, top = fmt.mantissa_bits, (1 << fmt.exponent_bits) - 1
    if fmt.nan == "ieee":
        return ((top - 1) << m) | ((1 << m) - 1)
    if fmt.nan == "single":
        return (top << m) | ((1 << m) - 2) if m else top - 1
    return (top << m) | ((1 << m) - 1)


def brute_magnitude(a: Fraction, fmt, rounding: str) -> Fraction | None:
    """|x| = a > 0 rounded to fmt, None for overflow: a binary search over fmt's non-negative codes (in value
    order) for the neighbours, then the exact distances to both; ties to the even code (with no mantissa bit,
    E8M0, up: both neighbours are 1·2^k, and ml_dtypes rounds up).  One spacing above max is a value the
    format lacks: rounding to it is overflow."""
    maxc = _max_code(fmt)
    lo, hi = 0, maxc  # invariant: value(lo) <= a (a ≥ 1 > E8M0's smallest value for the ints used with it)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if _at_most(_code_value(mid, fmt), a):
            lo = mid
        else:
            hi = mid - 1
    v_lo = _as_fraction(_code_value(lo, fmt))
    if v_lo == a or rounding == "toward_zero":
        return v_lo
    if lo < maxc:
        v_hi = _as_fraction(_code_value(lo + 1, fmt))
    else:
        v_hi = v_lo + Fraction(2) ** (fmt.emax - fmt.mantissa_bits)
    if a - v_lo != v_hi - a:
        up = v_hi - a < a - v_lo
    else:
        up = fmt.mantissa_bits == 0 or (lo + 1) % 2 == 0
    return (None if lo == maxc else v_hi) if up else v_lo


def brute_round(x: Fraction, fmt, rounding: str, saturate: bool, magnitude=False) -> float:
    """x rounded to fmt (see brute_magnitude), with the format's rules for sign, zero and overflow (inf, NaN
    or ±max; ±max with saturate).  ``magnitude``: brute_magnitude(|x|) if already known."""
    if fmt == E8M0 and x <= 0:
        return math.nan
    if x == 0:
        return 0.0
    r = brute_magnitude(abs(x), fmt, rounding) if magnitude is False else magnitude
    if r is None:
        if saturate or not (fmt.infinities or fmt.nan != "none"):
            r = _as_fraction(_code_value(_max_code(fmt), fmt))
        else:
            v = math.inf if fmt.infinities else math.nan
            return -v if x < 0 else v
    return -float(r) if x < 0 else float(r)


def _int_cases(fmt, rng) -> list:
    """Random big ints over every binade from 2^0 to far beyond max (past float64's range), ints at, next to
    and one apart from ties (midpoints between neighbours) including ties hidden below float64's precision,
    and around the overflow threshold, both signs."""
    m, emax = fmt.mantissa_bits, fmt.emax
    cases = [0, 1, 2, 3, 2**53 + 1, 2**60 + 2**36 + 1, 10**400, 2**1024 - 2**970, 2**1024 - 2**970 - 1, 2**1030]
    for bits in rng.integers(1, min(emax + 4, 1030), 150).tolist() + [1100, 1500, 2000]:
        cases.append(int(rng.integers(0, 2**62)) % (1 << bits) | (1 << (bits - 1)))  # low bits random
        cases.append(
            sum(int(rng.integers(0, 2**60)) << (60 * i) for i in range(bits // 60 + 1)) % (1 << bits)
            | (1 << (bits - 1))
        )  # all bits random
    for e in sorted(set(rng.integers(m + 1, emax + 1, 25).tolist()) | {m + 1, emax}) if emax > m + 1 else ():
        for _ in range(3):
            q = int(rng.integers(1 << m, 1 << (m + 1))) if m else 1
            mid = (2 * q + 1) << (e - m - 1)  # exact tie
            for d in (0, 1, -1, 2, -2):
                cases.append(mid + d)
            if e - m - 1 > 70:  # a tie, and ties with a sticky bit far below float64's 53 bits
                cases += [mid + 1, mid - 1, mid + (1 << (e - m - 60)), mid - (1 << (e - m - 60))]
    mx = int(fmt.max) if fmt.max == int(fmt.max) else None
    if mx is not None:
        half = 1 << max(emax - m - 1, 0)
        cases += [mx, mx + 1, mx - 1, mx + half, mx + half - 1, mx + half + 1, 2 * mx]
    return [c for n in cases for c in (n, -n)]


@pytest.mark.parametrize("fmt", ALL_FORMATS, ids=str)
def test_round_to_python_ints_matches_exact_brute_force(fmt):
    rng = np.random.default_rng(_seed("ints", fmt))
    cases = _int_cases(fmt, rng)
    for rounding in ("nearest_even", "toward_zero"):
        for n in cases:
            mag = brute_magnitude(Fraction(abs(n)), fmt, rounding) if n else None
            for saturate in (False, True):
                got = round_to(n, fmt, rounding=rounding, saturate=saturate)
                want = brute_round(Fraction(n), fmt, rounding, saturate, mag)
                assert type(got) is float
                assert (math.isnan(got) and math.isnan(want)) or (
                    got == want and math.copysign(1, got) == math.copysign(1, want)
                ), (fmt.name, rounding, saturate, n, got, want)


def test_round_to_python_ints_no_double_rounding_and_overflow():
    n = 2**60 + 2**36 + 1  # float(n) = 2^60 (a tie to even in float64), then FP32 keeps 2^60
    assert round_to(n, FP32) == 2**60 + 2**37 and round_to(float(n), FP32) == 2**60
    assert round_to(n, FP32, rounding="toward_zero") == 2**60
    assert round_to(10**400, FP16) == math.inf and round_to(-(10**400), FP16) == -math.inf
    assert round_to(10**400, FP16, saturate=True) == 65504.0 and round_to(-(10**400), "fp16", saturate=True) == -65504.0
    assert round_to(10**400, FP16, rounding="toward_zero") == 65504.0
    assert round_to(10**400, FP6_E3M2) == 28.0 and round_to(-(10**400), FP4_E2M1) == -6.0
    assert math.isnan(round_to(10**400, FP8_E4M3)) and math.isnan(round_to(10**400, E8M0))
    assert round_to(10**400, FP64) == math.inf and round_to(10**400, FP64, rounding="toward_zero") == FP64.max
    # FP64: Python's own correctly rounded int → float conversion is a second oracle
    rng = np.random.default_rng(64)
    for bits in rng.integers(1, 1024, 500).tolist():
        n = int(rng.integers(0, 2**62)) << max(bits - 62, 0) | int(rng.integers(0, 2**62)) % (1 << min(bits, 62))
        n |= 1 << (bits - 1)
        for v in (n, -n, n | 1):
            assert round_to(v, FP64) == float(v)
    # encode / decompose / ulp see the exact value too
    assert encode(2**60 + 2**36 + 1, FP32) == encode(float(2**60 + 2**37), FP32)
    assert encode(10**400, FP16) == 0x7C00 and encode(-(10**400), FP16, saturate=True) == 0xFBFF
    from mpt_lab.formats import decompose, ulp

    assert decompose(2**60 + 2**36 + 1, FP32).mantissa == 1  # 2^60 · (1 + 2^-23)
    assert ulp(2**60 - 1, FP32) == 2.0**36  # float(2^60 - 1) = 2^60 would give the next binade's 2^37
    assert ulp(10**400, FP64) == 2.0**971


def test_round_to_small_ints_agrees_with_float_input():
    """Ints that float64 holds exactly round as the same float does, in every format and mode."""
    ns = list(range(-300, 301)) + [2**k + d for k in range(9, 53) for d in (-1, 0, 1)]
    for fmt in ALL_FORMATS:
        for rounding in ("nearest_even", "toward_zero"):
            got = np.array([round_to(n, fmt, rounding=rounding) for n in ns])
            want = round_to(np.array(ns, dtype=np.float64), fmt, rounding=rounding)
            assert_same(got, want, what=f"{fmt.name} {rounding}")


@pytest.mark.parametrize("fmt", [FP32, FP16, BF16, FP8_E5M2, FP6_E2M3, FP64], ids=str)
def test_round_to_fractions_matches_exact_brute_force(fmt):
    """Fractions (not dyadic: no float holds them) round exactly too, subnormals and underflow included."""
    rng = np.random.default_rng(_seed("fractions", fmt))
    m = fmt.mantissa_bits
    cases = [Fraction(1, 3), Fraction(-2, 3), Fraction(10**400, 3), Fraction(1, 10**400)]
    for _ in range(300):
        num = int(rng.integers(1, 2**62)) << int(rng.integers(0, 100))
        den = int(rng.integers(1, 2**62)) | 1
        cases.append(Fraction(num, den) * Fraction(2) ** int(rng.integers(fmt.emin - m - 3, fmt.emax + 2)))
    for _ in range(100):  # near ties: a midpoint plus or minus a tiny non-dyadic amount
        e = int(rng.integers(fmt.emin - m, fmt.emax))
        q = int(rng.integers(1 << m, 1 << (m + 1)))
        mid = Fraction(2 * q + 1) * Fraction(2) ** (e - m - 1)
        cases += [mid, mid + mid / 3 * Fraction(1, 2**70), mid - mid / 3 * Fraction(1, 2**70)]
    for rounding in ("nearest_even", "toward_zero"):
        for x in cases + [-c for c in cases]:
            got, want = round_to(x, fmt, rounding=rounding), brute_round(x, fmt, rounding, False)
            assert (got == want and math.copysign(1, got) == math.copysign(1, want)) or (
                math.isnan(got) and math.isnan(want)
            ), (fmt.name, rounding, x, got, want)


def test_round_to_python_ints_stochastic_gives_a_neighbour():
    rng = np.random.default_rng(7)
    for fmt in (FP32, FP16, BF16, FP8_E4M3, FP64):
        for n in _int_cases(fmt, rng)[:400]:
            lo = brute_round(Fraction(n), fmt, "toward_zero", False)
            got = round_to(n, fmt, rounding="stochastic", generator=rng)
            if lo == n:  # exact: stays
                assert got == lo
            elif got != lo:  # else the next value up in magnitude (or overflow past max)
                assert (
                    (math.isinf(got) or math.isnan(got))
                    and abs(lo) == fmt.max
                    or abs(got) > abs(n)
                    and brute_round(Fraction(got), fmt, "toward_zero", False) == got
                    and brute_round(Fraction(n), fmt, "toward_zero", False) == lo
                    and abs(Fraction(got) - Fraction(lo)) <= Fraction(abs(lo)) * Fraction(2) ** -fmt.mantissa_bits
                ), (fmt.name, n, got, lo)
    # an exact int halfway between two FP16 values rounds up about half of the time
    ups = sum(round_to(2049, FP16, rounding="stochastic", generator=rng) == 2050 for _ in range(4000))
    assert 1800 < ups < 2200


# ----------------------------------------------------------------------------------------------------------
# 10. every path: native casts, the bit path in NumPy blocks, the bit path in torch ops
# ----------------------------------------------------------------------------------------------------------
# round_to takes a native cast where it is exactly the rounding (torch float32 tensors to FP16, BF16 and E5M2
# on a CPU; NumPy float32 arrays to BF16 through ml_dtypes), else the bit path: NumPy ufuncs on blocks of
# arrays and of CPU tensors' memory, torch ops for tensors on other devices.  The comparisons above run the
# default choice; here the same oracles check each path by itself.
import mpt_lab.formats as F  # noqa: E402


def _force_path(monkeypatch, path):
    """ "bits": native casts off; "torch_ops": also the torch-op kernels for CPU tensors (as on CUDA)."""
    monkeypatch.setattr(F, "_native_checked", {})  # the choice is made once per input kind, then kept
    if path in ("bits", "torch_ops"):
        monkeypatch.setenv("MPT_LAB_FAST_ROUND", "0")
    if path == "torch_ops":
        monkeypatch.setattr(F, "_numpy_backend", lambda t: False)


@functools.cache
def _ref(fmt, dtype, rounding, saturate):
    x = _without_nan_if_needed(inputs(fmt, dtype), fmt)
    return ref_round(x, fmt, rounding, saturate).astype(dtype)


@pytest.mark.parametrize("path", ["bits", "torch_ops"])
@pytest.mark.parametrize("fmt", ORACLE_FORMATS, ids=str)
def test_each_path_matches_the_oracles(fmt, path, monkeypatch):
    _force_path(monkeypatch, path)
    x = _without_nan_if_needed(inputs(fmt, np.float32), fmt)
    t = torch.from_numpy(x.copy())
    want = oracle_or_ref(x, fmt)
    assert_same(round_to(t, fmt), want, x, f"{path}: round_to(tensor, {fmt}) vs oracle")
    if path == "bits":  # NumPy arrays never take torch ops
        assert_same(round_to(x, fmt), want, x, f"{path}: round_to(float32, {fmt}) vs oracle")
    for rounding, sat in (("nearest_even", True), ("toward_zero", False), ("toward_zero", True)):
        w = _ref(fmt, np.float32, rounding, sat)
        assert_same(round_to(t, fmt, rounding=rounding, saturate=sat), w, x, f"{path}: {rounding} sat={sat} {fmt}")
        if path == "bits":
            assert_same(round_to(x, fmt, rounding=rounding, saturate=sat), w, x, f"{path}: {rounding} {fmt}")
    x64 = _without_nan_if_needed(inputs(fmt, np.float64), fmt)
    assert_same(
        round_to(torch.from_numpy(x64.copy()), fmt),
        _ref(fmt, np.float64, "nearest_even", False),
        x64,
        f"{path}: float64 tensor {fmt}",
    )


@pytest.mark.parametrize("path", ["bits", "torch_ops"])
def test_each_path_tf32(path, monkeypatch):
    _force_path(monkeypatch, path)
    x = tf32_inputs()
    for rounding in ("nearest_even", "toward_zero"):
        assert_same(
            round_to(torch.from_numpy(x.copy()), TF32, rounding=rounding),
            tf32_reference(x, rounding),
            x,
            f"{path}: TF32 {rounding}",
        )


def test_native_casts_are_taken_checked_and_refused_when_they_differ(monkeypatch):
    x = inputs(FP16, np.float32)[:50_000]
    t = torch.from_numpy(x.copy())
    for fmt in (FP16, BF16, FP8_E5M2):  # torch's casts, on a CPU
        assert F._native_dtype(t, fmt, "nearest_even", False) is TORCH_ORACLE[fmt]
        assert F._native_dtype(t, fmt, "nearest_even", True) is TORCH_ORACLE[fmt]
        assert F._native_dtype(t.double(), fmt, "nearest_even", False) is None  # float64: no double rounding
        assert F._native_dtype(t, fmt, "stochastic", False) is None
    assert F._native_dtype(t, FP8_E4M3, "nearest_even", False) is None  # torch's E4M3 cast saturates
    assert F._native_dtype(x, BF16, "nearest_even", False) == np.dtype(md.bfloat16)  # ml_dtypes for arrays
    assert F._native_dtype(x, FP16, "nearest_even", False) is None  # the bit path is faster than NumPy's cast
    monkeypatch.setattr(F, "_native_checked", {})
    monkeypatch.setenv("MPT_LAB_FAST_ROUND", "off")
    assert F._native_dtype(t, FP16, "nearest_even", False) is None
    monkeypatch.delenv("MPT_LAB_FAST_ROUND")
    # a conversion that disagrees with the bit path on the probe is not used (with a warning): still exact
    monkeypatch.setattr(F, "_native_checked", {})
    real = F._round_native
    monkeypatch.setattr(F, "_round_native", lambda xf, fmt, dt, sat, out=None: real(xf, fmt, dt, sat, out) * 1.5)
    with pytest.warns(RuntimeWarning, match="bit path"):
        assert F._native_dtype(t, FP16, "nearest_even", False) is None
    assert_same(round_to(t, FP16), x.astype(np.float16).astype(np.float32), x, "after a refused cast")


@pytest.mark.parametrize("fmt", ORACLE_FORMATS, ids=str)
def test_the_c_rounding_kernel_matches_the_oracles(fmt):
    """The C kernel (round-to-nearest-even of float32 CPU tensors where no native cast serves: E4M3, FP6, FP4)
    equals the oracle (ml_dtypes, or the reference rounding with saturation) on the oracle inputs, out of place
    and in place, split over one to four threads, for every format it accepts; float64, stochastic rounding and
    MPT_LAB_FAST_ROUND=0 take other paths."""
    if not any(__import__("shutil").which(c) for c in ("cc", "gcc", "clang")):
        pytest.skip("no C compiler on this machine")
    x = _without_nan_if_needed(inputs(fmt, np.float32), fmt)
    t = torch.from_numpy(x.copy())
    assert F._c_round_ok(t, fmt, "nearest_even", False) == (fmt.signed and fmt.subnormals and fmt.mantissa_bits <= 22)
    if not F._c_round_ok(t, fmt, "nearest_even", False):
        return
    assert not F._c_round_ok(t, fmt, "stochastic", False) and not F._c_round_ok(t.double(), fmt, "nearest_even", False)
    want = {False: oracle_or_ref(x, fmt), True: _ref(fmt, np.float32, "nearest_even", True)}
    for threads in (1, 2, 4):
        for sat in (False, True):
            got = F._c_round_call(t, fmt, sat) if threads == 1 else None
            if got is None:
                got = torch.empty_like(t)
                n = t.numel()
                bounds = [n * i // threads for i in range(threads + 1)]
                for a, b in zip(bounds, bounds[1:]):
                    F._c_round_call(t[a:b], fmt, sat, out=got[a:b])
            assert_same(got, want[sat], x, f"C kernel {fmt} sat={sat}, {threads} parts")
            inplace = t.clone()
            F._c_round_call(inplace, fmt, sat, out=inplace)
            assert_same(inplace, want[sat], x, f"C kernel in place {fmt} sat={sat}")


@pytest.mark.parametrize("path", ["default", "bits", "torch_ops"])
def test_rounding_in_place_equals_out_of_place(path, monkeypatch):
    """The ``out=`` form that mpt_lab.simulate uses to round the tensors an op writes in place."""
    _force_path(monkeypatch, path)
    for fmt in (FP16, BF16, FP8_E4M3, FP8_E5M2, FP4_E2M1):
        x = _without_nan_if_needed(inputs(fmt, np.float32)[:200_000], fmt)
        for rounding, sat in (("nearest_even", False), ("nearest_even", True), ("toward_zero", False)):
            want = round_to(x, fmt, rounding=rounding, saturate=sat)
            for arr in (x.copy(), torch.from_numpy(x.copy())):
                got = F._round_work(arr, fmt, rounding, sat, None, out=arr)
                assert got is arr
                assert_same(arr, want, x, f"{path}: in place {fmt} {rounding} sat={sat}")


# stochastic rounding: exact probabilities, checked deterministically.  The random bits are added below the
# last kept bit and the sum truncated, so all-zero random bits must give rounding toward zero and all-one bits
# rounding away from zero (for every value: normal, subnormal, below the smallest subnormal, beyond max).
@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("fmt", GRID_FORMATS, ids=str)
def test_stochastic_with_constant_random_bits_truncates_or_rounds_away(fmt, dtype, monkeypatch):
    x = _without_nan_if_needed(inputs(fmt, dtype)[:300_000], fmt)
    down = ref_round(x, fmt, "toward_zero")
    g = grid(fmt)
    fin = np.isfinite(x)
    beyond = fin & (np.abs(x) >= g.top)  # x ≥ top: both neighbours are overflow
    lo = np.where(beyond | ~fin, np.nan, down)
    with np.errstate(invalid="ignore"):
        exact = lo == x
    in_range = fin & ~beyond & ~np.isnan(lo)
    up = np.full_like(lo, np.nan)
    up[in_range] = ref_next_up(lo[in_range], fmt)
    for ones in (False, True):
        word = -1 if ones else 0  # every random 64-bit word drawn is this one
        monkeypatch.setattr(F._RandomBits, "words", lambda self, w: np.full(w, word, dtype=np.int64))
        got = round_to(x, fmt, rounding="stochastic", generator=0).astype(np.float64)
        got_t = round_to(torch.from_numpy(x.copy()), fmt, rounding="stochastic", generator=0).numpy()
        assert_same(got_t.astype(np.float64), got, x, f"{fmt} constant bits, tensor")
        want = np.where(exact | (not ones), lo, up)
        if not fmt.subnormals:  # E8M0 below its smallest value 2^-127: that value, the only neighbour
            want = np.where((x > 0) & (x < fmt.smallest_normal), fmt.smallest_normal, want)
        with np.errstate(invalid="ignore"):
            ok = (got[in_range] == want[in_range]) | (np.isnan(got[in_range]) & np.isnan(want[in_range]))
        gi = got[in_range]
        zero_sign = (np.signbit(gi) == np.signbit(x[in_range])) | np.isnan(gi) if fmt.signed else True
        assert (ok & zero_sign).all(), (
            fmt.name,
            ones,
            x[in_range][~(ok & zero_sign)][:5],
            got[in_range][~(ok & zero_sign)][:5],
            want[in_range][~(ok & zero_sign)][:5],
        )
        # beyond the top of the range every rounding overflows
        ov = np.abs(got[beyond])
        assert ((ov == g.overflow) | (np.isnan(ov) & np.isnan(g.overflow))).all()


def test_bernoulli_dyadic_is_exact_with_scripted_words():
    """P(True) = num / 2^k through every word of the draw: True exactly when R' < num, R' being the
    complemented drawn bits in the documented order (the low 63 first)."""

    class Script:
        def __init__(self, words):
            self.words = list(words)

        def bits63(self, n):
            out, self.words = self.words[:n], self.words[n:]
            return np.array(out, dtype=np.int64)

    rng = np.random.default_rng(_seed("bernoulli"))
    ones = (1 << 63) - 1
    for k in (1, 5, 40, 63, 64, 70, 126, 127, 200):
        for _ in range(200):
            num = int(rng.integers(0, 1 << min(k, 53)))
            words = [int(w) for w in rng.integers(0, 1 << 63, 5, dtype=np.int64)]
            if rng.random() < 0.5:  # the interesting draws: high parts all zero (in R'), so that they count
                words = [words[0]] + [ones] * 4
            got = F._bernoulli_dyadic(np.array([num]), np.array([k]), Script(words))[0]
            comp = [ones - w for w in words]
            r, used, bits = comp[0] >> (63 - min(k, 63)), 1, min(k, 63)
            while bits < k and r < num:  # R' = low word, then the high words' top bits above it
                t = min(k - bits, 63)
                r += (comp[used] >> (63 - t)) << bits
                used, bits = used + 1, bits + t
            assert got == (r < num), (k, num, words)


@pytest.mark.parametrize("backend", ["numpy", "torch", "torch_ops"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
def test_stochastic_is_unbiased_at_the_edges(backend, dtype, monkeypatch):
    """Below the smallest subnormal s (|x| = s·p: s with probability p), between max and the first value
    beyond it (overflow with probability p; with saturation always max)."""
    if backend == "torch_ops":
        monkeypatch.setattr(F, "_numpy_backend", lambda t: False)
    n = 20_000
    for j, fmt in enumerate((FP16, BF16, FP8_E4M3, FP8_E5M2, FP6_E3M2, FP4_E2M1)):
        s, m, g = fmt.smallest_subnormal, fmt.max, grid(fmt)
        cases = [(s * p, 0.0, s, p, False) for p in (0.3125, 0.8125, 2.0**-6, 1.5 * 2.0**-10)]
        cases += [(m + p * (g.top - m), m, g.overflow, p, False) for p in (0.25, 0.75)]
        cases.append((m + 0.5 * (g.top - m), m, m, 0.5, True))
        for i, (x, lo, hi, p, sat) in enumerate(cases):
            xs = np.full(n, -x if i % 2 else x, dtype=dtype)
            assert abs(float(xs[0])) == x
            xin = xs if backend == "numpy" else torch.from_numpy(xs)
            r = round_to(xin, fmt, rounding="stochastic", saturate=sat, generator=_seed("edges", j, i))
            r = np.abs(np.asarray(r, dtype=np.float64))
            is_hi = (r == hi) | (np.isnan(r) & np.isnan(hi))
            assert ((r == lo) | is_hi).all(), (fmt.name, x, np.unique(r))
            if sat or hi == lo:  # saturation, or no value beyond max (FP6, FP4: overflow is max)
                assert (r == m).all()
                continue
            ups = int(is_hi.sum())
            assert abs(ups - n * p) <= 6 * math.sqrt(n * p * (1 - p)) + 1, (fmt.name, backend, x, ups / n, p)


def test_stochastic_backends_and_block_size_give_the_same_draws(monkeypatch):
    """The random lanes are drawn in order, a whole number of 64-bit words per block, so neither the block
    size nor the backend (NumPy blocks or torch ops on the same generator) changes a result."""
    for fmt in GRID_FORMATS:
        x = _without_nan_if_needed(inputs(fmt, np.float32)[:200_000], fmt)
        t = torch.from_numpy(x.copy())
        want_t = round_to(t, fmt, rounding="stochastic", generator=11)
        want_n = round_to(x, fmt, rounding="stochastic", generator=11)
        with monkeypatch.context() as mp:
            mp.setattr(F, "_CHUNK", 1000)
            assert_same(round_to(t, fmt, rounding="stochastic", generator=11), want_t, x, f"{fmt} blocks (torch)")
            assert_same(round_to(x, fmt, rounding="stochastic", generator=11), want_n, x, f"{fmt} blocks (numpy)")
            mp.setattr(F, "_numpy_backend", lambda t: False)
            assert_same(round_to(t, fmt, rounding="stochastic", generator=11), want_t, x, f"{fmt} torch ops")
