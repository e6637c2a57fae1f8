"""Exercise checks: a student's answer or function goes in, a readable pass/fail with a hint comes out.

    >>> from mpt_lab import exercises
    >>> exercises.check("1.1", 129)          # doctest: +SKIP
    ✅ 1.1 passed: ...

Every expected answer is computed from :mod:`mpt_lab.formats` when the check runs; nothing is typed in.
:func:`solution` returns the reference answer (the tests check that every reference solution passes).
"""

from __future__ import annotations

import html
import math
import numbers
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from . import formats as F

__all__ = ["Feedback", "Exercise", "EXERCISES", "check", "solution", "show", "list_exercises"]


@dataclass(frozen=True)
class Feedback:
    """The outcome of a check: ``passed``, a ``message`` and, when it failed, a ``hint``."""

    exercise: str
    passed: bool
    message: str
    hint: str = ""

    def __bool__(self) -> bool:
        return self.passed

    def __str__(self) -> str:
        head = f"{'✅' if self.passed else '❌'} {self.exercise} {'passed' if self.passed else 'not yet'}: {self.message}"
        return head if self.passed or not self.hint else f"{head}\n   hint: {self.hint}"

    __repr__ = __str__

    def _repr_html_(self) -> str:
        color = "#e6f4e6" if self.passed else "#fbe9e9"
        hint = "" if self.passed or not self.hint else f"<br><i>Hint:</i> {html.escape(self.hint)}"
        return (f'<div style="background:{color};padding:6px 10px;border-radius:4px">'
                f'{"✅" if self.passed else "❌"} <b>{html.escape(self.exercise)}</b> '
                f'{html.escape(self.message)}{hint}</div>')


@dataclass(frozen=True)
class Exercise:
    """One exercise: its prompt, a checker ``answer -> (passed, message)``, a hint and a reference solution."""

    id: str
    title: str
    prompt: str
    checker: Callable[[Any], tuple]
    hint: str
    solution: Callable[[], Any]


EXERCISES: dict[str, Exercise] = {}


def _register(ex: Exercise) -> Exercise:
    EXERCISES[ex.id] = ex
    return ex


def _get(exercise_id) -> Exercise:
    if not isinstance(exercise_id, str):
        raise TypeError(f"exercise_id must be a str such as '1.1', got {type(exercise_id).__name__}")
    if exercise_id not in EXERCISES:
        raise ValueError(f"unknown exercise {exercise_id!r}; expected one of {sorted(EXERCISES)}")
    return EXERCISES[exercise_id]


def check(exercise_id: str, answer: Any) -> Feedback:
    """Check ``answer`` for exercise ``exercise_id`` and return :class:`Feedback` (truthy when passed).

    A wrong type of answer fails with a message saying what was expected; it does not raise.

    Raises
    ------
    TypeError, ValueError
        ``exercise_id`` is not a str or not a known exercise.
    """
    ex = _get(exercise_id)
    try:
        passed, message = ex.checker(answer)
    except Exception as err:  # a student's function may raise anything: report it, do not crash the notebook
        passed, message = False, f"checking raised {type(err).__name__}: {err}"
    return Feedback(ex.id, bool(passed), message, "" if passed else ex.hint)


def solution(exercise_id: str) -> Any:
    """The reference solution of an exercise (a value, or a function for function exercises)."""
    return _get(exercise_id).solution()


def show(exercise_id: str) -> str:
    """The exercise's title and prompt."""
    ex = _get(exercise_id)
    return f"Exercise {ex.id}: {ex.title}\n{ex.prompt}"


def list_exercises(chapter: int | None = None) -> list:
    """Exercise ids, optionally only those of one chapter."""
    return [k for k in EXERCISES if chapter is None or k.split(".")[0] == str(chapter)]


# ----------------------------------------------------------------------------------------------------------
# helpers
# ----------------------------------------------------------------------------------------------------------
def _is_real(x) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, bool)


