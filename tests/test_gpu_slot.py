"""The GPU slot, proven on the CPU: the priority table, ``--budget`` and ``--dry-run``, every full configuration
cut to a smoke run (``--all --profile full --smoke``), the preflight, the distributed experiment's placement on one
GPU, packing a slot's results into one archive and unpacking them into ``book/results/`` with their checks, and the
slot script's CPU path."""

import dataclasses
import io
import json
import os
import re
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import torch
from conftest import load_benchmark

from mpt_lab import experiments
from mpt_lab.experiments.__main__ import main as experiments_main
from mpt_lab.harness import budget, runner, slot
from mpt_lab.harness import preflight as pre

ROOT = Path(__file__).resolve().parents[1]
FULL = [n for n in experiments.NAMES if "full" in experiments.get(n).profiles]


# ------------------------------------------------------------------------------------------- the priority table
def test_every_full_profile_has_a_row_a_smoke_run_and_the_seeds_fit_the_first_slot():
    missing = [n for n in FULL if n not in budget.ESTIMATES]
    assert not missing, (
        f"{missing} have a full profile but no row in mpt_lab.harness.budget.ESTIMATES: add an "
        "Estimate (priority, FLOPs, bytes, operators, host seconds, basis) for each"
    )
    no_smoke = [n for n in FULL if experiments.get(n).smoke is None]
    assert not no_smoke, f"{no_smoke} have a full profile but no smoke overrides (Experiment(..., smoke=SMOKE))"
    stale = [n for n in budget.ESTIMATES if n not in FULL and n not in budget.BENCHMARKS]
    assert not stale, f"budget.ESTIMATES has rows for {stale}, which have no full profile"
    for name, script in budget.BENCHMARKS.items():  # a benchmark row: a script with a full profile
        assert script == f"benchmarks/{name}.py" and (ROOT / script).exists()
        assert "full" in load_benchmark(name).BENCHMARK.profiles and load_benchmark(name).BENCHMARK.smoke
    priorities = [e.priority for e in budget.ESTIMATES.values()]
    assert len(set(priorities)) == len(priorities), "two rows share a priority"
    # the five results the book exists for run first, then the GPU numbers issue 30 asked for, and they fit one slot
    order = budget.plan(budget.ESTIMATES)
    assert order[:5] == list(budget.SEEDS) and order[5:8] == ["amp_recipe", "roofline", "memory_per_parameter"]
    seeds = budget.STARTUP_SECONDS + sum(budget.expected_seconds(n) for n in budget.SEEDS)
    assert seeds <= budget.SLOT_SECONDS, f"the five seed results are expected to take {seeds:.0f} s > one slot"
    for group in budget.slots(order):
        assert (
            len(group) == 1 or budget.STARTUP_SECONDS + sum(map(budget.expected_seconds, group)) <= budget.SLOT_SECONDS
        )
    for n in budget.ESTIMATES:
        e = budget.ESTIMATES[n]
        assert e.seconds > 0 and len(e.basis) > 40 and e.needs, f"{n}: an estimate needs its numbers and basis"
        if not e.measured:  # never measured: twice the model, or the log's bound
            assert e.seconds == max(budget.UNMEASURED_FACTOR * e.model_seconds, e.at_least)
    with pytest.raises(KeyError, match="ESTIMATES"):
        budget.expected_seconds("no_such_experiment")


def test_rows_corrected_from_the_slots_logs():
    """Each row a slot measured reads as measured, with the seconds of that slot's summary
    (book/results/gpu_slot_summary_*.json): the first slot (2026-11-26) for the rows it finished, the second
    (2026-11-28, two runs) for the five seed results, the benchmarks and the two reruns.  The first slot's log
    also stopped bigLSTM's 200-step run after more than 88 s, while the second ran the 100 steps of today's profile
    in 22.7 s: the first slot's bound came from another configuration and a 75 s compilation of the histogram
    kernel, which the startup no longer counts."""
    log = (ROOT / "book" / "results" / "gpu_slot_log_2026-11-26.txt").read_text()
    assert "histogram kernel ready in 74.8 s" in log and budget.STARTUP_SECONDS < 75
    rows = {}
    for day in ("2026-11-26", "2026-11-28", "2026-11-28b"):
        summary = json.loads((ROOT / "book" / "results" / f"gpu_slot_summary_{day}.json").read_text())
        assert "H200" in summary["provenance"]["device"]
        rows.update({r["experiment"]: r["seconds"] for r in summary["experiments"] if r["status"] == "done"})
    for name in (*budget.SEEDS, "roofline", "memory_per_parameter", "memory_tradeoffs", "tensor_core_accumulation"):
        e = budget.ESTIMATES[name]
        assert e.basis_kind == "measured" and e.measured == pytest.approx(rows[name], abs=0.1), name
        assert "2026-11-28" in e.basis, name
    for name in ("fp8_recipes", "gat_amp"):  # what the first slot measured and no slot ran again
        assert budget.ESTIMATES[name].measured == pytest.approx(rows[name], abs=0.1), name
    assert experiments.get("biglstm").config_for("full").steps == 100 and rows["biglstm"] < 44
    # what no slot has measured in its current form reads as such
    assert budget.ESTIMATES["amp_recipe"].basis_kind != "measured"


