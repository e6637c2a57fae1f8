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
  denominator of "fraction of (measured) peak"; :data:`DATASHEET` and :func:`datasheet_peaks`: the published
  dense peaks of the GPUs the book measures on, the other denominator (always named beside the measured one).
- :func:`gemm_tflops`: an m×k by k×n product in FP32, TF32, BF16, FP16 or FP8 (``torch._scaled_mm``, fast
  accumulation on or off); :func:`copy_bandwidth`: a device-to-device copy; :class:`GpuSampler`: the GPU's
  clocks and power sampled while something runs (``nvidia-smi`` or ``pynvml``, where present): the roofline.
- :func:`memory_per_parameter`: the bytes per parameter of a Linear stack trained with Adam in FP32, with AMP,
  and in BF16 with FP32 master weights, against ZeRO's accounting (:data:`ZERO_BYTES_PER_PARAMETER`).
- :func:`count_ops`: the ATen operators a callable dispatches (e.g. ``aten::_local_scalar_dense``, the host
  reading a device value back: ``.item()``); :func:`profile_steps`: ``torch.profiler`` over a few calls: the
  host's time per call, the share of the wall time the device is busy, its kernels by name.
"""

from __future__ import annotations

import contextlib
import io
import math
import shutil
import statistics
import subprocess
import threading
import time
import weakref
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile, record_function

from ._torch_internals import TorchDispatchMode, scaled_mm, tree_flatten
from .device import DeviceLike, default_device

__all__ = [
    "checkpoint_bytes",
    "Timing",
    "time_call",
    "interleaved",
    "peak_memory",
    "track_peak_memory",
    "matmul_peak_tflops",
    "TIMERS",
    "DATASHEET",
    "datasheet_peaks",
    "GEMM_KINDS",
    "gemm_tflops",
    "copy_bandwidth",
    "GpuSampler",
    "count_ops",
    "profile_steps",
    "profile_calls",
    "READBACK_OP",
    "MEMORY_MODES",
    "ZERO_BYTES_PER_PARAMETER",
    "memory_per_parameter",
]

TIMERS = ("wall", "cuda_event", "auto")


@dataclass(frozen=True)
class Timing:
    """Repeated wall-clock times of one callable, in seconds."""

    times: tuple
    warmup: int
    method: str = "wall"  # "wall" (perf_counter, CUDA synchronised) or "cuda_event"

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


def time_call(
    fn: Callable[[], object], *, repeat: int = 7, warmup: int = 2, device: DeviceLike = None, timer: str = "wall"
) -> Timing:
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
        tracker = self

        class _Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                out = func(*args, **(kwargs or {}))
                for t in tree_flatten(out)[0]:
                    if isinstance(t, torch.Tensor):
                        tracker._seen(t)
                return out

        self.mode = _Mode()
        self.live = {}  # id(storage object) -> nbytes
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
        self.method = (
            "torch.cuda.max_memory_allocated - memory_allocated at entry"
            if self.device.type == "cuda"
            else "peak of live tensor storage made under a TorchDispatchMode"
        )

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


def peak_memory(fn: Callable[[], object], device: DeviceLike = None) -> int:
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


def matmul_peak_tflops(
    device: DeviceLike = None,
    dtype: torch.dtype = torch.float32,
    n: int | None = None,
    *,
    layout: str = "best",
    repeat: int = 5,
    warmup: int = 2,
    min_seconds: float = 0.05,
) -> float:
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
    for name in ("nn", "nt") if layout == "best" else (layout,):
        op = ops[name]
        t = time_call(op, repeat=1, warmup=1, device=device).median  # one call, to size the batches
        k = max(1, int(min_seconds / max(t, 1e-9)))

        def batch(op=op, k=k):
            for _ in range(k):
                op()

        timing = time_call(batch, repeat=repeat, warmup=min(warmup, 1), device=device, timer="auto")
        best = max(best, 2.0 * n**3 * k / timing.min / 1e12)
    return best


# ============================================================================ denominators: the published peaks
#: Published dense peaks (TFLOP/s; memory bandwidth in TB/s) of the GPUs the book's saved results come from.
#: NVIDIA's datasheets give the tensor-core figures "with sparsity" (2:4 structured); dense is half of them.
#: H100 SXM5 80 GB ("NVIDIA H100 Tensor Core GPU" datasheet, SXM column): FP32 67 TFLOPS, TF32 989, BF16 and
#: FP16 1,979, FP8 3,958 (with sparsity), 3.35 TB/s.  H200 SXM 141 GB ("NVIDIA H200 Tensor Core GPU"
#: datasheet): the same compute as the H100 SXM (the same GH100 die), 4.8 TB/s of HBM3e.  The PCIe boards
#: (H100 PCIe, H200 NVL) are slower and are not listed: their names do not match the keys below.
DATASHEET = {
    "H100 80GB HBM3": {
        "name": "NVIDIA H100 SXM5 80 GB",
        "fp32": 67.0,
        "tf32": 494.5,
        "bf16": 989.5,
        "fp16": 989.5,
        "fp8": 1979.0,
        "hbm_tb_s": 3.35,
        "source": "NVIDIA H100 Tensor Core GPU datasheet, H100 SXM, dense (half the 'with sparsity' figures)",
    },
    "H200": {
        "name": "NVIDIA H200 SXM 141 GB",
        "fp32": 67.0,
        "tf32": 494.5,
        "bf16": 989.5,
        "fp16": 989.5,
        "fp8": 1979.0,
        "hbm_tb_s": 4.8,
        "source": "NVIDIA H200 Tensor Core GPU datasheet, H200 SXM, dense (half the 'with sparsity' figures)",
    },
}


def datasheet_peaks(device_name: str) -> dict | None:
    """The :data:`DATASHEET` entry whose key occurs in ``device_name`` (e.g. "NVIDIA H200" or
    :func:`mpt_lab.device.describe`'s line), or None for any other device (a CPU, another GPU).

    Raises TypeError when ``device_name`` is not a str."""
    if not isinstance(device_name, str):
        raise TypeError(f"device_name must be a str, got {type(device_name).__name__}")
    for key, entry in DATASHEET.items():
        if key in device_name and "NVL" not in device_name and "PCIe" not in device_name:
            return dict(entry)
    return None


# ===================================================================================== GEMMs, copies, clocks
#: The arithmetic of :func:`gemm_tflops`: FP32 (TF32 off), TF32 (float32 inputs on TF32 tensor cores),
#: BF16, FP16, FP8 E4M3 through ``torch._scaled_mm`` with ``use_fast_accum`` off and on.
GEMM_KINDS = ("fp32", "tf32", "bf16", "fp16", "fp8", "fp8_fast")


def _gemm_op(kind: str, m: int, n: int, k: int, device: torch.device):
    """A callable computing one m×k by k×n product of ``kind`` on ``device`` (operands made once), and a
    context manager for the switches it needs; raises RuntimeError (with why) where the kind does not exist."""
    g = torch.Generator(device=device).manual_seed(0)
    a = torch.randn(m, k, device=device, generator=g)
    b = torch.randn(n, k, device=device, generator=g)  # b as n×k: a @ b.T, the layout nn.Linear uses
    if kind in ("fp32", "tf32"):
        if kind == "tf32" and device.type != "cuda":
            raise RuntimeError("TF32 is a mode of CUDA tensor cores; a CPU has no such switch")

        @contextlib.contextmanager
        def flags():
            before = torch.backends.cuda.matmul.allow_tf32
            torch.backends.cuda.matmul.allow_tf32 = kind == "tf32"
            try:
                yield
            finally:
                torch.backends.cuda.matmul.allow_tf32 = before

        bt = b.t()
        return (lambda: a @ bt), flags
    if kind in ("bf16", "fp16"):
        dtype = torch.bfloat16 if kind == "bf16" else torch.float16
        a16, bt16 = a.to(dtype), b.to(dtype).t()
        return (lambda: a16 @ bt16), contextlib.nullcontext
    if scaled_mm is None:
        raise RuntimeError("this torch has no torch._scaled_mm")
    if device.type == "cuda" and torch.cuda.get_device_capability(device) < (8, 9):
        raise RuntimeError("the GPU has no FP8 tensor cores (compute capability < 8.9)")
    a8 = a.to(torch.float8_e4m3fn)  # row-major
    b8 = b.to(torch.float8_e4m3fn).t()  # column-major k×n, as _scaled_mm wants
    one = torch.ones((), device=device)
    fast = kind == "fp8_fast"

    def op():
        return scaled_mm(a8, b8, scale_a=one, scale_b=one, out_dtype=torch.bfloat16, use_fast_accum=fast)

    op()  # raises here where the op has no kernel
    return op, contextlib.nullcontext


def gemm_tflops(
    kind: str, m: int, n: int, k: int, device: DeviceLike = None, *, repeat: int = 5, min_seconds: float = 0.05
) -> dict:
    """Throughput of one m×k by k×n matrix product (``a @ b.T``, as ``nn.Linear`` calls it) in ``kind``.

    Counts 2·m·n·k FLOPs per product; times batches of products that last ≥ ``min_seconds`` each
    (:func:`time_call`, CUDA events on CUDA) and keeps the fastest of ``repeat`` (a peak, as
    :func:`matmul_peak_tflops`).  Operands are standard normal values, cast to the kind's dtype (FP8: E4M3 with
    unit scales, a bfloat16 result).  TF32 is switched on for "tf32" and off for "fp32" while the product runs,
    and restored.

    Parameters
    ----------
    kind : one of :data:`GEMM_KINDS`
    m, n, k : int ≥ 1 (FP8 on CUDA: multiples of 16)
    device : torch.device, str or None (None: :func:`mpt_lab.device.default_device`)

    Returns
    -------
    dict: "kind", "m", "n", "k", "tflops" (None where the kind does not exist here), "seconds" (of one
    product), "reason" (why not, or ""), "timer".

    Raises
    ------
    ValueError
        An unknown ``kind``, a size < 1, ``repeat`` < 1.
    """
    if kind not in GEMM_KINDS:
        raise ValueError(f"kind must be one of {GEMM_KINDS}, got {kind!r}")
    for name, v in (("m", m), ("n", n), ("k", k), ("repeat", repeat)):
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise ValueError(f"{name} must be an int ≥ 1, got {v!r}")
    device = default_device() if device is None else torch.device(device)
    row = {"kind": kind, "m": m, "n": n, "k": k, "tflops": None, "seconds": None, "reason": "", "timer": None}
    try:
        op, flags = _gemm_op(kind, m, n, k, device)
    except (RuntimeError, NotImplementedError, TypeError) as err:
        row["reason"] = f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
        return row
    with flags():
        t = time_call(op, repeat=1, warmup=1, device=device).median
        reps = max(1, int(min_seconds / max(t, 1e-9)))

        def batch():
            for _ in range(reps):
                op()

        timing = time_call(batch, repeat=repeat, warmup=1, device=device, timer="auto")
    seconds = timing.min / reps
    row.update(tflops=2.0 * m * n * k / seconds / 1e12, seconds=seconds, timer=timing.method)
    return row


def copy_bandwidth(device: DeviceLike = None, nbytes: int = 2**30, *, repeat: int = 5) -> dict:
    """Bandwidth of a device-to-device copy of ``nbytes`` bytes (``dst.copy_(src)``), counting the bytes read and
    the bytes written (2 · nbytes per copy): the memory roof of a roofline.

    Returns dict "nbytes", "seconds" (fastest copy), "gb_s" (10⁹ bytes per second), "timer".  Raises ValueError
    for ``nbytes`` < 4 or ``repeat`` < 1.
    """
    if not isinstance(nbytes, int) or nbytes < 4:
        raise ValueError(f"nbytes must be an int ≥ 4, got {nbytes!r}")
    if not isinstance(repeat, int) or repeat < 1:
        raise ValueError(f"repeat must be an int ≥ 1, got {repeat!r}")
    device = default_device() if device is None else torch.device(device)
    src = torch.ones(nbytes // 4, device=device)
    dst = torch.empty_like(src)
    timing = time_call(lambda: dst.copy_(src), repeat=repeat, warmup=2, device=device, timer="auto")
    return {
        "nbytes": src.numel() * 4,
        "seconds": timing.min,
        "gb_s": 2 * src.numel() * 4 / timing.min / 1e9,
        "timer": timing.method,
    }


class GpuSampler:
    """Samples the GPU's SM and memory clocks (MHz), power (W) and temperature (°C) every ``interval`` seconds
    while the block runs, in a background thread: with ``pynvml`` when it imports, else ``nvidia-smi``
    (``--query-gpu=clocks.sm,clocks.mem,power.draw,temperature.gpu``), else not at all.

    ``with GpuSampler() as s: ...`` then ``s.summary()`` → {"source": "pynvml" | "nvidia-smi", "samples": N,
    "sm_clock_mhz": {"mean", "min", "max"}, "mem_clock_mhz": …, "power_w": …, "temperature_c": …} or
    {"source": None, "absent": why} (no GPU, no tool); :meth:`mark` names the samples that follow (the summary of
    one phase: ``summary(label)``).

    Raises ValueError for ``interval`` ≤ 0.
    """

    FIELDS = ("sm_clock_mhz", "mem_clock_mhz", "power_w", "temperature_c")

    def __init__(self, index: int = 0, interval: float = 0.1):
        if not isinstance(interval, (int, float)) or interval <= 0:
            raise ValueError(f"interval must be a positive number of seconds, got {interval!r}")
        self.index, self.interval = int(index), float(interval)
        self.samples: list = []  # (label, {field: value})
        self.source, self.absent = None, ""
        self._label = ""
        self._stop = None
        self._thread = None
        self._read = None

    def _reader(self):
        """A function returning one sample, and its source's name; (None, why) when there is none."""

        if not torch.cuda.is_available():
            return None, "no CUDA device"
        try:
            import pynvml

            pynvml.nvmlInit()
            h = pynvml.nvmlDeviceGetHandleByIndex(self.index)

            def read_nvml():
                return {
                    "sm_clock_mhz": float(pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM)),
                    "mem_clock_mhz": float(pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_MEM)),
                    "power_w": pynvml.nvmlDeviceGetPowerUsage(h) / 1000.0,
                    "temperature_c": float(pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU)),
                }

            read_nvml()
            return read_nvml, "pynvml"
        except Exception:  # no pynvml, or no NVML behind it: try the command-line tool
            pass
        smi = shutil.which("nvidia-smi")
        if smi is None:
            return None, "neither pynvml nor nvidia-smi is present"
        cmd = [
            smi,
            f"--id={self.index}",
            "--query-gpu=clocks.sm,clocks.mem,power.draw,temperature.gpu",
            "--format=csv,noheader,nounits",
        ]

        def read_smi():
            out = subprocess.run(cmd, capture_output=True, text=True, timeout=5).stdout.strip().split(",")
            vals = [float(v) if v.strip() not in ("", "[N/A]", "N/A") else float("nan") for v in out]
            return dict(zip(self.FIELDS, vals))

        try:
            read_smi()
        except Exception as err:  # the tool exists but cannot read this GPU
            return None, f"nvidia-smi failed: {type(err).__name__}: {err}"
        return read_smi, "nvidia-smi"

    def mark(self, label: str) -> None:
        """Name the samples taken from now on ``label`` (one phase of a benchmark)."""
        self._label = str(label)

    def __enter__(self):
        self._read, why = self._reader()
        if self._read is None:
            self.absent = why
            return self
        self.source = why
        self._stop = threading.Event()

        def loop():
            while not self._stop.is_set():
                try:
                    self.samples.append((self._label, self._read()))
                except Exception:  # a failed read is a missing sample, not a failed benchmark
                    pass
                self._stop.wait(self.interval)

        self._thread = threading.Thread(target=loop, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc):
        if self._thread is not None:
            self._stop.set()
            self._thread.join(timeout=10)
        return False

    def summary(self, label: str | None = None) -> dict:
        """Mean, min and max of each field over the samples (of ``label`` only, when given)."""
        if self.source is None:
            return {"source": None, "absent": self.absent or "the sampler did not run"}
        rows = [v for lab, v in self.samples if label is None or lab == label]
        out = {"source": self.source, "samples": len(rows)}
        for f in self.FIELDS:
            vals = [r[f] for r in rows if f in r and math.isfinite(r[f])]
            out[f] = {"mean": sum(vals) / len(vals), "min": min(vals), "max": max(vals)} if vals else None
        return out


