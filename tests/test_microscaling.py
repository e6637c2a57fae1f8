"""Tests of :mod:`mpt_lab.microscaling` against independent references.

References
----------
* **ml_dtypes** (element casts): every code of each MX element format, times every E8M0 scale, the midpoints
  between neighbouring values (ties) and the float32 neighbours of all of those, must give ml_dtypes' own
  round-to-nearest-even cast (after clipping to ±max: saturation) of v / X, and the scale code X was made for.
* **torchao 0.18.0** (``torchao.prototype.mx_formats``, its pure-PyTorch reference code ``to_mx`` and
  ``nvfp4_quantize``, which runs on the CPU): scale codes and element codes of random tensors with outliers,
  zeros, float32 subnormals, all-zero blocks, RNE ties and inf/NaN, for every element format, every
  scale-rounding mode, float32 and bfloat16 input.  torchao differs from OCP MX in three documented places,
  and those blocks are checked against a model of torchao's behaviour instead (with their own counts):
  (1) blocks whose scale is 2⁻¹²⁷ (code 0) but hold non-zero values: torchao divides by 2⁻¹²⁶ (it clamps the
  float32 scale to the smallest normal, a Triton workaround; its RCEIL fallback multiplies by 1.0 instead) but
  stores code 0; (2) blocks holding an infinity (and no NaN): torchao reads the exponent field of inf (255)
  and stores the finite code 255 − emax (RCEIL: 254) where OCP's reference code gives NaN; (3) RCEIL only:
  torchao takes ⌈log2⌉ of fl32(amax / max) with float32 ``torch.log2``, which rounds to an integer when amax /
  max lies just above a power of two (relative distance below ~2⁻²⁰), one code below the exact rule.
* **An independent reference written here** (runs with or without torchao): per block, in Python with
  ``fractions.Fraction``, the OCP MX v1.0 §6.3 rule (and the other scale rules) and round-to-nearest-even on a
  table of the element format's values enumerated by ml_dtypes; it covers what torchao cannot: partial last
  blocks, blocks along any axis, float64 and float16 input, block sizes other than 32.
* **NVFP4**: torchao's ``nvfp4_quantize`` (two-level and single-level scaling), and NVIDIA's algorithm written
  again here with NumPy float32 arithmetic and ml_dtypes casts.
* **Transformer Engine** (not installable here): its documented formulas, written here with NumPy float32
  arithmetic: scale = (fp8_max / amax) / 2^margin, amax from the history by "max" or "most_recent", the
  history rolled after each step, the previous scale kept where amax is 0 or not finite; and torchao's float8
  training conversion (``hp_tensor_to_float8_dynamic``, the cast that ``Float8LinearConfig(emulate=True)``
  uses), which computes the same scale.

Every comparison is bit for bit on codes (and on dequantised values where they are exact), with zero
mismatches allowed; each test prints the number of values and blocks it tried (run with ``-s`` to see them).
"""

from __future__ import annotations

import functools
import math
import warnings
from fractions import Fraction

import ml_dtypes as md
import numpy as np
import pytest
import torch

from mpt_lab import formats as F
from mpt_lab import microscaling as M
from mpt_lab.formats import FP4_E2M1, FP6_E2M3, FP6_E3M2, FP8_E4M3, FP8_E5M2
from mpt_lab.histogram import log2_histogram

torch.set_num_threads(1)

pytestmark = pytest.mark.filterwarnings(r"ignore:(invalid value|overflow) encountered:RuntimeWarning")

ML = {
    FP8_E4M3: md.float8_e4m3fn,
    FP8_E5M2: md.float8_e5m2,
    FP6_E3M2: md.float6_e3m2fn,
    FP6_E2M3: md.float6_e2m3fn,
    FP4_E2M1: md.float4_e2m1fn,
}
FORMATS = list(ML)
RULES = M.SCALE_ROUNDINGS
F32_MAX = float(np.finfo(np.float32).max)


def _seed(*parts) -> int:
    return sum((i + 1) * sum(map(ord, str(p))) for i, p in enumerate(parts)) * 7919 + 4242


def report(what: str, **counts) -> None:
    print(f"[microscaling] {what}: " + ", ".join(f"{k} {v:,}" for k, v in counts.items()), flush=True)


# ----------------------------------------------------------------------------------------------------------
# torchao (optional: the independent reference below runs without it)
# ----------------------------------------------------------------------------------------------------------
@functools.cache
def _torchao():
    """torchao's reference functions (imported on first use, so that collecting this file imports nothing
    more), or the reason they cannot be imported."""
    try:
        import logging

        logging.getLogger("torchao").setLevel(logging.ERROR)  # "Failed to load ... .so" (CUDA kernels)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from torchao.float8.float8_scaling_utils import hp_tensor_to_float8_dynamic
            from torchao.float8.float8_training_tensor import LinearMMConfig
            from torchao.prototype.mx_formats import constants as C
            from torchao.prototype.mx_formats.config import ScaleCalculationMode
            from torchao.prototype.mx_formats.kernels import unpack_uint4
            from torchao.prototype.mx_formats.mx_tensor import to_dtype, to_mx
            from torchao.prototype.mx_formats.nvfp4_tensor import nvfp4_quantize, per_tensor_amax_to_scale
    except Exception as exc:  # pragma: no cover - torchao is in requirements.txt
        return f"torchao's reference code is not importable here ({type(exc).__name__}: {exc})"
    return dict(
        to_mx=to_mx,
        to_dtype=to_dtype,
        mode=ScaleCalculationMode,
        unpack=unpack_uint4,
        C=C,
        nvfp4=nvfp4_quantize,
        amax_to_scale=per_tensor_amax_to_scale,
        dynamic=hp_tensor_to_float8_dynamic,
        mm_config=LinearMMConfig,
    )


def torchao_or_skip() -> dict:
    ao = _torchao()
    if isinstance(ao, str):
        pytest.skip(ao)
    return ao


def ao_dtype(fmt):
    C = _torchao()["C"]
    return {
        FP8_E4M3: torch.float8_e4m3fn,
        FP8_E5M2: torch.float8_e5m2,
        FP6_E3M2: C.DTYPE_FP6_E3M2,
        FP6_E2M3: C.DTYPE_FP6_E2M3,
        FP4_E2M1: torch.float4_e2m1fn_x2,
    }[fmt]


def ao_mx(x: torch.Tensor, fmt, rule: str, block: int = 32):
    """torchao's to_mx: (scale codes (rows, nblocks), element codes (x's shape), raw outputs)."""
    mode = {"floor": "FLOOR", "ceil": "CEIL", "even": "EVEN", "rceil": "RCEIL"}[rule]
    ao = _torchao()
    s, d = ao["to_mx"](x, ao_dtype(fmt), block, getattr(ao["mode"], mode))
    if fmt == FP4_E2M1:
        codes = ao["unpack"](d)
    elif fmt in (FP8_E4M3, FP8_E5M2):
        codes = d.view(torch.uint8)
    else:
        codes = d
    return s.view(torch.uint8), codes.reshape(x.shape), (s, d)


# ----------------------------------------------------------------------------------------------------------
# independent references: element tables from ml_dtypes, exact rounding, the OCP rule per block
# ----------------------------------------------------------------------------------------------------------
@functools.cache
def table(fmt):
    """Non-negative finite values of fmt (ascending) and their codes, as ml_dtypes decodes every code."""
    codes = np.arange(1 << (fmt.bits - 1), dtype=np.uint8)
    with np.errstate(invalid="ignore"):
        vals = codes.view(ML[fmt]).astype(np.float64)
    ok = np.isfinite(vals)
    vals, codes = vals[ok], codes[ok]
    assert np.all(np.diff(vals) > 0)
    return vals, codes


def ml_codes(y32: np.ndarray, fmt) -> np.ndarray:
    """ml_dtypes' cast of float32 values, clipped to ±max first (saturation): codes (uint8)."""
    y = np.clip(np.asarray(y32, dtype=np.float32), -fmt.max, fmt.max)
    return y.astype(ML[fmt]).view(np.uint8) & ((1 << fmt.bits) - 1)


def grid_codes(y: np.ndarray, fmt) -> np.ndarray:
    """Exact round-to-nearest-even of float64 values to fmt with saturation, by search in ``table(fmt)``:
    the nearer of the two neighbours (compared exactly as 2|y| against lo + hi), a tie to the even code."""
    V, C = table(fmt)
    y = np.asarray(y, dtype=np.float64)
    a = np.abs(y)
    i = np.clip(np.searchsorted(V, a, side="right") - 1, 0, len(V) - 1)
    j = np.minimum(i + 1, len(V) - 1)
    d = 2 * a - (V[i] + V[j])
    up = (d > 0) | ((d == 0) & (C[i] % 2 == 1))
    code = np.where(i == len(V) - 1, C[-1], np.where(up, C[j], C[i])).astype(np.uint8)
    return code | np.where(np.signbit(y), np.uint8(1 << (fmt.bits - 1)), np.uint8(0))


