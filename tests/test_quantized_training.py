"""mpt_lab.quantized_training: the quantised Linear of every recipe, the Quantizer, BF16 weights.

The quantised Linear is checked against products of operands quantised with mpt_lab.microscaling's exact
functions (no fast paths), per recipe and per axis, forward and backward; fp8_current against torchao's
Float8Linear; delayed scaling's history across steps; the statistics a recipe records; BF16 weights with
stochastic rounding; and the FP8 tensor-core path on a GPU that has one (skipped elsewhere)."""

import math

import pytest
import torch
from torch import nn

from mpt_lab import formats as F
from mpt_lab.microscaling import (
    ScaledTensor,
    layer_stats,
    quantize_mx,
    quantize_nvfp4,
    quantize_per_tensor,
    scale_from_amax,
)
from mpt_lab.quantized_training import (
    TRAINING_RECIPES,
    Quantizer,
    QuantLinear,
    hardware_fp8_available,
    quantize_linears_,
    quantized_layers,
    round_weights_,
)


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
    if TRAINING_RECIPES[recipe].per_axis:  # each operand along its product's reduction axis
        gx_ref = q(g2, "g", -1) @ q(w, "w", 0)
        gw_ref = q(g2, "g", 0).t() @ q(x2, "x", 0)
    else:
        gx_ref = q(g2, "g", -1) @ q(w, "w", -1)
        gw_ref = q(g2, "g", -1).t() @ q(x2, "x", -1)
    assert torch.equal(y.detach().reshape(-1, 24), y_ref)
    assert torch.equal(x.grad.reshape(-1, 40), gx_ref)
    assert torch.equal(lin.weight.grad, gw_ref)
    assert torch.equal(lin.bias.grad, g2.sum(0))  # the bias gradient from the unquantised g


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
    gy = torch.full((4, 8), 2.0**-20)
    gy[0] = 1.0
    gy[1, 0] = 1e6  # beyond E5M2's 57344: saturates
    model(x).backward(gy)
    s = layer_stats(q.stats)
    assert s["0"]["g"]["underflow"] == pytest.approx(23 / 32)  # 32 non-zero values, 7 + 8 + 8 of them 2⁻²⁰
    assert s["0"]["g"]["saturated"] == pytest.approx(1 / 32)
    assert s["all"]["g"] == s["0"]["g"] and s["0"]["x"]["snr_db"] == math.inf  # ones: no error
    q.recording = False
    model(x).backward(gy)
    assert q.stats["0"]["g"]["n"] == 32  # nothing added without recording


# ----------------------------------------------------------------------------------------------------------
# delayed scaling across steps
# ----------------------------------------------------------------------------------------------------------
def test_delayed_scaling_casts_with_the_history_of_earlier_steps():
    lin = nn.Linear(16, 4, bias=False)
    model = nn.Sequential(lin)
    q = quantize_linears_(model, "fp8_delayed", history_len=4, margin=1)
    ds = q.delayed
    base = torch.randn(8, 16, generator=torch.Generator().manual_seed(5))

    def cast(t, name):  # what DelayedScaling does with the scale it holds before the step
        s = torch.tensor(ds.scale(name) if name in ds.names else 1.0)
        return ScaledTensor(F.round_to(t * s, "FP8_E4M3", saturate=True), s, F.FP8_E4M3, torch.float32).dequantize()

    amaxes = []
    for factor in (1.0, 4.0, 0.5, 2.0, 1.0):
        x = (base * factor).requires_grad_()
        expected = cast(x.detach(), "0.x") @ cast(lin.weight.detach(), "0.w").t()
        y = model(x)
        assert torch.equal(y.detach(), expected)  # the stale scales were used
        y.sum().backward()
        q.step()
        amaxes.append(float(base.abs().max()) * factor)
        # the next scale from the last 4 steps; the rolled history keeps the last 3 and a fresh entry
        assert ds.scale("0.x") == float(scale_from_amax(max(amaxes[-4:]), "FP8_E4M3", margin=1))
        assert float(ds.amax_history("0.x").max()) == pytest.approx(max(amaxes[-3:]))
    assert ds.step == 5 and set(ds.names) == {"0.x", "0.w", "0.g"}
    assert ds.exceeded("0.x") > 0  # step 2's input was 4× beyond the range its stale scale was made for
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
    update = 2.0**-10  # an eighth of BF16's ulp at 1 (2⁻⁷)
    w_rne = torch.ones(n) + update
    round_weights_([w_rne], "nearest_even")
    assert torch.equal(w_rne, torch.ones(n))  # round-to-nearest loses the update: the stall
    runs = []
    for _ in range(2):
        w = torch.ones(n) + update
        round_weights_([w], "stochastic", generator=torch.Generator().manual_seed(11))
        runs.append(w)
    assert torch.equal(runs[0], runs[1])  # the same generator state, the same weights
    w = runs[0]
    assert set(torch.unique(w).tolist()) == {1.0, 1.0 + 2.0**-7}
    p = update / 2.0**-7
    mean_err = float(w.double().mean()) - (1 + update)
    sigma = 2.0**-7 * math.sqrt(p * (1 - p) / n)
    assert abs(mean_err) < 5 * sigma  # E[w] = 1 + update
    with pytest.raises(TypeError, match="params"):
        round_weights_([torch.ones(2, dtype=torch.int32)])


# ----------------------------------------------------------------------------------------------------------
# FP8 tensor cores (torch._scaled_mm) where there are some
# ----------------------------------------------------------------------------------------------------------
def test_hardware_is_off_without_fp8_tensor_cores():
    q = Quantizer("fp8_current", hardware=True)
    assert q.hardware == hardware_fp8_available()
    assert Quantizer("mxfp8", hardware=True).hardware is False  # block scaling is emulated everywhere


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
