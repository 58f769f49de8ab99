"""Lesson 01's exercises (notebook 01_mnist): from MNIST's images and labels to the network's arrays."""

import numpy as np

from nnlib.exercises import Exercise, case_generator

LESSON = 1


def scale_pixels(images):
    """uint8 images (N, H, W) with values 0..255 -> float32 (N, H*W) with values in [0, 1]."""
    return images.reshape(len(images), -1).astype(np.float32) / np.float32(255)


def one_hot(labels, num_classes):
    """Labels (N,) in 0..num_classes-1 -> float32 (N, num_classes): a 1 in each row's label column."""
    encoded = np.zeros((len(labels), num_classes), dtype=np.float32)
    encoded[np.arange(len(labels)), labels] = 1
    return encoded


def image_cases():
    generator = case_generator("01.1")
    return [(generator.integers(0, 256, size=shape, dtype=np.uint8),)
            for shape in [(3, 28, 28), (5, 20, 20), (1, 2, 2)]]


EXERCISES = [
    Exercise("01.1", scale_pixels, image_cases,
             "flatten each image into one row, then divide by the largest pixel value, in float32.", 1e-6),
    Exercise("01.2", one_hot,
             lambda: [(np.array(labels), classes)
                      for labels, classes in [([3, 0, 9, 3], 10), ([1, 0, 2], 3), ([0], 1)]],
             "start from zeros; row i needs a single 1, in column labels[i] (fancy indexing sets them all at once)."),
]
