"""Benchmark: the cost of recording gradient histograms during a training step of the SSD detector (CPU).

Times an FP32 training step (batch 32, 64×64 images, the "small" detector, one torch thread) plain, with a
GradientHistogram of activation gradients, and with activation + weight gradients.  The issue's goal: with
the histogram active a step costs at most 1.5× a plain one.

    python benchmarks/histogram_overhead.py --out book/results/histogram_overhead_cpu.json
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from mpt_lab.bench import time_call
from mpt_lab.data import DigitsDetection
from mpt_lab.device import provenance
from mpt_lab.experiments import save_json
from mpt_lab.histogram import GradientHistogram, log2_histogram
from mpt_lab.models import MultiBoxLoss, build_ssd, train_step


def run(batch_size: int = 32, model: str = "small", repeat: int = 15, threads: int = 1) -> dict:
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    data = DigitsDetection("train", batch_size * 4, 64, seed=0)
    images, targets = data.batch(range(batch_size))
    net = build_ssd(model)
    loss_fn = MultiBoxLoss(net.priors, num_classes=net.num_classes)
    opt = torch.optim.SGD(net.parameters(), lr=1e-3, momentum=0.9)
    log2_histogram(torch.ones(4))  # compile the histogram kernel before timing (a one-time cost)

    def step():
        train_step(net, loss_fn, opt, images, targets)

    timings = {"plain": time_call(step, repeat=repeat, warmup=3)}
    with GradientHistogram(net, "activation"):
        timings["activation histogram"] = time_call(step, repeat=repeat, warmup=2)
    with GradientHistogram(net, "activation"), GradientHistogram(net, "weight"):
        timings["activation + weight histograms"] = time_call(step, repeat=repeat, warmup=2)
    # interleave once more to check the plain time did not drift
    timings["plain (again)"] = time_call(step, repeat=repeat, warmup=1)
    plain = min(timings["plain"].median, timings["plain (again)"].median)
    ratios = {k: v.median / plain for k, v in timings.items() if not k.startswith("plain")}
    cfg = {"batch_size": batch_size, "model": model, "repeat": repeat, "torch_threads": threads, "image_size": 64}
    return {"provenance": provenance(config=cfg, device="cpu"),
            "timings_s": {k: v.as_dict() for k, v in timings.items()}, "ratio_to_plain_step": ratios}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--repeat", type=int, default=15)
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    res = run(args.batch_size, repeat=args.repeat)
    res["provenance"]["command"] = "python benchmarks/histogram_overhead.py " + " ".join(argv or sys.argv[1:])
    for k, v in res["timings_s"].items():
        print(f"{k:32s} median {v['median'] * 1e3:8.1f} ms")
    for k, r in res["ratio_to_plain_step"].items():
        print(f"{k:32s} {r:.2f} × a plain step")
    if args.out:
        save_json(res, args.out)
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
