"""Seed 001's end-to-end example: a 3-layer GAT trained in FP32, with FP16 autocast + GradScaler, and in BF16.

Seed 001 (DGL User Guide, chapter 8) trains a 3-layer GAT (hidden 256, heads [1, 1, 1], ELU, last layer
averaging its heads) on Reddit with self loops for 100 epochs with Adam (lr 1e-3, weight decay 5e-4), forward
under ``autocast``, backward through ``GradScaler``, and reports on a 16 GB V100: 15.2 GB without FP16, 12.8 GB
with it, and for heads [2, 2, 2] out of memory without FP16, 15.7 GB with it (:data:`SEED_001`).

This experiment trains the same network (:class:`mpt_lab.models.gat.GAT`, PyTorch Geometric's ``GATConv``)
full-batch, with loss on the training nodes, for heads [h, h, h] with each h in ``config.heads`` and each
precision in ``config.precisions``:

* ``fp32``: no autocast;
* ``fp16``: ``torch.autocast(dtype=float16)`` and ``torch.amp.GradScaler`` (the seed's recipe);
* ``bf16``: ``torch.autocast(dtype=bfloat16)`` without a scaler (bfloat16 has FP32's exponent range).

All runs of one head count start from the same weights.  Per run it records the loss of every epoch, the
accuracy on the train/val/test nodes after training (forward in the run's precision), the time per epoch
(``time.perf_counter`` around each epoch, CUDA synchronised; the median of the epochs after the first two
is reported), and peak memory:

* ``peak_bytes``: the peak of tensor memory allocated during one training step (the third epoch) above what
  was allocated before it — activations, gradients, temporaries (:func:`mpt_lab.bench.peak_memory`: on CUDA
  the caching allocator's ``max_memory_allocated``; on a CPU the live bytes of tensor storages made by ATen
  operators, tracked by a dispatch mode — a lower bound that misses operator-internal scratch memory);
* ``static_bytes``: what stays allocated between steps: the graph (edges, features, labels, masks), the
  weights and Adam's two moment buffers (float32);
* ``total_bytes`` = ``static_bytes + peak_bytes``: the quantity comparable to the seed's "GPU memory"
  (which also counts the allocator's cache and the CUDA context, so it is higher than ours for the same run).

**The graph is synthetic** (:func:`mpt_lab.data.graphs.synthetic_reddit`): Reddit's 602 features and 41
classes, its split fractions, class-dependent features and homophilous edges; Reddit itself cannot be
downloaded here.  Sizes per profile (:func:`config_for`):

* quick / cpu: a few hundred / thousand nodes (FP16 matrix products are slow on a CPU);
* full: Reddit's 232,965 nodes and an average degree of 20 (≈ 4.9 million edges with self loops, about 1/23
  of Reddit's 114.8 million).  PyG's ``GATConv`` materialises per-edge tensors of shape [E, heads, 256]
  (the gathered source features and the messages; 4 bytes each in FP32), where DGL uses fused sparse kernels:
  at Reddit's 114.8 million edges one such FP32 tensor for heads 1 is 118 GB, more than an 80 GB H100 holds.
  At 4.9 million edges one such tensor is 10 GB for the largest run (heads 2, FP32); a training step keeps
  about five of them alive at its peak (measured on a CPU with :func:`mpt_lab.bench.peak_memory`: 5.0 × E ×
  heads × 256 × 4 bytes per step for graphs of 61k and 121k edges), ≈ 51 GB, and 6 runs × 100 epochs fit in
  the 8-minute budget of one H100.  A run that still runs out of memory is recorded as such
  (``oom: True``), not retried.

    python -m mpt_lab.experiments.gat_amp --profile full --out book/results/gat_amp_full.json
"""

from __future__ import annotations

import copy
import math
import statistics
import time
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from .. import formats
from ..bench import peak_memory
from ..data.graphs import REDDIT, synthetic_reddit
from ..device import provenance
from ._common import JsonResult, backward_step, main as _main, prepare

__all__ = ["Config", "config_for", "run", "GatAmpResult", "SEED_001", "PRECISIONS", "NAME", "memory_table",
           "budget_table", "autocast_policy", "attention_overflow", "FP16_EXP_LIMIT"]

NAME = "gat_amp"
PRECISIONS = ("fp32", "fp16", "bf16")
_DTYPE = {"fp32": None, "fp16": torch.float16, "bf16": torch.bfloat16}
_OOM = getattr(torch, "OutOfMemoryError", torch.cuda.OutOfMemoryError)

