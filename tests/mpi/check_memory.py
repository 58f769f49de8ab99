"""Run under mpiexec with 1 to 4 (and 7) ranks: lesson 12's memory savers train exactly as sequential.

ZeRO-3 / FSDP (every layer's parameters sharded, gathered on use): equal to sequential training within
1e-10 in float64, for uneven layer sizes (117, 80, 63, 32 parameters per layer) and rank counts, sigmoid
and softmax, full batch and mini-batch with momentum; a rank holds its chunks and at most one whole layer;
the bytes it sends, counted on the real calls, are 3 (n_l - c_{l,r}) per layer, against the Allreduce's
2 (n - c_r). Gradient accumulation (k micro-batches, with the Allreduce and with lesson 08's overlap):
equal to one step on the whole batch within 1e-12, one Allreduce per step. Everything together
(FSDP + accumulation + recomputation) equal to sequential. Mixed precision: every rank skips the same
overflowed steps. The peak bytes per rank (tracemalloc) within 10% of the prediction (data parallel, ZeRO,
FSDP, recomputation (also on narrow uneven widths), accumulation, lesson 09's tensor and pipeline
parallelism, mixed precision alone and with recomputation, accumulation and FSDP, in float16 and bfloat16), and on 4
ranks a network over twice the per-rank budget trains under it. A bad setup fails on every rank at once.
"""

import numpy as np
from harness import assert_on_every_rank, expect_error_everywhere, run_checks
from mpi4py import MPI

from nnlib import Network, train
from nnlib.lesson03_training.training import Settings
from nnlib.lesson05_data_parallel import shard, train_parallel
from nnlib.lesson05_data_parallel.data_parallel import Allreduce
from nnlib.lesson08_inside_allreduce.allreduce import chunk_bounds
from nnlib.lesson08_inside_allreduce.overlap import Overlap
from nnlib.lesson12_memory.accumulation import MicroBatched
from nnlib.lesson12_memory.budget import measured_peak, mixed_precision_bytes, predicted_bytes, predicted_peak
from nnlib.lesson12_memory.demo import BUDGET_SIZES, PARALLEL_SIZES, mixed_peak, parallel_peak, step_peak
from nnlib.lesson12_memory.fsdp import FullySharded, FullyShardedNetwork
from nnlib.lesson12_memory.mixed_precision import MixedPrecision, loss_scaled, train_mixed
from nnlib.lesson08_inside_allreduce.counting import CountingComm
from nnlib.lesson12_memory.traffic import allreduce_bytes, fsdp_bytes

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
    network.log.recording = True
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
    assert counting.ring_bytes() == fsdp_bytes(SIZES, size, rank), (counting.calls, fsdp_bytes(SIZES, size, rank))
    names = [name for name, _, _ in counting.calls]
    assert names.count("Allgatherv") == 2 * 4 and names.count("Reduce_scatter") == 4
    replica = Network(SIZES, dtype="float64", seed=3)
    replica.loss_and_gradient(INPUTS[:20], LABELS[:20])
    counting = CountingComm(comm)
    counting.Allreduce(MPI.IN_PLACE, replica.grads)
    assert counting.ring_bytes() == allreduce_bytes(replica.num_params, size, rank)


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
                    gradient_calls = [call for call in counting.calls if call[1] == network.params.nbytes]
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


WIDE = rng.random((256, 64)), rng.integers(0, 10, 256)


def off_by_more_than_10_percent(where, peak: int, predicted: int) -> list:
    """[a message] if the measured peak is more than 10% from the prediction, else []."""
    return [] if abs(peak - predicted) <= 0.1 * predicted else [f"{where}: measured {peak:,} predicted {predicted:,}"]


