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
    cfg = dataclasses.replace(
        ar.config_for("quick"),
        width=32,
        num_layers=2,
        batch_sizes=(8, 9),
        num_batches=2,
        epochs=2,
        warmup_epochs=1,
        peak_n=64,
        device="cpu",
    )
    return dataclasses.replace(cfg, **kw)


@pytest.fixture(scope="module")
def result():
    return ar.run(tiny(), progress=False)


def test_runs_all_recipes(result):
    assert {(r["recipe"], r["batch"]) for r in result.rows} == {(p, b) for p in ar.RECIPES for b in (8, 9)}
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


def test_flops_are_counted_from_the_ops_that_run():
    """FlopCounterMode over a real step: the first layer's input gradient is not computed, so a step of L layers
    is (6L − 2)·B·W², 12.5 % less than the old 6·B·W² per Linear at 3 layers; the meta-device count equals the
    count of a real step on the CPU."""
    from torch.utils.flop_counter import FlopCounterMode

    for layers in (1, 2, 3, 5):
        assert ar.counted_flops_per_step(8, 16, layers) == (6 * layers - 2) * 8 * 16 * 16
    assert ar.counted_flops_per_step(512, 4096, 3) / ar.flops_per_step(512, 4096, 3) == 16 / 18
    model = ar.make_model(16, 3)
    with FlopCounterMode(display=False) as counter:
        torch.nn.functional.mse_loss(model(torch.randn(8, 16)), torch.randn(8, 16)).backward()
    assert counter.get_total_flops() == ar.counted_flops_per_step(8, 16, 3)
    with pytest.raises(ValueError, match="batch"):
        ar.counted_flops_per_step(0, 16, 3)


def test_profiled_loop_and_the_gpu_limited_variant_on_a_cpu():
    """The CPU path of the new measurements: the eager loop's profile (host time per step, read-backs: one per
    FP16 step, GradScaler's found_inf) and the variant with static buffers and fused SGD, which reads nothing
    back; on a CPU it runs uncaptured and has no datasheet peak."""
    r = ar.run(
        tiny(
            batch_sizes=(8,), profile_steps=2, graph_batches=(8, 16), graph_steps=2, graph_pool=2, measure_memory=False
        ),
        progress=False,
    )
    assert r.flops_convention == ar.COUNTED_FLOPS and r.datasheet is None
    for row in r.rows:
        assert row["flops_per_step"] == ar.counted_flops_per_step(8, 32, 2)
        assert row["tflops"] == pytest.approx(row["flops_per_step"] / row["step_seconds"] / 1e12)
        assert row["host_seconds_per_step"] > 0 and row["busy_fraction"] is None and row["kernels_per_step"] > 10
        assert row["readbacks_per_step"] == (1.0 if row["recipe"] == "fp16" else 0.0)
        assert row["fraction_of_datasheet_peak"] is None
    assert {(g["recipe"], g["batch"]) for g in r.graphed} == {(p, b) for p in ar.RECIPES for b in (8, 16)}
    for g in r.graphed:
        assert g["captured"] == "eager" and g["step_seconds"] > 0 and len(g["step_times"]) == 2
        assert g["readbacks_per_step"] == 0.0  # fused SGD: found_inf stays on the device
        assert g["flops_per_step"] == ar.counted_flops_per_step(g["batch"], 32, 2)
    assert set(r.graphed_speedup) == {"fp16", "bf16"} and set(r.graphed_speedup["fp16"]) == {"8", "16"}
    assert "limited by the device (eager)" in r.describe()
    html = figures.speedup_table(r)
    assert "of measured matmul peak" in html and "datasheet" not in html and ar.COUNTED_FLOPS[:20] in html
    with pytest.raises(ValueError, match="capture"):
        ar.run(tiny(capture="sometimes"), progress=False)
    with pytest.raises(ValueError, match="graph_batches"):
        ar.run(tiny(graph_batches=(0,)), progress=False)


