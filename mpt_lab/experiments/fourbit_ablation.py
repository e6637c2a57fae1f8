"""Four bits: NVIDIA's NVFP4 training recipe taken apart, ingredient by ingredient, on a small language model.

NVIDIA's recipe for pretraining in NVFP4 ("Pretraining Large Language Models with NVFP4", arXiv:2509.25149, §4)
has four ingredients beside the format: a few linear layers kept in BF16 (mostly the last ones), a 16-point
random Hadamard transform on the inputs of the weight-gradient GEMM, 16 × 16 (2D) block scaling of the weights,
and stochastic rounding of the gradients.  This experiment trains one small decoder-only language model
(:class:`mpt_lab.models.CharTransformerLM` on :func:`mpt_lab.data.kjv_characters`) in each **arm** of
:data:`ARMS`, from the same initial weights and on the same batches for a seed, over ``seeds`` seeds:

==========================  ============================================================================
arm                         the Linear layers of the transformer blocks
==========================  ============================================================================
``bf16``                    BF16 operands in every GEMM (the reference; the output layer too)
``fp8``                     FP8 with per-tensor current scaling (E4M3 forward, E5M2 gradients: chapter 11)
``mxfp4``                   MXFP4 (blocks of 32, E8M0 scales) with the recipe's ingredients, as in the NVFP4
                            paper's own MXFP4 comparison (§5): a 32-point random Hadamard transform on the
                            weight-gradient GEMM and stochastic rounding of the gradients; the same BF16 layers
                            as NVFP4; unlike the paper's, 1D weights
``nvfp4``                   NVFP4 with the full recipe (:func:`mpt_lab.quantized_training.four_bit_recipe`)
``nvfp4_no_rht``            the recipe without the Hadamard transform
``nvfp4_1d_weights``        the recipe with 1 × 16 weight blocks instead of 16 × 16 tiles
``nvfp4_rtn_gradients``     the recipe with gradients rounded to nearest instead of stochastically
``nvfp4_no_bf16_layers``    the recipe on every block's Linear layers, none kept in BF16
``nvfp4_plain``             NVFP4 with none of the four ingredients (chapter 11's NVFP4)
==========================  ============================================================================

In every arm the output layer (``head``) computes in BF16, as the paper keeps "the output projection head" (and
embeddings, normalisation, attention's batched products) in its original precision; the layers the recipe keeps
in BF16 are ``bf16_layers`` (block index, negative from the end, and layer name), the same for every four-bit arm
that keeps any.  Everything else (LayerNorm, attention scores, softmax, residual additions, the loss, Adam on
FP32 master weights) is FP32.  Measured per arm and seed: the training loss of every step and the validation
loss (in the arm's own forward arithmetic) at ``evals`` points; the chapter reports the final validation loss as
its gap to BF16's in per cent, ``100 · (L_arm − L_bf16) / L_bf16``, seed by seed (the BF16 run with the same seed), and
its spread over the seeds.

And what each ingredient fixes, measured on the tensors of the trained BF16 model (the first seed) and one
training batch, in FP32:

* ``sr_bias``: the weight gradient gᵀx with the output gradient g quantised to NVFP4 along the tokens
  (rounded to nearest, and stochastically over ``sr_draws`` draws): the relative error of the mean over K draws
  against K, and the share of g's non-zero values that round to zero;
* ``hadamard``: NVFP4 and MXFP4 block error along the channels of a Gaussian matrix with ``outlier_channels``
  channels scaled by each factor of ``outlier_factors``, with and without the random Hadamard transform;
* ``outliers``: per Linear layer, its input's per-channel amax against the median channel's, and the error of
  FP4 with one scale per tensor, NVFP4 blocks along the channels, and NVFP4 after a Hadamard transform; and of
  the weight-gradient GEMM's two inputs along the tokens, with and without the transform (where the recipe
  applies it);
* ``mismatch``: per weight, how far the 1D-scaled weight the forward pass reads (blocks along K) is from the one
  the backward pass reads (blocks along N), and the same for 2D tiles (zero by construction);
* ``sensitivity``: each Linear layer quantised alone with the full recipe, the others in FP32: the validation
  loss it adds and the relative error of the whole gradient on the batch.

    python -m mpt_lab.experiments.fourbit_ablation --profile long --out book/results/fourbit_ablation_long.json

Sources: NVIDIA, arXiv:2509.25149 (§4, Appendix C–E: the recipe and its ablations); Tseng et al., "Training
LLMs with MXFP4" (arXiv:2502.20586) and Castro et al., "Quartet" (arXiv:2505.14669) (other MXFP4 recipes with
stochastic rounding and Hadamard transforms, not the ``mxfp4`` arm's).
"""

from __future__ import annotations

import copy
import math
import os
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
import torch.nn.functional as Fn
from torch import nn

from ..data.text import kjv_characters
from ..formats import FP4_E2M1
from ..harness.runner import Experiment, ExperimentConfig, ExperimentResult, Run, run_main
from ..microscaling import (
    RandomHadamard,
    ScaledTensor,
    fake_quantize_mx,
    fake_quantize_nvfp4,
    quantize_nvfp4,
    quantize_per_tensor,
    snr_db,
)
from ..models.transformer import CharTransformerLM
from ..quantized_training import TRAINING_RECIPES, Quantizer, QuantLinear, four_bit_recipe, quantize_linears_
from ..recipes import Recipe
from ..training import lr_factor

__all__ = [
    "NAME",
    "Arm",
    "ARMS",
    "ARM_ORDER",
    "Config",
    "PROFILES",
    "SMOKE",
    "FourbitAblationResult",
    "build_arm",
    "sr_bias",
    "hadamard_outlier_error",
    "weight_mismatch",
    "channel_outliers",
    "capture_linears",
    "layer_sensitivity",
    "wgrad_error",
    "sr_residual_bias",
    "run",
    "config_for",
    "main",
    "EXPERIMENT",
]

NAME = "fourbit_ablation"


