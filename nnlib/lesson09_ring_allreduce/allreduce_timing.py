"""Lesson 09's lab: the hand-built Allreduces timed against MPI's own, from 8 bytes to 16 MB.

``mpiexec -n P python -m nnlib allreduce-timing --csv FILE`` writes the rows the notebook draws
(nnlib.lesson09_ring_allreduce.diagrams) and benchmarks/allreduce.py reads.
"""

from __future__ import annotations

import numpy as np
from mpi4py import MPI

from nnlib.lesson04_collectives.timing import time_collective
from nnlib.lesson09_ring_allreduce.allreduce import ALGORITHMS, allreduce

LESSON = 9

TIMING_FIELDS = ["bytes", "algorithm", "ranks", "seconds", "bus_bandwidth"]  # allreduce-timing's CSV columns


def bus_bandwidth(n_bytes, seconds, ranks):
    """nccl-tests' "bus bandwidth" of an Allreduce, in bytes per second.

    algorithm bandwidth = n / t (the buffer's size over the time); a ring moves 2 (P - 1) / P
    of the buffer through every rank's link, so bus bandwidth = n / t * 2 (P - 1) / P: the
    speed each link really ran at, comparable across P (and with the link's own peak).
    """
    ranks = np.asarray(ranks, dtype=np.float64)
    return np.asarray(n_bytes, dtype=np.float64) / np.asarray(seconds, dtype=np.float64) * 2 * (ranks - 1) / ranks


def time_algorithms(comm, sizes_in_bytes, algorithms=("mpi", *ALGORITHMS), repeats: int = 10,
                    dtype=np.float32) -> dict:
    """Median seconds of one in-place Allreduce per (algorithm, size), the same on every rank.

    Returns {algorithm: array (len(sizes),)}; NaN where the algorithm cannot take the size (the
    ring needs one element per rank). Each buffer is checked once, then timed with check=False,
    so the times are the algorithms' own. Large sizes get fewer repeats (at least 3).
    """
    itemsize = np.dtype(dtype).itemsize
    times = {algorithm: np.full(len(sizes_in_bytes), np.nan) for algorithm in algorithms}
    for index, size in enumerate(sizes_in_bytes):
        buffer = np.ones(max(1, int(size) // itemsize), dtype=dtype)
        count = max(3, min(repeats, int(repeats * 2**20 / max(size, 1))))
        for algorithm in algorithms:
            if algorithm == "ring" and buffer.size < comm.size:
                continue
            allreduce(comm, buffer, algorithm)  # checked once (and a warm-up)
            times[algorithm][index] = time_collective(
                comm, lambda: allreduce(comm, buffer, algorithm, check=False), repeats=count)
    return times


def main(argv=None) -> int:
    """``mpiexec -n P python -m nnlib allreduce-timing [--csv FILE]``: time every algorithm, 8 B to 16 MB."""
    import argparse

    from nnlib.lesson01_mnist.files import write_csv

    parser = argparse.ArgumentParser(prog="python -m nnlib allreduce-timing",
                                     description="Time MPI's Allreduce against the hand-built ones (run under mpiexec).")
    parser.add_argument("--smallest", type=int, default=8, help="smallest message in bytes (default 8)")
    parser.add_argument("--largest", type=int, default=16 * 2**20, help="largest message in bytes (default 16 MiB)")
    parser.add_argument("--repeats", type=int, default=10, help="timed calls per size (fewer for large sizes)")
    parser.add_argument("--csv", default=None, help="write size,algorithm,ranks,seconds,bus_bandwidth rows here")
    args = parser.parse_args(argv)
    if not 4 <= args.smallest <= args.largest:
        parser.error("need 4 <= --smallest <= --largest (bytes of float32)")
    comm = MPI.COMM_WORLD
    sizes = [int(args.smallest * 2**k) for k in range(64) if args.smallest * 2**k <= args.largest]
    times = time_algorithms(comm, sizes, repeats=args.repeats)
    if comm.rank == 0:
        rows = []
        print(f"{comm.size} ranks; median seconds of one in-place Allreduce of float32")
        print(f"{'bytes':>10s}" + "".join(f"{name:>20s}" for name in times))
        for index, size in enumerate(sizes):
            print(f"{size:10d}" + "".join(f"{seconds[index]:20.3e}" for seconds in times.values()))
            for name, seconds in times.items():
                if np.isfinite(seconds[index]):
                    rows.append({"bytes": size, "algorithm": name, "ranks": comm.size, "seconds": seconds[index],
                                 "bus_bandwidth": float(bus_bandwidth(size, seconds[index], comm.size))})
        if args.csv:
            write_csv(rows, args.csv, TIMING_FIELDS)
            print(f"wrote {args.csv}")
    return 0
