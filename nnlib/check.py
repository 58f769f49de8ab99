"""Self-checking exercises: ``check("02.2", layer_backward)`` prints a verdict on a student's function.

The function is called on several cases (:mod:`nnlib.exercises` makes them, uneven sizes included), each with fresh
copies of the inputs, and compared with the worked answer. A wrong verdict names the first problem found, in the order
:func:`run_cases` and :func:`compare` check (not written yet, not a function, raised, the wrong kind of result, shape,
dtype, NaN, values: the later ones usually follow from it), and ends with a hint that points at the idea without
giving the answer. Nothing the student writes can make ``check`` raise. ``solution("02.2")`` prints the worked answer,
for after trying; checking "02.2" imports lesson 02's exercises only.
"""

from __future__ import annotations

import copy
import inspect
import sys
import textwrap
import traceback
from dataclasses import dataclass
from numbers import Number

import numpy as np

from nnlib.exercises import all_exercises, find

LESSON = 0  # the exercises' checker, used from lesson 00 on
NOTEBOOKS_ONLY = True  # used by the notebooks' exercise cells, by no other nnlib module

PASS, FAIL = "✓", "✗"
WIDTH = 100  # characters of one line of a verdict


@dataclass(frozen=True)
class Verdict:
    """The outcome of one check: ``passed``, a ``reason`` (a short keyword, for tests) and the ``message``."""

    passed: bool
    reason: str
    message: str


class Wrong(Exception):
    """A problem with the student's answer: ``reason`` is a keyword, the text says what to do."""

    def __init__(self, reason: str, text: str):
        super().__init__(text)
        self.reason = reason


def check(key: str, answer) -> None:
    """Print the verdict on ``answer`` (the student's function) for exercise ``key``, e.g. "02.2"."""
    print(verdict(key, answer).message)


def verdict(key: str, answer) -> Verdict:
    """The verdict on ``answer`` for exercise ``key`` (see the module docstring for the order of checks)."""
    exercise = find(key)
    if exercise is None:
        return Verdict(False, "unknown", unknown(key))
    heading = f"{key} {exercise.function}"
    try:
        worst, cases = run_cases(exercise, answer)
    except Wrong as problem:
        message = wrapped(f"{FAIL} {heading}: {problem}", "  ") + "\n" + wrapped(f"  Hint: {exercise.hint}", "        ")
        return Verdict(False, problem.reason, message)
    if worst == 0:
        return Verdict(True, "right", f"{PASS} {heading}: right, exactly, on all {cases} cases")
    return Verdict(True, "right", f"{PASS} {heading}: right on all {cases} cases "
                                  f"(largest relative error {worst:.0e}, allowed {exercise.tolerance:.0e})")


def wrapped(text: str, indent: str, width: int = WIDTH) -> str:
    """``text`` in lines of at most ``width`` characters (a projector's width), later lines indented."""
    return textwrap.fill(text, width, subsequent_indent=indent, break_long_words=False, break_on_hyphens=False)


def solution(key: str) -> None:
    """Print the worked answer to exercise ``key`` ("02.2"): try the exercise first, ``check`` gives hints."""
    exercise = find(key)
    print(unknown(key) if exercise is None else worked_answer_source(exercise), end="" if exercise else "\n")


def worked_answer_source(exercise) -> str:
    """The worked answer's source, after the imports and the functions of its module that it calls."""
    answer = exercise.worked_answer
    module = sys.modules[answer.__module__]
    called = [value for name, value in vars(module).items() if name in names_used(answer.__code__)
              and inspect.isfunction(value) and value.__module__ == module.__name__ and value is not answer]
    used = set().union(*(names_used(function.__code__) for function in [*called, answer]))
    imports = [f"import {value.__name__}" + (f" as {name}" if name != value.__name__ else "") + "\n"
               for name, value in vars(module).items() if inspect.ismodule(value) and name in used]
    where = module.__name__.replace(".", "/") + ".py"
    sources = [inspect.getsource(function) for function in [*called, answer]]
    return "\n\n".join([f"# The worked answer to exercise {exercise.key}, from {where}:", *(
        ["".join(imports)] if imports else []), *sources])


def names_used(code) -> set[str]:
    """The global names a function's code object reads, its comprehensions' and inner functions' included."""
    names = set(code.co_names)
    for constant in code.co_consts:
        if inspect.iscode(constant):
            names |= names_used(constant)
    return names


def unknown(key) -> str:
    """The message for a key that names no exercise, with the keys that do."""
    known = ", ".join(sorted(all_exercises()))
    return wrapped(f"{FAIL} there is no exercise {key!r}; the exercises are {known}", "  ")


def run_cases(exercise, answer) -> tuple[float, int]:
    """Call ``answer`` on every case of ``exercise``: (the largest relative error, the cases), or raise Wrong."""
    name = exercise.function
    if answer is Ellipsis or answer is None:
        raise Wrong("not written", f"not written yet: `{name}` is still {answer!r}. Define it with "
                                   f"`def {name}(...)` as the cell above shows.")
    if not callable(answer):
        raise Wrong("not a function", f"`{name}` should be a function, but it is a {type(answer).__name__} "
                                      f"({short(answer)}). Define it with `def {name}(...)`.")
    worst, cases = 0.0, exercise.cases()
    for arguments in cases:
        expected = exercise.worked_answer(*copy.deepcopy(tuple(arguments)))  # fresh copies: no call sees another's
        got = call(answer, name, arguments)
        if got is None:
            raise Wrong("not written", "not written yet: it returns None. Replace the `...` with your code "
                                       "and `return` the result.")
        if got is Ellipsis:
            raise Wrong("not written", "not written yet: it returns `...`. Replace the `...` with your code.")
        worst = max(worst, compare(got, expected, exercise.tolerance, f"{name}({', '.join(map(short, arguments))})"))
    return worst, len(cases)


