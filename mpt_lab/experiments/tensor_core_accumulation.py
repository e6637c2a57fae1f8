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

Without CUDA (the "quick" profile, and ``--smoke``) the FP16 product runs on the CPU (where the switch has no
effect) and the FP8 rows are skipped with the reason recorded: it checks that the code runs, not the GPU.

    python -m mpt_lab.experiments.tensor_core_accumulation --profile full --out book/results/tensor_core_accumulation_full.json
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from .. import accumulation as acc
from ..formats import FP8_E4M3, FP16, round_to
from .runner import Experiment, ExperimentConfig, ExperimentResult, Run, run_main

__all__ = ["NAME", "Config", "PROFILES", "TensorCoreResult", "FP16_RUNS", "FP8_RUNS", "run", "config_for", "main",
           "EXPERIMENT"]

NAME = "tensor_core_accumulation"
#: The FP16 rows: measured on the device ("device, ...") and predicted by the module ("model, ...").
FP16_RUNS = ("device, reduced-precision reduction on", "device, reduced-precision reduction off",
             "model, FP32 accumulator", "model, FP16 accumulator")
#: The FP8 rows.
FP8_RUNS = ("device, use_fast_accum off", "device, use_fast_accum on", "model, FP32 accumulator",
            "model, 14 bits per product, toward zero", "model, 14-bit tensor core (DeepSeek-V3)",
            "model, 14-bit + FP32 promotion every 128")


@dataclass
class Config(ExperimentConfig):
    """The lengths K (multiples of 128) and the output block m × n (multiples of 16, for FP8 tensor cores) of the
    products measured (:data:`PROFILES` holds each profile's values)."""

    ks: tuple = (256, 1024, 4096, 16384)
    m: int = 64                        # output rows and columns (multiples of 16 for FP8 tensor cores)
    n: int = 64

    def validate(self) -> None:
        super().validate()
        self.check_positive("m", "n")
        if self.m % 16 or self.n % 16:
            raise ValueError(f"config.m and config.n must be multiples of 16, got {self.m} and {self.n}")
        if not self.ks or any(not isinstance(k, int) or k < 128 or k % 128 for k in self.ks):
            raise ValueError(f"config.ks must be multiples of 128, got {self.ks!r}")


#: quick and cpu: CPU checks that everything runs (≈ 1 s and ≈ 5 s).  full: one GPU; the time goes to the module's
#: exact predictions on the host's CPU (the FP16-accumulator model of 64 × 64 outputs, Σ K ≈ 32 k steps):
#: measured 17.6 s on an H100 80GB HBM3 (and 15.6 s on an H200).
PROFILES = {
    "quick": {"ks": (128, 512), "m": 16, "n": 16, "threads": 1},
    "cpu": {"ks": (256, 1024, 4096), "m": 16, "n": 16, "threads": 1},
    "full": {"ks": (256, 512, 1024, 2048, 4096, 8192, 16384), "m": 64, "n": 64},
}


@dataclass
class TensorCoreResult(ExperimentResult):
    """``ks``; ``fp16`` and ``fp8``: run name → {"median", "max"} relative errors over the outputs, per K
    (``fp8`` is {} with ``fp8_skipped`` saying why where there are no FP8 tensor cores); ``agreement``: per
    format, per device run, the share of outputs equal bit for bit to each model's prediction, per K;
    ``device_name``."""

    ks: list
    fp16: dict
    fp8: dict
    fp8_skipped: str
    agreement: dict
    device_name: str

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
    from .._torch_internals import scaled_mm

    if device.type != "cuda":
        return "no CUDA device"
    if scaled_mm is None:
        return "this torch has no _scaled_mm"
    if torch.cuda.get_device_capability(device) < (8, 9):
        return "the GPU has no FP8 tensor cores (compute capability < 8.9)"
    return ""


