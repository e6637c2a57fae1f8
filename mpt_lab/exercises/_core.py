"""The machinery every chapter's exercises share: the registry, the check, feedback, the solution dropdown,
and the small answer-checking helpers.  Chapter modules (``ch01`` … ) register their exercises here; users go
through :mod:`mpt_lab.exercises`."""

from __future__ import annotations

import functools
import html
import inspect
import math
import numbers
import re
import reprlib
import sys
import textwrap
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = [
    "Feedback",
    "Exercise",
    "EXERCISES",
    "register",
    "get_exercise",
    "check",
    "solution",
    "show",
    "list_exercises",
    "solution_dropdown",
    "SolutionDropdown",
    "UNANSWERED_VALUE",
    "UNANSWERED_FUNCTION",
    "is_real",
    "expect_int",
    "expect_float",
    "as_list",
    "entries_text",
    "short",
]


@dataclass(frozen=True)
class Feedback:
    """The outcome of a check: ``passed``, a ``message`` and, when it failed, a ``hint``.

    ``answered`` is False for an exercise not answered yet (see :func:`check`): it is falsy like a failure
    but renders neutrally (grey, "your answer goes here", no hint yet) instead of as a red ❌.
    ``details`` is the traceback when the reader's function raised (its call is in ``message``), shown under the
    message; "" otherwise.
    """

    exercise: str
    passed: bool
    message: str
    hint: str = ""
    answered: bool = True
    details: str = ""

    def __bool__(self) -> bool:
        return self.passed

    def _status(self) -> tuple:
        """(icon, status words, HTML background) of this outcome."""
        if not self.answered:
            return "✏️", "not answered yet", "#f0f0f0"
        return ("✅", "passed", "#e6f4e6") if self.passed else ("❌", "not yet", "#fbe9e9")

    def __str__(self) -> str:
        icon, status, _ = self._status()
        head = f"{icon} {self.exercise} {status}: {self.message}"
        if self.details:
            head += "\n" + textwrap.indent(self.details.rstrip("\n"), "   ")
        return head if self.passed or not self.hint else f"{head}\n   hint: {self.hint}"

    __repr__ = __str__

    def _repr_html_(self) -> str:
        icon, _, color = self._status()
        hint = "" if self.passed or not self.hint else f"<br><i>Hint:</i> {html.escape(self.hint)}"
        if self.details:
            hint = (
                f'<pre style="white-space:pre-wrap;font-size:85%;margin:4px 0">{html.escape(self.details)}</pre>' + hint
            )
        style = f"background:{color};padding:6px 10px;border-radius:4px"
        if not self.answered:
            style += ";color:#555;border:1px dashed #bbb"
        return (
            f'<div style="{style}">{icon} <b>{html.escape(self.exercise)}</b> {html.escape(self.message)}{hint}</div>'
        )


@dataclass(frozen=True)
class Exercise:
    """One exercise.

    id : "C.N", chapter C, exercise N
    title, prompt : what the reader sees (:func:`show`)
    checker : ``answer -> (passed, message)``
    hint : shown under a failed check
    solution : ``() -> answer``, the reference answer (a value, or a function for function exercises)
    worked : the worked solution, shown collapsed under the exercise (:func:`solution_dropdown`): paragraphs
        separated by blank lines, inline code in backticks, code blocks fenced with three backticks.  The
        answer's numbers come from ``solution`` at display time, written in the text as ``{answer}``.
    details : optional ``() -> str``, the rest of the prompt, computed when :func:`show` shows it (data read
        from the installed libraries, too slow to compute when the exercises are imported)
    """

    id: str
    title: str
    prompt: str
    checker: Callable[[Any], tuple]
    hint: str
    solution: Callable[[], Any]
    worked: str = ""
    details: Callable[[], str] | None = None


#: id → :class:`Exercise`, in the order the chapter modules register them.
EXERCISES: dict[str, Exercise] = {}

_ID = re.compile(r"[1-9][0-9]*\.[1-9][0-9]*")


def register(ex: Exercise) -> Exercise:
    """Add ``ex`` to :data:`EXERCISES` (chapter modules call this once per exercise).

    Raises ValueError for an id that is not "C.N" or is registered already, TypeError for a non-Exercise.
    """
    if not isinstance(ex, Exercise):
        raise TypeError(f"ex must be an Exercise, got {type(ex).__name__}")
    if not _ID.fullmatch(ex.id):
        raise ValueError(f"ex.id must look like '3.1' (chapter.number), got {ex.id!r}")
    if ex.id in EXERCISES:
        raise ValueError(f"exercise {ex.id!r} is registered twice")
    EXERCISES[ex.id] = ex
    return ex


