"""Which dtype each op runs in under ``torch.autocast``: probed from PyTorch's dispatcher, not typed in.

Autocast (the PyTorch AMP recipe; ``torch.amp``) casts the inputs of some ops to the lower-precision dtype
("lower precision ops": matrix products, convolutions), runs others in float32 ("float32 ops": on CUDA
softmax, exp, log, the losses, sums of many values) and runs the rest in the widest input type.  Its lists
differ between devices (CUDA and CPU have separate policies) and between PyTorch versions, so this module asks
the dispatcher instead of quoting documentation: :func:`probe_autocast` runs each op of :data:`OPS` under
``torch.autocast(device_type, dtype)`` and records the dtype of its output.

With float32 inputs an op that autocast leaves alone returns float32, the same as an op it runs in float32; to
tell them apart, probe with float16 inputs as well (``input_dtype``): an op that autocast runs in float32
returns float32 even from float16 inputs.  A CUDA policy is probed on a machine without a GPU with fake CUDA
tensors (``FakeTensorMode``): the autocast kernels, which decide the output dtype, run without a device.

:func:`autocast_lists` reads the lists themselves: every ATen op that has an autocast kernel for the device
(PyTorch's dispatcher knows them; the torch.amp documentation prints the same lists by hand), sorted into
autocast's groups by watching what its kernel does to placeholder inputs on fake tensors: cast them to the
lower-precision dtype ("lower_precision"), run the op in float32 ("float32"), cast mixed inputs to the widest
dtype among them ("promote"), or refuse to run ("banned").  An op on none of the lists is not touched by
autocast and runs in the dtype of its inputs.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import sys
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ._torch_internals import (
    FakeTensorMode,
    TorchDispatchMode,
    aten_to_copy,
    dispatch_has_kernel,
    dispatch_op_names,
    tree_flatten,
)

__all__ = [
    "OPS",
    "RECIPE_OPS",
    "GRAPH_OPS",
    "AutocastProbe",
    "probe_autocast",
    "keep_in_float32",
    "autocast_step",
    "POLICIES",
    "AutocastLists",
    "autocast_lists",
]


def _pyg_utils():
    from .models.gat import torch_geometric  # PyG, imported with its own deprecation warning silenced

    return torch_geometric.utils


#: op name → function of a dict of tensors: ``x`` [8, 16] activations, ``w`` [16, 16] weights, ``b`` [16],
#: ``img`` [1, 3, 8, 8], ``k`` [4, 3, 3, 3] conv weights, ``y`` [8] int64 class labels, ``e`` [64, 2] attention
#: logits of 64 edges (2 heads), ``idx`` [64] int64 target node of each edge (of 16 nodes).
OPS = {
    "linear": lambda t: F.linear(t["x"], t["w"]),
    "matmul (@)": lambda t: t["x"] @ t["w"],
    "conv2d": lambda t: F.conv2d(t["img"], t["k"]),
    "addmm": lambda t: torch.addmm(t["b"], t["x"], t["w"]),
    "relu": lambda t: torch.relu(t["x"]),
    "elu": lambda t: F.elu(t["x"]),
    "expm1": lambda t: torch.expm1(t["x"]),
    "leaky_relu": lambda t: F.leaky_relu(t["e"], 0.2),
    "add (x + x)": lambda t: t["x"] + t["x"],
    "mul + sum (a·Wh)": lambda t: (t["x"] * t["x"]).sum(-1),
    "exp": lambda t: torch.exp(t["x"]),
    "sum": lambda t: t["x"].sum(),
    "mean": lambda t: t["x"].mean(),
    "logsumexp": lambda t: torch.logsumexp(t["x"], -1),
    "var": lambda t: t["x"].var(-1),
    "batch_norm": lambda t: F.batch_norm(t["x"], None, None, training=True),
    "softmax": lambda t: torch.softmax(t["x"], -1),
    "log_softmax": lambda t: torch.log_softmax(t["x"], -1),
    "layer_norm": lambda t: F.layer_norm(t["x"], (16,)),
    "cross_entropy": lambda t: F.cross_entropy(t["x"], t["y"]),
    "mse_loss": lambda t: F.mse_loss(t["x"], t["x"] * 0.5),
    "linear → relu": lambda t: torch.relu(F.linear(t["x"], t["w"])),
    "linear → softmax": lambda t: torch.softmax(F.linear(t["x"], t["w"]), -1),
    "linear → elu": lambda t: F.elu(F.linear(t["x"], t["w"])),
    "scatter max (PyG)": lambda t: _pyg_utils().scatter(t["e"], t["idx"], 0, dim_size=16, reduce="max"),
    "scatter sum (PyG)": lambda t: _pyg_utils().scatter(t["e"], t["idx"], 0, dim_size=16, reduce="sum"),
    "softmax over edges (PyG)": lambda t: _pyg_utils().softmax(t["e"], t["idx"], num_nodes=16),
}

#: The ops of the PyTorch AMP recipe's chapter: products, activations, reductions, losses.
RECIPE_OPS = (
    "linear",
    "matmul (@)",
    "conv2d",
    "addmm",
    "relu",
    "add (x + x)",
    "exp",
    "sum",
    "softmax",
    "log_softmax",
    "layer_norm",
    "cross_entropy",
    "mse_loss",
    "linear → relu",
    "linear → softmax",
)

#: The ops of a graph attention (GAT) layer.
GRAPH_OPS = (
    "linear",
    "mul + sum (a·Wh)",
    "leaky_relu",
    "exp",
    "softmax",
    "scatter max (PyG)",
    "scatter sum (PyG)",
    "softmax over edges (PyG)",
    "elu",
    "log_softmax",
)


@dataclass(frozen=True)
class AutocastProbe:
    """What :func:`probe_autocast` saw: per op the output dtype name (e.g. "float16") or "error: Name"."""

    device_type: str
    dtype: str  # the autocast dtype
    input_dtype: str  # the dtype of the floating inputs
    method: str  # "real tensors" or "fake CUDA tensors"
    ops: dict

    def __getitem__(self, op: str) -> str:
        return self.ops[op]


_SHAPES = {
    "x": (8, 16),
    "w": (16, 16),
    "b": (16,),
    "img": (1, 3, 8, 8),
    "k": (4, 3, 3, 3),
    "y": (8,),
    "e": (64, 2),
    "idx": (64,),
}
_INTEGER = {"y": 16, "idx": 16}  # int64 inputs and their range


def _inputs(dtype: torch.dtype, device: str, fake: bool) -> dict:
    """The probe's inputs on ``device``; on fake tensors only shapes and dtypes (values are never computed)."""
    if fake:
        return {
            k: torch.zeros(s, dtype=torch.int64, device=device)
            if k in _INTEGER
            else torch.empty(s, dtype=dtype, device=device)
            for k, s in _SHAPES.items()
        }
    g = torch.Generator().manual_seed(0)
    return {
        k: torch.randint(0, _INTEGER[k], s, generator=g).to(device)
        if k in _INTEGER
        else torch.randn(s, generator=g).to(device, dtype)
        for k, s in _SHAPES.items()
    }


