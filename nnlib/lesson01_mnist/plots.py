"""Pictures the notebooks share: digit grids, learning curves, confusion matrices, weights."""

from __future__ import annotations

import numpy as np

LESSON = 1
NOTEBOOKS_ONLY = True  # the notebooks' pictures, used by no other nnlib module


def digit_grid(images, titles=None, columns: int = 10, size: float = 1.0, cmap="gray_r"):
    """Show images (N, H, W) in a grid, with an optional title above each. Returns the figure."""
    import matplotlib.pyplot as plt

    rows = int(np.ceil(len(images) / columns))
    figure, axes = plt.subplots(rows, columns, figsize=(columns * size, rows * size * 1.15), squeeze=False)
    for index, axis in enumerate(axes.flat):
        axis.axis("off")
        if index < len(images):
            axis.imshow(images[index], cmap=cmap)
            if titles is not None:
                axis.set_title(str(titles[index]), fontsize=9)
    figure.tight_layout()
    return figure


def learning_curves(histories: dict, against: str = "epoch"):
    """Loss and accuracy of several runs {name: History}, against epochs or training seconds."""
    import matplotlib.pyplot as plt

    figure, (loss_axis, accuracy_axis) = plt.subplots(1, 2, figsize=(11, 3.8))
    for name, history in histories.items():
        x = np.arange(1, history.epochs + 1) if against == "epoch" else history.elapsed
        loss_axis.plot(x, history.loss, label=name)
        accuracy_axis.plot(x, history.train_accuracy, label=f"{name} (training)")
        if history.validation_accuracy:
            accuracy_axis.plot(x, history.validation_accuracy, "--", label=f"{name} (validation)")
    label = "epoch" if against == "epoch" else "training time (s)"
    loss_axis.set(xlabel=label, ylabel="cross-entropy", title="loss", yscale="log")
    accuracy_axis.set(xlabel=label, ylabel="accuracy", title="accuracy")
    for axis in (loss_axis, accuracy_axis):
        axis.grid(alpha=0.3)
        axis.legend(fontsize=8)
    figure.tight_layout()
    return figure


def confusion_counts(labels, predictions, num_classes: int = 10) -> np.ndarray:
    """counts[i, j] = how many samples of class i were predicted as class j."""
    counts = np.zeros((num_classes, num_classes), dtype=np.int64)
    np.add.at(counts, (np.asarray(labels), np.asarray(predictions)), 1)
    return counts


def plot_confusion_matrix(counts):
    """Draw a confusion matrix with its counts written in the cells."""
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(5.5, 5))
    axis.imshow(np.log1p(counts), cmap="Blues")
    for (i, j), count in np.ndenumerate(counts):
        axis.text(j, i, str(count), ha="center", va="center", fontsize=7,
                  color="white" if i == j else "black")
    axis.set(xlabel="predicted", ylabel="true", xticks=range(len(counts)), yticks=range(len(counts)),
             title="confusion matrix (test set)")
    figure.tight_layout()
    return figure


def hidden_unit_weights(weights, image_shape=(28, 28), count: int = 32, columns: int = 8):
    """Show the first ``count`` hidden units' input weights W_1[:, j] as images (red +, blue -)."""
    import matplotlib.pyplot as plt

    rows = int(np.ceil(count / columns))
    figure, axes = plt.subplots(rows, columns, figsize=(columns * 1.1, rows * 1.1))
    for unit, axis in enumerate(axes.flat):
        axis.axis("off")
        if unit < min(count, weights.shape[1]):
            image = np.asarray(weights[:, unit]).reshape(image_shape)
            limit = np.abs(image).max()
            axis.imshow(image, cmap="seismic", vmin=-limit, vmax=limit)
    figure.suptitle("input weights of hidden units (red: positive, blue: negative)", fontsize=10)
    figure.tight_layout()
    return figure


def rank_arrays(collectives: dict, per_row: int = 2):
    """Which rank holds which values, before and after each collective, in one figure.

    collectives: {title: (before, after)}, each a list with one 1-D array (or None: nothing) per
    rank, in rank order. Each collective is a pair of panels, ``per_row`` pairs to a row; in a panel
    each rank is a row of boxes with its values written in, the colour encoding the value (one scale
    for the whole figure).
    """
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


PHASE_COLOURS = {"data": "#9ecae1", "compute": "#3182bd", "communicate": "#e6550d", "update": "#31a354"}


def timeline(per_rank, title: str, steps=None):
    """Who does what when: one row per rank, a coloured bar per phase of each step.

    per_rank: for each rank, a list of (step, phase, start, end) in seconds (see
    nnlib.lesson05_data_parallel.gather_timeline). Orange (communicate) that is longer on one rank than
    on another is time spent *waiting* in the collective for a slower rank.
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


def scaling_curves(rows, kind: str, serial_fraction=None, law=None, label: str = "measured"):
    """Speedup and efficiency against ranks, with the ideal line (and a fitted law, if given).

    rows: nnlib.lesson06_scaling.scaling.summarize output; only ``kind`` ("strong" or "weak") rows are drawn.
    Oversubscribed points (more ranks than cores) are hollow and labelled, never mixed in silently.
    """
    import matplotlib.pyplot as plt

    rows = [row for row in rows if row["kind"] == kind]
    ranks = np.array([row["ranks"] for row in rows])
    speedup = np.array([row["speedup"] for row in rows])
    efficiency = np.array([row["efficiency"] for row in rows])
    over = np.array([row["oversubscribed"] for row in rows])
    figure, (left, right) = plt.subplots(1, 2, figsize=(10, 3.6))
    line = np.linspace(1, ranks.max(), 50)
    left.plot(line, line, "k:", label="ideal")
    right.axhline(1.0, color="k", linestyle=":", label="ideal")
    for axis, values in ((left, speedup), (right, efficiency)):
        axis.plot(ranks[~over], values[~over], "o-", color="C0", label=label)
        if over.any():
            axis.plot(ranks[over], values[over], "o", markerfacecolor="white", color="C0",
                      label="oversubscribed (ranks > cores)")
    if law is not None and serial_fraction is not None:
        left.plot(line, law(line, serial_fraction), "--", color="C1", label=f"fit, serial fraction {serial_fraction:.2f}")
    name = "speedup" if kind == "strong" else "scaled speedup"
    left.set(xlabel="ranks", ylabel=name, title=f"{kind} scaling: {name}")
    right.set(xlabel="ranks", ylabel="efficiency", title=f"{kind} scaling: efficiency", ylim=(0, 1.15))
    for axis in (left, right):
        axis.set_xticks(sorted(set(ranks.tolist())))
        axis.grid(alpha=0.3)
        axis.legend(fontsize=8)
    figure.tight_layout()
    return figure


def ring_schedule(steps, size: int):
    """The ring Allreduce step by step: one row per step, one column per rank, the chunk it sends.

    steps: nnlib.lesson08_inside_allreduce.allreduce.ring_schedule(size). A cell "3 → 1" means: this rank sends chunk 3 to
    rank 1 (and adds or, in the allgather, copies the chunk that arrives from its left neighbour).
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
    for side in axis.spines.values():
        side.set_visible(False)
    figure.tight_layout()
    return figure


def allreduce_times(rows, models=None, title: str = ""):
    """Measured Allreduce time and bus bandwidth against message size, one line per algorithm.

    rows: dicts with bytes, algorithm, ranks, seconds, bus_bandwidth (nnlib.lesson08_inside_allreduce.allreduce.main's CSV)
    for one number of ranks; models: {algorithm: predicted seconds per size} drawn dashed.
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
