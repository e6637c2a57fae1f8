"""Box operations for the SSD-style detector, in plain torch (no torchvision).

Conventions used throughout :mod:`mpt_lab.models`:

* ``xyxy``: ``(x_min, y_min, x_max, y_max)``; ``cxcywh``: ``(centre x, centre y, width, height)``.
* Coordinates are *normalised* to the image: ``[0, 1]`` on both axes (x = column / width, y = row / height),
  the convention of SSD (Liu et al., ECCV 2016).  The functions here do not depend on the unit: pixels work
  as well, as long as both arguments use the same one.
* A pixel ``(row r, column c)`` covers ``[c, c + 1) x [r, r + 1)`` in pixel units, so a box from column 3 to
  column 7 inclusive has ``x_min = 3`` and ``x_max = 8`` (in pixels; divide by the width to normalise).

Functions: :func:`box_area`, :func:`box_iou`, :func:`xyxy_to_cxcywh`, :func:`cxcywh_to_xyxy`,
:func:`encode`, :func:`decode`, :func:`nms`, :func:`nms_sorted_mask`, :func:`batched_nms`.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

__all__ = [
    "box_area",
    "box_iou",
    "xyxy_to_cxcywh",
    "cxcywh_to_xyxy",
    "encode",
    "decode",
    "nms",
    "nms_sorted_mask",
    "batched_nms",
    "DEFAULT_VARIANCES",
    "check_boxes",
    "check_variances",
]

#: The "variances" that scale SSD's box offsets: 0.1 for the centre, 0.2 for the log size (SSD's Caffe code).
DEFAULT_VARIANCES = (0.1, 0.2)


def check_boxes(x: torch.Tensor, name: str, *, ndim: int | None = None) -> torch.Tensor:
    """``x`` itself if it is a floating tensor of boxes, shape [..., 4] (exactly ``ndim`` dimensions when
    given); the functions here and :mod:`mpt_lab.models.ssd` check their box arguments with it.

    Raises TypeError (not a floating tensor) or ValueError (wrong shape), naming the argument ``name``.
    """
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor of boxes [..., 4], got {type(x).__name__}")
    if not x.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor, got dtype {x.dtype}")
    if x.ndim == 0 or x.shape[-1] != 4:
        raise ValueError(f"{name} must have shape [..., 4], got {tuple(x.shape)}")
    if ndim is not None and x.ndim != ndim:
        raise ValueError(f"{name} must have {ndim} dimensions ([N, 4]), got shape {tuple(x.shape)}")
    return x


def check_variances(variances: Sequence[float]) -> tuple[float, float]:
    """SSD's ``variances`` (centre, size) as a pair of positive floats (see :data:`DEFAULT_VARIANCES`).

    Raises TypeError (not a pair) or ValueError (not positive), naming ``variances``.
    """
    if not isinstance(variances, Sequence) or len(variances) != 2:
        raise TypeError(f"variances must be a pair of floats (centre, size), got {variances!r}")
    v = (float(variances[0]), float(variances[1]))
    if not (v[0] > 0 and v[1] > 0):
        raise ValueError(f"variances must be positive, got {variances!r}")
    return v


def box_area(boxes: torch.Tensor) -> torch.Tensor:
    """Area of ``xyxy`` boxes.

    Parameters
    ----------
    boxes : torch.Tensor, float, shape ``[..., 4]``, xyxy.

    Returns
    -------
    torch.Tensor, shape ``[...]``, same dtype; boxes with ``x_max < x_min`` or ``y_max < y_min`` have area 0.

    Raises
    ------
    TypeError, ValueError
        ``boxes`` is not a floating tensor with last dimension 4.
    """
    check_boxes(boxes, "boxes")
    w = (boxes[..., 2] - boxes[..., 0]).clamp(min=0)
    h = (boxes[..., 3] - boxes[..., 1]).clamp(min=0)
    return w * h


def box_iou(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Intersection over union (Jaccard overlap, SSD §2.2 "Matching strategy") of every pair of boxes.

    Parameters
    ----------
    a : torch.Tensor, float, shape ``[N, 4]``, xyxy.
    b : torch.Tensor, float, shape ``[M, 4]``, xyxy, same unit as ``a``.

    Returns
    -------
    torch.Tensor, shape ``[N, M]``, dtype of ``a`` and ``b`` promoted; ``iou[i, j] = |a_i ∩ b_j| / |a_i ∪ b_j|``
    in ``[0, 1]``.  A pair whose union has zero area (two degenerate boxes) has IoU 0.

    Raises
    ------
    TypeError
        ``a`` or ``b`` is not a floating-point tensor.
    ValueError
        ``a`` or ``b`` is not of shape ``[K, 4]``.
    """
    check_boxes(a, "a", ndim=2)
    check_boxes(b, "b", ndim=2)
    area_a = box_area(a)
    area_b = box_area(b)
    lt = torch.maximum(a[:, None, :2], b[None, :, :2])
    rb = torch.minimum(a[:, None, 2:], b[None, :, 2:])
    wh = (rb - lt).clamp(min=0)
    inter = wh[..., 0] * wh[..., 1]
    union = area_a[:, None] + area_b[None, :] - inter
    return torch.where(union > 0, inter / union.clamp(min=torch.finfo(union.dtype).tiny), torch.zeros_like(inter))


