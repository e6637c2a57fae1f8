"""Every notebook is committed without outputs, executes top to bottom in the book build (profile quick; each
notebook exactly once per test run) and checks its key claims with visible asserts.  Its executed outputs carry
no error, no warning, no raw Python repr and no file name of the source documents."""

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


def _outputs(nb):
    """(cell index, output type, text) of every output of an executed notebook."""
    for i, cell in enumerate(nb.cells):
        for out in cell.get("outputs", []):
            if out.output_type == "stream":
                yield i, out.name, out.text
            elif out.output_type == "error":
                yield i, "error", f"{out.ename}: {out.evalue}"
            else:
                data = out.get("data", {})
                yield i, out.output_type, data.get("text/plain", "") + data.get("text/html", "")


#: Text that must not appear in a chapter's outputs (a reader sees it in the rendered page).
FORBIDDEN = {
    "a warning": re.compile(r"\w*Warning\b"),
    "a raw NumPy repr": re.compile(r"np\.(float|int)\d+\("),
    "a raw dict": re.compile(r"\{'[^'\n]*': "),
    "a tqdm bar": re.compile(r"\d+%\|"),
    "a file name of the source documents": re.compile(r"[Ss]eed 0\d\d"),
}


@pytest.mark.slow
@pytest.mark.xdist_group("book")
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_executed_cleanly(book, path: Path):
    executed = book.executed / "notebooks" / path.name
    assert executed.exists(), f"the book build did not execute {path.name}:\n{book.log[-3000:]}"
    nb = nbformat.read(executed, as_version=4)
    assert any(c.get("outputs") for c in nb.cells), f"{path.name}: the build kept no outputs"
    problems = []
    for i, kind, text in _outputs(nb):
        if kind == "error":
            problems.append(f"cell {i}: {text}")
        for what, pattern in FORBIDDEN.items():
            m = pattern.search(text)
            if m:
                problems.append(f"cell {i} ({kind}) shows {what}: …{text[max(0, m.start() - 80):m.end() + 80]}…")
    assert not problems, "\n".join(problems)
    print(f"{path.name}: executed in {book.notebook_seconds.get(path.stem, float('nan')):.0f} s (quick profile)")


def _bibliography_labels() -> set:
    """"Surname, year" of the first author of every entry of book/references.bib (as the chapters cite them)."""
    import codecs

    import latexcodec  # noqa: F401  (registers the "ulatex" codec; a dependency of pybtex)
    from pybtex.database import parse_file

    from conftest import ROOT

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
