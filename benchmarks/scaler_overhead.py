"""Benchmark: a training step with mpt_lab.scaling.GradScaler against the same step with torch.amp.GradScaler.

The issue's goal: ours takes at most 1.10× as long as torch's.  The step is a small float32 MLP on the CPU,
one thread (zero_grad, forward, loss, scale(loss).backward(), step, update), so the scaler's own work is
as visible as it can be: torch's scaler uses two fused C++ kernels, ours a dozen public tensor operations.
Both produce bit-identical results (tests/test_scaling.py).  Variants are timed in alternation, round by
round, so that a busy second core slows them alike.

    python benchmarks/scaler_overhead.py                       # prints the timing table and the ratio
    python benchmarks/scaler_overhead.py --out book/results/scaler_overhead_cpu.json

With ``--optimizer adam-fused`` the optimizer skips overflowed steps on the device, the host never reads
found_inf, and mpt_lab's update() runs as a dozen tensor operations instead of on Python numbers.

The JSON records the command, device, versions, date, configuration and every repeat (seconds per call of
``--steps`` training steps).
"""

from __future__ import annotations

import argparse
import copy
import sys
from pathlib import Path

import torch
from torch import nn

from mpt_lab.bench import Timing, time_call
from mpt_lab.device import provenance
from mpt_lab.experiments import save_json
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


def run(batch: int = 64, hidden: int = 256, depth: int = 2, inputs: int = 128, steps: int = 20,
        repeat: int = 21, seed: int = 0, threads: int = 1, optimizer: str = "sgd") -> dict:
    """Time ``steps`` training steps per call, ``repeat`` calls per variant; returns a dict (seconds)."""
    if optimizer not in OPTIMIZERS:
        raise ValueError(f"optimizer must be one of {sorted(OPTIMIZERS)}, got {optimizer!r}")
    torch.set_num_threads(threads)
    torch.manual_seed(seed)
    base = _mlp(inputs, hidden, depth, 10)
    x, y = torch.randn(batch, inputs), torch.randint(0, 10, (batch,))
    loss_fn = nn.CrossEntropyLoss()
    scalers = {
        "no scaler": None,
        "torch.amp.GradScaler": lambda: torch.amp.GradScaler("cpu", growth_interval=100),
        "mpt_lab GradScaler": lambda: GradScaler(growth_interval=100),
        "mpt_lab StaticLossScaler": lambda: StaticLossScaler(2.0**16),
    }

    def make_fn(make_scaler):
        model = copy.deepcopy(base)
        opt = OPTIMIZERS[optimizer](model.parameters())
        scaler = make_scaler() if make_scaler else None

        def fn():
            for _ in range(steps):
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
    for r in range(repeat):  # alternate the variants, reversing the order every other round
        for name in (names if r % 2 == 0 else names[::-1]):
            times[name] += time_call(fns[name], repeat=1, warmup=0).times
    timings = {name: Timing(tuple(t), 1).as_dict() for name, t in times.items()}
    med = {name: t["median"] for name, t in timings.items()}
    ref = med["torch.amp.GradScaler"]
    config = {"batch": batch, "inputs": inputs, "hidden": hidden, "depth": depth, "outputs": 10,
              "steps_per_call": steps, "repeat": repeat, "seed": seed, "torch_threads": threads,
              "dtype": "float32", "optimizer": optimizer}
    return {"provenance": provenance(config=config, device="cpu"), "timings_s": timings,
            "ratio_ours_vs_torch": med["mpt_lab GradScaler"] / ref,
            "ratio_static_vs_torch": med["mpt_lab StaticLossScaler"] / ref,
            "overhead_per_step_s": (med["mpt_lab GradScaler"] - ref) / steps,
            "goal": GOAL}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--hidden", type=int, default=256, help="width of the hidden layers (default 256)")
    p.add_argument("--depth", type=int, default=2, help="number of hidden layers (default 2)")
    p.add_argument("--inputs", type=int, default=128)
    p.add_argument("--steps", type=int, default=20, help="training steps per timed call (default 20)")
    p.add_argument("--repeat", type=int, default=21, help="timed calls per variant (default 21)")
    p.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    p.add_argument("--optimizer", choices=sorted(OPTIMIZERS), default="sgd",
                   help="sgd (default): update() on the host; adam-fused: update() on the device")
    p.add_argument("--out", type=Path, help="write the result as JSON here")
    args = p.parse_args(argv)
    res = run(args.batch, args.hidden, args.depth, args.inputs, args.steps, args.repeat, threads=args.threads,
              optimizer=args.optimizer)
    res["provenance"]["command"] = "python benchmarks/scaler_overhead.py " + " ".join(
        sys.argv[1:] if argv is None else argv)
    for name, tm in res["timings_s"].items():
        print(f"{name:26s} median {tm['median'] / args.steps * 1e6:9.1f} µs/step   "
              f"min {tm['min'] / args.steps * 1e6:9.1f} µs/step")
    r = res["ratio_ours_vs_torch"]
    print(f"mpt_lab GradScaler / torch.amp.GradScaler = {r:.3f} (goal ≤ {GOAL:.2f}: "
          f"{'met' if r <= GOAL else 'NOT met'}); {res['overhead_per_step_s'] * 1e6:+.1f} µs/step")
    print(f"mpt_lab StaticLossScaler / torch.amp.GradScaler = {res['ratio_static_vs_torch']:.3f}")
    if args.out:
        save_json(res, args.out)
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
