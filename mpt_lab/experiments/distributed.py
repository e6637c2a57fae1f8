"""Mixed precision across processes: DDP and FSDP2 under torchrun, measured.

Training on several devices brings precision choices that one device does not have (Li et al. 2020, "PyTorch
Distributed: Experiences on Accelerating Data Parallel Training"; Zhao et al. 2023, "PyTorch FSDP: Experiences
on Scaling Fully Sharded Data Parallel"): the dtype in which the ranks' gradients are summed, what FSDP2's
``MixedPrecisionPolicy(param_dtype, reduce_dtype)`` gathers and reduces in, what DDP's gradient compression hooks
cost, and why the loss scaler of a sharded model must agree on overflow across ranks.  PyTorch does the
distribution (DDP, ``fully_shard``; gloo on CPUs, NCCL on GPUs); this experiment measures what precision does
inside it, in three parts:

1. **Recipes**: the same digit classifier (:func:`mpt_lab.models.digits_mlp`, Adam) trained on the same global
   batches with DDP (FP32 all-reduce; ``bf16_compress_hook``; ``fp16_compress_hook``; FP16 autocast +
   :class:`mpt_lab.scaling.GradScaler`) and with FSDP2 (FP32; param/reduce dtypes BF16/FP32, BF16/BF16 and
   FP16/FP32 + GradScaler): the loss of every step, test accuracy, the final parameters against DDP in FP32, and
   each rank's bytes of parameters, gradients and optimizer state.
2. **Reduction error**: the ranks' gradients all-reduced in FP32, BF16 and FP16 by the real process group and
   compared bit for bit with :func:`mpt_lab.collectives.ring_allreduce`; the error of the sum for N = 2 …
   1,024 ranks, computed with :func:`mpt_lab.formats.round_to` in the order of a ring and of a binary tree
   (:mod:`mpt_lab.collectives`); and where an FP16 sum of loss-scaled gradients overflows without pre-division.
3. **Overflow agreement**: FSDP2 (FP16/FP32) with ``torch.amp.GradScaler``, with ours, and with ours left
   *unsynchronised* (each rank keeps its own shard's found-inf flag), while an inf is put into one rank's
   gradient shard at chosen steps: the scale history of every rank and the drift of the parameters.

Every rank runs this module; rank 0 alone reports and writes the result.  Commands::

    python -m mpt_lab.experiments.distributed --profile quick --out F      # starts torchrun itself
    torchrun --standalone --nproc_per_node 2 -m mpt_lab.experiments.distributed --profile quick --out F
    # several machines: the same command on every node, node 0's address as the rendezvous endpoint
    torchrun --nnodes 2 --nproc_per_node 8 --rdzv-backend c10d --rdzv-endpoint HOST:29500 --rdzv-id mpt \\
        -m mpt_lab.experiments.distributed --profile full --set nproc=8 --out F

From Python, :func:`launch` (which ``run`` calls outside torchrun) starts torchrun in a subprocess with a
timeout, streams rank 0's progress, shows the ranks' error output when one fails, and stops every rank when the
time is up.
"""

from __future__ import annotations

import dataclasses
import math
import os
import shlex
import signal
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F_nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor
from torch.func import functional_call, grad, vmap
from torch.nn.parallel import DistributedDataParallel

from .. import profile as current_profile
from ..collectives import COMM_FORMATS, fsdp_divide_factors, relative_error, ring_allreduce, tree_allreduce
from ..data import digits_data
from ..device import describe
from ..harness.runner import Experiment, ExperimentConfig, ExperimentResult, Run, progress_enabled, run_main
from ..harness.torchrun import LaunchError, in_torchrun, run_torchrun, tail, write_pid
from ..models import digits_mlp
from ..recipes import DISTRIBUTED, LossScaling, Recipe
from ..recipes import RECIPES as REGISTRY
from ..scaling import GradScaler, max_gradient_scale
from ..training import accuracy, autocast_to, backward_step, shuffled_batches

__all__ = [
    "NAME",
    "Config",
    "PROFILES",
    "Recipe",
    "RECIPES",
    "DistributedResult",
    "AGREEMENT",
    "LaunchError",
    "placement",
    "launch",
    "in_torchrun",
    "reduction_config",
    "run",
    "config_for",
    "main",
]

NAME = "distributed"

# ============================================================================================== recipes, config
#: The recipes, in the order of the chapter's legend: the registry's :data:`mpt_lab.recipes.DISTRIBUTED`, each a
#: :class:`~mpt_lab.recipes.Recipe` whose ``distribution`` says how it trains across processes (wrapper, the dtype
#: gradients are summed in, DDP's communication hook, FSDP2's ``MixedPrecisionPolicy``).
RECIPES = {name: REGISTRY[name] for name in DISTRIBUTED}

#: What "agree" means between a recipe and DDP in FP32: final losses (mean over the last tenth of the steps)
#: within ``final_loss`` and test accuracies within ``test_accuracy`` (absolute).
AGREEMENT = {"final_loss": 0.05, "test_accuracy": 0.03}


