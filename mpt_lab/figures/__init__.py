"""The book's figures and tables, one module per topic; every function takes result objects.

* :mod:`~mpt_lab.figures.formats`: where each format's values lie, ulp, fixed against floating point (ch. 1);
* :mod:`~mpt_lab.figures.gradients`: gradient histograms (the SSD histogram: NVIDIA's blog post, Fig. 2; the
  paper, Fig. 3), the detector (ch. 2);
* :mod:`~mpt_lab.figures.scaling`: the loss scale over a run, FP16 with and without loss scaling (ch. 3, 8);
* :mod:`~mpt_lab.figures.training`: master weights (the loop diagram, the loss curves), the AMP recipe's speed,
  autocast's policy (ch. 4, 6);
* :mod:`~mpt_lab.figures.accumulation`: error against K, swamping in a dot product, the tensor-core accumulator,
  reductions, Kahan-compensated weights, a GPU's products against the models (ch. 5);
* :mod:`~mpt_lab.figures.memory`: recomputation against lower precision (ch. 7);
* :mod:`~mpt_lab.figures.graphs`: float16 message passing and the GAT (ch. 9);
* :mod:`~mpt_lab.figures.distributed`: DDP and FSDP2 recipes, memory per rank, reduction error, overflow
  agreement across ranks (ch. 10);
* :mod:`~mpt_lab.figures.fp8`: training in FP8, MX and NVFP4 recipes, per-layer underflow and SNR, delayed
  scaling's amax history, error against block size (ch. 11);
* :mod:`~mpt_lab.figures.fourbit`: NVIDIA's NVFP4 training recipe ingredient by ingredient: the ablation's
  table and curves, stochastic rounding's bias, the Hadamard transform against outliers, 1D weight mismatch,
  layer sensitivity (ch. 13);
* :mod:`~mpt_lab.figures.report`: a precision report's modules × magnitude heat maps with each format's window,
  and a table of several models' reports (ch. 12);
* :func:`show_saved`: a saved GPU ("full") or long CPU result of an experiment, or the command that makes it.

Figures are :class:`~mpt_lab.figures._base.BookFigure` (matplotlib, no pyplot; shown once where returned) with
a title, labelled axes with units and a legend; tables are HTML built by one function,
:func:`~mpt_lab.figures._base.table_html`.
"""

from __future__ import annotations

import html
import re
from collections.abc import Callable, Sequence

from ._base import FORMAT_COLORS, HTML, BookFigure, running_mean, table_html
from .accumulation import (
    kernels_table,
    plot_error_vs_k,
    plot_gpu_accumulation,
    plot_running_sum,
    plot_tensor_core_model,
    product_kernels,
    reductions_table,
    split_fp16_agreement,
    split_k_model,
    weights_table,
)
from .distributed import (
    memory_table,
    plot_flag_agreement,
    plot_memory_per_rank,
    plot_recipe_losses,
    plot_reduction_error,
    reduction_table,
)
from .formats import plot_accumulation, plot_fixed_vs_float, plot_format_ranges, plot_ulp, round_to_speed_table
from .fp8 import (
    block_scale_table,
    fp8_results_table,
    hardware_table,
    one_scale_table,
    plot_amax_history,
    plot_block_size_error,
    plot_fp8_training,
    plot_layer_quantization,
    plot_recipe_snr,
)
from .gradients import (
    gradient_factors_table,
    histogram_table,
    phases_table,
    plot_detection_samples,
    plot_gradient_factors,
    plot_gradient_histogram,
    plot_kept_vs_scale,
    plot_training,
    sweep_table,
)
from .graphs import (
    code_table,
    gat_budget_table,
    gat_memory_table,
    message_passing_table,
    plot_attention_overflow,
    plot_gat_memory,
    plot_gat_memory_fit,
    plot_gat_training,
)
from .memory import (
    breakdown_table,
    exactness_table,
    layouts_table,
    memory_per_parameter_table,
    plot_tradeoffs,
    tradeoff_table,
    training_table,
)
from .report import plot_loss_scales, plot_precision_report, report_table
from .scaling import (
    divergence_table,
    gradient_scale_table,
    plot_divergence,
    plot_gradient_scale,
    plot_gradient_shift,
    plot_sampled_softmax,
    plot_scale_history,
    plot_shift_sweep,
)
from .training import (
    autocast_lists_table,
    autocast_table,
    plot_losses,
    plot_master_weight_loop,
    plot_roofline,
    roofline_summary,
    roofline_table,
    speedup_table,
)

