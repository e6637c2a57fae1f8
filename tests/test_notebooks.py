"""Every notebook is committed without outputs and executes top to bottom (profile quick) without error."""

import time
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from conftest import ROOT, subprocess_env

NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))


def test_there_are_notebooks():
    assert NOTEBOOKS


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_committed_without_outputs(path: Path):
    nb = nbformat.read(path, as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert not cell.outputs and cell.execution_count is None, f"{path.name} has outputs; clear them"


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_executes(path: Path, monkeypatch):
    for k, v in subprocess_env().items():
        monkeypatch.setenv(k, v)
    nb = nbformat.read(path, as_version=4)
    t0 = time.perf_counter()
    NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}}).execute()
    elapsed = time.perf_counter() - t0
    assert elapsed < 90, f"{path.name} took {elapsed:.0f} s in the quick profile (limit 90 s, DESIGN.md)"
    asserts = sum(c.source.count("assert ") for c in nb.cells if c.cell_type == "code")
    assert asserts >= 3, "a chapter checks its key claims with visible asserts"
