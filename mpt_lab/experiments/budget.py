"""What the full profile costs on one H100, experiment by experiment: the priority table of the GPU slot.

The lent GPU machines come in short slots (one command of at most 10 minutes, 15 minutes of device time in all,
the machine's start included), so ``python -m mpt_lab.experiments --all --profile full --budget 480`` must bring
back every full result in 8 minutes, most needed first.  :data:`ESTIMATES` holds one :class:`Estimate` per
experiment with a full profile: its priority (1 runs first: what the book lacks most) and what its full run
costs, and :func:`expected_seconds` turns that into seconds on one H100.  ``--all --profile full`` runs the
experiments in the order of :func:`plan`; ``--budget S`` skips one whose expected seconds exceed what is left;
``--dry-run`` prints the table.  A test requires a row for every experiment that has a full profile and the sum
of the expected seconds to stay within :data:`SLOT_SECONDS`.

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
work is long enough to hide the launches.  :func:`total_seconds` adds :data:`STARTUP_SECONDS`; it must stay within
:data:`SLOT_SECONDS`.

To add an experiment with a full profile: add its name to ``NAMES`` (``mpt_lab/experiments/__init__.py``) and a
row here, with a priority that says where the book needs it and a ``basis`` that says how the numbers were
obtained; after a slot, compare its ``seconds`` in the run's summary with the row and correct the row.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["H100", "UTILISATION", "MEMORY_UTILISATION", "SECONDS_PER_OP", "SAFETY", "SLOT_SECONDS",
           "STARTUP_SECONDS", "Estimate", "ESTIMATES", "expected_seconds", "plan", "table", "total_seconds"]

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

#: The slot's time for ``--all --profile full``: 8 minutes on one H100, in one process.
SLOT_SECONDS = 480.0

#: Seconds of the slot before the first experiment: the CUDA context, cuBLAS and cuDNN handles, and the
#: compilation of the gradient-histogram kernel for CUDA (torch.compile: tens of seconds on a first call).
STARTUP_SECONDS = 75.0    # measured in the first slot (an H200, 2026-11-26): the histogram kernel's warm-up took 75 s


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
    gpu : False for an experiment whose full profile computes on the CPU whatever the device (it equals its cpu
        profile, which the chapter runs live): a GPU slot leaves it out (``--all --profile full`` skips it unless
        ``--only`` names it) and :func:`total_seconds` does not count it
    """

    priority: int
    needs: str
    tflop: dict = field(default_factory=dict)
    gbytes: float = 0.0
    kops: float = 0.0
    cpu_seconds: float = 0.0
    basis: str = ""
    measured: float = 0.0
    gpu: bool = True

    def __post_init__(self):
        if not isinstance(self.priority, int) or isinstance(self.priority, bool) or self.priority < 1:
            raise ValueError(f"priority must be an int ≥ 1, got {self.priority!r}")
        bad = [k for k in self.tflop if k not in ("fp32", "tf32", "fp16", "fp8")]
        if bad:
            raise ValueError(f"tflop keys must be among fp32, tf32, fp16, fp8, got {bad}")
        for name in ("gbytes", "kops", "cpu_seconds", "measured"):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or v < 0:
                raise ValueError(f"{name} must be a number ≥ 0, got {v!r}")
        if any(not isinstance(v, (int, float)) or v < 0 for v in self.tflop.values()):
            raise ValueError(f"tflop values must be numbers ≥ 0, got {self.tflop!r}")

    @property
    def terms(self) -> dict:
        """The seconds of each term before :data:`SAFETY`: "compute", "memory", "overhead", "host"."""
        return {"compute": sum(t / (H100[k] * UTILISATION) for k, t in self.tflop.items()),
                "memory": self.gbytes / (H100["hbm_tb_s"] * 1e3 * MEMORY_UTILISATION),
                "overhead": self.kops * 1e3 * SECONDS_PER_OP, "host": float(self.cpu_seconds)}

    @property
    def seconds(self) -> float:
        """Expected seconds of the full run on one H100: :data:`MEASURED_SAFETY` × :attr:`measured` where a slot
        measured it, else :data:`SAFETY` × the sum of :attr:`terms`."""
        if self.measured:
            return MEASURED_SAFETY * self.measured
        return SAFETY * sum(self.terms.values())


