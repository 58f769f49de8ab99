"""A deadline for every collective: no rank waits forever, and the error names who did not come.

Notebook 13 takes it apart: start the collective without blocking (``comm.Iallreduce``) and poll ``Test()`` until it
completes or the deadline passes. Then tell every other rank "waiting in Allreduce, at epoch e, step s" and listen for
their notices for a grace period: a rank that sent none did not arrive, and :class:`CollectiveTimeout` names it. A
rank that raises inside :meth:`WatchedComm.guard` sends its traceback. :func:`watch` works on a *duplicate* of the
communicator: an abandoned collective cannot be cancelled, so the duplicate is dropped and the original stays usable.
"""

from __future__ import annotations

import contextlib
import functools
import os
import pickle
import threading
import time
import traceback

import numpy as np
from mpi4py import MPI

LESSON = 0  # the course's own tools: any lesson may use them

#: Seconds a collective may wait when neither timeout= nor $NNLIB_TIMEOUT (set by the notebook cluster) is given.
DEFAULT_TIMEOUT = 120.0
LONGEST_TIMEOUT = 24 * 3600.0
NOTICE_TAG = 31_415  # point-to-point tag of the notices, on the run's own duplicate communicator
LOOK_EVERY = 0.005  # seconds between looks for other ranks' notices while waiting


class CollectiveTimeout(RuntimeError):
    """A collective did not complete before the deadline, or another rank failed while we waited.
    missing: the ranks that did not arrive; failed: {rank: its error text} of ranks that raised."""

    def __init__(self, message: str, missing=(), failed=None):
        super().__init__(message)
        self.missing, self.failed = list(missing), dict(failed or {})


def default_timeout() -> float:
    """$NNLIB_TIMEOUT if set (the notebook cluster sets it), else DEFAULT_TIMEOUT seconds."""
    text = os.environ.get("NNLIB_TIMEOUT")
    return check_timeout(float(text)) if text else DEFAULT_TIMEOUT


def check_timeout(timeout) -> float:
    """Return ``timeout`` as a float, or raise ValueError unless 0 < timeout <= one day."""
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout <= LONGEST_TIMEOUT:
        raise ValueError(f"timeout must be a number of seconds above 0 and at most {LONGEST_TIMEOUT:.0f} (a day); got "
                         f"{timeout!r}. It is how long a rank waits in a collective for the others before it stops "
                         f"with an error (a batch job's default: {DEFAULT_TIMEOUT:g} s; a notebook cluster's: "
                         "nnlib.course.cluster.CLASSROOM_TIMEOUT).")
    return float(timeout)


def at_where(where: dict) -> str:
    """' at epoch 2, step 17, communicate' from {'phase': 'communicate', 'epoch': 2, 'step': 17}; '' from {}."""
    parts = [f"{key} {where[key]}" for key in ("epoch", "step") if key in where]
    parts += [str(value) for key, value in where.items() if key not in ("epoch", "step")]
    return " at " + ", ".join(parts) if parts else ""


def _blocking(start, name: str):
    """WatchedComm's ``name``: MPI's non-blocking ``start`` (e.g. MPI.Comm.Iallreduce), completed within the deadline."""
    def collective(self, *arguments, **keywords):
        self.wait(start(self.comm, *arguments, **keywords), name)

    collective.__name__ = collective.__qualname__ = name
    collective.__doc__ = f"MPI's {name} (the same arguments), completed within the deadline."
    return collective


