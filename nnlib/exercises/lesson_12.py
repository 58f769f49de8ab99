"""Lesson 12's exercises (notebook 12_memory): FSDP's chunk of every layer, the activations held with
checkpoints every k layers, and one update of the dynamic loss scale.
"""

import math

import numpy as np

from nnlib.exercises import Exercise

LESSON = 12


def layer_chunks(layer_sizes, ranks, rank):
    """FSDP's chunks: for each layer's flat [W_l, b_l] (n_in n_out + n_out values), the (start, stop) of
    the chunk that `rank` of `ranks` holds, the first (n_l mod ranks) chunks one value longer.
    Returns an integer array (layers, 2)."""
    rows = []
    for n_in, n_out in zip(layer_sizes[:-1], layer_sizes[1:]):
        size = n_in * n_out + n_out
        base, extra = divmod(size, ranks)
        start = rank * base + min(rank, extra)
        rows.append((start, start + base + (1 if rank < extra else 0)))
    return np.array(rows)


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


def chunks_cases():
    return [((12, 9, 8, 7, 4), 3, 2), ((784, 30, 10), 4, 0), ((5, 3, 2), 7, 6)]


def peak_cases():
    return [(16, every) for every in (1, 3, 4, 16)] + [(7, 3), (10, round(math.sqrt(10)))]


EXERCISES = [
    Exercise("12.1", layer_chunks, chunks_cases,
             "do it layer by layer: n_l = n_in n_out + n_out; divmod(n_l, ranks) gives the base length and how "
             "many chunks get one more; rank r starts after r chunks."),
    Exercise("12.2", peak_arrays, peak_cases,
             "list the checkpoints range(0, L, k); the last segment may be shorter than k."),
    Exercise("12.3", loss_scale_update,
             lambda: [(1024.0, 5, True, 10), (1024.0, 9, False, 10), (1024.0, 3, False, 10), (2.0, 0, False, 1)],
             "an overflow wins over everything else; count the good step before testing the interval."),
]
