"""The accumulation chapter's experiments, figures and exercises, at tiny sizes (the chapter runs the real ones)."""

import dataclasses
import math

import numpy as np
import pytest
import torch
from matplotlib.figure import Figure

from mpt_lab import accumulation as acc
from mpt_lab import exercises as E
from mpt_lab import figures
from mpt_lab.accumulation import AccumulatedLinear, accumulate_linears_
from mpt_lab.experiments import (
    NAMES,
    accumulation_error,
    accumulation_training,
    fp8_recipes,
    get,
    tensor_core_accumulation,
)
from mpt_lab.formats import FP8_E4M3, round_to


@pytest.fixture(scope="module")
def err():
    c = accumulation_error.Config(
        k_max=64, trials=4, tc_ks=(32, 64), tc_outputs=4, tokens=4096, vocab=512, width=256, rows=2, threads=1
    )
    return accumulation_error.run(c, progress=False)


@pytest.fixture(scope="module")
def train():
    c = accumulation_training.Config(steps=3, batch=64, hidden=8, mlp_steps=4, threads=1)
    return accumulation_training.run(c, progress=False)


def test_registered_with_profiles():
    for name in ("accumulation_error", "accumulation_training", "tensor_core_accumulation"):
        assert name in NAMES
        e = get(name)
        assert {"quick"} <= set(e.profiles)
    assert "full" in get("tensor_core_accumulation").profiles and "cpu" in get("accumulation_error").profiles


def test_error_result_fields_and_json(err, tmp_path):
    assert err.ks == [1, 2, 4, 8, 16, 32, 64]
    assert set(err.error) == {f"{f} {o}" for f in ("FP16", "BF16", "FP32") for o in ("sequential", "pairwise")}
    for arm, v in err.error.items():
        assert len(v["median"]) == len(err.ks) and all(m <= x for m, x in zip(v["median"], v["max"]))
    # K = 1: one rounded product, the same in both orders
    assert err.error["FP16 sequential"]["median"][0] == err.error["FP16 pairwise"]["median"][0]
    assert err.error["FP32 sequential"]["median"][-1] < err.error["FP16 sequential"]["median"][-1]
    assert len(err.running["FP16"]) == len(err.running_ks) and err.running_ks[-1] == 64
    assert set(err.tensor_core["models"]) and err.tensor_core["ks"] == [32, 64]
    assert set(err.reductions) == {"mean loss", "log-sum-exp", "LayerNorm variance"}
    for r in err.reductions.values():  # the first draw's error is one of those the largest is taken over
        assert r["rows"] == 2 and all(r["first_errors"][a] <= r["errors"][a] for a in r["errors"])
    # the log-sum-exp against its FP16 exponentials: the accumulators' own errors, FP32 the smallest
    rx = err.reductions["log-sum-exp"]["exact, FP16 exponentials"]
    assert set(rx["errors"]) == set(err.reductions["log-sum-exp"]["errors"]) and rx["exponentials_error"] > 0
    assert rx["errors"]["FP32"] < rx["errors"]["FP16 sequential"]
    # the LayerNorm variance pass by pass: both passes together are the table's sequential arm, signed
    passes = err.reductions["LayerNorm variance"]["passes"]["signed_errors"]
    ln = err.reductions["LayerNorm variance"]
    assert len(passes["FP16 sequential, both passes"]) == 2
    assert abs(abs(passes["FP16 sequential, both passes"][0]) - ln["first_errors"]["FP16 sequential"]) < 1e-12
    assert set(err.autocast) == set(accumulation_error.REDUCTION_OPS)
    assert err.autocast["mean loss"] == {"cross_entropy": "float32", "mean": "float16"}
    assert err.autocast["LayerNorm variance"] == {"layer_norm": "float32", "var": "float16"}
    # zero-mean products: the same arms and K, errors against the sum's size
    assert set(err.zero_mean) == set(err.error)
    for v in err.zero_mean.values():
        assert len(v["median"]) == len(err.ks) and all(0 <= m <= x for m, x in zip(v["median"], v["max"]))
    assert math.isfinite(err.slope("FP16 sequential", 2, 64, inputs="zero-mean"))
    with pytest.raises(ValueError, match="inputs"):
        err.slope("FP16 sequential", inputs="both")
    path = err.save(tmp_path / "e.json")
    again = accumulation_error.AccumulationErrorResult.load(path)
    assert (
        again.error == err.error
        and again.zero_mean == err.zero_mean
        and again.reductions["mean loss"]["errors"] == err.reductions["mean loss"]["errors"]
    )
    assert math.isfinite(err.slope("FP32 sequential", 2, 64))
    assert "median relative error" in err.describe()


