"""Worked solutions to the exercises of lesson 02. Try them yourself first: check() tells you what is wrong."""

import numpy as np


def sigmoid(z):
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
