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

**Schedules are data.** A schedule is a function (stages, micro_batches) -> for each stage, the
list of :class:`Instruction` s it runs in order: "recv_forward", "forward", "send_forward",
"recv_backward", "backward", "send_backward", each for one micro-batch. One executor
(:meth:`PipelineMLP.loss_and_gradient`) runs any schedule, and :func:`simulate` runs the same
lists on a clock, so a schedule is tested and its bubble predicted without MPI (as in
ShallowSpeed's pipe.py and schedule.py). Two schedules of the same work (Huang et al. 2019, GPipe;
Narayanan et al. 2019, PipeDream):

``gpipe``  every stage runs all m forwards, then all m backwards. Simple; each stage keeps the
           activations of all m micro-batches until their backward.
``1f1b``   stage s runs P - s - 1 forwards to fill the pipe, then alternates one forward, one
           backward, then drains. The same idle time, but at most P - s micro-batches alive.

While the pipe fills and drains some stages wait: with equal stages the idle ("bubble") fraction
of a step is (P - 1) / (m + P - 1), so more micro-batches mean less waste.

A :class:`PipelineMLP` has the methods :func:`nnlib.lesson03_training.training.train` uses, so the sequential
trainer drives it: every rank passes the same batch (stage 0 uses the inputs, the last stage the
labels); the loss is sent from the last stage to all after each step. The communicator is used as
given; for a deadline on every message (lesson 10) pass a watched one,
``PipelineMLP(nnlib.lesson10_faults.watchdog.watch(comm, timeout), ...)``. :meth:`full_params` concatenates the
stages' vectors in rank order, which is exactly Network's flat layout.
"""

from __future__ import annotations

import time
from collections import defaultdict, deque
from dataclasses import dataclass, field

import numpy as np
from mpi4py import MPI

from nnlib.lesson02_network.network import (Classifier, Network, backward_layers, dense_layers, forward_layers,
                                            output_loss, parameter_offsets)
from nnlib.lesson04_collectives.collectives import (allgather_rows, offsets, raised_on_every_rank,
                                                    require_same_on_every_rank, split_counts)

LESSON = 9

FORWARD_TAG, BACKWARD_TAG = 1, 2
#: Where each message goes: a send's (direction, stage step) and a receive's (direction, the sender's step).
SENDS = {"send_forward": ("forward", +1), "send_backward": ("backward", -1)}
RECEIVES = {"recv_forward": ("forward", -1), "recv_backward": ("backward", +1)}
#: The computing instructions, and their letter in a timeline (F3: the forward of micro-batch 3).
COMPUTE = {"forward": "F", "backward": "B"}


def stage_layers(num_layers: int, stages: int):
    """[(first, stop)] weight layers of each stage: consecutive, as even as possible (earlier stages larger)."""
    counts = split_counts(num_layers, stages)
    return [(int(start), int(start + count)) for start, count in zip(offsets(counts), counts)]


# -- schedules: for each stage, a list of instructions -----------------------------------------------

@dataclass(frozen=True)
class Instruction:
    """One step of a stage's schedule.

    kind:        "recv_forward", "forward", "send_forward", "recv_backward", "backward" or "send_backward"
    micro_batch: k, which micro-batch (0 .. m-1)
    chunk:       which of the stage's model chunks (always 0 here: one slice of layers per stage;
                 an interleaved schedule gives a stage several). A zero-bubble schedule would add a
                 kind that computes the weight gradient only (Layer.weight_gradient), after "backward"
                 has sent the input gradient on.
    """

    kind: str
    micro_batch: int
    chunk: int = 0


def forward_steps(stage: int, stages: int, micro_batch: int) -> list[Instruction]:
    """Receive the activation (unless the first stage), run the forward, send it on (unless the last)."""
    steps = [Instruction("recv_forward", micro_batch)] if stage > 0 else []
    steps.append(Instruction("forward", micro_batch))
    return steps + ([Instruction("send_forward", micro_batch)] if stage < stages - 1 else [])


def backward_steps(stage: int, stages: int, micro_batch: int) -> list[Instruction]:
    """Receive the output gradient (unless the last stage), run the backward, send the input gradient back."""
    steps = [Instruction("recv_backward", micro_batch)] if stage < stages - 1 else []
    steps.append(Instruction("backward", micro_batch))
    return steps + ([Instruction("send_backward", micro_batch)] if stage > 0 else [])


def program(stage: int, stages: int, order) -> list[Instruction]:
    """A stage's instructions from its order of work, [("forward" | "backward", k)], messages included."""
    steps = {"forward": forward_steps, "backward": backward_steps}
    return [instruction for kind, k in order for instruction in steps[kind](stage, stages, k)]


