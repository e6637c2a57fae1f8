"""Benchmark: the cost of a precision report on a GPT-2-small-shaped model, in plain FP32 training steps (CPU).

The model is Hugging Face transformers' GPT-2 built from its configuration with random weights (12 layers,
width 768, 12 heads, vocabulary 50,257; nothing downloaded), the batch 4 sequences of 128 tokens.  Timed, each
``--repeat`` times, interleaved so that a change of the machine's load hits every variant alike:

* a plain FP32 training step: ``zero_grad``, forward, loss, backward, ``AdamW.step``;
* ``precision_report(..., formats=("FP32",))``: the FP32 step with every module's outputs, their gradients,
  the weights and the weight gradients recorded (no format's step: FP32's answers come from the recording);
* ``precision_report(...)`` with the default four formats (FP16, BF16, FP8_E4M3, FP8_E5M2): the recording plus
  one simulated step per format.

The issue's goal (issue 24): the recording costs at most 1.5 plain steps and each format at most 1.5 more.
Per-format cost = (report with four formats − recording) / 4, from the medians.  Both wall-clock times and
the process's CPU times (``time.process_time``, all its threads) are saved: on a machine whose two cores other
processes share, the CPU times are the steadier measure of the work done; the machine's 1-minute load average
after each call is saved with them.

    python benchmarks/report_overhead.py --out book/results/report_overhead_cpu.json
    python benchmarks/report_overhead.py --layers 2 --repeat 2       # a quick look
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import torch

from mpt_lab.device import provenance
from mpt_lab.experiments.runner import save_json
from mpt_lab.histogram import log2_histogram
from mpt_lab.report import DEFAULT_FORMATS, precision_report


def gpt2(layers: int, width: int, heads: int, vocab: int, positions: int):
    """GPT-2 from its configuration, random weights, in training mode (dropout on, as in training)."""
    import transformers

    transformers.logging.set_verbosity_error()
    cfg = transformers.GPT2Config(n_layer=layers, n_embd=width, n_head=heads, vocab_size=vocab,
                                  n_positions=positions, bos_token_id=0, eos_token_id=0)
    model = transformers.GPT2LMHeadModel(cfg)
    model.train()
    return model


def run(layers: int = 12, width: int = 768, heads: int = 12, vocab: int = 50257, batch: int = 4,
        tokens: int = 128, repeat: int = 3, threads: int = 2) -> dict:
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    model = gpt2(layers, width, heads, vocab, max(tokens, 128))
    ids = torch.randint(0, vocab, (batch, tokens), generator=torch.Generator().manual_seed(1))
    data = {"input_ids": ids, "labels": ids}
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def loss_fn(m, b):
        return m(**b).loss

    def plain():
        opt.zero_grad(set_to_none=True)
        loss_fn(model, data).backward()
        opt.step()

    variants = {
        "plain FP32 step": plain,
        "report: FP32 recording": lambda: precision_report(model, loss_fn, data, formats=("FP32",)),
        "report: recording + 4 formats": lambda: precision_report(model, loss_fn, data, formats=DEFAULT_FORMATS),
    }
    log2_histogram(torch.ones(4))              # compile the histogram kernel once, before timing
    for fn in variants.values():               # warm-up: first-use probes of the rounding paths, allocator
        fn()
    times = {k: [] for k in variants}
    cpu = {k: [] for k in variants}
    loads = {k: [] for k in variants}
    for _ in range(repeat):
        for k, fn in variants.items():
            c0, t0 = time.process_time(), time.perf_counter()
            fn()
            times[k].append(time.perf_counter() - t0)
            cpu[k].append(time.process_time() - c0)
            loads[k].append(round(os.getloadavg()[0], 2))

    def ratios(t):
        med = {k: float(np.median(v)) for k, v in t.items()}
        step = med["plain FP32 step"]
        rec = med["report: FP32 recording"] / step
        per = (med["report: recording + 4 formats"] - med["report: FP32 recording"]) / len(DEFAULT_FORMATS) / step
        return med, rec, per

    med, recording, per_format = ratios(times)
    cpu_med, cpu_recording, cpu_per_format = ratios(cpu)
    cfg = {"model": "transformers GPT2LMHeadModel from GPT2Config, random weights", "layers": layers,
           "width": width, "heads": heads, "vocab": vocab, "batch": batch, "tokens": tokens, "repeat": repeat,
           "torch_threads": threads, "optimizer": "AdamW (plain step only)", "formats": list(DEFAULT_FORMATS),
           "parameters": sum(p.numel() for p in model.parameters())}
    return {"provenance": provenance(config=cfg, device="cpu"),
            "times_s": times, "cpu_times_s": cpu, "load_average_1min_after_each": loads, "median_s": med,
            "cpu_median_s": cpu_med, "recording_in_steps": recording, "per_format_in_steps": per_format,
            "cpu_time_ratios": {"recording_in_steps": cpu_recording, "per_format_in_steps": cpu_per_format},
            "goal": {"recording_in_steps": 1.5, "per_format_in_steps": 1.5}}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--width", type=int, default=768)
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--vocab", type=int, default=50257)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--tokens", type=int, default=128)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        res = run(args.layers, args.width, args.heads, args.vocab, args.batch, args.tokens, repeat=args.repeat,
                  threads=args.threads)
    res["provenance"]["command"] = "python benchmarks/report_overhead.py " + " ".join(argv or sys.argv[1:])
    for k, v in res["median_s"].items():
        print(f"{k:32s} median {v:8.2f} s   (all: {', '.join(f'{t:.2f}' for t in res['times_s'][k])}; "
              f"load {res['load_average_1min_after_each'][k]})")
    c = res["cpu_time_ratios"]
    print(f"FP32 recording: {res['recording_in_steps']:.2f} plain steps by wall clock, {c['recording_in_steps']:.2f} "
          "by CPU time (goal ≤ 1.5)")
    print(f"each format:    {res['per_format_in_steps']:.2f} plain steps by wall clock, {c['per_format_in_steps']:.2f} "
          "by CPU time (goal ≤ 1.5)")
    if args.out:
        save_json(res, args.out)
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
