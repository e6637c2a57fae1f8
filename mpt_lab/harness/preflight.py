"""The preflight of a GPU machine: every CUDA code path that the experiments use, run once, in seconds.

``python -m mpt_lab.harness.preflight [--only a,b]`` runs, once each and in a few seconds, the CUDA code paths that
the experiments (or only those named: what a GPU slot still has to run) use (:data:`PREFLIGHT_CHECKS`: CUDA-event
timing, the caching allocator's peak after a reset, float16 and bfloat16 autocast on an LSTM with projections and
on a conv net, ``torch.amp.GradScaler("cuda")`` skipping a step with an inf, FP8 tensor-core products through
``torch._scaled_mm`` where the compute capability is ≥ 8.9, PyG's GATConv under autocast, an NCCL process group of
one rank, gloo for the distributed experiment's ranks; the gradient-histogram kernel on CUDA against the CPU's, a
whole training step captured in a CUDA graph, ``torch.profiler``'s CUDA kernels, the roofline's FP8 GEMMs with
fast accumulation off and on, the GPU's clocks and power, the allocator's counters per parameter) and prints one
line per path: ``ok`` with what it saw, ``skipped`` with why, ``known`` for a known limitation of PyTorch that no
experiment depends on (bfloat16 autocast runs cuDNN's LSTM in float16), or ``FAILED`` with the error.  Exit
status: 0 when nothing failed (also on a machine without CUDA, where it says so and checks nothing), 1 when a check
failed.  ``benchmarks/gpu_slot.sh`` runs it before the experiments.

It stands in the harness, above everything it exercises (timing, numerics, training, models), so that
:mod:`mpt_lab.device`, the bottom floor, imports nothing of ours.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
import warnings
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist

from ..bench import MEMORY_MODES, GpuSampler, gemm_tflops, memory_per_parameter, peak_memory, profile_steps, time_call
from ..device import DeviceLike, describe, resolve, synchronize
from ..formats import FP8_E4M3, FP8_E5M2
from ..histogram import check_kernel
from ..microscaling import ScaledTensor, quantize_per_tensor
from ..quantized_training import Quantizer, hardware_fp8_available
from ..training import StaticStep, autocast_to, backward_step

__all__ = ["PREFLIGHT_CHECKS", "Check", "needed_checks", "run_checks", "preflight", "main"]


@dataclass(frozen=True)
class Check:
    """One code path of the experiments, exercised once.

    name : what it checks (one line of the preflight); fn : ``fn(device) -> str`` (what it saw; raises on a
    failure; returns a string starting with "skipped:" when the path does not exist on this device, "known:" for
    a known limitation of PyTorch that no experiment depends on); where : the experiments that take this path;
    needed_by : the experiments and benchmarks (names) that need it; the preflight of a slot runs the check only
    when one of them is still to run (empty: always).
    """

    name: str
    fn: Callable
    where: str
    needed_by: tuple = ()


def _check_timing(device) -> str:
    a = torch.randn(512, 512, device=device)
    t = time_call(lambda: a @ a, repeat=3, warmup=1, device=device, timer="auto")
    want = "cuda_event" if device.type == "cuda" else "wall"
    if t.method != want or not t.min > 0:
        raise RuntimeError(f"time_call used {t.method!r} ({t.min!r} s), expected {want!r} and a positive time")
    return f"{t.method}, {t.min * 1e6:.0f} µs for a 512² product"


def _check_peak_memory(device) -> str:
    a = torch.randn(1024, 1024, device=device)
    peak = peak_memory(lambda: a @ a, device)
    if peak < a.numel() * 4:
        raise RuntimeError(f"peak {peak} bytes, expected at least the 4 MiB product")
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        block = torch.empty(2**20, device=device)
        top = torch.cuda.max_memory_allocated(device)
        if top < block.numel() * 4:
            raise RuntimeError(
                f"max_memory_allocated after reset_peak_memory_stats is {top} bytes, less than the "
                f"{block.numel() * 4} just allocated"
            )
    return f"{peak / 2**20:.1f} MiB for a 1024² product"


def _autocast_step(model, batch, target, device, dtype, scaler=None) -> torch.dtype:
    """One training step of ``model`` under autocast to ``dtype``: the dtype its output had."""
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    with autocast_to(device.type, dtype):
        out = model(batch)
        out = out[0] if isinstance(out, tuple) else out
        loss = torch.nn.functional.mse_loss(out.float(), target)
    backward_step(loss, opt, scaler)
    if not torch.isfinite(loss):
        raise RuntimeError(f"non-finite loss {float(loss)}")
    return out.dtype


def _lstm_check(dtype):
    def check(device) -> str:
        if device.type == "cpu" and dtype == torch.float16:
            return "skipped: nn.LSTM under float16 autocast fails inside oneDNN on a CPU (the experiments emulate it)"
        torch.manual_seed(0)
        lstm = torch.nn.LSTM(64, 256, num_layers=2, proj_size=64).to(device)  # as mpt_lab.models.lstm
        x, y = torch.randn(16, 8, 64, device=device), torch.randn(16, 8, 64, device=device)
        scaler = torch.amp.GradScaler(device.type) if dtype == torch.float16 else None
        with warnings.catch_warnings():  # a CPU's oneDNN has no LSTM with projections (a notice, not an error)
            warnings.filterwarnings("ignore", message="LSTM with projections is not supported with oneDNN")
            got = _autocast_step(lstm, x, y, device, dtype, scaler)
        if got != dtype:
            if device.type == "cuda" and dtype == torch.bfloat16 and got == torch.float16:
                return (
                    "known: nn.LSTM under bfloat16 autocast runs in float16 on CUDA: PyTorch's autocast wrapper "
                    "for cuDNN RNNs (aten/src/ATen/cudnn/AutocastRNN.cpp) casts input, states and weights to "
                    "half whatever the autocast dtype, so such an LSTM needs a loss scaler; no experiment trains "
                    "an LSTM in BF16 on CUDA"
                )
            raise RuntimeError(f"LSTM output is {got} under {dtype} autocast")
        return f"LSTM with projections, output {str(got).replace('torch.', '')}"

    return check


def _conv_check(dtype):
    def check(device) -> str:
        torch.manual_seed(0)
        net = torch.nn.Sequential(
            torch.nn.Conv2d(3, 32, 3, padding=1),
            torch.nn.BatchNorm2d(32),
            torch.nn.ReLU(),
            torch.nn.Conv2d(32, 8, 3, padding=1),
        ).to(device, memory_format=torch.channels_last)
        x = torch.randn(4, 3, 32, 32, device=device).to(memory_format=torch.channels_last)
        scaler = torch.amp.GradScaler(device.type) if dtype == torch.float16 else None
        got = _autocast_step(net, x, torch.randn(4, 8, 32, 32, device=device), device, dtype, scaler)
        if got != dtype:
            raise RuntimeError(f"conv output is {got} under {dtype} autocast")
        return f"conv net (channels last), output {str(got).replace('torch.', '')}"

    return check


def _check_grad_scaler(device) -> str:
    w = torch.nn.Parameter(torch.ones(4, device=device))
    opt = torch.optim.SGD([w], lr=0.1)
    scaler = torch.amp.GradScaler(device.type, init_scale=2.0**16)
    scaler.scale(w.sum() * float("inf")).backward()  # an overflow: the step is skipped, the scale halves
    scaler.step(opt)
    scaler.update()
    if scaler.get_scale() != 2.0**15 or not torch.equal(w.detach(), torch.ones(4, device=device)):
        raise RuntimeError(f"after an inf gradient: scale {scaler.get_scale()}, weights {w.detach().tolist()}")
    opt.zero_grad()
    scaler.scale(w.sum()).backward()
    scaler.step(opt)
    scaler.update()
    if not torch.allclose(w.detach(), torch.full((4,), 0.9, device=device)):
        raise RuntimeError(f"after a finite gradient the weights are {w.detach().tolist()}, expected 0.9")
    return f"torch.amp.GradScaler({device.type!r}): skipped the inf step, scale 2^16 → 2^15, then stepped"


def _check_fp8(device) -> str:
    if device.type != "cuda":
        return "skipped: FP8 tensor cores need a CUDA GPU"
    if not hardware_fp8_available(device):
        cap = torch.cuda.get_device_capability(device)
        return f"skipped: compute capability {cap[0]}.{cap[1]} < 8.9 (or no torch._scaled_mm): emulation only"
    torch.manual_seed(0)
    worst = 0.0
    for fa, fb in ((FP8_E4M3, FP8_E4M3), (FP8_E5M2, FP8_E4M3)):  # forward, and the backward's gradient
        a, b = torch.randn(64, 128, device=device), torch.randn(32, 128, device=device)
        sa = ScaledTensor(*quantize_per_tensor(a, fa), fa, torch.float32)
        sb = ScaledTensor(*quantize_per_tensor(b, fb), fb, torch.float32)
        q = Quantizer("fp8_current", hardware=True)
        hw = q.matmul(sa.dequantize(), sb.dequantize(), sa, sb, tb=True)
        ref = sa.dequantize().double() @ sb.dequantize().double().t()
        if q.gemms["hardware"] != 1:
            raise RuntimeError(f"the product did not run on the tensor cores ({q.gemms})")
        worst = max(worst, float((hw.double() - ref).abs().max() / ref.abs().max()))
    # Not bit-exact: Hopper's FP8 tensor cores keep about 14 bits while they accumulate (DeepSeek-V3, §3.3.2; chapter
    # 5 measures it), and the first lent H200 gave 2.8e-4 of the largest output here (K = 128).  A wrong scale or a
    # transposed operand is off by far more than 1e-3.
    if worst > 1e-3:
        raise RuntimeError(
            f"torch._scaled_mm differs from the exact product of the FP8 operands by {worst:.2g} "
            "of the largest output (more than the tensor cores' narrow accumulation explains)"
        )
    return (
        f"torch._scaled_mm E4M3×E4M3 and E5M2×E4M3 within {worst:.1g} of the exact product (relative to the "
        "largest output; the tensor cores accumulate in about 14 bits)"
    )


def _check_gat(device) -> str:
    from ..models.gat import GAT  # imports PyTorch Geometric (seconds): only when this check runs

    torch.manual_seed(0)
    model = GAT(16, 8, 4, (2, 2, 2)).to(device)
    x = torch.randn(50, 16, device=device)
    ei = torch.randint(0, 50, (2, 300), device=device)
    ei = torch.cat([ei, torch.arange(50, device=device).repeat(2, 1)], 1)
    dtype = torch.float16 if device.type == "cuda" else torch.bfloat16
    scaler = torch.amp.GradScaler(device.type) if dtype == torch.float16 else None
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    with autocast_to(device.type, dtype):
        loss = torch.nn.functional.cross_entropy(model(x, ei), torch.randint(0, 4, (50,), device=device))
    backward_step(loss, opt, scaler)
    loss = float(loss.detach())
    if not math.isfinite(loss):
        raise RuntimeError(f"non-finite loss {loss}")
    return f"PyG GATConv, {str(dtype).replace('torch.', '')} autocast, loss {loss:.3f}"


def _process_group(backend: str, device) -> str:
    if dist.is_initialized():
        return "skipped: a process group is already initialised in this process"
    dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    try:
        t = torch.ones(8, device=device)
        dist.all_reduce(t)
        if not torch.equal(t, torch.ones(8, device=device)):
            raise RuntimeError(f"all_reduce over one rank changed the tensor: {t.tolist()}")
    finally:
        dist.destroy_process_group()
    return f"{backend}, one rank, all_reduce on {device.type}"


def _check_nccl(device) -> str:
    if device.type != "cuda":
        return "skipped: NCCL needs CUDA"
    if not dist.is_nccl_available():
        raise RuntimeError("this torch has no NCCL")
    out = _process_group("nccl", device)
    return f"{out}; NCCL {'.'.join(map(str, torch.cuda.nccl.version()))}"


def _check_gloo(device) -> str:
    if not dist.is_gloo_available():
        raise RuntimeError("this torch has no gloo")
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    where = (
        "NCCL, one rank per GPU"
        if gpus >= 2
        else "gloo, two ranks on the CPU (NCCL takes one rank per GPU)"
        if gpus == 1
        else "gloo on the CPU"
    )
    return f"{_process_group('gloo', torch.device('cpu'))}; the distributed experiment will use {where}"


def _check_histogram(device) -> str:
    return check_kernel(device)


def _check_graph_capture(device) -> str:
    if device.type != "cuda":
        return "skipped: CUDA graphs need CUDA (a CPU runs the same step uncaptured: the smoke runs test it)"
    out = []
    for dtype in (torch.float16, torch.bfloat16):
        weights = []
        for capture in ("eager", "cuda_graph"):
            torch.manual_seed(0)
            net = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64)).to(device)
            opt = torch.optim.SGD(net.parameters(), lr=0.1, fused=True)
            scaler = torch.amp.GradScaler("cuda") if dtype == torch.float16 else None
            data = [(torch.randn(16, 64, device=device), torch.randn(16, 64, device=device)) for _ in range(3)]
            step = StaticStep(
                net, torch.nn.functional.mse_loss, opt, *data[0], dtype=dtype, scaler=scaler, capture=capture, warmup=1
            )
            for x, y in data:
                step(x, y)
            synchronize(device)
            if step.captured != capture:
                raise RuntimeError(f"asked for {capture}, ran {step.captured}")
            weights.append([p.detach().clone() for p in net.parameters()])
        if not all(torch.equal(a, b) for a, b in zip(*weights)):
            worst = max(float((a - b).abs().max()) for a, b in zip(*weights))
            raise RuntimeError(f"{dtype}: the replayed graph's weights differ from the eager step's by {worst:.3g}")
        out.append(str(dtype).replace("torch.", ""))
    seen = profile_steps(lambda: step(*data[0]), 2, device)  # what amp_recipe's profile of a replay will see
    return (
        f"a whole step (autocast {' and '.join(out)}, GradScaler, SGD(fused=True)) captured with "
        "torch.cuda.graph and replayed: the weights of the eager step, bit for bit; the profiler sees "
        f"{seen['kernels_per_step']:.0f} kernels per replay, GPU busy {seen['busy_fraction'] or 0:.0%}"
    )


def _check_profiler(device) -> str:
    a = torch.randn(256, 256, device=device)
    p = profile_steps(lambda: a @ a, 3, device)
    if p["kernels_per_step"] < 1 or not p["kernels"]:
        raise RuntimeError(f"torch.profiler saw no {p['what']}")
    if device.type == "cuda" and not p["busy_fraction"]:
        raise RuntimeError("torch.profiler saw CUDA kernels but no busy time")
    busy = f", GPU busy {p['busy_fraction']:.0%}" if p["busy_fraction"] is not None else ""
    return f"{p['what']}: {next(iter(p['kernels']))[:60]}{busy}"


def _check_fp8_gemm(device) -> str:
    if device.type != "cuda":
        return "skipped: the roofline's FP8 products run on FP8 tensor cores (CUDA, compute capability ≥ 8.9)"
    rows = [gemm_tflops(kind, 256, 256, 256, device, repeat=1, min_seconds=0.005) for kind in ("fp8", "fp8_fast")]
    if all(r["tflops"] is None for r in rows) and "compute capability" in rows[0]["reason"]:
        return f"skipped: {rows[0]['reason']}"
    bad = [f"{r['kind']}: {r['reason']}" for r in rows if r["tflops"] is None]
    if bad:
        raise RuntimeError("; ".join(bad))
    return (
        "torch._scaled_mm, use_fast_accum off and on: "
        + ", ".join(f"{r['tflops']:.1f}" for r in rows)
        + " TFLOP/s at 256³"
    )


def _check_sampler(device) -> str:
    if device.type != "cuda":
        return "skipped: clocks and power are sampled on a GPU"
    with GpuSampler(device.index or 0, 0.05) as s:
        time.sleep(0.3)
    summary = s.summary()
    if summary["source"] is None:
        return f"no clocks or power in the roofline: {summary['absent']}"
    sm = summary["sm_clock_mhz"]
    return (
        f"{summary['source']}: {summary['samples']} samples, SM clock {sm['mean']:.0f} MHz"
        if sm
        else f"{summary['source']}: {summary['samples']} samples"
    )


def _check_memory_per_parameter(device) -> str:
    got = {m: memory_per_parameter(m, 512, 2, 8, 2, device) for m in MEMORY_MODES}
    off = {m: d["resident_per_parameter"] for m, d in got.items() if abs(d["resident_per_parameter"] - 16) > 0.5}
    if off:
        raise RuntimeError(f"resident bytes per parameter {off}, expected 16 (parameters, gradients, Adam's state)")
    return (
        "resident bytes per parameter "
        + ", ".join(f"{m} {d['resident_per_parameter']:.2f}" for m, d in got.items())
        + f" ({got['fp32']['method'][:40]})"
    )


_LSTMS = ("biglstm", "lm_gradient_scale")
_FP16_ARMS = ("loss_scaling", "biglstm", "ssd_table2", "amp_recipe", "memory_tradeoffs", "gat_amp", "lm_gradient_scale")
_HISTOGRAMS = ("ssd_histogram", "gradient_factors", "lm_gradient_scale", "biglstm", "ssd_table2")

#: The preflight's checks, in order (see the module docstring).
PREFLIGHT_CHECKS = (
    Check(
        "CUDA-event timing",
        _check_timing,
        "amp_recipe, memory_tradeoffs, roofline (mpt_lab.bench.time_call)",
        ("amp_recipe", "memory_tradeoffs", "roofline", "tensor_core_accumulation"),
    ),
    Check(
        "allocator peak after reset",
        _check_peak_memory,
        "amp_recipe, memory_tradeoffs, gat_amp",
        ("amp_recipe", "memory_tradeoffs", "gat_amp", "memory_per_parameter"),
    ),
    Check("float16 autocast, LSTM + GradScaler", _lstm_check(torch.float16), "biglstm, lm_gradient_scale", _LSTMS),
    Check(
        "bfloat16 autocast, LSTM",
        _lstm_check(torch.bfloat16),
        "no experiment (a known limitation, chapters 3, 6, 9)",
        _LSTMS,
    ),
    Check(
        "float16 autocast, conv net + GradScaler",
        _conv_check(torch.float16),
        "ssd_table2, memory_tradeoffs",
        ("ssd_table2", "memory_tradeoffs"),
    ),
    Check("bfloat16 autocast, conv net", _conv_check(torch.bfloat16), "memory_tradeoffs", ("memory_tradeoffs",)),
    Check("GradScaler skips an inf step", _check_grad_scaler, "loss_scaling, every FP16 arm", _FP16_ARMS),
    Check(
        "FP8 tensor cores (torch._scaled_mm)",
        _check_fp8,
        "fp8_recipes (hardware runs), tensor_core_accumulation",
        ("fp8_recipes", "tensor_core_accumulation"),
    ),
    Check("PyG GATConv under autocast", _check_gat, "gat_amp", ("gat_amp",)),
    Check("NCCL process group, one rank", _check_nccl, "distributed (two or more GPUs)", ("distributed",)),
    Check("gloo process group", _check_gloo, "distributed (one GPU or none)", ("distributed",)),
    Check("gradient-histogram kernel on the device", _check_histogram, "every GradientHistogram", _HISTOGRAMS),
    Check(
        "CUDA graph of a whole training step",
        _check_graph_capture,
        "amp_recipe (the GPU-limited step)",
        ("amp_recipe",),
    ),
    Check(
        "torch.profiler kernels",
        _check_profiler,
        "amp_recipe, tensor_core_accumulation",
        ("amp_recipe", "tensor_core_accumulation"),
    ),
    Check("FP8 GEMMs, fast accumulation off and on", _check_fp8_gemm, "roofline", ("roofline",)),
    Check("GPU clocks and power", _check_sampler, "roofline", ("roofline",)),
    Check(
        "allocator bytes per parameter", _check_memory_per_parameter, "memory_per_parameter", ("memory_per_parameter",)
    ),
)


def needed_checks(only: Iterable[str] | None = None, checks: Sequence[Check] | None = None) -> tuple:
    """The checks (of ``checks``, default :data:`PREFLIGHT_CHECKS`) that the experiments named in ``only`` (an
    iterable of names; None: all) take: those whose ``needed_by`` is empty or shares a name with ``only``, in
    order."""
    checks = PREFLIGHT_CHECKS if checks is None else checks
    if only is None:
        return tuple(checks)
    only = set(only)
    return tuple(c for c in checks if not c.needed_by or only & set(c.needed_by))


def run_checks(
    device: DeviceLike = None, checks: Sequence[Check] = PREFLIGHT_CHECKS, echo: Callable[[str], object] = print
) -> list:
    """Run ``checks`` on ``device`` (default :func:`default_device`), echoing one line each.

    Returns a list of dicts {name, status ("ok", "skipped", "known", "FAILED"), detail, seconds}.  A check that
    raises is FAILED with its error; the others still run.
    """
    device = resolve(device)
    rows = []
    width = max(len(c.name) for c in checks)
    for c in checks:
        t0 = time.perf_counter()
        try:
            detail = str(c.fn(device))
            status = next((w for w in ("skipped", "known") if detail.startswith(w + ":")), "ok")
            if status != "ok":
                detail = detail.split(":", 1)[1].strip()
        except Exception as err:  # the point: report every failing path, not only the first
            status, detail = "FAILED", f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
        synchronize(device)
        rows.append({"name": c.name, "status": status, "detail": detail, "seconds": time.perf_counter() - t0})
        echo(f"{c.name:<{width}}  {status:<7} {detail}  ({rows[-1]['seconds']:.2f} s)")
    return rows


def preflight(echo: Callable[[str], object] = print, only: Iterable[str] | None = None) -> int:
    """The preflight of a GPU machine: :func:`run_checks` on the CUDA device, of the checks that the experiments
    named in ``only`` need (:func:`needed_checks`; None: all); the exit status (0: nothing failed, also without
    CUDA, where it checks nothing and says so; 1: a check failed; "known" limitations are not failures)."""
    echo(
        f"torch {torch.__version__}, CUDA {torch.version.cuda or 'none (a CPU build)'}, Python {sys.version.split()[0]}"
    )
    if not torch.cuda.is_available():
        echo(
            "no CUDA device: nothing to check here (the preflight exercises the experiments' CUDA paths; "
            "on a CPU the tests cover them)"
        )
        return 0
    echo(f"device: {describe('cuda')}, {torch.cuda.device_count()} GPU(s)")
    t0 = time.perf_counter()
    checks = needed_checks(only)
    left_out = [c.name for c in PREFLIGHT_CHECKS if c not in checks]
    if left_out:
        echo(f"not needed by {', '.join(sorted(only))}: {'; '.join(left_out)}")
    rows = run_checks(torch.device("cuda"), checks=checks, echo=echo)
    failed = [r["name"] for r in rows if r["status"] == "FAILED"]
    known = [r["name"] for r in rows if r["status"] == "known"]
    echo(
        f"preflight: {len(rows) - len(failed)} of {len(rows)} paths ok, skipped or known, {len(failed)} failed "
        f"({time.perf_counter() - t0:.1f} s)"
        + (f": {', '.join(failed)}" if failed else "")
        + (f"; known PyTorch limitations: {', '.join(known)}" if known else "")
    )
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    """``python -m mpt_lab.harness.preflight [--only a,b]``: the preflight (:func:`preflight`); returns its exit
    status."""
    p = argparse.ArgumentParser(prog="python -m mpt_lab.harness.preflight", description=__doc__.splitlines()[0])
    p.add_argument(
        "--only",
        default="",
        help="comma-separated experiments (and benchmarks) still to run; only the checks they need run",
    )
    args = p.parse_args(argv)
    only = [n.strip() for n in args.only.split(",") if n.strip()] or None
    return preflight(only=only)


if __name__ == "__main__":
    raise SystemExit(main())
