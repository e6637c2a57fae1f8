"""The book builds from the repository with warnings as errors (-W, nitpicky), executing every notebook."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT, subprocess_env


@pytest.mark.slow
def test_book_builds_without_warnings(tmp_path):
    jb = Path(sys.executable).parent / "jupyter-book"
    cmd = [str(jb), "build", str(ROOT), "--path-output", str(tmp_path), "-W", "-n", "--keep-going"]
    res = subprocess.run(cmd, capture_output=True, text=True, env=subprocess_env(), timeout=1500)
    log = res.stdout + res.stderr
    assert res.returncode == 0, log[-6000:]
    assert "build succeeded" in log
    html = tmp_path / "_build" / "html"
    page = (html / "notebooks" / "01_floating_point.html").read_text()
    # the chapter's outputs are there: its figures, the worked example, the format table
    assert len(re.findall(r'<img[^>]+_images/', page)) >= 4
    assert "1 10000111 00111010101000000000000" in page
    assert "65504" in page and "Traceback" not in page
    ch2 = (html / "notebooks" / "02_where_the_gradients_go.html").read_text()
    assert len(re.findall(r'<img[^>]+_images/', ch2)) >= 6 and "66.8%" in ch2 and "Traceback" not in ch2
    ch3 = (html / "notebooks" / "03_loss_scaling.html").read_text()
    assert len(re.findall(r'<img[^>]+_images/', ch3)) >= 1 and "identical to torch: True" in ch3
    ch4 = (html / "notebooks" / "04_master_weights.html").read_text()
    assert len(re.findall(r'<img[^>]+_images/', ch4)) >= 1 and "FP32 master weights" in ch4
    ch5 = (html / "notebooks" / "05_amp_in_practice.html").read_text()
    assert "speed-up vs FP32" in ch5 and "Traceback" not in ch5
    ch6 = (html / "notebooks" / "06_memory.html").read_text()
    assert "seed 004 says" in ch6 and "Traceback" not in ch6
    ch7 = (html / "notebooks" / "07_when_fp16_fails.html").read_text()
    assert len(re.findall(r'<img[^>]+_images/', ch7)) >= 3 and "mixed FP16, loss scale 128" in ch7
    assert "Traceback" not in ch7
    ch8 = (html / "notebooks" / "08_graphs_in_half_precision.html").read_text()
    assert len(re.findall(r'<img[^>]+_images/', ch8)) >= 2 and "float16" in ch8 and "Traceback" not in ch8
    assert (html / "book" / "bibliography.html").exists()
    assert "Micikevicius" in (html / "book" / "bibliography.html").read_text()