def test_measured_peak_memory_is_within_10_percent_of_the_prediction():
    """tracemalloc's peak over building the network and a step of 256 samples, on every rank (up to 4 ranks:
    with more ranks than cores, tracemalloc's bookkeeping makes the busy-waiting ranks slow)."""
    if size > 4:
        return
    shard_of_batch, failures = shard(comm, *(WIDE if rank == 0 else (None, None))), []
    for strategy, every, micro_batches in (("allreduce", None, 1), ("zero", None, 1), ("fsdp", None, 1),
                                           ("allreduce", 3, 4), ("zero", 3, 4), ("fsdp", 3, 4)):
        peak = step_peak(comm, (strategy, every, micro_batches), shard_of_batch)
        rows = -(-256 // size) + 1  # the most rows of a batch a rank can hold
        predicted = predicted_peak(predicted_bytes(BUDGET_SIZES, rows, size, rank, strategy, every, micro_batches))
        failures += off_by_more_than_10_percent(f"{strategy} every={every} k={micro_batches}", peak, predicted)
    assert_on_every_rank(failures)


def recomputed_step_peak(plan, rows: int = 256) -> tuple:
    """(tracemalloc's peak on this rank, the predicted bytes by kind) over two data-parallel steps of ``rows`` samples
    (this rank's share) of ``plan`` = (strategy "allreduce" or "fsdp", recompute every, micro-batches) on
    PARALLEL_SIZES's narrow, uneven widths, in float64; the network's construction is left out of the peak."""
    from nnlib.lesson12_memory.budget import measured_step_peak

    strategy, every, micro_batches = plan
    batch = np.random.default_rng(0)
    inputs, labels = batch.random((2 * rows, PARALLEL_SIZES[0])), batch.integers(0, PARALLEL_SIZES[-1], 2 * rows)
    local_inputs, local_labels, start = shard(comm, *((inputs, labels) if rank == 0 else (None, None)))
    sharded = strategy == "fsdp"
    build = lambda: MicroBatched(FullyShardedNetwork(comm, PARALLEL_SIZES, seed=2) if sharded
                                 else Network(PARALLEL_SIZES, dtype="float64", seed=2), micro_batches, every)
    peak, _ = measured_step_peak(build, lambda network: train_parallel(
        comm, network, local_inputs, local_labels, num_samples=2 * rows, start=start,
        strategy=FullySharded if sharded else "allreduce", epochs=1, learning_rate=0.1, batch_size=rows, momentum=0.9))
    return peak, predicted_bytes(PARALLEL_SIZES, -(-rows // size), size, rank, strategy, every, micro_batches)


def test_recomputation_on_narrow_uneven_widths_is_within_10_percent_of_the_prediction():
    """Data parallelism and FSDP keeping every 2nd or 3rd layer's input, with 1 and 3 micro-batches, on
    PARALLEL_SIZES (64-127-96-121-80-113-72-10: segments of uneven widths, where what a segment's backward holds
    beside its activations, the delta carried in and the recomputation's top z, weighs): tracemalloc's peak on
    every rank within 10% of predicted_bytes (up to 4 ranks, as above)."""
    if size > 4:
        return
    failures = []
    for strategy in ("allreduce", "fsdp"):
        for every in (2, 3):
            for micro_batches in (1, 3):
                peak, held = recomputed_step_peak((strategy, every, micro_batches))
                failures += off_by_more_than_10_percent(f"{strategy} every={every} k={micro_batches} on PARALLEL_SIZES",
                                                        peak, predicted_peak(held))
    assert_on_every_rank(failures)


def test_model_parallel_and_mixed_precision_peaks_are_within_10_percent_of_the_prediction():
    """Lesson 09's tensor parallelism and pipeline (GPipe and 1F1B with 1, 4 and 7 micro-batches: the schedules
    keep different numbers of them alive) on uneven widths (64-127-96-121-80-113-72-10: 127 hidden units do not
    split evenly, 7 layers make uneven stages), and mixed precision: tracemalloc's peak on every rank within 10%
    of the prediction (up to 4 ranks, as above). On stage 0 of 2 to 4, 1F1B keeps at most P of the 7 micro-batches
    alive, GPipe all 7: it holds less."""
    if size > 4:
        return
    peaks, failures = {}, []
    for plan in [("tensor", None, 1), ("mixed", None, 1)] + [("pipeline", schedule, micro_batches)
                                                           for schedule in ("gpipe", "1f1b") for micro_batches in (1, 4, 7)]:
        peak, held = parallel_peak(comm, plan)
        failures += off_by_more_than_10_percent(plan, peak, predicted_peak(held))
        peaks[plan] = (peak, held["activations"])
    assert_on_every_rank(failures)
    if size >= 2 and rank == 0:
        gpipe, one_f_one_b = peaks["pipeline", "gpipe", 7], peaks["pipeline", "1f1b", 7]
        assert one_f_one_b[0] < gpipe[0] and one_f_one_b[1] < gpipe[1], (gpipe, one_f_one_b)


def test_mixed_precision_combined_peaks_are_within_10_percent_of_the_prediction():
    """Mixed precision with recomputation (every k), with accumulation (k micro-batches), with FSDP (and with
    both), in float16 and bfloat16, on PARALLEL_SIZES's uneven widths and 256 rows cut unevenly over the ranks,
    and with lesson 08's ZeRO-1/2: tracemalloc's peak on every rank within 10% of mixed_precision_bytes (up to 4
    ranks, as above). bfloat16
    holds the bytes float16 does: the same prediction, and measured peaks within 1% of each other."""
    if size > 4:
        return
    peaks, failures = {}, []
    for strategy, every, micro_batches in (("allreduce", 3, 1), ("allreduce", None, 4), ("allreduce", 2, 3),
                                           ("fsdp", None, 1), ("fsdp", 3, 1), ("fsdp", None, 4), ("fsdp", 2, 3),
                                           ("zero", None, 1), ("zero", 2, 3)):
        for precision in ("float16", "bfloat16") if (every, micro_batches) == (2, 3) else ("float16",):
            plan = (strategy, every, micro_batches, precision)
            peak, held = mixed_peak(comm, plan)
            failures += off_by_more_than_10_percent(plan, peak, predicted_peak(held))
            peaks[plan] = peak
        rows = -(-256 // size)
        if (mixed_precision_bytes(PARALLEL_SIZES, rows, size, rank, strategy, every, micro_batches, "bfloat16")
                != mixed_precision_bytes(PARALLEL_SIZES, rows, size, rank, strategy, every, micro_batches)):
            failures.append(f"{strategy} every={every} k={micro_batches}: bfloat16's prediction differs from float16's")
    assert_on_every_rank(failures)
    for strategy in ("allreduce", "fsdp"):
        half, brain = peaks[strategy, 2, 3, "float16"], peaks[strategy, 2, 3, "bfloat16"]
        assert abs(half - brain) <= 0.01 * half, (strategy, half, brain)


def test_fsdp_trains_a_network_twice_the_budget_equal_to_sequential():
    """On 4 ranks a rank may hold less than half the parameters and momentum (measured: tracemalloc's peak over
    the training, plus the chunks built before it); FSDP + recomputation + accumulation trains under it."""
    if size != 4:
        return
    sizes, (inputs, labels) = (64,) * 33, WIDE
    expected = Network(sizes, dtype="float64", seed=1)
    train(expected, inputs, labels, progress=False, epochs=1, learning_rate=0.1, batch_size=64, momentum=0.9)
    local_inputs, local_labels, start = shard(comm, inputs if rank == 0 else None, labels if rank == 0 else None)
    network = MicroBatched(FullyShardedNetwork(comm, sizes, seed=1), 2, 6)
    budget = 0.49 * 2 * network.total_params * 8  # params and momentum are more than twice the budget
    peak, _ = measured_peak(lambda: train_parallel(
        comm, network, local_inputs, local_labels, num_samples=256, start=start, strategy=FullySharded,
        epochs=1, learning_rate=0.1, batch_size=64, momentum=0.9))
    peak += network.params.nbytes + network.grads.nbytes
    assert peak <= budget, f"rank {rank} held {peak:,} bytes, over its budget of {budget:,.0f}"
    assert relative_error(network.full_params(), expected.params) <= 1e-10


def mixed_run(loss_scale: float, parallel: bool):
    settings = dict(epochs=2, learning_rate=0.5, batch_size=32, momentum=0.9, seed=5)
    mixed = MixedPrecision(Network(SIZES, seed=3), loss_scale=loss_scale, growth_interval=4)
    if not parallel:
        train_mixed(mixed, INPUTS.astype(np.float32), LABELS, Settings(**settings))
        return mixed
    local_inputs, local_labels, start = shard(comm, INPUTS.astype(np.float32) if rank == 0 else None,
                                              LABELS if rank == 0 else None)
    train_parallel(comm, mixed, local_inputs, local_labels, num_samples=N, start=start,
                   strategy=loss_scaled(Allreduce), **settings)
    return mixed


def test_mixed_precision_ranks_skip_together_and_hold_the_same_weights():
    """Loss scaling under lesson 05's Allreduce: from a scale that overflows at first, every rank skips the same
    steps (the verdict is taken on the summed gradient: a rank's own float16 gradient is a partial sum, which
    may overflow at another scale than one process's) and ends with the same weights; from a scale that never
    overflows, the weights are near one process's (float16 rounds the ranks' partial sums differently)."""
    mixed = mixed_run(2.0 ** 24, parallel=True)
    verdicts = comm.allgather((mixed.skipped, mixed.loss_scale))
    assert mixed.skipped >= 1 and verdicts == [verdicts[0]] * size, verdicts
    assert np.array_equal(mixed.params, comm.bcast(mixed.params if rank == 0 else None))
    assert np.isfinite(mixed.params).all()
    unscaled_parallel, single = mixed_run(2.0 ** 8, parallel=True), mixed_run(2.0 ** 8, parallel=False)
    assert unscaled_parallel.skipped == single.skipped == 0
    error = relative_error(unscaled_parallel.params, single.params)
    assert error <= 1e-2, error


def test_fsdp_refuses_a_network_that_is_not_sharded():
    expect_error_everywhere(lambda: parallel(Network(SIZES, dtype="float64"), FullySharded, **SETTINGS[0]),
                            "strategy fsdp trains a FullyShardedNetwork")


if __name__ == "__main__":
    run_checks(globals())
