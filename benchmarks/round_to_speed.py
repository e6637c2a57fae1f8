"""Benchmark: mpt_lab.formats.round_to against the native cast it reproduces, for torch tensors and NumPy arrays.

Each row times, in one process and one thread, on ``n`` float32 values (10⁷ by default):

* ``native``: the input library's own round trip through the format, ``t.to(dtype).to(torch.float32)`` for a
  tensor, ``x.astype(dtype).astype(np.float32)`` for an array (NumPy's float16, ml_dtypes' bfloat16, float8,
  float6 and float4 types), always round-to-nearest-even: for stochastic rows it is the same nearest-even cast.
  torch has no float6/float4 dtype; for those tensor rows the ml_dtypes cast of ``t.numpy()`` is timed instead
  (and ``native`` says so);
* ``round_to``: ``round_to(x, fmt, rounding=...)`` (a stochastic call gets a generator seeded once per row).

The two are interleaved (native, round_to, native, round_to, ...) after one untimed call of each, so that
background load affects both alike; a row reports the median of ``repeat`` times of each and their ratio.
Formats FP16, BF16, FP8_E4M3, FP8_E5M2, FP6_E3M2, FP6_E2M3, FP4_E2M1; data "normal" (standard normal) and
"wide" (standard normal times 2^k, k uniform in -30 … 11: subnormals, underflow and overflow of the small
formats).  ``same_values`` tells whether round_to's nearest-even result equals the native cast bit for bit on
that data (NaNs as equal): it differs only where the native cast is not the format's operation (torch's
float8_e4m3fn cast saturates where OCP E4M3 without saturation gives NaN).

    python benchmarks/round_to_speed.py --profile cpu              # prints the table
    python benchmarks/round_to_speed.py --profile cpu --out book/results/round_to_speed_cpu.json

Run by the experiment runner (:mod:`mpt_lab.harness.benchmark`): the JSON holds ``config``, ``provenance``
(command, device, versions, date, config), ``load_average`` (1-minute load of the machine at the start and the end), ``rows`` (one dict per
row: input, format, rounding, data, native, native_s, round_to_s, ratio, same_values, native_times_s,
round_to_times_s) and ``summary`` (the largest ratio per input and rounding, on each kind of data).
"""

from __future__ import annotations

import os
import statistics
from dataclasses import dataclass

import ml_dtypes
import numpy as np
import torch

from mpt_lab.bench import interleaved
from mpt_lab.formats import BF16, FP4_E2M1, FP6_E2M3, FP6_E3M2, FP8_E4M3, FP8_E5M2, FP16, get_format, round_to
from mpt_lab.harness.benchmark import Benchmark, TimingTable
from mpt_lab.harness.runner import ExperimentConfig, Run, run_main

FORMATS = (FP16, BF16, FP8_E4M3, FP8_E5M2, FP6_E3M2, FP6_E2M3, FP4_E2M1)
ROUNDINGS = ("nearest_even", "stochastic")
NP_DTYPES = {
    FP16: np.float16,
    BF16: ml_dtypes.bfloat16,
    FP8_E4M3: ml_dtypes.float8_e4m3fn,
    FP8_E5M2: ml_dtypes.float8_e5m2,
    FP6_E3M2: ml_dtypes.float6_e3m2fn,
    FP6_E2M3: ml_dtypes.float6_e2m3fn,
    FP4_E2M1: ml_dtypes.float4_e2m1fn,
}
TORCH_DTYPES = {FP16: torch.float16, BF16: torch.bfloat16, FP8_E4M3: torch.float8_e4m3fn, FP8_E5M2: torch.float8_e5m2}


def data(n: int, seed: int = 0) -> dict:
    """name -> n float32 values: "normal" (standard normal) and "wide" (normal times 2^k, k in -30 … 11)."""
    rng = np.random.default_rng(seed)
    return {
        "normal": rng.standard_normal(n).astype(np.float32),
        "wide": (rng.standard_normal(n) * np.exp2(rng.integers(-30, 12, n))).astype(np.float32),
    }


def native_cast(x, fmt):
    """(callable, description): the input library's nearest-even round trip through fmt's dtype."""
    if isinstance(x, torch.Tensor):
        if fmt in TORCH_DTYPES:
            dt = TORCH_DTYPES[fmt]
            return (lambda: x.to(dt).to(torch.float32)), f"t.to(torch.{str(dt).split('.')[-1]}).to(torch.float32)"
        xn, dt = x.numpy(), NP_DTYPES[fmt]
        return (
            (lambda: torch.from_numpy(xn.astype(dt).astype(np.float32))),
            f"torch.from_numpy(t.numpy().astype(ml_dtypes.{dt.__name__}).astype(np.float32)) "
            f"(torch has no {dt.__name__})",
        )
    dt = NP_DTYPES[fmt]
    lib = "np" if dt is np.float16 else "ml_dtypes"
    return (lambda: x.astype(dt).astype(np.float32)), f"x.astype({lib}.{dt.__name__}).astype(np.float32)"


