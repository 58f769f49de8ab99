"""nnlib versus PyTorch on the CPU: training throughput and achieved FLOP rate.

Run (installs the pinned CPU PyTorch into .venv first):   make benchmark
or, inside the environment:   python benchmarks/cpu_throughput.py --threads 1

Both libraries train the same network (same sizes, same starting weights, float32,
sigmoid outputs with cross-entropy, plain SGD) on the same MNIST samples in the
same order, with the same number of BLAS threads, in this one process. Each case
reports the best epoch of a few after a warm-up epoch.
"""

import argparse
import os
import platform
import sys

parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
parser.add_argument("--threads", type=int, default=1, help="BLAS / PyTorch threads (default 1)")
parser.add_argument("--epochs", type=int, default=3, help="timed epochs per case (after one warm-up)")
parser.add_argument("--data-dir", default=None, help="folder with the MNIST files (default: NNLIB_DATA or the cache)")
parser.add_argument("--no-torch", action="store_true", help="skip PyTorch (nnlib figures only)")
args = parser.parse_args()

# Thread counts must be set before NumPy (and its BLAS) is imported.
for variable in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[variable] = str(args.threads)

import numpy as np  # noqa: E402

from nnlib.environment import blas_kernel  # noqa: E402
from nnlib.lesson01_mnist import data  # noqa: E402
from nnlib.lesson02_network.network import Network  # noqa: E402
from nnlib.lesson04_collectives.costmodel import flops_per_sample  # noqa: E402
from nnlib.lesson06_scaling.benchmarks import matmul_rate, torch_copy, training_throughput  # noqa: E402

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
    cropped_full = data.scale_pixels(np.ascontiguousarray(data.crop_center(mnist.train_images)))

    cases = [
        ("784-128-10, batch 128", (784, 128, 10), full, labels, 128),
        ("784-128-10, full batch", (784, 128, 10), full, labels, None),
        ("400-25-10, full batch, 5,000", (400, 25, 10), course, course_labels.astype(np.int64), None),
        ("400-25-10, full batch, 60,000", (400, 25, 10), cropped_full, labels, None),
    ]
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
          f"{args.threads} thread(s), float32, NumPy {np.__version__}, BLAS kernel {blas_kernel()}"
          + (f", PyTorch {torch.__version__}" if torch else ""))
    print("FLOPs count the matrix products nnlib performs: forward, weight gradients, and input "
          "gradients for every layer but the first.\n")
    header = (f"{'case':32s} {'nnlib samples/s':>16s} {'torch samples/s':>16s} {'nnlib/torch':>11s} "
              f"{'nnlib GFLOP/s':>13s} {'matmul GFLOP/s':>14s} {'of matmul':>9s} {'x seed':>7s}")
    print(header)
    print("-" * len(header))
    course_labels = course_labels.astype(np.int64)
    seed_rate = seed_style_throughput(course, course_labels)  # timed here, in this run
    for name, sizes, inputs, case_labels, batch in cases:
        ours = training_throughput(sizes, inputs, case_labels, batch, args.epochs)
        theirs = torch_throughput(torch, sizes, inputs, case_labels, batch, args.epochs) if torch else float("nan")
        achieved = ours * flops_per_sample(sizes) / 1e9
        ceiling = matmul_rate(sizes, batch or inputs.shape[0])
        print(f"{name:32s} {ours:16,.0f} {theirs:16,.0f} {ours / theirs:11.2f} "
              f"{achieved:13.1f} {ceiling:14.1f} {achieved / ceiling:9.0%} "
              + (f"{ours / seed_rate:7.0f}" if sizes == SEED_NETWORK else f"{'-':>7s}"))
    print(f"\nx seed: against the seed scripts' step (a loop over the samples), timed in this run on "
          f"{SEED_NETWORK[0]}-{SEED_NETWORK[1]}-{SEED_NETWORK[2]} and 5,000 samples: {seed_rate:,.0f} samples/s.")


if __name__ == "__main__":
    main()
