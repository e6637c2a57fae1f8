"""mpt_lab.scaling against torch.amp.GradScaler: bit-identical trajectories, stage rules, synchronisations.

CPU only.  The oracle is torch's own GradScaler("cpu") (and its fused kernels for the two numerical rules).
"""

from __future__ import annotations

import copy
import io
import json
import math
import pickle

import numpy as np
import pytest
import torch
from conftest import load_benchmark
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from mpt_lab.scaling import GradScaler, OptState, StaticLossScaler, _f32, _update_rule, _update_scale, found_non_finite

INF, NAN = float("inf"), float("nan")


def bits(t: torch.Tensor) -> torch.Tensor:
    """Integer view of a float tensor, so that equality is bit equality (NaN payloads, signed zeros)."""
    view = {
        torch.float64: torch.int64,
        torch.float32: torch.int32,
        torch.bfloat16: torch.int16,
        torch.float16: torch.int16,
    }[t.dtype]
    return t.detach().contiguous().view(view)


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(bits(a), bits(b))


# ------------------------------------------------------------------------------------------------------
# A tiny model with FP16 autocast (so that large scales overflow naturally), a bfloat16 parameter (a
# second gradient dtype) and two optimizers.
# ------------------------------------------------------------------------------------------------------
class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.l1 = nn.Linear(8, 16)
        self.l2 = nn.Linear(16, 4)
        self.gain = nn.Parameter(torch.ones(4, dtype=torch.bfloat16))

    def forward(self, x):
        with torch.autocast("cpu", dtype=torch.float16):
            out = self.l2(torch.tanh(self.l1(x)))
        return out.float() * self.gain.float()


def make_setup(seed=0):
    torch.manual_seed(seed)
    model = Tiny()
    opt1 = torch.optim.SGD(model.l1.parameters(), lr=0.05, momentum=0.9)
    opt2 = torch.optim.Adam(list(model.l2.parameters()) + [model.gain], lr=1e-3)
    return model, opt1, opt2


def make_data(n, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 16, 8, generator=g), torch.randn(n, 16, 4, generator=g)


# step -> how the overflow is injected (consecutive ones included)
INJECT = {
    5: "loss_inf",
    6: "loss_inf",
    7: "loss_nan",
    120: "nan_opt2",
    121: "inf_opt1",
    122: "nan_opt2",
    400: "inf_bf16",
    401: "loss_inf",
    999: "loss_inf",
    1000: "nan_opt2",
    1500: "inf_opt1",
    1501: "inf_opt1",
    1502: "inf_opt1",
    1503: "inf_opt1",
    1777: "inf_bf16",
}


def iteration(i, model, opt1, opt2, scaler, X, Y):
    """One training iteration with overflow injection, clipping after unscale_, two optimizers."""
    opt1.zero_grad()
    opt2.zero_grad()
    loss = ((model(X[i]) - Y[i]) ** 2).mean()
    kind = INJECT.get(i)
    if kind == "loss_inf":
        loss = loss * INF
    elif kind == "loss_nan":
        loss = loss * NAN
    scaler.scale(loss).backward()
    if kind == "nan_opt2":
        model.l2.weight.grad[1, 2] = NAN
    elif kind == "inf_opt1":
        model.l1.bias.grad[3] = -INF
    elif kind == "inf_bf16":
        model.gain.grad[1] = INF
    if i % 2 == 0:  # unscale both, clip each optimizer's gradients (one norm over both would carry a NaN
        scaler.unscale_(opt1)  # of opt2 into opt1's gradients after opt1's inf check)
        scaler.unscale_(opt2)
        torch.nn.utils.clip_grad_norm_(model.l1.parameters(), 0.5)
        torch.nn.utils.clip_grad_norm_(list(model.l2.parameters()) + [model.gain], 0.5)
    elif i % 3 == 1:  # unscale one of them and clip its gradients; step() unscales the other
        scaler.unscale_(opt1)
        torch.nn.utils.clip_grad_norm_(model.l1.parameters(), 0.25)
    r1 = scaler.step(opt1)
    r2 = scaler.step(opt2)
    scaler.update()
    return r1, r2


def torch_found_inf(scaler) -> bool:
    return bool(
        sum(v.item() for st in scaler._per_optimizer_states.values() for v in st["found_inf_per_device"].values())
    )


def test_side_by_side_with_torch_2000_steps():
    n = 2100
    X, Y = make_data(n)
    model_a, a1, a2 = make_setup()
    model_b = copy.deepcopy(model_a)
    b1 = torch.optim.SGD(model_b.l1.parameters(), lr=0.05, momentum=0.9)
    b2 = torch.optim.Adam(list(model_b.l2.parameters()) + [model_b.gain], lr=1e-3)
    ours = GradScaler(init_scale=2.0**10, growth_interval=50)
    theirs = torch.amp.GradScaler("cpu", init_scale=2.0**10, growth_interval=50)

    expected_history, growths, overflows = [], 0, 0
    prev = theirs.get_scale()
    for i in range(n):
        scale_used = theirs.get_scale()
        ra = iteration(i, model_a, a1, a2, ours, X, Y)
        rb, found = _torch_iteration_with_found(i, model_b, b1, b2, theirs, X, Y)  # also torch's found_inf
        expected_history.append((i, scale_used, found))
        assert ra == rb
        assert ours.get_scale() == theirs.get_scale(), i
        assert ours._get_growth_tracker() == theirs._get_growth_tracker(), i
        for (name, p), q in zip(model_a.named_parameters(), model_b.parameters()):
            assert same_bits(p, q), (i, name)
        growths += theirs.get_scale() > prev
        overflows += found
        prev = theirs.get_scale()

    # the run really exercised the rules: many growths, injected and natural overflows
    assert growths >= 20, growths
    assert overflows > len(INJECT), overflows
    # optimizer states (momentum, Adam moments and steps) agree too
    for oa, ob in ((a1, b1), (a2, b2)):
        for sa, sb in zip(oa.state.values(), ob.state.values()):
            for k in sa:
                assert same_bits(sa[k].float(), sb[k].float()), k
    # history: one record per update, the scale used in that iteration and whether it overflowed
    assert ours.history == expected_history
    # reading it back is a single transfer even though it spans several packed chunks
    with SyncCounter() as c:
        assert len(ours.history) == n
    assert c.count <= 1


def _torch_iteration_with_found(i, model, opt1, opt2, scaler, X, Y):
    """``iteration`` for torch's scaler, also returning its combined found_inf (read before update)."""
    real_update = scaler.update
    seen = {}

    def update(*a, **k):
        seen["found"] = torch_found_inf(scaler)
        return real_update(*a, **k)

    scaler.update = update
    try:
        r = iteration(i, model, opt1, opt2, scaler, X, Y)
    finally:
        del scaler.update
    return r, seen["found"]


def test_side_by_side_non_power_of_two_factors():
    """Scales that are not powers of two: 1/S and S·factor are rounded, and must be rounded like torch."""
    n = 400
    X, Y = make_data(n, seed=7)
    kw = dict(init_scale=1000.0, growth_factor=3.0, backoff_factor=0.3, growth_interval=7)
    model, o1, o2 = make_setup(seed=8)
    ours = _run(model, o1, o2, GradScaler(**kw), X, Y, range(n))
    model, o1, o2 = make_setup(seed=8)
    theirs = _run(model, o1, o2, torch.amp.GradScaler("cpu", **kw), X, Y, range(n))
    assert len({s for s, _ in ours}) > 10
    for i, ((s_a, p_a), (s_b, p_b)) in enumerate(zip(ours, theirs)):
        assert s_a == s_b, i
        assert all(same_bits(a, b) for a, b in zip(p_a, p_b)), i


# ------------------------------------------------------------------------------------------------------
# Checkpoints move between ours and torch's in both directions
# ------------------------------------------------------------------------------------------------------
def _run(model, o1, o2, scaler, X, Y, steps):
    traj = []
    for i in steps:
        iteration(i, model, o1, o2, scaler, X, Y)
        traj.append((scaler.get_scale(), [p.detach().clone() for p in model.parameters()]))
    return traj


