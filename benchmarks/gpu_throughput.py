"""nnlib on CuPy versus PyTorch eager on CUDA tensors: training throughput, TFLOP/s and share of the GPU's peak.

Run on a machine with an NVIDIA GPU, CuPy 14+ and PyTorch with CUDA (nothing is installed):
    python benchmarks/gpu_throughput.py                 (or: make gpu, which runs it in scripts/gpu-check.sh)
Check it on the CPU, with no GPU (NumPy for nnlib, PyTorch on the CPU if installed, tiny networks):
    python benchmarks/gpu_throughput.py --dry-run

Built like benchmarks/cpu_throughput.py. Both libraries train the same network (same sizes, same starting
weights, float32 with TF32 off, sigmoid outputs with cross-entropy, plain SGD at 0.1) on the same MNIST
samples in the same order: nnlib with its ``train`` on CuPy arrays, PyTorch with cpu_throughput.py's loop on
CUDA tensors, both with the data on the GPU from the start. The cases run in R interleaved rounds (default 3):
in each round every case trains in nnlib, then in PyTorch, each giving its best epoch of a few after a warm-up
epoch (an epoch's time ends when its result is on the host). The table gives the median over the rounds, with
the range (lowest-highest) beside it; nnlib/torch is each round's ratio of samples/s. TFLOP/s counts the
matrix products of a step (nnlib.lesson04_collectives.costmodel.flops_per_sample), and "of peak" is that
against the card's float32 peak without tensor cores (SMs x FP32 lanes x 2 x boost clock, or --peak-tflops).
"""

from __future__ import annotations

import argparse
import sys
import time
from statistics import median

import numpy as np

from nnlib.lesson01_mnist import data
from nnlib.lesson02_network.network import Network
from nnlib.lesson03_training.training import train
from nnlib.lesson04_collectives.costmodel import flops_per_sample
from rates import torch_copy

# The networks of issue 37: (name, layer sizes, batch).
CASES = [("784-128-10, batch 128", (784, 128, 10), 128),
         ("784-1024-10, batch 256", (784, 1024, 10), 256),
         ("784-4096-10, batch 1024", (784, 4096, 10), 1024),
         ("784-4096-4096-10, batch 1024", (784, 4096, 4096, 10), 1024),
         ("784-8192-8192-10, batch 4096", (784, 8192, 8192, 10), 4096)]
# The dry run's: the same shapes of network, small enough for a CPU in seconds.
DRY_CASES = [("784-16-10, batch 32", (784, 16, 10), 32),
             ("784-32-10, batch 64", (784, 32, 10), 64),
             ("784-64-10, batch 128", (784, 64, 10), 128),
             ("784-32-32-10, batch 128", (784, 32, 32, 10), 128),
             ("784-64-64-10, batch 256", (784, 64, 64, 10), 256)]
# FP32 lanes per SM by compute capability (CUDA C++ Programming Guide, "Arithmetic Instructions").
FP32_LANES = {(6, 0): 64, (7, 0): 64, (7, 5): 64, (8, 0): 64, (8, 6): 128, (8, 7): 128, (8, 9): 128, (9, 0): 128,
              (10, 0): 128, (12, 0): 128}
# Where the runtime gives no clock rate (CUDA 13 dropped it from the device properties): the vendor's figure.
PEAK_BY_NAME = [("H200", 66.9), ("H100 PCIe", 51.2), ("H100 NVL", 60.0), ("H100", 66.9), ("A100", 19.5),
                ("L40S", 91.6), ("L4", 30.3), ("A10", 31.2), ("V100", 15.7), ("T4", 8.1)]