def probe_autocast(
    device_type: str = "cpu",
    dtype: torch.dtype = torch.float16,
    *,
    input_dtype: torch.dtype = torch.float32,
    ops: dict | None = None,
) -> AutocastProbe:
    """Run each op under ``torch.autocast(device_type, dtype)`` and record its output dtype.

    Parameters
    ----------
    device_type : "cpu" or "cuda" (without a GPU, CUDA is probed on fake tensors)
    dtype : the autocast dtype, torch.float16 or torch.bfloat16
    input_dtype : the dtype of the floating inputs, torch.float32 or the lower-precision dtype
    ops : names of :data:`OPS` to probe (default all of them; :data:`RECIPE_OPS`, :data:`GRAPH_OPS`)

    Returns
    -------
    AutocastProbe; an op that fails under autocast on this device is recorded as "error: ExceptionName".

    Raises
    ------
    ValueError
        ``device_type`` is not "cpu" or "cuda", or an op name is unknown.
    TypeError
        ``dtype`` or ``input_dtype`` is not one of the dtypes above.
    """
    if device_type not in ("cpu", "cuda"):
        raise ValueError(f"device_type must be 'cpu' or 'cuda', got {device_type!r}")
    if dtype not in (torch.float16, torch.bfloat16):
        raise TypeError(f"dtype must be torch.float16 or torch.bfloat16, got {dtype!r}")
    if input_dtype not in (torch.float32, dtype):
        raise TypeError(f"input_dtype must be torch.float32 or {dtype}, got {input_dtype!r}")
    names = tuple(OPS) if ops is None else tuple(ops)
    unknown = [n for n in names if n not in OPS]
    if unknown:
        raise ValueError(f"ops: unknown op names {unknown}; they are {tuple(OPS)}")
    out = {}

    def probe(t):
        for name in names:
            try:
                out[name] = str(OPS[name](t).dtype).replace("torch.", "")
            except Exception as err:  # an op autocast cannot run on this device: recorded, not hidden
                out[name] = f"error: {type(err).__name__}"

    fake = device_type == "cuda" and not torch.cuda.is_available()
    if fake:
        with FakeTensorMode():
            t = _inputs(input_dtype, "cuda", fake=True)
            prev, prev_dt = torch.is_autocast_enabled("cuda"), torch.get_autocast_dtype("cuda")
            torch.set_autocast_enabled("cuda", True)
            torch.set_autocast_dtype("cuda", dtype)
            try:
                probe(t)
            finally:
                torch.set_autocast_enabled("cuda", prev)
                torch.set_autocast_dtype("cuda", prev_dt)
    else:
        t = _inputs(input_dtype, device_type, fake=False)
        with torch.autocast(device_type, dtype=dtype):
            probe(t)
    return AutocastProbe(
        device_type,
        str(dtype).replace("torch.", ""),
        str(input_dtype).replace("torch.", ""),
        "fake CUDA tensors" if fake else "real tensors",
        out,
    )


