"""What sets the scale of a language model's activation gradients: its vocabulary V and its tokens per batch N.

Micikevicius et al. (ICLR 2018): bigLSTM (Jozefowicz et al. 2016) trained in FP16 without loss scaling diverges
after a while.  Almost all activation-gradient values of a language model with a full softmax are the softmax
gradients of the mean cross-entropy, (p − y)/N per logit, and a word's probability p is of the order of 1/V, so
most values are near 1/(V·N): the larger the vocabulary and the batch, the further the histogram sits below
FP16's smallest subnormal 2⁻²⁴.  (bigLSTM itself used TensorFlow's sampled softmax with its log-Q correction and
divided its loss by 128 sequences: :func:`mpt_lab.experiments.biglstm.sampled_softmax_gradients` simulates its
first step, whose median logit gradient lies about two binades below our untrained models'.)  Chapter 8's small
runs reach the paper's failure only after every gradient is shifted down by 2⁻ᵏ (``grad_shift``,
:mod:`mpt_lab.training`); this experiment measures that a shift k is the same kind of change as a
2ᵏ times larger batch or vocabulary.

For each point of a grid of vocabularies (``vocabs``: the ``max_vocab`` of :func:`~mpt_lab.data.text.kjv_corpus`,
0 for every word) and batch sizes (``batch_sizes`` × ``bptt`` tokens), the LSTM language model of
:mod:`mpt_lab.models.lstm` trains briefly in FP32 with Adagrad, as in :mod:`~mpt_lab.experiments.biglstm`, and
:class:`~mpt_lab.histogram.GradientHistogram` records every module's output gradient: at the first step
("init", where p ≈ 1/V for every word) and over the last ``record_steps`` steps ("trained").  For each point the
result gives the median binade (:meth:`~mpt_lab.histogram.Log2Histogram.median_binade`) and the share FP16
loses (non-zero values that round to zero, |x| ≤ 2⁻²⁵); :meth:`LMGradientScaleResult.comparisons` puts a point
shifted by k beside the measured point with 2ᵏ times the vocabulary or the batch, and
:meth:`LMGradientScaleResult.fit` regresses the median on log₂ V and log₂ N.  With ``shift_check = k > 0`` the
first point is trained again with the loss × 2⁻ᵏ: in FP32 its histogram is the first one moved by exactly k
binades (Adagrad cancels the shift bit for bit), which is what makes the shift a faithful stand-in.

    python -m mpt_lab.experiments.lm_gradient_scale --profile cpu
"""

from __future__ import annotations

import itertools
import math
import warnings
from dataclasses import dataclass, field

import numpy as np
import torch

from ..data.text import kjv_corpus, lm_windows
from ..harness.runner import Experiment, ExperimentConfig, ExperimentResult, Run, run_main
from ..histogram import GradientHistogram, Log2Histogram, lost_mass, lost_share
from ..models.lstm import CONFIGS, build_lstm_lm
from ..training import RecipeRun, lm_optimizer, lm_step

__all__ = ["Config", "LMGradientScaleResult", "PROFILES", "config_for", "run", "main", "NAME", "median_log2"]

NAME = "lm_gradient_scale"


@dataclass
class Config(ExperimentConfig):
    """The grid of vocabularies and batch sizes, the model and its FP32 training (each field's comment says what
    it is; :data:`PROFILES` holds each profile's values)."""

    model: str = "tiny"  # mpt_lab.models.lstm.CONFIGS
    vocabs: tuple = (1024, 4096)  # max_vocab of each grid point (0: every word of the training split)
    batch_sizes: tuple = (16, 64)  # sequences per batch of each grid point
    bptt: int = 16  # time steps per window: N = batch_size × bptt tokens per batch
    steps: int = 60  # FP32 Adagrad steps per grid point
    record_steps: int = 10  # the "trained" histogram: the last record_steps steps
    lr: float = 0.2  # Adagrad, as bigLSTM and the biglstm experiment
    adagrad_init: float = 0.1
    shift_check: int = 3  # train the first point again with the loss × 2^-k (0: don't)

    def validate(self) -> None:
        super().validate()
        self.check_choices("model", CONFIGS)
        self.check_positive("bptt", "steps", "record_steps")
        self.check_positive("shift_check", minimum=0)
        for name, lo in (("vocabs", 0), ("batch_sizes", 1)):
            v = getattr(self, name)
            if not (
                isinstance(v, (tuple, list))
                and v
                and all(isinstance(x, int) and not isinstance(x, bool) and x >= lo for x in v)
            ):
                raise ValueError(f"config.{name} must be a non-empty sequence of ints ≥ {lo}, got {v!r}")
            if len(set(v)) != len(v):
                raise ValueError(f"config.{name} must not repeat a value, got {v!r}")
        if any(0 < v < 3 for v in self.vocabs):
            raise ValueError(f"config.vocabs: a max_vocab must be 0 (every word) or ≥ 3, got {self.vocabs!r}")
        if self.record_steps >= self.steps:
            raise ValueError(
                f"config.record_steps must be smaller than config.steps ({self.steps}), got {self.record_steps!r}"
            )
        if not (isinstance(self.lr, (int, float)) and self.lr > 0):
            raise ValueError(f"config.lr must be a positive float, got {self.lr!r}")


