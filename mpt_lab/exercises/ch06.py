"""Exercises of chapter 6: automatic mixed precision in practice."""

from __future__ import annotations

import math
import textwrap

import torch

from .. import autocast
from ..scaling import GradScaler
from ._core import Exercise, as_list, entries_text, is_real, register

#: The ops of exercise 6.1 (names of :data:`mpt_lab.autocast.OPS`; none of them is in the chapter's table of
#: :data:`~mpt_lab.autocast.RECIPE_OPS`): the expression each one stands for and the ATen ops it calls, in order.
EX61_OPS = {
    "elu": ("F.elu(x)", ("elu",)),
    "expm1": ("torch.expm1(x)", ("expm1",)),
    "mean": ("x.mean()", ("mean",)),
    "var": ("x.var(-1)", ("var",)),
    "batch_norm": ("F.batch_norm(x, None, None, training=True)", ("batch_norm",)),
    "mul + sum (a·Wh)": ("(x * x).sum(-1)", ("mul", "sum")),
    "linear → elu": ("F.elu(F.linear(x, w))", ("linear", "elu")),
}


def _ex61_truth() -> dict:
    """op name → the dtype name it returns under CUDA float16 autocast from float16 inputs, probed from
    PyTorch's dispatcher by :func:`mpt_lab.autocast.probe_autocast` (on fake CUDA tensors without a GPU)."""
    return dict(autocast.probe_autocast("cuda", torch.float16, input_dtype=torch.float16, ops=tuple(EX61_OPS)).ops)


def _ex61_lists() -> str:
    """Autocast's CUDA float16 lists of the installed PyTorch, as the prompt prints them."""
    lists = autocast.autocast_lists("cuda", torch.float16)
    what = {
        "lower_precision": "cast to float16 (lower_precision)",
        "float32": "run in float32 (float32)",
        "promote": "run in the widest dtype of their inputs (promote)",
        "banned": "refused (banned)",
    }
    out = [
        f"Autocast's CUDA lists in the installed PyTorch {torch.__version__.split('+')[0]} "
        '(mpt_lab.autocast.autocast_lists("cuda"), read from its dispatcher), ATen op names:'
    ]
    for policy, words in what.items():
        if lists[policy]:
            out.append(textwrap.fill(f"{words}: {', '.join(lists[policy])}.", width=110, subsequent_indent="    "))
    return "\n".join(out)


def _dtype_name(value):
    """ "float16"/"float32" from a str ("float16", "torch.float16") or a torch.dtype; None for anything else."""
    if isinstance(value, torch.dtype):
        value = str(value)
    if not isinstance(value, str):
        return None
    name = value.strip().removeprefix("torch.")
    return name if name in ("float16", "float32") else None


def _ex61_check(a):
    keys = list(EX61_OPS)
    if not isinstance(a, dict):
        return False, (
            f'expected a dict {{op name: "float16" or "float32"}} with the keys {keys}, got {type(a).__name__}'
        )
    missing, unknown = [k for k in keys if k not in a], [k for k in a if k not in EX61_OPS]
    if missing or unknown:
        return False, (
            f"expected a dict with exactly the keys {keys}"
            + (f"; missing: {missing}" if missing else "")
            + (f"; not asked: {unknown}" if unknown else "")
        )
    names = {k: _dtype_name(a[k]) for k in keys}
    bad = [k for k in keys if names[k] is None]
    if bad:
        return (
            False,
            f'expected "float16" or "float32" (or torch.float16 / torch.float32) as each value; not so for {bad}',
        )
    truth = _ex61_truth()
    wrong = [k for k in keys if names[k] != truth[k]]
    if wrong:
        return False, (
            f"{len(wrong)} of the {len(keys)} dtypes are not what torch.autocast('cuda', "
            "dtype=torch.float16) returns from float16 inputs."
        )
    high = [k for k in keys if truth[k] == "float32"]
    return True, (
        f"all {len(keys)} right: from float16 inputs autocast's CUDA policy returns float32 only for "
        f"{', '.join(high)} (a float32-list op is the last one they call); the others run in float16."
    )


