"""Graphs for the graph chapter: a random graph like ``dgl.rand_graph`` and a synthetic graph with the shape of
Reddit, generated offline and deterministically from a seed.

* :func:`rand_graph`: ``num_edges`` edges drawn uniformly at random between ``num_nodes`` nodes, as
  ``dgl.rand_graph(num_nodes, num_edges)`` does (the DGL User Guide's message-passing examples use 30 nodes, 100 edges).
* :func:`synthetic_reddit`: a node-classification graph with Reddit's number of features and classes and
  its split fractions, any number of nodes and edges, and *learnable class structure* (class-dependent
  features and homophilous edges).  It is **synthetic**: the real Reddit data set (:data:`REDDIT`,
  Hamilton et al. 2017) cannot be downloaded here.

Edges follow PyTorch Geometric's convention: ``edge_index`` is an int64 tensor ``[2, E]`` of (source, target)
node ids, messages flow from ``edge_index[0]`` to ``edge_index[1]``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..device import DeviceLike

__all__ = ["REDDIT", "Graph", "rand_graph", "synthetic_reddit", "add_self_loops"]

#: The Reddit data set (Hamilton, Ying & Leskovec, "Inductive Representation Learning on Large Graphs",
#: NeurIPS 2017), as DGL's ``RedditDataset`` loads it: posts are nodes, an edge joins two posts commented on
#: by the same user; features are 602-dimensional (averaged GloVe word vectors and post statistics); labels are
#: 41 communities (subreddits).  Edge counts are directed edges as DGL stores them (each undirected edge twice);
#: the DGL User Guide quotes "114 million edges" for the graph with self loops (114,615,892 + 232,965 = 114,848,857).
#: Split sizes are those of DGL's train/val/test masks.  Cited, not computed.
REDDIT = {
    "source": "Hamilton et al. 2017 (GraphSAGE), Reddit data set as loaded by dgl.data.RedditDataset; DGL User Guide, chapter 8",
    "num_nodes": 232_965,
    "num_edges": 114_615_892,
    "num_edges_with_self_loops": 114_848_857,
    "num_features": 602,
    "num_classes": 41,
    "train": 153_431,
    "val": 23_831,
    "test": 55_703,
}


@dataclass
class Graph:
    """A node-classification graph (all tensors on one device).

    Attributes
    ----------
    edge_index : int64 tensor [2, E] (source, target)
    x : float32 tensor [N, F] node features
    y : int64 tensor [N] class labels in [0, num_classes)
    train_mask, val_mask, test_mask : bool tensors [N]
    num_classes : int
    """

    edge_index: torch.Tensor
    x: torch.Tensor
    y: torch.Tensor
    train_mask: torch.Tensor
    val_mask: torch.Tensor
    test_mask: torch.Tensor
    num_classes: int

    @property
    def num_nodes(self) -> int:
        """The number of nodes (rows of ``x``)."""
        return int(self.x.shape[0])

    @property
    def num_edges(self) -> int:
        """The number of directed edges (columns of ``edge_index``)."""
        return int(self.edge_index.shape[1])

    @property
    def num_features(self) -> int:
        """The number of input features per node (columns of ``x``)."""
        return int(self.x.shape[1])

    def nbytes(self) -> int:
        """Bytes held by the graph's tensors (edges, features, labels, masks)."""
        return sum(
            t.numel() * t.element_size()
            for t in (self.edge_index, self.x, self.y, self.train_mask, self.val_mask, self.test_mask)
        )

    def to(self, device: DeviceLike) -> Graph:
        """A copy of the graph with every tensor on ``device`` (a torch.device or str)."""
        return Graph(
            *(t.to(device) for t in (self.edge_index, self.x, self.y, self.train_mask, self.val_mask, self.test_mask)),
            self.num_classes,
        )

    def describe(self) -> str:
        """One line: nodes, edges, features, classes and the sizes of the train/val/test splits."""
        return (
            f"{self.num_nodes:,} nodes, {self.num_edges:,} edges, {self.num_features} features, "
            f"{self.num_classes} classes (train/val/test {int(self.train_mask.sum()):,}/"
            f"{int(self.val_mask.sum()):,}/{int(self.test_mask.sum()):,})"
        )


