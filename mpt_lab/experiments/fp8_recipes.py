"""FP8 and block scaling: a small transformer language model and the digits MLP trained in every recipe.

Each model is trained from the same initial weights on the same batches in every recipe of
:data:`mpt_lab.quantized_training.TRAINING_RECIPES` that ``config.recipes`` names: FP32; BF16 without a
scaler; FP16 with a dynamic :class:`~mpt_lab.scaling.GradScaler`; FP8 (E4M3 forward, E5M2 backward) without
any scaling, with per-tensor current scaling and with Transformer Engine's delayed scaling; MXFP8, MXFP6 and
MXFP4 (OCP MX, blocks of 32 with E8M0 scales); NVFP4 (blocks of 16 with E4M3 scales and an FP32 tensor scale);
and BF16 weights without FP32 master weights, updated with stochastic rounding (and, for contrast, with
round-to-nearest-even).  The operands of every Linear layer's products are quantised
(:func:`mpt_lab.quantized_training.quantize_linears_`); everything else computes in FP32.

The models:

* ``lm``: a character-level decoder-only transformer (:class:`mpt_lab.models.transformer.CharTransformerLM`:
  token and position embeddings, pre-LayerNorm blocks of causal self-attention and a GELU MLP, a linear output
  layer) on the King James Bible (:func:`mpt_lab.data.kjv_characters`), trained with Adam, warm-up and cosine
  decay;
  its loss is the mean cross-entropy in nats per character;
* ``mlp``: the digits MLP (:func:`mpt_lab.models.digits_mlp` on :func:`mpt_lab.data.digits_data`), Adam, the same
  schedule; its loss is the mean cross-entropy in nats per image.

Measured per model and recipe: the training loss of every step, the validation loss (in the recipe's own
forward arithmetic) at ``evals`` points, and on every ``stats_every``-th step per Linear layer and operand
(input x, weight w, output gradient g) the share of non-zero values that underflowed to zero, the share that
saturated and the signal-to-noise ratio.  Step 1 is recorded too, and kept apart as well ("stats_first"): delayed
scaling has no amax history there and casts with scale 1, so :meth:`FP8RecipesResult.stats` offers the steps after
the first (``steps="after_first"``), the steady state, beside all of them.  From the FP32 language-model run: log2
histograms of every Linear layer's x, w and g (:class:`~mpt_lab.histogram.Log2Histogram`), and from its last
recorded step the error of MX quantisation against block size (8 … 256 and one scale per tensor) and of E8M0
against FP32 block scales.
From the delayed-scaling run: the amax history and scale of a few tensors over training.

On a CUDA GPU with FP8 tensor cores (compute capability ≥ 8.9, e.g. H100) and ``hardware=True`` the FP8
per-tensor recipes also run with their products on the tensor cores (``torch._scaled_mm``; runs named
``fp8_current_hw``, ``fp8_delayed_hw``), beside the emulation, and one product is compared both ways.

    python -m mpt_lab.experiments.fp8_recipes --profile full --out book/results/fp8_recipes_full.json
"""

from __future__ import annotations

import copy
import math
import time
from dataclasses import dataclass, field

import torch
import torch.nn.functional as Fn
from torch import nn

from ..data import digits_data
from ..data.text import kjv_characters
from ..formats import FP8_E4M3
from ..harness.runner import Experiment, ExperimentConfig, ExperimentResult, Run, run_main
from ..histogram import Log2Histogram
from ..microscaling import (
    ScaledTensor,
    block_scale_comparison,
    block_size_sweep,
    layer_stats,
    mean_over_layers,
    quantize_per_tensor,
)
from ..models import digits_mlp
from ..models.transformer import CharTransformerLM
from ..quantized_training import (
    ROLES,
    TRAINING_RECIPES,
    Quantizer,
    hardware_fp8_available,
    quantize_linears_,
    round_weights_,
)
from ..scaling import GradScaler
from ..training import lr_factor

