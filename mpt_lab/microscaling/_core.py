"""What every quantiser of :mod:`mpt_lab.microscaling` shares: argument checks, exact powers of two, blocks
along an axis, element rounding, and the base classes of the quantised tensors.

Internal to the package (the module name starts with "_"): the per-tensor, MX and NVFP4 modules, their exact
quantisers and their fast twins, and the analysis functions import these names, and nothing outside
:mod:`mpt_lab.microscaling` does.  Every helper works on torch tensors on any device.
"""

from __future__ import annotations

import math
import numbers
import warnings
from dataclasses import dataclass

import torch

from .. import formats as F
from ..formats import FP8_E4M3, FP8_E5M2, FloatFormat, exact_arithmetic

#: float32's largest finite value.
FP32_MAX = float(torch.finfo(torch.float32).max)
#: torch's float8 dtypes of the FP8 formats (their float32 → float8 conversion is checked by :func:`native_cast`).
FLOAT8 = {FP8_E4M3: torch.float8_e4m3fn, FP8_E5M2: torch.float8_e5m2}
#: The tensor dtypes every quantiser takes.
INPUT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
#: bit layout of the working types: (integer view, mantissa bits, exponent bias, all-ones exponent field)
BITS = {torch.float32: (torch.int32, 23, 127, 0xFF), torch.float64: (torch.int64, 52, 1023, 0x7FF)}
#: Values per chunk on the CPU: a chunk's temporaries (1 MiB) stay in the cache.
CHUNK = 1 << 18
#: How the elements are rounded to the element format (:func:`mpt_lab.formats.round_to`'s modes):
#: round-to-nearest-even, or stochastically (up with probability equal to the discarded fraction of the
#: spacing, so E[q] = v exactly wherever v does not saturate).
ROUNDINGS = ("nearest_even", "stochastic")
#: Block layouts of the block quantisers: "1d", blocks of ``block_size`` values along one axis; "2d", square
#: tiles of ``block_size`` × ``block_size`` values of a matrix sharing one scale (NVIDIA, "Pretraining Large
#: Language Models with NVFP4", arXiv:2509.25149, §4.3), so that the quantised matrix and the quantised
#: transpose are each other's transpose.
BLOCK_LAYOUTS = ("1d", "2d")


