"""Timing a piece of code honestly: warm-up calls first, then the median of several timed calls.

One timer for the whole series. The first calls of anything are slow (caches, memory allocation,
compiled GPU kernels), so ``warmup`` calls run untimed; a median ignores the odd slow call
(another process, an interrupt) that a mean would let decide everything. Work that returns
before it is finished (a GPU kernel) needs ``synchronize`` to wait for it; a collective needs
every rank to start together (nnlib.collectives.time_collective passes a Barrier as ``before``).
"""

from __future__ import annotations

import time

import numpy as np

LESSON = 4


def timed_calls(function, repeats: int = 10, warmup: int = 1, synchronize=None, before=None) -> np.ndarray:
    """Seconds of each of ``repeats`` calls of ``function()`` (repeats,), after ``warmup`` untimed calls.

    ``before()``, if given, runs untimed before each timed call; ``synchronize()``, if given, runs
    after the warm-up and inside each timed call, after ``function()`` (it waits for a device).
    """
    if repeats < 1:
        raise ValueError(f"repeats must be at least 1; got {repeats}")
    for _ in range(warmup):
        function()
    if synchronize is not None:
        synchronize()
    seconds = np.empty(repeats)
    for repeat in range(repeats):
        if before is not None:
            before()
        start = time.perf_counter()
        function()
        if synchronize is not None:
            synchronize()
        seconds[repeat] = time.perf_counter() - start
    return seconds


def median_seconds(function, repeats: int = 10, warmup: int = 2, synchronize=None) -> float:
    """Median wall time of ``function()`` over ``repeats`` calls, after ``warmup`` untimed ones (see timed_calls)."""
    return float(np.median(timed_calls(function, repeats, warmup, synchronize)))
