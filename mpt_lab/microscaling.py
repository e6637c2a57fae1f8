"""Scaled low-precision quantisation: per-tensor FP8 scaling, OCP MX block scaling and NVFP4, exactly.

A tensor is stored in a narrow format together with scale factors that bring its values into the format's
range.  Three families, each written from its source:

====================  ==================================================================================
recipe                what is stored, and the source
====================  ==================================================================================
per-tensor, current   :func:`quantize_per_tensor`: q = x·scale rounded to FP8 (saturating), one FP32 scale
                      per tensor, scale = (fmt.max / amax) / 2^margin (Transformer Engine)
per-tensor, delayed   :class:`DelayedScaling`: the same, with the scale computed from the amax history of
                      the steps before (Transformer Engine's ``DelayedScaling`` recipe)
MX block scaling      :func:`quantize_mx` → :class:`MXTensor`: blocks of 32 values along one axis share an
                      E8M0 scale 2^k; elements in FP8 E4M3/E5M2, FP6 E3M2/E2M3 or FP4 E2M1 (OCP Microscaling
                      Formats (MX) Specification v1.0, §5 and §6.3)
NVFP4                 :func:`quantize_nvfp4` → :class:`NVFP4Tensor`: blocks of 16 FP4 E2M1 values share an
                      FP8 E4M3 scale, and the tensor has one FP32 scale (NVIDIA's two-level scaling)
====================  ==================================================================================

Every result turns back into a tensor with ``.dequantize()``; :func:`quantization_error` measures what a
recipe lost on a tensor (mean squared error, largest error, signal-to-noise ratio in dB, the shares of values
that underflowed to zero or saturated).  :func:`quantize` and :func:`fake_quantize` run a recipe by name
(:data:`RECIPES`), which is what a ``torch.autograd.Function`` that quantises a Linear layer's input, weight
and output gradient needs::

    class QuantLinearFn(torch.autograd.Function):     # y = x @ w.t(), x: (batch, K), w: (N, K)
        @staticmethod
        def forward(ctx, x, w, recipe):
            ctx.save_for_backward(x, w)
            ctx.recipe = recipe
            # each operand of each product is quantised along that product's reduction axis
            return fake_quantize(x, recipe, axis=-1) @ fake_quantize(w, recipe, axis=-1).t()   # over K

        @staticmethod
        def backward(ctx, g):                               # g: (batch, N)
            x, w = ctx.saved_tensors
            r = ctx.recipe
            gx = fake_quantize(g, r, axis=-1) @ fake_quantize(w, r, axis=0)        # over N
            gw = fake_quantize(g, r, axis=0).t() @ fake_quantize(x, r, axis=0)     # over the batch
            return gx, gw, None

Exactness
---------
Elements are rounded with :mod:`mpt_lab.formats` (round-to-nearest-even with saturation); scales come from
integer arithmetic on the bits of amax; dividing by a power-of-two scale is exact.  For FP8 elements and
float32 work the rounding is torch's own float32 → float8 conversion, used only after it has been checked
once per format and device, bit for bit, against :func:`mpt_lab.formats.encode` on every FP8 value, every
midpoint (tie) and their float32 neighbours, and on the values beyond the range that it must saturate (if it
ever differs, ``encode`` is used, with a warning): it is about ten times faster.  Large CPU tensors are
processed in chunks of whole blocks, so that temporaries stay in the cache; there is no Python loop over
blocks.  Public functions run under :func:`mpt_lab.formats.exact_arithmetic`, so they stay exact inside a
:class:`mpt_lab.simulate.simulate` block.

Decisions where the sources leave a choice
------------------------------------------
* **Shared scale** (OCP MX v1.0 §6.3): X = 2^(⌊log2 amax⌋ − emax), where emax is the element format's largest
  exponent: ``scale_rounding="floor"``.  The rules other libraries offer (torchao's ``ScaleCalculationMode``)
  are selectable: ``"ceil"``, X = 2^(⌈log2 amax⌉ − emax); ``"even"``, amax is first rounded to the element
  format's precision, so X doubles when the block maximum would round up to 2^(emax+1); ``"rceil"``, X is the
  smallest power of two with amax / X ≤ max (NVIDIA cuBLAS' UE8M0 rule: no element saturates).  Exponents
  below −127, all-zero blocks included, give 2⁻¹²⁷ (E8M0 code 0); above 127, the NaN scale.
* **Inf and NaN**: a block holding a NaN or an infinity gets the NaN scale (E8M0 code 0xFF; NVFP4: the E4M3
  NaN code 0x7F) and element codes 0, and all its values are NaN (OCP MX v1.0 §5: a NaN scale makes the whole
  block NaN).  For infinities this follows the OCP authors' reference code (Microsoft's ``microxcaling``,
  whose shared exponent of an infinite amax exceeds E8M0's range and becomes NaN); torchao instead gives such
  a block a finite scale (see the tests).
* **Saturation**: elements are rounded to nearest-even and clamped to ±max (OCP MX v1.0 §6.3, "clamping normal
  numbers to max"; OCP OFP8's saturating conversion).  A value *saturated* when round-to-nearest-even with an
  unbounded exponent would have carried it beyond max (E4M3: |v / X| > 464), and only then.
* **Partial blocks**: when the axis length is not a multiple of ``block_size`` the last block is shorter and
  its scale comes from its own values (the same as padding it with zeros, which do not change amax).
* **Axes**: blocks run along any axis; element codes keep x's shape, scale codes have x's shape with that
  axis' length replaced by the number of blocks.
* **Per-tensor scale** (Transformer Engine): scale = fl32(fmt.max / amax) / 2^margin in float32; an amax that is
  zero, infinite or NaN gives scale 1 (delayed scaling: the previous scale); a scale that overflows float32
  becomes float32's largest value; ``power_of_two=True`` takes the scale's power-of-two floor.

Every function takes torch tensors (CPU or CUDA; float16, bfloat16, float32 or float64).
"""

from __future__ import annotations

import math
import numbers
import warnings
from dataclasses import dataclass

import torch

from . import formats as F
from .formats import E8M0, FP4_E2M1, FP6_E2M3, FP6_E3M2, FP8_E4M3, FP8_E5M2, FloatFormat, exact_arithmetic

