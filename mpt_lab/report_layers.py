"""Which Linear layers a block-format recipe must leave wide: rank the layers by what quantising them costs.

NVIDIA's NVFP4 training recipe keeps "a few sensitive linear layers in higher precision", mostly the last ones
(NVIDIA, "Pretraining Large Language Models with NVFP4", arXiv:2509.25149, §4); Transformer Engine users ask
which layer makes their FP8 loss gap (TransformerEngine issues 764 and 841).  :func:`keep_wide` answers it for
a given model, loss, batch and recipe by running training steps (forward and backward, no optimizer step):

1. the FP32 step (the reference: its loss L₀ and every parameter's gradient g₀);
2. one layer at a time: only layer i computes with the recipe (:class:`mpt_lab.quantized_training.QuantLinear`),
   every other in FP32 — the error that layer alone brings;
3. all but one: every layer with the recipe except layer i, which computes in BF16 — what keeping it wide saves;
4. every layer with the recipe;
5. the smallest set to keep in BF16: the shortest prefix of the ranking that brings the step within the tolerance
   (found by bisection on its length, which assumes that keeping more layers wide does not raise the error), then
   each kept layer but the last is dropped again if the step stays within the tolerance without it (so no kept
   layer can be removed alone; the set is minimal along that order, not searched over all subsets).

The error of a step is measured against the FP32 step: "gradient" (default), the relative L2 error of all
parameter gradients, ‖g − g₀‖ / ‖g₀‖; or "loss", |L − L₀| / |L₀|.  A layer's score is what keeping it in BF16
saves when every other layer uses the recipe (error of step 4 minus error of its all-but-one step), and, when
that sweep is off, its one-at-a-time error.  Layers rank by score, largest first.

Quantised weight operands are computed once per layer and reused in later steps (the weights do not change;
operands rounded to nearest only), which makes the steps after the first cheaper, and gives the same values.
Every step starts from the same random state (the same dropout masks); stochastic rounding draws from a
generator per layer, seeded with ``seed`` in every step.  The model is restored afterwards: its Linear layers,
parameters, buffers, ``.grad``, training flags and the random generators are as they were.
"""

from __future__ import annotations

import math
import numbers
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from ._report_record import ProgressBar, SavedState, check_loss, progress_wanted
from .quantized_training import Quantizer, QuantLinear, TrainingRecipe, get_recipe

__all__ = ["keep_wide", "LayerRanking", "METRICS"]

#: The step errors :func:`keep_wide` can rank by and bound.
METRICS = ("gradient", "loss")


