"""mpt_lab.report: planted faults whose answers the tests compute on their own (torch's float16 casts, real CPU
autocast, their own hooks), side-effect freedom, awkward models, bad input."""

import copy
import json
import math
import random
import subprocess
import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as Fn
from torch import nn

from mpt_lab.histogram import log2_histogram
from mpt_lab.report import PrecisionReport, precision_report
from mpt_lab.simulate import simulate

FP16_MAX = 65504.0


# ------------------------------------------------------------------------------------------------ helpers
class Scale(nn.Module):
    """Multiplies its input by a constant (a planted overflow when the constant is large)."""

    def __init__(self, c: float):
        super().__init__()
        self.c = c

    def forward(self, x):
        return x * self.c


class _GradAmp(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, c):
        ctx.c = c
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        return g * ctx.c, None


class GradAmp(nn.Module):
    """Identity in forward; multiplies the gradient by ``c`` in backward (a planted backward overflow)."""

    def __init__(self, c: float):
        super().__init__()
        self.c = c

    def forward(self, x):
        return _GradAmp.apply(x, self.c)


def ce(model, batch):
    x, y = batch
    return Fn.cross_entropy(model(x), y)


def data(n=16, d=8, classes=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, d, generator=g), torch.randint(0, classes, (n,), generator=g)


def largest_pow2_scale(amax: float, limit: float) -> float:
    """The largest power of two S with amax · S ≤ limit, by exact doubling/halving (no log2)."""
    s = 1.0
    while amax * s > limit:
        s /= 2
    while amax * (s * 2) <= limit:
        s *= 2
    return s


def oracle_hooks(model):
    """The test's own recording: forward outputs per module in completion order, and each distinct output
    tensor's gradient (tensor hooks), in the order backward produces them."""
    fwd, grads, handles, seen = [], [], [], set()

    def hook(name):
        def h(mod, inp, out):
            outs = out if isinstance(out, (tuple, list)) else [out]
            for t in outs:
                if isinstance(t, torch.Tensor) and t.is_floating_point():
                    fwd.append((name, t.detach().clone()))
                    if t.requires_grad and id(t) not in seen:
                        seen.add(id(t))
                        t.register_hook(lambda g, name=name: grads.append((name, g.detach().clone())))

        return h

    for name, m in model.named_modules():
        handles.append(m.register_forward_hook(hook(name)))
    return fwd, grads, handles


def mlp_with_overflow():
    torch.manual_seed(1)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 16), Scale(3e5), nn.Linear(16, 4))


# -------------------------------------------------------------------------------------------- planted faults
def test_first_overflowing_module_matches_float16_casts():
    model = mlp_with_overflow()
    batch = data()
    r = precision_report(model, ce, batch, formats=("FP16", "BF16"))
    # oracle: cast each module's FP32 output to float16 and look for inf, in completion order
    fwd, _, handles = oracle_hooks(model)
    with torch.no_grad():
        ce(model, batch)
    for h in handles:
        h.remove()
    expected = []
    for name, t in fwd:
        if bool(torch.isinf(t.half()).any()) and name not in expected:
            expected.append(name)
    assert expected and expected[0] == "3"  # the planted Scale
    assert r.forward_overflows("FP16") == expected
    assert r.forward_overflows("BF16") == []
    # the origin is the Scale (its input fits FP16, its output does not); the Linear after it only inherits the
    # overflow, the Sequential contains the origin; the advice names the origin alone, and offers no loss scale
    x = batch[0]
    with torch.no_grad():
        into3 = model[2](model[1](model[0](x)))
    assert float(into3.abs().max()) < FP16_MAX < float(model[3](into3).abs().max())
    assert r.overflow_roles("FP16") == {"3": "origin", "4": "inherited", "": "contains origin"}
    assert r.forward_overflows("FP16", "origins") == ["3"] and r.forward_overflows("FP16", "inherited") == ["4"]
    rec = r.recommendation("FP16")
    assert rec.startswith("keep 3 in FP32") and "keep 3, 4" not in rec and "loss scale in" not in rec
    assert "1 module(s) after it only inherit" in rec and "autocast" in rec
    assert r.verdict("FP16") == "keep modules in FP32" and r.verdict("BF16") == "trains as is"


def test_first_nonfinite_forward_matches_real_autocast():
    model = mlp_with_overflow()
    batch = data()
    r = precision_report(model, ce, batch, formats=("FP16",))
    twin = copy.deepcopy(model)
    fwd, _, handles = oracle_hooks(twin)
    with torch.autocast("cpu", dtype=torch.float16):
        loss = ce(twin, batch)
    for h in handles:
        h.remove()
    first = next(name for name, t in fwd if not bool(torch.isfinite(t).all()))
    loc = r.first_nonfinite("FP16")
    assert loc == (first, "forward") == ("3", "forward")
    assert (loc.op, loc.function, loc.origin) == ("mul", "Tensor.mul", True)  # Scale's x * c, op by op
    assert [(o["module"], o["op"], o["pass"]) for o in r.origins("FP16")] == [("3", "mul", "forward")]
    assert not math.isfinite(r.runs["FP16"].loss) and not math.isfinite(float(loss.detach()))
    assert r.dynamic_scaler("FP16")["skipped"] is None  # no loss scale cures a forward overflow


def test_first_nonfinite_backward_matches_real_autocast():
    torch.manual_seed(2)
    model = nn.Sequential(nn.Linear(8, 16), GradAmp(2.0**40), nn.Linear(16, 4))
    batch = data()
    r = precision_report(model, ce, batch, formats=("FP16", "BF16"))
    twin = copy.deepcopy(model)
    fwd, grads, handles = oracle_hooks(twin)
    with torch.autocast("cpu", dtype=torch.float16):
        loss = ce(twin, batch)
    loss.backward()
    for h in handles:
        h.remove()
    assert all(bool(torch.isfinite(t).all()) for _, t in fwd)  # the forward pass stays finite
    first = next(name for name, g in grads if not bool(torch.isfinite(g).all()))
    assert first == "0"  # the gradient of the amplifier's input (module 0's output) is the first inf,
    amp_out = next(g for name, g in grads if name == "1")
    assert bool(torch.isfinite(amp_out).all())  # that of its output is finite: the amplifier's
    loc = r.first_nonfinite("FP16")  # backward makes it
    assert loc == ("1", "backward") and loc.op == "mul" and loc.node == "_GradAmpBackward" and loc.origin
    assert r.inherited("FP16") == [("0", "backward")]
    assert r.first_nonfinite("BF16") is None
    assert r.forward_overflows("FP16") == []
    assert "0.weight" in r.runs["FP16"].nonfinite_parameter_gradients


def all_gradients(model, loss_fn, batch):
    """Every distinct module output's gradient and every parameter gradient of one FP32 step (own hooks)."""
    twin = copy.deepcopy(model)
    _, grads, handles = oracle_hooks(twin)
    loss_fn(twin, batch).backward()
    for h in handles:
        h.remove()
    return [g for _, g in grads] + [p.grad for p in twin.parameters() if p.grad is not None]


