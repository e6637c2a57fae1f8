"""mpt_lab.histogram: exact counts on constructed tensors, fractions against round_to, the gradient hooks."""

import math
import warnings

import numpy as np
import pytest
import torch

from mpt_lab import formats as F
from mpt_lab import histogram as H
from mpt_lab.histogram import GradientHistogram, Log2Histogram, _fine_indices_eager, _kernel, log2_histogram


def _edge_values() -> np.ndarray:
    """Zeros, FP32 subnormals, every binade edge, the values and midpoints of the small formats, inf, NaN."""
    k = np.arange(-149, 128)
    edges = np.ldexp(1.0, k)
    parts = [
        [0.0, -0.0, np.inf, -np.inf, np.nan],
        edges,
        -edges,
        np.nextafter(edges.astype(np.float32), np.float32(np.inf)),
        np.nextafter(edges[1:].astype(np.float32), np.float32(0)),
    ]
    for fmt in (F.FP16, F.BF16, F.FP8_E5M2, F.FP8_E4M3, F.FP6_E3M2, F.FP6_E2M3, F.FP4_E2M1):
        v = F.values(fmt) if fmt.bits <= 16 else None
        v = v[v > 0]
        parts += [v, (v[:-1] + v[1:]) / 2, [fmt.max + F.ulp(fmt.max, fmt) / 2, fmt.smallest_subnormal / 2]]
    with np.errstate(over="ignore"):
        return np.concatenate([np.asarray(p, dtype=np.float64) for p in parts]).astype(np.float32)


