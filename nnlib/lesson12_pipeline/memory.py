"""What one rank holds at the peak of a training step, by kind, counted from the arrays the math needs.

A rank holds a chain of layer widths n_0, n_1, ..., n_L (the whole network, its stage's layers, or its slices
of them), n = sum_l (n_{l-1} n_l + n_l) parameters, and trains on B rows at once; SGD with momentum, values
of s bytes (8 in float64, 4 in float32):

    parameters, gradients, optimizer state (the momentum)    n s each
    activations    B (n_0 + n_1 + ... + n_L) s    a_0 .. a_L, kept from the forward pass for the backward
    backward       B max_l (n_{l+1} + 2 n_l) s    going down to hidden layer l, the chain rule's operands:
                                                  delta_{l+1}, delta_{l+1} @ W_{l+1}.T and a_l (1 - a_l)

On P ranks, a global batch of N rows: data, the whole chain on rank r's split_evenly share; tensor, the chain
(n_0, h_1, n_2, h_3, ...) with each column layer cut to the rank's units, on all N; pipeline, stage s's layers,
with the activations of every micro-batch (N / m rows) whose backward has not run: GPipe all m, 1F1B P - s.

Left out: NumPy's temporaries, the messages a pipeline's sends keep, the whole batch every stage takes, Python's
objects. The count is below what a rank holds; lesson 17 measures how far, with tracemalloc.
"""

from __future__ import annotations

import math

from nnlib.lesson04_collectives.collectives import split_evenly
from nnlib.lesson12_pipeline.pipeline import stage_layers
from nnlib.lesson11_tensor_parallel.tensor import layer_kinds

LESSON = 12


def layer_params(layer_sizes) -> list[int]:
    """n_l = n_{l-1} n_l + n_l (weights and biases) for each layer of the chain ``layer_sizes``."""
    return [n_in * n_out + n_out for n_in, n_out in zip(layer_sizes[:-1], layer_sizes[1:])]


def held_bytes(layer_sizes, rows: int, itemsize: int = 8, alive: int = 1) -> dict:
    """Bytes by kind (the table above) for the chain ``layer_sizes`` trained on micro-batches of ``rows`` rows,
    ``alive`` of them kept at once."""
    parameters, widths = sum(layer_params(layer_sizes)) * itemsize, layer_sizes
    backward = max([widths[l + 1] + 2 * widths[l] for l in range(1, len(widths) - 1)], default=0)
    return {"parameters": parameters, "gradients": parameters, "optimizer state": parameters,
            "activations": alive * rows * sum(widths) * itemsize, "backward": rows * backward * itemsize}


def tensor_parallel_sizes(layer_sizes, ranks: int, rank: int) -> tuple:
    """The chain of widths rank ``rank`` of ``ranks`` holds in a TensorParallelMLP: each column layer's output
    cut to the rank's units (split_evenly), every other width whole: (n_0, h_1, n_2, h_3, ...)."""
    kinds = layer_kinds(len(layer_sizes) - 1)
    return (layer_sizes[0],) + tuple(split_evenly(width, ranks)[0][rank] if kind == "column" else width
                                     for kind, width in zip(kinds, layer_sizes[1:]))


def rank_bytes(kind: str, layer_sizes, batch: int, ranks: int, rank: int, itemsize: int = 8,
               micro_batches: int = 4, schedule: str = "1f1b") -> dict:
    """What rank ``rank`` of ``ranks`` holds by kind, in ``kind`` parallelism ("data", "tensor" or "pipeline",
    ``micro_batches`` m under ``schedule`` "gpipe" or "1f1b"), for a global batch of ``batch`` rows."""
    if kind == "data":
        return held_bytes(layer_sizes, split_evenly(batch, ranks)[0][rank], itemsize)
    if kind == "tensor":
        return held_bytes(tensor_parallel_sizes(layer_sizes, ranks, rank), batch, itemsize)
    if kind != "pipeline":
        raise ValueError(f"kind must be data, tensor or pipeline; got {kind!r}")
    first, stop = stage_layers(len(layer_sizes) - 1, ranks)[rank]
    alive = micro_batches if schedule == "gpipe" else min(ranks - rank, micro_batches)
    return held_bytes(layer_sizes[first:stop + 1], math.ceil(batch / micro_batches), itemsize, alive)


def busiest_rank_bytes(kind: str, layer_sizes, batch: int, ranks: int, itemsize: int = 8,
                       micro_batches: int = 4, schedule: str = "1f1b") -> dict:
    """:func:`rank_bytes` of the rank that holds the most bytes in all."""
    return max((rank_bytes(kind, layer_sizes, batch, ranks, rank, itemsize, micro_batches, schedule)
                for rank in range(ranks)), key=lambda held: sum(held.values()))
