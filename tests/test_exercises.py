"""Exercise checks: reference solutions pass, wrong answers fail with a hint, bad input is reported."""

import pytest

from mpt_lab import exercises as E


@pytest.mark.parametrize("ex_id", E.list_exercises())
def test_reference_solutions_pass(ex_id):
    fb = E.check(ex_id, E.solution(ex_id))
    assert fb.passed and bool(fb) and "✅" in str(fb) and not fb.hint


@pytest.mark.parametrize("ex_id,wrong", [("1.1", 128), ("1.2", "0 0101 001"), ("1.3", 2.0**-11), ("1.5", 1.0),
                                          ("1.1", None), ("1.2", "01"), ("1.3", "x")])
def test_wrong_answers_fail_with_hint(ex_id, wrong):
    fb = E.check(ex_id, wrong)
    assert not fb and fb.hint and "hint" in str(fb) and "Hint" in fb._repr_html_()


def test_function_exercise_reports_first_mismatch():
    def no_subnormals(sign, exponent, mantissa):   # a classic mistake: forgets subnormals
        return E.solution("1.4")(sign, exponent, mantissa) if exponent else (-0.0 if sign else 0.0)

    fb = E.check("1.4", no_subnormals)
    assert not fb and "subnormal" in fb.message and "mantissa=1" in fb.message

    def raises(sign, exponent, mantissa):
        raise NotImplementedError

    fb = E.check("1.4", raises)
    assert not fb and "NotImplementedError" in fb.message
    assert not E.check("1.4", 3)


def test_unknown_exercise():
    with pytest.raises(ValueError, match="1.1"):
        E.check("9.9", 1)
    with pytest.raises(TypeError):
        E.check(1.1, 1)
    assert E.show("1.3").startswith("Exercise 1.3")
    assert E.list_exercises(1) == ["1.1", "1.2", "1.3", "1.4", "1.5"]
    assert E.list_exercises(2) == ["2.1", "2.2"]
    assert E.list_exercises(3) == ["3.1"]
    assert E.list_exercises(4) == ["4.1"]


def test_chapter2_wrong_functions_fail():
    import math

    assert not E.check("2.1", lambda amax, fmt_max=65504.0: 2.0 ** math.floor(math.log2(fmt_max / amax)) * 2)
    assert not E.check("2.2", lambda e, c, z, t, k: (c[e <= k].sum() + z) / t)   # off by one binade
    assert not E.check("2.2", lambda e, c, z, t, k: c[e < k].sum() / t)          # forgets the zeros


def test_chapter3_wrong_scaler_fails():
    def never_resets(scale, tracker, found_inf, g, b, n):
        if found_inf:
            return scale * b, tracker            # forgets to reset the count
        tracker += 1
        return (scale * g, 0) if tracker == n else (scale, tracker)

    fb = E.check("3.1", never_resets)
    assert not fb and "expected" in fb.message


def test_chapter4_naive_threshold_fails_on_ties():
    import numpy as np

    from mpt_lab import formats as F

    assert not E.check("4.1", lambda w, u: abs(u) >= F.ulp(w, F.FP16) / 2)           # ignores ties to even
    assert E.check("4.1", lambda w, u: bool(np.float16(np.float64(w) + u) != np.float16(w)))


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
