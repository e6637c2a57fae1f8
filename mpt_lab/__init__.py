"""mpt_lab: the code behind the Mixed Precision Training Lab book.

Everything the book shows is computed here.  Modules (one job each):

* :mod:`mpt_lab.formats`: floating-point formats (FP64 … FP4, E8M0), exact rounding, bits.
* :mod:`mpt_lab.histogram`: log2 histograms of tensors and the gradient recorder (the paper's Figure 2).
* :mod:`mpt_lab.scaling`: loss scalers, ``GradScaler`` (torch.amp's contract) and ``StaticLossScaler``.
* :mod:`mpt_lab.models`, :mod:`mpt_lab.data`: the small real models and their data.
* :mod:`mpt_lab.experiments`: one module per reproduced result, ``run(config) -> result`` and a CLI.
* :mod:`mpt_lab.device`: which device to run on and a one-line description for result provenance.
* :mod:`mpt_lab.bench`: timing that can be trusted (warm-up, synchronisation, median of repeats).
* :mod:`mpt_lab.plots`: the book's figures.
* :mod:`mpt_lab.widgets`: the interactive bit explorer and static tables.
* :mod:`mpt_lab.exercises`: checks for the exercises at the end of each chapter.
"""

from __future__ import annotations

import os

__version__ = "0.1.0"

PROFILES = ("quick", "cpu", "full")


def profile() -> str:
    """The run profile: ``"quick"`` (CI, seconds), ``"cpu"`` (a laptop, minutes) or ``"full"`` (a GPU).

    Read from the environment variable ``MPT_LAB_PROFILE``; when it is unset or empty, ``"full"`` on a
    machine with CUDA and ``"cpu"`` without.

    Raises
    ------
    ValueError
        ``MPT_LAB_PROFILE`` holds anything other than quick, cpu or full.
    """
    value = os.environ.get("MPT_LAB_PROFILE", "").strip().lower()
    if value:
        if value not in PROFILES:
            raise ValueError(f"MPT_LAB_PROFILE must be one of {PROFILES}, got {value!r}")
        return value
    import torch

    return "full" if torch.cuda.is_available() else "cpu"


__all__ = ["profile", "PROFILES", "__version__"]
