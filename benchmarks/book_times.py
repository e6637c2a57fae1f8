"""Benchmark: how long the book takes to build from a clean clone, whole and per notebook.

The budgets (README, DESIGN.md): in the ``cpu`` profile (the default without a GPU) every notebook executes in
≤ 4 minutes on 2 CPU cores and the whole book builds from a clean clone in ≤ 12 minutes; in the ``quick``
profile (CI) every notebook in ≤ 90 s.  Budgets are measured here and reported, never asserted in a test (a busy
machine must not fail a test).

The script clones this repository's HEAD into a temporary folder (so nothing cached or uncommitted counts), runs
``jupyter-book build`` there with this interpreter's environment and ``MPT_LAB_PROFILE`` set, and reads each
notebook's execution time from the build's log ("Executed notebook in N seconds").

    python benchmarks/book_times.py --profile cpu --out book/results/book_build_cpu.json
    python benchmarks/book_times.py --profile quick

The JSON records the command, device, versions, date, the machine's load average before and after, the build's
wall time and each notebook's seconds, and whether every budget held.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from mpt_lab.device import provenance
from mpt_lab.experiments import save_json

ROOT = Path(__file__).resolve().parents[1]
#: Seconds per notebook and for the whole build, per profile (DESIGN.md, "Sizes and devices").
BUDGETS = {"quick": {"notebook": 90, "book": None}, "cpu": {"notebook": 240, "book": 720}}


def run(profile: str = "cpu") -> dict:
    """Build the book from a clean clone of HEAD in ``profile``; returns a dict (seconds)."""
    if profile not in BUDGETS:
        raise ValueError(f"profile must be one of {tuple(BUDGETS)}, got {profile!r}")
    jb = Path(sys.executable).parent / "jupyter-book"
    work = Path(tempfile.mkdtemp(prefix="mpt-book-times-"))
    try:
        clone = work / "repo"
        subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
        commit = subprocess.run(["git", "-C", str(clone), "rev-parse", "HEAD"], capture_output=True, text=True,
                                check=True).stdout.strip()
        env = dict(os.environ, MPT_LAB_PROFILE=profile, PYTHONHASHSEED="0")
        env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
        load_before = os.getloadavg()
        t0 = time.perf_counter()
        res = subprocess.run([str(jb), "build", str(clone), "-W", "-n", "--keep-going"], capture_output=True,
                             text=True, env=env)
        seconds = time.perf_counter() - t0
        load_after = os.getloadavg()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    log = res.stdout + res.stderr
    notebooks = {Path(m.group(1)).stem: float(m.group(2))
                 for m in re.finditer(r"(\S+\.ipynb): Executed notebook in ([0-9.]+) seconds", log)}
    budget = BUDGETS[profile]
    within = {"notebooks": all(v <= budget["notebook"] for v in notebooks.values()),
              "book": None if budget["book"] is None else seconds <= budget["book"]}
    config = {"profile": profile, "commit": commit}
    prov = provenance(config=config, device="cpu")
    prov["load_average_before"], prov["load_average_after"] = [round(v, 2) for v in load_before], \
        [round(v, 2) for v in load_after]
    return {"provenance": prov, "returncode": res.returncode, "build_seconds": seconds,
            "notebook_seconds": notebooks, "budget_seconds": budget, "within_budget": within,
            "log_tail": log[-2000:] if res.returncode else ""}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--profile", default="cpu", choices=tuple(BUDGETS))
    p.add_argument("--out", type=Path, help="write the result as JSON here")
    args = p.parse_args(argv)
    res = run(args.profile)
    res["provenance"]["command"] = "python benchmarks/book_times.py " + " ".join(argv or sys.argv[1:])
    for name, s in sorted(res["notebook_seconds"].items()):
        print(f"{name:36s} {s:7.1f} s")
    print(f"whole build (clean clone, {args.profile} profile): {res['build_seconds']:.0f} s; exit status "
          f"{res['returncode']}; within budget: {res['within_budget']}")
    if args.out:
        save_json(res, args.out)
        print(f"wrote {args.out}")
    return 0 if res["returncode"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
