"""What each collective makes this rank send: counted on the real calls, as a ring would send it.

A ring collective on P ranks over a buffer of n values, where this rank owns chunk c_r of it
(``split_evenly``: the first n mod P chunks one value longer), sends from rank r:

    Allreduce        2 (n - c_r) values   (a reduce-scatter, then an allgather)
    Reduce_scatter   n - c_r              (every chunk but its own passes through once)
    Allgatherv       n - c_r              (the same, in the other direction)
    Allgather        (P - 1) b            (b: this rank's part; every other part passes through)

MPI's own collectives hide their algorithm: these are the ring's figures for the calls really made, not bytes
caught on the wire (a ring's Allgatherv sends every chunk but the next rank's: n - c_{r+1}, within a value).
"""

from __future__ import annotations

from collections import Counter

from mpi4py import MPI

from nnlib.lesson04_collectives.collectives import split_evenly

LESSON = 9


class CountingComm:
    """``comm`` with every Allreduce, Allgather, Allgatherv and Reduce_scatter recorded; the rest passes through.

    ``calls``: one (collective, bytes of this rank's message, bytes a ring makes this rank send) per call.
    The message is what this rank hands to MPI: the buffer summed (Allreduce, Reduce_scatter) or its own
    part (Allgather, Allgatherv). Use it as any communicator: ``train_parallel(CountingComm(comm), ...)``.
    """

    def __init__(self, comm):
        self.comm, self.calls = comm, []

    def __getattr__(self, name):  # only for names not found on self: the communicator's own
        if name == "comm":  # not set yet (a copy or an unpickling in progress): no endless recursion
            raise AttributeError(name)
        return getattr(self.comm, name)

    def Allreduce(self, sendbuf, recvbuf, op=MPI.SUM):
        message = recvbuf if sendbuf is MPI.IN_PLACE else sendbuf
        self.calls.append(("Allreduce", int(message.nbytes), 2 * ring_bytes(int(recvbuf.size), self.comm.size,
                                                                            self.comm.rank, recvbuf.itemsize)))
        return self.comm.Allreduce(sendbuf, recvbuf, op=op)

    def Allgather(self, sendbuf, recvbuf):
        self.calls.append(("Allgather", int(sendbuf.nbytes), (self.comm.size - 1) * int(sendbuf.nbytes)))
        return self.comm.Allgather(sendbuf, recvbuf)

    def Allgatherv(self, mine, received):
        whole, (counts, _) = received
        self.calls.append(("Allgatherv", int(mine.nbytes), self.others(whole, counts)))
        return self.comm.Allgatherv(mine, received)

    def Reduce_scatter(self, whole, mine, recvcounts=None, op=MPI.SUM):
        self.calls.append(("Reduce_scatter", int(whole.nbytes), self.others(whole, recvcounts)))
        return self.comm.Reduce_scatter(whole, mine, recvcounts=recvcounts, op=op)

    def others(self, whole, counts) -> int:
        """Bytes of ``whole`` that are not this rank's own c_r values (its count in ``counts``): (n - c_r) itemsize."""
        return int((whole.size - counts[self.comm.rank]) * whole.itemsize)

    def messages(self) -> Counter:
        """{(collective, bytes of the message): how many calls}."""
        return Counter((name, message) for name, message, _ in self.calls)

    def message_bytes(self) -> int:
        """All the bytes this rank handed to the counted collectives."""
        return sum(message for _, message, _ in self.calls)

    def ring_bytes(self, name: str | None = None) -> int:
        """The bytes a ring makes this rank send in the counted calls (of collective ``name`` only, if given)."""
        return sum(sent for called, _, sent in self.calls if name in (None, called))


def ring_bytes(values: int, size: int, rank: int, itemsize: int = 8) -> int:
    """Bytes rank ``rank`` sends in a ring allgather (or reduce-scatter) of ``values``: (n - c_r) itemsize."""
    counts, _ = split_evenly(values, size)
    return (values - counts[rank]) * itemsize
