"""mpt_lab.master_weights: the FP32-master-weight loop in eight visible steps (Micikevicius et al. 2018,
§3.1–3.2 and Figure 1; NVIDIA's guide).

CPU only, one thread, small models (FP16 matrix products have no fast CPU kernel).  The oracle for
training is ``torch.autocast("cpu", dtype=torch.float16)`` + ``torch.amp.GradScaler("cpu")``.
"""

from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from mpt_lab.master_weights import MasterWeightTrainer
from mpt_lab.scaling import GradScaler, StaticLossScaler


def mlp(seed: int = 0, d_in: int = 8, hidden: int = 16, d_out: int = 4) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(d_in, hidden), nn.ReLU(), nn.Linear(hidden, d_out))


def batch(seed: int = 1, n: int = 16, d_in: int = 8, classes: int = 4):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, d_in, generator=g), torch.randint(0, classes, (n,), generator=g)


def sgd(lr=0.1, **kw):
    return lambda params: torch.optim.SGD(params, lr=lr, **kw)


def adam(lr=1e-2):
    return lambda params: torch.optim.Adam(params, lr=lr)


# ----------------------------------------------------------------------------------------------------
# The 8 steps: what each one produces
# ----------------------------------------------------------------------------------------------------
def test_trace_shows_the_dtypes_of_the_8_steps():
    trainer = MasterWeightTrainer(mlp(), adam(), F.cross_entropy, scaler=GradScaler(2.0**8), trace=True)
    x, y = batch()
    out = trainer.train_step(x, y)
    assert out["scale"] == 256.0 and out["skipped"] is False and out["step"] == 1
    trace = trainer.last_trace
    assert [r["step"] for r in trace] == [1, 1, 2, 3, 4, 5, 6, 7, 8, 8]
    expected = [
        ("FP32 master weights", "float32", (16, 8)),
        ("FP16 copy of the weights", "float16", (16, 8)),
        ("FP16 forward: prediction", "float16", (16, 4)),
        ("prediction cast to FP32", "float32", (16, 4)),
        ("FP32 loss × S", "float32", ()),
        ("scaled loss kept in FP32 (as frameworks do)", "float32", ()),  # the default: no naive cast
        ("FP16 gradients (× S)", "float16", (16, 8)),
        ("FP32 gradients ÷ S", "float32", (16, 8)),
        ("FP32 master weights, updated", "float32", (16, 8)),
        ("FP16 copy refreshed from the masters", "float16", (16, 8)),
    ]
    assert [(r["name"], r["dtype"], r["shape"]) for r in trace] == expected
    n_params = 8 * 16 + 16 + 16 * 4 + 4
    for r in trace:
        if r["step"] in (1, 6, 7, 8):
            assert r["tensors"] == 4 and r["numel"] == n_params
    # without trace nothing is recorded
    quiet = MasterWeightTrainer(mlp(), adam(), F.cross_entropy)
    quiet.train_step(x, y)
    assert quiet.last_trace is None


def test_trace_bfloat16_copy():
    trainer = MasterWeightTrainer(mlp(), sgd(), F.cross_entropy, half_dtype=torch.bfloat16, trace=True)
    trainer.train_step(*batch())
    dtypes = [r["dtype"] for r in trainer.last_trace]
    assert dtypes == [
        "float32",
        "bfloat16",
        "bfloat16",
        "float32",
        "float32",
        "float32",
        "bfloat16",
        "float32",
        "float32",
        "bfloat16",
    ]
    assert trainer.last_trace[1]["name"] == "BF16 copy of the weights"
    naive = MasterWeightTrainer(
        mlp(), sgd(), F.cross_entropy, half_dtype=torch.bfloat16, trace=True, cast_scaled_loss=True
    )
    naive.train_step(*batch())
    assert (naive.last_trace[5]["name"], naive.last_trace[5]["dtype"]) == (
        "scaled loss cast to BF16 (naive)",
        "bfloat16",
    )


