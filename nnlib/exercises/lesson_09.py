"""Lesson 09's exercise (notebook 09_ring_allreduce): one reduce-scatter step on every rank at once. (The ring's
chunks are lesson 04's split, exercise 04.1: chunk_bounds below is a helper of the worked answer, not an exercise.)
"""

import numpy as np

from nnlib.exercises import Exercise, case_generator, uniform

LESSON = 9


def chunk_bounds(length, parts):
    """The ring's chunks of a buffer of `length` elements: (counts (parts,), starts (parts,)),
    as even as possible, the first chunks one element longer."""
    counts = np.full(parts, length // parts)
    counts[: length % parts] += 1
    return counts, np.concatenate(([0], np.cumsum(counts)[:-1]))


def ring_step(buffers, step):
    """One reduce-scatter step of the ring on every rank at once. buffers (P, n): row r is
    rank r's buffer, cut into P chunks as lesson 04 splits rows. In step k, rank r sends its chunk
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


def ring_step_cases():
    generator = case_generator("09.2")
    return [(uniform(generator, ranks, length), step)
            for ranks, length, step in [(3, 7, 0), (3, 7, 1), (4, 10, 2), (2, 5, 0), (5, 12, 3)]]


EXERCISES = [
    Exercise("09.1", ring_step, ring_step_cases,
             "every rank sends and receives in the same step: read what is sent from the buffers *before* "
             "the step, and add it into a copy."),
]
