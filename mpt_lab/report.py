"""A precision report for any PyTorch model: what one training step would do in FP16, BF16 or FP8.

:func:`precision_report` runs one FP32 forward and backward of ``loss_fn(model, batch)`` while recording, for
every module (named as in ``model.named_modules()``) the log2 histogram of its forward output (its
*activation*) and of the gradient of the loss with respect to that output (its *activation gradient*), and
for every parameter the histograms of its weight and its weight gradient.  Then, for each format, it runs the
same step again under that format's numerics (:class:`mpt_lab.simulate.simulate`, autocast by default) and
notes where values first become inf/NaN.  The model is left exactly as it was found.

From these numbers the :class:`PrecisionReport` answers the questions people bring to issue trackers:

* :meth:`PrecisionReport.forward_overflows`: which modules' outputs overflow the format (T5's feed-forward
  output in FP16, Hugging Face transformers issue 5651);
* :meth:`PrecisionReport.first_nonfinite`: where the step first produces inf/NaN in that format ("FP16 gives
  NaN where FP32 works", PyTorch issue 40497);
* :meth:`PrecisionReport.loss_scale_window`: the loss scales that keep the gradients (the max-gradient rule of
  Micikevicius et al. 2018 §3.2 above, the underflow share below) and what a dynamic scaler starting at 2¹⁶
  would do (:meth:`PrecisionReport.dynamic_scaler`; fairseq issue 512's falling loss scale);
* :meth:`PrecisionReport.shares`: per module, the share of activations, activation gradients, weights and
  weight gradients that overflow, underflow to zero or become subnormal;
* :meth:`PrecisionReport.optimizer_checks`: optimizer constants (Adam's ``eps``) that vanish or change in the
  format (PyTorch issue 147437), and the share of the step's updates that weights stored in the format without
  FP32 master weights would lose (Micikevicius et al. 2018 §3.1);
* :meth:`PrecisionReport.recommendation`: one sentence per format, derived from the numbers above.

Presentation: ``str(report)`` (plain-text tables), ``_repr_html_`` (the same in a notebook),
:meth:`PrecisionReport.to_dict` (JSON-ready, with provenance) and :meth:`PrecisionReport.plot` (modules × log2
magnitude, with each format's representable window drawn over it).

Everything is computed from exact counts (:class:`mpt_lab.histogram.Log2Histogram`, whose ``fractions`` are
what :func:`mpt_lab.formats.round_to` would do value by value) and from the simulated steps; nothing is
estimated.  The module needs only torch (no Hugging Face library).
"""

from __future__ import annotations

import copy
import html
import math
import numbers
import random
import weakref
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import torch

from . import formats as F
from .device import provenance
from .histogram import Log2Histogram, log2_histogram
from .master_weights import swamped
from .scaling import max_gradient_scale
from .simulate import MODES, paused, simulate

__all__ = ["precision_report", "PrecisionReport", "ModuleRecord", "ParameterRecord", "FormatRun",
           "DEFAULT_FORMATS", "KINDS"]

#: The formats a report analyses unless told otherwise.
DEFAULT_FORMATS = ("FP16", "BF16", "FP8_E4M3", "FP8_E5M2")

#: The four kinds of values a report counts per module: forward outputs, their gradients, weights, and weight
#: gradients.
KINDS = ("activation", "activation_gradient", "weight", "weight_gradient")

#: The dynamic loss scaler a report predicts: torch.amp.GradScaler's defaults (start at 2¹⁶, halve on overflow).
SCALER_INIT = 2.0 ** 16

# --------------------------------------------------------------------------------------------------- records
@dataclass
class ModuleRecord:
    """What the FP32 step recorded for one module.

    Attributes
    ----------
    name : str, the qualified name of ``model.named_modules()`` ("" is the model itself)
    type : str, the module's class name
    order : int, position in execution order (the order in which the modules' forward calls returned; a module
        called several times counts from its first call)
    calls : int, forward calls during the step
    activation : Log2Histogram of every floating tensor in the module's outputs (all calls; tensors inside
        tuples, lists and dicts — Hugging Face ``ModelOutput`` — included)
    activation_gradient : Log2Histogram of the gradients of the loss with respect to those outputs (empty when
        no gradient reached them; the loss itself, when a module returns it, gets none: its gradient is
        backward's seed 1, not a value the step computes)
    parameters : names of the parameters that belong to this module itself (not to its children)
    """

    name: str
    type: str
    order: int
    calls: int = 0
    activation: Log2Histogram = field(default_factory=Log2Histogram)
    activation_gradient: Log2Histogram = field(default_factory=Log2Histogram)
    parameters: list = field(default_factory=list)

    @property
    def label(self) -> str:
        """The name as tables show it ("(model)" for the model itself)."""
        return self.name or "(model)"


@dataclass
class ParameterRecord:
    """What the FP32 step recorded for one parameter (a tensor shared by several modules is recorded once).

    Attributes
    ----------
    name : str, the first qualified name of ``model.named_parameters()``
    module : str, the name of the module that holds it under ``name``
    shape : tuple of int
    dtype : str, e.g. "torch.float32"
    requires_grad : bool (False: frozen, no gradient)
    aliases : list of the other names of the same tensor (tied weights, e.g. an LM head tied to the embedding)
    weight : Log2Histogram of its values
    gradient : Log2Histogram of its gradient after the step, or None (frozen, or no gradient reached it)
    """

    name: str
    module: str
    shape: tuple
    dtype: str
    requires_grad: bool
    aliases: list
    weight: Log2Histogram
    gradient: Log2Histogram | None


@dataclass
class FormatRun:
    """The step run again under one format's numerics (:class:`mpt_lab.simulate.simulate`).

    Attributes
    ----------
    format : str
    mode : "autocast" or "all" (as :class:`~mpt_lab.simulate.simulate`)
    loss : float, the loss of the step (inf/NaN when it overflowed)
    events : list of (module name, "forward" | "backward", finite) in the order the step produced them: a module's
        output (forward) or the gradient of its output (backward), and whether all its values were finite
    nonfinite_parameter_gradients : names of the parameters whose gradient held inf/NaN after the step
    """

    format: str
    mode: str
    loss: float
    events: list
    nonfinite_parameter_gradients: list


# --------------------------------------------------------------------------------------------------- hooks
def _floating_tensors(obj, depth: int = 0):
    """The floating tensors of a module's output: a tensor, or (nested) tuples, lists and Mapping values
    (Hugging Face ``ModelOutput`` is an ordered dict).  Other objects (caches, ints, None) are skipped."""
    if isinstance(obj, torch.Tensor):
        if obj.is_floating_point():
            yield obj
    elif depth < 6 and isinstance(obj, (tuple, list)):
        for o in obj:
            yield from _floating_tensors(o, depth + 1)
    elif depth < 6 and isinstance(obj, Mapping):
        for o in obj.values():
            yield from _floating_tensors(o, depth + 1)