def _random_values(n=300_000, seed=0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    with np.errstate(over="ignore"):
        return (rng.standard_normal(n) * np.exp2(rng.integers(-150, 128, n).astype(float))).astype(np.float32)


def test_counts_are_exact_per_binade():
    x = np.concatenate([_edge_values(), _random_values()])
    h = log2_histogram(torch.from_numpy(x))
    fin = np.isfinite(x) & (x != 0)
    k = np.floor(np.log2(np.abs(x[fin]).astype(np.float64))).astype(int)
    assert np.array_equal(h.counts, np.bincount(k + 149, minlength=277))
    assert h.exponents[0] == -149 and h.exponents[-1] == 127
    assert h.zeros == int((x == 0).sum()) and h.nonfinite == int((~np.isfinite(x)).sum())
    assert h.total == x.size
    assert h.amax == float(np.abs(x[np.isfinite(x)]).max())


def test_small_constructed_histogram():
    x = torch.tensor([0.0, -0.0, 1.0, 1.5, -1.99, 2.0, 2.0**-149, 2.0**-126, 3 * 2.0**-149, float("inf"), float("nan")])
    h = log2_histogram(x)
    nz = {int(k): int(c) for k, c in zip(h.exponents, h.counts) if c}
    assert nz == {0: 3, 1: 1, -149: 1, -148: 1, -126: 1}
    assert (h.zeros, h.nonfinite, h.total) == (2, 2, 11)
    assert h.fraction_zero() == 2 / 11
    assert h.fraction_below(1.0) == 5 / 11 and h.fraction_below(1.0, include_zeros=False) == 3 / 11
    assert h.fraction_between(1.0, 4.0) == 4 / 11
    with pytest.raises(ValueError, match="power of two"):
        h.fraction_below(3.0)
    with pytest.raises(ValueError):
        h.fraction_between(4.0, 1.0)


def test_compiled_kernel_matches_eager():
    x = torch.from_numpy(np.concatenate([_edge_values(), _random_values(100_000, 3)]))
    a, b = _kernel()(x), _fine_indices_eager(x)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


def test_the_bits_kernel_matches_eager_on_every_bin_edge_and_random_bit_patterns():
    """The CPU kernel's arithmetic on bit patterns (uncompiled here) equals the eager float kernel on each fine
    bin's first pattern and its neighbours (subnormal binades included), both signs, inf, NaN, and a million
    random bit patterns."""
    starts = torch.from_numpy(H._bin_starts())
    near = torch.cat([starts + d for d in (-1, 0, 1, 2)]).clamp(0, 0x7FFFFFFF).to(torch.int32)
    special = torch.tensor([0, 1, 0x7FFFFF, 0x7F7FFFFF, 0x7F800000, 0x7F800001, 0x7FFFFFFF], dtype=torch.int32)
    g = torch.Generator().manual_seed(5)
    rand = torch.randint(-(2**31), 2**31 - 1, (1_000_000,), generator=g, dtype=torch.int64).to(torch.int32)
    pats = torch.cat([near, special, near | torch.tensor(-(2**31), dtype=torch.int32), rand])
    idx, amax_bits = H._fine_indices_bits(pats), H._amax_bits(pats)
    want_idx, want_amax = _fine_indices_eager(pats.view(torch.float32))
    assert torch.equal(idx, want_idx) and torch.equal(amax_bits.view(torch.float32), want_amax)


@pytest.mark.parametrize("kernel", ["C", "torch.compile"])
def test_a_large_tensor_counted_in_pieces_equals_one_count(kernel, monkeypatch):
    """A large CPU tensor is counted in pieces (the C kernel: one part per torch thread, here three; the
    torch.compile kernel: pieces of _CPU_CHUNK values): the counts and amax equal the eager kernel's over the whole
    tensor, with zeros, subnormals, inf and NaN in different pieces, for float32, a channels-last 4-D gradient
    and bfloat16."""
    if kernel == "C":
        assert H._native_kernel() is not None  # this project's machines have a C compiler
    else:
        monkeypatch.setattr(H, "_c_histogram", {"fn": None})
    monkeypatch.setattr(torch, "get_num_threads", lambda: 3)
    n = 3 * H._CPU_CHUNK + 12345
    x = torch.from_numpy(_random_values(n, 7))
    x[5] = 0.0
    x[H._CPU_CHUNK + 3] = float("inf")
    x[2 * H._CPU_CHUNK + 9] = float("nan")
    x[-1] = 2.0**-140
    x[H._CPU_CHUNK - 1] = 3.0e38  # the largest finite value in the first piece
    cases = [x, x[: 4 * 80 * 64 * 64].reshape(4, 80, 64, 64).to(memory_format=torch.channels_last), x.bfloat16()]
    for t in cases:
        idx, amax = _fine_indices_eager(t.detach().float().reshape(-1))
        h = log2_histogram(t)
        assert torch.equal(h._fine, torch.bincount(idx.long(), minlength=H.NFINE)) and h.amax == float(amax), t.dtype


def test_search_kernel_matches_eager_on_every_bin_edge_and_random_bit_patterns():
    """The CUDA kernel (a bucketize over the bins' runs of bit patterns), run here on CPU tensors: the same fine
    index and amax as the eager kernel at each bin's first pattern, its neighbours, both signs, inf and NaN, and on
    a million random bit patterns."""
    starts = torch.from_numpy(H._bin_starts())
    assert bool((starts[1:] >= starts[:-1]).all()) and int(starts[0]) == 1 and int(starts[-1]) < 0x7F800000
    near = torch.cat([starts + d for d in (-1, 0, 1, 2)]).clamp(0, 0x7FFFFFFF).to(torch.int32)
    special = torch.tensor([0, 0x7F7FFFFF, 0x7F800000, 0x7F800001, 0x7FFFFFFF], dtype=torch.int32)
    pats = torch.cat([near, special])
    pats = torch.cat([pats, pats | torch.tensor(-(2**31), dtype=torch.int32)])  # the negative twins
    rand = torch.randint(
        -(2**31), 2**31 - 1, (1_000_000,), generator=torch.Generator().manual_seed(0), dtype=torch.int64
    ).to(torch.int32)
    for x in (
        pats.view(torch.float32),
        rand.view(torch.float32),
        torch.from_numpy(np.concatenate([_edge_values(), _random_values(100_000, 4)])),
    ):
        a, b = H._fine_indices_search(x), _fine_indices_eager(x)
        assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


def test_cuda_kernel_is_chosen_without_compiling(monkeypatch):
    """On CUDA the histogram uses the search kernel and compiles nothing (the first GPU slot lost 75 s compiling
    for the CPU and again for CUDA); the CPU's compiled kernel is probed on CPU tensors only; MPT_LAB_COMPILE=0
    uses the eager kernel everywhere."""

    def no_compile(*a, **k):
        raise AssertionError("torch.compile must not run for the CUDA kernel")

    monkeypatch.setattr(H, "_compiled", {})
    monkeypatch.setattr(H, "_aten_capped", lambda: False)  # the compile path, whatever ATEN_CPU_CAPABILITY says
    monkeypatch.setattr(torch, "compile", no_compile)
    monkeypatch.delenv("MPT_LAB_COMPILE", raising=False)
    assert _kernel("cuda") is H._fine_indices_search and _kernel(torch.device("cuda", 0)) is H._fine_indices_search
    monkeypatch.setenv("MPT_LAB_COMPILE", "0")
    monkeypatch.setattr(H, "_compiled", {})
    assert _kernel("cuda") is _fine_indices_eager and _kernel("cpu") is _fine_indices_eager
    seen = []

    def fake_compile(fn, **kw):  # records the devices the compiled kernel is called on
        def compiled(x):
            seen.append(x.device.type)
            return fn(x)

        return compiled

    monkeypatch.setattr(torch, "compile", fake_compile)
    monkeypatch.setattr(H, "_compiled", {})
    monkeypatch.setenv("MPT_LAB_COMPILE", "1")
    _kernel("cpu")
    assert set(seen) == {"cpu"} and len(seen) >= 2  # a warm-up call, then the probes, all on CPU tensors
    monkeypatch.setattr(H, "_compiled", {})
    monkeypatch.setenv("MPT_LAB_COMPILE", "all")
    assert _kernel("cpu") is not _fine_indices_eager
    n_cpu = len(seen)
    if not torch.cuda.is_available():  # "all" compiles for CUDA on CUDA tensors: without CUDA the probe
        with pytest.warns(RuntimeWarning, match="unavailable for the histogram kernel on cuda"):  # fails, and
            assert _kernel("cuda") is H._fine_indices_search  # the search kernel is used
    assert set(seen[:n_cpu]) == {"cpu"} and "cpu" not in seen[n_cpu:]


def test_histograms_add_and_inputs():
    x, y = _random_values(1000, 1), _random_values(500, 2)
    h = log2_histogram(torch.from_numpy(x)) + log2_histogram(y)  # NumPy arrays too
    assert h == log2_histogram([torch.from_numpy(x), torch.from_numpy(y)])
    assert sum([log2_histogram(x), log2_histogram(y)]) == h
    assert log2_histogram(torch.from_numpy(x).half()).total == 1000  # other dtypes are converted
    assert log2_histogram([]).total == 0 and math.isnan(log2_histogram([]).fraction_zero())
    assert Log2Histogram.from_dict(h.to_dict()) == h
    with pytest.raises(TypeError):
        log2_histogram(torch.arange(3))
    with pytest.raises(TypeError):
        log2_histogram([1.0, 2.0])


def _classify(x: np.ndarray, fmt, scale: float) -> dict:
    """Reference: round every value with mpt_lab.formats.round_to and classify the result."""
    fin, zero = np.isfinite(x), x == 0
    y = np.where(fin, x.astype(np.float64) * scale, 0.0)
    r = F.round_to(y, fmt)
    nz = fin & ~zero
    if fmt.nan == "none":  # FP6/FP4 saturate: overflow is |y| at or beyond the rounding boundary above max
        over = nz & (np.abs(y) >= fmt.max + F.ulp(fmt.max, fmt) / 2)
    else:
        over = nz & ~np.isfinite(r)
    ar = np.abs(r)
    out = {
        "zero": zero.sum(),
        "nonfinite": (~fin).sum(),
        "overflow": over.sum(),
        "underflow": (nz & (r == 0)).sum(),
        "subnormal": (nz & ~over & (ar > 0) & (ar < fmt.smallest_normal)).sum(),
        "normal": (nz & ~over & (ar >= fmt.smallest_normal)).sum(),
    }
    return {k: int(v) / x.size for k, v in out.items()}


@pytest.mark.parametrize("fmt", ["FP16", "BF16", "TF32", "FP8_E5M2", "FP6_E3M2", "FP6_E2M3", "FP4_E2M1"])
@pytest.mark.parametrize("log2_scale", [0, 3, 15, -4, 24])
def test_fractions_match_round_to(fmt, log2_scale):
    x = np.concatenate([_edge_values(), _random_values(200_000, 7)])
    h = log2_histogram(torch.from_numpy(x))
    got = h.fractions(fmt, 2.0**log2_scale)
    want = _classify(x, F.get_format(fmt), 2.0**log2_scale)
    assert got == want
    assert math.isclose(sum(got.values()), 1.0)


def test_fractions_e4m3_exact_outside_the_documented_band():
    x = np.concatenate([_edge_values(), _random_values(200_000, 8)])
    y = np.abs(x.astype(np.float64))
    band = np.zeros_like(y, dtype=bool)
    for j in (0, 3):  # values whose scaled magnitude falls in (464, 480) are the documented exception
        band |= (y * 2.0**j > 464) & (y * 2.0**j < 480)
    x = x[~band]
    h = log2_histogram(torch.from_numpy(x))
    for j in (0, 3):
        assert h.fractions("FP8_E4M3", 2.0**j) == _classify(x, F.FP8_E4M3, 2.0**j)


def test_scale_and_format_arguments():
    h = log2_histogram(torch.tensor([2.0**-26, 2.0**-25, 2.0**-20, 1.0, 60000.0]))
    f = h.fractions("FP16")
    assert f["underflow"] == 2 / 5  # 2^-26 and the exact tie 2^-25 round to zero
    assert f["subnormal"] == 1 / 5 and f["normal"] == 2 / 5
    assert h.fractions("FP16", 2.0)["overflow"] == 1 / 5  # 120000 > 65504
    assert h.max_scale("FP16") == 1.0
    assert h.kept_fraction("FP16") == 3 / 5
    assert h.kept_fraction("FP16", 2.0**4) == 4 / 5  # 2^-22 and 2^-21 now subnormal; 960000 overflows
    for bad in (3.0, 0.0, -2.0, float("inf")):
        with pytest.raises(ValueError):
            h.fractions("FP16", bad)
    with pytest.raises(TypeError):
        h.fractions("FP16", "8")
    with pytest.raises(ValueError, match="no zero"):
        h.fractions("E8M0")
    with pytest.raises(ValueError, match="unknown format"):
        h.fractions("FP15")


def test_max_scale_is_the_largest_power_of_two_without_overflow():
    x = _random_values(50_000, 4)
    x = x[np.isfinite(x) & (np.abs(x) < 1e30)]
    h = log2_histogram(torch.from_numpy(x))
    s = h.max_scale("FP16")
    assert h.fractions("FP16", s)["overflow"] == 0 and h.fractions("FP16", 2 * s)["overflow"] > 0
    rule = 2.0 ** math.floor(math.log2(65504 / h.amax))  # the max-gradient rule: amax · S ≤ 65504
    assert rule <= s <= 2 * rule


def _tiny_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))


