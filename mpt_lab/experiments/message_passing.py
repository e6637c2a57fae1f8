"""The DGL User Guide's half-precision message passing, one for one, in PyTorch Geometric and plain PyTorch.

The DGL User Guide (chapter 8, "Mixed Precision Training") builds ``dgl.rand_graph(30, 100)`` with float16 node features ``h``
[30, 16] and float16 edge weights ``w`` [100, 1] (both uniform in [0, 1)) and runs four examples, each of which
returns float16:

1. built-in ``update_all(fn.u_mul_e('h', 'w', 'm'), fn.sum('m', 'x'))``: x_i = Σ_{j→i} h_j · w_ji;
2. built-in ``apply_edges(fn.u_dot_v('h', 'x', 'hx'))``: hx_ji = h_j · x_i (one value per edge);
3. the same as 1 with user-defined message and reduce functions (a *mailbox* of each node's incoming
   messages, summed with ``torch.sum(mailbox, 1)``), giving ``y``;
4. the same as 2 with a user-defined edge function, ``hy_ji = h_j · y_i``.

DGL does not run with this book's PyTorch (see ``book/results/dgl_check_cpu.json``, written by
``benchmarks/dgl_check.py``), so each example is computed twice, with the guide's DGL code kept beside ours in
:data:`DGL_CODE` (quoted from the guide):

* **PyG** (PyTorch Geometric): built-in = the library's ``MessagePassing(aggr="sum")`` propagation and its
  ``edge_updater``; user-defined = a ``MessagePassing`` subclass whose ``aggregate`` builds DGL's mailbox and
  reduces it with the guide's ``torch.sum(mailbox, 1)``, and whose ``edge_update`` is the guide's ``dot``;
* **PyTorch**: built-in = ``Tensor.index_add_`` (a scatter-sum) and a gathered row-wise dot product;
  user-defined = the guide's message/reduce/dot functions applied to a padded mailbox by hand.

Every result must stay float16.  Its error is measured against an FP32 reference computed from the *same*
float16 inputs upcast to float32 (so the error is that of float16 arithmetic, not of rounding the inputs), in
three ways: the largest absolute error, the normwise relative error ‖a − r‖₂ / ‖r‖₂, and the largest error in
units in the last place of FP16 at the reference value (``mpt_lab.formats.ulp(r, "FP16")``; IEEE 754 binary16
has a 10-bit trailing significand, so 1 ulp is 2⁻¹⁰ relative to the leading power of two).

    python -m mpt_lab.experiments.message_passing --profile full --out book/results/message_passing_full.json
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass

import torch

from .. import formats
from ..data.graphs import rand_graph
from ..device import DeviceLike
from ..harness.runner import Experiment, ExperimentConfig, ExperimentResult, Run, run_main

__all__ = [
    "Config",
    "MessagePassingResult",
    "PROFILES",
    "config_for",
    "run",
    "main",
    "DGL_CODE",
    "EXAMPLES",
    "IMPLEMENTATIONS",
    "make_inputs",
    "mailbox",
    "errors",
    "code_side_by_side",
    "NAME",
]

NAME = "message_passing"

#: The guide's four examples (key → what it computes).
EXAMPLES = {
    "builtin u_mul_e+sum": "x_i = Σ_{j→i} h_j · w_ji (node result [N, 16])",
    "builtin u_dot_v": "hx_ji = h_j · x_i (edge result [E, 1])",
    "UDF message+reduce": "y_i = torch.sum(mailbox_i, 1), mailbox_i = [h_j · w_ji for j→i] (node result [N, 16])",
    "UDF dot": "hy_ji = h_j · y_i (edge result [E, 1])",
}

#: The DGL User Guide's code for each example, quoted verbatim (DGL User Guide, chapter 8).  Shown, not run.
DGL_CODE = {
    "setup": (
        "g = dgl.rand_graph(30, 100).to(dev)  # Create a graph on GPU w/ 30 nodes and 100 edges.\n"
        "g.ndata['h'] = torch.rand(30, 16).to(dev).half()  # Create fp16 node features.\n"
        "g.edata['w'] = torch.rand(100, 1).to(dev).half()  # Create fp16 edge features."
    ),
    "builtin u_mul_e+sum": "g.update_all(fn.u_mul_e('h', 'w', 'm'), fn.sum('m', 'x'))\ng.ndata['x'].dtype",
    "builtin u_dot_v": "g.apply_edges(fn.u_dot_v('h', 'x', 'hx'))\ng.edata['hx'].dtype",
    "UDF message+reduce": (
        "def message(edges):\n    return {'m': edges.src['h'] * edges.data['w']}\n\n"
        "def reduce(nodes):\n    return {'y': torch.sum(nodes.mailbox['m'], 1)}\n\n"
        "g.update_all(message, reduce)\ng.ndata['y'].dtype"
    ),
    "UDF dot": (
        "def dot(edges):\n    return {'hy': (edges.src['h'] * edges.dst['y']).sum(-1, keepdims=True)}\n\n"
        "g.apply_edges(dot)\ng.edata['hy'].dtype"
    ),
}


# ------------------------------------------------------------------------------------------------ inputs
def make_inputs(
    num_nodes: int = 30,
    num_edges: int = 100,
    num_features: int = 16,
    *,
    dtype: torch.dtype = torch.float16,
    seed: int = 0,
    device: DeviceLike = "cpu",
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The guide's inputs: ``edge_index`` int64 [2, E] (:func:`mpt_lab.data.graphs.rand_graph`), node features
    ``h`` [N, F] and edge weights ``w`` [E, 1] drawn uniformly in [0, 1) in float32 and cast to ``dtype``.

    Raises TypeError when ``dtype`` is not a floating torch dtype; sizes as :func:`rand_graph`.
    """
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"dtype must be a floating torch.dtype, got {dtype!r}")
    edge_index = rand_graph(num_nodes, num_edges, seed=seed, device=device)
    g = torch.Generator().manual_seed(seed + 1)
    h = torch.rand(num_nodes, num_features, generator=g).to(device, dtype)
    w = torch.rand(num_edges, 1, generator=g).to(device, dtype)
    return edge_index, h, w


