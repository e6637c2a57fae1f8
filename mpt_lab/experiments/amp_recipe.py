"""The PyTorch AMP recipe: time, peak memory and throughput of FP32, FP16 autocast + GradScaler and BF16 autocast
on a stack of Linear layers.

The recipe (Carilli, "Automatic Mixed Precision", PyTorch recipes) trains ``num_layers`` ``Linear(width,
width)`` layers with ReLU between them (width 4096, 3 layers), MSE loss, SGD lr 0.001, 50 batches of random
data per epoch, 3 epochs, batch sizes 128, 256, 512 and 513 (multiples of 8 use tensor cores; 513 does not).
Three recipes (:data:`RECIPES`, the registry's :data:`mpt_lab.recipes.AMP`; the config's field and the rows' key
for them are ``recipes`` and ``recipe``):

- ``fp32``: default precision;
- ``fp16``: ``torch.autocast(device, dtype=torch.float16)`` with ``torch.amp.GradScaler``;
- ``bf16``: ``torch.autocast(device, dtype=torch.bfloat16)``, no scaler (bfloat16 has FP32's exponent range).

For each (recipe, batch size), **the recipe's eager loop** (``rows``): the median time of an epoch (after warm-up
epochs; CUDA-event timing on CUDA), the peak tensor memory of one epoch that also builds the model and optimizer
(``mpt_lab.bench.peak_memory``), the achieved TFLOP/s and that throughput as a fraction of two peaks, both named:
the *measured* peak of the precision's dtype (``mpt_lab.bench.matmul_peak_tflops``, the best n × n product on
this device) and the *datasheet* peak of the GPU (``mpt_lab.bench.DATASHEET``, dense; None on other devices).
FLOPs are counted from the operators that run (``torch.utils.flop_counter.FlopCounterMode`` over one forward and
backward: the matrix products; bias, ReLU, loss and optimizer are not counted): the first layer's input
gradient is never computed (its input needs no gradient), so a step is 2·B·W² (forward) + 2·B·W² (weight
gradient) for the first Linear and 6·B·W² for each other one, 12.5 % fewer than 6·B·W² per Linear at 3 layers
(:func:`flops_per_step`, the convention of results saved before 2026-11-27: ``flops_convention`` says which).
With ``profile_steps``, a few steps of the same loop run under ``torch.profiler``
(:func:`mpt_lab.bench.profile_steps`): the host's time to issue one step, the share of the wall time the GPU is
busy, kernels per step and host read-backs per step (``torch.amp.GradScaler.step`` reads ``found_inf`` back with
``.item()`` unless the optimizer is fused).

**The same step limited by the GPU** (``graphed``, at ``graph_batches``; the issue of a host-bound loop): static
input buffers, ``SGD(fused=True)`` (so the scaler's ``found_inf`` stays on the device), the whole step —
forward, loss, backward, scaler, optimizer — captured once in a CUDA graph and replayed
(:class:`mpt_lab.training.StaticStep`); on a CPU the same step runs eagerly (``captured = "eager"``).  Time per
step, TFLOP/s, the same two fractions of peak, and its own profile.

On a CPU the recipe's size is far too slow in FP16 (no native float16 matrix kernel: ≈ 1–20 GFLOP/s against
≈ 80 for float32), so the "quick" and "cpu" profiles shrink the width and the number of batches; the result
records the measured per-dtype throughputs and the CPU's instruction-set flags (``provenance["cpu_flags"]``).

    python -m mpt_lab.experiments.amp_recipe --profile full --out book/results/amp_recipe_full.json
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from torch.utils.flop_counter import FlopCounterMode

from ..bench import datasheet_peaks, matmul_peak_tflops, peak_memory, profile_steps, time_call
from ..device import DeviceLike, cpu_kernels, describe
from ..harness.runner import Experiment, ExperimentConfig, ExperimentResult, Run, run_main
from ..recipes import AMP
from ..recipes import RECIPES as REGISTRY
from ..training import CAPTURES, StaticStep, autocast_to, backward_step

__all__ = [
    "Config",
    "AmpRecipeResult",
    "PROFILES",
    "RECIPES",
    "RECIPE_CLAIM",
    "config_for",
    "run",
    "main",
    "make_model",
    "flops_per_step",
    "counted_flops_per_step",
    "needs_scaler",
    "NAME",
    "COUNTED_FLOPS",
    "train_step",
]

NAME = "amp_recipe"
#: The recipes: FP32; FP16 autocast + GradScaler; BF16 autocast (``config.recipes`` names which run): the
#: registry's :data:`mpt_lab.recipes.AMP`.
RECIPES = AMP


def _dtype(recipe: str) -> torch.dtype:
    """The dtype ``recipe`` computes its matrix products in: its autocast dtype, float32 without autocast."""
    return REGISTRY[recipe].autocast or torch.float32


#: The recipe's claim (Carilli, PyTorch AMP recipe): "2–3× speed-up on Volta, Turing and Ampere GPUs".
RECIPE_CLAIM = "2–3× on tensor-core GPUs (Volta, Turing, Ampere); less on older GPUs"


@dataclass
class Config(ExperimentConfig):
    """The recipe's values are the defaults."""

    width: int = 4096  # in_size = out_size
    num_layers: int = 3
    batch_sizes: tuple = (128, 256, 512, 513)
    num_batches: int = 50  # batches per epoch
    epochs: int = 3  # timed epochs (median reported)
    warmup_epochs: int = 1  # untimed epochs before timing
    lr: float = 0.001
    recipes: tuple = RECIPES
    peak_n: int = 0  # matrix size for the matmul peak; 0: max(width, 512)
    measure_memory: bool = True
    profile_steps: int = 0  # eager steps run under torch.profiler per (recipe, batch); 0: none
    graph_batches: tuple = ()  # batch sizes of the GPU-limited variant (static buffers, fused SGD, graph)
    graph_steps: int = 10  # steps per timed repeat of the variant (median of `epochs` repeats)
    graph_pool: int = 4  # distinct batches copied into its static buffers in turn
    capture: str = "auto"  # the variant's mpt_lab.training.CAPTURES: a CUDA graph on CUDA

    def validate(self) -> None:
        super().validate()
        self.check_positive("width", "num_layers", "num_batches", "epochs")
        self.check_positive("warmup_epochs", "peak_n", "profile_steps", minimum=0)
        self.check_positive("graph_steps", "graph_pool")
        if any(not isinstance(b, int) or isinstance(b, bool) or b < 1 for b in self.graph_batches):
            raise ValueError(f"config.graph_batches must be ints ≥ 1, got {self.graph_batches!r}")
        self.check_choices("capture", CAPTURES)
        if not self.batch_sizes or any(
            not isinstance(b, int) or isinstance(b, bool) or b < 1 for b in self.batch_sizes
        ):
            raise ValueError(f"config.batch_sizes must be a non-empty sequence of ints ≥ 1, got {self.batch_sizes!r}")
        self.check_choices("recipes", RECIPES, subset=True)
        if "fp32" not in self.recipes:
            raise ValueError("config.recipes must include 'fp32' (the baseline of the speed-ups)")
        if not (isinstance(self.lr, (int, float)) and self.lr > 0):
            raise ValueError(f"config.lr must be a positive number, got {self.lr!r}")


