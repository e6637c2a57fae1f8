"""Figures and tables of loss scaling: the dynamic scale over a run, and FP32 against FP16 mixed precision
without and with loss scaling (the paper's Figure 1 and Table 2).

Micikevicius et al. (ICLR 2018), §3.2 (loss scaling, dynamic scaling), §4.2 (Table 2), §4.4 (Figure 1).
"""

from __future__ import annotations

import numpy as np
from matplotlib.figure import Figure

from ._base import new_figure, pct, running_mean, table_html

__all__ = ["plot_scale_history", "plot_divergence", "plot_shift_sweep", "divergence_table"]

_STYLES = ["-", "--", ":", "-."]


def plot_scale_history(result, *, title: str | None = None) -> Figure:
    """Loss scale S against step (log2 axis), with overflow steps marked.

    Parameters
    ----------
    result : :class:`mpt_lab.experiments.loss_scaling.LossScalingResult` (both scalers are drawn: ours solid,
        torch's dashed on top; identical trajectories overlap exactly), or a dict label → list of
        (step, scale, found_inf) as in ``GradScaler.history``.

    Returns
    -------
    Figure; x = step, y = log2 S.
    """
    histories = result if isinstance(result, dict) else {
        "mpt_lab.scaling.GradScaler": result.history["mpt_lab"], "torch.amp.GradScaler": result.history["torch"]}
    if not histories:
        raise TypeError("result must be a LossScalingResult or a non-empty dict of label → history")
    fig = new_figure((9, 4))
    ax = fig.add_subplot()
    for i, (label, h) in enumerate(histories.items()):
        if not h:
            continue
        steps = np.array([s for s, _, _ in h])
        scales = np.log2(np.array([v for _, v, _ in h], dtype=float))
        ax.step(steps, scales, where="post", lw=2.2 if i == 0 else 1.2, ls="-" if i == 0 else "--",
                label=f"S, {label}")
        inf = np.array([bool(f) for _, _, f in h])
        if inf.any() and i == 0:
            ax.plot(steps[inf], scales[inf], "v", color="#d62728", ms=7, label="overflow: step skipped, S halved")
    ax.set_xlabel("step")
    ax.set_ylabel("log₂ S   (loss scale)")
    ax.set_title(title or "Dynamic loss scaling: grow after N clean steps, back off on overflow")
    ax.legend(fontsize="small", loc="lower right")
    ax.grid(alpha=0.3)
    return fig


def plot_divergence(result, *, smooth: int = 20, title: str | None = None, ylabel: str | None = None) -> Figure:
    """Training loss per arm beside the share of activation-gradient values that are zero, over training.

    The paper's Figure 1 (left) and its explanation (right): a run whose gradients underflow in FP16 loses them
    (they become zeros) and its loss falls behind.

    Parameters
    ----------
    result : a :class:`~mpt_lab.experiments.biglstm.BigLSTMResult` or
        :class:`~mpt_lab.experiments.ssd_table2.SSDTable2Result` (per arm: "losses" and "evals" with "step" and
        "zero_share")
    smooth : window of the running mean of the losses (steps; non-finite losses leave gaps)
    ylabel : the loss axis label (default: nats per token for the language model, SSD eq. 1 for the detector)

    Returns
    -------
    Figure with two axes: x = step; left y = loss, right y = zero share in percent.
    """
    arms = getattr(result, "arms", None)
    if not isinstance(arms, dict) or not arms:
        raise TypeError("result must be a BigLSTMResult or SSDTable2Result with at least one arm")
    if ylabel is None:
        ylabel = "training loss (SSD eq. 1)" if "map50" in next(iter(arms.values())) else \
            "training loss (nats per token)"
    fig = new_figure((12, 4.6))
    ax, bx = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
    for i, (arm, d) in enumerate(arms.items()):
        label = result.labels.get(arm, arm)
        x, mean = running_mean(d["losses"], smooth)
        ax.plot(x, mean, ls=_STYLES[i % 4], lw=2.2 if i == 0 else 1.6, label=label)
        if d["evals"]:
            bx.plot([e["step"] for e in d["evals"]], [100 * e["zero_share"] for e in d["evals"]], "o" + _STYLES[i % 4],
                    lw=2.2 if i == 0 else 1.6, label=label)
    ax.set_xlabel("step")
    ax.set_ylabel(f"{ylabel}\n(running mean of {smooth} steps)")
    ax.set_title("Training loss")
    ax.grid(alpha=0.3)
    bx.set_xlabel("step")
    bx.set_ylabel("activation-gradient values = 0 (%)")
    bx.set_ylim(-2, 102)
    bx.set_title("Gradients lost to underflow show up as zeros")
    bx.grid(alpha=0.3)
    fig.legend(*ax.get_legend_handles_labels(), loc="outside lower center", ncol=min(4, len(arms)),
               fontsize="small")
    shift = getattr(result, "grad_shift", result.config.get("grad_shift"))
    fp16 = "real" if result.real_fp16 else "simulated"
    fig.suptitle(title or f"FP32 against FP16 mixed precision ({fp16} FP16, gradient shift k = {shift}, "
                          f"{result.profile} profile)")
    return fig