__all__ = [
    "quantize_per_tensor", "scale_from_amax", "ScaledTensor", "DelayedScaling",
    "quantize_mx", "MXTensor", "quantize_nvfp4", "NVFP4Tensor",
    "quantization_error", "quantize", "fake_quantize",
    "MX_ELEMENT_FORMATS", "SCALE_ROUNDINGS", "RECIPES", "E8M0_NAN", "NVFP4_BLOCK_SIZE",
]

#: Element formats of the concrete MX formats (OCP MX v1.0 §5.1): MXFP8 (E4M3, E5M2), MXFP6 (E3M2, E2M3), MXFP4.
MX_ELEMENT_FORMATS = (FP8_E4M3, FP8_E5M2, FP6_E3M2, FP6_E2M3, FP4_E2M1)
#: Rules for the MX shared scale (``quantize_mx(..., scale_rounding=)``); "floor" is OCP MX v1.0 §6.3.
SCALE_ROUNDINGS = ("floor", "ceil", "even", "rceil")
#: The E8M0 code of NaN (OCP MX v1.0 §5.4.1); codes 0…254 are the scales 2^(code − 127).
E8M0_NAN = 0xFF
#: NVFP4's block length: 16 FP4 values share one E4M3 scale.
NVFP4_BLOCK_SIZE = 16
_E4M3_NAN = 0x7F
_NVFP4_SCALE_MIN = FP8_E4M3.smallest_normal      # 2⁻⁶: NVFP4 block scales are clamped to [2⁻⁶, 448]
_FP32_MAX = float(torch.finfo(torch.float32).max)
_FLOAT8 = {FP8_E4M3: torch.float8_e4m3fn, FP8_E5M2: torch.float8_e5m2}
_INPUT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
#: bit layout of the working types: (integer view, mantissa bits, exponent bias, all-ones exponent field)
_BITS = {torch.float32: (torch.int32, 23, 127, 0xFF), torch.float64: (torch.int64, 52, 1023, 0x7FF)}
_CHUNK = 1 << 18        # values per chunk on the CPU: a chunk's temporaries (1 MiB) stay in the cache


# ----------------------------------------------------------------------------------------------------------
# argument checks and small helpers
# ----------------------------------------------------------------------------------------------------------
def _check_tensor(x, argname: str = "x") -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{argname} must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in _INPUT_DTYPES:
        raise TypeError(f"{argname} must be a float16, bfloat16, float32 or float64 tensor, got dtype {x.dtype}")
    if x.device.type == "meta":
        raise ValueError(f"{argname} is a meta tensor (a shape and dtype without values); "
                         "pass a tensor on a real device (cpu, cuda, ...)")
    return x.detach()


def _check_int(v, argname: str, minimum: int | None = None) -> int:
    if not isinstance(v, numbers.Integral) or isinstance(v, bool):
        raise TypeError(f"{argname} must be an int, got {type(v).__name__}")
    if minimum is not None and v < minimum:
        raise ValueError(f"{argname} must be ≥ {minimum}, got {v}")
    return int(v)


def _check_bool(v, argname: str) -> bool:
    if not isinstance(v, bool):
        raise TypeError(f"{argname} must be a bool, got {type(v).__name__}")
    return v


def _check_axis(axis, ndim: int) -> int:
    axis = _check_int(axis, "axis")
    if ndim == 0:
        raise ValueError("x must have at least one dimension to be split into blocks, got a 0-d tensor")
    if not -ndim <= axis < ndim:
        raise ValueError(f"axis must lie in [{-ndim}, {ndim}) for a {ndim}-d tensor, got {axis}")
    return axis % ndim


def _check_choice(v, argname: str, choices: tuple) -> str:
    if not isinstance(v, str):
        raise TypeError(f"{argname} must be a str, one of {choices}; got {type(v).__name__}")
    if v not in choices:
        raise ValueError(f"{argname} must be one of {choices}, got {v!r}")
    return v


def _check_dtype(dtype) -> torch.dtype:
    if not isinstance(dtype, torch.dtype) or dtype not in _INPUT_DTYPES:
        raise TypeError(f"dtype must be torch.float16, bfloat16, float32 or float64, got {dtype!r}")
    return dtype


def _scalar_format(fmt, argname: str) -> FloatFormat:
    fmt = F.get_format(fmt, argname)
    if fmt.bits > 16 or not fmt.signed:
        raise ValueError(f"{argname} must be a signed format of at most 16 bits (FP8, FP6, FP4, FP16, BF16), "
                         f"got {fmt.name}")
    return fmt


