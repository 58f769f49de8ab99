"""The exercises at the end of every lesson: what to write, the cases it is checked on, the right answer.

Each :class:`Exercise` has a ``key`` ("02.2": lesson 02, exercise 2), the ``function`` the student
writes, its ``signature`` (the def line and docstring the notebook's exercise cell starts from),
``cases`` (argument tuples, sizes that do not divide evenly among them), a ``reference`` giving the
right result (nnlib's own function where it has one, so that the lesson and the check cannot
disagree; the plain formula otherwise), a ``hint`` that points at the idea without the answer, and
the relative ``tolerance``. :func:`nnlib.check.check` runs them; ``solutions/`` holds worked answers.

The MPI exercises are written as what happens on *every* rank at once, with the ranks' arrays side
by side (e.g. a ring step on an array with one row per rank): the idea of the lesson, checkable in
one process and in a second.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from . import allreduce, collectives, compression, costmodel, data, scaling, training
from .parallel import pipeline
from .network import count_parameters, cross_entropy_from_logits, sigmoid, sigmoid_prime_from_activation

LESSON = 11  # every lesson's exercises



@dataclass(frozen=True)
class Exercise:
    key: str
    function: str
    signature: str
    cases: Callable[[], list]
    reference: Callable
    hint: str
    tolerance: float = 1e-10

    def template(self) -> str:
        """The exercise cell as the notebook gives it: the signature and a body left to write."""
        return f"{self.signature}\n    ...  # your code here"


def rng(key: str):
    """The same cases every time, different for every exercise."""
    return np.random.default_rng([int(part) for part in key.split(".")])


def uniform(generator, *shape):
    return generator.uniform(-1, 1, size=shape)


# --- 00 · Start here ---------------------------------------------------------------------------


def reference_gradient_bytes(layer_sizes, itemsize):
    return count_parameters(layer_sizes) * itemsize


# --- 02 · The network from scratch -------------------------------------------------------------


def reference_layer_forward(inputs, weights, biases):
    return sigmoid(inputs @ weights + biases)


def reference_layer_backward(inputs, weights, activations, grad_activations):
    delta = grad_activations * sigmoid_prime_from_activation(activations)  # dJ/dz, (N, n_out)
    return inputs.T @ delta, delta.sum(axis=0), delta @ weights.T


def reference_cross_entropy(logits, targets):
    return float(cross_entropy_from_logits(logits, targets, "sigmoid", np)) / len(logits)


# --- 03 · Training -----------------------------------------------------------------------------


def reference_momentum_step(params, velocity, grads, learning_rate, momentum):
    params, velocity = params.copy(), velocity.copy()
    training.sgd_update(params, grads, velocity, learning_rate, momentum)
    return params, velocity


def reference_accuracy(probabilities, labels):
    return float(np.mean(np.argmax(probabilities, axis=1) == labels))


def reference_batch_ranges(num_samples, batch_size):
    return np.array(training.batch_ranges(num_samples, batch_size), dtype=np.int64).reshape(-1, 2)


# --- 04 · Collectives --------------------------------------------------------------------------


def reference_scatterv_counts(rows, ranks, row_length):
    counts = collectives.split_counts(rows, ranks) * row_length
    return counts, collectives.offsets(counts)


# --- 05 · Data parallelism ---------------------------------------------------------------------


def reference_parameter_server_step(params, worker_grads, worker_batch_sizes, learning_rate):
    sizes = np.asarray(worker_batch_sizes, dtype=np.float64)
    mean_gradient = sum(size * grad for size, grad in zip(sizes, worker_grads)) / sizes.sum()
    return params - learning_rate * mean_gradient


def reference_local_rows(global_batch, rank, ranks):
    return collectives.row_range(global_batch, ranks, rank)


# --- 07 · GPU ----------------------------------------------------------------------------------


def reference_matmul_gflops(m, k, n, seconds):
    return 2.0 * m * k * n / seconds / 1e9


def reference_gpu_wins(m, k, n, cpu_gflops, gpu_gflops, transfer_gbytes_per_second):
    flops = 2.0 * m * k * n
    moved_bytes = 4.0 * (m * k + k * n + m * n)  # float32: both inputs there, the product back
    gpu_seconds = moved_bytes / (transfer_gbytes_per_second * 1e9) + flops / (gpu_gflops * 1e9)
    return bool(gpu_seconds < flops / (cpu_gflops * 1e9))


# --- 08 · Inside Allreduce ---------------------------------------------------------------------


def reference_chunk_bounds(length, parts):
    counts, starts = allreduce.chunk_bounds(length, parts)
    return np.array(counts, dtype=np.int64), np.array(starts, dtype=np.int64)


def reference_ring_step(buffers, step):
    """buffers (P, n): row r is rank r's buffer before reduce-scatter step ``step``; after it."""
    ranks = buffers.shape[0]
    counts, starts = allreduce.chunk_bounds(buffers.shape[1], ranks)
    after = buffers.copy()
    for sender, receiver, chunk in allreduce.ring_schedule(ranks)[step]["sends"]:
        part = slice(starts[chunk], starts[chunk] + counts[chunk])
        after[receiver, part] += buffers[sender, part]
    return after