# ------------------------------------------------------------------------- one module outside autocast
class _Float32Handle:
    """What :func:`keep_in_float32` returns: ``remove()`` takes its hooks off the module again."""

    def __init__(self, handles):
        self._handles = handles

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []


def keep_in_float32(module: torch.nn.Module) -> _Float32Handle:
    """Run ``module`` outside autocast: while its ``forward`` runs, autocast is disabled and its floating-point
    tensor arguments are cast to float32, so that it computes in float32 (its weights must be float32) and
    returns float32; its backward follows, as autocast's backward runs in the dtypes its forward chose.

    This is what "keep a module in FP32" means under ``torch.autocast``: a module whose weights are float32 is
    still cast to the autocast dtype per op (autocast casts the weight of a matrix product, not the module),
    so FP32 weights alone do not keep it in FP32.  Implemented with a forward pre-hook that enters
    ``torch.autocast(device_type, enabled=False)`` (device_type from the module's first parameter, else the
    first tensor argument) and a forward hook that leaves it, called even when ``forward`` raises.

    Returns a handle whose ``remove()`` takes both hooks off.  Raises TypeError for a non-module.
    """
    if not isinstance(module, torch.nn.Module):
        raise TypeError(f"module must be a torch.nn.Module, got {type(module).__name__}")
    stack = []

    def enter(mod, args):
        first = next(mod.parameters(), None)
        if first is None:
            first = next((a for a in args if isinstance(a, torch.Tensor)), None)
        device_type = first.device.type if first is not None else "cpu"
        region = torch.autocast(device_type, enabled=False)
        region.__enter__()
        stack.append(region)
        return tuple(a.float() if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in args)

    def leave(mod, args, output):
        if stack:
            stack.pop().__exit__(None, None, None)

    return _Float32Handle(
        [module.register_forward_pre_hook(enter), module.register_forward_hook(leave, always_call=True)]
    )


