"""Exercises of chapter 8: when FP16 training fails."""

from __future__ import annotations

import math
import numbers

import numpy as np

from .. import formats as F
from ._core import Exercise, register, is_real


def _ex8_gradient() -> float:
    """bigLSTM's typical softmax gradient p/D with p ≈ 1/8,193 (its sampled softmax normalises over the correct
    word and 8,192 sampled ones) and D = 128 (its loss is the mean over the 128 sequences of a batch of the sum
    over their time steps), from :data:`mpt_lab.experiments.biglstm.BIGLSTM`."""
    from ..experiments.biglstm import BIGLSTM

    return 1.0 / (BIGLSTM["softmax_classes"] * BIGLSTM["loss_divisor"])


def _ex8_text() -> dict:
    """The numbers the prompts of 8.1 and 8.2 quote, from :data:`mpt_lab.experiments.biglstm.BIGLSTM`."""
    from ..experiments.biglstm import BIGLSTM

    return {"C": f"{BIGLSTM['softmax_classes']:,}", "K": f"{BIGLSTM['sampled_classes']:,}",
            "B": f"{BIGLSTM['loss_divisor']:,}", "T": f"{BIGLSTM['bptt']:,}", "V": f"{BIGLSTM['vocab_size']:,}"}


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
        return False, (f"g = 1/(C·B) does not lie in [2^{k}, 2^{k + 1}): it is "
                       f"{'larger' if k < truth_k else 'smaller'}.")
    if lost != truth_lost:
        return False, "the binade is right; whether FP16 rounds g to zero is not."
    g16 = F.round_to(_ex8_gradient(), F.FP16)
    return True, (f"g lies in [2^{truth_k}, 2^{truth_k + 1}), and FP16 "
                  f"{'rounds it to zero' if truth_lost else f'stores it as {g16!r}'}: "
                  f"{'it is at or below' if truth_lost else 'it is above'} "
                  f"2^{F.FP16.emin - F.FP16.mantissa_bits - 1}, half the smallest FP16 subnormal.")


_T = _ex8_text()

register(Exercise(
    "8.1", "Where bigLSTM's gradients land",
    f"bigLSTM had a vocabulary of V = {_T['V']} words, but its sampled softmax normalises over the correct word "
    f"and {_T['K']} sampled words only, C = {_T['C']} classes, so a wrong word's probability is p ≈ 1/C. Its loss "
    f"is the mean over the B = {_T['B']} sequences of a batch of the sum over their {_T['T']} time steps, so each "
    "logit gradient is (p − y)/B, and a typical one is g = 1/(C·B). In which binade is g (the int k with "
    "2^k ≤ g < 2^(k+1)), and does FP16 lose it (round it to zero)? Answer with a tuple (k, lost) of an int and a "
    "bool.",
    _ex81_check,
    "log2(g) = −(log2 C + log2 B): both are close to powers of two, but look at which side of them. The smallest "
    "positive FP16 value is 2^-24; round-to-nearest sends a value to zero only at or below half of it.",
    _ex81_truth,
    worked=f"""Take logarithms: log₂ g = −(log₂ C + log₂ B). B = {_T['B']} is a power of two, 2⁷. C = {_T['C']} is \
one more than the power of two 2¹³, so log₂ C is a hair above 13 and g a hair below 2⁻²⁰: g lies in the binade \
[2⁻²¹, 2⁻²⁰), and k is −21, not −20. (Exactly: C·B = 2²⁰ + 2⁷, so g = 2⁻²⁰ / (1 + 2⁻¹³).)

Does FP16 lose it? FP16's smallest positive value is 2⁻²⁴ (a subnormal) and round-to-nearest sends a value to \
zero only when it is at most half of that, 2⁻²⁵. g is four binades above 2⁻²⁴, a subnormal that FP16 keeps, with \
the subnormals' spacing of 2⁻²⁴: it rounds to 2⁻²⁰ itself (16 × 2⁻²⁴), a relative error of about 2⁻¹³.

The answer: {{answer}}. So bigLSTM's typical logit gradient was not lost in FP16: its sampled softmax and its \
division by 128 sequences put it near 2⁻²⁰, where the book's small models have theirs too. An estimate with \
p ≈ 1/V over all {_T['V']} words and all 128 × {_T['T']} tokens would put it near 2⁻³¹, far below FP16's \
range; that is not how bigLSTM computed its loss. The chapter shows what does make a language model's \
gradients underflow: a much larger batch, or (standing for it) the gradient shift."""))


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
    spare = int(math.log2(128 / s))
    return True, (f"S = {s:g} = 2^{int(math.log2(s))} makes g normal in FP16. The paper's loss scale for bigLSTM, "
                  f"S = 128, does too: 128·g rounds to {paper!r}"
                  + (f", {spare} binade{'s' if spare != 1 else ''} above the smallest normal." if spare > 0 else "."))


register(Exercise(
    "8.2", "A loss scale that makes them normal",
    "For the same g = 1/(C·B) as in 8.1, which is the smallest power of two S ≥ 1 for which S·g, rounded to "
    "FP16, is a normal number (at least FP16's smallest normal, 2^-14)? Answer with a float.",
    _ex82_check,
    "Multiplying by 2^j moves a value up j binades and changes none of its bits. How many binades lie between "
    "the binade of g (exercise 8.1) and 2^-14? Check the one below the boundary: rounding can help.",
    _ex82_truth,
    worked="""Multiplying by a power of two S = 2ʲ moves g up j binades and changes none of its significand bits, \
so S·g is exact before it is rounded to FP16. g lies in [2⁻²¹, 2⁻²⁰) (exercise 8.1), just below 2⁻²⁰. FP16's \
smallest normal is 2⁻¹⁴, six binades above 2⁻²⁰.

With j = 7, S·g lies in [2⁻¹⁴, 2⁻¹³): normal, no doubt. With j = 6 it lies just below 2⁻¹⁴, in the subnormal \
range, where FP16's spacing is 2⁻²⁴. But it is only 2⁻¹⁴ × 2⁻¹³ (about 2⁻²⁷) below 2⁻¹⁴, less than half a \
spacing, so it rounds up to 2⁻¹⁴, which is normal. With j = 5 it lies near 2⁻¹⁵, far below. So the smallest S \
is 2⁶: rounding helps by one binade, exactly at the boundary.

```
from mpt_lab.formats import FP16, round_to   # or numpy: float(np.float16(x))

g, S = 1 / (8193 * 128), 1.0
while round_to(S * g, FP16) < FP16.smallest_normal:
    S *= 2
answer = S
```

The answer: {answer}. The paper used S = 128 for bigLSTM: by this estimate it makes the typical logit gradient \
normal with a binade to spare. The typical value does not say why bigLSTM needed a loss scale at all (FP16 keeps \
it even without one, exercise 8.1): a loss scale matters for the values in the tail of the histogram, below the \
typical one, and that tail is what the chapter's histograms measure."""))
