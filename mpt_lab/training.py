"""The small pieces of a training loop that every experiment shares, written once.

* :func:`shuffled_batches`: indices of mini-batches drawn in shuffled epochs (a new permutation whenever the
  previous one is used up), reproducible from a generator;
* :func:`backward_step`: backward and optimizer step, through a loss scaler when one is given (the
  ``torch.amp.GradScaler`` contract: ``scale(loss).backward(); step(optimizer); update()``);
* :func:`accuracy`: the share of correct arg-max predictions;
* :func:`autocast_to`: ``torch.autocast`` for a lower-precision dtype, nothing for float32.

These are the plain-PyTorch loops of the PyTorch AMP recipe (Carilli, "Automatic Mixed Precision"); the
numerics the book studies (rounding, loss scaling) live in :mod:`mpt_lab.formats` and :mod:`mpt_lab.scaling`.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch

__all__ = ["shuffled_batches", "backward_step", "accuracy", "autocast_to"]


def shuffled_batches(n: int, batch_size: int, *, generator: torch.Generator | None = None,
                     seed: int = 0) -> Iterator[torch.Tensor]:
    """Endless mini-batches of indices into a data set of ``n`` items, in shuffled epochs.

    Each epoch is a fresh ``torch.randperm(n, generator=generator)``; batches are consecutive slices of
    ``batch_size`` indices, and an epoch's tail shorter than a batch is dropped (so every batch has the same
    shape).  With the same generator state the sequence is the same, so runs that must see the same data (the
    arms of a precision comparison) each call this with a generator seeded alike.

    Parameters
    ----------
    n : int ≥ batch_size, the number of items
    batch_size : int ≥ 1
    generator : torch.Generator (CPU); default a new one seeded with ``seed``

    Yields
    ------
    int64 tensor [batch_size] of indices in [0, n).

    Raises
    ------
    ValueError
        ``batch_size < 1`` or ``n < batch_size``.
    """
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be an int ≥ 1, got {batch_size!r}")
    if not isinstance(n, int) or n < batch_size:
        raise ValueError(f"n must be an int ≥ batch_size = {batch_size}, got {n!r}")
    gen = generator if generator is not None else torch.Generator().manual_seed(seed)
    while True:
        order = torch.randperm(n, generator=gen)
        for pos in range(0, n - batch_size + 1, batch_size):
            yield order[pos:pos + batch_size]


def backward_step(loss: torch.Tensor, optimizer: torch.optim.Optimizer, scaler=None) -> None:
    """Backward and optimizer step, through a loss scaler when one is given (scale, step, update).

    ``scaler`` is anything with the ``torch.amp.GradScaler`` contract (:class:`mpt_lab.scaling.GradScaler`,
    :class:`~mpt_lab.scaling.StaticLossScaler`, torch's own) or None for ``loss.backward(); optimizer.step()``.
    The caller zeroes the gradients.
    """
    if scaler is not None:
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
    else:
        loss.backward()
        optimizer.step()


@torch.no_grad()
def accuracy(logits: torch.Tensor, labels: torch.Tensor) -> float:
    """Share (0 to 1) of rows of ``logits`` [N, C] whose arg-max equals ``labels`` [N] (int64).

    Raises
    ------
    ValueError
        ``logits`` is not 2-D or the lengths differ.
    """
    if logits.dim() != 2 or labels.shape != logits.shape[:1]:
        raise ValueError(f"logits must be [N, C] and labels [N], got {tuple(logits.shape)} and "
                         f"{tuple(labels.shape)}")
    return float((logits.argmax(1) == labels).float().mean())


def autocast_to(device_type: str, dtype: torch.dtype | None):
    """``torch.autocast(device_type, dtype=dtype)`` for float16/bfloat16; a no-op context for None or float32.

    (``torch.autocast`` with float32 on a CPU warns that the dtype is unsupported; an FP32 baseline should
    simply run without autocast.)
    """
    if dtype is None or dtype == torch.float32:
        return contextlib.nullcontext()
    return torch.autocast(device_type, dtype=dtype)
