"""Exercises of chapter 4: FP32 master weights."""

from __future__ import annotations

import numpy as np
import torch

from .. import formats as F
from ..master_weights import swamped
from ._core import Exercise, is_real, register


def _ex41_reference(w: float, u: float) -> bool:
    """Whether the update u survives when added to the FP16 weight w (reference solution of exercise 4.1): the
    exact sum w + u rounded once to FP16 changes the weight (:func:`mpt_lab.master_weights.swamped`, which never
    lets a float64 sum round first)."""
    u = float(u)
    return u != 0 and not bool(
        swamped(torch.tensor([float(w)], dtype=torch.float64), torch.tensor([u], dtype=torch.float64), F.FP16)[0]
    )


def _ex41_double_rounding_cases(ws) -> list:
    """(w, u, note) updates a hair above or below half the gap to w's neighbour, where rounding w + u to float32
    (u = half a gap · (1 ± 2⁻¹⁹)) or float64 (1 ± 2⁻⁴⁹) first lands exactly on the FP16 midpoint, and the tie then
    goes to the even neighbour: a double rounding answers wrongly on one side of every pair."""
    cases = []
    for w in ws:
        for direction in (1.0, -1.0):
            toward = float(np.nextafter(np.float16(w), np.float16(direction * np.inf)))
            half = abs(toward - w) / 2
            for k, sum_format in ((19, "float32"), (49, "float64")):
                for side, where in ((1, "above"), (-1, "below")):
                    u = direction * half * (1 + side * 2.0**-k)
                    cases.append(
                        (
                            w,
                            u,
                            f"u is 2^-{k} of half a gap {where} half the gap to w's neighbour: w + u "
                            f"rounded to {sum_format} first lands exactly on the FP16 midpoint, and the "
                            "tie goes to the even neighbour (a double rounding). Form w + u exactly, or "
                            "compare |u| with half the gap.",
                        )
                    )
    return cases


def _ex41_check(fn):
    if not callable(fn):
        return False, "expected a function survives(w, u) -> bool"
    rng = np.random.default_rng(41)
    ws = F.round_to(rng.standard_normal(400) * np.exp2(rng.integers(-8, 8, 400)), F.FP16)
    cases = []
    for w in ws.tolist():
        half = F.ulp(w, F.FP16) / 2
        cases += [(w, half), (w, -half), (w, half * 1.001), (w, half * 0.999), (w, rng.standard_normal() * half * 3)]
    cases += [(1.0, 2.0**-11), (1.0, 2.0**-11 * 1.01), (1024.0, 0.5), (1025.0, 0.5), (1.0, -(2.0**-12))]
    cases = [(w, u, "") for w, u in cases]
    # double rounding: even and odd mantissas, powers of two (a smaller gap below), subnormals
    cases += _ex41_double_rounding_cases(
        [1.0, 1.0 + 2.0**-10, 1024.0, 1025.0, -3.0, 0.5 + 2.0**-11, 2.0**-14, -(2.0**-15), 3 * 2.0**-24]
        + ws[:20].tolist()
    )
    for w, u, note in cases:
        want, got = _ex41_reference(w, u), fn(w, u)
        if not isinstance(got, (bool, np.bool_)) or bool(got) != want:
            return False, f"survives({w!r}, {u!r}) returned {got!r}; expected {want}." + (f" {note}" if note else "")
    return True, f"right on all {len(cases)} cases, ties and near-ties included."


register(
    Exercise(
        "4.1",
        "Does the update survive?",
        "Write survives(w, u) -> bool: True when adding the update u (a float) to the FP16 weight w, the exact sum "
        "w + u rounded once to FP16 (round to nearest even), changes the stored weight (w + u stays within FP16's "
        "range). Use only arithmetic and math/numpy (e.g. numpy.float16), not mpt_lab.",
        _ex41_check,
        "An update is lost when w + u rounds back to w: compare |u| with half the gap between w and its neighbour "
        "on that side. Exactly half a gap is a tie — what decides a tie under round-to-nearest-even? (Letting "
        "numpy.float16 round the float sum w + u rounds twice: that sum is rounded already.)",
        lambda: _ex41_reference,
        worked="""Under round-to-nearest the stored weight w + u is the FP16 value nearest to the exact sum. It is \
still w when the sum is nearer to w than to the neighbour of w on the side u points to. So compare |u| with half \
the gap to that neighbour:

1. |u| smaller than half the gap: the sum rounds back to w, the update is lost (swamped).

2. |u| larger than half the gap: the sum rounds to the neighbour or beyond, the weight changes.

3. |u| exactly half the gap: a tie. Round-to-nearest-even keeps the candidate whose last mantissa bit is 0. The \
update survives exactly when the neighbour is the even one, i.e. when w's own mantissa is odd.

The gap is not the same on both sides: at a power of two the gap below is half the gap above (the binade below \
has half the ulp). For w = 1 an upward update is lost up to 2⁻¹¹, a downward one only up to 2⁻¹².

```python
import numpy as np

def survives(w, u):
    w16 = np.float16(w)
    if u == 0:
        return False
    toward = np.nextafter(w16, np.float16(np.inf if u > 0 else -np.inf))   # the neighbour on u's side
    half_gap = abs(float(toward) - float(w16)) / 2
    if abs(u) != half_gap:
        return bool(abs(u) > half_gap)
    return int(toward.view(np.uint16)) % 2 == 0      # a tie: it goes to the even mantissa
```

Why not let NumPy round the sum, `bool(np.float16(float(w16) + u) != w16)`? Because `float(w16) + u` is a \
float64 sum, rounded before NumPy rounds it again to FP16: a double rounding. For w = 1 and u = 2⁻¹¹ + 2⁻⁶⁰, a \
hair above half the gap, the exact sum rounds up to 1 + 2⁻¹⁰; but the float64 sum drops the 2⁻⁶⁰ and lands \
exactly on the midpoint 1 + 2⁻¹¹, and the tie goes to the even neighbour, 1: the update is wrongly lost. A \
float32 sum goes wrong already for u = 2⁻¹¹ + 2⁻³⁰. The checker tries such updates on both sides of half a gap; \
comparing |u| with half the gap, as above, is exact: no sum is rounded.""",
    )
)