def test_model_holds_the_fp16_copy_and_original_fp32_parameters_become_masters():
    model = mlp()
    originals = list(model.parameters())
    values = [p.detach().clone() for p in originals]
    opt = torch.optim.SGD(model.parameters(), lr=0.1)  # built over the FP32 model before wrapping
    trainer = MasterWeightTrainer(model, opt, F.cross_entropy)
    assert all(m is p for m, p in zip(trainer.masters, originals))
    assert all(m.dtype == torch.float32 and m.is_leaf for m in trainer.masters)
    assert all(torch.equal(m, v) for m, v in zip(trainer.masters, values))
    assert [p for p in model.parameters()] == trainer.half_params
    assert all(p.dtype == torch.float16 for p in model.parameters())


def test_masters_stay_fp32_and_the_copy_is_masters_rounded_after_every_step():
    trainer = MasterWeightTrainer(mlp(), adam(3e-2), F.cross_entropy, scaler=GradScaler(2.0**10, growth_interval=2))
    for step in range(6):
        trainer.train_step(*batch(seed=step))
        for m, h in zip(trainer.masters, trainer.half_params):
            assert m.dtype == torch.float32 and h.dtype == torch.float16
            assert torch.equal(h.detach(), m.detach().to(torch.float16))
            assert m.grad.dtype == torch.float32 and h.grad.dtype == torch.float16
    # the masters carry bits the FP16 copy cannot hold (otherwise they would be pointless)
    assert any(not torch.equal(m.detach(), h.detach().float()) for m, h in zip(trainer.masters, trainer.half_params))


def test_predict_runs_the_fp16_copy_and_returns_fp32():
    trainer = MasterWeightTrainer(mlp(), sgd(), F.cross_entropy)
    x, _ = batch()
    pred = trainer.predict(x)
    assert pred.dtype == torch.float32 and pred.shape == (16, 4) and not pred.requires_grad
    assert torch.equal(pred, trainer.model(x.half()).float())


