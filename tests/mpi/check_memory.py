"""Run under mpiexec with 1 to 4 (and 7) ranks: lesson 12's memory savers train exactly as sequential.

ZeRO-3 / FSDP (every layer's parameters sharded, gathered on use): equal to sequential training within
1e-10 in float64, for uneven layer sizes (117, 80, 63, 32 parameters per layer) and rank counts, sigmoid
and softmax, full batch and mini-batch with momentum; a rank holds its chunks and at most one whole layer;
the bytes it sends, counted on the real calls, are 3 (n_l - c_{l,r}) per layer, against the Allreduce's
2 (n - c_r). Gradient accumulation (k micro-batches, with the Allreduce and with lesson 08's overlap):
equal to one step on the whole batch within 1e-12, one Allreduce per step. Everything together
(FSDP + accumulation + recomputation) equal to sequential. A bad setup fails on every rank at once.
"""

import numpy as np
from harness import expect_error_everywhere, run_checks
from mpi4py import MPI

from nnlib import Network, train
from nnlib.lesson05_data_parallel import shard, train_parallel
from nnlib.lesson08_inside_allreduce.allreduce import chunk_bounds
from nnlib.lesson08_inside_allreduce.overlap import Overlap
from nnlib.lesson12_memory.accumulation import MicroBatched
from nnlib.lesson12_memory.fsdp import FullySharded, FullyShardedNetwork
from nnlib.lesson12_memory.traffic import CountingComm, allreduce_bytes, fsdp_bytes

comm = MPI.COMM_WORLD
rank, size = comm.rank, comm.size
rng = np.random.default_rng(0)
N = 203
INPUTS, LABELS = rng.random((N, 12)), rng.integers(0, 4, N)
SIZES = (12, 9, 8, 7, 4)
SETTINGS = (dict(epochs=3, learning_rate=0.5),
            dict(epochs=2, learning_rate=0.5, batch_size=32, momentum=0.9, seed=5))


def sequential(output="sigmoid", **settings):
    network = Network(SIZES, output=output, dtype="float64", seed=3)
    history = train(network, INPUTS, LABELS, progress=False, **settings)
    return network.params, history


def parallel(network, strategy, **settings):
    local_inputs, local_labels, start = shard(comm, INPUTS if rank == 0 else None, LABELS if rank == 0 else None)
    return train_parallel(comm, network, local_inputs, local_labels, num_samples=N, start=start,
                          strategy=strategy, **settings)


def relative_error(params, expected) -> float:
    return float(np.abs(params - expected).max() / np.abs(expected).max())


def test_fsdp_equals_sequential_training():
    for output in ("sigmoid", "softmax"):
        for settings in SETTINGS:
            expected, history = sequential(output, **settings)
            network = FullyShardedNetwork(comm, SIZES, output=output, seed=3)
            got = parallel(network, FullySharded, validation=(INPUTS[:50], LABELS[:50]), **settings)
            error = relative_error(network.full_params(), expected)
            assert error <= 1e-10, f"fsdp {output} {settings}: relative error {error:.1e}"
            assert np.allclose(got.loss, history.loss, rtol=1e-12) and got.train_accuracy == history.train_accuracy


def test_fsdp_holds_its_chunks_and_one_layer_at_a_time():
    network = FullyShardedNetwork(comm, SIZES, seed=3)
    network.loss_and_gradient(INPUTS[:20], LABELS[:20])
    layer_params = [n_in * n_out + n_out for n_in, n_out in zip(SIZES[:-1], SIZES[1:])]
    assert network.params.size == sum(chunk_bounds(count, size)[0][rank] for count in layer_params)
    assert network.log.peak == max(layer_params) * 8, (network.log.peak, layer_params)
    assert network.log.held == 0  # everything gathered was freed
    events = [event for event, _, _ in network.log.events]
    assert events.count("gather forward") == events.count("gather backward") == len(layer_params)


def test_fsdp_sends_three_times_the_parameters_and_allreduce_two():
    counting = CountingComm(comm)
    network = FullyShardedNetwork(counting, SIZES, seed=3)
    network.loss_and_gradient(INPUTS[:20], LABELS[:20], normalizer=20 * size)
    assert counting.sent_bytes() == fsdp_bytes(SIZES, size, rank), (counting.calls, fsdp_bytes(SIZES, size, rank))
    names = [name for name, _, _ in counting.calls]
    assert names.count("Allgatherv") == 2 * 4 and names.count("Reduce_scatter") == 4
    replica = Network(SIZES, dtype="float64", seed=3)
    replica.loss_and_gradient(INPUTS[:20], LABELS[:20])
    counting = CountingComm(comm)
    counting.Allreduce(MPI.IN_PLACE, replica.grads)
    assert counting.sent_bytes() == allreduce_bytes(replica.num_params, size, rank)


def test_accumulation_equals_one_step_on_the_whole_batch():
    for settings in SETTINGS:
        expected, _ = sequential(**settings)
        for strategy in ("allreduce", Overlap):
            for micro_batches in (1, 3, 40):  # 40: more micro-batches than some ranks have rows
                counting = CountingComm(comm)
                network = MicroBatched(Network(SIZES, dtype="float64", seed=3), micro_batches)
                history = parallel_counted(counting, network, strategy, **settings)
                error = relative_error(network.params, expected)
                assert error <= 1e-12, f"{strategy} k={micro_batches} {settings}: relative error {error:.1e}"
                if strategy == "allreduce":
                    gradient_calls = [call for call in counting.calls if call[1] == network.num_params]
                    assert len(gradient_calls) == history.steps, (len(gradient_calls), history.steps)


def parallel_counted(counting, network, strategy, **settings):
    local_inputs, local_labels, start = shard(comm, INPUTS if rank == 0 else None, LABELS if rank == 0 else None)
    return train_parallel(counting, network, local_inputs, local_labels, num_samples=N, start=start,
                          strategy=strategy, **settings)


def test_fsdp_with_accumulation_and_recomputation_equals_sequential():
    settings = SETTINGS[1]
    expected, _ = sequential(**settings)
    for micro_batches, every in ((3, 2), (2, 1), (1, 3)):
        network = MicroBatched(FullyShardedNetwork(comm, SIZES, seed=3), micro_batches, every)
        parallel(network, FullySharded, **settings)
        error = relative_error(network.full_params(), expected)
        assert error <= 1e-10, f"fsdp k={micro_batches} every={every}: relative error {error:.1e}"


def test_fsdp_refuses_a_network_that_is_not_sharded():
    expect_error_everywhere(lambda: parallel(Network(SIZES, dtype="float64"), FullySharded, **SETTINGS[0]),
                            "strategy fsdp trains a FullyShardedNetwork")


if __name__ == "__main__":
    run_checks(globals())
