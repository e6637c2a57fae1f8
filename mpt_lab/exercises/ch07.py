"""Exercises of chapter 7: memory."""

from __future__ import annotations

import copy
import math

import torch
import torch.nn.functional as Fn
from torch import nn

from .. import bench
from ..master_weights import MasterWeightTrainer
from ._core import Exercise, is_real, register


def _tensor_bytes(t) -> int:
    return t.numel() * t.element_size()


def _ex71_truth() -> dict:
    """Bytes per parameter of weights, gradients and Adam's state after one step of a real model (an MLP of
    82,240 parameters): FP32 training from its tensors' ``element_size()``, mixed precision from
    :meth:`mpt_lab.master_weights.MasterWeightTrainer.memory_per_parameter`; bytes per parameter, rounded to
    4 decimals."""

    def model():
        return nn.Sequential(nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 64))

    def adam(params):
        return torch.optim.Adam(params, lr=1e-3)

    g = torch.Generator().manual_seed(61)
    x, y = torch.randn(8, 256, generator=g), torch.randn(8, 64, generator=g)
    with torch.random.fork_rng(devices=[]):  # leave the student's random state alone
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
    return {"fp32": round(fp32, 4), "mixed": round(mixed, 4)}  # bytes per parameter, to 4 decimals


def _ex71_check(a):
    if not isinstance(a, dict) or set(a) != {"fp32", "mixed"} or not all(is_real(v) for v in a.values()):
        if not isinstance(a, dict):
            got = type(a).__name__
        elif set(a) != {"fp32", "mixed"}:
            got = f"a dict with keys {sorted(a, key=str)}"
        else:
            got = ", ".join(f"{type(v).__name__} for {k!r}" for k, v in a.items() if not is_real(v))
        return False, f'expected a dict {{"fp32": number, "mixed": number}} (bytes per parameter), got {got}'
    if not all(math.isfinite(float(v)) for v in a.values()):
        return False, f"expected finite numbers of bytes, got {a!r}"
    truth = _ex71_truth()
    wrong = [
        f"{k!r} is too {'high' if a[k] > truth[k] else 'low'}"
        for k in ("fp32", "mixed")
        if not abs(float(a[k]) - truth[k]) < 0.01
    ]
    if wrong:
        return False, "; ".join(wrong) + " (measured on a real model after one Adam step)."
    return True, (
        f"FP32 training with Adam keeps {truth['fp32']:.2f} bytes per parameter, mixed precision with FP32 "
        f"master weights {truth['mixed']:.2f} (measured after one step; Adam's step counters add the "
        "last digits): the masters cost memory, the savings come from the activations."
    )


register(
    Exercise(
        "7.1",
        "Bytes per parameter",
        "A large model is trained with Adam. FP32 training keeps per parameter the FP32 weight, its FP32 gradient "
        "and Adam's state. Mixed precision with FP32 master weights (the paper's loop, as "
        "mpt_lab.master_weights.MasterWeightTrainer runs it) keeps the FP32 master weight, the FP16 copy, the "
        "FP16 gradient, the FP32 gradient and Adam's state. How many bytes per parameter do these take in total, "
        "in each case (activations not counted; Adam's one step counter per tensor is negligible)? Answer with a "
        'dict {"fp32": number, "mixed": number}.',
        _ex71_check,
        "Add up element sizes: an FP32 value takes 4 bytes, an FP16 value 2. Adam keeps two running averages per "
        "parameter (exp_avg and exp_avg_sq); ask yourself in which dtype, given which weights it updates.",
        _ex71_truth,
        worked="""Count the tensors one parameter has, and the bytes of each: an FP32 value takes 4 bytes, an FP16 \
value 2 (`torch.empty((), dtype=...).element_size()`).

FP32 training keeps the weight (4), its gradient (4) and Adam's two running averages, `exp_avg` and \
`exp_avg_sq`, in the dtype of the weights they update (4 + 4).

Mixed precision as the paper's loop runs it keeps the FP32 master weight (4), the FP16 copy the forward and \
backward passes use (2), the FP16 gradient that backward produces (2), that gradient cast to FP32 for the update \
(4), and Adam's two averages, which update the FP32 masters and so are FP32 too (4 + 4).

```
import torch

fp32, fp16 = (torch.empty((), dtype=d).element_size() for d in (torch.float32, torch.float16))
answer = {"fp32": fp32 + fp32 + 2 * fp32,                      # weight, gradient, Adam's two averages
          "mixed": fp32 + fp16 + fp16 + fp32 + 2 * fp32}       # master, FP16 copy and gradient, FP32 gradient, Adam
```

Measured on a real model after one Adam step, in bytes per parameter (Adam's one step counter per tensor adds \
the last digits): {answer_items}. So the FP32 masters cost memory: per parameter, mixed precision keeps more than FP32 \
training. What it saves is elsewhere: the activations the backward pass keeps are stored in 16 bits, and in the chapter's \
ResNet they take far more memory than the parameters (its breakdown table); how much depends on the model and \
the batch.""",
    )
)