@dataclass(frozen=True)
class Arm:
    """One arm of the ablation: what the Linear layers of the transformer blocks compute in.

    kind : "bf16" (every Linear, the output layer included), "fp8" (chapter 11's ``fp8_current``) or "four_bit"
        (:func:`mpt_lab.quantized_training.four_bit_recipe` with ``fmt`` and the ingredient flags)
    bf16_layers : whether the configuration's ``bf16_layers`` stay in BF16 (four-bit arms)
    change : what differs from the full NVFP4 recipe, in words
    """

    name: str
    label: str
    change: str
    kind: str = "four_bit"
    fmt: str = "nvfp4"
    hadamard: bool = True
    weights_2d: bool = True
    stochastic_gradients: bool = True
    bf16_layers: bool = True

    def describe(self) -> dict:
        """The arm as a dict for the result's JSON: label, what it changes, kind, and its ingredients."""
        d = {"label": self.label, "change": self.change, "kind": self.kind}
        if self.kind == "four_bit":
            d.update(
                format=self.fmt.upper(),
                hadamard=self.hadamard,
                weights_2d=self.weights_2d,
                stochastic_gradients=self.stochastic_gradients,
                bf16_layers=self.bf16_layers,
            )
        return d


#: The arms, by name (see the module docstring's table).
ARMS: dict[str, Arm] = {
    a.name: a
    for a in (
        Arm("bf16", "BF16", "every GEMM in BF16: the reference", kind="bf16"),
        Arm(
            "fp8", "FP8 (per-tensor current scaling)", "E4M3 forward, E5M2 gradients, one scale per tensor", kind="fp8"
        ),
        Arm(
            "mxfp4",
            "MXFP4 + RHT + SR",
            "MXFP4 (32-value blocks, E8M0 scales), 1D weights",
            fmt="mxfp4",
            weights_2d=False,
        ),
        Arm("nvfp4", "NVFP4 recipe", "the full recipe"),
        Arm(
            "nvfp4_no_rht",
            "NVFP4 recipe, no Hadamard",
            "no random Hadamard transform on the weight-gradient GEMM",
            hadamard=False,
        ),
        Arm(
            "nvfp4_1d_weights",
            "NVFP4 recipe, 1D weights",
            "weights in 1 × 16 blocks instead of 16 × 16 tiles",
            weights_2d=False,
        ),
        Arm(
            "nvfp4_rtn_gradients",
            "NVFP4 recipe, RTN gradients",
            "gradients rounded to nearest, not stochastically",
            stochastic_gradients=False,
        ),
        Arm(
            "nvfp4_no_bf16_layers",
            "NVFP4 recipe, no BF16 layers",
            "every block's Linear layers in NVFP4",
            bf16_layers=False,
        ),
        Arm(
            "nvfp4_plain",
            "NVFP4, no ingredient",
            "none of the four ingredients (chapter 11's NVFP4)",
            hadamard=False,
            weights_2d=False,
            stochastic_gradients=False,
            bf16_layers=False,
        ),
    )
}
#: The arms in the order of the book's tables.
ARM_ORDER = tuple(ARMS)
#: The ablations of the full recipe, one ingredient off each: arm → the ingredient.
ABLATIONS = {
    "nvfp4_no_rht": "random Hadamard transform",
    "nvfp4_1d_weights": "2D weight scaling",
    "nvfp4_rtn_gradients": "stochastic rounding of gradients",
    "nvfp4_no_bf16_layers": "BF16 layers",
}


# ----------------------------------------------------------------------------------------------------------
# configuration
# ----------------------------------------------------------------------------------------------------------
@dataclass
class Config(ExperimentConfig):
    """The ablation's arms and seeds, the character language model's shape, and the training run's length."""

    arms: tuple = ARM_ORDER  # names of ARMS; "bf16" is required (the reference)
    seeds: int = 3  # seeds per arm: config.seed, config.seed + 1, ...
    dim: int = 64  # the language model: width, blocks, heads, context (characters)
    layers: int = 2
    heads: int = 4
    context: int = 64
    batch: int = 8  # sequences per step (batch × context characters)
    steps: int = 120
    lr: float = 3e-3  # Adam, betas (0.9, 0.95); warm-up and cosine decay (lr_factor)
    valid_chars: int = 8192  # validation characters evaluated
    evals: int = 3  # validation evaluations per run (the last after the last step)
    bf16_layers: tuple = ("-1.fc1", "-1.fc2")  # "block.layer": the Linear layers the recipe keeps in BF16
    diag_sequences: int = 8  # sequences of the batch the diagnostics read
    sr_layer: str = "0.fc1"  # "block.layer" (or "head") whose weight gradient sr_bias measures
    sr_draws: int = 64  # stochastic-rounding draws of the sr_bias measurement
    outlier_factors: tuple = (1.0, 3.0, 10.0, 30.0, 100.0)  # hadamard: outlier channels scaled by these
    outlier_channels: int = 4
    outlier_shape: tuple = (512, 256)  # hadamard: rows (tokens) × channels of the Gaussian matrix
    sens_valid_chars: int = 4096  # validation characters of the sensitivity measurement

    def validate(self) -> None:
        super().validate()
        self.check_choices("arms", ARMS, subset=True)
        if "bf16" not in self.arms:
            raise ValueError(f"config.arms must include 'bf16' (the reference of every gap), got {self.arms!r}")
        if len(set(self.arms)) != len(self.arms):
            raise ValueError(f"config.arms must not repeat an arm, got {self.arms!r}")
        self.check_positive(
            "seeds",
            "dim",
            "layers",
            "heads",
            "context",
            "batch",
            "steps",
            "valid_chars",
            "evals",
            "diag_sequences",
            "sr_draws",
            "outlier_channels",
            "sens_valid_chars",
        )
        if self.seed < 0:
            raise ValueError(f"config.seed must be ≥ 0 (it seeds stochastic rounding), got {self.seed!r}")
        if self.dim % self.heads or self.dim % 32:
            raise ValueError(
                f"config.dim must be a multiple of 32 (MXFP4's blocks) and of config.heads, got "
                f"{self.dim} and {self.heads}"
            )
        if self.valid_chars < self.context + 1 or self.sens_valid_chars < self.context + 1:
            raise ValueError(
                "config.valid_chars and config.sens_valid_chars must be ≥ context + 1, got "
                f"{self.valid_chars!r} and {self.sens_valid_chars!r}"
            )
        if not isinstance(self.lr, (int, float)) or isinstance(self.lr, bool) or not 0 < self.lr < math.inf:
            raise ValueError(f"config.lr must be a positive number, got {self.lr!r}")
        for name in ("bf16_layers",):
            v = getattr(self, name)
            if not isinstance(v, (tuple, list)) or not all(isinstance(s, str) for s in v):
                raise ValueError(f"config.{name} must be a tuple of 'block.layer' names, got {v!r}")
            for s in v:
                _layer_name(s, self.layers)
        _layer_name(self.sr_layer, self.layers)
        if not self.outlier_factors or any(
            not isinstance(f, (int, float)) or isinstance(f, bool) or f < 1 for f in self.outlier_factors
        ):
            raise ValueError(f"config.outlier_factors must be numbers ≥ 1, got {self.outlier_factors!r}")
        shape = self.outlier_shape
        if (
            not isinstance(shape, (tuple, list))
            or len(shape) != 2
            or any(not isinstance(n, int) or n < 32 for n in shape)
            or shape[1] % 32
            or not self.outlier_channels < shape[1]
        ):
            raise ValueError(
                "config.outlier_shape must be (rows, channels), ints ≥ 32, channels a multiple of 32 and "
                f"more than outlier_channels; got {shape!r}"
            )


