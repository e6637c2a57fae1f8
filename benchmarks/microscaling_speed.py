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

    python benchmarks/microscaling_speed.py                       # prints the table
    python benchmarks/microscaling_speed.py --out book/results/microscaling_speed_cpu.json

The JSON (written with :func:`mpt_lab.experiments.save_json`) holds ``provenance`` (command, device, versions,
date, config), ``load_average`` (the machine's 1-minute load average at the start and the end; the machine has
2 cores shared with other work), ``rows`` (data, format, median seconds and CPU seconds of each call, ratios,
``same_as_torchao``, every time) and ``summary`` (quantize_mx / cast and torchao / cast per data, wall and CPU).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import torch

from mpt_lab.device import provenance
from mpt_lab.experiments import save_json
from mpt_lab.formats import get_format
from mpt_lab.microscaling import quantize_mx

COLS = 4000                 # 125 blocks of 32 per row


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
        import logging

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


def interleaved(fns: dict, repeat: int) -> dict:
    """name -> (wall times, CPU times) in seconds: one untimed call of each, then ``repeat`` rounds of one each."""
    for f in fns.values():
        f()
    times = {name: ([], []) for name in fns}
    for _ in range(repeat):
        for name, f in fns.items():
            w0, c0 = time.perf_counter(), time.process_time()
            f()
            c1, w1 = time.process_time(), time.perf_counter()
            times[name][0].append(w1 - w0)
            times[name][1].append(c1 - c0)
    return times


def measure_row(x: torch.Tensor, fmt, dist: str, repeat: int, ao) -> dict:
    fns = {"cast": lambda: x.to(torch.float8_e4m3fn if fmt.name == "FP8_E4M3" else torch.float8_e5m2),
           "quantize_mx": lambda: quantize_mx(x, fmt)}
    same = None
    if ao is not None:
        fns["torchao"] = lambda: ao(x, fmt)
        ours = quantize_mx(x, fmt)
        s, d = ao(x, fmt)
        same = bool(torch.equal(s.view(torch.uint8), ours.scale_codes)
                    and torch.equal(d.view(torch.uint8), ours.element_codes))
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


def run(n: int = 10_000_000, repeat: int = 7, seed: int = 0, threads: int = 1, formats=("FP8_E4M3",),
        progress=None) -> dict:
    """Measure every row; returns the result dict (see the module docstring)."""
    torch.set_num_threads(threads)
    load_start = os.getloadavg()[0]
    ao, ao_what = torchao_to_mx()
    rows = []
    for dist, x in data(n, seed).items():
        for name in formats:
            row = measure_row(x, get_format(name), dist, repeat, ao)
            rows.append(row)
            if progress:
                progress(row)
    summary = {}
    for r in rows:
        for key in [k for k in r if k.endswith("_vs_cast") or k.endswith("_vs_cast_cpu")]:
            summary[f"{r['data']} {r['format']} {key}"] = r[key]
    config = {"n": rows[0]["n"], "shape": [rows[0]["n"] // COLS, COLS], "repeat": repeat, "seed": seed,
              "torch_threads": threads, "dtype": "float32", "block_size": 32, "formats": list(formats),
              "cast": "x.to(torch.float8_e4m3fn)", "torchao": ao_what}
    return {"provenance": provenance(config=config, device="cpu"),
            "load_average": {"start": load_start, "end": os.getloadavg()[0], "cpus": os.cpu_count()},
            "rows": rows, "summary": summary}


def _print_row(r: dict) -> None:
    parts = [f"{r['data']:8s} {r['format']:8s}"]
    for name in ("cast", "quantize_mx", "torchao"):
        if f"{name}_s" in r:
            parts.append(f"{name} {r[f'{name}_s'] * 1e3:8.2f} ms (CPU {r[f'{name}_cpu_s'] * 1e3:7.2f})")
    ratios = [f"{k[:-8]}/cast {r[k]:.2f} (CPU {r[k + '_cpu']:.2f})" for k in r if k.endswith("_vs_cast")]
    same = "" if r["same_as_torchao"] is None else ("  same codes" if r["same_as_torchao"] else "  DIFFERENT codes")
    print("  ".join(parts + ratios) + same, flush=True)


def _print_summary(res: dict) -> None:
    ratios = "\n".join(f"{key}: {ratio:.2f}" for key, ratio in res["summary"].items())
    load = res["load_average"]
    print(f"{ratios}\nload average (1 min): start {load['start']:.2f}, end {load['end']:.2f} on {load['cpus']} CPUs")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=10_000_000, help="number of float32 values (default 1e7)")
    p.add_argument("--repeat", type=int, default=7, help="timed calls of each (default 7; the median is kept)")
    p.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    p.add_argument("--formats", default="FP8_E4M3", help="comma-separated MXFP8 element formats (FP8_E4M3, FP8_E5M2)")
    p.add_argument("--out", type=Path, help="write the result as JSON here")
    args = p.parse_args(argv)
    if args.repeat < 1 or args.n < COLS:
        p.error(f"--repeat must be at least 1 and --n at least {COLS}")
    formats = tuple(f.strip() for f in args.formats.split(",") if f.strip())
    if not set(formats) <= {"FP8_E4M3", "FP8_E5M2"}:
        p.error("--formats: FP8_E4M3 and/or FP8_E5M2")
    print(f"load average (1 min) at the start: {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs", flush=True)
    res = run(args.n, args.repeat, threads=args.threads, formats=formats, progress=_print_row)
    res["provenance"]["command"] = " ".join(["python benchmarks/microscaling_speed.py",
                                             *(sys.argv[1:] if argv is None else argv)])
    _print_summary(res)
    if args.out:
        print(f"wrote {save_json(res, args.out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
