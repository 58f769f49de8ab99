"""What this machine and environment are: versions, cores, BLAS, MPI library, GPU.

Notebook 00 prints it as an environment check; benchmarks record it beside their figures.
"""

from __future__ import annotations

import os
import platform
import re
import sys

LESSON = 0  # notebook 00's environment check


# Environment variables that give each process one BLAS thread: with several MPI ranks on one
# machine, more threads per rank only make the ranks fight over the cores.
ONE_BLAS_THREAD = {name: "1" for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")}
MINIMUM_CUPY = 14  # the first CuPy whose main namespace has every array API function nnlib uses
_gpu_check = None  # (usable: bool, reason: str), computed once per process


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

def gpu_status(refresh: bool = False):
    """(usable, reason): whether CuPy is installed and a matrix product runs on the GPU."""
    global _gpu_check
    if _gpu_check is not None and not refresh:
        return _gpu_check
    try:
        import cupy
    except ImportError:
        _gpu_check = (False, "CuPy is not installed (pip install 'nnlib[gpu]')")
        return _gpu_check
    version = str(getattr(cupy, "__version__", "0"))
    major = re.match(r"\d*", version).group()
    if int(major or 0) < MINIMUM_CUPY:
        _gpu_check = (False, f"CuPy {version} is installed, but nnlib needs CuPy "
                             f"{MINIMUM_CUPY} or newer (pip install -U 'cupy-cuda12x>={MINIMUM_CUPY}')")
        return _gpu_check
    try:
        if not cupy.cuda.is_available():
            _gpu_check = (False, "CuPy is installed but finds no CUDA GPU")
            return _gpu_check
        a = cupy.ones((8, 8), dtype=cupy.float32)
        total = float((a @ a).sum())
        cupy.cuda.get_current_stream().synchronize()
        if total != 512.0:
            raise RuntimeError(f"8x8 ones @ ones summed to {total}, expected 512")
        name = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)["name"]
        name = name.decode() if isinstance(name, bytes) else name
        _gpu_check = (True, f"GPU {name} passed a smoke test")
    except Exception as error:  # any CUDA failure means: not usable
        _gpu_check = (False, f"CuPy is installed but the GPU smoke test failed ({type(error).__name__}: {error})")
    return _gpu_check
