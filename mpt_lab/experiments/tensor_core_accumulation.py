"""A GPU's FP16 and FP8 matrix products against the exact prediction of each accumulator model, error against K.

For each K, random matrices A [m, K] and B [K, n] with entries uniform in [0, 1) (every product adds, so the
relative error of each output element is well defined and the accumulator's error is not hidden by
cancellation) are multiplied on the device and by :mod:`mpt_lab.accumulation`'s models, and each result is
compared with the exact product (float64, exact to far below the errors measured):

* **FP16** (A, B rounded to FP16): ``torch.matmul`` in float16 with
  ``torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction`` on and off (PyTorch's switch for
  reduced-precision reductions inside FP16 GEMMs, e.g. split-K), beside the models "FP32 accumulator" (exact
  products, sequential FP32 accumulation, the result rounded to FP16 as the GEMM writes it) and "FP16
  accumulator" (exact products accumulated in FP16);
* **FP8** (A, B rounded to E4M3, on a GPU with FP8 tensor cores, compute capability ≥ 8.9):
  ``torch._scaled_mm`` (through :mod:`mpt_lab._torch_internals`) with unit scales and an FP32 result, with
  ``use_fast_accum`` off and on, beside the models "FP32 accumulator", a 14-bit accumulator that rounds each
  addition toward zero (:data:`mpt_lab.accumulation.TENSOR_CORE_ACCUMULATOR`), DeepSeek-V3's description of
  the tensor core's accumulation (:func:`mpt_lab.accumulation.tensor_core_dot`, arXiv:2412.19437 §3.5.2) and
  the same with promotion to FP32 every 128 elements (§3.3.2).

With ``large_mn`` (the full profile: 1024), the device runs are repeated for m = n = ``large_mn`` outputs, against
the exact product computed in float64 on the device (the products of FP16 or FP8 values are exact in float64 and
their sums of K ≤ 16,384 terms in [0, 1) are off by less than 10⁻¹² relative, far below the errors measured); the
module's models are not (their exact predictions of 64 × 64 outputs already take most of the run on the host).
Every device run is profiled once (``torch.profiler``, :func:`mpt_lab.bench.profile_steps`) and the names of the
kernels it launched are kept (``kernels``): whether cuBLAS splits K across thread blocks (a split-K GEMM and its
reduction kernel) explains the error's shape against K (flat where the split keeps each partial sum short).

Without CUDA (the "quick" profile, and ``--smoke``) the FP16 product runs on the CPU (where the switch has no
effect), the FP8 rows are skipped with the reason recorded, and the "kernels" are the CPU's ATen operators: it
checks that the code runs, not the GPU.

    python -m mpt_lab.experiments.tensor_core_accumulation --profile full --out book/results/tensor_core_accumulation_full.json
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from .. import accumulation as acc
from .._torch_internals import scaled_mm
from ..bench import profile_calls
from ..device import describe
from ..formats import FP8_E4M3, FP16, round_to
from ..harness.runner import Experiment, ExperimentConfig, ExperimentResult, Run, run_main

__all__ = [
    "NAME",
    "Config",
    "PROFILES",
    "TensorCoreResult",
    "FP16_RUNS",
    "FP8_RUNS",
    "run",
    "config_for",
    "main",
    "EXPERIMENT",
]

NAME = "tensor_core_accumulation"
#: The FP16 rows: measured on the device ("device, ...") and predicted by the module ("model, ...").
FP16_RUNS = (
    "device, reduced-precision reduction on",
    "device, reduced-precision reduction off",
    "model, FP32 accumulator",
    "model, FP16 accumulator",
)
#: The FP8 rows.
FP8_RUNS = (
    "device, use_fast_accum off",
    "device, use_fast_accum on",
    "model, FP32 accumulator",
    "model, 14 bits per product, toward zero",
    "model, 14-bit tensor core (DeepSeek-V3)",
    "model, 14-bit + FP32 promotion every 128",
)


@dataclass
class Config(ExperimentConfig):
    """The lengths K (multiples of 128) and the output block m × n (multiples of 16, for FP8 tensor cores) of the
    products measured (:data:`PROFILES` holds each profile's values)."""

    ks: tuple = (256, 1024, 4096, 16384)
    m: int = 64  # output rows and columns (multiples of 16 for FP8 tensor cores)
    n: int = 64
    large_mn: int = 0  # also the device runs at m = n = large_mn (0: not), against float64 exact

    def validate(self) -> None:
        super().validate()
        self.check_positive("m", "n")
        if self.m % 16 or self.n % 16:
            raise ValueError(f"config.m and config.n must be multiples of 16, got {self.m} and {self.n}")
        self.check_positive("large_mn", minimum=0)
        if self.large_mn % 16:
            raise ValueError(f"config.large_mn must be a multiple of 16, got {self.large_mn}")
        if not self.ks or any(not isinstance(k, int) or k < 128 or k % 128 for k in self.ks):
            raise ValueError(f"config.ks must be multiples of 128, got {self.ks!r}")


#: quick and cpu: CPU checks that everything runs (≈ 1 s and ≈ 5 s).  full: one GPU; the time goes to the module's
#: exact predictions on the host's CPU (the FP16-accumulator model of 64 × 64 outputs, Σ K ≈ 32 k steps):
#: measured 17.6 s on an H100 80GB HBM3 (and 15.6 s on an H200).
PROFILES = {
    "quick": {"ks": (128, 512), "m": 16, "n": 16, "threads": 1},
    "cpu": {"ks": (256, 1024, 4096), "m": 16, "n": 16, "threads": 1},
    "full": {"ks": (256, 512, 1024, 2048, 4096, 8192, 16384), "m": 64, "n": 64, "large_mn": 1024},
}


@dataclass
class TensorCoreResult(ExperimentResult):
    """``ks``; ``fp16`` and ``fp8``: run name → {"median", "max"} relative errors over the outputs, per K
    (``fp8`` is {} with ``fp8_skipped`` saying why where there are no FP8 tensor cores); ``agreement``: per
    format, per device run, the share of outputs equal bit for bit to each model's prediction, per K;
    ``device_name``; ``large``: {"m", "n", "fp16": {device run: {"median", "max"} per K}, "fp8": likewise or {}}
    (empty without ``large_mn``); ``kernels``: {"MxN": {"fp16" | "fp8": {device run: {K: [kernel names]}}}}: what
    each device run launched (on a CPU its ATen operators).  Results saved before 2026-11-27 have neither."""

    ks: list
    fp16: dict
    fp8: dict
    fp8_skipped: str
    agreement: dict
    device_name: str
    large: dict = field(default_factory=dict)
    kernels: dict = field(default_factory=dict)

    def describe(self) -> str:
        k = self.ks[-1]
        parts = [f"FP16 at K = {k}: " + ", ".join(f"{r} {v['median'][-1]:.1e}" for r, v in self.fp16.items())]
        if self.fp8:
            parts.append("FP8: " + ", ".join(f"{r} {v['median'][-1]:.1e}" for r, v in self.fp8.items()))
        else:
            parts.append(f"FP8 skipped ({self.fp8_skipped})")
        return f"tensor_core_accumulation ({self.profile} profile, {self.device_name}): " + "; ".join(parts)


def _rel(got, exact) -> np.ndarray:
    return np.abs(np.asarray(got, dtype=np.float64) - exact) / np.abs(exact)


def _fp8_reason(device: torch.device) -> str:
    if device.type != "cuda":
        return "no CUDA device"
    if scaled_mm is None:
        return "this torch has no _scaled_mm"
    if torch.cuda.get_device_capability(device) < (8, 9):
        return "the GPU has no FP8 tensor cores (compute capability < 8.9)"
    return ""


def _fp16_product(a: torch.Tensor, b: torch.Tensor, device: torch.device, reduced: bool) -> torch.Tensor:
    """``a @ b`` of float16 tensors on ``device`` with reduced-precision reductions on or off (float16)."""
    flags = torch.backends.cuda.matmul
    before = flags.allow_fp16_reduced_precision_reduction
    try:
        flags.allow_fp16_reduced_precision_reduction = reduced
        return a @ b
    finally:
        flags.allow_fp16_reduced_precision_reduction = before


def _fp8_product(a: torch.Tensor, b: torch.Tensor, device: torch.device, fast: bool) -> torch.Tensor:
    """``torch._scaled_mm`` of E4M3 tensors (a row-major, b column-major) with unit scales and an FP32 result."""
    one = torch.ones((), dtype=torch.float32, device=device)
    return scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.float32, use_fast_accum=fast)


