"""Lesson 05 in one process: the saved alpha-beta fit read back (nnlib.lesson05_messages.alpha_beta), and the watched
Recv from any source with a Status (nnlib.course.deadline). Several ranks: tests/mpi/check_messages.py."""

from types import SimpleNamespace

import numpy as np
import pytest
from mpi4py import MPI

from nnlib.course.deadline import watch
from nnlib.lesson01_mnist.files import write_csv
from nnlib.lesson05_messages import alpha_beta

ONE_RANK = SimpleNamespace(rank=0, size=1, bcast=lambda value: value)


def test_the_saved_fit_is_read_back_and_none_saved_means_measuring(tmp_path):
    path = tmp_path / "build" / "alpha-beta.csv"
    with pytest.raises(ValueError, match="a message needs two ranks"):  # nothing saved: it measures, on one rank
        alpha_beta.saved_fit(ONE_RANK, path)
    write_csv([{"alpha": 4e-5, "beta": 3e-10, "ranks": 4}], path, alpha_beta.FIELDS)
    assert alpha_beta.saved_fit(ONE_RANK, path) == (4e-5, 3e-10, 4)
    assert alpha_beta.SIZES.tolist() == [8, 32, 128, 512, 2048, 8192, 32768, 131072, 524288, 2097152]


def test_the_watched_recv_takes_any_source_and_fills_the_status():
    watched = watch(MPI.COMM_WORLD, timeout=10)
    sent = watched.Isend(np.array([2.5]), dest=0, tag=9)  # one rank: a message to itself
    status, inbox = MPI.Status(), np.empty(1)
    watched.Recv(inbox, source=MPI.ANY_SOURCE, tag=9, status=status)
    sent.Wait()
    assert (status.Get_source(), status.Get_tag(), inbox[0]) == (0, 9, 2.5)
