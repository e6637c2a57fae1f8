"""A small, real object-detection data set made offline from data that ships with scikit-learn.

Each image is a grey ``image_size x image_size`` canvas holding 1 to ``max_objects`` handwritten digits
(the 1,797 8x8 glyphs of :func:`sklearn.datasets.load_digits`) scaled to random sizes and placed at random
positions with limited overlap, over a background cut from scikit-learn's two sample photographs
(:func:`sklearn.datasets.load_sample_images`: ``china.jpg`` and ``flower.jpg``), turned grey, dimmed and
overlaid with Gaussian noise.  Photographic texture gives the detector edges and blobs that are not digits,
so it must learn to tell them apart: a real (if small) detection task in the spirit of Pascal VOC, used to
train the SSD-style detector of :mod:`mpt_lab.models.ssd` (Liu et al., ECCV 2016) whose activation gradients
the book histograms (Micikevicius et al., ICLR 2018, Figure 3; NVIDIA's 2017 blog post, Figure 2).

Conventions
-----------
* Image: ``torch.float32``, shape ``[1, H, W]`` (one grey channel), values in ``[0, 1]``.
* Boxes: ``torch.float32``, shape ``[n, 4]``, ``(x_min, y_min, x_max, y_max)`` **normalised** to ``[0, 1]``
  (divide by ``image_size``; multiply by it for pixels).  A box is the tight box of the glyph's ink: in
  pixels, ``x_min`` is the first column holding ink and ``x_max`` one past the last (pixel ``c`` covers
  ``[c, c + 1)``); every pixel the glyph paints lies inside its box and each edge touches ink.
  "Ink" is the glyph's scaled opacity; opacities below :data:`INK_THRESHOLD` are set to zero, so the box is
  exact.  A later glyph may cover a small part of an earlier one (overlap is limited by ``max_overlap``).
* Labels: ``torch.int64``, shape ``[n]``, ``1 .. 10`` for the digits ``0 .. 9``; ``0`` is the background
  class of the detector and never appears in a target.
* Train and test use disjoint glyphs (train: glyphs ``0 .. 1436`` of ``load_digits``, test:
  ``1437 .. 1796``, a split by index) and disjoint parts of the photographs (train: columns ``0 .. 447`` of
  each 427x640 photograph, test: columns ``448 .. 639``).
* Deterministic: image ``i`` depends only on ``(seed, split, i)`` and the constructor's other arguments, not on
  ``n_images``; all images are rendered once, in memory, at construction (about 0.4 s per 2,000 images at
  64x64 on one CPU core, 32 MiB; plus about 1 s once per process to import scikit-learn's data sets and decode
  the two JPEG photographs).
* Glyphs are scaled with bilinear interpolation (the same weights as ``torch.nn.functional.interpolate(...,
  mode="bilinear", align_corners=False)``) to heights ``min_size .. max_size`` and widths 0.8-1.2 times the
  height, drawn white-ish (intensity 0.6-1) over the background with their opacity as alpha.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

__all__ = [
    "DigitsDetection",
    "detection_split",
    "WIDEST_TEST_IMAGE",
    "collate_fn",
    "CLASS_NAMES",
    "NUM_CLASSES",
    "INK_THRESHOLD",
    "TRAIN_GLYPHS",
    "TEST_GLYPHS",
    "BACKGROUNDS",
]

#: Class names indexed by label: 0 is the background class, 1..10 are the digits 0..9.
CLASS_NAMES = ("background",) + tuple(str(d) for d in range(10))
#: Number of classes including background (the width of the detector's confidence output).
NUM_CLASSES = len(CLASS_NAMES)
#: Opacities below this (of a glyph scaled to [0, 1]) are dropped, so that boxes are exact.
INK_THRESHOLD = 0.05
#: Glyph indices into ``sklearn.datasets.load_digits()`` for each split (deterministic split by index).
TRAIN_GLYPHS = range(0, 1437)
TEST_GLYPHS = range(1437, 1797)
#: Background kinds: photo crops (+ noise), noise only, or a black canvas.
BACKGROUNDS = ("photo", "noise", "none")
_PHOTO_SPLIT_COLUMN = 448  # train crops from columns [0, 448), test from [448, 640)
_SPLIT_CODE = {"train": 0, "test": 1}


@functools.lru_cache(maxsize=1)
def _glyphs() -> tuple[np.ndarray, np.ndarray]:
    """The 1,797 digit glyphs as float32 opacities in [0, 1], shape [1797, 8, 8], and their digits [1797]."""
    from sklearn.datasets import load_digits

    d = load_digits()
    return (d.images / 16.0).astype(np.float32), d.target.astype(np.int64)


@functools.lru_cache(maxsize=1)
def _photos() -> tuple[np.ndarray, ...]:
    """scikit-learn's sample photographs in grey, float32 in [0, 1], each [427, 640]."""
    from sklearn.datasets import load_sample_images

    imgs = load_sample_images().images
    w = np.array([0.299, 0.587, 0.114], dtype=np.float32)
    return tuple(np.ascontiguousarray((img.astype(np.float32) @ w) / 255.0) for img in imgs)