def xyxy_to_cxcywh(boxes: torch.Tensor) -> torch.Tensor:
    """Convert ``[..., 4]`` boxes from ``(x_min, y_min, x_max, y_max)`` to ``(cx, cy, w, h)`` (same unit).

    Raises TypeError/ValueError when ``boxes`` is not a floating tensor with last dimension 4.
    """
    check_boxes(boxes, "boxes")
    return torch.cat([(boxes[..., :2] + boxes[..., 2:]) / 2, boxes[..., 2:] - boxes[..., :2]], dim=-1)


def cxcywh_to_xyxy(boxes: torch.Tensor) -> torch.Tensor:
    """Convert ``[..., 4]`` boxes from ``(cx, cy, w, h)`` to ``(x_min, y_min, x_max, y_max)`` (same unit).

    Raises TypeError/ValueError when ``boxes`` is not a floating tensor with last dimension 4.
    """
    check_boxes(boxes, "boxes")
    return torch.cat([boxes[..., :2] - boxes[..., 2:] / 2, boxes[..., :2] + boxes[..., 2:] / 2], dim=-1)


def encode(boxes: torch.Tensor, priors: torch.Tensor, variances: Sequence[float] = DEFAULT_VARIANCES) -> torch.Tensor:
    """Encode ground-truth boxes as offsets from default (prior) boxes, SSD eq. (2) with variances.

    ``g = ((g_cx - d_cx) / (v0 d_w), (g_cy - d_cy) / (v0 d_h), log(g_w / d_w) / v1, log(g_h / d_h) / v1)``,
    the parametrisation of SSD §2.2 eq. (2) (from Faster R-CNN) with the variances ``(v0, v1)`` of SSD's code,
    which bring the targets to roughly unit scale.

    Parameters
    ----------
    boxes : torch.Tensor, float, shape ``[..., 4]``, xyxy (normalised), positive width and height.
    priors : torch.Tensor, float, shape ``[..., 4]`` broadcastable to ``boxes``, **cxcywh** (normalised).
    variances : pair of positive floats, default ``(0.1, 0.2)``.

    Returns
    -------
    torch.Tensor, shape ``[..., 4]``: the offsets ``(dx, dy, dw, dh)`` (dimensionless).

    Raises
    ------
    TypeError, ValueError
        Bad ``boxes``, ``priors`` or ``variances``.
    """
    check_boxes(boxes, "boxes")
    check_boxes(priors, "priors")
    v0, v1 = check_variances(variances)
    g = xyxy_to_cxcywh(boxes)
    tiny = torch.finfo(g.dtype).tiny
    dxy = (g[..., :2] - priors[..., :2]) / (v0 * priors[..., 2:])
    dwh = torch.log(g[..., 2:].clamp(min=tiny) / priors[..., 2:]) / v1
    return torch.cat([dxy, dwh], dim=-1)


