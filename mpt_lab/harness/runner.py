"""The one experiment runner: profiles as data, seeding, threads, device, timing, provenance, JSON and the CLI.

An experiment module keeps only what is its own, the measured loop and the fields of its result::

    NAME = "loss_scaling"

    @dataclass
    class Config(ExperimentConfig):          # profile, seed, device, threads come from ExperimentConfig
        steps: int = 1500

    PROFILES = {"quick": {"steps": 400, "threads": 1}, "cpu": {...}, "full": {...}}

    @dataclass
    class LossScalingResult(ExperimentResult):   # config, provenance come from ExperimentResult
        losses: dict

    def measure(config: Config, run: Run) -> dict:   # returns the result's own fields
        for step in run.bar(range(config.steps), desc="FP16 + loss scaling"):
            ...
        return {"losses": losses}

    EXPERIMENT = Experiment(NAME, Config, PROFILES, measure, LossScalingResult, __doc__)
    run, config_for, main = EXPERIMENT.run, EXPERIMENT.config_for, EXPERIMENT.main

and the runner does the rest the same way for every experiment:

* **profiles as data**: ``config_for("cpu")`` is ``Config(profile="cpu", **PROFILES["cpu"])``; a profile the
  experiment does not define is a ValueError naming the ones it does.  :data:`RUN_PROFILES` are "quick" (CI, each
  notebook ≤ 90 s on 2 CPU cores), "cpu" (a laptop, each notebook ≤ 4 minutes), "long" (paper-like sizes
  that run in ≤ 60 minutes on 2 CPU cores, run once and saved as ``book/results/NAME_long.json``) and
  "full" (one GPU: all experiments together ≤ 8 minutes on one H100, :mod:`mpt_lab.harness.budget`; saved
  as ``NAME_full.json``).  :func:`mpt_lab.profile` never picks "long".
* **smoke runs**: ``smoke_config()`` is the full profile cut to a couple of steps and one evaluation by the
  experiment's ``smoke`` overrides (fields of *work* only: steps, epochs, batches, repeats, data-set sizes; never
  a width, a layer count, an image size or a switch that picks a code path), with ``profile="smoke"``.  It proves
  on any device, in seconds, that the full configuration runs end to end.  A smoke result says so in its
  profile and provenance, and :meth:`ExperimentResult.save` refuses to write one under ``book/results/``.
* **seeding, threads, device**: ``torch.manual_seed(config.seed)``; ``torch.set_num_threads(config.threads)``
  when it is non-zero (restored afterwards); ``config.device`` "auto" is CUDA when present.
* **timing and provenance**: the wall time of the run and where it came from (the command that regenerates it
  — with ``--set`` for every field that differs from the profile — device, CPU flags, versions, UTC date,
  configuration) in ``result.provenance``.
* **JSON**: results save to and load from JSON; a result is normalised through its JSON form when it is made,
  so a loaded result equals the one that was saved (tuples are lists, dict keys are strings, histograms are
  :class:`~mpt_lab.histogram.Log2Histogram`, non-finite floats are written "inf", "-inf", "nan").
* **the CLI**: ``python -m mpt_lab.experiments.NAME --profile P --out F --set key=value [--smoke]``;
  ``python -m mpt_lab.experiments --list`` and ``--all`` (see :mod:`mpt_lab.harness.cli`).
* **deadlines and arms**: ``run(config, deadline=T)`` (``--deadline SECONDS`` on the command line) stops the run
  *between steps* once the clock passes T: :meth:`Run.bar` checks it before each item and raises
  :class:`DeadlineReached`.  An experiment that trains several arms (recipes, variants, points of a sweep) hands
  each one to :meth:`Run.arm_done` the moment it finishes; with ``partial=PATH`` (``--out F`` writes
  ``F`` with the suffix ``.partial.json``) the finished arms are written there at once, so a run stopped at its
  deadline keeps them (the file says which arms finished and that the result is partial; a finished run removes
  it).  Cooperative, not a signal: the GPU slot's hard time limit (SIGINT) stays only as a backstop.
* **progress**: tqdm bars (``run.bar``) unless ``progress=False`` or the environment variable
  ``MPT_LAB_PROGRESS`` is "0" (the book build sets it: a rendered page shows one line of timing instead).
* **several processes**: an experiment made with a ``launcher`` (``distributed``: torchrun) is measured in the
  processes the launcher starts, each running the same CLI; the one that reports (rank 0) writes the result, which
  ``run`` returns (see :class:`Experiment`).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import os
import shlex
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, ClassVar, Protocol

import numpy as np
import torch
from tqdm.auto import tqdm

from .. import profile as current_profile
from ..device import backends, cpu_flags, provenance, resolve, synchronize
from ..histogram import Log2Histogram

__all__ = [
    "RUN_PROFILES",
    "Catalogue",
    "SMOKE",
    "ExperimentConfig",
    "ExperimentResult",
    "Experiment",
    "Run",
    "REGISTRY",
    "save_json",
    "load_json",
    "results_dir",
    "result_path",
    "progress_enabled",
    "is_smoke",
    "DeadlineReached",
    "partial_path",
    "PARTIAL_SUFFIX",
    "deadline_clock",
]

#: Every profile an experiment may define, from the smallest to the largest (an experiment's own ``PROFILES``
#: dict holds the Config values of those it defines; :data:`mpt_lab.LIVE_PROFILES` are those
#: :func:`mpt_lab.profile` picks for a live run).
RUN_PROFILES = ("quick", "cpu", "long", "full")

#: The ``profile`` of a smoke run's configuration: the full profile cut short (:meth:`Experiment.smoke_config`).
SMOKE = "smoke"

#: name → :class:`Experiment`, filled as experiment modules are imported (see ``mpt_lab.experiments.get``).
REGISTRY: dict[str, Experiment] = {}


class Catalogue(Protocol):
    """What the harness needs to know of the experiments, handed to it from above (the package
    :mod:`mpt_lab.experiments` is one): their names in the book's order, and each one's :class:`Experiment`.
    The harness never imports the experiments itself: they stand on the floor above it."""

    NAMES: tuple[str, ...]

    def get(self, name: str) -> Experiment:
        """The experiment called ``name``; ValueError for an unknown name."""


# ---------------------------------------------------------------------------------------------------- JSON
_HIST_TAG = "__log2_histogram__"


def _encode(obj: Any) -> Any:
    """A JSON-ready copy: tuples → lists, keys → str, non-finite floats → "inf"/"-inf"/"nan",
    :class:`~mpt_lab.histogram.Log2Histogram` → a tagged dict, NumPy scalars/arrays → Python numbers/lists."""
    if obj is None or isinstance(obj, (bool, str)):
        return obj
    if isinstance(obj, int):
        return int(obj)
    if isinstance(obj, float):
        if math.isfinite(obj):
            return obj
        return "nan" if math.isnan(obj) else ("inf" if obj > 0 else "-inf")
    if isinstance(obj, Log2Histogram):
        return {_HIST_TAG: obj.to_dict()}
    if isinstance(obj, dict):
        return {str(k): _encode(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_encode(v) for v in obj]
    if isinstance(obj, np.generic):
        return _encode(obj.item())
    if isinstance(obj, np.ndarray):
        return _encode(obj.tolist())
    raise TypeError(f"cannot store a {type(obj).__name__} in a result (convert tensors with float()/tolist())")


def _decode(obj: Any) -> Any:
    """Inverse of :func:`_encode` (up to tuples, which stay lists)."""
    if isinstance(obj, str):
        return {"inf": math.inf, "-inf": -math.inf, "nan": math.nan}.get(obj, obj)
    if isinstance(obj, list):
        return [_decode(v) for v in obj]
    if isinstance(obj, dict):
        if len(obj) == 1 and _HIST_TAG in obj:
            return Log2Histogram.from_dict(obj[_HIST_TAG])
        return {k: _decode(v) for k, v in obj.items()}
    return obj


def save_json(data: dict, path: str | os.PathLike) -> Path:
    """Write ``data`` (a dict) as indented JSON to ``path``, creating parent folders; returns the path.

    Non-finite floats are written as the strings "inf", "-inf", "nan" (JSON has no such numbers) and
    histograms as tagged dicts; :func:`load_json` reads them back.

    Raises TypeError when ``data`` is not a dict or holds something JSON cannot store (e.g. a tensor).
    """
    if not isinstance(data, dict):
        raise TypeError(f"data must be a dict, got {type(data).__name__}")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(_encode(data), indent=1, ensure_ascii=False) + "\n")
    return path


def load_json(path: str | os.PathLike) -> dict:
    """Read a dict written by :func:`save_json` (non-finite floats and histograms restored).

    Raises FileNotFoundError naming the path when it is missing.
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"no result file at {path}")
    return _decode(json.loads(path.read_text()))


