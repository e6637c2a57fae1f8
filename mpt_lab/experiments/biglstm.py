"""bigLSTM's result in the paper: a bigLSTM-shaped language model trained in FP32 and in FP16 mixed precision
without and with loss scaling.

Micikevicius et al. (ICLR 2018): bigLSTM (Jozefowicz et al. 2016) trained on the One Billion Word benchmark with
Adagrad; mixed precision *without* loss scaling diverges after a while, with a loss scale of 128 it matches FP32
(NVIDIA's blog post on the paper, Micikevicius et al. 2017, draws the training-loss curves as its Figure 1).
Here the same model, data order and seed (:mod:`mpt_lab.models.lstm`, word-level, on the King James Bible of
:mod:`mpt_lab.data.text`) are trained in each recipe of :data:`mpt_lab.recipes.LOSS_SCALING` (FP32; mixed
FP16 without scaling; with the static scale ``static_scale``; with the dynamic :class:`~mpt_lab.scaling.GradScaler`):
real FP16 autocast on CUDA, the :mod:`mpt_lab.simulate` emulation on a CPU.  The run records, over training: the
training loss of every step (nats per token), the validation perplexity, the loss scale, and from histograms of
the activation gradients (:class:`~mpt_lab.histogram.GradientHistogram`) the share of values that are zero in
the run's own arithmetic and the share that FP16 would flush to zero (non-zero values with |x| ≤ 2⁻²⁵ after
scaling).

How far below ours were bigLSTM's gradients?  Most activation-gradient values of a language model are the softmax
gradients (p − y)/D per logit, p a word's probability and D the divisor of the loss.  Our models take a full
softmax over their V words (p ~ 1/V untrained) and the mean over the N tokens of a batch (D = N).  bigLSTM did
neither (:data:`BIGLSTM`, from Jozefowicz et al.'s released code): it called TensorFlow's
``tf.nn.sampled_softmax_loss`` with its defaults, which samples 8,192 of its 793,471 words per step from a
log-uniform law and subtracts the log of each word's expected count Q from its logit (``subtract_log_q=True``), so
that the sampled softmax estimates the full one: an untrained model gives a sampled word p = (1/Q)/Z with Z ≈ V;
and its loss is the mean over the 128 sequences of a batch of the sum over 20 time steps (D = 128, not 2,560).
:func:`sampled_softmax_gradients` simulates its first step: the median sampled-logit gradient lies near 2⁻²², two
binades below our untrained models' 1/(V·N) (:func:`equivalent_shift` gives 2 for the quick and cpu profiles), and
about a fifth of them, the frequent words' 1/(V·128) ≈ 2⁻²⁶·⁶, round to zero in FP16.  (An estimate with p ~ 1/8,193
for every sampled word, which ignores the log-Q correction, put the median at 2⁻²⁰, where ours are.)

``grad_shift = k`` (see :mod:`mpt_lab.training`) multiplies the loss by 2⁻ᵏ and Adagrad's eps
and initial accumulator by 2⁻ᵏ and 4⁻ᵏ: the FP32 run is bit-identical for every k, while the FP16 runs see
gradients k binades smaller.  A shift k and a batch 2ᵏ times larger give the same histogram, value for value (the
mean over N tokens divides every logit gradient by N; :mod:`~mpt_lab.experiments.lm_gradient_scale` measures it,
and that 2ᵏ times the vocabulary moves the median by about k binades too).  The default ``grad_shift = 11`` is
large enough for FP16 without loss scaling to fall behind plainly within the quick and cpu profiles' 120 steps;
``sweep_shifts`` reruns FP16 without loss scaling at smaller shifts, so the chapter can show how the run falls
behind as k grows (the cpu profile at every k from 6 to 11, the quick profile at 0, 6 and 11 only).
``grad_shift = -1`` ("auto") uses :func:`equivalent_shift`, 2 for the quick and cpu profiles.

Without a shift (the "long" profile): what decides whether FP16 without scaling fails is not how many values it
loses (nine in ten at k = 6 in the cpu profile, without harm) but how much of the update: a word's
gradient p/N is lost when p < N · 2⁻²⁵, so the lost share of the gradient *mass* (:func:`lost_mass`) grows with N,
and hardly with V (the unlikely words of a larger vocabulary carry little probability).  The long profile trains
4096 × 16 = 2¹⁶ tokens per batch with k = 0, on a vocabulary of 2048 words and the "lean" model so that a step of
all four arms stays near 20 CPU seconds::

    python -m mpt_lab.experiments.biglstm --profile long --out book/results/biglstm_long.json
    python -m mpt_lab.experiments.biglstm --profile full --out book/results/biglstm_full.json
"""

