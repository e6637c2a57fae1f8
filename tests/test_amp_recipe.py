"""The AMP recipe experiment in a tiny configuration on a CPU."""

import dataclasses
import math

import pytest
import torch

from mpt_lab import figures
from mpt_lab.autocast import RECIPE_OPS, probe_autocast
from mpt_lab.experiments import amp_recipe as ar

torch.set_num_threads(1)


def tiny(**kw):
    cfg = dataclasses.replace(ar.config_for("quick"), width=32, num_layers=2, batch_sizes=(8, 9), num_batches=2,
                              epochs=2, warmup_epochs=1, peak_n=64, device="cpu")
    return dataclasses.replace(cfg, **kw)


@pytest.fixture(scope="module")
def result():
    return ar.run(tiny(), progress=False)


def test_runs_all_precisions(result):
    assert {(r["precision"], r["batch"]) for r in result.rows} == {(p, b) for p in ar.RECIPES for b in (8, 9)}
    assert set(result.matmul_tflops) == {"float32", "float16", "bfloat16"}
    assert all(v > 0 for v in result.matmul_tflops.values())
    for r in result.rows:
        assert r["epoch_seconds"] > 0 and len(r["epoch_times"]) == 2
        assert r["peak_bytes"] > 0
        assert math.isfinite(r["tflops"]) and r["tflops"] > 0
        assert math.isfinite(r["fraction_of_peak"]) and r["fraction_of_peak"] > 0
    assert set(result.speedup) == {"fp16", "bf16"}
    for p in ("fp16", "bf16"):
        assert set(result.speedup[p]) == {"8", "9"}
        assert all(math.isfinite(v) and v > 0 for v in result.speedup[p].values())
    assert "float16" in result.note and result.provenance["config"]["width"] == 32
    assert "fp16" in result.describe() and "cpu_flags" in result.provenance


def test_save_load_identical(result, tmp_path):
    p = result.save(tmp_path / "amp.json")
    back = ar.AmpRecipeResult.load(p)
    assert back == result
    assert back.save(tmp_path / "again.json").read_text() == p.read_text()
    with pytest.raises(ValueError):
        ar.AmpRecipeResult.from_dict({"experiment": "other"})


def test_flop_count_formula():
    assert ar.flops_per_step(512, 4096, 3) == 6 * 512 * 4096 * 4096 * 3
    # the forward part (2·b·i·o per Linear) agrees with a direct count of the multiply-adds
    b, w = 5, 7
    model = ar.make_model(w, 3)
    linears = [m for m in model if isinstance(m, torch.nn.Linear)]
    assert len(linears) == 3 and all(isinstance(m, torch.nn.ReLU) for m in list(model)[1::2])
    assert sum(2 * b * m.in_features * m.out_features for m in linears) * 3 == ar.flops_per_step(b, w, 3)


@pytest.mark.parametrize("field,value", [("width", 0), ("batch_sizes", ()), ("batch_sizes", (8, -1)),
                                         ("precisions", ("fp8",)), ("precisions", ("bf16",)),
                                         ("epochs", 0), ("warmup_epochs", -1), ("lr", 0.0)])
def test_bad_config_raises(field, value):
    with pytest.raises(ValueError, match=field):
        ar.run(tiny(**{field: value}), progress=False)


def test_bad_types_and_profiles():
    with pytest.raises(TypeError):
        ar.run({"width": 8}, progress=False)
    with pytest.raises(ValueError):
        ar.config_for("huge")
    full = ar.config_for("full")
    assert (full.width, full.num_layers, full.num_batches, full.epochs, full.lr) == (4096, 3, 50, 3, 0.001)
    assert tuple(full.batch_sizes) == (128, 256, 512, 513)


def test_speedup_table(result):
    html = figures.speedup_table({"tiny": result})
    assert html.count("<tr>") == 1 + len(result.rows) and html.count("<table") == 1
    assert "<caption>tiny: CPU" in html and "2 × Linear(32, 32)" in html        # the run, named above its table
    two = figures.speedup_table({"a": result, "b": result})
    assert two.count("<table") == 2 and two.count("<tr>") == 2 * (1 + len(result.rows))
    assert "<caption>saved run" in figures.speedup_table(result)                 # as show_saved passes it
    assert html.count("</th>") == 7                                              # narrow enough for the column
    with pytest.raises(TypeError):
        figures.speedup_table({"x": 1})
    with pytest.raises(TypeError):
        figures.speedup_table({})


def test_bf16_needs_no_scaler():
    """The recipe pairs a GradScaler with FP16 only: BF16 has FP32's exponent range (chapter 3's rule)."""
    assert ar.needs_scaler(torch.float16) and not ar.needs_scaler(torch.bfloat16)
    assert not ar.needs_scaler(torch.float32)
    with pytest.raises(TypeError, match="dtype"):
        ar.needs_scaler("float16")
    scalers = {}
    real = ar._make

    def spy(config, precision, device):
        out = real(config, precision, device)
        scalers[precision] = out[2]
        return out

    import unittest.mock

    with unittest.mock.patch.object(ar, "_make", spy):
        ar.run(tiny(batch_sizes=(8,), measure_memory=False), progress=False)
    assert scalers["fp32"] is None and scalers["bf16"] is None and scalers["fp16"] is not None


