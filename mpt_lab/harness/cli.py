"""``python -m mpt_lab.experiments``: every experiment, one command (the body of that command; the package
:mod:`mpt_lab.experiments` hands its catalogue of experiments to :func:`main`).

    python -m mpt_lab.experiments --list
    python -m mpt_lab.experiments --all --profile full --budget 480 --out DIR       # a GPU slot
    python -m mpt_lab.experiments --all --profile full --dry-run                    # the priority table
    python -m mpt_lab.experiments --all --profile full --smoke --out /tmp/smoke     # every full config, cut short
    python -m mpt_lab.experiments --all --profile quick --out /tmp/r --only loss_scaling,message_passing
    python -m mpt_lab.experiments --unpack mpt_lab_gpu_slot.tar.gz                  # GPU results → book/results/

``--all`` runs every experiment that defines the profile in one process, writing ``OUT/NAME_PROFILE.json`` the
moment each finishes (``OUT/NAME_smoke.json`` with ``--smoke``), and prints one line per experiment: ``done``,
``skipped`` and why, ``FAILED`` with the error, or ``STOPPED`` at the deadline; results already saved in OUT are
skipped unless ``--force``.  With ``--profile full`` the order is the priority order of
:mod:`mpt_lab.harness.budget` (what the book lacks most first), its benchmark rows (``benchmarks/roofline.py``,
``benchmarks/memory_per_parameter.py``) run in that order too, each as a process of its own, and ``--budget
SECONDS`` skips an experiment whose expected seconds on one H100 exceed what is left of the budget, counted from
the start of the command.  ``--deadline SECONDS`` (from the start of the command) stops the experiment running
then *between two steps*, keeping the arms it finished in ``OUT/NAME_PROFILE.partial.json``
(:class:`~mpt_lab.harness.runner.DeadlineReached`), and runs nothing after it.  ``--summary F`` also writes every line's status,
expected and measured seconds as JSON.  ``--dry-run`` prints the plan (each experiment's expected seconds and
command, and their sum) and runs nothing.  ``--smoke`` runs each experiment's full configuration cut to a couple
of steps (:meth:`~mpt_lab.harness.runner.Experiment.smoke_config`); it refuses to write under
``book/results/``.  ``--unpack ARCHIVE`` checks and copies the results of a GPU slot's archive into
``book/results/`` (:mod:`mpt_lab.harness.slot`).
"""

from __future__ import annotations

import argparse
import gc
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import torch

from ..device import default_device, provenance
from ..histogram import log2_histogram
from . import budget, runner, slot
from .runner import RUN_PROFILES, SMOKE, Catalogue, DeadlineReached, partial_path, results_dir, save_json

ROOT = Path(__file__).resolve().parents[2]


def _line(symbol: str, name: str, text: str) -> None:
    print(f"{symbol} {name}: {text}", flush=True)


