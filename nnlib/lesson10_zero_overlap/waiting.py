"""Where a data-parallel step's communication time goes: waiting for a slower rank, or the transfer itself
(:func:`communication_split`); and what a few noisy timings can say (:func:`ranking`, the range rule)."""

from __future__ import annotations

import numpy as np
from mpi4py import MPI

from nnlib.lesson04_collectives.collectives import fail_together
from nnlib.lesson06_data_parallel.data_parallel import ParallelHistory

LESSON = 10
NOTEBOOKS_ONLY = True  # used by notebooks 10 and 18 and the benchmarks, by no other nnlib module


def communication_split(comm, history: ParallelHistory):
    """Split the communicate phase into waiting for the other ranks and the transfer itself.

    A collective ends on every rank about when the last rank has arrived and the data has moved,
    so the rank that arrived last hardly waited. For every communication c of the run
    (one per step for allreduce, two for zero), with d_r(c) its duration on rank r:

        transfer(c)  = min over ranks r of d_r(c)
        waiting_r(c) = d_r(c) - transfer(c)         (rank r waiting for a slower rank)

    Needs the timeline of every step: ``train_parallel(..., timeline_steps=steps)`` or more.
    Every rank calls it. Returns (transfer, waiting): seconds per step, the transfer the same on
    every rank, and waiting (size,) per rank; their sum is that rank's communicate phase per step.
    """
    durations = np.array([end - start for _, phase, start, end in history.timeline if phase == "communicate"])
    recorded = {step for step, *_ in history.timeline}
    fail_together(comm, None if history.steps and len(recorded) >= history.steps else
                  f"the timeline holds {len(recorded)} of the run's {history.steps} steps; train with "
                  f"timeline_steps={max(history.steps, 1)} (or more) to split its communication")
    counts = comm.allgather(len(durations))
    fail_together(comm, None if len(set(counts)) == 1 else
                  f"the ranks' timelines hold different numbers of communications ({counts}): "
                  "pass every rank the history of the same run")
    transfer = np.empty_like(durations)
    comm.Allreduce(durations, transfer, op=MPI.MIN)
    waiting = np.array(comm.allgather(float(np.sum(durations - transfer))))
    return float(np.sum(transfer)) / history.steps, waiting / history.steps


def ranking(samples: dict) -> tuple[list, list]:
    """What a few noisy measurements can say about which run is best.

    samples: {run: measurements of it, higher is better} (e.g. efficiencies from interleaved rounds).
    Returns (order, tied): the runs by median, best first; and the other runs whose highest
    measurement reaches the best run's lowest. Between those and the best the measurements
    cannot decide; a run not in ``tied`` is worse by more than the spread of its rounds.
    """
    medians = {run: float(np.median(values)) for run, values in samples.items()}
    order = sorted(samples, key=medians.get, reverse=True)
    best_low = min(samples[order[0]])
    return order, [run for run in order[1:] if max(samples[run]) >= best_low]


def range_verdict(times, reference) -> str:
    """The range rule: ``times`` are "faster" or "slower" than ``reference`` only where their ranges do not overlap,
    else "within noise" (with 5 interleaved rounds each, noise alone puts them apart 2 / C(10, 5) = 1 time in 126)."""
    if max(times) < min(reference):
        return "faster"
    return "slower" if min(times) > max(reference) else "within noise"
