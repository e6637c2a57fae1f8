"""OCP MX block scaling: blocks of values along an axis share a power-of-two (E8M0) scale.

:func:`quantize_mx` is exact and returns codes (:class:`MXTensor`); :func:`fake_quantize_mx`, its fast twin,
returns the same values as ``quantize_mx(...).dequantize()``, bit for bit, without forming codes (what a
training step needs).  Both take the shared scale from the same function of each block's amax bits
(:func:`_scale_codes_mx`, OCP MX v1.0 §6.3 and the other rules of :data:`SCALE_ROUNDINGS`), so they cannot
disagree on it; they differ in how the elements are rounded (codes, chunk by chunk, against
:func:`mpt_lab.formats.round_to` on the whole tensor).  Source: OCP Microscaling Formats (MX) Specification
v1.0, §5 (formats), §5.4.1 (E8M0), §6.3 (conversion).

Two options for four-bit training, both off by default: ``blocks="2d"``, square tiles of block_size ×
block_size values of a matrix sharing one scale (NVIDIA, "Pretraining Large Language Models with NVFP4",
arXiv:2509.25149, §4.3, written there for NVFP4's 16 × 16), and ``rounding="stochastic"``, elements rounded
stochastically (Tseng et al., "Training LLMs with MXFP4", arXiv:2502.20586; Castro et al., "Quartet",
arXiv:2505.14669).  Stochastic rounding is unbiased only where v / X does not exceed the element format's
max: OCP's floor scale leaves the block maximum up to 8 for FP4 (saturated to 6), so Tseng et al. multiply
the block by 3/4 before rounding (and by 4/3 after), which is no MX tensor; ``scale_rounding="rceil"`` (the
smallest power of two that saturates nothing, what the NVFP4 paper's Appendix B.4 describes for MXFP4) keeps
the values on the MX grid and SR unbiased.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .. import formats as F
from ..formats import E8M0, FP4_E2M1, FP6_E2M3, FP6_E3M2, FP8_E4M3, FP8_E5M2, FloatFormat, FormatLike, exact_arithmetic
from ._core import (
    BITS,
    FLOAT8,
    BlockScaledTensor,
    block_amax,
    check_axis,
    check_blocks,
    check_choice,
    check_int,
    check_rounding,
    check_tensor,
    from_blocks,
    pow2,
    scale_rows_and_encode,
    tile_amax,
    to_blocks,
    work_dtype,
)

__all__ = [
    "MXTensor",
    "quantize_mx",
    "fake_quantize_mx",
    "MX_ELEMENT_FORMATS",
    "MX_FORMATS",
    "SCALE_ROUNDINGS",
    "E8M0_NAN",
]

#: Element formats of the concrete MX formats (OCP MX v1.0 §5.1): MXFP8 (E4M3, E5M2), MXFP6 (E3M2, E2M3), MXFP4.
MX_ELEMENT_FORMATS = (FP8_E4M3, FP8_E5M2, FP6_E3M2, FP6_E2M3, FP4_E2M1)
#: The concrete MX formats by name (OCP MX v1.0 §5.1, Table 1) → their element format.  :class:`MXTensor`'s
#: repr prints these names; :func:`quantize_mx` takes them in any case ("mxfp8_e4m3" too).  MXFP8 and MXFP6
#: each have two element formats, so "MXFP8" and "MXFP6" alone name none.
MX_FORMATS = {"MX" + f.name: f for f in MX_ELEMENT_FORMATS} | {"MXFP4": FP4_E2M1}
#: Rules for the MX shared scale (``quantize_mx(..., scale_rounding=)``); "floor" is OCP MX v1.0 §6.3.
SCALE_ROUNDINGS = ("floor", "ceil", "even", "rceil")
#: The E8M0 code of NaN (OCP MX v1.0 §5.4.1); codes 0…254 are the scales 2^(code − 127).
E8M0_NAN = 0xFF


@dataclass(frozen=True, eq=False)
class MXTensor(BlockScaledTensor):
    """An OCP MX tensor (OCP MX v1.0 §5): blocks of ``block_size`` elements along ``axis`` share an E8M0 scale.

    Attributes
    ----------
    element_codes : uint8 tensor of x's shape
        Codes of the elements in ``fmt`` (FP6 and FP4 codes in the low bits of a byte, one per byte; see
        :func:`mpt_lab.formats.encode`); 0 in blocks whose scale is NaN.
    scale_codes : uint8 tensor
        E8M0 codes (code c is the scale 2^(c − 127); 0xFF is NaN), shaped like x with the axis length n
        replaced by the number of blocks ⌈n / block_size⌉.
    fmt : FloatFormat
        The element format, one of :data:`MX_ELEMENT_FORMATS`.
    block_size, axis : int
        Block length and the (non-negative) axis the blocks run along.
    dtype : torch.dtype
        The quantised tensor's dtype (what :meth:`dequantize` returns by default).
    scale_rounding : str
        The shared-scale rule used, one of :data:`SCALE_ROUNDINGS`.

    The value of an element is element × 2^(c − 127) with c its block's scale code (OCP MX v1.0 §5); every
    value of a block with the NaN scale is NaN.
    """

    scale_rounding: str = "floor"

    def scales(self) -> torch.Tensor:
        """The block scales X = 2^(code − 127) as float64 (NaN for 0xFF), shaped like ``scale_codes``."""
        return F.decode(self.scale_codes, E8M0)

    def _work(self, dtype: torch.dtype) -> torch.dtype:
        return work_dtype(dtype)  # element × 2^k is exact in float32 too (overflow aside: inf)

    def _element_values(self, work: torch.dtype) -> torch.Tensor:
        if self.fmt in FLOAT8:
            return self.element_codes.view(FLOAT8[self.fmt]).to(work)
        return self.elements().to(work)

    def __repr__(self) -> str:
        return (
            f"MXTensor(MX{self.fmt.name}, shape={tuple(self.shape)}, block_size={self.block_size}, "
            f"axis={self.axis}, scale_rounding={self.scale_rounding!r}, dtype={self.dtype})"
        )


def _element_format(fmt) -> FloatFormat:
    """The element format named by ``fmt``: an MX element format (FloatFormat or its name) or an MX format's name
    (:data:`MX_FORMATS`, any case).  ValueError listing both kinds of name otherwise."""
    key = fmt.strip().upper() if isinstance(fmt, str) else None
    if key in MX_FORMATS:
        return MX_FORMATS[key]
    expected = (
        f"fmt must be an MX element format {[f.name for f in MX_ELEMENT_FORMATS]} or an MX format name "
        f"{list(MX_FORMATS)} (any case)"
    )
    if key in ("MXFP8", "MXFP6"):
        example = "MXFP8_E4M3" if key == "MXFP8" else "MXFP6_E3M2"
        raise ValueError(f"{expected}; {fmt!r} names two MX formats (OCP MX v1.0 §5.1): say which, e.g. {example}")
    try:
        f = F.get_format(fmt)
    except ValueError:
        raise ValueError(f"{expected}, got {fmt!r}") from None
    if f not in MX_ELEMENT_FORMATS:
        raise ValueError(f"{expected}, got {f.name}")
    return f


def _mx_arguments(
    x: torch.Tensor, fmt, block_size, axis, scale_rounding, blocks="1d", rounding="nearest_even"
) -> tuple:
    """(element format, block size, non-negative axis, scale rule, block layout, element rounding), checked as
    :func:`quantize_mx` documents."""
    return (
        _element_format(fmt),
        check_int(block_size, "block_size", 1),
        check_axis(axis, x.dim()),
        check_choice(scale_rounding, "scale_rounding", SCALE_ROUNDINGS),
        check_blocks(blocks, x),
        check_rounding(rounding),
    )


def _amax(xb: torch.Tensor, work: torch.dtype, layout: tuple, block_size: int, blocks: str) -> torch.Tensor:
    """Each block's amax (work dtype), or with ``blocks="2d"`` its block_size × block_size tile's."""
    amax = block_amax(xb, work)
    return tile_amax(amax, layout, block_size) if blocks == "2d" else amax


def _scale_codes_mx(amax: torch.Tensor, fmt: FloatFormat, rule: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(c, nan): each block's E8M0 code c ∈ [0, 254] (X = 2^(c − 127)) and where X is NaN instead.

    From the bits of amax (float32 or float64: exponent field E, mantissa field M; t mantissa bits, bias b):
    for a normal amax ⌊log2 amax⌋ = E − b, so floor's code is E − b − emax + 127 (OCP MX v1.0 §6.3).  A
    subnormal or zero amax (E = 0) gives a code ≤ 0 for every element format, i.e. 0, as its exact logarithm
    would; an infinite or NaN amax gives NaN, and so does a code above 254 (only float64 amax can need one).
    """
    ints, t, b, top = BITS[amax.dtype]
    bits = amax.view(ints)  # |amax| (block_amax clears the sign bit, also of −0 and NaN)
    e = bits >> t
    nan = e == top
    c = e.sub_(b + fmt.emax - 127).to(torch.int32)  # floor
    if rule != "floor":
        mant = bits & ((1 << t) - 1)
        if rule == "ceil":  # ⌈log2 amax⌉: up unless amax is a power of two
            c += mant != 0
        elif rule == "even":  # 1.M rounded to fmt's precision reaches 2
            c += mant >= (1 << t) - (1 << (t - fmt.mantissa_bits - 1))
        else:  # rceil: amax / 2^k > max  ⟺  1.M > max / 2^emax
            c += mant > int((fmt.max / 2.0**fmt.emax - 1) * (1 << t))
    if amax.dtype == torch.float64:  # float32: E ≤ 254 gives c ≤ 253 anyway
        nan |= c > 254
    return c.clamp_(0, 254), nan


