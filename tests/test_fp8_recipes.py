"""Training in FP8, MX and NVFP4 recipes (mpt_lab.quantized_training) and the fp8_recipes experiment.

The quantised Linear is checked against products of operands quantised with mpt_lab.microscaling's own
functions, per recipe and per axis; the fast block quantisers bit for bit against microscaling's; delayed
scaling's history across steps; BF16 weights with stochastic rounding; a tiny experiment end to end (JSON,
figures, tables); bad configurations; and the FP8 tensor-core path on a GPU that has one (skipped elsewhere)."""

import math

import pytest
import torch
from matplotlib.figure import Figure
from torch import nn

from mpt_lab import formats as F
from mpt_lab.experiments import fp8_recipes
from mpt_lab.histogram import log2_histogram
from mpt_lab.microscaling import (MX_ELEMENT_FORMATS, SCALE_ROUNDINGS, ScaledTensor, quantize_mx, quantize_nvfp4,
                                  quantize_per_tensor, scale_from_amax)
from mpt_lab.quantized_training import (TRAINING_RECIPES, QuantLinear, Quantizer, block_scale_comparison,
                                        block_size_sweep, fake_quantize_mx, fake_quantize_nvfp4,
                                        hardware_fp8_available, layer_stats, one_scale_vs_per_tensor,
                                        quantize_linears_, quantized_layers, round_weights_)


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal values bit for bit (NaN where the other is NaN)."""
    na, nb = torch.isnan(a), torch.isnan(b)
    return torch.equal(na, nb) and torch.equal(a[~na].view(torch.int32), b[~nb].view(torch.int32))


def _awkward(seed: int = 0) -> torch.Tensor:
    """Rows of very different magnitudes, zeros, a zero row, inf, NaN, FP32 subnormals, values at E4M3's
    saturation boundary (448, the tie 464, 480) and powers of two."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(37, 70, generator=g) * torch.exp2(torch.randint(-30, 30, (37, 1), generator=g).float())
    x[0, :5] = 0
    x[1] = 0
    x[2, 3] = math.inf
    x[3, 7] = math.nan
    x[4] *= 1e-40
    x[5] = 2.0 ** -130
    x[6] = torch.tensor([448.0, 464.0, 480.0] * 23 + [1.0]) * 2.0 ** -3
    x[7] = torch.exp2(torch.arange(70.0) - 35)
    return x


# ----------------------------------------------------------------------------------------------------------
# the fast block quantisers are microscaling's, bit for bit
# ----------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("fmt", MX_ELEMENT_FORMATS, ids=lambda f: f.name)
@pytest.mark.parametrize("rule", SCALE_ROUNDINGS)
def test_fake_quantize_mx_is_quantize_mx(fmt, rule):
    x = _awkward()
    for axis in (0, 1, -1):
        for bs in (1, 7, 16, 32):
            fast = fake_quantize_mx(x, fmt, bs, axis, scale_rounding=rule)
            ref = quantize_mx(x, fmt, bs, axis, scale_rounding=rule).dequantize()
            assert _same_bits(fast, ref), (fmt.name, rule, axis, bs)
    for dtype in (torch.float16, torch.bfloat16):
        xd = torch.randn(8, 64, generator=torch.Generator().manual_seed(1)).to(dtype)
        fast, ref = fake_quantize_mx(xd, fmt, 32, -1, scale_rounding=rule), \
            quantize_mx(xd, fmt, 32, -1, scale_rounding=rule).dequantize()
        assert fast.dtype == dtype and torch.equal(fast, ref)


def test_fake_quantize_nvfp4_is_quantize_nvfp4():
    x = _awkward(3)
    for axis in (0, 1):
        assert _same_bits(fake_quantize_nvfp4(x, axis=axis), quantize_nvfp4(x, axis=axis).dequantize())
        y = x[5:]                                  # no inf/NaN: a finite tensor scale from the amax
        assert _same_bits(fake_quantize_nvfp4(y, axis=axis), quantize_nvfp4(y, axis=axis).dequantize())
    z = torch.zeros(3, 16)
    assert torch.equal(fake_quantize_nvfp4(z), z)


