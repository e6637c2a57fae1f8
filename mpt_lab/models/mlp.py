"""The digit classifier of the book's small experiments: a multilayer perceptron on scikit-learn's 8×8 digits."""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["digits_mlp"]


def digits_mlp(hidden: int = 64, layers: int = 1, *, seed: int | None = None) -> nn.Sequential:
    """``Linear(64, hidden) → ReLU → [Linear(hidden, hidden) → ReLU] × (layers − 1) → Linear(hidden, 10)``.

    Input float32 ``[N, 64]`` (the flattened digits of :func:`mpt_lab.data.digits_data`), output logits
    ``[N, 10]``; float32 parameters initialised as PyTorch's ``nn.Linear``.

    Parameters
    ----------
    hidden : int ≥ 1, width of the hidden layers
    layers : int ≥ 1, number of hidden layers
    seed : when given, the weights are drawn from a generator seeded with it (torch's global random state is
        left as it was), so the same seed gives the same network

    Raises
    ------
    ValueError
        ``hidden`` or ``layers`` < 1.
    """
    for name, v in (("hidden", hidden), ("layers", layers)):
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise ValueError(f"{name} must be an int ≥ 1, got {v!r}")

    def build():
        mods = [nn.Linear(64, hidden), nn.ReLU()]
        for _ in range(layers - 1):
            mods += [nn.Linear(hidden, hidden), nn.ReLU()]
        return nn.Sequential(*mods, nn.Linear(hidden, 10))

    if seed is None:
        return build()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return build()
