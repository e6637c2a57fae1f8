"""Binary floating-point formats, bit by bit.

A :class:`FloatFormat` describes a binary interchange format by its field widths (sign, biased exponent,
mantissa = trailing significand), its exponent bias and how it spends its top exponent code (infinities,
NaNs, or more finite values).  The catalogue holds the formats of mixed precision training:

=============  ====  ====  =====  ======================================================================
name           bits  exp.  mant.  source
=============  ====  ====  =====  ======================================================================
``FP64``        64    11    52    IEEE 754-2019 binary64
``FP32``        32     8    23    IEEE 754-2019 binary32
``TF32``        19     8    10    NVIDIA TensorFloat-32 (Ampere tensor-core input format)
``FP16``        16     5    10    IEEE 754-2019 binary16
``BF16``        16     8     7    Google brain floating point (bfloat16)
``FP8_E4M3``     8     4     3    OCP OFP8 (2023) E4M3, i.e. E4M3FN: no infinities, one NaN code, max 448
``FP8_E5M2``     8     5     2    OCP OFP8 (2023) E5M2: IEEE conventions, max 57344
``FP6_E3M2``     6     3     2    OCP MX v1.0 FP6: no infinities, no NaN, max 28
``FP6_E2M3``     6     2     3    OCP MX v1.0 FP6: no infinities, no NaN, max 7.5
``FP4_E2M1``     4     2     1    OCP MX v1.0 FP4: no infinities, no NaN, max 6
``E8M0``         8     8     0    OCP MX v1.0 scale: unsigned powers of two 2⁻¹²⁷…2¹²⁷, NaN = 0xFF
=============  ====  ====  =====  ======================================================================

Functions work on Python floats, NumPy arrays (float16/32/64 and the ml_dtypes types) and torch tensors
(any floating dtype, on the tensor's own device; no per-element Python):

* :func:`round_to` rounds values to a format and returns them in the input's type;
* :func:`encode` / :func:`decode` convert between values and integer bit patterns (codes);
* :func:`decompose` / :func:`compose` split a value into sign, biased exponent and mantissa and back;
* :func:`values` lists every finite value of a small format; :func:`ulp` gives the unit in the last place.

Rounding (IEEE 754-2019 §4.3): ``"nearest_even"`` (roundTiesToEven, the default), ``"toward_zero"``
(roundTowardZero) and ``"stochastic"`` (round up with probability equal to the discarded fraction of an ulp:
uniform random bits are added below the format's last mantissa bit and the sum truncated, on the integer
encoding, so the result is always one of the two neighbours and E[round_to(x)] = x exactly, subnormals and
overflow included).
Overflow without ``saturate`` follows the format, as ml_dtypes' casts do: infinity where the format has one,
NaN where it has NaN but no infinity (E4M3, E8M0), ±max where it has neither (FP6, FP4).  With
``saturate=True`` finite and infinite values beyond ±max become ±max (OCP OFP8 §5, saturating conversion).
Python ints and Fractions are rounded exactly, once, with integer arithmetic (never through float64 first).

Speed: every rounding is exact, and each call takes the fastest exact path for its input.  A native cast
where it is exactly the requested rounding (round-to-nearest-even of float32 values: torch's conversions to
float16, bfloat16 and float8_e5m2 for tensors, with a clamp for ``saturate``; ml_dtypes' bfloat16 for NumPy
arrays), checked bit for bit against the bit path on a probe the first time it is used; for float32 CPU tensors
rounded to nearest-even in a format no cast serves (E4M3, FP6, FP4, TF32), one pass of a C kernel compiled once per
machine (:mod:`mpt_lab._native`), checked likewise; otherwise bit manipulation on the float32/float64 encoding, in cache-sized blocks of NumPy ufuncs for arrays and CPU tensors
and in torch ops on other devices.  On 10⁷ values, one CPU thread, round_to takes about the time of the cast it
reproduces, and stochastic rounding at most about three times that (``benchmarks/round_to_speed.py``, whose
table is ``book/results/round_to_speed_cpu.json``).  ``MPT_LAB_FAST_ROUND=0`` turns native casts off.

Inside a :class:`mpt_lab.simulate.simulate` block, which rounds the results of torch ops, the functions here
still compute exactly: they run under :func:`exact_arithmetic`, a marker that such modes honour.  This
module imports without torch (NumPy and Python numbers only then).
"""

from __future__ import annotations

import contextlib
import contextvars
import ctypes
import functools
import math
import numbers
import os
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from ._native import NativeUnavailable, native_library

try:  # torch is a hard dependency of the package, but formats must not need it to import
    import torch
except ImportError:  # pragma: no cover
    torch = None

try:
    import ml_dtypes as _ml_dtypes
except ImportError:  # pragma: no cover
    _ml_dtypes = None

__all__ = [
    "FloatFormat",
    "Decomposition",
    "FORMATS",
    "ROUNDING_MODES",
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
    "get_format",
    "decompose",
    "compose",
    "encode",
    "decode",
    "round_to",
    "values",
    "ulp",
    "round_fixed",
    "accumulate",
    "FormatLike",
    "exact_arithmetic",
    "exact_arithmetic_active",
    "round_tensor",
    "floor_log2",
    "ML_FLOAT_DTYPES",
]

ROUNDING_MODES = ("nearest_even", "toward_zero", "stochastic")
_NAN_STYLES = ("ieee", "single", "none")
KINDS = ("zero", "subnormal", "normal", "infinity", "nan")


# ----------------------------------------------------------------------------------------------------------
# The format
# ----------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class FloatFormat:
    """A binary floating-point format.

    Parameters
    ----------
    name : str
        Short name, e.g. ``"FP16"``.
    exponent_bits, mantissa_bits : int
        Widths in bits of the biased exponent field and of the mantissa (trailing significand) field.
    bias : int
        Exponent bias: a normal number with exponent field ``E`` has unbiased exponent ``E - bias``.
    signed : bool
        Whether there is a sign bit (False only for E8M0).
    infinities : bool
        Whether the all-ones exponent with a zero mantissa encodes ±infinity (IEEE 754).
    nan : {"ieee", "single", "none"}
        ``"ieee"``: all-ones exponent with a non-zero mantissa is NaN (IEEE 754 §3.4);
        ``"single"``: only the all-ones code (per sign) is NaN and the rest of the top binade is finite
        (OCP E4M3FN, E8M0); ``"none"``: every code is a finite number (OCP FP6, FP4).
    subnormals : bool
        Whether exponent field 0 encodes zero and subnormals (IEEE 754 §3.4).  E8M0 has neither: its
        field 0 is the normal value 2⁻¹²⁷ and it has no zero.
    source : str
        Where the format is defined.

    Derived properties (all exact powers of two or sums of them, as Python floats): :attr:`bits`,
    :attr:`emax`, :attr:`emin`, :attr:`max`, :attr:`smallest_normal`, :attr:`smallest_subnormal`,
    :attr:`epsilon`, :attr:`precision`, :attr:`decimal_digits`.

    Raises
    ------
    TypeError, ValueError
        For non-integer or out-of-range widths, or an unknown ``nan`` style.
    """

    name: str
    exponent_bits: int
    mantissa_bits: int
    bias: int
    signed: bool = True
    infinities: bool = True
    nan: str = "ieee"
    subnormals: bool = True
    source: str = field(default="", compare=False)

    def __post_init__(self):
        for arg in ("exponent_bits", "mantissa_bits", "bias"):
            v = getattr(self, arg)
            if not isinstance(v, numbers.Integral) or isinstance(v, bool):
                raise TypeError(f"{arg} must be an int, got {type(v).__name__}")
        if not 1 <= self.exponent_bits <= 11:
            raise ValueError(f"exponent_bits must be between 1 and 11, got {self.exponent_bits}")
        if not 0 <= self.mantissa_bits <= 52:
            raise ValueError(f"mantissa_bits must be between 0 and 52, got {self.mantissa_bits}")
        if self.nan not in _NAN_STYLES:
            raise ValueError(f"nan must be one of {_NAN_STYLES}, got {self.nan!r}")
        if self.infinities and self.nan != "ieee":
            raise ValueError("a format with infinities must use nan='ieee' (IEEE 754 §3.4)")
        if self.nan == "ieee" and self.mantissa_bits == 0:
            raise ValueError("nan='ieee' needs at least one mantissa bit to tell NaN from infinity")

    # --- sizes ------------------------------------------------------------------------------------------
    @property
    def bits(self) -> int:
        """Total width in bits (sign + exponent + mantissa)."""
        return int(self.signed) + self.exponent_bits + self.mantissa_bits

    @property
    def precision(self) -> int:
        """Significand precision p in bits, counting the implicit leading bit (IEEE 754 §3.3)."""
        return self.mantissa_bits + 1

    @property
    def decimal_digits(self) -> float:
        """Decimal digits of precision, p·log10(2)."""
        return self.precision * math.log10(2.0)

    # --- exponent range ---------------------------------------------------------------------------------
    @property
    def _max_exponent_field(self) -> int:
        top = (1 << self.exponent_bits) - 1
        if self.nan == "ieee" or (self.nan == "single" and self.mantissa_bits == 0):
            return top - 1
        return top

    @property
    def max_mantissa_field(self) -> int:
        """Mantissa field of the largest finite value (all ones, or one less where the all-ones code is NaN:
        E4M3); :mod:`mpt_lab.histogram` uses it to find where the top binade overflows."""
        top_m = (1 << self.mantissa_bits) - 1
        if self.nan == "single" and self.mantissa_bits > 0:
            return top_m - 1  # the all-ones code is NaN
        return top_m

    @property
    def emax(self) -> int:
        """Largest unbiased exponent of a finite value."""
        return self._max_exponent_field - self.bias

    @property
    def emin(self) -> int:
        """Unbiased exponent of the smallest normal value: 1 − bias (−bias without subnormals)."""
        return 1 - self.bias if self.subnormals else -self.bias

    @property
    def max(self) -> float:
        """Largest finite value."""
        return math.ldexp((1 << self.mantissa_bits) + self.max_mantissa_field, self.emax - self.mantissa_bits)

    @property
    def smallest_normal(self) -> float:
        """Smallest positive normal value, 2^emin."""
        return math.ldexp(1.0, self.emin)

    @property
    def smallest_subnormal(self) -> float:
        """Smallest positive value, 2^(emin − m); equals :attr:`smallest_normal` without subnormals."""
        if not self.subnormals or self.mantissa_bits == 0:
            return self.smallest_normal
        return math.ldexp(1.0, self.emin - self.mantissa_bits)

    @property
    def epsilon(self) -> float:
        """Machine epsilon: the gap between 1 and the next larger value, 2^−m."""
        return math.ldexp(1.0, -self.mantissa_bits)

    @property
    def has_zero(self) -> bool:
        """Whether the format has a zero (every format with subnormals; E8M0, a scale format, has none)."""
        return self.subnormals

    def __str__(self) -> str:
        return self.name

    def __repr__(self) -> str:
        return (
            f"FloatFormat({self.name!r}, exponent_bits={self.exponent_bits}, mantissa_bits={self.mantissa_bits}, "
            f"bias={self.bias}, max={self.max!r})"
        )

    def summary(self) -> dict:
        """The format's parameters as a dict (one row of the book's format table)."""
        return {
            "format": self.name,
            "bits": self.bits,
            "sign": int(self.signed),
            "exponent": self.exponent_bits,
            "mantissa": self.mantissa_bits,
            "bias": self.bias,
            "emin": self.emin,
            "emax": self.emax,
            "max": self.max,
            "smallest normal": self.smallest_normal,
            "smallest subnormal": self.smallest_subnormal if (self.subnormals and self.mantissa_bits) else None,
            "epsilon": self.epsilon,
            "decimal digits": round(self.decimal_digits, 2),
            "infinities": self.infinities,
            "NaN": self.nan,
        }


#: What every function that takes a format accepts: a :class:`FloatFormat` or its name in :data:`FORMATS`
#: (case-insensitive; :func:`get_format` resolves it).
FormatLike = FloatFormat | str


FP64 = FloatFormat("FP64", 11, 52, 1023, source="IEEE 754-2019 binary64")
FP32 = FloatFormat("FP32", 8, 23, 127, source="IEEE 754-2019 binary32")
TF32 = FloatFormat("TF32", 8, 10, 127, source="NVIDIA TensorFloat-32 (A100 whitepaper, 2020)")
FP16 = FloatFormat("FP16", 5, 10, 15, source="IEEE 754-2019 binary16")
BF16 = FloatFormat("BF16", 8, 7, 127, source="bfloat16 (Google Brain); Kalamkar et al. 2019")
FP8_E4M3 = FloatFormat("FP8_E4M3", 4, 3, 7, infinities=False, nan="single", source="OCP OFP8 2023, E4M3 (E4M3FN)")
FP8_E5M2 = FloatFormat("FP8_E5M2", 5, 2, 15, source="OCP OFP8 2023, E5M2")
FP6_E3M2 = FloatFormat("FP6_E3M2", 3, 2, 3, infinities=False, nan="none", source="OCP MX v1.0, FP6 E3M2")
FP6_E2M3 = FloatFormat("FP6_E2M3", 2, 3, 1, infinities=False, nan="none", source="OCP MX v1.0, FP6 E2M3")
FP4_E2M1 = FloatFormat("FP4_E2M1", 2, 1, 1, infinities=False, nan="none", source="OCP MX v1.0, FP4 E2M1")
E8M0 = FloatFormat(
    "E8M0",
    8,
    0,
    127,
    signed=False,
    infinities=False,
    nan="single",
    subnormals=False,
    source="OCP MX v1.0, E8M0 shared scale",
)