__all__ = [
    "NAME",
    "Config",
    "PROFILES",
    "FP8RecipesResult",
    "MODELS",
    "RECIPE_ORDER",
    "HARDWARE_RECIPES",
    "run",
    "config_for",
    "main",
    "EXPERIMENT",
]

NAME = "fp8_recipes"
#: The models the experiment trains.
MODELS = ("lm", "mlp")
#: The recipes in the order of the book's tables.
RECIPE_ORDER = tuple(TRAINING_RECIPES)
#: The recipes that also run on FP8 tensor cores where there are some.
HARDWARE_RECIPES = ("fp8_current", "fp8_delayed")


# ----------------------------------------------------------------------------------------------------------
# configuration and result
# ----------------------------------------------------------------------------------------------------------
@dataclass
class Config(ExperimentConfig):
    """The recipes to train and the two models' sizes, steps and learning rates (each field's comment says what
    it is; :data:`PROFILES` holds each profile's values)."""

    recipes: tuple = RECIPE_ORDER  # names of TRAINING_RECIPES
    models: tuple = MODELS
    lm_dim: int = 64  # the language model: width, blocks, heads, context (characters)
    lm_layers: int = 2
    lm_heads: int = 4
    lm_context: int = 64
    lm_batch: int = 16  # sequences per step (lm_batch × lm_context characters)
    lm_steps: int = 150
    lm_lr: float = 2e-3  # Adam, betas (0.9, 0.95); warm-up and cosine decay (training.lr_factor)
    lm_valid_chars: int = 16384  # validation characters evaluated
    mlp_hidden: int = 64  # the digits MLP: width and hidden layers
    mlp_layers: int = 2
    mlp_batch: int = 128
    mlp_steps: int = 200
    mlp_lr: float = 3e-3
    evals: int = 4  # validation evaluations per run (the last after the last step)
    stats_every: int = 10  # record quantisation statistics on every N-th step
    history_len: int = 16  # delayed scaling: amax history length and margin (Transformer Engine)
    margin: int = 0
    scale_rounding: str = "floor"  # MX shared scale: OCP MX v1.0's floor, or "ceil", "even", "rceil"
    init_scale: float = 2.0**16  # FP16's GradScaler
    growth_interval: int = 100
    block_sizes: tuple = (8, 16, 32, 64, 128, 256)
    sweep_formats: tuple = ("FP8_E4M3", "FP8_E5M2", "FP6_E3M2", "FP6_E2M3", "FP4_E2M1")
    hardware: bool = True  # on a GPU with FP8 tensor cores, also run the FP8 per-tensor recipes there

    def validate(self) -> None:
        super().validate()
        self.check_choices("recipes", TRAINING_RECIPES, subset=True)
        self.check_choices("models", MODELS, subset=True)
        self.check_positive(
            "lm_dim",
            "lm_layers",
            "lm_heads",
            "lm_context",
            "lm_batch",
            "lm_steps",
            "lm_valid_chars",
            "mlp_hidden",
            "mlp_layers",
            "mlp_batch",
            "mlp_steps",
            "evals",
            "stats_every",
            "history_len",
            "growth_interval",
        )
        if self.lm_dim % self.lm_heads:
            raise ValueError(
                f"config.lm_dim must be divisible by config.lm_heads, got {self.lm_dim} and {self.lm_heads}"
            )
        if self.lm_valid_chars < self.lm_context + 1:
            raise ValueError(f"config.lm_valid_chars must be ≥ lm_context + 1, got {self.lm_valid_chars!r}")
        for name in ("lm_lr", "mlp_lr", "init_scale"):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not 0 < v < math.inf:
                raise ValueError(f"config.{name} must be a positive number, got {v!r}")
        if not isinstance(self.margin, int) or isinstance(self.margin, bool) or not 0 <= self.margin <= 16:
            raise ValueError(f"config.margin must be an int in [0, 16], got {self.margin!r}")
        self.check_choices("scale_rounding", ("floor", "ceil", "even", "rceil"))
        if not self.block_sizes or any(not isinstance(b, int) or b < 1 for b in self.block_sizes):
            raise ValueError(f"config.block_sizes must be ints ≥ 1, got {self.block_sizes!r}")
        self.check_choices("sweep_formats", ("FP8_E4M3", "FP8_E5M2", "FP6_E3M2", "FP6_E2M3", "FP4_E2M1"), subset=True)
        if not isinstance(self.hardware, bool):
            raise ValueError(f"config.hardware must be a bool, got {self.hardware!r}")


