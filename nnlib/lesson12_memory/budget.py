"""A rank's memory over a training step: predicted from the arrays' sizes, measured with tracemalloc.

What one rank holds, in bytes (itemsize s: 8 for float64), for a network of n parameters in layers of
n_l = n_in n_out + n_out, on P ranks, with rank r's chunks c_{l,r}:

    parameters        n s                 (FSDP: sum_l c_{l,r} s, its chunks)
    gradients         n s                 (FSDP: the same chunks)
    optimizer state   n s, the momentum   (lesson 08's ZeRO: its slice; FSDP: its chunks)
    gathered          FSDP only: the largest layer's whole [W_l, b_l], max_l n_l s, alive through its backward
                      (its whole gradient, max_l n_l s more, lives only in weight_gradient beside delta, before
                      dJ/da and a (1 - a) come: counted with the temporaries, the larger of the two moments)
    activations       B_m (n_1 + ... + n_L) s for a micro-batch of B_m rows, or with checkpoints every k
                      layers the checkpoints', the output's and the longest recomputed segment's
    temporaries       the batch's rows (B n_0 s), a few arrays of B_m (widest layer) s in backward
                      (delta, dJ/da, a (1 - a), ...: TEMPORARY_ARRAYS, as measured; tests/test_memory.py
                      bounds them by 7 with tracemalloc) and, when a later micro-batch adds its gradient to
                      what is there (also a later chunk of over 1,024 rows), the largest layer's a_in.T @ delta,
                      max_l n_l s (the first writes its product straight into the gradient:
                      nnlib.lesson02_network.arrays.product_into; FSDP always writes into its whole buffer);
                      with checkpoints, what recomputation keeps beside them (:func:`recomputed_beside`), or
                      the recomputing forward's arrays if they are more
    update            the update's eta g (as many values as the rank updates; FSDP: one layer's chunk at a
                      time), once backward's arrays are freed

The peak is what stays (parameters, gradients, optimizer state) plus the larger of the two phases.

Model parallelism (lesson 09) holds the same kinds, of its own part of the network, on the whole batch:

    tensor parallel   a rank holds the chain of widths (n_0, h_1 / P, n_2, h_3 / P, ..., n_L): a column
                      layer's columns C_r (n_in x h_r, its h_r biases), the matching row layer's rows
                      (h_r x n_out, the whole bias); its activations are its columns' (B h_r) and the
                      row layers' full outputs (B n_out, completed by the Allreduce); an input gradient of
                      a column layer is full (B n_in): :func:`tensor_parallel_sizes` feeds that chain to
                      :func:`predicted_bytes`, every rank's B the whole batch
    pipeline          stage s holds its layers' parameters, gradients and momentum; its activations are those
                      of the micro-batches its schedule keeps alive (GPipe: all m; 1F1B: up to P - s), each
                      B_m (its layers' widths + n_in received, + the logits on the last stage), plus what the
                      Isends still hold until the step's Waitall: each micro-batch's output sent forward and
                      input gradient sent back (:func:`pipeline_activation_values` walks the schedule)
    mixed precision   float16 weights 2 + float16 gradients 2 + float32 master 4 + float32 unscaled gradient 4
                      + float32 momentum 4 bytes per parameter; activations (a_0 included) at 2 bytes; the
                      float32 products' temporaries at 4 (:func:`mixed_precision_bytes`); bfloat16 the same
                      bytes. Combined: with FSDP the chunks (6 + 8 + 4 bytes per value of them) and one gathered
                      layer; with accumulation one micro-batch's activations and, after each later one, its
                      unscaled float32 copy; with recomputation the checkpoints', and a recomputing forward's
                      float32 temporaries beside them (:func:`mixed_recompute_bytes`); with tensor parallelism
                      the rank's chain of widths (:func:`mixed_tensor_parallel_bytes`)

``tracemalloc`` counts what NumPy allocates (its arrays' buffers), so :func:`measured_peak` measures the
same things on the real run: tests/mpi/check_memory.py holds each within 10% of the prediction.
"""

from __future__ import annotations

import math
import tracemalloc

