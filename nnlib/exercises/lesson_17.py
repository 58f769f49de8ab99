"""Lesson 17's exercises (notebook 17_shrinking_activations): the activations held with checkpoints every k
layers, and one update of the dynamic loss scale.
"""

import math

from nnlib.exercises import Exercise

LESSON = 17


def peak_arrays(num_layers, every):
    """Activation arrays a_l held at the peak of backward with a checkpoint every `every` layers (the
    inputs of layers 0, k, 2k, ... are kept; a_0 is the batch itself and not counted): the checkpoints
    after a_0, the output a_L, and the recomputed inputs of the longest segment but its checkpoint."""
    checkpoints = list(range(0, num_layers, every))
    longest = max(min(start + every, num_layers) - start for start in checkpoints)
    return len(checkpoints) - 1 + 1 + longest - 1


def loss_scale_update(scale, good_steps, overflowed, growth_interval):
    """One step of dynamic loss scaling -> (new scale, new count of good steps in a row, skip this step?).
    Overflow: halve, reset the count, skip. Otherwise count the step; every growth_interval-th good
    step in a row doubles the scale."""
    if overflowed:
        return scale / 2, 0, True
    good_steps += 1
    return (scale * 2 if good_steps % growth_interval == 0 else scale), good_steps, False


def peak_cases():
    return [(16, every) for every in (1, 3, 4, 16)] + [(7, 3), (10, round(math.sqrt(10)))]


EXERCISES = [
    Exercise("17.1", peak_arrays, peak_cases,
             "list the checkpoints range(0, L, k); the last segment may be shorter than k."),
    Exercise("17.2", loss_scale_update,
             lambda: [(1024.0, 5, True, 10), (1024.0, 9, False, 10), (1024.0, 3, False, 10), (2.0, 0, False, 1)],
             "an overflow wins over everything else; count the good step before testing the interval."),
]
