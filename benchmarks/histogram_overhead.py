"""Benchmark: the cost of recording gradient histograms during a training step of the SSD detector (CPU).

Times an FP32 training step (batch 32, 64×64 images, the "small" detector, one torch thread) plain, with a
GradientHistogram of activation gradients, and with activation + weight gradients.  The issue's goal: with
the histogram active a step costs at most 1.5× a plain one.

    python benchmarks/histogram_overhead.py --profile cpu --out book/results/histogram_overhead_cpu.json

Run by the experiment runner (:mod:`mpt_lab.harness.benchmark`): the JSON holds the configuration, the
provenance (command, device, versions, date), every timing and the ratios to a plain step.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from mpt_lab.bench import time_call
from mpt_lab.data import DigitsDetection
from mpt_lab.harness.benchmark import Benchmark
from mpt_lab.harness.runner import ExperimentConfig, ExperimentResult, Run, run_main
from mpt_lab.histogram import GradientHistogram, log2_histogram
from mpt_lab.models import MultiBoxLoss, build_ssd, train_step


@dataclass
class Config(ExperimentConfig):
    batch_size: int = 32
    model: str = "small"
    image_size: int = 64
    repeat: int = 15  # timed steps per variant (the median is kept)

    def validate(self) -> None:
        super().validate()
        self.check_positive("batch_size", "image_size", "repeat")


PROFILES = {"quick": {"batch_size": 8, "repeat": 2, "threads": 1}, "cpu": {"threads": 1}}


@dataclass
class HistogramOverheadResult(ExperimentResult):
    """``timings_s``: variant → :meth:`mpt_lab.bench.Timing.as_dict` (seconds per step); ``ratio_to_plain_step``:
    variant → its median over the plain step's (the smaller of the two plain measurements)."""

    timings_s: dict = field(default_factory=dict)
    ratio_to_plain_step: dict = field(default_factory=dict)

    def describe(self) -> str:
        lines = [f"{k:32s} median {v['median'] * 1e3:8.1f} ms" for k, v in self.timings_s.items()]
        lines += [f"{k:32s} {r:.2f} × a plain step" for k, r in self.ratio_to_plain_step.items()]
        return "\n".join(lines)


def measure(config: Config, run: Run) -> dict:
    data = DigitsDetection("train", config.batch_size * 4, config.image_size, seed=config.seed)
    images, targets = data.batch(range(config.batch_size))
    net = build_ssd(config.model)
    loss_fn = MultiBoxLoss(net.priors, num_classes=net.num_classes)
    opt = torch.optim.SGD(net.parameters(), lr=1e-3, momentum=0.9)
    log2_histogram(torch.ones(4))  # compile the histogram kernel before timing (a one-time cost)

    def step():
        train_step(net, loss_fn, opt, images, targets)

    repeat = config.repeat
    timings = {"plain": time_call(step, repeat=repeat, warmup=3)}
    with GradientHistogram(net, "activation"):
        timings["activation histogram"] = time_call(step, repeat=repeat, warmup=2)
    with GradientHistogram(net, "activation"), GradientHistogram(net, "weight"):
        timings["activation + weight histograms"] = time_call(step, repeat=repeat, warmup=2)
    # interleave once more to check the plain time did not drift
    timings["plain (again)"] = time_call(step, repeat=repeat, warmup=1)
    plain = min(timings["plain"].median, timings["plain (again)"].median)
    return {
        "timings_s": {k: v.as_dict() for k, v in timings.items()},
        "ratio_to_plain_step": {k: v.median / plain for k, v in timings.items() if not k.startswith("plain")},
    }


BENCHMARK = Benchmark("histogram_overhead", Config, PROFILES, measure, HistogramOverheadResult, __doc__)
main = BENCHMARK.main

if __name__ == "__main__":
    run_main(BENCHMARK)
