"""Run under mpiexec with 1 to 4 (and 7) ranks: lessons 16 and 17's memory savers train exactly as sequential.

ZeRO-3 / FSDP (every layer's parameters sharded, gathered on use): equal to sequential training within
1e-10 in float64, for uneven layer sizes (117, 80, 63, 32 parameters per layer) and rank counts, sigmoid
and softmax, full batch and mini-batch with momentum, and with Adam; a rank holds its chunks and at most one whole layer
(its log, and weak references to what Allgatherv fills);
the bytes it sends, counted on the real calls, are 3 (n_l - c_{l,r}) per layer, against the Allreduce's
2 (n - c_r). Gradient accumulation (k micro-batches, with the Allreduce and with lesson 10's overlap):
equal to one step on the whole batch within 1e-12, one Allreduce per step. Everything together
(FSDP + accumulation + recomputation) equal to sequential. Mixed precision: every rank skips the same
overflowed steps. The memory model against tracemalloc's peak on every rank (up to 4 ranks): data parallelism,
ZeRO, FSDP, recomputation, accumulation and mixed precision (float16 and bfloat16) within the error bounds
nnlib.lesson17_activations.budget states; lessons 11 and 12's tensor and pipeline ranks hold at least what
lesson 12's model counts, 1F1B less than GPipe. On 4 ranks a network over twice the per-rank budget trains under
it. A bad setup fails on every rank at once.
"""

import tracemalloc
import weakref

import numpy as np
from harness import assert_on_every_rank, expect_error_everywhere, run_checks
from mpi4py import MPI

from nnlib import Network, train
from nnlib.lesson03_training.training import Settings
from nnlib.lesson06_data_parallel import shard, train_parallel
from nnlib.lesson06_data_parallel.data_parallel import Allreduce
from nnlib.lesson04_collectives.collectives import split_evenly
from nnlib.lesson10_zero_overlap.overlap import Overlap
from nnlib.lesson17_activations.accumulation import MicroBatched
from nnlib.lesson17_activations.budget import MODEL_ERROR
from nnlib.lesson16_sharding.demo import adam_bytes, adam_model, fsdp_bytes
from nnlib.lesson17_activations.demo import DATA_PARALLEL_CASES, data_parallel_peak, measured_peak, model_parallel_peak
from nnlib.lesson16_sharding.fsdp import FullySharded, FullyShardedNetwork
from nnlib.lesson17_activations.mixed_precision import MixedPrecision, train_mixed
from nnlib.lesson09_ring_allreduce.counting import CountingComm, ring_bytes

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


def test_fsdp_with_adam_equals_sequential_adam():
    """Adam and AdamW, float64: each rank's optimizer is made for its chunks (uneven: 117, 80, 63, 32 parameters per
    layer) and steps on them; the gathered parameters equal sequential Adam's within 1e-10."""
    for optimizer in (dict(optimizer="adam"), dict(optimizer="adamw", weight_decay=0.5, beta1=0.8, eps=1e-6)):
        settings = dict(optimizer, epochs=2, learning_rate=0.01, batch_size=32, seed=5)
        expected, history = sequential(**settings)
        network = FullyShardedNetwork(comm, SIZES, seed=3)
        got = parallel(network, FullySharded, **settings)
        error = relative_error(network.full_params(), expected)
        assert error <= 1e-10, f"fsdp {optimizer}: relative error {error:.1e}"
        assert np.allclose(got.loss, history.loss, rtol=1e-12)


class GatherWatching:
    """comm, with a weak reference to every whole layer its Allgatherv fills: what FSDP really keeps alive,
    measured apart from the network's own log (a layer that logs its free but keeps its weights shows here)."""

    def __init__(self, comm):
        self.comm, self.wholes, self.most = comm, [], 0

    def __getattr__(self, name):
        return getattr(self.comm, name)

    def Allgatherv(self, sendbuf, recvbuf):
        self.comm.Allgatherv(sendbuf, recvbuf)
        self.wholes = [whole for whole in self.wholes if whole() is not None] + [weakref.ref(recvbuf[0])]
        self.most = max(self.most, sum(whole().nbytes for whole in self.wholes))


def test_fsdp_keeps_no_gathered_layer_alive_beyond_the_one_computing():
    layer_params = [n_in * n_out + n_out for n_in, n_out in zip(SIZES[:-1], SIZES[1:])]
    for output in ("sigmoid", "softmax"):
        watching = GatherWatching(comm)
        network = FullyShardedNetwork(watching, SIZES, output=output, seed=3)
        network.loss_and_gradient(INPUTS[:20], LABELS[:20])
        network.forward(INPUTS[:5])
        alive = sum(whole().nbytes for whole in watching.wholes if whole() is not None)
        assert watching.most == 8 * max(layer_params) and alive == 0, (watching.most, alive, layer_params)


