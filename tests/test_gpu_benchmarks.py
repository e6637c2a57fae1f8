"""The GPU slot's two benchmarks at a CPU's size: the roofline (GEMMs per arithmetic, a copy, clocks) and memory
per parameter (Adam in FP32, AMP, BF16 with FP32 master weights, against ZeRO's 16 bytes); and the bench
functions under them.  Speed is reported, never asserted; what is asserted is what each row must hold."""

import math

import pytest
import torch
from conftest import load_benchmark

from mpt_lab import bench
from mpt_lab.experiments import load_json


@pytest.fixture(scope="module")
def roofline(tmp_path_factory):
    out = tmp_path_factory.mktemp("roof") / "roofline.json"
    assert load_benchmark("roofline").main(["--profile", "quick", "--no-progress", "--out", str(out)]) == 0
    return load_json(out)


def test_roofline_measures_every_arithmetic_and_says_what_is_missing(roofline):
    mod = load_benchmark("roofline")
    cfg = mod.PROFILES["quick"]
    shapes = {(n, n, n) for n in cfg["sizes"]} | {mod.parse_shape(s) for s in cfg["shapes"]}
    assert {(r["kind"], r["m"], r["n"], r["k"]) for r in roofline["gemm"]} == {
        (kind, *s) for kind in bench.GEMM_KINDS for s in shapes
    }
    for r in roofline["gemm"]:
        if r["kind"] == "tf32":  # TF32 is a CUDA tensor-core mode
            assert r["tflops"] is None and "CUDA tensor cores" in r["reason"]
            continue
        if r["tflops"] is None:  # an FP8 product this torch cannot run here
            assert r["kind"].startswith("fp8") and r["reason"]
            continue
        assert r["tflops"] > 0 and r["seconds"] > 0 and r["reason"] == ""
        assert r["tflops"] == pytest.approx(2 * r["m"] * r["n"] * r["k"] / r["seconds"] / 1e12)
        b = mod.OPERAND_BYTES[r["kind"]]
        assert r["intensity"] == pytest.approx(
            2
            * r["m"]
            * r["n"]
            * r["k"]
            / (b * (r["m"] * r["k"] + r["k"] * r["n"]) + mod.RESULT_BYTES[r["kind"]] * r["m"] * r["n"])
        )
        assert r["fraction_of_datasheet"] is None and r["clocks"]["source"] is None  # a CPU: no datasheet, no GPU
    assert roofline["copy"]["gb_s"] > 0 and roofline["copy"]["nbytes"] == cfg["copy_mib"] * 2**20
    for kind, peak in roofline["peaks"].items():
        if peak:
            assert roofline["ridge"][kind] == pytest.approx(peak * 1e12 / (roofline["copy"]["gb_s"] * 1e9))
    assert roofline["sampler"] == {"source": None, "absent": "no CUDA device"}
    assert roofline["provenance"]["command"].startswith("python benchmarks/roofline.py --profile quick")
    assert "backends" in roofline["provenance"]
    with pytest.raises(ValueError, match="MxNxK"):
        mod.parse_shape("512x4096")


def test_memory_per_parameter_matches_zeros_accounting_on_a_cpu(tmp_path):
    out = tmp_path / "mpp.json"
    assert load_benchmark("memory_per_parameter").main(["--profile", "quick", "--no-progress", "--out", str(out)]) == 0
    r = load_json(out)
    assert set(r["modes"]) == set(bench.MEMORY_MODES) and r["zero"]["total"] == 16
    n = 4 * 64 * 65
    for mode, d in r["modes"].items():
        assert d["parameters"] == n and math.isfinite(d["loss"])
        assert d["resident_per_parameter"] == pytest.approx(16.0)  # every way: 16 bytes of model states
        assert d["peak_per_parameter"] >= d["resident_per_parameter"]
    assert r["modes"]["fp32"]["breakdown_per_parameter"] == {
        "parameters": 4.0,
        "gradients": 4.0,
        "master parameters": 0.0,
        "optimizer state": 8.0,
    }
    # BF16 with FP32 master weights is ZeRO's accounting item by item: 2 + 2 + 4 + (4 + 4)
    assert r["modes"]["bf16_master"]["breakdown_per_parameter"] == {
        "parameters": 2.0,
        "gradients": 2.0,
        "master parameters": 4.0,
        "optimizer state": 8.0,
    }


def test_bench_functions_reject_bad_arguments():
    with pytest.raises(ValueError, match="kind"):
        bench.gemm_tflops("int8", 8, 8, 8, "cpu")
    with pytest.raises(ValueError, match="m must"):
        bench.gemm_tflops("fp32", 0, 8, 8, "cpu")
    with pytest.raises(ValueError, match="nbytes"):
        bench.copy_bandwidth("cpu", 2)
    with pytest.raises(ValueError, match="interval"):
        bench.GpuSampler(interval=0)
    with pytest.raises(ValueError, match="mode"):
        bench.memory_per_parameter("fp8", 8, 1, 1)
    with pytest.raises(TypeError, match="device_name"):
        bench.datasheet_peaks(None)
    with pytest.raises(ValueError, match="steps"):
        bench.profile_steps(lambda: None, 0)
    with pytest.raises(TypeError, match="callable"):
        bench.count_ops(3)


def test_datasheet_names_the_gpu_and_its_dense_peaks():
    h100, h200 = bench.datasheet_peaks("NVIDIA H100 80GB HBM3 (sm_90)"), bench.datasheet_peaks("NVIDIA H200")
    assert h100["fp16"] == h200["fp16"] == 989.5 and h100["fp32"] == 67.0 and h100["fp8"] == 2 * h100["fp16"]
    assert (h100["hbm_tb_s"], h200["hbm_tb_s"]) == (3.35, 4.8) and "dense" in h100["source"]
    assert bench.datasheet_peaks("NVIDIA H100 PCIe") is None and bench.datasheet_peaks("CPU: AMD EPYC") is None
    from mpt_lab.harness import budget

    assert {k: h100[k] for k in ("fp32", "tf32", "fp16", "fp8", "hbm_tb_s")} == budget.H100  # one set of figures


def test_readbacks_and_profile_of_a_step():
    """GradScaler.step reads found_inf back to the host with .item() unless the optimizer is fused (it then hands
    found_inf to the fused kernel): the read-back the saved H200 FP16 loop paid every step."""
    model = torch.nn.Linear(8, 8)
    x = torch.randn(4, 8)
    for fused, want in ((False, 1), (True, 0)):
        opt = torch.optim.SGD(model.parameters(), lr=0.1, fused=fused)
        scaler = torch.amp.GradScaler("cpu")

        def step():
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = model(x).float().pow(2).mean()
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            opt.zero_grad(set_to_none=True)

        assert bench.count_ops(step)[bench.READBACK_OP] == want
        p = bench.profile_steps(step, 3, "cpu")
        assert p["readbacks_per_step"] == want and p["busy_fraction"] is None and p["host_seconds_per_step"] > 0
        assert p["what"] == "CPU ATen operators" and p["kernels"] and all(k.startswith("aten::") for k in p["kernels"])
