"""Allreduce built from point-to-point messages: the ring, recursive doubling, reduce-then-broadcast.

``comm.Allreduce`` leaves every rank with the element-wise sum of all ranks' buffers. MPI
libraries build it from plain sends and receives, choosing an algorithm by message size and
number of ranks P. Three classic ones, each in place on a 1-D buffer of n elements:

reduce-then-broadcast (the parameter server's shape)
    Every rank sends its whole buffer to rank 0, which adds them up and sends the total back:
    2 (P - 1) messages of n elements, all through rank 0's link.
    T = 2 (P - 1) (alpha + n beta)

recursive doubling (latency-optimal: log2 P rounds)
    In round k, rank r swaps its whole partial sum with rank r XOR 2^k and adds: after log2 P
    rounds every rank has everything. With P not a power of two, the first 2 (P - p) ranks (p the
    largest power of two <= P) pair up first, and half of them sit out until the end.
    T = log2(P) (alpha + n beta)                       (P a power of two)

ring (bandwidth-optimal: every rank sends under 2 n elements, however large P is)
    The buffer is cut into P chunks (uneven when P does not divide n). Reduce-scatter: in step
    s = 0 .. P-2, rank r sends chunk (r - s - 1) mod P to rank r + 1 and adds the chunk
    (r - s - 2) mod P that arrives from rank r - 1; afterwards rank r holds the complete sum of
    chunk r (as MPI's Reduce_scatter). Allgather: P - 1 more steps pass the completed chunks on.
    T = 2 (P - 1) alpha + 2 (P - 1) / P n beta

Sizes and shapes: ``buffer`` is (n,) on every rank; chunks follow ``collectives.split_evenly(n, P)`` (the first
n mod P chunks one element longer). The algorithms trust their buffers: :func:`allreduce` checks them on every rank.
"""

from __future__ import annotations

import numpy as np
from mpi4py import MPI

from nnlib.lesson04_collectives.collectives import fail_together, raised_on_every_rank, split_evenly

LESSON = 9


REDUCE = {"sum": np.add, "max": np.maximum, "min": np.minimum, "prod": np.multiply}


# -- checking the buffers, on every rank together ----------------------------------------------

def local_problem(buffer) -> str | None:
    """What is wrong with this rank's buffer on its own (None if nothing)."""
    if not isinstance(buffer, np.ndarray):
        return f"the buffer must be a NumPy array; got {type(buffer).__name__}"
    if buffer.ndim != 1:
        return f"the buffer must be 1-D (use array.reshape(-1) on a contiguous array); got shape {buffer.shape}"
    if not buffer.flags.c_contiguous:
        return ("the buffer is a strided view, not contiguous: MPI would read the wrong bytes. "
                "Pass np.ascontiguousarray(buffer) and copy the result back")
    if not buffer.flags.writeable:
        return "the buffer is read-only, but Allreduce writes the result into it: pass a writable copy (buffer.copy())"
    if buffer.size == 0:
        return "the buffer is empty (0 elements): there is nothing to reduce"
    if buffer.dtype.kind not in "iuf":
        return f"the buffer's dtype {buffer.dtype} is not an integer or floating-point type"
    return None


def check_buffer(comm, buffer, op: str = "sum", min_elements: int = 1) -> None:
    """Raise the same ValueError on every rank unless every rank's buffer is usable and alike.

    Small allgathers: every rank sees every rank's answer and reaches the same verdict.
    ``min_elements``: the fewest elements the algorithm needs (the ring needs one per rank).
    """
    problem = local_problem(buffer) or (None if op in REDUCE else f"op must be one of {', '.join(REDUCE)}; got {op!r}")
    fail_together(comm, problem and f"{problem}.")
    lengths, dtypes = zip(*comm.allgather((int(buffer.size), buffer.dtype.name)))
    for what, values, advice in [("lengths", lengths, "every rank must pass a buffer of the same length"),
                                 ("dtypes", dtypes, "convert them to one dtype first (e.g. astype(np.float64))")]:
        if len(set(values)) > 1:
            listing = ", ".join(f"rank {rank}: {value}" for rank, value in enumerate(values))
            raise raised_on_every_rank(ValueError(f"the buffers have different {what} on different ranks ({listing}); "
                                                  + advice))
    if lengths[0] < min_elements:
        raise raised_on_every_rank(ValueError(
            f"{comm.size} ranks but only {lengths[0]} elements: the ring cuts the buffer into one chunk per "
            f"rank, so it needs at least {min_elements}. Use recursive doubling (or MPI's Allreduce) "
            "for a buffer this small"))


# -- the three algorithms --------------------------------------------------------------------

def ring_allreduce(comm, buffer, op: str = "sum"):
    """Ring Allreduce of ``buffer`` (n,) in place: :func:`ring_reduce_scatter`, then :func:`ring_allgather`."""
    ring_reduce_scatter(comm, buffer, op)
    return ring_allgather(comm, buffer)


def ring_reduce_scatter(comm, buffer, op: str = "sum"):
    """The ring's first half (the module's reduce-scatter), in place: afterwards chunk r of ``buffer`` holds the
    complete sum on rank r, the other chunks partial sums. Returns (start, stop) of this rank's complete chunk."""
    counts, starts = ring_steps(comm, buffer, 1, REDUCE[op])
    return starts[comm.rank], starts[comm.rank] + counts[comm.rank]


