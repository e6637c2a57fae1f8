"""Sphinx extension of the book build (Jupyter Book loads it through ``sphinx: local_extensions`` in _config.yml).

The book build executes every notebook with Jupyter kernels started from this process, so the environment set
here is theirs: ``MPT_LAB_PROGRESS=0`` switches off tqdm progress bars (a rendered page would show an empty
widget or a stray text bar) and makes each experiment print one line of timing instead
(:func:`mpt_lab.experiments.runner.progress_enabled`).  Live notebooks keep their bars.

It also lets the chapters link a citation to its entry on the bibliography page
(``../book/bibliography.md#cite-KEY``): sphinxcontrib-bibtex gives each entry the id ``cite-KEY`` (``bibtex_cite_id``
in _config.yml), but MyST resolves ``page.md#id`` only against the page's heading anchors and warns about any
other id; :func:`_bibliography_anchors` registers the entries' ids as anchors of their page, so a link to an entry
resolves and a link to an id that does not exist still warns (the build treats warnings as errors).
"""

import os


def _bibliography_anchors(app, doctree):
    """Register every bibliography entry's id ("cite-…") as a MyST anchor of the page that holds it."""
    ids = [i for i in doctree.ids if i.startswith("cite-")]
    if ids:
        anchors = app.env.metadata[app.env.docname].setdefault("myst_slugs", {})
        for i in ids:
            anchors.setdefault(i, (0, i, i))


def setup(app):
    os.environ.setdefault("MPT_LAB_PROGRESS", "0")
    app.connect("doctree-read", _bibliography_anchors)
    return {"version": "1.0", "parallel_read_safe": True, "parallel_write_safe": True}