@pytest.mark.parametrize("loss_factor", [1.0, 2.0**-20])
def test_loss_scale_window_against_own_gradients(loss_factor):
    torch.manual_seed(3)
    model = nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 4))
    batch = data(64)

    def loss_fn(m, b):  # a loss so small that FP16 gradients underflow (the planted fault) when loss_factor ≪ 1
        return ce(m, b) * loss_factor

    r = precision_report(model, loss_fn, batch, formats=("FP16", "FP8_E5M2"))
    grads = all_gradients(model, loss_fn, batch)
    amax = max(float(g.abs().max()) for g in grads)
    low, high = r.loss_scale_window("FP16")
    assert high == largest_pow2_scale(amax, FP16_MAX)
    assert r.loss_scale_window("FP8_E5M2")[1] == largest_pow2_scale(amax, 57344.0)
    bf16 = precision_report(model, loss_fn, batch, formats=("BF16",)).loss_scale_window("BF16")[1]
    assert bf16 == min(largest_pow2_scale(amax, float(torch.finfo(torch.bfloat16).max)), 2.0**127)
    assert bf16 <= 2.0**127 and math.isfinite(float(torch.tensor(bf16, dtype=torch.float32)))  # a float32 scale
    flat = torch.cat([g.reshape(-1) for g in grads]).double()
    nz = flat[flat != 0]

    def kept(s):
        return float(((nz * s).to(torch.float16) != 0).double().mean())

    assert kept(low) >= 0.999 > kept(low / 2)
    if loss_factor < 1:
        assert low > 1.0 and low <= high  # a loss scale is needed, and one exists
        assert r.recommendation("FP16").startswith(f"needs a loss scale in [2^{int(math.log2(low))}, ")
        assert r.verdict("FP16") == "needs a loss scale"
        sc = r.dynamic_scaler("FP16")
        assert sc["skipped"] == max(0, 16 - int(math.log2(high)))
    assert r.first_nonfinite("FP16") is None


def test_dynamic_scaler_skips_until_the_largest_gradient_fits():
    torch.manual_seed(4)
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 4))
    batch = data()
    r = precision_report(model, lambda m, b: ce(m, b) * 2.0**8, batch, formats=("FP16",))
    amax = max(float(g.abs().max()) for g in all_gradients(model, lambda m, b: ce(m, b) * 2.0**8, batch))
    s = 2.0**16
    skipped = 0
    while not bool(torch.isfinite(torch.tensor(amax * s, dtype=torch.float64).to(torch.float16))):
        s /= 2
        skipped += 1
    assert skipped > 0
    sc = r.dynamic_scaler("FP16")
    assert (sc["skipped"], sc["scale"]) == (skipped, s)


# ------------------------------------------------------------------------------------------ side effects
class WithState(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(8, 16)
        self.bn = nn.BatchNorm1d(16)
        self.drop = nn.Dropout(0.3)
        self.b = nn.Linear(16, 4)
        self.frozen_in_eval = nn.Dropout(0.5)

    def forward(self, x):
        return self.b(self.frozen_in_eval(self.drop(torch.relu(self.bn(self.a(x))))))


def hook_counts(model):
    out = []
    for m in model.modules():
        out.append(
            tuple(
                len(getattr(m, a))
                for a in ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks")
            )
        )
    for p in model.parameters():
        out.append(len(p._backward_hooks) if p._backward_hooks else 0)
    return out


def test_no_side_effects():
    torch.manual_seed(5)
    model = WithState()
    model.frozen_in_eval.eval()
    user_hook = model.a.register_forward_hook(lambda *a: None)
    batch = data()
    ce(model, batch).backward()  # existing gradients the report must not touch
    model.b.bias.grad = None
    params = {
        n: (p, p.detach().clone(), p.grad, None if p.grad is None else p.grad.clone())
        for n, p in model.named_parameters()
    }
    buffers = {n: b.detach().clone() for n, b in model.named_buffers()}
    modes = [m.training for m in model.modules()]
    hooks = hook_counts(model)
    opt = torch.optim.Adam(model.parameters())
    opt_state = copy.deepcopy(opt.state_dict())
    random.seed(7)
    np.random.seed(7)
    torch_rng, py_rng, np_rng = torch.get_rng_state(), random.getstate(), np.random.get_state()

    r = precision_report(model, ce, batch, optimizer=opt)
    assert isinstance(r, PrecisionReport)

    assert torch.equal(torch.get_rng_state(), torch_rng) and random.getstate() == py_rng
    assert all(
        np.array_equal(a, b) if isinstance(a, np.ndarray) else a == b for a, b in zip(np.random.get_state(), np_rng)
    )
    for n, p in model.named_parameters():
        q, value, grad, grad_value = params[n]
        assert p is q and torch.equal(p.detach(), value) and p.detach().view(torch.int32).equal(value.view(torch.int32))
        assert p.grad is grad and (grad is None or torch.equal(p.grad, grad_value))
    for n, b in model.named_buffers():
        assert torch.equal(b, buffers[n]), n
    assert [m.training for m in model.modules()] == modes
    assert hook_counts(model) == hooks and model.a._forward_hooks  # the user's hook is still there
    assert json.dumps(opt.state_dict(), default=str) == json.dumps(opt_state, default=str)
    user_hook.remove()
    # and every step of the report drew the same dropout masks: FP32 and BF16 losses agree closely
    assert abs(r.runs["BF16"].loss - r.loss) < 0.05 * abs(r.loss)


def test_state_restored_when_the_model_rejects_the_batch():
    torch.manual_seed(6)
    model = WithState()
    params = [p.detach().clone() for p in model.parameters()]
    buffers = [b.detach().clone() for b in model.buffers()]
    x = torch.randn(16, 5)  # the model wants 8 features
    rng = torch.get_rng_state()
    hooks = hook_counts(model)
    with pytest.raises(RuntimeError, match="mat1 and mat2 shapes cannot be multiplied") as info:
        precision_report(model, ce, (x, torch.zeros(16, dtype=torch.long)))
    assert any("precision_report" in n and "FP32 step" in n for n in getattr(info.value, "__notes__", []))
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), params))
    assert all(torch.equal(b, c) for b, c in zip(model.buffers(), buffers))
    assert all(p.grad is None for p in model.parameters())
    assert torch.equal(torch.get_rng_state(), rng) and hook_counts(model) == hooks


# ------------------------------------------------------------------------------------------ awkward models
class Tied(nn.Module):
    def __init__(self, vocab=11, d=8):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.mid = nn.Linear(d, d)
        self.head = nn.Linear(d, vocab, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, ids):
        h = self.mid(self.emb(ids))
        h = self.mid(torch.tanh(h))  # the same module called twice
        return self.head(h)


def test_tied_weights_and_modules_called_twice():
    torch.manual_seed(7)
    model = Tied()
    ids = torch.randint(0, 11, (4, 6))
    batch = (ids, torch.randint(0, 11, (4 * 6,)))

    def loss_fn(m, b):
        return Fn.cross_entropy(m(b[0]).reshape(-1, 11), b[1])

    r = precision_report(model, loss_fn, batch, formats=("FP16",))
    names = [p.name for p in r.parameters]
    assert names.count("emb.weight") == 1 and "head.weight" not in names
    tied = next(p for p in r.parameters if p.name == "emb.weight")
    assert tied.aliases == ["head.weight"]
    twin = copy.deepcopy(model)
    loss_fn(twin, batch).backward()  # the tied weight's gradient sums both uses
    assert tied.gradient == log2_histogram(twin.emb.weight.grad)
    mid = next(m for m in r.modules if m.name == "mid")
    assert mid.calls == 2
    assert mid.activation.total == 2 * 4 * 6 * 8 and mid.activation_gradient.total == 2 * 4 * 6 * 8
    # the recorded outputs of both calls, exactly
    with torch.no_grad():
        h1 = twin.mid(twin.emb(ids))
        h2 = twin.mid(torch.tanh(h1))
    assert mid.activation == log2_histogram([h1, h2])
    order = [m.name for m in r.modules]
    assert order.index("emb") < order.index("mid") < order.index("head")


def test_in_place_ops_record_the_value_each_module_returned():
    torch.manual_seed(8)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(inplace=True), nn.Linear(16, 4))
    batch = data()
    r = precision_report(model, ce, batch, formats=("FP16",))
    x, y = batch
    pre = model[0](x).detach().requires_grad_()
    post = torch.relu(pre)
    loss = Fn.cross_entropy(model[2](post), y)
    g_pre, g_post = torch.autograd.grad(loss, [pre, post])
    lin, relu = r.modules[0], r.modules[1]
    assert (lin.name, relu.name) == ("0", "1")
    assert lin.activation == log2_histogram(pre) and relu.activation == log2_histogram(post)
    assert lin.activation_gradient == log2_histogram(g_pre)  # zeros where the ReLU cut
    assert relu.activation_gradient == log2_histogram(g_post)
    assert lin.activation_gradient.zeros == int((pre <= 0).sum())


