"""What the classroom deadline costs a student's own collective: a 400 kB Allreduce, watched against plain.

Run:   make benchmark        (or: .venv/bin/python benchmarks/classroom_deadline.py [--ranks 2] [--rounds 15])

Under ``mpiexec -n RANKS``, each round times MPI's own blocking ``Allreduce`` on COMM_WORLD and the
same call through the notebook cluster's ``comm`` (nnlib.course.classroom.ClassroomComm),
one after the other (interleaved), each the median of 50 calls counted at the slowest rank. It prints
the median over rounds of (watched / plain) with its spread (min and max over rounds).
"""

from __future__ import annotations

import argparse
import subprocess
import sys

import numpy as np

VALUES = 50_000  # float64: 400 kB


def worker(rounds: int) -> None:
    from mpi4py import MPI

    from nnlib.course.classroom import ClassroomComm
    from nnlib.lesson04_collectives.timing import time_collective

    world = MPI.COMM_WORLD
    watched = ClassroomComm(world, timeout=60)
    send, receive = np.ones(VALUES), np.empty(VALUES)
    ratios, plain_seconds = [], []
    for _ in range(rounds):
        plain = time_collective(world, lambda: world.Allreduce(send, receive), repeats=50, warmup=5)
        deadline = time_collective(world, lambda: watched.Allreduce(send, receive), repeats=50, warmup=5)
        ratios.append(deadline / plain)
        plain_seconds.append(plain)
    if world.rank == 0:
        from nnlib.course.environment import blas_kernel

        print(f"BLAS kernel {blas_kernel()} (unused here); {world.size} ranks, Allreduce of {VALUES * 8 / 1e3:.0f} kB, {rounds} interleaved rounds of 50 calls: "
              f"plain {np.median(plain_seconds) * 1e6:.0f} us; watched / plain = {np.median(ratios):.3f} "
              f"(min {min(ratios):.3f}, max {max(ratios):.3f})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.rounds)
        return
    from nnlib.course.environment import mpiexec_path

    subprocess.run([mpiexec_path(), "-n", str(args.ranks), sys.executable, __file__, "--worker",
                    "--rounds", str(args.rounds)], check=True, timeout=600)


if __name__ == "__main__":
    main()