PROFILES = {
    "quick": {"width": 256, "num_batches": 4, "epochs": 2, "warmup_epochs": 1, "threads": 1},
    "cpu": {"width": 384, "num_batches": 4, "epochs": 2, "warmup_epochs": 1, "threads": 1},
    # the recipe's eager loop at its batches, profiled; and the step limited by the GPU at 512, 2048 and 8192
    "full": {"peak_n": 8192, "profile_steps": 20, "graph_batches": (512, 2048, 8192)},
}

#: ``--smoke`` (:meth:`~mpt_lab.harness.runner.Experiment.smoke_config`): the recipe's network, one timed
#: epoch of one batch (no warm-up) and the memory epoch, one batch size of 3 rows (the code is the same for every
#: batch size, and a float16 step of 512 rows at width 4096 takes minutes on a CPU without FP16 instructions:
#: ≈ 1 GFLOP/s), two profiled steps, the GPU-limited variant at 3 rows for two steps, and a small matrix for
#: the peak.
SMOKE = {
    "num_batches": 1,
    "epochs": 1,
    "warmup_epochs": 0,
    "batch_sizes": (3,),
    "peak_n": 256,
    "profile_steps": 2,
    "graph_batches": (3,),
    "graph_steps": 2,
    "graph_pool": 1,
}

