"""The CUDA code paths, run wherever a CUDA GPU exists (the lent H100/H200 machines) and skipped cleanly elsewhere:
real FP16 autocast in the precision arms, CUDA-event timing, the caching allocator's peak memory, the GAT and the
detector on the GPU, and the experiments' device selection."""

import dataclasses

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (this machine has none)")


def test_bench_uses_cuda_events_and_the_allocator():
    from mpt_lab import bench

    a = torch.randn(1024, 1024, device="cuda")
    t = bench.time_call(lambda: a @ a, repeat=3, warmup=1, device="cuda", timer="auto")
    assert t.method == "cuda_event" and t.min > 0
    peak = bench.peak_memory(lambda: a @ a, "cuda")
    assert peak >= 1024 * 1024 * 4  # the product's output, 4 MiB, was allocated


def test_precision_arm_runs_real_fp16_autocast_on_cuda():
    from mpt_lab.models import digits_mlp
    from mpt_lab.training import RecipeRun

    model = digits_mlp(32, seed=0).cuda()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    x, y = torch.randn(16, 64, device="cuda"), torch.randint(0, 10, (16,), device="cuda")
    arm = RecipeRun("fp16", "cuda")
    assert arm.real_fp16
    seen = {}

    def forward():
        out = model(x)
        seen["dtype"] = out.dtype
        return torch.nn.functional.cross_entropy(arm.to_float32(out), y)

    loss, skipped = arm.step(forward, opt)
    assert seen["dtype"] == torch.float16 and loss > 0 and skipped in (True, False)


def test_divergence_experiments_run_real_fp16_on_cuda():
    from mpt_lab.experiments import biglstm, ssd_table2

    b = biglstm.run(
        dataclasses.replace(
            biglstm.config_for("quick"), steps=8, eval_every=4, hist_every=2, sweep_shifts=(), device="cuda"
        ),
        progress=False,
    )
    assert b.real_fp16 and "CUDA" in b.provenance["device"]  # describe(): "<GPU name> (sm_90, …), CUDA 12.x"
    s = ssd_table2.run(
        dataclasses.replace(ssd_table2.config_for("quick"), steps=4, n_test=8, device="cuda"), progress=False
    )
    assert s.real_fp16 and all(len(d["losses"]) == 4 for d in s.arms.values())


def test_gat_and_memory_experiments_on_cuda():
    from mpt_lab.experiments import gat_amp, memory_tradeoffs

    g = gat_amp.run(gat_amp.Config(num_nodes=200, avg_degree=6.0, hidden=16, epochs=3, device="cuda"), progress=False)
    r = g.runs["[1, 1, 1]"]
    assert not r["fp16"]["oom"] and r["fp16"]["cuda_max_allocated_bytes"] > 0
    assert g.ratio("[1, 1, 1]", "fp16") < 1
    m = memory_tradeoffs.run(
        dataclasses.replace(memory_tradeoffs.config_for("quick"), epochs=1, device="cuda"), progress=False
    )
    assert m.mixed_dtype == "float16" and "GradScaler" in m.mixed_note
    assert m.ways["mixed"]["peak_bytes"] < m.ways["fp32"]["peak_bytes"]


def test_default_profile_is_full_on_cuda(monkeypatch):
    import mpt_lab

    monkeypatch.delenv("MPT_LAB_PROFILE", raising=False)
    assert mpt_lab.profile() == "full" and mpt_lab.device.default_device().type == "cuda"


def test_preflight_every_cuda_path_passes():
    from mpt_lab.harness import preflight

    rows = preflight.run_checks("cuda", echo=lambda line: None)
    failed = [(r["name"], r["detail"]) for r in rows if r["status"] == "FAILED"]
    assert not failed, failed
    assert {r["name"]: r["status"] for r in rows}["CUDA-event timing"] == "ok"
    assert preflight.preflight(echo=lambda line: None) == 0


def test_every_full_configuration_runs_as_a_smoke_run_on_cuda(tmp_path, capsys):
    """The smoke runs on the GPU: every full configuration's CUDA path (real autocast, tensor cores, NCCL or
    gloo placement), a couple of steps each."""
    from mpt_lab import experiments
    from mpt_lab.experiments.__main__ import main

    assert main(["--all", "--profile", "full", "--smoke", "--out", str(tmp_path)]) == 0, capsys.readouterr().out
    for name in experiments.NAMES:
        if "full" in experiments.get(name).profiles:
            r = experiments.get(name).Result.load(tmp_path / f"{name}_smoke.json")
            assert "CUDA" in r.provenance["device"] or name == "distributed"


def test_histogram_kernel_on_cuda_is_the_bucketize_one_and_exact():
    from mpt_lab import histogram as H

    x = torch.randint(-(2**31), 2**31 - 1, (1 << 20,), dtype=torch.int64).to(torch.int32).view(torch.float32)
    assert H._kernel("cuda") is H._fine_indices_search  # no compilation on CUDA
    got, want = H._fine_indices_search(x.cuda()), H._fine_indices_eager(x)
    assert torch.equal(got[0].cpu(), want[0]) and torch.equal(got[1].cpu(), want[1])
    assert H.log2_histogram(x.cuda()) == H.log2_histogram(x)


def test_amp_recipe_graphed_step_profile_and_peaks_on_cuda():
    """The GPU-limited variant captures the whole step in a CUDA graph and reads nothing back; the eager FP16
    loop reads found_inf back once a step; both profiles see the GPU busy; the datasheet peak is named."""
    from mpt_lab.experiments import amp_recipe as ar

    cfg = dataclasses.replace(
        ar.config_for("quick"),
        width=256,
        batch_sizes=(64,),
        num_batches=4,
        epochs=2,
        profile_steps=4,
        graph_batches=(64,),
        graph_steps=4,
        peak_n=1024,
        device="cuda",
    )
    r = ar.run(cfg, progress=False)
    assert all(g["captured"] == "cuda_graph" and g["readbacks_per_step"] == 0 for g in r.graphed)
    assert r.row("fp16", 64)["readbacks_per_step"] == 1 and r.row("bf16", 64)["readbacks_per_step"] == 0
    assert all(0 < row["busy_fraction"] <= 1 for row in r.rows + r.graphed)
    assert r.provenance["backends"]["cuda_matmul_allow_tf32"] is False


def test_roofline_and_memory_per_parameter_paths_on_cuda():
    from mpt_lab import bench

    fp16 = bench.gemm_tflops("fp16", 1024, 1024, 1024, "cuda", repeat=2, min_seconds=0.01)
    assert fp16["tflops"] > 1 and fp16["timer"] == "cuda_event"
    if torch.cuda.get_device_capability() >= (8, 9):
        for kind in ("fp8", "fp8_fast"):
            assert bench.gemm_tflops(kind, 1024, 1024, 1024, "cuda", repeat=2, min_seconds=0.01)["tflops"] > 1
    assert bench.copy_bandwidth("cuda", 2**26)["gb_s"] > 100
    d = bench.memory_per_parameter("bf16_master", 1024, 2, 8, 2, "cuda")
    assert abs(d["resident_per_parameter"] - 16) < 0.5 and d["peak_per_parameter"] >= d["resident_per_parameter"]
