"""Exercises of chapter 10: mixed precision across processes."""

from __future__ import annotations

import math
import numbers

import numpy as np

from .. import collectives
from .. import formats as F
from ._core import Exercise, as_list, is_real, register, short

#: Exercise 10.1's BF16 gradients of ranks 0, 1, 2 for one element (in chunk 0 of the ring).
EX101_VALUES = (1.0, 2.0**-8, 2.0**-8)
#: Exercise 10.3's loss-scaled gradient, the same on every rank.
EX103_GRADIENT = 3000.0


def _ex101_truth() -> tuple:
    """(ring, tree): what every rank holds after gloo's ring and after a binary tree sum the three BF16 values,
    by :func:`mpt_lab.collectives.ring_allreduce` and ``tree_allreduce``."""
    values = [[v] for v in EX101_VALUES]
    return float(collectives.ring_allreduce(values, "BF16")[0]), float(collectives.tree_allreduce(values, "BF16")[0])


def _ex101_check(a):
    values = as_list(a)
    if values is None or len(values) != 2 or not all(is_real(v) for v in values):
        return False, f"expected a tuple (ring, tree) of two floats, got {a!r}"
    ring, tree = _ex101_truth()
    wrong = [name for name, v, t in (("ring", values[0], ring), ("tree", values[1], tree)) if float(v) != t]
    if wrong:
        return False, (
            f"expected the values every rank holds; the {' and the '.join(wrong)} "
            f"{'sum is' if len(wrong) == 1 else 'sums are'} not right."
        )
    return True, (
        f"the ring adds the two small values first (ranks 2, 1, then 0): {ring!r}; the tree adds "
        f"rank 1's to rank 0's first, a tie that rounds to even, and then rank 2's: {tree!r}. "
        "Same numbers, same format, another order: another sum."
    )


def _ex101_worked() -> str:
    """Exercise 10.1's worked solution; the orders come from :mod:`mpt_lab.collectives`, the spacing from formats."""

    order, children = collectives.ring_order(3, 0), collectives.tree_children(3)[0]
    bf16 = F.get_format("BF16")
    small = EX101_VALUES[1]
    return f"""BF16 keeps {bf16.mantissa_bits + 1} significant bits, so just above 1 its values are 2^-{bf16.mantissa_bits} = {F.ulp(1.0, bf16)} apart: 1 and 1 + 2^-{bf16.mantissa_bits} are neighbours, and 1 + 2^-{bf16.mantissa_bits + 1} lies exactly halfway between them. Both small values are 2^-8 = {small}, half that spacing.

Ring: Chunk 0 is summed in the order ring_order(3, 0) = {order}: the partial sum starts at rank {order[0]}, rank {order[1]} adds its value, and rank {order[2]} adds the last one. So the two small values meet first: 2^-8 + 2^-8 = 2^-7, exact. Then 1 + 2^-7 is a BF16 value, so nothing is lost, and every rank receives 1 + 2^-7.

Tree: Rank 0's children are {children}; it adds rank {children[0]}'s value first: 1 + 2^-8 is a tie between 1 and 1 + 2^-7, and round-to-nearest-even picks the neighbour whose last mantissa bit is 0, which is 1. Adding rank {children[1]}'s 2^-8 is the same tie again, and again gives 1. Both small values are lost.

The answer (ring, tree): {{answer}}. The same three numbers in the same format give two sums: which values meet first decides what survives. In FP32 both orders give 1 + 2^-7, because FP32 spaces its values near 1 far closer than 2^-8."""


register(
    Exercise(
        "10.1",
        "The order of a sum",
        f"Three ranks hold the BF16 gradients {EX101_VALUES[0]:g}, 2^-8 and 2^-8 (ranks 0, 1 and 2) of one element that "
        "lies in chunk 0 of gloo's ring all-reduce, which sums it in the order ring_order(3, 0). What does every rank "
        "hold afterwards (no division)? And after a binary-tree all-reduce, where rank 0 adds rank 1's value and then "
        "rank 2's to its own? Every partial sum is rounded to BF16. Answer with a tuple (ring, tree) of two floats.",
        _ex101_check,
        "BF16 keeps 8 significant bits, so the spacing of its values just above 1 is 2^-7. Write down which two values "
        "meet first in each order; a sum exactly halfway between two BF16 values goes to the one with an even last bit.",
        _ex101_truth,
        _ex101_worked(),
    )
)


