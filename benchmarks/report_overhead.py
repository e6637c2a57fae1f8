"""Benchmark: the cost of a precision report and of a layer ranking on GPT-2 small, in plain FP32 training steps
(CPU).

The model is Hugging Face transformers' ``GPT2LMHeadModel`` built from its configuration with random weights (12
layers, width 768, 12 heads, vocabulary 50,257; SDPA attention; nothing downloaded), the batch 4 sequences of 128
tokens.  Timed, each ``repeat`` times, interleaved (:func:`mpt_lab.bench.interleaved`, after one untimed call of
each) so that a change of the machine's load hits every variant alike:

* a plain FP32 training step of transformers' model: ``zero_grad``, forward, loss, backward, ``AdamW.step``;
* ``precision_report(..., formats=("FP32",))``: the FP32 step recorded — every module's outputs and their
  gradients, the gradient of every tensor of the autograd graph, the weights and weight gradients, the operands of
  every GEMM, forward and backward (no format's step: FP32's answers come from the recording; nothing overflows
  this model, so no step is recorded op by op);
* ``precision_report(...)`` with the default four formats (FP16, BF16, FP8_E4M3, FP8_E5M2): the recording plus
  one simulated step per format.

Then, once (its cost is many steps), :func:`mpt_lab.report.keep_wide` with NVIDIA's NVFP4 recipe
(:func:`mpt_lab.quantized_training.four_bit_recipe`) over all 49 linear layers (GPT-2's 48 ``Conv1D`` layers and
the output layer), with ``ranking="one"`` (one layer at a time) or "both" (also all but one): the layer ranking
(:attr:`~mpt_lab.report_layers.LayerRanking.ranking_seconds`: the FP32 step, a step per layer, every layer) and
the whole of keep_wide (the ranking, then the search for the smallest set to keep: a bisection and a pruning
step per kept layer), each in seconds divided by the number of layers and by the median plain step.

The goals (issue 33): the recording costs at most 1.5 plain steps and each format at most 1.5 more (per-format cost
= (report with four formats − recording) / 4, from the medians); the layer ranking at most 2 steps per layer.
Both wall-clock times and the process's CPU times (``time.process_time``, all its threads) are saved: on a
machine whose two cores other processes share, the CPU times are the steadier measure of the work done; the
machine's 1-minute load average after each timed call is saved with them.

    python benchmarks/report_overhead.py --profile cpu --out book/results/report_overhead_cpu.json
    python benchmarks/report_overhead.py --profile quick       # a one-layer, 32-wide model: seconds

Profiles: "quick" (one layer, width 32, 2 heads, vocabulary 64, 2 sequences of 8 tokens, one repeat, one thread:
for the tests) and "cpu" (GPT-2 small as above, three repeats, two threads).  The model runs on the CPU
(``device`` is "cpu").

Run by the experiment runner (:mod:`mpt_lab.harness.benchmark`): the JSON holds ``config``, ``provenance``
(command, device, versions, date, config), ``load_average`` (1-minute load at the start and the end), ``rows``
(one dict per variant: variant, median_s, cpu_median_s, times_s, cpu_times_s, load_average_1min_after_each),
``summary`` (the recording and each format, in plain steps, by wall clock and by CPU time; the ranking's steps per
layer), ``goal`` (1.5 plain steps for each, 2 per layer for the ranking), ``formats``, ``parameters`` (the model's
parameter count) and ``ranking`` (layers, training steps run, seconds, CPU seconds, load average after it, the
kept layers, whether they are the last ones).
"""

from __future__ import annotations

import os
import statistics
import time
import warnings
from dataclasses import dataclass, field

import torch

from mpt_lab.bench import interleaved
from mpt_lab.harness.benchmark import Benchmark, TimingTable
from mpt_lab.harness.runner import ExperimentConfig, Run, run_main
from mpt_lab.histogram import log2_histogram
from mpt_lab.quantized_training import four_bit_recipe
from mpt_lab.report import DEFAULT_FORMATS, keep_wide, precision_report

GOAL = 1.5
RANKING_GOAL = 2.0
PLAIN, RECORDING, FORMATS = "plain FP32 step", "report: FP32 recording", "report: recording + 4 formats"


def gpt2(layers: int, width: int, heads: int, vocab: int, positions: int):
    """GPT-2 from its configuration, random weights, in training mode (dropout on, as in training)."""
    import transformers

    transformers.logging.set_verbosity_error()
    cfg = transformers.GPT2Config(
        n_layer=layers,
        n_embd=width,
        n_head=heads,
        vocab_size=vocab,
        n_positions=positions,
        bos_token_id=0,
        eos_token_id=0,
    )
    model = transformers.GPT2LMHeadModel(cfg)
    model.train()
    return model


@dataclass
class Config(ExperimentConfig):
    device: str = "cpu"  # the model runs on the CPU
    layers: int = 12
    width: int = 768
    heads: int = 12
    vocab: int = 50257
    batch: int = 4  # sequences
    tokens: int = 128  # tokens per sequence
    repeat: int = 3  # timed calls per variant (the median is kept)
    ranking: str = "one"  # the layer ranking: "none", "one" (one layer at a time) or "both" (and all but one)
    tolerance: float = 0.1  # the ranking's tolerance on the gradient error

    def validate(self) -> None:
        super().validate()
        self.check_positive("layers", "width", "heads", "vocab", "batch", "tokens", "repeat")
        if not (isinstance(self.tolerance, (int, float)) and self.tolerance > 0):
            raise ValueError(f"config.tolerance must be a positive number, got {self.tolerance!r}")
        self.check_choices("device", ("cpu",))
        self.check_choices("ranking", ("none", "one", "both"))
        if self.width % self.heads:
            raise ValueError(f"config.width must be a multiple of config.heads, got {self.width} and {self.heads}")


