"""Lesson 09's pictures: the ring's schedule, measured Allreduce times, one ZeRO step, overlap as a timeline."""

from __future__ import annotations

import numpy as np

from nnlib.lesson09_ring_allreduce.simulated_link import Link

LESSON = 9
NOTEBOOKS_ONLY = True  # drawn in the notebook; no other module uses it

# The four states of one chunk of the parameter vector on one rank during a ZeRO step.
ZERO_STATES = {"own gradient": "#c6dbef", "summed gradient": "#2171b5", "old parameters": "#c7e9c0",
               "updated parameters": "#31a354", "not needed": "#f0f0f0"}


def zero_states(size: int) -> list[tuple[str, list[list[str]]]]:
    """What every rank holds of every chunk after each phase of one ZeRO step on ``size`` ranks: [(phase, held)],
    held[r][c] the state (a key of ZERO_STATES) of chunk c on rank r. After the reduce-scatter rank r needs only the
    sum of chunk r (stage 2 frees the rest of its gradient, stage 1 keeps it), which the update turns into its new
    parameters (and momentum)."""
    own = [["own gradient"] * size for _ in range(size)]
    summed = [["summed gradient" if c == r else "not needed" for c in range(size)] for r in range(size)]
    updated = [["updated parameters" if c == r else "old parameters" for c in range(size)] for r in range(size)]
    gathered = [["updated parameters"] * size for _ in range(size)]
    return [("backward: own gradients", own), ("reduce-scatter", summed), ("update own slice", updated),
            ("allgather", gathered)]


def zero_step(size: int = 4):
    """Draw :func:`zero_states`: one panel per phase, a row of chunks per rank."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    phases = zero_states(size)
    figure, axes = plt.subplots(1, len(phases), figsize=(2.6 * len(phases), 0.45 * size + 1.4), sharey=True)
    for axis, (phase, held) in zip(axes, phases):
        for rank, row in enumerate(held):
            for chunk, state in enumerate(row):
                axis.add_patch(plt.Rectangle((chunk + 0.05, rank + 0.1), 0.9, 0.8, color=ZERO_STATES[state]))
        axis.set(xlim=(0, size), ylim=(size, 0), title=phase, xticks=[c + 0.5 for c in range(size)],
                 xticklabels=[f"chunk {c}" for c in range(size)], yticks=[r + 0.5 for r in range(size)],
                 yticklabels=[f"rank {r}" for r in range(size)])
        axis.tick_params(axis="x", labelsize=7)
    figure.legend(handles=[Patch(color=colour, label=state) for state, colour in ZERO_STATES.items()],
                  loc="lower center", ncol=len(ZERO_STATES), fontsize=8, frameon=False)
    figure.tight_layout(rect=(0, 0.1, 1, 1))
    return figure


def overlap_spans(layers: int, backward: float = 1.0, transfer: float = 0.8, overlap: bool = True):
    """(compute spans, communicate spans) of one backward pass with one bucket per layer.

    Each span is (label, start, end) in units of one layer's backward time. Backward runs the layers
    last first. Without overlap every bucket is sent after the whole backward pass, one after the
    other; with overlap bucket l's transfer starts when layer l's backward ends (or when the previous
    transfer ends, one link), so only what is left after the last layer adds to the step.
    """
    compute = [(f"backward layer {layer}", (layers - layer) * backward, (layers - layer + 1) * backward)
               for layer in range(layers, 0, -1)]
    communicate, link = [], Link()
    for layer, (_, _, end) in zip(range(layers, 0, -1), compute):
        done = link.book(end if overlap else layers * backward, transfer)
        communicate.append((f"bucket {layer}", done - transfer, done))
    return compute, communicate


def overlap_timeline(layers: int = 3):
    """Draw :func:`overlap_spans` without and with overlap, one above the other, on one time axis."""
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(2, 1, figsize=(8, 2.8), sharex=True)
    for axis, overlap in zip(axes, (False, True)):
        compute, communicate = overlap_spans(layers, overlap=overlap)
        for row, (spans, colour) in enumerate([(compute, "#3182bd"), (communicate, "#e6550d")]):
            for label, start, end in spans:
                axis.barh(row, end - start, left=start, height=0.7, color=colour, edgecolor="white")
                axis.text((start + end) / 2, row, label, ha="center", va="center", fontsize=7, color="white")
        step_end = max(end for _, _, end in compute + communicate)
        axis.axvline(step_end, color="black", linewidth=1)
        axis.set(yticks=[0, 1], yticklabels=["compute", "communicate"], ylim=(1.6, -0.6),
                 title=f"{'with' if overlap else 'without'} overlap: the step ends at {step_end:.1f}")
    axes[-1].set_xlabel("time, in units of one layer's backward pass")
    figure.tight_layout()
    return figure


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
