"""mpt_lab.figures: every figure has a title, labelled axes (with units) and a legend where it shows several
series; the multi-run histogram draws every run; tables come from one builder; show_saved shows a saved result
or the command that makes it."""

import html

import numpy as np
import pytest
import torch
from matplotlib.container import BarContainer
from matplotlib.figure import Figure

from mpt_lab import figures
from mpt_lab import formats as F
from mpt_lab.experiments import loss_scaling
from mpt_lab.harness import runner
from mpt_lab.histogram import log2_histogram


def _check_axes(fig: Figure, legend=True):
    axes = [ax for ax in fig.axes if ax.get_visible()]
    assert axes
    for ax in axes:
        assert ax.get_title(), "every axes has a title"
        assert ax.get_xlabel(), "x axis labelled"
        if legend:
            assert (ax.get_legend() is not None and ax.get_legend().get_texts()) or fig.legends
    return axes


def _histogram(seed=0, center=-30.0, zeros=5000, n=20_000):
    rng = np.random.default_rng(seed)
    g = rng.standard_normal(n) * np.exp2(rng.normal(center, 6, n))
    g[:zeros] = 0
    return log2_histogram(torch.from_numpy(g.astype(np.float32)))


def test_format_ranges():
    fig = figures.plot_format_ranges()
    top, bottom = _check_axes(fig)
    assert len(top.get_yticklabels()) == 9
    # the zoomed panel shows a tick per positive value of each ≤ 8-bit format: E4M3 has 126 positive values
    n_ticks = sum(len(c.get_segments()) for c in bottom.collections if hasattr(c, "get_segments"))
    positives = sum(int((F.values(f) > 0).sum()) for f in (F.FP4_E2M1, F.FP6_E2M3, F.FP6_E3M2, F.FP8_E4M3, F.FP8_E5M2))
    assert n_ticks == positives
    assert fig._repr_png_()[:8] == b"\x89PNG\r\n\x1a\n"


def test_ulp_fixed_and_accumulation():
    _check_axes(figures.plot_ulp(["FP16", "BF16"]))
    with pytest.raises(ValueError):
        figures.plot_ulp(["FP16"], lo_log2=3, hi_log2=1)
    with pytest.raises(ValueError):
        figures.plot_ulp(["FP17"])
    fig = figures.plot_fixed_vs_float()
    _check_axes(fig)
    envelope = [line for line in fig.axes[0].get_lines() if line.get_label().startswith("FP16: largest error")]
    x, y = envelope[0].get_xdata(), envelope[0].get_ydata()
    assert len(envelope) == 1 and np.max(y[x >= 2.0**-14]) == 2.0**-11  # normal range: the tops reach 2^-11
    traj = {"a": 1 + 1e-4 * np.arange(11), "b": np.ones((11, 4))}
    _check_axes(figures.plot_accumulation(traj, exact=1 + 1e-4 * np.arange(11)))
    with pytest.raises(TypeError):
        figures.plot_accumulation([1, 2])


def test_gradient_histogram_figure():
    h = _histogram()
    fig = figures.plot_gradient_histogram(h, "FP16", scale=2.0**15, extra_formats=["BF16", "FP8_E5M2"])
    top, ax = fig.axes
    assert top.get_title() and ax.get_xlabel() and ax.get_ylabel() and fig.legends
    assert [t.get_text() for t in top.get_yticklabels()] == ["FP16 (16 bits)", "BF16 (16 bits)", "FP8_E5M2 (8 bits)"]
    heights = [p.get_height() for p in ax.patches if hasattr(p, "get_height")]
    assert any(abs(hh - 25.0) < 1e-9 for hh in heights)  # the zero bar shows the share of zeros
    labels = [t.get_text() for t in ax.get_xticklabels()]
    assert labels[0] == "zeros" and "0" in labels  # the zero bin is not labelled like 2^0
    with pytest.raises(TypeError):
        figures.plot_gradient_histogram([h])
    with pytest.raises(ValueError):
        figures.plot_gradient_histogram(h, scale=3.0)


def test_every_run_of_a_multi_run_histogram_is_drawn():
    runs = {"small": _histogram(0, -20), "medium": _histogram(1, -24), "large": _histogram(2, -28)}
    fig = figures.plot_gradient_histogram(runs, "FP16")
    ax = fig.axes[1]
    bars = [c for c in ax.containers if isinstance(c, BarContainer)]
    assert len(bars) == 2 * len(runs)  # non-zero bars and a zero bar per run
    for c in bars:
        assert all(p.get_alpha() is None or p.get_alpha() > 0 for p in c.patches)  # none of them invisible
    texts = [t.get_text() for t in fig.legends[0].get_texts()]
    assert all(any(t.startswith(name) for t in texts) for name in runs)