def _ex42_truth() -> float:
    """The FP16 weight after exercise 4.2's 1,000 updates (reference answer), by :func:`mpt_lab.formats.accumulate`."""
    return float(F.accumulate(EX42["start"], EX42["update"], EX42["steps"], F.FP16)[-1])


#: Exercise 4.2: a weight that starts at ``start`` and receives ``update`` at every one of ``steps`` steps.
EX42 = {"start": 0.2, "update": 1e-4, "steps": 1000}


def _ex42_check(a):
    if not is_real(a):
        return False, f"expected a number (the stored FP16 weight), got {type(a).__name__}"
    truth, a = _ex42_truth(), float(a)
    if a == truth:
        stall = int(np.argmax(F.accumulate(EX42["start"], EX42["update"], EX42["steps"], F.FP16) == truth))
        return True, (
            f"the FP16 weight reaches {truth!r} after {stall} steps and stays there; FP32 masters would "
            f"hold {float(F.accumulate(EX42['start'], EX42['update'], EX42['steps'], F.FP32)[-1]):.6g}."
        )
    exact = EX42["start"] + EX42["update"] * EX42["steps"]
    if abs(a - exact) < 1e-3:
        return False, (
            f"{a!r} is what exact (or FP32) arithmetic gives; the FP16 weight stops moving once the "
            "update is smaller than half its ulp."
        )
    if abs(a - EX42["start"]) < 1e-3:
        return False, (
            f"{a!r} means no update ever survived, but near 0.2 half an ulp of FP16 is "
            f"{F.ulp(0.2, F.FP16) / 2!r}, smaller than the update: the first updates do move the weight."
        )
    return False, f"{a!r} is not the stored FP16 weight after {EX42['steps']:,} steps."


register(
    Exercise(
        "4.2",
        "Where pure FP16 weights stop",
        f"A weight stored in FP16 starts at w = {EX42['start']} and every step adds the same update "
        f"u = {EX42['update']:g} (w ← fp16(w + u), round to nearest even, no master copy). What is the stored weight "
        f"after {EX42['steps']:,} steps? Answer with a float.",
        _ex42_check,
        "Follow the ulp: in which binade does w start, how large is half an ulp there compared with u, and what "
        "happens to half an ulp when w crosses a power of two?",
        _ex42_truth,
        worked=f"""Start with the binade. 0.2 lies in [0.125, 0.25), where FP16's ulp is 2⁻³ × 2⁻¹⁰ = 2⁻¹³ = \
{F.ulp(0.2, F.FP16)!r}; the stored start is fp16(0.2) = {F.round_to(0.2, F.FP16)!r}.

While w is in that binade, half an ulp is 2⁻¹⁴ = {F.ulp(0.2, F.FP16) / 2!r}, smaller than u = {EX42["update"]:g}: \
the update survives. But it is rounded: w + u lies between w and w + ulp, nearer to w + ulp (u is more than half \
an ulp), so every step adds a whole ulp, {F.ulp(0.2, F.FP16)!r}, more than the update itself. The weight climbs \
faster than the exact sum, one ulp per step, until it reaches 0.25.

At 0.25 = 2⁻² the binade changes: the ulp doubles to 2⁻¹² = {F.ulp(0.25, F.FP16)!r} and half an ulp, 2⁻¹³ = \
{F.ulp(0.25, F.FP16) / 2!r}, is now larger than u. Every later update rounds back to 0.25: the weight is stuck. \
After {EX42["steps"]:,} steps it is {{answer}}.

With FP32 master weights the same {EX42["steps"]:,} updates add up to \
{float(F.accumulate(EX42["start"], EX42["update"], EX42["steps"], F.FP32)[-1]):.6g} (exact arithmetic: \
{EX42["start"] + EX42["update"] * EX42["steps"]:.6g}), and the FP16 copy made from them is \
{F.round_to(float(F.accumulate(EX42["start"], EX42["update"], EX42["steps"], F.FP32)[-1]), F.FP16)!r}: the \
masters keep what FP16 weights lose, in both directions (the biased climb and the stall).""",
    )
)