def test_fsdp_holds_its_chunks_and_one_layer_at_a_time():
    network = FullyShardedNetwork(comm, SIZES, seed=3)
    network.log.recording = True
    network.loss_and_gradient(INPUTS[:20], LABELS[:20])
    layer_params = [n_in * n_out + n_out for n_in, n_out in zip(SIZES[:-1], SIZES[1:])]
    assert network.params.size == sum(split_evenly(count, size)[0][rank] for count in layer_params)
    peak = max(held for _, _, held in network.log.events)
    assert peak == max(layer_params) * 8, (peak, layer_params)
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
    assert counting.ring_bytes() == 2 * ring_bytes(replica.num_params, size, rank)


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


def error(peak: int, held: dict) -> float:
    """The model's error against tracemalloc's peak: (predicted - measured) / measured."""
    return (sum(held.values()) - peak) / peak


def test_the_memory_model_is_within_its_stated_error_of_the_measured_peak():
    """Notebook 17's data-parallel cases and a few more (recomputation and accumulation alone and with ZeRO, mixed
    precision with ZeRO, checkpoints every 2 with 3 micro-batches in float16 and bfloat16): tracemalloc's peak on
    every rank against predicted_bytes, within MODEL_ERROR (up to 4 ranks: with more ranks than cores,
    tracemalloc's bookkeeping makes the busy-waiting ranks slow). bfloat16 holds the bytes float16 does: the
    same prediction, and measured peaks within 1% of each other."""
    if size > 4:
        return
    low, high = MODEL_ERROR
    cases = dict(DATA_PARALLEL_CASES, **{f"{case}": case for case in (
        ("allreduce", 3, 1, "float64"), ("allreduce", None, 4, "float64"), ("zero", 3, 4, "float64"),
        ("zero", None, 1, "float16"), ("allreduce", 2, 3, "float16"), ("allreduce", 2, 3, "bfloat16"))})
    failures, peaks = [], {}
    for name, case in cases.items():
        peaks[case], held = data_parallel_peak(comm, case)
        if not low <= error(peaks[case], held) <= high:
            failures.append(f"{name}: measured {peaks[case]:,}, predicted {sum(held.values()):,} "
                            f"({error(peaks[case], held):+.1%})")
    assert_on_every_rank(failures)
    half, brain = peaks["allreduce", 2, 3, "float16"], peaks["allreduce", 2, 3, "bfloat16"]
    assert abs(half - brain) <= 0.01 * half, (half, brain)


