"""Pipeline (inter-layer) parallelism: consecutive layers on consecutive ranks, micro-batches flowing through.

Rank s (a *stage*) holds the consecutive weight layers split_counts(L, P) gives it, and only
those. A batch of N samples is cut into m micro-batches; micro-batch k flows forward

    stage 0 --a--> stage 1 --a--> ... --> stage P-1 (loss, delta_L)

with point-to-point messages (the activations of the stage's last layer), and back

    stage 0 <--g-- stage 1 <--g-- ... <-- stage P-1,    g = delta_first @ W_first.T

(the gradient with respect to the stage's input activation; the receiver multiplies it by
a (1 - a) to get its own top layer's delta). Each stage adds the weight gradients of the m
micro-batches, each divided by the whole batch's N, so that one step equals the sequential step
on the whole batch (up to the order of the additions).

Two schedules of the same work (Huang et al. 2019, GPipe; Narayanan et al. 2019, PipeDream):

``gpipe``  every stage runs all m forwards, then all m backwards. Simple; each stage keeps the
           activations of all m micro-batches until their backward.
``1f1b``   stage s runs P - s - 1 forwards to fill the pipe, then alternates one forward, one
           backward, then drains. The same idle time, but at most P - s micro-batches alive.

While the pipe fills and drains some stages wait: with equal stages the idle ("bubble") fraction
of a step is (P - 1) / (m + P - 1), so more micro-batches mean less waste.

A :class:`PipelineMLP` has the methods :func:`nnlib.training.train` uses, so the sequential
trainer drives it: every rank passes the same batch (stage 0 uses the inputs, the last stage the
labels); the loss is sent from the last stage to all after each step. Its messages run under the
watchdog's deadline. :meth:`full_params` concatenates the stages' vectors in rank order, which
is exactly Network's flat layout.
"""

from __future__ import annotations

import time

import numpy as np
from mpi4py import MPI

from ..collectives import offsets, split_counts
from ..network import (Network, cross_entropy_from_logits, layer_activation, layer_views, one_hot_targets,
                       parameter_offsets, sigmoid_prime_from_activation, store_gradient)
from ..watchdog import watch
from ..collectives import raised_on_every_rank, require_same_on_every_rank

LESSON = 9


SCHEDULES = ("gpipe", "1f1b")
FORWARD_TAG, BACKWARD_TAG = 1, 2


def stage_layers(num_layers: int, stages: int):
    """[(first, stop)] weight layers of each stage: consecutive, as even as possible (earlier stages larger)."""
    counts = split_counts(num_layers, stages)
    return [(int(start), int(start + count)) for start, count in zip(offsets(counts), counts)]


def schedule_order(schedule: str, stage: int, stages: int, micro_batches: int):
    """The order of work on ``stage``: a list of ("F", k) and ("B", k) for micro-batches k."""
    if schedule == "gpipe":
        return [("F", k) for k in range(micro_batches)] + [("B", k) for k in range(micro_batches)]
    warmup = min(stages - stage - 1, micro_batches)
    order = [("F", k) for k in range(warmup)]
    for k in range(micro_batches - warmup):
        order += [("F", warmup + k), ("B", k)]
    order += [("B", k) for k in range(micro_batches - warmup, micro_batches)]
    return order


