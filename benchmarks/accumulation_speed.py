"""Benchmark: mpt_lab.accumulation.matmul (every product and addition rounded) against a float32 matmul.

The issue's goal: a simulated FP16-accumulated matrix product (256×1024)@(1024×256) within 30× the time of a
float32 matrix product of the same shape, on one CPU thread.  Each row times, in one process and one thread:

* ``float32``: ``A32 @ B32`` (torch's float32 matmul, the reference);
* ``simulated``: ``mpt_lab.accumulation.matmul(A, B, **kw)`` on the same values, for each configuration in
  :data:`CONFIGS` (the first, FP16 products accumulated sequentially in FP16, is the goal's).

* ``simulated_float32_inputs``: the same call on float32 operands that are not FP16 values (the same standard
  normal numbers before they were rounded to FP16), whose products take another path (issue 29: a general path
  within 3× of the FP16-valued one).

The ``simulated`` inputs are FP16 values (standard normal numbers rounded to FP16), as a tensor-core FP16 GEMM
has them; the three calls are interleaved (float32, simulated, simulated on float32 inputs, float32, ...) after
one untimed call of each (:func:`mpt_lab.bench.interleaved`), so that background load affects them alike; a row
reports the median of ``repeat`` times of each and their ratios.  The machine's load average is recorded at the
start and the end: on a shared machine the ratios are noisy.

mptorch (a PyTorch library for simulating low-precision arithmetic, mptorch on GitHub) would be the other
simulator to time beside it; ``pip install mptorch`` finds no distribution on the package registry used
here, so it is not measured (``mptorch`` in the result says so).

    python benchmarks/accumulation_speed.py --profile cpu              # prints the table
    python benchmarks/accumulation_speed.py --profile cpu --out book/results/accumulation_speed_cpu.json

Profiles: "quick" (an (8×64)@(64×8) product, two repeats: seconds, for the tests) and "cpu" (the goal's shape,
(256×1024)@(1024×256), five repeats, one thread).  The arithmetic runs on the CPU (``device`` is "cpu").

Run by the experiment runner (:mod:`mpt_lab.harness.benchmark`): the JSON holds ``config`` (``shape`` [M, K,
N], ``repeat``, ``seed``, ``threads``, ...), ``provenance`` (command, device, versions, date, config),
``load_average`` (1-minute load at the start and the end), ``rows`` (one dict per configuration: name, keywords,
float32_s, simulated_s, ratio — medians of wall-clock times — float32_cpu_s, simulated_cpu_s, cpu_ratio — the
same in CPU time — and every wall-clock time; for the float32 operands simulated_float32_inputs_s and
_cpu_s, their times, and inputs_ratio, inputs_cpu_ratio: their medians over the FP16-valued ones), ``summary``
(the goal row's ratio by wall clock and by CPU time), ``goal`` (the first row's ratios against the issue's
30×, judged on wall-clock time), ``general_path`` (goal 3×, every row's inputs ratio by wall clock and CPU time,
and in how many rows each is within the goal), ``inputs`` (what A and B hold) and ``mptorch``.
"""

from __future__ import annotations

import os
import statistics
from dataclasses import dataclass, field

import torch

from mpt_lab import accumulation
from mpt_lab.bench import interleaved
from mpt_lab.formats import FloatFormat
from mpt_lab.harness.benchmark import Benchmark, TimingTable
from mpt_lab.harness.runner import ExperimentConfig, Run, run_main

GOAL = 30.0
#: Issue 29, item 7: float32 operands (products rounded to the products format) within this factor of FP16 values.
GENERAL_GOAL = 3.0
#: A tensor-core-like narrow accumulator: 8 exponent bits, 13 stored mantissa bits (14 bits of precision).
NARROW = FloatFormat("FP22", 8, 13, 127, source="a 14-bit-precision accumulator")
#: name → keywords of :func:`mpt_lab.accumulation.matmul`; the first row is the issue's goal.
CONFIGS = {
    "FP16 accumulator, sequential": {"accumulator": "FP16"},
    "FP32 accumulator, sequential": {"accumulator": "FP32"},
    "BF16 accumulator, sequential": {"accumulator": "BF16"},
    "FP16 accumulator, pairwise": {"accumulator": "FP16", "order": "pairwise"},
    "FP16 accumulator, Kahan": {"accumulator": "FP16", "compensated": True},
    "14-bit accumulator toward zero, FP32 products, blocked 128": {
        "accumulator": NARROW,
        "products": "FP32",
        "order": "blocked",
        "block_size": 128,
        "rounding": "toward_zero",
    },
}
GOAL_ROW = next(iter(CONFIGS))
INPUTS = {
    "simulated": "standard normal values rounded to FP16 (torch.float16)",
    "simulated_float32_inputs": "the same standard normal values before rounding (torch.float32)",
}
MPTORCH = {
    "measured": False,
    "why": "pip install mptorch: no matching distribution on the package registry (checked 2026-11-26)",
}


def _jsonable(kw: dict) -> dict:
    return {k: (v.name if isinstance(v, FloatFormat) else v) for k, v in kw.items()}


@dataclass
class Config(ExperimentConfig):
    device: str = "cpu"  # the arithmetic is timed on the CPU
    shape: tuple = (256, 1024, 256)  # (M, K, N): (M×K)@(K×N)
    repeat: int = 5  # timed calls of each (the median is kept)

    def validate(self) -> None:
        super().validate()
        self.check_positive("repeat")
        self.check_choices("device", ("cpu",))
        s = self.shape
        if not (
            isinstance(s, (tuple, list))
            and len(s) == 3
            and all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in s)
        ):
            raise ValueError(f"config.shape must be three ints ≥ 1 (M, K, N), got {s!r}")


