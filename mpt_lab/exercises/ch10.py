"""Exercises of chapter 10: mixed precision across processes."""

from __future__ import annotations

import math
import numbers

import numpy as np

from ._core import Exercise, register, is_real, as_list, short


#: Exercise 10.1's BF16 gradients of ranks 0, 1, 2 for one element (in chunk 0 of the ring).
EX101_VALUES = (1.0, 2.0 ** -8, 2.0 ** -8)
#: Exercise 10.3's loss-scaled gradient, the same on every rank.
EX103_GRADIENT = 3000.0


def _ex101_truth() -> tuple:
    """(ring, tree): what every rank holds after gloo's ring and after a binary tree sum the three BF16 values,
    by :func:`mpt_lab.collectives.ring_allreduce` and ``tree_allreduce``."""
    from ..collectives import ring_allreduce, tree_allreduce

    values = [[v] for v in EX101_VALUES]
    return float(ring_allreduce(values, "BF16")[0]), float(tree_allreduce(values, "BF16")[0])


def _ex101_check(a):
    values = as_list(a)
    if values is None or len(values) != 2 or not all(is_real(v) for v in values):
        return False, f"expected a tuple (ring, tree) of two floats, got {a!r}"
    ring, tree = _ex101_truth()
    wrong = [name for name, v, t in (("ring", values[0], ring), ("tree", values[1], tree)) if float(v) != t]
    if wrong:
        return False, (f"expected the values every rank holds; the {' and the '.join(wrong)} "
                       f"{'sum is' if len(wrong) == 1 else 'sums are'} not right.")
    return True, (f"the ring adds the two small values first (ranks 2, 1, then 0): {ring!r}; the tree adds "
                  f"rank 1's to rank 0's first, a tie that rounds to even, and then rank 2's: {tree!r}. "
                  "Same numbers, same format, another order: another sum.")


register(Exercise(
    "10.1", "The order of a sum",
    f"Three ranks hold the BF16 gradients {EX101_VALUES[0]:g}, 2^-8 and 2^-8 (ranks 0, 1 and 2) of one element that "
    "lies in chunk 0 of gloo's ring all-reduce, which sums it in the order ring_order(3, 0). What does every rank "
    "hold afterwards (no division)? And after a binary-tree all-reduce, where rank 0 adds rank 1's value and then "
    "rank 2's to its own? Every partial sum is rounded to BF16. Answer with a tuple (ring, tree) of two floats.",
    _ex101_check,
    "BF16 keeps 8 significant bits, so the spacing of its values just above 1 is 2^-7. Write down which two values "
    "meet first in each order; a sum exactly halfway between two BF16 values goes to the one with an even last bit.",
    _ex101_truth))


def _ex102_reference(values, fmt) -> float:
    """The value every rank holds after gloo's ring all-reduce of one element of chunk 0 (reference solution of
    exercise 10.2), by :func:`mpt_lab.collectives.ring_allreduce`."""
    from ..collectives import ring_allreduce

    return float(ring_allreduce(np.asarray(values, dtype=np.float64).reshape(-1, 1), fmt)[0])


def _ex102_cases() -> list:
    """(values, format) pairs: the chapter's cases, overflow, ties, and random gradients of 1 to 64 ranks."""
    rng = np.random.default_rng(92)
    cases = [([1.0, 2.0 ** -8, 2.0 ** -8], "BF16"), ([40000.0, 40000.0], "FP16"), ([3.0], "FP16"),
             ([1.0, 2.0 ** -11, 2.0 ** -11, 2.0 ** -11], "FP16"), ([0.1, 0.2, 0.3], "FP32")]
    for i in range(90):
        n = int(rng.integers(1, 65))
        values = rng.normal(0, 1, n) * np.exp2(rng.integers(-12, 12, n))
        cases.append((values.tolist(), ("BF16", "FP16", "FP32")[i % 3]))
    return cases


