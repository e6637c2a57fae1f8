"""Benchmark: mpt_lab.microscaling.quantize_mx (MXFP8) against a plain FP8 cast and torchao's MX reference code.

Each row times, in one process and one thread, on ``n`` float32 values (10⁷ by default, a (n / 4000) × 4000
matrix, blocks of 32 along the rows):

* ``cast``: the plain per-element cast ``x.to(torch.float8_e4m3fn)`` (no scaling: the floor of what any FP8
  quantisation costs);
* ``quantize_mx``: ``mpt_lab.microscaling.quantize_mx(x, fmt)`` (OCP MX v1.0 floor scale, E8M0 scale codes and
  element codes);
* ``torchao``: torchao's pure-PyTorch reference ``torchao.prototype.mx_formats.mx_tensor.to_mx(x, dtype, 32,
  ScaleCalculationMode.FLOOR)`` (skipped, and said so, when torchao is not installed).

The calls are interleaved (cast, quantize_mx, torchao, cast, ...) after one untimed call of each, so that
background load affects all alike; a row reports, per call, the median of ``repeat`` wall-clock times and of
``repeat`` process CPU times (``time.process_time``: what the load of other processes on a shared machine
inflates least), and the ratios to the cast.  ``same_as_torchao`` tells whether quantize_mx and torchao produced
the same scale and element codes on that data.  Data: "normal" (standard normal) and "outliers" (1% of the
values times 2^4 … 2^24).

    python benchmarks/microscaling_speed.py --profile cpu              # prints the table
    python benchmarks/microscaling_speed.py --profile cpu --out book/results/microscaling_speed_cpu.json

Run by the experiment runner (:mod:`mpt_lab.harness.benchmark`): the JSON holds ``config``, ``provenance``
(command, device, versions, date, config), ``load_average`` (the machine's 1-minute load average at the start and the end; the machine has
2 cores shared with other work), ``rows`` (data, format, median seconds and CPU seconds of each call, ratios,
``same_as_torchao``, every time) and ``summary`` (quantize_mx / cast and torchao / cast per data, wall and CPU).
"""

from __future__ import annotations

import logging
import os
import statistics
import warnings
from dataclasses import dataclass

import numpy as np
import torch

from mpt_lab.bench import interleaved
from mpt_lab.formats import get_format
from mpt_lab.harness.benchmark import Benchmark, TimingTable
from mpt_lab.harness.runner import ExperimentConfig, Run, run_main
from mpt_lab.microscaling import quantize_mx

COLS = 4000  # 125 blocks of 32 per row