from __future__ import annotations

import functools
import math
import time
import warnings
from dataclasses import dataclass, field, replace

import numpy as np
import torch
import torch.nn.functional as F

from .. import formats
from ..data.text import batchify, bptt_batches, kjv_corpus, lm_windows
from ..device import DeviceLike
from ..harness.runner import Experiment, ExperimentConfig, ExperimentResult, Run, run_main
from ..histogram import GradientHistogram, gradient_shares, lost_mass
from ..models.lstm import CONFIGS, build_lstm_lm
from ..recipes import LOSS_SCALING, OLD_LOSS_SCALING_NAMES, renamed
from ..training import RecipeRun, collect_arms, lm_optimizer, lm_step

__all__ = [
    "Config",
    "BigLSTMResult",
    "PROFILES",
    "PAPER",
    "BIGLSTM",
    "config_for",
    "run",
    "main",
    "equivalent_shift",
    "sampled_softmax_gradients",
    "log_uniform_probability",
    "perplexity",
    "NAME",
]

NAME = "biglstm"

#: What the paper reports (Micikevicius et al. 2018), cited, not computed.
PAPER = {
    "model": "bigLSTM (Jozefowicz et al. 2016): 2 LSTM layers of 8192 cells projected to 1024, 793k-word vocabulary, "
    "sampled softmax, Adagrad; One Billion Word benchmark",
    "loss_scale": 128,
    "finding": "FP16 mixed precision without loss scaling diverges after a while; with loss scale 128 the training "
    "loss matches the FP32 baseline",
}


#: bigLSTM as Jozefowicz et al. (2016) trained it: the One Billion Word vocabulary of 793,471 words; from
#: their released code (github.com/rafaljozefowicz/lm, ``language_model.py``, also in the fork
#: github.com/okuchaiev/f-lm): ``num_sampled = 8192`` words per step for ``tf.nn.sampled_softmax_loss`` with its
#: defaults (a softmax over the correct word and 8,192 sampled ones, ``softmax_classes``, each logit lowered by
#: log Q: :func:`sampled_softmax_gradients`), ``batch_size = 128`` sequences unrolled over ``num_steps = 20`` time
#: steps, and the loss ``reduce_mean(per-token loss) * num_steps``: the mean over the 128 sequences of the sum over
#: the 20 steps, so each logit gradient is divided by ``loss_divisor`` = 128, not by the 2,560 tokens.
BIGLSTM = {
    "vocab_size": 793471,
    "sampled_classes": 8192,
    "softmax_classes": 8192 + 1,
    "sequences": 128,
    "bptt": 20,
    "tokens_per_batch": 128 * 20,
    "loss_divisor": 128,
}


def log_uniform_probability(ids: int | np.ndarray, range_max: int) -> np.ndarray:
    """The base distribution of TensorFlow's ``log_uniform_candidate_sampler`` (the default sampler of
    ``tf.nn.sampled_softmax_loss``): P(k) = (log(k + 2) − log(k + 1)) / log(range_max + 1) for the ids
    k = 0 … range_max − 1, a Zipf-like law for a vocabulary sorted by decreasing frequency (TensorFlow's API
    documentation of ``tf.random.log_uniform_candidate_sampler``).

    ``ids``: int or array of ints in [0, range_max); returns float64 of the same shape.  Raises ValueError for
    ``range_max`` < 1 or ids outside the range.
    """
    if not isinstance(range_max, int) or range_max < 1:
        raise ValueError(f"range_max must be an int ≥ 1, got {range_max!r}")
    k = np.asarray(ids, dtype=np.float64)
    if k.size and (k.min() < 0 or k.max() >= range_max):
        raise ValueError(f"ids must lie in [0, {range_max}), got values from {k.min():g} to {k.max():g}")
    return (np.log(k + 2.0) - np.log(k + 1.0)) / math.log(range_max + 1.0)


