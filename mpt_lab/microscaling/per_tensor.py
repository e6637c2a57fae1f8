"""Per-tensor scaling, as Transformer Engine: one FP32 scale per tensor, current or delayed.

* :func:`scale_from_amax`: scale = (fmt.max / amax) / 2^margin in float32 (TE's ``compute_scale_from_amax``);
* :func:`quantize_per_tensor` → ``(q, scale)``: current scaling (TE's ``Float8CurrentScaling``), the amax of
  the tensor itself; :class:`ScaledTensor` holds the pair;
* :class:`DelayedScaling`: TE's ``DelayedScaling`` recipe, the scale from the amax history of earlier steps.

What is computed: q = round_to(fl32(x · scale), fmt): the product is formed in float32 (float64 for float64
x) and then rounded to the format, round-to-nearest-even with saturation, which is Transformer Engine's FP32
multiply-then-cast (its cast kernel ``unary_kernel`` in ``transformer_engine/common/util/
vectorized_pointwise.h``: ``temp = temp * s;`` in FP32, then ``static_cast<OutputType>(temp)``).  That is
two roundings: where the exact product lies within half a float32 ulp of a midpoint between two values of
the format, the float32 product is the midpoint itself, and the tie goes to the even neighbour, which need
not be the neighbour nearest to the exact product (a test shows one such value).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .. import formats as F
from ..formats import FloatFormat, FormatLike, exact_arithmetic
from ._core import (
    FP32_MAX,
    QuantizedTensor,
    abs_max,
    as_float32,
    beyond_range,
    check_bool,
    check_choice,
    check_dtype,
    check_int,
    check_rounding,
    check_tensor,
    pow2,
    scalar_format,
    work_dtype,
)

__all__ = ["scale_from_amax", "ScaledTensor", "quantize_per_tensor", "DelayedScaling"]


def _check_margin(margin) -> int:
    margin = check_int(margin, "margin")
    if not -126 <= margin <= 126:
        raise ValueError(f"margin must lie in [-126, 126] (2^margin must be a normal float32), got {margin}")
    return margin


@exact_arithmetic
def scale_from_amax(
    amax: float | torch.Tensor,
    fmt: FormatLike,
    *,
    margin: int = 0,
    power_of_two: bool = False,
    previous: float | torch.Tensor | None = None,
) -> torch.Tensor:
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
    fmt = scalar_format(fmt, "fmt")
    margin = _check_margin(margin)
    check_bool(power_of_two, "power_of_two")
    a = as_float32(amax, "amax", None)
    sf = torch.tensor(fmt.max, dtype=torch.float32, device=a.device) / a
    sf = sf / 2.0**margin if margin >= 0 else sf * 2.0**-margin
    sf = torch.where(torch.isinf(sf), torch.full_like(sf, FP32_MAX), sf)
    if power_of_two:
        _, e = torch.frexp(sf)  # sf = m·2^e, m ∈ [0.5, 1)
        sf = torch.where(sf > 0, pow2(e - 1, torch.float32), sf)
    prev = torch.ones_like(sf) if previous is None else as_float32(previous, "previous", a.device).expand_as(sf)
    return torch.where(torch.isfinite(a) & (a > 0), sf, prev)


@dataclass(frozen=True, eq=False)
class ScaledTensor(QuantizedTensor):
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
        dtype = self.dtype if dtype is None else check_dtype(dtype)
        return (self.q.to(torch.float64) / self.scale.to(torch.float64)).to(dtype)

    def codes(self) -> torch.Tensor:
        """The codes of q in ``fmt`` (uint8 for formats of at most 8 bits; see :func:`mpt_lab.formats.encode`)."""
        return F.encode(self.q, self.fmt)

    @exact_arithmetic
    def saturated(self, x: torch.Tensor) -> torch.Tensor:
        """Where x·scale was beyond fmt's range (bool, x's shape): clamped to ±max, or overflowed."""
        x = check_tensor(x)
        return beyond_range(x.to(torch.float64) * self.scale.to(x.device, torch.float64), self.fmt)


def _round_scaled(
    x: torch.Tensor,
    scale: torch.Tensor,
    fmt: FloatFormat,
    saturate: bool,
    rounding: str = "nearest_even",
    generator=None,
) -> torch.Tensor:
    """round_to(fl32(x · scale), fmt) as float32: the product rounded to float32 (float64 for float64 x), then
    to fmt, as Transformer Engine's FP32 multiply-then-cast (module docstring).  Two roundings: near a
    midpoint of fmt this can differ from the exact product rounded once."""
    w = x.to(work_dtype(x.dtype))
    return F.round_to(w * scale.to(w.dtype), fmt, saturate=saturate, rounding=rounding, generator=generator).to(
        torch.float32
    )


@exact_arithmetic
def quantize_per_tensor(
    x: torch.Tensor,
    fmt: FormatLike,
    *,
    amax: float | torch.Tensor | None = None,
    margin: int = 0,
    power_of_two: bool = False,
    saturate: bool = True,
    rounding: str = "nearest_even",
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-tensor scaling as Transformer Engine: q = round_to(fl32(x·scale), ``fmt``), x ≈ q / scale.

    scale = (fmt.max / amax) / 2^margin (:func:`scale_from_amax`), with amax = max |x| (current scaling, TE's
    ``Float8CurrentScaling``) unless ``amax`` is given (delayed scaling passes the amax of its history).  The
    product x·scale is rounded to float32 (float64 for float64 x), and that to ``fmt``, round-to-nearest-even:
    Transformer Engine's FP32 multiply-then-cast, two roundings (near a midpoint of ``fmt`` the result can
    differ from the exact product rounded once; see the module docstring).  Beyond ±fmt.max the values
    saturate to ±fmt.max (TE's casts, OCP OFP8's saturating conversion) or, with ``saturate=False``, overflow
    as the format does (E5M2: ±inf, E4M3: NaN).

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
    rounding : {"nearest_even", "stochastic"}
        How fl32(x·scale) is rounded to fmt: to nearest-even (Transformer Engine's cast), or stochastically
        from ``generator`` (:func:`mpt_lab.formats.round_to`; unbiased where nothing saturates).
    generator : None, int or torch.Generator (stochastic rounding only)

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
    x = check_tensor(x)
    fmt = scalar_format(fmt, "fmt")
    check_bool(saturate, "saturate")
    rounding = check_rounding(rounding)
    a = abs_max(x).to(torch.float32) if amax is None else as_float32(amax, "amax", x.device)
    if a.dim() != 0:
        raise ValueError(f"amax must be a single value (0-d), got shape {tuple(a.shape)}")
    scale = scale_from_amax(a, fmt, margin=margin, power_of_two=power_of_two)
    return _round_scaled(x, scale, fmt, saturate, rounding, generator), scale


# ----------------------------------------------------------------------------------------------------------
# delayed scaling (Transformer Engine's DelayedScaling recipe)
# ----------------------------------------------------------------------------------------------------------
class _History:
    """The state of one tensor in :class:`DelayedScaling`."""

    def __init__(self, fmt: FloatFormat, length: int, device):
        self.fmt = fmt
        self.amax = torch.zeros(length, dtype=torch.float32, device=device)  # entry 0: the current step
        self.scale = torch.ones((), dtype=torch.float32, device=device)
        self.exceeded = torch.zeros((), dtype=torch.int64, device=device)  # in the current step
        self.total_exceeded = 0
        self.used = False


class DelayedScaling:
    """Transformer Engine's delayed scaling: each tensor is cast with a scale computed from the amax history of
    earlier steps, and the histories advance once per step.

    Per named tensor there is an amax history of ``history_len`` entries (zeros at first) and a scale (1 at
    first).  :meth:`quantize` casts with the current, stale, scale exactly as :func:`quantize_per_tensor` with
    that scale (q = round_to(fl32(x·scale), fmt): TE's FP32 multiply-then-cast), records max |x| in the history's current entry (the maximum, if called more than once in a
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

    def __init__(
        self,
        history_len: int = 16,
        margin: int = 0,
        forward="FP8_E4M3",
        backward="FP8_E5M2",
        *,
        amax_compute_algo: str = "max",
        saturate: bool = True,
        power_of_two: bool = False,
    ):
        self.history_len = check_int(history_len, "history_len", 1)
        self.margin = _check_margin(margin)
        self.forward = scalar_format(forward, "forward")
        self.backward = scalar_format(backward, "backward")
        self.amax_compute_algo = check_choice(amax_compute_algo, "amax_compute_algo", ("max", "most_recent"))
        self.saturate = check_bool(saturate, "saturate")
        self.power_of_two = check_bool(power_of_two, "power_of_two")
        self.step = 0
        self.log: list[dict] = []
        self._state: dict[str, _History] = {}

    def __repr__(self) -> str:
        return (
            f"DelayedScaling(history_len={self.history_len}, margin={self.margin}, "
            f"forward={self.forward.name!r}, backward={self.backward.name!r}, "
            f"amax_compute_algo={self.amax_compute_algo!r}, step={self.step}, tensors={self.names})"
        )

    def _get(self, name: str, backward: bool, device) -> _History:
        if not isinstance(name, str):
            raise TypeError(f"name must be a str, got {type(name).__name__}")
        fmt = self.backward if backward else self.forward
        st = self._state.get(name)
        if st is None:
            st = self._state[name] = _History(fmt, self.history_len, device)
        elif st.fmt != fmt:
            raise ValueError(
                f"name {name!r} holds a {st.fmt.name} tensor; use another name for a {fmt.name} "
                f"({'backward' if backward else 'forward'}) tensor"
            )
        return st

    @exact_arithmetic
    def quantize(self, x: torch.Tensor, name: str, *, backward: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """Cast x with the stale scale of tensor ``name``: q = round_to(fl32(x·scale), fmt), the float32 product
        rounded to the format as Transformer Engine's cast does (two roundings; see the module docstring);
        returns (q, scale) as :func:`quantize_per_tensor`.

        Raises TypeError/ValueError for a bad x or name, or a name reused for the other direction.
        """
        x = check_tensor(x)
        check_bool(backward, "backward")
        st = self._get(name, backward, x.device)
        scale = st.scale.to(x.device)
        st.amax[0] = torch.maximum(st.amax[0], abs_max(x).to(st.amax.device, torch.float32))
        beyond = beyond_range(x.to(torch.float64) * scale.to(torch.float64), st.fmt)
        st.exceeded = st.exceeded + beyond.sum().to(st.exceeded.device)
        st.used = True
        return _round_scaled(x, scale, st.fmt, self.saturate), scale.clone()

    @exact_arithmetic
    def update(self) -> None:
        """End a step: the next scales from the histories, then roll the histories (see the class docstring)."""
        for name, st in self._state.items():
            amax = st.amax.max() if self.amax_compute_algo == "max" else st.amax[0]
            new = scale_from_amax(amax, st.fmt, margin=self.margin, power_of_two=self.power_of_two, previous=st.scale)
            exceeded = int(st.exceeded)
            if st.used:
                self.log.append(
                    {
                        "step": self.step,
                        "name": name,
                        "format": st.fmt.name,
                        "amax": float(st.amax[0]),
                        "scale": float(st.scale),
                        "exceeded": exceeded,
                        "next_scale": float(new),
                    }
                )
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
        return {
            "step": self.step,
            "tensors": {
                n: {
                    "format": s.fmt.name,
                    "amax_history": s.amax.cpu().clone(),
                    "scale": float(s.scale),
                    "exceeded": s.total_exceeded,
                }
                for n, s in self._state.items()
            },
        }

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict`'s output (on the CPU; tensors move to x's device when quantised)."""
        if not isinstance(state, dict) or "tensors" not in state or "step" not in state:
            raise TypeError("state must be a dict from DelayedScaling.state_dict()")
        tensors = {}
        for n, s in state["tensors"].items():
            hist = torch.as_tensor(s["amax_history"], dtype=torch.float32)
            if tuple(hist.shape) != (self.history_len,):
                raise ValueError(
                    f"the amax history of {n!r} has {hist.numel()} entries; this recipe keeps {self.history_len}"
                )
            st = tensors[n] = _History(F.get_format(s["format"]), self.history_len, None)
            st.amax, st.scale, st.total_exceeded = hist.clone(), torch.tensor(float(s["scale"])), int(s["exceeded"])
        self.step, self._state = int(state["step"]), tensors
