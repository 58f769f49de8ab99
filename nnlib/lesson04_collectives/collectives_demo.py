"""The collectives of notebook 04 up to Gatherv as a plain MPI script: ``mpiexec -n 4 python -m nnlib collectives``.

Each demo runs on every rank and returns (before, after): what this rank held before and after the collective (None:
nothing). Rank 0 gathers them and prints one line per rank, in rank order. tests/test_collectives.py runs it."""

from __future__ import annotations

import numpy as np
from mpi4py import MPI

from nnlib.lesson04_collectives import collectives

LESSON = 4
NOTEBOOKS_ONLY = True  # lesson 04's collectives as a plain MPI script (python -m nnlib collectives)


def bcast(comm):
    values = np.array([1.0, 2.0, 3.0, 4.0]) if comm.rank == 0 else np.zeros(4)
    before = values.copy()
    comm.Bcast(values, root=0)
    return before, values


def scatter(comm):
    full = np.arange(2.0 * comm.size) * 10 if comm.rank == 0 else None
    piece = np.empty(2)
    comm.Scatter(full, piece, root=0)
    return full, piece


def gather(comm):
    piece = np.array([comm.rank * 10.0, comm.rank * 10.0 + 1])
    collected = np.empty(2 * comm.size) if comm.rank == 0 else None
    comm.Gather(piece, collected, root=0)
    return piece, collected


def allgather(comm):
    piece = np.array([comm.rank * 10.0, comm.rank * 10.0 + 1])
    everything = np.empty(2 * comm.size)
    comm.Allgather(piece, everything)
    return piece, everything


def reduce(comm):
    contribution = np.full(3, comm.rank + 1.0)
    total = np.empty(3) if comm.rank == 0 else None
    comm.Reduce(contribution, total, op=MPI.SUM, root=0)
    return contribution, total


def allreduce(comm):
    gradient = np.full(3, comm.rank + 1.0)
    before = gradient.copy()
    comm.Allreduce(MPI.IN_PLACE, gradient, op=MPI.SUM)
    return before, gradient


def barrier(comm):
    comm.Barrier()
    return None, np.array([float(comm.rank)])


def scatterv(comm):
    counts = np.array(collectives.split_evenly(10, comm.size)[0])
    full = np.arange(10.0) if comm.rank == 0 else None
    piece = np.empty(counts[comm.rank])
    comm.Scatterv([full, (counts, collectives.offsets(counts))], piece, root=0)
    return full, piece


def gatherv(comm):
    _, piece = scatterv(comm)
    return piece, collectives.gather_rows(comm, piece)


def contiguity_guard(comm):
    weights = np.asfortranarray(np.arange(6.0).reshape(2, 3)) if comm.rank == 0 else np.empty((2, 3))
    try:
        collectives.require_contiguous(weights, "weights")
        refused = 0.0
    except ValueError:
        refused = 1.0
    weights = np.ascontiguousarray(weights)
    collectives.broadcast(comm, weights, root=0)
    return np.array([refused]), weights.ravel()


DEMOS = [bcast, scatter, gather, allgather, reduce, allreduce, barrier, scatterv, gatherv, contiguity_guard]


def format_values(values) -> str:
    return "-" if values is None else " ".join(f"{v:g}" for v in np.ravel(values))


def main(comm=MPI.COMM_WORLD) -> None:
    for demo in DEMOS:
        results = comm.gather(demo(comm), root=0)  # lowercase: a small Python object per rank
        if comm.rank == 0:
            for rank, (before, after) in enumerate(results):
                print(f"{demo.__name__:16s} rank {rank}: {format_values(before)} -> {format_values(after)}")
