"""The package read lesson by lesson: every module says its lesson, and none imports a later lesson.

These read the source (tests/layout.py); they run nothing of nnlib.
"""

import shutil

from layout import (PACKAGE, closure, constant, functions, imports, lesson_folders, lesson_of, long_modules, modules,
                    violations)

TOP_LEVEL = {"nnlib", "nnlib.__main__", "nnlib.train_command", "nnlib.check"}
JOB_PARTS = {f"nnlib.train_command.{part}" for part in ("options", "job", "data_parallel", "reports")}


def test_every_module_says_which_lesson_it_belongs_to():
    missing = [name for name, path in modules().items() if not isinstance(lesson_of(path), int)]
    assert not missing, f"modules without a top-level 'LESSON = N' (N the notebook's number): {missing}"
    lessons = {name: lesson_of(path) for name, path in modules().items()}
    assert all(0 <= lesson <= 19 for lesson in lessons.values()), lessons


def test_modules_only_the_notebooks_use_say_so():
    """NOTEBOOKS_ONLY = True: no nnlib module imports it (the command line may); every other module is imported
    by one (the package itself, its command line and the exercises, which check loads by lesson, aside)."""
    known = modules()
    imported = {user: imports(user, path, known) for user, path in known.items()}  # each module read once
    texts = {user: path.read_text() for user, path in known.items()}
    users = {name: {user for user in known if name in imported[user]} for name in known}
    marked = {name for name, path in known.items() if constant(path, "NOTEBOOKS_ONLY") is True}
    assert {name: users[name] for name in marked if users[name] - {"nnlib.__main__"}} == {}
    for name in known:  # a module that another has the engines (or the controller) load is named in a string
        users[name] |= {user for user, text in texts.items() if user != name
                        and (f"'{name}'" in text or f'"{name}"' in text)}
    unused = {name for name in known if not users[name]} - {"nnlib", "nnlib.__main__", "nnlib.course"} - set(lesson_folders())
    assert sorted(name for name in unused - marked if not name.startswith("nnlib.exercises.")) == []


def test_each_lesson_has_its_own_folder_named_after_its_notebook():
    """nnlib/lessonNN_<topic>/ holds the code of lesson NN, and only that; notebook NN exists. What stays at the
    top is the package's face (lessons 01-03's names), the course's tools (lesson 00) and the command line."""
    notebooks = {int(path.name[:2]) for path in (PACKAGE.parent / "notebooks").glob("[0-9][0-9]_*.ipynb")}
    folders = lesson_folders()
    assert sorted(folders.values()) == sorted(notebooks - {0}), folders
    for name, path in modules().items():
        folder = ".".join(name.split(".")[:2])
        if folder in folders:
            assert lesson_of(path) == folders[folder], f"{name} says lesson {lesson_of(path)}, its folder another"
        elif not name.startswith(("nnlib.exercises", "nnlib.course")):
            assert name in TOP_LEVEL | JOB_PARTS, f"{name} is at the top of the package; move it into its lesson's folder"


def test_the_course_tools_import_no_lesson_and_any_lesson_may_use_them():
    """nnlib/course/ (cluster, deadline, reaper, trace, environment, ...) is the course's infrastructure, not a lesson:
    its modules say LESSON = 0 and import nothing of nnlib outside nnlib.course."""
    known = modules()
    course = {name: path for name, path in known.items() if name.startswith("nnlib.course")}
    assert {"nnlib.course.cluster", "nnlib.course.deadline", "nnlib.course.environment"} <= set(course)
    assert {name: lesson_of(path) for name, path in course.items() if lesson_of(path) != 0} == {}
    outside = {name: sorted(m for m in imports(name, path, known) if not m.startswith("nnlib.course"))
               for name, path in course.items()}
    assert {name: found for name, found in outside.items() if found} == {}


def test_no_module_imports_a_module_of_a_later_lesson():
    assert violations() == []


def test_an_import_of_a_later_lesson_added_on_purpose_is_caught(tmp_path):
    copy = tmp_path / "nnlib"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    network = copy / "lesson02_network" / "network.py"
    network.write_text(network.read_text() + "\n\ndef later():\n    from nnlib.lesson13_faults.watchdog import RunNotes\n")
    added = set(violations(copy)) - set(violations())
    assert added == {"nnlib.lesson02_network.network (lesson 2) imports nnlib.lesson13_faults.watchdog (lesson 13)"}


def test_no_function_is_longer_than_60_lines_or_takes_more_than_8_parameters():
    too_big = [f"{module}.{name}: {lines} lines, {parameters} parameters"
               for module, name, lines, parameters in functions() if lines > 60 or parameters > 8]
    assert not too_big, too_big


def test_every_module_can_be_read_in_one_sitting():
    """At most 500 lines a file (picotron's rule of thumb): a longer one is split by what its parts do."""
    assert long_modules(500) == {}, "split these modules into files a reader finishes in one sitting"


def test_the_code_a_lesson_05_reader_opens_is_at_most_900_lines_in_at_most_6_modules():
    """nnlib.lesson06_data_parallel.data_parallel (train_parallel and its syncs) and every nnlib module it imports, transitively."""
    opened = closure("nnlib.lesson06_data_parallel.data_parallel")
    lines = {name: len(modules()[name].read_text().splitlines()) for name in opened}
    assert len(opened) <= 6 and sum(lines.values()) <= 900, lines
    assert all(lesson_of(modules()[name]) <= 6 for name in opened), lines


def test_the_size_checks_can_fail(tmp_path):
    copy = tmp_path / "nnlib"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    body = "".join(f"    x{line} = {line}\n" for line in range(60))
    training = copy / "lesson03_training" / "training.py"
    training.write_text(training.read_text()
                                      + f"\n\ndef long(a, b, c, d, e, f, g, h, i):\n{body}" + "# one more line\n" * 100)
    assert [(name, lines, parameters) for module, name, lines, parameters in functions(copy) if name == "long"] \
        == [("long", 61, 9)]
    assert long_modules(500, copy) == {"nnlib.lesson03_training.training": len(training.read_text().splitlines())}
    opened = closure("nnlib.lesson06_data_parallel.data_parallel", copy)  # the long function lands in lesson 06's reading
    assert sum(len((copy / f"{name.replace('nnlib.', '').replace('.', '/')}.py").read_text().splitlines())
               for name in opened) > 900
