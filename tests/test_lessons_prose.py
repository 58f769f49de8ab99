"""What can be checked mechanically about the lessons' prose: the series map in lesson 00 lists every lesson,
and every cell fits a classroom (issue 23): no output line wider than 100 characters (a projector shows
about that much), no code cell longer than 25 lines, no markdown cell longer than 150 words; and no
output that nbval compares is a timing (it would differ on the next run and on every other machine)."""

import re
from pathlib import Path

import nbformat
import pytest

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"
MAP_ROW = re.compile(r"^\|\s*\*\*(\d{2})\*\*", re.MULTILINE)  # a table row "| **07** the GPU | ... |"


def lesson_numbers_on_disk(folder: Path = NOTEBOOKS) -> set[str]:
    """The two-digit numbers of the lesson notebooks NN_*.ipynb in ``folder``."""
    return {path.name[:2] for path in folder.glob("[0-9][0-9]_*.ipynb")}


def lessons_in_map(cells) -> set[str]:
    """The lesson numbers in the rows of the series map: the markdown table whose rows start "| **NN**"."""
    return {number for cell in cells if cell.cell_type == "markdown" for number in MAP_ROW.findall(cell.source)}


def missing_from_map(cells, numbers) -> list[str]:
    """The lesson numbers of ``numbers`` that the map in ``cells`` leaves out, sorted."""
    return sorted(set(numbers) - lessons_in_map(cells))


def start_here_cells():
    return nbformat.read(NOTEBOOKS / "00_start_here.ipynb", 4).cells


def test_every_lesson_notebook_is_in_the_map_of_lesson_00():
    numbers = lesson_numbers_on_disk()
    assert len(numbers) >= 12, f"expected lessons 00 to 14 in {NOTEBOOKS}, found {sorted(numbers)}"
    assert missing_from_map(start_here_cells(), numbers) == [], "lesson 00's map leaves out these lessons"


def test_the_map_lists_no_lesson_that_does_not_exist():
    assert sorted(lessons_in_map(start_here_cells()) - lesson_numbers_on_disk()) == []


@pytest.mark.parametrize("removed", ["00", "07", "11"])
def test_the_check_notices_a_lesson_removed_from_the_map(removed):
    cells = start_here_cells()
    for cell in cells:
        if cell.cell_type == "markdown":
            cell.source = "\n".join(line for line in cell.source.splitlines()
                                    if not line.startswith(f"| **{removed}**"))
    assert missing_from_map(cells, lesson_numbers_on_disk()) == [removed]


def test_the_check_notices_a_new_notebook_missing_from_the_map(tmp_path):
    for name in ("00_start_here.ipynb", "14_asynchronous_sgd.ipynb", "99_new_lesson.ipynb"):
        (tmp_path / name).touch()
    assert missing_from_map(start_here_cells(), lesson_numbers_on_disk(tmp_path)) == ["99"]


def test_the_summary_under_the_map_names_the_last_lesson():
    last = max(lesson_numbers_on_disk())
    summaries = [cell.source for cell in start_here_cells()
                 if cell.cell_type == "markdown" and cell.source.startswith("Lessons 01")]
    assert len(summaries) == 1 and re.search(rf"\b{last}\b", summaries[0]), \
        f"lesson 00's summary of the series should say what lesson {last} does"


# -- classroom fitness -----------------------------------------------------------------------------

MAX_OUTPUT_WIDTH = 100  # characters of one output line
MAX_CODE_LINES = 25  # lines of one code cell
MAX_MARKDOWN_WORDS = 150  # words of one markdown cell
ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;]*m")
WORD = re.compile(r"\w")  # a word has a letter or a digit: table rules and bullets are not words


def all_notebooks(folder: Path = NOTEBOOKS) -> list[Path]:
    return sorted(folder.glob("[0-9][0-9]_*.ipynb"))


