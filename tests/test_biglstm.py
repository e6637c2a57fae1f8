"""Chapter 8's pieces: the King James Bible corpus, the LSTM language model, simulate.to_float32, the precision
arms (FP32 invariance to the gradient shift), and the bigLSTM and SSD Table 2 experiments' mechanics on runs of a
few steps (the orderings the chapter claims for the quick profile are asserted by chapter 8 itself, executed by
tests/test_book.py)."""

import dataclasses
import json
import math

import pytest
import torch
import torch.nn.functional as F

from mpt_lab import figures
from mpt_lab.data.text import SPECIALS, batchify, bptt_batches, kjv_corpus, kjv_verses, tokenize
from mpt_lab.experiments import biglstm, ssd_table2
from mpt_lab.formats import FP16, round_to
from mpt_lab.models.lstm import LSTMLanguageModel, build_lstm_lm
from mpt_lab.recipes import LOSS_SCALING
from mpt_lab.simulate import simulate, to_float32
from mpt_lab.training import RecipeRun, shift_eps


# ------------------------------------------------------------------------------------------------- corpus
def test_kjv_is_the_whole_bible():
    verses = kjv_verses()
    assert verses[0][0] == 0 and verses[-1][0] == 1188  # 1,189 chapters, Genesis 1 … Revelation 22
    assert "In the beginning God created" in verses[0][1]
    assert any("For God so loved the world" in t for _, t in verses)
    assert "Amen" in verses[-1][1]


def test_corpus_split_and_vocabulary():
    c = kjv_corpus()
    assert c.vocab[:2] == SPECIALS and len(set(c.vocab)) == c.vocab_size
    assert 800_000 < len(c.train) < 1_000_000 and 30_000 < len(c.valid) < 60_000
    assert c.unk_rate("train") == 0.0 and 0 < c.unk_rate("valid") < 0.02  # vocabulary from training text only
    assert c.decode(c.train[:5]) == "in the beginning god created"
    small = kjv_corpus(max_vocab=100)
    assert small.vocab_size == 100 and small.vocab[2:5] == c.vocab[2:5]
    assert kjv_corpus() is c  # cached
    with pytest.raises(ValueError, match="min_count"):
        kjv_corpus(min_count=0)
    with pytest.raises(ValueError, match="max_vocab"):
        kjv_corpus(max_vocab=2)
    with pytest.raises(ValueError, match="split"):
        c.unk_rate("test")


def test_tokenize_and_batches():
    assert tokenize("3:16 For God so loved the world, that he gave") == [
        "for",
        "god",
        "so",
        "loved",
        "the",
        "world",
        ",",
        "that",
        "he",
        "gave",
    ]
    with pytest.raises(TypeError, match="text"):
        tokenize(3)
    ids = torch.arange(103)
    s = batchify(ids, 4)
    assert s.shape == (25, 4) and s[:, 1].tolist() == list(range(25, 50))
    pairs = list(bptt_batches(s, 10))
    assert [x.shape[0] for x, _ in pairs] == [10, 10, 4]
    assert all(torch.equal(y, s[i * 10 + 1 : i * 10 + 1 + len(y)]) for i, (_, y) in enumerate(pairs))
    with pytest.raises(TypeError):
        batchify(torch.zeros(10), 2)
    with pytest.raises(ValueError, match="batch_size"):
        batchify(ids, 100)
    with pytest.raises(ValueError, match="bptt"):
        list(bptt_batches(s, 0))


# -------------------------------------------------------------------------------------------------- model
def test_lstm_language_model_shapes_and_errors():
    m = build_lstm_lm("tiny", 50)
    x = torch.randint(0, 50, (7, 3))
    logits, (h, c) = m(x)
    assert logits.shape == (7, 3, 50) and h.shape == (1, 3, 64) and c.shape == (1, 3, 256)
    loss, _ = m.loss(x, x)
    assert loss.dtype == torch.float32 and abs(float(loss) - math.log(50)) < 0.5
    with pytest.raises(ValueError, match="proj_size"):
        LSTMLanguageModel(50, hidden_size=32, proj_size=32)
    with pytest.raises(TypeError, match="vocab_size"):
        LSTMLanguageModel(50.0)
    with pytest.raises(ValueError, match="dropout"):
        LSTMLanguageModel(50, dropout=1.0)
    with pytest.raises(ValueError, match="config"):
        build_lstm_lm("huge", 50)
    with pytest.raises(TypeError, match="tokens"):
        m(torch.zeros(3, 2))


