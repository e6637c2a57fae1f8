"""Exercises of chapter 3: loss scaling."""

from __future__ import annotations

import math

import numpy as np

from .. import formats as F
from .. import scaling
from ._core import Exercise, is_real, register

#: The largest finite float32 value: torch keeps the loss scale in a float32 tensor, so S never grows past it.
FLOAT32_MAX = F.FP32.max


def _ex31_reference(
    scale: float,
    tracker: int,
    found_inf: bool,
    growth_factor: float = 2.0,
    backoff_factor: float = 0.5,
    growth_interval: int = 2000,
) -> tuple:
    """Dynamic loss scaling, one update (reference solution of exercise 3.1): torch.amp.GradScaler's rule,
    :func:`mpt_lab.scaling.update_scale`."""
    return scaling.update_scale(scale, tracker, found_inf, growth_factor, backoff_factor, growth_interval)


def _ex31_diagnose(
    s: float, t: int, found: bool, interval: int, got: tuple, want: tuple, growth: float = 2.0, backoff: float = 0.5
) -> str:
    """What differs between the student's (scale, tracker) and torch's, for one update from the state (s, t)."""
    (s_you, t_you), (s_ref, t_ref) = got, want
    where = (
        f"from scale {s!r}, tracker {t!r}, found_inf={found}, growth_factor={growth!r}, "
        f"backoff_factor={backoff!r}, growth_interval={interval}: you return "
        f"({s_you!r}, {t_you!r}), torch's GradScaler gives ({s_ref!r}, {t_ref!r}). "
    )
    if found:
        if float(s_you) == s_ref:
            return where + "An overflow must also restart the count of clean steps at 0."
        return where + "On an overflow the scale is multiplied by backoff_factor (and the step is skipped)."
    if t + 1 == interval:  # this clean step completes the interval: growth
        if s_ref == s and float(s_you) == s * growth:
            return where + (
                f"Growing would give {s * growth!r}, above the float32 maximum {FLOAT32_MAX!r}: torch "
                "stores S in float32, so it keeps S as it is (and still restarts the count)."
            )
        if float(s_you) == s_ref:
            return where + "After a growth the count of clean steps restarts at 0."
        if float(s_you) == s:
            return where + (
                f"This clean step makes {interval} in a row: the scale grows now "
                "(tracker + 1 == growth_interval), not one step later."
            )
        return where + "A growth multiplies the scale by growth_factor."
    if float(s_you) != s_ref:
        return where + (
            f"Only {t + 1} clean steps in a row so far: the scale changes only after "
            f"growth_interval = {interval} of them."
        )
    return where + "A clean step that does not complete the interval adds one to the count."


def _ex31_check(fn):
    if not callable(fn):
        return (
            False,
            "expected a function update_scale(scale, tracker, found_inf, growth_factor, backoff_factor, "
            "growth_interval) -> (scale, tracker)",
        )
    rng = np.random.default_rng(31)
    # interval 1 last among torch's default factors: with it the count is always 0, so a missing reset shows only
    # in the other two runs, and it reaches the float32 ceiling fastest.  Then other factors (powers of two, so
    # that float64 products are float32 values): growth_factor and backoff_factor must be used, not 2 and 0.5.
    runs = [(3, 2.0, 0.5), (50, 2.0, 0.5), (1, 2.0, 0.5), (2, 4.0, 0.25), (1, 8.0, 0.125)]
    for interval, growth, backoff in runs:
        found = rng.random(600) < 0.04
        found[100:104] = True  # consecutive overflows
        s, t = 2.0**16, 0
        for f in found.tolist():
            want = _ex31_reference(s, t, f, growth, backoff, interval)
            out = fn(s, t, f, growth, backoff, interval)
            if not (isinstance(out, tuple) and len(out) == 2 and is_real(out[0]) and is_real(out[1])):
                return False, f"update_scale must return a (scale, tracker) tuple of two numbers, got {out!r}"
            if float(out[0]) != want[0] or out[1] != want[1]:
                return False, _ex31_diagnose(s, t, f, interval, out, want, growth, backoff)
            s, t = want
    return True, (
        f"your scaler follows torch.amp.GradScaler's rule over {600 * len(runs):,} recorded steps with "
        "three pairs of factors, the float32 ceiling included."
    )