def test_a_slot_runs_what_the_book_lacks(monkeypatch, tmp_path):
    """to_run(): rows without a saved result, or whose saved result lacks the field the row names (made by older
    code), in priority order; CPU rows never; slots() packs them, the first slot first."""
    monkeypatch.setattr(runner, "results_dir", lambda: tmp_path)
    assert budget.to_run() == [n for n in budget.plan(budget.ESTIMATES) if budget.ESTIMATES[n].gpu]
    (tmp_path / "ssd_histogram_full.json").write_text("{}")
    (tmp_path / "amp_recipe_full.json").write_text(json.dumps({"rows": []}))  # saved, but older
    (tmp_path / "tensor_core_accumulation_full.json").write_text(json.dumps({"kernels": {}}))  # saved, current
    assert "ssd_histogram" not in budget.to_run() and "tensor_core_accumulation" not in budget.to_run()
    assert budget.stale_reason("amp_recipe") == "the saved result lacks 'graphed'"
    assert budget.stale_reason("roofline") == "no saved result" and budget.stale_reason("ssd_histogram") == ""
    groups = budget.slots()
    assert [n for g in groups for n in g] == budget.to_run() and groups[0][0] == "gradient_factors"
    with pytest.raises(KeyError):
        budget.stale_reason("nonsense")


def test_estimate_arithmetic_and_bad_rows():
    e = budget.Estimate(
        1,
        "x",
        tflop={"fp16": budget.H100["fp16"] * budget.UTILISATION},
        kops=50,
        cpu_seconds=2,
        gbytes=budget.H100["hbm_tb_s"] * 1e3 * budget.MEMORY_UTILISATION,
        basis="test",
    )
    assert e.terms == pytest.approx(
        {"compute": 1.0, "memory": 1.0, "overhead": 50e3 * budget.SECONDS_PER_OP, "host": 2.0}
    )
    assert e.model_seconds == pytest.approx(budget.SAFETY * sum(e.terms.values()))
    assert e.seconds == pytest.approx(budget.UNMEASURED_FACTOR * e.model_seconds) and e.basis_kind == "2 x model"
    bound = dataclasses.replace(e, at_least=1000.0)  # a log's lower bound beats the model
    assert bound.seconds == 1000.0 and bound.basis_kind == "lower bound"
    timed = dataclasses.replace(e, measured=10.0)  # a slot's own time replaces the model, with its margin
    assert timed.seconds == pytest.approx(budget.MEASURED_SAFETY * 10.0) and timed.terms == e.terms
    for bad in (
        dict(priority=0),
        dict(tflop={"int8": 1.0}),
        dict(kops=-1),
        dict(tflop={"fp32": -2}),
        dict(measured=-1.0),
        dict(at_least=-1.0),
    ):
        with pytest.raises(ValueError):
            budget.Estimate(**{"priority": 1, "needs": "x", **bad})
    assert budget.plan(["master_weights_stall", "nonsense", "amp_recipe"]) == [
        "amp_recipe",
        "master_weights_stall",
        "nonsense",
    ]


def test_dry_run_prints_the_table_the_sum_and_the_order(capsys, tmp_path):
    assert experiments_main(["--all", "--profile", "full", "--dry-run"]) == 0
    out = capsys.readouterr().out
    order = budget.plan([*FULL, *budget.BENCHMARKS])
    commands = [
        line for line in out.splitlines() if "python -m mpt_lab.experiments." in line or "python benchmarks/" in line
    ]
    assert [line.split(":")[0].strip() for line in commands] == order
    assert "python benchmarks/roofline.py --profile full" in out
    total = budget.STARTUP_SECONDS + sum(budget.expected_seconds(n) for n in budget.to_run())
    sum_line = [line for line in out.splitlines() if line.split()[:1] == ["sum"]]
    assert len(sum_line) == 1 and sum_line[0].split()[1] == f"{total:.0f}"
    for n in order:  # each row's expected seconds and basis, in the table
        row = next(line for line in out.splitlines() if line.split()[1:2] == [n])
        assert row.split()[2] == f"{budget.expected_seconds(n):.0f}"
        assert budget.ESTIMATES[n].basis_kind in row
    slot_lines = [line.split(":", 1)[1] for line in out.splitlines() if line.strip().startswith("slot ")]
    assert [s.split("(")[0].strip().split(", ") for s in slot_lines] == budget.slots()
    assert not list(tmp_path.iterdir())


