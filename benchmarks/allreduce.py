"""The hand-built Allreduce algorithms (nnlib.lesson09_ring_allreduce.allreduce) against MPI's own, from 8 bytes to 16 MB.

Run:   make benchmark        (or: .venv/bin/python benchmarks/allreduce.py [--runs 3])

Starts ``mpiexec -n P python -m nnlib allreduce-timing`` for P = 2 and 4, ``--runs`` times each,
interleaved, and prints for every size from 1 MB up the median over runs of (ring time / MPI
time), and the median bus bandwidth of both. Each run's times are themselves medians of repeated
calls, each counted at the slowest rank. More ranks than cores take turns on the cores: those
rows say so.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np


def one_run(ranks: int, folder: Path, index: int) -> list[dict]:
    from nnlib.course.environment import mpiexec_path
    from nnlib.lesson01_mnist.files import read_csv
    from nnlib.lesson09_ring_allreduce.allreduce_timing import TIMING_FIELDS

    csv = folder / f"run-{ranks}-{index}.csv"
    subprocess.run([mpiexec_path(), "-n", str(ranks), sys.executable, "-m", "nnlib", "allreduce-timing",
                    "--smallest", str(2**20), "--csv", str(csv)], check=True, capture_output=True, text=True,
                   timeout=600)
    return read_csv(csv, TIMING_FIELDS, integers=("bytes", "ranks"), floats=("seconds", "bus_bandwidth"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    from nnlib.course.environment import describe

    machine = describe()
    cores = os.cpu_count()
    print(f"machine: {machine['machine']}; BLAS kernel {machine['BLAS kernel']}; {machine['MPI library']}; float32 buffers; medians of {args.runs} runs\n")
    print(f"{'ranks':>5s} {'size':>7s} {'MPI us':>9s} {'ring us':>9s} {'ring/MPI':>8s} {'MPI busbw GB/s':>15s} "
          f"{'ring busbw GB/s':>16s}")
    with tempfile.TemporaryDirectory() as folder:
        runs = {ranks: [] for ranks in (2, 4)}
        for index in range(args.runs):
            for ranks in runs:
                runs[ranks].append(one_run(ranks, Path(folder), index))
    for ranks, results in runs.items():
        sizes = sorted({row["bytes"] for row in results[0]})
        for size in sizes:
            def pick(algorithm, key):
                return [next(row[key] for row in rows if row["bytes"] == size and row["algorithm"] == algorithm)
                        for rows in results]
            mpi, ring = np.array(pick("mpi", "seconds")), np.array(pick("ring", "seconds"))
            note = "  (more ranks than cores)" if ranks > cores else ""
            print(f"{ranks:5d} {size / 2**20:5g} MB {np.median(mpi) * 1e6:9.0f} {np.median(ring) * 1e6:9.0f} "
                  f"{np.median(ring / mpi):8.2f} {np.median(pick('mpi', 'bus_bandwidth')) / 1e9:15.2f} "
                  f"{np.median(pick('ring', 'bus_bandwidth')) / 1e9:16.2f}{note}")


if __name__ == "__main__":
    main()
