"""Benchmark: mpt_lab.accumulation.matmul (every product and addition rounded) against a float32 matmul.

The issue's goal: a simulated FP16-accumulated matrix product (256×1024)@(1024×256) within 30× the time of a
float32 matrix product of the same shape, on one CPU thread.  Each row times, in one process and one thread:

* ``float32``: ``A32 @ B32`` (torch's float32 matmul, the reference);
* ``simulated``: ``mpt_lab.accumulation.matmul(A, B, **kw)`` on the same values, for each configuration in
  :data:`CONFIGS` (the first, FP16 products accumulated sequentially in FP16, is the goal's).

The inputs are FP16 values (standard normal numbers rounded to FP16), as a tensor-core FP16 GEMM has them;
the two calls are interleaved (float32, simulated, float32, simulated, ...) after one untimed call of each,
so that background load affects both alike; a row reports the median of ``repeat`` times of each and their
ratio.  The machine's load average is recorded at the start and the end: on a shared machine the ratio is
noisy.

mptorch (a PyTorch library for simulating low-precision arithmetic, mptorch on GitHub) would be the other
simulator to time beside it; ``pip install mptorch`` finds no distribution on the package registry used
here, so it is not measured (``mptorch`` in the result says so).

    python benchmarks/accumulation_speed.py                 # prints the table
    python benchmarks/accumulation_speed.py --out book/results/accumulation_speed_cpu.json

The JSON (written with :func:`mpt_lab.experiments.save_json`) holds ``provenance`` (command, device, versions,
date, config; :func:`mpt_lab.device.provenance`), ``load_average`` (1-minute load at the start and the end),
``rows`` (one dict per configuration: name, keywords, float32_s, simulated_s, ratio — medians of wall-clock
times — float32_cpu_s, simulated_cpu_s, cpu_ratio — the same in CPU time — and every wall-clock time),
``goal`` (the first row's ratios against the issue's 30×, judged on wall-clock time) and ``mptorch``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import torch

from mpt_lab import accumulation
from mpt_lab.device import provenance
from mpt_lab.experiments import save_json
from mpt_lab.formats import FloatFormat

GOAL = 30.0
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
        "accumulator": NARROW, "products": "FP32", "order": "blocked", "block_size": 128,
        "rounding": "toward_zero"},
}
MPTORCH = {"measured": False,
           "why": "pip install mptorch: no matching distribution on the package registry (checked 2026-11-26)"}


def interleaved(fns: list, repeat: int) -> tuple:
    """Wall-clock and CPU times (seconds) of each callable: one untimed call of each, then ``repeat`` rounds
    calling each once.  CPU time (``time.process_time``) leaves out the time other processes held the core."""
    for f in fns:
        f()
    wall = [[] for _ in fns]
    cpu = [[] for _ in fns]
    for _ in range(repeat):
        for f, w, c in zip(fns, wall, cpu):
            t0, c0 = time.perf_counter(), time.process_time()
            f()
            w.append(time.perf_counter() - t0)
            c.append(time.process_time() - c0)
    return wall, cpu


def _jsonable(kw: dict) -> dict:
    return {k: (v.name if isinstance(v, FloatFormat) else v) for k, v in kw.items()}


def run(m: int = 256, k: int = 1024, n: int = 256, repeat: int = 5, seed: int = 0, threads: int = 1,
        configs: dict | None = None, progress=None) -> dict:
    """Measure every row; returns the result dict (see the module docstring)."""
    configs = CONFIGS if configs is None else configs
    torch.set_num_threads(threads)
    load_start = os.getloadavg()[0]
    g = torch.Generator().manual_seed(seed)
    A = torch.randn(m, k, generator=g).half()
    B = torch.randn(k, n, generator=g).half()
    A32, B32 = A.float(), B.float()
    rows = []
    for name, kw in configs.items():
        (t32, tsim), (c32, csim) = interleaved([lambda: A32 @ B32, lambda: accumulation.matmul(A, B, **kw)],
                                               repeat)
        row = {"name": name, "keywords": _jsonable(kw), "float32_s": statistics.median(t32),
               "simulated_s": statistics.median(tsim), "float32_cpu_s": statistics.median(c32),
               "simulated_cpu_s": statistics.median(csim), "float32_times_s": t32, "simulated_times_s": tsim}
        row["ratio"] = row["simulated_s"] / row["float32_s"]
        row["cpu_ratio"] = row["simulated_cpu_s"] / row["float32_cpu_s"]
        rows.append(row)
        if progress:
            progress(row)
    config = {"shape": [m, k, n], "repeat": repeat, "seed": seed, "torch_threads": threads,
              "inputs": "standard normal values rounded to FP16 (torch.float16)", "goal_ratio": GOAL}
    first = rows[0]
    return {"provenance": provenance(config=config, device="cpu"),
            "load_average": {"start": load_start, "end": os.getloadavg()[0]},
            "rows": rows,
            "goal": {"row": first["name"], "ratio": first["ratio"], "cpu_ratio": first["cpu_ratio"], "goal": GOAL,
                     "met": first["ratio"] <= GOAL},
            "mptorch": MPTORCH}


def _print_row(r: dict) -> None:
    print(f"{r['name']:60s} float32 {r['float32_s'] * 1e3:8.2f} ms  simulated {r['simulated_s'] * 1e3:9.1f} ms"
          f"  ratio {r['ratio']:7.1f} (CPU time: {r['cpu_ratio']:7.1f})", flush=True)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", type=int, nargs=3, default=(256, 1024, 256), metavar=("M", "K", "N"),
                   help="(M, K) @ (K, N) (default 256 1024 256)")
    p.add_argument("--repeat", type=int, default=5, help="timed calls of each (default 5; the median is kept)")
    p.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    p.add_argument("--out", type=Path, help="write the result as JSON here")
    args = p.parse_args(argv)
    if args.repeat < 1 or min(args.shape) < 1:
        p.error("--shape and --repeat must be at least 1")
    print(f"load average (1 min) at the start: {os.getloadavg()[0]:.2f}", flush=True)
    res = run(*args.shape, repeat=args.repeat, threads=args.threads, progress=_print_row)
    argv_used = sys.argv[1:] if argv is None else list(argv)
    res["provenance"]["command"] = " ".join(["python benchmarks/accumulation_speed.py", *argv_used])
    goal = res["goal"]
    print(f"goal: {goal['row']}: {goal['ratio']:.1f}× a float32 matmul, {goal['cpu_ratio']:.1f}× in CPU time "
          f"(goal ≤ {GOAL:.0f}×: {'met' if goal['met'] else 'not met'})")
    print(f"mptorch: not measured ({MPTORCH['why']})")
    print(f"load average (1 min): start {res['load_average']['start']:.2f}, end {res['load_average']['end']:.2f}")
    if args.out:
        save_json(res, args.out)
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
