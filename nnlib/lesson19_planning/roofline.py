"""A roofline (Williams, Waterman and Patterson 2009) of this CPU's core, with one training step's kernels on it.

A kernel that does F FLOPs and must move Q bytes (each operand read once, each result written once) has arithmetic
intensity I = F / Q (FLOP/byte), and cannot run faster than

    attainable(I) = min(P, B I)      P: the compute roof (FLOP/s), B: the bandwidth (byte/s) of the memory level
                                     its arrays fit in (L1, L2, L3 or main memory, "DRAM")

The ridge point I* = P / B: a kernel left of it is memory-bound there, right of it compute-bound. P is measured (a
large product, one thread), B too (a streaming copy at half of each level's size, its per-call cost taken off by
lesson 05's alpha-beta fit), and every kernel is timed as the lessons run it: its own per-call cost puts it lower.
"""

from __future__ import annotations

import glob
import os
import time
import warnings
from typing import Callable, NamedTuple

import numpy as np

from nnlib.lesson02_network.network import sigmoid, softmax
from nnlib.lesson03_training.optimizers import adam_update, sgd_update
from nnlib.lesson04_collectives.costmodel import fit_latency_bandwidth, step_matmul_shapes

LESSON = 19
NOTEBOOKS_ONLY = True  # notebook 19 and benchmarks/roofline.py use it

LAYER_SIZES = (784, 128, 64, 10)  # the network placed on the roofline: sigmoid hidden layers, softmax outputs
DEFAULT_CACHES = {"L1": 32 << 10, "L2": 1 << 20, "L3": 32 << 20}  # a recent x86 server core's, when sysfs has none
# Element-wise kernels as lessons 02 and 03 write them: (FLOPs per element, arrays read, arrays written, arrays held).
ELEMENTWISE = {"sigmoid": (4, 1, 1, 2),  # 0.5 + 0.5 tanh(z / 2): a multiply, tanh (counted as one), multiply, add
               "softmax": (5, 1, 1, 2),  # row max (compares), subtract, exp, row sum, divide
               "SGD momentum": (4, 3, 2, 3),  # v <- mu v - eta g (3), p += v (1): reads p, g, v; writes p, v
               "Adam": (12, 4, 3, 4)}  # m (3), v (4), p -= s m / (sqrt(v) + eps) (5): reads p, g, m, v; writes p, m, v
# The H200 (SXM): NVIDIA's published figures; the float32 product rate measured by lesson 08's gpu-benchmark.
H200_PUBLISHED = {"HBM3e bandwidth (byte/s)": 4.8e12, "float32 (FLOP/s)": 66.9e12,
                  "float64 tensor cores (FLOP/s)": 67e12, "float64 (FLOP/s)": 34e12}
H200_CSV = "notebooks/results/gpu-nvidia-h200.csv"


class Kernel(NamedTuple):
    """One kernel of a step: F ``flops``, Q ``moved_bytes``, the bytes of the arrays it holds, and ``run()``."""
    name: str
    batch: int
    dtype: str
    flops: float
    moved_bytes: float
    held_bytes: float
    run: Callable


def seconds_per_call(function, repeats: int = 7, sample_seconds: float = 1e-3) -> float:
    """Median over ``repeats`` samples of this thread's CPU seconds per call of ``function()``, each sample a block
    of calls lasting about ``sample_seconds``. CPU time, not wall time: on a shared machine the wall clock also
    counts the other processes' turns, and a roofline asks what the core does while it runs this code."""
    began = time.thread_time()
    function()  # warm-up, and an estimate of one call
    calls = max(1, int(sample_seconds / max(time.thread_time() - began, 1e-7)))
    samples = []
    for _ in range(repeats):
        began = time.thread_time()
        for _ in range(calls):
            function()
        samples.append((time.thread_time() - began) / calls)
    return float(np.median(samples))


def cache_sizes(root: str = "/sys/devices/system/cpu/cpu0/cache") -> dict:
    """{"L1": bytes, "L2": ..., ...}: the data (or unified) caches of cpu0 in Linux's sysfs (index*/level, type,
    size such as "32K"); where there are none, DEFAULT_CACHES, with a warning that says so."""
    caches = {}
    for index in sorted(glob.glob(os.path.join(root, "index*"))):
        read = lambda name: open(os.path.join(index, name)).read().strip()  # noqa: E731
        try:
            if read("type") != "Instruction":
                size = read("size")
                caches[f"L{int(read('level'))}"] = int(size.rstrip("KMG")) << {"K": 10, "M": 20, "G": 30}.get(size[-1], 0)
        except (OSError, ValueError):
            continue
    if not caches:
        warnings.warn(f"no cache sizes under {root}; assuming {DEFAULT_CACHES} (bytes): the memory roofs are still "
                      "measured, but at sizes that may not fit this CPU's caches; pass cache sizes to memory_roofs")
        return dict(DEFAULT_CACHES)
    return dict(sorted(caches.items()))