#: Sizes by timing.  Measured as the CPU time of the single-threaded run (``cpu_seconds`` per run; on an idle
#: core that is its wall time) on a shared 2-core AMD EPYC: the language model costs ≈ 0.03 s per step in FP32
#: and BF16 at 1,024 characters per step, ≈ 0.06 s in FP8 per tensor, ≈ 0.12–0.15 s in MX and NVFP4; the
#: chapter adds ≈ 15 s (imports, the text, the histogram kernel's compilation, figures).  quick: ≈ 60 s of
#: training, the chapter ≈ 75 s (budget 90 s); cpu: ≈ 180 s, the chapter ≈ 200 s (budget 4 minutes).  full (one
#: H100, its share of the full profile's 8 minutes: mpt_lab.harness.budget): the emulated quantisers launch
#: ≈ 2,000 operators per step of the language model (counted on a CPU), ≈ 40 ms of host time on a GPU whatever
#: the sizes, so the full profile trains the wider language model only, in the recipes the chapter asserts on and
#: on the FP8 tensor cores, for 100 steps; the cpu profile's live run has every recipe and the MLP.
PROFILES = {
    "quick": {
        "lm_steps": 60,
        "lm_batch": 12,
        "mlp_steps": 120,
        "evals": 2,
        "stats_every": 30,
        "lm_valid_chars": 8192,
        "block_sizes": (8, 32, 128),
        "sweep_formats": ("FP8_E4M3", "FP4_E2M1"),
        "recipes": (
            "fp32",
            "bf16",
            "fp16",
            "fp8_unscaled",
            "fp8_current",
            "fp8_delayed",
            "mxfp8",
            "mxfp4",
            "nvfp4",
            "bf16_sr",
            "bf16_rne",
        ),
        "threads": 1,
    },
    "cpu": {"lm_steps": 100, "lm_batch": 12, "mlp_steps": 150, "evals": 3, "stats_every": 25, "threads": 0},
    "full": {
        "models": ("lm",),
        "recipes": ("fp32", "bf16", "fp8_unscaled", "fp8_current", "fp8_delayed", "mxfp8", "mxfp4"),
        "lm_dim": 256,
        "lm_layers": 4,
        "lm_heads": 8,
        "lm_context": 128,
        "lm_batch": 32,
        "lm_steps": 100,
        "lm_lr": 1e-3,
        "lm_valid_chars": 16384,
        "mlp_hidden": 256,
        "mlp_steps": 200,
        "evals": 2,
        "stats_every": 25,
    },
}

#: ``--smoke``: two steps of each model in each recipe, one evaluation on two context windows, statistics on
#: both steps; two sequences per language-model batch (the emulated MX and NVFP4 quantisers cost seconds per
#: step on a CPU at the full batch's 4,096 × 256 activations).
SMOKE = {"lm_steps": 2, "mlp_steps": 2, "evals": 1, "stats_every": 1, "lm_valid_chars": 257, "lm_batch": 2}


