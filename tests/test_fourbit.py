"""Oracle tests of the ingredients of four-bit training and of the linear layer that combines them.

Sources: NVIDIA, "Pretraining Large Language Models with NVFP4" (arXiv:2509.25149): §4.2 and Appendix C (random
Hadamard transform H = S_d H_d / √d on tiles of d = 16 values), §4.3 (2D scaling of the weights in 16 × 16
tiles, with the FP32 tensor scale), §4.4 and Appendix E.3 (stochastic rounding of the gradients), Appendix B
(the two-level NVFP4 scales); Tseng et al., arXiv:2502.20586, and Castro et al. ("Quartet", arXiv:2505.14669)
for MXFP4 with stochastic rounding and Hadamard transforms.

The oracles:

* **Hadamard**: SciPy's ``scipy.linalg.hadamard`` (Sylvester's matrices); orthogonality exactly (d = 16: entries
  ±1/4, every sum exact in binary floating point); the float32 transform and its inverse against float64 within
  the rounding bound of a dot product of 16 terms (Higham, *Accuracy and Stability*, §3.1: |fl(xᵀy) − xᵀy| ≤
  γ_n |x|ᵀ|y|, γ_n = n·u / (1 − n·u), u = 2⁻²⁴), which the test derives for the round trip.
* **2D scaling**: an independent per-tile implementation written here with NumPy and ml_dtypes' E4M3, E8M0 and
  E2M1 conversions (NVIDIA's Appendix B formulas with the tile's amax); Q(W)ᵀ = Q(Wᵀ) exactly, and not for 1D.
* **Stochastic rounding to E2M1**: per element, the mean of n independent draws of an unbiased rounding of y
  between its neighbours lo ≤ y ≤ hi (spacing ulp = hi − lo) lies within t = k·ulp / (2√n) of y except with
  probability ≤ 2·exp(−k²/2) (Hoeffding's inequality for n variables in an interval of length ulp); one draw's
  variance is p(1 − p)·ulp² ≤ ulp²/4, so the standard deviation of the mean is at most ulp / (2√n) and k counts
  those.  k = 7 makes a false failure of one element less likely than 5·10⁻¹¹.
* **The linear layer**: each GEMM's operands against the exact quantisers (codes) applied to the same inputs in
  the same order of random draws, bit for bit (dequantised to float32, as the layer's GEMMs read them: element ×
  scales rounded once; on the exact data below that rounding is exact); each GEMM's product against the float64
  product of those operands, bit for bit on data where float32 accumulation is exact (every block then has the
  same scale, so every product is an integer multiple of one unit and every partial sum fits 24 bits), and
  within γ_L·|A||B|ᵀ (the bound of any summation order) otherwise.
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest
import torch
from torch import nn

from mpt_lab import formats as F
from mpt_lab.microscaling import (
    HADAMARD_BLOCK_SIZE,
    NVFP4Tensor,
    RandomHadamard,
    fake_quantize_mx,
    fake_quantize_nvfp4,
    hadamard_matrix,
    quantize_mx,
    quantize_nvfp4,
    quantize_per_tensor,
)
from mpt_lab.quantized_training import (
    TRAINING_RECIPES,
    GemmQuant,
    GemmRecipe,
    OperandQuant,
    Quantizer,
    TrainingRecipe,
    four_bit_recipe,
    quantize_linears_,
)

U32 = 2.0**-24


def gamma(n: int, u: float = U32) -> float:
    """γ_n = n·u / (1 − n·u): the relative error bound of a sum of n products (Higham, §3.1)."""
    return n * u / (1 - n * u)


def outlier_matrix(rows: int, cols: int, seed: int, scale: float = 1.0) -> torch.Tensor:
    """Gaussian values, 2% of them times 2⁴…2¹²: blocks with outliers, as activations have."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, cols, generator=g)
    hit = torch.rand(rows, cols, generator=g) < 0.02
    return torch.where(hit, x * 2.0 ** torch.randint(4, 13, (rows, cols), generator=g).float(), x) * scale


# ----------------------------------------------------------------------------------------------------------
# the random Hadamard transform
# ----------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("d", [1, 2, 4, 8, 16, 32, 64, 128])
def test_hadamard_matrix_is_sylvesters_and_orthogonal(d):
    scipy_linalg = pytest.importorskip("scipy.linalg")
    h = hadamard_matrix(d, normalized=False)
    assert torch.equal(h, torch.from_numpy(scipy_linalg.hadamard(d).astype(np.float64)))
    hn = hadamard_matrix(d)
    eye = torch.eye(d, dtype=torch.float64)
    if d in (1, 4, 16, 64):  # 1/√d is a power of two: every entry and every sum exact
        assert torch.equal(hn @ hn.t(), eye)
    else:
        assert (hn @ hn.t() - eye).abs().max() <= gamma(d, 2.0**-53) * 2
    assert torch.equal(hn, hn.t())


