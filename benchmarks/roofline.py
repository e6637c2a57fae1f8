"""Benchmark: a roofline of this device — matrix-product throughput per arithmetic and the memory bandwidth.

For each arithmetic of :data:`mpt_lab.bench.GEMM_KINDS` — FP32 (TF32 off), TF32, BF16, FP16 and FP8 E4M3
(``torch._scaled_mm`` with ``use_fast_accum`` off and on) — the TFLOP/s of square products n × n × n at
``sizes`` and of the ``shapes`` m × n × k (the AMP recipe's step multiplies a 512-row batch by 4096 × 4096
weights: ``512x4096x4096``), each the fastest of ``repeat`` timed batches (:func:`mpt_lab.bench.gemm_tflops`,
CUDA events); the bandwidth of a device-to-device copy of ``copy_mib`` MiB (:func:`mpt_lab.bench.copy_bandwidth`);
the GPU's SM clock, memory clock, power and temperature sampled while each runs (:class:`mpt_lab.bench.GpuSampler`:
``pynvml`` or ``nvidia-smi``, recorded as absent with the reason where neither is there).  Each product's
arithmetic intensity (FLOPs per byte of its operands and result) and, on a GPU of :data:`mpt_lab.bench.DATASHEET`,
its share of the datasheet's dense peak are recorded beside the measured TFLOP/s; ``ridge`` is where each
arithmetic's measured roof meets the measured copy bandwidth (FLOP per byte).

    python benchmarks/roofline.py --profile full --out book/results/roofline_full.json     # a GPU: ≈ 30 s
    python benchmarks/roofline.py --profile quick                                          # CPU: seconds

Run by the experiment runner (:mod:`mpt_lab.harness.benchmark`) and by the GPU slot
(``mpt_lab.harness.budget``: row ``roofline``); speed is reported, never asserted.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from mpt_lab.bench import GEMM_KINDS, GpuSampler, copy_bandwidth, datasheet_peaks, gemm_tflops
from mpt_lab.device import describe
from mpt_lab.harness.benchmark import Benchmark
from mpt_lab.harness.runner import ExperimentConfig, ExperimentResult, Run, run_main

#: Bytes of one element of each arithmetic's operands (FP8: E4M3 operands, a bfloat16 result).
OPERAND_BYTES = {"fp32": 4, "tf32": 4, "bf16": 2, "fp16": 2, "fp8": 1, "fp8_fast": 1}
RESULT_BYTES = {"fp32": 4, "tf32": 4, "bf16": 2, "fp16": 2, "fp8": 2, "fp8_fast": 2}
#: The datasheet's key of each arithmetic.
DATASHEET_KEY = {"fp32": "fp32", "tf32": "tf32", "bf16": "bf16", "fp16": "fp16", "fp8": "fp8", "fp8_fast": "fp8"}


def parse_shape(text: str) -> tuple:
    """ "MxNxK" → (m, n, k).  Raises ValueError for anything else."""
    parts = str(text).lower().split("x")
    if len(parts) != 3 or not all(p.isdigit() and int(p) > 0 for p in parts):
        raise ValueError(f"a shape must be MxNxK with positive integers, got {text!r}")
    return tuple(int(p) for p in parts)


@dataclass
class Config(ExperimentConfig):
    sizes: tuple = (4096, 8192, 16384)  # square products n × n × n
    shapes: tuple = ("512x4096x4096",)  # m × n × k products (the AMP recipe's batch of 512 at width 4096)
    kinds: tuple = GEMM_KINDS
    copy_mib: int = 1024  # MiB copied device to device for the bandwidth
    repeat: int = 5  # timed batches per product (the fastest is kept)
    min_seconds: float = 0.05  # each timed batch repeats the product for at least this long
    sample_interval: float = 0.05  # seconds between clock and power samples

    def validate(self) -> None:
        super().validate()
        self.check_positive("copy_mib", "repeat")
        if any(not isinstance(n, int) or n < 1 for n in self.sizes):
            raise ValueError(f"config.sizes must be ints ≥ 1, got {self.sizes!r}")
        for s in self.shapes:
            try:
                parse_shape(s)
            except ValueError as err:
                raise ValueError(f"config.shapes: {err}") from None
        self.check_choices("kinds", GEMM_KINDS, subset=True)
        if not self.min_seconds > 0 or not self.sample_interval > 0:
            raise ValueError("config.min_seconds and config.sample_interval must be > 0")


PROFILES = {
    "quick": {
        "sizes": (64, 128),
        "shapes": ("16x64x64",),
        "copy_mib": 4,
        "repeat": 2,
        "min_seconds": 0.005,
        "threads": 1,
    },
    "cpu": {
        "sizes": (256, 512),
        "shapes": ("64x512x512",),
        "copy_mib": 64,
        "repeat": 3,
        "min_seconds": 0.02,
        "threads": 1,
    },
    "full": {},
}

#: ``--smoke``: the full profile's code with one small product per arithmetic and a small copy.
SMOKE = {"sizes": (64,), "shapes": ("16x64x64",), "copy_mib": 4, "repeat": 1, "min_seconds": 0.001}


@dataclass
class RooflineResult(ExperimentResult):
    """``gemm``: one row per (arithmetic, shape): kind, m, n, k, tflops (None where the arithmetic does not exist
    here, with ``reason``), seconds, intensity (FLOP per byte of operands and result), fraction_of_datasheet
    (None without a datasheet), clocks (the sampler's summary while it ran); ``peaks``: kind → the best TFLOP/s
    measured; ``copy``: {nbytes, seconds, gb_s, clocks}; ``ridge``: kind → measured peak ÷ copy bandwidth (FLOP
    per byte); ``datasheet``: the GPU's published dense peaks or None; ``sampler``: the clocks' source, or why
    there is none; ``device_name``."""

    gemm: list = field(default_factory=list)
    peaks: dict = field(default_factory=dict)
    copy: dict = field(default_factory=dict)
    ridge: dict = field(default_factory=dict)
    datasheet: dict | None = None
    sampler: dict = field(default_factory=dict)
    device_name: str = ""

    def describe(self) -> str:
        peaks = ", ".join(f"{k} {v:.3g}" for k, v in self.peaks.items() if v)
        missing = [r["kind"] for r in self.gemm if r["tflops"] is None]
        return (
            f"roofline ({self.profile} profile, {self.device_name}): best TFLOP/s {peaks}; copy "
            f"{self.copy.get('gb_s', float('nan')):.3g} GB/s"
            + (f"; not here: {', '.join(sorted(set(missing)))}" if missing else "")
            + f"; clocks: {self.sampler.get('source') or self.sampler.get('absent')}"
        )


def _intensity(kind: str, m: int, n: int, k: int) -> float:
    moved = OPERAND_BYTES[kind] * (m * k + k * n) + RESULT_BYTES[kind] * m * n
    return 2.0 * m * n * k / moved


def measure(config: Config, run: Run) -> dict:
    device = run.device
    name = describe(device).split(" (")[0]
    sheet = datasheet_peaks(describe(device)) if device.type == "cuda" else None
    cases = [(kind, n, n, n) for n in config.sizes for kind in config.kinds]
    cases += [(kind, *parse_shape(s)) for s in config.shapes for kind in config.kinds]
    rows = []
    with GpuSampler(device.index or 0, config.sample_interval) as sampler:
        for kind, m, n, k in run.bar(cases, desc="GEMMs"):
            label = f"{kind} {m}x{n}x{k}"
            sampler.mark(label)
            row = gemm_tflops(kind, m, n, k, device, repeat=config.repeat, min_seconds=config.min_seconds)
            row["intensity"] = _intensity(kind, m, n, k)
            row["fraction_of_datasheet"] = (
                row["tflops"] / sheet[DATASHEET_KEY[kind]] if sheet and row["tflops"] is not None else None
            )
            row["clocks"] = sampler.summary(label)
            rows.append(row)
            if device.type == "cuda":
                torch.cuda.empty_cache()
        sampler.mark("copy")
        copy = copy_bandwidth(device, config.copy_mib * 2**20, repeat=config.repeat)
        copy["clocks"] = sampler.summary("copy")
    peaks = {
        kind: max((r["tflops"] for r in rows if r["kind"] == kind and r["tflops"]), default=None)
        for kind in config.kinds
    }
    ridge = {kind: p * 1e12 / (copy["gb_s"] * 1e9) for kind, p in peaks.items() if p}
    return {
        "gemm": rows,
        "peaks": peaks,
        "copy": copy,
        "ridge": ridge,
        "datasheet": sheet,
        "sampler": sampler.summary() if sampler.source else {"source": None, "absent": sampler.absent},
        "device_name": name,
    }


BENCHMARK = Benchmark("roofline", Config, PROFILES, measure, RooflineResult, __doc__, smoke=SMOKE)
main = BENCHMARK.main

if __name__ == "__main__":
    run_main(BENCHMARK)
