"""Named seams: no module of mpt_lab reaches into another module's private names.

What one module needs from another is public (documented) or lives in a shared internal module (a module whose
own name starts with "_", such as ``mpt_lab/microscaling/_core.py`` or ``mpt_lab/figures/_base.py``, used by its
own package).  PyTorch's private APIs are imported in one place, ``mpt_lab/_torch_internals.py``; the private
attributes of torch objects that the package reads in place are listed in that module's docstring.

The scan reads every module of ``mpt_lab/`` with :mod:`ast` and fails on

* ``from <an mpt_lab module> import _name`` (absolute or relative);
* ``module._name`` where ``module`` names an mpt_lab module (``from . import formats as F``; ``F._x``);
* ``obj._name`` where ``_name`` is a private name that another mpt_lab module defines (a function, class,
  variable, method or attribute) and this module does not;
* an import of a private module of another package (``torch._C``, ``torch.utils._pytree``) or an attribute
  chain rooted at ``torch`` with a private part (``torch._foreach_max``) outside ``_torch_internals.py``;
* any other private attribute of an object from outside the package (``tensor._version``) that
  ``_torch_internals.py``'s docstring does not list;
* a private module of a package (``figures/_base.py``) imported from outside that package.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "mpt_lab"
INTERNALS = "mpt_lab._torch_internals"
#: Private imports from other libraries that are not torch's and stay where they are, with the reason.
FOREIGN_ALLOWED = {
    ("mpt_lab.formats", "numpy._core.umath"): "the ufunc behind np.clip, with np.clip as the fallback; formats "
    "imports without torch, so it cannot use _torch_internals",
}


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _package_of(module: str, path: Path) -> str:
    return module if path.name == "__init__.py" else module.rpartition(".")[0]


def _resolve(module: str, path: Path, node: ast.ImportFrom) -> str:
    """The absolute module an ImportFrom reads from."""
    if node.level == 0:
        return node.module or ""
    base = _package_of(module, path).split(".")
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _modules() -> dict:
    return {_module_name(p): (p, ast.parse(p.read_text(), str(p))) for p in sorted(PACKAGE.rglob("*.py"))}


def _defined_private_names(tree: ast.AST) -> set:
    """Private names a module defines: functions, classes, variables, attributes assigned on self/objects."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            out.add(node.id)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            out.add(node.attr)
        elif isinstance(node, ast.arg):
            out.add(node.arg)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            out.add(node.target.id)
    return {n for n in out if _private(n)}


def _internals_attributes() -> set:
    """The private attributes of torch objects that _torch_internals' docstring lists (``Tensor._version``)."""
    doc = ast.get_docstring(ast.parse((PACKAGE / "_torch_internals.py").read_text()))
    return set(re.findall(r"``[A-Za-z]+\.(_[A-Za-z_]+)(?:\(\))?``", doc))


def _root_name(node: ast.AST) -> str | None:
    while isinstance(node, ast.Attribute):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def _violations() -> list[str]:
    mods = _modules()
    defines = {m: _defined_private_names(tree) for m, (_, tree) in mods.items()}
    listed = _internals_attributes()
    found = []
    for module, (path, tree) in mods.items():
        where = path.relative_to(ROOT)
        aliases: dict[str, str] = {}  # local name → mpt_lab module it is bound to
        own_package = _package_of(module, path)
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                source = _resolve(module, path, node)
                for a in node.names:
                    target = f"{source}.{a.name}"
                    if target in mods:
                        aliases[a.asname or a.name] = target
                    if source.startswith("mpt_lab") and _private(a.name) and source != module:
                        found.append(f"{where}:{node.lineno}: from {source} import {a.name}")
                _check_module_path(found, where, node.lineno, module, own_package, source, mods)
            elif isinstance(node, ast.Import):
                for a in node.names:
                    if a.name in mods:
                        aliases[a.asname or a.name.split(".")[0]] = a.name if a.asname else "mpt_lab"
                    _check_module_path(found, where, node.lineno, module, own_package, a.name, mods)
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Attribute) and _private(node.attr)):
                continue
            root = _root_name(node)
            if isinstance(node.value, ast.Name) and node.value.id in aliases and aliases[node.value.id] != module:
                found.append(
                    f"{where}:{node.lineno}: {node.value.id}.{node.attr} (a private name of {aliases[node.value.id]})"
                )
            elif root == "torch" and module != INTERNALS:
                found.append(f"{where}:{node.lineno}: torch's private {ast.unparse(node)} outside _torch_internals")
            elif isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
                continue
            elif node.attr in defines[module] or node.attr in listed:
                continue
            elif any(node.attr in names for m, names in defines.items() if m != module):
                owners = sorted(m for m, names in defines.items() if m != module and node.attr in names)
                found.append(f"{where}:{node.lineno}: {ast.unparse(node)} (a private name of {', '.join(owners)})")
            elif node.attr not in listed and module != INTERNALS:
                found.append(
                    f"{where}:{node.lineno}: {ast.unparse(node)} (a private attribute of another "
                    "library, not listed in _torch_internals.py)"
                )
    return found


def _check_module_path(found, where, lineno, module, own_package, target, mods) -> None:
    parts = target.split(".")
    if not any(_private(p) for p in parts):
        return
    if parts[0] != "mpt_lab":
        if module != INTERNALS and (module, target) not in FOREIGN_ALLOWED:
            found.append(f"{where}:{lineno}: imports {target}, a private module of another library")
        return
    private_at = next(i for i, p in enumerate(parts) if _private(p))
    package = ".".join(parts[:private_at])  # the package the private module belongs to
    if not (own_package == package or own_package.startswith(package + ".")):
        found.append(f"{where}:{lineno}: imports {target}, a private module of {package}, from outside it")


def test_no_module_reaches_into_another_modules_private_names():
    found = _violations()
    assert not found, "private names used across modules:\n" + "\n".join(found)


def test_the_scan_sees_what_it_must_refuse(tmp_path, monkeypatch):
    """The scan itself: each kind of reach-through, planted in a copy of two modules, is found."""
    import shutil

    pkg = tmp_path / "mpt_lab"
    shutil.copytree(PACKAGE, pkg, ignore=shutil.ignore_patterns("__pycache__"))
    (pkg / "zz_a.py").write_text("def _helper():\n    return 1\n")
    (pkg / "zz_b.py").write_text(
        "import torch\nfrom . import zz_a\nfrom .zz_a import _helper\nfrom .figures._base import new_figure\n"
        "x = zz_a._helper()\ny = torch._foreach_max\nz = torch.ones(1)._made_up\n"
    )
    monkeypatch.setattr(__import__(__name__), "ROOT", tmp_path)
    monkeypatch.setattr(__import__(__name__), "PACKAGE", pkg)
    found = "\n".join(_violations())
    for expected in (
        "from mpt_lab.zz_a import _helper",
        "zz_a._helper (a private name of mpt_lab.zz_a)",
        "torch's private torch._foreach_max",
        "_made_up (a private attribute of another library",
        "imports mpt_lab.figures._base, a private module of mpt_lab.figures, from outside it",
    ):
        assert expected in found, (expected, found)


@pytest.mark.parametrize("name", sorted(_internals_attributes()))
def test_listed_torch_attributes_exist(name):
    """Each private torch attribute that _torch_internals lists still exists in this torch."""
    import torch
    from torch import nn

    holders = [
        torch,
        torch.ones(2),
        torch.ones(2).to_sparse(),
        torch.ops.aten.add.Tensor,
        nn.Linear(1, 1),
        nn.LSTM(1, 1),
    ]
    assert any(hasattr(h, name) for h in holders), name
