"""mpt_lab.experiments.memory_tradeoffs and mpt_lab.models.resnet: the CPU memory counter, lossless
checkpointing, checkpoint sizes, and a tiny run of all four ways."""

import copy
import dataclasses

import pytest
import torch
import torch.nn.functional as F

from mpt_lab import figures
from mpt_lab.bench import MEMORY_MODES, ZERO_BYTES_PER_PARAMETER, checkpoint_bytes, memory_per_parameter, peak_memory
from mpt_lab.experiments import memory_tradeoffs as mt
from mpt_lab.models.resnet import ResNet, build_resnet


def test_peak_memory_counts_live_tensors_on_cpu():
    n = 4 * 2**20

    def f():
        a = torch.ones(n // 4)  # float32 → n bytes
        b = a * 2  # another n while a is alive
        del a
        return float(b.sum())

    peak = peak_memory(f, "cpu")
    assert 2 * n <= peak < 3 * n


def test_checkpointing_is_lossless():
    torch.use_deterministic_algorithms(True)
    try:
        m = build_resnet(4, 2, 2, seed=0)
        c = copy.deepcopy(m)
        c.checkpoint = True
        x, y = torch.randn(8, 1, 8, 8), torch.randint(0, 10, (8,))
        lm, lc = F.cross_entropy(m(x), y), F.cross_entropy(c(x), y)
        lm.backward()
        lc.backward()
    finally:
        torch.use_deterministic_algorithms(False)
    assert torch.equal(lm, lc)
    for (name, a), b in zip(m.named_parameters(), c.parameters()):
        assert torch.equal(a.grad, b.grad), name
    # the recomputation must not update the BatchNorm running statistics twice
    for a, b in zip(m.buffers(), c.buffers()):
        assert torch.equal(a, b)


def test_resnet_shapes_and_bad_args():
    m = ResNet(width=4, stages=3, depth=1)
    assert m(torch.randn(2, 1, 16, 16)).shape == (2, 10)
    with pytest.raises(ValueError, match="width"):
        ResNet(width=0)
    with pytest.raises(ValueError, match="depth"):
        ResNet(depth=1.5)


def test_step_flops_counts_the_recomputed_forward():
    m = build_resnet(_tiny().width, 2, 1, seed=0)
    x, y = torch.randn(8, 1, 8, 8), torch.randint(0, 10, (8,))
    step, fwd = mt.step_flops(m, x, y)
    c = copy.deepcopy(m)
    c.checkpoint = True
    step_c, fwd_c = mt.step_flops(c, x, y)
    assert fwd_c == fwd and fwd < step < step_c <= step + fwd  # backward ≈ 2 forwards; + the recomputation
    assert all(p.grad is None for p in m.parameters())  # leaves no gradients behind
    assert mt.step_flops(m, x, y, torch.bfloat16) == (step, fwd)  # autocast changes the dtype, not the work
    with pytest.raises(TypeError, match="model"):
        mt.step_flops("resnet", x, y)


def test_checkpoint_fp16_is_about_half():
    m = build_resnet(16, 3, 1, seed=0)
    b32, b16 = checkpoint_bytes(m), checkpoint_bytes(m, torch.float16)
    assert 0.45 < b16 / b32 < 0.6
    with pytest.raises(TypeError, match="model"):
        checkpoint_bytes("not a model")


def _tiny():
    # width 8, not less: oneDNN's AVX2 1x1 convolution (jit_1x1:avx2) computes the channels-last weight gradient of
    # a strided 1x1 shortcut with fewer than 8 input channels past its workspace (oneDNN issue 6035): on this
    # project's Intel Xeon with ONEDNN_MAX_CPU_ISA=AVX2 the channels_last layout timing of a width-4 model corrupted
    # the heap ("corrupted double-linked list") and killed the test worker
    return dataclasses.replace(
        mt.config_for("quick"), image_size=8, width=8, stages=2, batch_size=16, repeat=1, warmup=1, epochs=1
    )


def test_tiny_run_all_ways_and_json_roundtrip(tmp_path):
    r = mt.run(_tiny(), progress=False)
    assert list(r.ways) == list(mt.WAYS)
    for w in r.ways.values():
        assert w["peak_bytes"] > 0 and w["step_seconds"] > 0
    assert r.ways["checkpoint"]["bit_identical"] is True
    assert r.ways["fp32"]["memory_saved"] == 0.0
    assert r.mixed_dtype == "bfloat16" and "bfloat16" in r.mixed_note
    assert set(r.training) == {"fp32", "mixed"} and 0 <= r.training["mixed"]["accuracy"] <= 1
    p = r.save(tmp_path / "r.json")
    back = mt.MemoryTradeoffsResult.load(p)
    assert back == r and "memory trade-offs" in back.describe()
    # the work of a step, counted: recomputation adds about one forward pass, lower precision adds none
    w = r.ways
    extra = (w["checkpoint"]["step_flops"] - w["fp32"]["step_flops"]) / w["fp32"]["forward_flops"]
    assert 0.9 <= extra <= 1.0 and w["mixed"]["step_flops"] == w["fp32"]["step_flops"]
    assert w["mixed+checkpoint"]["step_flops"] == w["checkpoint"]["step_flops"]
    assert all(v["forward_flops"] == w["fp32"]["forward_flops"] for v in w.values())
    # the tables and the figure, from the result object
    table = figures.tradeoff_table(r)
    assert table.count("<tr>") == 1 + 4 and table.count("</th>") == 7 and "1.00×" in table
    assert "<caption>The usual verdict: recomputation is lossless" in table
    t = figures.training_table(r)
    assert "MiB" in t and "90 MB as reported" in t and "85.8" not in t  # the source's MB quoted, not converted
    assert f"(the FP32 weights cast to {r.mixed_dtype} at save)" in t  # the mixed checkpoint is a cast at save
    b = r.breakdown
    n_params = sum(p.numel() for p in build_resnet(_tiny().width, 2, 1, seed=0).parameters())
    assert b["fp32"]["weights"] == b["mixed"]["weights"] == 4 * n_params == b["fp32"]["gradients"]
    assert b["fp32"]["optimizer_state"] == 4 * n_params  # SGD momentum buffers, FP32
    assert 0 < b["mixed"]["saved_for_backward"] < b["fp32"]["saved_for_backward"]
    assert figures.breakdown_table(r).count("<tr>") == 1 + 5
    for way in ("fp32", "mixed"):  # all that is saved for backward is alive at the end of the forward pass
        assert b[way]["saved_for_backward"] < r.ways[way]["peak_bytes"]
    assert 0.9 < r.ways["mixed"]["grad_cosine"] <= 1.0 and r.ways["fp32"]["grad_cosine"] == pytest.approx(1.0)
    fig = figures.plot_tradeoffs(r)
    assert fig._suptitle.get_text() and all(ax.get_title() and ax.get_ylabel() for ax in fig.axes)
    with pytest.raises(TypeError):
        figures.tradeoff_table({})


def test_bad_config_raises():
    with pytest.raises(ValueError, match="profile"):
        mt.config_for("huge")
    with pytest.raises(TypeError, match="config"):
        mt.run({"profile": "quick"}, progress=False)
    with pytest.raises(ValueError, match="batch_size"):
        mt.run(dataclasses.replace(_tiny(), batch_size=0), progress=False)
    with pytest.raises(ValueError, match="mixed_dtype"):
        mt.run(dataclasses.replace(_tiny(), mixed_dtype="float8"), progress=False)
    with pytest.raises(ValueError, match="image_size"):
        mt.run(dataclasses.replace(_tiny(), image_size=2, stages=3), progress=False)


def test_baseline_named_layouts_timed_and_the_fp16_exactness_pass_loss_scaled():
    """The FP32 way is named for what it computes (TF32 convolutions where cuDNN's default holds on CUDA; the saved
    GPU result predates the recorded switches and is read with PyTorch's defaults); the layout variants are timed
    with the switches restored; float16's exactness pass runs through a loss scale, against underflow of its small
    gradients (the pass counts no flushed elements)."""
    assert mt.baseline_name("cpu", None) == "FP32"
    assert mt.baseline_name("cuda", {"cudnn_allow_tf32": True}).startswith("TF32 convolutions")
    assert mt.baseline_name("cuda", {"cudnn_allow_tf32": False}) == "FP32 (cuDNN's TF32 off)"
    assert "not recorded" in mt.baseline_name("cuda", None)
    with pytest.raises(ValueError):
        mt.baseline_name("tpu", None)
    saved = mt.EXPERIMENT.saved("full")
    if saved is not None and "backends" not in saved.provenance:
        assert saved.baseline == "" and saved.baseline_label.startswith("TF32 convolutions")
        assert "fp32: TF32 convolutions" in figures.tradeoff_table(saved)
    before = (torch.backends.cudnn.benchmark, torch.backends.cudnn.allow_tf32)
    r = mt.run(dataclasses.replace(_tiny(), time_layouts=True, mixed_dtype="float16", epochs=1), progress=False)
    assert (torch.backends.cudnn.benchmark, torch.backends.cudnn.allow_tf32) == before
    assert (
        r.baseline == "FP32"
        and r.baseline_label == "FP32"
        and r.provenance["backends"]["cudnn_allow_tf32"] == before[1]
    )
    assert set(r.layouts) == {"fp32", "mixed"} and set(r.layouts["fp32"]) == set(mt.LAYOUTS)
    assert set(r.layouts["mixed"]) == set(mt.LAYOUTS) - {"TF32 off"}
    for way in r.layouts.values():
        for name, v in way.items():
            assert v["step_seconds"] > 0 and v["memory_format"] == mt.LAYOUTS[name][0]
            assert v["cudnn_benchmark"] == mt.LAYOUTS[name][1]
    assert r.layouts["fp32"]["TF32 off"]["cudnn_allow_tf32"] is False
    assert r.exactness_loss_scale == 2.0**16  # the tiny ResNet's gradients stay finite at GradScaler's start
    assert r.ways["mixed"]["grad_cosine"] > 0.99 and not r.ways["mixed"]["bit_identical"]
    # the tables of the layouts and of the exactness pass, from the result object
    t = figures.layouts_table(r)
    assert t.count("<tr>") == 1 + len(mt.LAYOUTS) and t.count("1.00×") >= 2 and "The FP32 way: FP32." in t
    e = figures.exactness_table(r)
    assert e.count("<tr>") == 1 + len(mt.WAYS) and "through the loss scale 2¹⁶" in e and "u = 2^-11" in e
    plain = mt.run(_tiny(), progress=False)
    assert plain.layouts == {}  # quick and cpu profiles leave the timings out
    with pytest.raises(ValueError, match="layout timings"):
        figures.layouts_table(plain)
    assert "none (loss scale 1)" in figures.exactness_table(plain) and "u = 2^-8" in figures.exactness_table(plain)
    assert "were allowed TF32" not in e  # a CPU run's FP32 way is FP32: no TF32 reference to name
    tf32 = dataclasses.replace(r, baseline="TF32 convolutions (cuDNN's default), FP32 storage")
    assert (
        "which keeps 11 significant bits of their inputs; if they used it, which this pass did not check"
        in figures.exactness_table(tf32)
    )
    for table in (figures.layouts_table, figures.exactness_table):
        with pytest.raises(TypeError, match="result"):
            table({"layouts": r.layouts})


def test_memory_per_parameter_table_from_a_real_run():
    """The bytes-per-parameter table from :func:`mpt_lab.bench.memory_per_parameter`'s dicts (a tiny stack on the
    CPU) beside ZeRO's accounting, one row each; bad input gets a clear error."""
    result = {
        "modes": {m: memory_per_parameter(m, 16, 2, 4, 2, "cpu") for m in MEMORY_MODES},
        "zero": {**ZERO_BYTES_PER_PARAMETER, "total": sum(ZERO_BYTES_PER_PARAMETER.values())},
        "config": {"width": 16, "layers": 2, "batch": 4, "steps": 2},
    }
    t = figures.memory_per_parameter_table(result)
    assert t.count("<tr>") == 1 + len(MEMORY_MODES) + 1 and t.count("</th>") == 8
    assert t.count(">16<") == len(MEMORY_MODES) + 1  # every way's tensors and ZeRO's accounting: 16 bytes
    assert "ZeRO's accounting" in t and "2 × Linear(16, 16)" in t and "AMP: FP32 weights" in t
    with pytest.raises(TypeError, match="result"):
        figures.memory_per_parameter_table({"modes": result["modes"]})
    with pytest.raises(ValueError, match="no modes"):
        figures.memory_per_parameter_table({"modes": {}, "zero": result["zero"]})


def test_backend_switches_table_names_each_switch_as_pytorch_does():
    """The switches a provenance records, under their PyTorch names, with what 'none' means; bad input raises."""
    from mpt_lab.device import backends, provenance
    from mpt_lab.figures.memory import BACKEND_SWITCHES, backend_switches_table

    prov = provenance(command="test")
    t = backend_switches_table(prov)
    recorded = backends()
    assert t.count("<tr>") == 1 + len(recorded)
    assert "torch.backends.cudnn.allow_tf32" in t and "torch.get_float32_matmul_precision()" in t
    assert "cudnn_allow_tf32" not in t  # the internal key never shows where PyTorch's name is known
    assert "&#x27;none&#x27; means not set" in t  # the caption, escaped
    assert set(recorded) <= set(BACKEND_SWITCHES)  # every switch this torch records has a PyTorch name here
    odd = backend_switches_table({"backends": {"some_new_switch": True}})
    assert "some_new_switch" in odd and "not described here" in odd
    with pytest.raises(TypeError, match="provenance"):
        backend_switches_table([("cudnn_allow_tf32", True)])
    with pytest.raises(TypeError, match="backends"):
        backend_switches_table({"device": "cpu"})
    with pytest.raises(ValueError, match="empty"):
        backend_switches_table({"backends": {}})