def copy_footprints(caches: dict) -> dict:
    """Bytes of a streaming copy's two float64 arrays for each level, well inside it: half of the first level; for
    the others sqrt(the level below x the level), the middle of the range only that level holds (half of a shared
    last level is partly other cores' share); "DRAM": 4 x the last level."""
    sizes = list(caches.values())
    inside = [sizes[0] // 2] + [int(np.sqrt(below * size)) // 16 * 16 for below, size in zip(sizes, sizes[1:])]
    return {**dict(zip(caches, inside)), "DRAM": 4 * sizes[-1]}


def memory_roofs(caches: dict, repeats: int = 7) -> dict:
    """{level: bytes/s} of np.copyto(destination, source), each array half the level's footprint (copy_footprints),
    so that the bytes moved (read + written) = the footprint; T(n) = alpha + n / B (lesson 05's fit, through a
    16-byte copy and the level's) takes the per-call cost alpha off."""
    def copy_seconds(footprint):
        numbers = footprint // 16  # in one buffer, 64 bytes apart: never a multiple of 4 KiB (which slows a copy)
        buffer = np.ones(2 * numbers + 8)
        source, destination = buffer[:numbers], buffer[numbers + 8:]
        return seconds_per_call(lambda: np.copyto(destination, source), repeats)

    tiny = copy_seconds(16)
    return {level: 1 / fit_latency_bandwidth([16, footprint], [tiny, copy_seconds(footprint)])[1]
            for level, footprint in copy_footprints(caches).items()}


def compute_roof(dtype: str = "float64", size: int = 1024, repeats: int = 7) -> float:
    """FLOP/s of a (size x size) @ (size x size) product, 2 size^3 FLOPs, one BLAS thread: the median of repeats."""
    from threadpoolctl import threadpool_limits

    a = np.random.default_rng(0).random((size, size)).astype(dtype)
    out = np.empty_like(a)
    with threadpool_limits(1, user_api="blas"):
        return 2 * size**3 / seconds_per_call(lambda: np.matmul(a, a, out=out), repeats)


def step_kernels(layer_sizes=LAYER_SIZES, batch: int = 32, dtype: str = "float32") -> list[Kernel]:
    """The step's products ((m, k) @ (k, n): 2 m k n FLOPs, moving and holding m k + k n + m n numbers; the shapes
    of costmodel.step_matmul_shapes), each hidden layer's sigmoid on (batch, n_l) and the softmax on (batch, n_L)."""
    rng, size = np.random.default_rng(0), np.dtype(dtype).itemsize
    kernels = []
    for m, k, n in step_matmul_shapes(layer_sizes, batch):
        a, b, out = rng.random((m, k)).astype(dtype), rng.random((k, n)).astype(dtype), np.empty((m, n), dtype)
        moved = size * (m * k + k * n + m * n)
        kernels.append(Kernel(f"{m}x{k} @ {k}x{n}", batch, dtype, 2 * m * k * n, moved, moved,
                              lambda a=a, b=b, out=out: np.matmul(a, b, out=out)))
    for name, width in [("sigmoid", n) for n in layer_sizes[1:-1]] + [("softmax", layer_sizes[-1])]:
        z = rng.standard_normal((batch, width)).astype(dtype)
        run = (lambda z=z: sigmoid(z)) if name == "sigmoid" else (lambda z=z: softmax(z, np))
        kernels.append(elementwise_kernel(f"{name} {batch}x{width}", name, z.size, batch, dtype, run))
    return kernels


def elementwise_kernel(label: str, name: str, elements: int, batch: int, dtype: str, run) -> Kernel:
    """A Kernel of ELEMENTWISE[name] over ``elements`` numbers: F = flops per element x elements,
    Q = (arrays read + arrays written) x elements x itemsize."""
    flops, reads, writes, held = ELEMENTWISE[name]
    size = elements * np.dtype(dtype).itemsize
    return Kernel(label, batch, dtype, flops * elements, (reads + writes) * size, held * size, run)


def update_kernels(layer_sizes=LAYER_SIZES, dtype: str = "float32") -> list[Kernel]:
    """SGD with momentum and Adam on every parameter (n = sum n_(l-1) n_l + n_l), as lesson 03's update rules."""
    count = sum(n_in * n_out + n_out for n_in, n_out in zip(layer_sizes[:-1], layer_sizes[1:]))
    p, g, m, v = (np.random.default_rng(seed).random(count).astype(dtype) for seed in range(4))
    sgd = lambda: sgd_update(p, g, m, 1e-3, 0.9)  # noqa: E731
    adam = lambda: adam_update(p, g, m, v, 0.9, 0.999, 1e-3, 1e-8)  # noqa: E731
    return [elementwise_kernel(f"{name} {count}", name, count, 0, dtype, run)
            for name, run in (("SGD momentum", sgd), ("Adam", adam))]


def kernel_rate(kernel: Kernel, repeats: int = 7) -> float:
    """FLOP/s of ``kernel.run()`` in one BLAS thread: F / seconds_per_call."""
    from threadpoolctl import threadpool_limits

    with threadpool_limits(1, user_api="blas"):
        return kernel.flops / seconds_per_call(kernel.run, repeats)


def memory_level(held_bytes: float, caches: dict) -> str:
    """The smallest cache level whose size holds ``held_bytes``; "DRAM" if none does."""
    return next((level for level, size in caches.items() if held_bytes <= size), "DRAM")


def attainable(intensity, compute: float, bandwidth: float):
    """The roof min(P, B I) (FLOP/s) at intensity I (FLOP/byte), I a number or an array."""
    return np.minimum(compute, bandwidth * np.asarray(intensity, dtype=float))


def ridge_points(compute: float, bandwidths: dict) -> dict:
    """{level: P / B} (FLOP/byte): where each memory roof meets the compute roof."""
    return {level: compute / bandwidth for level, bandwidth in bandwidths.items()}


def place(kernel: Kernel, rate: float, computes: dict, bandwidths: dict, caches: dict) -> dict:
    """One row: the kernel, its intensity, level, measured rate, roof min(P, B_level I), and what bounds it there."""
    intensity, level = kernel.flops / kernel.moved_bytes, memory_level(kernel.held_bytes, caches)
    compute = computes[kernel.dtype]
    roof = float(attainable(intensity, compute, bandwidths[level]))
    return {"kernel": kernel.name, "batch": kernel.batch, "dtype": kernel.dtype, "flops": kernel.flops,
            "moved_bytes": kernel.moved_bytes, "held_bytes": kernel.held_bytes, "intensity": intensity,
            "level": level, "rate": rate, "roof": roof, "bound": "compute" if roof >= compute else "memory"}


def over_roof(rows, margin: float = 0.1) -> list[dict]:
    """The rows whose measured rate exceeds their roof by more than ``margin`` (a fraction: the noise allowed)."""
    return [row for row in rows if row["rate"] > (1 + margin) * row["roof"]]


def h200_figures(csv_path: str = H200_CSV) -> list[dict]:
    """The H200's roofline figures, each marked "published" (H200_PUBLISHED) or "measured" (the fastest float32
    product of lesson 08's recorded gpu-benchmark, TF32 off: lesson 08's product_rate)."""
    from nnlib.lesson08_gpu.gpu import load_csv, product_rate

    rows = [{"figure": name, "value": value, "kind": "published", "source": "NVIDIA H200 SXM datasheet"}
            for name, value in H200_PUBLISHED.items()]
    return rows + [{"figure": "float32 product (FLOP/s)", "value": product_rate(load_csv(csv_path)),
                    "kind": "measured", "source": csv_path}]


def plot_roofline(rows, computes: dict, bandwidths: dict, recorded=(), h200=None):
    """Log-log: left, this core's roofs (a memory roof per level up to its ridge point, a compute roof per dtype)
    with the kernels at (intensity, measured rate): filled, ``rows``; hollow, ``recorded`` (a CSV's); right, the
    H200's roofs from h200_figures (published: solid; measured: dashed). Returns the figure."""
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, 2 if h200 else 1, figsize=(12 if h200 else 7, 4.5), squeeze=False)
    left, intensity = axes[0][0], np.logspace(-2, 3, 200)
    for level, bandwidth in bandwidths.items():
        left.plot(intensity, attainable(intensity, max(computes.values()), bandwidth), label=f"{level} copy")
    for number, (dtype, compute) in enumerate(computes.items()):
        left.axhline(compute, color="k", linestyle=("-", "--")[number % 2], linewidth=0.8, label=f"{dtype} product")
    for marker, points, fill in (("o", rows, None), ("s", recorded, "none")):
        for batch in sorted({row["batch"] for row in points}):
            chosen = [row for row in points if row["batch"] == batch]
            left.scatter([r["intensity"] for r in chosen], [r["rate"] for r in chosen], marker=marker, s=18,
                         facecolors=fill, color=f"C{3 + sorted({r['batch'] for r in points}).index(batch)}",
                         label=f"{'recorded ' if fill else ''}{f'batch {batch}' if batch else 'update'}")
    left.set(title="this CPU, one core", xlabel="arithmetic intensity (FLOP/byte)", ylabel="FLOP/s")
    if h200:
        right, figures = axes[0][1], {row["figure"]: row for row in h200}
        bandwidth = figures["HBM3e bandwidth (byte/s)"]["value"]
        for name in ("float32 (FLOP/s)", "float32 product (FLOP/s)"):
            right.plot(intensity, attainable(intensity, figures[name]["value"], bandwidth),
                       "-" if figures[name]["kind"] == "published" else "--", label=f"{name}: {figures[name]['kind']}")
        right.set(title="H200 (HBM3e bandwidth: published)", xlabel="arithmetic intensity (FLOP/byte)")
    for axis in axes[0]:
        axis.set(xscale="log", yscale="log")
        axis.legend(fontsize=7)
    return figure
