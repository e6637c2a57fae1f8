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

Recipes
-------
What each recipe quantises (forward format: inputs and weights; backward format: output gradients; the scaling;
how the weights are stored) is defined once, in :mod:`mpt_lab.recipes` (:class:`~mpt_lab.recipes.Recipe`, the
registry :data:`~mpt_lab.recipes.RECIPES`, the four-bit recipes of :func:`~mpt_lab.recipes.four_bit_recipe` with a
quantisation per GEMM operand).  :data:`TRAINING_RECIPES` is the registry's view of the recipes chapter 11's
experiment runs one by one; any :class:`~mpt_lab.recipes.Recipe`, registered or not, can be passed to
:func:`quantize_linears_`.  The products accumulate in FP32; stochastic rounding draws from the
:class:`Quantizer`'s generator (seeded: reproducible).

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
Formats for Deep Learning" (2023); NVIDIA's NVFP4 (two-level scaling); NVIDIA, "Pretraining Large Language
Models with NVFP4" (arXiv:2509.25149, 2025), §4 and Appendix B–E (the four-bit recipe); Tseng et al., "Training
LLMs with MXFP4" (arXiv:2502.20586) and Castro et al., "Quartet" (arXiv:2505.14669) (stochastic rounding and
Hadamard transforms for MXFP4).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

from . import formats as F
from ._torch_internals import scaled_mm
from .formats import BF16, FP8_E4M3, FP8_E5M2
from .microscaling import (
    MX_FORMATS,
    SCALE_ROUNDINGS,
    DelayedScaling,
    RandomHadamard,
    ScaledTensor,
    add_counts,
    fake_quantize_mx,
    fake_quantize_nvfp4,
    new_counts,
    quantize_mx,
    quantize_nvfp4,
    quantize_per_tensor,
)
from .recipes import (
    GEMMS,
    OPERAND_FORMATS,
    QUANTIZED,
    RECIPES,
    SCALINGS,
    WEIGHT_STORAGE,
    GemmQuant,
    GemmRecipe,
    OperandQuant,
    Recipe,
    TrainingRecipe,
    four_bit_recipe,
    get_recipe,
)

__all__ = [
    "TrainingRecipe",
    "TRAINING_RECIPES",
    "SCALINGS",
    "WEIGHT_STORAGE",
    "get_recipe",
    "Quantizer",
    "QuantLinear",
    "quantize_linears_",
    "quantized_layers",
    "round_weights_",
    "ROLES",
    "hardware_fp8_available",
    "OperandQuant",
    "GemmQuant",
    "GemmRecipe",
    "OPERAND_FORMATS",
    "GEMMS",
    "four_bit_recipe",
]

#: The operands of a Linear layer that a recipe quantises: its input, its weight, its output gradient.
ROLES = ("x", "w", "g")
#: The registry's recipes that chapter 11's experiment trains one by one (:data:`mpt_lab.recipes.QUANTIZED`), by
#: name: a view of :data:`mpt_lab.recipes.RECIPES`.
TRAINING_RECIPES: dict[str, Recipe] = {name: RECIPES[name] for name in QUANTIZED}
_PER_TENSOR = {"bf16": BF16, "fp8_e4m3": FP8_E4M3, "fp8_e5m2": FP8_E5M2}


