"""Lessons 16 and 17's memory savers: each technique's time per step against plain data parallelism, on 2 ranks.

Run:   make benchmark        (or: .venv/bin/python benchmarks/memory.py [--rounds R] [--samples N] [--steps S])

Starts itself under ``mpiexec -n 2`` (one BLAS thread per rank). Each case trains S steps (default 8) of a
batch of N samples (default 2048, split over the ranks) on random data, after one warm-up step, and
reports the time per step; the R rounds (default 3) interleave every case, so a slow spell of the machine
hits them alike. Printed: the median over the rounds (with its range) and its ratio to the plain
``Allreduce`` on the same network and dtype:

* a wide network, float64: ZeRO stage 1 (lesson 10), FSDP (ZeRO-3),
  gradient accumulation in 4 micro-batches;
* the same in float32, and in mixed precision (float16 storage, float32 products, loss scaling);
* a deep narrow network (16 layers), float64: activation recomputation with a checkpoint every k = 2
  layers and every k = 4 = sqrt(16).

Memory is what these buy (tests/mpi/check_memory.py measures it); this measures what they cost in time.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from statistics import median

WIDE, DEEP = (784, 512, 512, 10), (64,) * 16 + (10,)
#: case -> (network, dtype, technique, baseline case)
CASES = {"allreduce (wide, float64)": (WIDE, "float64", "allreduce", None),
         "ZeRO-1/2 (08)": (WIDE, "float64", "zero", "allreduce (wide, float64)"),
         "FSDP (ZeRO-3)": (WIDE, "float64", "fsdp", "allreduce (wide, float64)"),
         "accumulate k = 4": (WIDE, "float64", "accumulate 4", "allreduce (wide, float64)"),
         "allreduce (wide, float32)": (WIDE, "float32", "allreduce", None),
         "mixed precision float16": (WIDE, "float32", "mixed", "allreduce (wide, float32)"),
         "allreduce (deep, float64)": (DEEP, "float64", "allreduce", None),
         "recompute every k = 2": (DEEP, "float64", "recompute 2", "allreduce (deep, float64)"),
         "recompute every k = 4 = sqrt(L)": (DEEP, "float64", "recompute 4", "allreduce (deep, float64)")}


def build(comm, sizes, dtype: str, technique: str):
    """(network, strategy) of one case: lesson 06's data parallelism, or one of lessons 10, 16 and 17's savers."""
    from nnlib import Network
    from nnlib.lesson06_data_parallel.data_parallel import Allreduce
    from nnlib.lesson10_zero_overlap.zero import ZeRO
    from nnlib.lesson17_activations.accumulation import MicroBatched
    from nnlib.lesson16_sharding.fsdp import FullySharded, FullyShardedNetwork
    from nnlib.lesson17_activations.mixed_precision import MixedPrecision

    if technique == "fsdp":
        return FullyShardedNetwork(comm, sizes, dtype=dtype, seed=1), FullySharded
    network = Network(sizes, dtype=dtype, seed=1)
    if technique == "mixed":
        return MixedPrecision(network), Allreduce
    if technique.startswith("accumulate"):
        return MicroBatched(network, int(technique.split()[1])), "allreduce"
    if technique.startswith("recompute"):
        return MicroBatched(network, 1, int(technique.split()[1])), "allreduce"
    return network, {"zero": ZeRO, "allreduce": "allreduce"}[technique]


def seconds_per_step(comm, case, samples: int, steps: int) -> float:
    """One warm-up step (on a fresh network: the code, the libraries and MPI's buffers warm up), then
    ``steps`` timed steps of ``samples`` samples (over all ranks) on another fresh network, as for every
    technique alike: (seconds per timed step, the slowest rank's; steps a loss scale skipped, 0 if none)."""
    import numpy as np
    from mpi4py import MPI

    from nnlib.lesson06_data_parallel import shard, train_parallel

    sizes, dtype, technique, _ = case
    rng = np.random.default_rng(0)
    inputs, labels = rng.random((samples * steps, sizes[0])).astype(dtype), rng.integers(0, sizes[-1], samples * steps)
    seconds = 0.0
    for count in (samples, samples * steps):  # warm-up, then the timed steps
        local_inputs, local_labels, start = shard(comm, *((inputs[:count], labels[:count]) if comm.rank == 0
                                                          else (None, None)))
        network, strategy = build(comm, sizes, dtype, technique)
        comm.Barrier()
        began = time.perf_counter()
        train_parallel(comm, network, local_inputs, local_labels, num_samples=count, start=start, strategy=strategy,
                       scaler=getattr(network, "scaler", None), epochs=1, learning_rate=0.05, batch_size=samples,
                       momentum=0.9)
        seconds = comm.allreduce(time.perf_counter() - began, op=MPI.MAX)
    scaler = getattr(network, "scaler", None)  # (mixed precision's)
    return seconds / steps, scaler.skipped if scaler else 0  # a skipped step does no update: it is faster


def worker(rounds: int, samples: int, steps: int) -> None:
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    results, skipped = {name: [] for name in CASES}, {name: 0 for name in CASES}
    for _ in range(rounds):  # rounds interleaved
        for name, case in CASES.items():
            seconds, skips = seconds_per_step(comm, case, samples, steps)
            results[name].append(seconds)
            skipped[name] += skips
    if comm.rank == 0:
        report(results, rounds)
        for name, count in skipped.items():
            if "precision" in name:
                print(f"{name}: {count} of {rounds * steps} timed steps skipped by the loss scale (no update)")


def report(results: dict, rounds: int) -> None:
    """Per case: median ms per step (range over the rounds) and the median ratio to its Allreduce baseline."""
    print(f"{'technique':34s} {'network':>18s} {'dtype':>8s} {'ms/step (range)':>24s} {'/ allreduce':>12s}")
    for name, (sizes, dtype, _, baseline) in CASES.items():
        times = results[name]
        ratio = "1 (baseline)" if baseline is None else \
            f"{median(one / base for one, base in zip(times, results[baseline])):.2f}"
        shape = f"{sizes[0]}-{sizes[1]}x{len(sizes) - 2}-{sizes[-1]}"
        print(f"{name:34s} {shape:>18s} {dtype:>8s} {median(times) * 1e3:9.2f} ({min(times) * 1e3:.2f}-"
              f"{max(times) * 1e3:.2f}) {ratio:>12s}")
    print(f"(medians of {rounds} rounds; ratios: the median of the rounds' ratios to the same round's baseline)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="times every case is measured (medians reported)")
    parser.add_argument("--samples", type=int, default=2048, help="samples per step, over both ranks")
    parser.add_argument("--steps", type=int, default=8, help="timed steps per case and round")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.rounds, args.samples, args.steps)
        return
    # one BLAS thread per rank; the ranks started below inherit it (set before they import NumPy)
    os.environ.update({name: "1" for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")})
    from nnlib.course.environment import blas_kernel, describe, mpiexec_path

    machine = describe()
    print(f"machine: {machine['machine']}; {machine['BLAS']}, kernel {blas_kernel()}; {machine['MPI library']}; "
          f"2 ranks; {args.samples} samples a step, {args.steps} steps a case; wide {'-'.join(map(str, WIDE))}, "
          f"deep {'-'.join(map(str, DEEP))}; medians of {args.rounds} rounds\n", flush=True)
    subprocess.run([mpiexec_path(), "-n", "2", sys.executable, __file__, "--worker", "--rounds", str(args.rounds),
                    "--samples", str(args.samples), "--steps", str(args.steps)], check=True, timeout=600 * args.rounds)


if __name__ == "__main__":
    main()