#: What ``flops_convention`` says of a result whose FLOPs are counted (:func:`counted_flops_per_step`).
COUNTED_FLOPS = (
    "counted by torch.utils.flop_counter.FlopCounterMode over one forward and backward (matrix "
    "products; the first layer's input gradient is not computed, so not counted)"
)


def flops_per_step(batch: int, width: int, num_layers: int) -> int:
    """FLOPs of one training step by the convention of the results saved before 2026-11-27: ``6 · batch ·
    width²`` per Linear (forward 2, input gradient 2, weight gradient 2), times ``num_layers``.  It counts the
    first layer's input gradient, which autograd never computes: 12.5 % too many at 3 layers
    (:func:`counted_flops_per_step` counts what runs)."""
    return 6 * batch * width * width * num_layers


def counted_flops_per_step(batch: int, width: int, num_layers: int) -> int:
    """FLOPs of one training step of the recipe's network (forward, MSE loss, backward; no optimizer) as the
    operators that run count them: ``torch.utils.flop_counter.FlopCounterMode`` over the step on the meta
    device (shapes only, nothing computed).  For L layers: (6L − 2) · batch · width², the first layer's input
    gradient being skipped by autograd.

    Raises ValueError for sizes < 1."""
    for name, v in (("batch", batch), ("width", width), ("num_layers", num_layers)):
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise ValueError(f"{name} must be an int ≥ 1, got {v!r}")
    model = make_model(width, num_layers, "meta")
    x, y = torch.empty(batch, width, device="meta"), torch.empty(batch, width, device="meta")
    with FlopCounterMode(display=False) as counter:
        torch.nn.functional.mse_loss(model(x), y).backward()
    return int(counter.get_total_flops())


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


def make_model(width: int, num_layers: int, device: DeviceLike = "cpu") -> torch.nn.Sequential:
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
    """``rows``: one dict per (recipe, batch) of the recipe's eager loop: recipe, batch, dtype,
    epoch_seconds (median), epoch_times, timer, peak_bytes (None when not measured), step_seconds (epoch ÷
    batches), flops_per_step, tflops, fraction_of_peak (of the measured peak ``matmul_tflops`` of its dtype),
    fraction_of_datasheet_peak (None without a ``datasheet``) and, when profiled, host_seconds_per_step,
    busy_fraction (None on a CPU), readbacks_per_step, kernels_per_step, sync_seconds_per_step; ``speedup``:
    {recipe: {batch: FP32 epoch time ÷ this recipe's}}; ``matmul_tflops``: measured matrix-product peaks
    per dtype (TFLOP/s); ``datasheet``: the GPU's published dense peaks (:func:`mpt_lab.bench.datasheet_peaks`)
    or None; ``graphed``: one dict per (recipe, batch) of the GPU-limited variant: recipe, batch,
    captured, step_seconds (median), step_times, flops_per_step, tflops, fraction_of_peak,
    fraction_of_datasheet_peak and its profile's host_seconds_per_step, busy_fraction, readbacks_per_step,
    kernels_per_step; ``graphed_speedup``: {recipe: {batch: FP32's graphed step time ÷ this one's}};
    ``note``: why the numbers look as they do on this device; ``flops_convention``: how FLOPs were counted
    (results saved before 2026-11-27: 6·B·W² per Linear; since: :data:`COUNTED_FLOPS`).

    Results saved before 2026-11-27 have no ``graphed``, ``datasheet`` and profile fields (they load with the
    defaults) and their ``tflops``/``fraction_of_peak`` use the 6·B·W² convention.  Results saved before the one
    recipe registry say ``precisions`` and ``precision`` (read as ``recipes`` and ``recipe``)."""

    rows: list
    speedup: dict
    matmul_tflops: dict
    note: str = ""
    flops_convention: str = "6 * batch * width**2 FLOPs per Linear per step (forward + backward)"
    datasheet: dict | None = None
    graphed: list = field(default_factory=list)
    graphed_speedup: dict = field(default_factory=dict)

    RENAMED_CONFIG = {"precisions": "recipes"}

    @classmethod
    def upgrade(cls, d: dict) -> dict:
        """A result saved before the one recipe registry: its rows' ``precision`` is read as ``recipe``."""
        d = {
            **d,
            **{
                k: [{("recipe" if f == "precision" else f): v for f, v in row.items()} for row in d[k]]
                for k in ("rows", "graphed")
                if isinstance(d.get(k), list)
            },
        }
        return super().upgrade(d)

    def row(self, recipe: str, batch: int, *, graphed: bool = False) -> dict:
        """The row of ``recipe`` at ``batch`` (of the GPU-limited variant with ``graphed``); KeyError if none."""
        for r in self.graphed if graphed else self.rows:
            if r["recipe"] == recipe and r["batch"] == batch:
                return r
        raise KeyError(f"no {'graphed ' if graphed else ''}row for recipe={recipe!r}, batch={batch!r}")

    def describe(self) -> str:
        c = self.config
        best = {p: max(v.values()) for p, v in self.speedup.items() if v}
        text = (
            f"AMP tutorial loop ({self.profile} profile, {self.device}): {c['num_layers']} × Linear({c['width']}, "
            f"{c['width']}), {c['num_batches']} batches per epoch, median of {c['epochs']} epochs; best "
            "speed-up over FP32: " + ", ".join(f"{p} {v:.2f}×" for p, v in best.items())
        )
        if self.graphed_speedup:
            gbest = {p: max(v.values()) for p, v in self.graphed_speedup.items() if v}
            text += f"; the step limited by the device ({self.graphed[0]['captured']}): best speed-up " + ", ".join(
                f"{p} {v:.2f}×" for p, v in gbest.items()
            )
        return text


