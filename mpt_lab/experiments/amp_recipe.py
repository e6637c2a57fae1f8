"""The PyTorch AMP recipe: time, peak memory and throughput of FP32, FP16 autocast + GradScaler and BF16 autocast
on a stack of Linear layers.

The recipe (Carilli, "Automatic Mixed Precision", PyTorch recipes) trains ``num_layers`` ``Linear(width,
width)`` layers with ReLU between them (width 4096, 3 layers), MSE loss, SGD lr 0.001, 50 batches of random
data per epoch, 3 epochs, batch sizes 128, 256, 512 and 513 (multiples of 8 use tensor cores; 513 does not).
Three recipes (:data:`RECIPES`; the config's field and the rows' key for them are ``precisions`` and
``precision``):

- ``fp32``: default precision;
- ``fp16``: ``torch.autocast(device, dtype=torch.float16)`` with ``torch.amp.GradScaler``;
- ``bf16``: ``torch.autocast(device, dtype=torch.bfloat16)``, no scaler (bfloat16 has FP32's exponent range).

For each (recipe, batch size): the median time of an epoch (after warm-up epochs; CUDA-event timing on CUDA),
the peak tensor memory of one epoch that also builds the model and optimizer (``mpt_lab.bench.peak_memory``),
the achieved TFLOP/s counting ``6 · batch · width · width`` FLOPs per Linear per step (2 for the forward
product, 2 for the input gradient, 2 for the weight gradient; bias, ReLU, loss and optimizer are not counted,
and the first layer's input gradient, which autograd skips, is counted by convention), and that throughput as a
fraction of the measured matrix-multiply peak of the precision's dtype (``mpt_lab.bench.matmul_peak_tflops``).

On a CPU the recipe's size is far too slow in FP16 (no native float16 matrix kernel: ≈ 1–20 GFLOP/s against
≈ 80 for float32), so the "quick" and "cpu" profiles shrink the width and the number of batches; the result
records the measured per-dtype throughputs and the CPU's instruction-set flags (``provenance["cpu_flags"]``).

    python -m mpt_lab.experiments.amp_recipe --profile full --out book/results/amp_recipe_full.json
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..bench import matmul_peak_tflops, peak_memory, time_call
from ..device import cpu_kernels
from ..training import autocast_to, backward_step
from .runner import Experiment, ExperimentConfig, ExperimentResult, Run, run_main

__all__ = ["Config", "AmpRecipeResult", "PROFILES", "RECIPES", "RECIPE_CLAIM", "config_for", "run", "main",
           "make_model", "flops_per_step", "needs_scaler", "NAME"]

NAME = "amp_recipe"
#: The recipes: FP32; FP16 autocast + GradScaler; BF16 autocast (``config.precisions`` names which run).
RECIPES = ("fp32", "fp16", "bf16")
_DTYPE = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}

#: The recipe's claim (Carilli, PyTorch AMP recipe): "2–3× speed-up on Volta, Turing and Ampere GPUs".
RECIPE_CLAIM = "2–3× on tensor-core GPUs (Volta, Turing, Ampere); less on older GPUs"


@dataclass
class Config(ExperimentConfig):
    """The recipe's values are the defaults."""

    width: int = 4096                 # in_size = out_size
    num_layers: int = 3
    batch_sizes: tuple = (128, 256, 512, 513)
    num_batches: int = 50             # batches per epoch
    epochs: int = 3                   # timed epochs (median reported)
    warmup_epochs: int = 1            # untimed epochs before timing
    lr: float = 0.001
    precisions: tuple = RECIPES
    peak_n: int = 0                   # matrix size for the matmul peak; 0: max(width, 512)
    measure_memory: bool = True

    def validate(self) -> None:
        super().validate()
        self.check_positive("width", "num_layers", "num_batches", "epochs")
        self.check_positive("warmup_epochs", "peak_n", minimum=0)
        if not self.batch_sizes or any(not isinstance(b, int) or isinstance(b, bool) or b < 1
                                       for b in self.batch_sizes):
            raise ValueError(f"config.batch_sizes must be a non-empty sequence of ints ≥ 1, got {self.batch_sizes!r}")
        self.check_choices("precisions", RECIPES, subset=True)
        if "fp32" not in self.precisions:
            raise ValueError("config.precisions must include 'fp32' (the baseline of the speed-ups)")
        if not (isinstance(self.lr, (int, float)) and self.lr > 0):
            raise ValueError(f"config.lr must be a positive number, got {self.lr!r}")


