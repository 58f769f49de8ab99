"""pyproject.toml, environment.yml and binder/environment.yml name the same dependencies,
and every exact pin in the environment files satisfies pyproject's lower bound."""

import re
import tomllib
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.version import Version

ROOT = Path(__file__).resolve().parent.parent


def pyproject_requirements():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return {Requirement(line).name.lower(): Requirement(line) for line in project["dependencies"]}


def environment_pins(path):
    """{name: version} from a conda environment file: conda 'name=version' and pip 'name==version'."""
    dependencies = yaml.safe_load(path.read_text())["dependencies"]
    pins, installs_package = {}, False
    for entry in dependencies:
        lines = entry["pip"] if isinstance(entry, dict) else [entry]
        for line in lines:
            if line.strip() == "-e .":
                installs_package = True
                continue
            match = re.fullmatch(r"([A-Za-z0-9_.\-]+)\s*(==|=)?\s*([0-9][^\s]*)?", line.strip())
            assert match, f"{path.name}: cannot read dependency line {line!r}"
            pins[match.group(1).lower()] = match.group(3)
    return pins, installs_package


@pytest.mark.parametrize("path", ["environment.yml", "binder/environment.yml"], ids=str)
def test_environment_file_agrees_with_pyproject(path):
    required = pyproject_requirements()
    pins, _ = environment_pins(ROOT / path)
    extra = set(pins) - set(required) - {"python", "pip"}
    assert set(required) - set(pins) == set(), f"{path} lacks {sorted(set(required) - set(pins))}"
    assert extra == set(), f"{path} has {sorted(extra)}, which pyproject.toml does not list"
    for name, requirement in required.items():
        assert pins[name], f"{path}: {name} has no exact pin"
        assert Version(pins[name]) in requirement.specifier, f"{path}: {name}={pins[name]} breaks {requirement}"


def test_root_environment_installs_nnlib_and_binder_post_build_does():
    assert environment_pins(ROOT / "environment.yml")[1]
    post_build = (ROOT / "binder" / "postBuild").read_text()
    assert "\nset -e\n" in post_build
    assert "pip install --no-deps -e ." in post_build and "fetch-data" in post_build


def test_both_environment_files_pin_the_same_versions():
    assert environment_pins(ROOT / "environment.yml")[0] == environment_pins(ROOT / "binder/environment.yml")[0]