def sampled_softmax_gradients(
    *,
    vocab_size: int = BIGLSTM["vocab_size"],
    num_sampled: int = BIGLSTM["sampled_classes"],
    loss_divisor: int = BIGLSTM["loss_divisor"],
    steps: int = 8,
    tokens: int = 64,
    seed: int = 0,
) -> dict:
    """bigLSTM's logit gradients at initialisation, simulated as TensorFlow's ``tf.nn.sampled_softmax_loss``
    computes them with the defaults that Jozefowicz et al.'s code uses (:data:`BIGLSTM`).

    Per training step the default sampler, ``log_uniform_candidate_sampler(unique=True, range_max=vocab_size)``,
    draws ids k = ⌊exp(u · log(vocab_size + 1))⌋ − 1 (u uniform in [0, 1), as TensorFlow's ``LogUniformSampler``)
    until ``num_sampled`` distinct words are drawn, after ``tries`` draws; each word's expected count is
    Q = 1 − (1 − P(k))^tries (TensorFlow's ``ExpectedCountHelper``, :func:`log_uniform_probability`).  One sample
    serves the whole batch.  For each of ``tokens`` correct words (drawn from the same Zipf-like law: the
    sampler assumes the words follow it), ``_compute_sampled_logits`` with ``subtract_log_q=True`` and
    ``remove_accidental_hits=True`` gives the logits [z_true − log Q_true, z_j − log Q_j …], a sampled word equal
    to the correct one pushed to −FLOAT_MAX; a softmax cross-entropy over these 1 + ``num_sampled`` logits
    follows.  The gradient of the loss with respect to a sampled logit is p_j / ``loss_divisor`` (the loss is
    the mean over 128 sequences of the sum over their time steps).  The model is untrained: every model logit
    z is equal, so p_j = (1/Q_j) / Z with Z = 1/Q_true + Σ 1/Q_j over the sample (the log-Q correction makes
    the sampled softmax estimate the full one: E[Σ 1/Q_j] ≈ ``vocab_size``).

    Returns
    -------
    dict with "gradients" (float64 array of |∂loss/∂logit| of every (token, sampled word) pair, accidental hits
    left out, ``steps · tokens · num_sampled`` values less the hits), "median_log2" (log₂ of their median),
    "lost" (the share FP16 rounds to zero: |g| ≤ 2⁻²⁵, by :func:`mpt_lab.formats.round_to`), "lost_128" (the
    same after a loss scale of 128), "lost_mass" (the share of their sum Σ|g| that FP16 rounds to zero),
    "smallest_log2", "largest_log2", "normaliser" (the mean of Z / ``vocab_size``), "tries" (mean draws per
    step), "frequent_log2" (log₂ 1/(vocab_size · loss_divisor): a word with Q ≈ 1 and Z ≈ vocab_size), and
    "config".  Deterministic for a given ``seed``.

    Raises ValueError for sizes < 1 or ``num_sampled`` ≥ ``vocab_size``.

    Sources: TensorFlow's API documentation of ``tf.nn.sampled_softmax_loss`` and
    ``tf.random.log_uniform_candidate_sampler``, and its ``nn_impl.py`` (``_compute_sampled_logits``) and
    ``range_sampler.cc``; Jozefowicz et al.'s ``language_model.py`` (github.com/rafaljozefowicz/lm).
    """
    for name, v in (
        ("vocab_size", vocab_size),
        ("num_sampled", num_sampled),
        ("loss_divisor", loss_divisor),
        ("steps", steps),
        ("tokens", tokens),
    ):
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise ValueError(f"{name} must be an int ≥ 1, got {v!r}")
    if num_sampled >= vocab_size:
        raise ValueError(f"num_sampled must be < vocab_size, got {num_sampled} ≥ {vocab_size}")
    rng = np.random.default_rng(seed)
    log_range = math.log(vocab_size + 1.0)

    def draw(n):
        return (np.floor(np.exp(rng.random(n) * log_range)).astype(np.int64) - 1) % vocab_size

    grads, normalisers, tries_all = [], [], []
    for _ in range(steps):
        vals = draw(2 * num_sampled)
        while True:  # unique=True: draw until num_sampled distinct words
            uniq, first = np.unique(vals, return_index=True)
            if len(uniq) >= num_sampled:
                break
            vals = np.concatenate([vals, draw(num_sampled)])
        order = np.sort(first)[:num_sampled]  # the first num_sampled distinct words, in draw order
        sampled, tries = vals[order], int(order[-1]) + 1
        q_s = -np.expm1(tries * np.log1p(-log_uniform_probability(sampled, vocab_size)))
        true = draw(tokens)
        q_t = -np.expm1(tries * np.log1p(-log_uniform_probability(true, vocab_size)))
        inv = 1.0 / q_s  # exp(−log Q_j): the sampled logits after the log-Q correction
        hit = true[:, None] == sampled[None, :]  # accidental hits: their logits go to −FLOAT_MAX, p = 0
        z = 1.0 / q_t + inv.sum() - (hit * inv).sum(axis=1)
        p = inv[None, :] / z[:, None]
        grads.append((p / loss_divisor)[~hit])
        normalisers.append(z / vocab_size)
        tries_all.append(tries)
    g = np.concatenate(grads)
    zero = formats.round_to(g, formats.FP16) == 0
    zero_128 = formats.round_to(128.0 * g, formats.FP16) == 0
    return {
        "gradients": g,
        "median_log2": float(np.log2(np.median(g))),
        "lost": float(zero.mean()),
        "lost_128": float(zero_128.mean()),
        "lost_mass": float(g[zero].sum() / g.sum()),
        "smallest_log2": float(np.log2(g.min())),
        "largest_log2": float(np.log2(g.max())),
        "normaliser": float(np.concatenate(normalisers).mean()),
        "tries": float(np.mean(tries_all)),
        "frequent_log2": -math.log2(vocab_size * loss_divisor),
        "config": {
            "vocab_size": vocab_size,
            "num_sampled": num_sampled,
            "loss_divisor": loss_divisor,
            "steps": steps,
            "tokens": tokens,
            "seed": seed,
        },
    }


