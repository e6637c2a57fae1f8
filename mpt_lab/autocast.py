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
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ._torch_internals import FakeTensorMode

__all__ = ["OPS", "RECIPE_OPS", "GRAPH_OPS", "AutocastProbe", "probe_autocast", "keep_in_float32", "autocast_step"]


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
    "leaky_relu": lambda t: F.leaky_relu(t["e"], 0.2),
    "add (x + x)": lambda t: t["x"] + t["x"],
    "mul + sum (a·Wh)": lambda t: (t["x"] * t["x"]).sum(-1),
    "exp": lambda t: torch.exp(t["x"]),
    "sum": lambda t: t["x"].sum(),
    "softmax": lambda t: torch.softmax(t["x"], -1),
    "log_softmax": lambda t: torch.log_softmax(t["x"], -1),
    "layer_norm": lambda t: F.layer_norm(t["x"], (16,)),
    "cross_entropy": lambda t: F.cross_entropy(t["x"], t["y"]),
    "mse_loss": lambda t: F.mse_loss(t["x"], t["x"] * 0.5),
    "linear → relu": lambda t: torch.relu(F.linear(t["x"], t["w"])),
    "linear → softmax": lambda t: torch.softmax(F.linear(t["x"], t["w"]), -1),
    "scatter max (PyG)": lambda t: _pyg_utils().scatter(t["e"], t["idx"], 0, dim_size=16, reduce="max"),
    "scatter sum (PyG)": lambda t: _pyg_utils().scatter(t["e"], t["idx"], 0, dim_size=16, reduce="sum"),
    "softmax over edges (PyG)": lambda t: _pyg_utils().softmax(t["e"], t["idx"], num_nodes=16),
}

#: The ops of the PyTorch AMP recipe's chapter: products, activations, reductions, losses.
RECIPE_OPS = ("linear", "matmul (@)", "conv2d", "addmm", "relu", "add (x + x)", "exp", "sum", "softmax",
              "log_softmax", "layer_norm", "cross_entropy", "mse_loss", "linear → relu", "linear → softmax")

#: The ops of a graph attention (GAT) layer.
GRAPH_OPS = ("linear", "mul + sum (a·Wh)", "leaky_relu", "exp", "softmax", "scatter max (PyG)", "scatter sum (PyG)",
             "softmax over edges (PyG)", "elu", "log_softmax")


@dataclass(frozen=True)
class AutocastProbe:
    """What :func:`probe_autocast` saw: per op the output dtype name (e.g. "float16") or "error: Name"."""

    device_type: str
    dtype: str            # the autocast dtype
    input_dtype: str      # the dtype of the floating inputs
    method: str           # "real tensors" or "fake CUDA tensors"
    ops: dict

    def __getitem__(self, op: str) -> str:
        return self.ops[op]


_SHAPES = {"x": (8, 16), "w": (16, 16), "b": (16,), "img": (1, 3, 8, 8), "k": (4, 3, 3, 3), "y": (8,),
           "e": (64, 2), "idx": (64,)}
_INTEGER = {"y": 16, "idx": 16}        # int64 inputs and their range


def _inputs(dtype: torch.dtype, device: str, fake: bool) -> dict:
    """The probe's inputs on ``device``; on fake tensors only shapes and dtypes (values are never computed)."""
    if fake:
        return {k: torch.zeros(s, dtype=torch.int64, device=device) if k in _INTEGER else
                torch.empty(s, dtype=dtype, device=device) for k, s in _SHAPES.items()}
    g = torch.Generator().manual_seed(0)
    return {k: torch.randint(0, _INTEGER[k], s, generator=g).to(device) if k in _INTEGER else
            torch.randn(s, generator=g).to(device, dtype) for k, s in _SHAPES.items()}


def probe_autocast(device_type: str = "cpu", dtype: torch.dtype = torch.float16, *,
                   input_dtype: torch.dtype = torch.float32, ops: dict | None=None) -> AutocastProbe:
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
    return AutocastProbe(device_type, str(dtype).replace("torch.", ""), str(input_dtype).replace("torch.", ""),
                         "fake CUDA tensors" if fake else "real tensors", out)


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

    return _Float32Handle([module.register_forward_pre_hook(enter),
                           module.register_forward_hook(leave, always_call=True)])


def _first_tensor(output):
    """The first tensor of a module's output (a tensor, or the first tensor of a tuple, list or dict)."""
    if isinstance(output, torch.Tensor):
        return output
    values = output.values() if isinstance(output, dict) else output if isinstance(output, (tuple, list)) else ()
    return next((v for v in values if isinstance(v, torch.Tensor)), None)


def autocast_step(model: torch.nn.Module, loss_fn: Callable, batch: tuple, *, device_type: str = "cpu",
                  dtype: torch.dtype | None = torch.float16, watch: Sequence[str]=(), rng_state: torch.Tensor | None = None) -> dict:
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
                seen[name] = {"dtype": str(v.dtype).replace("torch.", ""), "finite": bool(fin.all()),
                              "amax": float(v[fin].abs().max()) if bool(fin.any()) else float("nan")}
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
