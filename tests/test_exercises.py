"""Exercise checks: reference solutions pass, wrong answers fail with a hint, bad input is reported."""

import math

import numpy as np
import pytest

from mpt_lab import exercises as E


@pytest.mark.parametrize("ex_id", E.list_exercises())
def test_reference_solutions_pass(ex_id):
    fb = E.check(ex_id, E.solution(ex_id))
    assert fb.passed and bool(fb) and "✅" in str(fb) and not fb.hint


@pytest.mark.parametrize(
    "ex_id,wrong",
    [("1.1", 128), ("1.2", "0 0101 001"), ("1.3", 2.0**-11), ("1.5", 1.0), ("1.1", "129"), ("1.2", "01"), ("1.3", "x")],
)
def test_wrong_answers_fail_with_hint(ex_id, wrong):
    fb = E.check(ex_id, wrong)
    assert not fb and fb.hint and "hint" in str(fb) and "Hint" in fb._repr_html_()


def test_function_exercise_reports_first_mismatch():
    def no_subnormals(sign, exponent, mantissa):  # a classic mistake: forgets subnormals
        return E.solution("1.4")(sign, exponent, mantissa) if exponent else (-0.0 if sign else 0.0)

    fb = E.check("1.4", no_subnormals)
    assert not fb and "subnormal" in fb.message and "mantissa=1" in fb.message

    def raises(sign, exponent, mantissa):
        raise ValueError("no idea")

    fb = E.check("1.4", raises)
    assert not fb and fb.answered and "ValueError" in fb.message and "no idea" in fb.message
    assert not E.check("1.4", 3)


def test_unknown_exercise():
    with pytest.raises(ValueError, match="1.1"):
        E.check("99.9", 1)
    with pytest.raises(TypeError):
        E.check(1.1, 1)
    assert E.show("1.3").startswith("Exercise 1.3")
    assert E.list_exercises(1) == ["1.1", "1.2", "1.3", "1.4", "1.5"]
    assert E.list_exercises(2) == ["2.1", "2.2"]
    assert E.list_exercises(3) == ["3.1", "3.2"]
    assert E.list_exercises(4) == ["4.1", "4.2"]
    for chapter in (6, 7, 8, 9):
        assert E.list_exercises(chapter) == [f"{chapter}.1", f"{chapter}.2"]


def test_chapter2_wrong_functions_fail():
    import math

    assert not E.check("2.1", lambda amax, fmt_max=65504.0: 2.0 ** math.floor(math.log2(fmt_max / amax)) * 2)
    assert not E.check("2.2", lambda e, c, z, t, k: (c[e <= k].sum() + z) / t)  # off by one binade
    assert not E.check("2.2", lambda e, c, z, t, k: c[e < k].sum() / t)  # forgets the zeros


def test_chapter3_wrong_scaler_fails():
    def never_resets(scale, tracker, found_inf, g, b, n):
        if found_inf:
            return scale * b, tracker  # forgets to reset the count
        tracker += 1
        return (scale * g, 0) if tracker == n else (scale, tracker)

    fb = E.check("3.1", never_resets)
    assert not fb and "expected" not in fb.hint and "restart the count of clean steps at 0" in fb.message
    assert "found_inf=True" in fb.message and "torch's GradScaler gives" in fb.message

    def no_float32_ceiling(scale, tracker, found_inf, g, b, n):  # follows the prompt's rules in Python floats
        if found_inf:
            return scale * b, 0
        tracker += 1
        return (scale * g, 0) if tracker == n else (scale, tracker)

    fb = E.check("3.1", no_float32_ceiling)
    assert not fb and "float32 maximum" in fb.message and "keeps S as it is" in fb.message
    ex = E.EXERCISES["3.1"]
    assert "float32" in ex.prompt and "FLOAT32_MAX" in ex.prompt and "FLOAT32_MAX" in ex.hint  # the rule is stated

    def grows_late(scale, tracker, found_inf, g, b, n):  # compares before counting the current step
        if found_inf:
            return scale * b, 0
        return (scale * g, 0) if tracker == n else (scale, tracker + 1)

    fb = E.check("3.1", grows_late)
    assert not fb and "not one step later" in fb.message
    # torch's own rule at the float32 maximum, in the installed torch: a growth to infinity keeps the scale
    import torch

    scale, tracker = torch.tensor([2.0**127]), torch.tensor([0], dtype=torch.int32)
    torch._amp_update_scale_(scale, tracker, torch.tensor([0.0]), 2.0, 0.5, 1)
    assert scale.item() == 2.0**127 == E.solution("3.1")(2.0**127, 0, False, 2.0, 0.5, 1)[0]
    assert E.ch03.FLOAT32_MAX == float(torch.finfo(torch.float32).max)


def test_3_2_loss_scale_window():
    from mpt_lab import formats as F

    k_min, k_max = E.solution("3.2")
    g = E.ch03.EX32_GRADIENTS
    assert all(F.round_to(v * 2.0**k_min, F.FP16) != 0 for v in g)
    assert any(F.round_to(v * 2.0 ** (k_min - 1), F.FP16) == 0 for v in g)
    assert all(np.isfinite(F.round_to(v * 2.0**k_max, F.FP16)) for v in g)
    assert any(np.isinf(F.round_to(v * 2.0 ** (k_max + 1), F.FP16)) for v in g)
    assert E.check("3.2", (np.int64(k_min), k_max)) and E.check("3.2", [k_min, k_max])
    # the thresholds 2^-24 and 65504 instead of rounding: one binade off at each end
    fb = E.check("3.2", (k_min + 1, k_max - 1))
    assert not fb and "rounds up to the smallest subnormal" in fb.message and "not to infinity" in fb.message
    fb = E.check("3.2", (k_min - 1, k_max + 1))
    assert not fb and "it is lost" in fb.message and "it overflows" in fb.message
    for bad in ((float(k_min), k_max), (k_min,), "5, 6", (True, k_max)):
        fb = E.check("3.2", bad)
        assert not fb and "tuple of two ints" in fb.message
    assert E.ch03.EX32_TEXT in E.EXERCISES["3.2"].prompt
    assert all(f"{v:g}" in E.ch03.EX32_TEXT for v in g[1:]) and "1.5 × 2⁻³⁰" in E.ch03.EX32_TEXT
    assert g[0] == 1.5 * 2.0**-30
    text = E.solution_dropdown("3.2").text
    assert f"({k_min}, {k_max})" in text and f"k = {k_min + 1}" in text and f"k = {k_max - 1}" in text


def test_4_2_pure_fp16_weight_stalls():
    from mpt_lab import formats as F

    c = E.ch04.EX42
    w = E.solution("4.2")
    assert w == 0.25 == float(F.round_to(0.25, F.FP16))  # stuck at a power of two
    traj = F.accumulate(c["start"], c["update"], c["steps"], F.FP16)
    assert F.ulp(0.25, F.FP16) / 2 > c["update"] > F.ulp(0.2, F.FP16) / 2  # the binade decides
    assert (traj[-200:] == w).all() and traj[1] - traj[0] == F.ulp(0.2, F.FP16)  # climbs an ulp per step, stops
    assert E.check("4.2", np.float64(w))
    fb = E.check("4.2", c["start"] + c["update"] * c["steps"])
    assert not fb and "exact (or FP32)" in fb.message
    fb = E.check("4.2", c["start"])
    assert not fb and "the first updates do move the weight" in fb.message
    assert not E.check("4.2", "0.25") and not E.check("4.2", 0.26)
    assert f"{c['update']:g}" in E.EXERCISES["4.2"].prompt and "1,000" in E.EXERCISES["4.2"].prompt


