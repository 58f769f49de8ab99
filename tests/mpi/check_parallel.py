"""Run under mpiexec: data-parallel training equals sequential training, and bad setups fail together.

For every strategy, full-batch and mini-batch (momentum, and Adam), 997 samples (divisible by no P in 2..5):
the parameters after k steps equal the sequential run's to 1e-10 in float64 and 1e-5 in float32
(relative to the largest parameter), and are bit-identical on every rank. Exits 1 on any failure.
"""

import sys

import numpy as np
from harness import expect_error_everywhere, run_checks
from mpi4py import MPI

from nnlib import Network, train
from nnlib.lesson03_training.training import Hook
from nnlib.lesson04_collectives.collectives import split_evenly
from nnlib.lesson06_data_parallel import shard, train_parallel
from nnlib.lesson06_data_parallel.data_parallel import STRATEGIES as LESSON_06
from nnlib.lesson08_gpu.backend import HostStaging, WaitForDevice
from nnlib.lesson10_zero_overlap.overlap import Overlap
from nnlib.lesson10_zero_overlap.sampling import PerRankBatches
from nnlib.lesson10_zero_overlap.zero import ZeRO

comm = MPI.COMM_WORLD
rank, size = comm.rank, comm.size
rng = np.random.default_rng(0)
N = 997
INPUTS, LABELS = rng.random((N, 12)), rng.integers(0, 4, N)
TOLERANCE = {"float64": 1e-10, "float32": 1e-5}
STRATEGIES = [*LESSON_06, ZeRO, Overlap]  # lesson 06's three by name, lesson 10's two as classes
CHECK_PREFIX = "check_"  # the checks' names (run_checkers.py reads it too)


def sequential(dtype, **settings):
    network = Network((12, 7, 4), dtype=dtype, seed=3)
    train(network, INPUTS.astype(dtype), LABELS, progress=False, **settings)
    return network.params


def parallel(dtype, strategy, seed_here=3, **settings):
    """Data-parallel training from the same start (rank 0's weights are broadcast): (params, history)."""
    network = Network((12, 7, 4), dtype=dtype, seed=seed_here)
    local_inputs, local_labels, start = shard(comm, INPUTS.astype(dtype) if rank == 0 else None,
                                              LABELS if rank == 0 else None)
    history = train_parallel(comm, network, local_inputs, local_labels, num_samples=N, start=start,
                             strategy=strategy, **settings)
    return network.params, history


def check_equal_to_sequential():
    for dtype in ("float64", "float32"):
        warmup = (lambda progress: 0.1 + 0.4 * min(1.0, progress))  # a per-step schedule
        for settings in (dict(epochs=4, learning_rate=0.5),  # full batch: 4 steps
                         dict(epochs=2, learning_rate=0.5, batch_size=64, momentum=0.9, seed=5),  # 32 steps
                         dict(epochs=2, learning_rate=warmup, batch_size=64, momentum=0.9, seed=5)):
            expected = sequential(dtype, **settings)
            for strategy in STRATEGIES:
                # Ranks other than 0 start from other weights: the initial broadcast must fix that.
                params, history = parallel(dtype, strategy, seed_here=3 if rank == 0 else 100 + rank, **settings)
                error = float(np.abs(params - expected).max() / np.abs(expected).max())
                assert error <= TOLERANCE[dtype], f"{strategy} {dtype} {settings}: relative error {error:.2e}"
                on_root = comm.bcast(params if rank == 0 else None)
                assert np.array_equal(params, on_root), f"{strategy} {dtype}: ranks hold different parameters"
                assert history.steps == (4 if "batch_size" not in settings else 2 * 16)
                assert all(value >= 0 for value in history.phase_seconds.values())


