"""The pipeline's bubble: predicted by a formula and by the simulated schedule, and measured on the ranks.

While the pipe fills and drains some stages wait: with equal stages the idle ("bubble") fraction
of a step is (P - 1) / (m + P - 1) (:func:`bubble_fraction`), so more micro-batches mean less waste.
:func:`simulated_bubble` runs a schedule's instruction lists on a clock with each stage's own times;
:func:`measure_bubbles` times real steps of nnlib.lesson09_model_parallel.pipeline.PipelineMLP from every
stage's timeline.
"""

from __future__ import annotations

import numpy as np

from nnlib.lesson09_model_parallel.instructions import SCHEDULES, simulate
from nnlib.lesson09_model_parallel.pipeline import PipelineMLP

LESSON = 9


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
    inputs, labels = random_batch(layer_sizes, batch, dtype, seed)
    rows = []
    for micro_batches in micro_batch_counts:
        pipeline = PipelineMLP(comm, layer_sizes, dtype=dtype, seed=seed, micro_batches=micro_batches,
                               schedule=schedule)
        measured, simulated, spans = [], [], []
        for repeat in range(repeats + 1):
            timelines = timed_step(pipeline, inputs, labels)
            if repeat and comm.rank == 0:
                measured.append(measured_bubble(timelines))
                spans.append(step_span(timelines))
                durations = [median_seconds(timeline) for timeline in timelines]
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


def random_batch(layer_sizes, batch: int, dtype, seed: int):
    """A random batch to time steps on: inputs (batch, n_0) uniform in [0, 1), labels (batch,) in 0..n_L-1."""
    rng = np.random.default_rng(seed)
    return rng.random((batch, layer_sizes[0])).astype(dtype), rng.integers(0, layer_sizes[-1], batch)


def timed_step(pipeline: PipelineMLP, inputs, labels):
    """One step of ``pipeline`` after a barrier: every stage's timeline, on rank 0 (None elsewhere)."""
    pipeline.comm.Barrier()
    pipeline.loss_and_gradient(inputs, labels, check=False)
    return pipeline.comm.gather(pipeline.timeline, root=0)


def median_seconds(timeline) -> dict:
    """{letter: median seconds} of each kind of computation in one stage's timeline ("F", "B", "W")."""
    letters = sorted({letter for letter, _, _, _ in timeline})
    return {letter: float(np.median([end - begin for what, _, begin, end in timeline if what == letter]))
            for letter in letters}


def simulated_bubble(forward_seconds, backward_seconds, schedule: str, micro_batches: int) -> float:
    """The idle fraction that ``schedule`` must have with these per-stage times (no message cost).

    forward_seconds[s], backward_seconds[s]: stage s's time for one micro-batch. The schedule's
    instruction lists run in nnlib.lesson09_model_parallel.instructions.simulate (the very lists the
    executor runs): F(s, k) waits for F(s-1, k)'s message, B(s, k) for B(s+1, k)'s. With equal
    stages this gives (P - 1) / (m + P - 1); real stages are not equal (the first has no input
    gradient to compute, the last computes the loss), and this says what that costs.
    """
    seconds = {"forward": forward_seconds, "backward": backward_seconds}
    programs = SCHEDULES[schedule](len(forward_seconds), micro_batches)
    return measured_bubble(simulate(programs, lambda stage, kind: seconds[kind][stage]))