def call(answer, name: str, arguments):
    """answer(*arguments), turning any exception into Wrong with the line of the student's code."""
    try:
        return answer(*copy.deepcopy(tuple(arguments)))
    except (Exception, SystemExit) as error:  # a half-finished function may raise anything (even exit())
        frames = traceback.extract_tb(error.__traceback__)[1:]  # drop this function's own frame
        where = ""
        if frames:
            last = frames[-1]
            code = f": `{last.line.strip()}`" if last.line else ""
            where = f" in `{last.name}`, line {last.lineno}{code}"  # in a notebook: the cell's line
        raise Wrong("raised", f"calling {name}({', '.join(map(short, arguments))}) raised "
                              f"{type(error).__name__}{where}:\n  {error}") from None


def compare(got, expected, tolerance: float, case: str) -> float:
    """The relative error of ``got`` against ``expected`` (a number, an array, or a tuple of them)."""
    if isinstance(expected, tuple):
        if not isinstance(got, (tuple, list)) or len(got) != len(expected):
            raise Wrong("kind", f"{case} should return {len(expected)} results (a tuple), got {short(got)}.")
        return max(compare(item, want, tolerance, f"{case}, result {index + 1} of {len(expected)}")
                   for index, (item, want) in enumerate(zip(got, expected)))
    expected = np.asarray(expected)
    got_array = as_numbers(got, case)
    if got_array.shape != expected.shape:
        swapped = got_array.ndim == 2 and got_array.shape == expected.shape[::-1]
        what = "a number" if expected.ndim == 0 else f"shape {expected.shape}"
        raise Wrong("shape", f"{case} returned shape {got_array.shape}; expected {what}"
                             + (": transposed?" if swapped else "."))
    check_dtype(got_array, expected, case)
    if expected.dtype == bool or np.issubdtype(expected.dtype, np.integer):
        wrong = np.argwhere(got_array != expected)
        if len(wrong):
            index = tuple(int(i) for i in wrong[0])
            raise Wrong("values", f"{case}: {len(wrong)} of {expected.size} wrong; the first at {index or 'the value'}: "
                                  f"got {got_array[index]}, expected {expected[index]}.")
        return 0.0
    if not np.all(np.isfinite(got_array)):
        index = tuple(int(i) for i in np.argwhere(~np.isfinite(got_array))[0])
        raise Wrong("not finite", f"{case} returned {got_array[index]} at {index or 'the value'}: "
                                  "look for a division by zero or an overflowing exp.")
    difference = np.abs(got_array.astype(np.float64) - expected)
    scale = max(float(np.max(np.abs(expected), initial=0.0)), np.finfo(np.float64).tiny)
    relative = float(np.max(difference, initial=0.0)) / scale
    if relative > tolerance:
        index = tuple(int(i) for i in np.argwhere(difference > tolerance * scale)[0])
        raise Wrong("values", f"{case}: wrong values, relative error {relative:.1e} (allowed {tolerance:.0e}); "
                              f"the first wrong element at {index or 'the value'}: got {got_array[index]:.6g}, "
                              f"expected {expected[index]:.6g}.")
    return relative


def as_numbers(got, case: str) -> np.ndarray:
    """``got`` as an array of numbers, or Wrong saying what it is instead (a string, a dict, a function...)."""
    try:
        array = np.asarray(got)
    except Exception:  # ragged lists and other things NumPy cannot make an array of
        raise Wrong("kind", f"{case} returned {short(got)}, which is not an array of numbers "
                            "(rows of different lengths?).") from None
    if not (array.dtype == bool or np.issubdtype(array.dtype, np.number)):
        raise Wrong("kind", f"{case} returned {short(got)}, not a number or an array of numbers.")
    return array


def check_dtype(got: np.ndarray, expected: np.ndarray, case: str) -> None:
    """Whole numbers where whole numbers are meant, fractions kept, float32 only where float32 is meant."""
    exact = expected.dtype == bool or np.issubdtype(expected.dtype, np.integer)
    if got.size == 0:  # an empty list has no dtype to speak of
        return
    if exact and got.dtype != bool and (expected.dtype == bool or not np.issubdtype(got.dtype, np.integer)):
        kind = "True/False values" if expected.dtype == bool else "whole numbers (integers)"
        raise Wrong("dtype", f"{case} returned {got.dtype} numbers; expected {kind}.")
    if not exact and not np.issubdtype(got.dtype, np.floating):
        raise Wrong("dtype", f"{case} returned {got.dtype} numbers; the answer has fractions: "
                             "did an integer division or an integer array lose them?")
    if not exact and np.finfo(got.dtype).bits < np.finfo(expected.dtype).bits:
        raise Wrong("dtype", f"{case} returned {got.dtype}; expected {expected.dtype}: "
                             "keep the precision of the inputs.")
    if not exact and expected.dtype == np.float32 and got.dtype != np.float32:
        raise Wrong("dtype", f"{case} returned {got.dtype}; expected float32 (half the memory of float64).")


def short(value) -> str:
    """A value in a few words: arrays by shape and dtype, small things as they print."""
    if isinstance(value, np.ndarray):
        return f"{value.shape} {value.dtype} array" if value.ndim else repr(value.item())
    if isinstance(value, (list, tuple)) and any(isinstance(item, np.ndarray) for item in value):
        inner = ", ".join(short(item) for item in value[:3]) + (", ..." if len(value) > 3 else "")
        return f"[{inner}]"
    if isinstance(value, (Number, list, tuple, str, type(None))):
        text = repr(value)
        return text if len(text) <= 60 else text[:57] + "..."
    return f"a {type(value).__name__}"
