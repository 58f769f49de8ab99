"""Notebook 13's pictures: schedules side by side, and a measured step, one row per stage."""

from __future__ import annotations

from nnlib.lesson13_pipeline_schedules.schedules import LETTERS, chunk_of

LESSON = 13
NOTEBOOKS_ONLY = True

#: How each kind of work is drawn: (transparency, hatch). F light, B dark, W hatched.
STYLE = {"F": (0.4, ""), "B": (0.95, ""), "W": (0.6, "///")}


def chunks_of(programs) -> list[list[int]]:
    """Each stage's chunk of every computation, in the order its timeline lists them."""
    return [[chunk_of(instruction) for instruction in instructions if instruction.kind in LETTERS]
            for instructions in programs]


def draw_timelines(axis, timelines, title: str, chunks=None, unit: float = 1.0) -> None:
    """One row per stage on ``axis``: a bar per computation (letter, micro-batch, start, end), coloured by
    micro-batch; F light, B dark, W hatched; a second chunk's bars outlined in black.

    chunks: chunks_of(programs) for an interleaved schedule; unit: seconds per unit of the x axis.
    """
    import matplotlib.pyplot as plt

    colours = plt.get_cmap("tab10")
    zero = min(start for timeline in timelines for _, _, start, _ in timeline)
    for stage, timeline in enumerate(timelines):
        for index, (letter, micro, start, end) in enumerate(timeline):
            alpha, hatch = STYLE[letter]
            chunk = chunks[stage][index] if chunks else 0
            axis.broken_barh([((start - zero) / unit, (end - start) / unit)], (stage - 0.4, 0.8), hatch=hatch,
                             facecolor=colours(micro % 10), alpha=alpha, edgecolor="black" if chunk else "none")
    axis.set(yticks=range(len(timelines)), yticklabels=[f"stage {stage}" for stage in range(len(timelines))],
             title=title)
    axis.invert_yaxis()