def _positive_int(v, name: str, minimum: int = 1) -> int:
    if not isinstance(v, int) or isinstance(v, bool):
        raise TypeError(f"{name} must be an int, got {type(v).__name__}")
    if v < minimum:
        raise ValueError(f"{name} must be ≥ {minimum}, got {v}")
    return v


def rand_graph(num_nodes: int, num_edges: int, *, seed: int = 0, device: DeviceLike = "cpu") -> torch.Tensor:
    """``edge_index`` of a random directed graph: ``num_edges`` (source, target) pairs drawn uniformly and
    independently from ``num_nodes`` nodes (duplicates and self loops possible), as ``dgl.rand_graph`` does.

    Returns an int64 tensor [2, num_edges] on ``device``, deterministic in ``seed``.

    Raises TypeError for non-int sizes, ValueError for ``num_nodes < 1`` or ``num_edges < 0``.
    """
    _positive_int(num_nodes, "num_nodes")
    _positive_int(num_edges, "num_edges", 0)
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, num_nodes, (2, num_edges), generator=g).to(device)


def add_self_loops(edge_index: torch.Tensor, num_nodes: int) -> torch.Tensor:
    """``edge_index`` with one self loop (i, i) appended for every node (what DGL's ``AddSelfLoop`` does in
    the DGL User Guide: existing self loops are removed first, then one per node is added).  int64 [2, E'] ."""
    if not isinstance(edge_index, torch.Tensor) or edge_index.dim() != 2 or edge_index.shape[0] != 2:
        raise ValueError("edge_index must be a tensor of shape [2, E]")
    _positive_int(num_nodes, "num_nodes")
    keep = edge_index[0] != edge_index[1]
    loops = torch.arange(num_nodes, device=edge_index.device).expand(2, num_nodes)
    return torch.cat([edge_index[:, keep], loops], dim=1)