def mailbox(messages: torch.Tensor, dst: torch.Tensor, num_nodes: int) -> torch.Tensor:
    """DGL's mailbox: the messages entering each node, padded with zeros to the largest in-degree.

    ``messages`` [E, ...] (any dtype), ``dst`` int64 [E] → tensor [num_nodes, max_in_degree, ...] of
    ``messages``' dtype; row i holds the messages of the edges with ``dst == i`` in edge order, then zeros
    (zeros do not change a sum).  DGL groups nodes by in-degree instead of padding; the sums are the same.

    Raises ValueError when ``messages`` and ``dst`` disagree in length.
    """
    if messages.shape[0] != dst.shape[0]:
        raise ValueError(f"messages has {messages.shape[0]} rows but dst has {dst.shape[0]} entries")
    order = torch.argsort(dst, stable=True)
    d = dst[order]
    deg = torch.bincount(dst, minlength=num_nodes)
    start = torch.cumsum(deg, 0) - deg
    slot = torch.arange(d.numel(), device=dst.device) - start[d]
    box = messages.new_zeros((num_nodes, int(deg.max()) if deg.numel() else 0) + tuple(messages.shape[1:]))
    box[d, slot] = messages[order]
    return box


# ------------------------------------------------------------------------------------------------ PyG
def _pyg():
    from torch_geometric.nn import MessagePassing

    from ..models.gat import torch_geometric  # noqa: F401  (imports PyG with its own deprecation warning silenced)

    class UMulESum(MessagePassing):
        """Built-in: PyG's sum aggregation; the message is u_mul_e."""

        def __init__(self):
            super().__init__(aggr="sum")

        def forward(self, h, w, edge_index):
            return self.propagate(edge_index, h=h, w=w)

        def message(self, h_j, w):
            return h_j * w

    class UDotV(MessagePassing):
        """Built-in edge computation: PyG's ``edge_updater`` lifts h to sources and x to targets."""

        def forward(self, h, x, edge_index):
            return self.edge_updater(edge_index, h=h, x=x)

        def edge_update(self, h_j, x_i):
            return (h_j * x_i).sum(-1, keepdim=True)

    class MailboxSum(MessagePassing):
        """User-defined: the guide's message and reduce, the reduce seeing DGL's mailbox."""

        def forward(self, h, w, edge_index):
            return self.propagate(edge_index, h=h, w=w)

        def message(self, h_j, w):  # the guide's message(edges)
            return h_j * w

        def aggregate(self, inputs, index, dim_size=None):  # the guide's reduce(nodes)
            return torch.sum(mailbox(inputs, index, dim_size), 1)

    class Dot(MessagePassing):
        """User-defined edge function: the guide's dot(edges)."""

        def forward(self, h, y, edge_index):
            return self.edge_updater(edge_index, h=h, y=y)

        def edge_update(self, h_j, y_i):
            return (h_j * y_i).sum(-1, keepdims=True)

    return UMulESum, UDotV, MailboxSum, Dot