@pytest.mark.parametrize("direction", ["ours->torch", "torch->ours", "ours->ours"])
@pytest.mark.parametrize("k", [137, 122])  # mid growth interval; just after consecutive overflows
def test_resume_from_checkpoint(direction, k):
    n = 260
    X, Y = make_data(n, seed=2)
    make = {
        "ours": lambda: GradScaler(init_scale=2.0**12, growth_interval=9),
        "torch": lambda: torch.amp.GradScaler("cpu", init_scale=2.0**12, growth_interval=9),
    }
    src, dst = direction.split("->")

    # uninterrupted reference run with the source scaler
    model, o1, o2 = make_setup(seed=3)
    ref = _run(model, o1, o2, make[src](), X, Y, range(n))

    # run to k with the source, checkpoint through bytes, resume with the destination
    model, o1, o2 = make_setup(seed=3)
    scaler = make[src]()
    _run(model, o1, o2, scaler, X, Y, range(k))
    buf = io.BytesIO()
    torch.save(
        {"model": model.state_dict(), "o1": o1.state_dict(), "o2": o2.state_dict(), "scaler": scaler.state_dict()}, buf
    )
    buf.seek(0)
    ckpt = torch.load(buf)
    assert set(ckpt["scaler"]) == {"scale", "growth_factor", "backoff_factor", "growth_interval", "_growth_tracker"}
    model, o1, o2 = make_setup(seed=99)  # different initial values: everything must come from the file
    model.load_state_dict(ckpt["model"])
    o1.load_state_dict(ckpt["o1"])
    o2.load_state_dict(ckpt["o2"])
    resumed = make[dst]()
    resumed.load_state_dict(ckpt["scaler"])
    assert resumed.state_dict() == ckpt["scaler"]
    got = _run(model, o1, o2, resumed, X, Y, range(k, n))

    for j, ((s_ref, p_ref), (s_got, p_got)) in enumerate(zip(ref[k:], got)):
        assert s_ref == s_got, k + j
        assert all(same_bits(a, b) for a, b in zip(p_ref, p_got)), k + j
    # the checkpoint carried a growth tracker in the middle of an interval, or right after a backoff
    assert (ckpt["scaler"]["_growth_tracker"] == 0) == (k == 122)


# ------------------------------------------------------------------------------------------------------
# The two numerical rules, against torch's fused kernels
# ------------------------------------------------------------------------------------------------------
def test_update_rule_bit_identical_to_torch_kernel():
    g = torch.Generator().manual_seed(0)
    scales = torch.cat(
        [
            torch.tensor([1.0, 2.0**16, 3.0e38, 2.0**127, 1.7e38, 1e-45, 1e-38, 0.0, INF, NAN, 12345.678]),
            torch.exp2(torch.randn(40, generator=g) * 40),
        ]
    ).float()
    for growth_factor in (2.0, 1.5, 1.0001, 3.7, 65536.0):
        for backoff_factor in (0.5, 0.3, 0.999, 1e-3, 0.1):
            for interval in (1, 2, 7, 2000):
                for tracker in sorted({0, interval - 1, interval, interval + 5}):
                    for found in (0.0, 1.0, 2.0):
                        # torch's kernel takes 0-dim tensors; ours is elementwise: all scales at once
                        s_ref, t_ref = scales.clone(), torch.full_like(scales, tracker, dtype=torch.int32)
                        for j in range(len(scales)):
                            torch._amp_update_scale_(
                                s_ref[j], t_ref[j], torch.tensor(found), growth_factor, backoff_factor, interval
                            )
                        # the tensor version (device path)
                        s_new, t_new = _update_scale(
                            scales.clone(),
                            torch.full_like(t_ref, tracker),
                            torch.tensor(found != 0),
                            growth_factor,
                            backoff_factor,
                            interval,
                        )
                        assert same_bits(s_new, s_ref), (growth_factor, backoff_factor, tracker, found)
                        assert t_new.dtype == torch.int32 and torch.equal(t_new, t_ref)
                        # the Python version (host path)
                        host = [
                            _update_rule(v, tracker, found != 0, growth_factor, backoff_factor, interval)
                            for v in scales.tolist()
                        ]
                        assert same_bits(torch.tensor([v for v, _ in host], dtype=torch.float32), s_ref)
                        assert [t for _, t in host] == t_ref.tolist()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_unscale_bit_identical_to_torch_kernel(dtype):
    g = torch.Generator().manual_seed(1)
    inv_scales = [1.0, 2.0**-16, 0.5, 3.0, 2.0**20, 0.0] + torch.exp2(torch.randn(10, generator=g) * 20).tolist()
    for inject in (None, INF, -INF, NAN):
        for inv in inv_scales:
            grads = [
                torch.randn(5, 7, generator=g) * 1e3,
                torch.randn(11, generator=g),
                torch.empty(0),
                torch.tensor([3.0e38, -3.0e38, 1e-40]),
            ]
            grads = [t.to(dtype) for t in grads]
            if inject is not None:
                grads[1][4] = inject
            inv_t = torch.tensor(inv, dtype=torch.float32)
            ref = [t.clone() for t in grads]
            found_ref = torch.zeros(())
            torch._amp_foreach_non_finite_check_and_unscale_(ref, found_ref, inv_t)
            ours = [t.clone() for t in grads]
            found = found_non_finite(ours, torch.device("cpu"))
            torch._foreach_mul_(ours, inv_t)
            assert found.dtype == torch.bool and found.item() == bool(found_ref), (inject, inv)
            for a, b in zip(ours, ref):
                assert same_bits(a, b), (inject, inv)


# ------------------------------------------------------------------------------------------------------
# Stage rules and their errors (same messages as torch)
# ------------------------------------------------------------------------------------------------------
def _one_param_problem(dtype=torch.float32):
    torch.manual_seed(0)
    p = nn.Parameter(torch.randn(3, dtype=dtype))
    return p, torch.optim.SGD([p], lr=0.1)


def _scaled_backward(scaler, p, factor=1.0):
    scaler.scale((p.float() ** 2).sum() * factor).backward()


def _misuse(case, scaler):
    p, opt = _one_param_problem()
    if case == "unscale twice":
        _scaled_backward(scaler, p)
        scaler.unscale_(opt)
        scaler.unscale_(opt)
    elif case == "unscale after step":
        _scaled_backward(scaler, p)
        scaler.step(opt)
        scaler.unscale_(opt)
    elif case == "step twice":
        _scaled_backward(scaler, p)
        scaler.step(opt)
        scaler.step(opt)
    elif case == "step without scale":
        (p**2).sum().backward()
        scaler.step(opt)
    elif case == "unscale without scale":
        (p**2).sum().backward()
        scaler.unscale_(opt)
    elif case == "update without scale":
        scaler.update()
    elif case == "update without inf checks":
        _scaled_backward(scaler, p)
        scaler.update()
    elif case == "step without gradients":
        scaler.scale(torch.ones(()))
        scaler.step(opt)
    elif case == "closure":
        _scaled_backward(scaler, p)
        scaler.step(opt, closure=lambda: None)


CASES = [
    "unscale twice",
    "unscale after step",
    "step twice",
    "step without scale",
    "unscale without scale",
    "update without scale",
    "update without inf checks",
    "step without gradients",
    "closure",
]


@pytest.mark.parametrize("case", CASES)
def test_stage_errors_match_torch(case):
    with pytest.raises((RuntimeError, AssertionError)) as theirs:
        _misuse(case, torch.amp.GradScaler("cpu"))
    with pytest.raises(RuntimeError) as ours:
        _misuse(case, GradScaler())
    assert str(ours.value) == str(theirs.value)
    if theirs.type is RuntimeError:
        assert ours.type is RuntimeError
    # the static scaler follows the same stage rules
    with pytest.raises(RuntimeError) as static:
        _misuse(case, StaticLossScaler(1024.0))
    assert str(static.value) == str(theirs.value)


def test_stages_progress_and_reset_after_update():
    p, opt = _one_param_problem()
    scaler = GradScaler()
    _scaled_backward(scaler, p)
    assert scaler._state(opt)["stage"] is OptState.READY
    scaler.unscale_(opt)
    assert scaler._state(opt)["stage"] is OptState.UNSCALED
    scaler.step(opt)
    assert scaler._state(opt)["stage"] is OptState.STEPPED
    scaler.update()
    assert scaler._per_optimizer_states == {}
    opt.zero_grad()
    _scaled_backward(scaler, p)
    scaler.unscale_(opt)  # allowed again
    scaler.step(opt)
    scaler.update()


def test_inf_check_is_on_the_scaled_gradients_like_torch():
    """With S < 1, a finite scaled gradient can overflow when divided by S: torch checks *before*
    unscaling, so that step is not skipped (and writes inf into the weights).  Ours does the same."""
    results = []
    for scaler in (
        GradScaler(init_scale=2.0**-20, growth_interval=1),
        torch.amp.GradScaler("cpu", init_scale=2.0**-20, growth_interval=1),
    ):
        p, opt = _one_param_problem()
        scaler.scale((p * 1e20).sum() * 1e20).backward()  # scaled gradient 1e40·2^-20 ≈ 1e34: finite
        assert torch.isfinite(p.grad).all()
        scaler.step(opt)  # unscaled: 1e40 = inf in float32
        scaler.update()
        results.append((p.detach().clone(), scaler.get_scale(), scaler._get_growth_tracker()))
    (p_ours, s_ours, t_ours), (p_torch, s_torch, t_torch) = results
    assert same_bits(p_ours, p_torch) and (s_ours, t_ours) == (s_torch, t_torch)
    assert s_ours == 2.0**-19 and torch.isinf(p_ours).all()  # a "clean" step: S grew, weights are inf


def test_fp16_gradients_refused_like_torch():
    for make in (GradScaler, lambda: StaticLossScaler(8.0), lambda: torch.amp.GradScaler("cpu")):
        scaler = make()
        p, opt = _one_param_problem(torch.float16)
        _scaled_backward(scaler, p)
        before = p.grad.clone()
        with pytest.raises(ValueError, match="Attempting to unscale FP16 gradients"):
            scaler.unscale_(opt)
        assert torch.equal(p.grad, before)  # nothing was unscaled ...
        with pytest.raises(ValueError, match="Attempting to unscale FP16 gradients"):
            scaler.step(opt)  # ... and the stage is still READY (not "already unscaled")
        assert torch.equal(p.grad, before)


