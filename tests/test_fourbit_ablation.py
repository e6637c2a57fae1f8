"""The four-bit ablation (chapter 13): the arms build what they say, the diagnostics measure what they claim on
inputs with known answers, a tiny run round-trips through JSON, and the saved long result is complete."""

import dataclasses
import math

import pytest
import torch
from torch import nn

from mpt_lab.experiments import fourbit_ablation as fa
from mpt_lab.models import CharTransformerLM
from mpt_lab.quantized_training import QuantLinear


def _layers(model):
    return {n: m.quantizer.recipe for n, m in model.named_modules() if isinstance(m, QuantLinear)}


def test_each_arm_quantises_the_layers_it_says():
    for name, arm in fa.ARMS.items():
        m = CharTransformerLM(20, 32, 2, 2, 16)
        built = fa.build_arm(m, name, bf16_layers=("-1.fc2",), seed=3)
        recipes = _layers(m)
        assert len(recipes) == 9 and not any(isinstance(x, nn.Linear) for x in m.modules())  # every Linear wrapped
        assert recipes["head"].name == "bf16"  # the head is BF16
        if arm.kind == "bf16":
            assert {r.name for r in recipes.values()} == {"bf16"}
            continue
        kept_bf16 = {n for n, r in recipes.items() if r.name == "bf16"}
        assert kept_bf16 == set(built["bf16"])
        assert kept_bf16 == ({"head", "blocks.1.fc2"} if arm.kind == "four_bit" and arm.bf16_layers else {"head"})
        other = {r for n, r in recipes.items() if n not in kept_bf16}
        assert len(other) == 1
        (recipe,) = other
        if arm.kind == "fp8":
            assert recipe.name == "fp8_current"
            continue
        g = recipe.gemms
        assert g.wgrad.hadamard == ((16 if arm.fmt == "nvfp4" else 32) if arm.hadamard else 0)
        assert g.fprop.hadamard == g.dgrad.hadamard == 0 and g.hadamard_seed == 3
        assert g.fprop.b.blocks == ("2d" if arm.weights_2d else "1d") and g.fprop.a.blocks == "1d"
        assert g.dgrad.a.rounding == ("stochastic" if arm.stochastic_gradients else "nearest_even")
        assert g.fprop.a.rounding == g.fprop.b.rounding == "nearest_even"
        assert g.fprop.a.format == arm.fmt
    with pytest.raises(ValueError, match="arm must be one of"):
        fa.build_arm(CharTransformerLM(20, 32, 2, 2, 16), "fp3")
    with pytest.raises(ValueError, match="block.layer"):
        fa.build_arm(CharTransformerLM(20, 32, 2, 2, 16), "nvfp4", bf16_layers=("-3.fc1",))


def test_config_rejects_what_cannot_run():
    base = fa.config_for("quick")
    for field, bad, match in (
        ("arms", ("fp8",), "bf16"),
        ("arms", ("bf16", "x"), "arms"),
        ("dim", 48, "multiple of 32"),
        ("bf16_layers", ("2.fc9",), "block.layer"),
        ("sr_layer", "head.x", "block.layer"),
        ("outlier_factors", (0.5,), "≥ 1"),
        ("outlier_shape", (64, 48), "outlier_shape"),
        ("seeds", 0, "seeds"),
        ("lr", -1.0, "lr"),
    ):
        with pytest.raises(ValueError, match=match):
            dataclasses.replace(base, **{field: bad}).validate()
    for p in fa.EXPERIMENT.profiles:
        fa.config_for(p).validate()
    assert fa.config_for("long").seeds >= 3