# ---------------------------------------------------------------------------------------- to_float32
def _bias_grad(boundary: bool):
    torch.manual_seed(0)
    lin = torch.nn.Linear(8, 4000)
    x, y = 4 * torch.randn(256, 8), torch.randint(0, 4000, (256,))
    with simulate("FP16", mode="autocast"):
        out = lin(x)
        loss = F.cross_entropy(to_float32(out) if boundary else out, y)
        loss.backward()
    return lin.bias.grad


def test_to_float32_rounds_the_gradient_autocast_would_round():
    with_boundary, without = _bias_grad(True), _bias_grad(False)
    # the bias gradient is a float32 sum of the logit gradients; autocast rounds those to FP16 first (tiny
    # entries p/N < 2^-24 are lost).  The emulation rounds the gradient of every FP16 tensor (the logits), so
    # the explicit boundary changes nothing: both sums are of rounded values, not of the exact ones
    torch.manual_seed(0)
    lin = torch.nn.Linear(8, 4000)
    x, y = 4 * torch.randn(256, 8), torch.randint(0, 4000, (256,))
    with simulate("FP16", mode="autocast"):
        out = lin(x)  # the same FP16 logits as in the block
    g = torch.autograd.grad(F.cross_entropy(out, y), out)[0]  # their exact float32 gradient
    assert (round_to(g, FP16) == 0).float().mean() > 0.2 and (g == 0).sum() == 0
    # the FP16 sum of the rounded gradients (its result is an FP16 value too, as on a GPU), to an FP16 ulp
    expect = round_to(round_to(g, FP16).sum(0), FP16)
    assert torch.equal(with_boundary, round_to(with_boundary, FP16))
    assert torch.allclose(with_boundary, expect, rtol=2**-10, atol=2**-24)
    assert torch.equal(without, with_boundary) and not torch.allclose(without, g.sum(0), rtol=2**-10, atol=0)
    t = torch.ones(3)
    assert to_float32(t) is t  # no gradient: nothing to do
    with pytest.raises(TypeError, match="t must be"):
        to_float32(torch.ones(3, dtype=torch.int64))


# -------------------------------------------------------------------------------------------------- arms
@pytest.mark.parametrize("opt_name", ["adagrad", "adam"])
def test_fp32_is_bit_identical_under_the_gradient_shift(opt_name):
    def train(shift):
        torch.manual_seed(0)
        m = torch.nn.Sequential(torch.nn.Linear(10, 32), torch.nn.Tanh(), torch.nn.Linear(32, 5))
        if opt_name == "adagrad":
            opt = torch.optim.Adagrad(m.parameters(), lr=0.1, initial_accumulator_value=0.1 * 4.0**-shift)
        else:
            opt = torch.optim.Adam(m.parameters(), lr=1e-2)
        shift_eps(opt, shift)
        arm = RecipeRun("fp32", "cpu", grad_shift=shift)
        gen = torch.Generator().manual_seed(1)
        for _ in range(20):
            x, y = torch.randn(16, 10, generator=gen), torch.randint(0, 5, (16,), generator=gen)
            arm.step(lambda: F.cross_entropy(m(x), y), opt)
        return [p.detach().clone() for p in m.parameters()]

    a, b = train(0), train(9)
    assert all(torch.equal(p, q) for p, q in zip(a, b))


def test_arm_arguments():
    with pytest.raises(ValueError, match="recipe"):
        RecipeRun("fp8", "cpu")
    with pytest.raises(ValueError, match="static_scale"):
        RecipeRun("fp16_static", "cpu", static_scale=0)
    with pytest.raises(ValueError, match="grad_shift"):
        RecipeRun("fp16", "cpu", grad_shift=-1)
    with pytest.raises(ValueError, match="eps"):
        shift_eps(torch.optim.SGD([torch.nn.Parameter(torch.ones(1))], lr=0.1), 3)
    assert RecipeRun("fp16_static", "cpu", static_scale=8).label() == "FP16, static loss scale 8"
    assert not RecipeRun("fp16", "cpu").real_fp16 and RecipeRun("fp16", "cpu", simulate_on_cpu=False).real_fp16


