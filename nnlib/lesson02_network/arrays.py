"""Which arrays the math runs on: the Python array API, so the same lines run on NumPy and CuPy.

The network never imports numpy for its math; it asks the arrays for their namespace
(``x.__array_namespace__()``). Lesson 08 (nnlib.lesson08_gpu.backend) hands it CuPy's namespace instead of NumPy's.
"""

from __future__ import annotations

import functools

import numpy as np

LESSON = 2


def array_namespace(*arrays):
    """The array API namespace of the arrays (numpy for NumPy arrays, cupy for CuPy ones)."""
    for array in arrays:
        if hasattr(array, "__array_namespace__"):
            return array.__array_namespace__()
        if type(array).__module__.split(".")[0] == "cupy":  # CuPy's ndarray lacks __array_namespace__
            import cupy
            return cupy
    return np


def namespace_of_device(device):
    """The array namespace a network computes in: ``"cpu"`` -> numpy, or a namespace (a module with ``asarray``:
    numpy, cupy, array_api_strict) passed as it is; the error names lesson 08's way to a GPU."""
    if not isinstance(device, str) and hasattr(device, "asarray"):
        return device
    if device == "cpu":
        return np
    raise ValueError(f"device must be 'cpu' or an array namespace such as numpy or cupy (for a GPU, lesson 08's "
                     f"Network(..., device=nnlib.lesson08_gpu.backend.resolve_backend('gpu'))); got {device!r}")


def to_numpy(array) -> np.ndarray:
    """A NumPy array with the values of ``array`` (copied from the GPU if needed)."""
    if isinstance(array, (np.ndarray, np.generic)):
        return np.asarray(array)
    if hasattr(array, "get"):  # CuPy: copies to the host, after the GPU has finished
        return array.get()
    if hasattr(array, "__dlpack__"):  # any other CPU array library (e.g. array_api_strict)
        return np.from_dlpack(array)
    return np.asarray(array)


def as_type(array, dtype):
    """``array``'s values as ``dtype``: the arrays' own ``astype`` method where they have one (NumPy, CuPy, and
    CuPy's arrays inside a fused function), else the array API's ``xp.astype`` (array_api_strict)."""
    if hasattr(array, "astype"):
        return array.astype(dtype)
    return array_namespace(array).astype(array, dtype)


@functools.lru_cache(maxsize=256)
def fused(function, xp):
    """``function`` compiled into one GPU kernel where the namespace can fuse (CuPy: ``cupy.fuse``), else itself.

    Each element-wise operation CuPy runs is a kernel launch, which costs the host a fixed time whatever the
    array's size; an expression of several operations fused is one launch (lesson 08 measures why that
    matters). ``function`` is written once, with the arrays' operators and namespace (``array_namespace`` of
    its arguments), and that plain form is what NumPy (the CPU) runs. It may change its arguments in place
    and return arrays; fused, it must not read ``.shape`` and may end in one reduction (a sum).
    """
    fuse = getattr(xp, "fuse", None)
    return function if fuse is None else fuse(kernel_name=function.__name__)(function)


@functools.lru_cache(maxsize=64)
def _constant(kind: str, length: int, dtype, xp, device):
    return xp.ones(length, dtype=dtype) if kind == "ones" else xp.arange(length)


def constant_vector(kind: str, length: int, xp, dtype=None):
    """A vector made once per device and kept: ``"ones"`` (length,) of ``dtype``, or ``"classes"``, 0 .. length-1.

    On a GPU, making it again for every batch would cost a kernel launch each time. Never write into it.
    """
    device = None if xp is np or not hasattr(xp, "cuda") else xp.cuda.runtime.getDevice()  # (hasattr(np, ...) is slow)
    return _constant(kind, length, dtype, xp, device)


def is_numpy(xp) -> bool:
    """Whether the namespace is NumPy itself (host memory, free conversions to Python numbers)."""
    return xp is np


def product_into(a, b, out) -> None:
    """out[...] = a @ b, written straight into ``out`` (a view into a flat vector) where the arrays allow it.

    NumPy's and CuPy's matmul take ``out=``, which saves allocating a @ b and copying it over; the array
    API has no ``out=``, so other namespaces (array_api_strict in the tests) compute and copy.
    """
    if isinstance(out, np.ndarray) or type(out).__module__.split(".")[0] == "cupy":
        array_namespace(out).matmul(a, b, out=out)
    else:
        out[...] = a @ b


def through_host(array, operation) -> None:
    """``operation(host)`` on ``array``'s values in host memory, written back into ``array``.

    For a NumPy array ``host`` is the array itself (no copy); for another device's array, a copy.
    For code written for NumPy arrays (lesson 09's ring, lesson 15's compression) on any device.
    """
    host = to_numpy(array)
    operation(host)
    if host is not array:
        array[...] = array_namespace(array).asarray(host)