def _device_runs(operands: dict, device: torch.device, reason: str) -> tuple:
    """Every device run for every K of ``operands`` (K → (a16, b16, a8, b8) on the device; the FP8 ones None
    with a ``reason``), all in one profiler window (:func:`mpt_lab.bench.profile_calls`).  Returns
    ({"fp16" | "fp8": {run: {K: result as float32 on the device}}}, the same structure of kernel-name lists: what
    the product alone launched, the cast to float32 after it not included)."""
    calls = {}
    for K, (a16, b16, a8, b8) in operands.items():
        for r, reduced in zip(FP16_RUNS[:2], (True, False)):
            calls[f"fp16|{r}|{K}"] = lambda a=a16, b=b16, red=reduced: _fp16_product(a, b, device, red)
        if not reason:
            for r, fast in zip(FP8_RUNS[:2], (False, True)):
                calls[f"fp8|{r}|{K}"] = lambda a=a8, b=b8, f=fast: _fp8_product(a, b, device, f)
    got = profile_calls(calls, device)
    out = {"fp16": {r: {} for r in FP16_RUNS[:2]}, "fp8": {r: {} for r in FP8_RUNS[:2]} if not reason else {}}
    names = {"fp16": {r: {} for r in FP16_RUNS[:2]}, "fp8": {r: {} for r in FP8_RUNS[:2]} if not reason else {}}
    for label, d in got.items():
        fmt, r, K = label.split("|")
        out[fmt][r][int(K)] = d["result"].float()
        names[fmt][r][K] = d["kernels"]
    return out, names


