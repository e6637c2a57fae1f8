"""Exercises of chapter 4: FP32 master weights."""

from __future__ import annotations


import numpy as np

from .. import formats as F
from ._core import Exercise, register


def _ex41_reference(w: float, u: float) -> bool:
    """Whether the update u survives when added to the FP16 weight w (reference solution of exercise 4.1)."""
    w16 = F.round_to(float(w), F.FP16)
    return F.round_to(w16 + float(u), F.FP16) != w16


def _ex41_check(fn):
    if not callable(fn):
        return False, "expected a function survives(w, u) -> bool"
    rng = np.random.default_rng(41)
    ws = F.round_to(rng.standard_normal(400) * np.exp2(rng.integers(-8, 8, 400)), F.FP16)
    cases = []
    for w in ws.tolist():
        half = F.ulp(w, F.FP16) / 2
        cases += [(w, half), (w, -half), (w, half * 1.001), (w, half * 0.999), (w, rng.standard_normal() * half * 3)]
    cases += [(1.0, 2.0**-11), (1.0, 2.0**-11 * 1.01), (1024.0, 0.5), (1025.0, 0.5), (1.0, -2.0**-12)]
    for w, u in cases:
        want, got = _ex41_reference(w, u), fn(w, u)
        if not isinstance(got, (bool, np.bool_)) or bool(got) != want:
            return False, f"survives({w!r}, {u!r}) returned {got!r}; expected {want}."
    return True, f"right on all {len(cases)} cases, ties included."


register(Exercise(
    "4.1", "Does the update survive?",
    "Write survives(w, u) -> bool: True when adding the update u to the FP16 weight w (round to nearest even) "
    "changes the stored weight. Use only arithmetic and math/numpy (e.g. numpy.float16), not mpt_lab.",
    _ex41_check,
    "An update is lost when w + u rounds back to w: compare |u| with half the gap between w and its neighbour "
    "on that side. Exactly half a gap is a tie — what decides a tie under round-to-nearest-even? (numpy.float16 "
    "can do the rounding for you, if you form w + u exactly first.)",
    lambda: _ex41_reference))