FORMATS: dict[str, FloatFormat] = {
    f.name: f for f in (FP64, FP32, TF32, FP16, BF16, FP8_E4M3, FP8_E5M2, FP6_E3M2, FP6_E2M3, FP4_E2M1, E8M0)
}

_ALIASES = {
    "FLOAT64": "FP64",
    "DOUBLE": "FP64",
    "FLOAT32": "FP32",
    "FLOAT": "FP32",
    "FLOAT16": "FP16",
    "HALF": "FP16",
    "BFLOAT16": "BF16",
    "E4M3": "FP8_E4M3",
    "E4M3FN": "FP8_E4M3",
    "FP8_E4M3FN": "FP8_E4M3",
    "E5M2": "FP8_E5M2",
    "E3M2": "FP6_E3M2",
    "E2M3": "FP6_E2M3",
    "E2M1": "FP4_E2M1",
    "FP4": "FP4_E2M1",
    "FP8_E8M0": "E8M0",
}


def get_format(fmt: Any, argname: str = "fmt") -> FloatFormat:
    """Return the :class:`FloatFormat` for ``fmt`` (a FloatFormat or a name such as ``"fp16"``, ``"e4m3"``).

    Raises ``TypeError`` for other types and ``ValueError`` naming the known formats for unknown names.
    """
    if isinstance(fmt, FloatFormat):
        return fmt
    if isinstance(fmt, str):
        key = fmt.strip().upper().replace("-", "_")
        key = _ALIASES.get(key, key)
        if key in FORMATS:
            return FORMATS[key]
        raise ValueError(f"{argname}: unknown format {fmt!r}; expected one of {sorted(FORMATS)}")
    raise TypeError(f"{argname} must be a FloatFormat or a format name, got {type(fmt).__name__}")


def _check_rounding(rounding: Any) -> str:
    if not isinstance(rounding, str):
        raise TypeError(f"rounding must be a str, one of {ROUNDING_MODES}; got {type(rounding).__name__}")
    if rounding not in ROUNDING_MODES:
        raise ValueError(f"rounding must be one of {ROUNDING_MODES}, got {rounding!r}")
    return rounding


# ----------------------------------------------------------------------------------------------------------
# Input handling: Python floats, NumPy arrays and scalars, torch tensors
# ----------------------------------------------------------------------------------------------------------
def _is_tensor(x) -> bool:
    return torch is not None and isinstance(x, torch.Tensor)


# ----------------------------------------------------------------------------------------------------------
# Exact arithmetic: a marker that modes emulating low precision honour
# ----------------------------------------------------------------------------------------------------------
_EXACT_DEPTH: contextvars.ContextVar[int] = contextvars.ContextVar("mpt_lab_exact_arithmetic", default=0)


class _ExactBlock:
    """One ``with exact_arithmetic():`` block (a new one per block, so blocks nest and threads do not mix)."""

    __slots__ = ("_token",)

    def __enter__(self) -> None:
        self._token = _EXACT_DEPTH.set(_EXACT_DEPTH.get() + 1)

    def __exit__(self, *exc) -> None:
        _EXACT_DEPTH.reset(self._token)


def exact_arithmetic(fn: Callable | None = None) -> Callable | contextlib.AbstractContextManager:
    """Mark code that must run its torch ops exactly as written; modes that emulate low precision honour it.

    The rounding of this module is exact integer and float arithmetic on bit patterns; inside a block of
    :class:`mpt_lab.simulate.simulate`, which rounds the result of every op to FP16 (say), its own intermediate
    results would be rounded too and the answer would be wrong.  While the marker is set, ``simulate`` passes
    every op straight through (no rounding, no bookkeeping).  The marker is a pure-Python
    :class:`contextvars.ContextVar` depth counter: it costs about a microsecond, needs no torch, and
    belongs to the current thread (and asyncio task).  Other dispatch modes (a memory tracker, a fake-tensor
    mode) are not affected and still see the ops.

    Use it as a decorator (``@exact_arithmetic``) or as a context manager (``with exact_arithmetic():``);
    blocks nest.  :func:`exact_arithmetic_active` tells whether it is set.  :func:`round_to`, :func:`encode`,
    :func:`decode`, :func:`decompose`, :func:`compose`, :func:`ulp`, :func:`round_fixed` and
    :meth:`mpt_lab.histogram.Log2Histogram.add_` are marked.

    Parameters
    ----------
    fn : callable, optional
        The function to mark.  Without it, a context manager is returned.

    Raises
    ------
    TypeError
        ``fn`` is given and is not callable.
    """
    if fn is None:
        return _ExactBlock()
    if not callable(fn):
        raise TypeError(
            f"fn must be callable (exact_arithmetic is a decorator or, without fn, a context manager), "
            f"got {type(fn).__name__}"
        )

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        with _ExactBlock():
            return fn(*args, **kwargs)

    return wrapper


def exact_arithmetic_active() -> bool:
    """Whether the current thread (or task) runs inside :func:`exact_arithmetic`."""
    return _EXACT_DEPTH.get() > 0


def _ml_float_dtypes() -> tuple:
    if _ml_dtypes is None:
        return ()
    names = (
        "bfloat16",
        "float8_e4m3fn",
        "float8_e5m2",
        "float8_e4m3fnuz",
        "float8_e5m2fnuz",
        "float8_e4m3b11fnuz",
        "float8_e4m3",
        "float8_e3m4",
        "float8_e8m0fnu",
        "float6_e2m3fn",
        "float6_e3m2fn",
        "float4_e2m1fn",
    )
    return tuple(np.dtype(getattr(_ml_dtypes, n)) for n in names if hasattr(_ml_dtypes, n))


#: NumPy dtypes of ml_dtypes' narrow floats (bfloat16, the float8, float6 and float4 types; empty without
#: ml_dtypes): arrays of these hold exact binary floats, as :mod:`mpt_lab.scaling` must know when it reads one.
ML_FLOAT_DTYPES = _ml_float_dtypes()


class _Input:
    """The input of a public function, normalised to a float32/float64 array or tensor for computing.

    ``work`` is float32 (or float64 for float64 input); ``restore(result)`` puts a result of the same
    shape back into the caller's type: a Python float, a NumPy scalar/array of the input dtype, or a tensor.
    """

    def __init__(self, x, argname: str = "x"):
        self.kind = None
        self.exact = None  # a Python int or Fraction, kept for the functions that round it exactly
        if _is_tensor(x):
            if not (x.is_floating_point()):
                raise TypeError(f"{argname} must be a floating-point tensor, got dtype {x.dtype}")
            _check_has_values(x, argname)
            self.kind, self.dtype = "torch", x.dtype
            x = x.detach()
            self.work = x if x.dtype in (torch.float32, torch.float64) else x.to(torch.float32)
            self.work = self.work.contiguous()
        elif isinstance(x, np.ndarray) or isinstance(x, np.generic):
            dt = x.dtype
            if dt in (np.float32, np.float64):
                work_dt = dt
            elif dt == np.float16 or dt in ML_FLOAT_DTYPES:
                work_dt = np.dtype(np.float32)
            else:
                raise TypeError(f"{argname} must have a floating dtype (float16/32/64 or an ml_dtypes float), got {dt}")
            self.kind = "numpy" if isinstance(x, np.ndarray) else "npscalar"
            self.dtype = dt
            self.shape = np.shape(x)
            # 1-D working copy: NumPy turns 0-d results into scalars, which in-place ops cannot write to
            self.work = np.ascontiguousarray(x, dtype=work_dt).reshape(-1)
        elif isinstance(x, numbers.Rational) and not isinstance(x, bool):
            # int or Fraction: float(x) would round (to nearest) before the function rounds again, and fails
            # beyond float64's range; keep x, and work on its round-to-odd float64 (same binade, same sign)
            self.kind, self.dtype, self.shape = "float", None, ()
            self.exact = x
            self.work = np.asarray([_rational_to_float(x, 52, -1022, "odd", None)], dtype=np.float64)
            if np.isinf(self.work[0]):  # beyond float64: the largest finite float64 stands for it
                self.work[0] = -_MAX_OF[64] if x < 0 else _MAX_OF[64]
        elif isinstance(x, numbers.Real) and not isinstance(x, bool):
            self.kind, self.dtype, self.shape = "float", None, ()
            self.work = np.asarray([float(x)], dtype=np.float64)
        else:
            raise TypeError(
                f"{argname} must be a float, a NumPy float array or a torch floating tensor, got {type(x).__name__}"
            )

    @property
    def is_torch(self) -> bool:
        return self.kind == "torch"

    def restore(self, y):
        """Cast a float result back to the input's type (exact whenever the value fits that dtype)."""
        if self.kind == "torch":
            return y if y.dtype == self.dtype else y.to(self.dtype)
        if y.dtype == self.dtype or self.kind == "float":
            return self.reshape(y)
        with np.errstate(over="ignore"):  # a value of fmt beyond x's dtype (65504 → BF16 65536 in float16) is inf
            return self.reshape(y.astype(self.dtype))

    def reshape(self, y):
        """Give a NumPy result computed on the 1-D working copy the input's shape (and scalar type)."""
        if self.kind == "float":
            return y.reshape(-1)[0].item()
        if self.kind == "npscalar":
            return y.reshape(-1)[0]
        return y.reshape(self.shape)


def _check_has_values(t, argname: str) -> None:
    """Refuse tensors without data (device "meta": a shape and a dtype only) before anything reads them."""
    if t.device.type == "meta":
        raise ValueError(
            f"{argname} is a meta tensor (a shape and dtype without values); "
            "pass a tensor on a real device (cpu, cuda, ...)"
        )


def floor_log2(num: int, den: int) -> int:
    """⌊log2(num / den)⌋ of positive ints, exactly (integer arithmetic only): the binade of a rational.

    :mod:`mpt_lab.scaling` uses it for the largest power-of-two loss scale.  No argument checks (callers pass
    positive Python ints)."""
    e = num.bit_length() - den.bit_length()  # 2^(e-1) < num/den < 2^(e+1)
    if (num << max(-e, 0)) < (den << max(e, 0)):
        e -= 1
    return e


def _round_ratio(num: int, den: int, rounding: str, generator) -> int:
    """num / den (num ≥ 0, den > 0) rounded to an integer: "nearest_even", "toward_zero", "stochastic"
    (up with probability equal to the fraction, from one uniform float of ``generator``) or "odd" (truncate,
    then set the last bit if anything was discarded: round-to-odd, Boldo & Melquiond 2008)."""
    q, rem = divmod(num, den)
    if rem:
        if rounding == "nearest_even":
            q += 2 * rem > den or (2 * rem == den and q & 1)
        elif rounding == "odd":
            q |= 1
        elif rounding == "stochastic":
            u_num, u_den = float(generator.random()).as_integer_ratio()  # u = u_num / u_den exactly
            q += u_num * den < rem * u_den
    return q


def _rational_to_float(x, mantissa_bits: int, emin: int, rounding: str, generator) -> float:
    """The int or Fraction ``x`` rounded exactly to ``mantissa_bits`` fraction bits with exponent ≥ emin
    (below: a fixed quantum 2^(emin − mantissa_bits), as subnormals), as a float64; ±inf beyond float64."""
    num, den = x.numerator, x.denominator
    mag = abs(num)
    if mag == 0:
        return 0.0
    shift = max(floor_log2(mag, den), emin) - mantissa_bits  # the quantum is 2^shift
    q = _round_ratio(mag << max(-shift, 0), den << max(shift, 0), rounding, generator)
    try:
        v = math.ldexp(float(q), shift)  # exact: q ≤ 2^(mantissa_bits + 1) ≤ 2^53
    except OverflowError:
        v = math.inf
    return -v if num < 0 else v


def _rational_work(x, fmt: FloatFormat, rounding: str, generator) -> np.ndarray:
    """A float64 working value that :func:`_round_work` maps to the correct rounding of the int or Fraction x.

    x is first rounded exactly (integer arithmetic, once) to fmt's precision with an unbounded exponent
    range: the result is a value of fmt, or lies beyond ±max, which _round_work then treats as overflow
    (infinity, NaN or ±max, saturation, toward-zero's ±max) exactly as for a float input.
    """
    v = _rational_to_float(x, fmt.mantissa_bits, fmt.emin, rounding, generator)
    if v == 0 and x != 0 and not fmt.subnormals:
        v = (-0.5 if x < 0 else 0.5) * fmt.smallest_normal  # below every value of a format without zero (E8M0)
    elif math.isinf(v):  # beyond float64, hence beyond fmt: a finite stand-in beyond max, where there is one
        big = _MAX_OF[64] if fmt.max < _MAX_OF[64] else (fmt.max if rounding == "toward_zero" else math.inf)
        v = -big if x < 0 else big
    return np.asarray([v], dtype=np.float64)


# ---- working types: IEEE binary32 and binary64 arrays (NumPy) or tensors (torch) ----
_MANT_OF = {32: 23, 64: 52}
_BIAS_OF = {32: 127, 64: 1023}
_MAX_OF = {32: float(np.finfo(np.float32).max), 64: float(np.finfo(np.float64).max)}
_NP_INT = {32: np.dtype(np.int32), 64: np.dtype(np.int64)}
_NP_FLOAT = {32: np.dtype(np.float32), 64: np.dtype(np.float64)}
_INT64_MIN = -(1 << 63)


def _nbits(a) -> int:
    return a.element_size() * 8 if _is_tensor(a) else a.dtype.itemsize * 8


