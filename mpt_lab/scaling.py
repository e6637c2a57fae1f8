"""Loss scaling: keep small gradients representable in FP16.

Why (Micikevicius et al. 2018, "Mixed Precision Training", §3.2 "Loss scaling"): many activation
gradients are smaller than FP16's smallest subnormal (2⁻²⁴) and would round to zero.  Multiplying the
loss by a scale S multiplies every gradient by S (chain rule), shifting them into FP16's range.  Before
the optimizer uses them, the weight gradients (kept in FP32, next to FP32 master weights) are divided by
S again.  If S was too large, some gradient overflowed to inf (or became NaN): that step is skipped.

Two scalers, one loop::

    scaler = GradScaler()                      # or StaticLossScaler(1024.0)
    for x, y in data:
        optimizer.zero_grad()
        loss = loss_fn(model(x), y)
        scaler.scale(loss).backward()          # gradients are S times too large
        scaler.unscale_(optimizer)             # optional: true gradients, e.g. to clip them
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        scaler.step(optimizer)                 # skipped if any gradient is inf/NaN
        scaler.update()                        # choose S for the next step

* :class:`StaticLossScaler` keeps one S for the whole run (the paper's first option).
* :class:`GradScaler` chooses S dynamically (NVIDIA's dynamic loss scaling: halve S on overflow, double
  it after N = 2000 clean steps).  It has the same contract as ``torch.amp.GradScaler`` and is checked
  against it bit for bit (``tests/test_scaling.py``; under DDP and FSDP2 in ``tests/test_distributed.py``:
  with sharded gradients the ranks all-reduce the found-inf flag, see :meth:`GradScaler.unscale_`), but it
  is written so that each rule can be read here: :func:`update_scale` (Python numbers, public) and
  ``_update_scale`` (the same rules as tensor operations).
* :func:`max_gradient_scale` is the rule for choosing a static S from the largest gradient: the largest
  power of two that keeps amax · S within the format's range.

Where the numbers live.  S multiplies the loss on the device, so it is a device tensor.  Whether a
gradient overflowed is found on the device too, and :meth:`step` must read it on the host to decide
whether to call ``optimizer.step()``: that is the one host synchronisation per step, as in torch.  Once
the host has read it, it also knows the next S, so :meth:`update` applies the rules to Python numbers and
replaces the device tensors only when S changes.  When the host never sees found_inf (an optimizer that
skips on the device, e.g. ``Adam(fused=True)``; ``unscale_`` without ``step``; ``update`` given a tensor)
the same rules run as tensor operations, without a synchronisation, as in torch.

Differences from torch: without a ``device`` argument, ``GradScaler()`` scales the loss on whatever device
it is on (torch's default device "cuda" disables its scaler on a machine without CUDA); the deprecated
protocol in which ``optimizer.step`` takes a ``grad_scaler=`` keyword is not supported
(``NotImplementedError``); arguments are checked more strictly (see the constructors: torch stores any
device unchecked, and checks its factors only when enabled); ``update(new_scale=tensor)`` compares the
tensor's device type with the type of ``device`` (torch compares it with ``device`` as given, so that after
``"cuda:0"`` or a ``torch.device`` it refuses every tensor); the errors that torch raises as ``AssertionError`` (no ``scale()`` before ``step`` /
``update``, no inf checks) are ``RuntimeError`` here, with torch's messages; :meth:`get_scale` and
``state_dict`` read no device value when the host knows S.
"""

from __future__ import annotations

import enum
import inspect
import math
import numbers
import struct
import sys
import warnings
from collections import abc, defaultdict
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from . import formats
from ._torch_internals import foreach_max, foreach_mul_

__all__ = [
    "GradScaler",
    "StaticLossScaler",
    "OptState",
    "max_gradient_scale",
    "largest_power_of_two_scale",
    "update_scale",
    "found_non_finite",
]

_FIX = "This may indicate your script did not use scaler.scale(loss or outputs) earlier in the iteration."
_HISTORY_CHUNK = 1024  # device-side history records are packed into one tensor per this many


class OptState(enum.Enum):
    """Where one optimizer is in the current iteration (the same three stages as ``torch.amp``)."""

    READY = 0  # nothing done yet since the last update()
    UNSCALED = 1  # unscale_() ran: the gradients are true gradients and found_inf is known
    STEPPED = 2  # step() ran (or skipped the optimizer); only update() brings it back to READY


# ----------------------------------------------------------------------------------------------------
# Argument checks (clear errors naming the argument)
# ----------------------------------------------------------------------------------------------------
def _real(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__}")
    return float(value)


def _positive_scale(name: str, value: Any) -> float:
    v = _real(name, value)
    if not (v > 0 and 0 < _f32(v) < math.inf):
        raise ValueError(
            f"{name} must be a positive number that is finite and nonzero in float32 (2^-149 .. 3.4e38), got {value!r}"
        )
    return v


def _growth_factor(value: Any) -> float:
    v = _real("growth_factor", value)
    if not v > 1.0:  # also refuses NaN
        raise ValueError(f"growth_factor must be > 1.0, got {value!r}")
    return v


def _backoff_factor(value: Any) -> float:
    v = _real("backoff_factor", value)
    if not 0.0 < v < 1.0:
        raise ValueError(f"backoff_factor must be in (0, 1), got {value!r}")
    return v


def _device_type(value: Any) -> str | None:
    """The device type named by GradScaler's ``device`` argument ('cuda', 'cpu', ...), or None when not given.

    Takes what ``torch.amp.GradScaler`` takes for a device: a str that ``torch.device`` parses, with or
    without an index ("cuda", "cuda:0", "cpu"), or a ``torch.device``.  torch stores any value unchecked;
    here anything else is a TypeError and a str that names no device a ValueError.
    """
    if value is None:
        return None
    if isinstance(value, torch.device):
        return value.type
    if not isinstance(value, str):
        raise TypeError(
            f"device must be a str or a torch.device naming a device, such as 'cuda', 'cuda:0' or "
            f"'cpu', as torch.amp.GradScaler takes it; got {type(value).__name__}"
        )
    try:
        return torch.device(value).type
    except RuntimeError as err:
        raise ValueError(
            f"device must name a device, such as 'cuda', 'cuda:0' or 'cpu'; got {value!r} ({err})"
        ) from None


#: GradScaler's arguments in torch.amp.GradScaler's order (PyTorch ≥ 2.3: ``device`` first) and defaults.
_GRAD_SCALER_DEFAULTS = {
    "device": None,
    "init_scale": 2.0**16,
    "growth_factor": 2.0,
    "backoff_factor": 0.5,
    "growth_interval": 2000,
    "enabled": True,
}


