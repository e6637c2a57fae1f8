"""Memory against compute on a real model: FP32, mixed precision, activation checkpointing, and both.

Seed 004 contrasts two ways to cut the memory of training: *recomputation* (activation checkpointing: drop
activations in forward and recompute them in backward; lossless, a medium compute overhead of about one extra
forward pass) and *lower precision* (store values in fewer bits; lossy, a low overhead).  Seed 003 reports, for
a CIFAR-10 ResNet-50 on one V100, FP32 against mixed precision: storage 90 MB against 46 MB and 47.1 s against
25.6 s per epoch (:data:`SEED_003`).  This experiment measures the same quantities on the book's small ResNet
(:mod:`mpt_lab.models.resnet`) trained on scikit-learn's digits upsampled to ``image_size``² pixels:

1. for each of the four ways (``WAYS``), the peak memory of one training step above what was live before it
   (activations, gradients, temporaries; bytes), the step time (median of repeats after warm-up; seconds),
   memory saved and compute overhead against FP32, and whether the gradients are bit-identical to FP32's;
2. the size on disk of the model's ``state_dict`` saved with ``torch.save`` in FP32 and in FP16;
3. a short training run in FP32 and in mixed precision from the same initial weights and batch order: test
   accuracy, seconds per epoch, storage.

Mixed precision is ``torch.autocast`` with float16 and ``torch.amp.GradScaler`` on CUDA.  On a CPU it is
bfloat16 autocast without a scaler (bfloat16 has FP32's exponent range), because the CPU float16 convolution
kernels are about 100× slower than FP32 ones; the result says which was used (``mixed_dtype``).

Peak memory: on CUDA the caching allocator's counters (``torch.cuda.reset_peak_memory_stats`` and
``max_memory_allocated``).  A CPU has no such counter; :func:`mpt_lab.bench.peak_memory` counts the live
tensor storage instead (see its docstring for the method and its limits).

    python -m mpt_lab.experiments.memory_tradeoffs --profile full --out book/results/memory_tradeoffs_full.json
"""

from __future__ import annotations

import copy
import io
import math
import time
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from ..bench import peak_memory, time_call
from ..data import digits_data
from ..device import provenance
from ..models.resnet import build_resnet
from ._common import JsonResult, backward_step, main as _main, prepare

__all__ = ["Config", "MemoryTradeoffsResult", "config_for", "run", "tradeoff_table", "training_table", "measure_peak_bytes",
           "checkpoint_bytes", "upsampled_digits", "WAYS", "SEED_003", "SEED_004", "NAME"]

NAME = "memory_tradeoffs"

#: The four ways to train, in the order the result lists them: (mixed precision?, activation checkpointing?).
WAYS = {"fp32": (False, False), "mixed": (True, False), "checkpoint": (False, True),
        "mixed+checkpoint": (True, True)}

#: Seed 003 (study notes on Micikevicius et al. 2018, quoting github.com/suvojit-0x55aa/mixed-precision-pytorch):
#: CIFAR-10, ResNet-50, batch 128, 200 epochs on one NVIDIA V100.  Cited, not computed.
SEED_003 = {
    "source": "seed 003: suvojit-0x55aa/mixed-precision-pytorch, CIFAR-10 ResNet-50, batch 128, 200 epochs",
    "device": "1× NVIDIA V100",
    "fp32": {"storage_mb": 90.0, "epoch_seconds": 47.112, "accuracy": 0.9487},
    "mixed": {"storage_mb": 46.0, "epoch_seconds": 25.601, "accuracy": 0.9465},
}

#: Seed 004's qualitative table (a book chapter on GPU memory).  Cited, not computed.
SEED_004 = {
    "recomputation": {"lossless": True, "overhead": "medium (about one extra forward pass)"},
    "lower precision": {"lossless": False, "overhead": "low"},
}


# --------------------------------------------------------------------------------------------------- memory
def measure_peak_bytes(fn, device=None) -> int:
    """Peak bytes allocated while ``fn()`` runs, above what was allocated before it (int, bytes): the
    method of :func:`mpt_lab.bench.peak_memory` (CUDA allocator counters; on a CPU, live tensor storage
    tracked by a dispatch mode, a lower bound that misses operator workspaces)."""
    return int(peak_memory(fn, device if device is not None else "cpu"))


