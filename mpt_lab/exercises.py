"""Exercise checks: a student's answer or function goes in, a readable pass/fail with a hint comes out.

    >>> from mpt_lab import exercises
    >>> exercises.check("1.1", 129)          # doctest: +SKIP
    ✅ 1.1 passed: ...

Every expected answer is computed by the package (:mod:`mpt_lab.formats`, :mod:`mpt_lab.scaling`,
:mod:`mpt_lab.autocast`, ...) when the check runs; nothing is typed in. :func:`solution` returns the reference
answer (the tests check that every reference solution passes); references call the package's public functions.

An exercise not answered yet (the answer is ``None``, or a function whose first call raises
``NotImplementedError``, as the notebooks' templates do) gets a neutral "your answer goes here", not a failure.
"""

from __future__ import annotations

import copy
import functools
import html
import math
import numbers
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from . import formats as F

__all__ = ["Feedback", "Exercise", "EXERCISES", "check", "solution", "show", "list_exercises",
           "UNANSWERED_VALUE", "UNANSWERED_FUNCTION"]


@dataclass(frozen=True)
class Feedback:
    """The outcome of a check: ``passed``, a ``message`` and, when it failed, a ``hint``.

    ``answered`` is False for an exercise not answered yet (see :func:`check`): it is falsy like a failure
    but renders neutrally (grey, "your answer goes here", no hint yet) instead of as a red ❌.
    """

    exercise: str
    passed: bool
    message: str
    hint: str = ""
    answered: bool = True

    def __bool__(self) -> bool:
        return self.passed

    def _status(self) -> tuple:
        """(icon, status words, HTML background) of this outcome."""
        if not self.answered:
            return "✏️", "not answered yet", "#f0f0f0"
        return ("✅", "passed", "#e6f4e6") if self.passed else ("❌", "not yet", "#fbe9e9")

    def __str__(self) -> str:
        icon, status, _ = self._status()
        head = f"{icon} {self.exercise} {status}: {self.message}"
        return head if self.passed or not self.hint else f"{head}\n   hint: {self.hint}"

    __repr__ = __str__

    def _repr_html_(self) -> str:
        icon, _, color = self._status()
        hint = "" if self.passed or not self.hint else f"<br><i>Hint:</i> {html.escape(self.hint)}"
        style = f"background:{color};padding:6px 10px;border-radius:4px"
        if not self.answered:
            style += ";color:#555;border:1px dashed #bbb"
        return (f'<div style="{style}">{icon} <b>{html.escape(self.exercise)}</b> '
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


#: What an unanswered exercise says, for a value and for a function.
UNANSWERED_VALUE = "your answer goes here. Replace None with your answer and run the cell again."
UNANSWERED_FUNCTION = ("your answer goes here. Write the function's body (its first call still raises "
                       "NotImplementedError) and run the cell again.")


def _watch_first_call(fn: Callable) -> tuple:
    """``fn`` wrapped so that it records whether its first call raised NotImplementedError: (wrapper, record)."""
    record = {"calls": 0, "not_implemented": False}

    def watched(*args, **kwargs):
        record["calls"] += 1
        try:
            return fn(*args, **kwargs)
        except NotImplementedError:
            if record["calls"] == 1:
                record["not_implemented"] = True
            raise

    functools.update_wrapper(watched, fn, updated=())
    return watched, record


def check(exercise_id: str, answer: Any) -> Feedback:
    """Check ``answer`` for exercise ``exercise_id`` and return :class:`Feedback` (truthy when passed).

    A wrong type of answer fails with a message saying what was expected; it does not raise. An answer that
    is ``None``, or a function whose first call raises ``NotImplementedError`` (the notebooks' templates),
    is *not answered yet*: the Feedback is falsy, with ``answered=False``, and renders neutrally ("your answer
    goes here") without the hint. A function that raises ``NotImplementedError`` only on a later call has
    been answered in part, and fails.

    Raises
    ------
    TypeError, ValueError
        ``exercise_id`` is not a str or not a known exercise.
    """
    ex = _get(exercise_id)
    if answer is None:
        return Feedback(ex.id, False, UNANSWERED_VALUE, answered=False)
    record = None
    if callable(answer):
        answer, record = _watch_first_call(answer)
    try:
        passed, message = ex.checker(answer)
    except Exception as err:  # a student's function may raise anything: report it, do not crash the notebook
        passed, message = False, f"checking raised {type(err).__name__}: {err}"
    if record is not None and record["not_implemented"]:
        return Feedback(ex.id, False, UNANSWERED_FUNCTION, answered=False)
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


def _as_list(answer):
    """A list of the entries of a list, tuple or 1-D NumPy array; None for anything else."""
    if isinstance(answer, np.ndarray):
        return answer.tolist() if answer.ndim == 1 else None
    return list(answer) if isinstance(answer, (list, tuple)) else None


def _short(values, n: int = 6) -> str:
    """At most ``n`` numbers of a sequence, for a message."""
    values = [float(v) for v in values]
    text = ", ".join(f"{v:g}" for v in values[:n])
    return f"[{text}{', …' if len(values) > n else ''}] ({len(values)} values)" if len(values) > n else f"[{text}]"


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
    return scaling.largest_power_of_two_scale(amax, float(fmt_max), "fmt_max")


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
    "An update is lost when w + u rounds back to w: compare |u| with half the gap between w and its neighbour "
    "on that side. Exactly half a gap is a tie — what decides a tie under round-to-nearest-even? (numpy.float16 "
    "can do the rounding for you, if you form w + u exactly first.)",
    lambda: _ex41_reference))


