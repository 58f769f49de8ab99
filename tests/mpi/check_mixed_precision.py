"""Run under mpiexec with 1 to 4 ranks: mixed precision (float16 with loss scaling, bfloat16 without) combined with
lesson 12's other savers trains as the same run does in one process.

Data parallel (lesson 05's Allreduce) and FSDP, each with gradient accumulation (3 micro-batches) and recomputation
(every 2nd layer), on 203 samples and layers of 117, 80, 63, 32 parameters (uneven over any rank count): the same
scale decisions on every step as the sequential mixed-precision run (from a scale that overflows at first, so some
steps are skipped), the same verdicts on every rank, and weights within 1e-3 (float16) or 1e-2 (bfloat16) of the
largest of the sequential run's (tolerance: each rank's low-precision gradient is a partial sum over its rows,
rounded to 2 bytes, where one process rounds the whole batch's; on 1 rank they are bit-identical). FSDP's ranks reach the same skip verdict when only one
rank's chunk overflowed. An FSDP float16 run checkpointed and resumed equals an uninterrupted one bit for bit.
Lesson 09's tensor parallelism in mixed precision (every rank the whole batch, its slices of each layer, partial
products summed in float32), with accumulation and recomputation, on the uneven widths 64-127-96-121-80-113-72-10:
the same verdicts as the sequential run on every rank, weights within the same tolerances (the float32 sums of
partial products round in another order), and every rank skips when only one rank's slice overflowed.
Lesson 09's pipeline in mixed precision (low layers, activations and messages; MPI sends bfloat16 as uint16), with
GPipe and 1F1B, with and without recomputation, and lesson 13's interleaved, ZB-H1 and ZB-H2 schedules: the
sequential run's operations on the same numbers, micro-batch by micro-batch, so its weights bit for bit and its
verdicts; every stage skips when only one stage's layers overflowed.
"""

import shutil
import tempfile

import numpy as np
from harness import assert_on_every_rank, run_checks
from mpi4py import MPI

from nnlib import Network
from nnlib.lesson03_training.training import Settings
from nnlib.lesson05_data_parallel import shard, train_parallel
from nnlib.lesson05_data_parallel.data_parallel import Allreduce
from nnlib.lesson08_inside_allreduce.zero import ZeRO
from nnlib.lesson09_model_parallel.tensor import TensorParallelMLP
from nnlib.lesson10_faults.checkpoint import CheckpointFolder, Checkpointing
from nnlib.lesson12_memory.fsdp import FullySharded, FullyShardedNetwork
from nnlib.lesson12_memory.mixed_pipeline import MixedPipelineMLP, MixedRecomputedPipelineMLP
from nnlib.lesson12_memory.mixed_precision import MixedPrecision, loss_scaled, train_mixed
from nnlib.lesson13_pipeline_schedules.schedules import MixedScheduledPipeline

comm = MPI.COMM_WORLD
rank, size = comm.rank, comm.size
rng = np.random.default_rng(0)
N = 203
INPUTS, LABELS = rng.random((N, 12)).astype(np.float32), rng.integers(0, 4, N)
SIZES = (12, 9, 8, 7, 4)
SETTINGS = dict(epochs=2, learning_rate=0.5, batch_size=32, momentum=0.9, seed=5)
TOLERANCE = {"float16": 1e-3, "bfloat16": 1e-2}  # relative to the largest weight: about 8 and 2.5 units of the
# low precision's last place (2^-11, 2^-8); seen on 2-4 ranks: about 1e-4 and 3e-3


def options(precision: str) -> dict:
    scale = 2.0 ** 24 if precision == "float16" else None  # float16: overflows at first, then grows every 4 steps
    return dict(precision=precision, loss_scale=scale, growth_interval=4, micro_batches=3, recompute_every=2)


def sequential(precision: str) -> MixedPrecision:
    mixed = MixedPrecision(Network(SIZES, seed=3), **options(precision))
    train_mixed(mixed, INPUTS, LABELS, Settings(**SETTINGS))
    return mixed


def parallel(sharded, precision: str, hooks=(), on_step=None) -> MixedPrecision:
    """``sharded``: True (FSDP), False (Allreduce) or "zero" (lesson 08's ZeRO-1/2: sliced momentum and update)."""
    master = FullyShardedNetwork(comm, SIZES, dtype="float32", seed=3) if sharded is True else Network(SIZES, seed=3)
    mixed = MixedPrecision(master, **options(precision))
    local_inputs, local_labels, start = shard(comm, INPUTS if rank == 0 else None, LABELS if rank == 0 else None)
    sync = {True: FullySharded, False: Allreduce, "zero": ZeRO}[sharded]
    train_parallel(comm, mixed, local_inputs, local_labels, num_samples=N, start=start, hooks=list(hooks),
                   on_step=on_step, strategy=loss_scaled(sync), **SETTINGS)
    return mixed