# --------------------------------------------------------------------------------------------- --budget, lines
def test_budget_skips_what_does_not_fit_and_reports_each_experiment(tmp_path, capsys, monkeypatch):
    rows = dict(budget.ESTIMATES)
    rows["message_passing"] = dataclasses.replace(
        rows["message_passing"], priority=1, tflop={}, gbytes=0, kops=0, cpu_seconds=0.01, measured=0.0
    )
    rows["loss_scaling"] = dataclasses.replace(rows["loss_scaling"], priority=2, cpu_seconds=10_000.0, measured=0.0)
    rows["master_weights_stall"] = dataclasses.replace(
        rows["master_weights_stall"], priority=3, tflop={}, gbytes=0, kops=0, cpu_seconds=0.01, measured=0.0
    )
    monkeypatch.setattr(budget, "ESTIMATES", rows)
    stall = experiments.get("master_weights_stall")
    monkeypatch.setattr(stall, "run", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("planted failure")))
    argv = [
        "--all",
        "--profile",
        "full",
        "--budget",
        "600",
        "--out",
        str(tmp_path / "r"),
        "--only",
        "master_weights_stall,loss_scaling,message_passing",
        "--summary",
        str(tmp_path / "s.json"),
    ]
    assert experiments_main(argv) == 1  # one failed
    lines = capsys.readouterr().out.splitlines()
    mine = [ln for ln in lines if ln[:2] in ("+ ", "- ", "! ")]
    assert mine[0].startswith("+ message_passing: done in")  # priority order, written as it finished
    assert re.fullmatch(r"- loss_scaling: skipped: expected 300\d\d s > \d+ s left of the budget", mine[1])
    assert mine[2].startswith("! master_weights_stall: FAILED after") and "RuntimeError: planted failure" in mine[2]
    assert (tmp_path / "r" / "message_passing_full.json").exists()
    assert not (tmp_path / "r" / "loss_scaling_full.json").exists()
    summary = json.loads((tmp_path / "s.json").read_text())
    assert [r["status"] for r in summary["experiments"]] == ["done", "skipped", "failed"]
    assert summary["experiments"][0]["seconds"] > 0 and summary["budget"] == 600
    assert "--budget 600" in summary["command"] and summary["provenance"]["device"]
    with pytest.raises(SystemExit):
        experiments_main(["--all", "--profile", "quick", "--budget", "10", "--out", str(tmp_path)])
    with pytest.raises(SystemExit):
        experiments_main(["--all", "--profile", "full", "--budget", "-1", "--out", str(tmp_path)])


def test_a_full_profile_without_a_row_is_refused(monkeypatch, tmp_path):
    rows = dict(budget.ESTIMATES)
    del rows["message_passing"]
    monkeypatch.setattr(budget, "ESTIMATES", rows)
    with pytest.raises(SystemExit):
        experiments_main(["--all", "--profile", "full", "--dry-run"])


# ------------------------------------------------------------------------------------------------- smoke runs
def test_smoke_config_is_the_full_profile_cut_short():
    for name in FULL:
        e = experiments.get(name)
        full, smoke = e.config_for("full"), e.smoke_config()
        assert smoke.profile == runner.SMOKE and smoke.threads == e.smoke.get("threads", 1)
        changed = {f.name for f in dataclasses.fields(full) if getattr(full, f.name) != getattr(smoke, f.name)}
        assert changed <= set(e.smoke) | {"profile", "threads"}, f"{name}: smoke changed {changed - set(e.smoke)}"
        smoke.validate()
        cmd = e.command(smoke, "/tmp/x.json")
        assert cmd.startswith(f"python -m mpt_lab.experiments.{name} --profile full --smoke")
        assert "--set" not in cmd.replace("--set threads=1", "")  # the smoke run is the command, nothing else

    @dataclasses.dataclass
    class Config(runner.ExperimentConfig):
        steps: int = 10

    @dataclasses.dataclass
    class Result(runner.ExperimentResult):
        pass

    try:
        bare = runner.Experiment("x_no_smoke", Config, {"quick": {}, "full": {}}, lambda c, r: {}, Result)
        with pytest.raises(ValueError, match="no smoke run"):
            bare.smoke_config()
        with pytest.raises(ValueError, match="unknown fields"):
            runner.Experiment("x_bad_smoke", Config, {"full": {}}, lambda c, r: {}, Result, smoke={"stepz": 2})
        with pytest.raises(ValueError, match="full profile"):
            runner.Experiment("x_bad_smoke", Config, {"quick": {}}, lambda c, r: {}, Result, smoke={"steps": 2})
    finally:
        for name in ("x_no_smoke", "x_bad_smoke"):
            runner.REGISTRY.pop(name, None)


