"""mpt_lab.simulate against the arithmetic it promises and against real float16 runs on the CPU.

Two kinds of check, so that every test holds on every CPU (measured with torch 2.13.0 on an Intel Xeon with
AVX-512 FP16/AMX, natively and with ``ONEDNN_MAX_CPU_ISA=AVX2`` / ``ATEN_CPU_CAPABILITY=avx2|default``, which give
the kernels of CPUs without them; :class:`mpt_lab.device.CpuKernels` says which run):

* exact, on every CPU: simulate against a network built by hand with simulate's semantics (every Linear/Conv2d
  result computed in float32 from FP16 operands and rounded once, every other op on PyTorch's float16 kernel:
  :func:`_ieee_fp16_reference`), and element-wise ops, reductions and small training steps against the real
  float16/bfloat16 kernels, bit for bit, no tolerance;
* against the real float16 Linear/Conv2d kernels, which accumulate in FP32 in their own order: each layer of a
  real ``.half()`` forward and backward is within the derived tolerance of an FP32 accumulation rounded once
  (:func:`_assert_fp32_accumulation_rounded_once`, from FP32's error bound γ_k·Σ|a_i b_i|), except ATen's fallback
  convolution (CPUs without oneDNN float16, e.g. AVX2 ones), whose backward rounds per image: a test of its
  own checks exactly that.
"""

import copy

import pytest
import torch
from torch import nn

from mpt_lab.accumulation import any_order_bounds
from mpt_lab.device import cpu_kernels
from mpt_lab.formats import BF16, FP8_E4M3, FP8_E5M2, FP16, round_to
from mpt_lab.simulate import (
    fp16_convolution_probe,
    paused,
    round_parameters_,
    rounder,
    simulate,
)

# Nearly every test here runs PyTorch's real float16/bfloat16 CPU kernels (simulate delegates to them, and the
# references use them), whose paths differ by CPU: tests/test_cpu_kernels.py reruns this file under a second one.
pytestmark = pytest.mark.cpu_kernels


def _mlp(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))


def _conv(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(8, 8, 3, padding=1),
        nn.ReLU(),
        nn.Flatten(),
        nn.Linear(8 * 6 * 6, 10),
    )


def _inputs(kind, n=16, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 32, generator=g) if kind == "mlp" else torch.randn(n, 3, 12, 12, generator=g)


def _fp16_ulp(y):
    """Spacing of FP16 values at |y| (float32 tensor of FP16 values)."""
    a = y.abs().clamp_min(2.0**-14)
    return torch.exp2(torch.floor(torch.log2(a)) - 10)


def _assert_close_fp16(sim, real, *, ulps=1.0, of_max=True, max_share=0.05):
    """|sim - real| <= ulps FP16 ulps (of the largest |real| with of_max, else of each value); few differ."""
    real = real.float()
    assert sim.dtype == torch.float32 and sim.shape == real.shape
    diff = (sim - real).abs()
    ulp = _fp16_ulp(real.abs().max()) if of_max else _fp16_ulp(real)
    assert bool((diff <= ulps * ulp).all()), f"more than {ulps} ulp apart: {(diff / ulp).max().item()}"
    assert (diff > 0).float().mean().item() <= max_share


def _is_in(x, fmt):
    x = x.detach()
    y = round_to(x, fmt)
    return bool(((y == x) | (x.isnan() & y.isnan())).all())


# ------------------------------------------------------------------------------------------------------
# the rounding kernels
# ------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("fmt", [FP16, BF16, FP8_E4M3, FP8_E5M2])
def test_rounder_bit_identical_to_round_to(fmt):
    g = torch.Generator().manual_seed(3)
    bits = torch.randint(-(2**31), 2**31 - 1, (200_000,), generator=g, dtype=torch.int64).to(torch.int32)
    x = torch.cat(
        [
            bits.view(torch.float32),
            torch.randn(100_000, generator=g) * torch.exp2(torch.randint(-40, 20, (100_000,), generator=g).float()),
            torch.tensor([0.0, -0.0, float("inf"), -float("inf"), float("nan"), fmt.max, 464.0, 465.0]),
        ]
    )[:300_000]
    want = round_to(x, fmt)
    for got in (rounder(fmt)(x), rounder(fmt)(x.reshape(300, -1).t()).t().reshape(-1)):
        same = (got.view(torch.int32) == want.view(torch.int32)) | (got.isnan() & want.isnan())
        assert bool(same.all())
    x64 = x[:1000].double()
    assert torch.equal(rounder(fmt)(x64).nan_to_num(0.0), round_to(x64, fmt).nan_to_num(0.0))


def test_rounder_takes_round_to_paths_for_every_rounding():
    """One implementation: the same bits as round_to, stochastic rounding included (same generator state)."""
    g = torch.Generator().manual_seed(4)
    x = torch.randn(50_000, generator=g) * torch.exp2(torch.randint(-30, 12, (50_000,), generator=g).float())
    for fmt in (FP16, BF16, FP8_E4M3, FP8_E5M2):
        for rounding in ("nearest_even", "toward_zero", "stochastic"):
            torch.manual_seed(5)
            got = rounder(fmt, rounding)(x)
            torch.manual_seed(5)
            want = round_to(x, fmt, rounding=rounding)
            assert torch.equal(got.view(torch.int32), want.view(torch.int32)), (fmt, rounding)


@pytest.mark.parametrize("fmt", [FP16, FP8_E4M3])  # a torch conversion, the bit path
def test_in_place_ops_are_rounded_in_place(fmt):
    g = torch.Generator().manual_seed(6)
    x, z = torch.randn(40, 50, generator=g), torch.randn(40, 50, generator=g) * 1e-2
    want = round_to(round_to(x, fmt) + round_to(z, fmt), fmt)
    y = round_to(x, fmt)
    yt = round_to(x, fmt).t()  # not contiguous
    with simulate(fmt, mode="all"):
        y.add_(z)
        yt.add_(z.t())
    assert torch.equal(y, want) and torch.equal(yt.t(), want)


def test_rounder_bad_arguments():
    with pytest.raises(ValueError, match="fmt"):
        rounder("FP17")
    with pytest.raises(ValueError, match="rounding"):
        rounder(FP16, "up")


# ------------------------------------------------------------------------------------------------------
# (a), (b): forward against real float16
# ------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["all", "autocast"])
@pytest.mark.parametrize("kind", ["mlp", "conv"])
def test_forward_is_bit_identical_to_the_ieee_reference(kind, mode):
    """Every CPU: a simulated forward (mode "all" on FP16 weights and inputs, or mode "autocast" on the float32
    model, whose linear/conv/ReLU/pooling ops all run in FP16 under autocast) gives, bit for bit, the network
    built by hand with every Linear/Conv2d result rounded once from float32."""
    model = _mlp() if kind == "mlp" else _conv()
    x = _inputs(kind)
    want = _ieee_fp16_reference(model)(x.half()).float()
    if mode == "all":
        sim_model, xs = round_parameters_(copy.deepcopy(model), FP16), round_to(x, FP16)
    else:
        sim_model, xs = model, x
    with simulate(FP16, mode=mode) as sim:
        y = sim_model(xs)
    assert sim.ops_rounded > 0 and _is_in(y, FP16)
    assert torch.equal(y, want)


