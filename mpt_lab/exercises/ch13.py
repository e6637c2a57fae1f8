"""Exercises of chapter 13: four bits (NVIDIA's NVFP4 training recipe)."""

from __future__ import annotations

import math

import torch

from .. import formats as F
from .. import microscaling
from ._core import Exercise, as_list, is_real, register

#: Exercise 13.1: a gradient contribution (already divided by its block scale) and how many tokens add it up.
EX131_VALUE = 0.2
EX131_TOKENS = 4096
#: Exercise 13.2: the weight matrix, 0.02 · N(0, 1) from torch.Generator().manual_seed(EX132_SEED).
EX132_SEED = 13
EX132_SHAPE = (32, 48)


def _ex131_neighbours() -> tuple:
    """The two E2M1 values around EX131_VALUE (from :func:`mpt_lab.formats.values`)."""
    grid = sorted(float(v) for v in F.values(F.FP4_E2M1))
    lo = max(v for v in grid if v <= EX131_VALUE)
    hi = min(v for v in grid if v > EX131_VALUE)
    return lo, hi


def _ex131_truth() -> tuple:
    """(the sum with every contribution rounded to nearest, the expected sum with stochastic rounding, its standard
    deviation): round-to-nearest-even by :func:`mpt_lab.formats.round_to`; stochastic rounding goes up to the next
    E2M1 value with probability (v − lo) / (hi − lo), independently per token."""
    lo, hi = _ex131_neighbours()
    rtn = float(F.round_to(EX131_VALUE, F.FP4_E2M1)) * EX131_TOKENS
    p = (EX131_VALUE - lo) / (hi - lo)
    mean = EX131_TOKENS * (lo + p * (hi - lo))
    std = (hi - lo) * math.sqrt(EX131_TOKENS * p * (1 - p))
    return rtn, mean, std


def _ex131_check(a):
    values = as_list(a)
    if values is None or len(values) != 3 or not all(is_real(v) for v in values):
        return False, f"expected a tuple (rtn_sum, sr_mean, sr_std) of three numbers, got {a!r}"
    rtn, mean, std = _ex131_truth()
    lo, hi = _ex131_neighbours()
    if not math.isclose(float(values[0]), rtn, abs_tol=1e-9):
        return False, (
            f"{float(values[0])!r} is not the round-to-nearest sum: which E2M1 value is nearest to "
            f"{EX131_VALUE}, {lo:g} or {hi:g}?"
        )
    if not math.isclose(float(values[1]), mean, rel_tol=1e-9):
        return False, (
            f"{float(values[1])!r} is not the expected sum with stochastic rounding: each token gives "
            f"{hi:g} with some probability p and {lo:g} otherwise, and p makes the expectation exact."
        )
    if math.isclose(float(values[2]), std / (hi - lo), rel_tol=1e-6):
        return False, (
            f"{float(values[2])!r} counts in steps of 1: each token's draw moves by {hi - lo:g}, "
            "the spacing of the two E2M1 values, so multiply by it."
        )
    if not math.isclose(float(values[2]), std, rel_tol=1e-6):
        return False, (
            f"{float(values[2])!r} is not the standard deviation: the sum of {EX131_TOKENS} independent "
            "two-valued draws has variance N · p(1 − p) · spacing²."
        )
    return True, (
        f"to nearest, {EX131_VALUE} rounds to {rtn / EX131_TOKENS:g} and the sum is {rtn:g}: the "
        f"gradient is lost however many tokens add it up. Stochastically each token gives {hi:g} with "
        f"probability {(EX131_VALUE - lo) / (hi - lo):g}, so the sum is {mean:g} ± {std:.4g}: exact "
        f"on average, off by {100 * std / mean:.1f}% in one draw."
    )


