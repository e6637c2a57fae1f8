"""Figures and tables of mixed precision training in practice: master weights, the PyTorch AMP recipe's speed,
and autocast's op policy.

Micikevicius et al. (ICLR 2018), §3.1 (FP32 master weights); Carilli, "Automatic Mixed Precision" (PyTorch
recipe); the ``torch.amp`` autocast op reference.
"""

from __future__ import annotations

import html

from matplotlib.figure import Figure

from ._base import mib, new_figure, running_mean, table_html

__all__ = ["plot_losses", "speedup_table", "autocast_table"]

_STYLES = ["-", "--", ":", "-."]


def plot_losses(result, *, smooth: int = 50, title: str | None = None) -> Figure:
    """Running means of the loss curves of a run with several arms, against step (one line per arm).

    Parameters
    ----------
    result : a result with ``losses``: dict label → per-step losses (e.g.
        :class:`~mpt_lab.experiments.master_weights_stall.StallResult`), or such a dict itself
    smooth : window of the running mean (steps)
    """
    losses = result if isinstance(result, dict) else getattr(result, "losses", None)
    if not isinstance(losses, dict) or not losses:
        raise TypeError("result must have a non-empty dict of label → per-step losses")
    fig = new_figure((9, 4))
    ax = fig.add_subplot()
    for i, (label, v) in enumerate(losses.items()):
        x, mean = running_mean(v, smooth)
        ax.plot(x, mean, ls=_STYLES[i % 4], lw=2.2 if i == 0 else 1.6, label=label)
    ax.set_xlabel("step")
    ax.set_ylabel(f"training loss, nats (running mean of {smooth} steps)")
    ax.set_title(title or "Training loss")
    ax.legend(fontsize="small")
    ax.grid(alpha=0.3)
    return fig


def speedup_table(results):
    """Seconds per epoch and speed-up over FP32 per precision and batch size: one table per result, its caption
    naming the run (label, device, profile).

    Parameters
    ----------
    results : dict label → :class:`~mpt_lab.experiments.amp_recipe.AmpRecipeResult`, or one such result
        (labelled "saved run", as :func:`mpt_lab.figures.show_saved` passes it)

    Raises
    ------
    TypeError
        ``results`` is neither such a result nor a non-empty dict of them.
    """
    from ..experiments.amp_recipe import AmpRecipeResult

    if isinstance(results, AmpRecipeResult):
        results = {"saved run": results}
    if not isinstance(results, dict) or not results or \
            not all(isinstance(r, AmpRecipeResult) for r in results.values()):
        raise TypeError("results must be an AmpRecipeResult or a non-empty dict of label → AmpRecipeResult")
    tables = []
    for label, r in results.items():
        rows = []
        for row in r.rows:
            sp = r.speedup.get(row["precision"], {}).get(str(row["batch"]), 1.0)
            rows.append([row["precision"], row["batch"], f"{row['epoch_seconds']:.4g}", f"{sp:.2f}×",
                         f"{row['tflops'] * 1e3:.3g}", f"{100 * row['fraction_of_peak']:.0f}%",
                         mib(row["peak_bytes"], 1)])
        c = r.config
        caption = (f"{label}: {r.device}, {r.profile} profile, {c['num_layers']} × Linear({c['width']}, "
                   f"{c['width']})")
        tables.append(table_html(["precision", "batch", "s / epoch", "speed-up vs FP32", "GFLOP/s",
                                  "of matmul peak", "peak MiB"], rows, caption=caption))
    return type(tables[0])("".join(tables))


def autocast_table(probes: dict):
    """Which dtype each op returns under autocast, one column per probe (an HTML table).

    Parameters
    ----------
    probes : dict column title → :class:`mpt_lab.autocast.AutocastProbe` (the ops of the first probe are the
        rows; an op missing from a later probe shows "–")
    """
    if not isinstance(probes, dict) or not probes:
        raise TypeError("probes must be a non-empty dict of column title → AutocastProbe")
    first = next(iter(probes.values()))
    rows = [[html.escape(op)] + [html.escape(p.ops.get(op, "–")) for p in probes.values()] for op in first.ops]
    return table_html(["op"] + list(probes), rows)