# ----------------------------------------------------------------------------------------------------------
# argument checks and small helpers
# ----------------------------------------------------------------------------------------------------------
def check_tensor(x, argname: str = "x") -> torch.Tensor:
    """``x`` detached, if it is a float16, bfloat16, float32 or float64 tensor on a real device; TypeError or
    ValueError naming ``argname`` otherwise."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{argname} must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in INPUT_DTYPES:
        raise TypeError(f"{argname} must be a float16, bfloat16, float32 or float64 tensor, got dtype {x.dtype}")
    if x.device.type == "meta":
        raise ValueError(
            f"{argname} is a meta tensor (a shape and dtype without values); "
            "pass a tensor on a real device (cpu, cuda, ...)"
        )
    return x.detach()


def check_int(v, argname: str, minimum: int | None = None) -> int:
    """``v`` as an int (not a bool), at least ``minimum``; TypeError or ValueError naming ``argname``."""
    if not isinstance(v, numbers.Integral) or isinstance(v, bool):
        raise TypeError(f"{argname} must be an int, got {type(v).__name__}")
    if minimum is not None and v < minimum:
        raise ValueError(f"{argname} must be ≥ {minimum}, got {v}")
    return int(v)


def check_bool(v, argname: str) -> bool:
    """``v`` if it is a bool; TypeError naming ``argname`` otherwise."""
    if not isinstance(v, bool):
        raise TypeError(f"{argname} must be a bool, got {type(v).__name__}")
    return v


def check_axis(axis, ndim: int) -> int:
    """``axis`` of an ``ndim``-d tensor as a non-negative int; TypeError/ValueError for a bad axis or a 0-d
    tensor (which has no axis to split into blocks)."""
    axis = check_int(axis, "axis")
    if ndim == 0:
        raise ValueError("x must have at least one dimension to be split into blocks, got a 0-d tensor")
    if not -ndim <= axis < ndim:
        raise ValueError(f"axis must lie in [{-ndim}, {ndim}) for a {ndim}-d tensor, got {axis}")
    return axis % ndim


def check_choice(v, argname: str, choices: tuple) -> str:
    """``v`` if it is one of the strings ``choices``; TypeError/ValueError naming ``argname`` and the choices."""
    if not isinstance(v, str):
        raise TypeError(f"{argname} must be a str, one of {choices}; got {type(v).__name__}")
    if v not in choices:
        raise ValueError(f"{argname} must be one of {choices}, got {v!r}")
    return v


def check_rounding(rounding) -> str:
    """``rounding`` if it is one of :data:`ROUNDINGS`; TypeError/ValueError naming the argument."""
    return check_choice(rounding, "rounding", ROUNDINGS)


def check_blocks(blocks, x: torch.Tensor) -> str:
    """``blocks`` if it is one of :data:`BLOCK_LAYOUTS` and x can be split that way ("2d" needs a matrix);
    TypeError/ValueError naming the argument."""
    blocks = check_choice(blocks, "blocks", BLOCK_LAYOUTS)
    if blocks == "2d" and x.dim() != 2:
        raise ValueError(
            f"blocks='2d' (square tiles of a matrix) needs a 2-d tensor, got {x.dim()}-d x of shape {tuple(x.shape)}"
        )
    return blocks


def check_dtype(dtype) -> torch.dtype:
    """``dtype`` if it is float16, bfloat16, float32 or float64 (what ``dequantize`` returns); TypeError."""
    if not isinstance(dtype, torch.dtype) or dtype not in INPUT_DTYPES:
        raise TypeError(f"dtype must be torch.float16, bfloat16, float32 or float64, got {dtype!r}")
    return dtype


def scalar_format(fmt, argname: str) -> FloatFormat:
    """The :class:`~mpt_lab.formats.FloatFormat` named by ``fmt``, a signed format of at most 16 bits (what
    per-tensor scaling rounds to); TypeError/ValueError naming ``argname``."""
    fmt = F.get_format(fmt, argname)
    if fmt.bits > 16 or not fmt.signed:
        raise ValueError(
            f"{argname} must be a signed format of at most 16 bits (FP8, FP6, FP4, FP16, BF16), got {fmt.name}"
        )
    return fmt


def work_dtype(dtype: torch.dtype) -> torch.dtype:
    """The working type of a quantiser for input of ``dtype``: float64 for float64, float32 otherwise."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def pow2(k: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """2^k for an integer tensor k in [−1022, 1023], built from float64 bits (exact), cast to ``dtype``."""
    return ((k.to(torch.int64) + 1023) << 52).view(torch.float64).to(dtype)


def abs_max(t: torch.Tensor) -> torch.Tensor:
    """max |t| over all values (0-d, t's dtype; 0 for an empty t); NaN if t holds a NaN (torch's max and min
    propagate NaN)."""
    if t.numel() == 0:
        return torch.zeros((), dtype=t.dtype, device=t.device)
    return torch.maximum(t.max(), t.min().neg())


def block_amax(xb: torch.Tensor, work: torch.dtype) -> torch.Tensor:
    """max |v| of each row of xb (blocks × block_size) in the working type (float32 or float64), NaN where a row
    holds a NaN.  As integers: the magnitudes' bit patterns order like their values and every NaN pattern lies
    above inf's (IEEE 754-2019 §3.4), so one integer maximum of the bits with the sign cleared does it.  Chunk by
    chunk into reused buffers, so that nothing large is allocated and the chunk stays in the cache."""
    ints = BITS[work][0]
    out = torch.empty(xb.shape[0], dtype=work, device=xb.device)
    out_bits = out.view(ints)
    buf = None
    for a, b in chunks(xb.shape[0], xb.shape[1], xb.device):
        w = xb[a:b] if xb.dtype == work else xb[a:b].to(work)
        if buf is None:
            buf = torch.empty(w.shape, dtype=ints, device=xb.device)
        mag = torch.bitwise_and(w.view(ints), (1 << (w.element_size() * 8 - 1)) - 1, out=buf[: b - a])
        torch.amax(mag, 1, out=out_bits[a:b])
    return out


def scale_rows_and_encode(
    xb: torch.Tensor,
    r: torch.Tensor,
    nan: torch.Tensor,
    fmt: FloatFormat,
    work: torch.dtype,
    rounding: str = "nearest_even",
    generator=None,
) -> torch.Tensor:
    """Codes (uint8, xb's shape) of fl(v · r) rounded to fmt with saturation, r one multiplier per row (work
    dtype); rows where ``nan`` is set get codes 0.  Chunk by chunk into a reused buffer (cache-resident).
    ``rounding="stochastic"`` draws from ``generator`` chunk after chunk, in the order of the values, which
    is the order :func:`mpt_lab.formats.round_to` draws them in on the whole tensor (the same values)."""
    codes = torch.empty(xb.shape, dtype=torch.uint8, device=xb.device)
    any_nan = bool(nan.any())
    buf = None
    for a, b in chunks(xb.shape[0], xb.shape[1], xb.device):
        if buf is None:
            buf = torch.empty((b - a, xb.shape[1]), dtype=work, device=xb.device)
        y = torch.mul(xb[a:b], r[a:b, None], out=buf[: b - a])
        if any_nan:
            y.masked_fill_(nan[a:b, None], 0.0)
        encode_into(codes[a:b], y, fmt, rounding, generator)
    return codes


def beyond_range(y: torch.Tensor, fmt: FloatFormat) -> torch.Tensor:
    """Where round-to-nearest-even with an unbounded exponent takes y above fmt.max: the values a saturating
    conversion clamps to ±max and a non-saturating one overflows.  The threshold is the midpoint between max
    and the next value the format lacks; a tie there goes up when max's significand is odd (all but E4M3).
    """
    half_ulp = 2.0 ** (fmt.emax - fmt.mantissa_bits - 1)
    threshold = fmt.max + half_ulp
    a = y.abs()
    ties_up = int(fmt.max / (2 * half_ulp)) % 2 == 1
    return (a >= threshold) if ties_up else (a > threshold)


def repeat_per_block(t: torch.Tensor, axis: int, block_size: int, n: int) -> torch.Tensor:
    """One value per block (along ``axis``) repeated to every position of its block: x's shape."""
    return t.repeat_interleave(block_size, dim=axis).narrow(axis, 0, n)


