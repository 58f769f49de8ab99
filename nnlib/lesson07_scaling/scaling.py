"""A scaling harness: data-parallel training over a grid of rank counts and problem sizes.

Each point of the grid is one ``mpiexec -n P`` job (one BLAS thread per rank), repeated a few times; each run returns
a *record* (a flat dict, one CSV row): the point, the epoch time, the time per phase, the test accuracy, and the
machine (:func:`measure`; notebook 07, or ``python -m nnlib scaling``).

Strong scaling keeps the total work fixed (N samples for any P): ideal time T1 / P. Weak scaling keeps the work *per
rank* fixed (N = n P): ideal time T1 for every P. Points with more ranks than physical cores are marked
``oversubscribed``: there the ranks take turns on the cores, as a cluster does not, and tables and plots show it.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import numpy as np

from nnlib.lesson01_mnist.files import read_csv, write_csv

LESSON = 7

RECORD_FIELDS = ["kind", "ranks", "samples", "strategy", "repeat", "epoch_seconds", "load_seconds",
                 "data_seconds", "compute_seconds", "communicate_seconds", "update_seconds", "accuracy",
                 "oversubscribed", "physical_cores", "blas", "mpi_library", "machine", "where"]


def machine_fields() -> dict:
    """The machine-description part of a record: physical cores (psutil; else logical CPUs), BLAS, MPI, machine."""
    import psutil

    from nnlib.course.environment import blas, describe, mpi_library

    return {"physical_cores": psutil.cpu_count(logical=False) or os.cpu_count() or 1, "blas": blas(),
            "mpi_library": mpi_library(), "machine": describe()["machine"], "where": "live"}


# -- One point: an mpiexec job -----------------------------------------------------------------------

#: One point's training, unless :func:`measure` is given others. The first epoch is a warm-up: the epoch time is
#: the median of the others (so epochs >= 2); phase times are per epoch, each the slowest rank's.
POINT_SETTINGS = dict(hidden=[128], batch_size=256, epochs=2, learning_rate=0.1)


def measure_messages(ranks: int, sizes_in_bytes, repeats: int = 50, timeout: float = 300):
    """Median seconds of one float32 point-to-point message of each size (timing.time_messages),
    on ``ranks`` ranks (an mpiexec job): the times to fit costmodel.fit_latency_bandwidth to."""
    settings = {"mode": "messages", "sizes": [int(size) for size in sizes_in_bytes], "repeats": repeats}
    return np.array(_run_job(ranks, settings, timeout))


def _run_job(ranks: int, settings: dict, timeout: float):
    """Run :func:`_worker` under ``mpiexec -n ranks`` (one BLAS thread each); return rank 0's JSON answer."""
    from nnlib.course.environment import ONE_BLAS_THREAD, mpiexec_path

    command = [mpiexec_path(), "-n", str(ranks), sys.executable, "-m", "nnlib.lesson07_scaling.scaling", json.dumps(settings)]
    run = subprocess.run(command, capture_output=True, text=True, timeout=timeout,
                         env={**os.environ, **ONE_BLAS_THREAD})
    if run.returncode != 0:
        raise RuntimeError(f"scaling job failed ({' '.join(command)}):\n{run.stderr[-2000:]}")
    return json.loads(run.stdout.strip().splitlines()[-1])


def _worker(settings: dict) -> None:
    """Runs on every rank of a point's mpiexec job; rank 0 prints one JSON line."""
    from mpi4py import MPI

    from nnlib.lesson01_mnist import data
    from nnlib.lesson02_network.network import Network
    from nnlib.lesson04_collectives.timing import time_messages
    from nnlib.lesson06_data_parallel import PHASES, shard, train_parallel

    comm = MPI.COMM_WORLD
    if settings.get("mode") == "messages":
        seconds = time_messages(comm, settings["sizes"], settings["repeats"], dtype=np.float32)
        if comm.rank == 0:
            print(json.dumps(seconds.tolist()))
        return
    began = time.perf_counter()
    if comm.rank == 0:
        mnist = data.load_mnist(progress=False)
        inputs = data.scale_pixels(mnist.train_images[:settings["samples"]])
        labels = mnist.train_labels[:settings["samples"]].astype(np.int64)
    else:
        inputs = labels = None
    local_inputs, local_labels, start = shard(comm, inputs, labels)
    load_seconds = comm.allreduce(time.perf_counter() - began, op=MPI.MAX)
    network = Network((784, *settings["hidden"], 10), seed=0)
    history = train_parallel(comm, network, local_inputs, local_labels, num_samples=settings["samples"],
                             start=start, epochs=settings["epochs"], learning_rate=settings["learning_rate"],
                             batch_size=settings["batch_size"], momentum=0.9, strategy=settings["strategy"])
    phases = {phase: comm.allreduce(history.phase_seconds[phase], op=MPI.MAX) / settings["epochs"] for phase in PHASES}
    if comm.rank == 0:
        accuracy = network.accuracy(data.scale_pixels(mnist.test_images), mnist.test_labels.astype(np.int64))
        print(json.dumps({"epoch_seconds": float(np.median(history.seconds[1:])), "load_seconds": load_seconds,
                          **{f"{phase}_seconds": seconds for phase, seconds in phases.items()},
                          "accuracy": accuracy}))


