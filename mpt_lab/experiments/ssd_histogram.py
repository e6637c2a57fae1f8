"""The paper's Figure 2: activation gradients of an SSD detector trained in FP32, by magnitude.

Micikevicius et al. (ICLR 2018, §3.2) recorded the activation gradients of Multibox SSD while it trained in
FP32: 66.8% of the values were zero and most of the rest lay below FP16's smallest subnormal 2⁻²⁴, so a plain
cast to FP16 flushes them to zero; multiplying the loss by S = 8 was enough to train in mixed precision.
This experiment trains the SSD-style detector of :mod:`mpt_lab.models.ssd` on :class:`mpt_lab.data.DigitsDetection`
in FP32 and records, over the whole run, the log2 histogram of the gradients with respect to every module's
output (activation gradients) and with respect to every parameter (weight gradients).

    python -m mpt_lab.experiments.ssd_histogram --profile full --out book/results/ssd_histogram_full.json

``run(config) -> SSDHistogramResult``; the result saves to and loads from JSON with its provenance.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field

import torch
from tqdm.auto import tqdm

from .. import formats as F
from ..data import NUM_CLASSES, DigitsDetection
from ..device import provenance
from ..histogram import GradientHistogram, Log2Histogram
from ..models import MultiBoxLoss, build_ssd, make_optimizer, mean_average_precision, train_step
from ._common import JsonResult, main as _main, prepare

__all__ = ["Config", "SSDHistogramResult", "config_for", "run", "size_sweep", "sweep_for", "comparison_table", "PAPER", "NAME"]

NAME = "ssd_histogram"

#: What the paper and NVIDIA's guide report for Multibox SSD (cited, not computed): Micikevicius et al. 2018,
#: §3.2 and Figure 2; NVIDIA, "Training with Mixed Precision" user guide.
PAPER = {
    "zeros": 0.668,                       # Figure 2 caption: 66.8% of values were zero
    "between_2^-32_and_2^-30": 0.04,      # Figure 2 caption: 4% of values in [2^-32, 2^-30)
    "sufficient_scale": 8,                # §3.2: scaling by 8 was enough to match FP32 accuracy
    "irrelevant_below": 2.0 ** -27,       # §3.2: values below 2^-27 were irrelevant to training
    "scale_2^15_lost_share": 0.001,       # NVIDIA guide: multiplying by 2^15 recovers all but 0.1% of lost values
}


@dataclass
class Config:
    """Size and settings of one run (see :func:`config_for` for the profiles)."""

    profile: str = "cpu"
    steps: int = 2000                 # optimizer steps
    batch_size: int = 32
    n_train: int = 4000               # generated training images (cycled through in shuffled epochs)
    n_test: int = 500
    image_size: int = 64
    model: str = "small"              # mpt_lab.models.ssd.CONFIGS
    lr: float = 3e-3                  # Adam with 50 warm-up steps and cosine decay (models.ssd.make_optimizer);
    warmup_steps: int = 50            # SSD's SGD at 1e-3 assumed a pretrained VGG and barely trains from scratch
    weight_decay: float = 0.0
    phases: int = 4                   # the histogram is also kept per quarter of training
    per_module: bool = False          # also keep one activation histogram per module (slower)
    seed: int = 0
    device: str = "auto"              # "auto": CUDA when present
    threads: int = 0                  # torch CPU threads (0: leave torch's default)
    eval_every: int = 0               # evaluate mAP@0.5 every N steps as well (0: only before and after)


def config_for(profile: str) -> Config:
    """The configuration of a profile: "quick" (CI, ≤ 1 minute on 2 CPU cores), "cpu" (≤ 4 minutes),
    "full" (a GPU, ≤ 8 minutes on one H100).  Raises ValueError for other names."""
    if profile == "quick":
        return Config(profile="quick", steps=400, n_train=4000, n_test=300, threads=1)
    if profile == "cpu":
        return Config(profile="cpu", steps=2400, n_train=10000, n_test=500, threads=1, eval_every=600)
    if profile == "full":
        return Config(profile="full", steps=10000, batch_size=64, n_train=20000, n_test=2000, model="large",
                      eval_every=2000)
    raise ValueError(f"profile must be one of 'quick', 'cpu', 'full', got {profile!r}")


@dataclass
class SSDHistogramResult(JsonResult):
    """What one run measured.  Histograms are :class:`~mpt_lab.histogram.Log2Histogram` (exact counts)."""

    config: dict
    provenance: dict
    steps: list                     # step numbers at which the training loss was recorded
    losses: list                    # training loss (SSD eq. 1) at those steps
    map50: list                     # [(step, mAP@0.5 on the test split)], before and after training
    activation: Log2Histogram       # gradients w.r.t. every module output, all steps
    weight: Log2Histogram           # gradients w.r.t. every parameter, all steps
    phases: list = field(default_factory=list)        # [{"from": s0, "to": s1, "activation": Log2Histogram}]
    by_module: dict = field(default_factory=dict)     # {module name: Log2Histogram} when per_module
    train_seconds: float = 0.0

    # --- what the chapter reports ------------------------------------------------------------------------
    @property
    def final_map50(self) -> float:
        return float(self.map50[-1][1])

    def summary(self, fmt="FP16") -> dict:
        """The numbers of the chapter's table, for the activation gradients (shares of all values)."""
        fmt = F.get_format(fmt)
        h = self.activation
        sub = fmt.smallest_subnormal
        lost1 = h.fractions(fmt, 1.0)["underflow"]

        def recovered(s):
            lost = h.fractions(fmt, s)["underflow"]
            return (lost1 - lost) / lost1 if lost1 else float("nan")

        rule = 2.0 ** math.floor(math.log2(fmt.max / h.amax)) if h.amax > 0 else math.inf
        return {
            "zeros": h.fraction_zero(),
            "nonzero below smallest subnormal": h.fraction_below(sub, include_zeros=False),
            "in [2^-27, 2^-24)": h.fraction_between(2.0 ** -27, 2.0 ** -24),
            "in [2^-32, 2^-30)": h.fraction_between(2.0 ** -32, 2.0 ** -30),
            "underflow at S=1": lost1,
            "underflow at S=8": h.fractions(fmt, 8.0)["underflow"],
            "underflow at S=2^15": h.fractions(fmt, 2.0 ** 15)["underflow"],
            "recovered by S=8": recovered(8.0),
            "recovered by S=2^15": recovered(2.0 ** 15),
            "largest S without overflow": h.max_scale(fmt),
            "max-gradient rule S": rule,
            "amax": h.amax,
        }

    def describe(self) -> str:
        s = self.summary()
        return (f"SSD histogram ({self.config['profile']} profile, {self.provenance['device']}): "
                f"{self.config['steps']} steps in {self.train_seconds:.0f} s, mAP@0.5 {self.map50[0][1]:.3f} → "
                f"{self.final_map50:.3f}; activation gradients: {100 * s['zeros']:.1f}% zeros, "
                f"{100 * s['underflow at S=1']:.1f}% flushed to zero in FP16, "
                f"{100 * s['underflow at S=8']:.1f}% with S = 8; largest S without overflow "
                f"2^{int(math.log2(s['largest S without overflow']))}")

    # --- persistence ---------------------------------------------------------------------------------------
    NAME = NAME

    def to_dict(self) -> dict:
        d = super().to_dict()
        d["activation"] = self.activation.to_dict()
        d["weight"] = self.weight.to_dict()
        d["phases"] = [{**p, "activation": p["activation"].to_dict()} for p in self.phases]
        d["by_module"] = {k: v.to_dict() for k, v in self.by_module.items()}
        return d

    @classmethod
    def _from_fields(cls, d: dict) -> "SSDHistogramResult":
        return cls(config=d["config"], provenance=d["provenance"], steps=list(d["steps"]),
                   losses=[float(x) for x in d["losses"]], map50=[tuple(x) for x in d["map50"]],
                   activation=Log2Histogram.from_dict(d["activation"]),
                   weight=Log2Histogram.from_dict(d["weight"]),
                   phases=[{**p, "activation": Log2Histogram.from_dict(p["activation"])} for p in d["phases"]],
                   by_module={k: Log2Histogram.from_dict(v) for k, v in d.get("by_module", {}).items()},
                   train_seconds=float(d["train_seconds"]))


