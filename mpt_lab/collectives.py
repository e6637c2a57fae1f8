"""All-reduce in low precision: the order in which ranks' values are summed, and what rounding does to the sum.

When N data-parallel ranks all-reduce their gradients in BF16 or FP16, every element of the result is a sum of N
values rounded after each addition, in an order the collective's algorithm fixes.  This module computes those
sums exactly, with :func:`mpt_lab.formats.round_to`, in the order of a ring all-reduce (:func:`ring_allreduce`,
the algorithm of NCCL and gloo: Patarasuk & Yuan 2009, "Bandwidth optimal all-reduce algorithms") and of this
book's binary tree over all ranks (:func:`tree_allreduce`: a binary heap, not NCCL's tree, which is a double
binary tree across nodes with a chain of GPUs within each node: Jeaugey 2019, NCCL's ``src/graph/trees.cc`` and
``connect.cc``), so that the error of a low-precision reduction can be computed for clusters of any
size on a laptop (the distributed experiment checks it bit for bit against real all-reduces on 2 and 3
processes).  It also gives FSDP2's division of the gradient sum around the reduction (:func:`fsdp_divide_factors`)
and the relative error of a result (:func:`relative_error`).
"""

from __future__ import annotations

import math

import numpy as np
import torch
from numpy.typing import ArrayLike

from . import formats as F
from .formats import FormatLike

__all__ = [
    "COMM_FORMATS",
    "ring_order",
    "tree_children",
    "ring_allreduce",
    "tree_allreduce",
    "fsdp_divide_factors",
    "relative_error",
]

#: The formats gradients are summed in, by their torch dtypes.
COMM_FORMATS = {"FP32": torch.float32, "BF16": torch.bfloat16, "FP16": torch.float16}


# ==================================================================================== summation orders (arithmetic)
def _check_ranks(n_ranks) -> int:
    if not isinstance(n_ranks, int) or isinstance(n_ranks, bool) or n_ranks < 1:
        raise ValueError(f"n_ranks must be an int ≥ 1, got {n_ranks!r}")
    return n_ranks


def ring_order(n_ranks: int, chunk: int, direction: int = -1) -> list:
    """The ranks in the order in which a ring all-reduce adds their values, for the elements of one chunk.

    A ring all-reduce (Patarasuk & Yuan 2009, "Bandwidth optimal all-reduce algorithms"; the ring algorithms of
    NCCL and gloo) cuts the buffer into N chunks and runs a *reduce-scatter* and then an *all-gather*.  In each
    of the N − 1 steps of the reduce-scatter, every rank sends the partial sum of one chunk to its neighbour,
    which adds its own values and rounds the sum to the buffer's dtype; chunk c arrives, fully summed, at rank c.
    The all-gather then copies each summed chunk to every rank, without arithmetic.  So every element is a
    sequential sum, rounded after each addition, that starts one hop after its chunk's rank and ends there:
    ranks c + d, c + 2d, …, c + N·d = c (mod N), with d = ``direction`` the way the data flows round the ring.

    ``direction = -1`` is gloo's ring (its all-reduce of real gradients on 3 CPU processes equals
    :func:`ring_allreduce` with it, bit for bit: ``tests/test_distributed.py``); +1 is NCCL's (data flows to
    ``ring->next``).
    The two are mirror images with the same error statistics.

    Returns a list of N ranks.  Raises ValueError for ``n_ranks`` < 1, a chunk outside [0, N) or a direction
    other than ±1.
    """
    n = _check_ranks(n_ranks)
    if not isinstance(chunk, (int, np.integer)) or not 0 <= chunk < n:
        raise ValueError(f"chunk must be an int in [0, {n}), got {chunk!r}")
    if direction not in (-1, 1):
        raise ValueError(f"direction must be -1 (gloo) or +1 (NCCL), got {direction!r}")
    return [int((chunk + direction * k) % n) for k in range(1, n + 1)]


