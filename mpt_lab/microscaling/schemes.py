"""Quantisation schemes by name: a format with its scaling rule, for code that picks one by a string.

A *scheme* quantises one tensor (:data:`SCHEMES`: FP8 with a per-tensor scale, an MX format, NVFP4); a
training *recipe* (:mod:`mpt_lab.quantized_training`) says which tensors of a model get which scheme.
:func:`quantize` and :func:`fake_quantize` are what a ``torch.autograd.Function`` that quantises a Linear
layer's operands needs::

    class QuantLinearFn(torch.autograd.Function):     # y = x @ w.t(), x: (batch, K), w: (N, K)
        @staticmethod
        def forward(ctx, x, w, scheme):
            ctx.save_for_backward(x, w)
            ctx.scheme = scheme
            # each operand of each product is quantised along that product's reduction axis
            return fake_quantize(x, scheme, axis=-1) @ fake_quantize(w, scheme, axis=-1).t()   # over K

        @staticmethod
        def backward(ctx, g):                               # g: (batch, N)
            x, w = ctx.saved_tensors
            s = ctx.scheme
            gx = fake_quantize(g, s, axis=-1) @ fake_quantize(w, s, axis=0)        # over N
            gw = fake_quantize(g, s, axis=0).t() @ fake_quantize(x, s, axis=0)     # over the batch
            return gx, gw, None
"""

from __future__ import annotations

import torch

from ..formats import FP8_E4M3, FP8_E5M2, exact_arithmetic
from ._core import check_axis, check_choice, check_tensor
from .mx import MX_FORMATS, MXTensor, quantize_mx
from .nvfp4 import NVFP4Tensor, quantize_nvfp4
from .per_tensor import ScaledTensor, quantize_per_tensor

__all__ = ["SCHEMES", "quantize", "fake_quantize"]

#: Scheme names for :func:`quantize` / :func:`fake_quantize`: per-tensor current scaling ("fp8_e4m3",
#: "fp8_e5m2"), MX with 32-value blocks and OCP's floor scale ("mxfp8_e4m3", "mxfp8_e5m2", "mxfp6_e3m2",
#: "mxfp6_e2m3", "mxfp4": the MX format names of :data:`~mpt_lab.microscaling.MX_FORMATS` in lower case),
#: and "nvfp4".
SCHEMES = ("fp8_e4m3", "fp8_e5m2", "mxfp8_e4m3", "mxfp8_e5m2", "mxfp6_e3m2", "mxfp6_e2m3", "mxfp4", "nvfp4")


@exact_arithmetic
def quantize(x: torch.Tensor, scheme: str, *, axis: int = -1) -> ScaledTensor | MXTensor | NVFP4Tensor:
    """Quantise x with a scheme of :data:`SCHEMES`; ``axis`` is the block axis (unused per tensor).

    Returns a :class:`~mpt_lab.microscaling.ScaledTensor`, :class:`~mpt_lab.microscaling.MXTensor` or
    :class:`~mpt_lab.microscaling.NVFP4Tensor`: each has ``dequantize()`` and ``saturated(x)``, and
    :func:`~mpt_lab.microscaling.quantization_error` takes it.  Raises TypeError/ValueError for a bad x, an
    unknown scheme or a bad axis.
    """
    x = check_tensor(x)
    scheme = check_choice(scheme, "scheme", SCHEMES)
    if scheme.upper() in MX_FORMATS:
        return quantize_mx(x, MX_FORMATS[scheme.upper()], 32, axis)
    if scheme == "nvfp4":
        return quantize_nvfp4(x, axis=axis)
    check_axis(axis, max(x.dim(), 1))
    fmt = FP8_E4M3 if scheme == "fp8_e4m3" else FP8_E5M2
    q, scale = quantize_per_tensor(x, fmt)
    return ScaledTensor(q, scale, fmt, x.dtype)


def fake_quantize(x: torch.Tensor, scheme: str, *, axis: int = -1) -> torch.Tensor:
    """x quantised with ``scheme`` and dequantised: x's shape, dtype and device, no autograd history.

    ``quantize(x, scheme, axis=axis).dequantize()``, for a ``torch.autograd.Function`` (module docstring).
    Raises as :func:`quantize`.
    """
    return quantize(x, scheme, axis=axis).dequantize()