def gpipe(stages: int, micro_batches: int) -> list[list[Instruction]]:
    """GPipe: on every stage all m forwards, then all m backwards (in the same order)."""
    order = [("forward", k) for k in range(micro_batches)] + [("backward", k) for k in range(micro_batches)]
    return [program(stage, stages, order) for stage in range(stages)]


def one_f_one_b(stages: int, micro_batches: int) -> list[list[Instruction]]:
    """1F1B: stage s runs w = min(P - s - 1, m) forwards, then alternates forward k + w and backward k, then drains."""
    programs = []
    for stage in range(stages):
        warmup = min(stages - stage - 1, micro_batches)
        order = [("forward", k) for k in range(warmup)]
        for k in range(micro_batches - warmup):
            order += [("forward", warmup + k), ("backward", k)]
        order += [("backward", k) for k in range(micro_batches - warmup, micro_batches)]
        programs.append(program(stage, stages, order))
    return programs


SCHEDULES = {"gpipe": gpipe, "1f1b": one_f_one_b}


def simulate(programs, seconds) -> list[list[tuple]]:
    """Run every stage's instructions on a clock, as the executor runs them; return the timelines.

    programs: a schedule's lists (one per stage). seconds(stage, kind): how long a computing
    instruction takes there. A send takes no time and never waits (MPI's Isend); a receive waits
    until the message has been sent, and takes the oldest one on its channel (MPI's order), which
    must be the micro-batch it names. Returns each stage's [(letter, k, start, end)] of its
    computations, like PipelineMLP.timeline. Raises RuntimeError if the schedule deadlocks, receives
    out of order, or sends what nobody receives.
    """
    position, clock = [0] * len(programs), [0.0] * len(programs)
    channels = defaultdict(deque)  # (direction, receiving stage) -> [(micro-batch, chunk, time sent)]
    timelines = [[] for _ in programs]
    progressed = True
    while progressed:
        progressed = False
        for stage, instructions in enumerate(programs):
            while position[stage] < len(instructions):
                instruction = instructions[position[stage]]
                if instruction.kind in RECEIVES:
                    channel = channels[RECEIVES[instruction.kind][0], stage]
                    if not channel:
                        break  # blocked: the message has not been sent yet
                    clock[stage] = max(clock[stage], received(channel, instruction, stage))
                elif instruction.kind in SENDS:
                    direction, step = SENDS[instruction.kind]
                    channels[direction, stage + step].append((instruction.micro_batch, instruction.chunk, clock[stage]))
                else:
                    began, clock[stage] = clock[stage], clock[stage] + seconds(stage, instruction.kind)
                    timelines[stage].append((COMPUTE[instruction.kind], instruction.micro_batch, began, clock[stage]))
                position[stage] += 1
                progressed = True
    check_finished(programs, position, channels)
    return timelines


def received(channel, instruction: Instruction, stage: int) -> float:
    """Take the oldest message of ``channel`` for ``instruction`` (a receive); the time it was sent."""
    micro_batch, chunk, sent = channel.popleft()
    if (micro_batch, chunk) != (instruction.micro_batch, instruction.chunk):
        raise RuntimeError(f"stage {stage} runs {instruction} but the next message on its channel is micro-batch "
                           f"{micro_batch} (chunk {chunk}): messages arrive in the order they were sent")
    return sent


def check_finished(programs, position, channels) -> None:
    """RuntimeError unless every stage ran all its instructions and every message was received."""
    stuck = [f"stage {stage} waits in {instructions[position[stage]]}"
             for stage, instructions in enumerate(programs) if position[stage] < len(instructions)]
    if stuck:
        raise RuntimeError("the schedule deadlocks: " + "; ".join(stuck))
    unread = [f"{len(channel)} {direction} message(s) to stage {stage}"
              for (direction, stage), channel in channels.items() if channel]
    if unread:
        raise RuntimeError("the schedule sends what no stage receives: " + "; ".join(unread))


# -- the executor -----------------------------------------------------------------------------------

