"""Exercises of chapter 8: when FP16 training fails."""

from __future__ import annotations

import math
import numbers

import numpy as np

from .. import formats as F
from ._core import Exercise, register, is_real


def _ex8_gradient() -> float:
    """bigLSTM's typical softmax gradient 1/(V·N) (p ≈ 1/V, N tokens per batch), from
    :data:`mpt_lab.experiments.biglstm.BIGLSTM`."""
    from ..experiments.biglstm import BIGLSTM

    return 1.0 / (BIGLSTM["vocab_size"] * BIGLSTM["tokens_per_batch"])


def _ex81_truth() -> tuple:
    """(binade k with 2^k ≤ g < 2^(k+1), whether FP16 rounds g to zero) for bigLSTM's g, by
    :func:`mpt_lab.formats.decompose` and :func:`mpt_lab.formats.round_to`."""
    g = _ex8_gradient()
    return int(F.decompose(g, F.FP64).unbiased_exponent), bool(F.round_to(g, F.FP16) == 0.0)


def _ex81_check(a):
    if not (isinstance(a, (tuple, list)) and len(a) == 2 and isinstance(a[0], numbers.Integral)
            and not isinstance(a[0], bool) and isinstance(a[1], (bool, np.bool_))):
        return False, f"expected a tuple (k, lost) of an int and a bool, got {a!r}"
    k, lost = int(a[0]), bool(a[1])
    truth_k, truth_lost = _ex81_truth()
    if k != truth_k:
        return False, (f"g = 1/(V·N) does not lie in [2^{k}, 2^{k + 1}): it is "
                       f"{'larger' if k < truth_k else 'smaller'}.")
    if lost != truth_lost:
        return False, "the binade is right; whether FP16 rounds g to zero is not."
    g16 = F.round_to(_ex8_gradient(), F.FP16)
    return True, (f"g lies in [2^{truth_k}, 2^{truth_k + 1}), and FP16 "
                  f"{'rounds it to zero' if truth_lost else f'stores it as {g16!r}'}: "
                  f"{'it is at or below' if truth_lost else 'it is above'} "
                  f"2^{F.FP16.emin - F.FP16.mantissa_bits - 1}, half the smallest FP16 subnormal.")


register(Exercise(
    "8.1", "Where bigLSTM's gradients land",
    "bigLSTM had a vocabulary of V = 793,471 words and N = 128 × 20 = 2,560 tokens per batch. The softmax "
    "gradient of a wrong word is p/N with p ≈ 1/V, so a typical value is g = 1/(V·N). In which binade is g "
    "(the int k with 2^k ≤ g < 2^(k+1)), and does FP16 lose it (round it to zero)? Answer with a tuple "
    "(k, lost) of an int and a bool.",
    _ex81_check,
    "log2(g) = −(log2 V + log2 N), and 2^10 ≈ 10^3 gives a first estimate (then use math.log2). "
    "The smallest positive FP16 value is 2^-24; where does round-to-nearest send a value below it?",
    _ex81_truth))


def _ex82_truth() -> float:
    """The smallest power of two S ≥ 1 with S·g rounded to FP16 ≥ FP16's smallest normal, for bigLSTM's g
    (:func:`mpt_lab.formats.round_to`, :attr:`FloatFormat.smallest_normal`)."""
    g, s = _ex8_gradient(), 1.0
    while F.round_to(s * g, F.FP16) < F.FP16.smallest_normal:   # s·g is exact: s is a power of two
        s *= 2.0
    return s


def _ex82_check(a):
    if not is_real(a) or not (1 <= a < math.inf) or math.frexp(float(a))[0] != 0.5:
        return False, f"expected a power of two S ≥ 1 (a float such as 1024.0), got {a!r}"
    s, g = float(a), _ex8_gradient()
    if F.round_to(s * g, F.FP16) < F.FP16.smallest_normal:
        return False, (f"S·g rounds to {F.round_to(s * g, F.FP16)!r} in FP16, still below the smallest normal "
                       f"2^-14: S is too small.")
    if s > 1 and F.round_to(s / 2 * g, F.FP16) >= F.FP16.smallest_normal:
        return False, f"S/2 = {s / 2:g} already makes S·g normal: S is not the smallest."
    paper = F.round_to(128 * g, F.FP16)
    return True, (f"S = {s:g} = 2^{int(math.log2(s))} makes g normal in FP16. The paper's S = 128 only keeps g "
                  f"from zero: 128·g rounds to {paper!r}, a subnormal with a rounding error of "
                  f"{abs(paper / (128 * g) - 1):.0%}, "
                  "and that was enough to train bigLSTM.")


register(Exercise(
    "8.2", "A loss scale that makes them normal",
    "For the same g = 1/(V·N) as in 8.1, which is the smallest power of two S ≥ 1 for which S·g, rounded to "
    "FP16, is a normal number (at least FP16's smallest normal, 2^-14)? Answer with a float.",
    _ex82_check,
    "Multiplying by 2^j moves a value up j binades and changes none of its bits. How many binades lie between "
    "the binade of g (exercise 8.1) and 2^-14? Check the one below the boundary: rounding can help.",
    _ex82_truth))
