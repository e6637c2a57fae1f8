"""The gradient-factor experiment end to end on a tiny configuration: its variants, the 1/N law and the exact
gradient shift, its result's JSON round trip, its figure and table, and bad configurations."""

import json
import math

import pytest

from mpt_lab import figures
from mpt_lab.experiments import gradient_factors as gf
from mpt_lab.experiments.gradient_factors import Config, GradientFactorsResult
from mpt_lab.histogram import Log2Histogram, quantile_binade


@pytest.fixture(scope="module")
def tiny():
    cfg = Config(
        profile="quick",
        variants=("ours", "batch8", "sum", "shift12", "vgg16_64"),
        steps=3,
        warmup_steps=1,
        n_train=64,
        threads=1,
    )
    return gf.run(cfg, progress=False)


def test_every_variant_is_trained_and_recorded(tiny):
    assert list(tiny.variants) == ["ours", "batch8", "sum", "shift12", "vgg16_64"]
    for vid, d in tiny.variants.items():
        h = d["activation"]
        assert isinstance(h, Log2Histogram) and h.total > 0 and h.nonfinite == 0, vid
        assert len(d["losses"]) == 3 and all(math.isfinite(x) for x in d["losses"])
        assert d["matched"] > 0 and d["parameters"] > 0 and d["weight_gain"] > 0
        assert d["settings"] == {**gf.BASE, **gf.VARIANTS[vid][2]}
        batch = d["settings"]["batch_size"]
        assert d["values_per_image"] == h.total / (3 * batch)
        s = tiny.shares(vid)
        assert 0 < s["zeros"] < 1 and 0 <= s["lost"] <= s["below"] <= 1
    assert tiny.shift("ours") == 0 and tiny.divisor_shift("ours") == 0
    # gradients ∝ 1/N × 2⁻ᵏ: the divisor's part of each shift, from the measured matched boxes N
    n0 = tiny.variants["ours"]["matched"]
    assert tiny.divisor_shift("sum") == pytest.approx(math.log2(n0))
    assert tiny.divisor_shift("batch8") == pytest.approx(math.log2(n0 / tiny.variants["batch8"]["matched"]))
    assert tiny.divisor_shift("vgg16_64") == pytest.approx(math.log2(n0 / tiny.variants["vgg16_64"]["matched"]))
    assert tiny.divisor_shift("shift12") == -12


def test_the_gradient_shift_moves_every_value_by_exactly_k_binades(tiny):
    """Loss × 2⁻¹² with Adam's eps × 2⁻¹²: the FP32 run is the same, every gradient 2¹² times smaller."""
    a, b = tiny.variants["ours"], tiny.variants["shift12"]
    assert b["losses"] == a["losses"]
    ha, hb = a["activation"], b["activation"]
    assert hb.zeros == ha.zeros and hb.total == ha.total
    assert list(hb.counts[:-12]) == list(ha.counts[12:])  # every binade moved down by 12
    assert tiny.shift("shift12") == -12


def test_quantile_binade():
    import torch

    h = Log2Histogram().add_(torch.tensor([0.0, 1.0, 2.0, 4.0, 8.0]))
    assert quantile_binade(h, 0.5) == h.median_binade() == 1
    assert quantile_binade(h, 0.1) == 0 and quantile_binade(h, 0.9) == 3
    assert quantile_binade(Log2Histogram(), 0.5) is None
    with pytest.raises(ValueError, match="q"):
        quantile_binade(h, 1.0)


def test_json_round_trip(tiny, tmp_path):
    path = tiny.save(tmp_path / "gf.json")
    back = GradientFactorsResult.load(path)
    assert back == tiny
    assert [back.median(v) for v in back.variants] == [tiny.median(v) for v in tiny.variants]
    assert back.divisor_shift("sum") == tiny.divisor_shift("sum")
    d = json.loads(path.read_text())
    assert d["experiment"] == "gradient_factors" and d["config"]["variants"][0] == "ours"
    assert "quick profile" in back.describe()
    with pytest.raises(ValueError, match="vid"):
        back.median("nonsense")


def test_figure_and_table(tiny):
    fig = figures.plot_gradient_factors(tiny)
    ax = fig.axes[0]
    assert ax.get_title() and "log₂" in ax.get_xlabel() and ax.get_ylabel()
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert "median binade" in labels
    # the last row marks the bins the two sources quote, each attributed to its own work (issue 26, item 1)
    assert any("(paper, Fig. 3)" in t and "2⁻³⁴" in t for t in labels)
    assert any("(NVIDIA blog, Fig. 2)" in t and "2⁻³⁰" in t for t in labels)
    ticks = [t.get_text() for t in ax.get_yticklabels()]
    assert len(ticks) == len(tiny.variants) + 1 and ticks[-1].startswith("Multibox SSD")
    assert "\n" in ax.get_title()  # two lines: the title fits the figure's width
    table = figures.gradient_factors_table(tiny)
    assert table.count("<tr>") == len(tiny.variants) + 1 and "below 2⁻²⁴" in table
    with pytest.raises(TypeError, match="GradientFactorsResult"):
        figures.plot_gradient_factors({"not": "a result"})


@pytest.mark.parametrize(
    "kwargs, field",
    [
        (dict(variants=("batch8", "ours")), "config.variants"),
        (dict(variants=("ours", "nonsense")), "config.variants"),
        (dict(variants=("ours", "ours")), "config.variants"),
        (dict(steps=0), "config.steps"),
        (dict(lr=-1.0), "config.lr"),
        (dict(n_train=0), "config.n_train"),
    ],
)
def test_bad_configs_name_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        gf.run(Config(**kwargs), progress=False)
