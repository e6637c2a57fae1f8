"""Log2-magnitude histograms of tensors, and the gradient recorder behind the paper's SSD histogram.

Micikevicius et al. (ICLR 2018, §3.2, "Loss scaling") recorded the activation gradients of Multibox SSD while it
trained in FP32 and plotted the share of values per power of two: most lie below FP16's smallest subnormal
2⁻²⁴ and become zero when cast to FP16; multiplying the loss by a scale S shifts them all by log2 S.

* :func:`log2_histogram` counts |x| per binade [2ᵏ, 2ᵏ⁺¹) over the whole FP32 range (k = −149 … 127,
  subnormals included), plus zeros and non-finite values, on the tensors' device with no host
  synchronisation; histograms add with ``+``.
* :meth:`Log2Histogram.fractions` says what share of the values a format would keep as normal or subnormal
  numbers, flush to zero (underflow) or overflow, after multiplying by a loss scale S — exactly as
  :func:`mpt_lab.formats.round_to` with round-to-nearest-even would (see the method for the one exception).
* :class:`GradientHistogram` collects the gradients with respect to every module's output ("activation"
  gradients, as in the paper) or every parameter ("weight" gradients) while a model trains;
  :meth:`GradientHistogram.underflow_share` is the share of them that a format and a loss scale would flush
  to zero (record a float32 run for it: an FP16 run's gradients are already flushed, see the class).

To be exact at the edges of a format's range, each binade is further split by the number of leading ones of
the fraction (the bits after the leading 1): whether a value rounds up into the next binade depends only on
that count, so the histogram can answer for any format and power-of-two scale after the fact.
"""

from __future__ import annotations

import ctypes
import math
import numbers
import os
import warnings
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch

from . import formats as F
from ._native import NativeUnavailable, native_library
from ._torch_internals import without_fx_graph_cache
from .device import DeviceLike, cpu_flags

__all__ = [
    "Log2Histogram",
    "log2_histogram",
    "GradientHistogram",
    "KMIN",
    "KMAX",
    "check_kernel",
    "quantile_binade",
    "lost_share",
    "lost_mass",
    "gradient_shares",
]

KMIN, KMAX = -149, 127  # binades of FP32: 2^-149 (smallest subnormal) … 2^127
NBINADES = KMAX - KMIN + 1  # 277
NSTATES = 25  # 0: fraction is zero (an exact power of two); 1 + L: L leading ones, 0 ≤ L ≤ 23
_ZERO = NBINADES * NSTATES
_NONFINITE = _ZERO + 1
NFINE = _ZERO + 2
FRACTION_KEYS = ("zero", "normal", "subnormal", "underflow", "overflow", "nonfinite")


