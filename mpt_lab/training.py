"""The small pieces of a training loop that every experiment shares, written once.

* :func:`shuffled_batches`: indices of mini-batches drawn in shuffled epochs (a new permutation whenever the
  previous one is used up), reproducible from a generator;
* :func:`backward_step`: backward and optimizer step, through a loss scaler when one is given (the
  ``torch.amp.GradScaler`` contract: ``scale(loss).backward(); step(optimizer); update()``);
* :func:`accuracy`: the share of correct arg-max predictions;
* :func:`autocast_to`: ``torch.autocast`` for a lower-precision dtype, nothing for float32;
* :class:`StaticStep`: one whole training step on static input buffers, captured in a CUDA graph on CUDA and
  replayed (the step as the GPU sees it, without the host's per-operator launches);
* :func:`lr_factor`: a learning-rate schedule, linear warm-up then cosine decay;
* :class:`RecipeRun`: training steps in one recipe of :data:`mpt_lab.recipes.LOSS_SCALING` (FP32, or mixed FP16
  without loss scaling, with a static S or a dynamic one), real autocast on CUDA and its emulation on a CPU, with
  the *gradient shift* (below); :func:`shift_eps` and :func:`collect_arms` go with it;
* :func:`lm_optimizer`, :func:`lm_step`: bigLSTM's optimizer and one truncated-BPTT step of a language model in
  a :class:`RecipeRun`.

These are the plain-PyTorch loops of the PyTorch AMP recipe (Carilli, "Automatic Mixed Precision"); the
numerics the book studies (rounding, loss scaling) live in :mod:`mpt_lab.formats` and :mod:`mpt_lab.scaling`,
and what each recipe is in :mod:`mpt_lab.recipes`.

The gradient shift
------------------
``grad_shift = k`` multiplies the loss by 2⁻ᵏ before backward, so every gradient is 2ᵏ times smaller, and
multiplies the optimizer's ``eps`` by 2⁻ᵏ as well (:func:`shift_eps`).  Adagrad and Adam (the optimizers of
bigLSTM and of our detector) divide each gradient by the root of its accumulated squares, so for them a
power-of-two gradient scale cancels *exactly*, bit for bit, in float32 (scaling by a power of two commutes with
rounding while values stay normal): an FP32 run does not change at all.  In FP16 it moves the gradient histogram k
binades towards FP16's underflow threshold 2⁻²⁴, which is how the book places a small model's gradients where the
paper's large models had theirs (mean losses over more tokens, more pixels, bigger layers all make per-value
gradients smaller).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator

import torch
import torch.nn.functional as F

from .recipes import LOSS_SCALING, RECIPES, LossScaling
from .scaling import GradScaler, StaticLossScaler
from .simulate import simulate, to_float32

__all__ = [
    "shuffled_batches",
    "backward_step",
    "accuracy",
    "autocast_to",
    "StaticStep",
    "CAPTURES",
    "lr_factor",
    "RecipeRun",
    "shift_eps",
    "collect_arms",
    "lm_optimizer",
    "lm_step",
]


def shuffled_batches(
    n: int, batch_size: int, *, generator: torch.Generator | None = None, seed: int = 0
) -> Iterator[torch.Tensor]:
    """Endless mini-batches of indices into a data set of ``n`` items, in shuffled epochs.

    Each epoch is a fresh ``torch.randperm(n, generator=generator)``; batches are consecutive slices of
    ``batch_size`` indices, and an epoch's tail shorter than a batch is dropped (so every batch has the same
    shape).  With the same generator state the sequence is the same, so runs that must see the same data (the
    arms of a precision comparison) each call this with a generator seeded alike.

    Parameters
    ----------
    n : int ≥ batch_size, the number of items
    batch_size : int ≥ 1
    generator : torch.Generator (CPU); default a new one seeded with ``seed``

    Yields
    ------
    int64 tensor [batch_size] of indices in [0, n).

    Raises
    ------
    ValueError
        ``batch_size < 1`` or ``n < batch_size``.
    """
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be an int ≥ 1, got {batch_size!r}")
    if not isinstance(n, int) or n < batch_size:
        raise ValueError(f"n must be an int ≥ batch_size = {batch_size}, got {n!r}")
    gen = generator if generator is not None else torch.Generator().manual_seed(seed)
    while True:
        order = torch.randperm(n, generator=gen)
        for pos in range(0, n - batch_size + 1, batch_size):
            yield order[pos : pos + batch_size]


def backward_step(
    loss: torch.Tensor, optimizer: torch.optim.Optimizer, scaler: GradScaler | torch.amp.GradScaler | None = None
) -> None:
    """Backward and optimizer step, through a loss scaler when one is given (scale, step, update).

    ``scaler`` is anything with the ``torch.amp.GradScaler`` contract (:class:`mpt_lab.scaling.GradScaler`,
    :class:`~mpt_lab.scaling.StaticLossScaler`, torch's own) or None for ``loss.backward(); optimizer.step()``.
    The caller zeroes the gradients.
    """
    if scaler is not None:
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
    else:
        loss.backward()
        optimizer.step()


@torch.no_grad()
def accuracy(logits: torch.Tensor, labels: torch.Tensor) -> float:
    """Share (0 to 1) of rows of ``logits`` [N, C] whose arg-max equals ``labels`` [N] (int64).

    Raises
    ------
    ValueError
        ``logits`` is not 2-D or the lengths differ.
    """
    if logits.dim() != 2 or labels.shape != logits.shape[:1]:
        raise ValueError(f"logits must be [N, C] and labels [N], got {tuple(logits.shape)} and {tuple(labels.shape)}")
    return float((logits.argmax(1) == labels).float().mean())


def autocast_to(device_type: str, dtype: torch.dtype | None) -> contextlib.AbstractContextManager:
    """``torch.autocast(device_type, dtype=dtype)`` for float16/bfloat16; a no-op context for None or float32.

    (``torch.autocast`` with float32 on a CPU warns that the dtype is unsupported; an FP32 baseline should
    simply run without autocast.)
    """
    if dtype is None or dtype == torch.float32:
        return contextlib.nullcontext()
    return torch.autocast(device_type, dtype=dtype)


#: How :class:`StaticStep` runs: "cuda_graph" (captured once with ``torch.cuda.graph``, replayed), "eager"
#: (the same step run op by op: a CPU, or a check), "auto" (a CUDA graph on CUDA, eager elsewhere).
CAPTURES = ("auto", "cuda_graph", "eager")


class StaticStep:
    """One training step — forward under autocast, loss, backward through a loss scaler, optimizer step — on
    static input buffers, so that it can be captured whole in a CUDA graph and replayed.

    The eager loop of the PyTorch AMP recipe (Carilli, "Automatic Mixed Precision") launches each of its
    operators from Python; when the matrix products are short, the host's launches, not the tensor cores, set
    the time of a step.  This is the same step as the GPU sees it: inputs are copied into buffers that never
    move, the optimizer must keep the scaler's inf check on the device (``torch.optim.SGD(..., fused=True)``:
    ``torch.amp.GradScaler.step`` then hands ``found_inf`` to the fused kernel instead of reading it back with
    ``.item()``, which a capture forbids), autocast runs with ``cache_enabled=False`` (the PyTorch CUDA-graphs
    notes), and after ``warmup`` eager steps on a side stream the whole step is captured once
    (``torch.cuda.graph``) and each call replays it.  Each call trains one step on the data it is given (the
    buffers hold it; the loss of the last replay is in :attr:`loss`).

    Parameters
    ----------
    model : torch.nn.Module (FP32 parameters), on ``x``'s device
    loss_fn : callable(output, y) → scalar loss
    optimizer : torch.optim.Optimizer over the model's parameters; for a CUDA graph with a scaler, one whose
        step keeps found_inf on the device (``fused=True``)
    x, y : tensors of the input and target shape (copied into the static buffers)
    dtype : autocast dtype (torch.float16, torch.bfloat16) or None / torch.float32 for none
    scaler : ``torch.amp.GradScaler`` or None
    capture : one of :data:`CAPTURES`
    warmup : eager steps before the capture (≥ 1 with a CUDA graph: they create the gradients, the optimizer
        state and the scaler's scale)

    Attributes: ``captured`` ("cuda_graph" or "eager"), ``loss`` (the last step's loss, a 0-d tensor on the
    device), ``static_x``, ``static_y``.

    Raises
    ------
    TypeError
        ``model`` is not a torch.nn.Module or ``x``/``y`` are not tensors.
    ValueError
        An unknown ``capture``, "cuda_graph" without CUDA tensors, ``warmup`` < 0 (< 1 for a CUDA graph).
    """

    def __init__(
        self, model, loss_fn, optimizer, x, y, *, dtype=None, scaler=None, capture: str = "auto", warmup: int = 3
    ):
        if not isinstance(model, torch.nn.Module):
            raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
        if not isinstance(x, torch.Tensor) or not isinstance(y, torch.Tensor):
            raise TypeError("x and y must be tensors")
        if capture not in CAPTURES:
            raise ValueError(f"capture must be one of {CAPTURES}, got {capture!r}")
        cuda = x.device.type == "cuda"
        if capture == "auto":
            capture = "cuda_graph" if cuda else "eager"
        if capture == "cuda_graph" and not cuda:
            raise ValueError(f"capture='cuda_graph' needs CUDA tensors, got x on {x.device}")
        if not isinstance(warmup, int) or warmup < (1 if capture == "cuda_graph" else 0):
            raise ValueError(f"warmup must be an int ≥ {1 if capture == 'cuda_graph' else 0}, got {warmup!r}")
        self.model, self.loss_fn, self.optimizer, self.scaler = model, loss_fn, optimizer, scaler
        self.dtype = None if dtype in (None, torch.float32) else dtype
        self.static_x, self.static_y = x.detach().clone(), y.detach().clone()
        self.captured, self.loss, self._graph = capture, None, None
        if capture == "cuda_graph":
            side = torch.cuda.Stream(device=x.device)
            side.wait_stream(torch.cuda.current_stream(x.device))
            with torch.cuda.stream(side):
                for _ in range(warmup):
                    self._step()
            torch.cuda.current_stream(x.device).wait_stream(side)
            self.optimizer.zero_grad(set_to_none=True)
            self._graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self._graph):
                self._step(zero=False)
        else:
            for _ in range(warmup):
                self._step()

    def _step(self, zero: bool = True) -> None:
        if zero:
            self.optimizer.zero_grad(set_to_none=True)
        if self.dtype is None:
            ctx = contextlib.nullcontext()
        else:
            ctx = torch.autocast(self.static_x.device.type, dtype=self.dtype, cache_enabled=False)
        with ctx:
            loss = self.loss_fn(self.model(self.static_x), self.static_y)
        backward_step(loss, self.optimizer, self.scaler)
        self.loss = loss.detach()

    def __call__(self, x: torch.Tensor | None = None, y: torch.Tensor | None = None) -> None:
        """One training step on ``x``, ``y`` (copied into the static buffers; None: the data already there)."""
        if x is not None:
            self.static_x.copy_(x)
        if y is not None:
            self.static_y.copy_(y)
        if self._graph is not None:
            self._graph.replay()
        else:
            self._step()


def lr_factor(step: int, steps: int, warmup: float = 0.1, floor: float = 0.1) -> float:
    """The learning-rate multiplier at ``step`` (0-based) of ``steps``: linear warm-up over the first
    ``warmup`` share of the steps, then cosine decay to ``floor``."""
    w = max(1, round(warmup * steps))
    if step < w:
        return (step + 1) / w
    frac = (step - w) / max(1, steps - w)
    return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * min(1.0, frac)))


def collect_arms(out: dict[str, dict]) -> dict:
    """The result fields shared by the divergence experiments, from ``{recipe: dict returned by its training
    loop}`` (which holds "label", "real_fp16" and "seconds" besides the run's records): ``arms`` (one run per
    recipe), ``labels``, ``real_fp16``, ``train_seconds``."""
    meta = ("label", "real_fp16", "seconds")
    return {
        "arms": {a: {k: v for k, v in d.items() if k not in meta} for a, d in out.items()},
        "labels": {a: d["label"] for a, d in out.items()},
        "real_fp16": any(d["real_fp16"] for d in out.values()),
        "train_seconds": {a: d["seconds"] for a, d in out.items()},
    }


def shift_eps(optimizer: torch.optim.Optimizer, grad_shift: int) -> None:
    """Multiply every parameter group's ``eps`` by 2⁻ᵏ (``k = grad_shift``), so that Adagrad/Adam stay exactly
    invariant to gradients scaled by 2⁻ᵏ.  Raises ValueError when the optimizer has no ``eps``."""
    if grad_shift == 0:
        return
    for group in optimizer.param_groups:
        if "eps" not in group:
            raise ValueError(f"grad_shift needs an optimizer with eps (Adagrad, Adam), got {type(optimizer).__name__}")
        group["eps"] = group["eps"] * 2.0**-grad_shift


class RecipeRun:
    """Run training steps in one recipe of :data:`mpt_lab.recipes.LOSS_SCALING` on ``device``.

    Mixed precision is real ``torch.autocast(dtype=torch.float16)`` on CUDA and, on a CPU (no fast float16
    kernels), the emulation ``mpt_lab.simulate.simulate("FP16", mode="autocast")`` with forward *and* backward
    inside the block; :attr:`real_fp16` says which.

    Parameters
    ----------
    recipe : str in :data:`mpt_lab.recipes.LOSS_SCALING` (a name of :data:`mpt_lab.recipes.RECIPES`)
    device : torch.device or str; CUDA runs real float16 autocast, a CPU the emulation
    static_scale : float > 0, the loss scale S of ``"fp16_static"`` (the paper: 128 for bigLSTM, 8 for SSD)
    init_scale, growth_interval : the dynamic scaler's settings (``"fp16"``)
    grad_shift : int ≥ 0, the loss is multiplied by 2⁻ᵏ (see the module docstring; pair it with
        :func:`shift_eps` on the optimizer)
    simulate_on_cpu : bool, emulate FP16 with :mod:`mpt_lab.simulate` on a CPU (default); False uses real
        ``torch.autocast("cpu", torch.float16)``, which is many times slower on CPUs where oneDNN has no float16 kernel

    Raises
    ------
    ValueError
        Unknown ``recipe``, non-positive ``static_scale``, negative ``grad_shift``.
    """

    def __init__(
        self,
        recipe: str,
        device: torch.device | str,
        *,
        static_scale: float = 128.0,
        init_scale: float = 2.0**16,
        growth_interval: int = 2000,
        grad_shift: int = 0,
        simulate_on_cpu: bool = True,
    ):
        if recipe not in LOSS_SCALING:
            raise ValueError(f"recipe must be one of {LOSS_SCALING}, got {recipe!r}")
        if not static_scale > 0:
            raise ValueError(f"static_scale must be > 0, got {static_scale!r}")
        if not isinstance(grad_shift, int) or grad_shift < 0:
            raise ValueError(f"grad_shift must be an int ≥ 0, got {grad_shift!r}")
        self.recipe, self.device = recipe, torch.device(device)
        self.spec = RECIPES[recipe]
        self.mixed = self.spec.autocast is not None
        self.real_fp16 = self.mixed and (self.device.type == "cuda" or not simulate_on_cpu)
        self.static_scale, self.grad_shift = float(static_scale), grad_shift
        self.scaler = None
        if self.spec.loss_scaling is LossScaling.STATIC:
            self.scaler = StaticLossScaler(static_scale)
        elif self.spec.loss_scaling is LossScaling.DYNAMIC:
            self.scaler = GradScaler(init_scale=init_scale, growth_interval=growth_interval)
        self._sim = None

    def label(self) -> str:
        """The recipe's label in the book's figures and tables (:class:`~mpt_lab.recipes.Recipe`'s ``label``,
        followed by this run's S for a static loss scale)."""
        if self.spec.loss_scaling is LossScaling.STATIC:
            return f"{self.spec.label} {self.static_scale:g}"
        return self.spec.label

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

    def step(self, forward: Callable[[], torch.Tensor], optimizer: torch.optim.Optimizer) -> tuple[float, bool]:
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
                shifted = loss * 2.0**-self.grad_shift if self.grad_shift else loss
                (self.scaler.scale(shifted) if self.scaler is not None else shifted).backward()
            finally:
                self._sim = None
        if self.scaler is None:
            optimizer.step()
            return float(loss.detach()), False
        self.scaler.step(optimizer)
        self.scaler.update()
        return float(loss.detach()), bool(self.scaler.history[-1][2])


def lm_optimizer(model: torch.nn.Module, lr: float, adagrad_init: float, grad_shift: int = 0) -> torch.optim.Adagrad:
    """bigLSTM's optimizer, Adagrad (Jozefowicz et al. 2016), made exactly invariant to a gradient shift k: the
    initial accumulator (squared gradients) × 4⁻ᵏ and eps × 2⁻ᵏ (:func:`shift_eps`)."""
    opt = torch.optim.Adagrad(model.parameters(), lr=lr, initial_accumulator_value=adagrad_init * 4.0**-grad_shift)
    shift_eps(opt, grad_shift)
    return opt


def lm_step(
    model: torch.nn.Module,
    arm: RecipeRun,
    optimizer: torch.optim.Optimizer,
    x: torch.Tensor,
    y: torch.Tensor,
    state: tuple | None = None,
) -> tuple[float, bool, tuple]:
    """One truncated-BPTT training step of a language model in ``arm``: the mean cross-entropy of predicting
    ``y`` from ``x`` (int64 [T, B]) starting from ``state`` (detached here; None: zeros), backward, update.

    Returns ``(loss, skipped, state)``: the loss in nats per token, whether the scaler skipped the update, and
    the recurrent state after the window (for the next one).
    """
    if state is not None:
        state = tuple(s.detach() for s in state)
    box = {}

    def forward():
        logits, box["state"] = model(x, state)
        return F.cross_entropy(arm.to_float32(logits).reshape(-1, model.vocab_size), y.reshape(-1))

    loss, skipped = arm.step(forward, optimizer)
    return loss, skipped, box["state"]