def _ex102_reference(values, fmt) -> float:
    """The value every rank holds after gloo's ring all-reduce of one element of chunk 0 (reference solution of
    exercise 10.2), by :func:`mpt_lab.collectives.ring_allreduce`."""
    return float(collectives.ring_allreduce(np.asarray(values, dtype=np.float64).reshape(-1, 1), fmt)[0])


def _ex102_cases() -> list:
    """(values, format) pairs: the chapter's cases, overflow, ties, and random gradients of 1 to 64 ranks."""
    rng = np.random.default_rng(92)
    cases = [
        ([1.0, 2.0**-8, 2.0**-8], "BF16"),
        ([40000.0, 40000.0], "FP16"),
        ([3.0], "FP16"),
        ([1.0, 2.0**-11, 2.0**-11, 2.0**-11], "FP16"),
        ([0.1, 0.2, 0.3], "FP32"),
    ]
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
    return True, (
        f"equal, bit for bit, to the ring's sum in {len(cases)} cases of 1 to 64 ranks in BF16, FP16 and "
        "FP32, overflow included: one rounding per hop, in the ring's order."
    )


register(
    Exercise(
        "10.2",
        "A ring all-reduce, one element",
        "Write ring_sum(values, fmt) -> float: what every rank holds after gloo's ring all-reduce (a sum, no division) "
        "of one element in chunk 0, where values[r] is rank r's value (N = len(values) ≥ 1) and fmt is 'BF16', 'FP16' "
        "or 'FP32'. Each rank's value is first rounded to fmt (mpt_lab.formats.round_to); the partial sum starts at "
        "the first rank of ring_order(N, 0) (mpt_lab.collectives) and each following rank adds its value, "
        "the sum rounded to fmt after every addition.",
        _ex102_check,
        "Keep the running sum as a float and call round_to after each addition; adding two values of these formats in "
        "float64 is exact or rounds innocuously, so only round_to's rounding counts. Check a single rank, and a sum "
        "that passes the largest finite value.",
        lambda: _ex102_reference,
        """A ring all-reduce sums each chunk as a chain: the partial sum travels from rank to rank, and each rank adds its own value to what it received and rounds the result to the buffer's format before passing it on. So the function has three steps: put every rank's value into the format (the buffer holds fmt values, not the float64 you were given), look up the order in which chunk 0 visits the ranks, and walk that order with one rounding per addition.

```python
from mpt_lab.collectives import ring_order
from mpt_lab.formats import round_to

def ring_sum(values, fmt):
    x = [round_to(float(v), fmt) for v in values]   # each rank's value, in the buffer's format
    order = ring_order(len(x), 0)                    # the ranks in the order chunk 0 visits them
    total = x[order[0]]
    for r in order[1:]:
        total = round_to(total + x[r], fmt)          # one rounding per hop
    return float(total)
```

Why the addition may be done in float64 before round_to: two BF16, FP16 or FP32 values have at most 24 significant bits each, and float64's 53 bits hold their sum exactly unless the exponents differ by more than about 29, in which case the smaller one is below half an ulp of the larger and the sum rounds to the larger value either way. So round_to sees the exact sum, or one that rounds to the same value, and rounds it once, as the libraries' kernels do.

The edge cases follow by themselves: with one rank the loop does not run and the value is returned as it is (rounded to fmt); a partial sum past the largest finite value becomes inf in round_to and stays inf (inf + x = inf), and +inf met by −inf gives NaN. The book's reference answer computes the same sum for a whole buffer with `mpt_lab.collectives.ring_allreduce`, which the chapter checks against gloo's real all-reduce.""",
    )
)