def measure(ranks_list, kind: str = "strong", samples: int = 20000, strategy: str = "allreduce",
            repeats: int = 3, progress: bool = False, **settings) -> list[dict]:
    """Records for every rank count in ``ranks_list``, each repeated ``repeats`` times: one ``mpiexec -n P`` job on
    the first N MNIST samples, N = ``samples`` for every P ("strong") or ``samples`` per rank, samples * P ("weak").
    Extra ``settings`` replace those of POINT_SETTINGS (hidden, batch_size, epochs, learning_rate)."""
    if kind not in ("strong", "weak"):
        raise ValueError(f"kind must be 'strong' or 'weak'; got {kind!r}")
    machine = machine_fields()
    records = []
    for ranks in ranks_list:
        total = samples if kind == "strong" else samples * ranks
        for repeat in range(repeats):
            point = dict(POINT_SETTINGS, samples=total, strategy=strategy, **settings)
            measured = _run_job(ranks, dict(point, hidden=list(point["hidden"])), timeout=600)
            records.append({"kind": kind, "ranks": ranks, "samples": total, "strategy": strategy, "repeat": repeat,
                            **measured, "oversubscribed": ranks > machine["physical_cores"], **machine})
            if progress:
                print(f"{kind} P={ranks} N={total} repeat {repeat + 1}/{repeats}: "
                      f"{measured['epoch_seconds']:.3f} s/epoch", flush=True)
    return records


# -- Tables ------------------------------------------------------------------------------------------

def summarize(records) -> list[dict]:
    """One row per (kind, strategy, ranks): medians of the epoch and phase times, the spread, speedup, efficiency.
    Strong: speedup = T1 / TP, efficiency = speedup / P. Weak: efficiency = T1 / TP and the scaled speedup =
    P * T1 / TP. T1: the median of the 1-rank repeats of that kind and strategy (missing: no speedup)."""
    groups: dict = {}
    for record in records:
        groups.setdefault((record["kind"], record["strategy"], record["ranks"]), []).append(record)
    rows = []
    for (kind, strategy, ranks), group in sorted(groups.items()):
        times = [r["epoch_seconds"] for r in group]
        row = {"kind": kind, "strategy": strategy, "ranks": ranks, "samples": group[0]["samples"],
               "repeats": len(group), "epoch_seconds": statistics.median(times),
               "spread": max(times) - min(times), "accuracy": statistics.median(r["accuracy"] for r in group),
               "oversubscribed": bool(group[0]["oversubscribed"]), "where": group[0].get("where", "live")}
        for phase in ("load", "data", "compute", "communicate", "update"):
            row[f"{phase}_seconds"] = statistics.median(r[f"{phase}_seconds"] for r in group)
        rows.append(row)
    one_rank = {(row["kind"], row["strategy"]): row["epoch_seconds"] for row in rows if row["ranks"] == 1}
    for row in rows:
        ratio = one_rank.get((row["kind"], row["strategy"]), float("nan")) / row["epoch_seconds"]  # T1 / TP
        strong = row["kind"] == "strong"
        row["speedup"], row["efficiency"] = (ratio, ratio / row["ranks"]) if strong else (ratio * row["ranks"], ratio)
    return rows


def format_table(rows, kind: str) -> str:
    """A table of samples, ranks, time, speedup (weak: scaled, P T1 / TP), efficiency; * marks oversubscribed points."""
    speedup = "speedup" if kind == "strong" else "scaled speedup"
    rows = [row for row in rows if row["kind"] == kind]
    lines = [f"{'samples':>8s} {'ranks':>5s} {'s/epoch':>9s} {'spread':>8s} {speedup:>14s} {'efficiency':>10s}"]
    lines += [f"{row['samples']:8d} {row['ranks']:4d}{'*' if row['oversubscribed'] else ' '} "
              f"{row['epoch_seconds']:9.3f} {row['spread']:8.3f} {row['speedup']:14.2f} {row['efficiency']:10.0%}"
              for row in rows]
    if any(row["oversubscribed"] for row in rows):
        lines.append("* more ranks than physical cores (oversubscribed): ranks take turns on the cores")
    return "\n".join(lines)


# -- Laws --------------------------------------------------------------------------------------------

def fit_amdahl(ranks, speedups) -> float:
    """The serial fraction f of Amdahl's law, S(P) = 1 / (f + (1 - f) / P), fitted to strong scaling:
    1/S - 1/P = f (1 - 1/P) is linear in f, so least squares through the origin."""
    ranks, speedups = np.asarray(ranks, dtype=float), np.asarray(speedups, dtype=float)
    x, y = 1 - 1 / ranks, 1 / speedups - 1 / ranks
    if not np.any(x):
        raise ValueError("need at least one point with more than one rank")
    return float(np.dot(x, y) / np.dot(x, x))