def test_frozen_parameters():
    torch.manual_seed(9)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    for p in model[0].parameters():
        p.requires_grad_(False)
    r = precision_report(model, ce, data(), formats=("FP16",))
    frozen = {p.name: p for p in r.parameters}
    assert not frozen["0.weight"].requires_grad and frozen["0.weight"].gradient is None
    assert frozen["2.weight"].gradient is not None
    sh = r.shares("FP16")
    assert sh["0"]["weight"] is not None and sh["0"]["weight_gradient"] is None
    assert sh["0"]["activation_gradient"] is None  # nothing upstream needs its gradient
    assert all(p.grad is None for p in model.parameters())


class DictOut(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Linear(8, 16)
        self.head = nn.Linear(16, 4)
        self.aux = nn.Linear(8, 2)

    def forward(self, x):
        h = torch.tanh(self.body(x))
        return {"logits": self.head(h), "hidden": (h, None), "aux": self.aux(x), "n": 3}


def test_dict_outputs():
    torch.manual_seed(10)
    model = DictOut()
    x, y = data()
    r = precision_report(model, lambda m, b: Fn.cross_entropy(m(b[0])["logits"], b[1]), (x, y), formats=("FP16",))
    root = next(m for m in r.modules if m.name == "")
    with torch.no_grad():
        out = model(x)
    assert root.activation == log2_histogram([out["logits"], out["hidden"][0], out["aux"]])
    # the loss reaches "logits" and, through the head, "hidden"; "aux" gets no gradient
    assert root.activation_gradient.total == out["logits"].numel() + out["hidden"][0].numel()
    aux = next(m for m in r.modules if m.name == "aux")
    assert aux.activation.total == out["aux"].numel() and aux.activation_gradient.total == 0
    assert r.modules[-1].name == ""


def test_hugging_face_model_output():
    transformers = pytest.importorskip("transformers")
    cfg = transformers.GPT2Config(
        n_layer=1, n_embd=32, n_head=2, vocab_size=50, n_positions=16, bos_token_id=0, eos_token_id=0
    )
    torch.manual_seed(11)
    model = transformers.GPT2LMHeadModel(cfg)
    model.train()
    ids = torch.randint(0, 50, (2, 8))
    r = precision_report(model, lambda m, b: m(**b).loss, {"input_ids": ids, "labels": ids}, formats=("FP16", "BF16"))
    names = [m.name for m in r.modules]
    assert "transformer.h.0.mlp.c_fc" in names and names[-1] == ""
    tied = next(p for p in r.parameters if p.name == "transformer.wte.weight")
    assert tied.aliases == ["lm_head.weight"]
    with torch.no_grad():
        ref = model(input_ids=ids, labels=ids).loss  # dropout masks differ; the losses are of the same model
    assert abs(r.loss - float(ref)) < 0.5
    assert r.first_nonfinite("FP16") is None


# ------------------------------------------------------------------------------------------ the optimizer
def test_optimizer_eps_vanishes_and_updates_lost():
    torch.manual_seed(12)
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 4))
    batch = data()
    adam = torch.optim.Adam(model.parameters(), eps=1e-8)
    r = precision_report(model, ce, batch, formats=("FP16", "BF16"), optimizer=adam)
    assert float(torch.tensor(1e-8).half()) == 0.0 and float(torch.tensor(1e-8).bfloat16()) != 0.0
    fp16 = {c["name"]: c for c in r.optimizer_checks("FP16")["constants"]}
    assert fp16["eps"]["effect"] == "vanishes" and fp16["eps"]["rounded"] == 0.0
    bf16 = {c["name"]: c for c in r.optimizer_checks("BF16")["constants"]}
    assert bf16["betas[1]"]["rounded"] == float(torch.tensor(0.999).bfloat16()) == 1.0
    assert bf16["betas[1]"]["effect"] == "degenerate" and bf16["betas[0]"]["effect"] == "changes"  # 0.9 → 0.898
    with pytest.raises(ValueError, match="beta"):  # what torch says of a β₂ of 1
        torch.optim.Adam(model.parameters(), betas=(0.9, 1.0))
    # under autocast the optimizer steps FP32 weights: nothing of it is rounded, and the advice says nothing of it
    assert "eps" not in r.recommendation("FP16") and "master weights" not in r.recommendation("FP16")
    assert "betas[1]" not in r.recommendation("BF16")
    assert "the optimizer in FP32 (Adam)" in r.recommendation("FP16")
    r_all = precision_report(model, ce, batch, formats=("FP16", "BF16"), optimizer=adam, mode="all")
    assert "eps rounds to 0" in r_all.recommendation("FP16") and "eps" not in r_all.recommendation("BF16")
    assert "optimizer Adam on FP16 weights" in r_all.recommendation("FP16")
    assert "keep the optimizer's arithmetic in FP32 (betas[1] rounds to 1" in r_all.recommendation("BF16")
    assert "rounds back to itself and never decays" in r_all.recommendation("BF16")  # torch's 1 - β2 stays exact
    assert "simulated" in r_all.setting("FP16") and "model.half()" in r_all.setting("FP16")
    assert "model.bfloat16()" in r_all.setting("BF16") and "model.half()" not in r_all.setting("BF16")
    assert "betas[1]" not in r_all.recommendation("FP16")  # 0.999 stays below 1 in FP16
    assert not adam.state  # the optimizer never stepped

    # SGD with a tiny learning rate: the share of updates that round away on FP16 weights, by NumPy's float16
    lr = 1e-4
    sgd = torch.optim.SGD(model.parameters(), lr=lr)
    r = precision_report(model, ce, batch, formats=("FP16",), optimizer=sgd)
    twin = copy.deepcopy(model)
    ce(twin, batch).backward()
    lost = nonzero = 0
    for p in twin.parameters():
        w = p.detach()
        d = (-lr * p.grad.double()).numpy()  # the update SGD asks for
        w16 = w.numpy().astype(np.float16)
        nonzero += int((d != 0).sum())
        lost += int(((d != 0) & ((w16.astype(np.float64) + d).astype(np.float16) == w16)).sum())
    u = r.optimizer_checks("FP16")["updates"]
    assert (u["nonzero"], u["lost"]) == (nonzero, lost) and 0 < lost < nonzero
    assert "master weights" not in r.recommendation("FP16")  # autocast keeps FP32 weights
    r_all = precision_report(model, ce, batch, formats=("FP16",), optimizer=sgd, mode="all")
    assert ("keep FP32 master weights" in r_all.recommendation("FP16")) == (lost / nonzero > 0.001)
    if lost / nonzero > 0.001:
        assert r_all.verdict("FP16") != "trains as is"


# ------------------------------------------------------------------------------------------ presentation
def test_presentation():
    model = mlp_with_overflow()
    r = precision_report(model, ce, data(), formats=("FP16", "BF16"))
    text = str(r)
    assert "Sequential" in text and "FP16" in text and "loss-scale window" in text
    assert all(f"{name}:" in text for name in ("FP16", "BF16"))
    page = r._repr_html_()
    assert "<table" in page and "keep 3 in FP32" in page and "(origin)" in page and "(inherited)" in page
    d = r.to_dict()
    json.dumps(d, allow_nan=False)
    assert {"command", "device", "versions", "date"} <= set(d["provenance"])
    assert d["formats"]["FP16"]["forward_overflows"] == ["3", "4", ""]
    assert d["formats"]["FP16"]["first_nonfinite"] == ["3", "forward"]
    assert d["formats"]["FP16"]["first_nonfinite_op"]["op"] == "mul"
    assert d["formats"]["FP16"]["forward_overflow_origins"] == ["3"]
    from mpt_lab.figures import report_table

    table = report_table({"planted": r})
    assert "<table" in table and "keep modules in FP32" in table and "<code>3</code>" in table
    fig = r.plot()
    axes = [a for a in fig.axes if a.get_xlabel()]
    assert fig._suptitle is not None and len(axes) >= 2
    assert all("log" in a.get_xlabel() for a in axes)
    sh = r.shares("FP16")
    assert sh["3"]["activation"]["overflow"] == pytest.approx(
        float(torch.isinf((model[3](model[2](model[1](model[0](data()[0]))))).detach().half()).double().mean())
    )