def check_equal_to_sequential(sharded: bool, precision: str) -> None:
    expected, mixed = sequential(precision), parallel(sharded, precision)
    params = mixed.full_params() if sharded is True else mixed.params
    verdicts = comm.allgather(mixed.verdicts)
    assert verdicts == [verdicts[0]] * size, "the ranks reached different verdicts"
    assert mixed.verdicts == expected.verdicts, (mixed.verdicts, expected.verdicts)
    assert precision == "bfloat16" or 1 <= mixed.skipped < len(mixed.verdicts)
    error = float(np.abs(params - expected.params).max() / np.abs(expected.params).max())
    assert error <= (0.0 if size == 1 else TOLERANCE[precision]), f"{precision}, {sharded=}: {error}"


def test_data_parallel_mixed_precision_with_accumulation_and_recomputation_equals_sequential():
    for precision in ("float16", "bfloat16"):
        check_equal_to_sequential(False, precision)


def test_zero_mixed_precision_with_accumulation_and_recomputation_equals_sequential():
    """Lesson 08's ZeRO-1/2: each rank checks and updates its slice of the summed gradient; the ranks agree on the
    verdict with one flag Allreduce, and the allgathered float32 master equals the sequential run's within the
    tolerances (the same on every rank: the allgather hands out the same slices)."""
    for precision in ("float16", "bfloat16"):
        check_equal_to_sequential("zero", precision)
        mixed = parallel("zero", precision)
        assert np.array_equal(mixed.params, comm.bcast(mixed.params if rank == 0 else None))


def test_zero_ranks_skip_together_when_one_slice_overflowed():
    """Only the last rank's slice holds an inf (what its reduce-scatter summed): every rank skips."""
    mixed = MixedPrecision(Network(SIZES, seed=3))
    optimizer = loss_scaled(ZeRO)(comm, mixed).optimizer(mixed, 0.1, 0.9)
    mixed.network.grads[...] = 0.0
    if rank == size - 1:
        mixed.network.grads[optimizer.stop - 1] = np.inf
    assert comm.allgather(mixed.overflow(optimizer.comm, optimizer.part)) == [True] * size
    mixed.network.grads[...] = 0.0
    assert comm.allgather(mixed.overflow(optimizer.comm, optimizer.part)) == [False] * size


def test_fsdp_mixed_precision_with_accumulation_and_recomputation_equals_sequential():
    for precision in ("float16", "bfloat16"):
        check_equal_to_sequential(True, precision)


WIDE = (64, 127, 96, 121, 80, 113, 72, 10)  # column, row, column, row, column, row, replicated: uneven on 2-4 ranks
WIDE_INPUTS, WIDE_LABELS = rng.random((N, WIDE[0])).astype(np.float32), rng.integers(0, WIDE[-1], N)


def test_tensor_parallel_mixed_precision_with_accumulation_and_recomputation_equals_sequential():
    for precision in ("float16", "bfloat16"):
        expected = MixedPrecision(Network(WIDE, seed=3), **options(precision))
        train_mixed(expected, WIDE_INPUTS, WIDE_LABELS, Settings(**SETTINGS))
        mixed = MixedPrecision(TensorParallelMLP(comm, WIDE, dtype="float32", seed=3), **options(precision))
        train_mixed(mixed, WIDE_INPUTS, WIDE_LABELS, Settings(**SETTINGS))  # every rank the same batches
        verdicts = comm.allgather(mixed.verdicts)
        assert verdicts == [verdicts[0]] * size and mixed.verdicts == expected.verdicts, (mixed.verdicts,
                                                                                          expected.verdicts)
        assert precision == "bfloat16" or 1 <= mixed.skipped < len(mixed.verdicts)
        params = mixed.network.full_params()
        error = float(np.abs(params - expected.params).max() / np.abs(expected.params).max())
        assert error <= (0.0 if size == 1 else TOLERANCE[precision]), f"tensor parallel, {precision}: {error}"


def test_tensor_parallel_ranks_skip_together_when_one_slice_overflowed():
    mixed = MixedPrecision(TensorParallelMLP(comm, WIDE, dtype="float32", seed=3))
    mixed.network.grads[...] = 0.0
    if rank == size - 1:
        mixed.network.grads[0] = np.inf  # in this rank's columns of the first layer only
    assert comm.allgather(mixed.overflow()) == [True] * size
    mixed.network.grads[...] = 0.0
    assert comm.allgather(mixed.overflow()) == [False] * size


