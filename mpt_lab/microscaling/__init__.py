"""Scaled low-precision quantisation: per-tensor FP8 scaling, OCP MX block scaling and NVFP4, exactly.

A tensor is stored in a narrow format together with scale factors that bring its values into the format's
range.  Three families, each written from its source, each in its own module with its exact quantiser (codes)
and its fast twin (the same values, bit for bit, without codes) side by side:

====================  ==================================================================================
scaling               what is stored, and the source
====================  ==================================================================================
per-tensor, current   :func:`quantize_per_tensor`: q = fl32(x·scale) rounded to FP8 (saturating), one FP32
                      scale per tensor, scale = (fmt.max / amax) / 2^margin (Transformer Engine)
per-tensor, delayed   :class:`DelayedScaling`: the same, with the scale computed from the amax history of
                      the steps before (Transformer Engine's ``DelayedScaling`` recipe)
MX block scaling      :func:`quantize_mx` → :class:`MXTensor`, :func:`fake_quantize_mx`: blocks of 32 values
                      along one axis share an E8M0 scale 2^k; elements in FP8 E4M3/E5M2, FP6 E3M2/E2M3 or
                      FP4 E2M1 (OCP Microscaling Formats (MX) Specification v1.0, §5 and §6.3)
NVFP4                 :func:`quantize_nvfp4` → :class:`NVFP4Tensor`, :func:`fake_quantize_nvfp4`: blocks of
                      16 FP4 E2M1 values share an FP8 E4M3 scale, and the tensor has one FP32 scale
                      (NVIDIA's two-level scaling)
====================  ==================================================================================

Three ingredients of four-bit training (NVIDIA, "Pretraining Large Language Models with NVFP4",
arXiv:2509.25149; Tseng et al., arXiv:2502.20586; Castro et al., "Quartet", arXiv:2505.14669), as options of
the block quantisers and one transform: ``blocks="2d"`` (:data:`BLOCK_LAYOUTS`: one scale per 16 × 16 tile of a
matrix, so that quantising the transpose gives the transpose), ``rounding="stochastic"`` (:data:`ROUNDINGS`:
elements rounded stochastically, unbiased), on :func:`quantize_nvfp4`, :func:`quantize_mx`, their fast twins
and :func:`quantize_per_tensor`; and :class:`RandomHadamard` (:mod:`~mpt_lab.microscaling.hadamard`), the
random Hadamard transform of blocks of 16 values applied before quantising.

The modules: :mod:`~mpt_lab.microscaling.per_tensor`, :mod:`~mpt_lab.microscaling.mx`,
:mod:`~mpt_lab.microscaling.nvfp4`, :mod:`~mpt_lab.microscaling.hadamard`; :mod:`~mpt_lab.microscaling.analysis`
(what quantisation loses:
:func:`quantization_error`, the statistics of a training run, error against block size and scale format, one
scale against one per tensor); :mod:`~mpt_lab.microscaling.schemes` (:func:`quantize` and
:func:`fake_quantize` by name, :data:`SCHEMES`); the block helpers, argument checks and element rounding they
all share live in one internal module, ``_core``.  Every result turns back into a tensor with
``.dequantize()``.  Training with these quantisers (which tensors of a model get which format: a recipe) is
:mod:`mpt_lab.quantized_training`.

Exactness
---------
Elements are rounded with :mod:`mpt_lab.formats` (round-to-nearest-even with saturation); block scales come
from integer arithmetic on the bits of amax; dividing by a power-of-two scale is exact.  Per-tensor scaling
multiplies by a scale that is not a power of two: the product is rounded to float32 first, then to the
format, as Transformer Engine's cast does (:mod:`~mpt_lab.microscaling.per_tensor`).  For FP8 elements and
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

Every function takes torch tensors (CPU or CUDA; float16, bfloat16, float32 or float64; the fast twins
float16, bfloat16 or float32).
"""

from ._core import BLOCK_LAYOUTS, ROUNDINGS
from .analysis import (
    add_counts,
    block_scale_comparison,
    block_size_sweep,
    layer_stats,
    mean_over_layers,
    new_counts,
    one_scale_vs_per_tensor,
    quantization_error,
    snr_db,
)
from .hadamard import HADAMARD_BLOCK_SIZE, RandomHadamard, hadamard_matrix
from .mx import E8M0_NAN, MX_ELEMENT_FORMATS, MX_FORMATS, SCALE_ROUNDINGS, MXTensor, fake_quantize_mx, quantize_mx
from .nvfp4 import NVFP4_BLOCK_SIZE, NVFP4Tensor, fake_quantize_nvfp4, quantize_nvfp4
from .per_tensor import DelayedScaling, ScaledTensor, quantize_per_tensor, scale_from_amax
from .schemes import SCHEMES, fake_quantize, quantize

__all__ = [
    "quantize_per_tensor",
    "scale_from_amax",
    "ScaledTensor",
    "DelayedScaling",
    "quantize_mx",
    "fake_quantize_mx",
    "MXTensor",
    "quantize_nvfp4",
    "fake_quantize_nvfp4",
    "NVFP4Tensor",
    "quantization_error",
    "snr_db",
    "new_counts",
    "add_counts",
    "layer_stats",
    "block_size_sweep",
    "block_scale_comparison",
    "mean_over_layers",
    "one_scale_vs_per_tensor",
    "quantize",
    "fake_quantize",
    "SCHEMES",
    "MX_ELEMENT_FORMATS",
    "MX_FORMATS",
    "SCALE_ROUNDINGS",
    "E8M0_NAN",
    "NVFP4_BLOCK_SIZE",
    "RandomHadamard",
    "hadamard_matrix",
    "HADAMARD_BLOCK_SIZE",
    "BLOCK_LAYOUTS",
    "ROUNDINGS",
]