# ------------------------------------------------------------------------------------------ bad input
def test_bad_input():
    model = mlp_with_overflow()
    batch = data()
    with pytest.raises(ValueError, match="scalar"):
        precision_report(model, lambda m, b: Fn.cross_entropy(m(b[0]), b[1], reduction="none"), batch)
    with pytest.raises(ValueError, match="no parameters"):
        precision_report(nn.ReLU(), lambda m, b: m(b[0]).sum(), batch)
    with pytest.raises(ValueError, match="unknown format 'FP17'"):
        precision_report(model, ce, batch, formats=("FP16", "FP17"))
    with pytest.raises(ValueError, match="no zero"):
        precision_report(model, ce, batch, formats=("E8M0",))
    with pytest.raises(TypeError, match="model must be a torch.nn.Module"):
        precision_report(lambda x: x, ce, batch)
    with pytest.raises(TypeError, match="optimizer"):
        precision_report(model, ce, batch, optimizer="adam")
    with pytest.raises(TypeError, match=r"m\(\*\*b\).loss"):
        precision_report(model, lambda m, b: {"loss": ce(m, b)}, batch)
    with pytest.raises(ValueError, match="does not require grad"):
        precision_report(model, lambda m, b: ce(m, b).detach(), batch)
    with pytest.raises(ValueError, match="mode"):
        precision_report(model, ce, batch, mode="half")
    r = precision_report(model, ce, batch, formats=("FP16",))
    with pytest.raises(ValueError, match="not analysed"):
        r.forward_overflows("BF16")
    with pytest.raises(ValueError, match="keep"):
        r.loss_scale_window("FP16", keep=1.5)
    assert all(p.grad is None for p in model.parameters())


def test_import_needs_no_transformers():
    code = (
        "import sys; sys.modules['transformers'] = None; import mpt_lab.report, mpt_lab.figures.report; "
        "print('transformers' in sys.modules and sys.modules['transformers'] is not None)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_overhead_benchmark_runs(tmp_path):
    pytest.importorskip("transformers")
    import shlex

    from conftest import load_benchmark

    from mpt_lab.harness.runner import load_json

    mod = load_benchmark("report_overhead")
    out = tmp_path / "overhead.json"
    assert mod.main(["--profile", "quick", "--no-progress", "--out", str(out)]) == 0
    res = load_json(out)
    assert res["experiment"] == "report_overhead" and res["config"] == res["provenance"]["config"]
    assert {"command", "device", "versions", "date", "load_average"} <= set(res["provenance"])
    assert res["provenance"]["command"] == (
        f"python benchmarks/report_overhead.py --profile quick --out {shlex.quote(str(out))}"
    )
    assert res["config"]["layers"] == 1 and res["config"]["repeat"] == 1 and res["config"]["device"] == "cpu"
    rows = {r["variant"]: r for r in res["rows"]}
    assert list(rows) == ["plain FP32 step", "report: FP32 recording", "report: recording + 4 formats"]
    for r in rows.values():
        assert len(r["times_s"]) == len(r["cpu_times_s"]) == len(r["load_average_1min_after_each"]) == 1
        assert r["times_s"][0] > 0 and r["median_s"] == r["times_s"][0] and r["cpu_median_s"] == r["cpu_times_s"][0]
    plain, rec, four = (rows[k]["median_s"] for k in rows)
    summary = res["summary"]
    assert summary["FP32 recording, wall clock"] == pytest.approx(rec / plain)
    assert summary["each format, wall clock"] == pytest.approx((four - rec) / 4 / plain)
    cpu = [rows[k]["cpu_median_s"] for k in rows]
    assert summary["FP32 recording, CPU time"] == pytest.approx(cpu[1] / cpu[0])
    assert summary["each format, CPU time"] == pytest.approx((cpu[2] - cpu[1]) / 4 / cpu[0])
    assert res["goal"] == {"recording_in_steps": 1.5, "per_format_in_steps": 1.5, "ranking_per_layer_in_steps": 2.0}
    rk = res["ranking"]
    assert rk["mode"] == "both" and rk["layers"] == 5 and rk["steps"] >= 1 + 2 * 5 + 1  # 4 Conv1D + lm_head
    assert summary["layer ranking per layer, wall clock"] == pytest.approx(rk["ranking_seconds"] / 5 / plain)
    assert summary["keep_wide (ranking and smallest set) per layer, wall clock"] == pytest.approx(
        rk["seconds"] / 5 / plain
    )
    assert 0 < rk["ranking_seconds"] <= rk["keep_wide_seconds"] <= rk["seconds"]
    assert rk["ranking_steps"] == 1 + 2 * 5 + 1 <= rk["steps"]
    assert res["formats"] == ["FP16", "BF16", "FP8_E4M3", "FP8_E5M2"] and res["parameters"] > 0
    assert set(res["load_average"]) == {"start", "end"}
    with pytest.raises(ValueError, match="config.width"):
        mod.Config(width=30, heads=4).validate()


# ------------------------------------------------------------------------------- the three recorded defects
def test_defect_view_output_changed_in_place_keeps_its_gradient():
    """Defect 1: a Linear with bias on a 3-D input returns a view; ReLU(inplace=True) (or h *= c) makes autograd
    rebase it, and the node the output was made by never runs.  Its gradient is still recorded, exactly."""
    torch.manual_seed(13)
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(inplace=True), nn.Linear(4, 1))
    x = torch.randn(2, 3, 4)
    r = precision_report(model, lambda m, b: m(b).sum(), x, formats=("FP16",))
    pre = model[0](x).detach().requires_grad_()
    (g,) = torch.autograd.grad(model[2](torch.relu(pre)).sum(), [pre])
    lin = next(m for m in r.modules if m.name == "0")
    assert lin.activation_gradient.total == 24 and lin.activation_gradient == log2_histogram(g)