def test_fake_quantizers_refuse_bad_input():
    with pytest.raises(TypeError, match="x must be"):
        fake_quantize_mx(torch.ones(4, dtype=torch.float64), "FP8_E4M3")
    with pytest.raises(TypeError, match="x must be"):
        fake_quantize_mx([1.0], "FP8_E4M3")
    with pytest.raises(ValueError, match="fmt must be an MX element format"):
        fake_quantize_mx(torch.ones(4), "FP16")
    with pytest.raises(ValueError, match="block_size"):
        fake_quantize_mx(torch.ones(4), "FP8_E4M3", 0)
    with pytest.raises(ValueError, match="axis"):
        fake_quantize_mx(torch.ones(4), "FP8_E4M3", 2, axis=1)
    with pytest.raises(ValueError, match="scale_rounding"):
        fake_quantize_mx(torch.ones(4), "FP8_E4M3", scale_rounding="up")
    with pytest.raises(ValueError, match="at least one dimension"):
        fake_quantize_nvfp4(torch.tensor(1.0))


# ----------------------------------------------------------------------------------------------------------
# the quantised Linear against a reference, forward and backward
# ----------------------------------------------------------------------------------------------------------
def _reference_quantizer(recipe):
    """Q(t, role, axis) with microscaling's public functions (no fast paths)."""
    r = TRAINING_RECIPES[recipe]

    def q(t, role, axis):
        fmt = r.backward if role == "g" else r.forward
        if r.scaling == "mx":
            return quantize_mx(t, fmt, r.block_size, axis).dequantize()
        if r.scaling == "nvfp4":
            return quantize_nvfp4(t, axis=axis).dequantize()
        if r.scaling == "current":
            return ScaledTensor(*quantize_per_tensor(t, fmt), fmt, torch.float32).dequantize()
        # "none", and delayed scaling in its first step (scale 1)
        return F.round_to(t, fmt, saturate=r.saturate)
    return q


@pytest.mark.parametrize("recipe", [r for r in TRAINING_RECIPES if r != "fp32"])
def test_quantized_linear_matches_the_reference(recipe):
    g = torch.Generator().manual_seed(7)
    lin = nn.Linear(40, 24)
    with torch.no_grad():
        lin.weight.copy_(torch.randn(24, 40, generator=g) * 0.05)
        lin.bias.copy_(torch.randn(24, generator=g))
    model = nn.Sequential(lin)
    w, b = lin.weight.detach().clone(), lin.bias.detach().clone()
    quantizer = quantize_linears_(model, recipe)
    assert quantizer.layers == ["0"] and isinstance(model[0], QuantLinear) and model[0].weight is lin.weight
    x = (torch.randn(3, 5, 40, generator=g) * 3).requires_grad_()
    gy = torch.randn(3, 5, 24, generator=g) * 1e-3
    y = model(x)
    y.backward(gy)
    q = _reference_quantizer(recipe)
    x2, g2 = x.detach().reshape(-1, 40), gy.reshape(-1, 24)
    y_ref = q(x2, "x", -1) @ q(w, "w", -1).t() + b
    if TRAINING_RECIPES[recipe].per_axis:                  # each operand along its product's reduction axis
        gx_ref = q(g2, "g", -1) @ q(w, "w", 0)
        gw_ref = q(g2, "g", 0).t() @ q(x2, "x", 0)
    else:
        gx_ref = q(g2, "g", -1) @ q(w, "w", -1)
        gw_ref = q(g2, "g", -1).t() @ q(x2, "x", -1)
    assert torch.equal(y.detach().reshape(-1, 24), y_ref)
    assert torch.equal(x.grad.reshape(-1, 40), gx_ref)
    assert torch.equal(lin.weight.grad, gw_ref)
    assert torch.equal(lin.bias.grad, g2.sum(0))                  # the bias gradient from the unquantised g


