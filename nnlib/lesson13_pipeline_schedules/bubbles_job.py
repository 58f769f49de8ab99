"""``mpiexec -n P python -m nnlib.lesson13_pipeline_schedules.bubbles_job OUT.json``: notebook 13's measurements.

Every schedule (1F1B, interleaved with v = 2, ZB-H1, ZB-H2) runs steps with m = 8 micro-batches of
a network with *balanced stages*: (64,) + (512,) * 9 + (10,), whose 8 wide layers each cost the
same F, B and W, and whose narrow first and last layers cost little (the first needs no input
gradient, the last feeds the loss). :func:`~nnlib.lesson13_pipeline_schedules.schedules.balanced_split`
puts the narrow layers beside wide ones, so that each of the P (or 2P) virtual stages does the same
work, as the bubble formulas assume. Rank 0 writes
:func:`nnlib.lesson13_pipeline_schedules.schedules.measure_schedules`' results to OUT.json (the
timelines as lists), with the number of ranks and the cores it saw.
"""

from __future__ import annotations

import json
import os
import sys

from mpi4py import MPI
from threadpoolctl import threadpool_limits

from nnlib.lesson13_pipeline_schedules.schedules import balanced_split, measure_schedules

LESSON = 13
NOTEBOOKS_ONLY = True

WIDTH, WIDE_LAYERS, BATCH, MICRO_BATCHES, REPEATS = 512, 8, 1024, 8, 5
LAYER_SIZES = (64,) + (WIDTH,) * (WIDE_LAYERS + 1) + (10,)
SCHEDULE_NAMES = ("1f1b", "interleaved", "zb-h1", "zb-h2")


def balanced_layouts(ranks: int, names=SCHEDULE_NAMES, chunks: int = 2) -> dict:
    """{schedule: its layer counts per virtual stage}: balanced_split over P virtual stages (2P: interleaved)."""
    num_layers = len(LAYER_SIZES) - 1
    return {name: balanced_split(num_layers, ranks * (chunks if name == "interleaved" else 1)) for name in names}


def main(argv) -> None:
    """Measure every schedule on MPI.COMM_WORLD; rank 0 writes argv[0]."""
    threadpool_limits(1)  # one BLAS thread per rank: the ranks share the cores
    comm = MPI.COMM_WORLD
    results = measure_schedules(comm, LAYER_SIZES, BATCH, MICRO_BATCHES, balanced_layouts(comm.size),
                                repeats=REPEATS, dtype="float32")
    if comm.rank == 0:
        with open(argv[0], "w") as stream:
            json.dump(dict(ranks=comm.size, cores=len(os.sched_getaffinity(0)), micro_batches=MICRO_BATCHES,
                           layer_sizes=LAYER_SIZES, schedules=results), stream)


if __name__ == "__main__":
    main(sys.argv[1:])
