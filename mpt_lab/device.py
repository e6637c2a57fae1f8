"""Device choice and description, for running experiments and recording where results came from."""

from __future__ import annotations

import datetime as _dt
import os
import platform
import sys
from typing import Any

import torch

__all__ = ["default_device", "resolve", "synchronize", "describe", "cpu_flags", "versions", "provenance"]

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


def describe(device: Any = None) -> str:
    """One line naming the device, for the provenance of a result.

    Parameters
    ----------
    device : torch.device, str or None
        ``None`` describes :func:`default_device`.

    Returns
    -------
    str, e.g. ``"NVIDIA H100 80GB HBM3 (sm_90, 79.2 GiB), CUDA 12.8"`` or
    ``"CPU: AMD EPYC (2 cores, torch threads 1)"``.

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
        return f"CPU: {_cpu_name()} ({os.cpu_count()} cores, torch threads {torch.get_num_threads()})"
    return str(device)


def versions() -> dict:
    """Versions of Python and the libraries that results depend on."""
    import numpy

    out = {"python": sys.version.split()[0], "torch": torch.__version__, "numpy": numpy.__version__,
           "platform": platform.platform()}
    try:
        import ml_dtypes

        out["ml_dtypes"] = ml_dtypes.__version__
    except ImportError:  # pragma: no cover
        pass
    from . import __version__

    out["mpt_lab"] = __version__
    return out


def provenance(command: str | None = None, config: dict | None = None, device: Any = None) -> dict:
    """Where a measured result came from: command, device, versions, UTC date, configuration and the machine's
    load average (so a time measured while other work ran can be read as such).

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
            "profile": _profile_or_none(), "config": dict(config or {}), "load_average": _load_average()}


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
