"""Device choice and description, for running experiments and recording where results came from."""

from __future__ import annotations

import datetime as _dt
import os
import platform
import sys
from typing import Any

import torch

__all__ = ["default_device", "describe", "versions", "provenance"]


def default_device() -> torch.device:
    """``cuda`` when a CUDA device is present, else ``cpu``."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


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
    """Where a measured result came from: command, device, versions, UTC date and configuration.

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
            "profile": _profile_or_none(), "config": dict(config or {})}


def _profile_or_none():
    from . import profile

    try:
        return profile()
    except ValueError:
        return None
