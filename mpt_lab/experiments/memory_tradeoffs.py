"""Memory against compute on a real model: FP32, mixed precision, activation checkpointing, and both.

There are two ways to cut the memory of training: *recomputation* (activation checkpointing, Chen et al. 2016:
drop activations in forward and recompute them in backward; lossless, about one extra forward pass) and
*lower precision* (store values in fewer bits; lossy, little overhead).  The CIFAR-10 ResNet-50 experiment of
Manna (2018, github.com/suvojit-0x55aa/mixed-precision-pytorch) reports, FP32 against mixed precision on one
V100, storage 90 MB against 46 MB and 47.1 s against 25.6 s per epoch (:data:`CIFAR10_RESNET50`).  This
experiment measures the same quantities on the book's small ResNet (:mod:`mpt_lab.models.resnet`) trained on
scikit-learn's digits upsampled to ``image_size``² pixels (:func:`mpt_lab.data.upsampled_digits`):

1. for each of the four ways (:data:`WAYS`), the peak memory of one training step above what was live before
   it (activations, gradients, temporaries; bytes), the step time (median of repeats after warm-up; seconds),
   memory saved and compute overhead against FP32, whether the gradients are bit-identical to FP32's, and the
   work of a step counted in FLOPs (``torch.utils.flop_counter.FlopCounterMode``: matrix products and
   convolutions, forward and backward, recomputation included), beside the FLOPs of one forward pass: what
   "about one extra forward pass" means, counted instead of timed;
2. where the memory of a step goes, for FP32 and for mixed precision: weights, gradients, optimizer state (each
   counted from the tensors) and the tensors autograd saves for the backward pass (counted with
   ``torch.autograd.graph.saved_tensors_hooks``: activations, and under autocast the low-precision copies of
   the weights it casts);
3. the size on disk of the model's ``state_dict`` saved with ``torch.save`` in FP32 and in FP16;
4. a short training run in FP32 and in mixed precision from the same initial weights and batch order: test
   accuracy, seconds per epoch, storage;
5. with ``time_layouts`` (the full profile), the step time of the FP32 and mixed ways in each of :data:`LAYOUTS`: channels-last memory format,
   ``torch.backends.cudnn.benchmark`` (cuDNN times its algorithms on the first calls and keeps the fastest), both,
   and for FP32 TF32 switched off (``layouts``).

**What "FP32" is here.**  On CUDA the baseline keeps FP32 tensors, but PyTorch lets cuDNN compute float32
convolutions on TF32 tensor cores by default (``torch.backends.cudnn.allow_tf32`` is True; the PyTorch CUDA notes,
"TensorFloat-32 (TF32) on Ampere (and later) devices"), so on a GPU with TF32 the FP32 way's convolutions run in
TF32 (10 mantissa bits); ``baseline`` says which it was, from the switches as the run starts (recorded in every
provenance by the runner), and ``layouts["fp32"]["TF32 off"]`` times true FP32.  The exactness pass compares one
batch's gradients with FP32's; for float16 it runs the backward through a loss scale (the largest power of two
from 2¹⁶ down whose gradients are finite, as a GradScaler would settle; ``exactness_loss_scale``), to guard
against the underflow of unscaled gradients (it counts no flushed values); its reference is the FP32 way as run,
so where that way's convolutions ran in TF32 the pass compares two computations whose convolution inputs both
round to 11 significant bits, not FP16 against true FP32.

Mixed precision is ``torch.autocast`` with float16 and ``torch.amp.GradScaler`` on CUDA.  On a CPU it is
bfloat16 autocast without a scaler (bfloat16 has FP32's exponent range), CPU autocast's default dtype (float16
convolutions are slow only where oneDNN has no float16 kernel: :func:`mpt_lab.device.cpu_kernels`); the result says
which was used (``mixed_dtype``).  The four ways' steps are timed in interleaved rounds (one step of each way per
round, ``repeat`` rounds after warm-up; the median per way), so that a change in the load of a shared machine
falls on all four alike.

Peak memory: on CUDA the caching allocator's counters; a CPU has no such counter, and
:func:`mpt_lab.bench.peak_memory` counts the live tensor storage instead (see its docstring).

    python -m mpt_lab.experiments.memory_tradeoffs --profile full --out book/results/memory_tradeoffs_full.json
"""

