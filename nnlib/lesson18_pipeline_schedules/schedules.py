"""Three newer pipeline schedules, as data for lesson 12's executor, which this module extends.

Lesson 12's 1F1B leaves every stage idle for (P - 1)(F + B) of a step (F, B: one micro-batch's
forward and backward time on a stage), a fraction (P - 1) / (m + P - 1). Two ideas shrink it:

``interleaved`` (Narayanan et al. 2021, Megatron-LM) gives each of the P ranks v *chunks*: the network is cut into v P
    slices, and chunk c of rank s is virtual stage c P + s, so a micro-batch passes every rank v times. Each chunk's
    work takes 1/v of a stage's, and so does the fill and drain: the idle time is (P - 1)(F + B) / v, a fraction
    (P - 1) / (v m + P - 1). The price: more messages (v times as many) and more micro-batch chunks alive at once.
``zb-h1``, ``zb-h2`` (Qi et al. 2024, zero-bubble pipeline parallelism) split the backward in two: B, every layer's
    delta and the input gradient (what the stage before waits for), and W, the weight gradients a_in.T @ delta (which
    nobody waits for). Deferring W into the gaps: ZB-H1 (1F1B's warm-up; stage s defers its first s W's) idles
    (P - 1) max(F + B - W, F) per stage, a third of 1F1B's when F = B = W; ZB-H2 (twice the warm-up forwards,
    2 (P - s - 1), and 2 s deferred W's) idles (P - 1) max(F + B - 2W, F): the last bubble, the fill's (P - 1) F, goes
    away only when consecutive steps overlap, which needs the paper's trick for the optimizer step.

Peak micro-batches alive on stage s (forwarded, not yet through W): 1F1B min(P - s, m); ZB-H1
min(P, m) (1F1B's P - s waiting for B plus up to s waiting for W); ZB-H2 2P - 1 on every stage (ZB-H1's
with m < 2P - 1); interleaved, in chunks: min((v - 1) G + 2 (P - s - 1) + 1, v m), G the micro-batches of a group.

The bubble formulas are exact for equal stages, m a multiple of P for interleaved, m >= P for ZB-H1 and
m >= 2P - 1 for ZB-H2 (tests/test_pipeline_schedules.py).
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import numpy as np

from nnlib.lesson02_network.arrays import to_numpy
from nnlib.lesson02_network.network import dense_layers, parameter_offsets
from nnlib.lesson04_collectives.collectives import (allgather_rows, raised_on_every_rank, require_same_on_every_rank,
                                                    split_evenly)
from nnlib.lesson12_pipeline.bubbles import bubble_fraction, idle_fraction, measured, random_batch, simulate
from nnlib.lesson12_pipeline.instructions import COMPUTE, SCHEDULES, Instruction, program
from nnlib.lesson12_pipeline.pipeline import PipelineMLP, Stage

LESSON = 18

#: The computing instructions and their letters: lesson 12's, and the backward split into B and W.
LETTERS = {**COMPUTE, "backward_input": "B", "backward_weight": "W"}


# -- the schedules -------------------------------------------------------------------------------------

@dataclass(frozen=True)
class ChunkInstruction(Instruction):
    """Lesson 12's instruction for one of the stage's v chunks: chunk c of stage s is virtual stage c P + s of v P,
    and messages go from virtual stage j to j + 1 (forward) or j - 1 (backward)."""

    chunk: int = 0


def chunk_of(instruction) -> int:
    """The chunk an instruction is for (lesson 12's instructions: 0, a stage's only one)."""
    return instruction.chunk if isinstance(instruction, ChunkInstruction) else 0


def chunk_program(stage: int, stages: int, order, chunks: int = 1) -> list[ChunkInstruction]:
    """A stage's instructions from its order of work [(kind, k, chunk)]: lesson 12's program on virtual stage
    chunk x P + stage of v P for each unit (a B, "backward_input", sends what "backward" sends); a W has no message."""
    instructions = []
    for kind, k, chunk in order:
        if kind == "backward_weight":  # no message
            steps = [Instruction(kind, k)]
        else:
            steps = program(chunk * stages + stage, stages * chunks, [(kind, k)])
        instructions += [ChunkInstruction(step.kind, k, chunk) for step in steps]
    return instructions


def interleaved(stages: int, micro_batches: int, chunks: int = 2):
    """Interleaved 1F1B with v = ``chunks`` chunks per rank: warm-up, one forward one backward, drain. Every rank runs
    the same (micro-batch, chunk) units: micro-batches go in groups of about P (m // P groups, as even as possible;
    one group if m < P), and a group runs forward through chunk 0, then chunk 1, ..., backward the last chunk first.
    Rank s first runs w = (v - 1) G + 2 (P - s - 1) forward units (G: the first group's size; at most v m), then
    alternates forward unit w + i and backward unit i, then drains."""
    counts, starts = split_evenly(micro_batches, max(1, micro_batches // stages))
    forwards = [(k, chunk) for count, start in zip(counts, starts) for chunk in range(chunks)
                for k in range(start, start + count)]
    backwards = [(k, chunks - 1 - chunk) for k, chunk in forwards]
    programs = []
    for stage in range(stages):
        warmup = min((chunks - 1) * counts[0] + 2 * (stages - stage - 1), len(forwards))
        order = [("forward", k, chunk) for k, chunk in forwards[:warmup]]
        for (k, chunk), (j, back_chunk) in zip(forwards[warmup:], backwards):
            order += [("forward", k, chunk), ("backward", j, back_chunk)]
        order += [("backward", k, chunk) for k, chunk in backwards[len(forwards) - warmup:]]
        programs.append(chunk_program(stage, stages, order, chunks))
    return programs


def zero_bubble(stages: int, micro_batches: int, warmup, deferred):
    """1F1B with the backward split into B and W: stage s runs ``warmup(s)`` forwards, then forward and B alternately,
    each B followed by the oldest waiting W once more than ``deferred(s)`` wait; then the waiting W's."""
    programs = []
    for stage in range(stages):
        ahead = min(warmup(stage), micro_batches)
        order, waiting = [("forward", k, 0) for k in range(ahead)], []
        for k in range(micro_batches):
            order += [("forward", ahead + k, 0)] if ahead + k < micro_batches else []
            order.append(("backward_input", k, 0))
            waiting.append(k)
            if len(waiting) > deferred(stage):
                order.append(("backward_weight", waiting.pop(0), 0))
        order += [("backward_weight", k, 0) for k in waiting]
        programs.append(chunk_program(stage, stages, order))
    return programs


def zb_h1(stages: int, micro_batches: int):
    """ZB-H1: 1F1B's P - s - 1 warm-up forwards; stage s defers its first s W's into the drain."""
    return zero_bubble(stages, micro_batches, lambda stage: stages - stage - 1, lambda stage: stage)


def zb_h2(stages: int, micro_batches: int):
    """ZB-H2: 2 (P - s - 1) warm-up forwards fill the start; stage s defers 2 s W's into the drain. With m < 2P - 1
    micro-batches the warm-up cannot fill the start, and stage s's 2 s deferred W's pile up after its last B while it
    sat idle earlier (P = 3, m = 3: a bubble of 0.250 against ZB-H1's 0.182, with equal F, B, W): there ZB-H2 is
    ZB-H1."""
    if micro_batches < 2 * stages - 1:
        return zb_h1(stages, micro_batches)
    return zero_bubble(stages, micro_batches, lambda stage: 2 * (stages - stage - 1), lambda stage: 2 * stage)


#: Every schedule by name, lesson 12's and this lesson's: (P, m) -> the stages' lists (interleaved: v too, default 2).
ALL_SCHEDULES = {**SCHEDULES, "interleaved": interleaved, "zb-h1": zb_h1, "zb-h2": zb_h2}


def schedule_programs(name: str, stages: int, micro_batches: int, chunks: int = 1):
    """The stages' instruction lists of schedule ``name`` (``chunks``: v, for interleaved only)."""
    if name == "interleaved":
        return interleaved(stages, micro_batches, chunks)
    return ALL_SCHEDULES[name](stages, micro_batches)


def peak_alive(instructions) -> int:
    """The most (micro-batch, chunk) pairs of one stage's list forwarded and not yet through their last
    backward ("backward", or W of the split one): what PipelineMLP.peak_alive measures."""
    alive = peak = 0
    for instruction in instructions:
        alive += {"forward": 1, "backward": -1, "backward_weight": -1}.get(instruction.kind, 0)
        peak = max(peak, alive)
    return peak


# -- their bubbles: lesson 12's formula and simulation -------------------------------------------------------

def bubble_formula(name: str, stages: int, micro_batches: int, seconds=(1.0, 1.0, 1.0), chunks: int = 1) -> float:
    """The idle fraction of a step with P equal stages, from lesson 12's (P - 1) / (m' + P - 1).

    seconds: (F, B, W) of one micro-batch on a whole stage (B + W: lesson 12's backward). Idle per stage:
    gpipe, 1f1b (P - 1)(F + B + W): m' = m; interleaved (P - 1)(F + B + W) / v: m' = v m; zb-h1
    (P - 1) max(F + B - W, F) and zb-h2 (P - 1) max(F + B - 2W, F): m' = m (F + B + W) / that max, the step's
    work counted in units of the idle time per stage and per P - 1. ZB-H2 with m < 2P - 1 runs ZB-H1's lists
    (:func:`zb_h2`), so it has ZB-H1's formula there."""
    if name == "zb-h2" and micro_batches < 2 * stages - 1:
        name = "zb-h1"
    forward, backward, weight = seconds
    whole = forward + backward + weight
    idle = {"zb-h1": max(forward + backward - weight, forward), "zb-h2": max(forward + backward - 2 * weight, forward),
            "interleaved": whole / chunks}.get(name, whole)
    return bubble_fraction(stages, micro_batches * whole / idle)


def schedule_bubble(name: str, stage_seconds, micro_batches: int, chunks: int = 1) -> float:
    """The idle fraction of schedule ``name``'s lists run on lesson 12's clock (idle_fraction of simulate's).

    stage_seconds[s]: {"F", "B", "W"} seconds of one micro-batch on stage s's whole slice of the network (B + W the
    full backward; a chunk takes 1/v of it)."""
    def seconds(stage, kind):
        times = stage_seconds[stage]
        return (times["B"] + times["W"] if kind == "backward" else times[LETTERS[kind]]) / chunks

    return idle_fraction(simulated_timelines(schedule_programs(name, len(stage_seconds), micro_batches, chunks),
                                             seconds))


def simulated_timelines(programs, seconds):
    """Lesson 12's simulate for this lesson's lists: W's letter, and each chunk on its virtual stage's channels."""
    return simulate(programs, seconds, letters=LETTERS,
                    position=lambda stage, instruction: chunk_of(instruction) * len(programs) + stage)


# -- the layers of v P virtual stages -----------------------------------------------------------------------

def virtual_stage_layers(num_layers: int, virtual_stages: int, split=None) -> list[tuple[int, int]]:
    """[(first, stop)] weight layers of each virtual stage: as even as possible, or ``split`` layers each, e.g.
    (3, 2, 2, 3) for 10 layers on 4 virtual stages (the same ValueError on every rank if that cannot be)."""
    if split is not None and (not isinstance(split, (tuple, list)) or len(split) != virtual_stages or not all(
            isinstance(count, (int, np.integer)) and not isinstance(count, bool) and count >= 1 for count in split)):
        raise raised_on_every_rank(ValueError(
            f"split must give each of the {virtual_stages} (virtual) stages a positive number of layers, e.g. "
            f"{tuple(split_evenly(num_layers, virtual_stages)[0])}; got {split!r}"))
    counts = split_evenly(num_layers, virtual_stages)[0] if split is None else [int(count) for count in split]
    if sum(counts) != num_layers:
        raise raised_on_every_rank(ValueError(
            f"split {tuple(split)} holds {sum(split)} layers but the network has {num_layers} weight layers"))
    return [(sum(counts[:stage]), sum(counts[:stage + 1])) for stage in range(virtual_stages)]


def balanced_split(num_layers: int, virtual_stages: int) -> tuple[int, ...]:
    """Layer counts per virtual stage that balance a network with a narrow (cheap) first and last layer: the L - 2
    wide layers go as evenly as possible (each costs one unit of F, one of B, one of W per micro-batch); the narrow
    first layer joins virtual stage 0, which computes no input gradient for it, and the narrow last one joins the
    last, beside the loss. (64,) + (512,) * 9 + (10,), 10 layers: (5, 5) on 2, (3, 2, 2, 3) on 4 virtual stages,
    (2, 1, 1, 1, 1, 1, 1, 2) on 8."""
    if virtual_stages < 1 or num_layers - 2 < virtual_stages:
        raise ValueError(f"{num_layers} layers cannot give each of {virtual_stages} virtual stages a wide layer: "
                         f"balanced_split needs at least virtual stages + 2 layers")
    counts = split_evenly(num_layers - 2, virtual_stages)[0]
    counts[0] += 1
    counts[-1] += 1
    return tuple(counts)


# -- the executor with these schedules -------------------------------------------------------------------

class ZeroBubbleStage(Stage):
    """Lesson 12's stage that also runs the backward split in two: B ("backward_input") and, later, W
    ("backward_weight"). Between them a micro-batch's layer inputs and deltas wait in ``waiting``."""

    def begin(self) -> None:
        super().begin()
        self.waiting = {}

    def alive(self) -> int:
        return len(self.kept) + len(self.waiting)

    def backward_input(self, step, k: int) -> None:
        """B: every layer's delta, last to first, delta_{l-1} = (delta_l @ W_l.T) * a (1 - a), and the input
        gradient delta_1 @ W_1.T to send back (not on virtual stage 0); no weight gradient yet."""
        activations, logits = self.kept.pop(k)
        deltas = [self.output_delta(step, k, activations, logits)]
        for index in range(len(self.layers) - 1, 0, -1):
            deltas.insert(0, self.layers[index - 1].logits_gradient(self.layers[index].input_gradient(deltas[0]),
                                                                    activations[index]))
        self.waiting[k] = (activations[:-1], deltas)
        if self.position:
            self.outgoing[k] = self.layers[0].input_gradient(deltas[0])

    def backward_weight(self, step, k: int) -> None:
        """W: each layer's dJ/dW = a_in.T @ delta and dJ/db of micro-batch k, from what its B left waiting."""
        for layer, inputs, delta in zip(self.layers, *self.waiting.pop(k)):
            layer.weight_gradient(inputs, delta, self.added > 0)
        self.added += 1


class ScheduledPipeline(PipelineMLP):
    """Lesson 12's PipelineMLP running any schedule of ALL_SCHEDULES, with ``chunks`` (v) stages per rank.

    Arguments as PipelineMLP's, plus chunks: v (interleaved only; every rank needs at least v layers), or the layer
    counts of the v P virtual stages themselves, e.g. (3, 2, 2, 3) for v = 2 on 2 ranks or (5, 5) for v = 1
    (balanced_split gives the one that makes narrow first and last layers' stages as heavy as the others).
    ``ranges``: virtual_stage_layers(L, v P), [first, stop) layers of each virtual stage (chunk c of rank s: c P + s);
    ``held``: this rank's stages, chunk by chunk; full_params puts the chunks back in Network's flat layout."""

    schedules, letters = ALL_SCHEDULES, LETTERS

    def __init__(self, comm, layer_sizes=(784, 128, 10), schedule: str = "1f1b", chunks=1, **pipeline):
        self.split = tuple(chunks) if isinstance(chunks, (tuple, list)) else None
        require_same_on_every_rank(comm, "the schedule and chunks per stage", (schedule, self.split or chunks))
        if self.split is not None:
            if len(self.split) % comm.size or not self.split:
                raise raised_on_every_rank(ValueError(
                    f"chunks as layer counts must name v x {comm.size} virtual stages (v chunks on each of the "
                    f"{comm.size} ranks); got {len(self.split)}: {self.split!r}"))
            chunks = len(self.split) // comm.size
        if not isinstance(chunks, int) or chunks < 1 or (chunks > 1 and schedule != "interleaved"):
            raise ValueError(f"chunks must be 1, or a positive integer with schedule 'interleaved'; got "
                             f"{self.split or chunks!r} with {schedule!r}")
        self.chunks = chunks
        super().__init__(comm, layer_sizes, schedule=schedule, **pipeline)  # output, dtype, seed, micro_batches, device

    def check_settings(self, pieces: int, num_layers: int, micro_batches, schedule) -> None:
        """Lesson 12's checks on the v P virtual stages, and the split's (the same verdict on every rank)."""
        super().check_settings(pieces * self.chunks, num_layers, micro_batches, schedule)
        virtual_stage_layers(num_layers, pieces * self.chunks, self.split)  # (raises the split's problem)

    def hold_layers(self, whole) -> list[ZeroBubbleStage]:
        """This rank's v stages: virtual stage c P + s's layers for chunk c, over slices of one params vector."""
        stages, last = self.stages, self.stages * self.chunks - 1
        self.ranges = virtual_stage_layers(whole.num_layers, stages * self.chunks, self.split)
        self.chunk_ranges = [self.ranges[chunk * stages + self.stage] for chunk in range(self.chunks)]
        starts = parameter_offsets(whole.shapes)
        self.params = self.xp.asarray(np.concatenate([whole.params[starts[first]:starts[stop]]
                                                      for first, stop in self.chunk_ranges]))
        self.grads, self.num_params, held, offset = self.xp.zeros_like(self.params), self.params.size, [], 0
        for chunk, (first, stop) in enumerate(self.chunk_ranges):
            size, position = starts[stop] - starts[first], chunk * stages + self.stage
            layers = dense_layers(self.params[offset:offset + size], self.grads[offset:offset + size],
                                  whole.shapes[first:stop], self.output if position == last else "sigmoid", self.xp)
            held.append(ZeroBubbleStage(self.comm, layers, position, (position - 1) % stages if position else None,
                                        (position + 1) % stages if position < last else None))
            offset += size
        return held

    def runs(self, instruction) -> ZeroBubbleStage:
        """The stage of the instruction's chunk."""
        return self.held[chunk_of(instruction)]

    def programs(self, micro_batches: int):
        return schedule_programs(self.schedule, self.stages, micro_batches, self.chunks)

    @property
    def timeline_chunks(self) -> list[int]:
        """The chunk of each computation in ``timeline`` (the last step's)."""
        return [chunk_of(instruction) for instruction in self.program if instruction.kind in self.letters]

    def full_params(self) -> np.ndarray:
        """Every rank's chunks put back in layer order: Network's flat layout."""
        starts = parameter_offsets(list(zip(self.layer_sizes[:-1], self.layer_sizes[1:])))
        gathered = allgather_rows(self.comm, to_numpy(self.params))  # rank by rank, each rank's chunks in order
        whole = np.empty_like(gathered)
        whole[np.concatenate([np.arange(starts[first], starts[stop]) for rank in range(self.stages)
                              for first, stop in self.ranges[rank::self.stages]])] = gathered
        return whole


# -- measured ------------------------------------------------------------------------------------------------

def measure_schedules(comm, layer_sizes, batch: int, micro_batches: int, schedules, repeats: int = 5,
                      dtype="float64", chunks: int = 2):
    """Each schedule's measured bubble beside its formula and its simulation, and its micro-batches alive.

    schedules: names of ALL_SCHEDULES (interleaved with ``chunks``), or {name: its ScheduledPipeline chunks: v, or
    its virtual stages' layer counts (balanced_split)}. Every rank runs lesson 12's ``measured`` steps on the same
    random batch. Returns, on rank 0, {name: measured's dict (formula: from the mean F, B, W) with layers per
    virtual stage}; None elsewhere.
    """
    if not isinstance(schedules, dict):
        schedules = {name: chunks if name == "interleaved" else 1 for name in schedules}
    inputs, labels = random_batch(layer_sizes, batch, dtype, seed=0)
    results = {}
    for name, layout in schedules.items():
        pipeline = ScheduledPipeline(comm, layer_sizes, dtype=dtype, micro_batches=micro_batches, schedule=name,
                                     chunks=layout)

        def predict(stages):  # (called within this iteration)
            # a whole stage's F, B, W: a chunk's median x v (a backward not split counts as B, with W = 0)
            v = pipeline.chunks
            whole = [{letter: stage.get(letter, 0.0) * v for letter in "FBW"} for stage in stages]
            mean = [float(np.mean([stage[letter] for stage in whole])) for letter in "FBW"]
            return (schedule_bubble(name, whole, micro_batches, v),
                    bubble_formula(name, comm.size, micro_batches, mean, v))

        row = measured(pipeline, inputs, labels, repeats, predict)
        if row:
            results[name] = dict(row, layers=[stop - first for first, stop in pipeline.ranges])
    return results if comm.rank == 0 else None


def live_peak(pipeline, inputs, labels) -> tuple[int, int]:
    """One step of ``pipeline`` with the micro-batches it holds counted by one array each: (the most alive at once,
    how many are still alive after the step), on this rank (its chunks together). The array each held stage's forward
    takes (a micro-batch's a_0 there, heard by the stage's ``on_forward`` hook) gets a weakref.finalize that counts it
    down when Python frees it, wherever the executor kept it: no instruction list or executor bookkeeping is read."""
    alive, peak = [0], [0]

    def freed():
        alive[0] -= 1

    def counted(stage_inputs):
        weakref.finalize(stage_inputs, freed)
        alive[0] += 1
        peak[0] = max(peak[0], alive[0])

    for held in pipeline.held:
        held.on_forward = counted
    try:
        pipeline.loss_and_gradient(inputs, labels)
    finally:
        for held in pipeline.held:
            held.on_forward = None
    return peak[0], alive[0]