def _pow2_neg_scale(c: torch.Tensor, work: torch.dtype) -> torch.Tensor:
    """1 / X = 2^(127 − c) for E8M0 codes c, exactly, in the working type.  float32: the biased exponent field
    254 − c ≥ 1, since a finite float32 amax has c ≤ 253 (c = 254 only in NaN blocks, whose values are
    dropped)."""
    if work == torch.float64:
        return pow2(127 - c, torch.float64)
    return ((254 - c) << 23).view(torch.float32)


@exact_arithmetic
def quantize_mx(
    x: torch.Tensor,
    fmt: FormatLike,
    block_size: int = 32,
    axis: int = -1,
    *,
    scale_rounding: str = "floor",
    blocks: str = "1d",
    rounding: str = "nearest_even",
    generator: torch.Generator | None = None,
) -> MXTensor:
    """Quantise x to an OCP MX format: blocks of ``block_size`` values along ``axis`` share a power-of-two scale.

    Per block (OCP MX v1.0 §6.3): amax = max |v|; shared scale X = 2^(⌊log2 amax⌋ − emax), emax being the element
    format's largest exponent (E4M3: 8, E5M2: 15, E3M2: 4, E2M3: 2, E2M1: 2), stored as an E8M0 code (§5.4.1)
    and at least 2⁻¹²⁷; each element is v / X rounded to nearest-even in ``fmt``, saturating at ±max.  The
    module docstring gives the other ``scale_rounding`` rules and the handling of inf/NaN (NaN scale), partial
    last blocks (their own scale) and axes.

    Parameters
    ----------
    x : float16, bfloat16, float32 or float64 tensor, at least 1-d, CPU or CUDA
    fmt : FloatFormat or str
        Element format: FP8_E4M3, FP8_E5M2 (MXFP8), FP6_E3M2, FP6_E2M3 (MXFP6) or FP4_E2M1 (MXFP4), or the MX
        format's name as :class:`MXTensor`'s repr prints it (:data:`MX_FORMATS`: "MXFP8_E4M3", …, "MXFP4";
        any case).
    block_size : int ≥ 1
        32 in every concrete MX format (§5.1).
    axis : int
        The axis the blocks run along (for a matrix product: the reduction axis).
    scale_rounding : {"floor", "ceil", "even", "rceil"}
    blocks : {"1d", "2d"}
        "2d" (x a matrix): the scale comes from the amax of the block's block_size × block_size tile (a
        partial tile at an edge has its own) and is given to each of the tile's blocks, so the values of x.T
        quantised are those of x quantised, transposed (module docstring).
    rounding : {"nearest_even", "stochastic"}
        How v / X is rounded to ``fmt`` (saturating at ±max either way); stochastic bits come from
        ``generator`` (:func:`mpt_lab.formats.round_to`).
    generator : None, int or torch.Generator

    Returns
    -------
    MXTensor
        ``element_codes`` (uint8, x's shape), ``scale_codes`` (uint8 E8M0), ``.dequantize()``.

    Raises
    ------
    TypeError
        x is not such a tensor; block_size or axis not an int; scale_rounding, blocks or rounding not a str;
        generator of a wrong type.
    ValueError
        fmt is no MX element format or MX format name (the message lists them); block_size < 1; axis out of range;
        unknown scale_rounding, blocks or rounding; blocks="2d" for a tensor that is not 2-d; meta tensor.
    """
    x = check_tensor(x)
    fmt, block_size, axis, rule, blocks, rounding = _mx_arguments(
        x, fmt, block_size, axis, scale_rounding, blocks, rounding
    )
    xb, layout = to_blocks(x, block_size, axis)
    work = work_dtype(x.dtype)
    c, nan = _scale_codes_mx(_amax(xb, work, layout, block_size, blocks), fmt, rule)
    codes = scale_rows_and_encode(xb, _pow2_neg_scale(c, work), nan, fmt, work, rounding, generator)  # v / X: exact
    scale_codes = c.masked_fill_(nan, E8M0_NAN).to(torch.uint8)
    return MXTensor(
        from_blocks(codes, layout, axis, False),
        from_blocks(scale_codes, layout, axis, True),
        fmt,
        block_size,
        axis,
        x.dtype,
        rule,
    )