_LINEARS = ("qkv", "proj", "fc1", "fc2")


def _layer_name(spec: str, layers: int) -> str:
    """ "-1.fc2" → "blocks.<layers - 1>.fc2"; "head" → "head".  Raises ValueError for anything else."""
    if spec == "head":
        return spec
    block, _, lin = str(spec).partition(".")
    try:
        b = int(block)
    except ValueError:
        b = None
    if b is None or lin not in _LINEARS or not -layers <= b < layers:
        raise ValueError(
            f"a layer must be 'head' or 'block.layer' with block in [-{layers}, {layers}) and layer one "
            f"of {_LINEARS}, got {spec!r}"
        )
    return f"blocks.{b % layers}.{lin}"


#: Sizes by timing (CPU time of one thread, measured on the shared 2-core Intel Xeon at load average 6 to 8, which
#: inflates it): a step of a four-bit arm costs ≈ 0.07 s at the cpu profile's 512 characters of a 2-block width-64
#: model and ≈ 0.28 s at the long profile's 1,024 characters of a 4-block width-128 model; BF16 and FP8 about half
#: that.  quick: the chapter ≈ 60 s (budget 90 s); cpu: ≈ 150 s of training and diagnostics, the chapter within
#: its 4 minutes (measured with nbconvert: 108 s of CPU, 4.6 minutes of wall time at load average 6 to 9).  long:
#: 8 arms × 3 seeds × 256 steps, ≈ 1,600 s of CPU time extrapolated from a 20-step run of every arm (60 s of CPU),
#: about 3 hours of wall time on the shared machine (one thread getting a fifth of a core at load 8 to 10); measured:
#: 1,837 s of CPU time in its training runs and 6,919 s of wall time at load average 5 to 16 (on two quiet cores, its
#: CPU time, about half an hour).
#: The full profile is the cpu profile: the emulated quantisers launch thousands of operators per step, which a
#: GPU slot cannot afford for 20 runs (mpt_lab.harness.budget: a CPU row).
PROFILES = {
    "quick": {
        "dim": 32,
        "layers": 2,
        "heads": 2,
        "context": 32,
        "batch": 8,
        "steps": 50,
        "seeds": 2,
        "evals": 2,
        "lr": 4e-3,
        "valid_chars": 4096,
        "sr_draws": 16,
        "sens_valid_chars": 2048,
        "diag_sequences": 8,
        "outlier_shape": (256, 128),
        "threads": 1,
    },
    "cpu": {"seeds": 2, "threads": 1},
    "long": {
        "arms": tuple(a for a in ARM_ORDER if a != "nvfp4_plain"),
        "dim": 128,
        "layers": 4,
        "heads": 4,
        "context": 128,
        "batch": 8,
        "steps": 256,
        "seeds": 3,
        "lr": 2e-3,
        "evals": 4,
        "valid_chars": 16384,
        "sr_draws": 256,
        "sens_valid_chars": 8192,
        "diag_sequences": 8,
        "outlier_shape": (1024, 512),
        "threads": 1,
    },
    "full": {"seeds": 2, "threads": 1},
}

#: ``--smoke``: the full (= cpu) profile cut to two steps of one seed, one evaluation, four stochastic-rounding
#: draws and short validation sets.
SMOKE = {
    "steps": 2,
    "seeds": 1,
    "evals": 1,
    "valid_chars": 257,
    "sens_valid_chars": 257,
    "sr_draws": 4,
    "diag_sequences": 2,
}


# ----------------------------------------------------------------------------------------------------------
# the result
# ----------------------------------------------------------------------------------------------------------
def _summary(values: list) -> dict:
    v = [x for x in values if math.isfinite(x)]
    if not v:
        return {"mean": math.nan, "std": math.nan, "min": math.nan, "max": math.nan, "n": 0}
    return {
        "mean": statistics.fmean(v),
        "std": statistics.stdev(v) if len(v) > 1 else 0.0,
        "min": min(v),
        "max": max(v),
        "n": len(v),
    }