def test_all_mode_rounds_inputs_and_parameters_it_was_not_given_rounded():
    model, x = _mlp(), _inputs("mlp")
    want = _ieee_fp16_reference(model)(x.half()).float()
    with simulate("FP16", mode="all"):  # fp32 weights and input: rounded where the ops use them
        y = model(x)
    assert torch.equal(y, want)
    assert not _is_in(model[0].weight, FP16)  # ... but not changed


def test_autocast_mode_keeps_float32_ops_and_mixed_inputs_in_float32():
    g = torch.Generator().manual_seed(0)
    a, b, c = (torch.randn(16, 16, generator=g) for _ in range(3))
    with simulate("FP16", mode="autocast"):
        h = a @ b  # lower precision: rounded
        r = torch.relu(h)  # all inputs FP16: rounded (exact here)
        s = torch.softmax(h, dim=1)  # float32 op
        m = h + c  # FP16 + FP32 -> FP32
        e = h * 3.14159  # FP16 and a Python scalar -> FP16
    assert _is_in(h, FP16) and _is_in(r, FP16) and _is_in(e, FP16)
    assert not _is_in(s, FP16) and not _is_in(m, FP16)
    assert torch.equal(h, round_to(round_to(a, FP16) @ round_to(b, FP16), FP16))


def test_autocast_mode_backward_rounds_gradients_of_fp16_tensors():
    model, x = _mlp(), _inputs("mlp")
    with simulate("FP16", mode="autocast"):
        loss = model(x).float().pow(2).mean()
        loss.backward()
    for p in model.parameters():  # gradients of the linear layers come from FP16 kernels
        assert _is_in(p.grad, FP16)
    ref = _ieee_fp16_reference(_mlp())  # autocast's FP16 copies of the weights, each used once: the FP32
    ref(x.half()).float().pow(2).mean().backward()  # weights' gradients are the FP16 copies' gradients
    for p, q in zip(model.parameters(), ref.parameters()):
        assert torch.equal(p.grad, q.grad.float())


def test_autocast_mode_backward_computes_in_float32_where_autocast_does():
    """x16 / norm32 (SSD's L2Norm): autograd computes the backward in float32 and casts only the gradient of the
    float16 tensor.  Rounding the float32 intermediates (the gradient of the norm, its sqrt backward) would
    overflow FP16 where real autocast does not."""

    def forward(lin, x, g):
        h = torch.relu(lin(x))
        norm = h.float().pow(2).sum(1, keepdim=True).add(1e-10).sqrt()
        return (h / norm * 20.0 * g).sum()

    def layer():
        torch.manual_seed(3)
        return nn.Linear(16, 8, bias=False)

    x = torch.randn(64, 16, generator=torch.Generator().manual_seed(1))
    x[:8] *= 1e-2  # rows of small activations: a small norm, a large gradient of the norm
    g = torch.randn(64, 8, generator=torch.Generator().manual_seed(2))
    real = layer()
    with torch.autocast("cpu", dtype=torch.float16):
        loss = forward(real, x, g)
    loss.backward()
    sim = layer()
    with simulate("FP16", mode="autocast"):
        forward(sim, x, g).backward()
    fp32 = layer()
    forward(fp32, x, g).backward()
    assert torch.isfinite(real.weight.grad).all()
    assert torch.isfinite(sim.weight.grad).all()
    assert _is_in(sim.weight.grad, FP16)
    err = (sim.weight.grad - real.weight.grad).norm() / real.weight.grad.norm()
    err32 = (fp32.weight.grad - real.weight.grad).norm() / real.weight.grad.norm()
    assert err < err32  # the emulation is closer to real FP16 autocast than FP32 is


# ------------------------------------------------------------------------------------------------------
# (c) gradient underflow, (d) training
# ------------------------------------------------------------------------------------------------------
def _zero_shares(model):
    return [(p.grad == 0).float().mean().item() for p in model.parameters()]


class _RoundedOnce(torch.autograd.Function):
    """A float16 Linear/Conv2d with the arithmetic :mod:`mpt_lab.simulate` promises for lower-precision ops,
    written out by hand: forward and every gradient computed in float32 from the float16 operands, each rounded
    once to float16 (``.half()`` is IEEE round-to-nearest-even with subnormals)."""

    @staticmethod
    def forward(ctx, fn, x, w, b):
        ctx.fn = fn
        ctx.save_for_backward(x, w, b)
        return fn(x.float(), w.float(), b.float()).half()

    @staticmethod
    def backward(ctx, g):
        x, w, b = (t.float().requires_grad_() for t in ctx.saved_tensors)
        with torch.enable_grad():
            y = ctx.fn(x, w, b)
        grads = torch.autograd.grad(y, (x, w, b), g.float())
        return (None,) + tuple(t.half() for t in grads)


def _ieee_fp16_reference(model):
    """``model.half()`` with its Linear/Conv2d layers computed as :class:`_RoundedOnce`, the element-wise ops
    (ReLU, pooling, the loss) on PyTorch's float16 kernels: simulate's semantics built without simulate."""
    half = copy.deepcopy(model).half()
    for m in half:
        if isinstance(m, (nn.Linear, nn.Conv2d)):
            fn = (
                nn.functional.linear
                if isinstance(m, nn.Linear)
                else lambda x, w, b, m=m: nn.functional.conv2d(x, w, b, m.stride, m.padding)
            )
            m.forward = lambda x, m=m, fn=fn: _RoundedOnce.apply(fn, x, m.weight, m.bias)
    return half


def _underflow_runs(kind, log2_scale, seed=0):
    """One backward of the loss × 2^log2_scale through a pure FP16 model, three ways: simulate(mode="all"), the
    hand-built IEEE reference, and FP32.  The loss is computed on the FP16 logits in both FP16 runs."""
    model = _mlp(seed) if kind == "mlp" else _conv(seed)
    x = _inputs(kind, seed=seed + 1)
    y = torch.randint(0, 10, (x.shape[0],), generator=torch.Generator().manual_seed(2))
    scale = 2.0**log2_scale  # pushes many gradients below FP16's smallest subnormal 2^-24

    def backward(m, inputs):
        (nn.functional.cross_entropy(m(inputs), y) * scale).backward()
        return m

    sim = round_parameters_(copy.deepcopy(model), FP16)
    with simulate("FP16", mode="all"):
        backward(sim, round_to(x, FP16))
    return {
        "sim": sim,
        "reference": backward(_ieee_fp16_reference(model), x.half()),
        "fp32": backward(copy.deepcopy(model), x),
    }


def _grads(model):
    return [p.grad.float() for p in model.parameters()]