# ----------------------------------------------------------------------------------------------------------
# the quantizer: one per model, shared by its QuantLinear layers
# ----------------------------------------------------------------------------------------------------------
def hardware_fp8_available(device: torch.device | str | None = None) -> bool:
    """Whether ``device`` (default: the current CUDA device) is a CUDA GPU with FP8 tensor cores (compute
    capability ≥ 8.9) and torch has ``_scaled_mm``."""
    if not torch.cuda.is_available():
        return False
    device = torch.device("cuda") if device is None else torch.device(device)
    if device.type != "cuda":
        return False
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
    seed : int ≥ 0, seeds :meth:`generator`, whose bits stochastic rounding draws (recipes with ``gemms``)

    Attributes
    ----------
    enabled : bool, False makes every :class:`QuantLinear` a plain FP32 Linear (e.g. to evaluate in FP32)
    recording : bool, accumulate statistics (set it on the steps you want measured)
    stats : dict layer → role → counts (see the module docstring; :func:`~mpt_lab.microscaling.layer_stats`
        turns them into shares)
    delayed : the :class:`~mpt_lab.microscaling.DelayedScaling` of ``fp8_delayed`` (None otherwise)
    gemms : dict "hardware" / "emulated" → number of products computed each way
    capture : bool, recipes with ``gemms`` only: keep the operands of every GEMM as its product read them
    captured : dict (layer name, "fprop" | "dgrad" | "wgrad") → (A, B), the latest float32 operands of that GEMM
        (after the Hadamard transform and quantisation; the product is ``A @ B.T``), filled while ``capture``
    """

    def __init__(
        self,
        recipe,
        *,
        history_len: int = 16,
        margin: int = 0,
        amax_compute_algo: str = "max",
        scale_rounding: str = "floor",
        hardware: bool = False,
        seed: int = 0,
    ):
        self.recipe = get_recipe(recipe)
        if scale_rounding not in SCALE_ROUNDINGS:
            raise ValueError(f"scale_rounding must be one of {SCALE_ROUNDINGS}, got {scale_rounding!r}")
        if not isinstance(hardware, bool):
            raise TypeError(f"hardware must be a bool, got {type(hardware).__name__}")
        if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
            raise TypeError(f"seed must be an int ≥ 0, got {seed!r}")
        self.seed = seed
        self._generators: dict = {}
        self.scale_rounding = scale_rounding
        self.delayed = None
        if self.recipe.scaling == "delayed":
            self.delayed = DelayedScaling(
                history_len, margin, self.recipe.forward, self.recipe.backward, amax_compute_algo=amax_compute_algo
            )
        self.enabled = True
        self.recording = False
        self.capture = False
        self.captured: dict = {}
        self.stats: dict = {}
        self.gemms = {"hardware": 0, "emulated": 0}
        fp8 = self.recipe.forward in (FP8_E4M3, FP8_E5M2) and self.recipe.backward in (FP8_E4M3, FP8_E5M2)
        self.hardware = bool(
            hardware and fp8 and not self.recipe.per_axis and self.recipe.gemms is None and hardware_fp8_available()
        )
        self.layers: list[str] = []

    def __repr__(self) -> str:
        return (
            f"Quantizer({self.recipe.name!r}, layers={len(self.layers)}, enabled={self.enabled}, "
            f"hardware={self.hardware})"
        )

    def step(self) -> None:
        """End a training step: the delayed-scaling histories advance (call it after ``optimizer.step()``)."""
        if self.delayed is not None:
            self.delayed.update()

    # --- quantising one operand ---------------------------------------------------------------------------
    def quantize(
        self, t: torch.Tensor, layer: str, role: str, *, axis: int = -1, record: bool = True, update: bool = True
    ) -> tuple[torch.Tensor, ScaledTensor | None]:
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
                tq = (
                    fake_quantize_mx(t, fmt, r.block_size, axis, scale_rounding=self.scale_rounding)
                    if r.scaling == "mx"
                    else fake_quantize_nvfp4(t, axis=axis)
                )
                return tq, None
            obj = (
                quantize_mx(t, fmt, r.block_size, axis, scale_rounding=self.scale_rounding)
                if r.scaling == "mx"
                else quantize_nvfp4(t, axis=axis)
            )
            tq = obj.dequantize(torch.float32)
            self._record(layer, role, t, tq, obj.saturated(t))
            return tq, None
        if r.scaling == "delayed":
            name = f"{layer}.{role}"
            if update:
                q, scale = self.delayed.quantize(t, name, backward=role == "g")
            else:  # evaluation: the stale scale, as DelayedScaling casts, nothing recorded
                scale = torch.tensor(self.delayed.scale(name) if name in self.delayed.names else 1.0)
                q = F.round_to(t.to(torch.float32) * scale.to(t.device), fmt, saturate=r.saturate)
        elif r.scaling == "current":
            q, scale = quantize_per_tensor(t, fmt, saturate=r.saturate)
        else:  # "none": the scale is 1
            q, scale = quantize_per_tensor(t, fmt, amax=fmt.max, saturate=r.saturate)
        st = ScaledTensor(q, scale, fmt, torch.float32)
        tq = st.dequantize()
        if record:
            self._record(layer, role, t, tq, st.saturated(t))
        return tq, st

    # --- the recipes with a quantisation per GEMM operand (``recipe.gemms``) ------------------------------------
    def generator(self, device: torch.device | str) -> torch.Generator:
        """The ``torch.Generator`` of ``device`` that stochastic rounding draws from, seeded with :attr:`seed`
        when first used; every stochastically rounded operand moves it on (reproducible from the seed)."""
        device = torch.device(device)
        key = str(device)
        if key not in self._generators:
            self._generators[key] = torch.Generator(device).manual_seed(self.seed)
        return self._generators[key]

    def quantize_operand(
        self,
        t: torch.Tensor,
        op: OperandQuant,
        *,
        layer: str | None = None,
        role: str | None = None,
        record: bool = False,
    ) -> torch.Tensor:
        """``t`` (a matrix, float32) quantised as ``op`` says along its last dimension and dequantised: float32, t's
        shape, no autograd history.

        The fast twins (:func:`~mpt_lab.microscaling.fake_quantize_nvfp4`, :func:`~mpt_lab.microscaling.
        fake_quantize_mx`) give the values of the exact quantisers bit for bit; with ``record`` and
        :attr:`recording` the exact quantisers are used instead and the statistics of (``layer``, ``role``)
        accumulated (the same values, and the same draws of stochastic rounding).
        """
        if op.format == "fp32":
            return t
        t = t.detach()
        gen = self.generator(t.device) if op.rounding == "stochastic" else None
        record = record and self.recording
        if op.format in _PER_TENSOR:
            fmt = _PER_TENSOR[op.format]
            amax = fmt.max if op.format == "bf16" else None  # BF16: the scale is 1
            q, scale = quantize_per_tensor(t, fmt, amax=amax, rounding=op.rounding, generator=gen)
            st = ScaledTensor(q, scale, fmt, torch.float32)
            tq = st.dequantize()
            if record:
                self._record(layer, role, t, tq, st.saturated(t))
            return tq
        options = {"blocks": op.blocks, "rounding": op.rounding, "generator": gen}
        if op.format == "nvfp4":
            if not record:
                return fake_quantize_nvfp4(t, **options)
            obj = quantize_nvfp4(t, **options)
        else:
            fmt = MX_FORMATS[op.format.upper()]
            if not record:
                return fake_quantize_mx(t, fmt, 32, scale_rounding=op.scale_rounding, **options)
            obj = quantize_mx(t, fmt, 32, scale_rounding=op.scale_rounding, **options)
        tq = obj.dequantize(torch.float32)
        self._record(layer, role, t, tq, obj.saturated(t))
        return tq

    def gemm_operands(
        self,
        gemm: GemmQuant,
        a: torch.Tensor,
        b: torch.Tensor,
        *,
        layer: str | None = None,
        roles: tuple = (None, None),
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The two operands of ``gemm`` as its product reads them: A (P, L) and B (Q, L), float32, both along
        their last dimension L (the reduction), first rotated by the random Hadamard transform of ``gemm.hadamard``
        values with the recipe's ``hadamard_seed`` (both zero-padded to a multiple of it first; zeros add
        nothing to a dot product), then quantised (:meth:`quantize_operand`: A first, then B).  The product is
        ``A @ B.T``.  ``roles`` names the operands in the statistics (None: not recorded)."""
        if gemm.hadamard:
            pad = -a.shape[1] % gemm.hadamard
            if pad:
                a, b = torch.nn.functional.pad(a, (0, pad)), torch.nn.functional.pad(b, (0, pad))
            rht = RandomHadamard(gemm.hadamard, self.recipe.gemms.hadamard_seed)
            a, b = rht.apply(a.contiguous()), rht.apply(b.contiguous())
        aq = self.quantize_operand(a.contiguous(), gemm.a, layer=layer, role=roles[0], record=roles[0] is not None)
        bq = self.quantize_operand(b.contiguous(), gemm.b, layer=layer, role=roles[1], record=roles[1] is not None)
        return aq, bq

    def _record(self, layer: str, role: str, t: torch.Tensor, tq: torch.Tensor, saturated: torch.Tensor) -> None:
        add_counts(self.stats.setdefault(layer, {}).setdefault(role, new_counts()), t, tq, saturated)

    # --- the products -------------------------------------------------------------------------------------
    def matmul(
        self,
        a: torch.Tensor,
        b: torch.Tensor,
        sa: ScaledTensor | None = None,
        sb: ScaledTensor | None = None,
        *,
        ta: bool = False,
        tb: bool = False,
    ) -> torch.Tensor:
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
    qa = sa.q.t() if ta else sa.q
    qb = sb.q.t() if tb else sb.q
    fa = qa.contiguous().to(_FLOAT8[sa.fmt.name])  # row-major
    fb = qb.t().contiguous().to(_FLOAT8[sb.fmt.name]).t()  # column-major
    one = torch.ones((), dtype=torch.float32, device=fa.device)
    return scaled_mm(
        fa, fb, scale_a=one / sa.scale.to(fa.device), scale_b=one / sb.scale.to(fa.device), out_dtype=torch.float32
    )


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
        if q.recipe.per_axis:  # block scaling: each operand along its product's reduction axis
            gq_n, _ = q.quantize(g, layer.name, "g", axis=-1)  # dgrad: over N
            wq_n, _ = q.quantize(b, layer.name, "w", axis=0, record=False)
            gx = gq_n @ wq_n
            gq_m, _ = q.quantize(g, layer.name, "g", axis=0, record=False)  # wgrad: over M
            xq_m, _ = q.quantize(a, layer.name, "x", axis=0, record=False)
            gw = gq_m.t() @ xq_m
        else:  # per tensor: the forward casts are reused
            xs, ws = ctx.scaled
            gq, gs = q.quantize(g, layer.name, "g")
            gx = q.matmul(gq, b, gs, ws)
            gw = q.matmul(gq, a, gs, xs, ta=True)
        gb = g.sum(0) if ctx.has_bias else None
        return gx.reshape(ctx.shape), gw, gb, None


