"""Dynamic loss scaling on a real training run: ``mpt_lab.scaling.GradScaler`` beside ``torch.amp.GradScaler``.

Two identical copies of a small classifier (an MLP on scikit-learn's handwritten digits, which ship offline)
train on the same batches in FP16 mixed precision (``torch.autocast`` with float16, on CUDA or on the CPU),
one with each scaler.  The run records the loss scale of every step and the steps whose gradients overflowed,
so the chapter can plot the scale's trajectory (NVIDIA's dynamic loss scaling: grow after N clean steps, back
off on overflow; Micikevicius et al. 2018, §3.2) and check that the two scalers agree bit for bit.

    python -m mpt_lab.experiments.loss_scaling --profile full --out book/results/loss_scaling_full.json
"""

from __future__ import annotations

import copy
import time
from dataclasses import asdict, dataclass

import torch
from tqdm.auto import tqdm

from ..data import digits_data
from ..device import provenance
from ..scaling import GradScaler
from ._common import JsonResult, main as _main, prepare

__all__ = ["Config", "LossScalingResult", "config_for", "run", "NAME"]

NAME = "loss_scaling"


@dataclass
class Config:
    """Size and settings of one run."""

    profile: str = "cpu"
    steps: int = 1500
    batch_size: int = 64
    hidden: int = 256
    lr: float = 0.05
    momentum: float = 0.9
    init_scale: float = 2.0 ** 16     # torch's default
    growth_interval: int = 200        # torch's default is 2000; shorter so that a short run shows growth
    dtype: str = "float16"
    seed: int = 0
    device: str = "auto"
    threads: int = 0


def config_for(profile: str) -> Config:
    """quick: CI (≈ 10 s on a CPU); cpu: ≈ 1 minute; full: a GPU, the same model for longer."""
    if profile == "quick":
        return Config(profile="quick", steps=400, growth_interval=50, threads=1)
    if profile == "cpu":
        return Config(profile="cpu", steps=2000, growth_interval=100, threads=1)
    if profile == "full":
        return Config(profile="full", steps=20000, growth_interval=2000, batch_size=256, hidden=1024)
    raise ValueError(f"profile must be one of 'quick', 'cpu', 'full', got {profile!r}")


def _model(hidden: int) -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(64, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, hidden),
                               torch.nn.ReLU(), torch.nn.Linear(hidden, 10))


@dataclass
class LossScalingResult(JsonResult):
    NAME = NAME
    config: dict
    provenance: dict
    losses: dict            # {"mpt_lab": [...], "torch": [...]} per step (unscaled FP32 loss)
    history: dict           # {"mpt_lab": [(step, scale, found_inf)], "torch": [...]}
    identical: bool         # parameters bit-identical after every step
    test_accuracy: dict     # {"mpt_lab": acc, "torch": acc} on the held-out digits
    train_seconds: float = 0.0

    @property
    def overflow_steps(self) -> list:
        return [s for s, _, inf in self.history["mpt_lab"] if inf]

    def describe(self) -> str:
        h = self.history["mpt_lab"]
        scales = [s for _, s, _ in h]
        return (f"loss scaling ({self.config['profile']} profile, {self.provenance['device']}): {len(h)} steps, "
                f"{len(self.overflow_steps)} overflows, scale {min(scales):g} … {max(scales):g}, "
                f"test accuracy {self.test_accuracy['mpt_lab']:.3f}; identical to torch: {self.identical}")

    @classmethod
    def _from_fields(cls, d: dict) -> "LossScalingResult":
        hist = {k: [(int(s), float(v), None if f is None else bool(f)) for s, v, f in h] for k, h in d["history"].items()}
        return cls(config=d["config"], provenance=d["provenance"], losses=d["losses"], history=hist,
                   identical=bool(d["identical"]), test_accuracy=d["test_accuracy"],
                   train_seconds=float(d["train_seconds"]))


def run(config: Config | None = None, *, command: str | None = None, progress: bool = True) -> LossScalingResult:
    """Train two identical MLPs in FP16 mixed precision, one with each GradScaler, on the same batches.

    Raises TypeError when ``config`` is not a :class:`Config`, ValueError for an unknown ``dtype``.
    """
    config, device = prepare(config, Config, config_for)
    dtype = {"float16": torch.float16, "bfloat16": torch.bfloat16}.get(config.dtype)
    if dtype is None:
        raise ValueError(f"config.dtype must be 'float16' or 'bfloat16', got {config.dtype!r}")
    xtr, ytr, xte, yte = digits_data(config.seed, device)
    models = {"mpt_lab": _model(config.hidden).to(device)}
    models["torch"] = copy.deepcopy(models["mpt_lab"])
    opts = {k: torch.optim.SGD(m.parameters(), lr=config.lr, momentum=config.momentum) for k, m in models.items()}
    kw = dict(init_scale=config.init_scale, growth_interval=config.growth_interval)
    scalers = {"mpt_lab": GradScaler(**kw), "torch": torch.amp.GradScaler(device.type, **kw)}
    losses = {k: [] for k in models}
    torch_hist = []
    identical = True
    gen = torch.Generator().manual_seed(config.seed)
    t0 = time.perf_counter()
    for step in tqdm(range(config.steps), desc="FP16 + loss scaling", disable=not progress, mininterval=1.0):
        idx = torch.randint(0, len(xtr), (config.batch_size,), generator=gen).to(device)
        xb, yb = xtr[idx], ytr[idx]
        for k, model in models.items():
            opt, scaler = opts[k], scalers[k]
            opt.zero_grad(set_to_none=True)
            with torch.autocast(device.type, dtype=dtype):
                loss = torch.nn.functional.cross_entropy(model(xb), yb)
            scaler.scale(loss).backward()
            scaler.step(opt)
            if k == "torch":
                torch_hist.append((step, float(scaler.get_scale()), None))
            scaler.update()
            losses[k].append(float(loss.detach()))
        if identical:
            identical = all(torch.equal(a, b) for a, b in zip(models["mpt_lab"].parameters(),
                                                               models["torch"].parameters()))
    train_seconds = time.perf_counter() - t0
    ours = [(int(s), float(v), bool(f)) for s, v, f in scalers["mpt_lab"].history]
    # torch's scaler keeps no history: its scale before each update, and overflow = the scale went down
    theirs = []
    for i, (s, v, _) in enumerate(torch_hist):
        nxt = torch_hist[i + 1][1] if i + 1 < len(torch_hist) else float(scalers["torch"].get_scale())
        theirs.append((s, v, nxt < v))
    acc = {}
    with torch.no_grad():
        for k, m in models.items():
            acc[k] = float((m(xte).argmax(1) == yte).float().mean())
    cfg = asdict(config)
    prov = provenance(command=command or f"python -m mpt_lab.experiments.{NAME} --profile {config.profile}",
                      config=cfg, device=device)
    return LossScalingResult(cfg, prov, losses, {"mpt_lab": ours, "torch": theirs}, identical, acc, train_seconds)


def main(argv=None) -> int:
    return _main(__doc__.splitlines()[0], run, config_for, argv)


if __name__ == "__main__":
    raise SystemExit(main())
