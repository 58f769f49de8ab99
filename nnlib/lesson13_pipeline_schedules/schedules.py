"""Three newer pipeline schedules, as data for lesson 09's one executor.

Lesson 09's 1F1B leaves every stage idle for (P - 1)(F + B) of a step (F, B: one micro-batch's
forward and backward time on a stage), a fraction (P - 1) / (m + P - 1). Two ideas shrink it:

``interleaved`` (Narayanan et al. 2021, Megatron-LM) gives each of the P ranks v *chunks*: the
    network is cut into v P slices, and chunk c of rank s is virtual stage c P + s, so a micro-batch
    passes every rank v times. Each chunk's work takes 1/v of a stage's, and so does the fill and
    drain: the idle time is (P - 1)(F + B) / v, a fraction (P - 1) / (v m + P - 1). The price: more
    messages (v times as many) and more micro-batch chunks alive at once.
``zb-h1``, ``zb-h2`` (Qi et al. 2024, zero-bubble pipeline parallelism) split the backward in two:
    B, every layer's delta and the input gradient (what the stage before waits for), and W, the
    weight gradients a_in.T @ delta (which nobody waits for). Deferring W into the gaps:
    ZB-H1 (1F1B's warm-up; stage s defers its first s W's) idles (P - 1) max(F + B - W, F) per stage,
    a third of 1F1B's when F = B = W; ZB-H2 (twice the warm-up forwards, 2 (P - s - 1), and 2 s
    deferred W's) idles (P - 1) max(F + B - 2W, F): the last bubble, the fill's (P - 1) F, goes away
    only when consecutive steps overlap, which needs the paper's trick for the optimizer step.

Peak micro-batches alive on stage s (forwarded, not yet through W): 1F1B min(P - s, m); ZB-H1
min(P, m) (1F1B's P - s waiting for B plus up to s waiting for W); ZB-H2 min(2P - 1, m) on every
stage;
interleaved, in chunks: min((v - 1) G + 2 (P - s - 1) + 1, v m), G the micro-batches of a group.

:class:`ScheduledPipeline` is lesson 09's PipelineMLP with these schedules (and v chunks per rank);
:func:`simulated_bubble` runs the instruction lists on a clock; :func:`bubble_formula` gives the
formulas above (exact for equal stages, m a multiple of P for interleaved, m >= P for ZB-H1 and
m >= 2P - 1 for ZB-H2: tests/test_pipeline_schedules.py checks them against the simulation).
"""

from __future__ import annotations

import numpy as np

from nnlib.lesson04_collectives.collectives import raised_on_every_rank, require_same_on_every_rank, split_counts
from nnlib.lesson09_model_parallel.bubbles import measured_bubble, median_seconds, random_batch, step_span, timed_step
from nnlib.lesson09_model_parallel.instructions import SCHEDULES, program, simulate
from nnlib.lesson09_model_parallel.pipeline import PipelineMLP, stage_layers

LESSON = 13


# -- the schedules -------------------------------------------------------------------------------------