@pytest.mark.parametrize("kind", ["mlp", "conv"])
@pytest.mark.parametrize("log2_scale", [-14, -20])
def test_gradient_underflow_is_bit_identical_to_the_ieee_reference(kind, log2_scale):
    """Every CPU: the simulated FP16 backward gives, bit for bit, the gradients of the same network built by hand
    with every Linear/Conv2d result rounded once from float32 (what simulate promises), so it loses exactly the
    same gradient values to underflow."""
    runs = _underflow_runs(kind, log2_scale)
    zeros = [(g == 0).float().mean().item() for g in _grads(runs["sim"])]
    zeros32 = [(g == 0).float().mean().item() for g in _grads(runs["fp32"])]
    assert sum(zeros) > sum(zeros32) + 0.1  # the scenario really loses gradients in FP16 ...
    for s, r in zip(_grads(runs["sim"]), _grads(runs["reference"])):  # ... the same ones as the reference
        assert torch.equal(s, r)
    assert all(_is_in(p.grad, FP16) for p in runs["sim"].parameters())


def _assert_fp32_accumulation_rounded_once(got, exact, abs_sum, k, what):
    """``got`` (a float16 kernel's result, or simulate's) is an FP32 accumulation of k exact products (FP16 × FP16
    is exact in FP32), in any order, rounded once to FP16: it lies in the interval of
    :func:`mpt_lab.accumulation.any_order_bounds` (derived from FP32's error bound γ_k·Σ|a_i b_i|)."""
    low, high = any_order_bounds(exact.double(), abs_sum.double(), k)
    got = got.double()
    assert bool(((low <= got) & (got <= high)).all()), what


def test_the_convolution_probe_tells_the_kernels_apart():
    """What chapter 8 shows: oneDNN's float16 convolution stays within the FP32-accumulation bounds, ATen's
    fallback (which rounds per image) does not."""
    p = fp16_convolution_probe()
    assert p["convolution"] == cpu_kernels().fp16_convolution and p["values"] == 288
    assert (p["outside_fp32_bounds"] == 0) == (p["convolution"] == "onednn"), p
    assert p["differ_from_simulate"] >= p["outside_fp32_bounds"]
    with pytest.raises(ValueError, match="batch"):
        fp16_convolution_probe(batch=1)


def _conv_of(m):
    return lambda x, w, b: nn.functional.conv2d(x, w, b, m.stride, m.padding)


@pytest.mark.parametrize("kind", ["mlp", "conv"])
def test_real_fp16_layers_are_fp32_accumulations_rounded_once(kind):
    """Every Linear/Conv2d of a real ``.half()`` forward and backward (loss × 2⁻¹⁴, so that gradients reach the
    subnormals) is what simulate computes for it, an FP32 accumulation rounded once, within the derived
    tolerance of :func:`_assert_fp32_accumulation_rounded_once`; checked on the layer's own float16 inputs.
    Exception, named: the backward of ATen's fallback convolution (CPUs without oneDNN float16, e.g. AVX2
    ones), which rounds per image (test_aten_fallback_convolution_rounds_the_weight_gradient_per_image)."""
    model = copy.deepcopy(_mlp() if kind == "mlp" else _conv()).half()
    x = _inputs(kind).half()
    y = torch.randint(0, 10, (x.shape[0],), generator=torch.Generator().manual_seed(2))
    seen = {}
    for m in model:
        if isinstance(m, (nn.Linear, nn.Conv2d)):
            m.register_forward_hook(lambda m, i, o: seen.setdefault(m, {}).update(x=i[0], y=o))
            m.register_full_backward_hook(lambda m, gi, go: seen[m].update(g=go[0], gx=gi[0]))
    (nn.functional.cross_entropy(model(x), y) * 2.0**-14).backward()
    checked = 0
    for m, r in seen.items():
        fn = nn.functional.linear if isinstance(m, nn.Linear) else _conv_of(m)
        fan_in = m.weight[0].numel() + 1  # products per output, and the bias
        xa, wa, ba = (t.detach().double() for t in (r["x"], m.weight, m.bias))
        _assert_fp32_accumulation_rounded_once(
            r["y"], fn(xa, wa, ba), fn(xa.abs(), wa.abs(), ba.abs()), fan_in, (m, "forward")
        )
        checked += 1
        if isinstance(m, nn.Conv2d) and cpu_kernels().fp16_convolution != "onednn":
            continue  # ATen's fallback: rounds per image (checked by its own test)
        g = r["g"].double()

        def vjp(xx, ww, gg, wrt):
            xx, ww = xx.clone().requires_grad_(), ww.clone().requires_grad_()
            return torch.autograd.grad(fn(xx, ww, None), (xx, ww)[wrt], gg)[0]

        per_weight = g.numel() // g.shape[1]  # products summed per weight gradient value
        _assert_fp32_accumulation_rounded_once(
            m.weight.grad, vjp(xa, wa, g, 1), vjp(xa.abs(), wa, g.abs(), 1), per_weight, (m, "weight gradient")
        )
        _assert_fp32_accumulation_rounded_once(
            m.bias.grad,
            g.sum([d for d in range(g.dim()) if d != 1]),
            g.abs().sum([d for d in range(g.dim()) if d != 1]),
            per_weight,
            (m, "bias gradient"),
        )
        if r["gx"] is not None:
            per_input = m.weight.numel() // m.weight.shape[1]
            _assert_fp32_accumulation_rounded_once(
                r["gx"], vjp(xa, wa, g, 0), vjp(xa, wa.abs(), g.abs(), 0), per_input, (m, "input gradient")
            )
        checked += 1
    assert checked >= 3


def test_aten_fallback_convolution_rounds_the_weight_gradient_per_image():
    """What :class:`mpt_lab.device.CpuKernels` says of the two float16 convolution kernels, checked on one layer
    with float16 inputs: oneDNN's weight gradient is the float32 sum rounded once; ATen's fallback
    (``thnn_conv2d``) adds each image's float32 sum to a float16 accumulator, rounding after every image."""
    g = torch.Generator().manual_seed(0)
    n = 6
    x = torch.randn(n, 4, 7, 7, generator=g).half()
    w = (torch.randn(8, 4, 3, 3, generator=g) * 0.2).half()
    go = (torch.randn(n, 8, 7, 7, generator=g) * 2.0**-12).half()
    wh = w.clone().requires_grad_()
    nn.functional.conv2d(x, wh, padding=1).backward(go)
    x64, go64 = x.double(), go.double()
    per_image = [torch.nn.grad.conv2d_weight(x64[i : i + 1], w.shape, go64[i : i + 1], padding=1) for i in range(n)]
    once = sum(per_image).half()
    acc = torch.zeros_like(once)
    for p in per_image:  # float32 per image is exact here: ≤ 49 products of 11-bit values
        acc = (acc.double() + p).half()
    assert not torch.equal(once, acc)  # the two models differ on these inputs
    want = once if cpu_kernels().fp16_convolution == "onednn" else acc
    assert torch.equal(wh.grad, want), cpu_kernels().describe()