register(
    Exercise(
        "3.1",
        "A dynamic loss scaler",
        "Write update_scale(scale, tracker, found_inf, growth_factor, backoff_factor, growth_interval) -> "
        "(scale, tracker), torch.amp.GradScaler's rule: on overflow multiply the scale by backoff_factor and reset "
        "the count of clean steps (tracker) to 0; otherwise count the step, and when the count reaches "
        "growth_interval multiply the scale by growth_factor and reset the count to 0. torch keeps the scale in "
        "float32: a growth that would take it above the float32 maximum (about 3.4e38; "
        "mpt_lab.exercises.ch03.FLOAT32_MAX) leaves the scale unchanged, and the count still restarts.",
        _ex31_check,
        "Three cases: found_inf → (scale × backoff, 0); tracker + 1 == growth_interval → (scale × growth, 0), or "
        "(scale, 0) if scale × growth > FLOAT32_MAX; else (scale, tracker + 1).",
        lambda: _ex31_reference,
        worked="""Dynamic loss scaling keeps two numbers between iterations: the scale S and the count of clean steps \
in a row (torch calls it the growth tracker). Each iteration ends with one update, in this order:

1. An overflow (some gradient was inf or NaN, so the optimizer step was skipped): S is multiplied by \
`backoff_factor` and the count restarts at 0, because the run of clean steps is broken.

2. Otherwise the step was clean: the count goes up by one. If it now equals `growth_interval`, S is multiplied \
by `growth_factor` and the count restarts at 0, so the next growth again needs `growth_interval` clean steps.

3. torch stores S in a float32 tensor. When S × `growth_factor` would exceed the largest float32 value it would \
become infinity, so torch keeps S as it is (the count still restarts). With the default factor 2 this happens \
only at S = 2¹²⁷, which a run with `growth_interval=1` and few overflows soon reaches: the checker tries that \
too.

```python
FLOAT32_MAX = 3.4028234663852886e38          # the largest finite float32 value

def update_scale(scale, tracker, found_inf, growth_factor=2.0, backoff_factor=0.5, growth_interval=2000):
    if found_inf:                            # overflow: back off, the run of clean steps is broken
        return scale * backoff_factor, 0
    tracker += 1                             # one more clean step
    if tracker == growth_interval:           # a full interval of clean steps: grow, unless S would overflow float32
        grown = scale * growth_factor
        return (grown if grown <= FLOAT32_MAX else scale), 0
    return scale, tracker
```

Two classic mistakes: forgetting to reset the count after an overflow (S then grows too early after the next \
clean steps), and growing one step late (comparing the count with `growth_interval` before adding the current \
step).""",
    )
)


# ------------------------------------------------------------------------------------------------------ 3.2
#: The gradient magnitudes of exercise 3.2 (FP32 values): a tiny one, ordinary ones and a large one.
EX32_GRADIENTS = (1.5 * 2.0**-30, 3.1e-6, 0.02, 0.75, 1023.6)
EX32_TEXT = ", ".join(["1.5 × 2⁻³⁰"] + [f"{g:g}" for g in EX32_GRADIENTS[1:]])


def _ex32_lost(k: int) -> bool:
    """Whether some value of EX32_GRADIENTS rounds to zero in FP16 after × 2^k."""
    return any(F.round_to(g * 2.0**k, F.FP16) == 0 for g in EX32_GRADIENTS)


def _ex32_overflows(k: int) -> bool:
    """Whether some value of EX32_GRADIENTS rounds to infinity in FP16 after × 2^k."""
    return any(math.isinf(F.round_to(g * 2.0**k, F.FP16)) for g in EX32_GRADIENTS)


def _ex32_truth() -> tuple:
    ks = range(-20, 41)
    return min(k for k in ks if not _ex32_lost(k)), max(k for k in ks if not _ex32_overflows(k))


def _ex32_check(a):
    if not (
        isinstance(a, (tuple, list))
        and len(a) == 2
        and all(isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_)) for v in a)
    ):
        return False, f"expected a tuple of two ints (k_min, k_max), got {a!r}"
    k_min, k_max = (int(v) for v in a)
    want_min, want_max = _ex32_truth()
    if (k_min, k_max) == (want_min, want_max):
        return True, (
            f"with S = 2^{k_min} … 2^{k_max} FP16 neither loses nor overflows any of these gradients "
            f"(S = {2**k_min:g} to {2**k_max:g})."
        )
    msgs = []
    if k_min != want_min:
        smallest = min(EX32_GRADIENTS)
        if k_min < want_min:
            msgs.append(
                f"at k = {k_min} the smallest value becomes {smallest * 2.0**k_min!r}, which rounds to "
                f"{F.round_to(smallest * 2.0**k_min, F.FP16)!r} in FP16: it is lost, so k_min is larger"
            )
        else:
            msgs.append(
                f"at k = {k_min - 1} no value is lost yet: a value just above 2⁻²⁵ rounds up to the "
                "smallest subnormal 2⁻²⁴ and is kept, so k_min is smaller"
            )
    if k_max != want_max:
        largest = max(EX32_GRADIENTS)
        if k_max > want_max:
            msgs.append(
                f"at k = {k_max} the largest value becomes {largest * 2.0**k_max!r}, which rounds to "
                f"{F.round_to(largest * 2.0**k_max, F.FP16)!r} in FP16: it overflows, so k_max is smaller"
            )
        else:
            v = largest * 2.0 ** (k_max + 1)
            msgs.append(
                f"at k = {k_max + 1} the largest value becomes {v!r}, which rounds to "
                f"{F.round_to(v, F.FP16)!r} in FP16, not to infinity (only values ≥ 65520 overflow), "
                "so k_max is larger"
            )
    return False, "; ".join(msgs) + "."


