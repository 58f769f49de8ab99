"""Lesson 04's exercises (notebook 04_mpi_collectives): Scatterv's counts, and the alpha-beta model."""

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


def alpha_beta_time(n_bytes, alpha, beta):
    """The alpha-beta model's time to send messages of n_bytes (an array), alpha seconds of
    latency plus beta seconds per byte."""
    return alpha + beta * n_bytes


EXERCISES = [
    Exercise("04.1", scatterv_counts, lambda: [(10, 3, 4), (7, 2, 784), (3, 4, 5), (12, 4, 1)],
             "rows // ranks each, and one more for the first rows % ranks ranks; then multiply by the row "
             "length; each displacement is the sum of the counts before it."),
    Exercise("04.2", alpha_beta_time,
             lambda: [(np.array([8.0, 1e3, 1e6]), 2e-6, 1e-9), (np.array([0.0]), 1e-5, 5e-10)],
             "a start-up cost paid once per message, plus a cost per byte."),
]