PROFILES = {
    "quick": {"width": 256, "num_batches": 4, "epochs": 2, "warmup_epochs": 1, "threads": 1},
    "cpu": {"width": 384, "num_batches": 4, "epochs": 2, "warmup_epochs": 1, "threads": 1},
    "full": {"peak_n": 8192},
}

#: ``--smoke`` (:meth:`~mpt_lab.experiments.runner.Experiment.smoke_config`): the recipe's network, one timed
#: epoch of one batch (no warm-up) and the memory epoch, one batch size of 3 rows (the code is the same for every
#: batch size, and a float16 step of 512 rows at width 4096 takes minutes on a CPU without FP16 instructions:
#: ≈ 1 GFLOP/s), and a small matrix for the peak.
SMOKE = {"num_batches": 1, "epochs": 1, "warmup_epochs": 0, "batch_sizes": (3,), "peak_n": 256}


def flops_per_step(batch: int, width: int, num_layers: int) -> int:
    """FLOPs of one training step by the stated convention: ``6 · batch · width²`` per Linear (forward 2, input
    gradient 2, weight gradient 2), times ``num_layers``."""
    return 6 * batch * width * width * num_layers


def needs_scaler(dtype: torch.dtype) -> bool:
    """Whether autocast to ``dtype`` needs a loss scaler: True for ``torch.float16`` (its smallest subnormal is
    2⁻²⁴, so small gradients underflow: Micikevicius et al. 2018, §3.2), False for ``torch.bfloat16`` (FP32's
    8-bit exponent, the same range) and ``torch.float32``.  The recipe creates its GradScaler with
    ``enabled=needs_scaler(dtype)``.

    Raises TypeError for anything but one of those three dtypes.
    """
    if dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise TypeError(f"dtype must be torch.float16, torch.bfloat16 or torch.float32, got {dtype!r}")
    return dtype == torch.float16


def make_model(width: int, num_layers: int, device="cpu") -> torch.nn.Sequential:
    """The recipe's network: ``num_layers`` × ``Linear(width, width)`` with ReLU between them (none after the
    last), float32 parameters on ``device``."""
    layers = []
    for i in range(num_layers):
        layers.append(torch.nn.Linear(width, width))
        if i < num_layers - 1:
            layers.append(torch.nn.ReLU())
    return torch.nn.Sequential(*layers).to(device)


@dataclass
class AmpRecipeResult(ExperimentResult):
    """``rows``: one dict per (precision, batch): precision, batch, dtype, epoch_seconds (median), epoch_times,
    timer, peak_bytes (None when not measured), tflops, fraction_of_peak; ``speedup``: {precision: {batch:
    FP32 epoch time ÷ this precision's}}; ``matmul_tflops``: measured matrix-product peaks per dtype (TFLOP/s);
    ``note``: why the numbers look as they do on this device."""

    rows: list
    speedup: dict
    matmul_tflops: dict
    note: str = ""
    flops_convention: str = "6 * batch * width**2 FLOPs per Linear per step (forward + backward)"

    def row(self, precision: str, batch: int) -> dict:
        """The row measured at ``precision`` and ``batch``.  Raises KeyError when there is none."""
        for r in self.rows:
            if r["precision"] == precision and r["batch"] == batch:
                return r
        raise KeyError(f"no row for precision={precision!r}, batch={batch!r}")

    def describe(self) -> str:
        c = self.config
        best = {p: max(v.values()) for p, v in self.speedup.items() if v}
        return (f"AMP recipe ({self.profile} profile, {self.device}): {c['num_layers']} × Linear({c['width']}, "
                f"{c['width']}), {c['num_batches']} batches per epoch, median of {c['epochs']} epochs; best "
                "speed-up over FP32: " + ", ".join(f"{p} {v:.2f}×" for p, v in best.items()))