class ScaledInPlace(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(4, 4), nn.Linear(4, 1)

    def forward(self, x):
        h = self.a(x)
        h *= 1000.0  # in place on the view the Linear returned
        return self.b(h)


def test_defect_in_place_scaling_sets_the_window_top():
    torch.manual_seed(14)
    model = ScaledInPlace()
    x = torch.randn(2, 3, 4)

    def loss_fn(m, b):
        return m(b).sum() * 100.0

    r = precision_report(model, loss_fn, x, formats=("FP16",))
    # oracle: every gradient autocast keeps in FP16 (the Linear outputs, h, the weights'), by autograd
    twin = copy.deepcopy(model)
    pre = twin.a(x).detach().requires_grad_()
    post = pre * 1000.0
    out = twin.b(post)
    grads = torch.autograd.grad(out.sum() * 100.0, [pre, post, out, *twin.b.parameters()])
    amax = max(float(g.abs().max()) for g in grads)
    a = next(m for m in r.modules if m.name == "a")
    assert a.activation_gradient == log2_histogram(grads[0])  # the missed gradient, found
    assert a.activation_gradient.amax > FP16_MAX / 128
    assert r.loss_scale_window("FP16")[1] == largest_pow2_scale(amax, FP16_MAX)


class CalledTwice(nn.Module):
    def __init__(self):
        super().__init__()
        self.l = nn.Linear(4, 4)

    def forward(self, x):
        h = self.l(x)
        torch.relu_(h)  # the first call's output (a view) changed in place
        return self.l(h)


def test_defect_a_linear_called_twice_records_both_output_gradients():
    torch.manual_seed(15)
    model = CalledTwice()
    x = torch.randn(2, 3, 4)
    r = precision_report(model, lambda m, b: m(b).pow(2).sum(), x, formats=("FP16",))
    h1 = model.l(x).detach().requires_grad_()
    h2 = model.l(torch.relu(h1))
    g1, g2 = torch.autograd.grad(h2.pow(2).sum(), [h1, h2])
    lin = next(m for m in r.modules if m.name == "l")
    assert lin.calls == 2 and lin.activation_gradient == log2_histogram([g1, g2])


class Intermediate(nn.Module):
    """The largest gradient sits on functional intermediates inside forward: (lin(x) · 10⁻³) · 10³."""

    def __init__(self):
        super().__init__()
        self.lin, self.out = nn.Linear(8, 8), nn.Linear(8, 4)
        self.keep = False

    def forward(self, x):
        t1 = self.lin(x)
        t2 = t1 * 1e-3
        t3 = t2 * 1000.0
        if self.keep:  # the test's own look at the intermediates
            self.seen = (t1, t2, t3)
        return self.out(t3)


def test_defect_gradients_of_functional_intermediates_set_the_window_and_the_scaler():
    torch.manual_seed(16)
    model = Intermediate()
    batch = data()

    def loss_fn(m, b):
        return ce(m, b) * 300.0

    r = precision_report(model, loss_fn, batch, formats=("FP16",))
    twin = copy.deepcopy(model)
    twin.keep = True
    logits = twin(batch[0])
    grads = torch.autograd.grad(Fn.cross_entropy(logits, batch[1]) * 300.0, [*twin.seen, logits, *twin.parameters()])
    del twin.seen
    amax = max(float(g.abs().max()) for g in grads)
    module_amax = max(float(g.abs().max()) for g in (grads[0], grads[3], *grads[4:]))
    assert amax == float(grads[1].abs().max()) > 100 * module_amax  # the intermediate t2's gradient
    high = r.loss_scale_window("FP16")[1]
    assert high == largest_pow2_scale(amax, FP16_MAX)
    assert r.largest_gradients("FP16", 1)[0]["amax"] == pytest.approx(amax)
    scale = r.dynamic_scaler("FP16")["scale"]
    assert scale == min(high, 2.0**16)

    def simulated_step_finite(s):
        m = copy.deepcopy(model)
        with simulate("FP16"):
            (loss_fn(m, batch) * s).backward()
        return all(bool(torch.isfinite(p.grad).all()) for p in m.parameters())

    assert simulated_step_finite(scale / 2) and not simulated_step_finite(scale * 4)


def test_defect_side_effects_of_the_batch_and_of_writes_through_data():
    """Defect 3: a batch that requires grad keeps its .grad; parameters written through .data inside loss_fn
    are restored; no version counter moves (a graph built before the report still runs backward)."""
    torch.manual_seed(17)
    model = nn.Sequential(nn.Linear(4, 3), nn.Tanh(), nn.Linear(3, 1))
    x = torch.randn(5, 4, requires_grad=True)
    graph = model(x).sum()  # built before the report, run after it
    x.grad = torch.full_like(x, 0.5)
    old_grad, old_value = x.grad, x.grad.clone()
    y = torch.randn(5, 4, requires_grad=True)  # a second leaf without .grad

    def loss_fn(m, b):
        m[0].weight.data.add_(1.0)  # bypasses autograd's version counter
        return m(b[0]).pow(2).mean() + b[1].sum() * 0.0

    weights = [p.detach().clone() for p in model.parameters()]
    versions = [p._version for p in model.parameters()]
    precision_report(model, loss_fn, (x, y), formats=("FP16", "BF16"))
    assert x.grad is old_grad and torch.equal(x.grad, old_value) and y.grad is None
    assert all(torch.equal(p, w) for p, w in zip(model.parameters(), weights))
    assert [p._version for p in model.parameters()] == versions
    graph.backward()  # no "modified by an inplace operation"
    assert torch.equal(x.grad, old_value + torch.autograd.grad(model(x).sum(), [x])[0])


# ------------------------------------------------------------------------------- planted faults, op by op
class Attention(nn.Module):
    """Self-attention whose scores and dropout run in F.scaled_dot_product_attention, not in a module."""

    def __init__(self, d=16, heads=2, p=0.5):
        super().__init__()
        self.qkv, self.proj, self.heads, self.p = nn.Linear(d, 3 * d), nn.Linear(d, d), heads, p

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = (z.reshape(b, t, self.heads, d // self.heads).transpose(1, 2) for z in self.qkv(x).split(d, -1))
        o = Fn.scaled_dot_product_attention(q, k, v, dropout_p=self.p if self.training else 0.0)
        self.seen = [z.detach() for z in (q, k, v, o)]
        return self.proj(o.transpose(1, 2).reshape(b, t, d))


class AttentionNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.inp, self.attn, self.head = nn.Linear(8, 16), Attention(), nn.Linear(16, 4)

    def forward(self, x):
        return self.head(torch.tanh(self.attn(self.inp(x))).mean(1))


def test_overflow_inside_scaled_dot_product_attention_found_at_that_op():
    """Planted: values near FP16's max and attention dropout (×2 at p = 0.5) make the output of an SDPA call
    inside a module's forward overflow FP16 while its inputs fit.  The report finds it at that call, with its
    module path; the modules after it are inherited and absent from the advice."""
    torch.manual_seed(18)
    net = AttentionNet()
    with torch.no_grad():
        net.attn.qkv.weight[:32] *= 8.0  # peaked attention
        net.attn.qkv.weight[32:] *= 4e4  # values near FP16's max
    x, y = torch.randn(4, 6, 8), torch.randint(0, 4, (4,))
    torch.manual_seed(1)
    r = precision_report(net, ce, (x, y), formats=("FP16", "BF16"))
    # the test's own answer: in FP32 the inputs fit FP16 and the output does not; real CPU autocast makes inf there
    torch.manual_seed(1)
    with torch.no_grad():
        ce(net, (x, y))
    q, k, v, o = net.attn.seen
    assert max(float(t.abs().max()) for t in (q, k, v)) < FP16_MAX < float(o.abs().max())
    twin = copy.deepcopy(net)
    torch.manual_seed(1)
    with torch.autocast("cpu", dtype=torch.float16):
        ce(twin, (x, y))
    assert twin.attn.seen[3].dtype == torch.float16 and bool(torch.isinf(twin.attn.seen[3]).any())
    loc = r.first_nonfinite("FP16")
    assert loc == ("attn", "forward") and loc.function == "F.scaled_dot_product_attention" and loc.origin
    assert all(
        o["module"] == "attn" and o["function"] == "F.scaled_dot_product_attention" for o in r.origins("FP16")
    ) and r.origins("FP16")
    assert r.inherited("FP16")[0] == ("attn.proj", "forward")  # (tanh turns the inf into 1 after it)
    rec = r.recommendation("FP16")
    assert rec.startswith("keep attn in FP32") and "attn.proj" not in rec and "1 module(s) after it only inherit" in rec
    assert "no loss scale cures a forward overflow" in rec
    assert r.first_nonfinite("BF16") is None
    # module hooks alone see the first inf at the module after the attention (why the report records ops)
    assert next((n, w) for n, w, ok in r.runs["FP16"].events if not ok) == ("attn.proj", "forward")
    torch.manual_seed(1)
    r0 = precision_report(net, ce, (x, y), formats=("FP16",), ops=False)
    assert r0.first_nonfinite("FP16") == ("attn.proj", "forward") and r0.first_nonfinite("FP16").op is None


def test_gemm_operands_and_their_shares():
    torch.manual_seed(19)
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 4))
    x, y = data(64)

    def loss_fn(m, b):  # gradients small enough that FP16 flushes some of them
        return ce(m, b) * 2.0**-20

    r = precision_report(model, loss_fn, (x, y), formats=("FP16",))
    rows = r.gemm_operands("FP16")
    kinds = [(row["module"], row["gemm"], row["operand"]) for row in rows]
    assert kinds.count(("0", "forward", "A")) == 1 and ("2", "weight-gradient", "A") in kinds
    assert {row["gemm"] for row in rows} == {"forward", "input-gradient", "weight-gradient"}
    assert not any(row["module"] == "0" and row["gemm"] == "input-gradient" for row in rows)  # x needs no grad
    fwd = next(row for row in rows if row["module"] == "0" and row["gemm"] == "forward" and row["operand"] == "A")
    assert fwd["values"] == x.numel() and fwd["amax"] == float(x.abs().max())
    w = next(row for row in rows if row["module"] == "2" and row["gemm"] == "forward" and row["operand"] == "B")
    assert w["parameter"] == "2.weight" and w["amax"] == float(model[2].weight.abs().max())
    # the output gradient of the last layer, as its weight-gradient GEMM reads it: share flushed by FP16
    twin = copy.deepcopy(model)
    logits = twin(x)
    (g,) = torch.autograd.grad(Fn.cross_entropy(logits, y) * 2.0**-20, [logits])
    nz = g != 0
    own = float(((g.half() == 0) & nz).sum()) / float(nz.sum())
    grad_rows = [row for row in rows if row["module"] == "2" and row["gemm"] != "forward" and row["gradient_operand"]]
    assert grad_rows and all(row["underflow"] == pytest.approx(own) for row in grad_rows) and own > 0
    summary = r.gemm_summary("FP16")
    assert set(summary) == {"forward", "input-gradient", "weight-gradient"}
    assert (
        r.gemm_summary("FP16", loss_scale=2.0**10)["weight-gradient"]["underflow"]
        < summary["weight-gradient"]["underflow"]
    )


def test_block_format_statistics_of_gemm_operands():
    from mpt_lab.microscaling import quantize_mx, quantize_nvfp4

    torch.manual_seed(20)
    model = nn.Sequential(nn.Linear(64, 32), nn.Tanh(), nn.Linear(32, 4))
    x, y = torch.randn(48, 64), torch.randint(0, 4, (48,))
    x[:, 5] *= 300.0  # an outlier feature: its blocks flush their small values
    r = precision_report(model, ce, (x, y), formats=("BF16",), block_formats=("MXFP8", "MXFP4", "NVFP4"))
    for fmt, q in (
        ("NVFP4", quantize_nvfp4(x, axis=-1)),
        ("MXFP4", quantize_mx(x, "MXFP4", 32, -1)),
        ("MXFP8", quantize_mx(x, "MXFP8_E4M3", 32, -1)),
    ):
        row = next(
            b for b in r.block_operands(fmt) if b["module"] == "0" and b["gemm"] == "forward" and b["operand"] == "A"
        )
        xq = q.dequantize(torch.float64)
        x64 = x.double()
        flushed = float(((xq == 0) & (x64 != 0)).sum()) / float((x64 != 0).sum())
        rel = float(((xq - x64) ** 2).sum().sqrt() / (x64**2).sum().sqrt())
        assert row["flushed"] == pytest.approx(flushed) and row["rel_rms_error"] == pytest.approx(rel)
        assert row["clipped"] == pytest.approx(float(q.saturated(x).double().mean()))
    nv = next(b for b in r.block_operands("NVFP4") if b["module"] == "0" and b["operand"] == "A")
    mx8 = next(b for b in r.block_operands("MXFP8") if b["module"] == "0" and b["operand"] == "A")
    assert nv["flushed"] > 0.05 > mx8["flushed"]  # 4 bits lose the small values beside the outlier
    assert nv["scale_spread"] > 5  # outlier blocks against the others
    with pytest.raises(ValueError, match="block_format"):
        r.block_operands("MXFP6")
    with pytest.raises(ValueError, match="block_formats"):
        precision_report(model, ce, (x, y), formats=("BF16",), block_formats=("FP4",))


# ------------------------------------------------------------------------------- predictions against real runs
def _real_autocast_flush_share(model, loss_fn, batch):
    """The test's own measurement: the share of the non-zero FP32 activation gradients (module outputs, leaf
    modules) that a real CPU FP16 autocast backward makes zero."""

    def grads(m, autocast):
        got, handles = {}, []
        leaves = [(n, mod) for n, mod in m.named_modules() if not any(True for _ in mod.children())]

        def hook(name):
            def h(mod, inp, out):
                if out.requires_grad:
                    out.register_hook(lambda g: got.__setitem__(name, g.detach().clone()))

            return h

        for n, mod in leaves:
            handles.append(mod.register_forward_hook(hook(n)))
        if autocast:
            with torch.autocast("cpu", dtype=torch.float16):
                loss = loss_fn(m, batch)
        else:
            loss = loss_fn(m, batch)
        loss.backward()
        for h in handles:
            h.remove()
        return got  # each leaf module runs once

    torch.manual_seed(0)
    g32 = grads(copy.deepcopy(model), False)
    torch.manual_seed(0)
    g16 = grads(copy.deepcopy(model), True)
    assert set(g32) == set(g16)
    nz = flushed = 0
    for name, a in g32.items():
        b = g16[name]
        m = a != 0
        nz += int(m.sum())
        flushed += int((m & (b.float() == 0)).sum())
    return flushed / nz


@pytest.mark.parametrize("kind", ["mlp", "cnn"])
def test_predicted_fp16_underflow_matches_a_real_autocast_backward(kind):
    torch.manual_seed(21)
    if kind == "mlp":
        model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))
        batch = (torch.randn(128, 32), torch.randint(0, 10, (128,)))
        factor = 2.0**-12
    else:
        model = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1),
            nn.BatchNorm2d(8),
            nn.ReLU(),
            nn.Conv2d(8, 8, 3, padding=1),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
            nn.Linear(8, 10),
        )
        batch = (torch.randn(16, 3, 16, 16), torch.randint(0, 10, (16,)))
        factor = 2.0**-6  # (at heavier underflow a real backward flushes more: zeros compound upstream)

    def loss_fn(m, b):
        return Fn.cross_entropy(m(b[0]).float(), b[1]) * factor

    r = precision_report(model, loss_fn, batch, formats=("FP16",))
    leaves = [m for m in r.modules if not any(True for _ in model.get_submodule(m.name).children())]
    pooled = sum((m.activation_gradient for m in leaves), log2_histogram(torch.zeros(0)))
    c = pooled.category_counts("FP16")
    predicted = c["underflow"] / (c["normal"] + c["subnormal"] + c["underflow"] + c["overflow"])
    measured = _real_autocast_flush_share(model, loss_fn, batch)
    assert 0.05 < measured < 0.95 and abs(predicted - measured) < 0.01


