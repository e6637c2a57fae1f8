"""The paper's Figure 1: a bigLSTM-shaped language model trained in FP32 and in FP16 mixed precision without and
with loss scaling.

Micikevicius et al. (ICLR 2018), §4.4 and Figure 1: bigLSTM (Jozefowicz et al. 2016) trained on the One Billion
Word benchmark with Adagrad; mixed precision *without* loss scaling diverges after a while, with a loss scale
of 128 it matches FP32.  Here the same model, data order and seed (:mod:`mpt_lab.models.lstm`, word-level, on
the King James Bible of :mod:`mpt_lab.data.text`) are trained in each arm of
:data:`~mpt_lab.experiments._precision.ARMS` (FP32; mixed FP16 without scaling; with the static scale
``static_scale``; with the dynamic :class:`~mpt_lab.scaling.GradScaler`): real FP16 autocast on CUDA, the
:mod:`mpt_lab.simulate` emulation on a CPU.  The run records, over training: the training loss of every step
(nats per token), the validation perplexity, the loss scale, and from histograms of the activation gradients
(:class:`~mpt_lab.histogram.GradientHistogram`) the share of values that are zero in the run's own arithmetic
and the share that FP16 would flush to zero (values below 2⁻²⁴ after scaling).

``grad_shift = k`` (see :mod:`mpt_lab.experiments._precision`) multiplies the loss by 2⁻ᵏ and Adagrad's eps
and initial accumulator by 2⁻ᵏ and 4⁻ᵏ: the FP32 run is bit-identical for every k, while the FP16 runs see
gradients k binades smaller.  Why shift at all: most activation-gradient values of a language model are the
softmax gradients of the mean cross-entropy, (p − y)/N for N tokens per batch, and a word's probability p is
of the order of 1/V for a vocabulary of V words, so these values scale like 1/(V·N).  bigLSTM had V = 793,471
and N = 128 × 20 tokens per batch (:data:`BIGLSTM`); our small runs have far fewer of both, so their gradients
sit log₂(V_big·N_big / (V·N)) binades higher.  ``grad_shift = -1`` ("auto", the default) uses that number,
rounded (:func:`equivalent_shift`); :func:`shift_sweep` shows what happens at every shift, so the chapter can
show where the run without loss scaling starts to fall behind.

    python -m mpt_lab.experiments.biglstm --profile full --out book/results/biglstm_full.json
"""

from __future__ import annotations

import math
import time
import warnings
from dataclasses import asdict, dataclass, field, replace

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from ..data.text import batchify, bptt_batches, kjv_corpus
from ..device import provenance
from ..histogram import GradientHistogram
from ..models.lstm import build_lstm_lm
from ._common import JsonResult, main as _main, prepare
from ._precision import ARMS, PrecisionArm, check_arms, collect_arms, gradient_shares, shift_eps

__all__ = ["Config", "BigLSTMResult", "config_for", "run", "shift_sweep", "sweep_for", "equivalent_shift",
           "perplexity", "PAPER", "BIGLSTM", "NAME"]

NAME = "biglstm"

#: What the paper reports (Micikevicius et al. 2018, §4.4, Figure 1), cited, not computed.
PAPER = {
    "model": "bigLSTM (Jozefowicz et al. 2016): 2 LSTM layers of 8192 cells projected to 1024, 793k-word vocabulary, "
             "sampled softmax, Adagrad; One Billion Word benchmark",
    "loss_scale": 128,
    "finding": "FP16 mixed precision without loss scaling diverges after a while; with loss scale 128 the training "
               "loss matches the FP32 baseline",
}


#: bigLSTM's vocabulary and tokens per batch (Jozefowicz et al. 2016, §4–5: One Billion Word vocabulary of
#: 793,471 words; batches of 128 sequences unrolled over 20 time steps).
BIGLSTM = {"vocab_size": 793471, "tokens_per_batch": 128 * 20}


def equivalent_shift(vocab_size: int, tokens_per_batch: int) -> int:
    """round(log₂(793471 · 2560 / (vocab_size · tokens_per_batch))), at least 0: how many binades bigLSTM's
    softmax gradients (p − y)/N, p ~ 1/V, sit below those of a model with this vocabulary and batch.

    Raises ValueError for non-positive sizes.
    """
    if vocab_size < 1 or tokens_per_batch < 1:
        raise ValueError(f"vocab_size and tokens_per_batch must be ≥ 1, got {vocab_size}, {tokens_per_batch}")
    big = BIGLSTM["vocab_size"] * BIGLSTM["tokens_per_batch"]
    return max(0, round(math.log2(big / (vocab_size * tokens_per_batch))))