from __future__ import annotations

import copy
import math
import statistics
import time
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

from ..bench import checkpoint_bytes, peak_memory, time_call
from ..data import upsampled_digits
from ..device import backends
from ..harness.runner import Experiment, ExperimentConfig, ExperimentResult, Run, run_main
from ..models.resnet import build_resnet
from ..training import accuracy, autocast_to, backward_step

__all__ = [
    "Config",
    "MemoryTradeoffsResult",
    "PROFILES",
    "WAYS",
    "CIFAR10_RESNET50",
    "RECOMPUTE_VS_PRECISION",
    "config_for",
    "run",
    "main",
    "step_flops",
    "NAME",
    "LAYOUTS",
    "baseline_name",
]

NAME = "memory_tradeoffs"

#: The four ways to train, in the order the result lists them: (mixed precision?, activation checkpointing?).
WAYS = {"fp32": (False, False), "mixed": (True, False), "checkpoint": (False, True), "mixed+checkpoint": (True, True)}

#: The timing variants of ``layouts``: name → (memory format, cudnn.benchmark, TF32 for cuDNN: None keeps the
#: default).  "TF32 off" is timed for the FP32 way only (the mixed way's convolutions are 16-bit).
LAYOUTS = {
    "default": ("contiguous", False, None),
    "channels_last": ("channels_last", False, None),
    "cudnn.benchmark": ("contiguous", True, None),
    "channels_last + cudnn.benchmark": ("channels_last", True, None),
    "TF32 off": ("contiguous", False, False),
}


def baseline_name(device_type: str, backends: dict | None) -> str:
    """What the FP32 way computes: "FP32" on a CPU or with cuDNN's TF32 switched off; on CUDA with
    ``cudnn_allow_tf32`` true (PyTorch's default), or with no switches recorded (results made before the runner
    recorded them, by code that never changed them: PyTorch's defaults), "TF32 convolutions (cuDNN's default), FP32
    storage".

    Raises ValueError for a device type other than "cpu" and "cuda"."""
    if device_type not in ("cpu", "cuda"):
        raise ValueError(f"device_type must be 'cpu' or 'cuda', got {device_type!r}")
    if device_type == "cpu":
        return "FP32"
    if backends is None:
        return "TF32 convolutions (cuDNN's default, the switches not recorded), FP32 storage"
    return (
        "TF32 convolutions (cuDNN's default), FP32 storage"
        if backends.get("cudnn_allow_tf32", True)
        else "FP32 (cuDNN's TF32 off)"
    )


#: Manna (2018), github.com/suvojit-0x55aa/mixed-precision-pytorch, README: CIFAR-10, ResNet-50, batch 128,
#: 200 epochs on one NVIDIA V100.  Cited, not computed; sizes in MB (10⁶ bytes) as reported.
CIFAR10_RESNET50 = {
    "source": "github.com/suvojit-0x55aa/mixed-precision-pytorch: CIFAR-10 ResNet-50, batch 128, 200 epochs",
    "device": "1× NVIDIA V100",
    "fp32": {"storage_mb": 90.0, "epoch_seconds": 47.112, "accuracy": 0.9487},
    "mixed": {"storage_mb": 46.0, "epoch_seconds": 25.601, "accuracy": 0.9465},
}

#: The usual qualitative comparison of the two ways (recomputation: Chen et al. 2016, "one extra forward
#: pass"; lower precision: Micikevicius et al. 2018).  Cited, not computed.
RECOMPUTE_VS_PRECISION = {
    "recomputation": {"lossless": True, "overhead": "medium (about one extra forward pass)"},
    "lower precision": {"lossless": False, "overhead": "low"},
}


