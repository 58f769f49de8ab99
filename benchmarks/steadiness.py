"""Is this machine steady enough to benchmark? One fixed matrix product, timed again and again.

A benchmark compares two codes on one machine, run after run. On some machines (a cloud VM, a
laptop with a browser open) the same work can take very different times from one second to the
next: another tenant on the same physical core, a clock that changes speed, cores that share a
physical core or a power budget. This probe times one
float32 product, (128 x 784) @ (784 x 128) on one BLAS thread (the first product of a 784-128-10
step at batch 128), in blocks of 20 products, for a few seconds on one core, then on every core at
once (one process per core this process may use), then on one core again, and says how much the
same work varied:

    spread     = p90 / p10 of the one-core block times     (1.00: perfectly steady)
    contention = the median block time with every core busy / the median on one core
                 (each core's own product should not slow down when the others work)

The machine counts as steady when spread <= 1.10 and contention <= 1.15. ``make benchmark``
(benchmarks/record.py) runs the probe before and after the benchmarks and records both lines with
the results: figures from a disturbed machine are kept, but said to be so. The probe does not say
why a machine is disturbed, only that the same work did not take the same time.

Run:   .venv/bin/python benchmarks/steadiness.py
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import numpy as np

SHAPE = (128, 784, 128)  # (m, k, n): (m x k) @ (k x n)
BLOCK = 20  # products per timed block
STEADY_SPREAD, STEADY_CONTENTION = 1.10, 1.15


def block_times(seconds: float) -> list[float]:
    """Seconds per product of each block of BLOCK products, for ``seconds`` of wall time (one BLAS thread)."""
    from threadpoolctl import threadpool_limits

    threadpool_limits(1)
    m, k, n = SHAPE
    rng = np.random.default_rng(0)
    left, right = rng.random((m, k), dtype=np.float32), rng.random((k, n), dtype=np.float32)
    for _ in range(50):  # warm up: caches, the BLAS's buffers
        left @ right
    times, end = [], time.perf_counter() + seconds
    while time.perf_counter() < end:
        began = time.perf_counter()
        for _ in range(BLOCK):
            left @ right
        times.append((time.perf_counter() - began) / BLOCK)
    return times


def run_workers(count: int, seconds: float) -> list[list[float]]:
    """``count`` processes timing blocks at the same time; each one's block times."""
    workers = []
    try:
        for _ in range(count):
            workers.append(subprocess.Popen([sys.executable, __file__, "--worker", str(seconds)],
                                            stdout=subprocess.PIPE, text=True))
        outputs = [worker.communicate(timeout=seconds + 120)[0] for worker in workers]
        if any(worker.returncode for worker in workers):
            raise RuntimeError(f"a steadiness worker failed (exit codes {[worker.returncode for worker in workers]})")
        return [json.loads(output) for output in outputs]
    finally:
        for worker in workers:  # on any failure, no worker outlives the probe
            if worker.poll() is None:
                worker.kill()
                worker.wait()


def verdict(alone: list[float], together: list[list[float]]) -> dict:
    """spread (p90 / p10 of the one-core times), contention (median of the per-process medians with every
    core busy / the one-core median), the one-core median in microseconds, and whether both are steady."""
    alone = np.asarray(alone)
    spread = float(np.percentile(alone, 90) / np.percentile(alone, 10))
    contention = float(np.median([np.median(times) for times in together]) / np.median(alone))
    return dict(median_us=float(np.median(alone) * 1e6), spread=spread, contention=contention,
                steady=spread <= STEADY_SPREAD and contention <= STEADY_CONTENTION)


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity), else os.cpu_count()."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        return os.cpu_count() or 1


def probe(seconds: float = 3.0) -> dict:
    """One core, every usable core, one core again (``seconds`` each): :func:`verdict` of it all, and
    ``cores``: how many processes ran at once."""
    cores = usable_cores()
    first = run_workers(1, seconds)[0]
    together = run_workers(cores, seconds)
    last = run_workers(1, seconds)[0]
    return dict(verdict(first + last, together), cores=len(together))


def line(found: dict) -> str:
    m, k, n = SHAPE
    state = ("steady" if found["steady"] else
             "DISTURBED: the same work took different times, or slowed with every core busy; compare these "
             "figures with care")
    return (f"steadiness: ({m} x {k}) @ ({k} x {n}) float32, 1 thread, blocks of {BLOCK}: median "
            f"{found['median_us']:.0f} us, p90/p10 {found['spread']:.2f} (steady <= {STEADY_SPREAD:.2f}), every core "
            f"busy / one {found['contention']:.2f} (steady <= {STEADY_CONTENTION:.2f}): {state}")


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--worker":
        print(json.dumps(block_times(float(sys.argv[2]))))
    else:
        print(line(probe()), flush=True)
