"""Lesson 11's pictures: tensor parallelism's column split of one layer and row split of the next (a drawn
idea), and which rank holds which block of every layer of a TensorParallelMLP."""

from __future__ import annotations

import numpy as np

from nnlib.lesson04_collectives.collectives import split_evenly

LESSON = 11
NOTEBOOKS_ONLY = True  # drawn in the notebook; no other module uses it


def _matrix(axis, left: float, rows: float, columns: float, label: str, split=None, by: str = "columns"):
    """A matrix drawn as a box of rows x columns at x = left; ``split`` colours rank blocks."""
    import matplotlib.pyplot as plt

    axis.add_patch(plt.Rectangle((left, 0), columns, rows, fill=False, linewidth=1.2))
    for rank, (start, stop) in enumerate(split or []):
        xy, width, height = ((left + start, 0), stop - start, rows) if by == "columns" else \
                            ((left, rows - stop), columns, stop - start)
        axis.add_patch(plt.Rectangle(xy, width, height, color=f"C{rank}", alpha=0.55))
    axis.text(left + columns / 2, rows + 0.5, label, ha="center", va="bottom", fontsize=9)
    return left + columns


def tensor_split(size: int = 2, inputs: int = 5, hidden: int = 5, outputs: int = 3, samples: int = 4):
    """Draw X · W1[:, C_r] = a1[:, C_r], then a1[:, C_r] · W2[C_r, :] = partial_r, Allreduce -> z2."""
    import matplotlib.pyplot as plt

    counts, starts = split_evenly(hidden, size)
    blocks = [(start, start + count) for count, start in zip(counts, starts)]  # tensor.split_pieces's columns
    figure, axis = plt.subplots(figsize=(11, 2.6))
    x = _matrix(axis, 0, samples, inputs, "X (every rank)")
    axis.text(x + 0.5, samples / 2, "·", fontsize=16, ha="center", va="center")
    x = _matrix(axis, x + 1, inputs, hidden, "W1 by columns", blocks)
    axis.text(x + 0.6, samples / 2, "→", fontsize=14, ha="center", va="center")
    x = _matrix(axis, x + 1.2, samples, hidden, "a1 = σ(X W1 + b1)", blocks)
    axis.text(x + 0.5, samples / 2, "·", fontsize=16, ha="center", va="center")
    x = _matrix(axis, x + 1, hidden, outputs, "W2 by rows", blocks, by="rows")
    axis.text(x + 0.6, samples / 2, "→", fontsize=14, ha="center", va="center")
    for rank in range(size):
        axis.add_patch(plt.Rectangle((x + 1.2 + 0.25 * rank, -0.25 * rank), outputs, samples, color=f"C{rank}",
                                     alpha=0.55))
    x = _matrix(axis, x + 1.2, samples, outputs, f"{size} partial sums")
    axis.text(x + 1.3, samples / 2, "Allreduce\n→", fontsize=9, ha="center", va="center")
    _matrix(axis, x + 2.5, samples, outputs, "z2 = sum + b2 (every rank)")
    axis.set(xlim=(-0.5, x + 3 + outputs), ylim=(-0.5 - 0.25 * size, max(inputs, hidden) + 1.5), aspect="equal")
    axis.axis("off")
    axis.set_title(f"tensor parallelism on {size} ranks: colours are the ranks", fontsize=10)
    figure.tight_layout()
    return figure


def holdings(layer_sizes, kinds, columns_by_rank):
    """Who holds what: each W_l as a unit box, the block each rank holds coloured (a column layer's columns, the row
    layer's matching rows; a replicated layer whole everywhere), from each rank's TensorParallelMLP.columns."""
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, len(kinds), figsize=(2.6 * len(kinds), 2.9))
    for layer, (axis, kind) in enumerate(zip(np.atleast_1d(axes), kinds)):
        n_in, n_out = layer_sizes[layer], layer_sizes[layer + 1]
        axis.add_patch(plt.Rectangle((0, 0), 1, 1, **({"facecolor": "0.8", "hatch": "//"} if kind == "replicated" else
                                                      {"fill": False})))
        axis.text(0.5, 0.5, "every rank:\na whole copy" if kind == "replicated" else "", ha="center", va="center")
        for rank, columns in enumerate(columns_by_rank if kind != "replicated" else []):
            start, stop = columns[layer] if kind == "column" else columns[layer - 1]
            low, high = start / (n_out if kind == "column" else n_in), stop / (n_out if kind == "column" else n_in)
            (x, y), w, h = ((low, 0), high - low, 1) if kind == "column" else ((0, 1 - high), 1, high - low)
            axis.add_patch(plt.Rectangle((x, y), w, h, color=f"C{rank}", alpha=0.55))
            axis.text(x + w / 2, y + h / 2, f"rank {rank}\n{kind}s {start}-{stop - 1}", ha="center", va="center",
                      fontsize=8)
        axis.set(xlim=(-0.05, 1.05), ylim=(-0.05, 1.05), aspect="equal", title=f"W{layer + 1}: {n_in} x {n_out}, {kind}")
        axis.axis("off")
    figure.tight_layout()
    return figure
