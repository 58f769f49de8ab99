"""Lesson 07's exercises (notebook 07_gpu): a product's GFLOP/s, and when the GPU wins counting the copies."""

from nnlib.exercises import Exercise

LESSON = 7


def matmul_gflops(m, k, n, seconds):
    """The rate, in GFLOP/s, of a product (m, k) @ (k, n) that took `seconds`."""
    return 2 * m * k * n / seconds / 1e9


def gpu_wins(m, k, n, cpu_gflops, gpu_gflops, transfer_gbytes_per_second):
    """Is one float32 product (m, k) @ (k, n) faster on the GPU, counting the copies of both
    inputs to it and of the result back, than on the CPU? True or False."""
    flops = 2 * m * k * n
    copied_bytes = 4 * (m * k + k * n + m * n)
    gpu_seconds = copied_bytes / (transfer_gbytes_per_second * 1e9) + flops / (gpu_gflops * 1e9)
    cpu_seconds = flops / (cpu_gflops * 1e9)
    return gpu_seconds < cpu_seconds


EXERCISES = [
    Exercise("07.1", matmul_gflops, lambda: [(1000, 1000, 1000, 0.02), (256, 784, 30, 1e-4), (1, 1, 1, 1e-9)],
             "each of the m n results takes k multiplications and k additions."),
    Exercise("07.2", gpu_wins,
             lambda: [(4096, 4096, 4096, 100, 20000, 12), (64, 784, 30, 100, 20000, 12), (256, 784, 30, 50, 20000, 25),
                      (2048, 2048, 2048, 1000, 1000, 10)],
             "the GPU's time is the copies (bytes over the link's speed) plus the flops at its rate; "
             "the CPU's is the flops at its rate."),
]