ESTIMATES: dict[str, Estimate] = {
    "amp_recipe": Estimate(
        1, "ch. 6: FP16 and BF16 speed-ups on tensor cores and the fraction of peak",
        tflop={"fp32": 137, "fp16": 1040}, gbytes=3600, kops=300, cpu_seconds=3,
        measured=18.8,  # the first slot (NVIDIA H200, torch 2.11, 2026-11-26)
        basis="3 x Linear(4096) steps, 6*B*4096^2*3 FLOPs, 250 steps (1 + 3 epochs + the memory epoch of 50 "
              "batches) per precision and batch (128, 256, 512, 513): 106 TFLOP per precision; the matmul peaks at "
              "8192^2 (2 layouts x ~8 timed batches of >= 50 ms): 31 TFLOP FP32, 828 FP16/BF16; ~1.2 GB of weight "
              "traffic per step (SGD, casts, gradients); 100 operators per step (counted)"),
    "fp8_recipes": Estimate(
        2, "ch. 11: FP8 tensor cores (torch._scaled_mm) beside the emulation, the wider language model",
        tflop={"fp32": 71}, gbytes=8000, kops=1610, cpu_seconds=3,
        measured=64.3,  # the first slot (NVIDIA H200, torch 2.11, 2026-11-26)
        basis="9 runs (7 recipes + 2 on tensor cores) x 100 steps of the 4-layer dim-256 transformer on 4,096 "
              "characters (79 GFLOP a step); counted on a CPU: ~2,000 operators a step of a quantised recipe "
              "(17 Linear layers x x/w/g quantisers), ~1,000 for BF16, ~500 for FP32: 1,550 k; evaluations and the "
              "block-size sweep 60 k; ~2,000 elementwise passes of ~8 MB a step; the text's characters on the host"),
    "gat_amp": Estimate(
        3, "ch. 9: the caching allocator's peak memory of the DGL guide's GAT at Reddit's 232,965 nodes",
        tflop={"fp32": 118, "fp16": 236}, gbytes=38500, kops=200, cpu_seconds=6,
        measured=42.3,  # the first slot (NVIDIA H200, torch 2.11, 2026-11-26)
        basis="6 runs (heads 1, 2 x FP32, FP16, BF16) x 100 full-batch epochs on 2.1 M edges: PyG's GATConv reads "
              "and writes ~11 [E, heads, C] tensors per layer and step (C = 256, 256, 41), 4 bytes in FP32, ~3 "
              "under autocast: 38 TB; the projections 0.32 TFLOP (heads 1) and 0.86 (heads 2) per epoch; 313 "
              "operators a step (counted); the synthetic graph and the memory fit's graphs on the host"),
    "memory_tradeoffs": Estimate(
        4, "ch. 7: allocator peak memory and time of checkpointing against FP16 on a ResNet",
        tflop={"tf32": 320, "fp16": 320}, gbytes=3500, kops=90, cpu_seconds=3,
        measured=9.5,  # the first slot (NVIDIA H200, torch 2.11, 2026-11-26)
        basis="ResNet (width 64, 4 stages x 2 blocks, 64 px): 4.4 GFLOP forward per image (FlopCounterMode), "
              "3.4 TFLOP per step of 256 images; ~180 steps (the four ways x 14, exactness, breakdown, 2 x 10 "
              "epochs of 6 batches) and their checkpoint recomputation: 640 TFLOP, half in FP16; ~20 GB of "
              "activations a step; 377 operators a step (counted)"),
    "biglstm": Estimate(
        5, "ch. 8: the blog post's Figure 1 with real FP16 autocast on the LSTM at 65,536 tokens per batch, no shift",
        tflop={"fp32": 176, "fp16": 528}, gbytes=19200, kops=320, cpu_seconds=4,
        measured=37.0,  # a lower bound: the first slot (NVIDIA H200, torch 2.11, 2026-11-26) stopped the 200-step run after 74 s; 100 steps now
        basis="4 arms x 100 steps of the 'small' LSTM (2 x 512 cells, projection 128) on 2048 x 32 tokens over "
              "8,192 words: 13.4 MFLOP per token, 0.88 TFLOP a step (the FP32 arm without TF32); the logits, "
              "537 M values, pass ~10 times through memory a step with their cast, softmax and gradient: 24 GB; "
              "~400 operators a step (cuDNN's LSTM is one call; the CPU count unrolls it); the corpus"),
    "ssd_table2": Estimate(
        6, "ch. 8: Table 2 with real FP16 autocast on SSD300 (VGG-16 at full width, 300 px), no shift",
        tflop={"tf32": 940, "fp16": 1770}, gbytes=10260, kops=360, cpu_seconds=11,
        basis="3 arms x 150 steps of SSD300 (61.5 GFLOP forward per 300 px image, FlopCounterMode) on batches of "
              "32: 5.9 TFLOP a step, FP32 convolutions in TF32 (cuDNN's default); evaluations 3 x 300 images; "
              "~19 GB of elementwise traffic a step and as much per histogram step (every 5th); ~800 operators a "
              "step (816 counted without histograms, Adam foreach on CUDA); 1,900 images generated, mAP on the host"),
    "ssd_histogram": Estimate(
        7, "ch. 2: Figure 2 on SSD300 itself (VGG-16 at full width, 300 px), which a CPU cannot train",
        tflop={"tf32": 1244}, gbytes=9000, kops=360, cpu_seconds=12,
        basis="200 FP32 steps of SSD300 on batches of 32 (5.9 TFLOP a step) + 2 evaluations of 300 images + the "
              "sweep (4 x 50 steps, large at 256 px: 5.2 GFLOP per image); every step histograms ~1.6 G "
              "activation-gradient values (~45 GB a step with the elementwise traffic); ~1,200 operators a step "
              "with the compiled histogram kernel (6,522 counted with the eager one), ~600 a sweep step"),
    "loss_scaling": Estimate(
        8, "ch. 3: the loss scale's history with real FP16 on CUDA, ours beside torch's",
        tflop={"fp16": 7}, kops=300, cpu_seconds=1.5,
        measured=14.6,  # the first slot (NVIDIA H200, torch 2.11, 2026-11-26), run on its own
        basis="2,000 steps of two MLPs (64-1024-1024-10, batch 256: 1.7 GFLOP each) and a bit-for-bit comparison: "
              "150 operators a step (counted); launch-bound"),
    "distributed": Estimate(
        9, "ch. 10: DDP and FSDP2 with NCCL on two GPUs or more (the lent machines have one: its ranks would run on the CPU, so a slot leaves it out)",
        cpu_seconds=25, gpu=False,
        basis="on the lent single-GPU machine the ranks compute on the CPU (placement()): torchrun's start (~8 s) "
              "and the cpu profile's network for half its steps at twice its batch (chapter 9 with the cpu "
              "profile: 54 s on 2 CPU cores, figures included)"),
    "gradient_factors": Estimate(
        10, "ch. 2: the SSD300-shape series with the quarter-width VGG-16 at 300 px (the long run leaves it out)",
        tflop={"tf32": 51}, gbytes=700, kops=390, cpu_seconds=5,
        basis="3 variants x 100 FP32 steps of 32 images (quarter width 4.1 and eighth width 1.1 GFLOP forward "
              "per 300 px image); every step histograms every module's gradient: ~1,300 operators a step with the "
              "compiled kernel (2,349 counted with the eager one); 1,600 images of 300 px generated"),
    "message_passing": Estimate(
        11, "ch. 9 (not shown yet): the DGL guide's FP16 message passing on CUDA kernels",
        kops=2, cpu_seconds=1,
        measured=6.6,  # the first slot (NVIDIA H200, torch 2.11, 2026-11-26), run on its own
        basis="four examples on 30 nodes and 100 edges: milliseconds; PyG is imported by gat_amp before"),
    "lm_gradient_scale": Estimate(
        12, "ch. 8 (not shown yet): vocabulary and batch against the gradient scale, up to 16,384 tokens",
        gbytes=1000, kops=150, cpu_seconds=6,
        basis="5 points (V 1024, 8192 x N 16 x 16, 1024 x 16, and the shift check) x 100 FP32 steps of the tiny "
              "LSTM: ~300 operators a step with the compiled histogram kernel (the CPU count unrolls the LSTM); "
              "the logits' traffic, 100 x ~10 GB; two tokenised corpora on the host"),
    "master_weights_stall": Estimate(
        13, "ch. 4 (not shown yet): pure FP16 stalling, with CUDA's FP16 arithmetic",
        kops=250, cpu_seconds=1,
        measured=15.6,  # the first slot (NVIDIA H200, torch 2.11, 2026-11-26), run on its own
        basis="2,000 steps of three small MLPs and the swamped share: 125 operators a step (counted)"),
    "tensor_core_accumulation": Estimate(
        14, "ch. 5: FP16 and FP8 tensor-core products against the accumulation module's exact predictions",
        kops=5, cpu_seconds=11,
        measured=17.6,  # an H100 80GB HBM3 (15.6 s on an H200), 2026-11-25
        basis="measured: 17.6 s on an H100 80GB HBM3 (15.6 s on an H200), almost all of it the exact FP16- and "
              "14-bit-accumulator predictions of 64 x 64 outputs on the host (sum of K about 32 k steps); the "
              "device's matrix products take milliseconds"),
    "accumulation_error": Estimate(
        15, "ch. 5: error against K (its full profile is its cpu profile: nothing here runs on a GPU)",
        cpu_seconds=2, gpu=False,
        basis="measured: 3.0 s on an H100 machine's host CPU (10 s with the process start)"),
    "accumulation_training": Estimate(
        16, "ch. 5: training with FP16-accumulated products (its full profile is its cpu profile)",
        cpu_seconds=14, gpu=False,
        basis="estimated from 35.5 s measured on an H100 machine's host with a larger MLP; the arithmetic of "
              "mpt_lab.accumulation runs on the CPU"),
    "fourbit_ablation": Estimate(
        17, "ch. 13: the four-bit ablation (its full profile is its cpu profile; the long CPU run is the big one)",
        cpu_seconds=120, gpu=False,
        basis="the cpu profile: 9 arms x 2 seeds x 120 steps of the 2-block width-64 transformer on 512 characters, "
              "~2,000 operators a step of the emulated four-bit recipes (launch-bound on a GPU); ~100 s of CPU "
              "time on the project's 2-core CPU, and the diagnostics"),
}


