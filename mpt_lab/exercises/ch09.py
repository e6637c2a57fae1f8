"""Exercises of chapter 9: graphs in half precision."""

from __future__ import annotations

import math

import numpy as np
import torch

from .. import formats as F
from ._core import Exercise, as_list, entries_text, register, short

#: Exercise 9.1's attention logits.
EX91_LOGITS = (-20.0, 0.0, 5.5, 10.5, 11.0, 11.08, 11.1, 12.0, 16.0)


def _ex91_exp() -> list:
    """exp of each logit in float16 (torch.exp on a float16 tensor), as floats."""
    return torch.exp(torch.tensor(EX91_LOGITS, dtype=torch.float16)).tolist()


def _ex91_truth() -> list:
    """Whether exp of each logit overflows in float16."""
    return [math.isinf(v) for v in _ex91_exp()]


def _ex91_check(a):
    n = len(EX91_LOGITS)
    values = as_list(a)
    if values is None or len(values) != n or not all(isinstance(v, (bool, np.bool_)) for v in values):
        return False, (
            f"expected a list of {n} bools (True where exp overflows), one per logit, got "
            f"{entries_text(a, values, n, lambda v: isinstance(v, (bool, np.bool_)))}"
        )
    truth = _ex91_truth()
    wrong = sum(bool(v) != t for v, t in zip(values, truth))
    if wrong:
        return False, f"{wrong} of the {n} entries are not right."
    over = [f"{e:g}" for e, t in zip(EX91_LOGITS, truth) if t]
    under = [f"{e:g}" for e, v in zip(EX91_LOGITS, _ex91_exp()) if v == 0]
    return True, (
        f"exp overflows FP16 for {', '.join(over)}: ln(65504) ≈ {math.log(F.FP16.max):.4f}, and a logit "
        "is rounded to FP16 before exp sees it."
        + (f" (exp of {', '.join(under)} underflows to 0 instead: no trouble for a softmax.)" if under else "")
    )


def _ex91_worked() -> str:
    """Exercise 9.1's worked solution; every number in it computed here (NumPy's float16 is IEEE binary16)."""
    limit = math.log(F.FP16.max)
    tie = F.FP16.max + F.ulp(F.FP16.max, F.FP16) / 2  # 65520: where round-to-nearest goes to inf
    near = [e for e in EX91_LOGITS if 10 < e < 12]
    stored = {e: float(np.float16(e)) for e in near}
    rows = "\n".join(
        f"  logit {e:g} → stored as {stored[e]!r} → exact exp {math.exp(stored[e]):,.0f}"
        f" → {'inf' if math.exp(stored[e]) >= tie else 'finite'}"
        for e in near
    )
    return f"""FP16's largest finite value is {F.FP16.max:g}, so exp overflows for every logit above ln({F.FP16.max:g}) = {limit:.4f}. Two details decide the logits close to that line.

First, the logit is a float16 value before exp sees it: between 8 and 16, FP16 values are 2^-7 = {2**-7} apart, so a logit such as 11.08 is stored as the nearest multiple of 2^-7. Second, exp's exact result is rounded to FP16 with round-to-nearest-even: a result below {tie:g}, halfway between {F.FP16.max:g} and {2 * tie - F.FP16.max:g} (the next value FP16 would have with one more exponent), still rounds to {F.FP16.max:g}; at or above {tie:g} it becomes inf.

```
{rows}
```

Far from the line nothing is subtle: exp(0) = 1 and exp(5.5) ≈ {math.exp(5.5):.0f} are finite, exp(12) and exp(16) overflow, and exp(-20) ≈ {math.exp(-20):.2g} is below FP16's smallest subnormal {F.FP16.smallest_subnormal:.3g}, so it underflows to 0, which does a softmax no harm. The answer, in the order of the logits: {{answer}}."""


register(
    Exercise(
        "9.1",
        "Which attention logits overflow?",
        f"These attention logits are stored in float16 and exponentiated in float16 (torch.exp on a float16 tensor): "
        f"{list(EX91_LOGITS)}. Which results are inf? Answer with a list of {len(EX91_LOGITS)} bools, True where "
        "exp overflows, in the order of the logits.",
        _ex91_check,
        "FP16's largest finite value is 65504; which x has exp(x) = 65504? A logit is rounded to float16 first "
        "(between 8 and 16, FP16 values are 2^-7 apart), and exp's result is rounded to nearest too.",
        _ex91_truth,
        _ex91_worked(),
    )
)


