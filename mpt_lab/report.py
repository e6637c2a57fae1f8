"""A precision report for any PyTorch model: what one training step would do in FP16, BF16 or FP8, where it
first goes wrong (the module and the op), and why.

:func:`precision_report` runs one FP32 forward and backward of ``loss_fn(model, batch)`` while recording, for
every module (named as in ``model.named_modules()``) the log2 histogram of its forward output (its
*activation*) and of the gradient of the loss with respect to that output (its *activation gradient*), for
every parameter the histograms of its weight and its weight gradient, the gradient of every tensor of the
autograd graph (functional intermediates inside a ``forward`` too), and the operands of every matrix product
(forward, input-gradient and weight-gradient GEMMs).  Then, for each format, it runs the same step again under
that format's numerics (:class:`mpt_lab.simulate.simulate`, autocast by default) and notes where values first
become inf/NaN.  When something overflows or turns non-finite, the step is run once more with every ATen op
recorded (a ``TorchDispatchMode``: matrix products, attention, softmax, ``log``, in-place ops, forward and
backward), each attributed to the module whose ``forward`` ran it, so that the report names the *origin*: the
op whose inputs are finite and in range and whose output is not.  The model is left exactly as it was found.

From these numbers the :class:`PrecisionReport` answers the questions people bring to issue trackers:

* :meth:`PrecisionReport.forward_overflows`: which modules' outputs overflow the format, and which of them is
  the origin and which only inherit it (T5's feed-forward output in FP16, Hugging Face transformers issue
  5651);
* :meth:`PrecisionReport.first_nonfinite` and :meth:`PrecisionReport.origins`: where the step first produces
  inf/NaN in that format, module, pass and op ("FP16 gives NaN where FP32 works", PyTorch issue 40497; an inf
  inside a layer between its submodules, transformers issue 12225);
* :meth:`PrecisionReport.loss_scale_window`: the loss scales that keep the gradients (the max-gradient rule of
  Micikevicius et al. 2018 §3.2 above, the underflow share below), :meth:`PrecisionReport.window_ends` the
  gradients that set each end, and what a dynamic scaler starting at 2¹⁶ would do
  (:meth:`PrecisionReport.dynamic_scaler`; fairseq issue 512's falling loss scale);
* :meth:`PrecisionReport.shares`: per module, the share of activations, activation gradients, weights and
  weight gradients that overflow, underflow to zero or become subnormal; :meth:`PrecisionReport.gemm_operands`
  the same for the operands of every GEMM, and :meth:`PrecisionReport.block_operands` what MXFP8, MXFP4 and
  NVFP4 block quantisation does to them (``block_formats=``);
* :meth:`PrecisionReport.optimizer_checks`: optimizer constants (Adam's ``eps``) that vanish or change in the
  format (PyTorch issue 147437), and the share of the step's updates that weights stored in the format without
  FP32 master weights would lose (Micikevicius et al. 2018 §3.1);
* :meth:`PrecisionReport.recommendation`: one sentence per format, derived from the numbers above, true in the
  setting it states (autocast with FP32 weights, or weights and every op in the format; which optimizer).

Two more tools live beside it: :func:`mpt_lab.report_layers.keep_wide` (which Linear layers a block-format
recipe must leave in BF16) and :class:`mpt_lab.report_monitor.PrecisionMonitor` (loss scale, skipped steps,
amax histories and underflow shares over the steps of a user's own training loop).  Both are re-exported here.

Presentation: ``str(report)`` (plain-text tables), ``_repr_html_`` (the same in a notebook),
:meth:`PrecisionReport.to_dict` (JSON-ready, with provenance) and :meth:`PrecisionReport.plot` (modules × log2
magnitude, with each format's representable window drawn over it).

Everything is computed from exact counts (:class:`mpt_lab.histogram.Log2Histogram`, whose ``fractions`` are
what :func:`mpt_lab.formats.round_to` would do value by value) and from the simulated steps; nothing is
estimated.  The module needs only torch (no Hugging Face library).
"""

from __future__ import annotations

import contextlib
import copy
import html
import math
import numbers
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from . import formats as F
from ._report_record import BLOCK_FORMATS, ProgressBar, SavedState, StepRecorder, check_loss, finite, progress_wanted
from .device import provenance
from .histogram import Log2Histogram, log2_histogram
from .master_weights import swamped
from .scaling import max_gradient_scale
from .simulate import MODES, simulate

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = [
    "precision_report",
    "PrecisionReport",
    "ModuleRecord",
    "ParameterRecord",
    "FormatRun",
    "Location",
    "DEFAULT_FORMATS",
    "KINDS",
    "BLOCK_FORMATS",
    "keep_wide",
    "LayerRanking",
    "PrecisionMonitor",
]

#: The formats a report analyses unless told otherwise.
DEFAULT_FORMATS = ("FP16", "BF16", "FP8_E4M3", "FP8_E5M2")

#: The four kinds of values a report counts per module: forward outputs, their gradients, weights, and weight
#: gradients.
KINDS = ("activation", "activation_gradient", "weight", "weight_gradient")

#: The dynamic loss scaler a report predicts: torch.amp.GradScaler's defaults (start at 2¹⁶, halve on overflow).
SCALER_INIT = 2.0**16

#: The largest power of two a float32 loss scale holds (torch.amp.GradScaler keeps its scale in float32).
_MAX_SCALE = 2.0**127


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
    activation_gradient : Log2Histogram of the gradients of the loss with respect to those outputs (every call;
        also when an in-place op changed an output that is a view afterwards; empty when no gradient reached
        them; the loss itself, when a module returns it, gets none: its gradient is backward's seed 1, not a
        value the step computes)
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
    ops : None, or (when the step was recorded op by op) a list of dicts, one per ATen op in execution order:
        "pass" ("forward" | "backward"), "module" (the enclosing module's name; "(loss_fn)" outside the model),
        "function" (the torch function that issued it, e.g. "F.scaled_dot_product_attention", or None), "op"
        (the ATen op, e.g. "bmm"), "node" (backward: the autograd node, e.g. "BmmBackward0"), "in_amax",
        "out_amax" (largest |value| of its floating inputs and outputs; inf/NaN when one is)
    held : None, or per gradient of the FP32 step (:attr:`PrecisionReport.edges`, in the order backward produced
        them) whether the same gradient held the format's values in this step (under autocast, a float32 op's
        gradients do not); None for FP32, or when the two backward passes differed
    """

    format: str
    mode: str
    loss: float
    events: list
    nonfinite_parameter_gradients: list
    ops: list | None = None
    held: list | None = None


class Location(tuple):
    """Where a step first holds inf/NaN: a ``(module, pass)`` pair (``pass`` is "forward" or "backward"), with
    the op as extra attributes.

    Attributes
    ----------
    module : str, the innermost module whose ``forward`` ran the op (backward: created the autograd node);
        "(loss_fn)" outside the model
    where : "forward" or "backward" (the second element)
    op : str or None, the ATen op (e.g. "mul", "bmm", "_scaled_dot_product_flash_attention_for_cpu"); None when
        only module outputs were watched
    function : str or None, the torch function that issued it (e.g. "F.scaled_dot_product_attention")
    node : str or None, the autograd node whose backward ran it (backward only)
    origin : bool or None, whether the op's inputs were all finite (the op made the first inf/NaN itself)
    """

    def __new__(cls, module: str, where: str, *, op=None, function=None, node=None, origin=None):
        self = super().__new__(cls, (module, where))
        self.module, self.where, self.op, self.function, self.node, self.origin = (
            module,
            where,
            op,
            function,
            node,
            origin,
        )
        return self

    def __getnewargs_ex__(self):
        return (self.module, self.where), {
            "op": self.op,
            "function": self.function,
            "node": self.node,
            "origin": self.origin,
        }

    def describe(self) -> str:
        """E.g. "bmm of F.scaled_dot_product_attention in attn (forward)", "Tensor.mul in 3 (forward)", "mul in
        1 (backward)" or "3 (forward)"."""
        where = f"{self.module or '(model)'} ({self.where})"
        if self.op is None:
            return where
        if self.function and self.function.rpartition(".")[2].strip("_") == self.op.strip("_"):
            return f"{self.function} in {where}"
        fn = f" of {self.function}" if self.function else ""
        return f"{self.op}{fn} in {where}"

    def __repr__(self) -> str:
        extra = (
            "" if self.op is None else f", op={self.op!r}" + (f", function={self.function!r}" if self.function else "")
        )
        return f"Location({self.module!r}, {self.where!r}{extra})"


def _sum_hists(hists) -> Log2Histogram:
    out = Log2Histogram()
    for h in hists:
        out = out + h
    return out