def output_lines(cell):
    """Every line a code cell's saved outputs show: streams and the text form of results."""
    for output in cell.get("outputs", []):
        text = output.get("text") or output.get("data", {}).get("text/plain", "")
        yield from ANSI_ESCAPE.sub("", "".join(text)).splitlines()


def wide_output_lines(cells, width: int = MAX_OUTPUT_WIDTH) -> list[tuple[int, int]]:
    """(cell index, characters) of each saved output line wider than ``width``."""
    return [(index, len(line)) for index, cell in enumerate(cells) if cell.cell_type == "code"
            for line in output_lines(cell) if len(line) > width]


def long_code_cells(cells, limit: int = MAX_CODE_LINES) -> list[tuple[int, int]]:
    """(cell index, lines) of each code cell longer than ``limit`` lines."""
    return [(index, len(cell.source.splitlines())) for index, cell in enumerate(cells)
            if cell.cell_type == "code" and len(cell.source.splitlines()) > limit]


def markdown_words(source: str) -> int:
    return sum(1 for token in source.split() if WORD.search(token))


def long_markdown_cells(cells, limit: int = MAX_MARKDOWN_WORDS) -> list[tuple[int, int]]:
    """(cell index, words) of each markdown cell longer than ``limit`` words."""
    return [(index, markdown_words(cell.source)) for index, cell in enumerate(cells)
            if cell.cell_type == "markdown" and markdown_words(cell.source) > limit]


@pytest.mark.parametrize("path", all_notebooks(), ids=lambda path: path.name[:2])
def test_every_cell_fits_a_classroom(path):
    cells = nbformat.read(path, 4).cells
    found = {f"output lines over {MAX_OUTPUT_WIDTH} characters": wide_output_lines(cells),
             f"code cells over {MAX_CODE_LINES} lines": long_code_cells(cells),
             f"markdown cells over {MAX_MARKDOWN_WORDS} words": long_markdown_cells(cells)}
    assert {limit: cells for limit, cells in found.items() if cells} == {}, \
        f"{path.name}: (cell index, size) of each cell over a classroom limit"


def synthetic_cells(code_lines: int, words: int, width: int, extra_line: str = ""):
    """A notebook's cells: one markdown cell of ``words`` words, one code cell of ``code_lines``
    lines whose output has a line of ``width`` characters (and ``extra_line`` after it)."""
    from nbformat.v4 import new_code_cell, new_markdown_cell, new_output
    code = new_code_cell("\n".join(f"x{line} = {line}" for line in range(code_lines)))
    code.outputs = [new_output("stream", name="stdout", text="x" * width + "\n" + extra_line)]
    return [new_markdown_cell(" ".join(["word"] * words) + "\n\n| a | b |\n|---|---|"), code]


def test_the_limits_hold_at_the_limit():
    cells = synthetic_cells(MAX_CODE_LINES, MAX_MARKDOWN_WORDS - 2, MAX_OUTPUT_WIDTH)
    assert (wide_output_lines(cells), long_code_cells(cells), long_markdown_cells(cells)) == ([], [], [])


def test_the_checks_notice_a_cell_one_over_each_limit():
    cells = synthetic_cells(MAX_CODE_LINES + 1, MAX_MARKDOWN_WORDS - 1, MAX_OUTPUT_WIDTH + 1)
    assert wide_output_lines(cells) == [(1, MAX_OUTPUT_WIDTH + 1)]
    assert long_code_cells(cells) == [(1, MAX_CODE_LINES + 1)]
    assert long_markdown_cells(cells) == [(0, MAX_MARKDOWN_WORDS + 1)]  # the table's two cells count too


def test_the_exercise_checkers_lines_are_held_to_the_width_too():
    verdict = "✗ 04.1 scatterv_counts: not written yet: it returns None. " + "x" * MAX_OUTPUT_WIDTH
    assert wide_output_lines(synthetic_cells(1, 1, 10, verdict)) == [(1, len(verdict))]