def data(n: int, seed: int = 0) -> dict:
    """name -> float32 tensor of shape (n // COLS, COLS): "normal" and "outliers"."""
    rng = np.random.default_rng(seed)
    rows = max(1, n // COLS)
    x = rng.standard_normal((rows, COLS)).astype(np.float32)
    hit = rng.random(x.shape) < 0.01
    y = np.where(hit, x * np.exp2(rng.integers(4, 25, x.shape)), x).astype(np.float32)
    return {"normal": torch.from_numpy(x), "outliers": torch.from_numpy(y)}


def torchao_to_mx():
    """(callable(x, fmt) -> (scale codes, element codes), description) for torchao's to_mx, or (None, why)."""
    try:
        logging.getLogger("torchao").setLevel(logging.ERROR)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import torchao
            from torchao.prototype.mx_formats.config import ScaleCalculationMode
            from torchao.prototype.mx_formats.mx_tensor import to_mx
    except Exception as exc:  # pragma: no cover - torchao is in requirements.txt
        return None, f"torchao not importable: {type(exc).__name__}: {exc}"
    dtypes = {"FP8_E4M3": torch.float8_e4m3fn, "FP8_E5M2": torch.float8_e5m2}

    def run(x, fmt):
        return to_mx(x, dtypes[fmt.name], 32, ScaleCalculationMode.FLOOR)

    return run, f"torchao {torchao.__version__} to_mx(x, dtype, 32, ScaleCalculationMode.FLOOR)"


def measure_row(x: torch.Tensor, fmt, dist: str, repeat: int, ao) -> dict:
    fns = {
        "cast": lambda: x.to(torch.float8_e4m3fn if fmt.name == "FP8_E4M3" else torch.float8_e5m2),
        "quantize_mx": lambda: quantize_mx(x, fmt),
    }
    same = None
    if ao is not None:
        fns["torchao"] = lambda: ao(x, fmt)
        ours = quantize_mx(x, fmt)
        s, d = ao(x, fmt)
        same = bool(
            torch.equal(s.view(torch.uint8), ours.scale_codes) and torch.equal(d.view(torch.uint8), ours.element_codes)
        )
    times = interleaved(fns, repeat)
    row = {"data": dist, "format": fmt.name, "n": x.numel(), "same_as_torchao": same}
    for name, (wall, cpu) in times.items():
        row[f"{name}_s"] = statistics.median(wall)
        row[f"{name}_cpu_s"] = statistics.median(cpu)
        row[f"{name}_times_s"] = wall
        row[f"{name}_cpu_times_s"] = cpu
    for name in times:
        if name != "cast":
            row[f"{name}_vs_cast"] = row[f"{name}_s"] / row["cast_s"]
            row[f"{name}_vs_cast_cpu"] = row[f"{name}_cpu_s"] / row["cast_cpu_s"]
    return row


@dataclass
class Config(ExperimentConfig):
    n: int = 10_000_000  # float32 values per row, as a (n // 4000) × 4000 matrix
    repeat: int = 7  # timed calls of each (the median is kept)
    formats: tuple = ("FP8_E4M3",)  # MXFP8 element formats: FP8_E4M3, FP8_E5M2

    def validate(self) -> None:
        super().validate()
        self.check_positive("repeat")
        self.check_positive("n", minimum=COLS)
        self.check_choices("formats", ("FP8_E4M3", "FP8_E5M2"), subset=True)


PROFILES = {"quick": {"n": 8000, "repeat": 1, "threads": 1}, "cpu": {"threads": 1}}


@dataclass
class MicroscalingSpeedResult(TimingTable):
    """``load_average`` (1-minute load at the start and the end, and the CPU count), ``rows`` (one dict per data
    and format, see the module docstring) and ``summary`` (quantize_mx / cast and torchao / cast, wall and CPU),
    ``torchao``: what was timed as torchao's reference (or why it was not)."""

    torchao: str = ""

    def row_text(self, r: dict) -> str:
        parts = [f"{r['data']:8s} {r['format']:8s}"]
        for name in ("cast", "quantize_mx", "torchao"):
            if f"{name}_s" in r:
                parts.append(f"{name} {r[f'{name}_s'] * 1e3:8.2f} ms (CPU {r[f'{name}_cpu_s'] * 1e3:7.2f})")
        ratios = [f"{k[:-8]}/cast {r[k]:.2f} (CPU {r[k + '_cpu']:.2f})" for k in r if k.endswith("_vs_cast")]
        same = "" if r["same_as_torchao"] is None else ("  same codes" if r["same_as_torchao"] else "  DIFFERENT codes")
        return "  ".join(parts + ratios) + same


def measure(config: Config, run: Run) -> dict:
    """Measure every row (see the module docstring)."""
    load_start = os.getloadavg()[0]
    ao, ao_what = torchao_to_mx()
    combos = [(dist, x, name) for dist, x in data(config.n, config.seed).items() for name in config.formats]
    rows = [
        measure_row(x, get_format(name), dist, config.repeat, ao)
        for dist, x, name in run.bar(combos, desc="quantize_mx against a cast")
    ]
    summary = {}
    for r in rows:
        for key in [k for k in r if k.endswith("_vs_cast") or k.endswith("_vs_cast_cpu")]:
            summary[f"{r['data']} {r['format']} {key}"] = r[key]
    return {
        "load_average": {"start": load_start, "end": os.getloadavg()[0], "cpus": os.cpu_count()},
        "rows": rows,
        "summary": summary,
        "torchao": ao_what,
    }


BENCHMARK = Benchmark("microscaling_speed", Config, PROFILES, measure, MicroscalingSpeedResult, __doc__)
main = BENCHMARK.main

if __name__ == "__main__":
    run_main(BENCHMARK)
