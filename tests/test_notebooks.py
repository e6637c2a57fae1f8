"""Every notebook is committed without outputs, checks its key claims with visible asserts, cites works so that
the citations read in Jupyter, and installs mpt_lab when opened without it.  (Their execution is checked from
the book build, in tests/test_book.py: each notebook executes exactly once per test run.)"""

import re
from pathlib import Path

import nbformat
import pytest
from conftest import NOTEBOOKS


def test_there_are_notebooks():
    assert NOTEBOOKS


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_committed_without_outputs(path: Path):
    nb = nbformat.read(path, as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert not cell.outputs and cell.execution_count is None, f"{path.name} has outputs; clear them"
    asserts = sum(c.source.count("assert ") for c in nb.cells if c.cell_type == "code")
    assert asserts >= 3, "a chapter checks its key claims with visible asserts"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_every_cell_has_a_unique_id(path: Path):
    """nbformat 4.5 cell ids: without them nbformat warns on every read (and will refuse such notebooks)."""
    import json

    cells = json.loads(path.read_text())["cells"]
    ids = [c.get("id") for c in cells]
    assert all(ids) and len(set(ids)) == len(ids), f"{path.name}: cells without an id or with a repeated one"


def _bibliography_labels() -> set:
    """"Surname, year" of the first author of every entry of book/references.bib (as the chapters cite them)."""
    import codecs

    import latexcodec  # noqa: F401  (registers the "ulatex" codec; a dependency of pybtex)
    from conftest import ROOT
    from pybtex.database import parse_file

    out = set()
    for entry in parse_file(ROOT / "book" / "references.bib").entries.values():
        first = entry.persons["author"][0]
        name = " ".join(first.last_names) or " ".join(first.first_names)
        out.add(f"{codecs.decode(name, 'ulatex').replace('{', '').replace('}', '')}, {entry.fields['year']}")
    return out


CITATION = re.compile(r"\[\(([^\]]*)\)\]\(\.\./book/bibliography\.md\)")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_citations_read_in_jupyter_and_name_bibliography_entries(path: Path):
    """Chapters cite works as "(Author et al., year)" linked to the bibliography (a {cite} role shows raw in
    Jupyter); each cited author and year is an entry of book/references.bib."""
    labels = _bibliography_labels()
    nb = nbformat.read(path, as_version=4)
    text = "\n".join(c.source for c in nb.cells if c.cell_type == "markdown")
    assert "{cite}" not in text
    for m in CITATION.finditer(text):
        for item in m.group(1).split("; "):
            author, year = item.rsplit(", ", 1)
            author = author.replace(" et al.", "").split(" & ")[0]
            assert f"{author}, {year}" in labels, f"{path.name} cites ({item}), which is not in references.bib"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_first_cell_installs_mpt_lab_from_the_configured_repository(path: Path):
    """Opened in Colab (launch button), a chapter installs mpt_lab from the repository _config.yml names; the cell
    is removed from the rendered book and does nothing where mpt_lab is installed."""
    import yaml
    from conftest import ROOT

    url = yaml.safe_load((ROOT / "_config.yml").read_text())["repository"]["url"]
    nb = nbformat.read(path, as_version=4)
    first = next(c for c in nb.cells if c.cell_type == "code")
    assert f"mpt_lab @ git+{url}" in first.source and 'find_spec("mpt_lab") is None' in first.source
    assert "remove-cell" in first.metadata.get("tags", [])


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_each_exercise_is_checked_with_its_worked_solution_collapsed_under_it(path: Path):
    """Every exercise of chapter N is checked in notebook N, and the next cell shows its worked solution collapsed
    (``exercises.solution_dropdown``, input removed from the rendered book); no cell prints solutions in plain view."""
    from mpt_lab import exercises

    nb = nbformat.read(path, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    chapter = int(path.name[:2])
    for k in exercises.list_exercises(chapter):
        i = next((i for i, c in enumerate(code) if f'exercises.check("{k}"' in c.source), None)
        assert i is not None, f"{path.name} does not check exercise {k}"
        nxt = code[i + 1] if i + 1 < len(code) else None
        assert nxt is not None and f'exercises.solution_dropdown("{k}")' in nxt.source, \
            f"{path.name}: the cell after exercise {k}'s check must show its collapsed solution"
        assert "remove-input" in nxt.metadata.get("tags", []), path.name
    for c in code:
        assert "exercises.solution(" not in c.source, f"{path.name} prints a solution in plain view"