def _ex92_reference(e):
    """Softmax over one node's incoming edges in float16, the maximum subtracted first (reference solution
    of exercise 9.2): PyTorch Geometric's softmax, via :func:`mpt_lab.models.gat.attention_overflow`."""
    from ..models.gat import attention_overflow  # imports PyTorch Geometric: only when 9.2 is checked

    return torch.tensor(attention_overflow(e.float())["max_subtracted_fp16"], dtype=torch.float16)


def ex92_cases() -> list:
    """Sets of float16 logits: ordinary ones, ones whose exp overflows FP16, FP32 too, ties, single edges."""
    rng = np.random.default_rng(82)
    cases = [[12.0, 11.0, 0.0], [300.0, 299.0, -5.0], [5.0], [-1000.0, 1000.0], [11.5] * 4, [0.0, 0.0]]
    for i in range(60):
        n = int(rng.integers(1, 50))
        cases.append(
            [
                rng.normal(0, 3, n),
                rng.normal(12, 2, n),
                rng.uniform(-5, 300, n),
                np.full(n, rng.uniform(-50, 50)),
                rng.uniform(-1000, 1000, n),
            ][i % 5].tolist()
        )
    return cases


def _ex92_check(fn):
    if not callable(fn):
        return False, f"expected a function safe_softmax(e) -> float16 Tensor, got {type(fn).__name__}"
    cases = ex92_cases()
    for logits in cases:
        e = torch.tensor(logits, dtype=torch.float16)
        ref = torch.softmax(e.float(), 0)
        got = fn(e.clone())
        where = f"safe_softmax of the logits {short(e.tolist())}"
        if not isinstance(got, torch.Tensor) or got.dtype != torch.float16 or got.shape != e.shape:
            what = (
                f"a {got.dtype} tensor of shape {tuple(got.shape)}"
                if isinstance(got, torch.Tensor)
                else type(got).__name__
            )
            return False, f"{where} returned {what}; expected a float16 tensor of shape {tuple(e.shape)}."
        err = (got.float() - ref).abs()
        if not bool(torch.isfinite(got).all()) or float(err.max()) > 2e-3:
            i = int(torch.nan_to_num(err, nan=math.inf).argmax())
            return False, f"{where}: entry {i} is {float(got[i])!r}, the FP32 softmax gives {float(ref[i])!r}."
    return True, (
        f"finite and within 2·10⁻³ of the FP32 softmax on {len(cases)} sets of logits, including ones "
        "whose exp overflows FP16 (and FP32)."
    )


register(
    Exercise(
        "9.2",
        "A softmax that does not overflow",
        "Write safe_softmax(e) -> Tensor: the softmax over the edges entering one node, where e is a 1-D float16 "
        "tensor of attention logits (one per edge, at least one). Compute it in float16 so that it stays finite for "
        "any finite float16 logits, and return a float16 tensor of e's shape. The check compares it with the FP32 softmax "
        f"on {len(ex92_cases())} sets of logits, some as large as 1000 (exp overflows FP16, and FP32 too): every "
        "entry must be within 2·10⁻³.",
        _ex92_check,
        "softmax(e) = softmax(e − c) for any constant c, because the factor exp(−c) cancels between numerator and "
        "denominator. Choose c so that no exponent is positive.",
        lambda: _ex92_reference,
        f"""exp overflows FP16 above ln({F.FP16.max:g}) ≈ {math.log(F.FP16.max):.2f}, and a logit of 1000 overflows even FP32, so exp must never see the logits as they are. The softmax does not change when every logit is shifted by the same constant c: exp(e_i − c) / Σ_j exp(e_j − c) = exp(−c)·exp(e_i) / (exp(−c)·Σ_j exp(e_j)), and the factor exp(−c) cancels.

Choose c = max(e). Then every exponent e_i − c is ≤ 0, so every exp lies in (0, 1] and cannot overflow; the largest is exactly exp(0) = 1, so the denominator is at least 1 and the division cannot produce inf or NaN. The subtraction itself rounds to float16, by at most half an ulp of e_i − c: that changes exp(e_i − c) by a relative error of about |e_i − c|·2^-11, small where the weight is large (e_i near the maximum, where e_i − c is exact or nearly so) and harmless where |e_i − c| is large, because the weight is then tiny or 0.

```python
import torch

def safe_softmax(e):
    z = e - e.max()        # every exponent <= 0; the largest is exactly 0
    w = torch.exp(z)       # in (0, 1], float16; the largest is 1
    return w / w.sum()     # the sum is >= 1: no overflow, no 0/0
```

Everything stays float16: torch.exp, the sum (PyTorch's CPU kernel accumulates it in a wider format and rounds once) and the division. This is what PyTorch Geometric's `softmax` does per node, with the maximum taken over the edges entering each node (the book's reference answer calls it, through `mpt_lab.models.gat.attention_overflow`).""",
    )
)
