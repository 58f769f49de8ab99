"""Build the series as a static HTML book: `make book` (or python book/build.py [OUTPUT]).

Stages the notebooks, the README (whose introduction is the front page) and the API pages in
build/book-src/, then runs sphinx-build into build/book/ (or OUTPUT). Nothing is downloaded and
no notebook is executed: the pages show the outputs saved in the notebooks, which nbval tests.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# The folders (one per lesson, the exercises, and the batch job's train_command): their docstrings say
# what is inside; their modules follow.
PACKAGES = {path.parent.name for path in (ROOT / "nnlib").glob("*/__init__.py")}
HIDDEN = ("__main__", "exercises.lesson_")  # the command line; the worked answers (check.solution prints them)


def modules_by_lesson() -> list[tuple[int, str]]:
    """(lesson, module) of every nnlib module, in lesson order: each says its lesson (``LESSON = N``)."""
    import importlib

    found = []
    for path in sorted((ROOT / "nnlib").rglob("*.py")):
        name = ".".join(path.relative_to(ROOT / "nnlib").with_suffix("").parts).removesuffix(".__init__")
        if name != "__init__" and not name.startswith(HIDDEN):
            found.append((importlib.import_module(f"nnlib.{name}").LESSON, name))
    return sorted(found)


def front_page() -> str:
    """The README up to its first section after the introduction, and the table of contents."""
    readme = (ROOT / "README.md").read_text()
    introduction = readme.split("\n## ", 1)[0]
    notebooks = sorted(path.stem for path in (ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    toc = "\n".join(["```{toctree}", ":maxdepth: 1", ":caption: The lessons", "", *notebooks, "```", "",
                     "```{toctree}", ":maxdepth: 1", ":caption: The package", "", "api", "```", "",
                     "```{toctree}", ":maxdepth: 1", ":caption: For teachers", "", "teaching", "```"])
    return introduction + "\n\n" + toc + "\n"


def api_page() -> str:
    parts = ["# The `nnlib` package", "", "Every lesson imports its tools from these modules, here in lesson order; "
             "each docstring gives the math and the array shapes.", ""]
    lesson_before = None
    for lesson, module in modules_by_lesson():
        if lesson != lesson_before:
            parts += [f"## Lesson {lesson:02d}", ""]
            lesson_before = lesson
        members = [] if module in PACKAGES else ["   :members:"]
        parts += [f"### `nnlib.{module}`", "", "```{eval-rst}", f".. automodule:: nnlib.{module}", *members, "```", ""]
    return "\n".join(parts)


def build(output: Path) -> Path:
    source = ROOT / "build" / "book-src"
    shutil.rmtree(source, ignore_errors=True)
    source.mkdir(parents=True)
    shutil.copy(ROOT / "book" / "conf.py", source / "conf.py")
    for notebook in (ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"):
        shutil.copy(notebook, source / notebook.name)
    (source / "index.md").write_text(front_page())
    (source / "api.md").write_text(api_page())
    shutil.copy(ROOT / "TEACHING.md", source / "teaching.md")
    shutil.rmtree(output, ignore_errors=True)
    command = [sys.executable, "-m", "sphinx", "-b", "html", "-q", "-W", "--keep-going", str(source), str(output)]
    environment = {"NNLIB_SOURCE": str(ROOT)}
    import os

    subprocess.run(command, check=True, env=dict(os.environ, **environment))
    return output


if __name__ == "__main__":
    target = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "build" / "book"
    print(f"the book is in {build(target.resolve())}/index.html")
