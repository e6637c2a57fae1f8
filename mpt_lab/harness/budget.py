"""What the full profile costs on one H100, experiment by experiment: the priority table of the GPU slot.

The lent GPU machines come in short slots (one command of at most 10 minutes, 15 minutes of device time in all,
the machine's start included), so ``python -m mpt_lab.experiments --all --profile full --budget 480`` must bring
back every full result in 8 minutes, most needed first.  :data:`ESTIMATES` holds one :class:`Estimate` per
experiment with a full profile: its priority (1 runs first: what the book lacks most) and what its full run
costs, and :func:`expected_seconds` turns that into seconds on one H100.  ``--all --profile full`` runs the
experiments in the order of :func:`plan`; ``--budget S`` skips one whose expected seconds exceed what is left;
``--dry-run`` prints the table.  A test requires a row for every experiment that has a full profile.  Rows with a
``script`` are benchmarks (``benchmarks/NAME.py``, not experiments of :data:`mpt_lab.experiments.NAMES`) that
the slot runs in the same order, as a process of their own.

**What a slot runs.**  :func:`to_run` lists, in priority order, the GPU rows whose result the book lacks: no
``book/results/NAME_full.json`` yet, or a saved one made by code older than the row's ``rerun_without`` field (a
result field the saved JSON lacks: the experiment measures more now).  :func:`slots` packs them, in that
order, into slots of :data:`SLOT_SECONDS` (each with its :data:`STARTUP_SECONDS`): what does not fit one slot
goes first in the next.  The five results the book exists for (the SSD histogram, the gradient factors, the
language model's gradient scale, bigLSTM and SSD's Table 2: priorities 1–5) fit the first slot.

**How a row is estimated.**  A training run in eager PyTorch spends its time in three ways (H. He, "Making Deep
Learning Go Brrrr From First Principles", 2022): computing FLOPs, moving bytes through memory, and overhead
(Python, the dispatcher and one or more kernel launches per operator, while the GPU waits).  A row counts each:

* ``tflop``: the FLOPs of matrix products and convolutions per arithmetic ({"fp32", "tf32", "fp16", "fp8"};
  "fp16" covers bfloat16, and PyTorch's default lets cuDNN run float32 convolutions in TF32 but not float32
  matrix products), from the models' shapes (``FlopCounterMode`` on a CPU: ``benchmarks/gpu_slot_counts.py``);
* ``gbytes``: the bytes read and written by the memory-bound operators that dominate (logits, histograms,
  per-edge tensors), from the tensors' sizes;
* ``kops``: thousands of ATen operators that launch a kernel, counted on a CPU by a dispatch mode over the smoke
  run and the smoke run with one more step (``benchmarks/gpu_slot_counts.py --vary steps=3``: the difference is
  the cost of one step), times the number of steps;
* ``cpu_seconds``: work done on the host whatever the device: generating data sets (measured on this project's
  2-core CPU, which is slower than the GPU machine's), process starts, evaluation loops in Python.

:func:`expected_seconds` = :data:`SAFETY` × (Σ tflop / (peak × :data:`UTILISATION`) + gbytes / (bandwidth ×
:data:`MEMORY_UTILISATION`) + kops × 1000 × :data:`SECONDS_PER_OP` + cpu_seconds), no overlap assumed between
host and device (most steps read their loss back, which waits for the device): an upper bound where the device's
work is long enough to hide the launches.  A row that no slot has measured yet gets :data:`UNMEASURED_FACTOR` × that
(the first slot ran bigLSTM more than 1.8 times longer than its model said), or the lower bound ``at_least`` that
a slot's log shows (a run stopped at a time limit), whichever is larger; a measured row gets
:data:`MEASURED_SAFETY` × its measured seconds.  :func:`total_seconds` adds :data:`STARTUP_SECONDS`.

To add an experiment with a full profile: add its name to ``NAMES`` (``mpt_lab/experiments/__init__.py``) and a
row here, with a priority that says where the book needs it and a ``basis`` that says how the numbers were
obtained; after a slot, compare its ``seconds`` in the run's summary with the row and correct the row.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from .runner import result_path

__all__ = [
    "H100",
    "UTILISATION",
    "MEMORY_UTILISATION",
    "SECONDS_PER_OP",
    "SAFETY",
    "SLOT_SECONDS",
    "STARTUP_SECONDS",
    "UNMEASURED_FACTOR",
    "SEEDS",
    "Estimate",
    "ESTIMATES",
    "BENCHMARKS",
    "expected_seconds",
    "plan",
    "table",
    "total_seconds",
    "to_run",
    "slots",
    "saved_path",
    "stale_reason",
]

#: Published peaks of one NVIDIA H100 SXM5 80 GB (NVIDIA, "H100 Tensor Core GPU" datasheet, H100 SXM column:
#: FP32 67 TFLOPS; tensor cores TF32 989, BF16 and FP16 1,979, FP8 3,958 TFLOPS "shown with sparsity,
#: specifications 1/2 lower without sparsity"; GPU memory bandwidth 3.35 TB/s), dense, in TFLOP/s and TB/s.
#: The lent H100 reached 798 TFLOP/s on an 8192³ bfloat16 product and copied 3.0 TB/s (device tool's KINDS.md).
H100 = {"fp32": 67.0, "tf32": 494.5, "fp16": 989.5, "fp8": 1979.0, "hbm_tb_s": 3.35}

#: Share of the arithmetic peaks that our kernels reach: small matrices (hundreds to a few thousand wide) and
#: convolutions with few channels reach far less than an 8192³ product's 80 %.
UTILISATION = 0.3

#: Share of the memory bandwidth that the memory-bound operators reach: a plain copy reached 90 % on the lent H100
#: (3.0 of 3.35 TB/s); gathers, scatters with atomics and histograms less.
MEMORY_UTILISATION = 0.5

#: Host seconds per ATen operator that launches a kernel: Python, the dispatcher, autograd's bookkeeping and
#: cudaLaunchKernel.  Measured on this project's CPU: an Adam step of a tiny MLP costs 18 µs of CPU time per
#: operator (55 operators, 0.98 ms), a bare ``torch.add`` 1.8 µs; a kernel launch adds a few µs on CUDA.
SECONDS_PER_OP = 20e-6

#: Multiplies every estimate: what the counts leave out (cuDNN's algorithm search, allocator growth, first-call
#: compilation, a busier host).
SAFETY = 1.5

#: Multiplies a measured time (a slot's own run of the same configuration, on an H100 or H200): run-to-run spread.
MEASURED_SAFETY = 1.1

#: Multiplies the model's estimate (:data:`SAFETY` included) of a row no slot has measured: the first slot ran
#: bigLSTM's 200 steps for more than 88 s against the 49 s its row expected (1.8×).
UNMEASURED_FACTOR = 2.0

#: The results the book exists for, which no slot has brought back yet: priorities 1 to 5, in this order.
SEEDS = ("ssd_histogram", "gradient_factors", "lm_gradient_scale", "biglstm", "ssd_table2")

#: The slot's time for ``--all --profile full``: 8 minutes on one H100, in one process.
SLOT_SECONDS = 480.0

#: Seconds of the slot's ``--all`` before the first experiment: Python's imports, the CUDA context, cuBLAS and
#: cuDNN handles.  The first slot (an H200, 2026-11-26) spent 75 s here, compiling the gradient-histogram kernel
#: for the CPU and again for CUDA; on CUDA the histogram now uses a kernel that needs no compilation
#: (:func:`mpt_lab.histogram._kernel`), so this is twice an unmeasured estimate of 10 s (the slot's log prints
#: the time as "histogram kernel ready in … s").
STARTUP_SECONDS = 20.0


@dataclass(frozen=True)
class Estimate:
    """One row of the priority table (see the module docstring for the units and the formula).

    priority : int ≥ 1, unique; 1 runs first
    needs : what the book needs this full result for, and where it is shown
    tflop : {"fp32" | "tf32" | "fp16" | "fp8": TFLOP of matrix products and convolutions}
    gbytes : GB moved by the memory-bound operators
    kops : thousands of kernel-launching operators
    cpu_seconds : host work that does not shrink on a GPU (data generation, process starts)
    basis : how the numbers were obtained (shapes, counts, measurements)
    measured : seconds the full run took in a GPU slot (0: not measured yet); when given, :attr:`seconds` is
        :data:`MEASURED_SAFETY` × measured instead of the model above, and ``basis`` says where it was measured
    at_least : seconds a slot's log shows the run takes at least (a run stopped at a time limit); an unmeasured
        row's :attr:`seconds` is never less
    gpu : False for an experiment whose full profile computes on the CPU whatever the device (it equals its cpu
        profile, which the chapter runs live): a GPU slot leaves it out (``--all --profile full`` skips it unless
        ``--only`` names it) and :func:`total_seconds` does not count it
    rerun_without : a field of the result; a saved full result without it was made by older code, and
        :func:`to_run` runs the experiment again ("" : a saved result is final)
    script : for a benchmark, its script (``benchmarks/NAME.py``), run as a process of its own
    """

    priority: int
    needs: str
    tflop: dict = field(default_factory=dict)
    gbytes: float = 0.0
    kops: float = 0.0
    cpu_seconds: float = 0.0
    basis: str = ""
    measured: float = 0.0
    at_least: float = 0.0
    gpu: bool = True
    rerun_without: str = ""
    script: str = ""

    def __post_init__(self):
        if not isinstance(self.priority, int) or isinstance(self.priority, bool) or self.priority < 1:
            raise ValueError(f"priority must be an int ≥ 1, got {self.priority!r}")
        bad = [k for k in self.tflop if k not in ("fp32", "tf32", "fp16", "fp8")]
        if bad:
            raise ValueError(f"tflop keys must be among fp32, tf32, fp16, fp8, got {bad}")
        for name in ("gbytes", "kops", "cpu_seconds", "measured", "at_least"):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or v < 0:
                raise ValueError(f"{name} must be a number ≥ 0, got {v!r}")
        if any(not isinstance(v, (int, float)) or v < 0 for v in self.tflop.values()):
            raise ValueError(f"tflop values must be numbers ≥ 0, got {self.tflop!r}")

    @property
    def terms(self) -> dict:
        """The seconds of each term before :data:`SAFETY`: "compute", "memory", "overhead", "host"."""
        return {
            "compute": sum(t / (H100[k] * UTILISATION) for k, t in self.tflop.items()),
            "memory": self.gbytes / (H100["hbm_tb_s"] * 1e3 * MEMORY_UTILISATION),
            "overhead": self.kops * 1e3 * SECONDS_PER_OP,
            "host": float(self.cpu_seconds),
        }

    @property
    def model_seconds(self) -> float:
        """The model's estimate: :data:`SAFETY` × the sum of :attr:`terms`."""
        return SAFETY * sum(self.terms.values())

    @property
    def seconds(self) -> float:
        """Expected seconds of the full run on one H100: :data:`MEASURED_SAFETY` × :attr:`measured` where a slot
        measured it, else the larger of :data:`UNMEASURED_FACTOR` × :attr:`model_seconds` and :attr:`at_least`."""
        if self.measured:
            return MEASURED_SAFETY * self.measured
        return max(UNMEASURED_FACTOR * self.model_seconds, float(self.at_least))

    @property
    def basis_kind(self) -> str:
        """ "measured", "lower bound" (the log's bound exceeds twice the model) or "2 x model"."""
        if self.measured:
            return "measured"
        return "lower bound" if self.at_least > UNMEASURED_FACTOR * self.model_seconds else "2 x model"


