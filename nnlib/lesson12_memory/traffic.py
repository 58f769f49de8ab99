"""The bytes each rank sends per step, by lesson 08's ring formulas (nnlib.lesson08_inside_allreduce.counting: an
Allreduce sends 2 (n - c_r) values, an Allgatherv or a Reduce_scatter n - c_r), for CountingComm to check on the
real MPI calls: ZeRO-3's two allgathers and one reduce-scatter send 1.5 times data parallelism's one Allreduce.
"""

from __future__ import annotations

from nnlib.lesson08_inside_allreduce.counting import ring_bytes

LESSON = 12
NOTEBOOKS_ONLY = True  # notebook 12 (and tests/mpi/check_memory.py) use it; no nnlib module imports it


def allreduce_bytes(num_params: int, size: int, rank: int, itemsize: int = 8) -> int:
    """One step of data parallelism: one ring Allreduce of the gradient, 2 (n - c_r) itemsize."""
    return 2 * ring_bytes(num_params, size, rank, itemsize)


def fsdp_bytes(layer_sizes, size: int, rank: int, itemsize: int = 8) -> int:
    """One step of ZeRO-3 on a network whose layers each are sharded on their own: for every layer's
    n_l = n_in n_out + n_out parameters, two allgathers and one reduce-scatter, 3 (n_l - c_{l,r}) itemsize."""
    shapes = zip(layer_sizes[:-1], layer_sizes[1:])
    return 3 * sum(ring_bytes(n_in * n_out + n_out, size, rank, itemsize) for n_in, n_out in shapes)
