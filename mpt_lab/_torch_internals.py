"""The one place where mpt_lab imports PyTorch's private APIs.

PyTorch marks with a leading underscore what it may change without notice.  The package needs a few such
names; they are all imported here, so that a new torch release that moves one breaks this module, with a
clear ``ImportError``, and nothing else.  Every other module imports them from here
(``from ._torch_internals import TorchDispatchMode``).

Tested with torch 2.13.0 (the CPU build of this project's machines: ``tests/test_simulate.py``,
``tests/test_scaling.py``, ``tests/test_bench.py``).  The lent H100/H200 machines run torch 2.11 with CUDA;
every name below exists there (they date from torch 2.4 or earlier), but this module itself has not yet been
run there: on such a machine, ``python -m pytest -q tests/test_simulate.py tests/test_scaling.py
tests/test_bench.py`` checks it.

==========================================  =====================================================================
name here (torch's name)                    what mpt_lab uses it for
==========================================  =====================================================================
``TorchDispatchMode``                       The base class of :class:`mpt_lab.simulate.simulate` (round every
(``torch.utils._python_dispatch``)          ATen op's result to FP16, BF16, FP8, …) and of the storage tracker of
                                            :func:`mpt_lab.bench.peak_memory` on a CPU: a mode sees every op
                                            below autograd, backward ops included.  Documented in the PyTorch
                                            "extending" notes, but its module is private.
``tree_flatten``                            :mod:`mpt_lab.bench`'s storage tracker: the tensors in an op's
(``torch.utils._pytree``)                   (nested) output.
``current_autograd_node``                   :class:`mpt_lab.simulate.simulate`: whether an op runs inside a
(``torch._C._current_autograd_node``)       backward pass (autograd's engine is executing a node), which the
                                            autocast emulation treats differently from forward ops.
``without_fx_graph_cache``                  :mod:`mpt_lab.histogram`: compile the CPU histogram kernel without
(``torch._inductor.config.patch``)          inductor's on-disk FX graph cache (a cached artifact was seen wrong
                                            under ``ATEN_CPU_CAPABILITY=avx2``).
``current_dispatch_mode``                   :mod:`mpt_lab._report_record` (the precision report): whether its own
(``torch.utils._python_dispatch.``          op recorder is the innermost dispatch mode, before it steps aside for
``_get_current_dispatch_mode``)             the report's histograms (a compiled kernel runs eagerly, op by op,
                                            under an active mode).
``FakeTensorMode``                          :mod:`mpt_lab.autocast` (and the experiments that use its probe):
(``torch._subclasses.fake_tensor``)         run ops on fake CUDA tensors (shapes and dtypes, no data) to learn
                                            which dtype ``torch.autocast("cuda")`` gives each, on a machine
                                            without a GPU.
``scaled_mm``                               :mod:`mpt_lab.quantized_training` (the ``fp8_current`` and
(``torch._scaled_mm``)                      ``fp8_delayed`` runs of :mod:`mpt_lab.experiments.fp8_recipes` on a
                                            GPU of compute capability ≥ 8.9): the FP8 tensor-core product
                                            ``scaled_mm(a, b, scale_a=, scale_b=, out_dtype=)`` of a row-major
                                            and a column-major float8 matrix (dimensions multiples of 16) with
                                            FP32 decode scales, as torchao's ``Float8Linear`` calls it.  None
                                            when this torch has no such op (the callers then emulate).  Its
                                            CUDA path is tested by ``tests/test_quantized_training.py`` (skipped
                                            without such a GPU).
``onednn_fp16_supported``,                  :func:`mpt_lab.device.cpu_kernels`: whether PyTorch sends float16
``onednn_bf16_supported``                   (bfloat16) convolutions and matrix products on this CPU to oneDNN
(``torch.ops.mkldnn._is_mkldnn_fp16_``       (its brgemm/AMX kernels, one FP32 accumulation and one rounding
``supported``, ``…_bf16_supported``)        per output) or to ATen's own fallback (``thnn_conv2d``, which
                                            rounds a convolution's weight gradient to float16 after every
                                            image).  The answer follows the CPU and ``ONEDNN_MAX_CPU_ISA``; the
                                            tests read it to compare :mod:`mpt_lab.simulate` with the kernel
                                            that really runs.  False where this torch has no such query.
``dispatch_op_names``,                      :func:`mpt_lab.autocast.autocast_lists`: PyTorch's own autocast op
``dispatch_has_kernel``                     lists, read from its dispatcher (every ATen op that has a kernel
(``torch._C._dispatch_get_all_op_names``,   for the ``AutocastCUDA`` or ``AutocastCPU`` dispatch key; the
``torch._C._dispatch_has_kernel_for_        torch.amp documentation prints the same lists by hand).
dispatch_key``)
``aten_to_copy``                            :func:`mpt_lab.autocast.autocast_lists`: the ATen op every dtype
(``torch.ops.aten._to_copy.default``)       cast goes through (``Tensor.to(dtype)``), which autocast calls
                                            when it casts an op's inputs.
``foreach_max``, ``foreach_mul_``           :mod:`mpt_lab.scaling` (the inf/NaN check and the unscaling of
(``torch._foreach_max``,                    :class:`~mpt_lab.scaling.GradScaler`): one multi-tensor kernel per
``torch._foreach_mul_``)                    device, the operations ``torch.amp.GradScaler`` uses, so the results
                                            are bit-identical to it.  PyTorch calls ``torch._foreach_*`` private
                                            (newer releases add a public ``torch.foreach`` namespace, which
                                            2.11 and 2.13 do not have), so they are routed through here too.
==========================================  =====================================================================

Private *attributes* of public objects cannot be imported; the package reads these in place, and they are
listed here so that one file says everything mpt_lab assumes about torch's internals:

* ``Tensor._version`` (version counter of in-place changes) and ``Tensor._base`` (the tensor a view was
  made from): :mod:`mpt_lab.simulate`, to know which tensors already hold values of the emulated format.
* ``OpOverload._schema`` (argument aliasing: which arguments an op writes, which outputs are views) and
  ``OpOverload.overloadpacket``: :mod:`mpt_lab.simulate`, to classify each ATen op once; ``_schema``'s
  argument types also let :func:`mpt_lab.autocast.autocast_lists` build placeholder arguments for any op.
* ``Tensor._values()`` of sparse gradients (their stored values, uncoalesced, as torch's GradScaler checks
  them): :mod:`mpt_lab.scaling` and :mod:`mpt_lab.master_weights`.
* ``Module._parameters`` / ``Module._buffers`` and ``RNNBase._init_flat_weights()``:
  :class:`mpt_lab.master_weights.MasterWeightTrainer`, to replace a model's parameters by their FP16 copy in
  place (RNNs keep a flat list of their weights that must follow).

Not needed: :class:`mpt_lab.scaling.GradScaler` handles FSDP2's sharded (DTensor) gradients with public APIs only
(``DTensor.to_local``, ``.placements``, ``.device_mesh.get_group``, ``torch.distributed.all_reduce``); it does what
torch's GradScaler gets from DTensor's private handler of ``_amp_foreach_non_finite_check_and_unscale_``
(``torch.distributed.tensor._dispatch.found_inf_reduce_handler``: the found-inf flag reduced as ``Partial("max")``
over the mesh dimensions that are not replicated), without calling it.

Not listed: :mod:`mpt_lab.formats`, the bottom layer, imports nothing from torch's internals (it must import
without torch at all).  Its functions compute exactly inside a ``simulate`` block because they run under
:func:`mpt_lab.formats.exact_arithmetic`, a pure-Python marker that ``simulate`` honours.
"""