# -------------------------------------------------------------------------------------------- one step
def _run_step(
    model,
    loss_fn,
    batch,
    state: SavedState,
    named_modules: dict,
    *,
    fmt,
    mode: str,
    measure: str,
    params: dict,
    edges: bool = False,
    ops: bool = False,
    gemms: bool = False,
    block_formats=(),
    modules: bool = True,
    progress=None,
    where: str,
):
    """One ``loss_fn(model, batch)`` + ``backward()``, recorded by a :class:`~mpt_lab._report_record.StepRecorder`,
    inside ``simulate(fmt, mode=mode)`` when ``fmt`` is given (then ``edges`` records, per gradient of the step,
    whether it holds ``fmt`` values).  Returns (recorder, loss value)."""
    state.begin_step()
    sim = simulate(fmt, mode=mode) if fmt is not None else None
    rec = StepRecorder(
        named_modules,
        measure=measure,
        edges=edges,
        ops=ops,
        gemms=gemms,
        block_formats=block_formats,
        params=params,
        progress=progress,
        modules=modules,
        tag=sim.holds if sim is not None else None,
    )
    ctx = sim if sim is not None else contextlib.nullcontext()
    try:
        with ctx:
            with rec:
                try:
                    loss = check_loss(loss_fn(model, batch), where)
                    value = float(loss.detach())
                    state.save_leaves(rec.before_backward(loss))
                    loss.backward()
                except Exception as err:
                    _add_context(
                        err,
                        f"(raised by loss_fn(model, batch) or its backward in precision_report's {where}"
                        + (f", run inside simulate({fmt!r}, mode={mode!r})" if fmt is not None else "")
                        + "; the model was restored to its state before the report)",
                    )
                    raise
                del loss
                rec.stop_ops()
    finally:
        rec.close()
    return rec, value


def _op_keys(ops: list) -> list:
    """A key per op that names the same op in two runs of the step: (pass, module, function, op, occurrence)."""
    counts: dict = {}
    keys = []
    for o in ops:
        k = (o["pass"], o["module"], o["function"], o["op"])
        c = counts.get(k, 0)
        counts[k] = c + 1
        keys.append((*k, c))
    return keys


# ------------------------------------------------------------------------------------------------ the entry
def precision_report(
    model: torch.nn.Module,
    loss_fn: Callable,
    batch: Any,
    *,
    formats: Sequence[str] = DEFAULT_FORMATS,
    optimizer: torch.optim.Optimizer | None = None,
    mode: str = "autocast",
    block_formats: Sequence[str] = (),
    ops: str | bool = "auto",
    progress: bool | None = None,
) -> PrecisionReport:
    """What one training step of ``model`` would do in each of ``formats``: a :class:`PrecisionReport`.

    Runs ``loss = loss_fn(model, batch); loss.backward()`` once in FP32 while recording per module the log2
    histograms (with amax) of its outputs and of their gradients, per parameter of its weight and gradient, the
    gradient of every tensor of the autograd graph (functional intermediates too), and the operands of every
    GEMM; then once per format inside ``simulate(fmt, mode=mode)`` (:mod:`mpt_lab.simulate`) noting where values
    become inf/NaN.  With ``ops="auto"``, a step in which something overflows (an FP32 module output beyond a
    format's range, or an inf/NaN in a format's step) is run once more with every ATen op recorded, forward and
    backward, each attributed to its module (see :meth:`PrecisionReport.origins`).  Each step starts from the
    same random state (the same dropout masks).  No optimizer step is taken on the model.

    Side effects: none.  Parameters (also values written through ``.data`` inside ``loss_fn``) and their
    storage, buffers (e.g. BatchNorm's running statistics), every ``.grad`` (of parameters and of any other leaf
    tensor the step reaches, such as a batch that requires grad), the modules' training flags, grad mode, hooks
    (all of the report's are removed) and the global random states (torch's CPU and CUDA generators, Python's
    ``random``, NumPy's) are as they were, also when an error is raised.  Version counters of parameters are not
    moved (a graph built before the report can still run backward).

    Parameters
    ----------
    model : torch.nn.Module with at least one parameter, in the mode it trains in (``train()``)
    loss_fn : callable ``loss_fn(model, batch) -> loss``, a scalar floating tensor that requires grad; for a
        Hugging Face model ``lambda m, b: m(**b).loss``
    batch : anything ``loss_fn`` accepts (passed as is)
    formats : format names or FloatFormats with a zero (default FP16, BF16, FP8_E4M3, FP8_E5M2)
    optimizer : torch.optim.Optimizer or None; when given, its constants and its step's updates are checked in
        each format (:meth:`PrecisionReport.optimizer_checks`), on a copy (the optimizer is not changed)
    mode : "autocast" (default: mixed precision, as ``torch.autocast``, FP32 weights and optimizer) or "all"
        (every op and the weights in the format, as :class:`mpt_lab.simulate.simulate`: simulated, float32 tensors
        rounded as ``model.half()`` or ``model.bfloat16()`` would round them, so that code which tests a tensor's
        dtype, such as a clamp of float16 hidden states, does not run)
    block_formats : names among :data:`BLOCK_FORMATS` ("MXFP8", "MXFP4", "NVFP4"): measure what block
        quantisation along each product's reduction axis does to every GEMM operand of the FP32 step
        (:meth:`PrecisionReport.block_operands`; costs an exact quantisation per operand and format)
    ops : "auto" (default: op-level recording when something overflows or turns non-finite), True (always), or
        False (never: module outputs only)
    progress : bool or None, a ``tqdm.auto`` bar over the module calls of every step (None: unless the
        environment variable ``MPT_LAB_PROGRESS`` is "0")

    Returns
    -------
    PrecisionReport

    Raises
    ------
    TypeError
        ``model`` is not a Module, ``loss_fn`` is not callable, ``optimizer`` is not an Optimizer, ``loss_fn``
        returned something other than a floating tensor, ``formats`` is not a format or a sequence of them,
        ``progress`` is not a bool.
    ValueError
        The model has no parameters; an unknown format, or one without zero (E8M0); an unknown ``mode``,
        ``ops`` or block format; the loss is not a scalar, or does not require grad.
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
    if ops not in ("auto", True, False) or isinstance(ops, int) and not isinstance(ops, bool):
        raise ValueError(f"ops must be 'auto', True or False, got {ops!r}")
    if isinstance(block_formats, str):
        block_formats = (block_formats,)
    try:
        block_formats = tuple(block_formats)
    except TypeError:
        raise TypeError(
            f"block_formats must be a sequence of names among {BLOCK_FORMATS}, got {type(block_formats).__name__}"
        ) from None
    for b in block_formats:
        if b not in BLOCK_FORMATS:
            raise ValueError(f"block_formats must name formats among {BLOCK_FORMATS}, got {b!r}")
    show = progress_wanted(progress)
    fmts = _check_formats(formats)
    named_params = [(n, p) for n, p in model.named_parameters() if p.is_floating_point()]
    if not named_params:
        raise ValueError(
            f"model ({type(model).__name__}) has no parameters (no floating-point ones): there is no "
            "training step to report on"
        )

    named_modules = dict(model.named_modules())
    param_names = {id(p): n for n, p in named_params}
    state = SavedState(model)
    bar = ProgressBar(show, "precision report")
    try:
        state.clear_grads()
        # --- the FP32 step, recorded ---------------------------------------------------------------------
        bar.step("FP32 step")
        rec, loss_value = _run_step(
            model,
            loss_fn,
            batch,
            state,
            named_modules,
            fmt=None,
            mode=mode,
            measure="histogram",
            edges=True,
            gemms=True,
            block_formats=block_formats,
            params=param_names,
            ops=ops is True,
            progress=bar,
            where="FP32 step",
        )
        calls = sum(rec.calls.values())
        bar.set_total(calls * (1 + sum(1 for f in fmts if f != "FP32")))
        modules = []
        for i, name in enumerate(rec.order):
            m = named_modules[name]
            own = [f"{name}.{pn}" if name else pn for pn, _ in m.named_parameters(recurse=False)]
            modules.append(
                ModuleRecord(
                    name,
                    type(m).__name__,
                    i,
                    rec.calls[name],
                    _sum_hists(rec.forward.get(name, [])),
                    _sum_hists(rec.backward.get(name, [])),
                    own,
                )
            )
        aliases: dict = {}
        for n, p in model.named_parameters(remove_duplicate=False):
            aliases.setdefault(id(p), []).append(n)
        parameters = []
        for n, p in named_params:  # histograms the step made already (GEMM operands, gradients) are reused
            mod = n.rpartition(".")[0]
            grad = p.grad
            gh = rec.parameter_gradient(n) if grad is not None else None
            parameters.append(
                ParameterRecord(
                    n,
                    mod,
                    tuple(p.shape),
                    str(p.dtype),
                    p.requires_grad,
                    [a for a in aliases[id(p)] if a != n],
                    rec.hist(p),
                    (gh if gh is not None else log2_histogram(grad)) if grad is not None else None,
                )
            )
        canonical = {p.name for p in parameters}
        for m in modules:
            m.parameters = [n for n in m.parameters if n in canonical]
        # every gradient of the step: the gradient of each tensor of the graph once (parameters' included)
        edges = {"list": list(rec.edge_list), "hists": list(rec.edge_hists), "amax": rec.edge_amaxes()}
        gradients = _sum_hists(edges["hists"])
        activations = _sum_hists(rec.unique_forward)
        fp32_events = list(rec.events)
        gemm_rows = rec.gemm_records
        fp32_ops = rec.op_table() if ops is True else None
        optimizer_info = _optimizer_info(optimizer, fmts) if optimizer is not None else None
        state.clear_grads()
        state.restore_values()
        del rec
        # --- each format's step ----------------------------------------------------------------------------
        runs = {}
        for name in fmts:
            if name == "FP32":
                continue
            bar.step(f"{name} step")
            rec, fmt_loss = _run_step(
                model,
                loss_fn,
                batch,
                state,
                named_modules,
                fmt=name,
                mode=mode,
                measure="finite",
                edges=True,
                ops=ops is True,
                progress=bar,
                params=param_names,
                where=f"{name} step",
            )
            events = [(n, w, bool(h)) for n, w, h in rec.events]
            tags = _align_tags(edges["list"], rec.edge_tags)
            bad = [n for n, p in named_params if p.grad is not None and not finite(p.grad)]
            run_ops = rec.op_table() if ops is True else None
            state.clear_grads()
            state.restore_values()
            del rec
            if ops == "auto" and (bad or not math.isfinite(fmt_loss) or not all(f for _, _, f in events)):
                bar.step(f"{name} step, op by op")
                rec, _ = _run_step(
                    model,
                    loss_fn,
                    batch,
                    state,
                    named_modules,
                    fmt=name,
                    mode=mode,
                    measure="finite",
                    ops=True,
                    modules=False,
                    params=param_names,
                    where=f"{name} step (op by op)",
                )
                run_ops = rec.op_table()
                state.clear_grads()
                state.restore_values()
                del rec
            runs[name] = FormatRun(name, mode, fmt_loss, events, bad, run_ops, tags)
        # --- the FP32 step op by op, when something overflows a format or a format's step went non-finite -------
        if fp32_ops is None and ops == "auto":
            need = any(r.ops is not None for r in runs.values())
            if not need:
                need = any(h.nonfinite for _, _, h in fp32_events) or any(
                    _hist_overflows(m.activation, F.get_format(name))
                    for name in fmts
                    if name != "FP32"
                    for m in modules
                )
            if need:
                bar.step("FP32 step, op by op")
                rec, _ = _run_step(
                    model,
                    loss_fn,
                    batch,
                    state,
                    named_modules,
                    fmt=None,
                    mode=mode,
                    measure="histogram",
                    ops=True,
                    modules=False,
                    params=param_names,
                    where="FP32 step (op by op)",
                )
                fp32_ops = rec.op_table()
                state.clear_grads()
                state.restore_values()
                del rec
        if "FP32" in fmts:
            runs["FP32"] = FormatRun(
                "FP32",
                mode,
                loss_value,
                [(n, w, h.nonfinite == 0) for n, w, h in fp32_events],
                [p.name for p in parameters if p.gradient is not None and p.gradient.nonfinite],
                fp32_ops,
                None,
            )
        runs = {name: runs[name] for name in fmts}
        dev = next(iter(model.parameters())).device
        prov = provenance(
            config={
                "model": type(model).__name__,
                "formats": fmts,
                "mode": mode,
                "optimizer": type(optimizer).__name__ if optimizer is not None else None,
                "block_formats": list(block_formats),
            },
            device=dev,
        )
        return PrecisionReport(
            model_type=type(model).__name__,
            formats=fmts,
            mode=mode,
            loss=loss_value,
            modules=modules,
            parameters=parameters,
            runs=runs,
            fp32_events=fp32_events,
            gradients=gradients,
            activations=activations,
            optimizer_info=optimizer_info,
            provenance=prov,
            n_parameters=sum(p.numel() for _, p in named_params),
            training=model.training,
            edges=edges,
            gemms=gemm_rows,
            fp32_ops=fp32_ops,
            block_formats=list(block_formats),
        )
    finally:
        state.restore()
        bar.close()


def _align_tags(fp32_edges: list, tags: list):
    """Per FP32 gradient edge, whether the same edge of a format's step held the format's values; None when the
    two backward passes did not visit the same edges in the same order."""
    if len(fp32_edges) != len(tags):
        return None
    out = []
    for (n1, r1, *_), (n2, r2, t) in zip(fp32_edges, tags):
        if n1 != n2 or r1 != r2:
            return None
        out.append(t)
    return out


def _hist_overflows(h: Log2Histogram, fmt: F.FloatFormat, scale: float = 1.0) -> bool:
    """Whether some value of h, times scale, overflows fmt when rounded (becomes inf/NaN, or beyond max)."""
    if h.total == 0:
        return False
    if h.category_counts(fmt, scale)["overflow"] > 0:
        return True
    a = h.amax * scale
    if a == 0 or not math.isfinite(a):
        return not math.isfinite(a)
    return _beyond(a, fmt)


def _beyond(a: float, fmt: F.FloatFormat) -> bool:
    """Whether |a| rounds beyond fmt's range (inf, NaN, or a value above max); NaN/inf count as beyond."""
    if not math.isfinite(a):
        return True
    r = F.round_to(abs(a), fmt)  # covers E4M3's (464, 480), which category_counts counts as normal
    return not math.isfinite(r) or r > fmt.max


