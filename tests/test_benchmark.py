"""The round_to benchmark runs and round_to stays within a small factor of NumPy's float16 cast."""

import importlib.util

from conftest import ROOT


def _load():
    spec = importlib.util.spec_from_file_location("round_to_speed", ROOT / "benchmarks" / "round_to_speed.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_round_to_speed_benchmark(tmp_path):
    mod = _load()
    out = tmp_path / "speed.json"
    assert mod.main(["--n", "1000000", "--repeat", "5", "--out", str(out)]) == 0
    import json

    res = json.loads(out.read_text())
    assert res["provenance"]["config"]["n"] == 1_000_000
    ratios = res["ratio_round_to_fp16_vs_astype"]
    # The goal (10^7 values, a quiet machine) is ≤ 3; under a parallel test run allow a margin against noise.
    assert ratios["normal"] < 6, ratios
