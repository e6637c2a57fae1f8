"""What one training step computes, module by module and op by op: the recorder behind :mod:`mpt_lab.report`.

:class:`StepRecorder` watches one ``loss = loss_fn(model, batch); loss.backward()`` and records, depending on
its settings:

* per module call (forward hooks): the measure of each floating output (a :class:`~mpt_lab.histogram.
  Log2Histogram` in the FP32 step, "all values finite" in a format's step) and of the gradient of the loss
  with respect to it;
* per gradient of the step (every tensor of the autograd graph, read by a pre-hook on the node that produced
  it: the gradient of functional intermediates too, ``h * 1e-3`` inside a ``forward``), its histogram, added to
  the histogram of the module it was computed in;
* per ATen op (a ``TorchDispatchMode``, forward and backward): the largest magnitude of its floating inputs and
  outputs, the enclosing module path (forward: the modules whose ``forward`` is running; backward: the module
  whose forward created the autograd node being executed) and the Python-level torch function that issued it
  (a ``TorchFunctionMode``: ``scaled_dot_product_attention``, ``Tensor.__mul__``, ...);
* per GEMM (matrix products, attention, convolutions; forward, input-gradient and weight-gradient), the
  histograms of its operands and, on request, what MXFP8, MXFP4 and NVFP4 block quantisation along the
  product's reduction axis does to them.

Node attribution: every autograd node is labelled once, with the innermost module whose ``forward`` created it,
when it first becomes reachable from a module boundary (a module's inputs when a child starts, its outputs when
it returns) or from the output of a torch function; nodes created in ``loss_fn`` outside the model are
labelled "(loss_fn)".

The gradient of a module's output is read by a pre-hook on the node that produced it.  When that output is a
view (a Linear on a 3-D input returns one) and an in-place op later changes it (``ReLU(inplace=True)``,
``h *= c``), autograd rebases the view and that node never runs; the gradient then arrives at the node of the
view's base, where it is read instead (the whole base, or the view's elements of it).
"""

from __future__ import annotations

import contextlib
import math
import os
import random
import weakref
from collections.abc import Mapping

import numpy as np
import torch
from torch.overrides import TorchFunctionMode
from tqdm.auto import tqdm

from ._torch_internals import TorchDispatchMode, current_autograd_node, current_dispatch_mode
from .formats import exact_arithmetic, exact_arithmetic_active
from .histogram import Log2Histogram, log2_histogram
from .microscaling import quantization_error, quantize_mx, quantize_nvfp4

__all__ = [
    "StepRecorder",
    "GEMM_OPERANDS",
    "LOSS_FN",
    "BLOCK_FORMATS",
    "floating_tensors",
    "finite",
    "amax_of",
    "block_statistics",
    "SavedState",
    "ProgressBar",
    "progress_wanted",
    "check_loss",
]

#: The label of ops and gradients computed outside every module (in ``loss_fn``, around the model call).
LOSS_FN = "(loss_fn)"

#: ATen ops that are matrix products: name → operands as (argument index, reduction axis, label).  The axis is
#: the one a block format's blocks run along (OCP MX: along the dot product).  Attention ops are two products,
#: q·kᵀ (over the head dimension) and p·v (over the keys); convolutions reduce over input channels × kernel
#: (blocks along the channel dimension here).
GEMM_OPERANDS = {
    "mm": ((0, -1, "A"), (1, -2, "B")),
    "addmm": ((1, -1, "A"), (2, -2, "B")),
    "bmm": ((0, -1, "A"), (1, -2, "B")),
    "baddbmm": ((1, -1, "A"), (2, -2, "B")),
    "addbmm": ((1, -1, "A"), (2, -2, "B")),
    "mv": ((0, -1, "A"), (1, -1, "B")),
    "addmv": ((1, -1, "A"), (2, -1, "B")),
    "dot": ((0, -1, "A"), (1, -1, "B")),
    "vdot": ((0, -1, "A"), (1, -1, "B")),
    "_scaled_dot_product_flash_attention_for_cpu": ((0, -1, "q"), (1, -1, "k"), (2, -2, "v")),
    "_scaled_dot_product_flash_attention": ((0, -1, "q"), (1, -1, "k"), (2, -2, "v")),
    "_scaled_dot_product_efficient_attention": ((0, -1, "q"), (1, -1, "k"), (2, -2, "v")),
    "_scaled_dot_product_cudnn_attention": ((0, -1, "q"), (1, -1, "k"), (2, -2, "v")),
    "_scaled_dot_product_fused_attention_overrideable": ((0, -1, "q"), (1, -1, "k"), (2, -2, "v")),
    "_scaled_dot_product_flash_attention_for_cpu_backward": ((0, -1, "grad"), (1, -1, "q"), (2, -1, "k"), (3, -2, "v")),
    "_scaled_dot_product_flash_attention_backward": ((0, -1, "grad"), (1, -1, "q"), (2, -1, "k"), (3, -2, "v")),
    "_scaled_dot_product_efficient_attention_backward": ((0, -1, "grad"), (1, -1, "q"), (2, -1, "k"), (3, -2, "v")),
    "convolution": ((0, 1, "input"), (1, 1, "weight")),
    "_convolution": ((0, 1, "input"), (1, 1, "weight")),
    "mkldnn_convolution": ((0, 1, "input"), (1, 1, "weight")),
    "convolution_backward": ((0, 1, "grad"), (1, 1, "input"), (2, 1, "weight")),
}
_ATTENTION_BACKWARD = {k for k in GEMM_OPERANDS if k.startswith("_scaled_dot_product") and k.endswith("backward")}
#: Ops whose outputs hold no values yet (uninitialised memory): not recorded.
_UNINITIALISED = frozenset(
    {
        "empty",
        "empty_like",
        "empty_strided",
        "new_empty",
        "new_empty_strided",
        "empty_permuted",
        "resize_",
        "resize_as_",
        "set_",
    }
)
#: In-place ops that overwrite what they write without reading it: its old values are no input.
_OVERWRITES = frozenset(
    {
        "copy_",
        "fill_",
        "zero_",
        "bernoulli_",
        "uniform_",
        "normal_",
        "random_",
        "exponential_",
        "geometric_",
        "cauchy_",
        "log_normal_",
        "fill_diagonal_",
    }
)


