"""Exercises of chapter 8: when FP16 training fails."""

from __future__ import annotations

import math
import numbers

import numpy as np

from .. import formats as F
from ..experiments.biglstm import BIGLSTM
from ._core import Exercise, is_real, register


def _ex8_gradient() -> float:
    """The logit gradient g = 1/(V·B) of a frequent word in bigLSTM's sampled softmax at initialisation: a word
    that every sample contains (expected count Q ≈ 1) has p = (1/Q)/Z with Z ≈ V (the log-Q correction of
    TensorFlow's ``sampled_softmax_loss``; :func:`mpt_lab.experiments.biglstm.sampled_softmax_gradients`
    measures Z), and the loss is divided by its B = 128 sequences; from
    :data:`mpt_lab.experiments.biglstm.BIGLSTM`."""
    return 1.0 / (BIGLSTM["vocab_size"] * BIGLSTM["loss_divisor"])


def _ex8_text() -> dict:
    """The numbers the prompts of 8.1 and 8.2 quote, from :data:`mpt_lab.experiments.biglstm.BIGLSTM`."""
    return {
        "K": f"{BIGLSTM['sampled_classes']:,}",
        "B": f"{BIGLSTM['loss_divisor']:,}",
        "T": f"{BIGLSTM['bptt']:,}",
        "V": f"{BIGLSTM['vocab_size']:,}",
        "Vn": str(BIGLSTM["vocab_size"]),
    }


def _ex81_truth() -> tuple:
    """(binade k with 2^k ≤ g < 2^(k+1), whether FP16 rounds g to zero) for bigLSTM's g, by
    :func:`mpt_lab.formats.decompose` and :func:`mpt_lab.formats.round_to`."""
    g = _ex8_gradient()
    return int(F.decompose(g, F.FP64).unbiased_exponent), bool(F.round_to(g, F.FP16) == 0.0)


def _ex81_check(a):
    if not (
        isinstance(a, (tuple, list))
        and len(a) == 2
        and isinstance(a[0], numbers.Integral)
        and not isinstance(a[0], bool)
        and isinstance(a[1], (bool, np.bool_))
    ):
        return False, f"expected a tuple (k, lost) of an int and a bool, got {a!r}"
    k, lost = int(a[0]), bool(a[1])
    truth_k, truth_lost = _ex81_truth()
    if k != truth_k:
        return False, (
            f"g = 1/(V·B) does not lie in [2^{k}, 2^{k + 1}): it is {'larger' if k < truth_k else 'smaller'}."
        )
    if lost != truth_lost:
        return False, "the binade is right; whether FP16 rounds g to zero is not."
    g16 = F.round_to(_ex8_gradient(), F.FP16)
    return True, (
        f"g = 1/(V·B) lies in [2^{truth_k}, 2^{truth_k + 1}), and FP16 "
        f"{'rounds it to zero' if truth_lost else f'stores it as {g16!r}'}: "
        f"{'it is at or below' if truth_lost else 'it is above'} "
        f"2^{F.FP16.emin - F.FP16.mantissa_bits - 1}, half the smallest FP16 subnormal."
    )


_T = _ex8_text()

register(
    Exercise(
        "8.1",
        "Where bigLSTM's gradients land",
        f"bigLSTM's code calls TensorFlow's sampled_softmax_loss with its defaults: at each step it samples "
        f"{_T['K']} of its V = {_T['V']} words and subtracts from every logit the log of the word's expected count Q "
        "(its probability of being in the sample). At initialisation, when all of the model's logits are equal, a "
        "sampled word's probability is then p = (1/Q)/Z, where Z, the sum of 1/Q over the correct word and the "
        "sampled ones, is close to V (the chapter's simulation measures it). The loss is the mean over the "
        f"B = {_T['B']} sequences of a batch of the sum over their {_T['T']} time steps, so each logit gradient is "
        '(p − y)/B. A frequent word such as "the" is in every sample (Q ≈ 1), so its logit gradient is '
        "g = 1/(V·B). In which binade is g (the int k with 2^k ≤ g < 2^(k+1)), and does FP16 lose it (round it to "
        "zero)? Answer with a tuple (k, lost) of an int and a bool.",
        _ex81_check,
        "log2(g) = −(log2 V + log2 B): B is a power of two; V lies between two powers of two. The smallest "
        "positive FP16 value is 2^-24; round-to-nearest sends a value to zero only at or below half of it.",
        _ex81_truth,
        worked=f"""Take logarithms: log₂ g = −(log₂ V + log₂ B). B = {_T["B"]} is 2⁷. V = {_T["V"]} lies between \
2¹⁹ = 524,288 and 2²⁰ = 1,048,576 (log₂ V ≈ 19.6). So log₂ g ≈ −26.6: g lies in the binade [2⁻²⁷, 2⁻²⁶), and \
k is −27.

Does FP16 lose it? FP16's smallest positive value is 2⁻²⁴ (a subnormal), and round-to-nearest sends a value to \
zero when it is at most half of that, 2⁻²⁵. g is more than a binade below 2⁻²⁵: it rounds to zero.

The answer: {{answer}}. So the logit gradients of bigLSTM's frequent words were lost in FP16 from the first step. \
The log-Q correction is why: it makes the sampled softmax an estimate of the full softmax over all {_T["V"]} \
words, so a word that every sample contains gets p ≈ 1/V, not 1/({_T["K"]} + 1). Rare sampled words get 1/Q \
times more: the chapter's simulation puts the median sampled-logit gradient near 2⁻²², and about a fifth of \
them at or below 2⁻²⁵, like g.""",
    )
)


