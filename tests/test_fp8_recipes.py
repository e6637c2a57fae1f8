"""The fp8_recipes experiment (every training recipe on a small transformer and the digits MLP) end to end:
JSON, figures, tables, bad configurations, the character transformer and its text; on a GPU with FP8 tensor
cores, the tensor-core runs (skipped elsewhere)."""

import copy
import math

import pytest
import torch
from matplotlib.figure import Figure

from mpt_lab.data import kjv_characters
from mpt_lab.experiments import fp8_recipes
from mpt_lab.microscaling import one_scale_vs_per_tensor
from mpt_lab.models import CharTransformerLM
from mpt_lab.quantized_training import TRAINING_RECIPES, hardware_fp8_available

# ----------------------------------------------------------------------------------------------------------
# the experiment end to end
# ----------------------------------------------------------------------------------------------------------
TINY = dict(
    profile="quick",
    lm_dim=16,
    lm_layers=1,
    lm_heads=2,
    lm_context=16,
    lm_batch=4,
    lm_steps=8,
    lm_valid_chars=256,
    mlp_hidden=16,
    mlp_layers=1,
    mlp_batch=32,
    mlp_steps=8,
    evals=2,
    stats_every=4,
    block_sizes=(8, 32),
    sweep_formats=("FP8_E4M3", "FP4_E2M1"),
    threads=1,
    recipes=("fp32", "bf16", "fp16", "fp8_unscaled", "fp8_delayed", "mxfp4", "nvfp4", "bf16_sr"),
)


@pytest.fixture(scope="module")
def tiny():
    return fp8_recipes.run(fp8_recipes.Config(**TINY), progress=False)


def test_tiny_experiment_runs_every_recipe(tiny):
    assert set(tiny.runs) == {"lm", "mlp"}
    for model in ("lm", "mlp"):
        assert list(tiny.runs[model]) == list(TINY["recipes"])
        for name, r in tiny.runs[model].items():
            steps = TINY["lm_steps"] if model == "lm" else TINY["mlp_steps"]
            assert len(r["losses"]) == steps and [e["step"] for e in r["evals"]] == [4, 8]
            assert math.isfinite(tiny.final(model, name)) and not r["diverged"]
            assert bool(r["stats"]) == (name != "fp32")
    lm = tiny.models["lm"]
    assert lm["linears"] == ["blocks.0.qkv", "blocks.0.proj", "blocks.0.fc1", "blocks.0.fc2", "head"]
    assert lm["tokens_per_step"] == 64 and tiny.models["mlp"]["linears"] == ["0", "2"]
    assert set(tiny.histograms) == set(lm["linears"]) and set(tiny.histograms["head"]) == {"x", "w", "g"}
    assert tiny.histograms["head"]["g"].total > 0
    assert set(tiny.block_sweep) == {"x", "w", "g"} and set(tiny.block_sweep["g"]["head"]) == {"FP8_E4M3", "FP4_E2M1"}
    traces = tiny.delayed["traces"]
    assert len(traces) == 2 and sum(n.endswith(".g") for n in traces) == 1
    assert tiny.hardware["available"] is False and "compute capability" in tiny.hardware["reason"]
    # the same initial weights and batches: BF16 starts where FP32 starts
    assert tiny.runs["lm"]["bf16"]["losses"][0] == pytest.approx(tiny.runs["lm"]["fp32"]["losses"][0], abs=1e-2)
    assert 0 <= tiny.underflow("lm", "fp8_unscaled") <= 1 and tiny.underflow("lm", "bf16") == 0
    assert tiny.snr("lm", "mxfp4", "w") < tiny.snr("lm", "bf16", "w")
    assert tiny.gap("lm", "bf16") == 0 and "fp8_recipes" in tiny.describe()
    assert "FP8, delayed scaling" in tiny.describe() and "fp8_delayed" not in tiny.describe()  # labels, not keys
    with pytest.raises(ValueError, match="model"):
        tiny.final("cnn", "bf16")
    with pytest.raises(ValueError, match="recipe"):
        tiny.final("lm", "mxfp6")
    with pytest.raises(ValueError, match="role"):
        tiny.underflow("lm", "bf16", "y")


