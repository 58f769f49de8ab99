"""Lesson 04's picture: what every rank holds before and after each collective."""

from __future__ import annotations

import numpy as np

LESSON = 4
NOTEBOOKS_ONLY = True  # drawn in the notebooks; no other module uses it


def rank_arrays(collectives: dict, per_row: int = 2):
    """Which rank holds which values, before and after each collective, in one figure. collectives: {title: (before,
    after)}, each a list with one 1-D array (or None: nothing) per rank, in rank order. Each collective is a pair of
    panels, ``per_row`` pairs to a row; in a panel each rank is a row of boxes with its values written in, the colour
    encoding the value (one scale for the whole figure)."""
    import matplotlib.pyplot as plt

    arrays = [v for pair in collectives.values() for side in pair for v in side if v is not None]
    width = max([len(np.atleast_1d(v)) for v in arrays] + [1])
    values = [float(x) for v in arrays for x in np.atleast_1d(v)] or [0.0, 1.0]
    scale = (min(values), max(values))
    ranks = max(len(before) for before, _ in collectives.values())
    rows = -(-len(collectives) // per_row)
    figure, axes = plt.subplots(rows, 2 * per_row, squeeze=False, sharey=True,
                                figsize=(2 * per_row * (0.6 + 0.55 * width), rows * (0.5 * ranks + 1.0)))
    for index, (title, pair) in enumerate(collectives.items()):
        row, column = divmod(index, per_row)
        for side, (label, held) in enumerate(zip(("before", "after"), pair)):
            _rank_boxes(axes[row][2 * column + side], held, f"{title}: {label}", width, scale)
    for axis in axes.flat[2 * len(collectives):]:
        axis.set_visible(False)
    figure.tight_layout()
    return figure


def _rank_boxes(axis, held, title: str, width: int, scale) -> None:
    """One panel of :func:`rank_arrays`: rank r's values as a row of coloured boxes at height r."""
    import matplotlib.pyplot as plt

    low, high = scale
    colours = plt.get_cmap("viridis")
    for rank, array in enumerate(held):
        if array is None:
            axis.text(-0.4, rank, "(nothing)", va="center", fontsize=8, color="grey")
            continue
        for column, value in enumerate(np.atleast_1d(array)):
            shade = (float(value) - low) / (high - low) if high > low else 0.5
            axis.add_patch(plt.Rectangle((column - 0.45, rank - 0.4), 0.9, 0.8, color=colours(0.15 + 0.7 * shade)))
            axis.text(column, rank, f"{value:g}", ha="center", va="center", fontsize=7, color="white")
    axis.set(xlim=(-0.6, width - 0.4), ylim=(len(held) - 0.5, -0.5), xticks=[],
             yticks=range(len(held)), yticklabels=[f"rank {r}" for r in range(len(held))])
    axis.set_title(title, fontsize=9)
    for side in ("top", "right", "bottom"):
        axis.spines[side].set_visible(False)