@dataclass
class Config:
    """Size and settings of one run (see :func:`config_for` for the profiles)."""

    profile: str = "cpu"
    model: str = "tiny"                # mpt_lab.models.lstm.CONFIGS
    max_vocab: int = 0                 # 0: every word of the training split
    batch_size: int = 20
    bptt: int = 20                     # time steps per window (truncated backpropagation through time)
    steps: int = 1200                  # optimizer steps (windows); the stream restarts when it runs out
    lr: float = 0.2                    # Adagrad, as bigLSTM (Jozefowicz et al. 2016: learning rate 0.2)
    adagrad_init: float = 0.1          # Adagrad's initial accumulator (TensorFlow's default, × 4^-grad_shift)
    static_scale: float = 128.0        # the paper's S for bigLSTM
    init_scale: float = 2.0 ** 16      # GradScaler (torch's defaults)
    growth_interval: int = 2000
    grad_shift: int = -1               # loss × 2^-grad_shift (FP32 unchanged); -1: equivalent_shift (auto)
    arms: tuple = ARMS
    eval_every: int = 200              # validation perplexity and histogram shares every N steps
    hist_every: int = 1                # record gradient histograms on every N-th step
    valid_tokens: int = 20000          # validation tokens evaluated (0: all)
    seed: int = 0
    device: str = "auto"
    threads: int = 0


def config_for(profile: str) -> Config:
    """quick: CI (≈ 20 s on one CPU core); cpu: ≈ 3 minutes; full: one H100, ≤ 8 minutes.

    Raises ValueError for other names.
    """
    if profile == "quick":
        return Config(profile="quick", max_vocab=4000, batch_size=16, bptt=16, steps=120,
                      arms=("fp32", "fp16", "fp16_static"), eval_every=30, hist_every=4, valid_tokens=4000, threads=1)
    if profile == "cpu":
        return Config(profile="cpu", max_vocab=4000, batch_size=16, bptt=16, steps=500, growth_interval=50,
                      eval_every=100, hist_every=4, valid_tokens=10000, threads=1)
    if profile == "full":
        return Config(profile="full", model="medium", max_vocab=0, batch_size=64, bptt=35, steps=4000,
                      growth_interval=500, eval_every=500, hist_every=5, valid_tokens=0)
    raise ValueError(f"profile must be one of 'quick', 'cpu', 'full', got {profile!r}")


@dataclass
class BigLSTMResult(JsonResult):
    """Per arm (keys of :data:`ARMS` that ran): ``losses`` [steps] training loss in nats per token; ``scales``
    [steps] the loss scale used at each step; ``skipped`` steps the scaler skipped; ``evals`` list of dicts per
    evaluation: step, valid_ppl, zero_share (share of activation-gradient values that are exactly zero in the
    run's own arithmetic, since the previous evaluation), fp16_underflow (share that FP16 flushes to zero, of
    the values as the run computed them: for FP32 what FP16 *would* lose), nonfinite."""

    NAME = NAME
    config: dict
    provenance: dict
    vocab_size: int
    train_tokens: int
    arms: dict = field(default_factory=dict)
    labels: dict = field(default_factory=dict)
    real_fp16: bool = False
    train_seconds: dict = field(default_factory=dict)

    def final(self, arm: str, what: str = "loss", last: int = 50) -> float:
        """Mean training loss of the last ``last`` steps (``what="loss"``) or the last validation perplexity
        (``what="ppl"``) of ``arm``; NaN when the run diverged to non-finite values."""
        if arm not in self.arms:
            raise ValueError(f"arm must be one of {tuple(self.arms)}, got {arm!r}")
        if what == "ppl":
            return float(self.arms[arm]["evals"][-1]["valid_ppl"])
        if what != "loss":
            raise ValueError(f"what must be 'loss' or 'ppl', got {what!r}")
        tail = [float(v) for v in self.arms[arm]["losses"][-last:]]
        return sum(tail) / len(tail) if tail else float("nan")

    def table(self):
        """HTML table: per arm, final training loss, validation perplexity, zero share and FP16 underflow."""
        from ..widgets import table_html

        rows = []
        for arm, d in self.arms.items():
            e = d["evals"][-1]
            rows.append([self.labels.get(arm, arm), f"{self.final(arm):.3f}", f"{self.final(arm, 'ppl'):.1f}",
                         f"{100 * e['zero_share']:.1f}%", f"{100 * e['fp16_underflow']:.2f}%", str(len(d["skipped"]))])
        return table_html(["run", "training loss (last 50 steps, nats)", "validation perplexity",
                           "activation gradients = 0", "below FP16's 2⁻²⁴", "skipped steps"], rows)

    def describe(self) -> str:
        parts = [f"{a}: loss {self.final(a):.3f}, ppl {self.final(a, 'ppl'):.1f}" for a in self.arms]
        return (f"biglstm ({self.config['profile']} profile, grad_shift {self.config['grad_shift']}, "
                f"{'real' if self.real_fp16 else 'simulated'} FP16, {self.provenance['device']}): " + "; ".join(parts))

    @classmethod
    def _from_fields(cls, d: dict) -> "BigLSTMResult":
        return cls(config=d["config"], provenance=d["provenance"], vocab_size=int(d["vocab_size"]),
                   train_tokens=int(d["train_tokens"]), arms=d["arms"], labels=d.get("labels", {}),
                   real_fp16=bool(d.get("real_fp16", False)), train_seconds=d.get("train_seconds", {}))