def _grad_scaler_arguments(args: tuple, kwargs: dict) -> dict[str, Any]:
    """GradScaler's arguments by name, from either call form (see :class:`GradScaler`, "Call forms").

    torch's form: ``(device, init_scale, growth_factor, backoff_factor, growth_interval, enabled)``.  A real
    number in first place is ``init_scale`` (the form of ``torch.cuda.amp.GradScaler`` and of this class
    before PyTorch 2.3's order): the positional arguments then start at ``init_scale``.
    """
    names = list(_GRAD_SCALER_DEFAULTS)
    if args and isinstance(args[0], numbers.Real) and not isinstance(args[0], bool):
        names = names[1:]
    if len(args) > len(names):
        raise TypeError(
            f"GradScaler takes at most {len(names)} positional arguments ({', '.join(names)}), got {len(args)}"
        )
    bound = dict(zip(names, args))
    for name, value in kwargs.items():
        if name not in _GRAD_SCALER_DEFAULTS:
            raise TypeError(
                f"GradScaler got an unexpected keyword argument {name!r}; its arguments are "
                f"{', '.join(_GRAD_SCALER_DEFAULTS)}"
            )
        if name in bound:
            raise TypeError(f"GradScaler got multiple values for argument {name!r}")
        bound[name] = value
    return {**_GRAD_SCALER_DEFAULTS, **bound}


def _growth_interval(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"growth_interval must be an int, got {type(value).__name__}")
    if value <= 0:
        raise ValueError(f"growth_interval must be a positive int, got {value!r}")
    return int(value)


# ----------------------------------------------------------------------------------------------------
# The numbers.  Each function is bit-identical to the corresponding part of torch's fused kernels
# (torch._amp_update_scale_, torch._amp_foreach_non_finite_check_and_unscale_); the tests check it.
# ----------------------------------------------------------------------------------------------------
def _f32(x: float) -> float:
    """``x`` rounded to the nearest float32 (to ±inf beyond its range), as a Python float."""
    try:
        return struct.unpack("f", struct.pack("f", x))[0]
    except OverflowError:  # finite, but rounds beyond the largest float32
        return math.copysign(math.inf, x)


def _update_rule(
    scale: float, tracker: int, found_inf: bool, growth_factor: float, backoff_factor: float, growth_interval: int
) -> tuple[float, int]:
    """One step of dynamic loss scaling: the new (scale, tracker), as torch's ``_amp_update_scale_``.

    ``scale`` is a float32 value, ``tracker`` counts consecutive clean steps.  The products are formed in
    float64 (Python floats) and rounded once to float32, as the C++ kernel does (float · double).
    """
    if found_inf:  # rule 1, backoff: this step overflowed
        return _f32(scale * backoff_factor), 0
    tracker += 1  # rule 2, count: one more clean step
    if tracker == growth_interval:  # rule 3, growth: exactly growth_interval clean steps
        grown = _f32(scale * growth_factor)
        if not math.isfinite(grown):  # rule 4: never grow to infinity (tracker still resets)
            grown = scale
        return grown, 0
    # A tracker already past the interval (loaded from a checkpoint, or after set_growth_interval) never
    # equals it again: S then grows no more until an overflow resets the tracker.  torch does the same.
    return scale, tracker


def update_scale(
    scale: float,
    tracker: int,
    found_inf: bool,
    growth_factor: float = 2.0,
    backoff_factor: float = 0.5,
    growth_interval: int = 2000,
) -> tuple[float, int]:
    """One update of dynamic loss scaling: torch.amp.GradScaler's rule, as Python numbers.

    The rules, applied in :meth:`GradScaler.update` once per iteration (NVIDIA's dynamic loss scaling, the
    automatic form of Micikevicius et al. 2018, §3.2 "Loss scaling"; PyTorch's ``_amp_update_scale_``):

    1. *backoff*: ``found_inf`` (some gradient was inf/NaN, the step was skipped) → S · backoff_factor, and
       the count of clean steps restarts at 0;
    2. *count*: otherwise one more clean step: tracker + 1;
    3. *growth*: when the count reaches exactly ``growth_interval`` → S · growth_factor and the count
       restarts at 0;
    4. S never grows to infinity: a growth that would overflow float32 keeps S (the count still restarts).

    Products are formed in float64 and rounded once to float32, as torch's kernel does, so the result is
    bit-identical to ``torch.amp.GradScaler`` (``tests/test_scaling.py`` checks it against the kernel).

    Parameters
    ----------
    scale : float
        The current loss scale S; positive, finite and nonzero in float32 (torch stores S as a float32
        tensor; other values are rounded to float32 first).
    tracker : int ≥ 0
        Consecutive clean steps so far (torch's ``_growth_tracker``).
    found_inf : bool
        Whether this iteration found an inf/NaN gradient.
    growth_factor : float > 1, backoff_factor : float in (0, 1), growth_interval : int ≥ 1
        As :class:`GradScaler`.

    Returns
    -------
    (scale, tracker) : (float, int)
        The loss scale for the next iteration (a float32 value) and the new count of clean steps.

    Raises
    ------
    TypeError
        An argument of the wrong type (``found_inf`` must be a bool, ``tracker`` and ``growth_interval``
        ints).
    ValueError
        ``scale`` not positive and finite in float32; ``tracker`` < 0; a factor or the interval out of range.
    """
    scale = _f32(_positive_scale("scale", scale))
    if isinstance(tracker, bool) or not isinstance(tracker, numbers.Integral):
        raise TypeError(f"tracker must be an int, got {type(tracker).__name__}")
    if tracker < 0:
        raise ValueError(f"tracker must be ≥ 0 (a count of clean steps), got {tracker!r}")
    if not isinstance(found_inf, (bool, np.bool_)):
        raise TypeError(f"found_inf must be a bool, got {type(found_inf).__name__}")
    return _update_rule(
        scale,
        int(tracker),
        bool(found_inf),
        _growth_factor(growth_factor),
        _backoff_factor(backoff_factor),
        _growth_interval(growth_interval),
    )