@dataclass
class FP8RecipesResult(ExperimentResult):
    """``recipes``: name → the recipe as data (labels, formats, scaling, bits per value); ``models``: model →
    {"parameters", "linears" (their names, in order), "tokens_per_step", "loss_unit", ...}; ``runs``: model →
    run name (a recipe, or ``<recipe>_hw`` for the tensor-core runs) → {"losses" [steps] training loss,
    "evals" [{"step", "valid_loss", ("accuracy")}], "stats" layer → role → counts of every recorded step
    (:func:`mpt_lab.microscaling.layer_stats` reads them), "stats_first" the same of step 1 alone (absent from
    results saved before it was recorded), "skipped" steps (FP16's scaler),
    "diverged", "seconds", "cpu_seconds", "gemms"}; ``histograms``: layer → role → Log2Histogram of the FP32
    language-model run; ``block_sweep``: role → layer → format → {block size or "tensor": SNR dB} and
    ``block_scales``: role → layer → format → {"e8m0", "fp32", ("nvfp4")} SNR dB (the last recorded step of
    the FP32 language model); ``delayed``: {"history_len", "margin", "tensors": name → {"exceeded",
    "steps_exceeded"}, "traces": name → {"amax", "scale", "exceeded"} per step}; ``hardware``: whether FP8
    tensor cores ran, the device, and a product compared with the emulation."""

    recipes: dict = field(default_factory=dict)
    models: dict = field(default_factory=dict)
    runs: dict = field(default_factory=dict)
    histograms: dict = field(default_factory=dict)
    block_sweep: dict = field(default_factory=dict)
    block_scales: dict = field(default_factory=dict)
    delayed: dict = field(default_factory=dict)
    hardware: dict = field(default_factory=dict)

    def _run(self, model: str, recipe: str) -> dict:
        if model not in self.runs:
            raise ValueError(f"model must be one of {tuple(self.runs)}, got {model!r}")
        if recipe not in self.runs[model]:
            raise ValueError(f"recipe must be one of {tuple(self.runs[model])}, got {recipe!r}")
        return self.runs[model][recipe]

    def final(self, model: str, recipe: str) -> float:
        """The last validation loss of a run (nats per character or per image); NaN when it diverged."""
        return float(self._run(model, recipe)["evals"][-1]["valid_loss"])

    def gap(self, model: str, recipe: str, reference: str = "bf16") -> float:
        """final(recipe) − final(reference), in nats."""
        return self.final(model, recipe) - self.final(model, reference)

    #: Which recorded steps :meth:`stats` sums: all of them (step 1 and every ``stats_every``-th), step 1 alone,
    #: or the steps after the first (the steady state: delayed scaling has no amax history at step 1).
    STEPS = ("all", "first", "after_first")

    def has_first(self, model: str, recipe: str) -> bool:
        """Whether the run kept step 1's statistics apart (results saved before it did not)."""
        return "stats_first" in self._run(model, recipe)

    def _counts(self, model: str, recipe: str, steps: str) -> dict:
        if steps not in self.STEPS:
            raise ValueError(f"steps must be one of {self.STEPS}, got {steps!r}")
        run = self._run(model, recipe)
        if steps == "all":
            return run["stats"]
        if "stats_first" not in run:
            raise ValueError(
                f"the {recipe} run of {model} did not keep step 1 apart (a result saved before it "
                f"did): only steps='all' is available"
            )
        first = run["stats_first"]
        if steps == "first":
            return first
        return {
            layer: {
                role: {k: v - first.get(layer, {}).get(role, {}).get(k, 0) for k, v in c.items()}
                for role, c in roles.items()
            }
            for layer, roles in run["stats"].items()
        }

    def stats(self, model: str, recipe: str, steps: str = "all") -> dict:
        """Shares and SNR per layer and role, and over all layers under "all"
        (:func:`mpt_lab.microscaling.layer_stats`), over the recorded ``steps`` (:attr:`STEPS`: "all",
        "first" or "after_first"; ValueError for the last two on a result without step 1 kept apart)."""
        return layer_stats(self._counts(model, recipe, steps))

    def underflow(self, model: str, recipe: str, role: str = "g", steps: str = "all") -> float:
        """Share of the non-zero values of ``role`` (over all layers) that the recipe turned into zeros, over the
        recorded ``steps`` (see :meth:`stats`)."""
        if role not in ROLES:
            raise ValueError(f"role must be one of {ROLES}, got {role!r}")
        return self.stats(model, recipe, steps)["all"][role]["underflow"]

    def snr(self, model: str, recipe: str, role: str, steps: str = "all") -> float:
        """Signal-to-noise ratio (dB) of ``role`` over all layers, over the recorded ``steps`` (see
        :meth:`stats`)."""
        if role not in ROLES:
            raise ValueError(f"role must be one of {ROLES}, got {role!r}")
        return self.stats(model, recipe, steps)["all"][role]["snr_db"]

    def block_snr(self, role: str, which: str = "sweep") -> dict:
        """Mean SNR (dB) over the Linear layers of the FP32 language model's ``role`` ("x", "w", "g"):
        ``which="sweep"``: format → {block size or "tensor": SNR}; ``"scales"``: format → {"e8m0", "fp32",
        ("nvfp4")}."""
        if which not in ("sweep", "scales"):
            raise ValueError(f"which must be 'sweep' or 'scales', got {which!r}")
        data = self.block_sweep if which == "sweep" else self.block_scales
        if role not in data:
            raise ValueError(f"role must be one of {tuple(data)}, got {role!r}")
        return mean_over_layers(data[role])

    def label(self, recipe: str) -> str:
        """The label a recipe has in the book's figures (its name when the result does not hold it)."""
        return self.recipes.get(recipe, {}).get("label", recipe)

    def describe(self) -> str:
        parts = []
        for model, runs in self.runs.items():
            unit = self.models.get(model, {}).get("loss_unit", "nats")
            finals = ", ".join(f"{self.label(r)} {self.final(model, r):.3f}" for r in runs)
            parts.append(f"{model} (validation loss, {unit}): {finals}")
        return f"fp8_recipes ({self.profile} profile, {self.device}): " + "; ".join(parts)


