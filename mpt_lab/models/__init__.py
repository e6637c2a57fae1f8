"""The book's small real models.

* :mod:`mpt_lab.models.ssd`: an SSD-style detector (Liu et al., ECCV 2016) with :class:`MultiBoxLoss`,
  :func:`detect` and :func:`train_step`: the model of the SSD activation-gradient histogram (the paper's Figure 3, the blog post's Figure 2).
* :mod:`mpt_lab.models.box_ops`: IoU, box conversions, SSD box encoding, NMS, in plain torch.
* :mod:`mpt_lab.models.detection_eval`: mAP by pycocotools' ``COCOeval``, :func:`evaluate_detector`.
* :mod:`mpt_lab.models.mlp`: :func:`digits_mlp`, the digit classifier of the small experiments.
* :mod:`mpt_lab.models.resnet`: a small ResNet for the memory chapter.
* :mod:`mpt_lab.models.lstm`: a word-level LSTM language model with projections shaped like bigLSTM
  (Jozefowicz et al. 2016), the model of the paper's Figure 1.
* :mod:`mpt_lab.models.transformer`: :class:`CharTransformerLM`, a small character-level transformer
  language model (the FP8 and block-scaling runs of chapter 10).
* :mod:`mpt_lab.models.gat`: the DGL User Guide's 3-layer GAT (Veličković et al. 2018) on PyTorch Geometric (imported on its own:
  ``from mpt_lab.models.gat import GAT``, so that importing this package does not import PyG).
"""

from . import box_ops
from .detection_eval import MAP_EVALUATOR, evaluate_detector, mean_average_precision
from .lstm import LSTMLanguageModel, build_lstm_lm
from .mlp import digits_mlp
from .ssd import (
    CONFIGS,
    SSD,
    L2Norm,
    MultiBoxLoss,
    build_ssd,
    default_boxes,
    detect,
    make_optimizer,
    match,
    match_batch,
    train_step,
)
from .transformer import CharTransformerLM

__all__ = [
    "LSTMLanguageModel",
    "build_lstm_lm",
    "CharTransformerLM",
    "SSD",
    "CONFIGS",
    "build_ssd",
    "L2Norm",
    "MultiBoxLoss",
    "default_boxes",
    "match",
    "match_batch",
    "detect",
    "make_optimizer",
    "train_step",
    "mean_average_precision",
    "MAP_EVALUATOR",
    "evaluate_detector",
    "digits_mlp",
    "box_ops",
]