# ------------------------------------------------------------------------------------------------- checks
def _check_formats(formats) -> list:
    if isinstance(formats, (str, F.FloatFormat)):
        formats = [formats]
    try:
        items = list(formats)
    except TypeError:
        raise TypeError(
            f"formats must be a format name, a FloatFormat or a sequence of them, got {type(formats).__name__}"
        ) from None
    if not items:
        raise ValueError("formats must name at least one format, e.g. ('FP16', 'BF16')")
    out = []
    for f in items:
        fmt = F.get_format(f, "formats")
        if not fmt.subnormals:
            raise ValueError(
                f"formats: {fmt.name} has no zero (a scale format); a report needs formats that "
                "hold gradients, e.g. FP16, BF16, FP8_E4M3, FP8_E5M2"
            )
        if fmt.name not in out:
            out.append(fmt.name)
    return out


def _add_context(err: BaseException, text: str) -> None:
    if hasattr(err, "add_note"):  # Python ≥ 3.11: the model's own error, with the report's context below it
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


def _pct(v, digits: int = 3) -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "–"
    if v == 0:
        return "0"
    return f"{100 * v:.{digits}g}%"


def _pct_below(v: float, bound: float) -> str:
    """v as a percentage with enough digits that it reads below ``bound`` (v < bound): never "99.9% (fewer
    than 99.9%)"."""
    for d in range(3, 12):
        s = f"{100 * v:.{d}g}"
        if float(s) < 100 * bound:
            return s + "%"
    return f"{100 * v!r}%"


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
    return {
        "counts": {str(int(h.exponents[i])): int(c[i]) for i in nz},
        "zeros": h.zeros,
        "nonfinite": h.nonfinite,
        "total": h.total,
        "amax": _json_float(h.amax),
    }


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
    fp32_ops : None, or the FP32 step op by op (as :attr:`FormatRun.ops`, with the FP32 amaxes)
    gradients : Log2Histogram of every gradient of the step: the gradient of every tensor of the autograd graph
        once (module outputs, functional intermediates, the ops of ``loss_fn``, parameters; not the loss's own
        seed 1); :meth:`gradients_in` keeps those a format's step holds in that format
    edges : the gradients one by one, in the order backward produced them: dict "list" (per gradient: the
        autograd node whose output it belongs to, its output index, the module whose backward computed it —
        for a parameter its module —, the index of its histogram, the parameter's name or None), "hists" (the
        distinct histograms) and "amax" (theirs)
    activations : Log2Histogram of every distinct module output of the step
    weights : Log2Histogram of every parameter's values
    gemms : list of dicts, one per operand of every matrix product of the FP32 step (forward, input-gradient and
        weight-gradient GEMMs, attention, convolutions): "module", "pass", "op", "gemm", "operand", "parameter",
        "shape", "histogram" and, with ``block_formats``, "blocks"
    block_formats : the block formats measured on the GEMM operands
    provenance : dict, where the report came from (:func:`mpt_lab.device.provenance`)
    """

    def __init__(
        self,
        *,
        model_type,
        formats,
        mode,
        loss,
        modules,
        parameters,
        runs,
        fp32_events,
        gradients,
        activations,
        optimizer_info,
        provenance,
        n_parameters,
        training,
        edges=None,
        gemms=None,
        fp32_ops=None,
        block_formats=(),
    ):
        self.model_type = model_type
        self.formats = list(formats)
        self.mode = mode
        self.loss = loss
        self.modules = modules
        self.parameters = parameters
        self.runs = runs
        self.fp32_events = fp32_events
        self.fp32_ops = fp32_ops
        self.gradients = gradients
        self.edges = edges if edges is not None else {"list": [], "hists": [], "amax": []}
        self.activations = activations
        self.weights = _sum_hists(p.weight for p in parameters)
        self.gemms = gemms or []
        self.block_formats = list(block_formats)
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
            raise ValueError(
                f"fmt: {f.name} was not analysed by this report; it analysed {self.formats} "
                "(pass formats=... to precision_report)"
            )
        return f

    def _counts(self, h: Log2Histogram, fmt: F.FloatFormat, scale: float = 1.0) -> dict:
        key = (id(h), fmt.name, scale)
        c = self._cache.get(key)
        if c is None or c[0] is not h:  # the entry holds its histogram: an id is never reused while cached
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
        return _beyond(a, fmt)

    def _kept(self, h: Log2Histogram, fmt: F.FloatFormat, scale: float = 1.0) -> float:
        """Share of h's non-zero finite values that do not round to zero in fmt after × scale (NaN if none)."""
        c = self._counts(h, fmt, scale)
        nz = c["normal"] + c["subnormal"] + c["underflow"] + c["overflow"]
        return 1.0 - c["underflow"] / nz if nz else float("nan")

    def _module_weights(self, name: str):
        m = self._by_name[name]
        by = {p.name: p for p in self.parameters}
        return [by[n] for n in m.parameters if n in by]

    @staticmethod
    def _within(name: str, ancestor: str) -> bool:
        """Whether module ``name`` is ``ancestor`` or lies inside it."""
        return ancestor == "" or name == ancestor or name.startswith(ancestor + ".")

    # --- forward overflows: origins and what inherits them ----------------------------------------------------
    def forward_overflows(self, fmt: str | F.FloatFormat, which: str = "all") -> list:
        """The modules whose forward outputs overflow ``fmt``, in execution order.

        Definition: the names (as ``model.named_modules()``) of the modules of which some output value of the
        FP32 step, rounded to ``fmt`` (round-to-nearest-even), is no longer finite or lies beyond ``fmt.max``
        — i.e. |x| ≥ max + ½ulp(max) for formats with infinities (FP16: |x| ≥ 65520 becomes inf).  A module
        called several times is listed once, at its first call.  The values are those of the FP32 step (what
        a cast of each output would do), not those of the step in ``fmt``'s numerics (see
        :meth:`first_nonfinite`).

        ``which`` selects by role (:meth:`overflow_roles`): "all" (default), "origins" (the modules where the
        overflow starts: an op inside them has inputs in range and an output beyond it; the cure belongs
        there: run them in FP32, or use a format with a wider range such as BF16), "inherited" (modules that
        only pass on values that overflowed before them; no cure belongs there) or "containing" (modules that
        contain an origin, such as the container that returns its output).

        Raises ValueError when ``fmt`` was not analysed by this report, or for another ``which``.
        """
        f = self._fmt(fmt)
        if which not in ("all", "origins", "inherited", "containing"):
            raise ValueError(f"which must be 'all', 'origins', 'inherited' or 'containing', got {which!r}")
        over = [m.name for m in self.modules if self._overflows(m.activation, f)]
        if which == "all":
            return over
        roles = self.overflow_roles(f.name)
        want = {"origins": "origin", "inherited": "inherited", "containing": "contains origin"}[which]
        return [n for n in over if roles.get(n) == want]

    def _cast_origin_ops(self, f: F.FloatFormat) -> list | None:
        """Forward ops of the FP32 step whose inputs fit ``f`` and whose output does not (None: not recorded)."""
        if self.fp32_ops is None:
            return None
        return [
            o
            for o in self.fp32_ops
            if o["pass"] == "forward" and _beyond(o["out_amax"], f) and not _beyond(o["in_amax"], f)
        ]

    def overflow_roles(self, fmt: str | F.FloatFormat) -> dict:
        """For each module whose FP32 outputs overflow ``fmt`` (:meth:`forward_overflows`): "origin", "contains
        origin" or "inherited".

        With the step recorded op by op (:attr:`fp32_ops`): an *origin* op is a forward op whose floating
        inputs all fit ``fmt`` and whose output does not; a module is an "origin" when it is the innermost
        module that ran such an op, "contains origin" when an origin lies inside it, and "inherited" otherwise
        (its inputs had overflowed already).  Without op records (``ops=False``), from module outputs alone: an
        overflowing module is "inherited" when a module outside it overflowed before it finished, else
        "contains origin" when one of its submodules overflowed, else "origin".

        Raises ValueError when ``fmt`` was not analysed by this report.
        """
        f = self._fmt(fmt)
        key = ("roles", f.name)
        if key in self._cache:
            return self._cache[key]
        over = [m.name for m in self.modules if self._overflows(m.activation, f)]
        roles = {}
        ops = self._cast_origin_ops(f)
        if ops is not None:
            origin_modules = []
            for o in ops:
                if o["module"] not in origin_modules:
                    origin_modules.append(o["module"])
            for n in over:
                if n in origin_modules:
                    roles[n] = "origin"
                elif any(self._within(o, n) for o in origin_modules):
                    roles[n] = "contains origin"
                else:
                    roles[n] = "inherited"
            # an origin op in a module whose output does not overflow (e.g. a loss in FP32 of an overflowing op)
        else:
            done = []
            for n in over:
                if any(not self._within(d, n) for d in done):
                    roles[n] = "inherited"
                elif any(self._within(d, n) and d != n for d in done):
                    roles[n] = "contains origin"
                else:
                    roles[n] = "origin"
                done.append(n)
        self._cache[key] = roles
        return roles

    # --- non-finite values in a format's step ------------------------------------------------------------------
    def _fp32_finite_keys(self) -> dict | None:
        if self.fp32_ops is None:
            return None
        key = ("fp32keys",)
        if key not in self._cache:
            self._cache[key] = {k: math.isfinite(o["out_amax"]) for k, o in zip(_op_keys(self.fp32_ops), self.fp32_ops)}
        return self._cache[key]

    def _new_nonfinite_ops(self, f: F.FloatFormat) -> list | None:
        """(index, op) of the ops of ``f``'s step whose output holds inf/NaN while the same op's output in the FP32
        step is finite (for FP32 itself: every op with a non-finite output); None without op records."""
        run = self.runs[f.name]
        if run.ops is None:
            return None
        ref = self._fp32_finite_keys() if f.name != "FP32" else None
        out = []
        for i, (k, o) in enumerate(zip(_op_keys(run.ops), run.ops)):
            if math.isfinite(o["out_amax"]):
                continue
            if ref is not None and ref.get(k) is False:  # non-finite in FP32 too (a -inf attention mask)
                continue
            out.append((i, o))
        return out

    def origins(self, fmt: str | F.FloatFormat) -> list:
        """The ops where ``fmt``'s step first makes inf or NaN: their floating inputs are all finite, their output
        is not (and, for a format other than FP32, the same op's output in the FP32 step is finite), in execution
        order.  Needs the step recorded op by op (``ops="auto"`` does it when something is non-finite); [] when
        the step stays finite or was not recorded op by op.

        Returns
        -------
        list of dicts with "pass", "module", "function", "op", "node" (as :attr:`FormatRun.ops`), "in_amax" and
        "out_amax" of the format's step, and "fp32_out_amax" (the op's largest output magnitude in the FP32 step,
        when recorded: above ``fmt``'s max for an overflow, finite and below it for a NaN made by the format's
        rounding).

        Raises ValueError when ``fmt`` was not analysed by this report.
        """
        f = self._fmt(fmt)
        ops = self._new_nonfinite_ops(f)
        if not ops:
            return []
        fp32 = None
        if self.fp32_ops is not None and f.name != "FP32":
            fp32 = {k: o for k, o in zip(_op_keys(self.fp32_ops), self.fp32_ops)}
        keys = _op_keys(self.runs[f.name].ops)
        out = []
        for i, o in ops:
            if not math.isfinite(o["in_amax"]):
                continue
            d = dict(o)
            ref = fp32.get(keys[i]) if fp32 is not None else None
            d["fp32_out_amax"] = ref["out_amax"] if ref is not None else None
            out.append(d)
        return out

    def inherited(self, fmt: str | F.FloatFormat) -> list:
        """The modules of ``fmt``'s step whose outputs or output gradients hold inf/NaN without an origin inside
        them (:meth:`origins`): they pass on what went wrong before them.  Names in the order the step produced
        their first non-finite value, each with its pass: a list of (module, "forward" | "backward").

        Raises ValueError when ``fmt`` was not analysed by this report.
        """
        f = self._fmt(fmt)
        origin_modules = {(o["module"], o["pass"]) for o in self.origins(f.name)}
        out = []
        for name, where, ok in self.runs[f.name].events:
            if ok or (name, where) in out:
                continue
            if any(self._within(m, name) and w == where for m, w in origin_modules):
                continue
            out.append((name, where))
        return out

    def first_nonfinite(self, fmt: str | F.FloatFormat) -> Location | None:
        """Where the step run under ``fmt``'s numerics first holds inf or NaN: a :class:`Location`, the pair
        ``(module name, "forward" | "backward")`` with the op as attributes (``.op``, ``.function``, ``.node``,
        ``.origin``), or None if every module output and output gradient stays finite.

        Definition: the step of :func:`precision_report` (``loss_fn(model, batch)`` then ``backward()``) run
        inside ``simulate(fmt, mode=report.mode)`` at loss scale 1; "first" in the order the step computes the
        values.  With the step recorded op by op, the first ATen op whose output holds inf/NaN (and, for a format
        other than FP32, whose FP32 output is finite: an attention mask's -inf is no fault), named with the
        innermost module that ran it (backward: whose forward created its autograd node); without op records,
        the first module output (forward, in execution order) or output gradient (backward, in the order backward
        produces them) that holds inf/NaN.  For ``"FP32"`` this is the FP32 step itself.

        Raises ValueError when ``fmt`` was not analysed by this report.
        """
        f = self._fmt(fmt)
        run = self.runs[f.name]
        event = next(((n, w) for n, w, ok in run.events if not ok), None)
        ops = self._new_nonfinite_ops(f)
        if ops:
            _, o = ops[0]
            return Location(
                o["module"],
                o["pass"],
                op=o["op"],
                function=o["function"],
                node=o["node"],
                origin=math.isfinite(o["in_amax"]),
            )
        if event is None:
            return None
        return Location(*event)

    # --- the loss scale ---------------------------------------------------------------------------------------
    def _held(self, f: F.FloatFormat) -> list:
        """Indices (into ``edges["list"]``) of the gradients that ``f``'s step held in ``f``: all of them for FP32,
        for mode "all", or when the format's backward differed from the FP32 one."""
        key = ("held", f.name)
        if key not in self._cache:
            edges = self.edges["list"]
            run = self.runs.get(f.name)
            held = run.held if run is not None else None
            if f.name == "FP32" or held is None:
                self._cache[key] = list(range(len(edges)))
            else:
                self._cache[key] = [i for i, h in enumerate(held) if h]
        return self._cache[key]

    def gradients_in(self, fmt: str | F.FloatFormat) -> Log2Histogram:
        """The gradients of the step (values of the FP32 step) that ``fmt``'s step holds in ``fmt``, each distinct
        gradient once: under autocast those of the tensors autocast keeps in ``fmt`` (outputs of its
        lower-precision ops and of ops on them), not those of float32 ops (softmax, the loss) nor the FP32 master
        weights' (their lower-precision copies' gradients are counted); in mode "all" (and for FP32) all of
        :attr:`gradients`.  These are the gradients a loss scale must keep in range.

        Raises ValueError when ``fmt`` was not analysed by this report.
        """
        f = self._fmt(fmt)
        key = ("gradients_in", f.name)
        if key not in self._cache:
            idx = sorted({self.edges["list"][i][3] for i in self._held(f)})
            self._cache[key] = _sum_hists(self.edges["hists"][j] for j in idx) if idx else Log2Histogram()
        return self._cache[key]

    def gradients_by_module(self, fmt: str | F.FloatFormat) -> dict:
        """:meth:`gradients_in` ``fmt`` split by the module whose backward computed them (a parameter's gradient
        by the module that holds it; "(loss_fn)" for those computed outside the model): dict module →
        Log2Histogram.

        Raises ValueError when ``fmt`` was not analysed by this report.
        """
        f = self._fmt(fmt)
        key = ("by_module", f.name)
        if key not in self._cache:
            seen, out = set(), {}
            for i in self._held(f):
                _, _, module, j, _ = self.edges["list"][i]
                if j in seen:
                    continue
                seen.add(j)
                h = self.edges["hists"][j]
                out[module] = h if module not in out else out[module] + h
            self._cache[key] = out
        return self._cache[key]

    def largest_gradients(self, fmt: str | F.FloatFormat, n: int = 5) -> list:
        """The ``n`` largest gradients of :meth:`gradients_in` ``fmt`` by amax: dicts "amax", "module", "node" (the
        autograd node whose output it is the gradient of; None for a parameter's), "output" (that node's output
        index, or the parameter's name).

        Raises ValueError when ``fmt`` was not analysed by this report.
        """
        f = self._fmt(fmt)
        rows, seen = [], set()
        for i in self._held(f):
            node, nr, module, j, param = self.edges["list"][i]
            if j in seen:
                continue
            seen.add(j)
            a = self.edges["amax"][j]
            rows.append(
                {
                    "amax": a,
                    "module": module,
                    "node": None if param is not None else node,
                    "output": param if param is not None else nr,
                }
            )
        rows.sort(key=lambda d: -d["amax"] if d["amax"] == d["amax"] else -math.inf)
        return rows[:n]

    def loss_scale_window(self, fmt: str | F.FloatFormat, keep: float = 0.999) -> tuple:
        """``(low, high)``: the loss scales, powers of two, that suit the step's gradients in ``fmt``.

        Definitions (over the gradients of the step that ``fmt``'s step holds in ``fmt``, :meth:`gradients_in`:
        the gradient of every tensor of the autograd graph once, functional intermediates included, as the FP32
        step computed them; under autocast without those of float32 ops, which a loss scale cannot overflow):

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
        :meth:`window_ends` names the gradients that set each end.

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
        keep = _check_keep(keep)
        g = self.gradients_in(f.name)
        amax = g.amax
        if amax == 0 or not math.isfinite(amax):
            return (None, None)
        high = min(max_gradient_scale(amax, f), _MAX_SCALE)
        lo_j, hi_j = -1074, 1023  # kept share grows with the scale: bisect on the exponent
        if self._kept(g, f, math.ldexp(1.0, hi_j)) < keep:
            return (None, high)
        while hi_j - lo_j > 1:
            mid = (lo_j + hi_j) // 2
            if self._kept(g, f, math.ldexp(1.0, mid)) >= keep:
                hi_j = mid
            else:
                lo_j = mid
        low = math.ldexp(1.0, hi_j)
        if self._kept(g, f, math.ldexp(1.0, lo_j)) >= keep:  # lo_j = -1074 kept them all
            low = math.ldexp(1.0, lo_j)
        return (low, high)

    def window_ends(self, fmt: str | F.FloatFormat, keep: float = 0.999) -> dict:
        """The gradients that set the ends of :meth:`loss_scale_window`.

        Returns
        -------
        dict with
        "high": the largest gradient (it alone decides the max-gradient rule), as :meth:`largest_gradients`; None
            without gradients;
        "low": at half the low end (the largest scale that keeps fewer than ``keep``), the modules whose gradients
            lose the most values, up to five: dicts "module", "lost" (values that round to zero), "share" (of all
            values lost at that scale); [] when the low end is None or the smallest possible scale.

        Raises ValueError as :meth:`loss_scale_window`.
        """
        f = self._fmt(fmt)
        low, _ = self.loss_scale_window(f.name, keep)
        high_tensor = next((dict(d) for d in self.largest_gradients(f.name) if math.isfinite(d["amax"])), None)
        lows = []
        if low is not None and low > math.ldexp(1.0, -1074):
            s = low / 2
            counts = [
                (self._counts(h, f, s)["underflow"], m) for m, h in self.gradients_by_module(f.name).items() if h.total
            ]
            total = self._counts(self.gradients_in(f.name), f, s)["underflow"]
            counts.sort(key=lambda x: -x[0])
            for n, m in counts[:5]:
                if n:
                    lows.append({"module": m, "lost": n, "share": n / total if total else float("nan")})
        return {"high": high_tensor, "low": lows}

    def dynamic_scaler(self, fmt: str | F.FloatFormat, init_scale: float = SCALER_INIT, keep: float = 0.999) -> dict:
        """What a dynamic loss scaler (torch.amp.GradScaler's rule: start at ``init_scale``, halve and skip the
        step whenever a gradient overflows) would do on this step in ``fmt``.

        Predicted from the FP32 step's gradients (:meth:`gradients_in`, functional intermediates included): the
        step at scale S overflows when some gradient × S rounds beyond ``fmt``'s range (exact counts); the
        scaler tries init_scale, init_scale/2, … until a step is clean.  When the step in ``fmt``'s numerics
        already overflows in forward (:meth:`first_nonfinite` is a forward op), no loss scale helps: every step
        is skipped.

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
            out["reason"] = f"the forward pass overflows in {f.name} (at {first.describe()}): every step is skipped"
            return out
        g = self.gradients_in(f.name)
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
        out["reason"] = f"{j0 - j} skipped step{'s' if j0 - j != 1 else ''}, then scale 2^{j}" + (
            "" if out["in_window"] else f", below the window's low end {_pow2_text(low)}"
        )
        return out

    # --- shares ---------------------------------------------------------------------------------------------
    def shares(self, fmt: str | F.FloatFormat, loss_scale: float = 1.0) -> dict:
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
            for kind, h, s in (
                ("activation", m.activation, 1.0),
                ("activation_gradient", m.activation_gradient, loss_scale),
                ("weight", w, 1.0),
                ("weight_gradient", wg, loss_scale),
            ):
                row[kind] = h.fractions(f, s) if h is not None and h.total else None
            out[m.name] = row
        return out

    def gemm_operands(self, fmt: str | F.FloatFormat, loss_scale: float = 1.0) -> list:
        """Every operand of every matrix product of the FP32 step, with the shares ``fmt`` would lose.

        One row per operand of each GEMM (forward; input-gradient and weight-gradient GEMMs of backward;
        attention's q, k, v; convolutions), in execution order: dict "module", "pass", "op", "gemm"
        ("forward", "input-gradient", "weight-gradient"; "input- and weight-gradient" for a convolution's
        backward), "operand" ("A", "B", "q", "k", "v", "grad", "input", "weight"), "parameter" (its name when the
        operand is a parameter or a view of one), "shape", "values", "amax", "underflow" (share of the non-zero
        values that round to zero in ``fmt``), "overflow" (share of all values that round beyond its range),
        "zero_rows" (share of its rows along the reduction axis that are all zero: a row-wise scale amax / max
        is 0 there, and x / 0 is NaN, torchao issue 3356).
        Operands of backward GEMMs that hold gradients are multiplied by ``loss_scale`` first (the others are
        activations and weights, which a loss scale does not touch): the gradient operand of a backward GEMM is
        the operand that is (a view of) a gradient the backward pass received ("gradient_operand" in the row).

        Raises ValueError when ``fmt`` was not analysed or ``loss_scale`` is not a positive power of two.
        """
        f = self._fmt(fmt)
        out = []
        for r in self.gemms:
            h = r["histogram"]
            scale = loss_scale if _is_gradient_operand(r) else 1.0
            c = self._counts(h, f, scale)
            nz = c["normal"] + c["subnormal"] + c["underflow"] + c["overflow"]
            out.append(
                {
                    k: r[k]
                    for k in (
                        "module",
                        "pass",
                        "op",
                        "gemm",
                        "operand",
                        "parameter",
                        "shape",
                        "gradient_operand",
                        "zero_rows",
                    )
                }
                | {
                    "values": h.total,
                    "amax": h.amax,
                    "underflow": c["underflow"] / nz if nz else 0.0,
                    "overflow": c["overflow"] / h.total if h.total else 0.0,
                }
            )
        return out

    def gemm_summary(self, fmt: str | F.FloatFormat, loss_scale: float = 1.0) -> dict:
        """The operands of :meth:`gemm_operands` pooled by GEMM kind: dict kind → {"operands", "values",
        "underflow" (share of the non-zero values that round to zero), "overflow" (share of all values)}.

        Raises ValueError as :meth:`gemm_operands`.
        """
        f = self._fmt(fmt)
        out: dict = {}
        for g in self.gemms:
            d = out.setdefault(g["gemm"], {"operands": 0, "values": 0, "under": 0, "nz": 0, "over": 0})
            c = self._counts(g["histogram"], f, loss_scale if _is_gradient_operand(g) else 1.0)
            d["operands"] += 1
            d["values"] += g["histogram"].total
            d["under"] += c["underflow"]
            d["nz"] += c["normal"] + c["subnormal"] + c["underflow"] + c["overflow"]
            d["over"] += c["overflow"]
        return {
            k: {
                "operands": d["operands"],
                "values": d["values"],
                "underflow": d["under"] / d["nz"] if d["nz"] else 0.0,
                "overflow": d["over"] / d["values"] if d["values"] else 0.0,
            }
            for k, d in out.items()
        }

    def block_operands(self, block_format: str) -> list:
        """What ``block_format`` ("MXFP8", "MXFP4" or "NVFP4") does to every GEMM operand of the FP32 step,
        quantised along the product's reduction axis (:func:`mpt_lab._report_record.block_statistics`): one row
        per operand as :meth:`gemm_operands` (module, pass, op, gemm, operand, parameter, shape) with "flushed"
        (share of the non-zero values that become zero inside their block), "clipped" (share of the values beyond
        their block scale's range, clamped), "scale_spread" (binades between the smallest and the largest block
        scale), "rel_rms_error" (√(Σ(Q(x) − x)² / Σx²), the error against FP32) and "snr_db".

        Raises ValueError when the report did not measure ``block_format`` (``block_formats=`` of
        :func:`precision_report`).
        """
        if block_format not in self.block_formats:
            raise ValueError(
                f"block_format: {block_format!r} was not measured by this report; it measured "
                f"{self.block_formats} (pass block_formats=... to precision_report)"
            )
        out = []
        for r in self.gemms:
            s = r.get("blocks", {}).get(block_format)
            if s is None:
                continue
            out.append(
                {k: r[k] for k in ("module", "pass", "op", "gemm", "operand", "parameter", "shape")}
                | {k: s[k] for k in ("n", "flushed", "clipped", "scale_spread", "rel_rms_error", "snr_db")}
            )
        return out

    # --- the optimizer ----------------------------------------------------------------------------------------
    def optimizer_checks(self, fmt: str | F.FloatFormat) -> dict | None:
        """Checks of the optimizer given to :func:`precision_report` in ``fmt`` (None when none was given).

        They describe an optimizer whose arithmetic and weights are in ``fmt`` (weights stored in the format,
        ``mode="all"``, as ``model.half()`` with its optimizer); under autocast the optimizer steps FP32 weights
        and none of this applies (:meth:`recommendation` says so).

        Returns
        -------
        dict with
        "constants": a list of dicts (group, name, value, rounded, effect) for every numeric hyper-parameter of
            the optimizer's parameter groups (``lr``, ``eps``, ``betas[1]``, ``weight_decay``, …) that changes
            when rounded to ``fmt``: effect "vanishes" (non-zero, rounds to 0: Adam's ``eps=1e-8`` in FP16,
            PyTorch issue 147437), "overflows", "degenerate" (a value in (0, 1) that rounds to exactly 1, e.g.
            Adam's ``betas[1] = 0.999`` in BF16: torch keeps β a Python float, so 1 − β and 1 − βᵗ stay exact,
            but in BF16 the product v·β rounds back to v, so the second moment never decays and its moving
            average is frozen; ``torch.optim.Adam`` refuses β = 1), or "changes"
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
            effect = (
                "vanishes"
                if r == 0
                else (
                    "overflows"
                    if not math.isfinite(r) or abs(r) > f.max
                    else ("degenerate" if 0 < value < 1 and r == 1 else "changes")
                )
            )
            constants.append({"group": g, "name": name, "value": value, "rounded": r, "effect": effect})
        updates = {"error": info["error"]} if "error" in info else dict(info["updates"][f.name])
        return {"optimizer": info["type"], "constants": constants, "updates": updates}

    # --- advice -----------------------------------------------------------------------------------------------
    #: The verdicts of :meth:`verdict`, in the order the rules of :meth:`recommendation` test them.
    VERDICTS = (
        "needs per-tensor or block scaling",
        "keep modules in FP32",
        "trains as is",
        "needs a loss scale",
        "needs FP32 master weights or optimizer",
    )

    def setting(self, fmt: str | F.FloatFormat) -> str:
        """The setting every verdict for ``fmt`` assumes, in words: autocast (FP32 weights, the optimizer in
        FP32) or every op and the weights in ``fmt``; the optimizer given (or that none was).

        Raises ValueError when ``fmt`` was not analysed by this report.
        """
        f = self._fmt(fmt)
        opt = self._optimizer["type"] if self._optimizer is not None else None
        if self.mode == "autocast":
            return (
                f"autocast to {f.name}: FP32 weights, the optimizer in FP32"
                + (f" ({opt})" if opt else " (none given)")
                + ", loss scale 1"
            )
        cast = {"FP16": "model.half()", "BF16": "model.bfloat16()"}.get(f.name)
        return (
            f"every op and the weights in {f.name}, simulated (float32 tensors rounded to {f.name}"
            + (f" as {cast} rounds" if cast else "")
            + "; code that tests a tensor's dtype does not run), "
            + (f"optimizer {opt} on {f.name} weights" if opt else "no optimizer given")
            + ", loss scale 1"
        )

    def verdict(self, fmt: str | F.FloatFormat, keep: float = 0.999) -> str:
        """The rule of :meth:`recommendation` that applies to ``fmt``, in a few words: one of :attr:`VERDICTS`.

        Raises ValueError when ``fmt`` was not analysed by this report.
        """
        return self._advice(fmt, keep)[0]

    def recommendation(self, fmt: str | F.FloatFormat, keep: float = 0.999) -> str:
        """One sentence: what the step needs to train in ``fmt``, derived from the numbers of this report, in the
        setting it ends with (:meth:`setting`).

        The rules, in order (``keep`` as in :meth:`loss_scale_window`):

        1. *needs per-tensor or block scaling* when one scale cannot serve: some weight overflows ``fmt``; or
           less than ``keep`` of the non-zero activations or weights survive rounding to ``fmt`` (they
           underflow); or the loss-scale window is empty (low > high, or no scale keeps ``keep`` of the
           gradients);
        2. otherwise *keep these modules in FP32* when the forward pass overflows: the origins only
           (:meth:`origins` of the format's step when it turns non-finite in forward; in mode "all" also the
           "origins" of :meth:`forward_overflows`; under autocast an FP32 output beyond the range that autocast
           keeps in FP32 is no fault), never the modules that inherit the overflow; no loss scale is offered for
           it (a loss scale multiplies gradients, not activations); the loss scale the gradients need once it is
           fixed is said apart.  Also when the format's backward turns non-finite at loss scale 1 although every
           FP32 gradient fits the format (an op inside the module overflows): that module;
        3. *trains as is* when loss scale 1 lies in the window (low ≤ 1 ≤ high), or the step has no non-zero
           gradient;
        4. *needs a loss scale in [low, high]* otherwise, naming the gradients that set each end
           (:meth:`window_ends`).

        The optimizer, in the setting "all" (weights in ``fmt``) only: "keep the optimizer's arithmetic in FP32"
        when one of its constants vanishes or becomes degenerate in ``fmt`` (:meth:`optimizer_checks`), "keep
        FP32 master weights" when more than 1 − ``keep`` of the step's updates would be lost by weights stored
        in ``fmt`` (rule 5, *needs FP32 master weights or optimizer*, replaces rule 3); without an optimizer the
        sentence says that these were not checked.  Under autocast the optimizer steps FP32 weights: nothing of
        it is rounded.  :meth:`verdict` names the rule that applied.

        Raises ValueError when ``fmt`` was not analysed by this report.
        """
        return self._advice(fmt, keep)[1]

    def _forward_origins(self, f: F.FloatFormat) -> list:
        """Names of the modules where the forward pass overflows ``f``: origins of the format's step when it turns
        non-finite in forward; in mode "all" (every op in ``f``) also the origins of the FP32 outputs cast to
        ``f``.  Under autocast an FP32 output beyond ``f``'s range that the format's step keeps in FP32 is no
        fault."""
        first = self.first_nonfinite(f.name)
        names = []
        if first is not None and first[1] == "forward":
            for o in self.origins(f.name):
                if o["pass"] == "forward" and o["module"] not in names:
                    names.append(o["module"])
            if not names:
                names.append(first[0])
        if self.mode == "all":
            for n in self.forward_overflows(f.name, "origins"):
                if n not in names:
                    names.append(n)
        return names

    def _advice(self, fmt, keep: float) -> tuple:
        """(verdict, recommendation) of ``fmt``: see :meth:`recommendation`."""
        f = self._fmt(fmt)
        keep = _check_keep(keep)
        key = ("advice", f.name, keep)
        if key in self._cache:
            return self._cache[key]
        low, high = self.loss_scale_window(f.name, keep)
        first = self.first_nonfinite(f.name)
        w_over = [p.name for p in self.parameters if self._overflows(p.weight, f)]
        act_kept = self._kept(self.activations, f)
        w_kept = self._kept(self.weights, f)
        k = _pct(keep, digits=6)
        per_tensor = None
        if w_over:
            per_tensor = f"{len(w_over)} weight tensor(s) overflow {f.name} (e.g. {w_over[0]})"
        elif math.isfinite(act_kept) and act_kept < keep:
            per_tensor = (
                f"only {_pct_below(act_kept, keep)} of the non-zero activations stay non-zero in "
                f"{f.name}, fewer than {k}"
            )
        elif math.isfinite(w_kept) and w_kept < keep:
            per_tensor = (
                f"only {_pct_below(w_kept, keep)} of the non-zero weights stay non-zero in {f.name}, fewer than {k}"
            )
        elif high is not None and low is None:
            per_tensor = f"no loss scale keeps {k} of the non-zero gradients"
        elif low is not None and low > high:
            per_tensor = (
                f"keeping {k} of the non-zero gradients needs a loss scale ≥ {_pow2_text(low)}, but the "
                f"largest gradient overflows above {_pow2_text(high)}"
            )
        scale_ok = low is None or low <= 1.0 <= high
        window = f"[{_pow2_text(low)}, {_pow2_text(high)}]"
        origins = self._forward_origins(f)
        backward_fault = (
            first is not None and first[1] == "backward" and scale_ok and not self.gradients_in(f.name).nonfinite
        )
        forward_fails = first is not None and first[1] == "forward"
        if origins and (forward_fails or per_tensor is None):
            names = ", ".join(n or "(model)" for n in origins[:4]) + (
                f" and {len(origins) - 4} more" if len(origins) > 4 else ""
            )
            rec = self._by_name.get(origins[0])
            amax = rec.activation.amax if rec is not None else float("nan")
            inherited = [n for n in self.forward_overflows(f.name, "inherited")]
            if forward_fails:
                inherited += [n for n, w in self.inherited(f.name) if w == "forward" and n not in inherited]
            if forward_fails and rec is not None and not _beyond(amax, f):
                where = f"its {f.name} step turns inf/NaN at {first.describe()}"
            else:
                where = (
                    "its output reaches" if len(origins) == 1 else f"the first, {origins[0] or '(model)'}, reaches"
                ) + f" {amax:.5g} > {f.name}'s max {f.max:g}"
            how = "with autocast disabled around it" if self.mode == "autocast" else "its weights and its ops in FP32"
            verdict = self.VERDICTS[1]
            text = (
                f"keep {names} in FP32 ({how}; {where}"
                + (f"; {len(inherited)} module(s) after it only inherit the overflow" if inherited else "")
                + "); no loss scale cures a forward overflow"
                + (
                    ""
                    if scale_ok or per_tensor is not None
                    else f"; once it is fixed, the gradients need a loss scale in {window}"
                )
                + (f"; besides, one scale cannot serve: {per_tensor}" if per_tensor is not None else "")
            )
        elif per_tensor is not None:
            verdict, text = self.VERDICTS[0], f"needs per-tensor or block scaling: {per_tensor}"
        elif backward_fault:
            verdict = self.VERDICTS[1]
            text = (
                f"keep {first[0] or '(model)'} in FP32: its backward turns inf/NaN in {f.name} at loss scale 1 "
                f"({first.describe()}) although every FP32 gradient fits {f.name}"
            )
        elif scale_ok:
            verdict = self.VERDICTS[2]
            text = "trains as is: no output overflows and " + (
                "the step has no non-zero gradient to scale"
                if low is None
                else f"at loss scale 1 at least {k} of the non-zero gradients stay non-zero and none overflows"
            )
        else:
            verdict, text = self.VERDICTS[3], f"needs a loss scale in {window}" + self._ends_text(f, keep)
        extra = []
        if self.mode == "all":
            opt = self.optimizer_checks(f.name)
            if opt is None:
                extra.append(
                    f"not checked: whether the optimizer's constants and its updates survive on {f.name} "
                    "weights (pass optimizer= to precision_report)"
                )
            else:
                vanish = [c["name"] for c in opt["constants"] if c["effect"] == "vanishes"]
                one = [c["name"] for c in opt["constants"] if c["effect"] == "degenerate"]
                if vanish or one:
                    why = [f"{', '.join(vanish)} rounds to 0"] if vanish else []
                    why += (
                        [
                            f"{', '.join(one)} rounds to 1: in {f.name} the moving average times it rounds back to itself and never decays"
                        ]
                        if one
                        else []
                    )
                    extra.append(f"keep the optimizer's arithmetic in FP32 ({'; '.join(why)})")
                u = opt["updates"]
                if "share_lost" in u and math.isfinite(u["share_lost"]) and u["share_lost"] > 1 - keep:
                    extra.append(
                        f"keep FP32 master weights ({_pct(u['share_lost'])} of the step's updates round "
                        f"away on {f.name} weights)"
                    )
                elif "error" in u:
                    extra.append(
                        f"not checked: the optimizer's updates (its step could not run on a copy: {u['error']})"
                    )
            if verdict == self.VERDICTS[2] and any(e.startswith("keep") for e in extra):
                verdict = self.VERDICTS[4]
                text = "activations and gradients fit" + text[len("trains as is") :]
        text = "; ".join([text, *extra]) + f" [setting: {self.setting(f.name)}]."
        self._cache[key] = (verdict, text)
        return verdict, text

    def _ends_text(self, f: F.FloatFormat, keep: float) -> str:
        ends = self.window_ends(f.name, keep)
        parts = []
        if ends["low"]:
            top = ends["low"][0]
            parts.append(
                f"below the low end most lost gradients are in {top['module'] or '(model)'} "
                f"({_pct(top['share'])} of them)"
            )
        if ends["high"] is not None:
            h = ends["high"]
            what = (
                f"the gradient of {h['output']}"
                if h["node"] is None
                else f"a gradient in {h['module'] or '(model)'} (of {h['node']})"
            )
            parts.append(f"the high end is set by {what}, up to {h['amax']:.3g}")
        return (" (" + "; ".join(parts) + ")") if parts else ""

    # --- presentation -----------------------------------------------------------------------------------------
    def summary(self, fmt: str | F.FloatFormat, keep: float = 0.999) -> dict:
        """The per-format answers as one dict: max, loss, forward_overflows (all, origins, inherited),
        first_nonfinite (module, pass, op, function), origins, loss_scale_window, window_ends, dynamic_scaler,
        optimizer, setting, verdict, recommendation (JSON-ready)."""
        f = self._fmt(fmt)
        low, high = self.loss_scale_window(f.name, keep)
        first = self.first_nonfinite(f.name)
        return {
            "max": f.max,
            "loss": _json_float(self.runs[f.name].loss),
            "forward_overflows": self.forward_overflows(f.name),
            "forward_overflow_origins": self.forward_overflows(f.name, "origins"),
            "forward_overflows_inherited": self.forward_overflows(f.name, "inherited"),
            "first_nonfinite": list(first) if first else None,
            "first_nonfinite_op": (
                {"op": first.op, "function": first.function, "node": first.node, "origin": first.origin}
                if first is not None and first.op
                else None
            ),
            "origins": [
                {k: o[k] for k in ("pass", "module", "function", "op", "node", "in_amax", "out_amax", "fp32_out_amax")}
                for o in self.origins(f.name)
            ],
            "inherited": [list(x) for x in self.inherited(f.name)],
            "loss_scale_window": [_json_float(low), _json_float(high)],
            "keep": keep,
            "window_ends": self.window_ends(f.name, keep),
            "dynamic_scaler": self.dynamic_scaler(f.name, keep=keep),
            "nonfinite_parameter_gradients": list(self.runs[f.name].nonfinite_parameter_gradients),
            "optimizer": self.optimizer_checks(f.name),
            "setting": self.setting(f.name),
            "verdict": self.verdict(f.name, keep),
            "recommendation": self.recommendation(f.name, keep),
        }

    def _summary_rows(self):
        rows = []
        for name in self.formats:
            f = F.get_format(name)
            low, high = self.loss_scale_window(name)
            over = self.forward_overflows(name)
            origins = self.forward_overflows(name, "origins")
            first = self.first_nonfinite(name)
            sc = self.dynamic_scaler(name)
            if over:
                o = ", ".join(n or "(model)" for n in origins[:2]) + (" …" if len(origins) > 2 else "")
                overflows = f"{len(over)}" + (f" (origin: {o})" if origins else "")
            else:
                overflows = "0"
            rows.append(
                {
                    "format": name,
                    "max": f"{f.max:.5g}",
                    "loss": _num(self.runs[name].loss),
                    "overflows": overflows,
                    "first": first.describe() if first else "none",
                    "window": f"[{_pow2_text(low)}, {_pow2_text(high)}]"
                    if low is None or high is None or low <= high
                    else f"empty ({_pow2_text(low)} > {_pow2_text(high)})",
                    "scaler": "never clean"
                    if sc["skipped"] is None
                    else f"{sc['skipped']} skipped → {_pow2_text(sc['scale'])}",
                    "recommendation": self.recommendation(name),
                }
            )
        return rows

    _SUMMARY_HEAD = (
        ("format", "format"),
        ("max", "max"),
        ("loss", "loss"),
        ("overflows", "modules overflowing in forward"),
        ("first", "first inf/NaN"),
        ("window", "loss-scale window"),
        ("scaler", "dynamic scaler from 2^16"),
    )

    def _module_rows(self):
        shares = {name: self.shares(name) for name in self.formats}
        roles = {name: self.overflow_roles(name) for name in self.formats}
        rows = []
        for m in self.modules:
            r = [
                m.label,
                m.type,
                str(m.calls),
                _num(m.activation.amax),
                _num(m.activation_gradient.amax) if m.activation_gradient.total else "–",
            ]
            for name in self.formats:
                s = shares[name][m.name]
                a, g = s["activation"], s["activation_gradient"]
                role = roles[name].get(m.name)
                tag = {"origin": " (origin)", "inherited": " (inherited)", "contains origin": " (contains)"}.get(
                    role, ""
                )
                r.append((_pct(a["overflow"]) if a else "–") + tag)
                r.append(_pct(g["underflow"]) if g else "–")
            rows.append(r)
        return rows

    def _module_head(self):
        head = ["module", "type", "calls", "output amax", "output-gradient amax"]
        for name in self.formats:
            head += [f"{name} outputs overflowing", f"{name} gradients → 0"]
        return head

    def _title(self) -> str:
        return (
            f"Precision report: {self.model_type}, {self.n_parameters:,} parameters, {len(self.modules)} modules "
            f"recorded; FP32 loss {_num(self.loss)}; formats run as simulate(mode={self.mode!r}), loss scale 1"
        )

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
        return (
            f"<PrecisionReport of {self.model_type}: {len(self.modules)} modules, formats {self.formats}, "
            f"FP32 loss {_num(self.loss)}>"
        )

    def _repr_html_(self) -> str:
        from .figures import table_html

        rows = self._summary_rows()
        summary = table_html(
            [h for _, h in self._SUMMARY_HEAD],
            [[html.escape(r[k]) for k, _ in self._SUMMARY_HEAD] for r in rows],
            align=["left"] * len(self._SUMMARY_HEAD),
        )
        recs = "".join(f"<li><b>{html.escape(r['format'])}</b>: {html.escape(r['recommendation'])}</li>" for r in rows)
        modules = table_html(self._module_head(), [[html.escape(c) for c in r] for r in self._module_rows()])
        return (
            f"<div><p><b>{html.escape(self._title())}</b></p>{summary}<ul>{recs}</ul>"
            f"<details><summary>Per module, in execution order ({len(self.modules)} modules; shares of all "
            f"values at loss scale 1)</summary>{modules}</details></div>"
        )

    def to_dict(self, keep: float = 0.999) -> dict:
        """The report as a JSON-ready dict (``json.dumps(..., allow_nan=False)`` works): provenance, the model,
        per format :meth:`summary` and the pooled GEMM shares (:meth:`gemm_summary`), per module and parameter the
        histograms (counts per binade, zeros, non-finite, amax) and the shares of :meth:`shares` per format, and
        the block statistics of every GEMM operand (when measured).  Infinities are written "inf", NaN None.
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
        return clean(
            {
                "provenance": self.provenance,
                "model": {"type": self.model_type, "parameters": self.n_parameters, "training": self.training},
                "mode": self.mode,
                "loss": self.loss,
                "formats": {
                    name: self.summary(name, keep) | {"gemms": self.gemm_summary(name)} for name in self.formats
                },
                "modules": [
                    {
                        "name": m.name,
                        "type": m.type,
                        "order": m.order,
                        "calls": m.calls,
                        "activation": _coarse(m.activation),
                        "activation_gradient": _coarse(m.activation_gradient),
                        "parameters": m.parameters,
                        "shares": {name: shares[name][m.name] for name in self.formats},
                    }
                    for m in self.modules
                ],
                "parameters": [
                    {
                        "name": p.name,
                        "module": p.module,
                        "shape": list(p.shape),
                        "dtype": p.dtype,
                        "requires_grad": p.requires_grad,
                        "aliases": p.aliases,
                        "weight": _coarse(p.weight),
                        "gradient": _coarse(p.gradient),
                    }
                    for p in self.parameters
                ],
                "gradients": _coarse(self.gradients),
                "activations": _coarse(self.activations),
                "blocks": {b: self.block_operands(b) for b in self.block_formats},
            }
        )

    def plot(self, formats: Sequence[str] | None = None, *, loss_scale: float = 1.0, max_modules: int = 80) -> Figure:
        """Modules × log2 magnitude heat maps of activations and activation gradients (× ``loss_scale``), with
        each format's representable window drawn over them: see
        :func:`mpt_lab.figures.report.plot_precision_report` (same arguments).  Returns a matplotlib Figure."""
        from .figures.report import plot_precision_report

        return plot_precision_report(self, formats, loss_scale=loss_scale, max_modules=max_modules)