register(
    Exercise(
        "6.1",
        "Read autocast's CUDA lists",
        'Under torch.autocast("cuda", dtype=torch.float16), with float16 inputs x [8, 16] and w [16, 16], which '
        "dtype does each of these ops return? "
        + "; ".join(
            f"{k!r}: {expr} (calls {', then '.join(f'aten::{o}' for o in aten)})"
            for k, (expr, aten) in EX61_OPS.items()
        )
        + ". Autocast casts the inputs of an op on its lower_precision list to float16, runs an op on its float32 "
        "list in float32, runs an op on its promote list in the widest dtype of its inputs, and leaves every other "
        "op alone: it runs in the dtype of its inputs. Find each ATen op in the lists printed below. Answer with a "
        'dict {op name: "float16" or "float32"} with exactly these keys (the names of mpt_lab.autocast.OPS). '
        "None of them is in the chapter's probe table.",
        _ex61_check,
        "Look up every ATen op an expression calls, by its exact name: an op's name on no list means autocast "
        "leaves it alone, whatever it computes inside. In a chain, each op sees the dtype the one before returned; "
        "the last op decides.",
        _ex61_truth,
        worked="""Autocast decides per ATen op, by name, from its lists (printed with the prompt, read from the \
installed PyTorch by `mpt_lab.autocast.autocast_lists`; the torch.amp documentation's "Autocast Op Reference" \
prints the same lists). An op on the lower_precision list has its inputs cast to float16; an op on the float32 \
list runs in float32 (its inputs cast up, or a float32 result requested from the kernel); an op on the promote \
list runs in the widest dtype among its inputs; and every other op is left alone and returns the dtype of its \
inputs, here float16. What an op computes inside does not matter, only its name on the list.

Op by op, with float16 inputs:

`F.elu(x)`: calls `aten::elu`, on no list → float16. ELU computes exp(x) − 1, and `expm1` is on the float32 \
list, but autocast sees only `aten::elu`: the kernel inside is not dispatched through autocast.

`torch.expm1(x)`: `aten::expm1` is on the float32 list → float32.

`x.mean()`: `aten::mean` is on no list → float16. Of the plain reductions only `sum` and `prod` are on the \
CUDA float32 list (beside `cumsum`, `cumprod`, `logsumexp` and the norms); a mean and a variance are not.

`x.var(-1)`: `aten::var`, on no list → float16.

`F.batch_norm(x, None, None, training=True)`: `aten::batch_norm`, on no list → float16. The normalisations \
on the float32 list are `layer_norm`, `group_norm` and `rms_norm`, not batch norm.

`(x * x).sum(-1)`: `aten::mul` is on no list and returns float16, then `aten::sum` is on the float32 list → \
float32. This is the attention score a·Wh of a graph attention layer (chapter 9).

`F.elu(F.linear(x, w))`: `aten::linear` runs in float16 (lower_precision), then `aten::elu`, on no list, keeps \
float16 → float16. In a chain the last op decides.

The reference answer, probed from PyTorch's own dispatcher (`mpt_lab.autocast.probe_autocast` on fake CUDA \
tensors, so no GPU is needed): {answer_items}.

On a CPU the lists differ (the chapter prints both): there `sum`, `softmax` and `expm1` are on no list and \
stay float16. Look up the ops of your own model in the lists of the device you train on.""",
        details=_ex61_lists,
    )
)


#: Exercise 6.2's GradScaler and overflow pattern (iterations counted from 1).
EX62 = {
    "init_scale": 1024.0,
    "growth_factor": 2.0,
    "backoff_factor": 0.5,
    "growth_interval": 3,
    "iterations": 12,
    "overflows": (5, 6, 11),
}


def _ex62_truth() -> list:
    """The loss scale of each iteration, from running :class:`mpt_lab.scaling.GradScaler` on a one-weight model
    whose gradient is inf in the overflow iterations (the scaler's ``history``)."""
    c = EX62
    w = torch.nn.Parameter(torch.ones(1))
    opt = torch.optim.SGD([w], lr=0.0)
    scaler = GradScaler(
        init_scale=c["init_scale"],
        growth_factor=c["growth_factor"],
        backoff_factor=c["backoff_factor"],
        growth_interval=c["growth_interval"],
    )
    for i in range(1, c["iterations"] + 1):
        g = math.inf if i in c["overflows"] else 1.0
        scaler.scale((w * g).sum()).backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad(set_to_none=True)
    return [scale for _, scale, _ in scaler.history]