def check_pipeline_equals_sequential(build, sizes, micro_batches: int, name: str) -> list:
    """The failures of ``build(precision, scale)`` (a mixed pipeline) against the sequential MixedPrecision run with
    the same micro-batches, float16 (from a scale that overflows at first) and bfloat16: weights bit for bit."""
    inputs, labels = rng.random((N, sizes[0])).astype(np.float32), rng.integers(0, sizes[-1], N)
    failures = []
    for precision in ("float16", "bfloat16"):
        scale = options(precision)["loss_scale"]
        expected = MixedPrecision(Network(sizes, seed=3), precision=precision, loss_scale=scale, growth_interval=4,
                                  micro_batches=micro_batches)
        train_mixed(expected, inputs, labels, Settings(**SETTINGS))
        stage = build(precision, scale)
        train_mixed(stage, inputs, labels, Settings(**SETTINGS))
        params, verdicts = stage.full_params(), comm.allgather(stage.verdicts)
        if not (verdicts == [expected.verdicts] * size and np.array_equal(params, expected.params)):
            failures.append(f"{name} {precision}: verdicts {verdicts[rank]} against {expected.verdicts}, largest "
                            f"difference {np.abs(params - expected.params).max()}")
    return failures


def test_pipeline_mixed_precision_equals_sequential_bit_for_bit():
    failures = []
    for cls in (MixedPipelineMLP, MixedRecomputedPipelineMLP):
        for schedule in ("gpipe", "1f1b"):
            build = lambda precision, scale, cls=cls, schedule=schedule: cls(  # noqa: E731
                comm, WIDE, dtype="float32", seed=3, micro_batches=3, schedule=schedule, precision=precision,
                loss_scale=scale, growth_interval=4)
            failures += check_pipeline_equals_sequential(build, WIDE, 3, f"{cls.__name__} {schedule}")
    deeper = WIDE[:-1] + (12, 10)  # 8 layers: two chunks on each of up to 4 ranks
    for schedule, chunks in (("interleaved", 2), ("zb-h1", 1), ("zb-h2", 1)):
        build = lambda precision, scale, schedule=schedule, chunks=chunks: MixedScheduledPipeline(  # noqa: E731
            comm, deeper, dtype="float32", seed=3, micro_batches=4, schedule=schedule, chunks=chunks,
            precision=precision, loss_scale=scale, growth_interval=4)
        failures += check_pipeline_equals_sequential(build, deeper, 4, schedule)
    assert_on_every_rank(failures)


def test_pipeline_stages_skip_together_when_one_stage_overflowed():
    stage = MixedPipelineMLP(comm, WIDE, dtype="float32", seed=3, micro_batches=2)
    stage.grads[...] = 0.0
    if rank == size - 1:
        stage.grads[-1] = np.inf  # in the last stage's layers only
    assert comm.allgather(stage.overflow()) == [True] * size
    stage.grads[...] = 0.0
    assert comm.allgather(stage.overflow()) == [False] * size


def test_fsdp_ranks_skip_together_when_one_chunk_overflowed():
    """Each rank holds a chunk of the summed gradient: an inf in the last rank's chunk alone makes every rank skip."""
    mixed = MixedPrecision(FullyShardedNetwork(comm, SIZES, dtype="float32", seed=3))
    mixed.network.grads[...] = 0.0
    if rank == size - 1:
        mixed.network.grads[-1] = np.inf
    assert comm.allgather(mixed.overflow()) == [True] * size
    mixed.network.grads[...] = 0.0
    assert comm.allgather(mixed.overflow()) == [False] * size


def test_fsdp_mixed_precision_resumes_exactly_from_a_checkpoint():
    """Stopped after step 9 (of 7 per epoch; checkpoints every 5 steps: the one after step 5 is used): the
    resumed run's whole parameters and loss scale equal an uninterrupted run's bit for bit."""
    expected = parallel(True, "float16")
    folder_name = comm.bcast(tempfile.mkdtemp() if rank == 0 else None, root=0)

    def stop(epoch, step, total_steps):
        if total_steps == 9:
            raise RuntimeError("stopped on purpose")

    try:
        try:
            parallel(True, "float16", [Checkpointing(CheckpointFolder(folder_name, every=5))], stop)
        except RuntimeError as error:
            assert "stopped on purpose" in str(error)
        resumed = parallel(True, "float16", [Checkpointing(CheckpointFolder(folder_name, every=5), resume=True)])
        assert np.array_equal(resumed.full_params(), expected.full_params())
        assert (resumed.loss_scale, resumed.good_steps, resumed.skipped) == \
            (expected.loss_scale, expected.good_steps, expected.skipped)
    finally:
        comm.Barrier()
        if rank == 0:
            shutil.rmtree(folder_name, ignore_errors=True)


if __name__ == "__main__":
    run_checks(globals())