def _operands(A: torch.Tensor, B: torch.Tensor, reason: str) -> tuple:
    """FP16 and (without a ``reason``) E4M3 operands of the float32 A [m, K] and B [K, n] on their device, each
    rounded to nearest even by :func:`mpt_lab.formats.round_to` (exact; no overflow in [0, 1)) and then stored in
    the dtype (an exact conversion): a row-major, b column-major for the FP8 product."""
    a8 = b8 = None
    if not reason:
        a8 = round_to(A, FP8_E4M3).to(torch.float8_e4m3fn)
        b8 = round_to(B, FP8_E4M3).t().contiguous().to(torch.float8_e4m3fn).t()
    return round_to(A, FP16).half(), round_to(B, FP16).half(), a8, b8


def _large(config: Config, device: torch.device, reason: str, kernels: dict, run: Run) -> dict:
    """The device runs at m = n = ``config.large_mn`` against the float64 product on the device, per K."""
    size = config.large_mn
    g = torch.Generator(device=device).manual_seed(config.seed + 1)
    operands = {}
    for K in run.bar(config.ks, desc=f"operands at {size} x {size}"):
        operands[K] = _operands(
            torch.rand(size, K, device=device, generator=g), torch.rand(K, size, device=device, generator=g), reason
        )
    runs, kernels[f"{size}x{size}"] = _device_runs(operands, device, reason)
    stats = {}
    for fmt, by_run in runs.items():
        if not by_run:  # FP8 where there are no FP8 tensor cores
            continue
        rows = {r: [] for r in by_run}
        for K, (a16, b16, a8, b8) in operands.items():
            a, b = (a16, b16) if fmt == "fp16" else (a8, b8)
            exact = a.double() @ b.double()
            for r in by_run:
                rows[r].append(((by_run[r][K].double() - exact).abs() / exact.abs()).flatten().cpu().numpy())
        stats[fmt] = _stats(rows)
    return {"m": size, "n": size, "fp16": stats["fp16"], "fp8": stats.get("fp8", {})}


def _stats(rows: dict) -> dict:
    return {
        r: {"median": [float(np.median(e)) for e in v], "max": [float(np.max(e)) for e in v]} for r, v in rows.items()
    }