@functools.lru_cache(maxsize=1)
def _biglstm_median_log2() -> float:
    return sampled_softmax_gradients()["median_log2"]


def equivalent_shift(vocab_size: int, tokens_per_batch: int) -> int:
    """round(log₂(1/(vocab_size · tokens_per_batch)) − m), at least 0, with m the log₂ of the median of bigLSTM's
    sampled-logit gradients at initialisation (:func:`sampled_softmax_gradients`, its defaults: TensorFlow's
    sampled softmax with the log-Q correction, 8,192 words sampled from bigLSTM's 793,471, the loss divided by
    128): how many binades that median sat below the wrong-word logit gradients 1/(V·N) of an untrained model
    with a full softmax over ``vocab_size`` words and the mean over ``tokens_per_batch`` tokens.

    It is 2 for the quick and cpu profiles' V = 4,000 words and N = 256 tokens.  Raises ValueError for
    non-positive sizes.
    """
    if vocab_size < 1 or tokens_per_batch < 1:
        raise ValueError(f"vocab_size and tokens_per_batch must be ≥ 1, got {vocab_size}, {tokens_per_batch}")
    return max(0, round(-math.log2(vocab_size * tokens_per_batch) - _biglstm_median_log2()))


@dataclass
class Config(ExperimentConfig):
    """The bigLSTM-shaped language model, its data, optimizer and loss scales, and the recipes to train (one arm each)
    (each field's comment says what it is; :data:`PROFILES` holds each profile's values)."""

    model: str = "tiny"  # mpt_lab.models.lstm.CONFIGS
    max_vocab: int = 0  # 0: every word of the training split
    batch_size: int = 20
    bptt: int = 20  # time steps per window (truncated backpropagation through time)
    steps: int = 1200  # optimizer steps (windows); the stream restarts when it runs out
    lr: float = 0.2  # Adagrad, as bigLSTM (Jozefowicz et al. 2016: learning rate 0.2)
    adagrad_init: float = 0.1  # Adagrad's initial accumulator (TensorFlow's default, × 4^-grad_shift)
    static_scale: float = 128.0  # the paper's S for bigLSTM
    init_scale: float = 2.0**16  # GradScaler (torch's defaults)
    growth_interval: int = 2000
    grad_shift: int = 11  # loss × 2^-grad_shift (FP32 unchanged); -1: equivalent_shift (auto)
    recipes: tuple = LOSS_SCALING  # mpt_lab.recipes.LOSS_SCALING to run, one arm each
    eval_every: int = 200  # validation perplexity and histogram shares every N steps
    hist_every: int = 1  # record gradient histograms on every N-th step
    valid_tokens: int = 20000  # validation tokens evaluated (0: all)
    sweep_shifts: tuple = ()  # gradient shifts k of the sweep (FP16 without scaling at each k)

    def validate(self) -> None:
        super().validate()
        self.check_choices("model", CONFIGS)
        self.check_positive("batch_size", "bptt", "steps", "eval_every", "hist_every", "growth_interval")
        self.check_positive("max_vocab", "valid_tokens", minimum=0)
        self.check_choices("recipes", LOSS_SCALING, subset=True)
        if not isinstance(self.grad_shift, int) or self.grad_shift < -1:
            raise ValueError(f"config.grad_shift must be -1 (auto) or an int ≥ 0, got {self.grad_shift!r}")
        if any(not isinstance(k, int) or k < 0 for k in self.sweep_shifts):
            raise ValueError(f"config.sweep_shifts must be ints ≥ 0, got {self.sweep_shifts!r}")
        if not self.static_scale > 0:
            raise ValueError(f"config.static_scale must be > 0, got {self.static_scale!r}")


