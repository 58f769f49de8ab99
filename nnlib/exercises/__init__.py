"""The exercises at the end of every lesson, each with its worked answer, written once.

``nnlib/exercises/lesson_NN.py`` holds lesson NN's exercises. For each one it has:

- the **worked answer**, a plain function. Its def line and docstring are the exercise: the
  notebook's exercise cell shows them with the body left to write (:attr:`Exercise.signature`
  reads them from the answer's source, and tests/test_exercises.py checks that every notebook
  shows exactly that);
- the **cases** it is checked on (argument tuples, sizes that do not divide evenly among them);
- a **hint** that points at the idea without giving the answer, and the relative **tolerance**.

:func:`nnlib.check.check` calls the student's function and the worked answer on every case and
compares the results; :func:`nnlib.check.solution` prints the worked answer. The tests check each
answer against nnlib's own function where the lesson has one, so the lesson and the check cannot
disagree.

The MPI exercises are written as what happens on *every* rank at once, with the ranks' arrays side
by side (e.g. a ring step on an array with one row per rank): the idea of the lesson, checkable in
one process and in a second.

This package is lesson 00, like ``check``: it finds lesson NN's module by its number when asked
(an import at call time), so checking lesson 02's exercises never loads a later lesson's code. Each
``lesson_NN`` module is lesson NN and imports nothing of nnlib but this package.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
import re
from dataclasses import dataclass
from typing import Callable

import numpy as np

LESSON = 0  # found by the checker of lesson 00; each lesson_NN module is lesson NN

KEY = re.compile(r"(\d\d)\.\d+")  # "02.2": lesson 02, exercise 2


@dataclass(frozen=True)
class Exercise:
    """Exercise ``key`` ("02.2"): write ``worked_answer``'s function; checked on ``cases()`` within ``tolerance``."""

    key: str
    worked_answer: Callable
    cases: Callable[[], list]
    hint: str
    tolerance: float = 1e-10

    @property
    def function(self) -> str:
        """The name of the function the student writes (the worked answer's name)."""
        return self.worked_answer.__name__

    @property
    def signature(self) -> str:
        """The worked answer's def line and docstring, as written in its source: the exercise."""
        source = inspect.getsource(self.worked_answer)
        docstring = ast.parse(source).body[0].body[0]
        return "\n".join(source.splitlines()[: docstring.end_lineno])

    def template(self) -> str:
        """The exercise cell as the notebook gives it: the signature and a body left to write."""
        return f"{self.signature}\n    ...  # your code here"


def case_generator(key: str) -> np.random.Generator:
    """The same cases every time, different for every exercise: a generator seeded by the key's numbers."""
    return np.random.default_rng([int(part) for part in key.split(".")])


def uniform(generator: np.random.Generator, *shape: int) -> np.ndarray:
    """An array of ``shape`` drawn uniformly from [-1, 1)."""
    return generator.uniform(-1, 1, size=shape)


def lessons() -> list[str]:
    """The lessons that have exercises, "00" to "11", from the names of this package's modules."""
    names = (module.name for module in pkgutil.iter_modules(__path__))
    return sorted(name.removeprefix("lesson_") for name in names if re.fullmatch(r"lesson_\d\d", name))


def lesson_exercises(lesson: str) -> list[Exercise]:
    """Lesson ``lesson``'s ("02") exercises in order, from its module lesson_02, imported now."""
    if lesson not in lessons():
        return []
    return list(importlib.import_module(f"{__name__}.lesson_{lesson}").EXERCISES)


def find(key) -> Exercise | None:
    """Exercise ``key`` ("02.2"), importing only its lesson's module; None if there is no such exercise."""
    match = KEY.fullmatch(key) if isinstance(key, str) else None
    if match is None:
        return None
    return next((exercise for exercise in lesson_exercises(match.group(1)) if exercise.key == key), None)


def all_exercises() -> dict[str, Exercise]:
    """{key: Exercise} of every lesson (this imports every lesson's exercises module)."""
    return {exercise.key: exercise for lesson in lessons() for exercise in lesson_exercises(lesson)}