def test_chapter4_naive_threshold_fails_on_ties():

    from mpt_lab import formats as F

    assert not E.check("4.1", lambda w, u: abs(u) >= F.ulp(w, F.FP16) / 2)  # ignores ties to even


def _survives_oracle(w, u):
    """Exercise 4.1's truth with exact rationals only: the FP16 values nearest to w + u, by bisection of FP16's
    sorted finite values, round-to-nearest-even decided by the codes."""
    from fractions import Fraction

    v = np.unique(F16_VALUES)
    exact = Fraction(w) + Fraction(u)
    i = int(np.searchsorted(v, float(exact)))  # a start; the exact comparisons below decide
    i = min(max(i, 1), len(v) - 1)
    while i > 1 and Fraction(float(v[i - 1])) > exact:
        i -= 1
    while i < len(v) - 1 and Fraction(float(v[i])) < exact:
        i += 1
    lo, hi = Fraction(float(v[i - 1])), Fraction(float(v[i]))
    if exact <= lo or exact >= hi:
        nearest = lo if exact <= lo else hi
    elif exact - lo != hi - exact:
        nearest = lo if exact - lo < hi - exact else hi
    else:  # a tie: the even code
        nearest = lo if int(np.float16(float(lo)).view(np.uint16)) % 2 == 0 else hi
    return nearest != Fraction(w)


F16_VALUES = np.arange(0, 0x7C00, dtype=np.uint16).view(np.float16).astype(np.float64)
F16_VALUES = np.concatenate([-F16_VALUES[::-1], F16_VALUES])


def test_4_1_rejects_double_rounding():
    """Issue 29, item 5: rounding w + u to float32 (or float64) and then to FP16 rounds twice; 4.1 rejects it."""
    from mpt_lab import formats as F
    from mpt_lab.exercises import ch04

    w, u = 1.0, 2.0**-11 + 2.0**-30  # the case: a hair above half the gap above 1
    assert float(np.float32(w + u)) == 1.0 + 2.0**-11  # the float32 sum lands on the FP16 midpoint ...
    assert float(np.float16(np.float32(w + u))) == 1.0  # ... and the tie goes to even: the update looks lost
    assert _survives_oracle(w, u) and ch04._ex41_reference(w, u)  # but it survives
    w, u = 1.0, 2.0**-11 + 2.0**-60  # the same with a float64 sum
    assert w + u == 1.0 + 2.0**-11 and _survives_oracle(w, u) and ch04._ex41_reference(w, u)
    float32_sum = lambda w, u: bool(np.float16(np.float32(np.float64(w) + u)) != np.float16(w))  # noqa: E731
    float64_sum = lambda w, u: bool(np.float16(np.float64(w) + u) != np.float16(w))  # noqa: E731
    for wrong, fmt in ((float32_sum, "float32"), (float64_sum, "float64")):
        fb = E.check("4.1", wrong)
        assert not fb and "double rounding" in fb.message and f"rounded to {fmt} first" in fb.message, fb.message
    # the reference, and every case the checker tries, against the exact oracle; both sides of every pair differ
    pairs = ch04._ex41_double_rounding_cases([1.0, 1025.0, -3.0, 2.0**-14, 3 * 2.0**-24, 0.5 + 2.0**-11])
    assert len(pairs) == 6 * 2 * 2 * 2
    for w, u, note in pairs:
        assert ch04._ex41_reference(w, u) == _survives_oracle(w, u) == ("above" in note), (w, u)
    rng = np.random.default_rng(0)
    for w in rng.choice(F16_VALUES[np.abs(F16_VALUES) < 30000], 300):
        for u in (rng.standard_normal() * float(F.ulp(w, F.FP16)), float(F.ulp(w, F.FP16)) / 2):
            assert ch04._ex41_reference(w, u) == _survives_oracle(w, u), (w, u)


def test_reference_solutions_use_the_package_rules(monkeypatch):
    """2.1 and 3.1's references call mpt_lab.scaling's public rules instead of re-implementing them."""
    from mpt_lab import scaling

    calls = {"max_gradient_scale": [], "update_scale": []}
    for name in calls:
        real = getattr(scaling, name)
        monkeypatch.setattr(scaling, name, lambda *a, real=real, name=name, **k: calls[name].append(a) or real(*a, **k))
    choose_scale = E.solution("2.1")
    assert choose_scale(1.0) == 2.0**15 and choose_scale(448.0, 448.0) == 1.0 and choose_scale(3.0, 57344.0) == 2.0**14
    assert [a[1].name for a in calls["max_gradient_scale"]] == ["FP16", "FP8_E4M3", "FP8_E5M2"]
    update = E.solution("3.1")
    assert update(2.0**16, 1999, False, 2.0, 0.5, 2000) == (2.0**17, 0) and len(calls["update_scale"]) == 1
    assert E.check("2.1", choose_scale) and E.check("3.1", update)
    assert len(calls["max_gradient_scale"]) > 900 and len(calls["update_scale"]) > 1800
    # a limit that is no format's max: the same exact rule, also at powers of two
    assert choose_scale(3.0, 100.0) == 32.0 and choose_scale(2.0**-3, 2.0**5) == 2.0**8
    with pytest.raises(ValueError, match="fmt_max"):
        choose_scale(1.0, -1.0)


# ------------------------------------------------------------------------------------------------------------
# Unanswered exercises render neutrally
# ------------------------------------------------------------------------------------------------------------
def _template(*args, **kwargs):
    """What the notebooks' function cells hold before a student writes anything."""
    # your code here
    raise NotImplementedError


def _assert_neutral(fb):
    assert not fb and not fb.passed and fb.answered is False
    assert "your answer goes here" in str(fb) and "your answer goes here" in fb._repr_html_()
    assert "❌" not in str(fb) and "❌" not in fb._repr_html_() and "not yet:" not in str(fb)
    assert not fb.hint and "hint" not in str(fb) and "Hint" not in fb._repr_html_()
    assert "#fbe9e9" not in fb._repr_html_() and "#f0f0f0" in fb._repr_html_()  # grey, not red


@pytest.mark.parametrize("ex_id", E.list_exercises())
def test_unanswered_is_neutral(ex_id):
    _assert_neutral(E.check(ex_id, None))  # answer_N_M = None
    if callable(E.solution(ex_id)):
        fb = E.check(ex_id, _template)  # def f(...): raise NotImplementedError
        _assert_neutral(fb)
        assert "NotImplementedError" in fb.message


def test_answered_feedback_keeps_its_style():
    passed, failed = E.check("1.1", E.solution("1.1")), E.check("1.1", 128)
    assert passed.answered and failed.answered
    assert "✅" in str(passed) and "#e6f4e6" in passed._repr_html_()
    assert "❌" in str(failed) and "#fbe9e9" in failed._repr_html_() and failed.hint
    assert E.Feedback("1.1", False, "m", "h") == E.Feedback("1.1", False, "m", "h", True)  # old fields, same order


def test_not_implemented_after_the_first_call_is_a_failure():
    """A function that works on some cases and raises NotImplementedError on others has been answered."""
    ref = E.solution("1.4")

    def normals_only(sign, exponent, mantissa):
        if exponent == 0:
            raise NotImplementedError("subnormals")
        return ref(sign, exponent, mantissa)

    def later(sign, exponent, mantissa):  # the checker's first call is (0, 0, 0): fine; then it gives up
        if mantissa:
            raise NotImplementedError
        return ref(sign, exponent, mantissa)

    fb = E.check("1.4", normals_only)  # the first call raises: still the template's state
    _assert_neutral(fb)
    fb = E.check("1.4", later)
    assert not fb and fb.answered and "NotImplementedError" in fb.message and "❌" in str(fb) and fb.hint

    class Callable:  # callable objects and partials are watched too
        def __call__(self, *a):
            raise NotImplementedError

    _assert_neutral(E.check("2.1", Callable()))
    import functools

    _assert_neutral(E.check("9.2", functools.partial(_template, 1)))


