"""Worked solutions to the exercises of lesson 04. Try them yourself first: check() tells you what is wrong."""

import numpy as np


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