def _fine_indices_eager(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Fine-bin index (int32) of every element of a 1-D float32 tensor, and its largest finite |x|.

    Integer operations on the bit pattern only (IEEE 754 §3.4): the binade from the exponent field, the
    leading ones of the fraction from the exponent of float(2²³ − fraction), which is exact.  FP32
    subnormals are first scaled by 2³² (exact) into the normal range.
    """
    b = x.view(torch.int32) & 0x7FFFFFFF
    e = b >> 23
    nonfinite = e == 255
    sub = e == 0
    bs = torch.where(sub, (x.abs() * 4294967296.0).view(torch.int32), b)  # subnormals × 2^32
    e2 = (bs >> 23) - sub.to(torch.int32) * 32
    frac = bs & 0x7FFFFF
    d = 0x800000 - frac  # 2^23 · (1 − fraction) ∈ (0, 2^23]
    ed = (d.to(torch.float32).view(torch.int32) >> 23) - 127  # floor(log2 d)
    not_pow2 = ((d & (d - 1)) != 0).to(torch.int32)
    # leading ones L = 23 − ceil(log2 d); state = L + 1, or 0 when the fraction is zero (d = 2^23)
    state = (23 - ed) - not_pow2 + (frac != 0).to(torch.int32)
    idx = (e2 - (127 + KMIN)) * NSTATES + state
    idx = torch.where(b == 0, _ZERO, idx)
    idx = torch.where(nonfinite, _NONFINITE, idx)
    amax = torch.where(nonfinite, 0, b).amax().view(torch.float32)
    return idx, amax


def _fine_indices_bits(b: torch.Tensor) -> torch.Tensor:
    """The fine indices of :func:`_fine_indices_eager`, from the int32 bit patterns ``b`` of the float32 values
    (``x.view(torch.int32)``), in integer operations but for two exact int → float conversions: the form that
    torch.compile turns into the fastest loop on a CPU (see :func:`_kernel`).

    A subnormal ``frac · 2⁻¹⁴⁹`` (biased exponent 0) has its leading 1 at bit ``p = floor(log2 frac)``, read
    from the exponent of float(frac) (exact: frac < 2²³); shifted left by 23 − p its fraction is the 23-bit
    fraction of its normalised form, as the eager kernel's × 2³² gives, and its binade is ``p − 149``."""
    b = b & 0x7FFFFFFF
    e = b >> 23
    frac0 = b & 0x7FFFFF
    sub = e == 0
    p = (frac0.to(torch.float32).view(torch.int32) >> 23) - 127
    frac = torch.where(sub, (frac0 << (23 - p).clamp(0, 23)) & 0x7FFFFF, frac0)
    row = torch.where(sub, p, e + 22)  # k − KMIN: a subnormal's k = p − 149, a normal value's k = e − 127
    d = 0x800000 - frac  # 2^23 · (1 − fraction) ∈ (0, 2^23]
    ed = (d.to(torch.float32).view(torch.int32) >> 23) - 127  # floor(log2 d)
    not_pow2 = ((d & (d - 1)) != 0).to(torch.int32)
    state = (23 - ed) - not_pow2 + (frac != 0).to(torch.int32)
    idx = row * NSTATES + state
    idx = torch.where(b == 0, _ZERO, idx)
    return torch.where(e == 255, _NONFINITE, idx)


def _amax_bits(b: torch.Tensor) -> torch.Tensor:
    """The bit pattern (int32, 0-d) of the largest finite |x| of the float32 values whose patterns ``b`` holds
    (the patterns of non-negative floats order as their values; inf and NaN count as zero)."""
    b = b & 0x7FFFFFFF
    return torch.where((b >> 23) == 255, 0, b).amax()


def _on_floats(index_kernel, amax_kernel):
    """A kernel of float32 tensors (:func:`_fine_indices_eager`' signature) from kernels of their bit patterns.
    Two loops, not one: compiled together, the reduction slowed the indices' loop to about half its speed."""

    def kernel(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        b = x.view(torch.int32)
        return index_kernel(b), amax_kernel(b).view(torch.float32)

    return kernel


def _bin_starts() -> np.ndarray:
    """The smallest FP32 bit pattern (sign cleared, as an int) of every fine bin, in the order of the fine index:
    bin ``(k − KMIN) · NSTATES + state`` holds the magnitudes of binade k whose fraction (the bits after the
    leading 1) has ``state − 1`` leading ones (state 0: no fraction bits set).  For a fixed binade the states are
    contiguous runs of bit patterns in increasing order, so the patterns of all bins are ordered like the fine
    index (zeros and non-finite values apart); a state a subnormal binade cannot hold (fewer fraction bits) has
    the start of the next bin, i.e. an empty run."""
    starts = np.empty(_ZERO, dtype=np.int64)
    for k in range(KMIN, KMAX + 1):
        # the binade's first pattern and its fraction bits: 23 for a normal binade; a subnormal one's leading 1 is
        # bit k + 149 and its fraction the bits below it
        base, bits = ((k + 127) << 23, 23) if k >= -126 else (1 << (k + 149), k + 149)
        row = (k - KMIN) * NSTATES
        starts[row] = base  # state 0: fraction 0, the power of two itself
        for lead in range(NSTATES - 1):  # state lead + 1: that many leading ones of the fraction
            if lead == 0:  # top fraction bit 0, fraction not 0
                first = 1
            elif lead <= bits:  # the fraction starts with `lead` ones, then a 0
                first = (1 << bits) - (1 << (bits - lead))
            else:  # more leading ones than fraction bits: empty
                first = 1 << bits
            starts[row + 1 + lead] = base + min(first, 1 << bits)
    return starts


def _kernel_probes() -> list:
    """Inputs on which the compiled kernel must equal the eager one before it is used: the special values, and
    4,099 random bit patterns (every class of float32; vectorised loop and scalar tail).  Inductor's code for
    this kernel has been seen to be wrong (indices past the histogram) with ``ATEN_CPU_CAPABILITY=avx2`` on an
    AVX-512 CPU while right on 7 values, so the probe covers the vector loops too."""
    special = torch.tensor(
        [0.0, -0.0, -1.5, 2.0**-140, -(2.0**-149), float("inf"), float("-inf"), float("nan"), 3.0e38, 1.0e-3]
    )
    g = torch.Generator().manual_seed(0)
    bits = torch.randint(-(2**31), 2**31 - 1, (4099,), generator=g, dtype=torch.int64).to(torch.int32)
    return [special, bits.view(torch.float32), torch.randn(4099, generator=g) * 1e-3]


def _search_tables(device) -> tuple[torch.Tensor, torch.Tensor]:
    """Boundaries for :func:`torch.bucketize` over the sign-cleared bit patterns and the table from a bucket to the
    fine index (see :func:`_fine_indices_search`), on ``device``."""
    key = torch.device(device)
    if key not in _SEARCH_TABLES:
        starts = _bin_starts()
        bounds = np.concatenate([[1], starts[1:], [0x7F800000]])  # bucket 0: zero; bucket ZERO + 1: inf/NaN
        lut = np.concatenate([[_ZERO], np.arange(_ZERO), [_NONFINITE]])
        _SEARCH_TABLES[key] = (
            torch.from_numpy(bounds.astype(np.int32)).to(key),
            torch.from_numpy(lut.astype(np.int32)).to(key),
        )
    return _SEARCH_TABLES[key]


_SEARCH_TABLES: dict = {}


def _fine_indices_search(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """What :func:`_fine_indices_eager` returns, in about five passes over ``x`` instead of twenty-five: each fine
    bin is a contiguous run of FP32 bit patterns (:func:`_bin_starts`), so one :func:`torch.bucketize` of the
    sign-cleared patterns against the runs' starts finds it, and a 6,927-entry table maps the bucket to the fine
    index (zero, the lowest pattern, has the index after the binades; inf and NaN the last one); the largest
    finite |x| is the amax of |x| with inf and NaN set to zero.  Five kernels, about 36 bytes of memory traffic a
    value.  Used on CUDA, where it needs no compilation (see :func:`_kernel`)."""
    bounds, lut = _search_tables(x.device)
    b = x.view(torch.int32) & 0x7FFFFFFF  # |x|'s bit pattern
    idx = lut[torch.bucketize(b, bounds, out_int32=True, right=True)]
    amax = torch.nan_to_num(b.view(torch.float32), nan=0.0, posinf=0.0).amax()  # largest finite |x|
    return idx, amax


# ------------------------------------------------------------------------------------------------------------
# The C kernel (CPU): bin index and count in one pass
# ------------------------------------------------------------------------------------------------------------
#: The CPU histogram in C (compiled by :mod:`mpt_lab._native`): per block of 2,048 values the fine indices (a
#: vectorised loop: the leading zeros of bit patterns) and the largest finite pattern, then the counts, in four
#: interleaved count arrays (consecutive values of one bin do not wait on each other's increment).  The fine
#: index of a value: its binade from the biased exponent (a subnormal's from the position of its leading 1), its
#: state 0 when the fraction after the leading 1 is zero, else 1 + the number of leading ones of that fraction,
#: i.e. the leading zeros of the complement of the fraction moved to the top of the word.  The same index as
#: :func:`_fine_indices_eager` (checked on every bin's edges before use, see :func:`_native_kernel`).
_C_SOURCE = r"""
#include <stdint.h>
#include <string.h>
#define NSTATES @NSTATES@
#define ZERO @ZERO@
#define NONFINITE @NONFINITE@
#define NFINE @NFINE@
#define ROW_OFFSET @ROW_OFFSET@
#define BLOCK 2048

static uint32_t block_indices(const uint32_t *restrict x, int n, uint16_t *restrict out, uint32_t amax) {
    for (int i = 0; i < n; i++) {
        uint32_t b = x[i] & 0x7FFFFFFFu;
        uint32_t e = b >> 23, f = b & 0x7FFFFFu;
        uint32_t lz = (uint32_t)__builtin_clz(f | 1u);     /* a subnormal's leading 1 is bit 31 - lz */
        uint32_t shift = e == 0 ? lz - 8 : 0;              /* moves a subnormal's leading 1 out of the word */
        uint32_t t = (f << 9) << shift;                    /* the fraction after the leading 1, at the top */
        uint32_t row = e == 0 ? 31 - lz : e + ROW_OFFSET;  /* binade k - KMIN */
        uint32_t state = t == 0 ? 0 : 1 + (uint32_t)__builtin_clz(~t);
        uint32_t idx = row * NSTATES + state;
        idx = b == 0 ? ZERO : idx;
        idx = e == 255 ? NONFINITE : idx;
        out[i] = (uint16_t)idx;
    }
    uint32_t m = 0;
    for (int i = 0; i < n; i++) {  /* largest finite |x| (patterns of non-negative floats order as values) */
        uint32_t b = x[i] & 0x7FFFFFFFu;
        uint32_t finite = b & (0u - (uint32_t)(b < 0x7F800000u));
        m = finite > m ? finite : m;
    }
    return m > amax ? m : amax;
}

/* counts[0:NFINE] += the fine histogram of the n float32 values at x; *amax = the largest finite |x| pattern */
void mpt_lab_histogram(const uint32_t *x, int64_t n, int64_t *counts, uint32_t *amax) {
    uint32_t sub[4][NFINE];
    uint16_t idx[BLOCK];
    uint32_t m = *amax;
    for (int64_t start = 0; start < n;) {
        int64_t end = n - start > (1LL << 30) ? start + (1LL << 30) : n;  /* uint32 counts cannot overflow */
        memset(sub, 0, sizeof(sub));
        for (int64_t i = start; i < end; i += BLOCK) {
            int k = end - i < BLOCK ? (int)(end - i) : BLOCK;
            m = block_indices(x + i, k, idx, m);
            int j = 0;
            for (; j + 4 <= k; j += 4) {
                sub[0][idx[j]]++;
                sub[1][idx[j + 1]]++;
                sub[2][idx[j + 2]]++;
                sub[3][idx[j + 3]]++;
            }
            for (; j < k; j++) sub[0][idx[j]]++;
        }
        for (int b = 0; b < NFINE; b++) counts[b] += (int64_t)sub[0][b] + sub[1][b] + sub[2][b] + sub[3][b];
        start = end;
    }
    *amax = m;
}

/* the same in `threads` parts at once, part t into counts[t * NFINE ...] and amax[t]: on OpenMP's threads (torch's
   own, see mpt_lab._native) where compiled with OpenMP, else one part after the other */
void mpt_lab_histogram_parts(const uint32_t *x, int64_t n, int64_t *counts, uint32_t *amax, int threads) {
#ifdef _OPENMP
#pragma omp parallel for num_threads(threads) schedule(static, 1)
#endif
    for (int t = 0; t < threads; t++) {
        int64_t a = n * t / threads, b = n * (t + 1) / threads;
        mpt_lab_histogram(x + a, b - a, counts + (int64_t)t * NFINE, amax + t);
    }
}
"""
for _k, _v in {
    "NSTATES": NSTATES,
    "ZERO": _ZERO,
    "NONFINITE": _NONFINITE,
    "NFINE": NFINE,
    "ROW_OFFSET": -127 - KMIN,
}.items():
    _C_SOURCE = _C_SOURCE.replace(f"@{_k}@", str(_v))

#: Values per part when the C kernel splits a tensor over torch's intra-op threads (no split below it).
_NATIVE_PART = 1 << 16

_c_histogram: dict = {}  # "fn": the checked ctypes function (mpt_lab_histogram_parts), or None (unavailable)


def _native_counts(fn, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(fine counts int64 [NFINE], largest finite |x| 0-d float32) of a contiguous 1-D float32 CPU tensor, by the
    C kernel ``fn`` (:func:`_native_kernel`), split in equal parts over torch's intra-op threads."""
    return _native_counts_parts(fn, x, max(1, min(torch.get_num_threads(), x.numel() // _NATIVE_PART)))


def _native_counts_parts(fn, x: torch.Tensor, parts: int) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`_native_counts` with ``x`` split in ``parts`` parts (as equal as can be; some may be empty), counted
    at once by the C kernel's OpenMP loop (on torch's intra-op threads, :mod:`mpt_lab._native`)."""
    counts = torch.zeros((parts, NFINE), dtype=torch.int64)
    amax = torch.zeros(parts, dtype=torch.int32)
    fn(x.data_ptr(), x.numel(), counts.data_ptr(), amax.data_ptr(), parts)
    return counts.sum(0), amax.amax().view(torch.float32)


def _native_probe() -> torch.Tensor:
    """Every fine bin's first bit pattern and its neighbours (both signs), the special patterns and the probes of
    the compiled kernel: the values on which the C kernel must equal the eager one."""
    starts = torch.from_numpy(_bin_starts())
    near = torch.cat([starts + d for d in (-1, 0, 1, 2)]).clamp(0, 0x7FFFFFFF).to(torch.int32)
    special = torch.tensor([0, 1, 0x7FFFFF, 0x7F7FFFFF, 0x7F800000, 0x7F800001, 0x7FFFFFFF], dtype=torch.int32)
    pats = torch.cat([near, special, near | torch.tensor(-(2**31), dtype=torch.int32)]).view(torch.float32)
    return torch.cat([pats, *_kernel_probes()])


def _native_kernel():
    """The C kernel's function (see :data:`_C_SOURCE`), built and checked once per process, or None: with
    ``MPT_LAB_COMPILE=0``, where :mod:`mpt_lab._native` cannot build it (no C compiler: a ``RuntimeWarning``
    says why), or where it disagrees with :func:`_fine_indices_eager` on :func:`_native_probe` (a warning too)."""
    if "fn" in _c_histogram:
        return _c_histogram["fn"]
    fn = None
    if _compile_wanted("cpu"):
        try:
            lib = native_library("mpt_lab_histogram", _C_SOURCE, openmp=True)
            fn = lib.mpt_lab_histogram_parts
            fn.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int]
            fn.restype = None
            probe = _native_probe()
            got = _native_counts(fn, probe)
            idx, amax = _fine_indices_eager(probe)
            want = torch.bincount(idx, minlength=NFINE)
            if not (torch.equal(got[0], want) and torch.equal(got[1], amax)):
                raise RuntimeError(f"the C kernel disagrees with the eager one on {probe.numel():,} values")
        except (NativeUnavailable, RuntimeError, OSError, AttributeError) as err:
            warnings.warn(
                f"the C histogram kernel is unavailable ({type(err).__name__}: {err}); CPU histograms use "
                "torch.compile's kernel (the same bins, slower)",
                RuntimeWarning,
                stacklevel=3,
            )
            fn = None
    _c_histogram["fn"] = fn
    return fn


_compiled: dict = {}


def _compile_wanted(device_type: str) -> bool:
    """Whether :func:`_kernel` compiles for ``device_type`` (and, for the CPU, whether :func:`_native_kernel` builds
    the C kernel): ``MPT_LAB_COMPILE`` "0" (never: the eager kernel), "1" (default: the CPU only), "all" (the CPU
    and CUDA)."""
    setting = os.environ.get("MPT_LAB_COMPILE", "1").strip().lower()
    if setting in ("0", "false", "no", "off"):
        return False
    if setting == "all":
        return True
    return device_type == "cpu"


def _aten_capped() -> bool:
    """Whether ATen runs below the instruction set this CPU has (``ATEN_CPU_CAPABILITY=avx2`` or ``default`` on an
    AVX-512 CPU, ``default`` on an AVX2 one).  torch.compile then generates code for the capped set, and on this
    project's Intel Xeon with ``ATEN_CPU_CAPABILITY=avx2`` that code for the histogram kernel passed the probes and
    then gave wrong indices for half of a 230,519-value tensor once a 300,000-value one had been counted: the CPU
    histograms use the bucketize kernel there (the same bins, several times slower), without compiling."""
    capability = torch.backends.cpu.get_cpu_capability().upper()
    flags = set(cpu_flags())
    return (capability in ("AVX2", "DEFAULT") and "avx512f" in flags) or (capability == "DEFAULT" and "avx2" in flags)


def _compile_checked(dev: torch.device):
    """The compiled kernel on ``dev``, checked against the eager one on :func:`_kernel_probes`.  Compiled without
    inductor's on-disk FX graph cache (about half a second more): on the Intel Xeon, a process with
    ``ATEN_CPU_CAPABILITY=avx2`` loaded from that cache, written by runs with the CPU's own kernels, code that gave
    wrong indices for the special values, where compiling afresh in the same setting gave right ones.  Raises
    RuntimeError when the compiled kernel disagrees."""
    with without_fx_graph_cache(), warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # torch's own deprecation notices while it compiles
        fn = _on_floats(torch.compile(_fine_indices_bits, dynamic=True), torch.compile(_amax_bits, dynamic=True))
        # compiled on a full piece: inductor decides from the first input's size whether its loops run on the
        # intra-op threads (OpenMP); a two-value first call gave serial loops, twice the time on two threads
        fn(torch.ones(_CPU_CHUNK, device=dev))
        for probe in _kernel_probes():
            probe = probe.to(dev)
            got, want = fn(probe), _fine_indices_eager(probe)
            if not (torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])):
                raise RuntimeError(f"compiled kernel disagrees with the eager one on {probe.numel()} values")
    return fn


def _kernel(device="cpu"):
    """The fine-index kernel for tensors on ``device`` (a torch.device or its type), chosen once per device type.

    :func:`log2_histogram` on the CPU first takes the C kernel (:func:`_native_kernel`: index and count in one
    pass: 0.6 ns a value against this kernel's 3.0-3.5 with ``torch.bincount`` on 5·10⁷ values, two threads,
    this project's Intel Xeon, ``benchmarks/histogram_kernels.py``); this one where the C kernel is unavailable.

    * CPU: :func:`_fine_indices_bits` (the eager kernel's arithmetic on the bit patterns) and :func:`_amax_bits`,
      each fused by torch.compile into one loop (on an Intel Xeon the float form compiled with the amax in one
      loop ran at about half their speed, the eager kernel about 20× slower), compiled and
      checked against the eager kernel on CPU tensors (special values and 4,099 random bit patterns, so that the
      vector loops are covered); where compiling fails (no C++ compiler, …) or the check does, the bucketize
      kernel below, with a warning.
    * CUDA: :func:`_fine_indices_search`, a bucketize in about five memory passes, with no compilation: the first
      GPU slot spent 75 s compiling the histogram kernel, once for the CPU and again for CUDA, more than the compiled
      kernel saves in a slot's few hundred histogrammed steps.  ``MPT_LAB_COMPILE=all`` compiles for CUDA instead,
      on CUDA tensors only.
    * CPU with ATen below the CPU's instruction set (:func:`_aten_capped`, e.g. ``ATEN_CPU_CAPABILITY=avx2`` on an
      AVX-512 CPU): the bucketize kernel, uncompiled (torch.compile's code was seen wrong there).
    * ``MPT_LAB_COMPILE=0``: the eager kernel everywhere.
    """
    kind = torch.device(device).type
    if kind not in _compiled:
        if not _compile_wanted(kind):
            setting = os.environ.get("MPT_LAB_COMPILE", "1").strip().lower()
            _compiled[kind] = (
                _fine_indices_search
                if (kind == "cuda" and setting not in ("0", "false", "no", "off"))
                else _fine_indices_eager
            )
        elif kind == "cpu" and _aten_capped():
            _compiled[kind] = _fine_indices_search
        else:
            try:
                _compiled[kind] = _compile_checked(torch.device(kind))
            except Exception as err:  # no C++ compiler, unsupported platform, …
                warnings.warn(
                    f"torch.compile unavailable for the histogram kernel on {kind} ({type(err).__name__}: "
                    f"{err}); using the uncompiled bucketize kernel (the same bins, slower)",
                    RuntimeWarning,
                    stacklevel=3,
                )
                _compiled[kind] = _fine_indices_search
    return _compiled[kind]


def check_kernel(device: DeviceLike, n: int = 1 << 18) -> str:
    """Check the fine-index kernel that :func:`log2_histogram` uses on ``device`` against the eager kernel on the
    CPU: ``n`` random FP32 bit patterns and the edges (zero, subnormals, the normal range's ends, inf, NaN, both
    signs), the indices and the largest finite |x| equal, and so do whole histograms.  For the GPU preflight.

    Returns one line naming the kernel.  Raises RuntimeError on a difference."""
    device = torch.device(device)
    g = torch.Generator().manual_seed(0)
    bits = torch.randint(-(2**31), 2**31 - 1, (n,), generator=g, dtype=torch.int64).to(torch.int32)
    edges = torch.tensor(
        [0, 1, 0x7FFFFF, 0x800000, 0x3F800000, 0x3FFFFFFF, 0x7F7FFFFF, 0x7F800000, 0x7FC00000], dtype=torch.int32
    )
    x = torch.cat([bits, edges, edges | torch.tensor(-(2**31), dtype=torch.int32)]).view(torch.float32)
    kernel = _kernel(device)
    what = (
        "the bucketize kernel"
        if kernel is _fine_indices_search
        else "the eager kernel"
        if kernel is _fine_indices_eager
        else "the compiled kernel"
    )
    got = kernel(x.to(device))
    want = _fine_indices_eager(x)
    if not (torch.equal(got[0].cpu(), want[0]) and torch.equal(got[1].cpu(), want[1])):
        raise RuntimeError(f"{what} on {device.type} disagrees with the eager kernel on the CPU")
    want_hist = Log2Histogram(torch.bincount(want[0], minlength=NFINE), want[1])
    if log2_histogram(x.to(device)) != want_hist:
        raise RuntimeError(f"log2_histogram on {device.type} differs from the CPU's eager kernel")
    if device.type == "cpu" and _native_kernel() is not None:
        what = "the C kernel (log2_histogram's on the CPU; torch.compile's kernel equal too)"
    return f"{what} on {device.type} equals the CPU's eager kernel on {x.numel():,} bit patterns, histograms too"


def _dense(x: torch.Tensor) -> bool:
    """Whether x's elements are exactly the storage elements ``[storage_offset, storage_offset + numel)``, each
    once (a transpose or a permutation of a contiguous block, channels-last included), read from sizes and
    strides alone."""
    expected = 1
    for stride, size in sorted((st, sz) for sz, st in zip(x.shape, x.stride()) if sz != 1):
        if stride != expected:
            return False
        expected *= size
    return True


def _flat(x: torch.Tensor) -> torch.Tensor:
    """x detached and flattened (its dtype kept): a view in memory order, without a copy, when x is contiguous
    or a permutation of a contiguous block (a transposed weight, channels-last gradients: the order of the values
    is irrelevant to a histogram); a flattened copy otherwise."""
    x = x.detach()
    if not x.is_contiguous() and x.numel() > 1 and _dense(x):
        return x.as_strided((x.numel(),), (1,), x.storage_offset())
    return x.reshape(-1)


def _fine_indices(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Fine-bin indices (flattened) and largest finite |x| (0-d float32) of any floating tensor."""
    x = _flat(x)
    if x.dtype != torch.float32:
        x = x.to(torch.float32)
    if x.device.type not in ("cpu", "cuda"):
        return _fine_indices_eager(x)
    with torch.no_grad():  # one grad mode for every call: torch.compile's guard would recompile on a change
        return _kernel(x.device)(x)


#: Values per piece when a CPU histogram counts a large tensor: the piece's indices (4 MiB) stay in the cache
#: between the kernel that writes them and the bincount that reads them, instead of a pass through memory each.
_CPU_CHUNK = 1 << 20

#: Indices from which a CPU bincount is split in two halves counted at once, one on a worker thread (when torch
#: runs on more than one intra-op thread): ``torch.bincount``'s counting loop is single-threaded.
_SPLIT_BINCOUNT = 1 << 19

_workers: dict = {}  # process id -> ThreadPoolExecutor (a forked child makes its own: threads do not survive a fork)


def _bincount_cpu(idx: torch.Tensor) -> torch.Tensor:
    """``torch.bincount(idx, minlength=NFINE)`` of CPU fine indices; above :data:`_SPLIT_BINCOUNT` indices and with
    more than one intra-op thread, the two halves are counted concurrently (torch releases the GIL) and added:
    the same counts, in about half the time."""
    n = idx.numel()
    if n < _SPLIT_BINCOUNT or torch.get_num_threads() < 2:
        return torch.bincount(idx, minlength=NFINE)
    pid = os.getpid()
    pool = _workers.get(pid)
    if pool is None:
        _workers.clear()
        pool = _workers[pid] = ThreadPoolExecutor(1, thread_name_prefix="mpt_lab_histogram")
    half = n // 2
    other = pool.submit(torch.bincount, idx[half:], minlength=NFINE)
    try:
        counts = torch.bincount(idx[:half], minlength=NFINE)
    finally:
        rest = other.result()
    return counts + rest


def _as_tensor(t, argname="tensors") -> torch.Tensor:
    if isinstance(t, torch.Tensor):
        if not (t.is_floating_point()):
            raise TypeError(f"{argname} must hold floating-point tensors, got dtype {t.dtype}")
        if t.device.type == "meta":
            raise ValueError(
                f"{argname} holds a meta tensor (a shape and dtype without values); there is nothing to count"
            )
        return t
    if isinstance(t, np.ndarray):
        if t.dtype.kind != "f":
            raise TypeError(f"{argname} must hold floating-point arrays, got dtype {t.dtype}")
        return torch.from_numpy(np.ascontiguousarray(t))
    raise TypeError(f"{argname} must be a tensor, a NumPy array or an iterable of them, got {type(t).__name__}")


def _log2_of_power_of_two(value, argname: str) -> int:
    if not isinstance(value, numbers.Real) or isinstance(value, bool):
        raise TypeError(f"{argname} must be a real number, got {type(value).__name__}")
    v = float(value)
    if not (math.isfinite(v) and v > 0):
        raise ValueError(f"{argname} must be a positive finite power of two, got {value!r}")
    mant, ex = math.frexp(v)
    if mant != 0.5:
        raise ValueError(
            f"{argname} must be a power of two (histograms hold binades; loss scales are powers of two), got {value!r}"
        )
    return ex - 1


class Log2Histogram:
    """Counts of |x| per binade [2ᵏ, 2ᵏ⁺¹), k = −149 … 127, plus zeros and non-finite values.

    Build one with :func:`log2_histogram` or :class:`GradientHistogram`; add them with ``+``; ``later - earlier``
    gives what was recorded in between; :meth:`median_binade` is the binade of the median magnitude.

    Attributes (computed from the fine counts, as NumPy/Python values; reading them synchronises with the
    device)
    ----------
    exponents : int64 array [277], the k of each bin
    counts : int64 array [277], values with 2ᵏ ≤ |x| < 2ᵏ⁺¹ (FP32 subnormals in their own binades)
    zeros, nonfinite, total : int
    amax : float, the largest finite |x| seen (0.0 when none)
    """

    def __init__(self, fine: torch.Tensor | None = None, amax: torch.Tensor | float = 0.0, device=None):
        if fine is None:
            fine = torch.zeros(NFINE, dtype=torch.int64, device=device)
        if fine.shape != (NFINE,) or fine.dtype != torch.int64:
            raise ValueError(f"fine counts must be an int64 tensor of shape ({NFINE},)")
        self._fine = fine
        self._amax = amax if isinstance(amax, torch.Tensor) else torch.tensor(float(amax), device=fine.device)

    # --- accumulation ----------------------------------------------------------------------------------
    @F.exact_arithmetic
    def add_(self, x: torch.Tensor | Iterable[torch.Tensor]) -> Log2Histogram:
        """Count the values of ``x`` (any shape, any float dtype; converted to FP32 first) into this histogram.

        Runs on x's device (moving the counts there if needed) without synchronising with the host.  Runs
        under :func:`mpt_lab.formats.exact_arithmetic`, so it counts exactly inside a
        :class:`mpt_lab.simulate.simulate` block too.

        Raises
        ------
        TypeError
            ``x`` is not a floating tensor or array.
        ValueError
            ``x`` is a meta tensor.
        """
        x = _as_tensor(x, "x")
        if self._fine.device != x.device:
            self._fine = self._fine.to(x.device)
            self._amax = self._amax.to(x.device)
        if x.numel() == 0:
            return self
        if x.device.type == "cpu" and (fn := _native_kernel()) is not None:
            flat = _flat(x)
            if flat.dtype != torch.float32:
                flat = flat.to(torch.float32)
            counts, amax = _native_counts(fn, flat.contiguous())
            self._fine += counts
            self._amax = torch.maximum(self._amax, amax)
            return self
        if x.device.type == "cpu" and x.numel() > _CPU_CHUNK:
            flat = _flat(x)
            for start in range(0, flat.numel(), _CPU_CHUNK):
                idx, amax = _fine_indices(flat[start : start + _CPU_CHUNK])
                self._fine += _bincount_cpu(idx)
                self._amax = torch.maximum(self._amax, amax)
            return self
        idx, amax = _fine_indices(x)
        if idx.device.type == "cpu":
            self._fine += _bincount_cpu(idx)
        else:  # index_add_ needs no host synchronisation (bincount reads the largest index back); its ones are
            # one element expanded (no write and read of 8 bytes a value)
            self._fine.index_add_(0, idx, torch.ones(1, dtype=torch.int64, device=idx.device).expand(idx.numel()))
        self._amax = torch.maximum(self._amax, amax)
        return self

    def __add__(self, other: Log2Histogram) -> Log2Histogram:
        if not isinstance(other, Log2Histogram):
            return NotImplemented
        dev = self._fine.device
        return Log2Histogram(self._fine + other._fine.to(dev), torch.maximum(self._amax, other._amax.to(dev)))

    def __sub__(self, other: Log2Histogram) -> Log2Histogram:
        """The values counted in ``self`` but not in ``other``: what was recorded since ``other`` was copied.

        ``other`` must be an earlier state of the same recording (e.g. ``before = gh.histogram.copy()``), so
        every count of ``other`` is at most ``self``'s; :attr:`amax` of the difference is ``self``'s (the
        largest value of the later values alone is not known).  Reads the counts on the host once (the check).

        Raises
        ------
        TypeError
            ``other`` is not a :class:`Log2Histogram` (via ``NotImplemented``).
        ValueError
            Some count of ``other`` exceeds ``self``'s: it was not recorded earlier in the same run.
        """
        if not isinstance(other, Log2Histogram):
            return NotImplemented
        diff = self._fine - other._fine.to(self._fine.device)
        if bool((diff < 0).any()):
            raise ValueError(
                "other has counts that self does not have: subtract only an earlier state of the "
                "same recording (h_later - h_earlier)"
            )
        return Log2Histogram(diff, self._amax.clone())

    def __radd__(self, other):
        if other == 0:  # sum() starts from 0
            return self.copy()
        return NotImplemented

    def copy(self) -> Log2Histogram:
        """An independent copy (its own count tensors)."""
        return Log2Histogram(self._fine.clone(), self._amax.clone())

    def __eq__(self, other) -> bool:
        if not isinstance(other, Log2Histogram):
            return NotImplemented
        return bool(torch.equal(self._fine.cpu(), other._fine.cpu())) and self.amax == other.amax

    def __repr__(self) -> str:
        return f"Log2Histogram(total={self.total}, zeros={self.zeros}, nonfinite={self.nonfinite}, amax={self.amax!r})"

    # --- counts ----------------------------------------------------------------------------------------
    @property
    def fine(self) -> np.ndarray:
        """Counts per (binade, leading-ones state) as an int64 array [277, 25] (see module docstring)."""
        return self._fine[:_ZERO].cpu().numpy().reshape(NBINADES, NSTATES)

    @property
    def exponents(self) -> np.ndarray:
        """The binades k of :attr:`counts`, int64 from KMIN to KMAX: bin k holds 2ᵏ ≤ |x| < 2ᵏ⁺¹."""
        return np.arange(KMIN, KMAX + 1, dtype=np.int64)

    @property
    def counts(self) -> np.ndarray:
        """Values per binade (int64, aligned with :attr:`exponents`); zeros and inf/NaN are counted apart."""
        return self.fine.sum(axis=1)

    @property
    def zeros(self) -> int:
        """Values that are exactly zero (±0)."""
        return int(self._fine[_ZERO])

    @property
    def nonfinite(self) -> int:
        """Values that are ±inf or NaN."""
        return int(self._fine[_NONFINITE])

    @property
    def total(self) -> int:
        """All values counted: binned, zeros and non-finite."""
        return int(self._fine.sum())

    @property
    def amax(self) -> float:
        """The largest finite |x| counted (0.0 when there is none)."""
        return float(self._amax)

    def median_binade(self) -> int | None:
        """The binade k (2ᵏ ≤ |x| < 2ᵏ⁺¹) holding the median magnitude of the non-zero finite values.

        The smallest k whose cumulative count reaches half of the non-zero finite count (zeros and
        non-finite values are left out); None when there is no non-zero finite value.  An int in
        −149 … 127.
        """
        return quantile_binade(self, 0.5)

    def _shares(self, n) -> float:
        t = self.total
        return n / t if t else float("nan")

    def fraction_zero(self) -> float:
        """Share of all values that are exactly zero (NaN for an empty histogram)."""
        return self._shares(self.zeros)

    def fraction_below(self, threshold: float, *, include_zeros: bool = True) -> float:
        """Share of all values with |x| < ``threshold`` (a power of two), zeros included unless asked not to."""
        k = _log2_of_power_of_two(threshold, "threshold")
        c = self.counts[self.exponents < k].sum()
        return self._shares(int(c) + (self.zeros if include_zeros else 0))

    def fraction_between(self, lo: float, hi: float) -> float:
        """Share of all values with lo ≤ |x| < hi (powers of two)."""
        a, b = _log2_of_power_of_two(lo, "lo"), _log2_of_power_of_two(hi, "hi")
        if a > b:
            raise ValueError(f"lo must be ≤ hi, got {lo!r} and {hi!r}")
        e = self.exponents
        return self._shares(int(self.counts[(e >= a) & (e < b)].sum()))

    # --- what a format keeps -----------------------------------------------------------------------------
    def category_counts(self, fmt: F.FormatLike, scale: float = 1.0) -> dict:
        """Counts of values per category of :meth:`fractions` (same keys, ints)."""
        fmt = F.get_format(fmt)
        if not fmt.subnormals:
            raise ValueError(f"fmt: {fmt.name} has no zero; fractions() needs a format that can underflow")
        j = _log2_of_power_of_two(scale, "scale")
        fine = self.fine
        m, emin, emax = fmt.mantissa_bits, fmt.emin, fmt.emax
        kk = self.exponents + j  # binade after scaling
        state = np.arange(NSTATES)
        ones = np.where(state == 0, -1, state - 1)  # leading ones (−1: fraction is zero)
        out = dict.fromkeys(FRACTION_KEYS, 0)
        kkg = kk[:, None] + np.zeros_like(state)[None, :]
        onesg = np.broadcast_to(ones, fine.shape)
        top_mant = fmt.max_mantissa_field
        top_all_ones = top_mant == (1 << m) - 1
        # thresholds on the leading-ones count (exact when the relevant neighbour is "all ones", see docstring)
        over = (kkg > emax) | ((kkg == emax) & (onesg >= (m + 1 if top_all_ones else m)))
        normal = ~over & (kkg >= emin)
        sub_zone = ~over & (kkg < emin)
        d = emin - kkg  # binades below emin (≥ 1 in sub_zone)
        p_eff = m - d  # fraction bits a subnormal keeps there
        rounds_to_normal = sub_zone & (d == 1) & (onesg >= m)
        underflow = sub_zone & ((p_eff <= -2) | ((p_eff == -1) & (onesg == -1)))
        subnormal = sub_zone & ~rounds_to_normal & ~underflow
        normal |= rounds_to_normal
        out["overflow"] = int(fine[over].sum())
        out["normal"] = int(fine[normal].sum())
        out["subnormal"] = int(fine[subnormal].sum())
        out["underflow"] = int(fine[underflow].sum())
        out["zero"] = self.zeros
        out["nonfinite"] = self.nonfinite
        return out

    def fractions(self, fmt: F.FormatLike, scale: float = 1.0) -> dict:
        """Shares of all values that would be zero, normal, subnormal, flushed to zero, overflowed or
        non-finite after multiplying by ``scale`` and rounding to ``fmt`` (round-to-nearest-even).

        Parameters
        ----------
        fmt : FloatFormat or str (a format with a zero: not E8M0)
        scale : float, a power of two (a loss scale S; multiplying by it shifts every binade by log2 S)

        Returns
        -------
        dict with keys "zero" (zero before scaling), "normal", "subnormal", "underflow" (non-zero values that
        round to zero), "overflow" (values that round beyond max: to inf, NaN, or clamped to ±max in FP6/FP4),
        "nonfinite" (inf/NaN before scaling); the shares add up to 1.  NaN for an empty histogram.
        :meth:`category_counts` gives the same as integer counts.

        Exactness: identical to classifying ``round_to(x * scale, fmt)`` value by value, for every format
        whose largest mantissa is all ones (FP16, BF16, TF32, FP32, E5M2, FP6, FP4).  For E4M3 (max
        1.75 × 2⁸, mantissa 110) values with |x·S| in (464, 480) count as normal although they overflow.

        Raises
        ------
        TypeError, ValueError
            Unknown format, a format without zero, or a scale that is not a positive power of two.
        """
        return {k: self._shares(v) for k, v in self.category_counts(fmt, scale).items()}

    def kept_fraction(self, fmt: F.FormatLike, scale: float = 1.0) -> float:
        """Share of the non-zero finite values that stay non-zero and finite (normal or subnormal)."""
        c = self.category_counts(fmt, scale)
        nz = c["normal"] + c["subnormal"] + c["underflow"] + c["overflow"]
        return (c["normal"] + c["subnormal"]) / nz if nz else float("nan")

    def max_scale(self, fmt: F.FormatLike) -> float:
        """The largest power-of-two scale S for which no finite value overflows ``fmt`` (inf if all are zero)."""
        fmt = F.get_format(fmt)
        nz = np.nonzero(self.counts)[0]
        if nz.size == 0:
            return math.inf
        top = int(self.exponents[nz[-1]])
        j = fmt.emax - top + 1
        while self.fractions(fmt, math.ldexp(1.0, j))["overflow"] > 0:
            j -= 1
        return math.ldexp(1.0, j)

    # --- persistence --------------------------------------------------------------------------------------
    def to_dict(self) -> dict:
        """A JSON-ready dict (sparse fine counts); :meth:`from_dict` inverts it exactly."""
        f = self._fine.cpu().numpy()
        nz = np.nonzero(f)[0]
        return {
            "kmin": KMIN,
            "kmax": KMAX,
            "nstates": NSTATES,
            "amax": self.amax,
            "fine": {str(int(i)): int(f[i]) for i in nz},
        }

    @classmethod
    def from_dict(cls, d: dict) -> Log2Histogram:
        """The histogram :meth:`to_dict` wrote.  Raises TypeError (not such a dict) or ValueError (another bin
        layout)."""
        if not isinstance(d, dict) or "fine" not in d:
            raise TypeError("d must be a dict from Log2Histogram.to_dict()")
        if (d.get("kmin"), d.get("kmax"), d.get("nstates")) != (KMIN, KMAX, NSTATES):
            raise ValueError("d was written with a different bin layout")
        fine = torch.zeros(NFINE, dtype=torch.int64)
        for i, c in d["fine"].items():
            fine[int(i)] = int(c)
        return cls(fine, float(d["amax"]))


def log2_histogram(tensors: torch.Tensor | Iterable[torch.Tensor]) -> Log2Histogram:
    """The :class:`Log2Histogram` of one tensor or of all tensors in an iterable.

    Parameters
    ----------
    tensors : torch.Tensor, numpy.ndarray (floating, any shape), or an iterable of them
        Values are converted to FP32 first (exact for FP16, BF16 and FP32; FP64 values are rounded).
        Counting happens on each tensor's device, in one pass per tensor, without host synchronisation.

    Raises
    ------
    TypeError
        Non-floating tensors, or objects that are not tensors/arrays.
    ValueError
        A meta tensor (a shape without values).
    """
    if isinstance(tensors, (torch.Tensor, np.ndarray)):
        tensors = [tensors]
    if not isinstance(tensors, Iterable):
        raise TypeError(f"tensors must be a tensor, a NumPy array or an iterable of them, got {type(tensors).__name__}")
    h = None
    for t in tensors:
        t = _as_tensor(t)
        if h is None:
            h = Log2Histogram(device=t.device)
        h.add_(t)
    return h if h is not None else Log2Histogram()


def quantile_binade(h: Log2Histogram, q: float) -> int | None:
    """The binade k (2ᵏ ≤ |x| < 2ᵏ⁺¹) holding the ``q``-quantile (0 < q < 1) of the non-zero finite values of
    ``h``; q = 0.5 is :meth:`Log2Histogram.median_binade`.  None when there is none.

    Raises ValueError for q outside (0, 1).
    """
    if not (isinstance(q, (int, float)) and 0 < q < 1):
        raise ValueError(f"q must lie strictly between 0 and 1, got {q!r}")
    cum = np.cumsum(h.counts)
    if cum[-1] == 0:
        return None
    return int(h.exponents[np.searchsorted(cum, cum[-1] * q)])


def lost_share(h: Log2Histogram, shift: int = 0) -> float:
    """Share of all values of ``h`` that FP16 rounds to zero after the gradient shift 2⁻ˢʰⁱᶠᵗ (non-zero values
    with |x · 2⁻ˢʰⁱᶠᵗ| ≤ 2⁻²⁵); NaN for an empty histogram."""
    return float(h.fractions("FP16", scale=2.0**-shift)["underflow"])


def lost_mass(h: Log2Histogram, shift: int = 0) -> float:
    """Share of the gradient *mass* (the sum of |x|) of ``h`` that FP16 rounds to zero after the gradient shift
    2⁻ˢʰⁱᶠᵗ: the values with |x · 2⁻ˢʰⁱᶠᵗ| < 2⁻²⁵ (binades ≤ −26; the few values of exactly 2⁻²⁵ are left out),
    each binade weighted by its count × 2ᵏ⁺⁰·⁵, to a factor 2^±0.5 per value.  Where :func:`lost_share` says how
    many gradients vanish, this says how much of the update does: the softmax gradients (p − y)/N lost in a
    language model are the small p of the unlikely words, and the run is biased by their sum.  NaN without
    non-zero finite values."""
    e = h.exponents
    w = h.counts * np.exp2(e + 0.5)
    total = w.sum()
    return float(w[e - shift <= -26].sum() / total) if total > 0 else float("nan")


def gradient_shares(h: Log2Histogram) -> dict:
    """What the divergence experiments record of a histogram of activation gradients: ``zero_share`` (share of
    values exactly zero), ``fp16_underflow`` (share FP16 flushes to zero: non-zero values with |x| ≤ 2⁻²⁵),
    ``nonfinite`` (share of inf/NaN), all in [0, 1], and ``median_log2`` (:meth:`Log2Histogram.median_binade`:
    the binade k, 2ᵏ ≤ |x| < 2ᵏ⁺¹, of the median non-zero finite value; None when there is none)."""
    if h.total == 0:
        return {"zero_share": 0.0, "fp16_underflow": 0.0, "nonfinite": 0.0, "median_log2": None}
    return {
        "zero_share": float(h.fraction_zero()),
        "fp16_underflow": float(h.fractions("FP16")["underflow"]),
        "nonfinite": float(h.nonfinite) / float(h.total),
        "median_log2": h.median_binade(),
    }


def _list_names(named: dict, limit: int = 30) -> str:
    """The module names of ``model.named_modules()`` for an error message ('' is the model itself)."""
    names = [repr(n) if n else "'' (the model itself)" for n in named]
    more = f", … ({len(names)} in all)" if len(names) > limit else ""
    return ", ".join(names[:limit]) + more


def _grad_tensors(output):
    """The floating tensors that require grad in a module's output: a tensor, or (nested) tuples, lists and
    dict values of them (e.g. an LSTM's ``(out, (h, c))``)."""
    if isinstance(output, torch.Tensor):
        if output.requires_grad and output.is_floating_point():
            yield output
    elif isinstance(output, (tuple, list)):
        for o in output:
            yield from _grad_tensors(o)
    elif isinstance(output, Mapping):
        for o in output.values():
            yield from _grad_tensors(o)


class GradientHistogram:
    """Record log2 histograms of gradients while a model trains (a context manager).

    Parameters
    ----------
    model : torch.nn.Module
    kind : {"activation", "weight"}
        "activation": gradients of the loss with respect to the outputs of the recorded modules (the
        paper's SSD histogram); "weight": gradients with respect to their parameters.
    modules : None, str, iterable of str, or callable(name, module) -> bool
        Which modules to record: by default every leaf module (one without children) for "activation" and
        every parameter for "weight"; names are those of ``model.named_modules()`` (one name as a str:
        ``modules="fc1"``).
    per_module : bool
        Also keep one histogram per module name in :attr:`by_module`.

    Usage::

        with GradientHistogram(model, "activation") as gh:      # recording happens inside the block only
            for batch in data:
                loss = ...; loss.backward(); opt.step()
        gh.histogram.fractions("FP16")

    What the histogram holds is the gradients *as the run computed them*.  In a float32 run they are FP32
    gradients, and ``gh.underflow_share("FP16", scale=S)`` (= ``gh.histogram.fractions("FP16", scale=S)
    ["underflow"]``) is the share of them that a loss scale S and rounding to FP16 would flush to zero: the
    measurement behind the paper's loss scaling (Micikevicius et al. 2018, §3.2: a histogram of activation
    gradients recorded in FP32 training), exact value by value.  Recorded during an FP16 run instead (``torch.autocast(dtype=float16)``
    with a GradScaler, a ``.half()`` model), the activation gradients are float16 tensors: already rounded to
    FP16, values that FP16 flushed are zeros among the true zeros (a ReLU's), and they are S times the true
    gradients.  Their ``fractions("FP16")`` then reports an "underflow" of 0.0 (an FP16 value cannot
    underflow FP16 again) and counts the lost values under "zero"; the weight gradients of FP32 master
    weights are float32 but computed from those FP16 activation gradients, and S times too large.  To
    measure what FP16 loses, record the same model in a float32 run (no autocast, no scaler) and ask
    :meth:`underflow_share` for the format and the scale; it raises ``ValueError`` on float16/bfloat16
    gradients (:attr:`dtypes`).  A run emulated with :mod:`mpt_lab.simulate` holds FP16 values in float32
    tensors: the same caution applies, and the dtype cannot show it.

    What is recorded: "activation" records the gradient of every floating tensor that requires grad in a
    module's output, also inside nested tuples, lists and dict values (an LSTM's ``(out, (h, c))``: out, h and
    c, each when a gradient reaches it); "weight" records each parameter once, even when modules share it
    (tied weights), under the name of the first module holding it.

    ``pause()`` / ``resume()`` stop and restart recording (hooks stay registered); ``reset()`` clears the
    counts.  Recording ends on exit (or :meth:`close`): parameter hooks are removed, and the gradient hooks
    that a forward inside the block put on output tensors stay on those tensors but record nothing once the
    block has exited, also when the block is entered again.  Counting runs on the gradients' device without
    host synchronisation.  For "activation", the forward pass must run inside the block (the hooks are put
    on the outputs it makes).

    Attributes: :attr:`histogram` (all recorded gradients), :attr:`by_module` (with ``per_module``),
    :attr:`calls` (gradient tensors recorded), :attr:`dtypes` (their dtypes, as recorded).  Reading
    :attr:`histogram` or :attr:`by_module` of a recorder that was never started (no ``with``), or whose
    block recorded nothing, warns (``UserWarning``): it holds no value.

    Raises
    ------
    TypeError
        ``model`` is not a Module; ``modules`` is not a str, an iterable of str or a callable.
    ValueError
        Unknown ``kind``; module names that do not exist (the message lists the model's modules); nothing to
        record.
    """

    KINDS = ("activation", "weight")

    def __init__(self, model: torch.nn.Module, kind: str = "activation", modules=None, per_module: bool = False):
        if not isinstance(model, torch.nn.Module):
            raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
        if kind not in self.KINDS:
            raise ValueError(f"kind must be one of {self.KINDS}, got {kind!r}")
        self.model, self.kind, self.per_module = model, kind, bool(per_module)
        named = dict(model.named_modules())
        if modules is None:
            chosen = (
                [n for n, m in named.items() if not any(True for _ in m.children())]
                if kind == "activation"
                else list(named)
            )
        elif callable(modules):
            chosen = [n for n, m in named.items() if modules(n, m)]
        else:
            if isinstance(modules, str):  # one name, not its characters
                modules = [modules]
            if not isinstance(modules, Iterable):
                raise TypeError(
                    "modules must be None, a module name (str), an iterable of names or a callable "
                    f"(name, module) -> bool, got {type(modules).__name__}"
                )
            chosen = list(modules)
            bad = [n for n in chosen if not isinstance(n, str)]
            if bad:
                raise TypeError(f"modules must hold module names (str), got {type(bad[0]).__name__} {bad[0]!r}")
            unknown = [n for n in chosen if n not in named]
            if unknown:
                raise ValueError(
                    f"modules: no module named {', '.join(map(repr, unknown))} in the model; "
                    f"its modules are {_list_names(named)}"
                )
        self.module_names = chosen
        self._named = named
        self._handles: list = []
        self._session = 0  # counts the with-blocks; a hook records only during the block that made it
        self._live: int | None = None
        self.enabled = True
        self.reset()

    # --- state ---------------------------------------------------------------------------------------------
    def reset(self) -> None:
        """Forget everything recorded so far."""
        self._histogram = Log2Histogram()
        self._by_module: dict = {}
        self.calls = 0
        self.dtypes: set = set()

    @property
    def histogram(self) -> Log2Histogram:
        """The :class:`Log2Histogram` of every gradient recorded (since the last :meth:`reset`).  Warns when
        the recorder was never started or its block recorded nothing (see the class docstring)."""
        self._warn_if_unused()
        return self._histogram

    @property
    def by_module(self) -> dict:
        """{module or parameter name: :class:`Log2Histogram`} with ``per_module=True`` (else empty)."""
        self._warn_if_unused()
        return self._by_module

    def _warn_if_unused(self) -> None:
        if self._session == 0:
            warnings.warn(
                f"this GradientHistogram({self.kind!r}) was never started, so it holds nothing: it "
                "records only while active, inside `with GradientHistogram(model, ...) as gh:` (run "
                "the forward and backward passes inside the block)",
                UserWarning,
                stacklevel=3,
            )
        elif self._live is None and self.calls == 0:
            warnings.warn(
                f"this GradientHistogram({self.kind!r}) recorded no gradient: run the forward and "
                "backward passes inside its `with` block (and not while it is paused)",
                UserWarning,
                stacklevel=3,
            )

    def underflow_share(self, fmt: F.FormatLike = "FP16", scale: float = 1.0) -> float:
        """Share of the recorded gradient values (of all of them, zeros included) that multiplying by the loss
        scale ``scale`` and rounding to ``fmt`` flushes to zero: non-zero values that become 0.

        Exactly ``self.histogram.fractions(fmt, scale)["underflow"]``: the same as counting, value by value,
        ``g != 0 and round_to(g * scale, fmt) == 0`` over the recorded gradients ``g`` (round-to-nearest-even).
        Meaningful for gradients recorded in a float32 (or float64) run, as the paper's (§3.2) were;
        see the class docstring for what a recording of an FP16 run holds.

        Parameters
        ----------
        fmt : FloatFormat or str, default "FP16"
            A format with a zero (not E8M0).
        scale : float, default 1.0
            A positive power of two: the loss scale S.

        Returns
        -------
        float in [0, 1]; NaN when nothing was recorded (with the warning of :attr:`histogram`).

        Raises
        ------
        ValueError
            Some recorded gradients were float16 or bfloat16 tensors (recorded during an FP16/BF16 run: values
            that format flushed are zeros already and cannot be told from true zeros); an unknown format or a
            format without zero; a scale that is not a positive power of two.
        TypeError
            ``fmt`` or ``scale`` of the wrong type.
        """
        low = sorted(str(d).replace("torch.", "") for d in self.dtypes if d not in (torch.float32, torch.float64))
        if low:
            raise ValueError(
                f"the recorded gradients include {', '.join(low)} tensors, recorded during a low "
                "precision run: values that format flushed to zero are zeros already and cannot be "
                "told from true zeros, so their underflow share reads 0.  Record the same model in a "
                "float32 run (no autocast, no scaler) and ask underflow_share(fmt, scale=S)"
            )
        return self.histogram.fractions(fmt, scale)["underflow"]

    def pause(self) -> None:
        """Stop recording gradients (the hooks stay in place) until :meth:`resume`."""
        self.enabled = False

    def resume(self) -> None:
        """Record gradients again after :meth:`pause`."""
        self.enabled = True

    def _record(self, name: str, grad: torch.Tensor, session: int) -> None:
        if session != self._live or not self.enabled or grad is None:
            return
        self._histogram.add_(grad)
        self.calls += 1
        self.dtypes.add(grad.dtype)
        if self.per_module:
            self._by_module.setdefault(name, Log2Histogram(device=grad.device)).add_(grad)

    # --- hooks -----------------------------------------------------------------------------------------------
    def _forward_hook(self, name, session: int):
        def hook(module, inputs, output):
            if session != self._live or not self.enabled or not torch.is_grad_enabled():
                return
            for o in {id(o): o for o in _grad_tensors(output)}.values():  # a tensor returned twice: once
                o.register_hook(lambda g, name=name: self._record(name, g, session))

        return hook

    def __enter__(self) -> GradientHistogram:
        if self._handles:
            raise RuntimeError("this GradientHistogram is already recording")
        self._session += 1
        session = self._session
        if self.kind == "activation":
            for n in self.module_names:
                self._handles.append(self._named[n].register_forward_hook(self._forward_hook(n, session)))
        else:
            seen: set[int] = set()  # tied parameters (one tensor in several modules) are recorded once
            for n in self.module_names:
                for pn, p in self._named[n].named_parameters(recurse=False, remove_duplicate=False):
                    if p.requires_grad and id(p) not in seen:
                        seen.add(id(p))
                        name = f"{n}.{pn}" if n else pn
                        self._handles.append(p.register_hook(lambda g, name=name: self._record(name, g, session)))
        if not self._handles:
            raise ValueError("nothing to record: no modules (or trainable parameters) selected")
        self._live = session
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Stop recording and remove the hooks (recorded counts stay)."""
        self._live = None
        for h in self._handles:
            h.remove()
        self._handles = []
