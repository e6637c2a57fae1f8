"""FP32 master weights: the mixed precision training loop with loss scaling, each step visible.

Sources: Micikevicius et al., "Mixed Precision Training", ICLR 2018, §3.1 "FP32 master copy of weights" (its
Figure 1 draws one layer's iteration: FP16 forward and backward from an FP16 copy of the FP32 master weights,
the update applied to the masters) and §3.2 "Loss scaling"; NVIDIA's "Training with Mixed Precision" guide lists
the iteration as steps (make an FP16 copy of the weights; forward; multiply the loss by S; backward; multiply the
weight gradients by 1/S; complete the update).  Neither numbers eight steps: that is this book's writing of the
same loop, with the dtype of every tensor made explicit:

1. keep FP32 master weights and make an FP16 copy;
2. forward with the FP16 copy;
3. cast the FP16 prediction to FP32;
4. compute the FP32 loss and multiply it by the loss scale S;
5. keep the scaled loss in FP32 and start the backward pass from it: the gradient enters FP16 where it crosses
   back into the FP16 part of the graph, at step 3's cast.  This is what NVIDIA's guide and
   ``torch.amp.GradScaler`` do, and the default (``cast_scaled_loss=False``).  The naive variant,
   ``cast_scaled_loss=True``, casts the scaled loss to FP16 first, as study notes of the paper write the loop:
   it overflows to inf whenever loss·S > 65504 (at S = 2¹⁶, whenever the loss exceeds 65504/65536 ≈ 0.9995),
   and no framework does it.  It is kept as a lesson: the gradients are still bit-identical, because the
   derivative of a cast is 1 whatever the value, but the scaled loss it holds is inf;
6. backward in FP16 to get FP16 gradients;
7. cast the FP16 gradients to FP32 and divide by S (skip the update if any is inf/NaN);
8. update the FP32 master weights with the FP32 gradients (and refresh the FP16 copy from them).

Design (the one :class:`MasterWeightTrainer` uses, as NVIDIA apex's "O2" did):

* The **model holds the FP16 copy**: every trainable floating parameter of the model is replaced by a new
  FP16 ``nn.Parameter`` (floating buffers are cast too), so ``model(x)`` runs entirely in FP16.
* The **FP32 masters are separate leaf tensors** that the optimizer owns and updates.  When the model
  arrives in FP32, its original ``nn.Parameter`` objects *become* the masters (no copy): an optimizer
  built over ``model.parameters()`` *before* the trainer is created is therefore already an optimizer over
  the masters.  Otherwise (FP16/BF16/FP64 models, or a factory) the masters are new float32 leaves.
* Gradients flow FP16 → FP32 in step 7: each master's ``.grad`` is a float32 copy of its FP16 copy's
  ``.grad``, *before* the loss scaler sees them.  The scaler (``mpt_lab.scaling``, or ``torch.amp.GradScaler``:
  the trainer calls only their public methods) then divides the FP32 gradients by S, checks them for
  inf/NaN and skips the optimizer step on overflow.  (Both scalers refuse FP16 gradients: the optimizer must
  update FP32 weights, §3.1.)

Why masters (§3.1): an update ``lr·g`` smaller than half the gap to the neighbouring FP16 value rounds away
("swamping": relative to the weight that is between 2⁻¹² and 2⁻¹¹, depending on where the weight sits in its
binade and on the update's sign; for weights in [1, 2) the FP16 ulp is 2⁻¹⁰ ≈ 9.8e-4), and gradients at or below
2⁻²⁵ become zero in FP16.  FP32 masters accumulate the small updates; the loss scale S keeps small gradients in
FP16's range.

Memory (bytes per trained parameter, see :meth:`MasterWeightTrainer.memory_per_parameter`): FP32 master 4,
FP16 copy 2, FP16 gradient 2, FP32 gradient 4, plus the optimizer state (Adam: 8, SGD with momentum: 4).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn

from . import formats
from .scaling import GradScaler, StaticLossScaler, found_non_finite

__all__ = ["MasterWeightTrainer", "STEP_NAMES", "swamped", "swamped_fraction"]

_HALF_DTYPES = {torch.float16: "FP16", torch.bfloat16: "BF16"}
#: The public scaler methods the loop calls (torch.amp.GradScaler's names).
_SCALER_METHODS = ("scale", "unscale_", "step", "update", "get_scale", "is_enabled")


def swamped(weights: torch.Tensor, updates: torch.Tensor, fmt: str | formats.FloatFormat = "FP16") -> torch.Tensor:
    """Where a non-zero update vanishes when added to a weight stored in ``fmt``: ``round(w + u) == w``, the sum
    w + u exact and rounded once (round to nearest, ties to even).  The one place this book writes the rule
    (the paper's §3.1: an update below half an ulp of its weight is lost without FP32 master weights; chapter 4,
    the precision report's optimizer check and exercise 4.1 all count it here).

    The sum is formed in float64 and its rounding error kept (Knuth's TwoSum); where the float64 sum lands exactly
    on a midpoint between two values of ``fmt`` while the exact sum does not, the error decides the side, so no
    update is double-rounded (an update a hair above or below half the gap is judged on its exact value).

    Parameters
    ----------
    weights, updates : tensors of the same shape (any float dtype; taken as float64).  A weight that ``fmt``
        cannot hold is first rounded to ``fmt`` (the weight as it would be stored).
    fmt : a :class:`~mpt_lab.formats.FloatFormat` or its name with fewer than 52 mantissa bits (FP16, BF16,
        FP32, FP8, ...)

    Returns
    -------
    bool tensor of the shape of ``weights``: True where ``u != 0`` and the stored weight does not change.

    Raises
    ------
    TypeError
        ``weights`` or ``updates`` is not a tensor.
    ValueError
        Different shapes, or a format with 52 mantissa bits or more.
    """
    if not isinstance(weights, torch.Tensor) or not isinstance(updates, torch.Tensor):
        raise TypeError(
            f"weights and updates must be tensors, got {type(weights).__name__} and {type(updates).__name__}"
        )
    if weights.shape != updates.shape:
        raise ValueError(
            f"weights and updates must have the same shape, got {tuple(weights.shape)} and {tuple(updates.shape)}"
        )
    fmt = formats.get_format(fmt)
    if fmt.mantissa_bits >= 52:
        raise ValueError(f"fmt must have fewer than 52 mantissa bits (float64 forms the sum), got {fmt.name}")
    w = formats.round_to(weights.detach().to(torch.float64), fmt)
    u = updates.detach().to(torch.float64).to(w.device)
    s = w + u
    bb = s - w
    err = (w - (s - bb)) + (u - bb)  # TwoSum: w + u == s + err exactly
    rounded = formats.round_to(s, fmt)
    inexact = (err != 0) & torch.isfinite(s)
    if bool(inexact.any()):  # a float64 sum on a midpoint of fmt: the error picks the side
        si, ei = s[inexact], err[inexact]
        up, down = torch.nextafter(si, si.new_tensor(math.inf)), torch.nextafter(si, si.new_tensor(-math.inf))
        tie = formats.round_to(up, fmt) != formats.round_to(down, fmt)
        nudged = torch.where(ei > 0, up, down)
        rounded[inexact] = torch.where(tie, formats.round_to(nudged, fmt), rounded[inexact])
    return (u != 0) & (rounded == w)


def swamped_fraction(weights: torch.Tensor, updates: torch.Tensor, fmt: str | formats.FloatFormat = "FP16") -> float:
    """Share of the non-zero ``updates`` that vanish when added to ``weights`` stored in ``fmt`` (:func:`swamped`:
    ``round(w + u) == w``, |u| at most half an ulp of w, ties to even).

    Returns a float in [0, 1] (NaN when no update is non-zero).  Raises TypeError / ValueError as
    :func:`swamped`.
    """
    lost = swamped(weights, updates, fmt)
    nonzero = int((updates != 0).sum())
    return float("nan") if nonzero == 0 else int(lost.sum()) / nonzero


#: The name of each traced step (``{half}`` is FP16 or BF16), steps (1)–(8) of the module docstring; step 5 has
#: two: the naive cast (``cast_scaled_loss=True``) and what frameworks do (the default).
STEP_NAMES = {
    1: ("FP32 master weights", "{half} copy of the weights"),
    2: ("{half} forward: prediction",),
    3: ("prediction cast to FP32",),
    4: ("FP32 loss × S",),
    5: ("scaled loss cast to {half} (naive)", "scaled loss kept in FP32 (as frameworks do)"),
    6: ("{half} gradients (× S)",),
    7: ("FP32 gradients ÷ S",),
    8: ("FP32 master weights, updated", "{half} copy refreshed from the masters"),
}


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _first_float_tensor(obj) -> torch.Tensor | None:
    """The first floating tensor in a (nested) tensor / tuple / list / dict, or None."""
    if isinstance(obj, torch.Tensor):
        return obj if obj.is_floating_point() else None
    if isinstance(obj, Mapping):
        obj = list(obj.values())
    if isinstance(obj, (list, tuple)):
        for item in obj:
            found = _first_float_tensor(item)
            if found is not None:
                return found
    return None


def _cast_floats(obj, dtype: torch.dtype):
    """``obj`` with every floating tensor cast to ``dtype`` (integer tensors, e.g. token ids, unchanged)."""
    if isinstance(obj, torch.Tensor):
        return obj.to(dtype) if obj.is_floating_point() and obj.dtype != dtype else obj
    if isinstance(obj, Mapping):
        return type(obj)((k, _cast_floats(v, dtype)) for k, v in obj.items())
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):  # namedtuple
        return type(obj)(*(_cast_floats(v, dtype) for v in obj))
    if isinstance(obj, (list, tuple)):
        return type(obj)(_cast_floats(v, dtype) for v in obj)
    return obj


def _any_non_finite(grads: list[torch.Tensor]) -> torch.Tensor:
    """0-dim bool tensor (on the first gradient's device, no synchronisation): whether any of ``grads``
    holds an inf or NaN.  Sparse gradients are checked on their stored values, as torch's GradScaler does."""
    by_device: dict[torch.device, list[torch.Tensor]] = {}
    for g in grads:
        by_device.setdefault(g.device, []).append(g._values() if g.is_sparse else g)
    if not by_device:
        return torch.zeros((), dtype=torch.bool)
    found = [found_non_finite(gs, device) for device, gs in by_device.items()]
    return torch.stack([f.to(found[0].device) for f in found]).any()


def _tensor_bytes(t: torch.Tensor | None) -> int:
    return 0 if t is None else t.numel() * t.element_size()


class MasterWeightTrainer:
    """Train ``model`` with FP32 master weights, an FP16 copy and loss scaling, the loop in eight visible steps.

    Source: Micikevicius et al., ICLR 2018, §3.1 (FP32 master copy of weights, Figure 1) and §3.2 (loss
    scaling); NVIDIA's "Training with Mixed Precision" guide (its list of steps); steps (1)–(8) of the module
    docstring, the book's writing of that loop.  Each step is a separate, commented block in :meth:`train_step`.

    Parameters
    ----------
    model : nn.Module
        Any model with at least one trainable floating parameter.  **Changed in place**: its trainable
        floating parameters are replaced by new ``half_dtype`` ``nn.Parameter`` objects (the FP16 copy)
        and its floating buffers are cast to ``half_dtype``; frozen floating parameters are cast too.
        The original parameters (if float32) become the FP32 masters.
    optimizer : torch.optim.Optimizer, or callable(list of masters) -> Optimizer
        An optimizer over the FP32 masters: either one built over the FP32 model's ``model.parameters()``
        before this trainer was created (those parameter objects are the masters), or a factory such as
        ``lambda params: torch.optim.Adam(params, lr=1e-3)`` that is called with :attr:`masters`.
    loss_fn : callable(prediction, targets) -> Tensor
        Receives the FP32 prediction (step 3; same structure as the model's output, floating tensors
        cast to float32) and the targets (floating targets cast to float32); returns a one-element loss,
        computed in FP32 (a non-float32 loss is cast to float32).
    scaler : mpt_lab.scaling.GradScaler, StaticLossScaler, torch.amp.GradScaler or None, default None
        The loss scale S and the inf/NaN check that skips a step: any object with the public methods of
        ``torch.amp.GradScaler`` that the loop calls (``scale``, ``unscale_``, ``step``, ``update``,
        ``get_scale``, ``is_enabled``).  ``None``: no loss scaling (S = 1) and **no** overflow check (an
        inf/NaN gradient reaches the optimizer, as in the paper's "mixed precision without loss scaling");
        ``StaticLossScaler(1.0)`` checks without scaling.
    half_dtype : torch.dtype, default torch.float16
        The dtype of the copy: ``torch.float16`` (the paper) or ``torch.bfloat16``.
    trace : bool, default False
        Record, at every :meth:`train_step`, what each of the 8 steps produced (see :attr:`last_trace`).
    max_grad_norm : float or None, default None
        If given, clip the FP32 gradients (after dividing by S) to this total 2-norm before step 8.
    cast_scaled_loss : bool, default False
        False (step 5 as frameworks run it): backward starts from the FP32 scaled loss, as
        ``torch.amp.GradScaler`` and NVIDIA's "Training with Mixed Precision" guide do.  True: the naive variant,
        backward starts from the scaled loss cast to FP16, which is inf whenever loss·S > 65504 (no framework
        does this; the gradients are the same bit for bit, since the derivative of a cast is 1, but the scaled
        loss value is lost).

    Attributes
    ----------
    model : nn.Module
        The model, holding the FP16 copy.
    masters : list[Tensor]
        The FP32 master weights (float32 leaf tensors, shapes of the trained parameters, same order as
        ``model.parameters()`` restricted to trainable floating ones).
    half_params : list[nn.Parameter]
        The FP16 copy, ``half_params[i]`` is ``masters[i]`` rounded to ``half_dtype``.
    optimizer, scaler, loss_fn, half_dtype, steps (number of train_step calls)
    last_trace : list[dict] or None
        With ``trace=True``: one record per produced tensor of the last step, in order,
        ``{"step": 1..8, "name": str, "dtype": "float16" | "float32" | ..., "shape": tuple,
        "tensors": int (how many tensors, e.g. parameters), "numel": int (their total elements)}``; for a
        group of tensors (weights, gradients) ``shape`` is that of the first one.

    Raises
    ------
    TypeError
        ``model`` is not an ``nn.Module``; ``optimizer`` is neither an Optimizer nor callable (or the
        factory returned something else); ``loss_fn`` is not callable; ``scaler`` is neither None nor an
        object with the scaler methods above; ``half_dtype`` is not a ``torch.dtype``; ``trace`` is not a
        bool; ``max_grad_norm`` is not a real number.
    ValueError
        ``model`` has no trainable floating parameter; ``half_dtype`` is not float16/bfloat16; the
        optimizer's parameters are not exactly the FP32 masters (e.g. built over FP16 parameters, over
        other tensors, or missing some trainable parameter); ``max_grad_norm`` ≤ 0.

    Examples
    --------
    >>> model = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))
    >>> trainer = MasterWeightTrainer(model, lambda p: torch.optim.SGD(p, lr=0.1),
    ...                               nn.functional.cross_entropy, scaler=GradScaler(2.0**10))
    >>> out = trainer.train_step(torch.randn(8, 64), torch.randint(0, 10, (8,)))
    >>> sorted(out)
    ['loss', 'scale', 'skipped', 'step']
    """

    def __init__(
        self,
        model: nn.Module,
        optimizer,
        loss_fn: Callable,
        *,
        scaler: GradScaler | StaticLossScaler | torch.amp.GradScaler | None = None,
        half_dtype: torch.dtype = torch.float16,
        trace: bool = False,
        max_grad_norm: float | None = None,
        cast_scaled_loss: bool = False,
    ) -> None:
        # ---- argument checks (before changing the model) ------------------------------------------
        if not isinstance(model, nn.Module):
            raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
        if not (isinstance(optimizer, torch.optim.Optimizer) or callable(optimizer)):
            raise TypeError(
                "optimizer must be a torch.optim.Optimizer over the FP32 parameters or a callable "
                f"params -> Optimizer, got {type(optimizer).__name__}"
            )
        if not callable(loss_fn):
            raise TypeError(f"loss_fn must be callable (prediction, targets) -> loss, got {type(loss_fn).__name__}")
        missing = [] if scaler is None else [n for n in _SCALER_METHODS if not callable(getattr(scaler, n, None))]
        if missing:
            raise TypeError(
                "scaler must be None or a loss scaler (mpt_lab.scaling.GradScaler, StaticLossScaler, "
                f"torch.amp.GradScaler); {type(scaler).__name__} has no {', '.join(missing)}"
            )
        if not isinstance(half_dtype, torch.dtype):
            raise TypeError(f"half_dtype must be a torch.dtype, got {type(half_dtype).__name__}")
        if half_dtype not in _HALF_DTYPES:
            raise ValueError(f"half_dtype must be torch.float16 or torch.bfloat16, got {half_dtype}")
        if not isinstance(trace, bool):
            raise TypeError(f"trace must be a bool, got {type(trace).__name__}")
        if not isinstance(cast_scaled_loss, bool):
            raise TypeError(f"cast_scaled_loss must be a bool, got {type(cast_scaled_loss).__name__}")
        if max_grad_norm is not None:
            if isinstance(max_grad_norm, bool) or not isinstance(max_grad_norm, (int, float)):
                raise TypeError(f"max_grad_norm must be a real number or None, got {type(max_grad_norm).__name__}")
            if not (max_grad_norm > 0 and math.isfinite(max_grad_norm)):
                raise ValueError(f"max_grad_norm must be positive and finite, got {max_grad_norm!r}")
        originals = [p for p in model.parameters() if p.requires_grad and p.is_floating_point()]
        if not originals:
            raise ValueError("model has no trainable floating-point parameter to keep FP32 masters of")
        if isinstance(optimizer, torch.optim.Optimizer):
            opt_params = [p for g in optimizer.param_groups for p in g["params"]]
            ids = {id(p) for p in originals}
            if any(p.dtype != torch.float32 for p in opt_params):
                raise ValueError(
                    "optimizer must be built over the FP32 master weights (float32 parameters), "
                    f"found {sorted({_dtype_name(p.dtype) for p in opt_params})}; build it over "
                    "the FP32 model's parameters before creating the trainer, or pass a factory"
                )
            if any(id(p) not in ids for p in opt_params):
                raise ValueError("optimizer holds tensors that are not trainable parameters of model")
            missing = ids - {id(p) for p in opt_params}
            if missing:
                raise ValueError(
                    f"optimizer does not update {len(missing)} trainable parameter(s) of model "
                    "(set requires_grad=False on parameters that should stay frozen)"
                )

        self.model = model
        self.loss_fn = loss_fn
        self.scaler = scaler
        self.half_dtype = half_dtype
        self.trace = trace
        self.cast_scaled_loss = cast_scaled_loss
        self.max_grad_norm = None if max_grad_norm is None else float(max_grad_norm)
        self.steps = 0
        self.last_trace: list[dict[str, Any]] | None = None
        self._half_name = _HALF_DTYPES[half_dtype]

        # ---- (1) keep FP32 master weights and make an FP16 copy ------------------------------------
        # The model's float32 Parameter objects become the masters; the model gets FP16 Parameters.
        masters: dict[int, torch.Tensor] = {}
        copies: dict[int, nn.Parameter] = {}
        for p in originals:
            if id(p) not in masters:
                m = p if p.dtype == torch.float32 else nn.Parameter(p.detach().float())
                masters[id(p)] = m
                copies[id(p)] = nn.Parameter(p.detach().to(half_dtype), requires_grad=True)
        for module in model.modules():
            for name, p in list(module._parameters.items()):
                if p is None or not p.is_floating_point():
                    continue
                if id(p) not in copies:  # frozen: just cast (same object identity kept per tensor)
                    copies[id(p)] = nn.Parameter(p.detach().to(half_dtype), requires_grad=p.requires_grad)
                setattr(module, name, copies[id(p)])  # setattr: RNNs also update their _flat_weights
            for name, b in list(module._buffers.items()):
                if b is not None and b.is_floating_point():
                    module._buffers[name] = b.to(half_dtype)
            if isinstance(module, nn.RNNBase):
                module._init_flat_weights()
        self.masters: list[torch.Tensor] = [masters[id(p)] for p in dict.fromkeys(originals)]
        self.half_params: list[nn.Parameter] = [copies[id(p)] for p in dict.fromkeys(originals)]

        if isinstance(optimizer, torch.optim.Optimizer):
            self.optimizer = optimizer
        else:
            self.optimizer = optimizer(list(self.masters))
            if not isinstance(self.optimizer, torch.optim.Optimizer):
                raise TypeError(
                    f"optimizer factory must return a torch.optim.Optimizer, got {type(self.optimizer).__name__}"
                )
            mids = {id(m) for m in self.masters}
            if {id(p) for g in self.optimizer.param_groups for p in g["params"]} != mids:
                raise ValueError("optimizer factory must build the optimizer over exactly the masters it is given")

    # ------------------------------------------------------------------------------------------------
    def _record(self, trace: list | None, step: int, index: int, tensors) -> None:
        if trace is None:
            return
        if isinstance(tensors, torch.Tensor):
            tensors = [tensors]
        tensors = [t for t in tensors if t is not None]
        first = tensors[0] if tensors else None
        trace.append(
            {
                "step": step,
                "name": STEP_NAMES[step][index].format(half=self._half_name),
                "dtype": _dtype_name(first.dtype) if first is not None else None,
                "shape": tuple(first.shape) if first is not None else None,
                "tensors": len(tensors),
                "numel": sum(t.numel() for t in tensors),
            }
        )

    def train_step(self, inputs: torch.Tensor | tuple, targets: torch.Tensor) -> dict[str, Any]:
        """One iteration of the loop, steps (1)–(8), on one batch.

        Parameters
        ----------
        inputs : Tensor, or tuple of Tensors (passed as ``model(*inputs)``)
            Floating tensors are cast to ``half_dtype`` (the FP16 forward); integer tensors (token ids,
            indices) are passed unchanged.
        targets : Tensor or anything ``loss_fn`` accepts
            Floating tensors are cast to float32 (the loss is computed in FP32).

        Returns
        -------
        dict
            ``"loss"``: float, the unscaled FP32 loss of this batch (before the update);
            ``"scale"``: float, the loss scale S used (1.0 without a scaler);
            ``"skipped"``: bool, True when an FP32 gradient was inf/NaN and the scaler skipped step (8)
            (the trainer tests the FP32 gradients just before ``scaler.unscale_``, by the criterion of the
            scalers' unscale kernels, and reads the answer once: one host synchronisation per step, besides
            the scaler's own in ``step`` and ``"loss"``'s; False without a scaler or with a disabled one);
            ``"step"``: int, the number of train_step calls so far, this one included.

        Raises
        ------
        ValueError
            ``loss_fn`` returned something other than a one-element floating tensor.
        RuntimeError
            From the scaler or the optimizer.
        """
        trace: list | None = [] if self.trace else None
        scaler, half = self.scaler, self.half_dtype
        for h in self.half_params:
            h.grad = None
        for m in self.masters:
            m.grad = None

        # ---- (1) FP32 master weights and their FP16 copy (kept equal since the last step (8)) --------
        self._record(trace, 1, 0, self.masters)
        self._record(trace, 1, 1, self.half_params)

        # ---- (2) forward with the FP16 copy ------------------------------------------------------------
        args = inputs if isinstance(inputs, tuple) else (inputs,)
        prediction_half = self.model(*_cast_floats(args, half))
        self._record(trace, 2, 0, _first_float_tensor(prediction_half))

        # ---- (3) cast the FP16 prediction to FP32 ------------------------------------------------------
        prediction = _cast_floats(prediction_half, torch.float32)
        self._record(trace, 3, 0, _first_float_tensor(prediction))

        # ---- (4) compute the FP32 loss and multiply it by the loss scale S ----------------------------
        loss = self.loss_fn(prediction, _cast_floats(targets, torch.float32))
        if not isinstance(loss, torch.Tensor) or not loss.is_floating_point() or loss.numel() != 1:
            raise ValueError(
                "loss_fn must return a one-element floating tensor, got "
                + (f"shape {tuple(loss.shape)} {loss.dtype}" if isinstance(loss, torch.Tensor) else type(loss).__name__)
            )
        loss = loss.reshape(()).float()
        scaled_loss = scaler.scale(loss) if scaler is not None else loss
        scale_used = scaler.get_scale() if scaler is not None else 1.0
        self._record(trace, 4, 0, scaled_loss)

        # ---- (5) backward starts from the FP32 scaled loss, as frameworks do (the default) ------------
        # The naive variant (cast_scaled_loss=True) casts it to FP16 first: loss·S above 65504 is inf there; its
        # gradient, 1, is still exact, so the gradients do not change, but the scaled loss value is inf.
        if self.cast_scaled_loss:
            backward_from = scaled_loss.to(half)
            self._record(trace, 5, 0, backward_from)
        else:
            backward_from = scaled_loss
            self._record(trace, 5, 1, backward_from)

        # ---- (6) backward in FP16: FP16 gradients of the FP16 copy (S times the true ones) -------------
        backward_from.backward()
        self._record(trace, 6, 0, [h.grad for h in self.half_params])

        # ---- (7) cast the FP16 gradients to FP32 and divide by S ---------------------------------------
        for m, h in zip(self.masters, self.half_params):
            m.grad = None if h.grad is None else h.grad.float()
        checked = scaler is not None and scaler.is_enabled()
        if checked:
            # The scaler skips step (8) when a gradient is inf/NaN: the same test on the same FP32 gradients,
            # as its unscale kernel makes it, on the scaled values (÷ S with S < 1 could overflow a finite one)
            found_inf = _any_non_finite([m.grad for m in self.masters if m.grad is not None])
            scaler.unscale_(self.optimizer)  # FP32 grads ÷ S, in place; notes any inf/NaN
        self._record(trace, 7, 0, [m.grad for m in self.masters])
        if self.max_grad_norm is not None:
            torch.nn.utils.clip_grad_norm_([m for m in self.masters if m.grad is not None], self.max_grad_norm)

        # ---- (8) update the FP32 masters with the FP32 gradients (skipped on inf/NaN) -----------------
        if scaler is not None:
            scaler.step(self.optimizer)  # calls optimizer.step() unless a gradient was inf/NaN
            # the trainer's one host synchronisation for the check (step() read the scaler's own already)
            skipped = checked and bool(found_inf.item())
            scaler.update()  # GradScaler: back S off on overflow, grow it after N clean steps
        else:
            self.optimizer.step()
            skipped = False
        self._record(trace, 8, 0, self.masters)
        #      ... and refresh the FP16 copy from them (round to nearest even)
        self._refresh_copy()
        self._record(trace, 8, 1, self.half_params)

        self.steps += 1
        if trace is not None:
            self.last_trace = trace
        return {"loss": loss.item(), "scale": float(scale_used), "skipped": bool(skipped), "step": self.steps}

    @torch.no_grad()
    def _refresh_copy(self) -> None:
        for m, h in zip(self.masters, self.half_params):
            h.copy_(m)

    @torch.no_grad()
    def predict(self, inputs: torch.Tensor | tuple) -> torch.Tensor:
        """Forward with the FP16 copy, without gradients; the prediction cast to FP32 (steps 2–3).

        ``inputs`` as in :meth:`train_step`.  Returns the model's output structure with floating tensors
        in float32.
        """
        args = inputs if isinstance(inputs, tuple) else (inputs,)
        return _cast_floats(self.model(*_cast_floats(args, self.half_dtype)), torch.float32)

    # ------------------------------------------------------------------------------------------------
    def memory_per_parameter(self) -> dict[str, float]:
        """Bytes per trained parameter held by each part of the loop, measured from the actual tensors.

        Returns
        -------
        dict
            ``"parameters"``: int, the number of trained parameters N (elements of the masters);
            ``"fp32_master_weights"``, ``"fp16_weights"`` (the copy), ``"fp16_gradients"``,
            ``"fp32_gradients"``, ``"optimizer_state"`` (every tensor in ``optimizer.state`` of the
            masters, e.g. Adam's exp_avg, exp_avg_sq and its 0-dim step counters), ``"total"``: floats,
            bytes / N.  With FP16 and Adam after one step: 4, 2, 2, 4, ≈8 (+4 bytes per parameter *tensor*
            for ``step``), total ≈ 20.

        Gradients that do not exist yet (before the first :meth:`train_step`) count with the size they
        will have (the dtype of their parameter), so the numbers describe the peak of a step.  The
        optimizer state counts only what exists (Adam creates it lazily, at its first step).
        Source: §3.1 of the paper (the masters cost 50 % more weight memory; activations dominate).
        """
        n = sum(m.numel() for m in self.masters)

        fp16_grads = sum(_tensor_bytes(h.grad) if h.grad is not None else _tensor_bytes(h) for h in self.half_params)
        fp32_grads = sum(_tensor_bytes(m.grad) if m.grad is not None else m.numel() * 4 for m in self.masters)
        state = 0
        for m in self.masters:
            for value in self.optimizer.state.get(m, {}).values():
                if isinstance(value, torch.Tensor):
                    state += _tensor_bytes(value)
        parts = {
            "fp32_master_weights": sum(_tensor_bytes(m) for m in self.masters) / n,
            "fp16_weights": sum(_tensor_bytes(h) for h in self.half_params) / n,
            "fp16_gradients": fp16_grads / n,
            "fp32_gradients": fp32_grads / n,
            "optimizer_state": state / n,
        }
        parts["total"] = sum(parts.values())
        return {"parameters": n, **parts}

    # ------------------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue training identically.

        ``{"masters": list of float32 tensors (copies), "buffers": {name: tensor} (the model's buffers),
        "optimizer": optimizer.state_dict(), "scaler": scaler.state_dict() or None, "steps": int}``.
        The FP16 copy is not saved: it is the masters rounded to FP16.  Call between steps.
        """
        return {
            "masters": [m.detach().clone() for m in self.masters],
            "buffers": {k: v.detach().clone() for k, v in self.model.named_buffers()},
            "optimizer": copy.deepcopy(self.optimizer.state_dict()),
            "scaler": self.scaler.state_dict() if self.scaler is not None else None,
            "steps": self.steps,
        }

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Load a :meth:`state_dict`: masters (copied in place), buffers, optimizer, scaler; refresh the copy.

        Raises
        ------
        TypeError
            ``state_dict`` is not a mapping.
        KeyError
            A key is missing.
        ValueError
            The number or shapes of the masters differ from this trainer's.
        """
        if not isinstance(state_dict, Mapping):
            raise TypeError(f"state_dict must be a mapping, got {type(state_dict).__name__}")
        saved = state_dict["masters"]
        if len(saved) != len(self.masters):
            raise ValueError(f"state_dict: {len(saved)} masters saved, this trainer has {len(self.masters)}")
        for i, (s, m) in enumerate(zip(saved, self.masters)):
            if tuple(s.shape) != tuple(m.shape):
                raise ValueError(f"state_dict: master {i} has shape {tuple(s.shape)}, expected {tuple(m.shape)}")
        buffers = dict(self.model.named_buffers())
        with torch.no_grad():
            for s, m in zip(saved, self.masters):
                m.copy_(s)
            for name, value in state_dict.get("buffers", {}).items():
                if name in buffers:
                    buffers[name].copy_(value)
        self.optimizer.load_state_dict(state_dict["optimizer"])
        if self.scaler is not None and state_dict.get("scaler"):
            self.scaler.load_state_dict(state_dict["scaler"])
        self.steps = int(state_dict.get("steps", 0))
        self._refresh_copy()

    def __repr__(self) -> str:
        n = sum(m.numel() for m in self.masters)
        return (
            f"MasterWeightTrainer({type(self.model).__name__}, {n} parameters, "
            f"{type(self.optimizer).__name__}, scaler={self.scaler!r}, half_dtype={self.half_dtype})"
        )