@dataclass
class Config(ExperimentConfig):
    """nproc : processes per machine that :func:`launch` starts (0: one per GPU); under a torchrun started by
    hand it must match ``--nproc_per_node``.  backend : "auto" (NCCL on CUDA, gloo on a CPU), "gloo" or "nccl".
    recipes : which of :data:`RECIPES` to train (empty: none; :func:`reduction_config`).  steps, batch_size (global, split evenly over the ranks),
    hidden, layers, lr (Adam), init_scale, growth_interval (the scalers) : the training runs.  sweep_max :
    the reduction error is computed for N = 2, 4, …, sweep_max ranks (0: not at all), on sweep_elements gradient
    elements of micro-batches of sweep_batch samples per rank.  flag_steps : steps of the overflow-agreement study (0
    skips it); inject_steps : the steps at which rank inject_rank's gradient shard gets an inf."""

    nproc: int = 2
    backend: str = "auto"
    recipes: tuple = tuple(RECIPES)
    steps: int = 300
    batch_size: int = 64
    hidden: int = 128
    layers: int = 2
    lr: float = 1e-3
    init_scale: float = 2.0**16
    growth_interval: int = 50
    sweep_max: int = 1024
    sweep_elements: int = 4096
    sweep_batch: int = 8
    flag_steps: int = 30
    inject_steps: tuple = (5, 15)
    inject_rank: int = 1

    def validate(self) -> None:
        super().validate()
        self.check_positive(
            "steps", "batch_size", "hidden", "layers", "growth_interval", "sweep_elements", "sweep_batch"
        )
        self.check_positive("nproc", "flag_steps", "inject_rank", "sweep_max", minimum=0)
        if self.sweep_max == 1:
            raise ValueError("config.sweep_max must be 0 (no sweep) or an int ≥ 2, got 1")
        self.check_choices("backend", ("auto", "gloo", "nccl"))
        if self.recipes != ():
            self.check_choices("recipes", tuple(RECIPES), subset=True)
        if not (isinstance(self.lr, (int, float)) and 0 < self.lr < math.inf):
            raise ValueError(f"config.lr must be a positive number, got {self.lr!r}")
        if not (isinstance(self.init_scale, (int, float)) and 0 < self.init_scale < math.inf):
            raise ValueError(f"config.init_scale must be a positive number, got {self.init_scale!r}")
        if not all(isinstance(s, int) and 0 <= s < max(self.flag_steps, 1) for s in self.inject_steps):
            raise ValueError(
                f"config.inject_steps must be ints in [0, flag_steps = {self.flag_steps}), got {self.inject_steps!r}"
            )


PROFILES = {
    "quick": {"steps": 60, "flag_steps": 16, "inject_steps": (3, 9), "sweep_elements": 1024, "threads": 1},
    "cpu": {
        "steps": 200,
        "hidden": 256,
        "flag_steps": 40,
        "inject_steps": (5, 20),
        "growth_interval": 10,
        "sweep_elements": 4096,
        "threads": 1,
    },
    # one rank per GPU with NCCL where there are two GPUs or more; on a machine with one GPU two gloo ranks on its
    # CPU (placement()), where float16 products have no fast kernels: so the cpu profile's network at twice its
    # batch, for half its steps (mpt_lab.harness.budget)
    "full": {
        "nproc": 0,
        "steps": 100,
        "hidden": 256,
        "batch_size": 128,
        "flag_steps": 30,
        "inject_steps": (5, 15),
        "growth_interval": 10,
        "sweep_elements": 4096,
    },
}

#: ``--smoke``: two steps of every recipe and of the overflow study (an inf injected at the second), the reduction
#: sweep up to 8 ranks on 256 elements.
SMOKE = {"steps": 2, "flag_steps": 2, "inject_steps": (1,), "sweep_max": 8, "sweep_elements": 256}


