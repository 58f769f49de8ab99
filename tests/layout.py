"""Reading nnlib's structure from its source: each module's lesson, its imports, and its functions.

Every module of nnlib says which lesson it belongs to with a line ``LESSON = N`` (N = 0..18, the
notebook's number). The code of lesson N may import modules of lessons up to N, never a later one,
whether the import is at the top of the module or inside a function.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "nnlib"


def modules(root: Path = PACKAGE) -> dict[str, Path]:
    """{dotted name: path} of every module under ``root`` (a package's __init__ under its package's name)."""
    found = {}
    for path in sorted(root.rglob("*.py")):
        parts = (root.name, *path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def lesson_folders(root: Path = PACKAGE) -> dict[str, int]:
    """{package: N} of every lesson folder, nnlib/lessonNN_<topic>/."""
    return {f"{root.name}.{path.name}": int(path.name[6:8]) for path in sorted(root.glob("lesson[0-9][0-9]_*"))
            if path.is_dir()}


def constant(path: Path, name: str):
    """The value of the module's top-level ``name = <constant>``, or None."""
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == [name]:
            return node.value.value if isinstance(node.value, ast.Constant) else None
    return None


def lesson_of(path: Path) -> int | None:
    """The N of the module's top-level ``LESSON = N``, or None."""
    return constant(path, "LESSON")


def imports(name: str, path: Path, known) -> set[str]:
    """The modules of ``known`` that module ``name`` imports, anywhere in its code."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            for alias in node.names:  # "from . import x" imports module x; "from .x import f" imports x
                found.update([m for m in (f"{base}.{alias.name}", base) if m in known][:1])
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name in known)
    found.discard(name)
    return found


def violations(root: Path = PACKAGE) -> list[str]:
    """'a (lesson 4) imports b (lesson 13)' for every import of a later lesson's module."""
    known = modules(root)
    lessons = {name: lesson_of(path) for name, path in known.items()}
    found = []
    for name, path in known.items():
        for other in sorted(imports(name, path, known)):
            if lessons[other] is not None and lessons[name] is not None and lessons[other] > lessons[name]:
                found.append(f"{name} (lesson {lessons[name]}) imports {other} (lesson {lessons[other]})")
    return found


def closure(name: str, root: Path = PACKAGE) -> set[str]:
    """``name`` and every module it imports, transitively."""
    known = modules(root)
    seen, todo = set(), [name]
    while todo:
        current = todo.pop()
        if current not in seen:
            seen.add(current)
            todo.extend(imports(current, known[current], known))
    return seen


def functions(root: Path = PACKAGE):
    """(module, function name, lines, parameters) of every function and method; self and cls not counted."""
    for name, path in modules(root).items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                arguments = node.args
                named = arguments.posonlyargs + arguments.args + arguments.kwonlyargs
                count = len(named) + bool(arguments.vararg) + bool(arguments.kwarg)
                if named and named[0].arg in ("self", "cls"):
                    count -= 1
                yield name, node.name, node.end_lineno - node.lineno + 1, count


def long_modules(limit: int, root: Path = PACKAGE) -> dict[str, int]:
    """{dotted name: lines} of the modules under ``root`` longer than ``limit`` lines."""
    lengths = {name: len(path.read_text().splitlines()) for name, path in modules(root).items()}
    return {name: lines for name, lines in lengths.items() if lines > limit}
