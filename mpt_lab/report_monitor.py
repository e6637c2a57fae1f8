"""A precision monitor over the steps of your own training loop: loss scale, skipped steps, amax histories,
underflow shares, and why a loss scale collapses.

A dynamic loss scaler that halves at every step until training stops is a symptom with several causes (fairseq
issue 512's falling scale; DeepSpeed's "Current loss scale already at minimum"; PyTorch issue 99640's scale
below 1; Adam's ``eps`` that is zero in FP16, PyTorch issue 40497).  :class:`PrecisionMonitor` watches a loop
as it runs and tells them apart::

    with PrecisionMonitor(model, "FP16", scaler=scaler, optimizer=opt) as mon:
        for x, y in batches:
            opt.zero_grad()
            with torch.autocast("cpu", dtype=torch.float16):
                loss = loss_fn(model(x), y)
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            mon.step(loss)                 # once per training step, after the scaler's update
    print(mon.diagnose())                  # what happened, step by step

It records per step (:attr:`PrecisionMonitor.history`): the loss, the loss scale the step ran at and the one
after it, whether the step was skipped (a gradient held inf/NaN, which is what a GradScaler checks), each watched
module's output amax and the modules whose outputs held inf/NaN in forward, each parameter gradient's amax (as
backward produced it, scaled by the loss scale), the share of gradient values that are zero and that the format
would flush to zero, and the parameters that hold inf/NaN after the optimizer step.  Its hooks (forward hooks on
the watched modules, a forward pre-hook on the model, post-accumulate-grad hooks on the parameters) are removed
when the ``with`` block exits, also by an exception.
"""

from __future__ import annotations

import math

import torch

from . import formats as F
from ._report_record import amax_of, floating_tensors
from .histogram import Log2Histogram, log2_histogram

__all__ = ["PrecisionMonitor"]


