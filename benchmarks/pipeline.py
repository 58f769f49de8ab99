"""The pipeline's idle time ("bubble") on 2 stages: measured, simulated from the stages' times, and the formula.

Run:   make benchmark        (or: .venv/bin/python benchmarks/pipeline.py [--rounds R])

Starts itself under ``mpiexec -n 2`` (one BLAS thread per rank) and, for GPipe and 1F1B and
m = 1, 2, 4, 8, 16 micro-batches, runs pipeline steps on a random float32 batch (a warm-up step,
then the median of 5 steps), in R rounds (default 3) that interleave every case. It prints the
medians over the rounds of: the measured idle fraction (with its range), the one
nnlib.lesson09_model_parallel.bubbles.simulated_bubble predicts from each stage's measured forward and backward
times, and the step's time (first computation to last); beside them (P - 1) / (m + P - 1), which
assumes equal stages, and the most micro-batches each stage kept alive. Then, per network and m,
1F1B's step time over GPipe's (1F1B keeps fewer micro-batches alive; it should not be slower).
The third network gives both stages the same forward work and the same backward work, which is
what the formula assumes (1F1B needs only their sums equal; GPipe needs each).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from statistics import median

NETWORKS = {"2304-1024-1024 (one layer per stage)": ((2304, 1024, 1024), 1024),
            "1024 x 9 (four layers per stage)": ((1024,) * 9, 512),
            # balanced: 10 layers, 5 per stage, each stage with 4 layers of 1024 x 1024 (1 unit forward, 2
            # backward) and one narrow layer: stage 0's first (64 -> 1024, whose input gradient nobody computes),
            # stage 1's last (1024 -> 10, so the loss is cheap). Forward 4 units and backward 8 on each stage.
            "64-1024 x 9-10 (balanced stages)": ((64,) + (1024,) * 9 + (10,), 1024)}
COUNTS = (1, 2, 4, 8, 16)  # micro-batches per step (measure_bubbles' default)


def worker(rounds: int) -> None:
    from mpi4py import MPI

    from nnlib.lesson09_model_parallel.bubbles import measure_bubbles
    from nnlib.course.deadline import watch

    comm = watch(MPI.COMM_WORLD)  # every message under the default deadline, as in a batch job
    results = {}  # (network, schedule, m) -> that case's row from each round
    for _ in range(rounds):  # rounds interleaved, so that a slow spell of the machine hits every case alike
        for name, (sizes, batch) in NETWORKS.items():
            for schedule in ("gpipe", "1f1b"):
                rows = measure_bubbles(comm, sizes, batch, COUNTS, schedule=schedule, repeats=5)
                for row in rows or []:
                    results.setdefault((name, schedule, row["micro_batches"]), []).append(row)
    if comm.rank == 0:
        report(results, rounds)


def report(results: dict, rounds: int) -> None:
    """Medians over the rounds (the measured bubble's range beside it), then 1F1B's step time over GPipe's."""
    print(f"{'network (batch)':38s} {'sched':6s} {'m':>3s} {'measured (range)':>22s} {'simulated':>10s} "
          f"{'formula':>8s} {'step ms':>8s}   micro-batches alive per stage")
    for (name, schedule, m), rows in results.items():
        measured = [row["measured"] for row in rows]
        print(f"{name:38s} {schedule:6s} {m:3d} {median(measured):9.3f} ({min(measured):.3f}-{max(measured):.3f}) "
              f"{median(row['simulated'] for row in rows):10.3f} {rows[0]['formula']:8.3f} "
              f"{median(row['step_seconds'] for row in rows) * 1e3:8.1f}   {rows[0]['peak_alive']}")
    print(f"\nstep time, 1F1B / GPipe (median of the {rounds} rounds' ratios), for m = " + ", ".join(map(str, COUNTS)))
    for name in NETWORKS:
        ratios = [median(one["step_seconds"] / other["step_seconds"]
                         for one, other in zip(results[name, "1f1b", m], results[name, "gpipe", m])) for m in COUNTS]
        print(f"{name:38s} " + "  ".join(f"{ratio:5.2f}" for ratio in ratios))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="times every case is measured (medians reported)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.rounds)
        return
    launch(__file__, args.rounds, f"2 stages, float32; medians of {args.rounds} rounds", seconds_per_round=900)


def launch(script: str, rounds: int, what: str, seconds_per_round: int) -> None:
    """Print the machine and ``what``, then run ``script --worker --rounds R`` on 2 ranks under mpiexec, one BLAS
    thread per rank (set here, before the ranks import NumPy; they inherit it). benchmarks/pipeline_schedules.py
    starts itself through this too."""
    os.environ.update({name: "1" for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")})
    from nnlib.course.environment import describe, mpiexec_path

    machine = describe()
    print(f"machine: {machine['machine']}; {machine['BLAS']}, kernel {machine['BLAS kernel']}; "
          f"{machine['MPI library']}; {what}\n", flush=True)
    subprocess.run([mpiexec_path(), "-n", "2", sys.executable, script, "--worker", "--rounds", str(rounds)],
                   check=True, timeout=seconds_per_round * rounds)


if __name__ == "__main__":
    main()
