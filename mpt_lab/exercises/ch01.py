"""Exercises of chapter 1: floating point, bit by bit."""

from __future__ import annotations

import math

import numpy as np

from .. import formats as F
from ._core import Exercise, expect_float, expect_int, is_real, register


def _ex11_truth():
    return F.decompose(6.5, F.BF16).exponent


register(
    Exercise(
        "1.1",
        "A biased exponent",
        "What is the biased exponent field of 6.5 stored in BF16? Answer with an int.",
        lambda a: expect_int(a, _ex11_truth(), "the biased exponent field of 6.5 in BF16"),
        "Write 6.5 as 1.f × 2^e first; the field stores e + bias, and BF16 has FP32's bias.",
        _ex11_truth,
        worked=f"""Write 6.5 in binary: 6.5 = 4 + 2 + 0.5 = 110.1₂. Move the binary point behind the leading 1: \
110.1₂ = 1.101₂ × 2². The unbiased exponent is therefore e = 2.

BF16 is FP32 with the mantissa cut to {F.BF16.mantissa_bits} bits: it keeps FP32's {F.BF16.exponent_bits} exponent \
bits and FP32's bias, {F.BF16.bias}. The stored (biased) exponent field is e + bias = 2 + {F.BF16.bias} = {{answer}}.

All of 6.5 fits: `mpt_lab.formats.decompose(6.5, "BF16").bits` is `{F.decompose(6.5, F.BF16).bits}` (sign, \
exponent field, mantissa 101 followed by zeros), and the value is stored exactly.""",
    )
)


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


register(
    Exercise(
        "1.2",
        "Round by hand to FP8",
        "Give the bits of 0.3 rounded to nearest (ties to even) in FP8 E4M3, as a str 'S EEEE MMM'.",
        _ex12_check,
        "0.3 = 1.2 × 2^-2. E4M3's bias is 7; with 3 mantissa bits the candidates are 1.125 × 2^-2 and 1.25 × 2^-2.",
        _ex12_truth,
        worked=f"""Normalise first: 0.3 lies in [0.25, 0.5), so 0.3 = 1.2 × 2⁻². The sign bit is 0 and the unbiased \
exponent is −2; E4M3's bias is {F.FP8_E4M3.bias}, so the exponent field is −2 + {F.FP8_E4M3.bias} = 5 = 0101₂.

With {F.FP8_E4M3.mantissa_bits} mantissa bits the significands of this binade are 1, 1.125, 1.25, … (steps of \
2⁻³). The significand 1.2 lies between 1.125 (mantissa 001) and 1.25 (mantissa 010): it is 0.075 above the first \
and 0.05 below the second, so round-to-nearest picks 1.25; no tie, so the even rule is not needed.

The stored value is 1.25 × 2⁻² = {F.round_to(0.3, F.FP8_E4M3)!r} and the bits are {{answer}}. (A mantissa of 001 \
would store {F.decode(0b00101001, F.FP8_E4M3)!r}, the neighbour below.)""",
    )
)


def _ex13_truth():
    v = F.values(F.FP16)
    v = v[v > 0]
    lost = F.round_to(1.0 + v, F.FP16) == 1.0  # 1 + v is exact in float64 for every FP16 v
    return float(v[np.argmax(~lost)])


register(
    Exercise(
        "1.3",
        "The smallest update that survives",
        "What is the smallest positive FP16 value x for which 1 + x, rounded to FP16, is not 1? Answer with a float.",
        lambda a: expect_float(a, _ex13_truth(), "the smallest FP16 x with fp16(1 + x) ≠ 1"),
        "Half an ulp of 1 in FP16 is 2^-11. Exactly half an ulp is a tie, and ties go to the even neighbour.",
        _ex13_truth,
        worked=f"""The neighbours of 1 in FP16 are 1 − 2⁻¹¹ below and 1 + 2⁻¹⁰ above (the ulp of [1, 2) is 2⁻¹⁰ with \
{F.FP16.mantissa_bits} mantissa bits). For a positive x, 1 + x rounds back to 1 while it is nearer to 1 than to \
1 + 2⁻¹⁰, i.e. while x < 2⁻¹¹.

x = 2⁻¹¹ itself is a tie: 1 + 2⁻¹¹ lies exactly halfway, and round-to-nearest-even picks the neighbour whose \
mantissa ends in 0, which is 1 (mantissa 0000000000; 1 + 2⁻¹⁰ has mantissa 0000000001). So 2⁻¹¹ is still lost.

Any x above 2⁻¹¹ makes 1 + x nearer to 1 + 2⁻¹⁰. The question asks for an FP16 value x, so the answer is the \
smallest FP16 value above 2⁻¹¹: 2⁻¹¹ plus one ulp of 2⁻¹¹, i.e. 2⁻¹¹ × (1 + 2⁻¹⁰) = 2⁻¹¹ + 2⁻²¹ = {{answer}}.""",
    )
)


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
            return (
                False,
                f"fp16_value{(int(sign[c]), int(exp[c]), int(man[c]))} returned {type(got).__name__}, not a float",
            )
        t = truth[c]
        ok = (math.isnan(got) and math.isnan(t)) or (got == t and math.copysign(1, got) == math.copysign(1, t))
        if not ok:
            d = F.Decomposition(c, F.FP16, scalar=True)
            return False, (
                f"for sign={d.sign}, exponent={d.exponent}, mantissa={d.mantissa} ({d.kind}) "
                f"you return {got!r}; the stored value is {float(t)!r}."
            )
    return True, "all 65,536 FP16 bit patterns decode correctly (zeros, subnormals, normals, ±inf, NaN)."


