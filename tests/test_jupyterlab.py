"""Chapter 1 in JupyterLab, as a learner opens it: the live ipywidgets bit explorer works in the browser.

The test starts JupyterLab (from requirements.txt, so that the README's ``jupyter lab notebooks/`` works) on
127.0.0.1 at a free port with a token, opens a copy of ``notebooks/01_floating_point.ipynb`` (its cells up
to and including the one that calls ``widgets.bit_explorer(...)``; a copy, so that JupyterLab's autosave
never writes outputs into the repository) in headless Chromium with every request off the machine blocked,
runs the cells from the Run menu, finds the explorer, clicks a bit and reads the new value back from the
kernel's answer.  The server is stopped by its PID (kernels first, through its REST API) whatever happens.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import nbformat
import pytest
from browser import ROOT, free_port, offline_browser, skip_reason

from mpt_lab import widgets

NOTEBOOK = ROOT / "notebooks" / "01_floating_point.ipynb"
DEADLINE_S = 150  # the whole test, server start to stop; it takes about 30-60 s on two cores


def _reason() -> str | None:
    try:
        import jupyterlab  # noqa: F401
    except ImportError:
        return "jupyterlab is not installed (pip install -r requirements.txt)"
    return skip_reason()


def trimmed_notebook(dest: Path) -> int:
    """Write chapter 1's cells up to and including the bit explorer's to dest; return that cell's index."""
    nb = nbformat.read(NOTEBOOK, as_version=4)
    idx = next((i for i, c in enumerate(nb.cells) if c.cell_type == "code" and "bit_explorer(" in c.source), None)
    assert idx is not None, f"{NOTEBOOK.name} has no cell calling widgets.bit_explorer(...)"
    nb.cells = nb.cells[: idx + 1]
    for c in nb.cells:
        if c.cell_type == "code":
            c.outputs, c.execution_count = [], None
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, dest)
    return idx


def _api(base: str, token: str, path: str, method: str = "GET"):
    req = urllib.request.Request(f"{base}{path}", method=method, headers={"Authorization": f"token {token}"})
    with urllib.request.urlopen(req, timeout=5) as r:
        body = r.read()
    return json.loads(body) if body else None


class Lab:
    """JupyterLab on 127.0.0.1 in a subprocess; :meth:`stop` ends it by PID."""

    def __init__(self, root_dir: Path, work: Path):
        self.port, self.token = free_port(), secrets.token_hex(16)
        self.base = f"http://127.0.0.1:{self.port}"
        env = dict(
            os.environ,
            MPT_LAB_PROFILE="quick",
            PYTHONHASHSEED="0",
            JUPYTER_CONFIG_DIR=str(work / "config"),
            JUPYTER_RUNTIME_DIR=str(work / "runtime"),
            IPYTHONDIR=str(work / "ipython"),
            JUPYTERLAB_SETTINGS_DIR=str(work / "settings"),
            JUPYTERLAB_WORKSPACES_DIR=str(work / "workspaces"),
            PATH=str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", ""),
        )
        self.log_path = work / "jupyterlab.log"
        self.log = open(self.log_path, "w")
        cmd = [
            sys.executable,
            "-m",
            "jupyterlab",
            "--no-browser",
            "--ServerApp.ip=127.0.0.1",
            f"--ServerApp.port={self.port}",
            "--ServerApp.port_retries=0",
            f"--IdentityProvider.token={self.token}",
            f"--ServerApp.root_dir={root_dir}",
            "--LabApp.news_url=None",
            "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
            # a server or kernel left behind by a crash stops by itself
            "--ServerApp.shutdown_no_activity_timeout=600",
            "--MappingKernelManager.cull_idle_timeout=600",
            "--LabApp.extension_manager=readonly",
        ]
        if hasattr(os, "geteuid") and os.geteuid() == 0:  # CI runs as root
            cmd.append("--allow-root")
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, env=env, cwd=root_dir)

    def wait_ready(self, timeout: float = 60) -> float:
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < timeout:
            if self.proc.poll() is not None:
                raise RuntimeError(f"JupyterLab exited with {self.proc.returncode}:\n{self.log_text()}")
            try:
                _api(self.base, self.token, "/api/status")
                return time.perf_counter() - t0
            except OSError:
                time.sleep(0.3)
        raise TimeoutError(f"JupyterLab did not answer within {timeout} s:\n{self.log_text()}")

    def log_text(self) -> str:
        self.log.flush()
        return self.log_path.read_text(errors="replace")[-4000:]

    def stop(self) -> None:
        try:
            if self.proc.poll() is None:
                for k in _api(self.base, self.token, "/api/kernels") or []:
                    _api(self.base, self.token, f"/api/kernels/{k['id']}", method="DELETE")
        except OSError:
            pass
        finally:
            if self.proc.poll() is None:
                self.proc.send_signal(signal.SIGTERM)
                try:
                    self.proc.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait(timeout=10)
            self.log.close()