# --- 09 · Model and pipeline parallelism -------------------------------------------------------


def reference_column_parallel_forward(inputs, weight_shards, bias_shards):
    return np.concatenate([sigmoid(inputs @ w + b) for w, b in zip(weight_shards, bias_shards)], axis=1)


def reference_row_parallel_logits(hidden_shards, weight_shards, biases):
    return sum(h @ w for h, w in zip(hidden_shards, weight_shards)) + biases


# --- 10 · When things go wrong -----------------------------------------------------------------


def reference_missing_ranks(arrived, size):
    return np.array(sorted(set(range(size)) - set(arrived)), dtype=np.int64)


def reference_young_interval(write_seconds, node_mtbf_seconds, nodes):
    return float(np.sqrt(2 * write_seconds * node_mtbf_seconds / nodes))


# --- 11 · Beyond synchronous SGD --------------------------------------------------------------


def reference_top_k_step(gradient, residual, k):
    corrected = gradient + residual
    sent = np.zeros_like(corrected)
    chosen = compression.top_k(corrected, k)
    sent[chosen] = corrected[chosen]
    return sent, corrected - sent


def bfloat16_cases():
    generator = rng("11.1")
    halfway = np.array([0x3F808000, 0x3F818000, 0x3F808001, 0xBF807FFF], dtype=np.uint32).view(np.float32)
    return [(halfway,), (generator.normal(size=20).astype(np.float32),),
            ((generator.normal(size=(3, 4)) * 1e20).astype(np.float32),)]


def top_k_cases():
    generator = rng("11.2")
    return [(generator.normal(size=n), generator.normal(size=n) * 0.1, k) for n, k in [(10, 3), (7, 7), (25, 1)]]


# --- case makers -------------------------------------------------------------------------------


def layer_cases(key, with_activations=False):
    generator = rng(key)
    cases = []
    for samples, n_in, n_out in [(5, 4, 3), (7, 6, 1), (1, 3, 5)]:
        inputs, weights = uniform(generator, samples, n_in), uniform(generator, n_in, n_out)
        if with_activations:
            activations = sigmoid(inputs @ weights + uniform(generator, n_out))
            cases.append((inputs, weights, activations, uniform(generator, samples, n_out)))
        else:
            cases.append((inputs, weights, uniform(generator, n_out)))
    return cases


def cross_entropy_cases():
    generator = rng("02.3")
    return [(uniform(generator, n, k) * 4, data.one_hot(generator.integers(0, k, n), k, np.float64))
            for n, k in [(5, 3), (8, 10), (1, 2)]]


def momentum_cases():
    generator = rng("03.1")
    return [(uniform(generator, n), uniform(generator, n), uniform(generator, n), rate, mu)
            for n, rate, mu in [(6, 0.5, 0.9), (11, 3.0, 0.0), (1, 0.1, 0.5)]]


def accuracy_cases():
    generator = rng("03.2")
    return [(generator.uniform(size=(n, 10)), generator.integers(0, 10, n)) for n in (20, 7, 1)]


