"""Exercises of chapter 1: floating point, bit by bit."""

from __future__ import annotations

import math

import numpy as np

from .. import formats as F
from ._core import Exercise, register, expect_int, expect_float, is_real


def _ex11_truth():
    return F.decompose(6.5, F.BF16).exponent


register(Exercise(
    "1.1", "A biased exponent",
    "What is the biased exponent field of 6.5 stored in BF16? Answer with an int.",
    lambda a: expect_int(a, _ex11_truth(), "the biased exponent field of 6.5 in BF16"),
    "Write 6.5 as 1.f × 2^e first; the field stores e + bias, and BF16 has FP32's bias.",
    _ex11_truth))


def _ex12_truth():
    return F.decompose(0.3, F.FP8_E4M3).bits


def _ex12_check(a):
    if not isinstance(a, str):
        return False, f"expected a str of 8 bits such as '0 0101 001', got {type(a).__name__}"
    bits = a.replace(" ", "").replace("|", "")
    if len(bits) != 8 or set(bits) - {"0", "1"}:
        return False, f"expected 8 characters 0/1 (spaces allowed), got {a!r}"
    truth = _ex12_truth()
    if bits == truth.replace(" ", ""):
        return True, f"0.3 is stored in FP8 E4M3 as {truth} = {F.decode(int(bits, 2), F.FP8_E4M3)!r}."
    got = F.decode(int(bits, 2), F.FP8_E4M3)
    return False, f"{a!r} encodes {got!r}, which is not the nearest E4M3 value to 0.3."


register(Exercise(
    "1.2", "Round by hand to FP8",
    "Give the bits of 0.3 rounded to nearest (ties to even) in FP8 E4M3, as a str 'S EEEE MMM'.",
    _ex12_check,
    "0.3 = 1.2 × 2^-2. E4M3's bias is 7; with 3 mantissa bits the candidates are 1.125 × 2^-2 and 1.25 × 2^-2.",
    _ex12_truth))


def _ex13_truth():
    v = F.values(F.FP16)
    v = v[v > 0]
    lost = F.round_to(1.0 + v, F.FP16) == 1.0  # 1 + v is exact in float64 for every FP16 v
    return float(v[np.argmax(~lost)])


register(Exercise(
    "1.3", "The smallest update that survives",
    "What is the smallest positive FP16 value x for which 1 + x, rounded to FP16, is not 1? Answer with a float.",
    lambda a: expect_float(a, _ex13_truth(), "the smallest FP16 x with fp16(1 + x) ≠ 1"),
    "Half an ulp of 1 in FP16 is 2^-11. Exactly half an ulp is a tie, and ties go to the even neighbour.",
    _ex13_truth))


def _ex14_reference(sign: int, exponent: int, mantissa: int) -> float:
    """FP16 value from its fields by the IEEE 754 formula (the reference solution of exercise 1.4)."""
    s = -1.0 if sign else 1.0
    if exponent == 0:
        return s * mantissa * 2.0 ** (-14 - 10)
    if exponent == 31:
        return s * math.inf if mantissa == 0 else math.nan
    return s * (1 + mantissa / 1024) * 2.0 ** (exponent - 15)


def _ex14_check(fn):
    if not callable(fn):
        return False, f"expected a function fp16_value(sign, exponent, mantissa), got {type(fn).__name__}"
    codes = np.arange(1 << 16)
    sign, exp, man = codes >> 15, (codes >> 10) & 31, codes & 1023
    truth = F.decode(codes.astype(np.uint16), F.FP16)
    for c in range(1 << 16):
        got = fn(int(sign[c]), int(exp[c]), int(man[c]))
        if not is_real(got):
            return False, f"fp16_value{(int(sign[c]), int(exp[c]), int(man[c]))} returned {type(got).__name__}, not a float"
        t = truth[c]
        ok = (math.isnan(got) and math.isnan(t)) or (got == t and math.copysign(1, got) == math.copysign(1, t))
        if not ok:
            d = F.Decomposition(c, F.FP16, scalar=True)
            return False, (f"for sign={d.sign}, exponent={d.exponent}, mantissa={d.mantissa} ({d.kind}) "
                           f"you return {got!r}; the stored value is {float(t)!r}.")
    return True, "all 65,536 FP16 bit patterns decode correctly (zeros, subnormals, normals, ±inf, NaN)."


register(Exercise(
    "1.4", "Decode FP16 yourself",
    "Write fp16_value(sign, exponent, mantissa) -> float from the IEEE 754 formula, without mpt_lab. "
    "It must handle zeros (with their sign), subnormals, normals, infinities and NaN.",
    _ex14_check,
    "Subnormals (exponent field 0) have no implicit 1 and use the exponent emin = 1 − bias = −14, "
    "not 0 − bias; the field 31 encodes infinity (mantissa 0) or NaN.",
    lambda: _ex14_reference))


def _ex15_truth():
    powers = [2.0 ** k for k in range(-30, 11)]
    vanish = [u for u in powers if F.round_to(1024.0 + u, F.FP16) == 1024.0]
    return max(vanish)


register(Exercise(
    "1.5", "Swamping",
    "A weight w = 1024 is stored in FP16. What is the largest power of two u for which w + u, rounded to "
    "FP16, is still 1024? Answer with a float.",
    lambda a: expect_float(a, _ex15_truth(), "the largest power of two swamped by 1024 in FP16"),
    "Find the ulp of 1024 in FP16 (1024 = 2^10 and FP16 keeps 10 mantissa bits); an update of half an ulp "
    "is a tie.",
    _ex15_truth))