def _pct(v) -> str:
    return "–" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{100 * v:.3g}%"


def _pow2(v) -> str:
    return "–" if v is None or not math.isfinite(v) else f"2^{int(math.log2(v))}"


def comparison_table(results: dict, fmt="FP16"):
    """The chapter's table: the paper's numbers beside each result's (activation gradients, ``fmt``).

    Parameters
    ----------
    results : dict label → SSDHistogramResult (e.g. {"this CPU, quick profile": r, "H100, full profile": g})

    Returns
    -------
    mpt_lab.widgets.HTML (a table; the device and profile of each column are in its header).
    """
    from ..widgets import table_html

    if not isinstance(results, dict) or not all(isinstance(r, SSDHistogramResult) for r in results.values()):
        raise TypeError("results must be a dict of label → SSDHistogramResult")
    sums = {k: r.summary(fmt) for k, r in results.items()}
    rows_spec = [
        ("share of zeros", _pct(PAPER["zeros"]), "zeros", _pct),
        ("non-zero, below FP16's smallest subnormal 2^-24", "most of the non-zero values",
         "nonzero below smallest subnormal", _pct),
        ("in [2^-27, 2^-24): lost in FP16, needed for training", "important to preserve", "in [2^-27, 2^-24)", _pct),
        ("in [2^-32, 2^-30)", _pct(PAPER["between_2^-32_and_2^-30"]), "in [2^-32, 2^-30)", _pct),
        ("flushed to zero in FP16 without scaling (S = 1)", "–", "underflow at S=1", _pct),
        ("flushed to zero with S = 8", "S = 8 was enough to train", "underflow at S=8", _pct),
        ("of the values lost at S = 1, recovered by S = 8", "–", "recovered by S=8", _pct),
        ("of the values lost at S = 1, recovered by S = 2^15", f"all but {_pct(PAPER['scale_2^15_lost_share'])}",
         "recovered by S=2^15", _pct),
        ("largest power-of-two S with no overflow", "–", "largest S without overflow", _pow2),
        ("max-gradient rule: S = 2^⌊log2(65504 / amax)⌋", "–", "max-gradient rule S", _pow2),
    ]
    header = ["activation gradients", "paper (Multibox SSD, VGG-16, 300×300)"] + [
        f"{k} ({r.provenance['device'].split(' (')[0]}, {r.config['profile']} profile)" for k, r in results.items()]
    rows = [[label, paper] + [fn(sums[k][key]) for k in results] for label, paper, key, fn in rows_spec]
    return table_html(header, rows)


