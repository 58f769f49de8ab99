"""Which array library does the math: NumPy on the CPU or CuPy on an NVIDIA GPU.

The network computes in whatever array namespace it is given (nnlib.lesson02_network.arrays):
``Network(sizes, device=resolve_backend("gpu"))`` puts it on the GPU. ``resolve_backend("auto")`` picks CuPy only
when a small matrix product on the device works (nnlib.course.environment.gpu_status); otherwise NumPy. CuPy 14 or
newer is needed: its main namespace follows NumPy 2 and the array API (``cupy.astype``, ``cupy.concat``...).
"""

from __future__ import annotations

import numpy as np

from nnlib.course.environment import gpu_status
from nnlib.lesson02_network.arrays import is_numpy, namespace_of_device, to_numpy
from nnlib.lesson03_training.training import Hook

LESSON = 8


def resolve_backend(device: str = "cpu", verbose: bool = False):
    """The array module for ``device``: "cpu" -> numpy, "gpu" -> cupy (or an error), "auto" -> either; an array API
    namespace (a module with ``asarray``, such as array_api_strict) as it is."""
    if device not in ("gpu", "auto"):
        return namespace_of_device(device)  # "cpu" -> numpy; a namespace as it is; anything else: an error
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
    """Give each MPI rank its own GPU of its node, if CuPy sees any; return its index, else None. Rank i of a node
    (in ``comm.Split_type(COMM_TYPE_SHARED)``) uses GPU i mod (GPUs on the node), round-robin. Call it before the
    first GPU allocation, so that no rank sets up the first GPU as well as its own."""
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


def synchronizer(xp):
    """A function that waits until the GPU has finished its queued work (does nothing for CPU arrays): CuPy calls
    return as soon as the work is queued; a timer, or MPI reading a buffer, must wait."""
    return xp.cuda.get_current_stream().synchronize if hasattr(xp, "cuda") else lambda: None


def cuda_aware_mpi() -> bool:
    """Whether MPI can read and write GPU memory directly (a CUDA-aware build): ``$NNLIB_CUDA_AWARE_MPI`` (1 or 0)
    if set, else the answer of the MPI library mpi4py loaded: MPICH's MPIX_GPU_query_support(CUDA) or Open MPI's
    MPIX_Query_cuda_support(). No answer counts as not CUDA-aware (GPU buffers then travel through host memory)."""
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


class HostStaging:
    """A communicator that hands MPI the network's buffers wherever they live: NumPy arrays as they are, and so GPU
    arrays with a CUDA-aware MPI, once the GPU has finished writing them (MPI must not read a half-written buffer).
    With an ordinary MPI, GPU arrays are *staged*: copied to host memory, communicated, copied back. It wraps any
    communicator (MPI's, or a WatchedComm: ``HostStaging(watch(comm), xp)``, never the other way round); everything
    else is the wrapped one's. ``cuda_aware``: None asks MPI."""

    BUFFER_METHODS = ("Allgather", "Allgatherv", "Allreduce", "Bcast", "Gather", "Gatherv", "Isend", "Recv", "Reduce",
                      "Reduce_scatter", "Scatter", "Scatterv", "Send", "Sendrecv")

    def __init__(self, comm, xp, cuda_aware=None):
        self.comm, self.xp = comm, xp
        self.direct = is_numpy(xp) or (hasattr(xp, "cuda") and (cuda_aware_mpi() if cuda_aware is None else cuda_aware))
        self.synchronize = synchronizer(xp)

    def __getattr__(self, name):
        if name in HostStaging.BUFFER_METHODS:
            return lambda *args, **keywords: self.call(getattr(self.comm, name), args, keywords)
        return getattr(self.comm, name)  # rank, size, bcast, guard, at, wait_all, ...

    def Split(self, *args, **keywords):
        """The wrapped communicator's Split, staged as this one (lesson 12's grid of ranks)."""
        return HostStaging(self.comm.Split(*args, **keywords), self.xp, cuda_aware=self.direct)

    def call(self, method, args, keywords):
        """``method(*args, **keywords)`` with every GPU array among them staged (or, if direct, synchronised)."""
        if self.direct:
            self.synchronize()
            return method(*args, **keywords)
        staged = []
        args = [self.stage(value, staged) for value in args]
        keywords = {key: self.stage(value, staged) for key, value in keywords.items()}
        result = method(*args, **keywords)
        for array, host in staged:  # what MPI wrote into the host copies (unchanged where it only read)
            array[...] = self.xp.asarray(host)
        return result

    def stage(self, value, staged: list):
        """The host copy of a GPU array (remembered in ``staged``); anything else as it is."""
        if isinstance(value, list) and value and self.on_device(value[0]):  # [buffer, (counts, displacements)]
            return [self.stage(value[0], staged), *value[1:]]
        if not self.on_device(value):
            return value
        host = to_numpy(value)
        staged.append((value, host))
        return host

    def on_device(self, value) -> bool:
        return hasattr(value, "shape") and not isinstance(value, np.ndarray)

    def Iallreduce(self, sendbuf, recvbuf, op=None):
        """Staged: a blocking Allreduce now, and a request already complete; direct: MPI's Iallreduce."""
        from mpi4py import MPI

        if self.direct:
            return self.call(self.comm.Iallreduce, (sendbuf, recvbuf), {"op": op or MPI.SUM})
        self.call(self.comm.Allreduce, (sendbuf, recvbuf), {"op": op or MPI.SUM})
        return MPI.REQUEST_NULL


class WaitForDevice(Hook):
    """Waits for the GPU's queued work at every phase of a step, so the phase timer charges it where it ran:
    ``train_parallel(..., hooks=[WaitForDevice(network.xp)])``."""

    def __init__(self, xp):
        self.synchronize = synchronizer(xp)

    def phase(self, run, name) -> None:
        self.synchronize()
