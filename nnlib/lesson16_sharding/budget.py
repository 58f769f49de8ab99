"""Lesson 16's savers in lesson 11's memory model (nnlib.lesson11_tensor_parallel.memory): what a data-parallel
rank holds at the peak of a step, by kind, counted from the arrays the math needs.

Rank r of P trains on its B rows of the batch; the network has n parameters in layers of n_l; FSDP gives the
rank chunk c_{l,r} of every layer (c = sum_l c_{l,r}), ZeRO a slice of the n values (both: split_evenly):

    ZeRO-1/2 (lesson 10)    the momentum of its slice only
    FSDP                    parameters, gradients and momentum: its chunks, c values each; one layer's parameters
                            whole while it computes, max_l n_l ("gathered"; its whole gradient lives only until
                            its reduce-scatter, before backward's arrays for the layer below come)
    accumulation, k         the activations and backward's arrays of one micro-batch, ceil(B / k) rows
    recomputation, every k  activations: a_0, the checkpoints a_k, a_2k, ..., the output a_L and the longest
                            segment's recomputed a_{s+1} .. a_{t-1} (:func:`activation_widths`)
    mixed precision         per value: low weights 2 + float32 master 4 ("parameters"), low gradient 2 (FSDP's
                            chunks: float32, 4) + float32 gradient 4 ("gradients"), float32 momentum 4; activations,
                            backward's arrays and the gathered layer low, 2 bytes (float16 and bfloat16 alike)

Left out, beside lesson 11's temporaries: a recomputing forward's z, FSDP's float32 copy of a gradient before its
reduce-scatter, mixed precision's float32 copies of what a product reads. Against tracemalloc's whole peak
(nnlib.lesson16_sharding.demo), on notebook 16's cases on 1 to 4 ranks, the error (predicted - measured) / measured
lies within MODEL_ERROR (tests/mpi/check_memory.py; seen: -32% to -0.3%): less is counted than NumPy holds, most
where little is kept (checkpoints, micro-batches, chunks) beside the temporaries. It could count more only where
its maxima (the largest layer, the widest backward) are apart.
"""

from __future__ import annotations

import math

from nnlib.lesson04_collectives.collectives import split_evenly
from nnlib.lesson11_tensor_parallel.memory import held_bytes, layer_params
from nnlib.lesson16_sharding.recompute import checkpoint_layers

LESSON = 16

MODEL_ERROR = (-0.35, 0.05)  # the bounds of (predicted - measured) / measured that tests/mpi/check_memory.py holds
BYTES = {"float64": 8, "float32": 4, "float16": 2, "bfloat16": 2}  # bfloat16 drops mantissa bits, not bytes


def activation_widths(layer_sizes, every: int | None = None) -> int:
    """Values per row of the activations a_1 .. a_L held at the peak of backward (a_0, the batch, aside),
    keeping every ``every``-th layer's input (None: all of them, as every = 1): the checkpoints a_k, a_2k, ..., the
    output a_L and the longest segment [s, t)'s recomputed a_{s+1} .. a_{t-1}."""
    num_layers = len(layer_sizes) - 1
    starts = checkpoint_layers(num_layers, every or 1)
    segments = [sum(layer_sizes[start + 1:stop]) for start, stop in zip(starts, starts[1:] + [num_layers])]
    return sum(layer_sizes[start] for start in starts[1:]) + layer_sizes[-1] + max(segments)


def predicted_bytes(layer_sizes, rows: int, ranks: int = 1, rank: int = 0, strategy: str = "allreduce",
                    every: int | None = None, micro_batches: int = 1, precision: str = "float64") -> dict:
    """What rank ``rank`` of ``ranks`` holds by kind over a step on its ``rows`` rows: ``strategy`` "allreduce",
    "zero" or "fsdp"; checkpoints every ``every`` layers; ``micro_batches`` k; ``precision`` float64 or float32
    (plain training), float16 or bfloat16 (mixed precision, float32 master weights)."""
    if strategy not in ("allreduce", "zero", "fsdp") or precision not in BYTES:
        raise ValueError(f"strategy allreduce, zero or fsdp, precision one of {', '.join(BYTES)}; got {strategy!r}, "
                         f"{precision!r}")
    itemsize, low = BYTES[precision], precision in ("float16", "bfloat16")
    micro_rows, layers, sharded = math.ceil(rows / micro_batches), layer_params(layer_sizes), strategy == "fsdp"
    held = held_bytes(layer_sizes, micro_rows, itemsize)  # lesson 11's: the whole network, one micro-batch
    held["activations"] = itemsize * micro_rows * (layer_sizes[0] + activation_widths(layer_sizes, every))
    count = sum(split_evenly(size, ranks)[0][rank] for size in layers) if sharded else sum(layers)
    updated = split_evenly(count, ranks)[0][rank] if strategy == "zero" else count
    held.update({"parameters": itemsize * count, "gradients": itemsize * count, "optimizer state": itemsize * updated,
                 "gathered": itemsize * max(layers) * sharded})
    if low:  # the float32 master, the float32 gradient (and FSDP's float32 chunks of the low one), the momentum
        held["parameters"] += 4 * count
        held["gradients"] += 4 * count + (4 - itemsize) * count * sharded
        held["optimizer state"] = 4 * updated
    return held
