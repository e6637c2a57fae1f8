"""Training with quantised matrix products: FP8 per-tensor scaling, OCP MX and NVFP4 block scaling, emulated.

FP8 training does not run a whole network in 8 bits.  It quantises the operands of the matrix products of the
Linear layers (Transformer Engine's ``te.Linear``, torchao's ``Float8Linear``), computes the products with a
wide accumulator, and keeps everything else (normalisation, softmax, residual additions, the loss, the
optimizer) in higher precision.  :func:`quantize_linears_` does that to any PyTorch model: each ``nn.Linear``
becomes a :class:`QuantLinear` whose autograd function fake-quantises (quantises and dequantises, exactly, with
:mod:`mpt_lab.microscaling` and :mod:`mpt_lab.formats`) what a low-precision GEMM would read, and computes the
products in FP32.  For ``y = x @ w.t() + b`` with x: (M, K), w: (N, K), output gradient g: (M, N)::

    forward     y  = Q_f(x, along K) @ Q_f(w, along K).t()  + b      (fprop)
    backward    gx = Q_b(g, along N) @ Q_f(w, along N)               (dgrad)
                gw = Q_b(g, along M).t() @ Q_f(x, along M)            (wgrad)
                gb = g.sum(0)                                         (from the unquantised gradient)

Q_f uses the recipe's forward format (inputs and weights), Q_b its backward format (output gradients).  Every
operand is quantised along the reduction axis of the product that reads it, which is what block scaling
needs (an MX block must lie along the dot product; Transformer Engine's MXFP8 recipe keeps a row-wise and a
column-wise copy of each tensor for that reason); for per-tensor scaling the axis does not matter and each
tensor is quantised once.  Inputs with more than two dimensions (batch, time, features) are flattened to
(M, K) first.

Recipes (:data:`TRAINING_RECIPES`)
----------------------------------
================  ==========  ==========  ===============================================================
name              forward     backward    scaling, and what the weights are
================  ==========  ==========  ===============================================================
``fp32``          –           –           nothing quantised (the reference)
``bf16``          BF16        BF16        none (BF16 has FP32's range); FP32 master weights
``fp16``          FP16        FP16        none, overflow to inf; the loss scaled by a dynamic
                                          :class:`~mpt_lab.scaling.GradScaler`
``fp8_unscaled``  E4M3        E5M2        none: values cast as they are (saturating at ±max)
``fp8_current``   E4M3        E5M2        per tensor, from this tensor's amax (TE's current scaling)
``fp8_delayed``   E4M3        E5M2        per tensor, from the amax history of earlier steps
                                          (TE's ``DelayedScaling``, ``Format.HYBRID``)
``mxfp8``         E4M3        E4M3        OCP MX, blocks of 32 sharing an E8M0 scale
``mxfp6``         FP6 E3M2    FP6 E3M2    OCP MX, blocks of 32
``mxfp4``         FP4 E2M1    FP4 E2M1    OCP MX, blocks of 32
``nvfp4``         FP4 E2M1    FP4 E2M1    blocks of 16 with E4M3 scales and one FP32 tensor scale
``bf16_sr``       BF16        BF16        as ``bf16``, but the weights are stored in BF16 (no FP32
                                          masters) and every update is rounded stochastically
``bf16_rne``      BF16        BF16        as ``bf16_sr`` with round-to-nearest-even updates
================  ==========  ==========  ===============================================================

FP16 and BF16 take the same path as the FP8 recipes (their inputs, weights and output gradients are rounded
with :func:`mpt_lab.formats.round_to`, through :func:`mpt_lab.microscaling.quantize_per_tensor` with the scale
fixed at 1), not :mod:`mpt_lab.simulate`: then every recipe quantises exactly the same tensors, and the
comparison is about the format and its scaling alone.

Exactness and speed
-------------------
Per-tensor recipes call :func:`~mpt_lab.microscaling.quantize_per_tensor` and
:class:`~mpt_lab.microscaling.DelayedScaling` directly; ``fp8_current`` gives the same outputs and gradients,
bit for bit, as torchao's ``Float8Linear`` (tensorwise dynamic scaling, ``emulate=True``; a test checks it).
For MX and NVFP4 blocks, :func:`fake_quantize_mx` and :func:`fake_quantize_nvfp4` compute the dequantised
values of :func:`~mpt_lab.microscaling.quantize_mx` and :func:`~mpt_lab.microscaling.quantize_nvfp4` without
forming codes (the scales from the bits of each block's amax, the elements with
:func:`~mpt_lab.formats.round_to`): the same values bit for bit (the tests compare them on random, tied,
subnormal, zero, infinite and NaN blocks), four (E4M3) to ten (FP6, FP4) times faster on a CPU, which is what
makes a CPU training run in MXFP4 affordable.

Statistics
----------
On the steps where ``quantizer.recording`` is True, block recipes quantise with :mod:`mpt_lab.microscaling`'s
own objects (the same values), whose ``saturated()`` says which values saturated, and per layer and role ("x":
the input, "w": the weight, "g": the output gradient) the :class:`Quantizer` accumulates: values, non-zero
values, non-zero values that became zero (underflow), values beyond the range of their scale (saturated:
clamped to ±max or overflowed, as
``ScaledTensor.saturated`` / ``MXTensor.saturated`` define it), non-finite results, and the sums of x² and of
(Q(x) − x)² (the signal-to-noise ratio).  For block recipes the statistics are those of the forward
quantisation of x and w (along K) and of the dgrad quantisation of g (along N).

On CUDA GPUs of compute capability 8.9 and above (H100, L40, RTX 40…), ``hardware=True`` computes the FP8
per-tensor products with the GPU's FP8 tensor cores, ``torch._scaled_mm`` (see :mod:`mpt_lab._torch_internals`),
from the same quantised operands; products whose sizes the hardware does not take (dimensions not multiples of
16) fall back to the emulation and are counted.

Sources: Micikevicius et al., "FP8 Formats for Deep Learning" (2022), §3–4 (E4M3 forward, E5M2 backward,
per-tensor scaling); Transformer Engine documentation, "Using FP8 with Transformer Engine" (delayed scaling,
amax history, margin); OCP Microscaling Formats (MX) Specification v1.0 and Rouhani et al., "Microscaling Data
Formats for Deep Learning" (2023); NVIDIA's NVFP4 (two-level scaling).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from . import formats as F
from .formats import BF16, FP16, FP4_E2M1, FP6_E3M2, FP8_E4M3, FP8_E5M2, FloatFormat
from .microscaling import (SCALE_ROUNDINGS, DelayedScaling, ScaledTensor, quantize_mx, quantize_nvfp4,
                           quantize_per_tensor)

__all__ = ["TrainingRecipe", "TRAINING_RECIPES", "SCALINGS", "WEIGHT_STORAGE", "get_recipe", "Quantizer",
           "QuantLinear", "quantize_linears_", "quantized_layers", "fake_quantize_mx", "fake_quantize_nvfp4",
           "round_weights_", "layer_stats", "block_size_sweep", "block_scale_comparison", "one_scale_vs_per_tensor",
           "mean_over_layers", "ROLES", "hardware_fp8_available"]

#: How a recipe scales a tensor before rounding it to its format.
SCALINGS = ("none", "current", "delayed", "mx", "nvfp4")
#: How the weights are stored between steps: FP32 (master weights), or BF16 rounded to nearest / stochastically.
WEIGHT_STORAGE = ("fp32", "bf16_rne", "bf16_sr")
#: The operands of a Linear layer that a recipe quantises: its input, its weight, its output gradient.
ROLES = ("x", "w", "g")
_ROLE_WORDS = {"x": "activations (inputs)", "w": "weights", "g": "output gradients"}


@dataclass(frozen=True)
class TrainingRecipe:
    """What a training recipe does to the operands of every Linear layer's matrix products.

    Attributes
    ----------
    name : str, the key in :data:`TRAINING_RECIPES`
    label : str, for legends
    forward, backward : FloatFormat or None
        Format of inputs and weights (forward), and of output gradients (backward); None: not quantised.
    scaling : one of :data:`SCALINGS`
    block_size : int, values per scale for "mx" (32) and "nvfp4" (16); 0 otherwise
    saturate : bool, values beyond ±max clamp to ±max (True, as FP8 casts do) or overflow (FP16: to inf)
    loss_scaling : "none" or "dynamic" (:class:`~mpt_lab.scaling.GradScaler` on the loss)
    weights : one of :data:`WEIGHT_STORAGE`
    """

    name: str
    label: str
    forward: FloatFormat | None = None
    backward: FloatFormat | None = None
    scaling: str = "none"
    block_size: int = 0
    saturate: bool = True
    loss_scaling: str = "none"
    weights: str = "fp32"

    @property
    def quantized(self) -> bool:
        return self.forward is not None

    @property
    def per_axis(self) -> bool:
        """Whether the quantised values depend on the axis (block scaling)."""
        return self.scaling in ("mx", "nvfp4")

    def describe(self) -> dict:
        """The recipe as plain data (format names, scaling, block size, weights)."""
        return {"label": self.label, "forward": self.forward.name if self.forward else "FP32",
                "backward": self.backward.name if self.backward else "FP32", "scaling": self.scaling,
                "block_size": self.block_size, "loss_scaling": self.loss_scaling, "weights": self.weights,
                "bits": self.bits_per_value()}

    def bits_per_value(self) -> float:
        """Storage of a forward operand in bits per value, its scales included (32 for FP32)."""
        if self.forward is None:
            return 32.0
        if self.scaling == "mx":
            return self.forward.bits + 8 / self.block_size
        if self.scaling == "nvfp4":
            return self.forward.bits + 8 / self.block_size     # the FP32 tensor scale is negligible
        return float(self.forward.bits)


def _recipes() -> dict:
    r = [TrainingRecipe("fp32", "FP32"),
         TrainingRecipe("bf16", "BF16", BF16, BF16),
         TrainingRecipe("fp16", "FP16 + GradScaler", FP16, FP16, saturate=False, loss_scaling="dynamic"),
         TrainingRecipe("fp8_unscaled", "FP8, no scaling", FP8_E4M3, FP8_E5M2),
         TrainingRecipe("fp8_current", "FP8, current scaling", FP8_E4M3, FP8_E5M2, "current"),
         TrainingRecipe("fp8_delayed", "FP8, delayed scaling", FP8_E4M3, FP8_E5M2, "delayed"),
         TrainingRecipe("mxfp8", "MXFP8 (E4M3)", FP8_E4M3, FP8_E4M3, "mx", 32),
         TrainingRecipe("mxfp6", "MXFP6 (E3M2)", FP6_E3M2, FP6_E3M2, "mx", 32),
         TrainingRecipe("mxfp4", "MXFP4 (E2M1)", FP4_E2M1, FP4_E2M1, "mx", 32),
         TrainingRecipe("nvfp4", "NVFP4", FP4_E2M1, FP4_E2M1, "nvfp4", 16),
         TrainingRecipe("bf16_sr", "BF16 weights, stochastic rounding", BF16, BF16, weights="bf16_sr"),
         TrainingRecipe("bf16_rne", "BF16 weights, round to nearest", BF16, BF16, weights="bf16_rne")]
    return {x.name: x for x in r}


#: The recipes by name (see the module docstring's table).
TRAINING_RECIPES: dict[str, TrainingRecipe] = _recipes()


def get_recipe(recipe) -> TrainingRecipe:
    """A :class:`TrainingRecipe` from itself or its name.  Raises TypeError / ValueError naming ``recipe``."""
    if isinstance(recipe, TrainingRecipe):
        return recipe
    if not isinstance(recipe, str):
        raise TypeError(f"recipe must be a str or a TrainingRecipe, got {type(recipe).__name__}")
    if recipe not in TRAINING_RECIPES:
        raise ValueError(f"recipe must be one of {tuple(TRAINING_RECIPES)}, got {recipe!r}")
    return TRAINING_RECIPES[recipe]


# ----------------------------------------------------------------------------------------------------------
# fast fake quantisation, equal to mpt_lab.microscaling's bit for bit
# ----------------------------------------------------------------------------------------------------------
def _check_float_tensor(x, argname: str = "x") -> torch.Tensor:
    if not isinstance(x, torch.Tensor) or not x.is_floating_point():
        raise TypeError(f"{argname} must be a floating torch.Tensor, got {type(x).__name__}")
    if x.dim() == 0:
        raise ValueError(f"{argname} must have at least one dimension to be split into blocks")
    return x.detach()


def _blocks(x: torch.Tensor, block_size: int, axis: int) -> tuple[torch.Tensor, tuple]:
    """x (float32) with ``axis`` last, zero-padded to whole blocks, as (blocks, block_size), and how to undo it."""
    xm = x.movedim(axis, -1)
    n = xm.shape[-1]
    pad = -n % block_size
    if pad:
        xm = nn.functional.pad(xm, (0, pad))
    return xm.reshape(-1, block_size), (tuple(xm.shape), n)


def _unblocks(y: torch.Tensor, layout: tuple, axis: int, dtype: torch.dtype) -> torch.Tensor:
    shape, n = layout
    return y.reshape(shape)[..., :n].movedim(-1, axis).to(dtype).contiguous()


def _pow2_f32(k: torch.Tensor) -> torch.Tensor:
    """2^k as float32 for integers k in [−149, 127], exactly (built from float64 bits)."""
    return ((k.to(torch.int64) + 1023) << 52).view(torch.float64).to(torch.float32)


def _axis(axis, ndim: int) -> int:
    if not isinstance(axis, int) or isinstance(axis, bool):
        raise TypeError(f"axis must be an int, got {type(axis).__name__}")
    if not -ndim <= axis < ndim:
        raise ValueError(f"axis must lie in [{-ndim}, {ndim}) for a {ndim}-d tensor, got {axis}")
    return axis % ndim


@F.exact_arithmetic
def fake_quantize_mx(x, fmt, block_size: int = 32, axis: int = -1, *, scale_rounding: str = "floor") -> torch.Tensor:
    """``quantize_mx(x, fmt, block_size, axis, scale_rounding=...).dequantize()`` for float32 (or narrower) x,
    computed without codes: the same values bit for bit, four to ten times faster on a CPU.

    Per block of ``block_size`` values along ``axis`` (OCP MX v1.0 §6.3): the E8M0 code c of the shared scale
    from the biased exponent field E and mantissa field M of the block's amax (float32 bits: c = E − emax,
    plus one for the "ceil", "even" and "rceil" rules when M says so, clamped to [0, 254]), X = 2^(c − 127);
    each value becomes round_to(v · 2^(127 − c), fmt, saturate=True) · X (both products exact).  A block
    holding inf or NaN becomes NaN.

    Parameters
    ----------
    x : floating tensor (float16, bfloat16 or float32; float64 is refused: its MX scale uses float64 bits)
    fmt : an MX element format (FP8_E4M3, FP8_E5M2, FP6_E3M2, FP6_E2M3, FP4_E2M1)
    block_size : int ≥ 1
    axis : int
    scale_rounding : one of :data:`mpt_lab.microscaling.SCALE_ROUNDINGS`

    Returns
    -------
    Tensor of x's shape, dtype and device, no autograd history.

    Raises
    ------
    TypeError, ValueError
        A bad x, fmt, block_size, axis or scale_rounding, each named.
    """
    x = _check_float_tensor(x)
    if x.dtype == torch.float64:
        raise TypeError("x must be float16, bfloat16 or float32 (use mpt_lab.microscaling.quantize_mx for float64)")
    fmt = F.get_format(fmt)
    from .microscaling import MX_ELEMENT_FORMATS

    if fmt not in MX_ELEMENT_FORMATS:
        raise ValueError(f"fmt must be an MX element format {[f.name for f in MX_ELEMENT_FORMATS]}, got {fmt.name}")
    if not isinstance(block_size, int) or isinstance(block_size, bool) or block_size < 1:
        raise ValueError(f"block_size must be an int ≥ 1, got {block_size!r}")
    if scale_rounding not in SCALE_ROUNDINGS:
        raise ValueError(f"scale_rounding must be one of {SCALE_ROUNDINGS}, got {scale_rounding!r}")
    axis = _axis(axis, x.dim())
    xb, layout = _blocks(x.to(torch.float32), block_size, axis)
    bits = xb.abs().amax(1).view(torch.int32)           # |amax| bits; NaN blocks give a NaN amax
    e = bits >> 23
    nan = e == 255
    c = e - fmt.emax
    if scale_rounding != "floor":
        mant = bits & ((1 << 23) - 1)
        if scale_rounding == "ceil":
            c = c + (mant != 0).to(torch.int32)
        elif scale_rounding == "even":
            c = c + (mant >= (1 << 23) - (1 << (23 - fmt.mantissa_bits - 1))).to(torch.int32)
        else:
            c = c + (mant > int((fmt.max / 2.0 ** fmt.emax - 1) * (1 << 23))).to(torch.int32)
    c = c.clamp(0, 254)
    inv = ((254 - c.clamp(max=253)) << 23).view(torch.float32)            # 2^(127 − c), exact
    any_nan = bool(nan.any())
    if any_nan:                                                            # FP6/FP4 have no NaN: zero them first
        xb = xb.masked_fill(nan[:, None], 0.0)
    elem = F.round_to(xb * inv[:, None], fmt, saturate=True)
    y = elem * _pow2_f32(c - 127)[:, None]
    if any_nan:
        y[nan] = math.nan
    return _unblocks(y, layout, axis, x.dtype)


@F.exact_arithmetic
def fake_quantize_nvfp4(x, *, axis: int = -1) -> torch.Tensor:
    """``quantize_nvfp4(x, axis=axis).dequantize()`` for float32 (or narrower) x, without codes: the same
    values bit for bit, faster.

    NVIDIA's two-level scaling in float32: tensor scale s_t = fl32(amax / (448 · 6)) over the finite values
    (1 when that is zero or not finite); per block of 16: s_b = E4M3(clamp(fl32(fl32(amax_b / 6) / s_t),
    2⁻⁶, 448)); elements round_to(fl32(v · fl32(fl32(1 / s_t) / s_b)), FP4_E2M1, saturate=True); value =
    element × s_b × s_t, rounded once to x's dtype.  Blocks holding inf or NaN become NaN.

    Raises TypeError / ValueError for a bad x or axis.
    """
    x = _check_float_tensor(x)
    if x.dtype == torch.float64:
        raise TypeError("x must be float16, bfloat16 or float32 (use mpt_lab.microscaling.quantize_nvfp4 for float64)")
    axis = _axis(axis, x.dim())
    x32 = x.to(torch.float32)
    amax = x32.abs().amax() if x32.numel() else x32.new_zeros(())
    if not bool(torch.isfinite(amax)):                                     # the amax of the finite values
        amax = torch.where(torch.isfinite(x32), x32, torch.zeros_like(x32)).abs().amax()
    st = amax / (FP8_E4M3.max * FP4_E2M1.max)
    ok = torch.isfinite(st) & (st > 0) & torch.isfinite(1.0 / st)
    st = torch.where(ok, st, torch.ones_like(st))
    xb, layout = _blocks(x32, 16, axis)
    bamax = xb.abs().amax(1)
    nan = ~torch.isfinite(bamax)
    s = (bamax / FP4_E2M1.max / st).clamp_(FP8_E4M3.smallest_normal, FP8_E4M3.max).masked_fill_(nan, 1.0)
    sb = F.round_to(s, FP8_E4M3)
    r = (1.0 / st) / sb
    any_nan = bool(nan.any())
    if any_nan:                                                            # FP4 has no NaN: zero them first
        xb = xb.masked_fill(nan[:, None], 0.0)
    elem = F.round_to(xb * r[:, None], FP4_E2M1, saturate=True)
    y = (elem * sb[:, None]) * st          # element × s_b is exact; × s_t rounds once, as float64 then float32
    if any_nan:
        y[nan] = math.nan
    return _unblocks(y, layout, axis, x.dtype)


# ----------------------------------------------------------------------------------------------------------
# the quantizer: one per model, shared by its QuantLinear layers
# ----------------------------------------------------------------------------------------------------------
def hardware_fp8_available(device=None) -> bool:
    """Whether ``device`` (default: the current CUDA device) is a CUDA GPU with FP8 tensor cores (compute
    capability ≥ 8.9) and torch has ``_scaled_mm``."""
    if not torch.cuda.is_available():
        return False
    device = torch.device("cuda") if device is None else torch.device(device)
    if device.type != "cuda":
        return False
    from ._torch_internals import scaled_mm

    return scaled_mm is not None and torch.cuda.get_device_capability(device) >= (8, 9)


def _new_stats() -> dict:
    return {"n": 0, "nonzero": 0, "underflow": 0, "saturated": 0, "nonfinite": 0, "signal": 0.0, "noise": 0.0}


class Quantizer:
    """The quantisation state of one model: its recipe, the delayed-scaling histories, the statistics.

    Parameters
    ----------
    recipe : name or :class:`TrainingRecipe`
    history_len, margin, amax_compute_algo : the delayed-scaling settings (``fp8_delayed``; see
        :class:`~mpt_lab.microscaling.DelayedScaling`)
    scale_rounding : the MX shared-scale rule (``"floor"``: OCP MX v1.0)
    hardware : bool, compute FP8 per-tensor products with ``torch._scaled_mm`` on a GPU that has FP8 tensor
        cores (ignored elsewhere; :attr:`hardware` says whether it is in use)

    Attributes
    ----------
    enabled : bool, False makes every :class:`QuantLinear` a plain FP32 Linear (e.g. to evaluate in FP32)
    recording : bool, accumulate statistics (set it on the steps you want measured)
    stats : dict layer → role → counts (see the module docstring; :func:`layer_stats` turns them into shares)
    delayed : the :class:`~mpt_lab.microscaling.DelayedScaling` of ``fp8_delayed`` (None otherwise)
    gemms : dict "hardware" / "emulated" → number of products computed each way
    """

    def __init__(self, recipe, *, history_len: int = 16, margin: int = 0, amax_compute_algo: str = "max",
                 scale_rounding: str = "floor", hardware: bool = False):
        self.recipe = get_recipe(recipe)
        if scale_rounding not in SCALE_ROUNDINGS:
            raise ValueError(f"scale_rounding must be one of {SCALE_ROUNDINGS}, got {scale_rounding!r}")
        if not isinstance(hardware, bool):
            raise TypeError(f"hardware must be a bool, got {type(hardware).__name__}")
        self.scale_rounding = scale_rounding
        self.delayed = None
        if self.recipe.scaling == "delayed":
            self.delayed = DelayedScaling(history_len, margin, self.recipe.forward, self.recipe.backward,
                                          amax_compute_algo=amax_compute_algo)
        self.enabled = True
        self.recording = False
        self.stats: dict = {}
        self.gemms = {"hardware": 0, "emulated": 0}
        fp8 = self.recipe.forward in (FP8_E4M3, FP8_E5M2) and self.recipe.backward in (FP8_E4M3, FP8_E5M2)
        self.hardware = bool(hardware and fp8 and not self.recipe.per_axis and hardware_fp8_available())
        self.layers: list[str] = []

    def __repr__(self) -> str:
        return (f"Quantizer({self.recipe.name!r}, layers={len(self.layers)}, enabled={self.enabled}, "
                f"hardware={self.hardware})")

    def step(self) -> None:
        """End a training step: the delayed-scaling histories advance (call it after ``optimizer.step()``)."""
        if self.delayed is not None:
            self.delayed.update()

    # --- quantising one operand ---------------------------------------------------------------------------
    def quantize(self, t: torch.Tensor, layer: str, role: str, *, axis: int = -1, record: bool = True,
                 update: bool = True):
        """The fake-quantised ``t`` (float32, t's shape) as operand ``role`` of ``layer``, blocks along ``axis``,
        and for per-tensor recipes its :class:`~mpt_lab.microscaling.ScaledTensor` (None for block recipes).

        ``fp8_delayed`` casts with the stale scale of ``layer.role``; with ``update`` (training) it records the
        amax in the history, without (evaluation) it leaves the history alone.  When :attr:`recording` and
        ``record`` are set, the statistics of (layer, role) are accumulated.
        """
        r = self.recipe
        fmt = r.backward if role == "g" else r.forward
        t = t.detach()
        record = record and self.recording
        if r.per_axis:
            if not record:
                tq = (fake_quantize_mx(t, fmt, r.block_size, axis, scale_rounding=self.scale_rounding)
                      if r.scaling == "mx" else fake_quantize_nvfp4(t, axis=axis))
                return tq, None
            obj = (quantize_mx(t, fmt, r.block_size, axis, scale_rounding=self.scale_rounding)
                   if r.scaling == "mx" else quantize_nvfp4(t, axis=axis))
            tq = obj.dequantize(torch.float32)
            self._record(layer, role, t, tq, obj.saturated(t))
            return tq, None
        if r.scaling == "delayed":
            name = f"{layer}.{role}"
            if update:
                q, scale = self.delayed.quantize(t, name, backward=role == "g")
            else:                       # evaluation: the stale scale, as DelayedScaling casts, nothing recorded
                scale = torch.tensor(self.delayed.scale(name) if name in self.delayed.names else 1.0)
                q = F.round_to(t.to(torch.float32) * scale.to(t.device), fmt, saturate=r.saturate)
        elif r.scaling == "current":
            q, scale = quantize_per_tensor(t, fmt, saturate=r.saturate)
        else:                                                   # "none": the scale is 1
            q, scale = quantize_per_tensor(t, fmt, amax=fmt.max, saturate=r.saturate)
        st = ScaledTensor(q, scale, fmt, torch.float32)
        tq = st.dequantize()
        if record:
            self._record(layer, role, t, tq, st.saturated(t))
        return tq, st

    @F.exact_arithmetic
    def _record(self, layer: str, role: str, t: torch.Tensor, tq: torch.Tensor, saturated: torch.Tensor) -> None:
        s = self.stats.setdefault(layer, {}).setdefault(role, _new_stats())
        t64, q64 = t.to(torch.float64), tq.to(torch.float64)
        fin = torch.isfinite(q64) & torch.isfinite(t64)
        nz = t64 != 0
        s["n"] += t.numel()
        s["nonzero"] += int(nz.sum())
        s["underflow"] += int((nz & (q64 == 0)).sum())
        s["saturated"] += int(saturated.sum())
        s["nonfinite"] += int((torch.isfinite(t64) & ~torch.isfinite(q64)).sum())
        s["signal"] += float(torch.where(fin, t64 * t64, torch.zeros_like(t64)).sum())
        d = torch.where(fin, q64 - t64, torch.zeros_like(t64))
        s["noise"] += float((d * d).sum())

    # --- the products -------------------------------------------------------------------------------------
    def matmul(self, a: torch.Tensor, b: torch.Tensor, sa: ScaledTensor | None = None,
               sb: ScaledTensor | None = None, *, ta: bool = False, tb: bool = False) -> torch.Tensor:
        """op(a) @ op(b) (op: transpose where ``ta`` / ``tb``) in FP32 from the dequantised operands, or, with
        :attr:`hardware`, on FP8 tensor cores from their scaled tensors ``sa``, ``sb`` (same layout as a, b)."""
        A, B = (a.t() if ta else a), (b.t() if tb else b)
        if self.hardware and sa is not None and sb is not None and A.is_cuda and _hw_shapes_ok(A, B):
            self.gemms["hardware"] += 1
            return _scaled_mm_product(sa, ta, sb, tb)
        self.gemms["emulated"] += 1
        return A @ B


def _hw_shapes_ok(a: torch.Tensor, b: torch.Tensor) -> bool:
    """FP8 tensor-core products take dimensions that are multiples of 16."""
    return a.shape[0] % 16 == 0 and a.shape[1] % 16 == 0 and b.shape[1] % 16 == 0


_FLOAT8 = {"FP8_E4M3": torch.float8_e4m3fn, "FP8_E5M2": torch.float8_e5m2}


def _scaled_mm_product(sa: ScaledTensor, ta: bool, sb: ScaledTensor, tb: bool) -> torch.Tensor:
    """op(qa / scale_a) @ op(qb / scale_b) with ``torch._scaled_mm``: FP8 operands (the first row-major, the
    second column-major), the decode scales 1/scale, an FP32 result."""
    from ._torch_internals import scaled_mm

    qa = sa.q.t() if ta else sa.q
    qb = sb.q.t() if tb else sb.q
    fa = qa.contiguous().to(_FLOAT8[sa.fmt.name])                  # row-major
    fb = qb.t().contiguous().to(_FLOAT8[sb.fmt.name]).t()          # column-major
    one = torch.ones((), dtype=torch.float32, device=fa.device)
    return scaled_mm(fa, fb, scale_a=one / sa.scale.to(fa.device), scale_b=one / sb.scale.to(fa.device),
                     out_dtype=torch.float32)


# ----------------------------------------------------------------------------------------------------------
# the quantised Linear
# ----------------------------------------------------------------------------------------------------------
class _QuantLinearFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, layer):
        q = layer.quantizer
        x2 = x.reshape(-1, x.shape[-1]).to(torch.float32)
        xq, xs = q.quantize(x2, layer.name, "x", axis=-1)
        wq, ws = q.quantize(weight, layer.name, "w", axis=-1)
        y = q.matmul(xq, wq, xs, ws, tb=True)
        if bias is not None:
            y = y + bias
        ctx.layer, ctx.has_bias, ctx.shape = layer, bias is not None, x.shape
        ctx.scaled = (xs, ws)
        ctx.save_for_backward(*((x2, weight) if q.recipe.per_axis else (xq, wq)))
        return y.reshape(*x.shape[:-1], weight.shape[0])

    @staticmethod
    def backward(ctx, gy):
        layer = ctx.layer
        q = layer.quantizer
        a, b = ctx.saved_tensors
        g = gy.reshape(-1, gy.shape[-1]).to(torch.float32)
        if q.recipe.per_axis:                   # block scaling: each operand along its product's reduction axis
            gq_n, _ = q.quantize(g, layer.name, "g", axis=-1)                            # dgrad: over N
            wq_n, _ = q.quantize(b, layer.name, "w", axis=0, record=False)
            gx = gq_n @ wq_n
            gq_m, _ = q.quantize(g, layer.name, "g", axis=0, record=False)               # wgrad: over M
            xq_m, _ = q.quantize(a, layer.name, "x", axis=0, record=False)
            gw = gq_m.t() @ xq_m
        else:                                   # per tensor: the forward casts are reused
            xs, ws = ctx.scaled
            gq, gs = q.quantize(g, layer.name, "g")
            gx = q.matmul(gq, b, gs, ws)
            gw = q.matmul(gq, a, gs, xs, ta=True)
        gb = g.sum(0) if ctx.has_bias else None
        return gx.reshape(ctx.shape), gw, gb, None


def _quant_linear_eval(x, weight, bias, layer) -> torch.Tensor:
    """The forward of a :class:`QuantLinear` without autograd: quantised operands, no statistics, and the
    delayed-scaling histories left alone (evaluation)."""
    q = layer.quantizer
    x2 = x.reshape(-1, x.shape[-1]).to(torch.float32)
    xq, xs = q.quantize(x2, layer.name, "x", record=False, update=False)
    wq, ws = q.quantize(weight, layer.name, "w", record=False, update=False)
    y = q.matmul(xq, wq, xs, ws, tb=True)
    if bias is not None:
        y = y + bias
    return y.reshape(*x.shape[:-1], weight.shape[0])


class QuantLinear(nn.Module):
    """An ``nn.Linear`` whose products read quantised operands (see the module docstring).

    It shares the Linear's ``weight`` and ``bias`` Parameters (an optimizer made before the swap keeps
    working).  Input (..., in_features), output (..., out_features), float32.

    Parameters
    ----------
    linear : nn.Linear
    name : str, the layer's name in the statistics (its module path)
    quantizer : :class:`Quantizer`
    """

    def __init__(self, linear: nn.Linear, name: str, quantizer: Quantizer):
        super().__init__()
        if not isinstance(linear, nn.Linear):
            raise TypeError(f"linear must be an nn.Linear, got {type(linear).__name__}")
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight = linear.weight
        self.bias = linear.bias
        self.name = name
        self.quantizer = quantizer

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
                f"recipe={self.quantizer.recipe.name!r}")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.quantizer.enabled or not self.quantizer.recipe.quantized:
            return nn.functional.linear(x, self.weight, self.bias)
        if torch.is_grad_enabled() and (x.requires_grad or self.weight.requires_grad):
            return _QuantLinearFn.apply(x, self.weight, self.bias, self)
        with torch.no_grad():
            return _quant_linear_eval(x, self.weight, self.bias, self)


def quantize_linears_(model: nn.Module, recipe, *, skip=(), **quantizer_options) -> Quantizer:
    """Replace every ``nn.Linear`` of ``model`` (in place) by a :class:`QuantLinear` of ``recipe``.

    Parameters
    ----------
    model : nn.Module
    recipe : name or :class:`TrainingRecipe` (``"fp32"`` swaps the layers too, and they compute in FP32)
    skip : names (module paths) of Linear layers to leave alone (e.g. a model's output layer)
    quantizer_options : passed to :class:`Quantizer` (``history_len``, ``margin``, ``scale_rounding``,
        ``hardware``, ...)

    Returns
    -------
    The :class:`Quantizer` the layers share; its ``layers`` lists the swapped layers in module order.

    Raises
    ------
    TypeError
        ``model`` is not an nn.Module; ``skip`` not a sequence of str.
    ValueError
        Unknown recipe, or a name in ``skip`` that is no Linear of the model.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
    if isinstance(skip, str) or not all(isinstance(s, str) for s in skip):
        raise TypeError("skip must be a sequence of module names (str)")
    quantizer = Quantizer(recipe, **quantizer_options)
    linears = [(n, m) for n, m in model.named_modules() if isinstance(m, nn.Linear)]
    unknown = set(skip) - {n for n, _ in linears}
    if unknown:
        raise ValueError(f"skip names {sorted(unknown)}, which are not Linear layers of the model")
    for name, lin in linears:
        if name in skip:
            continue
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, QuantLinear(lin, name, quantizer))
        quantizer.layers.append(name)
    return quantizer