def test_step_one_is_kept_apart(tiny):
    """Statistics of step 1 alone ("first"), and of the recorded steps after it ("after_first"), add up to all of
    them; at step 1 delayed scaling has no amax history and casts with scale 1, exactly as FP8 without scaling
    (issue 31, item 11)."""
    for recipe in ("fp8_unscaled", "fp8_delayed", "mxfp4"):
        assert tiny.has_first("lm", recipe)
        first, after, every = (tiny._counts("lm", recipe, s) for s in ("first", "after_first", "all"))
        for layer, roles in every.items():
            for role, c in roles.items():
                assert all(first[layer][role][k] + after[layer][role][k] == pytest.approx(c[k]) for k in c)
    assert tiny.underflow("lm", "fp8_delayed", "g", "first") == tiny.underflow("lm", "fp8_unscaled", "g", "first")
    assert tiny.stats("lm", "fp8_delayed", "first")["all"]["g"] == tiny.stats("lm", "fp8_unscaled", "first")["all"]["g"]
    with pytest.raises(ValueError, match="steps"):
        tiny.stats("lm", "fp8_delayed", "last")
    saved = copy.deepcopy(tiny)
    for runs in saved.runs.values():  # a result saved before step 1 was kept apart
        for r in runs.values():
            r.pop("stats_first")
    assert not saved.has_first("lm", "fp8_delayed") and saved.underflow("lm", "fp8_delayed") >= 0
    with pytest.raises(ValueError, match="step 1"):
        saved.underflow("lm", "fp8_delayed", "g", "after_first")
    from mpt_lab import figures

    assert "after the first" in figures.fp8_results_table(tiny) and "step 1 included" in figures.fp8_results_table(
        saved
    )


def test_tiny_experiment_is_reproducible_and_round_trips(tiny, tmp_path):
    again = fp8_recipes.run(
        fp8_recipes.Config(**{**TINY, "models": ("mlp",), "recipes": ("bf16_sr", "mxfp4")}), progress=False
    )
    for name in ("bf16_sr", "mxfp4"):
        assert again.runs["mlp"][name]["losses"] == tiny.runs["mlp"][name]["losses"]
    path = tiny.save(tmp_path / "fp8.json")
    back = fp8_recipes.FP8RecipesResult.load(path)
    assert back.runs["lm"]["mxfp4"]["losses"] == tiny.runs["lm"]["mxfp4"]["losses"]
    assert back.histograms["head"]["g"] == tiny.histograms["head"]["g"]
    assert back.stats("lm", "nvfp4") == tiny.stats("lm", "nvfp4") and back.config == tiny.config
    assert back.provenance["command"].startswith("python -m mpt_lab.experiments.fp8_recipes --profile quick")


def test_figures_and_tables(tiny):
    from mpt_lab import figures

    for fig in (
        figures.plot_fp8_training(tiny, "lm", tolerance=0.05),
        figures.plot_fp8_training(tiny, "mlp"),
        figures.plot_layer_quantization(tiny, "fp8_unscaled"),
        figures.plot_recipe_snr(tiny, "lm"),
        figures.plot_amax_history(tiny),
        figures.plot_block_size_error(tiny),
        figures.plot_block_size_error(tiny.block_sweep),
    ):
        assert isinstance(fig, Figure)
        assert (fig._suptitle is not None and fig._suptitle.get_text()) or any(ax.get_title() for ax in fig.axes)
        for ax in fig.axes:
            assert ax.get_xlabel() or ax.get_ylabel() or ax.get_title()
        assert fig.legends or any(ax.get_legend() for ax in fig.axes)
    table = figures.fp8_results_table(tiny, tolerance=0.05)
    assert "<table" in table and "MXFP4" in table and "✓" in table and "LM: validation loss" in table
    assert "E8M0 scale" in figures.block_scale_table(tiny)
    cmp = one_scale_vs_per_tensor({n: h["g"] for n, h in tiny.histograms.items()}, "FP8_E4M3")
    assert "lost with one scale" in figures.one_scale_table(cmp)
    assert "No tensor-core runs" in figures.hardware_table(tiny)
    with pytest.raises(TypeError):
        figures.plot_fp8_training(object())
    with pytest.raises(ValueError, match="recipe"):
        figures.plot_layer_quantization(tiny, "mxfp6")
    with pytest.raises(ValueError, match="no statistics"):
        figures.plot_layer_quantization(tiny, "fp32")


def test_results_and_recipe_tables_fit_the_page(tiny):
    """The results table has one loss column per model (the gap to BF16 beside the loss) and the recipe table the
    formats and scaling, so neither is wider than the page column; together they say what the old table said."""
    import re

    from mpt_lab import figures

    results = figures.fp8_results_table(tiny, tolerance=0.05)
    header = re.findall(r"<th style[^>]*>(.*?)</th>", results)
    assert len(header) == 1 + 2 * len(tiny.runs) + ("mlp" in tiny.runs) and "MLP: accuracy" in header
    recipes = figures.fp8_recipe_table(tiny)
    assert re.findall(r"<th style[^>]*>(.*?)</th>", recipes) == [
        "recipe",
        "forward / backward",
        "scaling",
        "bits per value",
    ]
    assert "E8M0 per 32 values" in recipes and recipes.count("<tr>") == results.count("<tr>")
    # a gap that rounds to the tolerance shows a fourth digit, so that the reader sees why it has no ✓ (or has one)
    gap = tiny.gap("lm", "mxfp4")
    near = figures.fp8_results_table(tiny, tolerance=round(abs(gap), 3))
    assert f"{gap:+.4f}" in near and f"{gap:+.4f}" not in results