def results_dir() -> Path:
    """``book/results`` of this repository: measured results with their provenance."""
    return Path(__file__).resolve().parents[2] / "book" / "results"


def result_path(name: str, profile: str) -> Path:
    """Where the saved result of experiment ``name`` in ``profile`` lives: ``book/results/NAME_PROFILE.json``."""
    return results_dir() / f"{name}_{profile}.json"


def is_smoke(data: ExperimentResult | dict) -> bool:
    """Whether a result (an :class:`ExperimentResult` or its dict) comes from a smoke run: its configuration's
    profile is :data:`SMOKE` or its provenance says ``"smoke"``.  Smoke results prove that code runs; their
    numbers mean nothing."""
    if isinstance(data, ExperimentResult):
        config, prov = data.config, data.provenance
    elif isinstance(data, dict):
        config, prov = data.get("config") or {}, data.get("provenance") or {}
    else:
        raise TypeError(f"data must be an ExperimentResult or a dict, got {type(data).__name__}")
    return config.get("profile") == SMOKE or prov.get("profile") == SMOKE or bool(prov.get("smoke"))


def _inside(path: Path, folder: Path) -> bool:
    try:
        path.resolve().relative_to(folder.resolve())
        return True
    except ValueError:
        return False


def progress_enabled(progress: bool | None = None) -> bool:
    """Whether to show progress bars: ``progress`` when given, else not when ``MPT_LAB_PROGRESS`` is
    "0", "false", "no" or "off" (the book build sets it), else yes."""
    if progress is not None:
        return bool(progress)
    return os.environ.get("MPT_LAB_PROGRESS", "1").strip().lower() not in ("0", "false", "no", "off")


