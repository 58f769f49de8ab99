"""Lesson 09's exercises (notebook 09_ring_allreduce): one reduce-scatter step on every rank at once,
overlap's buckets during one backward pass, and one ZeRO-1 step on every rank at once. (The ring's chunks are
lesson 04's split, exercise 04.1: chunk_bounds below is a helper of the worked answers, not an exercise.)
"""

import numpy as np

from nnlib.exercises import Exercise, case_generator, uniform

LESSON = 9


def chunk_bounds(length, parts):
    """The ring's chunks of a buffer of `length` elements: (counts (parts,), starts (parts,)),
    as even as possible, the first chunks one element longer."""
    counts = np.full(parts, length // parts)
    counts[: length % parts] += 1
    return counts, np.concatenate(([0], np.cumsum(counts)[:-1]))


def ring_step(buffers, step):
    """One reduce-scatter step of the ring on every rank at once. buffers (P, n): row r is
    rank r's buffer, cut into P chunks as lesson 04 splits rows. In step k, rank r sends its chunk
    (r - k - 1) mod P to rank (r + 1) mod P, which adds it to its own copy of that chunk.
    Returns the buffers after the step (a new array)."""
    ranks = buffers.shape[0]
    counts, starts = chunk_bounds(buffers.shape[1], ranks)
    after = buffers.copy()
    for rank in range(ranks):
        chunk = (rank - step - 1) % ranks
        part = slice(starts[chunk], starts[chunk] + counts[chunk])
        after[(rank + 1) % ranks, part] += buffers[rank, part]  # what was sent is read from *before* the step
    return after


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
    counts, starts = chunk_bounds(n, ranks)
    chunks = [slice(start, start + count) for start, count in zip(starts, counts)]
    after = np.tile(params, (ranks, 1))  # row r: rank r's copy of the parameters
    new_velocity = []
    for rank, mine in enumerate(chunks):
        summed = grads[:, mine].sum(axis=0)  # reduce-scatter: rank r gets the sum of chunk r only
        new_velocity.append(momentum * velocity[rank] - learning_rate * summed)
        after[rank, mine] += new_velocity[rank]  # rank r updates its own chunk, nothing else
    for rank, mine in enumerate(chunks):
        after[:, mine] = after[rank, mine]  # allgather: chunk r goes from rank r to every rank
    return after, tuple(new_velocity)


def ring_step_cases():
    generator = case_generator("09.2")
    return [(uniform(generator, ranks, length), step)
            for ranks, length, step in [(3, 7, 0), (3, 7, 1), (4, 10, 2), (2, 5, 0), (5, 12, 3)]]


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
        counts, _ = chunk_bounds(length, ranks)
        cases.append((uniform(generator, length), uniform(generator, ranks, length),
                      [uniform(generator, count) for count in counts], 0.1, momentum))
    return cases


EXERCISES = [
    Exercise("09.1", ring_step, ring_step_cases,
             "every rank sends and receives in the same step: read what is sent from the buffers *before* "
             "the step, and add it into a copy."),
    Exercise("09.2", bucket_starts, bucket_cases,
             "add each gradient's bytes to the open bucket; start it once it holds bucket_bytes or more "
             "(then count from zero again), and start the last one after the last gradient whatever it holds."),
    Exercise("09.3", zero_step, zero_cases,
             "rank r adds chunk r of *every* row (the rows are parts of one batch: add, do not average), "
             "updates that chunk only, and then every rank copies chunk r from rank r."),
]
