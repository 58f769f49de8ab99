"""A roofline (Williams, Waterman and Patterson 2009) of one CPU core, with a training step's kernels on it.

A kernel of F FLOPs that must move Q bytes (each operand read once, each result written once) has arithmetic intensity
I = F / Q (FLOP/byte) and runs at most at min(P, B I): P the compute roof (FLOP/s, a large product's measured rate),
B the measured bandwidth (byte/s) of the memory level its arrays fit in. Ridge point I* = P / B: a kernel left of it
is memory-bound there, right of it compute-bound. Times are one thread's CPU time: a roof the fastest of its repeats
(what the core can do, as STREAM reports), a kernel the median (what it does).
"""

from __future__ import annotations

import glob
import time
import warnings
from collections import namedtuple

import numpy as np
from threadpoolctl import threadpool_limits

from nnlib.lesson01_mnist.files import read_csv
from nnlib.lesson02_network.network import count_parameters, sigmoid, softmax
from nnlib.lesson03_training.optimizers import adam_update, sgd_update
from nnlib.lesson04_collectives.costmodel import fit_latency_bandwidth, step_matmul_shapes

LESSON = 19
NOTEBOOKS_ONLY = True  # notebook 19 and benchmarks/roofline.py use it

LAYER_SIZES = (784, 128, 64, 10)  # the network placed on the roofline: sigmoid hidden layers, softmax outputs
DEFAULT_CACHES = {"L1": 32 << 10, "L2": 1 << 20, "L3": 32 << 20}  # assumed (a recent server core's) if sysfs has none
# As lessons 02 and 03 write them: (FLOPs per element, arrays read, arrays written, arrays held); tanh, exp count 1.
ELEMENTWISE = {"sigmoid": (4, 1, 1, 2),  # 0.5 + 0.5 tanh(z / 2)
               "softmax": (5, 1, 1, 2),  # row max, subtract, exp, row sum, divide
               "SGD momentum": (4, 3, 2, 3),  # v <- mu v - eta g (3), p += v (1); reads p, g, v, writes p, v
               "Adam": (12, 4, 3, 4)}  # m (3), v (4), p -= s m / (sqrt(v) + eps) (5); reads p, g, m, v, writes p, m, v
# The H200 SXM's datasheet figures (float64 on tensor cores: what a cuBLAS float64 product uses); h200_roofs adds
# the float32 product rate that lesson 08's gpu-benchmark measured (TF32 off; notebooks/results/gpu-nvidia-h200.csv).
H200_PUBLISHED = {"HBM3e bandwidth": 4.8e12, "float32 peak": 66.9e12, "float64 tensor-core peak": 67e12}
CSV_FIELDS = ["name", "batch", "dtype", "flops", "moved_bytes", "held_bytes", "intensity", "level", "rate", "roof",
              "bound", "rate_low", "rate_high", "rounds"]  # the median rate of ``rounds`` rounds, its range
Kernel = namedtuple("Kernel", "name batch dtype flops moved_bytes held_bytes run")  # held: bytes of its arrays


def seconds_per_call(function, repeats: int = 7, sample_seconds: float = 1e-3, best: bool = False) -> float:
    """This thread's CPU seconds per call of ``function()`` (wall time would count other processes' turns too): the
    median of ``repeats`` samples, each a block of calls of about ``sample_seconds``; with ``best``, the fastest."""
    began = time.thread_time()
    function()  # a warm-up, and one call's estimate
    calls, samples = max(1, int(sample_seconds / max(time.thread_time() - began, 1e-7))), []
    for _ in range(repeats):
        began = time.thread_time()
        for _ in range(calls):
            function()
        samples.append((time.thread_time() - began) / calls)
    return float(min(samples) if best else np.median(samples))


def cache_sizes(root: str = "/sys/devices/system/cpu/cpu0/cache") -> dict:
    """{"L1": bytes, "L2": ..., ...}: cpu0's data and unified caches from Linux's sysfs (index*/level, type, size
    such as "32K"); if there are none, DEFAULT_CACHES, with a warning saying so."""
    caches = {}
    for index in sorted(glob.glob(f"{root}/index*")):
        try:
            level, kind, size = (open(f"{index}/{name}").read().strip() for name in ("level", "type", "size"))
            if kind != "Instruction":
                caches[f"L{int(level)}"] = int(size.rstrip("KMG")) << {"K": 10, "M": 20, "G": 30}.get(size[-1], 0)
        except (OSError, ValueError):
            continue
    if not caches:
        warnings.warn(f"no cache sizes under {root}: assuming {DEFAULT_CACHES} bytes, so the memory roofs may not "
                      "be measured inside this CPU's caches; pass its sizes to memory_roofs")
    return dict(sorted(caches.items())) or dict(DEFAULT_CACHES)