# ----------------------------------------------------------------------------------------------------------
# Chapter 5: automatic mixed precision in practice
# ----------------------------------------------------------------------------------------------------------
#: The ops of exercise 5.1 (names of :data:`mpt_lab.autocast.OPS`) and the expression each one stands for.
_EX51_OPS = {
    "matmul (@)": "x @ w",
    "relu": "torch.relu(x)",
    "add (x + x)": "x + x",
    "exp": "torch.exp(x)",
    "softmax": "torch.softmax(x, -1)",
    "linear → relu": "torch.relu(F.linear(x, w))",
    "linear → softmax": "torch.softmax(F.linear(x, w), -1)",
    "elu": "F.elu(x)",
    "mul + sum (a·Wh)": "(x * x).sum(-1)",
}


def _ex51_truth() -> dict:
    """op name → the dtype name it returns under CUDA float16 autocast from float16 inputs, probed from
    PyTorch's dispatcher by :func:`mpt_lab.autocast.probe_autocast` (on fake CUDA tensors without a GPU)."""
    import torch

    from .autocast import probe_autocast

    return dict(probe_autocast("cuda", torch.float16, input_dtype=torch.float16, ops=tuple(_EX51_OPS)).ops)


def _dtype_name(value):
    """"float16"/"float32" from a str ("float16", "torch.float16") or a torch.dtype; None for anything else."""
    import torch

    if isinstance(value, torch.dtype):
        value = str(value)
    if not isinstance(value, str):
        return None
    name = value.strip().removeprefix("torch.")
    return name if name in ("float16", "float32") else None


def _ex51_check(a):
    keys = list(_EX51_OPS)
    if not isinstance(a, dict):
        return False, (f'expected a dict {{op name: "float16" or "float32"}} with the keys {keys}, '
                       f"got {type(a).__name__}")
    missing, unknown = [k for k in keys if k not in a], [k for k in a if k not in _EX51_OPS]
    if missing or unknown:
        return False, (f"expected a dict with exactly the keys {keys}"
                       + (f"; missing: {missing}" if missing else "") + (f"; not asked: {unknown}" if unknown else ""))
    names = {k: _dtype_name(a[k]) for k in keys}
    bad = [k for k in keys if names[k] is None]
    if bad:
        return False, f'expected "float16" or "float32" (or torch.float16 / torch.float32) as each value; not so for {bad}'
    truth = _ex51_truth()
    wrong = [k for k in keys if names[k] != truth[k]]
    if wrong:
        return False, (f"{len(wrong)} of the {len(keys)} dtypes are not what torch.autocast('cuda', "
                       "dtype=torch.float16) returns from float16 inputs.")
    low = [k for k in keys if truth[k] == "float16"]
    return True, (f"all {len(keys)} right: autocast's CUDA policy returns float16 for {', '.join(low)} and runs "
                  "the others in float32, even from float16 inputs.")


_register(Exercise(
    "5.1", "Read autocast's CUDA policy",
    "Under torch.autocast(\"cuda\", dtype=torch.float16), with float16 inputs x [8, 16] and w [16, 16], which "
    "dtype does each of these ops return? " + "; ".join(f"{k!r}: {v}" for k, v in _EX51_OPS.items())
    + ". Answer with a dict {op name: \"float16\" or \"float32\"} with exactly these keys (the names of "
    "mpt_lab.autocast.OPS). Predict first, then compare with the chapter's table.",
    _ex51_check,
    "Autocast sorts ops into three groups on CUDA: ops it casts to float16 (matrix products, convolutions), "
    "ops it runs in float32 whatever their input (exponentials, reductions, normalisations, losses), and ops "
    "it leaves alone, which return their input's dtype. For a chain, the last op decides.",
    _ex51_truth))


#: Exercise 5.2's GradScaler and overflow pattern (iterations counted from 1).
_EX52 = {"init_scale": 1024.0, "growth_factor": 2.0, "backoff_factor": 0.5, "growth_interval": 3,
         "iterations": 12, "overflows": (5, 6, 11)}


def _ex52_truth() -> list:
    """The loss scale of each iteration, from running :class:`mpt_lab.scaling.GradScaler` on a one-weight model
    whose gradient is inf in the overflow iterations (the scaler's ``history``)."""
    import torch

    from .scaling import GradScaler

    c = _EX52
    w = torch.nn.Parameter(torch.ones(1))
    opt = torch.optim.SGD([w], lr=0.0)
    scaler = GradScaler(init_scale=c["init_scale"], growth_factor=c["growth_factor"],
                        backoff_factor=c["backoff_factor"], growth_interval=c["growth_interval"])
    for i in range(1, c["iterations"] + 1):
        g = math.inf if i in c["overflows"] else 1.0
        scaler.scale((w * g).sum()).backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad(set_to_none=True)
    return [scale for _, scale, _ in scaler.history]


def _ex52_check(a):
    n = _EX52["iterations"]
    values = _as_list(a)
    if values is None or len(values) != n or not all(_is_real(v) for v in values):
        shape = f"{len(values)} entries" if values is not None else type(a).__name__
        return False, f"expected a list of {n} numbers (the loss scale of iterations 1 to {n}), got {shape}"
    truth = _ex52_truth()
    for i, (got, want) in enumerate(zip(values, truth), 1):
        if float(got) != want:
            right = f"iterations 1–{i - 1} are right" if i > 1 else "iteration 1 uses init_scale"
            return False, f"iteration {i} is the first whose loss scale is not right ({right})."
    return True, (f"the loss scales {', '.join(f'{v:g}' for v in truth)} are what mpt_lab.scaling.GradScaler "
                  "(torch.amp.GradScaler's rule) uses; the steps of iterations "
                  f"{', '.join(map(str, _EX52['overflows']))} are skipped.")