# ----------------------------------------------------------------------------------------------------------
# one training run
# ----------------------------------------------------------------------------------------------------------
class _Task:
    """A model to train: how to build it, draw a batch, compute the loss and evaluate."""

    def __init__(self, model: str, config: Config, device: torch.device):
        self.model_name, self.config, self.device = model, config, device
        c = config
        if model == "lm":
            train, valid, vocab = kjv_characters()
            self.train, self.vocab = train.to(device), vocab
            n = (min(c.lm_valid_chars, len(valid) - 1) // c.lm_context) * c.lm_context
            self.valid_x = valid[:n].view(-1, c.lm_context).to(device)
            self.valid_y = valid[1 : n + 1].view(-1, c.lm_context).to(device)
            self.steps, self.lr = c.lm_steps, c.lm_lr
            self.info = {
                "what": "character-level transformer on the King James Bible",
                "vocab_size": len(vocab),
                "train_chars": len(train),
                "tokens_per_step": c.lm_batch * c.lm_context,
                "loss_unit": "nats per character",
                "dim": c.lm_dim,
                "layers": c.lm_layers,
                "heads": c.lm_heads,
                "context": c.lm_context,
            }
        else:
            self.xtr, self.ytr, self.xte, self.yte = digits_data(c.seed, device)
            self.steps, self.lr = c.mlp_steps, c.mlp_lr
            self.info = {
                "what": "digits MLP (scikit-learn's 8×8 digits)",
                "train_images": len(self.xtr),
                "tokens_per_step": c.mlp_batch,
                "loss_unit": "nats per image",
                "hidden": c.mlp_hidden,
                "layers": c.mlp_layers,
            }

    def build(self) -> nn.Module:
        c = self.config
        if self.model_name == "lm":
            m = CharTransformerLM(len(self.vocab), c.lm_dim, c.lm_layers, c.lm_heads, c.lm_context)
        else:
            m = digits_mlp(c.mlp_hidden, c.mlp_layers)
        return m.to(self.device)

    def batches(self, generator: torch.Generator):
        """Endless (input, target) batches, the same sequence for every recipe (drawn on the CPU)."""
        c = self.config
        if self.model_name == "lm":
            span = len(self.train) - c.lm_context - 1
            offsets = torch.arange(c.lm_context + 1)
            while True:
                start = torch.randint(0, span, (c.lm_batch,), generator=generator)
                w = self.train[(start[:, None] + offsets).to(self.device)]
                yield w[:, :-1], w[:, 1:]
        else:
            n = len(self.xtr)
            while True:
                perm = torch.randperm(n, generator=generator).to(self.device)
                for i in range(0, n - c.mlp_batch + 1, c.mlp_batch):
                    idx = perm[i : i + c.mlp_batch]
                    yield self.xtr[idx], self.ytr[idx]

    def loss(self, model: nn.Module, x, y) -> torch.Tensor:
        out = model(x)
        return Fn.cross_entropy(out.reshape(-1, out.shape[-1]).float(), y.reshape(-1))

    @torch.no_grad()
    def evaluate(self, model: nn.Module) -> dict:
        model.eval()
        if self.model_name == "lm":
            total, count = 0.0, 0
            for i in range(0, len(self.valid_x), 64):
                x, y = self.valid_x[i : i + 64], self.valid_y[i : i + 64]
                total += float(self.loss(model, x, y)) * y.numel()
                count += y.numel()
            out = {"valid_loss": total / count}
        else:
            logits = model(self.xte)
            out = {
                "valid_loss": float(Fn.cross_entropy(logits.float(), self.yte)),
                "accuracy": float((logits.argmax(1) == self.yte).float().mean()),
            }
        model.train()
        if not math.isfinite(out["valid_loss"]):
            out["valid_loss"] = math.nan
        return out


class _Recorder:
    """Log2 histograms of every Linear layer's input, weight and output gradient (the FP32 run), and the
    tensors of the last recorded step."""

    def __init__(self, model: nn.Module):
        self.hist: dict = {}
        self.last: dict = {}
        self.active = False
        self.handles = [
            m.register_forward_hook(self._hook(name)) for name, m in model.named_modules() if isinstance(m, nn.Linear)
        ]

    def _hook(self, name: str):
        def hook(module, inputs, output):
            if not self.active or not output.requires_grad:
                return
            x = inputs[0].detach().reshape(-1, inputs[0].shape[-1])
            h = self.hist.setdefault(name, {r: Log2Histogram(device=x.device) for r in ROLES})
            h["x"].add_(x)
            h["w"].add_(module.weight.detach())
            self.last[name] = {"x": x.clone(), "w": module.weight.detach().clone()}

            def grad_hook(g):
                g2 = g.detach().reshape(-1, g.shape[-1])
                h["g"].add_(g2)
                self.last[name]["g"] = g2.clone()

            output.register_hook(grad_hook)

        return hook

    def close(self) -> None:
        for h in self.handles:
            h.remove()


def _eval_steps(steps: int, evals: int) -> set:
    return {max(1, round(steps * (i + 1) / evals)) for i in range(evals)}


def _train(
    task: _Task,
    init_state: dict,
    run_name: str,
    recipe: str,
    config: Config,
    run: Run,
    *,
    hardware: bool = False,
    record_fp32: bool = False,
) -> tuple:
    """Train one model in one recipe from ``init_state``; the measured loop of the experiment.

    Returns (the run's record, extras: the FP32 run's histograms and last tensors, the DelayedScaling object,
    the trained model)."""
    spec = TRAINING_RECIPES[recipe]
    torch.manual_seed(config.seed + 1)
    model = task.build()
    model.load_state_dict(init_state)
    quantizer = None
    if spec.quantized:
        quantizer = quantize_linears_(
            model,
            spec,
            history_len=config.history_len,
            margin=config.margin,
            scale_rounding=config.scale_rounding,
            hardware=hardware,
        )
    recorder = _Recorder(model) if record_fp32 else None
    params = list(model.parameters())
    sr_gen = torch.Generator(device=task.device).manual_seed(config.seed + 2)
    if spec.weights != "fp32":
        round_weights_(params, "nearest_even")  # the weights are stored in BF16 from the start
    opt = torch.optim.Adam(params, lr=task.lr, betas=(0.9, 0.95))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_factor(s, task.steps))
    scaler = (
        GradScaler(init_scale=config.init_scale, growth_interval=config.growth_interval)
        if spec.loss_scaling == "dynamic"
        else None
    )
    batches = task.batches(torch.Generator().manual_seed(config.seed + 3))
    eval_at = _eval_steps(task.steps, config.evals)
    losses, evals, skipped, diverged, first_stats = [], [], [], False, None
    t0, cpu0 = run.elapsed(), time.process_time()
    label = f"{task.model_name}: {spec.label}" + (" (tensor cores)" if hardware else "")
    for step in run.bar(range(1, task.steps + 1), desc=label, leave=False):
        recording = step % config.stats_every == 0 or step == 1
        if quantizer is not None:
            quantizer.recording = recording
        if recorder is not None:
            recorder.active = recording
        x, y = next(batches)
        opt.zero_grad(set_to_none=True)
        loss = task.loss(model, x, y)
        if scaler is not None:
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            if scaler.history[-1][2]:
                skipped.append(step)
        else:
            loss.backward()
            opt.step()
        sched.step()
        if spec.weights != "fp32":
            round_weights_(params, "stochastic" if spec.weights == "bf16_sr" else "nearest_even", generator=sr_gen)
        if quantizer is not None:
            quantizer.step()
            if step == 1:  # step 1 apart: delayed scaling has no amax history yet (scale 1)
                first_stats = copy.deepcopy(quantizer.stats)
        value = float(loss.detach())
        losses.append(value)
        if not math.isfinite(value) and scaler is None:
            diverged = True
            evals.append({"step": step, "valid_loss": math.nan})
            break
        if step in eval_at:
            if quantizer is not None:
                quantizer.recording = False
            evals.append({"step": step, **task.evaluate(model)})
    out = {
        "losses": losses,
        "evals": evals,
        "skipped": skipped,
        "diverged": diverged,
        "stats": quantizer.stats if quantizer is not None else {},
        "stats_first": first_stats if first_stats is not None else {},
        "gemms": dict(quantizer.gemms) if quantizer is not None else {},
        "seconds": run.elapsed() - t0,
        "cpu_seconds": time.process_time() - cpu0,
    }
    extras = {}
    if recorder is not None:
        recorder.close()
        extras = {"histograms": recorder.hist, "last": recorder.last}
    if quantizer is not None and quantizer.delayed is not None:
        extras["delayed"] = quantizer.delayed
    if quantizer is not None and hardware:
        extras["hardware_used"] = quantizer.hardware
    return out, extras, model


