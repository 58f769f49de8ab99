"""Lesson 19's measurements of this machine and of real runs, to put beside the planner's predictions.

measure_compute   one rank's real steps of several networks at several batch sizes, fitted as a fixed cost per layer
                  plus FLOPs / rate (planner.fit_compute), and the optimizer's update rate
measure_link      MPI's Allreduce of each size, read through the ring's formula and fitted as alpha + beta n
timed_steps       the real step of each layout (memory.build_layout, lesson 06's train_parallel), in interleaved
                  rounds: each round's median seconds between consecutive steps
"""

from __future__ import annotations

import time

import numpy as np
from mpi4py import MPI

from nnlib.lesson03_training.optimizers import Adam, SGD
from nnlib.lesson02_network.network import count_parameters
from nnlib.lesson04_collectives.costmodel import Machine, fit_latency_bandwidth, flops_per_sample
from nnlib.lesson04_collectives.timing import median_seconds, time_allreduce
from nnlib.lesson06_data_parallel.data_parallel import shard, train_parallel
from nnlib.lesson10_zero_overlap.sampling import PerRankBatches
from nnlib.lesson12_pipeline.bubbles import random_batch
from nnlib.lesson19_planning.memory import build_layout
from nnlib.lesson19_planning.layout import Layout
from nnlib.lesson19_planning.planner import Compute, fit_compute

LESSON = 19
NOTEBOOKS_ONLY = True  # run by notebook 19 and benchmarks/plan_time.py, imported by no nnlib module

CHAINS = ((784, 256, 10), (784, 64, 64, 64, 10), (256, 32, 32, 32, 32, 10))  # wide and narrow layers to fit on
MESSAGE_SIZES = 2 ** np.arange(3, 22, 3)  # 8 bytes to 2 MB


def update_rate(optimizer: str, values: int = 1 << 18, dtype="float64") -> float:
    """Values per second lesson 03's optimizer updates (the median of repeated steps on ``values`` values)."""
    params, grads = np.ones(values, dtype), np.full(values, 1e-3, dtype)
    step = (Adam(params, 1e-3) if optimizer == "adam" else SGD(params, 1e-3, 0.9 if optimizer == "momentum" else 0))
    return values / median_seconds(lambda: step.step(params, grads), repeats=20)


def measure_compute(rows=(32, 128, 512), optimizer: str = "momentum") -> Compute:
    """Real training steps (:func:`timed_steps`, one rank) of every network of CHAINS at each of ``rows``, the update
    (:func:`update_rate`) taken off, fitted per layer: t / L = t_0 + (F / L) / R, F the step's FLOPs (lesson 04's
    flops_per_sample times the rows), L its layers. t_0 takes in what a step does beside its products (the
    sigmoids, the loss, taking the batch, Python), shared among the layers."""
    rate, flops, seconds = update_rate(optimizer), [], []
    for sizes in CHAINS:
        for count in rows:
            step = np.median(timed_steps(MPI.COMM_SELF, sizes, count, [Layout()], 3, optimizer=optimizer)[Layout()])
            flops.append(flops_per_sample(sizes) * count / (len(sizes) - 1))
            seconds.append((step - count_parameters(sizes) / rate) / (len(sizes) - 1))
    return fit_compute(flops, seconds, rate)


def measure_link(comm) -> Machine:
    """alpha and beta of the link as MPI's own Allreduce uses it, on every rank: the cold Allreduce of each of
    MESSAGE_SIZES (lesson 04's time_allreduce) read through the ring's formula (lesson 09),
    T = 2 (P - 1) (alpha + beta n / P), and fitted as lesson 05 fits one message."""
    if comm.size < 2:
        raise ValueError("a link needs two ranks: run with at least 2")
    seconds = time_allreduce(comm, MESSAGE_SIZES, 20, cold=True)
    return Machine(*fit_latency_bandwidth(MESSAGE_SIZES / comm.size, seconds / (2 * (comm.size - 1))))


def timed_steps(comm, layer_sizes, batch: int, layouts, rounds: int = 5, steps: int = 6,
                optimizer: str = "momentum") -> dict:
    """{layout: [each round's median seconds per step]} on every rank: every layout built once, then in each round
    each trains an epoch of ``steps`` steps in turn (lesson 06's train_parallel on its data axis); a step's time is
    the time between two consecutive steps' ends, on rank 0's clock, the median of the epoch's."""
    inputs, labels = random_batch(layer_sizes, steps * batch, "float64", 0)
    built, times = {}, {layout: [] for layout in layouts}
    for layout in layouts:
        network, strategy, data_comm = build_layout(comm, layer_sizes, layout)
        local = shard(data_comm, *((inputs, labels) if data_comm.rank == 0 else (None, None)))
        built[layout] = (network, strategy, data_comm), local
    settings = dict(epochs=1, learning_rate=0.01, batch_size=batch, batches=PerRankBatches,
                    optimizer="adam" if optimizer == "adam" else "sgd", momentum=0.9 if optimizer == "momentum" else 0)
    for _ in range(rounds):
        for layout in layouts:
            (network, strategy, data_comm), (local_inputs, local_labels, start) = built[layout]
            ends = []
            comm.Barrier()
            train_parallel(data_comm, network, local_inputs, local_labels, num_samples=steps * batch, start=start,
                           strategy=strategy, on_step=lambda *_: ends.append(time.perf_counter()), **settings)
            times[layout].append(comm.bcast(float(np.median(np.diff(ends))) if comm.rank == 0 else None))
    return times