def _expect_int(answer, truth, what):
    if not isinstance(answer, numbers.Integral) or isinstance(answer, bool):
        return False, f"expected an int ({what}), got {type(answer).__name__}"
    if int(answer) == truth:
        return True, f"{what} is {truth}."
    return False, f"{answer} is not {what}."


def _expect_float(answer, truth, what):
    if not _is_real(answer):
        return False, f"expected a number ({what}), got {type(answer).__name__}"
    if float(answer) == truth:
        return True, f"{what} is {float(truth)!r}."
    return False, f"{float(answer)!r} is not {what}."


# ----------------------------------------------------------------------------------------------------------
# Chapter 1: floating point, bit by bit
# ----------------------------------------------------------------------------------------------------------
def _ex11_truth():
    return F.decompose(6.5, F.BF16).exponent


_register(Exercise(
    "1.1", "A biased exponent",
    "What is the biased exponent field of 6.5 stored in BF16? Answer with an int.",
    lambda a: _expect_int(a, _ex11_truth(), "the biased exponent field of 6.5 in BF16"),
    "Write 6.5 as 1.f × 2^e first; the field stores e + bias, and BF16 has FP32's bias.",
    _ex11_truth))


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


_register(Exercise(
    "1.2", "Round by hand to FP8",
    "Give the bits of 0.3 rounded to nearest (ties to even) in FP8 E4M3, as a str 'S EEEE MMM'.",
    _ex12_check,
    "0.3 = 1.2 × 2^-2. E4M3's bias is 7; with 3 mantissa bits the candidates are 1.125 × 2^-2 and 1.25 × 2^-2.",
    _ex12_truth))


def _ex13_truth():
    v = F.values(F.FP16)
    v = v[v > 0]
    lost = F.round_to(1.0 + v, F.FP16) == 1.0  # 1 + v is exact in float64 for every FP16 v
    return float(v[np.argmax(~lost)])


_register(Exercise(
    "1.3", "The smallest update that survives",
    "What is the smallest positive FP16 value x for which 1 + x, rounded to FP16, is not 1? Answer with a float.",
    lambda a: _expect_float(a, _ex13_truth(), "the smallest FP16 x with fp16(1 + x) ≠ 1"),
    "Half an ulp of 1 in FP16 is 2^-11. Exactly half an ulp is a tie, and ties go to the even neighbour.",
    _ex13_truth))


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
        if not _is_real(got):
            return False, f"fp16_value{(int(sign[c]), int(exp[c]), int(man[c]))} returned {type(got).__name__}, not a float"
        t = truth[c]
        ok = (math.isnan(got) and math.isnan(t)) or (got == t and math.copysign(1, got) == math.copysign(1, t))
        if not ok:
            d = F.Decomposition(c, F.FP16, scalar=True)
            return False, (f"for sign={d.sign}, exponent={d.exponent}, mantissa={d.mantissa} ({d.kind}) "
                           f"you return {got!r}; the stored value is {float(t)!r}.")
    return True, "all 65,536 FP16 bit patterns decode correctly (zeros, subnormals, normals, ±inf, NaN)."


_register(Exercise(
    "1.4", "Decode FP16 yourself",
    "Write fp16_value(sign, exponent, mantissa) -> float from the IEEE 754 formula, without mpt_lab. "
    "It must handle zeros (with their sign), subnormals, normals, infinities and NaN.",
    _ex14_check,
    "Subnormals (exponent field 0) have no implicit 1 and use the exponent emin = 1 − bias = −14, "
    "not 0 − bias; the field 31 encodes infinity (mantissa 0) or NaN.",
    lambda: _ex14_reference))


def _ex15_truth():
    powers = [2.0 ** k for k in range(-30, 11)]
    vanish = [u for u in powers if F.round_to(1024.0 + u, F.FP16) == 1024.0]
    return max(vanish)


