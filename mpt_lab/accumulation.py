"""Dot products, matrix products and sums with every product and every addition rounded: the accumulator.

The paper's third technique is *arithmetic precision* (Micikevicius et al., ICLR 2018, §3.3): FP16 products
are accumulated into an FP32 accumulator before the result is written to FP16, and large reductions run in
FP32.  This module computes exactly what a chosen accumulator gives, so that the difference can be seen:

* :func:`dot` (last axis, batched over leading axes) and :func:`matmul` ((..., M, K) @ (..., K, N)) round each
  exact product ``a_k·b_k`` to the ``products`` format (round-to-nearest-even; ``None``: the accumulator's
  format) and then add the products with every addition rounded to the ``accumulator`` format;
* :func:`partial_sums` returns every running sum of the sequential order (where the sum stops growing:
  swamping, chapter 1's ``w + u == w``, now inside a dot product).

Orders (``order=``), as in Higham, *Accuracy and Stability of Numerical Algorithms* (2nd ed., 2002), §4.1–4.3:

``"sequential"``
    ``s ← round(s + p_k)`` for k = 0 … K−1, from ``s = +0``.  The error bound grows like K·u (u = unit
    roundoff), the typical error of random-signed addends like √K·u.
``"pairwise"``
    adjacent pairs added level by level (``p0+p1, p2+p3, …``, then the pair sums, …), an odd last element
    carried up to the next level unchanged; the bound grows like log2(K)·u.
``"blocked"``
    sequential within consecutive blocks of ``block_size`` products in the accumulator format, each block's
    sum then added into an FP32 total, rounded to FP32 (round-to-nearest-even) after each addition: the
    promotion of partial sums to FP32 that CUTLASS and DeepSeek-V3 use for FP8 GEMMs (DeepSeek-AI,
    arXiv:2412.19437, §3.3.2: promotion every N_C = 128 elements).  The result is in FP32.

``compensated=True`` (sequential only) is Kahan's compensated summation (Higham §4.3) with every operation
(``y = p − c; t = s + y; c = (t − s) − y; s = t``) rounded to the accumulator format, as optimizers that
keep BF16 weights with a Kahan compensation buffer do.

``rounding=`` applies to the accumulator's additions: ``"nearest_even"`` (IEEE 754-2019 §4.3.1) or
``"toward_zero"`` (§4.3.2), the truncation of the aligned addends that tensor-core adders perform
(Fasi, Higham, Mikaitis & Pranesh, "Numerical behavior of NVIDIA tensor cores", PeerJ CS 2021).  A narrow
tensor-core accumulator is a :class:`~mpt_lab.formats.FloatFormat`, e.g.
``FloatFormat("FP22", 8, 13, 127)`` (8 exponent bits, 13 stored mantissa bits: 14 bits of precision).

Exactness
---------
Every result is the exact rounding of the exact operation, as an exact rational computation would give it
(the tests check it against :mod:`fractions` arithmetic, including overflow to infinity, subnormal partial
sums, ties, signed zeros, NaN and infinity).  The fast paths rest on proofs, each checked by a test:

* a product of two float32 values is exact in float64; a product of two float64 values is split exactly
  into ``hi + lo`` (Dekker 1971, TwoProduct), and a sum of two float64 values into ``hi + lo`` (Knuth,
  TAOCP vol. 2, TwoSum);
* rounding ``hi + lo`` to a format of p ≤ 51 bits goes through float64 rounded *to odd* (``hi`` with its last
  bit set when ``lo ≠ 0``), which makes the second rounding exact (Boldo & Melquiond, "Emulation of FMA and
  correctly rounded sums: proved algorithms using rounding to odd", IEEE Trans. Computers 57(4), 2008);
* an addition of two FP16 (BF16) values computed in float32 and rounded to FP16 (BF16) is the correctly
  rounded FP16 (BF16) addition, because 24 ≥ 2p + 1 (Figueroa, "When is double rounding innocuous?",
  SIGNUM Newsletter 30(3), 1995): so an FP16, BF16 or FP32 accumulator with products in its own format adds
  with PyTorch's own CPU kernels, which compute float16 and bfloat16 additions in float32 and round once.

Speed: the loop is over the K products, each step one vectorised rounded addition over all outputs.  What is
fast: FP16, BF16 and FP32 accumulators rounding to nearest with products in a format they contain (FP16, BF16,
FP32), on operands holding FP16 values (FP16, FP8, ...: PyTorch's own kernels, one rounding each) or float32
values (FP32 products: one float32 multiplication; FP16 or BF16 products: one float32 multiplication, torch's
conversion and a check of the few products that can sit on a midpoint, see ``_Via32``).  A (256×1024)@(1024×256)
matmul with an FP16 accumulator took 27 ms of CPU time on FP16 values, 26 times a float32 matmul, and 71 ms on
float32 values, 2.6 times the FP16-valued time (one thread of a 2-core Intel Xeon with AVX-512 FP16 and AMX,
1-minute load average 8.6 to 9.5 from other work, so wall-clock ratios to the 1 ms float32 matmul were about
three times the CPU-time ones; ``python benchmarks/accumulation_speed.py --profile cpu``, its result is
``book/results/accumulation_speed_cpu.json``, with the other rows).  Everything else takes the general path
(NumPy arithmetic on the bits: narrow accumulators, rounding toward zero, other product formats, float64
values), one to two orders of magnitude slower than the fast paths.
The arithmetic runs on the CPU; torch inputs on another device get their result back on that device.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from fractions import Fraction

import numpy as np
import torch
from numpy.typing import ArrayLike
from torch import nn

from mpt_lab.formats import BF16, FP16, FP32, FP64, FloatFormat, FormatLike, exact_arithmetic, get_format, round_to

__all__ = [
    "AccumulatedLinear",
    "accumulate_linears_",
    "ORDERS",
    "ROUNDINGS",
    "TENSOR_CORE_ACCUMULATOR",
    "dot",
    "matmul",
    "partial_sums",
    "unit_roundoff",
    "any_order_bounds",
    "tensor_core_dot",
    "compensated_update_",
]

#: The summation orders :func:`dot` and :func:`matmul` accept.
ORDERS = ("sequential", "pairwise", "blocked")
#: The rounding modes of the accumulator's additions.
ROUNDINGS = ("nearest_even", "toward_zero")

#: The accumulator DeepSeek-V3 reports for Hopper's FP8 tensor cores, as a format: FP32's exponent range, 14 bits
#: of precision ("limited to retaining around 14 bits", arXiv:2412.19437 §3.3.2), i.e. 13 stored mantissa bits.
TENSOR_CORE_ACCUMULATOR = FloatFormat("TC14", 8, 13, 127, source="DeepSeek-V3 §3.3.2: ~14-bit FP8 accumulation")

# Products held at once (a chunk of the K axis times the outputs): 2**21 float64 values are 16 MiB.
_CHUNK_ELEMENTS = 1 << 21
_NATIVE = {FP16: torch.float16, BF16: torch.bfloat16, FP32: torch.float32}
_SAFE_HI = 2.0**990  # Dekker's split is exact below this magnitude ...
_SAFE_LO = 2.0**-960  # ... and the low part of a product above this one is not subnormal


# ----------------------------------------------------------------------------------------------------------
# Formats
# ----------------------------------------------------------------------------------------------------------
def _key(fmt: FloatFormat) -> tuple:
    return (fmt.exponent_bits, fmt.mantissa_bits, fmt.bias, fmt.signed, fmt.infinities, fmt.nan, fmt.subnormals)


def _same(f: FloatFormat, g: FloatFormat) -> bool:
    """Whether two formats have the same values and special values (their names may differ)."""
    return _key(f) == _key(g)


def _lsb_exponent(fmt: FloatFormat) -> int:
    """log2 of the smallest positive value of fmt."""
    return fmt.emin - fmt.mantissa_bits


def _contains(small: FloatFormat, big: FloatFormat) -> bool:
    """Whether every finite value of ``small`` is a value of ``big`` (so a cast from one to the other is exact)."""
    return (
        small.mantissa_bits <= big.mantissa_bits and _lsb_exponent(small) >= _lsb_exponent(big) and small.max <= big.max
    )


def _native(fmt: FloatFormat):
    for f, dt in _NATIVE.items():
        if _same(fmt, f):
            return dt
    return None


def _check_format(fmt, argname: str) -> FloatFormat:
    fmt = get_format(fmt, argname)
    if not fmt.signed or not fmt.has_zero:
        raise ValueError(f"{argname}: {fmt.name} has no sign or no zero; a sum needs both (E8M0 is a scale format)")
    if _same(fmt, FP64):
        return fmt
    if fmt.precision > 51 or fmt.emax >= 999 or _lsb_exponent(fmt) < -1000:
        raise ValueError(
            f"{argname}: {fmt.name} must have at most 51 bits of precision and values within "
            f"[2**-1000, 2**1000) (or be FP64), so that float64 carries them and their roundings "
            f"exactly; got precision {fmt.precision}, exponents {_lsb_exponent(fmt)} … {fmt.emax}"
        )
    return fmt


def unit_roundoff(fmt: FormatLike, rounding: str = "nearest_even") -> float:
    """The unit roundoff u of a format: 2⁻ᵖ for round-to-nearest, 2¹⁻ᵖ for rounding toward zero (p = precision).

    A single rounding of a value in the format's normal range has relative error at most u (Higham 2002, §2.1);
    the sequential sum of K terms has error at most about (K−1)·u·Σ|p_k| (§4.2).

    Raises
    ------
    TypeError, ValueError
        Unknown format or rounding.
    """
    fmt = get_format(fmt)
    rounding = _check_rounding(rounding)
    return math.ldexp(1.0, (0 if rounding == "nearest_even" else 1) - fmt.precision)


def any_order_bounds(
    exact: np.ndarray, abs_sum: np.ndarray, terms: int, *, fmt: FormatLike = "FP16", accumulator: FormatLike = "FP32"
) -> tuple[np.ndarray, np.ndarray]:
    """What a kernel may return for a sum of ``terms`` exact products accumulated in ``accumulator`` (round to
    nearest) in ANY order and then rounded once to ``fmt``: the interval ``[low, high]`` of ``fmt`` values.

    Any summation order of k terms in a format of unit roundoff u is within γ_k·Σ|a_i b_i| of the exact sum,
    γ_k = k·u / (1 − k·u) (Higham, "Accuracy and Stability of Numerical Algorithms", 2002, §3.1 and §4.2), and
    rounding is monotone, so the result lies between the roundings to ``fmt`` of ``exact ∓ γ_k·Σ|a_i b_i|``
    (float64's own γ_k is added, for an ``exact`` computed in float64 from exactly representable products).
    A real float16 kernel outside this interval does not accumulate its products in ``accumulator`` and round
    once (:func:`mpt_lab.simulate.fp16_convolution_probe` uses this to tell PyTorch's CPU kernels apart).

    Parameters
    ----------
    exact, abs_sum : float64 torch tensors of one shape: Σ a_i b_i and Σ|a_i b_i| per output (float64 holds them
        exactly enough for k up to millions)
    terms : int ≥ 1, the k of each sum
    fmt, accumulator : formats (names or :class:`~mpt_lab.formats.FloatFormat`)

    Returns
    -------
    (low, high) : float64 tensors of ``fmt`` values, the shape of ``exact``

    Raises
    ------
    TypeError
        ``exact``/``abs_sum`` are not tensors, or ``terms`` is not an int.
    ValueError
        Shapes differ, ``terms`` < 1, or k·u ≥ 1.
    """
    if not (isinstance(exact, torch.Tensor) and isinstance(abs_sum, torch.Tensor)):
        raise TypeError("exact and abs_sum must be torch tensors")
    if exact.shape != abs_sum.shape:
        raise ValueError(f"exact and abs_sum must have one shape, got {tuple(exact.shape)} and {tuple(abs_sum.shape)}")
    if not isinstance(terms, int) or isinstance(terms, bool):
        raise TypeError(f"terms must be an int, got {type(terms).__name__}")
    if terms < 1:
        raise ValueError(f"terms must be ≥ 1, got {terms}")
    fmt, acc = _check_format(fmt, "fmt"), _check_format(accumulator, "accumulator")
    gamma = 0.0
    for u in (unit_roundoff(acc), 2.0**-53):
        if terms * u >= 1:
            raise ValueError(f"terms · u must be < 1 (terms = {terms}, u = {u})")
        gamma += terms * u / (1 - terms * u)
    exact, abs_sum = exact.double(), abs_sum.double()
    return round_to(exact - gamma * abs_sum, fmt), round_to(exact + gamma * abs_sum, fmt)


def _check_rounding(rounding) -> str:
    if not isinstance(rounding, str):
        raise TypeError(f"rounding must be a str, one of {ROUNDINGS}; got {type(rounding).__name__}")
    if rounding not in ROUNDINGS:
        raise ValueError(f"rounding must be one of {ROUNDINGS}, got {rounding!r}")
    return rounding


# ----------------------------------------------------------------------------------------------------------
# Exact building blocks on float64 or float32 NumPy arrays
# ----------------------------------------------------------------------------------------------------------
_INT_OF = {np.dtype(np.float64): np.int64, np.dtype(np.float32): np.int32}


def _to_odd(hi: np.ndarray, lo: np.ndarray) -> np.ndarray:
    """hi + lo rounded to odd in hi's dtype, given hi = RN(hi + lo) and |lo| ≤ ulp(hi)/2 (hi changed in place).

    Where lo ≠ 0 and hi's last mantissa bit is 0, hi moves one ulp toward lo: the neighbour of hi + lo with an
    odd last bit (Boldo & Melquiond 2008)."""
    bits = hi.view(_INT_OF[hi.dtype])
    fix = (lo != 0) & ((bits & 1) == 0)  # lo is 0 wherever hi is not finite
    away = np.signbit(lo) == np.signbit(hi)  # |hi + lo| > |hi|: one ulp up in magnitude
    step = away.astype(bits.dtype)
    step *= 2
    step -= 1
    step *= fix
    bits += step
    return hi


def _two_sum(u: np.ndarray, v: np.ndarray):
    """hi = RN(u + v) and lo with hi + lo = u + v exactly (Knuth's TwoSum, exact in any binary format barring
    overflow; lo = 0 where hi is not finite)."""
    hi = u + v
    bb = hi - v
    t = hi - bb
    np.subtract(v, t, out=t)
    np.subtract(u, bb, out=bb)
    lo = np.add(bb, t, out=bb)
    lo[~np.isfinite(hi)] = 0.0
    return hi, lo


def _round_sum(u: np.ndarray, v: np.ndarray, fmt: FloatFormat, rounding: str) -> np.ndarray:
    """round(u + v) to fmt, exactly, for arrays of one dtype whose values lie in formats that dtype holds.

    float64 arrays: any format :func:`_check_format` accepts.  float32 arrays: formats of at most 22 bits of
    precision whose values are float32 values at least 2**-147 apart (see :func:`_float32_work`)."""
    with np.errstate(invalid="ignore", over="ignore"):
        hi, lo = _two_sum(u, v)
        if hi.dtype == np.float32:
            # overflow of the float32 sum of two finite values: beyond every such format's overflow threshold;
            # float32's max (odd) stands for it, so that rounding toward zero gives the format's max
            over = np.isinf(hi) & np.isfinite(u) & np.isfinite(v)
            if over.any():
                hi[over] = np.copysign(np.float32(np.finfo(np.float32).max), hi[over])
        elif _same(fmt, FP64):
            if rounding == "toward_zero":
                inward = (lo != 0) & (np.signbit(lo) != np.signbit(hi))
                hi[inward] = np.nextafter(hi[inward], 0.0)
                over = np.isinf(hi) & np.isfinite(u) & np.isfinite(v)
                hi[over] = np.copysign(np.finfo(np.float64).max, hi[over])
            return hi
        return np.asarray(round_to(_to_odd(hi, lo), fmt, rounding=rounding), dtype=hi.dtype)


def _float32_work(*formats: FloatFormat) -> bool:
    """Whether additions whose operands and result lie in these formats can be computed on float32 arrays:
    every value is a float32 value, and the result format (the first) has at most 22 bits of precision and
    values at least 2**-147 apart, so float32 rounded to odd keeps two bits beyond it everywhere (its
    subnormals included) and the second rounding is exact (Boldo & Melquiond 2008)."""
    fmt = formats[0]
    return all(_contains(f, FP32) for f in formats) and fmt.precision <= 22 and _lsb_exponent(fmt) >= -147


def _two_product(a: np.ndarray, b: np.ndarray):
    """hi = RN(a·b), lo and a mask ``exact``: hi + lo = a·b exactly where ``exact`` (Dekker's TwoProduct with
    Veltkamp's split; lo = 0 where hi is not finite).  Elsewhere (finite products of magnitudes beyond the
    split's range, or too small for an exact low part) lo is not exact."""
    with np.errstate(invalid="ignore", over="ignore", under="ignore"):
        hi = a * b
        finite = np.isfinite(hi)
        safe = (np.abs(a) <= _SAFE_HI) & (np.abs(b) <= _SAFE_HI) & (np.abs(hi) >= _SAFE_LO) & finite
        zero_factor = (a == 0) | (b == 0)
        aa = np.where(safe, a, 0.0)
        bb = np.where(safe, b, 0.0)
        c = 134217729.0  # 2**27 + 1: Veltkamp's split into two 26-bit halves
        t = c * aa
        a1 = t - (t - aa)
        a2 = aa - a1
        t = c * bb
        b1 = t - (t - bb)
        b2 = bb - b1
        lo = (((a1 * b1 - np.where(safe, hi, 0.0)) + a1 * b2) + a2 * b1) + a2 * b2
        lo[~safe] = 0.0
    return hi, lo, safe | ~finite | zero_factor


#: Products of float32 values rounded to FP16 or BF16 through float32 (:class:`_Via32`): the float32 bits that
#: every midpoint of the 16-bit format has zero (its last 22 − t mantissa bits, t the format's mantissa bits:
#: 12 for FP16, 15 for BF16).
_MIDPOINT_ZERO_BITS = {torch.float16: (1 << 12) - 1, torch.bfloat16: (1 << 15) - 1}


class _Via32:
    """Exact products x·y of float32 values rounded once (to nearest, ties to even) to float16 or bfloat16,
    computed through one float32 multiplication and torch's own float32 → 16-bit conversion.

    Why two roundings give one here.  Let p = x·y (exact: 48 bits at most) and hi = RN32(p), one IEEE float32
    multiplication, and let d be the 16-bit format.  RN_d is a step function of p whose steps change only at
    the midpoints of d (the points halfway between two consecutive d values, the overflow threshold among
    them).  Every midpoint of d is a float32 value: it has t + 2 significant bits (t = 10 for FP16, 7 for BF16)
    and lies within float32's range (FP16's midpoints from 2⁻²⁵ to 65520; BF16's are multiples of 2⁻¹³⁴).
    RN32 is monotone and keeps float32 values, so p < m implies hi ≤ m and p > m implies hi ≥ m for every
    midpoint m: unless hi is itself a midpoint, hi and p lie between the same two consecutive midpoints, and
    RN_d(hi) = RN_d(p).  (p beyond float32's range: hi = ±inf and p beyond d's overflow threshold, which is
    below float32's, so both round to ±inf; p too small for float32: hi = ±0 and RN_d(p) = ±0, both with p's
    sign, since half d's smallest subnormal is a float32 value.)  RN_d(hi) is torch's own float32 → float16
    (bfloat16) conversion, which rounds to nearest even from the float32 bits.

    The products whose hi may be a midpoint are found from hi's bits: a midpoint has its lowest 22 − t float32
    mantissa bits zero (its t + 1 bits after the leading one fill the field's top; subnormal midpoints have more
    zeros, and in float32's subnormal range the field counts units of 2⁻¹⁴⁹, of which BF16's midpoints are
    multiples of 2¹⁵).  Those few (about one product in 2²²⁻ᵗ of random data, and every exact zero) are looked
    at again: where hi ≠ p (the exact product, in float64), p lies strictly between hi and hi's float32
    neighbour n toward p.  n is odd (hi, a candidate, has its last bit 0), so n is no midpoint, and no midpoint
    (a float32 value) lies strictly between hi and n: p and n lie between the same two consecutive midpoints,
    and RN_d(n) = RN_d(p).  So RN_d(n) replaces RN_d(hi) there.  The tests check the whole against
    :func:`mpt_lab.formats.round_to` on the exact products and against rational arithmetic.

    ``x`` and ``y`` are contiguous float32 CPU tensors of shapes that broadcast to ``shape``, whose first axis
    is a chunk of the K axis; :meth:`__call__` takes the rows k0 … k1−1 of both.  The scratch buffers are
    allocated once, for ``shape``.
    """

    def __init__(self, dtype, x: torch.Tensor, y: torch.Tensor, shape: tuple):
        self.dtype, self.mask = dtype, _MIDPOINT_ZERO_BITS[dtype]
        self.x, self.y = x, y
        self.hi = torch.empty(shape, dtype=torch.float32)
        self.out = torch.empty(shape, dtype=dtype)
        self.flag = np.empty(math.prod(shape), dtype=bool)
        # the flat index, in a chunk of x (of y), of each flat index of the products: the broadcast, once
        self.xmap = self._index_map(x.shape[1:], shape)
        self.ymap = self._index_map(y.shape[1:], shape)

    @staticmethod
    def _index_map(rest: tuple, shape: tuple) -> np.ndarray:
        rest = (1,) * (len(shape) - 1 - len(rest)) + tuple(rest)
        index = np.arange(shape[0] * math.prod(rest), dtype=np.int64).reshape(shape[0], *rest)
        return np.ascontiguousarray(np.broadcast_to(index, shape)).reshape(-1)

    def __call__(self, k0: int, k1: int) -> torch.Tensor:
        """Products of rows k0 … k1−1, rounded to ``dtype``: a view of a buffer that the next call overwrites."""
        m = k1 - k0
        x, y, hi, out = self.x[k0:k1], self.y[k0:k1], self.hi[:m], self.out[:m]
        torch.mul(x, y, out=hi)  # RN32(p): one float32 multiplication
        out.copy_(hi)  # RN_d(hi): torch's conversion, nearest even
        size = hi.numel()
        low = hi.numpy().reshape(-1).view(np.int32)
        np.bitwise_and(low, self.mask, out=low)  # hi is not needed any more: its bits, in place
        idx = np.flatnonzero(np.equal(low, 0, out=self.flag[:size]))  # NumPy's nonzero: faster than torch's
        if idx.size:
            xs, ys = x.numpy().reshape(-1), y.numpy().reshape(-1)
            a, b = xs[self.xmap[idx]], ys[self.ymap[idx]]
            with np.errstate(over="ignore", invalid="ignore"):
                h = a * b  # hi again (NumPy's float32 product: RN32 too)
                rest = a.astype(np.float64) * b - h  # p − hi, exact
            bad = np.flatnonzero((rest != 0) & np.isfinite(rest))  # exact products, ±inf, NaN: right already
            if bad.size:
                n = np.nextafter(h[bad], np.copysign(np.float32(np.inf), rest[bad]).astype(np.float32))
                if self.dtype is torch.float16:  # NumPy's float32 → float16 rounds to nearest even
                    with np.errstate(over="ignore"):  # beyond 65520: inf, as it should
                        out.numpy().reshape(-1)[idx[bad]] = n.astype(np.float16)
                else:
                    bits = torch.from_numpy(n).to(self.dtype).view(torch.int16).numpy()
                    out.view(torch.int16).numpy().reshape(-1)[idx[bad]] = bits
        return out


def _exact_product_rounded(a: float, b: float, fmt: FloatFormat) -> float:
    """The product a·b rounded once to fmt, by rational arithmetic (for the rare products Dekker cannot split)."""
    if a == 0 or b == 0:
        return a * b  # a signed zero
    return float(round_to(Fraction(a) * Fraction(b), fmt))


# ----------------------------------------------------------------------------------------------------------
# The engine: products by chunks of the K axis, then one order of addition
# ----------------------------------------------------------------------------------------------------------
@dataclass
class _Plan:
    acc: FloatFormat
    prod: FloatFormat
    rounding: str
    order: str
    block_size: int | None
    compensated: bool
    native: object  # the torch dtype whose own additions are exact for this accumulator, or None

    @property
    def result_format(self) -> FloatFormat:
        return FP32 if self.order == "blocked" else self.acc


def _representable(x: torch.Tensor, dtype) -> bool:
    return bool(((x.to(dtype).to(x.dtype) == x) | torch.isnan(x)).all())


class _Engine:
    """Runs one plan over operands X, Y of shapes (K, ...) that broadcast to (K, *out)."""

    def __init__(self, plan: _Plan, X: torch.Tensor, Y: torch.Tensor):
        self.p = plan
        self.K = X.shape[0]
        self.out_shape = np.broadcast_shapes(X.shape[1:], Y.shape[1:])
        # the cheapest dtype in which every product is exact
        if _representable(X, torch.float16) and _representable(Y, torch.float16):
            self.exact = torch.float32  # 11-bit significands: 22-bit products within float32's normal range
        elif _representable(X, torch.float32) and _representable(Y, torch.float32):
            self.exact = torch.float64  # 24-bit significands: 48-bit products within float64's normal range
        else:
            self.exact = None  # float64 values: Dekker's TwoProduct
        native_prod = _native(plan.prod)
        # the fast path: FP16 values whose products are rounded to a native dtype and added in a native dtype;
        # torch's CPU kernels compute a float16·float16 (float32·float32) product in float32, where it is exact,
        # and round it once to the dtype of ``out``.  Float32 values whose products are rounded to FP32 take it
        # too: an IEEE float32 multiplication is their exact product rounded once.
        self.fused = plan.native is not None and (
            (self.exact is torch.float32 and native_prod is not None)
            or (self.exact is torch.float64 and native_prod is torch.float32)
        )
        # float32 values whose products are rounded to FP16 or BF16: through float32, where that is exact
        # (:class:`_Via32`), instead of the bit path on float64 products
        self.via32 = self.exact is torch.float64 and native_prod in _MIDPOINT_ZERO_BITS
        if self.fused:
            work = torch.float16 if native_prod is torch.float16 else torch.float32
            self.X, self.Y = X.to(work), Y.to(work)
        elif self.via32:
            self.X = X.to(torch.float32).contiguous()  # float32 values: exact
            self.Y = Y.to(torch.float32).contiguous()
        else:
            self.X = X.to(self.exact or torch.float64)
            self.Y = Y.to(self.exact or torch.float64)
        n_out = max(1, math.prod(self.out_shape))
        # chunks of the K axis: cache-sized for the fast paths (their buffers are reused; the float32 route's four
        # passes over its products run fastest with 2**17 of them), larger otherwise
        div = 8 if self.fused else 16 if self.via32 else 1
        self.chunk = max(1, (_CHUNK_ELEMENTS // div) // n_out)
        self._buffers = None
        self.native_prod = native_prod
        # the general path's arrays: float32 where that is exact (half the memory traffic of float64)
        self.work = np.dtype(np.float32 if _float32_work(plan.acc, plan.prod) else np.float64)

    # --- products ---------------------------------------------------------------------------------------
    def products(self, k0: int, k1: int):
        """Products k0 … k1−1 rounded to the products format, shape (k1 − k0, *out): a tensor of the native
        accumulator dtype on the native path (on the fast path a view of a buffer that the next call
        overwrites), else a NumPy array of the work dtype (float32 or float64)."""
        p = self.p
        x, y = self.X[k0:k1], self.Y[k0:k1]
        if self.fused:
            n = k1 - k0
            if self._buffers is None or self._buffers[0].shape[0] < n:
                shape = (n, *self.out_shape)
                prod = torch.empty(shape, dtype=self.native_prod)
                self._buffers = (prod, prod if self.native_prod is p.native else torch.empty(shape, dtype=p.native))
            prod, out = (b[:n] for b in self._buffers)
            torch.mul(x, y, out=prod)  # exact product, one rounding to the products format
            if out is not prod:
                out.copy_(prod)  # products ⊆ accumulator: exact
            return out
        native_prod = self.native_prod
        if self.via32:
            if self._buffers is None:
                shape = (min(self.chunk, self.K), *self.out_shape)
                via = _Via32(native_prod, self.X, self.Y, shape)
                out = None if native_prod is p.native or p.native is None else torch.empty(shape, dtype=p.native)
                self._buffers = (via, out)
            via, out = self._buffers
            q = via(k0, k1)
            if p.native is None:
                return q.to(torch.float64).numpy().astype(self.work, copy=False)
            return q if out is None else out[: k1 - k0].copy_(q)  # products ⊆ accumulator: exact
        if self.exact is torch.float32 and native_prod is not None:
            q = (x * y).to(native_prod)  # exact product, one rounding (a native cast from float32)
        elif self.exact is torch.float64 and native_prod is torch.float32:
            q = (x * y).to(torch.float32)  # exact product, one rounding
        elif self.exact is not None:
            e = (x * y).to(torch.float64).numpy()
            if _same(p.prod, FP64):
                q = e
            else:
                q = np.asarray(round_to(e, p.prod), dtype=np.float64)
        else:
            q = self._products_float64(x, y)
        if p.native is not None:
            return q.to(p.native) if isinstance(q, torch.Tensor) else torch.from_numpy(q).to(p.native)
        q = q.to(torch.float64).numpy() if isinstance(q, torch.Tensor) else q
        return q.astype(self.work, copy=False)  # products' values are values of the work dtype: exact

    def _products_float64(self, x: torch.Tensor, y: torch.Tensor) -> np.ndarray:
        shape = np.broadcast_shapes(x.shape, y.shape)
        a = np.ascontiguousarray(np.broadcast_to(x.numpy(), shape))
        b = np.ascontiguousarray(np.broadcast_to(y.numpy(), shape))
        hi, lo, exact = _two_product(a, b)
        if _same(self.p.prod, FP64):
            return hi  # IEEE multiplication: a·b rounded once to float64, subnormals included
        q = np.asarray(round_to(_to_odd(hi, lo), self.p.prod), dtype=np.float64)
        for i in np.flatnonzero(~exact.reshape(-1)):
            q.reshape(-1)[i] = _exact_product_rounded(float(a.reshape(-1)[i]), float(b.reshape(-1)[i]), self.p.prod)
        return q

    def chunks(self, size: int | None = None):
        size = size or self.chunk
        for k0 in range(0, self.K, size):
            yield self.products(k0, min(self.K, k0 + size))

    # --- additions --------------------------------------------------------------------------------------
    def add(self, u, v, fmt: FloatFormat | None = None, rounding: str | None = None):
        """round(u + v) to the accumulator (or fmt), on the path's own containers."""
        fmt = fmt or self.p.acc
        rounding = rounding or self.p.rounding
        if isinstance(u, torch.Tensor):
            return u + v  # the native dtype's own addition: exact (see the module docstring)
        return _round_sum(u, v, fmt, rounding)

    def zeros(self):
        if self.p.native is not None:
            return torch.zeros(self.out_shape, dtype=self.p.native)
        return np.zeros(self.out_shape, dtype=self.work)

    # --- orders -----------------------------------------------------------------------------------------
    def sequential(self, record: bool = False):
        s = self.zeros()
        c = self.zeros() if self.p.compensated else None
        history = []
        for P in self.chunks():
            for j in range(P.shape[0]):
                if c is None:
                    if isinstance(s, torch.Tensor):
                        s.add_(P[j])
                    else:
                        s = self.add(s, P[j])
                else:
                    yk = self.add(P[j], -c)
                    t = self.add(s, yk)
                    c = self.add(self.add(t, -s), -yk)
                    s = t
                if record:
                    history.append(s.clone() if isinstance(s, torch.Tensor) else s.copy())
        return (s, history) if record else s

    def pairwise(self):
        # complete power-of-two chunks become subtrees; a binary counter joins equal levels, and the tail
        # (the last, shorter chunk) is reduced level by level: the same tree as level by level over all K
        size = 1 << max(0, self.chunk.bit_length() - 1)
        stack = []  # (level, partial sum), levels strictly decreasing
        tail = None
        for k0 in range(0, self.K, size):
            P = self.products(k0, min(self.K, k0 + size))
            part = self._levels(P)
            if P.shape[0] < size:
                tail = part
                break
            level = size.bit_length() - 1
            while stack and stack[-1][0] == level:
                part = self.add(stack.pop()[1], part)
                level += 1
            stack.append((level, part))
        if tail is not None:
            stack.append((-1, tail))
        if not stack:
            return self.zeros()
        total = stack.pop()[1]
        while stack:
            total = self.add(stack.pop()[1], total)
        return total

    def _levels(self, P):
        while P.shape[0] > 1:
            n = P.shape[0]
            pairs = self.add(P[0 : n - 1 : 2], P[1:n:2])
            if n % 2:
                last = P[n - 1 : n]
                pairs = torch.cat([pairs, last]) if isinstance(P, torch.Tensor) else np.concatenate([pairs, last])
            P = pairs
        return P[0].clone() if isinstance(P, torch.Tensor) else P[0].copy()  # never a view of a product buffer

    def blocked(self):
        native32 = self.p.native is not None and _contains(self.p.acc, FP32)
        total = torch.zeros(self.out_shape, dtype=torch.float32) if native32 else np.zeros(self.out_shape)
        s = self.zeros()
        k = 0
        for P in self.chunks():
            for j in range(P.shape[0]):
                if isinstance(s, torch.Tensor):
                    s.add_(P[j])
                else:
                    s = self.add(s, P[j])
                k += 1
                if k % self.p.block_size == 0 or k == self.K:
                    if native32:
                        total.add_(s.to(torch.float32))  # FP32 addition, exact cast of s
                    else:
                        sv = s.to(torch.float64).numpy() if isinstance(s, torch.Tensor) else s.astype(np.float64)
                        total = _round_sum(total, sv, FP32, "nearest_even")
                    s = self.zeros()
        return total

    def run(self):
        if self.p.order == "pairwise":
            return self.pairwise()
        if self.p.order == "blocked":
            return self.blocked()
        return self.sequential()


# ----------------------------------------------------------------------------------------------------------
# Public functions
# ----------------------------------------------------------------------------------------------------------
def _operand(x, argname: str):
    """(float64-or-narrower CPU tensor view of x, kind, device)."""
    if isinstance(x, torch.Tensor):
        if not x.is_floating_point():
            raise TypeError(f"{argname} must be a floating-point tensor, got dtype {x.dtype}")
        if x.device.type == "meta":
            raise ValueError(f"{argname} is a meta tensor (no values)")
        t = x.detach().to("cpu")
        if t.dtype not in (torch.float16, torch.float32, torch.float64):
            t = t.to(torch.float32)  # bfloat16 and float8 values are float32 values
        return t, "torch", x.device
    if isinstance(x, np.generic):
        x = np.asarray(x)
    if isinstance(x, np.ndarray):
        if not (x.dtype.kind == "f" or (x.dtype.kind == "V" and "float" in x.dtype.name)):
            raise TypeError(f"{argname} must be a NumPy float array, got dtype {x.dtype}")
        if x.dtype not in (np.float16, np.float32, np.float64):
            x = x.astype(np.float32)  # ml_dtypes floats (bfloat16, float8, ...) are float32 values
        # (not np.ascontiguousarray, which makes a 0-d array 1-d: a 0-d input has no axis K, as a 0-d tensor)
        return torch.from_numpy(x if x.flags.c_contiguous else np.ascontiguousarray(x)), "numpy", None
    raise TypeError(f"{argname} must be a NumPy float array or a torch floating tensor, got {type(x).__name__}")


def _plan(accumulator, products, order, block_size, compensated, rounding) -> _Plan:
    acc = _check_format(accumulator, "accumulator")
    prod = acc if products is None else _check_format(products, "products")
    if not isinstance(order, str):
        raise TypeError(f"order must be a str, one of {ORDERS}; got {type(order).__name__}")
    if order not in ORDERS:
        raise ValueError(f"order must be one of {ORDERS}, got {order!r}")
    if order == "blocked":
        if block_size is None:
            raise ValueError("block_size is required with order='blocked' (e.g. 128, DeepSeek-V3's N_C)")
        if not isinstance(block_size, numbers.Integral) or isinstance(block_size, bool):
            raise TypeError(f"block_size must be an int, got {type(block_size).__name__}")
        if block_size < 1:
            raise ValueError(f"block_size must be ≥ 1, got {block_size}")
        block_size = int(block_size)
    elif block_size is not None:
        raise ValueError(
            f"block_size is only used with order='blocked'; got block_size={block_size!r} with order={order!r}"
        )
    if not isinstance(compensated, (bool, np.bool_)):
        raise TypeError(f"compensated must be a bool, got {type(compensated).__name__}")
    if compensated and order != "sequential":
        raise ValueError(f"compensated=True (Kahan summation) needs order='sequential', got order={order!r}")
    rounding = _check_rounding(rounding)
    native = _native(acc) if rounding == "nearest_even" and _contains(prod, acc) else None
    return _Plan(acc, prod, rounding, order, block_size, bool(compensated), native)


def _finish(s, plan: _Plan, kind: str, device, shape):
    """The result in the caller's type: float32 where the result format's values are float32 values, else
    float64; a NumPy array (a NumPy scalar for 0-d) or a tensor on the inputs' device."""
    dtype = torch.float32 if _contains(plan.result_format, FP32) else torch.float64
    t = s.to(dtype) if isinstance(s, torch.Tensor) else torch.from_numpy(np.asarray(s)).to(dtype)
    t = t.reshape(shape)
    if kind == "torch":
        return t.to(device)
    out = t.numpy()
    return out[()] if out.ndim == 0 else out


_KEYWORDS = """
    accumulator : FloatFormat or str, default "FP32"
        The accumulator's format: every addition is rounded to it.  Catalogue names ("FP32", "BF16", "FP16",
        "TF32", ...) or a custom :class:`~mpt_lab.formats.FloatFormat` with at most 51 bits of precision within
        float64's range (or FP64 itself).
    products : FloatFormat or str or None, default None
        The format each exact product a_k·b_k is rounded to (round-to-nearest-even) before it is added;
        None: the accumulator's format.  Exact products of FP16 or FP8 inputs fit "FP32".
    order : {"sequential", "pairwise", "blocked"}, default "sequential"
        The order of the additions (module docstring).
    block_size : int ≥ 1, required with order="blocked" and only there
        Products per block before the block's sum is promoted into the FP32 total (DeepSeek-V3: 128).
    compensated : bool, default False
        Kahan's compensated summation with every operation in the accumulator format (sequential only).
    rounding : {"nearest_even", "toward_zero"}, default "nearest_even"
        The rounding of the accumulator's additions (products and the FP32 total of "blocked" always round
        to nearest even)."""
_KEYWORDS_MARK = "    (keywords: accumulator, products, order, block_size, compensated, rounding; see _KEYWORDS)"


def _keywords_documented(fn):
    """``fn`` with :data:`_KEYWORDS` in its docstring in place of the line :data:`_KEYWORDS_MARK` (a docstring must
    be a literal for ``help()`` to show it: one built with ``+`` is no docstring)."""
    if _KEYWORDS_MARK not in (fn.__doc__ or ""):
        raise AssertionError(f"{fn.__name__}'s docstring lacks the keywords' line")
    fn.__doc__ = fn.__doc__.replace(_KEYWORDS_MARK, _KEYWORDS.strip("\n"))
    return fn


@exact_arithmetic
@_keywords_documented
def dot(
    a: ArrayLike,
    b: ArrayLike,
    *,
    accumulator: FormatLike = "FP32",
    products: FormatLike | None = None,
    order: str = "sequential",
    block_size: int | None = None,
    compensated: bool = False,
    rounding: str = "nearest_even",
) -> np.ndarray:
    """Dot products over the last axis, ``Σ_k a[..., k]·b[..., k]``, with every product and addition rounded.

    Each exact product is rounded once to ``products``; the products are added in ``order`` with every
    addition rounded to ``accumulator`` (Micikevicius et al. 2018, §3.3: FP16 products accumulated into FP32).
    The result is exactly what that arithmetic gives: the same as the ``fractions.Fraction`` computation
    rounded after every step, NaN, infinities and signed zeros as IEEE 754-2019 has them.

    Parameters
    ----------
    a, b : NumPy float arrays or torch floating tensors, shapes (..., K) whose leading axes broadcast
        Both NumPy or both torch.  Any float dtype (float16/32/64, bfloat16, ml_dtypes and torch float8);
        values are used exactly.
    (keywords: accumulator, products, order, block_size, compensated, rounding; see _KEYWORDS)

    Returns
    -------
    The dot products, shape = the broadcast leading shape.  dtype float32 where the result format's values
    are float32 values (FP32, TF32, BF16, FP16, FP8 and narrower accumulators; always for "blocked"), float64
    otherwise (FP64, wider custom formats).  A NumPy array (a NumPy scalar for 1-D inputs), or a tensor on the
    inputs' device (computed on the CPU, no autograd).

    Raises
    ------
    TypeError
        a or b not a float array/tensor, or of different kinds (one NumPy, one torch); a keyword of the wrong
        type.
    ValueError
        a or b without axes, different K (last axis), leading axes that do not broadcast, tensors on different
        devices; an unknown format, order or rounding; block_size missing for "blocked" or given for another
        order; compensated with an order other than "sequential"; a format float64 cannot carry exactly.
    """
    plan = _plan(accumulator, products, order, block_size, compensated, rounding)
    engine, kind, device, lead = _dot_engine(a, b, plan)
    return _finish(engine.run(), plan, kind, device, lead)


@exact_arithmetic
@_keywords_documented
def matmul(
    A: ArrayLike,
    B: ArrayLike,
    *,
    accumulator: FormatLike = "FP32",
    products: FormatLike | None = None,
    order: str = "sequential",
    block_size: int | None = None,
    compensated: bool = False,
    rounding: str = "nearest_even",
) -> np.ndarray | torch.Tensor:
    """Matrix product ``A @ B`` with each output element computed exactly as :func:`dot` computes it.

    Parameters
    ----------
    A : NumPy float array or torch floating tensor, shape (..., M, K)
    B : the same kind, shape (..., K, N); leading (batch) axes broadcast
    (keywords: accumulator, products, order, block_size, compensated, rounding; see _KEYWORDS)

    Returns
    -------
    Shape (..., M, N); dtype, type and device as :func:`dot`.  ``matmul(A, B, **kw)[i, j] ==
    dot(A[i, :], B[:, j], **kw)`` for every i, j.  The work is vectorised over the M×N outputs, K steps of
    rounded additions.  Fast (the module docstring's "Speed"): FP16, BF16 or FP32 accumulators rounding to
    nearest, products in FP16, BF16 or FP32, on FP16-valued or float32-valued operands (float32 ones with FP16
    products about 2.6 times the FP16-valued time); other formats and roundings take the general path.

    Raises
    ------
    TypeError, ValueError
        As :func:`dot`; A or B with fewer than two axes; A's K (last axis) different from B's (second to
        last).
    """
    plan = _plan(accumulator, products, order, block_size, compensated, rounding)
    (x, kind, device), (y, kind_b, device_b) = _operand(A, "A"), _operand(B, "B")
    _same_kind(kind, kind_b, device, device_b)
    if x.ndim < 2 or y.ndim < 2:
        raise ValueError(f"A and B need shapes (..., M, K) and (..., K, N); got {tuple(x.shape)} and {tuple(y.shape)}")
    if x.shape[-1] != y.shape[-2]:
        raise ValueError(f"B: its K (second to last axis, {y.shape[-2]}) must equal A's last axis ({x.shape[-1]})")
    try:
        lead = np.broadcast_shapes(x.shape[:-2], y.shape[:-2])
    except ValueError:
        raise ValueError(
            f"A and B: batch axes {tuple(x.shape[:-2])} and {tuple(y.shape[:-2])} do not broadcast"
        ) from None
    x, y = _pad(x, y)
    X = torch.movedim(x, -1, 0).unsqueeze(-1)  # (K, ..., M, 1)
    Y = torch.movedim(y, -2, 0).unsqueeze(-2)  # (K, ..., 1, N)
    engine = _Engine(plan, X, Y)
    return _finish(engine.run(), plan, kind, device, (*lead, x.shape[-2], y.shape[-1]))


@exact_arithmetic
def partial_sums(
    a: ArrayLike,
    b: ArrayLike,
    *,
    accumulator: FormatLike = "FP32",
    products: FormatLike | None = None,
    compensated: bool = False,
    rounding: str = "nearest_even",
) -> np.ndarray:
    """Every running sum of the sequential order: ``out[..., k]`` is ``dot(a[..., :k+1], b[..., :k+1], ...)``.

    This is where swamping shows: once the running sum's half ulp exceeds the products, ``out`` stops
    growing (IEEE 754 round-to-nearest returns the larger addend).

    Parameters
    ----------
    a, b, accumulator, products, compensated, rounding
        As :func:`dot` (order is "sequential").

    Returns
    -------
    Shape (..., K): the sums after 1, 2, …, K additions; dtype, type and device as :func:`dot`.

    Raises
    ------
    TypeError, ValueError
        As :func:`dot`.
    """
    plan = _plan(accumulator, products, "sequential", None, compensated, rounding)
    engine, kind, device, lead = _dot_engine(a, b, plan)
    _, history = engine.sequential(record=True)
    if history:
        stacked = torch.stack(history, -1) if isinstance(history[0], torch.Tensor) else np.stack(history, -1)
    else:
        stacked = np.zeros((*lead, 0))
    return _finish(stacked, plan, kind, device, (*lead, engine.K))


def _pad(x: torch.Tensor, y: torch.Tensor):
    """x and y with size-1 leading axes added so that both have as many axes (their leading axes broadcast)."""
    nd = max(x.ndim, y.ndim)
    return x.reshape((1,) * (nd - x.ndim) + tuple(x.shape)), y.reshape((1,) * (nd - y.ndim) + tuple(y.shape))


def _dot_engine(a, b, plan: _Plan):
    """The engine of a dot product over the last axis, with the caller's kind, device and leading shape."""
    (x, kind, device), (y, kind_b, device_b) = _operand(a, "a"), _operand(b, "b")
    _same_kind(kind, kind_b, device, device_b)
    if x.ndim == 0 or y.ndim == 0:
        raise ValueError(
            f"a and b need a last axis K (shape (..., K)); got shapes {tuple(x.shape)} and {tuple(y.shape)}"
        )
    if x.shape[-1] != y.shape[-1]:
        raise ValueError(f"b: its last axis (K = {y.shape[-1]}) must equal a's (K = {x.shape[-1]})")
    try:
        lead = tuple(np.broadcast_shapes(x.shape[:-1], y.shape[:-1]))
    except ValueError:
        raise ValueError(
            f"a and b: leading axes {tuple(x.shape[:-1])} and {tuple(y.shape[:-1])} do not broadcast"
        ) from None
    x, y = _pad(x, y)
    if not lead:  # one dot product: a unit axis, as NumPy's 0-d arithmetic returns scalars
        x, y = x[None], y[None]
    return _Engine(plan, torch.movedim(x, -1, 0), torch.movedim(y, -1, 0)), kind, device, lead


def _same_kind(kind_a, kind_b, device_a, device_b) -> None:
    if kind_a != kind_b:
        raise TypeError(f"the two operands must both be NumPy arrays or both torch tensors, got {kind_a} and {kind_b}")
    if device_a != device_b:
        raise ValueError(f"the two operands must be on the same device, got {device_a} and {device_b}")


# ----------------------------------------------------------------------------------------------------------
# Two models built on the above: a tensor core's FP8 accumulation, and Kahan-compensated low-precision weights
# ----------------------------------------------------------------------------------------------------------
def _aligned_group_sums(p: np.ndarray, group: int, bits: int) -> np.ndarray:
    """Exact sums of consecutive groups of ``group`` products (last axis), each product first truncated toward
    zero to the ``bits`` highest bits below the group's largest exponent."""
    K = p.shape[-1]
    pad = (-K) % group
    if pad:
        p = np.concatenate([p, np.zeros((*p.shape[:-1], pad))], axis=-1)
    g = p.reshape(*p.shape[:-1], -1, group)
    with np.errstate(divide="ignore"):
        e = np.floor(np.log2(np.abs(g).max(axis=-1, keepdims=True)))
    e = np.where(np.isfinite(e), e, 0.0)
    quantum = np.exp2(e - (bits - 1))
    return (np.trunc(g / quantum) * quantum).sum(axis=-1)  # ≤ bits + log2(group) bits: exact in float64


def tensor_core_dot(
    a: ArrayLike, b: ArrayLike, *, group: int = 32, bits: int = 14, promote_every: int | None = None
) -> np.ndarray:
    """A model of FP8 tensor-core accumulation as DeepSeek-V3 describes Hopper's (arXiv:2412.19437, §3.5.2).

    "After aligning 32 mantissa products by right-shifting based on the maximum exponent, the Tensor Core only
    uses the highest 14 bits of each mantissa product for addition, and truncates bits exceeding this range.
    The accumulation of addition results into registers also employs 14-bit precision."  Modelled as: the
    exact products of each group of ``group`` consecutive k are truncated toward zero to multiples of
    2^(e − bits + 1), e the group's largest product exponent, and summed exactly; each exact group sum is added
    to an accumulator of ``bits`` bits of precision (FP32's exponent range, its subnormals included) and the sum
    rounded toward zero, once (also where a group sum has more than 24 bits, bits + log2(group) > 24, or lies
    below FP32's normal range).  With
    ``promote_every`` (a multiple of ``group``; DeepSeek-V3: N_C = 128) the accumulator's partial sum is added
    into an FP32 total (round-to-nearest-even) every ``promote_every`` products and restarts from zero, as
    their promotion to CUDA cores does (§3.3.2).  The hardware's exact behaviour is not public: this is a model
    of the paper's description (the alignment may also involve the accumulator; the order of the group
    additions is assumed sequential).

    Parameters
    ----------
    a, b : NumPy float arrays of shape (..., K) (leading axes broadcast), e.g. FP8 E4M3 values
    group : int ≥ 1, products aligned and added together (32 on Hopper, per the paper)
    bits : int in [2, 24], bits kept of each aligned product and by the accumulator (14)
    promote_every : None or a positive multiple of ``group``

    Returns
    -------
    float32 NumPy array of the leading shape: the modelled dot products.

    Raises
    ------
    TypeError, ValueError
        Non-array inputs, different K, a bad group, bits or promote_every.
    """
    for name, v in (("group", group), ("bits", bits)):
        if not isinstance(v, numbers.Integral) or isinstance(v, bool):
            raise TypeError(f"{name} must be an int, got {type(v).__name__}")
    if group < 1:
        raise ValueError(f"group must be ≥ 1, got {group}")
    if not 2 <= bits <= 24:
        raise ValueError(f"bits must be in [2, 24], got {bits}")
    if promote_every is not None:
        if not isinstance(promote_every, numbers.Integral) or isinstance(promote_every, bool):
            raise TypeError(f"promote_every must be an int or None, got {type(promote_every).__name__}")
        if promote_every < 1 or promote_every % group:
            raise ValueError(f"promote_every must be a positive multiple of group ({group}), got {promote_every}")
    x, _, _ = _operand(a, "a")
    y, _, _ = _operand(b, "b")
    if x.ndim == 0 or y.ndim == 0 or x.shape[-1] != y.shape[-1]:
        raise ValueError(f"a and b need shapes (..., K) with the same K; got {tuple(x.shape)} and {tuple(y.shape)}")
    if not (_representable(x, torch.float32) and _representable(y, torch.float32)):
        raise ValueError(
            "a and b must hold float32 values (FP8, FP16, BF16 or FP32), whose products are exact in float64"
        )
    p = x.double().numpy() * y.double().numpy()
    sums = _aligned_group_sums(p, group, bits)
    acc = FloatFormat(f"TC{bits}", 8, bits - 1, 127)
    kw = {"order": "blocked", "block_size": promote_every // group} if promote_every else {}
    # each exact group sum (float64: exact, see _aligned_group_sums) is added to the accumulator and the sum
    # rounded toward zero once: "products" FP64 keep the group sums as they are (an FP32 rounding to nearest of
    # a sum wider than 24 bits, or below FP32's normal range, would round twice)
    return np.asarray(
        dot(sums, np.ones_like(sums), accumulator=acc, products=FP64, rounding="toward_zero", **kw), dtype=np.float32
    )


@exact_arithmetic
def compensated_update_(
    weights: torch.Tensor, update: torch.Tensor, compensation: torch.Tensor, fmt: FormatLike = "BF16"
) -> None:
    """Add ``update`` to low-precision ``weights`` with Kahan compensation, every operation rounded to ``fmt``.

    The step of optimizers that keep BF16 weights without FP32 master weights and carry the rounding error in
    a compensation buffer c of the same format (optimi's ``kahan_sum``; Zamirai et al., "Revisiting BFloat16
    Training", arXiv:2010.06192)::

        c ← fmt(c + update);  old ← w;  w ← fmt(w + c);  c ← fmt(c + fmt(old − w))

    An update smaller than half an ulp of w is not lost: it stays in c until the sum of such updates moves w.
    Each of the four operations is exact and then rounded once to ``fmt`` (round-to-nearest-even; never through
    a float32 sum first, which would round twice: w = c = 1, u = 2⁻⁸ + 2⁻³¹ in BF16 gives c = 2⁻⁷ here, 0 with
    a float32 sum).  The arithmetic runs on the CPU in float64 (TwoSum and rounding to odd, as :func:`dot`).

    Parameters
    ----------
    weights, compensation : floating tensors holding values of ``fmt`` (e.g. float32 tensors of BF16 values,
        or bfloat16 tensors), changed in place; compensation starts at zero
    update : floating tensor of the same shape (what the optimizer adds, e.g. −lr·m/(√v + ε))
    fmt : FloatFormat or str (default "BF16")

    Raises
    ------
    TypeError, ValueError
        Non-tensors, different shapes, an unknown format or one without a sign and a zero.
    """
    fmt = _check_format(fmt, "fmt")
    for name, t in (("weights", weights), ("update", update), ("compensation", compensation)):
        if not isinstance(t, torch.Tensor) or not t.is_floating_point():
            raise TypeError(f"{name} must be a floating tensor, got {type(t).__name__}")
        if t.shape != weights.shape:
            raise ValueError(f"{name} must have the weights' shape {tuple(weights.shape)}, got {tuple(t.shape)}")

    def f64(t: torch.Tensor) -> np.ndarray:  # every float dtype's values are float64 values: exact
        return t.detach().to("cpu", torch.float64).numpy().reshape(-1)

    def add(u: np.ndarray, v: np.ndarray) -> np.ndarray:  # fmt(u + v): the exact sum rounded once
        return _round_sum(u, v, fmt, "nearest_even")

    with torch.no_grad():
        old, c = f64(weights), add(f64(compensation), f64(update))
        w = add(old, c)
        c = add(c, add(old, -w))
        weights.copy_(torch.from_numpy(w).reshape(weights.shape))
        compensation.copy_(torch.from_numpy(c).reshape(compensation.shape))


# ----------------------------------------------------------------------------------------------------------
# a Linear layer whose products accumulate in a chosen format (chapter 5's training comparison)
# ----------------------------------------------------------------------------------------------------------
class _AccumulatedMatmulFn(torch.autograd.Function):
    """y = x Wᵀ + b with FP16 operands and every product and sum in ``accumulator`` (forward and backward)."""

    @staticmethod
    def forward(ctx, x, weight, bias, accumulator):
        xq, wq = round_to(x.detach(), FP16), round_to(weight.detach(), FP16)
        ctx.save_for_backward(xq, wq)
        ctx.accumulator = accumulator
        y = matmul(xq, wq.t(), accumulator=accumulator)
        return y + bias if bias is not None else y

    @staticmethod
    def backward(ctx, g):
        xq, wq = ctx.saved_tensors
        gq = round_to(g.detach().contiguous(), FP16)
        grad_x = matmul(gq, wq, accumulator=ctx.accumulator)
        grad_w = matmul(gq.t(), xq, accumulator=ctx.accumulator)
        return grad_x, grad_w, g.sum(0), None


class AccumulatedLinear(nn.Module):
    """An ``nn.Linear`` whose products (forward and backward) take FP16 operands and accumulate in a chosen format.

    Input float32 [N, in_features], output float32 [N, out_features]; the FP32 parameters are those of the
    wrapped layer (master weights), rounded to FP16 for each product.

    Raises TypeError for a non-Linear layer; ValueError for an unknown accumulator (from
    :func:`matmul`).
    """

    def __init__(self, linear: nn.Linear, accumulator: str | FloatFormat = "FP32"):
        super().__init__()
        if not isinstance(linear, nn.Linear):
            raise TypeError(f"linear must be an nn.Linear, got {type(linear).__name__}")
        self.weight, self.bias, self.accumulator = linear.weight, linear.bias, accumulator

    def extra_repr(self) -> str:
        return f"accumulator={self.accumulator}"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _AccumulatedMatmulFn.apply(x, self.weight, self.bias, self.accumulator)


def accumulate_linears_(model: nn.Module, accumulator: str | FloatFormat = "FP32") -> nn.Module:
    """Replace every ``nn.Linear`` of ``model`` (in place) by an :class:`AccumulatedLinear`; returns model."""
    for name, child in model.named_children():
        if isinstance(child, nn.Linear):
            setattr(model, name, AccumulatedLinear(child, accumulator))
        else:
            accumulate_linears_(child, accumulator)
    return model
