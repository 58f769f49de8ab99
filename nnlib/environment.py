"""What this machine and environment are: versions, cores, BLAS, MPI library, GPU.

Notebook 00 prints it as an environment check; benchmarks record it beside their figures.
"""

from __future__ import annotations

import os
import platform
import sys


# Environment variables that give each process one BLAS thread: with several MPI ranks on one
# machine, more threads per rank only make the ranks fight over the cores.
ONE_BLAS_THREAD = {name: "1" for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")}


def mpi_library() -> str:
    """The MPI library's own version line (e.g. 'MPICH Version: 5.0.2'), or why there is none."""
    try:
        from mpi4py import MPI
    except Exception as error:  # ImportError, or a runtime library that fails to load
        return f"unavailable ({type(error).__name__}: {error})"
    return " ".join(MPI.Get_library_version().strip().splitlines()[0].split())


def blas() -> str:
    """The BLAS library NumPy calls and its thread count (from threadpoolctl)."""
    from threadpoolctl import threadpool_info

    libraries = [info for info in threadpool_info() if info.get("user_api") == "blas"]
    if not libraries:
        return "unknown"
    info = libraries[0]
    return f"{info.get('internal_api')} {info.get('version')} ({info.get('num_threads')} threads)"


def describe() -> dict:
    """A dictionary describing the machine and the packages the series uses."""
    import numpy

    from .backend import gpu_status

    versions = {"python": platform.python_version(), "numpy": numpy.__version__}
    for name in ("mpi4py", "ipyparallel", "matplotlib", "tqdm"):
        try:
            versions[name] = __import__(name).__version__
        except ImportError:
            versions[name] = "not installed"
    usable, reason = gpu_status()
    return {
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.system()} {platform.release()}",
        **versions,
        "BLAS": blas(),
        "MPI library": mpi_library(),
        "mpiexec": mpiexec_path() or "not found",
        "GPU": reason if usable else f"none usable: {reason}",
    }


def mpiexec_path() -> str | None:
    """The ``mpiexec`` of the running Python's environment (beside its interpreter), else on PATH."""
    import shutil

    beside = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    if os.access(beside, os.X_OK):
        return beside
    return shutil.which("mpiexec")


def print_report() -> None:
    """Print :func:`describe` as aligned lines."""
    for key, value in describe().items():
        print(f"{key:12s} {value}")
