"""Lessons 01 and 03's pictures: digit grids, learning curves, confusion matrices, hidden units' weights."""

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
        x = np.arange(1, history.epochs + 1) if against == "epoch" else np.cumsum(history.seconds)
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
        axis.text(j, i, str(count), ha="center", va="center", fontsize=7, color="white" if i == j else "black")
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