def test_equivalent_shift():
    """bigLSTM's median sampled-logit gradient (simulated with TensorFlow's log-Q correction, issue 31 item 8)
    against ours, 1/(V · N)."""
    b = biglstm.BIGLSTM
    assert b["softmax_classes"] == b["sampled_classes"] + 1 == 8193 and b["loss_divisor"] == b["sequences"] == 128
    assert b["tokens_per_batch"] == b["sequences"] * b["bptt"] == 2560 and b["vocab_size"] == 793471
    m = biglstm.sampled_softmax_gradients()["median_log2"]
    assert biglstm.equivalent_shift(4000, 256) == 2 == round(-math.log2(4000 * 256) - m)  # the quick and cpu profiles
    assert biglstm.equivalent_shift(1, 1) == round(-m) == 22
    assert biglstm.equivalent_shift(793471, 2560) == 0  # a full softmax over bigLSTM's words is lower
    with pytest.raises(ValueError):
        biglstm.equivalent_shift(0, 10)


def test_log_uniform_probability_is_tensorflows_law():
    """P(k) = (log(k + 2) − log(k + 1)) / log(range_max + 1): a distribution over [0, range_max)."""
    import numpy as np

    p = biglstm.log_uniform_probability(np.arange(1000), 1000)
    assert abs(p.sum() - 1) < 1e-12 and np.all(np.diff(p) < 0)
    assert biglstm.log_uniform_probability(0, 1) == 1.0
    with pytest.raises(ValueError, match="ids"):
        biglstm.log_uniform_probability([5], 5)
    with pytest.raises(ValueError, match="range_max"):
        biglstm.log_uniform_probability([0], 0)


def test_sampled_softmax_gradients_follow_tensorflows_sampled_softmax():
    """The simulation against a direct computation: TensorFlow's draws k = ⌊exp(u log(V + 1))⌋ − 1 until K are
    distinct, Q = 1 − (1 − P)^tries, p = (1/Q)/Z for equal logits, accidental hits removed; on a small vocabulary
    the sampled softmax's normaliser Z estimates V (E[Σ 1/Q] = V for inclusion probabilities), every probability
    of a token sums to 1, and the frequent words' gradient is about 1/(V · D)."""
    import numpy as np

    from mpt_lab import formats as F

    V, K, D = 2000, 200, 8
    sim = biglstm.sampled_softmax_gradients(vocab_size=V, num_sampled=K, loss_divisor=D, steps=40, tokens=32, seed=3)
    g = sim["gradients"]
    assert g.dtype == np.float64 and (g > 0).all() and len(g) <= 40 * 32 * K
    assert len(g) > 0.9 * 40 * 32 * K  # accidental hits are few, and left out
    assert abs(sim["normaliser"] - 1) < 0.1  # Z ≈ V: the log-Q correction's estimate
    assert abs(sim["frequent_log2"] + math.log2(V * D)) < 1e-12
    assert sim["smallest_log2"] >= sim["frequent_log2"] - 0.5  # no sampled word below 1/(Z·D), Z ≈ V
    # the shares agree with the gradients they describe
    assert sim["lost"] == float((F.round_to(g, F.FP16) == 0).mean())
    assert sim["median_log2"] == math.log2(float(np.median(g)))
    # the same seed gives the same numbers; another seed nearly the same median
    again = biglstm.sampled_softmax_gradients(vocab_size=V, num_sampled=K, loss_divisor=D, steps=40, tokens=32, seed=3)
    assert np.array_equal(again["gradients"], g)
    other = biglstm.sampled_softmax_gradients(vocab_size=V, num_sampled=K, loss_divisor=D, steps=40, tokens=32, seed=4)
    assert abs(other["median_log2"] - sim["median_log2"]) < 0.2
    with pytest.raises(ValueError, match="num_sampled"):
        biglstm.sampled_softmax_gradients(vocab_size=10, num_sampled=10)
    with pytest.raises(ValueError, match="steps"):
        biglstm.sampled_softmax_gradients(steps=0)


def test_sampled_softmax_figure():
    sim = biglstm.sampled_softmax_gradients(vocab_size=2000, num_sampled=200, loss_divisor=8, steps=4, tokens=8)
    fig = figures.plot_sampled_softmax(sim, ours_log2=-12.0, ours_label="ours")
    ax = fig.axes[0]
    assert ax.get_title() and ax.get_xlabel() and ax.get_ylabel() and fig.legends
    assert "ours" in [t.get_text() for t in fig.legends[0].get_texts()]
    with pytest.raises(TypeError, match="sim"):
        figures.plot_sampled_softmax({})


