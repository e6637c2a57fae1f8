"""mpt_lab.experiments.gat_amp: a tiny run of every (heads, precision), the memory accounting, the scaled
budget, the autocast policy probe (CPU real, CUDA on fake tensors) and FP16 softmax overflow."""

import math

import pytest
import torch

from mpt_lab import figures
from mpt_lab.autocast import GRAPH_OPS, probe_autocast
from mpt_lab.experiments import gat_amp as ga
from mpt_lab.models import gat


@pytest.fixture(scope="module")
def tiny():
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    cfg = ga.Config(
        profile="quick",
        num_nodes=150,
        avg_degree=6.0,
        hidden=16,
        epochs=5,
        threads=1,
        fit_nodes=(50, 100),
        fit_degrees=(16, 32, 64),
        fit_heads=(1, 2, 3),
    )
    res = ga.run(cfg, progress=False)
    torch.set_num_threads(old)
    return res


def test_every_run_trains_and_is_measured(tiny):
    assert list(tiny.runs) == ["[1, 1, 1]", "[2, 2, 2]"]
    for hk, runs in tiny.runs.items():
        assert list(runs) == list(ga.RECIPES)
        for p, r in runs.items():
            assert not r["oom"]
            assert len(r["losses"]) == 5 and all(math.isfinite(v) for v in r["losses"])
            assert r["peak_bytes"] > 0 and r["total_bytes"] == r["static_bytes"] + r["peak_bytes"]
            assert len(r["epoch_times"]) == 4 and r["epoch_seconds"] > 0  # the measured epoch is not timed
            assert 0.0 <= r["accuracy"]["test"] <= 1.0
        assert runs["fp16"]["final_scale"] is not None and runs["fp32"]["final_scale"] is None
    assert tiny.graph["synthetic"] is True and tiny.graph["num_features"] == 602


def test_lower_precision_uses_less_memory(tiny):
    for hk in tiny.runs:
        for p in ("fp16", "bf16"):
            assert tiny.runs[hk][p]["peak_bytes"] < tiny.runs[hk]["fp32"]["peak_bytes"], (hk, p)
            assert 0.3 < tiny.ratio(hk, p) < 1.0
    # two heads need more memory than one, in every precision
    for p in ga.RECIPES:
        assert tiny.runs["[2, 2, 2]"][p]["peak_bytes"] > tiny.runs["[1, 1, 1]"][p]["peak_bytes"]


def test_static_bytes_count_graph_weights_and_adam(tiny):
    from mpt_lab.models.gat import GAT

    params = list(GAT(602, 16, 41, (1, 1, 1)).parameters())
    n = sum(p.numel() for p in params)
    r = tiny.runs["[1, 1, 1]"]["fp32"]
    # float32 weights + Adam's exp_avg and exp_avg_sq (float32) + Adam's 0-dim float32 step per parameter tensor
    assert r["static_bytes"] == tiny.graph["bytes"] + 3 * 4 * n + 4 * len(params)


def test_result_roundtrip_tables_and_budget(tiny, tmp_path):
    back = ga.GatAmpResult.load(tiny.save(tmp_path / "g.json"))
    assert back == tiny
    html = figures.gat_memory_table(tiny)
    assert "DGL User Guide" in html and "fp16" in html and html.count("<tr>") == 1 + 6 + 1
    budget, _ = figures.gat_budget_table(tiny)
    base = tiny.runs["[1, 1, 1]"]["fp32"]["total_bytes"]
    assert budget == pytest.approx(base * 16.0 / 15.2)
    assert "÷ FP32" in tiny.describe()
    with pytest.raises(TypeError, match="result"):
        figures.gat_memory_table({})


def test_memory_fit_finds_pygs_per_edge_messages(tiny):
    fit = tiny.memory_fit
    assert len(fit["points"]) == 2 * 3 * 3 and len(fit["lines"]) == 2 * 3 and fit["points_per_line"] == 3
    # on a CPU the counted bytes are exact: every (N, H) is a straight line in E, with one slope for every N,
    # and the slope is linear in H
    assert fit["max_relative_residual"] < 1e-9 and fit["node_spread"] < 1e-9 and fit["slope_residual"] < 1e-9
    # PyG keeps per edge and head more than one float32 vector of the hidden size (gathered features, messages)
    assert fit["per_edge_head"] > tiny.config["hidden"] * 4
    fig = figures.plot_gat_memory_fit(tiny)
    assert len(fig.axes) == 2 and fig.get_suptitle()
    for ax in fig.axes:
        assert ax.get_title() and ax.get_xlabel() and ax.get_ylabel() and ax.get_legend() is not None
    assert tiny.head_model("fp32")["per_head"] > 0


