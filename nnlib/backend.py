"""Which array library does the math: NumPy on the CPU or CuPy on an NVIDIA GPU.

The network code never imports numpy for its math; it asks the arrays for their
namespace (the Python array API's ``x.__array_namespace__()``), so the same lines
run on NumPy and on CuPy arrays.

``resolve_backend("auto")`` picks CuPy only when it is installed *and* a small
matrix product on the device works (``cupy.cuda.is_available()`` alone can be true
while cuBLAS is missing); otherwise NumPy. It says which, and why, in one line.
"""

from __future__ import annotations

import numpy as np

_gpu_check = None  # (usable: bool, reason: str), computed once per process


def array_namespace(*arrays):
    """The array API namespace of the arrays (numpy for NumPy arrays, cupy for CuPy ones)."""
    for array in arrays:
        if hasattr(array, "__array_namespace__"):
            return array.__array_namespace__()
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
    """The array module for ``device``: "cpu" -> numpy, "gpu" -> cupy (or an error), "auto" -> either."""
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


def to_numpy(array) -> np.ndarray:
    """A NumPy array with the values of ``array`` (copied from the GPU if needed)."""
    if hasattr(array, "get"):  # CuPy
        return array.get()
    return np.asarray(array)
