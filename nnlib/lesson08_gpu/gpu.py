"""Measuring matrix products and training on the CPU and the GPU, honestly.

GPU work is *asynchronous*: a CuPy call returns as soon as the work is queued, so a timer must wait for the GPU
(stream synchronisation) before it stops, and the first calls (which compile kernels and allocate memory) must be
left out as warm-up. :func:`device_seconds` (lesson 04's timer, synchronised) does both. Everything here takes the
array module (numpy or cupy) as an argument; ``python -m nnlib gpu-benchmark --results-dir notebooks/results``
records the figures on a GPU machine for notebook 08 to show on machines without one.
"""

from __future__ import annotations

import argparse
import datetime
import re

import numpy as np

from nnlib.lesson01_mnist.files import read_csv, write_csv
from nnlib.lesson02_network.arrays import to_numpy
from nnlib.lesson02_network.network import Network, sigmoid
from nnlib.lesson04_collectives import timing
from nnlib.lesson04_collectives.costmodel import flops_per_sample
from nnlib.lesson08_gpu.backend import gpu_status, resolve_backend, synchronizer

LESSON = 8

# Shapes (m, k, n) of A (m x k) @ B (k x n), tiny to large; the first: the seed's layer product (120 samples, 30 -> 20).
MATMUL_SHAPES = [(120, 30, 20), (64, 64, 64), (128, 128, 128), (256, 256, 256), (512, 512, 512),
                 (1024, 1024, 1024), (2048, 2048, 2048), (4096, 4096, 4096)]
CSV_FIELDS = ["kind", "variant", "m", "k", "n", "hidden", "samples", "cpu_seconds", "gpu_seconds",
              "gpu_with_copies_seconds", "device", "date"]


def device_seconds(function, xp, repeats: int = 10) -> float:
    """The series' one timer (nnlib.lesson04_collectives.timing.median_seconds), waiting for the device ``xp``."""
    return timing.median_seconds(function, repeats, synchronize=synchronizer(xp))


def matmul_sweep(shapes=MATMUL_SHAPES, gpu=None, repeats: int = 10, seed: int = 0) -> list[dict]:
    """CPU (NumPy) versus GPU time of A @ B for each shape, in float32. gpu_seconds: the product alone, operands
    already on the GPU; gpu_with_copies_seconds: copy A and B to the GPU, multiply, copy the result back. Without
    ``gpu`` (the cupy module) the GPU columns are NaN."""
    rng = np.random.default_rng(seed)
    records = []
    for m, k, n in shapes:
        a, b = rng.random((m, k), dtype=np.float32), rng.random((k, n), dtype=np.float32)
        record = {"kind": "matmul", "m": m, "k": k, "n": n, "cpu_seconds": device_seconds(lambda: a @ b, np, repeats),
                  "gpu_seconds": float("nan"), "gpu_with_copies_seconds": float("nan")}
        if gpu is not None:
            device_a, device_b = gpu.asarray(a), gpu.asarray(b)
            record["gpu_seconds"] = device_seconds(lambda: device_a @ device_b, gpu, repeats)
            record["gpu_with_copies_seconds"] = device_seconds(
                lambda: to_numpy(gpu.asarray(a) @ gpu.asarray(b)), gpu, repeats)
        records.append(record)
    return records


def product_rate(records) -> float:
    """The GPU's product rate in FLOP/s: the fastest of the matmul records, 2 m k n / gpu_seconds."""
    return max(2 * r["m"] * r["k"] * r["n"] / r["gpu_seconds"] for r in records if r["kind"] == "matmul")