def test_fp16_gradients_refused_even_beside_fp32_ones():
    p32, _ = _one_param_problem()
    p16 = nn.Parameter(torch.ones(2, dtype=torch.float16))
    opt = torch.optim.SGD([p32, p16], lr=0.1)
    scaler = GradScaler()
    scaler.scale((p32**2).sum() + p16.float().sum()).backward()
    g32 = p32.grad.clone()
    with pytest.raises(ValueError):
        scaler.unscale_(opt)
    assert torch.equal(p32.grad, g32)


# ------------------------------------------------------------------------------------------------------
# Disabled scaler: every method is a pass-through
# ------------------------------------------------------------------------------------------------------
class Returning(torch.optim.SGD):
    def step(self, *args, **kwargs):
        super().step()
        return ("stepped", args, tuple(sorted(kwargs)))


def test_disabled_is_a_pass_through():
    for scaler in (GradScaler(enabled=False), torch.amp.GradScaler("cpu", enabled=False)):
        p, _ = _one_param_problem()
        opt = Returning([p], lr=0.1)
        loss = (p**2).sum()
        assert scaler.scale(loss) is loss
        nested = [loss, (loss,)]
        assert scaler.scale(nested) is nested
        loss.backward()
        g = p.grad.clone()
        scaler.unscale_(opt)
        scaler.unscale_(opt)  # no stage rules either
        assert torch.equal(p.grad, g)
        before = p.detach().clone()
        assert scaler.step(opt, 1, closure=None) == ("stepped", (1,), ("closure",))
        assert not torch.equal(p, before)
        scaler.step(opt)
        scaler.update()
        scaler.update(new_scale=3.0)
        assert scaler.get_scale() == 1.0
        assert scaler.state_dict() == {}
        scaler.load_state_dict({})
        assert not scaler.is_enabled()
    assert GradScaler(enabled=False).history == []


def test_step_returns_optimizer_result_or_none_when_skipped():
    for scaler in (GradScaler(), torch.amp.GradScaler("cpu")):
        p, _ = _one_param_problem()
        opt = Returning([p], lr=0.1)
        _scaled_backward(scaler, p)
        assert scaler.step(opt, 7, foo=1) == ("stepped", (7,), ("foo",))
        scaler.update()
        opt.zero_grad()
        _scaled_backward(scaler, p, INF)
        before = p.detach().clone()
        assert scaler.step(opt) is None
        assert torch.equal(p, before)
        scaler.update()


# ------------------------------------------------------------------------------------------------------
# Growth never reaches infinity; the growth tracker follows torch's rule
# ------------------------------------------------------------------------------------------------------
def _clean_iterations(scaler, n, factor=1.0):
    p, opt = _one_param_problem()
    out = []
    for _ in range(n):
        opt.zero_grad()
        _scaled_backward(scaler, p, factor)
        scaler.step(opt)
        scaler.update()
        out.append((scaler.get_scale(), scaler._get_growth_tracker()))
    return out


@pytest.mark.parametrize(
    "init_scale, growth_factor, interval",
    [(2.0**126, 2.0, 1), (2.0**127, 2.0, 1), (3.0e38, 1.5, 2), (1.0e38, 1.5, 3), (2.0**100, 1e10, 1)],
)
def test_growth_never_reaches_inf(init_scale, growth_factor, interval):
    kw = dict(init_scale=init_scale, growth_factor=growth_factor, growth_interval=interval)
    ours = _clean_iterations(GradScaler(**kw), 12, factor=1e-30)
    theirs = _clean_iterations(torch.amp.GradScaler("cpu", **kw), 12, factor=1e-30)
    assert ours == theirs
    assert all(math.isfinite(s) for s, _ in ours)
    assert ours[-1][0] <= torch.finfo(torch.float32).max
    assert ours[-1][0] >= init_scale * (1 - 1e-7)  # it grew (or stayed), never backed off


def test_growth_tracker_past_interval_never_grows_like_torch():
    state = {"scale": 64.0, "growth_factor": 2.0, "backoff_factor": 0.5, "growth_interval": 3, "_growth_tracker": 10}
    results = []
    for scaler in (GradScaler(), torch.amp.GradScaler("cpu")):
        scaler.load_state_dict(state)
        results.append(_clean_iterations(scaler, 8))
    assert results[0] == results[1]
    assert results[0][-1] == (64.0, 18)  # counted on, never equal to the interval, never grew


def test_set_growth_interval_and_factors_like_torch():
    results = []
    for scaler in (
        GradScaler(init_scale=8.0, growth_interval=4),
        torch.amp.GradScaler("cpu", init_scale=8.0, growth_interval=4),
    ):
        r = _clean_iterations(scaler, 2)
        scaler.set_growth_interval(2)
        scaler.set_growth_factor(3.0)
        scaler.set_backoff_factor(0.25)
        r += _clean_iterations(scaler, 4)
        r += _clean_iterations(scaler, 1, INF)
        r.append((scaler.get_growth_factor(), scaler.get_backoff_factor(), scaler.get_growth_interval()))
        results.append(r)
    assert results[0] == results[1]


# ------------------------------------------------------------------------------------------------------
# Several optimizers: one update combines their found_inf
# ------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("overflowing", [(), (1,), (0, 2), (0, 1, 2)])
def test_found_inf_of_several_optimizers_combined(overflowing):
    results = []
    for scaler in (
        GradScaler(init_scale=64.0, growth_interval=1),
        torch.amp.GradScaler("cpu", init_scale=64.0, growth_interval=1),
    ):
        torch.manual_seed(0)
        params = [nn.Parameter(torch.randn(4)) for _ in range(3)]
        opts = [torch.optim.SGD([p], lr=0.1) for p in params]
        before = [p.detach().clone() for p in params]
        scaler.scale(sum((p**2).sum() for p in params)).backward()
        for k in overflowing:
            params[k].grad[0] = NAN
        for opt in opts:
            scaler.step(opt)
        scaler.update()
        changed = [not torch.equal(p, b) for p, b in zip(params, before)]
        results.append(
            (changed, scaler.get_scale(), scaler._get_growth_tracker(), [p.detach().clone() for p in params])
        )
    (changed, scale, tracker, params), (changed_t, scale_t, tracker_t, params_t) = results
    assert changed == changed_t == [k not in overflowing for k in range(3)]  # only overflowed ones skip
    assert scale == scale_t == (32.0 if overflowing else 128.0)  # one backoff, however many overflowed
    assert tracker == tracker_t == 0
    assert all(same_bits(a, b) for a, b in zip(params, params_t))


# ------------------------------------------------------------------------------------------------------
# scale(): nested structures and the lazily created device tensors
# ------------------------------------------------------------------------------------------------------
def test_scale_nested_structures_like_torch():
    a, b, c, d = (
        torch.tensor([1.5, -2.0]),
        torch.tensor([3.0], dtype=torch.bfloat16),
        torch.ones(2, 2),
        torch.tensor([0.25], dtype=torch.float16),
    )
    outputs = [a, (b, [c]), (d,)]
    ours = GradScaler(init_scale=8.0).scale(outputs)
    theirs = torch.amp.GradScaler("cpu", init_scale=8.0).scale(outputs)
    assert type(ours) is list and type(ours[1]) is tuple and type(ours[1][1]) is list and type(ours[2]) is tuple
    flat = [ours[0], ours[1][0], ours[1][1][0], ours[2][0]]
    flat_t = [theirs[0], theirs[1][0], theirs[1][1][0], theirs[2][0]]
    for x, y, orig in zip(flat, flat_t, [a, b, c, d]):
        assert same_bits(x, y) and x.dtype == orig.dtype  # the 0-dim float32 scale does not promote
        assert torch.equal(x.double(), orig.double() * 8)
    # ... except a 0-dim (scalar) loss, by torch's promotion rules: both scalers give float32
    for dtype in (torch.float16, torch.bfloat16):
        loss = torch.tensor(3.0, dtype=dtype)
        x, y = GradScaler(init_scale=8.0).scale(loss), torch.amp.GradScaler("cpu", init_scale=8.0).scale(loss)
        assert x.dtype == y.dtype == torch.float32 and same_bits(x, y)
    gen = GradScaler(init_scale=4.0).scale(t for t in (a, c))  # other iterables: a lazy map, as torch
    assert isinstance(gen, map)
    assert [torch.equal(x, 4 * y) for x, y in zip(gen, (a, c))] == [True, True]
    for bad in ([a, 3], "loss", {"loss": a}, None):
        with pytest.raises(ValueError, match="outputs must be a Tensor or an iterable of Tensors"):
            GradScaler().scale(bad)


def test_scale_keeps_autograd_and_static_scale():
    p, opt = _one_param_problem()
    scaler = StaticLossScaler(1024.0)
    loss = (p**2).sum()
    scaler.scale(loss).backward()
    assert torch.equal(p.grad, 1024.0 * 2 * p.detach())