def _ex131_worked() -> str:
    lo, hi = _ex131_neighbours()
    p = (EX131_VALUE - lo) / (hi - lo)
    return f"""Round to nearest. E2M1's values nearest to {EX131_VALUE} are {lo:g} and {hi:g} (its smallest positive value is a subnormal, {hi:g}: nothing lies between it and zero). {EX131_VALUE} is closer to {lo:g} (the midpoint is {(lo + hi) / 2:g}), so every token's contribution becomes {lo:g} and so does their sum. This is the bias stochastic rounding removes: a gradient whose contributions all lie below half the first step of their block's grid vanishes, token after token, step after step.

Stochastic rounding. A value v between two neighbours lo and hi rounds up to hi with probability p = (v − lo) / (hi − lo) = {p:g} and down otherwise, so its expected value is lo + p (hi − lo) = v exactly. The sum of {EX131_TOKENS} independent draws therefore has the expected value {EX131_TOKENS} · {EX131_VALUE} = {EX131_TOKENS * EX131_VALUE:g}, the exact sum. Each draw is a two-valued variable of variance p(1 − p)(hi − lo)²; the variances of independent draws add, and the standard deviation of the sum is (hi − lo) · √(N p (1 − p)).

```python
import math
from mpt_lab import formats as F

v, n = {EX131_VALUE}, {EX131_TOKENS}
grid = sorted(float(x) for x in F.values(F.FP4_E2M1))
lo = max(x for x in grid if x <= v)
hi = min(x for x in grid if x > v)
p = (v - lo) / (hi - lo)
answer = (float(F.round_to(v, F.FP4_E2M1)) * n, n * (lo + p * (hi - lo)), (hi - lo) * math.sqrt(n * p * (1 - p)))
```

The answer (rtn_sum, sr_mean, sr_std): {{answer}}. The relative noise of the sum falls as 1/√N: the more tokens (or steps) a gradient sums, the better stochastic rounding does, while round-to-nearest's error stays whatever N is. The NVIDIA paper's reasons for rounding only the gradients stochastically are measured ones, not this arithmetic (NVIDIA, 2025, §4.4): stochastic rounding of the gradients is essential for its 12B model's convergence; \"other tensors in the backward pass do not benefit from stochastic rounding, reinforcing that gradients are the primary source of bias\"; and in the forward pass it is detrimental, \"as it amplifies quantization error relative to nearest rounding\". This exercise shows why stochastic rounding pays where many rounded values are summed, not why the recipe gives it to the gradients only: the input x, the other operand of the same sum over the tokens, is summed just as much, and the recipe rounds it to nearest."""


register(
    Exercise(
        "13.1",
        "Stochastic rounding in a summed gradient",
        f"The weight gradient sums one contribution per token. Suppose that each of {EX131_TOKENS} tokens contributes "
        f"{EX131_VALUE} (already divided by its block's scale) and that each contribution is rounded to FP4 E2M1 "
        "before the sum, independently. What is the sum when every contribution is rounded to nearest-even, and, with "
        "stochastic rounding, what are the expected sum and its standard deviation? Answer with a tuple (rtn_sum, "
        "sr_mean, sr_std) of three numbers.",
        _ex131_check,
        "mpt_lab.formats.values(FP4_E2M1) lists the E2M1 values: find the two around the contribution. Stochastic "
        "rounding picks the upper one with a probability that makes the expected value exact; the variances of "
        "independent draws add.",
        _ex131_truth,
        _ex131_worked(),
    )
)


def _ex132_weight():
    g = torch.Generator().manual_seed(EX132_SEED)
    return 0.02 * torch.randn(*EX132_SHAPE, generator=g)


def _ex132_truth() -> tuple:
    """(share of W's elements that differ between the forward and the backward NVFP4 copy with 1D blocks, the same
    with 2D tiles), by :func:`mpt_lab.microscaling.quantize_nvfp4`."""
    w = _ex132_weight()
    out = []
    for blocks in ("1d", "2d"):
        fwd = microscaling.quantize_nvfp4(w, axis=-1, blocks=blocks).dequantize()
        bwd = microscaling.quantize_nvfp4(w, axis=0, blocks=blocks).dequantize()
        out.append(float((fwd != bwd).float().mean()))
    return tuple(out)


