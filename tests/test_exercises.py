"""The lessons' exercises: every worked solution passes its check, every untouched exercise fails it with
"not written yet", half-finished answers get the message meant for them, and the references are right."""

import importlib.util
from pathlib import Path

import nbformat
import numpy as np
import pytest

from nnlib.check import check, verdict
from nnlib.exercises import EXERCISES, lesson_exercises, reference_layer_backward, reference_ring_step
from nnlib.network import sigmoid

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))


def solutions(lesson: str):
    """The module solutions/<lesson>_*.py (its name starts with a digit: loaded from its path)."""
    [path] = (ROOT / "solutions").glob(f"{lesson}_*.py")
    spec = importlib.util.spec_from_file_location(f"solutions_{lesson}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def defined(source: str, name: str):
    namespace = {"np": np}
    exec(source, namespace)
    return namespace[name]


@pytest.mark.parametrize("key", sorted(EXERCISES))
def test_the_worked_solution_passes_its_check(key):
    exercise = EXERCISES[key]
    result = verdict(key, getattr(solutions(key[:2]), exercise.function))
    assert result.passed, result.message
    assert result.message.startswith(f"✓ {key} {exercise.function}: right")


@pytest.mark.parametrize("key", sorted(EXERCISES))
def test_the_untouched_exercise_fails_with_not_written_yet_and_a_hint(key):
    exercise = EXERCISES[key]
    result = verdict(key, defined(exercise.template(), exercise.function))
    assert not result.passed and result.reason == "not written"
    assert "not written yet: it returns None. Replace the `...` with your code" in result.message
    assert f"Hint: {exercise.hint}" in result.message


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda path: path.stem)
def test_every_lesson_ends_with_its_exercises_each_followed_by_its_check(notebook):
    """2 to 4 exercises per lesson; the notebook's cells are the registry's templates, unsolved, each
    followed by a sentence and its check cell, whose saved output is the "not written yet" verdict."""
    exercises = lesson_exercises(notebook.name[:2])
    assert 2 <= len(exercises) <= 4
    cells = nbformat.read(notebook, 4).cells
    exercise_cells = [index for index, cell in enumerate(cells) if "exercise" in cell.metadata.get("tags", [])]
    assert len(exercise_cells) == len(exercises)
    assert any(cell.source.startswith("## Exercises") for cell in cells[:exercise_cells[0]])
    for index, exercise in zip(exercise_cells, exercises):
        assert cells[index].source == exercise.template()
        assert cells[index - 1].cell_type == "markdown" and cells[index + 1].cell_type == "markdown"
        check_cell = cells[index + 2]
        assert check_cell.source == f'check("{exercise.key}", {exercise.function})'
        saved = "".join(output.get("text", "") for output in check_cell.outputs)
        assert saved == verdict(exercise.key, defined(exercise.template(), exercise.function)).message + "\n"


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda path: path.stem)
def test_a_sentence_comes_before_every_code_cell(notebook):
    cells = nbformat.read(notebook, 4).cells
    for index, cell in enumerate(cells):
        if cell.cell_type == "code":
            assert index > 0 and cells[index - 1].cell_type == "markdown" and cells[index - 1].source.strip(), \
                f"{notebook.name}: code cell {index} has no sentence before it:\n{cell.source[:200]}"


def forward_right(inputs, weights, biases):
    return sigmoid(inputs @ weights + biases)


def backward_without_return(inputs, weights, activations, grad_activations):
    delta = grad_activations * activations * (1 - activations)  # noqa: F841 (half-finished on purpose)


def backward_name_error(inputs, weights, activations, grad_activations):
    delta = grad_activations * activations * (1 - activations)
    return inputs.T @ delt, delta.sum(axis=0), delta @ weights.T  # noqa: F821 (a typo, on purpose)


def backward_wrong_derivative(inputs, weights, activations, grad_activations):
    delta = grad_activations * sigmoid(activations) * (1 - sigmoid(activations))
    return inputs.T @ delta, delta.sum(axis=0), delta @ weights.T


