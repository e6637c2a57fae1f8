"""Timing that can be trusted: warm-up runs, device synchronisation, the median of repeats.

Only wall-clock timing of a callable for now (used by the round_to benchmark); peak-memory measurement
arrives with the AMP chapter.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass
from typing import Callable

import torch

__all__ = ["Timing", "time_call"]


@dataclass(frozen=True)
class Timing:
    """Repeated wall-clock times of one callable, in seconds."""

    times: tuple
    warmup: int

    @property
    def median(self) -> float:
        return statistics.median(self.times)

    @property
    def min(self) -> float:
        return min(self.times)

    @property
    def max(self) -> float:
        return max(self.times)

    def as_dict(self) -> dict:
        d = asdict(self)
        d.update(median=self.median, min=self.min, max=self.max)
        d["times"] = list(self.times)
        return d


def _sync(device) -> None:
    if device is not None and torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def time_call(fn: Callable[[], object], *, repeat: int = 7, warmup: int = 2, device=None) -> Timing:
    """Time ``fn()`` ``repeat`` times after ``warmup`` untimed calls.

    Parameters
    ----------
    fn : callable with no arguments
    repeat, warmup : int
        Number of timed and untimed calls (repeat ≥ 1, warmup ≥ 0).
    device : torch.device, str or None
        When a CUDA device is given, it is synchronised before and after each call so that the time covers
        the queued kernels, not only their launch.

    Returns
    -------
    Timing (seconds; use ``.median``).

    Raises
    ------
    TypeError
        ``fn`` is not callable.
    ValueError
        ``repeat < 1`` or ``warmup < 0``.
    """
    if not callable(fn):
        raise TypeError(f"fn must be callable, got {type(fn).__name__}")
    if not isinstance(repeat, int) or repeat < 1:
        raise ValueError(f"repeat must be an int ≥ 1, got {repeat!r}")
    if not isinstance(warmup, int) or warmup < 0:
        raise ValueError(f"warmup must be an int ≥ 0, got {warmup!r}")
    for _ in range(warmup):
        fn()
    _sync(device)
    times = []
    for _ in range(repeat):
        _sync(device)
        t0 = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - t0)
    return Timing(tuple(times), warmup)