def test_activation_gradients_are_the_gradients_of_module_outputs():
    model = _tiny_model()
    x, y = torch.randn(5, 8), torch.tensor([0, 1, 2, 0, 1])
    with GradientHistogram(model, "activation", per_module=True) as gh:
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
    assert set(gh.by_module) == {"0", "1", "2"}
    # reference: the same gradients via autograd.grad
    h0 = model[0](x)
    h1 = model[1](h0)
    out = model[2](h1)
    g = torch.autograd.grad(torch.nn.functional.cross_entropy(out, y), [h0, h1, out])
    assert gh.histogram == log2_histogram(list(g))
    assert gh.by_module["1"] == log2_histogram(g[1])
    assert gh.calls == 3
    # hooks are gone after the with block
    model.zero_grad()
    torch.nn.functional.cross_entropy(model(x), y).backward()
    assert gh.calls == 3


def test_weight_gradients_pause_reset_and_selection():
    model = _tiny_model()
    x, y = torch.randn(5, 8), torch.tensor([0, 1, 2, 0, 1])
    with GradientHistogram(model, "weight") as gw:
        torch.nn.functional.cross_entropy(model(x), y).backward()
        assert gw.histogram == log2_histogram([p.grad for p in model.parameters()])
        gw.pause()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        assert gw.calls == 4
        gw.resume()
        gw.reset()
        assert gw.histogram.total == 0
    with GradientHistogram(model, "activation", modules=["2"]) as ga:
        torch.nn.functional.cross_entropy(model(x), y).backward()
    assert ga.histogram.total == 5 * 3
    with GradientHistogram(model, modules=lambda n, m: isinstance(m, torch.nn.ReLU)) as gr:
        torch.nn.functional.cross_entropy(model(x), y).backward()
    assert gr.histogram.total == 5 * 16
    with pytest.raises(ValueError, match="kind"):
        GradientHistogram(model, "bias")
    with pytest.raises(ValueError, match="no module"):
        GradientHistogram(model, modules=["nope"])
    with pytest.raises(TypeError):
        GradientHistogram("model")
    with torch.no_grad():  # no graph, nothing recorded, nothing breaks
        with GradientHistogram(model) as gn:
            model(x)
    assert gn.calls == 0


