"""Lesson 09's drawn idea: tensor parallelism's column split of one layer and row split of the next.

:func:`tensor_split` draws, for P ranks, the two products of one hidden layer split Megatron's way:
every rank multiplies the whole input X by its *columns* of W1 and gets its own hidden units
a1[:, C_r]; it multiplies those by the matching *rows* of W2 and gets a partial sum of the outputs;
an Allreduce adds the partial sums. The colours are the ranks.
"""

from __future__ import annotations

from nnlib.lesson04_collectives.collectives import offsets, split_counts

LESSON = 9
NOTEBOOKS_ONLY = True  # drawn in the notebook; no other module uses it


def split_blocks(units: int, size: int) -> list[tuple[int, int]]:
    """(start, stop) of each rank's hidden units: tensor.split_pieces's split (lesson 04's split_counts)."""
    counts = split_counts(units, size)
    return [(int(start), int(start + count)) for start, count in zip(offsets(counts), counts)]


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

    blocks = split_blocks(hidden, size)
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