class _Recorder:
    """Forward hooks on every module, gradient hooks on every module output, for one step.

    ``measure(t)`` turns a tensor (a forward output, or the gradient of one) into a record: a Log2Histogram
    for the FP32 step, whether all its values are finite for a format's step.  The same tensor (same object, same version) output
    by several modules (a container returning its last child's output) is measured once; its gradient too.

    Gradients are read by a pre-hook on the autograd node that produced the output (``grad_fn``): those run
    after every tensor hook (PyTorch's documented hook order), so they see the gradient exactly as the step
    uses it — also the rounding that :class:`~mpt_lab.simulate.simulate` applies in a tensor hook.  An output
    changed in place later (``ReLU(inplace=True)``) keeps the node it had, so its gradient is the one with
    respect to the value the module returned.
    """

    def __init__(self, named_modules: dict, measure):
        self.measure = measure
        self.names = {id(m): n for n, m in named_modules.items()}
        self.handles: list = []
        self.calls: dict = {}           # name -> number of forward calls
        self.order: list = []           # names in order of their first returned forward call
        self.forward: dict = {}         # name -> list of measures of outputs
        self.backward: dict = {}        # name -> list of measures of output gradients
        self.events: list = []          # (name, "forward"|"backward", measure) in time order
        self.unique_forward: list = []  # measures of distinct output tensors
        self.unique_backward: list = []
        self._seen_out: dict = {}       # (id, version) -> (weakref, measure)
        self._grad_targets: dict = {}   # (id(node), output_nr) -> list of names
        self._nodes: dict = {}          # id(node) -> node (kept alive until the step ends)
        for n, m in named_modules.items():
            self.handles.append(m.register_forward_hook(self._hook))

    def _hook(self, module, inputs, output):
        name = self.names.get(id(module))
        if name is None:
            return
        if name not in self.calls:
            self.calls[name] = 0
            self.order.append(name)
        self.calls[name] += 1
        for t in _floating_tensors(output):
            try:
                key = (id(t), t._version)
            except RuntimeError:   # inference tensors have no version counter
                key = (id(t), None)
            seen = self._seen_out.get(key)
            if seen is not None and seen[0]() is t:
                rec = seen[1]
            else:
                rec = self.measure(t)
                self.unique_forward.append(rec)
                self._seen_out[key] = (weakref.ref(t), rec)
            self.forward.setdefault(name, []).append(rec)
            self.events.append((name, "forward", rec))
            if t.requires_grad and torch.is_grad_enabled():
                self._watch_gradient(name, t)

    def _watch_gradient(self, name: str, t: torch.Tensor) -> None:
        node = t.grad_fn
        if node is None:  # a leaf returned as output (a module that returns a parameter)
            self.handles.append(t.register_hook(lambda g, name=name: self._record_grads([name], g)))
            return
        key = (id(node), t.output_nr)
        names = self._grad_targets.get(key)
        if names is not None:
            if name not in names:
                names.append(name)
            return
        self._grad_targets[key] = [name]
        if id(node) not in self._nodes:
            self._nodes[id(node)] = node
            self.handles.append(node.register_prehook(self._node_prehook(id(node))))

    def _node_prehook(self, node_id: int):
        def prehook(grad_outputs):
            for nr, g in enumerate(grad_outputs):
                names = self._grad_targets.get((node_id, nr))
                if names is not None and g is not None and g.is_floating_point():
                    self._record_grads(names, g)
            return None
        return prehook

    def _record_grads(self, names, g):
        rec = self.measure(g)
        self.unique_backward.append(rec)
        for name in names:
            self.backward.setdefault(name, []).append(rec)
            self.events.append((name, "backward", rec))

    def ignore_gradient_of(self, t: torch.Tensor) -> None:
        """Record no gradient for ``t`` (the loss: its gradient is backward's seed, 1, not a computed value)."""
        if t.grad_fn is not None:
            self._grad_targets.pop((id(t.grad_fn), t.output_nr), None)

    def close(self) -> None:
        for h in self.handles:
            h.remove()
        self.handles = []
        self._nodes.clear()
        self._seen_out.clear()


def _finite(t: torch.Tensor) -> bool:
    """Whether every value of t is finite, computed unrounded: one fast pass (the sum is non-finite when a value
    is), confirmed value by value only when the sum is not finite (a sum of finite values can overflow)."""
    with paused():
        if t.numel() == 0:
            return True
        t = t.detach()
        if bool(torch.isfinite(t.sum())):
            return True
        return bool(torch.isfinite(t).all())


def _sum_hists(hists) -> Log2Histogram:
    out = Log2Histogram()
    for h in hists:
        out = out + h
    return out


# ---------------------------------------------------------------------------------------------- the state
class _SavedState:
    """Everything the report could change, saved before and restored after: parameter values, buffers, .grad,
    training flags, and the global random number generators (torch CPU and CUDA, Python's, NumPy's)."""

    def __init__(self, model: torch.nn.Module):
        self.model = model
        with torch.no_grad():
            self.params = [(p, p.detach().clone(), p.grad, p._version) for p in model.parameters()]
            self.buffers = [(b, b.detach().clone()) for b in model.buffers()]
        self.training = [(m, m.training) for m in model.modules()]
        self.torch_rng = torch.get_rng_state()
        self.cuda_rng = torch.cuda.get_rng_state_all() if torch.cuda.is_available() and torch.cuda.is_initialized() \
            else None
        self.py_rng = random.getstate()
        self.np_rng = np.random.get_state()

    def reset_rng(self) -> None:
        """The random state as it was (each step of the report draws the same dropout masks)."""
        torch.set_rng_state(self.torch_rng)
        if self.cuda_rng is not None:
            torch.cuda.set_rng_state_all(self.cuda_rng)
        random.setstate(self.py_rng)
        np.random.set_state(self.np_rng)

    def clear_grads(self) -> None:
        for p, _, _, _ in self.params:
            p.grad = None

    def restore_values(self) -> None:
        """Parameters back to their saved values where something wrote to them (their version counter moved),
        buffers always (kernels such as batch norm's update running statistics without moving it)."""
        with torch.no_grad():
            for p, saved, _, version in self.params:
                if p._version != version:
                    p.copy_(saved)
            for b, saved in self.buffers:
                b.copy_(saved)
        for m, mode in self.training:
            m.training = mode

    def restore(self) -> None:
        self.restore_values()
        for p, _, grad, _ in self.params:
            p.grad = grad
        self.reset_rng()