def test_smoke_results_are_marked_and_never_written_under_book_results(tmp_path, capsys):
    e = experiments.get("message_passing")
    assert e.main(["--smoke", "--out", str(tmp_path / "m.json"), "--no-progress"]) == 0
    r = e.Result.load(tmp_path / "m.json")
    assert r.profile == "smoke" and runner.is_smoke(r) and r.provenance["smoke"]["of"] == "full"
    assert "--profile full --smoke" in r.provenance["command"]
    with pytest.raises(ValueError, match="smoke result must not be saved"):
        r.save(runner.results_dir() / "message_passing_full.json")
    with pytest.raises(SystemExit):
        e.main(["--smoke", "--out", str(runner.results_dir() / "m.json")])
    with pytest.raises(SystemExit):
        experiments_main(["--all", "--profile", "full", "--smoke", "--out", str(runner.results_dir())])
    with pytest.raises(SystemExit):
        experiments_main(["--all", "--profile", "cpu", "--smoke", "--out", str(tmp_path)])
    assert not (runner.results_dir() / "m.json").exists()


# ------------------------------------------------------------------------------------ deadlines, kept arms
def test_an_experiment_stopped_at_its_deadline_keeps_the_arms_it_finished(tmp_path, monkeypatch):
    """biglstm (quick size) with a deadline that passes as its first arm finishes: the run stops between two
    steps of the second arm (not by a signal), raises DeadlineReached naming the arm it kept, and the partial file
    holds that arm whole (every step's loss), the configuration and the provenance, marked partial."""
    from mpt_lab.experiments import biglstm

    clock = {"now": 1000.0}
    monkeypatch.setattr(runner, "deadline_clock", lambda: clock["now"])
    real = runner.Run.arm_done
    seen_steps = []

    def arm_done(self, key, data):
        real(self, key, data)
        clock["now"] = 2000.0  # the deadline (1500) passes as soon as an arm is kept

    monkeypatch.setattr(runner.Run, "arm_done", arm_done)
    real_bar = runner.Run.bar

    def bar(self, iterable=None, **kw):  # count the steps each arm began
        inner = real_bar(self, iterable, **kw)
        if iterable is None or not isinstance(iterable, range):
            return inner
        return (seen_steps.append(i) or i for i in inner)

    monkeypatch.setattr(runner.Run, "bar", bar)
    cfg = dataclasses.replace(
        biglstm.config_for("quick"),
        steps=6,
        eval_every=3,
        hist_every=2,
        sweep_shifts=(),
        recipes=("fp32", "fp16_unscaled"),
        valid_tokens=500,
    )
    partial = tmp_path / "biglstm_quick.partial.json"
    with pytest.raises(runner.DeadlineReached) as stop:
        biglstm.run(cfg, progress=False, deadline=1500.0, partial=partial)
    assert stop.value.arms == ["fp32"] and stop.value.partial == partial and stop.value.experiment == "biglstm"
    kept = json.loads(partial.read_text())
    assert kept["partial"] is True and list(kept["arms"]) == ["fp32"]
    assert len(kept["arms"]["fp32"]["losses"]) == 6 and kept["arms"]["fp32"]["evals"][-1]["step"] == 6
    assert (
        kept["provenance"]["partial"]["arms_done"] == ["fp32"]
        and "deadline" in kept["provenance"]["partial"]["stopped"]
    )
    assert kept["config"]["recipes"] == ["fp32", "fp16_unscaled"] and kept["provenance"]["backends"][
        "cudnn_allow_tf32"
    ] in (True, False)
    assert seen_steps == [1, 2, 3, 4, 5, 6]  # the second arm stopped before its first step
    # without a deadline the run finishes and the partial file is removed
    monkeypatch.setattr(runner.Run, "arm_done", real)
    r = biglstm.run(dataclasses.replace(cfg, recipes=("fp32",), steps=2, eval_every=2), progress=False, partial=partial)
    assert not partial.exists() and list(r.arms) == ["fp32"] and r.provenance["backends"]