@dataclass
class Config(ExperimentConfig):
    """The network, the measurement and the training of the four ways (each field's comment says what it is;
    :data:`PROFILES` holds each profile's values)."""

    image_size: int = 32  # the 8×8 digits are upsampled (bilinear) to image_size × image_size
    width: int = 16
    stages: int = 3
    depth: int = 1
    batch_size: int = 64  # batch of the memory/time measurement and of training
    repeat: int = 5  # timed steps per way (the median is reported)
    warmup: int = 2
    epochs: int = 3
    lr: float = 0.02  # higher rates leave BatchNorm's running statistics behind the weights
    momentum: float = 0.9
    mixed_dtype: str = "auto"  # "auto": float16 on CUDA, bfloat16 elsewhere; or "float16", "bfloat16"
    max_images: int = 0  # train and test on at most this many images of each split (0: all; smoke runs)
    time_layouts: bool = False  # time the FP32 and mixed steps in each of LAYOUTS (the full profile)

    def validate(self) -> None:
        super().validate()
        self.check_positive("image_size", "width", "stages", "depth", "batch_size", "repeat", "epochs")
        self.check_positive("warmup", "max_images", minimum=0)
        if self.image_size < 2 ** (self.stages - 1):
            raise ValueError(
                f"config.image_size must be ≥ 2**(stages-1) = {2 ** (self.stages - 1)}, got {self.image_size}"
            )
        self.check_choices("mixed_dtype", ("auto", "float16", "bfloat16"))
        if not (isinstance(self.lr, (int, float)) and self.lr > 0 and math.isfinite(self.lr)):
            raise ValueError(f"config.lr must be a positive finite number, got {self.lr!r}")


PROFILES = {
    "quick": {"image_size": 16, "width": 8, "batch_size": 32, "repeat": 5, "warmup": 1, "epochs": 4, "threads": 1},
    "cpu": {"image_size": 24, "width": 12, "batch_size": 64, "repeat": 5, "warmup": 1, "epochs": 4, "threads": 0},
    "full": {
        "image_size": 64,
        "width": 64,
        "stages": 4,
        "depth": 2,
        "batch_size": 256,
        "repeat": 10,
        "warmup": 3,
        "epochs": 10,
        "time_layouts": True,
    },
}

#: ``--smoke``: one warm-up and one timed step per way, one epoch of two batches of 2 images on 4 training and 4
#: test images, at 8 px (the smallest side that keeps all four stages): the ResNet's parameters do not depend on
#: the image side (global pooling), and a bfloat16 step of the full width at 64 px takes minutes on a CPU without
#: bfloat16 instructions (≈ 0.6 GFLOP/s).
SMOKE = {"repeat": 1, "warmup": 1, "epochs": 1, "batch_size": 2, "max_images": 4, "image_size": 8}