def test_fp8_current_is_torchao_float8_linear():
    """The anchor: torchao's Float8Linear (tensorwise dynamic scaling, E4M3 for input and weight, E5M2 for the
    output gradient; emulate=True computes its products from the dequantised operands on a CPU) gives the same
    output, input gradient and weight gradient, bit for bit."""
    import copy
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        float8 = pytest.importorskip("torchao.float8")
    torch.manual_seed(0)
    ours = nn.Sequential(nn.Linear(64, 32, bias=False), nn.ReLU(), nn.Linear(32, 16, bias=False))
    theirs = copy.deepcopy(ours)
    float8.convert_to_float8_training(theirs, config=float8.Float8LinearConfig(emulate=True))
    quantize_linears_(ours, "fp8_current")
    x = torch.randn(48, 64) * 3
    gy = torch.randn(48, 16) * 1e-3
    xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    ya, yb = ours(xa), theirs(xb)
    ya.backward(gy)
    yb.backward(gy)
    assert torch.equal(ya, yb) and torch.equal(xa.grad, xb.grad)
    for a, b in zip(ours.parameters(), theirs.parameters()):
        assert torch.equal(a.grad, b.grad)


def test_block_recipes_quantise_along_the_reduction_axis():
    """For MX the wgrad operands are blocked along the batch: quantising them along the features instead
    gives another (wrong) product."""
    lin = nn.Linear(64, 32)
    model = nn.Sequential(lin)
    quantize_linears_(model, "mxfp4")
    x = torch.randn(64, 64, generator=torch.Generator().manual_seed(2)).requires_grad_()
    gy = torch.randn(64, 32, generator=torch.Generator().manual_seed(3))
    model(x).backward(gy)
    along_features = [quantize_mx(t, "FP4_E2M1", 32, -1).dequantize() for t in (gy, x.detach())]
    wrong = along_features[0].t() @ along_features[1]
    assert not torch.equal(lin.weight.grad, wrong)


def test_fp32_recipe_disabled_quantizer_and_skip_leave_linear_alone():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 3))
    ref = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 3))
    ref.load_state_dict(model.state_dict())
    x = torch.randn(5, 8)
    q = quantize_linears_(model, "fp32")
    assert torch.equal(model(x), ref(x)) and len(quantized_layers(model)) == 2
    model2 = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 3))
    model2.load_state_dict(ref.state_dict())
    q = quantize_linears_(model2, "mxfp4", skip=("2",))
    assert q.layers == ["0"] and isinstance(model2[2], nn.Linear) and not isinstance(model2[2], QuantLinear)
    q.enabled = False
    assert torch.equal(model2(x), ref(x))
    q.enabled = True
    assert not torch.equal(model2(x), ref(x))
    assert "mxfp4" in repr(model2[0]) and "mxfp4" in repr(q)


def test_quantize_linears_refuses_bad_arguments():
    with pytest.raises(TypeError, match="model"):
        quantize_linears_("model", "bf16")
    with pytest.raises(ValueError, match="recipe must be one of"):
        quantize_linears_(nn.Linear(2, 2), "fp7")
    with pytest.raises(TypeError, match="recipe"):
        quantize_linears_(nn.Linear(2, 2), 8)
    with pytest.raises(ValueError, match="skip"):
        quantize_linears_(nn.Sequential(nn.Linear(2, 2)), "bf16", skip=("nope",))
    with pytest.raises(TypeError, match="skip"):
        quantize_linears_(nn.Sequential(nn.Linear(2, 2)), "bf16", skip="0")
    with pytest.raises(ValueError, match="scale_rounding"):
        Quantizer("mxfp8", scale_rounding="round")
    with pytest.raises(TypeError, match="hardware"):
        Quantizer("fp8_current", hardware="yes")


