"""Lesson 09's pictures: tensor parallelism's column split of one layer and row split of the next (a drawn
idea), and the measured pipeline: its time line, its bubble against m, the fastest split of a network."""

from __future__ import annotations

import numpy as np

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


def pipeline_timeline(timelines, title: str):
    """One row per stage: a bar per forward (F, light) and backward (B, dark) of each micro-batch.

    timelines: every stage's PipelineMLP.timeline of one step (kind, micro-batch, start, end).
    The gaps are the bubble: stages waiting while the pipe fills and drains.
    """
    import matplotlib.pyplot as plt

    zero = min(begin for timeline in timelines for _, _, begin, _ in timeline)
    figure, axis = plt.subplots(figsize=(11, 0.6 * len(timelines) + 1.2))
    colours = plt.get_cmap("tab10")
    for stage, timeline in enumerate(timelines):
        for kind, micro, begin, end in timeline:
            axis.broken_barh([((begin - zero) * 1e3, (end - begin) * 1e3)], (stage - 0.38, 0.76),
                             color=colours(micro % 10), alpha=0.45 if kind == "F" else 0.95)
            axis.text((begin + end - 2 * zero) / 2 * 1e3, stage, f"{kind}{micro}", ha="center", va="center", fontsize=7)
    axis.set(yticks=range(len(timelines)), yticklabels=[f"stage {s}" for s in range(len(timelines))],
             xlabel="milliseconds since the step began", title=title)
    axis.invert_yaxis()
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