def test_a_caught_not_implemented_error_is_still_unanswered(monkeypatch):
    """Even a checker that catches the student's exception sees the template as unanswered."""
    ex = E.EXERCISES["2.1"]

    def catching(fn):
        try:
            fn(1.0)
        except NotImplementedError:
            return False, "caught"
        return True, "ok"

    monkeypatch.setitem(E.EXERCISES, "2.1", E.Exercise(ex.id, ex.title, ex.prompt, catching, ex.hint, ex.solution))
    _assert_neutral(E.check("2.1", _template))


# ------------------------------------------------------------------------------------------------------------
# Chapters 6–9
# ------------------------------------------------------------------------------------------------------------
NEW = [k for k in E.list_exercises() if k.split(".")[0] in "56789"]
ODD_ANSWERS = [
    0,
    3,
    -1.5,
    math.nan,
    math.inf,
    True,
    "x",
    "",
    b"\x00",
    [],
    [None],
    (1, 2),
    {},
    {"a": 1},
    {1: 2},
    np.zeros(3),
    np.zeros((2, 2)),
    object(),
    lambda: 0,
    lambda *a: None,
    lambda *a: "x",
    print,
]


def test_every_chapter_has_two_exercises_with_prompt_hint_and_title():
    from conftest import NOTEBOOKS

    one_so_far = set()  # issue 26, item 28: chapters 3 and 4 have their second exercise now
    for chapter in sorted(int(p.name[:2]) for p in NOTEBOOKS):
        assert len(E.list_exercises(chapter)) >= (1 if chapter in one_so_far else 2), chapter
    for k in NEW:
        ex = E.EXERCISES[k]
        assert ex.title and ex.prompt and ex.hint and E.show(k).startswith(f"Exercise {k}: {ex.title}")
        assert "Answer with" in ex.prompt or ex.prompt.startswith("Write ")


@pytest.mark.parametrize("ex_id", NEW)
@pytest.mark.parametrize("odd", ODD_ANSWERS, ids=lambda a: type(a).__name__)
def test_wrong_types_fail_without_raising(ex_id, odd):
    fb = E.check(ex_id, odd)
    assert isinstance(fb, E.Feedback) and not fb and fb.answered and fb.hint and "❌" in str(fb)
    if not callable(odd):
        assert "expected" in fb.message


@pytest.mark.parametrize("ex_id", NEW)
def test_hints_do_not_give_the_answer(ex_id):
    ex = E.EXERCISES[ex_id]
    sol = E.solution(ex_id)
    if isinstance(sol, dict):
        leaks = [f"{v:g}" if isinstance(v, float) else str(v) for v in sol.values()]
        leaks = [x for x in leaks if x not in ("float16", "float32")]  # the dtype names are the vocabulary
    elif isinstance(sol, (list, tuple)):
        leaks = [str(sol), str(list(sol))] + [f"{v:g}" for v in sol if isinstance(v, (int, float)) and abs(v) > 20]
    elif isinstance(sol, float):
        leaks = [f"{sol:g}", str(int(sol))]
    else:
        leaks = []
    for leak in leaks:
        assert leak not in ex.hint, (ex_id, leak)


def test_5_1_autocast_policy():
    import torch

    from mpt_lab.autocast import OPS, RECIPE_OPS, autocast_lists, probe_autocast

    assert set(E.ch06.EX61_OPS) <= set(OPS) and all(k in E.EXERCISES["6.1"].prompt for k in E.ch06.EX61_OPS)
    assert not set(E.ch06.EX61_OPS) & set(RECIPE_OPS)  # none of the asked ops is in the chapter's table
    sol = E.solution("6.1")
    truth = probe_autocast("cuda", torch.float16, input_dtype=torch.float16, ops=tuple(E.ch06.EX61_OPS)).ops
    assert sol == truth and {"float16", "float32"} == set(sol.values())
    # solvable from the prompt: the rule applied to the lists the prompt prints gives the probed answer
    lists = autocast_lists("cuda", torch.float16)
    shown = E.show("6.1")
    for policy in ("lower_precision", "float32", "promote"):
        assert all(op in shown for op in lists[policy]), policy
    for k, (expr, aten) in E.ch06.EX61_OPS.items():
        assert expr in shown and all(f"aten::{op}" in shown for op in aten)
        last = lists.policy(aten[-1])
        rule = {"float32": "float32", "lower_precision": "float16", "not listed": "float16"}[last]
        assert rule == sol[k], (k, last)
    # what a loose rule ("exponentials, reductions, normalisations run in float32") would answer is wrong
    loose = dict(sol, elu="float32", mean="float32", var="float32", batch_norm="float32")
    fb = E.check("6.1", loose)
    assert not fb and "4 of the 7" in fb.message
    assert E.check("6.1", {k: getattr(torch, v) for k, v in sol.items()})  # torch dtypes are accepted
    assert E.check("6.1", {k: f"torch.{v}" for k, v in sol.items()})
    all16 = {k: "float16" for k in sol}  # "autocast means FP16 everywhere"
    fb = E.check("6.1", all16)
    n_wrong = sum(v == "float32" for v in sol.values())
    assert not fb and f"{n_wrong} of the {len(sol)}" in fb.message and "float16 inputs" in fb.message
    flipped = dict(sol, **{"mul + sum (a·Wh)": "float16"})  # the sum at the end of a chain runs in FP32
    assert not E.check("6.1", flipped)
    fb = E.check("6.1", {k: v for k, v in sol.items() if k != "expm1"})
    assert not fb and "missing" in fb.message and "expm1" in fb.message
    fb = E.check("6.1", dict(sol, conv2d="float16"))
    assert not fb and "not asked" in fb.message
    fb = E.check("6.1", dict(sol, expm1="half"))
    assert not fb and "'expm1'" in fb.message and '"float16" or "float32"' in fb.message


def test_5_2_gradscaler_trace():
    from mpt_lab import scaling

    c = E.ch06.EX62
    sol = E.solution("6.2")
    assert len(sol) == c["iterations"] and sol[0] == c["init_scale"]
    # the same trace from the public rule, step by step
    s, t, trace = c["init_scale"], 0, []
    for i in range(1, c["iterations"] + 1):
        trace.append(s)
        s, t = scaling.update_scale(
            s, t, i in c["overflows"], c["growth_factor"], c["backoff_factor"], c["growth_interval"]
        )
    assert trace == sol
    assert E.check("6.2", np.array(sol)) and E.check("6.2", tuple(int(v) for v in sol))
    # a classic mistake: the scale grows in the iteration that completes the interval, not after it
    early = list(sol)
    early[c["growth_interval"] - 1] *= 2
    fb = E.check("6.2", early)
    assert not fb and f"iteration {c['growth_interval']} is the first" in fb.message
    # another: an overflow does not reset the count of clean steps
    s, t, no_reset = c["init_scale"], 0, []
    for i in range(1, c["iterations"] + 1):
        no_reset.append(s)
        if i in c["overflows"]:
            s *= c["backoff_factor"]
        else:
            t += 1
            if t == c["growth_interval"]:
                s, t = s * c["growth_factor"], 0
    assert no_reset != sol and not E.check("6.2", no_reset)
    fb = E.check("6.2", sol[:-1])
    assert not fb and f"{len(sol) - 1} entries" in fb.message