def test_random_hadamard_is_signs_times_sylvester_and_exactly_orthogonal():
    """H = S_d H_d / √d (arXiv:2509.25149, Appendix C): the signs flip whole rows; for d = 16 the entries are
    ±1/4 and H Hᵀ = Hᵀ H = I hold exactly, in float64 and in float32."""
    rht = RandomHadamard()
    assert rht.block_size == HADAMARD_BLOCK_SIZE == 16
    s = rht.signs()
    assert set(s.tolist()) == {-1.0, 1.0}
    m = rht.matrix()
    assert torch.equal(m, torch.diag(s) @ hadamard_matrix(16))
    assert torch.equal(m.abs(), torch.full((16, 16), 0.25, dtype=torch.float64))
    for dtype in (torch.float64, torch.float32):
        md = rht.matrix(dtype)
        eye = torch.eye(16, dtype=dtype)
        assert torch.equal(md @ md.t(), eye) and torch.equal(md.t() @ md, eye)


def test_random_hadamard_seeds_are_reproducible_and_different():
    signs = [RandomHadamard(16, seed).signs() for seed in range(12)]
    assert all(torch.equal(RandomHadamard(16, seed).signs(), signs[seed]) for seed in range(12))  # same seed
    distinct = {tuple(s.tolist()) for s in signs}
    assert len(distinct) == 12  # all different
    x = torch.randn(4, 64)
    assert torch.equal(RandomHadamard(16, 3).apply(x), RandomHadamard(16, 3).apply(x))
    assert not torch.equal(RandomHadamard(16, 3).apply(x), RandomHadamard(16, 4).apply(x))


@pytest.mark.parametrize("axis", [-1, 0])
def test_random_hadamard_and_its_inverse_against_float64(axis):
    """The float32 transform and round trip against float64, within the rounding bounds of 16-term dot products.

    Per tile v (16 values) and output j: y_j = Σ_i v_i·h_ij with |h_ij| = 1/4, so |fl32(y_j) − y_j| ≤ γ_16·‖v‖₁/4.
    The round trip z = fl(fl(v H) Hᵀ): the first error, carried through Hᵀ (entries 1/4, 16 terms), is at most
    16·(1/4)·γ_16·‖v‖₁/4 = γ_16·‖v‖₁; the second at most γ_16·‖fl(vH)‖₁/4 ≤ γ_16·(1 + γ_16)·‖v‖₁ (since
    ‖vH‖₁ ≤ 4‖v‖₁); together |z − v| ≤ 2.01·γ_16·‖v‖₁.
    """
    rht = RandomHadamard(16, seed=5)
    x = outlier_matrix(64, 48, seed=1) if axis == 0 else outlier_matrix(48, 64, seed=1)
    x64 = x.double()
    y32, y64 = rht.apply(x, axis=axis), rht.apply(x64, axis=axis)
    assert y32.dtype == torch.float32 and y64.dtype == torch.float64
    tiles = x64.abs().movedim(axis, -1).reshape(-1, 16).sum(1)  # ‖v‖₁ per tile
    l1 = tiles.repeat_interleave(16).reshape(x64.movedim(axis, -1).shape).movedim(-1, axis)
    assert ((y32.double() - y64).abs() <= gamma(16) * l1 / 4).all()
    z32 = rht.inverse(y32, axis=axis)
    assert ((z32.double() - x64).abs() <= 2.01 * gamma(16) * l1).all()
    z64 = rht.inverse(y64, axis=axis)
    assert ((z64 - x64).abs() <= 2.01 * gamma(16, 2.0**-53) * l1).all()
    assert not torch.equal(z32, x)  # rounding is there, and bounded
    # orthogonal: norms of every tile, and a product with both operands rotated, stay (float64)
    assert torch.allclose(y64.norm(), x64.norm(), rtol=1e-14)


def test_hadamard_on_both_operands_leaves_the_exact_product_and_changes_the_quantised_one():
    """(A H)(B H)ᵀ = A Bᵀ along the reduction (Appendix C, Eq. 6), exactly in float64 on integer data; quantised,
    Q(A H) Q(B H)ᵀ differs from Q(A) Q(B)ᵀ."""
    g = torch.Generator().manual_seed(0)
    a = torch.randint(-64, 65, (24, 96), generator=g).double()
    b = torch.randint(-64, 65, (40, 96), generator=g).double()
    rht = RandomHadamard(16, 9)
    assert torch.equal(rht.apply(a) @ rht.apply(b).t(), a @ b.t())  # integers/4: every sum exact
    qa, qb = fake_quantize_nvfp4(a.float()), fake_quantize_nvfp4(b.float())
    qha, qhb = fake_quantize_nvfp4(rht.apply(a.float())), fake_quantize_nvfp4(rht.apply(b.float()))
    assert not torch.equal(qa @ qb.t(), qha @ qhb.t())


