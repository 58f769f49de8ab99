"""Worked solutions to the exercises of lesson 03. Try them yourself first: check() tells you what is wrong."""

import numpy as np


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