def _put_(a, mask, value):
    """a[mask] = value, in place."""
    if _is_tensor(a):
        a.masked_fill_(mask, value)
    else:
        np.copyto(a, a.dtype.type(value), where=mask)
    return a


def _any(mask) -> bool:
    return bool(mask.any())


def _isnan(a):
    return torch.isnan(a) if _is_tensor(a) else np.isnan(a)


def _has_nan(xf) -> bool:
    """Whether a float array or tensor holds a NaN (one NaN-propagating max, not a boolean array)."""
    if _is_tensor(xf):
        return xf.numel() > 0 and bool(torch.isnan(xf.max()))
    with np.errstate(invalid="ignore"):
        return xf.size > 0 and bool(np.isnan(xf.max()))


def _make_generator(generator, tensor_like):
    if _is_tensor(tensor_like):
        if generator is None:
            return None  # torch's default generator
        if isinstance(generator, numbers.Integral) and not isinstance(generator, bool):
            g = torch.Generator(device=tensor_like.device)
            g.manual_seed(int(generator))
            return g
        if isinstance(generator, torch.Generator):
            return generator
        raise TypeError(
            f"generator must be None, an int seed or a torch.Generator for tensor input, got {type(generator).__name__}"
        )
    if generator is None or (isinstance(generator, numbers.Integral) and not isinstance(generator, bool)):
        return np.random.default_rng(generator)
    if isinstance(generator, np.random.Generator):
        return generator
    raise TypeError(
        "generator must be None, an int seed or a numpy.random.Generator for NumPy input, "
        f"got {type(generator).__name__}"
    )


# ----------------------------------------------------------------------------------------------------------
# Rounding: which path
# ----------------------------------------------------------------------------------------------------------
# round_to, encode and mpt_lab.simulate all round through _round_work, which takes one of these exact paths:
#
# * "identity": every value of the working type is a value of fmt (FP32 or FP64 from float32);
# * "wide": fmt does not fit the float32 working type's algorithms: work in float64;
# * native cast (``_round_native``): float32 input, nearest-even, where a library's conversion is exactly that
#   rounding and the faster path (``_NATIVE_CASTS``, ``_NATIVE_ON_CPU``): torch's to float16 / bfloat16 /
#   float8_e5m2 and back for tensors (float8_e4m3fn with saturation, off the CPU), ml_dtypes' bfloat16 for
#   NumPy arrays; each is checked bit for bit against the bit path on a probe the first time it is considered;
# * the bit path (``_round_bits``) otherwise: integer and exactly rounded float operations on the IEEE
#   encoding, written once against a small backend (NumPy ufuncs for arrays and for the memory of CPU
#   tensors, in cache-sized blocks; torch ops on other devices), with a kernel per rounding for "add"
#   formats (per-element exponent: FP16, FP8, FP6, FP4, E8M0, and every format from float64) and one for
#   "int" formats (the working type's exponent field: BF16 and TF32 from float32).
def _contains(fmt: FloatFormat, nbits: int) -> bool:
    """Whether every value of the IEEE binary{nbits} working type is a value of fmt (no rounding needed)."""
    m_in, b_in = _MANT_OF[nbits], _BIAS_OF[nbits]
    return (
        fmt.mantissa_bits >= m_in
        and fmt.subnormals
        and fmt.infinities
        and fmt.signed
        and fmt.emin - fmt.mantissa_bits <= 1 - b_in - m_in
        and fmt.emax >= b_in
    )


@functools.cache
def _path(fmt: FloatFormat, nbits: int) -> str:
    """Which exact algorithm rounds a binary{nbits} working array to fmt: identity, 'add', 'int' or 'wide'."""
    if _contains(fmt, nbits):
        return "identity"
    m_in, b_in = _MANT_OF[nbits], _BIAS_OF[nbits]
    ebits_in = 8 if nbits == 32 else 11
    m = fmt.mantissa_bits
    if m >= m_in:
        return "wide"
    emin_b, emax_b = fmt.emin + b_in, fmt.emax + b_in
    if emin_b - m >= 1 and emax_b + 1 + (m_in - m) <= (1 << ebits_in) - 2:
        return "add"
    if fmt.exponent_bits == ebits_in and fmt.bias == b_in and fmt.subnormals and fmt.signed and fmt.infinities:
        return "int"
    return "wide"


class _Plan:
    """Constants of the bit path for one format, working type (32 or 64 bits), rounding and saturation.

    Integer constants are the signed values of the working type's bit patterns (int32/int64, as both
    backends compute), e.g. ``SIGN = -2**31``.
    """

    def __init__(self, fmt: FloatFormat, nbits: int, rounding: str, saturate: bool):
        m_in, b_in, m = _MANT_OF[nbits], _BIAS_OF[nbits], fmt.mantissa_bits
        half = 1 << (nbits - 1)
        emin_b, emax_b = fmt.emin + b_in, fmt.emax + b_in
        self.fmt, self.nbits, self.m_in, self.rounding = fmt, nbits, m_in, rounding
        self.kind = _path(fmt, nbits)
        self.k0 = m_in - m  # mantissa bits dropped in fmt's normal range
        self.ABS, self.SIGN = half - 1, -half
        self.INF = ((1 << (nbits - 1 - m_in)) - 1) << m_in  # +inf, and the exponent field's mask
        self.max = fmt.max
        # |x| above max (bits) is the only way to overflow: the overflow step is skipped in blocks without it
        self.max_bits = int(np.array(min(fmt.max, _MAX_OF[nbits]), _NP_FLOAT[nbits]).view(_NP_INT[nbits]))
        # "add", nearest-even: C = 2^(e + k0) from x's exponent field clamped to fmt's [emin, emax + 1]
        self.c_lo, self.c_hi, self.c_off = emin_b << m_in, (emax_b + 1) << m_in, self.k0 << m_in
        # "add", stochastic / toward zero: kc − E bits (at least k0) are dropped where the biased exponent field
        # is E.  A block holding some 0 < |x| < s (fmt's smallest subnormal, exponent field emin_b − m; ``deep``
        # on the wrapped magnitude bits of _kernel_add_truncate) takes the fixed-point form, which drops up to
        # kmax bits; beyond (exponent fields below kc − kmax, ``ultra``) sig's top bits meet the random ones
        self.kc = emin_b + self.k0
        self.kmax = nbits - 2
        self.deep = self.SIGN + ((emin_b - m) << m_in) - 1 if self.kind == "add" else None
        self.ultra = self.SIGN + ((self.kc - self.kmax) << m_in) - 1 if self.kc - self.kmax >= 1 else self.SIGN
        self.smallest = fmt.smallest_subnormal if fmt.subnormals else fmt.smallest_normal
        # "int": drop k0 low bits of the pattern
        self.low, self.half_low = (1 << self.k0) - 1, (1 << (self.k0 - 1)) - 1
        self.lane_bits = 16 if (self.kind == "int" and self.k0 <= 16) else nbits
        # overflow: what a result beyond ±max becomes
        big_exp = 1 << (nbits - 1 - m_in - 1)  # 128 or 1024: 2^big_exp overflows the working type
        if saturate or fmt.nan == "none":
            self.overflow = "clip"  # ±max
        elif self.kind == "int":
            # a carry into the all-ones exponent field is the working type's infinity, which fmt has; toward
            # zero never goes beyond max
            self.overflow = None
        elif rounding == "toward_zero":
            self.overflow = "clip"  # finite overflow gives ±max (IEEE 754 §7.4); infinities are put back after
        elif fmt.infinities and 0 <= fmt.emax:
            self.overflow, self.scale = "inf", math.ldexp(1.0, big_exp - fmt.emax - 1)
        elif not fmt.infinities and fmt.emax - m >= 1:
            # results beyond max are ≥ top = max + 2^(emax − m): (|y| − max)⁺ · 2^j is 0 or inf; inf − inf NaN
            self.overflow, self.scale = "nan", math.ldexp(1.0, big_exp - (fmt.emax - m))
        else:
            self.overflow = "mask"
        self.fill = math.inf if fmt.infinities else math.nan if fmt.nan != "none" else fmt.max
        self.top = fmt.max + math.ldexp(1.0, fmt.emax - m)  # the first value beyond max on fmt's grid
        self.restore_inf = (
            self.overflow == "clip" and rounding == "toward_zero" and not saturate and self.fill != fmt.max
        )


@functools.cache
def _plan(fmt: FloatFormat, nbits: int, rounding: str, saturate: bool) -> _Plan:
    return _Plan(fmt, nbits, rounding, saturate)


# ----------------------------------------------------------------------------------------------------------
# The bit path: backends
# ----------------------------------------------------------------------------------------------------------
try:  # the ufunc behind np.clip, without np.clip's per-call checks (≈ 20 µs, and slower on int arrays)
    from numpy._core.umath import clip as _np_clip
except ImportError:  # pragma: no cover - another NumPy layout
    _np_clip = np.clip


class _Ops:
    """What the bit path's two backends share."""

    @staticmethod
    def amin(a) -> int:
        return int(a.min())

    @staticmethod
    def amax(a) -> int:
        return int(a.max())

    @classmethod
    def tofloat(cls, a, out):
        """out = float(a), exactly, for integers 0 ≤ a ≤ 2^m_in (a is overwritten): the float whose pattern
        is that of 2^m_in plus a, minus 2^m_in."""
        nbits = _nbits(out)
        m_in = _MANT_OF[nbits]
        cls.add(a, (_BIAS_OF[nbits] + m_in) << m_in, out=a)
        return cls.sub(cls.floats(a), float(1 << m_in), out=out)


class _NumpyOps(_Ops):
    """The bit path's operations on NumPy arrays; CPU tensors lend it their memory (``Tensor.numpy()``)."""

    band, shr, shl = np.bitwise_and, np.right_shift, np.left_shift
    add, sub, mul, copysign, absolute = np.add, np.subtract, np.multiply, np.copysign, np.absolute

    @staticmethod
    def rsub(c, a, out):
        return np.subtract(c, a, out=out)

    @staticmethod
    def ushr(lanes, s, out):
        """Logical right shift of random lanes (unsigned views) by s (an int array of the lanes' width)."""
        return np.right_shift(lanes, s.view(lanes.dtype), out=out)

    @staticmethod
    def uadd(u, lanes, out):
        """u + lanes (unsigned lane values below 2^(nbits−1), or uint16)."""
        return np.add(u, lanes if lanes.dtype.itemsize == 2 else lanes.view(u.dtype), out=out)

    @staticmethod
    def clip(a, lo, hi, out):
        return _np_clip(a, lo, hi, out=out)

    @staticmethod
    def ints(a):
        return a.view(_NP_INT[a.dtype.itemsize * 8])

    @staticmethod
    def floats(a):
        return a.view(_NP_FLOAT[a.dtype.itemsize * 8])

    @staticmethod
    def empty(n, nbits, like):
        return np.empty(n, _NP_INT[nbits])

    @staticmethod
    def host(a) -> np.ndarray:
        return a

    @staticmethod
    def put(a, idx, values) -> None:
        a[idx] = values

    @staticmethod
    def take(a, idx) -> np.ndarray:
        return a[idx]

    @staticmethod
    def nonzero(mask) -> np.ndarray:
        return np.flatnonzero(mask)


class _TorchOps(_Ops):
    """The same operations with torch ops, for tensors on other devices (CUDA): one block, no chunks.  The
    elementwise ones are torch's functions themselves (set below, when torch is there)."""

    @staticmethod
    def rsub(c, a, out):
        torch.neg(a, out=out)
        return out.add_(c)

    @staticmethod
    def ushr(lanes, s, out):
        torch.bitwise_right_shift(lanes, s, out=out)  # arithmetic: clear the copies of the sign bit
        keep = torch.bitwise_left_shift(torch.ones_like(s), lanes.element_size() * 8 - s).sub_(1)
        return out.bitwise_and_(keep)

    @staticmethod
    def uadd(u, lanes, out):
        if lanes.dtype == torch.int16:  # the unsigned value of a 16-bit lane
            lanes = lanes.to(u.dtype).bitwise_and_(0xFFFF)
        return torch.add(u, lanes, out=out)

    @staticmethod
    def ints(a):
        return a.view(torch.int32 if a.element_size() == 4 else torch.int64)

    @staticmethod
    def floats(a):
        return a.view(torch.float32 if a.element_size() == 4 else torch.float64)

    @staticmethod
    def empty(n, nbits, like):
        return torch.empty(n, dtype=torch.int32 if nbits == 32 else torch.int64, device=like.device)

    @staticmethod
    def host(a) -> np.ndarray:
        return a.cpu().numpy()

    @staticmethod
    def put(a, idx, values) -> None:
        a[torch.as_tensor(idx, device=a.device)] = torch.as_tensor(values, dtype=a.dtype, device=a.device)

    @staticmethod
    def take(a, idx) -> np.ndarray:
        return a[torch.as_tensor(idx, device=a.device)].cpu().numpy()

    @staticmethod
    def nonzero(mask) -> np.ndarray:
        return torch.nonzero(mask).reshape(-1).cpu().numpy()


if torch is not None:
    for _name, _fn in (
        ("band", torch.bitwise_and),
        ("shr", torch.bitwise_right_shift),
        ("shl", torch.bitwise_left_shift),
        ("add", torch.add),
        ("sub", torch.sub),
        ("mul", torch.mul),
        ("copysign", torch.copysign),
        ("absolute", torch.abs),
        ("clip", torch.clamp),
    ):
        setattr(_TorchOps, _name, staticmethod(_fn))


_CHUNK = 1 << 16  # values per block on the CPU: the block's scratch arrays stay in the core's cache


