"""The precision recipe, defined once: what a training run does with precision, and the one registry of them.

A *recipe* says, for a whole training run, in which formats the matrix products compute and how gradients and
weights are kept: the autocast dtype (``torch.autocast``), the loss scaling (none, a static S, dynamic), the
formats that the operands of every Linear layer's GEMMs are quantised to when emulated (forward: inputs and
weights; backward: output gradients) and how they are scaled (per tensor, current or delayed; OCP MX or NVFP4
blocks), or a quantisation of its own for each operand of each GEMM (the four-bit recipes); how the weights are
stored between steps (FP32 master weights, or BF16 rounded to nearest or stochastically); across processes, the
wrapper and the dtypes gradients are summed in; and its label and plot style, the same in every chapter.  One
frozen dataclass, :class:`Recipe`, with enums for the modes (as torchao's ``float8``/``mx_formats``
``config.py`` holds every mode as one enum), and one registry, :data:`RECIPES`.

Each experiment trains some of them, named by the tuples below (its Config field for them is ``recipes``):

=====================  ========================================================================================
:data:`AMP`            fp32, fp16, bf16: the PyTorch AMP recipe, the DGL User Guide's GAT (real autocast)
:data:`LOSS_SCALING`   fp32, fp16_unscaled, fp16_static, fp16: the paper's divergence results (bigLSTM, SSD)
:data:`QUANTIZED`      fp32, bf16, fp16, fp8_*, mx*, nvfp4, bf16_sr, bf16_rne: GEMM operands quantised
                       (:mod:`mpt_lab.quantized_training`, chapter 11's comparison)
:data:`DISTRIBUTED`    ddp_* and fsdp_*: DDP and FSDP2 under torchrun (chapter 10)
=====================  ========================================================================================

================  =========  ==========  ==========  ========  =============================================
name              autocast   forward     backward    loss      scaling, and what the weights are
================  =========  ==========  ==========  ========  =============================================
``fp32``          –          –           –           none      nothing quantised (the reference)
``fp16``          float16    FP16        FP16        dynamic   FP32 master weights; FP16 overflows to inf
``fp16_unscaled`` float16    FP16        FP16        none      the same without loss scaling (the paper's
                                                               failing FP16 runs)
``fp16_static``   float16    FP16        FP16        static S  a constant loss scale S (the run chooses S)
``bf16``          bfloat16   BF16        BF16        none      FP32 master weights (BF16 has FP32's range)
``fp8_unscaled``  –          E4M3        E5M2        none      values cast as they are (saturating at ±max)
``fp8_current``   –          E4M3        E5M2        none      per tensor, from this tensor's amax (TE's
                                                               current scaling)
``fp8_delayed``   –          E4M3        E5M2        none      per tensor, from the amax history of earlier
                                                               steps (TE's ``DelayedScaling``, ``HYBRID``)
``mxfp8``         –          E4M3        E4M3        none      OCP MX, blocks of 32 sharing an E8M0 scale
``mxfp6``         –          FP6 E3M2    FP6 E3M2    none      OCP MX, blocks of 32
``mxfp4``         –          FP4 E2M1    FP4 E2M1    none      OCP MX, blocks of 32
``nvfp4``         –          FP4 E2M1    FP4 E2M1    none      blocks of 16 with E4M3 scales and one FP32
                                                               tensor scale
``bf16_sr``       –          BF16        BF16        none      weights stored in BF16 (no FP32 masters),
                                                               every update rounded stochastically
``bf16_rne``      –          BF16        BF16        none      as ``bf16_sr`` with round-to-nearest-even
``ddp_*``,        as named   –           –           as named  DDP (a compression hook or autocast) and FSDP2
``fsdp_*``                                                     (``MixedPrecisionPolicy``): :data:`DISTRIBUTED`
================  =========  ==========  ==========  ========  =============================================

A recipe with ``autocast`` runs under real ``torch.autocast`` where an experiment uses autocast (chapters 6, 8,
9; a CPU emulates FP16 with :mod:`mpt_lab.simulate`); its ``forward`` and ``backward`` formats are what the same
recipe rounds the GEMM operands to where an experiment emulates them (:mod:`mpt_lab.quantized_training`).

Four-bit recipes: a quantisation per GEMM operand
-------------------------------------------------
A recipe can instead say, for each of the three GEMMs (fprop, dgrad, wgrad) and each of its two operands,
how that operand is quantised (:class:`GemmRecipe` of :class:`GemmQuant` of :class:`OperandQuant`: format
BF16, FP8, MX or NVFP4; 1D blocks or 2D tiles; round-to-nearest-even or stochastic rounding), and whether the
GEMM's operands are first rotated by a random Hadamard transform along its reduction dimension
(:class:`~mpt_lab.microscaling.RandomHadamard`).  :func:`four_bit_recipe` builds NVIDIA's NVFP4 training recipe
("Pretraining Large Language Models with NVFP4", arXiv:2509.25149, §4: 2D weights, stochastic rounding of the
gradients, a 16-point random Hadamard transform on the weight-gradient GEMM) and the same recipe less any of
its ingredients; ``Recipe(..., gemms=...)`` takes any other combination.  Such recipes are not in the registry:
pass them to :func:`mpt_lab.quantized_training.quantize_linears_` as objects.

Sources: Micikevicius et al., "Mixed Precision Training" (ICLR 2018) §3 (FP32 master weights, loss scaling);
the PyTorch AMP recipe (autocast + GradScaler); Micikevicius et al., "FP8 Formats for Deep Learning" (2022)
§3–4; Transformer Engine's documentation (current and delayed scaling); OCP Microscaling Formats (MX) v1.0;
NVIDIA, "Pretraining Large Language Models with NVFP4" (arXiv:2509.25149), §4; PyTorch's DDP communication hooks
and FSDP2's ``MixedPrecisionPolicy``.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import torch

from .formats import BF16, FP4_E2M1, FP6_E3M2, FP8_E4M3, FP8_E5M2, FP16, FloatFormat
from .microscaling import BLOCK_LAYOUTS, MX_FORMATS, ROUNDINGS, SCALE_ROUNDINGS, SCHEMES, RandomHadamard

__all__ = [
    "Recipe",
    "TrainingRecipe",
    "LossScaling",
    "TensorScaling",
    "WeightStorage",
    "Distribution",
    "RECIPES",
    "AMP",
    "LOSS_SCALING",
    "QUANTIZED",
    "DISTRIBUTED",
    "get_recipe",
    "renamed",
    "OLD_LOSS_SCALING_NAMES",
    "SCALINGS",
    "WEIGHT_STORAGE",
    "OperandQuant",
    "GemmQuant",
    "GemmRecipe",
    "OPERAND_FORMATS",
    "GEMMS",
    "four_bit_recipe",
]


class LossScaling(str, enum.Enum):
    """How the loss is scaled before backward: not at all, by a constant S (:class:`mpt_lab.scaling.StaticLossScaler`),
    or dynamically (:class:`mpt_lab.scaling.GradScaler`, ``torch.amp.GradScaler``'s contract)."""

    NONE = "none"
    STATIC = "static"
    DYNAMIC = "dynamic"


class TensorScaling(str, enum.Enum):
    """How a quantised GEMM operand is scaled before it is rounded to its format: not at all; per tensor from
    its own amax (current) or from the amax history of earlier steps (delayed); per block of 32 with an E8M0 scale
    (OCP MX); per block of 16 with an E4M3 scale and an FP32 tensor scale (NVFP4)."""

    NONE = "none"
    CURRENT = "current"
    DELAYED = "delayed"
    MX = "mx"
    NVFP4 = "nvfp4"


class WeightStorage(str, enum.Enum):
    """How the weights are kept between steps: FP32 (master weights), or BF16 with every update rounded to
    nearest even or stochastically (no FP32 copy)."""

    FP32 = "fp32"
    BF16_RNE = "bf16_rne"
    BF16_SR = "bf16_sr"


#: The values of :class:`TensorScaling` (the names a recipe's ``scaling`` takes).
SCALINGS = tuple(m.value for m in TensorScaling)
#: The values of :class:`WeightStorage`.
WEIGHT_STORAGE = tuple(m.value for m in WeightStorage)


def _check_str(v, argname: str, choices: tuple) -> str:
    if not isinstance(v, str):
        raise TypeError(f"{argname} must be a str, one of {choices}; got {type(v).__name__}")
    if v not in choices:
        raise ValueError(f"{argname} must be one of {choices}, got {v!r}")
    return v


@dataclass(frozen=True)
class Distribution:
    """How a recipe trains across processes (chapter 10).

    wrapper : "ddp" (``DistributedDataParallel``) or "fsdp" (FSDP2's ``fully_shard``)
    comm : the dtype in which gradients are summed ("float32", "bfloat16", "float16")
    hook : DDP's communication hook ("bf16" → ``bf16_compress_hook``, "fp16" → ``fp16_compress_hook``) or None
    param_dtype, reduce_dtype : FSDP2's ``MixedPrecisionPolicy`` (None: FP32)

    Raises ValueError for a wrapper, dtype or hook outside those named.
    """

    wrapper: str
    comm: str = "float32"
    hook: str | None = None
    param_dtype: str | None = None
    reduce_dtype: str | None = None

    def __post_init__(self):
        _check_str(self.wrapper, "wrapper", ("ddp", "fsdp"))
        for name in ("comm", "param_dtype", "reduce_dtype"):
            v = getattr(self, name)
            if v is not None or name == "comm":
                _check_str(v, name, ("float32", "bfloat16", "float16"))
        if self.hook is not None:
            _check_str(self.hook, "hook", ("bf16", "fp16"))


@dataclass(frozen=True)
class Recipe:
    """A precision recipe: what a training run does with precision (see the module docstring).

    Attributes
    ----------
    name : str, its key in :data:`RECIPES`
    label : str, for legends and tables
    forward, backward : FloatFormat or None
        Format the emulated GEMM operands are rounded to: inputs and weights (forward), output gradients
        (backward); None: not quantised (:mod:`mpt_lab.quantized_training`).
    scaling : :class:`TensorScaling` (or its value), how those operands are scaled
    block_size : int, values per scale for "mx" (32) and "nvfp4" (16); 0 otherwise
    saturate : bool, values beyond ±max clamp to ±max (True, as FP8 casts do) or overflow (FP16: to inf)
    loss_scaling : :class:`LossScaling` (or its value)
    weights : :class:`WeightStorage` (or its value)
    gemms : :class:`GemmRecipe` or None
        A quantisation of its own for each operand of each of the three GEMMs (the four-bit recipes of
        :func:`four_bit_recipe`); when set it decides what is quantised, and ``forward``, ``backward``,
        ``scaling`` and ``block_size`` only describe the recipe (:meth:`describe`, :meth:`bits_per_value`).
    autocast : torch.dtype or None, the dtype ``torch.autocast`` runs the matrix products in (None: no autocast)
    distribution : :class:`Distribution` or None, how the recipe trains across processes
    color, linestyle : its plot style, the same in every chapter (matplotlib colour and line style)

    Raises
    ------
    TypeError / ValueError
        A field of the wrong type or value (named).
    """

    name: str
    label: str
    forward: FloatFormat | None = None
    backward: FloatFormat | None = None
    scaling: TensorScaling = TensorScaling.NONE
    block_size: int = 0
    saturate: bool = True
    loss_scaling: LossScaling = LossScaling.NONE
    weights: WeightStorage = WeightStorage.FP32
    gemms: GemmRecipe | None = None
    autocast: torch.dtype | None = None
    distribution: Distribution | None = None
    color: str = "#333333"
    linestyle: str = "-"

    def __post_init__(self):
        for name in ("name", "label", "color", "linestyle"):
            if not isinstance(getattr(self, name), str):
                raise TypeError(f"{name} must be a str, got {type(getattr(self, name)).__name__}")
        for name, enum_type in (("scaling", TensorScaling), ("loss_scaling", LossScaling), ("weights", WeightStorage)):
            v = getattr(self, name)
            try:
                object.__setattr__(self, name, enum_type(v))
            except ValueError:
                raise ValueError(f"{name} must be one of {tuple(m.value for m in enum_type)}, got {v!r}") from None
        for name in ("forward", "backward"):
            if getattr(self, name) is not None and not isinstance(getattr(self, name), FloatFormat):
                raise TypeError(f"{name} must be a FloatFormat or None, got {type(getattr(self, name)).__name__}")
        if self.autocast not in (None, torch.float16, torch.bfloat16):
            raise ValueError(f"autocast must be None, torch.float16 or torch.bfloat16, got {self.autocast!r}")
        if self.gemms is not None and not isinstance(self.gemms, GemmRecipe):
            raise TypeError(f"gemms must be a GemmRecipe or None, got {type(self.gemms).__name__}")
        if self.distribution is not None and not isinstance(self.distribution, Distribution):
            raise TypeError(f"distribution must be a Distribution or None, got {type(self.distribution).__name__}")
        if not isinstance(self.block_size, int) or isinstance(self.block_size, bool) or self.block_size < 0:
            raise ValueError(f"block_size must be an int ≥ 0, got {self.block_size!r}")

    @property
    def quantized(self) -> bool:
        """Whether the recipe quantises any GEMM operand when emulated (False: a plain-precision recipe)."""
        return self.forward is not None or self.gemms is not None

    @property
    def per_axis(self) -> bool:
        """Whether the quantised values depend on the axis (block scaling)."""
        return self.scaling in (TensorScaling.MX, TensorScaling.NVFP4)

    @property
    def compute_dtype(self) -> str:
        """The dtype the layers compute in, by name: FSDP2's parameter dtype, else the autocast dtype, else
        "float32"."""
        if self.distribution is not None and self.distribution.param_dtype:
            return self.distribution.param_dtype
        return str(self.autocast).replace("torch.", "") if self.autocast is not None else "float32"

    def describe(self) -> dict:
        """The recipe as plain data (format names, scaling, block size, loss scaling, weights, bits per value)."""
        d = {
            "label": self.label,
            "forward": self.forward.name if self.forward else "FP32",
            "backward": self.backward.name if self.backward else "FP32",
            "scaling": self.scaling.value,
            "block_size": self.block_size,
            "loss_scaling": self.loss_scaling.value,
            "weights": self.weights.value,
            "bits": self.bits_per_value(),
        }
        if self.gemms is not None:
            d["gemms"] = self.gemms.describe()
        return d

    def bits_per_value(self) -> float:
        """Storage of a forward operand in bits per value, its scales included (32 for FP32)."""
        if self.forward is None:
            return 32.0
        if self.per_axis:
            return self.forward.bits + 8 / self.block_size  # NVFP4's FP32 tensor scale is negligible
        return float(self.forward.bits)


#: The name :mod:`mpt_lab.quantized_training` has always given the recipe (the same class).
TrainingRecipe = Recipe


# ----------------------------------------------------------------------------------------------------------
# recipes with a quantisation for each operand of each GEMM (four-bit training)
# ----------------------------------------------------------------------------------------------------------
#: What one GEMM operand can be quantised to (:class:`OperandQuant`): "fp32" (left as it is), "bf16" (rounded
#: to BF16), "fp8_e4m3" / "fp8_e5m2" (per-tensor current scaling, Transformer Engine's ``Float8CurrentScaling``),
#: the OCP MX formats ("mxfp8_e4m3", ..., "mxfp4": blocks of 32 with E8M0 scales) and "nvfp4" (blocks of 16
#: with E4M3 scales and an FP32 tensor scale): :data:`mpt_lab.microscaling.SCHEMES`.
OPERAND_FORMATS = ("fp32", "bf16", *SCHEMES)
#: The three GEMMs of a Linear layer, in the order a training step computes them (:class:`GemmRecipe`).
GEMMS = ("fprop", "dgrad", "wgrad")


@dataclass(frozen=True)
class OperandQuant:
    """How one operand of one GEMM is quantised (always along that GEMM's reduction dimension).

    Attributes
    ----------
    format : one of :data:`OPERAND_FORMATS` (default "fp32": not quantised; every other format saturates at
        its ±max)
    blocks : "1d" or "2d" (:data:`~mpt_lab.microscaling.BLOCK_LAYOUTS`)
        Block formats only: "2d" scales square tiles of the matrix (16 × 16 for NVFP4, 32 × 32 for MX), so
        that the operand quantised along either dimension has the same values (NVIDIA, "Pretraining Large
        Language Models with NVFP4", arXiv:2509.25149, §4.3: the weights).
    rounding : "nearest_even" or "stochastic" (:data:`~mpt_lab.microscaling.ROUNDINGS`)
        How the elements are rounded; stochastic rounding draws from the
        :class:`~mpt_lab.quantized_training.Quantizer`'s generator (§4.4 of the same paper: the gradients).
    scale_rounding : the MX shared-scale rule (:data:`~mpt_lab.microscaling.SCALE_ROUNDINGS`; MX formats only)

    Raises
    ------
    TypeError / ValueError
        A field of the wrong type or value (named), or ``blocks="2d"`` for a format without blocks.
    """

    format: str = "fp32"
    blocks: str = "1d"
    rounding: str = "nearest_even"
    scale_rounding: str = "floor"

    def __post_init__(self):
        _check_str(self.format, "format", OPERAND_FORMATS)
        _check_str(self.blocks, "blocks", BLOCK_LAYOUTS)
        _check_str(self.rounding, "rounding", ROUNDINGS)
        _check_str(self.scale_rounding, "scale_rounding", SCALE_ROUNDINGS)
        if self.blocks == "2d" and not self.block_scaled:
            raise ValueError(f"blocks='2d' needs a block format (MX or NVFP4), got format {self.format!r}")
        if self.format == "fp32" and self.rounding != "nearest_even":
            raise ValueError("format 'fp32' is not rounded: rounding must be 'nearest_even'")

    @property
    def block_scaled(self) -> bool:
        """Whether the format scales blocks (MX, NVFP4) rather than the whole tensor."""
        return self.format == "nvfp4" or self.format.upper() in MX_FORMATS

    @property
    def axis_free(self) -> bool:
        """Whether the quantised values are the same along either dimension of a matrix (per-tensor formats and
        2D blocks), so that one quantised copy serves both of its GEMMs."""
        return not self.block_scaled or self.blocks == "2d"

    def describe(self) -> str:
        """A short label, e.g. "NVFP4 2D", "NVFP4 SR", "FP32"."""
        if self.format == "fp32":
            return "FP32"
        parts = [self.format.upper()]
        if self.blocks == "2d":
            parts.append("2D")
        if self.rounding == "stochastic":
            parts.append("SR")
        if self.format.upper() in MX_FORMATS and self.scale_rounding != "floor":
            parts.append(self.scale_rounding)
        return " ".join(parts)


@dataclass(frozen=True)
class GemmQuant:
    """One GEMM of a Linear layer, C = A · Bᵀ with the reduction over the last dimension of A and of B: how A
    and B are quantised, and whether both are first rotated by a random Hadamard transform of blocks of
    ``hadamard`` values along that dimension (0: not; NVIDIA's recipe: 16 on the weight-gradient GEMM only,
    arXiv:2509.25149, §4.2; :class:`~mpt_lab.microscaling.RandomHadamard`).

    Raises TypeError / ValueError for operands that are no :class:`OperandQuant`, or a ``hadamard`` that is
    not 0 or a power of two.
    """

    a: OperandQuant = OperandQuant()
    b: OperandQuant = OperandQuant()
    hadamard: int = 0

    def __post_init__(self):
        for name in ("a", "b"):
            if not isinstance(getattr(self, name), OperandQuant):
                raise TypeError(f"{name} must be an OperandQuant, got {type(getattr(self, name)).__name__}")
        if not isinstance(self.hadamard, int) or isinstance(self.hadamard, bool):
            raise TypeError(f"hadamard must be an int (0: no transform), got {type(self.hadamard).__name__}")
        if self.hadamard:
            RandomHadamard(self.hadamard)  # raises for a size that is no power of two

    def describe(self) -> str:
        """One line: the two operands' quantisation and the random Hadamard transform's block size, if any."""
        h = f", RHT {self.hadamard}" if self.hadamard else ""
        return f"{self.a.describe()} × {self.b.describe()}{h}"


@dataclass(frozen=True)
class GemmRecipe:
    """The quantisation of the three GEMMs of every Linear layer (x: input (M, K), w: weight (N, K),
    g = ∂loss/∂y: output gradient (M, N); M counts the tokens)::

        fprop   y  = Q(x) · Q(w)ᵀ        A = x,  B = w,  reduction over K
        dgrad   gx = Q(g) · Q(wᵀ)ᵀ       A = g,  B = wᵀ, reduction over N
        wgrad   gw = Q(gᵀ) · Q(xᵀ)ᵀ      A = gᵀ, B = xᵀ, reduction over M

    Each GEMM is a :class:`GemmQuant` (its A and B operands, and an optional random Hadamard transform of both);
    the products accumulate in FP32.  ``hadamard_seed`` seeds the sign vector of every transform: one sign
    vector for all layers and all steps, as NVIDIA's recipe (arXiv:2509.25149, §4.2).

    Emulation: each operand is quantised exactly and dequantised to float32 (element × block scale × tensor
    scale, rounded once to float32: exact for MX, and for NVFP4 whenever the tensor scale is a power of two),
    and the product is a float32 matrix product.  A Blackwell GEMM instead applies the block scales to partial
    dot products and the tensor scales to the result (Appendix B.3, Eq. 5); the two differ by float32 roundings
    (relative 2⁻²⁴ per operand value), never by the quantisation itself.

    Raises TypeError for GEMMs that are no :class:`GemmQuant` or a seed that is no int ≥ 0.
    """

    fprop: GemmQuant = GemmQuant()
    dgrad: GemmQuant = GemmQuant()
    wgrad: GemmQuant = GemmQuant()
    hadamard_seed: int = 0

    def __post_init__(self):
        for name in GEMMS:
            if not isinstance(getattr(self, name), GemmQuant):
                raise TypeError(f"{name} must be a GemmQuant, got {type(getattr(self, name)).__name__}")
        if not isinstance(self.hadamard_seed, int) or isinstance(self.hadamard_seed, bool) or self.hadamard_seed < 0:
            raise TypeError(f"hadamard_seed must be an int ≥ 0, got {self.hadamard_seed!r}")

    def describe(self) -> dict:
        """GEMM name → a short label of its operands, e.g. {"fprop": "NVFP4 × NVFP4 2D", ...}."""
        return {name: getattr(self, name).describe() for name in GEMMS}


def four_bit_recipe(
    fmt: str = "nvfp4",
    *,
    hadamard: bool = True,
    weights_2d: bool = True,
    stochastic_gradients: bool = True,
    hadamard_block: int | None = None,
    hadamard_seed: int = 0,
    scale_rounding: str = "floor",
    sr_scale_rounding: str = "rceil",
    name: str | None = None,
    label: str | None = None,
) -> Recipe:
    """NVIDIA's four-bit training recipe for every quantised Linear layer, or the recipe less some of its
    ingredients (NVIDIA, "Pretraining Large Language Models with NVFP4", arXiv:2509.25149, §4)::

        fprop   Q(x) 1×16, round to nearest    ·  Q(w) 16×16 (2D), round to nearest
        dgrad   Q(g) 1×16, stochastic          ·  Q(wᵀ) 16×16 (2D), round to nearest
        wgrad   Q(gᵀ) 1×16, stochastic         ·  Q(xᵀ) 1×16, round to nearest;  both after a random
                                                   Hadamard transform of 16 values along the tokens

    "Use two-dimensional (2D) scaling over 16×16 blocks for weights, and one-dimensional scaling over 1×16
    blocks for activations and gradients"; "Use stochastic rounding for gradients and round-to-nearest-even
    for weights and activations"; "Apply Random Hadamard transforms of size 16×16 to inputs of weight gradient
    GEMMs" (§4).  The fourth ingredient, "a few sensitive linear layers in higher precision" (the last ones),
    is a choice of layers: leave them out with ``quantize_linears_(model, recipe, skip=...)`` and give them a
    BF16 recipe with a second ``quantize_linears_(model, "bf16")`` (:mod:`mpt_lab.quantized_training`).

    Parameters
    ----------
    fmt : "nvfp4" or "mxfp4"
        MXFP4 (blocks of 32, E8M0 scales) with the same methodology, the Hadamard size 32 (the paper's §5).
    hadamard, weights_2d, stochastic_gradients : bool
        Each ingredient on (the recipe) or off (an ablation): off means no transform, weights in 1 × 16 (1 × 32)
        blocks like the other operands, gradients rounded to nearest.
    hadamard_block : None (16 for NVFP4, 32 for MXFP4) or a power of two
    hadamard_seed : int ≥ 0, the seed of the one sign vector (:class:`GemmRecipe`)
    scale_rounding, sr_scale_rounding : MXFP4 only, the shared-scale rule of the operands rounded to nearest and
        of those rounded stochastically.  OCP's "floor" lets a block's largest values reach 8 and saturate at 6,
        which would bias stochastic rounding; "rceil" (the smallest power of two that saturates nothing; the
        NVFP4 paper's Appendix B.4 on MXFP4) keeps it unbiased, as Tseng et al.'s multiplication by 3/4 does
        (arXiv:2502.20586).
    name, label : default from the ingredients, e.g. "nvfp4_recipe", "nvfp4_recipe-rht" (no Hadamard)

    Returns
    -------
    Recipe with ``gemms`` set (forward and backward FP4 E2M1, scaling "nvfp4" or "mx", for its
    description); pass it to :func:`mpt_lab.quantized_training.quantize_linears_`.

    Raises
    ------
    TypeError / ValueError
        fmt not "nvfp4" or "mxfp4"; a flag not a bool; a bad hadamard_block, seed or scale rule.
    """
    fmt = _check_str(fmt, "fmt", ("nvfp4", "mxfp4"))
    for argname, v in (
        ("hadamard", hadamard),
        ("weights_2d", weights_2d),
        ("stochastic_gradients", stochastic_gradients),
    ):
        if not isinstance(v, bool):
            raise TypeError(f"{argname} must be a bool, got {type(v).__name__}")
    block = 16 if fmt == "nvfp4" else 32
    d = (block if hadamard_block is None else hadamard_block) if hadamard else 0
    grad_rounding = "stochastic" if stochastic_gradients else "nearest_even"

    def op(blocks="1d", rounding="nearest_even"):
        rule = sr_scale_rounding if rounding == "stochastic" else scale_rounding
        return OperandQuant(fmt, blocks, rounding, rule if fmt == "mxfp4" else "floor")

    w = op("2d" if weights_2d else "1d")
    gemms = GemmRecipe(
        fprop=GemmQuant(op(), w),
        dgrad=GemmQuant(op(rounding=grad_rounding), w),
        wgrad=GemmQuant(op(rounding=grad_rounding), op(), hadamard=d),
        hadamard_seed=hadamard_seed,
    )
    missing = [tag for tag, on in (("rht", hadamard), ("2d", weights_2d), ("sr", stochastic_gradients)) if not on]
    name = name if name is not None else f"{fmt}_recipe" + "".join(f"-{m}" for m in missing)
    if label is None:
        label = f"{fmt.upper()} recipe" + (f" without {', '.join(m.upper() for m in missing)}" if missing else "")
    return Recipe(name, label, FP4_E2M1, FP4_E2M1, "nvfp4" if fmt == "nvfp4" else "mx", block, gemms=gemms)


_FP16, _BF16 = torch.float16, torch.bfloat16
_DYNAMIC, _STATIC = LossScaling.DYNAMIC, LossScaling.STATIC


def _registry() -> dict:
    r = [
        # plain precision, real autocast or emulated: chapters 6, 8, 9, 11
        Recipe("fp32", "FP32", color="#1f77b4", linestyle="-"),
        Recipe(
            "fp16",
            "FP16 + dynamic loss scaling",
            FP16,
            FP16,
            saturate=False,
            loss_scaling=_DYNAMIC,
            autocast=_FP16,
            color="#d62728",
            linestyle="--",
        ),
        Recipe(
            "fp16_unscaled",
            "FP16, no loss scaling",
            FP16,
            FP16,
            saturate=False,
            autocast=_FP16,
            color="#ff7f0e",
            linestyle="-.",
        ),
        Recipe(
            "fp16_static",
            "FP16, static loss scale",
            FP16,
            FP16,
            saturate=False,
            loss_scaling=_STATIC,
            autocast=_FP16,
            color="#e377c2",
            linestyle=":",
        ),
        Recipe("bf16", "BF16", BF16, BF16, autocast=_BF16, color="#2ca02c", linestyle=":"),
        # quantised GEMM operands, emulated: chapter 11
        Recipe("fp8_unscaled", "FP8, no scaling", FP8_E4M3, FP8_E5M2, color="#7f7f7f"),
        Recipe("fp8_current", "FP8, current scaling", FP8_E4M3, FP8_E5M2, "current", color="#9467bd"),
        Recipe("fp8_delayed", "FP8, delayed scaling", FP8_E4M3, FP8_E5M2, "delayed", color="#c5b0d5", linestyle="--"),
        Recipe("mxfp8", "MXFP8 (E4M3)", FP8_E4M3, FP8_E4M3, "mx", 32, color="#8c564b"),
        Recipe("mxfp6", "MXFP6 (E3M2)", FP6_E3M2, FP6_E3M2, "mx", 32, color="#e377c2"),
        Recipe("mxfp4", "MXFP4 (E2M1)", FP4_E2M1, FP4_E2M1, "mx", 32, color="#ff7f0e"),
        Recipe("nvfp4", "NVFP4", FP4_E2M1, FP4_E2M1, "nvfp4", 16, color="#bcbd22"),
        Recipe(
            "bf16_sr",
            "BF16 weights, stochastic rounding",
            BF16,
            BF16,
            weights="bf16_sr",
            color="#98df8a",
            linestyle="--",
        ),
        Recipe(
            "bf16_rne", "BF16 weights, round to nearest", BF16, BF16, weights="bf16_rne", color="#17becf", linestyle=":"
        ),
        # across processes: chapter 10 (DDP solid, FSDP2 dashed; coloured by the 16-bit format involved)
        Recipe("ddp_fp32", "DDP, FP32 all-reduce", distribution=Distribution("ddp"), color="#1f77b4"),
        Recipe(
            "ddp_bf16_hook",
            "DDP + bf16_compress_hook",
            distribution=Distribution("ddp", "bfloat16", "bf16"),
            color="#2ca02c",
        ),
        Recipe(
            "ddp_fp16_hook",
            "DDP + fp16_compress_hook",
            distribution=Distribution("ddp", "float16", "fp16"),
            color="#d62728",
        ),
        Recipe(
            "ddp_amp_fp16",
            "DDP, FP16 autocast + GradScaler",
            loss_scaling=_DYNAMIC,
            autocast=_FP16,
            distribution=Distribution("ddp"),
            color="#d62728",
        ),
        Recipe("fsdp_fp32", "FSDP2, FP32", distribution=Distribution("fsdp"), color="#1f77b4", linestyle="--"),
        Recipe(
            "fsdp_bf16_fp32",
            "FSDP2, param BF16 / reduce FP32",
            distribution=Distribution("fsdp", param_dtype="bfloat16", reduce_dtype="float32"),
            color="#2ca02c",
            linestyle="--",
        ),
        Recipe(
            "fsdp_bf16_bf16",
            "FSDP2, param BF16 / reduce BF16",
            distribution=Distribution("fsdp", "bfloat16", param_dtype="bfloat16", reduce_dtype="bfloat16"),
            color="#2ca02c",
            linestyle="--",
        ),
        Recipe(
            "fsdp_fp16_fp32",
            "FSDP2, param FP16 / reduce FP32 + GradScaler",
            loss_scaling=_DYNAMIC,
            distribution=Distribution("fsdp", param_dtype="float16", reduce_dtype="float32"),
            color="#d62728",
            linestyle="--",
        ),
    ]
    return {x.name: x for x in r}


#: Every precision recipe of the book, by name: the one registry (the module docstring's table).
RECIPES: dict[str, Recipe] = _registry()

#: The recipes of the AMP experiments (the PyTorch AMP recipe, the DGL User Guide's GAT), in the order of their
#: tables: FP32; FP16 autocast + GradScaler; BF16 autocast.
AMP = ("fp32", "fp16", "bf16")
#: The recipes of the paper's divergence results (bigLSTM, SSD's Table 2): FP32; mixed FP16 without loss scaling,
#: with a static loss scale S, with dynamic loss scaling.
LOSS_SCALING = ("fp32", "fp16_unscaled", "fp16_static", "fp16")
#: The recipes whose GEMM operands :mod:`mpt_lab.quantized_training` quantises, in the order of chapter 11's tables.
QUANTIZED = (
    "fp32",
    "bf16",
    "fp16",
    "fp8_unscaled",
    "fp8_current",
    "fp8_delayed",
    "mxfp8",
    "mxfp6",
    "mxfp4",
    "nvfp4",
    "bf16_sr",
    "bf16_rne",
)
#: The recipes across processes (chapter 10), in the order of its legend.
DISTRIBUTED = (
    "ddp_fp32",
    "ddp_bf16_hook",
    "ddp_fp16_hook",
    "ddp_amp_fp16",
    "fsdp_fp32",
    "fsdp_bf16_fp32",
    "fsdp_bf16_bf16",
    "fsdp_fp16_fp32",
)


#: Recipe names in results saved before the one registry: the divergence experiments (bigLSTM, SSD's Table 2)
#: called mixed FP16 without loss scaling "fp16" and with dynamic loss scaling "fp16_dynamic" (the registry's
#: "fp16", as everywhere else).  Their Result classes read old results with these names mapped (:func:`renamed`).
OLD_LOSS_SCALING_NAMES = {"fp16": "fp16_unscaled", "fp16_dynamic": "fp16"}


def renamed(obj: dict | list | str, names: dict[str, str]) -> dict | list | str:
    """``obj`` with every recipe name that ``names`` maps replaced at once (old → new; the keys of a dict, the
    items of a list, or a str), for reading results saved under old names.  Raises TypeError for anything else."""
    if isinstance(obj, dict):
        return {names.get(k, k): v for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [names.get(x, x) for x in obj]
    if isinstance(obj, str):
        return names.get(obj, obj)
    raise TypeError(f"obj must be a dict, a list or a str, got {type(obj).__name__}")


def get_recipe(recipe: str | Recipe) -> Recipe:
    """A :class:`Recipe` from itself or its name in :data:`RECIPES`.  Raises TypeError / ValueError naming
    ``recipe``."""
    if isinstance(recipe, Recipe):
        return recipe
    if not isinstance(recipe, str):
        raise TypeError(f"recipe must be a str or a Recipe, got {type(recipe).__name__}")
    if recipe not in RECIPES:
        raise ValueError(f"recipe must be one of {tuple(RECIPES)}, got {recipe!r}")
    return RECIPES[recipe]