def test_lstm_and_embedding_model():
    """Integer inputs pass unchanged; an LSTM's flat weights follow the new FP16 parameters; tuple outputs."""

    class LM(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(20, 8)
            self.lstm = nn.LSTM(8, 8, batch_first=True)
            self.out = nn.Linear(8, 20)

        def forward(self, tokens):
            h, _ = self.lstm(self.emb(tokens))
            return self.out(h)

    torch.manual_seed(0)
    trainer = MasterWeightTrainer(
        LM(),
        adam(1e-2),
        lambda p, t: F.cross_entropy(p.reshape(-1, 20), t.reshape(-1)),
        scaler=GradScaler(2.0**8),
        trace=True,
    )
    tokens = torch.randint(0, 20, (4, 6), generator=torch.Generator().manual_seed(3))
    losses = [trainer.train_step(tokens[:, :-1], tokens[:, 1:])["loss"] for _ in range(15)]
    assert losses[-1] < losses[0]
    assert trainer.last_trace[2]["dtype"] == "float16"
    assert all(w.dtype == torch.float16 for w in trainer.model.lstm._flat_weights)
    for m, h in zip(trainer.masters, trainer.half_params):
        assert torch.equal(h.detach(), m.detach().half())


# ----------------------------------------------------------------------------------------------------
# Overflow: the step is skipped (§3.2)
# ----------------------------------------------------------------------------------------------------
def test_static_scale_that_overflows_skips_the_step():
    trainer = MasterWeightTrainer(mlp(), adam(), F.cross_entropy, scaler=StaticLossScaler(2.0**40), trace=True)
    before = [m.detach().clone() for m in trainer.masters]
    before_half = [h.detach().clone() for h in trainer.half_params]
    for _ in range(3):
        out = trainer.train_step(*batch())
        assert out["skipped"] is True and out["scale"] == 2.0**40
    fp16_grads = torch.cat([h.grad.flatten() for h in trainer.half_params])
    assert not torch.isfinite(fp16_grads).all()  # FP16 gradients overflowed (max 65504)
    assert all(torch.equal(m, b) for m, b in zip(trainer.masters, before))
    assert all(torch.equal(h, b) for h, b in zip(trainer.half_params, before_half))
    assert len(trainer.optimizer.state) == 0  # Adam never stepped
    assert [rec[2] for rec in trainer.scaler.history] == [True, True, True]


def test_grad_scaler_backs_off_until_the_gradients_fit():
    trainer = MasterWeightTrainer(mlp(), sgd(), F.cross_entropy, scaler=GradScaler(2.0**40))
    before = [m.detach().clone() for m in trainer.masters]
    out = trainer.train_step(*batch())
    assert out == {"loss": out["loss"], "scale": 2.0**40, "skipped": True, "step": 1}
    assert all(torch.equal(m, b) for m, b in zip(trainer.masters, before))
    assert trainer.scaler.get_scale() == 2.0**39
    results = [trainer.train_step(*batch()) for _ in range(40)]
    scales = [r["scale"] for r in results]
    assert scales == sorted(scales, reverse=True)  # only backoffs (growth_interval 2000)
    first_clean = next(i for i, r in enumerate(results) if not r["skipped"])
    assert all(r["skipped"] for r in results[:first_clean]) and not any(r["skipped"] for r in results[first_clean:])
    assert scales[first_clean] * 65504 > 1  # a scale FP16 can carry, well below 2^40
    assert any(not torch.equal(m, b) for m, b in zip(trainer.masters, before))


def _stepped(trainer) -> list:
    """Records, per train_step, whether optimizer.step() really ran (a public post-step hook)."""
    calls = []
    trainer.optimizer.register_step_post_hook(lambda opt, args, kwargs: calls.append(True))
    return calls


@pytest.mark.parametrize("optimizer, clip", [(sgd(momentum=0.9), None), (adam(), 1.0)])
def test_torch_grad_scaler_and_ours_train_bit_identically(optimizer, clip):
    """Only public scaler methods: torch.amp.GradScaler drives the loop as ours does, bit for bit, and
    "skipped" is whether the optimizer step really ran."""
    runs = {}
    for name in ("torch", "mpt_lab"):
        scaler = (
            torch.amp.GradScaler("cpu", init_scale=2.0**40, growth_interval=4)
            if name == "torch"
            else GradScaler(2.0**40, growth_interval=4)
        )
        trainer = MasterWeightTrainer(mlp(), optimizer, F.cross_entropy, scaler=scaler, max_grad_norm=clip)
        stepped = _stepped(trainer)
        outs = []
        for s in range(40):
            before = len(stepped)
            outs.append(trainer.train_step(*batch(seed=s)))
            assert outs[-1]["skipped"] is (len(stepped) == before)
        runs[name] = (outs, [m.detach().clone() for m in trainer.masters], scaler.get_scale())
    (outs_t, masters_t, scale_t), (outs_m, masters_m, scale_m) = runs["torch"], runs["mpt_lab"]
    assert [o["skipped"] for o in outs_t] == [o["skipped"] for o in outs_m]
    assert [o["scale"] for o in outs_t] == [o["scale"] for o in outs_m] and scale_t == scale_m
    assert [o["loss"] for o in outs_t] == [o["loss"] for o in outs_m]
    skipped = [o["skipped"] for o in outs_t]
    assert skipped[0] and not all(skipped)  # overflows first, then trains
    scales = [o["scale"] for o in outs_t]
    assert any(b > a for a, b in zip(scales, scales[1:]))  # and grows again after 4 clean steps
    assert sum(skipped) >= 2
    assert all(torch.equal(a, b) for a, b in zip(masters_t, masters_m))


@pytest.mark.parametrize(
    "make_scaler",
    [
        lambda: StaticLossScaler(2.0**-120),
        lambda: torch.amp.GradScaler("cpu", init_scale=2.0**-120),
        lambda: GradScaler(2.0**-120),
    ],
)
def test_skip_follows_the_scalers_check_on_the_scaled_gradients(make_scaler):
    """With S < 1, finite FP16 gradients can overflow FP32 when divided by S; the scalers check the values
    before dividing (torch's unscale kernel), so they step; "skipped" says what they did."""
    model = nn.Linear(8, 1, bias=False)
    with torch.no_grad():
        model.weight.fill_(2.0**-10)
    x = torch.full((16, 8), 8.0)
    trainer = MasterWeightTrainer(model, sgd(), lambda p, t: 2.0**126 * p.mean(), scaler=make_scaler())
    stepped = _stepped(trainer)
    out = trainer.train_step(x, x[:, :1])
    assert torch.isfinite(trainer.half_params[0].grad).all()  # FP16 gradients: 512, finite
    assert not torch.isfinite(trainer.masters[0].grad).all()  # 512 · 2^120 overflows FP32
    assert out["skipped"] is False and stepped == [True]


def test_disabled_scalers_never_skip():
    for scaler in (GradScaler(enabled=False), torch.amp.GradScaler("cpu", enabled=False)):
        trainer = MasterWeightTrainer(mlp(), sgd(), lambda p, t: 1e9 * F.cross_entropy(p, t), scaler=scaler)
        stepped = _stepped(trainer)
        out = trainer.train_step(*batch())
        assert out["skipped"] is False and out["scale"] == 1.0 and stepped == [True]


def test_without_a_scaler_there_is_no_overflow_check():
    """scaler=None: S = 1 and nothing is skipped (the paper's "mixed precision without loss scaling")."""
    trainer = MasterWeightTrainer(mlp(), sgd(), lambda p, t: 1e9 * F.cross_entropy(p, t))
    out = trainer.train_step(*batch())
    assert out["scale"] == 1.0 and out["skipped"] is False
    assert not all(torch.isfinite(m).all() for m in trainer.masters)  # inf gradients reached the weights


# ----------------------------------------------------------------------------------------------------
# Why FP32 masters: swamping (§3.1)
# ----------------------------------------------------------------------------------------------------
def _regression(seed=0, n=64, d=4):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g)
    w_true = torch.full((d,), 1.1)
    return x, x @ w_true