# -- no timing in the outputs nbval compares ---------------------------------------------------------

TIMING = re.compile(r"\b\d+(\.\d+)?\s?(s|ms|us|µs|[GM]B/s)\b")  # "0.58 s", "87 us", "11.98 GB/s"
# A stated deadline is a setting, not a measurement: "within 3 s", "after 3 s.", "the 20 s deadline".
DEADLINE = re.compile(r"\b(within|after) \d+ s\b|\b\d+ s deadline")


def compared(cell) -> bool:
    """Whether nbval compares this code cell's outputs (it does unless the cell says NBVAL_IGNORE_OUTPUT or NBVAL_SKIP)."""
    tags = cell.get("metadata", {}).get("tags", [])
    return not ("NBVAL_IGNORE_OUTPUT" in cell.source or "NBVAL_SKIP" in cell.source
                or "nbval-ignore-output" in tags or "nbval-skip" in tags)


def compared_timings(cells) -> list[tuple[int, str]]:
    """(cell index, line) of each compared output line that holds a time or a rate, deadlines aside.

    A verdict about a time ("...: True") is what a robust cell prints instead, and is allowed."""
    return [(index, line) for index, cell in enumerate(cells) if cell.cell_type == "code" and compared(cell)
            for line in output_lines(cell)
            if TIMING.search(DEADLINE.sub("", line)) and not line.rstrip().endswith(("True", "False"))]


@pytest.mark.parametrize("path", all_notebooks(), ids=lambda path: path.name[:2])
def test_no_compared_output_is_a_timing(path):
    assert compared_timings(nbformat.read(path, 4).cells) == [], \
        f"{path.name}: print a verdict or a rounded fact instead, or tag the cell NBVAL_IGNORE_OUTPUT with a reason"


@pytest.mark.parametrize("line, source_start, flagged", [
    ("epoch 0.58 s; communicate 2.03 ms", "", True),
    ("1/beta 11.98 GB/s", "", True),
    ("epoch 0.58 s", "# NBVAL_IGNORE_OUTPUT\n", False),
    ("rank 1 did not arrive in Barrier within 3 s (rank 0 waited there).", "", False),
    ("stopped long before the 20 s deadline: True", "", False),
    ("rank 0 waited 0.6 s for the others", "", True),
])
def test_the_timing_check_tells_a_measurement_from_a_setting(line, source_start, flagged):
    from nbformat.v4 import new_code_cell, new_output
    cell = new_code_cell(source_start + "print(line)")
    cell.outputs = [new_output("stream", name="stdout", text=line + "\n")]
    assert compared_timings([cell]) == ([(0, line)] if flagged else [])


# -- every MPI lesson runs at the rank count its header and TEACHING name ------------------------------
# nbval runs each notebook top to bottom at the count its own start(n=N) asks for, and every check in it
# must hold there. TEACHING tells teachers to keep "the lesson's own number of ranks", and each lesson's
# header says how many it needs; this ties the three together, so that no recommended count is one that
# was never run.

STARTED = re.compile(r"\bstart\(n=(\d+)\)")  # cluster.start(n=4) in a code cell
NEEDS = re.compile(r"\*\*This lesson needs\*\* (\d+) MPI ranks")
TEACHING = NOTEBOOKS.parent / "TEACHING.md"
TEACHING_COUNTS = re.compile(r"the lesson's own number of ranks \(([^)]*)\)")  # "(04 and 05: 4; 08 and 09: 2; 10: 3)"


def rank_counts_started(cells) -> set[int]:
    return {int(n) for cell in cells if cell.cell_type == "code" for n in STARTED.findall(cell.source)}


def rank_counts_needed(cells) -> set[int]:
    return {int(n) for cell in cells if cell.cell_type == "markdown" for n in NEEDS.findall(cell.source)}