def parse_arguments(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     epilog="\n".join(__doc__.splitlines()[1:]),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds; medians over them (default 3)")
    parser.add_argument("--epochs", type=int, default=2, help="timed epochs per case and round (after one warm-up)")
    parser.add_argument("--samples", type=int, default=None, help="training samples (default 60000; dry run 1024)")
    parser.add_argument("--data-dir", default=None, help="folder with the MNIST files (default: NNLIB_DATA or the cache)")
    parser.add_argument("--no-torch", action="store_true", help="skip PyTorch (nnlib figures only)")
    parser.add_argument("--peak-tflops", type=float, default=None, help="the card's float32 peak, if it is not found")
    parser.add_argument("--dry-run", action="store_true",
                        help="no GPU: nnlib on NumPy, PyTorch on the CPU if installed, tiny networks")
    return parser.parse_args(argv)


def device_and_peak(cupy, override=None) -> tuple[str, float | None, str]:
    """(the GPU's name, its float32 peak in TFLOP/s or None, how the peak was found)."""
    device = cupy.cuda.Device()
    properties = cupy.cuda.runtime.getDeviceProperties(device.id)
    name = properties["name"].decode() if isinstance(properties["name"], bytes) else properties["name"]
    if override:
        return name, override, "given by --peak-tflops"
    capability = (int(properties.get("major", 0)), int(properties.get("minor", 0)))
    clock_khz = properties.get("clockRate") or 0
    if not clock_khz:
        try:
            clock_khz = cupy.cuda.runtime.deviceGetAttribute(13, device.id)  # cudaDevAttrClockRate
        except Exception:  # (removed from CUDA 13's runtime)
            clock_khz = 0
    lanes, sms = FP32_LANES.get(capability), int(properties.get("multiProcessorCount", 0))
    if not clock_khz or lanes is None:
        for part, peak in PEAK_BY_NAME:
            if part in name:
                return name, peak, f"NVIDIA's figure for the {part} (no clock rate from the runtime)"
        return name, None, "not known (no clock rate from the runtime, an unlisted card): pass --peak-tflops"
    peak = sms * lanes * 2 * clock_khz * 1e3 / 1e12
    return name, peak, f"{sms} SMs x {lanes} FP32 lanes x 2 x {clock_khz / 1e6:.2f} GHz"


def nnlib_throughput(xp, sizes, inputs, labels, batch_size, epochs, seed=0) -> float:
    """Samples/s of nnlib.train on ``xp``'s arrays (best epoch after a warm-up)."""
    network = Network(sizes, seed=seed, device=xp)
    history = train(network, inputs, labels, epochs=epochs + 1, learning_rate=0.1, batch_size=batch_size,
                    seed=seed, progress=False)
    return inputs.shape[0] / min(history.seconds[1:])


def torch_throughput(torch, device, sizes, inputs, labels, batch_size, epochs, seed=0) -> float:
    """Samples/s of cpu_throughput.py's PyTorch loop on ``device``'s tensors (best epoch after a warm-up).

    inputs, labels: tensors on ``device``. Each epoch's order comes from default_rng(seed), as nnlib's."""
    model = torch_copy(Network(sizes, seed=seed), torch).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    targets_all = torch.nn.functional.one_hot(labels, sizes[-1]).float()
    num_samples = inputs.shape[0]
    rng = np.random.default_rng(seed)
    synchronize = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    seconds = []
    for _ in range(epochs + 1):
        synchronize()
        start = time.perf_counter()
        order = torch.from_numpy(rng.permutation(num_samples)).to(device)
        for first in range(0, num_samples, batch_size):
            index = order[first:first + batch_size]
            x, targets = inputs.index_select(0, index), targets_all.index_select(0, index)
            loss = torch.nn.functional.binary_cross_entropy_with_logits(model(x), targets, reduction="sum") / x.shape[0]
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
        synchronize()
        seconds.append(time.perf_counter() - start)
    return num_samples / min(seconds[1:])


def spread(values, form="{:,.0f}") -> str:
    """'median (lowest-highest)' of the rounds' values."""
    return f"{form.format(median(values))} ({form.format(min(values))}-{form.format(max(values))})"


def print_table(cases, rounds, peak) -> None:
    """One row per case: samples/s of both, their ratio, TFLOP/s of both and their share of the peak."""
    header = (f"{'case':30s} {'nnlib samples/s':>27s} {'torch samples/s':>27s} {'nnlib/torch':>17s} "
              f"{'nnlib TFLOP/s':>19s} {'torch TFLOP/s':>19s} {'of peak':>17s}")
    print(header)
    print("-" * len(header))
    for name, sizes, _ in cases:
        found = rounds[name]
        tflops = {who: [rate * flops_per_sample(sizes) / 1e12 for rate in found[who]] for who in ("ours", "theirs")}
        share = (f"{median(tflops['ours']) / peak:.0%} / {median(tflops['theirs']) / peak:.0%}" if peak else "-")
        print(f"{name:30s} {spread(found['ours']):>27s} {spread(found['theirs']):>27s} "
              f"{spread(found['ratio'], '{:.2f}'):>17s} {spread(tflops['ours'], '{:.2f}'):>19s} "
              f"{spread(tflops['theirs'], '{:.2f}'):>19s} {share:>17s}")


def gpu_libraries(args):
    """(cupy, torch or None, torch's device or None), or exit 2 saying why there is no GPU to measure."""
    from nnlib.course.environment import gpu_status

    usable, reason = gpu_status()
    if not usable:
        sys.exit(f"error: no usable GPU ({reason}); this benchmark measures one. "
                 "To check the script on the CPU: python benchmarks/gpu_throughput.py --dry-run")
    import cupy

    if args.no_torch:
        return cupy, None, None
    try:
        import torch
    except ImportError:
        sys.exit("error: PyTorch is not installed: install a CUDA build of PyTorch, or pass --no-torch")
    if not torch.cuda.is_available():
        sys.exit("error: PyTorch finds no CUDA GPU (a CPU-only build?): pass --no-torch for nnlib's figures alone")
    torch.backends.cuda.matmul.allow_tf32 = False  # float32 products in float32, as nnlib's
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    return cupy, torch, torch.device("cuda")


def cpu_libraries(args):
    """The dry run's (numpy, torch or None, torch's CPU device or None)."""
    if args.no_torch:
        return np, None, None
    try:
        import torch
    except ImportError:
        print("PyTorch is not installed: nnlib only (the torch columns are NaN).")
        return np, None, None
    torch.set_num_threads(1)
    return np, torch, torch.device("cpu")


def main(argv=None) -> None:
    args = parse_arguments(argv)
    xp, torch, device = cpu_libraries(args) if args.dry_run else gpu_libraries(args)
    cases = DRY_CASES if args.dry_run else CASES
    samples = args.samples or (1024 if args.dry_run else 60000)
    mnist = data.load_mnist(args.data_dir, progress=False)
    host_inputs = data.scale_pixels(mnist.train_images[:samples])
    host_labels = mnist.train_labels[:samples].astype(np.int64)
    if args.dry_run:
        name, peak, how = "none (a dry run on the CPU: these figures say nothing about a GPU)", None, "none"
    else:
        name, peak, how = device_and_peak(xp, args.peak_tflops)
    versions = f"NumPy {np.__version__}" + (f", CuPy {xp.__version__}" if xp is not np else "")
    versions += f", PyTorch {torch.__version__}" if torch else ", no PyTorch"
    print(f"device: {name}; float32 peak: {f'{peak:.1f} TFLOP/s ({how})' if peak else how}")
    print(f"{versions}; {samples:,} samples, float32, TF32 off; medians of {args.rounds} interleaved rounds "
          f"(lowest-highest), best of {args.epochs} epochs after a warm-up\n")
    inputs, labels = xp.asarray(host_inputs), xp.asarray(host_labels)  # on the device once, before any timing
    torch_inputs = torch.from_numpy(host_inputs).to(device) if torch else None
    torch_labels = torch.from_numpy(host_labels).to(device) if torch else None
    rounds = {name: dict(ours=[], theirs=[], ratio=[]) for name, *_ in cases}
    for _ in range(args.rounds):
        for case, sizes, batch in cases:
            ours = nnlib_throughput(xp, sizes, inputs, labels, batch, args.epochs)
            theirs = (torch_throughput(torch, device, sizes, torch_inputs, torch_labels, batch, args.epochs)
                      if torch else float("nan"))
            rounds[case]["ours"].append(ours)
            rounds[case]["theirs"].append(theirs)
            rounds[case]["ratio"].append(ours / theirs)
    print_table(cases, rounds, peak)
    print("\nnnlib/torch above 1: nnlib trains more samples per second. Of peak: nnlib / PyTorch, the median TFLOP/s "
          "over the card's float32 peak.")


if __name__ == "__main__":
    main()