PROFILES = {
    # the default shift of 11 binades: the failure is plain within the 120 steps a CPU affords (the sweep shows
    # smaller shifts)
    "quick": {
        "max_vocab": 4000,
        "batch_size": 16,
        "bptt": 16,
        "steps": 120,
        "recipes": ("fp32", "fp16_unscaled", "fp16_static"),
        "eval_every": 30,
        "hist_every": 4,
        "valid_tokens": 4000,
        "threads": 1,
        "sweep_shifts": (0, 6),
    },
    # cpu: every shift from 6 to 11 (11 is the main FP16 run's), to show how the run falls behind between them; the
    # dynamic-scaling arm is left to the long and full profiles to keep chapter 8 within its 240 s
    "cpu": {
        "max_vocab": 4000,
        "batch_size": 16,
        "bptt": 16,
        "steps": 120,
        "recipes": ("fp32", "fp16_unscaled", "fp16_static"),
        "growth_interval": 40,
        "eval_every": 40,
        "hist_every": 4,
        "valid_tokens": 6000,
        "threads": 0,
        "sweep_shifts": (0, 6, 7, 8, 9, 10),
    },
    # bigLSTM's result with no shift at all: 4096 × 16 = 65,536 tokens per batch, 2^8 times the cpu profile's, so the
    # softmax gradients p/N of words with p < 2^-9 fall below FP16's 2^-25 by themselves; the vocabulary (2048
    # words) and the "lean" model keep a step cheap (≈ 20 CPU seconds for the four arms, 150 steps ≤ 60 minutes)
    "long": {
        "model": "lean",
        "max_vocab": 2048,
        "batch_size": 4096,
        "bptt": 16,
        "steps": 150,
        "grad_shift": 0,
        "growth_interval": 50,
        "eval_every": 25,
        "hist_every": 25,
        "valid_tokens": 0,
        "threads": 1,
    },
    # one H100 (mpt_lab.harness.budget): the blog post's Figure 1 without a shift and with real FP16 autocast: 2048 × 32 = 65,536
    # tokens per batch as the long profile (where FP16 without loss scaling falls behind by itself), 8,192 words
    # (the logits of 65,536 tokens over all 12,548 words would move 50 % more bytes), the "small" model (two LSTM
    # layers of 512 cells)
    "full": {
        "model": "small",
        "max_vocab": 8192,
        "batch_size": 2048,
        "bptt": 32,
        "steps": 100,
        "grad_shift": 0,
        "growth_interval": 100,
        "eval_every": 50,
        "hist_every": 10,
        "valid_tokens": 0,
    },
}

#: ``--smoke``: two steps per arm and one evaluation on 2,000 validation tokens; 16 sequences per batch (the full
#: batch's logits, 65,536 tokens × 8,192 words, take 2 GB in FP32: too much for a CPU test).
SMOKE = {"steps": 2, "eval_every": 2, "hist_every": 1, "batch_size": 16, "valid_tokens": 2000}


