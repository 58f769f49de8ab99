"""Lesson 16's exercises (notebook 16_sharding_state): one FSDP layer's gather and reduce-scatter on every rank at
once, and Adam's bytes per parameter at a ZeRO stage.
"""

import numpy as np

from nnlib.exercises import Exercise, case_generator, uniform

LESSON = 16


def fsdp_layer_step(shards, inputs, deltas, n_in, n_out):
    """One FSDP sigmoid layer on every rank at once. shards[r]: rank r's chunk of the layer's flat
    [W, b] (W (n_in, n_out) row after row, then b), its n_in n_out + n_out values cut as lesson 04
    splits rows; inputs[r] (N_r, n_in), deltas[r] = dJ/dz (N_r, n_out): rank r's rows.
    Each rank gathers the whole layer, computes a = sigmoid(x W + b) and its gradient [dJ/dW = x.T delta,
    dJ/db = delta summed over its rows], flat as [W, b]; the reduce-scatter leaves rank r only chunk r
    of the sum over the ranks. Returns (outputs, gradient chunks): tuples of P arrays, (N_r, n_out)
    and shaped like shards[r]."""
    whole = np.concatenate(shards)  # the allgather: every rank's chunk, in rank order
    weights, biases = whole[:n_in * n_out].reshape(n_in, n_out), whole[n_in * n_out:]
    outputs = tuple(1 / (1 + np.exp(-(x @ weights + biases))) for x in inputs)
    gradients = [np.concatenate([(x.T @ delta).ravel(), delta.sum(axis=0)]) for x, delta in zip(inputs, deltas)]
    summed = sum(gradients)  # the reduce-scatter: the sum over the ranks, cut where the shards are cut
    stops = np.cumsum([len(shard) for shard in shards])
    return outputs, tuple(summed[stop - len(shard):stop] for shard, stop in zip(shards, stops))


def zero_bytes_per_parameter(stage, ranks, state_bytes):
    """Bytes per parameter that each of `ranks` ranks holds for mixed-precision Adam under ZeRO `stage`
    (0 to 3), the ZeRO paper's count: 2 bytes of float16 weights, 2 of float16 gradient and `state_bytes`
    of float32 optimizer state (master, momentum, variance: K = 12). Stage 1 shards the state over the
    ranks, stage 2 the gradient too, stage 3 the weights too."""
    weights = 2 / ranks if stage >= 3 else 2.0
    gradient = 2 / ranks if stage >= 2 else 2.0
    state = state_bytes / ranks if stage >= 1 else state_bytes
    return weights + gradient + state


def fsdp_cases():
    """(shards, inputs, deltas, n_in, n_out): layers whose n_in n_out + n_out values do not split evenly
    (one with an empty chunk), ranks with different numbers of rows, one rank alone."""
    generator, cases = case_generator("16.1"), []
    for n_in, n_out, rows in [(7, 4, (4, 4, 3)), (3, 2, (2, 3, 2)), (6, 5, (3, 3, 2, 2)), (2, 1, (1, 2, 1, 1)),
                              (4, 3, (5,))]:
        size, ranks = n_in * n_out + n_out, len(rows)
        whole = uniform(generator, size)
        counts = [size // ranks + (rank < size % ranks) for rank in range(ranks)]
        shards = [part.copy() for part in np.split(whole, np.cumsum(counts)[:-1])]
        cases.append((shards, [uniform(generator, n, n_in) for n in rows],
                      [0.1 * uniform(generator, n, n_out) for n in rows], n_in, n_out))
    return cases


EXERCISES = [
    Exercise("16.1", fsdp_layer_step, fsdp_cases,
             "on one machine the allgather is a concatenation of the shards in rank order; W is its first "
             "n_in n_out values in n_in rows. The reduce-scatter adds the ranks' flat gradients and cuts the "
             "sum at the shards' lengths."),
    Exercise("16.2", zero_bytes_per_parameter,
             lambda: [(stage, ranks, 12.0) for stage in range(4) for ranks in (1, 4, 64)] + [(1, 8, 4.0), (2, 3, 4.0)],
             "each of the three parts is divided by the ranks from its own stage on: the state from stage 1, "
             "the gradient from stage 2, the weights at stage 3."),
]