_register(Exercise(
    "5.2", "Follow a GradScaler",
    f"A GradScaler(init_scale={_EX52['init_scale']}, growth_factor={_EX52['growth_factor']}, "
    f"backoff_factor={_EX52['backoff_factor']}, growth_interval={_EX52['growth_interval']}) runs "
    f"{_EX52['iterations']} iterations of scaler.scale(loss).backward(), scaler.step(opt), scaler.update(). "
    f"The gradients contain inf in iterations {', '.join(map(str, _EX52['overflows']))} (counting from 1) and "
    "are finite in all others. By which loss scale S is the loss multiplied in each iteration? Answer with a "
    f"list of {_EX52['iterations']} floats, iteration 1 first.",
    _ex52_check,
    "S changes only in update(), at the end of an iteration, and the new S is used from the next iteration "
    "on. Keep a count of clean iterations since the start or the last overflow; an overflow empties it.",
    _ex52_truth))


# ----------------------------------------------------------------------------------------------------------
# Chapter 6: memory
# ----------------------------------------------------------------------------------------------------------
def _tensor_bytes(t) -> int:
    return t.numel() * t.element_size()


def _ex61_truth() -> dict:
    """Bytes per parameter of weights, gradients and Adam's state after one step of a real model (an MLP of
    82,240 parameters): FP32 training from its tensors' ``element_size()``, mixed precision from
    :meth:`mpt_lab.master_weights.MasterWeightTrainer.memory_per_parameter`."""
    import torch
    import torch.nn.functional as Fn
    from torch import nn

    from .master_weights import MasterWeightTrainer

    def model():
        return nn.Sequential(nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 64))

    def adam(params):
        return torch.optim.Adam(params, lr=1e-3)

    g = torch.Generator().manual_seed(61)
    x, y = torch.randn(8, 256, generator=g), torch.randn(8, 64, generator=g)
    with torch.random.fork_rng(devices=[]):        # leave the student's random state alone
        net = model()
        opt = adam(net.parameters())
        Fn.mse_loss(net(x), y).backward()
        opt.step()
        params = list(net.parameters())
        state = sum(_tensor_bytes(v) for p in params for v in opt.state[p].values() if isinstance(v, torch.Tensor))
        fp32 = (sum(_tensor_bytes(p) + _tensor_bytes(p.grad) for p in params) + state) / sum(p.numel() for p in params)
        trainer = MasterWeightTrainer(model(), adam, Fn.mse_loss)
        trainer.train_step(x, y)
        mixed = trainer.memory_per_parameter()["total"]
    return {"fp32": fp32, "mixed": mixed}


def _ex61_check(a):
    if not isinstance(a, dict) or set(a) != {"fp32", "mixed"} or not all(_is_real(v) for v in a.values()):
        got = f"a dict with keys {sorted(a, key=str)}" if isinstance(a, dict) else type(a).__name__
        return False, f'expected a dict {{"fp32": number, "mixed": number}} (bytes per parameter), got {got}'
    truth = _ex61_truth()
    wrong = [f"{k!r} is too {'high' if a[k] > truth[k] else 'low'}" for k in ("fp32", "mixed")
             if abs(float(a[k]) - truth[k]) >= 0.01]
    if wrong:
        return False, "; ".join(wrong) + " (measured on a real model after one Adam step)."
    return True, (f"FP32 training with Adam keeps {truth['fp32']:.2f} bytes per parameter, mixed precision with FP32 "
                  f"master weights {truth['mixed']:.2f} (measured after one step; Adam's step counters add the "
                  "last digits): the masters cost memory, the savings come from the activations.")


_register(Exercise(
    "6.1", "Bytes per parameter",
    "A large model is trained with Adam. FP32 training keeps per parameter the FP32 weight, its FP32 gradient "
    "and Adam's state. Mixed precision with FP32 master weights (the paper's loop, as "
    "mpt_lab.master_weights.MasterWeightTrainer runs it) keeps the FP32 master weight, the FP16 copy, the "
    "FP16 gradient, the FP32 gradient and Adam's state. How many bytes per parameter do these take in total, "
    "in each case (activations not counted; Adam's one step counter per tensor is negligible)? Answer with a "
    'dict {"fp32": number, "mixed": number}.',
    _ex61_check,
    "Add up element sizes: an FP32 value takes 4 bytes, an FP16 value 2. Adam keeps two running averages per "
    "parameter (exp_avg and exp_avg_sq); ask yourself in which dtype, given which weights it updates.",
    _ex61_truth))


def _ex62_models() -> dict:
    """The models exercise 6.2 is checked on (more than 100,000 parameters each, so headers stay below 5 %)."""
    import torch
    from torch import nn

    with torch.random.fork_rng(devices=[]):
        return {
            "an MLP 512 → 512 → 10": nn.Sequential(nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10)),
            "a CNN with BatchNorm": nn.Sequential(
                nn.Conv2d(3, 64, 3), nn.BatchNorm2d(64), nn.ReLU(), nn.Conv2d(64, 256, 3), nn.BatchNorm2d(256),
                nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(256, 10)),
            "a 2-layer LSTM 128 → 256": nn.LSTM(128, 256, num_layers=2),
            "an Embedding(5000, 64)": nn.Embedding(5000, 64),
            "a TransformerEncoderLayer(128, 4, 512)": nn.TransformerEncoderLayer(128, 4, 512),
        }


