"""Exercises of chapter 11: FP8 and block scaling."""

from __future__ import annotations

import numbers

from .. import formats as F
from ._core import Exercise, register, is_real, as_list


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
    import torch

    from ..microscaling import quantize_mx

    x = torch.tensor(EX111_BLOCK, dtype=torch.float64)
    q8 = quantize_mx(x, F.FP8_E4M3, block_size=len(EX111_BLOCK))
    q4 = quantize_mx(x, F.FP4_E2M1, block_size=len(EX111_BLOCK))
    stored = float(q4.dequantize(torch.float64)[EX111_BLOCK.index(EX111_VALUE)])
    return int(q8.scale_codes[0]) - 127, int(q4.scale_codes[0]) - 127, stored


def _ex111_check(a):
    values = as_list(a)
    if values is None or len(values) != 3 or not all(is_real(v) for v in values) or \
            not all(isinstance(v, numbers.Integral) for v in values[:2]):
        return False, f"expected a tuple (k_mxfp8, k_mxfp4, stored) of two ints and a float, got {a!r}"
    k8, k4, stored = _ex111_truth()
    if int(values[0]) != k8:
        return False, (f"2^{int(values[0])} is not MXFP8's shared scale: the block maximum divided by it must land "
                       "in E4M3's top binade.")
    if int(values[1]) != k4:
        return False, (f"2^{int(values[1])} is not MXFP4's shared scale: E2M1 has another largest exponent than "
                       "E4M3.")
    if float(values[2]) != stored:
        return False, f"{float(values[2])!r} is not what MXFP4 stores for {EX111_VALUE}: divide, round, multiply."
    amax = max(abs(v) for v in EX111_BLOCK)
    err = abs(stored - EX111_VALUE) / abs(EX111_VALUE)
    return True, (f"amax = {amax:g} lies in [2^2, 2^3); E4M3's emax is {F.FP8_E4M3.emax} and E2M1's is "
                  f"{F.FP4_E2M1.emax}, so X = 2^{k8} and 2^{k4}. In MXFP4, {EX111_VALUE} / 2^{k4} rounds to the "
                  f"nearest E2M1 value: {stored!r}, an error of {err:.0%}.")


register(Exercise(
    "11.1", "An MX block's shared exponent, by hand",
    f"A block of MX values (here {len(EX111_BLOCK)}, to keep it short) holds {list(EX111_BLOCK)}. OCP MX gives "
    "the block the shared scale X = 2^k with k = floor(log2(amax)) − emax, where emax is the largest exponent of "
    "the element format. What is k in MXFP8 (E4M3 elements) and in MXFP4 (E2M1 elements), and which value does "
    f"MXFP4 store for {EX111_VALUE} (its element, round-to-nearest-even, times X)? Answer with a tuple "
    "(k_mxfp8, k_mxfp4, stored) of two ints and a float.",
    _ex111_check,
    "amax is the largest magnitude in the block. Each FloatFormat of mpt_lab.formats has an emax attribute "
    "(FP8_E4M3.emax, FP4_E2M1.emax), and values(FP4_E2M1) lists every E2M1 value: divide by X, pick the nearest.",
    _ex111_truth))


def _ex112_truth() -> int:
    """The smallest margin m ≥ 0 for which the next step's cast saturates nothing, by feeding the history to
    :class:`mpt_lab.microscaling.DelayedScaling` (E4M3, history of 16, amax from the maximum)."""
    import torch

    from ..microscaling import DelayedScaling

    m = 0
    while True:
        ds = DelayedScaling(history_len=len(EX112_HISTORY), margin=m)
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
        s = F.FP8_E4M3.max / hist / 2 ** m
        return False, (f"expected a margin at which nothing saturates: with margin {m} the scale is {s:.4g} and the "
                       f"new amax becomes {EX112_NEXT * s:.4g}, beyond E4M3's range, so it saturates.")
    if m > truth:
        return False, (f"expected the smallest such margin: margin {m} works, but a smaller one does too, and every "
                       "extra margin costs a binade of range.")
    s = F.FP8_E4M3.max / hist / 2 ** m
    return True, (f"margin {m}: scale = 448 / {hist:g} / 2^{m} = {s:.4g}, so {EX112_NEXT:g} becomes "
                  f"{EX112_NEXT * s:.4g} ≤ 448. The price: the typical values now sit {m} binades lower, "
                  "closer to E4M3's subnormals.")


register(Exercise(
    "11.2", "A margin that avoids saturation",
    f"Delayed scaling keeps the amax of an activation tensor over the last {len(EX112_HISTORY)} steps: "
    f"{list(EX112_HISTORY)}. It casts the next step to E4M3 (max 448) with scale = (448 / max(history)) / 2^m, m "
    f"being the margin. The next step's amax is {EX112_NEXT:g}, a spike. What is the smallest margin m ≥ 0 for "
    "which no value of that step saturates (none rounds beyond 448)? Answer with an int.",
    _ex112_check,
    "The spike is amax_next / max(history) times larger than anything the scale was made for, and each unit of "
    "margin halves the scale. Check the product amax_next × scale against 448 for m = 0, 1, 2, …",
    _ex112_truth))
