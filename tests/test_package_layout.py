"""The package read lesson by lesson: every module says its lesson, and none imports a later lesson.

These read the source (tests/layout.py); they run nothing of nnlib.
"""

import shutil

from layout import PACKAGE, lesson_of, modules, violations


def test_every_module_says_which_lesson_it_belongs_to():
    missing = [name for name, path in modules().items() if not isinstance(lesson_of(path), int)]
    assert not missing, f"modules without a top-level 'LESSON = N' (N the notebook's number): {missing}"
    lessons = {name: lesson_of(path) for name, path in modules().items()}
    assert all(0 <= lesson <= 11 for lesson in lessons.values()), lessons


def test_no_module_imports_a_module_of_a_later_lesson():
    assert violations() == []


def test_an_import_of_a_later_lesson_added_on_purpose_is_caught(tmp_path):
    copy = tmp_path / "nnlib"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    network = copy / "network.py"
    network.write_text(network.read_text() + "\n\ndef later():\n    from .watchdog import watch  # lesson 10\n")
    added = set(violations(copy)) - set(violations())
    assert added == {"nnlib.network (lesson 2) imports nnlib.watchdog (lesson 10)"}