def _ex82_truth() -> float:
    """The smallest power of two S ≥ 1 with S·g not rounded to zero by FP16, for bigLSTM's g
    (:func:`mpt_lab.formats.round_to`)."""
    g, s = _ex8_gradient(), 1.0
    while F.round_to(s * g, F.FP16) == 0:  # s·g is exact: s is a power of two
        s *= 2.0
    return s


def _ex82_check(a):
    if not is_real(a) or not (1 <= a < math.inf) or math.frexp(float(a))[0] != 0.5:
        return False, f"expected a power of two S ≥ 1 (a float such as 1024.0), got {a!r}"
    s, g = float(a), _ex8_gradient()
    if F.round_to(s * g, F.FP16) == 0:
        return False, f"S·g = 2^{math.log2(s * g):.2f} still rounds to 0 in FP16: S is too small."
    if s > 1 and F.round_to(s / 2 * g, F.FP16) != 0:
        return False, f"S/2 = {s / 2:g} already keeps S·g: S is not the smallest."
    kept = F.round_to(s * g, F.FP16)
    paper = F.round_to(128 * g, F.FP16)
    return True, (
        f"S = {s:g} = 2^{int(math.log2(s))}: S·g = 2^{math.log2(s * g):.2f} rounds to {kept:.4g} "
        f"(2^{math.log2(kept):.2f}), off by {abs(kept / (s * g) - 1):.0%}. The paper's loss scale for "
        f"bigLSTM, S = 128, keeps g too, as {paper:.4g} (2^{math.log2(paper):.2f}), off by "
        f"{abs(paper / (128 * g) - 1):.1%}."
    )


register(
    Exercise(
        "8.2",
        "A loss scale that keeps them",
        "For the same g = 1/(V·B) as in 8.1, which is the smallest power of two S ≥ 1 for which FP16 does not round "
        "S·g to zero? Answer with a float.",
        _ex82_check,
        "Multiplying by 2^j moves a value up j binades and changes none of its bits. FP16 rounds to zero at or "
        "below 2^-25: count the binades between g and that line, and check the value just above it.",
        _ex82_truth,
        worked=f"""Multiplying by a power of two S = 2ʲ moves g up j binades and changes none of its significand bits, \
so S·g is exact before it is rounded to FP16. g ≈ 2⁻²⁶·⁶ (exercise 8.1), and FP16 rounds to zero at or below \
2⁻²⁵, half its smallest subnormal 2⁻²⁴.

With j = 1, S·g ≈ 2⁻²⁵·⁶ is still below 2⁻²⁵: zero. With j = 2, S·g ≈ 2⁻²⁴·⁶, about 0.66 × 2⁻²⁴: above the \
halfway point 2⁻²⁵, so it rounds up to 2⁻²⁴, the smallest subnormal. It is kept, but as a value half again \
as large (a rounding error of about 50%): the smallest subnormal has a single significant bit.

```
from mpt_lab.formats import FP16, round_to   # or numpy: float(np.float16(x))

g, S = 1 / ({_T["Vn"]} * 128), 1.0
while round_to(S * g, FP16) == 0:
    S *= 2
answer = S
```

The answer: {{answer}}. The paper used S = 128 for bigLSTM: 128·g ≈ 2⁻¹⁹·⁶ is a subnormal more than four \
binades above 2⁻²⁴, off by at most half the subnormal spacing, 2⁻²⁵, which is 2.4% of it. The chapter's \
simulation finds that S = 128 keeps every sampled-logit gradient of bigLSTM's first step. Whether losing them would have hurt, a \
single step cannot say: the chapter's sweep shows that a large share of lost values alone does little harm (at \
k = 6 most activation-gradient values are zero and the run ends only a few hundredths of a nat behind FP32, as \
asserted there), and that the loss grows as the shift pushes ever larger values under the threshold, consistent \
with the paper's explanation.""",
    )
)
