"""Benchmark: a training step of a small decoder-only language model with every GEMM in simulated NVFP4, against
its FP32 step.

The goal (issue 34): a step with every matrix product of every Linear layer in simulated NVFP4 takes at most 4×
the plain FP32 step on a CPU, so that four-bit training of a few-million-parameter model is practical there.
The model is the package's GPT-2-layout character transformer (:class:`mpt_lab.models.CharTransformerLM`:
token and position embeddings, pre-LayerNorm blocks of causal self-attention and a GELU MLP, a linear output
layer), on random token ids; a step is forward, cross-entropy, backward and an AdamW update.  Three cases:

* ``fp32``: the plain model;
* ``nvfp4``: every ``nn.Linear`` (the output layer included) a :class:`mpt_lab.quantized_training.QuantLinear`
  of chapter 11's ``nvfp4`` recipe: the inputs of all three GEMMs (fprop, dgrad, wgrad) in NVFP4, 1 × 16
  blocks, round-to-nearest-even;
* ``nvfp4_recipe``: :func:`mpt_lab.quantized_training.four_bit_recipe` on every Linear layer: NVIDIA's recipe
  (arXiv:2509.25149, §4) with weights in 16 × 16 tiles, gradients rounded stochastically, and a 16-point random
  Hadamard transform on the two inputs of the weight-gradient GEMM (the layers that the recipe keeps in BF16 are
  quantised too here: the point is the cost of the emulation).

The calls are interleaved (fp32, nvfp4, nvfp4_recipe, fp32, ...) after one untimed step of each, so that
background load hits all alike; a row reports the median of ``repeat`` wall-clock times and of ``repeat`` process
CPU times (``time.process_time``), and the ratios to the FP32 step.

    python benchmarks/fourbit_speed.py --profile cpu                # prints the table
    python benchmarks/fourbit_speed.py --profile cpu --out book/results/fourbit_speed_cpu.json

Run by the experiment runner (:mod:`mpt_lab.harness.benchmark`): the JSON holds ``config``, ``provenance``
(command, device, versions, date, config), ``load_average`` (1-minute load at the start and the end; the machine
has 2 cores shared with other work), ``model`` (parameters, Linear layers, tokens per step), ``rows`` (case,
recipe, median seconds and CPU seconds, every time, ratios to FP32) and ``summary`` (each case / fp32, wall and
CPU).
"""

from __future__ import annotations

import copy
import os
import statistics
from dataclasses import dataclass, field

import torch
import torch.nn.functional as Fn

from mpt_lab.bench import interleaved
from mpt_lab.harness.benchmark import Benchmark, TimingTable
from mpt_lab.harness.runner import ExperimentConfig, Run, run_main
from mpt_lab.models import CharTransformerLM
from mpt_lab.quantized_training import TRAINING_RECIPES, four_bit_recipe, quantize_linears_

CASES = ("fp32", "nvfp4", "nvfp4_recipe")


def recipe_of(case: str):
    """The training recipe of a case (None: plain FP32)."""
    return {"fp32": None, "nvfp4": TRAINING_RECIPES["nvfp4"], "nvfp4_recipe": four_bit_recipe()}[case]


def make_step(model: torch.nn.Module, case: str, ids: torch.Tensor, lr: float):
    """(step function, its model): a deep copy of ``model`` under the case's recipe, with its own AdamW."""
    m = copy.deepcopy(model)
    recipe = recipe_of(case)
    if recipe is not None:
        quantize_linears_(m, recipe)
    opt = torch.optim.AdamW(m.parameters(), lr=lr)
    inputs, targets = ids[:, :-1], ids[:, 1:].reshape(-1)

    def step():
        opt.zero_grad(set_to_none=True)
        logits = m(inputs)
        Fn.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets).backward()
        opt.step()

    return step, m


