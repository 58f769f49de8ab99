"""The pipeline's idle time ("bubble") on 2 stages: measured, simulated from the stages' times, and the formula.

Run:   make benchmark        (or: .venv/bin/python benchmarks/pipeline.py)

Starts itself under ``mpiexec -n 2`` (one BLAS thread per rank) and, for GPipe and 1F1B and
m = 1, 2, 4, 8, 16 micro-batches, runs pipeline steps on a random float32 batch (after a warm-up
step; medians of 5), printing the measured idle fraction, the one nnlib.parallel.pipeline.simulated_bubble
predicts from each stage's measured forward and backward times, and (P - 1) / (m + P - 1), which
assumes equal stages; the step's time (its median span, first computation to last), and the
most micro-batches each stage kept alive. Then, per network and m, 1F1B's step time over GPipe's
(1F1B keeps fewer micro-batches alive; it should not be slower). The third network balances
the stages' forward-plus-backward work, which is what the formula assumes for 1F1B.
"""

from __future__ import annotations

import os
import subprocess
import sys

os.environ.update({name: "1" for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")})

NETWORKS = {"2304-1024-1024 (one layer per stage)": ((2304, 1024, 1024), 1024),
            "1024 x 9 (four layers per stage)": ((1024,) * 9, 512),
            # balanced: stage 0's wider first layer (1.5 units of 1024^2 forward, its weight gradient backward)
            # makes up for the input gradient it need not compute: forward + backward = 12 units on each stage
            "1536-1024 x 8 (balanced stages)": ((1536,) + (1024,) * 8, 512)}
COUNTS = (1, 2, 4, 8, 16)  # micro-batches per step (measure_bubbles' default)


def worker() -> None:
    from mpi4py import MPI

    from nnlib.parallel.pipeline import measure_bubbles

    comm = MPI.COMM_WORLD
    step_seconds = {}
    for name, (sizes, batch) in NETWORKS.items():
        for schedule in ("gpipe", "1f1b"):
            rows = measure_bubbles(comm, sizes, batch, COUNTS, schedule=schedule, repeats=5)
            if comm.rank == 0:
                for row in rows:
                    step_seconds[name, schedule, row["micro_batches"]] = row["step_seconds"]
                    print(f"{name:38s} {schedule:6s} {row['micro_batches']:3d} {row['measured']:9.3f} "
                          f"{row['simulated']:10.3f} {row['formula']:8.3f} {row['step_seconds'] * 1e3:8.1f}   "
                          f"{row['peak_alive']}", flush=True)
    if comm.rank == 0:
        print("\nstep time, 1F1B / GPipe, for m = " + ", ".join(map(str, COUNTS)))
        for name in NETWORKS:
            ratios = [step_seconds[name, "1f1b", m] / step_seconds[name, "gpipe", m] for m in COUNTS]
            print(f"{name:38s} " + "  ".join(f"{ratio:5.2f}" for ratio in ratios))


def main() -> None:
    if "--worker" in sys.argv:
        worker()
        return
    from nnlib.environment import describe, mpiexec_path

    machine = describe()
    print(f"machine: {machine['machine']}; {machine['BLAS']}; {machine['MPI library']}; 2 stages, float32\n")
    print(f"{'network (batch)':38s} {'sched':6s} {'m':>3s} {'measured':>9s} {'simulated':>10s} {'formula':>8s}   "
          f"{'step ms':>8s}   micro-batches alive per stage")
    sys.stdout.flush()
    subprocess.run([mpiexec_path(), "-n", "2", sys.executable, __file__, "--worker"], check=True, timeout=900)


if __name__ == "__main__":
    main()