def _first_tensor(output):
    """The first tensor of a module's output (a tensor, or the first tensor of a tuple, list or dict)."""
    if isinstance(output, torch.Tensor):
        return output
    values = output.values() if isinstance(output, dict) else output if isinstance(output, (tuple, list)) else ()
    return next((v for v in values if isinstance(v, torch.Tensor)), None)


def autocast_step(
    model: torch.nn.Module,
    loss_fn: Callable,
    batch: tuple,
    *,
    device_type: str = "cpu",
    dtype: torch.dtype | None = torch.float16,
    watch: Sequence[str] = (),
    rng_state: torch.Tensor | None = None,
) -> dict:
    """One forward and backward pass of ``loss_fn(model, batch)`` under ``torch.autocast(device_type, dtype)``
    (``dtype=None``: without autocast, in the model's own dtypes), watching some modules' outputs.

    Parameters
    ----------
    model, loss_fn, batch : ``loss_fn(model, batch)`` returns a scalar loss tensor
    watch : names of submodules (``model.get_submodule``) whose output to report (the first tensor of it)
    rng_state : torch's CPU random state to set before the forward (e.g. to draw the same dropout masks as
        another step); the state is restored afterwards either way

    Returns
    -------
    dict with "loss" (float), "gradients_finite" (whether every parameter gradient is finite), "outputs":
    name → {"dtype" (e.g. "float16"), "amax" (largest |value| among the finite ones, float), "finite" (bool)}.
    The model's gradients are cleared (set to None) afterwards.

    Raises TypeError for a non-module, ValueError for an unknown ``device_type`` or a watched name the model
    does not have.
    """
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if device_type not in ("cpu", "cuda"):
        raise ValueError(f"device_type must be 'cpu' or 'cuda', got {device_type!r}")
    names = tuple(watch)
    modules = dict(model.named_modules())
    missing = [n for n in names if n not in modules]
    if missing:
        raise ValueError(f"watch: the model has no submodules {missing}")
    seen, hooks = {}, []
    for name in names:

        def record(mod, args, output, name=name):
            t = _first_tensor(output)
            if t is not None:
                v = t.detach()
                fin = torch.isfinite(v)
                seen[name] = {
                    "dtype": str(v.dtype).replace("torch.", ""),
                    "finite": bool(fin.all()),
                    "amax": float(v[fin].abs().max()) if bool(fin.any()) else float("nan"),
                }

        hooks.append(modules[name].register_forward_hook(record))
    saved = torch.get_rng_state()
    try:
        if rng_state is not None:
            torch.set_rng_state(rng_state)
        model.zero_grad(set_to_none=True)
        with torch.autocast(device_type, dtype=dtype or torch.bfloat16, enabled=dtype is not None):
            loss = loss_fn(model, batch)
        loss.backward()
        grads = [p.grad for p in model.parameters() if p.grad is not None]
        finite = all(bool(torch.isfinite(g).all()) for g in grads)
        return {"loss": float(loss.detach()), "gradients_finite": finite, "outputs": seen}
    finally:
        for h in hooks:
            h.remove()
        model.zero_grad(set_to_none=True)
        torch.set_rng_state(saved)


# ------------------------------------------------------------------------------------------------- the lists
#: Autocast's groups, as :func:`autocast_lists` names them: the ops it casts to the lower-precision dtype, the
#: ops it runs in float32, the ops it runs in the widest dtype of their inputs, and the ops it refuses.
POLICIES = ("lower_precision", "float32", "promote", "banned")

_KEYS = {"cpu": "AutocastCPU", "cuda": "AutocastCUDA"}