def test_6_1_bytes_per_parameter():
    sol = E.solution("7.1")
    assert abs(sol["fp32"] - 16) < 0.01 and abs(sol["mixed"] - 20) < 0.01  # 4+4+8 and 4+2+2+4+8
    assert E.check("7.1", {"fp32": round(sol["fp32"]), "mixed": round(sol["mixed"])})
    fb = E.check("7.1", {"fp32": 16, "mixed": 16})  # forgets the FP32 gradients of the paper's loop
    assert not fb and "'mixed' is too low" in fb.message and "'fp32'" not in fb.message
    fb = E.check("7.1", {"fp32": 12, "mixed": 20})  # Adam's state counted once
    assert not fb and "'fp32' is too low" in fb.message
    fb = E.check("7.1", {"fp32": 16})
    assert not fb and '{"fp32": number, "mixed": number}' in fb.message


def test_6_2_checkpoint_size():
    import torch

    def by_state_dict(model, dtype):
        size = torch.empty((), dtype=dtype).element_size()
        return sum(
            v.numel() * (size if v.is_floating_point() else v.element_size()) for v in model.state_dict().values()
        )

    assert E.check("7.2", by_state_dict)
    fb = E.check("7.2", lambda model, dtype: sum(p.numel() * 4 for p in model.parameters()))  # always FP32
    assert not fb and "float16" in fb.message and "torch.save writes" in fb.message and "(+99%)" in fb.message
    fb = E.check("7.2", lambda model, dtype: sum(p.numel() for p in model.parameters()))  # elements, not bytes
    assert not fb and "float32" in fb.message
    fb = E.check("7.2", lambda model, dtype: str(by_state_dict(model, dtype)))
    assert not fb and "not a number of bytes" in fb.message

    def casts_in_place(model, dtype):  # harmless: the checker hands out copies
        model.to(dtype)
        return by_state_dict(model, dtype)

    assert E.check("7.2", casts_in_place)


def test_7_prompts_follow_biglstm_and_answers_come_from_formats():
    """8.1 and 8.2 follow bigLSTM's sampled softmax with TensorFlow's log-Q correction (issue 31, item 8): a word
    that every sample contains has p ≈ 1/V, so its logit gradient is g = 1/(V·B), B = 128 sequences, in
    [2⁻²⁷, 2⁻²⁶); FP16 loses it, and S = 4 is the smallest power of two that keeps it."""
    from mpt_lab import formats as F
    from mpt_lab.experiments.biglstm import BIGLSTM, sampled_softmax_gradients

    prompt = E.EXERCISES["8.1"].prompt
    assert f"V = {BIGLSTM['vocab_size']:,}" in prompt and f"B = {BIGLSTM['loss_divisor']:,}" in prompt
    assert f"{BIGLSTM['sampled_classes']:,} of its" in prompt and "g = 1/(V·B)" in prompt
    g = 1 / (BIGLSTM["vocab_size"] * BIGLSTM["loss_divisor"])
    sim = sampled_softmax_gradients(steps=2, tokens=16)
    assert abs(sim["normaliser"] - 1) < 0.05 and abs(sim["smallest_log2"] - math.log2(g)) < 0.1  # Z ≈ V, as said
    k, lost = E.solution("8.1")
    assert 2.0**k <= g < 2.0 ** (k + 1) and lost == (F.round_to(g, F.FP16) == 0)
    assert k == -27 and lost
    assert E.check("8.1", [k, np.bool_(lost)])
    fb = E.check("8.1", (k + 1, lost))
    assert not fb and "smaller" in fb.message and "1/(V·B)" in fb.message  # the prompt's name for g
    fb = E.check("8.1", (k, not lost))
    assert not fb and "binade is right" in fb.message
    assert "1/(V·B)" in E.check("8.1", (k, lost)).message
    assert not E.check("8.1", (float(k), lost)) and not E.check("8.1", (k, 1))
    s = E.solution("8.2")
    assert F.round_to(s * g, F.FP16) != 0 == F.round_to(s / 2 * g, F.FP16)
    assert s == 4.0 and F.round_to(s * g, F.FP16) == F.FP16.smallest_subnormal
    assert E.check("8.2", int(s))
    fb = E.check("8.2", 128.0)  # the paper's S keeps it too, but is not the smallest
    assert not fb and "not the smallest" in fb.message
    fb = E.check("8.2", s / 2)
    assert not fb and "too small" in fb.message
    fb = E.check("8.2", s * 1.5)
    assert not fb and "power of two" in fb.message
    assert "S = 128, keeps g" in E.check("8.2", s).message


def test_8_1_exp_overflow():
    import torch

    from mpt_lab import formats as F

    sol = E.solution("9.1")
    logits16 = torch.tensor(E.ch09.EX91_LOGITS, dtype=torch.float16).tolist()
    by_formats = [math.isinf(F.round_to(math.exp(x), F.FP16)) for x in logits16]
    assert sol == by_formats and any(sol) and not all(sol)
    assert str(list(E.ch09.EX91_LOGITS)) in E.EXERCISES["9.1"].prompt
    assert E.check("9.1", np.array(sol))
    fb = E.check("9.1", [x > 88.72 for x in E.ch09.EX91_LOGITS])  # FP32's threshold: nothing overflows
    assert not fb and f"{sum(sol)} of the {len(sol)}" in fb.message
    fb = E.check("9.1", [int(v) for v in sol])
    assert not fb and "bools" in fb.message


def test_8_2_safe_softmax():
    import torch

    def max_subtracted(e):
        z = torch.exp(e - e.max())
        return z / z.sum()

    def naive(e):
        z = torch.exp(e)
        return z / z.sum()

    assert E.check("9.2", max_subtracted)
    fb = E.check("9.2", naive)
    assert not fb and "FP32 softmax gives" in fb.message and "nan" in fb.message.lower()
    fb = E.check("9.2", lambda e: naive(e.float()).half())  # FP32 without the max: overflows at 88.7
    assert not fb and "FP32 softmax gives" in fb.message
    assert E.check("9.2", lambda e: torch.softmax(e.float(), 0).half())  # torch's softmax subtracts the max
    fb = E.check("9.2", lambda e: max_subtracted(e).float())
    assert not fb and "float32" in fb.message and "float16" in fb.message
    fb = E.check("9.2", lambda e: max_subtracted(e).tolist())
    assert not fb and "list" in fb.message
    cases = E.ch09.ex92_cases()
    assert any(max(c) > math.log(torch.finfo(torch.float32).max) for c in cases)  # some overflow even FP32
    assert f"on {len(cases)} sets" in E.EXERCISES["9.2"].prompt


def test_new_reference_solutions_call_the_package(monkeypatch):
    """5.1, 6.1, 6.2 and 8.2's references (and their checks) ask the package instead of re-implementing it."""
    from mpt_lab import autocast, bench, master_weights
    from mpt_lab.models import gat

    calls = []
    for module, name in ((autocast, "probe_autocast"), (bench, "checkpoint_bytes"), (gat, "attention_overflow")):
        real = getattr(module, name)
        monkeypatch.setattr(module, name, lambda *a, real=real, name=name, **k: calls.append(name) or real(*a, **k))
    real_mpp = master_weights.MasterWeightTrainer.memory_per_parameter
    monkeypatch.setattr(
        master_weights.MasterWeightTrainer,
        "memory_per_parameter",
        lambda self: calls.append("memory_per_parameter") or real_mpp(self),
    )
    for k in ("6.1", "7.1", "7.2", "9.2"):
        calls.clear()
        sol = E.solution(k)
        assert E.check(k, sol), k
        expected = {
            "6.1": "probe_autocast",
            "7.1": "memory_per_parameter",
            "7.2": "checkpoint_bytes",
            "9.2": "attention_overflow",
        }[k]
        assert expected in calls, (k, calls)