def test_scale_and_tracker_created_lazily_on_the_loss_device():
    scaler = GradScaler(init_scale=512.0)
    assert scaler._scale is None and scaler._growth_tracker is None
    assert scaler.get_scale() == 512.0 and scaler._get_growth_tracker() == 0
    loss = torch.ones((), device="meta")
    out = scaler.scale(loss)
    assert out.device.type == "meta"
    for t in (scaler._scale, scaler._inv_scale):  # S and 1/S, on the loss's device
        assert t.device.type == "meta" and t.dtype == torch.float32 and t.shape == ()
    assert scaler._host_scale == 512.0 and scaler._get_growth_tracker() == 0
    # once only the device knows the tracker, it is an int32 tensor beside S
    scaler.update(new_scale=torch.tensor(4.0, device="meta"))
    assert scaler._host_scale is None and scaler._inv_scale is None
    assert scaler._growth_tracker.device.type == "meta" and scaler._growth_tracker.dtype == torch.int32
    cpu = GradScaler(init_scale=1000.1)
    assert cpu.get_scale() == 1000.1  # before the first scale(), as torch: the number given
    cpu.scale(torch.ones(()))
    assert cpu._scale.device == torch.device("cpu") and cpu.get_scale() == _f32(1000.1) != 1000.1
    assert same_bits(cpu._inv_scale, cpu._scale.double().reciprocal().float())
    static = StaticLossScaler(2.0)
    assert static._scale is None and static.get_scale() == 2.0


def test_load_state_dict_before_first_scale_and_errors():
    scaler = GradScaler()
    torch_scaler = torch.amp.GradScaler("cpu", init_scale=16.0, growth_interval=5)
    _clean_iterations(torch_scaler, 7)
    scaler.load_state_dict(torch_scaler.state_dict())
    assert scaler._scale is None  # still lazy
    assert (
        scaler.state_dict()
        == torch_scaler.state_dict()
        == {"scale": 32.0, "growth_factor": 2.0, "backoff_factor": 0.5, "growth_interval": 5, "_growth_tracker": 2}
    )
    assert _clean_iterations(scaler, 4) == _clean_iterations(torch_scaler, 4)
    with pytest.raises(RuntimeError, match="state dict is empty"):
        scaler.load_state_dict({})
    saved = scaler.state_dict()
    with pytest.raises(KeyError):
        scaler.load_state_dict({"scale": 2.0})
    with pytest.raises(ValueError, match="growth_factor"):
        scaler.load_state_dict({**saved, "scale": 4.0, "growth_factor": 0.5})
    assert scaler.state_dict() == saved  # a refused state dict changes nothing


# ------------------------------------------------------------------------------------------------------
# history
# ------------------------------------------------------------------------------------------------------
def test_history_records_scale_used_and_overflow():
    scaler = GradScaler(init_scale=16.0, growth_interval=2)
    p, opt = _one_param_problem()
    for factor in (1.0, 1.0, INF, 1.0, NAN, 1.0, 1.0):
        opt.zero_grad()
        _scaled_backward(scaler, p, factor)
        scaler.step(opt)
        scaler.update()
    assert scaler.history == [
        (0, 16.0, False),
        (1, 16.0, False),
        (2, 32.0, True),
        (3, 16.0, False),
        (4, 16.0, True),
        (5, 8.0, False),
        (6, 8.0, False),
    ]
    assert scaler.get_scale() == 16.0
    # update(new_scale) records too; without any inf check found_inf is None
    opt.zero_grad()
    _scaled_backward(scaler, p)
    scaler.update(new_scale=4.0)
    scaler.update(new_scale=torch.tensor(2.0))
    assert scaler.history[-2:] == [(7, 16.0, None), (8, 4.0, None)]
    assert scaler.get_scale() == 2.0
    # history is a copy: changing it does not change the scaler's record
    h = scaler.history
    h.clear()
    assert len(scaler.history) == 9


def test_static_scaler_history_and_skips():
    scaler = StaticLossScaler(8.0)
    p, opt = _one_param_problem()
    values = []
    for factor in (1.0, INF, 1.0, NAN, 1.0):
        opt.zero_grad()
        before = p.detach().clone()
        _scaled_backward(scaler, p, factor)
        scaler.step(opt)
        scaler.update()
        values.append(not torch.equal(p, before))
    assert values == [True, False, True, False, True]
    assert scaler.history == [(i, 8.0, f) for i, f in enumerate([False, True, False, True, False])]
    assert scaler.get_scale() == 8.0 and scaler.state_dict() == {"scale": 8.0}
    with pytest.raises(ValueError, match="new_scale"):
        scaler.update(new_scale=4.0)
    with pytest.raises(RuntimeError, match="state dict is empty"):
        scaler.load_state_dict({})
    scaler.load_state_dict({"scale": 2.0, "growth_factor": 2.0})
    assert scaler.get_scale() == 2.0 and scaler.is_enabled()


def test_static_scaler_matches_torch_with_fixed_scale():
    """StaticLossScaler(S) == torch.amp.GradScaler that is told update(new_scale=S) every iteration."""
    n = 300
    X, Y = make_data(n, seed=5)
    model_a, a1, a2 = make_setup(seed=4)
    model_b = copy.deepcopy(model_a)
    b1 = torch.optim.SGD(model_b.l1.parameters(), lr=0.05, momentum=0.9)
    b2 = torch.optim.Adam(list(model_b.l2.parameters()) + [model_b.gain], lr=1e-3)
    ours = StaticLossScaler(2.0**14)
    theirs = torch.amp.GradScaler("cpu", init_scale=2.0**14)
    real_update = theirs.update
    theirs.update = lambda: real_update(new_scale=2.0**14)
    for i in range(n):
        assert iteration(i, model_a, a1, a2, ours, X, Y) == iteration(i, model_b, b1, b2, theirs, X, Y)
        for p, q in zip(model_a.parameters(), model_b.parameters()):
            assert same_bits(p, q), i
    assert {s for _, s, _ in ours.history} == {2.0**14}
    assert sum(f for _, _, f in ours.history) >= 6  # the injected overflows (steps 5-7, 120-122) were skipped


# ------------------------------------------------------------------------------------------------------
# Sparse gradients and optimizers that unscale themselves (fused Adam)
# ------------------------------------------------------------------------------------------------------
def test_sparse_gradients_like_torch():
    torch.manual_seed(0)
    emb_a = nn.Embedding(10, 4, sparse=True)
    emb_b = copy.deepcopy(emb_a)
    oa, ob = torch.optim.SGD(emb_a.parameters(), lr=0.1), torch.optim.SGD(emb_b.parameters(), lr=0.1)
    sa, sb = GradScaler(growth_interval=3), torch.amp.GradScaler("cpu", growth_interval=3)
    g = torch.Generator().manual_seed(0)
    for i in range(60):
        idx = torch.randint(0, 10, (6,), generator=g)
        for emb, opt, s in ((emb_a, oa, sa), (emb_b, ob, sb)):
            opt.zero_grad()
            loss = emb(idx).pow(2).sum() * (INF if i in (10, 11, 40) else 1.0)
            s.scale(loss).backward()
            assert emb.weight.grad.is_sparse
            if i % 2:
                s.unscale_(opt)
            s.step(opt)
            s.update()
        assert sa.get_scale() == sb.get_scale()
        assert same_bits(emb_a.weight, emb_b.weight), i


@pytest.mark.parametrize("explicit_unscale", [False, True])
def test_fused_adam_like_torch(explicit_unscale):
    n = 120
    X, Y = make_data(n, seed=6)
    torch.manual_seed(0)
    model_a = nn.Sequential(nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 4))
    model_b = copy.deepcopy(model_a)
    oa = torch.optim.Adam(model_a.parameters(), lr=1e-2, fused=True)
    ob = torch.optim.Adam(model_b.parameters(), lr=1e-2, fused=True)
    assert oa._step_supports_amp_scaling
    sa, sb = GradScaler(growth_interval=5), torch.amp.GradScaler("cpu", growth_interval=5)
    syncs = []
    for i in range(n):
        for model, opt, s in ((model_a, oa, sa), (model_b, ob, sb)):
            opt.zero_grad()
            loss = ((model(X[i]) - Y[i]) ** 2).mean() * (INF if i in (3, 4, 50) else 1.0)
            s.scale(loss).backward()
            if explicit_unscale:
                s.unscale_(opt)
            with SyncCounter() as c:
                s.step(opt)
            syncs.append(c.count)
            s.update()
            assert not hasattr(opt, "grad_scale") and not hasattr(opt, "found_inf")
        assert sa.get_scale() == sb.get_scale(), i
        for p, q in zip(model_a.parameters(), model_b.parameters()):
            assert same_bits(p, q), i
    assert set(syncs) == {0}  # the fused optimizer skips on the device


