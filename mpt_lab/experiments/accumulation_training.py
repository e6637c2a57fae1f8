"""Accumulation in training: FP16- against FP32-accumulated products, and Kahan-compensated BF16 weights.

Two comparisons, each on one model trained from the same initial weights on the same batches in every arm:

* **The accumulator of the products** (the paper's §3.3): the digits MLP (:func:`mpt_lab.models.digits_mlp` on
  :func:`mpt_lab.data.digits_data`) with every Linear layer's three products — forward ``x Wᵀ``, backward
  ``g W`` and the weight gradient ``gᵀ x``, whose K is the batch size — computed by
  :func:`mpt_lab.accumulation.matmul` from FP16 operands (inputs, weights and output gradients rounded to
  FP16), with products and sums in an FP32, an FP16 or a BF16 accumulator.  Everything else (bias, ReLU,
  softmax cross-entropy, the Adam update of FP32 master weights) is FP32.
* **Low-precision weights** (chapter 11's BF16-weight recipes, the same run): the digits MLP of
  :mod:`mpt_lab.experiments.fp8_recipes` with its configuration for the profile (width, depth, batch, steps,
  Adam with betas (0.9, 0.95), warm-up and cosine decay, BF16 operands in every Linear product through
  :func:`mpt_lab.quantized_training.quantize_linears_`, the same seeds and batches), with the weights kept as
  FP32 master weights, as BF16 rounded to nearest, as BF16 rounded stochastically, or as BF16 with a BF16
  Kahan compensation buffer (:func:`mpt_lab.accumulation.compensated_update_`, as optimi's ``kahan_sum``).
  The first three are chapter 11's ``bf16``, ``bf16_rne`` and ``bf16_sr`` runs, bit for bit.

    python -m mpt_lab.experiments.accumulation_training --profile cpu
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as Fn
from torch import nn

from .. import accumulation as acc
from ..data import digits_data
from ..formats import BF16, FP16, round_to
from ..models import digits_mlp
from ..quantized_training import TRAINING_RECIPES, quantize_linears_, round_weights_
from ..training import accuracy, shuffled_batches
from . import fp8_recipes
from .runner import Experiment, ExperimentConfig, ExperimentResult, Run, run_main

__all__ = ["NAME", "Config", "PROFILES", "AccumulationTrainingResult", "AccumulatedLinear", "accumulate_linears_",
           "ACCUMULATORS", "WEIGHT_ARMS", "run", "config_for", "main", "EXPERIMENT"]

NAME = "accumulation_training"
#: The accumulators of the first comparison: arm label → accumulator format name.
ACCUMULATORS = {"FP32 accumulator": "FP32", "FP16 accumulator": "FP16", "BF16 accumulator": "BF16"}
#: The weight storage of the second comparison: arm label → (chapter 11's recipe, how the weights are kept).
WEIGHT_ARMS = {"FP32 master weights": ("bf16", "fp32"), "BF16, round to nearest": ("bf16_rne", "rne"),
               "BF16, stochastic rounding": ("bf16_sr", "sr"), "BF16, Kahan-compensated": ("bf16", "kahan")}


class _AccumulatedMatmulFn(torch.autograd.Function):
    """y = x Wᵀ + b with FP16 operands and every product and sum in ``accumulator`` (forward and backward)."""

    @staticmethod
    def forward(ctx, x, weight, bias, accumulator):
        xq, wq = round_to(x.detach(), FP16), round_to(weight.detach(), FP16)
        ctx.save_for_backward(xq, wq)
        ctx.accumulator = accumulator
        y = acc.matmul(xq, wq.t(), accumulator=accumulator)
        return y + bias if bias is not None else y

    @staticmethod
    def backward(ctx, g):
        xq, wq = ctx.saved_tensors
        gq = round_to(g.detach().contiguous(), FP16)
        grad_x = acc.matmul(gq, wq, accumulator=ctx.accumulator)
        grad_w = acc.matmul(gq.t(), xq, accumulator=ctx.accumulator)
        return grad_x, grad_w, g.sum(0), None


class AccumulatedLinear(nn.Module):
    """An ``nn.Linear`` whose products (forward and backward) take FP16 operands and accumulate in a chosen format.

    Input float32 [N, in_features], output float32 [N, out_features]; the FP32 parameters are those of the
    wrapped layer (master weights), rounded to FP16 for each product.

    Raises TypeError for a non-Linear layer; ValueError for an unknown accumulator (from
    :func:`mpt_lab.accumulation.matmul`).
    """

    def __init__(self, linear: nn.Linear, accumulator="FP32"):
        super().__init__()
        if not isinstance(linear, nn.Linear):
            raise TypeError(f"linear must be an nn.Linear, got {type(linear).__name__}")
        self.weight, self.bias, self.accumulator = linear.weight, linear.bias, accumulator

    def extra_repr(self) -> str:
        return f"accumulator={self.accumulator}"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _AccumulatedMatmulFn.apply(x, self.weight, self.bias, self.accumulator)


def accumulate_linears_(model: nn.Module, accumulator="FP32") -> nn.Module:
    """Replace every ``nn.Linear`` of ``model`` (in place) by an :class:`AccumulatedLinear`; returns model."""
    for name, child in model.named_children():
        if isinstance(child, nn.Linear):
            setattr(model, name, AccumulatedLinear(child, accumulator))
        else:
            accumulate_linears_(child, accumulator)
    return model


@dataclass
class Config(ExperimentConfig):
    """The two training comparisons: the accumulators and weight arms to run, the MLP of the accumulator
    comparison, and the steps of the BF16-weight comparison (each field's comment says what it is;
    :data:`PROFILES` holds each profile's values)."""

    accumulators: tuple = tuple(ACCUMULATORS)
    weight_arms: tuple = tuple(WEIGHT_ARMS)
    hidden: int = 64                    # the accumulator comparison's MLP: width, hidden layers
    layers: int = 2
    batch: int = 256                    # K of the weight-gradient products
    steps: int = 300
    lr: float = 3e-3                    # Adam, betas (0.9, 0.95), lr_factor's warm-up and cosine decay
    fp8_profile: str = "cpu"            # the BF16-weight comparison: fp8_recipes' configuration of this profile
    weight_steps: int = 0               # its steps (0: fp8_recipes' mlp_steps; set it to fp8_recipes' too to compare)

    def validate(self) -> None:
        super().validate()
        self.check_choices("accumulators", ACCUMULATORS, subset=True)
        self.check_choices("weight_arms", WEIGHT_ARMS, subset=True)
        self.check_positive("hidden", "layers", "batch", "steps")
        self.check_positive("weight_steps", minimum=0)
        if not isinstance(self.lr, (int, float)) or isinstance(self.lr, bool) or not 0 < self.lr < math.inf:
            raise ValueError(f"config.lr must be a positive number, got {self.lr!r}")
        self.check_choices("fp8_profile", tuple(fp8_recipes.PROFILES))


#: quick ≈ 25 s and cpu ≈ 50 s of one core's time on the project's shared 2-core machines.  The arithmetic of
#: :mod:`mpt_lab.accumulation` runs on the CPU, so "full" is the cpu configuration (≈ 20 s on an H100 machine's
#: host CPU, estimated from 35.5 s measured there with fp8_recipes' larger full MLP, 1,000 steps of width 256,
#: whose runs all drive the training loss to zero and so cannot tell the weight storages apart).
PROFILES = {
    "quick": {"steps": 100, "batch": 256, "fp8_profile": "quick", "threads": 1},
    "cpu": {"steps": 200, "batch": 256, "fp8_profile": "cpu", "threads": 1},
    "full": {"steps": 200, "batch": 256, "fp8_profile": "cpu", "threads": 1},
}


@dataclass
class AccumulationTrainingResult(ExperimentResult):
    """``accumulator``: {"losses": arm → per-step training loss, "test": arm → {"loss", "accuracy"}};
    ``weights``: {"losses", "test", "fp8_config": fp8_recipes' configuration used}; ``steps`` per comparison."""

    accumulator: dict
    weights: dict

    def final(self, which: str, arm: str, last: int = 20) -> float:
        """Mean training loss of the last ``last`` steps of ``arm`` in comparison ``which``."""
        v = getattr(self, which)["losses"][arm]
        return float(sum(v[-last:]) / len(v[-last:]))

    def describe(self) -> str:
        a = ", ".join(f"{k} {v['accuracy']:.3f}" for k, v in self.accumulator["test"].items())
        w = ", ".join(f"{k} {v['loss']:.3f}" for k, v in self.weights["test"].items())
        return (f"accumulation in training ({self.profile} profile): test accuracy by accumulator: {a}; "
                f"test loss by weight storage: {w}")


def _evaluate(model, xte, yte) -> dict:
    with torch.no_grad():
        model.eval()
        logits = model(xte)
        model.train()
    return {"loss": float(Fn.cross_entropy(logits.float(), yte)), "accuracy": accuracy(logits, yte)}


def _accumulator_runs(config: Config, run: Run) -> dict:
    xtr, ytr, xte, yte = digits_data(config.seed)
    init = digits_mlp(config.hidden, config.layers, seed=config.seed)
    losses, test = {}, {}
    for arm in run.bar(config.accumulators, desc="accumulators"):
        model = accumulate_linears_(copy.deepcopy(init), ACCUMULATORS[arm])
        opt = torch.optim.Adam(model.parameters(), lr=config.lr, betas=(0.9, 0.95))
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: fp8_recipes.lr_factor(s, config.steps))
        batches = shuffled_batches(len(xtr), config.batch, generator=torch.Generator().manual_seed(config.seed + 3))
        losses[arm] = []
        for _ in range(config.steps):
            idx = next(batches)
            opt.zero_grad(set_to_none=True)
            loss = Fn.cross_entropy(model(xtr[idx]), ytr[idx])
            loss.backward()
            opt.step()
            sched.step()
            losses[arm].append(float(loss.detach()))
        test[arm] = _evaluate(model, xte, yte)
    return {"losses": losses, "test": test, "steps": config.steps, "batch": config.batch}