_SLOT1 = "the first slot (NVIDIA H200, torch 2.11, 2026-11-26)"
_SLOT2 = "the second slot (NVIDIA H200, torch 2.11, 2026-11-28)"

ESTIMATES: dict[str, Estimate] = {
    # ---- 1-5: the results the book exists for (SEEDS), in the first slot ----------------------------------------
    "ssd_histogram": Estimate(
        1,
        "ch. 2: Figure 2 on SSD300 itself (VGG-16 at full width, 300 px), which a CPU cannot train",
        tflop={"tf32": 1244},
        gbytes=11600,
        kops=630,
        cpu_seconds=12,
        basis="200 FP32 steps of SSD300 on batches of 32 (5.9 TFLOP a step) + 2 evaluations of 300 images + the "
        "sweep (4 x 50 steps, large at 256 px: 5.2 GFLOP per image); every step histograms ~1.6 G "
        "activation-gradient values: ~45 GB a step of elementwise traffic, and the CUDA histogram kernel "
        "(a bucketize, no compilation) moves ~40 bytes a value against the compiled one's ~28: +13 GB a "
        "step; ~2,100 operators a step (1,200 counted with the compiled kernel, 6,522 with the 25-pass eager "
        "one; the bucketize kernel launches 4 more a tensor than the compiled one), ~1,050 a sweep step. "
        "Measured 226.1 s in " + _SLOT2 + " (the model said 60 s: the histograms of ~1.6 G values a step cost "
        "more than their bytes)",
        measured=226.1,
    ),
    "gradient_factors": Estimate(
        2,
        "ch. 2: the SSD300-shape series with the quarter-width VGG-16 at 300 px (the long run leaves it out)",
        tflop={"tf32": 51},
        gbytes=900,
        kops=440,
        cpu_seconds=5,
        basis="3 variants x 100 FP32 steps of 32 images (quarter width 4.1 and eighth width 1.1 GFLOP forward "
        "per 300 px image); every step histograms every module's gradient: ~1,460 operators a step with the "
        "CUDA bucketize kernel (1,300 counted with the compiled kernel, 2,349 with the eager one); 1,600 "
        "images of 300 px generated. Measured 48.6 s in " + _SLOT2,
        measured=48.6,
    ),
    "lm_gradient_scale": Estimate(
        3,
        "ch. 8: vocabulary and batch against the gradient scale, up to 16,384 tokens (the shift checked at k = 6)",
        gbytes=1100,
        kops=170,
        cpu_seconds=6,
        measured=5.4,
        basis="5 points (V 1024, 8192 x N 16 x 16, 1024 x 16, and the shift check) x 100 FP32 steps of the tiny "
        "LSTM: ~340 operators a step with the CUDA histogram kernel (the CPU count unrolls the LSTM); the "
        "logits' traffic, 100 x ~10 GB; two tokenised corpora on the host. Lower bound: run on its own after "
        "the first slot (commit 820b46f) it did not finish within 60 s, a time that included compiling the "
        "histogram kernel (75 s in the slot), which CUDA no longer does; measured 5.4 s in " + _SLOT2,
    ),
    "biglstm": Estimate(
        4,
        "ch. 8: the blog post's Figure 1 with real FP16 autocast on the LSTM at 65,536 tokens per batch, no shift",
        tflop={"fp32": 176, "fp16": 528},
        gbytes=19200,
        kops=330,
        cpu_seconds=4,
        measured=22.7,
        basis="4 arms x 100 steps of the 'small' LSTM (2 x 512 cells, projection 128) on 2048 x 32 tokens over "
        "8,192 words: 13.4 MFLOP per token, 0.88 TFLOP a step (the FP32 arm without TF32); the logits, "
        "537 M values, pass ~10 times through memory a step with their cast, softmax and gradient: 24 GB; "
        "~400 operators a step (cuDNN's LSTM is one call; the CPU count unrolls it); the corpus. "
        + _SLOT1
        + " stopped a 200-step run at its hard limit after more than 88 s (started 211 s into --all, "
        "limit 299 s); the 100 steps of today's profile measured 22.7 s in " + _SLOT2,
    ),
    "ssd_table2": Estimate(
        5,
        "ch. 8: Table 2 with real FP16 autocast on SSD300 (VGG-16 at full width, 300 px), no shift",
        tflop={"tf32": 940, "fp16": 1770},
        gbytes=11000,
        kops=400,
        cpu_seconds=11,
        basis="3 arms x 150 steps of SSD300 (61.5 GFLOP forward per 300 px image, FlopCounterMode) on batches of "
        "32: 5.9 TFLOP a step, FP32 convolutions in TF32 (cuDNN's default); evaluations 3 x 300 images; "
        "~19 GB of elementwise traffic a step and as much per histogram step (every 5th, the CUDA bucketize "
        "kernel); ~850 operators a step (816 counted without histograms, Adam foreach on CUDA); 1,900 images "
        "generated, mAP on the host. Measured 112.6 s in " + _SLOT2,
        measured=112.6,
    ),
    # ---- 6-8: the GPU numbers a performance engineer asked for (issue 30) --------------------------------------
    "amp_recipe": Estimate(
        6,
        "ch. 6: the recipe's eager loop profiled (host time per step, GPU-busy share) beside the step limited "
        "by the GPU (static buffers, fused SGD, a CUDA graph) at 512, 2048, 8192; % of measured and datasheet peak",
        tflop={"fp32": 290, "fp16": 1346},
        gbytes=3700,
        kops=330,
        cpu_seconds=16,
        at_least=18.8,
        rerun_without="graphed",
        basis="the eager loop as before (measured 18.8 s in " + _SLOT1 + ": 3 x Linear(4096), 250 steps per "
        "precision and batch of 128, 256, 512, 513, the 8192^2 matmul peaks) + 20 profiled steps per "
        "precision and batch (12 profiler windows, ~0.5 s each to start and stop) + the GPU-limited step at "
        "512, 2048, 8192 for 3 precisions: 16*B*4096^2 FLOPs a step (counted), 53 steps each (3 warm-up, the "
        "capture, 1 + 3 repeats of 10, 10 profiled): 153 TFLOP in FP32 and as much per 16-bit type. Never "
        "measured in this form: twice the model",
    ),
    "roofline": Estimate(
        7,
        "ch. 6: where the recipe's step sits: GEMM TFLOP/s per arithmetic (FP32, TF32, BF16, FP16, FP8 with fast "
        "accumulation off and on) at 4096-16384 and 512x4096x4096, copy bandwidth, clocks and power",
        tflop={"fp32": 123},
        gbytes=20,
        cpu_seconds=17,
        script="benchmarks/roofline.py",
        basis="24 products (6 arithmetics x 4 shapes), each 2 sizing calls + 1 + 5 timed batches of >= 50 ms: "
        "~7.2 s; FP32 without TF32 at 16384^3 (8.8 TFLOP a product, 8 products), 8192^3 and below: ~123 "
        "TFLOP; a 1 GiB copy 7 times; the process start and CUDA context ~8 s; nvidia-smi sampled in a "
        "thread. Measured 15.8 s in " + _SLOT2 + ", the process start included",
        measured=15.8,
    ),
    "memory_per_parameter": Estimate(
        8,
        "ch. 7: bytes per parameter of a 1-billion-parameter Linear stack with Adam in FP32, AMP and BF16 + "
        "FP32 master weights, against ZeRO's 16",
        tflop={"fp32": 1, "fp16": 1},
        gbytes=200,
        cpu_seconds=12,
        script="benchmarks/memory_per_parameter.py",
        basis="3 modes x (15 x Linear(8192) built on the GPU, 1.007 G parameters, 2 Adam steps at batch 16: "
        "~96 GFLOP a step, ~28 GB of fused-Adam traffic a step); the process start ~8 s and the allocator's "
        "growth to ~20 GB per mode. Measured 10.7 s in " + _SLOT2 + ", the process start included",
        measured=10.7,
    ),
    # ---- 9-10: saved results that the current code measures more of --------------------------------------------
    "memory_tradeoffs": Estimate(
        9,
        "ch. 7: allocator peak memory and time of checkpointing against FP16 on a ResNet; the baseline's TF32 "
        "named, channels-last and cudnn.benchmark timed, the exactness pass loss-scaled",
        tflop={"tf32": 400, "fp16": 400},
        gbytes=4400,
        kops=110,
        cpu_seconds=3,
        measured=16.2,
        rerun_without="layouts",
        basis="ResNet (width 64, 4 stages x 2 blocks, 64 px): 4.4 GFLOP forward per image (FlopCounterMode), "
        "3.4 TFLOP per step of 256 images; ~180 steps (the four ways x 14, exactness, breakdown, 2 x 10 "
        "epochs of 6 batches) and their checkpoint recomputation: 640 TFLOP, half in FP16; +25 % for the "
        "layout and cudnn.benchmark timings and the loss-scaled exactness pass; 377 operators a step "
        "(counted). Measured 9.5 s in " + _SLOT1 + " before those were added, 16.2 s with them in " + _SLOT2,
    ),
    "tensor_core_accumulation": Estimate(
        10,
        "ch. 5: FP16 and FP8 tensor-core products against the accumulation module's exact predictions; m = n = "
        "1024 and the kernels' names (split-K or not) from the profiler",
        kops=6,
        cpu_seconds=14,
        measured=19.8,
        rerun_without="kernels",
        basis="measured 17.6 s on an H100 80GB HBM3 (15.6 s on an H200) before m = n = 1024 and the profiler were "
        "added, almost all of it the exact FP16- and 14-bit-accumulator predictions of 64 x 64 outputs on "
        "the host (sum of K about 32 k steps); the 1024 x 1024 products, their float64 references and the "
        "profiled calls run on the device (~3 s). Measured 19.8 s with them in " + _SLOT2,
    ),
    # ---- saved and final ----------------------------------------------------------------------------------------
    "fp8_recipes": Estimate(
        11,
        "ch. 11: FP8 tensor cores (torch._scaled_mm) beside the emulation, the wider language model",
        tflop={"fp32": 71},
        gbytes=8000,
        kops=1610,
        cpu_seconds=3,
        measured=64.3,  # the first slot (NVIDIA H200, torch 2.11, 2026-11-26)
        basis="9 runs (7 recipes + 2 on tensor cores) x 100 steps of the 4-layer dim-256 transformer on 4,096 "
        "characters (79 GFLOP a step); counted on a CPU: ~2,000 operators a step of a quantised recipe "
        "(17 Linear layers x x/w/g quantisers), ~1,000 for BF16, ~500 for FP32: 1,550 k; evaluations and the "
        "block-size sweep 60 k; ~2,000 elementwise passes of ~8 MB a step; the text's characters on the host",
    ),
    "gat_amp": Estimate(
        12,
        "ch. 9: the caching allocator's peak memory of the DGL guide's GAT at Reddit's 232,965 nodes",
        tflop={"fp32": 118, "fp16": 236},
        gbytes=38500,
        kops=200,
        cpu_seconds=6,
        measured=42.3,  # the first slot (NVIDIA H200, torch 2.11, 2026-11-26)
        basis="6 runs (heads 1, 2 x FP32, FP16, BF16) x 100 full-batch epochs on 2.1 M edges: PyG's GATConv reads "
        "and writes ~11 [E, heads, C] tensors per layer and step (C = 256, 256, 41), 4 bytes in FP32, ~3 "
        "under autocast: 38 TB; the projections 0.32 TFLOP (heads 1) and 0.86 (heads 2) per epoch; 313 "
        "operators a step (counted); the synthetic graph and the memory fit's graphs on the host",
    ),
    "loss_scaling": Estimate(
        13,
        "ch. 3: the loss scale's history with real FP16 on CUDA, ours beside torch's",
        tflop={"fp16": 7},
        kops=300,
        cpu_seconds=1.5,
        measured=14.6,  # the first slot (NVIDIA H200, torch 2.11, 2026-11-26), run on its own
        basis="2,000 steps of two MLPs (64-1024-1024-10, batch 256: 1.7 GFLOP each) and a bit-for-bit comparison: "
        "150 operators a step (counted); launch-bound",
    ),
    "master_weights_stall": Estimate(
        14,
        "ch. 4: pure FP16 stalling, with CUDA's FP16 arithmetic",
        kops=250,
        cpu_seconds=1,
        measured=15.6,  # the first slot (NVIDIA H200, torch 2.11, 2026-11-26), run on its own
        basis="2,000 steps of three small MLPs and the swamped share: 125 operators a step (counted)",
    ),
    "message_passing": Estimate(
        15,
        "ch. 9 (not shown yet): the DGL guide's FP16 message passing on CUDA kernels",
        kops=2,
        cpu_seconds=1,
        measured=6.6,  # the first slot (NVIDIA H200, torch 2.11, 2026-11-26), run on its own
        basis="four examples on 30 nodes and 100 edges: milliseconds; PyG is imported by gat_amp before",
    ),
    # ---- computed on the CPU whatever the device: not in a GPU slot ----------------------------------------------
    "distributed": Estimate(
        16,
        "ch. 10: DDP and FSDP2 with NCCL on two GPUs or more (the lent machines have one: its ranks would run on the CPU, so a slot leaves it out)",
        cpu_seconds=25,
        gpu=False,
        basis="on the lent single-GPU machine the ranks compute on the CPU (placement()): torchrun's start (~8 s) "
        "and the cpu profile's network for half its steps at twice its batch (chapter 9 with the cpu "
        "profile: 54 s on 2 CPU cores, figures included)",
    ),
    "accumulation_error": Estimate(
        17,
        "ch. 5: error against K (its full profile is its cpu profile: nothing here runs on a GPU)",
        cpu_seconds=2,
        gpu=False,
        basis="measured: 3.0 s on an H100 machine's host CPU (10 s with the process start)",
    ),
    "accumulation_training": Estimate(
        18,
        "ch. 5: training with FP16-accumulated products (its full profile is its cpu profile)",
        cpu_seconds=14,
        gpu=False,
        basis="estimated from 35.5 s measured on an H100 machine's host with a larger MLP; the arithmetic of "
        "mpt_lab.accumulation runs on the CPU",
    ),
    "fourbit_ablation": Estimate(
        19,
        "ch. 13: the four-bit ablation (its full profile is its cpu profile; the long CPU run is the big one)",
        cpu_seconds=120,
        gpu=False,
        basis="the cpu profile: 9 arms x 2 seeds x 120 steps of the 2-block width-64 transformer on 512 characters, "
        "~2,000 operators a step of the emulated four-bit recipes (launch-bound on a GPU); ~100 s of CPU "
        "time on the project's 2-core CPU, and the diagnostics",
    ),
}

