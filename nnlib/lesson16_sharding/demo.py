"""Lesson 16's measurements on several ranks, run in notebook 16's cluster (``%%px``) and by
tests/mpi/check_memory.py: the network and settings its FSDP and accumulation cells train (SIZES, SETTINGS), the
bytes FSDP sends by lesson 09's ring formulas (for CountingComm to check on the real MPI calls), and each rank's
peak memory over a step (tracemalloc) beside the memory model's prediction, for every case below.
"""

from __future__ import annotations

import tracemalloc

from nnlib import Network, train
from nnlib.lesson02_network.network import count_parameters
from nnlib.lesson03_training.training import Settings
from nnlib.lesson04_collectives.collectives import split_evenly
from nnlib.lesson06_data_parallel import shard, train_parallel
from nnlib.lesson06_data_parallel.data_parallel import Allreduce
from nnlib.lesson09_ring_allreduce.counting import ring_bytes
from nnlib.lesson10_zero_overlap.sampling import PerRankBatches
from nnlib.lesson10_zero_overlap.zero import GradientShardedNetwork, ZeRO, ZeROStage2
from nnlib.lesson11_tensor_parallel.bubbles import random_batch
from nnlib.lesson11_tensor_parallel.memory import layer_params, rank_bytes
from nnlib.lesson11_tensor_parallel.pipeline import PipelineMLP
from nnlib.lesson11_tensor_parallel.tensor import TensorParallelMLP
from nnlib.lesson16_sharding.accumulation import MicroBatched
from nnlib.lesson16_sharding.budget import predicted_bytes
from nnlib.lesson16_sharding.fsdp import FullySharded, FullyShardedNetwork
from nnlib.lesson16_sharding.mixed_precision import MixedPrecision

LESSON = 16
NOTEBOOKS_ONLY = True  # run by notebook 16, imported by no nnlib module

SIZES = (784, 48, 32, 10)
SETTINGS = dict(epochs=1, learning_rate=0.5, batch_size=100, momentum=0.9, seed=1)


def fsdp_bytes(layer_sizes, size: int, rank: int, itemsize: int = 8) -> int:
    """One step of ZeRO-3 on a network whose layers each are sharded on their own: for every layer's
    n_l = n_in n_out + n_out parameters, two allgathers and one reduce-scatter, 3 (n_l - c_{l,r}) itemsize
    (data parallelism's one Allreduce: 2 (n - c_r) itemsize, ``2 * ring_bytes(n, P, r)``)."""
    return 3 * sum(ring_bytes(count, size, rank, itemsize) for count in layer_params(layer_sizes))


BUDGET_SIZES, BUDGET_ROWS = (64, 127, 96, 121, 80, 113, 72, 10), 256  # uneven widths: tensor parallelism's 127
#: hidden units do not split evenly, 7 layers make uneven pipeline stages
#: case -> (strategy, recompute every, micro-batches, precision): data parallelism with lesson 10's and 16's savers
DATA_PARALLEL_CASES = {"data parallel": ("allreduce", None, 1, "float64"),
                       "data parallel, float32": ("allreduce", None, 1, "float32"),  # mixed precision's baseline
                       "mixed float16": ("allreduce", None, 1, "float16"),
                       "mixed bf16, 4 micro": ("allreduce", None, 4, "bfloat16"),
                       "ZeRO-1 (08)": ("zero", None, 1, "float64"), "FSDP": ("fsdp", None, 1, "float64"),
                       "FSDP, k = 3": ("fsdp", 3, 1, "float64"), "FSDP, k = 3, 4 micro": ("fsdp", 3, 4, "float64"),
                       "mixed FSDP, k = 3": ("fsdp", 3, 1, "float16")}
#: case -> (kind, schedule, micro-batches): lesson 11's model parallelism, every rank on the whole batch
MODEL_PARALLEL_CASES = {"tensor parallel (09)": ("tensor", None, 1), "pipeline GPipe, m = 4": ("pipeline", "gpipe", 4),
                        "pipeline 1F1B, m = 4": ("pipeline", "1f1b", 4)}


def measured_peak(build, step) -> tuple:
    """(the most bytes NumPy held while ``step(built)`` ran, counting what ``built = build()`` made and kept, built):
    tracemalloc counts every allocation from its start; its peak is reset once ``build`` returns, so what building
    passed through (lesson 11's build a Network and keep their part) is left out, what it keeps is not."""
    tracemalloc.start()
    try:
        built = build()
        tracemalloc.reset_peak()
        step(built)
        return tracemalloc.get_traced_memory()[1], built
    finally:
        tracemalloc.stop()


def data_parallel_peak(comm, case, rows: int = BUDGET_ROWS) -> tuple:
    """(tracemalloc's peak on this rank, predicted_bytes) over two data-parallel steps of ``rows`` samples on
    BUDGET_SIZES: ``case`` = (strategy, recompute every, micro-batches, precision). Each rank takes its
    split_evenly share of every batch (lesson 10's PerRankBatches), the rows the prediction is for."""
    strategy, every, micro_batches, precision = case
    mixed = precision in ("float16", "bfloat16")
    dtype = "float32" if mixed else precision
    batches = random_batch(BUDGET_SIZES, 2 * rows, dtype, 0)  # on every rank: NumPy's generators set up uncounted
    local_inputs, local_labels, start = shard(comm, *(batches if comm.rank == 0 else (None, None)))

    def build():
        network = (FullyShardedNetwork(comm, BUDGET_SIZES, dtype=dtype, seed=2) if strategy == "fsdp"
                   else Network(BUDGET_SIZES, dtype=dtype, seed=2))
        return (MixedPrecision(network, precision=precision, micro_batches=micro_batches, recompute_every=every)
                if mixed else MicroBatched(network, micro_batches, every))

    sync = {"allreduce": Allreduce, "zero": ZeRO, "fsdp": FullySharded}[strategy]
    peak, _ = measured_peak(build, lambda network: train_parallel(
        comm, network, local_inputs, local_labels, num_samples=2 * rows, start=start,
        strategy=sync, scaler=network.scaler if mixed else None, batches=PerRankBatches, epochs=1, learning_rate=0.1,
        batch_size=rows, momentum=0.9))
    mine = split_evenly(rows, comm.size)[0][comm.rank]
    return peak, predicted_bytes(BUDGET_SIZES, mine, comm.size, comm.rank, *case)