PROFILES = {
    "quick": {"vocabs": (512, 2048), "batch_sizes": (8, 32), "bptt": 16, "steps": 30, "record_steps": 10, "threads": 1},
    "cpu": {"vocabs": (1024, 4096), "batch_sizes": (16, 64), "bptt": 16, "steps": 60, "record_steps": 15, "threads": 0},
    "long": {
        "vocabs": (1024, 2048, 4096, 8192, 0),
        "batch_sizes": (16, 64, 256),
        "bptt": 16,
        "steps": 200,
        "record_steps": 50,
        "threads": 1,
    },
    # one H100 (mpt_lab.harness.budget): vocabularies 2^3 and batches 2^6 apart, up to 2^14 tokens per batch
    "full": {"vocabs": (1024, 8192), "batch_sizes": (16, 1024), "bptt": 16, "steps": 100, "record_steps": 25},
}

#: ``--smoke``: two steps per point, batches 16 times smaller (the full grid's largest logits, 16,384 tokens ×
#: 8,192 words, take 0.5 GB in FP32).
SMOKE = {"steps": 2, "record_steps": 1, "batch_sizes": (1, 64)}


def median_log2(h: Log2Histogram) -> float | None:
    """log₂ of the median magnitude of the non-zero finite values of ``h``, interpolated within its binade
    (values taken as spread evenly in log₂ across a binade); None when there is none.  ``floor`` of it is
    :meth:`~mpt_lab.histogram.Log2Histogram.median_binade`."""
    counts = h.counts
    cum = np.cumsum(counts)
    if cum[-1] == 0:
        return None
    half = cum[-1] / 2
    i = int(np.searchsorted(cum, half))
    below = cum[i - 1] if i else 0
    return float(h.exponents[i] + min((half - below) / counts[i], 1.0 - 1e-9))