def test_statistics_count_what_the_recipe_lost():
    """FP8 without scaling: output gradients below E5M2's half smallest subnormal (2⁻¹⁷) are lost."""
    lin = nn.Linear(16, 8, bias=False)
    model = nn.Sequential(lin)
    q = quantize_linears_(model, "fp8_unscaled")
    q.recording = True
    x = torch.ones(4, 16, requires_grad=True)
    gy = torch.full((4, 8), 2.0 ** -20)
    gy[0] = 1.0
    gy[1, 0] = 1e6                                           # beyond E5M2's 57344: saturates
    model(x).backward(gy)
    s = layer_stats(q.stats)
    assert s["0"]["g"]["underflow"] == pytest.approx(23 / 32)   # 32 non-zero values, 7 + 8 + 8 of them 2⁻²⁰
    assert s["0"]["g"]["saturated"] == pytest.approx(1 / 32)
    assert s["all"]["g"] == s["0"]["g"] and s["0"]["x"]["snr_db"] == math.inf          # ones: no error
    q.recording = False
    model(x).backward(gy)
    assert q.stats["0"]["g"]["n"] == 32                      # nothing added without recording


# ----------------------------------------------------------------------------------------------------------
# delayed scaling across steps
# ----------------------------------------------------------------------------------------------------------
def test_delayed_scaling_casts_with_the_history_of_earlier_steps():
    lin = nn.Linear(16, 4, bias=False)
    model = nn.Sequential(lin)
    q = quantize_linears_(model, "fp8_delayed", history_len=4, margin=1)
    ds = q.delayed
    base = torch.randn(8, 16, generator=torch.Generator().manual_seed(5))

    def cast(t, name):          # what DelayedScaling does with the scale it holds before the step
        s = torch.tensor(ds.scale(name) if name in ds.names else 1.0)
        return ScaledTensor(F.round_to(t * s, "FP8_E4M3", saturate=True), s, F.FP8_E4M3, torch.float32).dequantize()

    amaxes = []
    for factor in (1.0, 4.0, 0.5, 2.0, 1.0):
        x = (base * factor).requires_grad_()
        expected = cast(x.detach(), "0.x") @ cast(lin.weight.detach(), "0.w").t()
        y = model(x)
        assert torch.equal(y.detach(), expected)                              # the stale scales were used
        y.sum().backward()
        q.step()
        amaxes.append(float(base.abs().max()) * factor)
        # the next scale from the last 4 steps; the rolled history keeps the last 3 and a fresh entry
        assert ds.scale("0.x") == float(scale_from_amax(max(amaxes[-4:]), "FP8_E4M3", margin=1))
        assert float(ds.amax_history("0.x").max()) == pytest.approx(max(amaxes[-3:]))
    assert ds.step == 5 and set(ds.names) == {"0.x", "0.w", "0.g"}
    assert ds.exceeded("0.x") > 0          # step 2's input was 4× beyond the range its stale scale was made for
    # evaluation (no autograd) casts with the stale scales and leaves the histories alone
    before = {n: ds.amax_history(n).clone() for n in ds.names}
    with torch.no_grad():
        y = model(base * 100)
    assert torch.equal(y, cast(base * 100, "0.x") @ cast(lin.weight.detach(), "0.w").t())
    assert all(torch.equal(before[n], ds.amax_history(n)) for n in ds.names) and ds.step == 5


