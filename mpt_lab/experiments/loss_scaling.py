"""Dynamic loss scaling on a real training run: ``mpt_lab.scaling.GradScaler`` beside ``torch.amp.GradScaler``.

Two identical copies of a small classifier (:func:`mpt_lab.models.digits_mlp` on scikit-learn's handwritten
digits, which ship offline) train on the same batches in FP16 mixed precision (``torch.autocast`` with
float16, on CUDA or on the CPU), one with each scaler.  The run records the loss scale of every step and the
steps whose gradients overflowed, so the chapter can plot the scale's trajectory (NVIDIA's dynamic loss
scaling: grow after N clean steps, back off on overflow; Micikevicius et al. 2018, §3.2) and check that the
two scalers agree bit for bit.

    python -m mpt_lab.experiments.loss_scaling --profile full --out book/results/loss_scaling_full.json
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..data import digits_data
from ..harness.runner import Experiment, ExperimentConfig, ExperimentResult, Run, run_main
from ..models import digits_mlp
from ..scaling import GradScaler
from ..training import accuracy

__all__ = ["Config", "LossScalingResult", "PROFILES", "config_for", "run", "main", "NAME"]

NAME = "loss_scaling"


@dataclass
class Config(ExperimentConfig):
    """The classifier, its training and the two scalers' settings (each field's comment says what it is;
    :data:`PROFILES` holds each profile's values)."""

    steps: int = 1500
    batch_size: int = 64
    hidden: int = 256  # two hidden layers of this width
    lr: float = 0.05  # SGD with momentum
    momentum: float = 0.9
    init_scale: float = 2.0**16  # torch's default
    growth_interval: int = 200  # torch's default is 2000; shorter so that a short run shows growth
    dtype: str = "float16"  # the autocast dtype: "float16" or "bfloat16"

    def validate(self) -> None:
        super().validate()
        self.check_positive("steps", "batch_size", "hidden", "growth_interval")
        self.check_choices("dtype", ("float16", "bfloat16"))


PROFILES = {
    "quick": {"steps": 400, "growth_interval": 50, "threads": 1},
    "cpu": {"steps": 1200, "growth_interval": 100, "threads": 1},
    # one H100 (mpt_lab.harness.budget): real FP16 autocast; eager steps of a small MLP cost their operator
    # launches (two models and a bit-for-bit comparison per step), so the run is long enough for ~10 growth
    # intervals, not torch's 2000-step interval
    "full": {"steps": 2000, "growth_interval": 200, "batch_size": 256, "hidden": 1024},
}

#: ``--smoke``: the full profile's models, two steps.
SMOKE = {"steps": 2}


@dataclass
class LossScalingResult(ExperimentResult):
    """``losses``: {"mpt_lab": [...], "torch": [...]}, the unscaled FP32 loss per step; ``history``: per
    scaler [(step, scale, found_inf)]; ``identical``: parameters bit-identical after every step;
    ``test_accuracy``: {"mpt_lab": a, "torch": a} on the held-out digits (0 to 1)."""

    losses: dict
    history: dict
    identical: bool
    test_accuracy: dict

    @property
    def overflow_steps(self) -> list:
        """The steps at which mpt_lab's scaler found an inf/NaN gradient (and skipped the step)."""
        return [s for s, _, inf in self.history["mpt_lab"] if inf]

    def describe(self) -> str:
        h = self.history["mpt_lab"]
        scales = [s for _, s, _ in h]
        return (
            f"loss scaling ({self.profile} profile, {self.device}): {len(h)} steps, "
            f"{len(self.overflow_steps)} overflows, scale {min(scales):g} … {max(scales):g}, "
            f"test accuracy {self.test_accuracy['mpt_lab']:.3f}; identical to torch: {self.identical}"
        )


def measure(config: Config, run: Run) -> dict:
    """Train two identical MLPs in FP16 mixed precision, one with each GradScaler, on the same batches."""
    device, dtype = run.device, getattr(torch, config.dtype)
    xtr, ytr, xte, yte = digits_data(config.seed, device)
    models = {"mpt_lab": digits_mlp(config.hidden, 2).to(device)}
    models["torch"] = copy.deepcopy(models["mpt_lab"])
    opts = {k: torch.optim.SGD(m.parameters(), lr=config.lr, momentum=config.momentum) for k, m in models.items()}
    kw = dict(init_scale=config.init_scale, growth_interval=config.growth_interval)
    scalers = {"mpt_lab": GradScaler(**kw), "torch": torch.amp.GradScaler(device.type, **kw)}
    losses = {k: [] for k in models}
    torch_scales = []
    identical = True
    gen = torch.Generator().manual_seed(config.seed)
    for step in run.bar(range(config.steps), desc="FP16 + loss scaling"):
        idx = torch.randint(0, len(xtr), (config.batch_size,), generator=gen).to(device)
        xb, yb = xtr[idx], ytr[idx]
        for k, model in models.items():
            opts[k].zero_grad(set_to_none=True)
            with torch.autocast(device.type, dtype=dtype):
                loss = F.cross_entropy(model(xb), yb)
            scalers[k].scale(loss).backward()
            scalers[k].step(opts[k])
            if k == "torch":
                torch_scales.append(float(scalers[k].get_scale()))
            scalers[k].update()
            losses[k].append(float(loss.detach()))
        if identical:
            identical = all(
                torch.equal(a, b) for a, b in zip(models["mpt_lab"].parameters(), models["torch"].parameters())
            )
    # torch's scaler keeps no history: its scale before each update, and overflow = the scale went down
    after = torch_scales[1:] + [float(scalers["torch"].get_scale())]
    theirs = [(s, v, nxt < v) for s, (v, nxt) in enumerate(zip(torch_scales, after))]
    with torch.no_grad():
        acc = {k: accuracy(m(xte), yte) for k, m in models.items()}
    return {
        "losses": losses,
        "history": {"mpt_lab": list(scalers["mpt_lab"].history), "torch": theirs},
        "identical": identical,
        "test_accuracy": acc,
    }


EXPERIMENT = Experiment(NAME, Config, PROFILES, measure, LossScalingResult, __doc__, smoke=SMOKE)
run, config_for, main = EXPERIMENT.run, EXPERIMENT.config_for, EXPERIMENT.main

if __name__ == "__main__":
    run_main(EXPERIMENT)
