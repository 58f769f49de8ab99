"""The series' one alpha-beta fit: :func:`measure` times one message of each of SIZES (timing.time_messages), fits
T(n) = alpha + beta n (costmodel.fit_latency_bandwidth) and saves the fit in FIT_FILE; :func:`saved_fit` reads it
back in the later lessons, or measures it as lesson 05 does where lesson 05 has not run yet."""

from pathlib import Path

import numpy as np

from nnlib.lesson01_mnist.files import read_csv, write_csv
from nnlib.lesson04_collectives.costmodel import fit_latency_bandwidth
from nnlib.lesson04_collectives.timing import time_messages

LESSON = 5
NOTEBOOKS_ONLY = True  # the notebooks' fit: lesson 05 saves it, later lessons read it; no nnlib module imports it
SIZES = 2 ** np.arange(3, 23, 2)  # 8 bytes to 2 MB
FIT_FILE = Path("build") / "alpha-beta.csv"  # beside the notebooks: they and their engines run in notebooks/
FIELDS = ("alpha", "beta", "ranks")


def measure(comm, repeats: int = 20, path=FIT_FILE):
    """On every rank: the median seconds of one message of each of SIZES, and the fitted alpha (s) and beta (s per
    byte), the same on every rank; rank 0 saves alpha, beta and the number of ranks in ``path``."""
    seconds = time_messages(comm, SIZES, repeats)
    alpha, beta = fit_latency_bandwidth(SIZES, seconds)
    if comm.rank == 0:
        write_csv([dict(zip(FIELDS, (alpha, beta, comm.size)))], path, FIELDS)
    return seconds, alpha, beta


def saved_fit(comm, path=FIT_FILE):
    """On every rank: (alpha, beta, the number of ranks they were measured on) as saved in ``path``; if nothing is
    saved there, measured now as lesson 05 does (and saved)."""
    read = comm.rank == 0 and Path(path).exists()
    found = comm.bcast(read_csv(path, FIELDS, integers=("ranks",), floats=("alpha", "beta"))[0] if read else None)
    if found is None:
        return (*measure(comm, path=path)[1:], comm.size)
    return found["alpha"], found["beta"], found["ranks"]
