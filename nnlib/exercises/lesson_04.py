"""Lesson 04's exercise (notebook 04_mpi_collectives): Scatterv's counts. (The alpha-beta model is lesson 05's.)"""

import numpy as np

from nnlib.exercises import Exercise

LESSON = 4


def scatterv_counts(rows, ranks, row_length):
    """Scatterv's counts and displacements, in elements, for `rows` rows of `row_length` numbers
    split over `ranks` ranks as evenly as possible, the first ranks taking one more row.
    Returns (counts (ranks,), displacements (ranks,)), integer arrays."""
    rows_per_rank = np.full(ranks, rows // ranks)
    rows_per_rank[: rows % ranks] += 1
    counts = rows_per_rank * row_length
    displacements = np.concatenate(([0], np.cumsum(counts)[:-1]))
    return counts, displacements


EXERCISES = [
    Exercise("04.1", scatterv_counts, lambda: [(10, 3, 4), (7, 2, 784), (3, 4, 5), (12, 4, 1)],
             "rows // ranks each, and one more for the first rows % ranks ranks; then multiply by the row "
             "length; each displacement is the sum of the counts before it."),
]
