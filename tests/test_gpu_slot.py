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

from mpt_lab import device as dev
from mpt_lab import experiments
from mpt_lab.experiments import budget, runner, slot
from mpt_lab.experiments.__main__ import main as experiments_main

ROOT = Path(__file__).resolve().parents[1]
FULL = [n for n in experiments.NAMES if "full" in experiments.get(n).profiles]


# ------------------------------------------------------------------------------------------- the priority table
def test_every_full_profile_has_a_row_a_smoke_run_and_the_sum_fits_the_slot():
    missing = [n for n in FULL if n not in budget.ESTIMATES]
    assert not missing, (f"{missing} have a full profile but no row in mpt_lab.experiments.budget.ESTIMATES: add an "
                         "Estimate (priority, FLOPs, bytes, operators, host seconds, basis) for each")
    no_smoke = [n for n in FULL if experiments.get(n).smoke is None]
    assert not no_smoke, f"{no_smoke} have a full profile but no smoke overrides (Experiment(..., smoke=SMOKE))"
    stale = [n for n in budget.ESTIMATES if n not in FULL]
    assert not stale, f"budget.ESTIMATES has rows for {stale}, which have no full profile"
    priorities = [budget.ESTIMATES[n].priority for n in FULL]
    assert len(set(priorities)) == len(priorities), "two experiments share a priority"
    total = budget.total_seconds(FULL)
    assert total <= budget.SLOT_SECONDS, (f"the full profile is expected to take {total:.0f} s (startup included) > "
                                          f"{budget.SLOT_SECONDS:.0f} s: resize a full profile or correct its row")
    for n in FULL:
        e = budget.ESTIMATES[n]
        assert e.seconds > 0 and len(e.basis) > 40 and e.needs, f"{n}: an estimate needs its numbers and basis"
    with pytest.raises(KeyError, match="ESTIMATES"):
        budget.expected_seconds("no_such_experiment")


def test_estimate_arithmetic_and_bad_rows():
    e = budget.Estimate(1, "x", tflop={"fp16": budget.H100["fp16"] * budget.UTILISATION}, kops=50, cpu_seconds=2,
                        gbytes=budget.H100["hbm_tb_s"] * 1e3 * budget.MEMORY_UTILISATION, basis="test")
    assert e.terms == pytest.approx({"compute": 1.0, "memory": 1.0, "overhead": 50e3 * budget.SECONDS_PER_OP,
                                     "host": 2.0})
    assert e.seconds == pytest.approx(budget.SAFETY * sum(e.terms.values()))
    timed = dataclasses.replace(e, measured=10.0)        # a slot's own time replaces the model, with its margin
    assert timed.seconds == pytest.approx(budget.MEASURED_SAFETY * 10.0) and timed.terms == e.terms
    for bad in (dict(priority=0), dict(tflop={"int8": 1.0}), dict(kops=-1), dict(tflop={"fp32": -2}),
                dict(measured=-1.0)):
        with pytest.raises(ValueError):
            budget.Estimate(**{"priority": 1, "needs": "x", **bad})
    assert budget.plan(["master_weights_stall", "nonsense", "amp_recipe"]) == \
        ["amp_recipe", "master_weights_stall", "nonsense"]


def test_dry_run_prints_the_table_the_sum_and_the_order(capsys, tmp_path):
    assert experiments_main(["--all", "--profile", "full", "--dry-run"]) == 0
    out = capsys.readouterr().out
    order = budget.plan(FULL)
    assert [line.split(":")[0].strip() for line in out.splitlines() if "python -m mpt_lab.experiments." in line] \
        == order
    total = budget.total_seconds(FULL)
    sum_line = [line for line in out.splitlines() if line.split()[:1] == ["sum"]]
    assert len(sum_line) == 1 and sum_line[0].split()[1] == f"{total:.0f}" and total <= budget.SLOT_SECONDS
    for n in FULL:                                         # each experiment's expected seconds, in the table
        row = next(line for line in out.splitlines() if line.split()[1:2] == [n])
        assert row.split()[2] == f"{budget.expected_seconds(n):.0f}"
    assert not list(tmp_path.iterdir())


