"""Experiments: a tiny run of ssd_histogram end to end, JSON round trip, CLI, tables."""

import json
import math

import pytest
import torch

from mpt_lab.experiments import load_json, save_json, ssd_histogram
from mpt_lab.experiments.ssd_histogram import Config, SSDHistogramResult


@pytest.fixture(scope="module")
def tiny_result():
    cfg = Config(profile="quick", steps=6, n_train=64, n_test=8, batch_size=8, warmup_steps=2, phases=3,
                 per_module=True, threads=1)
    return ssd_histogram.run(cfg, progress=False)


def test_run_records_histograms(tiny_result):
    r = tiny_result
    assert r.steps == list(range(1, 7)) and len(r.losses) == 6 and all(math.isfinite(x) for x in r.losses)
    assert [s for s, _ in r.map50] == [0, 6]
    assert r.activation.total > 0 and r.weight.total > 0
    # the phases partition the run, and their histograms add up to the whole
    assert [(p["from"], p["to"]) for p in r.phases] == [(1, 2), (3, 4), (5, 6)]
    assert sum(p["activation"] for p in r.phases) == r.activation
    # per-module histograms add up to the total too
    assert sum(r.by_module.values()).total == r.activation.total
    # every trainable parameter's gradient was counted once per step
    model = ssd_histogram.build_ssd("small")
    n_params = sum(p.numel() for p in model.parameters())
    assert r.weight.total == 6 * n_params
    assert r.provenance["config"]["steps"] == 6 and "torch" in r.provenance["versions"]


def test_summary_and_table(tiny_result):
    s = tiny_result.summary("FP16")
    assert 0 <= s["zeros"] <= 1 and s["underflow at S=1"] >= s["underflow at S=8"] >= s["underflow at S=2^15"]
    assert s["max-gradient rule S"] <= s["largest S without overflow"] <= 2 * s["max-gradient rule S"]
    html = ssd_histogram.comparison_table({"tiny": tiny_result})
    assert "66.8%" in html and html.count("<tr>") == 11
    with pytest.raises(TypeError):
        ssd_histogram.comparison_table({"x": 1})
    assert "quick profile" in tiny_result.describe()


def test_json_round_trip(tiny_result, tmp_path):
    path = tiny_result.save(tmp_path / "r.json")
    back = SSDHistogramResult.load(path)
    assert back.activation == tiny_result.activation and back.weight == tiny_result.weight
    assert back.losses == tiny_result.losses and back.map50 == tiny_result.map50
    assert [p["activation"] for p in back.phases] == [p["activation"] for p in tiny_result.phases]
    assert back.summary() == tiny_result.summary()
    d = json.loads(path.read_text())
    assert d["experiment"] == "ssd_histogram"
    d["experiment"] = "other"
    with pytest.raises(ValueError):
        SSDHistogramResult.from_dict(d)


def test_configs_and_cli(tmp_path):
    for p in ("quick", "cpu", "full"):
        assert ssd_histogram.config_for(p).profile == p
        assert ssd_histogram.sweep_for(p)["sizes"]
    with pytest.raises(ValueError):
        ssd_histogram.config_for("huge")
    out = tmp_path / "cli.json"
    rc = ssd_histogram.main(["--profile", "quick", "--set", "steps=3", "--set", "n_train=32", "--set", "n_test=4",
                             "--set", "batch_size=8", "--set", "warmup_steps=1", "--out", str(out)])
    assert rc == 0
    r = SSDHistogramResult.load(out)
    assert r.config["steps"] == 3 and r.provenance["command"].startswith("python -m mpt_lab.experiments.ssd_histogram")
    with pytest.raises(SystemExit):
        ssd_histogram.main(["--set", "nonsense=1"])
    with pytest.raises(TypeError):
        ssd_histogram.run("quick")


def test_size_sweep_returns_histograms():
    out = ssd_histogram.size_sweep((("small", 64),), steps=2, batch_size=4, progress=False)
    assert list(out) == ["small, 64 px"] and out["small, 64 px"].total > 0


def test_save_json_handles_nonfinite(tmp_path):
    p = save_json({"a": float("inf"), "b": [float("nan")]}, tmp_path / "x.json")
    assert load_json(p) == {"a": "inf", "b": ["nan"]}
    with pytest.raises(FileNotFoundError):
        load_json(tmp_path / "missing.json")
    with pytest.raises(TypeError):
        save_json([1], tmp_path / "y.json")


def test_loss_scaling_experiment(tmp_path):
    from mpt_lab.experiments import loss_scaling

    cfg = loss_scaling.Config(profile="quick", steps=60, growth_interval=10, hidden=32, threads=1)
    r = loss_scaling.run(cfg, progress=False)
    assert r.identical and len(r.history["mpt_lab"]) == 60
    assert [h[1] for h in r.history["mpt_lab"]] == [h[1] for h in r.history["torch"]]
    assert [h[2] for h in r.history["mpt_lab"]] == [h[2] for h in r.history["torch"]]
    assert r.history["mpt_lab"][10][1] == 2 * r.history["mpt_lab"][0][1] or r.overflow_steps
    back = loss_scaling.LossScalingResult.load(r.save(tmp_path / "ls.json"))
    assert back.history == r.history and back.identical and "identical to torch: True" in back.describe()
    with pytest.raises(ValueError):
        loss_scaling.run(loss_scaling.Config(dtype="float8"), progress=False)
    with pytest.raises(ValueError):
        loss_scaling.config_for("tiny")


def test_master_weights_stall_experiment(tmp_path):
    from mpt_lab.experiments import master_weights_stall as mws

    r = mws.run(mws.Config(profile="quick", steps=300, threads=1), progress=False)
    assert set(r.losses) == {"FP32", "pure FP16", "FP16 + FP32 masters"} and len(r.swamped) == 300
    assert sum(r.swamped) / 300 > 0.5
    back = mws.StallResult.load(r.save(tmp_path / "s.json"))
    assert back.losses == r.losses and back.swamped == r.swamped


def test_swamped_fraction():
    from mpt_lab.experiments.master_weights_stall import swamped_fraction

    w = torch.tensor([1.0, 1.0, 1.0, 1024.0, 1025.0])
    u = torch.tensor([2.0**-11, 2.0**-10, 0.0, 0.5, 0.5])   # tie (lost), survives, zero (ignored), tie to even (lost), survives
    assert swamped_fraction(w, u) == 2 / 4
    assert math.isnan(swamped_fraction(w, torch.zeros(5)))
    with pytest.raises(ValueError):
        swamped_fraction(w, torch.zeros(3))
    with pytest.raises(TypeError):
        swamped_fraction([1.0], [1.0])


def test_set_parses_like_the_field():
    from mpt_lab.experiments._common import _parse_like

    assert _parse_like((128, 256), "64,512") == (64, 512)
    assert _parse_like(True, "no") is False and _parse_like(3, "7") == 7 and _parse_like(0.5, "2") == 2.0
    assert _parse_like("a", "b") == "b"