@torch.no_grad()
def perplexity(model, streams: torch.Tensor, bptt: int, device) -> float:
    """exp(mean cross-entropy) of ``model`` (in FP32) over :func:`batchify`'d ``streams``; inf if non-finite."""
    model.eval()
    total, count, state = 0.0, 0, None
    for x, y in bptt_batches(streams, bptt):
        x, y = x.to(device), y.to(device)
        logits, state = model(x, state)
        total += float(F.cross_entropy(logits.reshape(-1, model.vocab_size).float(), y.reshape(-1), reduction="sum"))
        count += y.numel()
    model.train()
    mean = total / max(count, 1)
    return math.exp(mean) if math.isfinite(mean) and mean < 700 else float("inf")


def _train_arm(arm_name: str, config: Config, corpus, init_state: dict, device, progress: bool) -> dict:
    torch.manual_seed(config.seed + 1)   # dropout (none by default) and anything random: the same in every arm
    model = build_lstm_lm(config.model, corpus.vocab_size).to(device)
    model.load_state_dict(init_state)
    # the initial accumulator holds squared gradients: × 4^-k keeps the run invariant to the shift
    opt = torch.optim.Adagrad(model.parameters(), lr=config.lr,
                              initial_accumulator_value=config.adagrad_init * 4.0 ** -config.grad_shift)
    shift_eps(opt, config.grad_shift)
    arm = PrecisionArm(arm_name, device, static_scale=config.static_scale, init_scale=config.init_scale,
                       growth_interval=config.growth_interval, grad_shift=config.grad_shift)
    streams = batchify(corpus.train, config.batch_size)
    valid = corpus.valid[:config.valid_tokens] if config.valid_tokens else corpus.valid
    valid = batchify(valid, min(config.batch_size, 10))
    windows, state = bptt_batches(streams, config.bptt), None
    losses, scales, skipped, evals = [], [], [], []
    gh = GradientHistogram(model, "activation")
    t0 = time.perf_counter()
    with gh, warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="LSTM with projections is not supported with oneDNN")
        for step in tqdm(range(1, config.steps + 1), desc=arm.label(), disable=not progress, mininterval=1.0):
            try:
                x, y = next(windows)
            except StopIteration:
                windows, state = bptt_batches(streams, config.bptt), None
                x, y = next(windows)
            x, y = x.to(device), y.to(device)
            if state is not None:
                state = tuple(s.detach() for s in state)
            box = {}

            def forward():
                logits, box["state"] = model(x, state)
                return F.cross_entropy(arm.to_float32(logits).reshape(-1, model.vocab_size), y.reshape(-1))

            (gh.resume if (step - 1) % config.hist_every == 0 else gh.pause)()
            scales.append(arm.get_scale())
            loss, skip = arm.step(forward, opt)
            state = box["state"]
            losses.append(loss)
            if skip:
                skipped.append(step)
            if step % config.eval_every == 0 or step == config.steps:
                evals.append({"step": step, "valid_ppl": perplexity(model, valid, config.bptt, device),
                              **gradient_shares(gh.histogram)})
                gh.reset()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return {"losses": losses, "scales": scales, "skipped": skipped, "evals": evals, "label": arm.label(),
            "real_fp16": arm.real_fp16, "seconds": time.perf_counter() - t0}