def pyg_examples(edge_index: torch.Tensor, h: torch.Tensor, w: torch.Tensor) -> dict:
    """The four examples with PyTorch Geometric: example name → result tensor (dtype of ``h``)."""
    UMulESum, UDotV, MailboxSum, Dot = _pyg()
    x = UMulESum()(h, w, edge_index)
    hx = UDotV()(h, x, edge_index)
    y = MailboxSum()(h, w, edge_index)
    hy = Dot()(h, y, edge_index)
    return {"builtin u_mul_e+sum": x, "builtin u_dot_v": hx, "UDF message+reduce": y, "UDF dot": hy}


# ------------------------------------------------------------------------------------------------ PyTorch
def torch_examples(edge_index: torch.Tensor, h: torch.Tensor, w: torch.Tensor) -> dict:
    """The four examples in plain PyTorch: example name → result tensor (dtype of ``h``)."""
    src, dst = edge_index
    n = h.shape[0]
    # built-in: a scatter-sum and a gathered dot product
    x = torch.zeros_like(h).index_add_(0, dst, h[src] * w)
    hx = (h[src] * x[dst]).sum(-1, keepdim=True)
    # user-defined: the guide's functions on edges and on a mailbox
    m = h[src] * w  # message(edges): edges.src['h'] * edges.data['w']
    y = torch.sum(mailbox(m, dst, n), 1)  # reduce(nodes): torch.sum(nodes.mailbox['m'], 1)
    hy = (h[src] * y[dst]).sum(-1, keepdims=True)  # dot(edges)
    return {"builtin u_mul_e+sum": x, "builtin u_dot_v": hx, "UDF message+reduce": y, "UDF dot": hy}


#: library → function computing the four examples.
IMPLEMENTATIONS = {"PyG": pyg_examples, "PyTorch": torch_examples}


def code_side_by_side(example: str) -> dict:
    """The guide's DGL code and the code that computes ``example`` here, as strings: {"DGL": ..., "PyG": ...,
    "PyTorch": ...}.  Ours is read from this module's source (``inspect``), so it is the code that runs.

    Raises ValueError for an unknown ``example`` (see :data:`EXAMPLES`).
    """
    if example not in EXAMPLES:
        raise ValueError(f"example must be one of {list(EXAMPLES)}, got {example!r}")
    UMulESum, UDotV, MailboxSum, Dot = _pyg()
    cls = {"builtin u_mul_e+sum": UMulESum, "builtin u_dot_v": UDotV, "UDF message+reduce": MailboxSum, "UDF dot": Dot}[
        example
    ]
    src = inspect.getsource(_pyg)
    name = cls.__name__
    start = src.index(f"    class {name}(")
    end = src.find("\n    class ", start + 1)
    end = src.index("\n    return ", start) if end < 0 else end
    pyg = inspect.cleandoc("\n" + src[start:end])
    lines = inspect.getsource(torch_examples).splitlines()
    key = {
        "builtin u_mul_e+sum": "x = ",
        "builtin u_dot_v": "hx = ",
        "UDF message+reduce": ("m = ", "y = "),
        "UDF dot": "hy = ",
    }[example]
    keys = key if isinstance(key, tuple) else (key,)
    torch_code = "\n".join(line.strip() for line in lines if line.strip().startswith(keys))
    return {"DGL": DGL_CODE[example], "PyG": pyg, "PyTorch": torch_code}