# ------------------------------------------------------------------------------- which layers to keep wide
def _dead_channel_mlp():
    torch.manual_seed(22)
    model = nn.Sequential(
        nn.Linear(64, 128),
        nn.GELU(),
        nn.Linear(128, 128),
        nn.GELU(),
        nn.Linear(128, 128),
        nn.GELU(),
        nn.Linear(128, 10),
    )
    with torch.no_grad():
        model[2].weight[5].zero_()
        model[2].bias[5] = -20.0  # GELU(-20) = 0: channel 5 of layer 4's input is dead,
        model[4].weight[:, 5] = 1e6  # so these weights change nothing in FP32 and set NVFP4's scales
    return model


def _gradient_error(model, loss_fn, batch, ref):
    m = copy.deepcopy(model)
    grads = torch.autograd.grad(loss_fn(m, batch), list(m.parameters()))
    num = sum(float(((g.double() - r.double()) ** 2).sum()) for g, r in zip(grads, ref))
    return math.sqrt(num / sum(float((r.double() ** 2).sum()) for r in ref))


def test_keep_wide_ranks_the_planted_layer_first_and_its_set_holds_in_a_real_recipe_run():
    from mpt_lab.quantized_training import four_bit_recipe, quantize_linears_
    from mpt_lab.report import keep_wide

    model = _dead_channel_mlp()
    batch = (torch.randn(256, 64), torch.randint(0, 10, (256,)))
    recipe = four_bit_recipe()  # NVIDIA's NVFP4 recipe, stochastic rounding too
    ref = torch.autograd.grad(ce(model, batch), list(model.parameters()))
    # the test's own answer: each layer alone on the recipe, with quantize_linears_
    alone = {}
    for name in ("0", "2", "4", "6"):
        m = copy.deepcopy(model)
        quantize_linears_(m, recipe, skip=[n for n in ("0", "2", "4", "6") if n != name])
        alone[name] = _gradient_error(m, ce, batch, ref)
    assert max(alone, key=alone.get) == "4" and alone["4"] > 3 * max(v for k, v in alone.items() if k != "4")
    before = [p.detach().clone() for p in model.parameters()]
    hooks = hook_counts(model)
    r = keep_wide(model, ce, batch, recipe, tolerance=0.25, progress=False)
    assert r.ranking[0] == "4" and r.layers == ["0", "2", "4", "6"]
    assert all(r.one[n]["gradient"] == pytest.approx(alone[n], rel=1e-6) for n in alone)  # the same draws
    assert r.keep == ["4"] and r.within and r.kept["gradient"] <= 0.25 < r.every["gradient"]
    assert not r.last_layers() and r.positions() == [2] and r.share_kept() == 0.25
    # the ranking: FP32, each layer alone, every layer, every layer but one; then the search for the set
    assert r.ranking_steps == 2 + 2 * len(r.layers) < r.steps
    r1 = keep_wide(model, ce, batch, recipe, tolerance=0.25, all_but_one=False, progress=False)
    assert r1.ranking_steps == 2 + len(r1.layers) and r1.to_dict()["ranking_steps"] == r1.ranking_steps
    for x in (r, r1):  # the wall-clock split: the ranking's part of the whole
        assert 0 < x.ranking_seconds <= x.seconds and x.to_dict()["seconds"] == x.seconds
    # the kept set in a real recipe run: "4" with the BF16 recipe, the others with NVFP4's
    m = copy.deepcopy(model)
    quantize_linears_(m, recipe, skip=r.keep)
    quantize_linears_(
        m, "bf16", skip=[n for n, mod in m.named_modules() if isinstance(mod, nn.Linear) and n not in r.keep]
    )
    assert _gradient_error(m, ce, batch, ref) <= 0.25
    # the model is as it was: its own Linear layers, weights, no grads, no hooks
    assert all(type(model[i]) is nn.Linear for i in (0, 2, 4, 6))
    assert all(torch.equal(p, b) for p, b in zip(model.parameters(), before))
    assert all(p.grad is None for p in model.parameters()) and hook_counts(model) == hooks


