"""Timing code honestly, one timer for the whole series: ``warmup`` calls first, untimed (the first calls of anything
are slow: caches, memory allocation, compiled GPU kernels), then the median of several timed calls (a mean would let
the odd slow call decide). Work that returns before it is finished (a GPU kernel) needs ``synchronize``; a
collective needs every rank to start together (:func:`time_collective`)."""

from __future__ import annotations

import time

import numpy as np
from mpi4py import MPI

from nnlib.lesson04_collectives.collectives import allreduce_sum

LESSON = 4


def timed_calls(function, repeats: int = 10, warmup: int = 1, synchronize=None, before=None) -> np.ndarray:
    """Seconds of each of ``repeats`` calls of ``function()`` (repeats,), after ``warmup`` untimed calls.

    ``before()``, if given, runs untimed before each timed call; ``synchronize()``, if given, runs
    after the warm-up and inside each timed call, after ``function()`` (it waits for a device).
    """
    if repeats < 1:
        raise ValueError(f"repeats must be at least 1; got {repeats}")
    for _ in range(warmup):
        function()
    if synchronize is not None:
        synchronize()
    seconds = np.empty(repeats)
    for repeat in range(repeats):
        if before is not None:
            before()
        start = time.perf_counter()
        function()
        if synchronize is not None:
            synchronize()
        seconds[repeat] = time.perf_counter() - start
    return seconds


def median_seconds(function, repeats: int = 10, warmup: int = 2, synchronize=None) -> float:
    """Median wall time of ``function()`` over ``repeats`` calls, after ``warmup`` untimed ones (see timed_calls)."""
    return float(np.median(timed_calls(function, repeats, warmup, synchronize)))


def time_collective(comm, operation, repeats: int = 20, warmup: int = 1, before=None) -> float:
    """Median seconds of ``operation()`` (a collective every rank calls), the same on every rank: :func:`timed_calls`
    with the ranks lined up by a Barrier (after ``before()``, if given) before each call, each call counted at the
    slowest rank's time (a collective has finished only when the last rank has).
    """
    def line_up():
        if before is not None:
            before()
        comm.Barrier()

    samples = timed_calls(operation, repeats, warmup, before=line_up)
    comm.Allreduce(MPI.IN_PLACE, samples, op=MPI.MAX)
    return float(np.median(samples))


def time_messages(comm, sizes_in_bytes, repeats: int = 20, dtype=np.float64) -> np.ndarray:
    """Median seconds of one point-to-point message of each size (len(sizes),): what alpha-beta models (the times
    for costmodel.fit_latency_bandwidth). Ranks pair up (0 with 1, 2 with 3, ...; with an odd number of ranks the
    last one only waits) and swap n bytes with one Sendrecv, both directions at once, as a step of the ring or of
    recursive doubling does; timed as :func:`time_collective` (slowest pair). Needs at least 2 ranks.
    """
    if comm.size < 2:
        raise ValueError("a message needs two ranks: run with at least 2")
    itemsize = np.dtype(dtype).itemsize
    partner = comm.rank ^ 1

    def swap(outgoing, incoming):
        if partner < comm.size:
            comm.Sendrecv(outgoing, dest=partner, recvbuf=incoming, source=partner)

    seconds = []
    for size in sizes_in_bytes:
        outgoing = np.ones(max(1, int(size) // itemsize), dtype=dtype)
        incoming = np.empty_like(outgoing)
        seconds.append(time_collective(comm, lambda: swap(outgoing, incoming), repeats))
    return np.array(seconds)


EVICTION_BYTES = 64 * 2**20  # more than the caches of the machines this series runs on


def time_allreduce(comm, sizes_in_bytes, repeats: int = 20, dtype=np.float64, cold: bool = False) -> np.ndarray:
    """Median seconds of one in-place Allreduce for each message size (see time_collective).

    Back to back, the buffers stay in the caches: a best case. With ``cold``, each call comes after
    :func:`empty_caches`, as in training, where a step's data and products evict the buffers.
    """
    itemsize = np.dtype(dtype).itemsize
    buffers = [np.ones(max(1, int(size) // itemsize), dtype=dtype) for size in sizes_in_bytes]
    eviction = np.ones(EVICTION_BYTES // 4, dtype=np.float32) if cold else None  # freed on return
    return np.array([time_collective(comm, lambda: allreduce_sum(comm, buffer), repeats,
                                     before=(lambda: empty_caches(buffer, eviction)) if cold else None)
                     for buffer in buffers])


def empty_caches(buffer, eviction) -> None:
    """Read ``eviction`` (an array bigger than the caches), then write ``buffer`` (adding 0: values unchanged).

    The buffer ends as backpropagation leaves a gradient: just written by this core, the rest evicted.
    """
    eviction.sum()
    buffer += 0
