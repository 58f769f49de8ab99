"""MPI collectives on NumPy arrays, with uneven splits and a guard against bad buffers. Every helper uses mpi4py's
**buffer** (uppercase) methods: the array's memory goes to MPI as it is, unpickled, but as raw bytes in memory order,
so a Fortran-ordered or strided array handed to ``Bcast`` would arrive scrambled: every helper first calls
:func:`require_contiguous`. Uneven splits (:func:`split_evenly`, nnlib's one split): 10 rows over 4 ranks are counts
[3, 3, 2, 2] from starts [0, 3, 6, 8], the first ``total % parts`` ranks one more, for ``Scatterv``/``Gatherv``. At
the end: every rank reaching the same verdict."""

from __future__ import annotations

import itertools

import numpy as np
from mpi4py import MPI

LESSON = 4


def require_contiguous(array, name: str = "array") -> np.ndarray:
    """Return ``array`` if it is a C-contiguous NumPy array, else raise a ValueError saying what to do."""
    if not isinstance(array, np.ndarray):
        raise TypeError(f"{name} must be a NumPy array for MPI's buffer methods; got {type(array).__name__}")
    if not array.flags.c_contiguous:
        layout = "Fortran-ordered (column-major)" if array.flags.f_contiguous else "a strided view (not contiguous)"
        raise ValueError(
            f"{name} is {layout}, shape {array.shape}: MPI would send its bytes in memory order and the "
            f"receivers, which read row-major (C) order, would get the values scrambled. "
            f"Pass np.ascontiguousarray({name}) instead (a C-ordered copy)."
        )
    return array


def split_evenly(total: int, parts: int) -> tuple[list[int], list[int]]:
    """The one split of N items over P ranks (rows, chunks, layers, hidden units): (counts, starts).

    counts[r] = N // P + (1 if r < N % P else 0); starts[r] = counts[0] + ... + counts[r-1]; rank r holds items
    [starts[r], starts[r] + counts[r]). Plain ints: the hand-built ring Allreduce calls this every time, and NumPy's
    small-array overhead (about 10 us) would be most of a small message."""
    if parts < 1:
        raise ValueError(f"parts must be at least 1; got {parts}")
    base, extra = divmod(int(total), int(parts))
    counts = [base + (part < extra) for part in range(parts)]
    return counts, [0, *itertools.accumulate(counts[:-1])]


def offsets(counts) -> np.ndarray:
    """Where each rank's block starts: the running sum of the counts before it (for any counts)."""
    return np.concatenate(([0], np.cumsum(counts)[:-1])).astype(np.int64)


def broadcast(comm, array, root: int = 0) -> np.ndarray:
    """Bcast ``array`` from ``root`` into the same-shaped ``array`` on every rank (in place)."""
    comm.Bcast(require_contiguous(array), root=root)
    return array


def broadcast_new(comm, array, root: int = 0) -> np.ndarray:
    """Bcast an array that only ``root`` has: shape and dtype go first (small, pickled), then the data."""
    meta = comm.bcast((array.shape, array.dtype.str) if comm.rank == root else None, root=root)
    if comm.rank != root:
        array = np.empty(meta[0], dtype=np.dtype(meta[1]))
    return broadcast(comm, array, root)


def scatter_rows(comm, array, root: int = 0) -> np.ndarray:
    """Split ``array`` (on ``root``; other ranks pass None) into near-equal blocks of rows, one per rank, with
    Scatterv, whether or not the rows divide by the number of ranks: this rank's block (rows, *array.shape[1:])."""
    meta = (require_contiguous(array).shape, array.dtype.str) if comm.rank == root else None
    shape, dtype = comm.bcast(meta, root=root)
    dtype = np.dtype(dtype)
    row_size = int(np.prod(shape[1:], dtype=np.int64))
    counts = np.array(split_evenly(shape[0], comm.size)[0], dtype=np.int64)
    local = np.empty((int(counts[comm.rank]), *shape[1:]), dtype=dtype)
    send = [array, (counts * row_size, offsets(counts) * row_size)] if comm.rank == root else None
    comm.Scatterv(send, local, root=root)
    return local


def gather_rows(comm, local, root: int = 0):
    """Gatherv every rank's block of rows (any number each, even 0): the blocks stacked in rank order on ``root``,
    None elsewhere."""
    require_contiguous(local, "local")
    counts = np.array(comm.allgather(local.shape[0]), dtype=np.int64)
    row_size = int(np.prod(local.shape[1:], dtype=np.int64))
    result = np.empty((int(counts.sum()), *local.shape[1:]), dtype=local.dtype) if comm.rank == root else None
    receive = None if result is None else [result, (counts * row_size, offsets(counts) * row_size)]
    comm.Gatherv(local, receive, root=root)
    return result


def allgather_rows(comm, local) -> np.ndarray:
    """Allgatherv: every rank gets every rank's block of rows, stacked in rank order."""
    require_contiguous(local, "local")
    counts = np.array(comm.allgather(local.shape[0]), dtype=np.int64)
    row_size = int(np.prod(local.shape[1:], dtype=np.int64))
    result = np.empty((int(counts.sum()), *local.shape[1:]), dtype=local.dtype)
    comm.Allgatherv(local, [result, (counts * row_size, offsets(counts) * row_size)])
    return result


def allreduce_sum(comm, array) -> np.ndarray:
    """Sum ``array`` over all ranks, in place (MPI.IN_PLACE): every rank ends with the total."""
    comm.Allreduce(MPI.IN_PLACE, require_contiguous(array), op=MPI.SUM)
    return array


# -- every rank reaches the same verdict ------------------------------------------

def raised_on_every_rank(error: BaseException) -> BaseException:
    """Mark ``error`` as raised by every rank together (so no 'failed' notice is sent); return it."""
    error.on_every_rank = True
    return error


def on_every_rank(error: BaseException) -> bool:
    """Whether every rank raised ``error`` together (marked by :func:`raised_on_every_rank`)."""
    return getattr(error, "on_every_rank", False)


def require_same_on_every_rank(comm, what: str, value) -> None:
    """Raise the same ValueError on every rank unless all ranks passed an equal ``value``. One small allgather:
    every rank learns the outcome together, so no rank raises alone and leaves the others waiting in a collective."""
    values = comm.allgather(value)
    differing = [rank for rank, other in enumerate(values) if other != values[0]]
    if differing:
        raise raised_on_every_rank(ValueError(
            f"the ranks disagree on {what}: rank 0 has {values[0]!r}, "
            + ", ".join(f"rank {rank} has {values[rank]!r}" for rank in differing)
            + ". Every rank must run the same configuration on the same data."
        ))


def fail_together(comm, message: str | None) -> None:
    """If any rank has a message, raise ValueError with the first one on every rank."""
    messages = comm.allgather(message)
    for rank, text in enumerate(messages):
        if text is not None:
            text = text if rank == comm.rank or len(set(messages)) == 1 else f"rank {rank}: {text}"
            raise raised_on_every_rank(ValueError(text))
