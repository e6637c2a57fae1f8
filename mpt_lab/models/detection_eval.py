"""Detection evaluation: Pascal VOC-style average precision and its mean over classes (mAP).

The metric of SSD's Pascal VOC results (Liu et al., ECCV 2016, §3.2; Everingham et al., IJCV 2010) and of the
detection rows of Micikevicius et al., ICLR 2018, Table 2.
"""

from __future__ import annotations

import math

import torch

from .box_ops import box_iou

__all__ = ["mean_average_precision", "average_precision", "evaluate_detector", "box_iou"]


def average_precision(recall: torch.Tensor, precision: torch.Tensor) -> float:
    """Area under the all-point interpolated precision-recall curve (VOC 2010 onwards).

    The precision envelope ``p_interp(r) = max_{r' >= r} p(r')`` integrated over recall:
    ``AP = sum_i (r_i - r_{i-1}) p_interp(r_i)`` with ``r_0 = 0``.

    Parameters
    ----------
    recall, precision : torch.Tensor, float, ``[K]``: recall and precision after each of the ``K`` ranked
        detections (recall non-decreasing).

    Returns
    -------
    float in ``[0, 1]``; 0 for ``K = 0``.

    Raises
    ------
    TypeError, ValueError
        Not 1-D float tensors of equal length.
    """
    for name, v in (("recall", recall), ("precision", precision)):
        if not isinstance(v, torch.Tensor) or not v.is_floating_point():
            raise TypeError(f"{name} must be a float torch.Tensor [K]")
        if v.ndim != 1:
            raise ValueError(f"{name} must be 1-D, got shape {tuple(v.shape)}")
    if recall.shape != precision.shape:
        raise ValueError(f"recall and precision must have equal shapes, got {tuple(recall.shape)} and "
                         f"{tuple(precision.shape)}")
    if recall.numel() == 0:
        return 0.0
    r = torch.cat([recall.new_zeros(1), recall.double()])
    p = torch.cat([precision.double(), precision.new_zeros(1).double()])
    # envelope: running max from the right
    p_env = torch.flip(torch.cummax(torch.flip(p, [0]), dim=0).values, [0])[:-1]
    return float(((r[1:] - r[:-1]) * p_env).sum())


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
                raise ValueError(f"{name}: {k!r} has shape {tuple(v.shape)}; expected boxes [n, 4] and "
                                 f"{', '.join(kk for kk in keys if kk != 'boxes')} [n]")
        if d["labels"].is_floating_point():
            raise TypeError(f"{name}: 'labels' must be an integer tensor")