# ======================================================================================================= result
@dataclass
class DistributedResult(ExperimentResult):
    """What rank 0 wrote.

    world_size, nnodes : processes and machines; backend : "gloo" or "nccl"; comm_versions : {"nccl": …} where
        known (also copied into ``provenance``); ranks_device : "cuda" or "cpu", where the ranks computed (on a
        machine with one GPU, two gloo ranks on the CPU: :func:`placement`).
    recipes : name → {"label", "wrapper", "comm", "losses" (the global batch's loss per step, the ranks' mean),
        "test_accuracy", "final_loss" (mean of the last tenth of the steps), "param_diff" (‖θ − θ_ref‖₂/‖θ_ref‖₂
        at the end, θ_ref = DDP FP32's parameters), "identical_to_reference" (bit for bit), "parameters" (count),
        "memory" (per rank: bytes of "params", "grads", "optimizer" state, held between steps, and "gathered",
        FSDP2's largest all-gathered layer, held only while it computes), "scales" (per rank, the loss scale of
        every step; None without a scaler), "seconds"}.
    reduction : {"measured": {"n", "elements", and per format "FP32"/"BF16"/"FP16": {"rel_error", "matches_ring",
        "differs_from_tree"}} (the real all-reduce of the ranks' gradients, pre-divided by N: its error, whether it
        equals :func:`ring_allreduce` bit for bit, and the share of elements where a tree's order would give
        another value; 0 for N = 2, where every order is the same sum),
        "hooks": {"bf16", "fp16"}: DDP's gradients under the hook equal :func:`ring_allreduce` bit for bit (None
        for N > 2, where DDP's buckets move the chunk boundaries), "sweep": {"n", "elements", "ring"/"tree":
        {format: [relative error of the averaged gradient per N]}}, "fp16": {"scale", "n", and per division
        ("sum_then_divide", "predivide", "fsdp_split") "rel_error", "overflow_share", "underflow_share" lists,
        "first_overflow_n"}}; "sweep" and "fp16" are absent when ``sweep_max`` is 0 (:func:`reduction_config`),
        and ``recipes`` is {} when none was trained.
    flag_agreement : {"steps", "inject_steps", "inject_rank", "variants": {"torch"/"mpt_lab"/"unsynchronised":
        {"scales" (per rank, per step), "skipped" (per rank, the skipped steps), "losses"}}, "identical_to_torch"
        (ours and torch's: the same scale on every rank and bit-identical parameter shards after every step),
        "drift" (per step, ‖θ_unsynchronised − θ_mpt_lab‖₂ / ‖θ_mpt_lab‖₂)}; {} when skipped.
    """

    world_size: int
    nnodes: int
    backend: str
    comm_versions: dict
    recipes: dict
    reduction: dict
    flag_agreement: dict
    ranks_device: str = ""

    def __post_init__(self):
        self.provenance.setdefault(
            "distributed",
            {
                "world_size": self.world_size,
                "nnodes": self.nnodes,
                "backend": self.backend,
                "ranks_device": self.ranks_device,
                **self.comm_versions,
            },
        )

    # --- what the chapter and the tests ask ---------------------------------------------------------------
    def agreement(self, recipe: str, reference: str = "ddp_fp32") -> dict:
        """{"final_loss": |Δ|, "test_accuracy": |Δ|, "agree": both within :data:`AGREEMENT`} against ``reference``.

        Raises KeyError naming the recipes that were run.
        """
        for name in (recipe, reference):
            if name not in self.recipes:
                raise KeyError(f"{name!r} was not run; the recipes are {list(self.recipes)}")
        a, b = self.recipes[recipe], self.recipes[reference]
        gaps = {
            "final_loss": abs(a["final_loss"] - b["final_loss"]),
            "test_accuracy": abs(a["test_accuracy"] - b["test_accuracy"]),
        }
        return {**gaps, "agree": all(gaps[k] <= AGREEMENT[k] for k in AGREEMENT)}

    def scales_part_at(self, variant: str = "unsynchronised") -> int | None:
        """The first step at which the ranks' loss scales differ in the overflow study (None: never)."""
        scales = self.flag_agreement["variants"][variant]["scales"]
        for step, per_rank in enumerate(zip(*scales)):
            if len(set(per_rank)) > 1:
                return step
        return None

    def describe(self) -> str:
        parts = [f"distributed ({self.profile} profile, {self.device}): {self.world_size} ranks, {self.backend}"]
        if "ddp_fp32" in self.recipes:
            for name in ("fsdp_bf16_fp32", "fsdp_fp32"):
                if name in self.recipes:
                    parts.append(f"{name} vs ddp_fp32: final loss gap {self.agreement(name)['final_loss']:.3g}")
        m = self.reduction["measured"]
        parts.append(
            "all-reduce error at N = {}: {}; equal to the simulated ring: {}".format(
                m["n"],
                ", ".join(f"{f} {m[f]['rel_error']:.2g}" for f in COMM_FORMATS),
                all(m[f]["matches_ring"] for f in COMM_FORMATS),
            )
        )
        fp16 = self.reduction.get("fp16")
        if fp16:
            parts.append(
                f"FP16 sum without pre-division first overflows at N = {fp16['first_overflow_n']}"
                if fp16["first_overflow_n"]
                else f"FP16 sums do not overflow up to N = {fp16['n'][-1]}"
            )
        if self.flag_agreement:
            fa = self.flag_agreement
            parts.append(
                f"ours identical to torch under FSDP2: {fa['identical_to_torch']}; unsynchronised "
                f"scales part at step {self.scales_part_at()}, drift {fa['drift'][-1]:.2g}"
            )
        return "; ".join(parts)


# ===================================================================================================== launcher
def _nproc(config: Config) -> int:
    """``config.nproc``, or for 0: one rank per GPU where there are two or more, else two ranks (on the CPU, with
    gloo: NCCL takes one GPU per rank, so one GPU cannot hold two NCCL ranks)."""
    if config.nproc:
        return config.nproc
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return gpus if gpus >= 2 else 2


def placement(config: Config, local_world: int) -> tuple:
    """Where the ranks of one machine run: ``(backend, device type, why)``.

    NCCL ranks run one per GPU (NCCL refuses two ranks on one device); gloo ranks run on the CPU (gloo has no GPU
    ``all_gather`` or ``reduce_scatter``, which FSDP2 needs: the backend table of ``torch.distributed``'s
    documentation).  ``backend="auto"``: NCCL when this machine has a GPU for every one of its ``local_world``
    ranks, else gloo on the CPU (one GPU, or none).

    Raises ValueError for ``backend="nccl"`` without a GPU per rank.
    """
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if config.backend == "nccl" or (config.backend == "auto" and gpus >= local_world):
        if gpus < local_world:
            raise ValueError(f"config.backend 'nccl' needs a GPU per rank: {local_world} ranks, {gpus} GPU(s)")
        return "nccl", "cuda", f"NCCL, one rank per GPU ({local_world} of {gpus})"
    why = (
        "gloo on the CPU: "
        + (
            "this machine has one GPU and NCCL takes one GPU per rank"
            if gpus == 1
            else f"{gpus} GPUs for {local_world} ranks"
            if gpus
            else "no GPU"
        )
        if config.backend == "auto"
        else "gloo on the CPU, as configured"
    )
    return "gloo", "cpu", why