def test_keep_wide_on_a_transformer_language_model():
    from mpt_lab.models import CharTransformerLM
    from mpt_lab.quantized_training import four_bit_recipe, quantize_linears_
    from mpt_lab.report import keep_wide

    torch.manual_seed(23)
    lm = CharTransformerLM(40, dim=32, layers=2, heads=2, context=16)
    ids = torch.randint(0, 40, (4, 16))

    def loss_fn(m, b):
        return Fn.cross_entropy(m(b[:, :-1]).reshape(-1, 40), b[:, 1:].reshape(-1))

    recipe = four_bit_recipe(stochastic_gradients=False)  # deterministic: the test's run matches exactly
    r = keep_wide(lm, loss_fn, ids, recipe, tolerance=0.2, progress=False)
    assert r.layers[-1] == "head" and len(r.layers) == 9 and r.within
    assert sorted(r.ranking) == sorted(r.layers)
    ref = torch.autograd.grad(loss_fn(lm, ids), list(lm.parameters()))
    m = copy.deepcopy(lm)
    quantize_linears_(m, recipe, skip=r.keep)
    if r.keep:
        quantize_linears_(
            m, "bf16", skip=[n for n, mod in m.named_modules() if isinstance(mod, nn.Linear) and n not in r.keep]
        )
    assert _gradient_error(m, loss_fn, ids, ref) == pytest.approx(r.kept["gradient"], rel=1e-6)


def test_keep_wide_bad_input():
    from mpt_lab.report import keep_wide

    model = nn.Sequential(nn.Linear(4, 4))
    with pytest.raises(ValueError, match="tolerance"):
        keep_wide(model, lambda m, b: m(b).sum(), torch.randn(2, 4), tolerance=0)
    with pytest.raises(ValueError, match="metric"):
        keep_wide(model, lambda m, b: m(b).sum(), torch.randn(2, 4), metric="l1")
    with pytest.raises(ValueError, match="not Linear"):
        keep_wide(model, lambda m, b: m(b).sum(), torch.randn(2, 4), skip=["1"])
    with pytest.raises(ValueError, match="no Linear"):
        keep_wide(nn.Sequential(nn.Conv1d(1, 1, 1)), lambda m, b: m(b).sum(), torch.randn(1, 1, 4))
    with pytest.raises(ValueError, match="recipe"):
        keep_wide(model, lambda m, b: m(b).sum(), torch.randn(2, 4), "fp5")


# ------------------------------------------------------------------------------- the monitor over steps
def test_monitor_explains_a_collapsing_scale_and_leaves_no_hooks():
    from mpt_lab.report import PrecisionMonitor

    torch.manual_seed(24)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    with torch.no_grad():
        model[2].weight.mul_(1e6)  # planted: the last layer's outputs overflow FP16
    x, y = data(32)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.float16):
        assert not bool(torch.isfinite(copy.deepcopy(model)(x)).all())  # the test's own check
    hooks = hook_counts(model)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler("cpu")
    with PrecisionMonitor(model, "FP16", scaler=scaler, optimizer=opt) as mon:
        assert hook_counts(model) != hooks
        for _ in range(4):
            opt.zero_grad()
            with torch.autocast("cpu", dtype=torch.float16):
                loss = Fn.cross_entropy(model(x).float(), y)
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            mon.step(loss)
    assert hook_counts(model) == hooks
    assert mon.scales() == [2.0**16, 2.0**15, 2.0**14, 2.0**13] and mon.skipped_steps() == [0, 1, 2, 3]
    found = {d["finding"]: d for d in mon.diagnose()}
    assert found["forward overflow"]["text"].startswith("steps 0–3: the forward pass holds inf/NaN from 2 on")
    assert found["collapse"]["text"].endswith("fell from 65536 to 4096")
    assert mon.history[0]["nonfinite_activations"] == ["2"]
    # hooks go also when the loop raises
    with pytest.raises(RuntimeError, match="planted"):
        with PrecisionMonitor(model, "FP16"):
            raise RuntimeError("planted")
    assert hook_counts(model) == hooks


