"""The experiment runner (profiles, seeding, threads, provenance, JSON, the CLI, --list/--all) and the small
experiments end to end: ssd_histogram, loss_scaling, master_weights_stall."""

import dataclasses
import json
import math
from pathlib import Path

import pytest
import torch

from mpt_lab import experiments
from mpt_lab.experiments import load_json, loss_scaling, master_weights_stall, save_json, ssd_histogram
from mpt_lab.experiments.__main__ import main as experiments_main
from mpt_lab.experiments.ssd_histogram import Config, SSDHistogramResult
from mpt_lab.harness import runner

ROOT = Path(__file__).resolve().parents[1]


# ------------------------------------------------------------------------------------------------- the runner
def test_every_experiment_is_registered_with_its_profiles():
    for name in experiments.NAMES:
        e = experiments.get(name)
        assert e.name == name and e.Result.NAME == name
        assert set(e.profiles) <= set(experiments.RUN_PROFILES) and {"quick", "cpu", "full"} <= set(e.profiles)
        for p in e.profiles:
            cfg = e.config_for(p)
            assert cfg.profile == p
            cfg.validate()  # every declared profile is a valid configuration
        assert not [f for f in dataclasses.fields(e.Config) if f.name == "profile" and f.default != "custom"]
    with pytest.raises(ValueError, match="must be one of"):
        experiments.get("nonsense")


def test_a_missing_profile_names_the_ones_that_exist():
    with pytest.raises(ValueError, match=r"no 'long' profile; it has quick, cpu, full"):
        loss_scaling.config_for("long")
    with pytest.raises(ValueError, match="profile must be one of"):
        loss_scaling.config_for("huge")


def test_profile_never_picks_long(monkeypatch):
    import mpt_lab

    monkeypatch.setenv("MPT_LAB_PROFILE", "long")
    with pytest.raises(ValueError, match="command line"):
        mpt_lab.profile()
    monkeypatch.setenv("MPT_LAB_PROFILE", "quick")
    assert mpt_lab.profile() == "quick"


def test_bad_configs_are_named():
    with pytest.raises(TypeError, match="Config"):
        loss_scaling.run("quick")
    with pytest.raises(TypeError, match="Config"):
        loss_scaling.run(master_weights_stall.Config())
    with pytest.raises(ValueError, match="config.dtype"):
        loss_scaling.run(loss_scaling.Config(dtype="float8"), progress=False)
    with pytest.raises(ValueError, match="config.steps"):
        loss_scaling.run(loss_scaling.Config(steps=0), progress=False)
    with pytest.raises(ValueError, match="config.threads"):
        loss_scaling.run(loss_scaling.Config(threads=-1), progress=False)


def test_json_round_trip_keeps_nonfinite_and_histograms(tmp_path):
    from mpt_lab.histogram import log2_histogram

    h = log2_histogram(torch.tensor([0.0, 1.0, 3e-9, float("inf")]))
    p = save_json({"a": float("inf"), "b": [float("nan"), (1, 2)], "h": h, 3: "x"}, tmp_path / "x.json")
    back = load_json(p)
    assert back["a"] == math.inf and math.isnan(back["b"][0]) and back["b"][1] == [1, 2] and back["3"] == "x"
    assert back["h"] == h
    assert json.loads(p.read_text())["a"] == "inf"  # standard JSON on disk
    with pytest.raises(FileNotFoundError):
        load_json(tmp_path / "missing.json")
    with pytest.raises(TypeError):
        save_json([1], tmp_path / "y.json")
    with pytest.raises(TypeError, match="tensor"):
        save_json({"t": torch.ones(2)}, tmp_path / "z.json")


def test_set_parses_like_the_field():
    parse = runner._parse_like
    assert parse((128, 256), "64,512") == (64, 512) and parse(("a:1",), "b:2,c:3") == ("b:2", "c:3")
    assert parse(True, "no") is False and parse(3, "7") == 7 and parse(0.5, "2") == 2.0 and parse("a", "b") == "b"
    with pytest.raises(ValueError):
        parse(True, "maybe")


@pytest.fixture(scope="module")
def small_loss_scaling():
    cfg = loss_scaling.Config(profile="quick", steps=60, growth_interval=10, hidden=32, threads=1)
    return cfg, loss_scaling.run(cfg, progress=False)


def test_provenance_and_command_reproduce_the_run(small_loss_scaling, tmp_path, capsys):
    cfg, r = small_loss_scaling
    prov = r.provenance
    assert {"command", "device", "versions", "date", "config", "seconds", "experiment", "profile"} <= set(prov)
    assert prov["experiment"] == "loss_scaling" and prov["seconds"] > 0 and "torch" in prov["versions"]
    assert prov["config"] == r.config == runner._decode(runner._encode(dataclasses.asdict(cfg)))
    cmd = prov["command"]
    assert cmd.startswith("python -m mpt_lab.experiments.loss_scaling --profile quick") and "--set steps=60" in cmd
    # the recorded command, run through the CLI, gives the same numbers
    argv = cmd.split()[3:] + ["--out", str(tmp_path / "again.json"), "--no-progress"]
    assert loss_scaling.main(argv) == 0
    again = loss_scaling.LossScalingResult.load(tmp_path / "again.json")
    assert again.config == r.config and again.losses == r.losses and again.history == r.history
    assert "wrote" in capsys.readouterr().out


