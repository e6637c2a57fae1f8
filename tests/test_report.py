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
    assert expected and expected[0] == "3"                       # the planted Scale
    assert r.forward_overflows("FP16") == expected
    assert r.forward_overflows("BF16") == []
    assert r.recommendation("FP16").startswith("keep 3, 4, (model) in FP32")
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
    assert r.first_nonfinite("FP16") == (first, "forward") == ("3", "forward")
    assert not math.isfinite(r.runs["FP16"].loss) and not math.isfinite(float(loss.detach()))
    assert r.dynamic_scaler("FP16")["skipped"] is None          # no loss scale cures a forward overflow


def test_first_nonfinite_backward_matches_real_autocast():
    torch.manual_seed(2)
    model = nn.Sequential(nn.Linear(8, 16), GradAmp(2.0 ** 40), nn.Linear(16, 4))
    batch = data()
    r = precision_report(model, ce, batch, formats=("FP16", "BF16"))
    twin = copy.deepcopy(model)
    fwd, grads, handles = oracle_hooks(twin)
    with torch.autocast("cpu", dtype=torch.float16):
        loss = ce(twin, batch)
    loss.backward()
    for h in handles:
        h.remove()
    assert all(bool(torch.isfinite(t).all()) for _, t in fwd)
    first = next(name for name, g in grads if not bool(torch.isfinite(g).all()))
    assert first == "0"                                           # the Linear before the amplifier
    assert r.first_nonfinite("FP16") == (first, "backward")
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


@pytest.mark.parametrize("loss_factor", [1.0, 2.0 ** -20])
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
    assert bf16 == min(largest_pow2_scale(amax, float(torch.finfo(torch.bfloat16).max)), 2.0 ** 127)
    assert bf16 <= 2.0 ** 127 and math.isfinite(float(torch.tensor(bf16, dtype=torch.float32)))  # a float32 scale
    flat = torch.cat([g.reshape(-1) for g in grads]).double()
    nz = flat[flat != 0]

    def kept(s):
        return float(((nz * s).to(torch.float16) != 0).double().mean())

    assert kept(low) >= 0.999 > kept(low / 2)
    if loss_factor < 1:
        assert low > 1.0 and low <= high                          # a loss scale is needed, and one exists
        assert r.recommendation("FP16").startswith(f"needs a loss scale in [2^{int(math.log2(low))}, ")
        assert r.verdict("FP16") == "needs a loss scale"
        sc = r.dynamic_scaler("FP16")
        assert sc["skipped"] == max(0, 16 - int(math.log2(high)))
    assert r.first_nonfinite("FP16") is None


def test_dynamic_scaler_skips_until_the_largest_gradient_fits():
    torch.manual_seed(4)
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 4))
    batch = data()
    r = precision_report(model, lambda m, b: ce(m, b) * 2.0 ** 8, batch, formats=("FP16",))
    amax = max(float(g.abs().max()) for g in all_gradients(model, lambda m, b: ce(m, b) * 2.0 ** 8, batch))
    s = 2.0 ** 16
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
        out.append(tuple(len(getattr(m, a)) for a in ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks",
                                                       "_backward_pre_hooks")))
    for p in model.parameters():
        out.append(len(p._backward_hooks) if p._backward_hooks else 0)
    return out


def test_no_side_effects():
    torch.manual_seed(5)
    model = WithState()
    model.frozen_in_eval.eval()
    user_hook = model.a.register_forward_hook(lambda *a: None)
    batch = data()
    ce(model, batch).backward()                  # existing gradients the report must not touch
    model.b.bias.grad = None
    params = {n: (p, p.detach().clone(), p.grad, None if p.grad is None else p.grad.clone())
              for n, p in model.named_parameters()}
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
    assert all(np.array_equal(a, b) if isinstance(a, np.ndarray) else a == b
               for a, b in zip(np.random.get_state(), np_rng))
    for n, p in model.named_parameters():
        q, value, grad, grad_value = params[n]
        assert p is q and torch.equal(p.detach(), value) and p.detach().view(torch.int32).equal(value.view(torch.int32))
        assert p.grad is grad and (grad is None or torch.equal(p.grad, grad_value))
    for n, b in model.named_buffers():
        assert torch.equal(b, buffers[n]), n
    assert [m.training for m in model.modules()] == modes
    assert hook_counts(model) == hooks and model.a._forward_hooks      # the user's hook is still there
    assert json.dumps(opt.state_dict(), default=str) == json.dumps(opt_state, default=str)
    user_hook.remove()
    # and every step of the report drew the same dropout masks: FP32 and BF16 losses agree closely
    assert abs(r.runs["BF16"].loss - r.loss) < 0.05 * abs(r.loss)