def run(config: Config | None = None, *, command: str | None = None, progress: bool = True) -> BigLSTMResult:
    """Train the language model once per arm of ``config.arms`` from the same initial weights and data order.

    Returns
    -------
    BigLSTMResult

    Raises
    ------
    TypeError
        ``config`` is not a :class:`Config`.
    ValueError
        An unknown arm in ``config.arms``.
    """
    config, device = prepare(config, Config, config_for)
    check_arms(config.arms)
    corpus = kjv_corpus(max_vocab=config.max_vocab or None)
    if config.grad_shift == -1:
        config = replace(config, grad_shift=equivalent_shift(corpus.vocab_size, config.batch_size * config.bptt))
    elif not isinstance(config.grad_shift, int) or config.grad_shift < 0:
        raise ValueError(f"config.grad_shift must be -1 (auto) or an int ≥ 0, got {config.grad_shift!r}")
    torch.manual_seed(config.seed)
    init_state = {k: v.clone() for k, v in build_lstm_lm(config.model, corpus.vocab_size).state_dict().items()}
    out = {a: _train_arm(a, config, corpus, init_state, device, progress) for a in config.arms}
    cfg = asdict(config)
    cfg["arms"] = list(config.arms)
    prov = provenance(command=command or f"python -m mpt_lab.experiments.{NAME} --profile {config.profile}",
                      config=cfg, device=device)
    return BigLSTMResult(config=cfg, provenance=prov, vocab_size=corpus.vocab_size, train_tokens=len(corpus.train),
                         **collect_arms(out))


def shift_sweep(config: Config, shifts=(0, 4, 8, 10, 12), *, reuse: "BigLSTMResult | None" = None,
                progress: bool = True) -> dict:
    """Final training loss of FP32 and of mixed FP16 without loss scaling, for several gradient shifts.

    FP32 runs once (it is bit-identical for every shift, see :mod:`mpt_lab.experiments._precision`); the FP16
    run without scaling repeats per shift.  Returns ``{"fp32": loss, "fp16": {shift: loss}, "underflow":
    {shift: share of activation-gradient values below 2⁻²⁴ in the last evaluation interval}}``.
    """
    if reuse is not None:
        same = {k: v for k, v in asdict(config).items() if k not in ("arms", "grad_shift", "profile")}
        if any(reuse.config.get(k) != (list(v) if isinstance(v, tuple) else v) for k, v in same.items()) \
                or "fp32" not in reuse.arms:
            raise ValueError("reuse must be a result of the same configuration with an FP32 run")
        base = reuse
    else:
        base = run(replace(config, arms=("fp32",), grad_shift=0), progress=progress)
    out = {"fp32": base.final("fp32"), "fp16": {}, "zero_share": {}, "steps": config.steps,
           "equivalent_shift": equivalent_shift(base.vocab_size, config.batch_size * config.bptt)}
    if reuse is not None and "fp16" in reuse.arms:
        k = int(reuse.config["grad_shift"])
        out["fp16"][k] = reuse.final("fp16")
        out["zero_share"][k] = reuse.arms["fp16"]["evals"][-1]["zero_share"]
    for k in shifts:
        if int(k) in out["fp16"]:
            continue
        r = run(replace(config, arms=("fp16",), grad_shift=int(k)), progress=progress)
        out["fp16"][int(k)] = r.final("fp16")
        out["zero_share"][int(k)] = r.arms["fp16"]["evals"][-1]["zero_share"]
    out["fp16"] = dict(sorted(out["fp16"].items()))
    out["zero_share"] = dict(sorted(out["zero_share"].items()))
    return out


def sweep_for(profile: str) -> dict:
    """Keyword arguments of :func:`shift_sweep` for a profile (the runs are as long as the profile's)."""
    if profile == "quick":
        return {"shifts": (0, 6)}
    if profile == "cpu":
        return {"shifts": (0, 4, 7)}
    if profile == "full":
        return {"shifts": (0, 2, 4, 6, 8, 10)}
    raise ValueError(f"profile must be one of 'quick', 'cpu', 'full', got {profile!r}")


def main(argv=None) -> int:
    return _main(__doc__.splitlines()[0], run, config_for, argv)


if __name__ == "__main__":
    raise SystemExit(main())