PROFILES = {
    "quick": {
        "layers": 1,
        "width": 32,
        "heads": 2,
        "vocab": 64,
        "batch": 2,
        "tokens": 8,
        "repeat": 1,
        "threads": 1,
        "ranking": "both",
    },
    "cpu": {"threads": 2},
}


@dataclass
class ReportOverheadResult(TimingTable):
    """``load_average`` (1-minute load at the start and the end), ``rows`` (one dict per variant, see the module
    docstring), ``summary`` ("FP32 recording, wall clock" and "each format, wall clock", and the same by CPU
    time: costs in plain FP32 steps), ``goal`` (at most 1.5 plain steps each), ``formats`` and ``parameters``."""

    SUMMARY = "{key}: {ratio:.2f} plain steps"

    goal: dict = field(default_factory=dict)
    formats: list = field(default_factory=list)
    parameters: int = 0
    ranking: dict = field(default_factory=dict)

    def row_text(self, r: dict) -> str:
        return (
            f"{r['variant']:32s} median {r['median_s']:8.2f} s (CPU time {r['cpu_median_s']:8.2f} s)   "
            f"all: {', '.join(f'{t:.2f}' for t in r['times_s'])}; load {r['load_average_1min_after_each']}"
        )


def measure(config: Config, run: Run) -> dict:
    """Time the three variants, interleaved (see the module docstring)."""
    load_start = os.getloadavg()[0]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        model = gpt2(config.layers, config.width, config.heads, config.vocab, max(config.tokens, 128))
        ids = torch.randint(
            0, config.vocab, (config.batch, config.tokens), generator=torch.Generator().manual_seed(config.seed + 1)
        )
        data = {"input_ids": ids, "labels": ids}
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

        def loss_fn(m, b):
            return m(**b).loss

        def plain():
            opt.zero_grad(set_to_none=True)
            loss_fn(model, data).backward()
            opt.step()

        variants = {
            PLAIN: plain,
            RECORDING: lambda: precision_report(model, loss_fn, data, formats=("FP32",), progress=False),
            FORMATS: lambda: precision_report(model, loss_fn, data, formats=DEFAULT_FORMATS, progress=False),
        }
        loads = {k: [] for k in variants}
        bar = run.bar(total=len(variants) * (config.repeat + 1), desc="precision report against plain steps")

        def with_load(name, fn):
            def call():
                fn()
                loads[name].append(round(os.getloadavg()[0], 2))
                bar.update()

            return call

        log2_histogram(torch.ones(4))  # compile the histogram kernel once, before timing
        times = interleaved({k: with_load(k, fn) for k, fn in variants.items()}, config.repeat)
        bar.close()
        ranking = {}
        if config.ranking != "none":
            w0, c0 = time.perf_counter(), time.process_time()
            r = keep_wide(
                model,
                loss_fn,
                data,
                four_bit_recipe(),
                tolerance=config.tolerance,
                all_but_one=config.ranking == "both",
                progress=run.progress,
            )
            c1, w1 = time.process_time(), time.perf_counter()
            ranking = {
                "mode": config.ranking,
                "recipe": r.recipe,
                "layers": len(r.layers),
                "steps": r.steps,
                "ranking_steps": r.ranking_steps,
                "ranking_seconds": r.ranking_seconds,
                "keep_wide_seconds": r.seconds,
                "seconds": w1 - w0,
                "cpu_seconds": c1 - c0,
                "load_average_1min_after": os.getloadavg()[0],
                "keep": r.keep,
                "within": r.within,
                "last_layers": r.last_layers(),
                "positions": r.positions(),
                "every": r.every,
                "kept": r.kept,
                "tolerance": r.tolerance,
            }
    rows = []
    for k, (wall, cpu) in times.items():
        rows.append(
            {
                "variant": k,
                "median_s": statistics.median(wall),
                "cpu_median_s": statistics.median(cpu),
                "times_s": wall,
                "cpu_times_s": cpu,
                "load_average_1min_after_each": loads[k][1:],
            }
        )  # [0]: the untimed warm-up call
    summary = {}
    for clock, key in (("wall clock", "median_s"), ("CPU time", "cpu_median_s")):
        med = {r["variant"]: r[key] for r in rows}
        summary[f"FP32 recording, {clock}"] = med[RECORDING] / med[PLAIN]
        summary[f"each format, {clock}"] = (med[FORMATS] - med[RECORDING]) / len(DEFAULT_FORMATS) / med[PLAIN]
        if ranking:
            secs = ranking["seconds"] if clock == "wall clock" else ranking["cpu_seconds"]
            summary[f"keep_wide (ranking and smallest set) per layer, {clock}"] = secs / ranking["layers"] / med[PLAIN]
    if ranking:
        plain = next(r["median_s"] for r in rows if r["variant"] == PLAIN)
        summary["layer ranking per layer, wall clock"] = ranking["ranking_seconds"] / ranking["layers"] / plain
    return {
        "load_average": {"start": load_start, "end": os.getloadavg()[0]},
        "rows": rows,
        "summary": summary,
        "goal": {"recording_in_steps": GOAL, "per_format_in_steps": GOAL, "ranking_per_layer_in_steps": RANKING_GOAL},
        "formats": list(DEFAULT_FORMATS),
        "parameters": sum(p.numel() for p in model.parameters()),
        "ranking": ranking,
    }


BENCHMARK = Benchmark("report_overhead", Config, PROFILES, measure, ReportOverheadResult, __doc__)
main = BENCHMARK.main

if __name__ == "__main__":
    run_main(BENCHMARK)
