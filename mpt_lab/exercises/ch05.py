"""Exercises of chapter 5: accumulation, the third technique."""

from __future__ import annotations

import numpy as np

from .. import accumulation as acc
from ._core import Exercise, is_real, register


def _ex51_truth() -> dict:
    """The value at which a running sum of 0.25s stops growing, per accumulator (computed by the package)."""
    quarters, ones = np.full(4096, 0.25, dtype=np.float32), np.ones(4096, dtype=np.float32)
    return {fmt: float(acc.partial_sums(quarters, ones, accumulator=fmt)[-1]) for fmt in ("FP16", "BF16")}


def _ex51_check(a):
    if not isinstance(a, dict):
        return False, f'expected a dict {{"FP16": value, "BF16": value}}, got {type(a).__name__}'
    if set(a) != {"FP16", "BF16"}:
        return False, (
            f'expected the keys "FP16" and "BF16" (one value per accumulator), got the keys {sorted(a, key=str)}'
        )
    if not all(is_real(v) for v in a.values()):
        return False, (
            "expected a number for each accumulator, got "
            + ", ".join(f"{type(v).__name__} for {k!r}" for k, v in a.items() if not is_real(v))
        )
    truth = _ex51_truth()
    wrong = [k for k in truth if float(a[k]) != truth[k]]
    if wrong:
        return False, f"not the value where the sum stops for {', '.join(wrong)}."
    return True, (
        f"FP16 stops at {truth['FP16']:g} = 2⁹ and BF16 at {truth['BF16']:g} = 2⁶: there half an ulp "
        "of the sum is exactly 0.25, a tie, and round-to-nearest-even keeps the even sum."
    )


register(
    Exercise(
        "5.1",
        "Where does a sum of quarters stop?",
        "An accumulator starts at 0 and adds 0.25 again and again, rounding to nearest even after every addition. "
        "At which value does the sum stop growing in an FP16 accumulator, and in a BF16 one? Answer with a dict "
        '{"FP16": value, "BF16": value}. Reason with the ulp first; then check with '
        "mpt_lab.accumulation.partial_sums.",
        _ex51_check,
        "The sum stops when adding 0.25 rounds back to the sum: when 0.25 is at most half an ulp of the sum. FP16 "
        "has a precision of 11 bits, BF16 of 8: in which binade is the ulp 0.5? What does a tie do?",
        _ex51_truth,
        worked="A format with precision p has an ulp of 2^(e − p + 1) in the binade [2^e, 2^(e+1)). The ulp is 0.5 "
        "from 2^(p − 2) on, so adding 0.25 to 2^(p − 2) is exactly half an ulp: a tie between 2^(p − 2) (even "
        "mantissa) and the next value (odd), and round-to-nearest-even keeps 2^(p − 2). Below it the ulp is at "
        "most 0.25 and every quarter is counted.\n\n"
        "```python\nimport numpy as np\nfrom mpt_lab.accumulation import partial_sums\n"
        "quarters, ones = np.full(4096, 0.25, dtype=np.float32), np.ones(4096, dtype=np.float32)\n"
        "{fmt: float(partial_sums(quarters, ones, accumulator=fmt)[-1]) for fmt in ('FP16', 'BF16')}\n```\n\n"
        "The answer: {answer}, that is 2^9 and 2^6.",
    )
)


def _ex52_reference(values) -> float:
    """Kahan's compensated sum of ``values`` with every operation in FP16 (numpy.float16 arithmetic)."""
    s = np.float16(0.0)
    c = np.float16(0.0)
    for v in values:
        y = np.float16(v) - c
        t = s + y
        c = (t - s) - y
        s = t
    return float(s)


def _ex52_cases():
    rng = np.random.default_rng(52)
    cases = [
        np.ones(3000),
        np.full(5000, 0.1),
        rng.uniform(0, 1, 4000),
        rng.standard_normal(1500) * 100,
        np.array([2048.0] + [1.0] * 100),
        np.array([1e-3] * 2000 + [60000.0]),
    ]
    return [np.asarray(c, dtype=np.float16).astype(np.float32) for c in cases]


def _ex52_check(fn):
    if not callable(fn):
        return False, "expected a function kahan_sum(values) -> float"
    for x in _ex52_cases():
        want = float(acc.dot(x, np.ones_like(x), accumulator="FP16", compensated=True))
        got = fn(x.copy())
        if not is_real(got):
            return False, f"kahan_sum returned {type(got).__name__}; expected a float"
        if not (float(got) == want or (np.isnan(want) and np.isnan(float(got)))):
            seq = float(acc.dot(x, np.ones_like(x), accumulator="FP16"))
            return False, (
                f"on {len(x)} values ({', '.join(f'{v:g}' for v in x[:3])}, …) you returned {float(got)!r}; "
                f"Kahan in FP16 gives {want!r} (the plain FP16 sum is {seq!r})."
            )
    return True, (
        "the same as mpt_lab.accumulation.dot(x, ones, accumulator='FP16', compensated=True) on all "
        f"{len(_ex52_cases())} cases: the compensation recovers what the FP16 sum swallows."
    )


register(
    Exercise(
        "5.2",
        "Kahan summation in FP16",
        "Write kahan_sum(values) -> float: Kahan's compensated sum of the values (FP16 values, given as a float32 "
        "array), with every operation — the subtraction of the compensation, the addition, and the two subtractions "
        "that update it — done in FP16 (numpy.float16 arithmetic rounds each operation to nearest even). Start from "
        "s = 0 and c = 0.",
        _ex52_check,
        "y = x − c; t = s + y; c = (t − s) − y; s = t — each of these four operations on numpy.float16 values, in "
        "this order. Keep s and c as numpy.float16.",
        lambda: _ex52_reference,
        worked="Kahan's algorithm (Higham, Accuracy and Stability of Numerical Algorithms, §4.3) carries the part of "
        "each addend that the sum could not hold in c and subtracts it from the next addend:\n\n"
        "```python\n{answer}\n```\n\n"
        "On a sum of 3000 ones it returns 3000 where the plain FP16 sum stops at 2048: c collects the lost "
        "halves until they are large enough to move the sum.",
    )
)