def launch(
    config: Config | str | None = None,
    *,
    nproc: int | None = None,
    timeout: float = 900.0,
    progress: bool | None = None,
    command: str | None = None,
    env: dict | None = None,
    echo: Callable[[str], None] = print,
) -> DistributedResult:
    """Run the experiment under torchrun in a subprocess and return rank 0's result.

    Starts ``python -m torch.distributed.run --standalone --nproc_per_node N -m mpt_lab.experiments.distributed
    --profile P [--set …] --out TMP`` (one machine; a free rendezvous port), streams what rank 0 prints (its
    progress; not its summary, ``result.describe()``) through ``echo`` line by line, keeps the ranks' error
    output and loads the JSON that rank 0 wrote.  Each rank runs with one OpenMP thread unless ``config.threads`` says otherwise.

    Parameters
    ----------
    config : a :class:`Config`, a profile name ("quick", "cpu", "full"), or None for :func:`mpt_lab.profile`
    nproc : processes to start (default ``config.nproc``; 0 there: one per GPU, or 2 on a CPU)
    timeout : seconds before every rank is stopped (a rank that hangs in a collective never returns by itself)
    progress : rank 0 prints a line per finished part (default: unless ``MPT_LAB_PROGRESS=0``)
    command : the command line recorded as the result's provenance (default: the ``python -m`` command of
        ``config``, which starts torchrun itself); the torchrun command is recorded as ``provenance["launcher"]``
    env : extra environment variables for the ranks
    echo : called with each line rank 0 prints (default ``print``)

    Raises
    ------
    TypeError, ValueError
        A bad config (named field), ``nproc`` < 1.
    LaunchError
        torchrun exited with a non-zero status (a rank raised, was killed, …): the message ends with the last
        lines of the ranks' error output, where torchrun names the failed rank and its exit code or signal.
    TimeoutError
        The ranks did not finish within ``timeout`` seconds; all of them were stopped.
    """

    if config is None or isinstance(config, str):
        config = config_for(config or current_profile())
    if not isinstance(config, Config):
        raise TypeError(f"config must be a {__name__}.Config or a profile name, got {type(config).__name__}")
    config.validate()
    n = _nproc(config) if nproc is None else nproc
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise ValueError(f"nproc must be an int ≥ 1, got {n!r}")
    if not (isinstance(timeout, (int, float)) and timeout > 0):
        raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
    show = progress_enabled(progress)
    config = dataclasses.replace(config, nproc=n)
    args = shlex.split(EXPERIMENT.command(config))[3:]  # --profile P --set …, without "python -m NAME"
    with tempfile.TemporaryDirectory(prefix="mpt_lab_distributed_") as tmp:
        out, err_path = Path(tmp) / "result.json", Path(tmp) / "stderr.txt"
        module = ["-m", f"mpt_lab.experiments.{NAME}", *args, "--out", str(out)]
        root = str(Path(__file__).resolve().parents[2])  # the ranks import this very mpt_lab
        child_env = {
            **os.environ,
            "OMP_NUM_THREADS": str(config.threads or 1),
            "PYTHONUNBUFFERED": "1",
            "MPT_LAB_PROGRESS": "1" if show else "0",
            "PYTHONPATH": os.pathsep.join([root, *filter(None, [os.environ.get("PYTHONPATH")])]),
            **(env or {}),
        }
        summary = f"{NAME} ({config.profile} profile, "  # rank 0's describe(): the caller's to show
        with open(err_path, "w+") as err:
            rc = run_torchrun(
                module,
                nproc=n,
                timeout=timeout,
                env=child_env,
                pid_dir=Path(tmp) / "pids",
                err=err,
                echo=echo,
                keep=lambda line: line != f"wrote {out}" and not line.startswith(summary),
            )
            err.seek(0)
            errors = err.read()
        if rc != 0:
            raise LaunchError(
                f"torchrun exited with status {rc}; the last lines of the ranks' error output:\n{tail(errors)}"
            )
        if not out.exists():
            raise LaunchError(f"torchrun finished but rank 0 wrote no result; the ranks' error output:\n{tail(errors)}")
        result = DistributedResult.load(out)
    result.provenance["command"] = command or EXPERIMENT.command(config)
    if result.ranks_device == "cpu" and torch.cuda.is_available():  # one GPU: the ranks ran on the CPU, with gloo
        result.provenance["device"] = f"{describe('cpu')}; ranks on the CPU with gloo (GPU present: {describe('cuda')})"
        result.provenance["placement"] = placement(config, n)[2]
    result.provenance["launcher"] = shlex.join(["torchrun", "--standalone", "--nproc_per_node", str(n), *module[:-2]])
    return result


def reduction_config(config: Config | str | None = None, nproc: int = 3) -> Config:
    """``config`` cut down to the real all-reduce of the ranks' gradients alone, for ``nproc`` ranks on gloo.

    No recipe is trained, no sweep simulated, no overflow study run: what is left is part 2's check that gloo's
    all-reduce equals :func:`mpt_lab.collectives.ring_allreduce` bit for bit.  On 2 ranks every element is a sum
    of two values, which has one order, so only 3 or more ranks test the order itself; this configuration makes
    that test cheap enough for a notebook (``launch(reduction_config("quick"), nproc=3)``).  The global batch is
    the largest multiple of ``nproc`` not above ``config.batch_size``; the device is the CPU (gloo), so it runs
    on a machine with any number of GPUs.

    Parameters
    ----------
    config : a :class:`Config`, a profile name, or None for :func:`mpt_lab.profile`
    nproc : the number of ranks (≥ 2)

    Raises TypeError for a config that is not a Config or a profile name, ValueError for ``nproc`` < 2.
    """
    if config is None or isinstance(config, str):
        config = config_for(config or current_profile())
    if not isinstance(config, Config):
        raise TypeError(f"config must be a {__name__}.Config or a profile name, got {type(config).__name__}")
    if not isinstance(nproc, int) or isinstance(nproc, bool) or nproc < 2:
        raise ValueError(f"nproc must be an int ≥ 2, got {nproc!r}")
    batch = max(nproc, config.batch_size - config.batch_size % nproc)
    return dataclasses.replace(
        config,
        nproc=nproc,
        backend="gloo",
        device="cpu",
        recipes=(),
        steps=1,
        batch_size=batch,
        sweep_max=0,
        flag_steps=0,
        inject_steps=(),
    )


def _launcher(config: Config, *, progress, command):
    """The runner's hook (``Experiment(launcher=…)``): outside torchrun, :func:`launch`; inside, None (measure)."""
    if in_torchrun():
        return None
    return launch(config, progress=progress, command=command)


# ======================================================================================================= ranks
#: For the launcher's tests: "raise:R", "kill:R" or "hang:R" makes rank R raise, die of SIGKILL, or hang (sleep,
#: while the others wait for it in a collective) as soon as the process group is up.
FAULT_ENV = "MPT_LAB_DISTRIBUTED_FAULT"


