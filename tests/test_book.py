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
