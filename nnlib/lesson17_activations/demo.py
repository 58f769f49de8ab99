"""Lesson 17's measurements on several ranks, run in notebook 17's cluster (``%%px``) and by tests/mpi/check_memory.py:
each rank's peak memory over a step (tracemalloc) beside the memory model's prediction, for every case below."""

import tracemalloc

from nnlib import Network, train
from nnlib.lesson04_collectives.collectives import split_evenly
from nnlib.lesson06_data_parallel import shard, train_parallel
from nnlib.lesson06_data_parallel.data_parallel import Allreduce
from nnlib.lesson10_zero_overlap.sampling import PerRankBatches
from nnlib.lesson10_zero_overlap.zero import ZeRO
from nnlib.lesson12_pipeline.bubbles import random_batch
from nnlib.lesson12_pipeline.memory import rank_bytes
from nnlib.lesson12_pipeline.pipeline import PipelineMLP
from nnlib.lesson11_tensor_parallel.tensor import TensorParallelMLP
from nnlib.lesson16_sharding.fsdp import FullySharded, FullyShardedNetwork
from nnlib.lesson17_activations.accumulation import MicroBatched
from nnlib.lesson17_activations.budget import predicted_bytes
from nnlib.lesson17_activations.mixed_precision import MixedPrecision

LESSON = 17
NOTEBOOKS_ONLY = True  # run by notebook 17, imported by no nnlib module

BUDGET_SIZES, BUDGET_ROWS = (64, 127, 96, 121, 80, 113, 72, 10), 256  # 127 and 7 layers split unevenly
#: case -> (strategy, recompute every, micro-batches, precision): data parallelism with lessons 10, 16 and 17's savers
DATA_PARALLEL_CASES = {"data parallel": ("allreduce", None, 1, "float64"),
                       "data parallel, float32": ("allreduce", None, 1, "float32"),  # mixed precision's baseline
                       "mixed float16": ("allreduce", None, 1, "float16"),
                       "mixed bf16, 4 micro": ("allreduce", None, 4, "bfloat16"),
                       "ZeRO-1 (10)": ("zero", None, 1, "float64"), "FSDP": ("fsdp", None, 1, "float64"),
                       "FSDP, k = 3": ("fsdp", 3, 1, "float64"), "FSDP, k = 3, 4 micro": ("fsdp", 3, 4, "float64"),
                       "mixed FSDP, k = 3": ("fsdp", 3, 1, "float16")}
#: case -> (kind, schedule, micro-batches): lessons 11 and 12's model parallelism, every rank on the whole batch
MODEL_PARALLEL_CASES = {"tensor parallel (11)": ("tensor", None, 1), "pipeline GPipe, m = 4": ("pipeline", "gpipe", 4),
                        "pipeline 1F1B, m = 4": ("pipeline", "1f1b", 4)}


def measured_peak(build, step) -> tuple:
    """(the most bytes NumPy held while ``step(built)`` ran, counting what ``built = build()`` made and kept, built):
    tracemalloc counts every allocation from its start; its peak is reset once ``build`` returns, so what building
    passed through (lessons 11 and 12's build a Network and keep their part) is left out, what it keeps is not."""
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
    """(tracemalloc's peak on this rank, lesson 12's rank_bytes) over two steps of ``rows`` samples on BUDGET_SIZES,
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
