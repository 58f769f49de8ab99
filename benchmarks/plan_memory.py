"""Lesson 19's memory model against tracemalloc's peak, every rank of every layout of a sweep on 4 ranks.

Run:   .venv/bin/python benchmarks/plan_memory.py [--csv notebooks/results/plan_memory.csv]

Starts itself under ``mpiexec -n 4`` (one BLAS thread per rank). For each network (the one the model's terms were
found on, and others it never saw: another shape and batch, the 7-layer network of lesson 12's pipeline benchmark,
a batch of two chunks, float32; float16 and bfloat16 mixed precision on the data axis), each layout (data
parallelism with ZeRO 0-3, accumulation, recomputation; tensor; GPipe and 1F1B pipelines; the 2-D grids, with ZeRO-1
on their data axis) and optimizer (momentum SGD, Adam), every rank's measured peak
(nnlib.lesson19_planning.memory.measured_peak: tracemalloc over the layout's real step, after a warm-up) beside
peak_bytes by kind, the error (predicted - measured) / measured, and the lessons' counts alone (lesson 12's
rank_bytes, lesson 17's predicted_bytes: what the model adds its terms to) with their error. Memory is not timing:
the figures are the same from run to run, on any machine with the same NumPy.
"""

from __future__ import annotations

import argparse
import csv
import os
import subprocess
import sys

NETWORKS = {"fitted": ((784, 130, 98, 66, 10), 256, "float64"), "unseen": ((784, 64, 61, 59, 57, 10), 512, "float64"),
            "7 layers": ((784, 128, 127, 126, 125, 124, 123, 10), 128, "float64"),
            "two chunks": ((784, 64, 61, 59, 57, 10), 2048, "float64"),
            "float32": ((784, 64, 61, 59, 57, 10), 512, "float32"),
            "float16": ((784, 130, 98, 66, 10), 256, "float16"),
            "bfloat16": ((784, 64, 61, 59, 57, 10), 512, "bfloat16")}
KINDS = ("parameters", "gradients", "optimizer state", "batch", "activations", "backward", "logits", "buffers",
         "sends", "update")


def sweep(mixed: bool = False):
    """[(name, Layout)]: every kind of layout the lessons can run on 4 ranks (``mixed`` precision: the data axis's)."""
    from nnlib.lesson19_planning.layout import Layout

    layouts = [Layout(data=4, zero=zero) for zero in range(4)] + [
        Layout(data=4, micro_batches=4), Layout(data=4, recompute=2), Layout(data=4, zero=1, micro_batches=4),
        Layout(data=4, zero=3, recompute=2, micro_batches=2), Layout(tensor=4),
        Layout(pipeline=4, micro_batches=4, schedule="gpipe"), Layout(pipeline=4, micro_batches=4),
        Layout(pipeline=4, micro_batches=8), Layout(data=2, tensor=2), Layout(data=2, pipeline=2, micro_batches=4),
        Layout(data=2, pipeline=2, micro_batches=8, schedule="gpipe"), Layout(data=2, tensor=2, zero=1),
        Layout(data=2, pipeline=2, zero=1, micro_batches=4)]
    runnable = [layout for layout in layouts if not mixed or layout.tensor == layout.pipeline == 1 and layout.zero != 2]
    return [(name_of(layout), layout) for layout in runnable]


def name_of(layout) -> str:
    """e.g. "4x1x1 zero 3 k=2 r=2", "1x1x4 gpipe m=4": data x tensor x pipeline and what else is set."""
    name = f"{layout.data}x{layout.tensor}x{layout.pipeline}" + (f" zero {layout.zero}" if layout.zero else "")
    if layout.pipeline > 1:
        return f"{name} {layout.schedule} m={layout.micro_batches}"
    return name + (f" k={layout.micro_batches}" if layout.micro_batches > 1 else "") + \
        (f" r={layout.recompute}" if layout.recompute else "")