def rank_counts_in_teaching(text: str) -> dict[str, int]:
    """{"04": 4, ...} from TEACHING's sentence "(04 and 05: 4; 08 and 09: 2; 10: 3)"."""
    found = TEACHING_COUNTS.search(text.replace("\n", " "))
    assert found, "TEACHING.md should name each cluster lesson's own number of ranks"
    counts = {}
    for part in found.group(1).split(";"):
        lessons, count = part.rsplit(":", 1)
        counts.update({lesson: int(count) for lesson in re.findall(r"\d{2}", lessons)})
    return counts


def clusters_of_lessons(folder: Path = NOTEBOOKS) -> dict[str, tuple[set[int], set[int]]]:
    """{"04": (counts started, counts the header needs)} of every notebook that starts a cluster."""
    found = {}
    for path in all_notebooks(folder):
        cells = nbformat.read(path, 4).cells
        if rank_counts_started(cells):
            found[path.name[:2]] = (rank_counts_started(cells), rank_counts_needed(cells))
    return found


def rank_count_disagreements(lessons, teaching: dict[str, int]) -> list[str]:
    problems = []
    for number, (started, needed) in sorted(lessons.items()):
        if len(started) != 1 or started != needed or teaching.get(number) not in started:
            problems.append(f"{number}: starts {sorted(started)}, header needs {sorted(needed)}, "
                            f"TEACHING says {teaching.get(number)}")
    return problems + [f"{number}: in TEACHING but starts no cluster" for number in sorted(set(teaching) - set(lessons))]


def test_each_cluster_lesson_runs_at_the_count_its_header_and_teaching_name():
    lessons = clusters_of_lessons()
    assert {"04", "06", "09", "10", "11", "13"} <= set(lessons), sorted(lessons)
    assert rank_count_disagreements(lessons, rank_counts_in_teaching(TEACHING.read_text())) == []


def test_the_rank_count_check_notices_a_fallback_count():
    lessons = clusters_of_lessons()
    teaching = rank_counts_in_teaching(TEACHING.read_text())
    assert rank_count_disagreements(lessons, {**teaching, "04": 2}) == ["04: starts [4], header needs [4], TEACHING says 2"]
    changed = {**lessons, "13": ({2}, lessons["13"][1])}
    assert rank_count_disagreements(changed, teaching) == ["13: starts [2], header needs [3], TEACHING says 3"]


# -- one notation, in lesson 00 and in TEACHING ---------------------------------------------------------

def notation_rows(markdown: str) -> list[str]:
    """The rows "| $N$ | ... |" of the table under the heading "## Notation" in ``markdown``."""
    section = markdown.split("## Notation", 1)[1].split("\n## ", 1)[0]
    return [line.strip() for line in section.splitlines() if line.startswith("| $")]


def test_lesson_00_and_teaching_give_the_same_notation_table():
    markdown = "\n\n".join(cell.source for cell in start_here_cells() if cell.cell_type == "markdown")
    rows = notation_rows(markdown)  # the section may span cells (each within the classroom's words per cell)
    assert len(rows) >= 8 and rows == notation_rows(TEACHING.read_text())
    symbols = [symbol for row in rows for symbol in re.findall(r"\$([^$]+)\$", row.split("|")[1])]
    assert len(symbols) == len(set(symbols)), f"a symbol listed twice: {symbols}"


def test_the_browser_tests_key_results_are_in_the_saved_notebooks():
    """Each key result the browser test looks for after Run All is in the saved notebook (nbval holds the saved
    outputs), so a lesson whose output changed cannot leave the browser test looking for an old line."""
    from test_browser import KEY_RESULTS

    for name, key in KEY_RESULTS.items():
        cells = nbformat.read(NOTEBOOKS / name, as_version=4).cells
        shown = "".join(output.get("text", "") + output.get("data", {}).get("text/plain", "")
                        for cell in cells if cell.cell_type == "code" for output in cell.get("outputs", []))
        assert key in shown, f"{name}: the browser test looks for {key!r}, which its saved outputs do not show"
