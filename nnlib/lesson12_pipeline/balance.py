"""Pipeline stages cut by measured cost: of the contiguous cuts, the one whose slowest stage is fastest.

A step of m micro-batches lasts at least m max_s t_s (the slowest stage computes them all), t_s = sum of c_l over stage
s's layers, c_l a layer's seconds per micro-batch (:func:`layer_seconds`). :func:`balanced_cut` minimizes max_s t_s, as
torchgpipe's balance_by_time does; DeepSpeed's PipelineModule balances parameter counts (partition_method="parameters")
or layer counts ("uniform": stage_layers). FLOPs (:func:`layer_flops`) mislead on small layers: a call's fixed cost
(Python, NumPy's dispatch) is no FLOP."""

import itertools
import time

import numpy as np
from threadpoolctl import threadpool_limits

from nnlib.lesson02_network.network import Network
from nnlib.lesson04_collectives.costmodel import flops_per_sample
from nnlib.lesson12_pipeline.bubbles import random_batch, simulate, step_span
from nnlib.lesson12_pipeline.instructions import SCHEDULES
from nnlib.lesson12_pipeline.pipeline import Stage, Step, stage_layers

LESSON = 12


def balanced_cut(costs, stages: int) -> tuple[int, ...]:
    """Layers per stage, e.g. (2, 5): of the cuts of L layers costing c_0..c_{L-1} (>= 0) into P stages of
    consecutive layers, at least one each, the one with the least max_s (sum of c_l over stage s). Exact, O(P L^2):
    best[s, j], the least largest sum of a cut of layers 0..j-1 into s stages, is the min over i of
    max(best[s - 1, i], c_i + ... + c_{j-1}); the minimizing i's give the cut back."""
    costs = np.asarray(costs, dtype=np.float64)
    if costs.ndim != 1 or not np.all(np.isfinite(costs) & (costs >= 0)) or not 1 <= stages <= costs.size:
        raise ValueError(f"balanced_cut needs one finite cost >= 0 per layer and 1 to that many stages; got {stages} "
                         f"stages for costs {costs.tolist()}")
    sums, best = np.concatenate([[0.0], np.cumsum(costs)]), np.full((stages + 1, costs.size + 1), np.inf)
    best[0, 0], choice = 0.0, np.zeros(best.shape, int)
    for s, j in itertools.product(range(1, stages + 1), range(1, costs.size + 1)):
        options = [max(best[s - 1, i], sums[j] - sums[i]) for i in range(j)]
        choice[s, j] = int(np.argmin(options))
        best[s, j] = options[choice[s, j]]
    stops = [costs.size]
    for s in range(stages, 0, -1):
        stops.insert(0, choice[s, stops[0]])
    return tuple(int(stop - start) for start, stop in zip(stops, stops[1:]))


def stage_sums(costs, cut) -> list[float]:
    """Each stage's cost, the sum of its layers' costs, for ``cut`` (layers per stage)."""
    return [float(np.sum(costs[first:stop])) for first, stop in stage_layers(len(costs), len(cut), cut)]


def layer_flops(layer_sizes) -> list[int]:
    """Each weight layer's share of lesson 04's flops_per_sample (matrix-product FLOPs of a step, per sample)."""
    return [flops_per_sample(layer_sizes[:layer + 2]) - flops_per_sample(layer_sizes[:layer + 1])
            for layer in range(len(layer_sizes) - 1)]


def layer_seconds(layer_sizes, rows: int, micro_batches: int = 4, repeats: int = 15, dtype="float32"):
    """(forward, backward): arrays (L,) of each weight layer's seconds on a micro-batch of ``rows`` rows. One process
    (one BLAS thread) runs GPipe steps of ``micro_batches`` micro-batches through L pipeline Stages of one layer each
    (sigmoid output), each handing the next its output (so caches hold what a real stage's would), and times each
    Stage's forward and backward (messages excluded, as in PipelineMLP.timeline): medians over ``repeats`` steps."""
    network, last = Network(layer_sizes, "sigmoid", dtype), len(layer_sizes) - 2
    inputs, labels = random_batch(layer_sizes, rows * micro_batches, dtype, seed=0)
    step = Step(inputs, labels, 1.0 / rows, [(k * rows, (k + 1) * rows) for k in range(micro_batches)])
    stages = [Stage(None, [layer], index, index - 1 if index else None, index + 1 if index < last else None)
              for index, layer in enumerate(network.layers)]
    seconds = np.zeros((2, repeats, last + 1))
    with threadpool_limits(1):  # one BLAS thread, as each rank of a pipeline has
        for repeat, kind in itertools.product(range(repeats), (0, 1)):
            for k, index in itertools.product(range(micro_batches), range(last + 1)):
                index, stage = (index, stages[index]) if kind == 0 else (last - index, stages[last - index])
                if kind == 0 and index:
                    stage.arrived[k] = stages[index - 1].kept[k][0][-1]  # the output a of the layer before
                elif kind == 1 and index < last:
                    stage.arrived[k] = stages[index + 1].outgoing.pop(k)  # dJ/da from the layer after
                began = time.perf_counter()
                (stage.forward, stage.backward)[kind](step, k)
                seconds[kind, repeat, index] += (time.perf_counter() - began) / micro_batches
    return tuple(np.median(seconds, axis=1))


def predicted_step_seconds(forward, backward, cut, micro_batches: int, schedule: str = "gpipe") -> float:
    """A pipeline step's seconds, first computation to last, with layers taking forward[l] and backward[l] seconds
    per micro-batch and ``cut`` layers per stage: bubbles.simulate runs the schedule, messages taking no time."""
    stage_seconds = {"forward": stage_sums(forward, cut), "backward": stage_sums(backward, cut)}
    programs = SCHEDULES[schedule](len(cut), micro_batches)
    return step_span(simulate(programs, lambda stage, kind: stage_seconds[kind][stage]))
