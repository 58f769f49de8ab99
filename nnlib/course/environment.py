"""What this machine and environment are: versions, cores, BLAS, MPI library, GPU (notebook 00's environment check;
benchmarks record it beside their figures)."""

from __future__ import annotations

import ctypes
import functools
import os
import platform
import re
import shutil
import sys
import textwrap
import time

LESSON = 0  # the course's own tools: any lesson may use them

# One BLAS thread per process: with several MPI ranks on one machine, more threads only make them fight over the cores.
ONE_BLAS_THREAD = {name: "1" for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")}
MINIMUM_CUPY = 14  # the first CuPy whose main namespace has every array API function nnlib uses
# glibc's malloc settings (mallopt's parameter numbers, from malloc.h) that keep_freed_memory sets.
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
KEEP_FREED_BYTES, MAPPED_FROM_BYTES = 64 << 20, 32 << 20  # 64 MiB kept at the heap's top; mmap only above 32 MiB
_freed_memory_kept = False  # set by keep_freed_memory


def mpi_library() -> str:
    """The MPI library's own version line (e.g. 'MPICH Version: 5.0.2'), or why there is none."""
    try:
        from mpi4py import MPI
    except Exception as error:  # ImportError, or a runtime library that fails to load
        return f"unavailable ({type(error).__name__}: {error})"
    return " ".join(MPI.Get_library_version().strip().splitlines()[0].split())


def blas_library() -> dict:
    """threadpoolctl's description of the BLAS library NumPy calls ({} if it sees none)."""
    import numpy  # noqa: F401  (threadpoolctl sees only the libraries already loaded)
    from threadpoolctl import threadpool_info

    return next((info for info in threadpool_info() if info.get("user_api") == "blas"), {})


def blas() -> str:
    """The BLAS library NumPy calls and its thread count (from threadpoolctl)."""
    info = blas_library()
    found = f"{info.get('internal_api')} {info.get('version')} ({info.get('num_threads')} threads)"
    return found if info else "unknown"


# The variables that can force OpenBLAS's kernel (https://github.com/OpenMathLib/OpenBLAS, USAGE.md), and the
# CPU's vector instruction sets the kernels are written for, newest first (/proc/cpuinfo's flags).
FORCING_VARIABLES = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")
CPU_FLAGS = {"avx512f": "AVX-512", "avx2": "AVX2", "avx": "AVX", "sse4_2": "SSE4.2", "pni": "SSE3", "sse2": "SSE2"}


def blas_kernel() -> str:
    """The BLAS kernel NumPy runs (threadpoolctl's architecture, e.g. 'SkylakeX'), or 'unknown'."""
    return str(blas_library().get("architecture") or "unknown")


def cpuinfo(field: str, path: str = "/proc/cpuinfo") -> str:
    """The first value of ``field`` ("flags", "model name") in Linux's /proc/cpuinfo; '' if there is none."""
    try:
        with open(path) as info:
            return next((line.split(":", 1)[1].strip() for line in info if line.startswith(field)), "")
    except OSError:
        return ""


def cpu_instruction_set() -> str:
    """The CPU's best vector instruction set the kernels use ('AVX-512', 'AVX2', ...), from /proc/cpuinfo."""
    flags = cpuinfo("flags").split()
    return next((name for flag, name in CPU_FLAGS.items() if flag in flags), "unknown")


def cpu_model(path: str = "/proc/cpuinfo") -> str:
    """The CPU's model name ("AMD EPYC 9R14", ...), else platform's; benchmarks print it (runs compare on one CPU)."""
    return cpuinfo("model name", path) or platform.processor() or "unknown CPU"


def usable_cores(cpu_max: str = "/sys/fs/cgroup/cpu.max") -> int:
    """The cores this process may use: its CPU affinity (``taskset``), capped by a cgroup's CPU quota where Linux
    sets one (Binder's limit, Docker's ``--cpus``: quota / period, at least 1); ``os.cpu_count()`` counts neither."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    try:
        quota, period = open(cpu_max).read().split()[:2]
        return min(cores, max(1, int(quota) // int(period)))
    except (OSError, ValueError):  # no cgroup v2 file, or "max": no quota
        return cores


def keep_freed_memory() -> bool:
    """Make the C library's allocator keep the memory a training step frees, for the next step to reuse. By default
    glibc's malloc hands freed memory back to the system (its heap's top above M_TRIM_THRESHOLD, arrays above
    M_MMAP_THRESHOLD as whole mappings), so each step's arrays are new pages, zeroed by the kernel at their first
    touch: for 784-1024-10 on 2,048 rows, about 32,000 page faults per epoch of 30,000 samples, and about 200 with the
    thresholds at 64 and 32 MiB (tests/test_allocator.py). ``import nnlib`` calls it. Returns whether the setting is
    in effect: False where the C library is not glibc, or when $NNLIB_KEEP_FREED_MEMORY is 0."""
    global _freed_memory_kept
    if os.environ.get("NNLIB_KEEP_FREED_MEMORY", "1") == "0" or platform.libc_ver()[0] != "glibc":
        return _freed_memory_kept
    mallopt = ctypes.CDLL(None).mallopt  # (the C library the interpreter already runs on)
    _freed_memory_kept = bool(mallopt(M_TRIM_THRESHOLD, KEEP_FREED_BYTES)) and bool(
        mallopt(M_MMAP_THRESHOLD, MAPPED_FROM_BYTES))
    return _freed_memory_kept


def product_seconds(size: int = 768, repeats: int = 7) -> float:
    """Median seconds of one float32 (the series' dtype) (size x size) @ (size x size) product, one BLAS thread."""
    import numpy
    from threadpoolctl import threadpool_limits

    a = numpy.random.default_rng(0).random((size, size), dtype=numpy.float32)
    times = []
    with threadpool_limits(1, user_api="blas"):
        for _ in range(repeats + 1):
            began = time.perf_counter()
            a @ a
            times.append(time.perf_counter() - began)
    return float(numpy.median(times[1:]))


def kernel_note() -> str | None:
    """One line if a variable makes OpenBLAS run another kernel than the CPU's own: which, what it costs (one
    product timed here and in a subprocess without the variables), and how to change it; else None."""
    forced = [f"{name}={os.environ[name]}" for name in FORCING_VARIABLES if os.environ.get(name)]
    if not forced:
        return None
    import subprocess

    own = {name: value for name, value in os.environ.items() if name not in FORCING_VARIABLES}
    code = "from nnlib.course import environment as e; print(e.blas_kernel(), e.product_seconds())"
    reply = subprocess.run([sys.executable, "-c", code], env=own, capture_output=True, text=True, timeout=120)
    own_kernel, own_seconds = reply.stdout.split() if reply.returncode == 0 else (blas_kernel(), "0")
    if own_kernel == blas_kernel():
        return None  # the CPU's own kernel (or nothing to compare with)
    here, own_seconds = product_seconds(), float(own_seconds)
    return (f"{' and '.join(forced)} {'force' if len(forced) > 1 else 'forces'} OpenBLAS's {blas_kernel()} kernel on a "
            f"CPU with {cpu_instruction_set()}: a float32 768x768 product takes {here * 1e3:.1f} ms on it against "
            f"{own_seconds * 1e3:.1f} ms on the CPU's own {own_kernel} kernel ({here / own_seconds:.1f}x as long). "
            f"Unset {' and '.join(FORCING_VARIABLES)} to run the CPU's own kernel (some old OpenBLAS builds needed "
            "them on some CPUs).")


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
    machine = f"{cpu_model()}, {platform.machine()}, {os.cpu_count()} cores, {platform.system()} {platform.release()}"
    memory = (f"freed memory kept for reuse (glibc malloc: up to {KEEP_FREED_BYTES >> 20} MiB; "
              "nnlib.course.environment.keep_freed_memory)" if _freed_memory_kept else
              "freed memory handed back to the system at once (the C library's default)")
    return {"machine": machine, **versions, "BLAS": blas(),
            "BLAS kernel": f"{blas_kernel()}, on a CPU with {cpu_instruction_set()}", "memory": memory,
            "MPI library": mpi_library(), "mpiexec": mpiexec_path() or "not found",
            "GPU": reason if usable else f"none usable: {reason}"}


def mpiexec_path() -> str | None:
    """The ``mpiexec`` named by ``$NNLIB_MPIEXEC`` (a site's own, or a wrapper such as the tests' counting one),
    else the running Python's environment's (beside its interpreter), else the one on PATH."""
    if os.environ.get("NNLIB_MPIEXEC"):
        return os.environ["NNLIB_MPIEXEC"]
    beside = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    return beside if os.access(beside, os.X_OK) else shutil.which("mpiexec")


def print_report() -> None:
    """Print :func:`describe` in aligned lines of at most 100 characters, and the note if a kernel is forced."""
    rows, note = dict(describe()), kernel_note()  # the note times a product at both kernels: once
    if note:
        rows["note"] = note
    for key, value in rows.items():
        print(textwrap.fill(f"{key:12s} {value}", 100, subsequent_indent=" " * 13, break_long_words=False))


@functools.cache
def gpu_status():
    """(usable, reason): whether CuPy is installed and a matrix product runs on the GPU (checked once per process)."""
    try:
        import cupy
    except ImportError:
        return False, "CuPy is not installed (pip install 'nnlib[gpu]')"
    version = str(getattr(cupy, "__version__", "0"))
    if int(re.match(r"\d*", version).group() or 0) < MINIMUM_CUPY:
        return False, (f"CuPy {version} is installed, but nnlib needs CuPy "
                       f"{MINIMUM_CUPY} or newer (pip install -U 'cupy-cuda12x>={MINIMUM_CUPY}')")
    try:
        if not cupy.cuda.is_available():
            return False, "CuPy is installed but finds no CUDA GPU"
        a = cupy.ones((8, 8), dtype=cupy.float32)
        total = float((a @ a).sum())
        cupy.cuda.get_current_stream().synchronize()
        if total != 512.0:
            raise RuntimeError(f"8x8 ones @ ones summed to {total}, expected 512")
        name = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)["name"]
        return True, f"GPU {name.decode() if isinstance(name, bytes) else name} passed a smoke test"
    except Exception as error:  # any CUDA failure means: not usable
        return False, f"CuPy is installed but the GPU smoke test failed ({type(error).__name__}: {error})"