@dataclass
class StepState:
    """What one step of a stage keeps between its instructions (see PipelineMLP.loss_and_gradient)."""

    inputs: object
    labels: object
    scale: float
    bounds: list                                       # (start, stop) rows of each micro-batch
    arrived: dict = field(default_factory=dict)        # ("forward" | "backward", k) -> received array
    kept: dict = field(default_factory=dict)           # k -> (activations, output logits or None)
    outgoing: dict = field(default_factory=dict)       # k -> input gradient to send back
    sends: list = field(default_factory=list)          # started Isends
    totals: np.ndarray = field(default_factory=lambda: np.zeros(2))  # loss, correct (last stage)
    backwards: int = 0                                 # backward instructions run so far

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

    comm: the stages (rank s holds stage s), used as given (pass nnlib.lesson10_faults.watchdog.watch(comm, timeout)
    for a deadline on every message); layer_sizes, output, dtype, seed: as for Network (the same
    initial weights); micro_batches: m; schedule: a name of SCHEDULES ("gpipe" or "1f1b").
    ``layers``: this stage's slice of the network's layers, over its own flat params and grads.
    After each step: ``timeline`` holds this stage's (kind, micro-batch, start, end) of its
    computations (waits excluded) in seconds of time.perf_counter, one clock for all processes of
    a host; ``peak_alive`` the most micro-batches whose activations were kept at once,
    ``peak_activation_bytes`` their bytes.
    """

    def __init__(self, comm, layer_sizes=(784, 128, 10), output: str = "sigmoid", dtype="float64",
                 seed: int = 0, micro_batches: int = 4, schedule: str = "1f1b"):
        whole = Network(layer_sizes, output, dtype, seed=seed)
        check_pipeline_settings(comm.size, whole.num_layers, micro_batches, schedule)
        require_same_on_every_rank(comm, "the pipeline (layer sizes, output, dtype, seed, micro-batches, schedule)",
                                   (whole.layer_sizes, output, str(np.dtype(dtype)), seed, micro_batches, schedule))
        self.comm, self.layer_sizes, self.output, self.xp, self.dtype = comm, whole.layer_sizes, output, np, whole.dtype
        self.micro_batches, self.schedule = micro_batches, schedule
        self.stage, self.stages, self.num_layers = comm.rank, comm.size, whole.num_layers
        self.first, self.stop = stage_layers(whole.num_layers, self.stages)[self.stage]
        self.is_first, self.is_last = self.stage == 0, self.stage == self.stages - 1
        layer_starts = parameter_offsets(whole.shapes)
        self.params = whole.params[layer_starts[self.first]:layer_starts[self.stop]].copy()
        self.grads = np.zeros_like(self.params)
        self.num_params = self.params.size  # this rank's share
        self.shapes = whole.shapes[self.first:self.stop]
        self.layers = dense_layers(self.params, self.grads, self.shapes, output if self.is_last else "sigmoid")
        self.weights, self.biases = [layer.weights for layer in self.layers], [layer.biases for layer in self.layers]
        self.grad_weights = [layer.grad_weights for layer in self.layers]
        self.grad_biases = [layer.grad_biases for layer in self.layers]
        self.last_correct, self.timeline, self.peak_alive, self.peak_activation_bytes = 0, [], 0, 0
        del whole

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
               "recv_backward": self._recv_backward, "backward": self._backward, "send_backward": self._send_backward}
        self.timeline, self.peak_alive, self.peak_activation_bytes = [], 0, 0
        for instruction in SCHEDULES[self.schedule](self.stages, count)[self.stage]:
            began = time.perf_counter()
            run[instruction.kind](step, instruction.micro_batch)
            if instruction.kind in COMPUTE:
                self.timeline.append((COMPUTE[instruction.kind], instruction.micro_batch, began, time.perf_counter()))
        wait_for_sends(self.comm, step.sends)
        self.comm.Bcast(step.totals, root=self.stages - 1)  # every rank learns the step's loss
        self.last_correct = int(step.totals[1])
        return float(step.totals[0])

    def _recv_forward(self, step: StepState, k: int) -> None:
        """Receive micro-batch k's activation (rows, n_in of this stage) from the stage before."""
        rows = step.bounds[k][1] - step.bounds[k][0]
        step.arrived["forward", k] = np.empty((rows, self.shapes[0][0]), dtype=self.dtype)
        self.comm.Recv(step.arrived["forward", k], source=self.stage - 1, tag=FORWARD_TAG)

    def _forward(self, step: StepState, k: int) -> None:
        """This stage's layers on micro-batch k; keep the activations (and, last, the logits) for backward."""
        incoming = step.inputs[step.rows(k)] if self.is_first else step.arrived.pop(("forward", k))
        activations, logits = forward_layers(self.layers, incoming)
        step.kept[k] = (activations, logits if self.is_last else None)
        self.peak_alive = max(self.peak_alive, len(step.kept))
        self.peak_activation_bytes = max(self.peak_activation_bytes, self._kept_bytes(step.kept))

    def _send_forward(self, step: StepState, k: int) -> None:
        """Start sending micro-batch k's output activation to the next stage."""
        step.sends.append(self.comm.Isend(step.kept[k][0][-1], dest=self.stage + 1, tag=FORWARD_TAG))

    def _recv_backward(self, step: StepState, k: int) -> None:
        """Receive dJ/da of this stage's output for micro-batch k (rows, n_out) from the next stage."""
        rows = step.bounds[k][1] - step.bounds[k][0]
        step.arrived["backward", k] = np.empty((rows, self.shapes[-1][1]), dtype=self.dtype)
        self.comm.Recv(step.arrived["backward", k], source=self.stage + 1, tag=BACKWARD_TAG)

    def _backward(self, step: StepState, k: int) -> None:
        """Backpropagation through this stage for micro-batch k: add its gradient, keep the input gradient."""
        activations, logits = step.kept.pop(k)
        if self.is_last:
            loss, correct, delta = output_loss(logits, activations[-1], step.labels[step.rows(k)], step.scale,
                                               self.output)
            step.totals += (float(loss), int(correct))
        else:
            delta = self.layers[-1].logits_gradient(step.arrived.pop(("backward", k)), activations[-1])
        gradient = backward_layers(self.layers, activations, delta, accumulate=step.backwards > 0,
                                   input_gradient=not self.is_first)
        step.backwards += 1
        if gradient is not None:
            step.outgoing[k] = gradient

    def _send_backward(self, step: StepState, k: int) -> None:
        """Start sending micro-batch k's input gradient to the stage before."""
        step.sends.append(self.comm.Isend(step.outgoing.pop(k), dest=self.stage - 1, tag=BACKWARD_TAG))

    def _kept_bytes(self, kept) -> int:
        """Bytes of the activations kept for backward (stage 0's inputs are the caller's, not counted)."""
        return sum(array.nbytes for activations, logits in kept.values()
                   for array in (activations[1:] if self.is_first else activations) + ([logits] if self.is_last else []))

    # -- evaluation and comparison --------------------------------------------------------------
    def predict_probabilities(self, inputs):
        """Output activations (N, n_L) on every rank: the whole batch forward through the stages.

        Every rank passes the same inputs (and checks them, so that all agree on bad ones).
        """
        inputs = np.asarray(inputs)
        self.check_inputs(inputs)
        if self.is_first:
            activation = inputs
        else:
            activation = np.empty((inputs.shape[0], self.shapes[0][0]), dtype=self.dtype)
            self.comm.Recv(activation, source=self.stage - 1, tag=FORWARD_TAG)
        output = np.ascontiguousarray(forward_layers(self.layers, activation)[0][-1])
        if not self.is_last:
            wait_for_sends(self.comm, [self.comm.Isend(output, dest=self.stage + 1, tag=FORWARD_TAG)])
            output = np.empty((inputs.shape[0], self.layer_sizes[-1]), dtype=self.dtype)
        self.comm.Bcast(output, root=self.stages - 1)
        return output

    def full_params(self) -> np.ndarray:
        """Every stage's parameters, concatenated in rank (= layer) order: Network's flat layout."""
        return allgather_rows(self.comm, self.params)

    def __repr__(self):
        return (f"PipelineMLP({'-'.join(map(str, self.layer_sizes))}, stage {self.stage} of {self.stages}: "
                f"layers {self.first + 1}-{self.stop}, {self.micro_batches} micro-batches, {self.schedule})")


