"""Device choice and description, for running experiments and recording where results came from; and the
preflight of a GPU machine.

``python -m mpt_lab.device`` prints this machine's device and library versions; ``python -m mpt_lab.device
--preflight [--only a,b]`` runs, once each and in a few seconds, the CUDA code paths that the experiments (or only
those named: what a GPU slot still has to run) use (:data:`PREFLIGHT_CHECKS`: CUDA-event timing, the caching
allocator's peak after a reset, float16 and bfloat16 autocast on an LSTM with projections and on a conv net,
``torch.amp.GradScaler("cuda")`` skipping a step with an inf, FP8 tensor-core products through
``torch._scaled_mm`` where the compute capability is ≥ 8.9, PyG's GATConv under autocast, an NCCL process group of
one rank, gloo for the distributed experiment's ranks; the gradient-histogram kernel on CUDA against the CPU's, a
whole training step captured in a CUDA graph, ``torch.profiler``'s CUDA kernels, the roofline's FP8 GEMMs with
fast accumulation off and on, the GPU's clocks and power, the allocator's counters per parameter) and prints one
line per path: ``ok`` with what it saw, ``skipped`` with why, ``known`` for a known limitation of PyTorch that no
experiment depends on (bfloat16 autocast runs cuDNN's LSTM in float16), or ``FAILED`` with the error.  Exit
status: 0 when nothing failed (also on a machine without CUDA, where it says so and checks nothing), 1 when a check
failed.

(The preflight lives here for now, importing what it checks from the floors above inside its functions; it is
to move to the top floor, beside the slot script.)
"""

from __future__ import annotations

import argparse
import datetime as _dt
import math
import os
import platform
import sys
import time
import warnings
from dataclasses import dataclass
from typing import Any, Callable

import torch

from ._torch_internals import onednn_bf16_supported, onednn_fp16_supported

__all__ = ["default_device", "resolve", "synchronize", "describe", "cpu_flags", "CpuKernels", "cpu_kernels",
           "versions", "backends", "provenance", "PREFLIGHT_CHECKS", "Check", "needed_checks", "run_checks",
           "preflight", "main"]

#: CPU instruction-set extensions that decide how fast FP16/BF16 run on a CPU (Linux names in /proc/cpuinfo).
CPU_FEATURES = ("avx2", "avx512f", "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16", "amx_fp16", "f16c")