def _cpu_note(peaks: dict, kernels) -> str:
    """What the measured CPU peaks mean, from the kernels PyTorch ran (:class:`mpt_lab.device.CpuKernels`)."""
    g = {k: v * 1e3 for k, v in peaks.items()}
    s = (f"On this CPU a matrix product runs at {g.get('float32', math.nan):.1f} GFLOP/s in float32, "
         f"{g.get('bfloat16', math.nan):.1f} in bfloat16 and {g.get('float16', math.nan):.1f} in float16 "
         f"(measured; kernels: {kernels.describe()}).  ")
    s += ("bfloat16 runs on oneDNN's kernel, fast where the CPU has bfloat16 dot-product instructions "
          "(AVX-512 BF16 or AMX) and oneDNN may use them; " if kernels.onednn_bf16 else
          "bfloat16 is slow: oneDNN has no bfloat16 kernel here, so torch takes a generic path; ")
    s += ("float16 runs on oneDNN's kernel too (AVX-512 FP16 or AMX)." if kernels.onednn_fp16 else
          "float16 is slow because oneDNN has no float16 kernel here (a CPU without AVX-512 FP16 or AMX, or "
          "ONEDNN_MAX_CPU_ISA below them), so torch's float16 matrix products take a generic path that converts "
          "element by element.  A 'speed-up' below 1 is a slow-down on this machine; on a GPU both 16-bit types "
          "use tensor cores.  Sizes are shrunk from the recipe's 4096 to keep the CPU run short.")
    return s


def _train_epoch(model, opt, scaler, batches, precision: str, device: torch.device) -> None:
    for x, y in batches:
        with autocast_to(device.type, _DTYPE[precision]):
            out = model(x)                                     # Linear output in float16/bfloat16
            loss = torch.nn.functional.mse_loss(out, y)        # mse_loss autocasts to float32
        backward_step(loss, opt, scaler)
        opt.zero_grad(set_to_none=True)


def _make(config: Config, precision: str, device: torch.device):
    torch.manual_seed(config.seed)
    model = make_model(config.width, config.num_layers, device)
    opt = torch.optim.SGD(model.parameters(), lr=config.lr)
    scaler = torch.amp.GradScaler(device.type) if needs_scaler(_DTYPE[precision]) else None
    return model, opt, scaler


def measure(config: Config, run: Run) -> dict:
    """Time the recipe for every (precision, batch size) and measure the matmul peak of each dtype."""
    device = run.device
    peak_n = config.peak_n or max(config.width, 512)
    names = {p: str(_DTYPE[p]).replace("torch.", "") for p in config.precisions}
    peaks = {d: matmul_peak_tflops(device, getattr(torch, d), peak_n)
             for d in run.bar(sorted(set(names.values()), key=["float32", "float16", "bfloat16"].index),
                              desc="matmul peak")}
    rows = []
    combos = [(p, b) for b in config.batch_sizes for p in config.precisions]
    for precision, batch in run.bar(combos, desc="AMP recipe"):
        g = torch.Generator(device=device).manual_seed(config.seed + batch)
        batches = [(torch.randn(batch, config.width, device=device, generator=g),
                    torch.randn(batch, config.width, device=device, generator=g)) for _ in range(config.num_batches)]
        state = _make(config, precision, device)                   # model, optimizer, scaler
        timing = time_call(lambda: _train_epoch(*state, batches, precision, device),
                           repeat=config.epochs, warmup=config.warmup_epochs, device=device, timer="auto")
        state = None                                                 # free them before measuring memory
        peak = None
        if config.measure_memory:
            peak = peak_memory(lambda: _train_epoch(*_make(config, precision, device), batches, precision, device),
                               device)
        tflops = flops_per_step(batch, config.width, config.num_layers) * config.num_batches / timing.median / 1e12
        pk = peaks[names[precision]]
        rows.append({"precision": precision, "batch": batch, "dtype": names[precision],
                     "epoch_seconds": timing.median, "epoch_times": list(timing.times), "timer": timing.method,
                     "peak_bytes": peak, "tflops": tflops, "fraction_of_peak": tflops / pk if pk > 0 else math.nan})
    base = {r["batch"]: r["epoch_seconds"] for r in rows if r["precision"] == "fp32"}
    speedup = {p: {str(r["batch"]): base[r["batch"]] / r["epoch_seconds"] for r in rows if r["precision"] == p}
               for p in config.precisions if p != "fp32"}
    note = _cpu_note(peaks, cpu_kernels()) if device.type == "cpu" else (
        f"CUDA: float32 matmul TF32 allowed = {torch.backends.cuda.matmul.allow_tf32}; "
        "batch sizes that are multiples of 8 let float16/bfloat16 products use tensor cores fully.")
    return {"rows": rows, "speedup": speedup, "matmul_tflops": peaks, "note": note}


EXPERIMENT = Experiment(NAME, Config, PROFILES, measure, AmpRecipeResult, __doc__, smoke=SMOKE)
run, config_for, main = EXPERIMENT.run, EXPERIMENT.config_for, EXPERIMENT.main

if __name__ == "__main__":
    run_main(EXPERIMENT)
