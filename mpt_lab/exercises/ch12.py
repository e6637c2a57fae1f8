"""Exercises of chapter 12: your model in low precision.  The reader points :func:`mpt_lab.report.precision_report`
at a model of their choosing; the checks run the report on it."""

from __future__ import annotations

import math
import numbers
import traceback
from collections.abc import Callable

import torch

from ..quantized_training import four_bit_recipe
from ..report import keep_wide, precision_report
from ._core import Exercise, register


def _setup(fn, n: int, what: str):
    """Call the reader's function once and check that it returned an n-tuple (model, loss_fn, batch, ...)."""
    if not callable(fn):
        return None, f"expected a function that returns {what}, got {type(fn).__name__}"
    out = fn()
    if not isinstance(out, tuple) or len(out) != n:
        return None, f"expected your function to return a tuple {what}, got {type(out).__name__}"
    if not isinstance(out[0], torch.nn.Module):
        return None, f"expected a torch.nn.Module as the first entry (the model), got {type(out[0]).__name__}"
    if not callable(out[1]):
        return None, f"expected a function loss_fn(model, batch) as the second entry, got {type(out[1]).__name__}"
    return out, ""


def _report(model, loss_fn, batch, formats):
    try:
        return precision_report(model, loss_fn, batch, formats=formats), "", ""
    except Exception as err:  # the reader's model, loss or batch: say what went wrong, and where
        return None, f"precision_report could not run your setup: {type(err).__name__}: {err}", _last_frames(err)


def _last_frames(err: BaseException, n: int = 6) -> str:
    """The traceback of ``err``, its last ``n`` frames (where the reader's loss_fn or model raised)."""
    return "".join(traceback.format_exception(type(err), err, err.__traceback__, limit=-n))


# ---------------------------------------------------------------------------------------------------- 12.1
def planted_overflow() -> tuple[torch.nn.Module, Callable, tuple]:
    """Reference for exercise 12.1: a classifier whose last layer's outputs pass FP16's 65,504."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    with torch.no_grad():
        model[2].weight.mul_(1e5)  # outputs of order 1e5: beyond FP16, easily inside BF16
    x, y = torch.randn(64, 8), torch.randint(0, 4, (64,))

    def loss_fn(m, b):
        return torch.nn.functional.cross_entropy(m(b[0]), b[1])

    return model, loss_fn, (x, y), "2"


def _module_setup(fn):
    """((model, loss_fn, batch, module_name, named modules), "") from a function that returns the first four, or
    (None, why not) when it does not, or when module_name names none of the model's modules."""
    out, msg = _setup(fn, 4, "(model, loss_fn, batch, module_name)")
    if out is None:
        return None, msg
    model, loss_fn, batch, name = out
    names = dict(model.named_modules())
    if not isinstance(name, str) or name not in names:
        return None, (
            f"expected the name of one of your model's modules (as model.named_modules() gives it), got {name!r}"
        )
    return (model, loss_fn, batch, name, names), ""


def _ex121_check(fn):
    out, msg = _module_setup(fn)
    if out is None:
        return False, msg
    model, loss_fn, batch, name, names = out
    r, msg, details = _report(model, loss_fn, batch, ("FP16", "BF16"))
    if r is None:
        return False, msg, details
    over = r.forward_overflows("FP16")
    if not over:
        amax = max(m.activation.amax for m in r.modules)
        return False, (f"nothing overflows FP16 yet: the largest output of the step is {amax:.4g}, below 65,504.")
    if over[0] != name:
        return False, f"the first module to overflow FP16 is {over[0] or '(model)'!r}, not {name!r}."
    if r.first_nonfinite("FP16") != (name, "forward"):
        return False, (
            f"{name!r} overflows when its FP32 output is cast, but in the FP16 step the first inf/NaN is "
            f"{r.first_nonfinite('FP16')}."
        )
    if r.forward_overflows("BF16"):
        return False, f"BF16 overflows too (at {r.forward_overflows('BF16')[0]!r}): plant a fault that BF16 holds."
    amax = next(m.activation.amax for m in r.modules if m.name == name)
    return True, (
        f"{name!r} is the first module whose outputs overflow FP16 (up to {amax:.4g} > 65,504) and the FP16 "
        f"step turns inf there first; BF16 holds them. The report says: {r.recommendation('FP16')}"
    )


