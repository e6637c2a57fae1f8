"""Sphinx extension of the book build (Jupyter Book loads it through ``sphinx: local_extensions`` in _config.yml).

The book build executes every notebook with Jupyter kernels started from this process, so the environment set
here is theirs: ``MPT_LAB_PROGRESS=0`` switches off tqdm progress bars (a rendered page would show an empty
widget or a stray text bar) and makes each experiment print one line of timing instead
(:func:`mpt_lab.experiments.runner.progress_enabled`).  Live notebooks keep their bars.
"""

import os


def setup(app):
    os.environ.setdefault("MPT_LAB_PROGRESS", "0")
    return {"version": "1.0", "parallel_read_safe": True, "parallel_write_safe": True}
