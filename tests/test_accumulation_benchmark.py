"""The accumulation benchmark runs (at a tiny size) and writes what the saved result holds.

Speed is reported, not asserted (DESIGN.md).  The full measurement is
``python benchmarks/accumulation_speed.py --out book/results/accumulation_speed_cpu.json``.
"""

import importlib.util
import math

from conftest import ROOT
from mpt_lab.experiments import load_json


def _load():
    spec = importlib.util.spec_from_file_location("accumulation_speed", ROOT / "benchmarks" / "accumulation_speed.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_benchmark_writes_every_row(tmp_path):
    mod = _load()
    out = tmp_path / "speed.json"
    assert mod.main(["--shape", "8", "64", "8", "--repeat", "2", "--out", str(out)]) == 0
    res = load_json(out)
    assert [r["name"] for r in res["rows"]] == list(mod.CONFIGS)
    for r in res["rows"]:
        assert r["float32_s"] > 0 and r["simulated_s"] > 0
        assert math.isclose(r["ratio"], r["simulated_s"] / r["float32_s"])
        assert len(r["simulated_times_s"]) == 2
    assert res["goal"]["row"] == "FP16 accumulator, sequential" and res["goal"]["goal"] == 30.0
    assert res["provenance"]["config"]["shape"] == [8, 64, 8]
    assert res["provenance"]["command"].startswith("python benchmarks/accumulation_speed.py")
    assert res["mptorch"]["measured"] is False and "mptorch" in res["mptorch"]["why"]


def test_saved_result_is_the_full_size_run():
    res = load_json(ROOT / "book" / "results" / "accumulation_speed_cpu.json")
    assert res["provenance"]["config"]["shape"] == [256, 1024, 256]
    assert res["provenance"]["config"]["torch_threads"] == 1
    first = res["rows"][0]
    assert first["keywords"] == {"accumulator": "FP16"}
    assert math.isclose(res["goal"]["ratio"], first["ratio"])