PROFILES = {"quick": {"shape": (8, 64, 8), "repeat": 2, "threads": 1}, "cpu": {"threads": 1}}


@dataclass
class AccumulationSpeedResult(TimingTable):
    """``load_average`` (1-minute load at the start and the end), ``rows`` (one dict per configuration, see the
    module docstring), ``summary`` (the goal row's ratio by wall clock and by CPU time), ``goal`` (row, ratio,
    cpu_ratio, goal, met: the first row against the issue's 30×, on wall-clock time), ``inputs`` and
    ``mptorch`` (measured: False, and why)."""

    SUMMARY = GOAL_ROW + ", {key}: {ratio:.1f}× a float32 matmul"

    goal: dict = field(default_factory=dict)
    general_path: dict = field(default_factory=dict)
    inputs: dict = field(default_factory=lambda: dict(INPUTS))
    mptorch: dict = field(default_factory=lambda: dict(MPTORCH))

    def row_text(self, r: dict) -> str:
        text = (
            f"{r['name']:60s} float32 {r['float32_s'] * 1e3:8.2f} ms  simulated {r['simulated_s'] * 1e3:9.1f} ms"
            f"  ratio {r['ratio']:7.1f} (CPU time: {r['cpu_ratio']:7.1f})"
        )
        if "inputs_ratio" in r:  # results saved before issue 29 timed FP16-valued inputs only
            text += (
                f"\n{'':60s} float32 operands {r['simulated_float32_inputs_s'] * 1e3:9.1f} ms: "
                f"{r['inputs_ratio']:.2f}× the FP16-valued ones (CPU time: {r['inputs_cpu_ratio']:.2f}×)"
            )
        return text

    def describe(self) -> str:
        g, lines = self.goal, [super().describe()]
        lines.append(f"goal ≤ {g['goal']:.0f}× by wall clock: {'met' if g['met'] else 'not met'}")
        if self.general_path:
            p = self.general_path
            lines.append(
                f"float32 operands ≤ {p['goal']:.0f}× FP16 values: by wall clock in {p['met_wall']} of "
                f"{len(p['rows'])} rows, by CPU time in {p['met_cpu']}"
            )
        lines.append(f"mptorch: not measured ({self.mptorch['why']})")
        return "\n".join(lines)


def measure(config: Config, run: Run) -> dict:
    """Measure every row of :data:`CONFIGS` (see the module docstring)."""
    load_start = os.getloadavg()[0]
    m, k, n = config.shape
    g = torch.Generator().manual_seed(config.seed)
    F32A = torch.randn(m, k, generator=g)
    F32B = torch.randn(k, n, generator=g)
    A, B = F32A.half(), F32B.half()
    A32, B32 = A.float(), B.float()
    rows = []
    for name, kw in run.bar(CONFIGS.items(), desc="accumulation.matmul against float32", total=len(CONFIGS)):
        times = interleaved(
            {
                "float32": lambda: A32 @ B32,
                "simulated": lambda kw=kw: accumulation.matmul(A, B, **kw),
                "simulated_float32_inputs": lambda kw=kw: accumulation.matmul(F32A, F32B, **kw),
            },
            config.repeat,
        )
        (t32, c32), (tsim, csim) = times["float32"], times["simulated"]
        tf, cf = times["simulated_float32_inputs"]
        row = {
            "name": name,
            "keywords": _jsonable(kw),
            "float32_s": statistics.median(t32),
            "simulated_s": statistics.median(tsim),
            "float32_cpu_s": statistics.median(c32),
            "simulated_cpu_s": statistics.median(csim),
            "float32_times_s": t32,
            "simulated_times_s": tsim,
            "simulated_float32_inputs_s": statistics.median(tf),
            "simulated_float32_inputs_cpu_s": statistics.median(cf),
            "simulated_float32_inputs_times_s": tf,
        }
        row["ratio"] = row["simulated_s"] / row["float32_s"]
        row["cpu_ratio"] = row["simulated_cpu_s"] / row["float32_cpu_s"]
        row["inputs_ratio"] = row["simulated_float32_inputs_s"] / row["simulated_s"]
        row["inputs_cpu_ratio"] = row["simulated_float32_inputs_cpu_s"] / row["simulated_cpu_s"]
        rows.append(row)
    first = rows[0]
    general = {
        "goal": GENERAL_GOAL,
        "rows": {r["name"]: {"ratio": r["inputs_ratio"], "cpu_ratio": r["inputs_cpu_ratio"]} for r in rows},
    }
    general["met_wall"] = sum(r["inputs_ratio"] <= GENERAL_GOAL for r in rows)
    general["met_cpu"] = sum(r["inputs_cpu_ratio"] <= GENERAL_GOAL for r in rows)
    return {
        "load_average": {"start": load_start, "end": os.getloadavg()[0]},
        "rows": rows,
        "summary": {"wall clock": first["ratio"], "CPU time": first["cpu_ratio"]},
        "goal": {
            "row": first["name"],
            "ratio": first["ratio"],
            "cpu_ratio": first["cpu_ratio"],
            "goal": GOAL,
            "met": first["ratio"] <= GOAL,
        },
        "general_path": general,
        "inputs": dict(INPUTS),
        "mptorch": dict(MPTORCH),
    }


BENCHMARK = Benchmark("accumulation_speed", Config, PROFILES, measure, AccumulationSpeedResult, __doc__)
main = BENCHMARK.main

if __name__ == "__main__":
    run_main(BENCHMARK)