def test_random_hadamard_refuses_bad_arguments():
    with pytest.raises(ValueError, match="power of two"):
        RandomHadamard(12)
    with pytest.raises(TypeError, match="block_size"):
        RandomHadamard(16.0)
    with pytest.raises(ValueError, match="seed"):
        RandomHadamard(16, -1)
    with pytest.raises(ValueError, match="multiple of block_size"):
        RandomHadamard(16).apply(torch.zeros(3, 24))
    with pytest.raises(TypeError, match="x must be a torch.Tensor"):
        RandomHadamard(16).apply(np.zeros((2, 16)))
    with pytest.raises(ValueError, match="axis"):
        RandomHadamard(16).apply(torch.zeros(2, 16), axis=2)
    with pytest.raises(ValueError, match="power of two"):
        hadamard_matrix(6)


# ----------------------------------------------------------------------------------------------------------
# 2D block scaling
# ----------------------------------------------------------------------------------------------------------
def _tile_amax(w: np.ndarray, t: int) -> np.ndarray:
    """Each value's t × t tile's amax (partial tiles at the edges their own), by loops over tiles."""
    out = np.empty_like(w)
    for i in range(0, w.shape[0], t):
        for j in range(0, w.shape[1], t):
            out[i : i + t, j : j + t] = np.abs(w[i : i + t, j : j + t]).max()
    return out


def nvfp4_2d_reference(w: torch.Tensor) -> np.ndarray:
    """NVFP4 with 16 × 16 tiles (arXiv:2509.25149, §4.3 and Appendix B), with NumPy float32 arithmetic and
    ml_dtypes' conversions, as torchao's reference orders the operations (decode scales): s_t = amax / 2688;
    per tile s_b = e4m3(clamp(fl32(amax_tile / 6) / s_t, 2⁻⁶, 448)); element e2m1(fl32(v · fl32(fl32(1/s_t) /
    s_b))) saturating at 6; value fl32(element · s_b · s_t).  Finite input only."""
    f32 = np.float32
    x = w.numpy().astype(f32)
    st = f32(np.abs(x).max()) / f32(6.0 * 448.0)
    sb = np.clip(_tile_amax(x, 16) / f32(6.0) / st, f32(2.0**-6), f32(448.0))
    sb = sb.astype(ml_dtypes.float8_e4m3fn).astype(f32)
    r = (f32(1.0) / st) / sb
    elem = np.clip(x * r, -6, 6).astype(ml_dtypes.float4_e2m1fn).astype(f32)
    return (elem * sb) * st


def mx_2d_reference(w: torch.Tensor, fmt: str, block: int) -> np.ndarray:
    """OCP MX with block × block tiles: X = 2^(⌊log2 amax_tile⌋ − emax) (OCP MX v1.0 §6.3 with the tile's amax),
    elements fmt(v / X) saturating (ml_dtypes' casts), value element · X.  Finite input, no all-zero tile."""
    dt = {"FP4_E2M1": ml_dtypes.float4_e2m1fn, "FP8_E4M3": ml_dtypes.float8_e4m3fn}[fmt]
    f = F.get_format(fmt)
    x = w.numpy().astype(np.float64)
    scale = np.exp2(np.floor(np.log2(_tile_amax(x, block))) - f.emax)
    v = np.clip(x / scale, -f.max, f.max).astype(np.float32)
    return v.astype(dt).astype(np.float64) * scale


@pytest.mark.parametrize("shape", [(48, 64), (40, 56), (17, 33)])
def test_nvfp4_2d_matches_an_independent_reference_and_transposes(shape):
    w = outlier_matrix(*shape, seed=sum(shape))
    ref = nvfp4_2d_reference(w)
    for axis in (-1, 0):
        q = quantize_nvfp4(w, blocks="2d", axis=axis)
        assert isinstance(q, NVFP4Tensor)
        assert np.array_equal(q.dequantize().numpy(), ref)
        assert torch.equal(fake_quantize_nvfp4(w, blocks="2d", axis=axis), q.dequantize())
    # Q(W)ᵀ = Q(Wᵀ) exactly, codes included, for 2D; not for 1D
    q, qt = quantize_nvfp4(w, blocks="2d"), quantize_nvfp4(w.t(), blocks="2d", axis=0)
    assert torch.equal(q.element_codes.t(), qt.element_codes) and torch.equal(q.scale_codes.t(), qt.scale_codes)
    assert torch.equal(q.dequantize().t(), quantize_nvfp4(w.t(), blocks="2d").dequantize())
    one_d = quantize_nvfp4(w).dequantize().t() != quantize_nvfp4(w.t()).dequantize()
    assert one_d.sum() > 0.05 * w.numel()  # 1D: the two copies of a weight differ
    # every 1 × 16 block of a tile carries the tile's scale: 16 rows share each scale code
    rows = q.scale_codes.shape[0]
    for i in range(0, rows, 16):
        tile_rows = q.scale_codes[i : i + 16]
        assert (tile_rows == tile_rows[0]).all()