def check_staged_through_host_memory():
    """A non-NumPy network (array_api_strict, standing in for CuPy without a CUDA-aware MPI):
    shards move to its device, gradients and parameters are staged through host copies for MPI."""
    import array_api_strict as xps

    from nnlib.lesson02_network.arrays import to_numpy

    settings = dict(epochs=2, learning_rate=0.5, batch_size=64, momentum=0.9, seed=5)
    expected = sequential("float64", **settings)
    local_inputs, local_labels, start = shard(comm, INPUTS if rank == 0 else None, LABELS if rank == 0 else None)
    for strategy in STRATEGIES:
        network = Network((12, 7, 4), dtype="float64", seed=3 if rank == 0 else 50, device=xps)
        train_parallel(HostStaging(comm, xps, cuda_aware=False), network, local_inputs, local_labels, num_samples=N,
                       start=start, strategy=strategy, **settings)
        params = to_numpy(network.params)
        error = float(np.abs(params - expected).max() / np.abs(expected).max())
        assert error <= 1e-10, f"staged {strategy}: relative error {error:.2e}"
        assert np.array_equal(params, comm.bcast(params if rank == 0 else None)), f"staged {strategy}: ranks differ"


def check_gpu_paths_with_a_stand_in_cupy():
    """The code that runs only for CuPy networks (tests/stand_in_cupy.py: NumPy posing as CuPy):
    buffers passed directly to a CUDA-aware MPI after waiting for the GPU, or staged through host
    memory. Both give the sequential result; with the GPU's waits, the phase times are honest."""
    import pathlib

    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
    from stand_in_cupy import StandInCuPy

    from nnlib.course import environment
    from nnlib.lesson08_gpu import backend

    stand_in = sys.modules["cupy"] = StandInCuPy()
    environment.gpu_status.cache_clear()
    try:
        settings = dict(epochs=2, learning_rate=0.5, batch_size=64, momentum=0.9, seed=5)
        expected = sequential("float64", **settings)
        local_inputs, local_labels, start = shard(comm, INPUTS if rank == 0 else None, LABELS if rank == 0 else None)
        for cuda_aware in (True, False):
            for strategy in STRATEGIES:
                network = Network((12, 7, 4), dtype="float64", seed=3 if rank == 0 else 50,
                                  device=backend.resolve_backend("gpu"))
                assert network.xp is stand_in
                waits_before = stand_in.synchronizations
                history = train_parallel(HostStaging(comm, network.xp, cuda_aware), network, local_inputs,
                                         local_labels, num_samples=N, start=start, strategy=strategy,
                                         hooks=[WaitForDevice(network.xp)], **settings)
                error = float(np.abs(network.params - expected).max() / np.abs(expected).max())
                assert error <= 1e-10, f"stand-in GPU, CUDA-aware {cuda_aware}, {strategy}: relative error {error:.2e}"
                # At least one wait per phase boundary of every step (data, compute, communicate, update).
                assert stand_in.synchronizations - waits_before >= 3 * history.steps
        from nnlib.lesson13_faults.watchdog import train_watched  # lesson 13's deadline around lesson 08's staging

        network = Network((12, 7, 4), dtype="float64", seed=3 if rank == 0 else 50,
                          device=backend.resolve_backend("gpu"))
        train_watched(train_parallel, comm, network, local_inputs, local_labels, num_samples=N, start=start,
                      wrap=lambda watched: HostStaging(watched, network.xp, cuda_aware=False), **settings)
        error = float(np.abs(network.params - expected).max() / np.abs(expected).max())
        assert error <= 1e-10, f"stand-in GPU, staged under the watchdog: relative error {error:.2e}"
    finally:
        del sys.modules["cupy"]
        environment.gpu_status.cache_clear()


