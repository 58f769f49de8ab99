"""Pipeline (inter-layer) parallelism: consecutive layers on consecutive ranks, micro-batches flowing through.

Rank s (a *stage*) holds the consecutive weight layers stage_layers(L, P) gives it, and only those. A batch of N
samples is cut into m micro-batches; micro-batch k flows forward and back with point-to-point messages:

    forward:   stage 0 --a--> stage 1 --a--> ... --> stage P-1 (loss, delta_L)
    backward:  stage 0 <--g-- stage 1 <--g-- ... <-- stage P-1,    g = delta_first @ W_first.T

(a: the stage's output; g: the gradient with respect to its input). Each stage adds the weight gradients of the m
micro-batches, each divided by the whole batch's N: one step is the sequential step on the whole batch.
**Schedules are data** (instructions.py): :meth:`PipelineMLP.loss_and_gradient` runs its stage's instructions,
each a :class:`Stage` method of the same name. For a deadline on every message, pass deadline.watch(comm, t).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
from mpi4py import MPI

from nnlib.lesson02_network.arrays import namespace_of_device, to_numpy
from nnlib.lesson02_network.network import (Classifier, Network, backward_layers, dense_layers, forward_layers,
                                            output_loss, parameter_offsets)
from nnlib.lesson04_collectives.collectives import (allgather_rows, raised_on_every_rank, require_same_on_every_rank,
                                                    split_evenly)
from nnlib.lesson12_pipeline.instructions import COMPUTE, SCHEDULES

LESSON = 12


def stage_layers(num_layers: int, stages: int, cut=None) -> list[tuple[int, int]]:
    """[(first, stop)] weight layers of each stage: consecutive, as even as possible (earlier stages larger), or cut[s]
    on stage s, e.g. (2, 5) (balance.balanced_cut cuts by cost). A bad cut: the same ValueError on every rank."""
    counts = split_evenly(num_layers, stages)[0] if cut is None else list(cut) if isinstance(cut, (tuple, list)) else []
    if len(counts) != stages or sum(counts) != num_layers or not all(
            isinstance(count, (int, np.integer)) and not isinstance(count, bool) and count > 0 for count in counts):
        raise raised_on_every_rank(ValueError(f"cut must give each of the {stages} stages a positive whole number of "
                                              f"layers, {num_layers} in all; got {cut!r}"))
    stops = np.cumsum(counts).tolist()
    return [(stop - count, stop) for stop, count in zip(stops, counts)]


@dataclass
class Step:
    """One step's batch, 1 / N, each micro-batch's rows, the sends started, and the loss and correct answers."""

    inputs: object
    labels: object
    scale: float
    bounds: list  # (start, stop) rows of each micro-batch
    sends: list = field(default_factory=list)
    totals: np.ndarray = field(default_factory=lambda: np.zeros(2))


class Stage:
    """One slice of consecutive layers at ``position`` in the pipe, talking to the ranks ``before`` and ``after`` it
    (None at an end). Each instruction kind is a method (step, k); between them a micro-batch's arrays wait in
    ``arrived`` (received), ``kept`` (activations and logits, forward to backward) and ``outgoing`` (the input
    gradient, to send). A message to position j is tagged 2 j (forward) or 2 j + 1 (backward)."""

    on_forward = None  # a hook: called with each micro-batch's input as the forward takes it (lesson 18 counts)

    def __init__(self, comm, layers, position: int, before: int | None, after: int | None):
        self.comm, self.layers, self.position, self.before, self.after = comm, layers, position, before, after
        self.dtype, self.xp = layers[0].weights.dtype, layers[0].xp
        self.begin()

    def begin(self) -> None:
        """Forget the last step's micro-batches; the next backward writes the gradient (the ones after it add)."""
        self.arrived, self.kept, self.outgoing, self.added = {}, {}, {}, 0

    def alive(self) -> int:
        """Micro-batches forwarded whose backward has not run yet (their activations are kept)."""
        return len(self.kept)

    def recv_forward(self, step: Step, k: int) -> None:
        start, stop = step.bounds[k]
        self.arrived[k] = self.xp.empty((stop - start, self.layers[0].shape[0]), self.dtype)
        self.comm.Recv(self.arrived[k], source=self.before, tag=2 * self.position)

    def forward(self, step: Step, k: int) -> None:
        incoming = step.inputs[slice(*step.bounds[k])] if self.before is None else self.arrived.pop(k)
        if self.on_forward is not None:
            self.on_forward(incoming)
        activations, logits = forward_layers(self.layers, incoming)
        self.kept[k] = activations, logits if self.after is None else None  # z_out: only the loss needs it

    def send_forward(self, step: Step, k: int) -> None:
        activations, _ = self.kept[k]
        step.sends.append(self.comm.Isend(activations[-1], dest=self.after, tag=2 * self.position + 2))

    def recv_backward(self, step: Step, k: int) -> None:
        start, stop = step.bounds[k]
        self.arrived[k] = self.xp.empty((stop - start, self.layers[-1].shape[1]), self.dtype)
        self.comm.Recv(self.arrived[k], source=self.after, tag=2 * self.position + 1)

    def output_delta(self, step: Step, k: int, activations, logits):
        """dJ/dz of the top layer for micro-batch k: from the loss on the last stage, else from the received dJ/da."""
        if self.after is not None:
            return self.layers[-1].logits_gradient(self.arrived.pop(k), activations[-1])
        loss, correct, delta = output_loss(logits, activations[-1], step.labels[slice(*step.bounds[k])], step.scale,
                                           self.layers[-1].activation)
        step.totals += (float(loss), int(correct))
        return delta

    def backward(self, step: Step, k: int) -> None:
        activations, logits = self.kept.pop(k)
        delta = self.output_delta(step, k, activations, logits)
        gradient = backward_layers(self.layers, activations, delta, self.added > 0, input_gradient=self.position > 0)
        self.added += 1
        if gradient is not None:
            self.outgoing[k] = gradient

    def send_backward(self, step: Step, k: int) -> None:
        step.sends.append(self.comm.Isend(self.outgoing.pop(k), dest=self.before, tag=2 * self.position - 1))