def test_static_step_trains_like_the_eager_loop():
    """StaticStep (static buffers, fused SGD, GradScaler) uncaptured on a CPU gives the weights of the plain loop
    bit for bit; capturing needs CUDA tensors."""
    from mpt_lab.training import StaticStep

    torch.manual_seed(0)
    data = [(torch.randn(4, 8), torch.randn(4, 8)) for _ in range(3)]
    nets = [ar.make_model(8, 2) for _ in range(2)]
    nets[1].load_state_dict(nets[0].state_dict())
    opts = [torch.optim.SGD(n.parameters(), lr=0.1, fused=True) for n in nets]
    scalers = [torch.amp.GradScaler("cpu") for _ in nets]
    step = StaticStep(
        nets[0], torch.nn.functional.mse_loss, opts[0], *data[0], dtype=torch.bfloat16, scaler=scalers[0], warmup=0
    )
    for x, y in data:
        step(x, y)
        with torch.autocast("cpu", dtype=torch.bfloat16, cache_enabled=False):
            loss = torch.nn.functional.mse_loss(nets[1](x), y)
        scalers[1].scale(loss).backward()
        scalers[1].step(opts[1])
        scalers[1].update()
        opts[1].zero_grad(set_to_none=True)
    assert step.captured == "eager" and torch.equal(step.loss, loss.detach())
    assert all(torch.equal(a, b) for a, b in zip(nets[0].parameters(), nets[1].parameters()))
    with pytest.raises(ValueError, match="cuda_graph"):
        StaticStep(nets[0], torch.nn.functional.mse_loss, opts[0], *data[0], capture="cuda_graph")
    with pytest.raises(TypeError, match="model"):
        StaticStep("net", torch.nn.functional.mse_loss, opts[0], *data[0])


@pytest.mark.parametrize(
    "field,value",
    [
        ("width", 0),
        ("batch_sizes", ()),
        ("batch_sizes", (8, -1)),
        ("recipes", ("fp8",)),
        ("recipes", ("bf16",)),
        ("epochs", 0),
        ("warmup_epochs", -1),
        ("lr", 0.0),
    ],
)
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
    assert "<caption>tiny: CPU" in html and "2 × Linear(32, 32)" in html  # the run, named above its table
    two = figures.speedup_table({"a": result, "b": result})
    assert two.count("<table") == 2 and two.count("<tr>") == 2 * (1 + len(result.rows))
    assert "<caption>saved run" in figures.speedup_table(result)  # as show_saved passes it
    assert html.count("</th>") == 7  # narrow enough for the column
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

    def spy(config, precision, device, **kw):
        out = real(config, precision, device, **kw)
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


def test_keep_in_float32_runs_a_module_outside_autocast():
    """Under CPU FP16 autocast a Linear with FP32 weights still returns float16 (autocast casts per op); with
    keep_in_float32 it returns float32 and its value is the FP32 product; the hooks come off again; its backward
    runs too (issue 31, item 14)."""
    from mpt_lab.autocast import keep_in_float32

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    x = torch.randn(4, 8)
    with torch.autocast("cpu", dtype=torch.float16):
        assert net[0](x).dtype == torch.float16
    handle = keep_in_float32(net[0])
    ref = torch.nn.functional.linear(x.half().float(), net[0].weight, net[0].bias)  # FP32, outside autocast
    with torch.autocast("cpu", dtype=torch.float16):
        h = net[0](x.half())  # a float16 input is cast to float32 too
        assert h.dtype == torch.float32 and torch.equal(h, ref)
        out = net(x)
        assert out.dtype == torch.float16 and torch.is_autocast_enabled("cpu")  # the rest still under autocast
    out.float().sum().backward()
    assert net[0].weight.grad.dtype == torch.float32 and torch.isfinite(net[0].weight.grad).all()
    handle.remove()
    with torch.autocast("cpu", dtype=torch.float16):
        assert net[0](x).dtype == torch.float16
    with pytest.raises(TypeError, match="module"):
        keep_in_float32(lambda t: t)