def _delayed_summary(ds, config: Config, lm_layers: list) -> dict:
    """The delayed-scaling record: per tensor how often and how much its stale scale was exceeded, and the
    traces of two tensors: the forward tensor (input or weight) and the output gradient whose stale scales were
    exceeded most (the first layer's input and the output layer's gradient when none was)."""
    tensors, traces = {}, {}
    for e in ds.log:
        t = tensors.setdefault(e["name"], {"exceeded": 0, "steps_exceeded": 0})
        t["exceeded"] += e["exceeded"]
        t["steps_exceeded"] += e["exceeded"] > 0
    if not tensors:
        return {}
    pick = []
    for backward, default in ((False, f"{lm_layers[0]}.x"), (True, f"{lm_layers[-1]}.g")):
        names = [n for n in tensors if n.endswith(".g") == backward]
        worst = max(names, key=lambda n: (tensors[n]["steps_exceeded"], tensors[n]["exceeded"], n), default=None)
        if worst is not None and tensors[worst]["exceeded"] == 0 and default in tensors:
            worst = default
        if worst is not None:
            pick.append(worst)
    for name in pick:
        rows = [e for e in ds.log if e["name"] == name]
        traces[name] = {
            "step": [e["step"] + 1 for e in rows],
            "amax": [e["amax"] for e in rows],
            "scale": [e["scale"] for e in rows],
            "exceeded": [e["exceeded"] for e in rows],
            "format": rows[0]["format"] if rows else "",
        }
    return {"history_len": config.history_len, "margin": config.margin, "tensors": tensors, "traces": traces}