def amdahl_speedup(ranks, serial_fraction: float):
    """S(P) = 1 / (f + (1 - f) / P): the speedup when a fraction f of the work cannot be shared."""
    return 1 / (serial_fraction + (1 - serial_fraction) / np.asarray(ranks, dtype=float))


def fit_gustafson(ranks, scaled_speedups) -> float:
    """The serial fraction f of Gustafson's law, S(P) = P - f (P - 1), fitted to weak scaling."""
    ranks, scaled = np.asarray(ranks, dtype=float), np.asarray(scaled_speedups, dtype=float)
    x = ranks - 1
    if not np.any(x):
        raise ValueError("need at least one point with more than one rank")
    return float(np.dot(x, ranks - scaled) / np.dot(x, x))


def gustafson_speedup(ranks, serial_fraction: float):
    """S(P) = P - f (P - 1): the scaled speedup when the work grows with the ranks."""
    ranks = np.asarray(ranks, dtype=float)
    return ranks - serial_fraction * (ranks - 1)


# -- The large-batch effect --------------------------------------------------------------------------

def warmup_schedule(base_rate: float, target_rate: float, warmup_epochs: float):
    """Goyal et al. (2017)'s gradual warm-up: from base_rate to target_rate linearly over warmup_epochs."""
    def schedule(progress: float) -> float:
        return base_rate + (target_rate - base_rate) * min(1.0, progress / warmup_epochs) if warmup_epochs else target_rate
    return schedule


def large_batch_accuracy(inputs, labels, test_inputs, test_labels, ranks_list, scale_rate: bool = False,
                         warmup_epochs: float = 1.0):
    """Test accuracy after 2 epochs with a global batch of 32 P (32 per rank), for each P of ``ranks_list``: a
    784-64-10 network (seed 0), SGD with momentum 0.9 from one rank's learning rate 0.05. Returns (len(ranks_list),).
    Without ``scale_rate`` every P uses that rate: bigger batches mean fewer steps of the same size, and accuracy
    falls. With it, the linear scaling rule (Goyal et al. 2017): a batch k times larger gets a k times larger rate
    (0.05 P), reached by a gradual warm-up over ``warmup_epochs``. Simulated in one process: P ranks take exactly
    the steps of sequential training with the global batch (lesson 06), so only the global batch matters."""
    from nnlib.lesson02_network.network import Network
    from nnlib.lesson03_training.training import train

    accuracies = []
    for ranks in ranks_list:
        network = Network((inputs.shape[1], 64, 10), seed=0)
        rate = warmup_schedule(0.05, 0.05 * ranks, warmup_epochs) if scale_rate else 0.05
        train(network, inputs, labels, epochs=2, batch_size=32 * ranks, momentum=0.9, learning_rate=rate, seed=0,
              progress=False)
        accuracies.append(network.accuracy(test_inputs, test_labels))
    return np.array(accuracies)


# -- CSV ---------------------------------------------------------------------------------------------

def load_csv(path) -> list[dict]:
    """Records from a CSV of RECORD_FIELDS (main's ``--output``), numbers converted."""
    records = read_csv(path, RECORD_FIELDS, integers=("ranks", "samples", "repeat", "physical_cores"),
                       floats=("epoch_seconds", "load_seconds", "data_seconds", "compute_seconds",
                               "communicate_seconds", "update_seconds", "accuracy"), what="scaling records")
    for row in records:
        row["oversubscribed"] = row["oversubscribed"] in ("True", "true", "1")
    return records


def main(argv=None) -> int:
    """``python -m nnlib scaling``: measure strong and weak scaling, print tables, optionally save CSV."""
    parser = argparse.ArgumentParser(prog="python -m nnlib scaling", description=main.__doc__)
    parser.add_argument("--ranks", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--strong-samples", type=int, default=60000, help="total samples for strong scaling")
    parser.add_argument("--weak-samples", type=int, default=5000, help="samples per rank for weak scaling")
    parser.add_argument("--strategy", default="allreduce", choices=("parameter_server", "reduce_broadcast", "allreduce"),
                        help="lesson 06's ways of combining gradients")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--hidden", type=int, nargs="+", default=[128])
    parser.add_argument("--epochs", type=int, default=3, help="epochs per run (the first is a warm-up)")
    parser.add_argument("--output", help="write every record here as CSV")
    args = parser.parse_args(argv)
    settings = dict(hidden=args.hidden, epochs=args.epochs)
    records = measure(args.ranks, "strong", args.strong_samples, args.strategy, args.repeats, True, **settings)
    records += measure(args.ranks, "weak", args.weak_samples, args.strategy, args.repeats, True, **settings)
    rows = summarize(records)
    for kind in ("strong", "weak"):
        print(f"\n{kind} scaling ({args.strategy}):\n{format_table(rows, kind)}")
    if args.output:
        write_csv(records, args.output, RECORD_FIELDS)
        print(f"\nwrote {len(records)} records to {args.output}")
    return 0


if __name__ == "__main__":
    _worker(json.loads(sys.argv[1]))