# ------------------------------------------------------------------------------------------------ helpers
def floating_tensors(obj, depth: int = 0):
    """The floating tensors of a module's output: a tensor, or (nested) tuples, lists and Mapping values
    (Hugging Face ``ModelOutput`` is an ordered dict).  Other objects (caches, ints, None) are skipped."""
    if isinstance(obj, torch.Tensor):
        if obj.is_floating_point():
            yield obj
    elif depth < 6 and isinstance(obj, (tuple, list)):
        for o in obj:
            yield from floating_tensors(o, depth + 1)
    elif depth < 6 and isinstance(obj, Mapping):
        for o in obj.values():
            yield from floating_tensors(o, depth + 1)


def _op_tensors(obj):
    """Tensors among an op's arguments or results (one level of lists/tuples, as ATen signatures have)."""
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, (tuple, list)):
        return [t for t in obj if isinstance(t, torch.Tensor)]
    return []


@exact_arithmetic
def finite(t: torch.Tensor) -> bool:
    """Whether every value of t is finite: one fast pass (the sum is non-finite when a value is), confirmed value
    by value only when the sum is not finite (a sum of finite values can overflow).  Exact inside a
    :class:`~mpt_lab.simulate.simulate` block."""
    if t.numel() == 0:
        return True
    t = t.detach()
    if bool(torch.isfinite(t.sum())):
        return True
    return bool(torch.isfinite(t).all())


def amax_of(t: torch.Tensor) -> torch.Tensor:
    """max |t| as a 0-d float32 tensor: inf when t holds an infinity, NaN when it holds a NaN (one pass; call it
    under :func:`~mpt_lab.formats.exact_arithmetic` inside a simulated block)."""
    if t.numel() == 0:
        return torch.zeros((), dtype=torch.float32)
    t = t.detach()
    if t.dtype != torch.float32:
        t = t.float()
    return torch.linalg.vector_norm(t, float("inf")).reshape(())


def _covers(view: torch.Tensor, base: torch.Tensor) -> bool:
    """Whether ``view`` holds every element of ``base`` exactly once (a reshape, a transpose or a permutation of
    a dense base: the same values, so the same histogram), read from sizes, strides and offsets alone."""
    if view.numel() != base.numel() or view.storage_offset() != base.storage_offset() or not base.is_contiguous():
        return False
    expected = 1
    dims = sorted(((st, sz) for sz, st in zip(view.shape, view.stride()) if sz != 1))
    for stride, size in dims:
        if stride != expected:
            return False
        expected *= size
    return True


def _version(t) -> int | None:
    try:
        return t._version
    except RuntimeError:  # inference tensors have no version counter
        return None


def _name_of_function(func) -> str:
    mod = getattr(func, "__module__", None) or ""
    name = getattr(func, "__qualname__", None) or getattr(func, "__name__", None) or str(func)
    name = name.replace("TensorBase.", "Tensor.").replace("_TensorBase.", "Tensor.")
    if mod.startswith("torch.nn.functional") or mod == "torch._C._nn":
        return f"F.{name}"
    if name.startswith("Tensor."):
        return name
    if mod.startswith("torch"):
        return f"torch.{name}"
    return name


class _DispatchMode(TorchDispatchMode):
    def __init__(self, rec):
        super().__init__()
        self.rec = rec

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if exact_arithmetic_active():  # histograms, rounding, the report's own measurements
            return func(*args, **kwargs)
        return self.rec._dispatch(func, args, kwargs)


class _FunctionMode(TorchFunctionMode):
    def __init__(self, rec):
        super().__init__()
        self.rec = rec

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        rec = self.rec
        if rec._function is not None or exact_arithmetic_active():
            return func(*args, **kwargs)
        rec._function = _name_of_function(func)
        try:
            out = func(*args, **kwargs)
        finally:
            fn, rec._function = rec._function, None
        if torch.is_grad_enabled():
            rec._label(_op_tensors(out) if not isinstance(out, torch.Tensor) else [out], (rec._module(), fn))
        return out


# ---------------------------------------------------------------------------------------------- the recorder
#: Values at each end of a row that :meth:`StepRecorder._zero_rows` reads before reading whole rows.
_ZERO_ROW_HEAD = 16