def _linear_at_one(d=4):
    model = nn.Linear(d, 1, bias=False)
    with torch.no_grad():
        model.weight.fill_(1.0)
    return model


def mse(p, t):
    return F.mse_loss(p.squeeze(-1), t)


def test_swamping_fp32_masters_keep_learning_fp16_weights_stall():
    """Weights 1.0, lr·grad ≈ 1e-4: below half an FP16 ulp of 1.0 (2⁻¹¹ ≈ 4.9e-4 upwards)."""
    x, y = _regression()
    lr, steps = 5e-4, 400
    # contrast: the FP16 weights updated directly (a plain .half() model + SGD)
    plain = _linear_at_one().half()
    opt = torch.optim.SGD(plain.parameters(), lr=lr)
    plain_losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = mse(plain(x.half()).float(), y)
        loss.backward()
        assert 0 < lr * plain.weight.grad.float().abs().max() < 2.0**-11  # below half an ulp of 1.0
        opt.step()
        plain_losses.append(loss.item())
    assert torch.equal(plain.weight.detach(), torch.ones(1, 4, dtype=torch.float16))  # never moved
    assert plain_losses[-1] == plain_losses[0]

    trainer = MasterWeightTrainer(_linear_at_one(), sgd(lr), mse, scaler=StaticLossScaler(1024.0))
    losses = [trainer.train_step(x, y)["loss"] for _ in range(steps)]
    assert losses[-1] < 0.75 * losses[0]  # learned: the masters accumulate the small updates
    assert trainer.masters[0].min() > 1.02  # moved by ≈ 0.03, i.e. hundreds of sub-ulp updates
    assert not torch.equal(trainer.half_params[0].detach(), torch.ones(1, 4, dtype=torch.float16))


