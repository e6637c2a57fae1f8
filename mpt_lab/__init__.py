"""mpt_lab: the code behind the Mixed Precision Training Lab book.

Everything the book shows is computed here.  Modules (one job each; ``ARCHITECTURE.md`` draws the floors they stand
on, and what each may import):

* :mod:`mpt_lab.formats`: floating-point formats (FP64 … FP4, E8M0), exact rounding, bits.
* :mod:`mpt_lab.histogram`: log2 histograms of tensors and the gradient recorder (the SSD histogram: the paper's Figure 3, NVIDIA's blog post's Figure 2).
* :mod:`mpt_lab.scaling`: loss scalers, ``GradScaler`` (torch.amp's contract) and ``StaticLossScaler``.
* :mod:`mpt_lab.models`, :mod:`mpt_lab.data`: the small real models and their data.
* :mod:`mpt_lab.master_weights`: the FP32-master-weight loop (the paper's Figure 1, NVIDIA's guide), eight visible steps.
* :mod:`mpt_lab.accumulation`: dot products and matrix products with every product and addition rounded to a
  chosen accumulator (sequential, pairwise, blocked; Kahan), exact: the paper's third technique.
* :mod:`mpt_lab.simulate`: FP16/BF16/FP8 numerics at FP32 speed, for CPUs without fast FP16 kernels.
* :mod:`mpt_lab.microscaling`: scaled FP8/FP6/FP4 quantisation: per-tensor (current, delayed), OCP MX, NVFP4.
* :mod:`mpt_lab.quantized_training`: training through those quantisers: every ``nn.Linear``'s operands in FP8, MX
  or NVFP4 (emulated, or FP8 tensor cores where present), and BF16 weights with stochastic rounding.
* :mod:`mpt_lab.autocast`: which dtype each op runs in under ``torch.autocast``, probed on CPU and CUDA.
* :mod:`mpt_lab.recipes`: the precision recipe defined once (autocast, loss scaling, GEMM formats and scaling, weight
  storage, across processes, label and plot style) and the one registry of recipes.
* :mod:`mpt_lab.training`: the loop pieces every experiment shares (shuffled batches, a scaled step, accuracy,
  a recipe's training step).
* :mod:`mpt_lab.report`: ``precision_report(model, loss_fn, batch)``: what one training step of any PyTorch model
  would do in FP16, BF16 or FP8 (overflowing modules, first inf/NaN, loss-scale window, optimizer checks).
* :mod:`mpt_lab.harness`: the machinery every experiment runs on: the runner, the command line, the full profile's
  priority table, a GPU slot's archive, the GPU preflight.
* :mod:`mpt_lab.experiments`: one module per reproduced result, ``run(config) -> result``.
* :mod:`mpt_lab.figures`: the book's figures and tables by topic, and ``show_saved`` for GPU/long results.
* :mod:`mpt_lab.device`: which device to run on and a one-line description for result provenance.
* :mod:`mpt_lab.bench`: timing that can be trusted (warm-up, synchronisation, median of repeats).
* :mod:`mpt_lab.widgets`: the interactive bit explorer and static tables.
* :mod:`mpt_lab.exercises`: checks for the exercises at the end of each chapter.
"""

from __future__ import annotations

import importlib
import os

__version__ = "0.1.0"

#: The profiles :func:`profile` can return: the sizes of a live run (a notebook, a test).  Experiments also have
#: "long" (paper-like sizes that run in ≤ 60 minutes on 2 CPU cores, saved under book/results/), which is only
#: ever chosen explicitly on the command line (``python -m mpt_lab.experiments.NAME --profile long``): every
#: profile an experiment may define is :data:`mpt_lab.harness.runner.RUN_PROFILES`, and each experiment's own
#: ``PROFILES`` dict holds its Config values per profile.
LIVE_PROFILES = ("quick", "cpu", "full")


def profile() -> str:
    """The run profile: ``"quick"`` (CI, seconds), ``"cpu"`` (a laptop, minutes) or ``"full"`` (a GPU).

    Read from the environment variable ``MPT_LAB_PROFILE``; when it is unset or empty, ``"full"`` on a
    machine with CUDA and ``"cpu"`` without.  Never ``"long"``: that profile is chosen on the command line.

    Raises
    ------
    ValueError
        ``MPT_LAB_PROFILE`` holds anything other than quick, cpu or full.
    """
    value = os.environ.get("MPT_LAB_PROFILE", "").strip().lower()
    if value:
        if value == "long":
            raise ValueError(
                "MPT_LAB_PROFILE=long is not a notebook profile: long runs take up to an hour each "
                "and are run once from the command line (python -m mpt_lab.experiments.NAME "
                "--profile long --out book/results/NAME_long.json); chapters show the saved result"
            )
        if value not in LIVE_PROFILES:
            raise ValueError(f"MPT_LAB_PROFILE must be one of {LIVE_PROFILES}, got {value!r}")
        return value
    import torch

    return "full" if torch.cuda.is_available() else "cpu"


#: Submodules reachable as attributes without an explicit import (``mpt_lab.device.describe()``), imported on
#: first use so that ``import mpt_lab`` stays light (and ``mpt_lab.formats`` works without torch).
SUBMODULES = (
    "formats",
    "histogram",
    "scaling",
    "master_weights",
    "simulate",
    "microscaling",
    "quantized_training",
    "collectives",
    "autocast",
    "training",
    "report",
    "experiments",
    "figures",
    "device",
    "bench",
    "widgets",
    "exercises",
    "models",
    "data",
    "harness",
    "recipes",
)


def __getattr__(name: str):
    if name in SUBMODULES:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["profile", "LIVE_PROFILES", "SUBMODULES", "__version__"]