def max_gradient_scale(amax: float | torch.Tensor, fmt: formats.FormatLike = "FP16") -> float:
    """The largest power of two S with amax · S ≤ fmt.max: the static loss scale that keeps the largest
    gradient representable.

    Micikevicius et al. 2018, §3.2 "Loss scaling": choose S so that the largest gradient times S stays below
    FP16's max 65,504 (one option the paper gives for a constant scaling factor; in practice amax is the
    largest absolute gradient seen in a run, e.g. :attr:`mpt_lab.histogram.Log2Histogram.amax`).

    Computed exactly, with integer exponent arithmetic on the exact values (never a floating-point log2,
    which is wrong at powers of two): S = 2ᵏ with k = ⌊log2(fmt.max / amax)⌋, so amax · S ≤ fmt.max <
    amax · 2S holds exactly.

    Parameters
    ----------
    amax : int, float, Fraction, NumPy scalar or 0-d array, or 0-d torch tensor (any real dtype)
        The largest absolute gradient (> 0, finite), in the units of the values the format will hold.
        Used exactly as given (a tensor is read with ``.item()``: a synchronisation on CUDA).
    fmt : FloatFormat or str, default "FP16"
        The format the scaled gradients are stored in (``"FP16"``, ``"BF16"``, ``"FP8_E5M2"``, …).

    Returns
    -------
    float
        S, a power of two (possibly < 1 when amax > fmt.max).

    Raises
    ------
    TypeError
        ``amax`` is not a real number (bools, strings, complex, tensors with more than one element …), or
        ``fmt`` is not a format.
    ValueError
        ``amax`` ≤ 0, NaN or ±inf; an unknown format name; S outside float64's range (e.g. FP64 and an
        amax below 1, or FP16 and an amax beyond float64 such as 10**400): not representable as a float.
    """
    fmt = formats.get_format(fmt, "fmt")
    return largest_power_of_two_scale(amax, fmt.max, f"{fmt.name}'s max")


def largest_power_of_two_scale(amax: float | torch.Tensor, limit: float, limit_name: str = "limit") -> float:
    """The largest power of two S with amax · S ≤ ``limit``, exactly: :func:`max_gradient_scale` for any
    positive finite float ``limit`` (exercise 2.1 takes a bare limit instead of a format).

    ``limit_name`` names the limit in the error messages.  Raises TypeError/ValueError as
    :func:`max_gradient_scale` (amax not a positive finite real; S beyond float64's range).
    """
    a = _exact_real("amax", amax)
    if isinstance(a, float) and not math.isfinite(a):
        raise ValueError(f"amax must be a positive finite number, got {a!r}")
    if a <= 0:
        raise ValueError(f"amax must be positive (the largest absolute gradient), got {a!r}")
    a_num, a_den = a.as_integer_ratio()
    m_num, m_den = limit.as_integer_ratio()
    k = formats.floor_log2(m_num * a_den, m_den * a_num)  # amax · 2^k ≤ limit < amax · 2^(k+1)
    if not -1074 <= k <= 1023:
        raise ValueError(
            f"amax: S = 2^{k}, the largest power of two with amax · S ≤ {limit_name} {limit!r}, "
            "is not representable as a float64"
        )
    return math.ldexp(1.0, k)


def _exact_real(name: str, value: Any):
    """``value`` as an exact Python int, float or Fraction: Python reals, NumPy scalars / 0-d arrays and 0-d
    torch tensors (read with ``.item()``) of a real, non-bool dtype."""
    if isinstance(value, torch.Tensor):
        if value.dtype == torch.bool or value.is_complex():
            raise TypeError(f"{name} must be a real number, got a {value.dtype} tensor")
        if value.numel() != 1 or value.dim() != 0:
            raise TypeError(f"{name} must be a number or a 0-d tensor, got a tensor of shape {tuple(value.shape)}")
        if value.device.type == "meta":
            raise ValueError(f"{name} is a meta tensor (no value to read)")
        value = value.item()
    elif isinstance(value, (np.ndarray, np.generic)):
        arr = np.asarray(value)
        if arr.ndim != 0:
            raise TypeError(f"{name} must be a number or a 0-d array, got an array of shape {arr.shape}")
        if arr.dtype.kind in "iu":
            value = int(arr)
        elif arr.dtype.kind == "f" or arr.dtype in formats.ML_FLOAT_DTYPES:
            value = float(arr.astype(np.float64))  # exact for float16/32/64 and the ml_dtypes floats
        else:
            raise TypeError(f"{name} must be a real number, got a NumPy {arr.dtype} value")
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__}")
    return value if isinstance(value, (numbers.Rational, float)) else float(value)


def _update_scale(
    scale: torch.Tensor,
    growth_tracker: torch.Tensor,
    found_inf: torch.Tensor,
    growth_factor: float,
    backoff_factor: float,
    growth_interval: int,
):
    """``_update_rule`` as tensor operations, for when only the device knows found_inf; no synchronisation.

    ``scale`` is float32, ``growth_tracker`` int32 and ``found_inf`` bool, 0-dim on one device (any
    shape works: the rules apply elementwise).  Returns new (scale, growth_tracker) tensors.
    """
    counted = growth_tracker + 1  # rule 2
    interval_done = counted == growth_interval  # rule 3 applies ...
    wide = _wide(scale)
    backed_off = (wide * backoff_factor).float()
    grown = (wide * growth_factor).float()
    grow = interval_done & torch.isfinite(grown)  # ... unless rule 4 forbids it
    new_scale = torch.where(found_inf, backed_off, torch.where(grow, grown, scale))  # rule 1 first
    new_tracker = torch.where(found_inf | interval_done, 0, counted)
    return new_scale, new_tracker


def _wide(t: torch.Tensor) -> torch.Tensor:
    """``t`` in float64, where products are formed before rounding once to float32 (MPS: float32)."""
    return t.float() if t.device.type == "mps" else t.double()


def _reciprocal(scale: torch.Tensor) -> torch.Tensor:
    """1/S rounded to float32, computed in float64 as torch does (FP32 division can be imprecise)."""
    return _wide(scale).reciprocal().float()


def found_non_finite(grads: list[torch.Tensor], device: torch.device) -> torch.Tensor:
    """bool 0-dim tensor on ``device``: True if any of ``grads`` (dense tensors, all on ``device``) holds an
    inf or NaN; no host synchronisation.  :class:`GradScaler` and :mod:`mpt_lab.master_weights` check
    gradients with it.

    A +inf shows in the largest element of a tensor, a -inf in the smallest, a NaN in both (max and min
    propagate NaN); finite values give finite extremes (unlike a sum or a norm, which can overflow).
    Reductions are used because they are fast: on a CPU, ``isfinite(g).all()`` and the max-abs norm are
    ~10× slower.  Empty tensors hold nothing and have no extremes.
    """
    grads = [g for g in grads if g.numel() > 0]
    if not grads:
        return torch.zeros((), dtype=torch.bool, device=device)
    largest = foreach_max(grads)
    smallest = [g.amin() for g in grads]
    return torch.isfinite(torch.stack([*largest, *smallest])).all().logical_not()


