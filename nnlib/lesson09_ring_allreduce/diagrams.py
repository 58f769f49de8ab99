"""Lesson 09's pictures: the ring's schedule and measured Allreduce times."""

import numpy as np

LESSON = 9
NOTEBOOKS_ONLY = True  # drawn in the notebook; no other module uses it


def ring_schedule(steps, size: int):
    """The ring Allreduce step by step: one row per step, one column per rank, the chunk it sends.

    steps: allreduce.ring_schedule(size). A cell "chunk 3 → 1" means: this rank sends chunk 3 to rank 1 (and adds
    or, in the allgather, copies the chunk that arrives from its left neighbour).
    """
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(1.5 * size + 2, 0.45 * len(steps) + 1.2))
    colours = plt.get_cmap("tab10")
    for row, step in enumerate(steps):
        for sender, receiver, chunk in step["sends"]:
            shade = 0.55 if step["phase"] == "reduce-scatter" else 0.25
            axis.add_patch(plt.Rectangle((sender, row), 0.94, 0.9, color=colours(chunk % 10), alpha=shade))
            axis.text(sender + 0.47, row + 0.45, f"chunk {chunk} → {receiver}", ha="center", va="center", fontsize=8)
    labels = [f"{step['phase']} {index % max(1, size - 1) + 1}" for index, step in enumerate(steps)]
    axis.set(xlim=(0, size), ylim=(len(steps), 0), xticks=np.arange(size) + 0.47,
             xticklabels=[f"rank {rank}" for rank in range(size)], yticks=np.arange(len(steps)) + 0.45,
             yticklabels=labels, title=f"Ring Allreduce, {size} ranks: the chunk each rank sends")
    axis.tick_params(length=0)
    axis.spines[:].set_visible(False)
    figure.tight_layout()
    return figure


def allreduce_times(rows, models=None, title: str = ""):
    """Measured Allreduce time and bus bandwidth against message size, one line per algorithm.

    rows: dicts with bytes, algorithm, ranks, seconds, bus_bandwidth (allreduce_timing's CSV) for one number of
    ranks; models: {algorithm: predicted seconds per size} drawn dashed.
    """
    import matplotlib.pyplot as plt

    figure, (left, right) = plt.subplots(1, 2, figsize=(11, 3.8))
    algorithms = list(dict.fromkeys(row["algorithm"] for row in rows))
    for index, algorithm in enumerate(algorithms):
        mine = sorted((row for row in rows if row["algorithm"] == algorithm), key=lambda row: row["bytes"])
        sizes = np.array([row["bytes"] for row in mine], dtype=float)
        left.loglog(sizes, [row["seconds"] for row in mine], "o-", markersize=3, color=f"C{index}", label=algorithm)
        right.semilogx(sizes, np.array([row["bus_bandwidth"] for row in mine]) / 1e9, "o-", markersize=3,
                       color=f"C{index}", label=algorithm)
        if models and algorithm in models:
            left.loglog(sizes, models[algorithm], "--", color=f"C{index}", alpha=0.7)
    left.set(xlabel="message size (bytes)", ylabel="seconds (median)", title=title or "time (dashed: alpha-beta model)")
    right.set(xlabel="message size (bytes)", ylabel="bus bandwidth (GB/s)",
              title="bus bandwidth = size / time x 2(P-1)/P")
    for axis in (left, right):
        axis.grid(alpha=0.3, which="both")
        axis.legend(fontsize=8)
    figure.tight_layout()
    return figure