from __future__ import annotations

import torch
import torch._inductor.config as _inductor_config
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._python_dispatch import _get_current_dispatch_mode as current_dispatch_mode
from torch.utils._pytree import tree_flatten

__all__ = [
    "TorchDispatchMode",
    "tree_flatten",
    "current_autograd_node",
    "current_dispatch_mode",
    "FakeTensorMode",
    "foreach_max",
    "foreach_mul_",
    "scaled_mm",
    "onednn_fp16_supported",
    "onednn_bf16_supported",
    "dispatch_op_names",
    "dispatch_has_kernel",
    "aten_to_copy",
    "without_fx_graph_cache",
]

#: ``current_autograd_node()`` is the autograd Node being executed by the engine in this thread, or None
#: outside a backward pass.
current_autograd_node = torch._C._current_autograd_node

#: ``dispatch_op_names()`` -> list of every registered op's name, "aten::mm", "aten::softmax.int", ….
dispatch_op_names = torch._C._dispatch_get_all_op_names

#: ``dispatch_has_kernel(op_name, dispatch_key)`` -> bool: whether the op has its own kernel for that key
#: (e.g. "AutocastCUDA"); a key's fallthrough does not count.
dispatch_has_kernel = torch._C._dispatch_has_kernel_for_dispatch_key

#: The ATen overload ``aten::_to_copy`` (``x.to(dtype)`` dispatches to it): a cast, as a dispatch mode sees it.
aten_to_copy = torch.ops.aten._to_copy.default

#: ``foreach_max(tensors)`` -> list of 0-dim tensors, the largest element of each (NaN if it holds one).
foreach_max = torch._foreach_max

#: ``foreach_mul_(tensors, scalar_tensor)``: multiplies every tensor in place (one kernel per device).
foreach_mul_ = torch._foreach_mul_

#: ``scaled_mm(a, b, scale_a=, scale_b=, out_dtype=)`` -> a @ b from float8 operands on FP8 tensor cores
#: (CUDA, compute capability ≥ 8.9); None if this torch build has no ``torch._scaled_mm``.
scaled_mm = getattr(torch, "_scaled_mm", None)


def _mkldnn_query(name: str):
    fn = getattr(getattr(torch.ops, "mkldnn", None), name, None)

    def query() -> bool:
        """Whether PyTorch sends this type's convolutions and matrix products to oneDNN on this CPU."""
        if fn is None or not torch.backends.mkldnn.is_available():
            return False
        return bool(fn())

    return query


#: ``onednn_fp16_supported()`` -> bool: PyTorch runs float16 convolutions (and oneDNN matmuls) on oneDNN here.
onednn_fp16_supported = _mkldnn_query("_is_mkldnn_fp16_supported")

#: ``onednn_bf16_supported()`` -> bool: the same for bfloat16.
onednn_bf16_supported = _mkldnn_query("_is_mkldnn_bf16_supported")


def without_fx_graph_cache():
    """A context manager in which torch.compile neither reads nor writes inductor's on-disk FX graph cache
    (``torch._inductor.config.patch(fx_graph_cache=False)``): :mod:`mpt_lab.histogram` compiles its CPU kernel in
    one, because an artifact of that cache written with the CPU's own kernels gave wrong indices in a process with
    ``ATEN_CPU_CAPABILITY=avx2``."""
    return _inductor_config.patch(fx_graph_cache=False)
