"""What one rank of a layout holds at the peak of a training step, by kind: the lessons' counts and what they leave
out, each a term below; and tracemalloc's measure of it, on the layout's real training step.

A layout D x T x Pp (layout.Layout) puts rank k on replica d = k // (T Pp) (its b = split_evenly(B, D)[d] rows of
the global batch B) and piece p = k % (T Pp) of the model, tensor part p % T of stage p // T: the chain n_0 .. n_L
it computes (the whole network, its tensor-parallel widths, its pipeline stage's layers, or those cut by tensor).
The lessons count parameters, gradients, optimizer state, activations and backward's operands (lesson 12's
rank_bytes and held_bytes for a tensor or pipeline piece; lesson 17's predicted_bytes on the data axis: ZeRO, FSDP's
gathered layer, recomputation, accumulation, precision). A
micro-batch has r rows (b, or ceil(b / m)); s bytes a value; NumPy reuses a temporary of at least 256 KiB in a chain
of operators (its elision: no new array). Added here, from tracemalloc snapshots of each phase of a step:

    batch            b (n_0 s + 8)     the step's rows taken from the data set, inputs and int64 labels: every stage
                                       and tensor rank takes its replica's whole b; the lessons' a_0 is a view of it
    optimizer state  x the values per parameter: 0 SGD, 1 momentum (what the lessons count), 2 Adam (m, v)
    gradients        ZeRO-2: its slice (not the whole), and one bucket a_in[:, rows].T @ delta, <= n / (4 D) values
    ZeRO on a grid   a tensor or pipeline piece's optimizer state (and update): its slice over the data axis
    chunks           r <= 1024         lesson 02's network (and lesson 11's) computes 1024 rows at a time; beyond,
                                       two chunks' activations: the last one's stay until the next forward returns
    logits           r n_L s           z_L, kept for the loss
    sigmoid'         r max_l n_l s     backward's 1 - a beside a (1 - a) (none where elided)
    accumulation     max_l n_{l-1} n_l s   a_in.T @ delta before it is added into the gradient (m > 1); FSDP: the
                                       reduce-scattered chunk before it is added, max_l c_l s
    FSDP gradient    max_l n_l s       the gathered layer's whole gradient before its reduce-scatter, or backward's
                                       operands (beside the gathered layer, one after the other): the larger
    recomputation    r max_l n_l s     a segment's top delta, kept by its caller while the segment backpropagates
    sends            (m - alive) r (n_L + n_0) s   a pipeline stage's outputs and input gradients of micro-batches
                                       whose backward has run: their Isends hold them until the step ends (no n_L on
                                       the last stage, no n_0 on the first)
    mixed precision  float16 or bfloat16 on the data axis (lesson 17): the batch, the update and the optimizer state
                     in float32 (s = 4 there), a_0 a low copy; a product's float32 copies of its operands and its
                     result before the cast, max_l [r (n_{l-1} + n_l) + n_{l-1} n_l] 4, or FSDP's float32 copy of
                     the low gradient for its reduce-scatter, max_l n_l 4: the larger; accumulation adds each
                     micro-batch's g / S in float32 into the master's gradient (a quotient of all it holds, with the
                     update's temporaries: no layer adds its product)
    update           u s, 1 for SGD's eta g; Adam's (1 - b2) g g and eta m_hat / (sqrt(v_hat) + eps): 2, 3 where not
                     elided (below 256 KiB, or not float64: its Python float scalars do not cast safely to float32);
                     u the values one optimizer piece updates (FSDP: one layer's chunk at a time)

The peak is the larger of two phases, each over parameters + gradients + optimizer state + batch: compute
(activations, backward, logits, sigmoid', accumulation, FSDP's buffers, sends) and update. ZeRO-1's ring brings
one chunk, n / D values, during its reduce-scatter: no more than the update's. Python's objects and MPI's own
buffers (outside tracemalloc) are left out.
"""

from __future__ import annotations

import math
import tracemalloc

