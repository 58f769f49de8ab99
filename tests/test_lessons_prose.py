"""What can be checked mechanically about the lessons' prose: the series map in lesson 00 lists every lesson."""

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
    assert len(numbers) >= 12, f"expected lessons 00 to 11 in {NOTEBOOKS}, found {sorted(numbers)}"
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
    for name in ("00_start_here.ipynb", "11_beyond_synchronous_sgd.ipynb", "12_new_lesson.ipynb"):
        (tmp_path / name).touch()
    assert missing_from_map(start_here_cells(), lesson_numbers_on_disk(tmp_path)) == ["12"]


def test_the_summary_under_the_map_names_the_last_lesson():
    last = max(lesson_numbers_on_disk())
    summaries = [cell.source for cell in start_here_cells()
                 if cell.cell_type == "markdown" and cell.source.startswith("Lessons 01")]
    assert len(summaries) == 1 and re.search(rf"\b{last}\b", summaries[0]), \
        f"lesson 00's summary of the series should say what lesson {last} does"