# ------------------------------------------------------------------------------------------------------
# Host synchronisations: ours does no more than torch's (one per optimizer step)
# ------------------------------------------------------------------------------------------------------
SYNC_OPS = {
    "aten::_local_scalar_dense",
    "aten::item",
    "aten::is_nonzero",
    "aten::equal",
    "aten::allclose",
    "aten::nonzero",
    "aten::nonzero_static",
    "aten::masked_select",
    "aten::unique",
    "aten::_unique",
    "aten::_unique2",
    "aten::unique_dim",
    "aten::unique_consecutive",
    "aten::repeat_interleave",
    "aten::bincount",
    "aten::_assert_async",
}


class SyncCounter(TorchDispatchMode):
    """Counts operations that read a device value on the host (on CUDA: a synchronisation).

    ``.item()``, ``bool(t)``, ``float(t)`` reach the dispatcher as ``_local_scalar_dense``; ``tolist`` and
    ``numpy`` do not, so they are counted by wrapping them.
    """

    def __init__(self):
        super().__init__()
        self.count = 0
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func._schema.name in SYNC_OPS:
            self.count += 1
            self.ops.append(func._schema.name)
        return func(*args, **(kwargs or {}))

    def __enter__(self):
        self._saved = {name: torch.Tensor.__dict__.get(name) for name in ("tolist", "numpy")}
        for name in self._saved:
            method = getattr(torch.Tensor, name)

            def counted(t, *a, _m=method, _n=name, **k):
                self.count += 1
                self.ops.append(_n)
                return _m(t, *a, **k)

            setattr(torch.Tensor, name, counted)
        return super().__enter__()

    def __exit__(self, *exc):
        for name, own in self._saved.items():
            if own is None:
                delattr(torch.Tensor, name)
            else:
                setattr(torch.Tensor, name, own)
        return super().__exit__(*exc)


def _count_syncs(scaler, steps=12):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3))
    o1 = torch.optim.SGD(model[0].parameters(), lr=0.01, momentum=0.9)
    o2 = torch.optim.SGD(model[2].parameters(), lr=0.01)
    X, Y = torch.randn(steps, 5, 6), torch.randn(steps, 5, 3)
    per = {"scale": 0, "unscale_": 0, "step": 0, "update": 0, "optimizer.step": 0}
    for i in range(steps):
        o1.zero_grad()
        o2.zero_grad()
        loss = ((model(X[i]) - Y[i]) ** 2).mean() * (INF if i in (3, 4, 9) else 1.0)
        with SyncCounter() as c:
            scaled = scaler.scale(loss)
        per["scale"] += c.count
        scaled.backward()
        with SyncCounter() as c:
            scaler.unscale_(o1)
        per["unscale_"] += c.count
        torch.nn.utils.clip_grad_norm_(model[0].parameters(), 1.0)
        with SyncCounter() as c:
            scaler.step(o1)
            scaler.step(o2)
        per["step"] += c.count
        with SyncCounter() as c:
            scaler.update()
        per["update"] += c.count
    with SyncCounter() as c:  # the optimizers themselves do not synchronise (so "step" counts only ours)
        o1.step()
        o2.step()
    per["optimizer.step"] = c.count
    return per


def test_host_synchronisations_per_step_no_more_than_torch():
    steps = 12
    ours = _count_syncs(GradScaler(growth_interval=2), steps)
    theirs = _count_syncs(torch.amp.GradScaler("cpu", growth_interval=2), steps)
    static = _count_syncs(StaticLossScaler(256.0), steps)
    expected = {"scale": 0, "unscale_": 0, "step": 2 * steps, "update": 0, "optimizer.step": 0}
    assert theirs == expected  # the counter sees torch's one .item() per optimizer step
    assert ours == expected
    assert static == expected


@pytest.mark.parametrize("fused", [False, True])
def test_recording_history_over_many_updates_adds_no_synchronisation(fused):
    """Host path (SGD): one .item() per step, history known on the host.  Device path (fused Adam, which
    skips on the device): no synchronisation at all per step; history read back in one transfer."""
    scaler = GradScaler(growth_interval=7)
    p, _ = _one_param_problem()
    opt = torch.optim.Adam([p], lr=1e-3, fused=True) if fused else torch.optim.SGD([p], lr=0.1)
    n = 2 * 1024 + 100  # packs device-side history chunks on the way
    with SyncCounter() as c:
        for i in range(n):
            opt.zero_grad()
            _scaled_backward(scaler, p, INF if i % 97 == 0 else 1e-3)
            scaler.step(opt)
            scaler.update()
    assert c.count == (0 if fused else n), c.ops[:5]
    with SyncCounter() as c:
        h = scaler.history
    assert c.count == (1 if fused else 0) and len(h) == n
    assert [r[0] for r in h] == list(range(n))
    assert [r[2] for r in h] == [i % 97 == 0 for i in range(n)]
    assert (scaler._host_scale is None) == fused


# ------------------------------------------------------------------------------------------------------
# Constructor arguments, new_scale, pickling
# ------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "kwargs, error, name",
    [
        ({"init_scale": 0.0}, ValueError, "init_scale"),
        ({"init_scale": -2.0}, ValueError, "init_scale"),
        ({"init_scale": INF}, ValueError, "init_scale"),
        ({"init_scale": NAN}, ValueError, "init_scale"),
        ({"init_scale": 1e39}, ValueError, "init_scale"),
        ({"init_scale": 1e-50}, ValueError, "init_scale"),
        ({"init_scale": "big"}, TypeError, "init_scale"),
        ({"init_scale": torch.tensor(2.0)}, TypeError, "init_scale"),
        ({"growth_factor": 1.0}, ValueError, "growth_factor"),
        ({"growth_factor": 0.5}, ValueError, "growth_factor"),
        ({"growth_factor": NAN}, ValueError, "growth_factor"),
        ({"growth_factor": None}, TypeError, "growth_factor"),
        ({"backoff_factor": 1.0}, ValueError, "backoff_factor"),
        ({"backoff_factor": 0.0}, ValueError, "backoff_factor"),
        ({"backoff_factor": -0.5}, ValueError, "backoff_factor"),
        ({"backoff_factor": 2}, ValueError, "backoff_factor"),
        ({"growth_interval": 0}, ValueError, "growth_interval"),
        ({"growth_interval": -5}, ValueError, "growth_interval"),
        ({"growth_interval": 2.5}, TypeError, "growth_interval"),
        ({"growth_interval": "10"}, TypeError, "growth_interval"),
        ({"growth_interval": True}, TypeError, "growth_interval"),
        ({"enabled": "yes"}, TypeError, "enabled"),
    ],
)
def test_bad_constructor_arguments(kwargs, error, name):
    with pytest.raises(error, match=name):
        GradScaler(**kwargs)


@pytest.mark.parametrize(
    "scale, error",
    [
        (0, ValueError),
        (-1.0, ValueError),
        (INF, ValueError),
        (NAN, ValueError),
        (1e39, ValueError),
        ("8", TypeError),
        (True, TypeError),
    ],
)
def test_bad_static_scale(scale, error):
    with pytest.raises(error, match="scale"):
        StaticLossScaler(scale)


def test_good_constructor_arguments_and_setters():
    s = GradScaler(init_scale=1, growth_factor=3, backoff_factor=0.25, growth_interval=10)
    assert (s.get_scale(), s.get_growth_factor(), s.get_backoff_factor(), s.get_growth_interval()) == (
        1.0,
        3.0,
        0.25,
        10,
    )
    assert s.is_enabled() and "growth_interval=10" in repr(s)
    with pytest.raises(ValueError, match="growth_factor"):
        s.set_growth_factor(1.0)
    with pytest.raises(ValueError, match="backoff_factor"):
        s.set_backoff_factor(1.5)
    with pytest.raises(TypeError, match="growth_interval"):
        s.set_growth_interval(1.5)
    assert StaticLossScaler(1.0).get_scale() == 1.0


def test_update_new_scale_arguments():
    scaler = GradScaler(init_scale=8.0)
    p, opt = _one_param_problem()
    _scaled_backward(scaler, p)
    new = torch.tensor([3.0])
    scaler.update(new_scale=new)
    new.fill_(100.0)  # later changes to the given tensor do not reach the scaler
    assert scaler.get_scale() == 3.0 and scaler._get_growth_tracker() == 0
    assert scaler._scale.shape == () and scaler._scale.dtype == torch.float32
    scaler.update(new_scale=5)
    assert scaler.get_scale() == 5.0
    for bad, error in (
        (torch.tensor([1.0, 2.0]), ValueError),
        (torch.tensor(2.0, requires_grad=True), ValueError),
        (torch.tensor(2.0, device="meta"), ValueError),
        (-1.0, ValueError),
        ("2", TypeError),
    ):
        with pytest.raises(error, match="new_scale"):
            scaler.update(new_scale=bad)


# ------------------------------------------------------------------------------------------------------
# Called as torch.amp.GradScaler is (PyTorch ≥ 2.3: device first), and the older numeric-first form
# ------------------------------------------------------------------------------------------------------
def test_signature_is_torchs():
    """Same parameter names, order and kinds as torch.amp.GradScaler; same defaults except device."""
    import inspect

    ours = inspect.signature(GradScaler).parameters
    theirs = inspect.signature(torch.amp.GradScaler).parameters
    assert (
        list(ours)
        == list(theirs)
        == ["device", "init_scale", "growth_factor", "backoff_factor", "growth_interval", "enabled"]
    )
    for name in ours:
        assert ours[name].kind == theirs[name].kind, name
        if name != "device":
            assert ours[name].default == theirs[name].default, name
    assert theirs["device"].default == "cuda" and ours["device"].default is None