_register(Exercise(
    "1.5", "Swamping",
    "A weight w = 1024 is stored in FP16. What is the largest power of two u for which w + u, rounded to "
    "FP16, is still 1024? Answer with a float.",
    lambda a: _expect_float(a, _ex15_truth(), "the largest power of two swamped by 1024 in FP16"),
    "Find the ulp of 1024 in FP16 (1024 = 2^10 and FP16 keeps 10 mantissa bits); an update of half an ulp "
    "is a tie.",
    _ex15_truth))


# ----------------------------------------------------------------------------------------------------------
# Chapter 2: where the gradients go
# ----------------------------------------------------------------------------------------------------------
def _ex21_reference(amax: float, fmt_max: float = 65504.0) -> float:
    """The max-gradient rule (reference solution of exercise 2.1): the largest power of two S with
    amax · S ≤ fmt_max (Micikevicius et al. 2018, §3.2), by :func:`mpt_lab.scaling.max_gradient_scale`.

    ``fmt_max`` is the largest finite value of a format of the catalogue (65504: FP16, 448: E4M3,
    57344: E5M2, …); a limit that is no format's max goes through the same exact rule with the bare limit.
    """
    from . import scaling  # needs torch, which this module (like formats) does not

    fmt = next((f for f in F.FORMATS.values() if f.max == fmt_max), None)
    if fmt is not None:
        return scaling.max_gradient_scale(amax, fmt)
    if not (_is_real(fmt_max) and 0 < fmt_max < math.inf):
        raise ValueError(f"fmt_max must be a positive finite number, got {fmt_max!r}")
    return scaling._largest_power_of_two_scale(amax, float(fmt_max), "fmt_max")


def _ex21_check(fn):
    if not callable(fn):
        return False, f"expected a function choose_scale(amax, fmt_max=65504.0), got {type(fn).__name__}"
    rng = np.random.default_rng(21)
    amaxes = list(np.exp2(rng.uniform(-40, 15, 300))) + [2.0 ** -24, 1.0, 65504.0, 65504.0 / 8, 3.0, 2.0 ** -30 * 1.5]
    for a in amaxes:
        for fmax in (65504.0, 448.0, 57344.0):
            want, got = _ex21_reference(float(a), fmax), fn(float(a), fmax)
            if not _is_real(got) or float(got) != want:
                return False, (f"choose_scale({float(a)!r}, {fmax}) returned {got!r}; expected {want!r} "
                               f"(amax × S = {float(a) * want!r} ≤ {fmax}, and 2S would exceed it).")
    return True, "the max-gradient rule is right for 918 cases (FP16, E4M3 and E5M2 limits, exact powers of two)."


_register(Exercise(
    "2.1", "The max-gradient rule",
    "Write choose_scale(amax, fmt_max=65504.0) -> float: the largest power of two S such that amax × S does "
    "not exceed fmt_max (the largest finite value of the format).",
    _ex21_check,
    "S = 2^k with k = ⌊log2(fmt_max / amax)⌋; beware of floating-point log2 at exact powers of two: check "
    "amax × 2^k ≤ fmt_max and amax × 2^(k+1) > fmt_max (multiplying by a power of two is exact).",
    lambda: _ex21_reference))


def _ex22_reference(exponents, counts, zeros: int, total: int, threshold_log2: int) -> float:
    """Share of all values with |x| < 2^threshold_log2, zeros included (reference solution of exercise 2.2)."""
    exponents, counts = np.asarray(exponents), np.asarray(counts)
    return (int(counts[exponents < threshold_log2].sum()) + zeros) / total


def _ex22_check(fn):
    if not callable(fn):
        return False, "expected a function share_below(exponents, counts, zeros, total, threshold_log2)"
    import torch

    from .histogram import log2_histogram

    rng = np.random.default_rng(22)
    for trial in range(5):
        x = rng.standard_normal(5000) * np.exp2(rng.normal(-28, 7, 5000))
        x[rng.random(5000) < 0.5] = 0
        h = log2_histogram(torch.from_numpy(x.astype(np.float32)))
        for t in (-30, -24, -14, 0):
            want = h.fraction_below(2.0 ** t)
            got = fn(h.exponents, h.counts, h.zeros, h.total, t)
            if not _is_real(got) or not math.isclose(float(got), want, rel_tol=1e-12, abs_tol=1e-15):
                return False, f"for threshold 2^{t} you return {got!r}; the share is {want!r}."
    return True, "your shares match Log2Histogram.fraction_below on 5 histograms and 4 thresholds."