# ----------------------------------------------------------------------------------------------------
# Why loss scaling: gradients below 2⁻²⁴ (§3.2)
# ----------------------------------------------------------------------------------------------------
def test_loss_scaling_recovers_gradients_below_fp16_range():
    x, y = _regression(n=16)
    tiny = 2.0**-30  # scales the loss (and every gradient) far below FP16's smallest subnormal, 2⁻²⁴

    def tiny_mse(p, t):
        return tiny * mse(p, t)

    # the FP32 reference gradient of the first step
    ref = _linear_at_one()
    tiny_mse(ref(x), y).backward()
    g_ref = ref.weight.grad.clone()
    assert 0 < g_ref.abs().max() < 2.0**-24

    lr = 2.0**30 * 1e-2
    unscaled = MasterWeightTrainer(_linear_at_one(), sgd(lr), tiny_mse, scaler=StaticLossScaler(1.0))
    first = unscaled.train_step(x, y)
    assert torch.count_nonzero(unscaled.half_params[0].grad) == 0  # underflow: all FP16 gradients are 0
    for _ in range(19):
        unscaled.train_step(x, y)
    assert torch.equal(unscaled.masters[0], torch.ones(1, 4))  # no progress at all

    scaled = MasterWeightTrainer(_linear_at_one(), sgd(lr), tiny_mse, scaler=StaticLossScaler(2.0**24))
    out = scaled.train_step(x, y)
    assert out["scale"] == 2.0**24 and not out["skipped"]
    assert torch.allclose(scaled.masters[0].grad, g_ref, rtol=1e-2, atol=0)  # recovered to ~FP16 precision
    losses = [scaled.train_step(x, y)["loss"] for _ in range(19)]
    assert losses[-1] < 0.5 * first["loss"]


# ----------------------------------------------------------------------------------------------------
# Against torch.autocast + torch.amp.GradScaler on real data
# ----------------------------------------------------------------------------------------------------
def test_trains_digits_like_autocast():
    """An MLP on scikit-learn's digits, same init, data order, optimizer and loss-scale settings.

    Tolerance: final held-out loss within 0.02 and accuracy within 2 points.  The two are different
    algorithms: autocast keeps FP32 weights and casts them to FP16 per op (and runs some ops, e.g.
    softmax or norms, in FP32); ours keeps a full FP16 copy and runs every op of the model in FP16.  For
    Linear + ReLU the FP16 ops coincide (the per-op cast of the FP32 weights is exactly our FP16 copy),
    so here the two agree to the last bit on this machine; the tolerance allows for other kernels.
    """
    load_digits = pytest.importorskip("sklearn.datasets").load_digits
    digits = load_digits()
    X = torch.tensor(digits.data, dtype=torch.float32) / 16.0
    y = torch.tensor(digits.target)
    perm = torch.randperm(len(X), generator=torch.Generator().manual_seed(0))
    train, test = perm[:1437], perm[1437:]
    torch.manual_seed(0)
    base = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))
    epochs, bs, lr = 10, 32, 0.1
    orders = [
        train[torch.randperm(len(train), generator=torch.Generator().manual_seed(100 + e))] for e in range(epochs)
    ]
    batches = [(X[o[i : i + bs]], y[o[i : i + bs]]) for o in orders for i in range(0, len(o), bs)]

    # ours
    trainer = MasterWeightTrainer(
        copy.deepcopy(base), lambda p: torch.optim.SGD(p, lr=lr, momentum=0.9), F.cross_entropy, scaler=GradScaler()
    )
    skipped = sum(trainer.train_step(xb, yb)["skipped"] for xb, yb in batches)
    pred = trainer.predict(X[test])
    ours_loss, ours_acc = F.cross_entropy(pred, y[test]).item(), (pred.argmax(1) == y[test]).float().mean().item()

    # torch.autocast + torch.amp.GradScaler
    model = copy.deepcopy(base)
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    scaler = torch.amp.GradScaler("cpu")
    for xb, yb in batches:
        opt.zero_grad()
        with torch.autocast("cpu", dtype=torch.float16):
            out = model(xb)
        scaler.scale(F.cross_entropy(out.float(), yb)).backward()
        scaler.step(opt)
        scaler.update()
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.float16):
        pred_ac = model(X[test]).float()
    ac_loss, ac_acc = F.cross_entropy(pred_ac, y[test]).item(), (pred_ac.argmax(1) == y[test]).float().mean().item()

    assert skipped == 0 and trainer.scaler.get_scale() == scaler.get_scale()
    assert ours_acc > 0.95 and ac_acc > 0.95
    assert abs(ours_loss - ac_loss) <= 0.02, (ours_loss, ac_loss)
    assert abs(ours_acc - ac_acc) <= 0.02, (ours_acc, ac_acc)
    max_diff = max((m - p).abs().max().item() for m, p in zip(trainer.masters, model.parameters()))
    assert max_diff < 1e-2


