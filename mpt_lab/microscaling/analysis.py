"""What quantisation loses: errors and signal-to-noise ratios of a tensor, of the layers of a training run, against
block size and scale format, and with one scale shared by many tensors.

* :func:`quantization_error`: one tensor against its quantised values (any quantiser of this package);
* :func:`new_counts`, :func:`add_counts`, :func:`layer_stats`: the counts a training run accumulates per layer
  and operand (:class:`mpt_lab.quantized_training.Quantizer` adds them) and the shares and SNR they give;
* :func:`block_size_sweep`, :func:`block_scale_comparison`, :func:`mean_over_layers`: MX error against block
  size, and E8M0 against FP32 block scales;
* :func:`one_scale_vs_per_tensor`: one power-of-two scale for all tensors (a loss scale) against one per tensor.

The signal-to-noise ratio is 10·log10(Σx² / Σ(Q(x) − x)²) in dB (:func:`snr_db`), over the values where x and
Q(x) are both finite.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch

from .. import formats as F
from ..formats import FP4_E2M1, FloatFormat, FormatLike, exact_arithmetic
from ..histogram import Log2Histogram
from ._core import QuantizedTensor, check_tensor, from_blocks, to_blocks
from .mx import fake_quantize_mx
from .nvfp4 import fake_quantize_nvfp4

__all__ = [
    "quantization_error",
    "snr_db",
    "new_counts",
    "add_counts",
    "layer_stats",
    "block_size_sweep",
    "block_scale_comparison",
    "mean_over_layers",
    "one_scale_vs_per_tensor",
]


def snr_db(signal: float, noise: float) -> float:
    """10·log10(signal / noise) in dB, from the sums of squares Σx² and Σ(Q(x) − x)²: inf without noise, −inf
    without signal, NaN with neither."""
    if noise > 0:
        return 10.0 * math.log10(signal / noise) if signal > 0 else -math.inf
    return math.inf if signal > 0 else math.nan


# ----------------------------------------------------------------------------------------------------------
# one tensor
# ----------------------------------------------------------------------------------------------------------
@exact_arithmetic
def quantization_error(x: torch.Tensor, xq: torch.Tensor, *, saturated: torch.Tensor | None = None) -> dict:
    """What quantising x lost: errors, signal-to-noise ratio, and the shares that underflowed or saturated.

    Parameters
    ----------
    x : floating tensor
        The original values.
    xq : floating tensor of x's shape, or the quantised tensor (:class:`ScaledTensor`, :class:`MXTensor`,
        :class:`NVFP4Tensor`) made from x
        The quantised values; a quantised tensor is dequantised in float64 and tells which values saturated.
    saturated : None or bool tensor of x's shape
        Where values saturated (for a plain xq; e.g. ``ScaledTensor.saturated(x)``).

    Returns
    -------
    dict of Python numbers, computed in float64:
    ``n`` (values), ``mse`` (mean of (xq − x)²), ``rmse``, ``max_abs_error``, ``snr_db`` (10·log10(Σx² / Σ(xq −
    x)²) in dB; inf without error, NaN when x is all zero), ``underflow`` (share of values non-zero in x and zero
    in xq), ``saturated`` (share clamped to the largest magnitude, None if unknown), ``nonfinite_in`` (share of
    x not finite), ``nonfinite_out`` (share of finite x whose xq is not finite: NaN blocks, overflow).  The
    errors are over the positions where x and xq are both finite; the shares are of all n values.

    Raises
    ------
    TypeError
        x, xq or saturated of a wrong type.
    ValueError
        Shapes differ.
    """
    x = check_tensor(x)
    if isinstance(xq, QuantizedTensor):
        if saturated is None:
            saturated = xq.saturated(x)
        xq = xq.dequantize(torch.float64)
    xq = check_tensor(xq, "xq")
    if xq.shape != x.shape:
        raise ValueError(f"xq must have x's shape {tuple(x.shape)}, got {tuple(xq.shape)}")
    if saturated is not None and (
        not isinstance(saturated, torch.Tensor) or saturated.dtype != torch.bool or saturated.shape != x.shape
    ):
        raise TypeError(f"saturated must be None or a bool tensor of shape {tuple(x.shape)}")
    x64, q64 = x.to(torch.float64), xq.to(device=x.device, dtype=torch.float64)
    n = x64.numel()
    finite_in = torch.isfinite(x64)
    both = finite_in & torch.isfinite(q64)
    err = torch.where(both, q64 - x64, torch.zeros_like(x64))
    sig = torch.where(both, x64, torch.zeros_like(x64))
    pairs = int(both.sum())
    se, ss = float((err * err).sum()), float((sig * sig).sum())
    snr = snr_db(ss, se)

    def share(mask):
        return float(mask.sum()) / n if n else math.nan

    mse = se / pairs if pairs else math.nan
    return {
        "n": n,
        "mse": mse,
        "rmse": math.sqrt(mse),
        "snr_db": snr,
        "max_abs_error": float(err.abs().max()) if pairs else math.nan,
        "underflow": share(both & (x64 != 0) & (q64 == 0)),
        "saturated": None if saturated is None else share(saturated.to(x.device) & finite_in),
        "nonfinite_in": share(~finite_in),
        "nonfinite_out": share(finite_in & ~torch.isfinite(q64)),
    }


# ----------------------------------------------------------------------------------------------------------
# the counts of a training run, per layer and operand
# ----------------------------------------------------------------------------------------------------------
def new_counts() -> dict:
    """Empty counts of one operand: ``n`` values, ``nonzero`` values, ``underflow`` (non-zero values that
    became zero), ``saturated`` (values beyond their scale's range), ``nonfinite`` (finite values that became
    inf/NaN), ``signal`` (Σx²) and ``noise`` (Σ(Q(x) − x)²), over the values where both are finite."""
    return {"n": 0, "nonzero": 0, "underflow": 0, "saturated": 0, "nonfinite": 0, "signal": 0.0, "noise": 0.0}


@exact_arithmetic
def add_counts(counts: dict, t: torch.Tensor, tq: torch.Tensor, saturated: torch.Tensor) -> None:
    """Add what quantising ``t`` to ``tq`` lost to ``counts`` (a dict of :func:`new_counts`), in place.

    ``t``, ``tq``: floating tensors of one shape (the values and their quantised values); ``saturated``: bool
    tensor of that shape, where the values were beyond their scale's range (``ScaledTensor.saturated``,
    ``MXTensor.saturated``, ...).  Sums are formed in float64.
    """
    t64, q64 = t.to(torch.float64), tq.to(torch.float64)
    fin = torch.isfinite(q64) & torch.isfinite(t64)
    nz = t64 != 0
    counts["n"] += t.numel()
    counts["nonzero"] += int(nz.sum())
    counts["underflow"] += int((nz & (q64 == 0)).sum())
    counts["saturated"] += int(saturated.sum())
    counts["nonfinite"] += int((torch.isfinite(t64) & ~torch.isfinite(q64)).sum())
    counts["signal"] += float(torch.where(fin, t64 * t64, torch.zeros_like(t64)).sum())
    d = torch.where(fin, q64 - t64, torch.zeros_like(t64))
    counts["noise"] += float((d * d).sum())


def layer_stats(stats: dict) -> dict:
    """Shares and SNR from the counts of :attr:`mpt_lab.quantized_training.Quantizer.stats` (or a result's
    ``stats``): layer → role → counts of :func:`new_counts`.

    Returns
    -------
    dict layer → role → {"underflow": share of the non-zero values that became zero, "saturated": share of all
    values beyond their scale's range, "nonfinite": share of finite values that became inf/NaN, "snr_db":
    10·log10(Σx² / Σ(Q(x) − x)²)}, and under the key "all" per role the same over every layer.
    """
    out, total = {}, {}
    for layer, roles in stats.items():
        out[layer] = {}
        for role, s in roles.items():
            out[layer][role] = _shares(s)
            acc = total.setdefault(role, new_counts())
            for k in acc:
                acc[k] += s[k]
    out["all"] = {role: _shares(s) for role, s in total.items()}
    return out


def _shares(s: dict) -> dict:
    n, nz = s["n"], s["nonzero"]
    return {
        "underflow": s["underflow"] / nz if nz else 0.0,
        "saturated": s["saturated"] / n if n else 0.0,
        "nonfinite": s["nonfinite"] / n if n else 0.0,
        "snr_db": snr_db(s["signal"], s["noise"]),
    }


# ----------------------------------------------------------------------------------------------------------
# error against block size, E8M0 against FP32 scales, one scale against one per tensor
# ----------------------------------------------------------------------------------------------------------
def _snr_of(x: torch.Tensor, xq: torch.Tensor) -> float:
    x64, q64 = x.to(torch.float64), xq.to(torch.float64)
    return snr_db(float((x64 * x64).sum()), float(((q64 - x64) ** 2).sum()))


def _by_tensor_and_format(tensors: dict, formats, row) -> dict:
    """name → format name → row(tensor as float32, format), for a dict of tensors (TypeError otherwise)."""
    if not isinstance(tensors, dict) or not tensors:
        raise TypeError("tensors must be a non-empty dict of name → tensor")
    fmts = [F.get_format(f, "formats") for f in formats]
    return {
        name: {fmt.name: row(check_tensor(t, f"tensors[{name!r}]").to(torch.float32), fmt) for fmt in fmts}
        for name, t in tensors.items()
    }


@exact_arithmetic
def block_size_sweep(
    tensors: dict,
    formats: Sequence[str] = ("FP8_E4M3", "FP8_E5M2", "FP6_E3M2", "FP6_E2M3", "FP4_E2M1"),
    block_sizes: Sequence[int] = (8, 16, 32, 64, 128, 256),
) -> dict:
    """SNR (dB) of MX quantisation against block size, and with one E8M0 scale for the whole tensor.

    Parameters
    ----------
    tensors : dict name → 2-D floating tensor (blocks run along the last axis, the reduction axis of x and w;
        for output gradients pass them as (M, N): the dgrad product reduces over N)
    formats : MX element formats
    block_sizes : ints ≥ 1

    Returns
    -------
    dict name → format name → {str(block size): SNR in dB, ..., "tensor": SNR with one shared E8M0 scale for the
    whole tensor (the flattened tensor as a single block)}, computed with
    :func:`~mpt_lab.microscaling.fake_quantize_mx` (equal to :func:`~mpt_lab.microscaling.quantize_mx`'s
    values; OCP's floor rule).
    """

    def row(t: torch.Tensor, fmt: FloatFormat) -> dict:
        out = {str(bs): _snr_of(t, fake_quantize_mx(t, fmt, bs, -1)) for bs in block_sizes}
        flat = t.reshape(-1)
        out["tensor"] = _snr_of(flat, fake_quantize_mx(flat, fmt, flat.numel(), -1))
        return out

    return _by_tensor_and_format(tensors, formats, row)


@exact_arithmetic
def block_scale_comparison(
    tensors: dict, formats: Sequence[str] = ("FP8_E4M3", "FP6_E3M2", "FP4_E2M1"), block_size: int = 32
) -> dict:
    """SNR (dB) of block quantisation with an E8M0 (power-of-two) scale against an exact FP32 scale.

    The E8M0 scale is OCP MX's (:func:`~mpt_lab.microscaling.quantize_mx`, floor rule: the block's amax lands
    in the element format's top binade).  The FP32 scale maps each block's amax exactly onto the format's
    largest value, s = fl32(max / amax), and rounds fl32(v · s) to the format with saturation (Transformer
    Engine's per-tensor rule, applied per block); NVFP4 (E4M3 scales, blocks of 16) is shown for FP4.

    Returns
    -------
    dict name → format name → {"e8m0": SNR, "fp32": SNR} (and "nvfp4" for FP4_E2M1), in dB.
    """

    def row(t: torch.Tensor, fmt: FloatFormat) -> dict:
        xb, layout = to_blocks(t, block_size, t.dim() - 1)
        amax = xb.abs().amax(1, keepdim=True)
        scale = torch.where(amax > 0, torch.tensor(fmt.max, dtype=torch.float32) / amax, torch.ones_like(amax))
        fq = F.round_to(xb * scale, fmt, saturate=True).to(torch.float64) / scale.to(torch.float64)
        out = {
            "e8m0": _snr_of(t, fake_quantize_mx(t, fmt, block_size, -1)),
            "fp32": _snr_of(t, from_blocks(fq.to(torch.float32), layout, t.dim() - 1, False)),
        }
        if fmt == FP4_E2M1:
            out["nvfp4"] = _snr_of(t, fake_quantize_nvfp4(t))
        return out

    return _by_tensor_and_format(tensors, formats, row)


def mean_over_layers(per_layer: dict) -> dict:
    """The mean SNR (dB) over layers of :func:`block_size_sweep` or :func:`block_scale_comparison` output:
    layer → format → {key: SNR} becomes format → {key: mean SNR} (non-finite values left out)."""
    if not isinstance(per_layer, dict) or not per_layer:
        raise TypeError("per_layer must be a non-empty dict layer → format → {key: SNR}")
    acc: dict = {}
    for fmts in per_layer.values():
        for fmt, row in fmts.items():
            for k, v in row.items():
                acc.setdefault(fmt, {}).setdefault(k, []).append(v)
    return {
        fmt: {
            k: (
                sum(x for x in v if math.isfinite(x)) / max(1, sum(math.isfinite(x) for x in v))
                if any(math.isfinite(x) for x in v)
                else math.nan
            )
            for k, v in row.items()
        }
        for fmt, row in acc.items()
    }


def one_scale_vs_per_tensor(histograms: dict, fmt: FormatLike = "FP8_E5M2") -> dict:
    """What one scale for all tensors loses against one scale per tensor, from their log2 histograms.

    One scale: the largest power of two S for which no value of *any* tensor overflows ``fmt``
    (:meth:`~mpt_lab.histogram.Log2Histogram.max_scale` of the sum of the histograms), as one loss scale
    does.  Per tensor: each tensor's own largest such power of two (per-tensor scaling with power-of-two
    scales).  Shares are exact (:meth:`~mpt_lab.histogram.Log2Histogram.fractions`).

    Parameters
    ----------
    histograms : dict name → :class:`~mpt_lab.histogram.Log2Histogram`
    fmt : the format the tensors are stored in

    Returns
    -------
    dict with "one_scale" (log2 S), and "tensors": name → {"amax_log2": binade of the tensor's amax,
    "per_tensor_log2": log2 of its own scale, "lost_one_scale" / "lost_per_tensor": share of its non-zero
    values that underflow to zero, "energy_lost_one_scale" / "energy_lost_per_tensor": the share of its sum of
    squares Σx² that those values carry (which values underflow is exact; their squares are estimated per binade
    as 4^(k + ½) for the binade [2ᵏ, 2ᵏ⁺¹), within a factor of 2 per value): what the lost values alone cost a
    signal-to-noise ratio, which weighs values by their square}.
    """
    if (
        not isinstance(histograms, dict)
        or not histograms
        or not all(isinstance(h, Log2Histogram) for h in histograms.values())
    ):
        raise TypeError("histograms must be a non-empty dict of name → Log2Histogram")
    fmt = F.get_format(fmt)
    total = None
    for h in histograms.values():
        total = h if total is None else total + h
    s_all = total.max_scale(fmt)

    def lost(h, s):
        fr = h.fractions(fmt, s)
        nz = 1.0 - fr["zero"] - fr["nonfinite"]
        return fr["underflow"] / nz if nz > 0 else 0.0

    def energy_lost(h, s):
        """Share of Σx² in the values that round to zero after × s: the binades wholly below half the smallest
        subnormal, and the exact ties at half of it (fine bin 0 of the binade just above: fraction zero)."""
        k = h.exponents + round(math.log2(s))
        w = np.exp2(2.0 * h.exponents + 1.0)  # 4^(e + ½) per value of binade e
        total = float((h.counts * w).sum())
        if total <= 0:
            return 0.0
        half_sub = fmt.emin - fmt.mantissa_bits - 1  # half the smallest subnormal: 2^half_sub
        below = k <= half_sub - 1
        ties = k == half_sub
        lost_e = float((h.counts[below] * w[below]).sum()) + float((h.fine[ties, 0] * w[ties]).sum())
        return lost_e / total

    rows = {}
    for name, h in histograms.items():
        s = h.max_scale(fmt)
        rows[name] = {
            "amax_log2": math.frexp(h.amax)[1] - 1 if h.amax > 0 else None,
            "per_tensor_log2": int(math.log2(s)) if math.isfinite(s) else None,
            "lost_one_scale": lost(h, s_all) if math.isfinite(s_all) else 0.0,
            "lost_per_tensor": lost(h, s) if math.isfinite(s) else 0.0,
            "energy_lost_one_scale": energy_lost(h, s_all) if math.isfinite(s_all) else 0.0,
            "energy_lost_per_tensor": energy_lost(h, s) if math.isfinite(s) else 0.0,
        }
    return {"format": fmt.name, "one_scale": int(math.log2(s_all)) if math.isfinite(s_all) else None, "tensors": rows}
