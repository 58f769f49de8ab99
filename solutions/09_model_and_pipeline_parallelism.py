"""Worked solutions to the exercises of lesson 09. Try them yourself first: check() tells you what is wrong."""

import numpy as np


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


def bubble_fraction(stages, micro_batches):
    """The idle fraction of a pipeline step with equal stages and this many micro-batches."""
    return (stages - 1) / (micro_batches + stages - 1)