def test_sgd_training_is_bit_identical_to_the_ieee_reference():
    """Five SGD steps of a pure FP16 MLP, the update inside the block: losses and weights bit for bit those of the
    hand-built reference (FP16 weights updated by PyTorch's float16 SGD kernel), on every CPU."""
    model, x = _mlp(), _inputs("mlp", n=32)
    y = torch.randint(0, 10, (32,), generator=torch.Generator().manual_seed(2))
    ref = _ieee_fp16_reference(model)
    opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    want = []
    for _ in range(5):
        opt.zero_grad()
        loss = nn.functional.cross_entropy(ref(x.half()), y)
        loss.backward()
        opt.step()
        want.append(loss.float())

    sim_model = round_parameters_(copy.deepcopy(model), FP16)
    opt = torch.optim.SGD(sim_model.parameters(), lr=0.1)
    got, xs = [], round_to(x, FP16)
    for _ in range(5):
        opt.zero_grad()
        with simulate("FP16", mode="all"):
            loss = nn.functional.cross_entropy(sim_model(xs), y)
            loss.backward()
            opt.step()  # FP16 weights: the update is rounded as in .half() training
        got.append(loss)
    assert all(_is_in(p, FP16) for p in sim_model.parameters())
    assert want[-1] < want[0]
    assert all(torch.equal(a, b) for a, b in zip(got, want)), (got, want)
    assert all(torch.equal(p, q.float()) for p, q in zip(sim_model.parameters(), ref.parameters()))


# ------------------------------------------------------------------------------------------------------
# (d') bit for bit against the real float16 / bfloat16 kernels (see "Which kernel computes an op")
# ------------------------------------------------------------------------------------------------------
REAL = {"FP16": torch.float16, "BF16": torch.bfloat16}
# sizes around the CPU kernels' vector loops (16 float16 per AVX2 vector, 32 per AVX-512 one, two vectors per
# step): a vectorised body and an element-by-element tail of every length 0..63
SIZES = [1, 7, 15, 16, 17, 31, 32, 33, 47, 63, 64, 65, 95, 127, 1000, 4099]


