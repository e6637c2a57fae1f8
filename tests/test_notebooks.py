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


def _bibliography_labels() -> dict:
    """ "Surname, year" of the first author of every entry of book/references.bib, "Surname et al., year" for an
    entry of more than two authors (or "and others"), as the chapters cite them → the anchors of the entries with
    that label on the bibliography page ("cite-" + the key, as docutils writes an id: the ``bibtex_cite_id`` of
    _config.yml)."""
    import codecs

    import latexcodec  # noqa: F401  (registers the "ulatex" codec; a dependency of pybtex)
    from conftest import ROOT
    from docutils.nodes import make_id
    from pybtex.database import parse_file

    out = {}
    for key, entry in parse_file(ROOT / "book" / "references.bib").entries.items():
        authors = entry.persons["author"]
        first = authors[0]
        name = " ".join(first.last_names) or " ".join(first.first_names)
        et_al = " et al." if len(authors) > 2 or any(str(a) == "others" for a in authors) else ""
        label = f"{codecs.decode(name, 'ulatex').replace('{', '').replace('}', '')}{et_al}, {entry.fields['year']}"
        out.setdefault(label, set()).add(make_id(f"cite-{key}"))
    return out


#: A link to the bibliography: "[(Author et al., 2018)](../book/bibliography.md#cite-key)", the parentheses
#: inside or outside the brackets ("([A, 2022](…); [B, 2023](…))" cites two works), the anchor optional.
CITATION = re.compile(r"\[\(?([^\[\]]*?)\)?\]\(\.\./book/bibliography\.md(?:#([\w-]+))?\)")
#: Chapters whose citations link to their entry (an anchor on the bibliography page), not only to the page.
ANCHORED = ("01_", "02_", "03_", "04_", "05_", "06_", "13_")


def test_the_config_gives_bibliography_entries_the_anchors_the_chapters_use():
    from conftest import ROOT

    config = (ROOT / "_config.yml").read_text()
    assert re.search(r'bibtex_cite_id:\s*"cite-\{key\}"', config)
    labels = _bibliography_labels()
    assert all(len(anchors) == 1 for anchors in labels.values()), "two entries read alike: give them 2023a/2023b"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_citations_read_in_jupyter_and_name_bibliography_entries(path: Path):
    """Chapters cite works as "(Author et al., year)" linked to the bibliography (a {cite} role shows raw in
    Jupyter); each cited author and year is an entry of book/references.bib, and a link's anchor is that entry's
    (chapters 1-6 link every citation to its entry)."""
    labels = _bibliography_labels()
    nb = nbformat.read(path, as_version=4)
    text = "\n".join(c.source for c in nb.cells if c.cell_type == "markdown")
    assert "{cite}" not in text
    links = list(CITATION.finditer(text))
    assert links or not path.name.startswith(ANCHORED)
    for m in links:
        items, anchor = m.group(1).split("; "), m.group(2)
        strict = anchor is not None or path.name.startswith(ANCHORED)
        for item in items:
            author, year = item.rsplit(", ", 1)
            author = author.split(" & ")[0]
            if strict:  # "et al." exactly where the entry has more than two authors
                assert f"{author}, {year}" in labels, f"{path.name} cites ({item}), not so in references.bib"
            else:
                assert f"{author.replace(' et al.', '')}, {year}" in {k.replace(" et al.", "") for k in labels}, (
                    f"{path.name} cites ({item}), which is not in references.bib"
                )
        if strict:
            assert len(items) == 1, f"{path.name}: one link per work, each to its entry: {m.group(0)}"
            assert anchor in labels[f"{author}, {year}"], f"{path.name}: {m.group(0)} links to another entry"


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
        assert nxt is not None and f'exercises.solution_dropdown("{k}")' in nxt.source, (
            f"{path.name}: the cell after exercise {k}'s check must show its collapsed solution"
        )
        assert "remove-input" in nxt.metadata.get("tags", []), path.name
    for c in code:
        assert "exercises.solution(" not in c.source, f"{path.name} prints a solution in plain view"