def test_channels_last_and_strided_inputs():
    x = torch.randn(4, 8, 5, 5) * 1e-5
    assert log2_histogram(x.to(memory_format=torch.channels_last)) == log2_histogram(x)
    assert log2_histogram(x[:, ::2]) == log2_histogram(x[:, ::2].contiguous())


def test_median_binade():
    assert log2_histogram([]).median_binade() is None
    assert log2_histogram(torch.tensor([0.0, -0.0, float("inf"), float("nan")])).median_binade() is None
    # zeros and non-finite values are left out: the median of {1, 3, 5, 100} lies in binade 1 ([2, 4))
    x = torch.tensor([0.0, 0.0, 0.0, 0.0, 0.0, float("nan"), 1.0, 3.0, -5.0, 100.0])
    assert log2_histogram(x).median_binade() == 1
    # an even split: the smallest binade whose cumulative count reaches half
    assert log2_histogram(torch.tensor([1.0, 1.5, 4.0, 6.0])).median_binade() == 0
    assert log2_histogram(torch.tensor([1.0, 1.5, 4.0, 6.0, 7.0])).median_binade() == 2
    assert log2_histogram(torch.tensor([2.0**-149])).median_binade() == -149
    assert log2_histogram(torch.tensor([3.0e38])).median_binade() == 127
    # against a sort on random values of every binade
    vals = _random_values(20_001, 11)
    fin = vals[np.isfinite(vals) & (vals != 0)]
    med = np.sort(np.abs(fin.astype(np.float64)))[(fin.size + 1) // 2 - 1]  # the ⌈n/2⌉-th smallest
    assert log2_histogram(torch.from_numpy(vals)).median_binade() == math.floor(math.log2(med))


def test_subtract_an_earlier_state():
    x, y = _random_values(3000, 12), _random_values(2000, 13)
    before = log2_histogram(x)
    after = before.copy().add_(y)
    diff = after - before
    want = log2_histogram(y)
    assert np.array_equal(diff.fine, want.fine) and (diff.zeros, diff.nonfinite) == (want.zeros, want.nonfinite)
    assert diff.total == y.size and diff.amax == after.amax
    assert (after - after).total == 0
    with pytest.raises(ValueError, match="earlier"):
        before - after
    with pytest.raises(ValueError, match="earlier"):
        log2_histogram(torch.tensor([1.0])) - log2_histogram(torch.tensor([2.0]))  # not a later state
    with pytest.raises(TypeError):
        after - 1
    with pytest.raises(TypeError):
        after - torch.zeros(3)


def test_meta_tensors_are_refused():
    meta = torch.empty(3, device="meta")
    with pytest.raises(ValueError, match="tensors holds a meta tensor"):
        log2_histogram(meta)
    with pytest.raises(ValueError, match="tensors holds a meta tensor"):
        log2_histogram([torch.ones(2), meta])
    with pytest.raises(ValueError, match="x holds a meta tensor"):
        Log2Histogram().add_(meta)


def test_tied_weights_are_recorded_once():
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(4, 4, bias=False), torch.nn.Tanh(), torch.nn.Linear(4, 4, bias=False))
    m[2].weight = m[0].weight  # one parameter, held by two modules
    assert sum(p.numel() for p in m.parameters()) == 16
    with GradientHistogram(m, "weight", per_module=True) as gh:
        m(torch.randn(3, 4)).sum().backward()
    assert gh.histogram.total == 16 and gh.calls == 1
    assert gh.histogram == log2_histogram(m[0].weight.grad)
    assert set(gh.by_module) == {"0.weight"}


