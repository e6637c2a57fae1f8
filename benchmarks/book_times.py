"""Benchmark: how long the book takes to build from a clean clone, whole and per notebook.

The budgets (README, ARCHITECTURE.md): in the ``cpu`` profile (the default without a GPU) every notebook executes in
≤ 4 minutes on 2 CPU cores and the whole book builds from a clean clone in ≤ 12 minutes; in the ``quick``
profile (CI) every notebook in ≤ 90 s.  Budgets are measured here and reported, never asserted in a test (a busy
machine must not fail a test).

The script clones this repository's HEAD into a temporary folder (so nothing cached or uncommitted counts), runs
``jupyter-book build`` there with this interpreter's environment and ``MPT_LAB_PROFILE`` set, and reads each
notebook's execution time from the build's log ("Executed notebook in N seconds").

    python benchmarks/book_times.py --profile cpu --out book/results/book_build_cpu.json
    python benchmarks/book_times.py --profile quick
    MPT_LAB_BOOK_HTML=/tmp/book python benchmarks/book_times.py --profile cpu   # and keep the pages in /tmp/book

Run by the experiment runner (:mod:`mpt_lab.harness.benchmark`; its profile is the book's): the JSON records
the configuration, the provenance (command, device, versions, date), the machine's load average before and
after, the build's wall time and each notebook's seconds, and whether every budget held.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from mpt_lab.harness.benchmark import Benchmark
from mpt_lab.harness.runner import ExperimentConfig, ExperimentResult, Run, run_main

ROOT = Path(__file__).resolve().parents[1]
#: Seconds per notebook and for the whole build, per profile (ARCHITECTURE.md, "Sizes and devices").
BUDGETS = {"quick": {"notebook": 90, "book": None}, "cpu": {"notebook": 240, "book": 720}}


@dataclass
class Config(ExperimentConfig):
    """The profile (``quick`` or ``cpu``) is the one the book is built in."""


PROFILES = {"quick": {}, "cpu": {}}


@dataclass
class BookTimesResult(ExperimentResult):
    """``commit`` built; ``returncode`` of ``jupyter-book build``; ``build_seconds`` (wall time); ``notebook_seconds``:
    notebook → seconds as the build's log reports them; ``budget_seconds`` and ``within_budget`` (notebooks, book);
    ``load_average``: the machine's 1/5/15-minute load before and after; ``log_tail``: where a failed build's log first reports the failure (else its end)."""

    commit: str = ""
    returncode: int = 0
    build_seconds: float = 0.0
    notebook_seconds: dict = field(default_factory=dict)
    budget_seconds: dict = field(default_factory=dict)
    within_budget: dict = field(default_factory=dict)
    load_average: dict = field(default_factory=dict)
    log_tail: str = ""

    def describe(self) -> str:
        lines = [f"{name:36s} {s:7.1f} s" for name, s in sorted(self.notebook_seconds.items())]
        lines.append(
            f"whole build (clean clone, {self.profile} profile): {self.build_seconds:.0f} s; exit status "
            f"{self.returncode}; within budget: {self.within_budget}"
        )
        return "\n".join(lines)


def measure(config: Config, run: Run) -> dict:
    """Build the book from a clean clone of HEAD in the config's profile (seconds)."""
    profile = config.profile
    if profile not in BUDGETS:
        raise ValueError(f"profile must be one of {tuple(BUDGETS)}, got {profile!r}")
    jb = Path(sys.executable).parent / "jupyter-book"
    work = Path(tempfile.mkdtemp(prefix="mpt-book-times-"))
    try:
        clone = work / "repo"
        subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
        commit = subprocess.run(
            ["git", "-C", str(clone), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
        env = dict(os.environ, MPT_LAB_PROFILE=profile, PYTHONHASHSEED="0")
        env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
        env["PYTHONPATH"] = str(clone)  # the clone's mpt_lab, whatever this environment has installed
        load_before = os.getloadavg()
        t0 = time.perf_counter()
        res = subprocess.run(
            [str(jb), "build", str(clone), "-W", "-n", "--keep-going"], capture_output=True, text=True, env=env
        )
        seconds = time.perf_counter() - t0
        load_after = os.getloadavg()
        keep = os.environ.get("MPT_LAB_BOOK_HTML")  # a folder to keep the built pages in (to read or screenshot)
        if keep and (clone / "_build" / "html").is_dir():
            shutil.copytree(clone / "_build" / "html", keep, dirs_exist_ok=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    log = res.stdout + res.stderr
    notebooks = {
        Path(m.group(1)).stem: float(m.group(2))
        for m in re.finditer(r"(\S+\.ipynb): Executed notebook in ([0-9.]+) seconds", log)
    }
    budget = BUDGETS[profile]
    within = {
        "notebooks": all(v <= budget["notebook"] for v in notebooks.values()),
        "book": None if budget["book"] is None else seconds <= budget["book"],
    }
    return {
        "commit": commit,
        "returncode": res.returncode,
        "build_seconds": seconds,
        "notebook_seconds": notebooks,
        "budget_seconds": budget,
        "within_budget": within,
        "load_average": {"before": [round(v, 2) for v in load_before], "after": [round(v, 2) for v in load_after]},
        "log_tail": _failure(log) if res.returncode else "",
    }


def _failure(log: str) -> str:
    """What a failed build's log says first about the failure (the cell that raised, with its error), else its end."""
    first = min((i for i in (log.find("CellExecutionError"), log.find("Traceback")) if i >= 0), default=-1)
    return log[max(0, first - 500) : first + 3000] if first >= 0 else log[-2000:]


BENCHMARK = Benchmark("book_times", Config, PROFILES, measure, BookTimesResult, __doc__)
main = BENCHMARK.main

if __name__ == "__main__":
    run_main(BENCHMARK)
