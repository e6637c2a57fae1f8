"""Seed 001's half-precision message passing, one for one, in PyTorch Geometric and plain PyTorch.

Seed 001 (DGL User Guide, chapter 8) builds ``dgl.rand_graph(30, 100)`` with float16 node features ``h``
[30, 16] and float16 edge weights ``w`` [100, 1] (both uniform in [0, 1)) and runs four examples, each of which
returns float16:

1. built-in ``update_all(fn.u_mul_e('h', 'w', 'm'), fn.sum('m', 'x'))``: x_i = Σ_{j→i} h_j · w_ji;
2. built-in ``apply_edges(fn.u_dot_v('h', 'x', 'hx'))``: hx_ji = h_j · x_i (one value per edge);
3. the same as 1 with user-defined message and reduce functions (a *mailbox* of each node's incoming
   messages, summed with ``torch.sum(mailbox, 1)``), giving ``y``;
4. the same as 2 with a user-defined edge function, ``hy_ji = h_j · y_i``.

DGL does not run with this book's PyTorch (see ``book/results/dgl_check_cpu.json``, written by
``benchmarks/dgl_check.py``), so each example is computed twice, with the seed's DGL code kept beside ours in
:data:`DGL_CODE` (quoted from seed 001):

* **PyG** (PyTorch Geometric): built-in = the library's ``MessagePassing(aggr="sum")`` propagation and its
  ``edge_updater``; user-defined = a ``MessagePassing`` subclass whose ``aggregate`` builds DGL's mailbox and
  reduces it with the seed's ``torch.sum(mailbox, 1)``, and whose ``edge_update`` is the seed's ``dot``;
* **PyTorch**: built-in = ``Tensor.index_add_`` (a scatter-sum) and a gathered row-wise dot product;
  user-defined = the seed's message/reduce/dot functions applied to a padded mailbox by hand.

Every result must stay float16.  Its error is measured against an FP32 reference computed from the *same*
float16 inputs upcast to float32 (so the error is that of float16 arithmetic, not of rounding the inputs), in
three ways: the largest absolute error, the normwise relative error ‖a − r‖₂ / ‖r‖₂, and the largest error in
units in the last place of FP16 at the reference value (``mpt_lab.formats.ulp(r, "FP16")``; IEEE 754 binary16
has a 10-bit trailing significand, so 1 ulp is 2⁻¹⁰ relative to the leading power of two).

    python -m mpt_lab.experiments.message_passing --profile full --out book/results/message_passing_full.json
"""

from __future__ import annotations

import inspect
import math
from dataclasses import asdict, dataclass

import torch

from .. import formats
from ..data.graphs import rand_graph
from ..device import provenance
from ._common import JsonResult, main as _main, prepare

__all__ = ["Config", "config_for", "run", "MessagePassingResult", "DGL_CODE", "EXAMPLES", "IMPLEMENTATIONS",
           "make_inputs", "mailbox", "errors", "code_side_by_side", "NAME"]

NAME = "message_passing"

#: The seed's four examples (key → what it computes).
EXAMPLES = {
    "builtin u_mul_e+sum": "x_i = Σ_{j→i} h_j · w_ji (node result [N, 16])",
    "builtin u_dot_v": "hx_ji = h_j · x_i (edge result [E, 1])",
    "UDF message+reduce": "y_i = torch.sum(mailbox_i, 1), mailbox_i = [h_j · w_ji for j→i] (node result [N, 16])",
    "UDF dot": "hy_ji = h_j · y_i (edge result [E, 1])",
}

#: Seed 001's DGL code for each example, quoted verbatim (DGL User Guide, chapter 8).  Shown, not run.
DGL_CODE = {
    "setup": ("g = dgl.rand_graph(30, 100).to(dev)  # Create a graph on GPU w/ 30 nodes and 100 edges.\n"
              "g.ndata['h'] = torch.rand(30, 16).to(dev).half()  # Create fp16 node features.\n"
              "g.edata['w'] = torch.rand(100, 1).to(dev).half()  # Create fp16 edge features."),
    "builtin u_mul_e+sum": "g.update_all(fn.u_mul_e('h', 'w', 'm'), fn.sum('m', 'x'))\ng.ndata['x'].dtype",
    "builtin u_dot_v": "g.apply_edges(fn.u_dot_v('h', 'x', 'hx'))\ng.edata['hx'].dtype",
    "UDF message+reduce": ("def message(edges):\n    return {'m': edges.src['h'] * edges.data['w']}\n\n"
                           "def reduce(nodes):\n    return {'y': torch.sum(nodes.mailbox['m'], 1)}\n\n"
                           "g.update_all(message, reduce)\ng.ndata['y'].dtype"),
    "UDF dot": ("def dot(edges):\n    return {'hy': (edges.src['h'] * edges.dst['y']).sum(-1, keepdims=True)}\n\n"
                "g.apply_edges(dot)\ng.edata['hy'].dtype"),
}


