"""Accumulation in training: FP16- against FP32-accumulated products, and Kahan-compensated BF16 weights.

Two comparisons, each on one model trained from the same initial weights on the same batches in every arm:

* **The accumulator of the products** (the paper's §3.3): the digits MLP (:func:`mpt_lab.models.digits_mlp` on
  :func:`mpt_lab.data.digits_data`) with every Linear layer's three products — forward ``x Wᵀ``, backward
  ``g W`` and the weight gradient ``gᵀ x``, whose K is the batch size — computed by
  :func:`mpt_lab.accumulation.matmul` from FP16 operands (inputs, weights and output gradients rounded to
  FP16), with products and sums in an FP32, an FP16 or a BF16 accumulator.  Everything else (bias, ReLU,
  softmax cross-entropy, the Adam update of FP32 master weights) is FP32.
* **Low-precision weights** (chapter 11's BF16-weight recipes, the same run): the digits MLP of chapter 11's
  experiment (:mod:`mpt_lab.experiments.fp8_recipes`) with the same settings in every profile (the ``mlp_*``
  fields: width, depth, batch, steps, Adam with betas (0.9, 0.95) and learning rate, warm-up and cosine decay
  :func:`mpt_lab.training.lr_factor`; BF16 operands in every Linear product through
  :func:`mpt_lab.quantized_training.quantize_linears_`, the same seeds and batches), with the weights kept as
  FP32 master weights, as BF16 rounded to nearest, as BF16 rounded stochastically, or as BF16 with a BF16
  Kahan compensation buffer (:func:`mpt_lab.accumulation.compensated_update_`, as optimi's ``kahan_sum``).
  The first three are chapter 11's ``bf16``, ``bf16_rne`` and ``bf16_sr`` runs, bit for bit (a test and
  chapter 5 check it; the two experiments share no code but the floors below them).

    python -m mpt_lab.experiments.accumulation_training --profile cpu
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as Fn

from .. import accumulation as acc
from ..accumulation import accumulate_linears_
from ..data import digits_data
from ..formats import BF16
from ..harness.runner import Experiment, ExperimentConfig, ExperimentResult, Run, run_main
from ..models import digits_mlp
from ..quantized_training import TRAINING_RECIPES, quantize_linears_, round_weights_
from ..training import accuracy, lr_factor, shuffled_batches

__all__ = [
    "NAME",
    "Config",
    "PROFILES",
    "AccumulationTrainingResult",
    "ACCUMULATORS",
    "WEIGHT_ARMS",
    "run",
    "config_for",
    "main",
    "EXPERIMENT",
]

NAME = "accumulation_training"
#: The accumulators of the first comparison: arm label → accumulator format name.
ACCUMULATORS = {"FP32 accumulator": "FP32", "FP16 accumulator": "FP16", "BF16 accumulator": "BF16"}
#: The weight storage of the second comparison: arm label → (chapter 11's recipe, how the weights are kept).
WEIGHT_ARMS = {
    "FP32 master weights": ("bf16", "fp32"),
    "BF16, round to nearest": ("bf16_rne", "rne"),
    "BF16, stochastic rounding": ("bf16_sr", "sr"),
    "BF16, Kahan-compensated": ("bf16", "kahan"),
}


@dataclass
class Config(ExperimentConfig):
    """The two training comparisons: the accumulators and weight arms to run, the MLP of the accumulator
    comparison, and the steps of the BF16-weight comparison (each field's comment says what it is;
    :data:`PROFILES` holds each profile's values)."""

    accumulators: tuple = tuple(ACCUMULATORS)
    weight_arms: tuple = tuple(WEIGHT_ARMS)
    hidden: int = 64  # the accumulator comparison's MLP: width, hidden layers
    layers: int = 2
    batch: int = 256  # K of the weight-gradient products
    steps: int = 300
    lr: float = 3e-3  # Adam, betas (0.9, 0.95), lr_factor's warm-up and cosine decay
    mlp_hidden: int = 64  # the BF16-weight comparison: chapter 11's digits MLP (fp8_recipes' mlp_*
    mlp_layers: int = 2  # fields, the same in every profile), its batch, steps and Adam's
    mlp_batch: int = 128  # learning rate
    mlp_steps: int = 200
    mlp_lr: float = 3e-3

    def validate(self) -> None:
        super().validate()
        self.check_choices("accumulators", ACCUMULATORS, subset=True)
        self.check_choices("weight_arms", WEIGHT_ARMS, subset=True)
        self.check_positive("hidden", "layers", "batch", "steps", "mlp_hidden", "mlp_layers", "mlp_batch", "mlp_steps")
        for name in ("lr", "mlp_lr"):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not 0 < v < math.inf:
                raise ValueError(f"config.{name} must be a positive number, got {v!r}")


#: quick ≈ 25 s and cpu ≈ 50 s of one core's time on the project's shared 2-core machines.  The arithmetic of
#: :mod:`mpt_lab.accumulation` runs on the CPU, so "full" is the cpu configuration (≈ 20 s on an H100 machine's
#: host CPU, estimated from 35.5 s measured there with fp8_recipes' larger full MLP, 1,000 steps of width 256,
#: whose runs all drive the training loss to zero and so cannot tell the weight storages apart).  The ``mlp_*``
#: values are fp8_recipes' of the same profile (its cpu profile's for "full"); a test holds them equal.
PROFILES = {
    "quick": {"steps": 100, "batch": 256, "mlp_steps": 120, "threads": 1},
    "cpu": {"steps": 200, "batch": 256, "mlp_steps": 150, "threads": 1},
    "full": {"steps": 200, "batch": 256, "mlp_steps": 150, "threads": 1},
}


@dataclass
class AccumulationTrainingResult(ExperimentResult):
    """``accumulator``: {"losses": arm → per-step training loss, "test": arm → {"loss", "accuracy"}};
    ``weights``: {"losses", "test", "mlp_config": the ``mlp_*`` fields and the seed used (fp8_recipes' Config
    fields of the same names)}; ``steps`` per comparison."""

    accumulator: dict
    weights: dict

    def final(self, which: str, arm: str, last: int = 20) -> float:
        """Mean training loss of the last ``last`` steps of ``arm`` in comparison ``which``."""
        v = getattr(self, which)["losses"][arm]
        return float(sum(v[-last:]) / len(v[-last:]))

    def describe(self) -> str:
        a = ", ".join(f"{k} {v['accuracy']:.3f}" for k, v in self.accumulator["test"].items())
        w = ", ".join(f"{k} {v['loss']:.3f}" for k, v in self.weights["test"].items())
        return (
            f"accumulation in training ({self.profile} profile): test accuracy by accumulator: {a}; "
            f"test loss by weight storage: {w}"
        )


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
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_factor(s, config.steps))
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
    fc = config
    xtr, ytr, xte, yte = digits_data(fc.seed)
    torch.manual_seed(fc.seed)
    init_state = copy.deepcopy(digits_mlp(fc.mlp_hidden, fc.mlp_layers).state_dict())
    losses, test = {}, {}
    for arm in run.bar(config.weight_arms, desc="BF16 weights"):
        recipe, keep = WEIGHT_ARMS[arm]
        torch.manual_seed(fc.seed + 1)
        model = digits_mlp(fc.mlp_hidden, fc.mlp_layers)
        model.load_state_dict(init_state)
        quantizer = quantize_linears_(model, TRAINING_RECIPES[recipe])  # BF16: no scale to keep
        params = list(model.parameters())
        sr_gen = torch.Generator().manual_seed(fc.seed + 2)
        if keep != "fp32":
            round_weights_(params, "nearest_even")  # stored in BF16 from the start
        comps = [torch.zeros_like(p) for p in params] if keep == "kahan" else None
        opt = torch.optim.Adam(params, lr=fc.mlp_lr, betas=(0.9, 0.95))
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_factor(s, fc.mlp_steps))
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
                        update = p - old  # the FP32 update Adam computed
                        p.copy_(old)
                        acc.compensated_update_(p, update, c, BF16)
            quantizer.step()
            losses[arm].append(float(loss.detach()))
        test[arm] = _evaluate(model, xte, yte)
    fields = ("seed", "mlp_hidden", "mlp_layers", "mlp_batch", "mlp_steps", "mlp_lr")
    return {"losses": losses, "test": test, "steps": fc.mlp_steps, "mlp_config": {f: getattr(fc, f) for f in fields}}


def measure(config: Config, run: Run) -> dict:
    return {"accumulator": _accumulator_runs(config, run), "weights": _weight_runs(config, run)}


#: ``--smoke``: the full profile cut to a few trials or steps (shapes unchanged).
SMOKE = {"steps": 2, "mlp_steps": 2, "threads": 1}

EXPERIMENT = Experiment(NAME, Config, PROFILES, measure, AccumulationTrainingResult, __doc__, smoke=SMOKE)
run, config_for, main = EXPERIMENT.run, EXPERIMENT.config_for, EXPERIMENT.main

if __name__ == "__main__":
    run_main(EXPERIMENT)