def _free_device_memory() -> None:
    """Between experiments: drop what the last one left (an out-of-memory error must not spill into the next)."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def _warm_up(device_note: list) -> None:
    """Make the gradient-histogram kernel ready for the device before the clock of the first experiment runs (on
    CUDA a bucketize that needs no compilation; on a CPU torch.compile, tens of seconds on a first call), and say
    how long it took."""
    t0 = time.perf_counter()
    log2_histogram(torch.ones(4, device=default_device()))
    device_note.append(f"histogram kernel ready in {time.perf_counter() - t0:.1f} s")


def main(argv: list[str] | None = None, *, experiments: Catalogue) -> int:
    """``python -m mpt_lab.experiments``: --list, --all (with --profile, --out, --budget, ...) or --unpack; the
    module docstring describes each.  ``argv``: the arguments (None: ``sys.argv[1:]``); ``experiments``: the
    catalogue of experiments (:class:`~mpt_lab.harness.runner.Catalogue`: the package :mod:`mpt_lab.experiments`).
    Returns the exit status: 0 when everything asked for ran or was skipped with a reason, 1 when an experiment
    failed (``--unpack``: the unpacker's status)."""
    NAMES, get = experiments.NAMES, experiments.get
    p = argparse.ArgumentParser(prog="python -m mpt_lab.experiments", description=__doc__.splitlines()[0])
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--list", action="store_true", help="list the experiments and their profiles")
    what.add_argument("--all", action="store_true", help="run every experiment that has --profile")
    what.add_argument(
        "--unpack",
        type=Path,
        metavar="ARCHIVE",
        help="check a GPU slot's archive and copy its NAME_full.json results into book/results/",
    )
    p.add_argument("--profile", choices=RUN_PROFILES, help="with --all: which profile to run")
    p.add_argument("--out", type=Path, help="with --all: folder for NAME_PROFILE.json (e.g. book/results/)")
    p.add_argument("--only", default="", help="with --all: comma-separated names to run (default: all)")
    p.add_argument("--force", action="store_true", help="with --all: rerun results that are already saved")
    p.add_argument("--dry-run", action="store_true", help="with --all: print the plan, run nothing")
    p.add_argument(
        "--smoke",
        action="store_true",
        help="with --all --profile full: each full configuration cut to a couple of steps",
    )
    p.add_argument(
        "--budget",
        type=float,
        metavar="SECONDS",
        help="with --all --profile full: skip experiments whose expected seconds (one H100) exceed what is left",
    )
    p.add_argument(
        "--deadline",
        type=float,
        metavar="SECONDS",
        help="with --all: stop between two steps this many seconds after the start, keeping the arms "
        "that finished (OUT/NAME_PROFILE.partial.json); nothing runs after it",
    )
    p.add_argument("--summary", type=Path, metavar="FILE", help="with --all: also write the run's lines as JSON")
    p.add_argument("--into", type=Path, default=None, help="with --unpack: the folder (default book/results/)")
    argv = list(sys.argv[1:] if argv is None else argv)
    args = p.parse_args(argv)
    args.argv = argv
    if args.list:
        width = max(map(len, [*NAMES, *budget.BENCHMARKS]))
        for name in NAMES:
            e = get(name)
            print(f"{name:<{width}}  profiles: {', '.join(e.profiles):<24} {e.title}")
        for name, script in budget.BENCHMARKS.items():
            print(f"{name:<{width}}  benchmark: {script}, run by --all --profile full (a GPU slot)")
        return 0
    if args.unpack:
        return slot.unpack_main(args.unpack, args.into or results_dir(), experiments=experiments)
    if not args.profile or (not args.out and not args.dry_run):
        p.error("--all needs --profile and --out (or --dry-run)")
    if args.smoke and args.profile != "full":
        p.error("--smoke cuts the full profile: use --profile full")
    if args.budget is not None and (args.profile != "full" or args.smoke):
        p.error(
            "--budget needs --profile full (the expected seconds are those of the full profile on one H100) "
            "and no --smoke"
        )
    if args.budget is not None and args.budget <= 0:
        p.error(f"--budget must be a positive number of seconds, got {args.budget}")
    if args.deadline is not None and args.deadline < 0:
        p.error(f"--deadline must be a number of seconds ≥ 0, got {args.deadline}")
    if args.smoke and args.out and results_dir().resolve() in [args.out.resolve(), *args.out.resolve().parents]:
        p.error(f"--smoke: smoke results must not be written under {results_dir()}")
    only = [n.strip() for n in args.only.split(",") if n.strip()]
    benchmarks = budget.BENCHMARKS if args.profile == "full" else {}
    unknown = [n for n in only if n not in NAMES and n not in benchmarks]
    if unknown:
        p.error(f"--only: unknown experiments {unknown}; they are {', '.join([*NAMES, *benchmarks])}")
    chosen = only or [*NAMES, *benchmarks]
    names = budget.plan(chosen) if args.profile == "full" else chosen
    if args.profile == "full":
        missing = [n for n in names if n not in benchmarks and "full" in get(n).profiles and n not in budget.ESTIMATES]
        if missing:
            p.error(f"{', '.join(missing)}: a full profile but no row in mpt_lab.harness.budget.ESTIMATES")
    tag = SMOKE if args.smoke else args.profile
    start = time.monotonic()
    deadline = None if args.deadline is None else runner.deadline_clock() + args.deadline
    rows, failed = [], []
    if args.dry_run:
        print(
            budget.table([n for n in names if n in benchmarks or "full" in get(n).profiles])
            if args.profile == "full"
            else f"--all --profile {args.profile}: {len(names)} experiments in the book's order"
        )
    elif args.profile == "full" and not args.smoke and torch.cuda.is_available():
        notes: list = []
        try:
            _warm_up(notes)
        except Exception as err:  # the experiments fall back to the eager kernel themselves
            notes.append(f"histogram kernel warm-up failed: {type(err).__name__}: {err}")
        print(f"= {'; '.join(notes)} ({time.monotonic() - start:.0f} s since the start)", flush=True)
    stopped = False
    for name in names:
        row = {"experiment": name, "profile": tag}
        rows.append(row)
        if name in benchmarks:
            bench_run = _benchmark_runner(name, benchmarks[name], args, tag)
            config = cmd = None
            out = args.out / f"{name}_{tag}.json" if args.out else None
            cmd = bench_run["command"](out)
        else:
            e = get(name)
            if args.profile not in e.profiles:
                row["status"] = "skipped"
                _line("-", name, f"skipped: no {args.profile} profile")
                continue
            config = e.smoke_config() if args.smoke else e.config_for(args.profile)
            out = args.out / f"{name}_{tag}.json" if args.out else None
            cmd = e.command(config, out)
        expected = budget.ESTIMATES[name].seconds if args.profile == "full" else None
        row.update(command=cmd, expected_seconds=expected)
        if args.dry_run:
            row["status"] = "planned"
            print(f"  {name}: {cmd}" + (f"   # expected {expected:.0f} s" if expected is not None else ""))
            continue
        if stopped:
            row.update(status="skipped", reason="the deadline passed")
            _line("-", name, "skipped: the deadline passed")
            continue
        if out.exists() and not args.force:
            row["status"] = "skipped"
            _line("-", name, f"skipped: {out} exists (--force reruns it)")
            continue
        if args.profile == "full" and not args.smoke and name not in only and not budget.ESTIMATES[name].gpu:
            row["status"] = "skipped"
            row["reason"] = (
                "computes on the CPU (its full profile is its cpu profile): not in a GPU slot; --only runs it"
            )
            _line("-", name, f"skipped: {row['reason']}")
            continue
        left = None if args.budget is None else args.budget - (time.monotonic() - start)
        if left is not None and expected > left:
            row["status"] = "skipped"
            row["reason"] = f"expected {expected:.0f} s > {left:.0f} s left of the budget"
            _line("-", name, f"skipped: {row['reason']}")
            continue
        print(
            f"  {name}: running {cmd}"
            + (
                f" (expected {expected:.0f} s" + (f", {left:.0f} s left)" if left is not None else ")")
                if expected is not None and not args.smoke
                else ""
            ),
            flush=True,
        )
        t0, c0 = time.perf_counter(), time.process_time()
        try:
            if name in benchmarks:
                bench_run["run"](out, deadline)
            else:
                result = e.run(config, command=cmd, progress=False, deadline=deadline, partial=partial_path(out))
                result.save(out)
        except DeadlineReached as stop:  # cooperative: stopped between two steps, the finished arms kept
            row.update(
                status="stopped",
                seconds=time.perf_counter() - t0,
                arms_done=stop.arms,
                partial=str(stop.partial) if stop.partial else None,
            )
            _line(
                "!",
                name,
                f"STOPPED at the deadline after {row['seconds']:.0f} s; arms kept: "
                + (f"{', '.join(stop.arms)} in {stop.partial}" if stop.arms else "none"),
            )
            failed.append(name)
            stopped = True
        except KeyboardInterrupt:  # a hard time limit (the slot script's timeout sends SIGINT): keep what finished
            row.update(status="interrupted", seconds=time.perf_counter() - t0)
            _line("!", name, f"INTERRUPTED after {row['seconds']:.0f} s; the results that finished are saved")
            failed.append(name)
            break
        except Exception as err:  # one failing experiment must not lose the others' results
            failed.append(name)
            row.update(status="failed", seconds=time.perf_counter() - t0, error=f"{type(err).__name__}: {err}")
            _line("!", name, f"FAILED after {row['seconds']:.0f} s: {row['error']}")
        else:
            row.update(status="done", seconds=time.perf_counter() - t0, path=str(out))
            _line(
                "+",
                name,
                f"done in {row['seconds']:.0f} s"
                + (f" (expected {expected:.0f} s)" if expected is not None and not args.smoke else "")
                + f" → {out}",
            )
        finally:
            row["cpu_seconds"] = time.process_time() - c0  # this process's CPU time (not torchrun's ranks)
            _free_device_memory()
        if args.summary:
            _write_summary(args.summary, rows, start, args)
    if args.dry_run:
        return 0
    total = time.monotonic() - start
    counts = {
        s: sum(r.get("status") == s for r in rows) for s in ("done", "skipped", "failed", "interrupted", "stopped")
    }
    print(
        f"= {counts['done']} done, {counts['skipped']} skipped, {counts['stopped']} stopped at the deadline, "
        f"{counts['failed'] + counts['interrupted']} failed "
        f"in {total:.0f} s" + (f" (budget {args.budget:.0f} s)" if args.budget is not None else ""),
        flush=True,
    )
    if args.summary:
        _write_summary(args.summary, rows, start, args)
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


def _benchmark_runner(name: str, script: str, args, tag: str) -> dict:
    """How ``--all`` runs the benchmark row ``name``: ``python SCRIPT --profile full [--smoke] --out OUT`` in a
    process of its own (the repository root first on PYTHONPATH), with what is left of the deadline; its exit
    status 3 is a stop at the deadline (:class:`DeadlineReached`, the finished arms in its partial file)."""

    def command(out) -> str:
        parts = (
            ["python", script, "--profile", "full"]
            + (["--smoke"] if args.smoke else [])
            + (["--out", str(out)] if out is not None else [])
        )
        return " ".join(parts)

    def run(out, deadline) -> None:
        argv = [sys.executable, str(ROOT / script), "--profile", "full", "--no-progress", "--out", str(out)]
        if args.smoke:
            argv.insert(4, "--smoke")
        if deadline is not None:
            left = deadline - runner.deadline_clock()
            if left <= 0:
                raise DeadlineReached("the deadline passed before it started", experiment=name)
            argv += ["--deadline", f"{left:.1f}"]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}
        proc = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True)
        tail = (proc.stdout + proc.stderr).strip().splitlines()
        for line in tail[-3:]:
            print(f"    {line}", flush=True)
        if proc.returncode == 3:
            part = partial_path(out)
            raise DeadlineReached("stopped at the deadline", experiment=name, partial=part if part.exists() else None)
        if proc.returncode != 0:
            raise RuntimeError(
                f"{script} exited with status {proc.returncode}: " + " | ".join(line for line in tail[-4:])
            )
        if not Path(out).exists():
            raise RuntimeError(f"{script} wrote no {out}")

    return {"command": command, "run": run}


def _write_summary(path: Path, rows: list, start: float, args) -> None:
    command = shlex.join(["python", "-m", "mpt_lab.experiments", *args.argv])
    save_json(
        {
            "command": command,
            "profile": args.profile,
            "smoke": bool(args.smoke),
            "budget": args.budget,
            "seconds": time.monotonic() - start,
            "experiments": rows,
            "provenance": provenance(command=command),
        },
        path,
    )