def mean_average_precision(detections, ground_truths, iou_threshold: float = 0.5,
                           num_classes: int | None = None) -> dict:
    """VOC-style mAP@``iou_threshold`` of a detector's output on a data set.

    Per class: all detections of that class over all images, by descending score (ties: image order, then
    order within the image); each is a true positive when its best-overlapping ground truth of the same class
    in the same image has IoU ``>= iou_threshold`` and was not matched by a higher-scored detection, and a
    false positive otherwise (so duplicates of a found object are false positives, as in the VOC devkit).
    AP is the area under the all-point interpolated precision envelope (:func:`average_precision`); mAP is
    the mean over the classes that have at least one ground-truth box (classes without ground truth are left
    out, as are their detections).

    Parameters
    ----------
    detections : list of ``N`` dicts (one per image): ``"boxes"`` float ``[K, 4]`` xyxy, ``"scores"`` float
        ``[K]``, ``"labels"`` int ``[K]`` (the output of :func:`mpt_lab.models.ssd.detect`).
    ground_truths : list of ``N`` dicts: ``"boxes"`` float ``[G, 4]`` xyxy in the same unit, ``"labels"`` int
        ``[G]``.
    iou_threshold : float in ``(0, 1]``, 0.5 for VOC.
    num_classes : int or None: the number of classes *including* background 0, as for the detector (11 for the
        digits); labels must lie in ``1 .. num_classes - 1``.  None: no range check.

    Returns
    -------
    dict with ``"mAP"`` (float; NaN when no class has ground truth), ``"ap"`` ({label: AP} for every label with
    ground truth), ``"num_ground_truth"`` ({label: count}) and ``"iou_threshold"``.

    Raises
    ------
    TypeError, ValueError
        Malformed lists (the message names the argument), different lengths, labels out of range.
    """
    _check_list(detections, "detections", ("boxes", "scores", "labels"))
    _check_list(ground_truths, "ground_truths", ("boxes", "labels"))
    if len(detections) != len(ground_truths):
        raise ValueError(f"detections and ground_truths must have one entry per image, got {len(detections)} "
                         f"and {len(ground_truths)}")
    if isinstance(iou_threshold, bool) or not isinstance(iou_threshold, (int, float)):
        raise TypeError(f"iou_threshold must be a float, got {type(iou_threshold).__name__}")
    if not 0 < iou_threshold <= 1:
        raise ValueError(f"iou_threshold must lie in (0, 1], got {iou_threshold}")
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

    # For every detection: the IoU with, and the (data-set-wide) id of, its best ground truth of the same
    # class in the same image.  Greedy matching then only needs the global score order: a detection is a true
    # positive iff its best IoU >= threshold and it is the first such detection of that ground truth.
    det_scores, det_labels, det_best_iou, det_best_gt = [], [], [], []
    gt_offset = 0
    for d, g in zip(detections, ground_truths):
        k, n = d["boxes"].shape[0], g["boxes"].shape[0]
        if k:
            labels = d["labels"].cpu().long()
            if n:
                iou = box_iou(d["boxes"].double().cpu(), g["boxes"].double().cpu())  # [k, n]
                same = labels[:, None] == g["labels"].cpu().long()[None, :]
                iou = torch.where(same, iou, torch.full_like(iou, -1.0))
                best_iou, best = iou.max(dim=1)
            else:
                best_iou, best = torch.full((k,), -1.0, dtype=torch.float64), torch.zeros(k, dtype=torch.int64)
            det_scores.append(d["scores"].double().cpu())
            det_labels.append(labels)
            det_best_iou.append(best_iou)
            det_best_gt.append(best + gt_offset)
        gt_offset += n
    if det_scores:
        scores_t, labels_t = torch.cat(det_scores), torch.cat(det_labels)
        best_iou_t, best_gt_t = torch.cat(det_best_iou), torch.cat(det_best_gt)
    else:
        scores_t = best_iou_t = torch.zeros(0, dtype=torch.float64)
        labels_t = best_gt_t = torch.zeros(0, dtype=torch.int64)

    aps: dict[int, float] = {}
    for c in sorted(gt_counts):
        m = labels_t == c
        if not m.any():
            aps[c] = 0.0
            continue
        order = torch.sort(scores_t[m], descending=True, stable=True).indices  # ties: image order, then index
        hit = (best_iou_t[m][order] >= iou_threshold)
        gt_id = torch.where(hit, best_gt_t[m][order], torch.full_like(order, -1))
        tp = torch.zeros(order.numel(), dtype=torch.float64)
        if hit.any():
            ids = gt_id[hit]
            pos = torch.nonzero(hit).flatten()
            # first occurrence (in score order) of each ground-truth id among the hits
            uniq, inverse = torch.unique(ids, return_inverse=True)
            first = torch.full((uniq.numel(),), ids.numel(), dtype=torch.int64)
            first.scatter_reduce_(0, inverse, torch.arange(ids.numel()), reduce="amin")
            tp[pos[first]] = 1.0
        ctp = torch.cumsum(tp, 0)
        recall = ctp / gt_counts[c]
        precision = ctp / torch.arange(1, order.numel() + 1, dtype=torch.float64)
        aps[c] = average_precision(recall, precision)
    m_ap = sum(aps.values()) / len(aps) if aps else math.nan
    return {"mAP": m_ap, "ap": aps, "num_ground_truth": dict(sorted(gt_counts.items())),
            "iou_threshold": float(iou_threshold)}


def evaluate_detector(model, data, *, batch_size: int = 100, device=None, iou_threshold: float = 0.5) -> float:
    """mAP@``iou_threshold`` (0 to 1) of a detector on a whole data set, in batches.

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
