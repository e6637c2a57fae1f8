"""What every experiment shares: JSON persistence, where results live, and the command line."""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any, Callable

__all__ = ["save_json", "load_json", "results_dir", "find_result", "main", "prepare", "JsonResult",
           "backward_step"]


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


def _parse_like(old, value: str):
    """Parse a ``--set`` value to the type of the field's current value (tuples: comma-separated)."""
    if isinstance(old, bool):
        return value.strip().lower() in ("1", "true", "yes", "on")
    if isinstance(old, (tuple, list)):
        kind = type(old[0]) if old else str
        return type(old)(kind(v) for v in value.split(",") if v.strip())
    if old is None:
        return value
    return type(old)(value)


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
        setattr(cfg, key, _parse_like(getattr(cfg, key), value))
    command = " ".join(["python -m", sys.modules[run.__module__].__name__] + (argv if argv is not None else sys.argv[1:]))
    result = run(cfg, command=command)
    print(result.describe())
    if args.out:
        result.save(args.out)
        print(f"wrote {args.out}")
    return 0


def prepare(config, config_cls: type, config_for: Callable):
    """Resolve a run's configuration and device, as every experiment's ``run`` starts.

    ``config`` None → ``config_for(mpt_lab.profile())``; sets torch's CPU threads when ``config.threads`` is
    non-zero and seeds torch with ``config.seed``.  Returns ``(config, device)``.

    Raises TypeError when ``config`` is not an instance of ``config_cls``.
    """
    import torch

    from .. import profile
    from ..device import default_device

    if config is None:
        config = config_for(profile())
    if not isinstance(config, config_cls):
        raise TypeError(f"config must be a {config_cls.__name__}, got {type(config).__name__}")
    if getattr(config, "threads", 0):
        torch.set_num_threads(config.threads)
    dev = getattr(config, "device", "auto")
    device = default_device() if dev == "auto" else torch.device(dev)
    torch.manual_seed(getattr(config, "seed", 0))
    return config, device


class JsonResult:
    """Mixin for an experiment's result dataclass: JSON persistence tagged with the experiment's name.

    Subclasses set ``NAME`` and may override :meth:`to_dict` / :meth:`_from_fields` for fields that need
    conversion (histograms, tuples).
    """

    NAME = ""

    def to_dict(self) -> dict:
        from dataclasses import fields

        d = {f.name: getattr(self, f.name) for f in fields(self)}
        d["experiment"] = self.NAME
        return d

    @classmethod
    def _from_fields(cls, d: dict):
        from dataclasses import fields

        return cls(**{f.name: d[f.name] for f in fields(cls) if f.name in d})

    @classmethod
    def from_dict(cls, d: dict):
        """Inverse of :meth:`to_dict`.  Raises ValueError for a result of another experiment."""
        if not isinstance(d, dict):
            raise TypeError(f"d must be a dict, got {type(d).__name__}")
        if d.get("experiment") != cls.NAME:
            raise ValueError(f"not a {cls.NAME} result (experiment = {d.get('experiment')!r})")
        return cls._from_fields(d)

    def save(self, path):
        """Write the result as JSON (with its provenance)."""
        return save_json(self.to_dict(), path)

    @classmethod
    def load(cls, path):
        return cls.from_dict(load_json(path))


def backward_step(loss, optimizer, scaler=None) -> None:
    """Backward and optimizer step, through a loss scaler when one is given (scale, step, update).

    ``scaler`` is anything with the ``torch.amp.GradScaler`` contract (``mpt_lab.scaling.GradScaler``,
    ``StaticLossScaler``, torch's own) or None for a plain ``loss.backward(); optimizer.step()``.
    """
    if scaler is not None:
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
    else:
        loss.backward()
        optimizer.step()