def as_float32(v, argname: str, device) -> torch.Tensor:
    """A float or floating tensor as a float32 tensor on ``device`` (None: the tensor's own); TypeError naming
    ``argname`` for anything else."""
    if isinstance(v, torch.Tensor):
        if not v.is_floating_point():
            raise TypeError(f"{argname} must be a float or a floating tensor, got dtype {v.dtype}")
        return v.detach().to(device=device if device is not None else v.device, dtype=torch.float32)
    if isinstance(v, numbers.Real) and not isinstance(v, bool):
        return torch.tensor(float(v), dtype=torch.float32, device=device)
    raise TypeError(f"{argname} must be a float or a floating tensor, got {type(v).__name__}")


# ----------------------------------------------------------------------------------------------------------
# element rounding: formats.encode, or torch's float8 conversion once it has been checked against encode
# ----------------------------------------------------------------------------------------------------------
_NATIVE: dict = {}


def native_cast(fmt: FloatFormat, device: torch.device) -> str | None:
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
        beyond = torch.cat([torch.linspace(fmt.max, 2.0 ** (fmt.emax + 2), 4097), torch.tensor([FP32_MAX])])
        beyond = torch.cat([beyond, torch.nextafter(beyond, up)])
        result = None
        for name, probe in (("in_range", inside), ("saturating", torch.cat([inside, beyond]))):
            probe = torch.cat([probe, -probe]).to(device)
            if not torch.equal(probe.to(FLOAT8[fmt]).view(torch.uint8), F.encode(probe, fmt, saturate=True)):
                break
            result = name
        if result is None:
            warnings.warn(
                f"torch's float32 → {FLOAT8[fmt]} conversion on {device} differs from "
                "mpt_lab.formats.encode; using encode (slower)",
                RuntimeWarning,
                stacklevel=3,
            )
        _NATIVE[key] = result
    return _NATIVE[key]


def encode_into(
    out: torch.Tensor, y: torch.Tensor, fmt: FloatFormat, rounding: str = "nearest_even", generator=None
) -> None:
    """Write the codes of the finite values y (float32 or float64), rounded to nearest-even (or
    stochastically, from ``generator``) in fmt with saturation, into the uint8 tensor ``out``; y may be
    clamped in place."""
    native = (
        native_cast(fmt, y.device)
        if fmt in FLOAT8 and y.dtype == torch.float32 and rounding == "nearest_even"
        else None
    )
    if native is None:
        out.copy_(F.encode(y, fmt, saturate=True, rounding=rounding, generator=generator))
        return
    if native == "in_range":
        y.clamp_(-fmt.max, fmt.max)
    out.view(FLOAT8[fmt]).copy_(y)