def model_parallel_peak(comm, case, rows: int = BUDGET_ROWS) -> tuple:
    """(tracemalloc's peak on this rank, lesson 11's rank_bytes) over two steps of ``rows`` samples on BUDGET_SIZES,
    every rank on the whole batch (lesson 03's train): ``case`` = ("tensor", None, 1) for a TensorParallelMLP,
    ("pipeline", schedule, micro-batches) for a PipelineMLP stage."""
    kind, schedule, micro_batches = case
    inputs, labels = random_batch(BUDGET_SIZES, 2 * rows, "float64", 0)  # (two global batches)
    build = ((lambda: TensorParallelMLP(comm, BUDGET_SIZES, seed=2)) if kind == "tensor" else
             (lambda: PipelineMLP(comm, BUDGET_SIZES, seed=2, micro_batches=micro_batches, schedule=schedule)))
    peak, _ = measured_peak(build, lambda network: train(network, inputs, labels, progress=False, epochs=1,
                                                          learning_rate=0.1, batch_size=rows, momentum=0.9))
    return peak, rank_bytes(kind, BUDGET_SIZES, rows, comm.size, comm.rank, 8, micro_batches, schedule or "1f1b")


def budgets(comm) -> dict:
    """Rank 0's measured peak (tracemalloc) and predicted bytes by kind for every case, and every rank's error
    (predicted - measured) / measured."""
    measured = {name: data_parallel_peak(comm, case) for name, case in DATA_PARALLEL_CASES.items()}
    measured.update({name: model_parallel_peak(comm, case) for name, case in MODEL_PARALLEL_CASES.items()})
    return {name: {"measured": peak, "predicted": held, "errors": comm.allgather((sum(held.values()) - peak) / peak)}
            for name, (peak, held) in measured.items()}


#: ZeRO's stages as this code has them: 0 lesson 06's Allreduce, 1 and 2 lesson 10's ZeRO and ZeROStage2, 3 FSDP
ZERO_STAGES = {0: Allreduce, 1: ZeRO, 2: ZeROStage2, 3: FullySharded}


def adam_network(comm, stage: int, precision: str):
    """SIZES' network as ZeRO ``stage`` trains it, float32 or mixed ``precision`` (stage 2: float32 only)."""
    if stage == 2:
        return GradientShardedNetwork(comm, SIZES, dtype="float32", seed=1)
    network = FullyShardedNetwork(comm, SIZES, dtype="float32", seed=1) if stage == 3 else Network(SIZES, seed=1)
    return network if precision == "float32" else MixedPrecision(network, precision=precision)


def adam_bytes(comm, stage: int, precision: str = "float32") -> dict:
    """Bytes per parameter of SIZES that this rank holds with Adam under ZeRO ``stage``, in float32 or mixed
    ``precision``, measured by tracemalloc (after a first build, so that one-time allocations are not counted):
    {"weights and gradients": as the network is built, low copies included; "optimizer state": as it is made}."""
    make = Settings(1, 1e-3, optimizer="adam").optimizer_for(1e-3)
    held = {}
    for _ in range(2):  # (the first build warms up what is made once per process)
        tracemalloc.start()
        began = tracemalloc.get_traced_memory()[0]
        network = adam_network(comm, stage, precision)
        built = tracemalloc.get_traced_memory()[0]
        optimizer = ZERO_STAGES[stage](comm, network).optimizer(network, make)  # (kept while it is measured)
        held = {"weights and gradients": built - began, "optimizer state": tracemalloc.get_traced_memory()[0] - built}
        del optimizer
        tracemalloc.stop()
    return {kind: held[kind] / count_parameters(SIZES) for kind in held}


def adam_model(stage: int, precision: str, ranks: int) -> dict:
    """This code's bytes per parameter for :func:`adam_bytes` (float32: weights 4, gradient 4; mixed adds the low
    weights and gradient, 2 + 2, and FSDP keeps the low gradient's chunks in float32, 4), and the ZeRO paper's total
    with K = 12 (float16 weights and gradients, 2 + 2; float32 master, momentum and variance, K = 12)."""
    weights, gradients = (4, 4) if precision == "float32" else (4 + 2, 4 + (4 if stage == 3 else 2))
    paper = [2 + 2 + 12, 2 + 2 + 12 / ranks, 2 + (2 + 12) / ranks, (2 + 2 + 12) / ranks][stage]
    held = weights / (ranks if stage == 3 else 1) + gradients / (ranks if stage >= 2 else 1)  # (stages 3 and 2 shard)
    return {"weights and gradients": held, "optimizer state": 8 / (ranks if stage else 1), "ZeRO paper's total": paper}