def test_sr_bias_is_unbiased_where_round_to_nearest_is_not():
    """Gradient values that all lie below half the first step of their block's grid: round-to-nearest loses them
    (a bias that no number of draws removes), stochastic rounding's mean converges to the exact gᵀx."""
    g = torch.full((256, 4), 0.2)
    g[::16] = 6.0  # each block of 16 tokens has amax 6: the scale is exactly 1
    x = torch.ones(256, 3)
    d = fa.sr_bias(g, x, draws=64, seed=1)
    exact = (g.t() @ x)[0, 0].item()
    lost = 240 * 0.2 / exact  # the 0.2s round to 0: what RTN loses of each gradient
    assert d["rtn"] == pytest.approx(lost, rel=1e-5) and d["rtn_along"] == pytest.approx(-lost, rel=1e-5)
    assert d["rtn_zero"] == pytest.approx(240 / 256)
    assert d["draws"] == [1, 2, 4, 8, 16, 32, 64] and d["sr_mean"][-1] < d["sr_mean"][0] / 3
    assert d["sr_mean"][-1] < d["rtn"] / 10 and abs(d["sr_along"]) < d["rtn"] / 10
    with pytest.raises(ValueError, match="tokens"):
        fa.sr_bias(g, x[:10])
    with pytest.raises(TypeError):
        fa.sr_bias(g[0], x)
    with pytest.raises(ValueError, match="draws"):
        fa.sr_bias(g, x, draws=0)


def test_weight_mismatch_is_zero_for_2d_tiles_only():
    w = 0.02 * torch.randn(48, 64, generator=torch.Generator().manual_seed(0))
    g = torch.randn(10, 48, generator=torch.Generator().manual_seed(1))
    d = fa.weight_mismatch(w, g)
    assert d["2d"] == {"relative": 0.0, "differ": 0.0, "dgrad": 0.0}
    assert d["1d"]["differ"] > 0.5 and 0.01 < d["1d"]["relative"] < 0.5 and d["1d"]["dgrad"] > 0
    assert math.isnan(fa.weight_mismatch(w)["1d"]["dgrad"])
    with pytest.raises(TypeError):
        fa.weight_mismatch(w, g.t())


def test_hadamard_outlier_error_measures_the_outlier_blocks():
    d = fa.hadamard_outlier_error(factors=(1.0, 100.0), channels=2, shape=(64, 64), seed=0)
    assert len(d["outlier_channels"]) == 2 and d["factors"] == [1.0, 100.0]
    for fmt in ("nvfp4", "mxfp4"):
        plain = d[fmt]["plain"]
        assert plain["all"][0] == pytest.approx(plain["rest"][0], abs=1.5)  # no outliers: the same values
        assert plain["rest"][1] < plain["rest"][0] - 6  # outliers crush their block mates
    assert set(d["student_t"]) == {"nvfp4", "mxfp4"}
    with pytest.raises(ValueError):
        fa.hadamard_outlier_error(shape=(64, 48))
    with pytest.raises(ValueError):
        fa.hadamard_outlier_error(factors=(0.1,))


def test_capture_and_channel_outliers_on_a_planted_channel():
    torch.manual_seed(0)
    m = CharTransformerLM(20, 32, 1, 2, 16)
    with torch.no_grad():
        m.blocks[0].ln2.weight[5] = 40.0  # fc1's input channel 5 stands out
    x = torch.randint(0, 20, (2, 16))
    cap = fa.capture_linears(m, x, x)
    assert set(cap) == {"blocks.0.qkv", "blocks.0.proj", "blocks.0.fc1", "blocks.0.fc2", "head"}
    assert cap["blocks.0.fc1"]["x"].shape == (32, 32) and cap["blocks.0.fc1"]["g"].shape == (32, 128)
    o = fa.channel_outliers(cap)
    assert o["blocks.0.fc1"]["top_channels"][0] == 5 and o["blocks.0.fc1"]["amax_ratio"] > 10
    assert o["blocks.0.fc1"]["tensor"] < o["blocks.0.fc1"]["block"]  # one scale for all: outliers cost more
    sens = fa.layer_sensitivity(m, fa.four_bit_recipe(), (x, x), (x, x))
    assert set(sens["layers"]) == set(cap) and all(v["grad_error"] > 0 for v in sens["layers"].values())
    w = fa.wgrad_error(cap, fa.four_bit_recipe())
    assert set(w) == set(cap) and all(0 < v < 1 for v in w.values())


@pytest.fixture(scope="module")
def tiny():
    cfg = dataclasses.replace(
        fa.config_for("quick"),
        steps=6,
        evals=2,
        seeds=2,
        valid_chars=512,
        sens_valid_chars=256,
        sr_draws=4,
        arms=("bf16", "fp8", "nvfp4", "nvfp4_rtn_gradients"),
    )
    return fa.run(cfg, progress=False)