# ------------------------------------------------------------------------------------------------ errors
def errors(result: torch.Tensor, reference: torch.Tensor) -> dict:
    """Error of a low-precision ``result`` against a higher-precision ``reference`` of the same shape.

    Returns {"max_abs": float, "rel_norm": ‖a − r‖₂/‖r‖₂, "max_ulp": max |a − r| / ulp_FP16(r),
    "max_rel": max |a − r| / |r| over r ≠ 0}, computed in float64.

    Raises ValueError when the shapes differ.
    """
    if result.shape != reference.shape:
        raise ValueError(f"result shape {tuple(result.shape)} differs from reference shape {tuple(reference.shape)}")
    a, r = result.detach().double().cpu(), reference.detach().double().cpu()
    d = (a - r).abs()
    nz = r != 0
    u = formats.ulp(r, "FP16")
    return {
        "max_abs": float(d.max()) if d.numel() else 0.0,
        "rel_norm": float(d.norm() / r.norm()) if float(r.norm()) else 0.0,
        "max_ulp": float((d / u).max()) if d.numel() else 0.0,
        "max_rel": float((d[nz] / r[nz].abs()).max()) if bool(nz.any()) else 0.0,
    }


# ------------------------------------------------------------------------------------------------ run
@dataclass
class Config(ExperimentConfig):
    """The guide's sizes are the defaults (the same at every profile: it takes milliseconds)."""

    num_nodes: int = 30
    num_edges: int = 100
    num_features: int = 16
    dtype: str = "float16"

    def validate(self) -> None:
        super().validate()
        self.check_positive("num_nodes", "num_edges", "num_features")
        self.check_choices("dtype", ("float16", "bfloat16"))


PROFILES = {"quick": {"threads": 1}, "cpu": {"threads": 1}, "full": {}}

#: ``--smoke``: the full profile as it is (it takes milliseconds).
SMOKE: dict = {}


@dataclass
class MessagePassingResult(ExperimentResult):
    """``reference``: how the reference was computed; ``rows``: one per (library, example): {library, example,
    dtype, shape, max_abs, rel_norm, max_ulp, max_rel, agrees_with_other_library (max |PyG − PyTorch| in the
    low precision)}."""

    reference: str
    rows: list

    def all_low_precision(self) -> bool:
        """True when every result kept the input dtype (``config["dtype"]``)."""
        return all(r["dtype"] == self.config["dtype"] for r in self.rows)

    def describe(self) -> str:
        worst = max(self.rows, key=lambda r: r["max_ulp"])
        return (
            f"DGL User Guide message passing in {self.config['dtype']} ({self.config['num_nodes']} nodes, "
            f"{self.config['num_edges']} edges, {self.device}): every result {self.config['dtype']}: "
            f"{self.all_low_precision()}; largest error {worst['max_ulp']:.2f} FP16 ulps "
            f"({worst['library']}, {worst['example']})"
        )


def measure(config: Config, run: Run) -> dict:
    """Run the four examples in float16 (or ``config.dtype``) with PyG and PyTorch and measure their errors
    against FP32 references."""
    dtype = getattr(torch, config.dtype)
    ei, h, w = make_inputs(
        config.num_nodes, config.num_edges, config.num_features, dtype=dtype, seed=config.seed, device=run.device
    )
    # the FP32 reference: the same (already rounded) inputs, computed in float32 with plain PyTorch
    ref = torch_examples(ei, h.float(), w.float())
    rows, outs = [], {}
    for lib, fn in IMPLEMENTATIONS.items():
        outs[lib] = fn(ei, h, w)
        for ex, out in outs[lib].items():
            rows.append(
                {
                    "library": lib,
                    "example": ex,
                    "dtype": str(out.dtype).replace("torch.", ""),
                    "shape": list(out.shape),
                    **errors(out, ref[ex]),
                }
            )
    for r in rows:
        other = outs["PyTorch" if r["library"] == "PyG" else "PyG"][r["example"]]
        r["agrees_with_other_library"] = float((outs[r["library"]][r["example"]].double() - other.double()).abs().max())
    note = (
        "plain PyTorch in float32 on the same inputs (the float16 values upcast exactly to float32); "
        "errors measured in float64"
    )
    return {"reference": note, "rows": rows}


EXPERIMENT = Experiment(NAME, Config, PROFILES, measure, MessagePassingResult, __doc__, smoke=SMOKE)
run, config_for, main = EXPERIMENT.run, EXPERIMENT.config_for, EXPERIMENT.main

if __name__ == "__main__":
    run_main(EXPERIMENT)