# ------------------------------------------------------------------------------------------------- checks
def _check_formats(formats) -> list:
    if isinstance(formats, (str, F.FloatFormat)):
        formats = [formats]
    try:
        items = list(formats)
    except TypeError:
        raise TypeError(f"formats must be a format name, a FloatFormat or a sequence of them, "
                        f"got {type(formats).__name__}") from None
    if not items:
        raise ValueError("formats must name at least one format, e.g. ('FP16', 'BF16')")
    out = []
    for f in items:
        fmt = F.get_format(f, "formats")
        if not fmt.subnormals:
            raise ValueError(f"formats: {fmt.name} has no zero (a scale format); a report needs formats that "
                             "hold gradients, e.g. FP16, BF16, FP8_E4M3, FP8_E5M2")
        if fmt.name not in out:
            out.append(fmt.name)
    return out


def _check_loss(loss, where: str) -> torch.Tensor:
    if not isinstance(loss, torch.Tensor):
        hint = " (for a Hugging Face model: loss_fn = lambda m, b: m(**b).loss)" if isinstance(loss, Mapping) else ""
        raise TypeError(f"loss_fn must return the loss as a scalar torch.Tensor, got {type(loss).__name__}{hint}")
    if loss.numel() != 1:
        raise ValueError(f"loss_fn must return a scalar loss (one element), got a tensor of shape "
                         f"{tuple(loss.shape)}; reduce it (e.g. .mean()) inside loss_fn")
    if not loss.is_floating_point():
        raise TypeError(f"loss_fn must return a floating-point loss, got dtype {loss.dtype}")
    if not loss.requires_grad:
        raise ValueError(f"the loss of {where} does not require grad: no trainable parameter of the model "
                         "contributed to it (were all parameters frozen, or was it computed under no_grad?)")
    return loss


def _add_context(err: BaseException, text: str) -> None:
    if hasattr(err, "add_note"):   # Python ≥ 3.11: the model's own error, with the report's context below it
        err.add_note(text)


def _log2(x: float) -> int:
    m, e = math.frexp(x)
    return e - 1


def _pow2_text(x) -> str:
    if x is None:
        return "–"
    if not math.isfinite(x):
        return "∞"
    return f"2^{_log2(x)}"


def _num(x) -> str:
    if x is None:
        return "–"
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)
    return f"{x:.3g}"


def _pct(v) -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "–"
    if v == 0:
        return "0"
    return f"{100 * v:.3g}%"


def _json_float(x):
    """A float for JSON: None for NaN, "inf"/"-inf" for infinities."""
    if x is None:
        return None
    x = float(x)
    if math.isnan(x):
        return None
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    return x


def _coarse(h: Log2Histogram | None):
    """A histogram as JSON: counts per binade (exponent → count), zeros, non-finite, total, amax."""
    if h is None:
        return None
    c = h.counts
    nz = np.nonzero(c)[0]
    return {"counts": {str(int(h.exponents[i])): int(c[i]) for i in nz}, "zeros": h.zeros,
            "nonfinite": h.nonfinite, "total": h.total, "amax": _json_float(h.amax)}