#: Seed 001 (DGL User Guide, chapter 8, "End-to-End Mixed Precision Training"): 3-layer GAT on Reddit
#: (114 million edges with self loops), 100 epochs, one NVIDIA V100 with 16 GB.  "GPU memory" as the seed
#: reports it (GB; presumably the device's used memory).  Cited, not computed.
SEED_001 = {
    "source": "seed 001: DGL User Guide, chapter 8 (Mixed Precision Training), GAT on Reddit",
    "device": "NVIDIA V100 (16 GB)",
    "gpu_memory_gb": 16.0,
    "epochs": 100,
    "runs": {
        "[1, 1, 1]": {"fp32": {"memory_gb": 15.2, "oom": False}, "fp16": {"memory_gb": 12.8, "oom": False}},
        "[2, 2, 2]": {"fp32": {"memory_gb": None, "oom": True}, "fp16": {"memory_gb": 15.7, "oom": False}},
    },
    "loss": "converges to similar values with and without fp16",
}

#: The largest x whose exponential is finite in FP16: ln(65504) ≈ 11.09 (65504 = FP16's largest finite value).
FP16_EXP_LIMIT = math.log(formats.FP16.max)


# --------------------------------------------------------------------------------------------------- config
@dataclass
class Config:
    """Size and settings of one experiment (seed 001's model and optimizer are the defaults)."""

    profile: str = "cpu"
    num_nodes: int = 1500
    avg_degree: float = 16.0       # directed edges per node before self loops (Reddit ≈ 492)
    num_features: int = REDDIT["num_features"]
    num_classes: int = REDDIT["num_classes"]
    homophily: float = 0.7
    feature_signal: float = 2.0
    hidden: int = 256
    heads: tuple = (1, 2)          # each h trains heads [h, h, h]
    precisions: tuple = PRECISIONS
    epochs: int = 30
    lr: float = 1e-3
    weight_decay: float = 5e-4
    seed: int = 0
    device: str = "auto"
    threads: int = 0


def config_for(profile: str) -> Config:
    """quick: CI (≈ 10 s on one CPU core); cpu: ≈ 2 minutes on one core; full: one H100 (≤ 8 minutes).

    Raises ValueError for an unknown profile.
    """
    if profile == "quick":
        return Config(profile="quick", num_nodes=400, avg_degree=10.0, epochs=15, threads=1)
    if profile == "cpu":
        return Config(profile="cpu", num_nodes=1500, avg_degree=16.0, epochs=30, threads=1)
    if profile == "full":
        return Config(profile="full", num_nodes=REDDIT["num_nodes"], avg_degree=20.0, epochs=100)
    raise ValueError(f"profile must be one of 'quick', 'cpu', 'full', got {profile!r}")


def _check(config: Config) -> None:
    if not isinstance(config, Config):
        raise TypeError(f"config must be a Config, got {type(config).__name__}")
    for name in ("num_nodes", "num_features", "num_classes", "hidden", "epochs"):
        v = getattr(config, name)
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise ValueError(f"config.{name} must be a positive int, got {v!r}")
    if config.epochs < 3:
        raise ValueError(f"config.epochs must be ≥ 3 (two warm-up epochs, then a measured one), got {config.epochs}")
    if not config.heads or any(not isinstance(h, int) or h < 1 for h in config.heads):
        raise ValueError(f"config.heads must be a non-empty tuple of positive ints, got {config.heads!r}")
    bad = [p for p in config.precisions if p not in PRECISIONS]
    if not config.precisions or bad:
        raise ValueError(f"config.precisions must be a non-empty subset of {PRECISIONS}, got {config.precisions!r}")
    for name in ("lr", "avg_degree"):
        v = getattr(config, name)
        if not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
            raise ValueError(f"config.{name} must be a positive finite number, got {v!r}")


