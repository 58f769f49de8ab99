"""Numerical gradient checks: is backpropagation right?

Central differences give each partial derivative to O(epsilon^2):

    dJ/dtheta_i  ~  [ J(theta + eps e_i) - J(theta - eps e_i) ] / (2 eps)

and the relative error between two gradient vectors g and h is

    |g - h| / max(|g| + |h|, tiny)        (|.| the Euclidean norm)

In float64 a correct backward pass gives about 1e-9 or less; a wrong one about 1e-2 or more.
"""

from __future__ import annotations

import numpy as np

from nnlib.lesson02_network.arrays import to_numpy

LESSON = 2


def relative_error(expected, actual) -> float:
    """|expected - actual| / (|expected| + |actual|), with Euclidean norms (0 when both are 0)."""
    expected, actual = np.asarray(expected, dtype=np.float64), np.asarray(actual, dtype=np.float64)
    denominator = np.linalg.norm(expected) + np.linalg.norm(actual)
    return float(np.linalg.norm(expected - actual) / denominator) if denominator > 0 else 0.0


def numerical_gradient(function, x, indices=None, epsilon: float = 1e-5) -> np.ndarray:
    """Central-difference gradient of the scalar ``function()`` with respect to the flat array ``x``.

    ``x`` is perturbed in place (and restored); ``function`` must read it. Only the
    entries in ``indices`` (default: all) are estimated; the result has x's length.
    """
    gradient = np.zeros(x.shape[0])
    for i in range(x.shape[0]) if indices is None else indices:
        original = float(x[i])
        x[i] = original + epsilon
        plus = function()
        x[i] = original - epsilon
        minus = function()
        x[i] = original
        gradient[i] = (plus - minus) / (2 * epsilon)
    return gradient


def gradient_check(network, inputs, labels, num_checks=None, seed: int = 0, epsilon: float = 1e-5) -> float:
    """Compare backpropagation's gradient with central differences; return the relative error.

    ``num_checks`` random parameters are checked (default: all of them). Use a
    float64 network: in float32 the differences themselves are only good to ~1e-3.
    """
    network.loss_and_gradient(inputs, labels)
    analytic = np.array(to_numpy(network.grads), dtype=np.float64)  # a copy: loss() below leaves grads alone
    indices = np.arange(network.num_params)
    if num_checks is not None and num_checks < network.num_params:
        indices = np.random.default_rng(seed).choice(network.num_params, num_checks, replace=False)
    numeric = numerical_gradient(lambda: network.loss(inputs, labels), network.params, indices, epsilon)
    return relative_error(numeric[indices], analytic[indices])