from nnlib.lesson04_collectives.collectives import split_counts
from nnlib.lesson08_inside_allreduce.allreduce import chunk_bounds
from nnlib.lesson09_model_parallel.instructions import SCHEDULES
from nnlib.lesson09_model_parallel.pipeline import stage_layers
from nnlib.lesson09_model_parallel.tensor import layer_kinds
from nnlib.lesson12_memory.recompute import checkpoint_layers

LESSON = 12

TEMPORARY_ARRAYS = 3
CHUNK_ROWS = 1024  # lesson 02's Network.chunk_size: a larger batch adds each later chunk's gradient


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
    temporary (eta g over the part this rank updates), alive only when backward's arrays are gone.

    With recomputation every k layers, backward's arrays are those of whichever phase holds more: the backward
    of a segment [s, t) (its activations, and beside them :func:`recomputed_beside`: the delta carried in and
    the recomputation's top z) or a recomputing forward (:func:`mixed_recompute_bytes` at 8 bytes a value, its
    a_0 the batch's rows; FSDP: + the whole layer it runs, gathered)."""
    layers = layer_params(layer_sizes)
    whole = 8 * sum(layers)
    mine = [8 * chunk_bounds(size, ranks)[0][rank] for size in layers]
    updated = {"allreduce": whole, "zero": 8 * chunk_bounds(sum(layers), ranks)[0][rank], "fsdp": sum(mine)}[strategy]
    micro_rows, sharded = math.ceil(rows / micro_batches), strategy == "fsdp"
    widest = micro_rows * max(layer_sizes[1:])
    # FSDP: the whole gradient lives in weight_gradient only, beside delta, before backward's other arrays come
    arrays = max(TEMPORARY_ARRAYS * widest, widest + max(layers)) if sharded else TEMPORARY_ARRAYS * widest
    product = max(layers) if not sharded and (micro_batches > 1 or micro_rows > CHUNK_ROWS) else 0
    backward = {"gathered": 8 * max(layers) if sharded else 0,
                "activations": activation_bytes(layer_sizes, micro_rows, every),
                "temporaries": 8 * (rows * layer_sizes[0] + arrays + product)}
    if every is not None:
        backward["temporaries"] += 8 * micro_rows * max(recomputed_beside(layer_sizes, every))
        recomputing = {"gathered": 8 * max(layers) if sharded else 0,
                       **mixed_recompute_bytes(layer_sizes, micro_rows, every, 8, 8)}
        recomputing["activations"] -= 8 * micro_rows * layer_sizes[0]  # a_0 is a view of the batch's rows:
        recomputing["temporaries"] += 8 * rows * layer_sizes[0]         # counted with them
        backward = max(backward, recomputing, key=lambda phase: sum(phase.values()))
    return {"parameters": sum(mine) if sharded else whole, "gradients": sum(mine) if sharded else whole,
            "optimizer state": updated, **backward,
            "update": max(mine) if sharded else updated}  # FSDP updates layer by layer


def recomputed_beside(layer_sizes, every: int) -> list[int]:
    """Per segment [s, t) of checkpoints every ``every`` layers, the values per row recompute.recomputed_backward
    holds beside backward's own arrays while it backpropagates the segment: the delta carried in from the
    segment above, dJ/dz_t (w_t, t < L), and the recomputation's top logits z_{t-1} (w_{t-1}, t - s >= 2)."""
    num_layers = len(layer_sizes) - 1
    starts = checkpoint_layers(num_layers, every)
    return [layer_sizes[stop] * (stop < num_layers) + layer_sizes[stop - 1] * (stop - start >= 2)
            for start, stop in zip(starts, starts[1:] + [num_layers])]


def predicted_peak(held: dict) -> int:
    """The peak of :func:`predicted_bytes`: what stays, plus the larger of backward's arrays and the update's."""
    backward = held["gathered"] + held["activations"] + held["temporaries"]
    return held["parameters"] + held["gradients"] + held["optimizer state"] + max(backward, held["update"])


def layer_params(layer_sizes) -> list[int]:
    """n_l = n_in n_out + n_out for each layer of the chain ``layer_sizes``."""
    return [n_in * n_out + n_out for n_in, n_out in zip(layer_sizes[:-1], layer_sizes[1:])]


def tensor_parallel_sizes(layer_sizes, ranks: int, rank: int) -> tuple:
    """The widths rank ``rank`` of ``ranks`` holds under lesson 09's TensorParallelMLP, as a chain: each column
    layer's output cut to the rank's h_r (split_counts), every other width whole: (n_0, h_1r, n_2, h_3r, ...)."""
    kinds = layer_kinds(len(layer_sizes) - 1)
    return (layer_sizes[0],) + tuple(int(split_counts(width, ranks)[rank]) if kind == "column" else width
                                     for kind, width in zip(kinds, layer_sizes[1:]))


def tensor_parallel_bytes(layer_sizes, rows: int, ranks: int, rank: int) -> dict:
    """What a TensorParallelMLP rank holds over a step on the whole batch of ``rows`` rows (float64, momentum):
    :func:`predicted_bytes` of its chain of widths, everything replicated within it."""
    return predicted_bytes(tensor_parallel_sizes(layer_sizes, ranks, rank), rows)


def backward_widths(layer_sizes, first: int, stop: int, stages: int, stage: int) -> int:
    """The most values per row a stage's backward adds while it runs (NumPy's temporaries, on top of what it keeps),
    for its layers [first, stop) of output widths w_0 .. w_top: at the top, a (1 - a) and a (1 - a) of the received
    gradient (2 w_top; the loss's on the last stage); going down through layer j + 1, the input gradient,
    1 - a_j and a_j (1 - a_j) (3 w_j) beside the delta of layer j + 1 (w_{j+1}, unless the received one); at the
    bottom, stage s > 0's delta of its first layer and the input gradient it sends back (w_0 + n_first)."""
    widths = layer_sizes[first + 1:stop + 1]
    going_down = [3 * widths[j] + (widths[j + 1] if j + 2 < len(widths) else 0) for j in range(len(widths) - 1)]
    return max([2 * widths[-1], *going_down] + ([widths[0] + layer_sizes[first]] if stage > 0 else []))


def pipeline_activation_values(layer_sizes, rows: int, stages: int, stage: int, micro_batches: int,
                               schedule: str, itemsize: int = 1, running: int | None = None) -> int:
    """The most activation values ``stage`` holds at once over its instructions of lesson 09's ``schedule``,
    backward's own temporaries (:func:`backward_widths`) included.

    Stage s holds layers [first, stop) (stage_layers). Micro-batch k of B_k rows (split_counts) keeps, from
    its forward to its backward, B_k (n_first+1 + ... + n_stop) values, + B_k n_first received (s > 0),
    + B_k n_L logits (the last stage); its received output gradient B_k n_stop from recv_backward to backward.
    The arrays an Isend was given stay alive until the step's Waitall: the output sent forward (s < P - 1)
    and, from the backward on, the input gradient sent back (s > 0, B_k n_first).
    With ``itemsize`` (bytes a kept value) and ``running`` (what a backward adds per row, in the same unit:
    mixed precision's float32 arrays) the same walk counts bytes.
    """
    first, stop = stage_layers(len(layer_sizes) - 1, stages)[stage]
    not_first, not_last = stage > 0, stage < stages - 1
    n_in, n_out = layer_sizes[first], layer_sizes[stop]
    kept = sum(layer_sizes[first + 1:stop + 1]) + n_in * not_first + n_out * (not not_last)
    running = backward_widths(layer_sizes, first, stop, stages, stage) if running is None else running
    # after a backward its activations are freed; the output sent and the input gradient sent back stay
    return schedule_peak(rows, stages, stage, micro_batches, schedule, during={"backward": running},
                         after={"forward": itemsize * kept, "recv_backward": itemsize * n_out,
                                "backward": itemsize * (-kept + n_in * not_first)})


def schedule_peak(rows: int, stages: int, stage: int, micro_batches: int, schedule: str, during: dict,
                  after: dict) -> int:
    """The most values ``stage`` holds at once over its instructions of lesson 09's ``schedule``: an instruction
    of kind K on micro-batch k (B_k rows, split_counts) briefly adds B_k during[K] values beside what is alive,
    then leaves B_k after[K] more alive (negative: freed) until later instructions."""
    counts = [int(count) for count in split_counts(rows, min(micro_batches, rows))]
    alive = peak = 0
    for instruction in SCHEDULES[schedule](stages, len(counts))[stage]:
        batch_rows = counts[instruction.micro_batch]
        peak = max(peak, alive + batch_rows * during.get(instruction.kind, 0))
        alive += batch_rows * after.get(instruction.kind, 0)
        peak = max(peak, alive)
    return peak


def pipeline_bytes(layer_sizes, rows: int, stages: int, stage: int, micro_batches: int = 4,
                   schedule: str = "1f1b") -> dict:
    """What pipeline stage ``stage`` of ``stages`` holds over a step on ``rows`` rows (float64, momentum) in
    ``micro_batches`` micro-batches: its layers' parameters, gradients and momentum; the activations (and
    backward's temporaries) of :func:`pipeline_activation_values`; the batch every rank takes (B n_0) and its
    largest layer's a_in.T @ delta as temporaries."""
    first, stop = stage_layers(len(layer_sizes) - 1, stages)[stage]
    mine = layer_params(layer_sizes[first:stop + 1])
    held = predicted_bytes(layer_sizes[first:stop + 1], rows)
    held["activations"] = 8 * pipeline_activation_values(layer_sizes, rows, stages, stage, micro_batches, schedule)
    held["temporaries"] = 8 * (rows * layer_sizes[0] + max(mine))
    return held


MIXED_TEMPORARY_ARRAYS = 2
LOW_PRECISION_BYTES = {"float16": 2, "bfloat16": 2}  # bfloat16 drops mantissa bits, not bytes


def mixed_precision_bytes(layer_sizes, rows: int, ranks: int = 1, rank: int = 0, strategy: str = "allreduce",
                          every: int | None = None, micro_batches: int = 1, precision: str = "float16") -> dict:
    """What rank ``rank`` of ``ranks`` holds under nnlib.lesson12_memory.mixed_precision's MixedPrecision (SGD with
    momentum) over a step on ``rows`` rows of its own, in k = ``micro_batches`` micro-batches of B_m = ceil(B / k)
    rows, keeping every ``every``-th layer's input (None: all), ``precision`` float16 or bfloat16 (2 bytes both:
    bfloat16 drops mantissa bits, not bytes).

    strategy "allreduce" (the whole network on every rank, n parameters):
        parameters   (2 + 4) n      the low copy and the float32 master
        gradients    (2 + 4) n      the scaled low gradient and the unscaled float32 one
        optimizer    4 n            the float32 momentum
        activations  2 B_m n_0 (the micro-batch cast to low) + :func:`activation_bytes` at 2 bytes a value
        temporaries  4 (B n_0 + MIXED_TEMPORARY_ARRAYS B_m max_l w_l + 2 max_l n_l): the float32 batch, HalfLayer's
                     float32 casts and products, the largest layer cast to float32 and its float32 gradient product
        update       max(5 n: eta g in float32 and the finiteness check's bool,
                         4 n + 4 B n_0 if k > 1: a later micro-batch's low gradient divided by S into
                         float32, beside the float32 batch)
    strategy "zero" (lesson 08's ZeRO-1/2 around the whole float32 master): as "allreduce", but the momentum and
        the update (its eta g and check) only over this rank's slice of the n values (chunk_bounds)
    strategy "fsdp" (a FullyShardedNetwork in float32: rank r's chunks, c = sum_l c_{l,r}):
        parameters 6 c, gradients (4 + 4) c (the reduce-scatter delivers float32 chunks), optimizer 4 c;
        gathered     12 max_l n_l: a whole low layer (2), its whole low gradient (2) and the float32 8 of the
                     "allreduce" run's 2 max_l n_l: the product written into the low gradient, then the float32
                     copy the reduce-scatter sends
        temporaries  as "allreduce"'s, without the 2 max_l n_l (they are the gathered layer's)
        update       max(4 max_l c_{l,r} + c: one chunk's eta g and the check's bool, 4 c + 4 B n_0 if k > 1)
    With recomputation, backward's arrays are those of whichever phase holds more: the backward (as above, on
    the checkpoints, + the float32 top z of the segment it runs, 4 B_m max :func:`recomputed_tops`) or a
    recomputing forward (:func:`mixed_recompute_bytes`, + the float32 batch; FSDP: + the low layer it runs).
    """
    if precision not in LOW_PRECISION_BYTES:
        raise ValueError(f"mixed precision stores float16 or bfloat16; got {precision!r}")
    if strategy not in ("allreduce", "zero", "fsdp"):
        raise ValueError(f"mixed precision trains with strategy allreduce, zero or fsdp; got {strategy!r}")
    low, layers = LOW_PRECISION_BYTES[precision], layer_params(layer_sizes)
    sharded = strategy == "fsdp"
    chunks = [chunk_bounds(size, ranks)[0][rank] if sharded else size for size in layers]
    count, micro_rows = sum(chunks), math.ceil(rows / micro_batches)
    updated = chunk_bounds(count, ranks)[0][rank] if strategy == "zero" else count  # ZeRO: this rank's slice
    backward = {"gathered": (2 * low + 8) * max(layers) if sharded else 0,
                "activations": (low * micro_rows * layer_sizes[0]
                                + activation_bytes(layer_sizes, micro_rows, every, low)),
                "temporaries": 4 * (rows * layer_sizes[0] + MIXED_TEMPORARY_ARRAYS * micro_rows * max(layer_sizes)
                                    + (0 if sharded else 2 * max(layers)))}
    if every is not None:
        recomputing = {"gathered": low * max(layers) if sharded else 0,  # the layer it runs, gathered
                       **mixed_recompute_bytes(layer_sizes, micro_rows, every, low)}
        recomputing["temporaries"] += 4 * rows * layer_sizes[0]
        backward["temporaries"] += 4 * micro_rows * max(recomputed_tops(layer_sizes, every), default=0)
        backward = max(backward, recomputing, key=lambda phase: sum(phase.values()))
    accumulated = 4 * count + 4 * rows * layer_sizes[0] if micro_batches > 1 else 0
    return {"parameters": (low + 4) * count, "gradients": (4 if sharded else low) * count + 4 * count,
            "optimizer state": 4 * updated, **backward,
            "update": max(4 * max(chunks) + count if sharded else 5 * updated, accumulated)}


def mixed_tensor_parallel_bytes(layer_sizes, rows: int, ranks: int, rank: int, every: int | None = None,
                                micro_batches: int = 1, precision: str = "float16") -> dict:
    """What a TensorParallelMLP rank holds under MixedPrecision over a step on the whole batch of ``rows`` rows:
    :func:`mixed_precision_bytes` of its chain of widths (:func:`tensor_parallel_sizes`), as if one process held
    that narrower network (the float32 partial sums the ranks add are the products HalfLayer makes anyway)."""
    return mixed_precision_bytes(tensor_parallel_sizes(layer_sizes, ranks, rank), rows, every=every,
                                 micro_batches=micro_batches, precision=precision)


def recomputed_tops(layer_sizes, every: int) -> list[int]:
    """The widths w_{t-1} of the top z each recomputed segment [s, t) leaves (t - s >= 2): the float32 logits
    of its last recomputed layer, which recompute.py keeps until the next segment's recomputation replaces them."""
    starts = checkpoint_layers(len(layer_sizes) - 1, every)
    return [layer_sizes[stop - 1] for start, stop in zip(starts, starts[1:] + [len(layer_sizes) - 1])
            if stop - start > 1]


def mixed_recompute_bytes(layer_sizes, rows: int, every: int, low: int = 2, wide: int = 4) -> dict:
    """The most bytes a recomputing forward holds: {"activations": stored ones, ``low`` bytes a value,
    "temporaries": computed ones, ``wide`` bytes a value} (mixed precision: float16 stored, float32 computed;
    float64 training: 8 and 8), over the segments [s, t) of checkpoints every ``every`` layers (last first) and
    their layers j (s <= j < t - 1: layer j recomputes a_{j+1} from a_j), for ``rows`` rows (B_m):

        stored       the checkpoints a_s (a_0, the micro-batch, included), the output a_L, the delta carried
                     down (dJ/dz_t, w_t) and the segment's a_{s+1} .. a_j recomputed so far
        computed     the previous layer's z_j (j > s), the top z of the segment recomputed before (until the next
                     recomputation replaces it, w_{t'-1}), and layer j's own: the sigmoid's z, z / 2, tanh
                     (3 B w_{j+1}), or, when the layer casts (low != wide), its product's operands and result
                     (B w_j + w_j w_{j+1} + B w_{j+1}) if they are more
    """
    num_layers = len(layer_sizes) - 1
    starts = checkpoint_layers(num_layers, every)
    kept = sum(layer_sizes[start] for start in starts) + layer_sizes[-1]
    peak, stale = {"activations": 0, "temporaries": 0}, 0
    for start, stop in reversed(list(zip(starts, starts[1:] + [num_layers]))):
        for layer in range(start, stop - 1):
            n_in, n_out = layer_sizes[layer], layer_sizes[layer + 1]
            own = max(rows * (n_in + n_out) + n_in * n_out if low != wide else 0, 3 * rows * n_out)
            phase = {"activations": low * rows * (kept + layer_sizes[stop] + sum(layer_sizes[start + 1:layer + 1])),
                     "temporaries": wide * (rows * (stale + n_in * (layer > start)) + own)}
            peak = max(peak, phase, key=lambda held: sum(held.values()))
        stale = layer_sizes[stop - 1] if stop - start > 1 else 0
    return peak


def measured_peak(work) -> tuple:
    """(the peak bytes NumPy held while ``work()`` ran, counted from its start, and what work returned)."""
    tracemalloc.start()
    try:
        result = work()
        return tracemalloc.get_traced_memory()[1], result
    finally:
        tracemalloc.stop()


def measured_step_peak(build, step) -> tuple:
    """(the peak bytes NumPy held over ``step(held)``, counting what ``build()`` made and still holds, and held).

    For networks whose construction passes through the whole network (lesson 09's build a Network and keep
    their part): the peak is reset once ``build`` returns, so only what it left alive counts."""
    tracemalloc.start()
    try:
        held = build()
        tracemalloc.reset_peak()
        step(held)
        return tracemalloc.get_traced_memory()[1], held
    finally:
        tracemalloc.stop()


# -- recomputation for lesson 09's model parallelism (nnlib.lesson12_memory.recompute_parallel) -------------

def recomputed_pipeline_activation_values(layer_sizes, rows: int, stages: int, stage: int, micro_batches: int,
                                          schedule: str, itemsize: int = 1, running: int | None = None) -> int:
    """The most activation values ``stage`` holds at once over its instructions of ``schedule`` when it keeps
    only each micro-batch's input (received, s > 0) and sent output (s < P - 1) and recomputes the rest before
    the backward (RecomputedPipelineMLP); backward's temporaries (:func:`backward_widths`) included.

    Micro-batch k of B_k rows keeps B_k (n_first [s > 0] + n_stop [s < P - 1]) values from its forward to its
    backward. A forward briefly holds all of the stage's activations, B_k (n_first [s > 0] + n_first+1 + ... +
    n_stop + n_L [logits, last stage]); a backward rebuilds them (B_k (n_first+1 + ... + n_stop + n_L [last])
    new arrays beside the kept ones) and adds its temporaries. As in :func:`pipeline_activation_values`, the
    received output gradient (B_k n_stop) lives from recv_backward to backward, and the Isends' arrays (the
    output sent, the input gradient sent back, B_k n_first) until the step's Waitall. ``itemsize`` and
    ``running``: bytes, as :func:`pipeline_activation_values` takes them.
    """
    first, stop = stage_layers(len(layer_sizes) - 1, stages)[stage]
    last = stage == stages - 1
    received, sent = layer_sizes[first] * (stage > 0), layer_sizes[stop] * (not last)
    rebuilt = sum(layer_sizes[first + 1:stop + 1]) + layer_sizes[stop] * last
    running = backward_widths(layer_sizes, first, stop, stages, stage) if running is None else running
    # after a backward the received output gradient is freed, and the kept input gives way to the input
    # gradient sent back (the same B_k n_first); the output sent stays with its Isend
    return schedule_peak(rows, stages, stage, micro_batches, schedule,
                         during={"forward": itemsize * (received + rebuilt), "backward": itemsize * rebuilt + running},
                         after={"forward": itemsize * (received + sent), "recv_backward": itemsize * sent,
                                "backward": -itemsize * sent})


def recomputed_pipeline_bytes(layer_sizes, rows: int, stages: int, stage: int, micro_batches: int = 4,
                              schedule: str = "1f1b") -> dict:
    """:func:`pipeline_bytes` with the activations of :func:`recomputed_pipeline_activation_values`."""
    held = pipeline_bytes(layer_sizes, rows, stages, stage, micro_batches, schedule)
    held["activations"] = 8 * recomputed_pipeline_activation_values(layer_sizes, rows, stages, stage, micro_batches,
                                                                    schedule)
    return held


def recomputed_tensor_parallel_bytes(layer_sizes, rows: int, ranks: int, rank: int, every: int = 2) -> dict:
    """What a RecomputedTensorParallelMLP rank holds over a step on ``rows`` rows keeping every ``every``-th layer's
    input: :func:`predicted_bytes` of its chain of widths (:func:`tensor_parallel_sizes`) with checkpoints, which
    counts what recompute.recomputed_backward holds beside backward's own arrays (:func:`recomputed_beside`: the
    delta carried in from the segment above and the recomputation's last logits) and its recomputing forwards."""
    return predicted_bytes(tensor_parallel_sizes(layer_sizes, ranks, rank), rows, every=every)


# -- mixed precision for lesson 09's pipeline (nnlib.lesson12_memory.mixed_pipeline) --------------------------

LOSS_ARRAYS = 2  # float32 arrays of B_m x n_L the loss adds on the last stage (as measured)
MICRO_BATCH_OBJECT_BYTES = 1536  # Python's own objects per micro-batch in flight (arrays' headers, the step's
# dicts and tuples): tracemalloc counts them too; they matter only on a stage as small as one 72 x 10 layer


def mixed_pipeline_bytes(layer_sizes, rows: int, stages: int, stage: int, micro_batches: int = 4,
                         schedule: str = "1f1b", precision: str = "float16", recompute: bool = False) -> dict:
    """What a MixedStages pipeline stage holds over a step on ``rows`` rows in k micro-batches of B_m rows, its
    layers holding n values (low bytes: 2 for float16 and bfloat16):

        parameters, gradients   (low + 4) n each: the low copy and the float32 master
        optimizer state         4 n, the float32 momentum
        activations             the schedule's walk (:func:`pipeline_activation_values`) of the kept arrays at low
                                bytes a value, a backward adding per row a layer's float32 input and delta (or
                                product), 4 (n_in + n_out), beside its low input gradient, low n_in (the most of
                                the stage's layers); with ``recompute`` (MixedRecomputedPipelineMLP) the walk of
                                :func:`recomputed_pipeline_activation_values` instead
        temporaries             the float32 batch and its low copy, B n_0 (4 + low); the largest layer's float32
                                gradient product, 4 max_l n_l; on the last stage the float32 loss's arrays
                                (LOSS_ARRAYS B_m n_L) and the logits kept in float32, not low (B n_L at most);
                                MICRO_BATCH_OBJECT_BYTES per micro-batch
        update                  5 n: eta g in float32 and the finiteness check's bool (mixed_precision_bytes's)

    Measured within 10% on every stage of 1-4 ranks (tests/mpi/check_memory.py)."""
    low = LOW_PRECISION_BYTES[precision]
    first, stop = stage_layers(len(layer_sizes) - 1, stages)[stage]
    mine, widths = layer_params(layer_sizes[first:stop + 1]), layer_sizes[first:stop + 1]
    running = max(4 * (n_in + n_out) + low * n_in for n_in, n_out in zip(widths, widths[1:]))
    walk = recomputed_pipeline_activation_values if recompute else pipeline_activation_values
    activations = walk(layer_sizes, rows, stages, stage, micro_batches, schedule, low, running)
    last = stage == stages - 1
    final = (4 * LOSS_ARRAYS * math.ceil(rows / micro_batches) + (4 - low) * rows) * layer_sizes[-1] * last
    return {"parameters": (low + 4) * sum(mine), "gradients": (low + 4) * sum(mine), "optimizer state": 4 * sum(mine),
            "gathered": 0, "activations": activations,
            "temporaries": (4 + low) * rows * layer_sizes[0] + 4 * max(mine) + final
            + MICRO_BATCH_OBJECT_BYTES * min(micro_batches, rows),
            "update": 5 * sum(mine)}