@dataclass
class LayerRanking:
    """What :func:`keep_wide` measured.

    Attributes
    ----------
    recipe : str, the recipe's label
    layers : the candidate Linear layers (module names), in the order the FP32 step first called them
    metric : "gradient" or "loss" (see the module docstring)
    tolerance : float, the bound on the metric that the kept set must meet
    fp32_loss : float
    one : dict layer → {"loss": |ΔL|/|L₀|, "gradient": ‖Δg‖/‖g₀‖} with only that layer on the recipe
    all_but_one : dict layer → the same with every layer but that one on the recipe (that one in BF16); empty when
        that sweep was not run
    every : the same with every layer on the recipe
    score : dict layer → what the ranking sorts by (see the module docstring)
    ranking : the layers, the most harmful first
    keep : the set found to keep in BF16, in ranking order
    kept : {"loss", "gradient"} of the step with ``keep`` in BF16 and the other layers on the recipe
    within : whether that step meets the tolerance (False when even every candidate in BF16 does not)
    steps : the training steps run (forward and backward), the FP32 one included
    ranking_steps : those of them that the ranking took (the FP32 step, one per layer alone, every layer, and with
        ``all_but_one`` one per layer again); the rest searched for :attr:`keep`
    seconds : float, the wall-clock time of the whole of :func:`keep_wide`
    ranking_seconds : float, the part of it up to the ranking (its :attr:`ranking_steps`); the rest searched for
        :attr:`keep`
    """

    recipe: str
    layers: list
    metric: str
    tolerance: float
    fp32_loss: float
    one: dict = field(default_factory=dict)
    all_but_one: dict = field(default_factory=dict)
    every: dict = field(default_factory=dict)
    score: dict = field(default_factory=dict)
    ranking: list = field(default_factory=list)
    keep: list = field(default_factory=list)
    kept: dict = field(default_factory=dict)
    within: bool = False
    steps: int = 0
    ranking_steps: int = 0
    seconds: float = 0.0
    ranking_seconds: float = 0.0

    def positions(self) -> list:
        """The position (0-based, in :attr:`layers`' order) of each kept layer."""
        return sorted(self.layers.index(n) for n in self.keep)

    def last_layers(self) -> bool:
        """Whether the kept layers are the last ``len(keep)`` layers of the step (as NVIDIA's recipe assumes);
        False when nothing is kept."""
        k = len(self.keep)
        return k > 0 and set(self.keep) == set(self.layers[-k:])

    def share_kept(self) -> float:
        """The share of the candidate layers kept in BF16."""
        return len(self.keep) / len(self.layers) if self.layers else 0.0

    def table(self) -> list:
        """One row per layer in ranking order: [layer, position, one-at-a-time error, all-but-one error, score,
        kept] with errors in the ranking's metric."""
        rows = []
        for n in self.ranking:
            rows.append(
                [
                    n,
                    self.layers.index(n),
                    self.one[n][self.metric],
                    self.all_but_one[n][self.metric] if n in self.all_but_one else None,
                    self.score[n],
                    n in self.keep,
                ]
            )
        return rows

    def to_dict(self) -> dict:
        """A JSON-ready dict of every attribute."""
        return {
            k: getattr(self, k)
            for k in (
                "recipe",
                "layers",
                "metric",
                "tolerance",
                "fp32_loss",
                "one",
                "all_but_one",
                "every",
                "score",
                "ranking",
                "keep",
                "kept",
                "within",
                "steps",
                "ranking_steps",
                "seconds",
                "ranking_seconds",
            )
        }


def _linear_like(m: nn.Module) -> bool:
    """nn.Linear, or Hugging Face transformers' ``Conv1D`` (GPT-2's linear layers: y = x W + b, W of shape
    (in, out))."""
    if isinstance(m, nn.Linear):
        return True
    return (
        type(m).__name__ == "Conv1D"
        and hasattr(m, "nf")
        and isinstance(getattr(m, "weight", None), torch.Tensor)
        and m.weight.dim() == 2
    )


def _quantizer_class():
    """A Quantizer that quantises each weight operand once (a cache per layer, kept across keep_wide's steps: the
    weights do not change between them): only operands rounded to nearest, never recorded statistics, never
    delayed scaling."""

    class CachingQuantizer(Quantizer):
        def __init__(self, recipe, *, seed: int, cache: dict):
            super().__init__(recipe, seed=seed)
            self._cache = cache

        def _key(self, t, *extra):
            return (t.data_ptr(), t._version, tuple(t.shape), tuple(t.stride()), t.dtype, *extra)

        def quantize_operand(self, t, op, *, layer=None, role=None, record=False):
            if role != "w" or op.rounding != "nearest_even" or (record and self.recording):
                return super().quantize_operand(t, op, layer=layer, role=role, record=record)
            key = self._key(t, "operand", op)
            hit = self._cache.get(key)
            if hit is None:
                hit = self._cache[key] = super().quantize_operand(t, op, layer=layer, role=role, record=record)
            return hit

        def quantize(self, t, layer, role, *, axis=-1, record=True, update=True):
            if role != "w" or self.recipe.scaling == "delayed" or (record and self.recording):
                return super().quantize(t, layer, role, axis=axis, record=record, update=update)
            key = self._key(t, "quantize", axis)
            hit = self._cache.get(key)
            if hit is None:
                hit = self._cache[key] = super().quantize(t, layer, role, axis=axis, record=record, update=update)
            return hit

    return CachingQuantizer


