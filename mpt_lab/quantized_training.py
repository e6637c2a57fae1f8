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
For MX and NVFP4 blocks, the fast twins :func:`~mpt_lab.microscaling.fake_quantize_mx` and
:func:`~mpt_lab.microscaling.fake_quantize_nvfp4` compute the dequantised values of
:func:`~mpt_lab.microscaling.quantize_mx` and :func:`~mpt_lab.microscaling.quantize_nvfp4` without forming
codes: the same values bit for bit, four (E4M3) to ten (FP6, FP4) times faster on a CPU, which is what makes a
CPU training run in MXFP4 affordable.

Statistics
----------
On the steps where ``quantizer.recording`` is True, block recipes quantise with :mod:`mpt_lab.microscaling`'s
own objects (the same values), whose ``saturated()`` says which values saturated, and per layer and role ("x":
the input, "w": the weight, "g": the output gradient) the :class:`Quantizer` accumulates: values, non-zero
values, non-zero values that became zero (underflow), values beyond the range of their scale (saturated:
clamped to ±max or overflowed, as
``ScaledTensor.saturated`` / ``MXTensor.saturated`` define it), non-finite results, and the sums of x² and of
(Q(x) − x)² (the signal-to-noise ratio): :func:`mpt_lab.microscaling.add_counts`, and
:func:`mpt_lab.microscaling.layer_stats` reads them.  For block recipes the statistics are those of the forward
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

from dataclasses import dataclass

import torch
from torch import nn

from . import formats as F
from .formats import BF16, FP16, FP4_E2M1, FP6_E3M2, FP8_E4M3, FP8_E5M2, FloatFormat
from .microscaling import (SCALE_ROUNDINGS, DelayedScaling, ScaledTensor, add_counts, fake_quantize_mx,
                           fake_quantize_nvfp4, new_counts, quantize_mx, quantize_nvfp4, quantize_per_tensor)

__all__ = ["TrainingRecipe", "TRAINING_RECIPES", "SCALINGS", "WEIGHT_STORAGE", "get_recipe", "Quantizer",
           "QuantLinear", "quantize_linears_", "quantized_layers", "round_weights_", "ROLES", "hardware_fp8_available"]

#: How a recipe scales a tensor before rounding it to its format.
SCALINGS = ("none", "current", "delayed", "mx", "nvfp4")
#: How the weights are stored between steps: FP32 (master weights), or BF16 rounded to nearest / stochastically.
WEIGHT_STORAGE = ("fp32", "bf16_rne", "bf16_sr")
#: The operands of a Linear layer that a recipe quantises: its input, its weight, its output gradient.
ROLES = ("x", "w", "g")


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
        """Whether the recipe quantises the forward operands (False: a plain-precision recipe)."""
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
    stats : dict layer → role → counts (see the module docstring; :func:`~mpt_lab.microscaling.layer_stats`
        turns them into shares)
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

    def _record(self, layer: str, role: str, t: torch.Tensor, tq: torch.Tensor, saturated: torch.Tensor) -> None:
        add_counts(self.stats.setdefault(layer, {}).setdefault(role, new_counts()), t, tq, saturated)

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