def parameter_server_cases():
    generator = rng("05.1")
    cases = []
    for sizes, n in [([3, 3], 5), ([4, 3, 3], 7), ([1, 5], 2)]:
        cases.append((uniform(generator, n), [uniform(generator, n) for _ in sizes], sizes, 0.5))
    return cases


def ring_step_cases():
    generator = rng("08.2")
    return [(uniform(generator, ranks, length), step) for ranks, length, step in [(3, 7, 0), (3, 7, 1), (4, 10, 2),
                                                                                (2, 5, 0), (5, 12, 3)]]


def column_cases():
    generator = rng("09.1")
    cases = []
    for samples, n_in, shard_widths in [(4, 5, [3, 3]), (3, 6, [2, 2, 1]), (1, 2, [4])]:
        cases.append((uniform(generator, samples, n_in), [uniform(generator, n_in, w) for w in shard_widths],
                      [uniform(generator, w) for w in shard_widths]))
    return cases


def row_cases():
    generator = rng("09.2")
    cases = []
    for samples, shard_widths, n_out in [(4, [3, 3], 2), (3, [2, 2, 1], 4), (1, [5], 3)]:
        cases.append(([uniform(generator, samples, w) for w in shard_widths],
                      [uniform(generator, w, n_out) for w in shard_widths], uniform(generator, n_out)))
    return cases


def image_cases():
    generator = rng("01.1")
    return [(generator.integers(0, 256, size=shape, dtype=np.uint8),) for shape in [(3, 28, 28), (5, 20, 20), (1, 2, 2)]]


SIZES = [(784, 30, 10), (784, 128, 64, 10), (3, 2)]