#: The rows that are benchmarks (``script``), not experiments: name → script.
BENCHMARKS = {n: e.script for n, e in ESTIMATES.items() if e.script}


def expected_seconds(name: str) -> float:
    """Expected seconds of experiment ``name``'s full profile on one H100 (:class:`Estimate`.seconds).

    Raises KeyError naming the table when ``name`` has no row.
    """
    if name not in ESTIMATES:
        raise KeyError(
            f"{name!r} has no row in mpt_lab.harness.budget.ESTIMATES (the full profile's priority "
            "table): add an Estimate for it"
        )
    return ESTIMATES[name].seconds


def total_seconds(names: Iterable[str] | None = None) -> float:
    """:data:`STARTUP_SECONDS` plus the expected seconds of the GPU rows among ``names`` (default: every row): what
    a GPU slot runs.  Rows with ``gpu=False`` are left out (see :class:`Estimate`)."""
    names = ESTIMATES if names is None else names
    return STARTUP_SECONDS + sum(expected_seconds(n) for n in names if ESTIMATES[n].gpu)


def plan(names: Iterable[str]) -> list:
    """``names`` in priority order (those without a row last, in the given order)."""
    names = list(names)
    return sorted(names, key=lambda n: (ESTIMATES[n].priority if n in ESTIMATES else 10**9, names.index(n)))