# --------------------------------------------------------------------------------------------------- result
@dataclass
class GatAmpResult(JsonResult):
    NAME = NAME

    config: dict
    provenance: dict
    graph: dict             # num_nodes, num_edges, num_features, num_classes, split sizes, bytes, "synthetic"
    memory_method: str
    timing_method: str
    runs: dict              # "[h, h, h]" -> precision -> {losses, accuracy{train,val,test}, epoch_seconds,
                            #   epoch_times, peak_bytes, static_bytes, total_bytes, skipped_steps, final_scale,
                            #   oom, error}
    seed_001: dict

    def ratio(self, heads: str = "[1, 1, 1]", precision: str = "fp16", key: str = "total_bytes") -> float | None:
        """``key`` of ``precision`` ÷ that of FP32 for one head setting (None when either run is missing or OOM)."""
        r = self.runs.get(heads, {})
        a, b = r.get(precision), r.get("fp32")
        if not a or not b or a.get("oom") or b.get("oom"):
            return None
        return a[key] / b[key]

    def describe(self) -> str:
        g = self.graph
        lines = [f"GAT with AMP ({self.config['profile']} profile, {self.provenance['device']}); synthetic "
                 f"Reddit-shaped graph: {g['num_nodes']:,} nodes, {g['num_edges']:,} edges",
                 f"{'heads':<11}{'precision':<10}{'final loss':>11}{'test acc':>9}{'s/epoch':>9}"
                 f"{'step peak MiB':>14}{'total MiB':>10}{'÷ FP32':>8}"]
        for hk, runs in self.runs.items():
            for p, r in runs.items():
                if r.get("oom"):
                    lines.append(f"{hk:<11}{p:<10}  out of memory: {r.get('error', '')[:60]}")
                    continue
                ratio = self.ratio(hk, p)
                lines.append(f"{hk:<11}{p:<10}{r['losses'][-1]:>11.4f}{r['accuracy']['test']:>9.3f}"
                             f"{r['epoch_seconds']:>9.3f}{r['peak_bytes'] / 2**20:>14.1f}"
                             f"{r['total_bytes'] / 2**20:>10.1f}{'' if ratio is None else f'{ratio:>8.3f}'}")
        s = self.seed_001["runs"]["[1, 1, 1]"]
        lines.append(f"seed 001 ({self.seed_001['device']}): fp16 ÷ fp32 = {s['fp16']['memory_gb']} / "
                     f"{s['fp32']['memory_gb']} = {s['fp16']['memory_gb'] / s['fp32']['memory_gb']:.3f}")
        return "\n".join(lines)


# --------------------------------------------------------------------------------------------------- run
def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _tensor_bytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def _train(model, graph, device, precision, config, progress, desc) -> dict:
    dtype = _DTYPE[precision]
    opt = torch.optim.Adam(model.parameters(), lr=config.lr, weight_decay=config.weight_decay)
    scaler = torch.amp.GradScaler(device.type) if precision == "fp16" else None
    x, ei, y, mask = graph.x, graph.edge_index, graph.y, graph.train_mask

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device.type, dtype=dtype or torch.float32, enabled=dtype is not None):
            logits = model(x, ei)
            loss = F.cross_entropy(logits[mask], y[mask])
        backward_step(loss, opt, scaler)
        return loss.detach()

    losses, times, skipped = [], [], 0
    peak = None
    for epoch in tqdm(range(config.epochs), desc=desc, disable=not progress, leave=False):
        scale_before = scaler.get_scale() if scaler is not None else None
        if epoch == 2:                       # measured apart from timing (the CPU method slows each op)
            box = {}
            peak = peak_memory(lambda: box.setdefault("loss", step()), device)
            loss = box["loss"]
        else:
            _sync(device)
            t0 = time.perf_counter()
            loss = step()
            _sync(device)
            times.append(time.perf_counter() - t0)
        losses.append(float(loss))
        if scaler is not None and scaler.get_scale() < scale_before:
            skipped += 1
    static = (graph.nbytes() + _tensor_bytes(model.parameters())
              + _tensor_bytes(t for s in opt.state.values() for t in s.values() if isinstance(t, torch.Tensor)))
    model.eval()
    with torch.no_grad(), torch.autocast(device.type, dtype=dtype or torch.float32, enabled=dtype is not None):
        pred = model(x, ei).argmax(1)
    model.train()
    acc = {k: float((pred[m] == y[m]).float().mean()) for k, m in
           (("train", graph.train_mask), ("val", graph.val_mask), ("test", graph.test_mask))}
    timed = times[1:] if len(times) > 1 else times    # the first epoch includes one-time setup
    out = {"losses": losses, "accuracy": acc, "epoch_seconds": statistics.median(timed), "epoch_times": times,
           "peak_bytes": int(peak), "static_bytes": int(static), "total_bytes": int(static + peak),
           "skipped_steps": skipped, "final_scale": scaler.get_scale() if scaler is not None else None,
           "oom": False}
    if device.type == "cuda":
        out["cuda_max_allocated_bytes"] = int(torch.cuda.max_memory_allocated(device))
    return out