def test_nothing_is_recorded_after_exit():
    model = _tiny_model()
    x, y = torch.randn(5, 8), torch.tensor([0, 1, 2, 0, 1])
    with GradientHistogram(model, "activation") as gh:
        loss = torch.nn.functional.cross_entropy(model(x), y)  # hooks go on the outputs of this forward
    loss.backward()  # after exit: nothing recorded
    with pytest.warns(UserWarning, match="recorded no gradient"):
        assert gh.calls == 0 and gh.histogram.total == 0
    with gh:  # a new block: its own forward records ...
        loss_old = torch.nn.functional.cross_entropy(model(x), y)
        loss_new = torch.nn.functional.cross_entropy(model(x), y)
        loss_new.backward()
    assert gh.calls == 3
    gh.close()
    loss_old.backward()  # ... and nothing after close()
    assert gh.calls == 3
    # a graph built in an earlier block records nothing in a later one
    with gh:
        stale = torch.nn.functional.cross_entropy(model(x), y)
    with gh:
        stale.backward()
    assert gh.calls == 3
    # weight hooks are removed on exit as before
    with GradientHistogram(model, "weight") as gw:
        pass
    torch.nn.functional.cross_entropy(model(x), y).backward()
    assert gw.calls == 0


def test_nested_module_outputs_are_recorded():
    torch.manual_seed(0)
    lstm = torch.nn.LSTM(3, 5)
    x = torch.randn(7, 2, 3)
    with GradientHistogram(lstm, "activation", per_module=True) as gh:
        out, (h, c) = lstm(x)
        (out.sum() + (h**2).sum() + (c**3).sum()).backward()
    out, (h, c) = lstm(x)
    g = torch.autograd.grad(out.sum() + (h**2).sum() + (c**3).sum(), [out, h, c])
    assert gh.calls == 3 and gh.histogram == log2_histogram(list(g))

    class Dict(torch.nn.Module):
        def forward(self, x):
            y = x * 4
            return {"a": x * 2, "b": [x * 3, (y, torch.arange(3))], "n": None, "again": y}

    module, x = Dict(), torch.randn(4, requires_grad=True)
    with GradientHistogram(module, "activation", modules=[""]) as gd:
        out = module(x)
        (out["a"].sum() + out["b"][0].sum() * 2 + out["b"][1][0].sum() * 3).backward()
    assert gd.calls == 3 and gd.histogram.total == 12
    assert gd.histogram == log2_histogram([torch.ones(4), torch.full((4,), 2.0), torch.full((4,), 3.0)])