class StepRecorder:
    """Hooks and modes for one step (see the module docstring); use as ``with StepRecorder(...) as rec:`` around
    ``loss = loss_fn(model, batch)`` and call :meth:`before_backward` with the loss before ``loss.backward()``.

    Parameters
    ----------
    named_modules : dict name → module (``dict(model.named_modules())``)
    measure : "histogram" (the FP32 step) or "finite" (a format's step)
    edges : bool, measure the gradient of every tensor of the graph (the FP32 step), not only of module outputs
    ops : bool, record every ATen op (amax of inputs and outputs, module path, torch function)
    gemms : bool, record the histograms of every GEMM's operands
    block_formats : names of block formats ("MXFP8", "MXFP4", "NVFP4") whose quantisation of every GEMM operand
        is measured (with ``gemms``)
    params : dict id(parameter) → name: the model's parameters (the other leaves of the graph are the caller's,
        whose ``.grad`` must be kept) and the names of GEMM operands that are (views of) parameters
    tag : callable(tensor) → bool or None: with ``edges`` in a format's step, whether each gradient holds the
        format's values (:meth:`mpt_lab.simulate.simulate.holds`), recorded per edge in ``edge_tags``
    progress : callable(name) or None, called after each module's forward (a progress bar)
    modules : bool, measure module outputs and their gradients (False: only the module stack and node labels,
        for a step recorded op by op)
    """

    def __init__(
        self,
        named_modules: dict,
        *,
        measure: str = "histogram",
        edges: bool = False,
        ops: bool = False,
        gemms: bool = False,
        block_formats=(),
        params: dict | None = None,
        progress=None,
        modules: bool = True,
        tag=None,
    ):
        self.named_modules = named_modules
        self.names = {id(m): n for n, m in named_modules.items()}
        self.histogram = measure == "histogram"
        self.edges, self.ops, self.gemms = edges, ops, gemms
        self.block_formats = tuple(block_formats)
        self.params = params or {}
        self.progress = progress
        self.tag = tag
        self.modules = modules
        self.labelling = edges or ops or gemms
        self._grads: dict = {}  # id -> weakref of the gradients backward received (GEMM operands)
        self.handles: list = []
        self._stack: list = []  # names of the modules whose forward is running
        self._function = None  # the torch function running (function mode)
        self._labels: dict = {}  # id(node) -> (module, function)
        self._keep: list = []  # nodes kept alive while the step runs (ids stay unique)
        self._hist_cache: dict = {}  # id(base) -> (weakref, version, histogram)
        self._amax_cache: dict = {}  # id(tensor) -> (weakref, version, amax tensor)
        # module outputs and their gradients
        self.calls: dict = {}
        self.order: list = []
        self.forward: dict = {}  # name -> [measure]
        self.backward: dict = {}  # name -> [measure]
        self.events: list = []  # (name, "forward"|"backward", measure)
        self.unique_forward: list = []
        self._seen_out: dict = {}
        self._targets: dict = {}  # edge -> list of watch entries
        self._hooked: set = set()  # ids of nodes with our pre-hook
        self._edge_measure: dict = {}  # edge -> measure (edges of watched outputs, or every edge)
        self._seed = None
        # every gradient (edges): the gradient of every tensor of the graph, in the order backward produces them
        self.edge_list: list = []  # (node name, output_nr, module, index into edge_hists, parameter or None)
        self.edge_hists: list = []  # distinct gradient histograms
        self._hist_index: dict = {}
        self.edge_tags: list = []  # (node name, output_nr, held in the format) of a format's step
        self._acc_names: dict = {}  # id(AccumulateGrad node) -> (module, parameter name)
        # ops and GEMMs
        self.op_records: list = []  # (pass, module, function, op, node, in_amax index, out_amax index)
        self._amaxes: list = []  # 0-d tensors (stacked at the end)
        self.gemm_records: list = []
        self.block_cache: dict = {}
        self._modes: list = []
        self._dispatch_mode = None
        self.error: BaseException | None = None

    # --- entering and leaving --------------------------------------------------------------------------
    def __enter__(self):
        for n, m in self.named_modules.items():
            self.handles.append(m.register_forward_pre_hook(self._pre_hook))
            self.handles.append(m.register_forward_hook(self._post_hook, always_call=True))
        if self.ops:
            fm = _FunctionMode(self)
            fm.__enter__()
            self._modes.append(fm)
        if self.ops or self.gemms:
            dm = _DispatchMode(self)
            dm.__enter__()
            self._modes.append(dm)
            self._dispatch_mode = dm
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def close(self) -> None:
        """Leave the modes, remove every hook of the recorder and let go of the autograd nodes it kept."""
        while self._modes:
            self._modes.pop().__exit__(None, None, None)
        for h in self.handles:
            h.remove()
        self.handles = []
        self._keep.clear()
        self._seen_out.clear()
        self._amax_cache.clear()

    def stop_ops(self) -> None:
        """Leave the op modes (before the report's own work after the step)."""
        while self._modes:
            self._modes.pop().__exit__(None, None, None)
        self._dispatch_mode = None

    @contextlib.contextmanager
    def _aside(self):
        """The recorder's dispatch mode steps aside (when it is the innermost mode) while the report measures: a
        compiled histogram kernel would otherwise run op by op through it."""
        dm = self._dispatch_mode
        if dm is None or current_dispatch_mode() is not dm:
            yield
            return
        dm.__exit__(None, None, None)
        try:
            yield
        finally:
            dm.__enter__()

    # --- labels --------------------------------------------------------------------------------------------
    def _module(self):
        return self._stack[-1] if self._stack else None

    def _label(self, tensors, label) -> None:
        """Label every unlabelled node reachable from ``tensors``' autograd nodes with ``label``."""
        labels = self._labels
        todo = []
        for t in tensors:
            if isinstance(t, torch.Tensor):
                n = t.grad_fn
                if n is not None and id(n) not in labels:
                    todo.append(n)
        while todo:
            n = todo.pop()
            if id(n) in labels:
                continue
            if type(n).__name__ == "AccumulateGrad":
                continue
            labels[id(n)] = label
            self._keep.append(n)
            for nxt, _ in n.next_functions:
                if nxt is not None and id(nxt) not in labels:
                    todo.append(nxt)

    def label_of(self, node) -> tuple:
        """(module, function) of an autograd node; (LOSS_FN, None) for nodes created outside every module."""
        lab = self._labels.get(id(node))
        return lab if lab is not None else (LOSS_FN, None)

    # --- module hooks --------------------------------------------------------------------------------------
    def _pre_hook(self, module, args):
        name = self.names.get(id(module))
        if name is None:
            return None
        if self.labelling and torch.is_grad_enabled():
            self._label(floating_tensors(args), (self._module(), None))
        self._stack.append(name)
        return None

    def _post_hook(self, module, args, output):
        name = self.names.get(id(module))
        if name is None:
            return None
        if self._stack and self._stack[-1] == name:
            self._stack.pop()
        elif name in self._stack:  # an exception unwound a child without its hook
            del self._stack[len(self._stack) - 1 - self._stack[::-1].index(name) :]
        outs = list(floating_tensors(output))
        grad = torch.is_grad_enabled()
        if self.labelling and grad:
            self._label(outs, (name, None))
        if self.progress is not None:
            self.progress(name)
        if not self.modules:
            return None
        if name not in self.calls:
            self.calls[name] = 0
            self.order.append(name)
        self.calls[name] += 1
        for t in outs:
            key = (id(t), _version(t))
            seen = self._seen_out.get(key)
            if seen is not None and seen[0]() is t:
                rec = seen[1]
            else:
                rec = self._measure(t)
                self.unique_forward.append(rec)
                self._seen_out[key] = (weakref.ref(t), rec)
            self.forward.setdefault(name, []).append(rec)
            self.events.append((name, "forward", rec))
            if t.requires_grad and grad:
                self._watch(name, t)
        return None

    # --- measures ------------------------------------------------------------------------------------------
    def _measure(self, t):
        if self.histogram:
            with self._aside():
                return self.hist(t)
        return finite(t)

    def hist(self, t: torch.Tensor) -> Log2Histogram:
        """The histogram of t's values, computed once per tensor (and per base, for a view that covers all of its
        base: a weight and its transpose)."""
        base = t._base
        if base is None:
            base = t
        elif not _covers(t, base):
            return log2_histogram(t.detach())
        key = id(base)
        ver = _version(base)
        e = self._hist_cache.get(key)
        if e is not None and e[0]() is base and e[1] == ver:
            return e[2]
        h = log2_histogram(base.detach())
        cache = self._hist_cache

        def forget(ref, key=key):
            e = cache.get(key)
            if e is not None and e[0] is ref:
                del cache[key]

        cache[key] = (weakref.ref(base, forget), ver, h)
        return h

    def _is_cached(self, t) -> bool:
        base = t._base if t._base is not None else t
        e = self._hist_cache.get(id(base))
        return e is not None and e[0]() is base and e[1] == _version(base)

    # --- gradients of module outputs -----------------------------------------------------------------------
    def _watch(self, name: str, t: torch.Tensor) -> None:
        node = t.grad_fn
        if node is None:  # a leaf returned as output (a module that returns a parameter)
            entry = {"names": [name], "done": False}
            self.handles.append(t.register_hook(lambda g, entry=entry: self._emit(entry, self._grad_measure(g))))
            return
        edge = (id(node), t.output_nr)
        for entry in self._targets.get(edge, ()):
            if entry.get("direct") == edge:  # the same output tensor (a container returning its child's)
                if name not in entry["names"]:
                    entry["names"].append(name)
                return
        entry = {"names": [name], "direct": edge, "done": False}
        self._targets.setdefault(edge, []).append(entry)
        self._hook_node(node)
        base = t._base
        if base is not None and base.grad_fn is not None:
            bedge = (id(base.grad_fn), base.output_nr)
            if t.numel() != base.numel() or t.stride() != base.stride():
                entry["slice"] = (
                    tuple(t.size()),
                    tuple(t.stride()),
                    t.storage_offset() - base.storage_offset(),
                    tuple(base.stride()),
                )
            entry["base"] = bedge
            self._targets.setdefault(bedge, []).append(entry)
            self._hook_node(base.grad_fn)

    def _hook_node(self, node) -> None:
        if id(node) in self._hooked:
            return
        self._hooked.add(id(node))
        self._keep.append(node)
        self.handles.append(node.register_prehook(self._prehook(node)))

    def _grad_measure(self, g):
        if self.histogram:
            with self._aside():
                return self.hist(g)
        return finite(g)

    def _prehook(self, node):
        nid = id(node)
        node_name = node.name()
        acc = self._acc_names.get(nid)

        def prehook(grad_outputs):
            for nr, g in enumerate(grad_outputs):
                if g is None or not isinstance(g, torch.Tensor) or not g.is_floating_point():
                    continue
                edge = (nid, nr)
                if edge == self._seed:
                    continue
                if self.gemms:
                    self._grads[id(g)] = weakref.ref(g)
                targets = self._targets.get(edge)
                m = None
                if self.edges:
                    if self.histogram:
                        with self._aside():
                            m = self.hist(g)
                        idx = self._hist_index.get(id(m))
                        if idx is None:
                            idx = self._hist_index[id(m)] = len(self.edge_hists)
                            self.edge_hists.append(m)
                        module = acc[0] if acc is not None else self.label_of(node)[0]
                        self.edge_list.append((node_name, nr, module, idx, acc[1] if acc is not None else None))
                    else:
                        self.edge_tags.append((node_name, nr, bool(self.tag(g)) if self.tag is not None else True))
                if not targets:
                    continue
                if m is None:
                    m = self._grad_measure(g)
                self._edge_measure[edge] = m
                for entry in targets:
                    if entry["done"]:
                        continue
                    if entry.get("direct") == edge:
                        self._emit(entry, m)
                    elif "slice" not in entry:  # the view covers its base: the same values
                        self._emit(entry, m)
                    else:
                        size, stride, off, bstride = entry["slice"]
                        if tuple(g.stride()) == bstride:
                            with exact_arithmetic():
                                part = g.as_strided(size, stride, g.storage_offset() + off)
                            self._emit(entry, self._grad_measure(part))
            return None

        return prehook

    def _emit(self, entry: dict, m) -> None:
        entry["done"] = True
        for name in entry["names"]:
            self.backward.setdefault(name, []).append(m)
            self.events.append((name, "backward", m))

    # --- before backward -----------------------------------------------------------------------------------
    def before_backward(self, loss: torch.Tensor) -> list:
        """Call after ``loss_fn`` and before ``loss.backward()``: excludes the loss's own gradient (backward's
        seed), labels the nodes created outside every module, hooks every node when ``edges`` is set, and returns
        the non-parameter leaf tensors of the graph (whose ``.grad`` backward will write)."""
        root = loss.grad_fn
        leaves = []
        if root is None:
            return leaves
        self._seed = (id(root), loss.output_nr)
        self._keep.append(root)
        seen = set()
        todo = [root]
        params = self.params
        while todo:
            n = todo.pop()
            if id(n) in seen:
                continue
            seen.add(id(n))
            if type(n).__name__ == "AccumulateGrad":
                v = n.variable
                pname = params.get(id(v))
                if pname is None:
                    leaves.append(v)
                if self.edges:
                    self._acc_names[id(n)] = (
                        (pname.rpartition(".")[0] if pname is not None else LOSS_FN),
                        pname if pname is not None else "(a leaf tensor)",
                    )
                    self._hook_node(n)
                continue
            if self.labelling and id(n) not in self._labels:
                self._labels[id(n)] = (LOSS_FN, None)
                self._keep.append(n)
            if self.edges:
                self._hook_node(n)
            for nxt, _ in n.next_functions:
                if nxt is not None and id(nxt) not in seen:
                    todo.append(nxt)
        return leaves

    def parameter_gradient(self, name: str):
        """The histogram of parameter ``name``'s gradient as its AccumulateGrad node received it (``edges``), or
        None when no gradient reached it."""
        for node, nr, module, idx, param in self.edge_list:
            if param == name:
                return self.edge_hists[idx]
        return None

    def edge_amaxes(self) -> list:
        """The amax (float) of each of ``edge_hists``."""
        return [h.amax for h in self.edge_hists]

    # --- ops -----------------------------------------------------------------------------------------------
    def _amax_index(self, t: torch.Tensor) -> int:
        """Index (into ``_amaxes``) of max |t|, computed once per tensor and version."""
        base = t._base
        if base is not None and t.numel() == base.numel():  # a view of all of its base: the same values
            t = base
        key = id(t)
        ver = _version(t)
        e = self._amax_cache.get(key)
        if e is not None and e[0]() is t and e[1] == ver:
            return e[2]
        with exact_arithmetic():
            a = amax_of(t)
        self._amaxes.append(a)
        i = len(self._amaxes) - 1
        cache = self._amax_cache

        def forget(ref, key=key):
            e = cache.get(key)
            if e is not None and e[0] is ref:
                del cache[key]

        try:
            cache[key] = (weakref.ref(t, forget), ver, i)
        except TypeError:
            pass
        return i

    def _dispatch(self, func, args, kwargs):
        plan = _plans.get(func)
        if plan is None:
            plan = _plans[func] = _plan(func)
        name, view, written = plan
        if view:
            return func(*args, **kwargs)
        node = current_autograd_node()
        gemm = GEMM_OPERANDS.get(name) if self.gemms else None
        if gemm is not None:
            self._record_gemm(name, gemm, args, node)
        if not self.ops or name in _UNINITIALISED:
            return func(*args, **kwargs)
        ins = [t for a in (*args, *kwargs.values()) for t in _op_tensors(a) if t.is_floating_point()]
        if name in _OVERWRITES and written:
            dropped = [t for i in written for t in _op_tensors(_arg(func, args, kwargs, i))]
            ins = [t for t in ins if not any(t is d for d in dropped)]
        in_idx = [self._amax_index(t) for t in ins]
        out = func(*args, **kwargs)
        outs = [t for t in _op_tensors(out) if t.is_floating_point()]
        if written:
            outs += [t for i in written for t in _op_tensors(_arg(func, args, kwargs, i)) if t.is_floating_point()]
        out_idx = [self._amax_index(t) for t in outs]
        if node is None:
            where, module, function, node_name = "forward", self._module(), self._function, None
        else:
            module, function = self.label_of(node)
            where, node_name = "backward", node.name()
        self.op_records.append((where, module, function, name, node_name, in_idx, out_idx))
        return out

    def op_table(self) -> list:
        """The ops recorded, as dicts: pass, module, function, op, node, in_amax, out_amax (floats; in_amax is
        0.0 for an op without floating inputs; NaN propagates: a NaN amax means a NaN value)."""
        if not self.op_records:
            return []
        vals = torch.stack([a.reshape(()) for a in self._amaxes]).tolist() if self._amaxes else []

        def mx(idx):
            out = 0.0
            for i in idx:
                v = vals[i]
                if v != v:
                    return v
                out = max(out, v)
            return out

        return [
            {
                "pass": w,
                "module": m if m is not None else LOSS_FN,
                "function": f,
                "op": o,
                "node": nd,
                "in_amax": mx(i),
                "out_amax": mx(j),
            }
            for w, m, f, o, nd, i, j in self.op_records
        ]

    # --- GEMMs ---------------------------------------------------------------------------------------------
    def _record_gemm(self, name: str, spec, args, node) -> None:
        if node is None:
            where, module = "forward", self._module()
        else:
            where, module = "backward", self.label_of(node)[0]
        module = module if module is not None else LOSS_FN
        operands = []
        param_in = False
        for i, axis, label in spec:
            if i >= len(args) or not isinstance(args[i], torch.Tensor) or not args[i].is_floating_point():
                continue
            t = args[i]
            pname = self.params.get(id(t)) or (self.params.get(id(t._base)) if t._base is not None else None)
            param_in = param_in or pname is not None
            operands.append((label, t, axis, pname))
        if not operands:
            return
        if where == "forward":
            kind = "forward"
        elif name == "convolution_backward":
            kind = "input- and weight-gradient"
        elif name in _ATTENTION_BACKWARD or param_in:
            kind = "input-gradient"
        else:
            kind = "weight-gradient" if self._is_weight_gradient(name, operands, module) else "input-gradient"
        rows = []
        for label, t, axis, pname in operands:
            hist = self.hist(t)
            row = {
                "module": module,
                "pass": where,
                "op": name,
                "gemm": kind,
                "operand": label,
                "parameter": pname,
                "shape": tuple(t.shape),
                "histogram": hist,
                "gradient_operand": where == "backward" and self._is_gradient(t),
                "zero_rows": self._zero_rows(t, axis, hist),
            }
            if self.block_formats:
                row["blocks"] = self._blocks(t, axis)
            rows.append(row)
        self.gemm_records.extend(rows)

    def _zero_rows(self, t, axis: int, hist: Log2Histogram | None = None) -> float:
        """The share of the operand's rows (its slices along the reduction axis: what row-wise scaling scales
        together) whose values are all zero: their amax is 0, and a scale amax / max is 0 (torchao issue 3356).
        ``hist``, the histogram of t's values, saves the pass over t when t holds fewer zeros than a row has
        values (then no row is all zero); otherwise the first and last values of each row are read first, and
        then whole only the rows that start and end with zeros (a row with a non-zero value among them is
        not all zero: dropout's scattered zeros, or the zeros of a causal attention matrix, which its transpose
        has at the start of a row and not at its end)."""
        if t.dim() == 0 or t.numel() == 0:
            return 0.0
        axis = axis % t.dim()
        if hist is not None and hist.zeros < t.shape[axis]:
            return 0.0
        with exact_arithmetic():
            t = t.detach()
            n = t.shape[axis]
            k = min(n, _ZERO_ROW_HEAD)
            ends = (t.narrow(axis, 0, k) == 0).all(dim=axis) & (t.narrow(axis, n - k, k) == 0).all(dim=axis)
            if not bool(ends.any()):
                return 0.0
            # the rows that start and end with zeros, read whole: a row is all zero iff its smallest and largest
            # values are both 0 (a NaN makes both NaN)
            lo, hi = torch.aminmax(t.movedim(axis, -1)[ends], dim=-1)
            return int(((lo == 0) & (hi == 0)).sum()) / ends.numel()

    def _is_gradient(self, t) -> bool:
        """Whether t is (a view of) a gradient that a node of this backward pass received."""
        for u in (t, t._base):
            if u is not None:
                r = self._grads.get(id(u))
                if r is not None and r() is u:
                    return True
        return False

    def _is_weight_gradient(self, name, operands, module) -> bool:
        """A backward product whose result has the shape of one of the module's own parameters (or its
        transpose): the weight gradient (the input gradient has the input's shape)."""
        if len(operands) != 2:
            return False
        a, b = operands[0][1], operands[1][1]
        if a.dim() != 2 or b.dim() != 2:
            return False
        shape = (a.shape[0], b.shape[1])
        mod = self.named_modules.get(module)
        if mod is None:
            return False
        for p in mod.parameters(recurse=False):
            if p.dim() == 2 and (tuple(p.shape) == shape or tuple(p.shape) == shape[::-1]):
                return True
        return False

    def _blocks(self, t: torch.Tensor, axis: int) -> dict:
        base = t._base if t._base is not None else t
        key = (id(base), _version(base), tuple(t.shape), tuple(t.stride()), t.storage_offset(), axis)
        hit = self.block_cache.get(key)
        if hit is not None and hit[0]() is base:
            return hit[1]
        out = {fmt: block_statistics(t, fmt, axis) for fmt in self.block_formats}
        self.block_cache[key] = (weakref.ref(base), out)
        return out


