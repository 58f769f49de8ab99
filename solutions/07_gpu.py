"""Worked solutions to the exercises of lesson 07. Try them yourself first: check() tells you what is wrong."""


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