def predicted_epoch_seconds(hidden, samples, product_flops_per_second, batch_size=256, kernels=55,
                            launch_seconds=25e-6, inputs=784, outputs=10) -> float:
    """A GPU epoch of inputs-hidden-outputs by the launch-cost model: each step costs its launches + its FLOPs.

    step = kernels * launch_seconds + batch * (4 * inputs * hidden + 6 * hidden * outputs) / product_flops_per_second
    (per weight and sample 2 FLOPs forward, 2 for its gradient and 2 for the input gradient, which the first layer
    skips: lesson 04's flops_per_sample). The defaults are measured, not fitted to epochs: on an H200
    host a CuPy call cost 13-25 us whatever the array size, and a step of the code before fusion issued 55 kernels
    and copies (../shared/notes/gpu.md). Launches are asynchronous, so the two parts overlap: an upper bound."""
    flops = samples * flops_per_sample((inputs, hidden, outputs))
    return -(-samples // batch_size) * kernels * launch_seconds + flops / product_flops_per_second


def forward_one_sample_at_a_time(network, inputs) -> np.ndarray:
    """The seed's mistake: every sample, every layer, its own tiny product, copied to the device and back.
    inputs: host (NumPy) rows (N, n_0); returns the outputs (N, n_L) on the host."""
    xp = network.xp
    outputs = []
    for row in inputs:
        activation = to_numpy(xp.asarray(row[None, :]))
        for weights, biases in zip(network.weights, network.biases):
            activation = to_numpy(sigmoid(xp.asarray(activation) @ weights + biases, xp))
        outputs.append(activation[0])
    return np.stack(outputs)


def forward_batched(network, inputs) -> np.ndarray:
    """One product per layer for the whole batch, on the device; one copy in, one copy out."""
    return to_numpy(network.forward(network.xp.asarray(inputs))[-1])


def forward_comparison(inputs, hidden: int = 1024, gpu=None, repeats: int = 3) -> list[dict]:
    """Forward passes of 784-hidden-10 over ``inputs``: one sample at a time versus batched, CPU and GPU."""
    cpu_network = Network((inputs.shape[1], hidden, 10), seed=0)
    gpu_network = Network((inputs.shape[1], hidden, 10), seed=0, device=gpu) if gpu is not None else None
    return [{"kind": "forward", "variant": variant, "hidden": hidden, "samples": inputs.shape[0],
             "cpu_seconds": device_seconds(lambda: forward(cpu_network, inputs), np, repeats),
             "gpu_seconds": device_seconds(lambda: forward(gpu_network, inputs), gpu, repeats) if gpu else float("nan"),
             "gpu_with_copies_seconds": float("nan")}
            for variant, forward in (("per_sample", forward_one_sample_at_a_time), ("batched", forward_batched))]


def epoch_seconds(hidden: int, inputs, labels, device: str = "cpu", batch_size: int = 256, seed: int = 0) -> float:
    """Seconds of one training epoch of 784-hidden-10 (the second of two; on a GPU, the data moved there first)."""
    from nnlib.lesson03_training.training import train

    network = Network((inputs.shape[1], hidden, 10), seed=seed, device=resolve_backend(device))
    history = train(network, network.xp.asarray(inputs), network.xp.asarray(labels), epochs=2,
                    learning_rate=0.1, batch_size=batch_size, momentum=0.9, seed=seed, progress=False)
    return history.seconds[1]


def load_csv(path) -> list[dict]:
    """Records from a CSV of CSV_FIELDS (written by main), numbers converted (empty: None, or NaN for times)."""
    return read_csv(path, CSV_FIELDS, integers=("m", "k", "n", "hidden", "samples"),
                    floats=("cpu_seconds", "gpu_seconds", "gpu_with_copies_seconds"), what="GPU benchmark records")


def device_slug(name: str) -> str:
    """A file-name part from a device name: "NVIDIA H100 80GB HBM3" -> "nvidia-h100-80gb-hbm3"."""
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") or "gpu"


def format_records(records) -> str:
    """A plain-text table of benchmark records, with the CPU / GPU ratio of each."""
    lines = [f"{'what':>34s} {'CPU (1 core)':>13s} {'GPU':>11s} {'GPU + copies':>13s} {'CPU / GPU':>10s}"]
    whats = {"matmul": "A ({m} x {k}) @ B ({k} x {n})", "epoch": "epoch, 784-{hidden}-10, {samples} samples",
             "forward": "forward {variant}, {samples} samples"}
    for r in records:
        what, copies = whats[r["kind"]].format(**r), r["gpu_with_copies_seconds"] * 1e3
        copies = " " * 13 if np.isnan(copies) else f"{copies:10.3f} ms"
        lines.append(f"{what:>34s} {r['cpu_seconds'] * 1e3:10.3f} ms {r['gpu_seconds'] * 1e3:8.3f} ms {copies} "
                     f"{r['cpu_seconds'] / r['gpu_seconds']:9.1f}x")
    return "\n".join(lines)


def main(argv=None) -> int:
    """``python -m nnlib gpu-benchmark``: record the matmul sweep and training epochs, CPU (1 thread) and GPU."""
    from threadpoolctl import threadpool_limits

    from nnlib.lesson01_mnist import data

    parser = argparse.ArgumentParser(prog="python -m nnlib gpu-benchmark", description=main.__doc__)
    parser.add_argument("--hidden", type=int, nargs="+", default=[128, 512, 1024, 2048, 4096])
    parser.add_argument("--samples", type=int, default=60000, help="training samples per epoch")
    parser.add_argument("--largest", type=int, default=4096,
                        help="largest matrix side in the product sweep (default 4096)")
    parser.add_argument("--repeats", type=int, default=10, help="timed calls per product (their median counts)")
    parser.add_argument("--results-dir", help="write the records to RESULTS_DIR/gpu-<device name>.csv "
                                              "(notebook 08 reads notebooks/results)")
    args = parser.parse_args(argv)
    usable, reason = gpu_status()
    if not usable:
        print(f"error: no usable GPU ({reason}); this command records GPU figures, so it needs one.")
        return 2
    import cupy

    name = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)["name"]
    device = name.decode() if isinstance(name, bytes) else name
    date = datetime.date.today().isoformat()
    with threadpool_limits(1):  # the CPU side is one core, as in the rest of the series
        records = matmul_sweep([shape for shape in MATMUL_SHAPES if max(shape) <= args.largest], gpu=cupy,
                               repeats=args.repeats)
        mnist = data.load_mnist(progress=False)
        inputs = data.scale_pixels(mnist.train_images[:args.samples])
        labels = mnist.train_labels[:args.samples].astype(np.int64)
        for hidden in args.hidden:
            records.append({"kind": "epoch", "hidden": hidden, "samples": args.samples,
                            "cpu_seconds": epoch_seconds(hidden, inputs, labels, "cpu"),
                            "gpu_seconds": epoch_seconds(hidden, inputs, labels, "gpu"),
                            "gpu_with_copies_seconds": float("nan")})
        records += forward_comparison(inputs[:200], gpu=cupy)
    for record in records:
        record.update(device=device, date=date)
    print(format_records(records))
    if args.results_dir:
        output = f"{args.results_dir}/gpu-{device_slug(device)}.csv"
        write_csv(records, output, CSV_FIELDS)
        print(f"wrote {len(records)} records to {output}")
    return 0
