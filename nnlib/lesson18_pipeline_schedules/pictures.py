"""Notebook 18's pictures: schedules side by side, and a measured step, one row per stage."""

from __future__ import annotations

from nnlib.lesson12_pipeline import diagrams
from nnlib.lesson18_pipeline_schedules.schedules import LETTERS, chunk_of

LESSON = 18
NOTEBOOKS_ONLY = True

#: How each kind of work is drawn: (transparency, hatch). F light, B dark, W hatched.
STYLE = {"F": (0.4, ""), "B": (0.95, ""), "W": (0.6, "///")}


def chunks_of(programs) -> list[list[int]]:
    """Each stage's chunk of every computation, in the order its timeline lists them."""
    return [[chunk_of(instruction) for instruction in instructions if instruction.kind in LETTERS]
            for instructions in programs]


def draw_timelines(axis, timelines, title: str, chunks=None, unit: float = 1.0) -> None:
    """Lesson 12's drawing of every stage's timeline on ``axis``, with W hatched and a second chunk's bars
    outlined in black. chunks: chunks_of(programs) for an interleaved schedule; unit: seconds per unit of the x axis.
    """
    diagrams.draw_timelines(axis, timelines, title, unit, STYLE, outlined=chunks)