def test_sampled_softmax_gradients_against_a_direct_softmax():
    """One step, one token, recomputed directly: the softmax over [−log Q_true, −log Q_j …] (hits at −inf),
    divided by D, gives the simulation's gradients."""
    import numpy as np

    V, K, D = 50, 10, 4
    sim = biglstm.sampled_softmax_gradients(vocab_size=V, num_sampled=K, loss_divisor=D, steps=1, tokens=1, seed=7)
    rng = np.random.default_rng(7)  # the simulation's own draws, repeated
    draw = lambda n: (np.floor(np.exp(rng.random(n) * math.log(V + 1))).astype(np.int64) - 1) % V  # noqa: E731
    vals = draw(2 * K)
    while len(np.unique(vals)) < K:
        vals = np.concatenate([vals, draw(K)])
    seen, sampled, tries = set(), [], 0
    for i, v in enumerate(vals):
        if v not in seen:
            seen.add(v)
            sampled.append(v)
            if len(sampled) == K:
                tries = i + 1
                break
    true = draw(1)[0]
    P = biglstm.log_uniform_probability
    q = lambda k: 1 - (1 - P(k, V)) ** tries  # noqa: E731
    logits = np.array([-math.log(q(true))] + [-math.log(q(k)) if k != true else -np.inf for k in sampled])
    p = np.exp(logits - logits.max())
    p /= p.sum()
    expected = p[1:][np.array(sampled) != true] / D
    assert np.allclose(np.sort(sim["gradients"]), np.sort(expected), rtol=1e-9, atol=0)


# ----------------------------------------------------------------------------------------- experiments
# The quick profile's results (Figure 1's ordering, the shift sweep, the zero shares) are chapter 8's claims, and
# chapter 8 asserts each of them on the quick profile's own run, which tests/test_book.py executes in the same test
# command (and on the cpu profile's run in the book build): running the same 120-step experiments here again would
# double about two and a half minutes of CPU.  These tests check the experiments' mechanics on runs of a few steps.
TINY_LSTM = {
    "model": "lean",
    "max_vocab": 500,
    "batch_size": 8,
    "bptt": 8,
    "steps": 8,
    "eval_every": 4,
    "hist_every": 2,
    "valid_tokens": 400,
}


@pytest.fixture(scope="module")
def lstm_tiny():
    torch.set_num_threads(1)
    return biglstm.run(dataclasses.replace(biglstm.config_for("quick"), **TINY_LSTM), progress=False)


def test_biglstm_run_records_every_arm_the_sweep_and_round_trips(lstm_tiny, tmp_path):
    r = lstm_tiny
    assert set(r.arms) == {"fp32", "fp16_unscaled", "fp16_static"} and not r.real_fp16
    assert r.config["grad_shift"] == r.grad_shift == 11 and r.config["steps"] == 8
    assert r.vocab_size == 500 and biglstm.equivalent_shift(4000, 16 * 16) == 2  # the quick profile's (chapter 8)
    for a, arm in r.arms.items():
        assert len(arm["losses"]) == 8 and all(math.isfinite(v) for v in arm["losses"][:1]), a
        assert [e["step"] for e in arm["evals"]] == [4, 8], a  # every eval_every steps
        e = arm["evals"][-1]
        assert 0 <= e["zero_share"] <= 1 and 0 <= e["fp16_underflow"] <= 1, (a, e)
    # FP32 has no zeros of its own; what FP16 would lose is measured on its values, as chapter 8 reads it
    assert r.arms["fp32"]["evals"][-1]["zero_share"] < 0.01
    assert not r.arms["fp16_static"]["skipped"] and set(r.arms["fp16_static"]["scales"]) == {128.0}
    # the sweep: FP32 once (identical for every k), FP16 without scaling at each k, the main run at its own k
    fp32, fp16 = r.final("fp32"), r.final("fp16_unscaled")
    sweep = r.sweep
    k = str(r.grad_shift)
    assert sweep["fp32"] == pytest.approx(fp32) and sweep["equivalent_shift"] == biglstm.equivalent_shift(500, 8 * 8)
    assert sorted(sweep["fp16_unscaled"], key=int) == ["0", "6", k] and set(sweep["zero_share"]) == {"0", "6", k}
    assert sweep["fp16_unscaled"][k] == pytest.approx(fp16)  # the main run joins the sweep at its shift
    back = biglstm.BigLSTMResult.load(r.save(tmp_path / "r.json"))
    assert back == r and "loss scale 128" in figures.divergence_table(back)
    with pytest.raises(ValueError, match="arm"):
        r.final("bf16")