def get_exercise(exercise_id) -> Exercise:
    """The :class:`Exercise` called ``exercise_id``.

    Raises TypeError for a non-str id, ValueError for an unknown one (the message lists the known ids).
    """
    if not isinstance(exercise_id, str):
        raise TypeError(f"exercise_id must be a str such as '1.1', got {type(exercise_id).__name__}")
    if exercise_id not in EXERCISES:
        raise ValueError(f"unknown exercise {exercise_id!r}; expected one of {sorted(EXERCISES, key=_key)}")
    return EXERCISES[exercise_id]


def _key(exercise_id: str) -> tuple:
    return tuple(int(p) for p in exercise_id.split("."))


#: What an unanswered exercise says, for a value and for a function.
UNANSWERED_VALUE = "your answer goes here. Replace None with your answer and run the cell again."
UNANSWERED_FUNCTION = (
    "your answer goes here. Write the function's body (its first call still raises "
    "NotImplementedError) and run the cell again."
)


_REPR = reprlib.Repr()
_REPR.maxstring, _REPR.maxother, _REPR.maxlist, _REPR.maxtuple, _REPR.maxdict = 60, 60, 8, 8, 6


def _argument_text(value: Any) -> str:
    """A short, readable repr of one argument of the reader's function (arrays and tensors summarised)."""
    if isinstance(value, float):
        return repr(value)  # every digit: the exact value matters here
    shape, dtype = getattr(value, "shape", None), getattr(value, "dtype", None)
    if shape is not None and dtype is not None and hasattr(value, "tolist"):  # a NumPy array or a torch tensor
        kind = "tensor" if type(value).__module__.startswith("torch") else "array"
        try:
            first = value.reshape(-1)[:6].tolist()
        except Exception:  # noqa: BLE001 (a meta tensor, an odd array type: no values to show)
            return f"{kind} of shape {tuple(shape)}, dtype {dtype}"
        if math.prod(shape) <= 6 and len(shape) <= 1:
            return f"{kind}({first!r}, dtype={dtype})"
        shown = ", ".join(f"{v:g}" if isinstance(v, (int, float)) else repr(v) for v in first[:3])
        return f"{kind} of shape {tuple(shape)}, dtype {dtype}: [{shown}, …]"
    text = _REPR.repr(value)
    return f"{type(value).__name__}(…)" if "\n" in text else text  # a model: its name, not its many lines


def _call_text(fn: Callable, args: tuple, kwargs: dict) -> str:
    """``name(arg, ..., key=value)`` for a call of the reader's function, as a message shows it."""
    name = getattr(fn, "__name__", None) or type(fn).__name__
    parts = [_argument_text(a) for a in args] + [f"{k}={_argument_text(v)}" for k, v in kwargs.items()]
    return f"{name}({', '.join(parts)})"


def _reader_traceback(err: BaseException, skip: int = 1) -> str:
    """The traceback of ``err`` from the reader's own frame on (the first ``skip`` frames, the checker's wrapper,
    left out)."""
    tb = err.__traceback__
    for _ in range(skip):
        tb = tb.tb_next if tb is not None and tb.tb_next is not None else tb
    return "".join(traceback.format_exception(type(err), err, tb))


def _watch_first_call(fn: Callable) -> tuple:
    """``fn`` wrapped so that it records whether its first call raised NotImplementedError, and the call and
    traceback of the last exception it raised: (wrapper, record)."""
    record = {"calls": 0, "not_implemented": False, "error": None}

    def watched(*args, **kwargs):
        record["calls"] += 1
        try:
            return fn(*args, **kwargs)
        except NotImplementedError:
            if record["calls"] == 1:
                record["not_implemented"] = True
            record["error"] = _raised(fn, args, kwargs)
            raise
        except Exception:
            record["error"] = _raised(fn, args, kwargs)
            raise

    functools.update_wrapper(watched, fn, updated=())
    return watched, record


def _raised(fn: Callable, args: tuple, kwargs: dict) -> tuple:
    """(the exception being handled, the call that raised it, its traceback from the reader's frame on)."""
    err = sys.exc_info()[1]
    return err, _call_text(fn, args, kwargs), _reader_traceback(err)