class PrecisionMonitor:
    """Context manager over the steps of a training loop (see the module docstring).

    Parameters
    ----------
    model : torch.nn.Module
    fmt : the format the loop computes in (default "FP16"): underflow shares and the optimizer's constants are
        judged in it
    scaler : None, or a loss scaler with ``get_scale()`` (``torch.amp.GradScaler``,
        :class:`mpt_lab.scaling.GradScaler`)
    optimizer : None, or the loop's torch.optim.Optimizer (its constants are checked in ``fmt`` when the weights
        are stored in ``fmt``)
    modules : "leaves" (default: the modules without children), "all", or a list of module names to watch

    Attributes
    ----------
    history : list of dicts, one per :meth:`step`: "step", "loss", "scale" (the loss scale the step ran at),
        "next_scale" (after the scaler's update), "skipped" (a gradient held inf/NaN; None without a scaler and without
        gradients), "activation_amax" (module → largest |output| of the step, inf/NaN when one was),
        "nonfinite_activations" (modules whose outputs held inf/NaN, in the order they ran), "gradient_amax"
        (parameter → largest |gradient| as backward produced it), "nonfinite_gradients", "gradient_zero" (share
        of gradient values that are zero), "gradient_underflow" (share of the non-zero ones that ``fmt`` flushes to
        zero), "nonfinite_weights" (parameters holding inf/NaN after the step)

    Raises
    ------
    TypeError
        ``model`` not a Module; ``scaler`` without ``get_scale``; ``optimizer`` not an Optimizer.
    ValueError
        Unknown format, or an unknown module name.
    """

    def __init__(self, model: torch.nn.Module, fmt="FP16", *, scaler=None, optimizer=None, modules="leaves"):
        if not isinstance(model, torch.nn.Module):
            raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
        self.fmt = F.get_format(fmt, "fmt")
        if scaler is not None and not callable(getattr(scaler, "get_scale", None)):
            raise TypeError(f"scaler must have a get_scale() method (a GradScaler), got {type(scaler).__name__}")
        if optimizer is not None and not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(f"optimizer must be a torch.optim.Optimizer or None, got {type(optimizer).__name__}")
        named = dict(model.named_modules())
        if modules == "leaves":
            watch = [n for n, m in named.items() if not any(True for _ in m.children())]
        elif modules == "all":
            watch = list(named)
        else:
            if isinstance(modules, str):
                raise ValueError(f"modules must be 'leaves', 'all' or a list of module names, got {modules!r}")
            watch = list(modules)
            unknown = [n for n in watch if n not in named]
            if unknown:
                raise ValueError(f"modules names {unknown}, which are not modules of the model")
        self.model, self.scaler, self.optimizer = model, scaler, optimizer
        self.watch = watch
        self._named = named
        self._params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        self.history: list = []
        self._handles: list = []
        self._reset()

    # --- hooks -------------------------------------------------------------------------------------------------
    def _reset(self) -> None:
        self._act: dict = {}
        self._act_bad: list = []
        self._grad_amax: dict = {}
        self._grad_hist: dict = {}
        self._scale = None
        self._started = False

    def __enter__(self) -> PrecisionMonitor:
        self._reset()
        self._handles.append(self.model.register_forward_pre_hook(self._on_start))
        for name in self.watch:
            self._handles.append(self._named[name].register_forward_hook(self._on_output(name)))
        for name, p in self._params:
            self._handles.append(p.register_post_accumulate_grad_hook(self._on_grad(name)))
        return self

    def __exit__(self, *exc) -> bool:
        self.close()
        return False

    def close(self) -> None:
        """Remove every hook of the monitor (the ``with`` block does it on exit)."""
        for h in self._handles:
            h.remove()
        self._handles = []

    def _on_start(self, module, args) -> None:
        if not self._started:
            self._started = True
            self._scale = float(self.scaler.get_scale()) if self.scaler is not None else None

    def _on_output(self, name: str):
        def hook(module, args, output):
            with torch.no_grad():
                for t in floating_tensors(output):
                    a = float(amax_of(t))
                    prev = self._act.get(name)
                    if prev is None or a > prev or a != a:
                        self._act[name] = a
                    if not math.isfinite(a) and name not in self._act_bad:
                        self._act_bad.append(name)

        return hook

    def _on_grad(self, name: str):
        def hook(p):
            g = p.grad
            if g is None:
                return
            with torch.no_grad():
                self._grad_amax[name] = float(amax_of(g))
                self._grad_hist[name] = log2_histogram(g.detach())

        return hook

    # --- the steps -----------------------------------------------------------------------------------------------
    def step(self, loss: torch.Tensor | float | None = None) -> dict:
        """Record one training step (call it once per step, after ``optimizer.step()`` and the scaler's update).

        Parameters
        ----------
        loss : None, a float or a scalar tensor (the step's loss, unscaled)

        Returns
        -------
        the step's record (also appended to :attr:`history`)

        Raises
        ------
        TypeError
            ``loss`` is not a number or a one-element tensor.
        """
        if isinstance(loss, torch.Tensor):
            if loss.numel() != 1:
                raise TypeError(f"loss must be a number or a one-element tensor, got shape {tuple(loss.shape)}")
            loss = float(loss.detach())
        elif loss is not None and not isinstance(loss, (int, float)):
            raise TypeError(f"loss must be a number or a one-element tensor, got {type(loss).__name__}")
        hist = Log2Histogram()
        for h in self._grad_hist.values():
            hist = hist + h
        bad_grads = [n for n, a in self._grad_amax.items() if not math.isfinite(a)]
        skipped = None
        if self._grad_amax:
            skipped = bool(bad_grads)
        c = hist.category_counts(self.fmt) if hist.total else None
        nz = (c["normal"] + c["subnormal"] + c["underflow"] + c["overflow"]) if c else 0
        with torch.no_grad():
            bad_weights = [n for n, p in self._params if not bool(torch.isfinite(p.detach()).all())]
        rec = {
            "step": len(self.history),
            "loss": loss,
            "scale": self._scale,
            "next_scale": float(self.scaler.get_scale()) if self.scaler is not None else None,
            "skipped": skipped,
            "activation_amax": dict(self._act),
            "nonfinite_activations": list(self._act_bad),
            "gradient_amax": dict(self._grad_amax),
            "nonfinite_gradients": bad_grads,
            "gradient_zero": hist.zeros / hist.total if hist.total else None,
            "gradient_underflow": c["underflow"] / nz if nz else None,
            "nonfinite_weights": bad_weights,
        }
        self.history.append(rec)
        self._reset()
        return rec

    # --- reading it ----------------------------------------------------------------------------------------------
    def scales(self) -> list:
        """The loss scale each recorded step ran at (None without a scaler)."""
        return [r["scale"] for r in self.history]

    def skipped_steps(self) -> list:
        """The indices of the steps whose gradients held inf/NaN (a GradScaler skips them)."""
        return [r["step"] for r in self.history if r["skipped"]]

    def amax_history(self, name: str) -> list:
        """A watched module's output amax (or, for a parameter's name, its gradient's amax) per step (None where it
        did not run)."""
        if name in self._named:
            return [r["activation_amax"].get(name) for r in self.history]
        return [r["gradient_amax"].get(name) for r in self.history]

    def diagnose(self) -> list:
        """Why steps were skipped and the loss scale fell, in the order it happened: a list of dicts "step" (the
        first step of the finding), "last" (the last step in a row with the same finding), "finding" (one of
        "forward overflow", "nonfinite weights", "optimizer constant", "scale below 1", "gradient overflow",
        "collapse") and "text".

        The findings:

        * *forward overflow*: a watched module's output held inf/NaN in forward (the first such module is named)
          while the weights were finite; a loss scale multiplies gradients only, so every such step is skipped
          and the scale falls without end (fairseq issue 512; DeepSpeed's "Current loss scale already at
          minimum");
        * *nonfinite weights*: a parameter holds inf/NaN after a step; every later step is NaN whatever the scale
          (its forward overflows are not reported again); with *optimizer constant* when the weights are FP16 or
          BF16 and the optimizer's ``eps`` rounds to 0 in that format (PyTorch issues 40497 and 147437: Adam's
          ``eps=1e-8`` is 0 in FP16);
        * *scale below 1*: a skipped step at a loss scale below 1 with finite activations: the gradients overflow
          ``fmt`` without any scaling (PyTorch issue 99640);
        * *gradient overflow*: a skipped step at a scale ≥ 1 with finite activations: the scale was too large for
          the largest gradient (the scaler's normal correction when it happens once);
        * *collapse*: three or more skipped steps in a row (with a scaler), with the scale before and after.
        """
        out: list = []

        def add(step, finding, text, key=None):
            last = next((d for d in reversed(out) if d["finding"] != "collapse"), None)
            if last is not None and last["key"] == (finding, key) and last["last"] == step - 1:
                last["last"] = step
                return
            out.append({"step": step, "last": step, "finding": finding, "text": text, "key": (finding, key)})

        run, run_start, weights_bad, collapse = 0, None, False, None
        for r in self.history:
            st, s = r["step"], r["scale"]
            if r["skipped"]:
                if weights_bad:
                    pass
                elif r["nonfinite_activations"]:
                    m = r["nonfinite_activations"][0]
                    add(
                        st,
                        "forward overflow",
                        f"the forward pass holds inf/NaN from {m or '(model)'} on; no loss scale cures a forward "
                        "overflow, so the scaler skips every such step and halves the scale each time",
                        m,
                    )
                elif s is not None and s < 1:
                    finite = {n: a for n, a in r["gradient_amax"].items() if math.isfinite(a)}
                    bad = [n for n, a in r["gradient_amax"].items() if not math.isfinite(a)]
                    top = max(finite, key=finite.get) if finite else None
                    notes = []
                    if bad:  # the gradients that overflowed at this scale
                        notes.append(
                            f"inf/NaN at this scale in {bad[0]}" + (f" and {len(bad) - 1} more" * (len(bad) > 1))
                        )
                    if top:
                        notes.append(
                            f"largest finite gradient at this scale {finite[top]:.4g}, {finite[top] / s:.4g} unscaled, at {top}"
                        )
                    add(
                        st,
                        "scale below 1",
                        f"the loss scale fell below 1 ({s:g}) and gradients still overflow {self.fmt.name}: they "
                        "overflow without any scaling" + (f" ({'; '.join(notes)})" if notes else ""),
                    )
                else:
                    add(
                        st,
                        "gradient overflow",
                        f"a gradient overflowed {self.fmt.name} at the loss scale the step ran at ({s:g} at the first, "
                        f"at {r['nonfinite_gradients'][0]}); the scaler halves the scale and skips the step",
                    )
                run += 1
                run_start = r if run == 1 else run_start
                if run >= 3 and self.scaler is not None:
                    if run == 3:
                        collapse = {"step": run_start["step"], "finding": "collapse", "key": None}
                        out.append(collapse)
                    collapse["last"] = st
                    collapse["text"] = (
                        f"{run} skipped steps in a row: the loss scale fell from "
                        f"{run_start['scale']:g} to {r['next_scale']:g}"
                    )
            else:
                run = 0
            if r["nonfinite_weights"] and not weights_bad:
                weights_bad = True
                add(
                    st,
                    "nonfinite weights",
                    f"after the optimizer step {len(r['nonfinite_weights'])} parameter(s) hold inf/NaN (e.g. "
                    f"{r['nonfinite_weights'][0]}); every later step is NaN whatever the loss scale",
                )
                out += [d | {"last": st, "key": None} for d in self._optimizer_findings(st)]
        for d in out:
            d.pop("key", None)
            span = f"step {d['step']}" if d["last"] == d["step"] else f"steps {d['step']}–{d['last']}"
            d["text"] = f"{span}: {d['text']}"
        return out

    def _optimizer_findings(self, step: int) -> list:
        opt = self.optimizer
        if opt is None:
            return []
        dtypes = {p.dtype for g in opt.param_groups for p in g["params"]}
        fmt = {torch.float16: "FP16", torch.bfloat16: "BF16"}.get(next(iter(dtypes))) if len(dtypes) == 1 else None
        out = []
        if fmt is None:
            return out
        for g in opt.param_groups:
            for key in ("eps",):
                v = g.get(key)
                if isinstance(v, (int, float)) and v != 0 and F.round_to(float(v), fmt) == 0:
                    out.append(
                        {
                            "step": step,
                            "finding": "optimizer constant",
                            "text": f"the weights are {fmt} and the optimizer's {key}={v:g} rounds to 0 in {fmt}: "
                            "a weight whose second moment underflows is divided by zero (keep the "
                            "optimizer's arithmetic and master weights in FP32, or raise eps)",
                        }
                    )
                    return out
        return out

    def __repr__(self) -> str:
        return (
            f"PrecisionMonitor({self.fmt.name}, {len(self.watch)} modules, {len(self.history)} steps recorded, "
            f"{'active' if self._handles else 'closed'})"
        )
