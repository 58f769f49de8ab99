"""Lesson 08's exercises (notebook 08_inside_allreduce): the ring's chunks, one reduce-scatter step on
every rank at once, and the bus bandwidth.
"""

import numpy as np

from nnlib.exercises import Exercise, case_generator, uniform

LESSON = 8


def chunk_bounds(length, parts):
    """The ring's chunks of a buffer of `length` elements: (counts (parts,), starts (parts,)),
    as even as possible, the first chunks one element longer."""
    counts = np.full(parts, length // parts)
    counts[: length % parts] += 1
    return counts, np.concatenate(([0], np.cumsum(counts)[:-1]))


def ring_step(buffers, step):
    """One reduce-scatter step of the ring on every rank at once. buffers (P, n): row r is
    rank r's buffer, cut into P chunks by chunk_bounds. In step k, rank r sends its chunk
    (r - k - 1) mod P to rank (r + 1) mod P, which adds it to its own copy of that chunk.
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


def ring_step_cases():
    generator = case_generator("08.2")
    return [(uniform(generator, ranks, length), step)
            for ranks, length, step in [(3, 7, 0), (3, 7, 1), (4, 10, 2), (2, 5, 0), (5, 12, 3)]]


EXERCISES = [
    Exercise("08.1", chunk_bounds, lambda: [(10, 3), (7, 7), (3, 5), (1001, 4)],
             "the same split as Scatterv's rows."),
    Exercise("08.2", ring_step, ring_step_cases,
             "every rank sends and receives in the same step: read what is sent from the buffers *before* "
             "the step, and add it into a copy."),
    Exercise("08.3", bus_bandwidth, lambda: [(1e6, 1e-3, 2), (8e6, 5e-3, 4), (4.0, 1e-6, 1)],
             "a ring moves 2 (P - 1) / P of the buffer through every link."),
]