class PipelineMLP:
    """This rank's stage of a fully connected sigmoid network trained with pipeline parallelism.

    comm: the stages (rank s holds stage s); layer_sizes, output, dtype, seed: as for Network (the
    same initial weights); micro_batches: m; schedule: "gpipe" or "1f1b"; timeout: the deadline of
    every message (nnlib.watchdog). After each step: ``timeline`` holds this stage's
    (kind, micro-batch, start, end) of its computations (waits excluded) in seconds of
    time.perf_counter, one clock for all processes of a host; ``peak_alive`` the most
    micro-batches whose activations were kept at once, ``peak_activation_bytes`` their bytes.
    """

    def __init__(self, comm, layer_sizes=(784, 128, 10), output: str = "sigmoid", dtype="float64",
                 seed: int = 0, micro_batches: int = 4, schedule: str = "1f1b", timeout=None):
        self.comm = watch(comm, timeout)
        reference = Network(layer_sizes, output, dtype, seed=seed)
        problem = None
        if schedule not in SCHEDULES:
            problem = f"schedule must be one of {', '.join(SCHEDULES)}; got {schedule!r}"
        elif not isinstance(micro_batches, int) or micro_batches < 1:
            problem = f"micro_batches must be a positive integer; got {micro_batches!r}"
        elif self.comm.size > reference.num_layers:
            problem = (f"{self.comm.size} stages but the network has only {reference.num_layers} weight layers: "
                       "every stage needs at least one. Use fewer ranks or a deeper network")
        if problem:
            raise raised_on_every_rank(ValueError(problem))  # the same arguments on every rank give the same verdict
        require_same_on_every_rank(self.comm, "the pipeline (layer sizes, output, dtype, seed, micro-batches, schedule)",
              (reference.layer_sizes, output, str(np.dtype(dtype)), seed, micro_batches, schedule))
        self.layer_sizes, self.output, self.xp, self.dtype = reference.layer_sizes, output, np, reference.dtype
        self.micro_batches, self.schedule = micro_batches, schedule
        self.stage, self.stages = self.comm.rank, self.comm.size
        self.first, self.stop = stage_layers(reference.num_layers, self.stages)[self.stage]
        self.is_first, self.is_last = self.stage == 0, self.stage == self.stages - 1
        self.num_layers = reference.num_layers
        layer_starts = parameter_offsets(reference.shapes)
        begin, end = layer_starts[self.first], layer_starts[self.stop]
        self.params = reference.params[begin:end].copy()
        self.grads = np.zeros_like(self.params)
        self.num_params = self.params.size  # this rank's share
        self.shapes = reference.shapes[self.first:self.stop]
        self.weights, self.biases = layer_views(self.params, self.shapes)
        self.grad_weights, self.grad_biases = layer_views(self.grads, self.shapes)
        self.last_correct, self.timeline, self.peak_alive, self.peak_activation_bytes = 0, [], 0, 0
        del reference

    # Network's own code where nothing differs (evaluation goes through predict_probabilities below)
    check_inputs = Network.check_inputs
    check_labels = Network.check_labels
    predict = Network.predict
    accuracy = Network.accuracy

    # -- one micro-batch through this stage ----------------------------------------------------
    def _forward(self, inputs):
        """This stage's activations [a_in, ..., a_out] for one micro-batch."""
        activations = [inputs]
        for local, (weights, biases) in enumerate(zip(self.weights, self.biases)):
            logits = activations[-1] @ weights + biases
            activations.append(layer_activation(logits, self.first + local == self.num_layers - 1, self.output, np))
        self.output_logits = logits
        return activations

    def _backward(self, activations, delta, accumulate):
        """Add this micro-batch's gradients; return the gradient for the stage's input (or None on stage 0)."""
        for local in range(len(self.shapes) - 1, -1, -1):
            store_gradient(activations[local].T @ delta, np.sum(delta, axis=0), self.grad_weights[local],
                           self.grad_biases[local], accumulate)
            if local > 0:
                delta = (delta @ self.weights[local].T) * sigmoid_prime_from_activation(activations[local])
        return None if self.is_first else delta @ self.weights[0].T

    # -- one step on a whole batch ----------------------------------------------------------
    def loss_and_gradient(self, inputs, labels, normalizer=None, check: bool = True, on_device: bool = False):
        """The batch's cost J (the same on every rank) and this stage's gradient, in ``grads``.

        Every rank passes the same batch; min(m, N) micro-batches of it flow through the pipe.
        """
        if check:
            self.check_inputs(inputs)
            self.check_labels(labels, inputs.shape[0])
        total = inputs.shape[0]
        scale = 1.0 / (total if normalizer is None else normalizer)
        count = min(self.micro_batches, total)
        bounds = [(int(start), int(start + size)) for start, size in
                  zip(offsets(split_counts(total, count)), split_counts(total, count))]
        kept, sends, seen_backward = {}, [], set()
        totals = np.zeros(2)  # loss and correct answers, on the last stage
        self.timeline, self.peak_alive, self.peak_activation_bytes = [], 0, 0
        for kind, k in schedule_order(self.schedule, self.stage, self.stages, count):
            start, stop = bounds[k]
            if kind == "F":
                if self.is_first:
                    incoming = inputs[start:stop]
                else:
                    incoming = np.empty((stop - start, self.shapes[0][0]), dtype=self.dtype)
                    self.comm.Recv(incoming, source=self.stage - 1, tag=FORWARD_TAG)
                work_began = time.perf_counter()
                kept[k] = self._forward(incoming)
                if self.is_last:
                    kept[k].append(self.output_logits)
                else:
                    sends.append(self.comm.Isend(kept[k][-1], dest=self.stage + 1, tag=FORWARD_TAG))
                self.peak_alive = max(self.peak_alive, len(kept))
                self.peak_activation_bytes = max(self.peak_activation_bytes, self._kept_bytes(kept))
            else:
                if self.is_last:
                    work_began = time.perf_counter()
                    *activations, logits = kept.pop(k)
                    targets = one_hot_targets(labels[start:stop], self.layer_sizes[-1], self.dtype, np)
                    totals[0] += float(cross_entropy_from_logits(logits, targets, self.output, np)) * scale
                    totals[1] += np.count_nonzero(np.argmax(activations[-1], axis=1) == labels[start:stop])
                    delta = (activations[-1] - targets) * scale
                else:
                    gradient = np.empty((stop - start, self.shapes[-1][1]), dtype=self.dtype)
                    self.comm.Recv(gradient, source=self.stage + 1, tag=BACKWARD_TAG)
                    work_began = time.perf_counter()
                    activations = kept.pop(k)
                    delta = gradient * sigmoid_prime_from_activation(activations[-1])
                outgoing = self._backward(activations, delta, accumulate=bool(seen_backward))
                seen_backward.add(k)
                if outgoing is not None:
                    sends.append(self.comm.Isend(outgoing, dest=self.stage - 1, tag=BACKWARD_TAG))
            self.timeline.append((kind, k, work_began, time.perf_counter()))
        self.comm.wait_all(sends, "Isend (pipeline)")
        self.comm.Bcast(totals, root=self.stages - 1)  # every rank learns the step's loss
        self.last_correct = int(totals[1])
        return float(totals[0])

    def _kept_bytes(self, kept) -> int:
        """Bytes of the activations kept for backward (stage 0's inputs are the caller's, not counted)."""
        return sum(array.nbytes for arrays in kept.values()
                   for array in (arrays[1:] if self.is_first else arrays))

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
        output = np.ascontiguousarray(self._forward(activation)[-1])
        if not self.is_last:
            self.comm.wait_all([self.comm.Isend(output, dest=self.stage + 1, tag=FORWARD_TAG)])
            output = np.empty((inputs.shape[0], self.layer_sizes[-1]), dtype=self.dtype)
        self.comm.Bcast(output, root=self.stages - 1)
        return output

    def full_params(self) -> np.ndarray:
        """Every stage's parameters, concatenated in rank (= layer) order: Network's flat layout."""
        from ..collectives import allgather_rows

        return allgather_rows(self.comm, self.params)

    def __repr__(self):
        return (f"PipelineMLP({'-'.join(map(str, self.layer_sizes))}, stage {self.stage} of {self.stages}: "
                f"layers {self.first + 1}-{self.stop}, {self.micro_batches} micro-batches, {self.schedule})")


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

    forward_seconds[s], backward_seconds[s]: stage s's time for one micro-batch. Each stage runs
    its schedule_order one item at a time; F(s, k) waits for F(s-1, k), B(s, k) for B(s+1, k).
    With equal stages this gives (P - 1) / (m + P - 1); real stages are not equal (the first has
    no input gradient to compute, the last computes the loss), and this says what that costs.
    """
    stages = len(forward_seconds)
    orders = [schedule_order(schedule, stage, stages, micro_batches) for stage in range(stages)]
    done, position, clock = {}, [0] * stages, [0.0] * stages
    while any(position[stage] < len(orders[stage]) for stage in range(stages)):
        progressed = False
        for stage in range(stages):
            while position[stage] < len(orders[stage]):
                kind, k = orders[stage][position[stage]]
                needs = (stage - 1, "F", k) if kind == "F" and stage > 0 else \
                        (stage + 1, "B", k) if kind == "B" and stage < stages - 1 else None
                if needs is not None and needs not in done:
                    break
                begin = max(clock[stage], done[needs] if needs else 0.0)
                clock[stage] = begin + (forward_seconds[stage] if kind == "F" else backward_seconds[stage])
                done[(stage, kind, k)] = clock[stage]
                position[stage] += 1
                progressed = True
        if not progressed:
            raise RuntimeError("the schedule deadlocks")  # cannot happen with schedule_order's orders
    busy = micro_batches * (sum(forward_seconds) + sum(backward_seconds))
    return 1.0 - busy / (stages * max(clock))