def _ex62_reference(model, dtype) -> int:
    """Bytes that ``torch.save`` writes for the state_dict in ``dtype`` (reference solution of exercise 6.2):
    :func:`mpt_lab.experiments.memory_tradeoffs.checkpoint_bytes`, which saves it and measures."""
    from .experiments.memory_tradeoffs import checkpoint_bytes

    return checkpoint_bytes(model, dtype)


def _ex62_check(fn):
    if not callable(fn):
        return False, f"expected a function checkpoint_size(model, dtype) -> int, got {type(fn).__name__}"
    import torch

    from .experiments.memory_tradeoffs import checkpoint_bytes

    models = _ex62_models()
    for name, model in models.items():
        for dtype in (torch.float32, torch.float16, torch.bfloat16):
            want = checkpoint_bytes(model, dtype)
            got = fn(copy.deepcopy(model), dtype)       # a copy: a function that casts the model in place is harmless
            if not _is_real(got):
                return False, f"checkpoint_size({name}, {dtype}) returned {type(got).__name__}, not a number of bytes"
            if not abs(float(got) - want) <= 0.05 * want:
                return False, (f"checkpoint_size({name}, {dtype}) returned {got!r}; torch.save writes {want:,} bytes "
                               f"({float(got) / want - 1:+.0%}).")
    return True, (f"within 5 % of the file torch.save writes for {len(models)} models in float32, float16 and "
                  "bfloat16: a checkpoint is its tensors' bytes, and FP16 halves it.")


_register(Exercise(
    "6.2", "The size of a checkpoint",
    "Write checkpoint_size(model, dtype) -> int: an estimate of the bytes that torch.save(state) writes, where "
    "state is model.state_dict() with every floating-point tensor cast to dtype (torch.float32, torch.float16 "
    "or torch.bfloat16) and integer tensors kept as they are. Estimates within 5 % of the measured file pass "
    "(the file adds a few kilobytes of names and headers; the check uses models of more than 100,000 "
    "parameters, each in the three dtypes).",
    _ex62_check,
    "The file is almost only tensor data: for each entry of the state_dict, its number of elements times the "
    "bytes of one element of the dtype it is saved in (torch.empty((), dtype=dtype).element_size()). Buffers "
    "such as BatchNorm's running statistics are in the state_dict too.",
    lambda: _ex62_reference))


# ----------------------------------------------------------------------------------------------------------
# Chapter 7: when FP16 training fails
# ----------------------------------------------------------------------------------------------------------
def _ex7_gradient() -> float:
    """bigLSTM's typical softmax gradient 1/(V·N) (p ≈ 1/V, N tokens per batch), from
    :data:`mpt_lab.experiments.biglstm.BIGLSTM`."""
    from .experiments.biglstm import BIGLSTM

    return 1.0 / (BIGLSTM["vocab_size"] * BIGLSTM["tokens_per_batch"])


def _ex71_truth() -> tuple:
    """(binade k with 2^k ≤ g < 2^(k+1), whether FP16 rounds g to zero) for bigLSTM's g, by
    :func:`mpt_lab.formats.decompose` and :func:`mpt_lab.formats.round_to`."""
    g = _ex7_gradient()
    return int(F.decompose(g, F.FP64).unbiased_exponent), bool(F.round_to(g, F.FP16) == 0.0)


def _ex71_check(a):
    if not (isinstance(a, (tuple, list)) and len(a) == 2 and isinstance(a[0], numbers.Integral)
            and not isinstance(a[0], bool) and isinstance(a[1], (bool, np.bool_))):
        return False, f"expected a tuple (k, lost) of an int and a bool, got {a!r}"
    k, lost = int(a[0]), bool(a[1])
    truth_k, truth_lost = _ex71_truth()
    if k != truth_k:
        return False, (f"g = 1/(V·N) does not lie in [2^{k}, 2^{k + 1}): it is "
                       f"{'larger' if k < truth_k else 'smaller'}.")
    if lost != truth_lost:
        return False, "the binade is right; whether FP16 rounds g to zero is not."
    g16 = F.round_to(_ex7_gradient(), F.FP16)
    return True, (f"g lies in [2^{truth_k}, 2^{truth_k + 1}), and FP16 "
                  f"{'rounds it to zero' if truth_lost else f'stores it as {g16!r}'}: "
                  f"{'it is at or below' if truth_lost else 'it is above'} "
                  f"2^{F.FP16.emin - F.FP16.mantissa_bits - 1}, half the smallest FP16 subnormal.")


_register(Exercise(
    "7.1", "Where bigLSTM's gradients land",
    "bigLSTM had a vocabulary of V = 793,471 words and N = 128 × 20 = 2,560 tokens per batch. The softmax "
    "gradient of a wrong word is p/N with p ≈ 1/V, so a typical value is g = 1/(V·N). In which binade is g "
    "(the int k with 2^k ≤ g < 2^(k+1)), and does FP16 lose it (round it to zero)? Answer with a tuple "
    "(k, lost) of an int and a bool.",
    _ex71_check,
    "log2(g) = −(log2 V + log2 N), and 2^10 ≈ 10^3 gives a first estimate (then use math.log2). "
    "The smallest positive FP16 value is 2^-24; where does round-to-nearest send a value below it?",
    _ex71_truth))


