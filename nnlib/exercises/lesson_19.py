"""Lesson 19's exercises (notebook 19_planning_a_run): a pipeline step's compute from its stages' times, and the
fastest layout that fits in memory.
"""

import numpy as np

from nnlib.exercises import Exercise, case_generator

LESSON = 19


def pipeline_compute_seconds(stage_seconds, micro_batches):
    """Seconds of computing in one pipeline step: stage s takes stage_seconds[s] on each of the
    `micro_batches` micro-batches; a micro-batch goes through the stages in order, and a stage takes
    the next micro-batch as soon as it is free. (No messages: they take no time here.)"""
    return (micro_batches - 1) * max(stage_seconds) + sum(stage_seconds)


def fastest_that_fits(step_seconds, peak_bytes, limit_bytes):
    """The index of the fastest layout whose peak memory per rank is at most `limit_bytes`, or -1 if
    none fits. step_seconds[i], peak_bytes[i]: layout i's predicted step time and bytes per rank."""
    fits = [i for i in range(len(step_seconds)) if peak_bytes[i] <= limit_bytes]
    return min(fits, key=lambda i: step_seconds[i]) if fits else -1


def pipeline_cases():
    """(stage_seconds, micro_batches): equal and unequal stages, the slowest first, last and inside, one stage."""
    generator = case_generator("19.1")
    cases = [([1.0, 1.0], 4), ([2.0], 3), ([0.5, 2.0, 1.0], 1)]
    return cases + [(list(generator.uniform(0.1, 1.0, size=stages)), int(m))
                    for stages, m in [(2, 4), (3, 8), (4, 5), (5, 16)]]


def layout_cases():
    """(step_seconds, peak_bytes, limit_bytes): the fastest too big, a tie kept at the first, none fitting."""
    generator = case_generator("19.2")
    cases = [([3.0, 1.0, 2.0], [10, 30, 20], 25), ([2.0, 2.0], [5, 5], 5), ([1.0], [9], 8)]
    for count in (5, 9, 17):
        seconds, peaks = generator.uniform(1, 5, size=count), generator.integers(1, 100, size=count)
        cases.append((list(seconds), list(peaks), int(np.median(peaks))))
    return cases


EXERCISES = [
    Exercise("19.1", pipeline_compute_seconds, pipeline_cases,
             "follow the first micro-batch through every stage; after it, the slowest stage lets one "
             "micro-batch through per its own time."),
    Exercise("19.2", fastest_that_fits, layout_cases,
             "first keep the layouts whose bytes are within the limit, then take the least time among them; "
             "say -1 when nothing is left."),
]