def lessons_alone(sizes, batch: int, rank: int, layout, precision: str) -> int:
    """The lessons' own count for the rank (no term of lesson 19's): rank_bytes or predicted_bytes, summed."""
    from nnlib.lesson04_collectives.collectives import split_evenly
    from nnlib.lesson19_planning.memory import lessons_count

    replica, piece = divmod(rank, layout.tensor * layout.pipeline)
    rows, (stage, part) = split_evenly(batch, layout.data)[0][replica], divmod(piece, layout.tensor)
    held = lessons_count(sizes, rows, layout, replica, stage, part, precision)[0]
    return sum(held.values())


def worker(path: str) -> None:
    from mpi4py import MPI

    from nnlib.lesson19_planning.memory import measured_peak, peak_bytes

    comm, rows = MPI.COMM_WORLD, []
    for network, (sizes, batch, precision) in NETWORKS.items():
        for name, layout in sweep(mixed=precision in ("float16", "bfloat16")):
            for optimizer in ("momentum", "adam"):
                peaks = measured_peak(comm, sizes, batch, layout, optimizer, precision)
                for rank, measured in enumerate(peaks):
                    kinds = peak_bytes(sizes, batch, comm.size, rank, layout, optimizer, precision)
                    predicted, alone = sum(kinds.values()), lessons_alone(sizes, batch, rank, layout, precision)
                    rows.append(dict(network=network, sizes="-".join(map(str, sizes)), global_batch=batch,
                                     dtype=precision, layout=name,
                                     optimizer=optimizer, rank=rank, **{kind: kinds.get(kind, 0) for kind in KINDS},
                                     predicted=predicted, measured=measured,
                                     error=round(predicted / measured - 1, 4), lessons=alone,
                                     lessons_error=round(alone / measured - 1, 4)))
    if comm.rank == 0:
        with open(path, "w", newline="") as file:
            writer = csv.DictWriter(file, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
        report(rows)


def report(rows) -> None:
    """Per network, layout and optimizer: the ranks' measured MB, the model's largest error and the lessons'."""
    print(f"{'network':10s} {'layout':22s} {'optimizer':9s} {'measured MB, ranks 0-3':>28s} {'model':>7s} "
          f"{'lessons':>8s}")
    groups = {}
    for row in rows:
        groups.setdefault((row["network"], row["layout"], row["optimizer"]), []).append(row)
    for (network, layout, optimizer), ranks in groups.items():
        worst = max((row["error"] for row in ranks), key=abs)
        lessons = max((row["lessons_error"] for row in ranks), key=abs)
        measured = " ".join(f"{row['measured'] / 1e6:6.3f}" for row in ranks)
        print(f"{network:10s} {layout:22s} {optimizer:9s} {measured:>28s} {worst:+7.1%} {lessons:+8.1%}")
    print(f"largest |error| over {len(rows)} (layout, rank) pairs: model {max(abs(r['error']) for r in rows):.1%}, "
          f"the lessons' counts alone {max(abs(r['lessons_error']) for r in rows):.1%} "
          "(per row: the rank with the largest |error|)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--csv", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "notebooks", "results", "plan_memory.csv"),
                        help="where the table of every (network, layout, optimizer, rank) goes")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.csv)
        return
    os.environ.update({name: "1" for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")})
    from nnlib.course.environment import blas_kernel, describe, mpiexec_path

    machine = describe()
    networks = ", ".join(f"{name} {'-'.join(map(str, sizes))} batch {batch} {dtype}"
                         for name, (sizes, batch, dtype) in NETWORKS.items())
    print(f"machine: {machine['machine']}; {machine['BLAS']}, kernel {blas_kernel()}; {machine['MPI library']}; "
          f"4 ranks; numpy {__import__('numpy').__version__}; networks {networks}"
          + "\n", flush=True)
    subprocess.run([mpiexec_path(), "-n", "4", sys.executable, __file__, "--worker", "--csv", args.csv], check=True,
                   timeout=1200)


if __name__ == "__main__":
    main()