# ------------------------------------------------------------------------------------------------- report
class PrecisionReport:
    """The precision report of one model, loss and batch: made by :func:`precision_report`.

    Attributes
    ----------
    model_type : str, the model's class name
    formats : list of str, the formats analysed (catalogue names, e.g. "FP16")
    mode : "autocast" or "all", the numerics of the formats' steps (as :class:`~mpt_lab.simulate.simulate`)
    loss : float, the loss of the FP32 step
    modules : list of :class:`ModuleRecord`, in execution order (modules that ran during the step)
    parameters : list of :class:`ParameterRecord`, in ``model.named_parameters()`` order
    runs : dict format name → :class:`FormatRun`
    fp32_events : list of (module, "forward" | "backward", Log2Histogram) of the FP32 step, in time order
    gradients : Log2Histogram of every gradient of the step: each distinct module output's gradient once, and
        every parameter gradient
    activations : Log2Histogram of every distinct module output of the step
    weights : Log2Histogram of every parameter's values
    provenance : dict, where the report came from (:func:`mpt_lab.device.provenance`)
    """

    def __init__(self, *, model_type, formats, mode, loss, modules, parameters, runs, fp32_events, gradients,
                 activations, optimizer_info, provenance, n_parameters, training):
        self.model_type = model_type
        self.formats = list(formats)
        self.mode = mode
        self.loss = loss
        self.modules = modules
        self.parameters = parameters
        self.runs = runs
        self.fp32_events = fp32_events
        self.gradients = gradients
        self.activations = activations
        self.weights = _sum_hists(p.weight for p in parameters)
        self._optimizer = optimizer_info
        self.provenance = provenance
        self.n_parameters = n_parameters
        self.training = training
        self._by_name = {m.name: m for m in modules}
        self._cache: dict = {}

    # --- helpers ---------------------------------------------------------------------------------------------
    def _fmt(self, fmt) -> F.FloatFormat:
        f = F.get_format(fmt, "fmt")
        if f.name not in self.formats:
            raise ValueError(f"fmt: {f.name} was not analysed by this report; it analysed {self.formats} "
                             "(pass formats=... to precision_report)")
        return f

    def _counts(self, h: Log2Histogram, fmt: F.FloatFormat, scale: float = 1.0) -> dict:
        key = (id(h), fmt.name, scale)
        c = self._cache.get(key)
        if c is None or c[0] is not h:      # the entry holds its histogram: an id is never reused while cached
            c = self._cache[key] = (h, h.category_counts(fmt, scale))
        return c[1]

    def _overflows(self, h: Log2Histogram, fmt: F.FloatFormat, scale: float = 1.0) -> bool:
        """Whether some value of h, times scale, overflows fmt when rounded (becomes inf/NaN, or beyond max)."""
        if h.total == 0:
            return False
        if self._counts(h, fmt, scale)["overflow"] > 0:
            return True
        a = h.amax * scale
        if a == 0 or not math.isfinite(a):
            return not math.isfinite(a)
        r = F.round_to(a, fmt)       # covers E4M3's (464, 480), which category_counts counts as normal
        return not math.isfinite(r) or r > fmt.max

    def _kept(self, h: Log2Histogram, fmt: F.FloatFormat, scale: float = 1.0) -> float:
        """Share of h's non-zero finite values that do not round to zero in fmt after × scale (NaN if none)."""
        c = self._counts(h, fmt, scale)
        nz = c["normal"] + c["subnormal"] + c["underflow"] + c["overflow"]
        return 1.0 - c["underflow"] / nz if nz else float("nan")

    def _module_weights(self, name: str):
        m = self._by_name[name]
        by = {p.name: p for p in self.parameters}
        return [by[n] for n in m.parameters if n in by]

    # --- what the report answers -----------------------------------------------------------------------------
    def forward_overflows(self, fmt) -> list:
        """The modules whose forward outputs overflow ``fmt``, in execution order.

        Definition: the names (as ``model.named_modules()``) of the modules of which some output value of the
        FP32 step, rounded to ``fmt`` (round-to-nearest-even), is no longer finite or lies beyond ``fmt.max``
        — i.e. |x| ≥ max + ½ulp(max) for formats with infinities (FP16: |x| ≥ 65520 becomes inf).  A module
        called several times is listed once, at its first call.  The values are those of the FP32 step (what
        a cast of each output would do), not those of the step in ``fmt``'s numerics (see
        :meth:`first_nonfinite`).  The cure: run these modules in FP32, or use a format with a wider range
        (BF16).

        Raises ValueError when ``fmt`` was not analysed by this report.
        """
        f = self._fmt(fmt)
        return [m.name for m in self.modules if self._overflows(m.activation, f)]

    def first_nonfinite(self, fmt):
        """``(module name, "forward" | "backward")`` of the first module whose output, or whose output's
        gradient, holds inf or NaN in the step run under ``fmt``'s numerics; None if none does.

        Definition: the step of :func:`precision_report` (``loss_fn(model, batch)`` then ``backward()``) run
        inside ``simulate(fmt, mode=report.mode)`` at loss scale 1; "first" in the order the step computes the
        values: forward outputs in execution order, then output gradients in the order backward produces them.
        A module whose gradient is recorded is the one that produced the output (a container that returns its
        child's output shares it).  For ``"FP32"`` this is the FP32 step itself.

        Raises ValueError when ``fmt`` was not analysed by this report.
        """
        f = self._fmt(fmt)
        for name, where, finite in self.runs[f.name].events:
            if not finite:
                return (name, where)
        return None

    def loss_scale_window(self, fmt, keep: float = 0.999) -> tuple:
        """``(low, high)``: the loss scales, powers of two, that suit the step's gradients in ``fmt``.

        Definitions (over every gradient of the step, :attr:`gradients`: each distinct module output's gradient
        once and every parameter gradient, as the FP32 step computed them):

        * ``high`` is the max-gradient rule of Micikevicius et al. 2018 §3.2:
          :func:`mpt_lab.scaling.max_gradient_scale` of the largest |gradient|, the largest power of two S
          with amax · S ≤ ``fmt.max``, and at most 2¹²⁷, the largest power of two a float32 loss scale can
          hold (``torch.amp.GradScaler`` keeps its scale in float32; BF16's rule alone can exceed it);
        * ``low`` is the smallest power of two S such that at least ``keep`` of the non-zero finite gradient
          values, multiplied by S and rounded to ``fmt``, do not round to zero (exact counts,
          :meth:`mpt_lab.histogram.Log2Histogram.category_counts`).

        ``low > high`` means that no single loss scale both keeps ``keep`` of the gradients and keeps the
        largest one finite: the gradients span more binades than the format has (per-tensor or block
        scaling is needed).  ``(None, None)`` when the step has no non-zero finite gradient.

        Parameters
        ----------
        fmt : a format this report analysed
        keep : float in (0, 1], default 0.999

        Raises
        ------
        TypeError, ValueError
            ``keep`` not a real number in (0, 1]; ``fmt`` not analysed by this report.
        """
        f = self._fmt(fmt)
        if isinstance(keep, bool) or not isinstance(keep, numbers.Real) or not (0 < float(keep) <= 1):
            raise ValueError(f"keep must be a share in (0, 1], got {keep!r}")
        keep = float(keep)
        g = self.gradients
        amax = g.amax
        if amax == 0 or not math.isfinite(amax):
            return (None, None)
        high = min(max_gradient_scale(amax, f), 2.0 ** 127)
        lo_j, hi_j = -1074, 1023          # kept share grows with the scale: bisect on the exponent
        if self._kept(g, f, math.ldexp(1.0, hi_j)) < keep:
            return (None, high)
        while hi_j - lo_j > 1:
            mid = (lo_j + hi_j) // 2
            if self._kept(g, f, math.ldexp(1.0, mid)) >= keep:
                hi_j = mid
            else:
                lo_j = mid
        low = math.ldexp(1.0, hi_j)
        if self._kept(g, f, math.ldexp(1.0, lo_j)) >= keep:   # lo_j = -1074 kept them all
            low = math.ldexp(1.0, lo_j)
        return (low, high)

    def dynamic_scaler(self, fmt, init_scale: float = SCALER_INIT, keep: float = 0.999) -> dict:
        """What a dynamic loss scaler (torch.amp.GradScaler's rule: start at ``init_scale``, halve and skip the
        step whenever a gradient overflows) would do on this step in ``fmt``.

        Predicted from the FP32 step's gradients (:attr:`gradients`): the step at scale S overflows when some
        gradient × S rounds beyond ``fmt``'s range (exact counts); the scaler tries init_scale, init_scale/2, …
        until a step is clean.  When the step in ``fmt``'s numerics already overflows in forward
        (:meth:`first_nonfinite` is a forward output), no loss scale helps: every step is skipped.

        Returns
        -------
        dict with "init_scale"; "skipped" (steps skipped before the first clean one, None: never clean);
        "scale" (the scale of the first clean step, None: never); "in_window" (whether that scale also keeps
        ``keep`` of the non-zero gradients, i.e. ≥ the window's low end); "reason" (a short text).

        Raises ValueError when ``fmt`` was not analysed, or ``init_scale`` is not a positive power of two.
        """
        f = self._fmt(fmt)
        if not isinstance(init_scale, numbers.Real) or not (init_scale > 0) or math.frexp(init_scale)[0] != 0.5:
            raise ValueError(f"init_scale must be a positive power of two, got {init_scale!r}")
        out = {"init_scale": float(init_scale), "skipped": None, "scale": None, "in_window": False, "reason": ""}
        first = self.first_nonfinite(f.name)
        if first is not None and first[1] == "forward":
            out["reason"] = f"the forward pass overflows in {f.name} (at {first[0] or '(model)'}): every step is skipped"
            return out
        g = self.gradients
        if g.nonfinite:
            out["reason"] = "the FP32 gradients already hold inf/NaN: every step is skipped"
            return out
        if g.total == g.zeros:
            out.update(skipped=0, scale=float(init_scale), reason="no non-zero gradient")
            return out
        j0 = _log2(float(init_scale))
        j = j0
        while j > -1074 and self._overflows(g, f, math.ldexp(1.0, j)):
            j -= 1
        s = math.ldexp(1.0, j)
        low, _ = self.loss_scale_window(f.name, keep)
        out.update(skipped=j0 - j, scale=s, in_window=low is not None and s >= low)
        out["reason"] = (f"{j0 - j} skipped step{'s' if j0 - j != 1 else ''}, then scale 2^{j}"
                         + ("" if out["in_window"] else f", below the window's low end {_pow2_text(low)}"))
        return out

    def shares(self, fmt, loss_scale: float = 1.0) -> dict:
        """Per module, the shares of its values that ``fmt`` would keep, lose or change.

        Returns
        -------
        dict module name → dict kind → dict, for the kinds of :data:`KINDS` ("activation", "activation_gradient",
        "weight", "weight_gradient"; weights are the module's own parameters, not its children's); each the
        dict of :meth:`mpt_lab.histogram.Log2Histogram.fractions`: shares of all values that are "zero",
        "normal", "subnormal", "underflow" (non-zero, rounds to zero), "overflow", "nonfinite" after rounding
        to ``fmt``; gradients are first multiplied by ``loss_scale`` (a power of two).  A kind with no values
        (no gradient, no parameters) is None.

        Raises ValueError when ``fmt`` was not analysed or ``loss_scale`` is not a positive power of two.
        """
        f = self._fmt(fmt)
        out = {}
        for m in self.modules:
            ws = self._module_weights(m.name)
            w = _sum_hists(p.weight for p in ws) if ws else None
            gs = [p.gradient for p in ws if p.gradient is not None]
            wg = _sum_hists(gs) if gs else None
            row = {}
            for kind, h, s in (("activation", m.activation, 1.0), ("activation_gradient", m.activation_gradient,
                               loss_scale), ("weight", w, 1.0), ("weight_gradient", wg, loss_scale)):
                row[kind] = h.fractions(f, s) if h is not None and h.total else None
            out[m.name] = row
        return out

    def optimizer_checks(self, fmt) -> dict | None:
        """Checks of the optimizer given to :func:`precision_report` in ``fmt`` (None when none was given).

        Returns
        -------
        dict with
        "constants": a list of dicts (group, name, value, rounded, effect) for every numeric hyper-parameter of
            the optimizer's parameter groups (``lr``, ``eps``, ``betas[1]``, ``weight_decay``, …) that changes
            when rounded to ``fmt``: effect "vanishes" (non-zero, rounds to 0: Adam's ``eps=1e-8`` in FP16,
            PyTorch issue 147437), "overflows", "degenerate" (a value in (0, 1) that rounds to exactly 1, e.g.
            Adam's ``betas[1] = 0.999`` in BF16: a decay rate of 1 turns its moving average off, 1 − β = 0, and
            Adam's bias correction 1 − βᵗ divides by zero; ``torch.optim.Adam`` refuses β = 1), or "changes"
            (another value);
        "updates": the step's update Δw of every parameter (the optimizer's own ``step`` run on a copy of it
            and of the parameters widened to float64, so that adding Δw to the weight loses none of it, with the
            FP32 step's gradients), and how many non-zero updates a weight
            stored in ``fmt`` would lose: round_to(w_f + Δw, fmt) == w_f with w_f = round_to(w, fmt) and the
            sum formed in float64, i.e. |Δw| at most half an ulp of w_f (ties to even) — the updates that
            weights kept only in ``fmt``, without FP32 master weights, lose (Micikevicius et al. 2018 §3.1;
            the same count as chapter 4's, :func:`mpt_lab.master_weights.swamped`):
            dict with "nonzero", "lost", "share_lost"; or {"error": text} when the optimizer could not be
            stepped on a copy.

        Raises ValueError when ``fmt`` was not analysed by this report.
        """
        f = self._fmt(fmt)
        info = self._optimizer
        if info is None:
            return None
        constants = []
        for g, name, value in info["constants"]:
            r = F.round_to(value, f)
            if r == value:
                continue
            effect = "vanishes" if r == 0 else ("overflows" if not math.isfinite(r) or abs(r) > f.max else
                                                ("degenerate" if 0 < value < 1 and r == 1 else "changes"))
            constants.append({"group": g, "name": name, "value": value, "rounded": r, "effect": effect})
        updates = {"error": info["error"]} if "error" in info else dict(info["updates"][f.name])
        return {"optimizer": info["type"], "constants": constants, "updates": updates}

    #: The verdicts of :meth:`verdict`, in the order the rules of :meth:`recommendation` test them.
    VERDICTS = ("needs per-tensor or block scaling", "keep modules in FP32", "trains as is", "needs a loss scale")

    def verdict(self, fmt, keep: float = 0.999) -> str:
        """The rule of :meth:`recommendation` that applies to ``fmt``, in a few words: one of :attr:`VERDICTS`
        ("needs per-tensor or block scaling", "keep modules in FP32", "trains as is", "needs a loss scale").

        Raises ValueError when ``fmt`` was not analysed by this report.
        """
        return self._advice(fmt, keep)[0]

    def recommendation(self, fmt, keep: float = 0.999) -> str:
        """One sentence: what the step needs to train in ``fmt``, derived from the numbers of this report.

        The rules, in order (``keep`` as in :meth:`loss_scale_window`):

        1. *needs per-tensor or block scaling* when one scale cannot serve: some weight overflows ``fmt``; or
           less than ``keep`` of the non-zero activations or weights survive rounding to ``fmt`` (they
           underflow); or the loss-scale window is empty (low > high, or no scale keeps ``keep`` of the
           gradients);
        2. otherwise *keep these modules in FP32* when some modules overflow in forward
           (:meth:`forward_overflows`, plus the module of :meth:`first_nonfinite` when it is a forward output),
           with the loss scale the gradients need when 1 is not in the window;
        3. *trains as is* when loss scale 1 lies in the window (low ≤ 1 ≤ high), or the step has no non-zero
           gradient;
        4. *needs a loss scale in [low, high]* otherwise.

        When an optimizer was given: "; keep the optimizer's arithmetic in FP32" if one of its constants
        vanishes or becomes degenerate in ``fmt`` (:meth:`optimizer_checks`), and "; keep FP32 master weights"
        if more than 1 − ``keep`` of the step's updates
        would be lost by weights stored in ``fmt``.  :meth:`verdict` names the rule that applied.

        Raises ValueError when ``fmt`` was not analysed by this report.
        """
        return self._advice(fmt, keep)[1]

    def _advice(self, fmt, keep: float) -> tuple:
        """(verdict, recommendation) of ``fmt``: see :meth:`recommendation`."""
        f = self._fmt(fmt)
        low, high = self.loss_scale_window(f.name, keep)
        over = self.forward_overflows(f.name)
        first = self.first_nonfinite(f.name)
        if first is not None and first[1] == "forward" and first[0] not in over:
            over = over + [first[0]]
        w_over = [p.name for p in self.parameters if self._overflows(p.weight, f)]
        act_kept = self._kept(self.activations, f)
        w_kept = self._kept(self.weights, f)
        k = f"{100 * keep:g}%"
        per_tensor = None
        if w_over:
            per_tensor = f"{len(w_over)} weight tensor(s) overflow {f.name} (e.g. {w_over[0]})"
        elif math.isfinite(act_kept) and act_kept < keep:
            per_tensor = (f"only {100 * act_kept:.3g}% of the non-zero activations stay non-zero in {f.name} "
                          f"(fewer than {k})")
        elif math.isfinite(w_kept) and w_kept < keep:
            per_tensor = f"only {100 * w_kept:.3g}% of the non-zero weights stay non-zero in {f.name} (fewer than {k})"
        elif high is not None and low is None:
            per_tensor = f"no loss scale keeps {k} of the non-zero gradients"
        elif low is not None and low > high:
            per_tensor = (f"keeping {k} of the non-zero gradients needs a loss scale ≥ {_pow2_text(low)}, but the "
                          f"largest gradient overflows above {_pow2_text(high)}")
        scale_ok = low is None or low <= 1.0 <= high
        window = f"[{_pow2_text(low)}, {_pow2_text(high)}]"
        if per_tensor is not None:
            verdict, text = self.VERDICTS[0], f"needs per-tensor or block scaling: {per_tensor}"
        elif over:
            names = ", ".join(n or "(model)" for n in over[:4]) + (f" and {len(over) - 4} more" if len(over) > 4
                                                                   else "")
            amax = self._by_name[over[0]].activation.amax
            first_words = "its outputs reach" if len(over) == 1 else f"the first, {over[0] or '(model)'}, reaches"
            verdict = self.VERDICTS[1]
            text = (f"keep {names} in FP32 ({first_words} {amax:.5g} > {f.name}'s max {f.max:g})"
                    + ("" if scale_ok else f", and use a loss scale in {window}"))
        elif scale_ok:
            verdict = self.VERDICTS[2]
            text = ("trains as is: no output overflows and "
                    + ("the step has no non-zero gradient to scale" if low is None else
                       f"at loss scale 1 at least {k} of the non-zero gradients stay non-zero and none overflows"))
        else:
            verdict, text = self.VERDICTS[3], f"needs a loss scale in {window}"
        opt = self.optimizer_checks(f.name)
        if opt is not None:
            vanish = [c["name"] for c in opt["constants"] if c["effect"] == "vanishes"]
            one = [c["name"] for c in opt["constants"] if c["effect"] == "degenerate"]
            if vanish or one:
                why = [f"{', '.join(vanish)} rounds to 0"] if vanish else []
                why += [f"{', '.join(one)} rounds to 1, which turns its moving average off"] if one else []
                text += f"; keep the optimizer's arithmetic in FP32 ({'; '.join(why)})"
            u = opt["updates"]
            if "share_lost" in u and math.isfinite(u["share_lost"]) and u["share_lost"] > 1 - keep:
                text += (f"; keep FP32 master weights ({100 * u['share_lost']:.3g}% of the step's updates round "
                         f"away on {f.name} weights)")
        return verdict, text + "."

    # --- presentation -----------------------------------------------------------------------------------------
    def summary(self, fmt, keep: float = 0.999) -> dict:
        """The per-format answers as one dict: max, loss, forward_overflows, first_nonfinite,
        loss_scale_window, dynamic_scaler, optimizer, verdict, recommendation (JSON-ready)."""
        f = self._fmt(fmt)
        low, high = self.loss_scale_window(f.name, keep)
        first = self.first_nonfinite(f.name)
        return {"max": f.max, "loss": _json_float(self.runs[f.name].loss),
                "forward_overflows": self.forward_overflows(f.name),
                "first_nonfinite": list(first) if first else None,
                "loss_scale_window": [_json_float(low), _json_float(high)], "keep": keep,
                "dynamic_scaler": self.dynamic_scaler(f.name, keep=keep),
                "nonfinite_parameter_gradients": list(self.runs[f.name].nonfinite_parameter_gradients),
                "optimizer": self.optimizer_checks(f.name),
                "verdict": self.verdict(f.name, keep), "recommendation": self.recommendation(f.name, keep)}

    def _summary_rows(self):
        rows = []
        for name in self.formats:
            f = F.get_format(name)
            low, high = self.loss_scale_window(name)
            over = self.forward_overflows(name)
            first = self.first_nonfinite(name)
            sc = self.dynamic_scaler(name)
            rows.append({"format": name, "max": f"{f.max:.5g}", "loss": _num(self.runs[name].loss),
                         "overflows": (f"{len(over)}: {over[0] or '(model)'}" + (" …" if len(over) > 1 else ""))
                         if over else "0",
                         "first": f"{first[0] or '(model)'} ({first[1]})" if first else "none",
                         "window": f"[{_pow2_text(low)}, {_pow2_text(high)}]" if low is None or high is None or low <= high else
                         f"empty ({_pow2_text(low)} > {_pow2_text(high)})",
                         "scaler": "never clean" if sc["skipped"] is None else
                         f"{sc['skipped']} skipped → {_pow2_text(sc['scale'])}",
                         "recommendation": self.recommendation(name)})
        return rows

    _SUMMARY_HEAD = (("format", "format"), ("max", "max"), ("loss", "loss"),
                     ("overflows", "modules overflowing in forward"), ("first", "first inf/NaN"),
                     ("window", "loss-scale window"), ("scaler", "dynamic scaler from 2^16"))

    def _module_rows(self):
        shares = {name: self.shares(name) for name in self.formats}
        rows = []
        for m in self.modules:
            r = [m.label, m.type, str(m.calls), _num(m.activation.amax),
                 _num(m.activation_gradient.amax) if m.activation_gradient.total else "–"]
            for name in self.formats:
                s = shares[name][m.name]
                a, g = s["activation"], s["activation_gradient"]
                r.append(_pct(a["overflow"]) if a else "–")
                r.append(_pct(g["underflow"]) if g else "–")
            rows.append(r)
        return rows

    def _module_head(self):
        head = ["module", "type", "calls", "output amax", "output-gradient amax"]
        for name in self.formats:
            head += [f"{name} outputs overflowing", f"{name} gradients → 0"]
        return head

    def _title(self) -> str:
        return (f"Precision report: {self.model_type}, {self.n_parameters:,} parameters, {len(self.modules)} modules "
                f"recorded; FP32 loss {_num(self.loss)}; formats run as simulate(mode={self.mode!r}), loss scale 1")

    def __str__(self) -> str:
        lines = [self._title(), ""]
        head = [h for _, h in self._SUMMARY_HEAD]
        rows = [[r[k] for k, _ in self._SUMMARY_HEAD] for r in self._summary_rows()]
        lines += _text_table(head, rows)
        lines.append("")
        for r in self._summary_rows():
            lines.append(f"{r['format']}: {r['recommendation']}")
        lines += ["", "Per module, in execution order (shares of all values at loss scale 1):"]
        lines += _text_table(self._module_head(), self._module_rows())
        return "\n".join(lines)

    def __repr__(self) -> str:
        return (f"<PrecisionReport of {self.model_type}: {len(self.modules)} modules, formats {self.formats}, "
                f"FP32 loss {_num(self.loss)}>")

    def _repr_html_(self) -> str:
        from .figures import table_html

        rows = self._summary_rows()
        summary = table_html([h for _, h in self._SUMMARY_HEAD],
                             [[html.escape(r[k]) for k, _ in self._SUMMARY_HEAD] for r in rows],
                             align=["left"] * len(self._SUMMARY_HEAD))
        recs = "".join(f"<li><b>{html.escape(r['format'])}</b>: {html.escape(r['recommendation'])}</li>" for r in rows)
        modules = table_html(self._module_head(), [[html.escape(c) for c in r] for r in self._module_rows()])
        return (f"<div><p><b>{html.escape(self._title())}</b></p>{summary}<ul>{recs}</ul>"
                f"<details><summary>Per module, in execution order ({len(self.modules)} modules; shares of all "
                f"values at loss scale 1)</summary>{modules}</details></div>")

    def to_dict(self, keep: float = 0.999) -> dict:
        """The report as a JSON-ready dict (``json.dumps(..., allow_nan=False)`` works): provenance, the model,
        per format :meth:`summary`, and per module and parameter the histograms (counts per binade, zeros,
        non-finite, amax) and the shares of :meth:`shares` per format.  Infinities are written "inf", NaN None.
        """
        def clean(obj):
            if isinstance(obj, float):
                return _json_float(obj)
            if isinstance(obj, dict):
                return {str(k): clean(v) for k, v in obj.items()}
            if isinstance(obj, (list, tuple)):
                return [clean(v) for v in obj]
            return obj

        shares = {name: self.shares(name) for name in self.formats}
        return clean({
            "provenance": self.provenance,
            "model": {"type": self.model_type, "parameters": self.n_parameters, "training": self.training},
            "mode": self.mode, "loss": self.loss,
            "formats": {name: self.summary(name, keep) for name in self.formats},
            "modules": [{"name": m.name, "type": m.type, "order": m.order, "calls": m.calls,
                         "activation": _coarse(m.activation), "activation_gradient": _coarse(m.activation_gradient),
                         "parameters": m.parameters,
                         "shares": {name: shares[name][m.name] for name in self.formats}} for m in self.modules],
            "parameters": [{"name": p.name, "module": p.module, "shape": list(p.shape), "dtype": p.dtype,
                            "requires_grad": p.requires_grad, "aliases": p.aliases, "weight": _coarse(p.weight),
                            "gradient": _coarse(p.gradient)} for p in self.parameters],
            "gradients": _coarse(self.gradients), "activations": _coarse(self.activations),
        })

    def plot(self, formats=None, *, loss_scale: float = 1.0, max_modules: int = 80):
        """Modules × log2 magnitude heat maps of activations and activation gradients (× ``loss_scale``), with
        each format's representable window drawn over them: see
        :func:`mpt_lab.figures.report.plot_precision_report` (same arguments).  Returns a matplotlib Figure."""
        from .figures.report import plot_precision_report

        return plot_precision_report(self, formats, loss_scale=loss_scale, max_modules=max_modules)


