"""Lesson 11's exercises (notebook 11_tensor_parallelism): a layer split by columns, the next split by rows."""

import numpy as np

from nnlib.exercises import Exercise, case_generator, uniform

LESSON = 11


def column_parallel_forward(inputs, weight_shards, bias_shards):
    """A hidden layer split by columns: rank r holds weight_shards[r] (n_in, h_r) and bias_shards[r]
    (h_r,). Returns the whole layer's activations (N, sum of h_r), rank 0's units first."""
    per_rank = [1 / (1 + np.exp(-(inputs @ weights + biases))) for weights, biases in zip(weight_shards, bias_shards)]
    return np.concatenate(per_rank, axis=1)  # what an Allgather along the units would give


def row_parallel_logits(hidden_shards, weight_shards, biases):
    """The next layer split by rows: rank r holds its hidden units hidden_shards[r] (N, h_r) and
    the matching rows weight_shards[r] (h_r, n_out). Returns the logits (N, n_out), as after
    the Allreduce."""
    partial_sums = [hidden @ weights for hidden, weights in zip(hidden_shards, weight_shards)]
    return sum(partial_sums) + biases  # the biases once, not once per rank


def column_cases():
    """(inputs (N, n_in), weight shards (n_in, h_r), bias shards (h_r,)) for uneven shard widths h_r."""
    generator = case_generator("11.1")
    return [(uniform(generator, samples, n_in), [uniform(generator, n_in, w) for w in widths],
             [uniform(generator, w) for w in widths])
            for samples, n_in, widths in [(4, 5, [3, 3]), (3, 6, [2, 2, 1]), (1, 2, [4])]]


def row_cases():
    """(hidden shards (N, h_r), weight shards (h_r, n_out), biases (n_out,)) for uneven shard widths h_r."""
    generator = case_generator("11.2")
    return [([uniform(generator, samples, w) for w in widths], [uniform(generator, w, n_out) for w in widths],
             uniform(generator, n_out))
            for samples, widths, n_out in [(4, [3, 3], 2), (3, [2, 2, 1], 4), (1, [5], 3)]]


EXERCISES = [
    Exercise("11.1", column_parallel_forward, column_cases,
             "each rank computes its own hidden units from the whole input; only the putting together "
             "needs the others."),
    Exercise("11.2", row_parallel_logits, row_cases,
             "each rank's product is a partial sum over its own hidden units; the Allreduce adds them. "
             "How many times should the biases be added?"),
]
