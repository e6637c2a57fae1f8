"""The SSD histogram: activation gradients of an SSD detector trained in FP32, by magnitude.

Micikevicius et al. (ICLR 2018, §3.2 and Figure 3) recorded the activation gradients of Multibox SSD while it
trained in FP32: 67% of the values were zero (the figure of NVIDIA's 2017 blog post on the paper, its Figure 2,
says 66.8%), and many of the rest lay below FP16's smallest subnormal 2⁻²⁴, so a plain cast to FP16 flushes them to
zero; multiplying the loss by S = 8 was enough to train in mixed precision.
This experiment trains the SSD-style detector of :mod:`mpt_lab.models.ssd` on :class:`mpt_lab.data.DigitsDetection`
in FP32 and records, over the whole run, the log2 histogram of the gradients with respect to every module's
output (activation gradients) and with respect to every parameter (weight gradients); then, for ``sweep``,
short FP32 runs of detectors of other sizes (``"model:pixels"``), to show how the histogram moves with the size
of the network and of its images.

The "long" profile trains the most SSD-like detector that a CPU core trains in an hour: SSD300's layout, input
size and 8,732 default boxes on a VGG-16-shaped backbone at an eighth of VGG-16's width
(:class:`~mpt_lab.models.ssd.VGGSSD`, ``CONFIGS["vgg16_narrow"]``), batch 32, loss divided by the matched
boxes, from scratch; no gradient shift and nothing tuned toward the paper's numbers
(:mod:`mpt_lab.experiments.gradient_factors` measures which of these choices move the histogram).

    python -m mpt_lab.experiments.ssd_histogram --profile full --out book/results/ssd_histogram_full.json
    python -m mpt_lab.experiments.ssd_histogram --profile long --out book/results/ssd_histogram_long.json
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, field, replace

from .. import formats as F
from ..data import detection_split
from ..formats import FormatLike
from ..harness.runner import Experiment, ExperimentConfig, ExperimentResult, Run, run_main
from ..histogram import GradientHistogram, Log2Histogram
from ..models import MultiBoxLoss, build_ssd, evaluate_detector, make_optimizer, train_step
from ..models.detection_eval import LEGACY_MAP_EVALUATOR, MAP_EVALUATOR
from ..models.ssd import CONFIGS
from ..scaling import max_gradient_scale
from ..training import shuffled_batches

__all__ = ["Config", "SSDHistogramResult", "HistogramSummary", "PROFILES", "PAPER", "config_for", "run", "main", "NAME"]

NAME = "ssd_histogram"

#: What the sources report for Multibox SSD (cited, not computed).  Two works show the same histogram with
#: different captions: NVIDIA's 2017 developer-blog post "Mixed-Precision Training of Deep Neural Networks"
#: (Micikevicius et al.; its Figure 2, also in NVIDIA's "Training with Mixed Precision" guide) and the paper,
#: Micikevicius et al., ICLR 2018 (its Figure 3 and §3.2).
PAPER = {
    "zeros": 0.668,  # blog post, Figure 2 caption (and the guide): 66.8% of values were zero
    "share_2^-32_to_2^-30": 0.04,  # blog post, Figure 2 caption: 4% of values between 2^-32 and 2^-30
    "paper_zeros": 0.67,  # paper, Figure 3 caption: 67% of values are zero
    "paper_share_2^-34_to_2^-32": 0.02,  # paper, Figure 3 caption: 2% of values in [2^-34, 2^-32)
    "sufficient_scale": 8,  # paper §3.2: scaling by 8 was enough to match FP32 accuracy
    "irrelevant_below": 2.0**-27,  # paper §3.2: values below 2^-27 were irrelevant to training
    "lost_after_2^15": 0.001,  # NVIDIA guide: multiplying by 2^15 recovers all but 0.1% of lost values
    "guide_lost": 0.31,  # NVIDIA guide: "When converted to FP16, 31% of these values become zeros"
    "guide_sufficient_scale": 8,  # NVIDIA guide: "shifting by 3 exponent values (multiply by 8) was sufficient"
}


@dataclass
class Config(ExperimentConfig):
    """The detector, its training and what is recorded: phases, per-module histograms, evaluations, the size
    sweep (each field's comment says what it is; :data:`PROFILES` holds each profile's values)."""

    steps: int = 2000  # optimizer steps
    batch_size: int = 32
    n_train: int = 4000  # generated training images (cycled through in shuffled epochs)
    n_test: int = 500
    image_size: int = 64
    model: str = "small"  # mpt_lab.models.ssd.CONFIGS
    lr: float = 3e-3  # Adam with warm-up and cosine decay (models.ssd.make_optimizer);
    warmup_steps: int = 50  # SSD's SGD at 1e-3 assumed a pretrained VGG and barely trains from scratch
    weight_decay: float = 0.0
    phases: int = 4  # the histogram is also kept per quarter of training
    per_module: bool = False  # also keep one activation histogram per module (slower)
    eval_every: int = 0  # evaluate mAP@0.5 every N steps as well (0: only before and after)
    sweep: tuple = ()  # detectors of the size sweep, "model:pixels" (e.g. "small:128")
    sweep_steps: int = 0  # FP32 steps of each sweep run

    def validate(self) -> None:
        super().validate()
        self.check_positive("steps", "batch_size", "n_test", "image_size", "phases", "warmup_steps")
        self.check_positive("eval_every", "sweep_steps", minimum=0)
        self.check_choices("model", CONFIGS)
        if self.n_train < self.batch_size:
            raise ValueError(f"config.n_train must be ≥ batch_size = {self.batch_size}, got {self.n_train}")
        for s in self.sweep:
            model, _, px = str(s).partition(":")
            if model not in CONFIGS or not px.isdigit():
                raise ValueError(
                    f"config.sweep entries must be 'model:pixels' with a model of {tuple(CONFIGS)}, got {s!r}"
                )
        if self.sweep and not self.sweep_steps:
            raise ValueError("config.sweep_steps must be ≥ 1 when config.sweep is set")


PROFILES = {
    "quick": {
        "steps": 400,
        "n_train": 4000,
        "n_test": 300,
        "threads": 1,
        "sweep": ("small:64", "small:128"),
        "sweep_steps": 20,
    },
    "cpu": {
        "steps": 400,
        "n_train": 6000,
        "n_test": 300,
        "threads": 0,
        "eval_every": 100,
        "sweep": ("small:64", "small:128", "medium:128"),
        "sweep_steps": 30,
    },
    # SSD300's layout and input size on a VGG-16-shaped backbone at an eighth of its width (the widest that trains
    # for 720 steps in 60 minutes on one CPU core: ~4 s per step of 32 images with the histogram recorded)
    "long": {
        "steps": 720,
        "n_train": 3200,
        "n_test": 200,
        "image_size": 300,
        "model": "vgg16_narrow",
        "eval_every": 240,
        "threads": 1,
    },
    # one H100 (mpt_lab.harness.budget): the SSD histogram (the paper's Figure 3) at SSD's natural scale: SSD300 itself (VGG-16 at
    # full width, 300 px, batch 32), which a CPU cannot train; then the size sweep
    "full": {
        "steps": 200,
        "batch_size": 32,
        "n_train": 1600,
        "n_test": 300,
        "model": "vgg16_full",
        "image_size": 300,
        "sweep": ("small:64", "small:128", "medium:128", "large:256"),
        "sweep_steps": 50,
    },
}

#: ``--smoke``: two steps of one image, the evaluations on one image, two steps of each sweep detector.
SMOKE = {"steps": 2, "batch_size": 1, "n_train": 2, "n_test": 1, "sweep_steps": 2}


@dataclass(frozen=True)
class HistogramSummary:
    """The chapter's numbers for one histogram and format (shares of all values, 0 to 1, unless noted).

    "Lost" means what :meth:`Log2Histogram.fractions` calls underflow: non-zero values that round to zero in
    ``fmt`` (for FP16 exactly those with |x| ≤ 2⁻²⁵; values in (2⁻²⁵, 2⁻²⁴) round up to 2⁻²⁴ and are kept).
    """

    fmt: str
    zeros: float  # exactly zero in FP32
    below_smallest_subnormal: float  # non-zero with |x| < fmt's smallest subnormal (2^-24 for FP16)
    lost: float  # non-zero, rounds to zero in fmt (S = 1)
    lost_that_matters: float  # lost and ≥ 2^-27 (the paper: smaller values were irrelevant)
    share_2_32_to_2_30: float  # in [2^-32, 2^-30), the blog post's 4%
    lost_at_8: float  # rounds to zero after × 8
    lost_at_2_15: float  # rounds to zero after × 2^15
    recovered_by_8: float  # of the values lost at S = 1, the share kept at S = 8 (NaN: none lost)
    recovered_by_2_15: float
    max_scale: float  # largest power-of-two S with no overflow (exact, from the histogram)
    max_gradient_rule: float  # max_gradient_scale(amax, fmt): largest power of two S with amax·S ≤ max
    amax: float  # largest |x|
    median_binade: int | None  # k of the binade [2^k, 2^(k+1)) holding the median non-zero value


@dataclass
class SSDHistogramResult(ExperimentResult):
    """``steps``/``losses``: the training loss (SSD eq. 1) per step; ``map50``: [[step, mAP@0.5]] on the test
    split (0 to 1); ``activation``/``weight``: histograms of all activation / weight gradients of the run;
    ``phases``: [{"from", "to", "activation"}] per part of training; ``by_module``: {module: histogram} when
    ``per_module``; ``sweep``: {"model, N px": histogram of activation gradients} of the size sweep;
    ``map_evaluator``: what computed the mAP (:data:`~mpt_lab.models.detection_eval.MAP_EVALUATOR`; a result
    saved without it was made by the old hand-written evaluator, :data:`~mpt_lab.models.detection_eval.
    LEGACY_MAP_EVALUATOR`)."""

    steps: list
    losses: list
    map50: list
    activation: Log2Histogram
    weight: Log2Histogram
    phases: list = field(default_factory=list)
    by_module: dict = field(default_factory=dict)
    sweep: dict = field(default_factory=dict)
    map_evaluator: str = LEGACY_MAP_EVALUATOR

    @property
    def final_map50(self) -> float:
        """mAP@0.5 on the test images after the last step."""
        return float(self.map50[-1][1])

    def summary(self, fmt: FormatLike = "FP16", which: str = "activation") -> HistogramSummary:
        """:class:`HistogramSummary` of the ``which`` ("activation" or "weight") gradients in ``fmt``."""
        if which not in ("activation", "weight"):
            raise ValueError(f"which must be 'activation' or 'weight', got {which!r}")
        return summarize(getattr(self, which), fmt)

    def describe(self) -> str:
        s = self.summary()
        every = (self.activation + self.weight).max_scale("FP16")  # a loss scale multiplies every gradient
        return (
            f"SSD histogram ({self.profile} profile, {self.device}): {self.config['steps']} steps in "
            f"{self.seconds:.0f} s, mAP@0.5 {self.map50[0][1]:.3f} → {self.final_map50:.3f} (by "
            f"{self.map_evaluator}); activation "
            f"gradients: {100 * s.zeros:.1f}% zeros, {100 * s.lost:.2f}% lost in FP16, {100 * s.lost_at_8:.2f}% "
            f"with S = 8; largest S without overflow of any gradient (activation or weight) 2^{_log2(every)}"
        )


def _log2(v: float) -> int | str:
    return math.frexp(v)[1] - 1 if math.isfinite(v) and v > 0 else "∞"


def summarize(h: Log2Histogram, fmt: FormatLike = "FP16") -> HistogramSummary:
    """The :class:`HistogramSummary` of histogram ``h`` for format ``fmt`` (exact shares, no sampling)."""
    fmt = F.get_format(fmt)
    lost = h.fractions(fmt, 1.0)["underflow"]

    def recovered(s):
        return (lost - h.fractions(fmt, s)["underflow"]) / lost if lost else math.nan

    return HistogramSummary(
        fmt=fmt.name,
        zeros=h.fraction_zero(),
        below_smallest_subnormal=h.fraction_below(fmt.smallest_subnormal, include_zeros=False),
        lost=lost,
        lost_that_matters=lost - h.fraction_below(PAPER["irrelevant_below"], include_zeros=False),
        share_2_32_to_2_30=h.fraction_between(2.0**-32, 2.0**-30),
        lost_at_8=h.fractions(fmt, 8.0)["underflow"],
        lost_at_2_15=h.fractions(fmt, 2.0**15)["underflow"],
        recovered_by_8=recovered(8.0),
        recovered_by_2_15=recovered(2.0**15),
        max_scale=h.max_scale(fmt),
        max_gradient_rule=max_gradient_scale(h.amax, fmt) if h.amax > 0 else math.inf,
        amax=h.amax,
        median_binade=h.median_binade(),
    )


def _train(config: Config, run: Run, *, desc: str, evaluate: bool, weights: bool) -> dict:
    """Train one detector in FP32, recording gradient histograms; the measured loop of the experiment."""
    device = run.device
    train = detection_split("train", config.n_train, config.image_size, seed=config.seed)
    test = detection_split("test", config.n_test, config.image_size, seed=config.seed) if evaluate else None
    model = build_ssd(config.model, image_size=config.image_size).to(device)
    loss_fn = MultiBoxLoss(model.priors, num_classes=model.num_classes).to(device)
    opt, sched = make_optimizer(
        model, config.steps, lr=config.lr, warmup_steps=config.warmup_steps, weight_decay=config.weight_decay
    )
    batches = shuffled_batches(len(train), config.batch_size, seed=config.seed)
    map50 = [[0, evaluate_detector(model, test, device=device)]] if evaluate else []
    losses, phases = [], []
    phase_len = max(1, math.ceil(config.steps / max(1, config.phases)))
    recorders = [GradientHistogram(model, "activation", per_module=config.per_module)]
    if weights:
        recorders.append(GradientHistogram(model, "weight"))
    before = Log2Histogram()
    with contextlib.ExitStack() as stack:
        act = stack.enter_context(recorders[0])
        for r in recorders[1:]:
            stack.enter_context(r)
        for step in run.bar(range(1, config.steps + 1), desc=desc):
            images, targets = train.batch(next(batches))
            targets = [{k: v.to(device) for k, v in t.items()} for t in targets]
            losses.append(train_step(model, loss_fn, opt, images, targets))
            sched.step()
            if step % phase_len == 0 or step == config.steps:
                now = act.histogram.copy()
                phases.append({"from": phases[-1]["to"] + 1 if phases else 1, "to": step, "activation": now - before})
                before = now
            if evaluate and config.eval_every and step % config.eval_every == 0 and step != config.steps:
                map50.append([step, evaluate_detector(model, test, device=device)])
    if evaluate:
        map50.append([config.steps, evaluate_detector(model, test, device=device)])
    return {
        "steps": list(range(1, config.steps + 1)),
        "losses": losses,
        "map50": map50,
        "activation": act.histogram.copy(),
        "weight": recorders[-1].histogram.copy() if weights else None,
        "phases": phases,
        "by_module": {k: v.copy() for k, v in act.by_module.items()},
    }


def measure(config: Config, run: Run) -> dict:
    """Train the detector in FP32 recording its gradient histograms, then the short runs of the size sweep."""
    out = _train(config, run, desc="SSD (FP32)", evaluate=True, weights=True)
    run.arm_done("main", out)  # kept the moment it finishes (a deadline keeps it)
    out["map_evaluator"] = MAP_EVALUATOR
    out["sweep"] = {}
    for entry in config.sweep:
        model, _, px = entry.partition(":")
        cfg = replace(
            config,
            steps=config.sweep_steps,
            model=model,
            image_size=int(px),
            phases=1,
            per_module=False,
            warmup_steps=max(1, config.sweep_steps // 5),
            n_train=max(config.sweep_steps * config.batch_size // 2, config.batch_size),
        )
        r = _train(cfg, run, desc=f"sweep {model}, {px} px", evaluate=False, weights=False)
        out["sweep"][f"{model}, {px} px"] = r["activation"]
        run.arm_done(f"sweep {model}, {px} px", r["activation"])
    return out


EXPERIMENT = Experiment(NAME, Config, PROFILES, measure, SSDHistogramResult, __doc__, smoke=SMOKE)
run, config_for, main = EXPERIMENT.run, EXPERIMENT.config_for, EXPERIMENT.main

if __name__ == "__main__":
    run_main(EXPERIMENT)
