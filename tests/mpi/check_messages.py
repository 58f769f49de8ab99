"""Run under mpiexec with any number of ranks: lesson 05's one alpha-beta fit (nnlib.lesson05_messages.alpha_beta),
saved by rank 0 and read back the same on every rank, and the watched Recv from any source (nnlib.course.deadline).

Run by tests/test_mpi.py (through run_checkers.py) with 1, 2, 3 and 4 ranks.
"""

import shutil
import tempfile
from pathlib import Path

import numpy as np
from harness import run_checks
from mpi4py import MPI

from nnlib.course.deadline import watch
from nnlib.lesson01_mnist.files import write_csv
from nnlib.lesson05_messages import alpha_beta

comm = MPI.COMM_WORLD
rank, size = comm.rank, comm.size


def a_fresh_path():
    """A path in a new folder of rank 0's, the same on every rank; nothing there yet."""
    return Path(comm.bcast(tempfile.mkdtemp(prefix="alpha-beta-") if rank == 0 else None)) / "alpha-beta.csv"


def forget(path):
    comm.Barrier()
    if rank == 0:
        shutil.rmtree(path.parent)


def test_a_saved_fit_is_read_back_on_every_rank_and_not_measured_again():
    path = a_fresh_path()
    if rank == 0:
        write_csv([{"alpha": 1.5e-5, "beta": 2.5e-10, "ranks": 7}], path, alpha_beta.FIELDS)
    assert alpha_beta.saved_fit(comm, path) == (1.5e-5, 2.5e-10, 7)  # a measured fit would differ
    forget(path)


def test_the_fit_is_measured_saved_and_read_back_where_none_is_saved():
    path = a_fresh_path()
    if size < 2:  # a message needs two ranks
        try:
            alpha_beta.saved_fit(comm, path)
        except ValueError as error:
            assert "two ranks" in str(error), error
            return forget(path)
        raise AssertionError("a fit was measured on one rank")
    alpha, beta, ranks = alpha_beta.saved_fit(comm, path)  # none saved yet: measured now, as lesson 05 does
    assert ranks == size and alpha > 0 and beta > 0 and comm.allgather((alpha, beta)) == [(alpha, beta)] * size
    assert alpha_beta.saved_fit(comm, path) == (alpha, beta, size)  # read back exactly
    seconds, alpha, beta = alpha_beta.measure(comm, repeats=3, path=path)
    assert seconds.shape == alpha_beta.SIZES.shape and np.all(seconds > 0)
    assert alpha_beta.saved_fit(comm, path) == (alpha, beta, size)  # the new fit replaced the old
    forget(path)


def test_the_watched_recv_takes_any_source_and_says_who_sent():
    watched = watch(comm, timeout=30)
    if rank == 0:
        status, inbox, heard = MPI.Status(), np.empty(1), {}
        for _ in range(size - 1):
            watched.Recv(inbox, source=MPI.ANY_SOURCE, tag=5, status=status)
            heard[status.Get_source()] = (status.Get_tag(), inbox[0])
        assert heard == {sender: (5, 1.5 * sender) for sender in range(1, size)}, heard
    else:
        watched.Send(np.array([1.5 * rank]), dest=0, tag=5)
    watched.Barrier()


if __name__ == "__main__":
    run_checks(globals())
