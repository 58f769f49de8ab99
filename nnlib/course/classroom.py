"""The engines' ``comm`` in the notebook cluster: a student's own collectives never hang the class.

In a first MPI class one rank often raises before a collective, or two ranks both ``Send`` first, and the others would
wait for ever. So on every engine of :func:`nnlib.course.cluster.start`, ``comm = MPI.COMM_WORLD = ClassroomComm(the
real COMM_WORLD)``: its collectives, ``Send``/``Recv``/``Sendrecv`` and the object forms (``bcast``, ``gather``...)
run under the classroom deadline ($NNLIB_TIMEOUT: 20 s). A rank whose cell (or ``view.apply`` function) raised tells
the others at once, and they stop with its traceback; a rank that waits past the deadline names who did not come or,
in a deadlock, the call each rank waited in; Interrupt Kernel ends a wait. A rooted collective (Bcast, Reduce, Gather,
Scatter...) first checks that every rank names the same root: MPI does not, and a mismatch need not hang.

An abandoned collective cannot be cancelled, so after every cell the client has each engine :func:`settle`: the ranks
agree whether any of them abandoned a call (or heard of one), and if so all make a fresh duplicate of COMM_WORLD
together. A rank that does not come within :data:`SETTLE_SECONDS` is stuck or dead: every later call then says to run
``mpi.restart()``. ``Split`` keeps the deadline; other methods (``Isend``, ``Scan``...) have none.
"""

from __future__ import annotations

import signal
import sys
import threading
import time

import numpy as np
from mpi4py import MPI

from nnlib.course.deadline import WatchedComm, completed_within

LESSON = 0  # the course's own tools: any lesson may use them

#: Seconds a rank waits for the others in settle's agreement (the deadline, if that is longer), not the deadline:
#: the ranks come when their engines get the client's message, on a loaded machine seconds apart.
SETTLE_SECONDS = 60.0


class RootMismatch(ValueError):
    """The ranks named different roots for one rooted collective (raised on every rank)."""

    on_every_rank = True  # every rank raises it: no rank needs to tell the others


class ClassroomComm:
    """``world``'s ranks with a deadline on every call (see the module docstring); rank and size as usual.
    watched: the current :class:`WatchedComm` (a duplicate of ``world``), replaced by :meth:`settle` after a
    cell that abandoned a call; agreement: a duplicate of ``world`` for settle's own small collective."""

    def __init__(self, world, timeout=None):
        self.world = world
        self.rank, self.size = world.rank, world.size
        self.generation, self.unusable = 0, None
        self.agreement = world.Dup()
        self.watched = WatchedComm(world, timeout)

    def current(self) -> WatchedComm:
        """The watched duplicate to use now."""
        if self.unusable:
            raise RuntimeError(self.unusable)
        return self.watched

    def settle(self) -> str:
        """After a cell, on every engine (the client sends it): 'kept', 'renewed' (every rank made a fresh duplicate,
        together, as one abandoned a call or heard of one), or why the communicator is unusable now. It ignores
        SIGINT: a late Interrupt Kernel stopping one rank half-way would put it out of step with the others for good."""
        if self.unusable:
            return self.unusable
        in_main_thread = threading.current_thread() is threading.main_thread()
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN) if in_main_thread else None
        generation = self.generation
        try:
            self.unusable = self._agree_and_renew()
        except Exception as error:  # noqa: BLE001 - e.g. the fresh duplicate not made within the deadline
            self.unusable = f"rank {self.rank} could not settle after the last cell ({error}): run mpi.restart()"
        finally:
            if in_main_thread:
                signal.signal(signal.SIGINT, previous)
        return self.unusable or ("renewed" if self.generation > generation else "kept")

    def _agree_and_renew(self) -> str | None:
        """settle's agreement, one Iallgather of each rank's flag and arrival time: None if every rank came in time
        (all renewed if any asked), else why the communicator is unusable; all read the same times: one verdict."""
        came = time.time()
        mine = np.array([float(bool(self.watched.broken) or self.watched.heard_from_others()), came])
        everyone = np.empty((self.size, 2))
        request = self.agreement.Iallgather(mine, everyone)
        waited = max(SETTLE_SECONDS, self.watched.timeout)
        if not completed_within(request.Test, waited):
            return "a rank did not come back after the last cell (stuck in MPI outside comm, or dead): run mpi.restart()"
        first, last = int(np.argmin(everyone[:, 1])), int(np.argmax(everyone[:, 1]))
        spread = everyone[last, 1] - everyone[first, 1]
        if spread > waited - min(5.0, waited / 4):  # the first may have stopped waiting: the same verdict on all
            return (f"rank {last} came to settle {spread:.0f} s after rank {first}, too late to be sure that every "
                    f"rank still waited ({waited:g} s): run mpi.restart()")
        if everyone[:, 0].any():
            self.generation += 1
            self.watched = WatchedComm(self.world, self.watched.timeout, generation=self.generation)
        return None

    def __getattr__(self, name):
        """Every other attribute: the watched method if there is one, else the MPI communicator's own."""
        if name.startswith("__") or "watched" not in self.__dict__:
            raise AttributeError(name)
        watched = self.current()
        return getattr(watched, name) if hasattr(watched, name) else getattr(watched.comm, name)

    # -- the rooted collectives: MPI does not check that every rank names the same root -------------
    def same_root(self, root: int, what: str) -> WatchedComm:
        """The watched comm, once one small Allgather found that every rank names the same ``root`` (else raise)."""
        watched = self.current()
        roots = np.empty(self.size, dtype=np.int64)
        watched.wait(watched.comm.Iallgather(np.array([root], dtype=np.int64), roots), what)  # errors say `what`
        if len(set(roots.tolist())) > 1:
            said = ", ".join(f"rank {rank}: root={int(given)}" for rank, given in enumerate(roots))
            raise RootMismatch(f"{what} with different roots ({said}): every rank must name the same root.")
        return watched

    def Bcast(self, buffer, root=0):
        self.same_root(root, "Bcast").Bcast(buffer, root)

    def Reduce(self, sendbuf, recvbuf, op=MPI.SUM, root=0):
        self.same_root(root, "Reduce").Reduce(sendbuf, recvbuf, op, root)

    def Gather(self, sendbuf, recvbuf, root=0):
        self.same_root(root, "Gather").Gather(sendbuf, recvbuf, root)

    def Gatherv(self, sendbuf, recvbuf, root=0):
        self.same_root(root, "Gatherv").Gatherv(sendbuf, recvbuf, root)

    def Scatter(self, sendbuf, recvbuf, root=0):
        self.same_root(root, "Scatter").Scatter(sendbuf, recvbuf, root)

    def Scatterv(self, sendbuf, recvbuf, root=0):
        self.same_root(root, "Scatterv").Scatterv(sendbuf, recvbuf, root)

    def after_cell(self, result) -> None:
        """IPython's post_run_cell: if this rank's cell raised, tell the other ranks at once."""
        if result.error_in_exec is not None:
            self.raised(result.error_in_exec)

    def raised(self, error: BaseException) -> None:
        """This rank's code raised ``error``: tell the other ranks at once (unless every rank raises it)."""
        if not self.watched.broken and not getattr(error, "on_every_rank", False):
            self.watched.tell_others(error)

    def __repr__(self):
        return f"<ClassroomComm rank {self.rank} of {self.size}, deadline {self.watched.timeout:g} s>"