def measure(config: Config, run: Run) -> dict:
    device = run.device
    rng = np.random.default_rng(config.seed)
    reason = _fp8_reason(device)
    fp16 = {r: [] for r in FP16_RUNS}
    fp8 = {r: [] for r in FP8_RUNS} if not reason else {}
    agree = {
        "fp16": {r: {m: [] for m in FP16_RUNS[2:]} for r in FP16_RUNS[:2]},
        "fp8": {r: {m: [] for m in FP8_RUNS[2:]} for r in FP8_RUNS[:2]} if not reason else {},
    }
    shape = f"{config.m}x{config.n}"
    mats = {}
    for K in config.ks:  # the operands of every K first (the same draws as before)
        A = rng.uniform(0.0, 1.0, (config.m, K)).astype(np.float32)
        B = rng.uniform(0.0, 1.0, (K, config.n)).astype(np.float32)
        mats[K] = (A, B)
    operands = {
        K: _operands(torch.from_numpy(A).to(device), torch.from_numpy(B).to(device), reason)
        for K, (A, B) in mats.items()
    }
    device_out, names = _device_runs(operands, device, reason)  # every device product, profiled once
    kernels = {shape: names}
    for K in run.bar(config.ks, desc="K"):
        A, B = mats[K]
        A16, B16 = round_to(A, FP16), round_to(B, FP16)
        exact = A16.astype(np.float64) @ B16.astype(np.float64)
        on, off = (device_out["fp16"][r][K].cpu().numpy() for r in FP16_RUNS[:2])
        out = {
            FP16_RUNS[0]: on,
            FP16_RUNS[1]: off,
            FP16_RUNS[2]: round_to(acc.matmul(A16, B16, accumulator="FP32", products="FP32"), FP16),
            FP16_RUNS[3]: acc.matmul(A16, B16, accumulator="FP16", products="FP32"),
        }
        for r, got in out.items():
            fp16[r].append(_rel(got, exact))
        for r in FP16_RUNS[:2]:
            for m in FP16_RUNS[2:]:
                agree["fp16"][r][m].append(float(np.mean(out[r] == out[m])))
        if reason:
            continue
        A8, B8 = round_to(A, FP8_E4M3), round_to(B, FP8_E4M3)
        exact8 = A8.astype(np.float64) @ B8.astype(np.float64)
        Bt = np.ascontiguousarray(B8.T)
        slow, fast = (device_out["fp8"][r][K].cpu().numpy() for r in FP8_RUNS[:2])
        out = {
            FP8_RUNS[0]: slow,
            FP8_RUNS[1]: fast,
            FP8_RUNS[2]: acc.matmul(A8, B8, accumulator="FP32", products="FP32"),
            FP8_RUNS[3]: acc.matmul(
                A8, B8, accumulator=acc.TENSOR_CORE_ACCUMULATOR, products="FP32", rounding="toward_zero"
            ),
            FP8_RUNS[4]: np.stack([acc.tensor_core_dot(row, Bt) for row in A8]),  # row by row: n × K each
            FP8_RUNS[5]: np.stack([acc.tensor_core_dot(row, Bt, promote_every=128) for row in A8]),
        }
        for r, got in out.items():
            fp8[r].append(_rel(got, exact8))
        for r in FP8_RUNS[:2]:
            for m in FP8_RUNS[2:]:
                agree["fp8"][r][m].append(float(np.mean(out[r] == out[m])))
    large = _large(config, device, reason, kernels, run) if config.large_mn else {}
    return {
        "ks": list(config.ks),
        "fp16": _stats(fp16),
        "fp8": _stats(fp8) if fp8 else {},
        "fp8_skipped": reason,
        "agreement": agree,
        "device_name": describe(device).split(" (")[0],
        "large": large,
        "kernels": kernels,
    }


#: ``--smoke``: the full profile cut to a few trials or steps (shapes unchanged).
SMOKE = {"ks": (256,), "threads": 1}

EXPERIMENT = Experiment(NAME, Config, PROFILES, measure, TensorCoreResult, __doc__, smoke=SMOKE)
run, config_for, main = EXPERIMENT.run, EXPERIMENT.config_for, EXPERIMENT.main

if __name__ == "__main__":
    run_main(EXPERIMENT)
