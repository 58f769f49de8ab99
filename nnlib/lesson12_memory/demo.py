"""Lesson 12's multi-rank runs as one MPI script (notebook 12 runs ``mpiexec -n P python -m
nnlib.lesson12_memory.demo RESULTS.json``): FSDP and gradient accumulation against sequential training
on MNIST, the bytes sent counted on the real calls, and what each rank holds over one FSDP step.
Rank 0 writes the results as JSON.
"""

from __future__ import annotations

import json
import sys

import numpy as np
from mpi4py import MPI

from nnlib import Network, train
from nnlib.lesson01_mnist import data
from nnlib.lesson05_data_parallel import shard, train_parallel
from nnlib.lesson08_inside_allreduce.zero import ZeRO
from nnlib.lesson12_memory.accumulation import MicroBatched
from nnlib.lesson12_memory.budget import measured_peak, predicted_bytes
from nnlib.lesson12_memory.fsdp import FullySharded, FullyShardedNetwork
from nnlib.lesson12_memory.traffic import CountingComm, allreduce_bytes, fsdp_bytes

LESSON = 12
NOTEBOOKS_ONLY = True  # run by notebook 12, imported by no nnlib module

SIZES = (784, 48, 32, 10)
SETTINGS = dict(epochs=1, learning_rate=0.5, batch_size=100, momentum=0.9, seed=1)


def relative_error(params, expected) -> float:
    return float(np.abs(params - expected).max() / np.abs(expected).max())


def main(path: str, samples: int = 2000) -> None:
    comm = MPI.COMM_WORLD
    inputs = labels = None
    if comm.rank == 0:
        mnist = data.load_mnist(progress=False)
        inputs, labels = data.scale_pixels(mnist.train_images[:samples]).astype(np.float64), \
            mnist.train_labels[:samples].astype(np.int64)
    local_inputs, local_labels, start = shard(comm, inputs, labels)
    expected = Network(SIZES, dtype="float64", seed=2)
    if comm.rank == 0:
        train(expected, inputs, labels, progress=False, **SETTINGS)
    expected = comm.bcast(expected.params if comm.rank == 0 else None)
    results = {}
    for name, network, strategy in (("fsdp", FullyShardedNetwork(comm, SIZES, seed=2), FullySharded),
                                    ("accumulate 4", MicroBatched(Network(SIZES, dtype="float64", seed=2), 4),
                                     "allreduce")):
        counting = CountingComm(comm)
        history = train_parallel(counting, network, local_inputs, local_labels, num_samples=samples, start=start,
                                 strategy=strategy, **SETTINGS)
        params = network.full_params() if name == "fsdp" else network.params
        gradient_calls = [call for call in counting.calls if call[0] == "Allreduce" and call[1] > 2]
        results[name] = {"error": relative_error(params, expected), "steps": history.steps,
                         "gradient_allreduces": len(gradient_calls)}
    results["ranks"] = comm.gather(one_fsdp_step(comm, local_inputs, local_labels, samples))
    results["budgets"] = budgets(comm)
    if comm.rank == 0:
        with open(path, "w") as file:
            json.dump(results, file)


def one_fsdp_step(comm, local_inputs, local_labels, samples: int) -> dict:
    """One FSDP step on a fresh network with a counting communicator: bytes sent, formulas, what is held."""
    counting = CountingComm(comm)
    network = FullyShardedNetwork(counting, SIZES, seed=2)
    network.log.recording = True
    network.loss_and_gradient(local_inputs[:100], local_labels[:100], normalizer=100 * comm.size)
    total = network.total_params
    return {"sent": counting.sent_bytes(), "fsdp_formula": fsdp_bytes(SIZES, comm.size, comm.rank),
            "allreduce_formula": allreduce_bytes(total, comm.size, comm.rank), "held_params": int(network.params.size),
            "total_params": total, "events": network.log.events}


BUDGET_SIZES = (64,) + (128,) * 8 + (10,)
PLANS = {"data parallel": ("allreduce", None, 1), "ZeRO-1 (08)": ("zero", None, 1), "FSDP": ("fsdp", None, 1),
         "FSDP, k = 3": ("fsdp", 3, 1), "FSDP, k = 3, 4 micro": ("fsdp", 3, 4)}


def step_peak(comm, plan, shard_of_batch, samples: int = 256) -> int:
    """tracemalloc's peak on this rank over building BUDGET_SIZES's network for ``plan`` = (strategy, every,
    micro_batches) and one step of ``samples`` rows; shard_of_batch: this rank's (inputs, labels, start)."""
    strategy, every, micro_batches = plan
    syncs = {"allreduce": "allreduce", "zero": ZeRO, "fsdp": FullySharded}
    local_inputs, local_labels, start = shard_of_batch

    def work():
        network = (FullyShardedNetwork(comm, BUDGET_SIZES) if strategy == "fsdp"
                   else Network(BUDGET_SIZES, dtype="float64"))
        train_parallel(comm, MicroBatched(network, micro_batches, every), local_inputs, local_labels,
                       num_samples=samples, start=start, strategy=syncs[strategy], epochs=1, learning_rate=0.1,
                       batch_size=samples, momentum=0.9)

    return measured_peak(work)[0]


def budgets(comm) -> dict:
    """Rank 0's measured peak (tracemalloc) and predicted bytes by kind, for one step of 256 samples of each plan."""
    rng = np.random.default_rng(0)
    whole = (rng.random((256, 64)), rng.integers(0, 10, 256)) if comm.rank == 0 else (None, None)
    shard_of_batch = shard(comm, *whole)
    rows = -(-256 // comm.size)
    return {name: {"measured": step_peak(comm, plan, shard_of_batch),
                   "predicted": predicted_bytes(BUDGET_SIZES, rows, comm.size, comm.rank, *plan)}
            for name, plan in PLANS.items()}


if __name__ == "__main__":
    main(sys.argv[1])
