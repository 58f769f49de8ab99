"""Lesson 12's pictures: the measured pipeline's time line, its bubble against m, the fastest split of a network."""

from __future__ import annotations

import numpy as np

LESSON = 12


def draw_timelines(axis, timelines, title: str, unit: float = 1.0, style=None, outlined=None, labels: bool = False):
    """One row per stage on ``axis``: a bar per computation (letter, micro-batch, start, end) of every stage's
    timeline (PipelineMLP.timeline), coloured by micro-batch, F light and B dark. The gaps are the bubble.

    unit: seconds per unit of the x axis; style: {letter: (alpha, hatch)}, if not F's and B's; outlined[stage][i]:
    outline computation i of the stage in black; labels: write each bar's letter and micro-batch on it ("F3").
    """
    import matplotlib.pyplot as plt

    colours, style = plt.get_cmap("tab10"), style or {"F": (0.45, ""), "B": (0.95, "")}
    zero = min(start for timeline in timelines for _, _, start, _ in timeline)
    for stage, timeline in enumerate(timelines):
        for index, (letter, micro, start, end) in enumerate(timeline):
            (alpha, hatch), left, width = style[letter], (start - zero) / unit, (end - start) / unit
            axis.broken_barh([(left, width)], (stage - 0.4, 0.8), hatch=hatch, facecolor=colours(micro % 10),
                             alpha=alpha, edgecolor="black" if outlined and outlined[stage][index] else "none")
            if labels:
                axis.text(left + width / 2, stage, f"{letter}{micro}", ha="center", va="center", fontsize=7)
    axis.set(yticks=range(len(timelines)), yticklabels=[f"stage {stage}" for stage in range(len(timelines))],
             title=title)
    axis.invert_yaxis()


def pipeline_timeline(timelines, title: str):
    """One measured step (:func:`draw_timelines`, labelled, in milliseconds) as a figure of its own."""
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(11, 0.6 * len(timelines) + 1.2))
    draw_timelines(axis, timelines, title, unit=1e-3, labels=True)
    axis.set_xlabel("milliseconds since the step began")
    figure.tight_layout()
    return figure


def bubble_curves(rows_by_schedule: dict):
    """Idle fraction against micro-batches m: measured, simulated from the stages' times, and (P-1)/(m+P-1)."""
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, len(rows_by_schedule), figsize=(5 * len(rows_by_schedule), 3.4), sharey=True)
    for axis, (schedule, rows) in zip(np.atleast_1d(axes), rows_by_schedule.items()):
        m = [row["micro_batches"] for row in rows]
        axis.plot(m, [row["formula"] for row in rows], "k:", label="(P-1)/(m+P-1), equal stages")
        axis.plot(m, [row["simulated"] for row in rows], "s--", color="C1", label="simulated, these stages' times")
        axis.plot(m, [row["measured"] for row in rows], "o-", color="C0", label="measured")
        axis.set(xscale="log", xticks=m, xticklabels=m, xlabel="micro-batches m", title=schedule)
        axis.grid(alpha=0.3)
    np.atleast_1d(axes)[0].set_ylabel("idle fraction of a step")
    np.atleast_1d(axes)[0].legend(fontsize=8)
    figure.tight_layout()
    return figure


def fastest_map(choice, hidden_sizes, rank_counts, kinds, title: str):
    """Which kind of parallelism is fastest for each (hidden size, ranks): a coloured grid."""
    import matplotlib.pyplot as plt
    from matplotlib.colors import ListedColormap

    figure, axis = plt.subplots(figsize=(6.5, 3.8))
    axis.imshow(choice, cmap=ListedColormap(["C0", "C1", "C2"][:len(kinds)]), vmin=0, vmax=len(kinds) - 1,
                aspect="auto", origin="lower")
    for row in range(choice.shape[0]):
        for column in range(choice.shape[1]):
            axis.text(column, row, kinds[choice[row, column]], ha="center", va="center", fontsize=8, color="white")
    axis.set(xticks=range(len(rank_counts)), xticklabels=rank_counts, yticks=range(len(hidden_sizes)),
             yticklabels=hidden_sizes, xlabel="ranks", ylabel="hidden units per layer", title=title)
    figure.tight_layout()
    return figure
