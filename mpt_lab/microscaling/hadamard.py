"""Random Hadamard transforms: an orthogonal rotation of each block of d values, applied before quantising.

A Hadamard matrix H_d (d a power of two) has entries ±1 and orthogonal rows: Sylvester's construction
H_1 = [1], H_2k = [[H_k, H_k], [H_k, −H_k]], normalised by 1/√d.  A *random* Hadamard transform multiplies it
on the left by a diagonal matrix S_d of random signs, H = S_d H_d / √d, which flips the signs of whole rows of
H_d (NVIDIA, "Pretraining Large Language Models with NVFP4", arXiv:2509.25149, Appendix C).  A tensor is
transformed in tiles: every run of d consecutive values along an axis, a row vector v, becomes v H.

Because H is orthogonal (H Hᵀ = I), transforming both operands of a matrix product along its reduction
dimension leaves the exact product unchanged, (A H)(Hᵀ B) = A B (Appendix C, Eq. 6): for C = A B with the
reduction over A's columns and B's rows, transform A's rows and Bᵀ's rows, tile by tile.  What it changes is
what a quantiser sees: an outlier in a block is spread over all d values of its tile, which makes the block
look Gaussian and its scale less dominated by one value (§4.2).  Quantised, the product is no longer the
same: Q(A H) Q(Hᵀ B) ≠ Q(A) Q(B).

The NVFP4 recipe applies it to the two inputs of the weight-gradient GEMM only (Wgrad: the output gradient
and the activations, along the token dimension), with d = 16 and "a single random sign vector that is shared
across all linear layers throughout training" (§4.2; Appendix E.4); for MXFP4 it uses d = 32 (§5).  Tseng
et al. ("Training LLMs with MXFP4", arXiv:2502.20586) apply it to both backward GEMMs, with a new sign
vector per call.  Here the sign vector comes from a seed, so that a run is reproducible.

:class:`RandomHadamard` is the transform (block size and seed), :func:`hadamard_matrix` Sylvester's matrix.
Arithmetic: the transform is one matrix product per tile in the working type (float64 for float64 input,
float32 otherwise, the result cast back to x's dtype).  For d = 16 the entries of H are ±1/4, exact in binary
floating point, so float32 results differ from exact ones only by the rounding of the sums; for d = 32 the
entries ±1/√32 are themselves rounded (to float32 or float64).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch

from ._core import check_axis, check_int, check_tensor

__all__ = ["HADAMARD_BLOCK_SIZE", "hadamard_matrix", "RandomHadamard"]

#: The NVFP4 recipe's Hadamard size: 16 × 16 (arXiv:2509.25149, §4.2: "better convergence than d = 4 and
#: similar results as d = 128"); it equals NVFP4's block size.
HADAMARD_BLOCK_SIZE = 16


def _check_size(d, argname: str = "block_size") -> int:
    d = check_int(d, argname, 1)
    if d & (d - 1):
        raise ValueError(f"{argname} must be a power of two (Sylvester's Hadamard matrices), got {d}")
    return d


def hadamard_matrix(
    d: int, *, normalized: bool = True, dtype: torch.dtype = torch.float64, device: torch.device | str | None = None
) -> torch.Tensor:
    """Sylvester's Hadamard matrix H_d: H_1 = [1], H_2k = [[H_k, H_k], [H_k, −H_k]], entries ±1 (divided by
    √d when ``normalized``, so that H Hᵀ = I).

    Parameters
    ----------
    d : int, a power of two ≥ 1
    normalized : bool
    dtype, device : of the result (default float64 on the CPU)

    Returns
    -------
    Tensor (d, d), symmetric.

    Raises
    ------
    TypeError
        d not an int.
    ValueError
        d < 1 or not a power of two.
    """
    d = _check_size(d, "d")
    h = torch.ones((1, 1), dtype=torch.float64)
    while h.shape[0] < d:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    if normalized:
        h = h / math.sqrt(d)
    return h.to(dtype=dtype, device=device)


@dataclass(frozen=True)
class RandomHadamard:
    """The random Hadamard transform of blocks of ``block_size`` values, its signs drawn from ``seed``.

    Parameters
    ----------
    block_size : int, a power of two (16: the NVFP4 recipe, :data:`HADAMARD_BLOCK_SIZE`; 32 for MXFP4)
    seed : int ≥ 0
        The signs are ``torch.randint(0, 2, (block_size,))`` from a CPU ``torch.Generator`` seeded with it, as
        ±1: the same seed gives the same transform on every machine.

    Methods
    -------
    signs() → float64 tensor (block_size,) of ±1, the diagonal of S
    matrix(dtype, device) → (block_size, block_size): S H_d / √block_size
    apply(x, axis=-1) → every tile v of block_size values along ``axis`` becomes v · matrix()
    inverse(y, axis=-1) → every tile becomes v · matrix()ᵀ; ``inverse(apply(x))`` = x up to rounding

    Raises
    ------
    TypeError / ValueError
        block_size not an int power of two; seed not an int ≥ 0.
    """

    block_size: int = HADAMARD_BLOCK_SIZE
    seed: int = 0

    def __post_init__(self):
        _check_size(self.block_size)
        check_int(self.seed, "seed", 0)

    def signs(self) -> torch.Tensor:
        """The random signs s (the diagonal of S_d), float64 ±1, shape (block_size,)."""
        g = torch.Generator().manual_seed(self.seed)
        return torch.randint(0, 2, (self.block_size,), generator=g).to(torch.float64) * 2 - 1

    def matrix(self, dtype: torch.dtype = torch.float64, device: torch.device | str | None = None) -> torch.Tensor:
        """H = S_d H_d / √d (arXiv:2509.25149, Appendix C): row i of the normalised Sylvester matrix times s_i;
        orthogonal.  (block_size, block_size) in ``dtype`` on ``device`` (a new tensor)."""
        return _matrix(self, dtype, torch.device(device) if device is not None else torch.device("cpu")).clone()

    def _tiles(self, x, axis: int, inverse: bool) -> torch.Tensor:
        x = check_tensor(x)
        axis = check_axis(axis, x.dim())
        n = x.shape[axis]
        if n % self.block_size:
            raise ValueError(
                f"x's length along axis {axis} ({n}) must be a multiple of block_size "
                f"({self.block_size}); pad both operands of the product with zeros first"
            )
        work = torch.float64 if x.dtype == torch.float64 else torch.float32
        m = _matrix(self, work, x.device)
        if inverse:
            m = m.t()
        xm = x.movedim(axis, -1).to(work)
        y = (xm.reshape(-1, self.block_size) @ m).reshape(xm.shape)
        return y.movedim(-1, axis).to(x.dtype)

    def apply(self, x: torch.Tensor, axis: int = -1) -> torch.Tensor:
        """x with every tile v of ``block_size`` consecutive values along ``axis`` replaced by v H.

        Parameters
        ----------
        x : float16, bfloat16, float32 or float64 tensor (CPU or CUDA), whose length along ``axis`` is a
            multiple of block_size
        axis : int

        Returns
        -------
        Tensor of x's shape, dtype and device (computed in float64 for float64 x, float32 otherwise), no
        autograd history.

        Raises
        ------
        TypeError / ValueError
            x not such a tensor; axis out of range; length along axis not a multiple of block_size.
        """
        return self._tiles(x, axis, inverse=False)

    def inverse(self, y: torch.Tensor, axis: int = -1) -> torch.Tensor:
        """The inverse transform, v ↦ v Hᵀ on every tile (Hᵀ = H⁻¹); arguments and errors as :meth:`apply`."""
        return self._tiles(y, axis, inverse=True)


@functools.lru_cache(maxsize=64)
def _matrix(rht: RandomHadamard, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """The transform's matrix S H_d / √d in ``dtype`` on ``device``, computed once (never modified in place)."""
    h = rht.signs()[:, None] * hadamard_matrix(rht.block_size)
    return h.to(dtype=dtype, device=device)
