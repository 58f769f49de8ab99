"""The pipeline's bubble, the one place it is computed: by formula, by simulating a schedule, and measured.

While the pipe fills and drains some stages wait: with P equal stages and m micro-batches each stage is busy for m
micro-batch times of m + P - 1, idle (the "bubble") (P - 1) / (m + P - 1) of a step (:func:`bubble_fraction`).
Lesson 18 builds its schedules' formulas and simulations from these.
"""

from __future__ import annotations

from collections import defaultdict, deque

import numpy as np

from nnlib.lesson12_pipeline.instructions import COMPUTE, SCHEDULES
from nnlib.lesson12_pipeline.pipeline import PipelineMLP

LESSON = 12

#: The messages: each instruction's direction and the step from the stage that runs it to the channel's receiver
#: (a send goes to the next or the previous stage; a receive listens on its own stage's channel).
MESSAGES = {"send_forward": ("forward", +1), "recv_forward": ("forward", 0),
            "send_backward": ("backward", -1), "recv_backward": ("backward", 0)}


def bubble_fraction(stages: int, micro_batches: float) -> float:
    """The idle fraction of a pipeline step with P equal stages and m micro-batches: (P - 1) / (m + P - 1)."""
    if stages < 1 or micro_batches <= 0:
        raise ValueError(f"a pipeline needs at least 1 stage and 1 micro-batch; got {stages} and {micro_batches}")
    return (stages - 1) / (micro_batches + stages - 1)


def step_span(timelines) -> float:
    """Seconds from the first computation of a step, on any stage, to the end of its last one.

    timelines: every stage's [(letter, micro-batch, start, end)] of one step (PipelineMLP.timeline: one clock).
    """
    start = min(begin for timeline in timelines for _, _, begin, _ in timeline)
    return max(end for timeline in timelines for _, _, _, end in timeline) - start


def idle_fraction(timelines) -> float:
    """The bubble of one step read from every stage's timeline: 1 - busy / (P x step_span)."""
    busy = sum(end - begin for timeline in timelines for _, _, begin, end in timeline)
    return 1.0 - busy / (len(timelines) * step_span(timelines))


def simulated_bubble(forward_seconds, backward_seconds, schedule: str, micro_batches: int) -> float:
    """The idle fraction that ``schedule`` must have with these per-stage times (messages taking none).

    forward_seconds[s], backward_seconds[s]: stage s's time for one micro-batch. The schedule's lists run on
    simulate's clock (the very lists the executor runs): F(s, k) waits for F(s-1, k)'s message,
    B(s, k) for B(s+1, k)'s. With equal stages this gives (P - 1) / (m + P - 1); real stages are not equal (the
    first has no input gradient to compute, the last computes the loss), and this says what that costs.
    """
    seconds = {"forward": forward_seconds, "backward": backward_seconds}
    programs = SCHEDULES[schedule](len(forward_seconds), micro_batches)
    return idle_fraction(simulate(programs, lambda stage, kind: seconds[kind][stage]))


def seconds_per_kind(timeline) -> dict:
    """{letter: the median seconds of one computation of that kind} in one stage's timeline ("F", "B", ...)."""
    return {letter: float(np.median([end - begin for kind, _, begin, end in timeline if kind == letter]))
            for letter in sorted({letter for letter, _, _, _ in timeline})}


def measure_bubbles(comm, layer_sizes, batch: int, micro_batch_counts=(1, 2, 4, 8, 16), schedule: str = "1f1b",
                    repeats: int = 5, dtype="float32", seed: int = 0):
    """For each m, a pipeline step's measured idle fraction beside (P - 1) / (m + P - 1) and the simulated one.

    Every rank runs :func:`measured` steps on one random batch of ``batch`` samples; rank 0 returns its dicts with
    micro_batches added (None elsewhere), :func:`simulated_bubble` taking each stage's median F and B of each step.
    """
    inputs, labels = random_batch(layer_sizes, batch, dtype, seed)
    rows = []
    for micro_batches in micro_batch_counts:
        pipeline = PipelineMLP(comm, layer_sizes, dtype=dtype, seed=seed, micro_batches=micro_batches,
                               schedule=schedule)

        def predict(stages):  # (called within this iteration)
            return (simulated_bubble([stage["F"] for stage in stages], [stage["B"] for stage in stages], schedule,
                                     micro_batches), bubble_fraction(comm.size, micro_batches))

        row = measured(pipeline, inputs, labels, repeats, predict)
        rows += [dict(micro_batches=micro_batches, **row)] if row else []
    return rows if comm.rank == 0 else None