def test_memory_model_finds_a_planted_model_and_rejects_what_it_cannot_test():
    # bytes = (100·H + 8)·E + 3000·N·H + 5000: slope 100 per edge and head, 8 per edge, whatever N
    pts = [
        [n, e, h, (100 * h + 8) * e + 3000 * n * h + 5000] for n in (50, 80) for e in (200, 400, 900) for h in (1, 2, 4)
    ]
    m = ga.memory_model(pts)
    assert m["per_edge_head"] == pytest.approx(100) and m["per_edge"] == pytest.approx(8)
    assert m["max_relative_residual"] < 1e-12 and m["slope_residual"] < 1e-12 and m["node_spread"] < 1e-12
    assert m["graph_sizes"] == [50, 80] and m["head_counts"] == [1, 2, 4] and m["points_per_line"] == 3
    # a curved line, a slope that depends on N, a slope not linear in H: each test sees its own fault
    bent = [p[:3] + [p[3] + (p[1] ** 2 if p[2] == 2 else 0)] for p in pts]
    assert ga.memory_model(bent)["max_relative_residual"] > 1e-3
    by_n = [p[:3] + [p[3] + 20 * p[1] * (p[0] == 80)] for p in pts]
    assert ga.memory_model(by_n)["node_spread"] > 0.01
    squared = [[n, e, h, (100 * h * h + 8) * e + 5000] for n, e, h, _ in pts]
    assert ga.memory_model(squared)["slope_residual"] > 0.01
    assert ga.memory_model([p for p in pts if p[0] == 50])["node_spread"] is None
    with pytest.raises(ValueError, match="2 degrees"):
        ga.memory_model([p for p in pts if p[1] == 200])
    with pytest.raises(ValueError, match="head counts"):
        ga.memory_model([p for p in pts if p[2] == 1])
    with pytest.raises(ValueError, match="fit_heads"):
        ga.run(ga.Config(profile="quick", fit_heads=(2,)), progress=False)


def test_the_guides_numbers_are_cited():
    s = ga.DGL_GUIDE["runs"]
    assert s["[1, 1, 1]"]["fp16"]["memory_gb"] / s["[1, 1, 1]"]["fp32"]["memory_gb"] == pytest.approx(0.842, abs=1e-3)
    assert s["[2, 2, 2]"]["fp32"]["oom"] and not s["[2, 2, 2]"]["fp16"]["oom"]


def test_autocast_policy_cpu_and_cuda():
    cpu = probe_autocast("cpu", torch.float16, input_dtype=torch.float16, ops=GRAPH_OPS)
    assert cpu.method == "real tensors" and cpu["linear"] == "float16"
    cuda = probe_autocast("cuda", torch.float16, input_dtype=torch.float16, ops=GRAPH_OPS)
    assert cuda["linear"] == "float16"
    # CUDA autocast runs exp and softmax — PyG's edge softmax included — in float32
    for op in ("exp", "softmax", "softmax over edges (PyG)"):
        assert cuda[op] == "float32", op
    assert not any(v.startswith("error") for v in cuda.ops.values())


def test_attention_overflow_in_fp16():
    assert gat.FP16_EXP_LIMIT == pytest.approx(math.log(65504))
    d = gat.attention_overflow([0.0, 5.0, 11.0, 12.0])
    assert math.isfinite(d["exp_fp16"][2]) and math.isinf(d["exp_fp16"][3])  # 11 < ln 65504 < 12
    assert any(math.isnan(v) for v in d["naive_fp16"])  # inf / inf
    assert d["max_subtracted_dtype"] == "float16"
    for a, b in zip(d["max_subtracted_fp16"], d["fp32"]):
        assert abs(a - b) <= 2**-10 * max(b, 2**-14) * 4 + 1e-7
    with pytest.raises(TypeError, match="logits"):
        gat.attention_overflow([[1.0, 2.0]])


@pytest.mark.parametrize(
    "field, value", [("epochs", 2), ("heads", ()), ("recipes", ("fp8",)), ("lr", -1.0), ("num_nodes", 0)]
)
def test_bad_config(field, value):
    cfg = ga.config_for("quick")
    setattr(cfg, field, value)
    with pytest.raises(ValueError, match=field):
        ga.run(cfg, progress=False)
    with pytest.raises(TypeError, match="config"):
        ga.run("quick")


def test_profiles():
    q, c, f = ga.config_for("quick"), ga.config_for("cpu"), ga.config_for("full")
    assert q.num_nodes < c.num_nodes < f.num_nodes == 232_965
    assert f.epochs == 100 and f.hidden == 256 and f.lr == 1e-3 and f.weight_decay == 5e-4
    with pytest.raises(ValueError, match="profile"):
        ga.config_for("huge")


def test_an_int_fit_nodes_measures_two_graph_sizes():
    """fit_nodes = n (the full profile's form) measures graphs of n // 2 and n nodes, so that every profile
    tests that the per-edge slope does not depend on the graph size; bad sizes are refused."""
    import dataclasses

    class CpuRun:
        device = torch.device("cpu")

        def bar(self, items, **kw):
            return items

    cfg = ga.Config(profile="custom", hidden=8, fit_nodes=100, fit_degrees=(16, 32), fit_heads=(1, 2))
    cfg.validate()
    fit = ga._memory_fit(cfg, CpuRun())
    assert fit["graph_sizes"] == [50, 100] and fit["node_spread"] is not None
    for bad in (60, (30, 100), "x", True):
        with pytest.raises(ValueError, match="fit_nodes"):
            dataclasses.replace(cfg, fit_nodes=bad).validate()