def _ex72_truth() -> float:
    """The smallest power of two S ≥ 1 with S·g rounded to FP16 ≥ FP16's smallest normal, for bigLSTM's g
    (:func:`mpt_lab.formats.round_to`, :attr:`FloatFormat.smallest_normal`)."""
    g, s = _ex7_gradient(), 1.0
    while F.round_to(s * g, F.FP16) < F.FP16.smallest_normal:   # s·g is exact: s is a power of two
        s *= 2.0
    return s


def _ex72_check(a):
    if not _is_real(a) or not (1 <= a < math.inf) or math.frexp(float(a))[0] != 0.5:
        return False, f"expected a power of two S ≥ 1 (a float such as 1024.0), got {a!r}"
    s, g = float(a), _ex7_gradient()
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


_register(Exercise(
    "7.2", "A loss scale that makes them normal",
    "For the same g = 1/(V·N) as in 7.1, which is the smallest power of two S ≥ 1 for which S·g, rounded to "
    "FP16, is a normal number (at least FP16's smallest normal, 2^-14)? Answer with a float.",
    _ex72_check,
    "Multiplying by 2^j moves a value up j binades and changes none of its bits. How many binades lie between "
    "the binade of g (exercise 7.1) and 2^-14? Check the one below the boundary: rounding can help.",
    _ex72_truth))


# ----------------------------------------------------------------------------------------------------------
# Chapter 8: graphs in half precision
# ----------------------------------------------------------------------------------------------------------
#: Exercise 8.1's attention logits.
_EX81_LOGITS = (-20.0, 0.0, 5.5, 10.5, 11.0, 11.08, 11.1, 12.0, 16.0)


def _ex81_exp() -> list:
    """exp of each logit in float16 (torch.exp on a float16 tensor), as floats."""
    import torch

    return torch.exp(torch.tensor(_EX81_LOGITS, dtype=torch.float16)).tolist()


def _ex81_truth() -> list:
    """Whether exp of each logit overflows in float16."""
    return [math.isinf(v) for v in _ex81_exp()]


def _ex81_check(a):
    n = len(_EX81_LOGITS)
    values = _as_list(a)
    if values is None or len(values) != n or not all(isinstance(v, (bool, np.bool_)) for v in values):
        shape = f"{len(values)} entries" if values is not None else type(a).__name__
        return False, f"expected a list of {n} bools (True where exp overflows), one per logit, got {shape}"
    truth = _ex81_truth()
    wrong = sum(bool(v) != t for v, t in zip(values, truth))
    if wrong:
        return False, f"{wrong} of the {n} entries are not right."
    over = [f"{e:g}" for e, t in zip(_EX81_LOGITS, truth) if t]
    under = [f"{e:g}" for e, v in zip(_EX81_LOGITS, _ex81_exp()) if v == 0]
    return True, (f"exp overflows FP16 for {', '.join(over)}: ln(65504) ≈ {math.log(F.FP16.max):.4f}, and a logit "
                  "is rounded to FP16 before exp sees it."
                  + (f" (exp of {', '.join(under)} underflows to 0 instead: no trouble for a softmax.)"
                     if under else ""))


_register(Exercise(
    "8.1", "Which attention logits overflow?",
    f"These attention logits are stored in float16 and exponentiated in float16 (torch.exp on a float16 tensor): "
    f"{list(_EX81_LOGITS)}. Which results are inf? Answer with a list of {len(_EX81_LOGITS)} bools, True where "
    "exp overflows, in the order of the logits.",
    _ex81_check,
    "FP16's largest finite value is 65504; which x has exp(x) = 65504? A logit is rounded to float16 first "
    "(between 8 and 16, FP16 values are 2^-7 apart), and exp's result is rounded to nearest too.",
    _ex81_truth))


def _ex82_reference(e):
    """Softmax over one node's incoming edges in float16, the maximum subtracted first (reference solution
    of exercise 8.2): PyTorch Geometric's softmax, via :func:`mpt_lab.experiments.gat_amp.attention_overflow`."""
    import torch

    from .experiments.gat_amp import attention_overflow

    return torch.tensor(attention_overflow(e.float())["max_subtracted_fp16"], dtype=torch.float16)


def _ex82_cases() -> list:
    """Sets of float16 logits: ordinary ones, ones whose exp overflows FP16, FP32 too, ties, single edges."""
    rng = np.random.default_rng(82)
    cases = [[12.0, 11.0, 0.0], [300.0, 299.0, -5.0], [5.0], [-1000.0, 1000.0], [11.5] * 4, [0.0, 0.0]]
    for i in range(60):
        n = int(rng.integers(1, 50))
        cases.append([rng.normal(0, 3, n), rng.normal(12, 2, n), rng.uniform(-5, 300, n),
                      np.full(n, rng.uniform(-50, 50)), rng.uniform(-1000, 1000, n)][i % 5].tolist())
    return cases