def _ex62_check(a):
    n = EX62["iterations"]
    values = as_list(a)
    if values is None or len(values) != n or not all(is_real(v) for v in values):
        return False, (
            f"expected a list of {n} numbers (the loss scale of iterations 1 to {n}), got "
            f"{entries_text(a, values, n, is_real)}"
        )
    truth = _ex62_truth()
    for i, (got, want) in enumerate(zip(values, truth), 1):
        if float(got) != want:
            right = f"iterations 1–{i - 1} are right" if i > 1 else "iteration 1 uses init_scale"
            return False, f"iteration {i} is the first whose loss scale is not right ({right})."
    return True, (
        f"the loss scales {', '.join(f'{v:g}' for v in truth)} are what mpt_lab.scaling.GradScaler "
        "(torch.amp.GradScaler's rule) uses; the steps of iterations "
        f"{', '.join(map(str, EX62['overflows']))} are skipped."
    )


#: The worked solution of exercise 6.2 (the numbers of :data:`EX62` filled in when the module loads).
_EX62_WORKED = """The loss of iteration i is multiplied by the scale S the scaler holds when the iteration starts; \
`update()` at the end of the iteration decides the S of the next one. Its rule (`torch.amp.GradScaler`, the same \
as NVIDIA's guide): after an iteration whose gradients hold inf or NaN, `step()` skips the optimizer step and \
`update()` multiplies S by `backoff_factor` and empties the count of clean iterations; after a clean \
iteration it adds one to the count, and when the count reaches `growth_interval` it multiplies S by \
`growth_factor` and empties the count.

So go through the iterations keeping two numbers, S and the count. With `growth_interval` = {growth_interval}, iterations 1–3 \
are clean and run with `init_scale`; the third completes the interval, so S doubles from iteration 4 on (not in \
iteration 3: the update comes after the iteration). Iteration 5 overflows: S halves from iteration 6, and the \
count restarts. Iteration 6 overflows again: S halves once more. Then three clean iterations (7, 8, 9) double S \
from iteration 10, and the overflow of iteration 11 halves it for iteration 12.

The same in a few lines of Python, the rule written out:

```
scale, clean, trace = {init_scale!r}, 0, []   # init_scale; no clean iterations yet
for i in range(1, {iterations} + 1):
    trace.append(scale)        # the loss of iteration i is multiplied by this S
    if i in {overflows}:
        # inf in the gradients: step() skips the step, update() backs off
        scale, clean = scale * {backoff_factor!r}, 0
    else:
        clean += 1
        if clean == {growth_interval}:
            # growth_interval clean iterations in a row: grow
            scale, clean = scale * {growth_factor!r}, 0
answer = trace
```

The loss scales of iterations 1 to {iterations}: {answer}. Two classic mistakes: doubling S in the iteration that \
completes the interval instead of the next one, and keeping the count of clean iterations across an overflow."""


register(
    Exercise(
        "6.2",
        "Follow a GradScaler",
        f"A GradScaler(init_scale={EX62['init_scale']}, growth_factor={EX62['growth_factor']}, "
        f"backoff_factor={EX62['backoff_factor']}, growth_interval={EX62['growth_interval']}) runs "
        f"{EX62['iterations']} iterations of scaler.scale(loss).backward(), scaler.step(opt), scaler.update(). "
        f"The gradients contain inf in iterations {', '.join(map(str, EX62['overflows']))} (counting from 1) and "
        "are finite in all others. By which loss scale S is the loss multiplied in each iteration? Answer with a "
        f"list of {EX62['iterations']} floats, iteration 1 first.",
        _ex62_check,
        "S changes only in update(), at the end of an iteration, and the new S is used from the next iteration "
        "on. Keep a count of clean iterations since the start or the last overflow; an overflow empties it.",
        _ex62_truth,
        worked=_EX62_WORKED.format(**EX62, answer="{answer}"),
    )
)