class WatchedComm:
    """A duplicate of ``comm`` whose collectives all run under a deadline (see the module docstring); the object
    forms (bcast, allgather, gather) go as pickled bytes through the buffer methods. where: what the run is doing,
    e.g. {'epoch': 1, 'step': 3, 'phase': 'communicate'}, kept current by :meth:`at`, quoted by every error."""

    def __init__(self, comm, timeout=None, generation: int = 0):
        self.timeout = default_timeout() if timeout is None else check_timeout(timeout)
        self.grace = min(2.0, max(0.5, self.timeout / 4))
        self.generation = generation  # notices of another generation are old news
        self.rank, self.size = comm.rank, comm.size
        self.where: dict = {}
        self.broken = None  # why it may not be used any more
        self._heard: dict = {}  # rank -> notice received from it
        self._sent: list = []  # notices' send requests (kept alive until complete)
        self.comm = comm  # while the duplicate is made, notices travel on ``comm``
        duplicate, request = comm.Idup()
        self.wait(request, "Idup (making the run's own communicator)")
        self.comm = duplicate

    def at(self, **where) -> None:
        """Record where the run is (epoch=, step=, phase=...), quoted by any error."""
        self.where.update(where)

    def wait(self, request, what: str) -> None:
        """Complete ``request`` (anything with a ``Test()``) within the deadline, or raise CollectiveTimeout."""
        if self.broken:
            raise RuntimeError(f"this communicator cannot be used any more: {self.broken}")
        began = time.monotonic()
        deadline, next_look = began + self.timeout, began + LOOK_EVERY
        try:
            while not request.Test():
                now = time.monotonic()
                if now >= next_look:
                    next_look = now + LOOK_EVERY
                    if self.heard_from_others():  # another rank failed or gave up (a deadlock if we waited long too)
                        self._give_up(what, at_deadline=now - began >= self.timeout / 2)
                    if now >= deadline:
                        self._give_up(what, at_deadline=True)
                if now - began > 0.05:  # a long wait: sleep between looks, leaving the core to others
                    time.sleep(0.001)
                else:  # let another rank on this core run (more ranks than cores), without a sleep's delay
                    os.sched_yield()
        except KeyboardInterrupt:  # Interrupt Kernel: abandoned, as at the deadline (a collective cannot be cancelled)
            self.broken = f"{what} was interrupted"
            raise

    def heard_from_others(self) -> bool:
        """Receive the notices that came, without waiting: whether another rank failed, gave up or was interrupted."""
        status = MPI.Status()
        while self.comm.iprobe(source=MPI.ANY_SOURCE, tag=NOTICE_TAG, status=status):
            notice = self.comm.recv(source=status.Get_source(), tag=NOTICE_TAG)
            if notice["generation"] == self.generation:
                self._heard[notice["rank"]] = notice
        return bool(self._heard)

    def _send_notice(self, **notice) -> None:
        notice.update(rank=self.rank, where=dict(self.where), generation=self.generation)
        for other in range(self.size):
            if other != self.rank:
                self._sent.append(self.comm.isend(notice, dest=other, tag=NOTICE_TAG))
        sent = self._sent
        flushed = completed_within(lambda: MPI.Request.Testall(sent), 0.2)  # small messages go out at once
        if not flushed and MPI.Query_thread() == MPI.THREAD_MULTIPLE:
            # a receiver idle in a notebook may need this rank's progress later, when this rank is idle too
            self._sent = []
            delivered = (lambda: MPI.Request.Testall(sent), 10 * self.timeout, 0.01)
            threading.Thread(target=completed_within, args=delivered, daemon=True).start()

    def _give_up(self, what: str, at_deadline: bool = False) -> None:
        """Tell the others we are waiting, listen for their notices for ``grace`` seconds, then raise.
        ``at_deadline``: this rank waited the whole timeout (else another rank's notice ended the wait)."""
        here = at_where(self.where)
        self._send_notice(kind="waiting", what=what)
        completed_within(lambda: self.heard_from_others() and len(self._heard) == self.size - 1, self.grace)
        failed = {rank: notice for rank, notice in self._heard.items() if notice["kind"] == "failed"}
        waiting = {rank: notice["what"] for rank, notice in sorted(self._heard.items()) if notice["kind"] == "waiting"}
        missing = [rank for rank in range(self.size) if rank != self.rank and rank not in self._heard]
        peer = point_to_point_peer(what)  # a Send or Recv waits for one rank only: name it, if it is silent
        missing = [peer] if peer is not None and peer not in self._heard else missing
        deadlock = at_deadline and not failed and self._in_a_cycle(peer, missing, waiting)
        self.broken = f"a collective was abandoned in {what}{here}"
        lines = [f"rank {rank} failed{at_where(notice['where'])}:\n{notice['text'].rstrip()}\n"
                 for rank, notice in sorted(failed.items())]
        if deadlock:
            others = "every other rank" if peer is None else f"rank {peer}"
            lines.append(f"no rank could go on: rank {self.rank} waited {self.timeout:g} s in {what}{here}, and "
                         f"{others} was waiting too (a deadlock: each waits for a call that another does not make).")
            lines += [f"rank {rank} was waiting in {other}." for rank, other in waiting.items()
                      if other != what and peer in (None, rank)]
            lines.append("Make the calls match: one rank sends while the other receives (or both use Sendrecv), "
                         "and every rank makes the same collectives in the same order, with the same root.")
        else:
            if missing:
                lines.append(f"rank{'s' if len(missing) > 1 else ''} {', '.join(map(str, missing))} did not arrive in "
                             f"{what} within {self.timeout:g} s (rank {self.rank} waited there{here}).")
            elif not failed:
                lines.append(f"rank {self.rank} came to {what}{here}, but rank{'s' if len(waiting) > 1 else ''} "
                             f"{', '.join(map(str, waiting))} had stopped waiting for it after {self.timeout:g} s.")
            lines.append((f"Rank {self.rank} stopped waiting in {what}{here}. Fix the error above and run again: every "
                          "rank is still alive (this communicator is dropped, and a fresh one made).") if failed else
                         ("A rank that did not arrive has died (in a notebook: mpi.restart(); a batch job ends by "
                          "itself), hangs, or is much slower than the others (then a longer timeout: timeout=, "
                          "--timeout, or $NNLIB_TIMEOUT before the cluster starts)."))
        if self.where:  # a training run
            lines.append("The network's parameters are undefined now: build a new network or resume from a checkpoint.")
        raise CollectiveTimeout("\n".join(lines), missing=missing,
                                failed={rank: notice["text"] for rank, notice in failed.items()})

    def _in_a_cycle(self, peer, missing, waiting) -> bool:
        """Whether the waits heard ({rank: the call it waits in}) form a cycle through this rank: every rank
        waiting (a collective: ``peer`` None), or point-to-point calls each waiting for the next (0 -> 1 -> 0)."""
        if peer is None:
            return not missing
        seen = {self.rank}
        while peer in waiting and peer not in seen:
            seen.add(peer)
            peer = point_to_point_peer(waiting[peer])
        return peer == self.rank

    @contextlib.contextmanager
    def guard(self):
        """A context manager: if this rank's code raises, tell the other ranks before re-raising (not for a
        CollectiveTimeout, nor for an error that every rank raises, ``on_every_rank``)."""
        try:
            yield self
        except BaseException as error:
            if not isinstance(error, CollectiveTimeout) and not getattr(error, "on_every_rank", False):
                self.tell_others(error)
            raise

    def tell_others(self, error: BaseException) -> None:
        """Send a 'failed' notice with this rank's traceback to every other rank (they stop at once)."""
        if self.broken or self.size == 1:
            return
        text = "".join(traceback.format_exception(type(error), error, error.__traceback__))
        self._send_notice(kind="failed", text=text)
        self.broken = f"rank {self.rank} failed{at_where(self.where)}"

    # -- buffer collectives -------------------------------------------------------------------
    def Split(self, color: int = 0, key: int = 0) -> WatchedComm:
        """MPI's Split on this run's communicator: the ranks of one color, watched with the same deadline."""
        return WatchedComm(self.comm.Split(color, key), self.timeout)

    def Bcast(self, buffer, root=0):
        self.wait(self.comm.Ibcast(buffer, root=root), "Bcast" if root == 0 else f"Bcast from rank {root}")

    # Barrier, Allreduce, Gather and the others: MPI's non-blocking form of each, within the deadline
    Barrier = _blocking(MPI.Comm.Ibarrier, "Barrier")
    Allreduce = _blocking(MPI.Comm.Iallreduce, "Allreduce")
    Reduce = _blocking(MPI.Comm.Ireduce, "Reduce")
    Gather = _blocking(MPI.Comm.Igather, "Gather")
    Gatherv = _blocking(MPI.Comm.Igatherv, "Gatherv")
    Scatter = _blocking(MPI.Comm.Iscatter, "Scatter")
    Scatterv = _blocking(MPI.Comm.Iscatterv, "Scatterv")
    Allgather = _blocking(MPI.Comm.Iallgather, "Allgather")
    Allgatherv = _blocking(MPI.Comm.Iallgatherv, "Allgatherv")
    Reduce_scatter = _blocking(MPI.Comm.Ireduce_scatter, "Reduce_scatter")
    Reduce_scatter_block = _blocking(MPI.Comm.Ireduce_scatter_block, "Reduce_scatter_block")
    Alltoall = _blocking(MPI.Comm.Ialltoall, "Alltoall")

    # -- point-to-point, for collectives built by hand (lesson 09's ring) and pipeline stages (lesson 12) ------
    def Sendrecv(self, sendbuf, dest, sendtag=0, recvbuf=None, source=MPI.ANY_SOURCE, recvtag=0):
        """Send to ``dest`` and receive from ``source`` at once, within the deadline. The receive matches tag 0
        by default, never ANY_TAG: the notices travel on this communicator too (NOTICE_TAG)."""
        receiving = self.comm.Irecv(recvbuf, source=source, tag=recvtag)
        sending = self.comm.Isend(sendbuf, dest=dest, tag=sendtag)
        self.wait_all([receiving, sending], "Sendrecv")

    def Recv(self, buffer, source=MPI.ANY_SOURCE, tag=0, status=None):
        """Receive into ``buffer`` from ``source`` within the deadline; ``status``, if given, says who sent it."""
        request = self.comm.Irecv(buffer, source=source, tag=tag)
        what = "Recv" if source == MPI.ANY_SOURCE else f"Recv from rank {source}"
        self.wait(_Until(lambda: request.Test(status) or None), what)  # _Until: done once Test is true

    def send(self, obj, dest, tag=0):
        """MPI's send of a Python object (pickled) within the deadline."""
        self.wait(self.comm.isend(obj, dest=dest, tag=tag), f"Send to rank {dest}")

    def recv(self, buf=None, source=MPI.ANY_SOURCE, tag=0):
        """MPI's recv of a Python object (tag 0 unless given, as Sendrecv's) within the deadline."""
        probe = _Until(lambda: self.comm.improbe(source=source, tag=tag))  # a message has come: its MPI.Message
        self.wait(probe, "Recv" if source == MPI.ANY_SOURCE else f"Recv from rank {source}")
        return probe.found.recv(buf)

    def Send(self, buffer, dest, tag=0):
        """MPI's Send within the deadline: a small message may leave at once, a large one waits for its Recv."""
        self.wait(self.comm.Isend(buffer, dest=dest, tag=tag), f"Send to rank {dest}")

    def Isend(self, buffer, dest, tag=0):
        """Start sending ``buffer`` to ``dest``; complete it with :meth:`wait_all`."""
        return self.comm.Isend(buffer, dest=dest, tag=tag)

    # -- started now, completed later (to overlap communication with computation) --------------
    def Iallreduce(self, sendbuf, recvbuf, op=MPI.SUM):
        """Start an Allreduce and return its request; complete it with :meth:`wait_all`."""
        return self.comm.Iallreduce(sendbuf, recvbuf, op=op)

    def wait_any(self, requests, what: str) -> int:
        """The index of one completed request of ``requests`` (as MPI's Waitany), within the deadline."""
        def completed():  # the index of a completed request, or None
            index, done = MPI.Request.Testany(requests)
            return index if done and index != MPI.UNDEFINED else None

        any_of = _Until(completed)
        self.wait(any_of, what)
        return any_of.found

    def wait_all(self, requests, what: str = "Iallreduce") -> None:
        """Complete started collectives, each within the deadline (or raise CollectiveTimeout)."""
        for request in requests:
            self.wait(request, what)

    # -- small Python objects, as pickled bytes through the buffer methods ----------------------
    def bcast(self, obj=None, root=0):
        data = _pickled(obj) if self.rank == root else None
        length = np.array([0 if data is None else data.size], dtype=np.int64)
        self.Bcast(length, root)
        if data is None:
            data = np.empty(int(length[0]), dtype=np.uint8)
        self.Bcast(data, root)
        return pickle.loads(data.tobytes())

    def allgather(self, obj):
        data = _pickled(obj)
        lengths = np.empty(self.size, dtype=np.int64)
        self.Allgather(np.array([data.size], dtype=np.int64), lengths)
        everything = np.empty(int(lengths.sum()), dtype=np.uint8)
        self.Allgatherv(data, [everything, (lengths, _starts(lengths))])
        return [pickle.loads(everything[start:start + length].tobytes())
                for start, length in zip(_starts(lengths), lengths)]

    def allreduce(self, obj, op=MPI.SUM):
        """MPI's allreduce of Python objects: every rank's ``obj``, combined in rank order by ``op``."""
        return functools.reduce(op, self.allgather(obj))

    def gather(self, obj, root=0):
        data = _pickled(obj)
        lengths = np.empty(self.size, dtype=np.int64) if self.rank == root else None
        self.Gather(np.array([data.size], dtype=np.int64), lengths, root)
        if self.rank != root:
            self.Gatherv(data, None, root)
            return None
        everything = np.empty(int(lengths.sum()), dtype=np.uint8)
        self.Gatherv(data, [everything, (lengths, _starts(lengths))], root)
        return [pickle.loads(everything[start:start + length].tobytes())
                for start, length in zip(_starts(lengths), lengths)]

    def __repr__(self):
        return f"<WatchedComm rank {self.rank} of {self.size}, timeout {self.timeout:g} s>"