def _numpy_backend(t) -> bool:
    """Whether the bit path may run on a tensor's memory with NumPy: a plain, dense CPU tensor."""
    return type(t) is torch.Tensor and t.device.type == "cpu" and t.layout == torch.strided


class _RandomBits:
    """Uniform random bits for stochastic rounding, block by block, from the caller's generator.

    A ``numpy.random.Generator`` gives 64-bit words with ``integers`` (full range); a ``torch.Generator`` (or
    torch's default one, ``None``) with ``Tensor.random_`` (full 64-bit range) on the tensor's device.  Each
    value has a lane of the words (32 bits for float32, 64 for float64, 16 for BF16/TF32 from float32), drawn
    in order, a whole number of words per block: a result depends only on the input and the generator's
    state, not on the block size or the backend.  (Values far below the format's range draw further words,
    with probability ≈ 2^-30 each, after their block's lanes.)
    """

    def __init__(self, gen, xf, host: bool):
        self.gen, self.torch = gen, _is_tensor(xf)
        self.device, self.host = (xf.device if self.torch else None), host
        self._buf = None

    def words(self, w: int):
        """w uniform int64 words (NumPy for the NumPy backend, else a tensor on the device)."""
        if not self.torch:
            return self.gen.integers(_INT64_MIN, -_INT64_MIN - 1, size=w, dtype=np.int64, endpoint=True)
        if self._buf is None or self._buf.numel() < w:
            self._buf = torch.empty(w, dtype=torch.int64, device=self.device)
        t = self._buf[:w].random_(_INT64_MIN, None, generator=self.gen)
        return t.numpy() if self.host else t

    def lanes(self, n: int, bits: int):
        """n uniform random lanes of ``bits`` bits (16, 32 or 64): a uint16/32/64 view for the NumPy backend,
        the int16/32/64 view holding the same bits for torch (which has few unsigned ops)."""
        w = self.words(-(-n * bits // 64))
        if _is_tensor(w):
            return w.view({16: torch.int16, 32: torch.int32, 64: torch.int64}[bits])[:n]
        return w.view({16: np.uint16, 32: np.uint32, 64: np.uint64}[bits])[:n]

    def bits63(self, n: int) -> np.ndarray:
        """n uniform integers in [0, 2^63) on the host (for the few values below a format's range)."""
        w = self.words(n)
        w = w.cpu().numpy() if _is_tensor(w) else w
        return w & ((1 << 63) - 1)


# ----------------------------------------------------------------------------------------------------------
# The bit path: kernels (one block; x and y are float arrays of the working type, S holds scratch arrays)
# ----------------------------------------------------------------------------------------------------------
def _kernel_add_nearest(B, P: _Plan, x, y, S, rand) -> None:
    """Round to nearest even: |x| + C − C with C = 2^(e + k0), e = x's exponent clamped to fmt's range.

    |x| + C lies in C's binade, whose spacing 2^(e − m) is fmt's spacing at |x|: the hardware's exactly
    rounded addition rounds |x| to fmt, and subtracting C is exact (Sterbenz).  Below emin the clamp makes the
    spacing fmt's subnormal quantum, so subnormals and underflow come out right; NaN and inf pass through.
    """
    u, a, c = B.ints(x), S.A, S.C
    B.band(u, P.ABS, out=a)
    B.band(u, P.INF, out=c)
    B.clip(c, P.c_lo, P.c_hi, out=c)
    B.add(c, P.c_off, out=c)
    over = B.amax(a) > P.max_bits
    cf = B.floats(c)
    B.add(B.floats(a), cf, out=y)
    B.sub(y, cf, out=y)
    if over:
        _overflow(B, P, y, B.floats(a), signed=False)
    B.copysign(y, x, out=y)


def _kernel_add_truncate(B, P: _Plan, x, y, S, rand) -> None:
    """Stochastic rounding (``rand`` given) or rounding toward zero (``rand`` None) on the integer encoding.

    Per element, k = the bits of x's significand below fmt's last mantissa bit at x's place: k0 in fmt's
    normal range, more for its subnormals and below.  Stochastic: add k uniform random bits (the top k of
    the value's random lane), then clear the low k bits; the carry out of them happens with probability
    (discarded part) / spacing, so the result is the upper neighbour with exactly that probability, else the
    lower one, and a carry out of the mantissa moves to the next binade.  Toward zero: clear the low k bits.

    Two forms give the same bits: on the IEEE pattern itself while every nonzero |x| of the block is at
    least fmt's smallest subnormal s (k ≤ m_in, the exponent field is untouched); else on the integer
    significand sig (|x| = sig · 2^unit), the result rebuilt as a float from its count of quanta, which also
    handles 0 < |x| < s: up to kmax = nbits − 2 bits directly, beyond that sig's top bits meet the lane's
    kmax random bits and the rare ties are finished apart (:func:`_finish_ties`), as are NaNs
    (:func:`_finish_special`).
    """
    u, r, a, k = B.ints(x), B.ints(y), S.A, S.K
    B.band(u, P.ABS, out=a)
    B.shr(a, P.m_in, out=k)  # biased exponent field E
    hi = B.amax(a)
    special, over = hi >= P.INF, hi > P.max_bits  # inf or NaN; |x| > max
    B.add(a, P.ABS, out=a)  # wraps: 0 → ABS, a ≥ 1 → SIGN + a − 1, so one min finds the smallest nonzero |x|
    lo = B.amin(a)
    rb = rand.lanes(k.shape[0], P.nbits) if rand is not None else None
    if lo >= P.deep:  # the pattern form
        B.rsub(P.kc, k, out=k)
        B.clip(k, P.k0, P.m_in, out=k)
        if rb is not None:
            B.rsub(P.nbits, k, out=a)
            B.ushr(rb, a, out=rb)  # the lane's top k bits: uniform on [0, 2^k)
            B.uadd(u, rb, out=r)
            B.shr(r, k, out=r)
        else:
            B.shr(u, k, out=r)
        B.shl(r, k, out=r)
    else:  # the fixed-point form
        e, sig, d = S.C, S.D, S.F
        B.clip(k, 1, P.ABS, out=e)  # E' = max(E, 1): |x| = sig · 2^(E' − bias − m_in)
        B.shl(e, P.m_in, out=sig)
        B.sub(a, sig, out=sig)
        B.add(sig, (1 << P.m_in) - P.ABS, out=sig)  # a − (E' − 1) · 2^m_in, from the wrapped a
        B.rsub(P.kc, e, out=k)  # the bits dropped: kc − E'
        ultra = lo < P.ultra  # more than kmax: sig's top bits only meet the random lane's kmax
        if ultra:
            B.sub(k, P.kmax, out=d)
            B.clip(d, 0, P.nbits - 1, out=d)
            B.shr(sig, d, out=sig)
        B.clip(k, P.k0, P.kmax, out=k)
        if rb is not None:
            B.rsub(P.nbits, k, out=a)
            B.ushr(rb, a, out=rb)
            B.uadd(sig, rb, out=sig)
            # (sig >> d) + R = 2^kmax − 1: whether sig's dropped low bits carry decides (probability 2^-kmax)
            ties = B.nonzero(sig == (1 << P.kmax) - 1) if ultra else None
        B.shr(sig, k, out=sig)  # the count of quanta 2^(k + d + unit)
        if ultra:
            B.add(k, d, out=k)
        B.add(k, e, out=e)
        B.shl(e, P.m_in, out=e)
        B.sub(e, P.m_in << P.m_in, out=e)  # the quantum as a float: exponent field k + d + E' − m_in ≥ 1
        B.tofloat(sig, out=y)
        B.mul(y, B.floats(e), out=y)
        B.copysign(y, x, out=y)
        if rb is not None and ultra and ties.size:
            _finish_ties(B, P, x, y, ties, rand)
    if over:
        _overflow(B, P, y, B.floats(a), signed=True)
    if special:
        _finish_special(B, P, x, y)


def _kernel_int(B, P: _Plan, x, y, S, rand) -> None:
    """Formats with the working type's exponent field (BF16, TF32 from float32): drop k0 low bits of the
    pattern, rounding to nearest even (add 2^(k0−1) − 1 plus the last kept bit), stochastically (add k0
    random bits) or toward zero; a carry out of the mantissa increments the exponent, up to infinity."""
    u, r = B.ints(x), B.ints(y)
    if P.rounding == "nearest_even":
        c = S.C
        B.shr(u, P.k0, out=c)
        B.band(c, 1, out=c)
        B.add(u, c, out=r)
        B.add(r, P.half_low, out=r)
    elif P.rounding == "stochastic":
        rb = rand.lanes(u.shape[0], P.lane_bits)
        if P.k0 < P.lane_bits:
            B.band(rb, P.low, out=rb)
        B.uadd(u, rb, out=r)
    if P.rounding == "toward_zero":
        B.band(u, ~P.low, out=r)
    else:
        B.band(r, ~P.low, out=r)
    if P.overflow == "clip":
        B.clip(y, -P.max, P.max, out=y)
    if _has_nan(x):
        _finish_special(B, P, x, y)


def _overflow(B, P: _Plan, y, tmp, signed: bool) -> None:
    """Results beyond ±max (they are ≥ fmt's ``top``, or ±inf) become the format's overflow value."""
    if P.overflow == "clip":
        B.clip(y, -P.max if signed else 0.0, P.max, out=y)
    elif P.overflow == "inf":  # y · 2^s overflows to inf exactly when |y| ≥ 2^(emax+1); finite y scale exactly
        B.mul(y, P.scale, out=y)
        B.mul(y, 1.0 / P.scale, out=y)
    elif P.overflow == "nan":
        src = y
        if signed:
            B.absolute(y, out=tmp)
            src = tmp
        B.sub(src, P.max, out=tmp)
        B.clip(tmp, 0.0, math.inf, out=tmp)
        B.mul(tmp, P.scale, out=tmp)  # 0, or inf where |y| > max
        B.sub(tmp, tmp, out=tmp)  # 0, or NaN
        B.sub(y, tmp, out=y)  # y − 0 keeps the sign of zero
    elif P.overflow == "mask":
        h = B.host(y)
        with np.errstate(invalid="ignore"):
            idx = np.flatnonzero(np.abs(h) >= P.top)
        if idx.size:
            B.put(y, idx, np.copysign(P.fill, h[idx]))


def _finish_special(B, P: _Plan, x, y) -> None:
    """NaN stays NaN; toward zero, ±inf becomes the format's overflow value (inf, or NaN for E4M3/E8M0)."""
    hx = B.host(x)
    with np.errstate(invalid="ignore"):
        idx = np.flatnonzero(np.isnan(hx) | (np.isinf(hx) if P.restore_inf else False))
    if idx.size:
        v = hx[idx]
        B.put(y, idx, np.where(np.isnan(v), v, np.copysign(P.fill, v)))


def _finish_ties(B, P: _Plan, x, y, idx, rand) -> None:
    """Stochastic rounding where 0 < |x| < s (fmt's smallest subnormal) needs more than kmax random bits and
    the top ones tied: the values at ``idx`` (a superset) get ±s with probability |x|/s exactly.

    |x| = sig · 2^unit, |x| / s = sig / 2^j with j = kmax + d.  The block added the value's kmax random bits
    R to sig >> d; with R + (sig >> d) = 2^kmax − 1 the result is s exactly when the d low bits of sig plus d
    further random bits carry, with probability (sig mod 2^d) / 2^d (:func:`_bernoulli_dyadic`).
    """
    v = B.take(x, idx)
    a = v.view(_NP_INT[P.nbits]).astype(np.int64) & P.ABS
    e = a >> P.m_in
    sig = np.where(e > 0, (a & ((1 << P.m_in) - 1)) | (1 << P.m_in), a)
    d = int(math.log2(P.smallest)) - (np.maximum(e, 1) - _BIAS_OF[P.nbits] - P.m_in) - P.kmax
    tie = np.flatnonzero((d > 0) & (a > 0) & (a < P.INF))
    if tie.size:
        low = sig[tie] & ((1 << np.minimum(d[tie], 62)) - 1)
        up = tie[_bernoulli_dyadic(low, d[tie], rand)]
        B.put(y, idx[up], np.copysign(P.smallest, v[up]))


def _bernoulli_dyadic(num: np.ndarray, k: np.ndarray, rand: _RandomBits) -> np.ndarray:
    """Booleans that are True with probability exactly num / 2^k (int64 arrays, 0 ≤ num < 2^k, k ≥ 1).

    True when R' < num for R' uniform on [0, 2^k), R' being the complement of drawn bits (all-zero draws
    give False, all-one draws True, as truncation and rounding away from zero).  The first 63-bit word gives
    R''s low min(k, 63) bits; for k > 63 (num < 2^53 < 2^63) R' < num also needs R''s other k − 63 bits to be
    zero, checked with further words only for the values still in the running (probability ≤ 2^-10 each).
    """
    ones = (1 << 63) - 1
    first = np.minimum(k, 63)
    up = ((ones - rand.bits63(num.size)) >> (63 - first)) < num
    rest = k - first
    pending = np.flatnonzero(up & (rest > 0))
    while pending.size:
        t = np.minimum(rest[pending], 63)
        up[pending] = ((ones - rand.bits63(pending.size)) >> (63 - t)) == 0
        rest[pending] -= t
        pending = pending[up[pending] & (rest[pending] > 0)]
    return up


_KERNELS = {
    ("add", "nearest_even"): _kernel_add_nearest,
    ("add", "stochastic"): _kernel_add_truncate,
    ("add", "toward_zero"): _kernel_add_truncate,
}


class _Scratch:
    __slots__ = ("A", "C", "D", "F", "K", "X")


def _round_bits(xf, fmt: FloatFormat, rounding: str, saturate: bool, gen, out=None):
    """The bit path: xf (a contiguous float32/float64 array or tensor) rounded to fmt ("add" or "int" path),
    written to ``out`` (a new array or tensor if None; may be xf itself)."""
    nbits = _nbits(xf)
    P = _plan(fmt, nbits, rounding, saturate)
    kernel = _kernel_int if P.kind == "int" else _KERNELS[("add", rounding)]
    tensor = _is_tensor(xf)
    if out is None:
        out = torch.empty_like(xf) if tensor else np.empty_like(xf)
    if tensor and not _numpy_backend(xf):
        B, xa, oa = _TorchOps, xf.reshape(-1), out.reshape(-1)
        size = max(xa.numel(), 1)
        inplace = xf.data_ptr() == out.data_ptr()
    else:
        B = _NumpyOps
        xa = (xf.numpy() if tensor else xf).reshape(-1)
        oa = (out.numpy() if tensor else out).reshape(-1)
        size, inplace = _CHUNK, np.may_share_memory(xa, oa)
    n = xa.shape[0]
    rand = _RandomBits(gen, xf, host=B is _NumpyOps) if rounding == "stochastic" else None
    S = _Scratch()
    m = min(size, n)
    S.A, S.C, S.D, S.F, S.K = (B.empty(m, nbits, xa) for _ in range(5))
    S.X = B.floats(B.empty(m, nbits, xa)) if inplace else None
    with np.errstate(all="ignore"):  # NaN, inf and overflow are part of the arithmetic
        for i in range(0, n, size):
            j = min(i + size, n)
            xb, yb, c = xa[i:j], oa[i:j], j - i
            if inplace:
                xb = S.X[:c]
                xb[...] = oa[i:j]
            kernel(B, P, xb, yb, S if c == m else _slice_scratch(S, c), rand)
    return out


def _slice_scratch(S: _Scratch, c: int) -> _Scratch:
    t = _Scratch()
    t.A, t.C, t.D, t.F, t.K, t.X = S.A[:c], S.C[:c], S.D[:c], S.F[:c], S.K[:c], None
    return t


# ----------------------------------------------------------------------------------------------------------
# Native casts: exactly the requested rounding, checked once against the bit path
# ----------------------------------------------------------------------------------------------------------
#: The dtypes whose conversion from float32 is round-to-nearest-even to the format, per input library
#: (NumPy arrays: ml_dtypes' types).  torch's float8_e4m3fn conversion saturates, so it serves E4M3 only
#: with ``saturate=True``; float64 inputs never take a cast (torch and ml_dtypes convert float64 to the
#: narrow types through float32, rounding twice).
_NATIVE_CASTS = {
    "torch": {FP16: "float16", BF16: "bfloat16", FP8_E5M2: "float8_e5m2", FP8_E4M3: "float8_e4m3fn"},
    "numpy": {BF16: "bfloat16"},
}
#: Where a cast is faster than the bit path on a CPU (measured with benchmarks/round_to_speed.py): torch's
#: conversions from float8 back to float32 are slow there, and NumPy's float16 conversion and ml_dtypes'
#: float8/6/4 ones are slower than the bit path.  On other devices (CUDA) every exact cast is taken.
_NATIVE_ON_CPU = {"torch": frozenset({FP16, BF16, FP8_E5M2}), "numpy": frozenset({BF16})}
_native_checked: dict = {}


def _native_enabled() -> bool:
    """``MPT_LAB_FAST_ROUND=0`` (or false/no/off) in the environment turns native casts off (read when a
    cast is first considered for a library, device, dtype, format and saturation)."""
    return os.environ.get("MPT_LAB_FAST_ROUND", "1").strip().lower() not in ("0", "false", "no", "off")


def _native_dtype(xf, fmt: FloatFormat, rounding: str, saturate: bool):
    """The dtype whose conversion (and a clamp to ±max with ``saturate``) is exactly round-to-nearest-even
    of the float32 array or tensor ``xf`` to fmt, and is the faster path here; None otherwise.  Decided once
    per library, device, dtype, format and saturation (the first time with a check on a probe)."""
    if rounding != "nearest_even":
        return None
    tensor = _is_tensor(xf)
    key = (tensor, xf.dtype, xf.device.type if tensor else "cpu", fmt, saturate)
    try:
        return _native_checked[key]
    except KeyError:
        pass
    lib = "torch" if tensor else "numpy"
    name, dt = _NATIVE_CASTS[lib].get(fmt), None
    if (
        name is not None
        and not (fmt == FP8_E4M3 and not saturate)
        and _native_enabled()
        and (key[2] != "cpu" or fmt in _NATIVE_ON_CPU[lib])
    ):
        if tensor and xf.dtype == torch.float32 and hasattr(torch, name):
            dt = getattr(torch, name)
        elif not tensor and xf.dtype == np.float32 and _ml_dtypes is not None:
            dt = np.dtype(getattr(_ml_dtypes, name))
        if dt is not None and not _check_native(lib, xf.device if tensor else None, fmt, saturate):
            dt = None
    _native_checked[key] = dt
    return dt


def _round_native(xf, fmt: FloatFormat, dtype, saturate: bool, out=None):
    """Round with the conversion to ``dtype`` and back to xf's dtype (into ``out`` if given)."""
    if _is_tensor(xf):
        y = xf.to(dtype).to(xf.dtype) if out is None else out.copy_(xf.to(dtype))
        if saturate and fmt != FP8_E4M3:
            y.clamp_(-fmt.max, fmt.max)
        return y
    with np.errstate(over="ignore", invalid="ignore"):
        y = xf.astype(dtype).astype(xf.dtype) if out is None else _assign(out, xf.astype(dtype))
    if saturate:
        _np_clip(y, -fmt.max, fmt.max, out=y)
    return y


def _probe() -> np.ndarray:
    """Float32 values that exercise every path: random bit patterns, wide magnitudes, every tie (and its
    neighbours) near the extremes of each castable format, subnormals, overflow, ±0, ±inf, NaN."""
    rng = np.random.default_rng(1234)
    with np.errstate(over="ignore"):  # 2^127 · normal values, 2 · max of FP16 in float32: inf, on purpose
        parts = [
            rng.integers(0, 1 << 32, 1 << 14, dtype=np.uint64).astype(np.uint32).view(np.float32),
            (rng.standard_normal(1 << 14) * np.exp2(rng.integers(-150, 128, 1 << 14))).astype(np.float32),
        ]
        for fmt in _NATIVE_CASTS["torch"]:  # exact midpoints between neighbouring values, and either side
            m = fmt.mantissa_bits
            k = np.arange(-(1 << (m + 1)), 1 << (m + 1), dtype=np.float64)
            for e in (fmt.emin - m, fmt.emin, 0, fmt.emax - 1, fmt.emax):
                mid = ((k + 0.5) * 2.0 ** (e - m) if e > fmt.emin - m else (k + 0.5) * 2.0**e).astype(np.float32)
                parts += [mid, np.nextafter(mid, np.float32(0)), np.nextafter(mid, np.float32(np.inf))]
            parts.append(np.array([fmt.max, -fmt.max, fmt.max * (1 + 2.0 ** -(m + 1)), 2 * fmt.max], np.float32))
    parts.append(np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 3.4e38, -3.4e38, 1e-45], np.float32))
    return np.concatenate(parts)