def _arg(func, args, kwargs, i):
    a = func._schema.arguments[i]
    if i < len(args) and not a.kwarg_only:
        return args[i]
    return kwargs.get(a.name)


_plans: dict = {}


def _plan(func) -> tuple:
    """(op name, whether it is a view op (moves no values), indices of the arguments it writes)."""
    schema = func._schema
    written = tuple(i for i, a in enumerate(schema.arguments) if a.alias_info is not None and a.alias_info.is_write)
    view = any(r.alias_info is not None and not r.alias_info.is_write for r in schema.returns) and not written
    name = func.overloadpacket.__name__ if hasattr(func, "overloadpacket") else str(func)
    return name, view, written


# ------------------------------------------------------------------------------------------ block formats
#: The block formats a report can measure on GEMM operands: name → (quantiser, element format name).
BLOCK_FORMATS = ("MXFP8", "MXFP4", "NVFP4")


@exact_arithmetic
def block_statistics(t: torch.Tensor, fmt: str, axis: int) -> dict:
    """What block quantisation along ``axis`` does to the values of t (float32 copy): a dict with

    ``n`` (values), ``flushed`` (share of the non-zero values that become zero inside their block), ``clipped``
    (share of all values beyond their block scale's range, clamped to ±max), ``scale_spread`` (log2 of the
    largest over the smallest block scale, over blocks with a non-zero amax: how many binades the scales
    span), ``scale_log2_range`` ((min, max) of log2 block scale), ``rel_rms_error`` (√(Σ(Q(x) − x)² / Σx²), the
    error against FP32) and ``snr_db``.

    ``fmt``: "MXFP8" (E4M3 elements, blocks of 32 with E8M0 scales, OCP MX v1.0), "MXFP4" (FP4 E2M1, blocks of
    32) or "NVFP4" (FP4 E2M1, blocks of 16 with E4M3 scales and an FP32 tensor scale).
    """

    x = t.detach().to(torch.float32)
    if x.dim() == 0:
        x = x.reshape(1)
    axis = axis % x.dim()
    if fmt == "MXFP8":
        q = quantize_mx(x, "MXFP8_E4M3", 32, axis)
    elif fmt == "MXFP4":
        q = quantize_mx(x, "MXFP4", 32, axis)
    elif fmt == "NVFP4":
        q = quantize_nvfp4(x, axis=axis)
    else:
        raise ValueError(f"block format must be one of {BLOCK_FORMATS}, got {fmt!r}")
    err = quantization_error(x, q)
    scales = q.scales().movedim(axis, -1).reshape(-1)
    xb = x.movedim(axis, -1)
    n = xb.shape[-1]
    pad = -n % q.block_size
    if pad:
        xb = torch.nn.functional.pad(xb, (0, pad))
    bam = xb.reshape(-1, q.block_size).abs().amax(dim=1).to(torch.float64)
    s = scales[(bam > 0) & torch.isfinite(scales)]
    if s.numel():
        lo, hi = float(torch.log2(s.min())), float(torch.log2(s.max()))
    else:
        lo = hi = math.nan
    nz = int((x != 0).sum())
    flushed = err["underflow"] * err["n"] / nz if nz else 0.0
    sig = float((x.double() ** 2).sum())
    rel = math.sqrt(err["mse"] * err["n"] / sig) if sig > 0 and math.isfinite(err["mse"]) else math.nan
    return {
        "n": err["n"],
        "flushed": flushed,
        "clipped": err["saturated"],
        "scale_spread": hi - lo,
        "scale_log2_range": (lo, hi),
        "rel_rms_error": rel,
        "snr_db": err["snr_db"],
        "nonfinite": err["nonfinite_out"],
    }