@dataclass
class _Ranks:
    """This process among the others: rank, world size, machines, device, backend, whether it reports."""

    rank: int
    world: int
    nnodes: int
    device: torch.device
    backend: str
    progress: bool
    shard: slice  # this rank's part of every global batch

    def say(self, text: str) -> None:
        """Rank 0's progress line (streamed by :func:`launch`)."""
        if self.rank == 0 and self.progress:
            print(text, flush=True)


def _setup(config: Config, run: Run) -> _Ranks:
    """Check the configuration against what torchrun started, write this rank's pid for :func:`launch`, and
    join the process group."""
    if not in_torchrun():
        raise RuntimeError(
            "measure runs in the ranks that torchrun starts: call run() or launch(), which start "
            "torchrun, or run this module under torchrun"
        )
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ["LOCAL_RANK"])
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    if config.nproc and local_world != config.nproc:
        raise ValueError(
            f"torchrun started {local_world} processes on this machine but config.nproc is "
            f"{config.nproc}: add --set nproc={local_world}"
        )
    if config.batch_size % world:
        raise ValueError(f"config.batch_size = {config.batch_size} must be a multiple of the world size {world}")
    if config.flag_steps and not 0 <= config.inject_rank < world:
        raise ValueError(f"config.inject_rank must be a rank in [0, {world}), got {config.inject_rank}")
    write_pid(rank)
    backend, kind, _ = (
        placement(config, local_world)
        if run.device.type == "cuda"
        else ("gloo" if config.backend in ("auto", "gloo") else config.backend, "cpu", "")
    )
    if backend == "nccl" and kind != "cuda":
        raise ValueError("config.backend 'nccl' needs CUDA GPUs")
    device = torch.device("cuda", local_rank) if kind == "cuda" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(backend, device_id=device if device.type == "cuda" else None)
    _inject_fault(rank)
    per_rank = config.batch_size // world
    return _Ranks(
        rank,
        world,
        max(1, world // local_world),
        device,
        backend,
        run.progress,
        slice(rank * per_rank, (rank + 1) * per_rank),
    )


def _inject_fault(rank: int) -> None:
    kind, _, who = os.environ.get(FAULT_ENV, "").partition(":")
    if not kind or int(who) != rank:
        return
    if kind == "raise":
        raise RuntimeError(f"fault injected on rank {rank} ({FAULT_ENV}={kind}:{who})")
    if kind == "kill":
        os.kill(os.getpid(), getattr(signal, "SIGKILL", signal.SIGTERM))
    if kind == "hang":
        time.sleep(3600)


def _dtype(name):
    return None if name is None else getattr(torch, name)


def _model(config: Config, device: torch.device) -> torch.nn.Module:
    """The same network on every rank and in every recipe (seeded weights)."""
    return digits_mlp(config.hidden, config.layers, seed=config.seed).to(device)


def _wrap(model: torch.nn.Module, recipe: Recipe, ctx: _Ranks) -> torch.nn.Module:
    """``model`` under DDP (with the recipe's communication hook) or sharded by FSDP2 (each Linear, then the
    whole), with the recipe's ``MixedPrecisionPolicy``."""
    dist_ = recipe.distribution
    if dist_.wrapper == "ddp":
        ddp = DistributedDataParallel(
            model, device_ids=[ctx.device.index] if ctx.device.type == "cuda" else None, gradient_as_bucket_view=True
        )
        if dist_.hook:
            hook = getattr(default_hooks, f"{dist_.hook}_compress_hook")
            if dist_.hook == "bf16" and ctx.backend == "gloo":
                # DDP refuses a hook *named* bf16_compress_hook without NCCL ≥ 2.10 (old NCCL had no bfloat16);
                # gloo sums bfloat16, so on a CPU PyTorch's own hook runs through a wrapper.
                def bf16_hook_on_gloo(process_group, bucket, hook=hook):
                    return hook(process_group, bucket)

                hook = bf16_hook_on_gloo
            ddp.register_comm_hook(None, hook)
        return ddp
    policy = MixedPrecisionPolicy(param_dtype=_dtype(dist_.param_dtype), reduce_dtype=_dtype(dist_.reduce_dtype))
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mp_policy=policy)
    fully_shard(model, mp_policy=policy)
    return model


def _local(t: torch.Tensor) -> torch.Tensor:
    """The part of ``t`` this rank holds (a DTensor's local shard; a plain tensor itself)."""
    return t.to_local() if isinstance(t, DTensor) else t


def _nbytes(tensors) -> int:
    """Bytes of the storages behind ``tensors``, each storage counted once (views share one)."""
    seen: dict = {}
    for t in tensors:
        storage = t.untyped_storage()
        seen[(storage.data_ptr(), storage.nbytes())] = storage.nbytes()
    return int(sum(seen.values()))


def _memory(model, optimizer, recipe: Recipe) -> dict:
    """This rank's bytes of parameters, gradients and optimizer state (held between steps), and FSDP2's largest
    all-gathered layer in ``param_dtype`` (held while that layer computes)."""
    params = list(model.parameters())
    state = [v for s in optimizer.state.values() for v in s.values() if isinstance(v, torch.Tensor)]
    gathered = 0
    if recipe.distribution.wrapper == "fsdp":
        itemsize = torch.empty((), dtype=_dtype(recipe.distribution.param_dtype) or torch.float32).element_size()
        gathered = max(
            sum(p.numel() for p in layer.parameters()) * itemsize
            for layer in model
            if isinstance(layer, torch.nn.Linear)
        )
    return {
        "params": _nbytes(_local(p) for p in params),
        "grads": _nbytes(_local(p.grad) for p in params if p.grad is not None),
        "optimizer": _nbytes(_local(v) for v in state),
        "gathered": int(gathered),
    }


