"""NVFP4: FP4 E2M1 elements in blocks of 16 with FP8 E4M3 scales, and one FP32 scale per tensor.

:func:`quantize_nvfp4` is exact and returns codes (:class:`NVFP4Tensor`); :func:`fake_quantize_nvfp4`, its
fast twin, returns the same values as ``quantize_nvfp4(...).dequantize()``, bit for bit, without forming
codes.  Both take the tensor scale and the block scales from the same functions (:func:`_tensor_scale`,
:func:`_block_scales`); they differ in how the elements are rounded.  Source: NVIDIA's two-level scaling for
NVFP4, as its kernels and torchao's reference (``nvfp4_quantize``) compute it.

Two options of NVIDIA's NVFP4 training recipe (NVIDIA, "Pretraining Large Language Models with NVFP4",
arXiv:2509.25149), both defaults off, so that the default quantisers are the ones above:

* ``blocks="2d"`` (§4.3): a matrix's values are scaled in 16 × 16 tiles, one E4M3 scale per tile (the
  amax of its 256 values), still with the FP32 tensor scale; the tile's scale is given to each of its
  1 × 16 blocks, so the result is an ordinary :class:`NVFP4Tensor` along ``axis``, and quantising the
  transpose gives the transpose, value for value: the forward and the backward pass read the same weight.
* ``rounding="stochastic"`` (§4.4, Appendix E.3: on the gradients): the elements are rounded to E2M1
  stochastically (:func:`mpt_lab.formats.round_to`), so E[element] = fl32(v · fl32(fl32(1/s_t)/s_b)), the
  value rounded, exactly, wherever that value does not exceed 6.  It can: the E4M3 block scale is rounded to
  nearest (Appendix B.2), and where it rounds down the block maximum lands above 6 (up to 6·(1 + 2⁻⁴), and
  float32 rounding) and is clamped to 6.  The block scales are always rounded to nearest.

Appendix B of the paper writes the scales as encode scales, s_enc = 6·448/amax and
e4m3(amax_b/6 · s_enc); the functions here use the decode scales of torchao's reference, s_t = amax/(448·6)
and e4m3(fl32(amax_b/6)/s_t).  They are the same numbers in exact arithmetic and can differ in the last
bit of the float32 intermediate scales.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .. import formats as F
from ..formats import FP4_E2M1, FP8_E4M3, exact_arithmetic
from ._core import (
    BlockScaledTensor,
    abs_max,
    as_float32,
    block_amax,
    check_axis,
    check_blocks,
    check_rounding,
    check_tensor,
    encode_into,
    from_blocks,
    scale_rows_and_encode,
    tile_amax,
    to_blocks,
)

__all__ = ["NVFP4Tensor", "quantize_nvfp4", "fake_quantize_nvfp4", "NVFP4_BLOCK_SIZE"]

#: NVFP4's block length: 16 FP4 values share one E4M3 scale.
NVFP4_BLOCK_SIZE = 16
_E4M3_NAN = 0x7F
_NVFP4_SCALE_MIN = FP8_E4M3.smallest_normal  # 2⁻⁶: NVFP4 block scales are clamped to [2⁻⁶, 448]


@dataclass(frozen=True, eq=False)
class NVFP4Tensor(BlockScaledTensor):
    """An NVFP4 tensor: FP4 E2M1 elements; blocks of 16 along ``axis`` share an FP8 E4M3 scale; one FP32 scale
    for the whole tensor (NVIDIA's two-level scaling).

    Attributes as :class:`MXTensor`, except that ``scale_codes`` holds FP8 E4M3 codes (0x7F: NaN) and
    ``tensor_scale`` is a 0-d float32 tensor (a decode scale: torchao's ``per_tensor_scale``).  The value of an
    element is element × block scale × tensor scale.
    """

    tensor_scale: torch.Tensor | None = None

    def block_scales(self) -> torch.Tensor:
        """The E4M3 block scales as float64 (NaN for code 0x7F), shaped like ``scale_codes``."""
        return F.decode(self.scale_codes, FP8_E4M3)

    def scales(self) -> torch.Tensor:
        """Block scale × tensor scale per block, float64 (exact: 4 + 24 significant bits)."""
        return self.block_scales() * self.tensor_scale.to(self.device, torch.float64)

    def _scaled(self, x: torch.Tensor) -> torch.Tensor:
        # what quantize_nvfp4 rounded: fl32(x · fl32(fl32(1 / s_t) / s_b))
        r = (1.0 / self.tensor_scale.to(self.device)) / self.block_scales().to(torch.float32)
        return (x.to(torch.float32) * self._per_value(r)).to(torch.float64)

    def __repr__(self) -> str:
        return (
            f"NVFP4Tensor(shape={tuple(self.shape)}, block_size={self.block_size}, axis={self.axis}, "
            f"tensor_scale={float(self.tensor_scale)!r}, dtype={self.dtype})"
        )


def _tensor_scale(x: torch.Tensor, tensor_scale, block_amaxes: torch.Tensor | None = None) -> torch.Tensor:
    """The FP32 tensor (decode) scale: ``tensor_scale``, or fl32(amax / (448·6)) from the finite values of x.
    ``block_amaxes`` (the float32 amax of every block of x, :func:`_block_amaxes`) saves a pass over x: their
    maximum is amax(x) rounded to float32 when it is finite."""
    if tensor_scale is not None:
        s = as_float32(tensor_scale, "tensor_scale", x.device)
        if s.dim() != 0:
            raise ValueError(f"tensor_scale must be a single value (0-d), got shape {tuple(s.shape)}")
        if not bool(torch.isfinite(s) & (s > 0) & torch.isfinite(1.0 / s)):
            raise ValueError(f"tensor_scale must be positive with a finite float32 reciprocal, got {float(s)}")
        return s
    if block_amaxes is not None and block_amaxes.numel():
        amax = block_amaxes.max()
    else:
        amax = abs_max(x).to(torch.float32)
    if not bool(torch.isfinite(amax)):
        amax = abs_max(torch.where(torch.isfinite(x), x, torch.zeros_like(x))).to(torch.float32)
    s = amax / (FP8_E4M3.max * FP4_E2M1.max)
    return torch.where(torch.isfinite(s) & (s > 0) & torch.isfinite(1.0 / s), s, torch.ones_like(s))


def _block_amaxes(xb: torch.Tensor, layout: tuple, blocks: str) -> torch.Tensor:
    """amax_b of every block of 16 (rows of xb), float32 (NaN where the block holds NaN); with ``blocks="2d"``
    the amax of the block's 16 × 16 tile (:func:`~mpt_lab.microscaling._core.tile_amax`)."""
    amax = block_amax(xb, torch.float32)
    return tile_amax(amax, layout, NVFP4_BLOCK_SIZE) if blocks == "2d" else amax


def _block_scales(amax: torch.Tensor, st: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(s, nan) per block from its amax_b (:func:`_block_amaxes`): s = fl32(fl32(amax_b / 6) / s_t) clamped to
    [2⁻⁶, 448], float32, before its rounding to E4M3 (1 in blocks holding inf or NaN), and where the block
    holds inf or NaN."""
    nan = ~torch.isfinite(amax)
    return (amax / FP4_E2M1.max / st).clamp_(_NVFP4_SCALE_MIN, FP8_E4M3.max).masked_fill_(nan, 1.0), nan


@exact_arithmetic
def quantize_nvfp4(
    x: torch.Tensor,
    *,
    tensor_scale: float | torch.Tensor | None = None,
    axis: int = -1,
    blocks: str = "1d",
    rounding: str = "nearest_even",
    generator: torch.Generator | None = None,
) -> NVFP4Tensor:
    """Quantise x to NVFP4: FP4 E2M1 elements, blocks of 16 along ``axis`` with FP8 E4M3 scales, and one FP32
    tensor scale.

    NVIDIA's algorithm, in float32 as its kernels and torchao's reference (``nvfp4_quantize``) compute it,
    every step a correctly rounded float32 operation:

    1. tensor scale s_t = fl32(amax / (448 · 6)) over the finite values of x (1 when that is zero, not finite,
       or has no finite float32 reciprocal), or ``tensor_scale`` if given (torchao's ``per_tensor_scale``;
       ``tensor_scale=1.0`` is single-level scaling, torchao's ``per_tensor_scale=None``);
    2. per block: fl32(fl32(amax_b / 6) / s_t), clamped to [2⁻⁶, 448], rounded to nearest-even in E4M3: the
       block scale s_b;
    3. elements: fl32(v · fl32(fl32(1 / s_t) / s_b)), rounded to nearest-even in FP4 E2M1, saturating at ±6.

    The value stored is element × s_b × s_t.  Blocks holding inf or NaN get the NaN block scale (E4M3 code 0x7F)
    and element codes 0.  float64 input is rounded to float32 first (the algorithm is defined in float32).  A
    partial last block (axis length not a multiple of 16) has its own scale.

    ``blocks="2d"`` (x a matrix) takes amax_b in step 2 over the block's 16 × 16 tile (16 rows by 16 columns; a
    partial tile at an edge has its own), NVIDIA's 2D weight scaling (arXiv:2509.25149, §4.3): every block of
    a tile gets the tile's scale, so ``quantize_nvfp4(w, blocks="2d").dequantize().T`` equals
    ``quantize_nvfp4(w.T, blocks="2d").dequantize()`` value for value, whatever ``axis``.  ``rounding=
    "stochastic"`` rounds the elements in step 3 stochastically (§4.4) with bits drawn from ``generator``
    (:func:`mpt_lab.formats.round_to`; the module docstring says where that is unbiased).

    Parameters
    ----------
    x : float16, bfloat16, float32 or float64 tensor, at least 1-d (2-d for ``blocks="2d"``)
    tensor_scale : None, float or 0-d floating tensor
    axis : int
    blocks : {"1d", "2d"}
    rounding : {"nearest_even", "stochastic"}
    generator : None, int or torch.Generator (stochastic rounding only; see :func:`mpt_lab.formats.round_to`)

    Returns
    -------
    NVFP4Tensor

    Raises
    ------
    TypeError
        x is not such a tensor; axis not an int; tensor_scale, blocks, rounding or generator of a wrong type.
    ValueError
        axis out of range; tensor_scale not a positive single value with a finite reciprocal; unknown blocks
        or rounding; blocks="2d" for a tensor that is not 2-d; meta tensor.
    """
    x = check_tensor(x)
    axis = check_axis(axis, x.dim())
    blocks, rounding = check_blocks(blocks, x), check_rounding(rounding)
    xb, layout = to_blocks(x, NVFP4_BLOCK_SIZE, axis)
    amax = _block_amaxes(xb, layout, blocks)
    st = _tensor_scale(x, tensor_scale, amax)
    s, nan = _block_scales(amax, st)
    sc = torch.empty(s.shape, dtype=torch.uint8, device=x.device)
    encode_into(sc, s, FP8_E4M3)
    r = (1.0 / st) / F.decode(sc, FP8_E4M3).to(torch.float32)  # fl32(fl32(1 / s_t) / s_b)
    codes = scale_rows_and_encode(xb, r, nan, FP4_E2M1, torch.float32, rounding, generator)
    scale_codes = torch.where(nan, _E4M3_NAN, sc)
    return NVFP4Tensor(
        from_blocks(codes, layout, axis, False),
        from_blocks(scale_codes, layout, axis, True),
        FP4_E2M1,
        NVFP4_BLOCK_SIZE,
        axis,
        x.dtype,
        st,
    )


@exact_arithmetic
def fake_quantize_nvfp4(
    x: torch.Tensor,
    *,
    axis: int = -1,
    blocks: str = "1d",
    rounding: str = "nearest_even",
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """``quantize_nvfp4(x, axis=axis, blocks=blocks, rounding=rounding, generator=generator).dequantize()``
    for float32 (or narrower) x, without codes: the same values bit for bit (stochastic rounding included:
    the same bits drawn from the same generator state), faster.

    NVIDIA's two-level scaling in float32, as :func:`quantize_nvfp4` (the same tensor and block scales):
    elements round_to(fl32(v · fl32(fl32(1 / s_t) / s_b)), FP4_E2M1, saturate=True, rounding=rounding);
    value = element × s_b × s_t, rounded once to x's dtype.  Blocks holding inf or NaN become NaN.

    Raises TypeError / ValueError for a bad x, axis, blocks, rounding or generator.
    """
    x = check_tensor(x)
    if x.dtype == torch.float64:
        raise TypeError("x must be float16, bfloat16 or float32 (use mpt_lab.microscaling.quantize_nvfp4 for float64)")
    axis = check_axis(axis, x.dim())
    blocks, rounding = check_blocks(blocks, x), check_rounding(rounding)
    x32 = x.to(torch.float32)
    xb, layout = to_blocks(x32, NVFP4_BLOCK_SIZE, axis)
    amax = _block_amaxes(xb, layout, blocks)
    st = _tensor_scale(x32, None, amax)
    s, nan = _block_scales(amax, st)
    sb = F.round_to(s, FP8_E4M3)
    any_nan = bool(nan.any())
    if any_nan:  # FP4 has no NaN: zero them first
        xb = xb.masked_fill(nan[:, None], 0.0)
    elem = F.round_to(xb * ((1.0 / st) / sb)[:, None], FP4_E2M1, saturate=True, rounding=rounding, generator=generator)
    y = elem.mul_(sb[:, None]).mul_(st)  # element × s_b is exact; × s_t rounds once (in place: no new tensor)
    if any_nan:
        y[nan] = math.nan
    return from_blocks(y, layout, axis, False).to(x.dtype)
