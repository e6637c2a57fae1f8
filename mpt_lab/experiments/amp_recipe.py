"""The PyTorch AMP recipe (seed 002): time, peak memory and throughput of FP32, FP16 autocast + GradScaler and
BF16 autocast on a stack of Linear layers.

The recipe's network is ``num_layers`` ``Linear(width, width)`` layers with ReLU between them (width 4096,
3 layers), MSE loss, SGD lr 0.001, 50 batches of random data per epoch, 3 epochs, batch sizes 128, 256, 512
and 513 (multiples of 8 use tensor cores; 513 does not).  Three precisions:

- ``fp32``: default precision;
- ``fp16``: ``torch.autocast(device, dtype=torch.float16)`` with ``torch.amp.GradScaler``;
- ``bf16``: ``torch.autocast(device, dtype=torch.bfloat16)``, no scaler (bfloat16 has FP32's exponent range).

For each (precision, batch size): the median time of an epoch (after warm-up epochs; CUDA-event timing on CUDA),
the peak tensor memory of one epoch that also builds the model and optimizer (``mpt_lab.bench.peak_memory``),
the achieved TFLOP/s counting ``6 · batch · width · width`` FLOPs per Linear per step (2 for the forward
product, 2 for the input gradient, 2 for the weight gradient; bias, ReLU, loss and optimizer are not counted,
and the first layer's input gradient, which autograd skips, is counted by convention), and that throughput as a
fraction of the measured matrix-multiply peak of the precision's dtype (``mpt_lab.bench.matmul_peak_tflops``).

On a CPU the recipe's size is far too slow in FP16 (no native float16 matrix kernel: ≈ 1–20 GFLOP/s against
≈ 100 for float32 and ≈ 200 for bfloat16), so the "quick" and "cpu" profiles shrink the width and the number of
batches; the result records the measured per-dtype throughputs and the CPU's instruction-set flags as evidence.

    python -m mpt_lab.experiments.amp_recipe --profile full --out book/results/amp_recipe_full.json
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

import torch
from tqdm.auto import tqdm

from ..bench import matmul_peak_tflops, peak_memory, time_call
from ..device import default_device, provenance
from ._common import JsonResult, backward_step, main as _main, prepare

__all__ = ["Config", "AmpRecipeResult", "config_for", "run", "make_model", "flops_per_step", "PRECISIONS",
           "NAME", "probe_autocast", "speedup_table", "RECIPE_CLAIM"]

NAME = "amp_recipe"
PRECISIONS = ("fp32", "fp16", "bf16")
_DTYPE = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
_DTYPE_NAME = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}


@dataclass
class Config:
    """Size and settings of one run (the recipe's values are the defaults)."""

    profile: str = "full"
    width: int = 4096                 # in_size = out_size
    num_layers: int = 3
    batch_sizes: tuple = (128, 256, 512, 513)
    num_batches: int = 50             # batches per epoch
    epochs: int = 3                   # timed epochs (median reported)
    warmup_epochs: int = 1            # untimed epochs before timing
    lr: float = 0.001
    precisions: tuple = PRECISIONS
    peak_n: int = 0                   # matrix size for the matmul peak; 0: max(width, 512)
    measure_memory: bool = True
    seed: int = 0
    device: str = "auto"
    threads: int = 0                  # torch.set_num_threads when > 0


def config_for(profile: str) -> Config:
    """quick: CI (≤ 20 s on a CPU); cpu: ≤ 3 minutes on 2 cores; full: the recipe's size on a GPU (≤ 8 min)."""
    if profile == "quick":
        return Config(profile="quick", width=256, num_batches=4, epochs=2, warmup_epochs=1, threads=1)
    if profile == "cpu":
        return Config(profile="cpu", width=512, num_batches=8, epochs=3, warmup_epochs=1, threads=1)
    if profile == "full":
        return Config(profile="full", peak_n=8192)
    raise ValueError(f"profile must be one of 'quick', 'cpu', 'full', got {profile!r}")


def flops_per_step(batch: int, width: int, num_layers: int) -> int:
    """FLOPs of one training step by the stated convention: ``6 · batch · width² `` per Linear (forward 2, input
    gradient 2, weight gradient 2), times ``num_layers``."""
    return 6 * batch * width * width * num_layers


def make_model(width: int, num_layers: int, device="cpu") -> torch.nn.Sequential:
    """The recipe's network: ``num_layers`` × ``Linear(width, width)`` with ReLU between them (none after the
    last), float32 parameters on ``device``."""
    layers = []
    for i in range(num_layers):
        layers.append(torch.nn.Linear(width, width))
        if i < num_layers - 1:
            layers.append(torch.nn.ReLU())
    return torch.nn.Sequential(*layers).to(device)


def _validate(config: Config) -> None:
    if not isinstance(config, Config):
        raise TypeError(f"config must be a Config, got {type(config).__name__}")
    for name in ("width", "num_layers", "num_batches", "epochs"):
        v = getattr(config, name)
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise ValueError(f"config.{name} must be an int ≥ 1, got {v!r}")
    if not isinstance(config.warmup_epochs, int) or config.warmup_epochs < 0:
        raise ValueError(f"config.warmup_epochs must be an int ≥ 0, got {config.warmup_epochs!r}")
    bs = tuple(config.batch_sizes)
    if not bs or any(not isinstance(b, int) or isinstance(b, bool) or b < 1 for b in bs):
        raise ValueError(f"config.batch_sizes must be a non-empty sequence of ints ≥ 1, got {config.batch_sizes!r}")
    prec = tuple(config.precisions)
    if not prec or any(p not in PRECISIONS for p in prec):
        raise ValueError(f"config.precisions must be a non-empty subset of {PRECISIONS}, got {config.precisions!r}")
    if "fp32" not in prec:
        raise ValueError("config.precisions must include 'fp32' (the baseline of the speed-ups)")
    if not (isinstance(config.lr, (int, float)) and config.lr > 0):
        raise ValueError(f"config.lr must be a positive number, got {config.lr!r}")


@dataclass
class AmpRecipeResult(JsonResult):
    NAME = NAME

    config: dict
    provenance: dict
    rows: list                 # one dict per (precision, batch size); keys in ROW_KEYS
    speedup: dict              # {precision: {str(batch): fp32 epoch time / precision epoch time}}
    matmul_tflops: dict        # {"float32": TFLOP/s, "float16": ..., "bfloat16": ...} measured peaks
    note: str = ""             # why the numbers look as they do on this device (CPU: FP16 vs BF16)
    flops_convention: str = "6 * batch * width**2 FLOPs per Linear per step (forward + backward)"
    cpu_flags: list = field(default_factory=list)

    def row(self, precision: str, batch: int) -> dict:
        for r in self.rows:
            if r["precision"] == precision and r["batch"] == batch:
                return r
        raise KeyError(f"no row for precision={precision!r}, batch={batch!r}")

    def describe(self) -> str:
        c = self.config
        lines = [f"AMP recipe ({c['profile']} profile, {self.provenance['device']}): {c['num_layers']} × "
                 f"Linear({c['width']}, {c['width']}), {c['num_batches']} batches/epoch, median of {c['epochs']} epochs",
                 "matmul peak: " + ", ".join(f"{k} {v * 1e3:.1f} GFLOP/s" for k, v in self.matmul_tflops.items()),
                 f"{'precision':>9} {'batch':>5} {'s/epoch':>9} {'peak MiB':>9} {'TFLOP/s':>8} {'of peak':>7} {'speed-up':>8}"]
        for r in self.rows:
            mem = "-" if r["peak_bytes"] is None else f"{r['peak_bytes'] / 2**20:.1f}"
            sp = self.speedup.get(r["precision"], {}).get(str(r["batch"]), 1.0)
            lines.append(f"{r['precision']:>9} {r['batch']:>5} {r['epoch_seconds']:>9.4f} {mem:>9} "
                         f"{r['tflops']:>8.4f} {r['fraction_of_peak']:>7.1%} {sp:>7.2f}×")
        if self.note:
            lines.append(self.note)
        return "\n".join(lines)


#: The recipe's claim (seed 002): "2–3× speed-up on Volta, Turing and Ampere GPUs, less on older ones".
RECIPE_CLAIM = "2–3× on tensor-core GPUs (Volta, Turing, Ampere); less on older GPUs"

#: Ops probed by :func:`probe_autocast`: name → function of float32 inputs (a [8, 16] matrix x, [16, 16] w, …).
_PROBES = {
    "linear": lambda t: torch.nn.functional.linear(t["x"], t["w"]),
    "matmul (@)": lambda t: t["x"] @ t["w"],
    "conv2d": lambda t: torch.nn.functional.conv2d(t["img"], t["k"]),
    "addmm": lambda t: torch.addmm(t["b"], t["x"], t["w"]),
    "bmm": lambda t: torch.bmm(t["x"][None], t["w"][None]),
    "relu": lambda t: torch.relu(t["x"]),
    "add (x + x)": lambda t: t["x"] + t["x"],
    "softmax": lambda t: torch.softmax(t["x"], -1),
    "log_softmax": lambda t: torch.log_softmax(t["x"], -1),
    "cross_entropy": lambda t: torch.nn.functional.cross_entropy(t["x"], t["y"]),
    "mse_loss": lambda t: torch.nn.functional.mse_loss(t["x"], t["x"] * 0.5),
    "layer_norm": lambda t: torch.nn.functional.layer_norm(t["x"], (16,)),
    "exp": lambda t: torch.exp(t["x"]),
    "sum": lambda t: t["x"].sum(),
    "linear → relu": lambda t: torch.relu(torch.nn.functional.linear(t["x"], t["w"])),
    "linear → softmax": lambda t: torch.softmax(torch.nn.functional.linear(t["x"], t["w"]), -1),
}


def probe_autocast(device=None, dtype=torch.float16) -> dict:
    """Which dtype each op returns under ``torch.autocast(device, dtype)`` with float32 inputs: probed, not
    typed from the documentation.

    Returns
    -------
    dict op name → output dtype name (e.g. "float16"), or "error: …" when the op fails under autocast on
    this device.
    """
    device = torch.device(device) if device is not None else default_device()
    g = torch.Generator().manual_seed(0)
    t = {"x": torch.randn(8, 16, generator=g), "w": torch.randn(16, 16, generator=g),
         "b": torch.randn(16, generator=g), "img": torch.randn(1, 3, 8, 8, generator=g),
         "k": torch.randn(4, 3, 3, 3, generator=g), "y": torch.randint(0, 16, (8,), generator=g)}
    t = {k: v.to(device) for k, v in t.items()}
    out = {}
    for name, fn in _PROBES.items():
        try:
            with torch.autocast(device.type, dtype=dtype):
                out[name] = str(fn(t).dtype).replace("torch.", "")
        except Exception as err:  # e.g. an op without a kernel for this dtype on this device
            out[name] = f"error: {type(err).__name__}"
    return out


def speedup_table(results: dict):
    """HTML table: seconds per epoch and speed-up over FP32 per precision and batch size, one block per result.

    Parameters
    ----------
    results : dict label → AmpRecipeResult
    """
    from ..widgets import table_html

    if not isinstance(results, dict) or not all(isinstance(r, AmpRecipeResult) for r in results.values()):
        raise TypeError("results must be a dict of label → AmpRecipeResult")
    rows = []
    for label, r in results.items():
        dev = r.provenance["device"].split(" (")[0]
        for row in r.rows:
            sp = r.speedup.get(row["precision"], {}).get(str(row["batch"]), 1.0)
            rows.append([f"{label} ({dev}, {r.config['profile']})", row["precision"], row["batch"],
                         f"{row['epoch_seconds']:.4g}", f"{sp:.2f}×", f"{row['tflops'] * 1e3:.3g}",
                         f"{100 * row['fraction_of_peak']:.0f}%",
                         "–" if row["peak_bytes"] is None else f"{row['peak_bytes'] / 2**20:.1f}"])
    return table_html(["run", "precision", "batch", "s / epoch", "speed-up vs FP32", "GFLOP/s",
                       "of measured matmul peak", "peak MiB"], rows)


def _cpu_flags() -> list:
    wanted = ("avx2", "avx512f", "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16", "amx_fp16", "f16c")
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    have = set(line.split(":", 1)[1].split())
                    return [w for w in wanted if w in have]
    except OSError:
        pass
    return []


def _cpu_note(peaks: dict, flags: list) -> str:
    g = {k: v * 1e3 for k, v in peaks.items()}
    s = (f"On this CPU a matrix product runs at {g.get('float32', float('nan')):.1f} GFLOP/s in float32, "
         f"{g.get('bfloat16', float('nan')):.1f} in bfloat16 and {g.get('float16', float('nan')):.1f} in float16 "
         f"(measured).  ")
    has_bf16 = any(f in flags for f in ("avx512_bf16", "amx_bf16"))
    has_fp16 = any(f in flags for f in ("avx512_fp16", "amx_fp16"))
    s += ("bfloat16 is fast because the CPU has bfloat16 dot-product instructions "
          f"({', '.join(f for f in flags if 'bf16' in f)}) that oneDNN uses; " if has_bf16 else
          "bfloat16 has no native instructions here either; ")
    s += ("float16 has native instructions too, so a slow float16 points at the kernel library." if has_fp16 else
          "float16 is slow because the CPU has no float16 arithmetic instructions (no avx512_fp16 or amx_fp16; "
          "f16c only converts), so torch's float16 matrix products take a generic path that converts element by "
          "element.  The FP16 'speed-up' is therefore a slow-down on this machine; on a GPU both use "
          "tensor cores.  Sizes are shrunk from the recipe's 4096 to keep the CPU run short.")
    return s


def _train_epoch(model, opt, scaler, batches, precision: str, device: torch.device) -> None:
    loss_fn = torch.nn.functional.mse_loss
    for x, y in batches:
        if precision == "fp32":
            loss = loss_fn(model(x), y)
        else:
            with torch.autocast(device.type, dtype=_DTYPE[precision]):
                out = model(x)                 # Linear output in float16/bfloat16
                loss = loss_fn(out, y)         # mse_loss autocasts to float32
        backward_step(loss, opt, scaler)
        opt.zero_grad(set_to_none=True)


def _make(config: Config, precision: str, device: torch.device, seed: int):
    torch.manual_seed(seed)
    model = make_model(config.width, config.num_layers, device)
    opt = torch.optim.SGD(model.parameters(), lr=config.lr)
    scaler = torch.amp.GradScaler(device.type) if precision == "fp16" else None
    return model, opt, scaler


def run(config: Config | None = None, *, command: str | None = None, progress: bool = True) -> AmpRecipeResult:
    """Run the recipe for every (precision, batch size) of ``config``.

    Raises TypeError when ``config`` is not a :class:`Config`, ValueError for a bad field (named).
    """
    if config is not None:
        _validate(config)
    config, device = prepare(config, Config, config_for)
    precisions = tuple(config.precisions)
    batch_sizes = tuple(int(b) for b in config.batch_sizes)
    peak_n = config.peak_n or max(config.width, 512)
    dtypes = sorted({_DTYPE_NAME[p] for p in precisions}, key=["float32", "float16", "bfloat16"].index)
    peaks = {}
    for name in tqdm(dtypes, desc="matmul peak", disable=not progress):
        peaks[name] = matmul_peak_tflops(device, getattr(torch, name), peak_n)
    rows = []
    combos = [(p, b) for b in batch_sizes for p in precisions]
    for precision, batch in tqdm(combos, desc="AMP recipe", disable=not progress):
        g = torch.Generator(device=device).manual_seed(config.seed + batch)
        batches = [(torch.randn(batch, config.width, device=device, generator=g),
                    torch.randn(batch, config.width, device=device, generator=g)) for _ in range(config.num_batches)]
        model, opt, scaler = _make(config, precision, device, config.seed)
        timing = time_call(lambda: _train_epoch(model, opt, scaler, batches, precision, device),
                           repeat=config.epochs, warmup=config.warmup_epochs, device=device, timer="auto")
        del model, opt, scaler
        peak = None
        if config.measure_memory:
            def one_epoch():
                m, o, s = _make(config, precision, device, config.seed)
                _train_epoch(m, o, s, batches, precision, device)
            peak = peak_memory(one_epoch, device)
        secs = timing.median
        tflops = flops_per_step(batch, config.width, config.num_layers) * config.num_batches / secs / 1e12
        pk = peaks[_DTYPE_NAME[precision]]
        rows.append({"precision": precision, "batch": batch, "dtype": _DTYPE_NAME[precision],
                     "epoch_seconds": secs, "epoch_times": list(timing.times), "timer": timing.method,
                     "peak_bytes": peak, "tflops": tflops, "fraction_of_peak": tflops / pk if pk > 0 else math.nan})
        del batches
    base = {r["batch"]: r["epoch_seconds"] for r in rows if r["precision"] == "fp32"}
    speedup = {p: {str(r["batch"]): base[r["batch"]] / r["epoch_seconds"] for r in rows if r["precision"] == p}
               for p in precisions if p != "fp32"}
    flags = _cpu_flags() if device.type == "cpu" else []
    note = _cpu_note(peaks, flags) if device.type == "cpu" else (
        f"CUDA: float32 matmul TF32 allowed = {torch.backends.cuda.matmul.allow_tf32}; "
        "batch sizes that are multiples of 8 let float16/bfloat16 products use tensor cores fully.")
    cfg = asdict(config)
    cfg["batch_sizes"], cfg["precisions"] = list(batch_sizes), list(precisions)
    cfg["peak_n_used"] = peak_n
    prov = provenance(command=command or f"python -m mpt_lab.experiments.{NAME} --profile {config.profile}",
                      config=cfg, device=device)
    return AmpRecipeResult(cfg, prov, rows, speedup, peaks, note, cpu_flags=flags)


def main(argv=None) -> int:
    return _main(__doc__.splitlines()[0], run, config_for, argv)


if __name__ == "__main__":
    raise SystemExit(main())
