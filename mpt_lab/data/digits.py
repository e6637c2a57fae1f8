"""scikit-learn's handwritten digits as a classification data set (ships offline with scikit-learn)."""

from __future__ import annotations

import torch

__all__ = ["digits_data"]


def digits_data(seed: int = 0, device="cpu"):
    """scikit-learn's 8×8 digits as float32 tensors scaled to [0, 1], split 80/20 deterministically by ``seed``.

    Returns
    -------
    (x_train float32 [1437, 64], y_train int64 [1437], x_test float32 [360, 64], y_test int64 [360]), on
    ``device``; labels 0–9.
    """
    from sklearn.datasets import load_digits

    d = load_digits()
    x = torch.tensor(d.data / 16.0, dtype=torch.float32)
    y = torch.tensor(d.target, dtype=torch.int64)
    perm = torch.randperm(len(x), generator=torch.Generator().manual_seed(seed))
    x, y = x[perm].to(device), y[perm].to(device)
    n = int(0.8 * len(x))
    return x[:n], y[:n], x[n:], y[n:]