# ----------------------------------------------------------------------------------------------------------
# BF16 weights updated with stochastic rounding
# ----------------------------------------------------------------------------------------------------------
def test_stochastic_rounding_of_weights_is_unbiased_and_reproducible():
    n = 200_000
    update = 2.0 ** -10                                      # an eighth of BF16's ulp at 1 (2⁻⁷)
    w_rne = torch.ones(n) + update
    round_weights_([w_rne], "nearest_even")
    assert torch.equal(w_rne, torch.ones(n))                 # round-to-nearest loses the update: the stall
    runs = []
    for _ in range(2):
        w = torch.ones(n) + update
        round_weights_([w], "stochastic", generator=torch.Generator().manual_seed(11))
        runs.append(w)
    assert torch.equal(runs[0], runs[1])                     # the same generator state, the same weights
    w = runs[0]
    assert set(torch.unique(w).tolist()) == {1.0, 1.0 + 2.0 ** -7}
    p = update / 2.0 ** -7
    mean_err = float(w.double().mean()) - (1 + update)
    sigma = 2.0 ** -7 * math.sqrt(p * (1 - p) / n)
    assert abs(mean_err) < 5 * sigma                         # E[w] = 1 + update
    with pytest.raises(TypeError, match="params"):
        round_weights_([torch.ones(2, dtype=torch.int32)])


# ----------------------------------------------------------------------------------------------------------
# block size, E8M0 scales, one scale for all
# ----------------------------------------------------------------------------------------------------
def test_block_size_sweep_and_scale_comparison():
    g = torch.Generator().manual_seed(0)
    t = torch.randn(64, 256, generator=g) * torch.exp2(torch.randn(64, 256, generator=g) * 2)
    sweep = block_size_sweep({"t": t}, ("FP8_E4M3", "FP4_E2M1"), (8, 32, 256))
    row = sweep["t"]["FP4_E2M1"]
    assert set(row) == {"8", "32", "256", "tensor"}
    assert row["8"] > row["32"] > row["256"] > row["tensor"]           # smaller blocks, less error
    assert sweep["t"]["FP8_E4M3"]["32"] > row["32"] + 10                # 3 more mantissa bits
    cmp = block_scale_comparison({"t": t}, ("FP8_E4M3", "FP4_E2M1"))
    assert set(cmp["t"]["FP4_E2M1"]) == {"e8m0", "fp32", "nvfp4"} and "nvfp4" not in cmp["t"]["FP8_E4M3"]
    assert all(math.isfinite(v) for r in cmp["t"].values() for v in r.values())
    with pytest.raises(TypeError):
        block_size_sweep([t])


def test_one_scale_loses_what_per_tensor_scales_keep():
    big = log2_histogram(torch.randn(1000) * 100.0)
    small = log2_histogram(torch.randn(1000) * 2.0 ** -20)
    out = one_scale_vs_per_tensor({"big": big, "small": small}, "FP8_E4M3")
    assert out["one_scale"] == int(math.log2((big + small).max_scale("FP8_E4M3")))
    t = out["tensors"]
    assert t["small"]["lost_one_scale"] > 0.9 and t["small"]["lost_per_tensor"] < 0.05
    assert t["big"]["lost_one_scale"] == t["big"]["lost_per_tensor"]
    with pytest.raises(TypeError):
        one_scale_vs_per_tensor({"a": torch.ones(2)})


# ----------------------------------------------------------------------------------------------------------
# the experiment end to end
# ----------------------------------------------------------------------------------------------------------
TINY = dict(profile="quick", lm_dim=16, lm_layers=1, lm_heads=2, lm_context=16, lm_batch=4, lm_steps=8,
            lm_valid_chars=256, mlp_hidden=16, mlp_layers=1, mlp_batch=32, mlp_steps=8, evals=2, stats_every=4,
            block_sizes=(8, 32), sweep_formats=("FP8_E4M3", "FP4_E2M1"), threads=1,
            recipes=("fp32", "bf16", "fp16", "fp8_unscaled", "fp8_delayed", "mxfp4", "nvfp4", "bf16_sr"))


@pytest.fixture(scope="module")
def tiny():
    return fp8_recipes.run(fp8_recipes.Config(**TINY), progress=False)