def ring_allgather(comm, buffer):
    """The ring's second half, in place: rank r's chunk r travels around, so every rank gets every chunk."""
    ring_steps(comm, buffer, 0)
    return buffer


def ring_steps(comm, buffer, lag: int, reduce=None):
    """The P - 1 steps of either half: in step s, rank r sends chunk (r - s - lag) mod P to rank r + 1 and
    receives chunk (r - s - lag - 1) mod P from rank r - 1, which it adds (``reduce``) or copies (None).
    Returns the chunks' (counts, starts)."""
    size, rank = comm.size, comm.rank
    counts, starts = split_evenly(buffer.size, size)
    chunk = [buffer[start:start + count] for start, count in zip(starts, counts)]
    incoming = np.empty(counts[0], dtype=buffer.dtype) if reduce else None  # the first chunk is the longest
    right, left = (rank + 1) % size, (rank - 1) % size
    with np.errstate(over="ignore", invalid="ignore"):  # as MPI's sum: an inf passes on (lesson 17's scaler sees it)
        for step in range(size - 1):
            send, receive = (rank - step - lag) % size, (rank - step - lag - 1) % size
            arrived = incoming[:counts[receive]] if reduce else chunk[receive]
            comm.Sendrecv(chunk[send], dest=right, recvbuf=arrived, source=left)
            if reduce:
                reduce(chunk[receive], arrived, out=chunk[receive])
    return counts, starts


def ring_schedule(size: int):
    """Who sends which chunk to whom in a ring Allreduce on ``size`` ranks.

    Returns a list of 2 (P - 1) steps; each step is a dict with ``phase`` ("reduce-scatter" or
    "allgather") and ``sends``: a list of (sender, receiver, chunk), one per rank.
    """
    return [{"phase": phase, "sends": [(rank, (rank + 1) % size, (rank - step - lag) % size) for rank in range(size)]}
            for phase, lag in (("reduce-scatter", 1), ("allgather", 0)) for step in range(size - 1)]


def recursive_doubling_allreduce(comm, buffer, op: str = "sum"):
    """Recursive-doubling Allreduce of ``buffer`` (n,) in place: log2 P rounds of whole-buffer swaps."""
    size, rank = comm.size, comm.rank
    reduce = REDUCE[op]
    power = 1 << (size.bit_length() - 1)  # the largest power of two <= P
    extra = size - power
    incoming = np.empty_like(buffer)
    # Fold: among the first 2 * extra ranks, each even rank hands its buffer to the odd one after it.
    if rank < 2 * extra:
        if rank % 2 == 0:
            comm.Send(buffer, dest=rank + 1)
            comm.Recv(buffer, source=rank + 1)  # the result, at the end
            return buffer
        comm.Recv(incoming, source=rank - 1)
        reduce(incoming, buffer, out=buffer)
    # The remaining `power` ranks renumber 0 .. power-1 and swap with partner = new rank XOR 2^k.
    new_rank = rank // 2 if rank < 2 * extra else rank - extra
    mask = 1
    while mask < power:
        partner_new = new_rank ^ mask
        partner = partner_new * 2 + 1 if partner_new < extra else partner_new + extra
        comm.Sendrecv(buffer, dest=partner, recvbuf=incoming, source=partner)
        # Both partners add the same two arrays in the same order, so they stay bitwise equal.
        if new_rank < partner_new:
            reduce(buffer, incoming, out=buffer)
        else:
            reduce(incoming, buffer, out=buffer)
        mask <<= 1
    if rank < 2 * extra:
        comm.Send(buffer, dest=rank - 1)
    return buffer


def reduce_broadcast_allreduce(comm, buffer, op: str = "sum", root: int = 0):
    """Reduce to ``root`` and broadcast back, with plain Send/Recv: 2 (P - 1) whole-buffer messages."""
    size, rank = comm.size, comm.rank
    if rank != root:
        comm.Send(buffer, dest=root)
        comm.Recv(buffer, source=root)
        return buffer
    reduce, incoming = REDUCE[op], np.empty_like(buffer)
    others = [other for other in range(size) if other != root]
    for other in others:  # in rank order, so the sum does not depend on who arrives first
        comm.Recv(incoming, source=other)
        reduce(buffer, incoming, out=buffer)
    for other in others:
        comm.Send(buffer, dest=other)
    return buffer


ALGORITHMS = {"ring": ring_allreduce, "recursive_doubling": recursive_doubling_allreduce,
              "reduce_broadcast": reduce_broadcast_allreduce}


def allreduce(comm, buffer, algorithm: str = "ring", op: str = "sum", check: bool = True):
    """In-place Allreduce of ``buffer`` (n,) with one of ALGORITHMS, or "mpi" for comm.Allreduce.

    ``check=False`` skips :func:`check_buffer` (allgathers), e.g. when timing a buffer checked once already.
    """
    if algorithm != "mpi" and algorithm not in ALGORITHMS:
        raise ValueError(f"algorithm must be 'mpi' or one of {', '.join(ALGORITHMS)}; got {algorithm!r}")
    if check:
        check_buffer(comm, buffer, op, min_elements=comm.size if algorithm == "ring" else 1)
    if algorithm == "mpi":
        comm.Allreduce(MPI.IN_PLACE, buffer, op={"sum": MPI.SUM, "max": MPI.MAX, "min": MPI.MIN, "prod": MPI.PROD}[op])
        return buffer
    return ALGORITHMS[algorithm](comm, buffer, op)
