"""Detection evaluation: mean average precision (mAP) at one IoU threshold, by pycocotools' ``COCOeval``.

The metric of SSD's results (Liu et al., ECCV 2016, §3) and of the detection rows of Micikevicius et al.,
ICLR 2018, Table 2 is the mean over classes of the average precision at IoU 0.5.  It is computed by the COCO
project's own evaluator (``pycocotools.cocoeval.COCOeval``, bounding boxes), not by code of this package:
:func:`mean_average_precision` only converts the boxes into COCO's format, runs ``COCOeval`` at the one IoU
threshold asked for, over all box sizes, and reads its precision table.

What COCOeval computes (pycocotools ``cocoeval.py``, ``evaluateImg`` and ``accumulate``): per image and class
the detections, best score first, are matched greedily to the ground truth of that class with the highest IoU
≥ the threshold among those not matched yet (a second detection of a found object is a false positive); per
class, over all images, precision is made monotone (the running maximum from the right) and sampled at the 101
recall points 0, 0.01, …, 1 (a point beyond the largest recall reached counts 0); AP is the mean of the 101
samples, and mAP the mean over the classes that have ground truth.  This 101-point interpolation differs a
little from Pascal VOC's all-point area (VOC 2010 onwards); results saved before this package used
pycocotools were made with its own VOC all-point code and say so (:data:`LEGACY_MAP_EVALUATOR`).
"""

from __future__ import annotations

import contextlib
import io
import math
from collections.abc import Sequence
from importlib.metadata import PackageNotFoundError, version
from typing import Any

import numpy as np
import torch

__all__ = ["mean_average_precision", "evaluate_detector", "MAP_EVALUATOR", "LEGACY_MAP_EVALUATOR"]

try:
    _PYCOCOTOOLS = version("pycocotools")
except PackageNotFoundError:  # importing mpt_lab.models must not need it; computing an mAP does
    _PYCOCOTOOLS = "(not installed)"

#: The evaluator of every mAP this package computes: recorded in each result that reports mAP.
MAP_EVALUATOR = f"pycocotools {_PYCOCOTOOLS} COCOeval (AP at one IoU, 101 recall points, all areas)"
#: The evaluator of results saved before the switch to pycocotools: a result that carries no evaluator field
#: (``map_evaluator``) was made by it, and says so.
LEGACY_MAP_EVALUATOR = "mpt_lab's earlier VOC all-point AP"


def _check_list(x, name: str, keys: tuple[str, ...]):
    if not isinstance(x, (list, tuple)):
        raise TypeError(f"{name} must be a list of dicts (one per image), got {type(x).__name__}")
    for d in x:
        if not isinstance(d, dict) or any(k not in d for k in keys):
            raise TypeError(f"{name} must hold dicts with keys {keys}")
        n = d["boxes"].shape[0] if isinstance(d["boxes"], torch.Tensor) else None
        for k in keys:
            v = d[k]
            if not isinstance(v, torch.Tensor):
                raise TypeError(f"{name}: {k!r} must be a torch.Tensor, got {type(v).__name__}")
            shape_ok = (v.ndim == 2 and v.shape[1] == 4) if k == "boxes" else v.ndim == 1
            if not shape_ok or v.shape[0] != n:
                raise ValueError(
                    f"{name}: {k!r} has shape {tuple(v.shape)}; expected boxes [n, 4] and "
                    f"{', '.join(kk for kk in keys if kk != 'boxes')} [n]"
                )
        if d["labels"].is_floating_point():
            raise TypeError(f"{name}: 'labels' must be an integer tensor")
        if not bool((d["boxes"][:, 2:] >= d["boxes"][:, :2]).all()):  # COCOeval would ignore such boxes
            raise ValueError(f"{name}: 'boxes' must be xyxy with x2 ≥ x1 and y2 ≥ y1 (no inverted boxes)")