def test_biglstm_config_errors():
    with pytest.raises(TypeError):
        biglstm.run(ssd_table2.Config())
    with pytest.raises(ValueError, match="recipes"):
        biglstm.run(dataclasses.replace(biglstm.config_for("quick"), recipes=("fp8",)))
    with pytest.raises(ValueError, match="grad_shift"):
        biglstm.run(dataclasses.replace(biglstm.config_for("quick"), grad_shift=-2))
    with pytest.raises(ValueError, match="sweep_shifts"):
        biglstm.run(dataclasses.replace(biglstm.config_for("quick"), sweep_shifts=(-1,)))
    with pytest.raises(ValueError, match="profile"):
        biglstm.config_for("huge")


def test_ssd_table2_run_records_every_arm_and_round_trips(tmp_path):
    """Table 2's mechanics on a run of four steps (the quick profile's ordering is chapter 8's claim, asserted there)."""
    torch.set_num_threads(1)
    tiny = {"steps": 4, "batch_size": 2, "n_train": 4, "n_test": 2, "hist_every": 1}
    r = ssd_table2.run(dataclasses.replace(ssd_table2.config_for("quick"), **tiny), progress=False)
    assert set(r.arms) == {"fp32", "fp16_unscaled", "fp16_static"} and r.config["grad_shift"] == 12
    for a in r.arms:
        assert 0 <= r.final_map(a) <= 1 and isinstance(r.diverged(a), bool), a
    assert not r.diverged("fp32") and math.isfinite(r.final_loss("fp32"))
    # the shift moves the FP32 histogram's median far below FP16's normal range (2^-14)
    assert r.arms["fp32"]["evals"][-1]["median_log2"] < -14
    back = ssd_table2.SSDTable2Result.load(r.save(tmp_path / "t.json"))
    assert back == r and "76.9" in figures.divergence_table(back, paper=ssd_table2.PAPER["Multibox SSD"])
    with pytest.raises(ValueError, match="arm"):
        r.final_map("fp16")
    # 5 steps, a histogram every 2nd step, windows of 5 // 4 = 1 step: steps 2 and 4 histogram nothing and
    # are not recorded; a result saved with such an empty window (before 2026-11-28) loads without it
    r5 = ssd_table2.run(
        dataclasses.replace(ssd_table2.config_for("quick"), **{**tiny, "steps": 5, "hist_every": 2}), progress=False
    )
    assert [e["step"] for e in r5.arms["fp32"]["evals"]] == [1, 3, 5]
    d = json.loads(r5.save(tmp_path / "t5.json").read_text())
    d["arms"]["fp32"]["evals"].append(
        {"step": 6, "zero_share": 0.0, "fp16_underflow": 0.0, "nonfinite": 0.0, "median_log2": None}
    )
    (tmp_path / "t5.json").write_text(json.dumps(d))
    assert ssd_table2.SSDTable2Result.load(tmp_path / "t5.json").arms["fp32"]["evals"] == r5.arms["fp32"]["evals"]


# ------------------------------------------------------------------- Figure 1 at natural scale (no shift)
def test_the_shift_is_a_larger_batch_measured():
    """A tiny grid of the equivalence measurement (mpt_lab.experiments.lm_gradient_scale): the activation
    gradients of the language model scale like 1/N exactly and like 1/V in their median, and the gradient shift k
    moves an FP32 histogram by exactly k binades, so a shift k at (V, N) stands for a batch 2ᵏ times larger."""
    from mpt_lab.experiments import lm_gradient_scale as lgs

    torch.set_num_threads(1)
    cfg = lgs.Config(
        profile="quick",
        vocabs=(128, 512),
        batch_sizes=(4, 16),
        bptt=8,
        steps=6,
        record_steps=2,
        shift_check=5,
        threads=1,
    )
    r = lgs.run(cfg, progress=False)
    assert r.shift_check["exact"] and r.shift_check["same_losses"]  # bit-identical FP32 run, histogram × 2⁻⁵
    for which in ("init", "trained"):
        for c in r.comparisons(which):
            if c["axis"] == "N":  # the mean over 4× the tokens: the same histogram 2 binades lower
                assert abs(c["shifted_median"] - c["measured_median"]) < 0.15, c
            else:  # 4× the words: the median moves by about 2 binades too
                assert abs(c["shifted_median"] - c["measured_median"]) < 0.75, c
        f = r.fit(which)
        assert abs(f["b"] + 1) < 0.1 and -1.2 < f["a"] < -0.5