def _fp16_device(A: np.ndarray, B: np.ndarray, device: torch.device, reduced: bool) -> np.ndarray:
    a = torch.from_numpy(A).to(device, torch.float16)
    b = torch.from_numpy(B).to(device, torch.float16)
    flags = torch.backends.cuda.matmul
    before = flags.allow_fp16_reduced_precision_reduction
    try:
        flags.allow_fp16_reduced_precision_reduction = reduced
        c = a @ b
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    finally:
        flags.allow_fp16_reduced_precision_reduction = before
    return c.float().cpu().numpy()


def _fp8_device(A: np.ndarray, B: np.ndarray, device: torch.device, fast: bool) -> np.ndarray:
    from .._torch_internals import scaled_mm

    a = torch.from_numpy(A).to(device).to(torch.float8_e4m3fn)                    # row-major
    b = torch.from_numpy(B).to(device).t().contiguous().to(torch.float8_e4m3fn).t()  # column-major
    one = torch.ones((), dtype=torch.float32, device=device)
    c = scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.float32, use_fast_accum=fast)
    torch.cuda.synchronize(device)
    return c.cpu().numpy()


def _stats(rows: dict) -> dict:
    return {r: {"median": [float(np.median(e)) for e in v], "max": [float(np.max(e)) for e in v]}
            for r, v in rows.items()}


def measure(config: Config, run: Run) -> dict:
    device = run.device
    rng = np.random.default_rng(config.seed)
    reason = _fp8_reason(device)
    fp16 = {r: [] for r in FP16_RUNS}
    fp8 = {r: [] for r in FP8_RUNS} if not reason else {}
    agree = {"fp16": {r: {m: [] for m in FP16_RUNS[2:]} for r in FP16_RUNS[:2]},
             "fp8": {r: {m: [] for m in FP8_RUNS[2:]} for r in FP8_RUNS[:2]} if not reason else {}}
    for K in run.bar(config.ks, desc="K"):
        A = rng.uniform(0.0, 1.0, (config.m, K)).astype(np.float32)
        B = rng.uniform(0.0, 1.0, (K, config.n)).astype(np.float32)
        A16, B16 = round_to(A, FP16), round_to(B, FP16)
        exact = A16.astype(np.float64) @ B16.astype(np.float64)
        out = {FP16_RUNS[0]: _fp16_device(A16, B16, device, True),
               FP16_RUNS[1]: _fp16_device(A16, B16, device, False),
               FP16_RUNS[2]: round_to(acc.matmul(A16, B16, accumulator="FP32", products="FP32"), FP16),
               FP16_RUNS[3]: acc.matmul(A16, B16, accumulator="FP16", products="FP32")}
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
        out = {FP8_RUNS[0]: _fp8_device(A8, B8, device, False), FP8_RUNS[1]: _fp8_device(A8, B8, device, True),
               FP8_RUNS[2]: acc.matmul(A8, B8, accumulator="FP32", products="FP32"),
               FP8_RUNS[3]: acc.matmul(A8, B8, accumulator=acc.TENSOR_CORE_ACCUMULATOR, products="FP32",
                                       rounding="toward_zero"),
               FP8_RUNS[4]: np.stack([acc.tensor_core_dot(row, Bt) for row in A8]),   # row by row: n × K each
               FP8_RUNS[5]: np.stack([acc.tensor_core_dot(row, Bt, promote_every=128) for row in A8])}
        for r, got in out.items():
            fp8[r].append(_rel(got, exact8))
        for r in FP8_RUNS[:2]:
            for m in FP8_RUNS[2:]:
                agree["fp8"][r][m].append(float(np.mean(out[r] == out[m])))
    from ..device import describe

    return {"ks": list(config.ks), "fp16": _stats(fp16), "fp8": _stats(fp8) if fp8 else {}, "fp8_skipped": reason,
            "agreement": agree, "device_name": describe(device).split(" (")[0]}


#: ``--smoke``: the full profile cut to a few trials or steps (shapes unchanged).
SMOKE = {"ks": (256,), "threads": 1}

EXPERIMENT = Experiment(NAME, Config, PROFILES, measure, TensorCoreResult, __doc__, smoke=SMOKE)
run, config_for, main = EXPERIMENT.run, EXPERIMENT.config_for, EXPERIMENT.main

if __name__ == "__main__":
    run_main(EXPERIMENT)