def _coco(images: list, categories: list, annotations: list):
    """A pycocotools ``COCO`` object made from lists in memory (no file)."""
    from pycocotools.coco import COCO

    c = COCO()
    c.dataset = {"images": images, "categories": categories, "annotations": annotations}
    with contextlib.redirect_stdout(io.StringIO()):  # createIndex prints progress
        c.createIndex()
    return c


def _annotations(items: list, with_scores: bool) -> list:
    """COCO annotations (xywh boxes, ids from 1) of the per-image dicts ``items``."""
    out = []
    for image_id, d in enumerate(items, start=1):
        boxes = d["boxes"].detach().double().cpu()
        xywh = torch.cat([boxes[:, :2], boxes[:, 2:] - boxes[:, :2]], 1).tolist()
        scores = d["scores"].detach().double().cpu().tolist() if with_scores else [None] * len(xywh)
        for box, label, score in zip(xywh, d["labels"].cpu().tolist(), scores):
            a = {
                "id": len(out) + 1,
                "image_id": image_id,
                "category_id": int(label),
                "bbox": box,
                "area": box[2] * box[3],
                "iscrowd": 0,
            }
            if with_scores:
                a["score"] = score
            out.append(a)
    return out


def mean_average_precision(
    detections: Sequence[dict[str, torch.Tensor]],
    ground_truths: Sequence[dict[str, torch.Tensor]],
    iou_threshold: float = 0.5,
    num_classes: int | None = None,
    *,
    max_detections: int = 100,
) -> dict:
    """mAP at ``iou_threshold`` of a detector's output on a data set, by pycocotools' ``COCOeval``.

    ``COCOeval`` (bounding boxes) with ``iouThrs = [iou_threshold]``, one area range holding every box, and
    ``maxDets = [max_detections]`` (COCO's 100); see the module docstring for what it computes.  Classes
    without ground truth are left out of the mean (COCOeval gives them no precision), as are their detections.

    Parameters
    ----------
    detections : list of ``N`` dicts (one per image): ``"boxes"`` float ``[K, 4]`` xyxy, ``"scores"`` float
        ``[K]``, ``"labels"`` int ``[K]`` (the output of :func:`mpt_lab.models.ssd.detect`).
    ground_truths : list of ``N`` dicts: ``"boxes"`` float ``[G, 4]`` xyxy in the same unit, ``"labels"`` int
        ``[G]``.
    iou_threshold : float in ``(0, 1]``, 0.5 for Pascal VOC and the paper's Table 2.
    num_classes : int or None: the number of classes *including* background 0, as for the detector (11 for the
        digits); labels must lie in ``1 .. num_classes - 1``.  None: no range check.
    max_detections : int ≥ 1, the best-scored detections per image that count (COCO's ``maxDets``).

    Returns
    -------
    dict with ``"mAP"`` (float in [0, 1]; NaN when no class has ground truth), ``"ap"`` ({label: AP} for every
    label with ground truth), ``"num_ground_truth"`` ({label: count}), ``"iou_threshold"`` and
    ``"evaluator"`` (:data:`MAP_EVALUATOR`).

    Raises
    ------
    TypeError, ValueError
        Malformed lists (the message names the argument), different lengths, labels out of range, inverted
        boxes (x2 < x1 or y2 < y1), a bad ``iou_threshold`` or ``max_detections``.
    """
    try:
        from pycocotools.cocoeval import COCOeval
    except ImportError as err:
        raise ImportError(
            "mean_average_precision needs pycocotools (requirements.txt pins it: pip install pycocotools==2.0.11)"
        ) from err

    _check_list(detections, "detections", ("boxes", "scores", "labels"))
    _check_list(ground_truths, "ground_truths", ("boxes", "labels"))
    if len(detections) != len(ground_truths):
        raise ValueError(
            f"detections and ground_truths must have one entry per image, got {len(detections)} "
            f"and {len(ground_truths)}"
        )
    if isinstance(iou_threshold, bool) or not isinstance(iou_threshold, (int, float)):
        raise TypeError(f"iou_threshold must be a float, got {type(iou_threshold).__name__}")
    if not 0 < iou_threshold <= 1:
        raise ValueError(f"iou_threshold must lie in (0, 1], got {iou_threshold}")
    if isinstance(max_detections, bool) or not isinstance(max_detections, int) or max_detections < 1:
        raise ValueError(f"max_detections must be an int ≥ 1, got {max_detections!r}")
    if num_classes is not None:
        if isinstance(num_classes, bool) or not isinstance(num_classes, int):
            raise TypeError(f"num_classes must be an int or None, got {type(num_classes).__name__}")
        if num_classes < 2:
            raise ValueError(f"num_classes must be >= 2 (background + one class), got {num_classes}")
        for name, lst in (("detections", detections), ("ground_truths", ground_truths)):
            for d in lst:
                lab = d["labels"]
                if lab.numel() and (int(lab.min()) < 1 or int(lab.max()) >= num_classes):
                    raise ValueError(f"{name}: labels must lie in 1 .. {num_classes - 1}, got {lab.tolist()}")

    gt_counts: dict[int, int] = {}
    for g in ground_truths:
        for c in g["labels"].tolist():
            gt_counts[c] = gt_counts.get(c, 0) + 1
    result = {
        "mAP": math.nan,
        "ap": {},
        "num_ground_truth": dict(sorted(gt_counts.items())),
        "iou_threshold": float(iou_threshold),
        "evaluator": MAP_EVALUATOR,
    }
    if not gt_counts:
        return result
    classes = sorted(gt_counts)
    images = [{"id": i} for i in range(1, len(ground_truths) + 1)]
    categories = [{"id": c} for c in classes]
    dets = [a for a in _annotations(detections, True) if a["category_id"] in gt_counts]
    ev = COCOeval(
        _coco(images, categories, _annotations(ground_truths, False)), _coco(images, categories, dets), iouType="bbox"
    )
    ev.params.iouThrs = np.array([float(iou_threshold)])
    ev.params.areaRng, ev.params.areaRngLbl = [[0.0, math.inf]], ["all"]
    ev.params.maxDets = [max_detections]
    with contextlib.redirect_stdout(io.StringIO()):  # evaluate and accumulate print progress
        ev.evaluate()
        ev.accumulate()
    precision = ev.eval["precision"][0, :, :, 0, 0]  # [recall points, classes]
    aps = {c: float(precision[:, k].mean()) for k, c in enumerate(ev.params.catIds)}
    result["ap"] = aps
    result["mAP"] = sum(aps.values()) / len(aps)
    return result