register(
    Exercise(
        "12.1",
        "Plant an FP16 overflow where you choose",
        "Write planted() that returns (model, loss_fn, batch, module_name): a model of your choosing (your own, or a "
        "transformers model built from its configuration), a loss_fn(model, batch) that returns the scalar loss, a "
        "batch, and the name of one of its modules (as model.named_modules() gives it). The check runs "
        "precision_report on it and passes when module_name is the first module whose outputs overflow FP16, the FP16 "
        "step first turns inf or NaN in that module's output, and nothing overflows BF16.",
        _ex121_check,
        "Make one layer's outputs larger than 65,504 and keep every layer before it below: multiply its weights by a "
        "large factor inside torch.no_grad(). A container that returns the layer's output overflows too, but after the "
        "layer; BF16's largest value is about 3.4e38.",
        lambda: planted_overflow,
        worked=(
            "Take any small model and scale up the weights of the layer that should overflow, so that its outputs "
            "land between FP16's largest value (65,504) and BF16's (about 3.4e38). The layers before it are "
            "untouched, so it is the first; the `Sequential` that returns its output overflows too, but it finishes "
            "later, so the report lists it second.\n\n```python\n{answer}\n```\n\n"
            "Under autocast the layer's FP16 output is inf, the FP32 loss computed from it is NaN, and no loss "
            "scale can help (the dynamic scaler would skip every step): keep that layer in FP32 with autocast "
            "disabled around it (`mpt_lab.autocast.keep_in_float32`, as section 12.3 ran for T5's `wo`; FP32 weights "
            "alone, transformers' remedy, help only a model with FP16 weights), or train in BF16."
        ),
    )
)


