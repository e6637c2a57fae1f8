"""Sphinx extension of the book build (Jupyter Book loads it through ``sphinx: local_extensions`` in _config.yml).

What it does:

* The build executes every notebook with Jupyter kernels started from this process, so the environment set
  here is theirs: ``MPT_LAB_PROGRESS=0`` switches off tqdm progress bars (a rendered page would show an empty
  widget or a stray text bar) and makes each experiment print one line of timing instead
  (:func:`mpt_lab.harness.runner.progress_enabled`).  Live notebooks keep their bars.
* Notebooks execute in parallel.  Jupyter Book 1 executes one notebook after another (its command line has no
  ``-j``), which leaves one of two cores idle for the whole build.  Before Sphinx reads the pages, this extension
  executes the notebooks that the execution cache does not hold yet, ``MPT_LAB_BOOK_JOBS`` at a time (default:
  the number of CPU cores, at most 4), longest first (by the last saved ``book/results/book_build_cpu.json``),
  with the same function and settings that myst-nb's cache mode uses (``single_nb_execution``, the configured
  timeout and ``allow_errors``), and stores them in that cache; myst-nb then finds each notebook there, exactly
  as after an earlier build.  Each kernel gets ``OMP_NUM_THREADS=1`` when more than one runs (two kernels with
  two torch threads each on two cores slow each other down many times; a chapter that sets its own threads
  keeps them).  The log says, for every notebook, "<path>: Executed notebook in N seconds", as myst-nb does.
  ``MPT_LAB_BOOK_JOBS=1`` restores myst-nb's own one-by-one execution.
* The executed notebooks, outputs included, in ``_build/jupyter_execute/`` (myst-nb leaves them without outputs
  after a cache hit).
* One execution cache per profile: ``_build/.jupyter_cache/<MPT_LAB_PROFILE or "default">``, since the cache
  knows a notebook by its code only and would serve a quick build's outputs to a cpu one.
* Chapters link a citation to its entry on the bibliography page
  (``../book/bibliography.md#cite-KEY``): sphinxcontrib-bibtex gives each entry the id ``cite-KEY`` (``bibtex_cite_id``
  in _config.yml), but MyST resolves ``page.md#id`` only against the page's heading anchors and warns about any
  other id; :func:`_bibliography_anchors` registers the entries' ids as anchors of their page, so a link to an entry
  resolves and a link to an id that does not exist still warns (the build treats warnings as errors).
"""

from __future__ import annotations

import json
import os
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

from sphinx.util import logging

LOGGER = logging.getLogger(__name__)
ORDER_FILE = Path("book") / "results" / "book_build_cpu.json"


def _jobs() -> int:
    raw = os.environ.get("MPT_LAB_BOOK_JOBS", "").strip()
    if raw:
        try:
            n = int(raw)
        except ValueError:
            raise ValueError(f"MPT_LAB_BOOK_JOBS must be a positive integer, got {raw!r}") from None
        if n < 1:
            raise ValueError(f"MPT_LAB_BOOK_JOBS must be a positive integer, got {raw!r}")
        return n
    return max(1, min(4, os.cpu_count() or 1))


def _execute(path: str, timeout: int | None, allow_errors: bool, in_temp: bool) -> tuple[str, str, float, str | None]:
    """Run one notebook as myst-nb's cache mode runs it; returns (path, executed notebook JSON, seconds, error)."""
    import tempfile

    import nbformat
    from jupyter_cache.executors.utils import single_nb_execution

    nb = nbformat.read(path, as_version=4)
    with tempfile.TemporaryDirectory() as tmp:
        cwd = tmp if in_temp else str(Path(path).parent)
        result = single_nb_execution(nb, cwd=cwd, timeout=timeout, allow_errors=allow_errors, meta_override=True)
    error = None if result.err is None else (result.exc_string or repr(result.err))
    return path, nbformat.writes(result.nb), float(result.time), error


def _longest_first(paths: list[Path], srcdir: Path) -> list[Path]:
    try:
        seconds = json.loads((srcdir / ORDER_FILE).read_text()).get("notebook_seconds", {})
    except (OSError, ValueError):
        seconds = {}
    return sorted(paths, key=lambda p: (-float(seconds.get(p.stem, 0.0)), p.name))