def test_seeding_and_threads(small_loss_scaling):
    cfg, r = small_loss_scaling
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        again = loss_scaling.run(cfg, progress=False)  # cfg.threads = 1 for the run ...
        assert torch.get_num_threads() == 2  # ... and the caller's setting afterwards
    finally:
        torch.set_num_threads(before)
    assert again.losses == r.losses  # same seed, same numbers
    other = loss_scaling.run(dataclasses.replace(cfg, seed=1), progress=False)
    assert other.losses != r.losses


def test_progress_off_prints_one_timing_line(small_loss_scaling, monkeypatch, capsys):
    cfg, _ = small_loss_scaling
    monkeypatch.setenv("MPT_LAB_PROGRESS", "0")
    loss_scaling.run(dataclasses.replace(cfg, steps=5), progress=None)
    out = capsys.readouterr()
    assert out.out.count("\n") == 1 and "loss_scaling (quick profile):" in out.out and "s on " in out.out
    assert "it/s" not in out.err  # no progress bar


def test_cli_errors_name_the_field():
    with pytest.raises(SystemExit):
        loss_scaling.main(["--set", "nonsense=1"])
    with pytest.raises(SystemExit):
        loss_scaling.main(["--set", "steps"])
    with pytest.raises(SystemExit):
        loss_scaling.main(["--profile", "long"])


def test_list_and_all(tmp_path, capsys):
    assert experiments_main(["--list"]) == 0
    listing = capsys.readouterr().out
    assert all(name in listing for name in experiments.NAMES) and "quick, cpu" in listing
    assert experiments_main(["--all", "--profile", "full", "--out", str(tmp_path), "--dry-run"]) == 0
    dry = capsys.readouterr().out
    full = [n for n in experiments.NAMES if "full" in experiments.get(n).profiles]
    assert dry.count(": python -m mpt_lab.experiments.") == len(full) and not list(tmp_path.iterdir())
    assert "sum" in dry and all(f"--out {tmp_path / (n + '_full.json')}" in dry for n in full)
    # a real --all run of one experiment, then a second call skips what is saved
    assert experiments_main(["--all", "--profile", "quick", "--out", str(tmp_path), "--only", "message_passing"]) == 0
    saved = tmp_path / "message_passing_quick.json"
    assert saved.exists() and experiments.get("message_passing").Result.load(saved).all_low_precision()
    assert "+ message_passing: done in" in capsys.readouterr().out
    assert experiments_main(["--all", "--profile", "quick", "--out", str(tmp_path), "--only", "message_passing"]) == 0
    again = capsys.readouterr().out
    assert f"- message_passing: skipped: {saved} exists" in again
    with pytest.raises(SystemExit):
        experiments_main(["--all", "--profile", "quick"])
    with pytest.raises(SystemExit):
        experiments_main(["--all", "--profile", "quick", "--out", str(tmp_path), "--only", "nope"])


def test_saved_results_load():
    for name in experiments.NAMES:
        for p in ("full", "long"):
            r = experiments.saved(name, p)
            if r is not None:  # whatever is committed must load and describe itself
                assert r.profile == p and r.describe() and r.provenance["command"].startswith("python -m")


# ------------------------------------------------------------------------------------------------ ssd_histogram
@pytest.fixture(scope="module")
def tiny_result():
    cfg = Config(
        profile="quick",
        steps=6,
        n_train=64,
        n_test=8,
        batch_size=8,
        warmup_steps=2,
        phases=3,
        per_module=True,
        threads=1,
        sweep=("small:64",),
        sweep_steps=2,
    )
    return ssd_histogram.run(cfg, progress=False)


def test_run_records_histograms(tiny_result):
    r = tiny_result
    assert r.steps == list(range(1, 7)) and len(r.losses) == 6 and all(math.isfinite(x) for x in r.losses)
    assert [s for s, _ in r.map50] == [0, 6]
    assert r.map_evaluator.startswith("pycocotools") and "pycocotools" in r.describe()  # who computed the mAP
    assert r.activation.total > 0 and r.weight.total > 0
    # the phases partition the run, and their histograms add up to the whole
    assert [(p["from"], p["to"]) for p in r.phases] == [(1, 2), (3, 4), (5, 6)]
    assert sum(p["activation"] for p in r.phases) == r.activation
    assert sum(r.by_module.values()).total == r.activation.total
    # every trainable parameter's gradient was counted once per step
    n_params = sum(p.numel() for p in ssd_histogram.build_ssd("small").parameters())
    assert r.weight.total == 6 * n_params
    assert list(r.sweep) == ["small, 64 px"] and r.sweep["small, 64 px"].total > 0


