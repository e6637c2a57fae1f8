"""Benchmark: bytes per parameter of training with Adam in FP32, with AMP, and in BF16 with FP32 master weights,
against ZeRO's 16-byte accounting.

A stack of ``layers`` × ``Linear(width, width)`` (ReLU between; the full profile: 15 × 8192², 1.007 billion
parameters) trained for ``steps`` steps with Adam in each of :data:`mpt_lab.bench.MEMORY_MODES`
(:func:`mpt_lab.bench.memory_per_parameter`): "fp32"; "amp" (FP32 parameters, float16 autocast,
``torch.amp.GradScaler``); "bf16_master" (BF16 parameters and gradients, FP32 master copies updated by Adam).  On
CUDA the caching allocator's ``memory_allocated`` after the last step ("resident": parameters, gradients, master
copies, optimizer state) and ``max_memory_allocated`` since a reset before the model was built ("peak":
activations, autocast's casts and temporaries too), in bytes per parameter; beside them ZeRO's accounting of
mixed-precision Adam (Rajbhandari et al. 2020, §3.1): 2 + 2 + 4 + 4 + 4 = 16 bytes per parameter
(:data:`mpt_lab.bench.ZERO_BYTES_PER_PARAMETER`).

    python benchmarks/memory_per_parameter.py --profile full --out book/results/memory_per_parameter_full.json
    python benchmarks/memory_per_parameter.py --profile quick                     # CPU: a tiny stack, seconds

Run by the experiment runner (:mod:`mpt_lab.harness.benchmark`) and by the GPU slot
(``mpt_lab.harness.budget``: row ``memory_per_parameter``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from mpt_lab.bench import MEMORY_MODES, ZERO_BYTES_PER_PARAMETER, memory_per_parameter
from mpt_lab.harness.benchmark import Benchmark
from mpt_lab.harness.runner import ExperimentConfig, ExperimentResult, Run, run_main


@dataclass
class Config(ExperimentConfig):
    width: int = 8192
    layers: int = 15  # 15 × 8192 × 8193 = 1.007e9 parameters
    batch: int = 16
    steps: int = 2  # Adam's state exists from the first step
    modes: tuple = MEMORY_MODES

    def validate(self) -> None:
        super().validate()
        self.check_positive("width", "layers", "batch", "steps")
        self.check_choices("modes", MEMORY_MODES, subset=True)


PROFILES = {
    "quick": {"width": 64, "layers": 4, "batch": 4, "threads": 1},
    "cpu": {"width": 512, "layers": 8, "batch": 8, "threads": 1},
    "full": {},
}

#: ``--smoke``: the full profile's code on a stack a CPU holds (the full one needs 16 GB for FP32 Adam alone).
SMOKE = {"width": 128, "layers": 2, "batch": 4, "steps": 1}


@dataclass
class MemoryPerParameterResult(ExperimentResult):
    """``modes``: mode → :func:`mpt_lab.bench.memory_per_parameter`'s dict (parameters, optimizer,
    resident_per_parameter, peak_per_parameter, breakdown_per_parameter, …); ``zero``: ZeRO's bytes per
    parameter by item and their sum (16)."""

    modes: dict = field(default_factory=dict)
    zero: dict = field(default_factory=dict)

    def describe(self) -> str:
        parts = [
            f"{m}: resident {d['resident_per_parameter']:.2f}, peak {d['peak_per_parameter']:.2f} B/param"
            for m, d in self.modes.items()
        ]
        n = next(iter(self.modes.values()))["parameters"] if self.modes else 0
        return (
            f"memory per parameter ({self.profile} profile, {self.device}, {n:,} parameters): "
            + "; ".join(parts)
            + f"; ZeRO's accounting {self.zero.get('total')} B/param"
        )


def measure(config: Config, run: Run) -> dict:
    modes = {}
    for mode in run.bar(config.modes, desc="modes"):
        modes[mode] = memory_per_parameter(mode, config.width, config.layers, config.batch, config.steps, run.device)
        run.arm_done(mode, modes[mode])
        if run.device.type == "cuda":
            torch.cuda.empty_cache()
    return {
        "modes": modes,
        "zero": {
            **ZERO_BYTES_PER_PARAMETER,
            "total": sum(ZERO_BYTES_PER_PARAMETER.values()),
            "source": "Rajbhandari et al. 2020 (ZeRO), §3.1: 2Ψ + 2Ψ + KΨ = 16Ψ, K = 12",
        },
    }


BENCHMARK = Benchmark("memory_per_parameter", Config, PROFILES, measure, MemoryPerParameterResult, __doc__, smoke=SMOKE)
main = BENCHMARK.main

if __name__ == "__main__":
    run_main(BENCHMARK)