@exact_arithmetic
def fake_quantize_mx(
    x: torch.Tensor,
    fmt: FormatLike,
    block_size: int = 32,
    axis: int = -1,
    *,
    scale_rounding: str = "floor",
    blocks: str = "1d",
    rounding: str = "nearest_even",
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """``quantize_mx(x, fmt, block_size, axis, scale_rounding=..., blocks=..., rounding=...,
    generator=...).dequantize()`` for float32 (or narrower) x, computed without codes: the same values bit
    for bit (the tests compare them on random, tied, subnormal, zero, infinite and NaN blocks, and with
    stochastic rounding from the same generator state), four (E4M3) to ten (FP6, FP4) times faster on a CPU.

    Per block of ``block_size`` values along ``axis``: the E8M0 code c of the shared scale as in
    :func:`quantize_mx` (the same function of the block's amax), X = 2^(c − 127); each value becomes
    round_to(v · 2^(127 − c), fmt, saturate=True) · X (both products exact).  A block holding inf or NaN
    becomes NaN.

    Parameters
    ----------
    x : float16, bfloat16 or float32 tensor, at least 1-d (float64 is refused: its MX scale uses float64 bits)
    fmt, block_size, axis, scale_rounding, blocks, rounding, generator : as :func:`quantize_mx`

    Returns
    -------
    Tensor of x's shape, dtype and device, no autograd history.

    Raises
    ------
    TypeError, ValueError
        A bad x, fmt, block_size, axis, scale_rounding, blocks, rounding or generator, each named.
    """
    x = check_tensor(x)
    if x.dtype == torch.float64:
        raise TypeError("x must be float16, bfloat16 or float32 (use mpt_lab.microscaling.quantize_mx for float64)")
    fmt, block_size, axis, rule, blocks, rounding = _mx_arguments(
        x, fmt, block_size, axis, scale_rounding, blocks, rounding
    )
    xb, layout = to_blocks(x.to(torch.float32), block_size, axis)
    c, nan = _scale_codes_mx(_amax(xb, torch.float32, layout, block_size, blocks), fmt, rule)
    any_nan = bool(nan.any())
    if any_nan:  # FP6/FP4 have no NaN: zero them first
        xb = xb.masked_fill(nan[:, None], 0.0)
    elem = F.round_to(
        xb * _pow2_neg_scale(c, torch.float32)[:, None], fmt, saturate=True, rounding=rounding, generator=generator
    )  # v / X: exact
    y = elem * pow2(c - 127, torch.float32)[:, None]  # element × X: exact
    if any_nan:
        y[nan] = math.nan
    return from_blocks(y, layout, axis, False).to(x.dtype)
