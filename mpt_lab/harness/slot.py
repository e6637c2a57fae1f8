"""A GPU slot's results in one archive, and back into ``book/results/``.

The lent GPU machines bring back at most 8 files from a command's output folder, so ``benchmarks/gpu_slot.sh``
packs everything a slot produced into one ``.tar.gz`` (:func:`pack`): the results ``results/NAME_full.json``,
the run's log and summary, and ``manifest.json`` with the provenance of the slot (device, versions, date,
commands) and the SHA-256 of every file.  :func:`unpack` (``python -m mpt_lab.experiments --unpack ARCHIVE``)
checks the archive and copies its results into ``book/results/``, byte for byte, so that each keeps the
provenance it was written with.  It refuses, before writing anything:

* a member with an absolute path, a ``..``, a link or anything but a regular file;
* a file under ``results/`` that is not named ``NAME_full.json`` for an experiment of
  :data:`mpt_lab.experiments.NAMES` or a benchmark row of :data:`mpt_lab.harness.budget.BENCHMARKS` (whose
  result is checked as any result is, but not loaded by its class: the benchmark is a script), or
  ``NAME_full.partial.json`` (the arms of a run stopped at its deadline: kept in the archive, listed, never
  copied into ``book/results/``);
* a result whose content disagrees with its name (another experiment, another profile), a smoke result
  (:func:`~mpt_lab.harness.runner.is_smoke`), one without provenance (command, device, versions, date), one
  that its experiment's Result class cannot load, or one whose SHA-256 differs from the manifest's.

The checks need the experiments' Result classes, which stand on the floor above the harness: the functions
that check take the catalogue of experiments (:class:`~mpt_lab.harness.runner.Catalogue`) as an argument, and
``python -m mpt_lab.experiments --unpack ARCHIVE`` hands it the package :mod:`mpt_lab.experiments`.

Command line (what the slot script calls)::

    python -m mpt_lab.harness.slot pack WORKDIR ARCHIVE      # WORKDIR/results/*.json, WORKDIR/*.log, *.json
    python -m mpt_lab.experiments --unpack ARCHIVE [--into book/results]
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import re
import sys
import tarfile
import time
from pathlib import Path

from ..device import provenance
from .budget import BENCHMARKS
from .runner import Catalogue, is_smoke, results_dir

__all__ = ["pack", "unpack", "unpack_main", "check_archive", "partials", "MANIFEST", "RESULT_NAME", "PARTIAL_NAME"]

#: The manifest's name inside the archive.
MANIFEST = "manifest.json"

#: What a result's file name must look like: ``NAME_full.json``.
RESULT_NAME = re.compile(r"^(?P<name>[a-z0-9_]+)_full\.json$")

#: The arms of a run stopped at its deadline: ``NAME_full.partial.json`` (never copied into book/results/).
PARTIAL_NAME = re.compile(r"^(?P<name>[a-z0-9_]+)_full\.partial\.json$")

#: What every result's provenance must hold.
_PROVENANCE = ("command", "device", "versions", "date")


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def pack(workdir: str | Path, archive: str | Path, *, extra: dict | None = None) -> Path:
    """Pack a slot's ``workdir`` into the gzipped tar ``archive``: ``workdir/results/*.json`` as ``results/…``,
    the other files directly in ``workdir`` (logs, the run's summary) at the top, and :data:`MANIFEST`.

    Parameters
    ----------
    workdir : folder with ``results/`` (may be missing or empty: a slot that produced nothing still packs its
        log)
    archive : path of the ``.tar.gz`` to write (its folder is created)
    extra : more entries for the manifest (e.g. the slot's commands)

    Returns the archive's path.  Raises FileNotFoundError when ``workdir`` does not exist.
    """
    workdir, archive = Path(workdir), Path(archive)
    if not workdir.is_dir():
        raise FileNotFoundError(f"no slot folder at {workdir}")
    files = sorted(p for p in workdir.iterdir() if p.is_file() and p.resolve() != archive.resolve())
    files += sorted(p for p in (workdir / "results").glob("*") if p.is_file()) if (workdir / "results").is_dir() else []
    entries, results = {}, []
    for p in files:
        arc = p.relative_to(workdir).as_posix()
        data = p.read_bytes()
        entries[arc] = {"bytes": len(data), "sha256": _sha256(data)}
        if arc.startswith("results/") and arc.endswith(".json"):
            try:
                d = json.loads(data)
                prov = d.get("provenance", {})
                results.append(
                    {
                        "file": arc,
                        "experiment": d.get("experiment"),
                        "profile": prov.get("profile"),
                        "device": prov.get("device"),
                        "seconds": prov.get("seconds"),
                        "date": prov.get("date"),
                        "partial": bool(d.get("partial")),
                        **({"arms_done": prov.get("partial", {}).get("arms_done")} if d.get("partial") else {}),
                    }
                )
            except (ValueError, AttributeError):
                results.append({"file": arc, "error": "not a result (JSON with provenance)"})
    try:
        prov = provenance(command="benchmarks/gpu_slot.sh")
    except Exception as err:  # pragma: no cover - packing must not fail for want of a description
        prov = {"error": f"{type(err).__name__}: {err}"}
    manifest = {
        "what": "mpt_lab GPU slot: full-profile results with provenance",
        "created": prov.get("date"),
        "provenance": prov,
        "results": results,
        "files": entries,
        **(extra or {}),
    }
    archive.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(archive, "w:gz") as tar:
        for p in files:
            tar.add(p, arcname=p.relative_to(workdir).as_posix(), recursive=False)
        blob = (json.dumps(manifest, indent=1, ensure_ascii=False) + "\n").encode()
        info = tarfile.TarInfo(MANIFEST)
        info.size, info.mtime = len(blob), int(time.time())
        tar.addfile(info, io.BytesIO(blob))
    return archive


def check_archive(archive: str | Path, *, experiments: Catalogue) -> tuple:
    """Read and check a slot's archive (see the module docstring) without writing anything; ``experiments``
    names the experiments and loads their results (:class:`~mpt_lab.harness.runner.Catalogue`).

    Returns ``(manifest, results)``: the manifest dict and a dict file name (``NAME_full.json``) → its bytes.

    Raises
    ------
    FileNotFoundError
        No file at ``archive``.
    ValueError
        Not a tar archive, no manifest, an unsafe member, a file under ``results/`` that is not a valid,
        non-smoke ``NAME_full.json`` with provenance, or a checksum that differs from the manifest's (the
        message names the file and why).
    """
    known = set(experiments.NAMES) | set(BENCHMARKS)
    archive = Path(archive)
    if not archive.is_file():
        raise FileNotFoundError(f"no archive at {archive}")
    try:
        tar = tarfile.open(archive, "r:*")
    except tarfile.TarError as err:
        raise ValueError(f"{archive} is not a tar archive ({err})") from None
    results, manifest = {}, None
    with tar:
        for m in tar.getmembers():
            parts = Path(m.name).parts
            if m.name.startswith("/") or ".." in parts or not parts:
                raise ValueError(f"unsafe member {m.name!r} (absolute or with '..')")
            if m.isdir():
                continue
            if not m.isfile():
                raise ValueError(f"member {m.name!r} is not a regular file (a link or a device)")
            data = tar.extractfile(m).read()
            if m.name == MANIFEST:
                manifest = json.loads(data)
            elif parts[0] == "results":
                if len(parts) == 2 and PARTIAL_NAME.match(parts[-1]) and PARTIAL_NAME.match(parts[-1])["name"] in known:
                    continue  # a stopped run's arms: listed by partials(), not copied
                match = RESULT_NAME.match(parts[-1]) if len(parts) == 2 else None
                if match is None or match["name"] not in known:
                    raise ValueError(
                        f"{m.name}: only results named NAME_full.json, NAME an experiment of "
                        f"mpt_lab.experiments.NAMES or a benchmark of budget.BENCHMARKS, go to "
                        f"book/results/"
                    )
                results[parts[-1]] = data
    if manifest is None:
        raise ValueError(f"{archive} has no {MANIFEST}: not a slot archive made by mpt_lab.harness.slot.pack")
    for fname, data in results.items():
        name = RESULT_NAME.match(fname)["name"]
        listed = manifest.get("files", {}).get(f"results/{fname}")
        if listed is None or listed.get("sha256") != _sha256(data):
            raise ValueError(f"results/{fname}: its SHA-256 differs from the manifest's (or it is not listed)")
        try:
            d = json.loads(data)
        except ValueError:
            raise ValueError(f"results/{fname} is not JSON") from None
        if not isinstance(d, dict) or d.get("experiment") != name:
            raise ValueError(
                f"results/{fname} holds a result of {d.get('experiment') if isinstance(d, dict) else d!r}, "
                f"not of {name}"
            )
        if is_smoke(d):
            raise ValueError(f"results/{fname} is a smoke result (the full profile cut short): not a measurement")
        prov = d.get("provenance") or {}
        if d.get("config", {}).get("profile") != "full" or prov.get("profile") not in ("full", None):
            raise ValueError(f"results/{fname} is a {d.get('config', {}).get('profile')!r} result, not a full one")
        missing = [k for k in _PROVENANCE if not prov.get(k)]
        if missing:
            raise ValueError(f"results/{fname} lacks the provenance {missing}")
        if name in BENCHMARKS:  # a script's result: the fields every result has
            if not isinstance(d.get("config"), dict):
                raise ValueError(f"results/{fname} has no configuration")
            continue
        try:
            experiments.get(name).Result.from_dict(d)
        except (TypeError, ValueError) as err:
            raise ValueError(f"results/{fname} does not load as a {name} result: {err}") from None
    return manifest, results


def partials(archive: str | Path) -> list:
    """The ``results/NAME_full.partial.json`` members of a slot's archive (runs stopped at their deadline, with
    the arms they finished), as (member name, experiment, arms done) tuples.  Raises FileNotFoundError or
    ValueError as :func:`check_archive`."""
    archive = Path(archive)
    if not archive.is_file():
        raise FileNotFoundError(f"no archive at {archive}")
    try:
        tar = tarfile.open(archive, "r:*")
    except tarfile.TarError as err:
        raise ValueError(f"{archive} is not a tar archive ({err})") from None
    out = []
    with tar:
        for m in tar.getmembers():
            parts = Path(m.name).parts
            if m.isfile() and len(parts) == 2 and parts[0] == "results" and PARTIAL_NAME.match(parts[1]):
                try:
                    d = json.loads(tar.extractfile(m).read())
                    arms = list(d.get("arms", {}))
                except ValueError:
                    arms = []
                out.append((m.name, PARTIAL_NAME.match(parts[1])["name"], arms))
    return out


def unpack(archive: str | Path, into: str | Path | None = None, *, experiments: Catalogue) -> list:
    """Check ``archive`` (:func:`check_archive`) and copy its results, byte for byte, into ``into`` (default
    ``book/results/``); returns the paths written.  Nothing is written when any check fails."""
    _, results = check_archive(archive, experiments=experiments)
    into = results_dir() if into is None else Path(into)
    into.mkdir(parents=True, exist_ok=True)
    written = []
    for fname, data in sorted(results.items()):
        path = into / fname
        path.write_bytes(data)
        written.append(path)
    return written


def unpack_main(archive: str | Path, into: str | Path | None = None, *, experiments: Catalogue) -> int:
    """``python -m mpt_lab.experiments --unpack ARCHIVE [--into DIR]``: :func:`unpack`, printing each file
    written and each partial result kept in the archive.  Returns the exit status: 0, or 2 when the archive is
    refused (the reason on standard error; nothing written)."""
    try:
        written = unpack(archive, into, experiments=experiments)
    except (ValueError, FileNotFoundError) as err:
        print(f"refused {archive}: {err}", file=sys.stderr)
        return 2
    for path in written:
        print(f"wrote {path}")
    for member, name, arms in partials(archive):
        print(
            f"kept in the archive, not copied: {member} ({name} stopped at its deadline; arms done: "
            f"{', '.join(arms) or 'none'})"
        )
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m mpt_lab.harness.slot pack WORKDIR ARCHIVE``: :func:`pack`, and a line that lists the archive.
    Returns the exit status (0)."""
    p = argparse.ArgumentParser(prog="python -m mpt_lab.harness.slot", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="verb", required=True)
    pk = sub.add_parser("pack", help="pack a slot folder into one archive")
    pk.add_argument("workdir", type=Path)
    pk.add_argument("archive", type=Path)
    args = p.parse_args(argv)
    path = pack(args.workdir, args.archive)
    with tarfile.open(path) as tar:
        names = tar.getnames()
    print(f"packed {len(names)} files into {path} ({path.stat().st_size / 1e6:.2f} MB): {', '.join(names)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