# --------------------------------------------------------------------------------------------- --budget, lines
def test_budget_skips_what_does_not_fit_and_reports_each_experiment(tmp_path, capsys, monkeypatch):
    rows = dict(budget.ESTIMATES)
    rows["message_passing"] = dataclasses.replace(rows["message_passing"], priority=1, tflop={}, gbytes=0, kops=0,
                                                  cpu_seconds=0.01, measured=0.0)
    rows["loss_scaling"] = dataclasses.replace(rows["loss_scaling"], priority=2, cpu_seconds=10_000.0, measured=0.0)
    rows["master_weights_stall"] = dataclasses.replace(rows["master_weights_stall"], priority=3, tflop={},
                                                       gbytes=0, kops=0, cpu_seconds=0.01, measured=0.0)
    monkeypatch.setattr(budget, "ESTIMATES", rows)
    stall = experiments.get("master_weights_stall")
    monkeypatch.setattr(stall, "run", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("planted failure")))
    argv = ["--all", "--profile", "full", "--budget", "600", "--out", str(tmp_path / "r"),
            "--only", "master_weights_stall,loss_scaling,message_passing", "--summary", str(tmp_path / "s.json")]
    assert experiments_main(argv) == 1                                  # one failed
    lines = capsys.readouterr().out.splitlines()
    mine = [ln for ln in lines if ln[:2] in ("+ ", "- ", "! ")]
    assert mine[0].startswith("+ message_passing: done in")            # priority order, written as it finished
    assert re.fullmatch(r"- loss_scaling: skipped: expected 150\d\d s > \d+ s left of the budget", mine[1])
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
        assert "--set" not in cmd.replace("--set threads=1", "")     # the smoke run is the command, nothing else

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


def test_every_full_configuration_runs_end_to_end_as_a_smoke_run(tmp_path, capsys):
    """``--all --profile full --smoke`` on this CPU: every experiment with a full profile, its full model shapes
    and code paths cut to a couple of steps, runs and writes one smoke result (≈ 3 minutes of CPU)."""
    out = tmp_path / "smoke"
    rc = experiments_main(["--all", "--profile", "full", "--smoke", "--out", str(out),
                           "--summary", str(tmp_path / "summary.json")])
    text = capsys.readouterr().out
    assert rc == 0, text
    for name in FULL:
        path = out / f"{name}_smoke.json"
        assert path.exists(), f"{name}: no smoke result\n{text}"
        r = experiments.get(name).Result.load(path)
        assert runner.is_smoke(r) and r.config["profile"] == "smoke" and r.describe()
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert {r["experiment"] for r in summary["experiments"] if r["status"] == "done"} == set(FULL)
    assert summary["smoke"] is True


# ------------------------------------------------------------------------------------------------ the preflight
def test_preflight_on_a_cpu_says_there_is_no_cuda(capsys):
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: tests/test_cuda.py runs the preflight")
    assert dev.main(["--preflight"]) == 0
    out = capsys.readouterr().out
    assert "no CUDA device" in out and "torch " in out
    proc = subprocess.run([sys.executable, "-m", "mpt_lab.device", "--preflight"], capture_output=True, text=True,
                          cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=300)
    assert proc.returncode == 0 and "no CUDA device" in proc.stdout


def test_preflight_checks_that_a_cpu_has_pass_and_a_failure_is_reported():
    lines = []
    rows = dev.run_checks("cpu", echo=lines.append)
    assert [r["name"] for r in rows] == [c.name for c in dev.PREFLIGHT_CHECKS] and len(lines) == len(rows)
    bad = [r for r in rows if r["status"] == "FAILED"]
    assert not bad, bad
    status = {r["name"]: r["status"] for r in rows}
    assert status["FP8 tensor cores (torch._scaled_mm)"] == "skipped"
    assert status["NCCL process group, one rank"] == "skipped"
    assert status["GradScaler skips an inf step"] == status["bfloat16 autocast, conv net"] == "ok"

    def broken(device):
        raise RuntimeError("planted\nsecond line")

    rows = dev.run_checks("cpu", checks=(dev.Check("broken", broken, "-"), dev.PREFLIGHT_CHECKS[0]),
                          echo=lines.append)
    assert rows[0]["status"] == "FAILED" and rows[0]["detail"] == "RuntimeError: planted" and rows[1]["status"] == "ok"