def expected_seconds(name: str) -> float:
    """Expected seconds of experiment ``name``'s full profile on one H100 (:class:`Estimate`.seconds).

    Raises KeyError naming the table when ``name`` has no row.
    """
    if name not in ESTIMATES:
        raise KeyError(f"{name!r} has no row in mpt_lab.experiments.budget.ESTIMATES (the full profile's priority "
                       "table): add an Estimate for it")
    return ESTIMATES[name].seconds


def total_seconds(names=None) -> float:
    """:data:`STARTUP_SECONDS` plus the expected seconds of the GPU rows among ``names`` (default: every row): what
    a GPU slot runs.  Rows with ``gpu=False`` are left out (see :class:`Estimate`)."""
    names = ESTIMATES if names is None else names
    return STARTUP_SECONDS + sum(expected_seconds(n) for n in names if ESTIMATES[n].gpu)


def plan(names) -> list:
    """``names`` in priority order (those without a row last, in the given order)."""
    names = list(names)
    return sorted(names, key=lambda n: (ESTIMATES[n].priority if n in ESTIMATES else 10 ** 9, names.index(n)))


def table(names=None) -> str:
    """The priority table as text: priority, name, expected seconds, its terms, what the book needs it for; and
    the sum."""
    names = plan(ESTIMATES if names is None else names)
    rows = [f"{'#':>2}  {'experiment':<22}{'expected s':>11}  {'compute':>8}{'memory':>8}{'overhead':>9}"
            f"{'host':>7}  needed for"]
    total = 0.0
    for n in names:
        if n not in ESTIMATES:
            rows.append(f"{'?':>2}  {n:<22}{'no estimate':>11}")
            continue
        e = ESTIMATES[n]
        t = e.terms
        total += e.seconds if e.gpu else 0.0
        rows.append(f"{e.priority:>2}  {n:<22}{e.seconds:>11.0f}  {t['compute']:>8.1f}{t['memory']:>8.1f}"
                    f"{t['overhead']:>9.1f}{t['host']:>7.1f}  {e.needs}"
                    + ("" if e.gpu else " [CPU work: not in a GPU slot, not in the sum]"))
    rows.append(f"    {'startup':<22}{STARTUP_SECONDS:>11.0f}  CUDA context, handles, the histogram kernel's compilation")
    rows.append(f"    {'sum':<22}{total + STARTUP_SECONDS:>11.0f}  (slot: {SLOT_SECONDS:.0f} s on one H100; the terms are "
                f"before the safety factor {SAFETY})")
    return "\n".join(rows)
