"""Benchmark: mpt_lab.formats.round_to(x, FP16) against NumPy's own cast, x.astype(np.float16).

The issue's goal: on 10⁷ float32 values, round_to takes at most 3× as long as the NumPy cast.  Both produce
the same values (round_to returns float32 holding FP16 values; the test suite checks they agree bit for bit).

    python benchmarks/round_to_speed.py                       # prints the timing table
    python benchmarks/round_to_speed.py --out book/results/round_to_speed_cpu.json

The JSON records the command, device, versions, date and every repeat (seconds).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch

from mpt_lab.bench import time_call
from mpt_lab.device import provenance
from mpt_lab.experiments import save_json
from mpt_lab.formats import BF16, FP8_E4M3, FP16, round_to


def run(n: int = 10_000_000, repeat: int = 7, seed: int = 0, threads: int = 1) -> dict:
    """Time round_to to FP16/BF16/E4M3 and the reference casts on ``n`` float32 values; returns a dict."""
    torch.set_num_threads(threads)
    rng = np.random.default_rng(seed)
    inputs = {
        # typical activations/gradients: standard normal (NumPy's cast is at its fastest here)
        "normal": rng.standard_normal(n).astype(np.float32),
        # spread over 2^-30 .. 2^12: FP16 subnormals, underflow and overflow included
        "wide": (rng.standard_normal(n) * np.exp2(rng.integers(-30, 12, n))).astype(np.float32),
    }
    timings = {}
    for dist, x in inputs.items():
        t = torch.from_numpy(x)
        cases = {
            "numpy astype(float16)": lambda: x.astype(np.float16),
            "round_to(numpy, FP16)": lambda: round_to(x, FP16),
            "round_to(numpy, BF16)": lambda: round_to(x, BF16),
            "round_to(numpy, FP8_E4M3)": lambda: round_to(x, FP8_E4M3),
            "torch .half()": lambda: t.half(),
            "round_to(torch, FP16)": lambda: round_to(t, FP16),
        }
        for name, fn in cases.items():
            timings[f"{dist}: {name}"] = time_call(fn, repeat=repeat, warmup=1).as_dict()
    ratios = {dist: timings[f"{dist}: round_to(numpy, FP16)"]["median"]
              / timings[f"{dist}: numpy astype(float16)"]["median"] for dist in inputs}
    config = {"n": n, "repeat": repeat, "seed": seed, "torch_threads": threads, "dtype": "float32"}
    return {"provenance": provenance(config=config, device="cpu"), "timings_s": timings,
            "ratio_round_to_fp16_vs_astype": ratios}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=10_000_000, help="number of float32 values (default 1e7)")
    p.add_argument("--repeat", type=int, default=7)
    p.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    p.add_argument("--out", type=Path, help="write the result as JSON here")
    args = p.parse_args(argv)
    res = run(args.n, args.repeat, threads=args.threads)
    res["provenance"]["command"] = "python benchmarks/round_to_speed.py " + " ".join(argv or sys.argv[1:])
    for name, tm in res["timings_s"].items():
        print(f"{name:36s} median {tm['median'] * 1e3:8.2f} ms   min {tm['min'] * 1e3:8.2f} ms")
    for dist, r in res["ratio_round_to_fp16_vs_astype"].items():
        print(f"{dist}: round_to(x, FP16) / x.astype(float16) = {r:.2f}")
    if args.out:
        save_json(res, args.out)
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