def _execute_in_parallel(app, env, docnames) -> None:
    config = getattr(env, "mystnb_config", None)  # myst-nb's settings, its cache path resolved
    if config is None or config.execution_mode != "cache" or not config.execution_cache_path:
        return
    jobs = _jobs()
    if jobs < 2:
        return
    import nbformat
    from jupyter_cache import get_cache
    from jupyter_cache.base import CacheBundleIn

    cache = get_cache(config.execution_cache_path)
    srcdir = Path(app.srcdir)
    todo = []
    for docname in docnames:
        path = Path(env.doc2path(docname))
        if path.suffix != ".ipynb" or not path.exists():
            continue
        try:
            cache.match_cache_notebook(nbformat.read(str(path), as_version=4))
        except KeyError:
            todo.append(path)
    if len(todo) < 2:
        return
    todo = _longest_first(todo, srcdir)
    LOGGER.info(f"[mpt_book] executing {len(todo)} notebooks, {jobs} at a time")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    timeout = config.execution_timeout
    t0 = time.perf_counter()
    with ProcessPoolExecutor(max_workers=min(jobs, len(todo))) as pool:
        futures = [
            pool.submit(_execute, str(p), timeout, bool(config.execution_allow_errors), bool(config.execution_in_temp))
            for p in todo
        ]
        for future in as_completed(futures):
            path, text, seconds, error = future.result()
            rel = os.path.relpath(path, srcdir)
            if error is not None:  # left out of the cache: myst-nb runs it again and reports the error its way
                LOGGER.info(f"[mpt_book] {rel}: failed in {seconds:.2f} s; myst-nb reruns it")
                continue
            cache.add_nb_to_project(path)
            cache.cache_notebook_bundle(
                CacheBundleIn(nbformat.reads(text, as_version=4), path, data={"execution_seconds": seconds}),
                check_validity=False,
                overwrite=True,
            )
            LOGGER.info(f"{rel}: Executed notebook in {seconds:.2f} seconds")
    LOGGER.info(f"[mpt_book] {len(todo)} notebooks executed in {time.perf_counter() - t0:.0f} s")


def _cache_per_profile(app, config) -> None:
    """One execution cache per ``MPT_LAB_PROFILE`` (``_build/.jupyter_cache/<profile>``), so that a build in one
    profile never serves the outputs another profile computed (the cache keys a notebook by its code only)."""
    if getattr(config, "nb_execution_cache_path", None):
        return  # set by the book's configuration: leave it
    profile = os.environ.get("MPT_LAB_PROFILE", "").strip().lower() or "default"
    config.nb_execution_cache_path = str(Path(app.outdir).parent / ".jupyter_cache" / profile)


def _write_executed_notebooks(app, exception) -> None:
    """Write each executed notebook, outputs included, to ``_build/jupyter_execute/``.  myst-nb writes there the
    notebook as it read it, which holds the outputs only when it executed the notebook itself: after a cache hit
    (every notebook this extension ran, and every unchanged one on a rebuild) the file had none."""
    env = getattr(app, "env", None)
    config = getattr(env, "mystnb_config", None)
    if exception is not None or config is None or not config.execution_cache_path:
        return
    import nbformat
    from jupyter_cache import get_cache

    cache = get_cache(config.execution_cache_path)
    out = Path(config.output_folder)
    for docname in sorted(env.found_docs):
        path = Path(env.doc2path(docname))
        if path.suffix != ".ipynb" or not path.exists():
            continue
        try:
            _, merged = cache.merge_match_into_notebook(nbformat.read(str(path), as_version=4))
        except KeyError:
            continue  # not executed (excluded, or failed)
        target = out.joinpath(*(docname + ".ipynb").split("/"))
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(nbformat.writes(merged), encoding="utf8")


def _bibliography_anchors(app, doctree):
    """Register every bibliography entry's id ("cite-…") as a MyST anchor of the page that holds it."""
    ids = [i for i in doctree.ids if i.startswith("cite-")]
    if ids:
        anchors = app.env.metadata[app.env.docname].setdefault("myst_slugs", {})
        for i in ids:
            anchors.setdefault(i, (0, i, i))


def setup(app):
    os.environ.setdefault("MPT_LAB_PROGRESS", "0")
    app.connect("config-inited", _cache_per_profile)
    app.connect("env-before-read-docs", _execute_in_parallel)
    app.connect("doctree-read", _bibliography_anchors)
    app.connect("build-finished", _write_executed_notebooks)
    return {"version": "1.2", "parallel_read_safe": True, "parallel_write_safe": True}