@pytest.mark.parametrize("fmt", ["FP4_E2M1", "FP8_E4M3"])
def test_mx_2d_matches_an_independent_reference_and_transposes(fmt):
    w = outlier_matrix(70, 96, seed=3)
    ref = mx_2d_reference(w, fmt, 32)
    for axis in (-1, 0):
        q = quantize_mx(w, fmt, 32, axis, blocks="2d")
        assert np.array_equal(q.dequantize(torch.float64).numpy(), ref)
        assert torch.equal(fake_quantize_mx(w, fmt, 32, axis, blocks="2d"), q.dequantize())
    assert torch.equal(fake_quantize_mx(w, fmt, blocks="2d").t(), fake_quantize_mx(w.t(), fmt, blocks="2d"))
    assert not torch.equal(fake_quantize_mx(w, fmt).t(), fake_quantize_mx(w.t(), fmt))


def test_2d_tiles_with_nan_and_bad_arguments():
    w = outlier_matrix(32, 32, seed=4)
    w[3, 20] = math.nan
    q = fake_quantize_nvfp4(w, blocks="2d")
    assert q[:16, 16:].isnan().all() and not q[16:].isnan().any() and not q[:16, :16].isnan().any()
    assert torch.equal(q.isnan(), quantize_nvfp4(w, blocks="2d").dequantize().isnan())
    with pytest.raises(ValueError, match="2-d tensor"):
        quantize_nvfp4(torch.zeros(2, 16, 16), blocks="2d")
    with pytest.raises(ValueError, match="blocks"):
        fake_quantize_mx(torch.zeros(16, 32), "FP4_E2M1", blocks="3d")
    with pytest.raises(TypeError, match="blocks"):
        quantize_nvfp4(torch.zeros(16, 16), blocks=2)


# ----------------------------------------------------------------------------------------------------------
# stochastic rounding to E2M1 within a block
# ----------------------------------------------------------------------------------------------------------
E2M1 = np.array(F.values(F.FP4_E2M1))