def _weight_runs(config: Config, run: Run) -> dict:
    """fp8_recipes' MLP runs of its BF16-weight recipes, the same loop step for step, plus the Kahan arm."""
    fc = fp8_recipes.config_for(config.fp8_profile)
    if config.weight_steps:
        fc.mlp_steps = config.weight_steps
    xtr, ytr, xte, yte = digits_data(fc.seed)
    torch.manual_seed(fc.seed)
    init_state = copy.deepcopy(digits_mlp(fc.mlp_hidden, fc.mlp_layers).state_dict())
    losses, test = {}, {}
    for arm in run.bar(config.weight_arms, desc="BF16 weights"):
        recipe, keep = WEIGHT_ARMS[arm]
        torch.manual_seed(fc.seed + 1)
        model = digits_mlp(fc.mlp_hidden, fc.mlp_layers)
        model.load_state_dict(init_state)
        quantizer = quantize_linears_(model, TRAINING_RECIPES[recipe], history_len=fc.history_len, margin=fc.margin,
                                      scale_rounding=fc.scale_rounding)
        params = list(model.parameters())
        sr_gen = torch.Generator().manual_seed(fc.seed + 2)
        if keep != "fp32":
            round_weights_(params, "nearest_even")             # stored in BF16 from the start
        comps = [torch.zeros_like(p) for p in params] if keep == "kahan" else None
        opt = torch.optim.Adam(params, lr=fc.mlp_lr, betas=(0.9, 0.95))
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: fp8_recipes.lr_factor(s, fc.mlp_steps))
        batches = shuffled_batches(len(xtr), fc.mlp_batch, generator=torch.Generator().manual_seed(fc.seed + 3))
        losses[arm] = []
        for _ in range(fc.mlp_steps):
            quantizer.recording = False
            idx = next(batches)
            opt.zero_grad(set_to_none=True)
            out = model(xtr[idx])
            loss = Fn.cross_entropy(out.reshape(-1, out.shape[-1]).float(), ytr[idx].reshape(-1))
            loss.backward()
            before = [p.detach().clone() for p in params] if keep == "kahan" else None
            opt.step()
            sched.step()
            if keep in ("rne", "sr"):
                round_weights_(params, "stochastic" if keep == "sr" else "nearest_even", generator=sr_gen)
            elif keep == "kahan":
                with torch.no_grad():
                    for p, old, c in zip(params, before, comps):
                        update = p - old                    # the FP32 update Adam computed
                        p.copy_(old)
                        acc.compensated_update_(p, update, c, BF16)
            quantizer.step()
            losses[arm].append(float(loss.detach()))
        test[arm] = _evaluate(model, xte, yte)
    fields = ("seed", "mlp_hidden", "mlp_layers", "mlp_batch", "mlp_steps", "mlp_lr")
    return {"losses": losses, "test": test, "steps": fc.mlp_steps,
            "fp8_config": {"profile": config.fp8_profile, **{f: getattr(fc, f) for f in fields}}}


def measure(config: Config, run: Run) -> dict:
    return {"accumulator": _accumulator_runs(config, run), "weights": _weight_runs(config, run)}


#: ``--smoke``: the full profile cut to a few trials or steps (shapes unchanged).
SMOKE = {"steps": 2, "weight_steps": 2, "threads": 1}

EXPERIMENT = Experiment(NAME, Config, PROFILES, measure, AccumulationTrainingResult, __doc__, smoke=SMOKE)
run, config_for, main = EXPERIMENT.run, EXPERIMENT.config_for, EXPERIMENT.main

if __name__ == "__main__":
    run_main(EXPERIMENT)
