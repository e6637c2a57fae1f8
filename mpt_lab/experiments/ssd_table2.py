"""The paper's Table 2 for SSD: the detector trained in FP32, in mixed FP16 without loss scaling, and with a loss
scale of 8.

Micikevicius et al. (ICLR 2018), §4.2 and Table 2: Multibox SSD (VGG-16, PASCAL VOC) reached mAP 76.9 in FP32;
in mixed precision without loss scaling training diverged; with loss scaling it reached 77.1 (§3.2: a scale
of 8 was enough, values below 2⁻²⁷ did not matter).  Here the detector of the histogram chapter
(:mod:`mpt_lab.models.ssd`, on :class:`~mpt_lab.data.DigitsDetection`) is trained from the same initial
weights and batch order in each arm of :data:`~mpt_lab.experiments._precision.ARMS` (real FP16 autocast on
CUDA, :mod:`mpt_lab.simulate` on a CPU), and the run reports mAP@0.5 on the test split and the loss curves,
with the share of activation-gradient values that are zero or below FP16's 2⁻²⁴ over training.

``grad_shift = k`` multiplies the loss by 2⁻ᵏ and Adam's eps by 2⁻ᵏ (see :mod:`mpt_lab.experiments._precision`):
the FP32 run is bit-identical for every k.  Our detector's activation gradients sit about 12 binades above
the paper's (chapter 2: median non-zero 2⁻¹² on 64 px images, against "most values below FP16's range" for
VGG-16 on 300 px).  The default shift 12 moves our median non-zero activation gradient from about 2⁻¹² to
about 2⁻²⁴, FP16's smallest subnormal, so that, as in the paper's Figure 2, most non-zero values lie below
FP16's normal range; the chapter measures where the median lands (``median_log2`` in ``evals``).

    python -m mpt_lab.experiments.ssd_table2 --profile full --out book/results/ssd_table2_full.json
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field

import torch
from tqdm.auto import tqdm

from ..data import DigitsDetection
from ..device import provenance
from ..histogram import GradientHistogram
from ..models.ssd import MultiBoxLoss, build_ssd, make_optimizer
from ._common import JsonResult, main as _main, prepare
from ._precision import ARMS, PrecisionArm, check_arms, collect_arms, gradient_shares, shift_eps
from .ssd_histogram import _evaluate

__all__ = ["Config", "SSDTable2Result", "config_for", "run", "PAPER", "NAME"]

NAME = "ssd_table2"

#: Micikevicius et al. 2018, Table 2 (PASCAL VOC 2007 test mAP, %), cited, not computed.
PAPER = {
    "Faster R-CNN": {"fp32": 69.1, "fp16": 68.6, "fp16_static": 69.7},
    "Multibox SSD": {"fp32": 76.9, "fp16": "diverges", "fp16_static": 77.1},
    "loss_scale": 8,
    "source": "Micikevicius et al. 2018, Table 2 and §4.2; loss scale 8 from §3.2",
}


@dataclass
class Config:
    """Size and settings of one run (see :func:`config_for` for the profiles)."""

    profile: str = "cpu"
    steps: int = 1200
    batch_size: int = 32
    n_train: int = 6000
    n_test: int = 400
    image_size: int = 64
    model: str = "small"               # mpt_lab.models.ssd.CONFIGS
    lr: float = 3e-3                   # Adam + warm-up + cosine (mpt_lab.models.ssd.make_optimizer)
    warmup_steps: int = 50
    static_scale: float = 8.0          # the paper's S for SSD
    init_scale: float = 2.0 ** 16
    growth_interval: int = 2000
    grad_shift: int = 12
    arms: tuple = ("fp32", "fp16", "fp16_static")
    eval_every: int = 0                # mAP@0.5 every N steps as well (0: only at the end)
    hist_every: int = 2
    seed: int = 0
    device: str = "auto"
    threads: int = 0


def config_for(profile: str) -> Config:
    """quick: CI (≈ 30 s on one CPU core); cpu: ≈ 90 s; full: one H100, ≤ 8 minutes (all four arms).

    Raises ValueError for other names.
    """
    if profile == "quick":
        return Config(profile="quick", steps=120, n_train=3840, n_test=100, hist_every=4, threads=1)
    if profile == "cpu":
        return Config(profile="cpu", steps=400, n_train=6000, n_test=300, eval_every=100, threads=1)
    if profile == "full":
        return Config(profile="full", steps=6000, batch_size=64, n_train=20000, n_test=2000, model="large",
                      eval_every=1000, hist_every=5, arms=ARMS)
    raise ValueError(f"profile must be one of 'quick', 'cpu', 'full', got {profile!r}")


@dataclass
class SSDTable2Result(JsonResult):
    """Per arm: ``losses`` [steps] (SSD eq. (1), unshifted, unscaled), ``map50`` [(step, mAP@0.5)], ``skipped``
    steps, ``evals`` [{step, zero_share, fp16_underflow, nonfinite}] of the activation gradients per interval."""

    NAME = NAME
    config: dict
    provenance: dict
    arms: dict = field(default_factory=dict)
    labels: dict = field(default_factory=dict)
    real_fp16: bool = False
    train_seconds: dict = field(default_factory=dict)

    def final_map(self, arm: str) -> float:
        """mAP@0.5 of ``arm`` at the end of training (0 to 1)."""
        if arm not in self.arms:
            raise ValueError(f"arm must be one of {tuple(self.arms)}, got {arm!r}")
        return float(self.arms[arm]["map50"][-1][1])

    def final_loss(self, arm: str, last: int = 50) -> float:
        """Mean training loss of the last ``last`` steps; NaN if they were not finite."""
        tail = [float(v) for v in self.arms[arm]["losses"][-last:]]
        return sum(tail) / len(tail) if tail else float("nan")

    def diverged(self, arm: str) -> bool:
        """True when the loss became non-finite or ended above the loss of the first 20 steps."""
        losses = [float(v) for v in self.arms[arm]["losses"]]
        if not all(math.isfinite(v) for v in losses):
            return True
        return self.final_loss(arm) > sum(losses[:20]) / min(20, len(losses))

    def table(self):
        """HTML table beside the paper's SSD row: mAP@0.5 per arm, ours (×100) and the paper's."""
        from ..widgets import table_html

        paper = PAPER["Multibox SSD"]
        rows = []
        for arm, d in self.arms.items():
            e = d["evals"][-1] if d["evals"] else {"zero_share": float("nan"), "fp16_underflow": float("nan")}
            ours = f"{100 * self.final_map(arm):.1f}" + (" (diverged)" if self.diverged(arm) else "")
            p = paper.get(arm, "—")
            rows.append([self.labels.get(arm, arm), ours, str(p), f"{self.final_loss(arm):.3f}",
                         f"{100 * e['zero_share']:.1f}%", str(len(d["skipped"]))])
        return table_html(["run", "mAP@0.5 ours (%)", "paper, SSD on VOC (%)", "final training loss",
                           "activation gradients = 0", "skipped steps"], rows)

    def describe(self) -> str:
        parts = [f"{a}: mAP@0.5 {self.final_map(a):.3f}, loss {self.final_loss(a):.3f}" for a in self.arms]
        return (f"ssd_table2 ({self.config['profile']} profile, grad_shift {self.config['grad_shift']}, "
                f"{'real' if self.real_fp16 else 'simulated'} FP16, {self.provenance['device']}): " + "; ".join(parts))


def _train_arm(arm_name: str, config: Config, train, test, init_state: dict, device, progress: bool) -> dict:
    model = build_ssd(config.model, image_size=config.image_size).to(device)
    model.load_state_dict(init_state)
    loss_fn = MultiBoxLoss(model.priors, num_classes=model.num_classes).to(device)
    opt, sched = make_optimizer(model, config.steps, lr=config.lr, warmup_steps=config.warmup_steps)
    shift_eps(opt, config.grad_shift)
    arm = PrecisionArm(arm_name, device, static_scale=config.static_scale, init_scale=config.init_scale,
                       growth_interval=config.growth_interval, grad_shift=config.grad_shift)
    gen = torch.Generator().manual_seed(config.seed)
    order, pos = torch.randperm(len(train), generator=gen), 0
    losses, skipped, evals, map50 = [], [], [], []
    gh = GradientHistogram(model, "activation")
    eval_every = config.eval_every or config.steps
    hist_interval = max(1, config.steps // 4)
    t0 = time.perf_counter()
    model.train()
    with gh:
        for step in tqdm(range(1, config.steps + 1), desc=arm.label(), disable=not progress, mininterval=1.0):
            if pos + config.batch_size > len(order):
                order, pos = torch.randperm(len(train), generator=gen), 0
            images, targets = train.batch(order[pos:pos + config.batch_size])
            pos += config.batch_size
            images = images.to(device)
            targets = [{k: v.to(device) for k, v in t.items()} for t in targets]

            def forward():
                loc, conf = model(images)
                return loss_fn(arm.to_float32(loc), arm.to_float32(conf), targets)

            (gh.resume if (step - 1) % config.hist_every == 0 else gh.pause)()
            loss, skip = arm.step(forward, opt)
            sched.step()
            losses.append(loss)
            if skip:
                skipped.append(step)
            if step % hist_interval == 0 or step == config.steps:
                evals.append({"step": step, **gradient_shares(gh.histogram)})
                gh.reset()
            if step % eval_every == 0 or step == config.steps:
                gh.pause()
                map50.append((step, _evaluate(model, test, 100, device)))
                model.train()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return {"losses": losses, "skipped": skipped, "evals": evals, "map50": map50, "label": arm.label(),
            "real_fp16": arm.real_fp16, "seconds": time.perf_counter() - t0}


def run(config: Config | None = None, *, command: str | None = None, progress: bool = True) -> SSDTable2Result:
    """Train the detector once per arm of ``config.arms`` from the same initial weights and batch order.

    Returns
    -------
    SSDTable2Result

    Raises
    ------
    TypeError
        ``config`` is not a :class:`Config`.
    ValueError
        An unknown arm in ``config.arms``.
    """
    config, device = prepare(config, Config, config_for)
    check_arms(config.arms)
    train = DigitsDetection("train", config.n_train, config.image_size, seed=config.seed)
    test = DigitsDetection("test", config.n_test, config.image_size, seed=config.seed)
    torch.manual_seed(config.seed)
    init_state = {k: v.clone() for k, v in build_ssd(config.model, image_size=config.image_size).state_dict().items()}
    out = {a: _train_arm(a, config, train, test, init_state, device, progress) for a in config.arms}
    cfg = asdict(config)
    cfg["arms"] = list(config.arms)
    prov = provenance(command=command or f"python -m mpt_lab.experiments.{NAME} --profile {config.profile}",
                      config=cfg, device=device)
    return SSDTable2Result(config=cfg, provenance=prov, **collect_arms(out))


def main(argv=None) -> int:
    return _main(__doc__.splitlines()[0], run, config_for, argv)


if __name__ == "__main__":
    raise SystemExit(main())