# ----------------------------------------------------------------------------------------------------
# Memory per parameter
# ----------------------------------------------------------------------------------------------------
def test_memory_per_parameter_with_adam():
    trainer = MasterWeightTrainer(mlp(d_in=32, hidden=64, d_out=10), adam(), F.cross_entropy, scaler=GradScaler(2.0**8))
    before = trainer.memory_per_parameter()
    assert before["optimizer_state"] == 0  # Adam creates its state at the first step
    trainer.train_step(*batch(d_in=32, classes=10))
    mem = trainer.memory_per_parameter()
    n = 32 * 64 + 64 + 64 * 10 + 10
    assert mem["parameters"] == n
    assert (mem["fp32_master_weights"], mem["fp16_weights"], mem["fp16_gradients"], mem["fp32_gradients"]) == (
        4.0,
        2.0,
        2.0,
        4.0,
    )
    # exp_avg + exp_avg_sq (float32) and one 0-dim float32 'step' per parameter tensor
    assert mem["optimizer_state"] == pytest.approx(8.0 + 4 * 4 / n)
    assert mem["total"] == pytest.approx(20.0 + 16 / n)

    plain = MasterWeightTrainer(mlp(), sgd(), F.cross_entropy)
    plain.train_step(*batch())
    assert plain.memory_per_parameter()["optimizer_state"] == 0.0
    momentum = MasterWeightTrainer(mlp(), sgd(momentum=0.9), F.cross_entropy)
    momentum.train_step(*batch())
    assert momentum.memory_per_parameter()["optimizer_state"] == 4.0


# ----------------------------------------------------------------------------------------------------
# Checkpoints
# ----------------------------------------------------------------------------------------------------
def _trainer_for_checkpoint(model):
    return MasterWeightTrainer(model, adam(2e-2), F.cross_entropy, scaler=GradScaler(2.0**20, growth_interval=2))


def test_state_dict_round_trip_continues_identically():
    base = mlp(seed=5)
    data = [batch(seed=s) for s in range(10)]
    first = _trainer_for_checkpoint(copy.deepcopy(base))
    for xb, yb in data[:5]:
        first.train_step(xb, yb)
    saved = copy.deepcopy(first.state_dict())
    assert all(m.dtype == torch.float32 for m in saved["masters"])
    rest_a = [first.train_step(xb, yb) for xb, yb in data[5:]]

    second = _trainer_for_checkpoint(mlp(seed=99))  # other initial weights: all must come from the checkpoint
    second.load_state_dict(saved)
    assert second.steps == 5
    for m, h in zip(second.masters, second.half_params):
        assert torch.equal(h.detach(), m.detach().half())
    rest_b = [second.train_step(xb, yb) for xb, yb in data[5:]]
    assert rest_a == rest_b  # losses, scales, skips, step counts
    assert all(torch.equal(a, b) for a, b in zip(first.masters, second.masters))
    assert first.scaler.state_dict() == second.scaler.state_dict()


def test_load_state_dict_rejects_mismatched_masters():
    trainer = MasterWeightTrainer(mlp(), sgd(), F.cross_entropy)
    other = MasterWeightTrainer(mlp(d_in=5), sgd(), F.cross_entropy)
    with pytest.raises(ValueError, match="shape"):
        trainer.load_state_dict(other.state_dict())
    state = trainer.state_dict()
    state["masters"] = state["masters"][:2]
    with pytest.raises(ValueError, match="masters"):
        trainer.load_state_dict(state)
    with pytest.raises(TypeError, match="state_dict"):
        trainer.load_state_dict([1, 2])