# ------------------------------------------------------------------------------------------------------
# Issue 26, item 23: one module by name, the list of modules, warnings, and what FP16 loses
# ------------------------------------------------------------------------------------------------------
def _named_model():
    from collections import OrderedDict

    torch.manual_seed(0)
    return torch.nn.Sequential(OrderedDict(fc1=torch.nn.Linear(8, 16), act=torch.nn.ReLU(), fc2=torch.nn.Linear(16, 3)))


def test_a_single_name_is_one_module():
    model = _named_model()
    x, y = torch.randn(5, 8), torch.tensor([0, 1, 2, 0, 1])
    with (
        GradientHistogram(model, "activation", modules="fc1", per_module=True) as ga,
        GradientHistogram(model, "weight", modules="fc2", per_module=True) as gw,
    ):
        h = model.fc1(x)
        h.retain_grad()
        torch.nn.functional.cross_entropy(model.fc2(model.act(h)), y).backward()
    assert ga.module_names == ["fc1"] and set(ga.by_module) == {"fc1"} and ga.calls == 1
    assert ga.histogram == log2_histogram(h.grad)
    assert set(gw.by_module) == {"fc2.weight", "fc2.bias"}
    assert gw.histogram == log2_histogram([model.fc2.weight.grad, model.fc2.bias.grad])


def test_unknown_modules_are_listed_and_bad_selections_refused():
    model = _named_model()
    with pytest.raises(
        ValueError,
        match="no module named 'fc3', 'f' in the model; its modules are '' \\(the model itself\\), 'fc1', 'act', 'fc2'",
    ):
        GradientHistogram(model, modules=["fc1", "fc3", "f"])
    with pytest.raises(ValueError, match="'fc1'"):
        GradientHistogram(model, "weight", modules="fc")
    with pytest.raises(TypeError, match="modules must be None, a module name"):
        GradientHistogram(model, modules=3)
    with pytest.raises(TypeError, match="module names \\(str\\), got int"):
        GradientHistogram(model, modules=["fc1", 2])
    big = torch.nn.Sequential(*[torch.nn.ReLU() for _ in range(40)])
    with pytest.raises(ValueError, match="… \\(41 in all\\)"):
        GradientHistogram(big, modules="x")


def test_warns_when_never_started_or_nothing_was_recorded():
    import warnings

    model = _named_model()
    x, y = torch.randn(5, 8), torch.tensor([0, 1, 2, 0, 1])
    gh = GradientHistogram(model, "activation", per_module=True)
    torch.nn.functional.cross_entropy(model(x), y).backward()  # no `with`: nothing can be recorded
    with pytest.warns(UserWarning, match="never started.*inside `with GradientHistogram"):
        assert gh.histogram.total == 0
    with pytest.warns(UserWarning, match="never started"):
        assert gh.by_module == {}
    with pytest.warns(UserWarning, match="never started"):
        assert math.isnan(gh.underflow_share("FP16"))
    with gh:  # forward before the block: no hooks
        pass
    with pytest.warns(UserWarning, match="recorded no gradient"):
        gh.histogram
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # used as documented: no warning
        with gh:
            before = gh.histogram.copy()  # inside the block, before anything
            torch.nn.functional.cross_entropy(model(x), y).backward()
        assert (gh.histogram - before).total == gh.histogram.total > 0


@pytest.mark.parametrize("fmt, log2_scale", [("FP16", 0), ("FP16", 10), ("FP16", 20), ("BF16", 0), ("FP8_E5M2", 8)])
def test_underflow_share_counts_what_the_format_flushes(fmt, log2_scale):
    """underflow_share(fmt, S) of an FP32 recording = the share of recorded values g with g != 0 and
    round_to(g * S, fmt) == 0, value by value."""
    model = _named_model()
    x, y = torch.randn(64, 8), torch.randint(0, 3, (64,))
    scale = 2.0**log2_scale
    with GradientHistogram(model, "weight") as gw:
        (torch.nn.functional.cross_entropy(model(x), y) * 2.0**-24).backward()  # tiny gradients
    grads = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
    flushed = (grads != 0) & (F.round_to(grads * scale, fmt) == 0)
    assert gw.dtypes == {torch.float32}
    assert gw.underflow_share(fmt, scale) == flushed.sum().item() / grads.numel()
    if fmt == "FP16" and log2_scale <= 10:  # the case is not empty
        assert gw.underflow_share(fmt, scale) > (0.05 if log2_scale == 0 else 0.0)


