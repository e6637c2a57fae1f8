"""The habits of the field, checked: ``ruff check`` (lint, with the settings in ``pyproject.toml``: line length 120,
ruff's long-standing default rules plus import sorting and pyupgrade) and ``ruff format --check`` over the whole
tree, and annotations on the public functions of ``mpt_lab``."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

#: Modules whose public functions are not all annotated yet, and why.
ANNOTATIONS_PENDING: dict = {}


def _ruff(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ruff", *args], cwd=ROOT, capture_output=True, text=True, timeout=300)


def _formatted() -> bool:
    """``[tool.mpt_lab] ruff_formatted`` in pyproject.toml: whether the tree has had its one formatter pass."""
    text = (ROOT / "pyproject.toml").read_text()
    section = text.split("[tool.mpt_lab]", 1)[1] if "[tool.mpt_lab]" in text else ""
    match = re.search(r"^ruff_formatted\s*=\s*(true|false)\s*$", section, re.M)
    return bool(match) and match.group(1) == "true"


def test_ruff_is_installed():
    proc = _ruff("--version")
    assert proc.returncode == 0, f"ruff is missing: pip install -r requirements.txt pins it ({proc.stderr.strip()})"


def test_ruff_check_is_clean():
    proc = _ruff("check", "--no-cache", ".")
    assert proc.returncode == 0, "ruff check (run `ruff check --fix` on the files you changed):\n" + proc.stdout[-6000:]


def test_ruff_format_check_is_clean():
    if not _formatted():
        pytest.skip(
            "the tree has not had its one `ruff format` pass yet (done after the branches of this turn are "
            "merged, in a commit of its own; then [tool.mpt_lab] ruff_formatted = true in pyproject.toml)"
        )
    proc = _ruff("format", "--check", "--no-cache", ".")
    assert proc.returncode == 0, "ruff format --check (run `ruff format` on these files):\n" + proc.stdout[-6000:]


# ------------------------------------------------------------------------------------------------ annotations
def _public_functions() -> list:
    """(where, function node) of every public function and method of mpt_lab: a name without a leading
    underscore, in a module without one, at module level or in a public class."""
    out = []
    for path in sorted((ROOT / "mpt_lab").rglob("*.py")):
        rel = path.relative_to(ROOT)
        if any(part.startswith("_") and part != "__init__.py" for part in rel.parts) or str(rel) in ANNOTATIONS_PENDING:
            continue
        tree = ast.parse(path.read_text())
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and not node.name.startswith("_"):
                out.append((f"{rel}:{node.lineno} {node.name}", node, False))
            elif isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                for item in node.body:
                    if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and not item.name.startswith("_"):
                        out.append((f"{rel}:{item.lineno} {node.name}.{item.name}", item, True))
    return out


def _unannotated(node: ast.FunctionDef, method: bool) -> list:
    args = node.args
    params = [*args.posonlyargs, *args.args, *args.kwonlyargs]
    if method and params and not any(isinstance(d, ast.Name) and d.id == "staticmethod" for d in node.decorator_list):
        params = params[1:]  # self / cls
    missing = [a.arg for a in params if a.annotation is None]
    missing += [f"*{a.arg}" for a in (args.vararg, args.kwarg) if a is not None and a.annotation is None]
    if node.returns is None and not any(isinstance(d, ast.Name) and d.id == "property" for d in node.decorator_list):
        missing.append("return")
    return missing


def test_public_functions_are_annotated():
    """Every public function and method of mpt_lab annotates its parameters and its return value (a property
    its return); the list below is what is not, and it may only shrink."""
    found = {where.split(" ")[1]: _unannotated(node, method) for where, node, method in _public_functions()}
    found = {name: missing for name, missing in found.items() if missing}
    assert not found, f"{len(found)} public functions without full annotations: " + "; ".join(
        f"{name} ({', '.join(m)})" for name, m in sorted(found.items())[:60]
    )