def test_model_parallel_ranks_hold_at_least_what_lesson_09s_model_counts():
    """Lessons 11 and 12's tensor parallelism and pipeline (GPipe and 1F1B, 1, 4 and 7 micro-batches) on uneven widths
    (127 hidden units do not split evenly, 7 layers make uneven stages): on every rank the model counts at most
    MODEL_ERROR's upper bound more than tracemalloc's peak, and a tensor-parallel rank within MODEL_ERROR; a
    pipeline stage holds more that the model leaves out (the whole batch, the messages its sends keep until the
    step ends), most on small late stages. On stage 0 of 2 to 4, 1F1B keeps at most P of the 7 micro-batches
    alive, GPipe all 7: it holds less, measured and predicted."""
    if size > 4:
        return
    low, high = MODEL_ERROR
    peaks, failures = {}, []
    for case in [("tensor", None, 1)] + [("pipeline", schedule, m) for schedule in ("gpipe", "1f1b") for m in (1, 4, 7)]:
        peak, held = model_parallel_peak(comm, case)
        if error(peak, held) > high or (case[0] == "tensor" and error(peak, held) < low):
            failures.append(f"{case}: measured {peak:,}, predicted {sum(held.values()):,} ({error(peak, held):+.1%})")
        peaks[case] = (peak, held["activations"])
    assert_on_every_rank(failures)
    if size >= 2 and rank == 0:
        gpipe, one_f_one_b = peaks["pipeline", "gpipe", 7], peaks["pipeline", "1f1b", 7]
        assert one_f_one_b[0] < gpipe[0] and one_f_one_b[1] < gpipe[1], (gpipe, one_f_one_b)


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
    peak, _ = measured_peak(lambda: network, lambda network: train_parallel(
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
                   strategy=Allreduce, scaler=mixed.scaler, **settings)
    return mixed


def test_mixed_precision_ranks_skip_together_and_hold_the_same_weights():
    """Loss scaling under lesson 06's Allreduce: from a scale that overflows at first, every rank skips the same
    steps (the verdict is taken on the summed gradient: a rank's own float16 gradient is a partial sum, which
    may overflow at another scale than one process's) and ends with the same weights; from a scale that never
    overflows, the weights are near one process's (float16 rounds the ranks' partial sums differently)."""
    mixed = mixed_run(2.0 ** 24, parallel=True)
    verdicts = comm.allgather((mixed.scaler.skipped, mixed.loss_scale))
    assert mixed.scaler.skipped >= 1 and verdicts == [verdicts[0]] * size, verdicts
    assert np.array_equal(mixed.params, comm.bcast(mixed.params if rank == 0 else None))
    assert np.isfinite(mixed.params).all()
    unscaled_parallel, single = mixed_run(2.0 ** 8, parallel=True), mixed_run(2.0 ** 8, parallel=False)
    assert unscaled_parallel.scaler.skipped == single.scaler.skipped == 0
    error = relative_error(unscaled_parallel.params, single.params)
    assert error <= 1e-2, error


class GradientAtEachBucket:
    """``comm``, noting at every Reduce_scatter (a bucket of ZeRO stage 2 on its way: the most gradient a rank holds
    at once) the bytes of NumPy's arrays that tracemalloc counts as allocated by nnlib's zero.py (g_r and the bucket),
    and how many arrays of any file are as long as the whole parameter vector (the parameters: one)."""

    def __init__(self, comm, whole_bytes: int):
        self.comm, self.whole_bytes, self.held, self.wholes = comm, whole_bytes, [], []

    def __getattr__(self, name):
        return getattr(self.comm, name)

    def Reduce_scatter(self, *arguments, **keywords):
        from nnlib.lesson10_zero_overlap import zero

        arrays = tracemalloc.take_snapshot().filter_traces([tracemalloc.DomainFilter(True, np.lib.tracemalloc_domain)])
        self.held.append(sum(trace.size for trace in arrays.filter_traces([tracemalloc.Filter(True, zero.__file__)])
                             .traces))
        self.wholes.append(sum(trace.size == self.whole_bytes for trace in arrays.traces))  # (from any file)
        return self.comm.Reduce_scatter(*arguments, **keywords)


def test_zero_stage_2_holds_its_slice_of_the_gradient_and_one_bucket():
    """784-128-10 in float64 under ZeRO stage 2: at every bucket's reduce-scatter the gradient bytes a rank holds
    (tracemalloc) are at most (1/P + 1/(4P)) Psi itemsize, its slice and the bucket in flight (stage 1 and data
    parallelism hold Psi itemsize: the whole gradient); and the run equals sequential training."""
    from nnlib.lesson10_zero_overlap.zero import GradientShardedNetwork, ZeROStage2

    rng = np.random.default_rng(2)
    inputs, labels = rng.random((301, 784)), rng.integers(0, 10, 301)
    local_inputs, local_labels, start = shard(comm, inputs if rank == 0 else None, labels if rank == 0 else None)
    watched = GradientAtEachBucket(comm, (784 * 128 + 128 + 128 * 10 + 10) * 8)
    tracemalloc.start()
    try:
        network = GradientShardedNetwork(watched, (784, 128, 10), seed=4)
        train_parallel(comm, network, local_inputs, local_labels, num_samples=301, start=start, strategy=ZeROStage2,
                       epochs=1, learning_rate=0.1, batch_size=100, momentum=0.9)
    finally:
        tracemalloc.stop()
    bound = (1 / size + 1 / (4 * size)) * network.num_params * 8
    assert watched.held and max(watched.held) <= bound, (max(watched.held), bound)
    # no whole gradient anywhere: only the whole parameters (on one rank the slice and the velocity are whole too)
    assert set(watched.wholes) == {1 if size > 1 else 3}, watched.wholes
    expected = Network((784, 128, 10), dtype="float64", seed=4)
    train(expected, inputs, labels, progress=False, epochs=1, learning_rate=0.1, batch_size=100, momentum=0.9)
    assert relative_error(network.params, expected.params) <= 1e-10


def test_adams_bytes_per_parameter_are_within_10_percent_of_the_stated_model_at_every_zero_stage():
    """Notebook 16's table: Adam under ZeRO stages 0-3 (FSDP as 3), float32, and float16 (lesson 17; not stage 2),
    every rank's tracemalloc measure of the optimizer's state (8 / P bytes a parameter from stage 1 on) and of the
    weights and gradients within 10% of demo.adam_model."""
    failures = []
    for precision, stage in [("float32", stage) for stage in range(4)] + [("float16", stage) for stage in (0, 1, 3)]:
        wrap = None if precision == "float32" else (lambda network: MixedPrecision(network, precision=precision))
        got, model = adam_bytes(comm, stage, wrap), adam_model(stage, precision, size)
        failures += [f"{precision} stage {stage} {kind}: {got[kind]:.2f} bytes against {model[kind]:.2f}"
                     for kind in model if kind in got and abs(got[kind] - model[kind]) > 0.10 * model[kind]]
    assert_on_every_rank(failures)


def test_fsdp_refuses_a_network_that_is_not_sharded():
    expect_error_everywhere(lambda: parallel(Network(SIZES, dtype="float64"), FullySharded, **SETTINGS[0]),
                            "strategy fsdp trains a FullyShardedNetwork")


if __name__ == "__main__":
    run_checks(globals())