def check_bad_configurations_fail_on_every_rank():
    few = min(size - 1, 1)
    if size > 1:
        expect_error_everywhere(lambda: shard(comm, INPUTS[:few] if rank == 0 else None,
                                              LABELS[:few] if rank == 0 else None), "every rank needs at least one")
    network = Network((12, 7, 4), dtype="float64", seed=0)
    local_inputs, local_labels, start = shard(comm, INPUTS if rank == 0 else None, LABELS if rank == 0 else None)
    common = dict(num_samples=N, start=start, epochs=1, learning_rate=0.1)
    if size > 1:
        expect_error_everywhere(lambda: train_parallel(comm, network, local_inputs, local_labels,
                                                       batch_size=size - 1, **common), "smaller than the number of ranks")
        # Mismatched setups: one rank with another network, another batch size, or other data.
        other = Network((12, 9, 4) if rank == size - 1 else (12, 7, 4), dtype="float64", seed=0)
        expect_error_everywhere(lambda: train_parallel(comm, other, local_inputs, local_labels, **common),
                                "the ranks disagree on the network")
        expect_error_everywhere(lambda: train_parallel(comm, network, local_inputs, local_labels,
                                                       batch_size=64 if rank == 0 else 32, **common),
                                "the ranks disagree on the training settings")
        expect_error_everywhere(lambda: train_parallel(comm, network, local_inputs, local_labels, **common,
                                                       validation=(INPUTS, LABELS) if rank == 0 else None),
                                "the ranks disagree on the training settings")
        expect_error_everywhere(lambda: train_parallel(comm, network, local_inputs, local_labels, **common,
                                                       batches=PerRankBatches if rank == 0 else None),
                                "the ranks disagree on the training settings")
        wrong_width = local_inputs[:, :10] if rank == size - 1 else local_inputs
        expect_error_everywhere(lambda: train_parallel(comm, network, wrong_width, local_labels, **common),
                                "inputs have 10 features but the network expects 12")
        expect_error_everywhere(lambda: train_parallel(comm, network, local_inputs[1:], local_labels[1:], **common),
                                "the shards do not tile")
    expect_error_everywhere(lambda: train_parallel(comm, network, local_inputs, local_labels,
                                                   strategy="ring", **common), "strategy must be one of")
    expect_error_everywhere(lambda: train_parallel(comm, network, local_inputs, local_labels,
                                                   momentum=1.5, **common), "momentum must be in [0, 1)")
    expect_error_everywhere(lambda: train_parallel(comm, network, local_inputs, local_labels,
                                                   validation=(INPUTS[:, :5], LABELS), **common),
                            "inputs have 5 features but the network expects 12")


