"""Exercises of chapter 9: graphs in half precision."""

from __future__ import annotations

import math

import numpy as np

from .. import formats as F
from ._core import Exercise, register, as_list, short


#: Exercise 9.1's attention logits.
EX91_LOGITS = (-20.0, 0.0, 5.5, 10.5, 11.0, 11.08, 11.1, 12.0, 16.0)


def _ex91_exp() -> list:
    """exp of each logit in float16 (torch.exp on a float16 tensor), as floats."""
    import torch

    return torch.exp(torch.tensor(EX91_LOGITS, dtype=torch.float16)).tolist()


def _ex91_truth() -> list:
    """Whether exp of each logit overflows in float16."""
    return [math.isinf(v) for v in _ex91_exp()]


def _ex91_check(a):
    n = len(EX91_LOGITS)
    values = as_list(a)
    if values is None or len(values) != n or not all(isinstance(v, (bool, np.bool_)) for v in values):
        shape = f"{len(values)} entries" if values is not None else type(a).__name__
        return False, f"expected a list of {n} bools (True where exp overflows), one per logit, got {shape}"
    truth = _ex91_truth()
    wrong = sum(bool(v) != t for v, t in zip(values, truth))
    if wrong:
        return False, f"{wrong} of the {n} entries are not right."
    over = [f"{e:g}" for e, t in zip(EX91_LOGITS, truth) if t]
    under = [f"{e:g}" for e, v in zip(EX91_LOGITS, _ex91_exp()) if v == 0]
    return True, (f"exp overflows FP16 for {', '.join(over)}: ln(65504) ≈ {math.log(F.FP16.max):.4f}, and a logit "
                  "is rounded to FP16 before exp sees it."
                  + (f" (exp of {', '.join(under)} underflows to 0 instead: no trouble for a softmax.)"
                     if under else ""))


register(Exercise(
    "9.1", "Which attention logits overflow?",
    f"These attention logits are stored in float16 and exponentiated in float16 (torch.exp on a float16 tensor): "
    f"{list(EX91_LOGITS)}. Which results are inf? Answer with a list of {len(EX91_LOGITS)} bools, True where "
    "exp overflows, in the order of the logits.",
    _ex91_check,
    "FP16's largest finite value is 65504; which x has exp(x) = 65504? A logit is rounded to float16 first "
    "(between 8 and 16, FP16 values are 2^-7 apart), and exp's result is rounded to nearest too.",
    _ex91_truth))


def _ex92_reference(e):
    """Softmax over one node's incoming edges in float16, the maximum subtracted first (reference solution
    of exercise 9.2): PyTorch Geometric's softmax, via :func:`mpt_lab.experiments.gat_amp.attention_overflow`."""
    import torch

    from ..experiments.gat_amp import attention_overflow

    return torch.tensor(attention_overflow(e.float())["max_subtracted_fp16"], dtype=torch.float16)


def ex92_cases() -> list:
    """Sets of float16 logits: ordinary ones, ones whose exp overflows FP16, FP32 too, ties, single edges."""
    rng = np.random.default_rng(82)
    cases = [[12.0, 11.0, 0.0], [300.0, 299.0, -5.0], [5.0], [-1000.0, 1000.0], [11.5] * 4, [0.0, 0.0]]
    for i in range(60):
        n = int(rng.integers(1, 50))
        cases.append([rng.normal(0, 3, n), rng.normal(12, 2, n), rng.uniform(-5, 300, n),
                      np.full(n, rng.uniform(-50, 50)), rng.uniform(-1000, 1000, n)][i % 5].tolist())
    return cases


def _ex92_check(fn):
    if not callable(fn):
        return False, f"expected a function safe_softmax(e) -> float16 Tensor, got {type(fn).__name__}"
    import torch

    cases = ex92_cases()
    for logits in cases:
        e = torch.tensor(logits, dtype=torch.float16)
        ref = torch.softmax(e.float(), 0)
        got = fn(e.clone())
        where = f"safe_softmax of the logits {short(e.tolist())}"
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


register(Exercise(
    "9.2", "A softmax that does not overflow",
    "Write safe_softmax(e) -> Tensor: the softmax over the edges entering one node, where e is a 1-D float16 "
    "tensor of attention logits (one per edge, at least one). Compute it in float16 so that it stays finite for "
    "any float16 logits, and return a float16 tensor of e's shape. The check compares it with the FP32 softmax "
    f"on {len(ex92_cases())} sets of logits, some as large as 1000 (exp overflows FP16, and FP32 too): every "
    "entry must be within 2·10⁻³.",
    _ex92_check,
    "softmax(e) = softmax(e − c) for any constant c, because the factor exp(−c) cancels between numerator and "
    "denominator. Choose c so that no exponent is positive.",
    lambda: _ex92_reference))