def _same(a, b) -> bool:
    a = a.numpy() if isinstance(a, torch.Tensor) else a
    b = b.numpy() if isinstance(b, torch.Tensor) else b
    return bool(((a.view(np.uint32) == b.view(np.uint32)) | (np.isnan(a) & np.isnan(b))).all())


def measure_row(x, fmt, rounding: str, dist: str, repeat: int, seed: int) -> dict:
    """One row: the native cast and round_to on x, interleaved; medians, ratio and agreement."""
    native, what = native_cast(x, fmt)
    tensor = isinstance(x, torch.Tensor)
    if rounding == "stochastic":
        gen = torch.Generator().manual_seed(seed) if tensor else np.random.default_rng(seed)

        def ours():
            return round_to(x, fmt, rounding="stochastic", generator=gen)
    else:

        def ours():
            return round_to(x, fmt)

    same = _same(ours(), native()) if rounding == "nearest_even" else None
    times = interleaved({"native": native, "round_to": ours}, repeat)
    t_native, t_ours = times["native"][0], times["round_to"][0]
    med_n, med_o = statistics.median(t_native), statistics.median(t_ours)
    return {
        "input": "torch" if tensor else "numpy",
        "format": fmt.name,
        "rounding": rounding,
        "data": dist,
        "native": what,
        "native_s": med_n,
        "round_to_s": med_o,
        "ratio": med_o / med_n,
        "same_values": same,
        "native_times_s": t_native,
        "round_to_times_s": t_ours,
    }


def summary(rows: list) -> dict:
    """The largest ratio per input and rounding, on each kind of data ("torch nearest_even normal": ratio)."""
    out = {}
    for r in rows:
        key = f"{r['input']} {r['rounding']} {r['data']}"
        out[key] = max(out.get(key, 0.0), r["ratio"])
    return out


@dataclass
class Config(ExperimentConfig):
    n: int = 10_000_000  # float32 values per row
    repeat: int = 7  # timed calls of each (the median is kept)
    formats: tuple = tuple(f.name for f in FORMATS)
    roundings: tuple = ROUNDINGS
    inputs: tuple = ("torch", "numpy")

    def validate(self) -> None:
        super().validate()
        self.check_positive("n", "repeat")
        self.check_choices("formats", tuple(f.name for f in FORMATS), subset=True)
        self.check_choices("roundings", ROUNDINGS, subset=True)
        self.check_choices("inputs", ("torch", "numpy"), subset=True)


PROFILES = {"quick": {"n": 4096, "repeat": 2, "threads": 1}, "cpu": {"threads": 1}}


@dataclass
class RoundToSpeedResult(TimingTable):
    """``load_average`` (1-minute load at the start and the end), ``rows`` (one dict per row, see the module
    docstring) and ``summary`` (the largest ratio per input and rounding, on each kind of data)."""

    SUMMARY = "largest ratio, {key}: {ratio:.2f}"

    def row_text(self, r: dict) -> str:
        same = "" if r["same_values"] is None else ("  same" if r["same_values"] else "  differs")
        return (
            f"{r['input']:5s} {r['format']:9s} {r['rounding']:12s} {r['data']:6s} native "
            f"{r['native_s'] * 1e3:8.2f} ms  round_to {r['round_to_s'] * 1e3:8.2f} ms  ratio {r['ratio']:6.2f}{same}"
        )


def measure(config: Config, run: Run) -> dict:
    """Measure every row (see the module docstring)."""
    load_start = os.getloadavg()[0]
    combos = [
        (dist, xn, inp, get_format(f), rounding)
        for dist, xn in data(config.n, config.seed).items()
        for inp in config.inputs
        for f in config.formats
        for rounding in config.roundings
    ]
    rows = []
    for dist, xn, inp, fmt, rounding in run.bar(combos, desc="round_to against the native casts"):
        x = torch.from_numpy(xn) if inp == "torch" else xn
        rows.append(measure_row(x, fmt, rounding, dist, config.repeat, config.seed))
    return {"load_average": {"start": load_start, "end": os.getloadavg()[0]}, "rows": rows, "summary": summary(rows)}


BENCHMARK = Benchmark("round_to_speed", Config, PROFILES, measure, RoundToSpeedResult, __doc__)
main = BENCHMARK.main

if __name__ == "__main__":
    run_main(BENCHMARK)