def _ex82_check(fn):
    if not callable(fn):
        return False, f"expected a function safe_softmax(e) -> float16 Tensor, got {type(fn).__name__}"
    import torch

    cases = _ex82_cases()
    for logits in cases:
        e = torch.tensor(logits, dtype=torch.float16)
        ref = torch.softmax(e.float(), 0)
        got = fn(e.clone())
        where = f"safe_softmax of the logits {_short(e.tolist())}"
        if not isinstance(got, torch.Tensor) or got.dtype != torch.float16 or got.shape != e.shape:
            what = f"a {got.dtype} tensor of shape {tuple(got.shape)}" if isinstance(got, torch.Tensor) else \
                type(got).__name__
            return False, f"{where} returned {what}; expected a float16 tensor of shape {tuple(e.shape)}."
        err = (got.float() - ref).abs()
        if not bool(torch.isfinite(got).all()) or float(err.max()) > 2e-3:
            i = int(torch.nan_to_num(err, nan=math.inf).argmax())
            return False, f"{where}: entry {i} is {float(got[i])!r}, the FP32 softmax gives {float(ref[i])!r}."
    return True, (f"finite and within 2·10⁻³ of the FP32 softmax on {len(cases)} sets of logits, including ones "
                  "whose exp overflows FP16 (and FP32).")


_register(Exercise(
    "8.2", "A softmax that does not overflow",
    "Write safe_softmax(e) -> Tensor: the softmax over the edges entering one node, where e is a 1-D float16 "
    "tensor of attention logits (one per edge, at least one). Compute it in float16 so that it stays finite for "
    "any float16 logits, and return a float16 tensor of e's shape. The check compares it with the FP32 softmax "
    f"on {len(_ex82_cases())} sets of logits, some as large as 1000 (exp overflows FP16, and FP32 too): every "
    "entry must be within 2·10⁻³.",
    _ex82_check,
    "softmax(e) = softmax(e − c) for any constant c, because the factor exp(−c) cancels between numerator and "
    "denominator. Choose c so that no exponent is positive.",
    lambda: _ex82_reference))


# ----------------------------------------------------------------------------------------------------------
# Chapter 9: mixed precision across processes
# ----------------------------------------------------------------------------------------------------------
#: Exercise 9.1's BF16 gradients of ranks 0, 1, 2 for one element (in chunk 0 of the ring).
_EX91_VALUES = (1.0, 2.0 ** -8, 2.0 ** -8)
#: Exercise 9.3's loss-scaled gradient, the same on every rank.
_EX93_GRADIENT = 3000.0


def _ex91_truth() -> tuple:
    """(ring, tree): what every rank holds after gloo's ring and after a binary tree sum the three BF16 values,
    by :func:`mpt_lab.collectives.ring_allreduce` and ``tree_allreduce``."""
    from .collectives import ring_allreduce, tree_allreduce

    values = [[v] for v in _EX91_VALUES]
    return float(ring_allreduce(values, "BF16")[0]), float(tree_allreduce(values, "BF16")[0])


def _ex91_check(a):
    values = _as_list(a)
    if values is None or len(values) != 2 or not all(_is_real(v) for v in values):
        return False, f"expected a tuple (ring, tree) of two floats, got {a!r}"
    ring, tree = _ex91_truth()
    wrong = [name for name, v, t in (("ring", values[0], ring), ("tree", values[1], tree)) if float(v) != t]
    if wrong:
        return False, (f"expected the values every rank holds; the {' and the '.join(wrong)} "
                       f"{'sum is' if len(wrong) == 1 else 'sums are'} not right.")
    return True, (f"the ring adds the two small values first (ranks 2, 1, then 0): {ring!r}; the tree adds "
                  f"rank 1's to rank 0's first, a tie that rounds to even, and then rank 2's: {tree!r}. "
                  "Same numbers, same format, another order: another sum.")


_register(Exercise(
    "9.1", "The order of a sum",
    f"Three ranks hold the BF16 gradients {_EX91_VALUES[0]:g}, 2^-8 and 2^-8 (ranks 0, 1 and 2) of one element that "
    "lies in chunk 0 of gloo's ring all-reduce, which sums it in the order ring_order(3, 0). What does every rank "
    "hold afterwards (no division)? And after a binary-tree all-reduce, where rank 0 adds rank 1's value and then "
    "rank 2's to its own? Every partial sum is rounded to BF16. Answer with a tuple (ring, tree) of two floats.",
    _ex91_check,
    "BF16 keeps 8 significant bits, so the spacing of its values just above 1 is 2^-7. Write down which two values "
    "meet first in each order; a sum exactly halfway between two BF16 values goes to the one with an even last bit.",
    _ex91_truth))


def _ex92_reference(values, fmt) -> float:
    """The value every rank holds after gloo's ring all-reduce of one element of chunk 0 (reference solution of
    exercise 9.2), by :func:`mpt_lab.collectives.ring_allreduce`."""
    from .collectives import ring_allreduce

    return float(ring_allreduce(np.asarray(values, dtype=np.float64).reshape(-1, 1), fmt)[0])


def _ex92_cases() -> list:
    """(values, format) pairs: the chapter's cases, overflow, ties, and random gradients of 1 to 64 ranks."""
    rng = np.random.default_rng(92)
    cases = [([1.0, 2.0 ** -8, 2.0 ** -8], "BF16"), ([40000.0, 40000.0], "FP16"), ([3.0], "FP16"),
             ([1.0, 2.0 ** -11, 2.0 ** -11, 2.0 ** -11], "FP16"), ([0.1, 0.2, 0.3], "FP32")]
    for i in range(90):
        n = int(rng.integers(1, 65))
        values = rng.normal(0, 1, n) * np.exp2(rng.integers(-12, 12, n))
        cases.append((values.tolist(), ("BF16", "FP16", "FP32")[i % 3]))
    return cases


