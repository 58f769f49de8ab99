"""Run under mpiexec with 1 to 7 ranks: the hand-built Allreduce algorithms equal MPI's own.

Integers must match exactly, floats within rounding, and every rank must hold bitwise the same
result; sizes the number of ranks does not divide are included. Bad buffers (different lengths or
dtypes on different ranks, strided, read-only, empty, fewer elements than ranks for the ring) must
raise the same ValueError on every rank, after which the communicator still works.
Exits 0 when every check passed on every rank; prints the failures and exits 1 otherwise.
"""

import numpy as np
from harness import expect_error_everywhere, run_checks
from mpi4py import MPI

from nnlib.lesson09_ring_allreduce.allreduce import (ALGORITHMS, allreduce, ring_allgather, ring_reduce_scatter,
                                                       ring_schedule)

comm = MPI.COMM_WORLD
rank, size = comm.rank, comm.size


def same_on_every_rank(array):
    everyone = comm.allgather(array)
    for other, theirs in enumerate(everyone):
        assert np.array_equal(theirs, array), f"rank {other} holds a different result"


def values(length, dtype, seed):
    rng = np.random.default_rng([seed, rank])
    if np.dtype(dtype).kind == "f":
        return rng.normal(size=length).astype(dtype)
    return rng.integers(-1000, 1000, size=length).astype(dtype)


def test_equal_to_mpi():
    lengths = sorted({size, size + 1, 2 * size + 3, 1000, 1001, 4099})
    for algorithm in ALGORITHMS:
        for dtype in ("int64", "int32", "float64", "float32"):
            for op in ("sum", "max"):
                for length in lengths:
                    mine = values(length, dtype, length)
                    expected = mine.copy()
                    comm.Allreduce(MPI.IN_PLACE, expected, op=MPI.SUM if op == "sum" else MPI.MAX)
                    got = allreduce(comm, mine.copy(), algorithm, op)
                    where = f"{algorithm}, {dtype}, {op}, {length} elements"
                    assert got.dtype == expected.dtype, where
                    if np.dtype(dtype).kind == "i" or op == "max":
                        assert np.array_equal(got, expected), where
                    else:
                        tolerance = 1e-12 if dtype == "float64" else 1e-5
                        np.testing.assert_allclose(got, expected, rtol=tolerance, atol=tolerance * size,
                                                   err_msg=where)
                    same_on_every_rank(got)


def test_small_buffers():
    """Recursive doubling and reduce-broadcast take any length >= 1, fewer elements than ranks too."""
    for algorithm in ("recursive_doubling", "reduce_broadcast"):
        got = allreduce(comm, np.array([rank + 1], dtype=np.int64), algorithm)
        assert got.tolist() == [size * (size + 1) // 2], (algorithm, got)


def test_ring_halves_equal_mpis_reduce_scatter_and_allgather():
    for length in sorted({size, 2 * size + 3, 1001}):
        mine = values(length, "int64", 7)
        counts = [length // size + (r < length % size) for r in range(size)]
        expected = np.empty(counts[rank], dtype=np.int64)
        comm.Reduce_scatter(mine, expected, counts, op=MPI.SUM)
        buffer = mine.copy()
        start, stop = ring_reduce_scatter(comm, buffer)
        assert stop - start == counts[rank] and start == sum(counts[:rank])
        assert np.array_equal(buffer[start:stop], expected), length
        pieces = np.zeros(length, dtype=np.int64)
        pieces[start:stop] = expected
        ring_allgather(comm, pieces)
        whole = mine.copy()
        comm.Allreduce(MPI.IN_PLACE, whole, op=MPI.SUM)
        assert np.array_equal(pieces, whole), length


def test_ring_schedule():
    steps = ring_schedule(size)
    assert len(steps) == 2 * (size - 1)
    for step in steps:
        receivers = sorted(receiver for _, receiver, _ in step["sends"])
        assert receivers == list(range(size))  # every rank receives exactly one chunk per step
        assert sorted(chunk for _, _, chunk in step["sends"]) == list(range(size))  # each chunk moves once
    # after reduce-scatter, rank r last received chunk r: the one it completes
    if size > 1:
        last = steps[size - 2]["sends"]
        assert {receiver: chunk for _, receiver, chunk in last} == {r: r for r in range(size)}


def bad_buffer_fails_everywhere(make_buffer, algorithm, words):
    """Every rank raises a ValueError containing ``words``, and nobody is left waiting."""
    expect_error_everywhere(lambda: allreduce(comm, make_buffer(), algorithm), words)


def test_bad_buffers():
    last = size - 1
    for algorithm in ("mpi", *ALGORITHMS):
        if size > 1:
            bad_buffer_fails_everywhere(lambda: np.ones(10 + (rank == last)), algorithm, "different lengths")
            bad_buffer_fails_everywhere(lambda: np.ones(10, dtype=np.float32 if rank == last else np.float64),
                                    algorithm, "different dtypes")
        bad_buffer_fails_everywhere(lambda: np.ones(20)[::2] if rank == last else np.ones(10), algorithm, "strided")

        def read_only():
            buffer = np.ones(10)
            buffer.flags.writeable = rank != last
            return buffer

        bad_buffer_fails_everywhere(read_only, algorithm, "read-only")
        bad_buffer_fails_everywhere(lambda: np.ones(0), algorithm, "empty")
        bad_buffer_fails_everywhere(lambda: [1.0, 2.0] if rank == last else np.ones(2), algorithm, "NumPy array")
    if size > 1:
        bad_buffer_fails_everywhere(lambda: np.ones(size - 1), "ring", "at least")
    bad_buffer_fails_everywhere(lambda: np.ones(size), "ring-of-fire", "algorithm must be")


if __name__ == "__main__":
    run_checks(globals())
