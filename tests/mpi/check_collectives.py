"""Run under mpiexec with any number of ranks: every nnlib.lesson04_collectives.collectives helper, exact values on every rank.

Exits 0 when every check passed on every rank; prints the failures and exits 1 otherwise.
Run by tests/test_mpi.py (through run_checkers.py) with 1, 2, 3 and 4 ranks.
"""

import numpy as np
from harness import run_checks
from mpi4py import MPI

from nnlib.lesson04_collectives import collectives as c
from nnlib.lesson04_collectives import timing

comm = MPI.COMM_WORLD
rank, size = comm.rank, comm.size


def expect_equal(actual, expected):
    np.testing.assert_array_equal(actual, expected)
    assert actual.dtype == np.asarray(expected).dtype, (actual.dtype, np.asarray(expected).dtype)


def test_split():
    for total in (0, 1, size - 1, size, 10, 997):
        counts, starts = c.split_evenly(total, size)
        assert sum(counts) == total and max(counts) - min(counts) <= (1 if total else 0)
        assert starts[rank] == sum(counts[:rank])


def test_broadcast():
    data = np.arange(12, dtype=np.float64).reshape(3, 4) * 1.5 if rank == 0 else np.zeros((3, 4))
    expect_equal(c.broadcast(comm, data), np.arange(12, dtype=np.float64).reshape(3, 4) * 1.5)
    root = size - 1
    fresh = c.broadcast_new(comm, np.arange(5, dtype=np.int32) if rank == root else None, root=root)
    expect_equal(fresh, np.arange(5, dtype=np.int32))


def test_scatter_and_gather_uneven():
    for total, dtype in ((10, np.float32), (997, np.float64), (size - 1, np.int64), (3 * size + 1, np.uint8)):
        full = (np.arange(total * 3) % 251).reshape(total, 3).astype(dtype)
        local = c.scatter_rows(comm, full if rank == 0 else None)
        counts, starts = c.split_evenly(total, size)
        expect_equal(local, full[starts[rank]:starts[rank] + counts[rank]])
        gathered = c.gather_rows(comm, local)
        if rank == 0:
            expect_equal(gathered, full)
        else:
            assert gathered is None
        expect_equal(c.allgather_rows(comm, local), full)


def test_gather_rank_dependent_sizes():
    local = np.full((rank, 2), rank, dtype=np.int64)  # rank 0 sends nothing
    expected = np.concatenate([np.full((r, 2), r, dtype=np.int64) for r in range(size)])
    expect_equal(c.allgather_rows(comm, local), expected)
    gathered = c.gather_rows(comm, local, root=size - 1)
    if rank == size - 1:
        expect_equal(gathered, expected)


def test_reductions():
    values = np.arange(7, dtype=np.float64) + rank
    total = sum(np.arange(7, dtype=np.float64) + r for r in range(size))
    expect_equal(c.allreduce_sum(comm, values.copy()), total)


def test_guard_refuses_non_contiguous_buffers():
    fortran = np.asfortranarray(np.arange(12.0).reshape(3, 4))
    for bad, word in ((fortran, "Fortran-ordered"), (np.arange(12.0).reshape(3, 4)[:, ::2], "strided view")):
        try:
            c.broadcast(comm, bad)
        except ValueError as error:
            assert word in str(error) and "np.ascontiguousarray" in str(error), str(error)
        else:
            raise AssertionError("a non-contiguous buffer was accepted")
    c.broadcast(comm, np.ascontiguousarray(fortran))  # the fix works (and keeps ranks in step)


def test_barrier_and_timing():
    comm.Barrier()
    times = timing.time_allreduce(comm, [8, 4096], repeats=3)
    assert times.shape == (2,) and np.all(times > 0)
    expect_equal(np.array(comm.allgather(float(times[0]))), np.full(size, times[0]))  # the same on every rank


def test_timing_one_point_to_point_message():
    if size < 2:
        try:
            timing.time_messages(comm, [8])
        except ValueError as error:
            assert "two ranks" in str(error), error
            return
        raise AssertionError("a message was timed on one rank")
    times = timing.time_messages(comm, [8, 65536], repeats=3, dtype=np.float32)
    assert times.shape == (2,) and np.all(times > 0), times
    expect_equal(np.array(comm.allgather(float(times[1]))), np.full(size, times[1]))  # the same on every rank


def test_what_runs_before_a_timed_call_is_not_timed():
    import time

    calls = []
    seconds = timing.time_collective(comm, comm.Barrier, repeats=4, before=lambda: (calls.append(1), time.sleep(0.05)))
    assert len(calls) == 4 and 0 < seconds < 0.05, (calls, seconds)  # 4 sleeps of 50 ms, none in the median
    values = np.arange(5, dtype=np.float32)
    timing.empty_caches(values, np.ones(1000, dtype=np.float32))
    expect_equal(values, np.arange(5, dtype=np.float32))  # written, unchanged
    cold = timing.time_allreduce(comm, [4096], repeats=3, dtype=np.float32, cold=True)
    assert cold.shape == (1,) and cold[0] > 0
    expect_equal(np.array(comm.allgather(float(cold[0]))), np.full(size, cold[0]))


if __name__ == "__main__":
    run_checks(globals())