EXERCISES: dict[str, Exercise] = {exercise.key: exercise for exercise in [
    Exercise("00.1", "count_parameters", 'def count_parameters(layer_sizes):\n'
             '    """How many weights and biases a network with these layer sizes has, e.g. (784, 30, 10) -> an int."""',
             lambda: [(sizes,) for sizes in SIZES], count_parameters,
             "every layer but the first has a weight for each of its inputs and a bias, for each of its units."),
    Exercise("00.2", "gradient_bytes", 'def gradient_bytes(layer_sizes, itemsize):\n'
             '    """The bytes of one gradient (what each step sends), with numbers of `itemsize` bytes each."""',
             lambda: [(sizes, size) for sizes in SIZES for size in (8, 4)], reference_gradient_bytes,
             "the gradient has one number for each parameter; you may call your count_parameters."),
    Exercise("01.1", "scale_pixels", 'def scale_pixels(images):\n'
             '    """uint8 images (N, H, W) with values 0..255 -> float32 (N, H*W) with values in [0, 1]."""',
             image_cases, data.scale_pixels,
             "flatten each image into one row, then divide by the largest pixel value, in float32.", 1e-6),
    Exercise("01.2", "one_hot", 'def one_hot(labels, num_classes):\n'
             '    """Labels (N,) in 0..num_classes-1 -> float32 (N, num_classes): a 1 in each row\'s label column."""',
             lambda: [(np.array(labels), classes) for labels, classes in [([3, 0, 9, 3], 10), ([1, 0, 2], 3), ([0], 1)]],
             lambda labels, classes: data.one_hot(labels, classes, np.float32),
             "start from zeros; row i needs a single 1, in column labels[i] (fancy indexing sets them all at once)."),
    Exercise("02.1", "layer_forward", 'def layer_forward(inputs, weights, biases):\n'
             '    """inputs (N, n_in), weights (n_in, n_out), biases (n_out,) -> activations sigma(inputs W + b) (N, n_out)."""',
             lambda: layer_cases("02.1"), reference_layer_forward,
             "one matrix product for all N samples at once; the biases broadcast over the rows."),
    Exercise("02.2", "layer_backward", 'def layer_backward(inputs, weights, activations, grad_activations):\n'
             '    """One sigmoid layer backwards. inputs a_prev (N, n_in), weights (n_in, n_out),\n'
             '    activations a = sigma(a_prev W + b) (N, n_out), grad_activations dJ/da (N, n_out) ->\n'
             '    (grad_weights (n_in, n_out), grad_biases (n_out,), grad_inputs (N, n_in))."""',
             lambda: layer_cases("02.2", with_activations=True), reference_layer_backward,
             "first dJ/dz with the chain rule, using sigma'(z) = a (1 - a); each gradient has the shape of "
             "what it is the gradient of, which tells you what to multiply and what to transpose."),
    Exercise("02.3", "cross_entropy", 'def cross_entropy(logits, targets):\n'
             '    """Mean over the N samples of the cross-entropy of sigmoid outputs a = sigma(logits) against\n'
             '    one-hot targets y, summed over the K outputs. logits (N, K), targets (N, K) -> a float."""',
             cross_entropy_cases, reference_cross_entropy,
             "-[y ln a + (1 - y) ln(1 - a)] for every output; add over outputs and samples, divide by N.", 1e-9),
    Exercise("03.1", "momentum_step", 'def momentum_step(params, velocity, grads, learning_rate, momentum):\n'
             '    """One SGD step with momentum; returns (new_params, new_velocity), each shaped like params."""',
             momentum_cases, reference_momentum_step,
             "the velocity keeps a fraction (the momentum) of itself and moves against the gradient; "
             "the parameters then move by the new velocity."),
    Exercise("03.2", "accuracy", 'def accuracy(probabilities, labels):\n'
             '    """The fraction of samples whose most probable class is their label. (N, K), (N,) -> a float."""',
             accuracy_cases, reference_accuracy,
             "np.argmax along the right axis gives each sample's prediction; the mean of a boolean array "
             "is the fraction of True."),
    Exercise("03.3", "batch_ranges", 'def batch_ranges(num_samples, batch_size):\n'
             '    """The (start, stop) of every mini-batch of one epoch, in order; the last one may be smaller.\n'
             '    Returns an int array (number of batches, 2)."""',
             lambda: [(10, 3), (12, 4), (5, 8), (1, 1)], reference_batch_ranges,
             "range(0, num_samples, batch_size) gives the starts; the last stop must not pass num_samples."),
    Exercise("04.1", "scatterv_counts", 'def scatterv_counts(rows, ranks, row_length):\n'
             '    """Scatterv\'s counts and displacements, in elements, for `rows` rows of `row_length` numbers\n'
             '    split over `ranks` ranks as evenly as possible, the first ranks taking one more row.\n'
             '    Returns (counts (ranks,), displacements (ranks,)), integer arrays."""',
             lambda: [(10, 3, 4), (7, 2, 784), (3, 4, 5), (12, 4, 1)], reference_scatterv_counts,
             "rows // ranks each, and one more for the first rows % ranks ranks; then multiply by the row "
             "length; each displacement is the sum of the counts before it."),
    Exercise("04.2", "alpha_beta_time", 'def alpha_beta_time(n_bytes, alpha, beta):\n'
             '    """The alpha-beta model\'s time to send messages of n_bytes (an array), alpha seconds of\n'
             '    latency plus beta seconds per byte."""',
             lambda: [(np.array([8.0, 1e3, 1e6]), 2e-6, 1e-9), (np.array([0.0]), 1e-5, 5e-10)],
             costmodel.predicted_time, "a start-up cost paid once per message, plus a cost per byte."),
    Exercise("05.1", "parameter_server_step",
             'def parameter_server_step(params, worker_grads, worker_batch_sizes, learning_rate):\n'
             '    """The server\'s SGD step: worker_grads[i] is the mean gradient over worker i\'s\n'
             '    worker_batch_sizes[i] samples; step along the mean gradient over all samples."""',
             parameter_server_cases, reference_parameter_server_step,
             "uneven batches: a worker's mean over more samples must weigh more. Turn each mean back into a "
             "sum first."),
    Exercise("05.2", "local_rows", 'def local_rows(global_batch, rank, ranks):\n'
             '    """The (start, stop) rows of a global batch that `rank` of `ranks` takes, split as\n'
             '    Scatterv splits (the first ranks take one more row)."""',
             lambda: [(10, r, 3) for r in range(3)] + [(7, 1, 4), (7, 3, 4), (5, 0, 1)], reference_local_rows,
             "count the rows the ranks before this one take; they are the start."),
    Exercise("06.1", "amdahl_speedup", 'def amdahl_speedup(ranks, serial_fraction):\n'
             '    """Amdahl\'s speedup on each number of ranks (an array) when a fraction of the work is serial."""',
             lambda: [(np.array([1, 2, 4, 8, 1000]), 0.05), (np.array([3]), 0.0), (np.array([2, 16]), 1.0)],
             scaling.amdahl_speedup,
             "time on P ranks: the serial part as before, the rest divided by P; speedup is the ratio of times."),
    Exercise("06.2", "gustafson_speedup", 'def gustafson_speedup(ranks, serial_fraction):\n'
             '    """Gustafson\'s scaled speedup on each number of ranks (an array): the work grows with the ranks."""',
             lambda: [(np.array([1, 2, 4, 8, 1000]), 0.05), (np.array([3]), 0.0), (np.array([2, 16]), 1.0)],
             scaling.gustafson_speedup,
             "on P ranks the parallel part of the time did P times the work; the serial part did not grow."),
    Exercise("06.3", "parallel_efficiency", 'def parallel_efficiency(one_rank_seconds, seconds, ranks):\n'
             '    """The parallel efficiency of runs taking `seconds` on `ranks` ranks (arrays), against one rank."""',
             lambda: [(10.0, np.array([10.0, 6.0, 3.5]), np.array([1, 2, 4])), (2.0, np.array([3.0]), np.array([2]))],
             lambda one, seconds, ranks: one / (seconds * ranks),
             "the speedup divided by what P ranks could give at best."),
    Exercise("07.1", "matmul_gflops", 'def matmul_gflops(m, k, n, seconds):\n'
             '    """The rate, in GFLOP/s, of a product (m, k) @ (k, n) that took `seconds`."""',
             lambda: [(1000, 1000, 1000, 0.02), (256, 784, 30, 1e-4), (1, 1, 1, 1e-9)], reference_matmul_gflops,
             "each of the m n results takes k multiplications and k additions."),
    Exercise("07.2", "gpu_wins", 'def gpu_wins(m, k, n, cpu_gflops, gpu_gflops, transfer_gbytes_per_second):\n'
             '    """Is one float32 product (m, k) @ (k, n) faster on the GPU, counting the copies of both\n'
             '    inputs to it and of the result back, than on the CPU? True or False."""',
             lambda: [(4096, 4096, 4096, 100, 20000, 12), (64, 784, 30, 100, 20000, 12), (256, 784, 30, 50, 20000, 25),
                      (2048, 2048, 2048, 1000, 1000, 10)], reference_gpu_wins,
             "the GPU's time is the copies (bytes over the link's speed) plus the flops at its rate; "
             "the CPU's is the flops at its rate."),
    Exercise("08.1", "chunk_bounds", 'def chunk_bounds(length, parts):\n'
             '    """The ring\'s chunks of a buffer of `length` elements: (counts (parts,), starts (parts,)),\n'
             '    as even as possible, the first chunks one element longer."""',
             lambda: [(10, 3), (7, 7), (3, 5), (1001, 4)], reference_chunk_bounds,
             "the same split as Scatterv's rows."),
    Exercise("08.2", "ring_step", 'def ring_step(buffers, step):\n'
             '    """One reduce-scatter step of the ring on every rank at once. buffers (P, n): row r is\n'
             '    rank r\'s buffer, cut into P chunks by chunk_bounds. In step s, rank r sends its chunk\n'
             '    (r - s - 1) mod P to rank (r + 1) mod P, which adds it to its own copy of that chunk.\n'
             '    Returns the buffers after the step (a new array)."""',
             ring_step_cases, reference_ring_step,
             "every rank sends and receives in the same step: read what is sent from the buffers *before* "
             "the step, and add it into a copy."),
    Exercise("08.3", "bus_bandwidth", 'def bus_bandwidth(n_bytes, seconds, ranks):\n'
             '    """nccl-tests\' bus bandwidth (bytes/s) of an Allreduce of n_bytes that took `seconds` on `ranks`."""',
             lambda: [(1e6, 1e-3, 2), (8e6, 5e-3, 4), (4.0, 1e-6, 1)], allreduce.bus_bandwidth,
             "a ring moves 2 (P - 1) / P of the buffer through every link."),
    Exercise("09.1", "column_parallel_forward", 'def column_parallel_forward(inputs, weight_shards, bias_shards):\n'
             '    """A hidden layer split by columns: rank r holds weight_shards[r] (n_in, h_r) and bias_shards[r]\n'
             '    (h_r,). Returns the whole layer\'s activations (N, sum of h_r), rank 0\'s units first."""',
             column_cases, reference_column_parallel_forward,
             "each rank computes its own hidden units from the whole input; only the putting together "
             "needs the others."),
    Exercise("09.2", "row_parallel_logits", 'def row_parallel_logits(hidden_shards, weight_shards, biases):\n'
             '    """The next layer split by rows: rank r holds its hidden units hidden_shards[r] (N, h_r) and\n'
             '    the matching rows weight_shards[r] (h_r, n_out). Returns the logits (N, n_out), as after\n'
             '    the Allreduce."""',
             row_cases, reference_row_parallel_logits,
             "each rank's product is a partial sum over its own hidden units; the Allreduce adds them. "
             "How many times should the biases be added?"),
    Exercise("09.3", "bubble_fraction", 'def bubble_fraction(stages, micro_batches):\n'
             '    """The idle fraction of a pipeline step with equal stages and this many micro-batches."""',
             lambda: [(1, 1), (2, 1), (4, 8), (3, 5)], pipeline.bubble_fraction,
             "draw the timeline: how many slots does each stage have, and in how many is it busy?"),
    Exercise("11.1", "bfloat16_bits", 'def bfloat16_bits(values):\n'
             '    """float32 values (any shape) -> their bfloat16 bit patterns as uint16, rounded to nearest even\n'
             '    (the top 16 of the 32 bits, after rounding away the low 16). NaN need not be handled."""',
             bfloat16_cases, compression.to_bfloat16,
             "view the float32 array as uint32 to reach the bits; adding 0x7FFF rounds up whatever is above "
             "halfway, and the lowest kept bit decides the exact halfway case."),
    Exercise("11.2", "top_k_step", 'def top_k_step(gradient, residual, k):\n'
             '    """Top-k compression with error feedback, for one rank and one step. gradient, residual (n,)\n'
             '    -> (sent (n,): the k entries of largest magnitude of gradient + residual, zeros elsewhere;\n'
             '    new_residual (n,): what was not sent)."""',
             top_k_cases, reference_top_k_step,
             "add the residual first; np.argsort or np.argpartition of the magnitudes finds the k largest; "
             "what is sent plus the new residual must be the corrected gradient."),
    Exercise("10.1", "missing_ranks", 'def missing_ranks(arrived, size):\n'
             '    """The ranks of 0..size-1 that are not in `arrived` (a list, any order), as a sorted list."""',
             lambda: [([0, 2], 3), ([3, 1, 0], 4), ([], 2), ([1, 0], 2)], reference_missing_ranks,
             "a set difference; sorted() gives the order."),
    Exercise("10.2", "young_interval", 'def young_interval(write_seconds, node_mtbf_seconds, nodes):\n'
             '    """Young\'s checkpoint interval in seconds for a job on `nodes` nodes, each failing on average\n'
             '    once every node_mtbf_seconds, when one checkpoint takes write_seconds."""',
             lambda: [(60.0, 5 * 365 * 24 * 3600.0, 1), (60.0, 5 * 365 * 24 * 3600.0, 10_000), (0.005, 3600.0, 2)],
             reference_young_interval,
             "the job fails as soon as any of its nodes does: what is its mean time between failures?"),
]}


def lesson_exercises(lesson: str) -> list[Exercise]:
    """The exercises of lesson ``lesson`` ("02"), in order."""
    return [exercise for key, exercise in sorted(EXERCISES.items()) if key.startswith(lesson + ".")]