def run(config: Config | None = None, *, command: str | None = None, progress: bool = True) -> GatAmpResult:
    """Train seed 001's GAT for every (heads, precision) of ``config`` on a synthetic Reddit-shaped graph.

    Raises TypeError when ``config`` is not a :class:`Config`, ValueError for a bad field (named).  A CUDA
    out-of-memory error in one run is recorded in that run (``oom``, ``error``) and the others go on.
    """
    from ..models.gat import GAT

    if config is not None:
        _check(config)
    config, device = prepare(config, Config, config_for)
    _check(config)
    graph = synthetic_reddit(config.num_nodes, config.avg_degree, num_features=config.num_features,
                             num_classes=config.num_classes, homophily=config.homophily,
                             feature_signal=config.feature_signal, seed=config.seed, device=device)
    ginfo = {"synthetic": True, "generator": "mpt_lab.data.graphs.synthetic_reddit", "num_nodes": graph.num_nodes,
             "num_edges": graph.num_edges, "num_features": graph.num_features, "num_classes": graph.num_classes,
             "train": int(graph.train_mask.sum()), "val": int(graph.val_mask.sum()),
             "test": int(graph.test_mask.sum()), "bytes": graph.nbytes(), "self_loops": True,
             "reddit": dict(REDDIT)}
    runs = {}
    todo = [(h, p) for h in config.heads for p in config.precisions]
    bar = tqdm(todo, desc="GAT runs", disable=not progress)
    for h, p in bar:
        key = f"[{h}, {h}, {h}]"
        torch.manual_seed(config.seed + h)
        init = GAT(config.num_features, config.hidden, config.num_classes, (h, h, h))
        model = copy.deepcopy(init).to(device)
        if device.type == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(device)
        try:
            rec = _train(model, graph, device, p, config, progress, f"heads {key} {p}")
        except _OOM as e:   # a real out-of-memory error on the device: recorded, not faked, not retried
            rec = {"oom": True, "error": str(e).splitlines()[0]}
        del model
        runs.setdefault(key, {})[p] = rec
    cfg = asdict(config)
    prov = provenance(command=command or f"python -m mpt_lab.experiments.{NAME} --profile {config.profile}",
                      config=cfg, device=device)
    mem = ("torch.cuda allocator: max_memory_allocated − memory_allocated around one training step "
           "(mpt_lab.bench.peak_memory), plus the bytes of graph, weights and Adam state"
           if device.type == "cuda" else
           "mpt_lab.bench.peak_memory on a CPU: peak of live tensor storage made by ATen operators during one "
           "training step (a TorchDispatchMode; a lower bound that misses operator-internal scratch buffers), "
           "plus the bytes of graph, weights and Adam state")
    timing = ("time.perf_counter around each full-batch epoch (one training step), CUDA synchronised; median "
              "of the epochs after the first, the memory-measured epoch excluded")
    return GatAmpResult(cfg, prov, ginfo, mem, timing, runs, copy.deepcopy(SEED_001))


# --------------------------------------------------------------------------------------------------- tables
def _mib(b) -> str:
    return f"{b / 2**20:,.1f}"


def memory_table(result: GatAmpResult):
    """Peak memory per (heads, precision) beside seed 001's V100 numbers, and each precision ÷ FP32.

    Raises TypeError when ``result`` is not a :class:`GatAmpResult`.
    """
    from ..widgets import table_html

    if not isinstance(result, GatAmpResult):
        raise TypeError(f"result must be a GatAmpResult, got {type(result).__name__}")
    dev = result.provenance["device"].split(" (")[0]
    rows = []
    for hk, runs in result.runs.items():
        seed = result.seed_001["runs"].get(hk, {})
        for p, r in runs.items():
            s = seed.get(p, {}) if p != "bf16" else {}
            s_txt = ("out of memory" if s.get("oom") else f"{s['memory_gb']} GB") if s else "–"
            if r.get("oom"):
                rows.append([hk, p, "out of memory", "–", "–", "–", s_txt])
                continue
            ratio = result.ratio(hk, p)
            rows.append([hk, p, _mib(r["peak_bytes"]), _mib(r["total_bytes"]),
                         "–" if ratio is None else f"{ratio:.3f}", f"{r['accuracy']['test']:.3f}", s_txt])
    s = result.seed_001["runs"]["[1, 1, 1]"]
    rows.append(["[1, 1, 1]", "fp16 ÷ fp32", "", "", f"{s['fp16']['memory_gb'] / s['fp32']['memory_gb']:.3f}", "",
                 f"seed 001 ({result.seed_001['device']})"])
    return table_html(["heads", "precision", f"step peak MiB ({dev})", "total MiB (+ graph, weights, Adam)",
                       "total ÷ FP32", "test accuracy", f"seed 001, {result.seed_001['device']}"], rows)


