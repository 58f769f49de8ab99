"""Run under mpiexec with 1 to 4 ranks: compressed gradients (nnlib.lesson15_compression.compression) in data-parallel training.

Top-k with k = every parameter and float64 values sends everything: training equals the plain
Allreduce's to 1e-10 (203 samples, batches of 32: nothing divides). One float16 or bfloat16 exchange
gives every rank exactly the sum of the decoded messages, within the format's rounding of the true
sum; top-k's error feedback loses nothing (what was sent plus the new residual is the corrected
gradient, exactly); every method learns. Bad settings fail on every rank at once.
"""

import numpy as np
from harness import expect_error_everywhere, run_checks
from mpi4py import MPI

from nnlib import Network
from nnlib.lesson06_data_parallel import shard, train_parallel
from nnlib.lesson13_faults.checkpoint import CheckpointFolder, Checkpointing
from nnlib.lesson15_compression.compression import Compressor, compressed, from_bfloat16, to_bfloat16

comm = MPI.COMM_WORLD
rank, size = comm.rank, comm.size
rng = np.random.default_rng(0)
INPUTS, LABELS = rng.random((203, 12)), rng.integers(0, 4, 203)
SIZES = (12, 9, 4)
SETTINGS = dict(epochs=3, learning_rate=0.5, batch_size=32, momentum=0.9, seed=7)
NEVER_WRITTEN = "/nonexistent/nnlib-checkpoints"  # refused before anything is written


def run(compression="none", k=None):
    network = Network(SIZES, dtype="float64", seed=3)
    local_inputs, local_labels, start = shard(comm, INPUTS, LABELS)
    history = train_parallel(comm, network, local_inputs, local_labels, num_samples=len(INPUTS), start=start,
                             strategy=compressed(compression, k), **SETTINGS)
    return network.params, history


def relative(a, b):
    return np.abs(a - b).max() / np.abs(b).max()


def test_top_k_of_everything_in_float64_equals_the_plain_allreduce():
    plain, _ = run()
    everything, _ = run(compression="topk", k=plain.size)
    assert relative(everything, plain) <= 1e-10, relative(everything, plain)


def test_one_half_precision_exchange_is_the_sum_of_the_decoded_messages():
    gradient = np.random.default_rng(rank).normal(size=1001) * 10.0 ** np.random.default_rng(rank).integers(-3, 3, 1001)
    everyone = np.array(comm.allgather(gradient))
    # relative rounding 2^-p of each term, and float16's subnormals' spacing 2^-24 (half of it, rounded)
    for method, decode, precision, tiny in [("float16", lambda g: g.astype(np.float16).astype(np.float64), 2.0 ** -11,
                                             2.0 ** -25),
                                            ("bfloat16", lambda g: from_bfloat16(to_bfloat16(g)).astype(np.float64),
                                             2.0 ** -8, 0.0)]:
        summed = gradient.copy()
        Compressor(method, summed.size, np.float64).allreduce(comm, summed)
        expected = sum(decode(row) for row in everyone)
        assert np.array_equal(summed, expected), method
        bound = precision * np.abs(everyone).sum(axis=0) + size * tiny
        assert np.all(np.abs(summed - everyone.sum(axis=0)) <= bound), method


def test_top_k_error_feedback_loses_nothing():
    compressor = Compressor("topk", 500, np.float64, k=37)
    generator = np.random.default_rng(10 + rank)
    for _ in range(4):
        gradient = generator.normal(size=500)
        corrected = gradient + compressor.residual
        summed = gradient.copy()
        compressor.allreduce(comm, summed)
        sent = corrected - compressor.residual  # what this rank sent, as a dense vector
        assert np.count_nonzero(sent) == 37 and np.all(compressor.residual[sent != 0] == 0)
        assert np.array_equal(sent + compressor.residual, corrected)
        assert np.allclose(summed, sum(comm.allgather(sent)), rtol=1e-13, atol=1e-15)


def test_every_method_learns():
    for extra in (dict(compression="float16"), dict(compression="bfloat16"), dict(compression="topk", k=20)):
        _, history = run(**extra)
        assert history.loss[-1] < history.loss[0], (extra, history.loss)


def test_bad_settings_fail_on_every_rank_at_once():
    network = Network(SIZES, dtype="float64", seed=3)
    local_inputs, local_labels, start = shard(comm, INPUTS, LABELS)

    def attempt(compression, k=None, hooks=()):
        return lambda: train_parallel(comm, network, local_inputs, local_labels, num_samples=len(INPUTS),
                                      start=start, epochs=1, learning_rate=0.5, batch_size=32,
                                      strategy=compressed(compression, k), hooks=hooks)

    n = network.num_params
    for extra, words in [(dict(compression="topk", k=0), "needs k, a whole number from 1 to the number of parameters"),
                         (dict(compression="topk", k=n + 1), f"from 1 to the number of parameters ({n})"),
                         (dict(compression="topk"), "needs k"),
                         (dict(compression="int8"), "compression must be one of none, float16, bfloat16, topk"),
                         (dict(compression="float16", k=5), "k is only for top-k compression"),
                         (dict(compression="topk", k=5, hooks=[Checkpointing(CheckpointFolder(NEVER_WRITTEN))]),
                          "checkpoints do not keep top-k")]:
        expect_error_everywhere(attempt(**extra), words)


if __name__ == "__main__":
    run_checks(globals())