# ------------------------------------------------------------------------------------------------------------
# Worked solutions of chapters 6-8 (issue 26, item 19): every exercise has one; its code runs and passes the check,
# and what its reasoning states holds
# ------------------------------------------------------------------------------------------------------------
CHAPTERS_6_TO_8 = [k for k in E.list_exercises() if k.split(".")[0] in ("6", "7", "8")]


def _fenced_code(ex_id, *, plain_fences=False):
    """The ```python blocks of an exercise's worked solution (with ``plain_fences``, plain ``` blocks too),
    joined; "" when it has none."""
    import re

    fence = r"```(?:python)?\n(.*?)\n```" if plain_fences else r"```python\n(.*?)\n```"
    return "\n\n".join(re.findall(fence, E.EXERCISES[ex_id].worked, re.S))


def _run_worked(code, ex_id):
    """Run a worked solution's code as a student would paste it: its namespace."""
    namespace = {}
    exec(compile(code, f"<worked solution {ex_id}>", "exec"), namespace)
    return namespace


def _explained_solution(ex_id):
    """What every worked solution must be (reasoning, not just the answer; nothing left to fill in, no call into
    the exercises package): returns (exercise, the text a reader sees, the reference answer)."""
    ex = E.EXERCISES[ex_id]
    assert len(ex.worked) > 300, ex_id  # reasoning, not just the answer
    text = E.solution_dropdown(ex_id).text
    assert "{answer}" not in text and "mpt_lab.exercises" not in text
    return ex, text, E.solution(ex_id)


def _worked_code(ex_id):
    """The fenced code blocks of the worked solution (```python for a function exercise, plain ``` for a value
    exercise), run: their namespace."""
    return _run_worked(_fenced_code(ex_id, plain_fences=True), ex_id)


@pytest.mark.parametrize("ex_id", CHAPTERS_6_TO_8)
def test_chapters_6_to_8_have_worked_solutions(ex_id):
    ex, text, sol = _explained_solution(ex_id)
    namespace = _worked_code(ex_id) if "```" in ex.worked else {}
    if callable(sol):  # a function exercise: a student's implementation
        code = _fenced_code(ex_id)
        assert code and "mpt_lab" not in code and "{answer}" not in ex.worked
        fns = [
            v
            for v in namespace.values()
            if getattr(getattr(v, "__code__", None), "co_filename", "") == f"<worked solution {ex_id}>"
        ]
        assert fns and E.check(ex_id, fns[-1]).passed, ex_id
    elif isinstance(sol, dict) and "{answer_items}" in ex.worked:  # a dict answer inserted as "key: value, ..."
        assert "```python" not in ex.worked and all(f"{k}: {v}" in text for k, v in sol.items())
        if "answer" in namespace:
            assert E.check(ex_id, namespace["answer"]).passed, ex_id
    else:  # a value exercise: the answer inserted, never typed
        assert "{answer}" in ex.worked and "```python" not in ex.worked
        assert (repr(sol) if isinstance(sol, float) else str(sol)) in text
        if "answer" in namespace:  # a computation shown in the solution: it agrees
            assert E.check(ex_id, namespace["answer"]).passed, ex_id


def test_worked_solutions_of_chapters_6_to_8_state_what_holds():
    """The numbers and verdicts the reasoning of 6.1-8.2 states, checked against the package and the answers."""
    import re

    import torch

    from mpt_lab import formats as F
    from mpt_lab.autocast import RECIPE_OPS, autocast_lists
    from mpt_lab.experiments.biglstm import BIGLSTM

    # 6.1: each op's verdict in the reasoning is the probed dtype; the lists it names are the installed ones
    truth = E.solution("6.1")
    worked = E.EXERCISES["6.1"].worked
    for expr, ops in (
        ("`F.elu(x)`", ["elu"]),
        ("`torch.expm1(x)`", ["expm1"]),
        ("`x.mean()`", ["mean"]),
        ("`x.var(-1)`", ["var"]),
        ("`F.batch_norm(x, None, None, training=True)`", ["batch_norm"]),
        ("`(x * x).sum(-1)`", ["mul + sum (a·Wh)"]),
        ("`F.elu(F.linear(x, w))`", ["linear → elu"]),
    ):
        verdict = re.search(re.escape(expr) + r":[^→]*→ (float16|float32)", worked).group(1)
        assert all(truth[op] == verdict for op in ops), (expr, verdict)
    cuda, cpu = autocast_lists("cuda", torch.float16), autocast_lists("cpu", torch.float16)
    for op in ("elu", "mean", "var", "batch_norm", "mul"):  # "on no list"
        assert cuda.policy(op) == "not listed", op
    for op in (
        "expm1",
        "sum",
        "prod",
        "cumsum",
        "cumprod",
        "logsumexp",
        "norm",
        "layer_norm",
        "group_norm",
        "rms_norm",
    ):
        assert cuda.policy(op) == "float32", op
    assert cuda.policy("linear") == "lower_precision"
    for op in ("sum", "softmax", "expm1"):  # "on a CPU ... on no list"
        assert cpu.policy(op) == "not listed", op
    assert not set(E.ch06.EX61_OPS) & set(RECIPE_OPS)
    assert "None of them is in the chapter's probe table" in E.EXERCISES["6.1"].prompt
    # 6.2: the iterations the reasoning walks through
    c, trace = E.ch06.EX62, E.solution("6.2")
    assert c["growth_interval"] == 3 and c["overflows"] == (5, 6, 11) and c["iterations"] == 12
    assert trace[0] == trace[1] == trace[2] == c["init_scale"] and trace[3] == 2 * trace[2]  # grows from 4 on
    assert trace[5] == trace[4] / 2 and trace[6] == trace[5] / 2  # 5 and 6 overflow
    assert trace[9] == 2 * trace[8] and trace[11] == trace[10] / 2
    # 7.1: the element sizes the reasoning adds up
    assert (
        torch.empty((), dtype=torch.float32).element_size()
        == 4
        == 2 * torch.empty((), dtype=torch.float16).element_size()
    )
    # 8.1 and 8.2: the arithmetic of the reasoning
    V, B = BIGLSTM["vocab_size"], BIGLSTM["loss_divisor"]
    assert 2**19 < V < 2**20 and B == 2**7 and round(math.log2(V), 1) == 19.6
    g = 1 / (V * B)
    assert 2.0**-27 <= g < 2.0**-26 and round(math.log2(g), 1) == -26.6 and F.round_to(g, F.FP16) == 0
    assert "2⁻²⁶·⁶" in E.EXERCISES["8.2"].worked and "19.6" in E.EXERCISES["8.1"].worked
    assert 2 * g <= 2.0**-25 < 4 * g and round(4 * g / 2.0**-24, 2) == 0.66  # j = 1 lost, j = 2 rounds up
    assert abs(F.FP16.smallest_subnormal / (4 * g) - 1.5) < 0.02  # "half again as large"
    assert round(math.log2(128 * g), 1) == -19.6 and 4 < math.log2(128 * g) + 24 < 5  # "more than four binades"
    assert round(100 * 2.0**-25 / (128 * g), 1) == 2.4  # "2.4% of it"
    code = _worked_code("8.2")
    assert f"{V} * 128" in E.EXERCISES["8.2"].worked and code["answer"] == E.solution("8.2")