def _reusable(first: GemmQuant, op1: OperandQuant, second: GemmQuant, op2: OperandQuant) -> bool:
    """Whether an operand quantised for one GEMM is, value for value, what the other GEMM would quantise: the same
    quantisation, deterministic, no Hadamard transform in either GEMM, and values that do not depend on the
    dimension they are quantised along (per tensor, or 2D blocks)."""
    return (
        op1 == op2 and op1.rounding == "nearest_even" and op1.axis_free and not first.hadamard and not second.hadamard
    )


class _GemmLinearFn(torch.autograd.Function):
    """y = x wᵀ + b with the three GEMMs of a :class:`GemmRecipe` (see its docstring), FP32 accumulation.

    Stochastic rounding draws from the quantizer's generator in this order: fprop A, fprop B, dgrad A, dgrad B,
    wgrad A, wgrad B (only the operands that are rounded stochastically draw).  An operand that one GEMM can take
    from another (:func:`_reusable`: a 2D-scaled weight, read by fprop and dgrad) is quantised once."""

    @staticmethod
    def forward(ctx, x, weight, bias, layer):
        q = layer.quantizer
        spec = q.recipe.gemms
        x2 = x.reshape(-1, x.shape[-1]).to(torch.float32)
        w = weight.detach().to(torch.float32)
        xq, wq = q.gemm_operands(spec.fprop, x2, w, layer=layer.name, roles=("x", "w"))
        y = xq @ wq.t()
        q.gemms["emulated"] += 1
        if q.capture:
            q.captured[(layer.name, "fprop")] = (xq, wq)
        if bias is not None:
            y = y + bias
        ctx.layer, ctx.has_bias, ctx.shape, ctx.weight_dtype = layer, bias is not None, x.shape, weight.dtype
        keep_w = _reusable(spec.fprop, spec.fprop.b, spec.dgrad, spec.dgrad.b)
        keep_x = _reusable(spec.fprop, spec.fprop.a, spec.wgrad, spec.wgrad.b)
        ctx.save_for_backward(x2, w, xq if keep_x else None, wq if keep_w else None)
        return y.reshape(*x.shape[:-1], weight.shape[0])

    @staticmethod
    def backward(ctx, gy):
        layer = ctx.layer
        q = layer.quantizer
        spec = q.recipe.gemms
        x2, w, xq, wq = ctx.saved_tensors
        g = gy.reshape(-1, gy.shape[-1]).to(torch.float32)
        if wq is None:  # dgrad: A = g (M, N), B = wᵀ (K, N)
            gq, wtq = q.gemm_operands(spec.dgrad, g, w.t(), layer=layer.name, roles=("g", None))
        else:  # the fprop's Q(w), transposed
            gq = q.quantize_operand(g.contiguous(), spec.dgrad.a, layer=layer.name, role="g", record=True)
            wtq = wq.t()
        gx = gq @ wtq.t()
        if xq is None:  # wgrad: A = gᵀ (N, M), B = xᵀ (K, M)
            gtq, xtq = q.gemm_operands(spec.wgrad, g.t(), x2.t())
        else:  # the fprop's Q(x), transposed
            gtq, xtq = q.quantize_operand(g.t().contiguous(), spec.wgrad.a), xq.t()
        gw = gtq @ xtq.t()
        q.gemms["emulated"] += 2
        if q.capture:
            q.captured[(layer.name, "dgrad")] = (gq, wtq)
            q.captured[(layer.name, "wgrad")] = (gtq, xtq)
        gb = g.sum(0) if ctx.has_bias else None
        return gx.reshape(ctx.shape), gw.to(ctx.weight_dtype), gb, None


