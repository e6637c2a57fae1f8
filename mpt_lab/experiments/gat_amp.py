"""The DGL User Guide's end-to-end example: a 3-layer GAT trained in FP32, with FP16 autocast + GradScaler, and
in BF16.

The DGL User Guide (chapter 8, "Mixed Precision Training") trains a 3-layer GAT (hidden 256, heads [1, 1, 1], ELU, last layer
averaging its heads) on Reddit with self loops for 100 epochs with Adam (lr 1e-3, weight decay 5e-4), forward
under ``autocast``, backward through ``GradScaler``, and reports on a 16 GB V100: 15.2 GB without FP16, 12.8 GB
with it, and for heads [2, 2, 2] out of memory without FP16, 15.7 GB with it (:data:`DGL_GUIDE`).

This experiment trains the same network (:class:`mpt_lab.models.gat.GAT`, PyTorch Geometric's ``GATConv``)
full-batch, with loss on the training nodes, for heads [h, h, h] with each h in ``config.heads`` and each
recipe of :data:`RECIPES` (the registry's :data:`mpt_lab.recipes.AMP`) in ``config.recipes``:

* ``fp32``: no autocast;
* ``fp16``: ``torch.autocast(dtype=float16)`` and ``torch.amp.GradScaler`` (the guide's recipe);
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
* ``total_bytes`` = ``static_bytes + peak_bytes``: the quantity comparable to the guide's "GPU memory"
  (which also counts the allocator's cache and the CUDA context, so it is higher than ours for the same run).

**The graph is synthetic** (:func:`mpt_lab.data.graphs.synthetic_reddit`): Reddit's 602 features and 41
classes, its split fractions, class-dependent features and homophilous edges; Reddit itself cannot be
downloaded here.  Sizes per profile (:func:`config_for`):

* quick / cpu: a few hundred / thousand nodes (FP16 matrix products are slow on a CPU);
* full: Reddit's 232,965 nodes and an average degree of 8 (≈ 2.1 million edges with self loops, about 1/55
  of Reddit's 114.8 million).  PyG's ``GATConv`` materialises per-edge tensors of shape [E, heads, 256]
  (the gathered source features and the messages; 4 bytes each in FP32), where DGL uses fused sparse kernels:
  at Reddit's 114.8 million edges one such FP32 tensor for heads 1 is 118 GB, more than an 80 GB H100 holds.
  At 2.1 million edges one such tensor is 4.3 GB for the largest run (heads 2, FP32); a training step keeps
  about five of them alive at its peak (measured on a CPU with :func:`mpt_lab.bench.peak_memory`: 5.0 × E ×
  heads × 256 × 4 bytes per step for graphs of 61k and 121k edges), ≈ 21 GB.  A step reads and writes about
  eleven such tensors per layer, so the 6 runs × 100 epochs move ≈ 40 TB: most of the experiment's minute on
  one H100, its share of the whole full profile's 8 minutes (:mod:`mpt_lab.harness.budget`).  A run that still runs
  out of memory is recorded as such (``oom: True``), not retried.

Why the guide's heads [2, 2, 2] fitted its V100 only in FP16 and ours never does: ``memory_fit`` measures the
FP32 step peak on graphs of ``fit_nodes`` nodes (two sizes) with ``fit_degrees`` edges per node, for ``fit_heads`` heads, and
tests a model of it: for every graph size N and head count H the peak is a straight line in the edges E, and the
slope of that line (the bytes a step adds per edge) is the same for every N and grows linearly with H,
slope(H) = per_edge_head·H + per_edge.  PyG keeps per edge and head several [E, heads, hidden] float32 vectors
(gathered features and messages), so doubling the heads doubles the memory in every precision; DGL's fused
kernels keep a few scalars per edge, and most of the guide's memory does not depend on the heads.

    python -m mpt_lab.experiments.gat_amp --profile full --out book/results/gat_amp_full.json
"""