def test_all_stops_at_its_deadline_and_the_slot_archive_keeps_the_partial(tmp_path, capsys):
    """--all --deadline 0: the first experiment stops before its first step; nothing runs after it; the summary
    says "stopped"; the partial of a stopped run travels in the archive and unpack leaves it there."""
    out = tmp_path / "r"
    rc = experiments_main(
        [
            "--all",
            "--profile",
            "quick",
            "--only",
            "loss_scaling,message_passing",
            "--deadline",
            "0",
            "--out",
            str(out),
            "--summary",
            str(tmp_path / "s.json"),
        ]
    )
    text = capsys.readouterr().out
    assert rc == 1 and "! loss_scaling: STOPPED at the deadline" in text and "arms kept: none" in text
    assert "- message_passing: skipped: the deadline passed" in text
    rows = json.loads((tmp_path / "s.json").read_text())["experiments"]
    assert [r["status"] for r in rows] == ["stopped", "skipped"] and rows[0]["arms_done"] == []
    work = tmp_path / "slot"
    (work / "results").mkdir(parents=True)
    (work / "results" / "biglstm_full.partial.json").write_text(
        json.dumps(
            {
                "experiment": "biglstm",
                "partial": True,
                "config": {"profile": "full"},
                "arms": {"fp32": {}},
                "provenance": {"profile": "full", "partial": {"arms_done": ["fp32"]}},
            }
        )
    )
    archive = slot.pack(work, tmp_path / "a.tar.gz")
    assert slot.unpack(archive, tmp_path / "into", experiments=experiments) == []
    assert not (tmp_path / "into" / "biglstm_full.json").exists()
    assert slot.partials(archive) == [("results/biglstm_full.partial.json", "biglstm", ["fp32"])]
    assert experiments_main(["--unpack", str(archive), "--into", str(tmp_path / "into")]) == 0
    assert "kept in the archive, not copied: results/biglstm_full.partial.json" in capsys.readouterr().out


def test_every_full_configuration_runs_end_to_end_as_a_smoke_run(tmp_path, capsys):
    """``--all --profile full --smoke`` on this CPU: every experiment with a full profile, its full model shapes
    and code paths cut to a couple of steps, runs and writes one smoke result (≈ 3 minutes of CPU)."""
    out = tmp_path / "smoke"
    rc = experiments_main(
        ["--all", "--profile", "full", "--smoke", "--out", str(out), "--summary", str(tmp_path / "summary.json")]
    )
    text = capsys.readouterr().out
    assert rc == 0, text
    for name in FULL:
        path = out / f"{name}_smoke.json"
        assert path.exists(), f"{name}: no smoke result\n{text}"
        r = experiments.get(name).Result.load(path)
        assert runner.is_smoke(r) and r.config["profile"] == "smoke" and r.describe()
    for name in budget.BENCHMARKS:  # the benchmark rows, each run as a process of its own
        d = json.loads((out / f"{name}_smoke.json").read_text())
        assert runner.is_smoke(d) and d["provenance"]["command"].startswith(f"python benchmarks/{name}.py")
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert {r["experiment"] for r in summary["experiments"] if r["status"] == "done"} == set(FULL) | set(
        budget.BENCHMARKS
    )
    assert summary["smoke"] is True