# ---------------------------------------------------------------------------------------------- the state
class SavedState:
    """Everything the report could change, saved before and restored after: parameter values (also those written
    through ``.data``) and storage, buffers, ``.grad`` of parameters and of every other leaf tensor the step
    reaches (a batch that requires grad), training flags, grad mode, and the global random number generators
    (torch CPU and CUDA, Python's, NumPy's)."""

    def __init__(self, model: torch.nn.Module):
        self.model = model
        with torch.no_grad():
            self.params = [(p, p.detach().clone(), p.grad, p.data) for p in model.parameters()]
            self.buffers = [(b, b.detach().clone(), b.data) for b in model.buffers()]
        self.training = [(m, m.training) for m in model.modules()]
        self.grad_enabled = torch.is_grad_enabled()
        self.leaves: dict = {}  # id -> (tensor, its .grad before the report)
        self.torch_rng = torch.get_rng_state()
        self.cuda_rng = (
            torch.cuda.get_rng_state_all() if torch.cuda.is_available() and torch.cuda.is_initialized() else None
        )
        self.py_rng = random.getstate()
        self.np_rng = np.random.get_state()
        # whether the parameters and buffers hold their saved values: true now, false from the start of a step
        # (:meth:`begin_step`) until :meth:`restore_values` has put them back
        self.clean = True

    def begin_step(self) -> None:
        """Before each step of the report: the random state as it was (:meth:`reset_rng`), and the values no longer
        known to be the saved ones (the step may change them, also through ``.data``)."""
        self.clean = False
        self.reset_rng()

    def reset_rng(self) -> None:
        """The random state as it was (each step of the report draws the same dropout masks)."""
        torch.set_rng_state(self.torch_rng)
        if self.cuda_rng is not None:
            torch.cuda.set_rng_state_all(self.cuda_rng)
        random.setstate(self.py_rng)
        np.random.set_state(self.np_rng)

    def save_leaves(self, leaves) -> None:
        """Remember the ``.grad`` of leaf tensors that are no parameters (first sight only) and clear it."""
        for t in leaves:
            if id(t) not in self.leaves:
                self.leaves[id(t)] = (t, t.grad)
            t.grad = None

    def clear_grads(self) -> None:
        """Set ``.grad`` of every parameter, and of the leaves :meth:`save_leaves` saw, to None."""
        for p, _, _, _ in self.params:
            p.grad = None
        for t, _ in self.leaves.values():
            t.grad = None

    def restore_values(self) -> None:
        """Parameters and buffers back to their saved values and storage where anything changed them (also
        through ``.data``, which bypasses the version counter), without moving their version counters (a graph
        the caller built before the report still runs backward); training flags and grad mode as they were.  The
        values are compared (a pass over every parameter) only when a step ran since they were last restored
        (:meth:`begin_step`)."""
        if not self.clean:
            with torch.no_grad():
                for t, saved, _, data in (*self.params, *((b, s, None, d) for b, s, d in self.buffers)):
                    if t.data_ptr() != data.data_ptr() or t.shape != data.shape or t.dtype != data.dtype:
                        t.data = data
                    if not torch.equal(t.data, saved):
                        t.data.copy_(saved)
            self.clean = True
        for m, mode in self.training:
            m.training = mode
        torch.set_grad_enabled(self.grad_enabled)

    def restore(self) -> None:
        """Everything as it was: values (:meth:`restore_values`), every ``.grad`` and the random generators."""
        self.restore_values()
        for p, _, grad, _ in self.params:
            p.grad = grad
        for t, grad in self.leaves.values():
            t.grad = grad
        self.reset_rng()