from __future__ import annotations

import copy
import math
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from ..bench import peak_memory
from ..data.graphs import REDDIT, synthetic_reddit
from ..harness.runner import Experiment, ExperimentConfig, ExperimentResult, Run, run_main
from ..recipes import AMP, LossScaling
from ..recipes import RECIPES as REGISTRY
from ..training import autocast_to, backward_step

__all__ = [
    "Config",
    "GatAmpResult",
    "PROFILES",
    "RECIPES",
    "DGL_GUIDE",
    "config_for",
    "run",
    "main",
    "memory_model",
    "NAME",
]

NAME = "gat_amp"
#: The recipes: FP32; FP16 autocast + GradScaler (the guide's); BF16 autocast (``config.recipes`` names which run):
#: the registry's :data:`mpt_lab.recipes.AMP`.
RECIPES = AMP
_OOM = getattr(torch, "OutOfMemoryError", torch.cuda.OutOfMemoryError)

#: The DGL User Guide, chapter 8 ("Mixed Precision Training", end-to-end example): 3-layer GAT on Reddit
#: (114 million edges with self loops), 100 epochs, one NVIDIA V100 with 16 GB.  "GPU memory" as the guide
#: reports it (GB; presumably the device's used memory).  Cited, not computed.
DGL_GUIDE = {
    "source": "DGL User Guide, chapter 8 (Mixed Precision Training), GAT on Reddit",
    "device": "NVIDIA V100 (16 GB)",
    "gpu_memory_gb": 16.0,
    "epochs": 100,
    "runs": {
        "[1, 1, 1]": {"fp32": {"memory_gb": 15.2, "oom": False}, "fp16": {"memory_gb": 12.8, "oom": False}},
        "[2, 2, 2]": {"fp32": {"memory_gb": None, "oom": True}, "fp16": {"memory_gb": 15.7, "oom": False}},
    },
    "loss": "converges to similar values with and without fp16",
}