def _values(n, dtype, seed):
    """n values of ``dtype`` (as that dtype): a third from a wide random range, a third on a coarse grid (sums,
    products and quotients of them often fall exactly halfway between two values: ties), a third small
    (subnormal and underflowing results), with zeros of both signs, the largest value, infinities and NaN."""
    g = torch.Generator().manual_seed(seed)
    wide = torch.randn(n, generator=g) * torch.exp2(torch.randint(-14, 9, (n,), generator=g).float())
    grid = torch.randint(-64, 65, (n,), generator=g).float() * torch.exp2(
        torch.randint(-6, 3, (n,), generator=g).float()
    )
    small = torch.randn(n, generator=g) * 2.0**-14
    pick = torch.randint(0, 3, (n,), generator=g)
    x = torch.where(pick == 0, wide, torch.where(pick == 1, grid, small))
    special = torch.tensor([0.0, -0.0, torch.finfo(dtype).max, float("inf"), -float("inf"), float("nan")])
    k = min(n // 7, len(special))
    if k:
        x[torch.randperm(n, generator=g)[:k]] = special[:k]
    return x.to(dtype)


def _same_bits(a, b):
    """Equal values of equal dtype class, signed zeros and NaNs included (a float32 sim vs a real 16-bit run)."""
    if a.dtype == torch.bool or b.dtype == torch.bool:
        return a.dtype == b.dtype and torch.equal(a, b)
    a, b = a.float(), b.float()
    same = ((a == b) & (torch.signbit(a) == torch.signbit(b))) | (a.isnan() & b.isnan())
    return a.shape == b.shape and bool(same.all())


# op(x, y, z) on tensors of one dtype; Python scalars chosen where the kernels treat them differently
ELEMENTWISE = {
    "x + s": lambda x, y, z: x + 0.1,
    "x - s": lambda x, y, z: x - 1e-3,
    "s - x": lambda x, y, z: 0.7 - x,
    "add alpha": lambda x, y, z: torch.add(x, y, alpha=0.3),
    "sub alpha": lambda x, y, z: torch.sub(x, y, alpha=0.37),
    "add_ alpha (SGD)": lambda x, y, z: x.clone().add_(y, alpha=-0.01),
    "add_ eps (Adam)": lambda x, y, z: x.abs().sqrt().add_(1e-8),
    "x + y": lambda x, y, z: x + y,
    "x * s": lambda x, y, z: x * 0.1,
    "x / s": lambda x, y, z: x / 0.3,
    "x * y + z": lambda x, y, z: x * y + z,
    "x / y": lambda x, y, z: x / y,
    "addcmul": lambda x, y, z: torch.addcmul(x, y, z, value=0.001),
    "addcdiv": lambda x, y, z: torch.addcdiv(x, y, z, value=-0.01),
    "lerp scalar": lambda x, y, z: torch.lerp(x, y, 0.1),
    "lerp tensor": lambda x, y, z: torch.lerp(x, y, z.abs().clamp(max=1)),
    "x > s": lambda x, y, z: x > 0.1,
    "x >= s": lambda x, y, z: x >= 0.1,
    "clamp": lambda x, y, z: x.clamp(min=-0.1, max=0.3),
    "maximum": lambda x, y, z: torch.maximum(x, y),
    "where": lambda x, y, z: torch.where(x > y, x, 0.1),
    "x ** 2": lambda x, y, z: x.pow(2),
    "x ** 1.7": lambda x, y, z: x.abs().pow(1.7),
    "sqrt": lambda x, y, z: x.abs().sqrt(),
    "rsqrt": lambda x, y, z: x.abs().rsqrt(),
    "exp": lambda x, y, z: (x / 64).exp(),
    "log": lambda x, y, z: x.abs().log(),
    "tanh": lambda x, y, z: x.tanh(),
    "sigmoid": lambda x, y, z: x.sigmoid(),
    "gelu": lambda x, y, z: nn.functional.gelu(x),
    "silu": lambda x, y, z: nn.functional.silu(x),
    "abs": lambda x, y, z: x.abs(),
}
REDUCTIONS = {
    "sum": lambda x: x.sum(),
    "mean": lambda x: x.mean(),
    "norm": lambda x: x.norm(),
    "softmax": lambda x: torch.softmax(x, 0),
    "log_softmax": lambda x: torch.log_softmax(x, 0),
    "cumsum": lambda x: x.cumsum(0),
}


def _clean(x):
    """Finite values only (reductions over inf/NaN are inf/NaN both ways and test nothing)."""
    return torch.where(x.isfinite(), x, torch.zeros_like(x)).clamp(-8, 8)


@pytest.mark.parametrize("fmt", ["FP16", "BF16"])
def test_elementwise_ops_match_the_real_kernels_bit_for_bit(fmt):
    """Mode "all" returns what the float16/bfloat16 kernel returns, on its vectorised path and on the tail of its
    loops (every size in SIZES), for contiguous and transposed (strided) tensors, ties and specials included."""
    dtype = REAL[fmt]
    for name, op in ELEMENTWISE.items():
        for n in SIZES:
            x, y, z = (_values(n, dtype, 3 * n + k) for k in range(3))
            with simulate(fmt, mode="all") as sim:
                got = op(x.float(), y.float(), z.float())
            assert sim.no_native_kernel == set() and sim.ops_rounded > 0
            assert _same_bits(got, op(x, y, z)), (fmt, name, n)
        x, y, z = (_values(33 * 17, dtype, k).reshape(33, 17).t() for k in range(3))  # strided
        with simulate(fmt, mode="all"):
            got = op(x.float(), y.float(), z.float())
        assert _same_bits(got, op(x, y, z)), (fmt, name, "transposed")
    for name, op in REDUCTIONS.items():
        for n in SIZES:
            x = _clean(_values(n, dtype, n).float()).to(dtype)
            with simulate(fmt, mode="all"):
                got = op(x.float())
            assert _same_bits(got, op(x)), (fmt, name, n)


@pytest.mark.parametrize("fmt", ["FP16", "BF16"])
def test_the_float32_model_of_the_kernels_would_fail_this_test(fmt):
    """The check above can fail: computing in float32 with the scalar at float32 precision and rounding once
    (what simulate did before it called the real kernels) differs from the real kernel on many values."""
    dtype = REAL[fmt]
    x, y = _values(4099, dtype, 1), _values(4099, dtype, 2)
    for name in ("x + s", "s - x", "add alpha", "add_ alpha (SGD)", "x ** 1.7"):
        op = ELEMENTWISE[name]
        real = op(x, y, None).float()
        model = round_to(op(x.float(), y.float(), None), fmt)
        share = (~((real == model) | (real.isnan() & model.isnan()))).float().mean().item()
        assert share > 0.02, (fmt, name, share)


def test_many_threads_and_a_split_loop_match_too():
    """Above 32768 elements a kernel's loop is split between threads, each piece with its own tail."""
    n = 2**16 + 5
    x, y = _values(n, torch.float16, 5), _values(n, torch.float16, 6)
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        for op in (ELEMENTWISE["add alpha"], ELEMENTWISE["x + s"], ELEMENTWISE["addcdiv"]):
            with simulate("FP16", mode="all"):
                got = op(x.float(), y.float(), y.float())
            assert _same_bits(got, op(x, y, y))
    finally:
        torch.set_num_threads(threads)


def test_the_kernel_facts_the_docstring_states():
    """What the module docstring says the float16 CPU kernels do with Python scalars (torch 2.13)."""
    h = FP16.name
    x = _values(4099, torch.float16, 7)
    xf = x.float()

    def r(t):
        return round_to(t, h)

    s16 = round_to(0.1, h)
    assert _same_bits(x + 0.1, r(xf + s16)) and _same_bits(0.7 - x, r(round_to(0.7, h) - xf))  # s rounded first
    assert _same_bits(x * 0.1, r(xf * torch.tensor(0.1)))  # mul: the scalar at float32
    assert _same_bits(x.abs().pow(1.7), r(xf.abs().pow(round_to(1.7, h))))  # pow: the exponent rounded
    one_tenth = torch.tensor([0.1]).half()
    assert bool(one_tenth >= 0.1) and not bool(one_tenth.float() >= 0.1)  # comparison with FP16(0.1)
    assert round_to(1e-8, h) == 0.0  # Adam's eps is 0 in FP16
    cap = torch.backends.cpu.get_cpu_capability()
    if cap not in ("AVX2", "AVX512", "DEFAULT"):
        pytest.skip(f"the vectorised/tail split of ATen's {cap} kernels was not measured")
    y = _values(4099, torch.float16, 8)
    a = round_to(-0.01, h)
    got = torch.add(x, y, alpha=-0.01).float()
    # AVX2 (16 float16 per vector) and AVX512 (32): two vectors per loop step, 4096 values vectorised, 3 in the
    # tail; DEFAULT (ATEN_CPU_CAPABILITY=default): no vectorised loop, every value takes the scalar path
    body = 0 if cap == "DEFAULT" else 4099 // 64 * 64
    vectorised = r(xf + y.float() * a)  # a·y + x in float32
    tail = r(xf + r(y.float() * a))  # a·y rounded, then the sum
    assert _same_bits(got[:body], vectorised[:body]) and _same_bits(got[body:], tail[body:])
    assert not _same_bits(vectorised, tail)


def _tiny(seed=0):
    """8 inputs per dot product (and 8 per gradient sum over the batch): the float32 accumulation of the
    simulated Linear layers agrees with the float16 kernels' here (test_lower_precision_ops_... measures it)."""
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 5))


OPTIMIZERS = {
    "SGD": lambda p: torch.optim.SGD(p, lr=0.05),
    "SGD momentum weight decay": lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9, weight_decay=1e-3, nesterov=True),
    "Adam": lambda p: torch.optim.Adam(p, lr=1e-3),
    "Adam eps 1e-4": lambda p: torch.optim.Adam(p, lr=1e-3, eps=1e-4),
    "AdamW": lambda p: torch.optim.AdamW(p, lr=1e-3, eps=1e-4, weight_decay=0.1),
}


def _train_side_by_side(fmt, make_opt, steps, *, start_step=None, seed=0):
    """A .half()/.bfloat16() model and its simulation (mode "all", the update inside the block), step by step;
    yields (real model, real optimizer, simulated model, simulated optimizer, real loss, simulated loss)."""
    dtype = REAL[fmt]
    model = _tiny(seed)
    g = torch.Generator().manual_seed(seed + 1)
    X, Y = torch.randn(steps, 8, 8, generator=g), torch.randint(0, 5, (steps, 8), generator=g)
    real = copy.deepcopy(model).to(dtype)
    sim = round_parameters_(copy.deepcopy(model), fmt)
    o_real, o_sim = make_opt(real.parameters()), make_opt(sim.parameters())
    for i in range(steps):
        o_real.zero_grad()
        loss_real = nn.functional.cross_entropy(real(X[i].to(dtype)), Y[i])
        loss_real.backward()
        o_sim.zero_grad()
        with simulate(fmt, mode="all") as block:
            loss_sim = nn.functional.cross_entropy(sim(X[i]), Y[i])
            loss_sim.backward()
        if i == 1 and start_step is not None:  # as if resumed late in a run: a step count beyond fmt's integers
            for o in (o_real, o_sim):
                for group in o.param_groups:
                    for p in group["params"]:
                        o.state[p]["step"] = torch.tensor(float(start_step))
        o_real.step()
        with block:
            o_sim.step()
        assert block.no_native_kernel == set()
        yield real, o_real, sim, o_sim, loss_real, loss_sim


