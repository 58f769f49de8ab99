"""Lesson 06's pictures of a data-parallel step, also drawn again in lessons 07 and 10: each rank's phases, gathered
to rank 0 (also for the batch job's report), on a time line, and the time per step split by phase."""

from __future__ import annotations

import numpy as np

from nnlib.lesson04_collectives import collectives
from nnlib.lesson06_data_parallel.data_parallel import PHASES, ParallelHistory

LESSON = 6


def gather_phase_seconds(comm, history: ParallelHistory, root: int = 0):
    """Every rank's phase totals on ``root``: an array (ranks, phases) in PHASES order, else None."""
    mine = np.array([history.phase_seconds[phase] for phase in PHASES])
    return collectives.gather_rows(comm, mine[None, :], root)


def gather_timeline(comm, history: ParallelHistory, root: int = 0):
    """Every rank's timeline on ``root``: a list (one per rank) of (step, phase, start, end)."""
    return comm.gather(history.timeline, root=root)


PHASE_COLOURS = {"data": "#9ecae1", "compute": "#3182bd", "communicate": "#e6550d", "update": "#31a354"}


def timeline(per_rank, title: str, steps=None):
    """Who does what when: one row per rank, a coloured bar per phase of each step.

    per_rank: for each rank, a list of (step, phase, start, end) in seconds (:func:`gather_timeline`). Orange
    (communicate) longer on one rank than on another is time spent *waiting* in the collective for a slower rank.
    """
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    figure, axis = plt.subplots(figsize=(11, 0.5 * len(per_rank) + 1.3))
    for rank, events in enumerate(per_rank):
        for step, phase, start, end in events:
            if steps is None or step < steps:
                axis.broken_barh([(start * 1e3, (end - start) * 1e3)], (rank - 0.35, 0.7),
                                 color=PHASE_COLOURS[phase])
    axis.set(yticks=range(len(per_rank)), yticklabels=[f"rank {r}" for r in range(len(per_rank))],
             xlabel="time since the run began (ms)", title=title)
    axis.invert_yaxis()
    axis.legend(handles=[Patch(color=colour, label=phase) for phase, colour in PHASE_COLOURS.items()],
                loc="upper center", bbox_to_anchor=(0.5, -0.35), ncol=4, fontsize=8, frameon=False)
    figure.tight_layout()
    return figure


def phase_bars(per_strategy: dict, title: str, unit: str = "milliseconds per step"):
    """Stacked bars of seconds per phase: {label: {phase: seconds}}, drawn in milliseconds."""
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(7, 3.2))
    labels = list(per_strategy)
    bottom = np.zeros(len(labels))
    for phase, colour in PHASE_COLOURS.items():
        heights = np.array([per_strategy[label].get(phase, 0.0) for label in labels])
        axis.bar(labels, heights * 1e3, bottom=bottom * 1e3, color=colour, label=phase)
        bottom += heights
    axis.set(ylabel=unit, title=title)
    axis.legend(fontsize=8)
    figure.tight_layout()
    return figure