@torch.no_grad()
def _full_parameters(model) -> torch.Tensor:
    """Every parameter, whole (FSDP2's shards gathered: a collective), as one float32 CPU vector."""
    return torch.cat(
        [(p.full_tensor() if isinstance(p, DTensor) else p).float().reshape(-1).cpu() for p in model.parameters()]
    )


def _global_mean(values: list, ctx: _Ranks) -> list:
    """The ranks' mean of a per-step list of 0-dim tensors (one all-reduce)."""
    t = torch.stack(values).float().to(ctx.device)
    dist.all_reduce(t)
    return (t / ctx.world).tolist()


def _gather(obj, ctx: _Ranks) -> list:
    """Every rank's ``obj`` (picklable), in rank order, on every rank."""
    out = [None] * ctx.world
    dist.all_gather_object(out, obj)
    return out


# ==================================================================================================== 1. recipes
def _train(recipe: Recipe, config: Config, ctx: _Ranks, data, batches) -> tuple:
    """Train one recipe; (its record, its final parameters as one vector)."""
    xtr, ytr, xte, yte = data
    t0 = time.perf_counter()
    model = _wrap(_model(config, ctx.device), recipe, ctx)
    optimizer = torch.optim.Adam(model.parameters(), lr=config.lr)
    scaler = (
        GradScaler(init_scale=config.init_scale, growth_interval=config.growth_interval)
        if recipe.loss_scaling is LossScaling.DYNAMIC
        else None
    )
    losses, scales = [], []
    for idx in batches[: config.steps]:
        local = idx[ctx.shard]
        optimizer.zero_grad(set_to_none=True)
        with autocast_to(ctx.device.type, recipe.autocast):
            out = model(xtr[local])
        loss = F_nn.cross_entropy(out.float(), ytr[local])
        if scaler is not None:
            scales.append(scaler.get_scale())
        backward_step(loss, optimizer, scaler)
        losses.append(loss.detach())
    memory = _memory(model, optimizer, recipe)
    with torch.no_grad():
        test_accuracy = accuracy(model(xte).float(), yte)
    flat = _full_parameters(model)
    losses = _global_mean(losses, ctx)
    per_rank = _gather({"memory": memory, "scales": scales if scaler is not None else None}, ctx)
    tail = max(1, len(losses) // 10)
    record = {
        "label": recipe.label,
        "wrapper": recipe.distribution.wrapper,
        "comm": recipe.distribution.comm,
        "losses": losses,
        "test_accuracy": test_accuracy,
        "final_loss": float(np.mean(losses[-tail:])),
        "parameters": int(flat.numel()),
        "memory": [r["memory"] for r in per_rank],
        "scales": [r["scales"] for r in per_rank] if scaler is not None else None,
        "seconds": time.perf_counter() - t0,
    }
    return record, flat


def _recipes(config: Config, ctx: _Ranks, data, batches) -> dict:
    out, flats = {}, {}
    for i, name in enumerate(config.recipes, 1):
        out[name], flats[name] = _train(RECIPES[name], config, ctx, data, batches)
        r = out[name]
        ctx.say(
            f"[{i}/{len(config.recipes)}] {name} ({r['label']}): {config.steps} steps in {r['seconds']:.1f} s, "
            f"final loss {r['final_loss']:.3f}, test accuracy {r['test_accuracy']:.3f}"
        )
    reference = flats["ddp_fp32"] if "ddp_fp32" in flats else flats[config.recipes[0]]
    ref = reference.double()
    for name, flat in flats.items():
        out[name]["param_diff"] = float((flat.double() - ref).norm() / ref.norm())
        out[name]["identical_to_reference"] = bool(torch.equal(flat, reference))
    return out


# ========================================================================================== 2. reduction error
def _local_gradient(config: Config, ctx: _Ranks, data, batches) -> torch.Tensor:
    """This rank's FP32 gradient (flattened) of the seeded network on its part of the first global batch."""
    xtr, ytr = data[:2]
    model = _model(config, ctx.device)
    local = batches[0][ctx.shard]
    F_nn.cross_entropy(model(xtr[local]), ytr[local]).backward()
    return torch.cat([p.grad.reshape(-1) for p in model.parameters()]).float()


def _reduction_measured(config: Config, ctx: _Ranks, data, batches) -> dict:
    """The real all-reduce of the ranks' gradients in FP32, BF16 and FP16 (pre-divided by N, as DDP's hooks do)
    against :func:`ring_allreduce`, and DDP's gradients under the two compression hooks."""
    g = _local_gradient(config, ctx, data, batches)
    m, n = g.numel(), ctx.world
    g = F_nn.pad(g, (0, (-m) % (2 * n)))  # a multiple of 2N elements: gloo's chunk boundaries are ⌈M/N⌉·k
    gathered = [torch.empty_like(g) for _ in range(n)]
    dist.all_gather(gathered, g)
    values = torch.stack(gathered).cpu().double().numpy()
    exact = values[:, :m].sum(0) / n
    out: dict = {"n": n, "elements": m}
    for fmt, dtype in COMM_FORMATS.items():
        t = g.to(dtype, copy=True).div_(n)
        dist.all_reduce(t)
        got = t.cpu().double().numpy()
        out[fmt] = {
            "rel_error": relative_error(got[:m], exact),
            "matches_ring": bool(np.array_equal(got, ring_allreduce(values, fmt, predivide=n), equal_nan=True)),
            "differs_from_tree": float(np.mean(got != tree_allreduce(values, fmt, predivide=n))),
        }
    hooks = {}
    xtr, ytr = data[:2]
    local = batches[0][ctx.shard]
    for hook, fmt in (("bf16", "BF16"), ("fp16", "FP16")):
        if n != 2:  # DDP's buckets move the chunk boundaries: exact only for N = 2
            hooks[hook] = None
            continue
        ddp = _wrap(_model(config, ctx.device), RECIPES[f"ddp_{hook}_hook"], ctx)
        F_nn.cross_entropy(ddp(xtr[local]), ytr[local]).backward()
        got = torch.cat([p.grad.reshape(-1) for p in ddp.module.parameters()]).cpu().double().numpy()
        hooks[hook] = bool(np.array_equal(got, ring_allreduce(values[:, :m], fmt, predivide=n)))
    return {"measured": out, "hooks": hooks}


def _sweep_sizes(sweep_max: int) -> list:
    ns = [2**k for k in range(1, sweep_max.bit_length()) if 2**k <= sweep_max]
    return ns + ([sweep_max] if ns[-1] != sweep_max else [])


def _sweep_gradients(config: Config, data, n_ranks: int) -> np.ndarray:
    """[n_ranks, E] float64: the gradients of ``n_ranks`` simulated ranks (the seeded network at its start, each
    on its own micro-batch of ``sweep_batch`` training samples), at E evenly spread parameter positions."""
    xtr, ytr = (t.cpu() for t in data[:2])
    model = _model(config, torch.device("cpu"))
    params = {k: v.detach() for k, v in model.named_parameters()}
    total = sum(v.numel() for v in params.values())
    pick = torch.from_numpy(
        np.unique(np.linspace(0, total - 1, min(config.sweep_elements, total)).round().astype(np.int64))
    )
    idx = torch.randint(
        0, len(xtr), (n_ranks, config.sweep_batch), generator=torch.Generator().manual_seed(config.seed + 1)
    )

    def loss(p, x, y):
        return F_nn.cross_entropy(functional_call(model, p, (x,)), y)

    per_rank = vmap(grad(loss), in_dims=(None, 0, 0))
    rows = []
    for lo in range(0, n_ranks, 64):
        g = per_rank(params, xtr[idx[lo : lo + 64]], ytr[idx[lo : lo + 64]])
        rows.append(torch.cat([g[k].reshape(g[k].shape[0], -1) for k in params], 1)[:, pick].double())
    return torch.cat(rows).numpy()


#: The simulated reductions: (algorithm, format, division, loss-scaled).  Unscaled gradients are what DDP's
#: hooks see in FP32 training; the scaled ones are FP16 gradients under a loss scale.
_SWEEP_UNITS = (
    [("ring", f, "predivide", False) for f in COMM_FORMATS]
    + [("tree", f, "predivide", False) for f in COMM_FORMATS]
    + [("ring", "FP16", d, True) for d in ("sum_then_divide", "predivide", "fsdp_split")]
)


def _sweep_unit(values: np.ndarray, ns: list, algorithm: str, fmt: str, division: str, scale: float) -> dict:
    fn = ring_allreduce if algorithm == "ring" else tree_allreduce
    out: dict = {"rel_error": [], "overflow_share": [], "underflow_share": []}
    for n in ns:
        v = values[:n] * scale  # exact: the scale is a power of two
        exact = v.sum(0) / n
        pre, post = {
            "sum_then_divide": (1.0, float(n)),
            "predivide": (float(n), 1.0),
            "fsdp_split": fsdp_divide_factors(n),
        }[division]
        got = fn(v, fmt, predivide=pre, postdivide=post)
        out["rel_error"].append(relative_error(got, exact))
        out["overflow_share"].append(float(np.mean(~np.isfinite(got))))
        out["underflow_share"].append(float(np.mean((got == 0) & (exact != 0))))
    return out


def _reduction_sweep(config: Config, ctx: _Ranks, data) -> dict:
    """The reduction error for N = 2 … sweep_max simulated ranks; the ranks share the work."""
    ns = _sweep_sizes(config.sweep_max)
    values = _sweep_gradients(config, data, ns[-1])
    scale = max_gradient_scale(float(np.abs(values).max()), "FP16")
    mine = {
        i: _sweep_unit(values, ns, a, f, d, scale if scaled else 1.0)
        for i, (a, f, d, scaled) in enumerate(_SWEEP_UNITS)
        if i % ctx.world == ctx.rank
    }
    done = {i: r for part in _gather(mine, ctx) for i, r in part.items()}
    sweep: dict = {"n": ns, "elements": int(values.shape[1]), "ring": {}, "tree": {}, "underflow": {}}
    fp16: dict = {"scale": scale, "n": ns}
    for i, (algorithm, fmt, division, scaled) in enumerate(_SWEEP_UNITS):
        if scaled:
            fp16[division] = done[i]
        else:
            sweep[algorithm][fmt] = done[i]["rel_error"]
            sweep["underflow"].setdefault(algorithm, {})[fmt] = done[i]["underflow_share"]
    over = [n for n, s in zip(ns, fp16["sum_then_divide"]["overflow_share"]) if s > 0]
    fp16["first_overflow_n"] = over[0] if over else None
    return {"sweep": sweep, "fp16": fp16}


# ====================================================================================== 3. overflow agreement
class _UnsynchronisedGradScaler(GradScaler):
    """:class:`mpt_lab.scaling.GradScaler` with the ranks' found-inf flags deliberately *not* reduced: each rank
    trusts its own shard.  It exists only to measure what the all-reduce prevents; never train with it."""

    def _agree_found_inf(self, found, process_groups):
        return found


def _flag_agreement(config: Config, ctx: _Ranks, data, batches) -> dict:
    """FSDP2 (FP16/FP32) with torch's scaler, ours and ours unsynchronised, on the same batches, while rank
    ``inject_rank``'s gradient shard of the first layer gets an inf at ``inject_steps``."""
    xtr, ytr = data[:2]
    recipe = RECIPES["fsdp_fp16_fp32"]
    kw = dict(init_scale=config.init_scale, growth_interval=config.growth_interval)
    scalers = {
        "torch": torch.amp.GradScaler(ctx.device.type, **kw),
        "mpt_lab": GradScaler(**kw),
        "unsynchronised": _UnsynchronisedGradScaler(**kw),
    }
    models = {k: _wrap(_model(config, ctx.device), recipe, ctx) for k in scalers}
    opts = {k: torch.optim.Adam(m.parameters(), lr=config.lr) for k, m in models.items()}
    scales = {k: [] for k in scalers}
    skipped = {k: [] for k in scalers}
    losses = {k: [] for k in scalers}
    identical = True
    drift = torch.zeros(config.flag_steps, 2, dtype=torch.float64)
    for step in range(config.flag_steps):
        local = batches[step % len(batches)][ctx.shard]
        for k, model in models.items():
            opts[k].zero_grad(set_to_none=True)
            loss = F_nn.cross_entropy(model(xtr[local]).float(), ytr[local])
            scalers[k].scale(loss).backward()
            if step in config.inject_steps and ctx.rank == config.inject_rank:
                with torch.no_grad():  # an overflow in this rank's rows of the first layer
                    first = next(layer for layer in model if isinstance(layer, torch.nn.Linear))
                    shard = _local(first.weight.grad)
                    shard[(0,) * shard.dim()] = math.inf
            before = float(scalers[k].get_scale())
            scalers[k].step(opts[k])
            scalers[k].update()
            scales[k].append(before)
            if float(scalers[k].get_scale()) < before:  # backed off: found_inf, the step was skipped
                skipped[k].append(step)
            losses[k].append(loss.detach())
        with torch.no_grad():
            shards = {k: [_local(p).double() for p in m.parameters()] for k, m in models.items()}
            identical = identical and all(torch.equal(a, b) for a, b in zip(shards["torch"], shards["mpt_lab"]))
            drift[step, 0] = sum(
                float((u - s).pow(2).sum()) for u, s in zip(shards["unsynchronised"], shards["mpt_lab"])
            )
            drift[step, 1] = sum(float(s.pow(2).sum()) for s in shards["mpt_lab"])
    drift = drift.to(ctx.device)
    dist.all_reduce(drift)
    agree = torch.tensor([1.0 if identical else 0.0], device=ctx.device)
    dist.all_reduce(agree, op=dist.ReduceOp.MIN)
    losses = {k: _global_mean(v, ctx) for k, v in losses.items()}
    per_rank = _gather({"scales": scales, "skipped": skipped}, ctx)
    variants = {
        k: {
            "scales": [r["scales"][k] for r in per_rank],
            "skipped": [r["skipped"][k] for r in per_rank],
            "losses": losses[k],
        }
        for k in scalers
    }
    same_scales = variants["mpt_lab"]["scales"] == variants["torch"]["scales"]  # on every rank, every step
    drift = drift.cpu()
    return {
        "steps": config.flag_steps,
        "inject_steps": list(config.inject_steps),
        "inject_rank": config.inject_rank,
        "variants": variants,
        "identical_to_torch": bool(agree.item() == 1.0 and same_scales),
        "drift": (drift[:, 0] / drift[:, 1]).sqrt().tolist(),
    }


# ====================================================================================================== measure
def measure(config: Config, run: Run) -> dict | None:
    """One rank's share of the three parts; rank 0 returns the result's fields, the other ranks None."""
    ctx = _setup(config, run)
    data = digits_data(config.seed, ctx.device)
    order = shuffled_batches(len(data[0]), config.batch_size, seed=config.seed)
    batches = [next(order).to(ctx.device) for _ in range(max(config.steps, config.flag_steps))]
    recipes = _recipes(config, ctx, data, batches) if config.recipes else {}
    reduction = _reduction_measured(config, ctx, data, batches)
    ctx.say(
        "all-reduce of the ranks' gradients, N = {}: relative error {}".format(
            ctx.world, ", ".join(f"{f} {reduction['measured'][f]['rel_error']:.2g}" for f in COMM_FORMATS)
        )
    )
    if config.sweep_max:
        t0 = time.perf_counter()
        reduction.update(_reduction_sweep(config, ctx, data))
        ctx.say(f"reduction error simulated for N = 2 … {config.sweep_max} in {time.perf_counter() - t0:.1f} s")
    t0 = time.perf_counter()
    flag = _flag_agreement(config, ctx, data, batches) if config.flag_steps else {}
    if flag:
        ctx.say(
            f"overflow agreement: {config.flag_steps} steps in {time.perf_counter() - t0:.1f} s, ours identical "
            f"to torch's: {flag['identical_to_torch']}"
        )
    versions = {"nccl": ".".join(map(str, torch.cuda.nccl.version()))} if ctx.backend == "nccl" else {}
    dist.destroy_process_group()
    if ctx.rank != 0:
        return None
    return {
        "world_size": ctx.world,
        "nnodes": ctx.nnodes,
        "backend": ctx.backend,
        "comm_versions": versions,
        "ranks_device": ctx.device.type,
        "recipes": recipes,
        "reduction": reduction,
        "flag_agreement": flag,
    }


EXPERIMENT = Experiment(NAME, Config, PROFILES, measure, DistributedResult, __doc__, launcher=_launcher, smoke=SMOKE)
run, config_for, main = EXPERIMENT.run, EXPERIMENT.config_for, EXPERIMENT.main

if __name__ == "__main__":
    from torch.distributed.elastic.multiprocessing.errors import record

    record(run_main)(EXPERIMENT)  # a rank's exception reaches torchrun's error summary with its traceback
