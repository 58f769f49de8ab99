"""Lesson 10's exercises (notebook 10_zero_and_overlap): overlap's buckets during one backward pass, and one ZeRO-1
step on every rank at once.
"""

import numpy as np

from nnlib.exercises import Exercise, case_generator, uniform

LESSON = 10


def bucket_starts(layer_bytes, bucket_bytes):
    """Overlap's buckets during one backward pass. layer_bytes: the bytes of each layer's gradient,
    in the order backpropagation finishes them (the last layer first). Each gradient joins the open
    bucket; right after the gradient that brings the bucket to bucket_bytes or more, the bucket's
    Iallreduce starts and a new, empty bucket opens; right after the last gradient the last bucket
    starts, however little it holds. -> (len(layer_bytes),) integers: the bucket whose Iallreduce
    starts right after each gradient (0, 1, ... in the order they start), or -1 where none starts."""
    started = np.full(len(layer_bytes), -1)
    bucket, filled = 0, 0
    for index, size in enumerate(layer_bytes):
        filled += size  # the gradient joins the open bucket
        if filled >= bucket_bytes or index == len(layer_bytes) - 1:
            started[index] = bucket  # the bucket is full (or backward is over): start its Iallreduce
            bucket, filled = bucket + 1, 0
    return started


def zero_step(params, grads, velocity, learning_rate, momentum):
    """One ZeRO-1 step on every rank at once. params (n,): the parameters, the same on every rank;
    grads (P, n): row r is rank r's gradient, computed on its part of the global batch (the rows add
    up to the batch's gradient); velocity: P arrays, rank r's momentum for its chunk r of the
    parameters (chunks as lesson 04 splits rows). Reduce-scatter: rank r gets chunk r of the rows' sum, g_r;
    rank r updates only chunk r: v_r <- momentum v_r - learning_rate g_r, p[chunk r] += v_r;
    allgather: every rank gets every chunk from its owner.
    -> (params (P, n): row r is rank r's after the step, a tuple of the P new velocities)."""
    ranks, n = grads.shape
    chunks = np.array_split(np.arange(n), ranks)  # rank r's indices, split as lesson 04 splits rows
    after = np.tile(params, (ranks, 1))  # row r: rank r's copy of the parameters
    new_velocity = []
    for rank, mine in enumerate(chunks):
        summed = grads[:, mine].sum(axis=0)  # reduce-scatter: rank r gets the sum of chunk r only
        new_velocity.append(momentum * velocity[rank] - learning_rate * summed)
        after[rank, mine] += new_velocity[rank]  # rank r updates its own chunk, nothing else
    for rank, mine in enumerate(chunks):
        after[:, mine] = after[rank, mine]  # allgather: chunk r goes from rank r to every rank
    return after, tuple(new_velocity)


def bucket_cases():
    """Gradients' bytes in backward's order (float64 layers); buckets of 0 bytes (one per layer), nnlib's
    64 KiB, exactly two gradients' bytes (a bucket filled to the byte), more than all, a last bucket part-full."""
    generator = case_generator("09.3")
    sizes = [784, *generator.integers(3, 40, size=5), 10]
    layer_bytes = [8 * (n_in * n_out + n_out) for n_in, n_out in zip(sizes[:-1], sizes[1:])][::-1]
    layer_bytes = [int(size) for size in layer_bytes]
    return [([10320, 803840], 1 << 16), ([2640, 16640, 401920], 0), (layer_bytes, layer_bytes[0] + layer_bytes[1]),
            (layer_bytes, sum(layer_bytes) + 1), ([800, 1600, 400, 8000, 240, 160], 2000), ([32], 1000)]


def zero_cases():
    """(P, n) with n not a multiple of P, mid-training velocities."""
    generator = case_generator("09.4")
    cases = []
    for ranks, length, momentum in [(2, 7, 0.9), (3, 10, 0.9), (4, 9, 0.5), (3, 11, 0.8), (1, 5, 0.9)]:
        chunks = np.array_split(np.arange(length), ranks)
        cases.append((uniform(generator, length), uniform(generator, ranks, length),
                      [uniform(generator, len(chunk)) for chunk in chunks], 0.1, momentum))
    return cases


EXERCISES = [
    Exercise("10.1", bucket_starts, bucket_cases,
             "add each gradient's bytes to the open bucket; start it once it holds bucket_bytes or more "
             "(then count from zero again), and start the last one after the last gradient whatever it holds."),
    Exercise("10.2", zero_step, zero_cases,
             "rank r adds chunk r of *every* row (the rows are parts of one batch: add, do not average), "
             "updates that chunk only, and then every rank copies chunk r from rank r."),
]