# ------------------------------------------------------------------------------------------ config, result
@dataclass
class ExperimentConfig:
    """Fields every experiment's configuration has.

    profile : the profile these sizes come from ("quick", "cpu", "long", "full", "smoke" or "custom")
    seed : torch's seed at the start of the run; data and initial weights derive from it
    device : "auto" (CUDA when present), "cpu", "cuda" or "cuda:N"
    threads : torch CPU threads for the run (0: leave torch's setting)
    """

    profile: str = "custom"
    seed: int = 0
    device: str = "auto"
    threads: int = 0

    def validate(self) -> None:
        """Raise ValueError naming a field that holds an impossible value.  Experiments extend this."""
        if not isinstance(self.seed, int) or isinstance(self.seed, bool):
            raise ValueError(f"config.seed must be an int, got {self.seed!r}")
        if not isinstance(self.threads, int) or isinstance(self.threads, bool) or self.threads < 0:
            raise ValueError(f"config.threads must be an int ≥ 0, got {self.threads!r}")
        if not isinstance(self.device, str):
            raise ValueError(f"config.device must be a str such as 'auto', 'cpu' or 'cuda', got {self.device!r}")

    def check_positive(self, *names: str, minimum: int = 1) -> None:
        """Raise ValueError unless each named field is an int ≥ ``minimum``."""
        for name in names:
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < minimum:
                raise ValueError(f"config.{name} must be an int ≥ {minimum}, got {v!r}")

    def check_choices(self, name: str, allowed: Iterable, *, subset: bool = False) -> None:
        """Raise ValueError unless field ``name`` is one of ``allowed`` (or, with ``subset``, a non-empty
        sequence of them)."""
        allowed = tuple(allowed)
        v = getattr(self, name)
        ok = (isinstance(v, (list, tuple)) and len(v) > 0 and all(x in allowed for x in v)) if subset else v in allowed
        if not ok:
            what = "a non-empty sequence of" if subset else "one of"
            raise ValueError(f"config.{name} must be {what} {allowed}, got {v!r}")