def saved_path(name: str) -> Path:
    """``book/results/NAME_full.json``: where the saved full result of row ``name`` lives."""
    return result_path(name, "full")


def stale_reason(name: str) -> str:
    """Why row ``name``'s saved full result must be measured (again): "no saved result", "the saved result
    lacks 'FIELD'" (it predates what the experiment measures now), or "" (saved and final).

    Raises KeyError naming the table when ``name`` has no row."""
    if name not in ESTIMATES:
        raise KeyError(f"{name!r} has no row in mpt_lab.harness.budget.ESTIMATES")
    path = saved_path(name)
    if not path.exists():
        return "no saved result"
    field = ESTIMATES[name].rerun_without
    if field:
        try:
            saved = json.loads(path.read_text())
        except ValueError:
            return "the saved result is not JSON"
        if field not in saved:
            return f"the saved result lacks {field!r}"
    return ""


def to_run(names: Iterable[str] | None = None) -> list:
    """The GPU rows among ``names`` (default: every row) whose result the book lacks (:func:`stale_reason`), in
    priority order: what the next slot runs."""
    names = plan(ESTIMATES if names is None else names)
    return [n for n in names if n in ESTIMATES and ESTIMATES[n].gpu and stale_reason(n)]


def slots(names: Iterable[str] | None = None, capacity: float = SLOT_SECONDS) -> list:
    """``names`` (default :func:`to_run`) in priority order, packed into slots: each slot holds
    :data:`STARTUP_SECONDS` and then rows in order until the next one would exceed ``capacity``; a row larger than a
    slot gets one of its own.  Returns a list of lists of names."""
    names = to_run() if names is None else plan(names)
    out, used = [], None
    for n in names:
        sec = expected_seconds(n)
        if used is None or used + sec > capacity:
            out.append([])
            used = STARTUP_SECONDS
        out[-1].append(n)
        used += sec
    return out