def _text_table(head, rows) -> list:
    widths = [max(len(str(h)), *(len(str(r[i])) for r in rows)) if rows else len(str(h)) for i, h in enumerate(head)]
    line = lambda cells: "  ".join(str(c).ljust(w) if i == 0 else str(c).rjust(w)  # noqa: E731
                                   for i, (c, w) in enumerate(zip(cells, widths)))
    return [line(head), "  ".join("-" * w for w in widths)] + [line(r) for r in rows]


# ------------------------------------------------------------------------------------------------ the entry
def precision_report(model: torch.nn.Module, loss_fn, batch, *, formats=DEFAULT_FORMATS, optimizer=None,
                     mode: str = "autocast") -> PrecisionReport:
    """What one training step of ``model`` would do in each of ``formats``: a :class:`PrecisionReport`.

    Runs ``loss = loss_fn(model, batch); loss.backward()`` once in FP32 while recording per module the log2
    histograms (with amax) of its outputs and of their gradients, and per parameter of its weight and gradient;
    then once per format inside ``simulate(fmt, mode=mode)`` (:mod:`mpt_lab.simulate`) noting where values
    become inf/NaN.  Each step starts from the same random state (the same dropout masks).  No optimizer step
    is taken on the model.

    Side effects: none.  Parameters, buffers (e.g. BatchNorm's running statistics), every ``.grad``, the
    modules' training flags, hooks (all of the report's are removed) and the global random states (torch's
    CPU and CUDA generators, Python's ``random``, NumPy's) are as they were, also when an error is raised.

    Parameters
    ----------
    model : torch.nn.Module with at least one parameter, in the mode it trains in (``train()``)
    loss_fn : callable ``loss_fn(model, batch) -> loss``, a scalar floating tensor that requires grad; for a
        Hugging Face model ``lambda m, b: m(**b).loss``
    batch : anything ``loss_fn`` accepts (passed as is)
    formats : format names or FloatFormats with a zero (default FP16, BF16, FP8_E4M3, FP8_E5M2)
    optimizer : torch.optim.Optimizer or None; when given, its constants and its step's updates are checked in
        each format (:meth:`PrecisionReport.optimizer_checks`), on a copy (the optimizer is not changed)
    mode : "autocast" (default: mixed precision, as ``torch.autocast``) or "all" (every op in the format, as
        ``model.half()``), as :class:`mpt_lab.simulate.simulate`

    Returns
    -------
    PrecisionReport

    Raises
    ------
    TypeError
        ``model`` is not a Module, ``loss_fn`` is not callable, ``optimizer`` is not an Optimizer, ``loss_fn``
        returned something other than a floating tensor, ``formats`` is not a format or a sequence of them.
    ValueError
        The model has no parameters; an unknown format, or one without zero (E8M0); an unknown ``mode``; the
        loss is not a scalar, or does not require grad.
    Exception
        Whatever ``loss_fn(model, batch)`` raises (a batch the model rejects): the model's own error, re-raised
        with a note saying which step of the report ran it (the model restored first).

    Source: Micikevicius et al., "Mixed Precision Training", ICLR 2018 (§3.1 master weights, §3.2 loss scaling,
    Figure 2's gradient histograms).
    """
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if not callable(loss_fn):
        raise TypeError(f"loss_fn must be callable as loss_fn(model, batch), got {type(loss_fn).__name__}")
    if optimizer is not None and not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"optimizer must be a torch.optim.Optimizer or None, got {type(optimizer).__name__}")
    if not isinstance(mode, str) or mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    fmts = _check_formats(formats)
    named_params = [(n, p) for n, p in model.named_parameters() if p.is_floating_point()]
    if not named_params:
        raise ValueError(f"model ({type(model).__name__}) has no parameters (no floating-point ones): there is no "
                         "training step to report on")

    named_modules = dict(model.named_modules())
    state = _SavedState(model)
    try:
        state.clear_grads()
        # --- the FP32 step, recorded ---------------------------------------------------------------------
        state.reset_rng()
        rec = _Recorder(named_modules, log2_histogram)
        try:
            try:
                loss = _check_loss(loss_fn(model, batch), "the FP32 step")
                loss_value = float(loss.detach())
                rec.ignore_gradient_of(loss)
                loss.backward()
            except Exception as err:
                _add_context(err, "(raised by loss_fn(model, batch) or its backward in precision_report's FP32 step; "
                                  "the model was restored to its state before the report)")
                raise
            del loss
        finally:
            rec.close()
        modules = []
        for i, name in enumerate(rec.order):
            m = named_modules[name]
            own = [f"{name}.{pn}" if name else pn for pn, _ in m.named_parameters(recurse=False)]
            modules.append(ModuleRecord(name, type(m).__name__, i, rec.calls[name],
                                        _sum_hists(rec.forward.get(name, [])), _sum_hists(rec.backward.get(name, [])),
                                        own))
        aliases: dict = {}
        for n, p in model.named_parameters(remove_duplicate=False):
            aliases.setdefault(id(p), []).append(n)
        parameters = []
        for n, p in named_params:
            mod = n.rpartition(".")[0]
            grad = p.grad
            parameters.append(ParameterRecord(n, mod, tuple(p.shape), str(p.dtype), p.requires_grad,
                                              [a for a in aliases[id(p)] if a != n], log2_histogram(p.detach()),
                                              log2_histogram(grad) if grad is not None else None))
        # a tied parameter belongs to the module of its first name; modules list only their own
        canonical = {p.name for p in parameters}
        for m in modules:
            m.parameters = [n for n in m.parameters if n in canonical]
        gradients = _sum_hists(rec.unique_backward) + _sum_hists(p.gradient for p in parameters
                                                                   if p.gradient is not None)
        activations = _sum_hists(rec.unique_forward)
        fp32_events = [(n, w, h) for n, w, h in rec.events]
        optimizer_info = _optimizer_info(optimizer, fmts) if optimizer is not None else None
        state.clear_grads()
        state.restore_values()
        # --- each format's step ----------------------------------------------------------------------------
        runs = {}
        for name in fmts:
            if name == "FP32":
                runs[name] = FormatRun(name, mode, loss_value,
                                       [(n, w, h.nonfinite == 0) for n, w, h in fp32_events],
                                       [p.name for p in parameters if p.gradient is not None and p.gradient.nonfinite])
                continue
            state.reset_rng()
            rec = _Recorder(named_modules, _finite)
            try:
                with simulate(name, mode=mode):
                    try:
                        loss = _check_loss(loss_fn(model, batch), f"the {name} step")
                        fmt_loss = float(loss.detach())
                        rec.ignore_gradient_of(loss)
                        loss.backward()
                    except Exception as err:
                        _add_context(err, f"(raised by loss_fn(model, batch) or its backward in precision_report's "
                                          f"{name} step, run inside simulate({name!r}, mode={mode!r}); the model "
                                          "was restored to its state before the report)")
                        raise
                    del loss
            finally:
                rec.close()
            events = list(rec.events)
            bad = [n for n, p in named_params if p.grad is not None and not _finite(p.grad)]
            runs[name] = FormatRun(name, mode, fmt_loss, events, bad)
            state.clear_grads()
            state.restore_values()
        dev = next(iter(model.parameters())).device
        prov = provenance(config={"model": type(model).__name__, "formats": fmts, "mode": mode,
                                  "optimizer": type(optimizer).__name__ if optimizer is not None else None},
                          device=dev)
        return PrecisionReport(model_type=type(model).__name__, formats=fmts, mode=mode, loss=loss_value,
                               modules=modules, parameters=parameters, runs=runs, fp32_events=fp32_events,
                               gradients=gradients, activations=activations, optimizer_info=optimizer_info,
                               provenance=prov, n_parameters=sum(p.numel() for _, p in named_params),
                               training=model.training)
    finally:
        state.restore()