def test_tiny_experiment_runs_every_recipe(tiny):
    assert set(tiny.runs) == {"lm", "mlp"}
    for model in ("lm", "mlp"):
        assert list(tiny.runs[model]) == list(TINY["recipes"])
        for name, r in tiny.runs[model].items():
            steps = TINY["lm_steps"] if model == "lm" else TINY["mlp_steps"]
            assert len(r["losses"]) == steps and [e["step"] for e in r["evals"]] == [4, 8]
            assert math.isfinite(tiny.final(model, name)) and not r["diverged"]
            assert bool(r["stats"]) == (name != "fp32")
    lm = tiny.models["lm"]
    assert lm["linears"] == ["blocks.0.qkv", "blocks.0.proj", "blocks.0.fc1", "blocks.0.fc2", "head"]
    assert lm["tokens_per_step"] == 64 and tiny.models["mlp"]["linears"] == ["0", "2"]
    assert set(tiny.histograms) == set(lm["linears"]) and set(tiny.histograms["head"]) == {"x", "w", "g"}
    assert tiny.histograms["head"]["g"].total > 0
    assert set(tiny.block_sweep) == {"x", "w", "g"} and set(tiny.block_sweep["g"]["head"]) == {"FP8_E4M3", "FP4_E2M1"}
    traces = tiny.delayed["traces"]
    assert len(traces) == 2 and sum(n.endswith(".g") for n in traces) == 1
    assert tiny.hardware["available"] is False and "compute capability" in tiny.hardware["reason"]
    # the same initial weights and batches: BF16 starts where FP32 starts
    assert tiny.runs["lm"]["bf16"]["losses"][0] == pytest.approx(tiny.runs["lm"]["fp32"]["losses"][0], abs=1e-2)
    assert 0 <= tiny.underflow("lm", "fp8_unscaled") <= 1 and tiny.underflow("lm", "bf16") == 0
    assert tiny.snr("lm", "mxfp4", "w") < tiny.snr("lm", "bf16", "w")
    assert tiny.gap("lm", "bf16") == 0 and "fp8_recipes" in tiny.describe()
    with pytest.raises(ValueError, match="model"):
        tiny.final("cnn", "bf16")
    with pytest.raises(ValueError, match="recipe"):
        tiny.final("lm", "mxfp6")
    with pytest.raises(ValueError, match="role"):
        tiny.underflow("lm", "bf16", "y")


def test_tiny_experiment_is_reproducible_and_round_trips(tiny, tmp_path):
    again = fp8_recipes.run(fp8_recipes.Config(**{**TINY, "models": ("mlp",), "recipes": ("bf16_sr", "mxfp4")}),
                            progress=False)
    for name in ("bf16_sr", "mxfp4"):
        assert again.runs["mlp"][name]["losses"] == tiny.runs["mlp"][name]["losses"]
    path = tiny.save(tmp_path / "fp8.json")
    back = fp8_recipes.FP8RecipesResult.load(path)
    assert back.runs["lm"]["mxfp4"]["losses"] == tiny.runs["lm"]["mxfp4"]["losses"]
    assert back.histograms["head"]["g"] == tiny.histograms["head"]["g"]
    assert back.stats("lm", "nvfp4") == tiny.stats("lm", "nvfp4") and back.config == tiny.config
    assert back.provenance["command"].startswith("python -m mpt_lab.experiments.fp8_recipes --profile quick")


