"""Lesson 07's exercises (notebook 07_scaling): Amdahl's and Gustafson's laws, parallel efficiency."""

import numpy as np

from nnlib.exercises import Exercise

LESSON = 7


def amdahl_speedup(ranks, serial_fraction):
    """Amdahl's speedup on each number of ranks (an array) when a fraction of the work is serial."""
    return 1 / (serial_fraction + (1 - serial_fraction) / ranks)


def gustafson_speedup(ranks, serial_fraction):
    """Gustafson's scaled speedup on each number of ranks (an array): the work grows with the ranks."""
    return serial_fraction + (1 - serial_fraction) * ranks


def parallel_efficiency(one_rank_seconds, seconds, ranks):
    """The parallel efficiency of runs taking `seconds` on `ranks` ranks (arrays), against one rank."""
    return one_rank_seconds / seconds / ranks


def speedup_cases():
    return [(np.array([1, 2, 4, 8, 1000]), 0.05), (np.array([3]), 0.0), (np.array([2, 16]), 1.0)]


EXERCISES = [
    Exercise("07.1", amdahl_speedup, speedup_cases,
             "time on P ranks: the serial part as before, the rest divided by P; speedup is the ratio of times."),
    Exercise("07.2", gustafson_speedup, speedup_cases,
             "on P ranks the parallel part of the time did P times the work; the serial part did not grow."),
    Exercise("07.3", parallel_efficiency,
             lambda: [(10.0, np.array([10.0, 6.0, 3.5]), np.array([1, 2, 4])), (2.0, np.array([3.0]), np.array([2]))],
             "the speedup divided by what P ranks could give at best."),
]
