"""Worked solutions to the exercises of lesson 08. Try them yourself first: check() tells you what is wrong."""

import numpy as np


def chunk_bounds(length, parts):
    """The ring's chunks of a buffer of `length` elements: (counts (parts,), starts (parts,)),
    as even as possible, the first chunks one element longer."""
    counts = np.full(parts, length // parts)
    counts[: length % parts] += 1
    return counts, np.concatenate(([0], np.cumsum(counts)[:-1]))


def ring_step(buffers, step):
    """One reduce-scatter step of the ring on every rank at once. buffers (P, n): row r is
    rank r's buffer, cut into P chunks by chunk_bounds. In step s, rank r sends its chunk
    (r - s - 1) mod P to rank (r + 1) mod P, which adds it to its own copy of that chunk.
    Returns the buffers after the step (a new array)."""
    ranks = buffers.shape[0]
    counts, starts = chunk_bounds(buffers.shape[1], ranks)
    after = buffers.copy()
    for rank in range(ranks):
        chunk = (rank - step - 1) % ranks
        part = slice(starts[chunk], starts[chunk] + counts[chunk])
        after[(rank + 1) % ranks, part] += buffers[rank, part]  # what was sent is read from *before* the step
    return after


def bus_bandwidth(n_bytes, seconds, ranks):
    """nccl-tests' bus bandwidth (bytes/s) of an Allreduce of n_bytes that took `seconds` on `ranks`."""
    return n_bytes / seconds * 2 * (ranks - 1) / ranks