# ------------------------------------------------------------------------------------------------ inputs
def make_inputs(num_nodes: int = 30, num_edges: int = 100, num_features: int = 16, *, dtype=torch.float16,
                seed: int = 0, device="cpu"):
    """The seed's inputs: ``edge_index`` int64 [2, E] (:func:`mpt_lab.data.graphs.rand_graph`), node features
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
    from ..models.gat import torch_geometric  # noqa: F401  (imports PyG with its own deprecation warning silenced)
    from torch_geometric.nn import MessagePassing

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
        """User-defined: the seed's message and reduce, the reduce seeing DGL's mailbox."""

        def forward(self, h, w, edge_index):
            return self.propagate(edge_index, h=h, w=w)

        def message(self, h_j, w):                       # the seed's message(edges)
            return h_j * w

        def aggregate(self, inputs, index, dim_size=None):   # the seed's reduce(nodes)
            return torch.sum(mailbox(inputs, index, dim_size), 1)

    class Dot(MessagePassing):
        """User-defined edge function: the seed's dot(edges)."""

        def forward(self, h, y, edge_index):
            return self.edge_updater(edge_index, h=h, y=y)

        def edge_update(self, h_j, y_i):
            return (h_j * y_i).sum(-1, keepdims=True)

    return UMulESum, UDotV, MailboxSum, Dot


def pyg_examples(edge_index, h, w) -> dict:
    """The four examples with PyTorch Geometric: example name → result tensor (dtype of ``h``)."""
    UMulESum, UDotV, MailboxSum, Dot = _pyg()
    x = UMulESum()(h, w, edge_index)
    hx = UDotV()(h, x, edge_index)
    y = MailboxSum()(h, w, edge_index)
    hy = Dot()(h, y, edge_index)
    return {"builtin u_mul_e+sum": x, "builtin u_dot_v": hx, "UDF message+reduce": y, "UDF dot": hy}


# ------------------------------------------------------------------------------------------------ PyTorch
def torch_examples(edge_index, h, w) -> dict:
    """The four examples in plain PyTorch: example name → result tensor (dtype of ``h``)."""
    src, dst = edge_index
    n = h.shape[0]
    # built-in: a scatter-sum and a gathered dot product
    x = torch.zeros_like(h).index_add_(0, dst, h[src] * w)
    hx = (h[src] * x[dst]).sum(-1, keepdim=True)
    # user-defined: the seed's functions on edges and on a mailbox
    m = h[src] * w                                        # message(edges): edges.src['h'] * edges.data['w']
    y = torch.sum(mailbox(m, dst, n), 1)                  # reduce(nodes): torch.sum(nodes.mailbox['m'], 1)
    hy = (h[src] * y[dst]).sum(-1, keepdims=True)         # dot(edges)
    return {"builtin u_mul_e+sum": x, "builtin u_dot_v": hx, "UDF message+reduce": y, "UDF dot": hy}


#: library → function computing the four examples.
IMPLEMENTATIONS = {"PyG": pyg_examples, "PyTorch": torch_examples}


def code_side_by_side(example: str) -> dict:
    """The seed's DGL code and the code that computes ``example`` here, as strings: {"DGL": ..., "PyG": ...,
    "PyTorch": ...}.  Ours is read from this module's source (``inspect``), so it is the code that runs.

    Raises ValueError for an unknown ``example`` (see :data:`EXAMPLES`).
    """
    if example not in EXAMPLES:
        raise ValueError(f"example must be one of {list(EXAMPLES)}, got {example!r}")
    UMulESum, UDotV, MailboxSum, Dot = _pyg()
    cls = {"builtin u_mul_e+sum": UMulESum, "builtin u_dot_v": UDotV, "UDF message+reduce": MailboxSum,
           "UDF dot": Dot}[example]
    src = inspect.getsource(_pyg)
    name = cls.__name__
    start = src.index(f"    class {name}(")
    end = src.find("\n    class ", start + 1)
    end = src.index("\n    return ", start) if end < 0 else end
    pyg = inspect.cleandoc("\n" + src[start:end])
    lines = inspect.getsource(torch_examples).splitlines()
    key = {"builtin u_mul_e+sum": "x = ", "builtin u_dot_v": "hx = ", "UDF message+reduce": ("m = ", "y = "),
           "UDF dot": "hy = "}[example]
    keys = key if isinstance(key, tuple) else (key,)
    torch_code = "\n".join(l.strip() for l in lines if l.strip().startswith(keys))
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
    return {"max_abs": float(d.max()) if d.numel() else 0.0,
            "rel_norm": float(d.norm() / r.norm()) if float(r.norm()) else 0.0,
            "max_ulp": float((d / u).max()) if d.numel() else 0.0,
            "max_rel": float((d[nz] / r[nz].abs()).max()) if bool(nz.any()) else 0.0}