def _ex102_check(fn):
    if not callable(fn):
        return False, f"expected a function ring_sum(values, fmt) -> float, got {type(fn).__name__}"
    cases = _ex102_cases()
    for values, fmt in cases:
        want = _ex102_reference(values, fmt)
        got = fn(list(values), fmt)
        where = f"ring_sum({short(values)}, {fmt!r})"
        if not is_real(got):
            return False, f"{where} returned {type(got).__name__}; expected a float."
        if not (float(got) == want or (math.isnan(want) and math.isnan(float(got)))):
            return False, f"{where} returned {float(got)!r}; expected {want!r}, the ring's sum."
    return True, (f"equal, bit for bit, to the ring's sum in {len(cases)} cases of 1 to 64 ranks in BF16, FP16 and "
                  "FP32, overflow included: one rounding per hop, in the ring's order.")


register(Exercise(
    "10.2", "A ring all-reduce, one element",
    "Write ring_sum(values, fmt) -> float: what every rank holds after gloo's ring all-reduce (a sum, no division) "
    "of one element in chunk 0, where values[r] is rank r's value (N = len(values) ≥ 1) and fmt is 'BF16', 'FP16' "
    "or 'FP32'. Each rank's value is first rounded to fmt (mpt_lab.formats.round_to); the partial sum starts at "
    "the first rank of ring_order(N, 0) (mpt_lab.collectives) and each following rank adds its value, "
    "the sum rounded to fmt after every addition.",
    _ex102_check,
    "Keep the running sum as a float and call round_to after each addition; adding two values of these formats in "
    "float64 is exact or rounds innocuously, so only round_to's rounding counts. Check a single rank, and a sum "
    "that passes the largest finite value.",
    lambda: _ex102_reference))


def _ex103_truth() -> tuple:
    """(the smallest N whose FP16 ring sum of N copies of the gradient overflows before the division by N; what
    every rank holds at that N when each divides by N first, as fp16_compress_hook does), by
    :func:`mpt_lab.collectives.ring_allreduce`."""
    from ..collectives import ring_allreduce

    n = 1
    while np.isfinite(ring_allreduce(np.full((n, 1), EX103_GRADIENT), "FP16", postdivide=n)).all():
        n += 1
    return n, float(ring_allreduce(np.full((n, 1), EX103_GRADIENT), "FP16", predivide=n)[0])


def _ex103_check(a):
    values = as_list(a)
    n, mean = values if values is not None and len(values) == 2 else (None, None)
    if not (isinstance(n, numbers.Integral) and is_real(n) and is_real(mean)):    # _is_real: not a bool
        return False, f"expected a tuple (n, mean) of an int and a float, got {a!r}"
    truth_n, truth_mean = _ex103_truth()
    if int(n) != truth_n:
        return False, (f"expected the smallest N that overflows: with N = {n} the sum is "
                       f"{'still finite' if n < truth_n else 'finite already one rank earlier'}.")
    if float(mean) != truth_mean:
        return False, f"expected what every rank holds with pre-division at N = {n}: {mean!r} is not it."
    return True, (f"{truth_n} ranks: the partial sums pass 65504 at the last hop. Dividing first keeps the sum in "
                  f"range, but every rank holds {truth_mean!r}, not {EX103_GRADIENT:g}: g/N was rounded to FP16, "
                  "and so was every partial sum.")


register(Exercise(
    "10.3", "When an FP16 sum overflows",
    f"Every one of N ranks holds the same loss-scaled FP16 gradient {EX103_GRADIENT:g} for one element. (a) What is "
    "the smallest N for which a ring all-reduce that sums first and divides by N afterwards overflows FP16? (b) At "
    "that N, what does every rank hold when each divides by N first, as fp16_compress_hook does? Every quotient and "
    "partial sum is rounded to FP16. Answer with a tuple (n, mean) of an int and a float.",
    _ex103_check,
    "(a) The partial sums grow by about the gradient per hop. FP16's largest finite value is 65504 and its values "
    "are 32 apart there, so under round-to-nearest a sum becomes inf once it reaches 65520. (b) Round the quotient "
    "to FP16 first, then add it N times, rounding each partial sum (the spacing of FP16 values doubles at every "
    "power of two).",
    _ex103_truth))
