"""What every experiment shares: JSON persistence, where results live, and the command line."""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any, Callable

__all__ = ["save_json", "load_json", "results_dir", "find_result", "main"]


def _clean(obj: Any) -> Any:
    """JSON-safe copy: non-finite floats become the strings "inf", "-inf", "nan" (JSON has no such numbers)."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return "nan" if math.isnan(obj) else ("inf" if obj > 0 else "-inf")
    if isinstance(obj, dict):
        return {str(k): _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    return obj


def save_json(data: dict, path) -> Path:
    """Write ``data`` (a dict of JSON types) to ``path`` with indentation; creates parent folders."""
    if not isinstance(data, dict):
        raise TypeError(f"data must be a dict, got {type(data).__name__}")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(_clean(data), indent=1, sort_keys=False) + "\n")
    return path


def load_json(path) -> dict:
    """Read a dict written by :func:`save_json`.  Raises FileNotFoundError with the path when it is missing."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"no result file at {path}")
    return json.loads(path.read_text())


def results_dir() -> Path:
    """``book/results`` of this repository (where measured results with provenance are kept)."""
    return Path(__file__).resolve().parents[2] / "book" / "results"


def find_result(name: str, profile: str = "full") -> Path | None:
    """The saved result ``book/results/{name}_{profile}.json`` if it exists, else None."""
    p = results_dir() / f"{name}_{profile}.json"
    return p if p.exists() else None


def main(description: str, run: Callable, config_for: Callable, argv=None) -> int:
    """The shared CLI: ``--profile {quick,cpu,full}``, ``--out PATH``, ``--set key=value`` overrides."""
    from .. import PROFILES, profile

    p = argparse.ArgumentParser(description=description)
    p.add_argument("--profile", choices=PROFILES, default=None, help="run size (default: mpt_lab.profile())")
    p.add_argument("--out", type=Path, help="write the result as JSON here")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a configuration field (repeatable)")
    args = p.parse_args(argv)
    cfg = config_for(args.profile or profile())
    for item in args.set:
        key, _, value = item.partition("=")
        if not hasattr(cfg, key):
            p.error(f"--set: unknown configuration field {key!r}")
        old = getattr(cfg, key)
        setattr(cfg, key, type(old)(value) if old is not None and not isinstance(old, bool)
                else (value.lower() in ("1", "true", "yes") if isinstance(old, bool) else value))
    command = " ".join(["python -m", sys.modules[run.__module__].__name__] + (argv if argv is not None else sys.argv[1:]))
    result = run(cfg, command=command)
    print(result.describe())
    if args.out:
        result.save(args.out)
        print(f"wrote {args.out}")
    return 0