def _ex92_check(fn):
    if not callable(fn):
        return False, f"expected a function ring_sum(values, fmt) -> float, got {type(fn).__name__}"
    cases = _ex92_cases()
    for values, fmt in cases:
        want = _ex92_reference(values, fmt)
        got = fn(list(values), fmt)
        where = f"ring_sum({_short(values)}, {fmt!r})"
        if not _is_real(got):
            return False, f"{where} returned {type(got).__name__}; expected a float."
        if not (float(got) == want or (math.isnan(want) and math.isnan(float(got)))):
            return False, f"{where} returned {float(got)!r}; expected {want!r}, the ring's sum."
    return True, (f"equal, bit for bit, to the ring's sum in {len(cases)} cases of 1 to 64 ranks in BF16, FP16 and "
                  "FP32, overflow included: one rounding per hop, in the ring's order.")


_register(Exercise(
    "9.2", "A ring all-reduce, one element",
    "Write ring_sum(values, fmt) -> float: what every rank holds after gloo's ring all-reduce (a sum, no division) "
    "of one element in chunk 0, where values[r] is rank r's value (N = len(values) ≥ 1) and fmt is 'BF16', 'FP16' "
    "or 'FP32'. Each rank's value is first rounded to fmt (mpt_lab.formats.round_to); the partial sum starts at "
    "the first rank of ring_order(N, 0) (mpt_lab.collectives) and each following rank adds its value, "
    "the sum rounded to fmt after every addition.",
    _ex92_check,
    "Keep the running sum as a float and call round_to after each addition; adding two values of these formats in "
    "float64 is exact or rounds innocuously, so only round_to's rounding counts. Check a single rank, and a sum "
    "that passes the largest finite value.",
    lambda: _ex92_reference))


def _ex93_truth() -> tuple:
    """(the smallest N whose FP16 ring sum of N copies of the gradient overflows before the division by N; what
    every rank holds at that N when each divides by N first, as fp16_compress_hook does), by
    :func:`mpt_lab.collectives.ring_allreduce`."""
    from .collectives import ring_allreduce

    n = 1
    while np.isfinite(ring_allreduce(np.full((n, 1), _EX93_GRADIENT), "FP16", postdivide=n)).all():
        n += 1
    return n, float(ring_allreduce(np.full((n, 1), _EX93_GRADIENT), "FP16", predivide=n)[0])


def _ex93_check(a):
    values = _as_list(a)
    n, mean = values if values is not None and len(values) == 2 else (None, None)
    if not (isinstance(n, numbers.Integral) and _is_real(n) and _is_real(mean)):    # _is_real: not a bool
        return False, f"expected a tuple (n, mean) of an int and a float, got {a!r}"
    truth_n, truth_mean = _ex93_truth()
    if int(n) != truth_n:
        return False, (f"expected the smallest N that overflows: with N = {n} the sum is "
                       f"{'still finite' if n < truth_n else 'finite already one rank earlier'}.")
    if float(mean) != truth_mean:
        return False, f"expected what every rank holds with pre-division at N = {n}: {mean!r} is not it."
    return True, (f"{truth_n} ranks: the partial sums pass 65504 at the last hop. Dividing first keeps the sum in "
                  f"range, but every rank holds {truth_mean!r}, not {_EX93_GRADIENT:g}: g/N was rounded to FP16, "
                  "and so was every partial sum.")


_register(Exercise(
    "9.3", "When an FP16 sum overflows",
    f"Every one of N ranks holds the same loss-scaled FP16 gradient {_EX93_GRADIENT:g} for one element. (a) What is "
    "the smallest N for which a ring all-reduce that sums first and divides by N afterwards overflows FP16? (b) At "
    "that N, what does every rank hold when each divides by N first, as fp16_compress_hook does? Every quotient and "
    "partial sum is rounded to FP16. Answer with a tuple (n, mean) of an int and a float.",
    _ex93_check,
    "(a) The partial sums grow by about the gradient per hop. FP16's largest finite value is 65504 and its values "
    "are 32 apart there, so under round-to-nearest a sum becomes inf once it reaches 65520. (b) Round the quotient "
    "to FP16 first, then add it N times, rounding each partial sum (the spacing of FP16 values doubles at every "
    "power of two).",
    _ex93_truth))


# ----------------------------------------------------------------------------------------------------------
# Chapter 10: FP8 and block scaling
# ----------------------------------------------------------------------------------------------------------
#: Exercise 10.1's block (8 values, to keep it short; OCP MX blocks hold 32) and the value whose MXFP4 element
#: is asked for.
_EX101_BLOCK = (0.75, -3.2, 0.01, 5.5, -0.3, 2.0, 0.0, 1.1)
_EX101_VALUE = -3.2
#: Exercise 10.2's amax history of one activation tensor (16 steps, E4M3) and the next step's amax.
_EX102_HISTORY = (3.1, 2.9, 3.4, 3.0, 3.2, 2.8, 3.3, 3.1, 2.9, 3.0, 3.2, 3.3, 2.7, 3.1, 3.0, 3.2)
_EX102_NEXT = 9.7


