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

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ._torch_internals import FakeTensorMode

__all__ = ["OPS", "RECIPE_OPS", "GRAPH_OPS", "AutocastProbe", "probe_autocast"]


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
