"""``python -m mpt_lab.experiments --list`` and ``--all``: every experiment, one command.

    python -m mpt_lab.experiments --list
    python -m mpt_lab.experiments --all --profile full --out book/results/         # on a CUDA machine
    python -m mpt_lab.experiments --all --profile quick --out /tmp/r --only loss_scaling,message_passing

``--all`` runs, one after the other, every experiment that defines the profile, writing
``OUT/NAME_PROFILE.json``; results already saved there are skipped unless ``--force``.  ``--dry-run`` prints
the commands without running them.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from . import NAMES, PROFILES, get


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m mpt_lab.experiments", description=__doc__.splitlines()[0])
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--list", action="store_true", help="list the experiments and their profiles")
    what.add_argument("--all", action="store_true", help="run every experiment that has --profile")
    p.add_argument("--profile", choices=PROFILES, help="with --all: which profile to run")
    p.add_argument("--out", type=Path, help="with --all: folder for NAME_PROFILE.json (e.g. book/results/)")
    p.add_argument("--only", default="", help="with --all: comma-separated names to run (default: all)")
    p.add_argument("--force", action="store_true", help="with --all: rerun results that are already saved")
    p.add_argument("--dry-run", action="store_true", help="with --all: print the commands, run nothing")
    args = p.parse_args(argv)
    if args.list:
        width = max(map(len, NAMES))
        for name in NAMES:
            e = get(name)
            print(f"{name:<{width}}  profiles: {', '.join(e.profiles):<24} {e.title}")
        return 0
    if not args.profile or not args.out:
        p.error("--all needs --profile and --out")
    only = [n.strip() for n in args.only.split(",") if n.strip()]
    unknown = [n for n in only if n not in NAMES]
    if unknown:
        p.error(f"--only: unknown experiments {unknown}; they are {', '.join(NAMES)}")
    failed = []
    for name in only or NAMES:
        e = get(name)
        if args.profile not in e.profiles:
            print(f"- {name}: no {args.profile} profile, skipped")
            continue
        out = args.out / f"{name}_{args.profile}.json"
        cmd = e.command(e.config_for(args.profile), out)
        if out.exists() and not args.force:
            print(f"- {name}: {out} exists, skipped (--force reruns it)")
            continue
        print(f"+ {cmd}", flush=True)
        if args.dry_run:
            continue
        t0 = time.perf_counter()
        try:
            result = e.run(e.config_for(args.profile), command=cmd)
        except Exception as err:  # one failing experiment must not lose the others' results
            failed.append(name)
            print(f"! {name} failed after {time.perf_counter() - t0:.0f} s: {type(err).__name__}: {err}",
                  file=sys.stderr, flush=True)
            continue
        result.save(out)
        print(f"  {name}: {time.perf_counter() - t0:.0f} s → {out}", flush=True)
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
