"""Why FP32 master weights: pure FP16 weights stall when updates fall below half an ulp (paper §3.1).

Three copies of the same digit classifier (:func:`mpt_lab.models.digits_mlp` on scikit-learn's digits) train
with plain SGD on the same batches: in FP32; in pure FP16 (weights, gradients and the update ``w ← w − lr·g``
all FP16, so an update smaller than half an ulp of its weight rounds away); and with
:class:`mpt_lab.master_weights.MasterWeightTrainer` (FP16 forward and backward, FP32 master weights), with a
dynamic loss scale and (``masters_without_scale``, in the CPU profiles) also without one: that fourth run differs
from pure FP16 only in how the weights are kept.  For the pure FP16 run two shares are recorded at every step,
the paper's two reasons (§3.1): of the updates lr·g that are not zero, the share FP16 cannot represent at all
(they round to zero, |lr·g| ≤ 2⁻²⁵: ``underflowed``), and of those it can, the share lost when added to their
weight (``swamped``).

    python -m mpt_lab.experiments.master_weights_stall --profile full --out book/results/master_weights_stall_full.json
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from .. import formats
from ..data import digits_data
from ..harness.runner import Experiment, ExperimentConfig, ExperimentResult, Run, run_main
from ..master_weights import MasterWeightTrainer, swamped_fraction
from ..models import digits_mlp
from ..scaling import GradScaler
from ..training import accuracy

__all__ = ["Config", "StallResult", "PROFILES", "RUNS", "config_for", "run", "main", "NAME"]

NAME = "master_weights_stall"

#: The three runs, as the result's dicts name them.
RUNS = ("FP32", "pure FP16", "FP16 + FP32 masters", "FP16 + FP32 masters, no loss scale")


@dataclass
class Config(ExperimentConfig):
    """The three classifiers' training: steps, batch size, hidden width and learning rate (:data:`PROFILES` holds
    each profile's values)."""

    steps: int = 10000
    batch_size: int = 64
    hidden: int = 64
    lr: float = 0.001  # a small learning rate, as late in training: most FP16 updates round away
    masters_without_scale: bool = True  # the fourth run: FP32 masters without a loss scale

    def validate(self) -> None:
        super().validate()
        self.check_positive("steps", "batch_size", "hidden")


PROFILES = {
    "quick": {"steps": 3000, "threads": 1},
    "cpu": {"steps": 7000, "threads": 1},
    # one H100 (mpt_lab.harness.budget): three small models and the swamped share per step cost their
    # operator launches, not FLOPs
    "full": {"steps": 2000, "masters_without_scale": False},
}

#: ``--smoke``: two steps.
SMOKE = {"steps": 2}


@dataclass
class StallResult(ExperimentResult):
    """``losses``: {run: [loss per step]} for the runs of :data:`RUNS` (the fourth only with
    ``masters_without_scale``); ``swamped``: per step, the share of the pure-FP16 updates that FP16 represents
    (non-zero in FP16) and that are lost when added to their weight; ``underflowed``: per step, the share of the
    non-zero updates lr·g that round to zero in FP16 (empty in results saved before it was recorded);
    ``test_accuracy``: {run: accuracy (0 to 1)}."""

    losses: dict
    swamped: list
    test_accuracy: dict
    underflowed: list = field(default_factory=list)

    def describe(self) -> str:
        acc = ", ".join(f"{k} {v:.3f}" for k, v in self.test_accuracy.items())
        mean = sum(self.swamped) / max(len(self.swamped), 1)
        text = (
            f"master weights ({self.profile} profile, {self.device}): {self.config['steps']} SGD steps at "
            f"lr {self.config['lr']}; test accuracy {acc}; pure FP16, averaged over the steps: "
            f"{100 * mean:.1f}% of the updates that FP16 can represent were lost when added to their weight"
        )
        if self.underflowed:  # of all non-zero updates: those that underflow, and the swamped share of the others
            both = sum(u + (1 - u) * s for u, s in zip(self.underflowed, self.swamped)) / len(self.swamped)
            text += f"; with those that round to zero, {100 * both:.1f}% of all its non-zero updates"
        return text


def measure(config: Config, run: Run) -> dict:
    """Train the three copies; record losses, the pure-FP16 swamped share and test accuracies."""
    device = run.device
    xtr, ytr, xte, yte = digits_data(config.seed, device)
    base = digits_mlp(config.hidden).to(device)
    fp32, pure = copy.deepcopy(base), copy.deepcopy(base).half()
    opt32 = torch.optim.SGD(fp32.parameters(), lr=config.lr)
    trainer = MasterWeightTrainer(
        copy.deepcopy(base), lambda p: torch.optim.SGD(p, lr=config.lr), F.cross_entropy, scaler=GradScaler()
    )
    unscaled = (
        MasterWeightTrainer(copy.deepcopy(base), lambda p: torch.optim.SGD(p, lr=config.lr), F.cross_entropy)
        if config.masters_without_scale
        else None
    )
    losses = {k: [] for k in RUNS if unscaled is not None or k != RUNS[3]}
    swamped, underflowed = [], []
    gen = torch.Generator().manual_seed(config.seed)
    for _ in run.bar(range(config.steps), desc="FP32 / FP16 / masters"):
        idx = torch.randint(0, len(xtr), (config.batch_size,), generator=gen).to(device)
        xb, yb = xtr[idx], ytr[idx]
        # FP32 reference
        opt32.zero_grad(set_to_none=True)
        loss = F.cross_entropy(fp32(xb), yb)
        loss.backward()
        opt32.step()
        losses["FP32"].append(float(loss.detach()))
        # pure FP16: weights, gradients and the SGD update in FP16
        pure.zero_grad(set_to_none=True)
        loss = F.cross_entropy(pure(xb.half()).float(), yb)
        loss.backward()
        with torch.no_grad():
            ws = torch.cat([p.reshape(-1) for p in pure.parameters()])
            us = torch.cat([(-config.lr * p.grad).reshape(-1) for p in pure.parameters()])
            swamped.append(swamped_fraction(ws.float(), us.half().float()))
            exact = torch.cat([(-config.lr * p.grad.double()).reshape(-1) for p in pure.parameters()])
            nz = exact != 0
            gone = (formats.round_to(exact, "FP16") == 0) & nz
            underflowed.append(float(gone.sum()) / max(float(nz.sum()), 1.0))
            for p in pure.parameters():
                p.add_(p.grad, alpha=-config.lr)
        losses["pure FP16"].append(float(loss.detach()))
        # FP16 with FP32 master weights (the paper's loop)
        losses["FP16 + FP32 masters"].append(trainer.train_step(xb, yb)["loss"])
        if unscaled is not None:
            losses[RUNS[3]].append(unscaled.train_step(xb, yb)["loss"])
    with torch.no_grad():
        acc = {
            "FP32": accuracy(fp32(xte), yte),
            "pure FP16": accuracy(pure(xte.half()), yte),
            "FP16 + FP32 masters": accuracy(trainer.predict(xte), yte),
        }
        if unscaled is not None:
            acc[RUNS[3]] = accuracy(unscaled.predict(xte), yte)
    return {"losses": losses, "swamped": swamped, "underflowed": underflowed, "test_accuracy": acc}


EXPERIMENT = Experiment(NAME, Config, PROFILES, measure, StallResult, __doc__, smoke=SMOKE)
run, config_for, main = EXPERIMENT.run, EXPERIMENT.config_for, EXPERIMENT.main

if __name__ == "__main__":
    run_main(EXPERIMENT)