# (args, kwargs) as torch.amp.GradScaler takes them; device "cpu" so that torch's scaler is enabled here
TORCH_CALLS = [
    (("cpu",), {}),
    (("cpu", 2.0**10), {}),
    (("cpu", 1000.0, 3.0, 0.25, 7), {}),
    (("cpu", 2.0**12, 2.0, 0.5, 9, True), {}),
    (("cpu",), {"init_scale": 2.0**8, "growth_interval": 5}),
    ((), {"device": "cpu", "init_scale": 512.0, "backoff_factor": 0.125}),
    (("cpu", 64.0), {"enabled": False}),
    (("cpu",), {"enabled": False}),
]


@pytest.mark.parametrize("args, kwargs", TORCH_CALLS)
def test_called_as_torch_is(args, kwargs):
    """Every call form gives the scaler torch's gives: the same state dict and the same trajectory, bit for bit."""
    theirs = torch.amp.GradScaler(*args, **kwargs)
    ours = GradScaler(*args, **kwargs)
    assert ours.is_enabled() == theirs.is_enabled()
    assert ours.state_dict() == theirs.state_dict()
    assert ours._device == theirs._device == "cpu"
    X, Y = make_data(40, seed=4)
    model, o1, o2 = make_setup(seed=5)
    ref = _run(model, o1, o2, theirs, X, Y, range(40))
    model, o1, o2 = make_setup(seed=5)
    got = _run(model, o1, o2, ours, X, Y, range(40))
    for i, ((s_ref, p_ref), (s_got, p_got)) in enumerate(zip(ref, got)):
        assert s_ref == s_got, i
        assert all(same_bits(a, b) for a, b in zip(p_ref, p_got)), i
    assert ours.state_dict() == theirs.state_dict()


@pytest.mark.parametrize(
    "args, kwargs",
    [
        ((2.0**10,), {}),
        ((1000.0, 3.0, 0.25, 7), {}),
        ((2.0**12, 2.0, 0.5, 9, True), {}),
        ((np.float32(256.0),), {"growth_interval": 3}),
        ((64,), {"device": "cpu"}),
    ],
)
def test_numeric_first_argument_is_init_scale(args, kwargs):
    """The older form (torch.cuda.amp.GradScaler's, and this class's before device came first)."""
    ours = GradScaler(*args, **kwargs)
    theirs = torch.amp.GradScaler(kwargs.pop("device", "cpu"), *args, **kwargs)
    assert ours.state_dict() == theirs.state_dict()


def test_keyword_calls_without_device_keep_working():
    ours = GradScaler(init_scale=2.0**10, growth_interval=50)
    assert ours._device is None and ours.is_enabled()
    assert ours.state_dict() == torch.amp.GradScaler("cpu", init_scale=2.0**10, growth_interval=50).state_dict()
    assert repr(ours).startswith("GradScaler(init_scale=1024.0")
    assert repr(GradScaler("cpu", 8.0)).startswith("GradScaler('cpu', init_scale=8.0")


def test_cuda_without_cuda_is_disabled_with_a_warning_like_torch():
    if torch.cuda.is_available():
        pytest.skip("CUDA is available: nothing is disabled")
    with pytest.warns(UserWarning, match="CUDA is not available") as theirs_warned:
        theirs = torch.amp.GradScaler("cuda", init_scale=8.0)
    with pytest.warns(UserWarning, match=r"GradScaler\('cuda'\) is enabled, but CUDA is not available") as w:
        ours = GradScaler("cuda", init_scale=8.0)
    assert len(w) == len(theirs_warned) == 1 and w[0].filename == __file__  # points at the caller
    assert ours.is_enabled() is theirs.is_enabled() is False
    assert ours.state_dict() == theirs.state_dict() == {} and ours.get_scale() == theirs.get_scale() == 1.0
    assert repr(ours) == "GradScaler('cuda', enabled=False)"
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # explicitly disabled, or another device: no warning
        assert not GradScaler("cuda", enabled=False).is_enabled()
        assert GradScaler("cpu").is_enabled() and GradScaler().is_enabled()


@pytest.mark.parametrize(
    "args, kwargs",
    [
        (("cpu", 1.0, 2.0, 0.5, 10, True, 3), {}),  # too many positional arguments
        (("cpu",), {"device": "cpu"}),  # device twice
        (("cpu", 8.0), {"init_scale": 8.0}),  # init_scale twice
        ((), {"scale": 8.0}),  # unknown keyword
    ],
)
def test_bad_calls_are_type_errors_like_torch(args, kwargs):
    with pytest.raises(TypeError):
        torch.amp.GradScaler(*args, **kwargs)
    with pytest.raises(TypeError, match="GradScaler"):
        GradScaler(*args, **kwargs)
    with pytest.raises(TypeError, match="at most 5 positional"):  # the numeric-first form has one fewer
        GradScaler(1.0, 2.0, 0.5, 10, True, 3)


# Every device form torch.amp.GradScaler takes, with the other arguments positional or by keyword, enabled or
# not.  On a machine without CUDA, torch disables its scaler (with a warning) for the str "cuda" only.
_CUDA0, _CPU = torch.device("cuda", 0), torch.device("cpu")
DEVICE_FORMS = [
    (("cpu",), {}),
    (("cuda",), {}),
    (("cuda:0",), {}),
    (("cuda:1",), {}),
    (("cpu:0",), {}),
    (("meta",), {}),
    ((_CPU,), {}),
    ((torch.device("cuda"),), {}),
    ((_CUDA0,), {}),
    ((torch.device("cpu", 0),), {}),
    ((), {"device": _CPU}),
    ((), {"device": "cuda:0"}),
    ((), {"device": "cuda"}),
    ((), {"device": _CUDA0}),
    ((None,), {}),
    ((), {"device": None, "init_scale": 8.0}),
    (("cuda:0", 1024.0, 3.0, 0.25, 7, True), {}),
    ((_CPU, 2.0**10), {"growth_interval": 3}),
    ((_CUDA0,), {"init_scale": 2.0**12, "backoff_factor": 0.125}),
    (("cuda", 64.0, 4.0), {}),
    (("cuda",), {"enabled": False}),
    (("cuda:0",), {"enabled": False}),
    ((_CPU,), {"enabled": False}),
    ((_CUDA0, 8.0, 2.0, 0.5, 10, False), {}),
    ((), {"device": "cpu:0", "enabled": False}),
    # bad factors: torch refuses them (AssertionError) when enabled; the disabled "cuda" checks none
    (("cpu",), {"growth_factor": 1.0}),
    ((_CPU,), {"backoff_factor": 1.0}),
    (("cuda:0",), {"growth_factor": 0.5}),
    # ... and accepts them unchecked when disabled; ours refuses them always (ValueError)
    (("cpu",), {"growth_factor": 0.5, "enabled": False}),
    (("cuda",), {"backoff_factor": 2.0}),
]


def _outcome(make):
    """What a constructor call does: (scaler or None, error class or None, [warning messages])."""
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            scaler, error = make(), None
        except (TypeError, ValueError, AssertionError) as err:
            scaler, error = None, type(err)
    return scaler, error, [str(w.message) for w in caught if issubclass(w.category, UserWarning)]


@pytest.mark.parametrize("args, kwargs", DEVICE_FORMS)
def test_every_device_form_side_by_side_with_torch(args, kwargs):
    """Ours and torch's scaler on the same call: both accept it or both refuse it (torch's AssertionError is a
    ValueError here), the same warning, the same enabled state, state dict, scaled loss and trajectory."""
    theirs, their_error, their_warnings = _outcome(lambda: torch.amp.GradScaler(*args, **kwargs))
    if their_error is not None:
        ours, our_error, _ = _outcome(lambda: GradScaler(*args, **kwargs))
        assert our_error is {AssertionError: ValueError}.get(their_error, their_error)
        return
    ours, our_error, our_warnings = _outcome(lambda: GradScaler(*args, **kwargs))
    if our_error is not None:  # the one stricter check here: a disabled scaler's factors, which torch never reads
        bad_factor = not kwargs.get("growth_factor", 2.0) > 1.0 or not 0 < kwargs.get("backoff_factor", 0.5) < 1
        assert not theirs.is_enabled() and bad_factor and our_error is ValueError, (args, kwargs, our_error)
        return
    assert ours.is_enabled() == theirs.is_enabled()
    assert len(our_warnings) == len(their_warnings)
    assert all("CUDA is not available" in m for m in our_warnings + their_warnings)
    assert ours._device is theirs._device or ours._device == theirs._device  # stored as given
    assert ours.state_dict() == theirs.state_dict()
    assert ours.get_scale() == theirs.get_scale()
    loss = torch.tensor(3.0)
    assert same_bits(ours.scale(loss), theirs.scale(loss))
    assert _clean_iterations(ours, 8) == _clean_iterations(theirs, 8)