from nnlib import Network
from nnlib.lesson04_collectives.collectives import split_evenly
from nnlib.lesson06_data_parallel import shard, train_parallel
from nnlib.lesson06_data_parallel.data_parallel import Allreduce
from nnlib.lesson10_zero_overlap.sampling import PerRankBatches
from nnlib.lesson10_zero_overlap.zero import GradientShardedNetwork, ZeRO, ZeROStage2
from nnlib.lesson11_tensor_parallel.tensor import TensorParallelMLP
from nnlib.lesson12_pipeline.bubbles import random_batch
from nnlib.lesson12_pipeline.grid import grid
from nnlib.lesson12_pipeline.memory import held_bytes, layer_params, rank_bytes, tensor_parallel_sizes
from nnlib.lesson12_pipeline.pipeline import PipelineMLP, stage_layers
from nnlib.lesson16_sharding.fsdp import FullySharded, FullyShardedNetwork
from nnlib.lesson17_activations.accumulation import MicroBatched
from nnlib.lesson17_activations.budget import BYTES, predicted_bytes
from nnlib.lesson17_activations.mixed_precision import MixedPrecision
from nnlib.lesson19_planning.grid import GridPipelineMLP, replica_comms
from nnlib.lesson19_planning.layout import Layout

LESSON = 19

ELIDED = 256 * 1024  # bytes: NumPy reuses a temporary this large in a chain of operators
CHUNK = 1024  # rows lesson 02's LayerStack computes at a time on the CPU (its chunk_size)
STATE_VALUES = {"sgd": 0, "momentum": 1, "adam": 2}  # the optimizer's values per parameter it updates


def lessons_count(layer_sizes, rows: int, layout: Layout, replica: int, stage: int, part: int, precision: str) -> tuple:
    """(the lessons' bytes by kind, the piece's chain, rows a micro-batch, micro-batches alive) for tensor part
    ``part`` of pipeline stage ``stage`` of replica ``replica`` (a 3-D piece: the stage's layers cut by tensor)."""
    itemsize, m = BYTES[precision], layout.micro_batches
    if layout.pipeline > 1:
        first, stop = stage_layers(len(layer_sizes) - 1, layout.pipeline, layout.cut)[stage]
        chain, micro = tuple(layer_sizes[first:stop + 1]), math.ceil(rows / m)
        alive = m if layout.schedule == "gpipe" else min(layout.pipeline - stage, m)  # (lesson 12's rank_bytes)
        held = held_bytes(chain, micro, itemsize, alive)
        if layout.tensor > 1:
            chain = tensor_parallel_sizes(chain, layout.tensor, part)
            held = held_bytes(chain, micro, itemsize, alive)
        return held, chain, micro, alive
    whole = layout.zero < 2 and m == 1 and not layout.recompute and itemsize >= 4  # not lesson 17's MicroBatched
    chunks = 1 + (rows > CHUNK) if whole else 1  # lesson 02's
    rows = min(rows, CHUNK) if chunks > 1 else rows
    if layout.tensor > 1:
        held, chain = rank_bytes("tensor", layer_sizes, rows, layout.tensor, part, itemsize), \
            tensor_parallel_sizes(layer_sizes, layout.tensor, part)
    else:
        held, chain = predicted_bytes(layer_sizes, rows, layout.data, replica, ["allreduce", "zero", "zero", "fsdp"][
            layout.zero], layout.recompute, m, precision), tuple(layer_sizes)
    held["activations"] *= chunks  # the last chunk's activations stay until the next chunk's forward returns
    return held, chain, math.ceil(rows / m), chunks


