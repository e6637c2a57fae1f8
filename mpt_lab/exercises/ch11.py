"""Exercises of chapter 11: FP8 and block scaling."""

from __future__ import annotations

import math
import numbers

import torch

from .. import formats as F
from .. import microscaling
from ._core import Exercise, as_list, is_real, register

#: Exercise 11.1's block (8 values, to keep it short; OCP MX blocks hold 32) and the value whose MXFP4 element
#: is asked for.
EX111_BLOCK = (0.75, -3.2, 0.01, 5.5, -0.3, 2.0, 0.0, 1.1)
EX111_VALUE = -3.2
#: Exercise 11.2's amax history of one activation tensor (16 steps, E4M3) and the next step's amax.
EX112_HISTORY = (3.1, 2.9, 3.4, 3.0, 3.2, 2.8, 3.3, 3.1, 2.9, 3.0, 3.2, 3.3, 2.7, 3.1, 3.0, 3.2)
EX112_NEXT = 9.7


def _ex111_truth() -> tuple:
    """(shared exponent k of the block in MXFP8 E4M3, k in MXFP4, what MXFP4 stores for -3.2), by
    :func:`mpt_lab.microscaling.quantize_mx` (X = 2^(code − 127))."""
    x = torch.tensor(EX111_BLOCK, dtype=torch.float64)
    q8 = microscaling.quantize_mx(x, F.FP8_E4M3, block_size=len(EX111_BLOCK))
    q4 = microscaling.quantize_mx(x, F.FP4_E2M1, block_size=len(EX111_BLOCK))
    stored = float(q4.dequantize(torch.float64)[EX111_BLOCK.index(EX111_VALUE)])
    return int(q8.scale_codes[0]) - 127, int(q4.scale_codes[0]) - 127, stored


def _ex111_check(a):
    values = as_list(a)
    if (
        values is None
        or len(values) != 3
        or not all(is_real(v) for v in values)
        or not all(isinstance(v, numbers.Integral) for v in values[:2])
    ):
        return False, f"expected a tuple (k_mxfp8, k_mxfp4, stored) of two ints and a float, got {a!r}"
    k8, k4, stored = _ex111_truth()
    if int(values[0]) != k8:
        return False, (
            f"2^{int(values[0])} is not MXFP8's shared scale: the block maximum divided by it must land "
            "in E4M3's top binade."
        )
    if int(values[1]) != k4:
        return False, (f"2^{int(values[1])} is not MXFP4's shared scale: E2M1 has another largest exponent than E4M3.")
    if float(values[2]) != stored:
        return False, f"{float(values[2])!r} is not what MXFP4 stores for {EX111_VALUE}: divide, round, multiply."
    amax = max(abs(v) for v in EX111_BLOCK)
    err = abs(stored - EX111_VALUE) / abs(EX111_VALUE)
    return True, (
        f"amax = {amax:g} lies in [2^2, 2^3); E4M3's emax is {F.FP8_E4M3.emax} and E2M1's is "
        f"{F.FP4_E2M1.emax}, so X = 2^{k8} and 2^{k4}. In MXFP4, {EX111_VALUE} / 2^{k4} rounds to the "
        f"nearest E2M1 value: {stored!r}, an error of {err:.0%}."
    )


def _ex111_worked() -> str:
    """Exercise 11.1's worked solution; every number in it computed from :mod:`mpt_lab.formats`."""
    amax = max(abs(v) for v in EX111_BLOCK)
    e = math.floor(math.log2(amax))
    e4m3, e2m1 = F.FP8_E4M3, F.FP4_E2M1
    grid = [float(v) for v in F.values(e2m1) if v >= 0]
    x4 = EX111_VALUE / 2 ** (e - e2m1.emax)
    nearest = min(grid, key=lambda v: abs(v - abs(x4)))
    stored8 = float(F.round_to(EX111_VALUE / 2 ** (e - e4m3.emax), e4m3)) * 2 ** (e - e4m3.emax)
    return f"""The shared exponent. The block's largest magnitude is amax = {amax:g}, which lies in [2^{e}, 2^{e + 1}), so floor(log2(amax)) = {e}. OCP MX subtracts the element format's largest exponent emax, so that amax / X lands in the element format's top binade: E4M3's largest value is {e4m3.max:g} = {e4m3.max / 2**e4m3.emax:g} · 2^{e4m3.emax}, so emax = {e4m3.emax} and k = {e} − {e4m3.emax} = {e - e4m3.emax} for MXFP8; E2M1's largest value is {e2m1.max:g} = {e2m1.max / 2**e2m1.emax:g} · 2^{e2m1.emax}, so emax = {e2m1.emax} and k = {e} − {e2m1.emax} = {e - e2m1.emax} for MXFP4. (Check: {amax:g} / 2^{e - e4m3.emax} = {amax / 2 ** (e - e4m3.emax):g} lies in E4M3's top binade [2^{e4m3.emax}, 2^{e4m3.emax + 1}), below its largest value {e4m3.max:g}; {amax:g} / 2^{e - e2m1.emax} = {amax / 2 ** (e - e2m1.emax):g} lies in E2M1's top binade, below {e2m1.max:g}.)

The stored value. MXFP4 stores {EX111_VALUE} / 2^{e - e2m1.emax} = {EX111_VALUE / 2 ** (e - e2m1.emax):g}, rounded to the nearest E2M1 value. The non-negative E2M1 values are {grid}; the nearest to {abs(x4):g} is {nearest:g}, so the element is {-nearest if EX111_VALUE < 0 else nearest:g} (the sign kept) and the block stores it times 2^{e - e2m1.emax}.

The answer (k_mxfp8, k_mxfp4, stored): {{answer}}. Four bits keep only a few values per binade: that is an error of {abs(nearest - abs(x4)) / abs(x4):.1%} on the block's second-largest value. MXFP8 stores the same value as {stored8:g}, an error of {abs(stored8 - EX111_VALUE) / abs(EX111_VALUE):.1%}: E4M3's three mantissa bits keep every normal value within half an ulp, 2^-{e4m3.mantissa_bits + 1} of it."""