# ------------------------------------------------------------------------------------------------------------
# Chapter 10
# ------------------------------------------------------------------------------------------------------------
def test_9_exercises_follow_the_summation_order(monkeypatch):
    """9.1–9.3: the answers come from the ring and tree simulations; classic mistakes fail."""
    from mpt_lab import collectives
    from mpt_lab import formats as F

    assert E.list_exercises(10) == ["10.1", "10.2", "10.3"]
    assert E.solution("10.1") == (1.0 + 2.0**-7, 1.0)  # the ring keeps the small values, the tree not
    assert not E.check("10.1", (1.0, 1.0)) and not E.check("10.1", (1.0 + 2.0**-7,) * 2)
    n, mean = E.solution("10.3")
    assert n == 22 and mean != 3000.0 and E.check("10.3", (22, mean))
    assert not E.check("10.3", (21, mean)) and not E.check("10.3", (22, 3000.0))

    def ring_sum_in_float64(values, fmt):  # forgets to round the partial sums
        return float(F.round_to(sum(float(F.round_to(v, fmt)) for v in values), fmt))

    def ring_sum_wrong_way(values, fmt):  # NCCL's direction: the other order
        x = [float(F.round_to(v, fmt)) for v in values]
        order = collectives.ring_order(len(x), 0, direction=1)
        acc = x[order[0]]
        for r in order[1:]:
            acc = float(F.round_to(acc + x[r], fmt))
        return acc

    def ring_sum(values, fmt):  # a student's correct answer
        x = [float(F.round_to(v, fmt)) for v in values]
        order = collectives.ring_order(len(x), 0)
        acc = x[order[0]]
        for r in order[1:]:
            acc = float(F.round_to(acc + x[r], fmt))
        return acc

    assert not E.check("10.2", ring_sum_in_float64) and not E.check("10.2", ring_sum_wrong_way)
    assert E.check("10.2", ring_sum)
    calls = []
    for name in ("ring_allreduce", "tree_allreduce"):
        real = getattr(collectives, name)
        monkeypatch.setattr(
            collectives, name, lambda *a, real=real, name=name, **k: calls.append(name) or real(*a, **k)
        )
    for k in ("10.1", "10.2", "10.3"):
        calls.clear()
        assert E.check(k, E.solution(k)) and "ring_allreduce" in calls, k


# ------------------------------------------------------------------------------------------------------------
# Chapter 11
# ------------------------------------------------------------------------------------------------------------
CH10 = ["11.1", "11.2"]


def test_10_exercises_are_listed_with_prompt_hint_and_title():
    assert E.list_exercises(11) == CH10
    for k in CH10:
        ex = E.EXERCISES[k]
        assert ex.title and ex.hint and E.show(k).startswith(f"Exercise {k}: {ex.title}") and "Answer with" in ex.prompt


@pytest.mark.parametrize("ex_id", CH10)
@pytest.mark.parametrize("odd", ODD_ANSWERS, ids=lambda a: type(a).__name__)
def test_10_wrong_types_fail_without_raising(ex_id, odd):
    test_wrong_types_fail_without_raising(ex_id, odd)  # the checks of chapters 6–10, for chapter 11


@pytest.mark.parametrize("ex_id", CH10)
def test_10_hints_do_not_give_the_answer(ex_id):
    sol = E.solution(ex_id)
    leaks = [str(sol)] + ([str(list(sol))] + [f"{v:g}" for v in sol] if isinstance(sol, tuple) else [])
    hint = E.EXERCISES[ex_id].hint
    for leak in leaks:
        if len(leak) > 1:  # single digits occur in any text ("E4M3", "m = 0, 1, 2")
            assert leak not in hint, (ex_id, leak)
    assert f"margin {sol}" not in hint if ex_id == "11.2" else True


def test_10_1_shared_exponents_come_from_quantize_mx(monkeypatch):
    from mpt_lab import formats as F
    from mpt_lab import microscaling

    k8, k4, stored = E.solution("11.1")
    assert (k8, k4) == (2 - F.FP8_E4M3.emax, 2 - F.FP4_E2M1.emax)  # amax 5.5 lies in [2^2, 2^3)
    assert stored in F.values(F.FP4_E2M1) * 2.0**k4
    assert not E.check("11.1", (k8 + 1, k4, stored))  # ⌈log2 amax⌉ instead of ⌊⌋
    assert not E.check("11.1", (2 - F.FP8_E5M2.emax, k4, stored))  # E5M2's emax
    assert not E.check("11.1", (k8, k4, -3.2))  # forgets to round
    assert not E.check("11.1", (k8, k4, -4.0))  # rounds the wrong way
    assert not E.check("11.1", (float(k8), k4, stored))  # the exponents are ints
    calls = []
    real = microscaling.quantize_mx
    monkeypatch.setattr(microscaling, "quantize_mx", lambda *a, **k: calls.append(1) or real(*a, **k))
    assert E.check("11.1", E.solution("11.1")) and calls


def test_10_2_margin_comes_from_delayed_scaling(monkeypatch):
    from mpt_lab import microscaling

    m = E.solution("11.2")
    assert m == 2
    hist, spike = max(E.ch11.EX112_HISTORY), E.ch11.EX112_NEXT
    assert spike * 448 / hist / 2 ** (m - 1) > 464 >= spike * 448 / hist / 2**m  # the smallest that fits
    fb = E.check("11.2", m - 1)
    assert not fb and "saturates" in fb.message
    fb = E.check("11.2", m + 1)
    assert not fb and "smaller" in fb.message
    assert not E.check("11.2", -1) and not E.check("11.2", 2.0)
    calls = []
    real = microscaling.DelayedScaling
    monkeypatch.setattr(microscaling, "DelayedScaling", lambda *a, **k: calls.append(1) or real(*a, **k))
    assert E.check("11.2", m) and calls


# ----------------------------------------------------------------------------------------------------------
# The worked solution under each exercise
# ----------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("ex_id", E.list_exercises())
def test_solution_dropdown_is_collapsed_and_escaped(ex_id):
    d = E.solution_dropdown(ex_id)
    html_text = d._repr_html_()
    assert html_text.startswith('<details class="mpt-solution"') and "<details open" not in html_text
    assert f"Solution to exercise {ex_id}" in html_text and html_text.rstrip().endswith("</details>")
    assert d.text.strip() and "<script" not in html_text
    assert ex_id in repr(d) and d.text not in repr(d)  # the plain repr does not print the solution


def test_solution_dropdown_renders_worked_text():
    ex = E.Exercise(
        "99.1",
        "t",
        "p",
        lambda a: (True, ""),
        "h",
        lambda: 0.5,
        worked="First <b>not bold</b> and `x < y`.\n\n```python\nprint(1 < 2)\n```\n\nThe answer is {answer}.",
    )
    h = E.SolutionDropdown(ex)._repr_html_()
    assert "&lt;b&gt;not bold&lt;/b&gt;" in h and "<code>x &lt; y</code>" in h
    assert "<pre" in h and "print(1 &lt; 2)" in h and "The answer is 0.5." in h


def test_every_chapter_module_registers_only_its_own_chapter():
    import importlib

    for name in E.CHAPTER_MODULES:
        mod = importlib.import_module(f"mpt_lab.exercises.{name}")
        chapter = int(name[2:])
        ids = [
            k
            for k, ex in E.EXERCISES.items()
            if ex.checker.__module__ == mod.__name__ or getattr(ex.checker, "__module__", "") == mod.__name__
        ]
        assert ids and all(k.split(".")[0] == str(chapter) for k in ids), name