def budget_table(result: GatAmpResult):
    """The seed's "fits in 16 GB" question, scaled to this run: a memory budget B that holds the FP32
    [1, 1, 1] run at the same fill level as the seed's V100 (B = total(FP32, [1, 1, 1]) × 16 / 15.2), and for
    every run whether its total fits in B.  A thought experiment on measured numbers, not an OOM.

    Returns (budget_bytes, HTML table).  Raises TypeError for a non-result, ValueError without an FP32 [1, 1, 1]
    run.
    """
    from ..widgets import table_html

    if not isinstance(result, GatAmpResult):
        raise TypeError(f"result must be a GatAmpResult, got {type(result).__name__}")
    base = result.runs.get("[1, 1, 1]", {}).get("fp32")
    if not base or base.get("oom"):
        raise ValueError("result needs an FP32 run with heads [1, 1, 1] to scale the budget")
    s = result.seed_001
    budget = base["total_bytes"] * s["gpu_memory_gb"] / s["runs"]["[1, 1, 1]"]["fp32"]["memory_gb"]
    rows = []
    for hk, runs in result.runs.items():
        for p, r in runs.items():
            if r.get("oom"):
                rows.append([hk, p, "out of memory on the device", "no"])
            else:
                rows.append([hk, p, f"{r['total_bytes'] / budget:.2f}", "yes" if r["total_bytes"] <= budget else "no"])
    return budget, table_html(["heads", "precision", "total ÷ budget", f"fits in {_mib(budget)} MiB?"], rows)


# ------------------------------------------------------------------------------------- attention in FP16
#: Ops of a GAT layer probed by :func:`autocast_policy`: name → function of float16 tensors
#: (``x`` [64, 8] features, ``w`` [8, 8] weights, ``e`` [256, 2] attention logits, ``idx`` [256] targets).
_ATTENTION_OPS = {
    "linear (projection W h)": lambda t: F.linear(t["x"], t["w"]),
    "mul + sum (a·Wh)": lambda t: (t["x"] * t["x"]).sum(-1),
    "leaky_relu (logits)": lambda t: F.leaky_relu(t["e"], 0.2),
    "exp": lambda t: torch.exp(t["e"]),
    "softmax": lambda t: torch.softmax(t["e"], 0),
    "scatter max (PyG scatter)": lambda t: _pyg_utils().scatter(t["e"], t["idx"], 0, dim_size=64, reduce="max"),
    "scatter sum (PyG scatter)": lambda t: _pyg_utils().scatter(t["e"], t["idx"], 0, dim_size=64, reduce="sum"),
    "PyG softmax over edges": lambda t: _pyg_utils().softmax(t["e"], t["idx"], num_nodes=64),
    "elu": lambda t: F.elu(t["x"]),
    "log_softmax (in cross_entropy)": lambda t: F.log_softmax(t["x"], -1),
}


def _pyg_utils():
    from ..models.gat import torch_geometric  # noqa: F401  (PyG with its deprecation warning silenced)
    import torch_geometric.utils

    return torch_geometric.utils