register(
    Exercise(
        "11.1",
        "An MX block's shared exponent, by hand",
        f"A block of MX values (here {len(EX111_BLOCK)}, to keep it short) holds {list(EX111_BLOCK)}. OCP MX gives "
        "the block the shared scale X = 2^k with k = floor(log2(amax)) − emax, where emax is the largest exponent of "
        "the element format. What is k in MXFP8 (E4M3 elements) and in MXFP4 (E2M1 elements), and which value does "
        f"MXFP4 store for {EX111_VALUE} (its element, round-to-nearest-even, times X)? Answer with a tuple "
        "(k_mxfp8, k_mxfp4, stored) of two ints and a float.",
        _ex111_check,
        "amax is the largest magnitude in the block. Each FloatFormat of mpt_lab.formats has an emax attribute "
        "(FP8_E4M3.emax, FP4_E2M1.emax), and values(FP4_E2M1) lists every E2M1 value: divide by X, pick the nearest.",
        _ex111_truth,
        _ex111_worked(),
    )
)


def _ex112_truth() -> int:
    """The smallest margin m ≥ 0 for which the next step's cast saturates nothing, by feeding the history to
    :class:`mpt_lab.microscaling.DelayedScaling` (E4M3, history of 16, amax from the maximum)."""
    m = 0
    while True:
        ds = microscaling.DelayedScaling(history_len=len(EX112_HISTORY), margin=m)
        for a in EX112_HISTORY:
            ds.quantize(torch.tensor([a]), "x")
            ds.update()
        ds.quantize(torch.tensor([EX112_NEXT]), "x")
        ds.update()
        if ds.exceeded("x") == 0:
            return m
        m += 1


def _ex112_check(a):
    if not isinstance(a, numbers.Integral) or isinstance(a, bool) or a < 0:
        return False, f"expected an int m ≥ 0 (the margin), got {a!r}"
    m, truth = int(a), _ex112_truth()
    hist = max(EX112_HISTORY)
    if m < truth:
        s = F.FP8_E4M3.max / hist / 2**m
        return False, (
            f"expected a margin at which nothing saturates: with margin {m} the scale is {s:.4g} and the "
            f"new amax becomes {EX112_NEXT * s:.4g}, beyond E4M3's range, so it saturates."
        )
    if m > truth:
        return False, (
            f"expected the smallest such margin: margin {m} works, but a smaller one does too, and every "
            "extra margin costs a binade of range."
        )
    s = F.FP8_E4M3.max / hist / 2**m
    return True, (
        f"margin {m}: scale = 448 / {hist:g} / 2^{m} = {s:.4g}, so {EX112_NEXT:g} becomes "
        f"{EX112_NEXT * s:.4g} ≤ 448. The price: the typical values now sit {m} binades lower, "
        "closer to E4M3's subnormals."
    )


register(
    Exercise(
        "11.2",
        "A margin that avoids saturation",
        f"Delayed scaling keeps the amax of an activation tensor over the last {len(EX112_HISTORY)} steps: "
        f"{list(EX112_HISTORY)}. It casts the next step to E4M3 (max 448) with scale = (448 / max(history)) / 2^m, m "
        f"being the margin. The next step's amax is {EX112_NEXT:g}, a spike. What is the smallest margin m ≥ 0 for "
        "which no value of that step saturates (none rounds beyond 448)? Answer with an int.",
        _ex112_check,
        "The spike is amax_next / max(history) times larger than anything the scale was made for, and each unit of "
        "margin halves the scale. Check the product amax_next × scale against 448 for m = 0, 1, 2, …",
        _ex112_truth,
        f"""The scale was made for the largest amax in the history, max(history) = {max(EX112_HISTORY):g}: with margin m it maps {max(EX112_HISTORY):g} onto 448 / 2^m. The next step's amax, {EX112_NEXT:g}, is {EX112_NEXT / max(EX112_HISTORY):.3g} times larger, so it lands at 448 · {EX112_NEXT / max(EX112_HISTORY):.3g} / 2^m. Nothing saturates when that is at most 448, that is when 2^m ≥ {EX112_NEXT / max(EX112_HISTORY):.3g}: each unit of margin halves the scale, and the smallest m is the exponent of the first power of two at or above the ratio.

```python
history, spike = {list(EX112_HISTORY)}, {EX112_NEXT:g}
m = 0
while spike * (448 / max(history)) / 2 ** m > 448:   # the spike's scaled value still beyond E4M3's max
    m += 1
answer = m
```

The answer: {{answer}}. The price of the margin is paid on every step, not only on the spike's: the typical values, around {max(EX112_HISTORY):g}, now sit that many binades below the top of E4M3, that many binades closer to its subnormals, where fewer mantissa bits remain. Transformer Engine's DelayedScaling recipe has a margin of 0 by default; current scaling, which measures this step's amax before it casts, needs no margin for a spike at all.""",
    )
)
