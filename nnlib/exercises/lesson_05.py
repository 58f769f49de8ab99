"""Lesson 05's exercises (notebook 05_data_parallel_training): a parameter server's step with uneven
batches, and a rank's rows of the global batch.
"""

from nnlib.exercises import Exercise, case_generator, uniform

LESSON = 5


def parameter_server_step(params, worker_grads, worker_batch_sizes, learning_rate):
    """The server's SGD step: worker_grads[i] is the mean gradient over worker i's
    worker_batch_sizes[i] samples; step along the mean gradient over all samples."""
    gradient_sum = sum(size * grad for size, grad in zip(worker_batch_sizes, worker_grads))
    return params - learning_rate * gradient_sum / sum(worker_batch_sizes)


def local_rows(global_batch, rank, ranks):
    """The (start, stop) rows of a global batch that `rank` of `ranks` takes, split as
    Scatterv splits (the first ranks take one more row)."""
    base, extra = divmod(global_batch, ranks)
    start = rank * base + min(rank, extra)
    return start, start + base + (rank < extra)


def parameter_server_cases():
    """(params (n,), one gradient (n,) per worker, the workers' batch sizes, the learning rate)."""
    generator = case_generator("05.1")
    return [(uniform(generator, n), [uniform(generator, n) for _ in sizes], sizes, 0.5)
            for sizes, n in [([3, 3], 5), ([4, 3, 3], 7), ([1, 5], 2)]]


EXERCISES = [
    Exercise("05.1", parameter_server_step, parameter_server_cases,
             "uneven batches: a worker's mean over more samples must weigh more. Turn each mean back into a "
             "sum first."),
    Exercise("05.2", local_rows, lambda: [(10, r, 3) for r in range(3)] + [(7, 1, 4), (7, 3, 4), (5, 0, 1)],
             "count the rows the ranks before this one take; they are the start."),
]