def _local_shard(grad: torch.Tensor) -> tuple[torch.Tensor, list]:
    """``(tensor, process_groups)``: the values of ``grad`` held by this process, and the process groups that
    must agree on whether a gradient overflowed.

    A plain tensor is all there is: no group.  A DTensor (a gradient of a model sharded by FSDP2's
    ``fully_shard``) holds one shard per rank; its local shard (``to_local()``, which under ``no_grad`` is the
    stored tensor itself, so unscaling it in place unscales the DTensor) is checked and unscaled, and the
    ranks along every mesh dimension where it is not replicated (``Shard``, ``Partial``) must combine their
    found-inf flags: an inf in rank 1's shard is not in rank 0's.  These are the dimensions over which
    ``torch.amp.GradScaler`` reduces the flag (DTensor's handler of ``_amp_foreach_non_finite_check_and_unscale_``
    reduces it as ``Partial("max")`` there).
    """
    # FSDP2's gradients are DTensors.  A DTensor exists only once torch.distributed.tensor has been imported;
    # importing it here for every scaler would cost seconds, so it is looked up among the imported modules.
    dtensor = sys.modules.get("torch.distributed.tensor")
    if dtensor is not None and isinstance(grad, dtensor.DTensor):
        mesh = grad.device_mesh
        groups = [
            mesh.get_group(dim)
            for dim, placement in enumerate(grad.placements)
            if not isinstance(placement, dtensor.Replicate)
        ]
        return grad.to_local(), groups
    return grad, []