_register(Exercise(
    "2.2", "Reading a log2 histogram",
    "Write share_below(exponents, counts, zeros, total, threshold_log2) -> float: the share of all values "
    "with |x| < 2^threshold_log2, zeros included. Bin k of counts holds 2^k ≤ |x| < 2^(k+1).",
    _ex22_check,
    "A bin lies entirely below 2^t exactly when its k < t; add the zeros and divide by the total.",
    lambda: _ex22_reference))


# ----------------------------------------------------------------------------------------------------------
# Chapter 3: loss scaling
# ----------------------------------------------------------------------------------------------------------
def _ex31_reference(scale: float, tracker: int, found_inf: bool, growth_factor: float = 2.0,
                    backoff_factor: float = 0.5, growth_interval: int = 2000) -> tuple:
    """Dynamic loss scaling, one update (reference solution of exercise 3.1): torch.amp.GradScaler's rule,
    :func:`mpt_lab.scaling.update_scale`."""
    from . import scaling  # needs torch, which this module (like formats) does not

    return scaling.update_scale(scale, tracker, found_inf, growth_factor, backoff_factor, growth_interval)


def _ex31_check(fn):
    if not callable(fn):
        return False, "expected a function update_scale(scale, tracker, found_inf, growth_factor, backoff_factor, " \
                      "growth_interval) -> (scale, tracker)"
    rng = np.random.default_rng(31)
    for interval in (1, 3, 50):
        found = rng.random(600) < 0.04
        found[100:104] = True                              # consecutive overflows
        s_ref = s_you = 2.0 ** 16
        t_ref = t_you = 0
        for i, f in enumerate(found.tolist()):
            s_ref, t_ref = _ex31_reference(s_ref, t_ref, f, 2.0, 0.5, interval)
            out = fn(s_you, t_you, f, 2.0, 0.5, interval)
            if not (isinstance(out, tuple) and len(out) == 2):
                return False, f"update_scale must return a (scale, tracker) tuple, got {out!r}"
            s_you, t_you = out
            if float(s_you) != s_ref or int(t_you) != t_ref:
                return False, (f"growth_interval={interval}, step {i} (found_inf={f}): you have scale {s_you!r}, "
                               f"tracker {t_you!r}; expected {s_ref!r}, {t_ref!r}.")
    return True, "your scaler follows torch.amp.GradScaler's rule over 1,800 recorded steps."


_register(Exercise(
    "3.1", "A dynamic loss scaler",
    "Write update_scale(scale, tracker, found_inf, growth_factor, backoff_factor, growth_interval) -> "
    "(scale, tracker): on overflow multiply the scale by backoff_factor and reset the count of clean steps; "
    "otherwise count the step, and after growth_interval consecutive clean steps multiply the scale by "
    "growth_factor and reset the count.",
    _ex31_check,
    "Three cases: found_inf → (scale × backoff, 0); tracker + 1 == growth_interval → (scale × growth, 0); "
    "else (scale, tracker + 1).",
    lambda: _ex31_reference))


# ----------------------------------------------------------------------------------------------------------
# Chapter 4: FP32 master weights
# ----------------------------------------------------------------------------------------------------------
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


_register(Exercise(
    "4.1", "Does the update survive?",
    "Write survives(w, u) -> bool: True when adding the update u to the FP16 weight w (round to nearest even) "
    "changes the stored weight. Use only arithmetic and math/numpy (e.g. numpy.float16), not mpt_lab.",
    _ex41_check,
    "Compare |u| with half an ulp of w; exactly half an ulp is a tie, decided by whether w's mantissa is even. "
    "Or let numpy.float16 do the rounding: np.float16(np.float64(w) + u) != np.float16(w).",
    lambda: _ex41_reference))