def _cpu_note(peaks: dict, kernels) -> str:
    """What the measured CPU peaks mean, from the kernels PyTorch ran (:class:`mpt_lab.device.CpuKernels`)."""
    g = {k: v * 1e3 for k, v in peaks.items()}
    s = (
        f"On this CPU a matrix product runs at {g.get('float32', math.nan):.1f} GFLOP/s in float32, "
        f"{g.get('bfloat16', math.nan):.1f} in bfloat16 and {g.get('float16', math.nan):.1f} in float16 "
        f"(measured; kernels: {kernels.describe()}).  "
    )
    s += (
        "bfloat16 runs on oneDNN's kernel, fast where the CPU has bfloat16 dot-product instructions "
        "(AVX-512 BF16 or AMX) and oneDNN may use them; "
        if kernels.onednn_bf16
        else "bfloat16 is slow: oneDNN has no bfloat16 kernel here, so torch takes a generic path; "
    )
    s += (
        "float16 runs on oneDNN's kernel too (the CPU has AVX-512 FP16 or AVX-NE-CONVERT)."
        if kernels.onednn_fp16
        else "float16 is slow because oneDNN has no float16 kernel here (a CPU with neither AVX-512 FP16 "
        "nor AVX-NE-CONVERT, or ONEDNN_MAX_CPU_ISA below them), so torch's float16 matrix products take a generic path that converts "
        "element by element.  A 'speed-up' below 1 is a slow-down on this machine; on a GPU both 16-bit types "
        "use tensor cores.  Sizes are shrunk from the PyTorch AMP tutorial's 4096 to keep the CPU run short."
    )
    return s


def train_step(
    model: torch.nn.Module,
    opt: torch.optim.Optimizer,
    scaler: torch.amp.GradScaler | None,
    x: torch.Tensor,
    y: torch.Tensor,
    recipe: str,
    device: torch.device,
) -> None:
    """One step of the recipe's eager loop: forward and MSE loss under autocast to ``recipe``'s dtype (one of
    :data:`RECIPES`; none for "fp32"), backward and optimizer step through ``scaler`` (None: none), gradients set
    to None.  ``x``, ``y``: float32 [batch, width] on ``device``."""
    with autocast_to(device.type, _dtype(recipe)):
        out = model(x)  # Linear output in float16/bfloat16
        loss = torch.nn.functional.mse_loss(out, y)  # mse_loss autocasts to float32
    backward_step(loss, opt, scaler)
    opt.zero_grad(set_to_none=True)