@dataclass
class FourbitAblationResult(ExperimentResult):
    """``arms``: name → the arm as data (label, what it changes, kind, format and ingredients, the GEMMs' quantisation,
    the layers in BF16); ``model``: parameters, Linear layers, sizes, tokens per step, the BF16 layers and their
    share; ``runs``: arm → [one record per seed: "seed", "losses" (training loss per step), "evals" [{"step",
    "valid_loss"}], "diverged", "seconds", "cpu_seconds"]; ``diagnostics``: "sr_bias", "hadamard", "outliers",
    "mismatch", "sensitivity" (see the module docstring and each function); ``machine``: the load average at the
    start and the end and the CPU count."""

    arms: dict = field(default_factory=dict)
    model: dict = field(default_factory=dict)
    runs: dict = field(default_factory=dict)
    diagnostics: dict = field(default_factory=dict)
    machine: dict = field(default_factory=dict)

    def _runs(self, arm: str) -> list:
        if arm not in self.runs:
            raise ValueError(f"arm must be one of {tuple(self.runs)}, got {arm!r}")
        return self.runs[arm]

    def label(self, arm: str) -> str:
        """The label an arm is shown with (its name where the result has none)."""
        return self.arms.get(arm, {}).get("label", arm)

    @property
    def seeds(self) -> list:
        """The seeds every arm ran."""
        return [r["seed"] for r in self.runs.get("bf16", [])]

    def finals(self, arm: str) -> list:
        """The last validation loss of the run of each seed (nats per character; NaN where it diverged)."""
        return [float(r["evals"][-1]["valid_loss"]) if r["evals"] else math.nan for r in self._runs(arm)]

    def gaps(self, arm: str, reference: str = "bf16") -> list:
        """Per seed, 100 · (final(arm) − final(reference)) / final(reference): the gap in per cent, each seed against
        the reference run with the same seed."""
        ref = {r["seed"]: f for r, f in zip(self._runs(reference), self.finals(reference))}
        return [100.0 * (f - ref[r["seed"]]) / ref[r["seed"]] for r, f in zip(self._runs(arm), self.finals(arm))]

    def gap(self, arm: str, reference: str = "bf16") -> dict:
        """The gap of :meth:`gaps` over the seeds: {"mean", "std" (sample), "min", "max", "n"} in per cent."""
        return _summary(self.gaps(arm, reference))

    def separated(self, a: str, b: str, reference: str = "bf16") -> bool:
        """Whether arms ``a`` and ``b`` differ by more than the seed spread: the ranges [min, max] of their gaps
        over the seeds do not overlap.  (With three seeds a conservative rule; a difference inside the ranges is
        not called a difference.)"""
        ga, gb = self.gap(a, reference), self.gap(b, reference)
        return ga["max"] < gb["min"] or gb["max"] < ga["min"]

    def gap_curve(self, arm: str, reference: str = "bf16") -> dict:
        """The gap in per cent at every evaluation: {"steps", "mean", "min", "max"} over the seeds."""
        runs, refs = self._runs(arm), {r["seed"]: r for r in self._runs(reference)}
        steps = [e["step"] for e in runs[0]["evals"]]
        per_step = []
        for i, _ in enumerate(steps):
            vals = []
            for r in runs:
                ev, rv = r["evals"], refs[r["seed"]]["evals"]
                if i < len(ev) and i < len(rv):
                    vals.append(100.0 * (ev[i]["valid_loss"] - rv[i]["valid_loss"]) / rv[i]["valid_loss"])
            per_step.append(_summary(vals))
        return {"steps": steps, **{k: [s[k] for s in per_step] for k in ("mean", "min", "max")}}

    def describe(self) -> str:
        parts = []
        for arm in self.runs:
            if arm == "bf16":
                parts.append(f"BF16 {statistics.fmean(self.finals(arm)):.3f} nats")
                continue
            g = self.gap(arm)
            parts.append(f"{self.label(arm)} {g['mean']:+.2f}% [{g['min']:+.2f}, {g['max']:+.2f}]")
        return (
            f"fourbit_ablation ({self.profile} profile, {self.device}, {len(self.seeds)} seeds, "
            f"{self.model.get('parameters', 0):,} parameters): final validation loss against BF16: " + "; ".join(parts)
        )


# ----------------------------------------------------------------------------------------------------------
# the arms
# ----------------------------------------------------------------------------------------------------------
def build_arm(model: nn.Module, arm: Arm, *, bf16_layers: Sequence[str] = ("-1.fc1", "-1.fc2"), seed: int = 0) -> dict:
    """Make ``model`` (a :class:`~mpt_lab.models.CharTransformerLM`, in place) compute in ``arm``.

    The Linear layers of the blocks take the arm's recipe; the output layer ``head`` and, for four-bit arms that
    keep them, the ``bf16_layers`` ("block.layer", the block negative from the end) take BF16
    (:func:`mpt_lab.quantized_training.quantize_linears_` twice).  Stochastic rounding draws from a generator
    seeded with ``seed``, and the Hadamard transform's signs come from ``seed``.

    Returns {"quantizers": [the recipe's Quantizer, BF16's], "recipe": its description, "bf16": the names of
    the layers in BF16, "quantized": the others}.

    Raises TypeError / ValueError for an unknown arm, a model without ``blocks`` and ``head``, or a bad layer name.
    """
    if isinstance(arm, str):
        if arm not in ARMS:
            raise ValueError(f"arm must be one of {ARM_ORDER}, got {arm!r}")
        arm = ARMS[arm]
    if not isinstance(arm, Arm):
        raise TypeError(f"arm must be an Arm or the name of one, got {type(arm).__name__}")
    if not isinstance(model, nn.Module) or not hasattr(model, "blocks") or not hasattr(model, "head"):
        raise TypeError("model must be a CharTransformerLM (with blocks and a head)")
    layers = len(model.blocks)
    linears = [n for n, m in model.named_modules() if isinstance(m, nn.Linear)]
    if arm.kind == "bf16":
        q = quantize_linears_(model, "bf16")
        return {"quantizers": [q], "recipe": TRAINING_RECIPES["bf16"].describe(), "bf16": linears, "quantized": []}
    keep = ["head"]
    if arm.kind == "four_bit" and arm.bf16_layers:
        keep += [_layer_name(s, layers) for s in bf16_layers]
    keep = list(dict.fromkeys(keep))
    if arm.kind == "fp8":
        recipe = TRAINING_RECIPES["fp8_current"]
        q = quantize_linears_(model, recipe, skip=tuple(keep))
    else:
        recipe = four_bit_recipe(
            arm.fmt,
            hadamard=arm.hadamard,
            weights_2d=arm.weights_2d,
            stochastic_gradients=arm.stochastic_gradients,
            hadamard_seed=seed,
        )
        q = quantize_linears_(model, recipe, skip=tuple(keep), seed=seed)
    qb = quantize_linears_(model, "bf16")
    return {
        "quantizers": [q, qb],
        "recipe": recipe.describe(),
        "bf16": keep,
        "quantized": [n for n in linears if n not in keep],
    }