def _ex132_check(a):
    values = as_list(a)
    if values is None or len(values) != 2 or not all(is_real(v) for v in values):
        return False, f"expected a tuple (share_1d, share_2d) of two numbers in [0, 1], got {a!r}"
    one, two = _ex132_truth()
    n = EX132_SHAPE[0] * EX132_SHAPE[1]
    v1, v2 = float(values[0]), float(values[1])
    if not 0 <= v1 <= 1 or not 0 <= v2 <= 1:
        return False, f"expected shares in [0, 1] (not per cent), got {a!r}"
    if abs(v2 - two) > 0.5 / n:
        return False, (
            f"{v2!r} is not the share with 2D tiles: a 16 × 16 tile has one scale, so quantising along "
            "rows or along columns, does anything change?"
        )
    if abs(v1 - one) > 0.5 / n:
        return False, (
            f"{v1!r} is not the share with 1D blocks: quantise W with axis=-1 (blocks along a row) and "
            "with axis=0 (blocks along a column), dequantise both and compare element by element."
        )
    return True, (
        f"with 1 × 16 blocks {100 * one:.1f}% of the {n} weights differ between the copy the forward "
        "pass reads and the one the backward pass reads; with 16 × 16 tiles none do."
    )


register(
    Exercise(
        "13.2",
        "The weight the backward pass reads",
        f"A weight W of shape {EX132_SHAPE} is 0.02 · N(0, 1): W = 0.02 * torch.randn({EX132_SHAPE[0]}, "
        f"{EX132_SHAPE[1]}, generator=torch.Generator().manual_seed({EX132_SEED})). The forward GEMM reads W in NVFP4 blocks along its rows "
        "(quantize_nvfp4(W, axis=-1)), the input-gradient GEMM along its columns (axis=0). What share of W's elements "
        "get different values in the two copies with 1D blocks, and with 2D tiles (blocks='2d')? Answer with a tuple "
        "(share_1d, share_2d) of two numbers between 0 and 1.",
        _ex132_check,
        "mpt_lab.microscaling.quantize_nvfp4 takes axis= and blocks=; .dequantize() gives the values. Compare the "
        "two copies with != and take the mean.",
        _ex132_truth,
        f"""Why they differ. NVFP4 gives each block of 16 values one E4M3 scale, computed from that block's largest magnitude. Along a row a block holds 16 weights of one output feature; along a column, 16 weights of one input feature. The same weight sits in two different blocks with two different amaxes, so it is divided by two different scales and rounded to two different E2M1 values, unless it happens to land on the same grid point both times. With 16 × 16 tiles (NVIDIA's 2D weight scaling) the scale comes from the whole tile, and the tile is the same whichever way it is read: the two copies are the same values.

```python
import torch
from mpt_lab.microscaling import quantize_nvfp4

W = 0.02 * torch.randn({EX132_SHAPE[0]}, {EX132_SHAPE[1]}, generator=torch.Generator().manual_seed({EX132_SEED}))
shares = []
for blocks in ("1d", "2d"):
    forward = quantize_nvfp4(W, axis=-1, blocks=blocks).dequantize()    # blocks along each row (the K dimension)
    backward = quantize_nvfp4(W, axis=0, blocks=blocks).dequantize()    # blocks along each column (N)
    shares.append(float((forward != backward).float().mean()))
answer = tuple(shares)
```

The answer (share_1d, share_2d): {{answer}}. With 1D blocks most weights differ: the backward pass then computes the gradient of a slightly different network than the one whose loss the forward pass measured (the chapter measures how far apart they are on a trained model). 2D tiles cost a coarser scale (one per 256 weights instead of one per 16) and buy a backward pass that is exactly consistent with the forward one; NVIDIA's recipe uses them for the weights only, where the two passes read the same tensor.""",
    )
)