def _evaluate(model, data: DigitsDetection, batch_size: int, device) -> float:
    dets, gts = [], []
    for i in range(0, len(data), batch_size):
        images, targets = data.batch(range(i, min(i + batch_size, len(data))))
        out = model.predict(images.to(device))
        dets += [{k: v.cpu() for k, v in d.items()} for d in out]
        gts += targets
    return float(mean_average_precision(dets, gts, 0.5, num_classes=NUM_CLASSES)["mAP"])


def run(config: Config | None = None, *, command: str | None = None, progress: bool = True) -> SSDHistogramResult:
    """Train the detector in FP32 and record activation and weight gradient histograms over training.

    Parameters
    ----------
    config : Config, default ``config_for(mpt_lab.profile())``
    command : the command line to record in the provenance (the CLI passes its own)
    progress : show a tqdm progress bar

    Returns
    -------
    SSDHistogramResult

    Raises
    ------
    TypeError
        ``config`` is not a :class:`Config`.
    """
    config, device = prepare(config, Config, config_for)
    train = DigitsDetection("train", config.n_train, config.image_size, seed=config.seed)
    test = DigitsDetection("test", config.n_test, config.image_size, seed=config.seed)
    model = build_ssd(config.model, image_size=config.image_size).to(device)
    loss_fn = MultiBoxLoss(model.priors, num_classes=model.num_classes).to(device)
    opt, sched = make_optimizer(model, config.steps, lr=config.lr, warmup_steps=config.warmup_steps,
                                weight_decay=config.weight_decay)
    gen = torch.Generator().manual_seed(config.seed)
    map50 = [(0, _evaluate(model, test, 100, device))]
    steps, losses, phases = [], [], []
    phase_len = max(1, math.ceil(config.steps / max(1, config.phases)))
    weight_hist = GradientHistogram(model, "weight")
    act_hist = GradientHistogram(model, "activation", per_module=config.per_module)
    order = torch.randperm(len(train), generator=gen)
    pos = 0
    t0 = time.perf_counter()
    phase_start, phase_acc = 0, None
    with weight_hist, act_hist:
        for step in tqdm(range(1, config.steps + 1), desc="SSD (FP32)", disable=not progress, mininterval=1.0):
            if pos + config.batch_size > len(order):
                order, pos = torch.randperm(len(train), generator=gen), 0
            images, targets = train.batch(order[pos:pos + config.batch_size])
            pos += config.batch_size
            targets = [{k: v.to(device) for k, v in t.items()} for t in targets]
            loss = train_step(model, loss_fn, opt, images, targets)
            sched.step()
            steps.append(step)
            losses.append(loss)
            if step % phase_len == 0 or step == config.steps:
                snap = act_hist.histogram.copy()
                part = snap if phase_acc is None else _difference(snap, phase_acc)
                phases.append({"from": phase_start + 1, "to": step, "activation": part})
                phase_acc, phase_start = snap, step
            if config.eval_every and step % config.eval_every == 0 and step != config.steps:
                map50.append((step, _evaluate(model, test, 100, device)))
    if device.type == "cuda":
        torch.cuda.synchronize()
    train_seconds = time.perf_counter() - t0
    map50.append((config.steps, _evaluate(model, test, 100, device)))
    cfg = asdict(config)
    prov = provenance(command=command or f"python -m mpt_lab.experiments.{NAME} --profile {config.profile}",
                      config=cfg, device=device)
    return SSDHistogramResult(config=cfg, provenance=prov, steps=steps, losses=losses, map50=map50,
                              activation=act_hist.histogram.copy(), weight=weight_hist.histogram.copy(),
                              phases=phases, by_module={k: v.copy() for k, v in act_hist.by_module.items()},
                              train_seconds=train_seconds)