def check(exercise_id: str, answer: Any) -> Feedback:
    """Check ``answer`` for exercise ``exercise_id`` and return :class:`Feedback` (truthy when passed).

    A wrong type of answer fails with a message saying what was expected; it does not raise. A function that
    raises fails with the call that raised (its arguments) in the message and the traceback, from the reader's
    own code on, in ``Feedback.details``. An answer that
    is ``None``, or a function whose first call raises ``NotImplementedError`` (the notebooks' templates),
    is *not answered yet*: the Feedback is falsy, with ``answered=False``, and renders neutrally ("your answer
    goes here") without the hint. A function that raises ``NotImplementedError`` only on a later call has
    been answered in part, and fails.

    Raises
    ------
    TypeError, ValueError
        ``exercise_id`` is not a str or not a known exercise.
    """
    ex = get_exercise(exercise_id)
    if answer is None:
        return Feedback(ex.id, False, UNANSWERED_VALUE, answered=False)
    record = None
    if callable(answer):
        answer, record = _watch_first_call(answer)
    details = ""
    try:
        passed, message, *more = ex.checker(answer)  # (passed, message) or (passed, message, details)
        details = more[0] if more else ""
    except Exception as err:  # a student's function may raise anything: report it, do not crash the notebook
        raised = record["error"] if record is not None else None
        if raised is not None and raised[0] is err:  # the reader's function raised: show its call and traceback
            passed, message, details = False, f"{raised[1]} raised {type(err).__name__}: {err}", raised[2]
        else:  # the check could not handle what the function returned
            passed, message = False, f"checking raised {type(err).__name__}: {err}"
    if record is not None and record["not_implemented"]:
        return Feedback(ex.id, False, UNANSWERED_FUNCTION, answered=False)
    return Feedback(ex.id, bool(passed), message, "" if passed else ex.hint, details=details)


def solution(exercise_id: str) -> Any:
    """The reference solution of an exercise (a value, or a function for function exercises)."""
    return get_exercise(exercise_id).solution()


def show(exercise_id: str) -> str:
    """The exercise's title and prompt (with its ``details``, when it has them)."""
    ex = get_exercise(exercise_id)
    more = f"\n{ex.details()}" if ex.details is not None else ""
    return f"Exercise {ex.id}: {ex.title}\n{ex.prompt}{more}"


def list_exercises(chapter: int | None = None) -> list:
    """Exercise ids in chapter order, optionally only those of one chapter (an int)."""
    if chapter is not None and (not isinstance(chapter, int) or isinstance(chapter, bool) or chapter < 1):
        raise ValueError(f"chapter must be a positive int or None, got {chapter!r}")
    ids = sorted(EXERCISES, key=_key)
    return [k for k in ids if chapter is None or _key(k)[0] == chapter]


# ------------------------------------------------------------------------------------------ the worked solution
def _answer_text(answer: Any) -> str:
    """The reference answer as the worked solution shows it: a function by its source, a value by its repr."""
    if callable(answer):
        try:
            return textwrap.dedent(inspect.getsource(answer)).strip()
        except (OSError, TypeError):
            return getattr(answer, "__name__", repr(answer))
    if isinstance(answer, float):
        return repr(answer)
    if isinstance(answer, dict):
        return "{" + ", ".join(f"{k!r}: {_answer_text(v)}" for k, v in answer.items()) + "}"
    if isinstance(answer, (tuple, list)):
        inner = ", ".join(_answer_text(v) for v in answer)
        return f"({inner}{',' if len(answer) == 1 else ''})" if isinstance(answer, tuple) else f"[{inner}]"
    return repr(answer)


_FENCE = re.compile(r"```[a-z]*\n(.*?)\n```", re.S)


def _inline(text: str) -> str:
    """Escape ``text`` for HTML and turn `code` into <code>."""
    parts = text.split("`")
    return "".join(f"<code>{html.escape(p)}</code>" if i % 2 else html.escape(p) for i, p in enumerate(parts))


def _render(worked: str) -> str:
    """HTML of a worked solution: fenced code blocks as <pre>, other paragraphs as <p>."""
    out, pos = [], 0
    for m in _FENCE.finditer(worked):
        out += [f"<p>{_inline(p.strip())}</p>" for p in worked[pos : m.start()].split("\n\n") if p.strip()]
        out.append(f'<pre style="white-space:pre-wrap"><code>{html.escape(m.group(1))}</code></pre>')
        pos = m.end()
    out += [f"<p>{_inline(p.strip())}</p>" for p in worked[pos:].split("\n\n") if p.strip()]
    return "\n".join(out)