@pytest.mark.parametrize("fmt", ["FP16", "BF16"])
@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_training_steps_match_a_half_model_bit_for_bit(fmt, name):
    """Losses, weights, gradients and optimizer states of 6 steps, bit for bit: SGD's p.add_(grad,
    alpha=-lr), Adam's eps and the rest as the real float16/bfloat16 kernels compute them."""
    nonfinite = False
    for real, o_real, sim, o_sim, loss_real, loss_sim in _train_side_by_side(fmt, OPTIMIZERS[name], 6):
        assert _same_bits(loss_sim, loss_real)
        for p, q in zip(real.parameters(), sim.parameters()):
            assert _same_bits(q, p) and _same_bits(q.grad, p.grad)
            for key, value in o_real.state[p].items():
                assert _same_bits(o_sim.state[q][key], value), key
            nonfinite |= not bool(p.isfinite().all())
    # FP16(1e-8) = 0: a real FP16 Adam with the default eps gives some weights an infinite update (and the
    # simulation the same ones); with eps = 1e-4, or in BF16 (whose range holds 1e-8), every weight stays finite
    assert nonfinite == (fmt == "FP16" and name == "Adam")


@pytest.mark.parametrize("fmt", ["FP16", "BF16"])
def test_adam_step_count_stays_float32(fmt):
    """Adam's step count is a 0-dim float32 tensor beside a .half() model: it keeps counting past 2048 (FP16)
    and 256 (BF16), the last integers those formats hold, and its bias corrections with it."""
    make = OPTIMIZERS["Adam eps 1e-4"]
    for real, o_real, sim, o_sim, loss_real, loss_sim in _train_side_by_side(fmt, make, 3, start_step=4097):
        for p, q in zip(real.parameters(), sim.parameters()):
            assert _same_bits(q, p)
            assert o_sim.state[q]["step"].dtype == torch.float32
            assert o_sim.state[q]["step"].item() == o_real.state[p]["step"].item()
    assert o_sim.state[q]["step"].item() == 4099.0


def test_zero_dim_float32_tensors_stay_float32_as_beside_a_half_model():
    x = _values(100, torch.float16, 9)
    t, scale = torch.tensor(0.1), torch.tensor(1000.3)
    with simulate("FP16", mode="all"):
        scaled = x.float().sum() * scale  # a 0-dim FP16 loss times a float32 scale: float32
        prod = x.float() * t  # mul takes the 0-dim float32 tensor at float32 precision
    real_scaled = x.sum() * scale
    assert real_scaled.dtype == torch.float32 and _same_bits(scaled, real_scaled)
    assert scaled.item() != round_to(scaled.item(), FP16)
    assert _same_bits(prod, x * t)


@pytest.mark.parametrize("fmt", ["FP16", "BF16"])
def test_norm_embedding_and_groupnorm_training_match_bit_for_bit(fmt):
    """Layer norm (its saved statistics are float32 in a real run), group norm, an embedding (its backward
    sums gradients in the real dtype), GELU and a mean: 3 SGD steps, bit for bit."""

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb, self.ln, self.gn, self.out = (
                nn.Embedding(50, 8),
                nn.LayerNorm(8),
                nn.GroupNorm(2, 8),
                nn.Linear(8, 5),
            )

        def forward(self, i):
            h = self.gn(self.ln(self.emb(i)).transpose(1, 2)).transpose(1, 2)
            return self.out(nn.functional.gelu(h)).mean(1)

    torch.manual_seed(0)
    model, idx, y = Net(), torch.randint(0, 50, (4, 6)), torch.randint(0, 5, (4,))
    real, sim = copy.deepcopy(model).to(REAL[fmt]), round_parameters_(copy.deepcopy(model), fmt)
    o_real, o_sim = torch.optim.SGD(real.parameters(), lr=0.1), torch.optim.SGD(sim.parameters(), lr=0.1)
    for _ in range(3):
        o_real.zero_grad()
        nn.functional.cross_entropy(real(idx), y).backward()
        o_real.step()
        o_sim.zero_grad()
        with simulate(fmt, mode="all"):
            nn.functional.cross_entropy(sim(idx), y).backward()
            o_sim.step()
        assert all(_same_bits(q, p) for p, q in zip(real.parameters(), sim.parameters()))


def test_lstm_matches_a_half_lstm_with_onednn_off():
    """The module docstring's recipe: without oneDNN's fused RNN layer the float32 LSTM runs the cell as
    separate ops, as a .half() LSTM on a CPU does, and the simulation matches it bit for bit."""
    import warnings

    torch.manual_seed(0)
    lstm, head = nn.LSTM(8, 8, batch_first=True), nn.Linear(8, 5)
    model = nn.ModuleDict({"lstm": lstm, "head": head})
    x, y = torch.randn(4, 5, 8), torch.randint(0, 5, (4,))

    def loss(m, inp):
        return nn.functional.cross_entropy(m["head"](m["lstm"](inp)[0][:, -1]), y)

    real, sim = copy.deepcopy(model).half(), round_parameters_(copy.deepcopy(model), FP16)
    o_real, o_sim = torch.optim.SGD(real.parameters(), lr=0.1), torch.optim.SGD(sim.parameters(), lr=0.1)
    for _ in range(3):
        o_real.zero_grad()
        loss(real, x.half()).backward()
        o_real.step()
        o_sim.zero_grad()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # oneDNN's flags warn about TF32 on Intel GPUs
            with torch.backends.mkldnn.flags(enabled=False), simulate("FP16", mode="all"):
                loss(sim, x).backward()
                o_sim.step()
        assert all(_same_bits(q, p) for p, q in zip(real.parameters(), sim.parameters()))


def test_lower_precision_ops_differ_where_the_docstring_says():
    """Linear layers (a lower-precision op: float32, rounded once) against float16 ``F.linear`` on this CPU, 8 to
    4096 products per dot product: the real kernel is an FP32 accumulation in its own order, rounded once (the
    derived tolerance of _assert_fp32_accumulation_rounded_once), so simulate differs from it by one ulp, and
    only where the exact sum lies within FP32's error bound of an FP16 rounding midpoint; with hundreds of
    products some values do differ (the docstring's "now and then")."""
    g = torch.Generator().manual_seed(0)
    differ = 0
    for b, i, o in ((8, 8, 16), (32, 20, 10), (64, 100, 50), (16, 256, 64), (128, 784, 128), (64, 4096, 64)):
        x = torch.randn(b, i, generator=g).half()
        w = (torch.randn(o, i, generator=g) / i**0.5).half()
        real = nn.functional.linear(x, w)
        with simulate("FP16", mode="all"):
            got = nn.functional.linear(x.float(), w.float())
        exact, abs_sum = x.double() @ w.double().t(), x.double().abs() @ w.double().abs().t()
        _assert_fp32_accumulation_rounded_once(real, exact, abs_sum, i, ("real", b, i, o))
        _assert_fp32_accumulation_rounded_once(got, exact, abs_sum, i, ("simulate", b, i, o))
        differ += int((got != real.float()).sum())
    assert differ > 0