@dataclass
class LMGradientScaleResult(ExperimentResult):
    """``points``: one per (vocabulary, batch size) of the grid, in the order of ``config["vocabs"]`` ×
    ``config["batch_sizes"]``: {"max_vocab", "vocab_size" V, "batch_size", "tokens" N (batch × bptt),
    "log2_vn" log₂(V·N), "init" (histogram of the first step), "trained" (histogram of the last
    ``record_steps`` steps), "loss_init", "loss_trained" (nats per token, mean over those steps), "seconds"};
    ``shift_check``: {} or {"k", "vocab_size", "tokens", "init", "trained" (histograms of the first point trained
    with the loss × 2⁻ᵏ), "exact" (both are the unshifted ones moved by exactly k binades),
    "same_losses" (the losses are identical)}."""

    points: list = field(default_factory=list)
    shift_check: dict = field(default_factory=dict)

    def _check(self, which: str) -> None:
        if which not in ("init", "trained"):
            raise ValueError(f"which must be 'init' or 'trained', got {which!r}")

    def summary(self, which: str = "trained") -> list:
        """Per point: {"vocab_size", "tokens", "log2_vn", "median_binade", "median_log2", "lost" (share of the
        values FP16 rounds to zero), "lost_mass" (share of the sum of |g| it rounds to zero,
        :func:`~mpt_lab.histogram.lost_mass`), "zero", "loss"} of the ``which`` histogram ("init" or
        "trained")."""
        self._check(which)
        return [
            {
                "vocab_size": p["vocab_size"],
                "tokens": p["tokens"],
                "log2_vn": p["log2_vn"],
                "median_binade": p[which].median_binade(),
                "median_log2": median_log2(p[which]),
                "lost": lost_share(p[which]),
                "lost_mass": lost_mass(p[which]),
                "zero": float(p[which].fraction_zero()),
                "loss": p["loss_" + which],
            }
            for p in self.points
        ]

    def comparisons(self, which: str = "trained") -> list:
        """Every pair of points whose vocabularies (at the same N) or batches (at the same V) differ by a
        factor 2ᵏ, k ≥ 1: the smaller point's histogram shifted down by k binades beside the larger one measured.

        Returns a list of dicts: "axis" ("V" or "N"), "k", "base" and "target" (V, N) pairs, "shifted_median"
        and "measured_median" (interpolated log₂ of the median, :func:`median_log2`), "shifted_lost" and
        "measured_lost" (shares of the values FP16 rounds to zero, :func:`~mpt_lab.histogram.lost_share`), "shifted_lost_mass" and
        "measured_lost_mass" (shares of the sum of |g|, :func:`~mpt_lab.histogram.lost_mass`).
        """
        self._check(which)
        out = []
        for a, b in itertools.permutations(self.points, 2):
            for axis, key, other in (("V", "vocab_size", "tokens"), ("N", "tokens", "vocab_size")):
                ratio = b[key] / a[key]
                k = round(math.log2(ratio)) if ratio > 1 else 0
                if a[other] != b[other] or k < 1 or 2**k != ratio:
                    continue
                ha, hb = a[which], b[which]
                out.append(
                    {
                        "axis": axis,
                        "k": k,
                        "base": (a["vocab_size"], a["tokens"]),
                        "target": (b["vocab_size"], b["tokens"]),
                        "shifted_median": median_log2(ha) - k,
                        "measured_median": median_log2(hb),
                        "shifted_lost": lost_share(ha, k),
                        "measured_lost": lost_share(hb),
                        "shifted_lost_mass": lost_mass(ha, k),
                        "measured_lost_mass": lost_mass(hb),
                    }
                )
        return out

    def fit(self, which: str = "trained") -> dict:
        """Least squares median_log2 ≈ c + a·log₂ V + b·log₂ N over the points (:func:`median_log2`).

        Returns {"a", "b", "c", "slope_vn" (one slope against log₂(V·N)), "rms" (binades)}; a law 1/(V·N) gives
        a = b = −1.  Raises ValueError with fewer than three points or without two vocabularies and two batches.
        """
        self._check(which)
        rows = [(math.log2(p["vocab_size"]), math.log2(p["tokens"]), median_log2(p[which])) for p in self.points]
        rows = [r for r in rows if r[2] is not None]
        if len(rows) < 3 or len({r[0] for r in rows}) < 2 or len({r[1] for r in rows}) < 2:
            raise ValueError("fit needs at least three points with two vocabularies and two batch sizes")
        x = np.array([[1.0, v, n] for v, n, _ in rows])
        y = np.array([m for _, _, m in rows])
        (c, a, b), *_ = np.linalg.lstsq(x, y, rcond=None)
        vn = x[:, 1] + x[:, 2]
        slope = float(np.polyfit(vn, y, 1)[0])
        rms = float(np.sqrt(np.mean((x @ np.array([c, a, b]) - y) ** 2)))
        return {"a": float(a), "b": float(b), "c": float(c), "slope_vn": slope, "rms": rms}

    def describe(self) -> str:
        s = self.summary()
        lo, hi = min(s, key=lambda r: r["log2_vn"]), max(s, key=lambda r: r["log2_vn"])
        text = (
            f"lm_gradient_scale ({self.profile} profile, {len(s)} points, {self.device}): median activation "
            f"gradient 2^{lo['median_log2']:.1f} at V·N = 2^{lo['log2_vn']:.1f} … 2^{hi['median_log2']:.1f} at "
            f"2^{hi['log2_vn']:.1f}; lost in FP16 {100 * lo['lost']:.1f}% … {100 * hi['lost']:.1f}%"
        )
        if len(s) >= 3:
            try:
                f = self.fit()
                text += f"; fit: {f['a']:+.2f}·log2 V {f['b']:+.2f}·log2 N"
            except ValueError:
                pass
        if self.shift_check:
            text += f"; shift {self.shift_check['k']} exact in FP32: {self.shift_check['exact']}"
        return text