def quantized_layers(model: nn.Module) -> list:
    """The :class:`QuantLinear` layers of a model, in module order."""
    return [m for m in model.modules() if isinstance(m, QuantLinear)]


# ----------------------------------------------------------------------------------------------------------
# weights stored in BF16
# ----------------------------------------------------------------------------------------------------------
@torch.no_grad()
def round_weights_(params, rounding: str = "stochastic", *, fmt=BF16, generator: torch.Generator | None = None) -> None:
    """Round parameters in place to ``fmt`` (default BF16): weights *stored* in BF16, without FP32 masters.

    Call it after ``optimizer.step()``: the step adds its FP32 update to the BF16 weight and this rounds the
    sum back.  With ``rounding="nearest_even"`` an update smaller than half an ulp of the weight is lost (the
    stall of chapter 4); with ``"stochastic"`` the weight moves up with probability equal to the fraction of an
    ulp, so E[w_new] = w + update exactly (:func:`mpt_lab.formats.round_to`), from ``generator``
    (reproducible: the same generator state gives the same weights).

    Raises TypeError / ValueError for bad parameters, rounding or format.
    """
    params = list(params)
    if not all(isinstance(p, torch.Tensor) and p.is_floating_point() for p in params):
        raise TypeError("params must be floating tensors (a model's parameters)")
    for p in params:
        p.copy_(F.round_to(p.detach(), fmt, rounding=rounding, generator=generator))