@dataclass
class MemoryTradeoffsResult(ExperimentResult):
    """``mixed_dtype``: "float16" (with GradScaler) or "bfloat16" (no scaler), with ``mixed_note`` saying why;
    ``memory_method``: how peak memory was measured; ``param_bytes``: bytes of the FP32 weights; ``ways``: per
    way of :data:`WAYS` {peak_bytes, step_seconds, step_times, memory_saved, overhead (fractions), bit_identical,
    grad_rel_diff (‖g − g₃₂‖/‖g₃₂‖), grad_cosine (cosine of the angle between g and g₃₂), loss, loss_diff,
    step_flops (FLOPs of one training step, :func:`step_flops`), forward_flops (of its forward pass alone)};
    ``breakdown``: {"fp32", "mixed"} each {weights, gradients, optimizer_state, saved_for_backward} in bytes
    for one step on the measured batch; ``storage``: {fp32_bytes, fp16_bytes, ratio} of the checkpoint on disk;
    ``training``: {"fp32", "mixed"} each {accuracy (evaluated in the training precision), accuracy_fp32_eval,
    epoch_seconds (median), epoch_times, final_loss, storage_bytes}; ``baseline``: what the FP32 way computes
    (:func:`baseline_name`); ``layouts``: {"fp32", "mixed"} each {variant of :data:`LAYOUTS`: {step_seconds,
    step_times, memory_format, cudnn_benchmark, cudnn_allow_tf32}}; ``exactness_loss_scale``: the loss scale of
    the mixed ways' exactness pass (1 for bfloat16).  Results saved before 2026-11-27 have none of the last three
    (``baseline`` is then read from the device: :attr:`baseline_label`)."""

    mixed_dtype: str
    mixed_note: str
    memory_method: str
    param_bytes: int
    ways: dict
    storage: dict
    training: dict
    breakdown: dict
    baseline: str = ""
    layouts: dict = field(default_factory=dict)
    exactness_loss_scale: float | None = None

    @property
    def baseline_label(self) -> str:
        """What the FP32 way computed: ``baseline``, or for a result made before it was recorded,
        :func:`baseline_name` of its device with the switches its provenance recorded (none: PyTorch's defaults)."""
        if self.baseline:
            return self.baseline
        kind = "cuda" if "CUDA" in str(self.provenance.get("device", "")) else "cpu"
        return baseline_name(kind, self.provenance.get("backends"))

    def describe(self) -> str:
        w, t = self.ways, self.training
        return (
            f"memory trade-offs ({self.profile} profile, {self.device}; mixed = {self.mixed_dtype} autocast): "
            f"peak MiB per step "
            + ", ".join(f"{k} {v['peak_bytes'] / 2**20:.2f}" for k, v in w.items())
            + f"; accuracy FP32 {t['fp32']['accuracy']:.3f}, mixed {t['mixed']['accuracy']:.3f}"
        )


def _make_step(model, opt, scaler, x, y, device, dtype):
    def step():
        opt.zero_grad(set_to_none=True)
        with autocast_to(device.type, dtype):
            loss = F.cross_entropy(model(x), y)
        backward_step(loss, opt, scaler)
        return loss

    return step


def step_flops(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, dtype: torch.dtype | None = None) -> tuple:
    """FLOPs of one training step of ``model`` on the batch ``x`` (images) with labels ``y`` (cross-entropy,
    backward; no optimizer step), and of its forward pass alone, as counted by PyTorch's
    ``torch.utils.flop_counter.FlopCounterMode`` (matrix products and convolutions; a recomputed forward of
    activation checkpointing is counted where the backward pass runs it).  ``dtype``: the autocast dtype (None:
    FP32).  Returns ``(step, forward)``, ints; the model's gradients are left as that step computes them.

    Raises TypeError for a model that is not a torch.nn.Module.
    """
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    device = x.device
    model.zero_grad(set_to_none=True)
    with FlopCounterMode(display=False) as fwd:
        with autocast_to(device.type, dtype):
            loss = F.cross_entropy(model(x), y)
    with FlopCounterMode(display=False) as bwd:
        loss.backward()
    model.zero_grad(set_to_none=True)
    return int(fwd.get_total_flops() + bwd.get_total_flops()), int(fwd.get_total_flops())


def _grads(model, x, y, device, dtype, scale: float = 1.0):
    """Loss and gradients of one forward/backward pass (no optimizer step), the backward through the loss scale
    ``scale`` and the gradients divided by it in FP32."""
    model.zero_grad(set_to_none=True)
    with autocast_to(device.type, dtype):
        loss = F.cross_entropy(model(x), y)
    (loss * scale if scale != 1.0 else loss).backward()
    return loss.detach().float(), [
        p.grad.detach().float() / scale if scale != 1.0 else p.grad.detach().clone() for p in model.parameters()
    ]