def test_recording_an_fp16_autocast_run_sees_no_underflow_and_says_so():
    """The pitfall of the class docstring: during FP16 autocast + a GradScaler, activation gradients are
    float16 and already flushed: 'underflow' reads 0.0 and the lost values count as zeros.  underflow_share
    refuses them; a float32 recording of the same step measures what FP16 loses at that scale."""
    from mpt_lab.scaling import GradScaler

    x, y = torch.randn(64, 8), torch.randint(0, 3, (64,))
    tiny, S = 2.0**-30, 2.0**8  # a loss scale too small for these gradients

    model = _named_model()
    scaler = GradScaler("cpu", init_scale=S)
    with GradientHistogram(model, "activation", modules=["fc1", "act"]) as g16:
        with torch.autocast("cpu", dtype=torch.float16):
            loss = torch.nn.functional.cross_entropy(model(x), y) * tiny
        scaler.scale(loss).backward()
    assert g16.dtypes == {torch.float16}
    assert g16.histogram.fractions("FP16")["underflow"] == 0.0  # an FP16 value cannot underflow FP16
    with pytest.raises(ValueError, match="float16 tensors, recorded during a low precision run"):
        g16.underflow_share("FP16", scale=S)

    model = _named_model()
    with GradientHistogram(model, "activation", modules=["fc1", "act"]) as g32:
        (torch.nn.functional.cross_entropy(model(x), y) * tiny).backward()
    lost = g32.underflow_share("FP16", scale=S)
    assert lost > 0.1  # what the FP16 run really lost ...
    zeros16, zeros32 = g16.histogram.fraction_zero(), g32.histogram.fraction_zero()
    assert zeros16 > zeros32 + 0.1  # ... shows there as extra zeros


def test_a_compiled_kernel_that_disagrees_on_long_inputs_is_not_used(monkeypatch):
    """Inductor's CPU code for this kernel was seen wrong (indices past the histogram) with ATEN_CPU_CAPABILITY=avx2
    on an AVX-512 CPU, right on a handful of values and wrong from 16 on: the probe tries long inputs, and a
    kernel that fails it is replaced by the bucketize kernel (the same bins), with a warning."""

    def miscompiled(fn, **kw):
        def compiled(b):
            out = fn(b)  # the fine indices (one per value) or the amax (0-d)
            return out + 1 if out.dim() == 1 and b.numel() >= 16 else out  # indices right on short inputs only

        return compiled

    monkeypatch.setattr(H, "_compiled", {})
    monkeypatch.setattr(H, "_aten_capped", lambda: False)
    monkeypatch.setattr(torch, "compile", miscompiled)
    monkeypatch.setenv("MPT_LAB_COMPILE", "1")
    with pytest.warns(RuntimeWarning, match="bucketize"):
        assert _kernel("cpu") is H._fine_indices_search


def test_a_capped_aten_takes_the_bucketize_kernel_without_compiling(monkeypatch):
    """With ATen below the CPU's instruction set (ATEN_CPU_CAPABILITY=avx2 on an AVX-512 CPU), where torch.compile's
    code for this kernel was seen wrong beyond what the probes catch, the CPU takes the bucketize kernel: nothing is
    compiled and nothing warns; its histograms equal the eager kernel's."""
    assert isinstance(H._aten_capped(), bool)

    def no_compile(*a, **k):
        raise AssertionError("compiled although ATen is capped")

    monkeypatch.setattr(H, "_compiled", {})
    monkeypatch.setattr(H, "_aten_capped", lambda: True)
    monkeypatch.setattr(torch, "compile", no_compile)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert _kernel("cpu") is H._fine_indices_search
    x = torch.from_numpy(np.concatenate([_edge_values(), _random_values(50_000, 4)]))
    idx, amax = _kernel("cpu")(x)
    want_idx, want_amax = _fine_indices_eager(x)
    assert torch.equal(idx, want_idx) and torch.equal(amax, want_amax)


def _c_compiler() -> bool:
    import shutil

    return any(shutil.which(c) for c in ("cc", "gcc", "clang"))