def _quant_linear_eval(x, weight, bias, layer) -> torch.Tensor:
    """The forward of a :class:`QuantLinear` without autograd: quantised operands, no statistics, and the
    delayed-scaling histories left alone (evaluation)."""
    q = layer.quantizer
    x2 = x.reshape(-1, x.shape[-1]).to(torch.float32)
    if q.recipe.gemms is not None:
        xq, wq = q.gemm_operands(q.recipe.gemms.fprop, x2, weight.detach().to(torch.float32))
        y = xq @ wq.t()
        return (y if bias is None else y + bias).reshape(*x.shape[:-1], weight.shape[0])
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
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
            f"recipe={self.quantizer.recipe.name!r}"
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.quantizer.enabled or not self.quantizer.recipe.quantized:
            return nn.functional.linear(x, self.weight, self.bias)
        if torch.is_grad_enabled() and (x.requires_grad or self.weight.requires_grad):
            fn = _QuantLinearFn if self.quantizer.recipe.gemms is None else _GemmLinearFn
            return fn.apply(x, self.weight, self.bias, self)
        with torch.no_grad():
            return _quant_linear_eval(x, self.weight, self.bias, self)


def quantize_linears_(
    model: nn.Module, recipe: str | Recipe, *, skip: Iterable[str] = (), **quantizer_options: Any
) -> Quantizer:
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
def round_weights_(
    params: Iterable[torch.Tensor],
    rounding: str = "stochastic",
    *,
    fmt: F.FormatLike = BF16,
    generator: torch.Generator | None = None,
) -> None:
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
