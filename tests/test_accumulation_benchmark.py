"""The accumulation benchmark runs (quick profile) on the experiment runner and writes what the saved result holds.

Speed is reported, not asserted (ARCHITECTURE.md).  The full measurement is
``python benchmarks/accumulation_speed.py --profile cpu --out book/results/accumulation_speed_cpu.json``.
"""

import math
import shlex

import pytest
from conftest import ROOT, load_benchmark

from mpt_lab.experiments import load_json


def _check_rows(res, configs, repeat):
    assert [r["name"] for r in res["rows"]] == list(configs)
    for r in res["rows"]:
        assert r["float32_s"] > 0 and r["simulated_s"] > 0
        assert math.isclose(r["ratio"], r["simulated_s"] / r["float32_s"])
        assert math.isclose(r["cpu_ratio"], r["simulated_cpu_s"] / r["float32_cpu_s"])
        assert len(r["simulated_times_s"]) == len(r["float32_times_s"]) == repeat
    first = res["rows"][0]
    assert first["name"] == "FP16 accumulator, sequential" and first["keywords"] == {"accumulator": "FP16"}
    goal = res["goal"]
    assert goal["row"] == first["name"] and goal["goal"] == 30.0
    assert math.isclose(goal["ratio"], first["ratio"]) and math.isclose(goal["cpu_ratio"], first["cpu_ratio"])
    assert goal["met"] is (first["ratio"] <= 30.0)
    assert res["summary"] == {"wall clock": goal["ratio"], "CPU time": goal["cpu_ratio"]}
    assert set(res["load_average"]) == {"start", "end"}
    assert res["mptorch"]["measured"] is False and "mptorch" in res["mptorch"]["why"]
    # issue 29, item 7: the same calls on float32 operands (not FP16 values), beside the FP16-valued ones
    assert set(res["inputs"]) == {"simulated", "simulated_float32_inputs"}
    general = res["general_path"]
    assert general["goal"] == 3.0 and list(general["rows"]) == list(configs)
    for r in res["rows"]:
        assert r["simulated_float32_inputs_s"] > 0 and len(r["simulated_float32_inputs_times_s"]) == repeat
        assert math.isclose(r["inputs_ratio"], r["simulated_float32_inputs_s"] / r["simulated_s"])
        assert math.isclose(r["inputs_cpu_ratio"], r["simulated_float32_inputs_cpu_s"] / r["simulated_cpu_s"])
        assert general["rows"][r["name"]] == {"ratio": r["inputs_ratio"], "cpu_ratio": r["inputs_cpu_ratio"]}
    assert general["met_wall"] == sum(r["inputs_ratio"] <= 3.0 for r in res["rows"])
    assert general["met_cpu"] == sum(r["inputs_cpu_ratio"] <= 3.0 for r in res["rows"])


def test_quick_profile_writes_every_row(tmp_path):
    mod = load_benchmark("accumulation_speed")
    out = tmp_path / "speed.json"
    assert mod.main(["--profile", "quick", "--no-progress", "--out", str(out)]) == 0
    res = load_json(out)
    assert res["experiment"] == "accumulation_speed" and res["config"] == res["provenance"]["config"]
    assert res["config"]["shape"] == [8, 64, 8] and res["config"]["repeat"] == 2
    assert res["config"]["threads"] == 1 and res["config"]["device"] == "cpu"
    assert res["provenance"]["command"] == (
        f"python benchmarks/accumulation_speed.py --profile quick --out {shlex.quote(str(out))}"
    )
    assert {"device", "versions", "date", "load_average"} <= set(res["provenance"])
    _check_rows(res, mod.CONFIGS, 2)
    assert mod.BENCHMARK.Result.from_dict(res).describe().endswith(res["mptorch"]["why"] + ")")


def test_bad_shape_is_refused():
    mod = load_benchmark("accumulation_speed")
    with pytest.raises(ValueError, match="config.shape"):
        mod.Config(shape=(8, 0, 8)).validate()
    with pytest.raises(ValueError, match="config.device"):
        mod.Config(device="cuda").validate()


def test_saved_result_is_the_full_size_run():
    mod = load_benchmark("accumulation_speed")
    res = load_json(ROOT / "book" / "results" / "accumulation_speed_cpu.json")
    assert res["experiment"] == "accumulation_speed" and res["config"]["profile"] == "cpu"
    assert res["config"]["shape"] == [256, 1024, 256] and res["config"]["threads"] == 1
    assert res["provenance"]["command"] == (
        "python benchmarks/accumulation_speed.py --profile cpu --out book/results/accumulation_speed_cpu.json"
    )
    _check_rows(res, mod.CONFIGS, res["config"]["repeat"])
