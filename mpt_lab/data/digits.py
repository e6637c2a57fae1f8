"""scikit-learn's handwritten digits as a classification data set (ships offline with scikit-learn)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..device import DeviceLike

__all__ = ["digits_data", "upsampled_digits"]


def digits_data(
    seed: int = 0, device: DeviceLike = "cpu"
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
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


def upsampled_digits(
    image_size: int = 32, seed: int = 0, device: DeviceLike = "cpu"
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The digits of :func:`digits_data` as images, bilinearly upsampled from 8×8 to ``image_size``².

    Returns
    -------
    (x_train float32 [1437, 1, S, S], y_train int64 [1437], x_test float32 [360, 1, S, S], y_test int64 [360])
    on ``device``, S = ``image_size``.

    Raises
    ------
    ValueError
        ``image_size`` < 1.
    """
    if not isinstance(image_size, int) or image_size < 1:
        raise ValueError(f"image_size must be an int ≥ 1, got {image_size!r}")
    xtr, ytr, xte, yte = digits_data(seed, device)

    def up(x):
        return F.interpolate(
            x.reshape(-1, 1, 8, 8), size=(image_size, image_size), mode="bilinear", align_corners=False
        )

    return up(xtr), ytr, up(xte), yte