def tree_children(n_ranks: int) -> list:
    """``children[r]``: the ranks whose partial sums rank r adds to its own in a binary-tree reduction.

    The tree is this book's: a binary heap over all N ranks, rank r's children are 2r + 1 and 2r + 2 (those < N),
    rank 0 is the root; each rank receives the partial sums of up to two children, adds them to its own values in
    turn, and sends the result to its parent, and the root broadcasts the sum back down.  It is not NCCL's
    tree: NCCL (since 2.4) builds a double binary tree across nodes, two complementary trees each carrying half
    of the data (Jeaugey 2019; ``ncclGetDtree`` in ``src/graph/trees.cc``), and within a node chains the GPUs
    (``src/graph/connect.cc``), so its order depends on the number of nodes and of GPUs per node.

    Raises ValueError for ``n_ranks`` < 1.
    """
    n = _check_ranks(n_ranks)
    return [[c for c in (2 * r + 1, 2 * r + 2) if c < n] for r in range(n)]


def _rank_values(values) -> np.ndarray:
    """``values`` as a float64 array [N, M] (a tensor is copied to the host)."""
    if isinstance(values, torch.Tensor):
        values = values.detach().to("cpu", torch.float64).numpy()
    x = np.asarray(values, dtype=np.float64)
    if x.ndim != 2 or x.shape[0] < 1:
        raise ValueError(f"values must be 2-D [ranks, elements] with at least one rank, got shape {x.shape}")
    return x