class PipelineMLP(Classifier):
    """This rank's stage of a fully connected sigmoid network trained with pipeline parallelism.

    comm: the stages (rank s holds stage s); layer_sizes, output, dtype, seed, device (by name): as for Network (the
    same initial weights; on a GPU, a comm staging its buffers: lesson 08's HostStaging); micro_batches: m; schedule:
    a key of ``schedules``; cut (by name): each stage's number of layers, e.g. (2, 5); None: stage_layers' even cut.
    ``params``, ``grads``: this stage's slices of Network's flat vectors, ``layers`` over them; ``held``: the stages
    this rank holds (here one), ``runs(instruction)`` the one that runs it. After each step:
    ``timeline``, this stage's (letter, micro-batch, start, end) computations (time.perf_counter seconds, one clock
    per host; waits excluded), ``peak_alive``, the most micro-batches kept at once, and ``program``, the instructions.
    """

    schedules, letters = SCHEDULES, COMPUTE

    def __init__(self, comm, layer_sizes=(784, 128, 10), output: str = "sigmoid", dtype="float64",
                 seed: int = 0, micro_batches: int = 4, schedule: str = "1f1b", **placement):
        device, cut = placement.pop("device", "cpu"), placement.pop("cut", None)  # (where the layers go, by name)
        if placement:
            raise TypeError(f"PipelineMLP takes device and cut by name, nothing else; got {', '.join(placement)}")
        whole = Network(layer_sizes, output, dtype, seed=seed)
        self.check_settings(comm.size, whole.num_layers, micro_batches, schedule)
        self.cut = cut = tuple(cut) if isinstance(cut, (tuple, list, np.ndarray)) else cut
        require_same_on_every_rank(comm, "the pipeline (layers, output, dtype, seed, micro-batches, schedule, cut)",
                                   (whole.layer_sizes, output, str(whole.dtype), seed, micro_batches, schedule, cut))
        stage_layers(whole.num_layers, comm.size, self.cut)  # (a bad cut: the same ValueError on every rank)
        self.comm, self.layer_sizes, self.output, self.dtype = comm, whole.layer_sizes, output, whole.dtype
        self.xp = namespace_of_device(device)
        self.micro_batches, self.schedule = micro_batches, schedule
        self.stage, self.stages, self.num_layers = comm.rank, comm.size, whole.num_layers
        self.held = self.hold_layers(whole)
        self.layers = [layer for held in self.held for layer in held.layers]
        self.last_correct, self.timeline, self.program, self.peak_alive, self.compiled = 0, [], [], 0, {}

    def check_settings(self, pieces: int, num_layers: int, micro_batches, schedule) -> None:
        """Raise the same ValueError on every rank for unusable settings; pieces: the stages the layers make."""
        for wrong, problem in [
                (schedule not in self.schedules,
                 f"schedule must be one of {', '.join(self.schedules)}; got {schedule!r}"),
                (not isinstance(micro_batches, int) or micro_batches < 1,
                 f"micro_batches must be a positive integer; got {micro_batches!r}"),
                (pieces > num_layers, f"{pieces} stages but the network has only {num_layers} weight layers: every "
                                      "stage needs at least one. Use fewer ranks or a deeper network")]:
            if wrong:
                raise raised_on_every_rank(ValueError(problem))

    def hold_layers(self, whole: Network) -> list[Stage]:
        """This rank's stage: layers [first, stop) over a copy of their slice of ``whole``'s params (and grads)."""
        self.first, self.stop = stage_layers(whole.num_layers, self.stages, self.cut)[self.stage]
        starts, last = parameter_offsets(whole.shapes), self.stage == self.stages - 1
        self.params = self.xp.asarray(whole.params[starts[self.first]:starts[self.stop]].copy())
        self.grads, self.num_params = self.xp.zeros_like(self.params), self.params.size
        layers = dense_layers(self.params, self.grads, whole.shapes[self.first:self.stop],
                              self.output if last else "sigmoid", self.xp)
        return [Stage(self.comm, layers, self.stage, self.stage - 1 if self.stage else None, None if last
                      else self.stage + 1)]

    def runs(self, instruction) -> Stage:
        return self.held[0]

    def loss_and_gradient(self, inputs, labels, normalizer=None, check: bool = True, on_device: bool = False,
                          on_layer_done=None):
        """The batch's cost J (the same on every rank) and this stage's gradient, in ``grads``; Network's arguments.

        Every rank passes the same batch, cut into min(m, N) micro-batches; each stage runs its schedule's list."""
        if on_layer_done is not None:
            raise ValueError("the overlap strategy sends each layer's gradient as soon as it is final; a pipeline "
                             "stage's are final only after its last micro-batch: use strategy 'allreduce'")
        if check:
            self.check_inputs(inputs)
            self.check_labels(labels, inputs.shape[0])
        count = min(self.micro_batches, inputs.shape[0])
        bounds = stage_layers(inputs.shape[0], count) if count else []  # the same even split, of rows
        step = Step(inputs, labels, 1.0 / (inputs.shape[0] if normalizer is None else normalizer), bounds)
        if not count:  # a replica's share of a small batch may have no rows: its gradient is 0
            self.grads[...] = 0
        for held in self.held:
            held.begin()
        if count not in self.compiled:  # each instruction once: (the method that runs it, k, its letter or None)
            program = self.programs(count)[self.stage]
            self.compiled[count] = program, [(getattr(self.runs(instruction), instruction.kind),
                                              instruction.micro_batch, self.letters.get(instruction.kind))
                                             for instruction in program]
        (self.program, steps), self.timeline, self.peak_alive = self.compiled[count], [], 0
        for run, k, letter in steps:
            began = time.perf_counter()
            run(step, k)
            if letter:
                self.timeline.append((letter, k, began, time.perf_counter()))
                if letter == "F":  # (only a forward adds a micro-batch alive)
                    self.peak_alive = max(self.peak_alive, sum(held.alive() for held in self.held))
        wait_for_sends(self.comm, step.sends)
        self.comm.Bcast(step.totals, root=self.stages - 1)  # every rank learns the step's loss
        self.last_correct = int(step.totals[1])
        return float(step.totals[0])

    def programs(self, micro_batches: int) -> list:
        """Every stage's instructions for one step of ``micro_batches`` micro-batches."""
        return self.schedules[self.schedule](self.stages, micro_batches)

    def predict_probabilities(self, inputs):
        """Output activations (N, n_L) on every rank: the whole batch forward through the stages, in order (every
        rank passes the same inputs, and checks them, so that all agree on bad ones)."""
        inputs = self.xp.asarray(inputs)
        self.check_inputs(inputs)
        step = Step(inputs, None, 1.0, [(0, inputs.shape[0])])
        for held in self.held:  # (in the order of the pipe)
            held.begin()
            if held.before is not None:
                held.recv_forward(step, 0)
            held.forward(step, 0)
            if held.after is not None:
                held.send_forward(step, 0)
        wait_for_sends(self.comm, step.sends)
        last = self.held[-1]
        output = last.kept[0][0][-1] if last.after is None else self.xp.empty((inputs.shape[0], self.layer_sizes[-1]),
                                                                               self.dtype)
        self.comm.Bcast(output, root=self.stages - 1)
        return output

    def full_params(self) -> np.ndarray:
        """Every stage's parameters in layer order (rank order): Network's flat layout."""
        return allgather_rows(self.comm, to_numpy(self.params))


def wait_for_sends(comm, requests) -> None:
    """Complete started sends: within the deadline of a watched communicator (its wait_all), else MPI's Waitall."""
    if hasattr(comm, "wait_all"):
        comm.wait_all(requests, "Isend (pipeline)")
    else:
        MPI.Request.Waitall(requests)
