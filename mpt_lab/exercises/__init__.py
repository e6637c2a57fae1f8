"""Exercise checks: a student's answer or function goes in, a readable pass/fail with a hint comes out.

    >>> from mpt_lab import exercises
    >>> print(exercises.show("1.1"))                 # doctest: +SKIP
    >>> exercises.check("1.1", my_answer)            # doctest: +SKIP
    ✏️ / ❌ / ✅ 1.1 ...
    >>> exercises.solution_dropdown("1.1")           # doctest: +SKIP   (the worked solution, collapsed)

Every expected answer is computed by the package (:mod:`mpt_lab.formats`, :mod:`mpt_lab.scaling`,
:mod:`mpt_lab.autocast`, ...) when the check runs; nothing is typed in. :func:`solution` returns the reference
answer (the tests check that every reference solution passes); references call the package's public functions.
:func:`solution_dropdown` shows an exercise's worked solution collapsed under it, in a notebook and in the rendered
book alike, so that a reader of the static book can check an answer without the solution being in plain view.

An exercise not answered yet (the answer is ``None``, or a function whose first call raises
``NotImplementedError``, as the notebooks' templates do) gets a neutral "your answer goes here", not a failure.

One module per chapter (``ch01``, ``ch02``, …) registers that chapter's exercises; ``_core`` holds the machinery
they share.
"""

from __future__ import annotations

import importlib
import pkgutil

from ._core import (
    EXERCISES,
    UNANSWERED_FUNCTION,
    UNANSWERED_VALUE,
    Exercise,
    Feedback,
    SolutionDropdown,
    check,
    get_exercise,
    list_exercises,
    show,
    solution,
    solution_dropdown,
)

#: The chapter modules, in chapter order (each registers its exercises when imported).
CHAPTER_MODULES = tuple(sorted(m.name for m in pkgutil.iter_modules(__path__) if m.name.startswith("ch")))
for _name in CHAPTER_MODULES:
    importlib.import_module(f"{__name__}.{_name}")
del _name

__all__ = [
    "Feedback",
    "Exercise",
    "EXERCISES",
    "check",
    "solution",
    "show",
    "list_exercises",
    "solution_dropdown",
    "SolutionDropdown",
    "get_exercise",
    "CHAPTER_MODULES",
    "UNANSWERED_VALUE",
    "UNANSWERED_FUNCTION",
]