def test_autocast_probe():
    p = probe_autocast("cpu", torch.bfloat16)
    assert p["linear"] == "bfloat16" and p["cross_entropy"] == "float32" and p["relu"] == "float32"
    # with float16 inputs CUDA runs softmax in float32 and the CPU does not: the probe tells the policies apart
    cpu, cuda = (probe_autocast(d, torch.float16, input_dtype=torch.float16, ops=RECIPE_OPS) for d in ("cpu", "cuda"))
    assert cpu["softmax"] == "float16" and cuda["softmax"] == "float32" and cuda.method == "fake CUDA tensors"
    assert set(cpu.ops) == set(RECIPE_OPS) and not any(v.startswith("error") for v in cuda.ops.values())
    with pytest.raises(ValueError, match="device_type"):
        probe_autocast("tpu")
    with pytest.raises(TypeError, match="dtype"):
        probe_autocast("cpu", torch.float32)
    with pytest.raises(TypeError, match="input_dtype"):
        probe_autocast("cpu", torch.float16, input_dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="ops"):
        probe_autocast("cpu", ops=("conv7d",))


def test_autocast_lists_read_from_the_dispatcher():
    """The lists agree with what the probe measures, op by op, and with the torch.amp documentation's groups."""
    from mpt_lab.autocast import POLICIES, autocast_lists

    cuda, cpu = autocast_lists("cuda", torch.float16), autocast_lists("cpu", torch.float16)
    assert set(POLICIES) <= set(cuda.lists) and cuda.device_type == "cuda" and cuda.dtype == "float16"
    for lists in (cuda, cpu):
        names = [op for ops in lists.lists.values() for op in ops]
        assert len(names) == len(set(names))                                  # every op in one group only
        for op in ("mm", "matmul", "linear", "conv2d", "addmm", "bmm"):
            assert lists.policy(op) == "lower_precision", op
        for op in ("mse_loss", "nll_loss", "l1_loss"):
            assert lists.policy(op) == "float32", op
        for op in ("relu", "add", "mul", "elu", "mean", "var", "batch_norm"):
            assert lists.policy(op) == "not listed", op
    # CUDA runs exponentials, logs, sums and some normalisations in float32; the CPU's float32 list lacks them
    for op in ("exp", "log", "softmax", "log_softmax", "sum", "layer_norm", "group_norm"):
        assert cuda.policy(op) == "float32" and cpu.policy(op) == "not listed", op
    assert {"addcmul", "addcdiv", "atan2", "dot", "index_put", "scatter_add", "tensordot"} <= set(cuda["promote"])
    assert {"cat", "stack", "index_copy"} <= set(cpu["promote"])
    assert "binary_cross_entropy" in cuda["banned"] and cpu.policy("binary_cross_entropy") == "float32"
    assert cuda.policy("aten::softmax.int") == "float32" and cpu.policy("aten::softmax.int") == "not listed"
    # the probe's dtypes follow from the lists: float16 inputs, one op each
    single = {"exp": "exp", "sum": "sum", "softmax": "softmax", "log_softmax": "log_softmax", "relu": "relu",
              "layer_norm": "layer_norm", "elu": "elu", "expm1": "expm1", "mean": "mean", "var": "var",
              "batch_norm": "batch_norm", "add (x + x)": "add"}
    for device, lists in (("cuda", cuda), ("cpu", cpu)):
        probe = probe_autocast(device, torch.float16, input_dtype=torch.float16, ops=tuple(single))
        for name, aten in single.items():
            expected = "float32" if lists.policy(aten) == "float32" else "float16"
            assert probe[name] == expected, (device, name)
    with pytest.raises(ValueError, match="device_type"):
        autocast_lists("tpu")
    with pytest.raises(TypeError, match="dtype"):
        autocast_lists("cuda", torch.float32)
    with pytest.raises(TypeError, match="op"):
        cuda.policy(3)


def test_autocast_lists_table():
    import re

    from mpt_lab import figures
    from mpt_lab.autocast import autocast_lists

    lists = {"CUDA": autocast_lists("cuda", torch.float16), "CPU": autocast_lists("cpu", torch.float16)}
    t = figures.autocast_lists_table(lists)
    for group in ("lower_precision", "float32", "promote", "banned", "not listed"):
        assert group in t
    assert f"({len(lists['CUDA']['float32'])} ops)" in t and "softmax" in t and "cat, index_copy, stack" in t
    examples = re.search(r"every other op \(([^)…]*)", t).group(1).rstrip(", ").split(", ")
    assert all(l.policy(op) == "not listed" for l in lists.values() for op in examples), examples
    with pytest.raises(TypeError, match="lists"):
        figures.autocast_lists_table({})
