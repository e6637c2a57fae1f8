"""Shared test setup: deterministic, single-threaded torch (two shared cores; see DESIGN.md)."""

import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

os.environ.setdefault("MPT_LAB_PROFILE", "quick")


@pytest.fixture(autouse=True, scope="session")
def _torch_threads():
    import torch

    torch.set_num_threads(1)
    yield


def subprocess_env() -> dict:
    """Environment for subprocesses (kernels, the book build): this interpreter's bin first on PATH."""
    env = dict(os.environ)
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    env.setdefault("MPT_LAB_PROFILE", "quick")
    env["PYTHONHASHSEED"] = "0"
    return env
