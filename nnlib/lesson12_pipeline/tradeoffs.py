"""When each kind of parallelism wins: bytes, memory and time per rank for one training step.

A network of widths n_0, ..., n_L (W weights and biases), a global batch of N, P ranks. Per step a rank hands MPI:
data      the whole gradient, W values, in one Allreduce (and holds the whole network, N/P samples);
tensor    per column/row pair an Allreduce of its (N, n_out) output, and backward one of its (N, n_in) input
          gradient unless the pair comes first (lesson 11); it holds 1/P of each split layer;
pipeline  its stage's output activations (N, n_boundary) forward and the input gradient back (Isend); it holds
          its own layers and the whole batch (GPipe) or min(P - s, m) of m micro-batches (1F1B).
"""

from __future__ import annotations

from itertools import product

import numpy as np

from nnlib.lesson02_network.network import count_parameters
from nnlib.lesson04_collectives.costmodel import (Machine, flops_per_sample, predicted_time, ring_allreduce_time,
                                                  step_time)
from nnlib.lesson12_pipeline.bubbles import bubble_fraction
from nnlib.lesson12_pipeline.memory import busiest_rank_bytes
from nnlib.lesson12_pipeline.pipeline import stage_layers
from nnlib.lesson11_tensor_parallel.tensor import layer_kinds

LESSON = 12


KINDS = ("data", "tensor", "pipeline")


def check_pipeline_depth(kind: str, layer_sizes, ranks: int) -> None:
    """A pipeline needs a layer per stage: ValueError otherwise (as pipeline.PipelineMLP)."""
    if kind == "pipeline" and ranks > len(layer_sizes) - 1:
        raise ValueError(f"a pipeline of {ranks} stages needs at least {ranks} weight layers; "
                         f"this network has {len(layer_sizes) - 1}")


def allreduce_messages(kind: str, layer_sizes, batch: int, ranks: int, itemsize: int = 4) -> list[int]:
    """The bytes of each Allreduce one step makes, in the order the step makes them. Data: the gradient; tensor:
    each row layer's (N, n_out) partial sums (forward) and each column layer's (N, n_in) input gradient (backward,
    but the first's); pipeline: none."""
    if kind == "data":
        return [count_parameters(layer_sizes) * itemsize]
    if kind == "pipeline":
        return []
    if kind != "tensor":
        raise ValueError(f"kind must be one of {', '.join(KINDS)}; got {kind!r}")
    shapes = list(zip(layer_sizes[:-1], layer_sizes[1:]))
    return [batch * (n_out if split == "row" else n_in) * itemsize
            for layer, ((n_in, n_out), split) in enumerate(zip(shapes, layer_kinds(len(shapes))))
            if split == "row" or (split == "column" and layer > 0)]


def handed_bytes(kind: str, layer_sizes, batch: int, ranks: int, itemsize: int = 4) -> dict:
    """What one step hands to MPI on the busiest rank: {"collective": the bytes given to Allreduce
    (:func:`allreduce_messages`), "point_to_point": the bytes a pipeline stage sends, forward and backward}
    (besides the pipeline's 16-byte broadcast of the loss at the end of each step)."""
    check_pipeline_depth(kind, layer_sizes, ranks)
    if kind != "pipeline":
        return {"collective": sum(allreduce_messages(kind, layer_sizes, batch, ranks, itemsize)), "point_to_point": 0}
    sent = [batch * ((layer_sizes[stop] if stage < ranks - 1 else 0) + (layer_sizes[first] if stage > 0 else 0))
            for stage, (first, stop) in enumerate(stage_layers(len(layer_sizes) - 1, ranks))]  # forward + backward
    return {"collective": 0, "point_to_point": max(sent) * itemsize}


def parallel_step_time(kind: str, layer_sizes, batch: int, ranks: int, machine: Machine, itemsize: int = 4,
                       micro_batches: int = 4) -> float:
    """Predicted seconds per step of ``kind`` parallelism on P ranks, with lesson 04's costmodel formulas:

        T = F N / rate / (P (1 - bubble)) + communication

    F: costmodel.flops_per_sample; rate: machine.flops_per_second. Communication: a ring
    Allreduce (machine.alpha, machine.beta) for each of :func:`allreduce_messages`; for a
    pipeline, the busiest stage's point-to-point bytes in 2 m messages (m forward, m backward),
    each alpha + n beta, and the bubble (P - 1) / (m + P - 1).
    """
    compute = flops_per_sample(layer_sizes) * batch / machine.flops_per_second
    if ranks == 1:
        return float(step_time(1, compute))
    if kind == "pipeline":
        messages = 2 * micro_batches
        sent = handed_bytes(kind, layer_sizes, batch, ranks, itemsize)["point_to_point"]
        communication = messages * predicted_time(sent / messages, machine.alpha, machine.beta)
        return float(step_time(ranks, compute, communication, bubble=bubble_fraction(ranks, micro_batches)))
    communication = sum(ring_allreduce_time(n_bytes, ranks, machine.alpha, machine.beta)
                        for n_bytes in allreduce_messages(kind, layer_sizes, batch, ranks, itemsize))
    return float(step_time(ranks, compute, communication))


def fastest(layer_sizes_of, hidden_sizes, rank_counts, batch: int, alpha: float, beta: float,
            flops_per_second: float, micro_batches: int = 8):
    """For each (hidden size, ranks): the index in KINDS of the fastest predicted step, and all the times.

    Returns (choice (hidden sizes, ranks) ints, times (hidden sizes, ranks, kinds) seconds; inf where
    a pipeline has more stages than layers).
    """
    machine = Machine(alpha, beta, flops_per_second)
    times = np.full((len(hidden_sizes), len(rank_counts), len(KINDS)), np.inf)
    for (row, hidden), (column, ranks), (index, kind) in product(enumerate(hidden_sizes), enumerate(rank_counts),
                                                                 enumerate(KINDS)):
        if kind != "pipeline" or ranks <= len(layer_sizes_of(hidden)) - 1:
            times[row, column, index] = parallel_step_time(kind, layer_sizes_of(hidden), batch, ranks, machine,
                                                           micro_batches=micro_batches)
    return np.argmin(times, axis=2), times


def largest_hidden_size(kind: str, layer_sizes_of, ranks: int, budget_bytes: float, batch: int,
                        itemsize: int = 4, micro_batches: int = 8) -> int:
    """The widest hidden size (a multiple of 64) whose busiest rank holds at most ``budget_bytes``
    (nnlib.lesson12_pipeline.memory's count: parameters, gradients, momentum, activations, backward's arrays).

    0 if none fits (or a pipeline has more stages than the network has layers).
    """
    if kind == "pipeline" and ranks > len(layer_sizes_of(64)) - 1:
        return 0
    for hidden in range(64, (1 << 16) + 1, 64):
        held = busiest_rank_bytes(kind, layer_sizes_of(hidden), batch, ranks, itemsize, micro_batches=micro_batches)
        if sum(held.values()) > budget_bytes:
            return hidden - 64
    return 1 << 16