def _precise_bn(model, x, batch_size, device, dtype):
    """Recompute BatchNorm's running statistics as exact averages over the training images with the final
    weights ("precise BN"; Wu & Johnson, arXiv:2105.07576), so that test accuracy measures the weights and not
    how far the exponential running averages lag behind them after a few short epochs."""
    norms = (torch.nn.BatchNorm1d, torch.nn.BatchNorm2d, torch.nn.BatchNorm3d)
    bns = [mod for mod in model.modules() if isinstance(mod, norms)]
    saved = [mod.momentum for mod in bns]
    for mod in bns:
        mod.reset_running_stats()
        mod.momentum = None  # cumulative average
    model.train()
    with torch.no_grad(), autocast_to(device.type, dtype):
        for i in range(0, len(x), batch_size):
            model(x[i : i + batch_size])
    for mod, mom in zip(bns, saved):
        mod.momentum = mom


def _exactness(init, xb, yb, device, dtype) -> tuple:
    """Per way: loss and gradients on one batch against plain FP32 (deterministic algorithms where they exist);
    the float16 ways' backward through a loss scale (see the module docstring).  Returns (per way, the scale)."""
    det_prev = (torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark)
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = True, False
    try:
        ref_loss, ref = _grads(copy.deepcopy(init), xb, yb, device, None)
        scale = 1.0
        if dtype == torch.float16:  # as a GradScaler settles: from 2^16 down to finite gradients
            scale = 2.0**16
            while scale > 1.0:
                m = copy.deepcopy(init)
                _, g = _grads(m, xb, yb, device, dtype, scale)
                if all(bool(torch.isfinite(t).all()) for t in g):
                    break
                scale /= 2.0
        out = {}
        for way, (mixed, ckpt) in WAYS.items():
            m = copy.deepcopy(init)
            m.checkpoint = ckpt
            loss, g = _grads(m, xb, yb, device, dtype if mixed else None, scale if mixed else 1.0)
            same = bool(torch.equal(loss, ref_loss)) and all(torch.equal(a, b) for a, b in zip(g, ref))
            flat, flat_ref = torch.cat([a.float().reshape(-1) for a in g]), torch.cat([b.reshape(-1) for b in ref])
            den = float(flat_ref.norm())
            out[way] = {
                "bit_identical": same,
                "grad_rel_diff": float((flat - flat_ref).norm()) / den if den else 0.0,
                "grad_cosine": float(torch.nn.functional.cosine_similarity(flat, flat_ref, dim=0)),
                "loss": float(loss),
                "loss_diff": float(loss - ref_loss),
            }
        return out, scale
    finally:
        torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = det_prev


def _breakdown(init, x, y, device, dtype, config) -> dict:
    """Bytes of weights, gradients, optimizer state (SGD momentum, after one step) and of the tensors autograd
    saves for backward (unique storages; measured with saved_tensors_hooks) in one training step."""
    m = copy.deepcopy(init)
    opt = torch.optim.SGD(m.parameters(), lr=config.lr, momentum=config.momentum)
    saved = {}

    def pack(t):
        st = t.untyped_storage()
        saved[(st.data_ptr(), t.device)] = st.nbytes()
        return t

    opt.zero_grad(set_to_none=True)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        with autocast_to(device.type, dtype):
            loss = F.cross_entropy(m(x), y)
    loss.backward()
    opt.step()
    params = list(m.parameters())
    param_ptrs = {(p.untyped_storage().data_ptr(), p.device) for p in params}
    nbytes = lambda ts: sum(t.numel() * t.element_size() for t in ts)  # noqa: E731
    return {
        "weights": nbytes(params),
        "gradients": nbytes(p.grad for p in params if p.grad is not None),
        "optimizer_state": nbytes(t for st in opt.state.values() for t in st.values() if isinstance(t, torch.Tensor)),
        "saved_for_backward": sum(b for k, b in saved.items() if k not in param_ptrs),
    }


