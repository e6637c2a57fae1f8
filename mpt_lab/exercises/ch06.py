"""Exercises of chapter 6: automatic mixed precision in practice."""

from __future__ import annotations

import math

from ._core import Exercise, register, is_real, as_list, entries_text


#: The ops of exercise 6.1 (names of :data:`mpt_lab.autocast.OPS`) and the expression each one stands for.
EX61_OPS = {
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


def _ex61_truth() -> dict:
    """op name → the dtype name it returns under CUDA float16 autocast from float16 inputs, probed from
    PyTorch's dispatcher by :func:`mpt_lab.autocast.probe_autocast` (on fake CUDA tensors without a GPU)."""
    import torch

    from ..autocast import probe_autocast

    return dict(probe_autocast("cuda", torch.float16, input_dtype=torch.float16, ops=tuple(EX61_OPS)).ops)


def _dtype_name(value):
    """"float16"/"float32" from a str ("float16", "torch.float16") or a torch.dtype; None for anything else."""
    import torch

    if isinstance(value, torch.dtype):
        value = str(value)
    if not isinstance(value, str):
        return None
    name = value.strip().removeprefix("torch.")
    return name if name in ("float16", "float32") else None


def _ex61_check(a):
    keys = list(EX61_OPS)
    if not isinstance(a, dict):
        return False, (f'expected a dict {{op name: "float16" or "float32"}} with the keys {keys}, '
                       f"got {type(a).__name__}")
    missing, unknown = [k for k in keys if k not in a], [k for k in a if k not in EX61_OPS]
    if missing or unknown:
        return False, (f"expected a dict with exactly the keys {keys}"
                       + (f"; missing: {missing}" if missing else "") + (f"; not asked: {unknown}" if unknown else ""))
    names = {k: _dtype_name(a[k]) for k in keys}
    bad = [k for k in keys if names[k] is None]
    if bad:
        return False, f'expected "float16" or "float32" (or torch.float16 / torch.float32) as each value; not so for {bad}'
    truth = _ex61_truth()
    wrong = [k for k in keys if names[k] != truth[k]]
    if wrong:
        return False, (f"{len(wrong)} of the {len(keys)} dtypes are not what torch.autocast('cuda', "
                       "dtype=torch.float16) returns from float16 inputs.")
    low = [k for k in keys if truth[k] == "float16"]
    return True, (f"all {len(keys)} right: autocast's CUDA policy returns float16 for {', '.join(low)} and runs "
                  "the others in float32, even from float16 inputs.")


register(Exercise(
    "6.1", "Read autocast's CUDA policy",
    "Under torch.autocast(\"cuda\", dtype=torch.float16), with float16 inputs x [8, 16] and w [16, 16], which "
    "dtype does each of these ops return? " + "; ".join(f"{k!r}: {v}" for k, v in EX61_OPS.items())
    + ". Answer with a dict {op name: \"float16\" or \"float32\"} with exactly these keys (the names of "
    "mpt_lab.autocast.OPS). Predict first. The chapter's table shows seven of these ops; elu and mul + sum are "
    "not in it: reason them out from autocast's rules (the hint), then check your whole answer here.",
    _ex61_check,
    "Autocast sorts ops into three groups on CUDA: ops it casts to float16 (matrix products, convolutions), "
    "ops it runs in float32 whatever their input (exponentials, reductions, normalisations, losses), and ops "
    "it leaves alone, which return their input's dtype. For a chain, the last op decides.",
    _ex61_truth,
    worked="""Autocast on CUDA sorts ops into three groups (the `torch.amp` autocast op reference): ops it casts \
to float16 before running them (matrix products, convolutions), ops it runs in float32 whatever the dtype of \
their inputs (exponentials, logs, reductions such as sums, softmax, normalisations, losses), and every other op, \
which autocast leaves alone and which returns the dtype of its inputs. With float16 inputs, the third group \
returns float16.

Op by op:

`x @ w`: a matrix product, cast to float16 → float16.

`relu`, `x + x`: not on either list, run in their inputs' dtype → float16.

`exp`, `softmax`: on the float32 list → float32, even from float16 inputs.

`relu(linear(x, w))`: linear gives float16, relu keeps it → float16. In a chain the last op decides.

`softmax(linear(x, w))`: linear gives float16, softmax runs in float32 → float32.

`elu`: an element-wise activation like relu, on neither list → float16 (it is not in the chapter's table: this \
is the rule applied to an op you have not seen).

`(x * x).sum(-1)`: the product is element-wise and stays float16, then the sum, a reduction, runs in float32 \
→ float32. This is the attention score a·Wh of a graph attention layer (chapter 9).

The reference answer, probed from PyTorch's own dispatcher (`mpt_lab.autocast.probe_autocast` on fake CUDA \
tensors, so no GPU is needed): {answer}

Note that on a CPU the float32 list is shorter (the chapter's table): there softmax of float16 inputs stays \
float16. Probe the ops of your own model on the device you train on."""))


#: Exercise 6.2's GradScaler and overflow pattern (iterations counted from 1).
EX62 = {"init_scale": 1024.0, "growth_factor": 2.0, "backoff_factor": 0.5, "growth_interval": 3,
         "iterations": 12, "overflows": (5, 6, 11)}


def _ex62_truth() -> list:
    """The loss scale of each iteration, from running :class:`mpt_lab.scaling.GradScaler` on a one-weight model
    whose gradient is inf in the overflow iterations (the scaler's ``history``)."""
    import torch

    from ..scaling import GradScaler

    c = EX62
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


def _ex62_check(a):
    n = EX62["iterations"]
    values = as_list(a)
    if values is None or len(values) != n or not all(is_real(v) for v in values):
        return False, (f"expected a list of {n} numbers (the loss scale of iterations 1 to {n}), got "
                       f"{entries_text(a, values, n, is_real)}")
    truth = _ex62_truth()
    for i, (got, want) in enumerate(zip(values, truth), 1):
        if float(got) != want:
            right = f"iterations 1–{i - 1} are right" if i > 1 else "iteration 1 uses init_scale"
            return False, f"iteration {i} is the first whose loss scale is not right ({right})."
    return True, (f"the loss scales {', '.join(f'{v:g}' for v in truth)} are what mpt_lab.scaling.GradScaler "
                  "(torch.amp.GradScaler's rule) uses; the steps of iterations "
                  f"{', '.join(map(str, EX62['overflows']))} are skipped.")


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


register(Exercise(
    "6.2", "Follow a GradScaler",
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
    worked=_EX62_WORKED.format(**EX62, answer="{answer}")))