def test_error_config_is_checked():
    with pytest.raises(ValueError, match="k_max"):
        accumulation_error.Config(k_max=100).validate()
    with pytest.raises(ValueError, match="tc_ks"):
        accumulation_error.Config(tc_ks=(100,)).validate()


def test_training_runs_and_reproduces_chapter_11(train):
    assert set(train.accumulator["losses"]) == set(accumulation_training.ACCUMULATORS)
    assert all(len(v) == 3 for v in train.accumulator["losses"].values())
    assert set(train.weights["losses"]) == set(accumulation_training.WEIGHT_ARMS)
    # the BF16-weight arms are chapter 11's runs, step for step
    c = fp8_recipes.config_for("quick")
    c.recipes, c.models, c.mlp_steps = ("bf16", "bf16_rne", "bf16_sr"), ("mlp",), 4
    ch11 = fp8_recipes.run(c, progress=False)
    for label, (recipe, _) in accumulation_training.WEIGHT_ARMS.items():
        if label != "BF16, Kahan-compensated":
            assert ch11.runs["mlp"][recipe]["losses"] == train.weights["losses"][label], label
    assert train.weights["mlp_config"]["mlp_steps"] == 4
    assert "test accuracy by accumulator" in train.describe()


def test_the_weight_comparison_is_chapter_11s_mlp_in_every_profile():
    """accumulation_training imports no other experiment: its BF16-weight runs repeat chapter 11's MLP runs with
    the same settings, which this test holds equal, profile by profile (fp8_recipes' cpu profile for "full")."""
    fields = ("mlp_hidden", "mlp_layers", "mlp_batch", "mlp_steps", "mlp_lr", "seed")
    for profile in accumulation_training.PROFILES:
        ours = accumulation_training.config_for(profile)
        theirs = fp8_recipes.config_for("cpu" if profile == "full" else profile)
        assert {f: getattr(ours, f) for f in fields} == {f: getattr(theirs, f) for f in fields}, profile


def test_accumulated_linear_is_a_linear_of_fp16_operands():
    torch.manual_seed(0)
    lin = torch.nn.Linear(16, 8)
    x = torch.randn(32, 16, requires_grad=True)
    layer = AccumulatedLinear(lin, "FP32")
    y = layer(x)
    x16, w16 = x.detach().half().float(), lin.weight.detach().half().float()
    ref = x16 @ w16.t() + lin.bias.detach()
    assert torch.allclose(y, ref, rtol=1e-5, atol=1e-6)
    y.sum().backward()
    assert torch.allclose(x.grad, torch.ones(32, 8) @ w16, rtol=1e-5)
    assert torch.allclose(lin.weight.grad, torch.ones(8, 32) @ x16, rtol=1e-5)
    model = accumulate_linears_(torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU()), "FP16")
    assert isinstance(model[0], AccumulatedLinear) and model[0].accumulator == "FP16"
    with pytest.raises(TypeError, match="linear"):
        AccumulatedLinear(torch.nn.ReLU())