@dataclass
class ExperimentResult:
    """Fields every result has, and its JSON persistence.

    config : the configuration of the run (a dict of its fields)
    provenance : where it came from: "command" (regenerates it), "device", "cpu_flags", "versions", "date"
        (UTC, ISO 8601), "profile", "experiment", "seconds" (wall time of the run) and "config"
    """

    NAME: ClassVar[str] = ""
    #: Configuration fields that were renamed since results were first saved: old name → new name.  A saved
    #: result's configuration is read with the new names (:meth:`upgrade`), so every result ever saved loads.
    RENAMED_CONFIG: ClassVar[dict[str, str]] = {}

    config: dict
    provenance: dict

    # --- what every result can say about itself --------------------------------------------------------
    @property
    def profile(self) -> str:
        """The profile the result was run in ("quick", "cpu", "long", "full", "smoke" or "custom")."""
        return str(self.config.get("profile", "custom"))

    @property
    def device(self) -> str:
        """The device it ran on, short (e.g. "NVIDIA H100 80GB HBM3" or "CPU: AMD EPYC")."""
        return str(self.provenance.get("device", "?")).split(" (")[0]

    @property
    def seconds(self) -> float:
        """Wall-clock seconds the run took (from the provenance; NaN when it does not say)."""
        return float(self.provenance.get("seconds", math.nan))

    def source(self) -> str:
        """One line: device, profile, date, wall time and the command that regenerates the result."""
        p = self.provenance
        return (
            f"{self.device}, {self.profile} profile, {str(p.get('date', '?'))[:10]}, {self.seconds:.0f} s: "
            f"command: {p.get('command', '?')}"
        )

    def describe(self) -> str:
        """A short text summary (experiments say more)."""
        return f"{self.NAME} ({self.profile} profile, {self.provenance.get('device', '?')}, {self.seconds:.0f} s)"

    # --- persistence ---------------------------------------------------------------------------------------
    def to_dict(self) -> dict:
        """A JSON-ready dict with the experiment's name under "experiment"."""
        return {"experiment": self.NAME, **{f.name: _encode(getattr(self, f.name)) for f in fields(self)}}

    @classmethod
    def from_dict(cls, d: dict) -> ExperimentResult:
        """Inverse of :meth:`to_dict`.

        Raises TypeError for a non-dict, ValueError for a result of another experiment or a missing field.
        """
        if not isinstance(d, dict):
            raise TypeError(f"d must be a dict, got {type(d).__name__}")
        if d.get("experiment") != cls.NAME:
            raise ValueError(f"not a {cls.NAME} result (experiment = {d.get('experiment')!r})")
        d = cls.upgrade(d)
        missing = [
            f.name
            for f in fields(cls)
            if f.name not in d and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        ]
        if missing:
            raise ValueError(f"the {cls.NAME} result lacks the fields {missing}")
        return cls(**{f.name: _decode(d[f.name]) for f in fields(cls) if f.name in d})

    @classmethod
    def upgrade(cls, d: dict) -> dict:
        """A saved result's dict in today's names: the configuration's fields renamed by :data:`RENAMED_CONFIG`
        (a result that already has the new name is left alone).  Experiments whose saved results hold other old
        names extend it; :meth:`from_dict` calls it, so old results keep loading.  Returns a new dict."""
        names = cls.RENAMED_CONFIG
        return cls.with_config(d, lambda c: {names.get(k, k) if names.get(k) not in c else k: v for k, v in c.items()})

    @staticmethod
    def with_config(d: dict, fn: Callable[[dict], dict]) -> dict:
        """``d`` with ``fn`` applied to its configuration and to the copy of it in its provenance (so that the two
        stay equal when an old result is read in today's names); a new dict.  A part that is not a dict is kept."""
        out = dict(d)
        if isinstance(d.get("config"), dict):
            out["config"] = fn(d["config"])
        prov = d.get("provenance")
        if isinstance(prov, dict) and isinstance(prov.get("config"), dict):
            out["provenance"] = {**prov, "config": fn(prov["config"])}
        return out

    def save(self, path: str | os.PathLike) -> Path:
        """Write the result as JSON (with its provenance) to ``path``.

        Raises ValueError for a smoke result (:func:`is_smoke`) and a path under ``book/results/``: a smoke run's
        numbers must never be mistaken for a measurement.
        """
        if is_smoke(self) and _inside(Path(path), results_dir()):
            raise ValueError(
                f"a smoke result must not be saved under {results_dir()} (got {path}): its numbers are "
                "not a measurement"
            )
        return save_json(self.to_dict(), path)

    @classmethod
    def load(cls, path: str | os.PathLike) -> ExperimentResult:
        """Read a result written by :meth:`save`."""
        with open(path) as f:
            return cls.from_dict(json.load(f))


# ----------------------------------------------------------------------------------------------- deadline
#: What ``--out F`` becomes for the arms of a run that has not finished (:func:`partial_path`).
PARTIAL_SUFFIX = ".partial.json"


def partial_path(out: str | os.PathLike) -> Path:
    """Where the finished arms of a run whose result goes to ``out`` are kept until it finishes:
    ``NAME_full.json`` → ``NAME_full.partial.json``."""
    out = Path(out)
    stem = out.name[: -len(".json")] if out.name.endswith(".json") else out.name
    return out.with_name(stem + PARTIAL_SUFFIX)