@functools.lru_cache(maxsize=8)
def _pooled_photo(k: int, factor: int) -> np.ndarray:
    """Photograph ``k`` average-pooled by ``factor`` x ``factor`` (``factor`` 1: the photograph itself)."""
    p = _photos()[k]
    if factor == 1:
        return p
    h, w = (p.shape[0] // factor) * factor, (p.shape[1] // factor) * factor
    p = p[:h, :w]
    return sum(p[i::factor, j::factor] for i in range(factor) for j in range(factor)) / np.float32(factor**2)


@functools.lru_cache(maxsize=256)
def _bilinear_matrix(n_out: int, n_in: int) -> np.ndarray:
    """[n_out, n_in] float32 weights of 1-D linear resampling, the same as
    ``torch.nn.functional.interpolate(mode="bilinear", align_corners=False)`` along one axis."""
    src = np.maximum((np.arange(n_out) + 0.5) * (n_in / n_out) - 0.5, 0.0)
    i0 = np.minimum(np.floor(src).astype(np.int64), n_in - 1)
    i1 = np.minimum(i0 + 1, n_in - 1)
    lam = (src - i0).astype(np.float32)
    m = np.zeros((n_out, n_in), dtype=np.float32)
    np.add.at(m, (np.arange(n_out), i0), 1.0 - lam)
    np.add.at(m, (np.arange(n_out), i1), lam)
    return m


def _check_int(value, name: str, low: int, high: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    value = int(value)
    if value < low or (high is not None and value > high):
        rng = f">= {low}" if high is None else f"in [{low}, {high}]"
        raise ValueError(f"{name} must be {rng}, got {value}")
    return value


def _check_float(value, name: str, low: float, high: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.floating)):
        raise TypeError(f"{name} must be a float, got {type(value).__name__}")
    value = float(value)
    if not low <= value <= high:
        raise ValueError(f"{name} must lie in [{low}, {high}], got {value}")
    return value


class DigitsDetection(Dataset):
    """Handwritten digits on photographic backgrounds, with exact boxes: a detection data set built offline.

    Parameters
    ----------
    split : ``"train"`` or ``"test"``; the splits use disjoint glyphs and disjoint photograph regions.
    n_images : int >= 0, number of images (default 2,000).
    image_size : int in ``[32, 512]``, side of the square images in pixels (default 64).
    seed : int >= 0; the same ``(seed, split)`` always gives the same images.
    max_objects : int in ``[1, 32]``; each image holds ``1 .. max_objects`` digits (uniformly; fewer when no
        free place is found in 30 tries).
    background : ``"photo"`` (grey crops of the sample photographs, dimmed, contrast changed, plus Gaussian
        noise; default), ``"noise"`` (Gaussian noise on a dark grey level) or ``"none"`` (black, no noise: the
        easy variant).
    min_size, max_size : int, range of glyph heights in pixels (default 10 and 28 for 64 px images; scaled
        with ``image_size`` when not given).  Widths are the height times a random factor in ``[0.8, 1.2]``.
    max_overlap : float in ``[0, 1]``, the largest share of the smaller of two glyph squares that the other
        may cover (default 0.2).

    Items
    -----
    ``dataset[i] -> (image, target)``: ``image`` float32 ``[1, H, W]`` in ``[0, 1]``; ``target`` a dict with
    ``"boxes"`` float32 ``[n, 4]`` normalised xyxy and ``"labels"`` int64 ``[n]`` in ``1 .. 10``.
    Attributes ``images`` (float32 ``[N, 1, H, W]``) and ``targets`` (list of dicts) hold everything;
    :meth:`batch` collates chosen indices without a DataLoader.

    Raises
    ------
    TypeError, ValueError
        An argument of the wrong type or out of range (the message names it).
    """

    def __init__(
        self,
        split: str = "train",
        n_images: int = 2000,
        image_size: int = 64,
        seed: int = 0,
        max_objects: int = 4,
        background: str = "photo",
        *,
        min_size: int | None = None,
        max_size: int | None = None,
        max_overlap: float = 0.2,
    ):
        if not isinstance(split, str):
            raise TypeError(f"split must be a str, got {type(split).__name__}")
        if split not in _SPLIT_CODE:
            raise ValueError(f"split must be 'train' or 'test', got {split!r}")
        if not isinstance(background, str):
            raise TypeError(f"background must be a str, got {type(background).__name__}")
        if background not in BACKGROUNDS:
            raise ValueError(f"background must be one of {BACKGROUNDS}, got {background!r}")
        self.split = split
        self.n_images = _check_int(n_images, "n_images", 0)
        self.image_size = _check_int(image_size, "image_size", 32, 512)
        self.seed = _check_int(seed, "seed", 0)
        self.max_objects = _check_int(max_objects, "max_objects", 1, 32)
        self.background = background
        s = self.image_size
        if min_size is None:
            min_size = max(6, round(10 * s / 64))
        if max_size is None:
            max_size = max(min_size, round(28 * s / 64))
        self.min_size = _check_int(min_size, "min_size", 4, s)
        self.max_size = _check_int(max_size, "max_size", self.min_size, max(4, int(s / 1.2)))
        self.max_overlap = _check_float(max_overlap, "max_overlap", 0.0, 1.0)
        self.glyph_indices = TRAIN_GLYPHS if split == "train" else TEST_GLYPHS
        self.images, self.targets, self.glyph_ids = self._generate()

    # -- generation -------------------------------------------------------------------------------------
    def _layout(self, i: int) -> dict[str, Any]:
        """Random choices for image ``i``: background parameters and glyph placements (patch rectangles).

        Uses its own generator seeded by ``(seed, split, i)``, so image ``i`` does not depend on ``n_images``.
        """
        rng = np.random.default_rng([self.seed, _SPLIT_CODE[self.split], i])
        s = self.image_size
        u = rng.random(8)
        n_obj = 1 + int(u[0] * self.max_objects)
        n_sizes = self.max_size - self.min_size + 1
        n_glyphs = len(self.glyph_indices)
        objs: list[dict[str, Any]] = []
        for _ in range(n_obj):
            for r in rng.random((30, 6)):  # up to 30 tries to find a place with limited overlap
                h = self.min_size + int(r[0] * n_sizes)
                w = int(min(max(round(h * (0.8 + 0.4 * r[1])), 4), s))
                y0 = int(r[2] * (s - h + 1))
                x0 = int(r[3] * (s - w + 1))
                ok = True
                for o in objs:
                    iw = min(x0 + w, o["x0"] + o["w"]) - max(x0, o["x0"])
                    ih = min(y0 + h, o["y0"] + o["h"]) - max(y0, o["y0"])
                    if iw > 0 and ih > 0 and iw * ih > self.max_overlap * min(w * h, o["w"] * o["h"]):
                        ok = False
                        break
                if ok:
                    objs.append(
                        dict(
                            x0=x0,
                            y0=y0,
                            w=w,
                            h=h,
                            glyph=int(self.glyph_indices[int(r[4] * n_glyphs)]),
                            intensity=0.6 + 0.4 * float(r[5]),
                        )
                    )
                    break
        bg: dict[str, Any] = dict(noise=0.04 * float(u[1]) if self.background != "none" else 0.0)
        if self.background == "photo":
            photos = _photos()
            k = int(u[2] * len(photos))
            ph, pw = photos[k].shape
            lo, hi = (0, _PHOTO_SPLIT_COLUMN) if self.split == "train" else (_PHOTO_SPLIT_COLUMN, pw)
            factor = 1 + int(u[3] * 2)  # crop 1x or 2x the image size, average-pooled down to it
            if hi - lo < s * factor or ph < s * factor:
                factor = 1
            c = s * factor
            if hi - lo < c or ph < c:
                raise ValueError(
                    f"image_size must be at most {min(ph, pw - _PHOTO_SPLIT_COLUMN)} for photo backgrounds, got {s}"
                )
            # the crop's corner (in photograph pixels) is a multiple of `factor`
            x = lo + factor * int(u[4] * ((hi - lo - c) // factor + 1))
            y = factor * int(u[5] * ((ph - c) // factor + 1))
            bg.update(
                photo=k,
                factor=factor,
                x=x,
                y=y,
                flip=bool(u[6] < 0.5),
                level=0.05 + 0.3 * float(u[7]),
                gain=float(rng.uniform(0.4, 1.2)),
            )
        elif self.background == "noise":
            bg.update(level=0.3 * float(u[2]), noise=0.02 + 0.08 * float(u[3]))
        return dict(objects=objs, background=bg)

    def _backgrounds(self, layouts) -> np.ndarray:
        """Background canvases [n, H, W] float32 for the given layouts (before noise)."""
        s, n = self.image_size, len(layouts)
        out = np.zeros((n, s, s), dtype=np.float32)
        if self.background == "noise":
            out += np.array([lay["background"]["level"] for lay in layouts], dtype=np.float32)[:, None, None]
        elif self.background == "photo":
            groups: dict[tuple[int, int], list[int]] = {}
            for i, lay in enumerate(layouts):
                groups.setdefault((lay["background"]["photo"], lay["background"]["factor"]), []).append(i)
            for (k, f), members in groups.items():
                photo = _pooled_photo(k, f)
                bgs = [layouts[i]["background"] for i in members]
                crops = np.stack([photo[b["y"] // f : b["y"] // f + s, b["x"] // f : b["x"] // f + s] for b in bgs])
                flip = np.array([b["flip"] for b in bgs])
                crops[flip] = crops[flip][:, :, ::-1]
                level = np.array([b["level"] for b in bgs], dtype=np.float32)[:, None, None]
                gain = np.array([b["gain"] for b in bgs], dtype=np.float32)[:, None, None]
                # dimmed and contrast-changed: mean grey level `level`, texture amplitude times `gain`
                out[members] = level + (crops - crops.mean(axis=(1, 2), keepdims=True)) * gain
        return out

    def _scaled_glyphs(self, layouts) -> dict[tuple[int, int], tuple[np.ndarray, tuple[int, int, int, int]]]:
        """Scale every placed glyph (bilinear), grouped by size.

        Returns ``(image, object) -> (opacity [h, w], tight ink box (c0, r0, c1, r1) in patch pixels)``."""
        glyphs, _ = _glyphs()
        groups: dict[tuple[int, int], list[tuple[int, int]]] = {}
        for i, lay in enumerate(layouts):
            for j, o in enumerate(lay["objects"]):
                groups.setdefault((o["h"], o["w"]), []).append((i, j))
        out = {}
        for (h, w), members in groups.items():
            src = glyphs[[layouts[i]["objects"][j]["glyph"] for i, j in members]]
            scaled = _bilinear_matrix(h, 8) @ src @ _bilinear_matrix(w, 8).T
            np.clip(scaled, 0.0, 1.0, out=scaled)
            scaled[scaled < INK_THRESHOLD] = 0.0
            rows, cols = scaled.any(axis=2), scaled.any(axis=1)
            r0, r1 = rows.argmax(axis=1), h - rows[:, ::-1].argmax(axis=1)
            c0, c1 = cols.argmax(axis=1), w - cols[:, ::-1].argmax(axis=1)
            for k, key in enumerate(members):
                out[key] = (scaled[k], (int(c0[k]), int(r0[k]), int(c1[k]), int(r1[k])))
        return out

    def _generate(self):
        s, n = self.image_size, self.n_images
        _, digits = _glyphs()
        layouts = [self._layout(i) for i in range(n)]
        alphas = self._scaled_glyphs(layouts)
        images = self._backgrounds(layouts)
        targets, glyph_ids = [], []
        for i, lay in enumerate(layouts):
            img = images[i]
            boxes, labels, ids = [], [], []
            for j, o in enumerate(lay["objects"]):
                a, (c0, r0, c1, r1) = alphas[(i, j)]
                y0, x0 = o["y0"], o["x0"]
                region = img[y0 : y0 + o["h"], x0 : x0 + o["w"]]
                region *= 1.0 - a
                region += o["intensity"] * a
                boxes.append((x0 + c0, y0 + r0, x0 + c1, y0 + r1))
                labels.append(int(digits[o["glyph"]]) + 1)
                ids.append(o["glyph"])
            targets.append(
                {
                    "boxes": torch.tensor(boxes, dtype=torch.float32).reshape(-1, 4) / s,
                    "labels": torch.tensor(labels, dtype=torch.int64),
                }
            )
            glyph_ids.append(torch.tensor(ids, dtype=torch.int64))
        # Gaussian noise from one stream per (seed, split): image i takes the i-th block of H*W normals.
        noise = np.random.default_rng([self.seed, _SPLIT_CODE[self.split], 2**32 - 1]).standard_normal(
            (n, s, s), dtype=np.float32
        )
        sigma = np.array([lay["background"]["noise"] for lay in layouts], dtype=np.float32)
        images += noise * sigma[:, None, None]
        np.clip(images, 0.0, 1.0, out=images)
        return torch.from_numpy(images[:, None]), targets, glyph_ids

    # -- inspection -------------------------------------------------------------------------------------
    def render_masks(self, index: int) -> torch.Tensor:
        """The opacity of each glyph of image ``index`` on the canvas, for checking boxes.

        Returns
        -------
        torch.Tensor, float32, shape ``[n, H, W]``: ``masks[k]`` is glyph ``k``'s opacity in ``[0, 1]`` (0 where
        it paints nothing), in the order of ``targets[index]["boxes"]``.

        Raises
        ------
        TypeError, IndexError
            ``index`` is not an int, or out of range.
        """
        index = self._index(index)
        lay = self._layout(index)
        alphas = self._scaled_glyphs([lay])
        s = self.image_size
        masks = torch.zeros(len(lay["objects"]), s, s)
        for j, o in enumerate(lay["objects"]):
            masks[j, o["y0"] : o["y0"] + o["h"], o["x0"] : o["x0"] + o["w"]] = torch.from_numpy(alphas[(0, j)][0])
        return masks

    def _index(self, index) -> int:
        if isinstance(index, bool) or not isinstance(index, (int, np.integer)):
            raise TypeError(f"index must be an int, got {type(index).__name__}")
        index = int(index)
        if index < 0:
            index += self.n_images
        if not 0 <= index < self.n_images:
            raise IndexError(f"index {index} out of range for {self.n_images} images")
        return index

    def __len__(self) -> int:
        return self.n_images

    def __getitem__(self, index):
        index = self._index(index)
        t = self.targets[index]
        return self.images[index], {"boxes": t["boxes"].clone(), "labels": t["labels"].clone()}

    def batch(self, indices: torch.Tensor | Sequence[int]) -> tuple[torch.Tensor, list[dict[str, torch.Tensor]]]:
        """Collate the items at ``indices`` (a sequence or 1-D integer tensor) like :func:`collate_fn`.

        Returns ``(images float32 [B, 1, H, W], targets list of B dicts)``; the images are a copy.
        """
        if isinstance(indices, torch.Tensor):
            indices = indices.tolist()
        idx = [self._index(i) for i in indices]
        return self.images[idx], [self.targets[i] for i in idx]

    def __repr__(self) -> str:
        return (
            f"DigitsDetection(split={self.split!r}, n_images={self.n_images}, image_size={self.image_size}, "
            f"seed={self.seed}, max_objects={self.max_objects}, background={self.background!r})"
        )


def collate_fn(
    batch: Sequence[tuple[torch.Tensor, dict[str, torch.Tensor]]],
) -> tuple[torch.Tensor, list[dict[str, torch.Tensor]]]:
    """Collate ``(image, target)`` pairs for a :class:`torch.utils.data.DataLoader`.

    Parameters
    ----------
    batch : sequence of ``(image float32 [C, H, W], target dict)`` with equal image shapes.

    Returns
    -------
    ``(images, targets)``: images stacked to float32 ``[B, C, H, W]``; targets the list of the ``B`` dicts
    (``"boxes"`` float32 ``[n_i, 4]``, ``"labels"`` int64 ``[n_i]``), since ``n_i`` varies.

    Raises
    ------
    TypeError
        ``batch`` is not a sequence of (tensor, dict) pairs.
    ValueError
        ``batch`` is empty.
    """
    if not isinstance(batch, (list, tuple)):
        raise TypeError(f"batch must be a list of (image, target) pairs, got {type(batch).__name__}")
    if len(batch) == 0:
        raise ValueError("batch must not be empty")
    for item in batch:
        if not (
            isinstance(item, (list, tuple))
            and len(item) == 2
            and isinstance(item[0], torch.Tensor)
            and isinstance(item[1], dict)
        ):
            raise TypeError("batch must hold (image tensor, target dict) pairs")
    return torch.stack([item[0] for item in batch]), [item[1] for item in batch]


#: The widest image :class:`DigitsDetection` renders on photographs in its test split (the test
#: split's part of the photographs is 192 pixels wide).
WIDEST_TEST_IMAGE = 192


class _Upsampled:
    """A detection data set's images resized to ``image_size`` (bilinear), with the same normalised boxes."""

    def __init__(self, data, image_size: int):
        self.images = torch.nn.functional.interpolate(
            data.images, size=(image_size, image_size), mode="bilinear", align_corners=False
        ).clamp_(0.0, 1.0)
        self.targets = data.targets

    def __len__(self) -> int:
        return len(self.targets)

    def batch(self, indices: torch.Tensor | list[int]) -> tuple[torch.Tensor, list]:
        idx = indices.tolist() if isinstance(indices, torch.Tensor) else list(indices)
        return self.images[idx], [self.targets[i] for i in idx]


def detection_split(split: str, n_images: int, image_size: int, seed: int = 0) -> DigitsDetection | _Upsampled:
    """The images of :class:`DigitsDetection` for ``split`` at ``image_size`` pixels.

    The test split's part of the photographs is only :data:`WIDEST_TEST_IMAGE` pixels wide, so test images
    larger than that (e.g. SSD300's 300 px) are rendered at half the size (or less) and resized with bilinear
    interpolation; the boxes, normalised to [0, 1], are unchanged.  The digits themselves are 8x8 glyphs scaled
    up in either case.  Returns a data set with ``len()``, ``images``, ``targets`` and ``batch(indices)``.
    """
    if split != "test" or image_size <= WIDEST_TEST_IMAGE:
        return DigitsDetection(split, n_images, image_size, seed=seed)
    render = image_size
    while render > WIDEST_TEST_IMAGE:
        render //= 2
    return _Upsampled(DigitsDetection(split, n_images, render, seed=seed), image_size)