def peak_bytes(layer_sizes, batch: int, ranks: int, rank: int, layout: Layout, optimizer: str = "momentum",
               precision: str = "float64") -> dict:
    """Bytes rank ``rank`` of ``ranks`` holds at the peak of a step of ``batch`` rows in ``layout``, by kind (the
    module's terms, of the phase that peaks: parameters, gradients, optimizer state, batch and either activations,
    backward, logits, buffers, sends or update); ``optimizer`` "sgd", "momentum" or "adam"; the sum: the peak."""
    layout.check(ranks, layer_sizes)
    if optimizer not in STATE_VALUES:
        raise ValueError(f"optimizer must be one of {', '.join(STATE_VALUES)}; got {optimizer!r}")
    replica, (stage, part) = rank // (layout.tensor * layout.pipeline), divmod(rank % (layout.tensor *
                                                                                   layout.pipeline), layout.tensor)
    rows, s = split_evenly(batch, layout.data)[0][replica], BYTES[precision]
    master = max(s, 4)  # mixed precision: the float32 data, master weights and products
    held, chain, micro, alive = lessons_count(layer_sizes, rows, layout, replica, stage, part, precision)
    data_only = layout.tensor == layout.pipeline == 1  # lesson 17's count: a float32 optimizer state in mixed precision
    updated, layers = held["optimizer state"] // (master if data_only else s), layer_params(chain)
    if layout.zero and not data_only:  # ZeRO on a grid's data axis: the piece's slice (lesson 10's ZeRO over data_comm)
        updated = split_evenly(updated, layout.data)[0][replica]
    pieces = [split_evenly(count, layout.data)[0][replica] for count in layers] if layout.zero == 3 else [updated]
    gradients = updated * s if layout.zero == 2 else held["gradients"]
    base = {"parameters": held["parameters"], "gradients": gradients, "optimizer state": updated * master *
            STATE_VALUES[optimizer], "batch": rows * (layer_sizes[0] * master + 8)}
    last, first = stage == layout.pipeline - 1, stage == 0
    widest, big = max(chain[1:-1], default=0), max(n_in * n_out for n_in, n_out in zip(chain, chain[1:]))
    bucket = min(big, max(max(1, sum(layers) // (4 * layout.data)), max(chain[1:]))) if layout.zero == 2 else 0
    sigmoid = micro * widest * s * (micro * widest * s < ELIDED)  # 1 - a, unless elided
    segment = micro * max(chain[1:]) * s * ((layout.recompute or 1) > 1)  # a recomputed segment's top delta
    accumulated = layout.micro_batches > 1 and s >= 4  # (mixed precision adds a float32 quotient instead)
    added = (big if layout.zero < 2 else max(pieces) if layout.zero == 3 else 0) * accumulated
    copies = max(micro * (n_in + n_out) + n_in * n_out for n_in, n_out in zip(chain, chain[1:])) * 4 * (s < 4)
    compute = dict(base, activations=held["activations"] - alive * micro * chain[0] * s * first * (s == master),
                   backward=max(held["backward"] + sigmoid + segment, held.get("gathered", 0)),
                   logits=micro * chain[-1] * s * last, buffers=held.get("gathered", 0) + (bucket + added) * s
                   + max(copies, max(layers) * 4 * (s < 4 and layout.zero == 3)),
                   sends=(layout.micro_batches - alive) * micro * (chain[-1] * (not last) + chain[0] * (not first)) * s)
    largest = max(pieces) * master
    quotient = (sum(pieces) if layout.zero == 3 else sum(layers)) * 4 * (layout.micro_batches > 1 and s < 4)
    update = dict(base, update=max(quotient, largest * (1 if optimizer != "adam" else 2 if largest >= ELIDED and
                                                        master == 8 else 3)))
    return max(compute, update, key=lambda kinds: sum(kinds.values()))


def unbuildable(layout: Layout, precision: str = "float64") -> str | None:
    """What of ``layout`` the lessons' classes do not run (None: they run it all)."""
    model, low = layout.tensor * layout.pipeline, BYTES[precision] < 4
    for wrong, problem in [
            (model > 1 and layout.zero > 1, "the lessons run ZeRO-2 and FSDP on the data axis alone"),
            (low and (model > 1 or layout.zero == 2), "the lessons run mixed precision on the data axis alone, with "
                                                      "ZeRO 0, 1 or FSDP"),
            (model > 1 and layout.recompute, "the lessons recompute activations on the data axis alone"),
            (layout.tensor > 1 and layout.pipeline == 1 and layout.micro_batches > 1,
             "the lessons accumulate micro-batches on the data axis and in pipelines, not under tensor parallelism")]:
        if wrong:
            return problem
    return None


def build_layout(comm, layer_sizes, layout: Layout, precision: str = "float64") -> tuple:
    """(network piece, strategy, data_comm) of ``layout`` on ``comm``: lesson 12's grid, the model's piece over its
    replica (tensor or pipeline), each ZeRO stage's network and sync on the data axis, lesson 17's MicroBatched (or
    MixedPrecision, float16 or bfloat16 over float32 master weights: on the data axis only, as lesson 17 has it)."""
    low, dtype = BYTES[precision] < 4, precision if BYTES[precision] >= 4 else "float32"
    problem = unbuildable(layout, precision)
    if problem:
        raise ValueError(f"{problem}; got {layout} in {precision}")
    data_comm, model_comm = grid(comm, layout.tensor * layout.pipeline)
    if layout.pipeline > 1 and layout.tensor > 1:  # a 3-D grid's piece (grid.py)
        network = GridPipelineMLP(*replica_comms(model_comm, layout.tensor), layer_sizes, dtype=dtype, seed=1,
                                  micro_batches=layout.micro_batches, schedule=layout.schedule, cut=layout.cut)
    elif layout.pipeline > 1:
        network = PipelineMLP(model_comm, layer_sizes, dtype=dtype, seed=1, micro_batches=layout.micro_batches,
                              schedule=layout.schedule, cut=layout.cut)
    elif layout.tensor > 1:
        network = TensorParallelMLP(model_comm, layer_sizes, dtype=dtype, seed=1)
    elif layout.zero in (2, 3):
        network = (GradientShardedNetwork, FullyShardedNetwork)[layout.zero - 2](data_comm, layer_sizes, dtype=dtype,
                                                                                 seed=1)
    else:
        network = Network(layer_sizes, dtype=dtype, seed=1)
    if low:
        network = MixedPrecision(network, precision=precision, micro_batches=layout.micro_batches,
                                 recompute_every=layout.recompute)
    elif layout.pipeline == 1 and (layout.micro_batches > 1 or layout.recompute):
        network = MicroBatched(network, layout.micro_batches, layout.recompute)
    return network, [Allreduce, ZeRO, ZeROStage2, FullySharded][layout.zero], data_comm


def measured_peak(comm, layer_sizes, batch: int, layout: Layout, optimizer: str = "momentum",
                  precision: str = "float64") -> list:
    """tracemalloc's peak on every rank (gathered) over an epoch of two steps of ``batch`` rows, after a warm-up
    epoch, with what building the layout kept (parameters, gradients); the data set, made before, left out."""
    layout.check(comm.size, layer_sizes)
    low = BYTES[precision] < 4
    inputs, labels = random_batch(layer_sizes, 2 * batch, "float64" if precision == "float64" else "float32", 0)
    settings = dict(epochs=1, learning_rate=0.01, batch_size=batch, optimizer="adam" if optimizer == "adam" else "sgd",
                    momentum=0.9 if optimizer == "momentum" else 0.0)
    data_comm = grid(comm, layout.tensor * layout.pipeline)[0]
    local_inputs, local_labels, start = shard(data_comm, *((inputs, labels) if data_comm.rank == 0 else (None,) * 2))
    tracemalloc.start()
    try:
        network, strategy, data_comm = build_layout(comm, layer_sizes, layout, precision)
        for _ in range(2):  # a warm-up epoch, then the measured one
            tracemalloc.reset_peak()
            train_parallel(data_comm, network, local_inputs, local_labels, num_samples=2 * batch, start=start,
                           strategy=strategy, batches=PerRankBatches, scaler=network.scaler if low else None,
                           **settings)
        return comm.allgather(tracemalloc.get_traced_memory()[1])
    finally:
        tracemalloc.stop()