def test_cuda_forms_without_cuda_as_torch_has_them():
    """Without CUDA, torch disables only the str "cuda"; "cuda:0" and torch.device("cuda") scale a CPU loss."""
    if torch.cuda.is_available():
        pytest.skip("CUDA is available: no form is disabled")
    for device in ("cuda:0", torch.device("cuda"), _CUDA0):
        for make in (torch.amp.GradScaler, GradScaler):
            scaler, error, warned = _outcome(lambda: make(device, init_scale=8.0))
            assert error is None and not warned and scaler.is_enabled(), (make, device)
            assert scaler.scale(torch.tensor(2.0)).item() == 16.0
    scaler, error, warned = _outcome(lambda: GradScaler("cuda", init_scale=8.0))
    assert not scaler.is_enabled() and len(warned) == 1 and scaler.scale(torch.tensor(2.0)).item() == 2.0


@pytest.mark.parametrize(
    "device, error",
    [
        ("CUDA", ValueError),
        ("gpu", ValueError),
        ("", ValueError),
        ("cuda:x", ValueError),
        (True, TypeError),
        (b"cpu", TypeError),
        ([], TypeError),
        (("cpu",), TypeError),
    ],
)
def test_bad_device(device, error):
    """torch stores any device unchecked (and fails later, or never); ours names the argument at once."""
    assert torch.amp.GradScaler(device, enabled=False)._device is device
    with pytest.raises(error, match="device"):
        GradScaler(device)
    with pytest.raises(error, match="device"):
        GradScaler(device=device, init_scale=8.0)


def test_device_objects_and_indices_in_repr_and_pickle():
    for device, shown in ((_CPU, "torch.device('cpu')"), (_CUDA0, "torch.device('cuda:0')"), ("cpu:0", "'cpu:0'")):
        scaler = GradScaler(device, enabled=False) if "cuda" in str(device) else GradScaler(device, 8.0)
        assert repr(scaler).startswith(f"GradScaler({shown}, ")
        clone = pickle.loads(pickle.dumps(scaler))
        assert clone._device == device and clone._device_type == torch.device(device).type


def test_new_scale_tensor_checked_against_the_device_type():
    """torch compares a tensor new_scale's device type with ``device`` as given, so after a torch.device or an
    indexed str it refuses every tensor (a torch quirk); ours compares with the device's type."""
    for device in (_CPU, "cpu:0", torch.device("cpu", 0)):
        theirs = torch.amp.GradScaler(device, init_scale=4.0)
        p, opt = _one_param_problem()
        _scaled_backward(theirs, p)
        theirs.step(opt)
        with pytest.raises(AssertionError, match="new_scale"):
            theirs.update(new_scale=torch.tensor(2.0))
        ours = GradScaler(device, init_scale=4.0)
        p, opt = _one_param_problem()
        _scaled_backward(ours, p)
        ours.step(opt)
        ours.update(new_scale=torch.tensor(2.0))
        assert ours.get_scale() == 2.0
        with pytest.raises(ValueError, match=r"new_scale.*\(cpu\)"):
            ours.update(new_scale=torch.tensor(2.0, device="meta"))


def test_device_checks_new_scale_like_torch():
    """torch checks a tensor new_scale against its device argument, not against where S lives."""
    for make in (lambda: torch.amp.GradScaler("meta", init_scale=4.0), lambda: GradScaler("meta", init_scale=4.0)):
        scaler = make()
        p, opt = _one_param_problem()
        _scaled_backward(scaler, p)  # S lives on the CPU, the loss's device
        scaler.step(opt)
        with pytest.raises((AssertionError, ValueError), match="new_scale"):
            scaler.update(new_scale=torch.tensor(2.0))
    scaler = GradScaler("cpu", init_scale=4.0)
    p, opt = _one_param_problem()
    _scaled_backward(scaler, p)
    scaler.step(opt)
    scaler.update(new_scale=torch.tensor(2.0))
    assert scaler.get_scale() == 2.0


def test_device_survives_pickling_and_state_dict_has_none():
    scaler = GradScaler("cpu", init_scale=32.0)
    assert "device" not in scaler.state_dict()
    clone = pickle.loads(pickle.dumps(scaler))
    assert clone._device == "cpu" and clone.state_dict() == scaler.state_dict()


def test_pickle_between_iterations_only():
    scaler = GradScaler(init_scale=32.0, growth_interval=2)
    _clean_iterations(scaler, 3)
    clone = pickle.loads(pickle.dumps(scaler))
    assert clone.state_dict() == scaler.state_dict()
    assert clone.history == scaler.history and clone._scale is None
    assert _clean_iterations(clone, 3) == _clean_iterations(scaler, 3)
    p, opt = _one_param_problem()
    _scaled_backward(scaler, p)
    scaler.unscale_(opt)
    with pytest.raises(RuntimeError, match="pickled"):
        pickle.dumps(scaler)


def test_deprecated_grad_scaler_keyword_optimizer_refused():
    class Custom(torch.optim.SGD):
        _step_supports_amp_scaling = True

        def step(self, closure=None, grad_scaler=None):
            return super().step(closure)

    p, _ = _one_param_problem()
    opt = Custom([p], lr=0.1)
    scaler = GradScaler()
    _scaled_backward(scaler, p)
    with pytest.raises(NotImplementedError, match="grad_scaler"):
        scaler.step(opt)


# ------------------------------------------------------------------------------------------------------
# The two paths of update(): rules on the host when step() read found_inf, on the device otherwise
# ------------------------------------------------------------------------------------------------------
def test_f32_rounds_like_torch():
    g = torch.Generator().manual_seed(3)
    xs = (
        torch.randn(20000, generator=g, dtype=torch.float64)
        * torch.exp2(torch.randint(-160, 140, (20000,), generator=g))
    ).tolist()
    fmax = torch.finfo(torch.float32).max
    xs += [
        0.0,
        -0.0,
        fmax,
        fmax * (1 + 2**-25),
        fmax * (1 + 2**-24),
        1e39,
        -1e39,
        2.0**-149,
        2.0**-150,
        2.0**-151,
        math.inf,
        -math.inf,
        1 + 2**-24,
        1 + 3 * 2**-24,
    ]
    ref = torch.tensor(xs, dtype=torch.float64).float()
    ours = torch.tensor([_f32(x) for x in xs], dtype=torch.float32)
    assert same_bits(ours, ref)


def test_host_and_device_paths_agree_with_torch():
    """update() runs the rules on the host when step() has read found_inf, on the device otherwise;
    a scripted sequence that switches between them follows torch's scaler exactly."""

    def run(scaler):
        torch.manual_seed(0)
        p, q = nn.Parameter(torch.randn(3)), nn.Parameter(torch.randn(3))
        o1, o2 = torch.optim.SGD([p], lr=0.1), torch.optim.SGD([q], lr=0.1)
        trace, paths = [], []

        def it(factor=1.0, q_nan=False, step_o2=True, new_scale=None):
            o1.zero_grad()
            o2.zero_grad()
            scaler.scale(((p**2).sum() + (q**2).sum()) * factor).backward()
            if q_nan:
                q.grad[0] = NAN
            scaler.unscale_(o2)  # o2 unscaled; stepped only if step_o2 (otherwise found_inf stays on device)
            scaler.step(o1)
            if step_o2:
                scaler.step(o2)
            scaler.update(new_scale)
            trace.append((scaler.get_scale(), scaler._get_growth_tracker(), p.detach().clone(), q.detach().clone()))
            paths.append(getattr(scaler, "_host_scale", 0) is not None)

        for _ in range(5):
            it()  # host path: growth after 3
        it(q_nan=True, step_o2=False)  # o2's overflow seen only on the device: backoff there
        for _ in range(4):
            it()  # device path from now on
        it(factor=INF)
        state = scaler.state_dict()
        scaler.load_state_dict(state)  # the host knows S again
        for _ in range(4):
            it()
        it(new_scale=torch.tensor(64.0))  # a tensor: only the device knows S
        it(q_nan=True)
        it(new_scale=8.0)
        for _ in range(4):
            it()
        return trace, paths

    kw = dict(init_scale=16.0, growth_interval=3)
    ours, paths = run(GradScaler(**kw))
    theirs, _ = run(torch.amp.GradScaler("cpu", **kw))
    for i, (a, b) in enumerate(zip(ours, theirs)):
        assert a[:2] == b[:2], i
        assert same_bits(a[2], b[2]) and same_bits(a[3], b[3]), i
    assert paths[:5] == [True] * 5 and not any(paths[5:11]) and all(paths[11:15]) and not any(paths[15:])


def test_history_mixes_host_and_device_records_in_order():
    scaler = GradScaler(init_scale=16.0, growth_interval=2)
    p, opt = _one_param_problem()
    fused_p = nn.Parameter(torch.randn(3))
    fused = torch.optim.Adam([fused_p], lr=0.1, fused=True)
    expected = []
    for i, (factor, use_fused) in enumerate(
        [(1.0, False), (INF, False), (1.0, True), (INF, True), (1.0, True), (1.0, True)]
    ):
        opt.zero_grad()
        fused.zero_grad()
        used = scaler.get_scale()
        scaler.scale(((p**2).sum() + (fused_p**2).sum()) * factor).backward()
        scaler.step(fused if use_fused else opt)
        scaler.update()
        expected.append((i, used, factor == INF))
    assert scaler.history == expected
    scaler.load_state_dict(scaler.state_dict())
    opt.zero_grad()
    _scaled_backward(scaler, p)
    scaler.step(opt)
    scaler.update()
    assert scaler.history == expected + [(6, expected[-1][1] * 2, False)]


