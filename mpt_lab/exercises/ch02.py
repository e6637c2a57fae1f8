"""Exercises of chapter 2: where the gradients go."""

from __future__ import annotations

import math

import numpy as np
import torch

from .. import formats as F
from .. import scaling
from ..histogram import log2_histogram
from ._core import Exercise, is_real, register


def _ex21_reference(amax: float, fmt_max: float = 65504.0) -> float:
    """The max-gradient rule (reference solution of exercise 2.1): the largest power of two S with
    amax · S ≤ fmt_max (Micikevicius et al. 2018, §3.2), by :func:`mpt_lab.scaling.max_gradient_scale`.

    ``fmt_max`` is the largest finite value of a format of the catalogue (65504: FP16, 448: E4M3,
    57344: E5M2, …); a limit that is no format's max goes through the same exact rule with the bare limit.
    """
    fmt = next((f for f in F.FORMATS.values() if f.max == fmt_max), None)
    if fmt is not None:
        return scaling.max_gradient_scale(amax, fmt)
    if not (is_real(fmt_max) and 0 < fmt_max < math.inf):
        raise ValueError(f"fmt_max must be a positive finite number, got {fmt_max!r}")
    return scaling.largest_power_of_two_scale(amax, float(fmt_max), "fmt_max")


def _ex21_check(fn):
    if not callable(fn):
        return False, f"expected a function choose_scale(amax, fmt_max=65504.0), got {type(fn).__name__}"
    rng = np.random.default_rng(21)
    amaxes = list(np.exp2(rng.uniform(-40, 15, 300))) + [2.0**-24, 1.0, 65504.0, 65504.0 / 8, 3.0, 2.0**-30 * 1.5]
    for a in amaxes:
        for fmax in (65504.0, 448.0, 57344.0):
            want, got = _ex21_reference(float(a), fmax), fn(float(a), fmax)
            if not is_real(got) or float(got) != want:
                return False, (
                    f"choose_scale({float(a)!r}, {fmax}) returned {got!r}; expected {want!r} "
                    f"(amax × S = {float(a) * want!r} ≤ {fmax}, and 2S would exceed it)."
                )
    for a in amaxes[::50]:  # without fmt_max: FP16's 65504, the default
        want, got = _ex21_reference(float(a)), fn(float(a))
        if not is_real(got) or float(got) != want:
            return False, (
                f"choose_scale({float(a)!r}) returned {got!r}; expected {want!r}: without fmt_max the "
                "limit is FP16's 65504 (the default fmt_max=65504.0)."
            )
    return True, (
        f"the max-gradient rule is right for {3 * len(amaxes) + len(amaxes[::50])} cases (FP16, E4M3 and "
        "E5M2 limits, the default limit, exact powers of two)."
    )


register(
    Exercise(
        "2.1",
        "The max-gradient rule",
        "Write choose_scale(amax, fmt_max=65504.0) -> float: the largest power of two S such that amax × S does "
        "not exceed fmt_max (the largest finite value of the format).",
        _ex21_check,
        "S = 2^k with k = ⌊log2(fmt_max / amax)⌋; beware of floating-point log2 at exact powers of two: check "
        "amax × 2^k ≤ fmt_max and amax × 2^(k+1) > fmt_max (multiplying by a power of two is exact).",
        lambda: _ex21_reference,
        worked="""The rule (Micikevicius et al. 2018, §3.2): the largest power of two S with amax × S ≤ fmt_max, so \
that the largest gradient still fits after scaling.

On paper S = 2^k with k = ⌊log₂(fmt_max / amax)⌋. In floating point that formula can be off by one: the division \
and the logarithm both round, and when fmt_max / amax is an exact power of two (or within a rounding error of \
one) `math.log2` may land just below or above the integer. For example amax = 65504 / 8 must give S = 8 exactly, \
and amax = 3 with fmt_max = 448 must give 128 (3 × 128 = 384 ≤ 448 < 768).

The cure is to use the formula only as a first guess and then check the definition itself, which is exact: \
multiplying by a power of two only changes the exponent, so amax × S and amax × 2S are computed without rounding \
(far from overflow and underflow, as here).

```python
import math

def choose_scale(amax, fmt_max=65504.0):
    s = 2.0 ** math.floor(math.log2(fmt_max / amax))   # a first guess, possibly one binade off
    while amax * s > fmt_max:                         # too large: halve
        s /= 2
    while amax * (2 * s) <= fmt_max:                  # 2S still fits: double
        s *= 2
    return s
```

`mpt_lab.scaling.max_gradient_scale(amax, fmt)` computes the same from the binary exponents of amax and \
fmt_max, without a logarithm.""",
    )
)


def _ex22_reference(exponents, counts, zeros: int, total: int, threshold_log2: int) -> float:
    """Share of all values with |x| < 2^threshold_log2, zeros included (reference solution of exercise 2.2)."""
    exponents, counts = np.asarray(exponents), np.asarray(counts)
    return (int(counts[exponents < threshold_log2].sum()) + zeros) / total


def _ex22_check(fn):
    if not callable(fn):
        return False, "expected a function share_below(exponents, counts, zeros, total, threshold_log2)"
    rng = np.random.default_rng(22)
    for trial in range(5):
        x = rng.standard_normal(5000) * np.exp2(rng.normal(-28, 7, 5000))
        x[rng.random(5000) < 0.5] = 0
        h = log2_histogram(torch.from_numpy(x.astype(np.float32)))
        for t in (-30, -24, -14, 0):
            want = h.fraction_below(2.0**t)
            got = fn(h.exponents.copy(), h.counts.copy(), h.zeros, h.total, t)  # copies: h stays as it is
            if not is_real(got) or not math.isclose(float(got), want, rel_tol=1e-12, abs_tol=1e-15):
                return False, f"for threshold 2^{t} you return {got!r}; the share is {want!r}."
    return True, "your shares match Log2Histogram.fraction_below on 5 histograms and 4 thresholds."


register(
    Exercise(
        "2.2",
        "Reading a log2 histogram",
        "Write share_below(exponents, counts, zeros, total, threshold_log2) -> float: the share of all values "
        "with |x| < 2^threshold_log2, zeros included. Bin k of counts holds 2^k ≤ |x| < 2^(k+1).",
        _ex22_check,
        "A bin lies entirely below 2^t exactly when its k < t; add the zeros and divide by the total.",
        lambda: _ex22_reference,
        worked="""Bin k of a log2 histogram holds the values with 2ᵏ ≤ |x| < 2ᵏ⁺¹. The threshold 2ᵗ is a power of \
two, so it never cuts a bin in two: bin k lies entirely below 2ᵗ when its upper edge 2ᵏ⁺¹ is at most 2ᵗ, i.e. \
when k < t, and entirely at or above 2ᵗ when k ≥ t. (Bin t itself starts at 2ᵗ, which is not below 2ᵗ.)

The zeros have no binade (log₂ 0 = −∞); they are counted apart, and they are below any threshold, so they are \
added. The share is relative to all values, zeros included, so the denominator is the total.

```python
import numpy as np

def share_below(exponents, counts, zeros, total, threshold_log2):
    exponents, counts = np.asarray(exponents), np.asarray(counts)
    return (counts[exponents < threshold_log2].sum() + zeros) / total
```

Two classic mistakes: `exponents <= threshold_log2` (counts bin t, one binade too many) and forgetting the \
zeros, which for activation gradients are most of the values.""",
    )
)