def test_autocast_step_reports_an_overflow_and_its_remedy():
    """A last Linear whose FP32 output reaches 140,000 (7·10⁴ times a dropout-kept 2) overflows under FP16 autocast
    and not outside it; autocast_step reports dtypes, finiteness and the loss with the given dropout masks, and
    restores the random state."""
    from mpt_lab.autocast import autocast_step, keep_in_float32

    torch.manual_seed(1)
    net = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Dropout(0.5), torch.nn.Linear(4, 1))
    with torch.no_grad():
        net[0].weight.copy_(torch.eye(4))
        net[0].bias.zero_()
        net[2].weight.zero_()
        net[2].weight[0, 0] = 7e4
        net[2].bias.zero_()
    batch = torch.ones(16, 4)

    def loss_fn(m, b):  # × 1e-3: the gradients stay within FP16's range, only the forward overflows
        return m(b).float().mean() * 1e-3

    state = torch.get_rng_state()
    plain = autocast_step(net, loss_fn, batch, watch=("2",), rng_state=state)
    assert plain["outputs"]["2"]["dtype"] == "float16" and not plain["outputs"]["2"]["finite"]
    assert not math.isfinite(plain["loss"]) and not plain["gradients_finite"]
    assert torch.equal(torch.get_rng_state(), state) and all(p.grad is None for p in net.parameters())
    handle = keep_in_float32(net[2])
    fixed = autocast_step(net, loss_fn, batch, watch=("2",), rng_state=state)
    handle.remove()
    assert fixed["outputs"]["2"] == {"dtype": "float32", "finite": True, "amax": 1.4e5}
    assert math.isfinite(fixed["loss"]) and fixed["gradients_finite"]
    fp32 = autocast_step(net, loss_fn, batch, dtype=None, watch=("2",), rng_state=state)
    assert fp32["outputs"]["2"] == fixed["outputs"]["2"]  # the same dropout masks as the autocast steps
    with pytest.raises(ValueError, match="watch"):
        autocast_step(net, loss_fn, batch, watch=("9",))
    with pytest.raises(ValueError, match="device_type"):
        autocast_step(net, loss_fn, batch, device_type="tpu")


def test_autocast_lists_read_from_the_dispatcher():
    """The lists agree with what the probe measures, op by op, and with the torch.amp documentation's groups."""
    from mpt_lab.autocast import POLICIES, autocast_lists

    cuda, cpu = autocast_lists("cuda", torch.float16), autocast_lists("cpu", torch.float16)
    assert set(POLICIES) <= set(cuda.lists) and cuda.device_type == "cuda" and cuda.dtype == "float16"
    for lists in (cuda, cpu):
        names = [op for ops in lists.lists.values() for op in ops]
        assert len(names) == len(set(names))  # every op in one group only
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
    single = {
        "exp": "exp",
        "sum": "sum",
        "softmax": "softmax",
        "log_softmax": "log_softmax",
        "relu": "relu",
        "layer_norm": "layer_norm",
        "elu": "elu",
        "expm1": "expm1",
        "mean": "mean",
        "var": "var",
        "batch_norm": "batch_norm",
        "add (x + x)": "add",
    }
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
    assert all(al.policy(op) == "not listed" for al in lists.values() for op in examples), examples
    with pytest.raises(TypeError, match="lists"):
        figures.autocast_lists_table({})


def test_speedup_table_recounts_a_result_saved_with_the_old_flop_convention():
    """A saved run counted 6·B·W² per Linear (the first layer's input gradient included): the table shows the
    counted FLOPs ÷ the saved step time, and its caption says it recounted."""
    from mpt_lab.experiments import saved

    g = saved("amp_recipe")
    if g is None or g.flops_convention == ar.COUNTED_FLOPS:
        pytest.skip("no saved result with the old convention")
    html = figures.speedup_table(g)
    assert "recounted from the saved step times" in html and "12.5% more at 3 layers" in html
    row = g.row("fp32", 512)
    step = row["epoch_seconds"] / g.config["num_batches"]
    counted = ar.counted_flops_per_step(512, g.config["width"], g.config["num_layers"])
    assert f"{counted / step / 1e9:.3g}" in html and f"{row['tflops'] * 1e3:.3g}" not in html
    assert "of datasheet dense peak" in html  # the H200's datasheet, from the saved device's name


@pytest.fixture(scope="module")
def roofline():
    from mpt_lab.experiments import load_json, results_dir

    path = results_dir() / "roofline_full.json"
    if not path.exists():
        pytest.skip("no saved roofline")
    return load_json(path)


