"""The float16/bfloat16 kernels PyTorch takes on this CPU (mpt_lab.device.cpu_kernels), and the tests that compare
with them (marked ``cpu_kernels``) rerun under a second instruction set, so that a CPU of the other kind cannot
fail them: on a CPU with oneDNN float16 kernels (AVX-512 FP16, AMX) the subprocess caps oneDNN and ATen at AVX2, as
on an AMD EPYC; on a CPU without them, where the oneDNN path cannot be forced, it takes ATen's scalar kernels."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, subprocess_env

from mpt_lab import device

PROBE = "import json, mpt_lab.device as d; k = d.cpu_kernels(); print(json.dumps(k.__dict__))"


def _kernels_under(env_extra: dict) -> dict:
    env = dict(subprocess_env(), **env_extra)
    out = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, env=env, cwd=ROOT, check=True, timeout=120
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def second_isa() -> dict:
    """Environment variables that send this CPU's float16 work to the other kernels."""
    if device.cpu_kernels().onednn_fp16:
        return {"ONEDNN_MAX_CPU_ISA": "AVX2", "ATEN_CPU_CAPABILITY": "avx2"}
    return {"ATEN_CPU_CAPABILITY": "default"}


def test_cpu_kernels_names_what_this_process_uses():
    k = device.cpu_kernels()
    assert k.capability and isinstance(k.onednn_fp16, bool) and isinstance(k.onednn_bf16, bool)
    assert k.fp16_convolution == ("onednn" if k.onednn_fp16 else "aten")
    assert k.describe() in device.describe("cpu")  # provenance names the kernels
    assert k == device.cpu_kernels()


def test_the_environment_variables_move_the_kernels():
    """The caps act: oneDNN capped at AVX2 has no float16 kernels; ATen's capability follows its variable."""
    assert _kernels_under({"ONEDNN_MAX_CPU_ISA": "AVX2"})["onednn_fp16"] is False
    assert _kernels_under({"ATEN_CPU_CAPABILITY": "default"})["capability"] == "DEFAULT"


@pytest.mark.slow
def test_cpu_kernel_checks_hold_under_a_second_isa():
    env_extra = second_isa()
    here, there = device.cpu_kernels(), _kernels_under(env_extra)
    assert there != here.__dict__, (here, there)  # the subprocess really runs other kernels
    env = dict(subprocess_env(), **env_extra)
    # the files that carry the marker, so that the subprocess collects only them (not the whole suite)
    files = sorted((ROOT / "tests").glob("test_*.py"))
    marked = [str(p) for p in files if p.name != Path(__file__).name and "pytest.mark.cpu_kernels" in p.read_text()]
    assert marked, "no test file carries the cpu_kernels marker"
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-x",
        "-p",
        "no:cacheprovider",
        "-m",
        "cpu_kernels",
        "-o",
        "addopts=",
        *marked,
    ]
    res = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, timeout=900)
    tail = (res.stdout + res.stderr)[-3000:]
    assert res.returncode == 0, f"under {env_extra} ({there}):\n{tail}"
    assert " passed" in tail