def _ex101_truth() -> tuple:
    """(shared exponent k of the block in MXFP8 E4M3, k in MXFP4, what MXFP4 stores for -3.2), by
    :func:`mpt_lab.microscaling.quantize_mx` (X = 2^(code − 127))."""
    import torch

    from .microscaling import quantize_mx

    x = torch.tensor(_EX101_BLOCK, dtype=torch.float64)
    q8 = quantize_mx(x, F.FP8_E4M3, block_size=len(_EX101_BLOCK))
    q4 = quantize_mx(x, F.FP4_E2M1, block_size=len(_EX101_BLOCK))
    stored = float(q4.dequantize(torch.float64)[_EX101_BLOCK.index(_EX101_VALUE)])
    return int(q8.scale_codes[0]) - 127, int(q4.scale_codes[0]) - 127, stored


def _ex101_check(a):
    values = _as_list(a)
    if values is None or len(values) != 3 or not all(_is_real(v) for v in values) or \
            not all(isinstance(v, numbers.Integral) for v in values[:2]):
        return False, f"expected a tuple (k_mxfp8, k_mxfp4, stored) of two ints and a float, got {a!r}"
    k8, k4, stored = _ex101_truth()
    if int(values[0]) != k8:
        return False, (f"2^{int(values[0])} is not MXFP8's shared scale: the block maximum divided by it must land "
                       "in E4M3's top binade.")
    if int(values[1]) != k4:
        return False, (f"2^{int(values[1])} is not MXFP4's shared scale: E2M1 has another largest exponent than "
                       "E4M3.")
    if float(values[2]) != stored:
        return False, f"{float(values[2])!r} is not what MXFP4 stores for {_EX101_VALUE}: divide, round, multiply."
    amax = max(abs(v) for v in _EX101_BLOCK)
    err = abs(stored - _EX101_VALUE) / abs(_EX101_VALUE)
    return True, (f"amax = {amax:g} lies in [2^2, 2^3); E4M3's emax is {F.FP8_E4M3.emax} and E2M1's is "
                  f"{F.FP4_E2M1.emax}, so X = 2^{k8} and 2^{k4}. In MXFP4, {_EX101_VALUE} / 2^{k4} rounds to the "
                  f"nearest E2M1 value: {stored!r}, an error of {err:.0%}.")


_register(Exercise(
    "10.1", "An MX block's shared exponent, by hand",
    f"A block of MX values (here {len(_EX101_BLOCK)}, to keep it short) holds {list(_EX101_BLOCK)}. OCP MX gives "
    "the block the shared scale X = 2^k with k = floor(log2(amax)) − emax, where emax is the largest exponent of "
    "the element format. What is k in MXFP8 (E4M3 elements) and in MXFP4 (E2M1 elements), and which value does "
    f"MXFP4 store for {_EX101_VALUE} (its element, round-to-nearest-even, times X)? Answer with a tuple "
    "(k_mxfp8, k_mxfp4, stored) of two ints and a float.",
    _ex101_check,
    "amax is the largest magnitude in the block. Each FloatFormat of mpt_lab.formats has an emax attribute "
    "(FP8_E4M3.emax, FP4_E2M1.emax), and values(FP4_E2M1) lists every E2M1 value: divide by X, pick the nearest.",
    _ex101_truth))


def _ex102_truth() -> int:
    """The smallest margin m ≥ 0 for which the next step's cast saturates nothing, by feeding the history to
    :class:`mpt_lab.microscaling.DelayedScaling` (E4M3, history of 16, amax from the maximum)."""
    import torch

    from .microscaling import DelayedScaling

    m = 0
    while True:
        ds = DelayedScaling(history_len=len(_EX102_HISTORY), margin=m)
        for a in _EX102_HISTORY:
            ds.quantize(torch.tensor([a]), "x")
            ds.update()
        ds.quantize(torch.tensor([_EX102_NEXT]), "x")
        ds.update()
        if ds.exceeded("x") == 0:
            return m
        m += 1


def _ex102_check(a):
    if not isinstance(a, numbers.Integral) or isinstance(a, bool) or a < 0:
        return False, f"expected an int m ≥ 0 (the margin), got {a!r}"
    m, truth = int(a), _ex102_truth()
    hist = max(_EX102_HISTORY)
    if m < truth:
        s = F.FP8_E4M3.max / hist / 2 ** m
        return False, (f"expected a margin at which nothing saturates: with margin {m} the scale is {s:.4g} and the "
                       f"new amax becomes {_EX102_NEXT * s:.4g}, beyond E4M3's range, so it saturates.")
    if m > truth:
        return False, (f"expected the smallest such margin: margin {m} works, but a smaller one does too, and every "
                       "extra margin costs a binade of range.")
    s = F.FP8_E4M3.max / hist / 2 ** m
    return True, (f"margin {m}: scale = 448 / {hist:g} / 2^{m} = {s:.4g}, so {_EX102_NEXT:g} becomes "
                  f"{_EX102_NEXT * s:.4g} ≤ 448. The price: the typical values now sit {m} binades lower, "
                  "closer to E4M3's subnormals.")


_register(Exercise(
    "10.2", "A margin that avoids saturation",
    f"Delayed scaling keeps the amax of an activation tensor over the last {len(_EX102_HISTORY)} steps: "
    f"{list(_EX102_HISTORY)}. It casts the next step to E4M3 (max 448) with scale = (448 / max(history)) / 2^m, m "
    f"being the margin. The next step's amax is {_EX102_NEXT:g}, a spike. What is the smallest margin m ≥ 0 for "
    "which no value of that step saturates (none rounds beyond 448)? Answer with an int.",
    _ex102_check,
    "The spike is amax_next / max(history) times larger than anything the scale was made for, and each unit of "
    "margin halves the scale. Check the product amax_next × scale against 448 for m = 0, 1, 2, …",
    _ex102_truth))
