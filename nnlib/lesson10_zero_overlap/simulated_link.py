"""A simulated link: Allreduces that take wall time on a wire, as a cluster's network does, not CPU time.

On one machine a rank's message moves only while a core copies it, so overlap has little to hide. On a cluster the
network card moves the bytes while the cores compute. :class:`SimulatedLink` is such a link, of latency alpha and
beta seconds per byte: every Allreduce really sums (through MPI, exactly), then completes no sooner than the link,
carrying one message at a time (:class:`Link`), allows::

    an Allreduce of n bytes, ready at t, on a link busy until f:   done at max(t, f) + T(n)
    T(n) = 2 (P - 1) alpha + 2 (P - 1) / P n beta                  (a ring, lesson 04's costmodel)

Waiting sleeps, so the cores stay free to compute. Every other call is the communicator's own.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from mpi4py import MPI

from nnlib.lesson04_collectives.costmodel import ring_allreduce_time

LESSON = 10


@dataclass
class Link:
    """A link that carries one message at a time: busy until ``free_at`` (seconds)."""

    free_at: float = 0.0

    def book(self, ready: float, seconds: float) -> float:
        """A message of ``seconds`` on the wire, ready at time ``ready``: when it is done (and the link free)."""
        self.free_at = max(ready, self.free_at) + seconds
        return self.free_at


def overlapped_finish(ready_times, transfer_seconds) -> float:
    """The model of overlap: when the last bucket is done, bucket b (``transfer_seconds[b]`` on the link) starting
    once its last layer's gradient is final (``ready_times[b]``) and the link is free."""
    link = Link()
    return max((link.book(ready, seconds) for ready, seconds in zip(ready_times, transfer_seconds)), default=0.0)


class SimulatedLink:
    """``comm`` whose Allreduce and Iallreduce take a ring's wall time on a :class:`Link` of latency ``alpha`` and
    ``beta`` seconds per byte."""

    def __init__(self, comm, alpha: float, beta: float):
        self.comm, self.alpha, self.beta, self.link = comm, alpha, beta, Link()

    def __getattr__(self, name):  # only for names not found on self: the communicator's own
        if name == "comm":  # not set yet (a copy in progress): no endless recursion
            raise AttributeError(name)
        return getattr(self.comm, name)

    def Allreduce(self, sendbuf, recvbuf, op=MPI.SUM):
        self.wait_all([self.Iallreduce(sendbuf, recvbuf, op)])

    def Iallreduce(self, sendbuf, recvbuf, op=MPI.SUM):
        seconds = float(ring_allreduce_time(recvbuf.nbytes, self.comm.size, self.alpha, self.beta))
        self.link.book(time.perf_counter(), seconds)  # on the wire from now, after what is booked
        return self.comm.Iallreduce(sendbuf, recvbuf, op=op)

    def wait_all(self, requests, what: str = "Iallreduce") -> None:
        """Complete ``requests`` (this link's Iallreduces), then wait until the link has carried them all."""
        MPI.Request.Waitall(requests)
        time.sleep(max(0.0, self.link.free_at - time.perf_counter()))
