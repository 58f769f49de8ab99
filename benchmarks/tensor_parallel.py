"""Tensor parallelism on 2 ranks against 1: the time of a training step, and the speedup.

Run:   make benchmark        (or: .venv/bin/python benchmarks/tensor_parallel.py [--rounds R])

Starts itself under ``mpiexec -n 1`` and ``mpiexec -n 2`` in turn, R rounds (default 3), one BLAS
thread per rank. Each run builds nnlib.lesson11_tensor_parallel.tensor.TensorParallelMLP for each network below,
float32, on a fixed random batch of 512 digits-sized inputs, takes 3 warm-up steps and then times
15 steps (loss_and_gradient, then SGD with momentum): a step's time is the slowest rank's, and a
run reports the median step (the network's Allreduces run under the watchdog's default deadline,
nnlib.course.deadline.watch, as in a batch job). The one-rank run also times the sequential nnlib.lesson02_network.network.Network,
which the one-rank tensor-parallel network should match. The table gives the medians over the
rounds and the speedup t(1 rank) / t(2 ranks).

The messages are small here (batch x 10 numbers forward for 784-4096-10; for 784-2048-2048-10 one
batch x 2048 Allreduce backward too), so the computation decides: on P cores the speedup can
approach P.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

os.environ.update({name: "1" for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")})

NETWORKS = {"784-4096-10": (784, 4096, 10), "784-2048-2048-10": (784, 2048, 2048, 10)}
BATCH = 512
WARM_UP, STEPS = 3, 15


def median_step_seconds(comm, model, inputs, labels) -> float:
    """The median over STEPS of the slowest rank's time for one step (after WARM_UP untimed steps)."""
    from mpi4py import MPI

    from nnlib.lesson03_training.optimizers import SGD

    optimizer = SGD(model.params, learning_rate=0.01, momentum=0.9, xp=model.xp)
    seconds = []
    for step in range(WARM_UP + STEPS):
        comm.Barrier()
        start = time.perf_counter()
        model.loss_and_gradient(inputs, labels)
        optimizer.step(model.params, model.grads)
        elapsed = comm.allreduce(time.perf_counter() - start, op=MPI.MAX)
        if step >= WARM_UP:
            seconds.append(elapsed)
    return statistics.median(seconds)


def worker() -> None:
    import numpy as np
    from mpi4py import MPI

    from nnlib.lesson02_network.network import Network
    from nnlib.lesson11_tensor_parallel.tensor import TensorParallelMLP
    from nnlib.course.deadline import watch

    comm = MPI.COMM_WORLD
    generator = np.random.default_rng(0)
    inputs = generator.random((BATCH, 784), dtype=np.float32)
    labels = generator.integers(0, 10, BATCH)
    for name, sizes in NETWORKS.items():
        tensor = median_step_seconds(comm, TensorParallelMLP(watch(comm), sizes, dtype="float32"), inputs, labels)
        if comm.size == 1:
            sequential = median_step_seconds(comm, Network(sizes, dtype="float32"), inputs, labels)
            print(f"{name} tensor {tensor:.6f} sequential {sequential:.6f}", flush=True)
        elif comm.rank == 0:
            print(f"{name} tensor {tensor:.6f}", flush=True)


def run(ranks: int) -> dict:
    """{network: {"tensor": s, "sequential": s (1 rank only)}} from one mpiexec run."""
    from nnlib.course.environment import mpiexec_path

    lines = subprocess.run([mpiexec_path(), "-n", str(ranks), sys.executable, __file__, "--worker"], check=True,
                           stdout=subprocess.PIPE, text=True, timeout=600).stdout.splitlines()  # errors show
    results = {}
    for line in lines:
        name, *pairs = line.split()
        results[name] = {pairs[i]: float(pairs[i + 1]) for i in range(0, len(pairs), 2)}
    return results


def main() -> None:
    if "--worker" in sys.argv:
        worker()
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="interleaved 1-rank and 2-rank runs")
    rounds = parser.parse_args().rounds
    from nnlib.course.environment import describe

    machine = describe()
    print(f"machine: {machine['machine']}; {machine['BLAS']}, kernel {machine['BLAS kernel']}; {machine['MPI library']}")
    print(f"float32, batch {BATCH}, 1 BLAS thread per rank; medians of {rounds} rounds of {STEPS} steps\n")
    one, two = [], []
    for _ in range(rounds):
        one.append(run(1))
        two.append(run(2))
    print(f"{'network':18s} {'sequential ms':>13s} {'1 rank ms':>10s} {'2 ranks ms':>10s} {'speedup':>8s}  "
          "(speedup per round)")
    for name in NETWORKS:
        sequential = statistics.median(result[name]["sequential"] for result in one)
        single = statistics.median(result[name]["tensor"] for result in one)
        double = statistics.median(result[name]["tensor"] for result in two)
        per_round = ", ".join(f"{a[name]['tensor'] / b[name]['tensor']:.2f}" for a, b in zip(one, two))
        print(f"{name:18s} {sequential * 1e3:13.1f} {single * 1e3:10.1f} {double * 1e3:10.1f} "
              f"{single / double:8.2f}  ({per_round})")


if __name__ == "__main__":
    main()
