"""nnlib versus PyTorch on the CPU: training throughput and achieved FLOP rate.

Run (installs the pinned CPU PyTorch into .venv first):   make benchmark
or, inside the environment:   python benchmarks/cpu_throughput.py --threads 1

Both libraries train the same network (same sizes, same starting weights, float32,
sigmoid outputs with cross-entropy, plain SGD) on the same MNIST samples in the
same order, with the same number of BLAS threads, in this one process. The cases run in R
interleaved rounds (default 5): in each round every case trains in nnlib, then in PyTorch, then
NumPy's matmul rate at its shapes is measured, and PyTorch's (with the BLAS PyTorch brings: MKL on
x86), each training run giving its best epoch of a few after a warm-up epoch. The table gives the
median over the rounds, with the range (lowest-highest) beside it.
"""

import argparse
import os
import platform
import sys
from statistics import median

parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
parser.add_argument("--threads", type=int, default=1, help="BLAS / PyTorch threads (default 1)")
parser.add_argument("--epochs", type=int, default=2, help="timed epochs per case and round (after one warm-up)")
parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds; medians over them (default 5)")
parser.add_argument("--data-dir", default=None, help="folder with the MNIST files (default: NNLIB_DATA or the cache)")
parser.add_argument("--no-torch", action="store_true", help="skip PyTorch (nnlib figures only)")
args = parser.parse_args()

# Thread counts must be set before NumPy (and its BLAS) is imported.
for variable in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[variable] = str(args.threads)

import numpy as np  # noqa: E402

from nnlib.course.environment import blas_kernel, cpu_model, describe  # noqa: E402
from nnlib.lesson01_mnist import data  # noqa: E402
from nnlib.lesson02_network.network import Network  # noqa: E402
from nnlib.lesson04_collectives.costmodel import flops_per_sample  # noqa: E402
from rates import (matmul_rate, numpy_over_torch_matmul, step_matmul_shapes,  # noqa: E402
                                               torch_copy, training_throughput)

SEED_NETWORK = (400, 25, 10)  # the seed scripts trained only this network


def seed_style_throughput(inputs, labels, iterations=3, learning_rate=2.0, seed=0):
    """Samples/s of a port of the seed scripts' full-batch step: backpropagation one sample at a time,
    in a Python loop over the samples (as their course-style code does), then one update.

    Per sample x (400,) with target y (10,): a1 = sigmoid(W1 x + b1), a2 = sigmoid(W2 a1 + b2);
    d2 = a2 - y, d1 = (W2^T d2) * a1 (1 - a1); gW2 += d2 a1^T, gb2 += d2, gW1 += d1 x^T, gb1 += d1.
    Then W -= eta g / N. Best of ``iterations`` full passes after a warm-up pass.
    """
    import time

    rng = np.random.default_rng(seed)
    w1, b1 = rng.normal(0, 0.1, (25, 400)).astype(np.float32), np.zeros(25, np.float32)
    w2, b2 = rng.normal(0, 0.1, (10, 25)).astype(np.float32), np.zeros(10, np.float32)
    targets = np.eye(10, dtype=np.float32)[labels]
    seconds = []
    for _ in range(iterations + 1):
        began = time.perf_counter()
        gw1, gb1, gw2, gb2 = np.zeros_like(w1), np.zeros_like(b1), np.zeros_like(w2), np.zeros_like(b2)
        for x, y in zip(inputs, targets):
            a1 = 1 / (1 + np.exp(-(w1 @ x + b1)))
            a2 = 1 / (1 + np.exp(-(w2 @ a1 + b2)))
            d2 = a2 - y
            d1 = (w2.T @ d2) * a1 * (1 - a1)
            gw2 += np.outer(d2, a1)
            gb2 += d2
            gw1 += np.outer(d1, x)
            gb1 += d1
        for parameter, gradient in ((w1, gw1), (b1, gb1), (w2, gw2), (b2, gb2)):
            parameter -= learning_rate * gradient / len(inputs)
        seconds.append(time.perf_counter() - began)
    return len(inputs) / min(seconds[1:])