# ============================================================================ what a step does on the host
#: The ATen operator that copies one element to the host (``Tensor.item()``, ``float(t)``, ``bool(t)``): on CUDA
#: it waits for the device, so a training step that calls it cannot run ahead of the GPU.
READBACK_OP = "aten::_local_scalar_dense"


def count_ops(fn: Callable[[], object]) -> dict:
    """The ATen operators that ``fn()`` dispatches, counted by name ("aten::mm", …): forward, backward and the
    optimizer alike (a ``TorchDispatchMode``, below autograd).  ``count_ops(step)[READBACK_OP]`` is how often the
    step reads a value back to the host.

    Returns a dict name → count (a ``collections.Counter``).  Raises TypeError when ``fn`` is not callable.
    """
    if not callable(fn):
        raise TypeError(f"fn must be callable, got {type(fn).__name__}")
    counts: Counter = Counter()

    class _Count(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            counts[f"aten::{func.overloadpacket.__name__}"] += 1
            return func(*args, **(kwargs or {}))

    with _Count():
        fn()
    return counts


def _union_seconds(intervals) -> float:
    """Total length of the union of (start, end) intervals (seconds)."""
    total, end = 0.0, -float("inf")
    for a, b in sorted(intervals):
        if b <= end:
            continue
        total += b - max(a, end)
        end = b
    return total


def profile_steps(fn: Callable[[], object], steps: int, device: DeviceLike = None, *, top: int = 12) -> dict:
    """Run ``fn()`` ``steps`` times under ``torch.profiler`` and say where the time went.

    Returns a dict:

    * "wall_seconds": the window, from before the first call to after the last (the device synchronised);
    * "device_busy_seconds", "busy_fraction": the union of the device's kernel, copy and set intervals, and its
      share of the window (None on a CPU, which has no separate device);
    * "sync_seconds": host time spent waiting in CUDA synchronisations (``cudaStreamSynchronize``,
      ``cudaDeviceSynchronize``, ``cudaEventSynchronize``; 0 on a CPU); "host_seconds_per_step": (wall − sync) /
      steps, the time the host needs to issue one call;
    * "readbacks_per_step": calls of :data:`READBACK_OP` per call;
    * "kernels_per_step": device kernels per call (CUDA) or ATen operators per call (CPU);
    * "kernels": the ``top`` most frequent kernel names (ATen operators on a CPU) → {"count", "seconds"}; "what":
      "CUDA kernels" or "CPU ATen operators".

    Raises TypeError when ``fn`` is not callable, ValueError for ``steps`` < 1.
    """
    if not callable(fn):
        raise TypeError(f"fn must be callable, got {type(fn).__name__}")
    if not isinstance(steps, int) or isinstance(steps, bool) or steps < 1:
        raise ValueError(f"steps must be an int ≥ 1, got {steps!r}")
    device = default_device() if device is None else torch.device(device)
    cuda = device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    _sync(device)
    with profile(activities=activities) as prof:
        t0 = time.perf_counter()
        for _ in range(steps):
            fn()
        _sync(device)
        wall = time.perf_counter() - t0
    events = prof.events()
    readbacks = sum(1 for e in events if e.name == READBACK_OP)
    kernels: dict = {}
    busy = []
    sync = 0.0
    for e in events:
        dev = str(getattr(e, "device_type", "")).endswith("CUDA")
        if cuda and dev:
            busy.append((e.time_range.start, e.time_range.end))
            if "emcpy" in e.name or "emset" in e.name:
                continue
        elif cuda or not e.name.startswith("aten::"):
            if cuda and e.name in ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize"):
                sync += (e.time_range.end - e.time_range.start) / 1e6
            continue
        entry = kernels.setdefault(e.name, {"count": 0, "seconds": 0.0})
        entry["count"] += 1
        entry["seconds"] += (e.time_range.end - e.time_range.start) / 1e6
    busy_s = _union_seconds(busy) / 1e6 if cuda else None
    ranked = dict(sorted(kernels.items(), key=lambda kv: (-kv[1]["count"], kv[0]))[:top])
    return {
        "steps": steps,
        "wall_seconds": wall,
        "device_busy_seconds": busy_s,
        "busy_fraction": None if busy_s is None else min(1.0, busy_s / wall),
        "sync_seconds": sync,
        "host_seconds_per_step": max(0.0, wall - sync) / steps,
        "readbacks_per_step": readbacks / steps,
        "kernels_per_step": sum(k["count"] for k in kernels.values()) / steps,
        "kernels": ranked,
        "what": "CUDA kernels" if cuda else "CPU ATen operators",
    }


def profile_calls(calls: dict, device: DeviceLike = None) -> dict:
    """Run each callable of ``calls`` (label → callable with no arguments) once, in order, in one
    ``torch.profiler`` window, and say which kernels each launched: each call runs inside
    ``torch.profiler.record_function(label)`` and is synchronised before its range closes, so every kernel that
    starts inside the range is its own.

    Returns dict label → {"result": what the call returned, "kernels": [kernel names, in launch order, repeats
    removed]} (on a CPU the ATen operators the call ran).  Raises TypeError for a non-dict or a non-callable
    value, ValueError for a label that is not a non-empty str.
    """
    if not isinstance(calls, dict) or not all(callable(f) for f in calls.values()):
        raise TypeError("calls must be a dict of label → callable")
    if not all(isinstance(k, str) and k for k in calls):
        raise ValueError("every label of calls must be a non-empty str")
    device = default_device() if device is None else torch.device(device)
    cuda = device.type == "cuda"
    results = {}
    _sync(device)
    with profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])) as prof:
        for label, fn in calls.items():
            with record_function(label):
                results[label] = fn()
                _sync(device)
    events = prof.events()
    ranges = {e.name: (e.time_range.start, e.time_range.end) for e in events if e.name in calls}
    out = {label: {"result": results[label], "kernels": []} for label in calls}
    for e in sorted(events, key=lambda e: e.time_range.start):
        on_device = str(getattr(e, "device_type", "")).endswith("CUDA")
        # a label's own range shows on the device's timeline too (a GPU user annotation): it is no kernel
        if e.name in calls or (cuda and not on_device) or (not cuda and not e.name.startswith("aten::")):
            continue
        for label, (a, b) in ranges.items():
            if a <= e.time_range.start <= b:
                if e.name not in out[label]["kernels"]:
                    out[label]["kernels"].append(e.name)
                break
    return out