def copy_footprints(caches: dict) -> dict:
    """The bytes a copy measures each level at: half the first; then sqrt(below x level), amid the sizes only that
    level holds (half a shared last level is partly other cores'); "DRAM": 4 x the last level."""
    sizes = list(caches.values())
    inside = [sizes[0] // 2] + [int(np.sqrt(below * size)) // 16 * 16 for below, size in zip(sizes, sizes[1:])]
    return {**dict(zip(caches, inside)), "DRAM": 4 * sizes[-1]}


def memory_roofs(caches: dict, repeats: int = 15) -> dict:
    """{level: B, bytes/s}: np.copyto of float64 arrays of half each footprint (moved: read + written = footprint);
    T(n) = alpha + n / B, lesson 05's fit through a 16-byte copy and the level's, takes the per-call cost off. The
    sizes take turns, ``repeats`` times (a slow spell slows them alike); each keeps its fastest."""
    def copy(footprint):
        numbers = footprint // 16  # in one buffer, aligned to 64 bytes (a cache line), and 64 bytes more than
        buffer = np.ones(2 * numbers + 16)  # `numbers` apart: never a multiple of 4 KiB apart, which slows a copy
        start = (-buffer.ctypes.data % 64) // 8
        source, destination = buffer[start:start + numbers], buffer[start + numbers + 8:start + 2 * numbers + 8]
        return lambda: np.copyto(destination, source)

    copies = {level: copy(size) for level, size in {"tiny": 16, **copy_footprints(caches)}.items()}
    best = dict.fromkeys(copies, np.inf)
    for _ in range(repeats):
        for level, run in copies.items():
            best[level] = min(best[level], seconds_per_call(run, 1))
    return {level: 1 / fit_latency_bandwidth([16, size], [best["tiny"], best[level]])[1]
            for level, size in copy_footprints(caches).items()}


def compute_roof(dtype: str = "float64", size: int = 1024, repeats: int = 11) -> float:
    """P, FLOP/s: 2 size^3 FLOPs of a (size x size) @ (size x size) product over its time, one BLAS thread."""
    a = np.random.default_rng(0).random((size, size)).astype(dtype)
    out = np.empty_like(a)
    with threadpool_limits(1, user_api="blas"):
        return 2 * size**3 / seconds_per_call(lambda: np.matmul(a, a, out=out), repeats, best=True)


def elementwise(name: str, shape, batch: int, dtype: str, run) -> Kernel:
    """ELEMENTWISE[name] over n numbers: F = FLOPs per element x n, Q = (arrays read + written) x n x itemsize."""
    (flops, reads, writes, held), n, size = ELEMENTWISE[name], int(np.prod(shape)), np.dtype(dtype).itemsize
    return Kernel(f"{name} {shape}", batch, dtype, flops * n, (reads + writes) * n * size, held * n * size, run)


def step_kernels(layer_sizes=LAYER_SIZES, batch: int = 32, dtype: str = "float32") -> list:
    """The products of costmodel.step_matmul_shapes, (m, k) @ (k, n): F = 2 m k n, Q = (m k + k n + m n) itemsize;
    each hidden layer's sigmoid (batch, n_l); the softmax (batch, n_L)."""
    rng, itemsize, kernels = np.random.default_rng(0), np.dtype(dtype).itemsize, []
    for m, k, n in step_matmul_shapes(layer_sizes, batch):
        a, b, out = rng.random((m, k)).astype(dtype), rng.random((k, n)).astype(dtype), np.empty((m, n), dtype)
        moved = (m * k + k * n + m * n) * itemsize
        kernels.append(Kernel(f"{m}x{k} @ {k}x{n}", batch, dtype, 2 * m * k * n, moved, moved,
                              lambda a=a, b=b, out=out: np.matmul(a, b, out=out)))
    for layer, width in enumerate(layer_sizes[1:], 2):
        z, last = rng.standard_normal((batch, width)).astype(dtype), layer == len(layer_sizes)
        kernels.append(elementwise("softmax" if last else "sigmoid", z.shape, batch, dtype,
                                   (lambda z=z: softmax(z, np)) if last else (lambda z=z: sigmoid(z))))
    return kernels


def update_kernels(layer_sizes=LAYER_SIZES, dtype: str = "float32") -> list:
    """Lesson 03's SGD with momentum and Adam on all n parameters (lesson 02's count_parameters; batch 0: any)."""
    n = count_parameters(layer_sizes)
    p, g, m, v = (np.random.default_rng(seed).random(n).astype(dtype) for seed in range(4))
    return [elementwise("SGD momentum", (n,), 0, dtype, lambda: sgd_update(p, g, m, 1e-3, 0.9)),
            elementwise("Adam", (n,), 0, dtype, lambda: adam_update(p, g, m, v, 0.9, 0.999, 1e-3, 1e-8))]


def measured_rows(kernels, computes: dict, bandwidths: dict, caches: dict, repeats: int = 7) -> list:
    """Each kernel's row (place) at its measured rate F / seconds_per_call, in one BLAS thread."""
    with threadpool_limits(1, user_api="blas"):
        return [place(kernel, kernel.flops / seconds_per_call(kernel.run, repeats), computes, bandwidths, caches)
                for kernel in kernels]


def attainable(intensity, compute: float, bandwidth: float):
    """The roof min(P, B I) in FLOP/s at intensity I (FLOP/byte; a number or an array)."""
    return np.minimum(compute, bandwidth * np.asarray(intensity, dtype=float))


def ridge_points(compute: float, bandwidths: dict) -> dict:
    """{level: I* = P / B} in FLOP/byte: where each memory roof meets the compute roof."""
    return {level: compute / bandwidth for level, bandwidth in bandwidths.items()}


def place(kernel: Kernel, rate: float, computes: dict, bandwidths: dict, caches: dict) -> dict:
    """A CSV row: the kernel, its intensity, the smallest level holding its arrays ("DRAM" if none), its measured
    ``rate``, its roof min(P_dtype, B_level I), and what bounds it there (compute or memory)."""
    level = next((name for name, size in caches.items() if kernel.held_bytes <= size), "DRAM")
    intensity, compute = kernel.flops / kernel.moved_bytes, computes[kernel.dtype]
    roof = float(attainable(intensity, compute, bandwidths[level]))
    described = {field: value for field, value in kernel._asdict().items() if field != "run"}
    return {**described, "intensity": intensity,
            "level": level, "rate": rate, "roof": roof, "bound": "compute" if roof >= compute else "memory"}


def over_roof(rows, margin: float = 0.05) -> list:
    """The rows whose measured rate is above their roof by more than ``margin`` (a fraction: the noise allowed)."""
    return [row for row in rows if row["rate"] > (1 + margin) * row["roof"]]


def h200_roofs(csv_path: str) -> dict:
    """{figure: (value, "published" or "measured")}: H200_PUBLISHED, and lesson 08's product_rate of its CSV."""
    from nnlib.lesson08_gpu.gpu import load_csv, product_rate

    return {**{name: (value, "published") for name, value in H200_PUBLISHED.items()},
            "float32 product": (product_rate(load_csv(csv_path)), "measured")}


def load_rows(path) -> list:
    """The rows of a CSV of CSV_FIELDS (benchmarks/roofline.py's), numbers converted."""
    return read_csv(path, CSV_FIELDS, integers=("batch", "rounds"), what="roofline rows",
                    floats=("flops", "moved_bytes", "held_bytes", "intensity", "rate", "roof", "rate_low", "rate_high"))


def plot_roofline(rows, computes: dict, bandwidths: dict, recorded=(), h200=None):
    """Log-log, left: this core's roofs (a compute roof per dtype; each level's bandwidth up to the top one, its ridge
    point an x) and the kernels at (intensity, rate), ``rows`` coloured by batch, ``recorded`` hollow; right: the
    float32 roofs of ``h200`` (h200_roofs). Returns the figure."""
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    intensity, top = np.logspace(-2, 3, 100), max(computes.values())
    for level, bandwidth in bandwidths.items():
        axes[0].plot(intensity, attainable(intensity, top, bandwidth), label=f"{level} copy")
        axes[0].plot(top / bandwidth, top, "kx")
    for dtype, compute in computes.items():
        axes[0].axhline(compute, color="k", linestyle="-" if dtype == "float32" else ":", label=f"{dtype} product")
    for number, batch in enumerate(sorted({row["batch"] for row in rows})):
        chosen = [row for row in rows if row["batch"] == batch]
        axes[0].scatter([row["intensity"] for row in chosen], [row["rate"] for row in chosen], s=18,
                        color=f"C{4 + number}", label=f"batch {batch}" if batch else "updates")
    axes[0].scatter([row["intensity"] for row in recorded], [row["rate"] for row in recorded], s=30, marker="s",
                    facecolors="none", color="grey", label="recorded (benchmarks/roofline.py)")
    for name, (value, kind) in (h200 or {}).items():
        if name.startswith("float32"):
            axes[1].plot(intensity, attainable(intensity, value, h200["HBM3e bandwidth"][0]), label=f"{name} ({kind})")
            axes[1].plot(value / h200["HBM3e bandwidth"][0], value, "kx")
    axes[0].set(title="one CPU core, measured", ylabel="FLOP/s")
    axes[1].set(title="H200: HBM3e bandwidth (published)")
    for axis in axes:
        axis.set(xscale="log", yscale="log", xlabel="arithmetic intensity (FLOP/byte)")
        axis.legend(fontsize=7)
    return figure