def _is_gradient_operand(row: dict) -> bool:
    return bool(row.get("gradient_operand"))


def _check_keep(keep) -> float:
    if isinstance(keep, bool) or not isinstance(keep, numbers.Real) or not (0 < float(keep) <= 1):
        raise ValueError(f"keep must be a share in (0, 1], got {keep!r}")
    return float(keep)


def _text_table(head, rows) -> list:
    widths = [max(len(str(h)), *(len(str(r[i])) for r in rows)) if rows else len(str(h)) for i, h in enumerate(head)]

    def line(cells):
        return "  ".join(str(c).ljust(w) if i == 0 else str(c).rjust(w) for i, (c, w) in enumerate(zip(cells, widths)))

    return [line(head), "  ".join("-" * w for w in widths)] + [line(r) for r in rows]


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
            for name in fmts:  # the weight stored in the format, w + Δw exact
                counts[name]["nonzero"] += n
                counts[name]["lost"] += int(swamped(w, d, name).sum())
    del pairs
    for c in counts.values():
        c["share_lost"] = c["lost"] / c["nonzero"] if c["nonzero"] else float("nan")
    info["updates"] = counts
    return info


# the layer ranking and the monitor over steps live in their own modules; re-exported here
from .report_layers import LayerRanking, keep_wide  # noqa: E402
from .report_monitor import PrecisionMonitor  # noqa: E402