HALF_FINISHED = [
    ("02.1", ..., "not written", "`layer_forward` is still Ellipsis"),
    ("02.1", None, "not written", "`layer_forward` is still None"),
    ("02.1", 3.0, "not a function", "it is a float (3.0)"),
    ("02.1", lambda x, w, b: ..., "not written", "it returns `...`"),
    ("02.1", lambda x, w: x @ w, "raised", "raised TypeError"),
    ("02.1", lambda x, w, b: exit(), "raised", "raised SystemExit"),
    ("02.1", lambda x, w, b: (row for row in x), "kind", "not a number or an array of numbers"),
    ("02.1", lambda x, w, b: forward_right(x, w, b).T, "shape", "expected shape (5, 3): transposed?"),
    ("02.1", lambda x, w, b: forward_right(x, w, b)[:, 0], "shape", "returned shape (5,); expected shape (5, 3)."),
    ("02.1", lambda x, w, b: forward_right(x, w, b).astype(np.float32), "dtype", "keep the precision"),
    ("02.1", lambda x, w, b: forward_right(x, w, b).tolist(), "right", ""),  # a list of rows is fine
    ("02.1", lambda x, w, b: "sigmoid", "kind", "returned 'sigmoid', not a number or an array"),
    ("02.1", lambda x, w, b: [[1.0], [2.0, 3.0]], "kind", "rows of different lengths?"),
    ("02.1", lambda x, w, b: (x @ w + b) / 0.0, "not finite", "returned -inf at (0, 0)"),
    ("02.1", lambda x, w, b: sigmoid(x @ w), "values", "the first wrong element at (0, 0)"),
    ("02.2", backward_without_return, "not written", "it returns None"),
    ("02.2", backward_name_error, "raised", "raised NameError in `backward_name_error`, line"),
    ("02.2", lambda x, w, a, g: (x.T @ g, g.sum(axis=0)), "kind", "should return 3 results (a tuple)"),
    ("02.2", backward_wrong_derivative, "values", "result 1 of 3: wrong values, relative error"),
    ("03.2", lambda p, labels: int(np.sum(p.argmax(axis=1) == labels)), "dtype", "the answer has fractions"),
    ("04.1", lambda rows, ranks, length: ([rows // ranks] * ranks, [0] * ranks), "values",
     "scatterv_counts(10, 3, 4), result 1 of 2: 3 of 3 wrong; the first at (0,): got 3, expected 16."),
    ("04.1", lambda rows, ranks, length: (np.full(ranks, rows / ranks), np.zeros(ranks)), "dtype",
     "expected whole numbers (integers)"),
    ("06.1", lambda ranks, s: 1 / (s + (1 - s) // ranks), "values", "relative error"),
    ("07.2", lambda m, k, n, cpu, gpu, link: 1, "dtype", "expected True/False values"),
    ("09.2", lambda hidden, weights, b: sum(h @ w + b for h, w in zip(hidden, weights)), "values", "wrong values"),
    ("10.1", lambda arrived, size: [], "shape", "missing_ranks([0, 2], 3) returned shape (0,); expected shape (1,)"),
    ("10.1", lambda arrived, size: [0], "values", "got 0, expected 1"),
    ("99.9", forward_right, "unknown", "there is no exercise '99.9'"),
]


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the division by zero below is on purpose
@pytest.mark.parametrize("key, answer, reason, fragment", HALF_FINISHED)
def test_a_half_finished_answer_gets_a_helpful_message_and_check_never_raises(key, answer, reason, fragment, capsys):
    result = verdict(key, answer)
    assert result.reason == reason, result.message
    assert result.passed == (reason == "right")
    assert fragment in result.message
    if reason not in ("right", "unknown"):
        assert "\n  Hint: " in result.message
    check(key, answer)  # prints the same verdict, raises nothing
    assert capsys.readouterr().out == result.message + "\n"


def test_an_answer_that_changes_its_arguments_cannot_spoil_the_reference():
    def scribbling_forward(inputs, weights, biases):
        result = sigmoid(inputs @ weights + biases)
        inputs *= 100
        weights[...] = 0
        return result

    assert verdict("02.1", scribbling_forward).passed


def test_the_layer_backward_reference_matches_finite_differences():
    """The check's own formula against the derivative of J = sum(g * sigma(a_prev W + b)) by central differences."""
    generator = np.random.default_rng(0)
    inputs, weights, biases = generator.normal(size=(4, 3)), generator.normal(size=(3, 2)), generator.normal(size=2)
    upstream = generator.normal(size=(4, 2))

    def cost(x, w, b):
        return np.sum(upstream * sigmoid(x @ w + b))

    analytic = reference_layer_backward(inputs, weights, sigmoid(inputs @ weights + biases), upstream)
    for array, gradient in zip((weights, biases, inputs), analytic):
        numeric = np.zeros_like(array)
        for index in np.ndindex(array.shape):
            saved = array[index]
            array[index] = saved + 1e-6
            plus = cost(inputs, weights, biases)
            array[index] = saved - 1e-6
            minus = cost(inputs, weights, biases)
            array[index] = saved
            numeric[index] = (plus - minus) / 2e-6
        assert np.abs(numeric - gradient).max() / np.abs(gradient).max() < 1e-7


@pytest.mark.parametrize("ranks, length", [(2, 5), (3, 7), (4, 10)])
def test_ring_steps_leave_each_rank_its_complete_chunk(ranks, length):
    """P - 1 reference ring steps: chunk r of rank r's buffer is the sum over all ranks, as in nnlib.allreduce."""
    from nnlib.allreduce import chunk_bounds

    buffers = np.random.default_rng(1).normal(size=(ranks, length))
    after = buffers
    for step in range(ranks - 1):
        after = reference_ring_step(after, step)
    counts, starts = chunk_bounds(length, ranks)
    total = buffers.sum(axis=0)
    for rank in range(ranks):
        part = slice(starts[rank], starts[rank] + counts[rank])
        assert np.allclose(after[rank, part], total[part], rtol=1e-12, atol=0)


def test_every_lesson_has_a_solutions_file_and_no_more():
    lessons = sorted({key[:2] for key in EXERCISES})
    assert lessons == [path.name[:2] for path in NOTEBOOKS]
    assert sorted(path.name[:2] for path in (ROOT / "solutions").glob("*.py")) == lessons