def _ex32_worked() -> str:
    """The worked solution of 3.2, its numbers computed here (rounded by mpt_lab.formats, not typed)."""
    k_min, k_max = _ex32_truth()
    small, large = min(EX32_GRADIENTS), max(EX32_GRADIENTS)
    tiny, sub = F.FP16.smallest_subnormal / 2, F.FP16.smallest_subnormal
    top = F.FP16.max + F.ulp(F.FP16.max, F.FP16) / 2  # the midpoint above the largest value
    kept, over = large * 2.0**k_max, large * 2.0 ** (k_max + 1)
    naive_min = min(k for k in range(-20, 41) if small * 2.0**k >= sub)
    naive_max = max(k for k in range(-20, 41) if large * 2.0**k <= F.FP16.max)
    return f"""Only the smallest and the largest value matter: multiplying by 2ᵏ keeps the order of the magnitudes.

The bottom end. FP16's smallest subnormal is 2⁻²⁴ = {sub!r}. A value rounds to zero only when it is at most half \
of that, 2⁻²⁵ = {tiny!r} (exactly 2⁻²⁵ is a tie between 0 and 2⁻²⁴, and 0 is the even one); anything larger \
rounds up to 2⁻²⁴ or beyond. The smallest gradient is 1.5 × 2⁻³⁰, so after × 2ᵏ it is 1.5 × 2ᵏ⁻³⁰, above 2⁻²⁵ \
from k = {k_min} on: 1.5 × 2^{k_min - 30} = {small * 2.0**k_min!r} rounds to \
{F.round_to(small * 2.0**k_min, F.FP16)!r}, while at k = {k_min - 1} the value {small * 2.0 ** (k_min - 1)!r} \
rounds to {F.round_to(small * 2.0 ** (k_min - 1), F.FP16)!r}. (A rule that asks for |x| ≥ 2⁻²⁴ would answer \
k = {naive_min}, one binade too cautious.)

The top end. The largest finite FP16 value is {F.FP16.max:g}. Values below {top:g}, the midpoint between \
{F.FP16.max:g} and 2¹⁶ = {F.FP16.max + F.ulp(F.FP16.max, F.FP16):g} (the next value if the exponent range went on), round down to {F.FP16.max:g}; from \
{top:g} on, round-to-nearest-even gives +inf. 1023.6 × 2^{k_max} = {kept!r} rounds \
to {F.round_to(kept, F.FP16)!r} and is kept; 1023.6 × 2^{k_max + 1} = {over!r} rounds to \
{F.round_to(over, F.FP16)!r}. (A rule that asks for |x| ≤ {F.FP16.max:g} would stop at k = {naive_max}.)

So (k_min, k_max) = {{answer}}: any S from 2^{k_min} = {2**k_min} to 2^{k_max} = {2**k_max} keeps every one \
of these gradients. A window that narrow is why a loss scale chosen from one step's largest gradient alone is \
fragile, and why dynamic loss scaling keeps probing for it."""


register(
    Exercise(
        "3.2",
        "The window of loss scales",
        f"One backward pass produced gradients of these magnitudes (FP32 values): {EX32_TEXT}. With a loss scale "
        "S = 2^k every value is multiplied by 2^k and rounded to FP16 (round to nearest even). Give (k_min, k_max): "
        "the smallest k at which none of the values rounds to zero, and the largest k at which none rounds to "
        "infinity. Answer with a tuple of two ints.",
        _ex32_check,
        "Rounding decides both ends: a non-zero value is lost only when it rounds to 0, i.e. |x| ≤ 2⁻²⁵ (the tie at "
        "2⁻²⁵ goes to the even neighbour, 0); it overflows only when it rounds to infinity, i.e. |x| ≥ 65520 "
        "(halfway between 65504 and the next binade).",
        _ex32_truth,
        worked=_ex32_worked(),
    )
)
