"""Measuring speed honestly: FLOP counts, a reference matmul rate, and training throughput.

FLOPs of one training step on N samples, for layers (n_0, n_1, ..., n_L), counting
only the matrix products this implementation actually performs (a multiply-add
is 2 FLOPs; element-wise work is not counted):

    forward       z_l = a_{l-1} @ W_l              2 N n_{l-1} n_l   for every layer
    weight grads  dW_l = a_{l-1}.T @ delta_l       2 N n_{l-1} n_l   for every layer
    input grads   delta_{l-1} <- delta_l @ W_l.T   2 N n_{l-1} n_l   for layers 2..L only
                  (the first layer's input gradient, with respect to the pixels, is never needed)
"""

from __future__ import annotations

import time

import numpy as np

LESSON = 6



def flops_per_sample(layer_sizes) -> int:
    """Matrix-product FLOPs of one training step, per sample (see module docstring)."""
    products = [n_in * n_out for n_in, n_out in zip(layer_sizes[:-1], layer_sizes[1:])]
    return 2 * (2 * sum(products) + sum(products[1:]))


def step_matmul_shapes(layer_sizes, batch_size: int):
    """The (m, k, n) shapes of every matrix product in one training step on ``batch_size`` samples."""
    shapes = []
    pairs = list(zip(layer_sizes[:-1], layer_sizes[1:]))
    for n_in, n_out in pairs:
        shapes.append((batch_size, n_in, n_out))          # a_{l-1} @ W_l
    for layer, (n_in, n_out) in enumerate(pairs):
        shapes.append((n_in, batch_size, n_out))          # a_{l-1}.T @ delta_l
        if layer > 0:
            shapes.append((batch_size, n_out, n_in))      # delta_l @ W_l.T
    return shapes


def matmul_rate(layer_sizes, batch_size: int, dtype="float32", min_seconds: float = 0.5, seed: int = 0) -> float:
    """NumPy's measured rate (GFLOP/s) doing exactly one step's matrix products, nothing else.

    Random operands of the step's shapes are multiplied in the same order, repeated
    for at least ``min_seconds``; the rate is total FLOPs / total time. This is the
    ceiling the training step could reach if element-wise work and data movement were free.
    """
    rng = np.random.default_rng(seed)
    operands = [(rng.random((m, k), dtype=dtype), rng.random((k, n), dtype=dtype))
                for m, k, n in step_matmul_shapes(layer_sizes, batch_size)]
    flops = sum(2 * a.shape[0] * a.shape[1] * b.shape[1] for a, b in operands)
    for a, b in operands:  # warm-up
        a @ b
    repeats, start = 0, time.perf_counter()
    while True:
        for a, b in operands:
            a @ b
        repeats += 1
        elapsed = time.perf_counter() - start
        if elapsed >= min_seconds:
            return flops * repeats / elapsed / 1e9


def training_throughput(layer_sizes, inputs, labels, batch_size=None, epochs: int = 3,
                        learning_rate: float = 0.1, dtype="float32", seed: int = 0) -> float:
    """Samples per second of nnlib.train (best epoch of ``epochs`` after one warm-up epoch)."""
    from .network import Network
    from .training import train

    network = Network(layer_sizes, dtype=dtype, seed=seed)
    history = train(network, inputs, labels, epochs=epochs + 1, learning_rate=learning_rate,
                    batch_size=batch_size, seed=seed, progress=False)
    return inputs.shape[0] / min(history.seconds[1:])


def torch_copy(network, torch):
    """The same network in PyTorch, with the same starting weights, for fair comparisons.

    Returns a torch.nn.Sequential of Linear and Sigmoid layers that ends with the output
    *logits* (the loss applies the output sigmoid, as nnlib's cross-entropy from logits does).
    nnlib stores W as (n_in, n_out); torch.nn.Linear stores its transpose.
    """
    layers = []
    for weights, biases in zip(network.weights, network.biases):
        linear = torch.nn.Linear(*weights.shape)
        with torch.no_grad():
            linear.weight.copy_(torch.from_numpy(np.ascontiguousarray(weights.T)))
            linear.bias.copy_(torch.from_numpy(np.array(biases)))
        layers += [linear, torch.nn.Sigmoid()]
    return torch.nn.Sequential(*layers[:-1])