def run_all_cells(page, tries: int = 4) -> None:
    """Run > Run All Cells, again until a cell runs: a run asked for while the kernel's connection is still
    being set up (the status already reads idle) leaves every cell unrun, with no message."""
    started = (
        r"() => [...document.querySelectorAll('.jp-InputArea-prompt')].some(e => /\[(\*|\d+)\]/.test(e.innerText))"
    )
    dialogs = []
    for _ in range(tries):
        # a dialog JupyterLab opened meanwhile (seen on a loaded machine: it took every click) is read and closed
        for _ in range(3):
            dialog = page.locator(".jp-Dialog")
            if not dialog.count():
                break
            dialogs.append(dialog.first.inner_text()[:300])
            page.keyboard.press("Escape")
            page.wait_for_timeout(500)
        try:
            # a dialog may also open between the check above and these clicks: then a click waits in vain (it
            # intercepts pointer events), and the next try closes it first
            page.locator(".jp-Notebook .jp-Cell").first.click(timeout=15_000)  # focus: the Run menu acts on it
            page.locator(".lm-MenuBar-itemLabel", has_text="Run").first.click(timeout=15_000)
            page.locator(
                "li.lm-Menu-item[data-command='runmenu:run-all'], "  # Run All Cells
                "li.lm-Menu-item[data-command='notebook:run-all-cells']"
            ).first.click(timeout=15_000)
            page.wait_for_function(started, timeout=10_000)
            return
        except Exception:  # playwright's TimeoutError
            continue
    raise AssertionError(f"JupyterLab ran no cell after {tries} tries of Run All Cells; dialogs closed: {dialogs}")


@pytest.mark.slow
@pytest.mark.skipif(_reason() is not None, reason=str(_reason()))
def test_chapter_1_bit_explorer_in_jupyterlab(tmp_path):
    t0 = time.perf_counter()
    nbdir = tmp_path / "notebooks"
    nbdir.mkdir()
    idx = trimmed_notebook(nbdir / NOTEBOOK.name)
    lab = Lab(nbdir, tmp_path)
    try:
        startup = lab.wait_ready()
        with offline_browser(timeout_ms=60_000) as b:
            page = b.new_page(1400, 1000)
            page.goto(f"{lab.base}/lab/tree/{NOTEBOOK.name}?token={lab.token}")
            page.locator(".jp-Notebook .jp-Cell").first.wait_for()
            page.locator(".jp-NotebookPanel-toolbar .jp-Notebook-ExecutionIndicator[data-status='idle']").wait_for()
            t_open = time.perf_counter() - t0
            run_all_cells(page)
            ex = page.locator(".mpt-bit-explorer-widget")
            try:  # the explorer, or a traceback in an output
                page.wait_for_function(
                    r"""() => document.querySelector('.mpt-bit-explorer-widget') ||
                             [...document.querySelectorAll('.jp-OutputArea-output')].some(
                               e => /Traceback|Cell In\[\d+\]/.test(e.innerText))""",
                    timeout=max(5_000, int((DEADLINE_S - (time.perf_counter() - t0)) * 1000)),
                )
            finally:
                b.screenshot(page, "jupyterlab_chapter_1")
            errors = page.evaluate(r"""() => [...document.querySelectorAll('.jp-OutputArea-output')]
                                        .map(e => e.innerText).filter(t => /Traceback|Cell In\[\d+\]/.test(t))""")
            assert not errors, "a cell failed in JupyterLab:\n" + "\n".join(errors)[-3000:]
            ex.wait_for()
            t_run = time.perf_counter() - t0
            out = ex.locator(".widget-html-content").first
            page.wait_for_function("e => e.innerText.includes('0xDCEA')", arg=out.element_handle())
            assert "-314.5" in out.inner_text()
            # the bits are coloured by field (ipywidgets 8 Button honours style.button_color)
            for field, colour in widgets.FIELD_COLORS.items():
                bg = ex.locator(f".mpt-bit-{field}").first.evaluate("e => getComputedStyle(e).backgroundColor")
                rgb = "rgb({}, {}, {})".format(*(int(colour[i : i + 2], 16) for i in (1, 3, 5)))
                assert bg == rgb, (field, bg, rgb)
            assert ex.locator("button.mpt-bit-15").inner_text().strip() == "0"
            ex.locator("button.mpt-bit-15").click()  # the last mantissa bit: -314.5 -> -314.75
            page.wait_for_function("e => e.innerText.includes('0xDCEB')", arg=out.element_handle())
            assert "-314.75" in out.inner_text() and "2^(23 − 15)" in out.inner_text()
            assert ex.locator("button.mpt-bit-15").inner_text().strip() == "1"
            assert ex.locator("input[type='text']").first.input_value() == "-314.75"  # the value box follows
            b.screenshot(page, "jupyterlab_bit_explorer")
            errors = [c for c in b.console if "mpt" in c.lower() or "widget" in c.lower()]
            assert not errors, errors
            assert not b.blocked, f"JupyterLab asked the network for: {b.blocked}"
    finally:
        lab.stop()
    print(
        f"\n[jupyterlab] server up in {startup:.1f} s, notebook open at {t_open:.1f} s, {idx + 1} cells run "
        f"and the explorer shown at {t_run:.1f} s, bit clicked and read back; {time.perf_counter() - t0:.1f} s "
        f"in all; blocked requests: {b.blocked}"
    )
    assert lab.proc.returncode is not None