# ---------------------------------------------------------------------------------------------------- 12.2
def needs_a_loss_scale() -> tuple[torch.nn.Module, Callable, tuple]:
    """Reference for exercise 12.2: a tiny loss (divided by 2^20) whose FP16 gradients underflow, and the
    max-gradient rule's scale read from the report."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
    x, y = torch.randn(256, 64), torch.randint(0, 10, (256,))

    def loss_fn(m, b):
        return torch.nn.functional.cross_entropy(m(b[0]), b[1]) * 2.0**-20

    low, high = precision_report(model, loss_fn, (x, y), formats=("FP16",)).loss_scale_window("FP16")
    return model, loss_fn, (x, y), high


def _ex122_check(fn):
    out, msg = _setup(fn, 4, "(model, loss_fn, batch, scale)")
    if out is None:
        return False, msg
    model, loss_fn, batch, scale = out
    if (
        not isinstance(scale, numbers.Real)
        or isinstance(scale, bool)
        or not (0 < float(scale) < math.inf)
        or math.frexp(float(scale))[0] != 0.5
    ):
        return False, f"expected a power of two as the loss scale (e.g. 2.0 ** 10), got {scale!r}"
    r, msg, details = _report(model, loss_fn, batch, ("FP16",))
    if r is None:
        return False, msg, details
    low, high = r.loss_scale_window("FP16")
    if low is None:
        return False, "the report finds no non-zero gradient in your step: nothing to scale."
    k = int(math.log2(float(scale)))
    if low <= 1.0:
        return False, (
            f"your model does not need a loss scale: at scale 1 FP16 already keeps 99.9% of its non-zero "
            f"gradients (the window starts at 2^{int(math.log2(low))}). Make its gradients smaller."
        )
    if low > high:
        return False, (
            f"no single loss scale suits your model in FP16 (the window [2^{int(math.log2(low))}, "
            f"2^{int(math.log2(high))}] is empty): its gradients span too many binades."
        )
    if not low <= scale <= high:
        return False, (
            f"2^{k} lies outside the window [2^{int(math.log2(low))}, 2^{int(math.log2(high))}]: "
            + (
                "too small, FP16 still loses more than 0.1% of the non-zero gradients"
                if scale < low
                else "too large, the largest gradient overflows"
            )
        )
    return True, (
        f"your step needs a loss scale in FP16: the window is [2^{int(math.log2(low))}, "
        f"2^{int(math.log2(high))}], and 2^{k} lies inside it (keeps at least 99.9% of the non-zero gradients "
        "and overflows none)."
    )


register(
    Exercise(
        "12.2",
        "A loss scale for a model that needs one",
        "Write needs_scale() that returns (model, loss_fn, batch, scale): a model of your choosing whose FP16 gradients "
        "need a loss scale (at scale 1, FP16 would round more than 0.1% of its non-zero gradients to zero), and a "
        "power-of-two loss scale that keeps at least 99.9% of them without overflowing the largest. The check runs "
        "precision_report on your setup and compares your scale with its loss-scale window.",
        _ex122_check,
        "Gradients shrink with the loss: a mean over many values, or a loss multiplied by a tiny factor, puts most of "
        "them below 2^-24. Then point precision_report at your setup: loss_scale_window('FP16') gives the range of "
        "scales that work (the max-gradient rule is its upper end).",
        lambda: needs_a_loss_scale,
        worked=(
            "A loss multiplied by 2^-20 (as if averaged over a million values) scales every gradient by 2^-20, which "
            "pushes most of them below FP16's smallest subnormal. The report's window then starts above 1, and its "
            "upper end is the max-gradient rule of chapters 2 and 3: any power of two in between works.\n\n"
            "```python\n{answer}\n```\n\n"
            "A dynamic scaler finds such a scale by itself only from above: it halves on every overflow, so started "
            "above the window it comes down into it (`report.dynamic_scaler('FP16')` says after how many skipped "
            "steps); started below, as torch's default 2^16 is here, it overflows nothing and climbs only by one "
            "doubling per growth interval. A static scale must be chosen from numbers like these."
        ),
    )
)


# ---------------------------------------------------------------------------------------------------- 12.3


def overflow_between_submodules() -> tuple[torch.nn.Module, Callable, tuple, str]:
    """Reference for exercise 12.3: a residual block whose two children stay inside FP16's range while the sum in
    its own forward (x + fc2(...)) does not."""

    class Residual(torch.nn.Module):
        def __init__(self, d=16):
            super().__init__()
            self.ln = torch.nn.LayerNorm(d)
            self.fc1, self.fc2 = torch.nn.Linear(d, 4 * d), torch.nn.Linear(4 * d, d)

        def forward(self, x):
            return x + self.fc2(torch.relu(self.fc1(self.ln(x))))  # the add: no module of its own

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), Residual(), torch.nn.Linear(16, 4))
    with torch.no_grad():
        model[0].bias.fill_(4e4)  # the residual stream near 40,000
        model[1].fc2.bias.fill_(4e4)  # and the block's last layer too: each fits, their sum does not
    x, y = torch.randn(32, 8), torch.randint(0, 4, (32,))

    def loss_fn(m, b):
        return torch.nn.functional.cross_entropy(m(b[0]), b[1])

    return model, loss_fn, (x, y), "1"


def _ex123_check(fn):
    out, msg = _module_setup(fn)
    if out is None:
        return False, msg
    model, loss_fn, batch, name, names = out
    children = [f"{name}.{c}" if name else c for c, _ in names[name].named_children()]
    if not children:
        return False, f"{name!r} has no submodules: plant the overflow between the submodules of a module that has some"

    try:
        r = precision_report(model, loss_fn, batch, formats=("FP16", "BF16"), mode="all", progress=False)
    except Exception as err:
        return False, f"precision_report could not run your setup: {type(err).__name__}: {err}"
    loc = r.first_nonfinite("FP16")
    if loc is None:
        return (
            False,
            "nothing turns inf or NaN in the FP16 step (every op and weight rounded to FP16, simulated): make a sum overflow.",
        )
    if loc.module != name:
        return False, f"the FP16 step first turns inf/NaN in {loc.describe()}, not inside {name!r}."
    over_children = [c for c in children if c in r.forward_overflows("FP16")]
    if over_children:
        return False, (
            f"a submodule of {name!r} overflows itself ({over_children[0]!r}): the overflow should arise "
            "between the submodules, from an op of the module's own forward."
        )
    if r.first_nonfinite("BF16") is not None:
        return False, "BF16 turns inf/NaN too: keep the values within BF16's range."
    return True, (
        f"the FP16 step first overflows at {loc.describe()}: an op in the forward of {name!r} itself, "
        f"while each of its submodules ({', '.join(children)}) stays within FP16's range. Module hooks "
        f"see only the module's output; the op shows where it happens. The report says: {r.recommendation('FP16')}"
    )


register(
    Exercise(
        "12.3",
        "An overflow between submodules",
        "Write between() that returns (model, loss_fn, batch, module_name): a model in which, with every op and weight "
        "rounded to FP16 (simulated), the first inf appears in an op of module_name's own forward (an addition, a product, a "
        "scaled_dot_product_attention call; not one of its submodules), while none of its submodules' outputs overflows "
        "FP16 and BF16 stays finite, as in the Pegasus layer of transformers issue 12225. The check runs precision_report "
        "(mode='all') and compares its first_nonfinite('FP16') with your module_name.",
        _ex123_check,
        "A residual connection adds two tensors that each fit FP16; make both large (a bias near 40,000 does it) and their "
        "sum passes 65,504 inside the block's forward.",
        lambda: overflow_between_submodules,
        worked=(
            "A pre-LayerNorm residual block computes x + fc2(relu(fc1(ln(x)))) in its own forward: the addition "
            "belongs to no submodule. With the stream and fc2's output both near 40,000, each fits FP16 and their "
            "sum, near 80,000, does not.\n\n```python\n{answer}\n```\n\n"
            "Module hooks see fc2's output (finite) and the block's output (inf); the op-level record names the "
            "addition (`Tensor.add`, or `Tensor.__add__`) inside the block. Under autocast whether this sum "
            "overflows depends on the stream's dtype: here the stream is a Linear's output, which autocast makes "
            "FP16, so it overflows as well; where the stream is FP32 (as in section 12.6's Pegasus), an FP16 "
            "product plus it is computed in FP32 and does not overflow. The exercise runs every op in FP16 so that "
            "the answer does not depend on this."
        ),
    )
)


# ---------------------------------------------------------------------------------------------------- 12.4
def breaks_nvfp4() -> tuple[torch.nn.Module, Callable, tuple, str]:
    """Reference for exercise 12.4: an MLP whose third Linear layer has large weights on an input channel that is
    always zero: nothing in FP32, everything in NVFP4 (the tensor scale follows them and the other weights'
    block scales round to zero, flushing them)."""

    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(32, 64),
        torch.nn.GELU(),
        torch.nn.Linear(64, 64),
        torch.nn.GELU(),
        torch.nn.Linear(64, 64),
        torch.nn.GELU(),
        torch.nn.Linear(64, 10),
    )
    with torch.no_grad():
        model[2].weight[3].zero_()
        model[2].bias[3] = -20.0  # GELU(-20) = 0: input channel 3 of layer 4 is always zero
        model[4].weight[:, 3] = 1e6
    x, y = torch.randn(128, 32), torch.randint(0, 10, (128,))

    def loss_fn(m, b):
        return torch.nn.functional.cross_entropy(m(b[0]), b[1])

    return model, loss_fn, (x, y), "4"


def _ex124_check(fn):
    out, msg = _setup(fn, 4, "(model, loss_fn, batch, layer_name)")
    if out is None:
        return False, msg
    model, loss_fn, batch, name = out

    linears = [n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)]
    if len(linears) < 2:
        return False, "expected a model with at least two nn.Linear layers to rank"
    if name not in linears:
        return False, f"expected the name of one of your model's nn.Linear layers {linears}, got {name!r}"

    try:
        r = keep_wide(model, loss_fn, batch, four_bit_recipe(), tolerance=0.25, progress=False)
    except Exception as err:
        return False, f"keep_wide could not run your setup: {type(err).__name__}: {err}"
    first, second = r.ranking[0], r.ranking[1]
    if first != name:
        return False, (
            f"keep_wide ranks {first!r} first (keeping it in BF16 saves {r.score[first]:.3g} of the "
            f"gradient error), not {name!r} ({r.score[name]:.3g})."
        )
    if r.score[first] < 2 * max(r.score[second], 0.0):
        return False, (
            f"{name!r} is ranked first, but {second!r} comes close ({r.score[second]:.3g} against "
            f"{r.score[first]:.3g}): make {name!r} the one that breaks the recipe."
        )
    return True, (
        f"keep_wide ranks {name!r} first: with every layer on NVIDIA's NVFP4 recipe the step's gradients are "
        f"{r.every['gradient']:.3g} off FP32 (relative L2), and keeping {name!r} in BF16 brings that to "
        f"{r.all_but_one[name]['gradient']:.3g}. The smallest set within 0.25: {r.keep}."
    )


register(
    Exercise(
        "12.4",
        "The layer that breaks NVFP4",
        "Write breaks() that returns (model, loss_fn, batch, layer_name): a model with several nn.Linear layers, one of "
        "which (layer_name) NVIDIA's NVFP4 recipe (mpt_lab.quantized_training.four_bit_recipe()) breaks: keep_wide must "
        "rank it first, with at least twice the score of the second. The check runs keep_wide (tolerance 0.25 on the "
        "relative gradient error).",
        _ex124_check,
        "NVFP4 scales each tensor by its amax / (448 · 6) and each block of 16 by an E4M3 scale of that, which cannot be "
        "smaller than E4M3's smallest subnormal 2^-9 (a smaller one rounds to it or to zero): a few huge weights make "
        "every other block's scale too coarse, and its values round to zero. Put them "
        "where they change nothing in FP32 (on an input channel that is always zero).",
        lambda: breaks_nvfp4,
        worked=(
            "One layer gets weights of 10^6 on an input channel that the previous layer never activates (GELU of "
            "-20 is zero), so its FP32 output is unchanged. NVFP4's tensor scale follows that amax; every other "
            "16 x 16 weight tile then needs a block scale below half of E4M3's smallest subnormal (2^-9), which rounds "
            "to zero, and its values round to zero: "
            "the layer's output collapses to its bias.\n\n```python\n{answer}\n```\n\n"
            "keep_wide measures it: quantising that layer alone moves the step's gradients far more than any other, "
            "and keeping it in BF16 saves most of the error of the full recipe."
        ),
    )
)