def _difference(a: Log2Histogram, b: Log2Histogram) -> Log2Histogram:
    """Counts of ``a`` minus those of ``b`` (b recorded earlier in the same run); amax is a's."""
    return Log2Histogram(a._fine - b._fine.to(a._fine.device), a._amax.clone())


def size_sweep(sizes=(("small", 64), ("small", 128)), steps: int = 40, *, batch_size: int = 32, seed: int = 0,
               threads: int = 1, progress: bool = True) -> dict:
    """Activation-gradient histograms of short FP32 runs of detectors of several sizes.

    Shows how the histogram moves with the size of the network and of its images (the paper's SSD read
    300 × 300 images through VGG-16; ours reads 64 × 64 through a few convolutions).

    Parameters
    ----------
    sizes : sequence of (model config name, image size in pixels)
    steps : training steps per run (Adam with warm-up, as :func:`run`)

    Returns
    -------
    dict label → Log2Histogram of all activation gradients of that run, label like "small, 128 px".
    """
    out = {}
    for model, image_size in sizes:
        cfg = Config(profile="sweep", steps=steps, batch_size=batch_size, n_train=max(steps * batch_size // 2, 64),
                     n_test=8, image_size=image_size, model=model, warmup_steps=max(1, steps // 5), phases=1,
                     seed=seed, threads=threads)
        out[f"{model}, {image_size} px"] = run(cfg, progress=progress).activation
    return out


def sweep_for(profile: str) -> dict:
    """Arguments of :func:`size_sweep` for a profile (quick: 2 sizes × 20 steps; cpu: 3 × 60; full: 4 × 300)."""
    if profile == "quick":
        return {"sizes": (("small", 64), ("small", 128)), "steps": 20}
    if profile == "cpu":
        return {"sizes": (("small", 64), ("small", 128), ("medium", 128)), "steps": 60}
    if profile == "full":
        return {"sizes": (("small", 64), ("small", 128), ("medium", 128), ("large", 256)), "steps": 300,
                "threads": 0}
    raise ValueError(f"profile must be one of 'quick', 'cpu', 'full', got {profile!r}")


def main(argv=None) -> int:
    return _main(__doc__.splitlines()[0], run, config_for, argv)


if __name__ == "__main__":
    raise SystemExit(main())
