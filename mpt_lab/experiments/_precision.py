"""One training step in FP32 or in FP16 mixed precision, without or with loss scaling: the recipes that the
divergence experiments (:mod:`~mpt_lab.experiments.biglstm`, :mod:`~mpt_lab.experiments.ssd_table2`) compare.

A recipe is one of :data:`RECIPES` (each experiment trains one run, an *arm*, per recipe: its config and result
keep them under the stored key ``arms``):

``"fp32"``          plain float32 training;
``"fp16"``          mixed precision (FP32 master weights, FP16 forward and backward) **without** loss scaling;
``"fp16_static"``   the same with a constant loss scale S (:class:`mpt_lab.scaling.StaticLossScaler`);
``"fp16_dynamic"``  the same with dynamic loss scaling (:class:`mpt_lab.scaling.GradScaler`).

Mixed precision is real ``torch.autocast(dtype=torch.float16)`` on CUDA and, on a CPU (no fast float16
kernels), the emulation ``mpt_lab.simulate.simulate("FP16", mode="autocast")`` with forward *and* backward
inside the block; :attr:`RecipeRun.real_fp16` says which.

The gradient shift
------------------
``grad_shift = k`` multiplies the loss by 2⁻ᵏ before backward, so every gradient is 2ᵏ times smaller, and
multiplies the optimizer's ``eps`` by 2⁻ᵏ as well.  Adagrad and Adam (the optimizers of bigLSTM and of our
detector) divide each gradient by the root of its accumulated squares, so for them a power-of-two gradient
scale cancels *exactly*, bit for bit, in float32 (scaling by a power of two commutes with rounding while
values stay normal): an FP32 run does not change at all.  In FP16 it moves the gradient histogram k binades
towards FP16's underflow threshold 2⁻²⁴, which is how the book places a small model's gradients where the
paper's large models had theirs (mean losses over more tokens, more pixels, bigger layers all make per-value
gradients smaller).
"""

from __future__ import annotations

import contextlib

import torch

from ..scaling import GradScaler, StaticLossScaler
from ..simulate import simulate, to_float32

__all__ = ["RECIPES", "RECIPE_LABELS", "RecipeRun", "shift_eps", "collect_arms", "gradient_shares"]

#: The recipes of the divergence experiments (see the module docstring).
RECIPES = ("fp32", "fp16", "fp16_static", "fp16_dynamic")

#: Legend labels of the recipes (the static scale is filled in by :meth:`RecipeRun.label`).
RECIPE_LABELS = {"fp32": "FP32", "fp16": "mixed FP16, no loss scaling", "fp16_static": "mixed FP16, loss scale {S:g}",
              "fp16_dynamic": "mixed FP16, dynamic loss scaling"}


def collect_arms(out: dict) -> dict:
    """The result fields shared by the divergence experiments, from ``{recipe: dict returned by its training
    loop}`` (which holds "label", "real_fp16" and "seconds" besides the run's records): ``arms`` (one run per
    recipe), ``labels``, ``real_fp16``, ``train_seconds``."""
    meta = ("label", "real_fp16", "seconds")
    return {"arms": {a: {k: v for k, v in d.items() if k not in meta} for a, d in out.items()},
            "labels": {a: d["label"] for a, d in out.items()},
            "real_fp16": any(d["real_fp16"] for d in out.values()),
            "train_seconds": {a: d["seconds"] for a, d in out.items()}}


def gradient_shares(h) -> dict:
    """What the divergence experiments record of a :class:`~mpt_lab.histogram.Log2Histogram` of activation
    gradients: ``zero_share`` (share of values exactly zero), ``fp16_underflow`` (share FP16 flushes to zero:
    non-zero values with |x| ≤ 2⁻²⁵), ``nonfinite`` (share of inf/NaN), all in [0, 1], and ``median_log2``
    (:meth:`~mpt_lab.histogram.Log2Histogram.median_binade`: the binade k, 2ᵏ ≤ |x| < 2ᵏ⁺¹, of the median
    non-zero finite value; None when there is none)."""
    if h.total == 0:
        return {"zero_share": 0.0, "fp16_underflow": 0.0, "nonfinite": 0.0, "median_log2": None}
    return {"zero_share": float(h.fraction_zero()), "fp16_underflow": float(h.fractions("FP16")["underflow"]),
            "nonfinite": float(h.nonfinite) / float(h.total), "median_log2": h.median_binade()}


