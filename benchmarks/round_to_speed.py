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

    python benchmarks/round_to_speed.py                       # prints the table
    python benchmarks/round_to_speed.py --out book/results/round_to_speed_cpu.json

The JSON (written with :func:`mpt_lab.experiments.save_json`) holds ``provenance`` (command, device, versions,
date, config), ``load_average`` (1-minute load of the machine at the start and the end), ``rows`` (one dict per
row: input, format, rounding, data, native, native_s, round_to_s, ratio, same_values, native_times_s,
round_to_times_s) and ``summary`` (the largest ratio per input and rounding, on each kind of data).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import ml_dtypes
import numpy as np
import torch

from mpt_lab.device import provenance
from mpt_lab.experiments import save_json
from mpt_lab.formats import BF16, FP4_E2M1, FP6_E2M3, FP6_E3M2, FP8_E4M3, FP8_E5M2, FP16, round_to

FORMATS = (FP16, BF16, FP8_E4M3, FP8_E5M2, FP6_E3M2, FP6_E2M3, FP4_E2M1)
ROUNDINGS = ("nearest_even", "stochastic")
NP_DTYPES = {FP16: np.float16, BF16: ml_dtypes.bfloat16, FP8_E4M3: ml_dtypes.float8_e4m3fn,
             FP8_E5M2: ml_dtypes.float8_e5m2, FP6_E3M2: ml_dtypes.float6_e3m2fn,
             FP6_E2M3: ml_dtypes.float6_e2m3fn, FP4_E2M1: ml_dtypes.float4_e2m1fn}
TORCH_DTYPES = {FP16: torch.float16, BF16: torch.bfloat16, FP8_E4M3: torch.float8_e4m3fn,
                FP8_E5M2: torch.float8_e5m2}


def data(n: int, seed: int = 0) -> dict:
    """name -> n float32 values: "normal" (standard normal) and "wide" (normal times 2^k, k in -30 … 11)."""
    rng = np.random.default_rng(seed)
    return {"normal": rng.standard_normal(n).astype(np.float32),
            "wide": (rng.standard_normal(n) * np.exp2(rng.integers(-30, 12, n))).astype(np.float32)}


def native_cast(x, fmt):
    """(callable, description): the input library's nearest-even round trip through fmt's dtype."""
    if isinstance(x, torch.Tensor):
        if fmt in TORCH_DTYPES:
            dt = TORCH_DTYPES[fmt]
            return (lambda: x.to(dt).to(torch.float32)), f"t.to(torch.{str(dt).split('.')[-1]}).to(torch.float32)"
        xn, dt = x.numpy(), NP_DTYPES[fmt]
        return ((lambda: torch.from_numpy(xn.astype(dt).astype(np.float32))),
                f"torch.from_numpy(t.numpy().astype(ml_dtypes.{dt.__name__}).astype(np.float32)) "
                f"(torch has no {dt.__name__})")
    dt = NP_DTYPES[fmt]
    lib = "np" if dt is np.float16 else "ml_dtypes"
    return (lambda: x.astype(dt).astype(np.float32)), f"x.astype({lib}.{dt.__name__}).astype(np.float32)"


def _same(a, b) -> bool:
    a = a.numpy() if isinstance(a, torch.Tensor) else a
    b = b.numpy() if isinstance(b, torch.Tensor) else b
    return bool(((a.view(np.uint32) == b.view(np.uint32)) | (np.isnan(a) & np.isnan(b))).all())


def interleaved(fns: list, repeat: int) -> list:
    """Times (seconds) of each callable: one untimed call of each, then ``repeat`` rounds calling each once."""
    for f in fns:
        f()
    times = [[] for _ in fns]
    for _ in range(repeat):
        for f, ts in zip(fns, times):
            t0 = time.perf_counter()
            f()
            ts.append(time.perf_counter() - t0)
    return times


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
    t_native, t_ours = interleaved([native, ours], repeat)
    med_n, med_o = statistics.median(t_native), statistics.median(t_ours)
    return {"input": "torch" if tensor else "numpy", "format": fmt.name, "rounding": rounding, "data": dist,
            "native": what, "native_s": med_n, "round_to_s": med_o, "ratio": med_o / med_n,
            "same_values": same, "native_times_s": t_native, "round_to_times_s": t_ours}


def summary(rows: list) -> dict:
    """The largest ratio per input and rounding, on each kind of data ("torch nearest_even normal": ratio)."""
    out = {}
    for r in rows:
        key = f"{r['input']} {r['rounding']} {r['data']}"
        out[key] = max(out.get(key, 0.0), r["ratio"])
    return out


def run(n: int = 10_000_000, repeat: int = 7, seed: int = 0, threads: int = 1, formats=FORMATS,
        roundings=ROUNDINGS, inputs=("torch", "numpy"), progress=None) -> dict:
    """Measure every row; returns the result dict (see the module docstring)."""
    torch.set_num_threads(threads)
    load_start = os.getloadavg()[0]
    rows = []
    for dist, xn in data(n, seed).items():
        for inp in inputs:
            x = torch.from_numpy(xn) if inp == "torch" else xn
            for fmt in formats:
                for rounding in roundings:
                    row = measure_row(x, fmt, rounding, dist, repeat, seed)
                    rows.append(row)
                    if progress:
                        progress(row)
    config = {"n": n, "repeat": repeat, "seed": seed, "torch_threads": threads, "dtype": "float32",
              "formats": [f.name for f in formats], "roundings": list(roundings), "inputs": list(inputs)}
    return {"provenance": provenance(config=config, device="cpu"),
            "load_average": {"start": load_start, "end": os.getloadavg()[0]},
            "rows": rows, "summary": summary(rows)}


def _print_row(r: dict) -> None:
    same = "" if r["same_values"] is None else ("  same" if r["same_values"] else "  differs")
    print(f"{r['input']:5s} {r['format']:9s} {r['rounding']:12s} {r['data']:6s} native {r['native_s'] * 1e3:8.2f} ms"
          f"  round_to {r['round_to_s'] * 1e3:8.2f} ms  ratio {r['ratio']:6.2f}{same}", flush=True)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=10_000_000, help="number of float32 values (default 1e7)")
    p.add_argument("--repeat", type=int, default=7, help="timed calls of each (default 7; the median is kept)")
    p.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    p.add_argument("--out", type=Path, help="write the result as JSON here")
    args = p.parse_args(argv)
    if args.repeat < 1 or args.n < 1:
        p.error("--n and --repeat must be at least 1")
    print(f"load average (1 min) at the start: {os.getloadavg()[0]:.2f}", flush=True)
    res = run(args.n, args.repeat, threads=args.threads, progress=_print_row)
    argv_used = sys.argv[1:] if argv is None else list(argv)
    res["provenance"]["command"] = " ".join(["python benchmarks/round_to_speed.py", *argv_used])
    for key, ratio in res["summary"].items():
        print(f"largest ratio, {key}: {ratio:.2f}")
    print(f"load average (1 min): start {res['load_average']['start']:.2f}, end {res['load_average']['end']:.2f}")
    if args.out:
        save_json(res, args.out)
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