def check_pipeline_settings(stages: int, num_layers: int, micro_batches, schedule) -> None:
    """The same ValueError on every rank (the same arguments give the same verdict) for unusable settings."""
    problem = None
    if schedule not in SCHEDULES:
        problem = f"schedule must be one of {', '.join(SCHEDULES)}; got {schedule!r}"
    elif not isinstance(micro_batches, int) or micro_batches < 1:
        problem = f"micro_batches must be a positive integer; got {micro_batches!r}"
    elif stages > num_layers:
        problem = (f"{stages} stages but the network has only {num_layers} weight layers: "
                   "every stage needs at least one. Use fewer ranks or a deeper network")
    if problem:
        raise raised_on_every_rank(ValueError(problem))


def bubble_fraction(stages: int, micro_batches: int) -> float:
    """The idle fraction of a pipeline step with equal stages: (P - 1) / (m + P - 1)."""
    return (stages - 1) / (micro_batches + stages - 1)


def step_span(timelines) -> float:
    """Seconds from the first computation of a step, on any stage, to the end of its last one.

    timelines: every stage's PipelineMLP.timeline of the same step (one host's clock).
    """
    start = min(begin for timeline in timelines for _, _, begin, _ in timeline)
    end = max(finish for timeline in timelines for _, _, _, finish in timeline)
    return end - start


