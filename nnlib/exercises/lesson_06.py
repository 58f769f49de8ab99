"""Lesson 06's exercises (notebook 06_data_parallel_training): a parameter server's step with uneven
batches, and which rows of its shard a rank takes from the global batch.
"""

import numpy as np

from nnlib.exercises import Exercise, case_generator, uniform

LESSON = 6


def parameter_server_step(params, worker_grads, worker_batch_sizes, learning_rate):
    """The server's SGD step: worker_grads[i] is the mean gradient over worker i's
    worker_batch_sizes[i] samples; step along the mean gradient over all samples."""
    gradient_sum = sum(size * grad for size, grad in zip(worker_batch_sizes, worker_grads))
    return params - learning_rate * gradient_sum / sum(worker_batch_sizes)


def my_rows(batch, start, stop):
    """The rows of this rank's shard (samples start, ..., stop - 1) that the global batch
    holds: batch is an array of sample numbers; return their positions in the shard
    (sample start is row 0), in the batch's order."""
    return batch[(batch >= start) & (batch < stop)] - start


def my_rows_cases():
    """(batch, start, stop): shards of uneven sizes; the batch holds each shard's first sample (a border)."""
    generator = case_generator("06.2")
    others = generator.choice(np.setdiff1d(np.arange(23), [0, 8, 16]), 7, replace=False)
    batch = generator.permutation(np.concatenate([[0, 8, 16], others]))
    return [(batch, 0, 8), (batch, 8, 16), (batch, 16, 23), (batch[4:8], 16, 23), (batch, 0, 23)]


def parameter_server_cases():
    """(params (n,), one gradient (n,) per worker, the workers' batch sizes, the learning rate)."""
    generator = case_generator("06.1")
    return [(uniform(generator, n), [uniform(generator, n) for _ in sizes], sizes, 0.5)
            for sizes, n in [([3, 3], 5), ([4, 3, 3], 7), ([1, 5], 2)]]


EXERCISES = [
    Exercise("06.1", parameter_server_step, parameter_server_cases,
             "uneven batches: a worker's mean over more samples must weigh more. Turn each mean back into a "
             "sum first."),
    Exercise("06.2", my_rows, my_rows_cases,
             "keep the batch's sample numbers that fall in [start, stop), in order; sample start is row 0."),
]