def default_device() -> torch.device:
    """``cuda`` when a CUDA device is present, else ``cpu``."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def resolve(device: Any = "auto") -> torch.device:
    """``device`` as a :class:`torch.device`: ``"auto"`` or None is :func:`default_device`.

    Raises
    ------
    TypeError
        ``device`` is not a torch.device, a str or None.
    ValueError
        A string torch does not know as a device (e.g. ``"gpu"``).
    """
    if device is None or (isinstance(device, str) and device == "auto"):
        return default_device()
    if isinstance(device, torch.device):
        return device
    if not isinstance(device, str):
        raise TypeError(f"device must be a torch.device, a str or None, got {type(device).__name__}")
    try:
        return torch.device(device)
    except RuntimeError as err:
        raise ValueError(f"device must be 'auto', 'cpu', 'cuda' or 'cuda:N', got {device!r}") from err


def synchronize(device: Any = None) -> None:
    """Wait for the work queued on ``device`` (CUDA kernels run asynchronously); a no-op on a CPU.

    Call it before reading a clock, so that a time covers the work and not only its launch.
    """
    if device is None:
        return
    device = torch.device(device) if not isinstance(device, torch.device) else device
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def cpu_flags() -> list:
    """Which of :data:`CPU_FEATURES` this CPU has (read from ``/proc/cpuinfo``; an empty list elsewhere).

    Without ``avx512_bf16``/``amx_bf16`` a CPU has no bfloat16 dot-product instructions and bfloat16 matrix
    products run no faster than float16 ones (measured on this project's machines: both ≈ 10 GFLOP/s against
    ≈ 80 for float32); with them bfloat16 runs about twice as fast as float32.
    """
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    have = set(line.split(":", 1)[1].split())
                    return [w for w in CPU_FEATURES if w in have]
    except OSError:
        pass
    return []


@dataclass(frozen=True)
class CpuKernels:
    """Which of PyTorch's CPU kernels compute float16 and bfloat16 in this process.

    The same torch build takes different kernels on different CPUs, and so computes different float16 results:

    * ``capability``: the instruction set of ATen's vectorised kernels (element-wise ops, reductions, its own
      matrix products), ``torch.backends.cpu.get_cpu_capability()``: ``"AVX512"``, ``"AVX2"``, ``"DEFAULT"``
      (no vectors) or another name; capped by the environment variable ``ATEN_CPU_CAPABILITY``.
    * ``onednn_fp16`` / ``onednn_bf16``: whether PyTorch sends float16 (bfloat16) convolutions to oneDNN.  It
      does where oneDNN has native kernels for the type (AVX-512 FP16 or AMX for float16; AVX-512 BF16, AMX, or
      AVX-512 emulation for bfloat16), capped by ``ONEDNN_MAX_CPU_ISA``.  oneDNN's float16 convolution
      accumulates in FP32 and rounds each output once, forward and backward; without it PyTorch runs ATen's
      fallback (``thnn_conv2d``: im2col and a float16 GEMM per image), which rounds a weight gradient to float16
      after each image of the batch and sums the overlapping input-gradient contributions (``col2im``) in
      float16.  Measured with torch 2.13.0 on this project's CPUs (``tests/test_simulate.py``).

    Source: PyTorch's ``aten/src/ATen/native/mkldnn`` (the ``mkldnn_fp16_device_check``) and
    ``aten/src/ATen/native/ConvolutionMM2d.cpp`` (the fallback).
    """

    capability: str
    onednn_fp16: bool
    onednn_bf16: bool

    @property
    def fp16_convolution(self) -> str:
        """``"onednn"`` (FP32 accumulation, one rounding per output) or ``"aten"`` (rounds per image)."""
        return "onednn" if self.onednn_fp16 else "aten"

    def describe(self) -> str:
        """E.g. ``"ATen AVX512; oneDNN float16 and bfloat16"`` or ``"ATen AVX2; no oneDNN float16/bfloat16"``."""
        have = [n for n, ok in (("float16", self.onednn_fp16), ("bfloat16", self.onednn_bf16)) if ok]
        one = f"oneDNN {' and '.join(have)}" if have else "no oneDNN float16/bfloat16"
        return f"ATen {self.capability}; {one}"


def cpu_kernels() -> CpuKernels:
    """The float16/bfloat16 kernels PyTorch uses on this CPU, in this process (see :class:`CpuKernels`).

    Returns
    -------
    CpuKernels
    """
    return CpuKernels(capability=str(torch.backends.cpu.get_cpu_capability()),
                      onednn_fp16=onednn_fp16_supported(), onednn_bf16=onednn_bf16_supported())


def describe(device: Any = None) -> str:
    """One line naming the device, for the provenance of a result.

    Parameters
    ----------
    device : torch.device, str or None
        ``None`` describes :func:`default_device`.

    Returns
    -------
    str, e.g. ``"NVIDIA H100 80GB HBM3 (sm_90, 79.2 GiB), CUDA 12.8"`` or
    ``"CPU: AMD EPYC 9B14 (2 cores, torch threads 1; ATen AVX2; no oneDNN float16/bfloat16)"``: on a CPU, the
    kernels PyTorch uses for float16 and bfloat16 (:func:`cpu_kernels`), which decide its float16 results.

    Raises
    ------
    TypeError
        ``device`` is not a torch.device, a str or None.
    """
    if device is None:
        device = default_device()
    if isinstance(device, str):
        device = torch.device(device)
    if not isinstance(device, torch.device):
        raise TypeError(f"device must be a torch.device, a str or None, got {type(device).__name__}")
    if device.type == "cuda":
        idx = device.index if device.index is not None else torch.cuda.current_device()
        p = torch.cuda.get_device_properties(idx)
        return (f"{p.name} (sm_{p.major}{p.minor}, {p.total_memory / 2**30:.1f} GiB), "
                f"CUDA {torch.version.cuda}")
    if device.type == "cpu":
        return (f"CPU: {_cpu_name()} ({os.cpu_count()} cores, torch threads {torch.get_num_threads()}; "
                f"{cpu_kernels().describe()})")
    return str(device)


def versions() -> dict:
    """Versions of Python and the libraries that results depend on."""
    import numpy

    out = {"python": sys.version.split()[0], "torch": torch.__version__, "numpy": numpy.__version__,
           "platform": platform.platform()}
    if torch.version.cuda:
        out["cuda"] = torch.version.cuda
    if torch.cuda.is_available() and torch.backends.cudnn.is_available():
        out["cudnn"] = str(torch.backends.cudnn.version())
    try:
        import ml_dtypes

        out["ml_dtypes"] = ml_dtypes.__version__
    except ImportError:  # pragma: no cover
        pass
    from . import __version__

    out["mpt_lab"] = __version__
    return out


def backends() -> dict:
    """The switches that decide which arithmetic float32 products and convolutions use on CUDA, as they are now:

    ``cuda_matmul_allow_tf32`` (``torch.backends.cuda.matmul.allow_tf32``: float32 matrix products on TF32 tensor
    cores; False by default), ``cudnn_allow_tf32`` (``torch.backends.cudnn.allow_tf32``: cuDNN's float32
    convolutions in TF32; **True** by default, so a "FP32" convolution on an Ampere or later GPU computes in TF32),
    ``float32_matmul_precision`` (``torch.get_float32_matmul_precision()``), ``cudnn_benchmark``,
    ``cudnn_deterministic``, ``cuda_matmul_allow_fp16_reduced_precision_reduction`` and
    ``…_bf16_…`` (reduced-precision reductions inside 16-bit GEMMs), and where this torch has them the
    ``fp32_precision`` settings of the newer API (``torch.backends.cuda.matmul.fp32_precision``,
    ``torch.backends.cudnn.conv.fp32_precision``).  Recorded in every result's provenance (the runner), so a
    saved "FP32" time says whether TF32 was allowed.  The values are the same on a CPU build (they then decide
    nothing)."""
    m = torch.backends.cuda.matmul
    out = {"cuda_matmul_allow_tf32": bool(m.allow_tf32), "cudnn_allow_tf32": bool(torch.backends.cudnn.allow_tf32),
           "float32_matmul_precision": torch.get_float32_matmul_precision(),
           "cudnn_benchmark": bool(torch.backends.cudnn.benchmark),
           "cudnn_deterministic": bool(torch.backends.cudnn.deterministic),
           "cuda_matmul_allow_fp16_reduced_precision_reduction": bool(m.allow_fp16_reduced_precision_reduction),
           "cuda_matmul_allow_bf16_reduced_precision_reduction": bool(m.allow_bf16_reduced_precision_reduction)}
    for name, obj in (("cuda_matmul_fp32_precision", m), ("cudnn_conv_fp32_precision",
                                                          getattr(torch.backends.cudnn, "conv", None))):
        try:
            value = getattr(obj, "fp32_precision", None) if obj is not None else None
        except Exception:  # pragma: no cover - an older torch without the setting
            value = None
        if isinstance(value, str):
            out[name] = value
    return out


def provenance(command: str | None = None, config: dict | None = None, device: Any = None) -> dict:
    """Where a measured result came from: command, device, versions, UTC date, configuration, the TF32 and cuDNN
    switches (:func:`backends`) and the machine's load average (so a time measured while other work ran can be read
    as such).

    Parameters
    ----------
    command : str or None
        The command that regenerates the result (defaults to this process's command line).
    config : dict or None
        The configuration of the run.
    device : as :func:`describe`.
    """
    if command is None:
        command = " ".join([os.path.basename(sys.executable)] + sys.argv)
    return {"command": command, "device": describe(device), "versions": versions(),
            "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "profile": _profile_or_none(), "config": dict(config or {}), "backends": backends(),
            "load_average": _load_average()}


def _load_average() -> list | None:
    """The machine's 1-, 5- and 15-minute load averages when the result was made (None where the OS has none):
    a time measured while other processes ran says so."""
    try:
        return [round(v, 2) for v in os.getloadavg()]
    except (AttributeError, OSError):
        return None


def _profile_or_none():
    from . import profile

    try:
        return profile()
    except ValueError:
        return None


# ============================================================================================ the preflight
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
    from .bench import time_call

    a = torch.randn(512, 512, device=device)
    t = time_call(lambda: a @ a, repeat=3, warmup=1, device=device, timer="auto")
    want = "cuda_event" if device.type == "cuda" else "wall"
    if t.method != want or not t.min > 0:
        raise RuntimeError(f"time_call used {t.method!r} ({t.min!r} s), expected {want!r} and a positive time")
    return f"{t.method}, {t.min * 1e6:.0f} µs for a 512² product"


def _check_peak_memory(device) -> str:
    from .bench import peak_memory

    a = torch.randn(1024, 1024, device=device)
    peak = peak_memory(lambda: a @ a, device)
    if peak < a.numel() * 4:
        raise RuntimeError(f"peak {peak} bytes, expected at least the 4 MiB product")
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        block = torch.empty(2 ** 20, device=device)
        top = torch.cuda.max_memory_allocated(device)
        if top < block.numel() * 4:
            raise RuntimeError(f"max_memory_allocated after reset_peak_memory_stats is {top} bytes, less than the "
                               f"{block.numel() * 4} just allocated")
    return f"{peak / 2 ** 20:.1f} MiB for a 1024² product"


def _autocast_step(model, batch, target, device, dtype, scaler=None) -> torch.dtype:
    """One training step of ``model`` under autocast to ``dtype``: the dtype its output had."""
    from .training import autocast_to, backward_step

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
        lstm = torch.nn.LSTM(64, 256, num_layers=2, proj_size=64).to(device)   # as mpt_lab.models.lstm
        x, y = torch.randn(16, 8, 64, device=device), torch.randn(16, 8, 64, device=device)
        scaler = torch.amp.GradScaler(device.type) if dtype == torch.float16 else None
        with warnings.catch_warnings():     # a CPU's oneDNN has no LSTM with projections (a notice, not an error)
            warnings.filterwarnings("ignore", message="LSTM with projections is not supported with oneDNN")
            got = _autocast_step(lstm, x, y, device, dtype, scaler)
        if got != dtype:
            if device.type == "cuda" and dtype == torch.bfloat16 and got == torch.float16:
                return ("known: nn.LSTM under bfloat16 autocast runs in float16 on CUDA: PyTorch's autocast wrapper "
                        "for cuDNN RNNs (aten/src/ATen/cudnn/AutocastRNN.cpp) casts input, states and weights to "
                        "half whatever the autocast dtype, so such an LSTM needs a loss scaler; no experiment trains "
                        "an LSTM in BF16 on CUDA")
            raise RuntimeError(f"LSTM output is {got} under {dtype} autocast")
        return f"LSTM with projections, output {str(got).replace('torch.', '')}"
    return check


def _conv_check(dtype):
    def check(device) -> str:
        torch.manual_seed(0)
        net = torch.nn.Sequential(torch.nn.Conv2d(3, 32, 3, padding=1), torch.nn.BatchNorm2d(32), torch.nn.ReLU(),
                                  torch.nn.Conv2d(32, 8, 3, padding=1)).to(device, memory_format=torch.channels_last)
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
    scaler = torch.amp.GradScaler(device.type, init_scale=2.0 ** 16)
    scaler.scale(w.sum() * float("inf")).backward()     # an overflow: the step is skipped, the scale halves
    scaler.step(opt)
    scaler.update()
    if scaler.get_scale() != 2.0 ** 15 or not torch.equal(w.detach(), torch.ones(4, device=device)):
        raise RuntimeError(f"after an inf gradient: scale {scaler.get_scale()}, weights {w.detach().tolist()}")
    opt.zero_grad()
    scaler.scale(w.sum()).backward()
    scaler.step(opt)
    scaler.update()
    if not torch.allclose(w.detach(), torch.full((4,), 0.9, device=device)):
        raise RuntimeError(f"after a finite gradient the weights are {w.detach().tolist()}, expected 0.9")
    return f"torch.amp.GradScaler({device.type!r}): skipped the inf step, scale 2^16 → 2^15, then stepped"


def _check_fp8(device) -> str:
    from .formats import FP8_E4M3, FP8_E5M2
    from .microscaling import ScaledTensor, quantize_per_tensor
    from .quantized_training import Quantizer, hardware_fp8_available

    if device.type != "cuda":
        return "skipped: FP8 tensor cores need a CUDA GPU"
    if not hardware_fp8_available(device):
        cap = torch.cuda.get_device_capability(device)
        return f"skipped: compute capability {cap[0]}.{cap[1]} < 8.9 (or no torch._scaled_mm): emulation only"
    torch.manual_seed(0)
    worst = 0.0
    for fa, fb in ((FP8_E4M3, FP8_E4M3), (FP8_E5M2, FP8_E4M3)):      # forward, and the backward's gradient
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
        raise RuntimeError(f"torch._scaled_mm differs from the exact product of the FP8 operands by {worst:.2g} "
                           "of the largest output (more than the tensor cores' narrow accumulation explains)")
    return (f"torch._scaled_mm E4M3×E4M3 and E5M2×E4M3 within {worst:.1g} of the exact product (relative to the "
            "largest output; the tensor cores accumulate in about 14 bits)")


def _check_gat(device) -> str:
    from .models.gat import GAT

    torch.manual_seed(0)
    model = GAT(16, 8, 4, (2, 2, 2)).to(device)
    x = torch.randn(50, 16, device=device)
    ei = torch.randint(0, 50, (2, 300), device=device)
    ei = torch.cat([ei, torch.arange(50, device=device).repeat(2, 1)], 1)
    from .training import autocast_to, backward_step

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
    import torch.distributed as dist

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
    import torch.distributed as dist

    if device.type != "cuda":
        return "skipped: NCCL needs CUDA"
    if not dist.is_nccl_available():
        raise RuntimeError("this torch has no NCCL")
    out = _process_group("nccl", device)
    return f"{out}; NCCL {'.'.join(map(str, torch.cuda.nccl.version()))}"


def _check_gloo(device) -> str:
    import torch.distributed as dist

    if not dist.is_gloo_available():
        raise RuntimeError("this torch has no gloo")
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    where = ("NCCL, one rank per GPU" if gpus >= 2 else
             "gloo, two ranks on the CPU (NCCL takes one rank per GPU)" if gpus == 1 else "gloo on the CPU")
    return f"{_process_group('gloo', torch.device('cpu'))}; the distributed experiment will use {where}"


def _check_histogram(device) -> str:
    from .histogram import check_kernel

    return check_kernel(device)


def _check_graph_capture(device) -> str:
    from .training import StaticStep

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
            step = StaticStep(net, torch.nn.functional.mse_loss, opt, *data[0], dtype=dtype, scaler=scaler,
                              capture=capture, warmup=1)
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
    from .bench import profile_steps

    seen = profile_steps(lambda: step(*data[0]), 2, device)     # what amp_recipe's profile of a replay will see
    return (f"a whole step (autocast {' and '.join(out)}, GradScaler, SGD(fused=True)) captured with "
            "torch.cuda.graph and replayed: the weights of the eager step, bit for bit; the profiler sees "
            f"{seen['kernels_per_step']:.0f} kernels per replay, GPU busy {seen['busy_fraction'] or 0:.0%}")


def _check_profiler(device) -> str:
    from .bench import profile_steps

    a = torch.randn(256, 256, device=device)
    p = profile_steps(lambda: a @ a, 3, device)
    if p["kernels_per_step"] < 1 or not p["kernels"]:
        raise RuntimeError(f"torch.profiler saw no {p['what']}")
    if device.type == "cuda" and not p["busy_fraction"]:
        raise RuntimeError("torch.profiler saw CUDA kernels but no busy time")
    busy = f", GPU busy {p['busy_fraction']:.0%}" if p["busy_fraction"] is not None else ""
    return f"{p['what']}: {next(iter(p['kernels']))[:60]}{busy}"


def _check_fp8_gemm(device) -> str:
    from .bench import gemm_tflops

    if device.type != "cuda":
        return "skipped: the roofline's FP8 products run on FP8 tensor cores (CUDA, compute capability ≥ 8.9)"
    rows = [gemm_tflops(kind, 256, 256, 256, device, repeat=1, min_seconds=0.005) for kind in ("fp8", "fp8_fast")]
    if all(r["tflops"] is None for r in rows) and "compute capability" in rows[0]["reason"]:
        return f"skipped: {rows[0]['reason']}"
    bad = [f"{r['kind']}: {r['reason']}" for r in rows if r["tflops"] is None]
    if bad:
        raise RuntimeError("; ".join(bad))
    return "torch._scaled_mm, use_fast_accum off and on: " + ", ".join(f"{r['tflops']:.1f}" for r in rows) + \
        " TFLOP/s at 256³"


def _check_sampler(device) -> str:
    from .bench import GpuSampler

    if device.type != "cuda":
        return "skipped: clocks and power are sampled on a GPU"
    with GpuSampler(device.index or 0, 0.05) as s:
        time.sleep(0.3)
    summary = s.summary()
    if summary["source"] is None:
        return f"no clocks or power in the roofline: {summary['absent']}"
    sm = summary["sm_clock_mhz"]
    return f"{summary['source']}: {summary['samples']} samples, SM clock {sm['mean']:.0f} MHz" if sm else \
        f"{summary['source']}: {summary['samples']} samples"


def _check_memory_per_parameter(device) -> str:
    from .bench import MEMORY_MODES, memory_per_parameter

    got = {m: memory_per_parameter(m, 512, 2, 8, 2, device) for m in MEMORY_MODES}
    off = {m: d["resident_per_parameter"] for m, d in got.items() if abs(d["resident_per_parameter"] - 16) > 0.5}
    if off:
        raise RuntimeError(f"resident bytes per parameter {off}, expected 16 (parameters, gradients, Adam's state)")
    return ("resident bytes per parameter " + ", ".join(f"{m} {d['resident_per_parameter']:.2f}"
                                                         for m, d in got.items()) + f" ({got['fp32']['method'][:40]})")


_LSTMS = ("biglstm", "lm_gradient_scale")
_FP16_ARMS = ("loss_scaling", "biglstm", "ssd_table2", "amp_recipe", "memory_tradeoffs", "gat_amp", "lm_gradient_scale")
_HISTOGRAMS = ("ssd_histogram", "gradient_factors", "lm_gradient_scale", "biglstm", "ssd_table2")

#: The preflight's checks, in order (see the module docstring).
PREFLIGHT_CHECKS = (
    Check("CUDA-event timing", _check_timing, "amp_recipe, memory_tradeoffs, roofline (mpt_lab.bench.time_call)",
          ("amp_recipe", "memory_tradeoffs", "roofline", "tensor_core_accumulation")),
    Check("allocator peak after reset", _check_peak_memory, "amp_recipe, memory_tradeoffs, gat_amp",
          ("amp_recipe", "memory_tradeoffs", "gat_amp", "memory_per_parameter")),
    Check("float16 autocast, LSTM + GradScaler", _lstm_check(torch.float16), "biglstm, lm_gradient_scale", _LSTMS),
    Check("bfloat16 autocast, LSTM", _lstm_check(torch.bfloat16), "no experiment (a known limitation, chapters 3, 6, 9)",
          _LSTMS),
    Check("float16 autocast, conv net + GradScaler", _conv_check(torch.float16), "ssd_table2, memory_tradeoffs",
          ("ssd_table2", "memory_tradeoffs")),
    Check("bfloat16 autocast, conv net", _conv_check(torch.bfloat16), "memory_tradeoffs", ("memory_tradeoffs",)),
    Check("GradScaler skips an inf step", _check_grad_scaler, "loss_scaling, every FP16 arm", _FP16_ARMS),
    Check("FP8 tensor cores (torch._scaled_mm)", _check_fp8, "fp8_recipes (hardware runs), tensor_core_accumulation",
          ("fp8_recipes", "tensor_core_accumulation")),
    Check("PyG GATConv under autocast", _check_gat, "gat_amp", ("gat_amp",)),
    Check("NCCL process group, one rank", _check_nccl, "distributed (two or more GPUs)", ("distributed",)),
    Check("gloo process group", _check_gloo, "distributed (one GPU or none)", ("distributed",)),
    Check("gradient-histogram kernel on the device", _check_histogram, "every GradientHistogram", _HISTOGRAMS),
    Check("CUDA graph of a whole training step", _check_graph_capture, "amp_recipe (the GPU-limited step)",
          ("amp_recipe",)),
    Check("torch.profiler kernels", _check_profiler, "amp_recipe, tensor_core_accumulation",
          ("amp_recipe", "tensor_core_accumulation")),
    Check("FP8 GEMMs, fast accumulation off and on", _check_fp8_gemm, "roofline", ("roofline",)),
    Check("GPU clocks and power", _check_sampler, "roofline", ("roofline",)),
    Check("allocator bytes per parameter", _check_memory_per_parameter, "memory_per_parameter",
          ("memory_per_parameter",)),
)


def needed_checks(only=None, checks=None) -> tuple:
    """The checks (of ``checks``, default :data:`PREFLIGHT_CHECKS`) that the experiments named in ``only`` (an
    iterable of names; None: all) take: those whose ``needed_by`` is empty or shares a name with ``only``, in
    order."""
    checks = PREFLIGHT_CHECKS if checks is None else checks
    if only is None:
        return tuple(checks)
    only = set(only)
    return tuple(c for c in checks if not c.needed_by or only & set(c.needed_by))


def run_checks(device=None, checks=PREFLIGHT_CHECKS, echo=print) -> list:
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


def preflight(echo=print, only=None) -> int:
    """The preflight of a GPU machine: :func:`run_checks` on the CUDA device, of the checks that the experiments
    named in ``only`` need (:func:`needed_checks`; None: all); the exit status (0: nothing failed, also without
    CUDA, where it checks nothing and says so; 1: a check failed; "known" limitations are not failures)."""
    echo(f"torch {torch.__version__}, CUDA {torch.version.cuda or 'none (a CPU build)'}, Python "
         f"{sys.version.split()[0]}")
    if not torch.cuda.is_available():
        echo("no CUDA device: nothing to check here (the preflight exercises the experiments' CUDA paths; "
             "on a CPU the tests cover them)")
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
    echo(f"preflight: {len(rows) - len(failed)} of {len(rows)} paths ok, skipped or known, {len(failed)} failed "
         f"({time.perf_counter() - t0:.1f} s)" + (f": {', '.join(failed)}" if failed else "")
         + (f"; known PyTorch limitations: {', '.join(known)}" if known else ""))
    return 1 if failed else 0


def main(argv=None) -> int:
    """``python -m mpt_lab.device [--preflight]``: the device and versions, or the preflight."""
    import json

    p = argparse.ArgumentParser(prog="python -m mpt_lab.device", description=__doc__.splitlines()[0])
    p.add_argument("--preflight", action="store_true", help="run every CUDA code path of the experiments once")
    p.add_argument("--only", default="", help="with --preflight: comma-separated experiments (and benchmarks) still "
                                              "to run; only the checks they need run")
    args = p.parse_args(argv)
    if args.preflight:
        only = [n.strip() for n in args.only.split(",") if n.strip()] or None
        return preflight(only=only)
    print(describe())
    print(json.dumps(versions(), indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