def plot_shift_sweep(result, *, title: str | None = None) -> Figure:
    """Final training loss of FP16 without loss scaling against the gradient shift k, beside FP32's.

    Parameters
    ----------
    result : a :class:`~mpt_lab.experiments.biglstm.BigLSTMResult` whose ``sweep`` holds "fp32", "fp16"
        {k: loss}, "zero_share" {k: share} and "equivalent_shift"

    Returns
    -------
    Figure; x = k (gradients multiplied by 2⁻ᵏ), left y = loss (nats per token), right y = zero share (%).
    """
    sweep = getattr(result, "sweep", None)
    if not isinstance(sweep, dict) or "fp16" not in sweep or "fp32" not in sweep:
        raise TypeError("result must be a BigLSTMResult that ran a shift sweep (config sweep_shifts)")
    ks = sorted(int(k) for k in sweep["fp16"])
    loss = [float(sweep["fp16"][str(k)]) for k in ks]
    zeros = [100 * float(sweep["zero_share"][str(k)]) for k in ks]
    fig = new_figure((9, 4.4))
    ax = fig.add_subplot()
    ax.plot(ks, loss, "o-", color="#d62728", lw=2, label="mixed FP16, no loss scaling: final loss")
    ax.axhline(float(sweep["fp32"]), color="#1f77b4", lw=2, label="FP32 (identical for every k)")
    if sweep.get("equivalent_shift") is not None:
        ax.axvline(sweep["equivalent_shift"], color="0.4", ls=":", label="bigLSTM-equivalent shift")
    ax.set_xlabel("gradient shift k (every gradient × 2⁻ᵏ)")
    ax.set_ylabel("final training loss (nats per token)")
    ax.grid(alpha=0.3)
    bx = ax.twinx()
    bx.plot(ks, zeros, "s--", color="0.5", label="FP16 run: activation-gradient values = 0 (%)")
    bx.set_ylabel("activation-gradient values = 0 (%)")
    bx.set_ylim(0, 100)
    h1, l1 = ax.get_legend_handles_labels()
    h2, l2 = bx.get_legend_handles_labels()
    fig.legend(h1 + h2, l1 + l2, loc="outside lower center", ncol=2, fontsize="small")
    ax.set_title(title or f"Where FP16 without loss scaling starts to fall behind ({sweep.get('steps', '?')} steps)")
    return fig


def divergence_table(result, paper: dict | None = None):
    """Per arm: the final training loss, the quality measure (validation perplexity for the language model,
    mAP@0.5 for the detector, beside ``paper``'s row when given), the share of activation-gradient values
    that are zero and that FP16 loses, and the skipped steps (an HTML table)."""
    rows = []
    detector = hasattr(result, "final_map")
    for arm, d in result.arms.items():
        e = d["evals"][-1] if d["evals"] else {}
        if detector:
            quality = f"{100 * result.final_map(arm):.1f}" + (" (diverged)" if result.diverged(arm) else "")
            loss = result.final_loss(arm)
        else:
            quality, loss = f"{result.final(arm, 'ppl'):.1f}", result.final(arm)
        row = [result.labels.get(arm, arm), f"{loss:.3f}", quality]
        if paper is not None:
            row.append(str(paper.get(arm, "—")))
        rows.append(row + [pct(e.get("zero_share"), 3), pct(e.get("fp16_underflow"), 3), str(len(d["skipped"]))])
    header = ["run", "final training loss (last 50 steps)",
              "mAP@0.5, ours (%)" if detector else "validation perplexity"]
    if paper is not None:
        header.append("paper (%)")
    return table_html(header + ["activation gradients = 0", "lost in FP16 (|x| ≤ 2⁻²⁵)", "skipped steps"], rows)