@dataclass
class BigLSTMResult(ExperimentResult):
    """``vocab_size``, ``train_tokens``: of the corpus; ``arms``: per recipe of ``config["recipes"]`` that ran, ``losses``
    [steps] training loss in nats per token, ``scales`` [steps] the loss scale used at each step, ``skipped``
    steps the scaler skipped, ``cpu_seconds`` the CPU time of this process while the arm trained (with
    ``threads=1``, about the wall time the arm takes on an idle core, however busy the machine was), ``evals``
    per evaluation {step, valid_ppl, zero_share (share of activation-gradient values exactly zero in the run's
    own arithmetic since the previous evaluation), fp16_underflow (share FP16 flushes to zero, of the values as
    the run computed them: for FP32 what FP16 *would* lose), nonfinite, median_log2, fp16_lost_mass (the share
    of the sum of |gradient| that FP16 flushes, :func:`mpt_lab.histogram.lost_mass`)}; ``labels``: legend label per arm; ``real_fp16``: autocast on CUDA (else :mod:`mpt_lab.simulate`);
    ``train_seconds``: per arm; ``grad_shift``: the shift k the arms ran with (``config["grad_shift"]`` is -1 when
    it was chosen automatically); ``sweep``: {"fp32": final loss, "fp16_unscaled": {k: final loss}, "zero_share": {k: share},
    "equivalent_shift": k, "steps": steps} for ``sweep_shifts`` and the arms' own shift (FP32 is bit-identical
    for every k)."""

    vocab_size: int
    train_tokens: int
    grad_shift: int = 0
    arms: dict = field(default_factory=dict)
    labels: dict = field(default_factory=dict)
    real_fp16: bool = False
    train_seconds: dict = field(default_factory=dict)
    sweep: dict = field(default_factory=dict)

    RENAMED_CONFIG = {"arms": "recipes"}

    @classmethod
    def upgrade(cls, d: dict) -> dict:
        """A result saved before the one recipe registry: ``config["arms"]`` becomes ``config["recipes"]``, and
        its recipe names (in the config, ``arms``, ``labels``, ``train_seconds`` and ``sweep``) the registry's
        (:data:`mpt_lab.recipes.OLD_LOSS_SCALING_NAMES`: "fp16" → "fp16_unscaled", "fp16_dynamic" → "fp16")."""
        if "arms" in d.get("config", {}):
            names = OLD_LOSS_SCALING_NAMES
            d = cls.with_config(d, lambda c: {**c, "arms": renamed(c["arms"], names)} if "arms" in c else c)
            d.update({k: renamed(d[k], names) for k in ("arms", "labels", "train_seconds", "sweep") if k in d})
        return super().upgrade(d)

    def final(self, arm: str, what: str = "loss", last: int = 50) -> float:
        """Mean training loss of the last ``last`` steps (``what="loss"``) or the last validation perplexity
        (``what="ppl"``) of ``arm``; NaN when the run diverged to non-finite values."""
        if arm not in self.arms:
            raise ValueError(f"arm must be one of {tuple(self.arms)}, got {arm!r}")
        if what == "ppl":
            return float(self.arms[arm]["evals"][-1]["valid_ppl"])
        if what != "loss":
            raise ValueError(f"what must be 'loss' or 'ppl', got {what!r}")
        return _tail_mean(self.arms[arm]["losses"], last)

    def describe(self) -> str:
        parts = [f"{a}: loss {self.final(a):.3f}, ppl {self.final(a, 'ppl'):.1f}" for a in self.arms]
        return (
            f"biglstm ({self.profile} profile, grad_shift {self.grad_shift}, "
            f"{'real' if self.real_fp16 else 'simulated'} FP16, {self.device}): " + "; ".join(parts)
        )


def _tail_mean(values, last: int) -> float:
    tail = [float(v) for v in values[-last:]]
    return sum(tail) / len(tail) if tail else float("nan")


@torch.no_grad()
def perplexity(model: torch.nn.Module, streams: torch.Tensor, bptt: int, device: DeviceLike) -> float:
    """exp(mean cross-entropy) of ``model`` (in FP32) over :func:`batchify`'d ``streams``; inf if non-finite."""
    model.eval()
    total, count, state = 0.0, 0, None
    for x, y in bptt_batches(streams, bptt):
        x, y = x.to(device), y.to(device)
        logits, state = model(x, state)
        total += float(F.cross_entropy(logits.reshape(-1, model.vocab_size).float(), y.reshape(-1), reduction="sum"))
        count += y.numel()
    model.train()
    mean = total / max(count, 1)
    return math.exp(mean) if math.isfinite(mean) and mean < 700 else float("inf")