# ------------------------------------------------------------------------------- distributed: one GPU, or more
def test_distributed_places_two_gloo_ranks_on_the_cpu_of_a_one_gpu_machine(monkeypatch):
    from mpt_lab.experiments import distributed as D

    full = D.config_for("full")
    for gpus, world, want in ((0, 2, ("gloo", "cpu")), (1, 2, ("gloo", "cpu")), (2, 2, ("nccl", "cuda")),
                              (8, 8, ("nccl", "cuda"))):
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
        cfg = e.config_for("full") if name == "message_passing" else \
            dataclasses.replace(e.config_for("full"), steps=3, hidden=16, threads=1)
        e.run(cfg, progress=False).save(work / "results" / f"{name}_full.json")
    (work / "slot.log").write_text("== device and versions\n+ message_passing: done in 1 s\n")
    (work / "summary.json").write_text(json.dumps({"experiments": []}))
    return work


def test_pack_then_unpack_puts_the_results_in_place_byte_for_byte(slot_dir, tmp_path):
    archive = slot.pack(slot_dir, tmp_path / "out" / "a.tar.gz", extra={"slot": {"budget": 480}})
    with tarfile.open(archive) as tar:
        names = set(tar.getnames())
        manifest = json.load(tar.extractfile(slot.MANIFEST))
    assert names == {"slot.log", "summary.json", "results/message_passing_full.json", "results/loss_scaling_full.json",
                     slot.MANIFEST}
    assert manifest["slot"] == {"budget": 480} and manifest["provenance"]["versions"]["torch"]
    assert {r["experiment"] for r in manifest["results"]} == {"message_passing", "loss_scaling"}
    into = tmp_path / "book_results"
    written = slot.unpack(archive, into)
    assert sorted(p.name for p in written) == ["loss_scaling_full.json", "message_passing_full.json"]
    for p in written:
        assert p.read_bytes() == (slot_dir / "results" / p.name).read_bytes()     # provenance kept as written
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
    if not manifest_ok:                                 # change the file after the manifest was written
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


@pytest.mark.parametrize("case", ["smoke", "wrong_name", "unknown_experiment", "quick_profile", "no_provenance",
                                  "mismatch", "tampered"])
def test_unpack_refuses_what_is_not_a_full_result(case, slot_dir, tmp_path):
    good = json.loads((slot_dir / "results" / "message_passing_full.json").read_text())
    name, data, ok = "results/message_passing_full.json", None, True
    if case == "smoke":
        d = dict(good, config={**good["config"], "profile": "smoke"},
                 provenance={**good["provenance"], "profile": "smoke", "smoke": {"of": "full"}})
        data = json.dumps(d).encode()
    elif case == "wrong_name":
        name, data = "results/message_passing.json", json.dumps(good).encode()
    elif case == "unknown_experiment":
        name, data = "results/nonsense_full.json", json.dumps(good).encode()
    elif case == "quick_profile":
        data = json.dumps(dict(good, config={**good["config"], "profile": "quick"},
                               provenance={**good["provenance"], "profile": "quick"})).encode()
    elif case == "no_provenance":
        data = json.dumps(dict(good, provenance={"profile": "full"})).encode()
    elif case == "mismatch":
        name, data = "results/loss_scaling_full.json", json.dumps(good).encode()
    elif case == "tampered":
        data, ok = json.dumps(good).encode(), False
    archive = _archive_with(tmp_path, slot_dir, name, data, manifest_ok=ok)
    into = tmp_path / "into"
    with pytest.raises(ValueError):
        slot.unpack(archive, into)
    assert not into.exists() or not list(into.iterdir())            # nothing written
    assert experiments_main(["--unpack", str(archive), "--into", str(into)]) == 2


def _one_member_tar(path: Path, name: str, data: bytes) -> Path:
    with tarfile.open(path, "w:gz") as tar:
        info = tarfile.TarInfo(name)
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    return path