# ------------------------------------------------------------------------------------------------ run
@dataclass
class Config:
    """Size and settings (seed 001's sizes are the defaults; the same at every profile: it takes milliseconds)."""

    profile: str = "cpu"
    num_nodes: int = 30
    num_edges: int = 100
    num_features: int = 16
    dtype: str = "float16"
    seed: int = 0
    device: str = "auto"
    threads: int = 0


def config_for(profile: str) -> Config:
    """Every profile runs the seed's size (30 nodes, 100 edges, 16 features); quick and cpu use one thread."""
    if profile in ("quick", "cpu"):
        return Config(profile=profile, threads=1)
    if profile == "full":
        return Config(profile="full")
    raise ValueError(f"profile must be one of 'quick', 'cpu', 'full', got {profile!r}")


def _check(config: Config) -> None:
    if not isinstance(config, Config):
        raise TypeError(f"config must be a Config, got {type(config).__name__}")
    for name in ("num_nodes", "num_edges", "num_features"):
        v = getattr(config, name)
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise ValueError(f"config.{name} must be a positive int, got {v!r}")
    if config.dtype not in ("float16", "bfloat16"):
        raise ValueError(f"config.dtype must be 'float16' or 'bfloat16', got {config.dtype!r}")


@dataclass
class MessagePassingResult(JsonResult):
    NAME = NAME

    config: dict
    provenance: dict
    reference: str          # how the reference was computed
    rows: list              # one per (library, example): {library, example, dtype, shape, max_abs, rel_norm,
                            # max_ulp, max_rel, agrees_with (max |PyG − PyTorch| in the low precision)}

    def all_low_precision(self) -> bool:
        """True when every result kept the input dtype (``config["dtype"]``)."""
        return all(r["dtype"] == self.config["dtype"] for r in self.rows)

    def describe(self) -> str:
        lines = [f"seed 001's message passing in {self.config['dtype']} ({self.config['num_nodes']} nodes, "
                 f"{self.config['num_edges']} edges, {self.provenance['device']})",
                 f"{'library':<9}{'example':<22}{'dtype':<10}{'max abs err':>12}{'rel err':>10}{'max ulps':>9}"]
        for r in self.rows:
            lines.append(f"{r['library']:<9}{r['example']:<22}{r['dtype']:<10}{r['max_abs']:>12.2e}"
                         f"{r['rel_norm']:>10.2e}{r['max_ulp']:>9.2f}")
        return "\n".join(lines)

    def table(self):
        """The rows as an HTML table (:func:`mpt_lab.widgets.table_html`)."""
        from ..widgets import table_html

        return table_html(["library", "example", "result dtype", "shape", "max |error|", "‖error‖ / ‖FP32‖",
                           "max error (FP16 ulps)"],
                          [[r["library"], r["example"], r["dtype"], "×".join(map(str, r["shape"])),
                            f"{r['max_abs']:.2e}", f"{r['rel_norm']:.2e}", f"{r['max_ulp']:.2f}"] for r in self.rows])


def run(config: Config | None = None, *, command: str | None = None, progress: bool = True) -> MessagePassingResult:
    """Run the four examples in float16 (or ``config.dtype``) with PyG and PyTorch and measure their errors
    against FP32 references.  ``progress`` is accepted for the common experiment interface (nothing is long).

    Raises TypeError when ``config`` is not a :class:`Config`, ValueError for a bad field (named).
    """
    if config is not None:
        _check(config)
    config, device = prepare(config, Config, config_for)
    dtype = getattr(torch, config.dtype)
    ei, h, w = make_inputs(config.num_nodes, config.num_edges, config.num_features, dtype=dtype,
                           seed=config.seed, device=device)
    # the FP32 reference: the same (already rounded) inputs, computed in float32 with plain PyTorch
    ref = torch_examples(ei, h.float(), w.float())
    rows, outs = [], {}
    for lib, fn in IMPLEMENTATIONS.items():
        outs[lib] = fn(ei, h, w)
        for ex, out in outs[lib].items():
            rows.append({"library": lib, "example": ex, "dtype": str(out.dtype).replace("torch.", ""),
                         "shape": list(out.shape), **errors(out, ref[ex])})
    for r in rows:
        other = outs["PyTorch" if r["library"] == "PyG" else "PyG"][r["example"]]
        r["agrees_with_other_library"] = float((outs[r["library"]][r["example"]].double() - other.double()).abs().max())
    cfg = asdict(config)
    prov = provenance(command=command or f"python -m mpt_lab.experiments.{NAME} --profile {config.profile}",
                      config=cfg, device=device)
    note = ("plain PyTorch in float32 on the same inputs (the float16 values upcast exactly to float32); "
            "errors measured in float64")
    return MessagePassingResult(cfg, prov, note, rows)


def main(argv=None) -> int:
    return _main(__doc__.splitlines()[0], run, config_for, argv)


if __name__ == "__main__":
    raise SystemExit(main())