def _divisor(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
        raise ValueError(f"{name} must be a positive finite number, got {value!r}")
    return float(value)


def _compress(values, fmt, predivide) -> tuple:
    """Each rank's values rounded to ``fmt`` and divided by ``predivide`` in fmt: (array [N, M], fmt)."""
    fmt = F.get_format(fmt)
    x = F.round_to(_rank_values(values), fmt)
    predivide = _divisor("predivide", predivide)
    if predivide != 1.0:
        x = F.round_to(x / predivide, fmt)
    return x, fmt


def _postdivide(total: np.ndarray, fmt, postdivide) -> np.ndarray:
    postdivide = _divisor("postdivide", postdivide)
    return total if postdivide == 1.0 else F.round_to(total / postdivide, fmt)


def ring_allreduce(
    values: ArrayLike, fmt: FormatLike = "FP32", *, predivide: float = 1.0, postdivide: float = 1.0, direction: int = -1
) -> np.ndarray:
    """What every rank holds after a ring all-reduce (sum) of ``values[r]`` in the format ``fmt``.

    Follows the summation order of :func:`ring_order`: each rank rounds its values to ``fmt`` (and divides them by
    ``predivide``, rounding again, as DDP's ``fp16_compress_hook`` and ``bf16_compress_hook`` do with the world
    size: ``buffer.to(dtype).div_(world_size)``); element j lies in chunk c = j // ⌈M/N⌉; its partial sum travels
    the ring in :func:`ring_order` (N, c), rounded to ``fmt`` after every addition (round-to-nearest-even); the
    total is divided by ``postdivide`` and rounded (FSDP2's post-division).  The additions are formed in float64
    and rounded once, which equals the FP32 addition-then-rounding of the libraries' kernels: float64 has more
    than twice the precision of FP32, BF16 and FP16 plus two bits, so the double rounding is innocuous.

    Parameters
    ----------
    values : array-like [N, M] (NumPy, torch, nested lists; any real dtype): row r is rank r's tensor, flattened
    fmt : FloatFormat or name ("FP32", "BF16", "FP16", …): the dtype of the buffer and of every partial sum
    predivide, postdivide : positive numbers, 1 for no division
    direction : -1 (gloo's ring) or +1 (NCCL's)

    Returns
    -------
    float64 array [M] of values of ``fmt`` (±inf where a partial sum overflowed, NaN where +inf met −inf).

    Raises
    ------
    ValueError
        ``values`` not 2-D, an unknown format, a divisor that is not positive and finite, a bad direction.
    """
    x, fmt = _compress(values, fmt, predivide)
    if direction not in (-1, 1):
        raise ValueError(f"direction must be -1 (gloo) or +1 (NCCL), got {direction!r}")
    n, m = x.shape
    cols = np.arange(m)
    chunk = cols // max(1, -(-m // n))  # chunk c holds elements [c·⌈M/N⌉, (c+1)·⌈M/N⌉)
    with np.errstate(invalid="ignore"):
        total = x[(chunk + direction) % n, cols]
        for hop in range(2, n + 1):
            total = F.round_to(total + x[(chunk + direction * hop) % n, cols], fmt)
    return _postdivide(total, fmt, postdivide)


def tree_allreduce(
    values: ArrayLike, fmt: FormatLike = "FP32", *, predivide: float = 1.0, postdivide: float = 1.0
) -> np.ndarray:
    """What every rank holds after a binary-tree all-reduce (sum) of ``values[r]`` in the format ``fmt``.

    Each rank rounds its values to ``fmt`` (and pre-divides, as :func:`ring_allreduce`); from the leaves up, every
    rank adds the partial sums of its children (:func:`tree_children`: first 2r + 1, then 2r + 2) to its own,
    rounding after each addition; the root's total is divided by ``postdivide``, rounded, and broadcast (copies).
    The tree is ⌊log2 N⌋ + 1 ranks tall, and a rank adds its two children in turn, so a value is rounded up to
    2⌊log2 N⌋ times on its way to the root, against up to N − 1 times in a ring.  The order is this book's
    binary heap, not NCCL's double binary tree (:func:`tree_children`).

    Parameters, return value and errors as :func:`ring_allreduce` (no ``direction``).
    """
    x, fmt = _compress(values, fmt, predivide)
    n = x.shape[0]
    part = x.copy()
    depth = max(0, n.bit_length() - 1)  # the deepest level holding a rank
    with np.errstate(invalid="ignore"):
        for level in range(depth - 1, -1, -1):  # children (level + 1) are complete before their parents
            lo, hi = 2**level - 1, min(2 ** (level + 1) - 1, n)
            for first_child in (1, 2):
                parents = np.arange(lo, hi)
                parents = parents[2 * parents + first_child < n]
                if parents.size:
                    part[parents] = F.round_to(part[parents] + part[2 * parents + first_child], fmt)
    return _postdivide(part[0], fmt, postdivide)


def fsdp_divide_factors(world_size: int) -> tuple:
    """``(pre, post)``: how FSDP2 divides FP16 gradients by the world size N around the reduce-scatter.

    PyTorch's FSDP2 (``_get_gradient_divide_factors``, for a reduce dtype "with overflow risk", i.e. FP16)
    divides by ``pre`` before summing and by ``post`` = N / pre after, with ``pre`` the first power of two
    for which N / pre ≤ pre (or that stops dividing N): about √N on each side, so that the sum neither overflows
    (all the division after) nor underflows (all of it before) as easily.  For FP32 and BF16 it asks the
    backend for an average (``ReduceOp.AVG``) instead.

    Raises ValueError for ``world_size`` < 1.
    """
    n = _check_ranks(world_size)
    pre = 1
    while n % pre == 0 and n / pre > pre:
        pre *= 2
    return float(pre), n / pre


def relative_error(approx: ArrayLike, exact: ArrayLike) -> float:
    """‖approx − exact‖₂ / ‖exact‖₂ in float64 (inf when approx holds inf or NaN; 0 when both are 0).

    Raises ValueError when the shapes differ.
    """
    a = np.asarray(approx, dtype=np.float64).ravel()
    e = np.asarray(exact, dtype=np.float64).ravel()
    if a.shape != e.shape:
        raise ValueError(f"approx and exact must have the same shape, got {a.shape} and {e.shape}")
    if not np.isfinite(a).all():
        return math.inf
    norm = float(np.linalg.norm(e))
    diff = float(np.linalg.norm(a - e))
    return 0.0 if diff == 0 else (diff / norm if norm else math.inf)