def test_state_restored_when_the_model_rejects_the_batch():
    torch.manual_seed(6)
    model = WithState()
    params = [p.detach().clone() for p in model.parameters()]
    buffers = [b.detach().clone() for b in model.buffers()]
    x = torch.randn(16, 5)                        # the model wants 8 features
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
        h = self.mid(torch.tanh(h))               # the same module called twice
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
    loss_fn(twin, batch).backward()               # the tied weight's gradient sums both uses
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
    assert lin.activation_gradient == log2_histogram(g_pre)     # zeros where the ReLU cut
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
    assert sh["0"]["activation_gradient"] is None                 # nothing upstream needs its gradient
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
    cfg = transformers.GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=50, n_positions=16,
                                  bos_token_id=0, eos_token_id=0)
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
    assert bf16["betas[1]"]["effect"] == "degenerate" and bf16["betas[0]"]["effect"] == "changes"   # 0.9 → 0.898
    with pytest.raises(ValueError, match="beta"):                     # what torch says of a β₂ of 1
        torch.optim.Adam(model.parameters(), betas=(0.9, 1.0))
    assert "eps" in r.recommendation("FP16") and "eps" not in r.recommendation("BF16")
    assert "keep the optimizer's arithmetic in FP32 (betas[1] rounds to 1" in r.recommendation("BF16")
    assert "betas[1]" not in r.recommendation("FP16")                 # 0.999 stays below 1 in FP16
    assert not adam.state                                            # the optimizer never stepped

    # SGD with a tiny learning rate: the share of updates that round away on FP16 weights, by NumPy's float16
    lr = 1e-4
    sgd = torch.optim.SGD(model.parameters(), lr=lr)
    r = precision_report(model, ce, batch, formats=("FP16",), optimizer=sgd)
    twin = copy.deepcopy(model)
    ce(twin, batch).backward()
    lost = nonzero = 0
    for p in twin.parameters():
        w = p.detach()
        d = (-lr * p.grad.double()).numpy()                             # the update SGD asks for
        w16 = w.numpy().astype(np.float16)
        nonzero += int((d != 0).sum())
        lost += int(((d != 0) & ((w16.astype(np.float64) + d).astype(np.float16) == w16)).sum())
    u = r.optimizer_checks("FP16")["updates"]
    assert (u["nonzero"], u["lost"]) == (nonzero, lost) and 0 < lost < nonzero
    assert ("keep FP32 master weights" in r.recommendation("FP16")) == (lost / nonzero > 0.001)


# ------------------------------------------------------------------------------------------ presentation
def test_presentation():
    model = mlp_with_overflow()
    r = precision_report(model, ce, data(), formats=("FP16", "BF16"))
    text = str(r)
    assert "Sequential" in text and "FP16" in text and "loss-scale window" in text
    assert all(f"{name}:" in text for name in ("FP16", "BF16"))
    page = r._repr_html_()
    assert "<table" in page and "keep 3, 4, (model) in FP32" in page
    d = r.to_dict()
    json.dumps(d, allow_nan=False)
    assert {"command", "device", "versions", "date"} <= set(d["provenance"])
    assert d["formats"]["FP16"]["forward_overflows"] == ["3", "4", ""]
    assert d["formats"]["FP16"]["first_nonfinite"] == ["3", "forward"]
    from mpt_lab.figures import report_table

    table = report_table({"planted": r})
    assert "<table" in table and "keep modules in FP32" in table and "<code>3</code> (forward)" in table
    fig = r.plot()
    axes = [a for a in fig.axes if a.get_xlabel()]
    assert fig._suptitle is not None and len(axes) >= 2
    assert all("log" in a.get_xlabel() for a in axes)
    sh = r.shares("FP16")
    assert sh["3"]["activation"]["overflow"] == pytest.approx(
        float(torch.isinf((model[3](model[2](model[1](model[0](data()[0]))))).detach().half()).double().mean()))


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
    code = ("import sys; sys.modules['transformers'] = None; import mpt_lab.report, mpt_lab.figures.report; "
            "print('transformers' in sys.modules and sys.modules['transformers'] is not None)")
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
    assert res["provenance"]["command"] == ("python benchmarks/report_overhead.py --profile quick "
                                            f"--out {shlex.quote(str(out))}")
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
    assert res["goal"] == {"recording_in_steps": 1.5, "per_format_in_steps": 1.5}
    assert res["formats"] == ["FP16", "BF16", "FP8_E4M3", "FP8_E5M2"] and res["parameters"] > 0
    assert set(res["load_average"]) == {"start", "end"}
    with pytest.raises(ValueError, match="config.width"):
        mod.Config(width=30, heads=4).validate()