def test_tensor_core_experiment_runs_on_a_cpu():
    r = tensor_core_accumulation.run(tensor_core_accumulation.config_for("quick"), progress=False)
    assert r.fp8 == {} and r.fp8_skipped == "no CUDA device"
    assert set(r.fp16) == set(tensor_core_accumulation.FP16_RUNS) and r.ks == [128, 512]
    # on a CPU the FP16 product accumulates in FP32: the FP32-accumulator model's error, not the FP16 one's
    dev = r.fp16["device, reduced-precision reduction off"]["median"]
    assert dev[-1] < r.fp16["model, FP16 accumulator"]["median"][-1]
    with pytest.raises(ValueError, match="multiples of 16"):
        tensor_core_accumulation.Config(m=10).validate()
    # what each device product launched, from the profiler (on a CPU its ATen operators: the matrix product)
    names = r.kernels["16x16"]["fp16"]
    assert set(names) == set(tensor_core_accumulation.FP16_RUNS[:2])
    assert all(set(v) == {"128", "512"} and all("aten::mm" in n for n in v.values()) for v in names.values())
    assert r.large == {}


def test_tensor_core_experiment_at_m_n_1024_against_float64_on_the_device():
    """large_mn (the full profile's 1024): the device runs again at m = n = 1024, against the float64 product on the
    device; on a CPU the FP16 product accumulates in FP32, so its error is FP16's rounding of the result (≤ 2^-11
    relative) at every K; the operands are those of mpt_lab's exact rounding."""
    cfg = dataclasses.replace(tensor_core_accumulation.config_for("quick"), ks=(128, 256), large_mn=32)
    r = tensor_core_accumulation.run(cfg, progress=False)
    assert (r.large["m"], r.large["n"]) == (32, 32) and r.large["fp8"] == {}
    for run in tensor_core_accumulation.FP16_RUNS[:2]:
        assert len(r.large["fp16"][run]["max"]) == 2 and max(r.large["fp16"][run]["max"]) <= 2.0**-11
    assert (
        set(r.kernels) == {"16x16", "32x32"}
        and r.kernels["32x32"]["fp16"][tensor_core_accumulation.FP16_RUNS[0]]["256"]
    )
    assert tensor_core_accumulation.config_for("full").large_mn == 1024
    with pytest.raises(ValueError, match="large_mn"):
        tensor_core_accumulation.Config(large_mn=20).validate()


def test_saved_gpu_result_has_every_run():
    r = get("tensor_core_accumulation").saved("full")
    if r is None:
        pytest.skip("no saved GPU result")
    assert "NVIDIA" in r.device_name and r.fp8_skipped == ""
    assert set(r.fp8) <= set(tensor_core_accumulation.FP8_RUNS) and len(r.fp8) >= 5
    for runs in (r.fp16, r.fp8):
        for v in runs.values():
            assert len(v["median"]) == len(r.ks)


def test_figures(err, train):
    for fig in (figures.plot_error_vs_k(err), figures.plot_running_sum(err), figures.plot_tensor_core_model(err)):
        assert isinstance(fig, Figure)
        for ax in fig.axes:
            assert ax.get_xlabel() and ax.get_title() or fig._suptitle is not None
        assert any(ax.get_legend() is not None for ax in fig.axes) or fig.legends
    table = figures.reductions_table(err)
    assert "mean loss" in table and "float32" in table and "overflow" in table or "error" in table
    assert "float16" in table and "largest error over the 2 draws" in table  # mean and var by hand stay float16
    assert "Kahan" in figures.weights_table(train)
    g = tensor_core_accumulation.run(tensor_core_accumulation.config_for("quick"), progress=False)
    fig = figures.plot_gpu_accumulation(g)
    assert len(fig.axes) == 1 and fig.axes[0].get_legend() is not None
    with pytest.raises(TypeError, match="running"):
        figures.plot_running_sum(train)