def test_figures_and_tables(tiny):
    from mpt_lab import figures

    for fig in (figures.plot_fp8_training(tiny, "lm", tolerance=0.05), figures.plot_fp8_training(tiny, "mlp"),
                figures.plot_layer_quantization(tiny, "fp8_unscaled"), figures.plot_recipe_snr(tiny, "lm"),
                figures.plot_amax_history(tiny), figures.plot_block_size_error(tiny),
                figures.plot_block_size_error(tiny.block_sweep)):
        assert isinstance(fig, Figure)
        assert (fig._suptitle is not None and fig._suptitle.get_text()) or any(ax.get_title() for ax in fig.axes)
        for ax in fig.axes:
            assert ax.get_xlabel() or ax.get_ylabel() or ax.get_title()
        assert fig.legends or any(ax.get_legend() for ax in fig.axes)
    table = figures.fp8_results_table(tiny, tolerance=0.05)
    assert "<table" in table and "MXFP4" in table and "✓" in table and "LM: validation loss" in table
    assert "E8M0 scale" in figures.block_scale_table(tiny)
    cmp = one_scale_vs_per_tensor({n: h["g"] for n, h in tiny.histograms.items()}, "FP8_E4M3")
    assert "lost with one scale" in figures.one_scale_table(cmp)
    assert "No tensor-core runs" in figures.hardware_table(tiny)
    with pytest.raises(TypeError):
        figures.plot_fp8_training(object())
    with pytest.raises(ValueError, match="recipe"):
        figures.plot_layer_quantization(tiny, "mxfp6")
    with pytest.raises(ValueError, match="no statistics"):
        figures.plot_layer_quantization(tiny, "fp32")


def test_results_and_recipe_tables_fit_the_page(tiny):
    """The results table has one loss column per model (the gap to BF16 beside the loss) and the recipe table the
    formats and scaling, so neither is wider than the page column; together they say what the old table said."""
    import re

    from mpt_lab import figures

    results = figures.fp8_results_table(tiny, tolerance=0.05)
    header = re.findall(r"<th style[^>]*>(.*?)</th>", results)
    assert len(header) == 1 + 2 * len(tiny.runs) + ("mlp" in tiny.runs) and "MLP: accuracy" in header
    recipes = figures.fp8_recipe_table(tiny)
    assert re.findall(r"<th style[^>]*>(.*?)</th>", recipes) == ["recipe", "forward / backward", "scaling", "bits per value"]
    assert "E8M0 per 32 values" in recipes and recipes.count("<tr>") == results.count("<tr>")


def test_mx_block_diagram_shows_the_real_scale_and_codes():
    from mpt_lab import figures
    from mpt_lab.microscaling import quantize_mx

    g = torch.Generator().manual_seed(10)
    block = torch.randn(32, generator=g, dtype=torch.float64) * 2.0 ** -12
    block[5] = 2.0 ** -6 * 1.3
    fig = figures.plot_mx_block(block)
    q8, q4 = (quantize_mx(block, f, block_size=32) for f in ("FP8_E4M3", "FP4_E2M1"))
    code = int(q8.scale_codes[0])
    texts = [t.get_text() for ax in fig.axes for t in ax.texts]
    assert any(f"code {code}" in t and f"2^{code - 127}" in t for t in texts)           # the real E8M0 byte
    assert [t for t in texts if len(t) == 2] == [f"{c:02X}" for c in q8.element_codes.tolist()]  # the real codes
    titles = " ".join(ax.get_title() for ax in fig.axes)
    assert f"2^{int(q4.scale_codes[0]) - 127}" in titles and "8.25 bits per value" in titles
    lost = int(((q4.dequantize(torch.float64) == 0) & (block != 0)).sum())
    assert any(f"stored as 0 ({lost} of 32)" in t.get_text() for ax in fig.axes if ax.get_legend()
               for t in ax.get_legend().get_texts())
    with pytest.raises(ValueError, match="1-D"):
        figures.plot_mx_block(torch.zeros(32))
    with pytest.raises(ValueError):
        figures.plot_mx_block(block, "FP16")


@pytest.mark.parametrize("field,value", [("recipes", ("fp7",)), ("recipes", ()), ("models", ("cnn",)),
                                         ("lm_dim", 31), ("lm_steps", 0), ("margin", -1), ("lm_lr", 0.0),
                                         ("block_sizes", (0,)), ("scale_rounding", "up"), ("hardware", "yes"),
                                         ("sweep_formats", ("FP16",)), ("lm_valid_chars", 8)])
