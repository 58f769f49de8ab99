"""Measuring speed honestly, for the scripts beside this file: a reference matmul rate, and training throughput.

A step's FLOPs and matrix products' shapes are counted once, in nnlib.lesson04_collectives.costmodel.
"""

from __future__ import annotations

import time

import numpy as np

from nnlib.lesson04_collectives.costmodel import step_matmul_shapes


def matmul_rate(layer_sizes, batch_size: int, dtype="float32", min_seconds: float = 0.5, seed: int = 0,
                convert=None) -> float:
    """NumPy's measured rate (GFLOP/s) doing exactly one step's matrix products, nothing else.

    Random operands of the step's shapes are multiplied in the same order, repeated
    for at least ``min_seconds``; the rate is total FLOPs / total time. This is the
    ceiling the training step could reach if element-wise work and data movement were free.
    ``convert``: a function that turns each NumPy operand into another library's array
    (``torch.from_numpy``): that library's rate at the same shapes, with its own BLAS.
    """
    rng = np.random.default_rng(seed)
    convert = convert or (lambda array: array)
    operands = [(convert(rng.random((m, k), dtype=dtype)), convert(rng.random((k, n), dtype=dtype)))
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


def numpy_over_torch_matmul(layer_sizes, rows: int, torch) -> float:
    """NumPy's matmul rate over PyTorch's, each at the products it runs for a batch of ``rows``: NumPy in
    nnlib's chunks of at most ``chunk_size`` rows (a larger batch goes in chunks), PyTorch on the whole
    batch. Below 1, PyTorch's BLAS multiplies these products faster on this machine."""
    from nnlib.lesson02_network.network import Network

    chunk = Network((2, 1)).chunk_size
    return matmul_rate(layer_sizes, min(rows, chunk)) / matmul_rate(layer_sizes, rows, convert=torch.from_numpy)


def training_throughput(layer_sizes, inputs, labels, batch_size=None, epochs: int = 3,
                        learning_rate: float = 0.1, dtype="float32", seed: int = 0) -> float:
    """Samples per second of nnlib.train (best epoch of ``epochs`` after one warm-up epoch)."""
    from nnlib.lesson02_network.network import Network
    from nnlib.lesson03_training.training import train

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