# ===================================================================================== memory per parameter
#: ZeRO's accounting of mixed-precision training with Adam (Rajbhandari et al. 2020, §3.1): per parameter, an
#: FP16 copy of the parameters (2 bytes) and of the gradients (2), and the optimizer states: an FP32 copy of the
#: parameters (4), momentum (4) and variance (4): "2Ψ + 2Ψ + KΨ = 16Ψ bytes", K = 12.
ZERO_BYTES_PER_PARAMETER = {
    "16-bit parameters": 2,
    "16-bit gradients": 2,
    "FP32 master parameters": 4,
    "momentum": 4,
    "variance": 4,
}

#: The trainings of :func:`memory_per_parameter`: "fp32" (FP32 parameters, gradients and Adam), "amp" (FP32
#: parameters and Adam, the forward under float16 autocast, ``torch.amp.GradScaler``), "bf16_master" (BF16
#: parameters and gradients, FP32 master copies that Adam updates, one tensor at a time, and copies back).
MEMORY_MODES = ("fp32", "amp", "bf16_master")


def _adam(params, device: torch.device):
    """Adam, fused where this torch has it for the device (no multi-tensor temporaries), else the default."""
    try:
        return torch.optim.Adam(params, lr=1e-4, fused=True), "Adam(fused=True)"
    except (RuntimeError, TypeError, ValueError):  # pragma: no cover - a device without fused Adam
        return torch.optim.Adam(params, lr=1e-4), "Adam"