def shifted_exactly(h: Log2Histogram, shifted: Log2Histogram, k: int) -> bool:
    """Whether ``shifted`` is ``h`` with every value moved down by exactly k binades (same zeros, same
    fine counts k binades lower)."""
    a, b = h.fine, shifted.fine
    if h.zeros != shifted.zeros or h.nonfinite != shifted.nonfinite or a.sum() != b.sum():
        return False
    return bool(np.array_equal(a[k:], b[: len(b) - k]) and not a[:k].any())


def _train_point(config: Config, max_vocab: int, batch_size: int, run: Run, grad_shift: int = 0) -> dict:
    """Train the model for one grid point in FP32 and record its activation-gradient histograms."""
    corpus = kjv_corpus(max_vocab=max_vocab or None)
    torch.manual_seed(config.seed)
    model = build_lstm_lm(config.model, corpus.vocab_size).to(run.device)
    opt = lm_optimizer(model, config.lr, config.adagrad_init, grad_shift)
    arm = RecipeRun("fp32", run.device, grad_shift=grad_shift)
    windows = lm_windows(corpus.train, batch_size, config.bptt)
    first_recorded = config.steps - config.record_steps + 1
    hists, losses, state = {}, {"init": [], "trained": []}, None
    t0 = run.elapsed()
    gh = GradientHistogram(model, "activation")
    with gh, warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="LSTM with projections is not supported with oneDNN")
        for step in run.bar(
            range(1, config.steps + 1), desc=f"V = {corpus.vocab_size}, N = {batch_size * config.bptt}", leave=False
        ):
            which = "init" if step == 1 else ("trained" if step >= first_recorded else None)
            (gh.resume if which else gh.pause)()
            x, y, fresh = next(windows)
            loss, _, state = lm_step(model, arm, opt, x.to(run.device), y.to(run.device), None if fresh else state)
            if which:
                losses[which].append(loss)
            if step == 1:
                hists["init"] = gh.histogram
                gh.reset()
        hists["trained"] = gh.histogram
    tokens = batch_size * config.bptt
    return {
        "max_vocab": max_vocab,
        "vocab_size": corpus.vocab_size,
        "batch_size": batch_size,
        "tokens": tokens,
        "log2_vn": math.log2(corpus.vocab_size * tokens),
        **hists,
        "loss_init": losses["init"][0],
        "loss_trained": sum(losses["trained"]) / len(losses["trained"]),
        "seconds": run.elapsed() - t0,
    }


def measure(config: Config, run: Run) -> dict:
    """Train the grid's points in FP32 (then the first again with the shift check) and keep their histograms."""
    points = []
    for v, b in itertools.product(config.vocabs, config.batch_sizes):  # each point kept the moment it finishes
        points.append(_train_point(config, v, b, run))
        run.arm_done(f"V {v}, batch {b}", points[-1])
    check = {}
    if config.shift_check:
        k, first = config.shift_check, points[0]
        d = _train_point(config, first["max_vocab"], first["batch_size"], run, grad_shift=k)
        run.arm_done(f"shift check, k {k}", d)
        check = {
            "k": k,
            "vocab_size": d["vocab_size"],
            "tokens": d["tokens"],
            "init": d["init"],
            "trained": d["trained"],
            "exact": shifted_exactly(first["init"], d["init"], k)
            and shifted_exactly(first["trained"], d["trained"], k),
            "same_losses": d["loss_init"] == first["loss_init"] and d["loss_trained"] == first["loss_trained"],
        }
    return {"points": points, "shift_check": check}


EXPERIMENT = Experiment(NAME, Config, PROFILES, measure, LMGradientScaleResult, __doc__, smoke=SMOKE)
run, config_for, main = EXPERIMENT.run, EXPERIMENT.config_for, EXPERIMENT.main

if __name__ == "__main__":
    run_main(EXPERIMENT)