@pytest.mark.skipif(not _c_compiler(), reason="no C compiler on this machine")
def test_the_c_kernel_equals_the_eager_kernel_on_every_bin_edge_and_random_bit_patterns():
    """The C kernel (log2_histogram's on the CPU) counts like the eager kernel at each fine bin's first bit pattern
    and its neighbours (subnormal binades included), both signs, inf and NaN, on two million random bit patterns
    split over one to four threads, and on the values of every small format with their midpoints; single values,
    empty and odd-sized parts included."""
    fn = H._native_kernel()
    assert fn is not None
    g = torch.Generator().manual_seed(11)
    rand = torch.randint(-(2**31), 2**31 - 1, (2_000_003,), generator=g, dtype=torch.int64).to(torch.int32)
    cases = [
        H._native_probe(),
        rand.view(torch.float32),
        torch.from_numpy(_edge_values()),
        torch.tensor([float("nan")]),
        torch.tensor([-(2.0**-149)]),
        torch.tensor([0.0, 0.0, 0.0]),
    ]
    for threads in (1, 2, 4):
        for x in cases:
            idx, amax = _fine_indices_eager(x)
            counts, got_amax = H._native_counts_parts(fn, x, threads)
            assert torch.equal(counts, torch.bincount(idx, minlength=H.NFINE)), (threads, x.numel())
            assert torch.equal(got_amax, amax), (threads, x.numel())


@pytest.mark.skipif(not _c_compiler(), reason="no C compiler on this machine")
def test_without_a_compiler_the_histogram_warns_and_counts_with_torch(tmp_path):
    """Where the C kernel cannot be built ($CC names no compiler, an empty cache), log2_histogram warns once,
    saying why, and counts with the torch.compile kernel: the same histogram; a second process with a
    compiler builds the library into the cache once and loads it from there afterwards."""
    import os
    import subprocess
    import sys

    code = (
        "import warnings, torch\n"
        "warnings.simplefilter('always')\n"
        "from mpt_lab import histogram as H\n"
        "x = torch.randn(300_000) * 1e-3\n"
        "x[7] = 0.0\n"
        "idx, amax = H._fine_indices_eager(x)\n"
        "with warnings.catch_warnings(record=True) as w:\n"
        "    warnings.simplefilter('always')\n"
        "    h = H.log2_histogram(x)\n"
        "    h2 = H.log2_histogram(x)\n"
        "assert h == h2 == H.Log2Histogram(torch.bincount(idx, minlength=H.NFINE), amax)\n"
        "print('native', H._c_histogram['fn'] is not None)\n"
        "print('warnings', [str(m.message) for m in w if 'C histogram kernel' in str(m.message)])\n"
    )
    env = {**os.environ, "MPT_LAB_CACHE_DIR": str(tmp_path), "MPT_LAB_COMPILE": "1"}
    bad = subprocess.run(
        [sys.executable, "-c", code], env={**env, "CC": "no-such-compiler"}, capture_output=True, text=True
    )
    assert bad.returncode == 0, bad.stderr[-2000:]
    assert "native False" in bad.stdout
    assert bad.stdout.count("C histogram kernel is unavailable") == 1 and "no-such-compiler" in bad.stdout
    assert not list(tmp_path.glob("*.so"))
    for _ in range(2):
        good = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
        assert good.returncode == 0, good.stderr[-2000:]
        assert "native True" in good.stdout and "warnings []" in good.stdout
    assert len(list(tmp_path.glob("mpt_lab_histogram-*.so"))) == 1


@pytest.mark.skipif(not _c_compiler(), reason="no C compiler on this machine")
def test_kernels_benchmark_runs(tmp_path):
    """benchmarks/histogram_kernels.py (quick profile): a row per kernel and kind of data, the three kernels'
    histograms checked equal inside, the ratio in the summary from the rows' medians."""
    from conftest import load_benchmark

    from mpt_lab.harness.runner import load_json

    out = tmp_path / "kernels.json"
    assert load_benchmark("histogram_kernels").main(["--profile", "quick", "--no-progress", "--out", str(out)]) == 0
    res = load_json(out)
    assert res["experiment"] == "histogram_kernels" and res["config"]["n"] == 300_000
    rows = {(r["data"], r["kernel"]): r for r in res["rows"]}
    assert set(rows) == {
        (d, k) for d in ("normal", "gradients") for k in ("C kernel", "torch.compile kernel", "bucketize kernel")
    }
    for d in ("normal", "gradients"):
        c, t = rows[(d, "C kernel")], rows[(d, "torch.compile kernel")]
        assert res["summary"][d] == pytest.approx(t["median_s"] / c["median_s"])
        assert c["ns_per_value"] == pytest.approx(c["median_s"] / 300_000 * 1e9) and len(c["times_s"]) == 2
