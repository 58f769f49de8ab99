"""Which array library does the math: NumPy on the CPU or CuPy on an NVIDIA GPU.

The network code never imports numpy for its math; it asks the arrays for their
namespace (the Python array API's ``x.__array_namespace__()``), so the same lines
run on NumPy and on CuPy arrays.

``resolve_backend("auto")`` picks CuPy only when it is installed *and* a small
matrix product on the device works (``cupy.cuda.is_available()`` alone can be true
while cuBLAS is missing); otherwise NumPy. It says which, and why, in one line.

CuPy 14 or newer is needed: its main namespace follows NumPy 2 and the array API
(``cupy.astype``, ``cupy.concat``, ``cupy.isdtype``); CuPy 13 lacks those. CuPy's arrays
have no ``__array_namespace__`` method (as of 14.2), so :func:`array_namespace`
recognises them by their type.
"""

from __future__ import annotations

import re

import numpy as np

_gpu_check = None  # (usable: bool, reason: str), computed once per process
MINIMUM_CUPY = 14  # the first CuPy whose main namespace has every array API function nnlib uses


def array_namespace(*arrays):
    """The array API namespace of the arrays (numpy for NumPy arrays, cupy for CuPy ones)."""
    for array in arrays:
        if hasattr(array, "__array_namespace__"):
            return array.__array_namespace__()
        if type(array).__module__.split(".")[0] == "cupy":  # CuPy's ndarray lacks __array_namespace__
            import cupy
            return cupy
    return np


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


def resolve_backend(device: str = "cpu", verbose: bool = False):
    """The array module for ``device``: "cpu" -> numpy, "gpu" -> cupy (or an error), "auto" -> either.

    An array API namespace (a module with ``asarray``, such as array_api_strict) is returned as it is.
    """
    if not isinstance(device, str) and hasattr(device, "asarray"):
        return device
    if device not in ("cpu", "gpu", "auto"):
        raise ValueError(f"device must be 'cpu', 'gpu' or 'auto'; got {device!r}")
    if device == "cpu":
        return np
    usable, reason = gpu_status()
    if device == "gpu" and not usable:
        raise RuntimeError(f"device='gpu' was asked for, but {reason}. Use device='cpu' or 'auto'.")
    if verbose:
        print(f"Using {'CuPy on the GPU' if usable else 'NumPy on the CPU'}: {reason}.")
    if usable:
        import cupy
        return cupy
    return np


def use_gpu_of_local_rank(comm):
    """Give each MPI rank its own GPU of its node, if CuPy sees any; return its index, else None.

    Ranks on one node are numbered 0, 1, ... (their rank in ``comm.Split_type(COMM_TYPE_SHARED)``)
    and rank i uses GPU i mod (GPUs on the node): one GPU per rank while there are enough, shared
    round-robin beyond that. Call it before the first GPU allocation (see resolve_backend), so that
    no rank sets up the first GPU as well as its own.
    """
    from mpi4py import MPI

    node = comm.Split_type(MPI.COMM_TYPE_SHARED)
    local_rank = node.rank
    node.Free()
    try:
        import cupy

        if not cupy.cuda.is_available():
            return None
        index = local_rank % cupy.cuda.runtime.getDeviceCount()
        cupy.cuda.Device(index).use()
    except Exception:  # no CuPy, no driver: gpu_status says why, when asked
        return None
    return index


def to_numpy(array) -> np.ndarray:
    """A NumPy array with the values of ``array`` (copied from the GPU if needed)."""
    if isinstance(array, (np.ndarray, np.generic)):
        return np.asarray(array)
    if hasattr(array, "get"):  # CuPy: copies to the host, after the GPU has finished
        return array.get()
    if hasattr(array, "__dlpack__"):  # any other CPU array library (e.g. array_api_strict)
        return np.from_dlpack(array)
    return np.asarray(array)


def synchronizer(xp):
    """A function that waits until the GPU has finished its queued work (does nothing for CPU arrays).

    CuPy calls return as soon as the work is queued; a timer, or MPI reading a buffer, must wait.
    """
    if hasattr(xp, "cuda"):
        return xp.cuda.get_current_stream().synchronize
    return lambda: None


def is_numpy(xp) -> bool:
    """Whether the namespace is NumPy itself (host memory, free conversions to Python numbers)."""
    return xp is np


def cuda_aware_mpi() -> bool:
    """Whether MPI can read and write GPU memory directly (a CUDA-aware build).

    ``NNLIB_CUDA_AWARE_MPI=1`` (or ``0``) decides when set. Otherwise the MPI library that
    mpi4py loaded is asked: MPICH's MPIX_GPU_query_support(CUDA) or Open MPI's
    MPIX_Query_cuda_support(). Anything else, or no answer, counts as not CUDA-aware, and GPU
    buffers then travel through host memory.
    """
    import ctypes
    import os

    setting = os.environ.get("NNLIB_CUDA_AWARE_MPI")
    if setting is not None:
        return setting.strip().lower() in ("1", "true", "yes")
    from mpi4py import MPI  # noqa: F401  (loads the MPI library into the process)

    try:
        with open("/proc/self/maps") as maps:
            libraries = sorted({line.split()[-1] for line in maps if "libmpi" in line.split()[-1]})
    except OSError:
        return False
    for path in libraries:
        library = ctypes.CDLL(path)
        query = getattr(library, "MPIX_GPU_query_support", None)
        if query is not None:
            supported = ctypes.c_int(0)
            return query(0, ctypes.byref(supported)) == 0 and supported.value == 1  # 0: MPIX_GPU_SUPPORT_CUDA
        query = getattr(library, "MPIX_Query_cuda_support", None)
        if query is not None:
            return query() == 1
    return False
