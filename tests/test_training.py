"""mpt_lab.training (shuffled batches, a scaled step, accuracy, autocast_to), mpt_lab.models.digits_mlp,
mpt_lab.data.upsampled_digits and mpt_lab.models.evaluate_detector."""

import pytest
import torch

from mpt_lab import training
from mpt_lab.data import DigitsDetection, digits_data, upsampled_digits
from mpt_lab.models import build_ssd, digits_mlp, evaluate_detector
from mpt_lab.scaling import GradScaler


def test_shuffled_batches_cover_each_epoch_once():
    it = training.shuffled_batches(10, 3, seed=0)
    batches = [next(it) for _ in range(6)]  # two epochs of 3 full batches (the tail is dropped)
    assert all(b.shape == (3,) and b.dtype == torch.int64 for b in batches)
    for epoch in (batches[:3], batches[3:]):
        seen = torch.cat(epoch)
        assert len(set(seen.tolist())) == 9 and seen.max() < 10
    again = training.shuffled_batches(10, 3, generator=torch.Generator().manual_seed(0))
    assert all(torch.equal(a, next(again)) for a in batches)  # reproducible from the generator
    with pytest.raises(ValueError, match="batch_size"):
        next(training.shuffled_batches(10, 0))
    with pytest.raises(ValueError, match="n must"):
        next(training.shuffled_batches(2, 3))


def test_backward_step_with_and_without_a_scaler():
    x, y = torch.randn(8, 64), torch.randint(0, 10, (8,))
    a, b = digits_mlp(16, seed=0), digits_mlp(16, seed=0)
    for m, scaler in ((a, None), (b, GradScaler(init_scale=2.0**10))):
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        training.backward_step(torch.nn.functional.cross_entropy(m(x), y), opt, scaler)
    # a power-of-two loss scale cancels exactly in FP32
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))


def test_accuracy_and_autocast_to():
    logits = torch.tensor([[2.0, 1.0], [0.0, 3.0], [1.0, 0.0]])
    assert training.accuracy(logits, torch.tensor([0, 1, 1])) == pytest.approx(2 / 3)
    with pytest.raises(ValueError, match="logits"):
        training.accuracy(logits[0], torch.tensor([0]))
    with training.autocast_to("cpu", torch.bfloat16):
        assert (torch.ones(2, 2) @ torch.ones(2, 2)).dtype == torch.bfloat16
    with training.autocast_to("cpu", torch.float32), training.autocast_to("cpu", None):
        assert (torch.ones(2, 2) @ torch.ones(2, 2)).dtype == torch.float32


def test_digits_mlp_shapes_and_seed():
    m = digits_mlp(32, 2, seed=3)
    assert [type(layer).__name__ for layer in m] == ["Linear", "ReLU", "Linear", "ReLU", "Linear"]
    assert m(torch.zeros(5, 64)).shape == (5, 10)
    state = torch.random.get_rng_state()
    same = digits_mlp(32, 2, seed=3)
    assert torch.equal(torch.random.get_rng_state(), state)  # the global random state is untouched
    assert all(torch.equal(p, q) for p, q in zip(m.parameters(), same.parameters()))
    with pytest.raises(ValueError, match="hidden"):
        digits_mlp(0)
    with pytest.raises(ValueError, match="layers"):
        digits_mlp(8, 0)


def test_upsampled_digits():
    xtr, ytr, xte, yte = upsampled_digits(16, seed=0)
    x8 = digits_data(seed=0)[0]
    assert xtr.shape == (len(x8), 1, 16, 16) and xte.shape[1:] == (1, 16, 16) and ytr.dtype == torch.int64
    assert torch.allclose(xtr.mean((1, 2, 3)), x8.mean(1), atol=0.05)  # bilinear upsampling keeps the mean
    with pytest.raises(ValueError, match="image_size"):
        upsampled_digits(0)


def test_evaluate_detector_runs_in_batches_and_restores_training_mode():
    model = build_ssd("small").train()
    data = DigitsDetection("test", 7, seed=0)
    m = evaluate_detector(model, data, batch_size=3)
    assert 0.0 <= m <= 1.0 and model.training
    with pytest.raises(ValueError, match="batch_size"):
        evaluate_detector(model, data, batch_size=0)


def test_lr_factor_warms_up_then_decays_to_its_floor():
    assert training.lr_factor(0, 100) == pytest.approx(0.1) and training.lr_factor(9, 100) == 1.0
    assert training.lr_factor(100, 100) == pytest.approx(0.1)
    assert training.lr_factor(55, 100) == pytest.approx(0.1 + 0.9 * 0.5)  # half-way through the decay
