"""mpt_lab.data.digits_detection: the offline detection data set for the SSD experiment."""

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from mpt_lab.data import CLASS_NAMES, NUM_CLASSES, TEST_GLYPHS, TRAIN_GLYPHS, DigitsDetection, collate_fn
from mpt_lab.data import digits_detection as dd


@pytest.fixture(scope="module")
def train():
    return DigitsDetection("train", 200, seed=0)


@pytest.fixture(scope="module")
def test_split():
    return DigitsDetection("test", 200, seed=0)


def test_items_shapes_dtypes_ranges(train):
    assert len(train) == 200 and NUM_CLASSES == 11 and CLASS_NAMES[0] == "background"
    img, t = train[0]
    assert img.dtype == torch.float32 and img.shape == (1, 64, 64)
    assert train.images.shape == (200, 1, 64, 64)
    assert float(train.images.min()) >= 0.0 and float(train.images.max()) <= 1.0
    counts = []
    for _, t in (train[i] for i in range(len(train))):
        b, lab = t["boxes"], t["labels"]
        assert b.dtype == torch.float32 and lab.dtype == torch.int64
        assert b.ndim == 2 and b.shape[1] == 4 and lab.shape == (b.shape[0],)
        assert 1 <= b.shape[0] <= 4
        assert bool((b >= 0).all() and (b <= 1).all())
        assert bool((b[:, 2] > b[:, 0]).all() and (b[:, 3] > b[:, 1]).all())
        assert bool(((lab >= 1) & (lab <= 10)).all())
        # boxes lie on the pixel grid (normalised by 64)
        assert torch.equal(b * 64, (b * 64).round())
        counts.append(b.shape[0])
    assert set(counts) == {1, 2, 3, 4}
    # every digit class occurs
    labels = torch.cat([t["labels"] for t in train.targets])
    assert set(labels.tolist()) == set(range(1, 11))


def test_deterministic_from_seed():
    a = DigitsDetection("train", 40, seed=3)
    b = DigitsDetection("train", 40, seed=3)
    assert torch.equal(a.images, b.images)
    for ta, tb in zip(a.targets, b.targets):
        assert torch.equal(ta["boxes"], tb["boxes"]) and torch.equal(ta["labels"], tb["labels"])
    c = DigitsDetection("train", 40, seed=4)
    assert not torch.equal(a.images, c.images)
    # image i does not depend on how many images are generated
    d = DigitsDetection("train", 15, seed=3)
    assert torch.equal(d.images, a.images[:15])
    assert all(torch.equal(x["boxes"], y["boxes"]) for x, y in zip(d.targets, a.targets))


def test_boxes_are_exact(train):
    """Every pixel a glyph paints lies inside its box, and each edge of the box touches painted pixels."""
    for i in range(60):
        masks = train.render_masks(i)
        boxes = train.targets[i]["boxes"] * 64
        assert masks.shape[0] == boxes.shape[0]
        for m, (x0, y0, x1, y1) in zip(masks, boxes.round().long().tolist()):
            rows = torch.nonzero(m.any(dim=1)).flatten()
            cols = torch.nonzero(m.any(dim=0)).flatten()
            assert (int(cols.min()), int(rows.min()), int(cols.max()) + 1, int(rows.max()) + 1) == (x0, y0, x1, y1)
            inside = torch.zeros_like(m, dtype=torch.bool)
            inside[y0:y1, x0:x1] = True
            assert float(m[~inside].abs().sum()) == 0.0
            assert float(m.max()) <= 1.0 and float(m[m > 0].min()) >= dd.INK_THRESHOLD


def test_black_background_has_ink_only_inside_boxes():
    ds = DigitsDetection("test", 30, background="none")
    for i in range(len(ds)):
        img = ds.images[i, 0]
        inside = torch.zeros_like(img, dtype=torch.bool)
        for x0, y0, x1, y1 in (ds.targets[i]["boxes"] * 64).round().long().tolist():
            inside[y0:y1, x0:x1] = True
        assert float(img[~inside].abs().sum()) == 0.0
        assert float(img[inside].max()) >= 0.5  # the glyphs are bright (intensity 0.6 .. 1)


def test_labels_match_the_glyphs(train):
    _, digits = dd._glyphs()
    for t, ids in zip(train.targets, train.glyph_ids):
        assert torch.equal(t["labels"], torch.as_tensor(digits[ids.numpy()]) + 1)