class _Switch(nn.Module):
    """A linear layer (nn.Linear, or transformers' Conv1D) that computes in FP32, with a recipe or in BF16, as
    :attr:`mode` says; it shares the layer's parameters (the recipe reads a Conv1D's weight transposed, as the
    weight of x · Wᵀ)."""

    def __init__(self, layer: nn.Module, name: str, recipe, seed: int):
        super().__init__()

        self.layer = layer
        self.mode = "fp32"
        self.recipe, self.seed, self.name = recipe, seed, name
        self._cache: dict = {}
        self._bf16_cache: dict = {}
        self._quantizer = _quantizer_class()
        if isinstance(layer, nn.Linear):
            proxy = layer
        else:  # Conv1D: a Linear view of its parameters
            proxy = nn.Linear(layer.weight.shape[0], layer.weight.shape[1], bias=layer.bias is not None, device="meta")
        self.q = QuantLinear(proxy, name, self._quantizer(recipe, seed=seed, cache=self._cache))
        self.b = QuantLinear(proxy, name, self._quantizer("bf16", seed=seed, cache=self._bf16_cache))
        if not isinstance(layer, nn.Linear):
            for ql in (self.q, self.b):  # not parameters of their own: the Conv1D's, transposed
                del ql.weight
                del ql.bias

    def fresh(self) -> None:
        """A new quantiser (the same stochastic-rounding draws, no delayed-scaling history; the weights' quantised
        operands kept) for the next step."""
        self.q.quantizer = self._quantizer(self.recipe, seed=self.seed, cache=self._cache)

    def _quantized(self, ql, x):
        if isinstance(self.layer, nn.Linear):
            return ql(x)
        ql.weight, ql.bias = self.layer.weight.t(), self.layer.bias
        try:
            return ql(x)
        finally:
            del ql.weight, ql.bias

    def forward(self, x):
        if self.mode == "recipe":
            return self._quantized(self.q, x)
        if self.mode == "bf16":
            return self._quantized(self.b, x)
        return self.layer(x)


def _squared_distance(a: torch.Tensor, b: torch.Tensor, buffer: list | None = None) -> float:
    """``Σ (a − b)²`` in float64, each difference and square exact as in ``((a.double() - b.double()) ** 2).sum()``
    (float32 values converted exactly; the difference of two float32 values and its square are exact in float64
    but for a rounding of ``2⁻⁵³`` relative); contiguous float32 tensors of one shape are read in pieces of
    :data:`_PIECE` values, each piece's squares summed by a float64 dot product, so that the float64 temporary
    stays in the cache (one pass over a and b, where the whole-tensor formula makes four over a float64 copy).
    The sum's order differs from ``.sum()``'s: the result agrees with it to the float64 rounding of a sum
    (relative ~10⁻¹⁵), not bit for bit.  Float32 tensors of one shape with other strides are read alike (as flat
    views when both are the same permutation of a contiguous block; else in logical order).  ``buffer``: a list holding the float64 temporary, reused from call to
    call."""
    if a.dtype == b.dtype == torch.float32 and a.shape == b.shape:
        # both permuted alike so that their strides fall (two transposed weight gradients become contiguous):
        # flat views without a copy; otherwise in logical order (a copy where not contiguous)
        order = sorted(range(a.dim()), key=lambda i: -a.stride(i))
        pa, pb = a.permute(order), b.permute(order)
        if pa.is_contiguous() and pb.is_contiguous():
            a, b = pa.reshape(-1), pb.reshape(-1)
        else:
            a, b = a.reshape(-1), b.reshape(-1)
        n = a.numel()
        piece = min(n, _PIECE)
        if buffer is None:
            buffer = []
        if not buffer or buffer[0].numel() < piece or buffer[0].device != a.device:
            buffer[:] = [torch.empty(max(piece, 1), dtype=torch.float64, device=a.device)]
        total = 0.0
        for start in range(0, n, _PIECE):
            m = min(_PIECE, n - start)
            d = buffer[0][:m]
            d.copy_(a[start : start + m])
            d.sub_(b[start : start + m])
            total += float(torch.dot(d, d))
        return total
    return float(((a.double() - b.double()) ** 2).sum())


#: Values per piece of :func:`_squared_distance` (a 2 MiB float64 temporary).
_PIECE = 1 << 18