def table(names: Iterable[str] | None = None) -> str:
    """The priority table as text: priority, name, expected seconds, how they were obtained (measured, 2 x model,
    lower bound), its terms, whether a slot runs it and why, what the book needs it for; the sum of what the next
    slots run, and those slots (:func:`slots`)."""
    names = plan(ESTIMATES if names is None else names)
    rows = [
        f"{'#':>2}  {'experiment':<22}{'expected s':>11}  {'basis':<12}{'compute':>8}{'memory':>8}{'overhead':>9}"
        f"{'host':>7}  {'slot':<34}needed for"
    ]
    total = 0.0
    for n in names:
        if n not in ESTIMATES:
            rows.append(f"{'?':>2}  {n:<22}{'no estimate':>11}")
            continue
        e = ESTIMATES[n]
        t = e.terms
        why = stale_reason(n) if e.gpu else ""
        short = why.replace("the saved result lacks", "saved, lacks").replace("no saved result", "none saved")
        status = "CPU work: not in a slot" if not e.gpu else f"runs: {short}" if why else "saved"
        total += e.seconds if (e.gpu and why) else 0.0
        rows.append(
            f"{e.priority:>2}  {n:<22}{e.seconds:>11.0f}  {e.basis_kind:<12}{t['compute']:>8.1f}"
            f"{t['memory']:>8.1f}{t['overhead']:>9.1f}{t['host']:>7.1f}  {status[:33]:<34}{e.needs}"
            + (f" [benchmark: {e.script}]" if e.script else "")
        )
    rows.append(f"    {'startup':<22}{STARTUP_SECONDS:>11.0f}  imports, CUDA context, cuBLAS/cuDNN handles (per slot)")
    rows.append(
        f"    {'sum':<22}{total + STARTUP_SECONDS:>11.0f}  of what the next slots run, with one startup "
        f"(the terms are before the safety factor {SAFETY}; unmeasured rows: {UNMEASURED_FACTOR:g} x the model)"
    )
    chosen = [n for n in names if n in ESTIMATES]
    for i, group in enumerate(slots(to_run(chosen)), 1):
        sec = STARTUP_SECONDS + sum(expected_seconds(n) for n in group)
        rows.append(f"    slot {i}: {', '.join(group)}  ({sec:.0f} s of {SLOT_SECONDS:.0f})")
    return "\n".join(rows)
