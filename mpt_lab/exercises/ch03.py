"""Exercises of chapter 3: loss scaling."""

from __future__ import annotations


import numpy as np

from ._core import Exercise, register


def _ex31_reference(scale: float, tracker: int, found_inf: bool, growth_factor: float = 2.0,
                    backoff_factor: float = 0.5, growth_interval: int = 2000) -> tuple:
    """Dynamic loss scaling, one update (reference solution of exercise 3.1): torch.amp.GradScaler's rule,
    :func:`mpt_lab.scaling.update_scale`."""
    from .. import scaling  # needs torch, which this module (like formats) does not

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


register(Exercise(
    "3.1", "A dynamic loss scaler",
    "Write update_scale(scale, tracker, found_inf, growth_factor, backoff_factor, growth_interval) -> "
    "(scale, tracker): on overflow multiply the scale by backoff_factor and reset the count of clean steps; "
    "otherwise count the step, and after growth_interval consecutive clean steps multiply the scale by "
    "growth_factor and reset the count.",
    _ex31_check,
    "Three cases: found_inf → (scale × backoff, 0); tracker + 1 == growth_interval → (scale × growth, 0); "
    "else (scale, tracker + 1).",
    lambda: _ex31_reference))
