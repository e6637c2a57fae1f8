"""Why FP32 master weights: pure FP16 weights stall when updates fall below half an ulp (paper §3.1).

Three copies of the same digit classifier (an MLP on scikit-learn's digits) train with plain SGD on the same
batches: in FP32; in pure FP16 (weights, gradients and the update ``w ← w − lr·g`` all FP16, so an update
smaller than half an ulp of its weight rounds away); and with :class:`mpt_lab.master_weights.MasterWeightTrainer`
(FP16 forward and backward, FP32 master weights).  For the pure FP16 run the share of non-zero updates that
were lost is recorded at every step.

    python -m mpt_lab.experiments.master_weights_stall --profile full --out book/results/master_weights_stall_full.json
"""

from __future__ import annotations

import copy
import time
from dataclasses import asdict, dataclass

import torch
from tqdm.auto import tqdm

from .. import formats as F
from ..data import digits_data
from ..device import provenance
from ..master_weights import MasterWeightTrainer
from ..scaling import GradScaler
from ._common import JsonResult, main as _main, prepare

__all__ = ["Config", "StallResult", "config_for", "run", "swamped_fraction", "NAME"]

NAME = "master_weights_stall"


def swamped_fraction(weights: torch.Tensor, updates: torch.Tensor, fmt="FP16") -> float:
    """Share of the non-zero ``updates`` that vanish when added to ``weights`` in ``fmt``.

    An update u is lost when round(w + u) == w, i.e. |u| ≤ half an ulp of w (a tie goes to the even
    neighbour).  ``w + u`` is formed in float64 (exact for FP16/BF16 operands) and rounded once with
    :func:`mpt_lab.formats.round_to`.

    Parameters
    ----------
    weights, updates : tensors of the same shape (any float dtype; values are taken as they are)

    Returns
    -------
    float in [0, 1] (NaN when no update is non-zero).

    Raises
    ------
    TypeError, ValueError
        Non-tensor arguments or different shapes.
    """
    if not isinstance(weights, torch.Tensor) or not isinstance(updates, torch.Tensor):
        raise TypeError("weights and updates must be tensors")
    if weights.shape != updates.shape:
        raise ValueError(f"weights and updates must have the same shape, got {tuple(weights.shape)} and "
                         f"{tuple(updates.shape)}")
    w, u = weights.detach().double(), updates.detach().double()
    nz = u != 0
    if not bool(nz.any()):
        return float("nan")
    lost = (F.round_to(w + u, fmt) == w) & nz
    return float(lost.sum()) / float(nz.sum())


@dataclass
class Config:
    profile: str = "cpu"
    steps: int = 10000
    batch_size: int = 64
    hidden: int = 64
    lr: float = 0.001                 # a small learning rate, as late in training: most FP16 updates round away
    seed: int = 0
    device: str = "auto"
    threads: int = 0


def config_for(profile: str) -> Config:
    """quick: CI (≈ 5 s on a CPU); cpu: ≈ 20 s; full: a GPU, longer."""
    if profile == "quick":
        return Config(profile="quick", steps=3000, threads=1)
    if profile == "cpu":
        return Config(profile="cpu", steps=10000, threads=1)
    if profile == "full":
        return Config(profile="full", steps=50000)
    raise ValueError(f"profile must be one of 'quick', 'cpu', 'full', got {profile!r}")


@dataclass
class StallResult(JsonResult):
    NAME = NAME
    config: dict
    provenance: dict
    losses: dict               # {"FP32": [...], "pure FP16": [...], "FP16 + FP32 masters": [...]} per step
    swamped: list              # per step: share of non-zero pure-FP16 updates lost
    test_accuracy: dict
    train_seconds: float = 0.0

    def describe(self) -> str:
        acc = ", ".join(f"{k} {v:.3f}" for k, v in self.test_accuracy.items())
        mean = sum(self.swamped) / max(len(self.swamped), 1)
        return (f"master weights ({self.config['profile']} profile, {self.provenance['device']}): "
                f"{self.config['steps']} SGD steps at lr {self.config['lr']}; test accuracy {acc}; "
                f"pure FP16 lost {100 * mean:.1f}% of its non-zero updates on average")


def _mlp(hidden: int) -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(64, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, 10))


def run(config: Config | None = None, *, command: str | None = None, progress: bool = True) -> StallResult:
    """Train the three copies and record losses, the pure-FP16 swamped share and test accuracies.

    Raises TypeError when ``config`` is not a :class:`Config`.
    """
    config, device = prepare(config, Config, config_for)
    xtr, ytr, xte, yte = digits_data(config.seed, device)
    base = _mlp(config.hidden).to(device)
    fp32 = copy.deepcopy(base)
    pure = copy.deepcopy(base).half()
    mixed_model = copy.deepcopy(base)
    opt32 = torch.optim.SGD(fp32.parameters(), lr=config.lr)
    trainer = MasterWeightTrainer(mixed_model, lambda p: torch.optim.SGD(p, lr=config.lr),
                                  torch.nn.functional.cross_entropy, scaler=GradScaler())
    ce = torch.nn.functional.cross_entropy
    losses = {"FP32": [], "pure FP16": [], "FP16 + FP32 masters": []}
    swamped = []
    gen = torch.Generator().manual_seed(config.seed)
    t0 = time.perf_counter()
    for _ in tqdm(range(config.steps), desc="FP32 / FP16 / masters", disable=not progress, mininterval=1.0):
        idx = torch.randint(0, len(xtr), (config.batch_size,), generator=gen).to(device)
        xb, yb = xtr[idx], ytr[idx]
        # FP32 reference
        opt32.zero_grad(set_to_none=True)
        loss = ce(fp32(xb), yb)
        loss.backward()
        opt32.step()
        losses["FP32"].append(float(loss.detach()))
        # pure FP16: weights, gradients and the SGD update in FP16
        pure.zero_grad(set_to_none=True)
        loss = ce(pure(xb.half()).float(), yb)
        loss.backward()
        with torch.no_grad():
            ws = torch.cat([p.reshape(-1) for p in pure.parameters()])
            us = torch.cat([(-config.lr * p.grad).reshape(-1) for p in pure.parameters()])
            swamped.append(swamped_fraction(ws.float(), us.half().float()))
            for p in pure.parameters():
                p.add_(p.grad, alpha=-config.lr)
        losses["pure FP16"].append(float(loss.detach()))
        # FP16 with FP32 master weights (the paper's loop)
        losses["FP16 + FP32 masters"].append(trainer.train_step(xb, yb)["loss"])
    train_seconds = time.perf_counter() - t0
    with torch.no_grad():
        acc = {"FP32": float((fp32(xte).argmax(1) == yte).float().mean()),
               "pure FP16": float((pure(xte.half()).argmax(1) == yte).float().mean()),
               "FP16 + FP32 masters": float((trainer.predict(xte).argmax(1) == yte).float().mean())}
    cfg = asdict(config)
    prov = provenance(command=command or f"python -m mpt_lab.experiments.{NAME} --profile {config.profile}",
                      config=cfg, device=device)
    return StallResult(cfg, prov, losses, swamped, acc, train_seconds)


def main(argv=None) -> int:
    return _main(__doc__.splitlines()[0], run, config_for, argv)


if __name__ == "__main__":
    raise SystemExit(main())