register(
    Exercise(
        "1.4",
        "Decode FP16 yourself",
        "Write fp16_value(sign, exponent, mantissa) -> float from the IEEE 754 formula, without mpt_lab. "
        "It must handle zeros (with their sign), subnormals, normals, infinities and NaN.",
        _ex14_check,
        "Subnormals (exponent field 0) have no implicit 1 and use the exponent emin = 1 − bias = −14, "
        "not 0 − bias; the field 31 encodes infinity (mantissa 0) or NaN.",
        lambda: _ex14_reference,
        worked="""FP16 has 1 sign bit, 5 exponent bits (bias 15) and 10 mantissa bits. IEEE 754 gives three cases by \
the exponent field E:

1. E = 31 (all ones): infinity when the mantissa is 0, NaN otherwise.

2. E = 0: zero or a subnormal. There is no implicit leading 1 and the exponent is emin = 1 − 15 = −14 (not \
0 − 15): the value is 0.M₂ × 2⁻¹⁴ = M × 2⁻²⁴. With M = 0 this is a zero, and the sign must survive: −0.0 is a \
different bit pattern from +0.0.

3. Otherwise a normal number: 1.M₂ × 2^(E − 15) = (1 + M/1024) × 2^(E − 15).

```python
import math

def fp16_value(sign, exponent, mantissa):
    s = -1.0 if sign else 1.0                       # multiplying keeps the sign of a zero: -1.0 * 0.0 == -0.0
    if exponent == 31:                              # all ones: infinity or NaN
        return s * math.inf if mantissa == 0 else math.nan
    if exponent == 0:                               # zero or subnormal: no implicit 1, exponent emin = -14
        return s * mantissa * 2.0 ** -24            # 0.M × 2^-14 = M × 2^-24
    return s * (1 + mantissa / 1024) * 2.0 ** (exponent - 15)
```

The classic mistakes are using 2^(0 − 15) for the subnormals (every subnormal comes out half its value) and \
returning 0.0 for both zeros.""",
    )
)


def _ex15_truth():
    powers = [2.0**k for k in range(-30, 11)]
    vanish = [u for u in powers if F.round_to(1024.0 + u, F.FP16) == 1024.0]
    return max(vanish)


register(
    Exercise(
        "1.5",
        "Swamping",
        "A weight w = 1024 is stored in FP16. What is the largest power of two u for which w + u, rounded to "
        "FP16, is still 1024? Answer with a float.",
        lambda a: expect_float(a, _ex15_truth(), "the largest power of two swamped by 1024 in FP16"),
        "Find the ulp of 1024 in FP16 (1024 = 2^10 and FP16 keeps 10 mantissa bits); an update of half an ulp "
        "is a tie.",
        _ex15_truth,
        worked=f"""1024 = 2¹⁰ lies in the binade [2¹⁰, 2¹¹), which is 2¹⁰ wide. FP16 keeps \
{F.FP16.mantissa_bits} mantissa bits, so the binade is divided into 2¹⁰ equal steps: the ulp is 2^(10 − 10) = \
{F.ulp(1024.0, F.FP16):g}. The neighbours of 1024 are 1025 above and 1024 − 0.5 below (the binade below has half \
the ulp).

Adding u = 1 gives 1025 exactly, which is stored: not swamped. Adding u = 0.5 gives 1024.5, exactly halfway \
between 1024 and 1025: a tie, and round-to-nearest-even keeps 1024, whose mantissa is all zeros (1025 has \
mantissa 0000000001). Every smaller power of two is nearer to 1024 and is lost too.

So the largest power of two swamped by 1024 is {{answer}}: a weight of 1024 in FP16 ignores every positive update \
up to half its ulp. Downward the gap is only 0.5, so there a negative update is lost only up to 0.25 in size: \
the threshold depends on the side, and on where the weight sits in its binade.""",
    )
)