@dataclass
class Config(ExperimentConfig):
    vocab_size: int = 96  # characters (random token ids: speed does not depend on the text)
    dim: int = 256  # model width; the MLP is 4·dim wide
    layers: int = 4  # transformer blocks
    heads: int = 4
    context: int = 128  # tokens per sequence
    batch: int = 16  # sequences per step
    repeat: int = 7  # timed steps of each case (the median is kept)
    cases: tuple = CASES

    def validate(self) -> None:
        super().validate()
        self.check_positive("vocab_size", "dim", "layers", "heads", "context", "batch", "repeat")
        self.check_choices("cases", CASES, subset=True)
        if "fp32" not in self.cases:
            raise ValueError("config.cases must include 'fp32' (the ratios are to its step)")
        if self.dim % self.heads:
            raise ValueError(f"config.dim ({self.dim}) must be divisible by config.heads ({self.heads})")


PROFILES = {
    "quick": {"dim": 32, "layers": 1, "heads": 2, "context": 32, "batch": 2, "repeat": 1, "threads": 1},
    "cpu": {"threads": 1},
}


@dataclass
class FourbitSpeedResult(TimingTable):
    """``model`` (parameters, Linear layers, tokens per step), ``rows`` (one per case: median wall and CPU seconds
    of a step, every time, ratios to FP32), ``summary`` (case / fp32, wall and CPU), ``load_average``."""

    model: dict = field(default_factory=dict)

    SUMMARY = "{key}: {ratio:.2f}"

    def row_text(self, r: dict) -> str:
        ratio = "" if r["case"] == "fp32" else f"   {r['vs_fp32']:.2f}× FP32 (CPU time {r['vs_fp32_cpu']:.2f}×)"
        return (
            f"{r['case']:13s} step {r['step_s'] * 1e3:8.1f} ms (CPU {r['step_cpu_s'] * 1e3:8.1f} ms){ratio}"
            f"   {r['recipe']}"
        )


def measure(config: Config, run: Run) -> dict:
    """Time a training step of each case (see the module docstring)."""
    load_start = os.getloadavg()[0]
    g = torch.Generator().manual_seed(config.seed)
    model = CharTransformerLM(
        config.vocab_size, dim=config.dim, layers=config.layers, heads=config.heads, context=config.context
    )
    ids = torch.randint(0, config.vocab_size, (config.batch, config.context + 1), generator=g)
    steps, described = {}, {}
    for case in run.bar(config.cases, desc="building the cases"):
        steps[case], _ = make_step(model, case, ids, lr=1e-3)
        recipe = recipe_of(case)
        described[case] = (
            "FP32"
            if recipe is None
            else recipe.label
            + (f" ({', '.join(f'{k} {v}' for k, v in recipe.gemms.describe().items())})" if recipe.gemms else "")
        )
    times = interleaved(steps, config.repeat)
    rows = []
    base_wall, base_cpu = (statistics.median(t) for t in times["fp32"])
    for case, (wall, cpu) in times.items():
        row = {
            "case": case,
            "recipe": described[case],
            "step_s": statistics.median(wall),
            "step_cpu_s": statistics.median(cpu),
            "times_s": wall,
            "cpu_times_s": cpu,
        }
        row["vs_fp32"], row["vs_fp32_cpu"] = row["step_s"] / base_wall, row["step_cpu_s"] / base_cpu
        rows.append(row)
    summary = {}
    for r in rows:
        if r["case"] != "fp32":
            summary[f"{r['case']} / fp32"] = r["vs_fp32"]
            summary[f"{r['case']} / fp32 (CPU time)"] = r["vs_fp32_cpu"]
    linears = sum(isinstance(mod, torch.nn.Linear) for mod in model.modules())
    return {
        "load_average": {"start": load_start, "end": os.getloadavg()[0], "cpus": os.cpu_count()},
        "model": {
            "name": "CharTransformerLM",
            "parameters": sum(p.numel() for p in model.parameters()),
            "linear_layers": linears,
            "tokens_per_step": config.batch * config.context,
        },
        "rows": rows,
        "summary": summary,
    }


BENCHMARK = Benchmark("fourbit_speed", Config, PROFILES, measure, FourbitSpeedResult, __doc__)
main = BENCHMARK.main

if __name__ == "__main__":
    run_main(BENCHMARK)