def checkpoint_bytes(model: torch.nn.Module, dtype: torch.dtype = torch.float32) -> int:
    """Bytes of ``torch.save(state_dict)`` written to memory, floating-point tensors cast to ``dtype``
    (integer buffers such as BatchNorm's ``num_batches_tracked`` are kept)."""
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    sd = {k: (v.detach().to("cpu", dtype) if v.is_floating_point() else v.detach().cpu())
          for k, v in model.state_dict().items()}
    buf = io.BytesIO()
    torch.save(sd, buf)
    return buf.getbuffer().nbytes


# --------------------------------------------------------------------------------------------------- config
@dataclass
class Config:
    """Size and settings of one run."""

    profile: str = "cpu"
    image_size: int = 32        # the 8×8 digits are upsampled (bilinear) to image_size × image_size
    width: int = 16
    stages: int = 3
    depth: int = 1
    batch_size: int = 64        # batch of the memory/time measurement and of training
    repeat: int = 5             # timed steps per way (the median is reported)
    warmup: int = 2
    epochs: int = 3
    lr: float = 0.02           # higher rates leave BatchNorm's running statistics behind the weights
    momentum: float = 0.9
    mixed_dtype: str = "auto"   # "auto": float16 on CUDA, bfloat16 elsewhere; or "float16", "bfloat16"
    seed: int = 0
    device: str = "auto"
    threads: int = 0


def config_for(profile: str) -> Config:
    """quick: CI (≤ 25 s on a CPU); cpu: ≤ 3 minutes on 2 cores; full: a GPU (≤ 8 minutes on an H100)."""
    if profile == "quick":
        return Config(profile="quick", image_size=16, width=8, batch_size=32, repeat=3, warmup=1, epochs=4,
                      threads=1)
    if profile == "cpu":
        return Config(profile="cpu", image_size=32, width=16, depth=2, batch_size=64, repeat=5, warmup=2, epochs=5,
                      threads=1)
    if profile == "full":
        return Config(profile="full", image_size=64, width=64, stages=4, depth=2, batch_size=256, repeat=10,
                      warmup=3, epochs=10)
    raise ValueError(f"profile must be one of 'quick', 'cpu', 'full', got {profile!r}")


def _check(config: Config) -> None:
    if not isinstance(config, Config):
        raise TypeError(f"config must be a Config, got {type(config).__name__}")
    for name in ("image_size", "width", "stages", "depth", "batch_size", "repeat", "epochs"):
        v = getattr(config, name)
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise ValueError(f"config.{name} must be a positive int, got {v!r}")
    if not isinstance(config.warmup, int) or config.warmup < 0:
        raise ValueError(f"config.warmup must be an int ≥ 0, got {config.warmup!r}")
    if config.image_size < 2 ** (config.stages - 1):
        raise ValueError(f"config.image_size must be ≥ 2**(stages-1) = {2 ** (config.stages - 1)}, "
                         f"got {config.image_size}")
    if config.mixed_dtype not in ("auto", "float16", "bfloat16"):
        raise ValueError(f"config.mixed_dtype must be 'auto', 'float16' or 'bfloat16', got {config.mixed_dtype!r}")
    if not (isinstance(config.lr, (int, float)) and config.lr > 0 and math.isfinite(config.lr)):
        raise ValueError(f"config.lr must be a positive finite number, got {config.lr!r}")


def upsampled_digits(image_size: int = 32, seed: int = 0, device="cpu"):
    """The digits of :func:`~mpt_lab.data.digits_data` as images ``[N, 1, S, S]``
    float32 (S = ``image_size``, bilinear upsampling of the 8×8 originals): (x_train, y_train, x_test, y_test)."""
    xtr, ytr, xte, yte = digits_data(seed, device)
    up = lambda x: F.interpolate(x.reshape(-1, 1, 8, 8), size=(image_size, image_size), mode="bilinear",
                                 align_corners=False)
    return up(xtr), ytr, up(xte), yte


