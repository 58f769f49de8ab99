"""Lesson 07's picture: measured strong- or weak-scaling speedup and efficiency beside a law's curve."""

from __future__ import annotations

import numpy as np

LESSON = 7
NOTEBOOKS_ONLY = True  # drawn in the notebooks; no other module uses it


def scaling_curves(rows, kind: str, serial_fraction=None, law=None, label: str = "measured"):
    """Speedup and efficiency against ranks, with the ideal line (and a fitted law, if given). rows: summarize's;
    only ``kind`` ("strong" or "weak") rows are drawn; points with more ranks than cores: hollow, labelled."""
    import matplotlib.pyplot as plt

    rows = [row for row in rows if row["kind"] == kind]
    ranks, speedup, efficiency, over = (np.array([row[key] for row in rows])
                                        for key in ("ranks", "speedup", "efficiency", "oversubscribed"))
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
