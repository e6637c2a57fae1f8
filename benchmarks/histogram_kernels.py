"""Benchmark: the CPU kernels of :func:`mpt_lab.log2_histogram`, in nanoseconds per value.

Each row counts ``n`` float32 values (5·10⁷ by default: 200 MB, read from memory, as the gradients of a GPT-2
step are) into a :class:`~mpt_lab.histogram.Log2Histogram` with one of the kernels the CPU can take:

* ``C kernel``: :func:`mpt_lab.histogram._native_kernel` (index and count in one pass, compiled once per machine
  by :mod:`mpt_lab._native`), the tensor split over torch's intra-op threads: what ``log2_histogram`` uses;
* ``torch.compile kernel``: the fine indices from torch.compile's loop, counted by ``torch.bincount`` in pieces of
  2^20 values: what ``log2_histogram`` used before the C kernel, and uses where no C compiler is found;
* ``bucketize kernel``: :func:`torch.bucketize` over the bins' runs of bit patterns (the CUDA kernel, and the CPU's
  under ``ATEN_CPU_CAPABILITY=avx2`` on an AVX-512 CPU when the C kernel is unavailable).

On two kinds of data: "normal" (standard normal times 10⁻³) and "gradients" (90% zeros, the rest normal times
10⁻⁶: the zeros of a ReLU network's or a padded batch's gradients fall in one bin, which a count loop without
interleaving waits on).  The kernels are interleaved (:func:`mpt_lab.bench.interleaved`) after one untimed call
of each; every kernel's histogram is checked equal to the C kernel's.

    python benchmarks/histogram_kernels.py --profile cpu --out book/results/histogram_kernels_cpu.json

Run by the experiment runner (:mod:`mpt_lab.harness.benchmark`): the JSON holds ``config``, ``provenance``,
``load_average``, ``rows`` (data, kernel, median_s, ns_per_value, times_s) and ``summary`` (per data, the
torch.compile kernel's time over the C kernel's).
"""

from __future__ import annotations

import os
import statistics
from dataclasses import dataclass

import torch

from mpt_lab import histogram as H
from mpt_lab.bench import interleaved
from mpt_lab.harness.benchmark import Benchmark, TimingTable
from mpt_lab.harness.runner import ExperimentConfig, Run, run_main


def _chunked(kernel, x: torch.Tensor) -> H.Log2Histogram:
    """The histogram of x by a fine-index kernel and ``torch.bincount``, 2^20 values at a time."""
    h = H.Log2Histogram()
    for start in range(0, x.numel(), H._CPU_CHUNK):
        idx, amax = kernel(x[start : start + H._CPU_CHUNK])
        h._fine += H._bincount_cpu(idx)
        h._amax = torch.maximum(h._amax, amax)
    return h


def _native(x: torch.Tensor) -> H.Log2Histogram:
    counts, amax = H._native_counts(H._native_kernel(), x)
    return H.Log2Histogram(counts, amax)


def data(n: int, seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    normal = torch.randn(n, generator=g) * 1e-3
    grads = torch.randn(n, generator=g) * 1e-6
    grads[torch.rand(n, generator=g) < 0.9] = 0.0
    return {"normal": normal, "gradients": grads}


@dataclass
class Config(ExperimentConfig):
    n: int = 50_000_000  # float32 values per row
    repeat: int = 5  # timed calls of each kernel (the median is kept)

    def validate(self) -> None:
        super().validate()
        self.check_positive("n", "repeat")


PROFILES = {"quick": {"n": 300_000, "repeat": 2, "threads": 2}, "cpu": {"threads": 2}}


@dataclass
class HistogramKernelsResult(TimingTable):
    """``load_average``, ``rows`` (see the module docstring) and ``summary`` (the torch.compile kernel's time over
    the C kernel's, per data)."""

    SUMMARY = "torch.compile kernel / C kernel, {key}: {ratio:.2f}"

    def row_text(self, r: dict) -> str:
        return f"{r['data']:10s} {r['kernel']:22s} {r['ns_per_value']:6.3f} ns per value (median {r['median_s']:.3f} s)"


def measure(config: Config, run: Run) -> dict:
    """Time every kernel on every kind of data (see the module docstring)."""
    if H._native_kernel() is None:
        raise RuntimeError("the C histogram kernel is unavailable on this machine (see the RuntimeWarning)")
    load_start = os.getloadavg()[0]
    compiled = H._compile_checked(torch.device("cpu"))
    kernels = {
        "C kernel": _native,
        "torch.compile kernel": lambda x: _chunked(compiled, x),
        "bucketize kernel": lambda x: _chunked(H._fine_indices_search, x),
    }
    rows, summary = [], {}
    for name, x in run.bar(data(config.n, config.seed).items(), desc="histogram kernels"):
        want = _native(x)
        for k, fn in kernels.items():
            if fn(x) != want:
                raise RuntimeError(f"the {k}'s histogram of the {name} data differs from the C kernel's")
        times = interleaved({k: (lambda fn=fn: fn(x)) for k, fn in kernels.items()}, config.repeat)
        med = {k: statistics.median(times[k][0]) for k in kernels}
        for k in kernels:
            rows.append(
                {
                    "data": name,
                    "kernel": k,
                    "median_s": med[k],
                    "ns_per_value": med[k] / config.n * 1e9,
                    "times_s": times[k][0],
                }
            )
        summary[name] = med["torch.compile kernel"] / med["C kernel"]
    return {"load_average": {"start": load_start, "end": os.getloadavg()[0]}, "rows": rows, "summary": summary}


BENCHMARK = Benchmark("histogram_kernels", Config, PROFILES, measure, HistogramKernelsResult, __doc__)
main = BENCHMARK.main

if __name__ == "__main__":
    run_main(BENCHMARK)