def _on(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``t`` on ``device`` (a copy only when it lives elsewhere)."""
    return t if t.device == device else t.to(device, non_blocking=True)


# ----------------------------------------------------------------------------------------------------
# What both scalers share: scale, unscale_, step, the per-optimizer stages and the history.
# ----------------------------------------------------------------------------------------------------
class _LossScaler:
    def __init__(self, init_scale: float, enabled: bool) -> None:
        self._enabled = enabled
        self._init_scale = init_scale
        # S on the device (0-dim float32), created by the first scale() on the device of the loss, and
        # 1/S beside it while the host knows S.  Both are replaced, never changed in place.
        self._scale: torch.Tensor | None = None
        self._inv_scale: torch.Tensor | None = None
        self._host_scale: float | None = None  # S as a Python float, None when only the device knows it
        # id(optimizer) -> {"stage": OptState, "found_inf_per_device": {device: 0-dim bool tensor},
        #                   "found_inf_host": bool, once step() has read it}
        self._per_optimizer_states: dict[int, dict[str, Any]] = {}
        # history: records read back (or known on the host), and device records not read back yet
        self._updates = 0
        self._history_done: list[tuple[int, float, bool | None]] = []
        self._history_pending: list[tuple[int, torch.Tensor, torch.Tensor]] = []
        self._history_chunks: list[tuple[list[int], torch.Tensor]] = []

    # -- small helpers ------------------------------------------------------------------------------
    def _state(self, optimizer) -> dict[str, Any]:
        return self._per_optimizer_states.setdefault(
            id(optimizer), {"stage": OptState.READY, "found_inf_per_device": {}}
        )

    def _check_scale(self, funcname: str) -> torch.Tensor:
        if self._scale is None:
            raise RuntimeError(f"Attempted {funcname} but _scale is None.  " + _FIX)
        return self._scale

    def _set_scale(self, value: float, device: torch.device) -> None:
        """S becomes ``value`` (a float32 value) on the host and, as new tensors S and 1/S, on ``device``."""
        self._host_scale = value
        self._scale = torch.full((), value, dtype=torch.float32, device=device)
        inverse = _f32(1.0 / value) if value != 0 else math.inf  # = torch's scale.double().reciprocal().float()
        self._inv_scale = torch.full((), inverse, dtype=torch.float32, device=device)

    def _lazy_init(self, device: torch.device) -> None:
        self._set_scale(_f32(self._init_scale), device)

    def _scale_on(self, device: torch.device) -> torch.Tensor:
        if self._scale is None:
            self._lazy_init(device)
        return _on(self._scale, device)

    def is_enabled(self) -> bool:
        """Whether this scaler scales (``False``: every method is a pass-through)."""
        return self._enabled

    def get_scale(self) -> float:
        """The current loss scale S as a Python float (1.0 when disabled).

        Reads the device (a synchronisation) only when the host does not know S (see the module notes).
        """
        if not self._enabled:
            return 1.0
        if self._scale is None:
            return self._init_scale
        return self._host_scale if self._host_scale is not None else self._scale.item()

    # -- 1. scale the loss ---------------------------------------------------------------------------
    def scale(self, outputs):
        """Multiply ``outputs`` by the loss scale S.

        Parameters
        ----------
        outputs : Tensor, or (nested) lists/tuples of Tensors, or another iterable of Tensors
            Usually the scalar loss.  Any shape, floating dtype and device.  The product follows torch's
            type promotion with the 0-dim float32 scale: a tensor with dimensions keeps its dtype, a 0-dim
            float16/bfloat16 tensor becomes float32 (as with ``torch.amp.GradScaler``).

        Returns
        -------
        The same structure with every tensor multiplied by S (lists and tuples keep their type; any other
        iterable becomes a lazy ``map``, as in torch).  Disabled: ``outputs`` itself.

        The first call creates S (a 0-dim float32 tensor) on the device of the first tensor; tensors on
        other devices get a copy.

        Raises
        ------
        ValueError
            An element is neither a tensor nor an iterable of tensors.
        """
        if not self._enabled:
            return outputs
        if isinstance(outputs, torch.Tensor):  # the common case: one loss
            return outputs * self._scale_on(outputs.device)

        copies: dict[torch.device, torch.Tensor] = {}  # one copy of S per device, for this call

        def apply_scale(val):
            if isinstance(val, torch.Tensor):
                if val.device not in copies:
                    copies[val.device] = self._scale_on(val.device)
                return val * copies[val.device]
            if isinstance(val, abc.Iterable) and not isinstance(val, (str, bytes, abc.Mapping)):
                scaled = map(apply_scale, val)
                return type(val)(scaled) if isinstance(val, (list, tuple)) else scaled
            raise ValueError("outputs must be a Tensor or an iterable of Tensors")

        return apply_scale(outputs)

    # -- 2. unscale the gradients --------------------------------------------------------------------
    def _unscale_grads(
        self, optimizer, inv_scale: torch.Tensor | None, allow_fp16: bool
    ) -> dict[torch.device, torch.Tensor]:
        """Check the optimizer's gradients for inf/NaN and (if ``inv_scale`` is given) multiply them by it.

        Returns {device: found_inf}, one 0-dim bool tensor per device holding gradients (torch: float32);
        empty when no parameter has a gradient.
        """
        # Group the gradients by device, refusing FP16 ones before touching any.  Sharded (DTensor)
        # gradients contribute their local shard, and the process groups that must agree on found_inf.
        groups: dict[torch.device, list[torch.Tensor]] = defaultdict(list)
        agree: dict[torch.device, list] = defaultdict(list)
        for group in optimizer.param_groups:
            for param in group["params"]:
                grad = param.grad
                if grad is None:
                    continue
                if grad.dtype == torch.float16 and not allow_fp16:
                    raise ValueError(
                        "Attempting to unscale FP16 gradients.  The optimizer must update FP32 master "
                        "weights (Micikevicius et al. 2018, §3.1): keep the parameters in float32 and "
                        "run the model in FP16 with torch.autocast, or keep an FP32 copy."
                    )
                if grad.is_sparse:
                    if grad.dtype == torch.float16:  # coalescing adds duplicates: check the sums
                        param.grad = grad = grad.coalesce()
                    grad = grad._values()  # unscale the stored values in place
                grad, process_groups = _local_shard(grad)
                groups[grad.device].append(grad)
                agree[grad.device] += [g for g in process_groups if all(g is not h for h in agree[grad.device])]

        found_inf_per_device: dict[torch.device, torch.Tensor] = {}
        with torch.no_grad():
            for device, grads in groups.items():
                # checked *before* unscaling, as torch does (g · 1/S may overflow when S < 1)
                found = found_non_finite(grads, device)
                if agree[device]:
                    found = self._agree_found_inf(found, agree[device])
                found_inf_per_device[device] = found
                if inv_scale is not None:  # each gradient keeps its dtype (bfloat16: rounded once)
                    foreach_mul_(grads, _on(inv_scale, device))
        return found_inf_per_device

    def _agree_found_inf(self, found: torch.Tensor, process_groups: list) -> torch.Tensor:
        """found_inf of sharded gradients, agreed by every rank: True when any rank's shard overflowed.

        One all-reduce (MAX) of the flag per process group, on the device (no host synchronisation), as
        ``torch.amp.GradScaler`` does for DTensor gradients.  Without it, a rank whose shard is clean would
        step while another skips, and their loss scales would part (chapter 10 measures it).  Every rank must
        call this the same number of times, in the same order: it does, because every rank holds a shard of
        every parameter (an empty one included) and walks the optimizer's parameters in the same order.
        """
        flag = found.to(torch.float32)  # collectives reduce numbers: MAX of 0/1 is "any"
        for group in process_groups:
            dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=group)
        return flag > 0

    def unscale_(self, optimizer: torch.optim.Optimizer) -> None:
        """Divide the gradients of ``optimizer``'s parameters by S, in place, and note any inf/NaN.

        Optional: :meth:`step` calls it when you have not.  Call it yourself to work with the true
        gradients before the step (clipping, logging).  Multiplies by the float32 reciprocal of S
        (computed in float64), exactly like torch.  No host synchronisation.

        Gradients may be float32, bfloat16 or float64, dense or sparse, on any devices, and sharded: the
        DTensor gradients of a model sharded by FSDP2 (``torch.distributed.fsdp.fully_shard``) are checked and
        unscaled shard by shard, and the ranks then agree on found_inf (one all-reduce of the flag, MAX, over
        the ranks that hold different shards), so that every rank skips the same steps and keeps the same S,
        as with ``torch.amp.GradScaler``.  Under DDP every rank holds the whole all-reduced gradient, so the
        ranks agree without communication.

        Whether this optimizer's step will be skipped is decided here, on the gradients as they are now.
        Clip each optimizer's gradients separately: one norm over the parameters of two optimizers
        turns all of them into NaN when the other one overflowed, after this one was found clean.

        Raises
        ------
        RuntimeError
            ``scale()`` was never called; ``unscale_`` was already called for this optimizer since the last
            :meth:`update`; or :meth:`step` was already called.
        ValueError
            A gradient is float16 (the optimizer should update FP32 master weights).
        """
        if not self._enabled:
            return
        scale = self._check_scale("unscale_")
        state = self._state(optimizer)
        if state["stage"] is OptState.UNSCALED:
            raise RuntimeError("unscale_() has already been called on this optimizer since the last update().")
        if state["stage"] is OptState.STEPPED:
            raise RuntimeError("unscale_() is being called after step().")
        inv_scale = self._inv_scale if self._inv_scale is not None else _reciprocal(scale)
        state["found_inf_per_device"] = self._unscale_grads(optimizer, inv_scale, allow_fp16=False)
        state["stage"] = OptState.UNSCALED

    # -- 3. step, or skip ----------------------------------------------------------------------------
    def step(self, optimizer: torch.optim.Optimizer, *args, **kwargs):
        """Unscale (unless :meth:`unscale_` already did) and call ``optimizer.step(*args, **kwargs)``,
        unless a gradient of this optimizer is inf or NaN.

        Returns
        -------
        What ``optimizer.step`` returns, or ``None`` when the step was skipped.

        Synchronises once per device holding gradients (``.item()`` of found_inf): Python has to know
        whether to call ``optimizer.step``.  Optimizers that handle scaling themselves
        (``_step_supports_amp_scaling``, e.g. ``torch.optim.Adam(fused=True)``) receive S and found_inf
        as the attributes ``grad_scale`` and ``found_inf`` and skip the update on the device, without a
        synchronisation; their ``step`` is always called.

        Raises
        ------
        RuntimeError
            A ``closure`` keyword (not supported while scaling); ``scale()`` was never called; ``step`` was
            already called for this optimizer since the last :meth:`update`; the optimizer has no gradient.
        ValueError
            From :meth:`unscale_` (FP16 gradients).
        NotImplementedError
            The optimizer uses the deprecated ``grad_scaler=`` keyword protocol.
        """
        if not self._enabled:
            return optimizer.step(*args, **kwargs)
        if "closure" in kwargs:
            raise RuntimeError("Closure use is not currently supported if GradScaler is enabled.")
        self._check_scale("step")
        state = self._state(optimizer)
        if state["stage"] is OptState.STEPPED:
            raise RuntimeError("step() has already been called since the last update().")

        if getattr(optimizer, "_step_supports_amp_scaling", False):
            return self._step_fused(optimizer, state, args, kwargs)

        if state["stage"] is OptState.READY:
            self.unscale_(optimizer)
        found_inf_per_device = state["found_inf_per_device"]
        if not found_inf_per_device:
            raise RuntimeError("No inf checks were recorded for this optimizer.")
        # The one host synchronisation of the iteration: skip the step if any gradient overflowed.
        state["found_inf_host"] = any([found.item() for found in found_inf_per_device.values()])
        retval = None if state["found_inf_host"] else optimizer.step(*args, **kwargs)
        state["stage"] = OptState.STEPPED
        return retval

    def _step_fused(self, optimizer, state, args, kwargs):
        """torch's protocol for optimizers that unscale and skip inside their own (fused) kernel."""
        if "grad_scaler" in inspect.signature(optimizer.step).parameters:
            raise NotImplementedError(
                "optimizers whose step() takes a grad_scaler= keyword (deprecated in "
                "torch) are not supported; use torch.amp.GradScaler"
            )
        if state["stage"] is OptState.READY:  # check only; the optimizer divides by grad_scale itself
            state["found_inf_per_device"] = self._unscale_grads(optimizer, None, allow_fp16=True)
        scale = self._scale
        found_inf = sum(_on(f, scale.device).float() for f in state["found_inf_per_device"].values())
        optimizer.grad_scale = (
            getattr(optimizer, "grad_scale", None)
            if state["stage"] is OptState.UNSCALED
            else scale * getattr(optimizer, "grad_scale", 1)
        )
        optimizer.found_inf = found_inf
        retval = optimizer.step(*args, **kwargs)
        state["stage"] = OptState.STEPPED
        del optimizer.grad_scale
        del optimizer.found_inf
        return retval

    # -- 4. update: the subclasses choose the next scale; these helpers gather found_inf ---------------
    def _found_inf_combined(self) -> torch.Tensor | None:
        """Whether any optimizer, on any device, found an inf/NaN this iteration (None if none was checked)."""
        found_infs = [
            _on(found, self._scale.device)
            for state in self._per_optimizer_states.values()
            for found in state["found_inf_per_device"].values()
        ]
        if not found_infs:
            return None
        combined = found_infs[0]
        for found in found_infs[1:]:
            combined = combined | found
        return combined

    def _found_inf_host(self) -> bool | None:
        """The combined found_inf as step() read it on the host; None if some check was never read there."""
        read = [
            state.get("found_inf_host")
            for state in self._per_optimizer_states.values()
            if state["found_inf_per_device"]
        ]
        return None if not read or None in read else any(read)

    # -- history ---------------------------------------------------------------------------------------
    def _record(
        self, scale: torch.Tensor, scale_host: float | None, found_inf: torch.Tensor | None, found_host: bool | None
    ) -> None:
        """Append the history record of this iteration without reading the device.

        Python numbers when the host knows them; otherwise the device tensors, read back with the others
        when :attr:`history` is read.  ``found_inf`` None: nothing was checked (``update(new_scale)``).
        """
        step = self._updates
        self._updates += 1
        if scale_host is not None and (found_inf is None or found_host is not None):
            self._history_done.append((step, scale_host, found_host if found_inf is not None else None))
            return
        if found_inf is None:  # NaN marks "not checked"
            found_inf = torch.full((), math.nan, dtype=torch.float32, device=scale.device)
        self._history_pending.append((step, scale, found_inf))
        if len(self._history_pending) >= _HISTORY_CHUNK:
            self._pack_history()

    def _pack_history(self) -> None:
        """Pack the pending device records into one (n, 2) device tensor (asynchronous, no sync)."""
        if self._history_pending:
            steps = [r[0] for r in self._history_pending]
            values = torch.stack(
                (
                    torch.stack([r[1] for r in self._history_pending]),
                    torch.stack([r[2] for r in self._history_pending]).float(),
                ),
                dim=1,
            )
            self._history_chunks.append((steps, values))
            self._history_pending = []

    @property
    def history(self) -> list[tuple[int, float, bool | None]]:
        """One record ``(step, scale, found_inf)`` per :meth:`update`, for plotting.

        ``step`` counts update() calls from 0 in this process (history is not part of the state dict);
        ``scale`` is the loss scale S used in that iteration (the value the loss was multiplied by);
        ``found_inf`` is True when some gradient was inf/NaN (the step of that optimizer was skipped and
        S backed off), None when ``update(new_scale)`` was called without any inf check.  Empty while
        disabled.

        Recording costs no synchronisation.  Records that only the device knew (see the module notes) are
        copied back in one transfer when this is read.
        """
        self._pack_history()
        if self._history_chunks:
            steps = [s for chunk_steps, _ in self._history_chunks for s in chunk_steps]
            values = torch.cat([v for _, v in self._history_chunks]).tolist()  # the one sync
            for step, (scale, found) in zip(steps, values):
                self._history_done.append((step, scale, None if math.isnan(found) else found != 0))
            self._history_chunks = []
            self._history_done.sort(key=lambda record: record[0])
        return list(self._history_done)

    # -- pickling (torch's rule: only between iterations) ---------------------------------------------
    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        if self._enabled:
            if self._per_optimizer_states:
                raise RuntimeError(
                    f"A {type(self).__name__} instance may only be pickled at the beginning "
                    "of an iteration, or at the end after scaler.update()."
                )
            state["_history_done"] = self.history
            state["_history_pending"], state["_history_chunks"] = [], []
            state["_init_scale"] = self.get_scale()
            # re-created lazily by the next scale()
            state["_scale"] = state["_inv_scale"] = state["_host_scale"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)


class GradScaler(_LossScaler):
    """Dynamic loss scaling, with the contract of ``torch.amp.GradScaler`` (bit-identical results).

    The loss scale S starts at ``init_scale``.  In :meth:`update`, after every iteration:

    * *backoff*: if any gradient was inf/NaN, S ← S · ``backoff_factor`` (the step was skipped);
    * *growth*: after ``growth_interval`` consecutive clean steps, S ← S · ``growth_factor``,
      unless that is inf in float32 (S never becomes inf).

    This is NVIDIA's dynamic loss scaling (growth interval N = 2000), the automatic version of
    Micikevicius et al. 2018, §3.2 "Loss scaling".  :func:`update_scale` states the exact rules.

    Parameters
    ----------
    device : str, torch.device or None, default None
        The device, as ``torch.amp.GradScaler``'s first argument (PyTorch ≥ 2.3): ``"cuda"``, ``"cuda:0"``,
        ``"cpu"``, ``torch.device("cuda", 1)``, ...  Recorded as given (``_device``, as torch does), and used
        as torch uses it: the str ``"cuda"`` on a machine without CUDA disables the scaler with a
        ``UserWarning`` (torch's rule; S would otherwise never scale a CUDA loss; torch compares the str
        only, so ``"cuda:0"`` and ``torch.device("cuda")`` stay enabled there, as here), and a tensor given to
        ``update(new_scale=...)`` must be on a device of this type.  S itself lives on the device of the first
        loss given to :meth:`scale` (a 0-dim float32 tensor), as in torch: the index is not used.  None (not
        given): no check; torch's default is ``"cuda"``, which on a CPU-only machine disables torch's scaler,
        while ``GradScaler()`` here scales on whatever device the loss is.
    init_scale : float, default 2¹⁶
        Initial S; positive, finite and nonzero in float32 (it is stored rounded to float32).
    growth_factor : float, default 2.0
        > 1.
    backoff_factor : float, default 0.5
        In (0, 1).
    growth_interval : int, default 2000
        Number of consecutive clean steps before S grows; ≥ 1.
    enabled : bool, default True
        False: every method is a pass-through (``scale`` returns its input, ``step`` just calls
        ``optimizer.step``, ``update`` does nothing, ``get_scale`` is 1.0, ``state_dict`` is ``{}``).

    Call forms.  Every call ``torch.amp.GradScaler`` accepts (PyTorch 2.3 to 2.13), positional or keyword,
    with ``device`` first: ``GradScaler("cuda")``, ``GradScaler("cpu", 2.0**10, growth_interval=100)``,
    ``GradScaler(device="cuda", init_scale=1024.0)``, ``GradScaler("cuda:0")``, ``GradScaler(torch.device("cpu"))``;
    keyword calls without a device:
    ``GradScaler(init_scale=1024.0)``.  A real number in first place is ``init_scale``, the form of
    ``torch.cuda.amp.GradScaler(init_scale, growth_factor, ...)`` (deprecated in torch): ``GradScaler(2.0**10,
    growth_interval=100)``.

    The growth tracker (consecutive clean steps) is a Python int while the host knows it, an int32 tensor
    beside S otherwise.  The state dict has no device (as torch's): it moves between devices.

    Raises
    ------
    TypeError
        An argument has the wrong type (``device`` not a str or torch.device, ``growth_interval`` not an
        int, ``enabled`` not a bool, ...), an unknown keyword, too many positional arguments, or one argument
        given twice (torch raises TypeError for the last three too).
    ValueError
        ``device`` names no device ("gpu", "CUDA"); ``init_scale`` ≤ 0 or not finite, ``growth_factor`` ≤ 1,
        ``backoff_factor`` outside (0, 1), ``growth_interval`` ≤ 0.  (torch checks only the two factors,
        with ``AssertionError``, and none when disabled; it stores any device unchecked.)

    Warns
    -----
    UserWarning
        ``device="cuda"``, ``enabled=True`` and CUDA is not available: the scaler is disabled, as
        ``torch.amp.GradScaler`` does.

    Examples
    --------
    See the module docstring.  ``state_dict()`` has torch's keys ("scale", "growth_factor",
    "backoff_factor", "growth_interval", "_growth_tracker"): checkpoints move between this class and
    ``torch.amp.GradScaler`` in both directions.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        a = _grad_scaler_arguments(args, kwargs)
        device, enabled = a["device"], a["enabled"]
        device_type = _device_type(device)
        if not isinstance(enabled, bool):
            raise TypeError(f"enabled must be a bool, got {type(enabled).__name__}")
        init_scale = _positive_scale("init_scale", a["init_scale"])
        self._growth_factor = _growth_factor(a["growth_factor"])
        self._backoff_factor = _backoff_factor(a["backoff_factor"])
        self._growth_interval = _growth_interval(a["growth_interval"])
        # torch.amp.GradScaler's rule, as torch applies it: only the str "cuda" itself is compared ("cuda:0" and
        # torch.device("cuda") stay enabled without CUDA, and then scale a loss on whatever device it is on).
        if isinstance(device, str) and device == "cuda" and enabled and not torch.cuda.is_available():
            warnings.warn(
                "GradScaler('cuda') is enabled, but CUDA is not available: disabling it, as "
                "torch.amp.GradScaler does.  Use GradScaler('cpu') or GradScaler() to scale a loss "
                "on the CPU.",
                UserWarning,
                stacklevel=2,
            )
            enabled = False
        super().__init__(init_scale, enabled)
        self._device = device  # as given, as torch stores it (its attribute name); None when not given
        self._device_type = device_type  # its type ('cuda', 'cpu', ...), which a tensor new_scale must be on
        self._init_growth_tracker = 0
        self._host_tracker: int | None = None  # while the host knows S (and the tracker)
        self._growth_tracker: torch.Tensor | None = None  # 0-dim int32, once only the device knows them

    def _lazy_init(self, device: torch.device) -> None:
        super()._lazy_init(device)
        self._host_tracker = self._init_growth_tracker

    def _leave_host(self) -> None:
        """From now on only the device knows S and the tracker: move the tracker there."""
        if self._host_scale is not None:
            self._growth_tracker = torch.full((), self._host_tracker, dtype=torch.int32, device=self._scale.device)
            self._host_scale = self._host_tracker = self._inv_scale = None

    def update(self, new_scale: float | torch.Tensor | None = None) -> None:
        """Choose S for the next iteration; call once per iteration, after :meth:`step` of every optimizer.

        The found_inf of all optimizers unscaled or stepped this iteration are combined: one overflow
        anywhere backs S off once.  No host synchronisation.

        Parameters
        ----------
        new_scale : float, 1-element float Tensor, or None
            If given, S becomes this value (copied; the growth tracker is left as it is) instead of the
            dynamic rule.  A tensor's value is not checked (that would synchronise).

        Raises
        ------
        RuntimeError
            ``scale()`` was never called, or (without ``new_scale``) no optimizer was unscaled or stepped.
        TypeError, ValueError
            ``new_scale`` is not a number or tensor, is not positive, or is a tensor on another kind of
            device, with more than one element, or requiring grad.
        """
        if not self._enabled:
            return
        scale = self._check_scale("update")
        scale_host = self._host_scale  # S of this iteration, if the host knows it
        found_inf = self._found_inf_combined()  # on the device; None if nothing was checked
        found_host = self._found_inf_host()  # as step() read it; None if it did not
        if new_scale is not None:
            self._take_new_scale(new_scale, scale)
        elif found_inf is None:
            raise RuntimeError("No inf checks were recorded prior to update.")
        elif scale_host is not None and found_host is not None:
            # The usual case: the rules run on Python numbers; the device sees S only when it changes.
            new, self._host_tracker = _update_rule(
                scale_host,
                self._host_tracker,
                found_host,
                self._growth_factor,
                self._backoff_factor,
                self._growth_interval,
            )
            if new != scale_host:
                self._set_scale(new, scale.device)
        else:
            # found_inf is known only on the device: the same rules as tensor operations.
            self._leave_host()
            self._scale, self._growth_tracker = _update_scale(
                scale, self._growth_tracker, found_inf, self._growth_factor, self._backoff_factor, self._growth_interval
            )
        self._record(scale, scale_host, found_inf, found_host)
        self._per_optimizer_states = {}  # every optimizer is READY for the next iteration

    def _take_new_scale(self, new_scale, scale: torch.Tensor) -> None:
        if isinstance(new_scale, torch.Tensor):
            device_type = self._device_type or scale.device.type  # torch checks against its device argument
            if new_scale.device.type != device_type or new_scale.numel() != 1 or new_scale.requires_grad:
                raise ValueError(
                    "new_scale should be a float or a 1-element FloatTensor on the scaler's "
                    f"device type ({device_type}) with requires_grad=False."
                )
            self._leave_host()  # its value is on the device
            self._scale = new_scale.detach().reshape(()).to(device=scale.device, dtype=torch.float32, copy=True)
            return
        value = _f32(_positive_scale("new_scale", new_scale))
        if self._host_scale is not None:
            self._set_scale(value, scale.device)
        else:
            self._scale = torch.full((), value, dtype=torch.float32, device=scale.device)

    # -- the growth parameters -------------------------------------------------------------------------
    def get_growth_factor(self) -> float:
        """The factor S is multiplied by after ``growth_interval`` clean steps."""
        return self._growth_factor

    def set_growth_factor(self, new_factor: float) -> None:
        """Set the growth factor (> 1; ValueError otherwise)."""
        self._growth_factor = _growth_factor(new_factor)

    def get_backoff_factor(self) -> float:
        """The factor S is multiplied by after an overflow."""
        return self._backoff_factor

    def set_backoff_factor(self, new_factor: float) -> None:
        """Set the backoff factor (in (0, 1); ValueError otherwise)."""
        self._backoff_factor = _backoff_factor(new_factor)

    def get_growth_interval(self) -> int:
        """Number of consecutive clean steps before S grows."""
        return self._growth_interval

    def set_growth_interval(self, new_interval: int) -> None:
        """Set the growth interval (int ≥ 1)."""
        self._growth_interval = _growth_interval(new_interval)

    def _get_growth_tracker(self) -> int:
        if not self._enabled:
            return 0
        if self._scale is None:
            return self._init_growth_tracker
        return self._host_tracker if self._host_tracker is not None else int(self._growth_tracker.item())

    # -- checkpoints -----------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The scaler's state with ``torch.amp.GradScaler``'s keys; ``{}`` when disabled.

        {"scale": float, "growth_factor": float, "backoff_factor": float, "growth_interval": int,
        "_growth_tracker": int (consecutive clean steps)}.  Call it after :meth:`update`.  The history is
        not included.
        """
        if not self._enabled:
            return {}
        return {
            "scale": self.get_scale(),
            "growth_factor": self._growth_factor,
            "backoff_factor": self._backoff_factor,
            "growth_interval": self._growth_interval,
            "_growth_tracker": self._get_growth_tracker(),
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load a state from :meth:`state_dict` or from ``torch.amp.GradScaler.state_dict()``.

        No-op when disabled.

        Raises
        ------
        RuntimeError
            ``state_dict`` is empty (saved from a disabled scaler).
        KeyError
            A key is missing.
        TypeError, ValueError
            A value breaks the constructor's rules.
        """
        if not self._enabled:
            return
        if len(state_dict) == 0:
            raise RuntimeError(
                "The source state dict is empty, possibly because it was saved from a disabled instance of GradScaler."
            )
        # check everything before changing anything
        values = (
            _positive_scale("scale", state_dict["scale"]),
            _growth_factor(state_dict["growth_factor"]),
            _backoff_factor(state_dict["backoff_factor"]),
            _growth_interval(state_dict["growth_interval"]),
            int(state_dict["_growth_tracker"]),
        )
        (
            self._init_scale,
            self._growth_factor,
            self._backoff_factor,
            self._growth_interval,
            self._init_growth_tracker,
        ) = values
        if self._scale is not None:  # the host knows S and the tracker again
            self._set_scale(_f32(self._init_scale), self._scale.device)
            self._host_tracker, self._growth_tracker = self._init_growth_tracker, None

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        if self._enabled:
            state["_init_growth_tracker"] = self._get_growth_tracker()
            state["_growth_tracker"] = state["_host_tracker"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        state = {"_device": None, **state}  # pickles from before the device argument
        if "_device_type" not in state:  # pickles from before device objects and indices were taken
            state["_device_type"] = _device_type(state["_device"])
        super().__setstate__(state)

    def __repr__(self) -> str:
        device = (
            ""
            if self._device is None
            else f"torch.device({str(self._device)!r}), "
            if isinstance(self._device, torch.device)
            else f"{self._device!r}, "
        )
        if not self._enabled:
            return f"GradScaler({device}enabled=False)"
        return (
            f"GradScaler({device}init_scale={self._init_scale!r}, growth_factor={self._growth_factor!r}, "
            f"backoff_factor={self._backoff_factor!r}, growth_interval={self._growth_interval!r})"
        )


# help() and inspect.signature show torch.amp.GradScaler's signature (the numeric first form is an alias).
GradScaler.__init__.__signature__ = inspect.Signature(
    [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    + [
        inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=default)
        for name, default in _GRAD_SCALER_DEFAULTS.items()
    ]
)


class StaticLossScaler(_LossScaler):
    """A fixed loss scale S (Micikevicius et al. 2018, §3.2 "Loss scaling": "choose a constant scaling
    factor"), with the methods and per-optimizer stage rules of :class:`GradScaler`.

    :meth:`update` never changes S; it only records the iteration in :attr:`history`.  Steps whose
    gradients hold inf/NaN are still skipped (as the static loss scale in NVIDIA apex and Megatron-LM
    does): an overflowed update would write inf/NaN into the weights, and with a well-chosen S it should
    be rare.  The history shows how often it happened.

    Parameters
    ----------
    scale : float
        S; positive, finite and nonzero in float32 (a power of two keeps the scaling exact).
        S = 1 checks for overflow without scaling.

    There is no ``device`` argument (PyTorch has no static scaler whose call this would have to match): S
    lives on the device of the first loss given to :meth:`scale`, as with :class:`GradScaler`.

    Raises
    ------
    TypeError
        ``scale`` is not a real number.
    ValueError
        ``scale`` ≤ 0, not finite, or not representable in float32.
    """

    def __init__(self, scale: float) -> None:
        super().__init__(_positive_scale("scale", scale), True)

    def update(self, new_scale: None = None) -> None:
        """End the iteration: record it in :attr:`history`; S stays the same.  No host synchronisation.

        Raises
        ------
        RuntimeError
            ``scale()`` was never called, or no optimizer was unscaled or stepped.
        ValueError
            ``new_scale`` is given (a static scale is fixed; make a new scaler instead).
        """
        scale = self._check_scale("update")
        if new_scale is not None:
            raise ValueError(
                "new_scale: a StaticLossScaler's scale is fixed; create a new StaticLossScaler "
                "(or use GradScaler) to change it"
            )
        found_inf = self._found_inf_combined()
        if found_inf is None:
            raise RuntimeError("No inf checks were recorded prior to update.")
        self._record(scale, self._host_scale, found_inf, self._found_inf_host())
        self._per_optimizer_states = {}

    def state_dict(self) -> dict[str, Any]:
        """``{"scale": float}``."""
        return {"scale": self.get_scale()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Set S from ``state_dict["scale"]`` (a GradScaler's state dict works too; other keys are ignored).

        Raises
        ------
        RuntimeError
            ``state_dict`` is empty.
        KeyError, TypeError, ValueError
            No valid "scale".
        """
        if len(state_dict) == 0:
            raise RuntimeError(
                "The source state dict is empty, possibly because it was saved from a disabled instance of GradScaler."
            )
        self._init_scale = _positive_scale("scale", state_dict["scale"])
        if self._scale is not None:
            self._set_scale(_f32(self._init_scale), self._scale.device)

    def __repr__(self) -> str:
        return f"StaticLossScaler(scale={self._init_scale!r})"