__all__ = [
    "show_saved",
    "BookFigure",
    "HTML",
    "table_html",
    "running_mean",
    "FORMAT_COLORS",
    "plot_format_ranges",
    "plot_ulp",
    "plot_fixed_vs_float",
    "plot_accumulation",
    "round_to_speed_table",
    "plot_gradient_histogram",
    "plot_kept_vs_scale",
    "plot_detection_samples",
    "plot_training",
    "histogram_table",
    "phases_table",
    "sweep_table",
    "plot_gradient_factors",
    "gradient_factors_table",
    "plot_scale_history",
    "plot_divergence",
    "plot_shift_sweep",
    "divergence_table",
    "plot_gradient_scale",
    "gradient_scale_table",
    "plot_gradient_shift",
    "plot_sampled_softmax",
    "plot_losses",
    "plot_master_weight_loop",
    "speedup_table",
    "roofline_summary",
    "roofline_table",
    "plot_roofline",
    "autocast_table",
    "autocast_lists_table",
    "plot_tradeoffs",
    "tradeoff_table",
    "training_table",
    "breakdown_table",
    "layouts_table",
    "exactness_table",
    "memory_per_parameter_table",
    "plot_gat_training",
    "plot_gat_memory",
    "plot_attention_overflow",
    "plot_gat_memory_fit",
    "gat_memory_table",
    "gat_budget_table",
    "message_passing_table",
    "code_table",
    "plot_recipe_losses",
    "plot_memory_per_rank",
    "plot_reduction_error",
    "plot_flag_agreement",
    "memory_table",
    "reduction_table",
    "plot_fp8_training",
    "fp8_results_table",
    "plot_layer_quantization",
    "plot_recipe_snr",
    "plot_amax_history",
    "plot_block_size_error",
    "block_scale_table",
    "one_scale_table",
    "hardware_table",
    "plot_error_vs_k",
    "plot_running_sum",
    "plot_tensor_core_model",
    "reductions_table",
    "weights_table",
    "plot_gpu_accumulation",
    "kernels_table",
    "product_kernels",
    "split_k_model",
    "split_fp16_agreement",
    "plot_precision_report",
    "report_table",
    "plot_loss_scales",
]

# Chapters 10 and 11's diagrams and the FP8 recipe table (issue 26, items 17 and 18), kept on their own lines.
from ..experiments import get, result_path
from .distributed import plot_reduction_orders  # noqa: E402
from .fp8 import fp8_recipe_table, plot_mx_block  # noqa: E402

__all__ += ["plot_reduction_orders", "plot_mx_block", "fp8_recipe_table"]

# Chapter 13: four-bit training (issue 34).
from .fourbit import (  # noqa: E402
    ablation_table,
    mismatch_table,
    outlier_table,
    plot_fourbit_training,
    plot_hadamard_outliers,
    plot_layer_sensitivity,
    plot_outliers,
    plot_sr_bias,
)

__all__ += [
    "ablation_table",
    "plot_fourbit_training",
    "plot_sr_bias",
    "plot_hadamard_outliers",
    "plot_outliers",
    "outlier_table",
    "mismatch_table",
    "plot_layer_sensitivity",
]

#: What each saved profile is, in the words a reader needs.
_PROFILE_WORDS = {
    "full": ("GPU", "On a machine with a CUDA GPU"),
    "long": ("long CPU", "On a CPU (up to an hour on 2 cores)"),
}


def _display(obj) -> None:
    try:
        from IPython.display import display
    except ImportError:  # plain Python: print what can be printed
        print(obj)
        return
    display(obj)


def show_saved(
    name: str, profiles: Sequence[str] = ("full", "long"), *, show: Callable | Sequence[Callable] = ()
) -> dict:
    """Show the saved results of experiment ``name`` for each of ``profiles``, or the command that makes each.

    For a saved ``book/results/NAME_PROFILE.json``: where it came from (device, profile, date, wall time, the
    command), its summary, and ``show(result)`` for each function given (figures or tables of this package).
    For a missing one: the command that makes it.  Profiles the experiment does not define are left out.

    Parameters
    ----------
    name : an experiment of :data:`mpt_lab.experiments.NAMES`
    profiles : which saved profiles to look for ("full": GPU; "long": long CPU runs)
    show : a function or functions of a result, each returning something displayable

    Returns
    -------
    dict profile → the loaded result, for the profiles that are saved.

    Raises
    ------
    ValueError
        ``name`` is not an experiment.
    """
    experiment = get(name)
    shows = [show] if callable(show) else list(show)
    found = {}
    for p in profiles:
        if p not in experiment.profiles:
            continue
        what, where = _PROFILE_WORDS.get(p, (p, ""))
        result = experiment.saved(p)
        if result is None:
            out = f"book/results/{result_path(name, p).name}"
            cmd = experiment.command(experiment.config_for(p), out)
            _display(
                HTML(
                    f'<p class="mpt-saved"><b>No {what} result of <code>{name}</code> is saved yet.</b> '
                    f"{where} it is made by <code>{html.escape(cmd)}</code>.</p>"
                )
            )
            continue
        found[p] = result
        # the file lives in book/results/ (a GPU slot wrote it elsewhere and --unpack moved it): name that place
        source = re.sub(r"--out \S+", f"--out book/results/{result_path(name, p).name}", result.source())
        _display(
            HTML(
                f'<p class="mpt-saved"><b>Saved {what} result</b> ({html.escape(source)}):<br>'
                f"{html.escape(result.describe())}</p>"
            )
        )
        for fn in shows:
            _display(fn(result))
    return found