def _neighbours(y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The E2M1 values lo ≤ y ≤ hi next to each y (|y| ≤ 6); lo = hi where y is an E2M1 value."""
    grid = np.unique(E2M1)
    i = np.clip(np.searchsorted(grid, y, side="right") - 1, 0, len(grid) - 1)
    lo = grid[i]
    hi = np.where(lo == y, lo, grid[np.minimum(i + 1, len(grid) - 1)])
    return lo, hi


def per_value(per_block: torch.Tensor, block: int, cols: int) -> torch.Tensor:
    """One value per block of a matrix (blocks along its rows) given to each of the block's values."""
    return per_block.repeat_interleave(block, dim=1)[:, :cols]


def _draws(x: torch.Tensor, n: int, quantize) -> torch.Tensor:
    """n independent stochastic roundings of x's elements in one call: x stacked n times along the rows (every
    copy has x's blocks and the same tensor amax, so the same scales).  Returns the elements, (n, *x.shape),
    float64."""
    return quantize(x.repeat(n, 1)).elements().reshape(n, *x.shape)


@pytest.mark.parametrize("name", ["nvfp4", "mxfp4_rceil", "mxfp4_floor"])
def test_stochastic_rounding_to_e2m1_is_unbiased_within_its_bound(name):
    """The mean of n stochastically rounded elements lies within 7·ulp/(2√n) of the value rounded, y = fl32(v·r)
    (the module docstring derives the bound); round-to-nearest is systematically off by more on most values; the
    only biased elements are those beyond ±6, which saturate (NVFP4: where the E4M3 block scale rounded down;
    MX with OCP's floor scale: up to 8), and ``saturated()`` names exactly those."""
    n, k = 4096, 7.0
    x = outlier_matrix(8, 64, seed=11) * 3.0
    g = torch.Generator().manual_seed(1234)
    if name == "nvfp4":

        def quantize(t, **kw):
            return quantize_nvfp4(t, **kw)
    else:
        rule = name.split("_")[1]

        def quantize(t, **kw):
            return quantize_mx(t, "FP4_E2M1", 32, scale_rounding=rule, **kw)

    elems = _draws(x, n, lambda t: quantize(t, rounding="stochastic", generator=g))
    # y: what was rounded, recomputed from the scales in the quantiser's float32 arithmetic
    q0 = quantize(x)
    if name == "nvfp4":
        sb = per_value(q0.block_scales(), 16, x.shape[1]).float()
        y = (x * ((1.0 / q0.tensor_scale) / sb)).double().numpy()
    else:
        y = (x.double() / per_value(q0.scales(), 32, x.shape[1])).numpy()  # v / X: exact
    sat = np.abs(y) > 6  # where stochastic rounding can reach 8
    assert not q0.saturated(x).numpy()[~sat].any()  # (saturated() counts |y| ≥ 7 under RTN)
    assert sat.any() == (name != "mxfp4_rceil")  # rceil saturates nothing, by construction
    lo, hi = _neighbours(np.clip(y, -6, 6))
    ulp = hi - lo
    mean = elems.mean(0).numpy()
    bound = k * ulp / (2 * math.sqrt(n))
    ok = ~sat
    assert (np.abs(mean - y)[ok] <= bound[ok]).all()
    assert ((elems.numpy() == lo) | (elems.numpy() == hi)).all()  # always one of the two neighbours
    assert np.all(mean[sat] * np.sign(y[sat]) < np.abs(y[sat]))  # saturated: biased toward zero
    # round to nearest on the same values: its error is a bias, larger than SR's bound on most of them
    rtn = quantize(x).elements().numpy()
    off = np.abs(rtn - y) > bound
    assert off[ok & (ulp > 0)].mean() > 0.5


def test_stochastic_rounding_exact_and_fast_twins_draw_the_same_bits():
    x = outlier_matrix(48, 80, seed=2)
    cases = [
        (lambda t, **kw: quantize_nvfp4(t, **kw).dequantize(), fake_quantize_nvfp4),
        (
            lambda t, **kw: quantize_mx(t, "FP4_E2M1", **kw).dequantize(),
            lambda t, **kw: fake_quantize_mx(t, "FP4_E2M1", **kw),
        ),
        (
            lambda t, **kw: quantize_mx(t, "FP8_E4M3", **kw).dequantize(),
            lambda t, **kw: fake_quantize_mx(t, "FP8_E4M3", **kw),
        ),
    ]
    for exact, fast in cases:
        for blocks in ("1d", "2d"):
            for axis in (-1, 0):
                kw = dict(axis=axis, blocks=blocks, rounding="stochastic")
                a = exact(x, **kw, generator=torch.Generator().manual_seed(7))
                b = fast(x, **kw, generator=torch.Generator().manual_seed(7))
                c = fast(x, **kw, generator=torch.Generator().manual_seed(8))
                assert torch.equal(a, b) and not torch.equal(b, c)
    # per-tensor FP8: unbiased too (y = fl32(x·scale) between two E4M3 values)
    n = 2048
    xs = outlier_matrix(4, 32, seed=3)
    q, scale = quantize_per_tensor(xs.repeat(n, 1), "FP8_E4M3", rounding="stochastic", generator=5)
    y = (xs * scale).double()
    mean = q.double().reshape(n, 4, 32).mean(0)
    ulp = torch.from_numpy(F.ulp(y.numpy(), "FP8_E4M3"))
    assert ((mean - y).abs() <= 7 * ulp / (2 * math.sqrt(n))).all()


# ----------------------------------------------------------------------------------------------------------
# the linear layer: three GEMMs against quantise-then-multiply
# ----------------------------------------------------------------------------------------------------------
def exact_block_data(rows: int, cols: int, seed: int, amax: float) -> torch.Tensor:
    """A matrix whose every run of 16 consecutive values along either dimension holds one value ±amax (at
    (i + j) % 16 == 0) and otherwise values of at most amax/2: every 1 × 16 and 16 × 1 block and every 16 × 16
    tile has amax = the tensor's amax.  With amax = 2688·2ᵏ the NVFP4 tensor scale is 2ᵏ and every block scale
    448, so every quantised value is a multiple of 224·2ᵏ: products of two are integer multiples of one unit,
    at most 144 of it, and float32 sums them exactly for up to 2²⁴/144 terms."""
    g = torch.Generator().manual_seed(seed)
    x = (torch.rand(rows, cols, generator=g) - 0.5) * amax
    i, j = torch.meshgrid(torch.arange(rows), torch.arange(cols), indexing="ij")
    sign = torch.where(torch.rand(rows, cols, generator=g) < 0.5, -1.0, 1.0)
    return torch.where((i + j) % 16 == 0, sign * amax, x)


def run_layer(recipe, x, w, b, g, seed=0):
    """A Linear layer with weight w, bias b under ``recipe``: forward on x, backward of the output gradient g.
    Returns (y, gx, gw, gb, quantizer) with the quantizer's captured operands."""
    lin = nn.Linear(w.shape[1], w.shape[0])
    with torch.no_grad():
        lin.weight.copy_(w)
        lin.bias.copy_(b)
    model = nn.Sequential(lin)
    q = quantize_linears_(model, recipe, seed=seed)
    q.capture = True
    xx = x.clone().requires_grad_()
    y = model(xx)
    y.backward(g)
    return y.detach(), xx.grad, model[0].weight.grad, model[0].bias.grad, q


def reference_operands(recipe: TrainingRecipe, x, w, g, seed=0, dtype=torch.float32) -> dict:
    """The operands of the three GEMMs by the exact quantisers (codes), the random Hadamard transform in float64
    where it is exact, and the random draws in the order the layer makes them (fprop A, B, dgrad A, B, wgrad A,
    B; each along its own reduction axis), dequantised to ``dtype`` (float32: element × scales rounded once, what
    the layer's GEMMs read; float64: exact).  GEMM name → (A, B), float64, product A @ B.T."""
    gen = torch.Generator().manual_seed(seed)
    spec = recipe.gemms

    def quant(t, op):
        if op.format == "fp32":
            return t.double()
        kw = dict(blocks=op.blocks, rounding=op.rounding, generator=gen if op.rounding == "stochastic" else None)
        if op.format == "nvfp4":
            return quantize_nvfp4(t.float(), **kw).dequantize(dtype).double()
        if op.format.startswith("mx"):
            fmt = {"mxfp4": "FP4_E2M1", "mxfp8_e4m3": "FP8_E4M3"}[op.format]
            return quantize_mx(t.float(), fmt, 32, scale_rounding=op.scale_rounding, **kw).dequantize(dtype).double()
        fmt = {"bf16": "BF16", "fp8_e4m3": "FP8_E4M3", "fp8_e5m2": "FP8_E5M2"}[op.format]
        qq, scale = quantize_per_tensor(
            t.float(),
            fmt,
            amax=F.get_format(fmt).max if fmt == "BF16" else None,
            rounding=op.rounding,
            generator=kw["generator"],
        )
        return (qq.double() / scale.double()).to(dtype).double()  # q / scale (rounded once to dtype)

    out = {}
    for name, a, b_ in (("fprop", x, w), ("dgrad", g, w.t()), ("wgrad", g.t(), x.t())):
        gemm = getattr(spec, name)
        if gemm.hadamard:
            rht = RandomHadamard(gemm.hadamard, spec.hadamard_seed)
            pad = -a.shape[1] % gemm.hadamard
            a, b_ = (torch.nn.functional.pad(t.contiguous(), (0, pad)) for t in (a, b_))
            if gemm.hadamard == 16:  # exact data: the float32 transform is the exact (float64) one
                a, b_ = (rht.apply(t.double()) for t in (a, b_))
                assert torch.equal(a.float().double(), a) and torch.equal(b_.float().double(), b_)
            else:  # entries ±1/√32 are rounded: the same float32 arithmetic
                a, b_ = rht.apply(a.float()), rht.apply(b_.float())
        out[name] = (quant(a.contiguous(), gemm.a), quant(b_.contiguous(), gemm.b))
    return out


RECIPES = {
    "nvfp4 recipe": four_bit_recipe(),
    "nvfp4 recipe without RHT": four_bit_recipe(hadamard=False),
    "nvfp4 plain": four_bit_recipe(hadamard=False, weights_2d=False, stochastic_gradients=False),
    "mxfp4 recipe": four_bit_recipe("mxfp4"),
}


@pytest.mark.parametrize("name", list(RECIPES))
def test_linear_gemms_match_quantise_then_multiply(name):
    """Every GEMM's operands equal the exact quantisers' bit for bit; fprop and dgrad equal the float64 product
    bit for bit (exact data: float32 accumulation exact); wgrad within γ_M·|A||B|ᵀ (its Hadamard transform
    gives the blocks different scales), and bit for bit where it has no transform."""
    recipe = RECIPES[name]
    m, k, n = 64, 48, 32
    amax = 2688.0 * 2.0**-8
    # integer multiples of 2⁻¹⁰ up to a few hundred: the Hadamard transform (entries ±1/4) is exact in float32
    x = (exact_block_data(m, k, 1, amax) * 1024).round() / 1024
    w = (exact_block_data(n, k, 2, amax) * 1024).round() / 1024
    g = (exact_block_data(m, n, 3, amax) * 1024).round() / 1024
    b = torch.zeros(n)  # y is then the fprop GEMM itself
    y, gx, gw, gb, q = run_layer(recipe, x, w, b, g, seed=3)
    ref = reference_operands(recipe, x, w, g, seed=3)
    exact = reference_operands(recipe, x, w, g, seed=3, dtype=torch.float64)
    for gemm in ("fprop", "dgrad", "wgrad"):
        a, bb = q.captured[("0", gemm)]
        ra, rb = ref[gemm]
        assert torch.equal(a.double(), ra) and torch.equal(bb.double(), rb), gemm
        if not getattr(recipe.gemms, gemm).hadamard:  # exact data: the float32 operands are exact
            assert torch.equal(ra, exact[gemm][0]) and torch.equal(rb, exact[gemm][1]), gemm
    exact_product = {gemm: ref[gemm][0] @ ref[gemm][1].t() for gemm in ref}
    assert torch.equal(y.double(), exact_product["fprop"])
    assert torch.equal(gx.double(), exact_product["dgrad"])
    wgrad = recipe.gemms.wgrad
    if recipe.gemms.fprop.hadamard == 0 and wgrad.hadamard == 0:
        assert torch.equal(gw.double(), exact_product["wgrad"])
    ra, rb = ref["wgrad"]
    bound = gamma(ra.shape[1]) * (ra.abs() @ rb.abs().t())
    assert ((gw.double() - exact_product["wgrad"]).abs() <= bound).all()
    assert torch.equal(gb, g.sum(0))  # the bias gradient: unquantised
    # the same seed gives the same gradients; another seed other ones (stochastic rounding)
    again = run_layer(recipe, x, w, b, g, seed=3)
    assert torch.equal(again[2], gw) and torch.equal(again[1], gx)
    if recipe.gemms.dgrad.a.rounding == "stochastic":
        assert not torch.equal(run_layer(recipe, x, w, b, g, seed=4)[2], gw)


def test_linear_on_random_data_within_the_accumulation_bound():
    """On random data with outliers (block scales all different), each GEMM's float32 result is within
    γ_L·|A||B|ᵀ of the float64 product of the captured operands, which equal the exact quantisers'."""
    recipe = four_bit_recipe()
    x, w, g = outlier_matrix(80, 48, 5), outlier_matrix(40, 48, 6) * 0.05, outlier_matrix(80, 40, 7) * 1e-3
    b = torch.zeros(40)
    y, gx, gw, _, q = run_layer(recipe, x, w, b, g, seed=1)
    out = {"fprop": y, "dgrad": gx, "wgrad": gw}
    for gemm, (a, bb) in ((k[1], v) for k, v in q.captured.items()):
        exact = a.double() @ bb.double().t()
        bound = gamma(a.shape[1]) * (a.double().abs() @ bb.double().abs().t())
        assert ((out[gemm].double() - exact).abs() <= bound).all(), gemm
        assert (out[gemm].double() != exact).any() or gemm == "fprop"  # rounding happens somewhere


def test_recipe_without_ingredients_is_the_nvfp4_recipe_bit_for_bit():
    """All GEMMs NVFP4 1 × 16, round to nearest, no transform: the same outputs and gradients as chapter 11's
    ``nvfp4`` recipe (the path that quantises per role), on a two-layer model."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 48), nn.GELU(), nn.Linear(48, 32))
    x = outlier_matrix(40, 64, 8)
    results = []
    for recipe in ("nvfp4", four_bit_recipe(hadamard=False, weights_2d=False, stochastic_gradients=False)):
        m = nn.Sequential(
            *(
                nn.Linear(layer.in_features, layer.out_features) if isinstance(layer, nn.Linear) else layer
                for layer in model
            )
        )
        m.load_state_dict(model.state_dict())
        quantize_linears_(m, recipe)
        xx = x.clone().requires_grad_()
        out = m(xx)
        out.square().sum().backward()
        results.append([out.detach(), xx.grad] + [p.grad for p in m.parameters()])
    assert all(torch.equal(a, b) for a, b in zip(*results))
    assert TRAINING_RECIPES["nvfp4"].gemms is None


@pytest.mark.parametrize("fmt", ["bf16", "fp8_e4m3", "fp8_e5m2", "mxfp8_e4m3"])
def test_operand_formats_of_eight_and_sixteen_bits(fmt):
    """Per-tensor formats (and MXFP8) in every GEMM: the operands equal the exact quantisers' and the products
    the float64 product within the accumulation bound."""
    op = OperandQuant(fmt)
    recipe = TrainingRecipe("t", "t", gemms=GemmRecipe(GemmQuant(op, op), GemmQuant(op, op), GemmQuant(op, op)))
    x, w, g = outlier_matrix(32, 64, 1), outlier_matrix(48, 64, 2) * 0.02, outlier_matrix(32, 48, 3) * 1e-3
    y, gx, gw, _, q = run_layer(recipe, x, w, torch.zeros(48), g)
    ref = reference_operands(recipe, x, w, g)
    for gemm, out in (("fprop", y), ("dgrad", gx), ("wgrad", gw)):
        a, bb = q.captured[("0", gemm)]
        assert torch.equal(a.double(), ref[gemm][0]) and torch.equal(bb.double(), ref[gemm][1]), gemm
        exact = ref[gemm][0] @ ref[gemm][1].t()
        assert ((out.double() - exact).abs() <= gamma(a.shape[1]) * (a.double().abs() @ bb.double().abs().t())).all()


def test_recipe_statistics_evaluation_and_layers_kept_in_bf16():
    torch.manual_seed(1)
    model = nn.Sequential(nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 16))
    q4 = quantize_linears_(model, four_bit_recipe(), skip=("2",))
    q16 = quantize_linears_(model, "bf16")  # the layer left out: kept in BF16
    assert q4.layers == ["0"] and q16.layers == ["2"]
    x = torch.randn(64, 32)
    q4.recording = True
    model(x).square().mean().backward()
    assert set(q4.stats["0"]) == {"x", "w", "g"} and q4.stats["0"]["x"]["n"] == x.numel()
    assert q4.stats["0"]["g"]["n"] == 64 * 32 and q4.stats["0"]["w"]["n"] == 32 * 32
    with torch.no_grad():  # evaluation: the forward GEMM only, same values
        ev = model(x)
    q4.recording = False
    assert torch.equal(ev, model(x).detach())
    assert four_bit_recipe().describe()["gemms"] == {
        "fprop": "NVFP4 × NVFP4 2D",
        "dgrad": "NVFP4 SR × NVFP4 2D",
        "wgrad": "NVFP4 SR × NVFP4, RHT 16",
    }


def test_four_bit_recipe_is_the_papers_and_its_ablations():
    """§4 of arXiv:2509.25149: 2D weights, 1 × 16 activations and gradients, SR on gradients only, RHT of 16
    on the two inputs of wgrad only; MXFP4 with RHT 32 (§5)."""
    r = four_bit_recipe().gemms
    assert r.fprop == GemmQuant(OperandQuant("nvfp4"), OperandQuant("nvfp4", "2d"))
    assert r.dgrad == GemmQuant(OperandQuant("nvfp4", rounding="stochastic"), OperandQuant("nvfp4", "2d"))
    assert r.wgrad == GemmQuant(OperandQuant("nvfp4", rounding="stochastic"), OperandQuant("nvfp4"), hadamard=16)
    assert four_bit_recipe(hadamard=False).gemms.wgrad.hadamard == 0
    assert four_bit_recipe(weights_2d=False).gemms.fprop.b.blocks == "1d"
    assert four_bit_recipe(stochastic_gradients=False).gemms.dgrad.a.rounding == "nearest_even"
    assert four_bit_recipe("mxfp4").gemms.wgrad.hadamard == 32
    assert four_bit_recipe("mxfp4").gemms.dgrad.a.scale_rounding == "rceil"
    assert four_bit_recipe(hadamard=False).name == "nvfp4_recipe-rht"


def test_per_gemm_recipes_refuse_bad_arguments():
    with pytest.raises(ValueError, match="format"):
        OperandQuant("fp7")
    with pytest.raises(ValueError, match="blocks='2d'"):
        OperandQuant("fp8_e4m3", "2d")
    with pytest.raises(ValueError, match="rounding"):
        OperandQuant("nvfp4", rounding="up")
    with pytest.raises(TypeError, match="a must be an OperandQuant"):
        GemmQuant("nvfp4")
    with pytest.raises(ValueError, match="power of two"):
        GemmQuant(hadamard=12)
    with pytest.raises(TypeError, match="fprop must be a GemmQuant"):
        GemmRecipe(fprop=OperandQuant())
    with pytest.raises(ValueError, match="fmt"):
        four_bit_recipe("fp8")
    with pytest.raises(TypeError, match="hadamard must be a bool"):
        four_bit_recipe(hadamard=16)
    with pytest.raises(TypeError, match="seed"):
        Quantizer(four_bit_recipe(), seed=-1)


def test_benchmark_script_runs_and_reports_every_case(tmp_path):
    """The speed benchmark runs at a tiny size (no timing asserted: ARCHITECTURE.md) and records what it timed."""
    import json

    from conftest import load_benchmark

    out = tmp_path / "fourbit.json"
    assert load_benchmark("fourbit_speed").main(["--profile", "quick", "--no-progress", "--out", str(out)]) == 0
    res = json.loads(out.read_text())
    assert [r["case"] for r in res["rows"]] == ["fp32", "nvfp4", "nvfp4_recipe"]
    assert all(len(r["times_s"]) == res["config"]["repeat"] and r["step_s"] > 0 for r in res["rows"])
    assert set(res["summary"]) == {
        "nvfp4 / fp32",
        "nvfp4 / fp32 (CPU time)",
        "nvfp4_recipe / fp32",
        "nvfp4_recipe / fp32 (CPU time)",
    }
    assert "RHT 16" in res["rows"][2]["recipe"] and res["model"]["linear_layers"] == 5
    assert res["provenance"]["command"].startswith("python benchmarks/fourbit_speed.py --profile quick")
