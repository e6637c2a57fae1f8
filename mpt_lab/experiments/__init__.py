"""One module per reproduced result: ``run(config) -> result`` (a dataclass that saves to and loads from JSON)
and a CLI, ``python -m mpt_lab.experiments.NAME --profile full --out book/results/NAME_full.json``.

* :mod:`mpt_lab.experiments.ssd_histogram`: the paper's Figure 2, activation and weight gradients of an
  SSD-style detector trained in FP32.
* :mod:`mpt_lab.experiments.loss_scaling`: dynamic loss scaling on a real FP16 run, ours beside torch's.
* :mod:`mpt_lab.experiments.master_weights_stall`: pure FP16 weights against FP32 master weights (§3.1).
* :mod:`mpt_lab.experiments.amp_recipe`: the PyTorch AMP recipe timed in FP32, FP16 and BF16.
* :mod:`mpt_lab.experiments.memory_tradeoffs`: activation checkpointing against lower precision, measured.
* :mod:`mpt_lab.experiments.biglstm`: the paper's Figure 1, a bigLSTM-shaped language model in FP32 and in
  FP16 mixed precision without and with loss scaling.
* :mod:`mpt_lab.experiments.ssd_table2`: the paper's Table 2 for SSD, the same three ways on the detector.
* :mod:`mpt_lab.experiments.message_passing`: DGL's float16 message-passing examples in PyG and PyTorch.
* :mod:`mpt_lab.experiments.gat_amp`: DGL's GAT trained in FP32, FP16 autocast + GradScaler, and BF16.
"""

from ._common import find_result, load_json, results_dir, save_json

__all__ = ["save_json", "load_json", "results_dir", "find_result"]