def test_roofline_summary_reads_the_saved_roofline(roofline):
    s = figures.roofline_summary(roofline)
    assert set(s["kinds"]) == {r["kind"] for r in roofline["gemm"] if r["tflops"]}
    for kind, v in s["kinds"].items():
        assert v["best_tflops"] == max(
            r["tflops"] for r in roofline["gemm"] if r["kind"] == kind and r["m"] == r["n"] == r["k"]
        )
        assert v["vs_fp32"] == pytest.approx(v["best_tflops"] / roofline["peaks"]["fp32"])
        assert v["eager_tflops"] is None
    if roofline["datasheet"]:
        assert s["kinds"]["fp8_fast"]["datasheet_tflops"] == roofline["datasheet"]["fp8"]
    from mpt_lab.experiments import saved

    g = saved("amp_recipe")
    if g is not None and (512, g.config["width"], g.config["width"]) == tuple(s["shape"]):
        w = figures.roofline_summary(roofline, g, batch=512)
        flops = ar.counted_flops_per_step(512, g.config["width"], g.config["num_layers"])
        assert w["recipe"]["flops_per_step"] == flops == 16 * 512 * g.config["width"] ** 2  # (6L − 2)·B·W², L = 3
        bf = w["kinds"]["bf16"]
        step = g.row("bf16", 512)["epoch_seconds"] / g.config["num_batches"]
        assert bf["eager_tflops"] == pytest.approx(flops / step / 1e12)
        assert bf["eager_of_shape"] == pytest.approx(bf["eager_tflops"] / bf["shape_tflops"])
        assert w["kinds"]["tf32"]["eager_tflops"] is None  # the recipe ran FP32 with TF32 off
        html = figures.roofline_table(roofline, g)
        assert html.count("<tr>") == 1 + len(w["kinds"]) and "eager recipe step, batch 512" in html
        fig = figures.plot_roofline(roofline, g)
        ax = fig.axes[0]
        assert ax.get_xscale() == ax.get_yscale() == "log" and "FLOP per byte" in ax.get_xlabel()
        assert "TFLOP/s" in ax.get_ylabel() and "Roofline" in ax.get_title()
        labels = [t.get_text() for t in ax.get_legend().get_texts()]
        assert "BF16" in labels and any("eager step" in t for t in labels)


def test_step_weight_traffic():
    w, n = 64, 3
    params = n * (w * w + w)
    bf = figures.training.step_weight_traffic(w, n, "bf16")
    fp = figures.training.step_weight_traffic(w, n, "fp16")
    f32 = figures.training.step_weight_traffic(w, n, "fp32")
    assert bf["parameters"] == params and bf["total"] == 24 * params  # casts 6 + 6, update 12 bytes per parameter
    assert fp["total"] == 32 * params and fp["unscale"] == 8 * params  # + the scaler's unscale
    assert f32["total"] == f32["update"] == 12 * params and f32["weight_casts"] == 0
    with pytest.raises(ValueError, match="recipe"):
        figures.training.step_weight_traffic(w, n, "fp8")
    with pytest.raises(ValueError, match="width"):
        figures.training.step_weight_traffic(0, n, "bf16")


def test_roofline_summary_clocks_and_step_model(roofline):
    from mpt_lab.experiments import saved

    g = saved("amp_recipe")
    if g is None or g.config["width"] != 4096:
        pytest.skip("no saved amp_recipe run at the roofline's shape")
    s = figures.roofline_summary(roofline, g, batch=512)
    sq = {(r["kind"], r["n"]): r for r in roofline["gemm"] if r["m"] == r["n"] == r["k"]}
    for n, v in s["fp8_vs_fp16"].items():
        assert v["ratio"] == pytest.approx(sq["fp8", n]["tflops"] / sq["fp16", n]["tflops"])
    bf = s["kinds"]["bf16"]
    c = s["clocks"]["by_product"]["bf16", 16384]["sm_clock_mhz"]
    assert bf["of_clock_scaled"][16384] == pytest.approx(
        sq["bf16", 16384]["tflops"]
        / (bf["datasheet_tflops"] * c / figures.training.DATASHEET_CLOCK_MHZ["tensor_cores"])
    )
    assert s["ratios"]["FP8 ÷ FP16"] == pytest.approx(
        s["kinds"]["fp8"]["best_tflops"] / s["kinds"]["fp16"]["best_tflops"]
    )
    m = bf["step_model"]
    flops = s["recipe"]["flops_per_step"]
    assert m["traffic"] == figures.training.step_weight_traffic(4096, 3, "bf16")
    assert m["traffic_seconds"] == pytest.approx(m["traffic"]["total"] / (s["copy_gb_s"] * 1e9))
    assert m["products_seconds"] == pytest.approx(flops / (bf["shape_tflops"] * 1e12))
    assert m["of_step"] == pytest.approx(m["gpu_seconds"] / bf["eager_step_seconds"])
    assert m["intensity"] == pytest.approx(flops / (flops / bf["shape_intensity"] + m["traffic"]["total"]))
    assert s["kinds"]["tf32"]["step_model"] is None  # the recipe ran FP32 with TF32 off