def test_unpack_refuses_unsafe_members_and_foreign_archives(tmp_path):
    with pytest.raises(ValueError, match="unsafe"):
        slot.check_archive(_one_member_tar(tmp_path / "evil.tar.gz", "../escape.json", b"{}"))
    with pytest.raises(ValueError, match="manifest"):
        slot.check_archive(_one_member_tar(tmp_path / "bare.tar.gz", "notes.txt", b"hi"))
    (tmp_path / "plain.txt").write_text("not a tar")
    with pytest.raises(ValueError, match="not a tar"):
        slot.check_archive(tmp_path / "plain.txt")
    with pytest.raises(FileNotFoundError):
        slot.check_archive(tmp_path / "missing.tar.gz")


# ------------------------------------------------------------------------------------------ the slot script
def test_slot_script_on_a_cpu_packs_its_log_and_says_there_is_no_cuda(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("on a GPU machine the script runs the whole slot")
    script = ROOT / "benchmarks" / "gpu_slot.sh"
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    proc = subprocess.run(["bash", str(script), str(tmp_path / "out")], capture_output=True, text=True,
                          timeout=300, env={**os.environ, "TMPDIR": str(tmp_path)})
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert "no CUDA device" in proc.stdout
    archive = tmp_path / "out" / "mpt_lab_gpu_slot.tar.gz"
    with tarfile.open(archive) as tar:
        names = tar.getnames()
        log = tar.extractfile("slot.log").read().decode()
    assert {slot.MANIFEST, "slot.log", "slot_info.json"} <= set(names) and "device and versions" in log
    assert "torch" in log and "commit " in log
    assert len(list((tmp_path / "out").iterdir())) <= 8                # the device tool brings back 8 files
    assert slot.unpack(archive, tmp_path / "none") == []              # no results: nothing to unpack


def test_slot_script_runs_its_whole_path_on_a_cpu_and_its_archive_unpacks(tmp_path):
    """The GPU path of the script, on this CPU (MPT_LAB_SLOT_ALLOW_CPU) with a budget of 20 s: versions, the
    preflight, --all --profile full --budget (message_passing done, ssd_histogram skipped), packing; then
    --unpack."""
    script = ROOT / "benchmarks" / "gpu_slot.sh"
    env = {**os.environ, "TMPDIR": str(tmp_path), "MPT_LAB_SLOT_ALLOW_CPU": "1", "MPT_LAB_COMMIT": "abc123",
           "MPT_LAB_SLOT_ONLY": "message_passing,ssd_histogram", "MPT_LAB_SLOT_BUDGET": "20"}
    proc = subprocess.run(["bash", str(script), str(tmp_path / "out")], capture_output=True, text=True,
                          timeout=600, env=env)
    out = proc.stdout
    assert proc.returncode == 1, out[-3000:] + proc.stderr[-3000:]                    # one experiment skipped
    assert "commit abc123" in out and "no CUDA device: nothing to check" in out          # the preflight on a CPU
    assert re.search(r"--budget 20(\.0)? \(hard limit \d+ s", out)
    assert "+ message_passing: done in" in out and re.search(r"- ssd_histogram: skipped: expected \d+ s > ", out)
    archive = tmp_path / "out" / "mpt_lab_gpu_slot.tar.gz"
    with tarfile.open(archive) as tar:
        names = set(tar.getnames())
        info = json.load(tar.extractfile("slot_info.json"))
        summary = json.load(tar.extractfile("summary.json"))
    assert {"results/message_passing_full.json", "summary.json", "preflight.log", "slot.log", "slot_info.json",
            slot.MANIFEST} <= names and "results/ssd_histogram_full.json" not in names
    assert info["commit"] == "abc123" and info["budget_seconds"] == 20
    assert [r["status"] for r in summary["experiments"]] == ["skipped", "done"]        # priority 7 before 11
    written = slot.unpack(archive, tmp_path / "book_results")
    assert [p.name for p in written] == ["message_passing_full.json"]
    r = experiments.get("message_passing").Result.load(written[0])
    assert r.profile == "full" and r.provenance["command"].startswith(
        "python -m mpt_lab.experiments.message_passing --profile full")