class _Until:
    """Something with a ``Test()`` for :meth:`WatchedComm.wait`: true once ``look()`` finds something (``found``)."""

    def __init__(self, look):
        self.look, self.found = look, None

    def Test(self) -> bool:
        self.found = self.look()
        return self.found is not None


def watch(comm, timeout=None) -> WatchedComm:
    """A :class:`WatchedComm` over a fresh duplicate of ``comm`` (itself made under the deadline); from a WatchedComm,
    a duplicate of its communicator, with its timeout unless another is given."""
    if hasattr(type(comm), "current"):  # the notebook cluster's comm (nnlib.course.classroom)
        comm = comm.current()
    if isinstance(comm, WatchedComm):
        return WatchedComm(comm.comm, comm.timeout if timeout is None else timeout)
    if not isinstance(comm, MPI.Comm):
        raise TypeError(f"watch() takes an MPI communicator or a WatchedComm, not a {type(comm).__name__}: wrap the "
                        "watched one instead, e.g. HostStaging(watch(comm), xp) (train_watched's wrap= does that)")
    return WatchedComm(comm, timeout)


def point_to_point_peer(what: str) -> int | None:
    """The rank a point-to-point call waits for ('Send to rank 3' -> 3), or None for a collective."""
    words = what.split()
    return int(words[3]) if len(words) == 4 and words[:3] in (["Send", "to", "rank"], ["Recv", "from", "rank"]) \
        else None


def completed_within(test, seconds: float, pause: float = 0.001) -> bool:
    """Whether ``test()`` (e.g. requests' Test: MPI progress) came true within ``seconds``, tried every ``pause``."""
    give_up = time.monotonic() + seconds
    while not test():
        if time.monotonic() > give_up:
            return False
        time.sleep(pause)
    return True


def _pickled(obj) -> np.ndarray:
    return np.frombuffer(bytearray(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)), dtype=np.uint8)


def _starts(lengths) -> np.ndarray:
    return np.concatenate(([0], np.cumsum(lengths)[:-1])).astype(np.int64)