# ------------------------------------------------------------------------------------------------ the preflight
def test_preflight_on_a_cpu_says_there_is_no_cuda(capsys):
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: tests/test_cuda.py runs the preflight")
    assert pre.main([]) == 0
    out = capsys.readouterr().out
    assert "no CUDA device" in out and "torch " in out
    proc = subprocess.run(
        [sys.executable, "-m", "mpt_lab.harness.preflight"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=300,
    )
    assert proc.returncode == 0 and "no CUDA device" in proc.stdout


def test_preflight_checks_that_a_cpu_has_pass_and_a_failure_is_reported():
    lines = []
    rows = pre.run_checks("cpu", echo=lines.append)
    assert [r["name"] for r in rows] == [c.name for c in pre.PREFLIGHT_CHECKS] and len(lines) == len(rows)
    bad = [r for r in rows if r["status"] == "FAILED"]
    assert not bad, bad
    status = {r["name"]: r["status"] for r in rows}
    assert status["FP8 tensor cores (torch._scaled_mm)"] == "skipped"
    assert status["NCCL process group, one rank"] == "skipped"
    assert status["GradScaler skips an inf step"] == status["bfloat16 autocast, conv net"] == "ok"
    assert status["bfloat16 autocast, LSTM"] == "ok"  # a CPU's LSTM honours BF16
    assert status["gradient-histogram kernel on the device"] == "ok"
    assert status["allocator bytes per parameter"] == "ok"
    assert (
        status["CUDA graph of a whole training step"]
        == status["FP8 GEMMs, fast accumulation off and on"]
        == status["GPU clocks and power"]
        == "skipped"
    )  # CUDA only: the GPU's preflight

    def broken(device):
        raise RuntimeError("planted\nsecond line")

    rows = pre.run_checks("cpu", checks=(pre.Check("broken", broken, "-"), pre.PREFLIGHT_CHECKS[0]), echo=lines.append)
    assert rows[0]["status"] == "FAILED" and rows[0]["detail"] == "RuntimeError: planted" and rows[1]["status"] == "ok"


def test_preflight_runs_only_what_the_slot_needs_and_reports_a_known_limitation(monkeypatch):
    """--only: the checks whose experiments are still to run (and those every slot needs); a check that returns
    "known: ..." is a known PyTorch limitation (cuDNN's LSTM in FP16 under BF16 autocast), not a failure."""
    names = {c.name for c in pre.needed_checks(["ssd_histogram"])}
    assert "gradient-histogram kernel on the device" in names and "PyG GATConv under autocast" not in names
    assert {c.name for c in pre.needed_checks(["amp_recipe"])} >= {
        "CUDA graph of a whole training step",
        "torch.profiler kernels",
    }
    assert {c.name for c in pre.needed_checks(["roofline"])} >= {
        "FP8 GEMMs, fast accumulation off and on",
        "GPU clocks and power",
    }
    assert "allocator bytes per parameter" in {c.name for c in pre.needed_checks(["memory_per_parameter"])}
    assert "bfloat16 autocast, LSTM" in {c.name for c in pre.needed_checks(["biglstm"])}
    assert len(pre.needed_checks(None)) == len(pre.PREFLIGHT_CHECKS)
    every = set(experiments.NAMES) | set(budget.BENCHMARKS)
    for c in pre.PREFLIGHT_CHECKS:
        assert set(c.needed_by) <= every, f"{c.name}: needed_by names {set(c.needed_by) - every}"
    rows = pre.run_checks(
        "cpu", checks=(pre.Check("known one", lambda d: "known: a limitation", "-"),), echo=lambda line: None
    )
    assert rows[0]["status"] == "known" and rows[0]["detail"] == "a limitation"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # the summary line, without a GPU
    monkeypatch.setattr(pre, "describe", lambda d=None: "a GPU")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(
        pre,
        "PREFLIGHT_CHECKS",
        (
            pre.Check("known one", lambda d: "known: a limitation", "-", ("biglstm",)),
            pre.Check("other", lambda d: "fine", "-", ("gat_amp",)),
        ),
    )
    monkeypatch.setattr(
        pre,
        "run_checks",
        lambda device, checks, echo: [{"name": c.name, "status": "known", "detail": "", "seconds": 0} for c in checks],
    )
    lines = []
    assert pre.preflight(echo=lines.append, only=["biglstm"]) == 0
    assert any(line.startswith("not needed by biglstm: other") for line in lines)
    assert "known PyTorch limitations: known one" in lines[-1] and "0 failed" in lines[-1]


# ------------------------------------------------------------------------------- distributed: one GPU, or more
def test_distributed_places_two_gloo_ranks_on_the_cpu_of_a_one_gpu_machine(monkeypatch):
    from mpt_lab.experiments import distributed as D

    full = D.config_for("full")
    for gpus, world, want in (
        (0, 2, ("gloo", "cpu")),
        (1, 2, ("gloo", "cpu")),
        (2, 2, ("nccl", "cuda")),
        (8, 8, ("nccl", "cuda")),
    ):
        monkeypatch.setattr(torch.cuda, "is_available", lambda g=gpus: g > 0)
        monkeypatch.setattr(torch.cuda, "device_count", lambda g=gpus: g)
        backend, kind, why = D.placement(full, world)
        assert (backend, kind) == want and why
        assert D._nproc(full) == (gpus if gpus >= 2 else 2)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert "one GPU" in D.placement(full, 2)[2]
    with pytest.raises(ValueError, match="a GPU per rank"):
        D.placement(dataclasses.replace(full, backend="nccl"), 2)


# ---------------------------------------------------------------------------------------- pack and unpack
@pytest.fixture(scope="module")
def slot_dir(tmp_path_factory):
    """A slot's folder as the slot script leaves it: two real full results (run here on the CPU), a log, a
    summary."""
    work = tmp_path_factory.mktemp("slot")
    (work / "results").mkdir()
    for name in ("message_passing", "loss_scaling"):
        e = experiments.get(name)
        cfg = (
            e.config_for("full")
            if name == "message_passing"
            else dataclasses.replace(e.config_for("full"), steps=3, hidden=16, threads=1)
        )
        e.run(cfg, progress=False).save(work / "results" / f"{name}_full.json")
    (work / "slot.log").write_text("== device and versions\n+ message_passing: done in 1 s\n")
    (work / "summary.json").write_text(json.dumps({"experiments": []}))
    return work


def test_pack_then_unpack_puts_the_results_in_place_byte_for_byte(slot_dir, tmp_path):
    archive = slot.pack(slot_dir, tmp_path / "out" / "a.tar.gz", extra={"slot": {"budget": 480}})
    with tarfile.open(archive) as tar:
        names = set(tar.getnames())
        manifest = json.load(tar.extractfile(slot.MANIFEST))
    assert names == {
        "slot.log",
        "summary.json",
        "results/message_passing_full.json",
        "results/loss_scaling_full.json",
        slot.MANIFEST,
    }
    assert manifest["slot"] == {"budget": 480} and manifest["provenance"]["versions"]["torch"]
    assert {r["experiment"] for r in manifest["results"]} == {"message_passing", "loss_scaling"}
    into = tmp_path / "book_results"
    written = slot.unpack(archive, into, experiments=experiments)
    assert sorted(p.name for p in written) == ["loss_scaling_full.json", "message_passing_full.json"]
    for p in written:
        assert p.read_bytes() == (slot_dir / "results" / p.name).read_bytes()  # provenance kept as written
    # the command line does the same, into book/results/ by default (here: --into)
    assert experiments_main(["--unpack", str(archive), "--into", str(tmp_path / "again")]) == 0
    assert (tmp_path / "again" / "message_passing_full.json").exists()


def _archive_with(tmp_path, slot_dir, name: str, data: bytes, *, manifest_ok=True) -> Path:
    """A copy of the slot's archive with one more member ``name`` holding ``data``."""
    work = tmp_path / "w"
    if not work.exists():
        import shutil

        shutil.copytree(slot_dir, work)
    target = work / name
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(data)
    archive = slot.pack(work, tmp_path / "bad.tar.gz")
    if not manifest_ok:  # change the file after the manifest was written
        rebuilt = tmp_path / "tampered.tar.gz"
        with tarfile.open(archive) as src, tarfile.open(rebuilt, "w:gz") as dst:
            for m in src.getmembers():
                blob = src.extractfile(m).read()
                if m.name == name:
                    blob = blob.replace(b'"experiment"', b'"experiment" ', 1)
                m.size = len(blob)
                dst.addfile(m, io.BytesIO(blob))
        return rebuilt
    return archive


@pytest.mark.parametrize(
    "case", ["smoke", "wrong_name", "unknown_experiment", "quick_profile", "no_provenance", "mismatch", "tampered"]
)
def test_unpack_refuses_what_is_not_a_full_result(case, slot_dir, tmp_path):
    good = json.loads((slot_dir / "results" / "message_passing_full.json").read_text())
    name, data, ok = "results/message_passing_full.json", None, True
    if case == "smoke":
        d = dict(
            good,
            config={**good["config"], "profile": "smoke"},
            provenance={**good["provenance"], "profile": "smoke", "smoke": {"of": "full"}},
        )
        data = json.dumps(d).encode()
    elif case == "wrong_name":
        name, data = "results/message_passing.json", json.dumps(good).encode()
    elif case == "unknown_experiment":
        name, data = "results/nonsense_full.json", json.dumps(good).encode()
    elif case == "quick_profile":
        data = json.dumps(
            dict(
                good,
                config={**good["config"], "profile": "quick"},
                provenance={**good["provenance"], "profile": "quick"},
            )
        ).encode()
    elif case == "no_provenance":
        data = json.dumps(dict(good, provenance={"profile": "full"})).encode()
    elif case == "mismatch":
        name, data = "results/loss_scaling_full.json", json.dumps(good).encode()
    elif case == "tampered":
        data, ok = json.dumps(good).encode(), False
    archive = _archive_with(tmp_path, slot_dir, name, data, manifest_ok=ok)
    into = tmp_path / "into"
    with pytest.raises(ValueError):
        slot.unpack(archive, into, experiments=experiments)
    assert not into.exists() or not list(into.iterdir())  # nothing written
    assert experiments_main(["--unpack", str(archive), "--into", str(into)]) == 2


def _one_member_tar(path: Path, name: str, data: bytes) -> Path:
    with tarfile.open(path, "w:gz") as tar:
        info = tarfile.TarInfo(name)
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    return path


def test_unpack_refuses_unsafe_members_and_foreign_archives(tmp_path):
    with pytest.raises(ValueError, match="unsafe"):
        slot.check_archive(_one_member_tar(tmp_path / "evil.tar.gz", "../escape.json", b"{}"), experiments=experiments)
    with pytest.raises(ValueError, match="manifest"):
        slot.check_archive(_one_member_tar(tmp_path / "bare.tar.gz", "notes.txt", b"hi"), experiments=experiments)
    (tmp_path / "plain.txt").write_text("not a tar")
    with pytest.raises(ValueError, match="not a tar"):
        slot.check_archive(tmp_path / "plain.txt", experiments=experiments)
    with pytest.raises(FileNotFoundError):
        slot.check_archive(tmp_path / "missing.tar.gz", experiments=experiments)


# ------------------------------------------------------------------------------------------ the slot script
def test_slot_script_on_a_cpu_packs_its_log_and_says_there_is_no_cuda(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("on a GPU machine the script runs the whole slot")
    script = ROOT / "benchmarks" / "gpu_slot.sh"
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    proc = subprocess.run(
        ["bash", str(script), str(tmp_path / "out")],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "TMPDIR": str(tmp_path)},
    )
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert "no CUDA device" in proc.stdout
    archive = tmp_path / "out" / "mpt_lab_gpu_slot.tar.gz"
    with tarfile.open(archive) as tar:
        names = tar.getnames()
        log = tar.extractfile("slot.log").read().decode()
    assert {slot.MANIFEST, "slot.log", "slot_info.json"} <= set(names) and "device and versions" in log
    assert "torch" in log and "commit " in log
    assert len(list((tmp_path / "out").iterdir())) <= 8  # the device tool brings back 8 files
    assert slot.unpack(archive, tmp_path / "none", experiments=experiments) == []  # no results: nothing to unpack


def test_slot_script_runs_its_whole_path_on_a_cpu_and_its_archive_unpacks(tmp_path):
    """The GPU path of the script, on this CPU (MPT_LAB_SLOT_ALLOW_CPU) with a budget of 20 s: versions, the
    preflight, --all --profile full --budget (message_passing done, ssd_histogram skipped), packing; then
    --unpack."""
    script = ROOT / "benchmarks" / "gpu_slot.sh"
    env = {
        **os.environ,
        "TMPDIR": str(tmp_path),
        "MPT_LAB_SLOT_ALLOW_CPU": "1",
        "MPT_LAB_COMMIT": "abc123",
        "MPT_LAB_SLOT_ONLY": "message_passing,ssd_histogram",
        "MPT_LAB_SLOT_BUDGET": "20",
    }
    proc = subprocess.run(
        ["bash", str(script), str(tmp_path / "out")], capture_output=True, text=True, timeout=600, env=env
    )
    out = proc.stdout
    assert proc.returncode == 1, out[-3000:] + proc.stderr[-3000:]  # one experiment skipped
    assert "commit abc123" in out and "no CUDA device: nothing to check" in out  # the preflight on a CPU
    assert re.search(r"--budget 20(\.0)? --deadline \d+ \(hard limit \d+ s", out)  # the deadline before the limit
    assert "+ message_passing: done in" in out and re.search(r"- ssd_histogram: skipped: expected \d+ s > ", out)
    archive = tmp_path / "out" / "mpt_lab_gpu_slot.tar.gz"
    with tarfile.open(archive) as tar:
        names = set(tar.getnames())
        info = json.load(tar.extractfile("slot_info.json"))
        summary = json.load(tar.extractfile("summary.json"))
    assert {
        "results/message_passing_full.json",
        "summary.json",
        "preflight.log",
        "slot.log",
        "slot_info.json",
        slot.MANIFEST,
    } <= names and "results/ssd_histogram_full.json" not in names
    assert info["commit"] == "abc123" and info["budget_seconds"] == 20
    assert [r["status"] for r in summary["experiments"]] == ["skipped", "done"]  # priority 7 before 11
    written = slot.unpack(archive, tmp_path / "book_results", experiments=experiments)
    assert [p.name for p in written] == ["message_passing_full.json"]
    r = experiments.get("message_passing").Result.load(written[0])
    assert r.profile == "full" and r.provenance["command"].startswith(
        "python -m mpt_lab.experiments.message_passing --profile full"
    )