@dataclass(frozen=True)
class AutocastLists:
    """Autocast's op lists for one device and lower-precision dtype, read from PyTorch's dispatcher.

    ``lists``: dict policy (:data:`POLICIES`, and "undetermined" for a listed op whose group the probe could not
    tell) → tuple of ATen op names, sorted ("mm", "softmax", …; "name.overload" only where the overloads of one
    op fall into different groups).  ``lists[p]`` also reads as ``self[p]``.
    """

    device_type: str
    dtype: str
    lists: dict

    def __getitem__(self, policy: str) -> tuple:
        return self.lists[policy]

    def policy(self, op: str) -> str:
        """The group of ATen op ``op`` ("mm", "aten::softmax", "softmax.int"): a key of ``lists``, or
        "not listed" for an op autocast leaves alone (it runs in its inputs' dtype)."""
        if not isinstance(op, str):
            raise TypeError(f"op must be an ATen op name (str), got {type(op).__name__}")
        name = op.removeprefix("aten::")
        base = name.partition(".")[0]
        for policy, ops in self.lists.items():
            if name in ops or base in ops:
                return policy
        return "not listed"


@contextlib.contextmanager
def _quiet():
    """Silence what placeholder calls print: Python warnings, fake-tensor error logs and C++ warnings written
    straight to file descriptor 2 (deprecation notices of the ops called, not about the lists)."""
    log = logging.getLogger("torch._subclasses.fake_tensor")
    level = log.level
    log.setLevel(logging.CRITICAL)
    saved = None
    try:
        sys.stderr.flush()
        saved = os.dup(2)
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 2)
        os.close(devnull)
    except (OSError, ValueError, AttributeError):  # no real fd 2 (some embedded interpreters): warnings only
        saved = None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        if saved is not None:
            os.dup2(saved, 2)
            os.close(saved)
        log.setLevel(level)


def _placeholders(schema, dtypes: list, device: str) -> list | None:
    """Positional arguments for an op's required parameters: tensors [2, 2] of ``dtypes`` in turn (the last
    repeated), 1 for ints, 2.0 for scalars, …; None when a parameter's type has no placeholder."""
    it = iter(dtypes)

    def tensor():
        return torch.empty(2, 2, dtype=next(it, dtypes[-1]), device=device)

    args = []
    for a in schema.arguments:
        if a.kwarg_only:
            continue
        if a.has_default_value():
            break
        t = str(a.type)
        if t in ("Tensor", "Optional[Tensor]"):
            args.append(tensor())
        elif t in ("List[Tensor]", "List[Optional[Tensor]]"):
            args.append([tensor(), tensor()])
        elif t in ("int", "SymInt"):
            args.append(1)
        elif t == "float":
            args.append(1.0)
        elif t in ("number", "Scalar"):
            args.append(2.0)
        elif t == "bool":
            args.append(False)
        elif t in ("List[int]", "List[SymInt]"):
            args.append([1])
        elif t == "str":
            args.append("ij,jk->ik" if a.name == "equation" else "fro")
        elif t.startswith("Optional"):
            args.append(None)
        else:
            return None
    return args