def deadline_clock() -> float:
    """The clock of deadlines: Unix time in seconds (one clock for every process of a slot)."""
    return time.time()


class DeadlineReached(Exception):
    """The run's deadline passed; raised between two steps (:meth:`Run.bar`, :meth:`Run.check_deadline`).

    Attributes: ``experiment`` (its name), ``arms`` (the keys of the arms that finished before it, in order),
    ``partial`` (the file that holds them, or None), ``seconds`` (how long the run had run).
    """

    def __init__(self, message: str, *, experiment: str = "", arms=(), partial=None, seconds: float = math.nan):
        super().__init__(message)
        self.experiment, self.arms, self.partial, self.seconds = experiment, list(arms), partial, seconds


# ---------------------------------------------------------------------------------------------------- run
class Run:
    """What a measured loop gets besides its config: the device, progress bars and a clock.

    Attributes
    ----------
    config : the experiment's Config
    device : torch.device
    progress : bool, whether :meth:`bar` shows bars
    deadline : Unix time (seconds) at which the run stops between steps, or None
    arms : dict key → the data of each arm that finished (:meth:`arm_done`), in order
    """

    def __init__(self, config, device, progress: bool, *, deadline: float | None = None, on_arm=None):
        self.config, self.device, self.progress = config, device, progress
        self.deadline = None if deadline is None else float(deadline)
        self.arms: dict = {}
        self._on_arm = on_arm
        self._t0 = time.perf_counter()

    def bar(
        self, iterable: Iterable | None = None, *, desc: str | None = None, total: int | None = None, leave: bool = True
    ) -> Iterable:
        """``tqdm.auto.tqdm(iterable, ...)`` when progress is on, else the iterable itself (or a no-op bar).

        With a deadline, iterating checks it before each item (:meth:`check_deadline`): a loop over steps stops
        between two steps, raising :class:`DeadlineReached`."""
        bar = tqdm(iterable, desc=desc, total=total, disable=not self.progress, mininterval=1.0, leave=leave)
        if iterable is None or self.deadline is None:
            return bar
        return self._checked(bar)

    def _checked(self, bar):
        with contextlib.closing(bar):
            for item in bar:
                self.check_deadline()
                yield item

    def time_left(self) -> float:
        """Seconds until the deadline (inf without one; negative once it has passed)."""
        return math.inf if self.deadline is None else self.deadline - deadline_clock()

    def check_deadline(self) -> None:
        """Raise :class:`DeadlineReached` when the deadline has passed (call it between steps of a loop that does not
        go through :meth:`bar`)."""
        if self.deadline is not None and deadline_clock() >= self.deadline:
            raise DeadlineReached(
                f"the deadline passed after {time.perf_counter() - self._t0:.0f} s; "
                f"finished arms: {', '.join(self.arms) or 'none'}",
                arms=list(self.arms),
                seconds=time.perf_counter() - self._t0,
            )

    def arm_done(self, key: str, data: Any) -> None:
        """Record that the arm ``key`` (a recipe, a variant, a point of a sweep) finished with ``data`` (anything a
        result can store): kept in :attr:`arms` and, when the run keeps a partial file, written there at once.

        Raises TypeError for a key that is not a str or data a result cannot store."""
        if not isinstance(key, str):
            raise TypeError(f"key must be a str, got {type(key).__name__}")
        self.arms[key] = _decode(_encode(data))
        if self._on_arm is not None:
            self._on_arm(self)

    def sync(self) -> None:
        """Wait for the device's queued work (CUDA); a no-op on a CPU."""
        synchronize(self.device)

    def elapsed(self) -> float:
        """Seconds since the run started (after synchronising the device)."""
        self.sync()
        return time.perf_counter() - self._t0


@contextlib.contextmanager
def _threads(n: int):
    if not n:
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _parse_like(old, value: str):
    """Parse a ``--set`` value to the type of the field's current value (tuples: comma-separated)."""
    if isinstance(old, bool):
        low = value.strip().lower()
        if low not in ("1", "true", "yes", "on", "0", "false", "no", "off"):
            raise ValueError(f"expected true or false, got {value!r}")
        return low in ("1", "true", "yes", "on")
    if isinstance(old, (tuple, list)):
        kind = type(old[0]) if old else str
        return type(old)(kind(v.strip()) for v in value.split(",") if v.strip())
    if old is None:
        return value
    return type(old)(value)


