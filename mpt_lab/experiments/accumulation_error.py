"""Accumulation error: dot products against K, a tensor core's narrow FP8 accumulator, and FP16 reductions.

Everything here is computed exactly by :mod:`mpt_lab.accumulation` (every product and addition rounded as
stated), against exact float64/``math.fsum`` references; nothing is timed.

* **Error against K** (the paper's §3.3, arithmetic precision): dot products of ``trials`` pairs of random
  FP16 vectors with entries uniform in [0, 1) (every product adds, so the sum grows like K and the relative
  error is well defined), accumulated in FP16, BF16 and FP32, sequentially
  (:func:`~mpt_lab.accumulation.partial_sums` gives every K of one run) and pairwise; the relative error of
  each dot product, its median and largest value over the trials.  The running sum in FP16 shows where the
  accumulator's ulp swallows the addends.
* **Zero-mean products**: the same with entries uniform in [-1, 1), so that the products have both signs and
  mean zero and the sum grows only like √K.  Its exact value can be near zero, so the error is measured
  against the sum's typical size, the root sum of squares of the products: |ŝ − s| / √(Σ (a_k b_k)²).
* **Tensor cores**: FP8 E4M3 matrices (uniform [0, 1) values rounded to E4M3) multiplied with the
  accumulator DeepSeek-V3 reports for Hopper's FP8 tensor cores (arXiv:2412.19437, §3.3.2 and §3.5.2:
  ~14 bits, groups of 32 aligned products truncated, promotion to FP32 every N_C = 128 elements), modelled by
  :func:`~mpt_lab.accumulation.tensor_core_dot`, beside a sequential 14-bit accumulator rounding toward zero
  and an FP32 accumulator; the median and the largest relative error of the output elements, |ĉ − c|/|c| (the
  paper reports "a maximum relative error of nearly 2%" for K = 4096, without saying how its random matrices
  were drawn; with positive entries every product adds and the relative error is well defined).
* **Reductions** in an FP16 accumulator against FP32: the mean loss over ``tokens`` per-token losses, a
  log-sum-exp over ``vocab`` logits (a softmax's denominator), and a LayerNorm variance over ``width``
  features (two passes: the mean, then the mean square deviation); and which dtype ``torch.autocast``'s CUDA
  float16 policy gives the matching ops (probed by :func:`mpt_lab.autocast.probe_autocast`, on fake tensors
  where there is no GPU).

    python -m mpt_lab.experiments.accumulation_error --profile cpu
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from .. import accumulation as acc
from ..autocast import probe_autocast
from ..formats import FP8_E4M3, FP16, get_format, round_to
from ..harness.runner import Experiment, ExperimentConfig, ExperimentResult, Run, run_main

__all__ = [
    "NAME",
    "Config",
    "PROFILES",
    "AccumulationErrorResult",
    "run",
    "config_for",
    "main",
    "EXPERIMENT",
    "REDUCTION_OPS",
]

NAME = "accumulation_error"
#: The reductions and the ops (names of :data:`mpt_lab.autocast.OPS`) that perform each: the library's op
#: (cross_entropy averages the per-token losses, log_softmax and layer_norm hold the other two), then the same
#: reduction written by hand (``losses.mean()``, ``torch.logsumexp``, ``x.var()``).
REDUCTION_OPS = {
    "mean loss": ("cross_entropy", "mean"),
    "log-sum-exp": ("log_softmax", "logsumexp"),
    "LayerNorm variance": ("layer_norm", "var"),
    "plain sum": ("sum",),
}


@dataclass
class Config(ExperimentConfig):
    """The sizes of the accumulation-error experiment: dot-product lengths and trials, the tensor-core model's K
    and outputs, and the three FP16 reductions (each field's comment says what it is; :data:`PROFILES` holds each
    profile's values)."""

    k_max: int = 16384  # longest dot product (a power of two)
    trials: int = 64  # dot products per K
    formats: tuple = ("FP16", "BF16", "FP32")
    tc_ks: tuple = (128, 512, 1024, 4096, 16384)  # K of the tensor-core model
    tc_outputs: int = 64  # output elements per K (an 8 × 8 block of a GEMM)
    tokens: int = 65536  # per-token losses averaged
    vocab: int = 32768  # logits in the log-sum-exp
    width: int = 4096  # features of the LayerNorm
    rows: int = 16  # independent draws of each reduction

    def validate(self) -> None:
        super().validate()
        self.check_positive("k_max", "trials", "tc_outputs", "tokens", "vocab", "width", "rows")
        if self.k_max & (self.k_max - 1) or self.k_max < 16:
            raise ValueError(f"config.k_max must be a power of two ≥ 16, got {self.k_max!r}")
        self.check_choices("formats", ("FP16", "BF16", "FP32", "TF32"), subset=True)
        if not self.tc_ks or any(not isinstance(k, int) or k < 32 or k % 32 for k in self.tc_ks):
            raise ValueError(f"config.tc_ks must be multiples of 32, got {self.tc_ks!r}")


#: quick ≈ 9 s, cpu ≈ 20 s of one core's time (measured on the project's shared 2-core machines); nothing here
#: uses a GPU, so "full" is the cpu configuration (measured: 3.0 s on an H100 machine's host CPU, 10 s with the
#: process start).
PROFILES = {
    "quick": {"k_max": 16384, "trials": 16, "tc_ks": (128, 512, 1024, 4096), "tc_outputs": 64, "rows": 4, "threads": 1},
    "cpu": {
        "k_max": 16384,
        "trials": 64,
        "tc_ks": (128, 512, 1024, 2048, 4096, 8192),
        "tc_outputs": 256,
        "rows": 8,
        "threads": 1,
    },
    "full": {
        "k_max": 16384,
        "trials": 64,
        "tc_ks": (128, 512, 1024, 2048, 4096, 8192),
        "tc_outputs": 256,
        "rows": 8,
        "threads": 1,
    },
}


@dataclass
class AccumulationErrorResult(ExperimentResult):
    """``ks``: the K of the curves (powers of two); ``error``: "FORMAT order" (e.g. "FP16 sequential") →
    {"median", "max"} lists over ``ks`` (relative error);
    ``zero_mean``: the same for zero-mean products (entries uniform in [-1, 1)), "FORMAT order" → {"median",
    "max"} lists over ``ks`` of |ŝ − s| / √(Σ (a_k b_k)²);
    ``unit_roundoff``: format → u; ``running``: the FP16 and exact running sums of one positive dot product at
    every K (``running_ks``); ``tensor_core``: {"ks", "models": name → {"max_relative", "median_relative"}
    lists over ks}; ``reductions``: name → {"exact", "FP32", "FP16 sequential",
    "FP16 pairwise": values (first row), "first_errors": arm → the relative error of those values, "errors":
    arm → largest relative error over the rows, "rows": how many draws, "size"}, and for the log-sum-exp
    "exact, FP16 exponentials": {"value": its exact value from the FP16-rounded exponentials that every arm sums
    (first row), "errors": arm → largest relative error against it (the accumulator's own), "exponentials_error":
    the largest relative error that rounding the exponentials alone causes}, for the LayerNorm variance
    "passes": {"mean": mean of the inputs, "FP16 sequential mean": the first pass's mean in that accumulator
    (averaged over the rows), "signed_errors": "FP16 sequential mean, exact second pass" / "exact mean, FP16
    sequential second pass" / "FP16 sequential, both passes" → signed relative error per row}; ``autocast``: reduction → {op
    name: the dtype CUDA float16 autocast returns for it from float16 inputs}."""

    ks: list
    error: dict
    zero_mean: dict
    unit_roundoff: dict
    running_ks: list
    running: dict
    tensor_core: dict
    reductions: dict
    autocast: dict

    def slope(
        self, arm: str, k_min: int = 16, k_hi: int | None = None, stat: str = "median", *, inputs: str = "one-signed"
    ) -> float:
        """Least-squares slope of log2(error) against log2(K) over ks in [k_min, k_hi], for the one-signed
        products (``error``) or, with ``inputs="zero-mean"``, the zero-mean ones (``zero_mean``)."""
        if inputs not in ("one-signed", "zero-mean"):
            raise ValueError(f"inputs must be 'one-signed' or 'zero-mean', got {inputs!r}")
        ks = np.asarray(self.ks, dtype=float)
        e = np.asarray((self.error if inputs == "one-signed" else self.zero_mean)[arm][stat], dtype=float)
        keep = (ks >= k_min) & (ks <= (k_hi or ks.max())) & (e > 0)
        return float(np.polyfit(np.log2(ks[keep]), np.log2(e[keep]), 1)[0])

    def stall_k(self, threshold: float = 0.5) -> int:
        """The first K at which the FP16 running sum has lost ``threshold`` of the sum (-1: never)."""
        fp16, exact = np.asarray(self.running["FP16"]), np.asarray(self.running["exact"])
        lost = 1 - fp16 / exact
        hit = np.flatnonzero(lost >= threshold)
        return int(self.running_ks[hit[0]]) if hit.size else -1

    def describe(self) -> str:
        e = self.error
        k = self.ks[-1]
        parts = [f"{arm} {e[arm]['median'][-1]:.1e}" for arm in e]
        tc = self.tensor_core
        i = tc["ks"].index(4096) if 4096 in tc["ks"] else -1
        m = tc["models"]
        return (
            f"accumulation error ({self.profile} profile): K = {k}, median relative error: "
            + ", ".join(parts)
            + f"; tensor-core model at K = {tc['ks'][i]}: largest relative error "
            f"{100 * m['DeepSeek-V3 model (14 bits, groups of 32)']['max_relative'][i]:.2f}%, with promotion "
            f"every 128: {100 * m['… + FP32 promotion every 128']['max_relative'][i]:.3f}%"
        )


def _fp16_values(rng, shape) -> np.ndarray:
    return round_to(rng.uniform(0.0, 1.0, shape).astype(np.float32), FP16)


def _errors(got, exact) -> dict:
    e = np.abs(np.asarray(got, dtype=np.float64) - exact) / np.abs(exact)
    return {"median": float(np.median(e)), "max": float(np.max(e))}


def _error_vs_k(config: Config, run: Run, rng) -> tuple:
    ks = [2**j for j in range(0, int(math.log2(config.k_max)) + 1)]
    running_ks = sorted({int(k) for k in np.geomspace(1, config.k_max, 200).round()})
    a = _fp16_values(rng, (config.trials, config.k_max))
    b = _fp16_values(rng, (config.trials, config.k_max))
    exact = np.cumsum(a.astype(np.float64) * b, axis=1)  # float64: its error (≤ K·2⁻⁵³) ≪ the accumulators'
    arms, running = {}, {}
    for fmt in run.bar(config.formats, desc="error against K"):
        seq = acc.partial_sums(a, b, accumulator=fmt)
        arms[f"{fmt} sequential"] = [_errors(seq[:, k - 1], exact[:, k - 1]) for k in ks]
        arms[f"{fmt} pairwise"] = [
            _errors(acc.dot(a[:, :k], b[:, :k], accumulator=fmt, order="pairwise"), exact[:, k - 1]) for k in ks
        ]
        if fmt == "FP16":
            running = {
                "FP16": [float(seq[0, k - 1]) for k in running_ks],
                "exact": [float(exact[0, k - 1]) for k in running_ks],
            }
    error = {arm: {s: [r[s] for r in rows] for s in ("median", "max")} for arm, rows in arms.items()}
    return ks, error, running_ks, running


def _zero_mean_vs_k(config: Config, run: Run, rng, ks: list) -> dict:
    """Dot products of zero-mean FP16 values (uniform in [-1, 1)): |ŝ − s| / √(Σ p²) per K, median and max."""
    a = round_to(rng.uniform(-1.0, 1.0, (config.trials, config.k_max)).astype(np.float32), FP16)
    b = round_to(rng.uniform(-1.0, 1.0, (config.trials, config.k_max)).astype(np.float32), FP16)
    p = a.astype(np.float64) * b
    exact, size = np.cumsum(p, axis=1), np.sqrt(np.cumsum(p * p, axis=1))

    def errors(got, k):
        e = np.abs(np.asarray(got, dtype=np.float64) - exact[:, k - 1]) / size[:, k - 1]
        return {"median": float(np.median(e)), "max": float(np.max(e))}

    arms = {}
    for fmt in run.bar(config.formats, desc="zero-mean products"):
        seq = acc.partial_sums(a, b, accumulator=fmt)
        arms[f"{fmt} sequential"] = [errors(seq[:, k - 1], k) for k in ks]
        arms[f"{fmt} pairwise"] = [
            errors(acc.dot(a[:, :k], b[:, :k], accumulator=fmt, order="pairwise"), k) for k in ks
        ]
    return {arm: {s: [r[s] for r in rows] for s in ("median", "max")} for arm, rows in arms.items()}


def _tensor_core(config: Config, run: Run, rng) -> dict:
    names = (
        "FP32 accumulator",
        "14 bits per product, toward zero",
        "DeepSeek-V3 model (14 bits, groups of 32)",
        "… + FP32 promotion every 128",
    )
    models = {n: {"max_relative": [], "median_relative": []} for n in names}
    for K in run.bar(config.tc_ks, desc="tensor-core model"):
        a = round_to(rng.uniform(0.0, 1.0, (config.tc_outputs, K)).astype(np.float32), FP8_E4M3)
        b = round_to(rng.uniform(0.0, 1.0, (config.tc_outputs, K)).astype(np.float32), FP8_E4M3)
        p = a.astype(np.float64) * b
        exact = np.array([math.fsum(r) for r in p])
        outs = {
            names[0]: acc.dot(a, b, accumulator="FP32", products="FP32"),
            names[1]: acc.dot(a, b, accumulator=acc.TENSOR_CORE_ACCUMULATOR, products="FP32", rounding="toward_zero"),
            names[2]: acc.tensor_core_dot(a, b),
            names[3]: acc.tensor_core_dot(a, b, promote_every=128),
        }
        for n, got in outs.items():
            d = np.abs(np.asarray(got, dtype=np.float64) - exact)
            rel = d / np.abs(exact)
            models[n]["max_relative"].append(float(rel.max()))
            models[n]["median_relative"].append(float(np.median(rel)))
    return {
        "ks": list(config.tc_ks),
        "models": models,
        "format": FP8_E4M3.name,
        "accumulator": {"precision_bits": acc.TENSOR_CORE_ACCUMULATOR.precision, "group": 32, "promote_every": 128},
    }


def _reduce(x: np.ndarray, how: str) -> np.ndarray:
    """Σ over the last axis of FP16 values x: "FP32", "FP16 sequential" or "FP16 pairwise"."""
    ones = np.ones_like(x)
    if how == "FP32":
        return acc.dot(x, ones, accumulator="FP32").astype(np.float64)
    order = "pairwise" if how.endswith("pairwise") else "sequential"
    return acc.dot(x, ones, accumulator="FP16", order=order).astype(np.float64)


def _reductions(config: Config, run: Run, rng) -> dict:
    """Each reduction with its sums in an FP16 accumulator (sequential and pairwise) and in FP32; elementwise
    steps (exp, the subtraction of the mean, the square) are FP16 operations rounded once, as an FP16 kernel
    would compute them; the final division and log are exact (float64).  The reference ("exact") is computed in
    float64 from the FP16 inputs (losses, logits, features); for the log-sum-exp from the unrounded
    exponentials, so that every arm's error there includes the FP16 rounding of the exponentials (the
    "exact, FP16 exponentials" entry separates the two)."""
    arms = ("FP32", "FP16 sequential", "FP16 pairwise")
    out = {}
    # mean loss: per-token cross-entropies of a language model in mid-training (|N(2.5, 1)| nats), in FP16
    losses = round_to(np.abs(rng.normal(2.5, 1.0, (config.rows, config.tokens))).astype(np.float32), FP16)
    exact = losses.astype(np.float64).sum(1) / config.tokens
    vals = {h: _reduce(losses, h) / config.tokens for h in arms}
    out["mean loss"] = (exact, vals)
    # log-sum-exp: logits N(0, 3²); Σ exp(x − max) in the accumulator, then max + log(Σ)
    logits = round_to(rng.normal(0.0, 3.0, (config.rows, config.vocab)).astype(np.float32), FP16)
    m = logits.max(1, keepdims=True)
    ex = round_to(np.exp(logits.astype(np.float64) - m), FP16).astype(np.float32)  # FP16 exp, one rounding
    exact = m[:, 0] + np.log(np.exp(logits.astype(np.float64) - m).sum(1))
    vals = {h: m[:, 0].astype(np.float64) + np.log(_reduce(ex, h)) for h in arms}
    out["log-sum-exp"] = (exact, vals)
    # the exact log-sum-exp of the FP16 exponentials: what separates the accumulators' errors from the
    # rounding of the exponentials, which every arm shares
    rounded_exp = m[:, 0] + np.log(np.array([math.fsum(r) for r in ex.astype(np.float64)]))
    extra = {
        "log-sum-exp": {
            "exact, FP16 exponentials": {
                "value": float(rounded_exp[0]),
                "errors": {h: float(np.max(np.abs(v - rounded_exp) / np.abs(rounded_exp))) for h, v in vals.items()},
                "exponentials_error": float(np.max(np.abs(rounded_exp - exact) / np.abs(exact))),
            }
        }
    }
    # LayerNorm variance: features N(3, 1) (a non-zero mean), two passes
    x = round_to(rng.normal(3.0, 1.0, (config.rows, config.width)).astype(np.float32), FP16)
    x64 = x.astype(np.float64)
    exact = ((x64 - x64.mean(1, keepdims=True)) ** 2).mean(1)
    vals = {}
    for h in arms:
        fmt = "FP32" if h == "FP32" else "FP16"
        mu = round_to(_reduce(x, h) / config.width, fmt)
        dev = round_to(round_to(x64 - mu[:, None], fmt) ** 2, fmt).astype(np.float32)
        vals[h] = _reduce(dev, h) / config.width
    out["LayerNorm variance"] = (exact, vals)
    # which pass errs in the FP16 sequential accumulator: each one alone, the other exact
    mu16 = round_to(_reduce(x, "FP16 sequential") / config.width, "FP16")
    mean_only = ((x64 - mu16[:, None]) ** 2).mean(1)
    mu = round_to(x64.mean(1), "FP16")
    dev = round_to(round_to(x64 - mu[:, None], "FP16") ** 2, "FP16").astype(np.float32)
    squares_only = _reduce(dev, "FP16 sequential") / config.width
    extra["LayerNorm variance"] = {
        "passes": {
            "mean": float(np.mean(x64)),
            "FP16 sequential mean": float(np.mean(mu16)),
            "signed_errors": {
                "FP16 sequential mean, exact second pass": (mean_only / exact - 1).tolist(),
                "exact mean, FP16 sequential second pass": (squares_only / exact - 1).tolist(),
                "FP16 sequential, both passes": (vals["FP16 sequential"] / exact - 1).tolist(),
            },
        }
    }
    result = {}
    for name, (exact, vals) in out.items():
        rel = {h: np.abs(v - exact) / np.abs(exact) for h, v in vals.items()}
        result[name] = {
            "exact": float(exact[0]),
            **{h: float(v[0]) for h, v in vals.items()},
            "first_errors": {h: float(e[0]) for h, e in rel.items()},
            "errors": {h: float(np.max(e)) for h, e in rel.items()},
            "rows": config.rows,
            "size": {"mean loss": config.tokens, "log-sum-exp": config.vocab, "LayerNorm variance": config.width}[name],
            **extra.get(name, {}),
        }
    return result


def _autocast() -> dict:
    ops = tuple(op for pair in REDUCTION_OPS.values() for op in pair)
    probe = probe_autocast("cuda", torch.float16, input_dtype=torch.float16, ops=ops)
    return {name: {op: probe.ops[op] for op in pair} for name, pair in REDUCTION_OPS.items()}


def measure(config: Config, run: Run) -> dict:
    rng = np.random.default_rng(config.seed)
    ks, error, running_ks, running = _error_vs_k(config, run, rng)
    tensor_core, reductions = _tensor_core(config, run, rng), _reductions(config, run, rng)
    zero_mean = _zero_mean_vs_k(config, run, np.random.default_rng([config.seed, 1]), ks)  # a stream of its own
    return {
        "ks": ks,
        "error": error,
        "zero_mean": zero_mean,
        "running_ks": running_ks,
        "running": running,
        "unit_roundoff": {f: acc.unit_roundoff(get_format(f)) for f in config.formats},
        "tensor_core": tensor_core,
        "reductions": reductions,
        "autocast": _autocast(),
    }


#: ``--smoke``: the full profile cut to a few trials or steps (shapes unchanged).
SMOKE = {"trials": 2, "rows": 1, "tc_outputs": 4, "threads": 1}

EXPERIMENT = Experiment(NAME, Config, PROFILES, measure, AccumulationErrorResult, __doc__, smoke=SMOKE)
run, config_for, main = EXPERIMENT.run, EXPERIMENT.config_for, EXPERIMENT.main

if __name__ == "__main__":
    run_main(EXPERIMENT)
