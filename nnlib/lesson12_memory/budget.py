"""A rank's memory over a training step: predicted from the arrays' sizes, measured with tracemalloc.

What one rank holds, in bytes (itemsize s: 8 for float64), for a network of n parameters in layers of
n_l = n_in n_out + n_out, on P ranks, with rank r's chunks c_{l,r}:

    parameters        n s                 (FSDP: sum_l c_{l,r} s, its chunks)
    gradients         n s                 (FSDP: the same chunks)
    optimizer state   n s, the momentum   (lesson 08's ZeRO: its slice; FSDP: its chunks)
    gathered          FSDP only: the largest layer's whole [W_l, b_l] and its whole gradient, 2 max_l n_l s
    activations       B_m (n_1 + ... + n_L) s for a micro-batch of B_m rows, or with checkpoints every k
                      layers the checkpoints', the output's and the longest recomputed segment's
    temporaries       the batch's rows (B n_0 s), a few arrays of B_m (widest layer) s in backward
                      (delta, dJ/da, a (1 - a), ...: TEMPORARY_ARRAYS, as measured; tests/test_memory.py
                      bounds them by 7 with tracemalloc) and the largest layer's a_in.T @ delta, max_l n_l s
    update            the update's eta g (as many values as the rank updates; FSDP: one layer's chunk at a
                      time), once backward's arrays are freed

The peak is what stays (parameters, gradients, optimizer state) plus the larger of the two phases.

``tracemalloc`` counts what NumPy allocates (its arrays' buffers), so :func:`measured_peak` measures the
same things on the real run: tests/mpi/check_memory.py holds each within 10% of the prediction.
"""

from __future__ import annotations

import math
import tracemalloc

from nnlib.lesson08_inside_allreduce.allreduce import chunk_bounds
from nnlib.lesson12_memory.recompute import checkpoint_layers

LESSON = 12

TEMPORARY_ARRAYS = 3


def activation_bytes(layer_sizes, rows: int, every: int | None = None, itemsize: int = 8) -> int:
    """Activations a_1 .. a_L held at the peak of backward for ``rows`` rows (every=k: checkpoints every k layers)."""
    widths, num_layers = layer_sizes[1:], len(layer_sizes) - 1
    if every is None:
        return rows * sum(widths) * itemsize
    starts = checkpoint_layers(num_layers, every)
    kept = sum(layer_sizes[start] for start in starts if start) + layer_sizes[-1]
    segments = [sum(layer_sizes[start + 1:stop]) for start, stop in zip(starts, starts[1:] + [num_layers])]
    return rows * (kept + max(segments)) * itemsize


def predicted_bytes(layer_sizes, rows: int, ranks: int = 1, rank: int = 0, strategy: str = "allreduce",
                    every: int | None = None, micro_batches: int = 1) -> dict:
    """What rank ``rank`` of ``ranks`` holds, by kind (float64, SGD with momentum), for a step on ``rows`` rows
    of its own. strategy: "allreduce" (replicated), "zero" (lesson 08) or "fsdp". "update" is the update's
    temporary (eta g over the part this rank updates), alive only when backward's arrays are gone."""
    layers = [n_in * n_out + n_out for n_in, n_out in zip(layer_sizes[:-1], layer_sizes[1:])]
    whole = 8 * sum(layers)
    mine = [8 * chunk_bounds(size, ranks)[0][rank] for size in layers]
    updated = {"allreduce": whole, "zero": 8 * chunk_bounds(sum(layers), ranks)[0][rank], "fsdp": sum(mine)}[strategy]
    micro_rows = math.ceil(rows / micro_batches)
    return {"parameters": sum(mine) if strategy == "fsdp" else whole,
            "gradients": sum(mine) if strategy == "fsdp" else whole,
            "optimizer state": updated,
            "gathered": 2 * 8 * max(layers) if strategy == "fsdp" else 0,
            "activations": activation_bytes(layer_sizes, micro_rows, every),
            "temporaries": 8 * (rows * layer_sizes[0] + TEMPORARY_ARRAYS * micro_rows * max(layer_sizes[1:])
                                + max(layers)),
            "update": max(mine) if strategy == "fsdp" else updated}  # FSDP updates layer by layer


def predicted_peak(held: dict) -> int:
    """The peak of :func:`predicted_bytes`: what stays, plus the larger of backward's arrays and the update's."""
    backward = held["gathered"] + held["activations"] + held["temporaries"]
    return held["parameters"] + held["gradients"] + held["optimizer state"] + max(backward, held["update"])


def measured_peak(work) -> tuple:
    """(the peak bytes NumPy held while ``work()`` ran, counted from its start, and what work returned)."""
    tracemalloc.start()
    try:
        result = work()
        return tracemalloc.get_traced_memory()[1], result
    finally:
        tracemalloc.stop()