# ----------------------------------------------------------------------------------------------------------
# Chapters 9-11: the code in each worked solution runs and is right
# ----------------------------------------------------------------------------------------------------------
def _fenced_python(exercise_id):
    """The ```python blocks of an exercise's worked solution, joined (it must have one)."""
    code = _fenced_code(exercise_id)
    assert code, f"the worked solution of {exercise_id} has no python block"
    return code


@pytest.mark.parametrize("ex_id, name", [("9.2", "safe_softmax"), ("10.2", "ring_sum")])
def test_worked_solution_code_passes_the_check(ex_id, name):
    """A function exercise's worked solution holds a short implementation a student could write (no call into
    the reference); run it as written, and it passes the exercise's check."""
    code = _fenced_python(ex_id)
    assert "_reference" not in code and "ring_allreduce" not in code and "attention_overflow" not in code
    fb = E.check(ex_id, _run_worked(code, ex_id)[name])
    assert fb and fb.answered, fb.message


@pytest.mark.parametrize("ex_id", ["10.3", "11.2"])
def test_worked_solution_code_computes_the_answer(ex_id):
    """A value exercise's worked solution that shows its computation computes the reference answer."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the code a student copies runs without warnings
        namespace = _run_worked(_fenced_python(ex_id), ex_id)
    assert namespace["answer"] == E.solution(ex_id) and E.check(ex_id, namespace["answer"])


@pytest.mark.parametrize("ex_id", ["9.1", "9.2", "10.1", "10.2", "10.3", "11.1", "11.2"])
def test_worked_solutions_of_chapters_9_to_11_explain_and_show_the_answer(ex_id):
    """Each worked solution is a written explanation (not only the reference answer) and shows the reference
    answer, inserted at display time."""
    ex = E.get_exercise(ex_id)
    text = E.solution_dropdown(ex_id).text
    assert ex.worked and len(ex.worked.split()) > 80
    answer = E.solution(ex_id)
    if not callable(answer):  # a value: shown, inserted at display time, never typed
        assert "{answer}" in ex.worked and (repr(answer) in text or str(answer) in text)
    else:  # a function: the worked code, not the package's reference, is shown
        assert "```python" in ex.worked and "_reference" not in text


# Worked solutions (issue 26, item 19): chapters 1-4 have one for every exercise; code in them runs and passes
# ----------------------------------------------------------------------------------------------------------
def _fenced_function(ex_id):
    """The last top-level function defined in the worked solution's fenced ```python block, executed."""
    import ast

    code = _fenced_code(ex_id)
    if not code:
        return None
    names = [n.name for n in ast.parse(code).body if isinstance(n, ast.FunctionDef)]
    return _run_worked(code, ex_id)[names[-1]]


FIRST_CHAPTERS = [k for k in E.list_exercises() if int(k.split(".")[0]) <= 4]


@pytest.mark.parametrize("ex_id", FIRST_CHAPTERS)
def test_chapters_1_to_4_have_worked_solutions(ex_id):
    ex, text, sol = _explained_solution(ex_id)
    if callable(sol):  # a function exercise: a student's implementation
        assert "```python" in ex.worked and "{answer}" not in ex.worked
        code = _fenced_code(ex_id)
        assert "mpt_lab" not in code  # written from the rules, not a call into the package
    else:  # a value exercise: the answer inserted, never typed
        assert "{answer}" in ex.worked
        assert (repr(sol) if isinstance(sol, float) else str(sol)) in text


@pytest.mark.parametrize("ex_id", [k for k in FIRST_CHAPTERS if "```python" in E.EXERCISES[k].worked])
def test_worked_solution_code_passes_its_check(ex_id):
    """Chapters 1-4: the last function a worked solution defines passes the check (chapters 9-11: see
    test_worked_solution_code_passes_the_check and ..._computes_the_answer above)."""
    fn = _fenced_function(ex_id)
    fb = E.check(ex_id, fn)
    assert fb.passed, (ex_id, str(fb))


def test_worked_solution_examples_hold():
    """Numbers the worked solutions of chapters 1-4 state in their reasoning."""
    choose_scale = _fenced_function("2.1")
    assert choose_scale(3.0, 448.0) == 128.0 and choose_scale(65504.0 / 8) == 8.0
    survives = _fenced_function("4.1")
    assert survives(1.0, 2.0**-11 * 1.001) and not survives(1.0, 2.0**-11)  # upward: 2^-11
    assert not survives(1.0, -(2.0**-12)) and survives(1.0, -(2.0**-12) * 1.001)  # downward: 2^-12
    assert E.solution("1.5") == 0.5 and not E.check("1.5", 0.25)
    from mpt_lab import formats as F

    assert F.round_to(1024.0 - 0.25, F.FP16) == 1024.0 != F.round_to(1024.0 - 0.2501, F.FP16)  # 1.5's downward note
    update_scale = _fenced_function("3.1")
    assert update_scale(2.0**127, 0, False, 2.0, 0.5, 1) == (2.0**127, 0)
    assert update_scale(2.0**126, 0, False, 2.0, 0.5, 1) == (2.0**127, 0)


def test_help_shows_no_answer():
    """help(mpt_lab.exercises) and help() of the chapter modules print no reference answer (issue 26, item 21)."""
    import pydoc

    texts = [pydoc.render_doc(E, renderer=pydoc.plaintext)]
    texts += [pydoc.render_doc(getattr(E, m), renderer=pydoc.plaintext) for m in ("ch01", "ch02", "ch03", "ch04")]
    for k in FIRST_CHAPTERS:
        sol = E.solution(k)
        if callable(sol):
            continue
        answer = repr(sol) if isinstance(sol, (float, str)) else str(sol)
        for t in texts:
            assert answer not in t, (k, answer)
    assert 'check("1.1", my_answer)' in texts[0] and "129" not in texts[0]


@pytest.mark.parametrize("ex_id", E.list_exercises())
def test_worked_solutions_name_functions_as_their_prompts_do(ex_id):
    """A worked solution shows the function the prompt asks for (kahan_sum), never the package's private
    reference name (_ex52_reference)."""
    assert "_reference" not in E.solution_dropdown(ex_id).text


# ----------------------------------------------------------------------------------------------------------
# Issue 29, item 5: a raising function shows its call and traceback; wrong answers that passed; clear messages
# ----------------------------------------------------------------------------------------------------------
def test_a_raising_function_shows_its_arguments_and_traceback():
    def survives(w, u):
        if w > 2:
            return 1 / (u - u)  # raises on the checker's first w above 2
        return E.solution("4.1")(w, u)

    fb = E.check("4.1", survives)
    assert not fb and fb.answered and fb.hint
    assert fb.message.startswith("survives(") and "raised ZeroDivisionError" in fb.message
    w = float(fb.message[len("survives(") :].split(",")[0])
    assert w > 2  # the arguments of the call that raised, every digit
    assert fb.details.startswith("Traceback (most recent call last):")
    assert "in survives" in fb.details and "return 1 / (u - u)" in fb.details and "ZeroDivisionError" in fb.details
    assert "_core.py" not in fb.details  # from the reader's frame on: the checker's wrapper left out
    assert fb.details.strip() in str(fb).replace("\n   ", "\n") and "<pre" in fb._repr_html_()
    assert "return 1 / (u - u)" in fb._repr_html_()

    def kahan_sum(values):  # an array argument is summarised, not printed whole
        return values[10**6]

    fb = E.check("5.2", kahan_sum)
    assert fb.message.startswith("kahan_sum(array of shape (3000,), dtype float32: [1, 1, 1, …]) raised IndexError")
    assert "values[10**6]" in fb.details
    fb = E.check("7.2", lambda model, dtype: model.no_such_attribute)
    assert "<lambda>(Sequential(…), torch.float32) raised AttributeError" in fb.message
    fb = E.check("1.4", lambda s, e, m: [0.0][m])  # a later call that raises: the call that did
    assert "<lambda>(0, 0, 1) raised IndexError" in fb.message and "in <lambda>" in fb.details
    fb = E.check("1.4", E.solution("1.4"))
    assert fb and fb.details == ""


