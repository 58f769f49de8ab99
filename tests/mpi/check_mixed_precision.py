"""Run under mpiexec with 1 to 4 ranks: mixed precision (float16 with loss scaling, bfloat16 without) combined with
lessons 16 and 17's other savers trains as the same run does in one process.

Data parallel (lesson 06's Allreduce) and FSDP, each with gradient accumulation (3 micro-batches) and recomputation
(every 2nd layer), on 203 samples and layers of 117, 80, 63, 32 parameters (uneven over any rank count): the same
scale decisions on every step as the sequential mixed-precision run (from a scale that overflows at first, so some
steps are skipped), the same verdicts on every rank, and weights within 1e-3 (float16) or 1e-2 (bfloat16) of the
largest of the sequential run's (tolerance: each rank's low-precision gradient is a partial sum over its rows,
rounded to 2 bytes, where one process rounds the whole batch's; on 1 rank they are bit-identical). FSDP's ranks reach the same skip verdict when only one
rank's chunk overflowed. An FSDP float16 run checkpointed and resumed equals an uninterrupted one bit for bit.
(Mixed precision is taught with data parallelism and FSDP: it does not combine with lessons 11 and 12's tensor or
pipeline parallelism, and the batch job refuses those combinations: tests/test_train_command.py.)
"""

import shutil
import tempfile

import numpy as np
from harness import assert_on_every_rank, run_checks
from mpi4py import MPI

from nnlib import Network
from nnlib.lesson03_training.training import Settings
from nnlib.lesson06_data_parallel import shard, train_parallel
from nnlib.lesson06_data_parallel.data_parallel import Allreduce
from nnlib.lesson10_zero_overlap.zero import ZeRO
from nnlib.lesson13_faults.checkpoint import CheckpointFolder, Checkpointing
from nnlib.lesson16_sharding.fsdp import FullySharded, FullyShardedNetwork
from nnlib.lesson17_activations.mixed_precision import MixedPrecision, train_mixed

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
    """``sharded``: True (FSDP), False (Allreduce) or "zero" (lesson 10's ZeRO-1/2: sliced momentum and update)."""
    master = FullyShardedNetwork(comm, SIZES, dtype="float32", seed=3) if sharded is True else Network(SIZES, seed=3)
    mixed = MixedPrecision(master, **options(precision))
    local_inputs, local_labels, start = shard(comm, INPUTS if rank == 0 else None, LABELS if rank == 0 else None)
    sync = {True: FullySharded, False: Allreduce, "zero": ZeRO}[sharded]
    train_parallel(comm, mixed, local_inputs, local_labels, num_samples=N, start=start, hooks=list(hooks),
                   on_step=on_step, strategy=sync, scaler=mixed.scaler, **SETTINGS)
    return mixed


def check_equal_to_sequential(sharded: bool, precision: str) -> None:
    expected, mixed = sequential(precision), parallel(sharded, precision)
    params = mixed.full_params() if sharded is True else mixed.params
    verdicts = comm.allgather(mixed.scaler.verdicts)
    assert verdicts == [verdicts[0]] * size, "the ranks reached different verdicts"
    assert mixed.scaler.verdicts == expected.scaler.verdicts, (mixed.scaler.verdicts, expected.scaler.verdicts)
    assert precision == "bfloat16" or 1 <= mixed.scaler.skipped < len(mixed.scaler.verdicts)
    error = float(np.abs(params - expected.params).max() / np.abs(expected.params).max())
    assert error <= (0.0 if size == 1 else TOLERANCE[precision]), f"{precision}, {sharded=}: {error}"


def test_data_parallel_mixed_precision_with_accumulation_and_recomputation_equals_sequential():
    for precision in ("float16", "bfloat16"):
        check_equal_to_sequential(False, precision)


def test_zero_mixed_precision_with_accumulation_and_recomputation_equals_sequential():
    """Lesson 10's ZeRO-1/2: each rank checks and updates its slice of the summed gradient; the ranks agree on the
    verdict with one flag Allreduce, and the allgathered float32 master equals the sequential run's within the
    tolerances (the same on every rank: the allgather hands out the same slices)."""
    for precision in ("float16", "bfloat16"):
        check_equal_to_sequential("zero", precision)
        mixed = parallel("zero", precision)
        assert np.array_equal(mixed.params, comm.bcast(mixed.params if rank == 0 else None))


def test_zero_ranks_skip_together_when_one_slice_overflowed():
    """Only the last rank's slice holds an inf (what its reduce-scatter summed): every rank skips."""
    mixed = MixedPrecision(Network(SIZES, seed=3))
    sync = ZeRO(comm, mixed)
    optimizer = sync.optimizer(mixed, Settings(1, 0.1, momentum=0.9).optimizer_for(0.1))
    mine, master, scaler = sync.mine, mixed.network, mixed.scaler
    master.grads[...] = 0.0
    if rank == size - 1:
        master.grads[mine.stop - 1] = np.inf
    assert comm.allgather(scaler.found_inf(master.grads[mine], comm)) == [True] * size
    before = mixed.params.copy()
    scaler.step(optimizer, master.params[mine], master.grads[mine], comm)  # as ZeRO's step calls it (Run.update)
    assert comm.allgather((scaler.skipped, np.array_equal(mixed.params, before))) == [(1, True)] * size
    master.grads[...] = 0.0
    assert comm.allgather(scaler.found_inf(master.grads[mine], comm)) == [False] * size
    master.grads[...] = 1.0
    scaler.step(optimizer, master.params[mine], master.grads[mine], comm)
    assert comm.allgather((mixed.scaler.skipped, np.array_equal(mixed.params, before))) == [(1, False)] * size


def test_fsdp_mixed_precision_with_accumulation_and_recomputation_equals_sequential():
    for precision in ("float16", "bfloat16"):
        check_equal_to_sequential(True, precision)


def test_fsdp_ranks_skip_together_when_one_chunk_overflowed():
    """Each rank holds a chunk of the summed gradient: an inf in the last rank's chunk alone makes every rank skip."""
    mixed = MixedPrecision(FullyShardedNetwork(comm, SIZES, dtype="float32", seed=3))
    mixed.network.grads[...] = 0.0
    if rank == size - 1:
        mixed.network.grads[-1] = np.inf
    assert comm.allgather(mixed.scaler.found_inf(mixed.grads, comm)) == [True] * size  # (FSDP's step: Run.update)
    mixed.network.grads[...] = 0.0
    assert comm.allgather(mixed.scaler.found_inf(mixed.grads, comm)) == [False] * size


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
        assert (resumed.loss_scale, resumed.scaler.good_steps, resumed.scaler.skipped) == \
            (expected.loss_scale, expected.scaler.good_steps, expected.scaler.skipped)
    finally:
        comm.Barrier()
        if rank == 0:
            shutil.rmtree(folder_name, ignore_errors=True)


if __name__ == "__main__":
    run_checks(globals())