def evaluate_detector(
    model: torch.nn.Module,
    data: Any,
    *,
    batch_size: int = 100,
    device: torch.device | str | None = None,
    iou_threshold: float = 0.5,
) -> float:
    """mAP at ``iou_threshold`` (0 to 1) of a detector on a whole data set, in batches (by :data:`MAP_EVALUATOR`).

    Parameters
    ----------
    model : a detector with ``predict(images) -> list of detection dicts`` and ``num_classes`` (e.g.
        :class:`mpt_lab.models.ssd.SSD`; it runs in eval mode and its training mode is restored)
    data : a data set with ``len(data)`` and ``batch(indices) -> (images [B, C, H, W], targets)`` (e.g.
        :class:`mpt_lab.data.DigitsDetection`)
    batch_size : images per forward pass
    device : where the model is (images are moved there); default the device of its first parameter

    Returns
    -------
    float, :func:`mean_average_precision`'s "mAP".
    """
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be an int ≥ 1, got {batch_size!r}")
    if device is None:
        device = next(model.parameters()).device
    dets, gts = [], []
    for i in range(0, len(data), batch_size):
        images, targets = data.batch(range(i, min(i + batch_size, len(data))))
        out = model.predict(images.to(device))
        dets += [{k: v.cpu() for k, v in d.items()} for d in out]
        gts += targets
    return float(mean_average_precision(dets, gts, iou_threshold, num_classes=model.num_classes)["mAP"])