def _ex72_models() -> dict:
    """The models exercise 7.2 is checked on (more than 100,000 parameters each, so headers stay below 5 %)."""

    with torch.random.fork_rng(devices=[]):
        return {
            "an MLP 512 → 512 → 10": nn.Sequential(nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10)),
            "a CNN with BatchNorm": nn.Sequential(
                nn.Conv2d(3, 64, 3),
                nn.BatchNorm2d(64),
                nn.ReLU(),
                nn.Conv2d(64, 256, 3),
                nn.BatchNorm2d(256),
                nn.ReLU(),
                nn.AdaptiveAvgPool2d(1),
                nn.Flatten(),
                nn.Linear(256, 10),
            ),
            "a 2-layer LSTM 128 → 256": nn.LSTM(128, 256, num_layers=2),
            "an Embedding(5000, 64)": nn.Embedding(5000, 64),
            "a TransformerEncoderLayer(128, 4, 512)": nn.TransformerEncoderLayer(128, 4, 512),
        }


def _ex72_reference(model, dtype) -> int:
    """Bytes that ``torch.save`` writes for the state_dict in ``dtype`` (reference solution of exercise 7.2):
    :func:`mpt_lab.bench.checkpoint_bytes`, which saves it and measures."""
    return bench.checkpoint_bytes(model, dtype)


def _ex72_check(fn):
    if not callable(fn):
        return False, f"expected a function checkpoint_size(model, dtype) -> int, got {type(fn).__name__}"
    models = _ex72_models()
    for name, model in models.items():
        for dtype in (torch.float32, torch.float16, torch.bfloat16):
            want = bench.checkpoint_bytes(model, dtype)
            got = fn(copy.deepcopy(model), dtype)  # a copy: a function that casts the model in place is harmless
            if not is_real(got):
                return False, f"checkpoint_size({name}, {dtype}) returned {type(got).__name__}, not a number of bytes"
            if not abs(float(got) - want) <= 0.05 * want:
                return False, (
                    f"checkpoint_size({name}, {dtype}) returned {got!r}; torch.save writes {want:,} bytes "
                    f"({float(got) / want - 1:+.0%})."
                )
    return True, (
        f"within 5 % of the file torch.save writes for {len(models)} models in float32, float16 and "
        "bfloat16: a checkpoint is its tensors' bytes, and FP16 halves it."
    )


register(
    Exercise(
        "7.2",
        "The size of a checkpoint",
        "Write checkpoint_size(model, dtype) -> int: an estimate of the bytes that torch.save(state) writes, where "
        "state is model.state_dict() with every floating-point tensor cast to dtype (torch.float32, torch.float16 "
        "or torch.bfloat16) and integer tensors kept as they are. Estimates within 5 % of the measured file pass "
        "(the file adds a few kilobytes of names and headers; the check uses models of more than 100,000 "
        "parameters, each in the three dtypes).",
        _ex72_check,
        "The file is almost only tensor data: for each entry of the state_dict, its number of elements times the "
        "bytes of one element of the dtype it is saved in (torch.empty((), dtype=dtype).element_size()). Buffers "
        "such as BatchNorm's running statistics are in the state_dict too.",
        lambda: _ex72_reference,
        worked="""A checkpoint written by `torch.save` is almost only the bytes of its tensors: a few kilobytes of \
names, shapes and pickle headers come on top, which is why the check allows 5 % and uses models of more than \
100,000 parameters.

So walk through `model.state_dict()`: it holds the parameters and the buffers (BatchNorm's running mean and \
variance, and its `num_batches_tracked` counter, an int64). A floating-point tensor is saved in `dtype`, so it \
takes `numel() × element_size of dtype` bytes: 4 for float32, 2 for float16 and bfloat16. An integer tensor is \
kept as it is, with its own element size.

```python
import torch

def checkpoint_size(model, dtype):
    size = torch.empty((), dtype=dtype).element_size()       # bytes of one element of dtype
    return sum(t.numel() * (size if t.is_floating_point() else t.element_size())
               for t in model.state_dict().values())
```

Two classic mistakes: summing over `model.parameters()` only (BatchNorm's buffers are missing, a few percent \
for a CNN), and counting elements instead of bytes. Halving the element size halves the tensors' bytes; the \
file nearly halves (the chapter prints the ratio): names, headers and integer buffers do not shrink.""",
    )
)