# ----------------------------------------------------------------------------------------------------------
# the data and one training run
# ----------------------------------------------------------------------------------------------------------
class _Text:
    """The King James Bible's characters: training windows and a fixed validation set."""

    def __init__(self, config: Config, device: torch.device):
        train, valid, vocab = kjv_characters()
        self.train, self.vocab, self.device, self.config = train.to(device), vocab, device, config
        self.valid = valid

    def windows(self, chars: int) -> tuple:
        c = self.config.context
        n = (min(chars, len(self.valid) - 1) // c) * c
        return (self.valid[:n].view(-1, c).to(self.device), self.valid[1 : n + 1].view(-1, c).to(self.device))

    def batches(self, generator: torch.Generator, batch: int):
        """Endless (input, target) batches of ``batch`` random windows, the same sequence for every arm."""
        c = self.config.context
        span = len(self.train) - c - 1
        offsets = torch.arange(c + 1)
        while True:
            start = torch.randint(0, span, (batch,), generator=generator)
            w = self.train[(start[:, None] + offsets).to(self.device)]
            yield w[:, :-1], w[:, 1:]


def _loss(model: nn.Module, x, y) -> torch.Tensor:
    out = model(x)
    return Fn.cross_entropy(out.reshape(-1, out.shape[-1]).float(), y.reshape(-1))


@torch.no_grad()
def _evaluate(model: nn.Module, windows: tuple) -> float:
    model.eval()
    vx, vy = windows
    total, count = 0.0, 0
    for i in range(0, len(vx), 64):
        x, y = vx[i : i + 64], vy[i : i + 64]
        total += float(_loss(model, x, y)) * y.numel()
        count += y.numel()
    model.train()
    v = total / count
    return v if math.isfinite(v) else math.nan


def _eval_steps(steps: int, evals: int) -> list:
    return sorted({max(1, round(steps * (i + 1) / evals)) for i in range(evals)})


def _train(text: _Text, init_state: dict, arm: Arm, seed: int, config: Config, run: Run, valid: tuple) -> tuple:
    """Train one arm for one seed from ``init_state``; returns (the run's record, the trained model, the arm's
    build record)."""
    model = CharTransformerLM(len(text.vocab), config.dim, config.layers, config.heads, config.context).to(run.device)
    model.load_state_dict(init_state)
    built = build_arm(model, arm, bf16_layers=config.bf16_layers, seed=seed)
    opt = torch.optim.Adam(model.parameters(), lr=config.lr, betas=(0.9, 0.95))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_factor(s, config.steps))
    batches = text.batches(torch.Generator().manual_seed(seed + 3), config.batch)
    eval_at = set(_eval_steps(config.steps, config.evals))
    losses, evals, diverged = [], [], False
    t0, cpu0 = run.elapsed(), time.process_time()
    for step in run.bar(range(1, config.steps + 1), desc=f"{arm.label}, seed {seed}", leave=False):
        x, y = next(batches)
        opt.zero_grad(set_to_none=True)
        loss = _loss(model, x, y)
        loss.backward()
        opt.step()
        sched.step()
        value = float(loss.detach())
        losses.append(value)
        if not math.isfinite(value):
            diverged = True
            evals.append({"step": step, "valid_loss": math.nan})
            break
        if step in eval_at:
            evals.append({"step": step, "valid_loss": _evaluate(model, valid)})
    record = {
        "seed": seed,
        "losses": losses,
        "evals": evals,
        "diverged": diverged,
        "seconds": run.elapsed() - t0,
        "cpu_seconds": time.process_time() - cpu0,
    }
    return record, model, built