def decode(offsets: torch.Tensor, priors: torch.Tensor, variances: Sequence[float] = DEFAULT_VARIANCES) -> torch.Tensor:
    """Invert :func:`encode`: offsets predicted for default boxes → xyxy boxes (SSD §2.2, eq. (2)).

    Parameters
    ----------
    offsets : torch.Tensor, float, shape ``[..., 4]``: ``(dx, dy, dw, dh)``.
    priors : torch.Tensor, float, shape ``[..., 4]`` broadcastable to ``offsets``, cxcywh (normalised).
    variances : pair of positive floats, default ``(0.1, 0.2)``.

    Returns
    -------
    torch.Tensor, shape ``[..., 4]``, xyxy in the unit of ``priors`` (not clipped to the image).

    Raises
    ------
    TypeError, ValueError
        Bad ``offsets``, ``priors`` or ``variances``.
    """
    check_boxes(offsets, "offsets")
    check_boxes(priors, "priors")
    v0, v1 = check_variances(variances)
    cxcy = priors[..., :2] + offsets[..., :2] * v0 * priors[..., 2:]
    wh = priors[..., 2:] * torch.exp(offsets[..., 2:] * v1)
    return torch.cat([cxcy - wh / 2, cxcy + wh / 2], dim=-1)


def _check_scores(scores, n: int, name: str = "scores") -> None:
    if not isinstance(scores, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor [N], got {type(scores).__name__}")
    if scores.ndim != 1 or scores.shape[0] != n:
        raise ValueError(f"{name} must have shape [N] = [{n}] to match boxes, got {tuple(scores.shape)}")


def nms(boxes: torch.Tensor, scores: torch.Tensor, iou_threshold: float = 0.45) -> torch.Tensor:
    """Greedy non-maximum suppression (SSD §3 "Inference": NMS with Jaccard overlap 0.45 per class).

    Visit boxes by descending score (ties: lower index first); keep a box unless a box kept before it overlaps
    it with IoU ``> iou_threshold``.  Exactly the classic sequential algorithm, computed in torch as the
    fixed point of ``keep_i = not any_j<i (keep_j and IoU_ji > t)``, iterated on the whole IoU matrix at once:
    after ``k`` sweeps the first ``k`` decisions are final, and the first sweep that changes nothing proves the
    result (the fixed point is unique).  Cost: ``O(N^2)`` memory and one ``N x N`` sweep per level of the
    longest suppression chain (a handful to a few tens in practice); about 10 ms for 1,000 boxes on one CPU
    thread.

    Parameters
    ----------
    boxes : torch.Tensor, float, shape ``[N, 4]``, xyxy.
    scores : torch.Tensor, float, shape ``[N]``.
    iou_threshold : float in ``[0, 1]``.

    Returns
    -------
    torch.Tensor, int64, shape ``[K]``: indices of the kept boxes into ``boxes``, by descending score.

    Raises
    ------
    TypeError, ValueError
        Bad ``boxes``, ``scores`` or ``iou_threshold``.
    """
    check_boxes(boxes, "boxes", ndim=2)
    _check_scores(scores, boxes.shape[0])
    if not isinstance(iou_threshold, (int, float)) or isinstance(iou_threshold, bool):
        raise TypeError(f"iou_threshold must be a float, got {type(iou_threshold).__name__}")
    if not 0.0 <= iou_threshold <= 1.0:
        raise ValueError(f"iou_threshold must lie in [0, 1], got {iou_threshold}")
    n = boxes.shape[0]
    if n == 0:
        return torch.empty(0, dtype=torch.int64, device=boxes.device)
    order = torch.sort(scores, descending=True, stable=True).indices
    keep = nms_sorted_mask(boxes[order][None], torch.ones(1, n, dtype=torch.bool, device=boxes.device), iou_threshold)[
        0
    ]
    return order[keep]


def nms_sorted_mask(boxes: torch.Tensor, valid: torch.Tensor, iou_threshold: float = 0.45) -> torch.Tensor:
    """Greedy NMS on many independent sets of boxes at once, each already sorted by descending score.

    Set ``s`` keeps box ``i`` when ``valid[s, i]`` and no kept valid box ``j < i`` of the same set has
    IoU ``> iou_threshold`` with it; solved for all sets together as the fixed point described in :func:`nms`.

    Parameters
    ----------
    boxes : torch.Tensor, float, shape ``[S, K, 4]``, xyxy, sorted by descending score within each set.
    valid : torch.Tensor, bool, shape ``[S, K]``: which boxes take part (e.g. score above a threshold).
    iou_threshold : float in ``[0, 1]``.

    Returns
    -------
    torch.Tensor, bool, shape ``[S, K]``: the kept boxes.

    Raises
    ------
    TypeError, ValueError
        Malformed arguments.
    """
    check_boxes(boxes, "boxes", ndim=3)
    if not isinstance(valid, torch.Tensor) or valid.dtype != torch.bool:
        raise TypeError("valid must be a bool torch.Tensor [S, K]")
    if valid.shape != boxes.shape[:2]:
        raise ValueError(f"valid must have shape {tuple(boxes.shape[:2])}, got {tuple(valid.shape)}")
    s, k = valid.shape
    if k == 0:
        return valid.clone()
    area = box_area(boxes)  # [S, K]
    x0, y0, x1, y1 = boxes.unbind(dim=-1)  # each [S, K]
    iw = (torch.minimum(x1[:, :, None], x1[:, None, :]) - torch.maximum(x0[:, :, None], x0[:, None, :])).clamp_(min=0)
    ih = (torch.minimum(y1[:, :, None], y1[:, None, :]) - torch.maximum(y0[:, :, None], y0[:, None, :])).clamp_(min=0)
    inter = iw * ih
    union = area[:, :, None] + area[:, None, :] - inter
    iou = torch.where(union > 0, inter / union.clamp(min=torch.finfo(union.dtype).tiny), torch.zeros_like(inter))
    over = iou > iou_threshold  # the same arithmetic as box_iou
    # suppress[s, j, i]: valid box j (earlier) would suppress valid box i (later) if j is kept
    suppress = (torch.triu(over, diagonal=1) & valid[:, :, None]).float()
    keep = valid.clone()
    for _ in range(k):
        # number of kept boxes that suppress each box: a batched vector-matrix product (exact small integers)
        hits = torch.bmm(keep.float()[:, None, :], suppress)[:, 0]
        new = valid & (hits == 0)
        if torch.equal(new, keep):
            break
        keep = new
    return keep


def batched_nms(
    boxes: torch.Tensor, scores: torch.Tensor, classes: torch.Tensor, iou_threshold: float = 0.45
) -> torch.Tensor:
    """:func:`nms` independently within each class, in one call (SSD §3: NMS per class).

    Boxes of different classes never suppress each other: each class is shifted by an offset larger than
    the extent of all boxes before one :func:`nms`, the trick torchvision uses.

    Parameters
    ----------
    boxes : torch.Tensor, float, shape ``[N, 4]``, xyxy.
    scores : torch.Tensor, float, shape ``[N]``.
    classes : torch.Tensor, integer, shape ``[N]``: the class of each box.
    iou_threshold : float in ``[0, 1]``.

    Returns
    -------
    torch.Tensor, int64, shape ``[K]``: kept indices into ``boxes``, by descending score.

    Raises
    ------
    TypeError, ValueError
        Bad arguments (see :func:`nms`), or ``classes`` not an integer tensor of shape ``[N]``.
    """
    check_boxes(boxes, "boxes", ndim=2)
    _check_scores(classes, boxes.shape[0], "classes")
    if classes.is_floating_point() or classes.dtype == torch.bool:
        raise TypeError(f"classes must be an integer tensor, got dtype {classes.dtype}")
    if boxes.shape[0] == 0:
        _check_scores(scores, 0)
        return torch.empty(0, dtype=torch.int64, device=boxes.device)
    extent = (boxes.max() - boxes.min()).abs() + 1
    shifted = boxes + (classes.to(boxes.dtype) * extent)[:, None]
    return nms(shifted, scores, iou_threshold)