def test_mx_block_diagram_shows_the_real_scale_and_codes():
    from mpt_lab import figures
    from mpt_lab.microscaling import quantize_mx

    g = torch.Generator().manual_seed(10)
    block = torch.randn(32, generator=g, dtype=torch.float64) * 2.0**-12
    block[5] = 2.0**-6 * 1.3
    fig = figures.plot_mx_block(block)
    q8, q4 = (quantize_mx(block, f, block_size=32) for f in ("FP8_E4M3", "FP4_E2M1"))
    code = int(q8.scale_codes[0])
    texts = [t.get_text() for ax in fig.axes for t in ax.texts]
    assert any(f"code {code}" in t and f"2^{code - 127}" in t for t in texts)  # the real E8M0 byte
    assert [t for t in texts if len(t) == 2] == [f"{c:02X}" for c in q8.element_codes.tolist()]  # the real codes
    titles = " ".join(ax.get_title() for ax in fig.axes)
    assert f"2^{int(q4.scale_codes[0]) - 127}" in titles and "8.25 bits per value" in titles
    lost = int(((q4.dequantize(torch.float64) == 0) & (block != 0)).sum())
    assert any(
        f"stored as 0 ({lost} of 32)" in t.get_text()
        for ax in fig.axes
        if ax.get_legend()
        for t in ax.get_legend().get_texts()
    )
    with pytest.raises(ValueError, match="1-D"):
        figures.plot_mx_block(torch.zeros(32))
    with pytest.raises(ValueError):
        figures.plot_mx_block(block, "FP16")


@pytest.mark.parametrize(
    "field,value",
    [
        ("recipes", ("fp7",)),
        ("recipes", ()),
        ("models", ("cnn",)),
        ("lm_dim", 31),
        ("lm_steps", 0),
        ("margin", -1),
        ("lm_lr", 0.0),
        ("block_sizes", (0,)),
        ("scale_rounding", "up"),
        ("hardware", "yes"),
        ("sweep_formats", ("FP16",)),
        ("lm_valid_chars", 8),
    ],
)
def test_bad_config_names_the_field(field, value):
    cfg = fp8_recipes.Config(**{**TINY, field: value})
    with pytest.raises(ValueError, match=f"config.{field}"):
        fp8_recipes.run(cfg, progress=False)


def test_profiles_are_valid_and_name_what_the_chapter_asserts():
    for p in ("quick", "cpu", "full"):
        cfg = fp8_recipes.config_for(p)
        cfg.validate()
        assert {"fp32", "bf16", "fp8_unscaled", "fp8_current", "fp8_delayed", "mxfp8", "mxfp4"} <= set(cfg.recipes)
    assert set(fp8_recipes.config_for("cpu").recipes) == set(TRAINING_RECIPES)


def test_char_transformer():
    train, valid, vocab = kjv_characters()
    assert len(train) > 3_000_000 and len(valid) > 100_000 and "\n" in vocab and " " in vocab
    assert not any(c.isdigit() for c in vocab)  # verse numbers are removed
    m = CharTransformerLM(len(vocab), 32, 2, 4, 16)
    out = m(train[:32].view(2, 16))
    assert out.shape == (2, 16, len(vocab))
    # causal: the logits at position t do not depend on later characters
    ids = train[:16].view(1, 16).clone()
    ids2 = ids.clone()
    ids2[0, 10:] = 0
    assert torch.equal(m(ids)[0, :10], m(ids2)[0, :10])
    with pytest.raises(ValueError, match="divisible"):
        CharTransformerLM(10, 30, 1, 4, 8)
    with pytest.raises(ValueError, match="dim"):
        CharTransformerLM(10, 0, 1, 1, 8)


@pytest.mark.skipif(not hardware_fp8_available(), reason="needs a CUDA GPU with FP8 tensor cores (capability ≥ 8.9)")
def test_tensor_core_runs_on_the_gpu():
    res = fp8_recipes.run(
        fp8_recipes.Config(
            **{
                **TINY,
                "recipes": ("fp32", "fp8_current"),
                "models": ("mlp",),
                "mlp_batch": 32,
                "mlp_hidden": 32,
                "device": "cuda",
            }
        ),
        progress=False,
    )
    assert res.hardware["available"] and "fp8_current_hw" in res.runs["mlp"]
    assert abs(res.gap("mlp", "fp8_current_hw", "fp8_current")) < 0.05
