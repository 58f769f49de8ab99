"""``mpiexec -n P python -m nnlib.lesson13_pipeline_schedules.bubbles_job OUT.json``: notebook 13's measurements.

Every schedule (1F1B, interleaved with v = 2, ZB-H1, ZB-H2) runs steps of a network of 8 equal
layers (n x n, so that the P stages and the 2P virtual stages are equally heavy) with m = 8
micro-batches; rank 0 writes :func:`nnlib.lesson13_pipeline_schedules.schedules.measure_schedules`'
results to OUT.json (the timelines as lists), with the number of ranks and the cores it saw.
"""

from __future__ import annotations

import json
import os
import sys

from mpi4py import MPI
from threadpoolctl import threadpool_limits

from nnlib.lesson13_pipeline_schedules.schedules import measure_schedules

LESSON = 13
NOTEBOOKS_ONLY = True

WIDTH, LAYERS, BATCH, MICRO_BATCHES, REPEATS = 512, 8, 1024, 8, 5
SCHEDULE_NAMES = ("1f1b", "interleaved", "zb-h1", "zb-h2")


def main(argv) -> None:
    """Measure every schedule on MPI.COMM_WORLD; rank 0 writes argv[0]."""
    threadpool_limits(1)  # one BLAS thread per rank: the ranks share the cores
    comm = MPI.COMM_WORLD
    results = measure_schedules(comm, (WIDTH,) * (LAYERS + 1), BATCH, MICRO_BATCHES, SCHEDULE_NAMES,
                                repeats=REPEATS, dtype="float32", chunks=2)
    if comm.rank == 0:
        with open(argv[0], "w") as stream:
            json.dump(dict(ranks=comm.size, cores=len(os.sched_getaffinity(0)), micro_batches=MICRO_BATCHES,
                           schedules=results), stream)


if __name__ == "__main__":
    main(sys.argv[1:])