class SolutionDropdown:
    """An exercise's worked solution, collapsed: a ``<details>`` element in a notebook and in the rendered book.

    Made by :func:`solution_dropdown`; ``text`` holds the worked solution as plain text (what ``print`` shows).
    """

    def __init__(self, ex: Exercise):
        self.exercise = ex
        answer = ex.solution()
        shown = _answer_text(answer)
        asked = re.search(r"\bWrite (\w+)\(", ex.prompt)  # the name the prompt asks the reader to write
        if callable(answer) and asked and getattr(answer, "__name__", "").startswith("_"):
            shown = re.sub(rf"\b{re.escape(answer.__name__)}\b", asked.group(1), shown)
        worked = ex.worked.replace("{answer}", shown) if ex.worked else ""
        if isinstance(answer, dict):  # "{answer_items}": a dict answer as "key: value, ...", for prose
            worked = worked.replace(
                "{answer_items}",
                ", ".join(f"{k}: {v if isinstance(v, str) else _answer_text(v)}" for k, v in answer.items()),
            )
        self.text = worked or f"The reference answer:\n\n```python\n{_answer_text(answer)}\n```"

    def __repr__(self) -> str:
        return (
            f"(the worked solution of exercise {self.exercise.id} is collapsed; "
            f"print(exercises.solution_dropdown({self.exercise.id!r}).text) shows it)"
        )

    def _repr_html_(self) -> str:
        ex = self.exercise
        return (
            f'<details class="mpt-solution" style="border:1px solid #ccc;border-radius:4px;'
            f'padding:4px 10px;margin:6px 0">'
            f'<summary style="cursor:pointer"><b>Solution to exercise {html.escape(ex.id)}</b> '
            f"({html.escape(ex.title)}): click to open</summary>\n{_render(self.text)}\n</details>"
        )


def solution_dropdown(exercise_id: str) -> SolutionDropdown:
    """The worked solution of an exercise, collapsed (a ``<details>`` element), for the cell under the exercise.

    Readers of the static book open it to check their answer; in a live notebook the same cell shows it
    collapsed, so the solution is never in plain view.

    Raises TypeError, ValueError for an id that is not a known exercise.
    """
    return SolutionDropdown(get_exercise(exercise_id))


# ---------------------------------------------------------------------------------------- checking helpers
def is_real(x) -> bool:
    """True for a real number that is not a bool."""
    return isinstance(x, numbers.Real) and not isinstance(x, bool)


def expect_int(answer, truth, what):
    """(passed, message) for an int answer that must equal ``truth``; ``what`` names it in the message."""
    if not isinstance(answer, numbers.Integral) or isinstance(answer, bool):
        return False, f"expected an int ({what}), got {type(answer).__name__}"
    if int(answer) == truth:
        return True, f"{what} is {truth}."
    return False, f"{answer} is not {what}."


def as_list(answer):
    """A list of the entries of a list, tuple or 1-D NumPy array; None for anything else."""
    if isinstance(answer, np.ndarray):
        return answer.tolist() if answer.ndim == 1 else None
    return list(answer) if isinstance(answer, (list, tuple)) else None


def entries_text(answer, values, n: int, ok) -> str:
    """What a list answer that should hold ``n`` entries passing ``ok`` held instead, for a message: its type,
    its number of entries, or which entries are of the wrong type."""
    if values is None:
        return type(answer).__name__
    if len(values) != n:
        return f"{len(values)} entries"
    bad = [i for i, v in enumerate(values) if not ok(v)]
    return (
        f"{n} entries, but entr{'y' if len(bad) == 1 else 'ies'} {', '.join(str(i + 1) for i in bad[:5])}"
        f"{', …' if len(bad) > 5 else ''} {'is' if len(bad) == 1 else 'are'} "
        f"{', '.join(sorted({type(values[i]).__name__ for i in bad}))}"
    )


def short(values, n: int = 6) -> str:
    """At most ``n`` numbers of a sequence, for a message."""
    values = [float(v) for v in values]
    text = ", ".join(f"{v:g}" for v in values[:n])
    return f"[{text}{', …' if len(values) > n else ''}] ({len(values)} values)" if len(values) > n else f"[{text}]"


def expect_float(answer, truth, what):
    """(passed, message) for a float answer that must equal ``truth`` exactly; ``what`` names it."""
    if not is_real(answer):
        return False, f"expected a number ({what}), got {type(answer).__name__}"
    if float(answer) == truth or (math.isnan(truth) and math.isnan(float(answer))):
        return True, f"{what} is {float(truth)!r}."
    return False, f"{float(answer)!r} is not {what}."
