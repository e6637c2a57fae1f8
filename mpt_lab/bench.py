"""Timing that can be trusted: warm-up runs, device synchronisation, the median of repeats; peak memory;
measured matrix-multiply throughput.

- :func:`time_call`: wall-clock (``timer="wall"``, CUDA synchronised before and after each call) or CUDA-event
  (``timer="cuda_event"``) times of a callable; ``timer="auto"`` picks events on CUDA and the wall clock elsewhere.
- :func:`peak_memory` / :class:`track_peak_memory`: the peak of tensor memory allocated while a callable runs,
  counted above what was allocated when it started (bytes).  CUDA: the caching allocator's own counters
  (``torch.cuda.reset_peak_memory_stats`` + ``max_memory_allocated``).  CPU: torch's CPU allocator keeps no
  peak counter, so a ``TorchDispatchMode`` (:mod:`mpt_lab._torch_internals`) sums ``untyped_storage().nbytes()``
  of every operator output whose storage it has not seen, and subtracts it when that storage is freed (a
  ``weakref.finalize`` on the storage; torch keeps a storage's Python object alive as long as the storage).
  It sees every tensor made by an ATen operator, in forward, backward and the optimizer; it does not see
  memory outside tensors (oneDNN scratch buffers, Python objects) nor tensors made without dispatch
  (``torch.from_numpy``).  Both methods count allocated tensor bytes, not the allocator's reserved pool.
- :func:`matmul_peak_tflops`: the best measured throughput of a square matrix product in one dtype, the
  denominator of "fraction of peak".
"""

from __future__ import annotations

import statistics
import time
import weakref
from dataclasses import asdict, dataclass
from typing import Callable

import torch

__all__ = ["Timing", "time_call", "interleaved", "peak_memory", "track_peak_memory", "matmul_peak_tflops", "TIMERS"]

TIMERS = ("wall", "cuda_event", "auto")


@dataclass(frozen=True)
class Timing:
    """Repeated wall-clock times of one callable, in seconds."""

    times: tuple
    warmup: int
    method: str = "wall"      # "wall" (perf_counter, CUDA synchronised) or "cuda_event"

    @property
    def median(self) -> float:
        """The median of :attr:`times` (seconds)."""
        return statistics.median(self.times)

    @property
    def min(self) -> float:
        """The shortest of :attr:`times` (seconds)."""
        return min(self.times)

    @property
    def max(self) -> float:
        """The longest of :attr:`times` (seconds)."""
        return max(self.times)

    def as_dict(self) -> dict:
        """The fields and median, min and max as a JSON-ready dict (``times`` a list)."""
        d = asdict(self)
        d.update(median=self.median, min=self.min, max=self.max)
        d["times"] = list(self.times)
        return d


def interleaved(fns: dict, repeat: int) -> dict:
    """Time several callables in turn, so that load from other processes hits them alike (CPU).

    One untimed call of each, then ``repeat`` rounds that call each once, in the order given.

    Parameters
    ----------
    fns : dict name → callable with no arguments
    repeat : int ≥ 1

    Returns
    -------
    dict name → (wall-clock seconds, process CPU seconds): two lists of ``repeat`` times each
    (``time.perf_counter`` and ``time.process_time`` around each call; the CPU time is what the load of other
    processes on a shared machine inflates least).

    Raises TypeError for a non-callable value, ValueError for ``repeat`` < 1.
    """
    if not isinstance(fns, dict) or not all(callable(f) for f in fns.values()):
        raise TypeError("fns must be a dict of name → callable")
    if not isinstance(repeat, int) or repeat < 1:
        raise ValueError(f"repeat must be an int ≥ 1, got {repeat!r}")
    for f in fns.values():
        f()
    times = {name: ([], []) for name in fns}
    for _ in range(repeat):
        for name, f in fns.items():
            w0, c0 = time.perf_counter(), time.process_time()
            f()
            c1, w1 = time.process_time(), time.perf_counter()
            times[name][0].append(w1 - w0)
            times[name][1].append(c1 - c0)
    return times