# --------------------------------------------------------------------------------------------------- result
@dataclass
class MemoryTradeoffsResult(JsonResult):
    NAME = NAME

    config: dict
    provenance: dict
    mixed_dtype: str        # "float16" (with GradScaler) or "bfloat16" (no scaler)
    mixed_note: str
    memory_method: str
    param_bytes: int        # bytes of the FP32 weights
    ways: dict              # way -> {peak_bytes, step_seconds, step_times, memory_saved, overhead, bit_identical,
                            #         grad_rel_diff, loss}
    storage: dict           # {"fp32_bytes", "fp16_bytes", "ratio"}
    training: dict          # {"fp32": {...}, "mixed": {...}}: accuracy (evaluated in the training precision),
                            # accuracy_fp32_eval, epoch_seconds (median), epoch_times, final_loss, storage_bytes
    seed_003: dict
    seed_004: dict

    def describe(self) -> str:
        lines = [f"memory trade-offs ({self.config['profile']} profile, {self.provenance['device']}; "
                 f"mixed = {self.mixed_dtype} autocast)",
                 f"{'way':<17}{'peak MB':>9}{'step ms':>9}{'saved':>8}{'overhead':>10}  bit-identical to FP32"]
        for k, w in self.ways.items():
            lines.append(f"{k:<17}{w['peak_bytes'] / 1e6:>9.2f}{w['step_seconds'] * 1e3:>9.1f}"
                         f"{w['memory_saved']:>8.1%}{w['overhead']:>+10.1%}  {w['bit_identical']}"
                         + ("" if w["bit_identical"] else f" (relative gradient difference {w['grad_rel_diff']:.1e})"))
        s = self.storage
        lines.append(f"checkpoint on disk: FP32 {s['fp32_bytes'] / 1e6:.3f} MB, FP16 {s['fp16_bytes'] / 1e6:.3f} MB "
                     f"(ratio {s['ratio']:.3f}; seed 003: 90 MB vs 46 MB)")
        t = self.training
        lines.append(f"training {self.config['epochs']} epochs: accuracy FP32 {t['fp32']['accuracy']:.3f} vs mixed "
                     f"{t['mixed']['accuracy']:.3f}; s/epoch {t['fp32']['epoch_seconds']:.2f} vs "
                     f"{t['mixed']['epoch_seconds']:.2f} (seed 003 V100: 47.1 vs 25.6)")
        return "\n".join(lines)



# --------------------------------------------------------------------------------------------------- run
def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _make_step(model, opt, scaler, x, y, device, mixed, dtype):
    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device.type, dtype=dtype, enabled=mixed):
            loss = F.cross_entropy(model(x), y)
        backward_step(loss, opt, scaler)
        return loss
    return step


def _grads(model, x, y, device, mixed, dtype):
    """Loss and gradients of one forward/backward pass (no optimizer step, no loss scale)."""
    model.zero_grad(set_to_none=True)
    with torch.autocast(device.type, dtype=dtype, enabled=mixed):
        loss = F.cross_entropy(model(x), y)
    loss.backward()
    return loss.detach().float(), [p.grad.detach().clone() for p in model.parameters()]


def _precise_bn(model, x, batch_size, device, mixed, dtype):
    """Recompute BatchNorm's running statistics as exact averages over the training images with the final
    weights ("precise BN"; Wu & Johnson, arXiv:2105.07576), so that test accuracy measures the weights and not
    how far the exponential running averages lag behind them after a few short epochs."""
    bns = [mod for mod in model.modules() if isinstance(mod, torch.nn.modules.batchnorm._BatchNorm)]
    saved = [mod.momentum for mod in bns]
    for mod in bns:
        mod.reset_running_stats()
        mod.momentum = None          # cumulative average
    model.train()
    with torch.no_grad(), torch.autocast(device.type, dtype=dtype, enabled=mixed):
        for i in range(0, len(x), batch_size):
            model(x[i:i + batch_size])
    for mod, mom in zip(bns, saved):
        mod.momentum = mom


