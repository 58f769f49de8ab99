"""Worked solutions to the exercises of lesson 05. Try them yourself first: check() tells you what is wrong."""


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
