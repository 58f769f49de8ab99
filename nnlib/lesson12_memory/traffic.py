"""The bytes each rank sends, counted on the real MPI calls, against the formulas.

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

from mpi4py import MPI

from nnlib.lesson08_inside_allreduce.allreduce import chunk_bounds

LESSON = 12


class CountingComm:
    """``comm`` with every Allgatherv, Reduce_scatter and Allreduce counted: ``calls`` [(name, elements n,
    bytes this rank sends in a ring)] (IN_PLACE Allreduce only). Everything else passes straight through."""

    def __init__(self, comm):
        self.comm, self.calls = comm, []

    def __getattr__(self, name):  # only for names not found on self: the communicator's own
        if name == "comm":  # not set yet (a copy or an unpickling in progress): no endless recursion
            raise AttributeError(name)
        return getattr(self.comm, name)

    def record(self, name: str, whole, own_elements: int, times: int) -> None:
        self.calls.append((name, int(whole.size), times * (int(whole.size) - own_elements) * whole.itemsize))

    def Allgatherv(self, mine, received):
        whole, (counts, _) = received
        self.record("Allgatherv", whole, int(counts[self.comm.rank]), 1)
        return self.comm.Allgatherv(mine, received)

    def Reduce_scatter(self, whole, mine, recvcounts=None, op=MPI.SUM):
        self.record("Reduce_scatter", whole, int(recvcounts[self.comm.rank]), 1)
        return self.comm.Reduce_scatter(whole, mine, recvcounts=recvcounts, op=op)

    def Allreduce(self, sendbuf, recvbuf, op=MPI.SUM):
        counts, _ = chunk_bounds(int(recvbuf.size), self.comm.size)
        self.record("Allreduce", recvbuf, counts[self.comm.rank], 2)
        return self.comm.Allreduce(sendbuf, recvbuf, op=op)

    def sent_bytes(self, name: str | None = None) -> int:
        """Bytes this rank sent in the counted calls (of ``name`` only, if given)."""
        return sum(sent for called, _, sent in self.calls if name in (None, called))


def ring_bytes(elements: int, size: int, rank: int, itemsize: int = 8) -> int:
    """Bytes rank ``rank`` sends in a ring allgather (or reduce-scatter) of ``elements``: (n - c_r) itemsize."""
    counts, _ = chunk_bounds(elements, size)
    return (elements - counts[rank]) * itemsize


def allreduce_bytes(num_params: int, size: int, rank: int, itemsize: int = 8) -> int:
    """One step of data parallelism: one ring Allreduce of the gradient, 2 (n - c_r) itemsize."""
    return 2 * ring_bytes(num_params, size, rank, itemsize)


def fsdp_bytes(layer_sizes, size: int, rank: int, itemsize: int = 8) -> int:
    """One step of ZeRO-3 on a network whose layers each are sharded on their own: for every layer's
    n_l = n_in n_out + n_out parameters, two allgathers and one reduce-scatter, 3 (n_l - c_{l,r}) itemsize."""
    shapes = zip(layer_sizes[:-1], layer_sizes[1:])
    return 3 * sum(ring_bytes(n_in * n_out + n_out, size, rank, itemsize) for n_in, n_out in shapes)