def _train_epoch(model, opt, scaler, batches, recipe: str, device: torch.device) -> None:
    for x, y in batches:
        train_step(model, opt, scaler, x, y, recipe, device)


def _make(config: Config, recipe: str, device: torch.device, fused: bool = False):
    torch.manual_seed(config.seed)
    model = make_model(config.width, config.num_layers, device)
    opt = (
        torch.optim.SGD(model.parameters(), lr=config.lr, fused=True)
        if fused
        else torch.optim.SGD(model.parameters(), lr=config.lr)
    )
    scaler = torch.amp.GradScaler(device.type) if needs_scaler(_dtype(recipe)) else None
    return model, opt, scaler


_PEAK_KEY = {"fp32": "fp32", "fp16": "fp16", "bf16": "bf16"}  # the datasheet's key of each recipe (TF32 off)


def _rates(row: dict, flops: int, seconds: float, peak: float, datasheet: dict | None, recipe: str) -> None:
    """Fill ``row``'s flops_per_step, tflops and its two fractions of peak from the counted FLOPs of a step."""
    tflops = flops / seconds / 1e12
    row.update(
        flops_per_step=flops,
        tflops=tflops,
        fraction_of_peak=tflops / peak if peak > 0 else math.nan,
        fraction_of_datasheet_peak=tflops / datasheet[_PEAK_KEY[recipe]] if datasheet else None,
    )


def _profiled(profile: dict) -> dict:
    return {
        "host_seconds_per_step": profile["host_seconds_per_step"],
        "busy_fraction": profile["busy_fraction"],
        "readbacks_per_step": profile["readbacks_per_step"],
        "kernels_per_step": profile["kernels_per_step"],
        "sync_seconds_per_step": profile["sync_seconds"] / profile["steps"],
        "kernels": profile["kernels"],
    }


def _graphed(
    config: Config, recipe: str, batch: int, device: torch.device, flops: int, peaks: dict, names: dict, datasheet
) -> dict:
    """The GPU-limited step (see the module docstring) at ``batch``: time per step, rates, its profile."""
    g = torch.Generator(device=device).manual_seed(config.seed + batch)
    pool = [
        (
            torch.randn(batch, config.width, device=device, generator=g),
            torch.randn(batch, config.width, device=device, generator=g),
        )
        for _ in range(config.graph_pool)
    ]
    model, opt, scaler = _make(config, recipe, device, fused=True)
    step = StaticStep(
        model, torch.nn.functional.mse_loss, opt, *pool[0], dtype=_dtype(recipe), scaler=scaler, capture=config.capture
    )

    def steps():
        for i in range(config.graph_steps):
            step(*pool[i % len(pool)])

    timing = time_call(steps, repeat=config.epochs, warmup=1, device=device, timer="auto")
    row = {
        "recipe": recipe,
        "batch": batch,
        "captured": step.captured,
        "step_seconds": timing.median / config.graph_steps,
        "step_times": [t / config.graph_steps for t in timing.times],
        "timer": timing.method,
    }
    _rates(row, flops, row["step_seconds"], peaks[names[recipe]], datasheet, recipe)
    if config.profile_steps:
        counter = iter(range(10**9))
        row.update(
            _profiled(
                profile_steps(
                    lambda: step(*pool[next(counter) % len(pool)]),
                    min(config.profile_steps, config.graph_steps),
                    device,
                )
            )
        )
    return row