def _train_arm(arm_name: str, config: Config, corpus, init_state: dict, run: Run) -> dict:
    """Train one arm from ``init_state``: the measured loop of the experiment."""
    device = run.device
    torch.manual_seed(config.seed + 1)  # dropout (none by default) and anything random: the same in every arm
    model = build_lstm_lm(config.model, corpus.vocab_size).to(device)
    model.load_state_dict(init_state)
    opt = lm_optimizer(model, config.lr, config.adagrad_init, config.grad_shift)
    arm = RecipeRun(
        arm_name,
        device,
        static_scale=config.static_scale,
        init_scale=config.init_scale,
        growth_interval=config.growth_interval,
        grad_shift=config.grad_shift,
    )
    windows = lm_windows(corpus.train, config.batch_size, config.bptt)
    valid = corpus.valid[: config.valid_tokens] if config.valid_tokens else corpus.valid
    valid = batchify(valid, min(config.batch_size, 10))
    state = None
    losses, scales, skipped, evals = [], [], [], []
    gh = GradientHistogram(model, "activation")
    t0, cpu0 = run.elapsed(), time.process_time()
    with gh, warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="LSTM with projections is not supported with oneDNN")
        for step in run.bar(range(1, config.steps + 1), desc=arm.label()):
            x, y, fresh = next(windows)
            (gh.resume if (step - 1) % config.hist_every == 0 else gh.pause)()
            scales.append(arm.get_scale())
            loss, skip, state = lm_step(model, arm, opt, x.to(device), y.to(device), None if fresh else state)
            losses.append(loss)
            if skip:
                skipped.append(step)
            if step % config.eval_every == 0 or step == config.steps:
                evals.append(
                    {
                        "step": step,
                        "valid_ppl": perplexity(model, valid, config.bptt, device),
                        **gradient_shares(gh.histogram),
                        "fp16_lost_mass": lost_mass(gh.histogram),
                    }
                )
                gh.reset()
    return {
        "losses": losses,
        "scales": scales,
        "skipped": skipped,
        "evals": evals,
        "label": arm.label(),
        "real_fp16": arm.real_fp16,
        "seconds": run.elapsed() - t0,
        "cpu_seconds": time.process_time() - cpu0,
    }


def measure(config: Config, run: Run) -> dict:
    """Train the language model once per arm from the same initial weights and data order, then the FP16 run
    without loss scaling once per shift of ``sweep_shifts``."""
    corpus = kjv_corpus(max_vocab=config.max_vocab or None)
    k_auto = equivalent_shift(corpus.vocab_size, config.batch_size * config.bptt)
    if config.grad_shift == -1:
        config = replace(config, grad_shift=k_auto)
    torch.manual_seed(config.seed)
    init_state = {k: v.clone() for k, v in build_lstm_lm(config.model, corpus.vocab_size).state_dict().items()}
    out = {}
    for a in config.recipes:  # each arm is kept the moment it finishes (a deadline keeps them)
        out[a] = _train_arm(a, config, corpus, init_state, run)
        run.arm_done(a, out[a])
    sweep = {}
    if config.sweep_shifts:
        fp32 = out.get("fp32") or _train_arm("fp32", replace(config, grad_shift=0), corpus, init_state, run)
        if "fp32" not in out:
            run.arm_done("sweep fp32", fp32)
        sweep = {
            "fp32": _tail_mean(fp32["losses"], 50),
            "fp16_unscaled": {},
            "zero_share": {},
            "steps": config.steps,
            "equivalent_shift": k_auto,
        }
        shifts = set(config.sweep_shifts) | ({config.grad_shift} if "fp16_unscaled" in out else set())
        for k in sorted(shifts):  # the main FP16 run joins the sweep at its own shift, at no cost
            if k == config.grad_shift and "fp16_unscaled" in out:
                d = out["fp16_unscaled"]
            else:
                d = _train_arm("fp16_unscaled", replace(config, grad_shift=k), corpus, init_state, run)
                run.arm_done(f"sweep fp16_unscaled, shift {k}", d)
            sweep["fp16_unscaled"][k] = _tail_mean(d["losses"], 50)
            sweep["zero_share"][k] = d["evals"][-1]["zero_share"]
    return {
        "vocab_size": corpus.vocab_size,
        "train_tokens": len(corpus.train),
        "sweep": sweep,
        "grad_shift": config.grad_shift,
        **collect_arms(out),
    }


EXPERIMENT = Experiment(NAME, Config, PROFILES, measure, BigLSTMResult, __doc__, smoke=SMOKE)
run, config_for, main = EXPERIMENT.run, EXPERIMENT.config_for, EXPERIMENT.main

if __name__ == "__main__":
    run_main(EXPERIMENT)
