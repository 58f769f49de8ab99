"""nnlib.course.environment knows which BLAS kernel runs, and says so when a variable forces another one.

Each case runs in a subprocess, with OPENBLAS_CORETYPE set to a kernel older than this CPU's own, or
with the forcing variables unset (OpenBLAS reads them once, when it loads).
"""

import os
import subprocess
import sys

import pytest

from nnlib.course import environment

OLDER = {"AVX-512": "Haswell", "AVX2": "Sandybridge", "AVX": "Nehalem"}  # a kernel older than the CPU's best
REPORT = "from nnlib.course import environment as e; print(e.blas_kernel()); print(e.kernel_note())"


def report(**variables):
    own = {name: value for name, value in os.environ.items() if name not in environment.FORCING_VARIABLES}
    reply = subprocess.run([sys.executable, "-c", REPORT], env={**own, **variables}, capture_output=True, text=True,
                           timeout=300, check=True)
    kernel, note = reply.stdout.strip().split("\n", 1)
    return kernel, note


def own_kernel():
    return report()[0]


@pytest.mark.skipif(environment.cpu_instruction_set() not in OLDER
                    or own_kernel() in ("unknown", OLDER[environment.cpu_instruction_set()]),
                    reason="needs OpenBLAS on an x86 CPU with AVX or newer (an older kernel to force)")
def test_a_variable_forcing_an_older_kernel_is_named_with_what_it_costs():
    older = OLDER[environment.cpu_instruction_set()]
    kernel, note = report(OPENBLAS_CORETYPE=older)
    assert kernel == older
    assert note.startswith(f"OPENBLAS_CORETYPE={older} forces OpenBLAS's {older} kernel"), note
    assert f"on the CPU's own {own_kernel()} kernel" in note, note
    assert f"on a CPU with {environment.cpu_instruction_set()}" in note and "x as long)" in note, note
    assert "Unset OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE" in note and "\n" not in note, note


def test_the_cpus_own_kernel_gives_no_note():
    kernel, note = report()
    assert note == "None", note
    assert report(OPENBLAS_CORETYPE=kernel)[1] == "None"  # forced, but to the CPU's own kernel
    assert kernel == environment.blas_kernel() or any(os.environ.get(name) for name in environment.FORCING_VARIABLES)


def test_the_report_names_the_kernel_and_the_cpus_instructions():
    described = environment.describe()
    assert described["BLAS kernel"] == f"{environment.blas_kernel()}, on a CPU with {environment.cpu_instruction_set()}"


def test_the_report_names_the_cpu_model(tmp_path, monkeypatch):
    """Two benchmark runs compare only on one CPU: the machine line begins with cpuinfo's model name, and
    without one (no such line, no such file) with what the platform module knows."""
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nvendor_id\t: SomeVendor\nmodel name\t: Example CPU 9000 @ 3.0GHz\nflags\t\t: fpu\n")
    assert environment.cpu_model(str(info)) == "Example CPU 9000 @ 3.0GHz"
    monkeypatch.setattr(environment.platform, "processor", lambda: "fallback-processor")
    info.write_text("processor\t: 0\nflags\t\t: fpu\n")  # aarch64's /proc/cpuinfo has no "model name"
    assert environment.cpu_model(str(info)) == "fallback-processor"
    assert environment.cpu_model(str(tmp_path / "missing")) == "fallback-processor"
    monkeypatch.setattr(environment.platform, "processor", lambda: "")
    assert environment.cpu_model(str(tmp_path / "missing")) == "unknown CPU"
    monkeypatch.undo()
    assert environment.describe()["machine"].startswith(f"{environment.cpu_model()}, "), environment.describe()["machine"]


def test_the_report_fits_a_projector_with_and_without_the_note():
    """Lesson 00's environment check: every line at most 100 characters, the long kernel note wrapped."""
    own = {name: value for name, value in os.environ.items() if name not in environment.FORCING_VARIABLES}
    older = OLDER.get(environment.cpu_instruction_set())
    for variables in ([{}, {"OPENBLAS_CORETYPE": older}] if older else [{}]):
        reply = subprocess.run([sys.executable, "-c", "from nnlib.course import environment; environment.print_report()"],
                               env={**own, **variables}, capture_output=True, text=True, timeout=300, check=True)
        lines = reply.stdout.splitlines()
        assert lines and max(len(line) for line in lines) <= 100, lines
