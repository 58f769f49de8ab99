"""Lesson 08's exercises (notebook 08_gpu): a product's GFLOP/s, and when a training step is faster on the GPU, counting its launches."""

from nnlib.exercises import Exercise

LESSON = 8


def matmul_gflops(m, k, n, seconds):
    """The rate, in GFLOP/s, of a product (m, k) @ (k, n) that took `seconds`."""
    return 2 * m * k * n / seconds / 1e9


def gpu_wins(batch, hidden, kernels, launch_microseconds, gpu_tflops, cpu_gflops):
    """Is one training step of a 784-hidden-10 network on `batch` samples faster on the GPU than on one CPU core?
    The step does batch * (4 * 784 * hidden + 6 * hidden * 10) FLOPs. The GPU's step: `kernels` launches of
    `launch_microseconds` each, plus the FLOPs at `gpu_tflops`; the CPU's: the FLOPs at `cpu_gflops`. True or False."""
    flops = batch * (4 * 784 * hidden + 6 * hidden * 10)
    gpu_seconds = kernels * launch_microseconds * 1e-6 + flops / (gpu_tflops * 1e12)
    cpu_seconds = flops / (cpu_gflops * 1e9)
    return gpu_seconds < cpu_seconds


EXERCISES = [
    Exercise("08.1", matmul_gflops, lambda: [(1000, 1000, 1000, 0.02), (256, 784, 30, 1e-4), (1, 1, 1, 1e-9)],
             "each of the m n results takes k multiplications and k additions."),
    Exercise("08.2", gpu_wins,
             lambda: [(256, 128, 55, 25, 50, 120), (256, 1024, 55, 25, 50, 120), (256, 128, 16, 25, 50, 120),
                      (4096, 128, 55, 25, 50, 120), (1, 10, 1, 20, 50, 1)],
             "the GPU's step is the launches (each a fixed host cost, whatever the size) plus the FLOPs at its rate; "
             "the CPU's is the FLOPs at its rate."),
]
