"""The paper's Table 2 for SSD: the detector trained in FP32, in mixed FP16 without loss scaling, and with a loss
scale of 8.

Micikevicius et al. (ICLR 2018), §4.2 and Table 2: Multibox SSD (VGG-16, PASCAL VOC) reached mAP 76.9 in FP32;
in mixed precision without loss scaling training diverged; with loss scaling it reached 77.1 (§3.2: a scale
of 8 was enough, values below 2⁻²⁷ did not matter).  Here the detector of the histogram chapter
(:mod:`mpt_lab.models.ssd`, on :class:`~mpt_lab.data.DigitsDetection`) is trained from the same initial
weights and batch order in each recipe of :data:`mpt_lab.recipes.LOSS_SCALING` (real FP16 autocast on
CUDA, :mod:`mpt_lab.simulate` on a CPU), and the run reports mAP@0.5 on the test split and the loss curves,
with the share of activation-gradient values that are zero or below FP16's 2⁻²⁴ over training.

``grad_shift = k`` multiplies the loss by 2⁻ᵏ and Adam's eps by 2⁻ᵏ (see :mod:`mpt_lab.training`):
the FP32 run is bit-identical for every k.  Our detector's activation gradients sit about 12 binades above
the paper's (chapter 2: median non-zero 2⁻¹² on 64 px images, against "most values below FP16's range" for
VGG-16 on 300 px).  The default shift 12 moves our median non-zero activation gradient from about 2⁻¹² to
about 2⁻²⁴, FP16's smallest subnormal, so that, as in the paper's SSD histogram (its Figure 3; the blog post's
Figure 2), most non-zero values lie below
FP16's normal range; the chapter measures where the median lands (``median_log2`` in ``evals``).

The "long" profile has no shift (``grad_shift = 0``) and all four arms: it asks whether a larger detector's
gradients are small enough by themselves for FP16 without loss scaling to fail.  Its detector is the small one
on 128 px images (four times the default boxes, and of matched boxes N, of 64 px: gradients ∝ 1/N sit two
binades lower, as low as the VGG-16-shaped detector's at 128 px); SSD300's shape at 300 px does not fit: the
FP16 emulation of :mod:`mpt_lab.simulate` costs about five FP32 steps per step there, so four arms would get
about 60 steps each in an hour.  At that size the answer is no (``book/results/ssd_table2_long.json``): FP16
would flush a fraction of a percent of the FP32 run's values, and FP16 without loss scaling trains as FP32 does.

    python -m mpt_lab.experiments.ssd_table2 --profile full --out book/results/ssd_table2_full.json
    python -m mpt_lab.experiments.ssd_table2 --profile long --out book/results/ssd_table2_long.json
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from ..data import detection_split
from ..harness.runner import Experiment, ExperimentConfig, ExperimentResult, Run, run_main
from ..histogram import GradientHistogram, gradient_shares
from ..models import evaluate_detector
from ..models.detection_eval import LEGACY_MAP_EVALUATOR, MAP_EVALUATOR
from ..models.ssd import CONFIGS, MultiBoxLoss, build_ssd, make_optimizer
from ..recipes import LOSS_SCALING, OLD_LOSS_SCALING_NAMES, renamed
from ..training import RecipeRun, collect_arms, shift_eps, shuffled_batches

__all__ = ["Config", "SSDTable2Result", "PROFILES", "PAPER", "config_for", "run", "main", "NAME"]

NAME = "ssd_table2"

#: Micikevicius et al. 2018, Table 2 (PASCAL VOC 2007 test mAP, %), cited, not computed.
PAPER = {
    "Faster R-CNN": {"fp32": 69.1, "fp16_unscaled": 68.6, "fp16_static": 69.7},
    "Multibox SSD": {"fp32": 76.9, "fp16_unscaled": "diverges", "fp16_static": 77.1},
    "loss_scale": 8,
    "source": "Micikevicius et al. 2018, Table 2 and §4.2; loss scale 8 from §3.2",
}


@dataclass
class Config(ExperimentConfig):
    """The detector, its training, the loss scales and the recipes to train, one arm each (each field's comment says
    what it is; :data:`PROFILES` holds each profile's values)."""

    steps: int = 1200
    batch_size: int = 32
    n_train: int = 6000
    n_test: int = 400
    image_size: int = 64
    model: str = "small"  # mpt_lab.models.ssd.CONFIGS
    lr: float = 3e-3  # Adam + warm-up + cosine (mpt_lab.models.ssd.make_optimizer)
    warmup_steps: int = 50
    static_scale: float = 8.0  # the paper's S for SSD
    init_scale: float = 2.0**16
    growth_interval: int = 2000
    grad_shift: int = 12
    recipes: tuple = ("fp32", "fp16_unscaled", "fp16_static")  # of mpt_lab.recipes.LOSS_SCALING
    eval_every: int = 0  # mAP@0.5 every N steps as well (0: only at the end)
    hist_every: int = 2

    def validate(self) -> None:
        super().validate()
        self.check_positive(
            "steps", "batch_size", "n_test", "image_size", "warmup_steps", "hist_every", "growth_interval"
        )
        self.check_positive("grad_shift", "eval_every", minimum=0)
        self.check_choices("model", CONFIGS)
        self.check_choices("recipes", LOSS_SCALING, subset=True)
        if self.n_train < self.batch_size:
            raise ValueError(f"config.n_train must be ≥ batch_size = {self.batch_size}, got {self.n_train}")
        if not self.static_scale > 0:
            raise ValueError(f"config.static_scale must be > 0, got {self.static_scale!r}")


PROFILES = {
    "quick": {"steps": 120, "n_train": 3840, "n_test": 100, "hist_every": 4, "threads": 1},
    "cpu": {"steps": 120, "n_train": 4000, "n_test": 200, "hist_every": 4, "threads": 0},
    # no gradient shift: the gradients as the detector makes them, on 128 px images (FP16 emulated on a CPU costs
    # ~2.3x an FP32 step here; SSD300's VGG-16 shape at 300 px costs ~5x and would allow ~60 steps per arm)
    "long": {
        "steps": 800,
        "n_train": 6000,
        "n_test": 300,
        "image_size": 128,
        "grad_shift": 0,
        "recipes": LOSS_SCALING,
        "eval_every": 200,
        "threads": 1,
    },
    # one H100 (mpt_lab.harness.budget): Table 2 at SSD's natural scale with real FP16 autocast: SSD300 itself
    # (VGG-16 at full width, 300 px, batch 32), no gradient shift, the paper's three arms
    "full": {
        "steps": 150,
        "batch_size": 32,
        "n_train": 1600,
        "n_test": 300,
        "model": "vgg16_full",
        "image_size": 300,
        "grad_shift": 0,
        "hist_every": 5,
    },
}

#: ``--smoke``: two steps per arm (gradient histograms on the first) and one evaluation of one image, one image
#: per batch (a step of SSD300 on 32 images takes minutes of CPU and 10 GB).
SMOKE = {"steps": 2, "batch_size": 1, "n_train": 2, "n_test": 1, "hist_every": 2}


@dataclass
class SSDTable2Result(ExperimentResult):
    """Per recipe of ``config["recipes"]``, its arm in ``arms``: ``losses`` [steps] (SSD eq. (1), unshifted, unscaled), ``map50`` [[step, mAP@0.5]],
    ``skipped`` steps, ``evals`` [{step, zero_share, fp16_underflow, nonfinite, median_log2}] of the activation
    gradients per quarter of training (a window that histogrammed no step is not recorded); ``labels``, ``real_fp16``, ``train_seconds`` as in the bigLSTM result;
    ``map_evaluator``: what computed the mAP (:data:`~mpt_lab.models.detection_eval.MAP_EVALUATOR`; a result
    saved without it was made by the old hand-written evaluator, :data:`~mpt_lab.models.detection_eval.
    LEGACY_MAP_EVALUATOR`)."""

    arms: dict = field(default_factory=dict)
    labels: dict = field(default_factory=dict)
    real_fp16: bool = False
    train_seconds: dict = field(default_factory=dict)
    map_evaluator: str = LEGACY_MAP_EVALUATOR

    RENAMED_CONFIG = {"arms": "recipes"}

    @classmethod
    def upgrade(cls, d: dict) -> dict:
        """A result saved before the one recipe registry: ``config["arms"]`` becomes ``config["recipes"]``, and
        its recipe names (in the config, ``arms``, ``labels`` and ``train_seconds``) the registry's
        (:data:`mpt_lab.recipes.OLD_LOSS_SCALING_NAMES`: "fp16" → "fp16_unscaled", "fp16_dynamic" → "fp16")."""
        if "arms" in d.get("config", {}):
            names = OLD_LOSS_SCALING_NAMES
            d = cls.with_config(d, lambda c: {**c, "arms": renamed(c["arms"], names)} if "arms" in c else c)
            d.update({k: renamed(d[k], names) for k in ("arms", "labels", "train_seconds") if k in d})
        # Saved before the fix of 2026-11-28: the last window was recorded even when it histogrammed no step
        # (150 steps, a histogram every 5th step: steps 149-150 hold none), as shares of an empty histogram.
        empty = {"zero_share": 0.0, "fp16_underflow": 0.0, "nonfinite": 0.0, "median_log2": None}
        for arm in d.get("arms", {}).values():
            if "evals" in arm:
                arm["evals"] = [e for e in arm["evals"] if {k: e.get(k) for k in empty} != empty]
        return super().upgrade(d)

    def final_map(self, arm: str) -> float:
        """mAP@0.5 of ``arm`` at the end of training (0 to 1)."""
        if arm not in self.arms:
            raise ValueError(f"arm must be one of {tuple(self.arms)}, got {arm!r}")
        return float(self.arms[arm]["map50"][-1][1])

    def final_loss(self, arm: str, last: int = 50) -> float:
        """Mean training loss of the last ``last`` steps; NaN if they were not finite."""
        if arm not in self.arms:
            raise ValueError(f"arm must be one of {tuple(self.arms)}, got {arm!r}")
        tail = [float(v) for v in self.arms[arm]["losses"][-last:]]
        return sum(tail) / len(tail) if tail else float("nan")

    def diverged(self, arm: str) -> bool:
        """True when the loss became non-finite or ended above the loss of the first 20 steps."""
        losses = [float(v) for v in self.arms[arm]["losses"]]
        if not all(math.isfinite(v) for v in losses):
            return True
        return self.final_loss(arm) > sum(losses[:20]) / min(20, len(losses))

    def describe(self) -> str:
        parts = [f"{a}: mAP@0.5 {self.final_map(a):.3f}, loss {self.final_loss(a):.3f}" for a in self.arms]
        return (
            f"ssd_table2 ({self.profile} profile, grad_shift {self.config['grad_shift']}, "
            f"{'real' if self.real_fp16 else 'simulated'} FP16, {self.device}, mAP by {self.map_evaluator}): "
            + "; ".join(parts)
        )


def _train_arm(arm_name: str, config: Config, train, test, init_state: dict, run: Run) -> dict:
    """Train one arm from ``init_state``: the measured loop of the experiment."""
    device = run.device
    model = build_ssd(config.model, image_size=config.image_size).to(device)
    model.load_state_dict(init_state)
    loss_fn = MultiBoxLoss(model.priors, num_classes=model.num_classes).to(device)
    opt, sched = make_optimizer(model, config.steps, lr=config.lr, warmup_steps=config.warmup_steps)
    shift_eps(opt, config.grad_shift)
    arm = RecipeRun(
        arm_name,
        device,
        static_scale=config.static_scale,
        init_scale=config.init_scale,
        growth_interval=config.growth_interval,
        grad_shift=config.grad_shift,
    )
    batches = shuffled_batches(len(train), config.batch_size, seed=config.seed)
    losses, skipped, evals, map50 = [], [], [], []
    gh = GradientHistogram(model, "activation")
    eval_every = config.eval_every or config.steps
    hist_interval = max(1, config.steps // 4)
    t0 = run.elapsed()
    model.train()
    with gh:
        for step in run.bar(range(1, config.steps + 1), desc=arm.label()):
            images, targets = train.batch(next(batches))
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
            # a window's shares, when it histogrammed a step (the last, short window may hold none)
            if (step % hist_interval == 0 or step == config.steps) and gh.histogram.total:
                evals.append({"step": step, **gradient_shares(gh.histogram)})
                gh.reset()
            if step % eval_every == 0 or step == config.steps:
                gh.pause()
                map50.append([step, evaluate_detector(model, test, device=device)])
                model.train()
    return {
        "losses": losses,
        "skipped": skipped,
        "evals": evals,
        "map50": map50,
        "label": arm.label(),
        "real_fp16": arm.real_fp16,
        "seconds": run.elapsed() - t0,
    }


def measure(config: Config, run: Run) -> dict:
    """Train the detector once per recipe of ``config.recipes`` from the same initial weights and batch order."""
    train = detection_split("train", config.n_train, config.image_size, seed=config.seed)
    test = detection_split("test", config.n_test, config.image_size, seed=config.seed)
    torch.manual_seed(config.seed)
    init_state = {k: v.clone() for k, v in build_ssd(config.model, image_size=config.image_size).state_dict().items()}
    arms = {}
    for a in config.recipes:  # each arm is kept the moment it finishes (a deadline keeps them)
        arms[a] = _train_arm(a, config, train, test, init_state, run)
        run.arm_done(a, arms[a])
    out = collect_arms(arms)
    return {**out, "map_evaluator": MAP_EVALUATOR}


EXPERIMENT = Experiment(NAME, Config, PROFILES, measure, SSDTable2Result, __doc__, smoke=SMOKE)
run, config_for, main = EXPERIMENT.run, EXPERIMENT.config_for, EXPERIMENT.main

if __name__ == "__main__":
    run_main(EXPERIMENT)