def test_kept_vs_scale():
    fig = figures.plot_kept_vs_scale(_histogram(), "FP16", log2_scales=range(0, 30))
    ax, lx = fig.axes
    assert ax.get_title() and ax.get_legend() is not None and lx.get_xlabel() and lx.get_yscale() == "log"
    kept = ax.get_lines()[0].get_ydata()
    assert kept[8] > kept[0]  # S = 2^8 keeps more than S = 1
    assert all(float(t).is_integer() for t in lx.get_xticks())  # whole exponents of S
    with pytest.raises(TypeError):
        figures.plot_kept_vs_scale({"a": 1})


def test_running_mean_leaves_gaps_for_nonfinite_values():
    x, m = figures.running_mean([1.0, 2.0, 3.0, float("inf"), 5.0, 6.0, 7.0], 2)
    assert x.tolist() == [2, 3, 4, 5, 6, 7]
    assert m[0] == 1.5 and m[1] == 2.5 and np.isnan(m[2]) and np.isnan(m[3]) and m[4] == 5.5
    with pytest.raises(ValueError):
        figures.running_mean([], 3)


def test_losses_and_scale_history_from_results():
    cfg = loss_scaling.Config(profile="quick", steps=30, growth_interval=5, hidden=16, threads=1)
    r = loss_scaling.run(cfg, progress=False)
    (ax,) = _check_axes(figures.plot_scale_history(r))
    assert all(float(t).is_integer() for t in ax.get_yticks())  # log2 S: whole exponents only
    assert len(ax.get_legend().get_texts()) >= 2
    (ax,) = _check_axes(figures.plot_losses(r.losses, smooth=5))
    assert len(ax.get_lines()) == 2
    with pytest.raises(TypeError):
        figures.plot_losses([1, 2])


def test_one_table_builder():
    t = figures.table_html(["a", "<b>"], [[1, "x"], [2, "y"]], caption="c & d")
    assert t.count("<tr>") == 3 and "&lt;b&gt;" in t and "c &amp; d" in t and "overflow-x:auto" in t
    # wide tables get a smaller font in the book, so that they fit the text column (issue 26, item 17)
    from pathlib import Path

    from mpt_lab.figures._base import WIDE_TABLE_COLUMNS

    assert 'class="mpt-table"' in t and "mpt-table-wide" not in t
    wide = figures.table_html([f"c{i}" for i in range(WIDE_TABLE_COLUMNS)], [list(range(WIDE_TABLE_COLUMNS))])
    assert 'class="mpt-table mpt-table-wide"' in wide
    css = (Path(__file__).resolve().parents[1] / "book" / "_static" / "book.css").read_text(encoding="utf-8")
    assert "table.mpt-table.mpt-table-wide" in css and "table.mpt-table {" in css
    assert t._repr_html_() == str(t)
    assert t.count("text-align:left") == 3 and t.count("text-align:right") == 3  # names left, numbers right
    t = figures.table_html(["a", "b"], [[1, "x"]], align=("left", "left"))
    assert "text-align:right" not in t and t.count("text-align:left") == 4
    for bad in (("left",), ("left", "centre")):
        with pytest.raises(ValueError, match="align"):
            figures.table_html(["a", "b"], [[1, "x"]], align=bad)
    from mpt_lab import widgets

    assert widgets.table_html is figures.table_html and widgets.HTML is figures.HTML