def progress_wanted(progress) -> bool:
    """``progress`` when it is a bool; for None, whether the environment variable ``MPT_LAB_PROGRESS`` allows bars
    (anything but "0", "false", "no", "off").  Raises TypeError for anything else."""
    if progress is not None:
        if not isinstance(progress, bool):
            raise TypeError(f"progress must be a bool or None, got {type(progress).__name__}")
        return progress
    return os.environ.get("MPT_LAB_PROGRESS", "1").strip().lower() not in ("0", "false", "no", "off")


class ProgressBar:
    """A tqdm.auto bar over the module calls of every step of the report (or nothing)."""

    def __init__(self, on: bool, desc: str):
        self.bar = None
        if on:
            self.bar = tqdm(total=None, desc=desc, unit="module", mininterval=0.5, leave=False)
        self.desc = desc

    def step(self, text: str) -> None:
        """Name the step the bar counts now (after the bar's own description)."""
        if self.bar is not None:
            self.bar.set_description_str(f"{self.desc}: {text}")

    def set_total(self, n: int) -> None:
        """The number of module calls the bar expects in all."""
        if self.bar is not None:
            self.bar.total = n
            self.bar.refresh()

    def __call__(self, name) -> None:
        """One more module call done (a :class:`StepRecorder` progress callback)."""
        if self.bar is not None:
            self.bar.update(1)

    def close(self) -> None:
        """Close the bar."""
        if self.bar is not None:
            self.bar.close()


def check_loss(loss, where: str) -> torch.Tensor:
    """``loss`` if it is a scalar floating tensor that requires grad; TypeError / ValueError saying what it is
    instead (``where`` names the step in the message)."""
    if not isinstance(loss, torch.Tensor):
        hint = " (for a Hugging Face model: loss_fn = lambda m, b: m(**b).loss)" if isinstance(loss, Mapping) else ""
        raise TypeError(f"loss_fn must return the loss as a scalar torch.Tensor, got {type(loss).__name__}{hint}")
    if loss.numel() != 1:
        raise ValueError(
            f"loss_fn must return a scalar loss (one element), got a tensor of shape "
            f"{tuple(loss.shape)}; reduce it (e.g. .mean()) inside loss_fn"
        )
    if not loss.is_floating_point():
        raise TypeError(f"loss_fn must return a floating-point loss, got dtype {loss.dtype}")
    if not loss.requires_grad:
        raise ValueError(
            f"the loss of {where} does not require grad: no trainable parameter of the model "
            "contributed to it (were all parameters frozen, or was it computed under no_grad?)"
        )
    return loss