def test_monitor_scale_below_one_and_a_vanishing_eps():
    from mpt_lab.report import PrecisionMonitor

    torch.manual_seed(25)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    x, y = data(32)
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    scaler = torch.amp.GradScaler("cpu", init_scale=4.0)
    with PrecisionMonitor(model, "FP16", scaler=scaler) as mon:
        for _ in range(5):
            opt.zero_grad()
            with torch.autocast("cpu", dtype=torch.float16):
                loss = Fn.cross_entropy(model(x).float(), y) * 1e8  # gradients beyond FP16 unscaled
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            mon.step(loss)
    assert mon.scales() == [4.0, 2.0, 1.0, 0.5, 0.25] and mon.skipped_steps() == [0, 1, 2, 3, 4]
    below = [d for d in mon.diagnose() if d["finding"] == "scale below 1"]
    assert below and below[0]["step"] == 3
    # it names a gradient that overflowed at that scale (the step's recorded amax is inf or NaN there)
    step3 = mon.history[3]["gradient_amax"]
    bad = [n for n, a in step3.items() if not math.isfinite(a)]
    assert bad and f"inf/NaN at this scale in {bad[0]}" in below[0]["text"]
    # Adam on FP16 weights: eps = 1e-8 is 0 in FP16 and a weight with a tiny gradient becomes inf
    half = nn.Sequential(nn.Linear(8, 4)).half()
    with torch.no_grad():
        half[0].weight[0, 0] = 0.0
    adam = torch.optim.Adam(half.parameters(), lr=1e-3)
    with PrecisionMonitor(half, "FP16", optimizer=adam) as mon:
        for _ in range(2):
            adam.zero_grad()
            loss = (half(x.half()).float() * 1e-6).sum()
            loss.backward()
            adam.step()
            mon.step(loss)
    findings = [d["finding"] for d in mon.diagnose()]
    assert findings[:2] == ["nonfinite weights", "optimizer constant"]
    assert F_round(1e-8) == 0.0


def F_round(v):
    from mpt_lab.formats import round_to

    return round_to(v, "FP16")


# ------------------------------------------------------------------------------- advice in its setting
def test_advice_states_its_setting_and_never_contradicts_itself():
    from mpt_lab.report import _pct_below

    torch.manual_seed(26)
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 4))
    batch = data()
    r = precision_report(model, ce, batch, formats=("FP16", "BF16"), mode="all")
    for f in ("FP16", "BF16"):
        rec = r.recommendation(f)
        assert "not checked: whether the optimizer's constants and its updates survive" in rec
        assert f"every op and the weights in {f}" in rec and "no optimizer given" in rec
    ra = precision_report(model, ce, batch, formats=("FP16",), optimizer=torch.optim.SGD(model.parameters(), lr=1e-6))
    assert "master weights" not in ra.recommendation("FP16") and "autocast to FP16" in ra.recommendation("FP16")
    assert _pct_below(0.99899, 0.999) == "99.899%" and float(_pct_below(0.9989999, 0.999)[:-1]) < 99.9
    # the window's ends name the gradients that set them
    r = precision_report(model, lambda m, b: ce(m, b) * 2.0**-22, batch, formats=("FP16",))
    ends = r.window_ends("FP16")
    grads = all_gradients(model, lambda m, b: ce(m, b) * 2.0**-22, batch)
    assert ends["high"]["amax"] == pytest.approx(max(float(g.abs().max()) for g in grads))
    assert ends["low"] and abs(sum(d["share"] for d in ends["low"]) - 1) < 1e-9 or ends["low"][0]["share"] <= 1
    rec = r.recommendation("FP16")
    assert rec.startswith("needs a loss scale in") and "the high end is set by" in rec and "most lost" in rec


def test_progress_bar(capsys):
    model = nn.Sequential(nn.Linear(8, 4))
    precision_report(model, ce, data(), formats=("FP16",), progress=True)
    err = capsys.readouterr().err
    assert "precision report: FP16 step" in err  # the bar names the step it counts
    with pytest.raises(TypeError, match="progress"):
        precision_report(model, ce, data(), progress="yes")
    from mpt_lab.report import keep_wide

    keep_wide(
        nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 4)),
        ce,
        (torch.randn(8, 16), torch.randint(0, 4, (8,))),
        "fp8_current",
        all_but_one=False,
        progress=True,
    )
    err = capsys.readouterr().err
    assert "keep_wide: one layer at a time" in err and "precision report" not in err  # its own name


def test_loss_scale_figure():
    from mpt_lab.figures import plot_loss_scales
    from mpt_lab.report import PrecisionMonitor

    model = nn.Sequential(nn.Linear(8, 4))
    scaler = torch.amp.GradScaler("cpu", init_scale=4.0)
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    with PrecisionMonitor(model, "FP16", scaler=scaler) as mon:
        for _ in range(3):
            opt.zero_grad()
            with torch.autocast("cpu", dtype=torch.float16):
                loss = ce(model, data()) * 1e8
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            mon.step(loss)
    fig = plot_loss_scales({"a loop": mon})
    ax = fig.axes[0]
    assert ax.get_title() == "The loss scale at each step of 1 training loop with a GradScaler"
    assert "log2" in ax.get_ylabel() and ax.get_xlabel() == "training step"
    two = plot_loss_scales({"a loop": mon, "the same loop": mon})
    assert two.axes[0].get_title() == "The loss scale at each step of 2 training loops with a GradScaler"
    assert list(ax.lines[0].get_ydata()) == [2.0, 1.0, 0.0] and ax.get_legend() is not None
    with pytest.raises(TypeError, match="monitors"):
        plot_loss_scales({})


def test_the_recorder_counts_a_tensor_once_under_every_view_that_holds_all_of_it():
    """A view that holds each element of its base once (a reshape to more dimensions, a transpose) has its base's
    histogram, counted once; a view of part of it (a slice, an overlapping stride) is counted on its own."""
    from mpt_lab._report_record import StepRecorder, _covers

    base = torch.randn(512, 300)
    assert _covers(base.view(4, 128, 300), base) and _covers(base.t(), base) and _covers(base.unsqueeze(0), base)
    assert not _covers(base[:, :299], base) and not _covers(base[1:], base)
    assert not _covers(base.as_strided((512, 300), (0, 1)), base)  # every row the first: same numel, other values
    rec = StepRecorder({})
    h = rec.hist(base)
    assert rec.hist(base.view(4, 128, 300)) is h and rec.hist(base.view(4, 128, 300).transpose(0, 1)) is h
    part = rec.hist(base[:, :299])
    assert part is not h and part == log2_histogram(base[:, :299]) and h == log2_histogram(base)
    base.mul_(2.0)  # a new version: counted again
    assert rec.hist(base.t()) is not h and rec.hist(base.t()) == log2_histogram(base)


def test_keep_wide_gradient_error_sum_equals_the_float64_formula_for_any_layout():
    """The gradient error's squared distance (summed piece by piece, flat views of transposed gradients) equals
    ``((a.double() - b.double()) ** 2).sum()`` to 1e-12 relative, for contiguous, transposed and mixed layouts,
    3-D tensors, size-one dimensions and empty tensors, with a reused buffer."""
    from mpt_lab.report_layers import _squared_distance

    g = torch.Generator().manual_seed(0)
    buffer: list = []
    for shape, transpose in [
        ((300, 700), True),
        ((5, 6, 7), False),
        ((1000,), False),
        ((0,), False),
        ((3, 1, 4), True),
    ]:
        a, b = torch.randn(shape, generator=g), torch.randn(shape, generator=g)
        if transpose:
            a, b = a.transpose(0, -1), b.transpose(0, -1)
        for x, y in [(a, b), (a, b.contiguous()), (a.contiguous(), b)]:
            want = float(((x.double() - y.double()) ** 2).sum())
            assert _squared_distance(x, y, buffer) == pytest.approx(want, rel=1e-12, abs=0.0)


def test_report_figure_legend_names_where_each_format_overflows():
    """The report figure's legend gives the overflow threshold under round-to-nearest-even: max + ½ ulp, included
    where the tie rounds away from max (FP16, E5M2, BF16) and excluded where it rounds back (E4M3), as round_to
    says."""
    from mpt_lab import formats as F
    from mpt_lab.figures.report import _overflow_from

    for f in (F.FP16, F.BF16, F.FP8_E5M2, F.FP8_E4M3):
        text = _overflow_from(f)
        half = f.max + float(F.ulp(f.max, f)) / 2
        tie_overflows = not math.isfinite(float(F.round_to(half, f))) or float(F.round_to(half, f)) > f.max
        assert text == (f"≥ {half:g}" if tie_overflows else f"> {half:g}"), f.name
    assert _overflow_from(F.FP16) == "≥ 65520" and _overflow_from(F.FP8_E4M3) == "> 464"
