"""Count what an experiment does, on a CPU, to estimate its time on a GPU: operator calls and matrix FLOPs.

The estimates of :mod:`mpt_lab.harness.budget` add, per experiment, the time of its FLOPs and bytes at the
H100's published peaks and the host's cost of every operator it launches (PyTorch runs eagerly: Python, the
dispatcher and one or more kernel launches per ATen operator).  This script measures the two counts that do not
depend on the device: the ATen operators that reach a kernel (a ``TorchDispatchMode`` sees every one, forward,
backward and optimizer alike) and the FLOPs of matrix products and convolutions
(``torch.utils.flop_counter.FlopCounterMode``).  Counting the smoke run with one field of work increased by ``k``
(``--vary steps=3``) gives the cost of one more unit of that work by difference::

    python benchmarks/gpu_slot_counts.py ssd_table2 --vary steps=3 --set batch_size=2
    python benchmarks/gpu_slot_counts.py fp8_recipes --vary lm_steps=3

It prints, for the smoke configuration and for the varied one: operator calls, GFLOP, CPU seconds, and the
difference per unit.  Experiments that run in other processes (``distributed``: torchrun) cannot be counted here.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
from torch.utils.flop_counter import FlopCounterMode  # noqa: E402

from mpt_lab import experiments  # noqa: E402
from mpt_lab._torch_internals import TorchDispatchMode  # noqa: E402
from mpt_lab.harness.runner import _parse_like  # noqa: E402

#: Operators that make no kernel on a GPU (views, metadata): not counted.
_NO_KERNEL = {
    "view",
    "_unsafe_view",
    "reshape",
    "expand",
    "t",
    "transpose",
    "permute",
    "unsqueeze",
    "squeeze",
    "select",
    "slice",
    "as_strided",
    "alias",
    "detach",
    "split",
    "split_with_sizes",
    "unbind",
    "chunk",
    "_reshape_alias",
    "view_as",
    "lift_fresh",
    "empty",
    "empty_like",
    "empty_strided",
    "set_",
    "unfold",
    "diagonal",
    "narrow",
    "numpy_T",
    "_to_copy_meta",
    "is_nonzero",
    "sym_size",
    "sym_stride",
    "sym_numel",
    "sym_storage_offset",
    "_local_scalar_dense",
}


class OpCounter(TorchDispatchMode):
    """Counts the ATen operators that run a kernel (views and metadata excluded), by name."""

    def __init__(self):
        super().__init__()
        self.counts = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if name not in _NO_KERNEL:
            self.counts[name] += 1
        return func(*args, **(kwargs or {}))


def count(name: str, overrides: dict) -> dict:
    """Run experiment ``name``'s smoke configuration with ``overrides`` on the CPU, counting."""
    e = experiments.get(name)
    cfg = dataclasses.replace(e.smoke_config(), device="cpu", **overrides)
    ops = OpCounter()
    t0, c0 = time.perf_counter(), time.process_time()
    with FlopCounterMode(display=False) as flops, ops:
        e.run(cfg, progress=False)
    return {
        "ops": sum(ops.counts.values()),
        "gflop": flops.get_total_flops() / 1e9,
        "wall": time.perf_counter() - t0,
        "cpu": time.process_time() - c0,
        "top": ops.counts.most_common(8),
    }


def _pairs(items, cfg):
    out = {}
    for item in items:
        key, _, value = item.partition("=")
        out[key] = _parse_like(getattr(cfg, key), value)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("name", choices=experiments.NAMES)
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override for both counts")
    p.add_argument(
        "--vary",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="the second count's values (fields of work, e.g. steps=3)",
    )
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    os.environ.setdefault("MPT_LAB_PROGRESS", "0")
    base_cfg = experiments.get(args.name).smoke_config()
    base = _pairs(args.set, base_cfg)
    a = count(args.name, base)
    print(
        f"{args.name} smoke {base}: {a['ops']} ops, {a['gflop']:.3f} GFLOP, {a['wall']:.1f} s wall, "
        f"{a['cpu']:.1f} s CPU; top {a['top']}"
    )
    if args.vary:
        vary = _pairs(args.vary, base_cfg)
        b = count(args.name, {**base, **vary})
        units = {
            k: (v - getattr(dataclasses.replace(base_cfg, **base), k))
            for k, v in vary.items()
            if isinstance(v, (int, float))
        }
        n = max(sum(units.values()), 1)
        print(f"{args.name} varied {vary}: {b['ops']} ops, {b['gflop']:.3f} GFLOP, {b['wall']:.1f} s wall")
        print(
            f"per unit of {units}: {(b['ops'] - a['ops']) / n:.0f} ops, {(b['gflop'] - a['gflop']) / n:.4f} GFLOP, "
            f"{(b['wall'] - a['wall']) / n:.3f} s CPU wall"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
