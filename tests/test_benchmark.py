"""The round_to benchmark runs (at a tiny size) and writes the table that chapter 1 quotes.

Speed is reported, not asserted: a busy machine must not fail a test (ARCHITECTURE.md).  The full measurement is
``python benchmarks/round_to_speed.py --profile cpu --out book/results/round_to_speed_cpu.json``.
"""

import math

import pytest
from conftest import ROOT, load_benchmark

from mpt_lab.experiments import load_json

FORMATS = ["FP16", "BF16", "FP8_E4M3", "FP8_E5M2", "FP6_E3M2", "FP6_E2M3", "FP4_E2M1"]


@pytest.fixture(scope="module")
def result(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench") / "speed.json"
    assert (
        load_benchmark("round_to_speed").main(
            ["--profile", "quick", "--set", "n=4096", "--set", "repeat=2", "--no-progress", "--out", str(out)]
        )
        == 0
    )
    return load_json(out)


def test_every_row_is_measured(result):
    rows = result["rows"]
    want = {
        (i, f, r, d)
        for i in ("torch", "numpy")
        for f in FORMATS
        for r in ("nearest_even", "stochastic")
        for d in ("normal", "wide")
    }
    assert {(r["input"], r["format"], r["rounding"], r["data"]) for r in rows} == want and len(rows) == len(want)
    for r in rows:
        assert r["native_s"] > 0 and r["round_to_s"] > 0
        assert math.isclose(r["ratio"], r["round_to_s"] / r["native_s"])
        assert len(r["native_times_s"]) == len(r["round_to_times_s"]) == 2
        assert isinstance(r["native"], str) and r["native"]
        # what was timed: the input library's own cast (ml_dtypes through .numpy() where torch has no dtype)
        if r["input"] == "torch" and r["format"] in ("FP16", "BF16", "FP8_E4M3", "FP8_E5M2"):
            assert r["native"].startswith("t.to(torch.")
        elif r["input"] == "torch":
            assert "ml_dtypes" in r["native"] and "torch has no" in r["native"]
        else:
            assert r["native"].startswith("x.astype(")


def test_nearest_even_rows_time_the_same_values(result):
    """round_to and the timed cast agree bit for bit, except torch's E4M3 cast, which saturates."""
    for r in result["rows"]:
        if r["rounding"] == "stochastic":
            assert r["same_values"] is None
        elif (r["input"], r["format"]) == ("torch", "FP8_E4M3"):
            assert r["same_values"] is (r["data"] == "normal")  # normal data stays below 448
        else:
            assert r["same_values"] is True, r


def test_provenance_load_and_summary(result):
    prov = result["provenance"]
    assert prov["config"]["n"] == 4096 and prov["config"]["threads"] == 1
    assert prov["command"].startswith("python benchmarks/round_to_speed.py --profile quick")
    assert result["experiment"] == "round_to_speed" and result["config"] == prov["config"]
    assert {"torch", "numpy", "ml_dtypes"} <= set(prov["versions"])
    assert set(result["load_average"]) == {"start", "end"}
    summary = result["summary"]
    assert set(summary) == {
        f"{i} {r} {d}" for i in ("torch", "numpy") for r in ("nearest_even", "stochastic") for d in ("normal", "wide")
    }
    for key, ratio in summary.items():
        i, r, d = key.split()
        assert ratio == max(x["ratio"] for x in result["rows"] if (x["input"], x["rounding"], x["data"]) == (i, r, d))


def test_chapter_1_table(result):
    from mpt_lab import figures

    table = figures.round_to_speed_table(result, data="normal")
    assert table.count("<tr>") == 1 + 2 * len(FORMATS) and "4,096 float32 values" in table
    with pytest.raises(ValueError, match="data"):
        figures.round_to_speed_table(result, data="uniform")
    with pytest.raises(TypeError, match="result"):
        figures.round_to_speed_table([])


def test_readme_quotes_the_saved_book_build():
    """The README's build time is the one ``benchmarks/book_times.py`` saved, not a number typed in by hand."""
    d = load_json(ROOT / "book" / "results" / "book_build_cpu.json")
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert d["returncode"] == 0 and d["provenance"]["config"]["profile"] == "cpu" and len(d["notebook_seconds"]) >= 10
    assert f"builds in {round(d['build_seconds'])} s" in readme
    verdict = "within" if d["within_budget"]["book"] else "over"
    assert f"{verdict} its {d['budget_seconds']['book']} s budget" in readme
    slowest = max(d["notebook_seconds"], key=d["notebook_seconds"].get)
    assert f"`{slowest}` takes {round(d['notebook_seconds'][slowest])} s" in readme  # by name: chapters renumber