def measure(config: Config, run: Run) -> dict:
    """Measure the four ways of training, checkpoint sizes, and a short FP32 vs mixed training run."""
    device = run.device
    name = config.mixed_dtype if config.mixed_dtype != "auto" else ("float16" if device.type == "cuda" else "bfloat16")
    dtype = getattr(torch, name)
    use_scaler = dtype == torch.float16
    note = (
        "float16 autocast with torch.amp.GradScaler"
        if use_scaler
        else "bfloat16 autocast without a loss scaler (bfloat16 has FP32's exponent range)"
    )
    if device.type == "cpu":
        note += (
            "; CPU runs use bfloat16, CPU autocast's default (float16 convolutions are slow only where oneDNN "
            "has no float16 kernel)"
            if not use_scaler
            else "; float16 on a CPU is slow (no fast kernels): times are not representative"
        )
    method = (
        "torch.cuda max_memory_allocated - memory_allocated around one step"
        if device.type == "cuda"
        else "mpt_lab.bench.peak_memory: live bytes of the tensor storages created by ATen ops during one step "
        "(a dispatch mode; freed storages subtracted); a lower bound, excludes operator-internal workspaces"
    )
    xtr, ytr, xte, yte = upsampled_digits(config.image_size, config.seed, device)
    if config.max_images:
        xtr, ytr, xte, yte = (t[: config.max_images] for t in (xtr, ytr, xte, yte))
    init = build_resnet(config.width, config.stages, config.depth, seed=config.seed).to(device)
    param_bytes = sum(p.numel() * p.element_size() for p in init.parameters())
    idx = torch.randperm(len(xtr), generator=torch.Generator().manual_seed(config.seed))[: config.batch_size]
    xb, yb = xtr[idx.to(device)], ytr[idx.to(device)]

    baseline = baseline_name(device.type, backends())
    exact, exact_scale = _exactness(init, xb, yb, device, dtype)
    ways, steps = {}, {}
    for way, (mixed, ckpt) in WAYS.items():
        m = copy.deepcopy(init)
        m.checkpoint = ckpt
        opt = torch.optim.SGD(m.parameters(), lr=config.lr, momentum=config.momentum)
        scaler = torch.amp.GradScaler(device.type) if (mixed and use_scaler) else None
        steps[way] = (m, opt, _make_step(m, opt, scaler, xb, yb, device, dtype if mixed else None))
        time_call(steps[way][2], repeat=1, warmup=max(config.warmup, 1) - 1, device=device)  # warm-up
    times = {way: [] for way in WAYS}
    for _ in run.bar(range(config.repeat), desc="four ways, timed rounds"):  # interleaved: one step of each
        for way, (_, _, step) in steps.items():
            times[way].append(time_call(step, repeat=1, warmup=0, device=device).median)
    for way, (mixed, _) in WAYS.items():
        m, opt, step = steps[way]
        opt.zero_grad(set_to_none=True)
        flops, fwd_flops = step_flops(m, xb, yb, dtype if mixed else None)
        ways[way] = {
            "peak_bytes": int(peak_memory(step, device)),
            "step_seconds": statistics.median(times[way]),
            "step_times": times[way],
            "step_flops": flops,
            "forward_flops": fwd_flops,
            **exact[way],
        }
    for w in ways.values():
        w["memory_saved"] = 1.0 - w["peak_bytes"] / ways["fp32"]["peak_bytes"]
        w["overhead"] = w["step_seconds"] / ways["fp32"]["step_seconds"] - 1.0

    layouts = {}
    variants = [
        (way, v)
        for way in ("fp32", "mixed")
        for v in LAYOUTS
        if not (way == "mixed" and v == "TF32 off") and config.time_layouts
    ]
    for way, variant in run.bar(variants, desc="layouts"):
        layouts.setdefault(way, {})[variant] = _layout_timing(
            init, xb, yb, device, dtype if way == "mixed" else None, use_scaler and way == "mixed", config, variant
        )
        run.arm_done(f"{way}, {variant}", layouts[way][variant])

    breakdown = {
        "fp32": _breakdown(init, xb, yb, device, None, config),
        "mixed": _breakdown(init, xb, yb, device, dtype, config),
    }
    fp32_b, fp16_b = checkpoint_bytes(init, torch.float32), checkpoint_bytes(init, torch.float16)
    storage = {"fp32_bytes": fp32_b, "fp16_bytes": fp16_b, "ratio": fp16_b / fp32_b}

    training = {}
    for label, mixed in (("fp32", False), ("mixed", True)):
        m = copy.deepcopy(init)
        opt = torch.optim.SGD(m.parameters(), lr=config.lr, momentum=config.momentum)
        scaler = torch.amp.GradScaler(device.type) if (mixed and use_scaler) else None
        dt = dtype if mixed else None
        g = torch.Generator().manual_seed(config.seed + 1)
        times, losses = [], []
        for _ in run.bar(range(config.epochs), desc=f"train {label}"):
            perm = torch.randperm(len(xtr), generator=g).to(device)
            run.sync()
            t0 = time.perf_counter()
            for i in range(0, len(perm), config.batch_size):
                b = perm[i : i + config.batch_size]
                loss = _make_step(m, opt, scaler, xtr[b], ytr[b], device, dt)()
            losses.append(float(loss.detach()))
            run.sync()
            times.append(time.perf_counter() - t0)
        _precise_bn(m, xtr, config.batch_size, device, dt)
        m.eval()
        with torch.no_grad():
            with autocast_to(device.type, dt):
                acc = accuracy(m(xte), yte)
            acc32 = accuracy(m(xte), yte)  # the same weights in FP32: separates training from inference rounding
        training[label] = {
            "accuracy": acc,
            "accuracy_fp32_eval": acc32,
            "epoch_seconds": statistics.median(times),
            "epoch_times": times,
            "final_loss": losses[-1],
            "storage_bytes": checkpoint_bytes(m, dtype if mixed else torch.float32),
        }
    return {
        "mixed_dtype": name,
        "mixed_note": note,
        "memory_method": method,
        "param_bytes": int(param_bytes),
        "ways": ways,
        "storage": storage,
        "training": training,
        "breakdown": breakdown,
        "baseline": baseline,
        "layouts": layouts,
        "exactness_loss_scale": exact_scale,
    }


