"""The book builds from the repository with warnings as errors (-W, nitpicky), executing every notebook once; each
notebook's executed outputs are clean; each chapter's rendered page shows what it computed; every page reads
offline in a browser.

All tests that read the built book live in this file: the README's test command distributes tests by file
(``--dist loadfile``), so the book is built once, by one worker, while the other runs the rest of the suite.
"""

import re
from pathlib import Path

import nbformat
import pytest
from conftest import NOTEBOOKS

pytestmark = [pytest.mark.slow]

IMG = re.compile(r"<img[^>]+_images/")


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

CODE_LISTING = re.compile(r"<pre\b.*?</pre>|<code\b.*?</code>", re.S)


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
            # code in the text (a worked solution's <pre> block or inline <code>) is source, not a repr of a value
            shown = CODE_LISTING.sub("", text) if what == "a raw NumPy repr" else text
            m = pattern.search(shown)
            if m:
                problems.append(f"cell {i} ({kind}) shows {what}: …{shown[max(0, m.start() - 80) : m.end() + 80]}…")
    assert not problems, "\n".join(problems)
    print(f"{path.name}: executed in {book.notebook_seconds.get(path.stem, float('nan')):.0f} s (quick profile)")


def test_book_builds_without_warnings(book):
    assert book.returncode == 0, book.log[-6000:]
    assert "build succeeded" in book.log
    print(f"book built in {book.seconds:.0f} s (quick profile, executing every notebook)")


def _shows_gpu_section(page: str, name: str) -> bool:
    """The page shows experiment ``name``'s saved GPU result, or the command that makes it when none is saved."""
    from mpt_lab.experiments import get

    saved = get(name).saved("full") is not None
    return ("Saved GPU result" in page) if saved else (f"No GPU result of <code>{name}</code>" in page)


def test_chapter_pages_show_their_results(book):
    ch1 = book.page("notebooks/01_floating_point.html")
    # the chapter's outputs are there: its figures, the worked example, the format table
    assert len(IMG.findall(ch1)) >= 4 and "1 10000111 00111010101000000000000" in ch1 and "65504" in ch1
    ch2 = book.page("notebooks/02_where_the_gradients_go.html")
    assert len(IMG.findall(ch2)) >= 6 and "66.8%" in ch2 and _shows_gpu_section(ch2, "ssd_histogram")
    ch3 = book.page("notebooks/03_loss_scaling.html")
    assert len(IMG.findall(ch3)) >= 1 and "identical to torch: True" in ch3
    ch4 = book.page("notebooks/04_master_weights.html")
    assert len(IMG.findall(ch4)) >= 1 and "FP32 master weights" in ch4
    ch6 = book.page("notebooks/06_amp_in_practice.html")
    assert "speed-up vs FP32" in ch6 and "fake CUDA tensors" in ch6
    ch7 = book.page("notebooks/07_memory.html")
    assert "usual verdict" in ch7 and "MB as reported" in ch7
    ch8 = book.page("notebooks/08_when_fp16_fails.html")
    assert len(IMG.findall(ch8)) >= 3 and "FP16, static loss scale 128" in ch8 and "Read this first" in ch8
    ch9 = book.page("notebooks/09_graphs_in_half_precision.html")
    assert len(IMG.findall(ch9)) >= 2 and "float16" in ch9 and "DGL User Guide" in ch9
    ch10 = book.page("notebooks/10_across_processes.html")
    assert len(IMG.findall(ch10)) >= 3 and "FSDP2" in ch10 and "torchrun" in ch10
    ch11 = book.page("notebooks/11_fp8_and_block_scaling.html")
    assert len(IMG.findall(ch11)) >= 5 and "MXFP4" in ch11 and _shows_gpu_section(ch11, "fp8_recipes")
    ch12 = book.page("notebooks/12_your_model.html")
    assert len(IMG.findall(ch12)) >= 1 and "need a loss scale in FP16:" in ch12 and "precision_report" in ch12
    ch13 = book.page("notebooks/13_four_bits.html")
    assert len(IMG.findall(ch13)) >= 5 and "NVFP4 recipe" in ch13 and "stochastic" in ch13
    assert "Saved long CPU result" in ch13 or "No long CPU result of <code>fourbit_ablation</code>" in ch13
    bib = book.page("book/bibliography.html")
    assert "Micikevicius" in bib


