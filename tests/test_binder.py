"""Binder builds what the series needs: every module the notebooks and nnlib import is provided by
binder/environment.yml (directly, or as a dependency of what it lists), and binder/postBuild works in
a fresh virtual environment standing in for repo2docker's."""

import ast
import json
import os
import re
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from test_environment_files import environment_pins

ROOT = Path(__file__).resolve().parent.parent
# Imported only by code that says it needs them, each with its extra: not part of the series on Binder.
OPTIONAL = {"cupy": "the GPU extra (lesson 08 runs without it)", "torch": "the benchmark extra (make benchmark)"}


def imported_modules(source: str) -> set[str]:
    modules = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            modules |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            modules.add(node.module.split(".")[0])
    return modules


def series_imports() -> dict[str, str]:
    """{top-level module: where it is imported} for nnlib's modules and every notebook's code cells."""
    found = {}
    for path in sorted((ROOT / "nnlib").rglob("*.py")):
        for module in imported_modules(path.read_text()):
            found.setdefault(module, str(path.relative_to(ROOT)))
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        for cell in json.loads(path.read_text())["cells"]:
            if cell["cell_type"] == "code":
                code = "\n".join(line for line in "".join(cell["source"]).splitlines()
                                 if not line.lstrip().startswith(("%", "!")))
                for module in imported_modules(code):
                    found.setdefault(module, str(path.relative_to(ROOT)))
    return {module: where for module, where in found.items()
            if module not in sys.stdlib_module_names and module != "nnlib"}


def closure(names) -> set[str]:
    """The distributions named and, transitively, everything they require (as installed here)."""
    seen, todo = set(), [re.sub(r"[-_.]+", "-", name).lower() for name in names]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        try:
            requirements = metadata.requires(name) or []
        except metadata.PackageNotFoundError:
            continue
        for line in requirements:
            requirement = Requirement(line)
            if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
                todo.append(re.sub(r"[-_.]+", "-", requirement.name).lower())
    return seen


def test_every_module_the_series_imports_comes_with_binders_environment():
    pins, _ = environment_pins(ROOT / "binder" / "environment.yml")
    provided = closure(set(pins) - {"python", "pip"})
    distributions = metadata.packages_distributions()
    missing = []
    for module, where in series_imports().items():
        if module in OPTIONAL:
            continue
        names = {re.sub(r"[-_.]+", "-", name).lower() for name in distributions.get(module, [module])}
        if not names & provided:
            missing.append(f"{module} (imported in {where}, from {sorted(names)})")
    assert not missing, "binder/environment.yml does not provide: " + "; ".join(missing)


def test_the_check_sees_imports_and_would_catch_a_missing_one():
    found = series_imports()
    assert {"numpy", "mpi4py", "matplotlib", "ipyparallel"} <= set(found)
    assert "os" not in found and "nnlib" not in found
    assert "requests" not in closure(["numpy"])  # a module nobody provides would be reported


def test_post_build_succeeds_in_a_fresh_environment(tmp_path):
    """binder/environment.yml's pins installed into a new venv (conda is not here), then postBuild in a
    copy of the repository: nnlib installs, MNIST is found ($NNLIB_DATA), and every module the series
    imports can be imported there. uv resolves and installs the pins (with pip this test took 92 of
    make test's 1,691 worker-seconds, with uv about 10); postBuild itself runs the venv's pip, as on Binder."""
    from uv import find_uv_bin  # (make test's environment has it: pyproject's test extra)

    pins, _ = environment_pins(ROOT / "binder" / "environment.yml")
    venv = tmp_path / "binder-venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    wanted = [f"{name}=={version}" for name, version in pins.items() if name not in ("python", "pip")]
    install = subprocess.run([find_uv_bin(), "pip", "install", "--quiet", "--python", str(python), *wanted],
                             capture_output=True, text=True, timeout=900)
    assert install.returncode == 0, install.stderr[-3000:]
    copy = tmp_path / "repository"
    shutil.copytree(ROOT, copy, ignore=shutil.ignore_patterns(".venv", "build", ".git", "*.egg-info", "__pycache__"))
    environment = dict(os.environ, PATH=f"{venv / 'bin'}:{os.environ['PATH']}")
    environment.pop("PYTHONPATH", None)
    build = subprocess.run(["bash", "binder/postBuild"], cwd=copy, capture_output=True, text=True, timeout=600,
                           env=environment)
    assert build.returncode == 0, build.stdout[-2000:] + build.stderr[-3000:]
    modules = sorted(set(series_imports()) - set(OPTIONAL))
    check = subprocess.run([str(python), "-c", f"import nnlib, {', '.join(modules)}; print('imported')"],
                           capture_output=True, text=True, timeout=300, env=environment, cwd=tmp_path)
    assert check.returncode == 0 and "imported" in check.stdout, check.stderr[-3000:]