@dataclass
class Config(ExperimentConfig):
    """The guide's model and optimizer are the defaults."""

    num_nodes: int = 1500
    avg_degree: float = 16.0  # directed edges per node before self loops (Reddit ≈ 492)
    num_features: int = REDDIT["num_features"]
    num_classes: int = REDDIT["num_classes"]
    homophily: float = 0.7
    feature_signal: float = 2.0
    hidden: int = 256
    heads: tuple = (1, 2)  # each h trains heads [h, h, h]
    recipes: tuple = RECIPES
    epochs: int = 30
    lr: float = 1e-3
    weight_decay: float = 5e-4
    fit_nodes: int | tuple = (
        300  # the memory fit: FP32 step peaks on graphs of these sizes (an int n: n // 2 and n) ...
    )
    fit_degrees: tuple = (4, 8, 16)  # ... with these average degrees (empty: no fit) ...
    fit_heads: tuple = (1, 2, 3)  # ... and these head counts

    def validate(self) -> None:
        super().validate()
        self.check_positive("num_nodes", "num_features", "num_classes", "hidden")
        self.check_positive("epochs", minimum=3)  # two warm-up epochs, then a measured one
        if not self.heads or any(not isinstance(h, int) or isinstance(h, bool) or h < 1 for h in self.heads):
            raise ValueError(f"config.heads must be a non-empty tuple of positive ints, got {self.heads!r}")
        self.check_choices("recipes", RECIPES, subset=True)
        if isinstance(self.fit_nodes, (tuple, list)):
            nodes = tuple(self.fit_nodes)
        elif isinstance(self.fit_nodes, int) and not isinstance(self.fit_nodes, bool):
            nodes = (self.fit_nodes // 2, self.fit_nodes)
        else:
            nodes = (self.fit_nodes,)  # not a size: refused below
        if not nodes or any(not isinstance(n, int) or isinstance(n, bool) or n < self.num_classes for n in nodes):
            raise ValueError(
                f"config.fit_nodes must be a tuple of graph sizes ≥ {self.num_classes} (num_classes), "
                f"or an int n with n // 2 ≥ {self.num_classes}, got {self.fit_nodes!r}"
            )
        if self.fit_degrees and (
            len(self.fit_degrees) < 2 or any(not isinstance(d, (int, float)) or d <= 0 for d in self.fit_degrees)
        ):
            raise ValueError(f"config.fit_degrees must be empty or ≥ 2 positive degrees, got {self.fit_degrees!r}")
        if (
            not self.fit_heads
            or any(not isinstance(h, int) or isinstance(h, bool) or h < 1 for h in self.fit_heads)
            or (self.fit_degrees and len(set(self.fit_heads)) < 2)
        ):
            raise ValueError(f"config.fit_heads must hold ≥ 2 different positive ints, got {self.fit_heads!r}")
        for name in ("lr", "avg_degree"):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
                raise ValueError(f"config.{name} must be a positive finite number, got {v!r}")


PROFILES = {
    "quick": {
        "num_nodes": 400,
        "avg_degree": 10.0,
        "epochs": 15,
        "threads": 1,
        "fit_nodes": (200, 400),
        "fit_degrees": (4, 8, 16),
    },
    "cpu": {
        "num_nodes": 1000,
        "avg_degree": 12.0,
        "epochs": 14,
        "fit_nodes": (300, 600),
        "fit_degrees": (4, 8, 16),
        "threads": 1,
    },
    "full": {
        "num_nodes": REDDIT["num_nodes"],
        "avg_degree": 8.0,
        "epochs": 100,
        "fit_nodes": 20000,
        "fit_degrees": (8, 16, 32, 64),
    },
}

#: ``--smoke``: three epochs (two warm-up, one measured) of every run on a graph of 400 nodes (Reddit's 232,965
#: nodes with PyG's per-edge tensors need ≈ 50 GB: far more than a CPU test has), and a memory fit on two small
#: graphs.
SMOKE = {"num_nodes": 400, "epochs": 3, "fit_nodes": 100, "fit_degrees": (8, 16)}


@dataclass
class GatAmpResult(ExperimentResult):
    """``graph``: num_nodes, num_edges, num_features, num_classes, split sizes, bytes, "synthetic";
    ``memory_method``, ``timing_method``: how they were measured; ``runs``: "[h, h, h]" → recipe →
    {losses, accuracy {train, val, test}, epoch_seconds, epoch_times, peak_bytes, static_bytes, total_bytes,
    skipped_steps, final_scale, oom, error}; ``memory_fit``: FP32 step peaks of the GAT on graphs of several
    sizes and head counts, and the model they test (see :func:`memory_model`), empty without ``fit_degrees``."""

    graph: dict
    memory_method: str
    timing_method: str
    runs: dict
    memory_fit: dict = field(default_factory=dict)

    RENAMED_CONFIG = {"precisions": "recipes"}

    def head_model(self, recipe: str) -> dict | None:
        """total(heads h) = static + h · per_head for ``recipe``, from the [1,1,1] and [2,2,2] runs:
        {"static": bytes, "per_head": bytes}; None when either run is missing or out of memory."""
        a, b = (self.runs.get(k, {}).get(recipe) for k in ("[1, 1, 1]", "[2, 2, 2]"))
        if not a or not b or a.get("oom") or b.get("oom"):
            return None
        per_head = b["total_bytes"] - a["total_bytes"]
        return {"static": a["total_bytes"] - per_head, "per_head": per_head}

    def ratio(self, heads: str = "[1, 1, 1]", recipe: str = "fp16", key: str = "total_bytes") -> float | None:
        """``key`` of ``recipe`` ÷ that of FP32 for one head setting (None when either run is missing or OOM)."""
        r = self.runs.get(heads, {})
        a, b = r.get(recipe), r.get("fp32")
        if not a or not b or a.get("oom") or b.get("oom"):
            return None
        return a[key] / b[key]

    def describe(self) -> str:
        g = self.graph
        ratios = ", ".join(f"{hk} {self.ratio(hk):.3f}" for hk in self.runs if self.ratio(hk) is not None)
        guide = DGL_GUIDE["runs"]["[1, 1, 1]"]
        return (
            f"GAT with AMP ({self.profile} profile, {self.device}); synthetic Reddit-shaped graph: "
            f"{g['num_nodes']:,} nodes, {g['num_edges']:,} edges; FP16 ÷ FP32 total memory: {ratios} "
            f"(DGL User Guide, V100: {guide['fp16']['memory_gb'] / guide['fp32']['memory_gb']:.3f})"
        )


def _tensor_bytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def _train(model, graph, recipe: str, config, run: Run, desc) -> dict:
    spec = REGISTRY[recipe]
    device, dtype = run.device, spec.autocast
    opt = torch.optim.Adam(model.parameters(), lr=config.lr, weight_decay=config.weight_decay)
    scaler = torch.amp.GradScaler(device.type) if spec.loss_scaling is LossScaling.DYNAMIC else None
    x, ei, y, mask = graph.x, graph.edge_index, graph.y, graph.train_mask

    def step():
        opt.zero_grad(set_to_none=True)
        with autocast_to(device.type, dtype):
            loss = F.cross_entropy(model(x, ei)[mask], y[mask])
        backward_step(loss, opt, scaler)
        return loss.detach()

    losses, times, skipped = [], [], 0
    peak = None
    for epoch in run.bar(range(config.epochs), desc=desc, leave=False):
        scale_before = scaler.get_scale() if scaler is not None else None
        if epoch == 2:  # measured apart from timing (the CPU method slows each op)
            box = {}
            peak = peak_memory(lambda: box.setdefault("loss", step()), device)
            loss = box["loss"]
        else:
            run.sync()
            t0 = time.perf_counter()
            loss = step()
            run.sync()
            times.append(time.perf_counter() - t0)
        losses.append(float(loss))
        if scaler is not None and scaler.get_scale() < scale_before:
            skipped += 1
    static = (
        graph.nbytes()
        + _tensor_bytes(model.parameters())
        + _tensor_bytes(t for s in opt.state.values() for t in s.values() if isinstance(t, torch.Tensor))
    )
    model.eval()
    with torch.no_grad(), autocast_to(device.type, dtype):
        pred = model(x, ei).argmax(1)
    model.train()
    acc = {
        k: float((pred[m] == y[m]).float().mean())
        for k, m in (("train", graph.train_mask), ("val", graph.val_mask), ("test", graph.test_mask))
    }
    timed = times[1:] if len(times) > 1 else times  # the first epoch includes one-time setup
    out = {
        "losses": losses,
        "accuracy": acc,
        "epoch_seconds": statistics.median(timed),
        "epoch_times": times,
        "peak_bytes": int(peak),
        "static_bytes": int(static),
        "total_bytes": int(static + peak),
        "skipped_steps": skipped,
        "final_scale": scaler.get_scale() if scaler is not None else None,
        "oom": False,
    }
    if device.type == "cuda":
        out["cuda_max_allocated_bytes"] = int(torch.cuda.max_memory_allocated(device))
    return out


def measure(config: Config, run: Run) -> dict:
    """Train the guide's GAT for every (heads, recipe) of ``config`` on a synthetic Reddit-shaped graph.

    A CUDA out-of-memory error in one run is recorded in that run (``oom``, ``error``) and the others go on.
    """
    from ..models.gat import GAT

    device = run.device
    graph = synthetic_reddit(
        config.num_nodes,
        config.avg_degree,
        num_features=config.num_features,
        num_classes=config.num_classes,
        homophily=config.homophily,
        feature_signal=config.feature_signal,
        seed=config.seed,
        device=device,
    )
    ginfo = {
        "synthetic": True,
        "generator": "mpt_lab.data.graphs.synthetic_reddit",
        "num_nodes": graph.num_nodes,
        "num_edges": graph.num_edges,
        "num_features": graph.num_features,
        "num_classes": graph.num_classes,
        "train": int(graph.train_mask.sum()),
        "val": int(graph.val_mask.sum()),
        "test": int(graph.test_mask.sum()),
        "bytes": graph.nbytes(),
        "self_loops": True,
        "reddit": dict(REDDIT),
    }
    runs = {}
    for h, p in run.bar([(h, p) for h in config.heads for p in config.recipes], desc="GAT runs"):
        key = f"[{h}, {h}, {h}]"
        torch.manual_seed(config.seed + h)
        model = copy.deepcopy(GAT(config.num_features, config.hidden, config.num_classes, (h, h, h))).to(device)
        if device.type == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(device)
        try:
            rec = _train(model, graph, p, config, run, f"heads {key} {p}")
        except _OOM as e:  # a real out-of-memory error on the device: recorded, not faked, not retried
            rec = {"oom": True, "error": str(e).splitlines()[0]}
        del model
        runs.setdefault(key, {})[p] = rec
    mem = (
        "torch.cuda allocator: max_memory_allocated − memory_allocated around one training step "
        "(mpt_lab.bench.peak_memory), plus the bytes of graph, weights and Adam state"
        if device.type == "cuda"
        else "mpt_lab.bench.peak_memory on a CPU: peak of live tensor storage made by ATen operators during one "
        "training step (a TorchDispatchMode; a lower bound that misses operator-internal scratch buffers), "
        "plus the bytes of graph, weights and Adam state"
    )
    timing = (
        "time.perf_counter around each full-batch epoch (one training step), CUDA synchronised; median "
        "of the epochs after the first, the memory-measured epoch excluded"
    )
    fit = _memory_fit(config, run) if config.fit_degrees else {}
    return {"graph": ginfo, "memory_method": mem, "timing_method": timing, "runs": runs, "memory_fit": fit}


def _memory_fit(config: Config, run: Run) -> dict:
    """FP32 step peaks of the GAT on graphs of ``fit_nodes`` nodes (a tuple of sizes; an int n: n // 2 and n) and
    ``fit_degrees`` edges per node, for each of ``fit_heads``, and the model they test (:func:`memory_model`)."""
    from ..models.gat import GAT

    nodes = (
        tuple(config.fit_nodes)
        if isinstance(config.fit_nodes, (tuple, list))
        else (config.fit_nodes // 2, config.fit_nodes)
    )
    points = []
    for n, d in run.bar([(n, d) for n in nodes for d in config.fit_degrees], desc="memory fit"):
        g = synthetic_reddit(
            n,
            float(d),
            num_features=config.num_features,
            num_classes=config.num_classes,
            seed=config.seed,
            device=run.device,
        )
        for h in config.fit_heads:
            torch.manual_seed(config.seed)
            model = GAT(config.num_features, config.hidden, config.num_classes, (h, h, h)).to(run.device)
            opt = torch.optim.Adam(model.parameters(), lr=config.lr)

            def step():
                opt.zero_grad(set_to_none=True)
                F.cross_entropy(model(g.x, g.edge_index)[g.train_mask], g.y[g.train_mask]).backward()
                opt.step()

            step()  # Adam's state exists before the measured step, as in training
            points.append([g.num_nodes, g.num_edges, h, int(peak_memory(step, run.device))])
    return memory_model(points)


def memory_model(points: Sequence[Sequence[float]]) -> dict:
    """Test a linear model of a GAT step's peak memory on measured points.

    ``points``: [[N, E, H, bytes], ...], the peak bytes of one step on a graph of N nodes and E edges with H heads
    per layer.  The model: for each (N, H) the peak is a straight line in E, bytes ≈ slope·E + intercept (least
    squares over that graph size's degrees), and the slope, the bytes a step adds per edge, does not depend on N
    and grows linearly with H: slope ≈ per_edge_head·H + per_edge (least squares over the lines).  Returns

    * ``points`` as given; ``lines``: [{"nodes", "heads", "slope" (bytes per edge), "intercept" (bytes),
      "max_relative_residual" (of that line's points; 0 by construction with two degrees)}];
    * ``per_edge_head``, ``per_edge`` (bytes): the slope model;
    * ``max_relative_residual``: the largest |line − point| / point over every line (tests straightness when
      each line has ≥ 3 points); ``slope_residual``: the largest |model − slope| / slope over the lines (tests
      the linearity in H with ≥ 3 head counts); ``node_spread``: the largest relative difference between the
      slopes of one head count on different graph sizes (None with one graph size);
    * ``points_per_line``, ``head_counts``, ``graph_sizes``: how much each test can tell.

    Raises ValueError when a line has fewer than 2 points or fewer than 2 head counts were measured.
    """
    pts = torch.tensor([[float(v) for v in p] for p in points], dtype=torch.float64)
    if pts.dim() != 2 or pts.shape[1] != 4:
        raise ValueError(f"points must be [[N, E, H, bytes], ...], got shape {tuple(pts.shape)}")
    lines = []
    for n, h in sorted({(float(a), float(c)) for a, _, c, _ in pts.tolist()}):
        sel = pts[(pts[:, 0] == n) & (pts[:, 2] == h)]
        if len(sel) < 2:
            raise ValueError(f"the line of N = {n:g}, H = {h:g} has {len(sel)} point; each needs ≥ 2 degrees")
        a = torch.stack([sel[:, 1], torch.ones_like(sel[:, 1])], 1)
        coef = torch.linalg.lstsq(a, sel[:, 3:]).solution[:, 0]
        res = float(((a @ coef - sel[:, 3]).abs() / sel[:, 3]).max())
        lines.append(
            {
                "nodes": int(n),
                "heads": int(h),
                "slope": float(coef[0]),
                "intercept": float(coef[1]),
                "max_relative_residual": res,
                "points": len(sel),
            }
        )
    heads = sorted({line["heads"] for line in lines})
    if len(heads) < 2:
        raise ValueError(f"points must cover ≥ 2 head counts to separate per-head from per-edge memory, got {heads}")
    h = torch.tensor([[float(line["heads"]), 1.0] for line in lines], dtype=torch.float64)
    s = torch.tensor([[line["slope"]] for line in lines], dtype=torch.float64)
    per_head, per_edge = (float(v) for v in torch.linalg.lstsq(h, s).solution[:, 0])
    slope_residual = max(abs(per_head * line["heads"] + per_edge - line["slope"]) / line["slope"] for line in lines)
    sizes = sorted({line["nodes"] for line in lines})
    spread = None
    if len(sizes) > 1:
        spread = max(
            (max(sl) - min(sl)) / min(sl)
            for sl in ([line["slope"] for line in lines if line["heads"] == hh] for hh in heads)
            if len(sl) > 1
        )
    return {
        "points": [list(p) for p in points],
        "lines": lines,
        "per_edge_head": per_head,
        "per_edge": per_edge,
        "max_relative_residual": max(line["max_relative_residual"] for line in lines),
        "slope_residual": float(slope_residual),
        "node_spread": spread,
        "points_per_line": min(line["points"] for line in lines),
        "head_counts": heads,
        "graph_sizes": sizes,
    }


EXPERIMENT = Experiment(NAME, Config, PROFILES, measure, GatAmpResult, __doc__, smoke=SMOKE)
run, config_for, main = EXPERIMENT.run, EXPERIMENT.config_for, EXPERIMENT.main

if __name__ == "__main__":
    run_main(EXPERIMENT)