def _step_twin(optimizer: torch.optim.Optimizer, dtype) -> list:
    """[(w, Δw)] in float64 for every parameter with a gradient: the update of one step of a deep copy of
    ``optimizer`` (its state and its parameters copied; with ``dtype`` float64 the copies are widened, so that the
    sum w + Δw loses nothing of Δw), stepped through the class's own ``step``."""
    twin = copy.deepcopy(optimizer)
    pairs = []
    for g, g2 in zip(optimizer.param_groups, twin.param_groups):
        for p, p2 in zip(g["params"], g2["params"]):
            if dtype is not None:
                with torch.no_grad():
                    p2.data = p.detach().to(dtype)
                state = twin.state.get(p2, {})
                for k, v in list(state.items()):
                    if isinstance(v, torch.Tensor) and v.is_floating_point() and k != "step":
                        state[k] = v.to(dtype)
            p2.grad = None if p.grad is None else p.grad.detach().to(p2.dtype)
            pairs.append((p, p2))
    type(twin).step(twin)
    out = []
    with torch.no_grad():
        for p, p2 in pairs:
            if p.grad is not None:
                w = p.detach().to(torch.float64)
                out.append((w, p2.detach().to(torch.float64) - w))
    return out


def _optimizer_info(optimizer: torch.optim.Optimizer, fmts) -> dict:
    """The optimizer's numeric constants, and per format the updates of its step (from the current gradients)
    that weights stored in that format would lose.  The step runs on a deep copy of the optimizer and of its
    parameters (widened to float64), through the class's own ``step`` (never an instance attribute, which a
    learning-rate scheduler may have patched to call the original optimizer)."""
    constants = []
    for gi, group in enumerate(optimizer.param_groups):
        for key, v in group.items():
            if key == "params":
                continue
            vals = [(key, v)] if not isinstance(v, (tuple, list)) else [(f"{key}[{i}]", x) for i, x in enumerate(v)]
            for n, x in vals:
                if isinstance(x, torch.Tensor) and x.numel() == 1 and x.is_floating_point():
                    x = float(x)
                if isinstance(x, bool) or not isinstance(x, numbers.Real):
                    continue
                constants.append((gi, n, float(x)))
    info = {"type": type(optimizer).__name__, "constants": constants}
    try:
        pairs = _step_twin(optimizer, torch.float64)
    except Exception:  # an optimizer without float64 support: step in the parameters' own dtype
        try:
            pairs = _step_twin(optimizer, None)
        except Exception as err:  # one that cannot be copied or stepped alone (e.g. one that needs a closure)
            info["error"] = f"{type(err).__name__}: {err}"
            return info
    counts = {name: {"nonzero": 0, "lost": 0} for name in fmts}
    with torch.no_grad():
        for w, d in pairs:
            nzm = d != 0
            n = int(nzm.sum())
            if n == 0:
                continue
            for name in fmts:                                  # the weight stored in the format, w + Δw exact
                counts[name]["nonzero"] += n
                counts[name]["lost"] += int(swamped(w, d, name).sum())
    del pairs
    for c in counts.values():
        c["share_lost"] = c["lost"] / c["nonzero"] if c["nonzero"] else float("nan")
    info["updates"] = counts
    return info