# ----------------------------------------------------------------------------------------------------------
# what each ingredient fixes
# ----------------------------------------------------------------------------------------------------------
def capture_linears(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> dict:
    """One forward and backward pass of ``model`` (its quantisation switched off: FP32) on the batch (x, y),
    keeping what each Linear layer's GEMMs read.

    Returns dict layer name → {"x": input (M, K), "w": weight (N, K), "g": output gradient (M, N)}, float32, M the
    tokens of the batch (g is the gradient of the mean cross-entropy).  The model's parameter gradients are left
    as that pass computed them.
    """
    quantizers = {id(m.quantizer): m.quantizer for m in model.modules() if isinstance(m, QuantLinear)}
    before = {k: q.enabled for k, q in quantizers.items()}
    for q in quantizers.values():
        q.enabled = False
    found, handles = {}, []

    def hook(name):
        def fn(module, inputs, output):
            a = inputs[0].detach().reshape(-1, inputs[0].shape[-1]).float()
            found[name] = {"x": a.clone(), "w": module.weight.detach().float().clone()}
            output.register_hook(
                lambda g: found[name].__setitem__("g", g.detach().reshape(-1, g.shape[-1]).float().clone())
            )

        return fn

    for name, m in model.named_modules():
        if isinstance(m, (nn.Linear, QuantLinear)):
            handles.append(m.register_forward_hook(hook(name)))
    try:
        model.zero_grad(set_to_none=True)
        _loss(model, x, y).backward()
    finally:
        for h in handles:
            h.remove()
        for k, q in quantizers.items():
            q.enabled = before[k]
    return found


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    """‖a − b‖ / ‖b‖ in float64."""
    b64 = b.double()
    return float((a.double() - b64).norm() / b64.norm()) if float(b64.norm()) > 0 else math.nan


def sr_bias(g: torch.Tensor, x: torch.Tensor, *, draws: int = 64, seed: int = 0) -> dict:
    """The weight gradient gw = gᵀ x with g quantised to NVFP4 in 1 × 16 blocks along the tokens (the recipe's
    weight-gradient operand; x left in FP32), rounded to nearest and stochastically.

    Parameters
    ----------
    g : output gradient (M, N), float32; x : input (M, K), float32 (M tokens)
    draws : int ≥ 1, stochastic-rounding draws (powers of two up to it are reported)
    seed : int ≥ 0, the generator of the draws

    Returns
    -------
    {"rtn": ‖Q_rtn(g)ᵀx − gᵀx‖ / ‖gᵀx‖, "sr_single": the same for one stochastic draw (mean over draws),
    "draws": [K], "sr_mean": [relative error of the mean of the first K stochastic draws], "rtn_zero": share of
    g's non-zero values that round to zero to nearest, "sr_zero": the same for one stochastic draw (mean),
    "rtn_along": ⟨Q_rtn(g)ᵀx − gᵀx, gᵀx⟩ / ‖gᵀx‖² (the error's component along the true gradient: negative when
    rounding shrinks it), "sr_along": the same for the mean of all draws}.  An unbiased rounding has
    E[Q(g)] = g, so the mean of K draws approaches gᵀx as 1/√K; a biased one stays at its error.

    Raises TypeError / ValueError for tensors that are not float matrices of matching tokens, or bad draws/seed.
    """
    for name, t in (("g", g), ("x", x)):
        if not isinstance(t, torch.Tensor) or t.dim() != 2 or not t.is_floating_point():
            raise TypeError(f"{name} must be a float matrix (tokens × features)")
    if g.shape[0] != x.shape[0]:
        raise ValueError(f"g and x must have the same tokens (rows), got {tuple(g.shape)} and {tuple(x.shape)}")
    if not isinstance(draws, int) or isinstance(draws, bool) or draws < 1:
        raise ValueError(f"draws must be an int ≥ 1, got {draws!r}")
    if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
        raise ValueError(f"seed must be an int ≥ 0, got {seed!r}")
    gt, x64 = g.t().contiguous().float(), x.double()
    exact = gt.double() @ x64
    nz = gt != 0
    n_nz = max(1, int(nz.sum()))
    rtn_q = fake_quantize_nvfp4(gt)
    rtn_gw = rtn_q.double() @ x64
    norm2 = float((exact * exact).sum())
    gen = torch.Generator(device=g.device).manual_seed(seed)
    total = torch.zeros_like(exact)
    report = [k for k in (2**i for i in range(draws.bit_length())) if k <= draws]
    sr_mean, singles, zeros = [], [], []
    for k in range(1, draws + 1):
        q = fake_quantize_nvfp4(gt, rounding="stochastic", generator=gen)
        gw = q.double() @ x64
        singles.append(_rel(gw, exact))
        zeros.append(float((nz & (q == 0)).sum()) / n_nz)
        total += gw
        if k in report:
            sr_mean.append(_rel(total / k, exact))
    mean = total / draws
    return {
        "rtn": _rel(rtn_gw, exact),
        "sr_single": statistics.fmean(singles),
        "draws": report,
        "sr_mean": sr_mean,
        "rtn_zero": float((nz & (rtn_q == 0)).sum()) / n_nz,
        "sr_zero": statistics.fmean(zeros),
        "rtn_along": float(((rtn_gw - exact) * exact).sum()) / norm2 if norm2 else math.nan,
        "sr_along": float(((mean - exact) * exact).sum()) / norm2 if norm2 else math.nan,
    }


def sr_residual_bias(x: torch.Tensor, *, draws: int = 64, seed: int = 0) -> dict:
    """Where stochastic rounding to NVFP4 is not unbiased: at the top of a block.

    NVFP4 maps a block's amax onto 6, E2M1's largest value, with a block scale rounded to E4M3; when that rounding
    goes down, the block's largest value lands above 6 and saturates, and stochastic rounding cannot round it up.
    ``x`` (rows × cols, float32, blocks of 16 along the rows) is rounded stochastically ``draws`` times (generator
    seeded with ``seed``) and the mean compared with x.

    Returns {"above_six": share of blocks whose largest magnitude exceeds 6 once divided by its scales,
    "largest_scaled": the largest such value, "top": RMS of (mean − x) at each block's largest magnitude, "others":
    the same elsewhere, "noise": the RMS error of one draw / √draws (what an unbiased mean leaves), all three
    relative to the RMS of x, and "top_shrink": the mean of (mean − x) / x at the block maxima (negative: shrunk)}.

    Raises TypeError for x not a float matrix, ValueError for cols not a multiple of 16 or bad draws/seed.
    """
    if not isinstance(x, torch.Tensor) or x.dim() != 2 or not x.is_floating_point():
        raise TypeError("x must be a float matrix")
    rows, cols = x.shape
    if cols % 16:
        raise ValueError(f"x's columns must be a multiple of 16 (NVFP4's blocks), got {cols}")
    if not isinstance(draws, int) or isinstance(draws, bool) or draws < 1:
        raise ValueError(f"draws must be an int ≥ 1, got {draws!r}")
    if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
        raise ValueError(f"seed must be an int ≥ 0, got {seed!r}")
    x = x.float()
    blocks = x.abs().reshape(rows, cols // 16, 16)
    amax = blocks.amax(-1)
    scaled = amax.double() / quantize_nvfp4(x).scales()
    top = (blocks == amax[..., None]).reshape(rows, cols)
    gen = torch.Generator(device=x.device).manual_seed(seed)
    x64 = x.double()
    total, single = torch.zeros_like(x64), 0.0
    for _ in range(draws):
        q = fake_quantize_nvfp4(x, rounding="stochastic", generator=gen).double()
        total += q
        single += float((q - x64).pow(2).mean())
    bias = total / draws - x64
    rms = float(x64.pow(2).mean().sqrt())
    return {
        "above_six": float((scaled > 6).double().mean()),
        "largest_scaled": float(scaled.max()),
        "top": float(bias[top].pow(2).mean().sqrt()) / rms,
        "others": float(bias[~top].pow(2).mean().sqrt()) / rms,
        "noise": math.sqrt(single / draws / draws) / rms,
        "top_shrink": float((bias[top] / x64[top]).mean()),
    }


def _snr(x: torch.Tensor, xq: torch.Tensor, mask: torch.Tensor | None = None) -> float:
    x64, q64 = x.double(), xq.double()
    if mask is not None:
        x64, q64 = x64[:, mask], q64[:, mask]
    return snr_db(float((x64 * x64).sum()), float(((q64 - x64) ** 2).sum()))


def _block_fp4(x: torch.Tensor, fmt: str, hadamard: bool, seed: int = 0) -> torch.Tensor:
    """x (float32 matrix) quantised along its last dimension to NVFP4 (16) or MXFP4 (32), optionally after the
    random Hadamard transform of the block size, and transformed back (the error is the same in both bases: the
    transform is orthogonal)."""
    d = 16 if fmt == "nvfp4" else 32
    rht = RandomHadamard(d, seed) if hadamard else None
    t = rht.apply(x) if rht else x
    tq = fake_quantize_nvfp4(t) if fmt == "nvfp4" else fake_quantize_mx(t, FP4_E2M1, 32)
    return rht.inverse(tq) if rht else tq


def _per_tensor_fp4(x: torch.Tensor) -> torch.Tensor:
    q, scale = quantize_per_tensor(x, FP4_E2M1)
    return ScaledTensor(q, scale, FP4_E2M1, torch.float32).dequantize()


def hadamard_outlier_error(
    *,
    factors: Sequence[float] = (1.0, 3.0, 10.0, 30.0, 100.0),
    channels: int = 4,
    shape: tuple[int, int] = (512, 256),
    seed: int = 0,
) -> dict:
    """NVFP4 and MXFP4 block error along the channels of a Gaussian matrix with a few outlier channels, with and
    without the random Hadamard transform.

    A (rows × cols) matrix of N(0, 1) values; ``channels`` columns (drawn from ``seed``) are multiplied by each
    factor in turn.  Each row is quantised along the channels (blocks of 16 for NVFP4, 32 for MXFP4), directly or
    after a random Hadamard transform of the block size (seed ``seed``).

    Returns {"factors", "outlier_channels" (their indices), "rows", "cols", and per format "nvfp4" / "mxfp4" →
    {"plain" / "rht" → {"all": [SNR dB of all values per factor], "rest": [SNR dB of the other channels]}},
    and "student_t" → format → {"plain", "rht"}: SNR dB of a matrix of the same shape drawn from Student's t
    with 3 degrees of freedom (heavy tails in every channel, no single outlier channel), for contrast}.

    Raises ValueError for factors < 1, a shape that is not two ints ≥ 32 with cols a multiple of 32, or channels
    not in [1, cols).
    """
    rows, cols = (int(n) for n in shape)
    if rows < 32 or cols < 32 or cols % 32:
        raise ValueError(f"shape must be (rows, cols), ints ≥ 32, cols a multiple of 32, got {shape!r}")
    if not 1 <= channels < cols:
        raise ValueError(f"channels must be in [1, {cols}), got {channels!r}")
    if not factors or any(float(f) < 1 for f in factors):
        raise ValueError(f"factors must be numbers ≥ 1, got {factors!r}")
    gen = torch.Generator().manual_seed(seed)
    base = torch.randn(rows, cols, generator=gen)
    idx = torch.randperm(cols, generator=gen)[:channels].sort().values
    rest = torch.ones(cols, dtype=torch.bool)
    rest[idx] = False
    out = {"factors": [float(f) for f in factors], "outlier_channels": idx.tolist(), "rows": rows, "cols": cols}
    for fmt in ("nvfp4", "mxfp4"):
        out[fmt] = {k: {"all": [], "rest": []} for k in ("plain", "rht")}
        for f in factors:
            x = base.clone()
            x[:, idx] *= float(f)
            for k in ("plain", "rht"):
                xq = _block_fp4(x, fmt, k == "rht", seed)
                out[fmt][k]["all"].append(_snr(x, xq))
                out[fmt][k]["rest"].append(_snr(x, xq, rest))
    t3 = torch.randn(rows, cols, generator=gen) / torch.sqrt(
        sum(torch.randn(rows, cols, generator=gen) ** 2 for _ in range(3)) / 3
    )
    out["student_t"] = {
        fmt: {k: _snr(t3, _block_fp4(t3, fmt, k == "rht", seed)) for k in ("plain", "rht")}
        for fmt in ("nvfp4", "mxfp4")
    }  # Z / sqrt(χ²₃ / 3): Student's t(3)
    return out


def channel_outliers(captured: dict, *, seed: int = 0) -> dict:
    """Per Linear layer (``captured`` of :func:`capture_linears`): how far its input's channels stand out, and what
    that costs FP4.

    Returns layer → {"amax_ratio": the largest per-channel amax over the median channel's, "top_channels": the
    three channels with the largest amax, "channel_amax": every channel's amax, "tensor": SNR dB of FP4 with one
    FP32 scale for the whole input, "block": NVFP4 along the channels (the forward GEMM's blocks), "block_rht":
    NVFP4 after a 16-point random Hadamard transform along the channels, and for the weight-gradient GEMM's
    inputs along the tokens: "wgrad_x", "wgrad_x_rht", "wgrad_g", "wgrad_g_rht"}.  Token counts that are not a
    multiple of 16 are cut to one.
    """
    out = {}
    for name, t in captured.items():
        x = t["x"]
        amax = x.abs().amax(0)
        med = float(amax.median())
        m = (x.shape[0] // 16) * 16
        xt, gt = x[:m].t().contiguous(), t["g"][:m].t().contiguous()
        out[name] = {
            "amax_ratio": float(amax.max()) / med if med > 0 else math.inf,
            "top_channels": amax.argsort(descending=True)[:3].tolist(),
            "channel_amax": amax.tolist(),
            "tensor": _snr(x, _per_tensor_fp4(x)),
            "block": _snr(x, _block_fp4(x, "nvfp4", False, seed)),
            "block_rht": _snr(x, _block_fp4(x, "nvfp4", True, seed)),
            "wgrad_x": _snr(xt, _block_fp4(xt, "nvfp4", False, seed)),
            "wgrad_x_rht": _snr(xt, _block_fp4(xt, "nvfp4", True, seed)),
            "wgrad_g": _snr(gt, _block_fp4(gt, "nvfp4", False, seed)),
            "wgrad_g_rht": _snr(gt, _block_fp4(gt, "nvfp4", True, seed)),
        }
    return out


def weight_mismatch(w: torch.Tensor, g: torch.Tensor | None = None) -> dict:
    """How different the weight the forward pass reads is from the one the backward pass reads, in NVFP4.

    The forward GEMM reads W (N, K) in blocks along K; the input-gradient GEMM reads Wᵀ in blocks along N.  With
    1 × 16 blocks the two quantised copies differ; with 16 × 16 tiles they are the same values (Q(W)ᵀ = Q(Wᵀ)).

    Returns {"1d": {"relative": ‖Q_N(W) − Q_K(W)‖ / ‖W‖, "differ": share of elements that differ, "dgrad":
    ‖g Q_N(W) − g Q_K(W)‖ / ‖g Q_K(W)‖ (with an output gradient g (M, N), else NaN)}, "2d": the same}.

    Raises TypeError for a w that is not a float matrix or a g whose columns are not w's rows.
    """
    if not isinstance(w, torch.Tensor) or w.dim() != 2 or not w.is_floating_point():
        raise TypeError("w must be a float matrix (out_features × in_features)")
    if g is not None and (not isinstance(g, torch.Tensor) or g.dim() != 2 or g.shape[1] != w.shape[0]):
        raise TypeError(f"g must be a matrix with {w.shape[0]} columns (w's rows), got {getattr(g, 'shape', g)}")
    w = w.float()
    out = {}
    for blocks in ("1d", "2d"):
        fwd = fake_quantize_nvfp4(w, axis=-1, blocks=blocks)
        bwd = fake_quantize_nvfp4(w, axis=0, blocks=blocks)
        d = {
            "relative": float((bwd - fwd).double().norm() / w.double().norm()),
            "differ": float((bwd != fwd).float().mean()),
        }
        d["dgrad"] = _rel(g.float() @ bwd, g.float() @ fwd) if g is not None else math.nan
        out[blocks] = d
    return out


def layer_sensitivity(
    model: nn.Module,
    recipe: str | Recipe,
    batch: tuple,
    valid: tuple,
    *,
    seed: int = 0,
    progress: Callable | None = None,
) -> dict:
    """Each Linear layer of ``model`` quantised alone with ``recipe``, every other computing in FP32.

    ``model`` is a plain model (no quantised layers); each layer is tried on a fresh copy.  Returns {"fp32_loss":
    the validation loss of the FP32 model on ``valid`` (windows, targets), "layers": name → {"delta_loss": the
    validation loss added (nats), "grad_error": ‖∇ − ∇_FP32‖ / ‖∇_FP32‖ over all parameters on ``batch``}}.
    """
    x, y = batch
    base = copy.deepcopy(model)
    base.zero_grad(set_to_none=True)
    _loss(base, x, y).backward()
    ref = torch.cat([p.grad.flatten() for p in base.parameters()])
    fp32 = _evaluate(base, valid)
    names = [n for n, m in model.named_modules() if isinstance(m, nn.Linear)]
    out = {"fp32_loss": fp32, "layers": {}}
    it = names if progress is None else progress(names, desc="one layer at a time", leave=False)
    for name in it:
        m = copy.deepcopy(model)
        quantize_linears_(m, recipe, skip=tuple(n for n in names if n != name), seed=seed)
        m.zero_grad(set_to_none=True)
        _loss(m, x, y).backward()
        grad = torch.cat([p.grad.flatten() for p in m.parameters()])
        out["layers"][name] = {"delta_loss": _evaluate(m, valid) - fp32, "grad_error": _rel(grad, ref)}
    return out


def wgrad_error(captured: dict, recipe: str | Recipe, *, seed: int = 0) -> dict:
    """Per Linear layer (``captured`` of :func:`capture_linears`), the relative error of its weight gradient
    computed by ``recipe``'s weight-gradient GEMM (for the NVFP4 recipe: both inputs after the 16-point random
    Hadamard transform along the tokens, gᵀ rounded stochastically, xᵀ to nearest) against gᵀx in FP32:
    layer → ‖gw_recipe − gᵀx‖ / ‖gᵀx‖ (the measure by which NVIDIA found the last layers most sensitive,
    arXiv:2509.25149, §4.1).  Stochastic rounding draws from a generator seeded with ``seed``."""
    q = Quantizer(recipe, seed=seed)
    spec = q.recipe.gemms
    if spec is None:
        raise ValueError("recipe must quantise per GEMM (four_bit_recipe or TrainingRecipe(gemms=...))")
    out = {}
    for name, t in captured.items():
        a, b = q.gemm_operands(spec.wgrad, t["g"].t().contiguous(), t["x"].t().contiguous())
        out[name] = _rel(a.double() @ b.double().t(), t["g"].t().double() @ t["x"].double())
    return out


def _diagnostics(model: nn.Module, text: _Text, config: Config, run: Run) -> dict:
    """The measurements of what each ingredient fixes, on the trained BF16 model (see the module docstring)."""
    seed = config.seed
    batch = next(text.batches(torch.Generator().manual_seed(seed + 99), config.diag_sequences))
    captured = capture_linears(model, *batch)
    sr_name = _layer_name(config.sr_layer, config.layers)
    t = captured[sr_name]
    out = {
        "sr_bias": {
            "layer": sr_name,
            "tokens": t["x"].shape[0],
            **sr_bias(t["g"], t["x"], draws=config.sr_draws, seed=seed),
        }
    }
    out["hadamard"] = hadamard_outlier_error(
        factors=config.outlier_factors, channels=config.outlier_channels, shape=config.outlier_shape, seed=seed
    )
    out["outliers"] = channel_outliers(captured, seed=seed)
    out["mismatch"] = {name: weight_mismatch(c["w"], c["g"]) for name, c in captured.items()}
    plain = CharTransformerLM(len(text.vocab), config.dim, config.layers, config.heads, config.context).to(run.device)
    plain.load_state_dict(model.state_dict())
    recipe = four_bit_recipe(hadamard_seed=seed)
    sens = layer_sensitivity(plain, recipe, batch, text.windows(config.sens_valid_chars), seed=seed, progress=run.bar)
    out["sensitivity"] = {
        "recipe": "nvfp4 (the full recipe)",
        **sens,
        "wgrad_error": wgrad_error(captured, recipe, seed=seed),
    }
    return out


# ----------------------------------------------------------------------------------------------------------
# the measured loop
# ----------------------------------------------------------------------------------------------------------
def measure(config: Config, run: Run) -> dict:
    """Train every arm for every seed (the BF16 reference first), then measure what each ingredient fixes on the
    trained BF16 model of the first seed."""
    load_start = os.getloadavg()[0] if hasattr(os, "getloadavg") else math.nan
    text = _Text(config, run.device)
    valid = text.windows(config.valid_chars)
    seeds = [config.seed + i for i in range(config.seeds)]
    arms = ["bf16"] + [a for a in config.arms if a != "bf16"]
    out = {"arms": {}, "runs": {a: [] for a in arms}, "diagnostics": {}}
    inits = {}
    for s in seeds:
        torch.manual_seed(s)
        m = CharTransformerLM(len(text.vocab), config.dim, config.layers, config.heads, config.context)
        inits[s] = copy.deepcopy(m.state_dict())
    linears = [n for n, mod in m.named_modules() if isinstance(mod, nn.Linear)]
    block_linears = [n for n in linears if n != "head"]
    kept = [_layer_name(s, config.layers) for s in config.bf16_layers]
    out["model"] = {
        "what": "character-level transformer (CharTransformerLM) on the King James Bible",
        "parameters": sum(p.numel() for p in m.parameters()),
        "linears": linears,
        "dim": config.dim,
        "layers": config.layers,
        "heads": config.heads,
        "context": config.context,
        "vocab_size": len(text.vocab),
        "train_chars": len(text.train),
        "tokens_per_step": config.batch * config.context,
        "steps": config.steps,
        "tokens": config.batch * config.context * config.steps,
        "valid_chars": valid[1].numel(),
        "bf16_layers": kept,
        "bf16_share": len([k for k in kept if k in block_linears]) / len(block_linears),
        "eval_steps": _eval_steps(config.steps, config.evals),
    }
    trained_bf16 = None
    for arm_name in run.bar(arms, desc="arms"):
        arm = ARMS[arm_name]
        for s in seeds:
            record, model, built = _train(text, inits[s], arm, s, config, run, valid)
            out["runs"][arm_name].append(record)
            if arm_name not in out["arms"]:
                out["arms"][arm_name] = {
                    **arm.describe(),
                    "recipe": built["recipe"],
                    "bf16": built["bf16"],
                    "quantized": built["quantized"],
                }
            if arm_name == "bf16" and s == seeds[0]:
                trained_bf16 = model
    out["diagnostics"] = _diagnostics(trained_bf16, text, config, run)
    out["machine"] = {
        "load_start": load_start,
        "load_end": os.getloadavg()[0] if hasattr(os, "getloadavg") else math.nan,
        "cpus": os.cpu_count(),
    }
    return out


EXPERIMENT = Experiment(NAME, Config, PROFILES, measure, FourbitAblationResult, __doc__, smoke=SMOKE)
run, config_for, main = EXPERIMENT.run, EXPERIMENT.config_for, EXPERIMENT.main

if __name__ == "__main__":
    run_main(EXPERIMENT)
