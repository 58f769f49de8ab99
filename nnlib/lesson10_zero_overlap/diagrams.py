"""Lesson 10's pictures: one ZeRO step, and overlap as a timeline."""

from nnlib.lesson10_zero_overlap.simulated_link import Link

LESSON = 10
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
