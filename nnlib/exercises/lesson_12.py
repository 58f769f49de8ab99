"""Lesson 12's exercises (notebook 12_pipeline_parallelism): the pipeline's bubble, and the micro-batches a stage
keeps alive (homework).
"""

from nnlib.exercises import Exercise

LESSON = 12


def bubble_fraction(stages, micro_batches):
    """The idle fraction of a pipeline step with equal stages and this many micro-batches."""
    return (stages - 1) / (micro_batches + stages - 1)


def micro_batches_alive(stages, stage, micro_batches, schedule):
    """The most micro-batches stage ``stage`` of ``stages`` keeps alive at once (forwarded, backward not yet run)
    in one step of ``micro_batches`` micro-batches, under ``schedule`` "gpipe" or "1f1b"."""
    if schedule == "gpipe":
        return micro_batches  # every forward runs before the first backward
    return min(stages - stage, micro_batches)  # P - s - 1 forwards fill the pipe, then one in, one out


EXERCISES = [
    Exercise("12.1", bubble_fraction, lambda: [(1, 1), (2, 1), (4, 8), (3, 5)],
             "draw the timeline: how many slots does each stage have, and in how many is it busy?"),
    Exercise("12.2", micro_batches_alive,
             lambda: [(2, 0, 4, "gpipe"), (4, 0, 8, "1f1b"), (4, 3, 8, "1f1b"), (4, 1, 2, "1f1b"), (3, 1, 5, "gpipe"),
                      (1, 0, 3, "1f1b")],
             "count the forwards a stage runs before its first backward under each schedule; can it be more than m?"),
]