# ----------------------------------------------------------------------------------------------------
# Bad arguments
# ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "kwargs, error, name",
    [
        (dict(model="not a model"), TypeError, "model"),
        (dict(optimizer=3), TypeError, "optimizer"),
        (dict(optimizer=lambda p: "nope"), TypeError, "optimizer"),
        (dict(loss_fn=None), TypeError, "loss_fn"),
        (dict(scaler=object()), TypeError, "scaler"),
        (dict(scaler=2.0), TypeError, "scaler"),
        (dict(half_dtype="float16"), TypeError, "half_dtype"),
        (dict(half_dtype=torch.float32), ValueError, "half_dtype"),
        (dict(trace=1), TypeError, "trace"),
        (dict(max_grad_norm="1"), TypeError, "max_grad_norm"),
        (dict(max_grad_norm=0.0), ValueError, "max_grad_norm"),
    ],
)
def test_bad_arguments(kwargs, error, name):
    args = dict(model=mlp(), optimizer=sgd(), loss_fn=F.cross_entropy)
    args.update(kwargs)
    model, optimizer, loss_fn = args.pop("model"), args.pop("optimizer"), args.pop("loss_fn")
    with pytest.raises(error, match=name):
        MasterWeightTrainer(model, optimizer, loss_fn, **args)


def test_bad_optimizers_and_models():
    half_model = mlp().half()
    with pytest.raises(ValueError, match="optimizer"):  # built over FP16 parameters
        MasterWeightTrainer(half_model, torch.optim.SGD(half_model.parameters(), lr=0.1), F.cross_entropy)
    model = mlp()
    with pytest.raises(ValueError, match="optimizer"):  # over tensors that are not the model's
        MasterWeightTrainer(model, torch.optim.SGD(mlp().parameters(), lr=0.1), F.cross_entropy)
    model = mlp()
    with pytest.raises(ValueError, match="optimizer"):  # misses a trainable parameter
        MasterWeightTrainer(model, torch.optim.SGD(model[0].parameters(), lr=0.1), F.cross_entropy)
    frozen = mlp().requires_grad_(False)
    with pytest.raises(ValueError, match="model"):
        MasterWeightTrainer(frozen, sgd(), F.cross_entropy)
    trainer = MasterWeightTrainer(mlp(), sgd(), lambda p, t: p)  # not a scalar loss
    with pytest.raises(ValueError, match="loss_fn"):
        trainer.train_step(*batch())


def test_half_model_gets_fp32_masters_and_frozen_parameters_are_only_cast():
    model = mlp().half()
    model[0].bias.requires_grad_(False)
    trainer = MasterWeightTrainer(model, sgd(), F.cross_entropy, max_grad_norm=1.0)
    assert len(trainer.masters) == 3 and all(m.dtype == torch.float32 for m in trainer.masters)
    assert model[0].bias.dtype == torch.float16 and not model[0].bias.requires_grad
    bias = model[0].bias.detach().clone()
    trainer.train_step(*batch())
    assert torch.equal(model[0].bias, bias)
    total = torch.linalg.vector_norm(torch.cat([m.grad.flatten() for m in trainer.masters]))
    assert total <= 1.0 + 1e-5