# ----------------------------------------------------------------------------------------------------------
# reading the statistics
# ----------------------------------------------------------------------------------------------------------
def _snr(signal: float, noise: float) -> float:
    if noise > 0:
        return 10.0 * math.log10(signal / noise) if signal > 0 else -math.inf
    return math.inf if signal > 0 else math.nan


def layer_stats(stats: dict) -> dict:
    """Shares and SNR from the counts of :attr:`Quantizer.stats` (or a result's ``stats``).

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
            acc = total.setdefault(role, _new_stats())
            for k in acc:
                acc[k] += s[k]
    out["all"] = {role: _shares(s) for role, s in total.items()}
    return out


def _shares(s: dict) -> dict:
    n, nz = s["n"], s["nonzero"]
    return {"underflow": s["underflow"] / nz if nz else 0.0, "saturated": s["saturated"] / n if n else 0.0,
            "nonfinite": s["nonfinite"] / n if n else 0.0, "snr_db": _snr(s["signal"], s["noise"])}


# ----------------------------------------------------------------------------------------------------------
# error against block size, E8M0 against FP32 scales, one scale against one per tensor
# ----------------------------------------------------------------------------------------------------------
def _snr_of(x: torch.Tensor, xq: torch.Tensor) -> float:
    x64, q64 = x.to(torch.float64), xq.to(torch.float64)
    return _snr(float((x64 * x64).sum()), float(((q64 - x64) ** 2).sum()))


def _by_tensor_and_format(tensors: dict, formats, row) -> dict:
    """name → format name → row(tensor as float32, format), for a dict of tensors (TypeError otherwise)."""
    if not isinstance(tensors, dict) or not tensors:
        raise TypeError("tensors must be a non-empty dict of name → tensor")
    fmts = [F.get_format(f, "formats") for f in formats]
    return {name: {fmt.name: row(_check_float_tensor(t, f"tensors[{name!r}]").to(torch.float32), fmt) for fmt in fmts}
            for name, t in tensors.items()}


@F.exact_arithmetic
def block_size_sweep(tensors: dict, formats=("FP8_E4M3", "FP8_E5M2", "FP6_E3M2", "FP6_E2M3", "FP4_E2M1"),
                     block_sizes=(8, 16, 32, 64, 128, 256)) -> dict:
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
    whole tensor (the flattened tensor as a single block)}, computed with :func:`fake_quantize_mx` (equal to
    :func:`mpt_lab.microscaling.quantize_mx`'s values; OCP's floor rule).
    """
    def row(t: torch.Tensor, fmt: FloatFormat) -> dict:
        out = {str(bs): _snr_of(t, fake_quantize_mx(t, fmt, bs, -1)) for bs in block_sizes}
        flat = t.reshape(-1)
        out["tensor"] = _snr_of(flat, fake_quantize_mx(flat, fmt, flat.numel(), -1))
        return out

    return _by_tensor_and_format(tensors, formats, row)


