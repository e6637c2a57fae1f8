"""Emulate FP16, BF16 or FP8 numerics in an ordinary FP32 PyTorch model, at FP32 speed.

On CPUs without fast float16 kernels (where oneDNN has no float16 kernel, float16 matrix products run many times
slower than float32) the book still needs FP16 *numerics*: which values underflow, which gradients vanish, how the loss
curve moves.  :class:`simulate` runs the model in float32 and rounds the floating-point results of the ops it
executes to a format with :func:`mpt_lab.formats.round_to` semantics (IEEE 754 round-to-nearest-even,
subnormals, overflow to infinity / NaN as the format has them).  Values stay ``torch.float32`` tensors that hold
exactly representable values of the format.

.. code-block:: python

    from mpt_lab.simulate import simulate, round_parameters_

    with simulate("FP16", mode="autocast"):          # like torch.autocast("cuda", torch.float16)
        loss = loss_fn(model(x), y)
        loss.backward()                              # backward inside the block: gradients are rounded too

    round_parameters_(model, "FP16")                 # a pure FP16 model (like model.half()) ...
    with simulate("FP16", mode="all"):               # ... where every op computes in FP16
        loss = loss_fn(model(x), y)
        loss.backward()
        optimizer.step()                             # the update is rounded too, as for FP16 weights

How it works
------------
:class:`simulate` is a ``TorchDispatchMode`` (see :mod:`mpt_lab._torch_internals`): it sees every ATen op below
autograd, so it sees the forward ops *and* the ops autograd's backward pass runs (``mm``, ``threshold_backward``,
``convolution_backward``, …).  It decides which ops compute in ``fmt`` (below) and gives each of them ``fmt``
results: the result of the real kernel of ``fmt``'s dtype where PyTorch has one, else the op computed in float32
and rounded (fresh outputs, and the tensors an in-place or ``out=`` op writes; see "Which kernel computes an
op").  Which ops compute in ``fmt``:

``mode="all"`` (a pure ``model.half()`` run):
    every op's floating tensor inputs are rounded to ``fmt`` (inputs that the mode itself produced are known
    to be rounded already and are not rounded again) and its floating outputs are rounded.  View ops
    (``view``, ``t``, ``expand``, ``detach``, …) move no values and are left alone.  Tensors that stay float32
    beside a ``.half()`` model stay float32 here too: a 0-dim tensor from outside the block that is no
    ``nn.Parameter`` (an optimizer's step count, a GradScaler's scale, ``torch.tensor(0.1)``), and a float32
    output of a real kernel (layer norm's saved mean and 1/std); an op whose floating inputs are all such
    tensors runs in float32, unrounded (e.g. Adam's ``step += 1``, which in FP16 would stop at 2048 and in
    BF16 at 256).  In backward every 0-dim input is taken as ``fmt`` (autograd casts each gradient to the
    dtype of its tensor).
``mode="autocast"`` (a ``torch.autocast(device, dtype=fmt)`` run, lists mirrored from PyTorch's CUDA float16
autocast op reference, https://pytorch.org/docs/stable/amp.html#cuda-ops-that-can-autocast-to-float16):
    * *lower-precision ops* (:data:`LOWER_PRECISION_OPS`: ``mm``, ``addmm``, ``bmm``, ``baddbmm``, ``addbmm``,
      ``addmv``, ``addr``, ``mv``, ``dot``, ``convolution`` and ``convolution_backward`` — that is
      ``linear``, ``matmul``, ``@``, ``conv1d/2d/3d``, ``conv_transpose1d/2d/3d``, and the LSTM/GRU/RNN cells
      that decompose into them — ``prelu``, the fused LSTM/GRU cells and scaled-dot-product attention):
      inputs and outputs are rounded, as autocast casts their inputs to float16 and the kernel returns
      float16;
    * *float32 ops* (:data:`FLOAT32_OPS`: softmax, log_softmax, the losses, ``layer_norm``, ``group_norm``,
      ``norm``, ``exp``, ``log``, ``pow``, ``sum``, ``prod``, ``cumsum``, ``rsqrt``, ``reciprocal``, …): not
      rounded (autocast runs them in float32);
    * every other op runs, as under autocast, "in the widest input type": its output is rounded when all its
      floating tensor inputs are ``fmt`` values produced inside the block (e.g. ``relu`` or ``max_pool2d`` of a
      linear/conv output), and left in float32 as soon as one input is float32 (e.g. ``x16 + x32``).
      Batch norm follows its ``input``.
    During backward autocast is not active; each backward op computes, by type promotion, in the dtype of its
    inputs (the incoming gradient and the tensors saved in forward), and autograd casts the gradient of every
    tensor to that tensor's dtype.  So a backward op's outputs are rounded when all its floating inputs are
    ``fmt`` values (lower-precision ops round inputs and outputs as in forward), and the gradient that reaches
    an ``fmt`` tensor of the forward pass is rounded however it was computed (a tensor hook registered when
    the tensor enters an op).  E.g. in ``x16 / norm32`` the gradients of the norm stay float32 and only the
    gradient of ``x16`` is rounded, as with autocast.

Which kernel computes an op
---------------------------
For FP16 and BF16 with round-to-nearest-even (the default), an op that computes in ``fmt`` runs on PyTorch's own
float16 (bfloat16) kernel on the tensors' device: its ``fmt`` inputs are converted to that dtype (exact for
values already in ``fmt``, round-to-nearest-even for the others; strides kept), the kernel runs, what it writes
is copied back and its float16 outputs come back as float32 tensors (outputs the kernel returns in another
dtype keep it).  So simulate returns, bit for bit, what the real kernel returns, on whatever path the kernel
takes (vectorised, or element by element at the tail of a loop; one thread or several), including what the
kernels do with Python scalars.  On this project's CPUs (torch 2.13, float16): ``x + s``, ``x - s`` and
``s - x`` round ``s`` to FP16 first (type promotion makes the scalar an FP16 tensor); ``torch.add(x, y,
alpha=a)``, and so SGD's ``p.add_(grad, alpha=-lr)``, rounds ``a`` to FP16 and computes ``x + a·y`` in float32
on the vectorised path but rounds ``a·y`` to FP16 before the addition on the tail; ``x.pow(1.7)`` rounds the
exponent; a comparison ``x > 0.1`` compares with FP16(0.1); Adam's ``denom.add_(eps)`` adds FP16(1e-8) = 0, so
in a ``.half()`` Adam a weight whose squared gradient underflows gets an infinite update at the first step;
``mul``, ``div``, ``addcmul``, ``addcdiv`` and ``lerp`` use their scalar at float32 precision ("opmath").  The
element-wise float16 kernels run at about float32 speed on these CPUs, so the conversions cost about what
rounding a float32 result costs.  ``tests/test_simulate.py`` checks element-wise ops, reductions, an SGD and an
Adam run against real float16 and bfloat16 runs.

Not computed by the real kernel (float32, rounded once): the lower-precision ops of
:data:`LOWER_PRECISION_OPS` (matrix products, convolutions, fused RNN cells, attention), whose float16 CPU
kernels are slow (≈ 1 GFLOP/s; see "What the emulation does NOT model"); ops that draw random numbers
(``bernoulli_``, ``normal_``, …: the random stream stays the float32 one); ops that only move, select or fill
values (copies, concatenation, indexing, padding, ``relu``, max pooling, sorting), where rounding the float32
result is already bit for bit the real result; and an op that has no kernel of the dtype on the device (one
that raises ``NotImplementedError`` or "not implemented for 'Half'"): its name is recorded in
``sim.no_native_kernel``.  A real kernel's error about the values of one call ("value cannot be converted to
type c10::Half without overflow", from ``torch.add(x, y, alpha=70000.)``) is raised, as the real run raises it,
and the op keeps its kernel.  For the other formats (TF32, FP8, FP6, FP4:
PyTorch has no arithmetic for them) and the other roundings every op is computed in float32 (Python scalars at
float32 precision, as PyTorch's CPU kernels use them in "opmath") and rounded once.

Rounding
--------
Rounding is exact round-to-nearest-even (``rounding="nearest_even"``, the default) or, on request, any rounding
of :func:`mpt_lab.formats.round_to` (stochastic rounding draws from torch's default generator).  It takes
round_to's own paths, with less per-call overhead: torch's dtype conversions where they are exactly the rounding
(float32 → float16/bfloat16/float8_e5m2 → float32 on a CPU, two passes; each is checked bit for bit against the
bit path on a probe the first time it is used, and replaced by it with a warning if they differ), else
round_to's bit manipulation on the float32 encoding (E4M3, FP6, FP4, stochastic rounding, ...).  No
``torch.compile`` kernel is needed: the remaining cost of a simulated step is the extra passes over memory and
the Python hook per op.

Code marked with :func:`mpt_lab.formats.exact_arithmetic` runs unrounded inside a block: the mode passes its
ops straight through (no rounding, no bookkeeping).  :mod:`mpt_lab.formats` (``round_to``, ``encode``,
``decode``, …) and :mod:`mpt_lab.histogram` are marked (their exact bit arithmetic must not be rounded), so they
give the right answer inside a block too, e.g. a :class:`~mpt_lab.histogram.GradientHistogram` recording a
simulated FP16 run.  Other code of your own that must run unrounded goes inside ``with sim.paused():`` /
``mpt_lab.simulate.paused()`` (or ``with exact_arithmetic():``).

Source
------
Micikevicius et al., "Mixed Precision Training", ICLR 2018, §3: weights, activations and gradients stored in
FP16, FP16 arithmetic with products accumulated in FP32 and written to FP16; the PyTorch automatic mixed
precision op reference (``torch.amp``).

What the emulation does NOT model
---------------------------------
* Accumulation inside a lower-precision op: a simulated matmul or convolution (:data:`LOWER_PRECISION_OPS`)
  is computed in float32 and rounded *once* at the end, the paper's "FP16 products accumulated into FP32,
  written to FP16" (§3.3).  Real kernels accumulate in FP32 too, but in their own summation order, so a result
  can differ from simulate's where the exact sum lies within FP32's error bound γ_k·Σ|a_i b_i| of an FP16
  rounding midpoint (an ulp now and then; more after cancellation); ``tests/test_simulate.py`` checks every
  layer of a real ``.half()`` forward and backward against that derived bound.  Which kernels run depends on
  the CPU (:func:`mpt_lab.device.cpu_kernels`; torch 2.13): on CPUs with AVX-512 FP16 or AVX-NE-CONVERT, oneDNN's
  float16 matrix products and convolutions (one FP32 accumulation, one rounding per output); on CPUs with
  neither (e.g. AMD EPYC's, or any CPU with ``ONEDNN_MAX_CPU_ISA=AVX2``), ATen's own float16 GEMM (the same kind)
  and ATen's fallback convolution ``thnn_conv2d``, which is NOT what simulate computes in backward: it adds
  each image's weight gradient to a float16 accumulator (a rounding per image of the batch) and sums the
  overlapping input-gradient contributions (``col2im``) in float16.  So on such CPUs a real ``.half()`` conv
  net's gradients differ from the simulated ones in the last bits of most values (seen: 213 of the 216
  first-layer weight gradients of a small net at loss scale 2⁻¹⁴, and 1 of its 8 bias gradients rounding to
  zero in one run and not in the other), while on CPUs with oneDNN float16 they agree bit for bit at the sizes
  tested.  A simulated pure-FP16 training run leaves a real ``.half()`` run once such a difference happens.
* Overflow inside a lower-precision op: a float32 accumulator cannot overflow at 65504; only the op's
  *result* overflows.  (Ops on the real kernel overflow where the kernel does.)
* ``nn.LSTM`` / ``nn.GRU`` on a CPU in mode "all": the float32 model runs oneDNN's fused layer
  (``mkldnn_rnn_layer``, rounded at its outputs) while a ``.half()`` model runs the cell as separate ops, each
  rounded (``mm``, ``add``, ``sigmoid``, ``tanh``, ``mul``).  Inside ``with
  torch.backends.mkldnn.flags(enabled=False):`` the float32 model takes the same decomposition, and a small
  LSTM then matches a ``.half()`` one bit for bit (``tests/test_simulate.py``).
* In mode "all", a 0-dim float32 tensor from outside the block counts as float32 unless it is an
  ``nn.Parameter`` (see above): a 0-dim *buffer* that ``.half()`` converts is float32 here; the difference
  shows only where its dtype decides the result dtype (an op whose other inputs are 0-dim too).  In backward
  a 0-dim float32 tensor saved by forward (e.g. a GradScaler's scale S in ``loss * S``) is taken as ``fmt``:
  exact when S is a power of two.
* Tensors that enter the block from outside (inputs, parameters) are rounded when an op uses them, in mode
  "all" and for lower-precision ops, but they are not changed: use :func:`round_parameters_` to store the
  weights in ``fmt`` (the FP16 copy of the master weights) and round the batch yourself if it must be stored
  in ``fmt``.
* In mode "autocast", autograd casts each contribution to the gradient of a float16 tensor to float16 and
  sums the contributions in float16; the emulation sums them in float32 and rounds the total once (the
  same value where a tensor feeds one op, within an ulp or so where it feeds several).
  :func:`to_float32` (the simulated ``t.float()`` of an autocast output) rounds the gradient of the float32
  copy itself, as the backward of autocast's cast does.  Gradients of FP32 leaves (master weights) are the
  float32 accumulation of rounded contributions, as with autocast.
* Integer ops, random number generation and dtype conversions inside the block are not changed; ``fmt``
  values are stored in float32 (or the dtype the op returns) between ops, never in a real 16/8-bit dtype, so
  memory use and speed are those of float32.
* The real kernels are those of the machine the block runs on: a CPU with AVX-512 vectorises over 32 float16
  values, one with AVX2 over 16, so the elements that take a kernel's tail path differ between machines, as
  they do for real float16 runs.
* Backward passes run outside the block (``loss.backward()`` after the ``with``) are not rounded; nor is
  anything run in another thread.
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from collections.abc import Callable, Iterator

import torch

from ._torch_internals import TorchDispatchMode, current_autograd_node
from .accumulation import any_order_bounds
from .device import cpu_kernels
from .formats import (
    ROUNDING_MODES,
    FloatFormat,
    FormatLike,
    exact_arithmetic,
    exact_arithmetic_active,
    get_format,
    round_tensor,
)

__all__ = [
    "simulate",
    "paused",
    "to_float32",
    "round_parameters_",
    "rounder",
    "fp16_convolution_probe",
    "MODES",
    "LOWER_PRECISION_OPS",
    "FLOAT32_OPS",
]

MODES = ("autocast", "all")

#: ATen ops (overload packets, by name) that autocast runs in the lower-precision dtype (CUDA float16 list,
#: as the ATen ops that the listed Python functions decompose into, plus their backward kernels).
LOWER_PRECISION_OPS = frozenset(
    {
        "mm",
        "addmm",
        "bmm",
        "baddbmm",
        "addbmm",
        "addmv",
        "addr",
        "mv",
        "dot",
        "vdot",
        "matmul",
        "linear",
        "linear_backward",
        "chain_matmul",
        "linalg_multi_dot",
        "convolution",
        "_convolution",
        "convolution_backward",
        "conv_tbc",
        "conv_tbc_backward",
        "mkldnn_convolution",
        "cudnn_convolution",
        "cudnn_convolution_transpose",
        "conv_depthwise2d",
        "_slow_conv2d_forward",
        "_slow_conv2d_backward",
        "slow_conv3d_forward",
        "slow_conv_transpose2d",
        "slow_conv_transpose3d",
        "slow_conv_dilated2d",
        "slow_conv_dilated3d",
        "_prelu_kernel",
        "_prelu_kernel_backward",
        "_thnn_fused_lstm_cell",
        "_thnn_fused_lstm_cell_backward_impl",
        "_thnn_fused_gru_cell",
        "_thnn_fused_gru_cell_backward",
        "mkldnn_rnn_layer",
        "mkldnn_rnn_layer_backward",
        "_scaled_dot_product_attention_math",
        "_scaled_dot_product_flash_attention",
        "_scaled_dot_product_flash_attention_backward",
        "_scaled_dot_product_efficient_attention",
        "_scaled_dot_product_efficient_attention_backward",
        "_scaled_dot_product_flash_attention_for_cpu",
        "_scaled_dot_product_flash_attention_for_cpu_backward",
        "_scaled_dot_product_fused_attention_overrideable",
    }
)

#: ATen ops that autocast runs in float32 (CUDA "ops that can autocast to float32" list, as ATen ops).
FLOAT32_OPS = frozenset(
    {
        "pow",
        "acos",
        "asin",
        "cosh",
        "sinh",
        "tan",
        "erfinv",
        "exp",
        "expm1",
        "log",
        "log10",
        "log1p",
        "log2",
        "reciprocal",
        "rsqrt",
        "softplus",
        "_softmax",
        "softmax",
        "_log_softmax",
        "log_softmax",
        "binary_cross_entropy_with_logits",
        "cosine_embedding_loss",
        "cross_entropy_loss",
        "hinge_embedding_loss",
        "kl_div",
        "l1_loss",
        "margin_ranking_loss",
        "mse_loss",
        "multilabel_margin_loss_forward",
        "multi_margin_loss",
        "nll_loss_forward",
        "nll_loss2d_forward",
        "nll_loss_nd",
        "nll_loss",
        "nll_loss2d",
        "poisson_nll_loss",
        "smooth_l1_loss",
        "huber_loss",
        "soft_margin_loss",
        "triplet_margin_loss",
        "cdist",
        "_cdist_forward",
        "cosine_similarity",
        "dist",
        "pdist",
        "_pdist_forward",
        "renorm",
        "native_layer_norm",
        "layer_norm",
        "native_group_norm",
        "group_norm",
        "norm",
        "linalg_vector_norm",
        "frobenius_norm",
        "nuclear_norm",
        "sum",
        "prod",
        "cumsum",
        "cumprod",
    }
)

_BATCH_NORM_OPS = frozenset(
    {
        "native_batch_norm",
        "_native_batch_norm_legit",
        "_native_batch_norm_legit_no_training",
        "_native_batch_norm_legit_functional",
        "native_batch_norm_backward",
        "batch_norm_backward",
        "cudnn_batch_norm",
        "miopen_batch_norm",
    }
)

#: Ops that only move, select or fill values: rounding their float32 result is exactly what a real kernel
#: returns, so they take the float32 path even where a real kernel exists (no conversions).
_MOVES_VALUES = frozenset(
    {
        "clone",
        "copy_",
        "_to_copy",
        "cat",
        "stack",
        "index_select",
        "gather",
        "index",
        "embedding",
        "flip",
        "roll",
        "repeat",
        "constant_pad_nd",
        "where",
        "masked_fill",
        "masked_fill_",
        "fill_",
        "zero_",
        "zeros_like",
        "ones_like",
        "empty_like",
        "full_like",
        "new_zeros",
        "new_ones",
        "new_empty",
        "new_full",
        "lift_fresh",
        "lift_fresh_copy",
        "_local_scalar_dense",
        "relu",
        "relu_",
        "threshold_backward",
        "sort",
        "topk",
        "amax",
        "amin",
        "max_pool2d_with_indices",
        "max_pool3d_with_indices",
        "slice_scatter",
        "select_scatter",
    }
)

#: Formats whose values a torch dtype holds exactly, with real kernels for it (the kernels simulate calls).
_NATIVE_DTYPES = {get_format("FP16"): torch.float16, get_format("BF16"): torch.bfloat16}

#: (op, dtype, device type) that has no real kernel of that dtype there (its kernel raised "not implemented for
#: 'Half'" or the like, see :func:`_missing_kernel`): computed in float32 and rounded, without a second try.
_NO_NATIVE_KERNEL: set = set()
_DTYPE_WORDS = {torch.float16: ("'Half'", "Half"), torch.bfloat16: ("'BFloat16'", "BFloat16")}


def _missing_kernel(err: BaseException, dtype) -> bool:
    """Whether ``err``, raised by an op's real kernel of ``dtype``, says that the kernel does not exist for that
    dtype (``NotImplementedError``, "… not implemented for 'Half'", "Low precision dtypes not supported. Got
    Half"), as opposed to an error about the values or arguments of this call ("value cannot be converted to
    type c10::Half without overflow"), which the real run raises too."""
    if isinstance(err, NotImplementedError):
        return True
    text = str(err)
    named = any(word in text for word in _DTYPE_WORDS.get(dtype, ()))
    return named and any(word in text.lower() for word in ("not implemented", "not supported", "unsupported"))


# plan kinds
_VIEW, _LOW, _FP32, _PROMOTE, _BN, _ALL = range(6)
_NO_KERNEL, _KERNEL_FAILED = object(), object()  # results of simulate._native_call that are no result

_active = threading.local()  # .mode: the simulate instance active in this thread (nesting is refused)


# ----------------------------------------------------------------------------------------------------------
# Rounding: the paths of mpt_lab.formats.round_to
# ----------------------------------------------------------------------------------------------------------
_rounders: dict = {}


def _rounder_pair(fmt: FloatFormat, rounding: str):
    """(r, r_): out-of-place and in-place rounding equal to round_to (see :func:`rounder`), cached."""
    key = (fmt, rounding)
    pair = _rounders.get(key)
    if pair is None:

        def r(t):
            return round_tensor(t, fmt, rounding)

        def r_(t):
            return round_tensor(t, fmt, rounding, out=t)

        pair = _rounders[key] = (r, r_)
    return pair


def rounder(fmt: FormatLike, rounding: str = "nearest_even") -> Callable[[torch.Tensor], torch.Tensor]:
    """A function ``r(t) -> tensor`` equal to ``round_to(t, fmt, rounding=rounding)`` on floating tensors.

    ``r`` takes :func:`round_to`'s paths (see :mod:`mpt_lab.formats`): for float32 tensors and
    ``rounding="nearest_even"``, torch's dtype conversion to FP16, BF16 or FP8_E5M2 and back (on a CPU; on
    other devices E4M3 with saturation too), verified bit for bit against round_to's bit path on a probe of
    ≈ 5·10⁴ values (random bit patterns, ties, subnormals, overflow, ±inf, NaN) the first time, a mismatch
    falling back to the bit path with a ``RuntimeWarning``; otherwise round_to's bit path.
    ``MPT_LAB_FAST_ROUND=0`` in the environment turns the conversions off (round_to's too).  NaN payloads are
    not preserved (any NaN stays a NaN).  ``r`` never tracks autograd and returns a new tensor of the input's
    shape, dtype and device.

    Raises
    ------
    TypeError, ValueError
        Unknown ``fmt`` or ``rounding``.
    """
    fmt = get_format(fmt, "fmt")
    if rounding not in ROUNDING_MODES:
        raise ValueError(f"rounding must be one of {ROUNDING_MODES}, got {rounding!r}")
    return _rounder_pair(fmt, rounding)[0]


# ----------------------------------------------------------------------------------------------------------
# The mode
# ----------------------------------------------------------------------------------------------------------
def _plan(func, mode: str):
    """(kind, indices of written arguments, index of 'input' for batch norm, whether a real kernel of the
    format's dtype computes it: see "Which kernel computes an op") for an op, computed once."""
    schema = func._schema
    written = tuple(i for i, a in enumerate(schema.arguments) if a.alias_info is not None and a.alias_info.is_write)
    view = any(r.alias_info is not None and not r.alias_info.is_write for r in schema.returns)
    name = func.overloadpacket.__name__ if hasattr(func, "overloadpacket") else str(func)
    input_index = next((i for i, a in enumerate(schema.arguments) if a.name == "input"), 0)
    if view and not written:
        kind = _VIEW
    elif mode == "all":
        kind = _ALL
    elif name in LOWER_PRECISION_OPS:
        kind = _LOW
    elif name in FLOAT32_OPS:
        kind = _FP32
    elif name in _BATCH_NORM_OPS:
        kind = _BN
    else:
        kind = _PROMOTE
    tags = getattr(func, "tags", ())
    native = (
        name not in LOWER_PRECISION_OPS
        and name not in _MOVES_VALUES
        and torch.Tag.nondeterministic_seeded not in tags  # random: the float32 stream
        and torch.Tag.inplace_view not in tags
    )  # squeeze_, t_, resize_: metadata of self
    return kind, written, input_index, native


def _floating(x) -> bool:
    return isinstance(x, torch.Tensor) and x.is_floating_point()


class simulate(TorchDispatchMode):
    """Context manager: round the floating results of the ops run inside it to ``fmt``.

    Parameters
    ----------
    fmt : FloatFormat or str, default ``"FP16"``
        Format to emulate (any of :data:`mpt_lab.formats.FORMATS`: ``"FP16"``, ``"BF16"``, ``"FP8_E4M3"``, …).
    mode : {"autocast", "all"}, default ``"autocast"``
        ``"autocast"`` rounds what ``torch.autocast(dtype=float16)`` would run in float16 (lower-precision ops,
        and ops whose inputs are all such results); ``"all"`` rounds every op's inputs and outputs, as a model
        converted with ``.half()``.  See the module docstring for the op lists.
    backward : bool, keyword-only, default True
        Round the ops of backward passes run inside the block (gradients in ``fmt``, as FP16 kernels produce
        them).  With False, backward ops run in plain float32.
    rounding : {"nearest_even", "toward_zero", "stochastic"}, keyword-only
        Rounding of :func:`mpt_lab.formats.round_to` (stochastic: from torch's default generator).

    Tensors: every floating dtype is rounded in its own dtype (float32 models stay float32); shapes, devices and
    autograd graphs are unchanged.  Rounding is invisible to autograd (it happens below it), i.e. gradients
    pass through it unchanged ("straight through"), as through a dtype cast.

    Use ``with simulate(...):`` (or ``as sim``); an instance can be re-entered after it has exited.  Nesting
    is refused: entering a second :class:`simulate` while one is active in the same thread raises
    ``RuntimeError`` (exit the first to switch formats).  Other dispatch modes may be combined with it.  On
    exit (normal or by an exception) rounding stops at once; tensors created inside keep their rounded
    values.

    Attributes: ``fmt`` (FloatFormat), ``mode``, ``backward``, ``rounding``, ``ops_rounded`` (number of op
    calls whose results were rounded or computed by a real kernel in the last block, a cheap sanity check),
    ``no_native_kernel`` (set of names of ops that had no float16/bfloat16 kernel on the device in the last
    block and were computed in float32 and rounded once instead; see the module docstring).

    Raises
    ------
    TypeError
        ``fmt`` is neither a FloatFormat nor a str; ``backward`` is not a bool; ``mode``/``rounding`` not a str.
    ValueError
        Unknown ``fmt``, ``mode`` or ``rounding``.
    RuntimeError
        On entry, when a :class:`simulate` block is already active in this thread.

    Source: Micikevicius et al. 2018 §3; PyTorch's autocast op reference (``torch.amp``).
    """

    def __init__(self, fmt="FP16", mode: str = "autocast", *, backward: bool = True, rounding: str = "nearest_even"):
        super().__init__()
        if not isinstance(fmt, (FloatFormat, str)):
            raise TypeError(f"fmt must be a FloatFormat or a format name (str), got {type(fmt).__name__}")
        self.fmt = get_format(fmt, "fmt")
        if not isinstance(mode, str):
            raise TypeError(f"mode must be a str, one of {MODES}, got {type(mode).__name__}")
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        if not isinstance(backward, bool):
            raise TypeError(f"backward must be a bool, got {type(backward).__name__}")
        if not isinstance(rounding, str):
            raise TypeError(f"rounding must be a str, one of {ROUNDING_MODES}, got {type(rounding).__name__}")
        if rounding not in ROUNDING_MODES:
            raise ValueError(f"rounding must be one of {ROUNDING_MODES}, got {rounding!r}")
        self.mode, self.backward, self.rounding = mode, backward, rounding
        self.ops_rounded = 0
        self._round = self._round_ = None
        self._plans: dict = {}
        self._tags: dict = {}  # see _entry
        self._float32: dict = {}  # id -> (weakref, version): float32 outputs of real kernels (see _stays_float32)
        # the dtype whose real kernels compute the ops (FP16, BF16 with round-to-nearest-even), else None
        self._native = _NATIVE_DTYPES.get(self.fmt) if rounding == "nearest_even" else None
        self.no_native_kernel: set = set()  # names of ops that had no real kernel here (float32, rounded once)
        self._hooked: dict = {}  # id -> (weakref,) of the fmt tensors whose gradient is rounded (_cast_gradients_of)

    def __repr__(self) -> str:
        return f"simulate({self.fmt.name!r}, mode={self.mode!r}, backward={self.backward})"

    # --- entering and leaving -------------------------------------------------------------------------
    def __enter__(self):
        if getattr(_active, "mode", None) is not None:
            raise RuntimeError(f"a simulate block is already active ({_active.mode!r}); nesting is not supported")
        # round_to's paths (a native conversion is checked against the bit path on its first use)
        self._round, self._round_ = _rounder_pair(self.fmt, self.rounding)
        self._tags.clear()
        self._float32.clear()
        self._hooked.clear()
        self.ops_rounded = 0
        self.no_native_kernel = set()
        _active.mode = self
        try:
            return super().__enter__()
        except BaseException:
            _active.mode = None
            raise

    def __exit__(self, exc_type, exc, tb):
        try:
            return super().__exit__(exc_type, exc, tb)
        finally:
            _active.mode = None
            self._tags.clear()
            self._float32.clear()

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """Run the body of a ``with sim.paused():`` in plain float32 (no rounding), inside an active block.

        For code of your own that computes with bit manipulation or must stay exact: inside a block its
        float ops would be rounded too.  (:mod:`mpt_lab.formats` and :mod:`mpt_lab.histogram` need no pause:
        they run under :func:`mpt_lab.formats.exact_arithmetic`, which is what this sets.)  Ops in the body
        pass through unrounded and their results are not marked as holding ``fmt`` values.

        Raises
        ------
        RuntimeError
            This instance is not the active :class:`simulate` block of this thread.
        """
        if getattr(_active, "mode", None) is not self:
            raise RuntimeError("paused() needs this simulate block to be active in this thread")
        with exact_arithmetic():
            yield

    # --- tags: which tensors already hold fmt values ----------------------------------------------------
    # self._tags: id(tensor) -> (weakref, version, rounded): ``rounded`` is None when the tensor itself holds
    # fmt values (an output of this block, or a leaf found equal to its rounding), else a rounded copy made
    # for an op's input and reused while the tensor is alive and unchanged (autocast caches its casts alike).
    def _entry(self, t):
        e = self._tags.get(id(t))
        if e is None or e[0]() is not t:
            return None
        try:
            return e if e[1] == t._version else None
        except RuntimeError:  # inference tensors have no version counter
            return None

    def _tagged(self, t) -> bool:
        e = self._entry(t)
        return e is not None and e[2] is None

    def holds(self, t: object) -> bool:
        """Whether tensor ``t`` holds values this block produced in ``fmt``: the output of an op that computes in
        ``fmt`` (see the module docstring), or a gradient rounded to it, unchanged since.  Under autocast these
        are the tensors a real run would keep in float16/bfloat16 (a float32 op's output is not one).  Only
        meaningful while the block is active."""
        return isinstance(t, torch.Tensor) and self._tagged(t)

    def _tag(self, t, bump: int = 0, rounded=None) -> None:
        try:
            v = t._version + bump
        except RuntimeError:
            return
        _remember(self._tags, t, v, rounded)

    def _rounded_input(self, x):
        """x itself when it holds fmt values, else its rounded copy (made once per tensor and version)."""
        if not (isinstance(x, torch.Tensor) and x.is_floating_point()):
            return x
        e = self._entry(x)
        if e is not None:
            return x if e[2] is None else e[2]
        base = x._base
        if base is None or 2 * x.numel() < base.numel():
            base = x
        eb = self._entry(base) if base is not x else None
        if eb is None:
            rb = self._round(base)
            if self.mode == "all" and base.grad_fn is None and torch.equal(rb, base):  # leaf in fmt (round_parameters_)
                rb = None
            self._tag(base, rounded=rb)
        else:
            rb = eb[2]
        if rb is None:
            return x
        if base is x:
            return rb
        if rb.stride() == base.stride():
            return rb.as_strided(x.size(), x.stride(), x.storage_offset() - base.storage_offset())
        return self._round(x)

    # --- float32 tensors beside fmt ones --------------------------------------------------------------
    def _stays_float32(self, t, in_backward: bool) -> bool:
        """Whether floating ``t`` is a float32 tensor of the real run in mode "all" (neither rounded nor
        converted): a float32 output of a real kernel (e.g. layer norm's saved statistics), or, outside
        backward, a 0-dim tensor (not a view of a larger one) that did not come out of an fmt op and is no
        ``nn.Parameter`` (an optimizer's
        step count, a GradScaler's scale, ``torch.tensor(0.1)``: ``.half()`` leaves them float32).  In backward
        a 0-dim input is a gradient, which autograd casts to its tensor's dtype: fmt."""
        if not t.is_floating_point():
            return False
        e = self._float32.get(id(t))
        if e is not None and e[0]() is t and e[1] == _version(t):
            return True
        if in_backward or t.dim() != 0:
            return False
        if t._base is not None:  # a 0-dim view (y[0, 0]) is a view of what its base is
            t = t._base
        return t.dim() == 0 and not self._tagged(t) and not isinstance(t, torch.nn.Parameter)

    def _native_call(self, func, args, kwargs, flat, written, convert):
        """Run ``func`` on the real kernel of the format's dtype (float16 for FP16, bfloat16 for BF16): the
        floating inputs for which ``convert(t)`` holds are converted to that dtype (which rounds them), the
        others are passed as they are (float32), the kernel runs, what it wrote is copied back into the
        written tensors and its outputs of that dtype come back as float32 tensors holding fmt values.

        Returns the op's result, or ``_NO_KERNEL`` (nothing to convert, or an input of another floating dtype:
        the float32 path decides) or ``_KERNEL_FAILED`` (the real kernel does not exist for the dtype: it raised
        NotImplementedError or "not implemented for 'Half'"; nothing was changed).  Any other error of the real
        kernel (about this call's values) is raised, as the real run raises it.
        """
        dtype = self._native
        device = _device_of(flat)
        if device is None or (func, dtype, device.type) in _NO_NATIVE_KERNEL:
            return _NO_KERNEL
        natives: dict = {}
        for t in flat:
            if not t.is_floating_point() or id(t) in natives:
                continue
            if t.dtype != torch.float32 or (t.device != device and not (t.dim() == 0 and t.device.type == "cpu")):
                return _NO_KERNEL
            if convert(t):
                natives[id(t)] = _native_copy(t, dtype)
        if not natives:
            return _NO_KERNEL
        nargs, nkwargs = _map_tensors(lambda t: natives.get(id(t), t), args, kwargs)
        try:
            out = func(*nargs, **nkwargs)
        except RuntimeError as err:  # NotImplementedError included
            if _missing_kernel(err, dtype):  # e.g. "not implemented for 'Half'": see the caller
                return _KERNEL_FAILED
            raise  # about this call's values ("cannot be converted to c10::Half without overflow"): as real runs
        for t in written:
            n = natives.get(id(t))
            if n is not None:
                if n.shape != t.shape:  # an out= argument the kernel resized
                    t.resize_(n.shape)
                t.copy_(n)
                self._tag(t, bump=1)  # the op's in-place version bump happens after this hook returns
        back = {id(natives[id(t)]): t for t in written if id(t) in natives}

        def result(o):
            if not isinstance(o, torch.Tensor):
                return o
            if id(o) in back:
                return back[id(o)]
            if o.dtype == dtype:
                o = o.to(torch.float32)
                self._tag(o)
            elif o.is_floating_point():  # a float32 result of the real kernel: it stays float32
                _remember(self._float32, o, _version(o))
            return o

        self.ops_rounded += 1
        if isinstance(out, (tuple, list)):
            return type(out)(result(o) for o in out)
        return result(out)

    def _no_native_kernel(self, func, flat) -> None:
        """Remember that ``func`` has no real kernel of the format's dtype on this device type."""
        _NO_NATIVE_KERNEL.add((func, self._native, _device_of(flat).type))
        self.no_native_kernel.add(func.overloadpacket.__name__ if hasattr(func, "overloadpacket") else str(func))

    # --- the gradient of an fmt tensor is an fmt tensor --------------------------------------------------
    # Autograd casts every gradient to the dtype of the tensor it belongs to (the engine's validate_outputs),
    # so under autocast the gradient of a float16 activation is float16 however it was computed (e.g. in
    # float32 by the backward of x16 / norm32).  A hook on each fmt tensor that enters an op in forward rounds
    # the gradient that reaches it; the backward ops themselves round only when all their inputs are fmt.
    def _cast_gradients_of(self, tensors) -> None:
        hooked = self._hooked
        for t in tensors:
            if not (t.requires_grad and t.is_floating_point()) or not self._tagged(t):
                continue
            e = hooked.get(id(t))
            if e is not None and e[0]() is t:
                continue
            t.register_hook(self._cast_gradient)
            _remember(hooked, t)

    def _cast_gradient(self, grad):
        if getattr(_active, "mode", None) is not self or self._tagged(grad):
            return None
        with exact_arithmetic():
            out = self._round(grad)
        self._tag(out)
        return out

    def _finish(self, out, written_args, fresh: bool = True):
        """Round the tensors that the op wrote (in place) and, with ``fresh``, its other floating outputs."""
        r, r_ = self._round, self._round_
        for t in written_args:
            if t.is_floating_point():
                r_(t)
                self._tag(t, bump=1)  # the op's in-place version bump happens after this hook returns
        if not fresh:
            return out

        def rounded(o):
            if isinstance(o, torch.Tensor) and o.is_floating_point() and not any(o is t for t in written_args):
                # a fresh output: rounded in place when strided, so that it keeps the layout the op gave it
                # (the path of the next real kernel depends on it)
                o = r(o) if o.is_contiguous() else r_(o)
                self._tag(o)
            return o

        if isinstance(out, torch.Tensor):
            return rounded(out)
        if isinstance(out, (tuple, list)):
            res = [rounded(o) for o in out]
            return type(out)(res) if isinstance(out, tuple) else res
        return out

    # --- the op hook ----------------------------------------------------------------------------------
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if exact_arithmetic_active():  # formats, histograms, paused(): the op runs exactly as written
            return func(*args, **kwargs)
        plan = self._plans.get(func)
        if plan is None:
            plan = self._plans[func] = _plan(func, self.mode)
        kind, written_idx, input_index, native = plan
        in_backward = current_autograd_node() is not None
        if in_backward and not self.backward:
            return func(*args, **kwargs)
        if kind == _VIEW:
            out = func(*args, **kwargs)
            src = args[0] if args else None
            if _floating(src) and self._tagged(src):
                for o in out if isinstance(out, (tuple, list)) else (out,):
                    if isinstance(o, torch.Tensor):
                        self._tag(o)
            return out
        flat = _flat_tensors(args, kwargs)
        if self.mode == "autocast" and self.backward and not in_backward:
            self._cast_gradients_of(flat)
        written = [_arg(func, args, kwargs, i) for i in written_idx] if written_idx else ()
        if written:
            written = [
                t
                for w in written
                for t in (w if isinstance(w, (list, tuple)) else (w,))
                if isinstance(t, torch.Tensor) and t.is_floating_point()
            ]
        if kind == _ALL or kind == _LOW:
            # tensors that are float32 beside a .half() model (see _stays_float32) are neither rounded nor
            # converted; an op that has only such floating inputs is a float32 op of the real run
            keep = [t for t in flat if self._stays_float32(t, in_backward)] if self.mode == "all" else []
            if keep and len(keep) == sum(1 for t in flat if t.is_floating_point()):
                return func(*args, **kwargs)
            if kind == _ALL and native and self._native is not None:
                out = self._native_call(func, args, kwargs, flat, written, lambda t: not _is_in(t, keep))
                if out is not _NO_KERNEL and out is not _KERNEL_FAILED:
                    return out
            else:
                out = None
            # float32, rounded.  Inputs: tensors the op writes in place are rounded in place (their old value
            # is read, then overwritten), the others replaced by rounded copies
            written = [t for t in written if not _is_in(t, keep)]
            for t in written:
                if not self._tagged(t):
                    self._round_(t)
            if any(t.is_floating_point() and not self._tagged(t) and not _is_in(t, keep) for t in flat):
                args, kwargs = _map_tensors(self._rounded_input, args, kwargs, skip=[*written, *keep])
            result = func(*args, **kwargs)
            if out is _KERNEL_FAILED:  # the real kernel failed where float32 works: there is none here
                self._no_native_kernel(func, flat)
            self.ops_rounded += 1
            return self._finish(result, written)
        if kind == _FP32 and not in_backward:
            return func(*args, **kwargs)
        if kind == _BN and not in_backward:  # output follows `input`; running statistics stay float32
            src = _arg(func, args, kwargs, input_index)
            out = func(*args, **kwargs)
            if _floating(src) and self._tagged(src):
                self.ops_rounded += 1
                if isinstance(out, (tuple, list)):
                    return type(out)((self._finish(out[0], ()), *out[1:]))
                return self._finish(out, ())
            return out
        # promote: all floating inputs in fmt, as autocast's "widest input type" and as type promotion inside
        # a backward formula (an in-place op keeps the dtype of the tensor it writes); in backward, the
        # gradient reaching an fmt tensor is rounded by the hook of _cast_gradients_of
        if written and not in_backward:
            rounded = all(self._tagged(t) for t in written)
        else:
            fl = [t for t in flat if t.is_floating_point()]
            dims = [t for t in fl if t.dim() > 0] or fl
            tags = [self._tagged(t) for t in dims]
            rounded = bool(tags) and all(tags)
        if rounded and native and self._native is not None:
            # the ops autocast runs in fmt, on the real kernel: fmt inputs converted, float32 ones as they are
            out = self._native_call(func, args, kwargs, flat, written, self._tagged)
            if out is not _NO_KERNEL and out is not _KERNEL_FAILED:
                return out
            failed = out is _KERNEL_FAILED
        else:
            failed = False
        out = func(*args, **kwargs)
        if failed:
            self._no_native_kernel(func, flat)
        if rounded:
            self.ops_rounded += 1
            return self._finish(out, written)
        return out


@contextlib.contextmanager
def paused() -> Iterator[None]:
    """Pause the :class:`simulate` block active in this thread, if any (see :meth:`simulate.paused`)."""
    mode = getattr(_active, "mode", None)
    if mode is None:
        yield
    else:
        with mode.paused():
            yield


class _ToFloat32(torch.autograd.Function):
    @staticmethod
    def forward(ctx, t):
        ctx.mode = getattr(_active, "mode", None)
        return t.view_as(t)

    @staticmethod
    def backward(ctx, grad):
        mode = ctx.mode
        if mode is None or getattr(_active, "mode", None) is not mode or not mode.backward:
            return grad
        with mode.paused():
            out = mode._round(grad)
        mode._tag(out)
        return out


def to_float32(t: torch.Tensor) -> torch.Tensor:
    """The simulated counterpart of ``t.float()`` on an autocast float16 output: identity in forward, and in
    backward (inside the same :class:`simulate` block) the incoming float32 gradient is rounded to the block's
    format, as the backward of autocast's float16 → float32 cast rounds it to float16.

    It marks, in code that reads like autocast code, where an autocast (lower-precision) result feeds a float32
    op, e.g. ``loss = cross_entropy(to_float32(logits), y)``.  Inside a block the gradient of every ``fmt``
    tensor is rounded anyway (see the module docstring), so the boundary rounds a gradient that is about to
    be rounded again, with the same result.  Outside a block, or when the block is not active during backward,
    it changes nothing.

    Parameters
    ----------
    t : floating tensor of any shape

    Returns
    -------
    A view of ``t`` (same shape, dtype, device) that carries the rounding of its gradient.

    Raises
    ------
    TypeError
        ``t`` is not a floating-point tensor.
    """
    if not (isinstance(t, torch.Tensor) and t.is_floating_point()):
        raise TypeError(f"t must be a floating-point torch.Tensor, got {type(t).__name__}")
    if not t.requires_grad:
        return t
    return _ToFloat32.apply(t)


def _device_of(tensors):
    """The device an op runs on: that of its first tensor with dimensions (0-dim CPU tensors may join
    tensors on another device), else of its first tensor; None without tensors."""
    return next((t.device for t in tensors if t.dim() > 0), next((t.device for t in tensors), None))


def _is_in(t, tensors) -> bool:
    """Whether ``t`` is one of ``tensors`` (by identity)."""
    return any(t is u for u in tensors)


def _version(t) -> int | None:
    try:
        return t._version
    except RuntimeError:  # inference tensors have no version counter
        return None


def _native_copy(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``t`` converted to ``dtype`` (round-to-nearest-even) with ``t``'s strides where it has no overlapping
    elements, so that the real kernel takes the path (vectorised or element by element) it takes in a real
    run on a tensor of that layout."""
    if t.is_contiguous():
        return t.to(dtype)
    try:
        n = torch.empty_strided(t.size(), t.stride(), dtype=dtype, device=t.device)
        n.copy_(t)
        return n
    except RuntimeError:  # overlapping elements (an expanded tensor): a dense copy
        return t.to(dtype, memory_format=torch.contiguous_format)


def _remember(table: dict, t: torch.Tensor, *fields) -> None:
    """``table[id(t)] = (weakref to t, *fields)``; the entry goes when ``t`` is freed (ids are reused)."""
    k = id(t)

    def forget(ref, k=k, table=table):
        e = table.get(k)
        if e is not None and e[0] is ref:
            del table[k]

    table[k] = (weakref.ref(t, forget), *fields)


def _arg(func, args, kwargs, i):
    a = func._schema.arguments[i]
    if i < len(args) and not a.kwarg_only:
        return args[i]
    return kwargs.get(a.name)


def _flat_tensors(args, kwargs):
    out = []
    for a in (*args, *kwargs.values()):
        if isinstance(a, torch.Tensor):
            out.append(a)
        elif isinstance(a, (list, tuple)):
            out.extend(x for x in a if isinstance(x, torch.Tensor))
    return out


def _map_tensors(fn, args, kwargs, skip=()):
    def m(a):
        if isinstance(a, torch.Tensor):
            return a if any(a is s for s in skip) else fn(a)
        if isinstance(a, (list, tuple)) and any(isinstance(x, torch.Tensor) for x in a):
            return type(a)(m(x) for x in a)
        return a

    return tuple(m(a) for a in args), {k: m(v) for k, v in kwargs.items()}


# ----------------------------------------------------------------------------------------------------------
# Parameters stored in a format
# ----------------------------------------------------------------------------------------------------------
def round_parameters_(
    model: torch.nn.Module, fmt: FormatLike = "FP16", *, buffers: bool = True, rounding: str = "nearest_even"
) -> torch.nn.Module:
    """Round a model's floating parameters (and buffers) to ``fmt`` in place, keeping their dtype.

    Emulates weights *stored* in ``fmt``: ``round_parameters_(model, "FP16")`` is to a float32 model what
    ``model.half()`` is, without changing the dtype (Micikevicius et al. 2018 §3: the FP16 copy of the FP32
    master weights used in forward and backward).  Integer buffers (e.g. BatchNorm's ``num_batches_tracked``)
    are left alone.  Autograd history is not recorded; ``.grad`` is not touched.

    Parameters
    ----------
    model : torch.nn.Module
    fmt : FloatFormat or str
    buffers : bool, keyword-only
        Also round floating buffers (BatchNorm running statistics).
    rounding : str, keyword-only
        As :func:`mpt_lab.formats.round_to`.

    Returns
    -------
    model (the same object), for chaining.

    Raises
    ------
    TypeError
        ``model`` is not an ``nn.Module``; ``buffers`` is not a bool.
    ValueError
        Unknown ``fmt`` or ``rounding``.
    """
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if not isinstance(buffers, bool):
        raise TypeError(f"buffers must be a bool, got {type(buffers).__name__}")
    r = rounder(get_format(fmt, "fmt"), rounding)
    tensors = list(model.parameters()) + (list(model.buffers()) if buffers else [])
    with torch.no_grad():
        for t in tensors:
            if t.is_floating_point():
                t.copy_(r(t))
    return model


def fp16_convolution_probe(batch: int = 6, seed: int = 0) -> dict:
    """One float16 convolution's backward on this CPU's real kernel, against what simulate computes for it.

    A 3 × 3 convolution (4 → 8 channels, 7 × 7 images, padding 1) of FP16 inputs, its output gradient at 2⁻¹²
    of the inputs' scale: the weight gradient from PyTorch's real float16 kernel (``.half()``), from
    :class:`simulate` (FP32 accumulation, one rounding), and the interval an FP32 accumulation in any order,
    rounded once, can reach (:func:`mpt_lab.accumulation.any_order_bounds`).  oneDNN's float16 convolution (CPUs
    with AVX-512 FP16 or AVX-NE-CONVERT) stays inside it; ATen's fallback (CPUs with neither, e.g. AMD EPYC's,
    or with ``ONEDNN_MAX_CPU_ISA`` below them) rounds the weight gradient after every image and leaves it.

    Parameters
    ----------
    batch : int ≥ 2, images (the fallback rounds once per image)
    seed : int, the inputs' seed

    Returns
    -------
    dict with "kernels" (:meth:`mpt_lab.device.CpuKernels.describe`), "convolution" ("onednn" or "aten"),
    "values" (weight-gradient values), "differ_from_simulate" (how many the real kernel gives otherwise than
    simulate), "outside_fp32_bounds" (how many lie outside what an FP32 accumulation in any order can give).

    Raises
    ------
    TypeError, ValueError
        ``batch`` is not an int ≥ 2, or ``seed`` not an int.
    """

    if not isinstance(batch, int) or isinstance(batch, bool) or batch < 2:
        raise ValueError(f"batch must be an int ≥ 2, got {batch!r}")
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise TypeError(f"seed must be an int, got {type(seed).__name__}")
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, 4, 7, 7, generator=g).half()
    w = (torch.randn(8, 4, 3, 3, generator=g) * 0.2).half()
    go = (torch.randn(batch, 8, 7, 7, generator=g) * 2.0**-12).half()
    wh = w.clone().requires_grad_()
    torch.nn.functional.conv2d(x, wh, padding=1).backward(go)
    real = wh.grad.float()
    ws = w.float().requires_grad_()
    with simulate("FP16", mode="all"):
        torch.nn.functional.conv2d(x.float(), ws, padding=1).backward(go.float())
    x64, go64 = x.double(), go.double()
    exact = torch.nn.grad.conv2d_weight(x64, w.shape, go64, padding=1)
    abs_sum = torch.nn.grad.conv2d_weight(x64.abs(), w.shape, go64.abs(), padding=1)
    low, high = any_order_bounds(exact, abs_sum, go[:, 0].numel())
    k = cpu_kernels()
    return {
        "kernels": k.describe(),
        "convolution": k.fp16_convolution,
        "values": real.numel(),
        "differ_from_simulate": int((real != ws.grad).sum()),
        "outside_fp32_bounds": int(((real.double() < low) | (real.double() > high)).sum()),
    }