def _ex103_truth() -> tuple:
    """(the smallest N whose FP16 ring sum of N copies of the gradient overflows before the division by N; what
    every rank holds at that N when each divides by N first, as fp16_compress_hook does), by
    :func:`mpt_lab.collectives.ring_allreduce`."""
    n = 1
    while np.isfinite(collectives.ring_allreduce(np.full((n, 1), EX103_GRADIENT), "FP16", postdivide=n)).all():
        n += 1
    return n, float(collectives.ring_allreduce(np.full((n, 1), EX103_GRADIENT), "FP16", predivide=n)[0])


def _ex103_check(a):
    values = as_list(a)
    n, mean = values if values is not None and len(values) == 2 else (None, None)
    if not (isinstance(n, numbers.Integral) and is_real(n) and is_real(mean)):  # _is_real: not a bool
        return False, f"expected a tuple (n, mean) of an int and a float, got {a!r}"
    truth_n, truth_mean = _ex103_truth()
    if int(n) != truth_n:
        return False, (
            f"expected the smallest N that overflows: with N = {n} the sum is "
            + ("still finite." if n < truth_n else "inf, but it overflows with fewer ranks already.")
        )
    if float(mean) != truth_mean:
        return False, f"expected what every rank holds with pre-division at N = {n}: {mean!r} is not it."
    return True, (
        f"{truth_n} ranks: the partial sums pass 65504 at the last hop. Dividing first keeps the sum in "
        f"range, but every rank holds {truth_mean!r}, not {EX103_GRADIENT:g}: g/N was rounded to FP16, "
        "and so was every partial sum."
    )


register(
    Exercise(
        "10.3",
        "When an FP16 sum overflows",
        f"Every one of N ranks holds the same loss-scaled FP16 gradient {EX103_GRADIENT:g} for one element. (a) What is "
        "the smallest N for which a ring all-reduce that sums first and divides by N afterwards overflows FP16? (b) At "
        "that N, what does every rank hold when each divides by N first, as fp16_compress_hook does? Every quotient and "
        "partial sum is rounded to FP16. Answer with a tuple (n, mean) of an int and a float.",
        _ex103_check,
        "(a) The partial sums grow by about the gradient per hop. FP16's largest finite value is 65504 and its values "
        "are 32 apart there, so under round-to-nearest a sum becomes inf once it reaches 65520. (b) Round the quotient "
        "to FP16 first, then add it N times, rounding each partial sum (the spacing of FP16 values doubles at every "
        "power of two).",
        _ex103_truth,
        f"""(a) Sum first. Every partial sum of a ring is rounded to FP16. The gradient {EX103_GRADIENT:g} is an FP16 value, and so are its first few multiples, but FP16 spaces its values 2, 4, 8, 16 and finally 32 apart as the sums pass 2048, 4096, 8192, 16384 and 32768, so some partial sums round (ties to even). FP16's largest finite value is 65504; a sum at or above 65520, halfway to the next step, rounds to inf. Adding one copy at a time and rounding after each addition finds the first N whose sum overflows. Dividing by N afterwards cannot help: inf / N is inf.

(b) Divide first. fp16_compress_hook divides each rank's value by N before the all-reduce (`buffer.to(float16).div_(world_size)`). The quotient {EX103_GRADIENT:g}/N is rounded to FP16, and then N copies of it are added with a rounding after each addition. The sum stays near {EX103_GRADIENT:g}, far from overflow, but it is not {EX103_GRADIENT:g}: the quotient and several partial sums were rounded.

Both parts, with NumPy's float16 (IEEE binary16; each operation rounds to nearest-even):

```python
import numpy as np

g = np.float16({EX103_GRADIENT:g})
n, total = 1, g
with np.errstate(over="ignore"):    # the overflow is what we look for
    while np.isfinite(total + g):   # the sum of n + 1 copies, rounded hop by hop
        total, n = total + g, n + 1
n += 1                              # the first N whose sum overflows
q = np.float16(g / np.float16(n))   # each rank divides first, in FP16
mean = q
for _ in range(n - 1):
    mean = mean + q                 # float16 + float16: rounded to float16
answer = (n, float(mean))
```

The answer (n, mean): {{answer}}. Dividing first trades the overflow for rounding error, and for small gradients, underflow: a quotient at or below half of FP16's smallest subnormal (2⁻²⁵) becomes 0 on every rank.""",
    )
)