def measure(config: Config, run: Run) -> dict:
    """Time the recipe for every (recipe, batch size), profile it, measure the matmul peak of each dtype, and
    time the GPU-limited variant."""
    device = run.device
    peak_n = config.peak_n or max(config.width, 512)
    names = {p: str(_dtype(p)).replace("torch.", "") for p in config.recipes}
    peaks = {
        d: matmul_peak_tflops(device, getattr(torch, d), peak_n)
        for d in run.bar(sorted(set(names.values()), key=["float32", "float16", "bfloat16"].index), desc="matmul peak")
    }
    datasheet = datasheet_peaks(describe(device)) if device.type == "cuda" else None
    counted = {}
    rows = []
    combos = [(p, b) for b in config.batch_sizes for p in config.recipes]
    for recipe, batch in run.bar(combos, desc="AMP tutorial loop"):
        g = torch.Generator(device=device).manual_seed(config.seed + batch)
        batches = [
            (
                torch.randn(batch, config.width, device=device, generator=g),
                torch.randn(batch, config.width, device=device, generator=g),
            )
            for _ in range(config.num_batches)
        ]
        state = _make(config, recipe, device)  # model, optimizer, scaler
        timing = time_call(
            lambda: _train_epoch(*state, batches, recipe, device),
            repeat=config.epochs,
            warmup=config.warmup_epochs,
            device=device,
            timer="auto",
        )
        profiled = {}
        if config.profile_steps:
            counter = iter(range(10**9))

            def one_step():
                x, y = batches[next(counter) % len(batches)]
                train_step(*state, x, y, recipe, device)

            profiled = _profiled(profile_steps(one_step, config.profile_steps, device))
        state = None  # free them before measuring memory
        peak = None
        if config.measure_memory:
            peak = peak_memory(lambda: _train_epoch(*_make(config, recipe, device), batches, recipe, device), device)
        if batch not in counted:
            counted[batch] = counted_flops_per_step(batch, config.width, config.num_layers)
        row = {
            "recipe": recipe,
            "batch": batch,
            "dtype": names[recipe],
            "epoch_seconds": timing.median,
            "epoch_times": list(timing.times),
            "timer": timing.method,
            "peak_bytes": peak,
            "step_seconds": timing.median / config.num_batches,
        }
        _rates(row, counted[batch], row["step_seconds"], peaks[names[recipe]], datasheet, recipe)
        row.update(profiled)
        rows.append(row)
        run.arm_done(f"eager {recipe}, batch {batch}", row)
    base = {r["batch"]: r["epoch_seconds"] for r in rows if r["recipe"] == "fp32"}
    speedup = {
        p: {str(r["batch"]): base[r["batch"]] / r["epoch_seconds"] for r in rows if r["recipe"] == p}
        for p in config.recipes
        if p != "fp32"
    }
    graphed = []
    gcombos = [(p, b) for b in config.graph_batches for p in config.recipes]
    for recipe, batch in run.bar(gcombos, desc="GPU-limited step"):
        if batch not in counted:
            counted[batch] = counted_flops_per_step(batch, config.width, config.num_layers)
        graphed.append(_graphed(config, recipe, batch, device, counted[batch], peaks, names, datasheet))
        run.arm_done(f"graphed {recipe}, batch {batch}", graphed[-1])
    gbase = {r["batch"]: r["step_seconds"] for r in graphed if r["recipe"] == "fp32"}
    graphed_speedup = {
        p: {str(r["batch"]): gbase[r["batch"]] / r["step_seconds"] for r in graphed if r["recipe"] == p}
        for p in config.recipes
        if p != "fp32" and graphed
    }
    note = (
        _cpu_note(peaks, cpu_kernels())
        if device.type == "cpu"
        else (
            f"CUDA: float32 matmul TF32 allowed = {torch.backends.cuda.matmul.allow_tf32}; "
            "batch sizes that are multiples of 8 let float16/bfloat16 products use tensor cores fully."
        )
    )
    return {
        "rows": rows,
        "speedup": speedup,
        "matmul_tflops": peaks,
        "note": note,
        "flops_convention": COUNTED_FLOPS,
        "datasheet": datasheet,
        "graphed": graphed,
        "graphed_speedup": graphed_speedup,
    }


EXPERIMENT = Experiment(NAME, Config, PROFILES, measure, AmpRecipeResult, __doc__, smoke=SMOKE)
run, config_for, main = EXPERIMENT.run, EXPERIMENT.config_for, EXPERIMENT.main

if __name__ == "__main__":
    run_main(EXPERIMENT)