def test_train_and_test_use_disjoint_glyphs_and_photo_regions(train, test_split):
    assert set(TRAIN_GLYPHS).isdisjoint(TEST_GLYPHS) and len(TRAIN_GLYPHS) + len(TEST_GLYPHS) == 1797
    tr = set(torch.cat(train.glyph_ids).tolist())
    te = set(torch.cat(test_split.glyph_ids).tolist())
    assert tr <= set(TRAIN_GLYPHS) and te <= set(TEST_GLYPHS) and tr.isdisjoint(te)
    for ds, ok in ((train, lambda x0, x1: x1 <= 448), (test_split, lambda x0, x1: x0 >= 448)):
        for i in range(50):
            bg = ds._layout(i)["background"]
            c = 64 * bg["factor"]
            assert ok(bg["x"], bg["x"] + c)


def test_backgrounds_differ_and_carry_texture(train):
    # photographic backgrounds: not constant, differ between images
    outside = []
    for i in range(20):
        img = train.images[i, 0].clone()
        for x0, y0, x1, y1 in (train.targets[i]["boxes"] * 64).round().long().tolist():
            img[y0:y1, x0:x1] = float("nan")
        outside.append(img[~img.isnan()])
    stds = torch.tensor([float(o.std()) for o in outside])
    means = torch.tensor([float(o.mean()) for o in outside])
    assert float(stds.mean()) > 0.02 and float(means.std()) > 0.02


def test_collate_fn_and_dataloader(train):
    loader = DataLoader(train, batch_size=8, shuffle=False, collate_fn=collate_fn)
    images, targets = next(iter(loader))
    assert images.shape == (8, 1, 64, 64) and images.dtype == torch.float32
    assert isinstance(targets, list) and len(targets) == 8
    assert torch.equal(images, train.images[:8])
    bi, bt = train.batch(range(8))
    assert torch.equal(bi, images) and all(torch.equal(a["boxes"], b["boxes"]) for a, b in zip(bt, targets))
    bi2, _ = train.batch(torch.tensor([3, 1]))
    assert torch.equal(bi2, train.images[[3, 1]])
    with pytest.raises(ValueError, match="batch"):
        collate_fn([])
    with pytest.raises(TypeError, match="batch"):
        collate_fn("abc")


def test_other_sizes_and_backgrounds():
    ds = DigitsDetection("train", 10, image_size=128, background="noise", max_objects=6)
    assert ds.images.shape == (10, 1, 128, 128)
    assert max(len(t["labels"]) for t in ds.targets) <= 6
    m = ds.render_masks(0)
    assert m.shape[1:] == (128, 128)


def test_many_images_generate():
    # (how fast is measured by benchmarks, not asserted here: a busy machine must not fail a test)
    ds = DigitsDetection("train", 2000, seed=1)
    assert len(ds) == 2000 and ds[1999][0].shape == ds[0][0].shape


@pytest.mark.parametrize(
    "kwargs, exc, name",
    [
        (dict(split="val"), ValueError, "split"),
        (dict(split=1), TypeError, "split"),
        (dict(n_images=-1), ValueError, "n_images"),
        (dict(n_images=2.5), TypeError, "n_images"),
        (dict(image_size=16), ValueError, "image_size"),
        (dict(seed=-1), ValueError, "seed"),
        (dict(max_objects=0), ValueError, "max_objects"),
        (dict(background="sky"), ValueError, "background"),
        (dict(max_overlap=1.5), ValueError, "max_overlap"),
        (dict(min_size=30, max_size=20), ValueError, "max_size"),
    ],
)
def test_bad_arguments(kwargs, exc, name):
    with pytest.raises(exc, match=name):
        DigitsDetection(**{"n_images": 2, **kwargs})


def test_index_errors(train):
    with pytest.raises(IndexError):
        train[200]
    with pytest.raises(TypeError, match="index"):
        train["0"]
    img, _ = train[-1]
    assert torch.equal(img, train.images[199])


def test_bilinear_matches_torch_interpolate():
    x = torch.rand(3, 1, 8, 8)
    for h, w in ((10, 9), (28, 33), (17, 12)):
        ref = torch.nn.functional.interpolate(x, size=(h, w), mode="bilinear", align_corners=False)[:, 0]
        got = torch.from_numpy(dd._bilinear_matrix(h, 8)) @ x[:, 0] @ torch.from_numpy(dd._bilinear_matrix(w, 8)).T
        assert torch.allclose(ref, got, atol=1e-6)
    assert np.allclose(dd._bilinear_matrix(10, 8).sum(axis=1), 1.0)