def _layout_timing(init, xb, yb, device, dtype, scaled: bool, config, variant: str) -> dict:
    """The step time of one way (``dtype`` None: FP32) in one variant of :data:`LAYOUTS`; the switches restored."""
    fmt, bench, tf32 = LAYOUTS[variant]
    before = (torch.backends.cudnn.benchmark, torch.backends.cudnn.allow_tf32)
    try:
        torch.backends.cudnn.benchmark = bench
        if tf32 is not None:
            torch.backends.cudnn.allow_tf32 = tf32
        m = copy.deepcopy(init)
        x = xb
        if fmt == "channels_last":
            m = m.to(memory_format=torch.channels_last)
            x = xb.contiguous(memory_format=torch.channels_last)
        opt = torch.optim.SGD(m.parameters(), lr=config.lr, momentum=config.momentum)
        scaler = torch.amp.GradScaler(device.type) if scaled else None
        step = _make_step(m, opt, scaler, x, yb, device, dtype)
        # cudnn.benchmark times its algorithms on the first calls of each shape: two more warm-up steps
        timing = time_call(
            step, repeat=config.repeat, warmup=max(config.warmup, 1) + (2 if bench else 0), device=device
        )
        return {
            "step_seconds": timing.median,
            "step_times": list(timing.times),
            "memory_format": fmt,
            "cudnn_benchmark": bench,
            "cudnn_allow_tf32": bool(torch.backends.cudnn.allow_tf32),
        }
    finally:
        torch.backends.cudnn.benchmark, torch.backends.cudnn.allow_tf32 = before


EXPERIMENT = Experiment(NAME, Config, PROFILES, measure, MemoryTradeoffsResult, __doc__, smoke=SMOKE)
run, config_for, main = EXPERIMENT.run, EXPERIMENT.config_for, EXPERIMENT.main

if __name__ == "__main__":
    run_main(EXPERIMENT)