def interleaved_order(stages: int, micro_batches: int, chunks: int, backward: bool) -> list[tuple[int, int]]:
    """The (micro-batch, chunk) units every rank runs forward (or backward) in the interleaved schedule.

    Micro-batches go in groups of about P (m // P groups, as even as possible; one group if m < P);
    a group runs through chunk 0, then chunk 1, ... (backward: the last chunk first).
    """
    units, start = [], 0
    for size in split_counts(micro_batches, max(1, micro_batches // stages)):
        group = range(start, start + int(size))
        start += int(size)
        for chunk in range(chunks):
            units += [(k, chunks - 1 - chunk if backward else chunk) for k in group]
    return units


def interleaved(stages: int, micro_batches: int, chunks: int = 2):
    """Interleaved 1F1B with v = ``chunks`` chunks per rank: warm-up, one forward one backward, drain.

    Rank s first runs w = (v - 1) G + 2 (P - s - 1) forward units (G: the first group's size; at
    most v m), then alternates forward unit w + i and backward unit i, then drains.
    """
    forwards = interleaved_order(stages, micro_batches, chunks, backward=False)
    backwards = interleaved_order(stages, micro_batches, chunks, backward=True)
    first_group = int(split_counts(micro_batches, max(1, micro_batches // stages))[0])
    programs = []
    for stage in range(stages):
        warmup = min((chunks - 1) * first_group + 2 * (stages - stage - 1), len(forwards))
        order = [("forward", k, chunk) for k, chunk in forwards[:warmup]]
        for (k, chunk), (j, back_chunk) in zip(forwards[warmup:], backwards):
            order += [("forward", k, chunk), ("backward", j, back_chunk)]
        order += [("backward", k, chunk) for k, chunk in backwards[len(forwards) - warmup:]]
        programs.append(program(stage, stages, order, chunks))
    return programs


def zero_bubble(stages: int, micro_batches: int, warmup, deferred):
    """1F1B with the backward split into B and W: stage s runs ``warmup(s)`` forwards, then forward and
    B alternately, each B followed by the oldest waiting W once more than ``deferred(s)`` wait; then
    the waiting W's."""
    programs = []
    for stage in range(stages):
        ahead = min(warmup(stage), micro_batches)
        order, waiting = [("forward", k) for k in range(ahead)], []
        for k in range(micro_batches):
            order += [("forward", ahead + k)] if ahead + k < micro_batches else []
            order.append(("backward_input", k))
            waiting.append(k)
            if len(waiting) > deferred(stage):
                order.append(("backward_weight", waiting.pop(0)))
        order += [("backward_weight", k) for k in waiting]
        programs.append(program(stage, stages, order))
    return programs


def zb_h1(stages: int, micro_batches: int):
    """ZB-H1: 1F1B's P - s - 1 warm-up forwards; stage s defers its first s W's into the drain."""
    return zero_bubble(stages, micro_batches, lambda stage: stages - stage - 1, lambda stage: stage)


def zb_h2(stages: int, micro_batches: int):
    """ZB-H2: 2 (P - s - 1) warm-up forwards fill the start; stage s defers 2 s W's into the drain."""
    return zero_bubble(stages, micro_batches, lambda stage: 2 * (stages - stage - 1), lambda stage: 2 * stage)


#: Every schedule by name: lesson 09's and this lesson's. Each maps (P, m) to the stages' lists
#: (interleaved takes v as a third argument, 2 unless given).
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


# -- bubbles: formula and simulation ------------------------------------------------------------------

def bubble_formula(name: str, stages: int, micro_batches: int, seconds=(1.0, 1.0, 1.0), chunks: int = 1) -> float:
    """The idle fraction of a step with P equal stages: idle / (busy + idle) per stage.

    seconds: (F, B, W) of one micro-batch on a whole stage (B + W: lesson 09's backward). Idle per
    stage: gpipe, 1f1b (P - 1)(F + B + W); interleaved (P - 1)(F + B + W) / v; zb-h1
    (P - 1) max(F + B - W, F); zb-h2 (P - 1) max(F + B - 2W, F).
    """
    forward, backward, weight = seconds
    idle = {"gpipe": forward + backward + weight, "1f1b": forward + backward + weight,
            "interleaved": (forward + backward + weight) / chunks,
            "zb-h1": max(forward + backward - weight, forward),
            "zb-h2": max(forward + backward - 2 * weight, forward)}[name] * (stages - 1)
    return idle / (micro_batches * (forward + backward + weight) + idle)


def simulated_bubble(name: str, stage_seconds, micro_batches: int, chunks: int = 1) -> float:
    """The idle fraction of schedule ``name``'s lists run on a clock (lesson 09's simulate).

    stage_seconds[s]: {"F", "B", "W"} seconds of one micro-batch on stage s's whole slice of the
    network (B + W the full backward; a chunk takes 1/v of it).
    """
    letters = {"forward": "F", "backward_input": "B", "backward_weight": "W"}

    def seconds(stage, kind):
        times = stage_seconds[stage]
        took = times["B"] + times["W"] if kind == "backward" else times[letters[kind]]
        return took / chunks

    return measured_bubble(simulate(schedule_programs(name, len(stage_seconds), micro_batches, chunks), seconds))


# -- the executor with these schedules -------------------------------------------------------------------

class ScheduledPipeline(PipelineMLP):
    """Lesson 09's PipelineMLP running any schedule of ALL_SCHEDULES, with ``chunks`` (v) slices per rank.

    Arguments as PipelineMLP's, plus chunks: v (interleaved only; every rank needs at least v
    layers: virtual stage c P + s holds stage_layers(L, v P)[c P + s]), or the layer counts of the
    v P virtual stages themselves, e.g. (3, 2, 2, 3) for v = 2 on 2 ranks or (5, 5) for v = 1
    (lesson 09's split: balanced_split gives the one that makes narrow first and last layers' stages
    as heavy as the others). full_params puts the chunks back in layer order, so the result
    compares with Network's flat vector.
    """

    schedules = ALL_SCHEDULES

    def __init__(self, comm, layer_sizes=(784, 128, 10), output: str = "sigmoid", dtype="float64",
                 seed: int = 0, micro_batches: int = 4, schedule: str = "1f1b", chunks=1):
        split = tuple(chunks) if isinstance(chunks, (tuple, list)) else None
        require_same_on_every_rank(comm, "the schedule and chunks per stage", (schedule, split or chunks))
        if split is not None:
            if len(split) % comm.size or not split:
                raise raised_on_every_rank(ValueError(
                    f"chunks as layer counts must name v x {comm.size} virtual stages (v chunks on each of the "
                    f"{comm.size} ranks); got {len(split)}: {split!r}"))
            chunks = len(split) // comm.size
        if not isinstance(chunks, int) or chunks < 1 or (chunks > 1 and schedule != "interleaved"):
            raise ValueError(f"chunks must be 1, or a positive integer with schedule 'interleaved'; got "
                             f"{split or chunks!r} with {schedule!r}")
        self.chunks = chunks
        super().__init__(comm, layer_sizes, output, dtype, seed, micro_batches, schedule, split)

    def layer_ranges(self, stage: int) -> list[tuple[int, int]]:
        """Chunk c of ``stage`` holds virtual stage c P + s's consecutive layers of v P."""
        virtual = stage_layers(self.num_layers, self.stages * self.chunks, self.split)
        return [virtual[chunk * self.stages + stage] for chunk in range(self.chunks)]

    def programs(self, micro_batches: int):
        return schedule_programs(self.schedule, self.stages, micro_batches, self.chunks)


def measure_schedules(comm, layer_sizes, batch: int, micro_batches: int, schedules, repeats: int = 5,
                      dtype="float64", chunks: int = 2):
    """Each schedule's measured bubble beside its formula and its simulation, and its memory.

    schedules: names of ALL_SCHEDULES (interleaved with ``chunks``), or {name: its ScheduledPipeline
    chunks}: v, or the layer counts of its virtual stages (balanced_split). Every rank runs
    ``repeats`` steps (after one warm-up) on the same random batch. Returns, on rank 0, {name:
    dict(measured, simulated, formula: medians over the steps, the formula with the measured median
    F, B, W; step_seconds: the median span and its spread (min, max); peak_alive, peak_bytes: per
    stage; layers: per virtual stage; timelines: the last step's)}; None elsewhere.
    """
    if not isinstance(schedules, dict):
        schedules = {name: chunks if name == "interleaved" else 1 for name in schedules}
    inputs, labels = random_batch(layer_sizes, batch, dtype, seed=0)
    results = {}
    for name, layout in schedules.items():
        pipeline = ScheduledPipeline(comm, layer_sizes, dtype=dtype, micro_batches=micro_batches, schedule=name,
                                     chunks=layout)
        steps = [timed_step(pipeline, inputs, labels) for _ in range(repeats + 1)][1:]
        memory = comm.gather((pipeline.peak_alive, pipeline.peak_activation_bytes), root=0)
        if comm.rank == 0:
            results[name] = summarize(name, steps, micro_batches, pipeline.chunks, memory)
            results[name]["layers"] = [stop - first for first, stop in
                                       stage_layers(pipeline.num_layers, comm.size * pipeline.chunks, pipeline.split)]
    return results if comm.rank == 0 else None


def balanced_split(num_layers: int, virtual_stages: int) -> tuple[int, ...]:
    """Layer counts per virtual stage that balance a network with a narrow (cheap) first and last layer.

    The L - 2 wide layers go as evenly as possible (each costs one unit of F, one of B, one of W
    per micro-batch); the narrow first layer joins virtual stage 0, which computes no input gradient
    for it, and the narrow last one joins the last, beside the loss. (64,) + (512,) * 9 + (10,),
    10 layers: (5, 5) on 2 virtual stages, (3, 2, 2, 3) on 4, (2, 1, 1, 1, 1, 1, 1, 2) on 8.
    """
    if virtual_stages < 1 or num_layers - 2 < virtual_stages:
        raise ValueError(f"{num_layers} layers cannot give each of {virtual_stages} virtual stages a wide layer: "
                         f"balanced_split needs at least virtual stages + 2 layers")
    counts = [int(count) for count in split_counts(num_layers - 2, virtual_stages)]
    counts[0] += 1
    counts[-1] += 1
    return tuple(counts)


def summarize(name: str, steps, micro_batches: int, chunks: int, memory) -> dict:
    """measure_schedules' dict for one schedule from its steps' timelines (rank 0)."""
    spans = [step_span(timelines) for timelines in steps]
    simulated, formula = [], []
    for timelines in steps:
        per_stage = [stage_times(median_seconds(timeline), chunks) for timeline in timelines]
        simulated.append(simulated_bubble(name, per_stage, micro_batches, chunks))
        mean = [float(np.mean([stage[letter] for stage in per_stage])) for letter in "FBW"]
        formula.append(bubble_formula(name, len(timelines), micro_batches, mean, chunks))
    return dict(measured=float(np.median([measured_bubble(timelines) for timelines in steps])),
                simulated=float(np.median(simulated)), formula=float(np.median(formula)),
                step_seconds=float(np.median(spans)), spread=(float(min(spans)), float(max(spans))),
                peak_alive=[count for count, _ in memory], peak_bytes=[size for _, size in memory],
                timelines=steps[-1])


def stage_times(medians: dict, chunks: int) -> dict:
    """{"F", "B", "W"} of a whole stage from one timeline's medians per kind (a chunk's times x v).

    A timeline without W (its backward not split) counts its backward as B and W = 0.
    """
    return {letter: medians.get(letter, 0.0) * chunks for letter in "FBW"}