def keep_wide(
    model: nn.Module,
    loss_fn: Callable,
    batch: Any,
    recipe: str | TrainingRecipe = "nvfp4",
    *,
    tolerance: float = 0.05,
    metric: str = "gradient",
    all_but_one: bool = True,
    skip: Iterable[str] = (),
    seed: int = 0,
    progress: bool | None = None,
) -> LayerRanking:
    """Rank the Linear layers of ``model`` by what ``recipe`` costs in each, and find the smallest set to keep in
    BF16 so that one training step stays within ``tolerance`` of FP32 (see the module docstring).

    Parameters
    ----------
    model : nn.Module with nn.Linear layers (or transformers' ``Conv1D``, GPT-2's linear layers)
    loss_fn : callable ``loss_fn(model, batch) -> scalar loss`` (as :func:`mpt_lab.report.precision_report`)
    batch : passed to ``loss_fn`` as is
    recipe : a :class:`~mpt_lab.quantized_training.TrainingRecipe` or its name ("nvfp4", "mxfp4", "mxfp8",
        "fp8_current", ...; :func:`~mpt_lab.quantized_training.four_bit_recipe` for NVIDIA's full NVFP4 recipe)
    tolerance : float > 0, the largest error (``metric``) the kept set must reach
    metric : "gradient" (relative L2 error of all parameter gradients) or "loss" (relative change of the loss)
    all_but_one : bool, also run the all-but-one sweep (one step per layer) and rank by it (default); False ranks by
        the one-at-a-time errors alone
    skip : names of Linear layers that are no candidates: they compute in BF16 in every step but the FP32 one
        (e.g. an output layer a recipe always keeps wide)
    seed : int ≥ 0, seeds the stochastic rounding of each layer's quantiser (a fresh quantiser per layer and step,
        so a layer alone on the recipe draws what ``quantize_linears_(model, recipe, seed=seed)`` would)
    progress : bool or None, a ``tqdm.auto`` bar over the steps (None: unless ``MPT_LAB_PROGRESS`` is "0")

    Returns
    -------
    LayerRanking

    Raises
    ------
    TypeError
        ``model`` not a Module; ``loss_fn`` not callable; ``skip`` not a sequence of names; ``tolerance`` or
        ``seed`` of a wrong type; ``loss_fn`` returned no scalar floating tensor.
    ValueError
        No Linear layer to rank; unknown recipe, metric or layer name in ``skip``; ``tolerance`` ≤ 0; a loss that
        does not require grad.

    Source: NVIDIA, "Pretraining Large Language Models with NVFP4" (arXiv:2509.25149), §4 (selective
    high-precision layers).
    """

    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if not callable(loss_fn):
        raise TypeError(f"loss_fn must be callable as loss_fn(model, batch), got {type(loss_fn).__name__}")
    rec = get_recipe(recipe)
    if isinstance(tolerance, bool) or not isinstance(tolerance, numbers.Real) or not (tolerance > 0):
        raise ValueError(f"tolerance must be a positive number, got {tolerance!r}")
    if metric not in METRICS:
        raise ValueError(f"metric must be one of {METRICS}, got {metric!r}")
    if not isinstance(all_but_one, bool):
        raise TypeError(f"all_but_one must be a bool, got {type(all_but_one).__name__}")
    if isinstance(skip, str) or not all(isinstance(s, str) for s in skip):
        raise TypeError("skip must be a sequence of module names (str)")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise TypeError(f"seed must be an int ≥ 0, got {seed!r}")
    linears = [(n, m) for n, m in model.named_modules() if _linear_like(m)]
    unknown = set(skip) - {n for n, _ in linears}
    if unknown:
        raise ValueError(f"skip names {sorted(unknown)}, which are not Linear layers of the model")
    if not [n for n, _ in linears if n not in skip]:
        raise ValueError(f"model ({type(model).__name__}) has no Linear layer to rank")

    started = time.perf_counter()
    state = SavedState(model)
    switches: dict = {}
    bar = ProgressBar(progress_wanted(progress), "keep_wide")
    try:
        for k, (name, lin) in enumerate(linears):
            parent_name, _, child = name.rpartition(".")
            parent = model.get_submodule(parent_name) if parent_name else model
            sw = _Switch(lin, name, rec, seed)
            setattr(parent, child, sw)
            switches[name] = (parent, child, lin, sw)
        order: list = []

        def first_call(name):
            def hook(mod, args, out):
                if name not in order:
                    order.append(name)

            return hook

        params = [p for p in model.parameters() if p.requires_grad]

        def step(modes: dict, record_order: bool = False):
            """One forward and backward with each layer in its mode; returns (loss, gradients)."""
            state.begin_step()
            handles = []
            for name, (_, _, _, sw) in switches.items():
                sw.mode = "bf16" if name in skip and modes is not None else (modes or {}).get(name, "fp32")
                sw.fresh()
                if record_order:
                    handles.append(sw.register_forward_hook(first_call(name)))
            try:
                loss = check_loss(loss_fn(model, batch), "keep_wide's step")
                value = float(loss.detach())
                grads = torch.autograd.grad(loss, params, allow_unused=True)
            finally:
                for h in handles:
                    h.remove()
                state.restore_values()
            bar(None)
            return value, [None if g is None else g.detach() for g in grads]

        bar.step("FP32 step")
        l0, g0 = step(None, record_order=True)
        norm0 = math.sqrt(sum(float((g.double() ** 2).sum()) for g in g0 if g is not None))
        candidates = [n for n in order if n not in skip] + [n for n, _ in linears if n not in order and n not in skip]
        n_steps = 1 + len(candidates) * (2 if all_but_one else 1) + 1
        bar.set_total(n_steps)

        buffer: list = []  # the float64 temporary of _squared_distance, reused

        def error(modes) -> dict:
            loss, g = step(modes)
            d2 = 0.0
            for a, b in zip(g, g0):
                if a is None and b is None:
                    continue
                a = torch.zeros_like(b) if a is None else a
                b = torch.zeros_like(a) if b is None else b
                d2 += _squared_distance(a, b, buffer)
            return {
                "loss": abs(loss - l0) / abs(l0) if l0 else abs(loss),
                "gradient": math.sqrt(d2) / norm0 if norm0 > 0 else math.sqrt(d2),
            }

        out = LayerRanking(rec.label, candidates, metric, float(tolerance), l0)
        steps = 1
        bar.step("one layer at a time")
        for n in candidates:
            out.one[n] = error({n: "recipe"})
            steps += 1
        bar.step("every layer")
        out.every = error({n: "recipe" for n in candidates})
        steps += 1
        if all_but_one:
            bar.step("all but one")
            for n in candidates:
                modes = {m: "recipe" for m in candidates}
                modes[n] = "bf16"
                out.all_but_one[n] = error(modes)
                steps += 1
            out.score = {n: out.every[metric] - out.all_but_one[n][metric] for n in candidates}
        else:
            out.score = {n: out.one[n][metric] for n in candidates}
        out.ranking_steps = steps
        out.ranking_seconds = time.perf_counter() - started
        out.ranking = sorted(candidates, key=lambda n: (-out.score[n], -out.one[n][metric], candidates.index(n)))

        def with_kept(kept) -> dict:
            return error({m: ("bf16" if m in kept else "recipe") for m in candidates})

        bar.step("the smallest set to keep")
        keep: list = []
        current = out.every
        if current[metric] > tolerance:
            # the shortest prefix of the ranking that brings the step within the tolerance, by bisection on its
            # length (errors fall as more layers stay wide); then each kept layer but the last is dropped again
            # if the step stays within the tolerance without it
            known = {0: out.every}
            if all_but_one:
                known[1] = out.all_but_one[out.ranking[0]]

            def prefix(k):
                nonlocal steps
                if k not in known:
                    known[k] = with_kept(out.ranking[:k])
                    steps += 1
                return known[k]

            lo, hi = 0, len(out.ranking)
            # the bar's total, so far the ranking's steps: the bisection's at most, then the pruning's
            bar.set_total(steps + 1 + math.ceil(math.log2(max(hi, 1))))
            if prefix(hi)[metric] <= tolerance:
                while hi - lo > 1:
                    mid = (lo + hi) // 2
                    if prefix(mid)[metric] <= tolerance:
                        hi = mid
                    else:
                        lo = mid
            keep, current = list(out.ranking[:hi]), prefix(hi)
            if current[metric] <= tolerance:
                bar.set_total(steps + max(len(keep) - 1, 0))
                for n in list(reversed(keep))[1:]:
                    trial = [m for m in keep if m != n]
                    e = with_kept(trial)
                    steps += 1
                    if e[metric] <= tolerance:
                        keep, current = trial, e
        out.keep = [n for n in out.ranking if n in keep]
        out.kept = current
        out.within = current[metric] <= tolerance
        out.steps = steps
        out.seconds = time.perf_counter() - started
        return out
    finally:
        for parent, child, lin, _ in switches.values():
            setattr(parent, child, lin)
        state.restore()
        bar.close()