def measured_bubble(timelines) -> float:
    """The idle fraction of a step from every stage's timeline: 1 - busy / (P x step_span)."""
    busy = sum(finish - begin for timeline in timelines for _, _, begin, finish in timeline)
    return 1.0 - busy / (len(timelines) * step_span(timelines))


def measure_bubbles(comm, layer_sizes, batch: int, micro_batch_counts=(1, 2, 4, 8, 16), schedule: str = "1f1b",
                    repeats: int = 5, dtype="float32", seed: int = 0):
    """The measured idle fraction of a pipeline step for each m, beside (P - 1) / (m + P - 1).

    Every rank runs ``repeats`` steps (after one warm-up) on the same random batch of ``batch``
    samples; the timelines go to rank 0. Returns, on rank 0, a list of dicts (micro_batches,
    measured: the median over the steps, formula, simulated: :func:`simulated_bubble` with each
    stage's median forward and backward times, step_seconds: the median :func:`step_span`,
    peak_alive: per stage, peak_bytes: per stage, timelines: the last step's); None elsewhere.
    """
    rng = np.random.default_rng(seed)
    inputs = rng.random((batch, layer_sizes[0])).astype(dtype)
    labels = rng.integers(0, layer_sizes[-1], batch)
    rows = []
    for micro_batches in micro_batch_counts:
        pipeline = PipelineMLP(comm, layer_sizes, dtype=dtype, seed=seed, micro_batches=micro_batches,
                               schedule=schedule)
        measured, simulated, spans = [], [], []
        for repeat in range(repeats + 1):
            pipeline.comm.Barrier()
            pipeline.loss_and_gradient(inputs, labels, check=False)
            timelines = pipeline.comm.gather(pipeline.timeline, root=0)
            if repeat and comm.rank == 0:
                measured.append(measured_bubble(timelines))
                spans.append(step_span(timelines))
                durations = [{kind: float(np.median([end - begin for what, _, begin, end in timeline if what == kind]))
                              for kind in "FB"} for timeline in timelines]
                simulated.append(simulated_bubble([stage["F"] for stage in durations],
                                                  [stage["B"] for stage in durations], schedule, micro_batches))
        alive = pipeline.comm.gather((pipeline.peak_alive, pipeline.peak_activation_bytes), root=0)
        if comm.rank == 0:
            rows.append(dict(micro_batches=micro_batches, measured=float(np.median(measured)),
                             formula=bubble_fraction(comm.size, micro_batches), simulated=float(np.median(simulated)),
                             step_seconds=float(np.median(spans)),
                             peak_alive=[count for count, _ in alive], peak_bytes=[size for _, size in alive],
                             timelines=timelines))
    return rows if comm.rank == 0 else None


def simulated_bubble(forward_seconds, backward_seconds, schedule: str, micro_batches: int) -> float:
    """The idle fraction that ``schedule`` must have with these per-stage times (no message cost).

    forward_seconds[s], backward_seconds[s]: stage s's time for one micro-batch. The schedule's
    instruction lists run in :func:`simulate` (the very lists the executor runs): F(s, k) waits for
    F(s-1, k)'s message, B(s, k) for B(s+1, k)'s. With equal stages this gives (P - 1) / (m + P - 1);
    real stages are not equal (the first has no input gradient to compute, the last computes the
    loss), and this says what that costs.
    """
    seconds = {"forward": forward_seconds, "backward": backward_seconds}
    programs = SCHEDULES[schedule](len(forward_seconds), micro_batches)
    return measured_bubble(simulate(programs, lambda stage, kind: seconds[kind][stage]))
