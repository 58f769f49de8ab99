"""Lesson 18's schedules on 2 ranks with balanced stages: bubble measured, simulated and by formula, and step time.

Run:   make benchmark        (or: .venv/bin/python benchmarks/pipeline_schedules.py [--rounds R])

Starts itself under ``mpiexec -n 2`` (one BLAS thread per rank) and runs notebook 18's job's case:
m = 8 micro-batches of a float32 batch of 1024 (the runs in RESULTS.md; the notebook's is 512) through (64,) + (512,) * 9 + (10,), whose layers
nnlib.lesson18_pipeline_schedules.schedules.balanced_split spreads so that every (virtual) stage
does the same forward, input-gradient and weight-gradient work (5, 5 layers; 3, 2, 2, 3 for the
interleaved schedule's 4 virtual stages). For 1F1B, interleaved 1F1B (v = 2), ZB-H1 and ZB-H2 it
takes the median of 5 steps (after a warm-up) in each of R rounds (default 5) that interleave the
schedules, so that a slow spell of the machine hits all alike, and prints the medians over the
rounds, with their ranges, of: the measured idle fraction, the formula (with the measured mean F,
B, W), the simulation from each stage's measured times, and the step's time (first computation to
last). The simulation near the formula says the stages are balanced; the measured bubble near
both says that Python's time between instructions and the messages cost little. Last, whether
interleaved 1F1B and ZB-H1 are faster than 1F1B with ranges of their step times that do not overlap.
"""

from __future__ import annotations

import argparse
from statistics import median

from nnlib.lesson10_zero_overlap.waiting import range_verdict

COLUMNS = ("measured", "formula", "simulated", "step_seconds")
BATCH = 1024  # the batch of the runs recorded in benchmarks/RESULTS.md


def worker(rounds: int) -> None:
    from mpi4py import MPI

    from nnlib.course.deadline import watch
    from nnlib.lesson18_pipeline_schedules.demo import LAYER_SIZES, MICRO_BATCHES, balanced_layouts
    from nnlib.lesson18_pipeline_schedules.schedules import measure_schedules

    comm = watch(MPI.COMM_WORLD)  # every message under the default deadline, as in a batch job
    layouts = balanced_layouts(comm.size)
    results = {name: [] for name in layouts}  # schedule -> that schedule's row from each round
    for _ in range(rounds):
        rows = measure_schedules(comm, LAYER_SIZES, BATCH, MICRO_BATCHES, layouts, repeats=5, dtype="float32")
        for name, row in (rows or {}).items():
            results[name].append(row)
    if comm.rank == 0:
        report(results, layouts)


def spread(values, scale: float = 1.0, digits: int = 3) -> str:
    """'median (min-max)' of the values, times scale."""
    return f"{median(values) * scale:.{digits}f} ({min(values) * scale:.{digits}f}-{max(values) * scale:.{digits}f})"


def report(results: dict, layouts: dict) -> None:
    """Medians over the rounds with their ranges; then which schedules beat 1F1B with ranges apart."""
    print(f"{'schedule':12s} {'layers per virtual stage':26s} " + " ".join(f"{column:>22s}" for column in
                                                                     ("bubble measured", "formula", "simulated",
                                                                      "step ms")))
    for name, rows in results.items():
        cells = [spread([row[column] for row in rows], *((1e3, 1) if column == "step_seconds" else (1.0, 3)))
                 for column in COLUMNS]
        print(f"{name:12s} {str(layouts[name]):26s} " + " ".join(f"{cell:>22s}" for cell in cells))
    steps = {name: [row["step_seconds"] for row in rows] for name, rows in results.items()}
    for name in ("interleaved", "zb-h1"):
        verdict = range_verdict(steps[name], steps["1f1b"])  # lesson 10's rule
        print(f"{name} against 1F1B: {verdict} (median step {median(steps[name]) / median(steps['1f1b']):.2f} x 1F1B's)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5, help="times every schedule is measured (medians reported)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.rounds)
        return
    from pipeline import launch  # benchmarks/pipeline.py, beside this script

    launch(__file__, args.rounds, f"2 ranks, m = 8, float32; medians of {args.rounds} rounds (range)",
           seconds_per_round=600)


if __name__ == "__main__":
    main()