def test_12_shows_where_the_readers_loss_raised():
    model, _, batch, name = E.solution("12.1")()

    def planted():
        def loss_fn(m, b):
            raise ValueError("my loss is broken")

        return model, loss_fn, batch, name

    fb = E.check("12.1", planted)
    assert not fb and "my loss is broken" in fb.message
    assert 'raise ValueError("my loss is broken")' in fb.details and "in loss_fn" in fb.details


def test_wrong_answers_that_passed_before_fail():
    # 2.1: the default limit is FP16's
    fb = E.check("2.1", lambda amax, fmt_max=448.0: E.solution("2.1")(amax, fmt_max))
    assert not fb and "without fmt_max" in fb.message
    # 3.1: growth_factor and backoff_factor are arguments, not 2 and 0.5
    fb = E.check("3.1", lambda s, t, f, g, b, n: E.solution("3.1")(s, t, f, 2.0, 0.5, n))
    assert not fb and "growth_factor=4.0" in fb.message and "multiplies the scale by growth_factor" in fb.message
    fb = E.check("3.1", lambda s, t, f, g, b, n: E.solution("3.1")(s, t, f, g, 0.5, n))
    assert not fb and "backoff_factor" in fb.message
    # 7.1: NaN is no number of bytes (NaN compares false with everything)
    sol = E.solution("7.1")
    for bad in ({"fp32": math.nan, "mixed": sol["mixed"]}, {"fp32": sol["fp32"], "mixed": math.inf}):
        assert not E.check("7.1", bad)

    # 2.2: the arrays handed to the reader's function are copies (a function that changes them cannot change
    # the truth it is compared with)
    def share_below(exponents, counts, zeros, total, k):
        counts[:] = 0
        return zeros / total

    assert not E.check("2.2", share_below)


def test_messages_say_what_was_wrong():
    fb = E.check("5.1", {"fp16": 512.0, "BF16": 64.0})
    assert not fb and 'expected the keys "FP16" and "BF16"' in fb.message and "'fp16'" in fb.message
    assert "expected a dict" not in fb.message
    fb = E.check("5.1", [512.0, 64.0])
    assert "expected a dict" in fb.message and "list" in fb.message
    fb = E.check("5.1", {"FP16": "512", "BF16": 64.0})
    assert "str for 'FP16'" in fb.message
    fb = E.check("6.2", [str(v) for v in E.solution("6.2")])
    assert "12 entries, but entries 1, 2, 3, 4, 5, … are str" in fb.message
    fb = E.check("9.1", [int(v) for v in E.solution("9.1")])
    assert "bools" in fb.message and "are int" in fb.message
    fb = E.check("7.1", {"fp32": "16", "mixed": 20})
    assert "str for 'fp32'" in fb.message and "keys" not in fb.message
    k, lost = E.solution("8.1")
    assert "g = 1/(V·B)" in E.check("8.1", (k + 3, lost)).message
    n, mean = E.solution("10.3")
    fb = E.check("10.3", (n + 5, mean))
    assert "fewer ranks" in fb.message and "one rank earlier" not in fb.message
    assert "still finite" in E.check("10.3", (n - 1, mean)).message


# ------------------------------------------------------------------------------------------------------------
# Chapter 13
# ------------------------------------------------------------------------------------------------------------
CH13 = ["13.1", "13.2"]


def test_13_exercises_are_listed_with_prompt_hint_and_title():
    assert E.list_exercises(13) == CH13
    for k in CH13:
        ex = E.EXERCISES[k]
        assert ex.title and ex.hint and E.show(k).startswith(f"Exercise {k}: {ex.title}") and "Answer with" in ex.prompt


@pytest.mark.parametrize("ex_id", CH13)
@pytest.mark.parametrize("odd", ODD_ANSWERS, ids=lambda a: type(a).__name__)
def test_13_wrong_types_fail_without_raising(ex_id, odd):
    test_wrong_types_fail_without_raising(ex_id, odd)


@pytest.mark.parametrize("ex_id", CH13)
def test_13_hints_do_not_give_the_answer(ex_id):
    sol = E.solution(ex_id)
    hint = E.EXERCISES[ex_id].hint
    for leak in [str(sol), str(list(sol))] + [f"{v:g}" for v in sol] + [f"{v:.3g}" for v in sol]:
        if len(leak) > 1:
            assert leak not in hint, (ex_id, leak)


def test_13_1_stochastic_rounding_sum_is_the_exact_sum_on_average():
    from mpt_lab import formats as F

    rtn, mean, std = E.solution("13.1")
    v, n = E.ch13.EX131_VALUE, E.ch13.EX131_TOKENS
    assert rtn == 0.0 and mean == pytest.approx(n * v) and std == pytest.approx(0.5 * math.sqrt(n * 0.4 * 0.6))
    # the package's own stochastic rounding agrees: 64 sums of n draws, mean within 4 standard errors of n·v
    import torch

    g = torch.Generator().manual_seed(0)
    sums = [
        float(F.round_to(torch.full((n,), v), F.FP4_E2M1, rounding="stochastic", generator=g).sum()) for _ in range(64)
    ]
    assert abs(np.mean(sums) - mean) < 4 * std / 8 and 0.5 * std < np.std(sums) < 1.5 * std
    assert not E.check("13.1", (n * 0.5, mean, std))  # rounds up instead of to nearest
    assert not E.check("13.1", (rtn, n * 0.5 * 0.5, std))  # p = 1/2
    fb = E.check("13.1", (rtn, mean, std / 0.5))
    assert not fb and "spacing" in fb.message  # forgets the spacing of the two values
    assert not E.check("13.1", (rtn, mean, 0.5 * n * 0.4 * 0.6))  # the variance, not the deviation
    assert E.check("13.1", [np.float64(rtn), mean, std])


def test_13_2_shares_come_from_quantize_nvfp4(monkeypatch):
    from mpt_lab import microscaling

    one, two = E.solution("13.2")
    assert two == 0.0 and 0.5 < one < 1  # 2D tiles: the same values both ways
    assert not E.check("13.2", (one, one)) and not E.check("13.2", (100 * one, 0.0))
    fb = E.check("13.2", (1 - one, 0.0))
    assert not fb and "1D" in fb.message
    calls = []
    real = microscaling.quantize_nvfp4
    monkeypatch.setattr(microscaling, "quantize_nvfp4", lambda *a, **k: calls.append(k.get("blocks")) or real(*a, **k))
    assert E.check("13.2", (one, two)) and set(calls) == {"1d", "2d"}


@pytest.mark.parametrize("ex_id", CH13)
def test_13_worked_solutions_explain_and_their_code_computes_the_answer(ex_id):
    import warnings

    ex, text, answer = _explained_solution(ex_id)
    assert "{answer}" in ex.worked and str(answer) in text and len(ex.worked.split()) > 80
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        namespace = _run_worked(_fenced_python(ex_id), ex_id)
    assert namespace["answer"] == pytest.approx(answer) and E.check(ex_id, namespace["answer"])