def test_a_tiny_run_round_trips_and_its_gaps_are_paired(tiny, tmp_path):
    r = tiny
    assert list(r.runs) == ["bf16", "fp8", "nvfp4", "nvfp4_rtn_gradients"] and r.seeds == [0, 1]
    assert all(
        len(run["losses"]) == 6 and [e["step"] for e in run["evals"]] == [3, 6]
        for runs in r.runs.values()
        for run in runs
    )
    # every arm starts from the same weights and batches: the first loss is the same in every arm of a seed
    first = {s: r.runs["bf16"][i]["losses"][0] for i, s in enumerate(r.seeds)}
    assert all(abs(run["losses"][0] - first[run["seed"]]) < 0.02 for runs in r.runs.values() for run in runs)
    assert r.runs["bf16"][0]["losses"] != r.runs["bf16"][1]["losses"]
    gaps = r.gaps("nvfp4")
    bf, nv = r.finals("bf16"), r.finals("nvfp4")
    assert gaps == pytest.approx([100 * (n - b) / b for n, b in zip(nv, bf)])
    assert r.gaps("bf16") == [0.0, 0.0] and r.gap("nvfp4")["n"] == 2
    assert r.separated("nvfp4", "nvfp4") is False
    assert r.model["bf16_layers"] == ["blocks.1.fc1", "blocks.1.fc2"] and r.model["bf16_share"] == 0.25
    assert set(r.diagnostics) == {"sr_bias", "hadamard", "outliers", "mismatch", "sensitivity"}
    again = fa.FourbitAblationResult.load(r.save(tmp_path / "fb.json"))
    assert again.runs == r.runs and again.diagnostics == r.diagnostics and again.gaps("fp8") == r.gaps("fp8")
    assert "fourbit_ablation" in again.describe() and "NVFP4 recipe +" in again.describe()  # labels, not arm ids
    assert "nvfp4" not in again.describe()


def test_the_figures_draw_from_the_result(tiny):
    from mpt_lab import figures

    for fn in (
        figures.plot_fourbit_training,
        figures.plot_sr_bias,
        figures.plot_hadamard_outliers,
        figures.plot_outliers,
        figures.plot_layer_sensitivity,
    ):
        fig = fn(tiny)
        assert fig.axes and all(ax.get_xlabel() for ax in fig.axes)
    for fn in (figures.ablation_table, figures.outlier_table, figures.mismatch_table):
        html = fn(tiny)
        assert "<table" in html
    assert "within the seed spread" in figures.ablation_table(tiny) or "than the recipe" in figures.ablation_table(tiny)
    with pytest.raises(TypeError):
        figures.plot_sr_bias({"x": 1})


def test_the_saved_long_result_loads_with_three_seeds_per_arm():
    saved = fa.EXPERIMENT.saved("long")
    if saved is None:
        pytest.skip("book/results/fourbit_ablation_long.json is not saved yet")
    assert saved.profile == "long" and saved.provenance["command"].startswith(
        "python -m mpt_lab.experiments.fourbit_ablation --profile long"
    )
    assert len(saved.seeds) >= 3 and set(saved.runs) >= set(fa.ABLATIONS) | {"bf16", "fp8", "mxfp4", "nvfp4"}
    for arm, runs in saved.runs.items():
        assert [r["seed"] for r in runs] == saved.seeds, arm
        assert all(len(r["losses"]) == saved.config["steps"] and not r["diverged"] for r in runs), arm
        assert all(math.isfinite(g) for g in saved.gaps(arm)), arm
    assert saved.model["parameters"] > 500_000 and saved.machine["cpus"] >= 1


def test_sr_residual_bias_sits_at_the_block_maxima():
    x = torch.randn(64, 256, generator=torch.Generator().manual_seed(0))
    d = fa.sr_residual_bias(x, draws=32, seed=0)
    assert 0.2 < d["above_six"] < 0.9 and 6 < d["largest_scaled"] <= 6 * (1 + 2**-4)  # E4M3 rounds the scale
    assert d["top"] > 1.5 * d["others"] and d["others"] == pytest.approx(d["noise"], rel=0.2) and d["top_shrink"] < 0
    with pytest.raises(ValueError, match="multiple of 16"):
        fa.sr_residual_bias(x[:, :20])
    with pytest.raises(TypeError):
        fa.sr_residual_bias(x[0])