def shift_eps(optimizer: torch.optim.Optimizer, grad_shift: int) -> None:
    """Multiply every parameter group's ``eps`` by 2⁻ᵏ (``k = grad_shift``), so that Adagrad/Adam stay exactly
    invariant to gradients scaled by 2⁻ᵏ.  Raises ValueError when the optimizer has no ``eps``."""
    if grad_shift == 0:
        return
    for group in optimizer.param_groups:
        if "eps" not in group:
            raise ValueError(f"grad_shift needs an optimizer with eps (Adagrad, Adam), got {type(optimizer).__name__}")
        group["eps"] = group["eps"] * 2.0 ** -grad_shift


class RecipeRun:
    """Run training steps in one recipe of :data:`RECIPES` on ``device``.

    Parameters
    ----------
    recipe : str in :data:`RECIPES`
    device : torch.device or str; CUDA runs real float16 autocast, a CPU the emulation
    static_scale : float > 0, the loss scale S of ``"fp16_static"`` (the paper: 128 for bigLSTM, 8 for SSD)
    init_scale, growth_interval : the dynamic scaler's settings (``"fp16_dynamic"``)
    grad_shift : int ≥ 0, the loss is multiplied by 2⁻ᵏ (see the module docstring; pair it with
        :func:`shift_eps` on the optimizer)
    simulate_on_cpu : bool, emulate FP16 with :mod:`mpt_lab.simulate` on a CPU (default); False uses real
        ``torch.autocast("cpu", torch.float16)``, which is ~100× slower on this project's CPUs

    Raises
    ------
    ValueError
        Unknown ``recipe``, non-positive ``static_scale``, negative ``grad_shift``.
    """

    def __init__(self, recipe: str, device, *, static_scale: float = 128.0, init_scale: float = 2.0 ** 16,
                 growth_interval: int = 2000, grad_shift: int = 0, simulate_on_cpu: bool = True):
        if recipe not in RECIPES:
            raise ValueError(f"recipe must be one of {RECIPES}, got {recipe!r}")
        if not static_scale > 0:
            raise ValueError(f"static_scale must be > 0, got {static_scale!r}")
        if not isinstance(grad_shift, int) or grad_shift < 0:
            raise ValueError(f"grad_shift must be an int ≥ 0, got {grad_shift!r}")
        self.recipe, self.device = recipe, torch.device(device)
        self.mixed = recipe != "fp32"
        self.real_fp16 = self.mixed and (self.device.type == "cuda" or not simulate_on_cpu)
        self.static_scale, self.grad_shift = float(static_scale), grad_shift
        self.scaler = None
        if recipe == "fp16_static":
            self.scaler = StaticLossScaler(static_scale)
        elif recipe == "fp16_dynamic":
            self.scaler = GradScaler(init_scale=init_scale, growth_interval=growth_interval)
        self._sim = None

    def label(self) -> str:
        """The recipe's label in the book's figures and tables (:data:`RECIPE_LABELS`, with this run's S)."""
        return RECIPE_LABELS[self.recipe].format(S=self.static_scale)

    def get_scale(self) -> float:
        """The loss scale of the next step (1.0 without a scaler)."""
        return float(self.scaler.get_scale()) if self.scaler is not None else 1.0

    def to_float32(self, t: torch.Tensor) -> torch.Tensor:
        """``t`` as the float32 input of a loss: ``t.float()``, and in the emulation :func:`mpt_lab.simulate.to_float32`
        (the gradient coming back is rounded to FP16, as the backward of autocast's cast does)."""
        if self._sim is not None:
            return to_float32(t)
        return t.float()

    @contextlib.contextmanager
    def _forward_context(self):
        if self.mixed and self.real_fp16:
            with torch.autocast(self.device.type, dtype=torch.float16):
                yield
        else:
            yield

    def step(self, forward, optimizer: torch.optim.Optimizer) -> tuple[float, bool]:
        """One training step: ``forward()`` → float32 scalar loss; backward (× 2⁻ᵏ, × S); optimizer step.

        Returns ``(loss, skipped)``: the loss as a Python float (nats, unshifted, unscaled) and whether the
        scaler skipped the update because the scaled gradients held inf/NaN (always False without a scaler:
        the no-scaling arm applies whatever it gets, as a plain FP16 run would).
        """
        optimizer.zero_grad(set_to_none=True)
        sim = simulate("FP16", mode="autocast") if self.mixed and not self.real_fp16 else contextlib.nullcontext()
        with sim:
            self._sim = sim if self.mixed and not self.real_fp16 else None
            try:
                with self._forward_context():
                    loss = forward()
                shifted = loss * 2.0 ** -self.grad_shift if self.grad_shift else loss
                (self.scaler.scale(shifted) if self.scaler is not None else shifted).backward()
            finally:
                self._sim = None
        if self.scaler is None:
            optimizer.step()
            return float(loss.detach()), False
        self.scaler.step(optimizer)
        self.scaler.update()
        return float(loss.detach()), bool(self.scaler.history[-1][2])