def test_the_long_profile_runs_without_a_shift():
    cfg = biglstm.config_for("long")
    cfg.validate()
    assert cfg.grad_shift == 0 and tuple(cfg.recipes) == LOSS_SCALING and cfg.threads == 1
    assert not cfg.sweep_shifts and cfg.valid_tokens == 0  # the whole validation split
    # tokens per batch: a word's gradient p/N underflows in FP16 for p < N · 2⁻²⁵ = 2⁻⁹, with no shift
    n = cfg.batch_size * cfg.bptt
    assert n == 2**16 and math.log2(cfg.max_vocab * n) >= 27
    assert build_lstm_lm(cfg.model, cfg.max_vocab).lstm.hidden_size == 128  # the "lean" model
    cmd = biglstm.EXPERIMENT.command(cfg, "book/results/biglstm_long.json")
    assert cmd == ("python -m mpt_lab.experiments.biglstm --profile long --out book/results/biglstm_long.json")
    # the profiles chapter 8 runs live keep their shift and sizes
    assert biglstm.config_for("cpu").grad_shift == 11 and biglstm.config_for("cpu").max_vocab == 4000
    assert biglstm.config_for("cpu").sweep_shifts == (0, 6, 7, 8, 9, 10)  # with its own k = 11: every k from 6
    assert biglstm.config_for("cpu").recipes == ("fp32", "fp16_unscaled", "fp16_static")


def test_the_saved_long_result_is_figure_1_without_a_shift():
    r = biglstm.EXPERIMENT.saved("long")
    if r is None:
        pytest.skip("book/results/biglstm_long.json is not saved yet")
    assert r.provenance["command"] == (
        "python -m mpt_lab.experiments.biglstm --profile long --out book/results/biglstm_long.json"
    )
    assert r.config["grad_shift"] == 0 and r.grad_shift == 0 and set(r.arms) == set(LOSS_SCALING) and not r.real_fp16
    assert r.provenance["config"] == r.config and r.provenance["date"] and r.provenance["versions"]["torch"]
    fp32 = r.final("fp32")
    assert abs(r.final("fp16_static") - fp32) < 0.1 and abs(r.final("fp16") - fp32) < 0.1


# ------------------------------------------------------------------------------------------ the shift, drawn
def test_plot_gradient_shift_draws_the_three_stages():
    """The diagram of the gradient shift (issue 26, item 18): the measured histogram, shifted by k, then scaled by
    S; each panel says what FP16 would lose, from the package's own counts."""
    from mpt_lab.histogram import log2_histogram, lost_share

    g = torch.Generator().manual_seed(0)
    x = torch.randn(50_000, generator=g) * 2.0**-14 * torch.exp2(3 * torch.randn(50_000, generator=g))
    h = log2_histogram(x)
    fig = figures.plot_gradient_shift(h, 11, 128.0, label="test")
    axes = fig.axes
    assert len(axes) == 3 and fig._suptitle.get_text() and all(ax.get_ylabel() for ax in axes)
    assert axes[-1].get_xlabel().startswith("log₂|activation gradient|") and fig.legends
    titles = [ax.get_title(loc="left") for ax in axes]
    assert "k = 11" in titles[1] and "S = 128" in titles[2] and "(test)" in titles[0]
    assert f"{100 * lost_share(h, 11):.3g}%" in titles[1] and f"{100 * lost_share(h, 4):.3g}%" in titles[2]
    # the red bars (rounded to zero) are the bins below 2^-25 after the move, in every panel
    for ax, move in zip(axes, (0, -11, -4)):
        red = [p for p in ax.patches if p.get_facecolor()[:3] == pytest.approx((0.8392, 0.1529, 0.1569), abs=1e-3)]
        assert all(p.get_x() + p.get_width() <= -25 for p in red)
    with pytest.raises(TypeError, match="hist"):
        figures.plot_gradient_shift([1.0], 3)
    with pytest.raises(ValueError, match="k"):
        figures.plot_gradient_shift(h, -1)
    with pytest.raises(ValueError, match="scale"):
        figures.plot_gradient_shift(h, 3, 100.0)