def _same_bits(a, b) -> bool:
    """Bit-identical float32 arrays or tensors, except that any NaN matches any NaN (payloads and NaN signs
    are not part of any contract)."""
    if _is_tensor(a):
        a, b = a.cpu().numpy(), b.cpu().numpy()
    return bool(((a.view(np.uint32) == b.view(np.uint32)) | (np.isnan(a) & np.isnan(b))).all())


def _check_native(lib: str, device, fmt: FloatFormat, saturate: bool) -> bool:
    """Whether the library's conversion equals the bit path on :func:`_probe`, out of place and in place
    (warns and returns False if not)."""
    name = _NATIVE_CASTS[lib][fmt]
    try:
        p = _probe()
        if lib == "torch":
            p, dt = torch.from_numpy(p).to(device), getattr(torch, name)
        else:
            dt = np.dtype(getattr(_ml_dtypes, name))
        want = _round_bits(p, fmt, "nearest_even", saturate, None)
        inplace = p.clone() if lib == "torch" else p.copy()
        if not (
            _same_bits(_round_native(p, fmt, dt, saturate), want)
            and _same_bits(_round_native(inplace, fmt, dt, saturate, out=inplace), want)
        ):
            raise RuntimeError("the conversion disagrees with the bit path")
        return True
    except Exception as err:  # a build without the dtype, a conversion that differs, ...
        where = f"{lib} on {device}" if device is not None else lib
        warnings.warn(
            f"the {name} conversion ({where}) is not used for {fmt.name} rounding "
            f"({type(err).__name__}: {err}); the bit path is used instead",
            RuntimeWarning,
            stacklevel=4,
        )
        return False


# ----------------------------------------------------------------------------------------------------------
# The C kernel: round-to-nearest-even of float32 CPU tensors where no native cast serves
# ----------------------------------------------------------------------------------------------------------
#: Round-to-nearest-even of float32 values to a format with ``m`` mantissa bits (m ≤ 22), smallest normal
#: exponent ``emin`` (≥ −126) and largest finite value ``maxv`` (a float32), in one pass (compiled by
#: :mod:`mpt_lab._native`).  A magnitude at or above 2^emin keeps its float32 exponent: the 23 − m low bits of its
#: pattern are rounded off, ties to even, a carry moving it into the next binade (or past the largest
#: pattern: overflow).  Below 2^emin the format's spacing is 2^(emin − m) whatever the binade: the magnitude
#: plus c = 2^(emin − m + 23), whose ulp that spacing is, rounds there in float32's own round-to-nearest-even,
#: and minus c again is exact.  A result above ``maxv`` (inf included) overflows as ``overflow`` says (0: ±inf,
#: 1: NaN, 2: ±maxv); NaN stays NaN; the sign is kept.  Checked against the bit path before use
#: (:func:`_c_round_ok`).
_C_ROUND_SOURCE = r"""
#include <stdint.h>
#include <string.h>
void mpt_lab_round_nearest(const uint32_t *restrict x, uint32_t *restrict y, int64_t n, int m, int emin,
                           uint32_t maxb, int overflow) {
    const int shift = 23 - m;
    const uint32_t half = (1u << (shift - 1)) - 1u;
    const uint32_t mask = ~((1u << shift) - 1u);
    const uint32_t minnorm = (uint32_t)(emin + 127) << 23;
    const uint32_t cb = (uint32_t)(emin - m + 23 + 127) << 23;
    float c;
    memcpy(&c, &cb, 4);
    const uint32_t over = overflow == 0 ? 0x7F800000u : overflow == 1 ? 0x7FC00000u : maxb;
    for (int64_t i = 0; i < n; i++) {
        uint32_t b = x[i];
        uint32_t a = b & 0x7FFFFFFFu;
        uint32_t rn = (a + half + ((a >> shift) & 1u)) & mask;
        float af, rf;
        memcpy(&af, &a, 4);
        rf = (af + c) - c;
        uint32_t rs;
        memcpy(&rs, &rf, 4);
        uint32_t r = a >= minnorm ? rn : rs;
        r = r > maxb ? over : r;
        r = a > 0x7F800000u ? 0x7FC00000u : r;
        y[i] = r | (b & 0x80000000u);
    }
}

/* the same in `threads` parts at once (OpenMP, on torch's own threads: see mpt_lab._native) */
void mpt_lab_round_nearest_parts(const uint32_t *x, uint32_t *y, int64_t n, int m, int emin, uint32_t maxb,
                                 int overflow, int threads) {
#ifdef _OPENMP
#pragma omp parallel for num_threads(threads) schedule(static, 1)
#endif
    for (int t = 0; t < threads; t++) {
        int64_t a = n * t / threads, b = n * (t + 1) / threads;
        mpt_lab_round_nearest(x + a, y + a, b - a, m, emin, maxb, overflow);
    }
}
"""

_c_round: dict = {}  # "fn": the ctypes function, or None (unavailable)
_c_round_checked: dict = {}  # (fmt, saturate) -> whether the C kernel rounds it (checked once)
#: Values per part when the C rounding kernel splits a tensor over torch's intra-op threads.
_C_ROUND_PART = 1 << 16


def _c_round_fn():
    """The C rounding kernel's function, built once per process, or None (``MPT_LAB_FAST_ROUND=0``, or no C
    compiler: then the bit path, with a RuntimeWarning saying why)."""
    if "fn" not in _c_round:
        fn = None
        if _native_enabled():
            try:
                fn = native_library("mpt_lab_round", _C_ROUND_SOURCE, openmp=True).mpt_lab_round_nearest_parts
                fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_int]
                fn.argtypes += [ctypes.c_uint32, ctypes.c_int, ctypes.c_int]
                fn.restype = None
            except (NativeUnavailable, OSError, AttributeError) as err:
                warnings.warn(
                    f"the C rounding kernel is unavailable ({type(err).__name__}: {err}); float32 CPU tensors are "
                    "rounded by the bit path (the same values, slower)",
                    RuntimeWarning,
                    stacklevel=4,
                )
                fn = None
        _c_round["fn"] = fn
    return _c_round["fn"]