def torch_throughput(torch, layer_sizes, inputs, labels, batch_size, epochs, learning_rate=0.1, seed=0):
    """Samples/s of the same training loop written in PyTorch (best epoch after a warm-up)."""
    import time

    model = torch_copy(Network(layer_sizes, seed=seed), torch)  # logits out; the loss applies the sigmoid
    optimizer = torch.optim.SGD(model.parameters(), lr=learning_rate)
    x_all, y_all = torch.from_numpy(inputs), torch.from_numpy(labels)
    targets_all = torch.nn.functional.one_hot(y_all, layer_sizes[-1]).float()
    num_samples = inputs.shape[0]
    batch_size = batch_size or num_samples
    rng = np.random.default_rng(seed)
    seconds = []
    for _ in range(epochs + 1):
        order = torch.from_numpy(rng.permutation(num_samples)) if batch_size < num_samples else None
        start = time.perf_counter()
        for first in range(0, num_samples, batch_size):
            if order is None:
                x, targets = x_all, targets_all
            else:
                index = order[first:first + batch_size]
                x, targets = x_all.index_select(0, index), targets_all.index_select(0, index)
            logits = model(x)
            loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, targets, reduction="sum") / x.shape[0]
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
        seconds.append(time.perf_counter() - start)
    return num_samples / min(seconds[1:])


def torch_blas(torch) -> str:
    """The BLAS PyTorch was built with ("BLAS mkl"), from its build configuration."""
    import re

    found = re.search(r"BLAS_INFO=([^,\s]+)", torch.__config__.show())
    return f"BLAS {found.group(1)}" if found else "BLAS not named in its build configuration"


def spread(values, form="{:,.0f}") -> str:
    """'median (lowest-highest)' of the rounds' values."""
    return f"{form.format(median(values))} ({form.format(min(values))}-{form.format(max(values))})"


def step_floor(layer_sizes, inputs, batch_size, seed=0) -> dict:
    """Microseconds per step of what every training step at ``batch_size`` does: the matrix products (at
    NumPy's own rate), the random gather of the batch's rows (into a fresh array, as nnlib's loop does)
    and a plain SGD update of every parameter (params -= eta grads, with its temporary); and the share of
    the products in their sum (``share``): what a step doing nothing else would reach. ``fixed``: the
    cost of a whole training step on a tiny network (its NumPy calls and Python lines), and
    ``share_with_fixed`` the share once that is added too. The fixed cost slightly double-counts the
    per-call overhead of the products, gather and update, so that limit is a little low."""
    import time

    rng = np.random.default_rng(seed)
    products = sum(2 * m * k * n for m, k, n in step_matmul_shapes(layer_sizes, batch_size))
    product_us = products / matmul_rate(layer_sizes, batch_size) / 1e3
    gathers = []
    for start in range(0, inputs.shape[0] - batch_size + 1, batch_size):
        rows = rng.integers(0, inputs.shape[0], batch_size)
        began = time.perf_counter()
        np.take(inputs, rows, axis=0)
        gathers.append(time.perf_counter() - began)
    count = sum(n_in * n_out + n_out for n_in, n_out in zip(layer_sizes[:-1], layer_sizes[1:]))
    params, grads = np.zeros(count, np.float32), np.ones(count, np.float32)
    updates = []
    for _ in range(200):
        began = time.perf_counter()
        params -= 0.1 * grads
        updates.append(time.perf_counter() - began)
    gather_us, update_us = median(gathers) * 1e6, median(updates) * 1e6
    fixed_us = fixed_step_cost(len(layer_sizes) - 1)
    return dict(products=product_us, gather=gather_us, update=update_us, fixed=fixed_us,
                share=product_us / (product_us + gather_us + update_us),
                share_with_fixed=product_us / (product_us + gather_us + update_us + fixed_us))