@F.exact_arithmetic
def block_scale_comparison(tensors: dict, formats=("FP8_E4M3", "FP6_E3M2", "FP4_E2M1"), block_size: int = 32) -> dict:
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
        xb, layout = _blocks(t, block_size, -1)
        amax = xb.abs().amax(1, keepdim=True)
        scale = torch.where(amax > 0, torch.tensor(fmt.max, dtype=torch.float32) / amax, torch.ones_like(amax))
        fq = F.round_to(xb * scale, fmt, saturate=True).to(torch.float64) / scale.to(torch.float64)
        out = {"e8m0": _snr_of(t, fake_quantize_mx(t, fmt, block_size, -1)),
               "fp32": _snr_of(t, _unblocks(fq.to(torch.float32), layout, t.dim() - 1, torch.float32))}
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
    return {fmt: {k: (sum(x for x in v if math.isfinite(x)) / max(1, sum(math.isfinite(x) for x in v))
                      if any(math.isfinite(x) for x in v) else math.nan) for k, v in row.items()}
            for fmt, row in acc.items()}


def one_scale_vs_per_tensor(histograms: dict, fmt="FP8_E5M2") -> dict:
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
    values that underflow to zero}.
    """
    from .histogram import Log2Histogram

    if not isinstance(histograms, dict) or not histograms or \
            not all(isinstance(h, Log2Histogram) for h in histograms.values()):
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

    rows = {}
    for name, h in histograms.items():
        s = h.max_scale(fmt)
        rows[name] = {"amax_log2": math.frexp(h.amax)[1] - 1 if h.amax > 0 else None,
                      "per_tensor_log2": int(math.log2(s)) if math.isfinite(s) else None,
                      "lost_one_scale": lost(h, s_all) if math.isfinite(s_all) else 0.0,
                      "lost_per_tensor": lost(h, s) if math.isfinite(s) else 0.0}
    return {"format": fmt.name, "one_scale": int(math.log2(s_all)) if math.isfinite(s_all) else None,
            "tensors": rows}