def synthetic_reddit(
    num_nodes: int = REDDIT["num_nodes"],
    avg_degree: float = 50.0,
    *,
    num_features: int = REDDIT["num_features"],
    num_classes: int = REDDIT["num_classes"],
    homophily: float = 0.7,
    feature_signal: float = 2.0,
    self_loops: bool = True,
    seed: int = 0,
    device: DeviceLike = "cpu",
) -> Graph:
    """A synthetic graph with Reddit's shape and learnable class structure.  **Not the Reddit data.**

    Construction (all draws from ``torch.Generator`` seeded with ``seed``, on ``device``):

    - labels: ``num_classes`` communities with sizes ∝ a fixed Zipf-like profile (1/(k+1)^0.5, shuffled), so
      that classes are imbalanced as Reddit's subreddits are;
    - features: ``x = feature_signal · u[y] + ε`` with one random unit vector ``u[c]`` per class (norm 1 in
      R^F) and noise ε ~ N(0, I): two class centroids lie ``feature_signal · √2`` noise standard deviations
      apart, so with a small signal a single node's features are only weakly informative, and averaging over
      same-class neighbours (what a GNN layer does) sharpens them;
    - edges: ``round(num_nodes · avg_degree / 2)`` undirected edges stored in both directions; each picks a
      uniform source, and with probability ``homophily`` another node of the same class as target, else a
      uniform target (the rare self loops this draws are dropped when the self loops are added);
    - self loops (``self_loops=True``): one per node, as the DGL User Guide's ``AddSelfLoop`` transform;
    - masks: Reddit's train/val/test fractions (:data:`REDDIT`), by a random permutation.

    Parameters
    ----------
    num_nodes : int ≥ num_classes
    avg_degree : float > 0
        Directed edges per node before self loops (Reddit: 114,615,892 / 232,965 ≈ 492).
    num_features, num_classes : int (Reddit: 602, 41)
    homophily : float in [0, 1]; feature_signal : float ≥ 0
    self_loops : bool; seed : int; device : torch.device or str

    Returns
    -------
    :class:`Graph` with float32 features [N, F], int64 labels [N] and int64 ``edge_index`` [2, E]; memory
    ≈ 16·E + 4·N·F bytes.

    Raises
    ------
    TypeError
        Non-int ``num_nodes``/``num_features``/``num_classes``.
    ValueError
        ``num_nodes < num_classes``, ``avg_degree ≤ 0``, ``homophily`` outside [0, 1], ``feature_signal < 0``.
    """
    _positive_int(num_nodes, "num_nodes")
    _positive_int(num_features, "num_features")
    _positive_int(num_classes, "num_classes", 2)
    if num_nodes < num_classes:
        raise ValueError(f"num_nodes must be ≥ num_classes = {num_classes}, got {num_nodes}")
    if not isinstance(avg_degree, (int, float)) or not math.isfinite(avg_degree) or avg_degree <= 0:
        raise ValueError(f"avg_degree must be a positive finite number, got {avg_degree!r}")
    if not isinstance(homophily, (int, float)) or not 0.0 <= homophily <= 1.0:
        raise ValueError(f"homophily must be in [0, 1], got {homophily!r}")
    if not isinstance(feature_signal, (int, float)) or not math.isfinite(feature_signal) or feature_signal < 0:
        raise ValueError(f"feature_signal must be a finite number ≥ 0, got {feature_signal!r}")
    device = torch.device(device)
    gen = torch.Generator(device=device).manual_seed(seed)
    cpu_gen = torch.Generator().manual_seed(seed)
    N, C = num_nodes, num_classes

    # labels: imbalanced class sizes, every class non-empty
    weights = 1.0 / torch.arange(1, C + 1, dtype=torch.float64) ** 0.5
    weights = weights[torch.randperm(C, generator=cpu_gen)]
    sizes = torch.floor(weights / weights.sum() * (N - C)).long() + 1
    sizes[torch.argmax(sizes)] += N - int(sizes.sum())
    y_sorted = torch.repeat_interleave(torch.arange(C), sizes)
    perm = torch.randperm(N, generator=cpu_gen)
    y = torch.empty(N, dtype=torch.long)
    y[perm] = y_sorted  # node perm[j] has class y_sorted[j]
    members = perm.to(device)  # nodes grouped by class: members[start[c]:start[c] + sizes[c]]
    start = (torch.cumsum(sizes, 0) - sizes).to(device)
    sizes, y = sizes.to(device), y.to(device)

    # features: class centroid plus noise (generated in chunks of rows to bound temporaries)
    mu = torch.randn(C, num_features, generator=gen, device=device)
    mu = mu / mu.norm(dim=1, keepdim=True)
    x = torch.empty(N, num_features, device=device)
    chunk = max(1, 2**24 // num_features)
    for i in range(0, N, chunk):
        j = min(N, i + chunk)
        x[i:j] = feature_signal * mu[y[i:j]] + torch.randn(j - i, num_features, generator=gen, device=device)

    # edges: homophilous undirected edges, stored in both directions
    m = max(1, round(N * avg_degree / 2))
    src = torch.randint(0, N, (m,), generator=gen, device=device)
    same = torch.rand(m, generator=gen, device=device) < homophily
    c = y[src]
    offset = (torch.rand(m, generator=gen, device=device) * sizes[c]).long().clamp_max_(sizes[c] - 1)
    mate = members[start[c] + offset]
    mate = torch.where(mate == src, members[start[c] + (offset + 1) % sizes[c]], mate)  # a same-class *other* node
    dst = torch.where(same, mate, torch.randint(0, N, (m,), generator=gen, device=device))
    del mate
    del same, c, offset
    edge_index = torch.stack([torch.cat([src, dst]), torch.cat([dst, src])])
    del src, dst
    if self_loops:
        edge_index = add_self_loops(edge_index, N)

    # masks with Reddit's split fractions
    order = torch.randperm(N, generator=cpu_gen).to(device)
    total = REDDIT["train"] + REDDIT["val"] + REDDIT["test"]
    n_train = max(1, round(N * REDDIT["train"] / total))
    n_val = max(1, round(N * REDDIT["val"] / total))
    masks = []
    for lo, hi in ((0, n_train), (n_train, n_train + n_val), (n_train + n_val, N)):
        mk = torch.zeros(N, dtype=torch.bool, device=device)
        mk[order[lo:hi]] = True
        masks.append(mk)
    return Graph(edge_index, x, y, *masks, num_classes=C)