def test_show_saved_shows_a_result_or_the_command(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(runner, "results_dir", lambda: tmp_path)
    shown = []
    monkeypatch.setattr(figures, "_display", lambda obj: shown.append(obj))
    assert figures.show_saved("loss_scaling") == {}
    text = " ".join(map(str, shown))
    assert "No GPU result" in text and html.escape("--profile full --out book/results/loss_scaling_full.json") in text
    assert "long" not in text  # loss_scaling has no long profile
    cfg = loss_scaling.Config(profile="full", steps=3, hidden=8, threads=1)
    r = loss_scaling.run(cfg, progress=False)
    r.save(tmp_path / "loss_scaling_full.json")
    shown.clear()
    found = figures.show_saved("loss_scaling", show=figures.plot_scale_history)
    assert list(found) == ["full"] and found["full"] == r
    assert "Saved GPU result" in str(shown[0]) and isinstance(shown[1], Figure)
    with pytest.raises(ValueError):
        figures.show_saved("nonsense")


def test_histogram_table_cites_each_source_and_scales_over_every_gradient():
    """Issue 26, items 1 and 6: the blog post's and the paper's captions in their own columns; the largest S
    without overflow over activation *and* weight gradients (a weight gradient larger than every activation
    gradient lowers it)."""
    from mpt_lab.experiments.ssd_histogram import PAPER, SSDHistogramResult
    from mpt_lab.scaling import max_gradient_scale

    act = _histogram(seed=1, center=-26.0)  # largest |g| far below 16
    wgt = log2_histogram(torch.tensor([20.0, 1e-3, 0.0]))  # one weight gradient in [16, 32)
    r = SSDHistogramResult(
        config={"profile": "quick", "steps": 1},
        provenance={"device": "CPU"},
        steps=[1],
        losses=[1.0],
        map50=[[1, 0.5]],
        activation=act,
        weight=wgt,
    )
    every = act + wgt
    assert every.max_scale("FP16") < act.max_scale("FP16")  # the weight gradient sets the limit
    t = figures.histogram_table({"this run": r})
    assert "NVIDIA blog post, Fig. 2" in t and "the paper, Fig. 3" in t
    assert ">66.8%<" in t and ">67%<" in t and ">4%<" in t and ">2%<" in t
    assert PAPER["paper_zeros"] == 0.67 and PAPER["paper_share_2^-34_to_2^-32"] == 0.02
    rows = {row.split("</td>")[0].split(">")[-1]: row for row in t.split("<tr>")[2:]}
    s_row = next(v for k, v in rows.items() if k.startswith("largest power-of-two S"))
    k = int(np.log2(every.max_scale("FP16")))
    assert f"2<sup>{k}</sup>" in s_row and "activation and weight" in s_row
    kept_row = next(v for k_, v in rows.items() if k_.startswith("kept by S = 2¹⁵"))
    assert "overflows here" in kept_row  # 20 × 2^15 > 65504: said in the cell
    rule_row = next(v for k_, v in rows.items() if k_.startswith("max-gradient rule"))
    assert f"2<sup>{int(np.log2(max_gradient_scale(every.amax, 'FP16')))}</sup>" in rule_row
    # the guide's own numbers sit in its column: 31% of the values lost in FP16, S = 8 sufficient
    lost_row = next(v for k_, v in rows.items() if k_.startswith("lost in FP16"))
    assert ">31% (guide; its base not stated)<" in lost_row and PAPER["guide_lost"] == 0.31
    assert "S = 8 was sufficient (guide)" in next(v for k_, v in rows.items() if k_.startswith("lost with S = 8"))


def test_losses_reference_panel_and_master_weight_loop():
    """plot_losses(reference=...) adds a difference panel; the master-weight loop diagram colours each box by the
    dtype a real train_step recorded (issue 26, items 16 and 18)."""
    from matplotlib.colors import to_hex
    from matplotlib.patches import FancyBboxPatch

    from mpt_lab.figures._base import FORMAT_COLORS
    from mpt_lab.master_weights import MasterWeightTrainer
    from mpt_lab.scaling import GradScaler

    losses = {"FP32": np.linspace(2, 1, 50), "pure FP16": np.linspace(2, 1.5, 50), "masters": np.linspace(2, 1, 50)}
    top, diff = figures.plot_losses(losses, smooth=5, reference="FP32").axes
    assert top.get_title() and top.get_ylabel() and top.get_legend() is not None and len(top.get_lines()) == 3
    assert diff.get_title() and diff.get_xlabel() == "step" and "nats" in diff.get_ylabel()  # the shared x axis
    gaps = [line.get_ydata() for line in diff.get_lines() if len(line.get_ydata()) > 2]
    assert len(gaps) == 2 and np.allclose(gaps[1], 0) and gaps[0][-1] > 0.4  # masters on 0, pure FP16 above
    with pytest.raises(ValueError, match="reference"):
        figures.plot_losses(losses, reference="FP64")

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    for naive in (False, True):
        t = MasterWeightTrainer(
            model if not naive else torch.nn.Sequential(torch.nn.Linear(8, 4)),
            lambda p: torch.optim.SGD(p, lr=0.1),
            torch.nn.functional.cross_entropy,
            scaler=GradScaler(2.0**8),
            trace=True,
            cast_scaled_loss=naive,
        )
        t.train_step(torch.randn(4, 8), torch.randint(0, 4, (4,)))
        fig = figures.plot_master_weight_loop(t.last_trace)
        (ax,) = _check_axes(fig)
        boxes = [p for p in ax.patches if isinstance(p, FancyBboxPatch)]
        assert len(boxes) == 9
        red = sum(to_hex(b.get_edgecolor()) == FORMAT_COLORS["FP16"] for b in boxes)
        assert red == (4 if naive else 3)  # copy, prediction, gradients × S (+ the naive cast)
        texts = " ".join(x.get_text() for x in ax.texts)
        assert ("naive" in texts) == naive and "float16" in texts and "float32" in texts
    with pytest.raises(TypeError, match="last_trace"):
        figures.plot_master_weight_loop(None)
    with pytest.raises(ValueError, match="steps"):
        figures.plot_master_weight_loop([r for r in t.last_trace if r["step"] != 7])


def test_training_legend_sits_below_the_axes():
    """Fig. 2.2: the legend is the figure's, below the axes, so it covers neither the loss nor the mAP curve."""
    import types

    r = types.SimpleNamespace(
        steps=list(range(1, 101)),
        losses=list(np.linspace(8, 2, 100)),
        map50=[[0, 0.0], [50, 0.4], [100, 0.6]],
        map_evaluator="pycocotools (x)",
        profile="quick",
    )
    fig = figures.plot_training(r)
    assert len(fig.legends) == 1 and all(ax.get_legend() is None for ax in fig.axes)
    assert len(fig.legends[0].get_texts()) == 3
