"""The language-model gradient-scale experiment on a tiny grid: its points and histograms, the exact FP32 shift
check, the comparisons and the fit, its JSON round trip, its figure and table, and bad configurations."""

import dataclasses
import math

import pytest
import torch

from mpt_lab import experiments, figures
from mpt_lab.experiments import lm_gradient_scale as lgs
from mpt_lab.histogram import Log2Histogram, log2_histogram, lost_share


@pytest.fixture(scope="module")
def tiny():
    torch.set_num_threads(1)
    cfg = lgs.Config(
        profile="quick",
        vocabs=(64, 256),
        batch_sizes=(4, 16),
        bptt=8,
        steps=6,
        record_steps=2,
        shift_check=3,
        threads=1,
    )
    return lgs.run(cfg, progress=False)


def test_every_point_is_trained_and_recorded(tiny):
    assert [(p["vocab_size"], p["tokens"]) for p in tiny.points] == [(64, 32), (64, 128), (256, 32), (256, 128)]
    for p in tiny.points:
        for which in ("init", "trained"):
            h = p[which]
            assert isinstance(h, Log2Histogram) and h.total > 0 and h.nonfinite == 0
        assert p["log2_vn"] == pytest.approx(math.log2(p["vocab_size"] * p["tokens"]))
        assert math.isfinite(p["loss_init"]) and math.isfinite(p["loss_trained"])
        assert abs(p["loss_init"] - math.log(p["vocab_size"])) < 0.5  # p ≈ 1/V at the first step
    rows = tiny.summary("init")
    assert [r["median_binade"] for r in rows] == [math.floor(r["median_log2"]) for r in rows]
    assert "exact in FP32: True" in tiny.describe()


def test_the_comparisons_and_the_fit(tiny):
    comps = tiny.comparisons()
    assert sorted((c["axis"], c["base"], c["target"], c["k"]) for c in comps) == [
        ("N", (64, 32), (64, 128), 2),
        ("N", (256, 32), (256, 128), 2),
        ("V", (64, 32), (256, 32), 2),
        ("V", (64, 128), (256, 128), 2),
    ]
    c = comps[0]
    h = next(p["trained"] for p in tiny.points if (p["vocab_size"], p["tokens"]) == c["base"])
    assert c["shifted_median"] == pytest.approx(lgs.median_log2(h) - c["k"])
    assert c["shifted_lost"] == lost_share(h, c["k"])
    f = tiny.fit()
    assert set(f) == {"a", "b", "c", "slope_vn", "rms"}
    with pytest.raises(ValueError, match="which"):
        tiny.summary("final")


def test_median_log2_and_lost_share():
    h = log2_histogram(torch.tensor([2.0**-30, 2.0**-20, 2.0**-20 * 1.5, 0.0]))
    assert math.floor(lgs.median_log2(h)) == h.median_binade() == -20
    assert lgs.median_log2(Log2Histogram()) is None
    assert lost_share(h) == pytest.approx(0.25)  # 2^-30 rounds to zero in FP16
    assert lost_share(h, shift=6) == pytest.approx(0.75)  # and 2^-26 · 1.5 too after the shift
    shifted = log2_histogram(torch.tensor([2.0**-33, 2.0**-23, 2.0**-23 * 1.5, 0.0]))
    assert lgs.shifted_exactly(h, shifted, 3) and not lgs.shifted_exactly(h, shifted, 2)


def test_json_figure_and_table(tiny, tmp_path):
    back = lgs.LMGradientScaleResult.load(tiny.save(tmp_path / "g.json"))
    assert back == tiny and back.comparisons() == tiny.comparisons()
    fig = figures.plot_gradient_scale(back)
    ax, bx = fig.axes[:2]
    assert ax.get_xlabel().startswith("log₂(V·N)") and bx.get_ylabel() == "share of values (%)"
    assert ax.get_legend() is not None and bx.get_legend() is not None and fig._suptitle is not None
    table = figures.gradient_scale_table(back)
    assert "log₂(V·N)" in table and "batch × 2<sup>2</sup>" in table
    with pytest.raises(TypeError, match="LMGradientScaleResult"):
        figures.plot_gradient_scale(object())


def test_profiles_and_bad_configs():
    assert "lm_gradient_scale" in experiments.NAMES
    for p in ("quick", "cpu", "long", "full"):
        lgs.config_for(p).validate()
    bad = {"vocabs": (), "batch_sizes": (0,), "record_steps": 80, "shift_check": -1, "model": "huge", "lr": 0.0}
    base = lgs.config_for("quick")
    for name, value in bad.items():
        with pytest.raises(ValueError, match=name):
            lgs.run(dataclasses.replace(base, **{name: value}), progress=False)
    with pytest.raises(ValueError, match="vocabs"):
        lgs.run(dataclasses.replace(base, vocabs=(2,)), progress=False)
    with pytest.raises(ValueError, match="batch_sizes"):
        lgs.run(dataclasses.replace(base, batch_sizes=(8, 8)), progress=False)
