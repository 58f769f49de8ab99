"""Pipeline (inter-layer) parallelism: consecutive layers on consecutive ranks, micro-batches flowing through.

Rank s (a *stage*) holds the consecutive weight layers split_counts(L, P) gives it, and only
those (a slice of nnlib.lesson02_network.network's layers). A batch of N samples is cut into m micro-batches;
micro-batch k flows forward

    stage 0 --a--> stage 1 --a--> ... --> stage P-1 (loss, delta_L)

with point-to-point messages (the activations of the stage's last layer), and back

    stage 0 <--g-- stage 1 <--g-- ... <-- stage P-1,    g = delta_first @ W_first.T

(the gradient with respect to the stage's input activation; the receiver multiplies it by
a (1 - a) to get its own top layer's delta). Each stage adds the weight gradients of the m
micro-batches, each divided by the whole batch's N, so that one step equals the sequential step
on the whole batch (up to the order of the additions).

**Schedules are data** (nnlib.lesson09_model_parallel.instructions): for each stage, a list of instructions
("recv_forward", "forward", "send_forward", ...), which :meth:`PipelineMLP.loss_and_gradient` runs, one
by one, whatever the schedule (GPipe, 1F1B, and lesson 13's). The idle time while the pipe fills and drains
(the bubble) is predicted and measured in nnlib.lesson09_model_parallel.bubbles.

A :class:`PipelineMLP` has the methods :func:`nnlib.lesson03_training.training.train` uses, so the sequential
trainer drives it: every rank passes the same batch (stage 0 uses the inputs, the last stage the
labels); the loss is sent from the last stage to all after each step. The communicator is used as
given; for a deadline on every message (lesson 10) pass a watched one,
``PipelineMLP(nnlib.course.deadline.watch(comm, timeout), ...)``. :meth:`full_params` concatenates the
stages' vectors in rank order, which is exactly Network's flat layout.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field

import numpy as np
from mpi4py import MPI

from nnlib.lesson02_network.network import (Classifier, Network, backward_layers, dense_layers, forward_layers,
                                            output_loss, parameter_offsets)
from nnlib.lesson04_collectives.collectives import (allgather_rows, offsets, raised_on_every_rank,
                                                    require_same_on_every_rank, split_counts)
from nnlib.lesson09_model_parallel.instructions import COMPUTE, SCHEDULES, Instruction

LESSON = 9

FORWARD_TAG, BACKWARD_TAG = 1, 2


def stage_layers(num_layers: int, stages: int, split=None):
    """[(first, stop)] weight layers of each stage: consecutive, as even as possible (earlier stages larger).

    split: the number of layers of each stage instead, e.g. (3, 2, 2, 3) for 10 layers on 4 (virtual)
    stages, to balance stages whose layers differ in cost; ValueError (split_problem's) if unusable.
    """
    problem = split_problem(split, num_layers, stages)
    if problem:
        raise ValueError(problem)
    counts = split_counts(num_layers, stages) if split is None else [int(count) for count in split]
    return [(int(start), int(start + count)) for start, count in zip(offsets(counts), counts)]


def split_problem(split, num_layers: int, stages: int) -> str | None:
    """Why ``split`` (layer counts per stage, or None for an even split) cannot cut ``num_layers`` layers
    into ``stages`` stages; None if it can."""
    if split is None:
        return None
    if (not isinstance(split, (tuple, list)) or len(split) != stages
            or not all(isinstance(count, (int, np.integer)) and not isinstance(count, bool) and count >= 1
                    for count in split)):
        return (f"split must give each of the {stages} (virtual) stages a positive number of layers, e.g. "
                f"{tuple(split_counts(num_layers, stages).tolist())}; got {split!r}")
    if sum(split) != num_layers:
        return f"split {tuple(split)} holds {sum(split)} layers but the network has {num_layers} weight layers"
    return None


# -- the executor -----------------------------------------------------------------------------------

def input_gradients(layers, activations, delta, input_gradient: bool):
    """B of the split backward: every layer's delta, last to first, and no weight gradient.

    activations: [a_0, ..., a_L] of forward_layers; delta: dJ/dz_L (N, n_L). Going down,
    delta_{l-1} = (delta_l @ W_l.T) * a_{l-1} (1 - a_{l-1}), as in backward_layers. Returns
    ([delta_1, ..., delta_L], dJ/da_0 = delta_1 @ W_1.T (N, n_0) if ``input_gradient`` else None).
    """
    deltas = [delta]
    for index in range(len(layers) - 1, 0, -1):
        deltas.insert(0, layers[index - 1].logits_gradient(layers[index].input_gradient(deltas[0]),
                                                           activations[index]))
    return deltas, (layers[0].input_gradient(deltas[0]) if input_gradient else None)


def weight_gradients(layers, activations, deltas, accumulate: bool) -> None:
    """W of the split backward: each layer's dJ/dW = a_in.T @ delta and dJ/db, written (or added) in its views."""
    for layer, inputs, delta in zip(layers, activations, deltas):
        layer.weight_gradient(inputs, delta, accumulate)


@dataclass
class StepState:
    """What one step of a stage keeps between its instructions (see PipelineMLP.loss_and_gradient).

    Every key names a micro-batch k and a chunk c (0 unless the stage holds several).
    """

    inputs: object
    labels: object
    scale: float
    bounds: list                                       # (start, stop) rows of each micro-batch
    arrived: dict = field(default_factory=dict)        # ("forward" | "backward", k, c) -> received array
    kept: dict = field(default_factory=dict)           # (k, c) -> (activations, output logits or None)
    waiting: dict = field(default_factory=dict)        # (k, c) -> (layer inputs, deltas): a B whose W is to come
    outgoing: dict = field(default_factory=dict)       # (k, c) -> input gradient to send back
    sends: list = field(default_factory=list)          # started Isends
    totals: np.ndarray = field(default_factory=lambda: np.zeros(2))  # loss, correct (last stage)
    backwards: Counter = field(default_factory=Counter)  # c -> weight gradients added so far

    def rows(self, k: int) -> slice:
        return slice(*self.bounds[k])


def wait_for_sends(comm, requests) -> None:
    """Complete started sends: within the deadline of a watched communicator (its wait_all), else MPI's Waitall."""
    if hasattr(comm, "wait_all"):
        comm.wait_all(requests, "Isend (pipeline)")
    else:
        MPI.Request.Waitall(requests)


class PipelineMLP(Classifier):
    """This rank's stage of a fully connected sigmoid network trained with pipeline parallelism.

    comm: the stages (rank s holds stage s), used as given (pass nnlib.course.deadline.watch(comm, timeout)
    for a deadline on every message); layer_sizes, output, dtype, seed: as for Network (the same
    initial weights); micro_batches: m; schedule: a name of ``schedules`` ("gpipe" or "1f1b");
    split: None (layers as even as possible), or each stage's number of layers (stage_layers).
    ``layers``: this stage's slice of the network's layers, over its own flat params and grads.
    After each step: ``timeline`` holds this stage's (kind, micro-batch, start, end) of its
    computations (waits excluded) in seconds of time.perf_counter, one clock for all processes of
    a host, and ``timeline_chunks`` the chunk of each (0 unless the stage holds several);
    ``peak_alive`` the most micro-batches whose activations were kept at once,
    ``peak_activation_bytes`` their bytes.

    Generic points for other schedules: ``schedules`` (the names accepted), :meth:`programs` (the
    instruction lists of a step), ``chunks`` and :meth:`layer_ranges` (a stage holding several
    slices of layers, ``chunk_layers``; messages tagged per chunk); for keeping fewer activations,
    :meth:`keep_for_backward` and :meth:`restore_for_backward`.
    """

    schedules = SCHEDULES
    chunks = 1

    def __init__(self, comm, layer_sizes=(784, 128, 10), output: str = "sigmoid", dtype="float64",
                 seed: int = 0, micro_batches: int = 4, schedule: str = "1f1b", split=None):
        whole = Network(layer_sizes, output, dtype, seed=seed)
        check_pipeline_settings(comm.size, whole.num_layers, micro_batches, schedule, self.schedules, self.chunks,
                                split)
        require_same_on_every_rank(comm, "the pipeline (layer sizes, output, dtype, seed, micro-batches, schedule, "
                                   "split)", (whole.layer_sizes, output, str(np.dtype(dtype)), seed, micro_batches,
                                              schedule, None if split is None else tuple(split)))
        self.comm, self.layer_sizes, self.output, self.xp, self.dtype = comm, whole.layer_sizes, output, np, whole.dtype
        self.micro_batches, self.schedule, self.split = micro_batches, schedule, split
        self.stage, self.stages, self.num_layers = comm.rank, comm.size, whole.num_layers
        self.chunk_ranges = self.layer_ranges(self.stage)
        self.first, self.stop = self.chunk_ranges[0]
        self.is_first, self.is_last = self.stage == 0, self.stage == self.stages - 1
        self._take_layers(whole)
        self.weights, self.biases = [layer.weights for layer in self.layers], [layer.biases for layer in self.layers]
        self.grad_weights = [layer.grad_weights for layer in self.layers]
        self.grad_biases = [layer.grad_biases for layer in self.layers]
        self.last_correct, self.timeline, self.timeline_chunks, self.peak_alive, self.peak_activation_bytes = \
            0, [], [], 0, 0
        del whole

    def layer_ranges(self, stage: int) -> list[tuple[int, int]]:
        """[(first, stop)] weight layers of each chunk of ``stage``: one consecutive slice (stage_layers)."""
        return [stage_layers(self.num_layers, self.stages, self.split)[stage]]

    def programs(self, micro_batches: int) -> list[list[Instruction]]:
        """Every stage's instructions for one step of ``micro_batches`` micro-batches."""
        return self.schedules[self.schedule](self.stages, micro_batches)

    def _take_layers(self, whole: Network) -> None:
        """This stage's chunks of ``whole``: params and grads (the chunks' slices, concatenated), layers over them."""
        starts = parameter_offsets(whole.shapes)
        self.params = np.concatenate([whole.params[starts[first]:starts[stop]] for first, stop in self.chunk_ranges])
        self.grads = np.zeros_like(self.params)
        self.num_params = self.params.size  # this rank's share
        self.shapes = [shape for first, stop in self.chunk_ranges for shape in whole.shapes[first:stop]]
        self.chunk_layers, offset = [], 0
        for chunk, (first, stop) in enumerate(self.chunk_ranges):
            size, last = starts[stop] - starts[first], self.virtual(chunk) == self.stages * self.chunks - 1
            self.chunk_layers.append(dense_layers(self.params[offset:offset + size], self.grads[offset:offset + size],
                                                  whole.shapes[first:stop], self.output if last else "sigmoid"))
            offset += size
        self.layers = [layer for layers in self.chunk_layers for layer in layers]

    def virtual(self, chunk: int) -> int:
        """The virtual stage of this stage's chunk: chunk x P + stage (the stage itself when there is one chunk)."""
        return chunk * self.stages + self.stage

    def peer(self, chunk: int, step: int) -> tuple[int, int]:
        """(rank, chunk there) of virtual stage virtual(chunk) + step (+1: the next, -1: the one before)."""
        virtual = self.virtual(chunk) + step
        return virtual % self.stages, virtual // self.stages

    # -- one step on a whole batch: the executor ------------------------------------------------
    def loss_and_gradient(self, inputs, labels, normalizer=None, check: bool = True, on_device: bool = False,
                          on_layer_done=None):
        """The batch's cost J (the same on every rank) and this stage's gradient, in ``grads``.

        Every rank passes the same batch; min(m, N) micro-batches of it flow through the pipe, each
        stage running its instructions of the schedule one by one. The arguments are Network's;
        ``on_layer_done`` must be None (a layer's gradient is final only after the last micro-batch).
        """
        if on_layer_done is not None:
            raise ValueError("the overlap strategy sends each layer's gradient as soon as it is final; a pipeline "
                             "stage's are final only after its last micro-batch: use strategy 'allreduce' or nnlib.lesson08_inside_allreduce.zero.ZeRO")
        if check:
            self.check_inputs(inputs)
            self.check_labels(labels, inputs.shape[0])
        total = inputs.shape[0]
        count = min(self.micro_batches, total)
        if count == 0:  # no rows here (a replica's share of a small batch): its gradient is zero
            self.grads[...] = 0
        bounds = [(int(start), int(start + size)) for start, size in
                  zip(offsets(split_counts(total, count)), split_counts(total, count))]
        step = StepState(inputs, labels, 1.0 / (total if normalizer is None else normalizer), bounds)
        run = {"recv_forward": self._recv_forward, "forward": self._forward, "send_forward": self._send_forward,
               "recv_backward": self._recv_backward, "backward": self._backward, "send_backward": self._send_backward,
               "backward_input": self._backward_input, "backward_weight": self._backward_weight}
        self.timeline, self.timeline_chunks, self.peak_alive, self.peak_activation_bytes = [], [], 0, 0
        for instruction in self.programs(count)[self.stage]:
            began = time.perf_counter()
            run[instruction.kind](step, instruction.micro_batch, instruction.chunk)
            if instruction.kind in COMPUTE:
                self.timeline.append((COMPUTE[instruction.kind], instruction.micro_batch, began, time.perf_counter()))
                self.timeline_chunks.append(instruction.chunk)
        wait_for_sends(self.comm, step.sends)
        self.comm.Bcast(step.totals, root=self.stages - 1)  # every rank learns the step's loss
        self.last_correct = int(step.totals[1])
        return float(step.totals[0])

    def _recv_forward(self, step: StepState, k: int, chunk: int) -> None:
        """Receive micro-batch k's activation (rows, n_in of the chunk) from the virtual stage before."""
        rows = step.bounds[k][1] - step.bounds[k][0]
        step.arrived["forward", k, chunk] = np.empty((rows, self.chunk_layers[chunk][0].shape[0]), dtype=self.dtype)
        self.comm.Recv(step.arrived["forward", k, chunk], source=self.peer(chunk, -1)[0],
                       tag=chunk_tag(FORWARD_TAG, chunk))

    def _forward(self, step: StepState, k: int, chunk: int) -> None:
        """The chunk's layers on micro-batch k; keep the activations (and, last, the logits) for backward."""
        first, last = self.virtual(chunk) == 0, self.virtual(chunk) == self.stages * self.chunks - 1
        incoming = step.inputs[step.rows(k)] if first else step.arrived.pop(("forward", k, chunk))
        activations, logits = forward_layers(self.chunk_layers[chunk], incoming)
        step.kept[k, chunk] = self.keep_for_backward(chunk, activations, logits if last else None)
        self._count_kept(step)

    def keep_for_backward(self, chunk: int, activations, logits):
        """What a micro-batch's forward through ``chunk`` keeps until its backward: here all of it, the chunk's
        [a_in, ..., a_out] and (on the last virtual stage) the logits z_L. A hook: a subclass may keep less (its
        [a_in, a_out] list's last array is what send_forward sends) and rebuild the rest in
        :meth:`restore_for_backward` (nnlib.lesson12_memory's recomputation)."""
        return activations, logits

    def restore_for_backward(self, chunk: int, kept):
        """(activations [a_in, ..., a_out], logits or None) for the backward, from what keep_for_backward kept."""
        return kept

    def _send_forward(self, step: StepState, k: int, chunk: int) -> None:
        """Start sending micro-batch k's output activation to the next virtual stage."""
        rank, there = self.peer(chunk, +1)
        step.sends.append(self.comm.Isend(step.kept[k, chunk][0][-1], dest=rank, tag=chunk_tag(FORWARD_TAG, there)))

    def _recv_backward(self, step: StepState, k: int, chunk: int) -> None:
        """Receive dJ/da of the chunk's output for micro-batch k (rows, n_out) from the next virtual stage."""
        rows = step.bounds[k][1] - step.bounds[k][0]
        step.arrived["backward", k, chunk] = np.empty((rows, self.chunk_layers[chunk][-1].shape[1]), dtype=self.dtype)
        self.comm.Recv(step.arrived["backward", k, chunk], source=self.peer(chunk, +1)[0],
                       tag=chunk_tag(BACKWARD_TAG, chunk))

    def _output_delta(self, step: StepState, k: int, chunk: int, activations, logits):
        """dJ/dz of the chunk's top layer for micro-batch k: from the loss (the last virtual stage), else from the
        received dJ/da."""
        if self.virtual(chunk) == self.stages * self.chunks - 1:
            loss, correct, delta = output_loss(logits, self.loss_outputs(activations[-1]), step.labels[step.rows(k)],
                                               step.scale, self.output)
            step.totals += (float(loss), int(correct))
            return delta
        return self.chunk_layers[chunk][-1].logits_gradient(step.arrived.pop(("backward", k, chunk)), activations[-1])

    def loss_outputs(self, outputs):
        """The output activations a_L the loss is computed from: as they are (a hook: lesson 12's mixed precision
        computes the loss in float32 from its low-precision a_L)."""
        return outputs

    def _backward(self, step: StepState, k: int, chunk: int) -> None:
        """Backpropagation through the chunk for micro-batch k: add its gradient, keep the input gradient."""
        activations, logits = self.restore_for_backward(chunk, step.kept.pop((k, chunk)))
        delta = self._output_delta(step, k, chunk, activations, logits)
        gradient = backward_layers(self.chunk_layers[chunk], activations, delta, accumulate=step.backwards[chunk] > 0,
                                   input_gradient=self.virtual(chunk) > 0)
        step.backwards[chunk] += 1
        if gradient is not None:
            step.outgoing[k, chunk] = gradient

    def _backward_input(self, step: StepState, k: int, chunk: int) -> None:
        """B: the chunk's deltas and input gradient for micro-batch k; its layer inputs and deltas wait for W."""
        activations, logits = self.restore_for_backward(chunk, step.kept.pop((k, chunk)))
        delta = self._output_delta(step, k, chunk, activations, logits)
        deltas, gradient = input_gradients(self.chunk_layers[chunk], activations, delta, self.virtual(chunk) > 0)
        step.waiting[k, chunk] = (activations[:-1], deltas)
        self._count_kept(step)
        if gradient is not None:
            step.outgoing[k, chunk] = gradient

    def _backward_weight(self, step: StepState, k: int, chunk: int) -> None:
        """W: the chunk's weight gradients of micro-batch k, from what its B left waiting; added to grads."""
        activations, deltas = step.waiting.pop((k, chunk))
        weight_gradients(self.chunk_layers[chunk], activations, deltas, accumulate=step.backwards[chunk] > 0)
        step.backwards[chunk] += 1

    def _send_backward(self, step: StepState, k: int, chunk: int) -> None:
        """Start sending micro-batch k's input gradient to the virtual stage before."""
        rank, there = self.peer(chunk, -1)
        step.sends.append(self.comm.Isend(step.outgoing.pop((k, chunk)), dest=rank, tag=chunk_tag(BACKWARD_TAG, there)))

    def _count_kept(self, step: StepState) -> None:
        """Update peak_alive (micro-batches between their forward and their last backward) and their bytes.

        Bytes: the activations kept for B, the layer inputs and deltas kept for W; the network's own
        inputs (virtual stage 0's a_0, the caller's array) are not counted.
        """
        self.peak_alive = max(self.peak_alive, len(step.kept) + len(step.waiting))
        held = 0
        for (k, chunk), (activations, extra) in list(step.kept.items()) + list(step.waiting.items()):
            arrays = activations[1:] if self.virtual(chunk) == 0 else activations
            held += sum(array.nbytes for array in arrays)
            extras = extra if isinstance(extra, list) else [] if extra is None else [extra]  # deltas, or the logits
            held += sum(array.nbytes for array in extras)
        self.peak_activation_bytes = max(self.peak_activation_bytes, held)

    # -- evaluation and comparison --------------------------------------------------------------
    def predict_probabilities(self, inputs):
        """Output activations (N, n_L) on every rank: the whole batch forward through the (virtual) stages.

        Every rank passes the same inputs (and checks them, so that all agree on bad ones).
        """
        inputs = np.asarray(inputs)
        self.check_inputs(inputs)
        activation, sends = inputs, []
        for chunk, layers in enumerate(self.chunk_layers):
            if self.virtual(chunk) > 0:
                activation = np.empty((inputs.shape[0], layers[0].shape[0]), dtype=self.dtype)
                self.comm.Recv(activation, source=self.peer(chunk, -1)[0], tag=chunk_tag(FORWARD_TAG, chunk))
            output = np.ascontiguousarray(forward_layers(layers, activation)[0][-1])
            if self.virtual(chunk) < self.stages * self.chunks - 1:
                rank, there = self.peer(chunk, +1)
                sends.append(self.comm.Isend(output, dest=rank, tag=chunk_tag(FORWARD_TAG, there)))
        wait_for_sends(self.comm, sends)
        if not self.is_last:
            output = np.empty((inputs.shape[0], self.layer_sizes[-1]), dtype=self.dtype)
        self.comm.Bcast(output, root=self.stages - 1)
        return output

    def full_params(self) -> np.ndarray:
        """Every stage's parameters put in layer order: Network's flat layout.

        Each rank's params are its chunks' slices, in chunk order; with one chunk per stage the
        concatenation in rank order is already the layer order.
        """
        gathered = allgather_rows(self.comm, self.params)
        starts = parameter_offsets(list(zip(self.layer_sizes[:-1], self.layer_sizes[1:])))
        pieces, at = [], 0
        for stage in range(self.stages):
            for first, stop in self.layer_ranges(stage):
                pieces.append((first, gathered[at:at + starts[stop] - starts[first]]))
                at += starts[stop] - starts[first]
        return np.concatenate([piece for _, piece in sorted(pieces, key=lambda first_piece: first_piece[0])])

    def __repr__(self):
        layers = ", ".join(f"{first + 1}-{stop}" for first, stop in self.chunk_ranges)
        return (f"PipelineMLP({'-'.join(map(str, self.layer_sizes))}, stage {self.stage} of {self.stages}: "
                f"layers {layers}, {self.micro_batches} micro-batches, {self.schedule})")


def chunk_tag(direction_tag: int, chunk: int) -> int:
    """The MPI tag of a message (FORWARD_TAG or BACKWARD_TAG) to a stage's chunk: one channel per chunk."""
    return direction_tag + 2 * chunk


def check_pipeline_settings(stages: int, num_layers: int, micro_batches, schedule, schedules=SCHEDULES,
                            chunks: int = 1, split=None) -> None:
    """The same ValueError on every rank (the same arguments give the same verdict) for unusable settings.

    schedules: the names accepted; chunks: the slices of layers per stage (a layer each, at least);
    split: None, or the layer counts of the stages x chunks (virtual) stages (see stage_layers).
    """
    problem = None
    if schedule not in schedules:
        problem = f"schedule must be one of {', '.join(schedules)}; got {schedule!r}"
    elif not isinstance(micro_batches, int) or micro_batches < 1:
        problem = f"micro_batches must be a positive integer; got {micro_batches!r}"
    elif stages * chunks > num_layers:
        wanted = f"{stages} stages" if chunks == 1 else f"{stages} stages x {chunks} chunks"
        problem = (f"{wanted} but the network has only {num_layers} weight layers: "
                   "every stage needs at least one. Use fewer ranks or a deeper network")
    else:
        problem = split_problem(split, num_layers, stages * chunks)
    if problem:
        raise raised_on_every_rank(ValueError(problem))
