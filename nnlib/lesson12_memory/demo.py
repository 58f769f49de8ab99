"""Lesson 12's multi-rank runs as one MPI script (notebook 12 runs ``mpiexec -n P python -m
nnlib.lesson12_memory.demo RESULTS.json``): FSDP and gradient accumulation against sequential training
on MNIST, the bytes sent counted on the real calls, what each rank holds over one FSDP step, and the
memory budgets (measured with tracemalloc beside the prediction) of data parallelism, ZeRO, FSDP,
recomputation, accumulation, lesson 09's tensor and pipeline parallelism and mixed precision (alone, and with
FSDP and recomputation, or in bfloat16 with accumulation: data parallelism and FSDP only).
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
from nnlib.lesson05_data_parallel.data_parallel import Allreduce
from nnlib.lesson08_inside_allreduce.zero import ZeRO
from nnlib.lesson09_model_parallel.pipeline import PipelineMLP
from nnlib.lesson09_model_parallel.tensor import TensorParallelMLP
from nnlib.lesson12_memory.accumulation import MicroBatched
from nnlib.lesson12_memory.budget import (measured_peak, measured_step_peak, mixed_precision_bytes, pipeline_bytes,
                                          predicted_bytes, predicted_peak, tensor_parallel_bytes)
from nnlib.lesson12_memory.fsdp import FullySharded, FullyShardedNetwork
from nnlib.lesson12_memory.mixed_precision import MixedPrecision, loss_scaled, low_precision
from nnlib.lesson08_inside_allreduce.counting import CountingComm
from nnlib.lesson12_memory.traffic import allreduce_bytes, fsdp_bytes

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
        gradient_calls = [call for call in counting.calls if call[0] == "Allreduce" and call[1] > 16]
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
    return {"sent": counting.ring_bytes(), "fsdp_formula": fsdp_bytes(SIZES, comm.size, comm.rank),
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


#: Lesson 09's model parallelism and mixed precision, on a network of uneven widths (7 layers: the tensor-parallel
#: column/row pairs and a replicated output layer; 3 stages of 3, 2 and 2 layers on 3 ranks).
PARALLEL_SIZES = (64, 127, 96, 121, 80, 113, 72, 10)
PARALLEL_PLANS = {"tensor parallel (09)": ("tensor", None, 1), "pipeline GPipe, m = 4": ("pipeline", "gpipe", 4),
                  "pipeline 1F1B, m = 4": ("pipeline", "1f1b", 4), "mixed float16": ("mixed", None, 1)}
#: Mixed precision combined, as (strategy, recompute every or schedule, micro-batches, precision): on PARALLEL_SIZES.
MIXED_PLANS = {"mixed FSDP, k = 3": ("fsdp", 3, 1, "float16"),
               "mixed bf16, 4 micro": ("allreduce", None, 4, "bfloat16")}


def parallel_peak(comm, plan, rows: int = 256) -> tuple:
    """(tracemalloc's peak on this rank, the predicted bytes by kind) over steps of ``rows`` samples of ``plan``
    = (kind, schedule, micro_batches) on PARALLEL_SIZES: kind "tensor" (TensorParallelMLP) or "pipeline"
    (PipelineMLP), every rank on the whole batch (lesson 03's train), or "mixed" (MixedPrecision, data parallel:
    its share of the batch). Two steps of a random data set of 2 ``rows`` samples, so that each takes its batch;
    the network's construction (lesson 09's passes through the whole network) is left out of the peak, its
    arrays are not (:func:`measured_step_peak`)."""
    kind, schedule, micro_batches = plan
    rng = np.random.default_rng(0)
    inputs, labels = rng.random((2 * rows, PARALLEL_SIZES[0])), rng.integers(0, PARALLEL_SIZES[-1], 2 * rows)
    settings = dict(epochs=1, learning_rate=0.1, batch_size=rows, momentum=0.9)
    if kind == "mixed":
        return mixed_peak(comm, ("allreduce", None, 1, "float16"), rows)
    if kind == "tensor":
        build, predicted = (lambda: TensorParallelMLP(comm, PARALLEL_SIZES, seed=2),
                            tensor_parallel_bytes(PARALLEL_SIZES, rows, comm.size, comm.rank))
    else:
        build = lambda: PipelineMLP(comm, PARALLEL_SIZES, seed=2, micro_batches=micro_batches, schedule=schedule)
        predicted = pipeline_bytes(PARALLEL_SIZES, rows, comm.size, comm.rank, micro_batches, schedule)
    peak, _ = measured_step_peak(build, lambda network: train(network, inputs, labels, progress=False, **settings))
    return peak, predicted


def mixed_peak(comm, plan, rows: int = 256) -> tuple:
    """(tracemalloc's peak on this rank, the predicted bytes by kind: mixed_precision_bytes) over two data-parallel
    steps of ``rows`` samples (this rank's share) of MixedPrecision on PARALLEL_SIZES, ``plan`` = (strategy
    "allreduce", "zero" (lesson 08's ZeRO-1/2) or "fsdp" (a float32 FullyShardedNetwork), recompute every (None:
    keep all), micro-batches, precision "float16" or "bfloat16"). The network's construction is left out of the peak,
    its arrays not."""
    strategy, every, micro_batches, precision = plan
    low_precision(precision)  # (bfloat16: ml_dtypes imported before the count starts, its module not counted)
    rng = np.random.default_rng(0)
    inputs, labels = rng.random((2 * rows, PARALLEL_SIZES[0])), rng.integers(0, PARALLEL_SIZES[-1], 2 * rows)
    whole = (inputs.astype(np.float32), labels) if comm.rank == 0 else (None, None)
    local_inputs, local_labels, start = shard(comm, *whole)
    sharded = strategy == "fsdp"

    def build():
        network = (FullyShardedNetwork(comm, PARALLEL_SIZES, dtype="float32", seed=2) if sharded
                   else Network(PARALLEL_SIZES, seed=2))
        return MixedPrecision(network, precision=precision, micro_batches=micro_batches, recompute_every=every)

    sync = {"allreduce": Allreduce, "zero": ZeRO, "fsdp": FullySharded}[strategy]
    peak, _ = measured_step_peak(build, lambda mixed: train_parallel(
        comm, mixed, local_inputs, local_labels, num_samples=2 * rows, start=start, strategy=loss_scaled(sync),
        epochs=1, learning_rate=0.1, batch_size=rows, momentum=0.9))
    return peak, mixed_precision_bytes(PARALLEL_SIZES, -(-rows // comm.size), comm.size, comm.rank, *plan)


def budgets(comm) -> dict:
    """Rank 0's measured peak (tracemalloc) and predicted bytes by kind, for a step of 256 samples of each plan
    (PLANS on BUDGET_SIZES, PARALLEL_PLANS and MIXED_PLANS on PARALLEL_SIZES); "within": every rank's verdict,
    measured within 10% of the predicted peak."""
    rng = np.random.default_rng(0)
    whole = (rng.random((256, 64)), rng.integers(0, 10, 256)) if comm.rank == 0 else (None, None)
    shard_of_batch = shard(comm, *whole)
    rows = -(-256 // comm.size)
    measured = {name: (step_peak(comm, plan, shard_of_batch),
                       predicted_bytes(BUDGET_SIZES, rows, comm.size, comm.rank, *plan)) for name, plan in PLANS.items()}
    measured.update({name: parallel_peak(comm, plan) for name, plan in PARALLEL_PLANS.items()})
    measured.update({name: mixed_peak(comm, plan) for name, plan in MIXED_PLANS.items()})
    within = {name: comm.allreduce(int(abs(peak - predicted_peak(held)) <= 0.1 * predicted_peak(held)), op=MPI.MIN)
              for name, (peak, held) in measured.items()}
    return {name: {"measured": peak, "predicted": held, "within": bool(within[name])}
            for name, (peak, held) in measured.items()}


if __name__ == "__main__":
    main(sys.argv[1])