def _c_round_call(xf, fmt: FloatFormat, saturate: bool, out=None):
    """xf (a contiguous float32 CPU tensor) rounded to nearest-even in fmt by the C kernel, into ``out`` (a new
    tensor if None; may be xf itself), split over torch's intra-op threads."""
    fn = _c_round_fn()
    if out is None:
        out = torch.empty_like(xf)
    overflow = 2 if saturate else 0 if fmt.infinities else 1 if fmt.nan != "none" else 2
    maxb = int(np.float32(fmt.max).view(np.uint32))
    n = xf.numel()
    threads = max(1, min(torch.get_num_threads(), n // _C_ROUND_PART))
    fn(xf.data_ptr(), out.data_ptr(), n, fmt.mantissa_bits, fmt.emin, maxb, overflow, threads)
    return out


def _c_round_probe(fmt: FloatFormat) -> np.ndarray:
    """:func:`_probe`'s values and, for fmt, every midpoint between neighbouring values near its extremes and
    either side of each (the ties a native cast's probe covers for its own formats)."""
    m = fmt.mantissa_bits
    k = np.arange(-(1 << (m + 1)), 1 << (m + 1), dtype=np.float64)
    parts = [_probe()]
    with np.errstate(over="ignore"):
        for e in (fmt.emin - m, fmt.emin, 0, fmt.emax - 1, fmt.emax):
            mid = ((k + 0.5) * 2.0 ** (e - m) if e > fmt.emin - m else (k + 0.5) * 2.0**e).astype(np.float32)
            parts += [mid, np.nextafter(mid, np.float32(0)), np.nextafter(mid, np.float32(np.inf))]
        parts.append(np.array([fmt.max, -fmt.max, fmt.max * (1 + 2.0 ** -(m + 1)), 2 * fmt.max], np.float32))
    return np.concatenate(parts)


def _c_round_ok(xf, fmt: FloatFormat, rounding: str, saturate: bool) -> bool:
    """Whether the C kernel rounds xf here (``MPT_LAB_FAST_ROUND=0`` turns it off, as the native casts): a float32
    CPU tensor, round-to-nearest-even, a signed format with
    subnormals, 1 ≤ 23 − m, its exponents within float32's, and the kernel equal to the bit path on
    :func:`_c_round_probe` (out of place and in place; checked once per format and saturation, a difference
    warned about and the bit path kept)."""
    if not (
        rounding == "nearest_even"
        and _native_enabled()
        and _is_tensor(xf)
        and xf.dtype == torch.float32
        and xf.device.type == "cpu"
        and fmt.signed
        and fmt.subnormals
        and fmt.mantissa_bits <= 22
        and -126 <= fmt.emin
        and fmt.emax <= 127
    ):
        return False
    key = (fmt, saturate)
    ok = _c_round_checked.get(key)
    if ok is None:
        ok = False
        if _c_round_fn() is not None:
            with exact_arithmetic():
                p = torch.from_numpy(_c_round_probe(fmt))
                if fmt.nan == "none":
                    p = p[~torch.isnan(p)]
                want = _round_bits(p, fmt, "nearest_even", saturate, None)
                inplace = p.clone()
                ok = _same_bits(_c_round_call(p, fmt, saturate), want) and _same_bits(
                    _c_round_call(inplace, fmt, saturate, out=inplace), want
                )
            if not ok:
                warnings.warn(
                    f"the C rounding kernel disagrees with the bit path for {fmt.name} (saturate={saturate}); "
                    "the bit path is used instead",
                    RuntimeWarning,
                    stacklevel=4,
                )
        _c_round_checked[key] = ok
    return ok


# ----------------------------------------------------------------------------------------------------------
# Rounding: the one entry point
# ----------------------------------------------------------------------------------------------------------
def _round_work(xf, fmt: FloatFormat, rounding: str, saturate: bool, generator, out=None):
    """Round a contiguous float32/float64 array or tensor to fmt; returns a new array of the same dtype (or
    ``out``, an array of xf's shape and dtype, which may be xf itself).  The one implementation behind
    round_to, encode and mpt_lab.simulate: see "Rounding: which path" above."""
    nbits = _nbits(xf)
    path = _path(fmt, nbits)
    tensor = _is_tensor(xf)
    if path == "identity":
        y = (xf.clone() if tensor else xf.copy()) if out is None else _assign(out, xf)
        if saturate and fmt.max <= _MAX_OF[nbits]:
            # Every finite working value is in fmt, so only ±inf lie beyond ±max: saturation must still clamp
            # them.  When fmt.max does not fit the working type (FP64 from float32) the clamped value would
            # be stored as inf anyway.
            y = y.clamp_(-fmt.max, fmt.max) if tensor else np.clip(y, -fmt.max, fmt.max, out=y)
        return y
    if path == "wide":
        if nbits == 64:
            raise ValueError(f"fmt: {fmt.name} is wider than FP64 in some respect and cannot be emulated here")
        with np.errstate(invalid="ignore", over="ignore"):  # signalling NaNs; the result fits back in float32
            wide = xf.to(torch.float64) if tensor else xf.astype(np.float64)
            y = _round_work(wide, fmt, rounding, saturate, generator)
            y = y.to(torch.float32) if tensor else y.astype(np.float32)
        return y if out is None else _assign(out, y)
    if fmt.nan == "none" and _has_nan(xf):
        raise ValueError(
            f"x contains NaN, which {fmt.name} cannot encode (it has no NaN); remove or replace NaNs before rounding"
        )
    dt = _native_dtype(xf, fmt, rounding, saturate)
    if dt is not None:
        return _round_native(xf, fmt, dt, saturate, out)
    if _c_round_ok(xf, fmt, rounding, saturate):
        return _c_round_call(xf, fmt, saturate, out)
    gen = _make_generator(generator, xf) if rounding == "stochastic" else None
    y = _round_bits(xf, fmt, rounding, saturate, gen, out)
    if not (fmt.signed and fmt.subnormals):
        with np.errstate(invalid="ignore"):
            _unsigned_or_no_zero(xf, y, fmt)
    return y


def _assign(out, y):
    if _is_tensor(out):
        return out.copy_(y)
    out[...] = y
    return out


def _unsigned_or_no_zero(xf, y, fmt: FloatFormat) -> None:
    """E8M0 (unsigned, no zero): negative numbers, zeros (both signs) and NaN are invalid: NaN (as ml_dtypes);
    a positive value below the smallest normal 2^emin rounds to it, the nearest value (in place)."""
    if not fmt.subnormals:  # ±0 from the bit path: the nearest values are ±2^emin
        small = (y.abs() if _is_tensor(y) else np.abs(y)) < fmt.smallest_normal
        s = (
            torch.full_like(y, fmt.smallest_normal).copysign_(y)
            if _is_tensor(y)
            else np.copysign(fmt.smallest_normal, y).astype(y.dtype)
        )
        if _is_tensor(y):
            y.copy_(torch.where(small, s, y))
        else:
            np.copyto(y, s, where=small)
    if not fmt.signed:
        bits = (
            xf.view(torch.int32 if xf.dtype == torch.float32 else torch.int64)
            if _is_tensor(xf)
            else xf.view(_NP_INT[_nbits(xf)])
        )
        _put_(y, (bits < 0) | (xf == 0), float("nan"))


@exact_arithmetic
def round_to(
    x: float | np.ndarray | torch.Tensor,
    fmt: FormatLike,
    *,
    rounding: str = "nearest_even",
    saturate: bool = False,
    generator: torch.Generator | None = None,
) -> float | np.ndarray | torch.Tensor:
    """Round ``x`` to the values of ``fmt`` and return them in ``x``'s own type.

    Parameters
    ----------
    x : float, int, fractions.Fraction, numpy.ndarray or numpy scalar (float16/32/64, ml_dtypes floats) or
        torch.Tensor (floating)
        Values of any shape.  Tensors are computed with torch ops on their own device; autograd is not
        tracked (use :mod:`mpt_lab.simulate` for rounding inside a model).  Python ints and Fractions are
        rounded exactly, once (integer arithmetic; no double rounding through float64, and values beyond
        float64's range overflow like any other): ``round_to(2**60 + 2**36 + 1, "FP32") == 2**60 + 2**37``,
        ``round_to(10**400, "FP16")`` is inf.  The result is a Python float for all three.
    fmt : FloatFormat or str
        Target format, e.g. ``FP16`` or ``"e4m3"``.
    rounding : {"nearest_even", "toward_zero", "stochastic"}
        IEEE 754-2019 §4.3 roundTiesToEven, roundTowardZero, or stochastic rounding (rounds up to the next
        value with probability equal to the discarded fraction of the spacing, so ``E[round_to(x)] = x``;
        the result is always one of the two neighbours).
    saturate : bool
        Clamp results beyond ±max (infinities included) to ±max, as OCP OFP8's saturating conversion.
    generator : None, int, numpy.random.Generator or torch.Generator
        Randomness for ``"stochastic"``; an int seeds a new generator.  Ignored otherwise.  NumPy input takes
        None (fresh entropy), an int or a ``numpy.random.Generator``; a tensor takes None (torch's default
        generator), an int or a ``torch.Generator`` of the tensor's device.  The bits come from it in order,
        a 64-bit word for two float32 values (four for BF16 and TF32; one per float64 value), so a result is
        reproducible from the generator's state, and the generator moves on.

    Returns
    -------
    Same type, shape, dtype and device as ``x``.  The values are exactly fmt's values; they are stored in
    x's dtype, which is exact whenever fmt's value fits it (always when fmt is no wider than x's dtype).

    Overflow without ``saturate``: ±inf if fmt has infinities, NaN if it has NaN only (E4M3, E8M0), ±max if
    it has neither (FP6, FP4); ``"toward_zero"`` carries finite overflow to ±max (IEEE 754 §7.4).
    NaN stays NaN.  E8M0 (unsigned, no zero) turns zeros and negative values into NaN and positive values
    below 2⁻¹²⁷ into 2⁻¹²⁷, as ml_dtypes does.

    Raises
    ------
    TypeError
        ``x`` is not a real number, NumPy float array or floating tensor; ``generator`` has the wrong type.
    ValueError
        Unknown ``fmt`` or ``rounding``; ``x`` holds NaN and fmt has no NaN (FP6, FP4); ``x`` is a meta tensor
        (no values to round).
    """
    inp = _Input(x)
    fmt = get_format(fmt)
    rounding = _check_rounding(rounding)
    if not isinstance(saturate, (bool, np.bool_)):
        raise TypeError(f"saturate must be a bool, got {type(saturate).__name__}")
    y = _round_work(_exact_work(inp, fmt, rounding, generator), fmt, rounding, bool(saturate), generator)
    return inp.restore(y)


def round_tensor(
    t: torch.Tensor,
    fmt: FloatFormat,
    rounding: str = "nearest_even",
    saturate: bool = False,
    generator: torch.Generator | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """:func:`round_to` of a floating tensor, without its argument checks, for :mod:`mpt_lab.simulate`'s
    rounding of every op's results: the same paths, with less per-call overhead.  With ``out`` (a tensor of
    t's shape and dtype, e.g. t itself for rounding in place) the result is written there.

    The caller guarantees what :func:`round_to` checks: ``t`` a floating tensor, ``fmt`` a
    :class:`FloatFormat`, ``rounding`` one of :data:`ROUNDING_MODES`, ``saturate`` a bool."""
    if t.dtype in (torch.float32, torch.float64) and t.is_contiguous() and (out is None or out.is_contiguous()):
        y = _round_work(t.detach(), fmt, rounding, saturate, generator, out=None if out is None else out.detach())
        return y if out is None else out
    y = round_to(t, fmt, rounding=rounding, saturate=saturate, generator=generator)
    return y if out is None else out.copy_(y)


def _exact_work(inp: _Input, fmt: FloatFormat, rounding: str, generator):
    """The working array to round: for a Python int or Fraction, its exact pre-rounding to fmt (no double
    rounding through float64, no overflow error beyond it); otherwise ``inp.work`` itself."""
    if inp.exact is None:
        return inp.work
    gen = _make_generator(generator, None) if rounding == "stochastic" else None
    return _rational_work(inp.exact, fmt, rounding, gen)


# ----------------------------------------------------------------------------------------------------------
# Codes: encode / decode
# ----------------------------------------------------------------------------------------------------------
def _code_dtype_numpy(fmt: FloatFormat):
    return np.dtype(
        np.uint8 if fmt.bits <= 8 else np.uint16 if fmt.bits <= 16 else np.uint32 if fmt.bits <= 32 else np.uint64
    )


def _code_dtype_torch(fmt: FloatFormat):
    return torch.uint8 if fmt.bits <= 8 else torch.int32 if fmt.bits <= 31 else torch.int64


def _own_codes(x, inp: _Input, fmt: FloatFormat):
    """The exact bits of FP16/FP32/FP64 values encoded to their own format (NaN payloads kept), else None."""
    if fmt not in (FP16, FP32, FP64):
        return None
    if inp.is_torch:
        tdt, ints = {
            16: (torch.float16, torch.int16),
            32: (torch.float32, torch.int32),
            64: (torch.float64, torch.int64),
        }[fmt.bits]
        if inp.dtype != tdt:
            return None
        c = x.detach().contiguous().view(ints)
        if fmt.bits == 64:
            return c.clone()
        return c.to(_code_dtype_torch(fmt)) & ((1 << fmt.bits) - 1)
    np_dt = {16: np.float16, 32: np.float32, 64: np.float64}[fmt.bits]
    if inp.kind == "float":
        return int(np.float64(x).view(np.uint64)) if fmt.bits == 64 else None
    if inp.dtype != np.dtype(np_dt):
        return None
    c = np.array(x, dtype=np_dt).reshape(-1).view(_code_dtype_numpy(fmt))
    return inp.reshape(c)


def _codes_from_values(v, fmt: FloatFormat, signs=None):
    """Codes of float64 values ``v`` that are already exactly fmt's values (or ±inf / NaN).

    ``signs``: the float array that was rounded to ``v``, whose sign bits the codes take (a rounding keeps
    the sign, and this way a NaN keeps its input's sign whichever path produced it; torch's bfloat16
    conversion, for one, returns a positive NaN).
    """
    tensor = _is_tensor(v)
    if fmt == FP64:
        return v.view(torch.int64).clone() if tensor else v.view(np.uint64).copy()
    e, m = fmt.exponent_bits, fmt.mantissa_bits
    b = v.view(torch.int64) if tensor else v.view(np.int64)
    if signs is None:
        neg = b < 0
    elif tensor:
        neg = signs.view(torch.int32 if signs.dtype == torch.float32 else torch.int64).reshape(v.shape) < 0
    else:
        neg = signs.view(_NP_INT[_nbits(signs)]).reshape(v.shape) < 0
    a = b & ((1 << 63) - 1)
    e64 = a >> 52
    mant = (a & ((1 << 52) - 1)) >> (52 - m)
    ef = e64 - 1023 + fmt.bias
    absv = a.view(torch.float64) if tensor else a.view(np.float64)
    if fmt.subnormals:
        sub = absv < fmt.smallest_normal
        scale = math.ldexp(1.0, m - fmt.emin)
        if tensor:
            sub_m = (absv * scale).to(torch.int64)
            mant = torch.where(sub, sub_m, mant)
            ef = torch.where(sub, torch.zeros_like(ef), ef)
        else:
            with np.errstate(invalid="ignore"):  # NaN and inf lanes are overwritten below
                sub_m = np.nan_to_num(absv * scale, nan=0.0, posinf=0.0).astype(np.int64)
            mant = np.where(sub, sub_m, mant)
            ef = np.where(sub, 0, ef)
    top = (1 << e) - 1
    if fmt.infinities:
        isinf = absv == float("inf")
        _put_(ef, isinf, top)
        _put_(mant, isinf, 0)
    if fmt.nan != "none":
        isnan = absv != absv
        _put_(ef, isnan, top)
        _put_(mant, isnan, (1 << (m - 1)) if fmt.nan == "ieee" else (1 << m) - 1)
    code = (ef << m) | mant
    if fmt.signed:
        code = code | (neg.to(torch.int64) << (e + m) if tensor else neg.astype(np.int64) << (e + m))
    if tensor:
        return code.to(_code_dtype_torch(fmt))
    return code.astype(_code_dtype_numpy(fmt))


@exact_arithmetic
def encode(
    x: float | np.ndarray | torch.Tensor,
    fmt: FormatLike,
    *,
    rounding: str = "nearest_even",
    saturate: bool = False,
    generator: torch.Generator | None = None,
) -> int | np.ndarray | torch.Tensor:
    """Integer codes (bit patterns) of ``x`` rounded to ``fmt``.

    Parameters are those of :func:`round_to`.  A code holds sign | biased exponent | mantissa from the most
    to the least significant of its ``fmt.bits`` low bits.  NaN becomes the format's canonical NaN (quiet
    NaN ``S 1…1 10…0`` for IEEE formats, the all-ones code for E4M3 and E8M0), except that FP16, FP32 and
    FP64 values encoded to their own format keep their exact bits (without ``saturate``, which turns ±inf
    into the codes of ±max).

    Returns
    -------
    int for a Python float; for NumPy, an array of the same shape with dtype uint8 (≤ 8 bits), uint16
    (≤ 16), uint32 (≤ 32, TF32 included) or uint64 (FP64); for torch, a tensor on x's device with dtype uint8
    (≤ 8 bits), int32 (≤ 31 bits) or int64 (FP32; FP64, whose bits are read as a signed int64).

    Raises
    ------
    TypeError, ValueError
        As :func:`round_to`.
    """
    inp = _Input(x)
    fmt = get_format(fmt)
    rounding = _check_rounding(rounding)
    if not isinstance(saturate, (bool, np.bool_)):  # as round_to (encode's contract: "raises as round_to")
        raise TypeError(f"saturate must be a bool, got {type(saturate).__name__}")
    # the exact-bits shortcut cannot saturate ±inf: with saturate, encode what round_to returns instead
    own = None if saturate or inp.exact is not None else _own_codes(x, inp, fmt)
    if own is not None:
        return own
    work = _exact_work(inp, fmt, rounding, generator)
    y = _round_work(work, fmt, rounding, saturate, generator)
    y64 = y.to(torch.float64) if inp.is_torch else y.astype(np.float64)
    codes = _codes_from_values(y64, fmt, signs=work)
    return codes if inp.is_torch else inp.reshape(codes)


def _codes_input(codes, fmt: FloatFormat, argname: str = "codes"):
    """Validate integer codes; returns (int64-or-uint64 array/tensor, kind)."""
    if _is_tensor(codes):
        if codes.is_floating_point() or codes.is_complex() or codes.dtype == torch.bool:
            raise TypeError(f"{argname} must be an integer tensor, got dtype {codes.dtype}")
        _check_has_values(codes, argname)
        c = codes.to(torch.int64)
        if fmt.bits < 64:
            if _any((c < 0) | (c >= (1 << fmt.bits))):
                raise ValueError(f"{argname} must lie in [0, 2**{fmt.bits}) for {fmt.name}")
        return c, "torch", None
    if isinstance(codes, (np.ndarray, np.generic)):
        if codes.dtype.kind not in "ui":
            raise TypeError(f"{argname} must have an integer dtype, got {codes.dtype}")
        kind = "numpy" if isinstance(codes, np.ndarray) else "npscalar"
        arr = np.asarray(codes)
    elif isinstance(codes, numbers.Integral) and not isinstance(codes, bool):
        kind = "int"
        if not 0 <= int(codes) < (1 << fmt.bits):
            raise ValueError(f"{argname} must lie in [0, 2**{fmt.bits}) for {fmt.name}, got {codes}")
        arr = np.asarray(int(codes), dtype=np.uint64)
    else:
        raise TypeError(
            f"{argname} must be an int, an integer NumPy array or an integer tensor, got {type(codes).__name__}"
        )
    if arr.size and (arr.dtype.kind == "i" and arr.min() < 0 or fmt.bits < 64 and int(arr.max()) >= (1 << fmt.bits)):
        raise ValueError(f"{argname} must lie in [0, 2**{fmt.bits}) for {fmt.name}")
    return arr.reshape(-1).astype(np.uint64 if fmt.bits == 64 else np.int64), kind, arr.shape


def _decode_work(c, fmt: FloatFormat):
    """float64 values of validated int64 (uint64 for FP64) codes."""
    tensor = _is_tensor(c)
    if fmt == FP64:
        return c.view(torch.float64) if tensor else c.view(np.float64)
    e, m = fmt.exponent_bits, fmt.mantissa_bits
    ef = (c >> m) & ((1 << e) - 1)
    mf = c & ((1 << m) - 1)
    top = (1 << e) - 1
    if tensor:
        f64 = torch.float64
        sig = (mf + (1 << m)).to(f64)
        val = torch.ldexp(sig, (ef - fmt.bias - m).to(f64))
        if fmt.subnormals:
            sub = torch.ldexp(mf.to(f64), torch.full_like(mf, fmt.emin - m, dtype=f64))
            val = torch.where(ef == 0, sub, val)
    else:
        # np.asarray: for 0-d codes (compose with scalar fields) np.ldexp returns a NumPy scalar, which the
        # in-place _put_ below cannot write to; without subnormals (E8M0) no np.where made it an array again
        val = np.asarray(np.ldexp((mf + (1 << m)).astype(np.float64), (ef - fmt.bias - m).astype(np.int32)))
        if fmt.subnormals:
            val = np.where(ef == 0, np.ldexp(mf.astype(np.float64), fmt.emin - m), val)
    if fmt.nan == "ieee":
        _put_(val, (ef == top) & (mf == 0), float("inf"))
        _put_(val, (ef == top) & (mf != 0), float("nan"))
    elif fmt.nan == "single":
        _put_(val, (ef == top) & (mf == (1 << m) - 1), float("nan"))
    if fmt.signed:
        neg = ((c >> (e + m)) & 1) == 1
        val = torch.where(neg, -val, val) if tensor else np.where(neg, -val, val)
    return val


@exact_arithmetic
def decode(codes: int | ArrayLike | torch.Tensor, fmt: FormatLike) -> float | np.ndarray:
    """Values (float64) of integer codes in ``fmt``.

    Parameters
    ----------
    codes : int, integer NumPy array or integer torch tensor
        Bit patterns in ``[0, 2**fmt.bits)`` (for torch FP32/FP64 codes, the int64 from :func:`encode`).
    fmt : FloatFormat or str

    Returns
    -------
    float for an int; a float64 array (or tensor on the codes' device) of the same shape otherwise.
    Every code decodes exactly: all formats of the catalogue are subsets of FP64.

    Raises
    ------
    TypeError
        Non-integer codes.
    ValueError
        Unknown format; codes outside ``[0, 2**fmt.bits)``.
    """
    fmt = get_format(fmt)
    if _is_tensor(codes) and fmt == FP64:
        _check_has_values(codes, "codes")
        if codes.dtype != torch.int64:
            raise TypeError(f"codes for FP64 must be an int64 tensor (the bits of each value), got {codes.dtype}")
        return codes.view(torch.float64)
    c, kind, shape = _codes_input(codes, fmt)
    val = _decode_work(c, fmt)
    if kind == "int":
        return float(val[0])
    if kind == "npscalar":
        return val[0]
    return val if kind == "torch" else val.reshape(shape)


# ----------------------------------------------------------------------------------------------------------
# decompose / compose
# ----------------------------------------------------------------------------------------------------------
class Decomposition:
    """The fields of values stored in a format (IEEE 754-2019 §3.4), from :func:`decompose`.

    Numeric attributes are ints (scalar input), NumPy arrays, or torch tensors on the input's device:

    ``code``               the bit pattern (see :func:`encode`)
    ``sign``               sign bit, 0 or 1
    ``exponent``           biased exponent field E
    ``mantissa``           mantissa (trailing significand) field, an integer of ``fmt.mantissa_bits`` bits
    ``unbiased_exponent``  e = E − bias for normals, infinities and NaNs (emax + 1 where the top exponent field
                           is reserved: IEEE inf/NaN, E8M0's NaN; emax for E4M3's NaN, which shares that
                           field with finite values); emin for zeros and subnormals
    ``significand``        1.mantissa (normal) or 0.mantissa (zero, subnormal), as float64; inf/NaN for those
    ``value``              the value actually stored, as float64

    String attributes (computed on first use; for tensors this copies the codes to the host):
    ``kind`` ("zero", "subnormal", "normal", "infinity", "nan") and ``bits``, the pattern grouped
    ``"sign exponent mantissa"``, e.g. ``"1 10000111 00111010101000000000000"``.
    """

    def __init__(self, code, fmt: FloatFormat, scalar: bool):
        self.fmt = fmt
        self._scalar = scalar
        tensor = _is_tensor(code)
        shape = None if tensor else np.shape(code)
        c = (
            code.to(torch.int64)
            if tensor
            else np.asarray(code).reshape(-1).astype(np.uint64 if fmt.bits == 64 else np.int64)
        )
        e, m = fmt.exponent_bits, fmt.mantissa_bits
        self.code = code
        self.sign = ((c >> (e + m)) & 1) if fmt.signed else c * 0
        self.exponent = (c >> m) & ((1 << e) - 1)
        self.mantissa = c & ((1 << m) - 1)
        self.value = _decode_work(c, fmt)
        kind = self._kind_codes()
        # unbiased exponent and significand
        if tensor:
            f64 = torch.float64
            ue = torch.where(kind <= 1, torch.full_like(self.exponent, fmt.emin), self.exponent - fmt.bias)
            sig = self.mantissa.to(f64) * fmt.epsilon + (kind >= 2).to(f64)
            sig = torch.where(kind == 3, torch.full_like(sig, float("inf")), sig)
            sig = torch.where(kind == 4, torch.full_like(sig, float("nan")), sig)
        else:
            ue = np.where(kind <= 1, fmt.emin, self.exponent.astype(np.int64) - fmt.bias)
            sig = self.mantissa.astype(np.float64) * fmt.epsilon + (kind >= 2)
            sig = np.where(kind == 3, np.inf, np.where(kind == 4, np.nan, sig))
        self.unbiased_exponent = ue
        self.significand = sig
        self._kind = kind
        if not tensor:
            for name in ("sign", "exponent", "mantissa", "unbiased_exponent", "significand", "value", "_kind"):
                v = getattr(self, name).reshape(shape)
                setattr(self, name, (float(v) if v.dtype.kind == "f" else int(v)) if scalar else v)
            if scalar:
                self.code = int(self.code)

    def _kind_codes(self):
        """0 zero, 1 subnormal, 2 normal, 3 infinity, 4 NaN (integer array/tensor)."""
        fmt, ef, mf = self.fmt, self.exponent, self.mantissa
        top = (1 << fmt.exponent_bits) - 1
        tensor = _is_tensor(ef)
        w = torch.where if tensor else np.where
        k = w(ef == 0, w(mf == 0, 0, 1), 2) if fmt.subnormals else (ef * 0 + 2)
        if fmt.nan == "ieee":
            k = w(ef == top, w(mf == 0, 3, 4), k)
        elif fmt.nan == "single":
            k = w((ef == top) & (mf == (1 << fmt.mantissa_bits) - 1), 4, k)
        return k

    @property
    def kind(self):
        """What each value is: "zero", "subnormal", "normal", "infinity" or "nan" (a str for a scalar, else a
        NumPy array of them)."""
        k = self._kind
        names = np.array(KINDS)
        arr = names[k.cpu().numpy() if _is_tensor(k) else np.asarray(k)]
        return str(arr) if self._scalar else arr

    @property
    def bits(self):
        """The bit pattern as text, fields separated by spaces ("0 10001 1010000000"): a str for a scalar, else a
        NumPy array of them."""
        fmt = self.fmt
        c = self.code.cpu().numpy() if _is_tensor(self.code) else np.asarray(self.code)
        flat = c.reshape(-1).astype(np.uint64)
        e, m = fmt.exponent_bits, fmt.mantissa_bits
        out = []
        for v in flat.tolist():
            s = format(v & ((1 << fmt.bits) - 1), f"0{fmt.bits}b")
            parts = ([s[0]] if fmt.signed else []) + [s[int(fmt.signed) : int(fmt.signed) + e]]
            if m:
                parts.append(s[int(fmt.signed) + e :])
            out.append(" ".join(parts))
        if self._scalar:
            return out[0]
        return np.array(out).reshape(c.shape)

    def as_dict(self) -> dict:
        """All fields as a dict (the scalar case is what the book prints)."""
        return {
            "format": self.fmt.name,
            "value": self.value,
            "bits": self.bits,
            "kind": self.kind,
            "sign": self.sign,
            "exponent": self.exponent,
            "unbiased_exponent": self.unbiased_exponent,
            "mantissa": self.mantissa,
            "significand": self.significand,
            "code": self.code,
        }

    def __repr__(self) -> str:
        if not self._scalar:
            return f"Decomposition({self.fmt.name}, shape={tuple(np.shape(self.value))})"
        d = self.as_dict()
        return (
            f"Decomposition({self.fmt.name}: value={d['value']!r}, bits='{d['bits']}', kind={d['kind']}, "
            f"sign={d['sign']}, exponent={d['exponent']} (e={d['unbiased_exponent']}), "
            f"mantissa={d['mantissa']}, significand={d['significand']!r})"
        )


@exact_arithmetic
def decompose(
    x: float | np.ndarray | torch.Tensor, fmt: FormatLike, *, rounding: str = "nearest_even", saturate: bool = False
) -> Decomposition:
    """Split ``x``, rounded to ``fmt``, into sign, biased exponent and mantissa (IEEE 754-2019 §3.4).

    Parameters
    ----------
    x : float, NumPy float array or torch floating tensor (any shape)
    fmt : FloatFormat or str
    rounding, saturate : as :func:`round_to` (the value is first rounded to fmt)

    Returns
    -------
    Decomposition
        Scalar fields for a Python float or NumPy scalar, arrays (tensors on x's device) otherwise.

    Example (the paper notes' worked example)::

        >>> decompose(-314.625, FP32).bits
        '1 10000111 00111010101000000000000'

    Raises
    ------
    TypeError, ValueError
        As :func:`round_to`.
    """
    fmt = get_format(fmt)
    code = encode(x, fmt, rounding=rounding, saturate=saturate)
    scalar = isinstance(code, (int, np.generic))
    return Decomposition(code, fmt, scalar)


@exact_arithmetic
def compose(
    sign: int | ArrayLike, exponent: int | ArrayLike, mantissa: int | ArrayLike, fmt: FormatLike
) -> float | np.ndarray:
    """The value (float64) with the given sign bit, biased exponent field and mantissa field.

    Parameters
    ----------
    sign : int or integer array, 0 or 1 (must be 0 for unsigned formats)
    exponent : int or integer array in [0, 2**fmt.exponent_bits)
    mantissa : int or integer array in [0, 2**fmt.mantissa_bits)
    fmt : FloatFormat or str

    Returns
    -------
    float, or a float64 array/tensor of the broadcast shape.

    Raises
    ------
    TypeError
        Non-integer fields.
    ValueError
        A field out of range.
    """
    fmt = get_format(fmt)
    parts = {"sign": sign, "exponent": exponent, "mantissa": mantissa}
    limits = {"sign": 2 if fmt.signed else 1, "exponent": 1 << fmt.exponent_bits, "mantissa": 1 << fmt.mantissa_bits}
    tensor = any(_is_tensor(v) for v in parts.values())
    conv = {}
    for name, v in parts.items():
        if _is_tensor(v):
            if v.is_floating_point() or v.dtype == torch.bool:
                raise TypeError(f"{name} must be an integer tensor, got dtype {v.dtype}")
            _check_has_values(v, name)
            t = v.to(torch.int64)
            bad = _any((t < 0) | (t >= limits[name]))
        elif isinstance(v, (np.ndarray, np.generic)) or (isinstance(v, numbers.Integral) and not isinstance(v, bool)):
            t = np.asarray(v)
            if t.dtype.kind not in "ui":
                raise TypeError(f"{name} must be an integer or integer array, got dtype {t.dtype}")
            t = t.astype(np.int64) if fmt.bits < 64 else t.astype(np.uint64)
            bad = t.size and (int(t.min()) < 0 or int(t.max()) >= limits[name])
            if tensor:
                t = torch.as_tensor(t)
        else:
            raise TypeError(f"{name} must be an int or an integer array, got {type(v).__name__}")
        if bad:
            raise ValueError(f"{name} must lie in [0, {limits[name]}) for {fmt.name}")
        conv[name] = t
    e, m = fmt.exponent_bits, fmt.mantissa_bits
    if fmt.bits == 64 and not tensor:
        code = (
            (conv["sign"].astype(np.uint64) << np.uint64(63))
            | (conv["exponent"].astype(np.uint64) << np.uint64(52))
            | conv["mantissa"].astype(np.uint64)
        )
    else:
        code = (conv["sign"] << (e + m)) | (conv["exponent"] << m) | conv["mantissa"]
    val = _decode_work(code, fmt)
    if not tensor and all(not isinstance(v, np.ndarray) for v in parts.values()):
        return float(val)
    return val


# ----------------------------------------------------------------------------------------------------------
# values, ulp
# ----------------------------------------------------------------------------------------------------------
def values(fmt: FormatLike, *, include_negative: bool = True) -> np.ndarray:
    """Every finite value of ``fmt`` in ascending order, as a float64 NumPy array (zero once, as +0).

    Raises ``ValueError`` for formats wider than 19 bits (TF32 is the widest enumerable: 2¹⁹ codes);
    use :func:`ulp` and the format's properties for FP32 and FP64.
    """
    fmt = get_format(fmt)
    if fmt.bits > 19:
        raise ValueError(f"fmt: values() enumerates formats of at most 19 bits; {fmt.name} has {fmt.bits}")
    v = decode(np.arange(1 << fmt.bits, dtype=np.int64), fmt)
    v = v[np.isfinite(v)]
    if not include_negative:
        v = v[v >= 0]
    has_zero = bool((v == 0).any())
    v = np.unique(v[v != 0])
    if has_zero:
        v = np.sort(np.concatenate([v, [0.0]]))
    return v


@exact_arithmetic
def ulp(x: float | np.ndarray | torch.Tensor, fmt: FormatLike) -> float | np.ndarray | torch.Tensor:
    """Unit in the last place of ``x`` in ``fmt``: the spacing 2^(e − m) of fmt's values around |x|.

    ``e`` is the exponent of |x| (⌊log2|x|⌋) clamped to [emin, emax], so ulp(0) is the smallest subnormal
    spacing and values beyond max get the spacing of the top binade (the definition used by Goldberg 1991
    and Muller et al., *Handbook of Floating-Point Arithmetic*, §2.6).  Infinite x gives inf, NaN gives NaN.

    Parameters
    ----------
    x : float, NumPy float array or torch floating tensor
    fmt : FloatFormat or str

    Returns
    -------
    float for a Python float; otherwise a float64 array (tensor on x's device) of x's shape.

    Raises
    ------
    TypeError, ValueError
        As :func:`round_to`.
    """
    inp = _Input(x)
    fmt = get_format(fmt)
    w = inp.work
    m = fmt.mantissa_bits
    if inp.is_torch:
        a = w.to(torch.float64).abs()
        _, ex = torch.frexp(a)
        e = torch.clamp(ex.to(torch.int64) - 1, fmt.emin, fmt.emax)
        e = torch.where(a == 0, torch.full_like(e, fmt.emin), e)
        res = torch.ldexp(torch.ones_like(a), (e - m).to(torch.float64))
        res = torch.where(torch.isinf(a), a, res)
        res = torch.where(torch.isnan(a), a, res)
        return res
    a = np.abs(w.astype(np.float64))
    _, ex = np.frexp(a)
    e = np.clip(ex.astype(np.int64) - 1, fmt.emin, fmt.emax)
    e[a == 0] = fmt.emin
    res = np.ldexp(1.0, (e - m).astype(np.int32))
    res = np.where(np.isfinite(a), res, a)
    return inp.reshape(res)


# ----------------------------------------------------------------------------------------------------------
# Fixed point, and repeated addition (swamping)
# ----------------------------------------------------------------------------------------------------------
@exact_arithmetic
def round_fixed(x: float | ArrayLike, int_bits: int, frac_bits: int) -> float | np.ndarray:
    """Round ``x`` to signed two's-complement fixed point with ``int_bits`` integer and ``frac_bits``
    fraction bits (1 + int_bits + frac_bits bits in all), round-to-nearest-even, saturating.

    The grid is uniform, step 2^−frac_bits, on [−2^int_bits, 2^int_bits − 2^−frac_bits]: the absolute
    error is bounded everywhere, the relative error is not (compare :func:`round_to`).

    Parameters
    ----------
    x : float, NumPy float array or torch floating tensor
    int_bits, frac_bits : int ≥ 0

    Returns
    -------
    Same type as x.

    Raises
    ------
    TypeError
        Wrong type of x or of the bit counts.
    ValueError
        Negative bit counts, more than 52 bits in all (not exact in float64), or NaN in x.
    """
    for name, v in (("int_bits", int_bits), ("frac_bits", frac_bits)):
        if not isinstance(v, numbers.Integral) or isinstance(v, bool):
            raise TypeError(f"{name} must be an int, got {type(v).__name__}")
        if v < 0:
            raise ValueError(f"{name} must be ≥ 0, got {v}")
    if int_bits + frac_bits > 52:
        raise ValueError(f"int_bits + frac_bits must be ≤ 52, got {int_bits + frac_bits}")
    inp = _Input(x)
    if _any(_isnan(inp.work)):
        raise ValueError("x contains NaN, which fixed point cannot represent")
    step = math.ldexp(1.0, -frac_bits)
    lo, hi = -math.ldexp(1.0, int_bits), math.ldexp(1.0, int_bits) - step
    if inp.is_torch:
        w = inp.work.to(torch.float64)
        y = torch.clamp(torch.round(w / step) * step, lo, hi) + 0.0  # round: ties to even; + 0.0: no −0
        return inp.restore(y.to(inp.work.dtype))
    w = inp.work.astype(np.float64)
    with np.errstate(over="ignore", invalid="ignore"):  # huge values saturate below
        y = np.clip(np.rint(w / step) * step, lo, hi) + 0.0  # np.rint: ties to even; + 0.0: fixed point has one zero
    return inp.restore(y.astype(inp.work.dtype))


def accumulate(
    start: float,
    increment: float | ArrayLike,
    steps: int,
    fmt: FormatLike,
    *,
    rounding: str = "nearest_even",
    generator: torch.Generator | None = None,
) -> np.ndarray:
    """Add ``increment`` to ``start`` ``steps`` times, rounding to ``fmt`` after every addition.

    This is a weight receiving the same small update on every step (w ← fmt(w + u)), the situation of the
    paper's §3.1 ("FP32 master copy of weights"): when |u| is below half an ulp of w, every addition rounds
    back to w and the update is lost (swamping).  ``start`` and ``increment`` are first rounded to fmt, as
    stored weights and updates would be; the sum is formed in float64 and rounded once to fmt, which is the
    correctly rounded sum for round-to-nearest-even and every format up to FP32 (double rounding through
    binary64 is innocuous when 53 ≥ 2p + 2; Figueroa 1995).

    Parameters
    ----------
    start, increment : float or NumPy float array (broadcastable; e.g. an array of independent trials)
    steps : int ≥ 0
    fmt : FloatFormat or str
    rounding, generator : as :func:`round_to` (a single generator drives all steps)

    Returns
    -------
    float64 array of shape ``(steps + 1, *broadcast_shape)``: the value after 0, 1, …, steps additions.

    Raises
    ------
    TypeError, ValueError
        Bad argument types, negative ``steps``, unknown format or rounding.
    """
    fmt = get_format(fmt)
    rounding = _check_rounding(rounding)
    if not isinstance(steps, numbers.Integral) or isinstance(steps, bool):
        raise TypeError(f"steps must be an int, got {type(steps).__name__}")
    if steps < 0:
        raise ValueError(f"steps must be ≥ 0, got {steps}")
    for name, v in (("start", start), ("increment", increment)):
        if _is_tensor(v):
            raise TypeError(f"{name} must be a float or a NumPy array, not a tensor")
        _Input(v, name)  # type check
    gen = _make_generator(generator, None) if rounding == "stochastic" else None
    w, u = np.broadcast_arrays(np.asarray(start, dtype=np.float64), np.asarray(increment, dtype=np.float64))
    w = round_to(np.array(w), fmt)
    u = round_to(np.array(u), fmt)
    out = np.empty((steps + 1,) + w.shape)
    out[0] = w
    for k in range(steps):
        w = round_to(w + u, fmt, rounding=rounding, generator=gen)
        out[k + 1] = w
    return out