def settle() -> str:
    """On an engine: :meth:`ClassroomComm.settle` the installed ``MPI.COMM_WORLD`` (the client sends it)."""
    return MPI.COMM_WORLD.settle() if isinstance(MPI.COMM_WORLD, ClassroomComm) else "not installed"


def install(shell=None) -> ClassroomComm:
    """On an engine: make ``MPI.COMM_WORLD`` a :class:`ClassroomComm` (once) and return it; ``shell`` (default:
    the running IPython) calls its ``after_cell`` after every cell."""
    if isinstance(MPI.COMM_WORLD, ClassroomComm):
        return MPI.COMM_WORLD
    comm = MPI.COMM_WORLD = ClassroomComm(MPI.COMM_WORLD)
    if shell is None:
        from IPython import get_ipython

        shell = get_ipython()
    if shell is not None:
        shell.events.register("post_run_cell", comm.after_cell)
        kernel = getattr(shell, "kernel", None)
        if hasattr(kernel, "do_apply"):
            tell_others_after_apply(kernel, comm)
        if hasattr(kernel, "_abort_queues"):
            # After a cell that raised, ipykernel drops the execute requests that come before it has replied
            # (stop_on_error): on a loaded machine the next %%px cell can come that soon, and that rank never ran
            # it. The notebook's own kernel still stops Run All at an error; an engine runs every cell it is sent.
            kernel._abort_queues = lambda *arguments, **keywords: None
    return comm


def tell_others_after_apply(kernel, comm: ClassroomComm) -> None:
    """Wrap the engine kernel's ``do_apply`` (no post_run_cell follows a ``view.apply``) so that a function that
    raised tells the other ranks at once, as a cell does (IPython leaves the error in ``sys.last_value``)."""
    apply = kernel.do_apply

    def do_apply(*arguments):
        reply, result = apply(*arguments)
        if reply.get("status") == "error":
            error = getattr(sys, "last_value", None)
            comm.raised(error if error is not None else RuntimeError(f"{reply.get('ename')}: {reply.get('evalue')}"))
        return reply, result

    kernel.do_apply = do_apply
