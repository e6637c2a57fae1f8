"""Device choice and description, for running experiments and recording where results came from.

``python -m mpt_lab.device`` prints this machine's device and library versions.  The bottom floor of the package:
it imports nothing of ours but :mod:`mpt_lab._torch_internals` (the preflight of a GPU machine, which exercises the
floors above, is :mod:`mpt_lab.harness.preflight`).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import sys
from dataclasses import dataclass
from typing import Any

import numpy
import torch

from . import __version__, profile
from ._torch_internals import onednn_bf16_supported, onednn_fp16_supported

__all__ = [
    "DeviceLike",
    "default_device",
    "resolve",
    "synchronize",
    "describe",
    "cpu_flags",
    "CpuKernels",
    "cpu_kernels",
    "versions",
    "backends",
    "provenance",
    "main",
]

#: What every function that takes a device accepts: a ``torch.device``, a name ("cpu", "cuda", "cuda:1",
#: "auto"), or None for the default (:func:`resolve`).
DeviceLike = torch.device | str | None

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
      does where oneDNN has native kernels for the type (AVX-512 FP16 or AVX-NE-CONVERT for float16; AVX-512
      BW/VL/DQ or AVX-NE-CONVERT for bfloat16, as the check in ``aten/src/ATen/native/mkldnn/Utils.h`` says:
      "fp16 path needs the cpu support avx_ne_convert or avx512_fp16"), capped by ``ONEDNN_MAX_CPU_ISA``.
      oneDNN's float16 convolution accumulates in FP32 and rounds each output once, forward and backward; without
      it PyTorch runs ATen's
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
    return CpuKernels(
        capability=str(torch.backends.cpu.get_cpu_capability()),
        onednn_fp16=onednn_fp16_supported(),
        onednn_bf16=onednn_bf16_supported(),
    )


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
        return f"{p.name} (sm_{p.major}{p.minor}, {p.total_memory / 2**30:.1f} GiB), CUDA {torch.version.cuda}"
    if device.type == "cpu":
        return (
            f"CPU: {_cpu_name()} ({os.cpu_count()} cores, torch threads {torch.get_num_threads()}; "
            f"{cpu_kernels().describe()})"
        )
    return str(device)


def versions() -> dict:
    """Versions of Python and the libraries that results depend on."""
    out = {
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "numpy": numpy.__version__,
        "platform": platform.platform(),
    }
    if torch.version.cuda:
        out["cuda"] = torch.version.cuda
    if torch.cuda.is_available() and torch.backends.cudnn.is_available():
        out["cudnn"] = str(torch.backends.cudnn.version())
    try:
        import ml_dtypes

        out["ml_dtypes"] = ml_dtypes.__version__
    except ImportError:  # pragma: no cover
        pass
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
    out = {
        "cuda_matmul_allow_tf32": bool(m.allow_tf32),
        "cudnn_allow_tf32": bool(torch.backends.cudnn.allow_tf32),
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
        "cudnn_benchmark": bool(torch.backends.cudnn.benchmark),
        "cudnn_deterministic": bool(torch.backends.cudnn.deterministic),
        "cuda_matmul_allow_fp16_reduced_precision_reduction": bool(m.allow_fp16_reduced_precision_reduction),
        "cuda_matmul_allow_bf16_reduced_precision_reduction": bool(m.allow_bf16_reduced_precision_reduction),
    }
    for name, obj in (
        ("cuda_matmul_fp32_precision", m),
        ("cudnn_conv_fp32_precision", getattr(torch.backends.cudnn, "conv", None)),
    ):
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
    return {
        "command": command,
        "device": describe(device),
        "versions": versions(),
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "profile": _profile_or_none(),
        "config": dict(config or {}),
        "backends": backends(),
        "load_average": _load_average(),
    }


def _load_average() -> list | None:
    """The machine's 1-, 5- and 15-minute load averages when the result was made (None where the OS has none):
    a time measured while other processes ran says so."""
    try:
        return [round(v, 2) for v in os.getloadavg()]
    except (AttributeError, OSError):
        return None


def _profile_or_none() -> str | None:
    try:
        return profile()
    except ValueError:
        return None


def main(argv: list[str] | None = None) -> int:
    """``python -m mpt_lab.device``: this machine's device and library versions; returns 0.  (The preflight of a
    GPU machine is ``python -m mpt_lab.harness.preflight``.)"""
    p = argparse.ArgumentParser(prog="python -m mpt_lab.device", description=__doc__.splitlines()[0])
    p.parse_args(argv)
    print(describe())
    print(json.dumps(versions(), indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