def test_bad_config_names_the_field(field, value):
    cfg = fp8_recipes.Config(**{**TINY, field: value})
    with pytest.raises(ValueError, match=f"config.{field}"):
        fp8_recipes.run(cfg, progress=False)


def test_profiles_are_valid_and_name_what_the_chapter_asserts():
    for p in ("quick", "cpu", "full"):
        cfg = fp8_recipes.config_for(p)
        cfg.validate()
        assert {"fp32", "bf16", "fp8_unscaled", "fp8_current", "fp8_delayed", "mxfp8", "mxfp4"} <= set(cfg.recipes)
    assert set(fp8_recipes.config_for("cpu").recipes) == set(TRAINING_RECIPES)


def test_char_transformer():
    train, valid, vocab = fp8_recipes.kjv_characters()
    assert len(train) > 3_000_000 and len(valid) > 100_000 and "\n" in vocab and " " in vocab
    assert not any(c.isdigit() for c in vocab)             # verse numbers are removed
    m = fp8_recipes.CharTransformerLM(len(vocab), 32, 2, 4, 16)
    out = m(train[:32].view(2, 16))
    assert out.shape == (2, 16, len(vocab))
    # causal: the logits at position t do not depend on later characters
    ids = train[:16].view(1, 16).clone()
    ids2 = ids.clone()
    ids2[0, 10:] = 0
    assert torch.equal(m(ids)[0, :10], m(ids2)[0, :10])
    with pytest.raises(ValueError, match="divisible"):
        fp8_recipes.CharTransformerLM(10, 30, 1, 4, 8)
    with pytest.raises(ValueError, match="dim"):
        fp8_recipes.CharTransformerLM(10, 0, 1, 1, 8)
    assert fp8_recipes.lr_factor(0, 100) == pytest.approx(0.1) and fp8_recipes.lr_factor(9, 100) == 1.0
    assert fp8_recipes.lr_factor(100, 100) == pytest.approx(0.1)


# ----------------------------------------------------------------------------------------------------------
# FP8 tensor cores (torch._scaled_mm) where there are some
# ----------------------------------------------------------------------------------------------------------
def test_hardware_is_off_without_fp8_tensor_cores():
    q = Quantizer("fp8_current", hardware=True)
    assert q.hardware == hardware_fp8_available()
    assert Quantizer("mxfp8", hardware=True).hardware is False          # block scaling is emulated everywhere


@pytest.mark.skipif(not hardware_fp8_available(), reason="needs a CUDA GPU with FP8 tensor cores (capability ≥ 8.9)")
def test_scaled_mm_products_match_the_emulation_on_the_gpu():
    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(0)
    lin = nn.Linear(64, 32).to(dev)
    model = nn.Sequential(lin)
    q = quantize_linears_(model, "fp8_current", hardware=True)
    ref = nn.Sequential(nn.Linear(64, 32).to(dev))
    ref.load_state_dict(model.state_dict())
    qe = quantize_linears_(ref, "fp8_current", hardware=False)
    x = torch.randn(48, 64, device=dev, generator=g)
    gy = torch.randn(48, 32, device=dev, generator=g) * 1e-3
    xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    ya, yb = model(xa), ref(xb)
    ya.backward(gy)
    yb.backward(gy)
    assert q.gemms["hardware"] == 3 and qe.gemms["hardware"] == 0
    for a, b in ((ya, yb), (xa.grad, xb.grad), (lin.weight.grad, ref[0].weight.grad)):
        assert torch.allclose(a, b, rtol=1e-4, atol=1e-6 * float(b.abs().max()))
    res = fp8_recipes.run(fp8_recipes.Config(**{**TINY, "recipes": ("fp32", "fp8_current"), "models": ("mlp",),
                                                "mlp_batch": 32, "mlp_hidden": 32, "device": "cuda"}),
                          progress=False)
    assert res.hardware["available"] and "fp8_current_hw" in res.runs["mlp"]
    assert abs(res.gap("mlp", "fp8_current_hw", "fp8_current")) < 0.05
