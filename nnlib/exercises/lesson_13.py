"""Lesson 13's exercises (notebook 13_when_things_go_wrong): the ranks that never arrived, and Young's
checkpoint interval.
"""

import math

from nnlib.exercises import Exercise

LESSON = 13


def missing_ranks(arrived, size):
    """The ranks of 0..size-1 that are not in `arrived` (a list, any order), as a sorted list."""
    return sorted(set(range(size)) - set(arrived))


def young_interval(write_seconds, node_mtbf_seconds, nodes):
    """Young's checkpoint interval in seconds for a job on `nodes` nodes, each failing on average
    once every node_mtbf_seconds, when one checkpoint takes write_seconds."""
    job_mtbf = node_mtbf_seconds / nodes
    return math.sqrt(2 * write_seconds * job_mtbf)


FIVE_YEARS = 5 * 365 * 24 * 3600.0

EXERCISES = [
    Exercise("13.1", missing_ranks, lambda: [([0, 2], 3), ([3, 1, 0], 4), ([], 2), ([1, 0], 2)],
             "a set difference; sorted() gives the order."),
    Exercise("13.2", young_interval, lambda: [(60.0, FIVE_YEARS, 1), (60.0, FIVE_YEARS, 10_000), (0.005, 3600.0, 2)],
             "the job fails as soon as any of its nodes does: what is its mean time between failures?"),
]