def _watch(op, dtypes: list, device: str, autocast_dtype, enabled: bool) -> dict:
    """Call ``op`` on placeholders of ``dtypes`` (fake tensors) with autocast on or off, and record what runs
    below it: the floating dtypes its inner ops see and return, the casts (from, to), what it returns, and the
    error it raised, if any."""
    seen, casts = set(), set()

    class Watch(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if func is aten_to_copy and kwargs.get("dtype") is not None:
                casts.add((args[0].dtype, kwargs["dtype"]))
            out = func(*args, **kwargs)
            for a in tree_flatten((args, kwargs, out))[0]:
                if isinstance(a, torch.Tensor) and a.is_floating_point():
                    seen.add(a.dtype)
                elif isinstance(a, torch.dtype):
                    seen.add(a)
            return out

    returned, error = set(), None
    with FakeTensorMode(allow_non_fake_inputs=True):
        args = _placeholders(op._schema, dtypes, device)
        if args is None:
            return {"seen": seen, "returned": returned, "casts": casts, "error": "no placeholder arguments"}
        prev, prev_dtype = torch.is_autocast_enabled(device), torch.get_autocast_dtype(device)
        torch.set_autocast_enabled(device, enabled)
        torch.set_autocast_dtype(device, autocast_dtype)
        try:
            with Watch():
                out = op(*args)
            returned = {a.dtype for a in tree_flatten(out)[0] if isinstance(a, torch.Tensor) and a.is_floating_point()}
        except Exception as err:  # placeholders of the wrong shape: what ran before the error still counts
            error = f"{type(err).__name__}: {err}"
        finally:
            torch.set_autocast_enabled(device, prev)
            torch.set_autocast_dtype(device, prev_dtype)
    return {"seen": seen, "returned": returned, "casts": casts, "error": error}


def _classify(op, device: str, low) -> str:
    """The group of one op with an autocast kernel: what autocast does that the plain call does not."""

    def both(dtypes):
        return _watch(op, dtypes, device, low, True), _watch(op, dtypes, device, low, False)

    on, off = both([torch.float32])  # float32 inputs: autocast casts them down?
    if low in (on["seen"] | on["returned"]) - (off["seen"] | off["returned"]):
        return "lower_precision"
    on, off = both([low])  # low-precision inputs: autocast runs the op in float32?
    if torch.float32 in (on["seen"] | on["returned"]) - (off["seen"] | off["returned"]) or (
        on["returned"] == {torch.float32} and off["returned"] == {low}
    ):
        return "float32"
    banned = [e for e in (on["error"],) if e and "autocast" in e]
    if banned and not (off["error"] and "autocast" in off["error"]):
        return "banned"
    on, off = both([low, torch.float32])  # mixed inputs: autocast casts up to the widest?
    if (low, torch.float32) in on["casts"] - off["casts"]:
        return "promote"
    return "undetermined"


@functools.cache
def _lists(device_type: str, dtype) -> dict:
    key = _KEYS[device_type]
    groups: dict = {}
    with _quiet():
        for name in sorted(dispatch_op_names()):
            if not name.startswith("aten::") or not dispatch_has_kernel(name, key):
                continue
            base, _, overload = name.removeprefix("aten::").partition(".")
            op = getattr(getattr(torch.ops.aten, base), overload or "default")
            groups.setdefault(base, {})[name.removeprefix("aten::")] = _classify(op, device_type, dtype)
    out = {p: set() for p in (*POLICIES, "undetermined")}
    for base, overloads in groups.items():
        found = set(overloads.values())
        if len(found) == 1:
            out[found.pop()].add(base)
        else:  # overloads in different groups: name each one
            for name, policy in overloads.items():
                out[policy].add(name)
    return {p: tuple(sorted(ops)) for p, ops in out.items() if ops or p in POLICIES}


def autocast_lists(device_type: str = "cuda", dtype: torch.dtype = torch.float16) -> AutocastLists:
    """Autocast's op lists for ``device_type``, read from PyTorch's dispatcher (the installed version's).

    Every ATen op with an autocast kernel for the device is called once on placeholder fake tensors under
    autocast and once without it, inside a dispatch mode that watches the ops below: an op whose float32
    inputs reach it cast to ``dtype`` is on the "lower_precision" list; one whose ``dtype`` inputs are cast to
    float32 (or that then returns float32) on the "float32" list; one that casts mixed inputs to the widest on
    the "promote" list; one that refuses to run under autocast on the "banned" list.  Nothing is computed (fake
    tensors), and no GPU is needed for "cuda".  About a second per device; the result is cached.

    Parameters
    ----------
    device_type : "cuda" or "cpu"
    dtype : the autocast dtype, torch.float16 or torch.bfloat16

    Returns
    -------
    :class:`AutocastLists`

    Raises
    ------
    ValueError
        ``device_type`` is not "cpu" or "cuda".
    TypeError
        ``dtype`` is not torch.float16 or torch.bfloat16.

    Source: the op lists of the torch.amp documentation ("Autocast Op Reference"), which these reproduce for
    the installed PyTorch.
    """
    if device_type not in _KEYS:
        raise ValueError(f"device_type must be 'cpu' or 'cuda', got {device_type!r}")
    if dtype not in (torch.float16, torch.bfloat16):
        raise TypeError(f"dtype must be torch.float16 or torch.bfloat16, got {dtype!r}")
    return AutocastLists(device_type, str(dtype).replace("torch.", ""), _lists(device_type, dtype))