# ----------------------------------------------------------------------------------------------------------
# blocks along an axis
# ----------------------------------------------------------------------------------------------------------
def to_blocks(x: torch.Tensor, block_size: int, axis: int) -> tuple[torch.Tensor, tuple]:
    """x with ``axis`` moved last and zero-padded to whole blocks, as (number of blocks, block_size)."""
    xm = x.movedim(axis, -1)
    n = xm.shape[-1]
    pad = -n % block_size
    if pad:
        xm = torch.nn.functional.pad(xm, (0, pad))
    lead, padded = tuple(xm.shape[:-1]), xm.shape[-1]
    return xm.reshape(-1, block_size), (lead, padded // block_size, padded, n)


def from_blocks(t: torch.Tensor, layout: tuple, axis: int, per_block: bool) -> torch.Tensor:
    """Undo :func:`to_blocks` for block data (shape (B, block_size)) or for one value per block (shape (B,),
    ``per_block=True``); returns a contiguous tensor laid out like x."""
    lead, nblocks, padded, n = layout
    if per_block:
        return t.reshape(*lead, nblocks).movedim(-1, axis).contiguous()
    return t.reshape(*lead, padded)[..., :n].movedim(-1, axis).contiguous()


def tile_amax(amax: torch.Tensor, layout: tuple, block_size: int) -> torch.Tensor:
    """2D block scaling: the amax of each ``block_size`` × ``block_size`` tile of a matrix, given to each of
    the tile's 1 × block_size blocks.

    ``amax`` holds one value per block of :func:`to_blocks` of a 2-d tensor (rows × blocks per row, flattened;
    float32 or float64, NaN for a block holding NaN); the result has the same shape and holds, for each
    block, the maximum over the ``block_size`` consecutive rows of its tile (a partial last tile of fewer rows
    has its own).  NaN propagates (torch's ``amax``).  "2D block scales are replicated for each of the
    1 × 16 blocks when being passed into Tensor Cores" (NVIDIA, arXiv:2509.25149, §4.3): every quantiser
    downstream stays the 1D one.
    """
    (rows,), nblocks = layout[0], layout[1]
    a = amax.view(rows, nblocks)
    pad = -rows % block_size
    if pad:
        a = torch.nn.functional.pad(a, (0, 0, 0, pad))  # zero rows do not change a maximum
    a = a.view(-1, block_size, nblocks).amax(1)
    return a.repeat_interleave(block_size, 0)[:rows].reshape(-1)


def chunks(nrows: int, block_size: int, device: torch.device):
    """Row ranges of about CHUNK values each on the CPU; one range elsewhere (big kernels are cheaper there)."""
    step = max(1, CHUNK // block_size) if device.type == "cpu" else max(nrows, 1)
    for start in range(0, nrows, step):
        yield start, min(nrows, start + step)


# ----------------------------------------------------------------------------------------------------------
# the base classes of the quantised tensors
# ----------------------------------------------------------------------------------------------------------
class QuantizedTensor:
    """What every quantised tensor offers: ``shape`` and ``device`` (those of its values' codes)."""

    def _codes(self) -> torch.Tensor:  # pragma: no cover - every subclass defines it
        raise NotImplementedError

    @property
    def shape(self) -> torch.Size:
        """The shape of the quantised tensor (that of its element codes)."""
        return self._codes().shape

    @property
    def device(self) -> torch.device:
        """The device its codes are on."""
        return self._codes().device


@dataclass(frozen=True, eq=False)
class BlockScaledTensor(QuantizedTensor):
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
        """The scale of each block as float64 values (each format's subclass says how it decodes them)."""
        raise NotImplementedError

    def _per_value(self, per_block: torch.Tensor) -> torch.Tensor:
        return repeat_per_block(per_block, self.axis, self.block_size, self.shape[self.axis])

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
        dtype = self.dtype if dtype is None else check_dtype(dtype)
        work = self._work(dtype)
        return (self._element_values(work) * self._per_value(self.scales().to(work))).to(dtype)

    def _element_values(self, work: torch.dtype) -> torch.Tensor:
        return self.elements().to(work)

    @exact_arithmetic
    def saturated(self, x) -> torch.Tensor:
        """Where the values of x (the tensor this was quantised from) were beyond the element format's range
        once divided by their block's scale, and were clamped to ±max (bool, x's shape)."""
        x = check_tensor(x)
        if x.shape != self.shape:
            raise ValueError(f"x must have shape {tuple(self.shape)}, got {tuple(x.shape)}")
        return beyond_range(self._scaled(x.to(self.device)), self.fmt)

    def _scaled(self, x: torch.Tensor) -> torch.Tensor:
        """The values that were rounded to the element format (before saturation), float64."""
        return x.to(torch.float64) / self._per_value(self.scales())
