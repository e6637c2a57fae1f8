"""The book builds from the repository with warnings as errors (-W, nitpicky), executing every notebook once,
and each chapter's rendered page shows what it computed."""

import re

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("book")]

IMG = re.compile(r'<img[^>]+_images/')


def test_book_builds_without_warnings(book):
    assert book.returncode == 0, book.log[-6000:]
    assert "build succeeded" in book.log
    print(f"book built in {book.seconds:.0f} s (quick profile, executing every notebook)")


def test_chapter_pages_show_their_results(book):
    ch1 = book.page("notebooks/01_floating_point.html")
    # the chapter's outputs are there: its figures, the worked example, the format table
    assert len(IMG.findall(ch1)) >= 4 and "1 10000111 00111010101000000000000" in ch1 and "65504" in ch1
    ch2 = book.page("notebooks/02_where_the_gradients_go.html")
    assert len(IMG.findall(ch2)) >= 6 and "66.8%" in ch2 and "No GPU result of <code>ssd_histogram</code>" in ch2
    ch3 = book.page("notebooks/03_loss_scaling.html")
    assert len(IMG.findall(ch3)) >= 1 and "identical to torch: True" in ch3
    ch4 = book.page("notebooks/04_master_weights.html")
    assert len(IMG.findall(ch4)) >= 1 and "FP32 master weights" in ch4
    ch5 = book.page("notebooks/05_amp_in_practice.html")
    assert "speed-up vs FP32" in ch5 and "fake CUDA tensors" in ch5
    ch6 = book.page("notebooks/06_memory.html")
    assert "the usual verdict" in ch6 and "MB as reported" in ch6
    ch7 = book.page("notebooks/07_when_fp16_fails.html")
    assert len(IMG.findall(ch7)) >= 3 and "mixed FP16, loss scale 128" in ch7 and "Read this first" in ch7
    ch8 = book.page("notebooks/08_graphs_in_half_precision.html")
    assert len(IMG.findall(ch8)) >= 2 and "float16" in ch8 and "DGL User Guide" in ch8
    bib = book.page("book/bibliography.html")
    assert "Micikevicius" in bib


def test_no_page_shows_tracebacks_or_source_file_names(book):
    pages = sorted(book.html.rglob("*.html"))
    assert len(pages) >= 10
    for page in pages:
        text = page.read_text()
        assert "Traceback" not in text, page.name
        assert not re.search(r"[Ss]eed 0\d\d", text), page.name       # the book cites works, not file names


def test_every_page_reads_offline_in_a_browser(book):
    """Every page of the built book, opened from file:// in headless Chromium with the network blocked: formulas
    rendered (no raw \\( \\[ $$ left), no widget placeholder, every image loaded, no request off the machine."""
    import time

    from browser import offline_browser, skip_reason

    reason = skip_reason()
    if reason:
        pytest.skip(reason)
    pages = sorted(book.html.rglob("*.html"))
    pages = [p for p in pages if "_static" not in p.parts and p.name not in ("search.html", "genindex.html")
             and 'http-equiv="Refresh"' not in p.read_text()]          # index.html only redirects
    t0 = time.perf_counter()
    problems = []
    with offline_browser() as session:
        page = session.new_page(1280, 1000)
        for path in pages:
            page.goto(path.as_uri())
            page.wait_for_load_state("load")
            # MathJax typesets after load: wait for it where the page has formulas
            page.evaluate("() => (window.MathJax && MathJax.startup && MathJax.startup.promise)"
                          " ? MathJax.startup.promise.then(() => true) : true")
            text = page.inner_text("main") if page.query_selector("main") else page.inner_text("body")
            rel = path.relative_to(book.html).as_posix()
            for raw in ("\\(", "\\[", "$$"):
                if raw in text:
                    problems.append(f"{rel}: raw {raw} in the text")
            if "Error displaying widget" in text:
                problems.append(f"{rel}: a widget placeholder")
            broken = page.evaluate("() => Array.from(document.images).filter(i => !i.complete || i.naturalWidth === 0)"
                                   ".map(i => i.src)")
            problems += [f"{rel}: broken image {src}" for src in broken]
            wide = page.evaluate("() => document.documentElement.scrollWidth - document.documentElement.clientWidth")
            if wide > 2:
                problems.append(f"{rel}: scrolls sideways by {wide} px at 1280 px")
            if rel.startswith("notebooks/"):
                session.screenshot(page, "book_" + path.stem, full_page=False)
        blocked = list(session.blocked)
    print(f"\n[browser] {len(pages)} pages opened offline in {time.perf_counter() - t0:.1f} s; "
          f"blocked requests: {len(blocked)}")
    assert not blocked, f"pages asked the network for: {sorted(set(blocked))[:10]}"
    assert not problems, "\n".join(problems)
