"""Lesson 03's exercises (notebook 03_training): a momentum step, the accuracy, an epoch's mini-batches."""

import numpy as np

from nnlib.exercises import Exercise, case_generator, uniform

LESSON = 3


def momentum_step(params, velocity, grads, learning_rate, momentum):
    """One SGD step with momentum; returns (new_params, new_velocity), each shaped like params."""
    new_velocity = momentum * velocity - learning_rate * grads
    return params + new_velocity, new_velocity


def accuracy(probabilities, labels):
    """The fraction of samples whose most probable class is their label. (N, K), (N,) -> a float."""
    return float(np.mean(np.argmax(probabilities, axis=1) == labels))


def batch_ranges(num_samples, batch_size):
    """The (start, stop) of every mini-batch of one epoch, in order; the last one may be smaller.
    Returns an int array (number of batches, 2)."""
    starts = np.arange(0, num_samples, batch_size)
    return np.stack([starts, np.minimum(starts + batch_size, num_samples)], axis=1)


def momentum_cases():
    generator = case_generator("03.1")
    return [(uniform(generator, n), uniform(generator, n), uniform(generator, n), rate, mu)
            for n, rate, mu in [(6, 0.5, 0.9), (11, 3.0, 0.0), (1, 0.1, 0.5)]]


def accuracy_cases():
    generator = case_generator("03.2")
    return [(generator.uniform(size=(n, 10)), generator.integers(0, 10, n)) for n in (20, 7, 1)]


EXERCISES = [
    Exercise("03.1", momentum_step, momentum_cases,
             "the velocity keeps a fraction (the momentum) of itself and moves against the gradient; "
             "the parameters then move by the new velocity."),
    Exercise("03.2", accuracy, accuracy_cases,
             "np.argmax along the right axis gives each sample's prediction; the mean of a boolean array "
             "is the fraction of its True entries."),
    Exercise("03.3", batch_ranges, lambda: [(10, 3), (12, 4), (5, 8), (1, 1)],
             "range(0, num_samples, batch_size) gives the starts; the last stop must not pass num_samples."),
]