def decode_table(codes: np.ndarray, fmt) -> np.ndarray:
    """float64 values of element codes, through ml_dtypes."""
    with np.errstate(invalid="ignore"):
        return np.asarray(codes, dtype=np.uint8).view(ML[fmt]).astype(np.float64)


def floor_log2(q: Fraction) -> int:
    """⌊log2 q⌋ of a positive Fraction, with integers only."""
    n, d = q.numerator, q.denominator
    e = n.bit_length() - d.bit_length()  # 2^(e-1) < q < 2^(e+1)
    return e - 1 if (n << max(-e, 0)) < (d << max(e, 0)) else e


def ceil_log2(q: Fraction) -> int:
    e = floor_log2(q)
    return e if Fraction(2) ** e == q else e + 1


def round_significant(q: Fraction, p: int) -> Fraction:
    """q > 0 rounded to p significant bits, ties to even (exponent unbounded)."""
    quantum = Fraction(2) ** (floor_log2(q) - p + 1)
    n, rem = divmod(q, quantum)
    n = int(n)
    if rem * 2 > quantum or (rem * 2 == quantum and n % 2):
        n += 1
    return n * quantum


def ref_scale_code(block: list, fmt, rule: str) -> int:
    """OCP MX v1.0 §6.3 (and the other rules) for one block of Python floats: the E8M0 code, 255 for NaN."""
    if any(math.isnan(v) or math.isinf(v) for v in block):
        return 255
    amax = Fraction(max(abs(v) for v in block))  # abs and max of floats are exact
    if amax == 0:
        return 0
    if rule == "floor":
        k = floor_log2(amax) - fmt.emax
    elif rule == "ceil":
        k = ceil_log2(amax) - fmt.emax
    elif rule == "even":
        k = floor_log2(round_significant(amax, fmt.mantissa_bits + 1)) - fmt.emax
    else:  # rceil: the smallest power of two X with amax / X <= max
        k = ceil_log2(amax / Fraction(fmt.max))
    k = max(k, -127)
    return 255 if k > 127 else k + 127