def measured(pipeline, inputs, labels, repeats: int, predict) -> dict | None:
    """What ``repeats`` steps of ``pipeline`` (after one warm-up, each begun after a barrier) say, on rank 0 (None
    elsewhere): measured (the median idle fraction), simulated and formula (the medians of each step's
    predict(every stage's seconds_per_kind)), step_seconds (the median span) and its spread (min, max), timelines
    (the last step's every stage's) and peak_alive (per stage)."""
    comm, steps = pipeline.comm, []
    for _ in range(repeats + 1):
        comm.Barrier()
        pipeline.loss_and_gradient(inputs, labels, check=False)
        steps.append(comm.gather(pipeline.timeline, root=0))
    alive = comm.gather(pipeline.peak_alive, root=0)
    if comm.rank != 0:
        return None
    steps = steps[1:]
    spans = [step_span(timelines) for timelines in steps]
    simulated, formula = zip(*[predict([seconds_per_kind(timeline) for timeline in timelines]) for timelines in steps])
    return dict(measured=float(np.median([idle_fraction(timelines) for timelines in steps])),
                simulated=float(np.median(simulated)), formula=float(np.median(formula)),
                step_seconds=float(np.median(spans)), spread=(float(min(spans)), float(max(spans))),
                timelines=steps[-1], peak_alive=alive)


def random_batch(layer_sizes, batch: int, dtype, seed: int):
    """A random batch to time steps on: inputs (batch, n_0) uniform in [0, 1), labels (batch,) in 0..n_L-1."""
    rng = np.random.default_rng(seed)
    return rng.random((batch, layer_sizes[0])).astype(dtype), rng.integers(0, layer_sizes[-1], batch)


def simulate(programs, seconds, letters=COMPUTE, position=None) -> list[list[tuple]]:
    """Run every stage's instructions on a clock, as the executor runs them; return the timelines.

    programs: a schedule's lists (one per stage). seconds(stage, kind): how long a computing instruction takes
    there. A send takes no time and never waits (MPI's Isend); a receive waits until the message has been sent and
    takes the oldest one on its channel (MPI's order: one channel per direction and receiving stage), which must be
    the micro-batch it names. letters: the computing kinds' letters; position(stage, instruction): the place in the
    pipe of the stage that runs it (default: the stage itself; lesson 18's virtual stages differ). Returns each
    stage's [(letter, k, start, end)], like PipelineMLP.timeline; raises RuntimeError if the schedule deadlocks,
    receives out of order, or sends what nobody receives.
    """
    position = position or (lambda stage, instruction: stage)
    at, clock = [0] * len(programs), [0.0] * len(programs)
    channels = defaultdict(deque)  # (direction, receiving position) -> [(micro-batch, time sent)]
    timelines = [[] for _ in programs]
    progressed = True
    while progressed:
        progressed = False
        for stage, instructions in enumerate(programs):
            while at[stage] < len(instructions):
                instruction = instructions[at[stage]]
                if instruction.kind in MESSAGES:
                    direction, step = MESSAGES[instruction.kind]
                    channel = channels[direction, position(stage, instruction) + step]
                    if instruction.kind.startswith("send"):
                        channel.append((instruction.micro_batch, clock[stage]))
                    elif not channel:
                        break  # blocked: the message has not been sent yet
                    else:
                        micro_batch, sent = channel.popleft()
                        if micro_batch != instruction.micro_batch:
                            raise RuntimeError(f"stage {stage} runs {instruction} but the next message on its "
                                               f"channel is micro-batch {micro_batch}: messages arrive in the order "
                                               "they were sent")
                        clock[stage] = max(clock[stage], sent)
                else:
                    began, clock[stage] = clock[stage], clock[stage] + seconds(stage, instruction.kind)
                    timelines[stage].append((letters[instruction.kind], instruction.micro_batch, began, clock[stage]))
                at[stage] += 1
                progressed = True
    stuck = [f"stage {stage} waits in {instructions[at[stage]]}"
             for stage, instructions in enumerate(programs) if at[stage] < len(instructions)]
    if stuck:
        raise RuntimeError("the schedule deadlocks: " + "; ".join(stuck))
    unread = [f"{len(channel)} {direction} message(s) to position {receiver}"
              for (direction, receiver), channel in channels.items() if channel]
    if unread:
        raise RuntimeError("the schedule sends what no stage receives: " + "; ".join(unread))
    return timelines

