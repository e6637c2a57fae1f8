"""The 3-layer graph attention network of the DGL User Guide (chapter 8), on PyTorch Geometric.

The guide trains ``dgl.nn.GATConv`` layers (Veličković et al., ICLR 2018): hidden size 256, ``heads`` per layer,
ELU as every layer's ``activation`` (the guide passes ``activation=F.elu`` to all three layers, the last one
included), hidden layers' heads concatenated (``h.flatten(1)``), the last layer's heads averaged
(``h.mean(1)``), on a graph that already has self loops (``AddSelfLoop``).  :class:`GAT` is the same network on
``torch_geometric.nn.GATConv`` (Fey & Lenssen 2019), with the mapping

=====================================  ============================================================
DGL (the guide)                        here
=====================================  ============================================================
``GATConv(in, out, heads, activation   ``GATConv(in, out, heads, add_self_loops=False)`` then ``F.elu``
=F.elu)``
``h.flatten(1)`` (hidden layers)       PyG returns heads concatenated, ``[N, heads·out]``
``h.mean(1)`` (last layer)             ``F.elu`` per head, then the mean over heads (as the guide)
``AddSelfLoop()`` transform            self loops already in ``edge_index`` (``add_self_loops=False``)
=====================================  ============================================================

Both libraries compute, per edge (j → i) and head, the logit ``LeakyReLU(a_srcᵀ W h_j + a_dstᵀ W h_i)`` (slope
0.2), a softmax over the edges entering i, and ``Σ_j α_ij W h_j``.  PyG materialises the per-edge messages
(a tensor ``[E, heads, out]``) where DGL uses fused sparse kernels, so PyG needs more memory on large graphs.

Importing this module imports ``torch_geometric`` with its own ``torch.jit.script`` deprecation warning
silenced (it comes from inside PyG, not from the book's code).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from ..formats import FP16

with warnings.catch_warnings():
    warnings.filterwarnings("ignore", category=DeprecationWarning, message=r".*torch\.jit\.script.*")
    warnings.filterwarnings("ignore", category=FutureWarning)
    import torch_geometric  # noqa: F401
    from torch_geometric.nn import GATConv

__all__ = ["GAT", "GATConv", "attention_overflow", "FP16_EXP_LIMIT"]


class GAT(nn.Module):
    """The DGL User Guide's 3-layer GAT (any number of layers ≥ 1) on ``torch_geometric.nn.GATConv``.

    Parameters
    ----------
    in_feats : int, n_hidden : int, n_classes : int
        Input features (Reddit: 602), hidden size per head (seed: 256), classes (Reddit: 41).
    heads : sequence of int, one per layer (seed: [1, 1, 1], then [2, 2, 2]).

    ``forward(x, edge_index)``: ``x`` float [N, in_feats], ``edge_index`` int64 [2, E] with self loops →
    logits [N, n_classes] (after ELU, as in the guide).  Under ``torch.autocast`` the linear projections run in
    the autocast dtype; which of the attention ops do too depends on the device's autocast policy.

    Raises
    ------
    TypeError
        Non-int sizes or heads.
    ValueError
        A size or a head count < 1, or ``heads`` empty.
    """

    def __init__(self, in_feats: int, n_hidden: int, n_classes: int, heads: Sequence[int] = (1, 1, 1)):
        super().__init__()
        for name, v in (("in_feats", in_feats), ("n_hidden", n_hidden), ("n_classes", n_classes)):
            if not isinstance(v, int) or isinstance(v, bool):
                raise TypeError(f"{name} must be an int, got {type(v).__name__}")
            if v < 1:
                raise ValueError(f"{name} must be ≥ 1, got {v}")
        if isinstance(heads, (str, bytes)) or not hasattr(heads, "__iter__"):
            raise TypeError(f"heads must be a sequence of ints, got {type(heads).__name__}")
        heads = list(heads)
        if not heads:
            raise ValueError("heads must name at least one layer")
        for h in heads:
            if not isinstance(h, int) or isinstance(h, bool):
                raise TypeError(f"heads must hold ints, got {h!r}")
            if h < 1:
                raise ValueError(f"heads must be ≥ 1, got {h}")
        self.heads = tuple(heads)
        self.n_classes = n_classes
        self.layers = nn.ModuleList()
        dims = [in_feats] + [n_hidden * h for h in heads[:-1]]
        for i, (d, h) in enumerate(zip(dims, heads)):
            last = i == len(heads) - 1
            out = n_classes if last else n_hidden
            # concat=True for every layer: the last layer's heads are averaged in forward *after* ELU, as the guide
            self.layers.append(GATConv(d, out, h, concat=True, add_self_loops=False))

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        h = x
        for i, layer in enumerate(self.layers):
            h = F.elu(layer(h, edge_index))  # [N, heads·out], heads concatenated
            if i == len(self.layers) - 1:
                h = h.view(h.shape[0], self.heads[-1], self.n_classes).mean(1)
        return h


#: The largest x whose exponential is finite in FP16: ln(65504) ≈ 11.09 (65504 = FP16's largest finite value).
FP16_EXP_LIMIT = math.log(FP16.max)


# ------------------------------------------------------------------------------------- attention in FP16
def attention_overflow(logits: Sequence[float] | torch.Tensor, device: torch.device | str = "cpu") -> dict:
    """Softmax over the edges entering one node, three ways, for the attention ``logits`` (a 1-D sequence):

    * ``naive_fp16``: ``exp(e) / Σ exp(e)`` in float16 — overflows to inf, then inf/inf = NaN, once a logit
      exceeds ln(65504) ≈ 11.09 (:data:`FP16_EXP_LIMIT`);
    * ``max_subtracted_fp16``: PyG's ``torch_geometric.utils.softmax`` in float16 (it subtracts the per-node
      maximum first, so every exponent is ≤ 0 and exp ≤ 1);
    * ``fp32``: the float32 reference.

    Returns dict of lists (float) plus "exp_fp16" (exp of each logit in float16) and "limit".

    Raises TypeError when ``logits`` is not a 1-D sequence of numbers.
    """
    try:
        e32 = torch.as_tensor(logits, dtype=torch.float32, device=device)
    except (TypeError, ValueError, RuntimeError) as err:
        raise TypeError(f"logits must be a 1-D sequence of numbers, got {type(logits).__name__}") from err
    if e32.dim() != 1 or e32.numel() == 0:
        raise TypeError(f"logits must be a non-empty 1-D sequence, got shape {tuple(e32.shape)}")
    e16 = e32.half()
    idx = torch.zeros(e16.numel(), dtype=torch.long, device=e32.device)
    naive = torch.exp(e16) / torch.exp(e16).sum()
    pyg = torch_geometric.utils.softmax(e16, idx, num_nodes=1)
    ref = torch.softmax(e32, 0)
    return {
        "logits": e32.tolist(),
        "exp_fp16": torch.exp(e16).float().tolist(),
        "naive_fp16": naive.float().tolist(),
        "max_subtracted_fp16": pyg.float().tolist(),
        "max_subtracted_dtype": str(pyg.dtype).replace("torch.", ""),
        "fp32": ref.tolist(),
        "limit": FP16_EXP_LIMIT,
    }