def test_casting_the_scaled_loss_to_fp16_changes_no_gradient():
    """Step 5 in its naive variant (scaled loss cast to FP16, inf when loss·S > 65504) and as frameworks do it
    (kept in FP32, the default) give bit-identical gradients and updates: the derivative of a cast is 1."""
    torch.manual_seed(0)
    base = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    x, y = torch.randn(8, 16), torch.randint(0, 4, (8,))  # loss ≈ 1.4: loss × 2^16 overflows FP16
    runs = {}
    for cast in (True, False):
        t = MasterWeightTrainer(
            copy.deepcopy(base),
            lambda p: torch.optim.SGD(p, lr=0.01),
            nn.functional.cross_entropy,
            scaler=GradScaler(init_scale=2.0**16),
            trace=True,
            cast_scaled_loss=cast,
        )
        out = t.train_step(x, y)
        runs[cast] = (out, [m.detach().clone() for m in t.masters], t.last_trace)
    (out_paper, w_paper, tr_paper), (out_fw, w_fw, tr_fw) = runs[True], runs[False]
    assert out_paper["loss"] * 2.0**16 > 65504  # the cast scaled loss is inf in FP16 ...
    assert out_paper == out_fw and not out_paper["skipped"]  # ... and nothing else changes
    assert all(torch.equal(a, b) for a, b in zip(w_paper, w_fw))
    step5 = {r["step"]: r for r in tr_paper}[5], {r["step"]: r for r in tr_fw}[5]
    assert (step5[0]["dtype"], step5[1]["dtype"]) == ("float16", "float32")
    assert "naive" in step5[0]["name"] and "as frameworks do" in step5[1]["name"]
    # the default is what frameworks do
    default = MasterWeightTrainer(
        copy.deepcopy(base),
        lambda p: torch.optim.SGD(p, lr=0.01),
        nn.functional.cross_entropy,
        scaler=GradScaler(init_scale=2.0**16),
        trace=True,
    )
    assert default.cast_scaled_loss is False
    assert default.train_step(x, y) == out_fw and {r["step"]: r for r in default.last_trace}[5]["dtype"] == "float32"
    with pytest.raises(TypeError, match="cast_scaled_loss"):
        MasterWeightTrainer(
            copy.deepcopy(base),
            lambda p: torch.optim.SGD(p, lr=0.01),
            nn.functional.cross_entropy,
            cast_scaled_loss="yes",
        )


# ------------------------------------------------------------------------------- the swamping rule, written once
def test_swamped_fraction():
    from mpt_lab.master_weights import swamped_fraction

    w = torch.tensor([1.0, 1.0, 1.0, 1024.0, 1025.0])
    u = torch.tensor(
        [2.0**-11, 2.0**-10, 0.0, 0.5, 0.5]
    )  # tie (lost), survives, zero (ignored), tie to even (lost), survives
    assert swamped_fraction(w, u) == 2 / 4
    assert math.isnan(swamped_fraction(w, torch.zeros(5)))
    with pytest.raises(ValueError):
        swamped_fraction(w, torch.zeros(3))
    with pytest.raises(TypeError):
        swamped_fraction([1.0], [1.0])
    with pytest.raises(ValueError, match="52 mantissa bits"):
        swamped_fraction(w, u, "FP64")


def test_swamped_is_exact_where_a_float64_sum_would_round_twice():
    """round(w + u) == w judged on the exact sum: updates a hair (2⁻⁵⁰ relative) above and below half the gap to
    the neighbour, whose float64 sum lands on the FP16 midpoint, against exact rational arithmetic (Fractions)."""
    from fractions import Fraction

    import numpy as np

    from mpt_lab import formats
    from mpt_lab.master_weights import swamped

    ws, us = [], []
    for w in (1.0, 1.0 + 2.0**-10, 1024.0, 1025.0, -3.0, 2.0**-14, -(2.0**-15), 3 * 2.0**-24, 65504.0):
        for direction in (np.inf, -np.inf):
            gap = abs(float(np.nextafter(np.float16(w), np.float16(direction))) - w)
            if not np.isfinite(gap):  # above FP16's largest value: no neighbour
                continue
            for factor in (1.0, 1 + 2.0**-50, 1 - 2.0**-50, 0.5, 3.0):
                ws.append(w)
                us.append(np.sign(direction) * gap / 2 * factor)
    w, u = torch.tensor(ws, dtype=torch.float64), torch.tensor(us, dtype=torch.float64)
    exact = [formats.round_to(Fraction(a) + Fraction(b), "FP16") == a for a, b in zip(ws, us)]
    assert swamped(w, u, "FP16").tolist() == exact
    naive = (formats.round_to(w + u, "FP16") == w).tolist()  # the sum rounded to float64 first
    assert naive != exact  # the cases do catch a double rounding