def test_citations_link_to_their_bibliography_entries(book):
    """A citation's link lands on its entry: every "bibliography.html#cite-…" anchor a page links to exists on the
    bibliography page, and the introduction's {cite} roles and chapter 1's links use such anchors."""
    bib = book.page("book/bibliography.html")
    ids = set(re.findall(r'id="(cite-[\w-]+)"', bib))
    assert "cite-micikevicius2018mixed" in ids and "Rouhani and others" not in bib
    linked = set()
    for page in sorted(book.html.rglob("*.html")):
        for anchor in re.findall(r'href="[^"]*bibliography\.html#(cite-[\w-]+)"', page.read_text()):
            assert anchor in ids, (page.name, anchor)
            linked.add((page.name, anchor))
    assert ("intro.html", "cite-micikevicius2018mixed") in linked
    assert ("01_floating_point.html", "cite-ieee754-2019") in linked
    intro = book.page("book/intro.html")
    assert "Rouhani <em>et al.</em>, 2023a" in intro  # the MX specification, told apart from the 2023b paper


def test_no_page_shows_tracebacks_or_source_file_names(book):
    pages = sorted(book.html.rglob("*.html"))
    assert len(pages) >= 10
    for page in pages:
        text = page.read_text()
        assert "Traceback" not in text, page.name
        assert not re.search(r"[Ss]eed 0\d\d", text), page.name  # the book cites works, not file names


def test_every_page_reads_offline_in_a_browser(book):
    """Every page of the built book, opened from file:// in headless Chromium with the network blocked: formulas
    rendered (no raw \\( \\[ $$ left), no widget placeholder, every image loaded, no request off the machine."""
    import time

    from browser import offline_browser, skip_reason

    reason = skip_reason()
    if reason:
        pytest.skip(reason)
    pages = sorted(book.html.rglob("*.html"))
    pages = [
        p
        for p in pages
        if "_static" not in p.parts
        and p.name not in ("search.html", "genindex.html")
        and 'http-equiv="Refresh"' not in p.read_text()
    ]  # index.html only redirects
    t0 = time.perf_counter()
    problems = []
    with offline_browser() as session:
        page = session.new_page(1280, 1000)
        for path in pages:
            page.goto(path.as_uri())
            page.wait_for_load_state("load")
            # MathJax typesets after load: wait for it where the page has formulas
            page.evaluate(
                "() => (window.MathJax && MathJax.startup && MathJax.startup.promise)"
                " ? MathJax.startup.promise.then(() => true) : true"
            )
            # the page's text outside code (a regex in a code cell may hold \\[ legitimately)
            text = page.evaluate(
                "() => { const m = (document.querySelector('main') || document.body).cloneNode(true);"
                " m.querySelectorAll('pre, code, .highlight').forEach(e => e.remove());"
                " document.body.appendChild(m); const t = m.innerText; m.remove(); return t; }"
            )
            rel = path.relative_to(book.html).as_posix()
            for raw in ("\\(", "\\[", "$$"):
                if raw in text:
                    problems.append(f"{rel}: raw {raw} in the text")
            if "Error displaying widget" in text:
                problems.append(f"{rel}: a widget placeholder")
            broken = page.evaluate(
                "() => Array.from(document.images).filter(i => !i.complete || i.naturalWidth === 0).map(i => i.src)"
            )
            problems += [f"{rel}: broken image {src}" for src in broken]
            wide = page.evaluate("() => document.documentElement.scrollWidth - document.documentElement.clientWidth")
            if wide > 2:
                problems.append(f"{rel}: scrolls sideways by {wide} px at 1280 px")
            if rel.startswith("notebooks/"):
                session.screenshot(page, "book_" + path.stem, full_page=False)
        blocked = list(session.blocked)
    print(
        f"\n[browser] {len(pages)} pages opened offline in {time.perf_counter() - t0:.1f} s; "
        f"blocked requests: {len(blocked)}"
    )
    assert not blocked, f"pages asked the network for: {sorted(set(blocked))[:10]}"
    assert not problems, "\n".join(problems)