def test_summary_follows_the_definitions(tiny_result):
    from mpt_lab import formats as F
    from mpt_lab.scaling import max_gradient_scale

    h = tiny_result.activation
    s = tiny_result.summary("FP16")
    assert s.zeros == h.fraction_zero() and s.lost == h.fractions("FP16")["underflow"]
    assert 0 <= s.lost <= s.below_smallest_subnormal and s.lost >= s.lost_at_8 >= s.lost_at_2_15
    assert s.max_gradient_rule == max_gradient_scale(h.amax, "FP16")
    assert s.max_gradient_rule <= s.max_scale <= 2 * s.max_gradient_rule
    assert h.amax * s.max_gradient_rule <= F.FP16.max
    assert s.median_binade == h.median_binade()
    with pytest.raises(ValueError):
        tiny_result.summary("FP16", which="bias")
    assert "quick profile" in tiny_result.describe()


def test_json_round_trip(tiny_result, tmp_path):
    path = tiny_result.save(tmp_path / "r.json")
    back = SSDHistogramResult.load(path)
    assert back == tiny_result and back.summary() == tiny_result.summary()
    d = json.loads(path.read_text())
    assert d["experiment"] == "ssd_histogram"
    d["experiment"] = "other"
    with pytest.raises(ValueError):
        SSDHistogramResult.from_dict(d)
    del d["losses"]
    d["experiment"] = "ssd_histogram"
    with pytest.raises(ValueError, match="losses"):
        SSDHistogramResult.from_dict(d)


def test_ssd_sweep_entries_are_checked():
    with pytest.raises(ValueError, match="config.sweep"):
        ssd_histogram.run(Config(sweep=("tiny-net:64",), sweep_steps=2), progress=False)
    with pytest.raises(ValueError, match="sweep_steps"):
        ssd_histogram.run(Config(sweep=("small:64",), sweep_steps=0), progress=False)


# ----------------------------------------------------------------------------------- loss scaling, master weights
def test_loss_scaling_experiment(small_loss_scaling, tmp_path):
    _, r = small_loss_scaling
    assert r.identical and len(r.history["mpt_lab"]) == 60
    assert [h[1] for h in r.history["mpt_lab"]] == [h[1] for h in r.history["torch"]]
    assert [h[2] for h in r.history["mpt_lab"]] == [h[2] for h in r.history["torch"]]
    assert r.history["mpt_lab"][10][1] == 2 * r.history["mpt_lab"][0][1] or r.overflow_steps
    back = loss_scaling.LossScalingResult.load(r.save(tmp_path / "ls.json"))
    assert back == r and "identical to torch: True" in back.describe()


def test_master_weights_stall_experiment(tmp_path):
    r = master_weights_stall.run(master_weights_stall.Config(profile="quick", steps=300, threads=1), progress=False)
    assert set(r.losses) == set(master_weights_stall.RUNS) and len(r.swamped) == 300 == len(r.underflowed)
    assert sum(r.swamped) / 300 > 0.5 and 0 < sum(r.underflowed) / 300 < 0.5
    back = master_weights_stall.StallResult.load(r.save(tmp_path / "s.json"))
    assert back.losses == r.losses and back.swamped == r.swamped and back.underflowed == r.underflowed
    # the full profile (the saved GPU run) keeps its three runs; results saved without underflowed still load
    assert master_weights_stall.config_for("full").masters_without_scale is False
    d = r.to_dict()
    d.pop("underflowed")
    d["losses"].pop(master_weights_stall.RUNS[3])
    assert master_weights_stall.StallResult.from_dict(d).underflowed == []


# ------------------------------------------------------------------------------------------- saved results
def _saved_results():
    return sorted(p for p in runner.results_dir().glob("*.json") if not p.name.startswith("gpu_slot_"))


@pytest.mark.parametrize("path", _saved_results(), ids=lambda p: p.name)
def test_every_saved_result_loads(path):
    """Every result under book/results/ still loads: an experiment's with its Result class, in today's names (old
    Config fields and recipe names mapped when read: ``arms``/``precisions`` → ``recipes``, the divergence
    results' "fp16" → "fp16_unscaled"); a benchmark's (``benchmarks/NAME.py``) as the JSON its figures read."""
    from mpt_lab.recipes import RECIPES

    name = path.stem.rpartition("_")[0]
    if name in experiments.NAMES:
        r = experiments.get(name).Result.load(path)
        assert r.provenance.get("command") and isinstance(r.config, dict) and r.describe()
        fields = {f.name for f in dataclasses.fields(experiments.get(name).Config)}
        if "recipes" in fields:
            assert not {"arms", "precisions"} & set(r.config), f"{path.name}: an old Config field was not renamed"
        assert r.provenance.get("config", r.config) == r.config
        if "recipes" in r.config:
            assert set(r.config["recipes"]) <= set(RECIPES), f"{path.name}: a recipe the registry does not know"
        return
    d = load_json(path)
    script = d.get("experiment", name)
    assert (ROOT / "benchmarks" / f"{script}.py").exists(), f"{path.name}: neither an experiment's nor a benchmark's"
    assert isinstance(d.get("provenance"), dict) and d["provenance"].get("command"), path.name
