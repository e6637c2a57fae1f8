"""Benchmark: a training step with mpt_lab.scaling.GradScaler against the same step with torch.amp.GradScaler.

The issue's goal: ours takes at most 1.10× as long as torch's.  The step is a small float32 MLP on the CPU,
one thread (zero_grad, forward, loss, scale(loss).backward(), step, update), so the scaler's own work is
as visible as it can be: torch's scaler uses two fused C++ kernels, ours a dozen public tensor operations.
Both produce bit-identical results (tests/test_scaling.py).  Variants are timed in alternation, round by
round, so that a busy second core slows them alike.

    python benchmarks/scaler_overhead.py --profile cpu                # prints the timing table and the ratio
    python benchmarks/scaler_overhead.py --profile cpu --out book/results/scaler_overhead_cpu.json

With ``--set optimizer=adam-fused`` the optimizer skips overflowed steps on the device, the host never reads
found_inf, and mpt_lab's update() runs as a dozen tensor operations instead of on Python numbers.

Run by the experiment runner (:mod:`mpt_lab.harness.benchmark`): the JSON records the configuration, the
provenance (command, device, versions, date) and every repeat (seconds per call of ``steps`` training steps).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

import torch
from torch import nn

from mpt_lab.bench import Timing, time_call
from mpt_lab.harness.benchmark import Benchmark
from mpt_lab.harness.runner import ExperimentConfig, ExperimentResult, Run, run_main
from mpt_lab.scaling import GradScaler, StaticLossScaler

GOAL = 1.10


def _mlp(inputs: int, hidden: int, depth: int, outputs: int) -> nn.Module:
    layers, width = [], inputs
    for _ in range(depth):
        layers += [nn.Linear(width, hidden), nn.ReLU()]
        width = hidden
    return nn.Sequential(*layers, nn.Linear(width, outputs))


OPTIMIZERS = {
    # step() reads found_inf on the host; update() then runs on Python numbers
    "sgd": lambda params: torch.optim.SGD(params, lr=1e-3, momentum=0.9),
    # skips on the device (no synchronisation); update() runs as tensor operations
    "adam-fused": lambda params: torch.optim.Adam(params, lr=1e-3, fused=True),
}


@dataclass
class Config(ExperimentConfig):
    batch: int = 64
    inputs: int = 128
    hidden: int = 256  # width of the hidden layers
    depth: int = 2  # number of hidden layers
    steps: int = 20  # training steps per timed call
    repeat: int = 21  # timed calls per variant
    optimizer: str = "sgd"  # sgd: update() on the host; adam-fused: update() on the device

    def validate(self) -> None:
        super().validate()
        self.check_positive("batch", "inputs", "hidden", "depth", "steps", "repeat")
        self.check_choices("optimizer", sorted(OPTIMIZERS))


PROFILES = {"quick": {"batch": 8, "hidden": 16, "steps": 5, "repeat": 3, "threads": 1}, "cpu": {"threads": 1}}


@dataclass
class ScalerOverheadResult(ExperimentResult):
    """``timings_s``: variant → :meth:`mpt_lab.bench.Timing.as_dict` (seconds per call of ``steps`` steps);
    ``ratio_ours_vs_torch`` and ``ratio_static_vs_torch``: medians over torch.amp.GradScaler's;
    ``overhead_per_step_s``: ours minus torch's per step; ``goal``: the ratio the issue asked for."""

    timings_s: dict = field(default_factory=dict)
    ratio_ours_vs_torch: float = 0.0
    ratio_static_vs_torch: float = 0.0
    overhead_per_step_s: float = 0.0
    goal: float = GOAL

    def describe(self) -> str:
        steps = self.config["steps"]
        lines = [
            f"{name:26s} median {tm['median'] / steps * 1e6:9.1f} µs/step   min {tm['min'] / steps * 1e6:9.1f} µs/step"
            for name, tm in self.timings_s.items()
        ]
        r = self.ratio_ours_vs_torch
        lines.append(
            f"mpt_lab GradScaler / torch.amp.GradScaler = {r:.3f} (goal ≤ {self.goal:.2f}: "
            f"{'met' if r <= self.goal else 'NOT met'}); {self.overhead_per_step_s * 1e6:+.1f} µs/step"
        )
        lines.append(f"mpt_lab StaticLossScaler / torch.amp.GradScaler = {self.ratio_static_vs_torch:.3f}")
        return "\n".join(lines)


def measure(config: Config, run: Run) -> dict:
    """Time ``steps`` training steps per call, ``repeat`` calls per variant, the variants in alternation."""
    base = _mlp(config.inputs, config.hidden, config.depth, 10)
    x, y = torch.randn(config.batch, config.inputs), torch.randint(0, 10, (config.batch,))
    loss_fn = nn.CrossEntropyLoss()
    scalers = {
        "no scaler": None,
        "torch.amp.GradScaler": lambda: torch.amp.GradScaler("cpu", growth_interval=100),
        "mpt_lab GradScaler": lambda: GradScaler(growth_interval=100),
        "mpt_lab StaticLossScaler": lambda: StaticLossScaler(2.0**16),
    }

    def make_fn(make_scaler):
        model = copy.deepcopy(base)
        opt = OPTIMIZERS[config.optimizer](model.parameters())
        scaler = make_scaler() if make_scaler else None

        def fn():
            for _ in range(config.steps):
                opt.zero_grad()
                loss = loss_fn(model(x), y)
                if scaler is None:
                    loss.backward()
                    opt.step()
                else:
                    scaler.scale(loss).backward()
                    scaler.step(opt)
                    scaler.update()

        return fn

    fns = {name: make_fn(make) for name, make in scalers.items()}
    for fn in fns.values():  # warm-up
        time_call(fn, repeat=1, warmup=1)
    times: dict[str, list[float]] = {name: [] for name in fns}
    names = list(fns)
    for r in range(config.repeat):  # alternate the variants, reversing the order every other round
        for name in names if r % 2 == 0 else names[::-1]:
            times[name] += time_call(fns[name], repeat=1, warmup=0).times
    timings = {name: Timing(tuple(t), 1).as_dict() for name, t in times.items()}
    med = {name: t["median"] for name, t in timings.items()}
    ref = med["torch.amp.GradScaler"]
    return {
        "timings_s": timings,
        "ratio_ours_vs_torch": med["mpt_lab GradScaler"] / ref,
        "ratio_static_vs_torch": med["mpt_lab StaticLossScaler"] / ref,
        "overhead_per_step_s": (med["mpt_lab GradScaler"] - ref) / config.steps,
        "goal": GOAL,
    }


BENCHMARK = Benchmark("scaler_overhead", Config, PROFILES, measure, ScalerOverheadResult, __doc__)
main = BENCHMARK.main

if __name__ == "__main__":
    run_main(BENCHMARK)
