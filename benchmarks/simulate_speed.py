"""Benchmark: a training step under mpt_lab.simulate (FP16 emulated in float32) against a plain float32 step.

The goal: a simulated-FP16 training step of a small MLP or conv net takes at most 3× as long as the plain
FP32 step on a CPU (a real float16 step, ``model.half()``, is timed too: on CPUs without float16 matrix
kernels it is far slower).  Each step is forward, loss, backward and an SGD update; in mode "all" the update
runs inside the block (FP16 weights, as ``model.half()``), in mode "autocast" outside (FP32 master weights).

    python benchmarks/simulate_speed.py --profile cpu               # prints the timing table
    python benchmarks/simulate_speed.py --profile cpu --out book/results/simulate_speed_cpu.json

Run by the experiment runner (:mod:`mpt_lab.harness.benchmark`): the JSON records the configuration, the
provenance (command, device, versions, date) and every repeat (seconds).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

import torch
from torch import nn

from mpt_lab.bench import Timing, time_call
from mpt_lab.formats import FORMATS
from mpt_lab.harness.benchmark import Benchmark
from mpt_lab.harness.runner import ExperimentConfig, ExperimentResult, Run, run_main
from mpt_lab.simulate import round_parameters_, simulate


def models(batch: int) -> dict:
    """name -> (model, input, target): a 3-layer MLP on 256 features and a 2-conv net on 3×32×32 images."""
    g = torch.Generator().manual_seed(0)
    mlp = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10))
    conv = nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(32 * 8 * 8, 10),
    )
    return {
        "mlp": (mlp, torch.randn(batch, 256, generator=g), torch.randint(0, 10, (batch,), generator=g)),
        "conv": (conv, torch.randn(batch, 3, 32, 32, generator=g), torch.randint(0, 10, (batch,), generator=g)),
    }


def _step(model, x, y, opt, ctx=None, update_inside=False):
    def fn():
        opt.zero_grad(set_to_none=True)
        if ctx is None:
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            return
        with ctx:
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            if update_inside:
                opt.step()
        if not update_inside:
            opt.step()

    return fn


@dataclass
class Config(ExperimentConfig):
    batch: int = 64
    repeat: int = 7  # timed calls per case (the real float16 step: a third of them)
    fmt: str = "FP16"  # the format to emulate
    half: bool = True  # also time the (slow) real float16 step

    def validate(self) -> None:
        super().validate()
        self.check_positive("batch", "repeat")
        self.check_choices("fmt", FORMATS)


PROFILES = {"quick": {"batch": 8, "repeat": 2, "half": False, "threads": 1}, "cpu": {"threads": 1}}


@dataclass
class SimulateSpeedResult(ExperimentResult):
    """``timings_s``: "model: case" → :meth:`mpt_lab.bench.Timing.as_dict` (seconds per step);
    ``ratio_vs_fp32``: model → case → its median over the plain FP32 step's."""

    timings_s: dict = field(default_factory=dict)
    ratio_vs_fp32: dict = field(default_factory=dict)

    def describe(self) -> str:
        lines = [
            f"{name:36s} median {tm['median'] * 1e3:9.2f} ms   min {tm['min'] * 1e3:9.2f} ms"
            for name, tm in self.timings_s.items()
        ]
        lines += [
            f"{name}: {case} / fp32 = {r:.2f}" for name, rs in self.ratio_vs_fp32.items() for case, r in rs.items()
        ]
        return "\n".join(lines)


def measure(config: Config, run: Run) -> dict:
    """Time plain FP32, simulated (modes "all" and "autocast") and, optionally, real float16 steps."""
    fmt, repeat = config.fmt, config.repeat
    timings, ratios = {}, {}
    for name, (model, x, y) in models(config.batch).items():
        cases = {}
        m = copy.deepcopy(model)
        cases["fp32"] = _step(m, x, y, torch.optim.SGD(m.parameters(), lr=0.01))
        m = round_parameters_(copy.deepcopy(model), fmt)
        cases[f"simulate {fmt} all"] = _step(
            m, x, y, torch.optim.SGD(m.parameters(), lr=0.01), simulate(fmt, "all"), update_inside=True
        )
        m = copy.deepcopy(model)
        cases[f"simulate {fmt} autocast"] = _step(
            m, x, y, torch.optim.SGD(m.parameters(), lr=0.01), simulate(fmt, "autocast")
        )
        if config.half:
            m = copy.deepcopy(model).half()
            cases["real float16 (.half())"] = _step(m, x.half(), y, torch.optim.SGD(m.parameters(), lr=0.01))
        # interleaved (one call of each case per round) so that load from other processes hits all alike
        times = {case: [] for case in cases}
        for case, fn in cases.items():
            time_call(fn, repeat=1, warmup=1)
        for rnd in range(repeat):
            for case, fn in cases.items():
                if case.startswith("real") and rnd >= max(1, repeat // 3):
                    continue  # the slow real float16 step: fewer repeats
                times[case].extend(time_call(fn, repeat=1, warmup=0).times)
        for case, ts in times.items():
            timings[f"{name}: {case}"] = Timing(tuple(ts), warmup=1).as_dict()
        base = timings[f"{name}: fp32"]["median"]
        ratios[name] = {case: timings[f"{name}: {case}"]["median"] / base for case in cases if case != "fp32"}
    return {"timings_s": timings, "ratio_vs_fp32": ratios}


BENCHMARK = Benchmark("simulate_speed", Config, PROFILES, measure, SimulateSpeedResult, __doc__)
main = BENCHMARK.main

if __name__ == "__main__":
    run_main(BENCHMARK)