def test_kernels_table_names_each_products_kernels_and_marks_split_k():
    """figures.product_kernels drops the profiler's range marker ("fmt|run|K"); kernels_table groups the device
    runs with the same kernels and the consecutive K with the same kernels, shortens the names (the full name on
    hover) and says which products launched a kernel named splitK; plot_gpu_accumulation rings those points."""
    g = tensor_core_accumulation.run(tensor_core_accumulation.config_for("quick"), progress=False)
    on, off = tensor_core_accumulation.FP16_RUNS[:2]
    kern = figures.product_kernels(g)  # on a CPU: the ATen operators
    assert set(kern) == {"16x16"} and set(kern["16x16"]["fp16"][on]) == {128, 512}
    assert all("aten::mm" in names for names in kern["16x16"]["fp16"][on].values())
    table = figures.kernels_table(g)
    assert "aten::mm" in table and "16 × 16" in table and ">no<" in table and ">yes<" not in table
    reduce = (
        "void cublasLt::splitKreduce_kernel<32, 16, float, __half>(cublasLt::cublasSplitKParams<float>, float const*)"
    )
    gpu_names = {
        r: {"128": ["gemm_NNT", f"fp16|{r}|128"], "512": [f"fp16|{r}|512", "gemm_splitK_NNT", reduce]}
        for r in (on, off)
    }
    gpu = dataclasses.replace(g, kernels={"16x16": {"fp16": gpu_names, "fp8": {}}})
    assert figures.product_kernels(gpu)["16x16"]["fp16"][on] == {128: ["gemm_NNT"], 512: ["gemm_splitK_NNT", reduce]}
    table = figures.kernels_table(gpu)
    assert "fp16|" not in table and "reduced-precision reduction on<br>reduced-precision reduction off" in table
    assert "cublasLt::splitKreduce_kernel&lt;…&gt;</code>" in table and 'title="void cublasLt::splitKreduce' in table
    assert table.count(">yes<") == 1 and table.count(">no<") == 1  # K = 512 split, K = 128 not: one row each
    rings = [line for line in figures.plot_gpu_accumulation(gpu).axes[0].get_lines() if "splitK" in line.get_label()]
    assert len(rings) == 1 and list(rings[0].get_xdata()) == [512.0, 512.0]  # the on and off runs' points at 512
    with pytest.raises(ValueError, match="kernels"):
        figures.kernels_table(dataclasses.replace(g, kernels={}))
    with pytest.raises(TypeError, match="kernels"):
        figures.product_kernels(object())


def test_split_k_model_redraws_the_runs_operands_and_cuts_k_into_parts():
    """figures.split_k_model: one part is the run's own "14 bits per product, toward zero" (the same operands,
    drawn again from the config's seed); more parts, each summed in that model and added in FP32, lose less; bad
    input gets a clear error."""
    g = tensor_core_accumulation.run(tensor_core_accumulation.config_for("quick"), progress=False)  # ks 128, 512
    with pytest.raises(ValueError, match="FP8"):
        figures.split_k_model(g, {512: (1,)})  # a CPU run has no FP8 rows
    fp8 = {"model, 14 bits per product, toward zero": {"median": [0.0, 0.0], "max": [0.0, 0.0]}}
    fake = dataclasses.replace(g, fp8=fp8)
    out = figures.split_k_model(fake, {512: (1, 4)})
    assert set(out) == {512} and out[512][1]["part_length"] == 512 and out[512][4]["part_length"] == 128
    rng = np.random.default_rng(g.config["seed"])
    for K in g.config["ks"]:  # the experiment's draws, in its order
        A = rng.uniform(0.0, 1.0, (g.config["m"], K)).astype(np.float32)
        B = rng.uniform(0.0, 1.0, (K, g.config["n"])).astype(np.float32)
    A8, B8 = (round_to(x, FP8_E4M3) for x in (A, B))
    exact = A8.astype(np.float64) @ B8.astype(np.float64)
    one = acc.matmul(A8, B8, accumulator=acc.TENSOR_CORE_ACCUMULATOR, products="FP32", rounding="toward_zero")
    assert out[512][1]["median"] == float(np.median(np.abs(one - exact) / exact))
    assert 0 < out[512][4]["median"] < out[512][1]["median"]  # shorter sums in 14 bits lose less
    with pytest.raises(ValueError, match="ks"):
        figures.split_k_model(fake, {256: (1,)})
    with pytest.raises(ValueError, match="parts"):
        figures.split_k_model(fake, {512: (0,)})
    with pytest.raises(TypeError, match="ints"):
        figures.split_k_model(fake, {512: (1.5,)})
    with pytest.raises(TypeError, match="dict"):
        figures.split_k_model(fake, [512])


