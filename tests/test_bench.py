"""mpt_lab.bench on a CPU: timing statistics, CUDA-only options, the CPU peak-memory method, matmul throughput."""

import time

import pytest
import torch

from mpt_lab import bench

torch.set_num_threads(1)


def test_time_call_statistics_and_cpu_sync_is_noop():
    calls = []
    t = bench.time_call(lambda: (calls.append(1), time.sleep(0.002)), repeat=5, warmup=2, device="cpu")
    assert len(calls) == 7 and len(t.times) == 5 and t.warmup == 2
    assert t.min <= t.median <= t.max and t.min >= 0.002
    assert t.method == "wall"
    d = t.as_dict()
    assert d["median"] == t.median and d["times"] == list(t.times) and d["method"] == "wall"
    # "auto" is the wall clock on a CPU; positional construction still works (used by benchmarks/)
    assert bench.time_call(lambda: None, repeat=2, warmup=0, device="cpu", timer="auto").method == "wall"
    assert bench.Timing((1.0, 3.0, 2.0), 1).median == 2.0


def test_time_call_rejects_bad_arguments():
    with pytest.raises(ValueError, match="timer"):
        bench.time_call(lambda: None, timer="stopwatch")
    with pytest.raises(ValueError, match="CUDA"):
        bench.time_call(lambda: None, device="cpu", timer="cuda_event")
    with pytest.raises(TypeError):
        bench.time_call(None)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_event_timer():  # pragma: no cover - runs on the GPU machine
    a = torch.randn(1024, 1024, device="cuda")
    t = bench.time_call(lambda: a @ a, repeat=3, warmup=1, device="cuda", timer="cuda_event")
    assert t.method == "cuda_event" and all(x > 0 for x in t.times)
    peak = bench.peak_memory(lambda: torch.empty(10 * 2**20, dtype=torch.uint8, device="cuda"), "cuda")
    assert 10 * 2**20 <= peak < 20 * 2**20


def test_peak_memory_known_allocation_on_cpu():
    nbytes = 10 * 2**20

    def fn():
        x = torch.empty(nbytes, dtype=torch.uint8)
        x.fill_(1)  # in place: same storage, not counted twice
        return x.sum()

    peak = bench.peak_memory(fn, "cpu")
    assert nbytes <= peak < 2 * nbytes


def test_peak_memory_counts_frees_and_not_preexisting():
    outside = torch.randn(2**20)  # 4 MiB that exist before: not counted

    def fn():
        x = torch.randn(2**20)  # 4 MiB
        y = x * 2  # 8 MiB live
        del x  # 4 MiB live
        z = y + outside  # 8 MiB live again: the peak stays 8 MiB
        return z

    peak = bench.peak_memory(fn)
    assert 8 * 2**20 <= peak < 9 * 2**20
    # backward and the optimizer are seen too
    lin = torch.nn.Linear(256, 256)
    x = torch.randn(64, 256)
    peak = bench.peak_memory(lambda: lin(x).square().sum().backward())
    assert peak >= 256 * 256 * 4  # the weight gradient at least
    with bench.track_peak_memory("cpu") as t:
        torch.zeros(1000)
    assert t.peak_bytes == 4000


def test_peak_memory_bad_input():
    with pytest.raises(TypeError):
        bench.peak_memory(3)
    with pytest.raises(TypeError):
        bench.track_peak_memory(3.0)
    with pytest.raises(ValueError):
        bench.track_peak_memory("meta")


def test_matmul_peak_tflops_positive():
    for dt in (torch.float32, torch.bfloat16):
        tf = bench.matmul_peak_tflops("cpu", dt, n=128, repeat=2, min_seconds=0.01)
        assert 0 < tf < 100
    assert bench.matmul_peak_tflops("cpu", torch.float16, n=64, layout="nt", repeat=1, min_seconds=0.005) > 0
    with pytest.raises(TypeError):
        bench.matmul_peak_tflops("cpu", torch.int32, n=8)
    with pytest.raises(ValueError):
        bench.matmul_peak_tflops("cpu", torch.float32, n=0)
    with pytest.raises(ValueError):
        bench.matmul_peak_tflops("cpu", torch.float32, n=8, layout="tt")


def test_peak_memory_sees_exact_arithmetic_and_simulated_ops():
    """formats' exact_arithmetic marker only tells low-precision emulation to stand aside: the storage
    tracker (another dispatch mode) still counts what round_to and a simulate block allocate."""
    from mpt_lab.formats import round_to
    from mpt_lab.simulate import simulate

    x = torch.randn(2**18)  # 1 MiB, made before: not counted
    assert bench.peak_memory(lambda: round_to(x, "FP16")) >= x.nbytes  # at least its result
    with simulate("FP16", mode="all"):
        peak = bench.peak_memory(lambda: x * 3.0)
    assert peak >= x.nbytes


def test_profile_calls_names_each_calls_own_operators_and_not_its_label():
    """On a CPU each label gets the ATen operators its call ran, in launch order, repeats removed; the label's own
    profiler range (on CUDA also drawn on the device's timeline) is never listed as one of them."""
    from mpt_lab.bench import profile_calls

    x = torch.ones(8)
    out = profile_calls({"add": lambda: x + 1, "mul twice": lambda: (x * 2) * 3}, device="cpu")
    assert torch.equal(out["add"]["result"], x + 1) and torch.equal(out["mul twice"]["result"], x * 6)
    assert "aten::add" in out["add"]["kernels"] and "aten::mul" not in out["add"]["kernels"]
    assert out["mul twice"]["kernels"].count("aten::mul") == 1
    assert not any(name in ("add", "mul twice") for o in out.values() for name in o["kernels"])
    with pytest.raises(TypeError, match="calls"):
        profile_calls([lambda: x], device="cpu")
    with pytest.raises(ValueError, match="label"):
        profile_calls({"": lambda: x}, device="cpu")