# ------------------------------------------------------------------------------------------------------
# The overhead benchmark runs and writes its JSON
# ------------------------------------------------------------------------------------------------------
def test_scaler_overhead_benchmark_runs(tmp_path):
    mod = load_benchmark("scaler_overhead")
    out = tmp_path / "overhead.json"
    assert (
        mod.main(
            [
                "--profile",
                "quick",
                "--set",
                "batch=8",
                "--set",
                "hidden=16",
                "--set",
                "steps=5",
                "--set",
                "repeat=3",
                "--no-progress",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    res = json.loads(out.read_text())
    assert res["provenance"]["config"]["hidden"] == 16
    assert set(res["timings_s"]) >= {"torch.amp.GradScaler", "mpt_lab GradScaler"}
    assert res["ratio_ours_vs_torch"] > 0


# ------------------------------------------------------------------------------------------------------
# The public rules: max_gradient_scale (a static S from amax) and update_scale (the dynamic rule)
# ------------------------------------------------------------------------------------------------------
def _reference_scale(amax: float, fmt_max: float) -> float:
    """Brute force with exact rationals: the k with amax · 2^k ≤ max < amax · 2^(k+1), found by stepping."""
    from fractions import Fraction

    a, m = Fraction(amax), Fraction(fmt_max)
    k = 0
    while a * Fraction(2) ** k > m:
        k -= 1
    while a * Fraction(2) ** (k + 1) <= m:
        k += 1
    assert a * Fraction(2) ** k <= m < a * Fraction(2) ** (k + 1)
    return math.ldexp(1.0, k)


@pytest.mark.parametrize("fmt", ["FP16", "BF16", "FP8_E4M3", "FP8_E5M2", "FP32"])
def test_max_gradient_scale_exact_at_and_beside_every_power_of_two(fmt):
    from mpt_lab.formats import get_format
    from mpt_lab.scaling import max_gradient_scale

    fmt_max = get_format(fmt).max
    for k in range(-149, 128):
        p = math.ldexp(1.0, k)
        for amax in (math.nextafter(p, 0.0), p, math.nextafter(p, math.inf)):
            s = max_gradient_scale(amax, fmt)
            assert s == _reference_scale(amax, fmt_max), (fmt, k, amax)
    # the format's own max and its neighbours: S = 1 exactly at max, 1/2 just above
    assert max_gradient_scale(fmt_max, fmt) == 1.0
    assert max_gradient_scale(math.nextafter(fmt_max, math.inf), fmt) == 0.5
    assert max_gradient_scale(math.nextafter(fmt_max, 0.0), fmt) == 1.0


def test_max_gradient_scale_input_types():
    from mpt_lab.formats import FP8_E4M3, FP16
    from mpt_lab.scaling import max_gradient_scale

    assert max_gradient_scale(1.0) == 2.0**15  # 65504 / 1 → 2^15 (2^16 > 65504)
    assert max_gradient_scale(2.0**-24) == 2.0**39
    assert max_gradient_scale(448, FP8_E4M3) == 1.0 and max_gradient_scale(449, "e4m3") == 0.5
    for amax in (
        np.float16(3.0),
        np.float32(3.0),
        np.float64(3.0),
        np.array(3.0),
        np.int64(3),
        3,
        torch.tensor(3.0),
        torch.tensor(3.0, dtype=torch.bfloat16),
        torch.tensor(3, dtype=torch.int32),
        torch.tensor(3.0, dtype=torch.float64, requires_grad=True),
    ):
        assert max_gradient_scale(amax, FP16) == 2.0**14, type(amax)  # 3 · 2^14 = 49152 ≤ 65504 < 98304
    from fractions import Fraction

    assert max_gradient_scale(Fraction(65504 * 3 + 1, 3)) == 0.5  # just above max: exact, not via float
    assert max_gradient_scale(2**1000, "FP32") == 2.0**-873
    ml_dtypes = pytest.importorskip("ml_dtypes")
    assert max_gradient_scale(np.asarray(3.0, dtype=ml_dtypes.bfloat16)[()]) == 2.0**14


@pytest.mark.parametrize(
    "amax, error",
    [
        (0.0, ValueError),
        (-1.0, ValueError),
        (0, ValueError),
        (-(2.0**-149), ValueError),
        (NAN, ValueError),
        (INF, ValueError),
        (-INF, ValueError),
        (torch.tensor(NAN), ValueError),
        (torch.tensor(-1.0), ValueError),
        (True, TypeError),
        (False, TypeError),
        ("1.0", TypeError),
        (None, TypeError),
        (1 + 2j, TypeError),
        (torch.tensor(True), TypeError),
        (torch.tensor([1.0, 2.0]), TypeError),
        (torch.tensor([1.0]), TypeError),
        (torch.tensor(1.0, device="meta"), ValueError),
        (np.bool_(True), TypeError),
        (np.array([1.0, 2.0]), TypeError),
        (np.float32(NAN), ValueError),
        (np.float16(-1.0), ValueError),
        (np.array("1.0"), TypeError),
    ],
)
def test_max_gradient_scale_bad_amax(amax, error):
    from mpt_lab.scaling import max_gradient_scale

    with pytest.raises(error, match="amax"):
        max_gradient_scale(amax)


def test_max_gradient_scale_not_representable_and_bad_format():
    from mpt_lab.scaling import max_gradient_scale

    assert max_gradient_scale(1.0, "FP64") == 2.0**1023  # max/1 < 2^1024: still a float
    with pytest.raises(ValueError, match="not representable"):
        max_gradient_scale(0.5, "FP64")  # S = 2^1024
    with pytest.raises(ValueError, match="not representable"):
        max_gradient_scale(2.0**-1074, "FP64")
    with pytest.raises(ValueError, match="not representable"):
        max_gradient_scale(10**400, "FP16")  # S = 2^-1313
    with pytest.raises(ValueError, match="fmt"):
        max_gradient_scale(1.0, "FP15")
    with pytest.raises(TypeError, match="fmt"):
        max_gradient_scale(1.0, 16)


def test_update_scale_is_the_rule_torch_runs():
    """The public rule against torch.amp.GradScaler driven through the same overflow pattern."""
    from mpt_lab.scaling import update_scale

    g = torch.Generator().manual_seed(5)
    found = (torch.rand(120, generator=g) < 0.08).tolist()
    found[40:43] = [True] * 3
    for growth_factor, backoff_factor, interval in ((2.0, 0.5, 7), (1.5, 0.3, 1), (3.7, 0.999, 20)):
        ref = torch.amp.GradScaler(
            "cpu",
            init_scale=2.0**16,
            growth_factor=growth_factor,
            backoff_factor=backoff_factor,
            growth_interval=interval,
        )
        p = nn.Parameter(torch.ones(2))
        opt = torch.optim.SGD([p], lr=0.0)
        scale, tracker = 2.0**16, 0
        for f in found:
            opt.zero_grad()
            ref.scale(p.sum() * (INF if f else 1.0)).backward()
            ref.step(opt)
            ref.update()
            scale, tracker = update_scale(scale, tracker, f, growth_factor, backoff_factor, interval)
            assert (scale, tracker) == (ref.get_scale(), ref._get_growth_tracker())
    assert update_scale(2.0**16, 0, True) == (2.0**15, 0)
    assert update_scale(2.0**16, 1998, False) == (2.0**16, 1999)
    assert update_scale(2.0**16, 1999, False) == (2.0**17, 0)
    assert update_scale(2.0**127, 1, False, growth_interval=2) == (2.0**127, 0)  # never grows to inf
    assert update_scale(2.0**16, 5, True, growth_interval=3) == (2.0**15, 0)


@pytest.mark.parametrize(
    "kwargs, error, name",
    [
        (dict(scale=0.0), ValueError, "scale"),
        (dict(scale=INF), ValueError, "scale"),
        (dict(scale="1"), TypeError, "scale"),
        (dict(tracker=-1), ValueError, "tracker"),
        (dict(tracker=1.0), TypeError, "tracker"),
        (dict(tracker=True), TypeError, "tracker"),
        (dict(found_inf=1), TypeError, "found_inf"),
        (dict(found_inf=None), TypeError, "found_inf"),
        (dict(growth_factor=1.0), ValueError, "growth_factor"),
        (dict(backoff_factor=1.0), ValueError, "backoff_factor"),
        (dict(growth_interval=0), ValueError, "growth_interval"),
    ],
)
def test_update_scale_bad_arguments(kwargs, error, name):
    from mpt_lab.scaling import update_scale

    args = dict(scale=2.0**16, tracker=0, found_inf=False)
    args.update(kwargs)
    with pytest.raises(error, match=name):
        update_scale(**args)