def autocast_policy(device_type: str = "cpu", dtype=torch.float16) -> dict:
    """Which dtype each op of a GAT layer returns for **float16 inputs** under ``torch.autocast(device_type,
    dtype)``: probed from PyTorch's dispatcher, not typed from the documentation.

    On CUDA without a GPU the probe runs on fake CUDA tensors (``torch._subclasses.FakeTensorMode``) with
    autocast switched on through ``torch.set_autocast_enabled`` — the dispatcher applies the same autocast
    kernels, which decide the output dtype, without touching a device.

    Returns
    -------
    dict with "device_type", "dtype", "method" ("real tensors" or "fake CUDA tensors") and "ops": op name →
    output dtype name (e.g. "float32") or "error: …".

    Raises ValueError for a device type other than "cpu" or "cuda", TypeError for a non-float dtype.
    """
    if device_type not in ("cpu", "cuda"):
        raise ValueError(f"device_type must be 'cpu' or 'cuda', got {device_type!r}")
    if dtype not in (torch.float16, torch.bfloat16):
        raise TypeError(f"dtype must be torch.float16 or torch.bfloat16, got {dtype!r}")
    g = torch.Generator().manual_seed(0)
    base = {"x": torch.randn(64, 8, generator=g), "w": torch.randn(8, 8, generator=g),
            "e": torch.randn(256, 2, generator=g), "idx": torch.randint(0, 64, (256,), generator=g)}
    fake = device_type == "cuda" and not torch.cuda.is_available()
    out = {}

    def probe(t):
        for name, fn in _ATTENTION_OPS.items():
            try:
                out[name] = str(fn(t).dtype).replace("torch.", "")
            except Exception as e:  # an op that autocast cannot run on this device
                out[name] = f"error: {type(e).__name__}"

    def cast(v):
        return v.to(device_type, dtype) if v.is_floating_point() else v.to(device_type)

    if fake:
        from torch._subclasses.fake_tensor import FakeTensorMode

        with FakeTensorMode():
            # made on the fake device (values are not computed; the output dtypes are)
            t = {k: (torch.empty(v.shape, dtype=dtype, device="cuda") if v.is_floating_point() else
                     torch.zeros(v.shape, dtype=v.dtype, device="cuda")) for k, v in base.items()}
            prev, prev_dt = torch.is_autocast_enabled("cuda"), torch.get_autocast_dtype("cuda")
            torch.set_autocast_enabled("cuda", True)
            torch.set_autocast_dtype("cuda", dtype)
            try:
                probe(t)
            finally:
                torch.set_autocast_enabled("cuda", prev)
                torch.set_autocast_dtype("cuda", prev_dt)
    else:
        t = {k: cast(v) for k, v in base.items()}
        with torch.autocast(device_type, dtype=dtype):
            probe(t)
    return {"device_type": device_type, "dtype": str(dtype).replace("torch.", ""),
            "method": "fake CUDA tensors" if fake else "real tensors", "ops": out}


def attention_overflow(logits, device="cpu") -> dict:
    """Softmax over the edges entering one node, three ways, for the attention ``logits`` (a 1-D sequence):

    * ``naive_fp16``: ``exp(e) / Σ exp(e)`` in float16 — overflows to inf, then inf/inf = NaN, once a logit
      exceeds ln(65504) ≈ 11.09 (:data:`FP16_EXP_LIMIT`);
    * ``max_subtracted_fp16``: PyG's ``torch_geometric.utils.softmax`` in float16 (it subtracts the per-node
      maximum first, so every exponent is ≤ 0 and exp ≤ 1);
    * ``fp32``: the float32 reference.

    Returns dict of lists (float) plus "exp_fp16" (exp of each logit in float16) and "limit".

    Raises TypeError when ``logits`` is not a 1-D sequence of numbers.
    """
    try:
        e32 = torch.as_tensor(logits, dtype=torch.float32, device=device)
    except (TypeError, ValueError, RuntimeError) as err:
        raise TypeError(f"logits must be a 1-D sequence of numbers, got {type(logits).__name__}") from err
    if e32.dim() != 1 or e32.numel() == 0:
        raise TypeError(f"logits must be a non-empty 1-D sequence, got shape {tuple(e32.shape)}")
    e16 = e32.half()
    idx = torch.zeros(e16.numel(), dtype=torch.long, device=e32.device)
    naive = torch.exp(e16) / torch.exp(e16).sum()
    pyg = _pyg_utils().softmax(e16, idx, num_nodes=1)
    ref = torch.softmax(e32, 0)
    return {"logits": e32.tolist(), "exp_fp16": torch.exp(e16).float().tolist(),
            "naive_fp16": naive.float().tolist(), "max_subtracted_fp16": pyg.float().tolist(),
            "max_subtracted_dtype": str(pyg.dtype).replace("torch.", ""), "fp32": ref.tolist(),
            "limit": FP16_EXP_LIMIT}


def main(argv=None) -> int:
    return _main(__doc__.splitlines()[0], run, config_for, argv)


if __name__ == "__main__":
    raise SystemExit(main())
