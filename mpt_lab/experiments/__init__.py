"""One module per reproduced result, all run by one runner (:mod:`mpt_lab.harness.runner`).

This package holds result modules only: the machinery that runs them (runner, command line, priority table, GPU
slot, torchrun launch, benchmark base, GPU preflight) is the floor below, :mod:`mpt_lab.harness`, and the
functions two experiments share live on the floor they belong to (``ARCHITECTURE.md``).  No experiment imports
another.

Each module ``mpt_lab.experiments.NAME`` has ``Config``, its profiles as data (``PROFILES``), a Result
dataclass, ``run(config) -> Result``, ``config_for(profile)`` and a CLI::

    python -m mpt_lab.experiments.NAME --profile full --out book/results/NAME_full.json [--set key=value]
    python -m mpt_lab.experiments.NAME --smoke --out /tmp/NAME_smoke.json     # the full profile, cut short
    python -m mpt_lab.experiments --list
    python -m mpt_lab.experiments --all --profile full --budget 480 --out DIR   # priority order, 8 minutes
    python -m mpt_lab.experiments --unpack mpt_lab_gpu_slot.tar.gz            # a GPU slot's results

The full profile of every experiment fits, all together, one GPU slot of 8 minutes on one H100:
:mod:`mpt_lab.harness.budget` holds the priority table (what each full result is for, its expected
seconds and how they were estimated), ``benchmarks/gpu_slot.sh`` runs the slot and :mod:`mpt_lab.harness.slot`
packs and unpacks its results.  This package is the harness's :class:`~mpt_lab.harness.runner.Catalogue`: it hands
:data:`NAMES` and :func:`get` to the command line (``python -m mpt_lab.experiments``, :mod:`mpt_lab.harness.cli`).

* ``ssd_histogram``: the SSD histogram (the paper's Figure 3, NVIDIA's blog post's Figure 2), activation and weight gradients of an SSD-style detector in FP32.
* ``gradient_factors``: what moves the detector's activation gradients toward SSD's, one factor at a time.
* ``loss_scaling``: dynamic loss scaling on a real FP16 run, ours beside torch's.
* ``master_weights_stall``: pure FP16 weights against FP32 master weights (the paper's §3.1).
* ``amp_recipe``: the PyTorch AMP recipe timed in FP32, FP16 and BF16.
* ``memory_tradeoffs``: activation checkpointing against lower precision, measured.
* ``lm_gradient_scale``: where a language model's activation gradients lie against its vocabulary and batch.
* ``biglstm``: the paper's bigLSTM result, a bigLSTM-shaped language model in FP32 and FP16 mixed precision.
* ``ssd_table2``: the paper's Table 2 for SSD, the same comparison on the detector.
* ``message_passing``: the DGL User Guide's float16 message-passing examples in PyG and PyTorch.
* ``gat_amp``: the DGL User Guide's GAT in FP32, FP16 autocast + GradScaler, and BF16.
* ``distributed``: DDP and FSDP2 under torchrun: reduction dtypes, compression hooks, sharded loss scaling.
* ``accumulation_error``: dot products against K in FP16, BF16 and FP32 accumulators, a tensor core's narrow FP8
  accumulator (DeepSeek-V3's ~14 bits), and reductions in an FP16 accumulator.
* ``accumulation_training``: a model trained with FP16- against FP32-accumulated products, and BF16 weights
  with Kahan compensation beside stochastic rounding and FP32 master weights.
* ``tensor_core_accumulation``: a GPU's FP16 and FP8 matrix products against the exact prediction of each
  accumulator model, error against K.
* ``fp8_recipes``: a small transformer and the digits MLP trained in FP32, BF16, FP16, FP8 (unscaled, current,
  delayed), MXFP8/6/4, NVFP4 and BF16 weights with stochastic rounding.
* ``fourbit_ablation``: NVIDIA's NVFP4 training recipe on a small transformer, ingredient by ingredient (BF16,
  FP8, MXFP4, NVFP4 and the recipe less one ingredient at a time, over seeds), and what each ingredient fixes.
"""

from __future__ import annotations

import importlib

from ..harness.runner import (
    REGISTRY,
    RUN_PROFILES,
    Experiment,
    ExperimentConfig,
    ExperimentResult,
    load_json,
    result_path,
    results_dir,
    save_json,
)

#: The experiments, in the order of the book's chapters.
NAMES = (
    "ssd_histogram",
    "gradient_factors",
    "loss_scaling",
    "master_weights_stall",
    "amp_recipe",
    "memory_tradeoffs",
    "lm_gradient_scale",
    "biglstm",
    "ssd_table2",
    "message_passing",
    "gat_amp",
    "distributed",
    "fp8_recipes",
    "accumulation_error",
    "accumulation_training",
    "tensor_core_accumulation",
    "fourbit_ablation",
)


def get(name: str) -> Experiment:
    """The :class:`~mpt_lab.harness.runner.Experiment` called ``name`` (imports its module: the harness's
    :class:`~mpt_lab.harness.runner.Catalogue` loads an experiment through this).

    Raises ValueError for a name that is not in :data:`NAMES`.
    """
    if name not in NAMES:
        raise ValueError(f"name must be one of {NAMES}, got {name!r}")
    importlib.import_module(f"{__name__}.{name}")
    return REGISTRY[name]


def saved(name: str, profile: str = "full") -> ExperimentResult | None:
    """The saved result ``book/results/NAME_PROFILE.json`` of experiment ``name``, or None."""
    return get(name).saved(profile)


__all__ = [
    "NAMES",
    "RUN_PROFILES",
    "get",
    "saved",
    "Experiment",
    "ExperimentConfig",
    "ExperimentResult",
    "save_json",
    "load_json",
    "results_dir",
    "result_path",
]