def _work_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def _pow2(k: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """2^k for an integer tensor k in [−1022, 1023], built from float64 bits (exact), cast to ``dtype``."""
    return ((k.to(torch.int64) + 1023) << 52).view(torch.float64).to(dtype)


def _abs_max(t: torch.Tensor) -> torch.Tensor:
    """max |t| over all values (0-d, t's dtype; 0 for an empty t); NaN if t holds a NaN (torch's max and min
    propagate NaN)."""
    if t.numel() == 0:
        return torch.zeros((), dtype=t.dtype, device=t.device)
    return torch.maximum(t.max(), t.min().neg())


def _block_amax(xb: torch.Tensor, work: torch.dtype) -> torch.Tensor:
    """max |v| of each row of xb (blocks × block_size) in the working type (float32 or float64), NaN where a row
    holds a NaN.  As integers: the magnitudes' bit patterns order like their values and every NaN pattern lies
    above inf's (IEEE 754-2019 §3.4), so one integer maximum of the bits with the sign cleared does it.  Chunk by
    chunk into reused buffers, so that nothing large is allocated and the chunk stays in the cache."""
    ints = _BITS[work][0]
    out = torch.empty(xb.shape[0], dtype=work, device=xb.device)
    out_bits = out.view(ints)
    buf = None
    for a, b in _chunks(xb.shape[0], xb.shape[1], xb.device):
        w = xb[a:b] if xb.dtype == work else xb[a:b].to(work)
        if buf is None:
            buf = torch.empty(w.shape, dtype=ints, device=xb.device)
        mag = torch.bitwise_and(w.view(ints), (1 << (w.element_size() * 8 - 1)) - 1, out=buf[:b - a])
        torch.amax(mag, 1, out=out_bits[a:b])
    return out


def _scale_rows_and_encode(xb: torch.Tensor, r: torch.Tensor, nan: torch.Tensor, fmt: FloatFormat,
                           work: torch.dtype) -> torch.Tensor:
    """Codes (uint8, xb's shape) of fl(v · r) rounded to fmt with saturation, r one multiplier per row (work
    dtype); rows where ``nan`` is set get codes 0.  Chunk by chunk into a reused buffer (cache-resident)."""
    codes = torch.empty(xb.shape, dtype=torch.uint8, device=xb.device)
    any_nan = bool(nan.any())
    buf = None
    for a, b in _chunks(xb.shape[0], xb.shape[1], xb.device):
        if buf is None:
            buf = torch.empty((b - a, xb.shape[1]), dtype=work, device=xb.device)
        y = torch.mul(xb[a:b], r[a:b, None], out=buf[:b - a])
        if any_nan:
            y.masked_fill_(nan[a:b, None], 0.0)
        _encode_into(codes[a:b], y, fmt)
    return codes


def _beyond_range(y: torch.Tensor, fmt: FloatFormat) -> torch.Tensor:
    """Where round-to-nearest-even with an unbounded exponent takes y above fmt.max: the values a saturating
    conversion clamps to ±max and a non-saturating one overflows.  The threshold is the midpoint between max
    and the next value the format lacks; a tie there goes up when max's significand is odd (all but E4M3).
    """
    half_ulp = 2.0 ** (fmt.emax - fmt.mantissa_bits - 1)
    threshold = fmt.max + half_ulp
    a = y.abs()
    ties_up = int(fmt.max / (2 * half_ulp)) % 2 == 1
    return (a >= threshold) if ties_up else (a > threshold)


def _per_block(t: torch.Tensor, axis: int, block_size: int, n: int) -> torch.Tensor:
    """One value per block (along ``axis``) repeated to every position of its block: x's shape."""
    return t.repeat_interleave(block_size, dim=axis).narrow(axis, 0, n)


# ----------------------------------------------------------------------------------------------------------
# element rounding: formats.encode, or torch's float8 conversion once it has been checked against encode
# ----------------------------------------------------------------------------------------------------------
_NATIVE: dict = {}


def _native_cast(fmt: FloatFormat, device: torch.device) -> str | None:
    """How torch's float32 → float8 conversion compares with ``encode(·, fmt, saturate=True)`` on ``device``:
    "saturating" (equal on everything probed), "in_range" (equal for |v| ≤ max only) or None (differs).

    Probe: every finite value of fmt, every midpoint between neighbours, the float32 values just above and below
    all of those; beyond the range, 4097 values from max to 2^(emax+2) (what a block divided by its scale can
    give) and float32's largest value, with their upper neighbours; both signs.
    """
    key = (fmt.name, str(device))
    if key not in _NATIVE:
        v = torch.tensor(F.values(fmt), dtype=torch.float64)
        pts = torch.cat([v, (v[1:] + v[:-1]) / 2]).to(torch.float32)
        up, down = torch.tensor(math.inf), torch.tensor(-math.inf)
        pts = torch.cat([pts, torch.nextafter(pts, up), torch.nextafter(pts, down)])
        inside = pts.clamp(-fmt.max, fmt.max)
        beyond = torch.cat([torch.linspace(fmt.max, 2.0 ** (fmt.emax + 2), 4097), torch.tensor([_FP32_MAX])])
        beyond = torch.cat([beyond, torch.nextafter(beyond, up)])
        result = None
        for name, probe in (("in_range", inside), ("saturating", torch.cat([inside, beyond]))):
            probe = torch.cat([probe, -probe]).to(device)
            if not torch.equal(probe.to(_FLOAT8[fmt]).view(torch.uint8), F.encode(probe, fmt, saturate=True)):
                break
            result = name
        if result is None:
            warnings.warn(f"torch's float32 → {_FLOAT8[fmt]} conversion on {device} differs from "
                          "mpt_lab.formats.encode; using encode (slower)", RuntimeWarning, stacklevel=3)
        _NATIVE[key] = result
    return _NATIVE[key]


def _encode_into(out: torch.Tensor, y: torch.Tensor, fmt: FloatFormat) -> None:
    """Write the codes of the finite values y (float32 or float64), rounded to nearest-even in fmt with
    saturation, into the uint8 tensor ``out``; y may be clamped in place."""
    native = _native_cast(fmt, y.device) if fmt in _FLOAT8 and y.dtype == torch.float32 else None
    if native is None:
        out.copy_(F.encode(y, fmt, saturate=True))
        return
    if native == "in_range":
        y.clamp_(-fmt.max, fmt.max)
    out.view(_FLOAT8[fmt]).copy_(y)


# ----------------------------------------------------------------------------------------------------------
# blocks along an axis
# ----------------------------------------------------------------------------------------------------------
def _to_blocks(x: torch.Tensor, block_size: int, axis: int) -> tuple[torch.Tensor, tuple]:
    """x with ``axis`` moved last and zero-padded to whole blocks, as (number of blocks, block_size)."""
    xm = x.movedim(axis, -1)
    n = xm.shape[-1]
    pad = -n % block_size
    if pad:
        xm = torch.nn.functional.pad(xm, (0, pad))
    lead, padded = tuple(xm.shape[:-1]), xm.shape[-1]
    return xm.reshape(-1, block_size), (lead, padded // block_size, padded, n)


def _from_blocks(t: torch.Tensor, layout: tuple, axis: int, per_block: bool) -> torch.Tensor:
    """Undo :func:`_to_blocks` for block data (shape (B, block_size)) or for one value per block (shape (B,),
    ``per_block=True``); returns a contiguous tensor laid out like x."""
    lead, nblocks, padded, n = layout
    if per_block:
        return t.reshape(*lead, nblocks).movedim(-1, axis).contiguous()
    return t.reshape(*lead, padded)[..., :n].movedim(-1, axis).contiguous()


def _chunks(nrows: int, block_size: int, device: torch.device):
    """Row ranges of about _CHUNK values each on the CPU; one range elsewhere (big kernels are cheaper there)."""
    step = max(1, _CHUNK // block_size) if device.type == "cpu" else max(nrows, 1)
    for start in range(0, nrows, step):
        yield start, min(nrows, start + step)


# ----------------------------------------------------------------------------------------------------------
# per-tensor scaling (Transformer Engine)
# ----------------------------------------------------------------------------------------------------------
def _as_float32(v, argname: str, device) -> torch.Tensor:
    if isinstance(v, torch.Tensor):
        if not v.is_floating_point():
            raise TypeError(f"{argname} must be a float or a floating tensor, got dtype {v.dtype}")
        return v.detach().to(device=device if device is not None else v.device, dtype=torch.float32)
    if isinstance(v, numbers.Real) and not isinstance(v, bool):
        return torch.tensor(float(v), dtype=torch.float32, device=device)
    raise TypeError(f"{argname} must be a float or a floating tensor, got {type(v).__name__}")


def _check_margin(margin) -> int:
    margin = _check_int(margin, "margin")
    if not -126 <= margin <= 126:
        raise ValueError(f"margin must lie in [-126, 126] (2^margin must be a normal float32), got {margin}")
    return margin


@exact_arithmetic
def scale_from_amax(amax, fmt, *, margin: int = 0, power_of_two: bool = False, previous=None) -> torch.Tensor:
    """The per-tensor scale Transformer Engine computes from an amax: scale = (fmt.max / amax) / 2^margin.

    In float32, as Transformer Engine: fl32(fmt.max / amax) (one correctly rounded division), divided by
    2^margin (exact); a scale that overflows float32 becomes float32's largest value (TE's
    ``compute_scale_from_amax``); ``power_of_two=True`` replaces it by its power-of-two floor 2^⌊log2 scale⌋
    (TE's ``power_2_scale``); where amax is zero, infinite or NaN the scale is ``previous`` (TE's delayed
    scaling keeps the previous scale) or 1 (``previous=None``, as TE's current scaling).  Source: Transformer
    Engine documentation, "Using FP8 with Transformer Engine", delayed scaling: the scaling factor is
    FP8_MAX / amax / 2^margin, amax taken from the history by "max" or "most_recent".

    Parameters
    ----------
    amax : float or floating tensor (any shape)
    fmt : FloatFormat or str (FP8_E4M3: max 448; FP8_E5M2: 57344; ...)
    margin : int in [−126, 126]
        Headroom in powers of two.
    power_of_two : bool
    previous : None, float or floating tensor broadcastable to amax

    Returns
    -------
    float32 tensor of amax's shape (0-d for a float), on amax's device.

    Raises
    ------
    TypeError, ValueError
        Bad amax, fmt, margin, power_of_two or previous.
    """
    fmt = _scalar_format(fmt, "fmt")
    margin = _check_margin(margin)
    _check_bool(power_of_two, "power_of_two")
    a = _as_float32(amax, "amax", None)
    sf = torch.tensor(fmt.max, dtype=torch.float32, device=a.device) / a
    sf = sf / 2.0 ** margin if margin >= 0 else sf * 2.0 ** -margin
    sf = torch.where(torch.isinf(sf), torch.full_like(sf, _FP32_MAX), sf)
    if power_of_two:
        _, e = torch.frexp(sf)                                  # sf = m·2^e, m ∈ [0.5, 1)
        sf = torch.where(sf > 0, _pow2(e - 1, torch.float32), sf)
    prev = torch.ones_like(sf) if previous is None else _as_float32(previous, "previous", a.device).expand_as(sf)
    return torch.where(torch.isfinite(a) & (a > 0), sf, prev)


class _Quantized:
    """What every quantised tensor offers: ``shape`` and ``device`` (those of its values' codes)."""

    def _codes(self) -> torch.Tensor:  # pragma: no cover - every subclass defines it
        raise NotImplementedError

    @property
    def shape(self) -> torch.Size:
        return self._codes().shape

    @property
    def device(self) -> torch.device:
        return self._codes().device


@dataclass(frozen=True, eq=False)
class ScaledTensor(_Quantized):
    """A tensor quantised with one scale (per-tensor scaling): x ≈ q / scale.

    Attributes
    ----------
    q : float32 tensor of x's shape holding values of ``fmt`` (x·scale rounded to fmt)
    scale : 0-d float32 tensor (the encode scale, Transformer Engine's ``scale``; its ``scale_inv`` is 1/scale)
    fmt : FloatFormat
    dtype : torch.dtype of the quantised tensor (what :meth:`dequantize` returns by default)
    """

    q: torch.Tensor
    scale: torch.Tensor
    fmt: FloatFormat
    dtype: torch.dtype

    def _codes(self) -> torch.Tensor:
        return self.q

    @exact_arithmetic
    def dequantize(self, dtype: torch.dtype | None = None) -> torch.Tensor:
        """q / scale, correctly rounded to ``dtype`` (default: the quantised tensor's dtype): the quotient is
        formed in float64 and rounded once more, which is innocuous for a division (53 ≥ 2·24 + 2 bits)."""
        dtype = self.dtype if dtype is None else _check_dtype(dtype)
        return (self.q.to(torch.float64) / self.scale.to(torch.float64)).to(dtype)

    def codes(self) -> torch.Tensor:
        """The codes of q in ``fmt`` (uint8 for formats of at most 8 bits; see :func:`mpt_lab.formats.encode`)."""
        return F.encode(self.q, self.fmt)

    @exact_arithmetic
    def saturated(self, x) -> torch.Tensor:
        """Where x·scale was beyond fmt's range (bool, x's shape): clamped to ±max, or overflowed."""
        x = _check_tensor(x)
        return _beyond_range(x.to(torch.float64) * self.scale.to(x.device, torch.float64), self.fmt)


def _round_scaled(x: torch.Tensor, scale: torch.Tensor, fmt: FloatFormat, saturate: bool) -> torch.Tensor:
    """x·scale rounded to fmt, as float32.  The product is formed in float32 (float64 for float64 x) as TE's
    kernels do; rounding it to fmt afterwards gives the exact product rounded once (24 ≥ 2p + 2 bits)."""
    w = x.to(_work_dtype(x.dtype))
    return F.round_to(w * scale.to(w.dtype), fmt, saturate=saturate).to(torch.float32)


@exact_arithmetic
def quantize_per_tensor(x, fmt, *, amax=None, margin: int = 0, power_of_two: bool = False,
                        saturate: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-tensor scaling as Transformer Engine: q = x·scale rounded to ``fmt``, x ≈ q / scale.

    scale = (fmt.max / amax) / 2^margin (:func:`scale_from_amax`), with amax = max |x| (current scaling, TE's
    ``Float8CurrentScaling``) unless ``amax`` is given (delayed scaling passes the amax of its history).  The
    values are rounded to nearest-even; beyond ±fmt.max they saturate to ±fmt.max (TE's casts, OCP OFP8's
    saturating conversion) or, with ``saturate=False``, overflow as the format does (E5M2: ±inf, E4M3: NaN).

    Parameters
    ----------
    x : floating tensor, any shape, CPU or CUDA
    fmt : FloatFormat or str
        ``"FP8_E4M3"`` (forward tensors) or ``"FP8_E5M2"`` (gradients); any signed format of at most 16 bits.
    amax : None, float or 0-d floating tensor
    margin : int
    power_of_two : bool
        Use the power-of-two floor of the scale (then q / scale is exact).
    saturate : bool

    Returns
    -------
    (q, scale)
        q: float32 tensor of x's shape on x's device holding values of fmt; scale: 0-d float32 tensor.
        ``ScaledTensor(q, scale, fmt, x.dtype).dequantize()`` gives q / scale in x's dtype.

    Raises
    ------
    TypeError
        x is not a floating tensor; wrong types of the other arguments.
    ValueError
        Unknown fmt, or one wider than 16 bits; amax not a single value; x holds NaN and fmt has no NaN
        (FP6, FP4); a meta tensor.
    """
    x = _check_tensor(x)
    fmt = _scalar_format(fmt, "fmt")
    _check_bool(saturate, "saturate")
    a = _abs_max(x).to(torch.float32) if amax is None else _as_float32(amax, "amax", x.device)
    if a.dim() != 0:
        raise ValueError(f"amax must be a single value (0-d), got shape {tuple(a.shape)}")
    scale = scale_from_amax(a, fmt, margin=margin, power_of_two=power_of_two)
    return _round_scaled(x, scale, fmt, saturate), scale


# ----------------------------------------------------------------------------------------------------------
# delayed scaling (Transformer Engine's DelayedScaling recipe)
# ----------------------------------------------------------------------------------------------------------
class _History:
    """The state of one tensor in :class:`DelayedScaling`."""

    def __init__(self, fmt: FloatFormat, length: int, device):
        self.fmt = fmt
        self.amax = torch.zeros(length, dtype=torch.float32, device=device)   # entry 0: the current step
        self.scale = torch.ones((), dtype=torch.float32, device=device)
        self.exceeded = torch.zeros((), dtype=torch.int64, device=device)     # in the current step
        self.total_exceeded = 0
        self.used = False


class DelayedScaling:
    """Transformer Engine's delayed scaling: each tensor is cast with a scale computed from the amax history of
    earlier steps, and the histories advance once per step.

    Per named tensor there is an amax history of ``history_len`` entries (zeros at first) and a scale (1 at
    first).  :meth:`quantize` casts with the current, stale, scale exactly as :func:`quantize_per_tensor` with
    that scale, records max |x| in the history's current entry (the maximum, if called more than once in a
    step), and counts the values beyond the stale scale's range: they saturate to ±max (``saturate=True``, as
    TE's casts) or overflow to inf/NaN.  :meth:`update` ends the step, as TE does after each iteration: amax =
    the maximum of the history (``amax_compute_algo="max"``) or its current entry (``"most_recent"``); the
    next scale = (fmt.max / amax) / 2^margin (:func:`scale_from_amax`; where amax is zero or not finite the
    scale stays); then the history rolls by one entry (``torch.roll(h, -1)``) and its new current entry is
    zeroed.  Source: Transformer Engine documentation, ``transformer_engine.common.recipe.DelayedScaling``
    (``margin``, ``amax_history_len``, ``amax_compute_algo``; ``Format.HYBRID``: E4M3 forward, E5M2 backward).

    Parameters
    ----------
    history_len : int ≥ 1
    margin : int
    forward, backward : FloatFormat or str
        Formats of forward tensors (inputs, weights) and of backward tensors (output gradients).
    amax_compute_algo : {"max", "most_recent"}
    saturate, power_of_two : bool
        As :func:`quantize_per_tensor`.

    Attributes
    ----------
    step : int
        Completed :meth:`update` calls.
    log : list of dict
        One entry per tensor used in a step, written by :meth:`update`: ``step``, ``name``, ``format``,
        ``amax`` (of that step), ``scale`` (used in that step), ``exceeded`` (values beyond its range),
        ``next_scale``.

    Raises
    ------
    TypeError, ValueError
        Bad arguments, each named.
    """

    def __init__(self, history_len: int = 16, margin: int = 0, forward="FP8_E4M3", backward="FP8_E5M2", *,
                 amax_compute_algo: str = "max", saturate: bool = True, power_of_two: bool = False):
        self.history_len = _check_int(history_len, "history_len", 1)
        self.margin = _check_margin(margin)
        self.forward = _scalar_format(forward, "forward")
        self.backward = _scalar_format(backward, "backward")
        self.amax_compute_algo = _check_choice(amax_compute_algo, "amax_compute_algo", ("max", "most_recent"))
        self.saturate = _check_bool(saturate, "saturate")
        self.power_of_two = _check_bool(power_of_two, "power_of_two")
        self.step = 0
        self.log: list[dict] = []
        self._state: dict[str, _History] = {}

    def __repr__(self) -> str:
        return (f"DelayedScaling(history_len={self.history_len}, margin={self.margin}, "
                f"forward={self.forward.name!r}, backward={self.backward.name!r}, "
                f"amax_compute_algo={self.amax_compute_algo!r}, step={self.step}, tensors={self.names})")

    def _get(self, name: str, backward: bool, device) -> _History:
        if not isinstance(name, str):
            raise TypeError(f"name must be a str, got {type(name).__name__}")
        fmt = self.backward if backward else self.forward
        st = self._state.get(name)
        if st is None:
            st = self._state[name] = _History(fmt, self.history_len, device)
        elif st.fmt != fmt:
            raise ValueError(f"name {name!r} holds a {st.fmt.name} tensor; use another name for a {fmt.name} "
                             f"({'backward' if backward else 'forward'}) tensor")
        return st

    @exact_arithmetic
    def quantize(self, x, name: str, *, backward: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """Cast x with the stale scale of tensor ``name``; returns (q, scale) as :func:`quantize_per_tensor`.

        Raises TypeError/ValueError for a bad x or name, or a name reused for the other direction.
        """
        x = _check_tensor(x)
        _check_bool(backward, "backward")
        st = self._get(name, backward, x.device)
        scale = st.scale.to(x.device)
        st.amax[0] = torch.maximum(st.amax[0], _abs_max(x).to(st.amax.device, torch.float32))
        beyond = _beyond_range(x.to(torch.float64) * scale.to(torch.float64), st.fmt)
        st.exceeded = st.exceeded + beyond.sum().to(st.exceeded.device)
        st.used = True
        return _round_scaled(x, scale, st.fmt, self.saturate), scale.clone()

    @exact_arithmetic
    def update(self) -> None:
        """End a step: the next scales from the histories, then roll the histories (see the class docstring)."""
        for name, st in self._state.items():
            amax = st.amax.max() if self.amax_compute_algo == "max" else st.amax[0]
            new = scale_from_amax(amax, st.fmt, margin=self.margin, power_of_two=self.power_of_two,
                                  previous=st.scale)
            exceeded = int(st.exceeded)
            if st.used:
                self.log.append({"step": self.step, "name": name, "format": st.fmt.name,
                                 "amax": float(st.amax[0]), "scale": float(st.scale), "exceeded": exceeded,
                                 "next_scale": float(new)})
            st.total_exceeded += exceeded
            st.scale = new
            st.amax = torch.roll(st.amax, -1, 0)
            st.amax[0] = 0.0
            st.exceeded = torch.zeros_like(st.exceeded)
            st.used = False
        self.step += 1

    @property
    def names(self) -> list[str]:
        """The tensors seen so far."""
        return list(self._state)

    def scale(self, name: str) -> float:
        """The scale the next :meth:`quantize` of ``name`` uses (KeyError for an unknown name)."""
        return float(self._state[name].scale)

    def amax_history(self, name: str) -> torch.Tensor:
        """A copy of the amax history of ``name``: entry 0 is the current step, entries 1, 2, … the previous
        steps from the oldest to the newest (TE's layout)."""
        return self._state[name].amax.clone()

    def exceeded(self, name: str) -> int:
        """Values of ``name`` beyond the range of their stale scale, over the completed steps."""
        return self._state[name].total_exceeded

    def state_dict(self) -> dict:
        """The step, and per tensor its format, amax history (CPU tensor), scale and exceeded count."""
        return {"step": self.step,
                "tensors": {n: {"format": s.fmt.name, "amax_history": s.amax.cpu().clone(),
                                "scale": float(s.scale), "exceeded": s.total_exceeded}
                            for n, s in self._state.items()}}

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict`'s output (on the CPU; tensors move to x's device when quantised)."""
        if not isinstance(state, dict) or "tensors" not in state or "step" not in state:
            raise TypeError("state must be a dict from DelayedScaling.state_dict()")
        tensors = {}
        for n, s in state["tensors"].items():
            hist = torch.as_tensor(s["amax_history"], dtype=torch.float32)
            if tuple(hist.shape) != (self.history_len,):
                raise ValueError(f"the amax history of {n!r} has {hist.numel()} entries; this recipe keeps "
                                 f"{self.history_len}")
            st = tensors[n] = _History(F.get_format(s["format"]), self.history_len, None)
            st.amax, st.scale, st.total_exceeded = hist.clone(), torch.tensor(float(s["scale"])), int(s["exceeded"])
        self.step, self._state = int(state["step"]), tensors


# ----------------------------------------------------------------------------------------------------------
# block-scaled tensors
# ----------------------------------------------------------------------------------------------------------
@dataclass(frozen=True, eq=False)
class _BlockScaled(_Quantized):
    """Element codes with per-block scale codes along ``axis``: what MX and NVFP4 tensors share."""

    element_codes: torch.Tensor
    scale_codes: torch.Tensor
    fmt: FloatFormat
    block_size: int
    axis: int
    dtype: torch.dtype

    def _codes(self) -> torch.Tensor:
        return self.element_codes

    @property
    def bits_per_value(self) -> float:
        """Storage per value in bits: the element's bits plus an 8-bit block scale shared by block_size values."""
        return self.fmt.bits + 8 / self.block_size

    def elements(self) -> torch.Tensor:
        """The element values (float64, x's shape), decoded from their codes."""
        return F.decode(self.element_codes, self.fmt)

    def scales(self) -> torch.Tensor:  # pragma: no cover - every subclass defines it
        raise NotImplementedError

    def _per_value(self, per_block: torch.Tensor) -> torch.Tensor:
        return _per_block(per_block, self.axis, self.block_size, self.shape[self.axis])

    def _work(self, dtype: torch.dtype) -> torch.dtype:
        """Where element × scale is exact: float64 in general."""
        return torch.float64

    @exact_arithmetic
    def dequantize(self, dtype: torch.dtype | None = None) -> torch.Tensor:
        """element × scale in ``dtype`` (default: the quantised tensor's dtype), x's shape.

        The product is formed exactly (in float64, or in float32 where that is exact) and rounded once to
        ``dtype``.  Blocks with a NaN scale are NaN.  Raises TypeError for a dtype other than float16,
        bfloat16, float32 or float64.
        """
        dtype = self.dtype if dtype is None else _check_dtype(dtype)
        work = self._work(dtype)
        return (self._element_values(work) * self._per_value(self.scales().to(work))).to(dtype)

    def _element_values(self, work: torch.dtype) -> torch.Tensor:
        return self.elements().to(work)

    @exact_arithmetic
    def saturated(self, x) -> torch.Tensor:
        """Where the values of x (the tensor this was quantised from) were beyond the element format's range
        once divided by their block's scale, and were clamped to ±max (bool, x's shape)."""
        x = _check_tensor(x)
        if x.shape != self.shape:
            raise ValueError(f"x must have shape {tuple(self.shape)}, got {tuple(x.shape)}")
        return _beyond_range(self._scaled(x.to(self.device)), self.fmt)

    def _scaled(self, x: torch.Tensor) -> torch.Tensor:
        """The values that were rounded to the element format (before saturation), float64."""
        return x.to(torch.float64) / self._per_value(self.scales())


@dataclass(frozen=True, eq=False)
class MXTensor(_BlockScaled):
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
        return _work_dtype(dtype)        # element × 2^k is exact in float32 too (overflow aside: inf)

    def _element_values(self, work: torch.dtype) -> torch.Tensor:
        if self.fmt in _FLOAT8:
            return self.element_codes.view(_FLOAT8[self.fmt]).to(work)
        return self.elements().to(work)

    def __repr__(self) -> str:
        return (f"MXTensor(MX{self.fmt.name}, shape={tuple(self.shape)}, block_size={self.block_size}, "
                f"axis={self.axis}, scale_rounding={self.scale_rounding!r}, dtype={self.dtype})")


@dataclass(frozen=True, eq=False)
class NVFP4Tensor(_BlockScaled):
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
        return (f"NVFP4Tensor(shape={tuple(self.shape)}, block_size={self.block_size}, axis={self.axis}, "
                f"tensor_scale={float(self.tensor_scale)!r}, dtype={self.dtype})")


# ----------------------------------------------------------------------------------------------------------
# OCP MX
# ----------------------------------------------------------------------------------------------------------
def _scale_codes_mx(amax: torch.Tensor, fmt: FloatFormat, rule: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(c, nan): each block's E8M0 code c ∈ [0, 254] (X = 2^(c − 127)) and where X is NaN instead.

    From the bits of amax (float32 or float64: exponent field E, mantissa field M; t mantissa bits, bias b):
    for a normal amax ⌊log2 amax⌋ = E − b, so floor's code is E − b − emax + 127 (OCP MX v1.0 §6.3).  A
    subnormal or zero amax (E = 0) gives a code ≤ 0 for every element format, i.e. 0, as its exact logarithm
    would; an infinite or NaN amax gives NaN, and so does a code above 254 (only float64 amax can need one).
    """
    ints, t, b, top = _BITS[amax.dtype]
    bits = amax.view(ints)                       # |amax| (_block_amax clears the sign bit, also of −0 and NaN)
    e = bits >> t
    nan = e == top
    c = e.sub_(b + fmt.emax - 127).to(torch.int32)             # floor
    if rule != "floor":
        mant = bits & ((1 << t) - 1)
        if rule == "ceil":                                      # ⌈log2 amax⌉: up unless amax is a power of two
            c += mant != 0
        elif rule == "even":                                    # 1.M rounded to fmt's precision reaches 2
            c += mant >= (1 << t) - (1 << (t - fmt.mantissa_bits - 1))
        else:                                                   # rceil: amax / 2^k > max  ⟺  1.M > max / 2^emax
            c += mant > int((fmt.max / 2.0 ** fmt.emax - 1) * (1 << t))
    if amax.dtype == torch.float64:                             # float32: E ≤ 254 gives c ≤ 253 anyway
        nan |= c > 254
    return c.clamp_(0, 254), nan


def _pow2_neg_scale(c: torch.Tensor, work: torch.dtype) -> torch.Tensor:
    """1 / X = 2^(127 − c) for E8M0 codes c, exactly, in the working type.  float32: the biased exponent field
    254 − c ≥ 1, since a finite float32 amax has c ≤ 253 (c = 254 only in NaN blocks, whose values are
    dropped)."""
    if work == torch.float64:
        return _pow2(127 - c, torch.float64)
    return ((254 - c) << 23).view(torch.float32)


@exact_arithmetic
def quantize_mx(x, fmt, block_size: int = 32, axis: int = -1, *, scale_rounding: str = "floor") -> MXTensor:
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
        Element format: FP8_E4M3, FP8_E5M2 (MXFP8), FP6_E3M2, FP6_E2M3 (MXFP6) or FP4_E2M1 (MXFP4).
    block_size : int ≥ 1
        32 in every concrete MX format (§5.1).
    axis : int
        The axis the blocks run along (for a matrix product: the reduction axis).
    scale_rounding : {"floor", "ceil", "even", "rceil"}

    Returns
    -------
    MXTensor
        ``element_codes`` (uint8, x's shape), ``scale_codes`` (uint8 E8M0), ``.dequantize()``.

    Raises
    ------
    TypeError
        x is not such a tensor; block_size or axis not an int; scale_rounding not a str.
    ValueError
        fmt is not an MX element format; block_size < 1; axis out of range; unknown scale_rounding; meta tensor.
    """
    x = _check_tensor(x)
    fmt = F.get_format(fmt)
    if fmt not in MX_ELEMENT_FORMATS:
        raise ValueError(f"fmt must be an MX element format {[f.name for f in MX_ELEMENT_FORMATS]}, "
                         f"got {fmt.name}")
    block_size = _check_int(block_size, "block_size", 1)
    axis = _check_axis(axis, x.dim())
    rule = _check_choice(scale_rounding, "scale_rounding", SCALE_ROUNDINGS)
    xb, layout = _to_blocks(x, block_size, axis)
    work = _work_dtype(x.dtype)
    c, nan = _scale_codes_mx(_block_amax(xb, work), fmt, rule)
    codes = _scale_rows_and_encode(xb, _pow2_neg_scale(c, work), nan, fmt, work)   # v / X: exact
    scale_codes = c.masked_fill_(nan, E8M0_NAN).to(torch.uint8)
    return MXTensor(_from_blocks(codes, layout, axis, False), _from_blocks(scale_codes, layout, axis, True),
                    fmt, block_size, axis, x.dtype, rule)


# ----------------------------------------------------------------------------------------------------------
# NVFP4
# ----------------------------------------------------------------------------------------------------------
def _nvfp4_tensor_scale(x: torch.Tensor, tensor_scale) -> torch.Tensor:
    """The FP32 tensor (decode) scale: ``tensor_scale``, or fl32(amax / (448·6)) from the finite values of x."""
    if tensor_scale is not None:
        s = _as_float32(tensor_scale, "tensor_scale", x.device)
        if s.dim() != 0:
            raise ValueError(f"tensor_scale must be a single value (0-d), got shape {tuple(s.shape)}")
        if not bool(torch.isfinite(s) & (s > 0) & torch.isfinite(1.0 / s)):
            raise ValueError(f"tensor_scale must be positive with a finite float32 reciprocal, got {float(s)}")
        return s
    amax = _abs_max(x).to(torch.float32)
    if not bool(torch.isfinite(amax)):
        amax = _abs_max(torch.where(torch.isfinite(x), x, torch.zeros_like(x))).to(torch.float32)
    s = amax / (FP8_E4M3.max * FP4_E2M1.max)
    return torch.where(torch.isfinite(s) & (s > 0) & torch.isfinite(1.0 / s), s, torch.ones_like(s))


@exact_arithmetic
def quantize_nvfp4(x, *, tensor_scale=None, axis: int = -1) -> NVFP4Tensor:
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

    Parameters
    ----------
    x : float16, bfloat16, float32 or float64 tensor, at least 1-d
    tensor_scale : None, float or 0-d floating tensor
    axis : int

    Returns
    -------
    NVFP4Tensor

    Raises
    ------
    TypeError
        x is not such a tensor; axis not an int; tensor_scale of a wrong type.
    ValueError
        axis out of range; tensor_scale not a positive single value with a finite reciprocal; meta tensor.
    """
    x = _check_tensor(x)
    axis = _check_axis(axis, x.dim())
    st = _nvfp4_tensor_scale(x, tensor_scale)
    xb, layout = _to_blocks(x, NVFP4_BLOCK_SIZE, axis)
    amax = _block_amax(xb, torch.float32)
    nan = ~torch.isfinite(amax)
    s = (amax / FP4_E2M1.max / st).clamp_(_NVFP4_SCALE_MIN, FP8_E4M3.max).masked_fill_(nan, 1.0)
    sc = torch.empty(s.shape, dtype=torch.uint8, device=x.device)
    _encode_into(sc, s, FP8_E4M3)
    r = (1.0 / st) / F.decode(sc, FP8_E4M3).to(torch.float32)                     # fl32(fl32(1 / s_t) / s_b)
    codes = _scale_rows_and_encode(xb, r, nan, FP4_E2M1, torch.float32)
    scale_codes = torch.where(nan, _E4M3_NAN, sc)
    return NVFP4Tensor(_from_blocks(codes, layout, axis, False), _from_blocks(scale_codes, layout, axis, True),
                       FP4_E2M1, NVFP4_BLOCK_SIZE, axis, x.dtype, st)


# ----------------------------------------------------------------------------------------------------------
# errors
# ----------------------------------------------------------------------------------------------------------
@exact_arithmetic
def quantization_error(x, xq, *, saturated=None) -> dict:
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
    x = _check_tensor(x)
    if isinstance(xq, _Quantized):
        if saturated is None:
            saturated = xq.saturated(x)
        xq = xq.dequantize(torch.float64)
    xq = _check_tensor(xq, "xq")
    if xq.shape != x.shape:
        raise ValueError(f"xq must have x's shape {tuple(x.shape)}, got {tuple(xq.shape)}")
    if saturated is not None and (not isinstance(saturated, torch.Tensor) or saturated.dtype != torch.bool
                                  or saturated.shape != x.shape):
        raise TypeError(f"saturated must be None or a bool tensor of shape {tuple(x.shape)}")
    x64, q64 = x.to(torch.float64), xq.to(device=x.device, dtype=torch.float64)
    n = x64.numel()
    finite_in = torch.isfinite(x64)
    both = finite_in & torch.isfinite(q64)
    err = torch.where(both, q64 - x64, torch.zeros_like(x64))
    sig = torch.where(both, x64, torch.zeros_like(x64))
    pairs = int(both.sum())
    se, ss = float((err * err).sum()), float((sig * sig).sum())
    if se > 0:
        snr = 10.0 * math.log10(ss / se) if ss > 0 else -math.inf
    else:
        snr = math.inf if ss > 0 else math.nan

    def share(mask):
        return float(mask.sum()) / n if n else math.nan

    mse = se / pairs if pairs else math.nan
    return {"n": n, "mse": mse, "rmse": math.sqrt(mse), "snr_db": snr,
            "max_abs_error": float(err.abs().max()) if pairs else math.nan,
            "underflow": share(both & (x64 != 0) & (q64 == 0)),
            "saturated": None if saturated is None else share(saturated.to(x.device) & finite_in),
            "nonfinite_in": share(~finite_in), "nonfinite_out": share(finite_in & ~torch.isfinite(q64))}


# ----------------------------------------------------------------------------------------------------------
# recipes by name
# ----------------------------------------------------------------------------------------------------------
#: Recipe names for :func:`quantize` / :func:`fake_quantize`: per-tensor current scaling ("fp8_e4m3",
#: "fp8_e5m2"), MX with 32-value blocks and OCP's floor scale ("mxfp8_e4m3", "mxfp8_e5m2", "mxfp6_e3m2",
#: "mxfp6_e2m3", "mxfp4"), and "nvfp4".
RECIPES = ("fp8_e4m3", "fp8_e5m2", "mxfp8_e4m3", "mxfp8_e5m2", "mxfp6_e3m2", "mxfp6_e2m3", "mxfp4", "nvfp4")
_MX_RECIPES = {"mxfp8_e4m3": FP8_E4M3, "mxfp8_e5m2": FP8_E5M2, "mxfp6_e3m2": FP6_E3M2, "mxfp6_e2m3": FP6_E2M3,
               "mxfp4": FP4_E2M1}


@exact_arithmetic
def quantize(x, recipe: str, *, axis: int = -1):
    """Quantise x with a recipe of :data:`RECIPES`; ``axis`` is the block axis (unused per tensor).

    Returns a :class:`ScaledTensor`, :class:`MXTensor` or :class:`NVFP4Tensor`: each has ``dequantize()`` and
    ``saturated(x)``, and :func:`quantization_error` takes it.  Raises TypeError/ValueError for a bad x, an
    unknown recipe or a bad axis.
    """
    x = _check_tensor(x)
    recipe = _check_choice(recipe, "recipe", RECIPES)
    if recipe in _MX_RECIPES:
        return quantize_mx(x, _MX_RECIPES[recipe], 32, axis)
    if recipe == "nvfp4":
        return quantize_nvfp4(x, axis=axis)
    _check_axis(axis, max(x.dim(), 1))
    fmt = FP8_E4M3 if recipe == "fp8_e4m3" else FP8_E5M2
    q, scale = quantize_per_tensor(x, fmt)
    return ScaledTensor(q, scale, fmt, x.dtype)


def fake_quantize(x, recipe: str, *, axis: int = -1) -> torch.Tensor:
    """x quantised with ``recipe`` and dequantised: x's shape, dtype and device, no autograd history.

    ``quantize(x, recipe, axis=axis).dequantize()``, for a ``torch.autograd.Function`` (module docstring).
    Raises as :func:`quantize`.
    """
    return quantize(x, recipe, axis=axis).dequantize()