def run(config: Config | None = None, *, command: str | None = None, progress: bool = True) -> MemoryTradeoffsResult:
    """Measure the four ways of training (``WAYS``), checkpoint sizes, and a short FP32 vs mixed training run.

    Raises TypeError when ``config`` is not a :class:`Config`, ValueError for a bad field (named).
    """
    if config is not None:
        _check(config)
    config, device = prepare(config, Config, config_for)
    name = config.mixed_dtype if config.mixed_dtype != "auto" else ("float16" if device.type == "cuda" else "bfloat16")
    dtype = getattr(torch, name)
    use_scaler = dtype == torch.float16
    note = ("float16 autocast with torch.amp.GradScaler" if use_scaler else
            "bfloat16 autocast without a loss scaler (bfloat16 has FP32's exponent range)")
    if device.type == "cpu":
        note += ("; on a CPU the float16 convolution kernels are ~100x slower than FP32, so CPU runs use bfloat16"
                 if not use_scaler else "; float16 on a CPU is slow (no fast kernels): times are not representative")
    method = ("torch.cuda max_memory_allocated - memory_allocated around one step" if device.type == "cuda" else
              "mpt_lab.bench.peak_memory: live bytes of the tensor storages created by ATen ops during one step "
              "(a dispatch mode; freed storages subtracted); a lower bound, excludes operator-internal workspaces")

    xtr, ytr, xte, yte = upsampled_digits(config.image_size, config.seed, device)
    init = build_resnet(config.width, config.stages, config.depth, seed=config.seed).to(device)
    param_bytes = sum(p.numel() * p.element_size() for p in init.parameters())
    gen = torch.Generator().manual_seed(config.seed)
    idx = torch.randperm(len(xtr), generator=gen)[:config.batch_size].to(device)
    xb, yb = xtr[idx], ytr[idx]

    # 1. exactness: gradients on one batch against plain FP32 (deterministic algorithms where they exist)
    det_prev = (torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark)
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = True, False
    try:
        ref_loss, ref = _grads(copy.deepcopy(init), xb, yb, device, False, dtype)
        exact = {}
        for way, (mixed, ckpt) in WAYS.items():
            m = copy.deepcopy(init)
            m.checkpoint = ckpt
            loss, g = _grads(m, xb, yb, device, mixed, dtype)
            same = bool(torch.equal(loss, ref_loss)) and all(torch.equal(a, b) for a, b in zip(g, ref))
            num = math.sqrt(sum(float(((a.float() - b) ** 2).sum()) for a, b in zip(g, ref)))
            den = math.sqrt(sum(float((b ** 2).sum()) for b in ref))
            exact[way] = {"bit_identical": same, "grad_rel_diff": num / den if den else 0.0,
                          "loss": float(loss), "loss_diff": float(loss - ref_loss)}
    finally:
        torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = det_prev

    # 2. memory and time per way
    ways = {}
    for way, (mixed, ckpt) in tqdm(WAYS.items(), desc="four ways", disable=not progress):
        m = copy.deepcopy(init)
        m.checkpoint = ckpt
        opt = torch.optim.SGD(m.parameters(), lr=config.lr, momentum=config.momentum)
        scaler = torch.amp.GradScaler(device.type) if (mixed and use_scaler) else None
        step = _make_step(m, opt, scaler, xb, yb, device, mixed, dtype)
        timing = time_call(step, repeat=config.repeat, warmup=max(config.warmup, 1), device=device)
        opt.zero_grad(set_to_none=True)
        peak = measure_peak_bytes(step, device)
        ways[way] = {"peak_bytes": peak, "step_seconds": timing.median, "step_times": list(timing.times),
                     **exact[way]}
    for w in ways.values():
        w["memory_saved"] = 1.0 - w["peak_bytes"] / ways["fp32"]["peak_bytes"]
        w["overhead"] = w["step_seconds"] / ways["fp32"]["step_seconds"] - 1.0

    # 3. checkpoint size on disk
    fp32_b, fp16_b = checkpoint_bytes(init, torch.float32), checkpoint_bytes(init, torch.float16)
    storage = {"fp32_bytes": fp32_b, "fp16_bytes": fp16_b, "ratio": fp16_b / fp32_b}

    # 4. training: FP32 and mixed from the same weights, on the same batches
    training = {}
    for label, mixed in (("fp32", False), ("mixed", True)):
        m = copy.deepcopy(init)
        opt = torch.optim.SGD(m.parameters(), lr=config.lr, momentum=config.momentum)
        scaler = torch.amp.GradScaler(device.type) if (mixed and use_scaler) else None
        g = torch.Generator().manual_seed(config.seed + 1)
        times, losses = [], []
        for _ in tqdm(range(config.epochs), desc=f"train {label}", disable=not progress):
            perm = torch.randperm(len(xtr), generator=g).to(device)
            _sync(device)
            t0 = time.perf_counter()
            for i in range(0, len(perm), config.batch_size):
                b = perm[i:i + config.batch_size]
                loss = _make_step(m, opt, scaler, xtr[b], ytr[b], device, mixed, dtype)()
            losses.append(float(loss.detach()))
            _sync(device)
            times.append(time.perf_counter() - t0)
        _precise_bn(m, xtr, config.batch_size, device, mixed, dtype)
        m.eval()
        with torch.no_grad(), torch.autocast(device.type, dtype=dtype, enabled=mixed):
            acc = float((m(xte).argmax(1) == yte).float().mean())
        with torch.no_grad():  # the same weights evaluated in FP32: separates training from inference rounding
            acc32 = float((m(xte).argmax(1) == yte).float().mean())
        sb = checkpoint_bytes(m, dtype if mixed else torch.float32)
        training[label] = {"accuracy": acc, "accuracy_fp32_eval": acc32, "epoch_seconds": sorted(times)[len(times) // 2], "epoch_times": times,
                           "final_loss": losses[-1], "storage_bytes": sb}

    cfg = asdict(config)
    prov = provenance(command=command or f"python -m mpt_lab.experiments.{NAME} --profile {config.profile}",
                      config=cfg, device=device)
    return MemoryTradeoffsResult(cfg, prov, name, note, method, int(param_bytes), ways, storage, training,
                                 copy.deepcopy(SEED_003), copy.deepcopy(SEED_004))


def _mib(b) -> str:
    return "–" if b is None else f"{b / 2**20:.2f}"


def tradeoff_table(result: "MemoryTradeoffsResult"):
    """Seed 004's comparison, measured: per way, peak memory, step time, memory saved, compute overhead, and
    whether the gradients are bit-identical to FP32 (lossless) — beside the seed's qualitative verdict."""
    from ..widgets import table_html

    if not isinstance(result, MemoryTradeoffsResult):
        raise TypeError(f"result must be a MemoryTradeoffsResult, got {type(result).__name__}")
    def say(d):
        return ("lossless" if d["lossless"] else "lossy") + ", overhead " + d["overhead"]

    verdict = {"fp32": "baseline", "mixed": "lower precision: " + say(SEED_004["lower precision"]),
               "checkpoint": "recomputation: " + say(SEED_004["recomputation"]), "mixed+checkpoint": "both"}
    rows = []
    for way, w in result.ways.items():
        rows.append([way, _mib(w["peak_bytes"]), f"{1e3 * w['step_seconds']:.1f}", f"{100 * w['memory_saved']:.0f}%",
                     f"{100 * w['overhead']:+.0f}%", "yes" if w["bit_identical"] else f"no ({w['grad_rel_diff']:.2g})",
                     verdict.get(way, "")])
    return table_html(["way", "peak MiB (one step)", "ms / step", "memory saved", "compute overhead",
                       "lossless (gradients identical to FP32; else relative difference)", "seed 004 says"], rows)


def training_table(result: "MemoryTradeoffsResult"):
    """FP32 against mixed precision: accuracy, time per epoch, checkpoint size — beside seed 003's CIFAR-10
    ResNet-50 numbers (cited, not computed)."""
    from ..widgets import table_html

    if not isinstance(result, MemoryTradeoffsResult):
        raise TypeError(f"result must be a MemoryTradeoffsResult, got {type(result).__name__}")
    t = result.training
    dev = result.provenance["device"].split(" (")[0]
    rows = []
    for k, label in (("fp32", "FP32"), ("mixed", f"mixed ({result.mixed_dtype})")):
        rows.append([label, f"{100 * t[k]['accuracy']:.2f}%", f"{t[k]['epoch_seconds']:.3g}",
                     _mib(t[k]["storage_bytes"])])
    s3 = SEED_003
    for k, label in (("fp32", "FP32"), ("mixed", "mixed")):
        rows.append([f"seed 003: {label}, CIFAR-10 ResNet-50 ({s3['device']})", f"{100 * s3[k]['accuracy']:.2f}%",
                     f"{s3[k]['epoch_seconds']:.3g}", f"{s3[k]['storage_mb']:.0f} (MB)"])
    return table_html(["run", "test accuracy", "s / epoch", "checkpoint MiB"],
                      [[f"this book: {r[0]}, ResNet on digits ({dev}, {result.config['profile']} profile)"] + r[1:]
                       for r in rows[:2]] + rows[2:])


def main(argv=None) -> int:
    return _main(__doc__.splitlines()[0], run, config_for, argv)


if __name__ == "__main__":
    raise SystemExit(main())