class Experiment:
    """One reproduced result: its name, Config, profiles, measured loop and Result (see the module docstring).

    Parameters
    ----------
    name : str, the module name under ``mpt_lab.experiments`` and the JSON tag
    config : a dataclass subclassing :class:`ExperimentConfig`
    profiles : dict profile → dict of Config fields (a subset of :data:`RUN_PROFILES`)
    measure : callable(config, run: Run) → dict of the result's own fields
    result : a dataclass subclassing :class:`ExperimentResult`
    title : the first line is the CLI's description (a module docstring will do)
    launcher : None, or for an experiment whose measure runs in several processes (``torchrun``) a callable
        ``launcher(config, *, progress, command) -> Result | None``.  :meth:`run` hands it the configuration
        first: it starts the processes (each runs ``python -m mpt_lab.experiments.NAME`` and so :meth:`run`),
        waits for them and returns the result they wrote; in a process it started it returns None, and
        :meth:`run` measures there.  ``measure`` returns None in a process that does not report (a rank other
        than 0): :meth:`run` then returns None and :meth:`main` prints and writes nothing.
    smoke : None, or a dict of Config fields that cut the "full" profile to a smoke run (see
        :meth:`smoke_config`): only fields of work (steps, epochs, batches, repeats, data-set sizes), so that the
        model's shape and every code path stay those of the full profile.  Required with a "full" profile.
    """

    def __init__(
        self,
        name: str,
        config: type,
        profiles: dict,
        measure: Callable,
        result: type,
        title: str = "",
        launcher: Callable | None = None,
        smoke: dict | None = None,
    ):
        if not (isinstance(config, type) and issubclass(config, ExperimentConfig)):
            raise TypeError("config must be a dataclass subclassing ExperimentConfig")
        if not (isinstance(result, type) and issubclass(result, ExperimentResult)):
            raise TypeError("result must be a dataclass subclassing ExperimentResult")
        unknown = [p for p in profiles if p not in RUN_PROFILES]
        if unknown:
            raise ValueError(f"profiles: {unknown} are not among {RUN_PROFILES}")
        names = {f.name for f in fields(config)}
        for p, over in profiles.items():
            bad = [k for k in over if k not in names or k == "profile"]
            if bad:
                raise ValueError(f"profile {p!r} of {name} sets unknown fields {bad}")
        if smoke is not None:
            if not isinstance(smoke, dict) or "full" not in profiles:
                raise ValueError(
                    f"smoke of {name} must be a dict of Config fields, for an experiment with a full profile"
                )
            bad = [k for k in smoke if k not in names or k == "profile"]
            if bad:
                raise ValueError(f"smoke of {name} sets unknown fields {bad}")
        self.smoke = None if smoke is None else dict(smoke)
        self.name, self.Config, self.Result, self.measure = name, config, result, measure
        self.launcher = launcher
        self.profiles = {p: dict(profiles[p]) for p in RUN_PROFILES if p in profiles}
        self.title = (title or name).strip().splitlines()[0]
        result.NAME = name
        REGISTRY[name] = self

    def __repr__(self) -> str:
        return f"Experiment({self.name!r}, profiles {tuple(self.profiles)})"

    # --- configuration ------------------------------------------------------------------------------------
    def config_for(self, profile: str) -> ExperimentConfig:
        """The Config of ``profile``.

        Raises ValueError for a name that is not a profile, or a profile this experiment does not define
        (the message names the ones it does).
        """
        if profile not in RUN_PROFILES:
            raise ValueError(f"profile must be one of {RUN_PROFILES}, got {profile!r}")
        if profile not in self.profiles:
            raise ValueError(
                f"the {self.name} experiment has no {profile!r} profile; it has {', '.join(self.profiles)}"
            )
        return self.Config(profile=profile, **self.profiles[profile])

    def smoke_config(self) -> ExperimentConfig:
        """The "full" profile cut to a smoke run: ``Config(profile="smoke", **(PROFILES["full"] | {"threads": 1} |
        smoke))``.

        The same model shapes and code paths as the full profile, with only the work cut (a couple of steps, one
        evaluation, small batches where a CPU needs them), so that ``--all --profile full --smoke`` proves on
        any device, CPU included, that no full configuration dies on an error.  One CPU thread unless the
        overrides say otherwise (on a shared 2-core machine two threads can be many times slower than one).

        Raises ValueError for an experiment without a full profile or without smoke overrides.
        """
        if "full" not in self.profiles or self.smoke is None:
            raise ValueError(
                f"the {self.name} experiment has no smoke run: it needs a 'full' profile and "
                "smoke overrides (Experiment(..., smoke={...}))"
            )
        return self.Config(profile=SMOKE, **{**self.profiles["full"], "threads": 1, **self.smoke})

    def _resolve(self, config):
        if config is None:
            config = self.config_for(current_profile())
        if not isinstance(config, self.Config):
            raise TypeError(
                f"config must be a {self.Config.__module__}.{self.Config.__qualname__}, got {type(config).__name__}"
            )
        config.validate()
        return config

    def command(self, config: ExperimentConfig | None = None, out: str | os.PathLike | None = None) -> str:
        """The command line that runs ``config``: a profile plus ``--set`` for each field that differs from it
        (a custom config is expressed against the experiment's first profile)."""
        config = self.config_for(self._default_profile()) if config is None else config
        if config.profile == SMOKE and self.smoke is not None:
            base = self.smoke_config()
            parts = ["python", "-m", f"mpt_lab.experiments.{self.name}", "--profile", "full", "--smoke"]
        else:
            profile = config.profile if config.profile in self.profiles else next(iter(self.profiles))
            base = self.config_for(profile)
            parts = ["python", "-m", f"mpt_lab.experiments.{self.name}", "--profile", profile]
        for f in fields(config):
            v = getattr(config, f.name)
            if f.name == "profile" or getattr(base, f.name) == v:
                continue
            text = ",".join(str(x) for x in v) if isinstance(v, (tuple, list)) else str(v)
            parts += ["--set", f"{f.name}={text}"]
        if out is not None:
            parts += ["--out", str(out)]
        return " ".join(shlex.quote(p) for p in parts)

    def _default_profile(self) -> str:
        p = current_profile()
        return p if p in self.profiles else next(iter(self.profiles))

    # --- running ------------------------------------------------------------------------------------------
    def run(
        self,
        config: ExperimentConfig | None = None,
        *,
        progress: bool | None = None,
        command: str | None = None,
        deadline: float | None = None,
        partial: str | os.PathLike | None = None,
    ) -> ExperimentResult | None:
        """Run the experiment and return its Result.

        Parameters
        ----------
        config : a Config; default the Config of :func:`mpt_lab.profile`
        progress : show tqdm bars (default: yes, unless ``MPT_LAB_PROGRESS=0``)
        command : the command line to record (default :meth:`command` of ``config``)
        deadline : Unix time (seconds, ``time.time()``) at which to stop between two steps, or None
        partial : a path where the arms that finished (:meth:`Run.arm_done`) are written as they finish, as JSON
            with the configuration and provenance and ``"partial": {...}``; removed when the run finishes

        Returns None in a process that does not report (see ``launcher`` in the class docstring).

        Raises
        ------
        TypeError
            ``config`` is not this experiment's Config.
        ValueError
            A field of ``config`` is impossible (named), or the profile is unknown.
        DeadlineReached
            The deadline passed before the run finished; its ``arms`` and ``partial`` say what was kept.
        """
        config = self._resolve(config)
        if self.launcher is not None:
            launched = self.launcher(config, progress=progress, command=command or self.command(config))
            if launched is not None:
                return launched
        device = resolve(config.device)
        show = progress_enabled(progress)
        command = command or self.command(config)
        cfg = _decode(_encode(dataclasses.asdict(config)))
        flags = backends()  # TF32 and cuDNN switches as the run starts (experiments restore theirs)
        partial = None if partial is None else Path(partial)
        started = deadline_clock()

        def write_partial(run: Run, stopped: str | None = None) -> None:
            prov = provenance(command=command, config=cfg, device=device)
            prov.update(
                experiment=self.name,
                profile=config.profile,
                backends=flags,
                partial={
                    "arms_done": list(run.arms),
                    "stopped": stopped,
                    "seconds": deadline_clock() - started,
                    "note": "the arms that finished; not a result (the run did not finish)",
                },
            )
            save_json(
                {"experiment": self.name, "partial": True, "config": cfg, "provenance": prov, "arms": run.arms}, partial
            )

        with _threads(config.threads):
            torch.manual_seed(config.seed)
            run = Run(config, device, show, deadline=deadline, on_arm=write_partial if partial else None)
            try:
                own = self.measure(config, run)
            except DeadlineReached as stop:
                if partial is not None:
                    write_partial(run, stopped=str(stop))
                raise DeadlineReached(
                    f"{self.name}: {stop}",
                    experiment=self.name,
                    arms=list(run.arms),
                    partial=partial if partial is not None and run.arms else None,
                    seconds=stop.seconds,
                ) from None
            seconds = run.elapsed()
        if own is None and self.launcher is not None:  # a launched process that does not report
            return None
        if not isinstance(own, dict):
            raise TypeError(f"{self.name}: measure must return a dict of result fields, got {type(own).__name__}")
        prov = provenance(command=command, config=cfg, device=device)
        prov.update(experiment=self.name, profile=config.profile, seconds=seconds, backends=flags)
        if config.profile == SMOKE:
            prov["smoke"] = {
                "of": "full",
                "overrides": _decode(_encode(self.smoke or {})),
                "note": "a smoke run: the full profile cut short; its numbers are not a measurement",
            }
        if device.type == "cpu":
            prov["cpu_flags"] = cpu_flags()
        result = self.Result(config=cfg, provenance=prov, **_decode(_encode(own)))
        if partial is not None and partial.exists():
            partial.unlink()  # the result supersedes the arms kept on the way
        if not show:
            print(f"{self.name} ({config.profile} profile): {seconds:.1f} s on {result.device}")
        return result

    # --- saved results ------------------------------------------------------------------------------------
    def saved(self, profile: str = "full") -> ExperimentResult | None:
        """The saved result ``book/results/NAME_PROFILE.json`` as a Result, or None when there is none."""
        path = result_path(self.name, profile)
        return self.Result.load(path) if path.exists() else None

    # --- command line -------------------------------------------------------------------------------------
    def main(self, argv: list | None = None) -> int:
        """``python -m mpt_lab.experiments.NAME [--profile P] [--out F] [--set key=value ...]``."""
        p = argparse.ArgumentParser(prog=f"python -m mpt_lab.experiments.{self.name}", description=self.title)
        p.add_argument(
            "--profile",
            choices=tuple(self.profiles),
            default=None,
            help="run size (default: mpt_lab.profile(), i.e. full with CUDA, else cpu)",
        )
        p.add_argument("--out", type=Path, help="write the result as JSON here")
        p.add_argument(
            "--set",
            action="append",
            default=[],
            metavar="KEY=VALUE",
            help="override a configuration field (repeatable; tuples comma-separated)",
        )
        p.add_argument("--no-progress", action="store_true", help="no progress bars")
        p.add_argument(
            "--deadline",
            type=float,
            metavar="SECONDS",
            default=None,
            help="stop between two steps this many seconds from now, keeping the arms that finished in "
            "OUT with the suffix .partial.json (exit status 3)",
        )
        if self.smoke is not None:
            p.add_argument(
                "--smoke",
                action="store_true",
                help="the full profile cut to a smoke run (a couple of steps; its numbers mean nothing)",
            )
        args = p.parse_args(argv)
        if getattr(args, "smoke", False):
            if args.profile not in (None, "full"):
                p.error("--smoke cuts the full profile: use it with --profile full (or no --profile)")
            cfg = self.smoke_config()
        else:
            cfg = self.config_for(args.profile or self._default_profile())
        for item in args.set:
            key, sep, value = item.partition("=")
            if not sep or key not in {f.name for f in fields(cfg)} or key == "profile":
                p.error(
                    f"--set: {item!r} is not KEY=VALUE with a configuration field of {self.name} "
                    f"({', '.join(f.name for f in fields(cfg) if f.name != 'profile')})"
                )
            try:
                setattr(cfg, key, _parse_like(getattr(cfg, key), value))
            except ValueError as err:
                p.error(f"--set {key}: {err}")
        if cfg.profile == SMOKE and args.out and _inside(args.out, results_dir()):
            p.error(f"--smoke: a smoke result must not be written under {results_dir()}")
        deadline = None if args.deadline is None else deadline_clock() + args.deadline
        try:
            result = self.run(
                cfg,
                progress=False if args.no_progress else None,
                command=self.command(cfg, args.out),
                deadline=deadline,
                partial=partial_path(args.out) if args.out else None,
            )
        except DeadlineReached as stop:
            print(
                f"stopped at the deadline: {stop}"
                + (f"; the finished arms are in {stop.partial}" if stop.partial else "")
            )
            return 3
        except ValueError as err:
            p.error(str(err))
        if result is None:  # a launched process that does not report (a rank other than 0)
            return 0
        print(result.describe())
        if args.out:
            result.save(args.out)
            print(f"wrote {args.out}")
        return 0


def run_main(experiment: Experiment) -> None:
    """``if __name__ == "__main__": run_main(EXPERIMENT)`` in an experiment module."""
    raise SystemExit(experiment.main(sys.argv[1:]))
