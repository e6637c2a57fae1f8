"""What sets the scale of a detector's activation gradients: one factor at a time, from our detector toward SSD's.

Micikevicius et al. (ICLR 2018, §3.2, Figure 3) recorded the activation gradients of Multibox SSD (Liu et al.,
ECCV 2016: VGG-16 on 300x300 images, batch 32, loss divided by the number of matched default boxes) in FP32:
67% were zero (66.8% in Figure 2 of NVIDIA's 2017 blog post) and many of the rest lay below FP16's smallest
subnormal 2⁻²⁴ (2% in [2⁻³⁴, 2⁻³²), the paper's caption; 4% in [2⁻³², 2⁻³⁰), the blog post's).  Our detector
(chapter 2: :data:`mpt_lab.models.ssd.CONFIGS` "small", 64x64 images) has about the sources' share of zeros but
its median non-zero value lies some 12 binades above 2⁻²⁴.  This experiment measures which differences move the histogram and
by how much: each variant of :data:`VARIANTS` changes one thing of our detector toward SSD's (or combines
several), trains briefly in FP32 from scratch (the recipe of :func:`mpt_lab.models.ssd.make_optimizer`) and
records the log2 histogram of every module's output gradient (:class:`~mpt_lab.histogram.GradientHistogram`)
over the whole run.  For each it reports the median binade (:meth:`~mpt_lab.histogram.Log2Histogram.median_binade`),
the share of the non-zero values below 2⁻²⁴ and the share lost in FP16 (rounded to zero: 0 < |x| ≤ 2⁻²⁵).

The result also splits each shift into the part that a simple law predicts (:meth:`GradientFactorsResult.divisor_shift`)
and the rest:

* SSD's loss is a sum over matched default boxes divided by their number N (eq. 1), so every gradient is
  proportional to 1/N: a batch B times larger has about B times more matched boxes, and gradients log₂ B binades
  smaller; a loss that is not divided by N has gradients N times larger.
* A gradient shift k (the loss times 2⁻ᵏ, Adam's eps times 2⁻ᵏ: :mod:`mpt_lab.training`) moves
  every value by exactly k binades and changes nothing else in FP32: the variant "shift12" shows that the shift
  the book applies to the small detector in chapter 8 is the same kind of change as these natural factors.

More pixels per image, or another backbone, also change N (a 128 px image has four times the default boxes of a
64 px one, and about four times the matched ones); what remains after the 1/N part is what the network itself
does to the gradients on their way down (depth, width, initial weight scale, BatchNorm, the input's pixel range),
which has no exact law and is measured.

    python -m mpt_lab.experiments.gradient_factors --profile long --out book/results/gradient_factors_long.json
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from ..data import DigitsDetection
from ..harness.runner import Experiment, ExperimentConfig, ExperimentResult, Run, run_main
from ..histogram import GradientHistogram
from ..models.ssd import MultiBoxLoss, build_ssd, make_optimizer
from ..training import shift_eps, shuffled_batches

__all__ = [
    "Config",
    "GradientFactorsResult",
    "PROFILES",
    "VARIANTS",
    "BASE",
    "SETTINGS",
    "config_for",
    "run",
    "main",
    "NAME",
]

NAME = "gradient_factors"

#: The settings a variant may change, with our detector's values (chapter 2's detector).
BASE = {
    "model": "small",
    "image_size": 64,
    "batch_size": 32,
    "normalize": "matched",
    "init_gain": 1.0,
    "batch_norm": False,
    "input_scale": 1.0,
    "grad_shift": 0,
}
SETTINGS = tuple(BASE)

#: SSD's settings (Liu et al. 2016, §3; its Caffe model read pixels in 0-255 with the mean subtracted), cited.
PAPER_SSD = {
    "model": "VGG-16 (SSD300)",
    "image_size": 300,
    "batch_size": 32,
    "normalize": "matched",
    "batch_norm": False,
    "input_scale": 255,
}

#: id → (factor, label, settings that differ from :data:`BASE`).  Ids are what ``Config.variants`` lists.
VARIANTS: dict[str, tuple[str, str, dict]] = {
    "ours": ("our detector", "small, 64 px, batch 32, loss ÷ N", {}),
    "px128": ("input size", "128 × 128 px", {"image_size": 128}),
    "px320": ("input size", "320 × 320 px", {"image_size": 320}),
    "medium": ("width", "width × 8/3 (channels 16–128)", {"model": "medium"}),
    "large": ("width", "width × 16/3 (channels 32–256)", {"model": "large"}),
    "vgg16_64": ("depth", "VGG-16 shape, ⅛ width, 64 px", {"model": "vgg16_narrow"}),
    "vgg16_128": ("depth", "VGG-16 shape, ⅛ width, 128 px", {"model": "vgg16_narrow", "image_size": 128}),
    "batch8": ("batch size", "batch 8", {"batch_size": 8}),
    "batch128": ("batch size", "batch 128", {"batch_size": 128}),
    "per_image": ("loss normalisation", "loss ÷ images, not ÷ N", {"normalize": "batch"}),
    "sum": ("loss normalisation", "loss not divided (sum)", {"normalize": "none"}),
    "gain0.5": ("initial weight scale", "weights ½ × He", {"init_gain": 0.5}),
    "gain0.7": ("initial weight scale", "weights 0.7 × He", {"init_gain": 0.7}),
    "gain1.4": ("initial weight scale", "weights 1.4 × He", {"init_gain": 1.4}),
    "bn": ("BatchNorm", "BatchNorm after every conv", {"batch_norm": True}),
    "pixels255": ("input range", "pixels 0–255 (SSD's Caffe input)", {"input_scale": 255.0}),
    "shift12": ("gradient shift (chapter 8)", "ours, loss × 2⁻¹²", {"grad_shift": 12}),
    "vgg16_300": ("SSD300 shape", "VGG-16 shape, ⅛ width, 300 px", {"model": "vgg16_narrow", "image_size": 300}),
    "vgg16w4_300": ("SSD300 shape", "VGG-16 shape, ¼ width, 300 px", {"model": "vgg16", "image_size": 300}),
    "vgg16_300_255": (
        "SSD300 shape",
        "VGG-16 shape, ⅛ width, 300 px, pixels 0–255",
        {"model": "vgg16_narrow", "image_size": 300, "input_scale": 255.0},
    ),
}


@dataclass
class Config(ExperimentConfig):
    """The variants to train ("ours" first), their steps, data and learning rate (each field's comment says what
    it is; :data:`PROFILES` holds each profile's values)."""

    variants: tuple = ("ours", "batch8", "sum", "shift12")  # ids of VARIANTS, "ours" first
    steps: int = 60  # FP32 optimizer steps of each variant (all recorded)
    n_train: int = 4000  # at most this many generated images per variant (fewer when steps × batch is)
    lr: float = 3e-3  # Adam, warm-up and cosine decay (models.ssd.make_optimizer)
    warmup_steps: int = 20
    max_batch: int = 0  # at most this many images per batch in every variant (0: each its own)

    def validate(self) -> None:
        super().validate()
        self.check_positive("steps", "n_train", "warmup_steps")
        self.check_positive("max_batch", minimum=0)
        self.check_choices("variants", VARIANTS, subset=True)
        if self.variants[0] != "ours":
            raise ValueError(
                f"config.variants must start with 'ours' (the reference of every shift), got {tuple(self.variants)!r}"
            )
        if len(set(self.variants)) != len(self.variants):
            raise ValueError(f"config.variants must not repeat an id, got {tuple(self.variants)!r}")
        if not (isinstance(self.lr, (int, float)) and self.lr > 0):
            raise ValueError(f"config.lr must be a positive float, got {self.lr!r}")


_CHEAP = ("ours", "px128", "vgg16_64", "batch8", "sum", "gain0.5", "pixels255", "shift12")

PROFILES = {
    "quick": {
        "variants": ("ours", "px128", "batch8", "sum", "gain0.5", "shift12"),
        "steps": 12,
        "warmup_steps": 5,
        "n_train": 400,
        "threads": 1,
    },
    # chapter 2's cpu profile: the factors a reader can act on, short enough to add about a minute to the chapter
    "cpu": {"variants": _CHEAP, "steps": 24, "warmup_steps": 8, "n_train": 800, "threads": 0},
    "long": {
        "variants": tuple(v for v in VARIANTS if v != "vgg16w4_300"),
        "steps": 100,
        "warmup_steps": 20,
        "n_train": 1600,
        "threads": 1,
    },
    # one H100 (mpt_lab.harness.budget): the SSD300-shape series with the quarter-width VGG-16 at 300 px that
    # the long profile leaves out (each step records every module's gradient: its operator launches dominate)
    "full": {"variants": ("ours", "vgg16_300", "vgg16w4_300"), "steps": 100, "warmup_steps": 20, "n_train": 800},
}

#: ``--smoke``: two steps of each variant, on batches of at most 2 images (a step of the quarter-width VGG-16 on 32
#: images of 300 px takes tens of seconds on a CPU).
SMOKE = {"steps": 2, "warmup_steps": 1, "n_train": 4, "max_batch": 2}


@dataclass
class GradientFactorsResult(ExperimentResult):
    """``variants``: {id: {"factor", "label", "settings" (all of :data:`SETTINGS`), "activation" (histogram of
    the run), "losses" (per step, SSD eq. 1 divided by the matched boxes N whatever the normalisation),
    "matched" (mean N per batch), "values_per_image" (activation-gradient values per image and step),
    "parameters", "weight_gain" (geometric mean over backbone and extra convolutions of the weights' standard
    deviation over He's, at the end), "seconds"}} in the order of ``config["variants"]``."""

    variants: dict = field(default_factory=dict)

    def __post_init__(self):
        # a saved result names its variants as the code did when it ran (chapters were renumbered since): a variant
        # this module still defines reads with today's factor and label, its measurements untouched
        for vid, d in self.variants.items():
            if vid in VARIANTS and isinstance(d, dict):
                d["factor"], d["label"] = VARIANTS[vid][0], VARIANTS[vid][1]

    def _v(self, vid: str) -> dict:
        if vid not in self.variants:
            raise ValueError(f"vid must be one of {tuple(self.variants)}, got {vid!r}")
        return self.variants[vid]

    def median(self, vid: str) -> int | None:
        """Median binade of the non-zero activation gradients of variant ``vid``."""
        return self._v(vid)["activation"].median_binade()

    def shift(self, vid: str) -> int | None:
        """Binades the median of ``vid`` lies above (> 0) or below (< 0) our detector's."""
        m, m0 = self.median(vid), self.median("ours")
        return None if m is None or m0 is None else m - m0

    def divisor_shift(self, vid: str) -> float:
        """The part of :meth:`shift` that the loss's divisor and the gradient shift predict, in binades:
        log₂(D_ours / D) − (k − k_ours), where D is what the loss is divided by (the measured mean number N of
        matched default boxes per batch for SSD's normalisation, the batch size B, or 1) and k the gradient shift.

        Every gradient of the loss is ∝ 1/D × 2⁻ᵏ, so for variants that change only the normalisation, the batch
        size or k this is the whole shift; for the others (more pixels or default boxes also mean more matched
        boxes) the rest, :meth:`shift` minus this, is what the network itself does."""
        s, s0 = self._v(vid)["settings"], self.variants["ours"]["settings"]

        def divisor(settings, matched):
            return {"matched": float(matched), "batch": float(settings["batch_size"]), "none": 1.0}[
                settings["normalize"]
            ]

        return math.log2(divisor(s0, self.variants["ours"]["matched"]) / divisor(s, self._v(vid)["matched"])) - (
            s["grad_shift"] - s0["grad_shift"]
        )

    def shares(self, vid: str) -> dict:
        """Shares of variant ``vid``'s activation gradients (0 to 1): "zeros" (of all values), "below" (of the
        non-zero finite values: |x| < 2⁻²⁴, FP16's smallest subnormal) and "lost" (of the non-zero finite values:
        rounds to zero in FP16, |x| ≤ 2⁻²⁵)."""
        h = self._v(vid)["activation"]
        nonzero = h.total - h.zeros - h.nonfinite
        if nonzero <= 0:
            return {"zeros": h.fraction_zero(), "below": math.nan, "lost": math.nan}
        below = float(h.counts[h.exponents < -24].sum()) / nonzero
        return {
            "zeros": h.fraction_zero(),
            "below": below,
            "lost": h.fractions("FP16")["underflow"] * h.total / nonzero,
        }

    def describe(self) -> str:
        parts = [f"{'ours, ' if k == 'ours' else ''}{v['label']}: 2^{self.median(k)}" for k, v in self.variants.items()]
        return (
            f"gradient_factors ({self.profile} profile, {self.device}, {self.config['steps']} steps each): "
            f"median binade of the non-zero activation gradients: " + "; ".join(parts)
        )


def _weight_gain(model: torch.nn.Module) -> float:
    """Geometric mean over the backbone and extra convolutions of std(W) / He's std sqrt(2 / fan_out)."""
    logs = []
    for part in (model.backbone, model.extras):
        for m in part.modules():
            if isinstance(m, torch.nn.Conv2d):
                fan_out = m.out_channels * m.kernel_size[0] * m.kernel_size[1]
                logs.append(math.log(float(m.weight.detach().float().std()) / math.sqrt(2.0 / fan_out)))
    return math.exp(sum(logs) / len(logs)) if logs else math.nan


def _train_variant(vid: str, config: Config, run: Run) -> dict:
    """Train variant ``vid`` in FP32 for ``config.steps`` steps, recording every activation gradient."""
    factor, label, over = VARIANTS[vid]
    s = {**BASE, **over}
    if config.max_batch:  # a smoke run's cut; the settings record the batch that ran
        s["batch_size"] = min(s["batch_size"], config.max_batch)
    device = run.device
    batch = s["batch_size"]
    n_train = max(batch, min(config.n_train, config.steps * batch))
    data = DigitsDetection("train", n_train, s["image_size"], seed=config.seed)
    torch.manual_seed(config.seed)
    model = build_ssd(
        s["model"],
        image_size=s["image_size"],
        batch_norm=s["batch_norm"],
        init_gain=s["init_gain"],
        input_scale=s["input_scale"],
    ).to(device)
    loss_fn = MultiBoxLoss(model.priors, num_classes=model.num_classes, normalize=s["normalize"]).to(device)
    opt, sched = make_optimizer(model, config.steps, lr=config.lr, warmup_steps=min(config.warmup_steps, config.steps))
    shift_eps(opt, s["grad_shift"])
    batches = shuffled_batches(n_train, batch, seed=config.seed)
    losses, matched = [], []
    t0 = run.elapsed()
    model.train()
    with GradientHistogram(model, "activation") as gh:
        for _ in run.bar(range(config.steps), desc=label, leave=False):
            images, targets = data.batch(next(batches))
            targets = [{k: v.to(device) for k, v in t.items()} for t in targets]
            opt.zero_grad(set_to_none=True)
            loc, conf = model(images.to(device))
            out = loss_fn(loc, conf, targets, return_components=True)
            loss = out["loss"] * 2.0 ** -s["grad_shift"] if s["grad_shift"] else out["loss"]
            loss.backward()
            opt.step()
            sched.step()
            losses.append(float(out["loc"] + out["conf"]))
            matched.append(out["num_pos"])
    hist = gh.histogram.copy()
    return {
        "factor": factor,
        "label": label,
        "settings": s,
        "activation": hist,
        "losses": losses,
        "matched": sum(matched) / len(matched),
        "values_per_image": hist.total / (config.steps * batch),
        "parameters": sum(p.numel() for p in model.parameters()),
        "weight_gain": _weight_gain(model),
        "seconds": run.elapsed() - t0,
    }


def measure(config: Config, run: Run) -> dict:
    """Train every variant of ``config.variants`` briefly in FP32 and keep its activation-gradient histogram."""
    variants = {}
    for vid in config.variants:  # each variant is kept the moment it finishes (a deadline keeps them)
        variants[vid] = _train_variant(vid, config, run)
        run.arm_done(vid, variants[vid])
    return {"variants": variants}


EXPERIMENT = Experiment(NAME, Config, PROFILES, measure, GradientFactorsResult, __doc__, smoke=SMOKE)
run, config_for, main = EXPERIMENT.run, EXPERIMENT.config_for, EXPERIMENT.main

if __name__ == "__main__":
    run_main(EXPERIMENT)
