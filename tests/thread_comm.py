"""Threads as MPI ranks, for tests that run a lesson's collective code in one process.

``ThreadRanks(P)`` stands for P ranks: ``comm(rank)`` is rank ``rank``'s communicator, with the calls the lessons'
code makes (``Sendrecv`` through one queue per (sender, receiver); ``Allgatherv`` and ``Reduce_scatter`` through a
barrier where every rank posts its buffer, then reads everyone's), and ``run(work)`` calls ``work(rank)`` on P
threads at once. A rank's error is raised in the test's thread, after the barrier is broken so that the other ranks
stop waiting for it; a receive that never comes fails after ``timeout`` seconds.
"""

import queue
import threading

import numpy as np
from mpi4py import MPI

REDUCTIONS = [(MPI.SUM, np.add), (MPI.MAX, np.maximum), (MPI.MIN, np.minimum), (MPI.PROD, np.multiply)]


class ThreadRanks:
    def __init__(self, ranks: int, timeout: float = 60):  # 60 s: a loaded CI machine
        self.size, self.timeout = ranks, timeout
        self.meeting, self.posted = threading.Barrier(ranks, timeout=timeout), [None] * ranks
        self.mailboxes = {(sender, receiver): queue.Queue() for sender in range(ranks) for receiver in range(ranks)}

    def comm(self, rank: int) -> "ThreadComm":
        return ThreadComm(self, rank)

    def run(self, work) -> None:
        """work(rank) on one thread per rank; any rank's error is raised here once every thread has ended."""
        failures = []

        def run(rank):
            try:
                work(rank)
            except Exception as error:  # noqa: BLE001 (raised below, in the test's thread)
                failures.append(error)
                self.meeting.abort()  # the other ranks stop waiting at the barrier

        threads = [threading.Thread(target=run, args=(rank,)) for rank in range(self.size)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert not failures, failures


class ThreadComm:
    """Rank ``rank`` of a :class:`ThreadRanks`: the mpi4py calls (buffer forms) the lessons' code makes."""

    def __init__(self, ranks: ThreadRanks, rank: int):
        self.ranks, self.rank, self.size = ranks, rank, ranks.size

    def everyones(self, buffer):
        """Every rank's copy of its ``buffer``, in rank order (a collective: every rank calls it)."""
        self.ranks.posted[self.rank] = buffer.copy()
        self.ranks.meeting.wait()
        values = list(self.ranks.posted)
        self.ranks.meeting.wait()  # nobody posts again before everyone has read
        return values

    def Allgatherv(self, sendbuf, recvbuf):
        whole, (counts, starts) = recvbuf
        for piece, count, start in zip(self.everyones(sendbuf), counts, starts):
            whole[start:start + count] = piece

    def Reduce_scatter(self, sendbuf, recvbuf, recvcounts, op=MPI.SUM):
        """Every rank's ``sendbuf`` reduced with ``op`` (as MPI would: a MAX where a SUM belongs shows), then this
        rank's part."""
        reduce = next(function for mpi_op, function in REDUCTIONS if mpi_op == op)
        start = sum(recvcounts[:self.rank])
        recvbuf[...] = reduce.reduce(self.everyones(sendbuf))[start:start + recvcounts[self.rank]]

    def Sendrecv(self, sendbuf, dest, recvbuf, source):
        self.ranks.mailboxes[self.rank, dest].put(sendbuf.copy())
        recvbuf[...] = self.ranks.mailboxes[source, self.rank].get(timeout=self.ranks.timeout)