def check_zero_keeps_one_slice_of_the_optimizer_state():
    """ZeRO: each rank's velocity is its uneven slice; the slices tile the whole vector once."""
    from nnlib.lesson03_training.training import Settings
    from nnlib.lesson10_zero_overlap.zero import ZeRO

    network = Network((12, 7, 4), dtype="float64", seed=3)  # 123 parameters: uneven for P = 2 and 4
    zero = ZeRO(comm, network)
    optimizer = zero.optimizer(network, Settings(1, 0.1, momentum=0.9).optimizer_for(0.1))
    slices = comm.allgather((zero.mine.start, zero.mine.stop, optimizer.state_bytes))
    assert [start for start, _, _ in slices] == [0] + [stop for _, stop, _ in slices[:-1]]
    assert slices[-1][1] == network.num_params
    assert sum(state for _, _, state in slices) == network.params.nbytes  # the whole velocity, once
    assert max(state for _, _, state in slices) <= -(-network.num_params // size) * 8


class KeepOptimizer(Hook):
    """Keeps the run's optimizer (made as the loop began) for a check to read."""

    def begin(self, run) -> None:
        self.optimizer = run.optimizer


def check_adam_equals_sequential_adam():
    """Adam and AdamW in float64 on 140 parameters and 997 samples (uneven over P = 3): every strategy, lesson 10's
    ZeRO (each rank's optimizer made for and stepped on its slice, and keeping 2 numbers of state per parameter of
    it) among them, equals sequential Adam within 1e-10; every rank holds the same parameters."""
    sizes = (12, 8, 4)  # 140 parameters
    local_inputs, local_labels, start = shard(comm, INPUTS if rank == 0 else None, LABELS if rank == 0 else None)
    for optimizer in (dict(optimizer="adam"), dict(optimizer="adamw", weight_decay=0.5, beta1=0.8, beta2=0.99)):
        settings = dict(optimizer, epochs=2, learning_rate=0.01, batch_size=64, seed=5)
        expected = Network(sizes, dtype="float64", seed=3)
        train(expected, INPUTS, LABELS, progress=False, **settings)
        for strategy in STRATEGIES:
            network, kept = Network(sizes, dtype="float64", seed=3 if rank == 0 else 100 + rank), KeepOptimizer()
            train_parallel(comm, network, local_inputs, local_labels, num_samples=N, start=start, strategy=strategy,
                           hooks=[kept], **settings)
            error = float(np.abs(network.params - expected.params).max() / np.abs(expected.params).max())
            assert error <= 1e-10, f"{strategy} {optimizer}: relative error {error:.2e}"
            assert np.array_equal(network.params, comm.bcast(network.params if rank == 0 else None)), strategy
            state = comm.allgather(0 if kept.optimizer is None else kept.optimizer.state_bytes)
            copies = 1 if strategy in (ZeRO, "parameter_server", "reduce_broadcast") else size  # (ZeRO: slices)
            assert sum(state) == copies * 2 * expected.params.nbytes, (strategy, state)


def check_zero_stage_2_equals_sequential_and_holds_only_its_slice_of_the_gradient():
    """ZeRO stage 2 (a GradientShardedNetwork, its gradient reduce-scattered bucket by bucket during backward) in
    float64, full batch, momentum, Adam and AdamW, with and without 3 micro-batches (each micro-batch's buckets added
    into the slice): sequential training's parameters within 1e-10, the same on every rank; ``grads`` is rank r's
    slice only, and the buckets hold at most Psi / (4P) values (but for a row wider than that)."""
    from nnlib.lesson10_zero_overlap.zero import GradientShardedNetwork, ZeROStage2, rank_slice
    from nnlib.lesson17_activations.accumulation import MicroBatched

    class Buckets:  # comm, with the length of every bucket it reduce-scatters
        def __init__(self):
            self.sizes = []

        def __getattr__(self, name):
            return getattr(comm, name)

        def Reduce_scatter(self, values, *arguments, **keywords):
            self.sizes.append(values.size)
            return comm.Reduce_scatter(values, *arguments, **keywords)

    local_inputs, local_labels, start = shard(comm, INPUTS if rank == 0 else None, LABELS if rank == 0 else None)
    buckets = Buckets()
    for settings in (dict(epochs=3, learning_rate=0.5), dict(epochs=2, learning_rate=0.5, batch_size=64, momentum=0.9,
                     seed=5), dict(epochs=2, learning_rate=0.01, batch_size=64, optimizer="adam", seed=5),
                     dict(epochs=2, learning_rate=0.01, batch_size=64, optimizer="adamw", weight_decay=0.5, seed=5)):
        expected = sequential("float64", **settings)
        for micro_batches in (1, 3):
            network = GradientShardedNetwork(buckets, (12, 7, 4), dtype="float64", seed=3)
            train_parallel(comm, MicroBatched(network, micro_batches), local_inputs, local_labels, num_samples=N,
                           start=start, strategy=ZeROStage2, **settings)
            error = float(np.abs(network.params - expected).max() / np.abs(expected).max())
            assert error <= 1e-10, f"ZeRO-2, {micro_batches} micro-batches, {settings}: relative error {error:.2e}"
            assert np.array_equal(network.params, comm.bcast(network.params if rank == 0 else None))
    mine = rank_slice(network.num_params, size, rank)
    assert network.grads.shape == (mine.stop - mine.start,)
    assert network.bucket == max(1, network.num_params // (4 * size))
    assert max(buckets.sizes) <= max(network.bucket, 7), (max(buckets.sizes), network.bucket)  # (or one row of W)
    expect_error_everywhere(lambda: train_parallel(comm, Network((12, 7, 4)), local_inputs, local_labels,
                                                   num_samples=N, start=start, strategy=ZeROStage2, epochs=1,
                                                   learning_rate=0.1),
                            "ZeRO stage 2 trains a GradientShardedNetwork; got Network")


def check_the_per_rank_sampler():
    """Each rank samples its own shard: the ranks stay identical, the run repeats, and it learns."""
    settings = dict(epochs=3, learning_rate=0.5, batch_size=64, momentum=0.9, seed=5, batches=PerRankBatches)
    first, history = parallel("float64", "allreduce", **settings)
    again, _ = parallel("float64", ZeRO, **settings)
    np.testing.assert_allclose(again, first, rtol=0, atol=1e-12)
    assert np.array_equal(first, comm.bcast(first if rank == 0 else None))
    shards, batches = split_evenly(997, size)[0], split_evenly(64, size)[0]  # (an epoch lasts till every shard is done)
    steps = max(-(-997 // 64), *(-(-shard // batch) for shard, batch in zip(shards, batches)))
    assert history.steps == 3 * steps and history.loss[-1] < history.loss[0]
    if size > 1:  # other batches than the sequential run's
        assert np.abs(first - sequential("float64", **{k: v for k, v in settings.items() if k != "batches"})).max() > 1e-6


def check_overlapped_buckets_equal_one_allreduce():
    """Deeper network, any bucket size, on the ranks' MPI or a simulated link over it: the overlapped Iallreduces give
    the plain Allreduce's sums."""
    from nnlib.lesson10_zero_overlap.overlap import BucketedAllreduce, bucket_ranges
    from nnlib.lesson10_zero_overlap.simulated_link import SimulatedLink

    local_inputs, local_labels, _ = shard(comm, INPUTS if rank == 0 else None, LABELS if rank == 0 else None)
    network = Network((12, 9, 8, 7, 4), dtype="float64", seed=3)
    network.loss_and_gradient(local_inputs, local_labels, normalizer=N)
    expected = network.grads.copy()
    comm.Allreduce(MPI.IN_PLACE, expected, op=MPI.SUM)
    link = SimulatedLink(comm, 1e-5, 1e-9)  # lesson 10's simulated link: it sums as MPI does, later
    for bucket_bytes, through in ((0, comm), (300, comm), (10**9, comm), (0, link), (300, link)):
        overlap = BucketedAllreduce(through, network, bucket_bytes)
        done = []
        network.loss_and_gradient(local_inputs, local_labels, normalizer=N,
                                  on_layer_done=lambda layer: (done.append(layer), overlap.layer_done(layer)))
        assert done == [3, 2, 1, 0]
        assert len(overlap.buckets) == {0: 4, 300: len(bucket_ranges(network, 300)), 10**9: 1}[bucket_bytes]
        overlap.finish()
        np.testing.assert_allclose(network.grads, expected, rtol=1e-12, atol=1e-15)


def check_communication_split_into_waiting_and_transfer():
    """A rank that is late to every step: the others' communication is waiting, not transfer."""
    import time

    from nnlib.lesson10_zero_overlap.waiting import communication_split

    delay, steps = 0.06, 8  # long beside a transfer even with 4 ranks taking turns on 2 busy cores
    late = size - 1
    local_inputs, local_labels, start = shard(comm, INPUTS if rank == 0 else None, LABELS if rank == 0 else None)
    network = Network((12, 7, 4), dtype="float64", seed=3)
    history = train_parallel(comm, network, local_inputs, local_labels, num_samples=N, start=start, epochs=1,
                             learning_rate=0.5, batch_size=-(-N // steps), momentum=0.9, timeline_steps=steps,
                             on_step=lambda *_: time.sleep(delay) if rank == late else None)
    assert history.steps == steps
    transfer, waiting = communication_split(comm, history)
    communicate = history.phase_seconds["communicate"] / steps
    assert waiting.shape == (size,) and abs(transfer + waiting[rank] - communicate) < 1e-9
    assert waiting[late] < delay / 4 and transfer < delay / 4
    if size > 1:  # every other rank waits for the late one at every step but the first
        assert all(waiting[r] > delay * (steps - 1) / steps * 0.8 for r in range(size) if r != late), waiting
    short = train_parallel(comm, Network((12, 7, 4), dtype="float64", seed=3), local_inputs, local_labels,
                           num_samples=N, start=start, epochs=1, learning_rate=0.5, batch_size=-(-N // steps),
                           timeline_steps=steps - 1)
    expect_error_everywhere(lambda: communication_split(comm, short), "timeline_steps=8")


if __name__ == "__main__":
    run_checks(globals(), prefix=CHECK_PREFIX)