def test_an_op_without_a_real_kernel_runs_in_float32_and_is_recorded():
    x = torch.rand(40) + 1.5
    with pytest.raises(RuntimeError, match="Half"):
        torch.special.zeta(x.half(), x.half())  # no float16 CPU kernel
    with simulate("FP16", mode="all") as sim:
        got = torch.special.zeta(x, x)
        again = torch.special.zeta(x, 2 * x)  # remembered: no second try
    assert sim.no_native_kernel == {"special_zeta"}
    xr = round_to(x, FP16)
    assert torch.equal(got, round_to(torch.special.zeta(xr, xr), FP16)) and _is_in(again, FP16)


def test_a_value_error_of_the_real_kernel_is_raised_and_forgets_nothing():
    """Issue 29, item 8: torch.add(x, y, alpha=70000.) raises on the real float16 kernel ("cannot be converted to
    c10::Half without overflow"): simulate raises the same error (it returned ±inf), and the op keeps its real
    kernel for the rest of the process (a process-wide "no kernel" mark made x + 0.1 differ afterwards)."""
    from mpt_lab import simulate as S

    g = torch.Generator().manual_seed(29)
    x, y = torch.randn(100_003, generator=g), torch.randn(100_003, generator=g)
    with pytest.raises(RuntimeError) as real:
        torch.add(x.half(), y.half(), alpha=70000.0)
    assert "without overflow" in str(real.value)
    for mode in ("all", "autocast"):
        with simulate("FP16", mode=mode):
            xs = x * 1.0 if mode == "all" else x.half().float()  # mode "autocast": the op sees tagged inputs
            with pytest.raises(type(real.value), match="without overflow") as got:
                torch.add(round_to(x, FP16), round_to(y, FP16), alpha=70000.0) if mode == "all" else torch.add(
                    nn.functional.linear(xs[:8].reshape(1, 8), torch.eye(8)), 1.0, alpha=70000.0
                )
        assert str(got.value) == str(real.value)
    assert not {k for k in S._NO_NATIVE_KERNEL if "add" in str(k[0])}
    with simulate("FP16", mode="all") as sim:
        got = x + 0.1
    assert torch.equal(got, (x.half() + 0.1).float()), int((got != (x.half() + 0.1).float()).sum())
    assert sim.no_native_kernel == set()
    # a kernel that does not exist for the dtype still falls back (and is remembered), see the test below
    assert S._missing_kernel(NotImplementedError("\"zeta_cpu\" not implemented for 'Half'"), torch.float16)
    assert S._missing_kernel(RuntimeError("linalg.inv: Low precision dtypes not supported. Got Half"), torch.float16)
    assert not S._missing_kernel(
        RuntimeError("value cannot be converted to type c10::Half without overflow"), torch.float16
    )


def test_autocast_mode_runs_fp16_ops_on_the_real_kernel():
    """Under torch.autocast("cpu", float16), ops on a float16 result (a Linear with 8 inputs here) run in
    float16: x + s rounds s, torch.add(.., alpha) rounds alpha; the simulation matches bit for bit."""
    torch.manual_seed(0)
    lin, x = nn.Linear(8, 16), torch.randn(64, 8)
    ops = [
        lambda h: h + 0.1,
        lambda h: torch.add(h, h.tanh(), alpha=0.3),
        lambda h: (h * 0.3).sigmoid(),
        lambda h: 0.7 - h.relu(),
    ]
    for op in ops:
        with torch.autocast("cpu", dtype=torch.float16):
            want = op(lin(x))
        with simulate("FP16", mode="autocast"):
            got = op(lin(x))
        assert want.dtype == torch.float16 and _same_bits(got, want)


# ------------------------------------------------------------------------------------------------------
# (e) other formats
# ------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("fmt", [BF16, FP8_E4M3, "FP8_E5M2"])
@pytest.mark.parametrize("mode", ["all", "autocast"])
def test_other_formats_produce_representable_values(fmt, mode):
    model, x = _conv(), _inputs("conv", n=4)
    with simulate(fmt, mode=mode) as sim:
        out = model(x)
        out.float().square().mean().backward()
    assert _is_in(out, sim.fmt)
    for p in model.parameters():
        assert _is_in(p.grad, sim.fmt)


def test_backward_false_leaves_gradients_in_float32():
    model, x = _mlp(), _inputs("mlp")
    with simulate("FP16", mode="all", backward=False):
        out = model(x)
        out.square().mean().backward()
    assert _is_in(out, FP16)
    assert not all(_is_in(p.grad, FP16) for p in model.parameters())


def test_backward_outside_block_is_not_rounded():
    model, x = _mlp(), _inputs("mlp")
    with simulate("FP16", mode="all"):
        out = model(x)
    out.square().mean().backward()
    assert not all(_is_in(p.grad, FP16) for p in model.parameters())


# ------------------------------------------------------------------------------------------------------
# (f) entering, leaving, nesting, arguments
# ------------------------------------------------------------------------------------------------------
def test_exit_stops_rounding_also_after_exception():
    x = torch.full((4,), 1.0 + 2.0**-20)
    with simulate("FP16", mode="all"):
        assert torch.equal(x * 1.0, torch.ones(4))
    assert torch.equal(x * 1.0, x)
    with pytest.raises(ZeroDivisionError):
        with simulate("FP16", mode="all"):
            1 / 0
    assert torch.equal(x * 1.0, x)
    sim = simulate("BF16", "all")
    for _ in range(2):  # an instance can be re-entered
        with sim:
            assert torch.equal(x + 0.0, torch.ones(4))
    assert torch.equal(x + 0.0, x)


def test_nesting_is_refused_and_paused_works():
    x = torch.full((4,), 1.0 + 2.0**-20)
    with simulate("FP16", mode="all") as sim:
        with pytest.raises(RuntimeError, match="nesting"):
            with simulate("BF16"):
                pass
        assert torch.equal(x * 1.0, torch.ones(4))  # the outer block is still active
        with sim.paused():
            assert torch.equal(round_to(x, FP16), torch.ones(4))  # round_to's bit ops need the pause
            assert torch.equal(x * 1.0, x)
        with paused():
            assert torch.equal(x * 1.0, x)
        assert torch.equal(x * 1.0, torch.ones(4))
    with paused():  # no block: nothing to pause
        assert torch.equal(x * 1.0, x)
    with simulate("FP16"):  # a block can be entered again after the refused one
        pass


def test_in_place_ops_views_and_integers():
    x = torch.randn(8, 8) + 1e-3
    i = torch.arange(10)
    with simulate("FP16", mode="all"):
        y = x.clone()
        y.mul_(1.0001)
        v = y.view(64)[:5]
        j = i * 3
        y[0, 0] = 0.1
    assert _is_in(y, FP16) and _is_in(v, FP16)
    assert y[0, 0].item() == round_to(0.1, FP16)
    assert j.dtype == torch.int64 and torch.equal(j, torch.arange(10) * 3)
    assert v.data_ptr() == y.data_ptr()  # views stay views


