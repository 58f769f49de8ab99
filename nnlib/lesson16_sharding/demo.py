"""Lesson 16's measurements on several ranks, run in notebook 16's cluster (``%%px``) and by tests/mpi/check_memory.py:
the network and settings its FSDP cells train, the bytes FSDP sends by lesson 09's ring formulas (CountingComm checks
them on the real calls), and Adam's bytes per parameter at each ZeRO stage beside this code's count and the paper's."""

import tracemalloc

from nnlib import Network
from nnlib.lesson02_network.network import count_parameters
from nnlib.lesson03_training.training import Settings
from nnlib.lesson06_data_parallel.data_parallel import Allreduce
from nnlib.lesson09_ring_allreduce.counting import ring_bytes
from nnlib.lesson10_zero_overlap.zero import GradientShardedNetwork, ZeRO, ZeROStage2
from nnlib.lesson12_pipeline.memory import layer_params
from nnlib.lesson16_sharding.fsdp import FullySharded, FullyShardedNetwork

LESSON = 16
NOTEBOOKS_ONLY = True  # run by notebook 16, imported by no nnlib module

SIZES = (784, 48, 32, 10)
SETTINGS = dict(epochs=1, learning_rate=0.5, batch_size=100, momentum=0.9, seed=1)


def fsdp_bytes(layer_sizes, size: int, rank: int, itemsize: int = 8) -> int:
    """One step of ZeRO-3 on a network whose layers each are sharded on their own: for every layer's
    n_l = n_in n_out + n_out parameters, two allgathers and one reduce-scatter, 3 (n_l - c_{l,r}) itemsize
    (data parallelism's one Allreduce: 2 (n - c_r) itemsize, ``2 * ring_bytes(n, P, r)``)."""
    return 3 * sum(ring_bytes(count, size, rank, itemsize) for count in layer_params(layer_sizes))


#: ZeRO's stages as this code has them: 0 lesson 06's Allreduce, 1 and 2 lesson 10's ZeRO and ZeROStage2, 3 FSDP
ZERO_STAGES = {0: Allreduce, 1: ZeRO, 2: ZeROStage2, 3: FullySharded}


def adam_network(comm, stage: int, wrap=None):
    """SIZES' float32 network as ZeRO ``stage`` trains it, in ``wrap`` if given (lesson 17's MixedPrecision)."""
    if stage == 2:
        return GradientShardedNetwork(comm, SIZES, dtype="float32", seed=1)
    network = FullyShardedNetwork(comm, SIZES, dtype="float32", seed=1) if stage == 3 else Network(SIZES, seed=1)
    return network if wrap is None else wrap(network)


def adam_bytes(comm, stage: int, wrap=None) -> dict:
    """Bytes per parameter of SIZES that this rank holds with Adam under ZeRO ``stage`` (float32, or as ``wrap``
    makes it), measured by tracemalloc (after a first build, so that one-time allocations are not counted):
    {"weights and gradients": as the network is built, low copies included; "optimizer state": as it is made}."""
    make = Settings(1, 1e-3, optimizer="adam").optimizer_for(1e-3)
    held = {}
    for _ in range(2):  # (the first build warms up what is made once per process)
        tracemalloc.start()
        began = tracemalloc.get_traced_memory()[0]
        network = adam_network(comm, stage, wrap)
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