def _hardware_check(last: dict, device: torch.device) -> dict:
    """One product of the FP32 run's last step, x @ w.t() of the first Linear layer, quantised per tensor to
    E4M3: emulated in FP32 against ``torch._scaled_mm``."""

    name = next(iter(last))
    x, w = last[name]["x"].to(device), last[name]["w"].to(device)
    a = ScaledTensor(*quantize_per_tensor(x, FP8_E4M3), FP8_E4M3, torch.float32)
    b = ScaledTensor(*quantize_per_tensor(w, FP8_E4M3), FP8_E4M3, torch.float32)
    q = Quantizer("fp8_current", hardware=True)
    emulated = a.dequantize() @ b.dequantize().t()
    hw = q.matmul(a.dequantize(), b.dequantize(), a, b, tb=True)
    diff = (hw.double() - emulated.double()).abs()
    scale = emulated.double().abs().max()
    return {
        "layer": name,
        "shape": [list(x.shape), list(w.shape)],
        "on_tensor_cores": q.gemms["hardware"] == 1,
        "max_abs_diff": float(diff.max()),
        "max_rel_diff": float(diff.max() / scale) if scale > 0 else 0.0,
    }


def measure(config: Config, run: Run) -> dict:
    """Train each model in each recipe from the same initial weights and batches; then the FP32 language
    model's tensors give the block-size sweep, and (on a GPU with FP8 tensor cores) the FP8 per-tensor recipes
    run again on the tensor cores."""
    device = run.device
    hw_ok = config.hardware and hardware_fp8_available(device) if device.type == "cuda" else False
    recipes = {r: TRAINING_RECIPES[r].describe() for r in config.recipes}
    out = {
        "recipes": recipes,
        "models": {},
        "runs": {},
        "histograms": {},
        "block_sweep": {},
        "block_scales": {},
        "delayed": {},
        "hardware": {
            "available": bool(hw_ok),
            "device": str(device),
            "reason": "" if hw_ok else "no CUDA GPU with FP8 tensor cores (compute capability ≥ 8.9)",
        },
    }
    for model_name in config.models:
        task = _Task(model_name, config, device)
        torch.manual_seed(config.seed)
        base = task.build()
        init_state = copy.deepcopy(base.state_dict())
        linears = [n for n, m in base.named_modules() if isinstance(m, nn.Linear)]
        out["models"][model_name] = {
            **task.info,
            "parameters": sum(p.numel() for p in base.parameters()),
            "linears": linears,
            "steps": task.steps,
        }
        runs = out["runs"][model_name] = {}
        for recipe in config.recipes:
            record = model_name == "lm" and recipe == "fp32"
            res, extras, _ = _train(task, init_state, recipe, recipe, config, run, record_fp32=record)
            runs[recipe] = res
            if record:
                out["histograms"] = extras["histograms"]
                last = extras["last"]
                by_role = {role: {layer: t[role] for layer, t in last.items() if role in t} for role in ROLES}
                out["block_sweep"] = {
                    role: block_size_sweep(ts, config.sweep_formats, config.block_sizes) for role, ts in by_role.items()
                }
                out["block_scales"] = {role: block_scale_comparison(ts) for role, ts in by_role.items()}
                if hw_ok:
                    out["hardware"]["gemm_check"] = _hardware_check(last, device)
            if "delayed" in extras and model_name == "lm":
                out["delayed"] = _delayed_summary(extras["delayed"], config, linears)
        if hw_ok:
            for recipe in HARDWARE_RECIPES:
                if recipe in config.recipes:
                    res, extras, _ = _train(task, init_state, recipe + "_hw", recipe, config, run, hardware=True)
                    runs[recipe + "_hw"] = res
                    recipes[recipe + "_hw"] = {**recipes[recipe], "label": recipes[recipe]["label"] + " (tensor cores)"}
    return out


EXPERIMENT = Experiment(NAME, Config, PROFILES, measure, FP8RecipesResult, __doc__, smoke=SMOKE)
run, config_for, main = EXPERIMENT.run, EXPERIMENT.config_for, EXPERIMENT.main

if __name__ == "__main__":
    run_main(EXPERIMENT)