def test_in_place_view_ops_change_the_tensor_itself():
    """squeeze_, t_, resize_ change a tensor's metadata: they run on it, not on a float16 copy."""
    x = torch.randn(1, 3, 4)
    with simulate("FP16", mode="all"):
        y = x * 1.0
        y.squeeze_(0)
        y.t_()
        y.add_(0.1)
    assert y.shape == (4, 3) and _is_in(y, FP16)
    assert torch.equal(y, (x.half().squeeze(0).t() + 0.1).float())


def test_round_parameters_():
    model = nn.Sequential(nn.Linear(8, 8), nn.BatchNorm1d(8))
    model[1].running_mean.add_(0.1)
    assert round_parameters_(model, "BF16") is model
    assert all(_is_in(t, BF16) for t in [*model.parameters(), model[1].running_mean])
    assert model[1].num_batches_tracked.dtype == torch.int64
    assert model[0].weight.grad is None and model[0].weight.requires_grad
    with pytest.raises(TypeError, match="model"):
        round_parameters_(torch.zeros(3))
    with pytest.raises(ValueError, match="fmt"):
        round_parameters_(model, "FP99")
    with pytest.raises(TypeError, match="buffers"):
        round_parameters_(model, buffers="yes")


@pytest.mark.parametrize(
    "kwargs, err, word",
    [
        (dict(fmt="FP17"), ValueError, "fmt"),
        (dict(fmt=16), TypeError, "fmt"),
        (dict(mode="half"), ValueError, "mode"),
        (dict(mode=None), TypeError, "mode"),
        (dict(backward="yes"), TypeError, "backward"),
        (dict(rounding="up"), ValueError, "rounding"),
    ],
)
def test_bad_arguments(kwargs, err, word):
    with pytest.raises(err, match=word):
        simulate(**kwargs)


def test_stochastic_rounding_option():
    x = torch.full((10_000,), 1.0 + 2.0**-12)  # a quarter of FP16's ulp above 1
    with simulate("FP16", mode="all", rounding="stochastic"):
        y = x * 1.0
    assert _is_in(y, FP16)
    assert 0.15 < (y > 1).float().mean().item() < 0.35


def test_formats_and_histograms_are_exact_inside_a_block():
    from mpt_lab.formats import encode, round_to
    from mpt_lab.histogram import GradientHistogram, log2_histogram

    x = torch.randn(2000) * 1e-3
    want_r, want_c, want_h = round_to(x, "bf16"), encode(x, "e4m3"), log2_histogram(x)
    with simulate("FP16", mode="all"):
        assert torch.equal(round_to(x, "bf16"), want_r)
        assert torch.equal(encode(x, "e4m3"), want_c)
        assert log2_histogram(x) == want_h
    # a GradientHistogram records the simulated FP16 gradients themselves
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    with GradientHistogram(model, "weight") as gh, simulate("FP16", mode="all"):
        (model(torch.randn(4, 8)).sum() * 2.0**-20).backward()
    grads = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
    assert gh.histogram == log2_histogram(grads) and torch.equal(round_to(grads, "FP16"), grads)


def test_exact_arithmetic_passes_ops_through_unrounded_and_untagged():
    from mpt_lab.formats import exact_arithmetic

    x = torch.full((4,), 1.0 + 2.0**-20)
    a, b = torch.randn(8, 8), torch.randn(8, 8)
    ref = a @ b
    with simulate("FP16", mode="autocast") as sim:
        with exact_arithmetic():
            assert torch.equal(x * 1.0, x)  # not rounded
            p = a @ b  # a lower-precision op, run exactly
        assert sim.ops_rounded == 0
        # p is not marked as an FP16 result: an op on it alone stays float32, as for any float32 tensor
        r = torch.relu(p)
        assert sim.ops_rounded == 0
        q = torch.relu(a @ b)  # outside the marker: mm and relu are rounded
        assert sim.ops_rounded == 2

    @exact_arithmetic
    def exact_sum(t):
        return t + 2.0**-20

    with simulate("FP16", mode="all"):
        s = exact_sum(torch.ones(4))
        t = torch.ones(4) + 2.0**-20  # rounded again after it
    assert torch.equal(p, ref) and torch.equal(r, torch.relu(ref)) and not torch.equal(q, torch.relu(ref))
    assert torch.equal(s, x) and torch.equal(t, torch.ones(4))
    with exact_arithmetic():  # and no block at all: nothing changes
        assert torch.equal(x * 1.0, x)


def test_paused_needs_the_active_block():
    sim = simulate("FP16", mode="all")
    with pytest.raises(RuntimeError, match="active"):
        with sim.paused():
            pass
    with simulate("BF16", mode="all"):
        with pytest.raises(RuntimeError, match="active"):
            with sim.paused():
                pass


def _private_torch_uses(source: str) -> list:
    """Imports of private torch modules/names and ``torch._x`` attribute chains in Python source."""
    import ast

    def private(parts):
        return any(p.startswith("_") and not (p.startswith("__") and p.endswith("__")) for p in parts)

    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "torch":
            if private(node.module.split(".")) or private([a.name for a in node.names]):
                found.append((node.lineno, node.module))
        elif isinstance(node, ast.Import):
            found += [
                (node.lineno, a.name)
                for a in node.names
                if a.name.split(".")[0] == "torch" and private(a.name.split("."))
            ]
        elif isinstance(node, ast.Attribute):
            parts, n = [], node
            while isinstance(n, ast.Attribute):
                parts.append(n.attr)
                n = n.value
            if isinstance(n, ast.Name) and n.id == "torch" and private(parts):
                found.append((node.lineno, "torch." + ".".join(reversed(parts))))
    return found


def test_private_torch_apis_only_in_torch_internals():
    """mpt_lab imports torch's private modules and functions in one place (mpt_lab._torch_internals)."""
    from pathlib import Path

    import mpt_lab
    from mpt_lab import _torch_internals as TI

    assert _private_torch_uses("import torch\nfrom torch.utils._pytree import x\ntorch._C._f()\ntorch.__version__") == [
        (2, "torch.utils._pytree"),
        (3, "torch._C._f"),
        (3, "torch._C"),
    ]
    root = Path(mpt_lab.__file__).parent
    offenders = {}
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if rel != "_torch_internals.py":
            found = _private_torch_uses(path.read_text())
            if found:
                offenders[rel] = found
    assert not offenders, offenders
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.utils._python_dispatch import TorchDispatchMode

    assert TI.FakeTensorMode is FakeTensorMode and TI.TorchDispatchMode is TorchDispatchMode
    assert issubclass(simulate, TI.TorchDispatchMode)
    assert TI.current_autograd_node() is None
    for name in TI.__all__:
        assert f"``{name}``" in TI.__doc__, name  # every name is documented