def test_figures_name_each_model_once(err):
    """The DeepSeek-V3 models carry one name in both figures, and Fig. 5.1's lines are labelled with superscripts."""
    fig = figures.plot_tensor_core_model(err)
    labels = {line.get_label() for ax in fig.axes for line in ax.get_lines()}
    assert {"DeepSeek-V3 model (14 bits, groups of 32)", "DeepSeek-V3 model + FP32 promotion every 128"} <= labels
    texts = [t.get_text() for ax in figures.plot_error_vs_k(err).axes for t in ax.texts]
    assert " K = 2⁵" in texts and not any("^" in t for t in texts)  # BF16's 2^(p-3) = 32 ≤ k_max = 64
    r = get("tensor_core_accumulation").saved("full")
    if r is None:
        pytest.skip("no saved GPU result")
    labels = {line.get_label() for ax in figures.plot_gpu_accumulation(r).axes for line in ax.get_lines()}
    assert "model, DeepSeek-V3 model (14 bits, groups of 32)" in labels
    assert "model, DeepSeek-V3 model + FP32 promotion every 128" in labels
    assert not any("14-bit tensor core" in label for label in labels)


def test_exercises_5():
    assert E.list_exercises(5) == ["5.1", "5.2"]
    assert E.solution("5.1") == {"FP16": 512.0, "BF16": 64.0}
    assert E.check("5.1", E.solution("5.1")) and not E.check("5.1", {"FP16": 2048.0, "BF16": 256.0})
    assert E.check("5.2", E.solution("5.2"))

    def plain(values):  # no compensation
        s = np.float16(0)
        for v in values:
            s = s + np.float16(v)
        return float(s)

    def in_fp32(values):  # compensated, but in FP32
        return float(np.sum(np.asarray(values, dtype=np.float64)))

    assert not E.check("5.2", plain) and not E.check("5.2", in_fp32)
    # the reference equals the module's Kahan in FP16
    x = np.random.default_rng(0).uniform(0, 1, 3000).astype(np.float16).astype(np.float32)
    assert E.solution("5.2")(x) == float(acc.dot(x, np.ones_like(x), accumulator="FP16", compensated=True))


def test_split_fp16_agreement_counts_fp16_results_a_split_changes():
    """A split of K whose parts are added in FP32 changes few FP16 results: against a direct float64-free recount
    (the same operands, NumPy's sequential float32 sums), and the bad-input errors."""
    import numpy as np

    same = figures.split_fp16_agreement(k=64, parts=(2, 4), rows=300, seed=3)
    rng = np.random.default_rng(3)
    a = rng.random((300, 64), dtype=np.float32).astype(np.float16).astype(np.float32)
    b = rng.random((300, 64), dtype=np.float32).astype(np.float16).astype(np.float32)
    p = a * b
    whole = np.zeros(300, np.float32)
    for j in range(64):
        whole = (whole + p[:, j]).astype(np.float32)
    halves = [np.zeros(300, np.float32), np.zeros(300, np.float32)]
    for j in range(64):
        halves[j // 32] = (halves[j // 32] + p[:, j]).astype(np.float32)
    two = (halves[0] + halves[1]).astype(np.float32)
    assert same[2] == float(np.mean(two.astype(np.float16) == whole.astype(np.float16)))
    assert 0.9 < same[4] <= 1.0
    with pytest.raises(ValueError, match="divide"):
        figures.split_fp16_agreement(k=64, parts=(3,))
    with pytest.raises(TypeError, match="k must be an int"):
        figures.split_fp16_agreement(k=64.0)
    with pytest.raises(ValueError, match="k must be"):
        figures.split_fp16_agreement(k=1, parts=())
