"""Lesson 02's exercises (notebook 02_network_from_scratch): one sigmoid layer forwards and backwards,
and the cost.
"""

import numpy as np

from nnlib.exercises import Exercise, case_generator, uniform

LESSON = 2


def sigmoid(z):
    """sigma(z) = 1 / (1 + e^-z), elementwise."""
    return 1 / (1 + np.exp(-z))


def layer_forward(inputs, weights, biases):
    """inputs (N, n_in), weights (n_in, n_out), biases (n_out,) -> activations sigma(inputs W + b) (N, n_out)."""
    return sigmoid(inputs @ weights + biases)


def layer_backward(inputs, weights, activations, grad_activations):
    """One sigmoid layer backwards. inputs a_prev (N, n_in), weights (n_in, n_out),
    activations a = sigma(a_prev W + b) (N, n_out), grad_activations dJ/da (N, n_out) ->
    (grad_weights (n_in, n_out), grad_biases (n_out,), grad_inputs (N, n_in))."""
    delta = grad_activations * activations * (1 - activations)  # dJ/dz = dJ/da * sigma'(z), (N, n_out)
    grad_weights = inputs.T @ delta                              # (n_in, N) @ (N, n_out)
    grad_biases = delta.sum(axis=0)                              # every sample adds to every bias
    grad_inputs = delta @ weights.T                              # (N, n_out) @ (n_out, n_in)
    return grad_weights, grad_biases, grad_inputs


def cross_entropy(logits, targets):
    """Mean over the N samples of the cross-entropy of sigmoid outputs a = sigma(logits) against
    one-hot targets y, summed over the K outputs. logits (N, K), targets (N, K) -> a float."""
    a = sigmoid(logits)
    return float(-np.sum(targets * np.log(a) + (1 - targets) * np.log(1 - a)) / len(logits))


def layer_cases(key, with_activations=False):
    """(inputs, weights, biases), or (inputs, weights, activations, grad_activations), of three sizes."""
    generator = case_generator(key)
    cases = []
    for samples, n_in, n_out in [(5, 4, 3), (7, 6, 1), (1, 3, 5)]:
        inputs, weights = uniform(generator, samples, n_in), uniform(generator, n_in, n_out)
        if with_activations:
            activations = layer_forward(inputs, weights, uniform(generator, n_out))
            cases.append((inputs, weights, activations, uniform(generator, samples, n_out)))
        else:
            cases.append((inputs, weights, uniform(generator, n_out)))
    return cases


def cross_entropy_cases():
    generator = case_generator("02.3")
    return [(uniform(generator, n, k) * 4, np.eye(k)[generator.integers(0, k, n)])  # one-hot targets
            for n, k in [(5, 3), (8, 10), (1, 2)]]


EXERCISES = [
    Exercise("02.1", layer_forward, lambda: layer_cases("02.1"),
             "one matrix product for all N samples at once; the biases broadcast over the rows."),
    Exercise("02.2", layer_backward, lambda: layer_cases("02.2", with_activations=True),
             "first dJ/dz with the chain rule, using sigma'(z) = a (1 - a); each gradient has the shape of "
             "what it is the gradient of, which tells you what to multiply and what to transpose."),
    Exercise("02.3", cross_entropy, cross_entropy_cases,
             "-[y ln a + (1 - y) ln(1 - a)] for every output; add over outputs and samples, divide by N.", 1e-9),
]
