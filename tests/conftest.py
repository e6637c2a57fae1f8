"""Shared test setup: deterministic, single-threaded torch (two shared cores; see ARCHITECTURE.md), and the book
built once per test run (every notebook executes exactly once, inside the build)."""

import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))

os.environ.setdefault("MPT_LAB_PROFILE", "quick")


@pytest.fixture(autouse=True, scope="session")
def _torch_threads():
    """One torch thread from the start, module-scoped fixtures included (two shared cores; ARCHITECTURE.md)."""
    import torch

    torch.set_num_threads(1)
    yield


@pytest.fixture(autouse=True)
def _one_thread():
    """Every test runs with one torch thread, whatever the test before it set, and leaves the setting as it was."""
    import torch

    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


def load_benchmark(name: str):
    """The script ``benchmarks/NAME.py`` as a module (registered in ``sys.modules``, as its dataclasses need)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"benchmarks_{name}", ROOT / "benchmarks" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def subprocess_env() -> dict:
    """Environment for subprocesses (kernels, the book build): this interpreter's bin first on PATH."""
    env = dict(os.environ)
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    env.setdefault("MPT_LAB_PROFILE", "quick")
    env["PYTHONHASHSEED"] = "0"
    return env


@dataclass
class BuiltBook:
    """The book built by ``jupyter-book build -W -n --keep-going`` into a temporary folder."""

    returncode: int
    log: str
    seconds: float
    html: Path  # _build/html
    executed: Path  # _build/jupyter_execute: the notebooks as executed by the build
    notebook_seconds: dict  # notebook stem → execution time reported by the build (s)

    def page(self, rel: str) -> str:
        return (self.html / rel).read_text()


@pytest.fixture(scope="session")
def book(tmp_path_factory) -> BuiltBook:
    """Build the book once for the whole test run (the tests that use it are all in test_book.py, which
    ``--dist loadfile`` runs on one worker)."""
    out = tmp_path_factory.mktemp("book")
    jb = Path(sys.executable).parent / "jupyter-book"
    cmd = [str(jb), "build", str(ROOT), "--path-output", str(out), "-W", "-n", "--keep-going"]
    t0 = time.perf_counter()
    res = subprocess.run(cmd, capture_output=True, text=True, env=subprocess_env(), timeout=3600)
    seconds = time.perf_counter() - t0
    log = res.stdout + res.stderr
    times = {
        Path(m.group(1)).stem: float(m.group(2))
        for m in re.finditer(r"(\S+\.ipynb): Executed notebook in ([0-9.]+) seconds", log)
    }
    print(
        f"\n[book] built in {seconds:.0f} s; notebooks: "
        + ", ".join(f"{k[:2]} {v:.0f} s" for k, v in sorted(times.items()))
    )
    return BuiltBook(res.returncode, log, seconds, out / "_build" / "html", out / "_build" / "jupyter_execute", times)
