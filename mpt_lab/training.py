"""The small pieces of a training loop that every experiment shares, written once.

* :func:`shuffled_batches`: indices of mini-batches drawn in shuffled epochs (a new permutation whenever the
  previous one is used up), reproducible from a generator;
* :func:`backward_step`: backward and optimizer step, through a loss scaler when one is given (the
  ``torch.amp.GradScaler`` contract: ``scale(loss).backward(); step(optimizer); update()``);
* :func:`accuracy`: the share of correct arg-max predictions;
* :func:`autocast_to`: ``torch.autocast`` for a lower-precision dtype, nothing for float32;
* :class:`StaticStep`: one whole training step on static input buffers, captured in a CUDA graph on CUDA and
  replayed (the step as the GPU sees it, without the host's per-operator launches).

These are the plain-PyTorch loops of the PyTorch AMP recipe (Carilli, "Automatic Mixed Precision"); the
numerics the book studies (rounding, loss scaling) live in :mod:`mpt_lab.formats` and :mod:`mpt_lab.scaling`.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch

__all__ = ["shuffled_batches", "backward_step", "accuracy", "autocast_to", "StaticStep", "CAPTURES"]


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


#: How :class:`StaticStep` runs: "cuda_graph" (captured once with ``torch.cuda.graph``, replayed), "eager"
#: (the same step run op by op: a CPU, or a check), "auto" (a CUDA graph on CUDA, eager elsewhere).
CAPTURES = ("auto", "cuda_graph", "eager")


class StaticStep:
    """One training step — forward under autocast, loss, backward through a loss scaler, optimizer step — on
    static input buffers, so that it can be captured whole in a CUDA graph and replayed.

    The eager loop of the PyTorch AMP recipe (Carilli, "Automatic Mixed Precision") launches each of its
    operators from Python; when the matrix products are short, the host's launches, not the tensor cores, set
    the time of a step.  This is the same step as the GPU sees it: inputs are copied into buffers that never
    move, the optimizer must keep the scaler's inf check on the device (``torch.optim.SGD(..., fused=True)``:
    ``torch.amp.GradScaler.step`` then hands ``found_inf`` to the fused kernel instead of reading it back with
    ``.item()``, which a capture forbids), autocast runs with ``cache_enabled=False`` (the PyTorch CUDA-graphs
    notes), and after ``warmup`` eager steps on a side stream the whole step is captured once
    (``torch.cuda.graph``) and each call replays it.  Each call trains one step on the data it is given (the
    buffers hold it; the loss of the last replay is in :attr:`loss`).

    Parameters
    ----------
    model : torch.nn.Module (FP32 parameters), on ``x``'s device
    loss_fn : callable(output, y) → scalar loss
    optimizer : torch.optim.Optimizer over the model's parameters; for a CUDA graph with a scaler, one whose
        step keeps found_inf on the device (``fused=True``)
    x, y : tensors of the input and target shape (copied into the static buffers)
    dtype : autocast dtype (torch.float16, torch.bfloat16) or None / torch.float32 for none
    scaler : ``torch.amp.GradScaler`` or None
    capture : one of :data:`CAPTURES`
    warmup : eager steps before the capture (≥ 1 with a CUDA graph: they create the gradients, the optimizer
        state and the scaler's scale)

    Attributes: ``captured`` ("cuda_graph" or "eager"), ``loss`` (the last step's loss, a 0-d tensor on the
    device), ``static_x``, ``static_y``.

    Raises
    ------
    TypeError
        ``model`` is not a torch.nn.Module or ``x``/``y`` are not tensors.
    ValueError
        An unknown ``capture``, "cuda_graph" without CUDA tensors, ``warmup`` < 0 (< 1 for a CUDA graph).
    """

    def __init__(self, model, loss_fn, optimizer, x, y, *, dtype=None, scaler=None, capture: str = "auto",
                 warmup: int = 3):
        if not isinstance(model, torch.nn.Module):
            raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
        if not isinstance(x, torch.Tensor) or not isinstance(y, torch.Tensor):
            raise TypeError("x and y must be tensors")
        if capture not in CAPTURES:
            raise ValueError(f"capture must be one of {CAPTURES}, got {capture!r}")
        cuda = x.device.type == "cuda"
        if capture == "auto":
            capture = "cuda_graph" if cuda else "eager"
        if capture == "cuda_graph" and not cuda:
            raise ValueError(f"capture='cuda_graph' needs CUDA tensors, got x on {x.device}")
        if not isinstance(warmup, int) or warmup < (1 if capture == "cuda_graph" else 0):
            raise ValueError(f"warmup must be an int ≥ {1 if capture == 'cuda_graph' else 0}, got {warmup!r}")
        self.model, self.loss_fn, self.optimizer, self.scaler = model, loss_fn, optimizer, scaler
        self.dtype = None if dtype in (None, torch.float32) else dtype
        self.static_x, self.static_y = x.detach().clone(), y.detach().clone()
        self.captured, self.loss, self._graph = capture, None, None
        if capture == "cuda_graph":
            side = torch.cuda.Stream(device=x.device)
            side.wait_stream(torch.cuda.current_stream(x.device))
            with torch.cuda.stream(side):
                for _ in range(warmup):
                    self._step()
            torch.cuda.current_stream(x.device).wait_stream(side)
            self.optimizer.zero_grad(set_to_none=True)
            self._graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self._graph):
                self._step(zero=False)
        else:
            for _ in range(warmup):
                self._step()

    def _step(self, zero: bool = True) -> None:
        if zero:
            self.optimizer.zero_grad(set_to_none=True)
        if self.dtype is None:
            ctx = contextlib.nullcontext()
        else:
            ctx = torch.autocast(self.static_x.device.type, dtype=self.dtype, cache_enabled=False)
        with ctx:
            loss = self.loss_fn(self.model(self.static_x), self.static_y)
        backward_step(loss, self.optimizer, self.scaler)
        self.loss = loss.detach()

    def __call__(self, x: torch.Tensor | None = None, y: torch.Tensor | None = None) -> None:
        """One training step on ``x``, ``y`` (copied into the static buffers; None: the data already there)."""
        if x is not None:
            self.static_x.copy_(x)
        if y is not None:
            self.static_y.copy_(y)
        if self._graph is not None:
            self._graph.replay()
        else:
            self._step()