def memory_per_parameter(
    mode: str, width: int, layers: int, batch: int, steps: int = 2, device: DeviceLike = None
) -> dict:
    """Train a stack of ``layers`` × ``Linear(width, width)`` (ReLU between) with Adam for ``steps`` steps in
    ``mode`` (one of :data:`MEMORY_MODES`) and measure its memory per parameter.

    On CUDA the caching allocator's counters: ``memory_allocated`` after the last optimizer step, gradients
    still held ("resident": the model states), and ``max_memory_allocated`` since a reset before the model was
    built ("peak": activations, autocast's casts and the optimizer's temporaries too).  On a CPU the same two
    quantities from the live tensor storage (:class:`track_peak_memory`).  Each is also split by what the tensors
    are (parameters, gradients, master parameters, optimizer state), in bytes per parameter, to set beside
    :data:`ZERO_BYTES_PER_PARAMETER`.

    Returns dict: "mode", "parameters", "optimizer", "resident_bytes", "peak_bytes", "resident_per_parameter",
    "peak_per_parameter", "breakdown_per_parameter" {"parameters", "gradients", "master parameters",
    "optimizer state"}, "loss" (the last step's, finite), "method".

    Raises ValueError for an unknown mode or sizes < 1.
    """
    if mode not in MEMORY_MODES:
        raise ValueError(f"mode must be one of {MEMORY_MODES}, got {mode!r}")
    for name, v in (("width", width), ("layers", layers), ("batch", batch), ("steps", steps)):
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise ValueError(f"{name} must be an int ≥ 1, got {v!r}")
    device = default_device() if device is None else torch.device(device)
    cuda = device.type == "cuda"
    out: dict = {"mode": mode}

    def nbytes(ts) -> int:
        return sum(t.numel() * t.element_size() for t in ts if t is not None)

    def train() -> None:
        torch.manual_seed(0)
        mods = []
        for i in range(layers):
            mods.append(torch.nn.Linear(width, width, device=device))
            if i < layers - 1:
                mods.append(torch.nn.ReLU())
        model = torch.nn.Sequential(*mods)
        masters, opts = [], []
        if mode == "bf16_master":
            model.to(torch.bfloat16)
            params = list(model.parameters())
            masters = [p.detach().float() for p in params]
            for m in masters:
                m.requires_grad_(True)
            opts = [_adam([m], device)[0] for m in masters]  # one tensor at a time: no FP32 gradient set
            out["optimizer"] = f"{_adam([masters[0]], device)[1]} on FP32 master copies, one tensor at a time"
        else:
            params = list(model.parameters())
            opt, out["optimizer"] = _adam(params, device)
        scaler = torch.amp.GradScaler(device.type) if mode == "amp" else None
        x = torch.randn(batch, width, device=device)
        for _ in range(steps):
            for p in params:
                p.grad = None
            inp = x.to(torch.bfloat16) if mode == "bf16_master" else x
            if mode == "amp":
                with torch.autocast(device.type, dtype=torch.float16):
                    loss = model(inp).float().pow(2).mean()
                scaler.scale(loss).backward()
                scaler.step(opt)
                scaler.update()
            else:
                loss = model(inp).float().pow(2).mean()
                loss.backward()
                if mode == "fp32":
                    opt.step()
                else:
                    with torch.no_grad():
                        for p, m, o in zip(params, masters, opts):
                            m.grad = p.grad.float()
                            o.step()
                            m.grad = None
                            p.copy_(m)
        _sync(device)
        states = [
            t
            for o in ([opt] if not opts else opts)
            for st in o.state.values()
            for t in st.values()
            if isinstance(t, torch.Tensor) and t.dim() > 0
        ]
        out["breakdown_bytes"] = {
            "parameters": nbytes(params),
            "gradients": nbytes(p.grad for p in params),
            "master parameters": nbytes(masters),
            "optimizer state": nbytes(states),
        }
        out["parameters"] = sum(p.numel() for p in params)
        out["loss"] = float(loss.detach())
        if cuda:
            out["resident_bytes"] = torch.cuda.memory_allocated(device) - out["_base"]
        else:
            out["resident_bytes"] = sum(out["breakdown_bytes"].values())

    if cuda:
        _sync(device)
        torch.cuda.empty_cache()
        out["_base"] = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        train()
        out["peak_bytes"] = torch.cuda.max_memory_allocated(device) - out.pop("_base")
        out["method"] = "torch.cuda.memory_allocated / max_memory_allocated since a reset before the model was built"
        torch.cuda.empty_cache()
    else:
        with track_peak_memory("cpu") as t:
            train()
        out["peak_bytes"] = t.peak_bytes
        out["method"] = (
            "CPU: resident = the bytes of parameters, gradients, master copies and optimizer state; "
            "peak = live tensor storage made inside the run (track_peak_memory)"
        )
    n = out["parameters"]
    out["resident_per_parameter"] = out["resident_bytes"] / n
    out["peak_per_parameter"] = out["peak_bytes"] / n
    out["breakdown_per_parameter"] = {k: v / n for k, v in out.pop("breakdown_bytes").items()}
    return out


def checkpoint_bytes(model: torch.nn.Module, dtype: torch.dtype = torch.float32) -> int:
    """Bytes of ``torch.save(state_dict)`` written to memory, floating-point tensors cast to ``dtype``
    (integer buffers such as BatchNorm's ``num_batches_tracked`` are kept)."""
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    sd = {
        k: (v.detach().to("cpu", dtype) if v.is_floating_point() else v.detach().cpu())
        for k, v in model.state_dict().items()
    }
    buf = io.BytesIO()
    torch.save(sd, buf)
    return buf.getbuffer().nbytes