def _sync(device) -> None:
    if device is not None and torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def time_call(fn: Callable[[], object], *, repeat: int = 7, warmup: int = 2, device=None,
              timer: str = "wall") -> Timing:
    """Time ``fn()`` ``repeat`` times after ``warmup`` untimed calls.

    Parameters
    ----------
    fn : callable with no arguments
    repeat, warmup : int
        Number of timed and untimed calls (repeat ≥ 1, warmup ≥ 0).
    device : torch.device, str or None
        When a CUDA device is given, it is synchronised before and after each call so that the time covers
        the queued kernels, not only their launch.
    timer : "wall", "cuda_event" or "auto"
        "wall": ``time.perf_counter`` around each call.  "cuda_event": a pair of ``torch.cuda.Event``
        recorded on the current stream around each call (GPU time of the queued work, no host-side launch
        jitter at the ends); needs a CUDA ``device``.  "auto": "cuda_event" on CUDA, "wall" otherwise.

    Returns
    -------
    Timing (seconds; use ``.median``).

    Raises
    ------
    TypeError
        ``fn`` is not callable.
    ValueError
        ``repeat < 1`` or ``warmup < 0``, an unknown ``timer``, or "cuda_event" without a CUDA device.
    """
    if not callable(fn):
        raise TypeError(f"fn must be callable, got {type(fn).__name__}")
    if not isinstance(repeat, int) or repeat < 1:
        raise ValueError(f"repeat must be an int ≥ 1, got {repeat!r}")
    if not isinstance(warmup, int) or warmup < 0:
        raise ValueError(f"warmup must be an int ≥ 0, got {warmup!r}")
    if timer not in TIMERS:
        raise ValueError(f"timer must be one of {TIMERS}, got {timer!r}")
    on_cuda = device is not None and torch.device(device).type == "cuda"
    if timer == "auto":
        timer = "cuda_event" if on_cuda else "wall"
    if timer == "cuda_event" and not on_cuda:
        raise ValueError(f"timer='cuda_event' needs a CUDA device, got device={device!r}")
    if timer == "cuda_event":
        return _time_cuda_events(fn, repeat, warmup, torch.device(device))
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


def _time_cuda_events(fn, repeat: int, warmup: int, device: torch.device) -> Timing:
    with torch.cuda.device(device):
        for _ in range(warmup):
            fn()
        torch.cuda.synchronize(device)
        times = []
        for _ in range(repeat):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1000.0)  # elapsed_time is in milliseconds
    return Timing(tuple(times), warmup, "cuda_event")


class _StorageTracker:
    """CPU peak of live tensor storage made under a dispatch mode (see the module docstring)."""

    def __init__(self):
        from ._torch_internals import TorchDispatchMode, tree_flatten

        tracker = self

        class _Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                out = func(*args, **(kwargs or {}))
                for t in tree_flatten(out)[0]:
                    if isinstance(t, torch.Tensor):
                        tracker._seen(t)
                return out

        self.mode = _Mode()
        self.live = {}          # id(storage object) -> nbytes
        self.current = 0
        self.peak = 0
        self.active = True

    def _seen(self, t: torch.Tensor) -> None:
        if t.device.type != "cpu" or t.is_sparse or getattr(t, "is_nested", False):
            return
        try:
            st = t.untyped_storage()
        except (RuntimeError, NotImplementedError):  # tensors without storage
            return
        key = id(st)
        if key in self.live:
            return
        n = st.nbytes()
        self.live[key] = n
        self.current += n
        self.peak = max(self.peak, self.current)
        weakref.finalize(st, self._freed, key)

    def _freed(self, key) -> None:
        n = self.live.pop(key, 0)
        self.current -= n