def test_roofline_bad_input(roofline, result):
    with pytest.raises(TypeError, match="roofline"):
        figures.roofline_table({"gemm": []})
    with pytest.raises(TypeError, match="recipe"):
        figures.roofline_summary(roofline, "amp_recipe")
    with pytest.raises(ValueError, match="batch"):
        figures.roofline_summary(roofline, batch=0)
    with pytest.raises(ValueError, match="batch"):  # the tiny run's product 8 × 32 × 32 was not timed
        figures.plot_roofline(roofline, result, batch=8)


def test_count_step_ops():
    ops = figures.training.count_step_ops(3)
    c = ops["counts"]
    assert set(c) == {"bf16", "bf16 foreach", "fp16", "fp16 fused"}
    assert ops["ops"] == sum(c["bf16"].values()) and ops["ops_foreach"] == sum(c["bf16 foreach"].values())
    assert ops["ops_foreach"] < ops["ops"] and 0 < ops["no_kernel"] < ops["ops_foreach"]
    assert c["bf16"]["aten::addmm"] == 3  # one per layer in the forward
    assert ops["readbacks"] == {"bf16": 0, "bf16 foreach": 0, "fp16": 1, "fp16 fused": 0}  # the scaler's .item()
    assert figures.training.count_step_ops(3, width=16, batch=4)["ops"] == ops["ops"]  # independent of the sizes
    with pytest.raises(ValueError, match="num_layers"):
        figures.training.count_step_ops(0)
    with pytest.raises(ValueError, match="width"):
        figures.training.count_step_ops(3, width=2.5)


def test_eager_step_summary(roofline, result):
    from mpt_lab.experiments import saved

    with pytest.raises(TypeError, match="recipe"):
        figures.training.eager_step_summary("amp_recipe", roofline)
    with pytest.raises(ValueError, match="batches"):  # the tiny run has no row at 128
        figures.training.eager_step_summary(result, roofline)
    with pytest.raises(ValueError, match="batches"):
        figures.training.eager_step_summary(result, roofline, batches=(9, 8), odd_batch=9)
    g = saved("amp_recipe")
    if g is None or g.config["width"] != 4096:
        pytest.skip("no saved amp_recipe run at the roofline's shape")
    with pytest.raises(ValueError, match="ops_per_step"):
        figures.training.eager_step_summary(g, roofline, ops_per_step=0)
    e = figures.training.eager_step_summary(g, roofline, ops_per_step=65)
    n = g.config["num_batches"]
    bf = g.row("bf16", 512)["epoch_seconds"] / n
    assert e["step"]["bf16"][512] == pytest.approx(bf)
    assert e["rate"]["bf16"][512] == pytest.approx(16 * 512 * 4096**2 / bf / 1e12)
    assert e["growth"]["fp32"] == pytest.approx(e["step"]["fp32"][512] / e["step"]["fp32"][128])
    assert e["fp16_minus_bf16"][513] == pytest.approx(e["step"]["fp16"][513] - e["step"]["bf16"][513])
    m = figures.roofline_summary(roofline, g, batch=512)["kinds"]["bf16"]["step_model"]
    assert e["model"]["bf16"] == m
    assert e["host_per_op"]["bf16"] == pytest.approx({"no_overlap": m["rest_seconds"] / 65, "full_overlap": bf / 65})


def test_roofline_summary_run_order_and_intensities(roofline):
    from mpt_lab.experiments import saved

    s = figures.roofline_summary(roofline)
    order = [
        s["clocks"]["by_product"][r["kind"], r["n"]]["order"] for r in roofline["gemm"] if r["m"] == r["n"] == r["k"]
    ]
    assert order == sorted(order)  # the rows' order in the JSON is the run order
    g = saved("amp_recipe")
    if g is None or g.config["width"] != 4096:
        pytest.skip("no saved amp_recipe run at the roofline's shape")
    w = figures.roofline_summary(roofline, g, batch=512)["recipe"]["intensity_16bit"]
    assert w["forward"] == w["weight_gradient"] == pytest.approx(2 * 512 * 4096**2 / (2 * (2 * 512 * 4096 + 4096**2)))
    ax = figures.plot_roofline(roofline, g).axes[0]
    assert ax.get_xlim()[0] == pytest.approx(10) and ax.get_ylim()[0] == pytest.approx(10)  # no empty decades
