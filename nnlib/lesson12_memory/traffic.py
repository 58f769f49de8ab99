"""The bytes each rank sends, by formula, for lesson 08's CountingComm to check on the real MPI calls.

A ring collective on P ranks over a buffer of n elements, where this rank owns chunk c_r of it
(``chunk_bounds``: the first n mod P chunks one element longer), sends per rank:

    Allgatherv       n - c_r        (every chunk but its own passes through it once)
    Reduce_scatter   n - c_r        (the same, in the other direction)
    Allreduce        2 (n - c_r)    (a reduce-scatter followed by an allgather)

So data parallelism's one Allreduce of the gradient sends 2 (n - c_r) per step, and ZeRO-3's
two allgathers of the parameters (forward and backward) and one reduce-scatter of the gradient
send 3 times (n - c_r): 1.5 times as much, to hold 1/P of everything.
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
