"""Run under mpiexec with 1 to 4 ranks: local SGD / DiLoCo (nnlib.lesson15_compression.local_sgd) and PowerSGD
(nnlib.lesson15_compression.powersgd) in data-parallel training.

Local SGD with H = 1, plain averaging and outer rate 1 equals synchronous data parallelism with the
per-rank sampler to 1e-10 in float64, with and without momentum (203 samples, batches of 30: nothing
divides). PowerSGD at full rank equals the plain Allreduce to 1e-10 (rounding only); its error feedback
loses nothing. The bytes counted on the real calls are the formulas'. Bad settings fail on every rank.
"""

import shutil
import tempfile

import numpy as np
from harness import expect_error_everywhere, run_checks
from mpi4py import MPI

from nnlib import Network
from nnlib.lesson02_network.network import layer_views
from nnlib.lesson06_data_parallel import shard, train_parallel
from nnlib.lesson10_zero_overlap.sampling import PerRankBatches
from nnlib.lesson13_faults.checkpoint import CheckpointFolder, Checkpointing
from nnlib.lesson09_ring_allreduce.counting import CountingComm
from nnlib.lesson15_compression.local_sgd import local_sgd
from nnlib.lesson15_compression.powersgd import PowerSGDCompressor, message_bytes, powersgd

comm = MPI.COMM_WORLD
rank, size = comm.rank, comm.size
rng = np.random.default_rng(0)
INPUTS, LABELS = rng.random((203, 12)), rng.integers(0, 4, 203)
SIZES = (12, 9, 4)
SETTINGS = dict(epochs=3, learning_rate=0.5, batch_size=30, seed=7)


def run(strategy="allreduce", communicator=comm, momentum=0.9, batches=PerRankBatches):
    network = Network(SIZES, dtype="float64", seed=3)
    local_inputs, local_labels, start = shard(comm, INPUTS, LABELS)
    history = train_parallel(communicator, network, local_inputs, local_labels, num_samples=len(INPUTS), start=start,
                             strategy=strategy, batches=batches, momentum=momentum, **SETTINGS)
    return network.params, history


def relative(a, b):
    return np.abs(a - b).max() / np.abs(b).max()


def test_local_sgd_with_one_step_a_round_is_synchronous_training():
    for momentum in (0.0, 0.9):
        synchronous, _ = run(momentum=momentum)
        local, _ = run(local_sgd(1), momentum=momentum)
        assert relative(local, synchronous) <= 1e-10, (momentum, relative(local, synchronous))


def test_local_sgd_with_more_steps_differs_and_learns_and_the_ranks_agree():
    synchronous, _ = run()
    for strategy in (local_sgd(4), local_sgd(4, "nesterov")):
        params, history = run(strategy)
        assert history.loss[-1] < history.loss[0], history.loss
        assert np.array_equal(params, comm.bcast(params, root=0))  # one model on every rank
        assert size == 1 or relative(params, synchronous) > 1e-6


def test_local_sgd_sends_one_allreduce_of_the_parameters_per_round():
    for local_steps in (1, 4, 64):
        counting = CountingComm(comm)
        network_params, history = run(local_sgd(local_steps), communicator=counting)
        steps_per_epoch = history.steps // SETTINGS["epochs"]
        rounds = SETTINGS["epochs"] * -(-steps_per_epoch // local_steps)  # a round every H steps and at the epoch's end
        loss_sums = SETTINGS["epochs"]  # (the loss and the correct count, 16 bytes, once per epoch)
        assert counting.messages() == {("Allreduce", network_params.nbytes): rounds, ("Allreduce", 16): loss_sums}, \
            (local_steps, counting.messages())


def test_powersgd_at_full_rank_equals_the_plain_allreduce():
    plain, _ = run(batches=None)
    full, _ = run(powersgd(max(SIZES)), batches=None)
    assert relative(full, plain) <= 1e-10, relative(full, plain)


def test_powersgd_sends_two_allreduces_a_step_of_the_counted_bytes():
    for q in (1, 2):
        counting = CountingComm(comm)
        _, history = run(powersgd(q), communicator=counting)
        assert history.loss[-1] < history.loss[0], history.loss
        first, second = message_bytes(SIZES, q, itemsize=8)
        expected = {("Allreduce", first): history.steps, ("Allreduce", second): history.steps,
                    ("Allreduce", 16): SETTINGS["epochs"]}
        assert counting.messages() == expected, (q, counting.messages(), expected)


def test_powersgd_error_feedback_loses_nothing():
    shapes = list(zip(SIZES[:-1], SIZES[1:]))
    compressor = PowerSGDCompressor(shapes, 1, np.float64, seed=5)
    generator = np.random.default_rng(10 + rank)
    for _ in range(3):
        gradient = generator.normal(size=Network(SIZES).num_params)
        corrected = [w + e for w, e in zip(layer_views(gradient, shapes)[0], compressor.residuals)]  # M_r + E_r
        summed = gradient.copy()
        compressor.allreduce(comm, summed)
        weights, biases = layer_views(summed, shapes)
        for layer in range(len(shapes)):  # what was sent plus every rank's new residual: all of it
            total = sum(everyone[layer] for everyone in comm.allgather(corrected))
            residuals = sum(comm.allgather(compressor.residuals[layer]))
            assert np.allclose(weights[layer] + residuals, total, rtol=0, atol=1e-12)
            assert np.linalg.matrix_rank(weights[layer]) == 1
        for layer, bias in enumerate(biases):  # the biases are summed exactly as they are
            assert np.allclose(bias, sum(comm.allgather(layer_views(gradient, shapes)[1][layer])), rtol=0, atol=1e-13)


def test_bad_settings_fail_on_every_rank_at_once():
    for strategy, words in [(local_sgd(0), "the local steps H must be a whole number, 1 or more"),
                            (local_sgd(2, "adam"), "the outer optimizer must be one of average, nesterov"),
                            (local_sgd(2, outer_learning_rate=-1.0), "the outer learning rate must be a positive"),
                            (powersgd(0), "PowerSGD's rank must be a whole number, 1 or more")]:
        expect_error_everywhere(lambda: run(strategy), words)
    folder = comm.bcast(tempfile.mkdtemp(prefix="nnlib-light-") if rank == 0 else None, root=0)
    for strategy, words in [(local_sgd(2), "checkpoints do not keep local SGD's anchor"),
                            (powersgd(1), "checkpoints do not keep PowerSGD's Q and residuals")]:
        network = Network(SIZES, dtype="float64", seed=3)
        local_inputs, local_labels, start = shard(comm, INPUTS, LABELS)
        expect_error_everywhere(lambda: train_parallel(
            comm, network, local_inputs, local_labels, num_samples=len(INPUTS), start=start, epochs=1,
            learning_rate=0.5, batch_size=30, strategy=strategy,
            hooks=[Checkpointing(CheckpointFolder(folder))]), words)
    if rank == 0:
        shutil.rmtree(folder)


if __name__ == "__main__":
    run_checks(globals())