def fixed_step_cost(num_layers: int, batch_size: int = 2, num_samples: int = 1024, seed: int = 0) -> float:
    """Microseconds per step of nnlib's own training loop on a network so small (4-3-...-2, batch 2) that its
    arithmetic is free: what every step pays whatever its size, for its NumPy calls and its Python lines."""
    from nnlib.lesson03_training.training import train

    sizes = (4,) + (3,) * (num_layers - 1) + (2,)
    rng = np.random.default_rng(seed)
    inputs, labels = rng.random((num_samples, sizes[0]), dtype=np.float32), rng.integers(0, 2, num_samples)
    network = Network(sizes, dtype="float32", seed=seed)
    history = train(network, inputs, labels, epochs=20, learning_rate=0.1, batch_size=batch_size, seed=seed,
                    progress=False)
    return median(history.seconds[1:]) / (num_samples // batch_size) * 1e6


def main():
    try:
        import torch
        torch.set_num_threads(args.threads)
    except ImportError:
        torch = None
        if not args.no_torch:
            sys.exit("PyTorch is not installed: run `make benchmark` (installs torch==2.13.0) or pass --no-torch.")
    if args.no_torch:
        torch = None

    mnist = data.load_mnist(args.data_dir, progress=False)
    full = data.scale_pixels(mnist.train_images)
    labels = mnist.train_labels.astype(np.int64)
    course_images, course_labels = data.course_subset(mnist)
    course = data.scale_pixels(course_images)
    course_labels = course_labels.astype(np.int64)
    cropped_full = data.scale_pixels(np.ascontiguousarray(data.crop_center(mnist.train_images)))

    cases = [
        ("784-128-10, batch 128", (784, 128, 10), full, labels, 128),
        ("784-128-10, full batch", (784, 128, 10), full, labels, None),
        ("400-25-10, full batch, 5,000", (400, 25, 10), course, course_labels, None),
        ("400-25-10, full batch, 60,000", (400, 25, 10), cropped_full, labels, None),
    ]
    print(f"machine: {cpu_model()}, {platform.machine()}, {os.cpu_count()} cores, "
          f"{args.threads} thread(s), float32, NumPy {np.__version__}, BLAS kernel {blas_kernel()}"
          + (f", PyTorch {torch.__version__} ({torch_blas(torch)})" if torch else ""))
    print(f"memory: {describe()['memory']} (one process: PyTorch's runs too)")
    print("FLOPs count the matrix products nnlib performs: forward, weight gradients, and input "
          f"gradients for every layer but the first. Medians of {args.rounds} interleaved rounds "
          "(lowest-highest).\n")
    rounds = {name: dict(ours=[], theirs=[], ratio=[], share=[], seed=[], blas=[]) for name, *_ in cases}
    seed_rates = []
    for _ in range(args.rounds):
        seed_rates.append(seed_style_throughput(course, course_labels, iterations=1))  # timed here, in this run
        for name, sizes, inputs, case_labels, batch in cases:
            ours = training_throughput(sizes, inputs, case_labels, batch, args.epochs)
            theirs = torch_throughput(torch, sizes, inputs, case_labels, batch, args.epochs) if torch else float("nan")
            ceiling = matmul_rate(sizes, batch or inputs.shape[0])
            blas = numpy_over_torch_matmul(sizes, batch or inputs.shape[0], torch) if torch else float("nan")
            found = rounds[name]
            found["ours"].append(ours)
            found["theirs"].append(theirs)
            found["ratio"].append(ours / theirs)
            found["share"].append(ours * flops_per_sample(sizes) / 1e9 / ceiling)
            found["seed"].append(ours / seed_rates[-1])
            found["blas"].append(blas)
    print_table(cases, rounds)
    if torch:
        print(f"\nmatmul ratio: NumPy's matmul rate over PyTorch's, each at the products it runs in these cases "
              f"(NumPy in nnlib's chunks of at most\n{Network((2, 1)).chunk_size:,} rows, PyTorch on the whole batch; contiguous "
              f"operands), in the same round. Below 1, PyTorch's BLAS multiplies faster here.")
    print(f"\nx seed: against the seed scripts' step (a loop over the samples), timed in every round on "
          f"{SEED_NETWORK[0]}-{SEED_NETWORK[1]}-{SEED_NETWORK[2]} and 5,000 samples: {spread(seed_rates)} samples/s.")
    floor = step_floor((784, 128, 10), full, 128)
    print(f"\nWhat a step at 784-128-10, batch 128 must do, timed alone: the matrix products take {floor['products']:.0f} "
          f"us at NumPy's rate, the random gather of the batch's rows {floor['gather']:.0f} us and the update "
          f"{floor['update']:.0f} us\n(each as nnlib does it: a fresh array for the batch, eta g as a temporary); "
          f"a step doing only these would reach {floor['share']:.0%} of the matmul rate.\n"
          f"Every step also pays a fixed cost for its NumPy calls and Python lines, whatever its size: "
          f"{floor['fixed']:.0f} us a step on a 4-3-2 network at batch 2.\nWith it, the step's limit is "
          f"{floor['share_with_fixed']:.0%} of the matmul rate; the rest of the gap is mostly the element-wise work "
          f"(sigmoid, loss, bias).")


def print_table(cases, rounds) -> None:
    """One row per case: nnlib's and PyTorch's samples/s, their ratio, their BLAS libraries' ratio (matmul
    ratio), nnlib's share of NumPy's matmul rate, x seed."""
    header = (f"{'case':31s} {'nnlib samples/s':>25s} {'torch samples/s':>25s} {'nnlib/torch':>17s} "
              f"{'matmul ratio':>17s} {'of matmul':>13s} {'x seed':>11s}")
    print(header)
    print("-" * len(header))
    for name, sizes, *_ in cases:
        found = rounds[name]
        seed = spread(found["seed"], "{:.0f}") if sizes == SEED_NETWORK else "-"
        print(f"{name:31s} {spread(found['ours']):>25s} {spread(found['theirs']):>25s} "
              f"{spread(found['ratio'], '{:.2f}'):>17s} {spread(found['blas'], '{:.2f}'):>17s} "
              f"{spread(found['share'], '{:.0%}'):>13s} {seed:>11s}")


if __name__ == "__main__":
    main()