class track_peak_memory:
    """Context manager: the peak of tensor memory allocated inside the block, above what was allocated at
    entry, in bytes (``.peak_bytes`` after the block).  The method per device is in the module docstring.

    Parameters
    ----------
    device : torch.device, str or None
        "cuda[:k]" uses the CUDA allocator's counters; "cpu" or None the storage-tracking dispatch mode.

    Raises
    ------
    TypeError
        ``device`` is not a torch.device, str or None.
    ValueError
        A device type other than "cpu" or "cuda".
    """

    def __init__(self, device=None):
        if device is None:
            device = "cpu"
        if not isinstance(device, (str, torch.device)):
            raise TypeError(f"device must be a torch.device, a str or None, got {type(device).__name__}")
        self.device = torch.device(device)
        if self.device.type not in ("cpu", "cuda"):
            raise ValueError(f"device must be a CPU or CUDA device, got {self.device}")
        self.peak_bytes = None
        self.method = ("torch.cuda.max_memory_allocated - memory_allocated at entry" if self.device.type == "cuda"
                       else "peak of live tensor storage made under a TorchDispatchMode")

    def __enter__(self):
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            self._base = torch.cuda.memory_allocated(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
        else:
            self._tracker = _StorageTracker()
            self._tracker.mode.__enter__()
        return self

    def __exit__(self, *exc):
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            self.peak_bytes = int(torch.cuda.max_memory_allocated(self.device) - self._base)
        else:
            self._tracker.mode.__exit__(*exc)
            self.peak_bytes = int(self._tracker.peak)
        return False


def peak_memory(fn: Callable[[], object], device=None) -> int:
    """Peak tensor memory (bytes) allocated while ``fn()`` runs, above what was allocated when it started.

    CUDA: ``torch.cuda.reset_peak_memory_stats`` then ``max_memory_allocated`` minus ``memory_allocated`` at
    entry.  CPU: the peak of the sum of live tensor storage made by ATen operators inside ``fn`` (a
    ``TorchDispatchMode``; tensors freed before the peak do not count, tensors that existed before ``fn`` do not
    count).  Run it apart from timing: the CPU method costs a Python call per operator.

    Raises TypeError when ``fn`` is not callable; see :class:`track_peak_memory` for ``device``.
    """
    if not callable(fn):
        raise TypeError(f"fn must be callable, got {type(fn).__name__}")
    with track_peak_memory(device) as t:
        fn()
    return t.peak_bytes


_DTYPES = {torch.float32, torch.float16, torch.bfloat16, torch.float64}


def matmul_peak_tflops(device=None, dtype=torch.float32, n: int | None = None, *, layout: str = "best",
                       repeat: int = 5, warmup: int = 2, min_seconds: float = 0.05) -> float:
    """Measured throughput (TFLOP/s) of an ``n × n`` by ``n × n`` matrix product in ``dtype`` on ``device``.

    Counts 2·n³ floating-point operations per product and takes the fastest of ``repeat`` timed batches (a
    peak: the best the device reached, less sensitive to other processes than the median)
    (each batch repeats the product until it lasts ≥ ``min_seconds``; CUDA-event timing on CUDA).

    Parameters
    ----------
    device : torch.device, str or None (None: :func:`mpt_lab.device.default_device`)
    dtype : torch.float32, torch.float16, torch.bfloat16 or torch.float64
        On CUDA, float32 uses TF32 tensor cores only if ``torch.backends.cuda.matmul.allow_tf32`` is set.
    n : int ≥ 1, default 4096 on CUDA and 512 on a CPU
    layout : "nn", "nt" or "best"
        "nn": ``a @ b``; "nt": ``torch.nn.functional.linear(a, b)`` = ``a @ b.T`` (what ``nn.Linear`` calls);
        "best": the faster of the two.  On CPUs without native float16 kernels the layouts differ by 10–40×.

    Raises
    ------
    TypeError
        ``dtype`` is not one of the above.
    ValueError
        ``n < 1``, an unknown ``layout``, ``repeat < 1``.
    """
    import torch.nn.functional as F

    from .device import default_device

    if dtype not in _DTYPES:
        raise TypeError(f"dtype must be one of float32, float16, bfloat16, float64, got {dtype!r}")
    if layout not in ("nn", "nt", "best"):
        raise ValueError(f"layout must be 'nn', 'nt' or 'best', got {layout!r}")
    device = default_device() if device is None else torch.device(device)
    if n is None:
        n = 4096 if device.type == "cuda" else 512
    if not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be an int ≥ 1, got {n!r}")
    if not isinstance(repeat, int) or repeat < 1:
        raise ValueError(f"repeat must be an int ≥ 1, got {repeat!r}")
    g = torch.Generator(device=device).manual_seed(0)
    a = torch.randn(n, n, device=device, dtype=torch.float32, generator=g).to(dtype)
    b = torch.randn(n, n, device=device, dtype=torch.float32, generator=g).to(dtype)
    ops = {"nn": lambda: torch.matmul(a, b), "nt": lambda: F.linear(a, b)}
    best = 0.0
    for name in (("nn", "nt") if layout == "best" else (layout,)):
        op = ops[name]
        t = time_call(op, repeat=1, warmup=1, device=device).median   # one call, to size the batches
        k = max(1, int(min_seconds / max(t, 1e-9)))

        def batch(op=op, k=k):
            for _ in range(k):
                op()

        timing = time_call(batch, repeat=repeat, warmup=min(warmup, 1), device=device, timer="auto")
        best = max(best, 2.0 * n ** 3 * k / timing.min / 1e12)
    return best