def ref_mx(x: np.ndarray, fmt, rule: str, block: int):
    """Reference MX quantisation of a 2-D float64 array along its last axis (the last block may be shorter):
    (scale codes (rows, nblocks), element codes (rows, n), dequantised float64 values).  The scale per block
    in Python (:func:`ref_scale_code`); the elements v / X (exact: X is a power of two) by :func:`grid_codes`."""
    rows, n = x.shape
    nb = -(-n // block)
    flat = x.tolist()
    scodes = np.array(
        [[ref_scale_code(flat[r][b * block : (b + 1) * block], fmt, rule) for b in range(nb)] for r in range(rows)],
        dtype=np.uint8,
    ).reshape(rows, nb)
    X = np.repeat(np.exp2(scodes.astype(np.float64) - 127), block, axis=1)[:, :n]
    live = np.repeat(scodes != 255, block, axis=1)[:, :n]
    with np.errstate(invalid="ignore"):
        codes = np.where(live, grid_codes(np.where(live, x / X, 0.0), fmt), 0).astype(np.uint8)
        deq = np.where(live, decode_table(codes, fmt) * X, np.nan)
    return scodes, codes, deq


# ----------------------------------------------------------------------------------------------------------
# test data
# ----------------------------------------------------------------------------------------------------------
def mx_cases(rows: int, n: int, seed: int, fmt=FP8_E4M3) -> dict:
    """name -> float32 array (rows, n): the kinds of blocks the references are compared on (block size 32)."""
    rng = np.random.default_rng(seed)
    nb = n // 32
    out = {"normal": rng.standard_normal((rows, n))}
    x = rng.standard_normal((rows, n))
    hit = rng.random((rows, n)) < 0.01
    out["outliers"] = np.where(hit, x * np.exp2(rng.integers(4, 25, (rows, n))), x)
    # every binade of float32 across blocks: block exponent uniform in [-160, 126], values spread below it
    e = rng.integers(-160, 127, (rows, nb, 1)) - rng.integers(0, 24, (rows, nb, 32))
    out["binades"] = (
        rng.choice([-1.0, 1.0], (rows, nb, 32)) * (1 + rng.random((rows, nb, 32))) * np.exp2(e.astype(np.float64))
    ).reshape(rows, n)
    # zeros: a quarter of the values, every 5th block all zero, every 7th block float32 subnormals only
    z = rng.standard_normal((rows, nb, 32)) * (rng.random((rows, nb, 32)) > 0.25)
    z[:, ::5] = 0.0
    sub = rng.integers(1, 1 << 23, (rows, nb, 32)).astype(np.uint32).view(np.float32)
    sub *= rng.choice([-1, 1], (rows, nb, 32)).astype(np.float32)
    z[:, 3::7] = sub[:, 3::7]
    z[:, 4::11] = -0.0
    out["zeros_subnormals"] = z.reshape(rows, n)
    # ties: values and midpoints of fmt's grid times a block's scale, the block max anchoring the scale
    V, _ = table(fmt)
    grid = np.concatenate([V, (V[1:] + V[:-1]) / 2])
    k = rng.integers(-126 + fmt.emax + 1, 120, (rows, nb, 1)).astype(np.float64)
    t = rng.choice(grid, (rows, nb, 32)) * rng.choice([-1.0, 1.0], (rows, nb, 32))
    t[:, :, 0] = 2.0**fmt.emax
    out["ties"] = (t * np.exp2(k - fmt.emax)).reshape(rows, n)
    # inf / NaN in some blocks
    f = rng.standard_normal((rows, nb, 32))
    for val, stride, off in ((np.nan, 9, 1), (np.inf, 13, 2), (-np.inf, 17, 3)):
        f[:, off::stride, rng.integers(0, 32)] = val
    out["nonfinite"] = f.reshape(rows, n)
    with np.errstate(over="ignore"):
        return {name: v.astype(np.float32) for name, v in out.items()}


def block_kinds(x: np.ndarray, block: int = 32) -> dict:
    """Per block (rows, nblocks) booleans: nan (holds a NaN), inf (holds an infinity, no NaN)."""
    xb = x.reshape(x.shape[0], -1, block)
    nan = np.isnan(xb).any(-1)
    return {"nan": nan, "inf": np.isinf(xb).any(-1) & ~nan}


# ----------------------------------------------------------------------------------------------------------
# element casts and scales: every code, every E8M0 scale
# ----------------------------------------------------------------------------------------------------------
def exhaustive_blocks(fmt, dtype):
    """Blocks (float64 array (B, 32)) and the E8M0 code each must get: for every scale code k and every
    non-negative element value, midpoint and (for float32) the float32 neighbours of those, both signs, 31
    values per block behind an anchor 2^emax·X that fixes the block's floor scale to X = 2^(k − 127)."""
    V, _ = table(fmt)
    pts = np.concatenate([V, (V[1:] + V[:-1]) / 2, [fmt.max + 2.0 ** (fmt.emax - fmt.mantissa_bits - 1)]])
    blocks, want = [], []
    for k in range(255):
        X = 2.0 ** (k - 127)
        if dtype == torch.float32 and 2.0 ** (fmt.emax + 1) * X > F32_MAX:
            continue  # values beyond float32's range
        v = pts * X
        if dtype == torch.float32:
            v32 = v.astype(np.float32)
            v = np.concatenate([v32, np.nextafter(v32, np.float32(np.inf)), np.nextafter(v32, np.float32(0))]).astype(
                np.float64
            )
        v = np.concatenate([v, -v])
        v = v[np.abs(v) < 2.0 ** (fmt.emax + 1) * X]
        v = np.concatenate([v, np.zeros(-len(v) % 31)]).reshape(-1, 31)
        anchor = np.full((len(v), 1), 2.0**fmt.emax * X)
        blocks.append(np.concatenate([anchor, v], axis=1))
        want.append(np.full(len(v), k, dtype=np.uint8))
    return np.concatenate(blocks), np.concatenate(want)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("fmt", FORMATS, ids=str)
def test_every_element_code_at_every_scale(fmt, dtype):
    """Every element value, tie and neighbour (both signs) at every E8M0 scale: the scale code is the one the
    block was built for, and each element code is ml_dtypes' cast of v / X (float32) or the exact rounding
    on ml_dtypes' value table (float64, where ml_dtypes' own cast rounds through float32)."""
    blocks, want_scale = exhaustive_blocks(fmt, dtype)
    t = M.quantize_mx(torch.from_numpy(blocks).to(dtype), fmt)
    assert torch.equal(t.scale_codes.view(-1), torch.from_numpy(want_scale))
    y = blocks / np.exp2(want_scale.astype(np.float64) - 127)[:, None]
    want = ml_codes(y.astype(np.float32), fmt) if dtype == torch.float32 else grid_codes(y, fmt)
    if dtype == torch.float32:
        big = np.abs(y) >= 2.0**-126  # y is exact in float32 (below: rounds to 0 anyway)
        assert np.array_equal(y.astype(np.float32).astype(np.float64)[big], y[big])
        assert np.array_equal(want, grid_codes(y, fmt))  # the two references agree
    got = t.element_codes.numpy()
    bad = got != want
    assert not bad.any(), (
        f"{bad.sum()} element codes differ; inputs {blocks[bad][:5]}, got {got[bad][:5]}, want {want[bad][:5]}"
    )
    deq = t.dequantize(torch.float64).numpy()
    assert np.array_equal(deq, decode_table(want, fmt) * np.exp2(want_scale.astype(np.float64) - 127)[:, None])
    report(
        f"element codes {fmt.name} {dtype}",
        values=blocks.size,
        blocks=len(blocks),
        scales=len(np.unique(want_scale)),
        mismatches=int(bad.sum()),
    )


def test_every_e8m0_code_decodes_as_ml_dtypes():
    codes = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    t = M.MXTensor(torch.zeros(256, 1, dtype=torch.uint8), codes.view(256, 1), FP8_E4M3, 1, 1, torch.float32)
    want = codes.numpy().view(md.float8_e8m0fnu).astype(np.float64)
    got = t.scales().view(-1).numpy()
    assert np.array_equal(np.isnan(got), np.isnan(want)) and np.array_equal(got[:255], want[:255])
    deq = t.dequantize(torch.float64).view(-1).numpy()
    assert np.isnan(deq[255]) and (deq[:255] == 0).all()


@pytest.mark.parametrize("rule", RULES)
@pytest.mark.parametrize("fmt", FORMATS, ids=str)
def test_scale_code_of_every_binade(fmt, rule):
    """amax = 2^j·m for every j from −1080 to 1023 (float64) and m at the edges that decide each rule: the
    E8M0 code against the Fraction reference (clamped at 0, NaN above 254)."""
    V, _ = table(fmt)
    ms = sorted(
        {
            1.0,
            1.0 + 2.0**-52,
            1.5,
            2.0 - 2.0**-52,
            fmt.max / 2.0**fmt.emax,
            np.nextafter(fmt.max / 2.0**fmt.emax, 3.0),
            np.nextafter(fmt.max / 2.0**fmt.emax, 0.0),
            2.0 - 2.0 ** -(fmt.mantissa_bits + 1),
            np.nextafter(2.0 - 2.0 ** -(fmt.mantissa_bits + 1), 0.0),
        }
    )
    amax = np.array([np.ldexp(m, j) for j in range(-1080, 1024) for m in ms])
    amax = amax[np.isfinite(amax) & (amax > 0)]
    x = np.stack([amax, -amax / 3, np.zeros_like(amax), amax / 7], axis=1)
    got = M.quantize_mx(torch.from_numpy(x), fmt, 4, scale_rounding=rule).scale_codes.view(-1).numpy()
    want = np.array([ref_scale_code(row.tolist(), fmt, rule) for row in x])
    assert np.array_equal(got, want), (x[got != want][:4], got[got != want][:4], want[got != want][:4])
    report(f"scale codes {fmt.name} {rule}", blocks=len(x), mismatches=int((got != want).sum()))


# ----------------------------------------------------------------------------------------------------------
# MX against torchao
# ----------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("rule", RULES)
@pytest.mark.parametrize("fmt", FORMATS, ids=str)
def test_mx_matches_torchao(fmt, rule, dtype):
    """Scale codes and element codes equal torchao's to_mx on every block it quantises as OCP does; on the
    blocks where torchao documentedly differs, torchao's output equals the model of its behaviour."""
    ao = torchao_or_skip()
    counts = dict(
        values=0,
        blocks=0,
        regular_blocks=0,
        code0_blocks=0,
        inf_blocks=0,
        nan_blocks=0,
        rceil_log2_blocks=0,
        mismatches=0,
    )
    for name, x32 in mx_cases(64, 512, _seed("ao", fmt, rule, dtype), fmt).items():
        xt = torch.from_numpy(x32).to(dtype)
        x = xt.to(torch.float32).numpy()  # the values actually quantised
        ours = M.quantize_mx(xt, fmt, scale_rounding=rule)
        ao_s, ao_c, (s_raw, d_raw) = ao_mx(xt, fmt, rule)
        our_s, our_c = ours.scale_codes.numpy(), ours.element_codes.numpy()
        ao_s, ao_c = ao_s.numpy(), ao_c.numpy()
        kinds = block_kinds(x)
        xb = x.reshape(x.shape[0], -1, 32)
        has_value = (xb != 0).any(-1)
        code0 = (our_s == 0) & has_value & ~kinds["nan"] & ~kinds["inf"]
        # RCEIL only: blocks where torchao's float32 log2 lands one code lower (amax / max just above 2^j)
        amax = np.abs(xb).max(-1).astype(np.float64)
        with np.errstate(all="ignore"):
            ratio = amax / fmt.max / np.exp2(our_s.astype(np.float64) - 128)
        log2_zone = (rule == "rceil") & (ao_s == our_s - 1) & (ratio > 1) & (ratio < 1 + 2.0**-19)
        special = kinds["nan"] | kinds["inf"] | code0 | log2_zone
        regular = ~special
        eb = np.repeat(regular, 32, axis=1)
        bad = int((ao_s[regular] != our_s[regular]).sum() + (ao_c[eb] != our_c[eb]).sum())
        assert bad == 0, (
            f"{name}: {bad} codes differ from torchao on regular blocks; first block "
            f"{np.argwhere(regular & (ao_s != our_s))[:1]}"
        )
        # NaN blocks: both NaN scales, and torchao's dequantised values are NaN there as ours
        assert (ao_s[kinds["nan"]] == 255).all() and (our_s[kinds["nan"]] == 255).all()
        # inf blocks: ours NaN; torchao's finite code from the exponent field of inf
        want_inf = 254 if rule == "rceil" else 255 - fmt.emax
        assert (our_s[kinds["inf"]] == 255).all() and (ao_s[kinds["inf"]] == want_inf).all(), name
        # code-0 blocks: torchao's elements are v · 2^126 (v · 1 for RCEIL), rounded and saturated
        if code0.any():
            assert (ao_s[code0] == 0).all()
            factor = 1.0 if rule == "rceil" else 2.0**126
            y = xb[code0].astype(np.float64) * factor
            assert np.array_equal(ao_c.reshape(xb.shape)[code0], grid_codes(y, fmt)), name
        # dequantised values on regular blocks equal torchao's to_dtype (exact products in float32)
        ao_deq = ao["to_dtype"](d_raw, s_raw, ao_dtype(fmt), 32, torch.float32).numpy()
        our_deq = ours.dequantize(torch.float32).numpy()
        assert np.array_equal(ao_deq[eb], our_deq[eb])
        assert np.isnan(ao_deq[np.repeat(kinds["nan"], 32, axis=1)]).all()
        assert np.isnan(our_deq[np.repeat(kinds["nan"] | kinds["inf"], 32, axis=1)]).all()
        counts["values"] += x.size
        counts["blocks"] += regular.size
        counts["regular_blocks"] += int(regular.sum())
        counts["code0_blocks"] += int(code0.sum())
        counts["inf_blocks"] += int(kinds["inf"].sum())
        counts["nan_blocks"] += int(kinds["nan"].sum())
        counts["rceil_log2_blocks"] += int(log2_zone.sum())
    report(f"MX vs torchao {fmt.name} {rule} {dtype}", **counts)


def test_torchao_rceil_log2_rounding_is_the_only_rceil_difference():
    """amax = max·2^j·(1 + 2⁻²³) for j = −100 … 100: the exact rule takes X = 2^(j+1); torchao's float32 log2
    returns j for |j| large enough and picks 2^j, after which its largest element saturates."""
    torchao_or_skip()
    fmt = FP8_E4M3
    js = np.arange(-100, 101)
    amax = (np.float32(fmt.max) * np.exp2(js).astype(np.float32)) * np.float32(1 + 2.0**-23)
    x = np.zeros((len(js), 32), dtype=np.float32)
    x[:, 0] = amax
    x[:, 1] = amax / 3
    ours = M.quantize_mx(torch.from_numpy(x), fmt, scale_rounding="rceil").scale_codes.view(-1).numpy()
    ao = ao_mx(torch.from_numpy(x), fmt, "rceil")[0].view(-1).numpy()
    assert np.array_equal(ours.astype(int) - 127, js + 1)
    assert set(np.unique(ours.astype(int) - ao.astype(int))) <= {0, 1}
    report("rceil log2 edge", blocks=len(js), torchao_one_lower=int((ao != ours).sum()))


# ----------------------------------------------------------------------------------------------------------
# MX against the independent reference: partial blocks, axes, block sizes, dtypes
# ----------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("rule", RULES)
@pytest.mark.parametrize("fmt", FORMATS, ids=str)
def test_mx_matches_reference_on_partial_blocks_and_axes(fmt, rule):
    rng = np.random.default_rng(_seed("ref", fmt, rule))
    cases = mx_cases(8, 256, _seed("refcases", fmt, rule), fmt)
    x3 = np.concatenate([v.reshape(8, 8, 32) for v in cases.values()], axis=0)  # (48, 8, 32)
    tried = dict(values=0, blocks=0, mismatches=0)
    configs = {
        torch.float32: ((32, -1), (7, 1), (5, 0), (64, 2), (1, -1), (3, 2)),
        torch.float64: ((32, -1), (7, 1), (5, 0)),
        torch.float16: ((32, -1), (3, 2)),
    }
    for dtype, blocks_axes in configs.items():
        for block, axis in blocks_axes:
            xv = x3 if dtype != torch.float64 else x3 * np.exp2(rng.integers(-300, 300, x3.shape))
            xt = torch.from_numpy(np.ascontiguousarray(xv)).to(dtype)
            t = M.quantize_mx(xt, fmt, block, axis, scale_rounding=rule)
            x = np.moveaxis(xt.to(torch.float64).numpy(), axis, -1)
            s_ref, c_ref, d_ref = ref_mx(x.reshape(-1, x.shape[-1]), fmt, rule, block)
            s_got = np.moveaxis(t.scale_codes.numpy(), axis, -1).reshape(s_ref.shape)
            c_got = np.moveaxis(t.element_codes.numpy(), axis, -1).reshape(c_ref.shape)
            d_got = np.moveaxis(t.dequantize(torch.float64).numpy(), axis, -1).reshape(d_ref.shape)
            assert t.scale_codes.shape[axis] == -(-xt.shape[axis] // block)
            assert np.array_equal(s_got, s_ref), (dtype, block, axis)
            live = np.repeat(s_ref != 255, block, axis=1)[:, : c_ref.shape[1]]
            assert np.array_equal(c_got[live], c_ref[live]) and (c_got[~live] == 0).all(), (dtype, block, axis)
            assert np.array_equal(d_got, d_ref, equal_nan=True), (dtype, block, axis)
            tried["values"] += xt.numel()
            tried["blocks"] += s_ref.size
    report(
        f"MX vs Fraction reference {fmt.name} {rule} (fp32, fp64, fp16; blocks 1, 3, 5, 7, 32, 64; axes 0-2)", **tried
    )


def test_empty_tensors():
    for shape, axis in (((0, 32), -1), ((4, 0), -1), ((4, 0), 0), ((0,), 0)):
        x = torch.empty(shape)
        for t in (M.quantize_mx(x, "FP4_E2M1", axis=axis), M.quantize_nvfp4(x, axis=axis)):
            assert t.element_codes.shape == x.shape and t.dequantize().shape == x.shape
            assert t.scale_codes.shape[t.axis] == -(-x.shape[t.axis] // t.block_size)
        assert M.quantize_per_tensor(x, "FP8_E4M3")[0].shape == x.shape
    assert M.quantization_error(torch.empty(0), torch.empty(0))["n"] == 0


def test_partial_last_block_equals_zero_padding():
    rng = np.random.default_rng(3)
    x = torch.from_numpy(rng.standard_normal((5, 70)).astype(np.float32))
    x[2, 64:] *= 1e6  # the short last block decides its own scale
    t = M.quantize_mx(x, "FP8_E4M3")
    padded = M.quantize_mx(torch.nn.functional.pad(x, (0, 26)), "FP8_E4M3")
    assert torch.equal(t.scale_codes, padded.scale_codes)
    assert torch.equal(t.element_codes, padded.element_codes[:, :70])
    assert t.scale_codes.shape == (5, 3) and t.dequantize().shape == x.shape


@pytest.mark.parametrize("fmt", FORMATS, ids=str)
def test_nan_and_inf_blocks_are_nan_and_leave_other_blocks_alone(fmt):
    x = torch.randn(4, 96)
    y = x.clone()
    y[0, 5], y[1, 40], y[2, 70], y[3, 0] = math.nan, math.inf, -math.inf, math.nan
    a, b = M.quantize_mx(x, fmt), M.quantize_mx(y, fmt)
    bad = torch.zeros(4, 3, dtype=torch.bool)
    bad[0, 0] = bad[1, 1] = bad[2, 2] = bad[3, 0] = True
    assert (b.scale_codes[bad] == M.E8M0_NAN).all() and torch.equal(b.scale_codes[~bad], a.scale_codes[~bad])
    eb = bad.repeat_interleave(32, dim=1)
    assert (b.element_codes[eb] == 0).all() and torch.equal(b.element_codes[~eb], a.element_codes[~eb])
    d = b.dequantize()
    assert torch.isnan(d[eb]).all() and torch.equal(d[~eb], a.dequantize()[~eb])


def test_dequantize_dtypes_round_once():
    """float32 results are the exact products; float16/bfloat16 are those rounded once; extremes overflow."""
    rng = np.random.default_rng(5)
    x = torch.from_numpy((rng.standard_normal((16, 64)) * np.exp2(rng.integers(-40, 40, (16, 1)))).astype(np.float32))
    for fmt in FORMATS:
        t = M.quantize_mx(x, fmt)
        exact = t.dequantize(torch.float64)
        assert torch.equal(t.dequantize(torch.float32).double(), exact)
        for dt in (torch.float16, torch.bfloat16):
            assert torch.equal(t.dequantize(dt), exact.to(torch.float32).to(dt))
        assert t.dequantize().dtype == torch.float32
    big = torch.tensor([[2.0**1000, 1.0], [2.0**134, 1.0]], dtype=torch.float64)
    t = M.quantize_mx(big, "FP8_E4M3", 2)
    assert t.scale_codes.view(-1).tolist() == [M.E8M0_NAN, 126 + 127]  # 2^992 is beyond E8M0: NaN scale
    assert torch.isnan(t.dequantize()[0]).all() and t.dequantize()[1].tolist() == [2.0**134, 0.0]
    assert torch.isinf(t.dequantize(torch.float32)[1, 0])  # beyond float32: inf


# ----------------------------------------------------------------------------------------------------------
# NVFP4
# ----------------------------------------------------------------------------------------------------------
def ref_nvfp4(x32: np.ndarray, tensor_scale=None):
    """NVIDIA's NVFP4 algorithm in NumPy float32 with ml_dtypes casts: (tensor scale, scale codes, codes)."""
    f32 = np.float32
    with np.errstate(all="ignore"):
        if tensor_scale is None:
            fin = np.where(np.isfinite(x32), np.abs(x32), f32(0))
            st = f32(fin.max()) / f32(448.0 * 6.0)
            if not (np.isfinite(st) and st > 0 and np.isfinite(f32(1) / st)):
                st = f32(1.0)
        else:
            st = f32(tensor_scale)
        xb = x32.reshape(x32.shape[0], -1, 16)
        amax = np.abs(xb).max(-1)
        nan = ~np.isfinite(amax)
        s = np.clip((amax / f32(6.0)) / st, f32(2.0**-6), f32(448.0))
        s = np.where(nan, f32(1), s).astype(f32)
        sc8 = s.astype(md.float8_e4m3fn)
        sb = sc8.astype(f32)
        r = (f32(1) / st) / sb
        y = (xb * r[..., None]).astype(f32)
        y = np.where(nan[..., None], f32(0), y)
        codes = ml_codes(y, FP4_E2M1).reshape(x32.shape)
        scodes = np.where(nan, np.uint8(0x7F), sc8.view(np.uint8))
    return st, scodes, codes


def nvfp4_cases(seed: int) -> dict:
    cases = mx_cases(32, 256, seed, FP4_E2M1)
    rng = np.random.default_rng(seed)
    cases["tiny"] = (rng.standard_normal((32, 256)) * 1e-30).astype(np.float32)
    cases["huge"] = (rng.standard_normal((32, 256)) * 1e30).astype(np.float32)
    return cases


@pytest.mark.parametrize("level", ["two-level", "single-level"])
def test_nvfp4_matches_reference_and_torchao(level):
    ao = _torchao()
    ao = None if isinstance(ao, str) else ao
    counts = dict(values=0, blocks=0, mismatches=0, torchao_values=0)
    for name, x in nvfp4_cases(_seed("nvfp4", level)).items():
        ts = None if level == "two-level" else 1.0
        t = M.quantize_nvfp4(torch.from_numpy(x), tensor_scale=ts)
        st, s_ref, c_ref = ref_nvfp4(x, ts)
        assert float(t.tensor_scale) == float(st), name
        assert np.array_equal(t.scale_codes.numpy(), s_ref), name
        assert np.array_equal(t.element_codes.numpy(), c_ref), name
        deq = t.dequantize(torch.float64).numpy()
        want = (
            decode_table(c_ref, FP4_E2M1).reshape(x.shape[0], -1, 16)
            * decode_table(s_ref, FP8_E4M3)[..., None]
            * np.float64(st)
        ).reshape(x.shape)
        assert np.array_equal(deq, want, equal_nan=True)
        counts["values"] += x.size
        counts["blocks"] += s_ref.size
        if ao is not None and name != "nonfinite":  # torchao turns a whole tensor with inf/NaN to NaN
            amax = torch.tensor(float(np.abs(x).max()))
            pts = ao["amax_to_scale"](amax) if level == "two-level" else None
            s_ao, d_ao = ao["nvfp4"](torch.from_numpy(x), 16, pts)
            if pts is not None:
                assert float(pts) == float(st)
            assert np.array_equal(s_ao.view(torch.uint8).numpy(), s_ref), name
            assert np.array_equal(ao["unpack"](d_ao).numpy().reshape(x.shape), c_ref), name
            counts["torchao_values"] += x.size
    report(f"NVFP4 {level} vs NumPy/ml_dtypes reference and torchao", **counts)


def test_nvfp4_nonfinite_blocks_partial_blocks_and_axes():
    x = torch.randn(6, 40)
    x[0, 3], x[1, 20] = math.inf, math.nan
    t = M.quantize_nvfp4(x)
    assert t.scale_codes.shape == (6, 3)
    assert t.scale_codes[0, 0] == 0x7F and t.scale_codes[1, 1] == 0x7F
    finite = torch.where(torch.isfinite(x), x, torch.zeros_like(x))
    assert float(t.tensor_scale) == float(finite.abs().max() / 2688.0)
    d = t.dequantize()
    assert torch.isnan(d[0, :16]).all() and torch.isnan(d[1, 16:32]).all() and torch.isfinite(d[2:]).all()
    padded = M.quantize_nvfp4(torch.nn.functional.pad(finite, (0, 8)), tensor_scale=t.tensor_scale)
    same = M.quantize_nvfp4(finite, tensor_scale=t.tensor_scale)
    assert torch.equal(same.element_codes, padded.element_codes[:, :40])
    col = M.quantize_nvfp4(finite.t().contiguous(), tensor_scale=t.tensor_scale, axis=0)
    assert torch.equal(col.element_codes.t(), same.element_codes)
    assert M.quantize_nvfp4(torch.zeros(2, 16)).tensor_scale.item() == 1.0
    assert t.bits_per_value == 4.5 and M.quantize_mx(x, "FP8_E4M3").bits_per_value == 8.25


# ----------------------------------------------------------------------------------------------------------
# per-tensor and delayed scaling against Transformer Engine's documented formulas
# ----------------------------------------------------------------------------------------------------------
def te_scale(amax, fp8_max: float, margin: int = 0, power_2=False, previous=np.float32(1.0)) -> np.float32:
    """Transformer Engine: sf = (fp8_max / amax) / 2^margin in float32; the previous scale where amax is not a
    positive finite number; float32's largest value where sf is infinite; power of two by keeping sign and
    exponent bits (``scale_bits & 0xFF800000``)."""
    amax = np.float32(amax)
    if not (np.isfinite(amax) and amax > 0):
        return np.float32(previous)
    with np.errstate(over="ignore", divide="ignore"):
        sf = np.float32(np.float32(fp8_max) / amax)
        sf = np.float32(sf / np.float32(2.0**margin))
    if np.isinf(sf):
        sf = np.float32(F32_MAX)
    if power_2:
        sf = (np.array(sf, dtype=np.float32).view(np.uint32) & np.uint32(0xFF800000)).view(np.float32)
    return np.float32(sf)


def te_cast(x32: np.ndarray, scale: np.float32, fmt, saturate=True) -> np.ndarray:
    """Codes of fl32(x · scale) cast to fmt (ml_dtypes; clipped first when saturating)."""
    with np.errstate(over="ignore", invalid="ignore"):
        y = (x32.astype(np.float32) * np.float32(scale)).astype(np.float32)
    if saturate:
        return ml_codes(y, fmt)
    return y.astype(ML[fmt]).view(np.uint8)


def per_tensor_cases(seed: int) -> list:
    rng = np.random.default_rng(seed)
    xs = [rng.standard_normal(4096) * s for s in (1.0, 1e-3, 1e4, 3e-39, 1e37)]
    xs.append(np.zeros(64))
    xs.append(np.array([1e-45, -2e-45, 0.0]))  # amax subnormal: the scale overflows
    w = rng.standard_normal(1000)
    w[7] = np.nan
    xs.append(w)
    w = rng.standard_normal(1000)
    w[3] = -np.inf
    xs.append(w)
    xs.append(rng.standard_normal(5000) * np.exp2(rng.integers(-30, 30, 5000)))
    with np.errstate(over="ignore"):
        return [x.astype(np.float32) for x in xs]


@pytest.mark.parametrize("fmt", [FP8_E4M3, FP8_E5M2], ids=str)
def test_per_tensor_matches_transformer_engine_formula(fmt):
    tried = dict(tensors=0, values=0, mismatches=0)
    for x in per_tensor_cases(_seed("te", fmt)):
        for margin in (0, 1, 3):
            for pow2 in (False, True):
                q, scale = M.quantize_per_tensor(torch.from_numpy(x), fmt, margin=margin, power_of_two=pow2)
                with np.errstate(invalid="ignore"):
                    amax = np.abs(x).max()
                want_scale = te_scale(amax, fmt.max, margin, pow2)
                assert scale.dtype == torch.float32 and scale.item() == float(want_scale), (amax, margin, pow2)
                want = te_cast(x, want_scale, fmt)
                got = M.ScaledTensor(q, scale, fmt, torch.float32).codes().numpy()
                nan = np.isnan(x)
                assert np.array_equal(got[~nan], want[~nan]) and np.isnan(q.numpy()[nan]).all()
                tried["tensors"] += 1
                tried["values"] += x.size
    # explicit amax (as delayed scaling passes it) and no saturation: E4M3 overflows to NaN, E5M2 to inf
    x = np.array([1.0, 2.0, 3.0, -4.0], dtype=np.float32)
    q, scale = M.quantize_per_tensor(torch.from_numpy(x), fmt, amax=1.0, saturate=False)
    assert scale.item() == fmt.max
    assert np.array_equal(
        M.ScaledTensor(q, scale, fmt, torch.float32).codes().numpy(),
        te_cast(x, np.float32(fmt.max), fmt, saturate=False),
    )
    report(f"per-tensor vs TE formula {fmt.name} (margins 0,1,3; power-of-two on/off)", **tried)


@pytest.mark.parametrize("fmt", [FP8_E4M3, FP8_E5M2], ids=str)
def test_per_tensor_matches_torchao_float8_training_cast(fmt):
    """torchao.float8's dynamic (current) scaling cast, the one Float8Linear uses with emulate=True: scale =
    fp8_max / max(amax, 1e-12) in float64 rounded to float32 (equal to TE's float32 division), data =
    saturated cast of fl32(x · scale); its dequantisation data / scale equals ours."""
    ao = torchao_or_skip()
    dt = {FP8_E4M3: torch.float8_e4m3fn, FP8_E5M2: torch.float8_e5m2}[fmt]
    tried = dict(tensors=0, values=0, mismatches=0)
    for x in per_tensor_cases(_seed("ao8", fmt)):
        with np.errstate(invalid="ignore"):
            amax = np.abs(x).max()
        if not (np.isfinite(amax) and amax >= 1e-12):
            continue  # torchao clamps amax at 1e-12; TE uses scale 1
        xt = torch.from_numpy(x)
        for dtype in (torch.float32, torch.bfloat16):
            xd = xt.to(dtype)
            f8 = ao["dynamic"](xd, dt, ao["mm_config"]())
            q, scale = M.quantize_per_tensor(xd, fmt)
            assert scale.item() == f8._scale.item()
            st = M.ScaledTensor(q, scale, fmt, dtype)
            assert torch.equal(st.codes(), f8._data.view(torch.uint8))
            assert torch.equal(st.dequantize(), f8.to_original_precision())
            tried["tensors"] += 1
            tried["values"] += x.size
    report(f"per-tensor vs torchao float8 {fmt.name}", **tried)


class TEDelayedScaling:
    """Transformer Engine's delayed scaling as its documentation describes it, in NumPy float32."""

    def __init__(self, history_len, margin, algo, fmt, saturate=True):
        self.h = np.zeros(history_len, dtype=np.float32)
        self.scale = np.float32(1.0)
        self.margin, self.algo, self.fmt, self.saturate = margin, algo, fmt, saturate

    def quantize(self, x):
        self.h[0] = max(self.h[0], np.float32(np.abs(x).max()))
        return te_cast(x, self.scale, self.fmt, self.saturate), self.scale

    def update(self):
        amax = self.h.max() if self.algo == "max" else self.h[0]
        self.scale = te_scale(amax, self.fmt.max, self.margin, previous=self.scale)
        self.h = np.roll(self.h, -1)
        self.h[0] = 0.0


@pytest.mark.parametrize("algo", ["max", "most_recent"])
@pytest.mark.parametrize("history_len", [1, 4, 16])
def test_delayed_scaling_matches_transformer_engine(history_len, algo):
    rng = np.random.default_rng(_seed("delayed", history_len, algo))
    ds = M.DelayedScaling(history_len=history_len, margin=1, amax_compute_algo=algo)
    refs = {
        "x": TEDelayedScaling(history_len, 1, algo, FP8_E4M3),
        "g": TEDelayedScaling(history_len, 1, algo, FP8_E5M2),
    }
    sizes = np.exp2(np.concatenate([rng.normal(0, 1, 20).cumsum(), [30, 0, -30, 0], rng.normal(0, 3, 16)]))
    tried = dict(steps=0, values=0, exceeded=0)
    for step, s in enumerate(sizes):
        for name, backward in (("x", False), ("g", True)):
            x = (rng.standard_normal(512) * s).astype(np.float32)
            if step == 10 and name == "x":
                x[:] = 0.0  # amax 0: the scale stays
            q, scale = ds.quantize(torch.from_numpy(x), name, backward=backward)
            want_codes, want_scale = refs[name].quantize(x)
            fmt = FP8_E5M2 if backward else FP8_E4M3
            assert scale.item() == float(want_scale), (step, name)
            assert np.array_equal(M.ScaledTensor(q, scale, fmt, torch.float32).codes().numpy(), want_codes)
            beyond = np.abs(x.astype(np.float64) * np.float64(want_scale))
            thr = fmt.max + 2.0 ** (fmt.emax - fmt.mantissa_bits - 1)
            tried["exceeded"] += int((beyond > thr).sum() + ((beyond == thr) & (fmt != FP8_E4M3)).sum())
            tried["values"] += x.size
        ds.update()
        for r in refs.values():
            r.update()
        for name, r in refs.items():
            assert ds.scale(name) == float(r.scale), (step, name)
            assert np.array_equal(ds.amax_history(name).numpy(), r.h)
        tried["steps"] += 1
    assert sum(ds.exceeded(n) for n in ds.names) == tried["exceeded"]
    assert tried["exceeded"] > 0  # the jumps made stale scales overflow
    assert len(ds.log) == 2 * len(sizes) and {"amax", "scale", "exceeded", "next_scale"} <= set(ds.log[0])
    report(f"delayed scaling vs TE (history {history_len}, {algo})", **tried)


def test_delayed_scaling_overflow_without_saturation_and_state():
    ds = M.DelayedScaling(history_len=2, saturate=False)
    x = torch.ones(8)
    ds.quantize(x, "w")
    ds.update()  # scale 448
    q, _ = ds.quantize(x * 4, "w")  # 4 · 448 overflows E4M3: NaN
    assert torch.isnan(q).all()
    ds.update()
    assert ds.exceeded("w") == 8 and ds.log[-1]["exceeded"] == 8
    q, _ = ds.quantize(torch.ones(3), "g", backward=True)
    with pytest.raises(ValueError, match="name 'g'"):
        ds.quantize(torch.ones(3), "g")
    state = ds.state_dict()
    other = M.DelayedScaling(history_len=2, saturate=False)
    other.load_state_dict(state)
    assert other.scale("w") == ds.scale("w") and torch.equal(other.amax_history("w"), ds.amax_history("w"))
    with pytest.raises(ValueError, match="amax history"):
        M.DelayedScaling(history_len=3).load_state_dict(state)


# ----------------------------------------------------------------------------------------------------------
# errors, recipes, arguments
# ----------------------------------------------------------------------------------------------------------
def test_quantization_error_by_hand():
    x = torch.tensor([1.0, -2.0, 1e-9, 0.0, 600.0, math.inf])
    xq = torch.tensor([1.0, -2.5, 0.0, 0.0, 448.0, 448.0])
    sat = torch.tensor([False, False, False, False, True, True])
    e = M.quantization_error(x, xq, saturated=sat)
    errs = np.array([0.0, -0.5, -1e-9, 0.0, -152.0])
    assert e["n"] == 6 and math.isclose(e["mse"], float(np.mean(errs**2)))
    assert e["max_abs_error"] == 152.0 and e["underflow"] == 1 / 6 and e["saturated"] == 1 / 6
    assert e["nonfinite_in"] == 1 / 6 and e["nonfinite_out"] == 0.0
    sx = 1 + 4 + 1e-18 + 600.0**2
    assert math.isclose(e["snr_db"], 10 * math.log10(sx / float(np.sum(errs**2))))
    assert M.quantization_error(x[:4], x[:4])["snr_db"] == math.inf
    assert math.isnan(M.quantization_error(torch.zeros(3), torch.zeros(3))["snr_db"])


def test_saturation_counts_follow_round_to_nearest_even():
    """E4M3 in a block with floor scale X: v / X in (448, 464] rounds to 448 (not saturation), above 464 it
    saturates; E5M2's tie at 61440 rounds up to 65536 and so saturates."""
    x = torch.tensor([[256.0, 448.0, 460.0, 464.0, 464.5, 500.0, 511.0, 1.0]])
    t = M.quantize_mx(x, "FP8_E4M3", 8)
    assert t.scale_codes.item() == 127
    assert t.saturated(x).tolist() == [[False, False, False, False, True, True, True, False]]
    assert M.quantization_error(x, t)["saturated"] == 3 / 8
    y = torch.tensor([[32768.0, 57344.0, 61439.0, 61440.0, 65535.0]])
    assert M.quantize_mx(y, "FP8_E5M2", 5).saturated(y).tolist() == [[False, False, False, True, True]]
    q, s = M.quantize_per_tensor(x, "FP8_E4M3", amax=448.0)
    assert M.ScaledTensor(q, s, FP8_E4M3, torch.float32).saturated(x).sum() == 3


@pytest.mark.parametrize("scheme", M.SCHEMES)
def test_schemes_quantize_and_fake_quantize(scheme):
    x = torch.randn(8, 64, dtype=torch.bfloat16)
    qt = M.quantize(x, scheme)
    fq = M.fake_quantize(x, scheme)
    assert fq.dtype == x.dtype and fq.shape == x.shape and torch.equal(fq, qt.dequantize())
    e = M.quantization_error(x, qt)
    assert e["snr_db"] > 12 and e["nonfinite_out"] == 0 and e["saturated"] is not None
    assert torch.equal(M.fake_quantize(x, scheme, axis=0), M.quantize(x, scheme, axis=0).dequantize())


def test_scheme_in_an_autograd_function():
    """The use mpt_lab.microscaling.schemes' docstring shows: a Linear whose input, weight and output gradient
    are quantised."""

    class QuantLinearFn(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, w, scheme):
            ctx.save_for_backward(x, w)
            ctx.scheme = scheme
            return M.fake_quantize(x, scheme, axis=-1) @ M.fake_quantize(w, scheme, axis=-1).t()

        @staticmethod
        def backward(ctx, g):
            x, w = ctx.saved_tensors
            s = ctx.scheme
            return (
                M.fake_quantize(g, s, axis=-1) @ M.fake_quantize(w, s, axis=0),
                M.fake_quantize(g, s, axis=0).t() @ M.fake_quantize(x, s, axis=0),
                None,
            )

    x = torch.randn(16, 64, requires_grad=True)
    w = torch.randn(32, 64, requires_grad=True)
    ref = x @ w.t()
    ref.sum().backward()
    gx, gw = x.grad.clone(), w.grad.clone()
    x.grad = w.grad = None
    out = QuantLinearFn.apply(x, w, "mxfp8_e4m3")
    out.sum().backward()

    def rel(a, b):
        return float((a - b).norm() / b.norm()) if not a.requires_grad else rel(a.detach(), b.detach())

    assert rel(out, ref) < 0.05 and rel(x.grad, gx) < 0.05 and rel(w.grad, gw) < 0.05  # E4M3: 2⁻⁴ per value
    assert torch.equal(out, M.fake_quantize(x, "mxfp8_e4m3") @ M.fake_quantize(w, "mxfp8_e4m3").t())


# ----------------------------------------------------------------------------------------------------------
# the fast twins are the exact quantisers, bit for bit
# ----------------------------------------------------------------------------------------------------------
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
    x[5] = 2.0**-130
    x[6] = torch.tensor([448.0, 464.0, 480.0] * 23 + [1.0]) * 2.0**-3
    x[7] = torch.exp2(torch.arange(70.0) - 35)
    return x


@pytest.mark.parametrize("fmt", M.MX_ELEMENT_FORMATS, ids=lambda f: f.name)
@pytest.mark.parametrize("rule", M.SCALE_ROUNDINGS)
def test_fake_quantize_mx_is_quantize_mx(fmt, rule):
    x = _awkward()
    for axis in (0, 1, -1):
        for bs in (1, 7, 16, 32):
            fast = M.fake_quantize_mx(x, fmt, bs, axis, scale_rounding=rule)
            ref = M.quantize_mx(x, fmt, bs, axis, scale_rounding=rule).dequantize()
            assert _same_bits(fast, ref), (fmt.name, rule, axis, bs)
    for dtype in (torch.float16, torch.bfloat16):
        xd = torch.randn(8, 64, generator=torch.Generator().manual_seed(1)).to(dtype)
        fast, ref = (
            M.fake_quantize_mx(xd, fmt, 32, -1, scale_rounding=rule),
            M.quantize_mx(xd, fmt, 32, -1, scale_rounding=rule).dequantize(),
        )
        assert fast.dtype == dtype and torch.equal(fast, ref)


def test_fake_quantize_nvfp4_is_quantize_nvfp4():
    x = _awkward(3)
    for axis in (0, 1):
        assert _same_bits(M.fake_quantize_nvfp4(x, axis=axis), M.quantize_nvfp4(x, axis=axis).dequantize())
        y = x[5:]  # no inf/NaN: a finite tensor scale from the amax
        assert _same_bits(M.fake_quantize_nvfp4(y, axis=axis), M.quantize_nvfp4(y, axis=axis).dequantize())
    z = torch.zeros(3, 16)
    assert torch.equal(M.fake_quantize_nvfp4(z), z)


def test_fake_quantizers_refuse_bad_input():
    with pytest.raises(TypeError, match="x must be"):
        M.fake_quantize_mx(torch.ones(4, dtype=torch.float64), "FP8_E4M3")
    with pytest.raises(TypeError, match="x must be"):
        M.fake_quantize_mx([1.0], "FP8_E4M3")
    with pytest.raises(ValueError, match="fmt must be an MX element format"):
        M.fake_quantize_mx(torch.ones(4), "FP16")
    with pytest.raises(ValueError, match="block_size"):
        M.fake_quantize_mx(torch.ones(4), "FP8_E4M3", 0)
    with pytest.raises(ValueError, match="axis"):
        M.fake_quantize_mx(torch.ones(4), "FP8_E4M3", 2, axis=1)
    with pytest.raises(ValueError, match="scale_rounding"):
        M.fake_quantize_mx(torch.ones(4), "FP8_E4M3", scale_rounding="up")
    with pytest.raises(ValueError, match="at least one dimension"):
        M.fake_quantize_nvfp4(torch.tensor(1.0))


# ----------------------------------------------------------------------------------------------------------
# MX format names; per-tensor scaling rounds as Transformer Engine does
# ----------------------------------------------------------------------------------------------------------
def test_quantize_mx_takes_the_mx_names_its_repr_prints():
    x = torch.randn(4, 64, generator=torch.Generator().manual_seed(2))
    for name, fmt in M.MX_FORMATS.items():
        want = M.quantize_mx(x, fmt)
        for spelled in (name, name.lower(), repr(want).split("(")[1].split(",")[0]):
            got = M.quantize_mx(x, spelled)
            assert got.fmt == fmt and torch.equal(got.element_codes, want.element_codes), spelled
        assert torch.equal(M.fake_quantize_mx(x, name.lower()), want.dequantize())
    assert repr(M.quantize_mx(x, "mxfp8_e4m3")).startswith("MXTensor(MXFP8_E4M3,")
    for bad in ("mxfp8", "MXFP6"):  # two MX formats each: the message says which to name
        with pytest.raises(ValueError, match="MXFP8_E4M3.*MXFP8_E5M2.*say which"):
            M.quantize_mx(x, bad)
    with pytest.raises(ValueError, match=r"MX format name \['MXFP8_E4M3'"):
        M.quantize_mx(x, "mxint8")


def test_per_tensor_rounds_the_float32_product_then_to_the_format_as_transformer_engine():
    """q = round_to(fl32(x·scale), fmt): two roundings, as Transformer Engine's FP32 multiply-then-cast.  Here
    the exact product x·scale lies just above the midpoint 0.328125 of E4M3's neighbours 0.3125 (mantissa 010,
    even) and 0.34375 (011): rounded once it would give 0.34375; its float32 rounding is the midpoint itself,
    and the tie goes to the even 0.3125."""
    x = torch.tensor([75 / 1024, 100.0])  # amax 100: scale = fl32(448 / 100)
    q, scale = M.quantize_per_tensor(x, FP8_E4M3)
    assert float(scale) == float(np.float32(448.0) / np.float32(100.0))
    exact = Fraction(75, 1024) * Fraction(float(scale))
    assert exact > Fraction(0.328125) and float(np.float32(float(exact))) == 0.328125
    assert float(q[0]) == 0.3125  # the float32 product's tie, to even
    assert F.round_to(exact, FP8_E4M3) == 0.34375  # the exact product rounded once: the other neighbour
    ds = M.DelayedScaling(history_len=1)  # delayed scaling casts the same way
    ds.quantize(x, "x")
    ds.update()
    q2, s2 = ds.quantize(x, "x")
    assert float(s2) == float(scale) and torch.equal(q2, q)


# ----------------------------------------------------------------------------------------------------------
# what quantisation loses: block size, E8M0 scales, one scale for all, a training run's counts
# ----------------------------------------------------------------------------------------------------------
def test_block_size_sweep_and_scale_comparison():
    g = torch.Generator().manual_seed(0)
    t = torch.randn(64, 256, generator=g) * torch.exp2(torch.randn(64, 256, generator=g) * 2)
    sweep = M.block_size_sweep({"t": t}, ("FP8_E4M3", "FP4_E2M1"), (8, 32, 256))
    row = sweep["t"]["FP4_E2M1"]
    assert set(row) == {"8", "32", "256", "tensor"}
    assert row["8"] > row["32"] > row["256"] > row["tensor"]  # smaller blocks, less error
    assert sweep["t"]["FP8_E4M3"]["32"] > row["32"] + 10  # 3 more mantissa bits
    cmp = M.block_scale_comparison({"t": t}, ("FP8_E4M3", "FP4_E2M1"))
    assert set(cmp["t"]["FP4_E2M1"]) == {"e8m0", "fp32", "nvfp4"} and "nvfp4" not in cmp["t"]["FP8_E4M3"]
    assert all(math.isfinite(v) for r in cmp["t"].values() for v in r.values())
    with pytest.raises(TypeError):
        M.block_size_sweep([t])


def test_one_scale_loses_what_per_tensor_scales_keep():
    big = log2_histogram(torch.randn(1000) * 100.0)
    small = log2_histogram(torch.randn(1000) * 2.0**-20)
    out = M.one_scale_vs_per_tensor({"big": big, "small": small}, "FP8_E4M3")
    assert out["one_scale"] == int(math.log2((big + small).max_scale("FP8_E4M3")))
    t = out["tensors"]
    assert t["small"]["lost_one_scale"] > 0.9 and t["small"]["lost_per_tensor"] < 0.05
    assert t["big"]["lost_one_scale"] == t["big"]["lost_per_tensor"]
    with pytest.raises(TypeError):
        M.one_scale_vs_per_tensor({"a": torch.ones(2)})


def test_one_scale_energy_lost_is_the_square_share_of_the_values_lost():
    """energy_lost_*: the share of Σx² in the values that round to zero, within a factor of 2 of the exact share
    (the binade estimate), and exactly 0 when nothing is lost; checked value by value with round_to."""
    from mpt_lab.formats import FP8_E4M3, round_to

    g = torch.Generator().manual_seed(5)
    x = torch.randn(20000, generator=g, dtype=torch.float64) * torch.exp2(torch.randint(-30, 0, (20000,), generator=g))
    x = x.to(torch.float32)
    h = log2_histogram(x)
    out = M.one_scale_vs_per_tensor({"x": h}, "FP8_E4M3")["tensors"]["x"]
    s = h.max_scale("FP8_E4M3")
    lost = (round_to(x.double() * s, FP8_E4M3) == 0) & (x != 0)
    exact = float((x.double()[lost] ** 2).sum() / (x.double() ** 2).sum())
    assert out["lost_per_tensor"] == pytest.approx(float(lost.sum()) / int((x != 0).sum()), abs=1e-12)
    assert exact > 0 and exact / 2 <= out["energy_lost_per_tensor"] <= 2 * exact
    none = M.one_scale_vs_per_tensor({"y": log2_histogram(torch.ones(10))}, "FP8_E4M3")["tensors"]["y"]
    assert none["energy_lost_per_tensor"] == 0 == none["lost_per_tensor"]


def test_counts_and_layer_stats_by_hand():
    c = M.new_counts()
    t = torch.tensor([0.0, 1.0, 2.0**-30, 500.0, 3.0])
    tq = torch.tensor([0.0, 1.0, 0.0, 448.0, math.inf])
    M.add_counts(c, t, tq, torch.tensor([False, False, False, True, False]))
    assert (c["n"], c["nonzero"], c["underflow"], c["saturated"], c["nonfinite"]) == (5, 4, 1, 1, 1)
    assert c["signal"] == 1.0 + 2.0**-60 + 500.0**2 and c["noise"] == 2.0**-60 + 52.0**2
    s = M.layer_stats({"a": {"x": c}})
    assert s["a"]["x"]["underflow"] == 1 / 4 and s["a"]["x"]["saturated"] == 1 / 5
    assert s["a"]["x"]["snr_db"] == pytest.approx(10 * math.log10(c["signal"] / c["noise"]))
    assert s["all"]["x"] == s["a"]["x"]
    assert M.snr_db(1.0, 0.0) == math.inf and M.snr_db(0.0, 1.0) == -math.inf and math.isnan(M.snr_db(0.0, 0.0))


def test_exact_inside_simulate():
    from mpt_lab.simulate import simulate

    x = torch.randn(4, 64) * 1000
    want = M.quantize_mx(x, "FP8_E5M2")
    with simulate("FP16", mode="all"):
        got = M.quantize_mx(x, "FP8_E5M2")
        nv = M.quantize_nvfp4(x)
        pt = M.quantize_per_tensor(x, "FP8_E4M3")
    assert torch.equal(got.element_codes, want.element_codes) and torch.equal(got.scale_codes, want.scale_codes)
    assert torch.equal(nv.element_codes, M.quantize_nvfp4(x).element_codes)
    assert torch.equal(pt[0], M.quantize_per_tensor(x, "FP8_E4M3")[0])


def test_bad_arguments_are_named():
    x = torch.randn(4, 32)
    cases = [
        (lambda: M.quantize_mx([1.0], "FP8_E4M3"), TypeError, "x"),
        (lambda: M.quantize_mx(x.int(), "FP8_E4M3"), TypeError, "x"),
        (lambda: M.quantize_mx(x, "FP16"), ValueError, "fmt"),
        (lambda: M.quantize_mx(x, "nope"), ValueError, "fmt"),
        (lambda: M.quantize_mx(x, "FP8_E4M3", 0), ValueError, "block_size"),
        (lambda: M.quantize_mx(x, "FP8_E4M3", 32.0), TypeError, "block_size"),
        (lambda: M.quantize_mx(x, "FP8_E4M3", axis=2), ValueError, "axis"),
        (lambda: M.quantize_mx(torch.tensor(1.0), "FP8_E4M3"), ValueError, "dimension"),
        (lambda: M.quantize_mx(x, "FP8_E4M3", scale_rounding="round"), ValueError, "scale_rounding"),
        (lambda: M.quantize_mx(torch.empty(4, device="meta"), "FP8_E4M3"), ValueError, "meta"),
        (lambda: M.quantize_per_tensor(x, "FP32"), ValueError, "fmt"),
        (lambda: M.quantize_per_tensor(x, "FP8_E4M3", margin=0.5), TypeError, "margin"),
        (lambda: M.quantize_per_tensor(x, "FP8_E4M3", margin=200), ValueError, "margin"),
        (lambda: M.quantize_per_tensor(x, "FP8_E4M3", amax="1"), TypeError, "amax"),
        (lambda: M.quantize_per_tensor(x, "FP8_E4M3", amax=torch.ones(2)), ValueError, "amax"),
        (lambda: M.quantize_per_tensor(x, "FP8_E4M3", power_of_two=1), TypeError, "power_of_two"),
        (lambda: M.quantize_nvfp4(x, tensor_scale=0.0), ValueError, "tensor_scale"),
        (lambda: M.quantize_nvfp4(x, tensor_scale="a"), TypeError, "tensor_scale"),
        (lambda: M.DelayedScaling(history_len=0), ValueError, "history_len"),
        (lambda: M.DelayedScaling(amax_compute_algo="mean"), ValueError, "amax_compute_algo"),
        (lambda: M.DelayedScaling(forward="E8M0"), ValueError, "forward"),
        (lambda: M.DelayedScaling().quantize(x, 3), TypeError, "name"),
        (lambda: M.quantize(x, "int8"), ValueError, "scheme"),
        (lambda: M.quantization_error(x, x[:2]), ValueError, "xq"),
        (lambda: M.quantization_error(x, x, saturated=x), TypeError, "saturated"),
        (lambda: M.quantize_mx(x, "FP8_E4M3").dequantize(torch.int32), TypeError, "dtype"),
        (lambda: M.quantize_mx(x, "FP8_E4M3").saturated(x[:2]), ValueError, "x"),
    ]
    for fn, exc, word in cases:
        with pytest.raises(exc, match=word):
            fn()


def test_native_fp8_cast_was_checked_against_encode():
    from mpt_lab.microscaling._core import native_cast  # the package's internal module, tested here

    for fmt in (FP8_E4M3, FP8_E5M2):
        assert native_cast(fmt, torch.device("cpu")) in ("saturating", "in_range")
    assert native_cast(FP8_E4M3, torch.device("cpu")) == "saturating"  # torch ≥ 2.12 saturates E4M3


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_equals_cpu():
    tried = dict(values=0)
    for name, x in mx_cases(16, 256, 11).items():
        xc, xg = torch.from_numpy(x), torch.from_numpy(x).cuda()
        pairs = [
            (M.quantize_mx(xc, fmt, scale_rounding=rule), M.quantize_mx(xg, fmt, scale_rounding=rule))
            for fmt in FORMATS
            for rule in RULES
        ]
        pairs.append((M.quantize_nvfp4(xc), M.quantize_nvfp4(xg)))
        for a, b in pairs:
            assert b.element_codes.is_cuda
            assert torch.equal(a.scale_codes, b.scale_codes.cpu())
            assert torch.equal(a.element_codes, b.element_codes.cpu())
            assert torch.allclose(a.dequantize(), b.dequantize().cpu(), rtol=0, atol=0, equal_nan=True)
        if name != "nonfinite":
            for fmt in (FP8_E4M3, FP8_E5M2):
                (q1, s1), (q2, s2) = M.quantize_per_tensor(xc, fmt), M.quantize_per_tensor(xg, fmt)
                assert torch.equal(q1, q2.cpu()) and torch.equal(s1, s2.cpu())
        tried["values"] += x.size
    report("CUDA vs CPU (every MX format and rule, NVFP4, per-tensor)", **tried)


def test_package_attribute_and_benchmark_script(tmp_path):
    """``mpt_lab.microscaling`` resolves lazily; the benchmark runs (tiny size; no timing is asserted)."""
    import json

    from conftest import load_benchmark

    import mpt_lab

    assert mpt_lab.microscaling is M and "microscaling" in mpt_lab.SUBMODULES
    mod = load_benchmark("microscaling_speed")
    out = tmp_path / "speed.json"
    assert (
        mod.main(["--profile", "quick", "--set", "n=8000", "--set", "repeat=1", "--no-progress", "--out", str(out)])
        == 0
    )
    res = json.loads(out.read_text())
    assert res["provenance"]["config"]["n"] == 8000 and len(res["rows"]) == 2
    assert {"cast_s", "quantize_mx_s", "quantize_mx_vs_cast", "same_as_torchao"} <= set(res["rows"][0])
    assert all(r["same_as_torchao"] in (True, None) for r in res["rows"])
